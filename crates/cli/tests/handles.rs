//! Handles kept in the store: a handle tool's large result, written through
//! one dispatcher, is read through another, and through both again after
//! both were killed and started anew (PostgreSQL); on the embedded default,
//! after `serve` restarts (SQLite). The kept result is redacted as its tool
//! declares, and another tenant's or user's read of it answers as a
//! missing handle does. Over MCP, a handle tool's answer links to the
//! handle's resource, `resources/read` pages through it (through another
//! dispatcher too), `resources/list` and `resources/templates/list` name
//! the caller's handles and the two URI templates, and a settled job's
//! envelope is a resource.

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
    let link = mcp_handle_link(&a.client(TOKEN)).await;
    let page = read_resource(&b.client(TOKEN), &format!("{link}?offset=25")).await;
    assert_eq!(page["items"].as_array().map(Vec::len), Some(5), "{page}");
    a.kill();
    b.kill();
    let (a, b) = (start(), start());
    let page = read_resource(&b.client(TOKEN), &link).await;
    assert_eq!(page["total"], 30, "{page}");
    read_whole(&a.client(TOKEN), &handle).await;
    read_whole(&b.client(TOKEN), &handle).await;
    missing_for_others(&a.client(OTHER_TOKEN), &handle).await;
}

/// A JSON-RPC request to `/mcp` as `client` (2025-11-25): its answer.
async fn mcp(client: &Client, method: &str, params: Value) -> Value {
    common::mcp(client, "2025-11-25", method, params).await
}

/// Calls `export_ledger` over MCP: the URI of the resource its answer links to.
async fn mcp_handle_link(client: &Client) -> String {
    let called = mcp(
        client,
        "tools/call",
        json!({"name": "export_ledger", "arguments": {}}),
    )
    .await;
    let content = called["result"]["content"]
        .as_array()
        .expect("content")
        .clone();
    let link = content
        .iter()
        .find(|block| block["type"] == "resource_link")
        .unwrap_or_else(|| panic!("no resource_link: {called}"));
    assert_eq!(link["mimeType"], "application/json", "{link}");
    let uri = link["uri"].as_str().expect("a uri").to_owned();
    assert!(uri.starts_with("toolfleet://handles/h_"), "{uri}");
    assert_eq!(
        link["name"].as_str(),
        uri.strip_prefix("toolfleet://handles/")
    );
    uri
}

/// `resources/read` of `uri` as `client`: the JSON its one text holds.
async fn read_resource(client: &Client, uri: &str) -> Value {
    let read = mcp(client, "resources/read", json!({"uri": uri})).await;
    let contents = read["result"]["contents"]
        .as_array()
        .unwrap_or_else(|| panic!("{read}"));
    assert_eq!(contents.len(), 1, "{read}");
    assert_eq!(contents[0]["uri"], uri, "{read}");
    assert_eq!(contents[0]["mimeType"], "application/json", "{read}");
    serde_json::from_str(contents[0]["text"].as_str().expect("text")).expect("JSON text")
}

