//! The worked example of docs/ARCHITECTURE.md, end to end over HTTP against a real
//! `toolfleet serve` process: two pages of expenses, the OCR job polled and
//! also announced by webhook and SSE, the ask_user ticket answered, dry run
//! then commit, and the retried commit returning the same report id.

mod common;

use std::time::Duration;

use common::{
    OTHER_TOKEN, Server, TOKEN, TempDir, config, events, eventually, hook_receiver, settle, signed,
};
use serde_json::{Value, json};
use toolfleet_agent::model::Usage;
use toolfleet_agent::testing::{Scripted, ScriptedModel};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_my_september_expenses_over_http() {
    let dir = TempDir::new("worked");
    // The sub-agent's model: a scripted server speaking OpenAI's format.
    let model = ScriptedModel::start().await;
    let config_file = dir.0.join("toolfleet.toml");
    std::fs::write(&config_file, config(&dir.0, "")).unwrap();
    let server = Server::start_role_env(
        &config_file,
        "serve",
        "toolfleet serving on ",
        &[("EXPENSES_MODEL_URL", model.base_url().as_str())],
    );
    let alice = server.client(TOKEN);
    let mallory = server.client(OTHER_TOKEN);
    let alice_events = events(&alice);
    let mallory_events = events(&mallory);
    let (hook, hooks) = hook_receiver(vec![200]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Two pages.
    let first = alice
        .call("find_expenses", json!({"month": "2026-09"}))
        .await;
    assert_eq!(first["status"], "ok", "{first}");
    assert_eq!(first["result"]["lines"].as_array().unwrap().len(), 50);
    let cursor = first["result"]["next_cursor"].as_str().unwrap();
    let second = alice
        .call(
            "find_expenses",
            json!({"month": "2026-09", "cursor": cursor}),
        )
        .await;
    assert_eq!(second["result"]["lines"].as_array().unwrap().len(), 12);
    assert!(second["result"].get("next_cursor").is_none());
    let lines: Vec<Value> = [&first, &second]
        .iter()
        .flat_map(|p| p["result"]["lines"].as_array().unwrap().clone())
        .collect();

    // The OCR job: running at once, settled later, announced three ways.
    let receipts: Vec<&str> = lines
        .iter()
        .filter(|l| l["amount_cents"].is_null())
        .map(|l| l["receipt_id"].as_str().unwrap())
        .collect();
    assert_eq!(receipts.len(), 6);
    let started = alice
        .post("/v1/calls", json!({"tool": "start_receipt_ocr", "args": {"receipt_ids": receipts}, "callback_url": hook, "run_id": "run-sept"}))
        .await;
    assert_eq!(started["status"], "running", "{started}");
    assert_eq!(started["poll_after_s"], 20);
    let job_id = started["job_id"].as_str().unwrap().to_owned();
    let done = settle(&alice, &job_id).await;
    assert_eq!(done["status"], "ok", "{done}");
    assert_eq!(done["result"]["receipts"].as_array().unwrap().len(), 6);
    let (signature, body) = eventually(Duration::from_secs(10), || {
        let hooks = hooks.clone();
        async move {
            let hooks = hooks.lock().unwrap();
            hooks.first().map(|h| (h.signature.clone(), h.body.clone()))
        }
    })
    .await;
    assert!(
        signed(&signature, &body),
        "the webhook is signed as docs/API.md says: {signature}"
    );
    let notice: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (
            notice["event"].as_str(),
            notice["run_id"].as_str(),
            notice["status"].as_str()
        ),
        (Some("job.succeeded"), Some("run-sept"), Some("ok"))
    );
    assert_eq!(notice["result"], done["result"]);
    eventually(Duration::from_secs(5), || {
        let seen = alice_events.clone();
        let id = job_id.clone();
        async move {
            seen.lock()
                .unwrap()
                .iter()
                .any(|e| e["id"] == id.as_str() && e["state"] == "succeeded")
                .then_some(())
        }
    })
    .await;

    // The question, answered.
    let asked = alice.call("ask_user", json!({"question": "Are exp-020 and exp-040 travel or meals?", "options": ["travel", "meals"]})).await;
    assert_eq!(asked["status"], "suspended", "{asked}");
    let ticket = asked["ticket"].as_str().unwrap().to_owned();
    let open = alice.get(&format!("/v1/tickets/{ticket}")).await;
    assert_eq!(open["result"]["state"], "open");
    let wrong = alice
        .post(
            &format!("/v1/tickets/{ticket}/answer"),
            json!({"answer": "lodging"}),
        )
        .await;
    assert_eq!(wrong["error"]["code"], "invalid_arguments");
    let answered = alice
        .post(
            &format!("/v1/tickets/{ticket}/answer"),
            json!({"answer": "travel"}),
        )
        .await;
    assert_eq!(answered["result"]["answer"], "travel");
    let twice = alice
        .post(
            &format!("/v1/tickets/{ticket}/answer"),
            json!({"answer": "meals"}),
        )
        .await;
    assert_eq!(twice["error"]["code"], "conflict");

    // Dry run, then commit; a retried commit answers the same report.
    let ids: Vec<&str> = lines.iter().map(|l| l["id"].as_str().unwrap()).collect();
    let args = json!({"line_ids": ids, "dry_run": true, "categories": {"exp-020": "travel", "exp-040": "travel"}});
    let dry = alice.call("submit_report", args.clone()).await;
    assert_eq!(dry["result"]["plan"]["lines"], 62, "{dry}");
    assert_eq!(
        dry["result"]["plan"]["policy_flags"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let mut commit = args;
    commit["dry_run"] = json!(false);
    commit["confirm_token"] = dry["result"]["confirm_token"].clone();
    let report = alice.call("submit_report", commit.clone()).await;
    assert_eq!(report["status"], "ok", "{report}");
    let retried = alice.call("submit_report", commit).await;
    assert_eq!(
        report["result"]["report_id"],
        retried["result"]["report_id"]
    );

    // The other tenant sees none of it.
    let theirs = mallory.get(&format!("/v1/jobs/{job_id}")).await;
    let missing = mallory
        .get("/v1/jobs/01a00000-0000-7000-8000-000000000000")
        .await;
    assert_eq!(theirs["error"]["code"], "not_found");
    assert_eq!(
        theirs["error"]["message"]
            .as_str()
            .unwrap()
            .replace(&job_id, "X"),
        missing["error"]["message"]
            .as_str()
            .unwrap()
            .replace("01a00000-0000-7000-8000-000000000000", "X")
    );
    assert_eq!(
        mallory
            .post(&format!("/v1/jobs/{job_id}/cancel"), json!({}))
            .await["error"]["code"],
        "not_found"
    );
    assert_eq!(
        mallory.get(&format!("/v1/tickets/{ticket}")).await["error"]["code"],
        "not_found"
    );
    assert!(
        mallory.get("/v1/jobs").await["jobs"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        alice.get("/v1/jobs").await["jobs"][0]["job_id"],
        job_id.as_str()
    );
    assert!(
        mallory_events
            .lock()
            .unwrap()
            .iter()
            .all(|e| e["id"] != job_id.as_str() && e["id"] != ticket.as_str())
    );
    assert!(!alice_events.lock().unwrap().is_empty());

    // A sub-agent reconciles the month: it pages through the lines, reads
    // the receipts, and explains the total, citing the calls it relied on.
    let tokens = Usage {
        input_tokens: 400,
        output_tokens: 40,
    };
    let find = |args: Value| Scripted::Calls {
        calls: vec![("find_expenses".into(), args)],
        usage: tokens,
    };
    model.script(
        "llama3.1",
        vec![
            find(json!({"month": "2026-09"})),
            find(json!({"month": "2026-09", "cursor": cursor})),
            Scripted::Calls {
                calls: vec![("start_receipt_ocr".into(), json!({"receipt_ids": receipts}))],
                usage: tokens,
            },
            Scripted::Answer {
                text: "September 2026: 62 lines; the 6 receipts without an amount were read."
                    .into(),
                usage: tokens,
            },
        ],
    );
    let started = alice
        .call(
            "reconcile_month",
            json!({"task": "Reconcile 2026-09 and explain the total."}),
        )
        .await;
    assert_eq!(started["status"], "running", "{started}");
    let reconciled = settle(&alice, started["job_id"].as_str().unwrap()).await;
    let out = &reconciled["result"];
    assert_eq!(out["status"], "answered", "{reconciled}");
    assert!(out["answer"].as_str().unwrap().contains("62 lines"));
    let relied: Vec<&str> = out["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["tool"].as_str().unwrap())
        .collect();
    assert_eq!(
        relied,
        ["find_expenses", "find_expenses", "start_receipt_ocr"]
    );
    assert_eq!(out["usage"]["steps"], 4);
    assert_eq!(out["usage"]["total_tokens"], 4 * 440);
    // The model was offered the agent's two tools, and nothing else.
    let offered = model.requests("llama3.1")[0]["tools"].clone();
    let names: Vec<&str> = offered
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["find_expenses", "start_receipt_ocr"]);
}
