//! Provider adapters held against each provider's documented wire format.
//!
//! The golden files in `tests/golden/` were written by hand from the shapes
//! the providers document (OpenAI Chat Completions tool calls and `tool`
//! messages, Responses `function_call` / `function_call_output` items,
//! Anthropic `tool_use` / `tool_result` blocks, Gemini `functionDeclarations`
//! / `functionCall` / `functionResponse` parts, MCP `tools/list` and
//! `CallToolResult`), not dumped from this code.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::{Value, json};
use toolfleet_core::adapters::{self, Format, ProviderCall};
use toolfleet_core::{
    Approval, ApprovalRequest, CallCtx, Envelope, ErrorCode, Fleet, JobRequest, Principal, Runtime,
    TicketRequest, Tool, ToolDecl, ToolError,
};

type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A fleet with fixed ids, so rendered results are reproducible.
struct FixedFleet;

impl Fleet for FixedFleet {
    fn submit<'a>(&'a self, _job: JobRequest) -> Boxed<'a, Result<String, ToolError>> {
        Box::pin(async { Ok("job-1".to_owned()) })
    }
    fn open_ticket<'a>(&'a self, _ticket: TicketRequest) -> Boxed<'a, Result<String, ToolError>> {
        Box::pin(async { Ok("t-1".to_owned()) })
    }
    fn request_approval<'a>(
        &'a self,
        approval: ApprovalRequest,
    ) -> Boxed<'a, Result<Approval, ToolError>> {
        Box::pin(async move { Ok(Approval::Pending(approval.ticket)) })
    }
}

const MONTH: &str = "^[0-9]{4}-[0-9]{2}$";

/// The four fixture tools, in the order of the golden files.
fn fixture() -> (Runtime, Vec<Arc<Tool>>) {
    let mut runtime = Runtime::builder().fleet(Arc::new(FixedFleet)).build();
    let decls = [
        ToolDecl::query("find_expenses")
            .title("Find expenses")
            .description("List the caller's expense lines for one month, 50 at a time.")
            .input_schema(json!({
                "type": "object",
                "properties": {
                    "month": {"type": "string", "pattern": MONTH, "description": "The month, as YYYY-MM."},
                    "cursor": {"type": "string", "description": "The next_cursor of the previous page."},
                    "min_amount": {"type": ["number", "null"], "exclusiveMinimum": 0, "description": "Only lines above this amount."}
                },
                "required": ["month"],
                "additionalProperties": false
            }))
            .output_schema(json!({
                "type": "object",
                "properties": {"lines": {"type": "array"}, "next_cursor": {"type": ["string", "null"]}},
                "required": ["lines"]
            }))
            .require_scope("expenses:read")
            .run(|_ctx, _args: Value| async move {
                Ok::<_, ToolError>(json!({
                    "lines": [{"id": "l1", "amount": 12.5, "category": "meals"}],
                    "next_cursor": "c2"
                }))
            }),
        ToolDecl::command("submit_report")
            .title("Submit report")
            .description("Submit the month's expense report. Call with dry_run=true first for the plan and a confirm_token.")
            .input_schema(json!({
                "type": "object",
                "properties": {
                    "month": {"type": "string", "pattern": MONTH},
                    "dry_run": {"type": "boolean", "description": "true: only plan and return a confirm_token; false: commit."},
                    "note": {"type": "string", "maxLength": 200, "description": "A note for the approver."}
                },
                "required": ["month", "dry_run"]
            }))
            .require_scope("expenses:submit")
            .run(|_ctx, _args: Value| async move {
                Ok::<_, ToolError>(json!({"report_id": "r1", "total": 12.5}))
            }),
        ToolDecl::job("receipts.ocr")
            .description("Read the amounts off receipt images. Runs in the background and answers a job_id.")
            .input_schema(json!({
                "type": "object",
                "properties": {
                    "line_ids": {"type": "array", "items": {"type": "string"}, "minItems": 1, "uniqueItems": true, "description": "The expense lines whose receipts to read."},
                    "hints": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Free-form hints per line id."}
                },
                "required": ["line_ids"]
            }))
            .destructive(false)
            .idempotent(true)
            .poll_after_s(20)
            .require_scope("expenses:read")
            .run(|_ctx, _args: Value| async move { Ok::<_, ToolError>(json!({"amounts": {}})) }),
        ToolDecl::human("ask_user")
            .description("Ask the user a question and wait for the answer.")
            .input_schema(json!({
                "type": "object",
                "properties": {
                    "question": {"type": "string", "maxLength": 500, "description": "The question, in one sentence."},
                    "options": {"type": "array", "items": {"type": "string"}, "maxItems": 5, "description": "Up to five answers to choose from."}
                },
                "required": ["question"]
            })),
    ];
    let tools = decls
        .into_iter()
        .map(|d| runtime.register(d).expect("fixture tools register"))
        .collect();
    (runtime, tools)
}

