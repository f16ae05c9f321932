//! Logs and traces of a job's life, with real processes.
//!
//! A call made with a known `traceparent` through a `toolfleet dispatcher`
//! and run by a separate `toolfleet worker` (PostgreSQL and RabbitMQ of this
//! machine, a schema and a prefix of the test's own), both logging JSON
//! lines: every line either logs for the job carries its tool, job id, run
//! id, tenant and attempt and the caller's trace id, and the worker's span
//! is a child of the dispatcher's. And a `toolfleet serve` with an
//! `otlp_endpoint` exports the spans of that trace to a receiver in this
//! test, flushed when it stops.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    Client, SharedCleanup, TOKEN, TempDir, config_with, eventually, migrate, settle, shared_fleet,
};
use serde_json::{Value, json};

/// The caller's trace: what the test sends as `traceparent`.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{CALLER_SPAN}-01")
}

/// A job tool that answers at once.
const TOOLS: &str = r#"
[[tools]]
name = "traced_job"
shape = "job"
input_schema = { type = "object" }
executor = { kind = "exec", program = "/bin/sh", args = ["-c", "echo '{\"done\": true}'"] }
"#;

/// A `toolfleet` process whose stderr lines are kept.
struct Process {
    child: Child,
    /// Everything it wrote on stderr, one entry a line.
    lines: Arc<Mutex<Vec<String>>>,
    /// What its ready line named (the address it serves on).
    ready: String,
}

impl Process {
    fn start(config: &Path, role: &str, ready: &str, env: &[(&str, &str)]) -> Process {
        let mut child = Command::new(env!("CARGO_BIN_EXE_toolfleet"))
            .env("TOOLFLEET_METRICS_LISTEN", "127.0.0.1:0")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_SERVICE_NAME")
            .envs(env.iter().copied())
            .arg("--config")
            .arg(config)
            .arg(role)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("toolfleet starts");
        let stderr = child.stderr.take().expect("stderr");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let seen = lines.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<String>();
        let ready_prefix = ready.to_owned();
        let echo = std::env::var_os("TOOLFLEET_TEST_ECHO").is_some();
        let name = role.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if echo {
                    eprintln!("[{name}] {line}");
                }
                if let Some(rest) = line.strip_prefix(&ready_prefix) {
                    let _ = ready_tx.send(rest.split_whitespace().next().unwrap_or("").to_owned());
                }
                seen.lock().unwrap().push(line);
            }
        });
        let ready = match ready_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(ready) => ready,
            Err(_) => panic!(
                "toolfleet {role} did not get ready: {}",
                lines.lock().unwrap().join("\n")
            ),
        };
        Process {
            child,
            lines,
            ready,
        }
    }

    /// Its stderr lines that are JSON objects.
    fn json_lines(&self) -> Vec<Value> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(Value::is_object)
            .collect()
    }

    /// Its JSON lines logged for job `id`.
    fn job_lines(&self, id: &str) -> Vec<Value> {
        self.json_lines()
            .into_iter()
            .filter(|line| line["job_id"] == id)
            .collect()
    }

    /// Its JSON lines logged for job `id`, once they include `job settled`
    /// (waiting up to 15 s for it).
    async fn settled_lines(&self, id: &str) -> Vec<Value> {
        eventually(Duration::from_secs(15), || {
            let lines = self.job_lines(id);
            async move {
                lines
                    .iter()
                    .any(|line| line["message"] == "job settled")
                    .then_some(lines)
            }
        })
        .await
    }

    /// Stops it as an orchestrator does (SIGTERM) and waits for it.
    fn stop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("toolfleet did not stop within 30 s of SIGTERM");
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client(base: &str) -> Client {
    Client {
        http: toolfleet_executors::http_client().expect("client"),
        base: base.to_owned(),
        token: TOKEN.to_owned(),
    }
}

