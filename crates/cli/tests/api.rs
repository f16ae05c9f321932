//! The HTTP contract of docs/API.md against a real `toolfleet serve` process:
//! tool specs per format and per scope, idempotency keys, the long-poll and
//! cancel, the job list, webhook retries, the status tools, health and
//! metrics, the development token, and the command-line client.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{
    Client, OTHER_TOKEN, Server, TOKEN, TempDir, config, config_with, eventually, hook_receiver,
    refused_at_start, settle, sha, signed,
};
use reqwest::Method;
use serde_json::{Value, json};

/// A token of tenant acme that may read expenses but not submit them.
const READER_TOKEN: &str = "tf_test_bob_reader";

/// Job tools of this file: one that sleeps long, one that takes a second.
const JOB_TOOLS: &str = r#"
[[tools]]
name = "sleepy"
shape = "job"
description = "Sleeps for a long time."
executor = { kind = "exec", program = "/bin/sh", args = ["-c", "sleep 20; echo {}"] }

[[tools]]
name = "quick"
shape = "job"
description = "Done in a second."
executor = { kind = "exec", program = "/bin/sh", args = ["-c", "sleep 1; echo '{\"done\": true}'"] }
"#;

fn reader_token() -> String {
    format!(
        "\n[[auth.tokens]]\nsha256 = \"{}\"\ntenant = \"acme\"\nuser = \"bob\"\nscopes = [\"expenses:read\"]\n",
        sha(READER_TOKEN)
    )
}

/// Starts a job and answers its id.
async fn start(client: &Client, tool: &str, args: Value) -> String {
    let started = client.call(tool, args).await;
    assert_eq!(started["status"], "running", "{started}");
    started["job_id"].as_str().unwrap().to_owned()
}

/// Waits until the job reads `state`, answering its envelope.
async fn reaches(client: &Client, job_id: &str, state: &str) -> Value {
    eventually(Duration::from_secs(10), || {
        let (client, job_id) = (client.clone(), job_id.to_owned());
        let state = state.to_owned();
        async move {
            let job = client.get(&format!("/v1/jobs/{job_id}")).await;
            (job["state"] == state.as_str()).then_some(job)
        }
    })
    .await
}

/// Receipt ids of the caller's expense lines (first page).
async fn receipt_ids(client: &Client, n: usize) -> Vec<String> {
    let page = client
        .call("find_expenses", json!({"month": "2026-09"}))
        .await;
    let ids: Vec<String> = page["result"]["lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["receipt_id"].as_str().map(str::to_owned))
        .take(n)
        .collect();
    assert_eq!(ids.len(), n, "{page}");
    ids
}

/// The tool names of a spec list in `format`, and the spec of `find_expenses`.
fn names_and_find(format: &str, specs: &Value) -> (BTreeSet<String>, Value) {
    let list = match format {
        "gemini" => {
            let groups = specs.as_array().expect("gemini: an array of Tool objects");
            assert_eq!(groups.len(), 1, "gemini groups every function: {specs}");
            groups[0]["functionDeclarations"].clone()
        }
        _ => specs.clone(),
    };
    let list = list
        .as_array()
        .unwrap_or_else(|| panic!("{format}: {specs}"));
    let name = |spec: &Value| match format {
        "openai" => spec["function"]["name"].clone(),
        _ => spec["name"].clone(),
    };
    let names = list
        .iter()
        .map(|s| name(s).as_str().expect("a name").to_owned())
        .collect();
    let find = list
        .iter()
        .find(|s| name(s) == "find_expenses")
        .unwrap_or_else(|| panic!("{format}: no find_expenses in {specs}"))
        .clone();
    (names, find)
}

// 1. Tool specs.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_answer_every_format_and_only_what_the_scopes_allow() {
    let dir = TempDir::new("api-tools");
    let server = Server::start(&dir.0, &config(&dir.0, &reader_token()));
    let alice = server.client(TOKEN);
    let bob = server.client(READER_TOKEN);

    let neutral = alice.get("/v1/tools").await;
    assert_eq!(
        neutral,
        alice.get("/v1/tools?format=neutral").await,
        "neutral is the default"
    );
    let mut all = None;
    for format in [
        "neutral",
        "openai",
        "openai-responses",
        "anthropic",
        "gemini",
        "mcp",
    ] {
        let specs = alice.get(&format!("/v1/tools?format={format}")).await;
        let (names, find) = names_and_find(format, &specs);
        let month = json!({
            "type": "string",
            "pattern": "^[0-9]{4}-(0[1-9]|1[0-2])$",
            "description": "The month, as YYYY-MM."
        });
        match format {
            "neutral" => {
                assert_eq!(find["shape"], "query");
                assert_eq!(find["scopes"], json!(["expenses:read"]));
                assert_eq!(find["hints"]["read_only"], true);
                assert_eq!(find["input_schema"]["properties"]["month"], month);
            }
            "openai" => {
                assert_eq!(find["type"], "function");
                let function = &find["function"];
                assert!(function["description"].as_str().unwrap().contains("month"));
                assert_eq!(function["parameters"]["type"], "object");
                assert!(function["strict"].is_boolean());
            }
            "openai-responses" => {
                assert_eq!(find["type"], "function");
                assert!(find.get("function").is_none(), "flat, not nested: {find}");
                assert_eq!(find["parameters"]["type"], "object");
                assert!(find["strict"].is_boolean());
            }
            "anthropic" => {
                assert_eq!(find["input_schema"]["properties"]["month"], month);
                assert!(find.get("type").is_none() && find.get("parameters").is_none());
            }
            "gemini" => {
                assert_eq!(find["parameters"]["type"], "object");
                assert!(find["parameters"]["properties"]["month"].is_object());
            }
            "mcp" => {
                assert_eq!(find["inputSchema"]["properties"]["month"], month);
                assert_eq!(find["title"], "Find expense lines");
                let hints = &find["annotations"];
                assert_eq!(
                    (&hints["readOnlyHint"], &hints["idempotentHint"]),
                    (&json!(true), &json!(true))
                );
            }
            _ => unreachable!(),
        }
        // Every format lists the same tools.
        for tool in ["find_expenses", "submit_report", "get_job", "cancel_job"] {
            assert!(names.contains(tool), "{format} lists {tool}: {names:?}");
        }
        match &all {
            None => all = Some(names),
            Some(all) => assert_eq!(&names, all, "{format} lists what neutral lists"),
        }

        // The reader lacks expenses:submit, so never sees submit_report.
        let theirs = bob.get(&format!("/v1/tools?format={format}")).await;
        let (seen, _) = names_and_find(format, &theirs);
        assert!(!seen.contains("submit_report"), "{format}: {seen:?}");
        let mut expected = all.clone().unwrap();
        expected.remove("submit_report");
        assert_eq!(seen, expected, "{format}: only that tool is hidden");
    }

    let (status, body) = alice.raw(Method::GET, "/v1/tools?format=cobol", None).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("bad_request"))
    );
    // Hidden is also refused: scopes are checked at call time too.
    let denied = bob
        .call(
            "submit_report",
            json!({"line_ids": ["exp-001"], "dry_run": true}),
        )
        .await;
    assert_eq!(denied["error"]["code"], "forbidden", "{denied}");
}

