use std::sync::Arc;

use serde_json::{Value, json};
use toolfleet_core::{Principal, Runtime, ToolDecl, ToolError};

use super::{Options, ToolServer};

fn runtime() -> Arc<Runtime> {
    let mut runtime = Runtime::builder().build();
    for name in ["a_one", "b_two", "c_three"] {
        runtime
            .register(
                ToolDecl::query(name)
                    .title(format!("Tool {name}"))
                    .description("Echo a month.")
                    .input_schema(json!({
                        "type": "object",
                        "properties": {"month": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$"}},
                        "required": ["month"],
                        "additionalProperties": false
                    }))
                    .require_scope("read")
                    .run(|_ctx, args: Value| async move {
                        Ok::<_, ToolError>(json!({"month": args["month"].clone()}))
                    }),
            )
            .unwrap();
    }
    runtime
        .register(
            ToolDecl::query("secret")
                .description("Only for admins.")
                .input_schema(json!({"type": "object"}))
                .require_scope("admin")
                .run(|_ctx, _args: Value| async move { Ok::<_, ToolError>(json!({})) }),
        )
        .unwrap();
    Arc::new(runtime)
}

fn server(page_size: usize) -> ToolServer {
    ToolServer::new(
        runtime(),
        None,
        Options {
            page_size,
            ..Options::default()
        },
    )
}

fn reader() -> Arc<Principal> {
    Arc::new(Principal::new("acme", "alice", ["read"]))
}

#[test]
fn lists_pages_of_the_tools_a_principal_may_call() {
    let paged = server(2);
    let first = paged.list(&reader(), None).unwrap();
    let names: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    // `read_handle` is the runtime's own, in every registry.
    assert_eq!(names, ["read_handle", "a_one"]);
    let cursor = first["nextCursor"].as_str().unwrap();
    let second = paged.list(&reader(), Some(cursor)).unwrap();
    assert_eq!(second["tools"][0]["name"], "b_two");
    assert_eq!(second["tools"][1]["name"], "c_three");
    // `secret` needs a scope alice lacks: the list ends without it.
    assert_eq!(second["tools"].as_array().unwrap().len(), 2);
    assert!(second.get("nextCursor").is_none());

    let admin = Principal::new("acme", "root", ["read", "admin"]);
    let all = server(10).list(&admin, None).unwrap();
    assert_eq!(all["tools"].as_array().unwrap().len(), 5);
}

#[test]
fn tools_carry_title_schema_and_read_only_annotations() {
    let page = server(10).list(&reader(), None).unwrap();
    let tool = &page["tools"][1];
    assert_eq!(tool["title"], "Tool a_one");
    assert_eq!(tool["inputSchema"]["required"][0], "month");
    assert_eq!(tool["annotations"]["readOnlyHint"], true);
    assert_eq!(tool["annotations"]["idempotentHint"], true);
    assert_eq!(tool["annotations"]["destructiveHint"], false);
    // What rmcp reads is what we wrote.
    let parsed: Vec<rmcp::model::Tool> = serde_json::from_value(page["tools"].clone()).unwrap();
    assert_eq!(parsed.len(), 4);
    assert_eq!(
        parsed[1]
            .annotations
            .as_ref()
            .and_then(|a| a.read_only_hint),
        Some(true)
    );
}

#[test]
fn foreign_and_oversized_cursors_are_refused() {
    let server = server(2);
    for bad in ["abc", "-1", "99999999999999999999999", ""] {
        assert!(server.list(&reader(), Some(bad)).is_err(), "{bad}");
    }
    // A cursor past the end is an empty last page, not a panic.
    let past = server.list(&reader(), Some("400")).unwrap();
    assert_eq!(past["tools"], json!([]));
}

#[tokio::test]
async fn calls_answer_structured_content_and_its_json_as_text() {
    let server = server(10);
    let result = server
        .call(
            reader(),
            &json!({"name": "a_one", "arguments": {"month": "2026-09"}}),
        )
        .await;
    assert_eq!(result["isError"], false);
    assert_eq!(result["structuredContent"], json!({"month": "2026-09"}));
    let text = result["content"][0]["text"].as_str().unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(text).unwrap(),
        json!({"month": "2026-09"})
    );
    let parsed: rmcp::model::CallToolResult = serde_json::from_value(result).unwrap();
    assert_eq!(parsed.is_error, Some(false));
}

#[tokio::test]
async fn bad_arguments_unknown_tools_and_missing_scopes_are_error_results() {
    let server = server(10);
    let bad = server
        .call(
            reader(),
            &json!({"name": "a_one", "arguments": {"month": "Sept"}}),
        )
        .await;
    assert_eq!(bad["isError"], true);
    let text = bad["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("invalid_arguments") && text.contains("month"),
        "{text}"
    );

    let unknown = server
        .call(reader(), &json!({"name": "a_onee", "arguments": {}}))
        .await;
    assert_eq!(unknown["isError"], true);
    assert!(
        unknown["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("unknown_tool")
    );

    let forbidden = server
        .call(reader(), &json!({"name": "secret", "arguments": {}}))
        .await;
    assert_eq!(forbidden["isError"], true);
    assert!(
        forbidden["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("forbidden")
    );

    let not_object = server
        .call(reader(), &json!({"name": "a_one", "arguments": [1]}))
        .await;
    assert_eq!(not_object["isError"], true);
}

#[tokio::test]
async fn calls_are_reported_to_the_hook() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    let server = ToolServer::new(
        runtime(),
        None,
        Options {
            on_call: Some(Arc::new(move |tool, envelope| {
                if let Ok(mut seen) = sink.lock() {
                    seen.push(format!("{tool}:{}", envelope.status()));
                }
            })),
            ..Options::default()
        },
    );
    server
        .call(
            reader(),
            &json!({"name": "a_one", "arguments": {"month": "2026-09"}}),
        )
        .await;
    server
        .call(reader(), &json!({"name": "nope", "arguments": {}}))
        .await;
    assert_eq!(*seen.lock().unwrap(), ["a_one:ok", "unknown:error"]);
}

#[test]
fn speaks_the_three_revisions() {
    use rmcp::ServerHandler;
    let versions = server(1).supported_protocol_versions();
    let names: Vec<&str> = versions.iter().map(|v| v.as_str()).collect();
    assert_eq!(names, super::PROTOCOL_VERSIONS);
}