/// Calls `traced_job` with `headers`; the answer's body and `traceparent`.
async fn call(client: &Client, headers: &[(&str, &str)], run_id: &str) -> (Value, String) {
    let mut request = client
        .http
        .post(format!("{}/v1/calls", client.base))
        .bearer_auth(&client.token)
        .header("content-type", "application/json")
        .body(json!({"tool": "traced_job", "args": {}, "run_id": run_id}).to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("the dispatcher answers");
    assert_eq!(response.status(), 200);
    let traceparent = response
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .expect("the answer names its traceparent")
        .to_owned();
    let body = response.text().await.expect("a body");
    (
        serde_json::from_str(&body).expect("a JSON body"),
        traceparent,
    )
}

/// The trace id and span id of a `traceparent`.
fn ids(traceparent: &str) -> (String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    (parts[1].to_owned(), parts[2].to_owned())
}

/// Asserts that `line` carries the job's fields and the caller's trace.
fn carries_the_job(line: &Value, job: &str, run_id: &str, attempt: u64) {
    assert_eq!(line["job_id"], job, "{line}");
    assert_eq!(line["tool"], "traced_job", "{line}");
    assert_eq!(line["run_id"], run_id, "{line}");
    assert_eq!(line["tenant"], "acme", "{line}");
    assert_eq!(line["attempt"], attempt, "{line}");
    assert_eq!(line["trace_id"], TRACE_ID, "{line}");
    for id in ["span_id", "parent_span_id"] {
        let hex = line[id].as_str().unwrap_or_default();
        assert!(
            hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
            "{id} of {line}"
        );
    }
}

fn with_message<'a>(lines: &'a [Value], message: &str) -> &'a Value {
    lines
        .iter()
        .find(|line| line["message"] == message)
        .unwrap_or_else(|| panic!("no line says {message:?} among {lines:#?}"))
}

/// A fleet of the test's own on the shared servers: its directory, its
/// migrated configuration, its cleanup and its id.
fn fleet(name: &str) -> (TempDir, PathBuf, SharedCleanup, String) {
    let fleet = shared_fleet(name, "", |_| TOOLS.to_owned());
    migrate(&fleet.1);
    fleet
}

/// JSON lines from `info` up.
const JSON_LOGS: [(&str, &str); 2] = [("TOOLFLEET_LOG_FORMAT", "json"), ("TOOLFLEET_LOG", "info")];

