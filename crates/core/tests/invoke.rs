//! The contract of `Runtime::invoke`, point by point: registration checks,
//! validation, errors as results, middleware order and isolation, and the
//! shapes' contracts.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use toolfleet_core::middleware::{Call, Layer, Next, Stage};
use toolfleet_core::tool::{Budget, Lineage};
use toolfleet_core::{
    CallCtx, CountedBy, Envelope, ErrorCode, Json, MemoryAuditSink, MemoryFleet, Principal,
    RateLimit, Runtime, RuntimeConfig, ToolDecl, ToolError,
};

fn ctx(tenant: &str, user: &str, scopes: &[&str]) -> CallCtx {
    CallCtx::new(Arc::new(Principal::new(
        tenant,
        user,
        scopes.iter().copied(),
    )))
}

fn object(props: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": props, "required": required})
}

/// A query that counts its runs and echoes its arguments with the caller.
fn counting_query(name: &str, runs: Arc<AtomicUsize>) -> ToolDecl {
    ToolDecl::query(name)
        .description("Echo the arguments.")
        .input_schema(object(json!({"q": {"type": "string"}}), &["q"]))
        .run(move |ctx: CallCtx, args: Value| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, ToolError>(
                    json!({"args": args, "tenant": ctx.tenant(), "user": ctx.user()}),
                )
            }
        })
}

fn result(envelope: &Envelope) -> Value {
    envelope
        .result()
        .unwrap_or_else(|| panic!("expected ok, got {}", envelope.to_json()))
        .to_value()
}

fn refused(decl: ToolDecl) -> String {
    let mut runtime = Runtime::builder().build();
    runtime
        .register(decl)
        .expect_err("registration must refuse")
        .to_string()
}

fn noop() -> ToolDecl {
    ToolDecl::query("x").run(|_, _: Value| async { Ok::<_, ToolError>(json!({})) })
}

#[test]
fn names_follow_the_rules() {
    for bad in ["", "has space", "ümlaut", "slash/name", &"a".repeat(129)] {
        let mut decl = noop();
        decl.name = bad.to_owned();
        assert!(
            refused(decl).contains("1 to 128 characters"),
            "{bad:?} accepted"
        );
    }
    let mut runtime = Runtime::builder().build();
    for good in ["a", "A.b-c_9", &"z".repeat(128)] {
        let mut decl = noop();
        decl.name = good.to_owned();
        runtime.register(decl).expect(good);
    }
}

#[test]
fn registration_refuses_what_contradicts_the_shape() {
    let mut runtime = Runtime::builder().build();
    runtime.register(noop()).unwrap();
    let duplicate = runtime.register(noop()).unwrap_err();
    assert!(duplicate.to_string().contains("`x`") && duplicate.rule == "unique_name");

    let bad_schema = refused(
        noop().input_schema(json!({"type": "object", "properties": {"a": {"type": "strin"}}})),
    );
    assert!(bad_schema.contains("does not compile"), "{bad_schema}");
    let not_object = refused(noop().input_schema(json!({"type": "array"})));
    assert!(not_object.contains("type: \"object\""), "{not_object}");
    // Remote references are never fetched: the schema does not compile.
    let remote = refused(noop().input_schema(
        json!({"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/x.json"}}}),
    ));
    assert!(remote.contains("does not compile"), "{remote}");

    let run = |d: ToolDecl| d.run(|_, _: Value| async { Ok::<_, ToolError>(json!({})) });
    let no_dry_run = refused(run(
        ToolDecl::command("c").input_schema(object(json!({"a": {"type": "string"}}), &[]))
    ));
    assert!(
        no_dry_run.contains("dry_run") && no_dry_run.contains("`c`"),
        "{no_dry_run}"
    );
    let optional = refused(run(
        ToolDecl::command("c").input_schema(object(json!({"dry_run": {"type": "boolean"}}), &[]))
    ));
    assert!(optional.contains("required"), "{optional}");
    let not_bool = refused(run(ToolDecl::command("c")
        .input_schema(object(json!({"dry_run": {"type": "string"}}), &["dry_run"]))));
    assert!(not_bool.contains("boolean"), "{not_bool}");

    let cached_command = refused(run(ToolDecl::command("c")
        .input_schema(object(
            json!({"dry_run": {"type": "boolean"}}),
            &["dry_run"],
        ))
        .cache_reads(Duration::from_secs(5))));
    assert!(cached_command.contains("cache_reads"), "{cached_command}");
    let cached_job = refused(run(ToolDecl::job("j").cache_reads(Duration::from_secs(5))));
    assert!(cached_job.contains("read-only"), "{cached_job}");

    assert!(refused(run(ToolDecl::query("q").read_only(false))).contains("read_only"));
    assert!(refused(run(ToolDecl::handle("h").read_only(false))).contains("read_only"));
    let read_only_command = refused(run(ToolDecl::command("c")
        .input_schema(object(
            json!({"dry_run": {"type": "boolean"}}),
            &["dry_run"],
        ))
        .read_only(true)));
    assert!(
        read_only_command.contains("read_only"),
        "{read_only_command}"
    );
    assert!(refused(ToolDecl::query("q")).contains("executor"));
}

