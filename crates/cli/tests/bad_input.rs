//! Bad input at every entry point gets the contract's error, never a panic,
//! and leaves the server serving.

mod common;

use common::{OTHER_TOKEN, Server, TOKEN, TempDir, config, settle};
use reqwest::Method;
use serde_json::json;

const TOOLS: &str = r#"
[[tools]]
name = "prints_garbage"
shape = "query"
executor = { kind = "exec", program = "/bin/sh", args = ["-c", "echo this is not json"] }

[[tools]]
name = "hangs"
shape = "query"
executor = { kind = "exec", program = "/bin/sh", args = ["-c", "sleep 30"], timeout_s = 0.5 }

[[tools]]
name = "floods"
shape = "query"
executor = { kind = "exec", program = "/bin/sh", args = ["-c", "printf '\"'; head -c 3000000 /dev/zero | tr '\\0' a; printf '\"'"] }

[[tools]]
name = "garbage_job"
shape = "job"
executor = { kind = "exec", program = "/bin/sh", args = ["-c", "echo {oops"] }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_entry_point_answers_bad_input_with_the_contract() {
    let dir = TempDir::new("bad-input");
    let server = Server::start(&dir.0, &config(&dir.0, TOOLS));
    let alice = server.client(TOKEN);
    let post = |body: Vec<u8>| {
        let alice = alice.clone();
        async move { alice.raw(Method::POST, "/v1/calls", Some(body)).await }
    };

    let (status, body) = post(b"{not json".to_vec()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    let (status, body) = post(vec![b' '; 2 * 1024 * 1024]).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (413, Some("payload_too_large")),
        "{body}"
    );
    let deep = format!(
        "{{\"tool\": \"find_expenses\", \"args\": {}{}}}",
        "[".repeat(5000),
        "]".repeat(5000)
    );
    let (status, body) = post(deep.into_bytes()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    let (status, body) = post(br#"{"tool": 5, "args": []}"#.to_vec()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    let (status, body) =
        post(br#"{"tool": "find_expenses", "args": {"month": 2026}}"#.to_vec()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (200, Some("invalid_arguments")),
        "{body}"
    );
    let (status, body) = post(br#"{"tool": "find_expenses", "args": [1]}"#.to_vec()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (200, Some("invalid_arguments")),
        "{body}"
    );
    let (status, body) = post(br#"{"tool": "no_such_tool"}"#.to_vec()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (200, Some("unknown_tool")),
        "{body}"
    );
    let (status, body) = post(
        br#"{"tool": "find_expenses", "args": {}, "callback_url": "http://10.1.2.3/x"}"#.to_vec(),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("allow-list")
    );
    let (status, body) = post(br#"{"tool": "find_expenses", "surprise": 1}"#.to_vec()).await;
    assert_eq!(status, 400, "{body}");

    // Start times: each refusal names its field and says what would pass.
    for (when, field, says) in [
        (
            json!({"run_at": "2020-01-01T00:00:00Z"}),
            "run_at",
            "in the past",
        ),
        (json!({"run_at": "next tuesday"}), "run_at", "RFC 3339"),
        (
            json!({"run_at": "2026-13-01T00:00:00Z"}),
            "run_at",
            "RFC 3339",
        ),
        (
            json!({"run_at": "9999-01-01T00:00:00Z"}),
            "run_at",
            "more than a year",
        ),
        (json!({"delay_s": -1}), "delay_s", "0 or more"),
        (json!({"delay_s": 1e12}), "delay_s", "more than a year"),
        (json!({"priority": 101}), "priority", "-100 to 100"),
        (json!({"priority": -40000}), "priority", "-100 to 100"),
        (json!({"priority": 2.5}), "priority", "whole number"),
        (json!({"priority": "high"}), "priority", "whole number"),
        (
            json!({"delay_s": 5, "run_at": "2030-01-01T00:00:00Z"}),
            "delay_s",
            "not both",
        ),
    ] {
        let mut call = json!({"tool": "garbage_job", "args": {}});
        for (key, value) in when.as_object().unwrap() {
            call[key] = value.clone();
        }
        let (status, body) = post(call.to_string().into_bytes()).await;
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some("bad_request")),
            "{when}: {body}"
        );
        assert!(
            message.contains(&format!("`{field}`")) && message.contains(says),
            "{when}: {message}"
        );
    }
    let (status, body) = post(br#"{"tool": "garbage_job", "delay_s": "soon"}"#.to_vec()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    // Only a job or agent tool takes one.
    let (status, body) = post(br#"{"tool": "find_expenses", "delay_s": 60}"#.to_vec()).await;
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (200, Some("bad_request")),
        "{body}"
    );
    assert!(
        message.contains("`run_at` and `delay_s`") && message.contains("query"),
        "{message}"
    );
    // A priority only where the pool takes jobs by priority.
    let (status, body) = post(br#"{"tool": "garbage_job", "priority": 5}"#.to_vec()).await;
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (200, Some("bad_request")),
        "{body}"
    );
    assert!(
        message.contains("`priority`") && message.contains("in the order they came"),
        "{message}"
    );

    // Tokens.
    for token in ["", "wrong"] {
        let mut client = alice.clone();
        client.token = token.to_owned();
        let (status, body) = client.raw(Method::GET, "/v1/tools", None).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (401, Some("unauthenticated")),
            "{body}"
        );
    }
    let response = alice
        .http
        .get(format!("{}/v1/jobs", alice.base))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers().get("www-authenticate").unwrap(),
        "Bearer"
    );

    // Job ids, waits, filters and formats.
    for id in [
        "not-a-job",
        "01a00000-0000-7000-8000-000000000000",
        "%00",
        "x".repeat(300).as_str(),
    ] {
        let (status, body) = alice
            .raw(Method::GET, &format!("/v1/jobs/{id}"), None)
            .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (200, Some("not_found")),
            "{id}: {body}"
        );
        let (status, body) = alice
            .raw(Method::POST, &format!("/v1/jobs/{id}/cancel"), None)
            .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (200, Some("not_found")),
            "{id}: {body}"
        );
    }
    for path in [
        "/v1/jobs/01a00000-0000-7000-8000-000000000000?wait_s=99",
        "/v1/jobs?state=bogus",
        "/v1/events?state=succeeded,bogus",
        "/v1/events?state=",
        "/v1/jobs?limit=0",
        "/v1/jobs?limit=x",
        "/v1/jobs/01a00000-0000-7000-8000-000000000000?wait_s=soon",
        "/v1/tools?format=bogus",
    ] {
        let (status, body) = alice.raw(Method::GET, path, None).await;
        // The contract's envelope, not a framework's plain-text rejection.
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some("bad_request")),
            "{path}: {body}"
        );
    }
    let (status, body) = alice.raw(Method::GET, "/v1/tickets/t_nope", None).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (200, Some("not_found")),
        "{body}"
    );
    let (status, _) = alice
        .raw(
            Method::POST,
            "/v1/tickets/t_nope/answer",
            Some(b"[]".to_vec()),
        )
        .await;
    assert_eq!(status, 400);

    // Executors that misbehave.
    let garbage = alice.call("prints_garbage", json!({})).await;
    assert_eq!(garbage["error"]["code"], "tool_failed", "{garbage}");
    let hung = alice.call("hangs", json!({})).await;
    assert_eq!(hung["error"]["code"], "timeout", "{hung}");
    let flood = alice.call("floods", json!({})).await;
    assert_eq!(flood["error"]["code"], "payload_too_large", "{flood}");
    let job = alice.call("garbage_job", json!({})).await;
    let failed = settle(&alice, job["job_id"].as_str().unwrap()).await;
    assert_eq!(
        (failed["status"].as_str(), failed["state"].as_str()),
        (Some("error"), Some("failed")),
        "{failed}"
    );
    assert_eq!(failed["error"]["code"], "tool_failed");

    // Still serving, for everyone.
    assert_eq!(alice.get("/healthz").await["status"], "ok");
    let ok = server
        .client(OTHER_TOKEN)
        .call("find_expenses", json!({"month": "2026-09"}))
        .await;
    assert_eq!(ok["status"], "ok");
}
