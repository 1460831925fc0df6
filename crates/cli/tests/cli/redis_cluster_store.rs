//! `charon serve --store redis+cluster://…` as an operator runs it (issue
//! 13, item 4): two real `charon` processes on a private Redis Cluster
//! (three masters, three replicas), as an ACL user with the documented
//! rights. Limits hold across servers and masters; the master of the copy
//! resource's slot killed under load gives server errors, never a copy
//! beyond the limit, and service recovers by itself once a replica is
//! promoted and the old master is back as its replica.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::support::{bin, strict_client, within};
use charon_client::Client;
use charon_testkit::{CharonProcess, RedisCluster};

const LIMITS: &str = r#"
resources:
  - name: api
    kind: rate
    tiers: [ { limit: 7, window: 10m } ]
  - name: search
    kind: rate
    tiers: [ { limit: 5, window: 10m } ]
  - name: vm
    kind: copy
    domain_limit: 100
    global_limit: 6
"#;

const PASSWORD: &str = "Clu5ter-S3cret";

/// docs/redis.md's rules and the cluster's two more.
const ACL_RULES: &str = "~charon:* -@all +evalsha +script|load +scan +time +get +set +del \
     +exists +sadd +srem +smembers +sismember +scard +hget +hset +hdel +hexists +hgetall \
     +hincrby +hmget +hvals +lindex +llen +lpop +lrange +lset +ltrim +rpush +persist +pexpire +pexpireat \
     +zadd +zcard +zrangebyscore +zrem +zremrangebyscore +cluster|slots +wait +asking";

async fn granted(clients: &[Client], resource: &str, calls: usize) -> usize {
    let mut n = 0;
    for i in 0..calls {
        let r = clients[i % clients.len()]
            .request(resource, "d")
            .send()
            .await
            .expect("a decision");
        n += usize::from(r.is_granted());
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_on_a_cluster_holds_limits_across_servers_and_a_failover() {
    let mut cluster =
        RedisCluster::start_with_users(vec![format!("charon on >{PASSWORD} {ACL_RULES}")]);
    let url = cluster.url_as("charon", PASSWORD);
    let args = ["--store", url.as_str(), "--store-timeout", "500ms"];
    let servers: Vec<CharonProcess> = (0..2)
        .map(|_| CharonProcess::start(bin(), LIMITS, &args))
        .collect();
    let clients: Vec<Client> = servers.iter().map(strict_client).collect();
    for s in &servers {
        let ready = within(Duration::from_secs(20), async || {
            s.http_get("/readyz")
                .is_some_and(|(status, _)| status == 200)
        })
        .await;
        assert!(ready.is_some(), "ready on the cluster");
    }

    // Rates: exact across two servers, for resources on their own slots.
    assert_eq!(granted(&clients, "api", 12).await, 7);
    assert_eq!(granted(&clients, "search", 9).await, 5);

    // Copies: 4 held, then the master of vm's slot is killed.
    let mut holds = Vec::new();
    for i in 0..4 {
        let h = clients[i % 2]
            .reserve("vm", "d")
            .send()
            .await
            .expect("reserve");
        assert_eq!(h.copies(), 1);
        holds.push(h);
    }
    let killed = cluster.kill_master_of("charon:{vm}:c");
    let mut errors = 0;
    for i in 0..6 {
        match clients[i % 2].reserve("vm", "d").send().await {
            Ok(h) if h.copies() > 0 => holds.push(h),
            Ok(_) => {}
            Err(_) => errors += 1,
        }
        assert!(holds.len() <= 6, "never a copy beyond the limit");
    }
    assert!(errors > 0, "server errors while the master is down");
    tokio::task::block_in_place(|| cluster.wait_for_failover());
    tokio::task::block_in_place(|| cluster.restart(killed));

    // Recovery by itself: reserves succeed again until the limit, exactly.
    let full = within(Duration::from_secs(60), async || {
        match clients[holds.len() % 2].reserve("vm", "d").send().await {
            Ok(h) if h.copies() > 0 => holds.push(h),
            _ => {}
        }
        holds.len() >= 6
    })
    .await;
    assert!(full.is_some(), "service recovered: {} held", holds.len());
    let over = clients[0].reserve("vm", "d").send().await.expect("reserve");
    assert_eq!(
        over.copies(),
        0,
        "the global limit holds after the failover"
    );
    drop(over);

    let log: String = servers.iter().map(CharonProcess::log).collect();
    assert!(!log.contains(PASSWORD), "the password shows in the log");
    drop(holds);
}