#[tokio::test]
async fn unknown_tools_get_suggestions() {
    let mut runtime = Runtime::builder().build();
    runtime
        .register(counting_query("find_expenses", Arc::default()))
        .unwrap();
    runtime
        .register(counting_query("submit_report", Arc::default()))
        .unwrap();
    let answer = runtime
        .invoke("find_expense", json!({}), &ctx("a", "u", &[]))
        .await;
    let error = answer.error_ref().unwrap();
    assert_eq!(error.code, ErrorCode::UnknownTool);
    assert!(
        error.message.contains("did you mean `find_expenses`"),
        "{}",
        error.message
    );
    assert_eq!(
        error.details.as_ref().unwrap()["suggestions"][0],
        "find_expenses"
    );
    let nothing = runtime
        .invoke("zzzzzzzzzzzz", json!({}), &ctx("a", "u", &[]))
        .await;
    assert_eq!(nothing.error_code(), Some(ErrorCode::UnknownTool));
    // A name no tool may have gets no suggestion, even one that contains a
    // tool's name (which would otherwise score).
    let long = format!("find_expenses{}", "x".repeat(129));
    let refused = runtime.invoke(&long, json!({}), &ctx("a", "u", &[])).await;
    let error = refused.error_ref().unwrap();
    assert_eq!(error.code, ErrorCode::UnknownTool);
    assert!(error.message.contains("at most 128"), "{}", error.message);
    assert_eq!(error.details.as_ref().unwrap()["suggestions"], json!([]));
}

