//! The store's own tests: database paths as URLs, each commit synced,
//! rows read back and damage reported.

use super::*;

#[test]
fn paths_become_sqlite_urls() {
    let (url, backend) = database_url("/tmp/a b/c?.db").expect("a path");
    assert_eq!(backend, Backend::Sqlite);
    assert_eq!(url, "sqlite:///tmp/a%20b/c%3F.db?mode=rwc");
    assert_eq!(
        database_url("postgres://u@h/db").expect("pg").1,
        Backend::Postgres
    );
    assert_eq!(
        database_url("sqlite::memory:").expect("mem").1,
        Backend::Sqlite
    );
    assert!(database_url("mysql://h/db").is_err());
    assert!(database_url("").is_err());
}

/// "Durably committed": every connection to the file runs in WAL mode
/// with the log synced at each commit, and waits for another writer's
/// lock only as long as configured.
#[tokio::test]
async fn every_connection_syncs_each_commit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("c.db");
    let options = StoreOptions {
        lock_timeout: Duration::from_millis(1234),
        ..StoreOptions::default()
    };
    let db = Db::open(&path.display().to_string(), &options)
        .await
        .expect("open");
    let mut conn = db.pools.writes.acquire().await.expect("a connection");
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await
        .expect("journal_mode");
    let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut *conn)
        .await
        .expect("synchronous");
    let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
        .fetch_one(&mut *conn)
        .await
        .expect("busy_timeout");
    assert_eq!((mode.as_str(), synchronous, busy), ("wal", 2, 1234));
}

/// Rows come back through the `FromRow` structs; what the database
/// cannot check (a document that parses, no negative version) is
/// reported as damage, not as a database error.
#[tokio::test]
async fn rows_are_read_and_damage_is_reported() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("c.db");
    let db = Db::open(&path.display().to_string(), &StoreOptions::default())
        .await
        .expect("open");
    let mut conn = db.pools.writes.acquire().await.expect("a connection");
    for sql in [
        "INSERT INTO charon_resources VALUES ('a/x', 'rate', '{\"name\":\"a/x\"}', 1, 1)",
        "INSERT INTO charon_namespaces VALUES ('a', 1, 0, 3)",
    ] {
        sqlx::query(sql).execute(&mut *conn).await.expect(sql);
    }
    let mut tx = db.read().await.expect("read");
    assert_eq!(tx.meta().await.expect("meta").version, 0);
    let resources = tx.resources().await.expect("resources");
    assert_eq!(resources["a/x"].document["name"], "a/x");
    assert_eq!(resources["a/x"].updated_version, 1);
    let ns = tx.namespace("a").await.expect("namespace").expect("a");
    assert!(ns.settings.allow_unconfigured && !ns.settings.ignore_configured);
    assert_eq!(ns.updated_version, 3);
    drop(tx);

    for sql in [
        "UPDATE charon_resources SET updated_version = -1",
        "UPDATE charon_resources SET updated_version = 1, document = 'not json'",
    ] {
        sqlx::query(sql).execute(&mut *conn).await.expect(sql);
        let mut tx = db.read().await.expect("read");
        let damaged = tx.resource("a/x").await;
        assert!(
            matches!(damaged, Err(ConfigDbError::Corrupt(_))),
            "{sql}: {damaged:?}"
        );
    }
}