/// A dispatcher that logs nothing finer than `warn` (the default) makes no
/// span for a job it enqueues, yet the job carries the context that span
/// would have had: the worker's attempt continues the caller's trace, as
/// the child of a span of the job's own, which is neither the call's nor
/// the caller's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_continues_the_calls_trace_where_the_dispatcher_logs_only_warnings() {
    let (_dir, config, _cleanup, id) = fleet("tracing-quiet");
    let quiet = [("TOOLFLEET_LOG_FORMAT", "json"), ("TOOLFLEET_LOG", "warn")];
    let dispatcher = Process::start(&config, "dispatcher", "toolfleet serving on ", &quiet);
    let worker = Process::start(&config, "worker", "toolfleet worker running", &JSON_LOGS);
    let alice = client(&dispatcher.ready);
    let run_id = format!("run-{id}");
    let parent = traceparent();
    let (accepted, answered) = call(&alice, &[("traceparent", parent.as_str())], &run_id).await;
    assert_eq!(accepted["status"], "running", "{accepted}");
    let job = accepted["job_id"].as_str().expect("a job id").to_owned();
    let (answered_trace, call_span) = ids(&answered);
    assert_eq!(answered_trace, TRACE_ID);
    let done = settle(&alice, &job).await;
    assert_eq!(done["result"]["done"], true, "{done}");
    let settled = worker.settled_lines(&job).await;
    let started = with_message(&settled, "job started");
    carries_the_job(started, &job, &run_id, 1);
    let enqueuing = started["parent_span_id"].as_str().expect("a parent span");
    assert_ne!(enqueuing, call_span, "{started}");
    assert_ne!(enqueuing, CALLER_SPAN, "{started}");
    assert!(dispatcher.job_lines(&job).is_empty(), "nothing logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_trace_runs_from_the_dispatcher_through_the_queue_to_the_worker() {
    let (_dir, config, _cleanup, id) = fleet("tracing");
    let json = JSON_LOGS;
    let dispatcher = Process::start(&config, "dispatcher", "toolfleet serving on ", &json);
    let worker = Process::start(&config, "worker", "toolfleet worker running", &json);
    let alice = client(&dispatcher.ready);

    let run_id = format!("run-{id}");
    let parent = traceparent();
    let (accepted, answered) = call(
        &alice,
        &[
            ("traceparent", parent.as_str()),
            ("tracestate", "congo=t61rcWkgMzE"),
        ],
        &run_id,
    )
    .await;
    assert_eq!(accepted["status"], "running", "{accepted}");
    let job = accepted["job_id"].as_str().expect("a job id").to_owned();
    let (answered_trace, call_span) = ids(&answered);
    assert_eq!(
        answered_trace, TRACE_ID,
        "the call continues the caller's trace"
    );
    assert_ne!(call_span, CALLER_SPAN, "under a span of its own");
    let done = settle(&alice, &job).await;
    assert_eq!(done["result"]["done"], true, "{done}");
    let settled = worker.settled_lines(&job).await;

    // The dispatcher: the enqueuing span, a child of the call's.
    let enqueued = dispatcher.job_lines(&job);
    let line = with_message(&enqueued, "job enqueued");
    for line in &enqueued {
        carries_the_job(line, &job, &run_id, 0);
    }
    assert_eq!(line["level"], "INFO", "{line}");
    assert_eq!(line["parent_span_id"], call_span.as_str(), "{line}");
    let enqueuing_span = line["span_id"].as_str().unwrap().to_owned();
    assert_ne!(enqueuing_span, call_span);

    // The worker: every line of the attempt, the span a child of the
    // dispatcher's enqueuing span.
    for message in ["job started", "job settled"] {
        let line = with_message(&settled, message);
        assert_eq!(line["level"], "INFO", "{line}");
        assert_eq!(line["parent_span_id"], enqueuing_span.as_str(), "{line}");
    }
    let worker_span = with_message(&settled, "job started")["span_id"].clone();
    assert_ne!(worker_span, enqueuing_span.as_str());
    assert_eq!(with_message(&settled, "job settled")["state"], "succeeded");
    for line in &settled {
        carries_the_job(line, &job, &run_id, 1);
        assert_eq!(
            line["span_id"], worker_span,
            "one span for the attempt: {line}"
        );
    }

    // A job called over MCP continues the caller's trace too: with a
    // plain tools/call (rmcp answers it) and with a 2025-11-25 task.
    for (version, task) in [("2025-06-18", None), ("2025-11-25", Some(json!({})))] {
        let mut params = json!({"name": "traced_job", "arguments": {}});
        if let Some(task) = task {
            params["task"] = task;
        }
        let response = alice
            .http
            .post(format!("{}/mcp", alice.base))
            .bearer_auth(&alice.token)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", version)
            .header("traceparent", parent.as_str())
            .body(
                json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
                    .to_string(),
            )
            .send()
            .await
            .expect("/mcp answers");
        assert_eq!(response.status(), 200, "{version}");
        let answer: Value =
            serde_json::from_str(&response.text().await.expect("a body")).expect("a JSON answer");
        let result = &answer["result"];
        let job = result["structuredContent"]["job_id"]
            .as_str()
            .or_else(|| result["task"]["taskId"].as_str())
            .unwrap_or_else(|| panic!("{version}: no job in {answer}"))
            .to_owned();
        let lines = worker.settled_lines(&job).await;
        assert!(
            lines.iter().all(|line| line["trace_id"] == TRACE_ID),
            "{version}: {lines:?}"
        );
        let enqueued = dispatcher.job_lines(&job);
        let line = with_message(&enqueued, "job enqueued");
        assert_eq!(line["trace_id"], TRACE_ID, "{version}: {line}");
        assert_eq!(line["parent_span_id"], CALLER_SPAN, "{version}: {line}");
    }

    // A bad traceparent is no error: the call starts a trace of its own.
    for bad in [
        parent.to_uppercase(),
        parent.replacen("00-", "01-", 1),
        format!("00-{}-{CALLER_SPAN}-01", "0".repeat(32)),
        "garbage".to_owned(),
    ] {
        let (accepted, answered) = call(
            &alice,
            &[("traceparent", bad.as_str())],
            &format!("{run_id}-bad"),
        )
        .await;
        assert_eq!(accepted["status"], "running", "{accepted}");
        let (trace, _) = ids(&answered);
        assert_ne!(trace, TRACE_ID, "{bad}");
        assert_ne!(trace, "0".repeat(32), "{bad}");
        let job = accepted["job_id"].as_str().unwrap().to_owned();
        let done = settle(&alice, &job).await;
        assert_eq!(done["status"], "ok", "{done}");
        let lines = worker.settled_lines(&job).await;
        assert!(lines.iter().all(|line| line["trace_id"] == trace.as_str()));
    }
}

