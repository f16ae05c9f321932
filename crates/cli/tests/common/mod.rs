//! Drives a real `toolfleet serve` process: a data directory of its own, a
//! configuration, the address it prints, and a client with a token.

#![allow(dead_code)]

pub(crate) mod manifests;
pub(crate) mod month;
pub(crate) mod promql;
pub(crate) mod scripted;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

pub(crate) const TOKEN: &str = "tf_test_alice";

/// The webhook key of [`config_with`]: at least 32 bytes, as toolfleet requires.
pub(crate) const WEBHOOK_SECRET: &str = "test-webhook-key-0123456789abcdef";

/// The repository's root directory.
pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

/// The text of the repository file at `relative`.
pub(crate) fn read_repo(relative: &str) -> String {
    let path = repo().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The Dockerfile's instructions, continuation lines joined and comments
/// dropped: `(INSTRUCTION, arguments)`.
pub(crate) fn dockerfile() -> Vec<(String, String)> {
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in read_repo("Dockerfile").lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                let (word, rest) = current
                    .split_once(char::is_whitespace)
                    .unwrap_or((&current, ""));
                instructions.push((word.to_uppercase(), rest.trim().to_owned()));
                current.clear();
            }
        }
    }
    instructions
}

/// A JSON-form (`["a", "b"]`) Dockerfile argument.
pub(crate) fn exec_form(arguments: &str) -> Vec<String> {
    serde_json::from_str(arguments)
        .unwrap_or_else(|_| panic!("`{arguments}` is not the exec (JSON) form"))
}

/// Whether the tests run under CI (`CI` set, and not empty).
pub(crate) fn under_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

/// What a test needs (a tool, a privilege) is absent: a failure under CI,
/// else a skip.
pub(crate) fn missing(what: &str) {
    assert!(
        !under_ci(),
        "{what}; .ci/run provides it, and CI never skips this test"
    );
    eprintln!("SKIPPED (fails under CI): {what}");
}

/// `toolfleet <args>` run in the repository's root, with no configuration
/// named by the environment.
pub(crate) fn toolfleet(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_toolfleet"))
        .args(args)
        .current_dir(repo())
        .env_remove("TOOLFLEET_CONFIG")
        .output()
        .expect("run toolfleet")
}
pub(crate) const OTHER_TOKEN: &str = "tf_test_mallory";

/// A port nobody listens on now (the kernel's pick).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A temporary directory removed on drop.
pub(crate) struct TempDir(pub PathBuf);