fn ctx() -> CallCtx {
    let principal = Principal::new("acme", "alice", ["expenses:read", "expenses:submit"]);
    let mut ctx = CallCtx::new(Arc::new(principal));
    ctx.call_id = "call-1".to_owned();
    ctx
}

fn golden(format: Format) -> Value {
    let path = format!(
        "{}/tests/golden/{}.json",
        env!("CARGO_MANIFEST_DIR"),
        format.as_str()
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap()
}

/// Fields that carry an envelope as JSON text, parsed, so key order in the
/// text does not matter. MCP's error text is not JSON and stays as it is.
fn normalize(mut value: Value) -> Value {
    for key in ["content", "output"] {
        if let Some(Value::String(text)) = value.get(key)
            && let Ok(parsed) = serde_json::from_str::<Value>(text)
        {
            value[key] = parsed;
        }
    }
    if let Some(Value::Array(blocks)) = value.get_mut("content") {
        for block in blocks {
            if let Some(Value::String(text)) = block.get("text")
                && let Ok(parsed) = serde_json::from_str::<Value>(text)
            {
                block["text"] = parsed;
            }
        }
    }
    value
}

fn parsed_view(call: &ProviderCall) -> Value {
    json!({
        "id": call.id,
        "name": call.name,
        "args": call.args.as_ref().map_err(|e| e.to_string()).unwrap(),
    })
}

#[tokio::test]
async fn every_format_matches_its_golden_file() {
    let (runtime, tools) = fixture();
    for format in Format::ALL {
        let golden = golden(format);
        let name = format.as_str();

        assert_eq!(
            adapters::tool_specs(format, &tools),
            golden["tools"],
            "{name}: tool specs"
        );

        let call = adapters::parse_call(format, runtime.registry(), &bytes(&golden["call"]))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(parsed_view(&call), golden["parsed"], "{name}: parsed call");

        let ok = adapters::call(&runtime, format, &bytes(&golden["call"]), &ctx()).await;
        assert_eq!(
            normalize(ok),
            normalize(golden["result_ok"].clone()),
            "{name}: ok result"
        );

        let error = Envelope::error(ToolError::invalid_arguments(format!(
            "`month` must match {MONTH}, got \"Sept\""
        )));
        assert_eq!(
            normalize(adapters::render_result(format, &call, &error)),
            normalize(golden["result_error"].clone()),
            "{name}: error result"
        );

        let running = adapters::call(&runtime, format, &bytes(&golden["job_call"]), &ctx()).await;
        assert_eq!(
            normalize(running),
            normalize(golden["result_running"].clone()),
            "{name}: running result"
        );
    }
}

#[test]
fn format_names_are_exactly_those_of_the_api() {
    for format in Format::ALL {
        assert_eq!(Format::parse(format.as_str()), Some(format));
        assert_eq!(format.to_string(), format.as_str());
    }
    for other in ["", "OpenAI", "openai_responses", "claude", "mcp ", "json"] {
        assert_eq!(Format::parse(other), None, "{other:?}");
    }
}

#[test]
fn strict_mode_only_where_the_schema_allows_it() {
    let (_runtime, tools) = fixture();
    let specs = adapters::tool_specs(Format::OpenAi, &tools);
    let by_name = |name: &str| {
        specs
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["function"]["name"] == name)
            .unwrap_or_else(|| panic!("{name} exported"))["function"]
            .clone()
    };

    let find = by_name("find_expenses");
    assert_eq!(find["strict"], true);
    let params = &find["parameters"];
    assert_eq!(params["additionalProperties"], false);
    assert_eq!(params["required"], json!(["cursor", "min_amount", "month"]));
    assert_eq!(
        params["properties"]["cursor"]["type"],
        json!(["string", "null"])
    );
    assert_eq!(
        params["properties"]["month"]["type"], "string",
        "required stays non-null"
    );

    let submit = by_name("submit_report");
    assert_eq!(submit["strict"], true);
    assert_eq!(
        submit["parameters"]["properties"]["note"]["type"],
        json!(["string", "null"])
    );
    assert!(
        submit["parameters"]["properties"]["note"]
            .get("maxLength")
            .is_none(),
        "strict mode takes no maxLength"
    );

    // `hints` allows any extra property: no strict form says that.
    let ocr = by_name("receipts_ocr_30db08d7");
    assert_eq!(ocr["strict"], false);
    assert_eq!(&ocr["parameters"], tools[2].input_schema());

    let responses = adapters::tool_specs(Format::OpenAiResponses, &tools);
    let strict: Vec<&Value> = responses
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["strict"])
        .collect();
    assert_eq!(
        strict,
        [&json!(true), &json!(true), &json!(false), &json!(true)]
    );

    // Every object of a strict schema is closed and fully required.
    fn closed(schema: &Value) {
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            assert_eq!(schema["additionalProperties"], false, "{schema}");
            let required: Vec<&str> = schema["required"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_str().unwrap())
                .collect();
            for (name, sub) in props {
                assert!(required.contains(&name.as_str()), "{name} not required");
                closed(sub);
            }
        }
        if let Some(items) = schema.get("items") {
            closed(items);
        }
    }
    for spec in specs.as_array().unwrap() {
        if spec["function"]["strict"] == true {
            closed(&spec["function"]["parameters"]);
        }
    }
}

