//! Which database errors are a passing condition of the dependency — a
//! full disk, a lock held by another process, a lost connection — that
//! the API answers with 503 and `Retry-After`, rather than a fault in the
//! data or the program (500). SPEC §5: a dependency failing is a server
//! error, and clients may come back later.

use std::time::Duration;

use sqlx::error::DatabaseError;

/// Why the database cannot take a request now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailability {
    /// Another writer holds the lock (another process, a long
    /// transaction), or the database is short of memory or connections.
    Busy,
    /// The disk (or the PostgreSQL volume) is full.
    DiskFull,
    /// Reading or writing the file failed, or it cannot be opened or
    /// written (a read-only remount).
    Io,
    /// The database cannot be reached or is shutting down.
    Unreachable,
}

impl Unavailability {
    /// A few words for messages and logs.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Busy => "locked by another writer or overloaded",
            Self::DiskFull => "its disk is full",
            Self::Io => "its storage failed (I/O error or read-only)",
            Self::Unreachable => "it cannot be reached",
        }
    }

    /// What `Retry-After` tells a client: a lock passes in moments; a full
    /// disk or a lost database needs someone to act.
    pub fn retry_after(self) -> Duration {
        match self {
            Self::Busy => Duration::from_secs(1),
            Self::DiskFull | Self::Io | Self::Unreachable => Duration::from_secs(5),
        }
    }
}

/// The unavailability `e` shows, if it is one.
pub(super) fn classify(e: &sqlx::Error) -> Option<Unavailability> {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Some(Unavailability::Unreachable),
        sqlx::Error::Database(db) => {
            if let Some(e) = db.try_downcast_ref::<sqlx::sqlite::SqliteError>() {
                sqlite(e.code().as_deref())
            } else if let Some(e) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                postgres(e.code())
            } else {
                None
            }
        }
        _ => None,
    }
}

/// SQLite result codes (<https://www.sqlite.org/rescode.html>); sqlx
/// gives the extended code, whose low byte is the primary one.
fn sqlite(code: Option<&str>) -> Option<Unavailability> {
    let primary = code?.parse::<i32>().ok()? & 0xff;
    match primary {
        5..=7 => Some(Unavailability::Busy),  // BUSY, LOCKED, NOMEM
        13 => Some(Unavailability::DiskFull), // FULL
        8 | 10 | 14 | 15 => Some(Unavailability::Io), // READONLY, IOERR, CANTOPEN, PROTOCOL
        _ => None,
    }
}

/// PostgreSQL SQLSTATEs (<https://www.postgresql.org/docs/current/errcodes-appendix.html>).
fn postgres(code: &str) -> Option<Unavailability> {
    match code {
        "53100" => Some(Unavailability::DiskFull),
        "58030" | "25006" => Some(Unavailability::Io), // io_error, read-only (a standby)
        "55P03" | "40001" | "40P01" | "57014" => Some(Unavailability::Busy), // lock_not_available, serialization, deadlock, statement canceled
        "57P01" | "57P02" | "57P03" => Some(Unavailability::Unreachable), // shutting down, cannot connect now
        c if c.starts_with("08") => Some(Unavailability::Unreachable),    // connection exceptions
        c if c.starts_with("53") => Some(Unavailability::Busy), // out of memory, too many connections
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_codes() {
        assert_eq!(sqlite(Some("13")), Some(Unavailability::DiskFull));
        assert_eq!(sqlite(Some("5")), Some(Unavailability::Busy));
        // SQLITE_BUSY_SNAPSHOT, SQLITE_IOERR_WRITE: extended codes.
        assert_eq!(sqlite(Some("517")), Some(Unavailability::Busy));
        assert_eq!(sqlite(Some("778")), Some(Unavailability::Io));
        // SQLITE_CORRUPT, SQLITE_NOTADB, SQLITE_CONSTRAINT: not passing.
        for code in ["11", "26", "19", "1"] {
            assert_eq!(sqlite(Some(code)), None, "{code}");
        }
        assert_eq!(sqlite(None), None);
        assert_eq!(sqlite(Some("x")), None);
    }

    #[test]
    fn postgres_codes() {
        assert_eq!(postgres("53100"), Some(Unavailability::DiskFull));
        assert_eq!(postgres("55P03"), Some(Unavailability::Busy));
        assert_eq!(postgres("08006"), Some(Unavailability::Unreachable));
        assert_eq!(postgres("23505"), None);
        assert_eq!(postgres("XX001"), None);
    }
}