// 2. Idempotency keys.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_names_one_job_per_tenant() {
    let dir = TempDir::new("api-idem");
    let server = Server::start(&dir.0, &config(&dir.0, ""));
    let alice = server.client(TOKEN);
    let mallory = server.client(OTHER_TOKEN);
    let receipts = receipt_ids(&alice, 2).await;
    let call = |client: &Client, args: Value| {
        let client = client.clone();
        async move {
            client
                .post(
                    "/v1/calls",
                    json!({"tool": "start_receipt_ocr", "args": args, "idempotency_key": "sept-ocr-1"}),
                )
                .await
        }
    };
    let args = json!({"receipt_ids": receipts});

    let first = call(&alice, args.clone()).await;
    assert_eq!(first["status"], "running", "{first}");
    let job_id = first["job_id"].as_str().unwrap().to_owned();
    let again = call(&alice, args.clone()).await;
    assert_eq!(
        again["job_id"],
        job_id.as_str(),
        "the same key, the same job"
    );
    let done = settle(&alice, &job_id).await;
    assert_eq!(done["status"], "ok", "{done}");
    // Once settled, the key still answers that job, and its result stands.
    let later = call(&alice, args.clone()).await;
    assert_eq!(later["job_id"], job_id.as_str());
    assert_eq!(alice.get(&format!("/v1/jobs/{job_id}")).await, done);

    // The same key with other arguments is a conflict.
    let other = call(&alice, json!({"receipt_ids": [receipts[0]]})).await;
    assert_eq!(other["status"], "error", "{other}");
    assert_eq!(other["error"]["code"], "conflict");

    // Another tenant's key is its own: a new job, not alice's.
    let theirs = call(&mallory, args.clone()).await;
    assert_eq!(theirs["status"], "running", "{theirs}");
    let their_id = theirs["job_id"].as_str().unwrap();
    assert_ne!(their_id, job_id);
    assert_eq!(
        alice.get(&format!("/v1/jobs/{their_id}")).await["error"]["code"],
        "not_found"
    );

    // Without a key, every call is a new job.
    let a = start(&alice, "start_receipt_ocr", args.clone()).await;
    let b = start(&alice, "start_receipt_ocr", args).await;
    assert!(a != b && a != job_id);
}

