//! One `Session` stream shared by every operation of a client: rate
//! requests, charges and refunds (unless the client uses unary calls) and
//! the copy operations of every hold. Operations are pipelined on it: each
//! is sent with an id of its own and waits for the reply echoing that id,
//! whatever order replies come back in.
//!
//! Ordering: the server runs a session's copy operations one after another
//! in the order they arrive, and rate requests, charges and refunds
//! concurrently with them and with each other. So an operation sees the
//! effect of every copy operation this client sent before it on the same
//! session (a reserve after a dropped hold's release finds the copies
//! back), but two rate requests in flight at once may be decided in either
//! order, as two unary calls would be.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use charon_proto::v1;
use charon_proto::v1::session_reply::Result as Reply;
use charon_proto::v1::session_request::Op;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::ErrorKind;
use crate::{Client, Error};

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Reply, Error>>>>>;

/// Room in the outgoing queue beyond the client's bound on operations in
/// flight, for releases of dropped holds, which are queued without waiting
/// (and without taking a place in flight: a `Drop` cannot wait for one).
const DETACHED_ROOM: usize = 64;

/// An open session stream. When it breaks, the server releases every hold
/// made on it, and every operation still waiting for a reply gets an error
/// (a server error unless the server ended the stream over a message of
/// this client); the client then opens a new one for the next operation.
#[derive(Debug)]
pub(crate) struct SessionConn {
    tx: mpsc::Sender<v1::SessionRequest>,
    pending: Pending,
    next_id: AtomicU64,
    /// Why the stream ended, once it has: what a call made after that
    /// gets (the server's refusal of the session, say), rather than a
    /// bare "closed".
    ended: watch::Receiver<Option<Error>>,
    /// Which session this is, so holds of an earlier one know it is gone.
    pub generation: u64,
    /// The server's address, for the errors.
    address: Arc<str>,
}

impl SessionConn {
    /// Opens a stream of `client` and starts reading its replies. The
    /// outgoing queue is sized by the client's bound on operations waiting
    /// for an answer, so that sending never waits behind it.
    pub async fn open(client: &Client, generation: u64, deadline: Instant) -> Result<Self, Error> {
        let max_in_flight = client.inner.options.max_in_flight;
        let address: Arc<str> = Arc::from(client.address());
        let mut grpc = client.inner.grpc.clone();
        let (tx, rx) = mpsc::channel(max_in_flight.max(1) + DETACHED_ROOM);
        let response =
            match tokio::time::timeout_at(deadline, grpc.session(ReceiverStream::new(rx))).await {
                Err(_) => {
                    return Err(Error::new(
                        ErrorKind::Timeout,
                        format!("no session opened with {address} in time"),
                    ));
                }
                Ok(Err(status)) => return Err(client.classify(&status, deadline).await),
                Ok(Ok(response)) => response,
            };
        let mut inbound = response.into_inner();
        let pending: Pending = Arc::default();
        let (reader_ended, ended) = watch::channel(None);
        let reader_pending = pending.clone();
        let reader_address = address.clone();
        tokio::spawn(async move {
            let failure = loop {
                match inbound.message().await {
                    Ok(Some(reply)) => {
                        let waiter = reader_pending
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .remove(&reply.id);
                        if let (Some(waiter), Some(result)) = (waiter, reply.result) {
                            let _ = waiter.send(Ok(result));
                        }
                    }
                    Ok(None) => {
                        break Error::new(
                            ErrorKind::Unavailable,
                            format!("{reader_address} ended the session"),
                        );
                    }
                    Err(status) => break session_ended(&status, &reader_address),
                }
            };
            // Closed before the waiters are taken: a call that registers
            // itself afterwards sees it and does not wait in vain.
            reader_ended.send_replace(Some(failure.clone()));
            let waiters = std::mem::take(
                &mut *reader_pending
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
            );
            for (_, w) in waiters {
                let _ = w.send(Err(failure.clone()));
            }
        });
        Ok(Self {
            tx,
            pending,
            next_id: AtomicU64::new(1),
            ended,
            generation,
            address,
        })
    }