/// A job whose message was never published (its dispatcher died after
/// writing it) is published by another dispatcher's sweeper from the store,
/// and still runs in the caller's trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swept_job_keeps_its_trace() {
    let (_dir, config, _cleanup, _) = fleet("tracing-outbox");
    let faulty_env = [
        ("TOOLFLEET_FAULT", "abort_after_job_write"),
        JSON_LOGS[0],
        JSON_LOGS[1],
    ];
    let faulty = Process::start(&config, "dispatcher", "toolfleet serving on ", &faulty_env);
    let _healthy = Process::start(&config, "dispatcher", "toolfleet serving on ", &JSON_LOGS);
    let worker = Process::start(&config, "worker", "toolfleet worker running", &JSON_LOGS);
    let alice = client(&faulty.ready);
    let parent = traceparent();
    let answered = alice
        .http
        .post(format!("{}/v1/calls", alice.base))
        .bearer_auth(TOKEN)
        .header("traceparent", parent.as_str())
        .body(json!({"tool": "traced_job", "args": {}, "run_id": "run-swept"}).to_string())
        .send()
        .await;
    assert!(
        answered.is_err(),
        "the faulty dispatcher died before answering"
    );
    let settled = eventually(Duration::from_secs(30), || {
        let lines = worker.json_lines();
        async move {
            lines
                .into_iter()
                .find(|line| line["message"] == "job settled" && line["run_id"] == "run-swept")
        }
    })
    .await;
    let job = settled["job_id"].as_str().expect("a job id").to_owned();
    carries_the_job(&settled, &job, "run-swept", 1);
    let started = with_message(&worker.job_lines(&job), "job started").clone();
    assert_eq!(started["parent_span_id"], settled["parent_span_id"]);
    assert_ne!(
        settled["parent_span_id"], CALLER_SPAN,
        "a child of the dispatcher's span, not of the caller's"
    );
}

/// An OTLP/HTTP receiver on 127.0.0.1: keeps the body of every request to
/// `/v1/traces` and answers 200 with an empty export response.
async fn otlp_receiver() -> (String, Arc<Mutex<Vec<Vec<u8>>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let kept = bodies.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    // One request after another on a kept-alive connection.
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_string();
                    let length: usize = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.trim()
                                .eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse().ok())?
                        })
                        .unwrap_or(0);
                    while buf.len() < end + 4 + length {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body = buf[end + 4..end + 4 + length].to_vec();
                    buf.drain(..end + 4 + length);
                    if head.starts_with("POST /v1/traces ") {
                        kept.lock().unwrap().push(body);
                    }
                    let reply = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if socket.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, bodies)
}

/// One exported span: its service, name, ids and attributes.
#[derive(Debug, Clone)]
struct Exported {
    service: String,
    name: String,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent_span_id: Vec<u8>,
    attributes: std::collections::BTreeMap<String, String>,
}

