//! A job tool declared `asks_client` that asks its caller's MCP client while
//! it runs (the tasks extension's `input_required`, MCP 2026-07-28), end to
//! end through `toolfleet serve`: the task shows what the tool asks,
//! `tasks/update` answers it key by key (its owner alone, within bounds),
//! the job runs again with every answer and its state, and completes; a
//! cancel still ends a task that waits; the ticket it waits on is listed in
//! the inbox and not answered there.

mod common;

use std::time::Duration;

use common::{OTHER_TOKEN, Server, TOKEN, TempDir, config, eventually, sha};
use serde_json::{Value, json};

const BOB: &str = "tf_test_bob";

/// A job tool asking two things at once under a state, then answering
/// everything it was given; bob, a second user of alice's tenant.
fn extra() -> String {
    r#"
[[auth.tokens]]
sha256 = "BOB_SHA"
tenant = "acme"
user = "bob"
scopes = ["expenses:read"]

[[tools]]
name = "ask_twice"
shape = "job"
description = "Asks two things, then answers what it got."
asks_client = true
input_schema = { type = "object", additionalProperties = false, properties = { input_responses = { type = "object" }, request_state = {}, client_capabilities = { type = "object" } } }
poll_after_s = 1
max_attempts = 1
executor = { kind = "exec", program = "sh", args = ["-c", '''
in=$(cat)
case "$in" in
*'"input_responses":{"a":{'*) printf '{"got": %s}' "$in" ;;
*) echo '{"input_requests": {"a": {"method": "elicitation/create", "params": {"message": "A?", "requestedSchema": {"type": "object", "properties": {}}}}, "b": {"method": "elicitation/create", "params": {"message": "B?", "requestedSchema": {"type": "object", "properties": {}}}}}, "request_state": {"kept": "server-side"}}' ;;
esac
'''] }
"#
    .replace("BOB_SHA", &sha(BOB))
}

