//! Runs end to end over HTTP against a real `toolfleet serve`: the seed's
//! worked example as a run of `expense_assistant` (pages, the OCR job and
//! the person's question awaited together with the run parked and no
//! worker slot held, a SIGKILL and a restart while it waits, the dry run,
//! the approval, the commit, a retried commit), and the bad input of runs,
//! waits and approvals.

mod common;

use std::time::Duration;

use common::{OTHER_TOKEN, Server, TOKEN, TempDir, config_with, eventually};
use serde_json::{Value, json};
use toolfleet_agent::model::Usage;
use toolfleet_agent::testing::{CONFIRM_TOKEN, Scripted, ScriptedModel};

fn usage() -> Usage {
    Usage {
        input_tokens: 300,
        output_tokens: 30,
    }
}

fn calls(calls: Vec<(&str, Value)>) -> Scripted {
    Scripted::Calls {
        calls: calls.into_iter().map(|(n, a)| (n.to_owned(), a)).collect(),
        usage: usage(),
    }
}

/// The run as it stands.
async fn run_of(client: &common::Client, run: &str) -> Value {
    client.get(&format!("/v1/runs/{run}")).await["result"].clone()
}

/// Waits until the run is in `state`, answering it then.
async fn run_in(client: &common::Client, run: &str, state: &str) -> Value {
    eventually(Duration::from_secs(30), || {
        let client = client.clone();
        let (run, state) = (run.to_owned(), state.to_owned());
        async move {
            let now = run_of(&client, &run).await;
            (now["state"] == state.as_str()).then_some(now)
        }
    })
    .await
}

