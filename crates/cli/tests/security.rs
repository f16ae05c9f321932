//! Hostile probes against real processes: another user of the tenant on
//! every route and MCP method, tickets answered by the wrong user, the
//! tenant's operators by their scopes, another tenant's operator, and the
//! audit of every answer and cancel; and callbacks that try to reach what
//! the webhook allow-list does not open (another port of an allowed host,
//! a name resolving to loopback, the metadata service), at the call and at
//! delivery, with each tenant's own allow-list and key. Each probe fails if
//! its rule breaks.
//!
//! The ownership probes run twice: against `toolfleet serve` (SQLite, the
//! in-process queue) and against a dispatcher and a worker on the shared
//! PostgreSQL and RabbitMQ.

mod common;

use std::time::Duration;

use common::{
    Client, Hook, OTHER_TOKEN, Server, TOKEN, TempDir, WEBHOOK_SECRET, config_allowing,
    config_with, eventually, hook_receiver, sha, signed, signed_with,
};
use serde_json::{Value, json};

const BOB: &str = "tf_test_bob";
const NOBODY: &str = "tf_test_nobody";
const CAROL: &str = "tf_test_carol";
const READER: &str = "tf_test_reader";
const AUDITOR: &str = "tf_test_auditor";
const OPERATOR: &str = "tf_test_operator";
const GLOBEX_OPERATOR: &str = "tf_test_globex_operator";

