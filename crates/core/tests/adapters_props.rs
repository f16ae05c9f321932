//! Whatever a model or client sends as a tool call, in any format, the
//! adapters answer with that provider's tool result around an envelope of the
//! contract, and never panic (docs/ARCHITECTURE.md, invariant 1).

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Map, Value, json};
use toolfleet_core::adapters::{self, Format};
use toolfleet_core::{
    Approval, ApprovalRequest, CallCtx, Envelope, Fleet, JobRequest, Principal, Runtime,
    TicketRequest, ToolDecl, ToolError,
};

type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

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

/// One tool of each answering shape: ok (query, command), running (job), suspended (human).
fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        let mut runtime = Runtime::builder().fleet(Arc::new(FixedFleet)).build();
        runtime
            .register_all([
                ToolDecl::query("find_expenses")
                    .input_schema(json!({
                        "type": "object",
                        "properties": {
                            "month": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$"},
                            "cursor": {"type": "string"}
                        },
                        "required": ["month"]
                    }))
                    .output_schema(json!({"type": "object", "properties": {"lines": {"type": "array"}}}))
                    .run(|_ctx, _args: Value| async move { Ok::<_, ToolError>(json!({"lines": []})) }),
                ToolDecl::query("echo.any")
                    .run(|_ctx, args: Value| async move { Ok::<_, ToolError>(args) }),
                ToolDecl::command("submit_report")
                    .input_schema(json!({
                        "type": "object",
                        "properties": {"dry_run": {"type": "boolean"}, "note": {"type": "string"}},
                        "required": ["dry_run"]
                    }))
                    .run(|_ctx, _args: Value| async move { Ok::<_, ToolError>(json!({"report_id": "r1"})) }),
                ToolDecl::job("receipts.ocr")
                    .run(|_ctx, _args: Value| async move { Ok::<_, ToolError>(json!({})) }),
                ToolDecl::human("ask_user").input_schema(json!({
                    "type": "object",
                    "properties": {"question": {"type": "string"}, "options": {"type": "array", "items": {"type": "string"}}},
                    "required": ["question"]
                })),
            ])
            .expect("fixture tools register");
        runtime
    })
}

const STATUSES: [&str; 4] = ["ok", "error", "running", "suspended"];

/// Answers `raw` in `format` and checks the rendered result; gives its status.
fn answer(format: Format, raw: &[u8]) -> Result<String, TestCaseError> {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a tokio runtime");
    let ctx = CallCtx::new(Arc::new(Principal::new(
        "acme",
        "alice",
        Vec::<String>::new(),
    )));
    let result = tokio.block_on(adapters::call(runtime(), format, raw, &ctx));
    let status = status_of(format, &result)?;
    prop_assert!(
        STATUSES.contains(&status.as_str()),
        "{format}: status {status} in {result}"
    );
    Ok(status)
}

/// Finds the envelope inside a provider's tool result and checks it is one of the contract.
fn status_of(format: Format, result: &Value) -> Result<String, TestCaseError> {
    let envelope = |text: &Value| -> Result<Value, TestCaseError> {
        let text = text
            .as_str()
            .ok_or_else(|| fail(format, "no text", result))?;
        serde_json::from_str(text).map_err(|_| fail(format, "text is not JSON", result))
    };
    let envelope = match format {
        Format::Neutral => result.clone(),
        Format::OpenAi => {
            prop_assert_eq!(&result["role"], "tool");
            envelope(&result["content"])?
        }
        Format::OpenAiResponses => {
            prop_assert_eq!(&result["type"], "function_call_output");
            envelope(&result["output"])?
        }
        Format::Anthropic => {
            prop_assert_eq!(&result["type"], "tool_result");
            let envelope = envelope(&result["content"])?;
            prop_assert_eq!(&result["is_error"], &json!(envelope["status"] == "error"));
            envelope
        }
        Format::Gemini => {
            prop_assert!(result["functionResponse"]["name"].is_string(), "{}", result);
            result["functionResponse"]["response"].clone()
        }
        Format::Mcp => return mcp_status(result),
    };
    // Reading it back as an Envelope checks the whole contract: the status,
    // its fields, and for errors a known code.
    let parsed: Envelope = serde_json::from_value(envelope.clone())
        .map_err(|e| fail(format, &format!("not an envelope ({e})"), result))?;
    Ok(parsed.status().to_owned())
}

fn mcp_status(result: &Value) -> Result<String, TestCaseError> {
    let status = result["_meta"]["toolfleet/status"]
        .as_str()
        .ok_or_else(|| fail(Format::Mcp, "no status", result))?
        .to_owned();
    prop_assert_eq!(&result["isError"], &json!(status == "error"));
    prop_assert_eq!(&result["content"][0]["type"], "text");
    let text = result["content"][0]["text"]
        .as_str()
        .ok_or_else(|| fail(Format::Mcp, "no text", result))?;
    let structured = result.get("structuredContent");
    match status.as_str() {
        "ok" => {
            let structured =
                structured.ok_or_else(|| fail(Format::Mcp, "no structuredContent", result))?;
            prop_assert!(structured.is_object());
            prop_assert_eq!(
                &serde_json::from_str::<Value>(text).ok(),
                &Some(structured.clone())
            );
        }
        "error" => {
            let (code, _) = text
                .split_once(": ")
                .ok_or_else(|| fail(Format::Mcp, "error text is not `code: message`", result))?;
            prop_assert!(
                serde_json::from_value::<toolfleet_core::ErrorCode>(json!(code)).is_ok(),
                "unknown code {}",
                code
            );
        }
        _ => {}
    }
    if status != "ok"
        && let Some(structured) = structured
    {
        let parsed: Envelope = serde_json::from_value(structured.clone())
            .map_err(|e| fail(Format::Mcp, &format!("not an envelope ({e})"), result))?;
        prop_assert_eq!(parsed.status(), status.as_str());
    }
    Ok(status)
}