#[tokio::test]
async fn invalid_arguments_list_every_violation_and_run_nothing() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut runtime = Runtime::builder().build();
    let decl = ToolDecl::query("find")
        .input_schema(json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["month", "limit"],
            "properties": {
                "month": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$"},
                "limit": {"type": "integer", "maximum": 50},
                "tags": {"type": "array", "items": {"type": "string"}}
            }
        }))
        .run({
            let runs = runs.clone();
            move |_, _: Value| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, ToolError>(json!({}))
                }
            }
        });
    runtime.register(decl).unwrap();
    let answer = runtime
        .invoke(
            "find",
            json!({"month": "Sept", "limit": 500, "tags": ["a", 3], "extra": true}),
            &ctx("a", "u", &[]),
        )
        .await;
    let error = answer.error_ref().unwrap();
    assert_eq!(error.code, ErrorCode::InvalidArguments);
    assert!(!error.retryable);
    let violations = error.details.as_ref().unwrap()["violations"]
        .as_array()
        .unwrap()
        .clone();
    let seen: Vec<(String, String)> = violations
        .iter()
        .map(|v| {
            (
                v["path"].as_str().unwrap().to_owned(),
                v["rule"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for expected in [
        ("/month", "pattern"),
        ("/limit", "maximum"),
        ("/tags/1", "type"),
        ("/", "additionalProperties"),
    ] {
        assert!(
            seen.contains(&(expected.0.to_owned(), expected.1.to_owned())),
            "{expected:?} not in {seen:?}"
        );
        assert!(error.message.contains(expected.0));
    }
    assert!(
        error.message.contains("\"Sept\""),
        "the message shows the bad value: {}",
        error.message
    );
    let missing = runtime.invoke("find", json!({}), &ctx("a", "u", &[])).await;
    assert!(missing.error_ref().unwrap().message.contains("month"));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "no tool code ran on bad arguments"
    );
}

#[tokio::test]
async fn failures_and_panics_are_results() {
    let mut runtime = Runtime::builder().build();
    runtime
        .register(ToolDecl::query("fails").run(|_, _: Value| async {
            Err::<Value, _>(ToolError::failed("the ledger is closed", false))
        }))
        .unwrap();
    runtime
        .register(ToolDecl::query("panics").run(|_, _: Value| async {
            if true {
                panic!("index out of bounds");
            }
            Ok::<Value, ToolError>(json!({}))
        }))
        .unwrap();
    let c = ctx("a", "u", &[]);
    let failed = runtime.invoke("fails", json!({}), &c).await;
    assert_eq!(failed.error_code(), Some(ErrorCode::ToolFailed));
    assert!(
        failed
            .error_ref()
            .unwrap()
            .message
            .contains("ledger is closed")
    );
    let panicked = runtime.invoke("panics", json!({}), &c).await;
    assert_eq!(panicked.error_code(), Some(ErrorCode::ToolFailed));
    assert!(
        panicked
            .error_ref()
            .unwrap()
            .message
            .contains("index out of bounds")
    );
    // The runtime keeps serving.
    assert_eq!(
        runtime.invoke("fails", json!({}), &c).await.error_code(),
        Some(ErrorCode::ToolFailed)
    );
}

/// Records the order in which layers saw the call.
struct Trace(&'static str, Arc<std::sync::Mutex<Vec<&'static str>>>);

impl Layer for Trace {
    fn call<'a>(&'a self, call: Call<'a>, next: Next<'a>) -> BoxFuture<'a, Envelope> {
        self.1.lock().unwrap().push(self.0);
        next.run(call)
    }
}

#[tokio::test]
async fn middleware_order_is_fixed_whatever_the_declaration() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut runtime = Runtime::builder().build();
    let tool = runtime
        .register(
            counting_query("q", Arc::default())
                .layer(Arc::new(Trace("mine", seen.clone())))
                .timeout(Duration::from_secs(1))
                .cache_reads(Duration::from_secs(60))
                .rate_limit(RateLimit {
                    max: 100,
                    per: Duration::from_secs(1),
                })
                .require_scope("s")
                .redact(["secret"])
                .audit(),
        )
        .unwrap();
    assert_eq!(
        tool.stages(),
        [
            Stage::Audit,
            Stage::Redact,
            Stage::Authorise,
            Stage::RateLimit,
            Stage::Cache,
            Stage::Timeout,
            Stage::Custom
        ]
    );
    let answer = runtime
        .invoke("q", json!({"q": "x"}), &ctx("a", "u", &["s"]))
        .await;
    assert!(answer.is_ok());
    assert_eq!(*seen.lock().unwrap(), ["mine"]);
}

