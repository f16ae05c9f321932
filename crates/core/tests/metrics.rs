//! What `Runtime::invoke` counts in the metrics it was built with: every
//! call by outcome and time, validation failures, denials by scope and rate
//! limit, and the read cache's hits and misses, each under a registered tool
//! name or `unknown`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use toolfleet_core::{CallCtx, Metrics, Principal, RateLimit, Runtime, ToolDecl, ToolError};

fn sample(metrics: &Metrics, series: &str) -> Option<f64> {
    metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn ctx(scopes: &[&str]) -> CallCtx {
    CallCtx::new(Arc::new(Principal::new(
        "acme",
        "alice",
        scopes.iter().copied(),
    )))
}

#[tokio::test]
async fn invoke_counts_outcomes_validation_denials_and_the_cache() {
    let metrics = Arc::new(Metrics::new());
    let mut runtime = Runtime::builder().metrics(metrics.clone()).build();
    runtime
        .register_all([
            ToolDecl::query("find")
                .input_schema(json!({
                    "type": "object",
                    "properties": {"month": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$"}},
                    "required": ["month"]
                }))
                .require_scope("read")
                .cache_reads(Duration::from_secs(60))
                .run(|_: CallCtx, args: Value| async move { Ok::<_, ToolError>(args) }),
            ToolDecl::query("once")
                .rate_limit(RateLimit {
                    max: 1,
                    per: Duration::from_secs(60),
                })
                .run(|_: CallCtx, _: Value| async { Ok::<_, ToolError>(json!({})) }),
        ])
        .expect("tools register");
    assert!(Arc::ptr_eq(runtime.metrics(), &metrics));
    let reader = ctx(&["read"]);
    let month = json!({"month": "2026-09"});
    for _ in 0..2 {
        assert!(runtime.invoke("find", month.clone(), &reader).await.is_ok());
    }
    let bad = runtime
        .invoke("find", json!({"month": "Sept"}), &reader)
        .await;
    assert_eq!(
        bad.error_code().map(|c| c.as_str()),
        Some("invalid_arguments")
    );
    let denied = runtime.invoke("find", month.clone(), &ctx(&[])).await;
    assert_eq!(denied.error_code().map(|c| c.as_str()), Some("forbidden"));
    assert!(runtime.invoke("once", json!({}), &reader).await.is_ok());
    let limited = runtime.invoke("once", json!({}), &reader).await;
    assert_eq!(
        limited.error_code().map(|c| c.as_str()),
        Some("rate_limited")
    );
    let unknown = runtime.invoke("nothing/here", json!({}), &reader).await;
    assert_eq!(
        unknown.error_code().map(|c| c.as_str()),
        Some("unknown_tool")
    );

    for (series, value) in [
        (r#"toolfleet_calls_total{tool="find",outcome="ok"}"#, 2.0),
        (
            r#"toolfleet_calls_total{tool="find",outcome="invalid_arguments"}"#,
            1.0,
        ),
        (
            r#"toolfleet_calls_total{tool="find",outcome="forbidden"}"#,
            1.0,
        ),
        (
            r#"toolfleet_calls_total{tool="once",outcome="rate_limited"}"#,
            1.0,
        ),
        (
            r#"toolfleet_calls_total{tool="unknown",outcome="unknown_tool"}"#,
            1.0,
        ),
        (r#"toolfleet_call_duration_seconds_count{tool="find"}"#, 4.0),
        (
            r#"toolfleet_call_duration_seconds_count{tool="unknown"}"#,
            1.0,
        ),
        (r#"toolfleet_validation_failures_total{tool="find"}"#, 1.0),
        (
            r#"toolfleet_denials_total{tool="find",reason="forbidden"}"#,
            1.0,
        ),
        (
            r#"toolfleet_denials_total{tool="once",reason="rate_limited"}"#,
            1.0,
        ),
        // Validation and authorisation come before the cache.
        (r#"toolfleet_cache_misses_total{tool="find"}"#, 1.0),
        (r#"toolfleet_cache_hits_total{tool="find"}"#, 1.0),
    ] {
        assert_eq!(
            sample(&metrics, series),
            Some(value),
            "{series} in\n{}",
            metrics.render()
        );
    }
    assert!(!metrics.render().contains("nothing/here"));
    assert_eq!(runtime.tool_label("find"), "find");
    assert_eq!(runtime.tool_label("nothing/here"), "unknown");
}

#[tokio::test]
async fn runtimes_built_without_metrics_keep_their_own() {
    let a = Runtime::builder().build();
    let b = Runtime::builder().build();
    assert!(!Arc::ptr_eq(a.metrics(), b.metrics()));
}

#[tokio::test]
async fn a_call_dropped_before_it_answers_counts_as_cancelled_with_its_time() {
    let metrics = Arc::new(Metrics::new());
    let mut runtime = Runtime::builder().metrics(metrics.clone()).build();
    runtime
        .register(ToolDecl::query("slow").run(|_: CallCtx, _: Value| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, ToolError>(json!({}))
        }))
        .expect("tool registers");
    // The client goes away after 50 ms: the call's future is dropped.
    let caller = ctx(&[]);
    let call = runtime.invoke("slow", json!({}), &caller);
    let cut = tokio::time::timeout(Duration::from_millis(50), call).await;
    assert!(cut.is_err(), "the call was still running");
    for (series, value) in [
        (
            r#"toolfleet_calls_total{tool="slow",outcome="cancelled"}"#,
            1.0,
        ),
        (r#"toolfleet_call_duration_seconds_count{tool="slow"}"#, 1.0),
    ] {
        assert_eq!(
            sample(&metrics, series),
            Some(value),
            "{series} in\n{}",
            metrics.render()
        );
    }
    let took = sample(
        &metrics,
        r#"toolfleet_call_duration_seconds_sum{tool="slow"}"#,
    )
    .expect("a duration");
    assert!((0.05..10.0).contains(&took), "{took}");
}

#[tokio::test]
async fn a_long_poll_is_counted_but_not_timed() {
    let metrics = Arc::new(Metrics::new());
    let mut runtime = Runtime::builder().metrics(metrics.clone()).build();
    runtime
        .register(ToolDecl::query("read_later").long_poll("wait_s").run(
            |_: CallCtx, args: Value| async move {
                let wait = args["wait_s"].as_u64().unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(20 * wait)).await;
                Ok::<_, ToolError>(json!({}))
            },
        ))
        .expect("tool registers");
    let reader = ctx(&[]);
    // Two long polls, then two reads that do not wait.
    for args in [
        json!({"wait_s": 1}),
        json!({"wait_s": 2}),
        json!({"wait_s": 0}),
        json!({}),
    ] {
        assert!(runtime.invoke("read_later", args, &reader).await.is_ok());
    }
    for (series, value) in [
        (
            r#"toolfleet_calls_total{tool="read_later",outcome="ok"}"#,
            4.0,
        ),
        (
            r#"toolfleet_call_duration_seconds_count{tool="read_later"}"#,
            2.0,
        ),
    ] {
        assert_eq!(
            sample(&metrics, series),
            Some(value),
            "{series} in\n{}",
            metrics.render()
        );
    }
    let timed = sample(
        &metrics,
        r#"toolfleet_call_duration_seconds_sum{tool="read_later"}"#,
    )
    .expect("a duration");
    // The long polls waited 20 and 40 ms.
    assert!(timed < 0.04, "the waits were timed: {timed}");
}
