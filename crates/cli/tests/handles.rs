//! Handles kept in the store: a handle tool's large result, written through
//! one dispatcher, is read through another, and through both again after
//! both were killed and started anew (PostgreSQL); on the embedded default,
//! after `serve` restarts (SQLite). The kept result is redacted as its tool
//! declares, and another tenant's or user's read of it answers as a
//! missing handle does.

mod common;

use std::path::Path;

use common::{Client, OTHER_TOKEN, Server, TOKEN, TempDir, config_with, shared_fleet};
use serde_json::{Value, json};

/// A handle tool whose result (a list of 30 cards) is over its threshold,
/// with the card numbers redacted.
fn ledger_tool(_: &Path) -> String {
    let rows: Vec<Value> = (0..30)
        .map(|n| json!({"n": n, "card_number": "4111111111111111", "holder": "Ada"}))
        .collect();
    let program = format!("echo '{}'", Value::Array(rows)).replace('"', "\\\"");
    format!(
        r#"
[[tools]]
name = "export_ledger"
description = "Exports the ledger, as a handle."
shape = "handle"
handle_threshold = 64
input_schema = {{ type = "object" }}
middleware = {{ redact = ["card_number"] }}
executor = {{ kind = "exec", program = "/bin/sh", args = ["-c", "{program}"] }}
"#
    )
}

/// Makes a handle through `client`: its id.
async fn make_handle(client: &Client) -> String {
    let made = client.call("export_ledger", json!({})).await;
    assert_eq!(made["status"], "ok", "{made}");
    assert_eq!(made["result"]["items"], 30, "{made}");
    assert_eq!(made["result"]["read_with"], "read_handle", "{made}");
    made["result"]["handle"]
        .as_str()
        .expect("a handle")
        .to_owned()
}

/// Reads every page of `handle` through `client` and checks what it holds:
/// all 30 rows, in order, the card numbers masked.
async fn read_whole(client: &Client, handle: &str) {
    let mut rows = Vec::new();
    let mut offset = 0;
    loop {
        let page = client
            .call(
                "read_handle",
                json!({"handle": handle, "offset": offset, "limit": 12}),
            )
            .await;
        assert_eq!(page["status"], "ok", "{page}");
        let items = page["result"]["items"].as_array().expect("items").clone();
        rows.extend(items);
        match page["result"]["next_offset"].as_u64() {
            Some(next) => offset = next,
            None => break,
        }
    }
    assert_eq!(rows.len(), 30);
    for (n, row) in rows.iter().enumerate() {
        assert_eq!(row["n"], n, "{row}");
        assert_eq!(row["card_number"], "[redacted]", "{row}");
        assert_eq!(row["holder"], "Ada", "{row}");
    }
}

/// Another tenant's read of `handle` answers exactly as an unknown one.
async fn missing_for_others(other: &Client, handle: &str) {
    let unknown_id = toolfleet_core::new_handle_id();
    let theirs = other.call("read_handle", json!({"handle": handle})).await;
    let unknown = other
        .call("read_handle", json!({"handle": unknown_id}))
        .await;
    assert_eq!(theirs["status"], "error", "{theirs}");
    assert_eq!(theirs["error"]["code"], "not_found", "{theirs}");
    let message = |v: &Value, id: &str| {
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .replace(id, "<id>")
    };
    assert_eq!(message(&theirs, handle), message(&unknown, &unknown_id));
    assert_eq!(theirs["error"], {
        let mut e = unknown["error"].clone();
        e["message"] = theirs["error"]["message"].clone();
        e
    });
}

#[tokio::test]
async fn a_handle_made_through_one_dispatcher_is_read_through_another_and_after_a_restart() {
    let (_dir, config, _cleanup, _) = shared_fleet("handles", "", ledger_tool);
    common::migrate(&config);
    let start = || Server::start_role(&config, "dispatcher", "toolfleet serving on ");
    let (mut a, mut b) = (start(), start());
    let handle = make_handle(&a.client(TOKEN)).await;
    read_whole(&b.client(TOKEN), &handle).await;
    missing_for_others(&b.client(OTHER_TOKEN), &handle).await;
    a.kill();
    b.kill();
    let (a, b) = (start(), start());
    read_whole(&a.client(TOKEN), &handle).await;
    read_whole(&b.client(TOKEN), &handle).await;
    missing_for_others(&a.client(OTHER_TOKEN), &handle).await;
}

#[tokio::test]
async fn an_embedded_handle_outlives_a_restart_of_serve() {
    let dir = TempDir::new("handles-embedded");
    let text = config_with(&dir.0, "", &ledger_tool(&dir.0));
    let mut server = Server::start(&dir.0, &text);
    let handle = make_handle(&server.client(TOKEN)).await;
    read_whole(&server.client(TOKEN), &handle).await;
    server.kill();
    let server = Server::start(&dir.0, &text);
    read_whole(&server.client(TOKEN), &handle).await;
    missing_for_others(&server.client(OTHER_TOKEN), &handle).await;
}

#[tokio::test]
async fn a_handle_expires_after_its_time() {
    let dir = TempDir::new("handles-expiry");
    let text = config_with(
        &dir.0,
        "",
        &format!("{}\n[handles]\nttl_s = 1\n", ledger_tool(&dir.0)),
    );
    let server = Server::start(&dir.0, &text);
    let alice = server.client(TOKEN);
    let handle = make_handle(&alice).await;
    read_whole(&alice, &handle).await;
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    let gone = alice.call("read_handle", json!({"handle": handle})).await;
    assert_eq!(gone["error"]["code"], "not_found", "{gone}");
}

#[test]
fn bad_handle_settings_are_refused_at_start() {
    common::refused_at_start("[handles]\nttl_s = 0\n", "ttl_s");
    common::refused_at_start("[handles]\nmax_per_tenant = 0\n", "max_per_tenant");
    common::refused_at_start("[handles]\nkeep = 3\n", "keep");
}
