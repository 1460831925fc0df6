//! The SQLite file itself: created readable by its owner only, and run so
//! that a commit acknowledged is a commit that survives a power cut.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::SqliteConnectOptions;

/// The settings every connection to the file gets, in this order:
/// - WAL: readers never wait for the writer, the writer never waits for
///   readers;
/// - `synchronous = FULL`: in WAL mode, the log is synced at every commit,
///   so a commit that returned is on disk (NORMAL would only survive a
///   crash of the process, not of the machine);
/// - `busy_timeout`: how long to wait for another writer's lock before
///   `SQLITE_BUSY` (then 503).
pub(super) fn pragmas(lock_timeout: Duration) -> [String; 3] {
    [
        "PRAGMA journal_mode = WAL".to_owned(),
        "PRAGMA synchronous = FULL".to_owned(),
        format!("PRAGMA busy_timeout = {}", lock_timeout.as_millis()),
    ]
}

/// Creates the database file of `url` with mode 0600 if it is missing
/// and the URL lets SQLite create it. SQLite creates new files 0644, and
/// gives the `-wal` and `-shm` files the mode of the database, so creating
/// the database first is enough for all three. An existing file keeps its
/// mode (the operator's choice), with a warning if others may read it.
pub(super) fn create_owner_only(url: &str) -> std::io::Result<()> {
    let Some(path) = file_of(url) else {
        return Ok(());
    };
    match std::fs::metadata(&path) {
        Ok(meta) => {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(
                    path = %path.display(),
                    mode = format!("{mode:o}"),
                    "the configuration database may be read by other users; chmod 600 it"
                );
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && url.contains("mode=rwc") => {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(_) => Ok(()),
                // Another process created it meanwhile.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                Err(e) => Err(e),
            }
        }
        // Let SQLite report what is wrong.
        Err(_) => Ok(()),
    }
}

/// The file a `sqlite:` URL names, if it names one.
fn file_of(url: &str) -> Option<PathBuf> {
    let options = SqliteConnectOptions::from_str(url).ok()?;
    let path = options.get_filename();
    let text = path.to_str()?;
    if text.is_empty() || text == ":memory:" || text.starts_with("file:") {
        return None;
    }
    Some(path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_file_is_owner_only_and_an_old_one_is_kept() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("c.db");
        let url = format!("sqlite://{}?mode=rwc", path.display());
        create_owner_only(&url).expect("created");
        let mode = |p: &std::path::Path| {
            std::fs::metadata(p).expect("exists").permissions().mode() & 0o777
        };
        assert_eq!(mode(&path), 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        create_owner_only(&url).expect("kept");
        assert_eq!(mode(&path), 0o640);
        // Without mode=rwc SQLite would not create it: neither do we.
        let other = dir.path().join("d.db");
        create_owner_only(&format!("sqlite://{}", other.display())).expect("nothing to do");
        assert!(!other.exists());
        assert!(file_of("sqlite::memory:").is_none());
    }
}
