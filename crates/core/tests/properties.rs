//! Property: whatever arguments arrive, `invoke` answers an envelope of the
//! contract and never panics.

use std::sync::Arc;

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use toolfleet_core::{CallCtx, Envelope, MemoryFleet, Principal, Runtime};
use toolfleet_expenses::{ExpenseBook, tools};

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,40}".prop_map(Value::String),
        prop_oneof![
            Just("2026-09"),
            Just("c50"),
            Just("exp-001"),
            Just("rcpt-005")
        ]
        .prop_map(|s| json!(s)),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop_oneof![
                        Just("month".to_owned()),
                        Just("cursor".to_owned()),
                        Just("line_ids".to_owned()),
                        Just("dry_run".to_owned()),
                        Just("confirm_token".to_owned()),
                        Just("receipt_ids".to_owned()),
                        Just("question".to_owned()),
                        Just("options".to_owned()),
                        Just("handle".to_owned()),
                        ".{0,10}"
                    ],
                    inner
                ),
                0..6
            )
            .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn runtime() -> Runtime {
    let mut runtime = Runtime::builder()
        .fleet(Arc::new(MemoryFleet::default()))
        .build();
    runtime
        .register_all(tools(Arc::new(ExpenseBook::default())).unwrap())
        .unwrap();
    runtime
}

const CODES: [&str; 16] = [
    "unknown_tool",
    "invalid_arguments",
    "forbidden",
    "unauthenticated",
    "rate_limited",
    "timeout",
    "tool_failed",
    "not_found",
    "conflict",
    "confirm_required",
    "invalid_confirm_token",
    "budget_exceeded",
    "cancelled",
    "unavailable",
    "payload_too_large",
    "bad_request",
];

fn check_contract(envelope: &Envelope) {
    let wire: Value = serde_json::from_str(&envelope.to_json()).unwrap();
    match wire["status"].as_str().unwrap() {
        "ok" => assert!(wire.get("result").is_some() && wire["call_id"].is_string()),
        "error" => {
            assert!(CODES.contains(&wire["error"]["code"].as_str().unwrap()));
            assert!(!wire["error"]["message"].as_str().unwrap().is_empty());
            assert!(wire["error"]["retryable"].is_boolean());
        }
        "running" => assert!(wire["job_id"].is_string() && wire["poll_after_s"].is_u64()),
        "suspended" => assert!(wire["ticket"].is_string() && wire["options"].is_array()),
        other => panic!("status {other} is not in the contract"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_arguments_give_an_envelope(
        tool in prop_oneof![
            Just("find_expenses".to_owned()), Just("submit_report".to_owned()),
            Just("start_receipt_ocr".to_owned()), Just("ask_user".to_owned()),
            Just("read_handle".to_owned()), ".{0,20}"
        ],
        args in json_value(),
        scoped in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let runtime = runtime();
        let scopes: Vec<&str> = if scoped { vec!["expenses:read", "expenses:submit"] } else { vec![] };
        let ctx = CallCtx::new(Arc::new(Principal::new("acme", "alice", scopes)));
        let envelope = rt.block_on(runtime.invoke(&tool, args, &ctx));
        check_contract(&envelope);
    }
}