    /// Whether the stream has ended (its holds are gone on the server).
    pub fn is_closed(&self) -> bool {
        self.ended.borrow().is_some() || self.tx.is_closed()
    }

    /// Queues an operation whose reply nobody waits for (the release of a
    /// dropped hold) without waiting. The server runs a session's copy
    /// operations in the order they arrive, so whatever this client sends
    /// next on the session sees its effect: a reserve right after dropping
    /// a hold finds the copies back. Gives the operation back if it cannot
    /// be queued at once (the session is closed or its queue is full).
    pub fn send_detached(&self, op: Op) -> Result<(), Op> {
        if self.is_closed() {
            return Err(op);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.tx
            .try_send(v1::SessionRequest { id, op: Some(op) })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(r) | mpsc::error::TrySendError::Closed(r) => {
                    r.op.expect("sent with an operation")
                }
            })
    }

    /// Sends one operation and waits for its reply until `deadline`.
    ///
    /// Nothing is sent again on failure: once an operation is written, the
    /// server may have applied it (a rate request's hits recorded, copies
    /// reserved) even if its reply is lost with the stream, and sending it
    /// again would count it twice. The caller gets a server error instead,
    /// which degraded mode may turn into a local grant, exactly as for a
    /// unary call whose connection broke.
    pub async fn call(&self, op: Op, deadline: Instant) -> Result<Reply, Error> {
        let late = || {
            Error::new(
                ErrorKind::Timeout,
                format!("no answer from {} in time", self.address),
            )
        };
        if self.is_closed() {
            return Err(self.why_closed(deadline).await);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, tx);
        let forget = || {
            self.pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id);
        };
        // The reader may have ended the stream (and answered its waiters)
        // between the check above and the insert.
        if self.ended.borrow().is_some() {
            forget();
            return Err(self.why_closed(deadline).await);
        }
        // The client's bound on operations in flight keeps this queue from
        // filling (see `open`), so this waits only if detached releases
        // crowd it.
        let sent = tokio::time::timeout_at(
            deadline,
            self.tx.send(v1::SessionRequest { id, op: Some(op) }),
        )
        .await;
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                forget();
                return Err(self.why_closed(deadline).await);
            }
            Err(_) => {
                forget();
                return Err(late());
            }
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(self.why_closed(deadline).await),
            Err(_) => {
                forget();
                Err(late())
            }
        }
    }
}

impl SessionConn {
    /// Why the stream ended, as its reader found out (waiting for it until
    /// `deadline`: the sending side may see the stream closed a moment
    /// before the reader reads the status that closed it).
    async fn why_closed(&self, deadline: Instant) -> Error {
        let mut ended = self.ended.clone();
        match tokio::time::timeout_at(deadline, ended.wait_for(Option::is_some)).await {
            Ok(Ok(why)) => why.clone().unwrap_or_else(|| self.closed()),
            _ => self.closed(),
        }
    }

    fn closed(&self) -> Error {
        Error::new(
            ErrorKind::Unavailable,
            format!("the session with {} is closed", self.address),
        )
    }
}

/// Why operations still waiting on a stream that ended with `status` get no
/// reply. The server ends a session with a status of class client when it
/// refused a message of this client (one it could not decode, or over its
/// size limit): a client error, which degraded mode must not turn into a
/// local grant. Anything else (the connection broke) is a server error.
fn session_ended(status: &tonic::Status, address: &str) -> Error {
    let client = status
        .metadata()
        .get(charon_proto::codec::CLASS_KEY)
        .is_some_and(|v| v.as_bytes() == b"client");
    let e = crate::classify::from_status(status, address);
    if client {
        let message = format!("{address} ended the session: {}", e.message());
        Error::new(e.kind(), message).answered(status.code(), address)
    } else if e.is_client() {
        // Not a Charon server at all (an HTTP port answering 404).
        e
    } else {
        Error::new(
            e.kind(),
            format!("the session with {address} broke: {}", e.message()),
        )
        .with_code(status.code())
        .at(address)
    }
}
