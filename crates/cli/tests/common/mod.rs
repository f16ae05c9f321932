//! Drives a real `toolfleet serve` process: a data directory of its own, a
//! configuration, the address it prints, and a client with a token.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

pub const TOKEN: &str = "tf_test_alice";
pub const OTHER_TOKEN: &str = "tf_test_mallory";

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "toolfleet-{name}-{}",
            uuid::Uuid::now_v7().simple()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn sha(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A configuration with two tenants' tokens and the expense pack, plus
/// top-level keys `top` and tables `extra`.
pub fn config_with(dir: &Path, top: &str, extra: &str) -> String {
    let pack = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/expenses/toolfleet.toml");
    format!(
        r#"
listen = "127.0.0.1:0"
data_dir = "{data}"
{top}
include = ["{pack}"]

[[auth.tokens]]
sha256 = "{alice}"
tenant = "acme"
user = "alice"
scopes = ["expenses:read", "expenses:submit"]

[[auth.tokens]]
sha256 = "{mallory}"
tenant = "globex"
user = "mallory"
scopes = ["expenses:read", "expenses:submit"]

[webhooks]
allow = ["127.0.0.1"]
secret = "test-webhook-key"
{extra}
"#,
        data = dir.join("data").display(),
        pack = pack.display(),
        alice = sha(TOKEN),
        mallory = sha(OTHER_TOKEN),
    )
}

/// A configuration with two tenants' tokens and the expense pack, plus tables `extra`.
pub fn config(dir: &Path, extra: &str) -> String {
    config_with(dir, "", extra)
}

/// A running `toolfleet serve`.
pub struct Server {
    pub child: Child,
    pub base: String,
    pub config: PathBuf,
}

impl Server {
    /// Starts the binary on `config_text` written into `dir`.
    pub fn start(dir: &Path, config_text: &str) -> Server {
        let config = dir.join("toolfleet.toml");
        std::fs::write(&config, config_text).expect("config written");
        Server::start_with(&config)
    }

    pub fn start_with(config: &Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_toolfleet"))
            .env(
                "TOOLFLEET_LOG",
                std::env::var("TOOLFLEET_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .arg("--config")
            .arg(config)
            .arg("serve")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("toolfleet starts");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let mut said = Vec::new();
        let base = loop {
            let line = match lines.next() {
                Some(Ok(line)) => line,
                _ => panic!("toolfleet serve exited before serving: {}", said.join("\n")),
            };
            said.push(line.clone());
            if let Some(rest) = line.strip_prefix("toolfleet serving on ") {
                break rest.split_whitespace().next().expect("address").to_owned();
            }
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        let echo = std::env::var_os("TOOLFLEET_TEST_ECHO").is_some();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if echo {
                    eprintln!("[serve] {line}");
                }
            }
        });
        Server {
            child,
            base,
            config: config.to_path_buf(),
        }
    }

    /// Kills the process at once, as SIGKILL does.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn client(&self, token: &str) -> Client {
        Client {
            http: toolfleet_executors::http_client().expect("client"),
            base: self.base.clone(),
            token: token.to_owned(),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A client of the HTTP API.
#[derive(Clone)]
pub struct Client {
    pub http: reqwest::Client,
    pub base: String,
    pub token: String,
}

impl Client {
    pub async fn raw(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> (u16, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if !self.token.is_empty() {
            request = request.bearer_auth(&self.token);
        }
        if let Some(body) = body {
            request = request
                .header("Content-Type", "application/json")
                .body(body);
        }
        let response = request.send().await.expect("the server answers");
        let status = response.status().as_u16();
        let text = response.text().await.expect("a body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(json!({"raw": text})),
        )
    }

    pub async fn get(&self, path: &str) -> Value {
        let (status, body) = self.raw(reqwest::Method::GET, path, None).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    pub async fn post(&self, path: &str, body: Value) -> Value {
        let (status, body) = self
            .raw(
                reqwest::Method::POST,
                path,
                Some(body.to_string().into_bytes()),
            )
            .await;
        assert_eq!(status, 200, "POST {path}: {body}");
        body
    }

    pub async fn call(&self, tool: &str, args: Value) -> Value {
        self.post("/v1/calls", json!({"tool": tool, "args": args}))
            .await
    }
}

/// Waits for a job to settle through the long-poll.
pub async fn settle(client: &Client, job_id: &str) -> Value {
    for _ in 0..60 {
        let envelope = client.get(&format!("/v1/jobs/{job_id}?wait_s=5")).await;
        if envelope["status"] != "running" {
            return envelope;
        }
    }
    panic!("job {job_id} did not settle");
}

/// Runs `f` until it answers `Some`, for at most `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = f().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not reached within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
