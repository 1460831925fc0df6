//! A hold on copies as a guard: what it still holds is released when it is
//! dropped, so an early return or a panic cannot leak copies (paper §3.2's
//! context manager).

use std::time::Duration;

use charon_proto::v1;
use charon_proto::v1::session_reply::Result as Reply;
use charon_proto::v1::session_request::Op;
use tracing::debug;

use crate::grant::Source;
use crate::{Client, Error, ErrorKind};

/// Copies of a resource held by this client, or the rejection of a
/// reserve (then [`Hold::is_granted`] is false and it holds nothing).
#[derive(Debug)]
#[must_use = "dropping a hold releases its copies at once"]
pub struct Hold {
    client: Client,
    resource: String,
    domain: String,
    groups: Vec<String>,
    granted: u64,
    held: u64,
    source: Source,
    /// The session the copies are held on (server holds only).
    generation: Option<u64>,
    reply: Option<v1::ReserveReply>,
    waited: Duration,
}

impl Hold {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_server(
        client: Client,
        resource: String,
        domain: String,
        groups: Vec<String>,
        copies: u64,
        generation: u64,
        reply: Option<v1::ReserveReply>,
        waited: Duration,
    ) -> Self {
        Self {
            client,
            resource,
            domain,
            groups,
            granted: copies,
            held: copies,
            source: Source::Server,
            generation: Some(generation),
            reply,
            waited,
        }
    }

    pub(crate) fn local(
        client: Client,
        resource: String,
        domain: String,
        copies: u64,
        source: Source,
        reply: Option<v1::ReserveReply>,
        waited: Duration,
    ) -> Self {
        Self {
            client,
            resource,
            domain,
            groups: Vec::new(),
            granted: copies,
            held: copies,
            source,
            generation: None,
            reply,
            waited,
        }
    }

    pub(crate) fn rejected(
        client: Client,
        resource: String,
        domain: String,
        reply: v1::ReserveReply,
        waited: Duration,
    ) -> Self {
        Self::local(
            client,
            resource,
            domain,
            0,
            Source::Server,
            Some(reply),
            waited,
        )
    }

    /// Whether the reserve was granted.
    pub fn is_granted(&self) -> bool {
        self.granted > 0
    }

    /// Copies granted by the reserve (or seized).
    pub fn granted(&self) -> u64 {
        self.granted
    }

    /// Copies still held.
    pub fn copies(&self) -> u64 {
        self.held
    }

    /// Who granted them.
    pub fn source(&self) -> Source {
        self.source
    }

    /// Whether the client granted them alone because the server could not
    /// answer (nothing is held on the server).
    pub fn is_degraded(&self) -> bool {
        self.source == Source::Degraded
    }

    /// The resource.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The domain.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The group set the copies are held under.
    pub fn groups(&self) -> &[String] {
        &self.groups
    }

    /// The server's reply to the reserve (limits and counts), if any.
    pub fn reply(&self) -> Option<&v1::ReserveReply> {
        self.reply.as_ref()
    }

    /// How long the reserve waited in the resource's queue on the server
    /// (`None` unless it was allowed to wait with `ReserveCall::wait`;
    /// zero: answered at once).
    pub fn waited_on_server(&self) -> Option<Duration> {
        self.reply
            .as_ref()
            .and_then(|r| r.waited_ms)
            .map(Duration::from_millis)
    }

    /// Rejected at once because too many callers already wait for the
    /// resource: run the fallback (serve a stale cache entry, say).
    pub fn queue_full(&self) -> bool {
        self.reply.as_ref().is_some_and(|r| r.queue_full)
    }

    /// No copy, because a holder finished the work this caller waited to
    /// do (`wait_mode: shared_result`): read its result instead.
    pub fn result_ready(&self) -> bool {
        self.reply.as_ref().is_some_and(|r| r.result_ready)
    }

    /// Time spent waiting for the grant (back-off included).
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// Whether the copies are held on a session that is still alive.
    fn on_live_session(&self) -> bool {
        self.generation.is_some() && self.client.live_generation() == self.generation
    }

    /// Gives back `n` of the copies still held.
    pub async fn release(&mut self, n: u64) -> Result<(), Error> {
        if n > self.held {
            return Err(Error::invalid(format!(
                "cannot release {n} copies; this hold has {}",
                self.held
            )));
        }
        if n == 0 {
            return Ok(());
        }
        if self.generation.is_some() && !self.on_live_session() {
            // The session broke: the server released these copies already.
            debug!(resource = %self.resource, n, "release of a hold whose session ended");
        } else if self.generation.is_some() {
            let op = Op::Release(v1::ReleaseRequest {
                resource: self.resource.clone(),
                domain: self.domain.clone(),
                copies: n,
                groups: self.groups.clone(),
                result_ready: false,
            });
            self.client.session_call(op).await?;
        }
        self.held -= n;
        Ok(())
    }

    /// Gives back every copy still held.
    pub async fn release_all(&mut self) -> Result<(), Error> {
        self.release(self.held).await
    }

    /// Stages `n` held copies for another client (on any server) to
    /// [`Client::seize`] within `ttl`; returns the transfer id to hand over.
    /// Copies granted in degraded mode cannot be transferred.
    pub async fn transfer(&mut self, n: u64, ttl: Duration) -> Result<String, Error> {
        if n > self.held || n == 0 {
            return Err(Error::invalid(format!(
                "cannot transfer {n} copies; this hold has {}",
                self.held
            )));
        }
        if !self.on_live_session() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                "these copies are not held on a live session (degraded, or the session ended)",
            ));
        }
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let op = Op::Transfer(v1::TransferRequest {
            resource: self.resource.clone(),
            domain: self.domain.clone(),
            copies: n,
            groups: self.groups.clone(),
            ttl_ms,
        });
        match self.client.session_call(op).await? {
            (Reply::Transfer(t), _) => {
                self.held -= n;
                Ok(t.transfer_id)
            }
            (other, _) => Err(Error::new(
                ErrorKind::Internal,
                format!("unexpected reply {other:?}"),
            )),
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let Some(generation) = self.generation else {
            return;
        };
        if self.held == 0 || !self.on_live_session() {
            return;
        }
        let op = Op::Release(v1::ReleaseRequest {
            resource: std::mem::take(&mut self.resource),
            domain: std::mem::take(&mut self.domain),
            copies: self.held,
            groups: std::mem::take(&mut self.groups),
            result_ready: false,
        });
        // Queued in order when possible, so that this client's next
        // operation sees the copies back; else sent in the background.
        let Err(op) = self.client.send_detached(generation, op) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to release on: the copies go back when the
            // session ends.
            return;
        };
        let client = self.client.clone();
        runtime.spawn(async move {
            if let Err(e) = client.session_call(op).await {
                debug!(error = %e, "release on drop failed; the copies go back when the session ends");
            }
        });
    }
}
