//! The writer thread: drains the queue in batches, feeds the live view,
//! serializes and writes, rotates, and survives a failing sink.
//!
//! The thread polls the queue (sleeping [`POLL_EVERY`] once it has
//! drained it) rather than waiting on it, so queueing an event never wakes
//! a thread, and at moderate rates each poll is one write.
//! Each batch (what is queued, up to [`BATCH`] events) is serialized into
//! one buffer and written with one `write` (a buffered writer whose buffer
//! is emptied at every batch, so `tail -f` sees events within tens of
//! milliseconds, and whose contents are dropped rather than kept when a
//! write fails). A failed write drops the events of its buffer
//! (`write_error`), closes the sink and opens it again a second later
//! ([`RETRY_AFTER`]); meanwhile the events the writer takes from the queue
//! are dropped as `write_error` too, so the queue keeps draining. Opening
//! happens here, never on the hot path: a FIFO with no reader blocks the
//! writer in `open`, the queue fills, and decisions go on (`queue_full`).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::{Event, EventCounters, EventSettings, EventSink, Top};

/// How long the writer sleeps when the queue is empty: the most an event
/// waits in the queue of an idle stream.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// Events taken from the queue at once.
const BATCH: usize = 1024;

/// How long a failed sink rests before it is opened again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// How often a failing sink is logged (with what was dropped since).
const LOG_EVERY: Duration = Duration::from_secs(30);

/// How often a file is checked for having been moved or removed (by an
/// outside log rotation), then opened again at its path.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The running writer thread.
#[derive(Debug)]
pub(super) struct Handle {
    stop: Arc<AtomicBool>,
    done: Receiver<()>,
}

impl Handle {
    /// Asks the writer to write what is queued and stop; waits at most
    /// `grace`.
    pub(super) fn stop(self, grace: Duration) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.done.recv_timeout(grace);
    }
}

/// Starts the writer thread.
pub(super) fn spawn(
    queue: Receiver<Event>,
    settings: &EventSettings,
    server: String,
    top: Arc<Mutex<Top>>,
    counters: EventCounters,
) -> std::io::Result<Handle> {
    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done) = mpsc::channel();
    let mut sink = Sink::new(settings, counters);
    let stopping = Arc::clone(&stop);
    std::thread::Builder::new()
        .name("charon-events".to_owned())
        .spawn(move || {
            run(&queue, &mut sink, &server, &top, &stopping);
            let _ = done_tx.send(());
        })?;
    Ok(Handle { stop, done })
}

fn run(
    queue: &Receiver<Event>,
    sink: &mut Sink,
    server: &str,
    top: &Mutex<Top>,
    stop: &AtomicBool,
) {
    // Opened before anything is taken from the queue: a sink that blocks
    // (a FIFO nobody reads) leaves every event in the queue, where what
    // does not fit is counted.
    sink.ready();
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        // Polled, not waited on: a decision that queues an event never has
        // to wake this thread (a futex call on its path).
        loop {
            match queue.try_recv() {
                Ok(e) => batch.push(e),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    write_batch(&mut batch, sink, server, top);
                    sink.close();
                    return;
                }
            }
            if batch.len() == BATCH {
                break;
            }
        }
        sink.counters.sync();
        if batch.is_empty() {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            sink.check_moved();
            std::thread::sleep(POLL_EVERY);
            continue;
        }
        let full = batch.len() == BATCH;
        write_batch(&mut batch, sink, server, top);
        if !full {
            // The queue is drained: let events gather for one poll rather
            // than write a few at a time as they come (one write call per
            // poll at moderate rates; full batches go on at once).
            std::thread::sleep(POLL_EVERY);
        }
    }
    sink.close();
    sink.counters.sync();
}

/// Feeds `batch` to the live view and writes it (emptying it).
fn write_batch(batch: &mut Vec<Event>, sink: &mut Sink, server: &str, top: &Mutex<Top>) {
    if batch.is_empty() {
        return;
    }
    {
        let mut top = match top.lock() {
            Ok(t) => t,
            Err(poisoned) => poisoned.into_inner(),
        };
        for e in batch.iter() {
            top.add(e);
        }
    }
    sink.write(batch, server);
    batch.clear();
}

/// An open sink.
enum Out {
    Stdout(std::io::Stdout),
    File(File),
}

impl Out {
    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Out::Stdout(s) => {
                let mut s = s.lock();
                s.write_all(bytes)?;
                s.flush()
            }
            Out::File(f) => f.write_all(bytes),
        }
    }
}

/// The sink, its rotation and its failures.
struct Sink {
    target: EventSink,
    max_bytes: u64,
    keep: u32,
    counters: EventCounters,
    out: Option<Out>,
    /// Whether the open file is a regular file (rotated, checked for
    /// having been moved); FIFOs, devices and stdout are not.
    regular: bool,
    /// Bytes in the open file.
    size: u64,
    /// (device, inode) of the open file.
    identity: Option<(u64, u64)>,
    /// Not before then is a failed sink opened again.
    retry_at: Option<Instant>,
    /// A write failed since the sink was opened: the file may end inside
    /// a line.
    torn: bool,
    last_check: Instant,
    /// Failures since the last log line: events dropped, the last error.
    failing: Option<(u64, String)>,
    last_log: Option<Instant>,
    buf: Vec<u8>,
    /// Events in `buf`.
    in_buf: u64,
}