#[tokio::test]
async fn a_cached_answer_never_reaches_a_caller_without_the_scope() {
    let runs = Arc::new(AtomicUsize::new(0));
    let sink = Arc::new(MemoryAuditSink::default());
    let mut runtime = Runtime::builder().audit_sink(sink.clone()).build();
    runtime
        .register(
            counting_query("q", runs.clone())
                .cache_reads(Duration::from_secs(60))
                .require_scope("read")
                .audit(),
        )
        .unwrap();
    let args = json!({"q": "same"});
    assert!(
        runtime
            .invoke("q", args.clone(), &ctx("acme", "alice", &["read"]))
            .await
            .is_ok()
    );
    assert!(
        runtime
            .invoke("q", args.clone(), &ctx("acme", "alice", &["read"]))
            .await
            .is_ok()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the second call was a hit");
    // Same tenant, same user, same arguments, but the scope is gone.
    let denied = runtime
        .invoke("q", args.clone(), &ctx("acme", "alice", &[]))
        .await;
    assert_eq!(denied.error_code(), Some(ErrorCode::Forbidden));
    // Denied calls are audited.
    let records = sink.records();
    assert_eq!(records.len(), 3);
    assert_eq!(records[2].status, "error");
    assert_eq!(records[2].error_code, Some(ErrorCode::Forbidden));
    assert_eq!(records[2].tenant, "acme");
}

#[tokio::test]
async fn tenants_and_users_never_share_a_cache_entry() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut runtime = Runtime::builder().build();
    runtime
        .register(counting_query("q", runs.clone()).cache_reads(Duration::from_secs(60)))
        .unwrap();
    let args = json!({"q": "same"});
    let a = result(
        &runtime
            .invoke("q", args.clone(), &ctx("acme", "alice", &[]))
            .await,
    );
    let b = result(
        &runtime
            .invoke("q", args.clone(), &ctx("globex", "alice", &[]))
            .await,
    );
    let c = result(
        &runtime
            .invoke("q", args.clone(), &ctx("acme", "bob", &[]))
            .await,
    );
    assert_eq!(
        (
            a["tenant"].as_str(),
            b["tenant"].as_str(),
            c["user"].as_str()
        ),
        (Some("acme"), Some("globex"), Some("bob"))
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    // Member order does not make a new entry; different arguments do.
    let again = runtime
        .invoke("q", json!({"q": "same"}), &ctx("acme", "alice", &[]))
        .await;
    assert_eq!(result(&again)["tenant"], "acme");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    runtime
        .invoke("q", json!({"q": "other"}), &ctx("acme", "alice", &[]))
        .await;
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn rate_limits_answer_when_to_come_back() {
    let mut runtime = Runtime::builder().build();
    runtime
        .register(counting_query("q", Arc::default()).rate_limit(RateLimit {
            max: 2,
            per: Duration::from_secs(60),
        }))
        .unwrap();
    let args = json!({"q": "x"});
    let acme = ctx("acme", "u", &[]);
    assert!(runtime.invoke("q", args.clone(), &acme).await.is_ok());
    assert!(runtime.invoke("q", args.clone(), &acme).await.is_ok());
    let limited = runtime.invoke("q", args.clone(), &acme).await;
    let error = limited.error_ref().unwrap();
    assert_eq!(error.code, ErrorCode::RateLimited);
    assert!(error.retryable);
    assert!(
        (1..=30).contains(&error.retry_after_s.unwrap()),
        "{error:?}"
    );
    // The limit is per tenant.
    assert!(
        runtime
            .invoke("q", args, &ctx("globex", "u", &[]))
            .await
            .is_ok()
    );
}

/// A rate limit may count per user or per value of an argument, within a
/// tenant; a pointer into nothing is refused at registration and a call
/// without the argument is told to give it.
#[tokio::test]
async fn rate_limits_count_per_user_or_per_argument_when_declared() {
    let limit = RateLimit {
        max: 1,
        per: Duration::from_secs(60),
    };
    let mut runtime = Runtime::builder().build();
    let mut per_user = counting_query("per_user", Arc::default()).rate_limit(limit);
    per_user.middleware.rate_limit_by = CountedBy::User;
    let mut per_q = counting_query("per_q", Arc::default()).rate_limit(limit);
    per_q.middleware.rate_limit_by = CountedBy::Pointer("/q".to_owned());
    runtime.register_all([per_user, per_q]).unwrap();
    let (alice, bob) = (ctx("acme", "alice", &[]), ctx("acme", "bob", &[]));
    let x = json!({"q": "x"});
    assert!(runtime.invoke("per_user", x.clone(), &alice).await.is_ok());
    assert!(
        runtime.invoke("per_user", x.clone(), &bob).await.is_ok(),
        "bob's own"
    );
    let limited = runtime.invoke("per_user", x.clone(), &alice).await;
    let error = limited.error_ref().unwrap();
    assert_eq!(error.code, ErrorCode::RateLimited);
    assert!(error.message.contains("per user"), "{}", error.message);
    assert!(runtime.invoke("per_q", x.clone(), &alice).await.is_ok());
    assert!(
        runtime
            .invoke("per_q", json!({"q": "y"}), &alice)
            .await
            .is_ok(),
        "another value's own"
    );
    let limited = runtime.invoke("per_q", x.clone(), &bob).await;
    let error = limited.error_ref().unwrap();
    assert_eq!(
        error.code,
        ErrorCode::RateLimited,
        "one count per value, whoever calls"
    );
    assert!(
        error.message.contains("per value of `/q`"),
        "{}",
        error.message
    );
    assert!(
        runtime
            .invoke("per_q", x, &ctx("globex", "u", &[]))
            .await
            .is_ok(),
        "within a tenant"
    );

    let mut nowhere = counting_query("nowhere", Arc::default()).rate_limit(limit);
    nowhere.middleware.rate_limit_by = CountedBy::Pointer("/account".to_owned());
    let refused = runtime.register(nowhere).unwrap_err();
    assert_eq!(refused.rule, "rate_limit");
    assert!(
        refused.message.contains("points into nothing"),
        "{}",
        refused.message
    );
    let mut optional = ToolDecl::query("optional")
        .input_schema(json!({"type": "object", "properties": {"account": {"type": "string"}}}))
        .rate_limit(limit)
        .run(|_, _: Value| async { Ok::<_, ToolError>(json!({})) });
    optional.middleware.rate_limit_by = CountedBy::Pointer("/account".to_owned());
    runtime.register(optional).unwrap();
    let missing = runtime.invoke("optional", json!({}), &alice).await;
    let error = missing.error_ref().unwrap();
    assert_eq!(error.code, ErrorCode::InvalidArguments);
    assert!(error.message.contains("`/account`"), "{}", error.message);
}

#[tokio::test]
async fn timeouts_bound_inline_calls() {
    let mut runtime = Runtime::builder().build();
    runtime
        .register(
            ToolDecl::query("slow")
                .timeout(Duration::from_millis(20))
                .run(|_, _: Value| async {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    Ok::<_, ToolError>(json!({}))
                }),
        )
        .unwrap();
    let answer = runtime.invoke("slow", json!({}), &ctx("a", "u", &[])).await;
    let error = answer.error_ref().unwrap();
    assert_eq!(error.code, ErrorCode::Timeout);
    assert!(error.retryable && error.message.contains("20 ms"));
}

#[tokio::test]
async fn redaction_masks_audit_records_and_results() {
    let sink = Arc::new(MemoryAuditSink::default());
    let mut runtime = Runtime::builder().audit_sink(sink.clone()).build();
    runtime
        .register(
            ToolDecl::query("card")
                .input_schema(object(json!({"card_number": {"type": "string"}, "name": {"type": "string"}}), &[]))
                .audit()
                .redact(["card_number"])
                .run(|_, args: Value| async move {
                    Ok::<_, ToolError>(json!({"holder": {"name": args["name"], "card_number": args["card_number"]}}))
                }),
        )
        .unwrap();
    let answer = runtime
        .invoke(
            "card",
            json!({"card_number": "4111", "name": "Ada"}),
            &ctx("a", "u", &[]),
        )
        .await;
    let out = result(&answer);
    assert_eq!(out["holder"]["card_number"], "[redacted]");
    assert_eq!(out["holder"]["name"], "Ada");
    let record = &sink.records()[0];
    assert_eq!(record.args["card_number"], "[redacted]");
    assert_eq!(record.args["name"], "Ada");
    assert!(!serde_json::to_string(record).unwrap().contains("4111"));
}

#[tokio::test]
async fn audit_records_the_parent_run_of_a_sub_agents_call() {
    let sink = Arc::new(MemoryAuditSink::default());
    let mut runtime = Runtime::builder().audit_sink(sink.clone()).build();
    runtime.register(noop().audit()).unwrap();
    let mut child = ctx("acme", "alice", &[]).with_run_id("run-of-the-sub-agent");
    child.lineage = Some(Lineage {
        parent_run_id: "run-of-the-caller".to_owned(),
        depth: 1,
        budget: Budget {
            max_steps: 5,
            max_tokens: 10_000,
            max_wall_ms: 60_000,
        },
    });
    assert!(runtime.invoke("x", json!({}), &child).await.is_ok());
    assert!(
        runtime
            .invoke("x", json!({}), &ctx("acme", "alice", &[]))
            .await
            .is_ok()
    );
    let records = sink.records();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].run_id, "run-of-the-sub-agent");
    assert_eq!(
        records[0].parent_run_id.as_deref(),
        Some("run-of-the-caller")
    );
    let text = serde_json::to_string(&records[0]).unwrap();
    assert!(
        text.contains(r#""parent_run_id":"run-of-the-caller""#),
        "{text}"
    );
    // A call no agent made has no parent, and its record does not say one.
    assert_eq!(records[1].parent_run_id, None);
    let text = serde_json::to_string(&records[1]).unwrap();
    assert!(!text.contains("parent_run_id"), "{text}");
}

#[tokio::test]
async fn a_layer_of_ones_own_is_a_few_lines() {
    struct Stamp;
    impl Layer for Stamp {
        fn call<'a>(&'a self, call: Call<'a>, next: Next<'a>) -> BoxFuture<'a, Envelope> {
            Box::pin(async move {
                match next.run(call).await {
                    Envelope::Ok { result, call_id } => {
                        let mut value = result.to_value();
                        value["stamped"] = json!(true);
                        Envelope::ok(Json::from(value), call_id)
                    }
                    other => other,
                }
            })
        }
    }
    let mut runtime = Runtime::builder().build();
    runtime
        .register(counting_query("q", Arc::default()).layer(Arc::new(Stamp)))
        .unwrap();
    let answer = runtime
        .invoke("q", json!({"q": "x"}), &ctx("a", "u", &[]))
        .await;
    assert_eq!(result(&answer)["stamped"], true);
}

