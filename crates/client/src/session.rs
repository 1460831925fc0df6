//! One `Session` stream shared by every hold of a client: operations are
//! pipelined on it, each waiting for the reply with its own id.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use charon_proto::v1;
use charon_proto::v1::limiter_client::LimiterClient;
use charon_proto::v1::session_reply::Result as Reply;
use charon_proto::v1::session_request::Op;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::Error;

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Reply, Error>>>>>;

/// An open session stream. When it breaks, the server releases every hold
/// made on it; the client then opens a new one for new holds.
#[derive(Debug)]
pub(crate) struct SessionConn {
    tx: mpsc::Sender<v1::SessionRequest>,
    pending: Pending,
    next_id: AtomicU64,
    closed: Arc<AtomicBool>,
    /// Which session this is, so holds of an earlier one know it is gone.
    pub generation: u64,
}

impl SessionConn {
    /// Opens a stream and starts reading its replies.
    pub async fn open(
        mut grpc: LimiterClient<Channel>,
        generation: u64,
        timeout: Duration,
    ) -> Result<Self, Error> {
        let (tx, rx) = mpsc::channel(256);
        let response = tokio::time::timeout(timeout, grpc.session(ReceiverStream::new(rx)))
            .await
            .map_err(|_| Error::Server(format!("no session within {timeout:?}")))?
            .map_err(|s| Error::from_status(&s))?;
        let mut inbound = response.into_inner();
        let pending: Pending = Arc::default();
        let closed = Arc::new(AtomicBool::new(false));
        let (reader_pending, reader_closed) = (pending.clone(), closed.clone());
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
                    Ok(None) => break Error::Server("the server ended the session".to_owned()),
                    Err(status) => break ended(&status),
                }
            };
            reader_closed.store(true, Ordering::SeqCst);
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
            closed,
            generation,
        })
    }

    /// Whether the stream has ended (its holds are gone on the server).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst) || self.tx.is_closed()
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

    /// Sends one operation and waits for its reply.
    pub async fn call(&self, op: Op, timeout: Duration) -> Result<Reply, Error> {
        if self.is_closed() {
            return Err(Error::Server("the session is closed".to_owned()));
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
        if self
            .tx
            .send(v1::SessionRequest { id, op: Some(op) })
            .await
            .is_err()
        {
            forget();
            return Err(Error::Server("the session is closed".to_owned()));
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Error::Server("the session is closed".to_owned())),
            Err(_) => {
                forget();
                Err(Error::Server(format!("no answer within {timeout:?}")))
            }
        }
    }
}

/// Why operations still waiting on a stream that ended with `status` get no
/// reply. The server ends a session with a status of class client when it
/// refused a message of this client (one it could not decode, or over its
/// size limit): a client error, which degraded mode must not turn into a
/// local grant. Anything else (the connection broke) is a server error.
fn ended(status: &tonic::Status) -> Error {
    let client = status
        .metadata()
        .get(charon_proto::codec::CLASS_KEY)
        .is_some_and(|v| v.as_bytes() == b"client");
    if client {
        Error::Client(format!(
            "the server ended the session: {}",
            status.message()
        ))
    } else {
        Error::Server(format!("the session broke: {status}"))
    }
}