#[tokio::test]
async fn strict_nulls_for_optional_fields_are_removed_before_validation() {
    let (runtime, _tools) = fixture();
    let with_nulls = json!({"month": "2026-09", "cursor": null, "min_amount": null});

    let openai = json!({"id": "call_1", "type": "function", "function": {"name": "find_expenses", "arguments": with_nulls.to_string()}});
    let call = adapters::parse_call(Format::OpenAi, runtime.registry(), &bytes(&openai)).unwrap();
    // `cursor` refuses null in the tool's schema, so it was left out; `min_amount` accepts it.
    assert_eq!(
        call.args.as_ref().unwrap(),
        &json!({"month": "2026-09", "min_amount": null})
    );
    let answer = adapters::call(&runtime, Format::OpenAi, &bytes(&openai), &ctx()).await;
    let envelope: Value = serde_json::from_str(answer["content"].as_str().unwrap()).unwrap();
    assert_eq!(envelope["status"], "ok", "{envelope}");

    // The same nulls from a provider without strict mode are the model's
    // own mistake, and the schema says so.
    let anthropic =
        json!({"type": "tool_use", "id": "toolu_1", "name": "find_expenses", "input": with_nulls});
    let answer = adapters::call(&runtime, Format::Anthropic, &bytes(&anthropic), &ctx()).await;
    assert_eq!(answer["is_error"], true);
    let envelope: Value = serde_json::from_str(answer["content"].as_str().unwrap()).unwrap();
    assert_eq!(envelope["error"]["code"], "invalid_arguments");

    // A command's optional `note` and `confirm_token` arrive as nulls in a dry run.
    let dry_run = json!({"month": "2026-09", "dry_run": true, "note": null, "confirm_token": null});
    let responses = json!({"type": "function_call", "call_id": "call_2", "name": "submit_report", "arguments": dry_run.to_string()});
    let answer = adapters::call(
        &runtime,
        Format::OpenAiResponses,
        &bytes(&responses),
        &ctx(),
    )
    .await;
    let envelope: Value = serde_json::from_str(answer["output"].as_str().unwrap()).unwrap();
    assert_eq!(envelope["status"], "ok", "{envelope}");
    assert!(envelope["result"]["confirm_token"].is_string());
}