#[tokio::test]
async fn large_handle_results_are_kept_and_paged() {
    let mut runtime = Runtime::builder().build();
    runtime
        .register(
            ToolDecl::handle("export")
                .handle_threshold(1024)
                .input_schema(object(
                    json!({"n": {"type": "integer", "minimum": 0, "maximum": 5000}}),
                    &["n"],
                ))
                .run(|_, args: Value| async move {
                    let n = args["n"].as_u64().unwrap_or(0);
                    Ok::<_, ToolError>(
                        (0..n)
                            .map(|i| json!({"row": i, "text": "some text"}))
                            .collect::<Vec<_>>(),
                    )
                }),
        )
        .unwrap();
    let alice = ctx("acme", "alice", &[]);
    let small = result(&runtime.invoke("export", json!({"n": 2}), &alice).await);
    assert_eq!(
        small.as_array().unwrap().len(),
        2,
        "small results come back whole"
    );

    let big = result(&runtime.invoke("export", json!({"n": 1000}), &alice).await);
    let handle = big["handle"].as_str().unwrap().to_owned();
    assert!(big["size_bytes"].as_u64().unwrap() > 20_000);
    assert_eq!(big["items"], 1000);
    assert!(big["preview"].as_str().unwrap().starts_with("[{\"row\":0"));
    assert!(big["preview"].as_str().unwrap().chars().count() <= 301);
    assert_eq!(big["read_with"], "read_handle");

    let mut rows = 0;
    let mut offset = 0;
    loop {
        let page = result(
            &runtime
                .invoke(
                    "read_handle",
                    json!({"handle": handle, "offset": offset, "limit": 200}),
                    &alice,
                )
                .await,
        );
        let items = page["items"].as_array().unwrap();
        assert_eq!(items[0]["row"], offset);
        rows += items.len();
        match page["next_offset"].as_u64() {
            Some(next) => offset = next,
            None => break,
        }
    }
    assert_eq!(rows, 1000);
    for stranger in [ctx("acme", "bob", &[]), ctx("globex", "alice", &[])] {
        let other = runtime
            .invoke("read_handle", json!({"handle": handle}), &stranger)
            .await;
        assert_eq!(other.error_code(), Some(ErrorCode::NotFound));
    }
}

