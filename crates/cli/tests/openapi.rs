//! The OpenAPI document of the HTTP API (`GET /v1/openapi.json`) against a
//! real `toolfleet serve`: served without a token, every operation it names
//! answered with a status and content type it documents (and none refused
//! as an unknown route), and schemathesis's property-based run over every
//! operation (the event stream for 2 s a request) with no 5xx and every
//! answer as documented.

mod common;

use std::process::Command;
use std::time::Instant;

use common::{Server, TOKEN, TempDir, config, missing};
use serde_json::{Value, json};

/// The schemathesis of this test (`.ci/run` installs it).
const SCHEMATHESIS: &str = "4.32.5";

/// A value for each path parameter of the API.
fn filled(path: &str) -> String {
    path.replace("{job_id}", "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e")
        .replace("{ticket}", "t_0190f5c27d3e7b2a9c1e2f4a5b6c7d8e")
        .replace("{run}", "run_0190f5c27d3e7b2a9c1e2f4a5b6c7d8e")
        .replace("{name}", "nightly")
}

/// The media types the document gives an answer of `status`.
fn documented_types(doc: &Value, operation: &Value, status: u16) -> Option<Vec<String>> {
    let mut answer = &operation["responses"][status.to_string()];
    if let Some(reference) = answer["$ref"].as_str() {
        answer = doc
            .pointer(reference.trim_start_matches('#'))
            .unwrap_or(&Value::Null);
    }
    if answer.is_null() {
        return None;
    }
    Some(
        answer["content"]
            .as_object()
            .map(|content| content.keys().cloned().collect())
            .unwrap_or_default(),
    )
}

/// The first example of the operation's request body, else `{}`.
fn example_body(operation: &Value) -> Option<Value> {
    let media = operation["requestBody"]["content"].get("application/json")?;
    let first = media["examples"]
        .as_object()
        .and_then(|examples| examples.values().next())
        .map(|example| example["value"].clone());
    Some(first.unwrap_or_else(|| json!({})))
}

#[tokio::test(flavor = "multi_thread")]
async fn every_documented_operation_answers_as_documented() {
    let dir = TempDir::new("openapi");
    let server = Server::start(&dir.0, &config(&dir.0, ""));
    let http = toolfleet_executors::http_client().expect("a client");

    let response = http
        .get(format!("{}/v1/openapi.json", server.base))
        .send()
        .await
        .expect("the server answers");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    let text = response.text().await.expect("a body");
    let doc: Value = serde_json::from_str(&text).expect("the document is JSON");
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );

    let paths = doc["paths"].as_object().expect("paths");
    let mut operations = 0;
    for (path, item) in paths {
        for (method, operation) in item.as_object().expect("a path item") {
            operations += 1;
            let id = operation["operationId"].as_str().expect("an operationId");
            let url = format!("{}{}", server.base, filled(path));
            let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes())
                .expect("an HTTP method");
            let public = operation["security"] == json!([]);
            let send = |token: Option<&str>| {
                let mut request = http
                    .request(method.clone(), &url)
                    .header("accept", "application/json, text/event-stream");
                if let Some(token) = token {
                    request = request.bearer_auth(token);
                }
                if let Some(body) = example_body(operation) {
                    request = request
                        .header("content-type", "application/json")
                        .body(body.to_string());
                }
                request.send()
            };

            // With the token: a status the document names, in a content
            // type it names; a stream is left unread.
            let response = send(Some(TOKEN)).await.expect("the server answers");
            let status = response.status().as_u16();
            let types = documented_types(&doc, operation, status)
                .unwrap_or_else(|| panic!("{id}: {status} is not documented"));
            let content_type = response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(|v| v.split(';').next().unwrap_or_default().trim().to_owned());
            if !types.is_empty() {
                let content_type = content_type.clone().unwrap_or_default();
                assert!(
                    types.contains(&content_type),
                    "{id}: {status} in {content_type}, documented {types:?}"
                );
            }
            if content_type.as_deref() != Some("text/event-stream") {
                let body = response.text().await.expect("a body");
                assert!(
                    !body.contains("no such route"),
                    "{id}: {path} is not routed: {body}"
                );
            }

            // Without one: 401 with the challenge, but for public routes.
            let response = send(None).await.expect("the server answers");
            let status = response.status().as_u16();
            if public {
                assert_ne!(status, 401, "{id} is public");
            } else {
                assert_eq!(status, 401, "{id} needs a token");
                assert!(response.headers().contains_key("www-authenticate"), "{id}");
                assert!(documented_types(&doc, operation, 401).is_some(), "{id}");
            }
        }
    }
    assert!(operations >= 30, "{operations} operations");

    // The stream's refusal of a state it does not know is the envelope
    // the document names (schemathesis leaves the endless stream out).
    let response = http
        .get(format!("{}/v1/events?state=queued,nonsense", server.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("the server answers");
    assert_eq!(response.status(), 400);
    let refused: Value =
        serde_json::from_str(&response.text().await.expect("a body")).expect("an envelope");
    assert_eq!(refused["error"]["code"], "bad_request", "{refused}");

    // `toolfleet openapi` prints the document of a configuration: the
    // same operations.
    let printed = common::toolfleet(&["--config", &server.config.display().to_string(), "openapi"]);
    assert!(printed.status.success(), "{printed:?}");
    let printed: Value = serde_json::from_slice(&printed.stdout).expect("the document is JSON");
    assert_eq!(operation_ids(&printed), operation_ids(&doc));
}

/// The operationIds of a document, sorted.
fn operation_ids(doc: &Value) -> Vec<String> {
    let mut ids: Vec<String> = doc["paths"]
        .as_object()
        .into_iter()
        .flat_map(|paths| paths.values())
        .filter_map(Value::as_object)
        .flat_map(|item| item.values())
        .filter_map(|operation| operation["operationId"].as_str().map(str::to_owned))
        .collect();
    ids.sort();
    ids
}

/// Whether schemathesis of [`SCHEMATHESIS`] runs here; under CI it must.
fn schemathesis_ready() -> bool {
    let version = Command::new("python3")
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('schemathesis'))",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    if version.as_deref() == Some(SCHEMATHESIS) {
        return true;
    }
    missing(&format!(
        "python3 with schemathesis {SCHEMATHESIS} is not installed (found {version:?})"
    ));
    false
}

