//! `start_rate` through the in-process path: a job tool that may start 2
//! times a second (a burst of 2) starts 8 jobs at that rate whatever the
//! worker's slots; the jobs over it wait, retrying, and none fails or
//! spends an attempt for it.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolfleet_core::middleware::RateLimit;
use toolfleet_core::{
    CallCtx, CountedBy, Envelope, ErrorCode, JobState, Principal, RuntimeConfig, ToolDecl,
    ToolError,
};
use toolfleet_worker::WorkerConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_over_the_start_rate_wait_and_none_fails() {
    let rig = common::Rig::new().await;
    let mut runtime = rig.runtime(RuntimeConfig::default());
    let starts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = starts.clone();
    let limit = RateLimit {
        max: 2,
        per: Duration::from_secs(1),
    };
    let call_api = ToolDecl::job("call_api")
        .input_schema(json!({"type": "object", "properties": {"account": {"type": "string"}}}))
        .max_attempts(1)
        .start_rate(limit, CountedBy::Tenant)
        .run(move |_ctx: CallCtx, _args: Value| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(Instant::now());
                Ok::<_, ToolError>(json!({}))
            }
        });
    let mut per_account = ToolDecl::job("per_account")
        .input_schema(json!({"type": "object", "properties": {"account": {"type": "string"}}}))
        .run(|_ctx: CallCtx, _args: Value| async move { Ok::<_, ToolError>(json!({})) });
    per_account.start_rate = Some(toolfleet_core::StartRate {
        limit,
        by: CountedBy::Pointer("/account".to_owned()),
    });
    runtime.register_all([call_api, per_account]).unwrap();
    let runtime = Arc::new(runtime);
    let principal = Arc::new(Principal::new("acme", "alice", Vec::<String>::new()));
    let missing = runtime
        .invoke("per_account", json!({}), &CallCtx::new(principal.clone()))
        .await;
    match missing {
        Envelope::Error { error, .. } => assert_eq!(error.code, ErrorCode::InvalidArguments),
        other => panic!("{other:?}"),
    }
    let mut ids = Vec::new();
    for _ in 0..8 {
        match runtime
            .invoke("call_api", json!({}), &CallCtx::new(principal.clone()))
            .await
        {
            Envelope::Running { job_id, .. } => ids.push(job_id),
            other => panic!("{other:?}"),
        }
    }
    let mut config = WorkerConfig::new(toolfleet_core::DEFAULT_POOL);
    config.concurrency = 8;
    let stop = rig.start(&rig.worker(config, &runtime));
    for id in &ids {
        let job = rig
            .until(id, JobState::Succeeded, Duration::from_secs(20))
            .await;
        assert_eq!(job.attempts, 1, "waiting spent no attempt");
    }
    let mut starts = starts.lock().unwrap().clone();
    starts.sort();
    let first = starts[0];
    let offsets: Vec<f64> = starts
        .iter()
        .map(|t| t.duration_since(first).as_secs_f64())
        .collect();
    println!("starts at {offsets:.2?} s");
    // A burst of 2, then one every half second: the k-th start (from 0)
    // no sooner than (k - 1) / 2 s after the first.
    for (k, offset) in offsets.iter().enumerate().skip(2) {
        let earliest = (k as f64 - 1.0) * 0.5 - 0.05;
        assert!(
            *offset >= earliest,
            "start {k} at {offset:.2} s, before {earliest:.2} s"
        );
    }
    assert!(
        offsets[7] < 6.0,
        "the waiting jobs start as starts free: {offsets:?}"
    );
    let _ = stop.send(true);
}