impl TempDir {
    pub(crate) fn new(name: &str) -> TempDir {
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

/// The hex SHA-256 of a token, as `[[auth.tokens]]` names it.
pub(crate) fn sha(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A configuration with two tenants' tokens and the expense pack, plus
/// top-level keys `top` and tables `extra`; webhooks may reach any port of
/// 127.0.0.1 (where [`hook_receiver`]s listen).
pub(crate) fn config_with(dir: &Path, top: &str, extra: &str) -> String {
    config_allowing(dir, top, r#"["127.0.0.1:*"]"#, extra)
}

/// As [`config_with`], with `[webhooks] allow = <allow>` (TOML).
pub(crate) fn config_allowing(dir: &Path, top: &str, allow: &str, extra: &str) -> String {
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
allow = {allow}
secret = "{webhook_secret}"
{extra}
"#,
        data = dir.join("data").display(),
        pack = pack.display(),
        alice = sha(TOKEN),
        mallory = sha(OTHER_TOKEN),
        webhook_secret = WEBHOOK_SECRET,
    )
}

/// A configuration with two tenants' tokens and the expense pack, plus tables `extra`.
pub(crate) fn config(dir: &Path, extra: &str) -> String {
    config_with(dir, "", extra)
}

/// A running `toolfleet serve`.
pub(crate) struct Server {
    pub child: Child,
    pub base: String,
    pub config: PathBuf,
    /// What the process wrote on stderr before it served.
    pub startup: Vec<String>,
}

impl Server {
    /// Starts the binary on `config_text` written into `dir`.
    pub(crate) fn start(dir: &Path, config_text: &str) -> Server {
        let config = dir.join("toolfleet.toml");
        std::fs::write(&config, config_text).expect("config written");
        Server::start_with(&config)
    }

    pub(crate) fn start_with(config: &Path) -> Server {
        Server::start_role(config, "serve", "toolfleet serving on ")
    }

    /// Starts `toolfleet <role>` and waits for the stderr line starting with `ready`.
    pub(crate) fn start_role(config: &Path, role: &str, ready: &str) -> Server {
        Server::start_role_env(config, role, ready, &[])
    }

    /// As [`Server::start_role`], with extra environment variables. A
    /// worker's metrics listen on a port of their own unless `env` names one
    /// (`TOOLFLEET_METRICS_LISTEN`), so workers of one machine never collide.
    pub(crate) fn start_role_env(
        config: &Path,
        role: &str,
        ready: &str,
        env: &[(&str, &str)],
    ) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_toolfleet"));
        command
            .envs(env.iter().copied())
            .arg("--config")
            .arg(config)
            .arg(role);
        Server::launch(command, config, ready)
    }

    /// Starts `command`, which runs toolfleet with `config` (through a
    /// wrapper, say), and waits for the stderr line starting with `ready`.
    /// toolfleet logs at `warn` unless `TOOLFLEET_LOG` says otherwise, and a
    /// worker's metrics listen on a port of their own unless `command` names
    /// one (a dispatcher's are served beside its API unless it names one).
    pub(crate) fn launch(mut command: Command, config: &Path, ready: &str) -> Server {
        let worker = command.get_args().any(|arg| arg == "worker");
        let mut defaults = vec![(
            "TOOLFLEET_LOG",
            std::env::var("TOOLFLEET_LOG").unwrap_or_else(|_| "warn".into()),
        )];
        if worker {
            defaults.push(("TOOLFLEET_METRICS_LISTEN", "127.0.0.1:0".to_owned()));
        }
        for (name, value) in defaults {
            if !command.get_envs().any(|(key, _)| key == name) {
                command.env(name, value);
            }
        }
        let mut child = command
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
            if let Some(rest) = line.strip_prefix(ready) {
                break rest
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned();
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
            startup: said,
        }
    }

    /// Kills the process at once, as SIGKILL does.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub(crate) fn client(&self, token: &str) -> Client {
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
pub(crate) struct Client {
    pub http: reqwest::Client,
    pub base: String,
    pub token: String,
}

impl Client {
    pub(crate) async fn raw(
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

    pub(crate) async fn get(&self, path: &str) -> Value {
        let (status, body) = self.raw(reqwest::Method::GET, path, None).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> Value {
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

    pub(crate) async fn call(&self, tool: &str, args: Value) -> Value {
        self.post("/v1/calls", json!({"tool": tool, "args": args}))
            .await
    }
}

/// Waits for a job to settle through the long-poll.
pub(crate) async fn settle(client: &Client, job_id: &str) -> Value {
    for _ in 0..60 {
        let envelope = client.get(&format!("/v1/jobs/{job_id}?wait_s=5")).await;
        if envelope["status"] != "running" {
            return envelope;
        }
    }
    panic!("job {job_id} did not settle");
}

/// Runs `f` until it answers `Some`, for at most `limit`.
pub(crate) async fn eventually<T, F, Fut>(limit: Duration, mut f: F) -> T
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

/// One request a [`hook_receiver`] got.
#[derive(Debug, Clone)]
pub(crate) struct Hook {
    /// The `Toolfleet-Signature` header.
    pub signature: String,
    /// The `Toolfleet-Delivery` header.
    pub delivery: String,
    pub body: String,
    pub at: std::time::Instant,
}

/// A webhook receiver on 127.0.0.1: records every request and answers the
/// HTTP statuses of `answers` in turn, repeating the last one.
pub(crate) async fn hook_receiver(
    answers: Vec<u16>,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<Hook>>>) {
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let seen: Arc<Mutex<Vec<Hook>>> = Arc::new(Mutex::new(Vec::new()));
    let store = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let store = store.clone();
            let answers = answers.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let n = socket.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_string();
                    let header = |name: &str| {
                        head.lines().find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.trim()
                                .eq_ignore_ascii_case(name)
                                .then(|| v.trim().to_owned())
                        })
                    };
                    let length: usize = header("content-length")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    if buf.len() < end + 4 + length {
                        continue;
                    }
                    let status = {
                        let mut seen = store.lock().unwrap();
                        seen.push(Hook {
                            signature: header("toolfleet-signature").unwrap_or_default(),
                            delivery: header("toolfleet-delivery").unwrap_or_default(),
                            body: String::from_utf8_lossy(&buf[end + 4..end + 4 + length])
                                .to_string(),
                            at: std::time::Instant::now(),
                        });
                        answers
                            .get(seen.len() - 1)
                            .or(answers.last())
                            .copied()
                            .unwrap_or(200)
                    };
                    let reply = format!(
                        "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    );
                    let _ = socket.write_all(reply.as_bytes()).await;
                    return;
                }
            });
        }
    });
    (url, seen)
}