fn fail(format: Format, what: &str, result: &Value) -> TestCaseError {
    TestCaseError::fail(format!("{format}: {what}: {result}"))
}

/// Words that make random JSON look like calls now and then.
const WORDS: &[&str] = &[
    "tool",
    "args",
    "id",
    "type",
    "function",
    "name",
    "arguments",
    "call_id",
    "input",
    "functionCall",
    "params",
    "tool_use",
    "function_call",
    "find_expenses",
    "echo.any",
    "echo_any_0ccc243f",
    "submit_report",
    "receipts.ocr",
    "receipts_ocr_30db08d7",
    "ask_user",
    "month",
    "cursor",
    "dry_run",
    "note",
    "question",
    "options",
    "2026-09",
    "{",
    "{}",
    "null",
    "[1]",
    "\"x\"",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        ".{0,12}".prop_map(Value::from),
        prop::sample::select(WORDS).prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..6)
                .prop_map(|fields| Value::Object(fields.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(WORDS).prop_map(str::to_owned),
        1 => "[a-zA-Z_]{0,8}",
    ]
}

/// Arguments, mostly objects of the fixture's fields, sometimes anything.
fn args() -> impl Strategy<Value = Value> {
    let field = prop_oneof![
        Just(json!("2026-09")),
        Just(json!(true)),
        Just(json!(false)),
        Just(Value::Null),
        Just(json!(["a", "b"])),
        json_value(),
    ];
    prop_oneof![
        3 => prop::collection::vec((key(), field), 0..5)
            .prop_map(|fields| Value::Object(fields.into_iter().collect::<Map<_, _>>())),
        1 => json_value(),
    ]
}

/// How the arguments go on the wire: as sent, as JSON text, as broken text.
#[derive(Debug, Clone)]
enum Encoding {
    Value,
    Text,
    Truncated(usize),
}

/// A name and arguments that fit a fixture tool, so every outcome is reached.
const FITTING: &[(&str, &str)] = &[
    ("find_expenses", r#"{"month": "2026-09"}"#),
    ("find_expenses", r#"{"month": "2026-09", "cursor": null}"#),
    ("echo.any", r#"{"x": [1, 2]}"#),
    ("echo_any_0ccc243f", "{}"),
    ("submit_report", r#"{"dry_run": true}"#),
    ("receipts.ocr", "{}"),
    ("receipts_ocr_30db08d7", "{}"),
    (
        "ask_user",
        r#"{"question": "Travel or meals?", "options": ["travel", "meals"]}"#,
    ),
    ("ask_user", r#"{"question": "Which month?"}"#),
];

fn provider_call() -> impl Strategy<Value = (usize, (Value, Value), Encoding, Option<String>)> {
    let name = prop_oneof![
        4 => prop::sample::select(WORDS).prop_map(Value::from),
        1 => json_value(),
    ];
    let fitting = prop::sample::select(FITTING).prop_map(|(name, args)| {
        (
            json!(name),
            serde_json::from_str(args).expect("fixture arguments are JSON"),
        )
    });
    let encoding = prop_oneof![
        Just(Encoding::Value),
        Just(Encoding::Text),
        (0usize..64).prop_map(Encoding::Truncated),
    ];
    (
        0..Format::ALL.len(),
        prop_oneof![fitting, (name, args())],
        encoding,
        proptest::option::of("[a-z_0-9]{1,12}"),
    )
}

fn on_the_wire(
    format: Format,
    name: Value,
    args: Value,
    encoding: &Encoding,
    id: Option<String>,
) -> Value {
    let args = match encoding {
        Encoding::Value => args,
        Encoding::Text => Value::String(args.to_string()),
        Encoding::Truncated(at) => {
            let text = args.to_string();
            Value::String(text.chars().take(*at).collect())
        }
    };
    match format {
        Format::Neutral => json!({"tool": name, "args": args}),
        Format::OpenAi => {
            json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
        }
        Format::OpenAiResponses => {
            json!({"type": "function_call", "call_id": id, "name": name, "arguments": args})
        }
        Format::Anthropic => json!({"type": "tool_use", "id": id, "name": name, "input": args}),
        Format::Gemini => json!({"functionCall": {"id": id, "name": name, "args": args}}),
        Format::Mcp => json!({"name": name, "arguments": args}),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_bytes_get_an_envelope_in_every_format(raw in prop::collection::vec(any::<u8>(), 0..256)) {
        for format in Format::ALL {
            answer(format, &raw)?;
        }
    }

    #[test]
    fn random_json_gets_an_envelope_in_every_format(value in json_value()) {
        let raw = serde_json::to_vec(&value).unwrap();
        for format in Format::ALL {
            answer(format, &raw)?;
        }
    }
}

#[test]
fn calls_of_every_shape_in_every_format_get_an_envelope() {
    let seen = Mutex::new(BTreeSet::new());
    let mut runner = TestRunner::new(Config::with_cases(256 * 4));
    runner
        .run(&provider_call(), |(format, (name, args), encoding, id)| {
            let format = Format::ALL[format];
            let raw = on_the_wire(format, name, args, &encoding, id);
            let status = answer(format, &serde_json::to_vec(&raw).unwrap())?;
            seen.lock().unwrap().insert(status);
            Ok(())
        })
        .unwrap();
    // The generator reaches every outcome, so the checks above ran on each.
    let seen = seen.into_inner().unwrap();
    assert_eq!(
        seen,
        STATUSES.iter().map(|s| s.to_string()).collect(),
        "statuses reached"
    );
}
