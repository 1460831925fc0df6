//! A small filesystem that really fills up: a size-limited tmpfs mounted
//! on a temporary directory, so a test can run a database on it, fill the
//! disk, and free it again. Mounting needs root (or CAP_SYS_ADMIN).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

/// ENOSPC: no space left on the device.
const ENOSPC: i32 = 28;

/// A tmpfs of a fixed size. Unmounted on drop (lazily if something still
/// has a file open on it), even when the test panics.
#[derive(Debug)]
pub struct SmallFs {
    dir: TempDir,
    filler: PathBuf,
}

impl SmallFs {
    /// Mounts a tmpfs of `bytes` on a new temporary directory; `Err` says
    /// why it could not (not root, no tmpfs, no `mount(8)`).
    pub fn mount(bytes: u64) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes},mode=0700")])
            .arg("tmpfs")
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount(8): {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let filler = dir.path().join("filler");
        Ok(Self { dir, filler })
    }

    /// [`SmallFs::mount`] for a fault test named `test`: `None` (said in a
    /// `FAULT … NOT RUN` line) when mounting is not permitted and
    /// `CHARON_TEST_WITHOUT_MOUNT` is set; otherwise a failure to mount
    /// fails the test, so that the fault is never skipped silently.
    pub fn for_test(test: &str, bytes: u64) -> Option<Self> {
        match Self::mount(bytes) {
            Ok(fs) => Some(fs),
            Err(why) if std::env::var_os("CHARON_TEST_WITHOUT_MOUNT").is_some() => {
                println!("FAULT {test}: NOT RUN: {why}");
                None
            }
            Err(why) => panic!(
                "cannot mount a small tmpfs for {test} ({why}); run as root, or set \
                 CHARON_TEST_WITHOUT_MOUNT=1 to skip the tests that need one"
            ),
        }
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills every byte left with a filler file (writing until the kernel
    /// answers ENOSPC, in smaller and smaller pieces); returns the bytes
    /// the filler holds now.
    pub fn fill(&self) -> u64 {
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.filler)
            .expect("open the filler file");
        let mut chunk = 64 * 1024;
        let block = vec![0xA5u8; chunk];
        while chunk > 0 {
            match f.write(&block[..chunk]) {
                Ok(0) => chunk /= 2,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(ENOSPC) => chunk /= 2,
                Err(e) => panic!("filling {}: {e}", self.filler.display()),
            }
        }
        f.metadata().map(|m| m.len()).unwrap_or(0)
    }

    /// Deletes the filler file, giving its space back.
    pub fn free(&self) {
        match std::fs::remove_file(&self.filler) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("removing {}: {e}", self.filler.display()),
        }
    }

    /// Bytes still free on the filesystem (from `df`).
    pub fn available(&self) -> u64 {
        let out = Command::new("df")
            .args(["-B1", "--output=avail"])
            .arg(self.path())
            .output()
            .expect("df");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let unmounted = Command::new("umount")
            .arg(self.dir.path())
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            // Something still has a file open there (a process being
            // killed): detach now, the kernel frees it when it closes.
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }
}