/// A 2026-07-28 request to `/mcp` as the holder of `token`, declaring
/// elicitation and the tasks extension: the JSON-RPC answer.
async fn rpc(server: &Server, token: &str, method: &str, mut params: Value) -> Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {
            "elicitation": {},
            "extensions": {"io.modelcontextprotocol/tasks": {}}
        }
    });
    let name = params
        .get("taskId")
        .or_else(|| params.get("name"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let client = server.client(token);
    let mut request = client
        .http
        .post(format!("{}/mcp", client.base))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(name) = name {
        request = request.header("mcp-name", name);
    }
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let text = request
        .body(body.to_string())
        .send()
        .await
        .expect("/mcp answers")
        .text()
        .await
        .expect("a body");
    let json = text
        .lines()
        .find_map(|line| line.strip_prefix("data: "))
        .unwrap_or(&text);
    serde_json::from_str(json).unwrap_or_else(|_| panic!("{method}: not JSON: {text}"))
}

/// The task `id` as `tasks/get` answers it to `token`.
async fn task(server: &Server, token: &str, id: &str) -> Value {
    rpc(server, token, "tasks/get", json!({"taskId": id})).await
}

/// Waits for task `id` to reach `status`.
async fn until(server: &Server, id: &str, status: &str) -> Value {
    eventually(Duration::from_secs(30), || async {
        let got = task(server, TOKEN, id).await;
        (got["result"]["status"] == status).then_some(got["result"].clone())
    })
    .await
}

async fn update(server: &Server, token: &str, id: &str, responses: Value) -> Value {
    let params = json!({"taskId": id, "inputResponses": responses});
    rpc(server, token, "tasks/update", params).await
}

fn pending(task: &Value) -> Vec<String> {
    let mut keys: Vec<String> = task["inputRequests"]
        .as_object()
        .map(|r| r.keys().cloned().collect())
        .unwrap_or_default();
    keys.sort();
    keys
}

async fn start(server: &Server) -> String {
    let called = rpc(
        server,
        TOKEN,
        "tools/call",
        json!({"name": "ask_twice", "arguments": {}}),
    )
    .await;
    called["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {called}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_asks_its_client_and_resumes_with_the_answers() {
    let dir = TempDir::new("mcp-task-input");
    let server = Server::start(&dir.0, &config(&dir.0, &extra()));
    let id = start(&server).await;

    let waiting = until(&server, &id, "input_required").await;
    assert_eq!(pending(&waiting), ["a", "b"], "{waiting}");
    assert_eq!(
        waiting["inputRequests"]["a"]["method"],
        "elicitation/create"
    );
    // The state the tool handed on stays on the server.
    assert!(!waiting.to_string().contains("server-side"), "{waiting}");

    // Another tenant's caller, and another user of the same tenant, find
    // no such task: exactly as an unknown id.
    let unknown = update(
        &server,
        TOKEN,
        "01a00000-0000-7000-8000-000000000001",
        json!({}),
    )
    .await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    for token in [OTHER_TOKEN, BOB] {
        let theirs = update(&server, token, &id, json!({"a": {"action": "accept"}})).await;
        assert_eq!(theirs["error"]["code"], -32602, "{theirs}");
        let shown = theirs["error"]["message"].to_string().replace(&id, "");
        let unknown_shown = unknown["error"]["message"]
            .to_string()
            .replace("01a00000-0000-7000-8000-000000000001", "");
        assert_eq!(shown, unknown_shown);
        let read = task(&server, token, &id).await;
        assert_eq!(read["error"]["code"], -32602, "{read}");
    }
    let untouched = until(&server, &id, "input_required").await;
    assert_eq!(pending(&untouched), ["a", "b"]);

    // Bad input: refused -32602, nothing recorded.
    let many: serde_json::Map<String, Value> = (0..17)
        .map(|n| (format!("k{n}"), json!({"action": "accept"})))
        .collect();
    let big = json!({"a": {"action": "accept", "content": {"x": "y".repeat(70 * 1024)}}});
    let long_key = json!({"k".repeat(129): {"action": "accept"}});
    for bad in [Value::Object(many), big, long_key, json!({"a": "accept"})] {
        let refused = update(&server, TOKEN, &id, bad).await;
        assert_eq!(refused["error"]["code"], -32602, "{refused}");
    }
    // A key the task does not ask is left out, and acked.
    let stray = update(&server, TOKEN, &id, json!({"zzz": {"action": "accept"}})).await;
    assert_eq!(
        stray["result"],
        json!({"resultType": "complete"}),
        "{stray}"
    );
    let still = until(&server, &id, "input_required").await;
    assert_eq!(pending(&still), ["a", "b"]);

    // One key: acked with nothing but the result type; the other pending.
    let partly = update(
        &server,
        TOKEN,
        &id,
        json!({"a": {"action": "accept", "content": {"n": 1}}}),
    )
    .await;
    assert_eq!(
        partly["result"],
        json!({"resultType": "complete"}),
        "{partly}"
    );
    let half = until(&server, &id, "input_required").await;
    assert_eq!(pending(&half), ["b"], "{half}");
    // `a` again: the first answer stands.
    let again = update(&server, TOKEN, &id, json!({"a": {"action": "decline"}})).await;
    assert_eq!(again["result"], json!({"resultType": "complete"}));

    // The ticket it waits on is in alice's inbox, as an input ticket, and
    // is not answered there.
    let inbox = server.client(TOKEN).get("/v1/tickets?kind=input").await;
    let ticket = inbox["result"]["tickets"][0].clone();
    assert_eq!(ticket["kind"], "input", "{inbox}");
    assert_eq!(ticket["pending"], json!(["b"]), "{ticket}");
    let path = format!(
        "/v1/tickets/{}/answer",
        ticket["ticket"].as_str().expect("id")
    );
    let body = json!({"answer": {"b": {"action": "accept"}}}).to_string();
    let (_, refused) = server
        .client(TOKEN)
        .raw(reqwest::Method::POST, &path, Some(body.into_bytes()))
        .await;
    assert_eq!(refused["error"]["code"], "invalid_arguments", "{refused}");
    let bobs = server.client(BOB).get("/v1/tickets?kind=input").await;
    assert_eq!(bobs["result"]["tickets"], json!([]), "{bobs}");

    // The last key: the job runs again with every answer, its state and
    // the client's capabilities, and completes.
    let last = update(
        &server,
        TOKEN,
        &id,
        json!({"b": {"action": "accept", "content": {"n": 2}}}),
    )
    .await;
    assert_eq!(last["result"], json!({"resultType": "complete"}));
    let done = until(&server, &id, "completed").await;
    let text = done["result"]["content"][0]["text"].as_str().expect("text");
    let got: Value = serde_json::from_str(text).expect("the tool's JSON");
    let got = &got["got"];
    assert_eq!(
        got["input_responses"],
        json!({"a": {"action": "accept", "content": {"n": 1}}, "b": {"action": "accept", "content": {"n": 2}}}),
        "{got}"
    );
    assert_eq!(got["request_state"], json!({"kept": "server-side"}));
    assert!(
        got["client_capabilities"]["elicitation"].is_object(),
        "{got}"
    );
    // Settled: an update is acked and changes nothing.
    let late = update(&server, TOKEN, &id, json!({"b": {"action": "decline"}})).await;
    assert_eq!(late["result"], json!({"resultType": "complete"}));
    assert_eq!(until(&server, &id, "completed").await, done);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_waiting_for_input_can_be_cancelled() {
    let dir = TempDir::new("mcp-task-input-cancel");
    let server = Server::start(&dir.0, &config(&dir.0, &extra()));
    let id = start(&server).await;
    until(&server, &id, "input_required").await;
    let cancelled = rpc(&server, TOKEN, "tasks/cancel", json!({"taskId": id})).await;
    assert_eq!(cancelled["result"]["resultType"], "complete", "{cancelled}");
    let gone = until(&server, &id, "cancelled").await;
    assert!(gone.get("inputRequests").is_none(), "{gone}");
    // Answers after the cancel wake nothing.
    let late = update(
        &server,
        TOKEN,
        &id,
        json!({"a": {"action": "accept"}, "b": {"action": "accept"}}),
    )
    .await;
    assert_eq!(late["result"], json!({"resultType": "complete"}));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        until(&server, &id, "cancelled").await["status"],
        "cancelled"
    );
}

/// A question its client never answers expires (`expires_in_s`, 24 hours
/// unless the tool says): the job fails with `timeout` rather than wait for
/// ever, and its ticket no longer waits in the inbox.
#[tokio::test(flavor = "multi_thread")]
async fn a_question_never_answered_expires_and_fails_the_job() {
    let dir = TempDir::new("mcp-task-input-expiry");
    let extra = extra().replace("max_attempts = 1\n", "max_attempts = 1\nexpires_in_s = 1\n");
    let server = Server::start(&dir.0, &config(&dir.0, &extra));
    let id = start(&server).await;
    until(&server, &id, "input_required").await;
    let failed = until(&server, &id, "failed").await;
    assert!(failed.get("inputRequests").is_none(), "{failed}");
    let rest = server.client(TOKEN);
    let job = rest.get(&format!("/v1/jobs/{id}")).await;
    assert_eq!(job["error"]["code"], "timeout", "{job}");
    let open = rest.get("/v1/tickets?state=open&kind=input").await;
    assert_eq!(open["result"]["tickets"], json!([]), "{open}");
}
