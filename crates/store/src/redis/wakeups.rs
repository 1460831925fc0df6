//! Wake-ups of this server's waiters (SPEC §14). A script that decides a
//! waiter publishes `'<tag> <ticket>'` on the channel of the waiter's
//! member (`wait.lua`); one subscriber connection per store hears them and
//! wakes the task waiting for that ticket. A hint only: the answer is
//! taken with the waiter's outcome script, and [`Wakeups::wait`] never
//! sleeps longer than [`POLL`], so a lost message (a reconnect, a Redis
//! Cluster, whose waiters are not subscribed) delays an answer, never
//! loses it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_stream::StreamExt;

/// The longest a waiter sleeps between looks at its outcome.
pub(super) const POLL: Duration = Duration::from_millis(500);

/// How long a wake-up that came before its waiter registered is kept (the
/// script's reply and its message race).
const EARLY: Duration = Duration::from_secs(10);

/// The most early wake-ups kept (most are for answers already taken).
const EARLY_KEPT: usize = 4096;

/// A ticket as the scripts name it: the resource's escaped tag and its
/// number.
type Key = (String, u64);

#[derive(Default)]
struct Map {
    waiting: HashMap<Key, Arc<Notify>>,
    early: HashMap<Key, Instant>,
}

/// This store's waiters and what wakes each.
#[derive(Default)]
pub(super) struct Wakeups {
    map: Mutex<Map>,
    /// Wake-up messages heard so far.
    heard: AtomicU64,
}

impl Wakeups {
    fn map(&self) -> MutexGuard<'_, Map> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What wakes `key`'s waiter (made now if need be; a wake-up that
    /// came first is kept for it).
    fn notify_of(&self, key: Key) -> Arc<Notify> {
        let mut map = self.map();
        if let Some(n) = map.waiting.get(&key) {
            return n.clone();
        }
        let n = Arc::new(Notify::new());
        if map.early.remove(&key).is_some() {
            n.notify_one();
        }
        map.waiting.insert(key, n.clone());
        n
    }

    /// Registers a new waiter.
    pub(super) fn register(&self, tag: &str, id: u64) {
        self.notify_of((tag.to_owned(), id));
    }

    /// Waits until `key`'s waiter is woken, `at_most` passed or [`POLL`].
    pub(super) async fn wait(&self, tag: &str, id: u64, at_most: Duration) {
        let n = self.notify_of((tag.to_owned(), id));
        let _ = tokio::time::timeout(at_most.min(POLL), n.notified()).await;
    }

    /// Forgets a waiter that has its answer or left.
    pub(super) fn forget(&self, tag: &str, id: u64) {
        self.map().waiting.remove(&(tag.to_owned(), id));
    }

    /// Wake-up messages heard so far.
    pub(super) fn heard(&self) -> u64 {
        self.heard.load(Ordering::Relaxed)
    }

    /// Wakes one waiter (kept for a while if it has not registered yet).
    fn wake(&self, key: Key) {
        self.heard.fetch_add(1, Ordering::Relaxed);
        let mut map = self.map();
        if let Some(n) = map.waiting.get(&key) {
            n.notify_one();
            return;
        }
        let now = Instant::now();
        if map.early.len() >= EARLY_KEPT {
            map.early.retain(|_, at| now.duration_since(*at) < EARLY);
            if map.early.len() >= EARLY_KEPT {
                // Hints only: a waiter that misses one polls.
                map.early.clear();
            }
        }
        map.early.insert(key, now);
    }

    /// Wakes every waiter: messages may have been missed.
    fn wake_all(&self) {
        for n in self.map().waiting.values() {
            n.notify_one();
        }
    }

    /// How many waiters of this store wait.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().waiting.len()
    }
}

/// A wake-up message: `'<tag> <ticket>'` (the tag may hold spaces, the
/// ticket does not).
fn parse(payload: &str) -> Option<Key> {
    let (tag, id) = payload.rsplit_once(' ')?;
    Some((tag.to_owned(), id.parse().ok()?))
}

/// Listens on `channel` for as long as the store lives, subscribing again
/// after every loss of the connection (and then waking every waiter, as
/// messages may have been missed meanwhile); `subscribed` hears of the
/// first subscription.
pub(super) async fn listen(
    client: redis::Client,
    channel: String,
    wakeups: Weak<Wakeups>,
    subscribed: tokio::sync::oneshot::Sender<()>,
) {
    let mut subscribed = Some(subscribed);
    loop {
        if let Ok(mut pubsub) = client.get_async_pubsub().await
            && pubsub.subscribe(&channel).await.is_ok()
        {
            if let Some(s) = subscribed.take() {
                let _ = s.send(());
            }
            let Some(w) = wakeups.upgrade() else { return };
            w.wake_all();
            drop(w);
            let mut messages = pubsub.into_on_message();
            while let Some(m) = messages.next().await {
                let Some(w) = wakeups.upgrade() else { return };
                if let Some(key) = m.get_payload::<String>().ok().as_deref().and_then(parse) {
                    w.wake(key);
                }
            }
        }
        let Some(w) = wakeups.upgrade() else { return };
        w.wake_all();
        drop(w);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Stops the listener when the store is dropped.
#[derive(Debug)]
pub(super) struct Listener(pub(super) Option<tokio::task::JoinHandle<()>>);

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            h.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_their_ticket() {
        assert_eq!(parse("page 7"), Some(("page".to_owned(), 7)));
        assert_eq!(parse("a b 12"), Some(("a b".to_owned(), 12)));
        assert_eq!(parse("page"), None);
        assert_eq!(parse("page x"), None);
    }

    /// Whether `n` holds a wake-up (a permit) now.
    async fn woken(n: &Notify) -> bool {
        tokio::time::timeout(Duration::ZERO, n.notified())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn an_early_wake_up_is_kept_for_its_waiter() {
        let w = Wakeups::default();
        w.wake(("r".to_owned(), 1));
        assert!(woken(&w.notify_of(("r".to_owned(), 1))).await);
        assert!(!woken(&w.notify_of(("r".to_owned(), 2))).await);
        w.wake(("r".to_owned(), 2));
        assert!(woken(&w.notify_of(("r".to_owned(), 2))).await);
        assert_eq!(w.len(), 2);
        w.forget("r", 1);
        w.forget("r", 2);
        assert_eq!(w.len(), 0);
    }
}
