//! What a decision costs besides time, for `charon bench`: the server's
//! CPU from `/proc/PID/stat`, Redis' commands and CPU from `INFO`, and
//! this process's own CPU, sampled before and after the measured interval
//! ([`Probe`]) and divided by the decisions made ([`Costs`]).

/// Clock ticks per second of `/proc/PID/stat` times: `USER_HZ`, which the
/// kernel fixes at 100 for user space on every architecture this runs on
/// (x86, ARM), whatever its internal tick rate.
pub(super) const TICKS_PER_SECOND: f64 = 100.0;

/// Where the costs of decisions are read from.
pub(super) struct Probe {
    server_pid: Option<u32>,
    /// One connection per Redis node measured; empty when not measured.
    redis: Vec<redis::aio::MultiplexedConnection>,
}

/// Counters at one instant: CPU seconds of the server and of this process,
/// and Redis' commands and CPU seconds.
pub(super) struct Sample {
    server_cpu: Option<f64>,
    bench_cpu: Option<f64>,
    redis: Option<(u64, f64)>,
}

impl Probe {
    pub(super) async fn new(
        server_pid: Option<u32>,
        redis_urls: &[String],
    ) -> anyhow::Result<Self> {
        if let Some(pid) = server_pid {
            cpu_seconds(&pid.to_string())
                .map_err(|e| anyhow::anyhow!("--server-pid {pid}: {e}"))?;
        }
        let mut redis = Vec::with_capacity(redis_urls.len());
        for url in redis_urls {
            let client = redis::Client::open(url.as_str())
                .map_err(|e| anyhow::anyhow!("--redis {url}: {e}"))?;
            redis.push(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| anyhow::anyhow!("--redis {url}: {e}"))?,
            );
        }
        Ok(Self { server_pid, redis })
    }

    pub(super) async fn sample(&mut self) -> anyhow::Result<Sample> {
        let server_cpu = match self.server_pid {
            Some(pid) => Some(cpu_seconds(&pid.to_string())?),
            None => None,
        };
        let mut redis = None;
        for conn in &mut self.redis {
            let stats: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(conn)
                .await?;
            let cpu: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
            let (calls, seconds) = redis.unwrap_or((0, 0.0));
            redis = Some((calls + commands(&stats), seconds + redis_cpu_seconds(&cpu)));
        }
        Ok(Sample {
            server_cpu,
            bench_cpu: cpu_seconds("self").ok(),
            redis,
        })
    }
}

/// CPU seconds (user + system) a process has used so far, from
/// `/proc/PROC/stat`: fields 14 and 15, counted after the command name,
/// which is in parentheses and may itself hold spaces or parentheses.
pub(super) fn cpu_seconds(proc: &str) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{proc}/stat"))?;
    let after_name = stat
        .rfind(')')
        .and_then(|i| stat.get(i + 1..))
        .ok_or_else(|| anyhow::anyhow!("unexpected /proc/{proc}/stat: {stat:?}"))?;
    // Fields from the third (state) on: utime is the 14th, stime the 15th.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let tick = |i: usize| -> anyhow::Result<u64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("unexpected /proc/{proc}/stat: {stat:?}"))
    };
    let ticks = tick(14 - 3)? + tick(15 - 3)?;
    Ok(ticks as f64 / TICKS_PER_SECOND)
}

/// Commands Redis has run, from `INFO commandstats`
/// (`cmdstat_NAME:calls=N,…` lines), without `INFO` itself (the bench's).
pub(super) fn commands(info: &str) -> u64 {
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter(|l| !l.starts_with("info:"))
        .filter_map(|l| {
            l.split_once(':')?
                .1
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// CPU seconds Redis' main process has used, from `INFO cpu`
/// (`used_cpu_sys` + `used_cpu_user`; children, such as a background
/// save, are left out).
pub(super) fn redis_cpu_seconds(info: &str) -> f64 {
    info.lines()
        .filter_map(|l| l.trim().split_once(':'))
        .filter(|(k, _)| *k == "used_cpu_sys" || *k == "used_cpu_user")
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}

/// Costs per decision over the measured interval (`None` where not
/// measured, or nothing was decided).
pub(super) struct Costs {
    pub(super) server_cpu_us: Option<f64>,
    pub(super) bench_cpu_us: Option<f64>,
    pub(super) redis_commands: Option<f64>,
    pub(super) redis_cpu_us: Option<f64>,
}

impl Costs {
    pub(super) fn between(before: &Sample, after: &Sample, decisions: u64) -> Self {
        let per = |delta: Option<f64>| {
            delta
                .filter(|_| decisions > 0)
                .map(|d| d / decisions as f64)
        };
        let delta = |a: Option<f64>, b: Option<f64>| Some(b? - a?);
        let redis = before.redis.zip(after.redis);
        Self {
            server_cpu_us: per(delta(before.server_cpu, after.server_cpu)).map(|s| s * 1e6),
            bench_cpu_us: per(delta(before.bench_cpu, after.bench_cpu)).map(|s| s * 1e6),
            redis_commands: per(redis.map(|(a, b)| b.0.saturating_sub(a.0) as f64)),
            redis_cpu_us: per(redis.map(|(a, b)| b.1 - a.1)).map(|s| s * 1e6),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_info_is_read_without_the_bench_s_own_calls() {
        let stats = "# Commandstats\r\ncmdstat_evalsha:calls=120,usec=900,usec_per_call=7.50,rejected_calls=0,failed_calls=0\r\ncmdstat_info:calls=7,usec=70\r\ncmdstat_ping:calls=3,usec=1\r\n";
        assert_eq!(commands(stats), 123);
        let cpu = "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\nused_cpu_sys_children:9.0\r\n";
        assert!((redis_cpu_seconds(cpu) - 3.75).abs() < 1e-9);
    }

    #[test]
    fn this_process_cpu_is_read_from_proc() {
        let before = cpu_seconds("self").expect("/proc/self/stat");
        // Burn a little CPU: the count does not go down.
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        assert!(cpu_seconds("self").expect("/proc/self/stat") >= before);
        assert!(cpu_seconds("0").is_err(), "no process 0 in /proc");
    }
}