// 3. Long-poll and cancel.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_job_long_polls_and_cancel_stops_queued_and_running_jobs() {
    let dir = TempDir::new("api-cancel");
    // No job claimed ahead: one beyond the slot stays queued (a worker
    // claims what it holds ahead; see distributed.rs).
    let top = "concurrency = 1\nprefetch_ahead = 0";
    let server = Server::start(&dir.0, &config_with(&dir.0, top, JOB_TOOLS));
    let alice = server.client(TOKEN);

    let running = start(&alice, "sleepy", json!({})).await;
    let job = reaches(&alice, &running, "running").await;
    assert_eq!(
        (job["status"].as_str(), job["attempts"].as_u64()),
        (Some("running"), Some(1)),
        "{job}"
    );
    // One slot, taken: the next one waits in the queue.
    let queued = start(&alice, "sleepy", json!({})).await;
    let job = alice.get(&format!("/v1/jobs/{queued}")).await;
    assert_eq!(
        (
            job["status"].as_str(),
            job["state"].as_str(),
            job["attempts"].as_u64()
        ),
        (Some("running"), Some("queued"), Some(0)),
        "{job}"
    );
    // A long-poll on a job that does not settle waits out its wait_s.
    let asked = Instant::now();
    let job = alice.get(&format!("/v1/jobs/{running}?wait_s=1")).await;
    assert!(asked.elapsed() >= Duration::from_millis(900));
    assert_eq!(job["state"], "running", "{job}");

    // Cancel the queued one, then the running one.
    for id in [&queued, &running] {
        let cancelled = alice
            .post(&format!("/v1/jobs/{id}/cancel"), json!({}))
            .await;
        assert_eq!(
            (
                cancelled["status"].as_str(),
                cancelled["state"].as_str(),
                cancelled["error"]["code"].as_str()
            ),
            (Some("error"), Some("cancelled"), Some("cancelled")),
            "{cancelled}"
        );
        let job = alice.get(&format!("/v1/jobs/{id}?wait_s=5")).await;
        assert_eq!(
            (job["status"].as_str(), job["state"].as_str()),
            (Some("error"), Some("cancelled")),
            "{job}"
        );
    }

    // The running one's executor was stopped: the only slot is free long
    // before its 20 s sleep would have ended, and the queued one never ran.
    let quick = start(&alice, "quick", json!({})).await;
    reaches(&alice, &quick, "running").await;
    let asked = Instant::now();
    let done = alice.get(&format!("/v1/jobs/{quick}?wait_s=15")).await;
    assert_eq!(done["status"], "ok", "settled within wait_s: {done}");
    assert_eq!(done["result"], json!({"done": true}));
    assert!(
        asked.elapsed() < Duration::from_secs(12),
        "the long-poll answers when the job settles, not at its deadline"
    );
    let job = alice.get(&format!("/v1/jobs/{queued}")).await;
    assert_eq!(job["state"], "cancelled");
    let listed = alice.get("/v1/jobs?state=cancelled").await;
    let attempts: Vec<(String, u64)> = listed["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["job_id"].as_str().unwrap().to_owned(),
                j["attempts"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(attempts, [(queued.clone(), 0), (running.clone(), 1)]);

    // Cancelling a settled job leaves it as it is.
    let again = alice
        .post(&format!("/v1/jobs/{quick}/cancel"), json!({}))
        .await;
    assert_eq!(again, done, "the settled job, unchanged");
    assert_eq!(alice.get(&format!("/v1/jobs/{quick}")).await, done);
    let again = alice
        .post(&format!("/v1/jobs/{running}/cancel"), json!({}))
        .await;
    assert_eq!(again["state"], "cancelled");
}

// 4. The job list.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_list_pages_newest_first_and_filters() {
    let dir = TempDir::new("api-list");
    let server = Server::start(&dir.0, &config(&dir.0, JOB_TOOLS));
    let alice = server.client(TOKEN);
    let mallory = server.client(OTHER_TOKEN);
    let mut made = Vec::new();
    for _ in 0..4 {
        made.push(("quick", start(&alice, "quick", json!({})).await));
    }
    for _ in 0..3 {
        let id = start(&alice, "sleepy", json!({})).await;
        alice
            .post(&format!("/v1/jobs/{id}/cancel"), json!({}))
            .await;
        made.push(("sleepy", id));
    }
    start(&mallory, "quick", json!({})).await;
    for (_, id) in made.iter().filter(|(tool, _)| *tool == "quick") {
        assert_eq!(settle(&alice, id).await["status"], "ok");
    }
    let newest_first: Vec<String> = made.iter().rev().map(|(_, id)| id.clone()).collect();

    // Pages of three, newest first, until next_cursor is absent.
    let mut seen = Vec::new();
    let mut path = "/v1/jobs?limit=3".to_owned();
    let mut pages = 0;
    loop {
        let page = alice.get(&path).await;
        let jobs = page["jobs"].as_array().unwrap();
        assert!(jobs.len() <= 3);
        seen.extend(
            jobs.iter()
                .map(|j| j["job_id"].as_str().unwrap().to_owned()),
        );
        pages += 1;
        match page["next_cursor"].as_str() {
            Some(cursor) => path = format!("/v1/jobs?limit=3&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(
        seen, newest_first,
        "every job of the tenant once, newest first"
    );
    assert_eq!(pages, 3);

    let ids = |page: &Value| -> Vec<String> {
        page["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["job_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let of = |tool: &str| -> Vec<String> {
        made.iter()
            .rev()
            .filter(|(t, _)| *t == tool)
            .map(|(_, id)| id.clone())
            .collect()
    };
    let quick = alice.get("/v1/jobs?tool=quick").await;
    assert_eq!(ids(&quick), of("quick"));
    assert!(
        quick["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|j| j["tool"] == "quick")
    );
    let cancelled = alice.get("/v1/jobs?state=cancelled").await;
    assert_eq!(ids(&cancelled), of("sleepy"));
    assert!(
        cancelled["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|j| j["state"] == "cancelled")
    );
    let both = alice
        .get("/v1/jobs?state=succeeded&tool=quick&limit=2")
        .await;
    assert_eq!(ids(&both), of("quick")[..2]);
    assert!(both["next_cursor"].is_string());
    assert!(ids(&alice.get("/v1/jobs?state=succeeded&tool=sleepy").await).is_empty());

    for bad in [
        "/v1/jobs?state=done",
        "/v1/jobs?limit=0",
        "/v1/jobs?limit=101",
    ] {
        let (status, body) = alice.raw(Method::GET, bad, None).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some("bad_request")),
            "{bad}: {body}"
        );
    }
}

// 5. Webhook retries.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_is_retried_with_backoff_until_acknowledged() {
    let dir = TempDir::new("api-hooks");
    let server = Server::start(&dir.0, &config(&dir.0, JOB_TOOLS));
    let alice = server.client(TOKEN);
    let (url, hooks) = hook_receiver(vec![500, 200]).await;
    let started = alice
        .post(
            "/v1/calls",
            json!({"tool": "quick", "args": {}, "callback_url": url, "run_id": "run-hooks"}),
        )
        .await;
    let job_id = started["job_id"].as_str().unwrap().to_owned();
    let done = settle(&alice, &job_id).await;
    assert_eq!(done["status"], "ok", "{done}");
    let got = eventually(Duration::from_secs(10), || {
        let hooks = hooks.clone();
        async move {
            let hooks = hooks.lock().unwrap();
            (hooks.len() >= 2).then(|| hooks.clone())
        }
    })
    .await;
    for hook in &got {
        assert!(signed(&hook.signature, &hook.body), "signed: {hook:?}");
        let notice: Value = serde_json::from_str(&hook.body).unwrap();
        assert_eq!(notice["event"], "job.succeeded");
        assert_eq!(notice["job_id"], job_id.as_str());
        assert_eq!(notice["run_id"], "run-hooks");
        assert_eq!(notice["result"], done["result"]);
    }
    assert!(
        got[1].at - got[0].at >= Duration::from_millis(400),
        "the retry waits a backoff: {:?}",
        got[1].at - got[0].at
    );
    // Acknowledged: no further delivery.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(hooks.lock().unwrap().len(), 2);
}

// 6. get_job and cancel_job as tools.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_job_and_cancel_job_are_tools() {
    let dir = TempDir::new("api-status-tools");
    let server = Server::start(&dir.0, &config(&dir.0, JOB_TOOLS));
    let alice = server.client(TOKEN);
    let mallory = server.client(OTHER_TOKEN);
    let job_id = start(&alice, "sleepy", json!({})).await;
    reaches(&alice, &job_id, "running").await;

    let read = alice.call("get_job", json!({"job_id": job_id})).await;
    assert_eq!(read["status"], "ok", "{read}");
    assert_eq!(read["result"]["status"], "running");
    assert_eq!(read["result"]["job_id"], job_id.as_str());
    assert_eq!(read["result"]["state"], "running");
    assert_eq!(read["result"]["attempts"], 1);
    let theirs = mallory.call("get_job", json!({"job_id": job_id})).await;
    assert_eq!(theirs["error"]["code"], "not_found", "{theirs}");

    // Two steps: without a token the commit is refused.
    let bare = alice
        .call("cancel_job", json!({"job_id": job_id, "dry_run": false}))
        .await;
    assert_eq!(bare["error"]["code"], "confirm_required", "{bare}");
    let dry = alice
        .call("cancel_job", json!({"job_id": job_id, "dry_run": true}))
        .await;
    assert_eq!(dry["status"], "ok", "{dry}");
    assert_eq!(dry["result"]["plan"]["job"]["state"], "running");
    let token = dry["result"]["confirm_token"].as_str().unwrap().to_owned();
    assert_eq!(
        alice.get(&format!("/v1/jobs/{job_id}")).await["state"],
        "running",
        "a dry run changes nothing"
    );
    let commit = alice
        .call(
            "cancel_job",
            json!({"job_id": job_id, "dry_run": false, "confirm_token": token}),
        )
        .await;
    assert_eq!(commit["status"], "ok", "{commit}");
    assert_eq!(commit["result"]["status"], "error");
    assert_eq!(commit["result"]["state"], "cancelled");
    let job = alice.get(&format!("/v1/jobs/{job_id}")).await;
    assert_eq!(
        (job["status"].as_str(), job["state"].as_str()),
        (Some("error"), Some("cancelled"))
    );
    let read = alice.call("get_job", json!({"job_id": job_id})).await;
    assert_eq!(read["result"]["state"], "cancelled", "{read}");
}

// 7. Health, readiness, metrics.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics_answer() {
    let dir = TempDir::new("api-health");
    let server = Server::start(&dir.0, &config(&dir.0, ""));
    let anonymous = server.client("");
    let (status, _) = anonymous.raw(Method::GET, "/healthz", None).await;
    assert_eq!(status, 200);
    // Ready once its workers consume their pools, which follows the start.
    let ready = eventually(Duration::from_secs(10), || async {
        let (status, ready) = anonymous.raw(Method::GET, "/readyz", None).await;
        (status == 200).then_some(ready)
    })
    .await;
    assert_eq!(
        ready,
        json!({"store": "ok", "broker": "ok", "workers": "ok"})
    );

    let alice = server.client(TOKEN);
    let found = alice
        .call("find_expenses", json!({"month": "2026-09"}))
        .await;
    assert_eq!(found["status"], "ok");
    let response = anonymous
        .http
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let kind = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        kind.starts_with("text/plain") || kind.starts_with("application/openmetrics-text"),
        "{kind}"
    );
    let text = response.text().await.unwrap();
    let counted = text
        .lines()
        .find(|l| l.starts_with("toolfleet_calls_total{") && l.contains("find_expenses"))
        .unwrap_or_else(|| panic!("no call counted:\n{text}"));
    let value: f64 = counted.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(value >= 1.0, "{counted}");
    assert!(text.lines().any(|l| l.starts_with("# TYPE ")), "{text}");
}