/// The tokens and tools of the probes, beside alice (acme) and mallory
/// (globex) of `config_with`.
fn probe_tables() -> String {
    let token = |token: &str, tenant: &str, user: &str, scopes: &str| {
        format!(
            "\n[[auth.tokens]]\nsha256 = \"{}\"\ntenant = \"{tenant}\"\nuser = \"{user}\"\nscopes = [{scopes}]\n",
            sha(token)
        )
    };
    [
        // Bob holds exactly alice's scopes: only the user differs.
        token(BOB, "acme", "bob", r#""expenses:read", "expenses:submit""#),
        token(NOBODY, "acme", "nobody", ""),
        token(CAROL, "acme", "carol", r#""expenses:approve""#),
        token(READER, "acme", "reader", r#""fleet:read""#),
        token(AUDITOR, "acme", "auditor", r#""fleet:read", "expenses:read""#),
        token(OPERATOR, "acme", "operator", r#""fleet:operate""#),
        token(
            GLOBEX_OPERATOR,
            "globex",
            "globex-operator",
            r#""fleet:operate", "expenses:read", "expenses:approve""#,
        ),
        r#"
[[tools]]
name = "slow_ocr"
description = "Reads receipts slowly, as a job."
shape = "job"
input_schema = { type = "object" }
max_attempts = 1
middleware = { audit = true, require_scope = ["expenses:read"] }
executor = { kind = "exec", program = "/bin/sh", args = ["-c", "sleep 30; echo '{}'"], timeout_s = 60 }

[[tools]]
name = "approve_expense"
description = "Asks an approver whether an expense may be paid."
shape = "human"
answered_by = { scope = "expenses:approve" }
input_schema = { type = "object", properties = { question = { type = "string" } } }
"#
        .to_owned(),
    ]
    .concat()
}

/// Where the audit records of the process under test are read.
enum AuditAt {
    /// The SQLite file of a `serve`.
    Sqlite(std::path::PathBuf),
    /// A PostgreSQL schema.
    Postgres(String, String),
}

impl AuditAt {
    /// The audit records of `tool` as `user:status:error_code` lines.
    fn records(&self, tool: &str) -> Vec<String> {
        let sql = format!(
            "SELECT user || ':' || status || ':' || COALESCE(error_code, '') FROM audit WHERE tool = '{tool}' ORDER BY seq"
        );
        let text = match self {
            AuditAt::Sqlite(path) => {
                let output = std::process::Command::new("sqlite3")
                    .arg(path)
                    .arg(&sql)
                    .output()
                    .expect("sqlite3 runs");
                assert!(output.status.success(), "{output:?}");
                String::from_utf8_lossy(&output.stdout).into_owned()
            }
            AuditAt::Postgres(url, schema) => common::psql_value(
                url,
                &format!(
                    "SET search_path = {schema}; {}",
                    sql.replace("user ||", "\"user\" ||")
                ),
            ),
        };
        text.lines().map(str::to_owned).collect()
    }
}

/// The error code of an envelope.
fn code(envelope: &Value) -> &str {
    envelope["error"]["code"].as_str().unwrap_or_default()
}

/// The envelope's message with `id` written as `ID`, to compare the answer
/// about a real id with the one about a missing id.
fn message_without(envelope: &Value, id: &str) -> String {
    envelope["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .replace(id, "ID")
}

/// Every probe of ownership, against the dispatcher at `base`.
async fn ownership_probes(base: &str, audit: AuditAt) {
    let client = |token: &str| Client {
        http: toolfleet_executors::http_client().expect("client"),
        base: base.to_owned(),
        token: token.to_owned(),
    };
    let (alice, bob, nobody, carol) = (client(TOKEN), client(BOB), client(NOBODY), client(CAROL));
    let (reader, auditor, operator) = (client(READER), client(AUDITOR), client(OPERATOR));
    let stranger = client(GLOBEX_OPERATOR);
    let streams: Vec<_> = [&alice, &bob, &reader, &auditor]
        .into_iter()
        .map(common::events)
        .collect();

    // Alice's job (running for 30 s) and her two tickets.
    let started = alice.call("slow_ocr", json!({})).await;
    let job = started["job_id"].as_str().expect("a job").to_owned();
    let asked = alice
        .call(
            "ask_user",
            json!({"question": "travel or meals?", "options": ["travel", "meals"]}),
        )
        .await;
    let ticket = asked["ticket"].as_str().expect("a ticket").to_owned();
    let approval = alice
        .call("approve_expense", json!({"question": "pay exp-007?"}))
        .await;
    let approval = approval["ticket"].as_str().expect("a ticket").to_owned();
    // Bob's own job, so his stream is known to be live.
    let bobs = bob.call("slow_ocr", json!({})).await;
    let bobs = bobs["job_id"].as_str().expect("a job").to_owned();

    // Another user of the tenant, whatever its scopes, reads alice's job
    // exactly as a missing one.
    let missing_id = uuid::Uuid::now_v7().to_string();
    let missing = bob.get(&format!("/v1/jobs/{missing_id}")).await;
    assert_eq!(code(&missing), "not_found", "{missing}");
    for intruder in [&bob, &nobody, &carol, &stranger] {
        for path in [
            format!("/v1/jobs/{job}"),
            format!("/v1/jobs/{job}?wait_s=1"),
        ] {
            let read = intruder.get(&path).await;
            assert_eq!(
                code(&read),
                "not_found",
                "{path} as {}: {read}",
                intruder.token
            );
            assert_eq!(
                message_without(&read, &job),
                message_without(&missing, &missing_id)
            );
        }
        let tool = intruder
            .call("get_job", json!({"job_id": job, "wait_s": 1}))
            .await;
        assert_eq!(
            code(&tool),
            "not_found",
            "get_job as {}: {tool}",
            intruder.token
        );
        let cancel = intruder
            .post(&format!("/v1/jobs/{job}/cancel"), json!({}))
            .await;
        assert_eq!(
            code(&cancel),
            "not_found",
            "cancel as {}: {cancel}",
            intruder.token
        );
        let listed = intruder.get("/v1/jobs?limit=100").await;
        assert!(
            !listed.to_string().contains(&job),
            "{} lists alice's job: {listed}",
            intruder.token
        );
        let filtered = intruder.get("/v1/jobs?tool=slow_ocr&state=running").await;
        assert!(!filtered.to_string().contains(&job), "{filtered}");
        let read = intruder.get(&format!("/v1/tickets/{ticket}")).await;
        assert_eq!(
            code(&read),
            "not_found",
            "ticket as {}: {read}",
            intruder.token
        );
        let answered = intruder
            .post(
                &format!("/v1/tickets/{ticket}/answer"),
                json!({"answer": "travel"}),
            )
            .await;
        assert_eq!(
            code(&answered),
            "not_found",
            "answer as {}: {answered}",
            intruder.token
        );
    }
    // The cancel tool's two steps find nothing either.
    let dry = bob
        .call("cancel_job", json!({"job_id": job, "dry_run": true}))
        .await;
    assert_eq!(code(&dry), "not_found", "{dry}");
    // Nothing changed: the job runs, the ticket is open.
    let still = alice.get(&format!("/v1/jobs/{job}")).await;
    assert_eq!(
        (still["status"].as_str(), still["state"].as_str()),
        (Some("running"), Some("running")),
        "{still}"
    );
    let open = alice.get(&format!("/v1/tickets/{ticket}")).await;
    assert_eq!(open["result"]["state"], "open", "{open}");

    // MCP: tasks are jobs, by the same rules.
    // Another user's task answers exactly as a missing one, its id aside.
    let missing = toolfleet_core::new_id();
    for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
        let answer = common::mcp(&bob, "2025-11-25", method, json!({"taskId": job})).await;
        assert!(answer["error"].is_object(), "{method}: {answer}");
        assert!(
            !answer.to_string().contains("slow_ocr"),
            "{method}: {answer}"
        );
        let absent = common::mcp(&bob, "2025-11-25", method, json!({"taskId": missing})).await;
        assert_eq!(
            answer["error"].to_string().replace(&job, "ID"),
            absent["error"].to_string().replace(&missing, "ID"),
            "{method}: another user's task and a missing one differ"
        );
    }
    let tasks = common::mcp(&bob, "2025-11-25", "tasks/list", json!({})).await;
    assert!(tasks["result"].is_object(), "{tasks}");
    assert!(!tasks.to_string().contains(&job), "{tasks}");
    assert!(
        tasks.to_string().contains(&bobs),
        "bob lists his own task: {tasks}"
    );
    let alices = common::mcp(&alice, "2025-11-25", "tasks/get", json!({"taskId": job})).await;
    assert!(alices["result"].is_object(), "{alices}");
    // A retried MCP call carrying an answer to alice's ticket, as bob.
    let retry = common::mcp(
        &bob,
        "2026-07-28",
        "tools/call",
        json!({
            "name": "ask_user",
            "arguments": {"question": "travel or meals?", "options": ["travel", "meals"]},
            "inputResponses": {"answer": {"action": "accept", "content": {"answer": "travel"}}},
            "requestState": format!("ticket:{ticket}"),
        }),
    )
    .await;
    assert!(
        retry.to_string().contains("not_found") || retry["error"].is_object(),
        "{retry}"
    );
    let open = alice.get(&format!("/v1/tickets/{ticket}")).await;
    assert_eq!(open["result"]["state"], "open", "{open}");

    // Readers: every job of the tenant, but a result only with the tool's
    // scopes; no cancel, no answer.
    let read = reader.get(&format!("/v1/jobs/{job}")).await;
    assert_eq!(code(&read), "forbidden", "{read}");
    assert!(
        read["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("expenses:read")),
        "{read}"
    );
    let read = auditor.get(&format!("/v1/jobs/{job}")).await;
    assert_eq!(read["status"], "running", "{read}");
    for watcher in [&reader, &auditor] {
        let listed = watcher.get("/v1/jobs?limit=100").await;
        assert!(listed.to_string().contains(&job), "{listed}");
        assert!(listed.to_string().contains(&bobs), "{listed}");
        let seen = watcher.get(&format!("/v1/tickets/{ticket}")).await;
        assert_eq!(seen["status"], "ok", "{seen}");
        let cancel = watcher
            .post(&format!("/v1/jobs/{job}/cancel"), json!({}))
            .await;
        assert_eq!(code(&cancel), "forbidden", "{cancel}");
        let answered = watcher
            .post(
                &format!("/v1/tickets/{ticket}/answer"),
                json!({"answer": "meals"}),
            )
            .await;
        assert_eq!(code(&answered), "forbidden", "{answered}");
    }
    let still = alice.get(&format!("/v1/jobs/{job}")).await;
    assert_eq!(still["status"], "running", "{still}");

    // A ticket its tool gives to approvers: its caller reads it and cannot
    // answer; another user neither; an approver answers.
    let theirs = alice.get(&format!("/v1/tickets/{approval}")).await;
    assert_eq!(theirs["status"], "ok", "{theirs}");
    let own_answer = alice
        .post(
            &format!("/v1/tickets/{approval}/answer"),
            json!({"answer": "yes"}),
        )
        .await;
    assert_eq!(code(&own_answer), "forbidden", "{own_answer}");
    for intruder in [&bob, &nobody, &stranger] {
        let read = intruder.get(&format!("/v1/tickets/{approval}")).await;
        assert_eq!(code(&read), "not_found", "{read}");
        let answered = intruder
            .post(
                &format!("/v1/tickets/{approval}/answer"),
                json!({"answer": "yes"}),
            )
            .await;
        assert_eq!(code(&answered), "not_found", "{answered}");
    }
    let approved = carol
        .post(
            &format!("/v1/tickets/{approval}/answer"),
            json!({"answer": "yes"}),
        )
        .await;
    assert_eq!(approved["status"], "ok", "{approved}");
    assert_eq!(approved["result"]["answer"], "yes", "{approved}");

    // The operator cancels alice's job and answers her ticket.
    let cancelled = operator
        .post(&format!("/v1/jobs/{job}/cancel"), json!({}))
        .await;
    assert_eq!(code(&cancelled), "cancelled", "{cancelled}");
    let answered = operator
        .post(
            &format!("/v1/tickets/{ticket}/answer"),
            json!({"answer": "travel"}),
        )
        .await;
    assert_eq!(answered["result"]["answer"], "travel", "{answered}");
    let cancelled = bob
        .post(&format!("/v1/jobs/{bobs}/cancel"), json!({}))
        .await;
    assert_eq!(code(&cancelled), "cancelled", "{cancelled}");

    // Streams: alice and the readers hear her job settle; bob never hears
    // of it; the reader without the tool's scope gets no result in it.
    let [alice_seen, bob_seen, reader_seen, auditor_seen] = &streams[..] else {
        unreachable!("four streams");
    };
    let settled_of = |seen: &std::sync::Arc<std::sync::Mutex<Vec<Value>>>, id: &str| {
        seen.lock()
            .expect("events")
            .iter()
            .find(|e| e["id"] == id && e["state"] == "cancelled")
            .cloned()
    };
    for seen in [alice_seen, reader_seen, auditor_seen, bob_seen] {
        let id = if std::ptr::eq(seen, bob_seen) {
            &bobs
        } else {
            &job
        };
        eventually(Duration::from_secs(10), || async { settled_of(seen, id) }).await;
    }
    let heard = bob_seen.lock().expect("events").clone();
    assert!(
        heard
            .iter()
            .all(|e| e["id"] != job.as_str() && e["id"] != ticket.as_str()),
        "bob heard of alice's work: {heard:?}"
    );
    let to_reader = settled_of(reader_seen, &job).expect("the reader heard it");
    assert_eq!(
        to_reader["body"]["error"]["code"], "forbidden",
        "{to_reader}"
    );
    let to_auditor = settled_of(auditor_seen, &job).expect("the auditor heard it");
    assert_eq!(
        to_auditor["body"]["error"]["code"], "cancelled",
        "{to_auditor}"
    );

    // Every answer and cancel is audited with who made it, refusals too.
    let cancels = eventually(Duration::from_secs(10), || async {
        let records = audit.records("cancel_job");
        records
            .iter()
            .any(|r| r.starts_with("operator:ok"))
            .then_some(records)
    })
    .await;
    assert!(
        cancels.iter().any(|r| r == "bob:error:not_found"),
        "{cancels:?}"
    );
    assert!(
        cancels.iter().any(|r| r == "reader:error:forbidden"),
        "{cancels:?}"
    );
    let answers = eventually(Duration::from_secs(10), || async {
        let records = audit.records("answer_ticket");
        (records.iter().any(|r| r.starts_with("operator:ok"))
            && records.iter().any(|r| r.starts_with("carol:ok")))
        .then_some(records)
    })
    .await;
    assert!(
        answers.iter().any(|r| r == "bob:error:not_found"),
        "{answers:?}"
    );
    assert!(
        answers.iter().any(|r| r == "alice:error:forbidden"),
        "{answers:?}"
    );
}

#[tokio::test]
async fn serve_keeps_each_users_jobs_and_tickets_to_them() {
    let dir = TempDir::new("security-serve");
    let server = Server::start(&dir.0, &config_with(&dir.0, "", &probe_tables()));
    let db = dir.0.join("data").join("toolfleet.db");
    ownership_probes(&server.base, AuditAt::Sqlite(db)).await;
}

#[tokio::test]
async fn a_fleet_keeps_each_users_jobs_and_tickets_to_them() {
    let (_dir, config, _cleanup, id) =
        common::shared_fleet("security-fleet", "", |_| probe_tables());
    common::migrate(&config);
    let dispatcher = Server::start_role(&config, "dispatcher", "toolfleet serving on ");
    let _worker = Server::start_role(&config, "worker", "toolfleet worker running");
    let audit = AuditAt::Postgres(common::shared_database_url(), format!("tf_{id}"));
    ownership_probes(&dispatcher.base, audit).await;
}

// A server that holds under hostile clients.

/// A `serve` with the probes' tokens and `[limits]` as given.
fn bounded_serve(dir: &TempDir, limits: &str) -> Server {
    let tables = format!("{}\n[limits]\n{limits}\n", probe_tables());
    Server::start(&dir.0, &config_with(&dir.0, "", &tables))
}

/// The `host:port` of a server's base URL.
fn address(server: &Server) -> String {
    server.base.trim_start_matches("http://").to_owned()
}

/// Reads what `stream` is sent until it is closed, for at most `limit`:
/// `None` when it is still open then.
async fn read_until_closed(stream: &mut tokio::net::TcpStream, limit: Duration) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let read = tokio::time::timeout(limit, stream.read_to_end(&mut seen)).await;
    read.ok()
        .map(|_| String::from_utf8_lossy(&seen).into_owned())
}

#[tokio::test]
async fn half_open_connections_never_stall_the_server_and_are_closed() {
    use tokio::io::AsyncWriteExt;
    let dir = TempDir::new("security-half-open");
    let server = bounded_serve(&dir, "header_read_timeout_s = 1");
    let mut held = Vec::new();
    for n in 0..500 {
        let mut stream = tokio::net::TcpStream::connect(address(&server))
            .await
            .expect("connect");
        // Half a request line; every tenth also half a header.
        let part: &[u8] = if n % 10 == 0 {
            b"POST /v1/calls HTTP/1.1\r\nHost: x\r\nAuthor"
        } else {
            b"GET /v1/jo"
        };
        stream.write_all(part).await.expect("sent");
        held.push(stream);
    }
    // A normal call still goes through at once.
    let alice = server.client(TOKEN);
    let answer = alice
        .call("find_expenses", json!({"month": "2026-09"}))
        .await;
    assert_eq!(answer["status"], "ok", "{answer}");
    // And each half-sent request is closed by the server.
    for stream in &mut held {
        let closed = read_until_closed(stream, Duration::from_secs(30)).await;
        assert!(
            closed.is_some(),
            "a half-open connection was held past its deadline"
        );
    }
}

#[tokio::test]
async fn connections_past_the_bound_are_answered_503_and_idle_ones_closed() {
    use tokio::io::AsyncWriteExt;
    let dir = TempDir::new("security-connections");
    let server = bounded_serve(&dir, "connections = 20\nheader_read_timeout_s = 30");
    let mut held = Vec::new();
    for _ in 0..20 {
        let mut stream = tokio::net::TcpStream::connect(address(&server))
            .await
            .expect("connect");
        stream.write_all(b"GET /v1/too").await.expect("sent");
        held.push(stream);
    }
    let (status, body) = common::raw_request(
        &address(&server),
        &format!("GET /v1/tools HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("\"unavailable\""), "{body}");
    assert!(
        body.to_ascii_lowercase().contains("retry-after: 1"),
        "{body}"
    );
    // Freed slots serve again.
    drop(held);
    let alice = server.client(TOKEN);
    let answer = eventually(Duration::from_secs(10), || async {
        let (status, body) = alice.raw(reqwest::Method::GET, "/v1/tools", None).await;
        (status == 200).then_some(body)
    })
    .await;
    assert!(answer.is_array(), "{answer}");

    // A keep-alive connection idle past the head timeout is closed.
    let dir = TempDir::new("security-idle");
    let server = bounded_serve(&dir, "header_read_timeout_s = 1");
    let mut idle = tokio::net::TcpStream::connect(address(&server))
        .await
        .expect("connect");
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("sent");
    let answered = read_until_closed(&mut idle, Duration::from_secs(30))
        .await
        .expect("an idle keep-alive connection is closed");
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
}

#[tokio::test]
async fn a_body_that_trickles_in_is_refused_408() {
    use tokio::io::AsyncWriteExt;
    let dir = TempDir::new("security-slow-body");
    let server = bounded_serve(&dir, "body_read_timeout_s = 1");
    let mut slow = tokio::net::TcpStream::connect(address(&server))
        .await
        .expect("connect");
    let head = format!(
        "POST /v1/calls HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"tool\": "
    );
    slow.write_all(head.as_bytes()).await.expect("sent");
    // One byte now and then, each within any per-read timeout.
    let answer = tokio::spawn(async move {
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if slow.write_all(b" ").await.is_err() {
                break;
            }
        }
        read_until_closed(&mut slow, Duration::from_secs(30)).await
    });
    let answer = answer.await.expect("the writer").unwrap_or_default();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"timeout\""), "{answer}");
}

#[tokio::test]
async fn event_streams_and_long_polls_are_bounded_per_principal_and_process() {
    let dir = TempDir::new("security-floods");
    let server = bounded_serve(
        &dir,
        "event_streams = 5\nevent_streams_per_principal = 3\nlong_polls_per_principal = 2",
    );
    let open = |token: &'static str| {
        let client = server.client(token);
        async move {
            let response = client
                .http
                .get(format!("{}/v1/events", client.base))
                .bearer_auth(token)
                .send()
                .await
                .expect("answered");
            let status = response.status().as_u16();
            let retry = response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            (status, retry, response)
        }
    };
    let mut streams = Vec::new();
    for _ in 0..3 {
        let (status, _, response) = open(TOKEN).await;
        assert_eq!(status, 200);
        streams.push(response);
    }
    let (status, retry, refused) = open(TOKEN).await;
    assert_eq!((status, retry.as_deref()), (429, Some("1")));
    let body: Value =
        serde_json::from_str(&refused.text().await.expect("a body")).expect("an envelope");
    assert_eq!(code(&body), "rate_limited", "{body}");
    for _ in 0..2 {
        let (status, _, response) = open(BOB).await;
        assert_eq!(status, 200, "another principal has its own bound");
        streams.push(response);
    }
    let (status, retry, _) = open(CAROL).await;
    assert_eq!((status, retry.as_deref()), (503, Some("1")));
    // A stream closed gives its hold back, once the server finds it closed
    // (at its next keep-alive comment, every 15 s).
    streams.remove(0);
    eventually(Duration::from_secs(45), || async {
        let (status, _, response) = open(TOKEN).await;
        (status == 200).then_some(response)
    })
    .await;

    // Long polls: two of alice's wait on a running job; a third is refused.
    let alice = server.client(TOKEN);
    let started = alice.call("slow_ocr", json!({})).await;
    let job = started["job_id"].as_str().expect("a job").to_owned();
    let poll = |client: Client, job: String, wait_s: u32| async move {
        client
            .raw(
                reqwest::Method::GET,
                &format!("/v1/jobs/{job}?wait_s={wait_s}"),
                None,
            )
            .await
    };
    // Two long waits, each asked again if the probe below took its place.
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let (alice, job) = (alice.clone(), job.clone());
            tokio::spawn(async move {
                loop {
                    let answer = poll(alice.clone(), job.clone(), 25).await;
                    if answer.0 != 429 {
                        return answer;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        })
        .collect();
    let (status, body) = eventually(Duration::from_secs(20), || async {
        let (status, body) = poll(alice.clone(), job.clone(), 1).await;
        (status == 429).then_some((status, body))
    })
    .await;
    assert_eq!((status, code(&body)), (429, "rate_limited"), "{body}");
    let tool = alice
        .call("get_job", json!({"job_id": job, "wait_s": 5}))
        .await;
    assert_eq!(code(&tool), "rate_limited", "{tool}");
    // Another principal who may see the job still waits.
    let auditor = server.client(AUDITOR);
    let (status, body) = auditor
        .raw(
            reqwest::Method::GET,
            &format!("/v1/jobs/{job}?wait_s=1"),
            None,
        )
        .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("running")),
        "{body}"
    );
    let cancelled = alice
        .post(&format!("/v1/jobs/{job}/cancel"), json!({}))
        .await;
    assert_eq!(code(&cancelled), "cancelled");
    for wait in waiting {
        let (status, body) = wait.await.expect("a poll");
        assert_eq!((status, code(&body)), (200, "cancelled"), "{body}");
    }
    let again = alice.get(&format!("/v1/jobs/{job}?wait_s=1")).await;
    assert_eq!(
        code(&again),
        "cancelled",
        "the holds were given back: {again}"
    );
}

#[tokio::test]
async fn a_tool_name_past_the_longest_gets_no_suggestion_and_probes_share_readiness() {
    let dir = TempDir::new("security-names");
    let server = bounded_serve(&dir, "");
    let alice = server.client(TOKEN);
    let long = format!("find_expenses{}", "e".repeat(200_000));
    let answer = alice.call(&long, json!({})).await;
    assert_eq!(code(&answer), "unknown_tool", "{answer}");
    assert_eq!(answer["error"]["details"]["suggestions"], json!([]));
    assert!(
        answer.to_string().len() < 1_000,
        "the name is not echoed whole"
    );
    let near = alice.call("find_expense", json!({})).await;
    assert_eq!(near["error"]["details"]["suggestions"][0], "find_expenses");
    // A flood of readiness probes all answer.
    let probes = (0..300).map(|_| {
        let client = alice.clone();
        async move { client.raw(reqwest::Method::GET, "/readyz", None).await.0 }
    });
    let statuses = futures_util::future::join_all(probes).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
}

#[tokio::test]
async fn a_dispatcher_with_metrics_listen_serves_metrics_off_the_api_port() {
    let (_dir, config, _cleanup, _id) =
        common::shared_fleet("security-metrics", "", |_| probe_tables());
    common::migrate(&config);
    let dispatcher = Server::start_role_env(
        &config,
        "dispatcher",
        "toolfleet serving on ",
        &[("TOOLFLEET_METRICS_LISTEN", "127.0.0.1:0")],
    );
    let said = dispatcher.startup.join("\n");
    let metrics = said
        .lines()
        .find_map(|line| line.strip_prefix("toolfleet metrics on "))
        .unwrap_or_else(|| panic!("no metrics address in {said}"))
        .trim()
        .to_owned();
    let alice = dispatcher.client(TOKEN);
    let (status, _) = alice.raw(reqwest::Method::GET, "/metrics", None).await;
    assert_eq!(status, 404, "/metrics stays off the API port");
    let (status, _) = alice.raw(reqwest::Method::GET, "/readyz", None).await;
    assert_eq!(status, 200);
    let text = alice
        .http
        .get(format!("{metrics}/metrics"))
        .send()
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("text");
    assert!(text.contains("toolfleet_build_info"), "{text}");
}

// Redaction wherever a result leaves the runtime.

/// Card numbers a tool answers, which no reader may see.
const CARDS: [&str; 2] = ["4111111111111111", "5500000000000004"];

fn card_tools() -> String {
    let program = r#"echo '{\"card_number\": \"4111111111111111\", \"holder\": {\"card_number\": \"5500000000000004\", \"name\": \"Ada\"}, \"ok\": true}'"#;
    format!(
        r#"
[[tools]]
name = "card_job"
description = "Reads a card, as a job."
shape = "job"
input_schema = {{ type = "object" }}
middleware = {{ audit = true, redact = ["card_number"] }}
executor = {{ kind = "exec", program = "/bin/sh", args = ["-c", "{program}"] }}

[[tools]]
name = "card_export"
description = "Exports cards, as a handle."
shape = "handle"
handle_threshold = 16
input_schema = {{ type = "object" }}
middleware = {{ redact = ["card_number"] }}
executor = {{ kind = "exec", program = "/bin/sh", args = ["-c", "{program}"] }}
"#
    )
}

/// Fails if `what` shows a card number.
fn no_card(what: &str, seen: &str) {
    for card in CARDS {
        assert!(
            !seen.contains(card),
            "{what} shows a redacted field: {seen}"
        );
    }
    assert!(
        seen.contains("[redacted]"),
        "{what} shows no redacted field: {seen}"
    );
}

#[tokio::test]
async fn redacted_fields_stay_masked_wherever_a_result_leaves() {
    let dir = TempDir::new("security-redact");
    let server = Server::start(&dir.0, &config_with(&dir.0, "", &card_tools()));
    let alice = server.client(TOKEN);
    let events = common::events(&alice);
    let (hook, hooks) = common::hook_receiver(vec![200]).await;
    let card = json!({"card_number": CARDS[0], "holder": {"card_number": CARDS[1]}});
    let started = alice
        .post(
            "/v1/calls",
            json!({"tool": "card_job", "args": card, "callback_url": hook}),
        )
        .await;
    let job = started["job_id"].as_str().expect("a job").to_owned();
    let settled = common::settle(&alice, &job).await;
    assert_eq!(settled["status"], "ok", "{settled}");
    assert_eq!(settled["result"]["holder"]["name"], "Ada", "{settled}");
    no_card("get_job", &settled.to_string());
    let tool = alice.call("get_job", json!({"job_id": job})).await;
    no_card("the get_job tool", &tool.to_string());
    let task = common::mcp(&alice, "2025-11-25", "tasks/result", json!({"taskId": job})).await;
    assert!(task["result"].is_object(), "{task}");
    no_card("MCP tasks/result", &task.to_string());
    let event = eventually(Duration::from_secs(10), || async {
        events
            .lock()
            .expect("events")
            .iter()
            .find(|e| e["id"] == job.as_str() && e["state"] == "succeeded")
            .cloned()
    })
    .await;
    no_card("the event stream", &event.to_string());
    let hook = eventually(Duration::from_secs(20), || async {
        hooks.lock().expect("hooks").first().cloned()
    })
    .await;
    no_card("the webhook", &hook.body);
    // A handle: its inline answer (the preview) and every page read back.
    let handle = alice.call("card_export", json!({})).await;
    assert_eq!(handle["status"], "ok", "{handle}");
    no_card("a handle's preview", &handle.to_string());
    let id = handle["result"]["handle"].as_str().expect("a handle");
    let page = alice.call("read_handle", json!({"handle": id})).await;
    assert_eq!(page["status"], "ok", "{page}");
    no_card("read_handle", &page.to_string());
    // The audit record of the call keeps its arguments masked.
    let db = dir.0.join("data").join("toolfleet.db");
    let audited = std::process::Command::new("sqlite3")
        .arg(&db)
        .arg("SELECT args FROM audit WHERE tool = 'card_job'")
        .output()
        .expect("sqlite3 runs");
    assert!(audited.status.success(), "{audited:?}");
    let audited = String::from_utf8_lossy(&audited.stdout);
    assert!(!audited.trim().is_empty(), "the call was audited");
    no_card("the audit record", &audited);
}

// Webhooks.

/// A job that settles at once, for the webhook probes.
const QUICK_JOB: &str = r#"
[[tools]]
name = "quick_job"
description = "Settles at once, as a job."
shape = "job"
input_schema = { type = "object" }
executor = { kind = "builtin", name = "toolfleet.noop" }
"#;

/// The key of globex's own webhooks.
const GLOBEX_WEBHOOK_SECRET: &str = "globex-webhook-key-0123456789abcdef";

/// A call of `tool` with `args` naming `callback`, as `client`: the HTTP
/// status and the envelope.
async fn call_back(client: &Client, tool: &str, args: Value, callback: &str) -> (u16, Value) {
    let body = json!({"tool": tool, "args": args, "callback_url": callback});
    client
        .raw(
            reqwest::Method::POST,
            "/v1/calls",
            Some(body.to_string().into_bytes()),
        )
        .await
}

/// The job id of a call that was accepted.
fn accepted(answer: &(u16, Value)) -> String {
    let (status, envelope) = answer;
    assert_eq!(*status, 200, "{envelope}");
    envelope["job_id"]
        .as_str()
        .unwrap_or_else(|| panic!("a job: {envelope}"))
        .to_owned()
}

/// Asserts a call was refused as a bad request whose message says each of
/// `says`.
fn refused(answer: &(u16, Value), says: &[&str]) {
    let (status, envelope) = answer;
    assert_eq!(
        (*status, code(envelope)),
        (400, "bad_request"),
        "{envelope}"
    );
    let message = envelope["error"]["message"].as_str().unwrap_or_default();
    for said in says {
        assert!(message.contains(said), "`{said}` not in: {message}");
    }
}

/// The port of a [`hook_receiver`]'s URL.
fn port_of(url: &str) -> u16 {
    url.trim_end_matches("/hook")
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or_else(|| panic!("no port in {url}"))
}

/// The first `n` requests a receiver got, once it has them.
async fn heard(hooks: &std::sync::Arc<std::sync::Mutex<Vec<Hook>>>, n: usize) -> Vec<Hook> {
    eventually(Duration::from_secs(15), || async {
        let hooks = hooks.lock().expect("hooks");
        (hooks.len() >= n).then(|| hooks[..n].to_vec())
    })
    .await
}

/// The body of a hook, as JSON.
fn notice(hook: &Hook) -> Value {
    serde_json::from_str(&hook.body).unwrap_or_else(|_| panic!("not JSON: {}", hook.body))
}

/// An entry naming a host and port opens that port only; an entry naming
/// a host name never opens the loopback address it resolves to; the
/// metadata service is closed in every form its address takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_reaches_only_the_port_its_entry_names() {
    let (hook, hooks) = hook_receiver(vec![200]).await;
    let port = port_of(&hook);
    let other = if port == u16::MAX { port - 1 } else { port + 1 };
    let dir = TempDir::new("security-hook-ports");
    let allow = format!(r#"["127.0.0.1:{port}", "localhost:*", "hooks.example.com"]"#);
    let server = Server::start(&dir.0, &config_allowing(&dir.0, "", &allow, QUICK_JOB));
    let alice = server.client(TOKEN);

    let job = accepted(&call_back(&alice, "quick_job", json!({}), &hook).await);
    let delivered = heard(&hooks, 1).await;
    assert_eq!(notice(&delivered[0])["job_id"], job.as_str());

    // Another port of the allowed host: refused at the call, saying which
    // entry and how to open the port.
    let elsewhere = format!("http://127.0.0.1:{other}/hook");
    let answer = call_back(&alice, "quick_job", json!({}), &elsewhere).await;
    refused(
        &answer,
        &[
            &format!("port {port} only"),
            &format!("`127.0.0.1:{other}`"),
        ],
    );
    let answer = call_back(
        &alice,
        "find_expenses",
        json!({}),
        "http://hooks.example.com:8080/x",
    )
    .await;
    refused(
        &answer,
        &["ports 80 and 443 only", "`hooks.example.com:8080`"],
    );
    // A name the list opens by name alone, resolving to loopback (on a
    // port no address entry opens).
    let by_name = format!("http://localhost:{other}/hook");
    let answer = call_back(&alice, "quick_job", json!({}), &by_name).await;
    refused(
        &answer,
        &["`localhost`", "loopback", "needs an entry naming it"],
    );
    // The metadata service, however its address is written.
    for metadata in [
        "http://169.254.169.254/latest/meta-data/",
        "http://169.254.169.254:80/latest/api/token",
        "http://[::ffff:169.254.169.254]/",
        "http://2852039166/",
        "http://0xa9.0xfe.0xa9.0xfe/",
        "http://[fd00:ec2::254]/",
    ] {
        let answer = call_back(&alice, "quick_job", json!({}), metadata).await;
        refused(&answer, &["allow-list"]);
    }
    assert_eq!(
        hooks.lock().expect("hooks").len(),
        1,
        "only the allowed call"
    );
}

/// `127.0.0.1:*` opens every port; a name resolving to loopback is reached
/// once an entry names 127.0.0.1 or a network holding it, and the
/// delivery goes there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_opens_where_an_entry_names_its_address_or_network() {
    let dir = TempDir::new("security-hook-any-port");
    let server = Server::start(
        &dir.0,
        &config_allowing(&dir.0, "", r#"["127.0.0.1:*"]"#, QUICK_JOB),
    );
    let alice = server.client(TOKEN);
    for port in [1, 8080, 65535] {
        let url = format!("http://127.0.0.1:{port}/hook");
        let (status, envelope) =
            call_back(&alice, "find_expenses", json!({"month": "2026-09"}), &url).await;
        assert_eq!(
            (status, envelope["status"].as_str()),
            (200, Some("ok")),
            "{url}: {envelope}"
        );
    }
    drop(server);

    for opening in ["127.0.0.1:*", "127.0.0.0/8:*"] {
        let (hook, hooks) = hook_receiver(vec![200]).await;
        let dir = TempDir::new("security-hook-loopback");
        let allow = format!(r#"["localhost:*", "{opening}"]"#);
        let server = Server::start(&dir.0, &config_allowing(&dir.0, "", &allow, QUICK_JOB));
        let alice = server.client(TOKEN);
        let by_name = format!("http://localhost:{}/hook", port_of(&hook));
        let job = accepted(&call_back(&alice, "quick_job", json!({}), &by_name).await);
        let delivered = heard(&hooks, 1).await;
        assert_eq!(notice(&delivered[0])["job_id"], job.as_str(), "{opening}");
    }
}

/// A callback accepted under one allow-list is checked again at delivery:
/// a dispatcher whose list no longer opens the address the name resolves
/// to sends nothing, and counts the notice refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_is_checked_again_at_delivery() {
    let (hook, hooks) = hook_receiver(vec![200]).await;
    let by_name = format!("http://localhost:{}/hook", port_of(&hook));
    let dir = TempDir::new("security-hook-delivery");
    let opened = config_allowing(&dir.0, "", r#"["localhost:*", "127.0.0.0/8:*"]"#, "");
    let mut first = Server::start(&dir.0, &opened);
    let alice = first.client(TOKEN);
    let asked = call_back(
        &alice,
        "ask_user",
        json!({"question": "travel or meals?", "options": ["travel", "meals"]}),
        &by_name,
    )
    .await;
    assert_eq!(asked.0, 200, "{}", asked.1);
    let ticket = asked.1["ticket"].as_str().expect("a ticket").to_owned();
    first.kill();

    // The same data, served with the name alone allowed.
    let closed = config_allowing(&dir.0, "", r#"["localhost:*"]"#, "");
    let second = Server::start(&dir.0, &closed);
    let alice = second.client(TOKEN);
    let answer = call_back(&alice, "ask_user", json!({"question": "again?"}), &by_name).await;
    refused(&answer, &["loopback"]);
    let answered = alice
        .post(
            &format!("/v1/tickets/{ticket}/answer"),
            json!({"answer": "travel"}),
        )
        .await;
    assert_eq!(answered["status"], "ok", "{answered}");
    let series = r#"toolfleet_webhook_deliveries_total{outcome="refused"} "#;
    let metrics = eventually(Duration::from_secs(15), || async {
        let text = alice
            .http
            .get(format!("{}/metrics", alice.base))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .any(|line| line == format!("{series}1"))
            .then_some(text)
    })
    .await;
    assert!(
        metrics.contains(r#"toolfleet_webhook_abandoned_total 1"#),
        "given up at once: {metrics}"
    );
    // Refused before any connection, and never tried again.
    assert!(
        hooks.lock().expect("hooks").is_empty(),
        "a refused notice was sent"
    );
}

/// A tenant with webhook settings of its own: its calls are checked
/// against its allow-list and its notices signed with its key; every other
/// tenant's with the global ones. Each notice names its tenant and carries
/// a `Toolfleet-Delivery` that stays the same on its retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenant_has_its_allow_list_and_key_and_each_notice_its_delivery() {
    let (acme_hook, acme_hooks) = hook_receiver(vec![200]).await;
    let (globex_hook, globex_hooks) = hook_receiver(vec![500, 200]).await;
    let dir = TempDir::new("security-hook-tenants");
    let tables = format!(
        "\n[tenants.globex.webhooks]\nallow = [\"localhost:*\", \"127.0.0.1:*\"]\nsecret = \"{GLOBEX_WEBHOOK_SECRET}\"\n{QUICK_JOB}"
    );
    let server = Server::start(
        &dir.0,
        &config_allowing(&dir.0, "", r#"["127.0.0.1:*"]"#, &tables),
    );
    let alice = server.client(TOKEN);
    let mallory = server.client(OTHER_TOKEN);

    // Only globex's list names localhost.
    let acme_by_name = format!("http://localhost:{}/hook", port_of(&acme_hook));
    let answer = call_back(&alice, "quick_job", json!({}), &acme_by_name).await;
    refused(&answer, &["`localhost`", "allow-list"]);
    let globex_by_name = format!("http://localhost:{}/hook", port_of(&globex_hook));
    let globex_job = accepted(&call_back(&mallory, "quick_job", json!({}), &globex_by_name).await);
    let acme_job = accepted(&call_back(&alice, "quick_job", json!({}), &acme_hook).await);

    // globex's notice, refused once and retried: its key, its tenant, one
    // delivery id.
    let tries = heard(&globex_hooks, 2).await;
    for hook in &tries {
        assert!(
            signed_with(GLOBEX_WEBHOOK_SECRET, &hook.signature, &hook.body),
            "{hook:?}"
        );
        assert!(
            !signed(&hook.signature, &hook.body),
            "globex's with the global key: {hook:?}"
        );
        let body = notice(hook);
        assert_eq!(
            (&body["tenant"], &body["job_id"]),
            (&json!("globex"), &json!(globex_job))
        );
    }
    assert!(!tries[0].delivery.is_empty(), "{:?}", tries[0]);
    assert_eq!(
        tries[0].delivery, tries[1].delivery,
        "the retry is the same delivery"
    );

    // acme's: the global key.
    let acme = heard(&acme_hooks, 1).await;
    assert!(
        signed_with(WEBHOOK_SECRET, &acme[0].signature, &acme[0].body),
        "{:?}",
        acme[0]
    );
    assert!(!signed_with(
        GLOBEX_WEBHOOK_SECRET,
        &acme[0].signature,
        &acme[0].body
    ));
    let body = notice(&acme[0]);
    assert_eq!(
        (&body["tenant"], &body["job_id"]),
        (&json!("acme"), &json!(acme_job))
    );
    assert!(!acme[0].delivery.is_empty() && acme[0].delivery != tries[0].delivery);
}