fn exported(bodies: &[Vec<u8>]) -> Vec<Exported> {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use prost::Message;
    let text = |value: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>| match value
        .as_ref()
        .and_then(|v| v.value.as_ref())
    {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::IntValue(n)) => n.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    };
    let mut spans = Vec::new();
    for body in bodies {
        let request = ExportTraceServiceRequest::decode(body.as_slice())
            .expect("the exporter posts OTLP protobuf");
        for resource in request.resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .map(|a| text(&a.value))
                .unwrap_or_default();
            for scope in resource.scope_spans {
                for span in scope.spans {
                    spans.push(Exported {
                        service: service.clone(),
                        name: span.name.clone(),
                        trace_id: span.trace_id.clone(),
                        span_id: span.span_id.clone(),
                        parent_span_id: span.parent_span_id.clone(),
                        attributes: span
                            .attributes
                            .iter()
                            .map(|a| (a.key.clone(), text(&a.value)))
                            .collect(),
                    });
                }
            }
        }
    }
    spans
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_go_to_the_otlp_endpoint_and_are_flushed_on_shutdown() {
    let (endpoint, bodies) = otlp_receiver().await;
    let dir = TempDir::new("otlp");
    let config: PathBuf = dir.0.join("toolfleet.toml");
    let top = format!("otlp_endpoint = {endpoint:?}\nlog_format = \"json\"\n");
    std::fs::write(&config, config_with(&dir.0, &top, TOOLS)).unwrap();
    let mut serve = Process::start(
        &config,
        "serve",
        "toolfleet serving on ",
        &[("TOOLFLEET_LOG", "info")],
    );
    let alice = client(&serve.ready);
    let run_id = format!("run-{}", uuid::Uuid::now_v7().simple());
    let parent = traceparent();
    let (accepted, answered) = call(&alice, &[("traceparent", parent.as_str())], &run_id).await;
    let job = accepted["job_id"].as_str().expect("a job id").to_owned();
    let done = settle(&alice, &job).await;
    assert_eq!(done["status"], "ok", "{done}");
    let (_, call_span) = ids(&answered);
    // Batches leave every 5 s; stopping at once leaves the last one to the
    // flush on shutdown.
    serve.stop();

    let spans = exported(&bodies.lock().unwrap());
    let trace = hex_bytes(TRACE_ID);
    let ours: Vec<&Exported> = spans.iter().filter(|s| s.trace_id == trace).collect();
    let call = ours
        .iter()
        .find(|s| s.name == "call")
        .unwrap_or_else(|| panic!("no call span among {spans:#?}"));
    assert_eq!(call.service, "toolfleet");
    assert_eq!(call.span_id, hex_bytes(&call_span), "the answer names it");
    assert_eq!(call.parent_span_id, hex_bytes(CALLER_SPAN));
    let jobs: Vec<&&Exported> = ours
        .iter()
        .filter(|s| s.name == "job" && s.attributes.get("job_id") == Some(&job))
        .collect();
    let enqueued = jobs
        .iter()
        .find(|s| s.parent_span_id == call.span_id)
        .unwrap_or_else(|| panic!("no enqueuing span under the call among {jobs:#?}"));
    let ran = jobs
        .iter()
        .find(|s| s.parent_span_id == enqueued.span_id)
        .unwrap_or_else(|| panic!("no worker span under the enqueuing one among {jobs:#?}"));
    for span in [enqueued, ran] {
        assert_eq!(
            span.attributes.get("tool").map(String::as_str),
            Some("traced_job")
        );
        assert_eq!(
            span.attributes.get("tenant").map(String::as_str),
            Some("acme")
        );
        assert_eq!(span.attributes.get("run_id"), Some(&run_id));
    }
    assert_eq!(ran.attributes.get("attempt").map(String::as_str), Some("1"));

    // The JSON lines name the same spans as the exported ones.
    let lines = serve.job_lines(&job);
    let started = with_message(&lines, "job started");
    assert_eq!(started["span_id"], hex(&ran.span_id), "{started}");
    assert_eq!(
        started["parent_span_id"],
        hex(&enqueued.span_id),
        "{started}"
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