// 8. The development token.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_serve_makes_a_development_token_and_keeps_it() {
    let dir = TempDir::new("api-devtoken");
    let pack = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/expenses/toolfleet.toml");
    let data = dir.0.join("data");
    let text = format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ninclude = [\"{}\"]\n",
        data.display(),
        pack.display()
    );
    let mut server = Server::start(&dir.0, &text);
    let token = std::fs::read_to_string(data.join("dev-token"))
        .expect("dev-token in the data directory")
        .trim()
        .to_owned();
    assert!(token.len() >= 16, "{token}");
    let said = server.startup.join("\n");
    assert!(
        said.contains(&format!("export TOOLFLEET_TOKEN={token}")),
        "stderr tells how to use it: {said}"
    );
    assert!(said.contains("made a development token"), "{said}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(data.join("dev-token"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "owner only: {mode:o}");
    }
    let dev = server.client(&token);
    let found = dev.call("find_expenses", json!({"month": "2026-09"})).await;
    assert_eq!(
        found["status"], "ok",
        "the token holds every scope: {found}"
    );
    let (status, _) = server
        .client("tf_dev_wrong")
        .raw(Method::GET, "/v1/tools", None)
        .await;
    assert_eq!(status, 401);

    server.kill();
    let server = Server::start_with(&server.config.clone());
    let kept = std::fs::read_to_string(data.join("dev-token")).unwrap();
    assert_eq!(kept.trim(), token, "the same token after a restart");
    assert!(
        server
            .startup
            .join("\n")
            .contains("using the development token"),
        "{:?}",
        server.startup
    );
    let tools = server.client(&token).get("/v1/tools").await;
    assert!(tools.as_array().is_some_and(|t| !t.is_empty()));
}

// 9. The command line.

