//! What a worker counts in its runtime's metrics, driven directly on an
//! in-memory store, broker and notices: jobs started, settled (succeeded,
//! failed after a retry, cancelled while running), retried, the time they
//! waited and ran, a dead-lettered message, and its pool's gauges.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::watch;
use toolfleet_broker::memory::{MemoryBroker, MemoryNotices};
use toolfleet_broker::{Broker, Notices};
use toolfleet_core::{CallCtx, ErrorCode, JobState, Metrics, Runtime, ToolDecl, ToolError, new_id};
use toolfleet_store::sqlite::SqliteStore;
use toolfleet_store::{NewJob, Store};
use toolfleet_worker::{Worker, WorkerConfig, job_event, now_ms};

const POOL: &str = "metered";

/// The value of the sample `series` (name and labels as rendered).
fn sample(metrics: &Metrics, series: &str) -> Option<f64> {
    metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

async fn until(limit: Duration, what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn insert(store: &dyn Store, tool: &str, max_attempts: u32) -> String {
    let id = new_id();
    store
        .insert_job(NewJob {
            id: id.clone(),
            tenant: "acme".into(),
            user: "alice".into(),
            tool: tool.into(),
            pool: POOL.into(),
            args: json!({}),
            idempotency_key: None,
            run_id: "run-1".into(),
            call_id: new_id(),
            callback_url: None,
            lineage: None,
            scopes: Vec::new(),
            trace: None,
            max_attempts,
            timeout_ms: 60_000,
            now: now_ms(),
        })
        .await
        .expect("inserted");
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_counts_what_becomes_of_its_jobs_and_its_slots() {
    let metrics = Arc::new(Metrics::new());
    let mut runtime = Runtime::builder().metrics(metrics.clone()).build();
    runtime
        .register_all([
            ToolDecl::job("fine").run(|_: CallCtx, _: serde_json::Value| async {
                Ok::<_, ToolError>(json!({"fine": true}))
            }),
            ToolDecl::job("flaky").run(|_: CallCtx, _: serde_json::Value| async {
                Err::<serde_json::Value, _>(ToolError::new(ErrorCode::Unavailable, "try later"))
            }),
            ToolDecl::job("long").run(|_: CallCtx, _: serde_json::Value| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok::<_, ToolError>(json!({}))
            }),
        ])
        .expect("tools register");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().await.unwrap());
    let broker = MemoryBroker::new();
    let notices = MemoryNotices::new();
    let mut config = WorkerConfig::new(POOL);
    config.concurrency = 3;
    config.backoff_min = Duration::from_millis(10);
    config.backoff_max = Duration::from_millis(50);
    let worker = Worker::new(
        config,
        Arc::new(runtime),
        store.clone(),
        Arc::new(broker.clone()),
        Arc::new(notices.clone()),
    );
    let slots = format!("toolfleet_worker_slots{{pool=\"{POOL}\"}}");
    let busy = format!("toolfleet_worker_busy_slots{{pool=\"{POOL}\"}}");
    let in_flight = format!("toolfleet_worker_jobs_in_flight{{pool=\"{POOL}\"}}");
    assert_eq!(sample(&metrics, &slots), Some(0.0));
    let (stop, stopped) = watch::channel(false);
    let run = tokio::spawn(worker.clone().run(stopped, Duration::from_secs(1)));

    let fine = insert(store.as_ref(), "fine", 1).await;
    let flaky = insert(store.as_ref(), "flaky", 2).await;
    let long = insert(store.as_ref(), "long", 1).await;
    for id in [&fine, &flaky, &long, &"not a job id".to_owned()] {
        broker.publish(POOL, id).await.unwrap();
    }
    let state = async |id: &str| store.job_by_id(id).await.unwrap().unwrap().state;
    until(
        Duration::from_secs(10),
        "fine and flaky settle",
        async || {
            state(&fine).await == JobState::Succeeded && state(&flaky).await == JobState::Failed
        },
    )
    .await;
    until(Duration::from_secs(5), "long runs", async || {
        state(&long).await == JobState::Running
    })
    .await;
    assert_eq!(sample(&metrics, &slots), Some(3.0));
    assert_eq!(sample(&metrics, &in_flight), Some(1.0));
    assert_eq!(sample(&metrics, &busy), Some(1.0));

    // Cancelled as the server does it: the store, then the event.
    let cancelled = store
        .cancel("acme", &long, now_ms())
        .await
        .unwrap()
        .unwrap();
    notices.publish(&job_event(&cancelled, 1)).await.unwrap();
    until(
        Duration::from_secs(5),
        "the cancel is counted",
        async || {
            sample(
                &metrics,
                r#"toolfleet_jobs_settled_total{tool="long",state="cancelled"}"#,
            ) == Some(1.0)
        },
    )
    .await;
    until(Duration::from_secs(5), "the slots are free", async || {
        sample(&metrics, &busy) == Some(0.0)
    })
    .await;
    assert_eq!(sample(&metrics, &in_flight), Some(0.0));

    for (series, value) in [
        (r#"toolfleet_jobs_started_total{tool="fine"}"#, 1.0),
        (r#"toolfleet_jobs_started_total{tool="flaky"}"#, 2.0),
        (r#"toolfleet_jobs_started_total{tool="long"}"#, 1.0),
        (
            r#"toolfleet_jobs_settled_total{tool="fine",state="succeeded"}"#,
            1.0,
        ),
        (
            r#"toolfleet_jobs_settled_total{tool="flaky",state="failed"}"#,
            1.0,
        ),
        (r#"toolfleet_job_retries_total{tool="flaky"}"#, 1.0),
        (
            r#"toolfleet_job_queue_wait_seconds_count{tool="flaky"}"#,
            2.0,
        ),
        (r#"toolfleet_job_run_seconds_count{tool="flaky"}"#, 2.0),
        (r#"toolfleet_job_run_seconds_count{tool="long"}"#, 1.0),
        (r#"toolfleet_dead_letters_total{pool="metered"}"#, 1.0),
    ] {
        assert_eq!(
            sample(&metrics, series),
            Some(value),
            "{series} in\n{}",
            metrics.render()
        );
    }
    assert_eq!(broker.dead_letters(POOL), vec!["not a job id".to_owned()]);

    let _ = stop.send(true);
    run.await.unwrap();
    assert_eq!(sample(&metrics, &slots), Some(0.0));
}
