//! Fair share through the in-process path: while a 20,000-job backlog of
//! one tenant drains in a fair pool, another tenant's job starts before 1 %
//! of that backlog has run (measured and printed); in a pool that is not
//! fair, the same job waits behind the backlog.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use toolfleet_core::{CallCtx, Envelope, Principal, RuntimeConfig, ToolDecl, ToolError};
use toolfleet_worker::WorkerConfig;

const BACKLOG: usize = 20_000;

/// How many of tenant `big`'s backlog of `backlog` jobs started after
/// `small`'s one job was accepted and before it started, in a pool fair or
/// not.
async fn started_before_the_newcomer(fair: bool, backlog: usize) -> usize {
    let pool = "crawl";
    let rig = common::Rig::new().await;
    let mut config = RuntimeConfig::default();
    if fair {
        config.fair_share.insert(pool.to_owned());
    }
    let mut runtime = rig.runtime(config);
    let started: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = started.clone();
    let crawl =
        ToolDecl::job("crawl")
            .pool(pool)
            .priority(0)
            .run(move |ctx: CallCtx, _args: Value| {
                let seen = seen.clone();
                async move {
                    seen.lock().unwrap().push(ctx.tenant().to_owned());
                    Ok::<_, ToolError>(json!({}))
                }
            });
    runtime.register(crawl).expect("the tool registers");
    assert_eq!(runtime.is_fair(pool), fair);
    let runtime = Arc::new(runtime);
    let big = Arc::new(Principal::new("big", "bulk", Vec::<String>::new()));
    for _ in 0..backlog {
        let answer = runtime
            .invoke("crawl", json!({}), &CallCtx::new(big.clone()))
            .await;
        assert!(matches!(answer, Envelope::Running { .. }), "{answer:?}");
    }
    let mut worker_config = WorkerConfig::new(pool);
    worker_config.concurrency = 8;
    worker_config.ahead = 8;
    worker_config.ordered = true;
    let stop = rig.start(&rig.worker(worker_config, &runtime));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while started.lock().unwrap().len() < 100 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the backlog never started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let small = Arc::new(Principal::new("small", "one", Vec::<String>::new()));
    let before = started.lock().unwrap().len();
    let answer = runtime
        .invoke("crawl", json!({}), &CallCtx::new(small))
        .await;
    assert!(matches!(answer, Envelope::Running { .. }), "{answer:?}");
    let ahead = loop {
        if let Some(at) = started.lock().unwrap().iter().position(|t| t == "small") {
            break at - before;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the newcomer never started"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let _ = stop.send(true);
    ahead
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_starts_before_one_percent_of_anothers_backlog_has_run() {
    let fair = started_before_the_newcomer(true, BACKLOG).await;
    println!(
        "fair pool: {fair} jobs of a {BACKLOG}-job backlog started between another tenant's call and its start ({:.2} %)",
        fair as f64 * 100.0 / BACKLOG as f64
    );
    assert!(
        fair < BACKLOG / 100,
        "{fair} of the backlog ran first, 1 % is {}",
        BACKLOG / 100
    );
}

/// The control: ordered by priority alone, the newcomer waits behind the
/// whole backlog left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fair_share_a_newcomer_waits_behind_the_backlog() {
    let backlog = 2_000;
    let unfair = started_before_the_newcomer(false, backlog).await;
    println!("pool not fair: {unfair} jobs of a {backlog}-job backlog started first");
    assert!(unfair > backlog / 2, "{unfair}");
}
