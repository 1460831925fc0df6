//! Waiting for a copy (SPEC §14) through a `charon serve` process: the
//! Rust client's `ReserveCall::wait` (the copy its own release frees goes
//! to its waiting reserve: a waiting reserve does not hold up the
//! session's other operations) and `charon client hold --wait`.

use std::io::BufRead;
use std::process::Stdio;
use std::time::Duration;

use crate::support::{bin, charon, strict_client};
use charon_testkit::CharonProcess;
use serde_json::Value;

const LIMITS: &str = r#"
resources:
  - { name: page, kind: copy, domain_limit: 5, global_limit: 1, queue_limit: 1 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_reserve_gets_the_copy_its_own_client_releases() {
    let server = CharonProcess::start(bin(), LIMITS, &[]);
    let c = strict_client(&server);
    let first = c.reserve("page", "a").send().await.expect("a hold");
    assert!(first.is_granted());
    let waiting = {
        let c = c.clone();
        tokio::spawn(async move {
            c.reserve("page", "b")
                .wait(Duration::from_secs(20))
                .send()
                .await
        })
    };
    // Once it waits, the queue is full: another is told so at once.
    tokio::task::block_in_place(|| crate::support::wait_queued(&server, "page", 1));
    let full = crate::support::within(Duration::from_secs(10), async || {
        let h = c
            .reserve("page", "c")
            .wait(Duration::from_millis(1))
            .send()
            .await
            .expect("an answer");
        h.queue_full()
    })
    .await;
    assert!(full.is_some(), "the queue never filled");
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(first);
    let got = waiting.await.expect("the task").expect("an answer");
    assert!(got.is_granted(), "{:?}", got.reply());
    let waited = got.waited_on_server().expect("it was allowed to wait");
    assert!(waited >= Duration::from_millis(50), "{waited:?}");
    assert!(!got.queue_full() && !got.result_ready());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_hold_waits_for_its_copy() {
    let server = CharonProcess::start(bin(), LIMITS, &[]);
    let c = strict_client(&server);
    let first = c.reserve("page", "a").send().await.expect("a hold");
    let mut child = charon()
        .args([
            "client",
            "hold",
            "--server",
            &server.endpoint(),
            "page",
            "d",
            "--wait",
            "20s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the waiter");
    tokio::task::block_in_place(|| crate::support::wait_queued(&server, "page", 1));
    drop(first);
    let mut line = String::new();
    tokio::task::block_in_place(|| {
        std::io::BufReader::new(child.stdout.as_mut().expect("stdout"))
            .read_line(&mut line)
            .expect("the waiter prints its grant")
    });
    let v: Value = serde_json::from_str(&line).expect("JSON");
    assert_eq!(v["granted"], 1, "{line}");
    assert_eq!(
        (&v["queue_full"], &v["result_ready"]),
        (&Value::Bool(false), &Value::Bool(false))
    );
    assert!(v["waited_ms"].as_u64().expect("waited_ms") > 0, "{line}");
    charon_testkit::signal(child.id(), "TERM");
    let _ = child.wait();
}