/// The fields of Gemini's Schema object (v1beta).
const GEMINI_FIELDS: &[&str] = &[
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "enum",
    "maxItems",
    "minItems",
    "properties",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "example",
    "anyOf",
    "propertyOrdering",
    "default",
    "items",
    "minimum",
    "maximum",
];

/// Every schema node, recursively, is one Gemini accepts.
fn assert_gemini_schema(schema: &Value, at: &str) {
    let obj = schema
        .as_object()
        .unwrap_or_else(|| panic!("{at}: not an object"));
    for key in obj.keys() {
        assert!(
            GEMINI_FIELDS.contains(&key.as_str()),
            "{at}: `{key}` is not a Gemini Schema field"
        );
    }
    let ty = obj.get("type").and_then(Value::as_str);
    assert!(ty.is_some() || obj.contains_key("anyOf"), "{at}: no type");
    if let Some(ty) = ty {
        assert!(
            ["string", "number", "integer", "boolean", "array", "object"].contains(&ty),
            "{at}: type {ty}"
        );
    }
    if let Some(values) = obj.get("enum") {
        assert_eq!(ty, Some("string"), "{at}: enum only on strings");
        assert!(
            values.as_array().unwrap().iter().all(Value::is_string),
            "{at}: enum of strings"
        );
    }
    if let Some(format) = obj.get("format").and_then(Value::as_str) {
        let ok = match ty {
            Some("string") => ["enum", "date-time"].contains(&format),
            Some("number") => ["float", "double"].contains(&format),
            Some("integer") => ["int32", "int64"].contains(&format),
            _ => false,
        };
        assert!(ok, "{at}: format {format} on {ty:?}");
    }
    if ty == Some("object") {
        assert!(
            obj.get("properties")
                .and_then(Value::as_object)
                .is_some_and(|p| !p.is_empty()),
            "{at}: an object needs properties"
        );
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            assert_gemini_schema(sub, &format!("{at}.{name}"));
        }
    }
    if let Some(items) = obj.get("items") {
        assert_gemini_schema(items, &format!("{at}[]"));
    }
    if let Some(branches) = obj.get("anyOf").and_then(Value::as_array) {
        for (i, b) in branches.iter().enumerate() {
            assert_gemini_schema(b, &format!("{at}|{i}"));
        }
    }
}

