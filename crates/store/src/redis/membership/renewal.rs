//! Renewing this member's liveness: once ([`RedisStore::renew`]) and in
//! the loop that keeps it up, reporting outages and following the copy
//! gate of a new generation.

use std::time::{Duration, Instant};

use super::{millis, new_generation};
use crate::StoreError;
use crate::redis::RedisStore;
use crate::redis::reply::Reply;

/// What a renewal found (besides resignation, which is an error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Renewed {
    Ok,
    /// The liveness key had lapsed, nobody had fenced this member.
    Revived,
    /// Redis lost its data: registered in the new generation, to rebuild
    /// (`late`: after the window in which the others waited for it).
    NewGeneration {
        late: bool,
    },
    /// A server starting alone is cleaning up; not renewed.
    Wait,
}

/// Renewals failing in a row, for the log.
#[derive(Debug)]
pub(super) struct Outage {
    attempts: u32,
    warned: Instant,
}

/// How often a warning repeats while renewals keep failing.
pub(super) const OUTAGE_WARN_EVERY: Duration = Duration::from_secs(5);

impl RedisStore {
    /// Renews this member's liveness once.
    pub(super) async fn renew(&self) -> Result<Renewed, StoreError> {
        let generation = self.lock().generation.clone();
        let sent = Instant::now();
        let keys = [
            self.keys.live(&self.member),
            self.keys.generation(),
            self.keys.registry(),
            self.keys.rebuild(),
            self.keys.start_lock(),
            self.keys.suspect(&self.member),
            self.keys.tick(),
        ];
        let args = [
            generation,
            millis(self.ttl),
            self.member.clone(),
            new_generation(),
            self.rebuild_grace.as_millis().to_string(),
            self.keys.live_prefix(),
        ];
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let work = self.conn.eval(&self.scripts.renew, &key_refs, &args, &[]);
        // A renewal that takes longer than a quarter of the ttl is as good
        // as none.
        let v = tokio::time::timeout(self.ttl / 4, work)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::Unavailable(
                    "renewing liveness took too long".into(),
                ))
            })?;
        let mut r = Reply::new(self.scripts.renew.name, v)?;
        let outcome = r.text()?;
        let generation = r.text()?;
        let gate_open = r.text()? == "open";
        match outcome.as_str() {
            "ok" | "revived" => {
                self.lock().renewed = sent;
                self.note_gate(gate_open);
                Ok(if outcome == "ok" {
                    Renewed::Ok
                } else {
                    Renewed::Revived
                })
            }
            "fenced" => Err(self.resign(
                "other servers found this server's liveness lapsed, fenced it and removed its contributions"
                    .into(),
            )),
            "new" | "late" => {
                let mut s = self.lock();
                s.generation = generation;
                s.renewed = sent;
                s.known.clear();
                s.epoch += 1;
                s.rebuild_pending = true;
                s.gate_open = false;
                Ok(Renewed::NewGeneration {
                    late: outcome == "late",
                })
            }
            "wait" => {
                let mut s = self.lock();
                s.rebuild_pending = true;
                s.gate_open = false;
                Ok(Renewed::Wait)
            }
            other => Err(crate::redis::reply::bad(
                "renew",
                &format!("unknown outcome {other:?}"),
            )),
        }
    }

    /// Renews every [`renew_every`] (and every [`retry_every`] after a
    /// failure, or while copies wait for a rebuild) until this member
    /// resigns, which happens only when it was fenced. Rebuilds this
    /// member's contributions when Redis lost its data.
    ///
    /// [`retry_every`]: RedisStore::retry_every
    /// [`renew_every`]: RedisStore::renew_every
    pub(super) async fn renew_loop(&self) -> StoreError {
        let mut outage: Option<Outage> = None;
        loop {
            let busy = outage.is_some() || {
                let s = self.lock();
                s.rebuild_pending || !s.gate_open
            };
            let wait = if busy {
                self.retry_every()
            } else {
                // Counted from when the last renewal was *sent*, not when
                // it returned: copy operations are refused once that send
                // is half a ttl old (see `renew_every`).
                let since = self.lock().renewed.elapsed();
                self.renew_every()
                    .saturating_sub(since)
                    .max(self.retry_every())
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.wake.notified() => {}
            }
            if let Some(e) = self.resigned() {
                return e;
            }
            let renewed = match self.renew().await {
                Ok(r) => r,
                Err(e @ StoreError::Resigned(_)) => return e,
                Err(e) => {
                    self.on_error(&e);
                    self.note_failed_renewal(&mut outage, &e);
                    continue;
                }
            };
            if let Some(o) = outage.take() {
                tracing::warn!(
                    failed_attempts = o.attempts,
                    "renewed this server's liveness again; copy operations resume"
                );
            }
            match renewed {
                Renewed::Ok => {}
                Renewed::Revived => tracing::warn!(
                    member = %self.member,
                    "this server's liveness key had lapsed (Redis stalled or out of reach for longer than the ttl) \
                     but nobody had fenced it: renewed, nothing was lost"
                ),
                Renewed::NewGeneration { late } => {
                    if late {
                        tracing::error!(
                            member = %self.member,
                            "Redis lost the copy counts, and this server noticed only after the others had rebuilt theirs: \
                             reserves granted meanwhile did not see its holds; rebuilding them now"
                        );
                    } else {
                        tracing::warn!(
                            member = %self.member,
                            "Redis lost the copy counts (restart without persistence, flush, failover to an empty replica); \
                             rebuilding them from this server's sessions' holds"
                        );
                    }
                }
                Renewed::Wait => continue,
            }
            let (pending, gate_open) = {
                let s = self.lock();
                (s.rebuild_pending, s.gate_open)
            };
            if pending {
                match self.rebuild().await {
                    Ok(()) => {}
                    Err(e @ StoreError::Resigned(_)) => return e,
                    Err(e) => {
                        self.on_error(&e);
                        tracing::warn!(error = %e, "rebuilding the copy counts failed; will retry");
                    }
                }
            } else if !gate_open && let Err(e) = self.poll_gate(false).await {
                tracing::debug!(error = %e, "could not read the copy gate");
            }
        }
    }

    pub(super) fn note_failed_renewal(&self, outage: &mut Option<Outage>, e: &StoreError) {
        let since = self.lock().renewed.elapsed();
        match outage {
            None => {
                tracing::warn!(
                    error = %e,
                    last_renewed_ago = ?since,
                    "could not renew this server's liveness; retrying every {:?}, \
                     copy operations get server errors from {:?} after the last renewal until one succeeds",
                    self.retry_every(),
                    self.ttl / 2,
                );
                *outage = Some(Outage {
                    attempts: 1,
                    warned: Instant::now(),
                });
            }
            Some(o) => {
                o.attempts += 1;
                if o.warned.elapsed() >= OUTAGE_WARN_EVERY {
                    o.warned = Instant::now();
                    tracing::warn!(
                        error = %e,
                        last_renewed_ago = ?since,
                        failed_attempts = o.attempts,
                        "still cannot renew this server's liveness; retrying"
                    );
                }
            }
        }
    }

    /// Reads the copy gate, after leaving the rebuilders if `done`; true
    /// when reserves may run.
    pub(super) async fn poll_gate(&self, done: bool) -> Result<bool, StoreError> {
        let me = if done {
            self.member.clone()
        } else {
            String::new()
        };
        let v = self
            .conn
            .eval(
                &self.scripts.gate,
                &[&self.keys.rebuild(), &self.keys.tick()],
                &[self.keys.live_prefix(), me],
                &[],
            )
            .await?;
        let open = Reply::new(self.scripts.gate.name, v)?.text()? == "open";
        self.note_gate(open);
        Ok(open)
    }
}