impl Sink {
    fn new(settings: &EventSettings, counters: EventCounters) -> Self {
        Self {
            target: settings.sink.clone(),
            max_bytes: settings.max_bytes,
            keep: settings.keep,
            counters,
            out: None,
            regular: false,
            size: 0,
            identity: None,
            retry_at: None,
            torn: false,
            last_check: Instant::now(),
            failing: None,
            last_log: None,
            buf: Vec::with_capacity(256 * 1024),
            in_buf: 0,
        }
    }

    fn path(&self) -> Option<&Path> {
        match &self.target {
            EventSink::Stdout => None,
            EventSink::File(p) => Some(p),
        }
    }

    fn describe(&self) -> String {
        self.path()
            .map_or_else(|| "stdout".to_owned(), |p| p.display().to_string())
    }

    /// Opens the sink if it is closed and may be opened now; whether it is
    /// open.
    fn ready(&mut self) -> bool {
        if self.out.is_some() {
            return true;
        }
        if self.retry_at.is_some_and(|t| Instant::now() < t) {
            return false;
        }
        match self.open() {
            Ok(()) => {
                self.retry_at = None;
                true
            }
            Err(e) => {
                self.failed(&e);
                false
            }
        }
    }

    fn open(&mut self) -> std::io::Result<()> {
        let Some(path) = self.path().map(Path::to_path_buf) else {
            self.out = Some(Out::Stdout(std::io::stdout()));
            self.regular = false;
            return Ok(());
        };
        // A FIFO blocks here until a reader opens it: only this thread
        // waits.
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        let meta = file.metadata()?;
        self.regular = meta.is_file();
        self.size = if self.regular { meta.len() } else { 0 };
        self.identity = Some((meta.dev(), meta.ino()));
        self.last_check = Instant::now();
        if self.torn && self.regular && self.size > 0 && !ends_with_newline(&path) {
            // The line a failed write tore is ended, so the next one reads.
            self.buf.push(b'\n');
        }
        self.torn = false;
        self.out = Some(Out::File(file));
        Ok(())
    }

    /// Writes `events` (emptying it), rotating where a file would grow
    /// past its bound.
    fn write(&mut self, events: &mut Vec<Event>, server: &str) {
        self.check_moved();
        if !self.ready() {
            self.dropped(events.len() as u64);
            return;
        }
        let total = events.len();
        for (i, mut e) in events.drain(..).enumerate() {
            e.server.push_str(server);
            let start = self.buf.len();
            if serde_json::to_writer(&mut self.buf, &e).is_err() {
                // (Nothing in an event fails to serialize; should it, the
                // event is dropped alone.)
                self.buf.truncate(start);
                self.dropped(1);
                continue;
            }
            self.buf.push(b'\n');
            if self.regular
                && self.max_bytes > 0
                && self.size + self.buf.len() as u64 > self.max_bytes
                && self.size + start as u64 > 0
            {
                // This line would take the file past its bound: what comes
                // before it goes to this file, the line to the next one.
                let tail = self.buf.split_off(start);
                let flushed = self.flush();
                if flushed {
                    self.rotate();
                }
                if !flushed || !self.ready() {
                    // This event and the rest of the batch are lost.
                    self.dropped((total - i) as u64);
                    return;
                }
                self.buf.extend_from_slice(&tail);
            }
            self.in_buf += 1;
        }
        self.flush();
    }

    /// Writes the buffer; whether it was written. A failure drops its
    /// events and closes the sink.
    fn flush(&mut self) -> bool {
        if self.buf.is_empty() {
            self.in_buf = 0;
            return true;
        }
        let result = match &mut self.out {
            Some(out) => out.write_all(&self.buf),
            None => Err(std::io::Error::other("not open")),
        };
        let events = std::mem::take(&mut self.in_buf);
        let bytes = self.buf.len() as u64;
        self.buf.clear();
        match result {
            Ok(()) => {
                self.size += bytes;
                self.counters.written.increment(events);
                if let Some((dropped, _)) = self.failing.take() {
                    info!(
                        dropped_since_last_report = dropped,
                        "decision events: writing to {} again",
                        self.describe()
                    );
                    self.last_log = None;
                }
                true
            }
            Err(e) => {
                // What part of the buffer was written is cut off again, so
                // the file holds whole lines only; if that fails too, the
                // torn line is ended when the file is opened again.
                let cut = match &self.out {
                    Some(Out::File(f)) if self.regular => f.set_len(self.size).is_ok(),
                    _ => false,
                };
                self.torn = !cut;
                self.failed(&e);
                self.dropped(events);
                false
            }
        }
    }

    /// `n` events dropped because the sink is failing.
    fn dropped(&mut self, n: u64) {
        self.counters.write_error.increment(n);
        if let Some((dropped, _)) = &mut self.failing {
            *dropped += n;
        }
    }

