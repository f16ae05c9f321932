//! The worked example of DESIGN.md, end to end over HTTP against a real
//! `toolfleet serve` process: two pages of expenses, the OCR job polled and
//! also announced by webhook and SSE, the ask_user ticket answered, dry run
//! then commit, and the retried commit returning the same report id.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{OTHER_TOKEN, Server, TOKEN, TempDir, config, events, eventually, settle};
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A webhook receiver: records each request's signature header and body.
async fn receiver() -> (String, Arc<Mutex<Vec<(String, String)>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let store = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let store = store.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let n = socket.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let head = &text[..end];
                        let length: usize = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + length {
                            let signature = head
                                .lines()
                                .find_map(|l| {
                                    l.to_ascii_lowercase()
                                        .starts_with("toolfleet-signature:")
                                        .then(|| l[20..].trim().to_owned())
                                })
                                .unwrap_or_default();
                            let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + length])
                                .to_string();
                            store.lock().unwrap().push((signature, body));
                            let _ = socket
                                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                                .await;
                            break;
                        }
                    }
                }
            });
        }
    });
    (url, seen)
}

fn verify(signature: &str, body: &str) -> bool {
    let Some((t, v1)) = signature.split_once(",v1=") else {
        return false;
    };
    let t = t.trim_start_matches("t=");
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(b"test-webhook-key").unwrap();
    mac.update(format!("{t}.{body}").as_bytes());
    hex::encode(mac.finalize().into_bytes()) == v1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_my_september_expenses_over_http() {
    let dir = TempDir::new("worked");
    let server = Server::start(&dir.0, &config(&dir.0, ""));
    let alice = server.client(TOKEN);
    let mallory = server.client(OTHER_TOKEN);
    let alice_events = events(&alice);
    let mallory_events = events(&mallory);
    let (hook, hooks) = receiver().await;
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
        async move { hooks.lock().unwrap().first().cloned() }
    })
    .await;
    assert!(
        verify(&signature, &body),
        "the webhook is signed as API.md says: {signature}"
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
}
