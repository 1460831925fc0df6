//! Graceful shutdown, in the shape of mini-redis' `shutdown.rs`: one
//! trigger, many listeners, and a count of sessions still ending.

use std::sync::Arc;

use tokio::sync::watch;

/// A shutdown signal shared by every part of the server, and a tally of
/// live sessions so shutdown can wait until their holds are released.
#[derive(Debug, Clone)]
pub struct Shutdown {
    triggered: Arc<watch::Sender<bool>>,
    sessions: Arc<watch::Sender<usize>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// A signal not yet triggered.
    pub fn new() -> Self {
        Self {
            triggered: Arc::new(watch::channel(false).0),
            sessions: Arc::new(watch::channel(0).0),
        }
    }

    /// Starts the shutdown. Idempotent.
    pub fn trigger(&self) {
        self.triggered.send_replace(true);
    }

    /// Whether shutdown has started.
    pub fn is_triggered(&self) -> bool {
        *self.triggered.borrow()
    }

    /// Resolves once shutdown has started.
    pub async fn wait(&self) {
        let mut rx = self.triggered.subscribe();
        // Cannot fail: the sender lives as long as `self`.
        let _ = rx.wait_for(|t| *t).await;
    }

    /// Counts a session as live until the guard is dropped.
    pub fn session_guard(&self) -> SessionGuard {
        self.sessions.send_modify(|n| *n += 1);
        SessionGuard(self.sessions.clone())
    }

    /// Sessions still live.
    pub fn live_sessions(&self) -> usize {
        *self.sessions.borrow()
    }

    /// Resolves when no session is live.
    pub async fn sessions_ended(&self) {
        let mut rx = self.sessions.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }
}

/// Held by a session's driver until its holds are released.
#[derive(Debug)]
pub struct SessionGuard(Arc<watch::Sender<usize>>);

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}