/// Checks a `Toolfleet-Signature` against the test configuration's key.
pub(crate) fn signed(signature: &str, body: &str) -> bool {
    signed_with(WEBHOOK_SECRET, signature, body)
}

/// Checks a `Toolfleet-Signature` against `key`.
pub(crate) fn signed_with(key: &str, signature: &str, body: &str) -> bool {
    use hmac::{Hmac, KeyInit, Mac};
    let Some((t, v1)) = signature.split_once(",v1=") else {
        return false;
    };
    let Some(t) = t.strip_prefix("t=") else {
        return false;
    };
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(format!("{t}.{body}").as_bytes());
    hex::encode(mac.finalize().into_bytes()) == v1
}

pub(crate) fn shared_database_url() -> String {
    std::env::var("TOOLFLEET_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

pub(crate) fn shared_amqp_url() -> String {
    std::env::var("TOOLFLEET_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// The first value `sql` answers on the database at `url`, through `psql`.
pub(crate) fn psql_value(url: &str, sql: &str) -> String {
    let output = std::process::Command::new("psql")
        .arg(url)
        .args(["-XtAq", "-c", sql])
        .output()
        .expect("psql runs");
    assert!(
        output.status.success(),
        "psql: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// Runs `f` on a runtime of its own (for drops, which cannot await).
pub(crate) fn block_on<F: std::future::Future + Send>(f: F) -> F::Output
where
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(f)
        })
        .join()
        .unwrap()
    })
}

/// A fleet of a test's own on the shared servers: its directory, its
/// configuration (a schema and a broker prefix of its own, a shared confirm
/// secret, 1 s leases, 2 slots, then `top`, and the tools `tools` makes of
/// the directory), the cleanup that removes the schema and the prefix, and
/// its id.
pub(crate) fn shared_fleet(
    name: &str,
    top: &str,
    tools: impl FnOnce(&Path) -> String,
) -> (TempDir, PathBuf, SharedCleanup, String) {
    let dir = TempDir::new(name);
    let id = uuid::Uuid::now_v7().simple().to_string();
    let cleanup = SharedCleanup {
        database: Some((shared_database_url(), format!("tf_{id}"))),
        broker: Some((shared_amqp_url(), format!("tf-{id}"))),
    };
    // Short leases and few slots, unless `top` says otherwise.
    let defaults: String = [("lease_s", "1"), ("concurrency", "2")]
        .into_iter()
        .filter(|(key, _)| !top.lines().any(|l| l.starts_with(&format!("{key} ="))))
        .map(|(key, value)| format!("{key} = {value}\n"))
        .collect();
    let top = format!(
        "database_url = {:?}\ndatabase_schema = \"tf_{id}\"\nbroker_url = {:?}\nbroker_prefix = \"tf-{id}\"\nconfirm_secret = \"{}\"\n{defaults}{top}",
        shared_database_url(),
        shared_amqp_url(),
        "ab".repeat(32)
    );
    let config = dir.0.join("toolfleet.toml");
    let tools = tools(&dir.0);
    std::fs::write(&config, config_with(&dir.0, &top, &tools)).expect("config written");
    (dir, config, cleanup, id)
}

/// A connection of the test's own to RabbitMQ at `url`, and a channel on it.
pub(crate) async fn amqp_channel(url: &str) -> (lapin::Connection, lapin::Channel) {
    let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
        .await
        .expect("RabbitMQ answers");
    let channel = connection.create_channel().await.expect("a channel");
    (connection, channel)
}

/// The ready messages of RabbitMQ's queue `queue` at `url`, or `None` when
/// no such queue was ever declared.
pub(crate) async fn ready_in(url: &str, queue: &str) -> Option<u32> {
    let (connection, channel) = amqp_channel(url).await;
    let passive = lapin::options::QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let declared = channel
        .queue_declare(queue.into(), passive, lapin::types::FieldTable::default())
        .await;
    let _ = connection.close(200, "done".into()).await;
    declared.ok().map(|q| q.message_count())
}

/// `toolfleet migrate` with `config`, which must succeed.
pub(crate) fn migrate(config: &Path) {
    let migrated = Command::new(env!("CARGO_BIN_EXE_toolfleet"))
        .arg("--config")
        .arg(config)
        .arg("migrate")
        .output()
        .expect("toolfleet runs");
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
}

/// Removes what a test left on the shared servers, whatever its outcome:
/// its schema on PostgreSQL and its queues and exchanges on RabbitMQ.
pub(crate) struct SharedCleanup {
    pub database: Option<(String, String)>,
    pub broker: Option<(String, String)>,
}

impl Drop for SharedCleanup {
    fn drop(&mut self) {
        if let Some((url, schema)) = &self.database {
            let _ = std::process::Command::new("psql")
                .arg(url)
                .args([
                    "-q",
                    "-c",
                    &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"),
                ])
                .output();
        }
        if let Some((url, prefix)) = self.broker.clone() {
            block_on(async move {
                let options = toolfleet_broker::rabbit::RabbitOptions {
                    prefix,
                    ..Default::default()
                };
                let Ok(broker) =
                    toolfleet_broker::rabbit::RabbitBroker::connect(&url, options).await
                else {
                    return;
                };
                // close_and_delete removes what this handle declared:
                // declare the pools' queues (every pool the tests name: the
                // expense pack's jobs and its agent, and the tests' own
                // pools) and the events exchange first. A queue left behind
                // stays on the shared RabbitMQ, a quorum queue idling there.
                for pool in ["default", "agents", "crawl", "ranked", "reports", "sync"] {
                    if let Ok(consumer) = toolfleet_broker::Broker::consume(&broker, pool, 1).await
                    {
                        drop(consumer);
                    }
                }
                let notices = broker.notices();
                if let Ok(sub) = toolfleet_broker::Notices::subscribe(&notices).await {
                    drop(sub);
                }
                let _ = broker.close_and_delete().await;
                let _ = notices.close_and_delete().await;
            });
        }
    }
}

/// Collects the SSE events of one client.
pub(crate) fn events(client: &Client) -> std::sync::Arc<std::sync::Mutex<Vec<Value>>> {
    events_at(client, "/v1/events")
}

/// Collects the SSE events of one client on `path` (`/v1/events` with a
/// query, say).
pub(crate) fn events_at(
    client: &Client,
    path: &str,
) -> std::sync::Arc<std::sync::Mutex<Vec<Value>>> {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let store = seen.clone();
    let client = client.clone();
    let path = path.to_owned();
    tokio::spawn(async move {
        let mut response = client
            .http
            .get(format!("{}{path}", client.base))
            .bearer_auth(&client.token)
            .send()
            .await
            .unwrap();
        let mut text = String::new();
        while let Ok(Some(chunk)) = response.chunk().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = text.find("\n\n") {
                let block: String = text.drain(..end + 2).collect();
                if let Some(data) = block.lines().find_map(|l| l.strip_prefix("data: "))
                    && let Ok(event) = serde_json::from_str::<Value>(data)
                {
                    store.lock().unwrap().push(event);
                }
            }
        }
    });
    seen
}

