//! Test support: a configuration service on a private SQLite file or a
//! private PostgreSQL database, requests through the router without a
//! socket, and a real server on a free port.

#![allow(dead_code, clippy::unwrap_used)]

use std::future::Future;
use std::pin::Pin;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use charon_config_service::{AppState, StoreOptions, Tokens, router};
use serde_json::Value;
use tempfile::TempDir;
use tower::ServiceExt;

pub const WRITER: &str = "writer-token";
pub const READER: &str = "reader-token";

/// A database for one test: a SQLite file in a temporary directory or a
/// database of its own in a private PostgreSQL cluster.
#[derive(Debug)]
pub struct TestDb {
    pub location: String,
    _dir: Option<TempDir>,
}

impl TestDb {
    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let location = dir.path().join("config.db").display().to_string();
        Self {
            location,
            _dir: Some(dir),
        }
    }

    /// A SQLite file at `path`, in a directory the test owns (a small
    /// filesystem that fills up, say).
    pub fn at(path: &std::path::Path) -> Self {
        Self {
            location: path.display().to_string(),
            _dir: None,
        }
    }

    pub fn postgres(url: String) -> Self {
        Self {
            location: url,
            _dir: None,
        }
    }

    pub fn tokens() -> Tokens {
        Tokens::new().writer(WRITER).reader(READER)
    }

    /// The service with the standard tokens and default options.
    pub async fn app(&self) -> TestApp {
        self.app_with(Self::tokens(), StoreOptions::default()).await
    }

    pub async fn app_with(&self, tokens: Tokens, options: StoreOptions) -> TestApp {
        let state = AppState::open_with(&self.location, tokens, options)
            .await
            .unwrap_or_else(|e| panic!("open {}: {e}", self.location));
        TestApp { state }
    }
}

/// The API, called through its router.
#[derive(Debug, Clone)]
pub struct TestApp {
    pub state: AppState,
}

/// An answer.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub text: String,
    pub json: Value,
}

impl Reply {
    /// The version in `ETag`.
    pub fn etag(&self) -> u64 {
        let v = self
            .headers
            .get(header::ETAG)
            .unwrap_or_else(|| panic!("no ETag on {self:?}"))
            .to_str()
            .unwrap();
        v.trim_matches('"').parse().unwrap()
    }

    /// Asserts the status, showing the body if it is not.
    #[track_caller]
    pub fn expect(self, status: u16) -> Self {
        assert_eq!(
            self.status.as_u16(),
            status,
            "unexpected status; body: {}",
            self.text
        );
        self
    }

    /// The paths of the problems of an error answer.
    pub fn problem_paths(&self) -> Vec<String> {
        self.json["problems"]
            .as_array()
            .unwrap_or_else(|| panic!("no problems in {}", self.text))
            .iter()
            .map(|p| p["path"].as_str().unwrap().to_owned())
            .collect()
    }
}

/// A request being built.
#[derive(Debug)]
pub struct Call {
    app: TestApp,
    method: Method,
    path: String,
    token: Option<String>,
    headers: Vec<(String, String)>,
    body: Option<(String, String)>,
}

impl Call {
    /// Sends without a token.
    pub fn anonymous(mut self) -> Self {
        self.token = None;
        self
    }