fn report_tool(runs: Arc<AtomicUsize>) -> ToolDecl {
    ToolDecl::command("file_report")
        .input_schema(json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["amount", "dry_run"],
            "properties": {"amount": {"type": "integer"}, "dry_run": {"type": "boolean"}}
        }))
        .run(move |ctx: CallCtx, args: Value| {
            let runs = runs.clone();
            async move {
                if args["dry_run"] == true {
                    return Ok::<_, ToolError>(json!({"would_file": args["amount"]}));
                }
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(json!({"report_id": format!("r{n}"), "key": ctx.idempotency_key}))
            }
        })
}

#[tokio::test]
async fn commands_run_the_two_step_protocol() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut runtime = Runtime::builder().build();
    let tool = runtime.register(report_tool(runs.clone())).unwrap();
    assert!(
        tool.input_schema()["properties"]["confirm_token"].is_object(),
        "the runtime adds confirm_token"
    );
    let alice = ctx("acme", "alice", &[]);

    let dry = result(
        &runtime
            .invoke("file_report", json!({"amount": 5, "dry_run": true}), &alice)
            .await,
    );
    assert_eq!(dry["plan"]["would_file"], 5);
    let token = dry["confirm_token"].as_str().unwrap().to_owned();
    assert!(dry["expires_at"].as_u64().is_some());
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    let no_token = runtime
        .invoke(
            "file_report",
            json!({"amount": 5, "dry_run": false}),
            &alice,
        )
        .await;
    assert_eq!(no_token.error_code(), Some(ErrorCode::ConfirmRequired));
    let other_args = runtime
        .invoke(
            "file_report",
            json!({"amount": 6, "dry_run": false, "confirm_token": token}),
            &alice,
        )
        .await;
    assert_eq!(
        other_args.error_code(),
        Some(ErrorCode::InvalidConfirmToken)
    );
    let other_user = runtime
        .invoke(
            "file_report",
            json!({"amount": 5, "dry_run": false, "confirm_token": token}),
            &ctx("acme", "bob", &[]),
        )
        .await;
    assert_eq!(
        other_user.error_code(),
        Some(ErrorCode::InvalidConfirmToken)
    );
    let forged = runtime
        .invoke(
            "file_report",
            json!({"amount": 5, "dry_run": false, "confirm_token": format!("{token}0")}),
            &alice,
        )
        .await;
    assert_eq!(forged.error_code(), Some(ErrorCode::InvalidConfirmToken));
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    let commit = json!({"amount": 5, "dry_run": false, "confirm_token": token});
    let first = result(&runtime.invoke("file_report", commit.clone(), &alice).await);
    assert_eq!(first["report_id"], "r1");
    assert_eq!(
        first["key"], token,
        "the executor gets the token as its idempotency key"
    );
    let again = result(&runtime.invoke("file_report", commit.clone(), &alice).await);
    assert_eq!(again, first);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a repeated commit does not run the tool again"
    );
}