/// Sends `request` as it is to the server at `address` (`host:port`) and
/// reads the answer until the server closes the connection (at most ten
/// seconds): its status and its whole text, head and body.
pub(crate) async fn raw_request(address: &str, request: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    stream.write_all(request.as_bytes()).await.expect("sent");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// `toolfleet serve` on [`config_with`] and `extra` must refuse to start,
/// saying `why` on stderr.
pub(crate) fn refused_at_start(extra: &str, why: &str) {
    let dir = TempDir::new("refused");
    let config = dir.0.join("toolfleet.toml");
    std::fs::write(&config, config_with(&dir.0, "", extra)).expect("config written");
    let out = Command::new(env!("CARGO_BIN_EXE_toolfleet"))
        .arg("--config")
        .arg(&config)
        .arg("serve")
        .env_remove("TOOLFLEET_MISSING_KEY")
        .output()
        .expect("toolfleet runs");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started with {extra}");
    assert!(said.contains(why), "expected {why:?} in: {said}");
}

/// A JSON-RPC request to `/mcp` as `client`, at protocol `version`.
pub(crate) async fn mcp(client: &Client, version: &str, method: &str, params: Value) -> Value {
    let response = client
        .http
        .post(format!("{}/mcp", client.base))
        .bearer_auth(&client.token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", version)
        .body(json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string())
        .send()
        .await
        .expect("/mcp answers");
    let text = response.text().await.expect("a body");
    // A JSON answer, or one SSE event carrying it.
    let json = text
        .lines()
        .find_map(|line| line.strip_prefix("data: "))
        .unwrap_or(&text);
    serde_json::from_str(json).unwrap_or_else(|_| panic!("{method}: not JSON: {text}"))
}

/// What a finished child process said: its status, stdout and stderr.
pub(crate) fn said(output: &std::process::Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