#[test]
fn gemini_parameters_keep_only_what_gemini_accepts() {
    let mut runtime = Runtime::builder().build();
    let nasty = runtime
        .register(
            ToolDecl::query("log_amount")
                .description("Record an amount.")
                .input_schema(json!({
                    "$schema": "https://json-schema.org/draft/2020-12/schema",
                    "$id": "https://example.com/log_amount",
                    "type": "object",
                    "additionalProperties": false,
                    "$defs": {"money": {"type": "number", "exclusiveMinimum": 0, "multipleOf": 0.01}},
                    "properties": {
                        "amount": {"$ref": "#/$defs/money", "description": "In euros."},
                        "currency": {"const": "EUR"},
                        "kind": {"oneOf": [{"type": "string", "enum": ["travel", "meals"]}, {"type": "null"}]},
                        "tags": {"type": "array", "items": {"type": "string", "format": "uri"}, "uniqueItems": true, "examples": [["https://example.com"]]},
                        "when": {"type": ["string", "null"], "format": "date-time"},
                        "meta": {
                            "type": "object",
                            "properties": {"source": {"type": "string"}},
                            "patternProperties": {"^x-": {"type": "string"}},
                            "additionalProperties": false,
                            "not": {"required": ["forbidden"]}
                        },
                        "level": {"type": "integer", "enum": [1, 2, 3]},
                        "flag": {"type": "boolean", "if": {"const": true}, "then": {}, "else": {}}
                    },
                    "required": ["amount"],
                    "dependentRequired": {"when": ["kind"]}
                }))
                .run(|_ctx, _args: Value| async move { Ok::<_, ToolError>(json!({})) }),
        )
        .unwrap();
    let (_fixture_runtime, mut tools) = fixture();
    tools.push(nasty);

    let specs = adapters::tool_specs(Format::Gemini, &tools);
    let declarations = specs[0]["functionDeclarations"].as_array().unwrap();
    assert_eq!(
        specs.as_array().unwrap().len(),
        1,
        "one Tool with every declaration"
    );
    let mut translated = 0;
    for declaration in declarations {
        let name = declaration["name"].as_str().unwrap();
        match (
            declaration.get("parameters"),
            declaration.get("parametersJsonSchema"),
        ) {
            (Some(parameters), None) => {
                assert_gemini_schema(parameters, name);
                translated += 1;
            }
            (None, Some(_)) => assert_eq!(name, "receipts.ocr"),
            other => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(translated, 4);

    let log = &declarations[4]["parameters"]["properties"];
    assert_eq!(log["amount"]["type"], "number");
    assert_eq!(
        log["amount"]["description"],
        "In euros. (exclusiveMinimum: 0, multipleOf: 0.01)"
    );
    assert_eq!(log["currency"], json!({"type": "string", "enum": ["EUR"]}));
    assert_eq!(
        log["kind"],
        json!({"type": "string", "enum": ["travel", "meals"], "nullable": true})
    );
    assert_eq!(log["tags"]["example"], json!(["https://example.com"]));
    assert_eq!(log["tags"]["items"]["type"], "string");
    assert_eq!(
        log["when"],
        json!({"type": "string", "format": "date-time", "nullable": true})
    );
    assert_eq!(
        log["meta"],
        json!({"type": "object", "properties": {"source": {"type": "string"}}})
    );
    assert_eq!(log["level"]["type"], "integer");
    assert_eq!(log["flag"], json!({"type": "boolean"}));
}

#[tokio::test]
async fn malformed_openai_arguments_answer_invalid_arguments() {
    let (runtime, _tools) = fixture();
    for (arguments, says) in [
        (json!("{\"month\": \"2026-09\""), "is not valid JSON"),
        (json!("not json at all"), "is not valid JSON"),
        (json!("[1, 2]"), "must be a JSON object"),
        (json!("\"2026-09\""), "must be a JSON object"),
        (json!(42), "must be a JSON object"),
    ] {
        let raw = json!({"id": "call_bad", "type": "function", "function": {"name": "find_expenses", "arguments": arguments}});
        let call = adapters::parse_call(Format::OpenAi, runtime.registry(), &bytes(&raw)).unwrap();
        let error = call.args.as_ref().unwrap_err();
        assert_eq!(error.code, ErrorCode::InvalidArguments);
        assert!(error.message.contains(says), "{}", error.message);
        assert!(error.message.contains("find_expenses"), "{}", error.message);

        let answer = adapters::call(&runtime, Format::OpenAi, &bytes(&raw), &ctx()).await;
        assert_eq!(answer["role"], "tool");
        assert_eq!(answer["tool_call_id"], "call_bad", "paired with its call");
        let envelope: Value = serde_json::from_str(answer["content"].as_str().unwrap()).unwrap();
        assert_eq!(envelope["status"], "error");
        assert_eq!(envelope["error"]["code"], "invalid_arguments");
    }

    // An empty argument string is a call without arguments, not a malformed one.
    let raw =
        json!({"id": "c", "type": "function", "function": {"name": "ask_user", "arguments": ""}});
    let call = adapters::parse_call(Format::OpenAi, runtime.registry(), &bytes(&raw)).unwrap();
    assert_eq!(call.args.unwrap(), json!({}));
}

#[tokio::test]
async fn unknown_names_answer_unknown_tool_with_the_provider_spelling() {
    let (runtime, _tools) = fixture();
    let raw = json!({"id": "call_x", "type": "function", "function": {"name": "receipts_ocr", "arguments": "{}"}});
    let call = adapters::parse_call(Format::OpenAi, runtime.registry(), &bytes(&raw)).unwrap();
    let error = call.args.as_ref().unwrap_err();
    assert_eq!(error.code, ErrorCode::UnknownTool);
    assert!(
        error.message.contains("`receipts_ocr_30db08d7`"),
        "{}",
        error.message
    );
    assert_eq!(
        error.details.as_ref().unwrap()["suggestions"][0],
        "receipts_ocr_30db08d7"
    );

    let raw = json!({"type": "tool_use", "id": "toolu_x", "name": "find_expense", "input": {}});
    let answer = adapters::call(&runtime, Format::Anthropic, &bytes(&raw), &ctx()).await;
    assert_eq!(answer["is_error"], true);
    assert_eq!(answer["tool_use_id"], "toolu_x");
    let envelope: Value = serde_json::from_str(answer["content"].as_str().unwrap()).unwrap();
    assert_eq!(envelope["error"]["code"], "unknown_tool");
    assert!(
        envelope["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`find_expenses`")
    );

    // The registry name is always accepted too, whatever the provider.
    let raw = json!({"id": "call_y", "type": "function", "function": {"name": "receipts.ocr", "arguments": "{\"line_ids\": [\"l1\"]}"}});
    let call = adapters::parse_call(Format::OpenAi, runtime.registry(), &bytes(&raw)).unwrap();
    assert_eq!(call.name, "receipts.ocr");
}

#[tokio::test]
async fn unreadable_calls_are_answered_not_crashed() {
    let (runtime, _tools) = fixture();
    let registry = runtime.registry();

    for raw in [
        &b"not json"[..],
        b"[]",
        b"{}",
        b"{\"args\": {}}",
        b"\xff\xfe",
    ] {
        let error = adapters::parse_call(Format::Neutral, registry, raw).unwrap_err();
        assert_eq!(error.code, ErrorCode::BadRequest, "{raw:?}");
        assert!(
            error.message.contains("\"tool\""),
            "says what to send: {}",
            error.message
        );
    }

    let huge = format!(
        "{{\"tool\": \"find_expenses\", \"args\": {{\"month\": \"{}\"}}}}",
        "9".repeat(adapters::MAX_CALL_BYTES)
    );
    let error = adapters::parse_call(Format::Neutral, registry, huge.as_bytes()).unwrap_err();
    assert_eq!(error.code, ErrorCode::PayloadTooLarge);

    // An id without a name is still answered under that id.
    let raw = json!({"type": "tool_use", "id": "toolu_nameless", "input": {}});
    let answer = adapters::call(&runtime, Format::Anthropic, &bytes(&raw), &ctx()).await;
    assert_eq!(answer["tool_use_id"], "toolu_nameless");
    assert_eq!(answer["is_error"], true);

    let answer = adapters::call(&runtime, Format::Mcp, b"{", &ctx()).await;
    assert_eq!(answer["isError"], true);
    assert_eq!(answer["structuredContent"]["error"]["code"], "bad_request");
    assert!(
        answer["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("bad_request: ")
    );
}

#[tokio::test]
async fn human_tools_suspend_in_every_format() {
    let (runtime, _tools) = fixture();
    let args = json!({"question": "Travel or meals?", "options": ["travel", "meals"]});
    let calls = [
        (Format::Neutral, json!({"tool": "ask_user", "args": args})),
        (
            Format::OpenAi,
            json!({"id": "c1", "type": "function", "function": {"name": "ask_user", "arguments": args.to_string()}}),
        ),
        (
            Format::Anthropic,
            json!({"type": "tool_use", "id": "t1", "name": "ask_user", "input": args}),
        ),
        (
            Format::Gemini,
            json!({"functionCall": {"name": "ask_user", "args": args}}),
        ),
        (Format::Mcp, json!({"name": "ask_user", "arguments": args})),
    ];
    let expected = json!({"status": "suspended", "ticket": "t-1", "question": "Travel or meals?", "options": ["travel", "meals"]});
    for (format, raw) in calls {
        let answer = adapters::call(&runtime, format, &bytes(&raw), &ctx()).await;
        let envelope = match format {
            Format::Neutral => answer.clone(),
            Format::OpenAi | Format::Anthropic => {
                serde_json::from_str(answer["content"].as_str().unwrap()).unwrap()
            }
            Format::Gemini => answer["functionResponse"]["response"].clone(),
            Format::Mcp => {
                assert_eq!(answer["isError"], false);
                assert_eq!(answer["_meta"]["toolfleet/status"], "suspended");
                answer["structuredContent"].clone()
            }
            Format::OpenAiResponses => unreachable!(),
        };
        assert_eq!(envelope, expected, "{format}");
    }
}

#[test]
fn ids_pass_through_to_the_results_that_need_them() {
    let (runtime, _tools) = fixture();
    let raw =
        json!({"functionCall": {"id": "gem-7", "name": "ask_user", "args": {"question": "?"}}});
    let call = adapters::parse_call(Format::Gemini, runtime.registry(), &bytes(&raw)).unwrap();
    assert_eq!(call.id.as_deref(), Some("gem-7"));
    let answer = adapters::render_result(Format::Gemini, &call, &Envelope::running("j", 5));
    assert_eq!(answer["functionResponse"]["id"], "gem-7");
    assert_eq!(answer["functionResponse"]["name"], "ask_user");

    // A bare Gemini call ({"name", "args"}) reads the same as the part.
    let bare = json!({"name": "ask_user", "args": {"question": "?"}});
    let call = adapters::parse_call(Format::Gemini, runtime.registry(), &bytes(&bare)).unwrap();
    assert_eq!(call.args.unwrap(), json!({"question": "?"}));
}

#[test]
fn a_content_blocks_tool_answers_mcp_content_as_it_is_and_json_elsewhere() {
    let mut runtime = Runtime::builder().build();
    let picture = ToolDecl::query("picture")
        .description("A picture.")
        .content_blocks()
        .run(|_: CallCtx, _: Value| async move { Ok::<_, ToolError>(json!({})) });
    let plain = ToolDecl::query("plain")
        .description("JSON.")
        .run(|_: CallCtx, _: Value| async move { Ok::<_, ToolError>(json!({})) });
    runtime.register_all(vec![picture, plain]).unwrap();
    let blocks = json!({"content": [
        {"type": "text", "text": "A red pixel:"},
        {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
        {"type": "resource", "resource": {"uri": "test://r", "mimeType": "application/json", "text": "{}"}}
    ]});
    let ok = |value: &Value| Envelope::ok(toolfleet_core::Json::from(value.clone()), "c1");
    let call = |name: &str| {
        let raw = json!({"name": name, "arguments": {}});
        adapters::parse_call(Format::Mcp, runtime.registry(), &bytes(&raw)).unwrap()
    };

    let answer = adapters::render_result(Format::Mcp, &call("picture"), &ok(&blocks));
    assert_eq!(answer["content"], blocks["content"]);
    assert!(answer.get("structuredContent").is_none(), "{answer}");
    // Other providers read the same result as JSON text.
    let openai = adapters::render_result(Format::OpenAi, &call("picture"), &ok(&blocks));
    assert!(openai["content"].as_str().unwrap().contains("image/png"));
    // An undeclared tool's result with the same shape is JSON, as always.
    let answer = adapters::render_result(Format::Mcp, &call("plain"), &ok(&blocks));
    assert_eq!(answer["content"][0]["type"], "text");
    assert_eq!(answer["structuredContent"], blocks);
    // A block MCP does not know (or one missing a field) sends the JSON instead.
    for broken in [
        json!({"content": [{"type": "video", "data": "x"}]}),
        json!({"content": [{"type": "image", "data": "x"}]}),
        json!({"content": []}),
        json!({"lines": 3}),
    ] {
        let answer = adapters::render_result(Format::Mcp, &call("picture"), &ok(&broken));
        assert_eq!(answer["content"][0]["type"], "text", "{broken}");
        assert_eq!(answer["structuredContent"], broken);
    }
}