/// Runs the binary with `args`, answering (success, stdout, stderr).
async fn toolfleet(config: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolfleet"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("TOOLFLEET_URL")
        .env_remove("TOOLFLEET_TOKEN")
        .env("TOOLFLEET_LOG", "error")
        .stdin(std::process::Stdio::null())
        .output();
    let output = tokio::time::timeout(Duration::from_secs(30), output)
        .await
        .expect("the command ends")
        .expect("the command runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_client_calls_waits_and_lists() {
    let dir = TempDir::new("api-cli");
    let server = Server::start(&dir.0, &config(&dir.0, ""));
    let conf = server.config.clone();
    let base = server.base.clone();

    let (ok, out, err) = toolfleet(
        &conf,
        &[
            "call",
            "find_expenses",
            r#"{"month":"2026-09"}"#,
            "--server",
            "http://127.0.0.1:1",
            "--token",
            TOKEN,
        ],
    )
    .await;
    assert!(!ok, "no server, no success: {out}");
    assert!(err.contains("cannot reach"), "a readable message: {err}");
    assert!(!err.contains("panicked"), "{err}");

    let (ok, out, err) = toolfleet(
        &conf,
        &[
            "call",
            "find_expenses",
            r#"{"month":"2026-09"}"#,
            "--server",
            &base,
            "--token",
            TOKEN,
        ],
    )
    .await;
    assert!(ok, "{err}");
    let envelope: Value = serde_json::from_str(&out).expect("JSON on stdout");
    assert_eq!(envelope["status"], "ok", "{envelope}");
    assert_eq!(envelope["result"]["lines"].as_array().unwrap().len(), 50);
    let receipts: Vec<String> = envelope["result"]["lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["receipt_id"].as_str().map(str::to_owned))
        .take(2)
        .collect();
    assert_eq!(receipts.len(), 2);

    let args = json!({"receipt_ids": receipts}).to_string();
    let (ok, out, err) = toolfleet(
        &conf,
        &[
            "call",
            "start_receipt_ocr",
            &args,
            "--wait",
            "--server",
            &base,
            "--token",
            TOKEN,
        ],
    )
    .await;
    assert!(ok, "{err}");
    let settled: Value = serde_json::from_str(&out).expect("JSON on stdout");
    assert_eq!(settled["status"], "ok", "the settled envelope: {settled}");
    assert_eq!(settled["result"]["receipts"].as_array().unwrap().len(), 2);

    // A tool error is a failure of the command, with the code said.
    let (ok, out, err) = toolfleet(
        &conf,
        &[
            "call",
            "find_expenses",
            r#"{"month":"Sept"}"#,
            "--server",
            &base,
            "--token",
            TOKEN,
        ],
    )
    .await;
    assert!(!ok, "{out}");
    assert!(err.contains("invalid_arguments"), "{err}");

    let (ok, out, err) = toolfleet(
        &conf,
        &[
            "tools", "--format", "openai", "--server", &base, "--token", TOKEN,
        ],
    )
    .await;
    assert!(ok, "{err}");
    let specs: Value = serde_json::from_str(&out).expect("JSON on stdout");
    let specs = specs.as_array().expect("a list of specs");
    assert!(specs.iter().all(|s| s["type"] == "function"), "{specs:?}");
    assert!(
        specs
            .iter()
            .any(|s| s["function"]["name"] == "find_expenses"),
        "{specs:?}"
    );
}

/// `toolfleet bench runs` parks runs a caller drives on a held job and a
/// ticket each, in a server of its own on the embedded default, and
/// resumes every one once the jobs are released and the tickets answered:
/// no slot is held while the runs wait on their tickets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_parks_and_resumes_every_run() {
    let dir = TempDir::new("bench-runs");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_toolfleet"))
        .args(["bench", "runs", "-n", "20", "-c", "4", "--concurrency", "8"])
        .arg("--json")
        .current_dir(&dir.0)
        .env_remove("TOOLFLEET_CONFIG")
        .output()
        .expect("bench runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).expect("one JSON object on stdout");
    assert_eq!(report["runs"], 20, "{report}");
    assert_eq!(report["clients"], 4);
    assert_eq!(report["concurrency"], 8);
    assert_eq!(
        (&report["store"], &report["broker"]),
        (&json!("sqlite"), &json!("in-process"))
    );
    assert_eq!(report["park"]["parked"], 20);
    assert_eq!(report["park"]["run_to_waiting_ms"]["count"], 20);
    // Eight of the twenty jobs ran, on eight slots of the default pool;
    // the rest were queued.
    assert_eq!(report["slots"]["busy_with_jobs_held"], 8, "{report}");
    assert_eq!(report["slots"]["busy_waiting_on_tickets"], 0, "{report}");
    assert_eq!(report["slots"]["jobs_in_flight_waiting_on_tickets"], 0);
    let resume = &report["resume"];
    assert_eq!(resume["jobs_settled"], 20, "{report}");
    assert_eq!(resume["waiting_after_jobs"], 20, "{report}");
    assert_eq!(resume["answered"], 20);
    assert_eq!(resume["resumed"], 20, "{report}");
    assert_eq!(resume["resumed_before_answer"], 0);
    assert_eq!(resume["resumed_listed"], 20, "{report}");
    assert_eq!(resume["answer_to_resumed_ms"]["count"], 20);
    for memory in ["rss_before_kib", "rss_parked_kib", "rss_resumed_kib"] {
        assert!(report["memory"][memory].as_u64().unwrap() > 0, "{report}");
    }

    // Its flags are its own: the burn-down's are refused beside it.
    let mixed = std::process::Command::new(env!("CARGO_BIN_EXE_toolfleet"))
        .args(["bench", "--rate", "5", "runs"])
        .current_dir(&dir.0)
        .env_remove("TOOLFLEET_CONFIG")
        .output()
        .expect("bench runs");
    assert!(!mixed.status.success());
}

/// `toolfleet bench --server` drives a running server's no-op job tool (the
/// builtin `toolfleet.noop`) and reports every job settled, as one JSON
/// object with `--json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_drives_a_running_server() {
    let dir = common::TempDir::new("bench");
    let tables = "[[tools]]\nname = \"bench_noop\"\nshape = \"job\"\nexecutor = { kind = \"builtin\", name = \"toolfleet.noop\" }\n";
    let server = common::Server::start(&dir.0, &common::config(&dir.0, tables));
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_toolfleet"))
        .args(["bench", "--server", &server.base, "--token", common::TOKEN])
        .args([
            "-n", "40", "-c", "4", "--rate", "20", "--secs", "1", "--json",
        ])
        .output()
        .expect("bench runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("one JSON object on stdout");
    assert_eq!(report["servers"], json!([server.base]));
    assert_eq!(report["in_process"], false);
    assert_eq!(report["tool"], "bench_noop");
    let burn_down = &report["burn_down"];
    assert_eq!(burn_down["jobs"], 40);
    assert_eq!(burn_down["clients"], 4);
    assert_eq!(burn_down["settled"], 40);
    assert!(burn_down["jobs_per_second"].as_f64().unwrap() > 0.0);
    assert!(burn_down["calls_per_second"].as_f64().unwrap() > 0.0);
    // The bench's own clients took processor time for the 40 jobs.
    assert!(
        burn_down["process_cpu_us_per_job"].as_f64().unwrap() > 0.0,
        "{burn_down}"
    );
    let fixed_rate = &report["fixed_rate"];
    assert_eq!(fixed_rate["target_calls_per_second"], 20);
    assert_eq!(fixed_rate["duration_seconds"], 1);
    assert_eq!(fixed_rate["jobs"], 20);
    assert_eq!(fixed_rate["settled"], 20);
    for (run, count) in [(burn_down, 40), (fixed_rate, 20)] {
        for series in ["call_to_running_ms", "call_to_settled_ms"] {
            let latency = &run[series];
            let p50 = latency["p50"].as_f64().expect("p50");
            let p95 = latency["p95"].as_f64().expect("p95");
            let p99 = latency["p99"].as_f64().expect("p99");
            let max = latency["max"].as_f64().expect("max");
            assert!(
                0.0 <= p50 && p50 <= p95 && p95 <= p99 && p99 <= max,
                "{latency}"
            );
            assert_eq!(latency["count"], count, "{series}: {latency}");
        }
    }
}

/// `POST /v1/calls` takes `{"calls": [...]}`: each call validated and
/// answered on its own, in order (a job, a query, bad arguments, a key out
/// of bounds, an unknown tool), each key naming one job across batches;
/// more than 1,000 calls, or none, is a 400; `toolfleet call --batch`
/// makes a file's calls and prints each envelope on a line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_calls_is_answered_call_by_call_in_order() {
    let dir = TempDir::new("api-batch");
    let server = Server::start(&dir.0, &config(&dir.0, JOB_TOOLS));
    let alice = server.client(TOKEN);
    let receipts = receipt_ids(&alice, 2).await;
    let long_key = "k".repeat(300);
    let batch = json!({"calls": [
        {"tool": "start_receipt_ocr", "args": {"receipt_ids": [receipts[0]]}, "idempotency_key": "batch-1"},
        {"tool": "find_expenses", "args": {"month": "2026-09"}},
        {"tool": "find_expenses", "args": {"month": "September"}},
        {"tool": "quick", "idempotency_key": long_key},
        {"tool": "no_such_tool"},
        {"tool": "start_receipt_ocr", "args": {"receipt_ids": [receipts[1]]}},
    ]});
    let answered = alice.post("/v1/calls", batch.clone()).await;
    let results = answered["results"].as_array().unwrap();
    let statuses: Vec<&str> = results
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        ["running", "ok", "error", "error", "error", "running"],
        "{answered}"
    );
    assert_eq!(results[2]["error"]["code"], "invalid_arguments");
    assert_eq!(results[3]["error"]["code"], "bad_request");
    assert_eq!(results[4]["error"]["code"], "unknown_tool");
    assert_ne!(results[0]["job_id"], results[5]["job_id"]);
    let done = settle(&alice, results[0]["job_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "ok", "{done}");
    // The same key in another batch names the same job.
    let again = alice
        .post("/v1/calls", json!({"calls": [batch["calls"][0]]}))
        .await;
    assert_eq!(
        again["results"][0]["job_id"], results[0]["job_id"],
        "{again}"
    );
    // A batch larger than one task's share (125 calls) is still answered
    // in order: the same keys, reversed, name the same jobs, reversed.
    let keyed = |keys: Vec<usize>| {
        let calls: Vec<Value> = keys
            .into_iter()
            .map(|n| json!({"tool": "quick", "delay_s": 3600, "idempotency_key": format!("share-{n}")}))
            .collect();
        json!({ "calls": calls })
    };
    let job_ids = |answered: &Value| -> Vec<String> {
        answered["results"]
            .as_array()
            .expect("results")
            .iter()
            .map(|r| r["job_id"].as_str().expect("a job").to_owned())
            .collect()
    };
    let forward = job_ids(&alice.post("/v1/calls", keyed((0..300).collect())).await);
    let backward = job_ids(
        &alice
            .post("/v1/calls", keyed((0..300).rev().collect()))
            .await,
    );
    assert_eq!(forward.len(), 300);
    assert_eq!(
        forward.iter().collect::<BTreeSet<_>>().len(),
        300,
        "one job a key"
    );
    assert_eq!(backward, forward.into_iter().rev().collect::<Vec<_>>());
    // Out of bounds: none, or more than 1,000.
    for calls in [vec![], vec![json!({"tool": "find_expenses"}); 1001]] {
        let (status, body) = alice
            .raw(
                Method::POST,
                "/v1/calls",
                Some(json!({"calls": calls}).to_string().into_bytes()),
            )
            .await;
        assert_eq!(
            (status, &body["error"]["code"]),
            (400, &json!("bad_request")),
            "{body}"
        );
    }
    let (status, body) = alice
        .raw(
            Method::POST,
            "/v1/calls",
            Some(br#"{"calls": [{"tool": "a"}], "extra": 1}"#.to_vec()),
        )
        .await;
    assert_eq!(status, 400, "{body}");

    // From the command line: a file of calls, one a line.
    let file = dir.0.join("calls.jsonl");
    std::fs::write(
        &file,
        "{\"tool\": \"find_expenses\", \"args\": {\"month\": \"2026-09\"}}\n{\"tool\": \"quick\"}\n",
    )
    .unwrap();
    let out = common::toolfleet(&[
        "call",
        "--batch",
        file.to_str().unwrap(),
        "--server",
        &server.base,
        "--token",
        TOKEN,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let statuses: Vec<&str> = printed
        .iter()
        .map(|e| e["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["ok", "running"], "{stdout}");
}

// 10. Retrying failed and cancelled jobs.

/// Job tools with one attempt each: `flaky` fails until the marker its
/// first run leaves exists, `broken` always fails.
fn retry_tools(dir: &std::path::Path) -> String {
    let marker = dir.join("flaky-ran");
    let flaky = format!(
        "if [ -e {m} ]; then echo '{{\"ok\": true}}'; else touch {m}; exit 3; fi",
        m = marker.display()
    );
    format!(
        "{JOB_TOOLS}\n[[tools]]\nname = \"flaky\"\nshape = \"job\"\nmax_attempts = 1\nexecutor = {{ kind = \"exec\", program = \"/bin/sh\", args = [\"-c\", {flaky:?}] }}\n\n[[tools]]\nname = \"broken\"\nshape = \"job\"\nmax_attempts = 1\nexecutor = {{ kind = \"exec\", program = \"/bin/sh\", args = [\"-c\", \"exit 3\"] }}\n{}",
        reader_token()
    )
}

/// A failed job put back by its owner runs again under its own id and
/// succeeds; a job that succeeded or has not settled is not retried, and
/// another user's or tenant's reads as missing; a filter puts back every
/// job it names and says how many; the command line lists, shows and
/// retries; each retry is audited with who asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_is_retried_by_its_owner_and_succeeds() {
    let dir = TempDir::new("api-retry");
    let server = Server::start(&dir.0, &config_with(&dir.0, "", &retry_tools(&dir.0)));
    let alice = server.client(TOKEN);
    let flaky = start(&alice, "flaky", json!({})).await;
    let failed = settle(&alice, &flaky).await;
    assert_eq!(failed["state"], "failed", "{failed}");

    let retry = |client: &Client, id: &str| {
        let (client, path) = (client.clone(), format!("/v1/jobs/{id}/retry"));
        async move { client.post(&path, json!({})).await }
    };
    for other in [READER_TOKEN, OTHER_TOKEN] {
        let refused = retry(&server.client(other), &flaky).await;
        assert_eq!(refused["error"]["code"], "not_found", "{refused}");
    }
    let again = retry(&alice, &flaky).await;
    assert_eq!(
        (
            again["status"].as_str(),
            again["state"].as_str(),
            again["attempts"].as_u64()
        ),
        (Some("running"), Some("queued"), Some(0)),
        "{again}"
    );
    let done = settle(&alice, &flaky).await;
    assert_eq!(done["result"]["ok"], true, "{done}");
    let twice = retry(&alice, &flaky).await;
    assert_eq!(twice["error"]["code"], "conflict", "{twice}");
    assert!(
        twice["error"]["message"]
            .as_str()
            .unwrap()
            .contains("succeeded"),
        "{twice}"
    );
    let sleepy = start(&alice, "sleepy", json!({})).await;
    let busy = retry(&alice, &sleepy).await;
    assert_eq!(busy["error"]["code"], "conflict", "{busy}");
    assert!(
        busy["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cancel it first"),
        "{busy}"
    );
    alice
        .post(&format!("/v1/jobs/{sleepy}/cancel"), json!({}))
        .await;

    // By filter: both broken jobs go back, and fail again.
    let broken: Vec<String> = [
        start(&alice, "broken", json!({})).await,
        start(&alice, "broken", json!({})).await,
    ]
    .into();
    for id in &broken {
        assert_eq!(settle(&alice, id).await["state"], "failed");
    }
    let put = alice
        .post(
            "/v1/jobs/retry",
            json!({"tool": "broken", "state": "failed"}),
        )
        .await;
    assert_eq!(put["retried"], 2, "{put}");
    let named: BTreeSet<String> = put["job_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(named, broken.iter().cloned().collect(), "{put}");
    for id in &broken {
        let settled = settle(&alice, id).await;
        assert_eq!(settled["state"], "failed", "{settled}");
    }
    for (body, field) in [
        (json!({"state": "running"}), "`state`"),
        (json!({"limit": 0}), "`limit`"),
        (json!({"since": 5, "until": 5}), "`since`"),
    ] {
        let (status, answer) = alice
            .raw(
                Method::POST,
                "/v1/jobs/retry",
                Some(body.to_string().into_bytes()),
            )
            .await;
        assert_eq!(status, 400, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{body}: {message}");
    }
    let (status, _) = alice
        .raw(
            Method::POST,
            "/v1/jobs/retry",
            Some(br#"{"surprise": 1}"#.to_vec()),
        )
        .await;
    assert_eq!(status, 400);

    // The command line.
    let (conf, base) = (server.config.clone(), server.base.clone());
    let cli = |args: Vec<String>| {
        let conf = conf.clone();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            toolfleet(&conf, &args).await
        }
    };
    let at = |words: &[&str]| {
        let mut args: Vec<String> = words.iter().map(|w| (*w).to_owned()).collect();
        args.extend([
            "--server".to_owned(),
            base.clone(),
            "--token".to_owned(),
            TOKEN.to_owned(),
        ]);
        args
    };
    let (ok, out, err) = cli(at(&[
        "jobs", "list", "--state", "failed", "--tool", "broken",
    ]))
    .await;
    assert!(ok, "{err}");
    for id in &broken {
        assert!(out.contains(id.as_str()), "{out}");
    }
    let (ok, out, err) = cli(at(&["jobs", "retry", &broken[0]])).await;
    assert!(ok, "{err}");
    assert!(out.contains("\"queued\""), "{out}");
    assert_eq!(settle(&alice, &broken[0]).await["state"], "failed");
    let (ok, out, err) = cli(at(&["jobs", "show", &broken[0]])).await;
    assert!(ok && out.contains("\"failed\""), "{out} {err}");
    let (ok, _, err) = cli(at(&[
        "jobs",
        "show",
        "01a00000-0000-7000-8000-000000000000",
    ]))
    .await;
    assert!(!ok && err.contains("not_found"), "{err}");

    // Audited, with who asked and how it went.
    let db = dir.0.join("data").join("toolfleet.db");
    let audit = std::process::Command::new("sqlite3")
        .arg(&db)
        .arg("SELECT user || ':' || tool || ':' || status || ':' || COALESCE(error_code, '') FROM audit WHERE tool LIKE 'retry_job%' ORDER BY seq")
        .output()
        .expect("sqlite3 runs");
    let lines: Vec<String> = String::from_utf8_lossy(&audit.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert!(
        lines.contains(&"alice:retry_job:ok:".to_owned()),
        "{lines:?}"
    );
    assert!(
        lines.contains(&"bob:retry_job:error:not_found".to_owned()),
        "{lines:?}"
    );
    assert!(
        lines.contains(&"alice:retry_job:error:conflict".to_owned()),
        "{lines:?}"
    );
    assert!(
        lines.contains(&"alice:retry_jobs:ok:".to_owned()),
        "{lines:?}"
    );
}

// 11. Schedules.

/// A job tool done at once, and two schedules: acme's every second, as
/// alice, and globex's weekly.
fn schedule_tools() -> String {
    r#"
[[tools]]
name = "tick"
shape = "job"
description = "Done at once."
executor = { kind = "exec", program = "/bin/sh", args = ["-c", "echo '{\"ticked\": true}'"] }

[[schedules]]
name = "pulse"
cron = "* * * * * *"
timezone = "Europe/Berlin"
tool = "tick"
principal = { tenant = "acme", user = "alice" }
overlap = "allow"

[[schedules]]
name = "weekly"
cron = "0 9 * * MON"
tool = "tick"
principal = { tenant = "globex", user = "mallory" }
catch_up = "none"
"#
    .to_owned()
}

/// How many jobs of `tick` alice's list holds (at most 100).
async fn ticks(alice: &Client) -> usize {
    alice.get("/v1/jobs?tool=tick&limit=100").await["jobs"]
        .as_array()
        .map_or(0, Vec::len)
}

/// `GET /v1/schedules` shows each caller its own tenant's schedules, with
/// next ticks and the last job; a schedule ticking every second makes jobs;
/// paused it makes none until resumed; another tenant's reads as missing;
/// pauses are audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_starts_jobs_at_its_ticks_and_pauses_for_the_fleet() {
    let dir = TempDir::new("api-schedules");
    let server = Server::start(&dir.0, &config_with(&dir.0, "", &schedule_tools()));
    let alice = server.client(TOKEN);
    let mallory = server.client(OTHER_TOKEN);

    let ticked = eventually(Duration::from_secs(10), || {
        let alice = alice.clone();
        async move {
            let listed = alice.get("/v1/schedules").await;
            let state = &listed["schedules"][0]["last_job"]["state"];
            (state == "succeeded").then_some(listed)
        }
    })
    .await;
    let shown = ticked["schedules"].as_array().unwrap();
    assert_eq!(shown.len(), 1, "only acme's: {ticked}");
    let pulse = &shown[0];
    assert_eq!(
        (
            pulse["name"].as_str(),
            pulse["cron"].as_str(),
            pulse["timezone"].as_str(),
            pulse["tool"].as_str(),
            pulse["overlap"].as_str(),
            pulse["catch_up"].as_str(),
            pulse["paused"].as_bool()
        ),
        (
            Some("pulse"),
            Some("* * * * * *"),
            Some("Europe/Berlin"),
            Some("tick"),
            Some("allow"),
            Some("last"),
            Some(false)
        ),
        "{pulse}"
    );
    let next: Vec<&str> = pulse["next_ticks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(next.len(), 3, "{pulse}");
    assert!(next.windows(2).all(|w| w[0] < w[1]), "{next:?}");
    assert!(pulse["last_tick"].as_str().is_some(), "{pulse}");
    let job_id = pulse["last_job"]["job_id"].as_str().unwrap();
    let job = alice.get(&format!("/v1/jobs/{job_id}")).await;
    assert_eq!(job["result"]["ticked"], true, "the job is alice's: {job}");

    let globex = mallory.get("/v1/schedules").await;
    let names: Vec<&str> = globex["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["weekly"], "{globex}");
    assert_eq!(globex["schedules"][0]["last_job"], Value::Null);
    let refused = mallory.post("/v1/schedules/pulse/pause", json!({})).await;
    assert_eq!(refused["error"]["code"], "not_found", "{refused}");
    let missing = alice.post("/v1/schedules/nope/pause", json!({})).await;
    assert_eq!(missing["error"]["code"], "not_found", "{missing}");

    let paused = alice.post("/v1/schedules/pulse/pause", json!({})).await;
    assert_eq!(paused["paused"], true, "{paused}");
    assert_eq!(paused["next_ticks"], json!([]), "{paused}");
    // A tick started just before the pause may still settle.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let before = ticks(&alice).await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(ticks(&alice).await, before, "no job while paused");
    let resumed = alice.post("/v1/schedules/pulse/resume", json!({})).await;
    assert_eq!(resumed["paused"], false, "{resumed}");
    eventually(Duration::from_secs(10), || {
        let alice = alice.clone();
        async move { (ticks(&alice).await > before).then_some(()) }
    })
    .await;

    let db = dir.0.join("data").join("toolfleet.db");
    let audit = std::process::Command::new("sqlite3")
        .arg(&db)
        .arg("SELECT user || ':' || tool || ':' || status || ':' || COALESCE(error_code, '') FROM audit WHERE tool LIKE '%_schedule' ORDER BY seq")
        .output()
        .expect("sqlite3 runs");
    let lines: Vec<String> = String::from_utf8_lossy(&audit.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    for line in [
        "mallory:pause_schedule:error:not_found",
        "alice:pause_schedule:ok:",
        "alice:resume_schedule:ok:",
    ] {
        assert!(lines.contains(&line.to_owned()), "{line} in {lines:?}");
    }
}

#[test]
fn a_schedule_that_cannot_tick_is_refused_at_start_naming_its_field() {
    let tick = r#"
[[tools]]
name = "tick"
shape = "job"
executor = { kind = "exec", program = "/bin/sh", args = ["-c", "echo {}"] }
"#;
    let with = |schedule: &str| {
        format!(
            "{tick}\n[[schedules]]\n{schedule}\nprincipal = {{ tenant = \"acme\", user = \"alice\" }}\n"
        )
    };
    refused_at_start(
        &with("name = \"a\"\ncron = \"every day\"\ntool = \"tick\""),
        "schedules.a.cron",
    );
    refused_at_start(
        &with("name = \"a\"\ncron = \"0 3 * * *\"\ntimezone = \"Mars/Base\"\ntool = \"tick\""),
        "schedules.a.timezone",
    );
    refused_at_start(
        &with("name = \"a\"\ncron = \"0 3 * * *\"\ntool = \"nope\""),
        "schedules.a.tool",
    );
    refused_at_start(
        &with("name = \"a\"\ncron = \"0 3 * * *\"\ntool = \"find_expenses\""),
        "a schedule starts job or agent tools",
    );
    refused_at_start(
        &with("name = \"a\"\ncron = \"0 3 * * *\"\ntool = \"tick\"\novercap = 1"),
        "overcap",
    );
}

/// A toolfleet process refuses transparent huge pages (`without_huge_pages`
/// in the binary's `main`): the kernel says so in the process's status,
/// whatever the host's `transparent_hugepage/enabled`.
#[cfg(target_os = "linux")]
#[test]
fn a_toolfleet_process_runs_without_transparent_huge_pages() {
    let dir = TempDir::new("api-thp");
    let server = Server::start(&dir.0, &config(&dir.0, ""));
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id()))
        .expect("the process's status");
    let line = status
        .lines()
        .find(|line| line.starts_with("THP_enabled:"))
        .expect("the kernel reports THP_enabled");
    assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
}