/// The busy slots of `pool` in the process's metrics.
async fn busy_slots(client: &common::Client, pool: &str) -> Option<f64> {
    let text = client
        .http
        .get(format!("{}/metrics", client.base))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let series = format!("toolfleet_worker_busy_slots{{pool=\"{pool}\"}}");
    text.lines()
        .find(|l| l.starts_with(&series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worked_example_runs_as_a_parked_and_resumed_run_of_the_assistant() {
    let model = ScriptedModel::start().await;
    let dir = TempDir::new("runs-worked");
    let config = config_with(&dir.0, "", "");
    let env = [("EXPENSES_MODEL_URL", model.base_url())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let path = dir.0.join("toolfleet.toml");
    std::fs::write(&path, &config).unwrap();
    let mut server = Server::start_role_env(&path, "serve", "toolfleet serving on ", &env);
    let alice = server.client(TOKEN);

    // What the script needs to know of the month: the second page's cursor,
    // the receipts without an amount, the lines with one.
    let first = alice
        .call("find_expenses", json!({"month": "2026-09"}))
        .await;
    let cursor = first["result"]["next_cursor"].as_str().unwrap().to_owned();
    let second = alice
        .call(
            "find_expenses",
            json!({"month": "2026-09", "cursor": cursor}),
        )
        .await;
    let lines: Vec<Value> = [&first, &second]
        .iter()
        .flat_map(|p| p["result"]["lines"].as_array().unwrap().clone())
        .collect();
    let receipts: Vec<&str> = lines
        .iter()
        .filter(|l| l["amount_cents"].is_null())
        .map(|l| l["receipt_id"].as_str().unwrap())
        .collect();
    let known: Vec<&str> = lines
        .iter()
        .filter(|l| !l["amount_cents"].is_null())
        .map(|l| l["id"].as_str().unwrap())
        .collect();
    let submit =
        json!({"line_ids": known, "categories": {"exp-020": "travel", "exp-040": "travel"}});
    let mut dry = submit.clone();
    dry["dry_run"] = json!(true);
    let mut commit = submit.clone();
    commit["dry_run"] = json!(false);
    commit["confirm_token"] = json!(CONFIRM_TOKEN);
    model.script(
        "llama3.1",
        vec![
            calls(vec![("find_expenses", json!({"month": "2026-09"}))]),
            calls(vec![("find_expenses", json!({"month": "2026-09", "cursor": cursor}))]),
            // Started together, awaited together.
            calls(vec![
                ("start_receipt_ocr", json!({"receipt_ids": receipts})),
                (
                    "ask_user",
                    json!({"question": "Are lines exp-020 and exp-040 travel or meals?", "options": ["travel", "meals"]}),
                ),
            ]),
            calls(vec![("submit_report", dry)]),
            calls(vec![("submit_report", commit.clone())]),
            Scripted::Answer {
                text: "Your September report is submitted.".into(),
                usage: usage(),
            },
        ],
    );

    let started = alice
        .post(
            "/v1/runs",
            json!({"agent": "expense_assistant", "input": "Submit my expenses for 2026-09."}),
        )
        .await;
    assert_eq!(started["status"], "ok", "{started}");
    let run = started["result"]["run_id"].as_str().unwrap().to_owned();

    // Parked on the OCR job and the question at once.
    let waiting = run_in(&alice, &run, "waiting").await;
    let wait = &waiting["wait"];
    let tickets = wait["tickets"].as_array().unwrap().clone();
    assert_eq!(tickets.len(), 1, "{waiting}");
    let question = tickets[0].as_str().unwrap().to_owned();
    // The job settles; the run still waits for the person, holding no slot.
    let still = eventually(Duration::from_secs(30), || {
        let alice = alice.clone();
        let run = run.clone();
        async move {
            let now = run_of(&alice, &run).await;
            let job_done = now["transcript"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["type"] == "tool_result" && e["tool"] == "start_receipt_ocr");
            (job_done || (now["wait"]["jobs"].as_array().is_some_and(|j| j.is_empty())))
                .then_some(now)
        }
    })
    .await;
    assert_eq!(still["state"], "waiting", "{still}");
    assert_eq!(busy_slots(&alice, "agents").await, Some(0.0));
    assert_eq!(
        model.requests("llama3.1").len(),
        3,
        "no model call while it waits"
    );

    // The next morning: every process killed, started again.
    server.kill();
    let mut server = Server::start_role_env(&path, "serve", "toolfleet serving on ", &env);
    let alice = server.client(TOKEN);
    let inbox = alice.get("/v1/tickets?state=open").await;
    let listed: Vec<&str> = inbox["result"]["tickets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["ticket"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [question.as_str()], "{inbox}");
    let answered = alice
        .post(
            &format!("/v1/tickets/{question}/answer"),
            json!({"answer": "travel"}),
        )
        .await;
    assert_eq!(answered["status"], "ok", "{answered}");

    // The dry run, then the commit waits for its approval.
    let approving = eventually(Duration::from_secs(30), || {
        let alice = alice.clone();
        async move {
            let inbox = alice.get("/v1/tickets?state=open&kind=approval").await;
            inbox["result"]["tickets"][0]
                .get("ticket")
                .and_then(Value::as_str)
                .map(str::to_owned)
        }
    })
    .await;
    let ticket = alice.get(&format!("/v1/tickets/{approving}")).await;
    assert_eq!(ticket["result"]["kind"], "approval", "{ticket}");
    assert_eq!(ticket["result"]["plan"]["lines"], known.len(), "{ticket}");
    let parked = run_in(&alice, &run, "waiting").await;
    assert_eq!(parked["wait"]["tickets"][0], approving.as_str());
    // Answering an approval as a question is refused, nothing changes.
    let wrong = alice
        .post(
            &format!("/v1/tickets/{approving}/answer"),
            json!({"answer": "yes"}),
        )
        .await;
    assert_eq!(wrong["error"]["code"], "invalid_arguments", "{wrong}");

    let approved = common::toolfleet(&[
        "--config",
        path.to_str().unwrap(),
        "approve",
        &approving,
        "--server",
        &server.base,
        "--token",
        TOKEN,
    ]);
    assert!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    let done = run_in(&alice, &run, "answered").await;
    assert_eq!(done["answer"], "Your September report is submitted.");
    let approval = alice.get(&format!("/v1/tickets/{approving}")).await;
    let report = approval["result"]["outcome"]["result"]["report_id"].clone();
    assert!(report.is_string(), "{approval}");

    // A retried commit, as the run made it, answers the same report.
    let again = alice_args(&done);
    assert!(
        again["confirm_token"].as_str().unwrap().starts_with("ct1."),
        "{again}"
    );
    let retried = alice.call("submit_report", again).await;
    assert_eq!(retried["result"]["report_id"], report, "{retried}");

    // The transcript shows each step in order.
    let kinds: Vec<String> = done["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let kind = e["type"].as_str().unwrap();
            match e["tool"].as_str() {
                Some(tool) => format!("{kind}:{tool}"),
                None => kind.to_owned(),
            }
        })
        .collect();
    for expected in [
        "user",
        "model",
        "tool_call:find_expenses",
        "tool_call:start_receipt_ocr",
        "tool_call:ask_user",
        "wait",
        "tool_result:start_receipt_ocr",
        "resume",
        "tool_result:ask_user",
        "tool_call:submit_report",
        "tool_result:submit_report",
    ] {
        assert!(
            kinds.iter().any(|k| k == expected),
            "{expected} in {kinds:?}"
        );
    }
    assert_eq!(done["usage"]["steps"], 6, "{done}");
    server.kill();
}

/// The commit's arguments as the run made them: the last `submit_report`
/// call of the transcript.
fn alice_args(run: &Value) -> Value {
    run["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|e| e["type"] == "tool_call" && e["tool"] == "submit_report")
        .map(|e| e["args"].clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_to_runs_waits_and_approvals_is_a_clear_error() {
    let dir = TempDir::new("runs-bad");
    let bound = "[limits]\nrun_checkpoint_bytes = 1000\n";
    let server = Server::start(&dir.0, &config_with(&dir.0, "", bound));
    let alice = server.client(TOKEN);
    let mallory = server.client(OTHER_TOKEN);

    let unknown = alice
        .post("/v1/runs", json!({"agent": "nobody", "input": "hi"}))
        .await;
    assert_eq!(unknown["error"]["code"], "invalid_arguments", "{unknown}");
    assert!(
        unknown["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expense_assistant"),
        "{unknown}"
    );

    // A run the caller drives, and a job of alice's.
    let run = alice
        .post("/v1/runs", json!({"checkpoint": {"messages": []}}))
        .await;
    let run = run["result"]["run_id"].as_str().unwrap().to_owned();
    let job = alice
        .call("start_receipt_ocr", json!({"receipt_ids": ["rcpt-005"]}))
        .await;
    let job = job["job_id"].as_str().unwrap().to_owned();
    // Another tenant's run and job read as missing.
    let theirs = mallory.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(theirs["error"]["code"], "not_found", "{theirs}");
    let their_run = mallory.post("/v1/runs", json!({"checkpoint": {}})).await;
    let their_run = their_run["result"]["run_id"].as_str().unwrap().to_owned();
    let on_other = mallory
        .post(
            &format!("/v1/runs/{their_run}/wait"),
            json!({"jobs": [job]}),
        )
        .await;
    assert_eq!(on_other["error"]["code"], "not_found", "{on_other}");
    let missing = mallory
        .post(
            &format!("/v1/runs/{their_run}/wait"),
            json!({"jobs": ["0190aaaa-0000-7000-8000-000000000000"]}),
        )
        .await;
    assert_eq!(
        on_other["error"]["message"]
            .as_str()
            .map(|m| m.replace(&job, "ID")),
        missing["error"]["message"]
            .as_str()
            .map(|m| m.replace("0190aaaa-0000-7000-8000-000000000000", "ID")),
        "another's job answers exactly as a missing one"
    );
    // A checkpoint over the bound.
    let big = "x".repeat(2000);
    let over = alice
        .post(
            &format!("/v1/runs/{run}/wait"),
            json!({"jobs": [job], "checkpoint": {"blob": big}}),
        )
        .await;
    assert_eq!(over["error"]["code"], "payload_too_large", "{over}");
    // Nothing was lost: the run still runs, and waits now.
    assert_eq!(run_of(&alice, &run).await["state"], "running");
    let waited = alice
        .post(
            &format!("/v1/runs/{run}/wait"),
            json!({"for": "all", "jobs": [job], "checkpoint": {"messages": ["kept"]}}),
        )
        .await;
    assert_eq!(waited["status"], "ok", "{waited}");
    let resumed = run_in(&alice, &run, "running").await;
    assert_eq!(
        resumed["resumed"]["checkpoint"]["messages"][0], "kept",
        "{resumed}"
    );
    assert_eq!(
        resumed["resumed"]["items"][0]["envelope"]["status"], "ok",
        "{resumed}"
    );

    // `messages` to a run that is not an answered assistant's.
    let message = alice
        .post(
            &format!("/v1/runs/{run}/messages"),
            json!({"content": "next"}),
        )
        .await;
    assert_eq!(message["error"]["code"], "conflict", "{message}");

    // Approving a question, or a ticket of nobody's.
    let asked = alice
        .call(
            "ask_user",
            json!({"question": "Which?", "options": ["a", "b"]}),
        )
        .await;
    let question = asked["ticket"].as_str().unwrap().to_owned();
    let approve = alice
        .post(&format!("/v1/tickets/{question}/approve"), json!({}))
        .await;
    assert_eq!(approve["error"]["code"], "invalid_arguments", "{approve}");
    let theirs = mallory
        .post(&format!("/v1/tickets/{question}/approve"), json!({}))
        .await;
    assert_eq!(theirs["error"]["code"], "not_found", "{theirs}");
    // The inbox lists it for alice, not for mallory.
    let inbox = alice.get("/v1/tickets?state=open&kind=question").await;
    assert_eq!(inbox["result"]["tickets"][0]["ticket"], question.as_str());
    let empty = mallory.get("/v1/tickets").await;
    assert_eq!(empty["result"]["tickets"], json!([]), "{empty}");
    let (status, bad) = alice
        .raw(reqwest::Method::GET, "/v1/tickets?state=sideways", None)
        .await;
    assert_eq!(
        (status, &bad["error"]["code"]),
        (400, &json!("bad_request")),
        "{bad}"
    );
}

/// A command declaring `approval` waits for it whoever calls; approving
/// runs the commit once, a settled approval cannot be decided again, and
/// rejecting answers `rejected` with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_declaring_approval_commits_once_approved_or_is_rejected() {
    let dir = TempDir::new("runs-approval");
    let extra = r#"
[[tools]]
name = "submit_approved"
shape = "command"
description = "Submit expense lines, with a manager's approval."
input_schema = { type = "object", additionalProperties = false, required = ["line_ids", "dry_run"], properties = { line_ids = { type = "array", minItems = 1, items = { type = "string" } }, dry_run = { type = "boolean" }, categories = { type = "object" } } }
approval = "caller"
executor = { kind = "builtin", name = "expenses.submit" }
"#;
    let server = Server::start(&dir.0, &config_with(&dir.0, "", extra));
    let alice = server.client(TOKEN);
    let args = json!({"line_ids": ["exp-001", "exp-002"], "dry_run": true});
    let dry = alice.call("submit_approved", args.clone()).await;
    assert_eq!(dry["status"], "ok", "{dry}");
    let mut commit = args.clone();
    commit["dry_run"] = json!(false);
    commit["confirm_token"] = dry["result"]["confirm_token"].clone();
    let suspended = alice.call("submit_approved", commit.clone()).await;
    assert_eq!(suspended["status"], "suspended", "{suspended}");
    assert_eq!(suspended["plan"]["lines"], 2, "{suspended}");
    let ticket = suspended["ticket"].as_str().unwrap().to_owned();
    // The same commit again waits on the same ticket.
    let again = alice.call("submit_approved", commit.clone()).await;
    assert_eq!(again["ticket"], ticket.as_str(), "{again}");
    let approved = alice
        .post(&format!("/v1/tickets/{ticket}/approve"), json!({}))
        .await;
    assert_eq!(approved["status"], "ok", "{approved}");
    let report = approved["result"]["outcome"]["result"]["report_id"].clone();
    assert!(report.is_string(), "{approved}");
    let twice = alice
        .post(&format!("/v1/tickets/{ticket}/approve"), json!({}))
        .await;
    assert_eq!(twice["error"]["code"], "conflict", "{twice}");
    let retried = alice.call("submit_approved", commit).await;
    assert_eq!(retried["result"]["report_id"], report, "{retried}");

    // Another plan, rejected with a reason.
    let args = json!({"line_ids": ["exp-003"], "dry_run": true});
    let dry = alice.call("submit_approved", args.clone()).await;
    let mut commit = args;
    commit["dry_run"] = json!(false);
    commit["confirm_token"] = dry["result"]["confirm_token"].clone();
    let suspended = alice.call("submit_approved", commit.clone()).await;
    let ticket = suspended["ticket"].as_str().unwrap().to_owned();
    let rejected = alice
        .post(
            &format!("/v1/tickets/{ticket}/reject"),
            json!({"reason": "not this month"}),
        )
        .await;
    assert_eq!(
        rejected["result"]["outcome"]["error"]["code"], "rejected",
        "{rejected}"
    );
    let after = alice.call("submit_approved", commit).await;
    assert_eq!(after["error"]["code"], "rejected", "{after}");
    assert!(
        after["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not this month"),
        "{after}"
    );
}