    /// A failure to open or write: the sink is closed until
    /// [`RETRY_AFTER`] from now; logged at once the first time, then at
    /// most every [`LOG_EVERY`] with what was dropped since.
    fn failed(&mut self, e: &std::io::Error) {
        self.out = None;
        self.retry_at = Some(Instant::now() + RETRY_AFTER);
        let target = self.describe();
        let due = self.last_log.is_none_or(|t| t.elapsed() >= LOG_EVERY);
        let failing = self.failing.get_or_insert((0, String::new()));
        failing.1 = e.to_string();
        if due {
            warn!(
                error = %failing.1,
                dropped_since_last_report = failing.0,
                "decision events: cannot write to {target}; dropping events, trying again every {RETRY_AFTER:?}",
            );
            failing.0 = 0;
            self.last_log = Some(Instant::now());
        }
    }

    /// Moves `PATH` to `PATH.1` (and each `PATH.i` to `PATH.i+1`, the
    /// oldest beyond `keep` overwritten) and opens a new `PATH`.
    fn rotate(&mut self) {
        let Some(path) = self.path().map(Path::to_path_buf) else {
            return;
        };
        self.out = None;
        let result = if self.keep == 0 {
            std::fs::remove_file(&path)
        } else {
            for i in (1..self.keep).rev() {
                let from = numbered(&path, i);
                if from.exists() {
                    let _ = std::fs::rename(&from, numbered(&path, i + 1));
                }
            }
            std::fs::rename(&path, numbered(&path, 1))
        };
        if let Err(e) = result {
            // Written on past the bound rather than lost.
            warn!(error = %e, "decision events: cannot rotate {}", path.display());
        }
        self.size = 0;
    }

    /// At most every [`CHECK_EVERY`]: a file moved or removed by someone
    /// else (an outside log rotation) is closed, to be opened again at its
    /// path by the next write. (A failed sink is opened again by the first
    /// batch after its rest.)
    fn check_moved(&mut self) {
        if self.out.is_none() || !self.regular || self.last_check.elapsed() < CHECK_EVERY {
            return;
        }
        self.last_check = Instant::now();
        let Some(path) = self.path() else { return };
        let now = std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
        if now != self.identity {
            self.out = None;
        }
    }

    fn close(&mut self) {
        self.flush();
        self.out = None;
    }
}

/// `PATH.i`.
fn numbered(path: &Path, i: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{i}"));
    PathBuf::from(name)
}

/// Whether the file at `path` ends with a newline (a torn write did not
/// leave half a line).
fn ends_with_newline(path: &Path) -> bool {
    let mut last = [0u8];
    File::open(path)
        .and_then(|mut f| {
            f.seek(SeekFrom::End(-1))?;
            f.read_exact(&mut last)
        })
        .is_ok_and(|()| last[0] == b'\n')
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::events::EventOutcome;

    fn sink(path: &Path, max_bytes: u64, keep: u32) -> Sink {
        let mut s = EventSettings::new(EventSink::File(path.to_owned()));
        s.max_bytes = max_bytes;
        s.keep = keep;
        Sink::new(&s, EventCounters::register())
    }

    fn events(n: usize) -> Vec<Event> {
        (0..n)
            .map(|i| Event::new(1_000 + i as u64, "request", "r", "d", EventOutcome::Granted))
            .collect()
    }

    #[test]
    fn rotation_keeps_each_file_under_its_bound_and_keep_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let line = serde_json::to_string(&{
            let mut e = events(1).remove(0);
            e.server.push('s');
            e
        })
        .unwrap()
        .len() as u64
            + 1;
        let mut s = sink(&path, line * 10, 2);
        for _ in 0..7 {
            s.write(&mut events(10), "s");
        }
        s.close();
        let lines = |p: &Path| std::fs::read_to_string(p).unwrap().lines().count();
        assert_eq!(lines(&path), 10);
        assert_eq!(lines(&numbered(&path, 1)), 10);
        assert_eq!(lines(&numbered(&path, 2)), 10);
        assert!(!numbered(&path, 3).exists());
        for p in [path.clone(), numbered(&path, 1)] {
            assert!(std::fs::metadata(&p).unwrap().len() <= line * 10);
        }
    }

    #[test]
    fn a_file_moved_away_is_opened_again_at_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let mut s = sink(&path, 0, 0);
        s.write(&mut events(2), "s");
        std::fs::rename(&path, dir.path().join("moved")).unwrap();
        s.last_check = Instant::now().checked_sub(CHECK_EVERY).unwrap();
        s.write(&mut events(3), "s");
        let lines = |p: &Path| std::fs::read_to_string(p).unwrap().lines().count();
        assert_eq!(lines(&dir.path().join("moved")), 2);
        assert_eq!(lines(&path), 3);
    }

    #[test]
    fn a_torn_line_is_ended_when_the_file_is_opened_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        std::fs::write(&path, "{\"half").unwrap();
        let mut s = sink(&path, 0, 0);
        s.torn = true;
        s.write(&mut events(1), "s");
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(serde_json::from_str::<Event>(lines[1]).is_ok());
    }
}