#[tokio::test]
async fn over_mcp_handles_and_settled_jobs_are_resources_of_their_caller() {
    let dir = TempDir::new("handles-mcp");
    let server = Server::start(&dir.0, &config_with(&dir.0, "", &ledger_tool(&dir.0)));
    let (alice, mallory) = (server.client(TOKEN), server.client(OTHER_TOKEN));
    let uri = mcp_handle_link(&alice).await;
    // Pages, as read_handle reads them: 20 items, then the last 10.
    let first = read_resource(&alice, &uri).await;
    assert_eq!(first["items"].as_array().map(Vec::len), Some(20), "{first}");
    assert_eq!(first["next_offset"], 20, "{first}");
    assert_eq!(first["items"][0]["card_number"], "[redacted]", "{first}");
    let rest = read_resource(&alice, &format!("{uri}?offset=20&limit=50")).await;
    assert_eq!(rest["items"].as_array().map(Vec::len), Some(10), "{rest}");
    assert_eq!(rest["items"][9]["n"], 29, "{rest}");
    assert!(rest.get("next_offset").is_none(), "{rest}");
    // Another tenant's read answers as an unknown handle's does.
    let theirs = mcp(&mallory, "resources/read", json!({"uri": uri})).await;
    let unknown_uri = format!("toolfleet://handles/{}", toolfleet_core::new_handle_id());
    let unknown = mcp(&mallory, "resources/read", json!({"uri": unknown_uri})).await;
    assert_eq!(theirs["error"]["code"], -32002, "{theirs}");
    assert_eq!(theirs["error"]["code"], unknown["error"]["code"]);
    let said = |v: &Value, uri: &str| {
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .replace(uri, "U")
    };
    assert_eq!(said(&theirs, &uri), said(&unknown, &unknown_uri));
    // Bad paging is invalid params, not a crash.
    let bad = mcp(
        &alice,
        "resources/read",
        json!({"uri": format!("{uri}?offset=x")}),
    )
    .await;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    // The list names alice's handle, and none of hers to mallory.
    let listed = mcp(&alice, "resources/list", json!({})).await;
    let uris: Vec<&str> = listed["result"]["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["uri"].as_str())
        .collect();
    assert!(uris.contains(&uri.as_str()), "{listed}");
    let theirs = mcp(&mallory, "resources/list", json!({})).await;
    assert!(!theirs.to_string().contains(&uri), "{theirs}");
    let templates = mcp(&alice, "resources/templates/list", json!({})).await;
    let names: Vec<&str> = templates["result"]["resourceTemplates"]
        .as_array()
        .expect("templates")
        .iter()
        .filter_map(|t| t["uriTemplate"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "toolfleet://handles/{handle}{?offset,limit}",
            "toolfleet://jobs/{job_id}"
        ]
    );
    // Subscribing to a handle (which never changes) is accepted; to another's, refused.
    let subscribed = mcp(&alice, "resources/subscribe", json!({"uri": uri})).await;
    assert!(subscribed["result"].is_object(), "{subscribed}");
    let refused = mcp(&mallory, "resources/subscribe", json!({"uri": uri})).await;
    assert_eq!(refused["error"]["code"], -32002, "{refused}");
    // A settled job's envelope is a resource, listed and read; not another's.
    let started = alice
        .call("start_receipt_ocr", json!({"receipt_ids": ["rcpt-005"]}))
        .await;
    let job = started["job_id"].as_str().expect("a job").to_owned();
    let settled = common::settle(&alice, &job).await;
    assert_eq!(settled["status"], "ok", "{settled}");
    let job_uri = format!("toolfleet://jobs/{job}");
    let read = read_resource(&alice, &job_uri).await;
    assert_eq!(read["status"], "ok", "{read}");
    assert_eq!(read["result"], settled["result"], "{read}");
    let listed = mcp(&alice, "resources/list", json!({})).await;
    assert!(listed.to_string().contains(&job_uri), "{listed}");
    let theirs = mcp(&mallory, "resources/read", json!({"uri": job_uri})).await;
    assert_eq!(theirs["error"]["code"], -32002, "{theirs}");
}

/// `[[resources]]` over the expense pack: a month's lines, read through
/// `find_expenses` (a query tool) with the template's `month`.
const MONTHS: &str = r#"
[[resources]]
uri_template = "expenses://months/{month}"
name = "month"
description = "A month's expense lines, first page."
tool = "find_expenses"
"#;

#[tokio::test]
async fn a_declared_resource_is_read_through_its_tool_as_the_reader() {
    let dir = TempDir::new("handles-declared");
    let server = Server::start(&dir.0, &config_with(&dir.0, "", MONTHS));
    let alice = server.client(TOKEN);
    let templates = mcp(&alice, "resources/templates/list", json!({})).await;
    assert!(
        templates.to_string().contains("expenses://months/{month}"),
        "{templates}"
    );
    let page = read_resource(&alice, "expenses://months/2026-09").await;
    let direct = alice
        .call("find_expenses", json!({"month": "2026-09"}))
        .await;
    assert_eq!(page, direct["result"], "the resource is the tool's answer");
    // The tool's refusal is the read's, and a URI no template matches is unknown.
    let bad = mcp(
        &alice,
        "resources/read",
        json!({"uri": "expenses://months/Sept"}),
    )
    .await;
    assert_eq!(bad["error"]["data"]["code"], "invalid_arguments", "{bad}");
    let other = mcp(
        &alice,
        "resources/read",
        json!({"uri": "expenses://months/a/b"}),
    )
    .await;
    assert_eq!(other["error"]["code"], -32002, "{other}");
    // It may change, and a request without a session has nothing to send
    // updates on: no subscription (tests/mcp_sessions.rs subscribes in one).
    let refused = mcp(
        &alice,
        "resources/subscribe",
        json!({"uri": "expenses://months/2026-09"}),
    )
    .await;
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    let why = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(why.contains("Mcp-Session-Id"), "{refused}");
}

#[test]
fn bad_resource_declarations_are_refused_at_start() {
    let declared = |table: &str| format!("[[resources]]\nname = \"r\"\n{table}\n");
    common::refused_at_start(
        &declared("uri = \"x://a\"\ntool = \"nothing_here\""),
        "no tool",
    );
    common::refused_at_start(
        &declared("uri = \"x://a\"\ntool = \"start_receipt_ocr\""),
        "is a job tool",
    );
    common::refused_at_start(
        &declared("uri = \"x://a\"\nuri_template = \"x://{a}\"\ntool = \"find_expenses\""),
        "one of `uri` and `uri_template`",
    );
    common::refused_at_start(
        &declared("uri = \"toolfleet://handles/x\"\ntool = \"find_expenses\""),
        "outside toolfleet://",
    );
    common::refused_at_start(
        &declared("uri_template = \"x://{a}{b}\"\ntool = \"find_expenses\""),
        "text between them",
    );
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