#[tokio::test]
async fn concurrent_commits_of_one_token_run_once() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut runtime = Runtime::builder().build();
    runtime.register(report_tool(runs.clone())).unwrap();
    let alice = ctx("acme", "alice", &[]);
    let dry = result(
        &runtime
            .invoke("file_report", json!({"amount": 1, "dry_run": true}), &alice)
            .await,
    );
    let commit = json!({"amount": 1, "dry_run": false, "confirm_token": dry["confirm_token"]});
    let answers = futures_util::future::join_all(
        (0..8).map(|_| runtime.invoke("file_report", commit.clone(), &alice)),
    )
    .await;
    assert!(answers.iter().all(|a| result(a)["report_id"] == "r1"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn expired_confirm_tokens_are_refused() {
    let runs = Arc::new(AtomicUsize::new(0));
    let config = RuntimeConfig {
        confirm_ttl: Duration::ZERO,
        ..RuntimeConfig::default()
    };
    let mut runtime = Runtime::builder().config(config).build();
    runtime.register(report_tool(runs.clone())).unwrap();
    let alice = ctx("acme", "alice", &[]);
    let dry = result(
        &runtime
            .invoke("file_report", json!({"amount": 1, "dry_run": true}), &alice)
            .await,
    );
    let commit = json!({"amount": 1, "dry_run": false, "confirm_token": dry["confirm_token"]});
    let answer = runtime.invoke("file_report", commit, &alice).await;
    let error = answer.error_ref().unwrap();
    assert_eq!(error.code, ErrorCode::InvalidConfirmToken);
    assert!(error.message.contains("expired"), "{}", error.message);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn jobs_and_humans_hand_off_to_the_fleet() {
    let fleet = Arc::new(MemoryFleet::default());
    let mut runtime = Runtime::builder().fleet(fleet.clone()).build();
    runtime
        .register(
            ToolDecl::job("ocr")
                .poll_after_s(20)
                .pool("ocr")
                .input_schema(object(json!({"ids": {"type": "array"}}), &["ids"]))
                .run(|_, _: Value| async { Ok::<_, ToolError>(json!({})) }),
        )
        .unwrap();
    runtime
        .register(ToolDecl::human("ask").input_schema(object(
            json!({"question": {"type": "string"}, "options": {"type": "array", "items": {"type": "string"}}}),
            &["question"],
        )))
        .unwrap();
    let alice = ctx("acme", "alice", &[]).with_idempotency_key("k1");
    let first = runtime.invoke("ocr", json!({"ids": [1]}), &alice).await;
    let Envelope::Running {
        job_id,
        poll_after_s,
        ..
    } = &first
    else {
        panic!("{}", first.to_json())
    };
    assert_eq!(*poll_after_s, 20);
    let job = fleet.job(job_id).unwrap();
    assert_eq!(
        (job.request.pool.as_str(), job.request.ctx.tenant()),
        ("ocr", "acme")
    );
    let same = runtime.invoke("ocr", json!({"ids": [1]}), &alice).await;
    assert_eq!(same, first, "the same idempotency key answers the same job");
    let conflict = runtime.invoke("ocr", json!({"ids": [2]}), &alice).await;
    assert_eq!(conflict.error_code(), Some(ErrorCode::Conflict));
    let other_tenant = runtime
        .invoke(
            "ocr",
            json!({"ids": [2]}),
            &ctx("globex", "alice", &[]).with_idempotency_key("k1"),
        )
        .await;
    assert_eq!(other_tenant.status(), "running", "keys are per tenant");

    let asked = runtime
        .invoke(
            "ask",
            json!({"question": "travel or meals?", "options": ["travel", "meals"]}),
            &alice,
        )
        .await;
    let Envelope::Suspended {
        ticket,
        question,
        options,
        ..
    } = asked
    else {
        panic!()
    };
    assert_eq!(question, "travel or meals?");
    assert_eq!(options, ["travel", "meals"]);
    assert_eq!(fleet.tickets()[0].0, ticket);

    // Without a fleet, enqueued shapes say so instead of failing obscurely.
    let mut bare = Runtime::builder().build();
    bare.register(ToolDecl::job("j").run(|_, _: Value| async { Ok::<_, ToolError>(json!({})) }))
        .unwrap();
    assert_eq!(
        bare.invoke("j", json!({}), &alice).await.error_code(),
        Some(ErrorCode::Unavailable)
    );
}

/// What only the MCP server gives a tool that asks its client (its answers,
/// its signed state, the client's capabilities) is never taken from a
/// caller: dropped from the arguments unless the call says the server put
/// it there itself.
#[tokio::test]
async fn a_caller_cannot_hand_a_tool_that_asks_its_own_answers_or_state() {
    let mut runtime = Runtime::builder().build();
    let mut decl = ToolDecl::query("asks")
        .description("Echo the arguments.")
        .input_schema(json!({"type": "object"}))
        .run(|_, args: Value| async move { Ok::<_, ToolError>(json!({"args": args})) });
    decl.asks_client = true;
    runtime.register(decl).expect("registered");
    let forged = json!({
        "q": "x",
        "request_state": {"confirmed": true},
        "input_responses": {"ok": {"action": "accept"}},
        "client_capabilities": {"sampling": {}}
    });
    let caller = ctx("acme", "alice", &[]);
    let seen = result(&runtime.invoke("asks", forged.clone(), &caller).await);
    assert_eq!(seen["args"], json!({"q": "x"}), "{seen}");
    let mut server = ctx("acme", "alice", &[]);
    server.client_input = true;
    let seen = result(&runtime.invoke("asks", forged.clone(), &server).await);
    assert_eq!(seen["args"], forged, "{seen}");
    // A tool that does not ask sees its arguments as given.
    runtime
        .register(
            ToolDecl::query("plain")
                .description("Echo the arguments.")
                .input_schema(json!({"type": "object"}))
                .run(|_, args: Value| async move { Ok::<_, ToolError>(json!({"args": args})) }),
        )
        .expect("registered");
    let seen = result(&runtime.invoke("plain", forged.clone(), &caller).await);
    assert_eq!(seen["args"], forged, "{seen}");
}
