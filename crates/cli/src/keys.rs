//! The keys `charon top` listens to between two redraws: `q` (or Ctrl-C)
//! quits. On a terminal, stdin is taken out of line mode (no
//! echo, each key read as it is typed, Ctrl-C read as a key so that the
//! terminal is always given back as it was); elsewhere (a pipe, a file)
//! nothing is read and the redraws simply wait.

use std::io::{IsTerminal, Read};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::termios::{self, LocalModes, OptionalActions, SpecialCodeIndex, Termios};

/// Keys that end `charon top`: q, Q, Ctrl-C (not Esc: arrow keys begin
/// with it).
const QUIT: &[u8] = b"qQ\x03";

/// Stdin as a key reader: restores the terminal's settings when dropped.
#[derive(Debug)]
pub struct Keys {
    /// The terminal's settings before, when stdin is a terminal that
    /// could be set.
    saved: Option<Termios>,
}

impl Keys {
    /// Takes stdin out of line mode if it is a terminal.
    pub fn open() -> Self {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Self { saved: None };
        }
        let Ok(saved) = termios::tcgetattr(&stdin) else {
            return Self { saved: None };
        };
        let mut keys = saved.clone();
        keys.local_modes
            .remove(LocalModes::ICANON | LocalModes::ECHO | LocalModes::ISIG);
        keys.special_codes[SpecialCodeIndex::VMIN] = 1;
        keys.special_codes[SpecialCodeIndex::VTIME] = 0;
        match termios::tcsetattr(&stdin, OptionalActions::Now, &keys) {
            Ok(()) => Self { saved: Some(saved) },
            Err(_) => Self { saved: None },
        }
    }

    /// Waits `interval` (the time to the next redraw), or less if a key
    /// that quits is typed: whether one was.
    pub fn quit_within(&self, interval: Duration) -> bool {
        if self.saved.is_none() {
            std::thread::sleep(interval);
            return false;
        }
        let until = Instant::now() + interval;
        let stdin = std::io::stdin();
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let timeout = Timespec::try_from(left).unwrap_or(Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            });
            let mut fds = [PollFd::new(&stdin, PollFlags::IN)];
            match poll(&mut fds, Some(&timeout)) {
                Ok(0) => return false,
                Ok(_) => {}
                // Interrupted (a resize): go on waiting.
                Err(_) => continue,
            }
            let mut typed = [0u8; 64];
            match stdin.lock().read(&mut typed) {
                Ok(n) if typed[..n].iter().any(|b| QUIT.contains(b)) => return true,
                // End of input on a terminal (it went away): nothing more
                // will be typed.
                Ok(0) | Err(_) => {
                    std::thread::sleep(left);
                    return false;
                }
                Ok(_) => {}
            }
        }
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            let _ = termios::tcsetattr(std::io::stdin(), OptionalActions::Now, saved);
        }
    }
}