/// Runs `schemathesis run` of the document of `server` with `args` in
/// `dir`, as the principal of [`TOKEN`], every check but
/// positive_data_acceptance (a body the schema allows may still be refused
/// by a rule across its fields, `run_at` with `delay_s` or `since` after
/// `until`, as the document says), with a fixed seed.
fn schemathesis(server: &Server, dir: &std::path::Path, args: &[&str]) -> (bool, String) {
    let output = Command::new("python3")
        .args([
            "-c",
            "import sys; from schemathesis.cli import schemathesis; sys.exit(schemathesis())",
            "run",
            &format!("{}/v1/openapi.json", server.base),
            "--header",
            &format!("Authorization: Bearer {TOKEN}"),
            // `/mcp` answers only a client that takes JSON and streams.
            "--header",
            "Accept: application/json, text/event-stream",
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
            "--seed",
            "20261203",
            "--workers",
            "1",
            "--generation-database",
            "none",
            "--no-color",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("python3 runs");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (
        output.status.success() && text.contains("No issues found"),
        text,
    )
}

#[test]
fn schemathesis_finds_every_answer_as_documented() {
    if !schemathesis_ready() {
        return;
    }
    let dir = TempDir::new("schemathesis");
    let server = Server::start(&dir.0, &config(&dir.0, ""));
    let started = Instant::now();
    let (passed, report) = std::thread::scope(|scope| {
        // `GET /v1/events` streams until the server stops: schemathesis
        // reads each stream for 2 s, checking every event it hears, while
        // the other run's calls make them.
        let events = scope.spawn(|| {
            schemathesis(
                &server,
                &dir.0,
                &[
                    "--include-operation-id",
                    "streamEvents",
                    "--max-examples",
                    "15",
                    "--request-timeout",
                    "2",
                ],
            )
        });
        let rest = schemathesis(
            &server,
            &dir.0,
            &[
                "--exclude-operation-id",
                "streamEvents",
                "--max-examples",
                "60",
                // A long poll waits up to 30 s.
                "--request-timeout",
                "45",
            ],
        );
        let events = events.join().expect("the events run");
        (
            rest.0 && events.0,
            format!("{}\n--- GET /v1/events ---\n{}", rest.1, events.1),
        )
    });
    eprintln!("schemathesis ran {:.0?}:\n{report}", started.elapsed());
    assert!(
        passed,
        "schemathesis found answers the document does not describe (above)"
    );
}
