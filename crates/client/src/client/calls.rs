//! The calls a client builds before it sends them: a rate request
//! ([`RateCall`]) and a reserve ([`ReserveCall`]), with what they ask for
//! and their retries until granted.

use std::time::{Duration, Instant};

use charon_proto::v1;
use charon_proto::v1::session_reply::Result as Reply;
use charon_proto::v1::session_request::Op;

use super::hold::Hold;
use super::{Answer, Client, Ending, unexpected};
use crate::Error;
use crate::grant::{RateGrant, Source};
use crate::options::RateTransport;

fn check_amount(copies: u64, min_copies: u64) -> Result<(), Error> {
    if copies == 0 || min_copies == 0 || min_copies > copies {
        return Err(Error::invalid(format!(
            "need 1 <= min_copies <= copies (got copies {copies}, min_copies {min_copies})"
        )));
    }
    Ok(())
}

/// What a call asks for, shared by requests and reserves.
#[derive(Debug, Clone)]
pub(super) struct Ask {
    resource: String,
    domain: String,
    copies: u64,
    min_copies: u64,
    max_wait: Duration,
}

macro_rules! ask_builder {
    ($call:ident, $what:literal) => {
        impl $call {
            #[doc = concat!("Ask for up to `n` ", $what, " (default 1).")]
            pub fn copies(mut self, n: u64) -> Self {
                self.ask.copies = n;
                self
            }

            #[doc = concat!("Accept no fewer than `n` ", $what, " (default 1).")]
            pub fn min_copies(mut self, n: u64) -> Self {
                self.ask.min_copies = n;
                self
            }

            /// Retry rejections with back-off for at most this long
            /// (default 0: no retry).
            pub fn max_wait(mut self, d: Duration) -> Self {
                self.ask.max_wait = d;
                self
            }
        }
    };
}

impl Ask {
    pub(super) fn new(resource: String, domain: String) -> Self {
        Self {
            resource,
            domain,
            copies: 1,
            min_copies: 1,
            max_wait: Duration::ZERO,
        }
    }
}

/// A rate-limited request being built: see [`Client::request`].
#[derive(Debug)]
#[must_use = "a request does nothing until it is sent"]
pub struct RateCall {
    pub(super) client: Client,
    pub(super) ask: Ask,
    pub(super) dry_run: bool,
}

ask_builder!(RateCall, "hits");

impl RateCall {
    /// Ask without recording anything (SPEC §10): the answer is the one
    /// the request would get, so a client can check before it spends work
    /// whose cost it will [`Client::charge`]. Every rate-like kind.
    pub fn dry_run(mut self, on: bool) -> Self {
        self.dry_run = on;
        self
    }

    /// Sends the request; see [`RateGrant`].
    pub async fn send(self) -> Result<RateGrant, Error> {
        let Self {
            client,
            ask,
            dry_run,
        } = self;
        check_amount(ask.copies, ask.min_copies)?;
        client.count(|c| &c.requests);
        let started = Instant::now();
        let req = v1::RateRequest {
            resource: ask.resource,
            domain: ask.domain,
            copies: Some(ask.copies),
            min_copies: Some(ask.min_copies),
            dry_run,
        };
        let transport = client.inner.options.rate_transport;
        let ending = client
            .until_granted(ask.max_wait, || {
                let (client, req) = (&client, req.clone());
                async move {
                    let reply = match transport {
                        RateTransport::Session => {
                            match client.session_call(Op::Request(req)).await? {
                                (Reply::Request(r), _) => r,
                                (other, _) => return Err(unexpected(&other)),
                            }
                        }
                        RateTransport::Unary => {
                            let mut grpc = client.inner.grpc.clone();
                            client.unary(async move { grpc.request(req).await }).await?
                        }
                    };
                    Ok(if reply.granted > 0 {
                        Answer::Granted(reply)
                    } else {
                        Answer::Rejected(reply)
                    })
                }
            })
            .await?;
        let (granted, source, reply) = match ending {
            Ending::Granted(r) => (r.granted, Source::Server, Some(r)),
            Ending::KillSwitch(r) => (ask.min_copies, Source::KillSwitch, Some(r)),
            Ending::Rejected(r) => (0, Source::Server, Some(r)),
            Ending::Degraded => (ask.min_copies, Source::Degraded, None),
        };
        Ok(RateGrant {
            granted,
            source,
            reply,
            waited: started.elapsed(),
        })
    }
}

/// A reserve being built: see [`Client::reserve`].
#[derive(Debug)]
#[must_use = "a reserve does nothing until it is sent"]
pub struct ReserveCall {
    pub(super) client: Client,
    pub(super) ask: Ask,
    pub(super) wait: Duration,
}

ask_builder!(ReserveCall, "copies");

impl ReserveCall {
    /// Wait up to `d` in the resource's queue on the server when no copy
    /// is free (default 0: answered at once). Unlike [`Self::max_wait`]'s
    /// retries, a waiter keeps its place: released copies go to waiters in
    /// arrival order. Whole milliseconds, at most one hour. The hold then
    /// tells how it ended: [`Hold::waited_on_server`],
    /// [`Hold::queue_full`], [`Hold::result_ready`].
    pub fn wait(mut self, d: Duration) -> Self {
        self.wait = d;
        self
    }

    /// Sends the reserve. The result is a [`Hold`] in every case: check
    /// [`Hold::is_granted`]; dropping it releases what it still holds.
    pub async fn send(self) -> Result<Hold, Error> {
        let Self { client, ask, wait } = self;
        check_amount(ask.copies, ask.min_copies)?;
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        client.count(|c| &c.reserves);
        let started = Instant::now();
        let op = Op::Reserve(v1::ReserveRequest {
            resource: ask.resource.clone(),
            domain: ask.domain.clone(),
            copies: Some(ask.copies),
            min_copies: Some(ask.min_copies),
            wait_ms: (wait_ms > 0).then_some(wait_ms),
        });
        let ending = client
            .until_granted(ask.max_wait, || async {
                match client.session_call_waiting(op.clone(), wait).await? {
                    (Reply::Reserve(r), generation) if r.granted > 0 => {
                        Ok(Answer::Granted((r, generation)))
                    }
                    (Reply::Reserve(r), _) => Ok(Answer::Rejected(r)),
                    (other, _) => Err(unexpected(&other)),
                }
            })
            .await?;
        let waited = started.elapsed();
        let (resource, domain) = (ask.resource, ask.domain);
        Ok(match ending {
            Ending::Granted((r, generation)) => {
                let groups = r.groups.iter().map(|g| g.name.clone()).collect();
                Hold::on_server(
                    client.clone(),
                    resource,
                    domain,
                    groups,
                    r.granted,
                    generation,
                    Some(r),
                    waited,
                )
            }
            Ending::KillSwitch(r) => Hold::local(
                client.clone(),
                resource,
                domain,
                ask.min_copies,
                Source::KillSwitch,
                Some(r),
                waited,
            ),
            Ending::Rejected(r) => Hold::rejected(client.clone(), resource, domain, r, waited),
            Ending::Degraded => Hold::local(
                client.clone(),
                resource,
                domain,
                ask.min_copies,
                Source::Degraded,
                None,
                waited,
            ),
        })
    }
}