    pub fn token(mut self, t: &str) -> Self {
        self.token = Some(t.to_owned());
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn if_match(self, v: impl ToString) -> Self {
        self.header("if-match", &v.to_string())
    }

    pub fn json(mut self, v: Value) -> Self {
        self.body = Some(("application/json".to_owned(), v.to_string()));
        self
    }

    pub fn body(mut self, content_type: &str, text: &str) -> Self {
        self.body = Some((content_type.to_owned(), text.to_owned()));
        self
    }

    /// Sends, and asserts the answer's status (naming the caller's line,
    /// and showing the body, if it is not).
    #[track_caller]
    pub fn expect(self, status: u16) -> impl Future<Output = Reply> {
        let at = std::panic::Location::caller();
        async move {
            let reply = self.send().await;
            assert_eq!(
                reply.status.as_u16(),
                status,
                "unexpected status at {at}; body: {}",
                reply.text
            );
            reply
        }
    }

    /// Sends, asserts a 400, and gives the paths of its problems.
    #[track_caller]
    pub fn problems(self) -> impl Future<Output = Vec<String>> {
        let answer = self.expect(400);
        async move { answer.await.problem_paths() }
    }

    pub async fn send(self) -> Reply {
        let mut request = Request::builder().method(self.method).uri(&self.path);
        if let Some(t) = &self.token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        for (k, v) in &self.headers {
            request = request.header(k.as_str(), v.as_str());
        }
        let body = match self.body {
            Some((content_type, text)) => {
                request = request.header(header::CONTENT_TYPE, content_type);
                Body::from(text)
            }
            None => Body::empty(),
        };
        let response = router(self.app.state.clone())
            .oneshot(request.body(body).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        Reply {
            status,
            headers,
            text,
            json,
        }
    }
}

impl TestApp {
    fn call(&self, method: Method, path: &str) -> Call {
        Call {
            app: self.clone(),
            method,
            path: path.to_owned(),
            token: Some(WRITER.to_owned()),
            headers: Vec::new(),
            body: None,
        }
    }

    pub fn get(&self, path: &str) -> Call {
        self.call(Method::GET, path)
    }

    pub fn put(&self, path: &str) -> Call {
        self.call(Method::PUT, path)
    }

    pub fn post(&self, path: &str) -> Call {
        self.call(Method::POST, path)
    }

    pub fn delete(&self, path: &str) -> Call {
        self.call(Method::DELETE, path)
    }

    pub fn method(&self, method: Method, path: &str) -> Call {
        self.call(method, path)
    }

    /// The current version, from `GET /v1/changes`.
    pub async fn version(&self) -> u64 {
        self.get("/v1/changes?since=0")
            .send()
            .await
            .expect(200)
            .json["version"]
            .as_u64()
            .unwrap()
    }
}

/// Percent-encodes a name as one path segment.
pub fn seg(name: &str) -> String {
    let mut out = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `/v1/resources/{name}` with the name encoded.
pub fn resource_path(name: &str) -> String {
    format!("/v1/resources/{}", seg(name))
}

pub type Scenario = fn(TestDb) -> Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs every scenario on a database of its own in one private PostgreSQL
/// cluster (started once: a cluster per test would cost seconds each), and
/// fails listing every scenario that failed.
pub fn run_on_postgres(scenarios: &[(&'static str, Scenario)]) {
    let pg = charon_testkit::Postgres::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut failed = Vec::new();
    for (name, scenario) in scenarios {
        let url = pg.create_database(name);
        let db = TestDb::postgres(url);
        let outcome = runtime.block_on(async { tokio::spawn(scenario(db)).await });
        if outcome.is_err() {
            failed.push(*name);
        }
    }
    assert!(
        failed.is_empty(),
        "failed on PostgreSQL (panics above): {failed:?}"
    );
}

/// Declares each scenario `async fn name(db: TestDb)` as a SQLite test
/// `sqlite::name` and runs them all on PostgreSQL in `postgres`: the same
/// test bodies on both databases.
#[macro_export]
macro_rules! on_both_databases {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::support::TestDb::sqlite()).await;
                }
            )*
        }

        #[test]
        fn postgres() {
            support::run_on_postgres(&[
                $((stringify!($name), |db| Box::pin($name(db)))),*
            ]);
        }
    };
}

/// A real server on a free port.
#[derive(Debug)]
pub struct Served {
    pub url: String,
    pub port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Served {
    /// Serves `state` on `port` (0: any free one).
    pub async fn start(state: AppState, port: u16) -> Self {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(charon_config_service::serve(listener, state, async {
            let _ = stopped.await;
        }));
        Self {
            url: format!("http://127.0.0.1:{port}"),
            port,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops the server and waits until the port is closed.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap().unwrap();
        }
    }
}
