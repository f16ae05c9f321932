//! What a worker counts in its runtime's metrics, driven directly on an
//! in-memory store, broker and notices: jobs started, settled (succeeded,
//! failed after a retry, cancelled while running), retried, the time they
//! waited and ran, a dead-lettered message, and its pool's gauges, whose
//! slots count only while the worker consumes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use tokio::sync::watch;
use toolfleet_broker::memory::{MemoryBroker, MemoryNotices};
use toolfleet_broker::{Broker, BrokerError, Consumer, Notices};
use toolfleet_core::now_ms;
use toolfleet_core::{
    CallCtx, ErrorCode, JobState, Metrics, Runtime, ToolDecl, ToolError, TraceContext, new_id,
};
use toolfleet_fleet::job_event;
use toolfleet_store::sqlite::SqliteStore;
use toolfleet_store::{NewJob, Store};
use toolfleet_worker::{Worker, WorkerConfig};

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
    insert_at(store, tool, max_attempts, now_ms()).await
}

/// A job of `tool` inserted at `now` (Unix ms).
async fn insert_at(store: &dyn Store, tool: &str, max_attempts: u32, now: i64) -> String {
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
            now,
            run_at: None,
            priority: None,
            concurrency_key: None,
            concurrency_limit: None,

            fair_rank: 0,
            origin: None,
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
            long(),
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
        .cancel(toolfleet_store::CancelJob {
            tenant: "acme",
            id: &long,
            now: now_ms(),
        })
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

/// A job tool that runs for a minute.
fn long() -> ToolDecl {
    ToolDecl::job("long").run(|_: CallCtx, _: serde_json::Value| async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok::<_, ToolError>(json!({}))
    })
}

/// A worker told to stop takes no more jobs: its slots stop counting at
/// once, while the job it runs finishes within the grace.
#[tokio::test]
async fn slots_stop_counting_when_the_worker_stops_taking_jobs() {
    let metrics = Arc::new(Metrics::new());
    let mut runtime = Runtime::builder().metrics(metrics.clone()).build();
    runtime.register_all([long()]).expect("tools register");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().await.unwrap());
    let broker = MemoryBroker::new();
    let mut config = WorkerConfig::new(POOL);
    config.concurrency = 2;
    let worker = memory_worker(config, runtime, &store, &broker);
    let slots = format!("toolfleet_worker_slots{{pool=\"{POOL}\"}}");
    let in_flight = format!("toolfleet_worker_jobs_in_flight{{pool=\"{POOL}\"}}");
    let (stop, stopped) = watch::channel(false);
    let run = tokio::spawn(worker.clone().run(stopped, Duration::from_secs(2)));
    let long = insert(store.as_ref(), "long", 1).await;
    broker.publish(POOL, &long).await.unwrap();
    until(Duration::from_secs(5), "long runs", async || {
        sample(&metrics, &in_flight) == Some(1.0)
    })
    .await;
    assert_eq!(sample(&metrics, &slots), Some(2.0));

    let _ = stop.send(true);
    until(
        Duration::from_secs(1),
        "the slots stop counting",
        async || sample(&metrics, &slots) == Some(0.0),
    )
    .await;
    // The job still runs, within the grace.
    assert_eq!(sample(&metrics, &in_flight), Some(1.0));
    assert!(!run.is_finished());
    run.await.unwrap();
    assert_eq!(sample(&metrics, &slots), Some(0.0));
}

/// A broker that cannot be reached until `up` is set: consuming fails.
struct Unreachable {
    inner: MemoryBroker,
    up: Arc<AtomicBool>,
}

#[async_trait]
impl Broker for Unreachable {
    async fn ping(&self) -> Result<(), BrokerError> {
        self.inner.ping().await
    }

    async fn publish_traced(
        &self,
        pool: &str,
        job_id: &str,
        trace: Option<&TraceContext>,
    ) -> Result<(), BrokerError> {
        self.inner.publish_traced(pool, job_id, trace).await
    }

    async fn publish_delayed_traced(
        &self,
        pool: &str,
        job_id: &str,
        delay: Duration,
        trace: Option<&TraceContext>,
    ) -> Result<(), BrokerError> {
        self.inner
            .publish_delayed_traced(pool, job_id, delay, trace)
            .await
    }

    async fn consume(&self, pool: &str, prefetch: u16) -> Result<Box<dyn Consumer>, BrokerError> {
        if self.up.load(Ordering::SeqCst) {
            self.inner.consume(pool, prefetch).await
        } else {
            Err(BrokerError::Unavailable("connection refused".into()))
        }
    }

    async fn depth(&self, pool: &str) -> Result<u64, BrokerError> {
        self.inner.depth(pool).await
    }

    async fn consume_dead(&self, pool: &str) -> Result<Box<dyn Consumer>, BrokerError> {
        self.inner.consume_dead(pool).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_count_only_while_the_worker_consumes() {
    let metrics = Arc::new(Metrics::new());
    let runtime = Runtime::builder().metrics(metrics.clone()).build();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().await.unwrap());
    let up = Arc::new(AtomicBool::new(false));
    let broker = Unreachable {
        inner: MemoryBroker::new(),
        up: up.clone(),
    };
    let mut config = WorkerConfig::new(POOL);
    config.concurrency = 3;
    let worker = Worker::new(
        config,
        Arc::new(runtime),
        store,
        Arc::new(broker),
        Arc::new(MemoryNotices::new()),
    );
    let slots = format!("toolfleet_worker_slots{{pool=\"{POOL}\"}}");

    // The broker is unreachable: no capacity is shown, and a worker told to
    // stop while it retries shows none either.
    let (stop, stopped) = watch::channel(false);
    let run = tokio::spawn(worker.clone().run(stopped, Duration::from_secs(1)));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(sample(&metrics, &slots), Some(0.0), "while unreachable");
    let _ = stop.send(true);
    tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("the worker stops while it retries")
        .unwrap();
    assert_eq!(
        sample(&metrics, &slots),
        Some(0.0),
        "stopped while retrying"
    );

    // Once the broker answers, the slots count; a worker whose future is
    // dropped (its task aborted) gives them back.
    let (_stop, stopped) = watch::channel(false);
    let run = tokio::spawn(worker.clone().run(stopped, Duration::from_secs(1)));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(sample(&metrics, &slots), Some(0.0), "still unreachable");
    up.store(true, Ordering::SeqCst);
    until(Duration::from_secs(5), "the slots count", async || {
        sample(&metrics, &slots) == Some(3.0)
    })
    .await;
    run.abort();
    assert!(run.await.unwrap_err().is_cancelled());
    assert_eq!(sample(&metrics, &slots), Some(0.0), "dropped");
}

/// A worker of `config` on `store`, `broker` and notices in memory.
fn memory_worker(
    config: WorkerConfig,
    runtime: Runtime,
    store: &Arc<dyn Store>,
    broker: &MemoryBroker,
) -> Arc<Worker> {
    Worker::new(
        config,
        Arc::new(runtime),
        store.clone(),
        Arc::new(broker.clone()),
        Arc::new(MemoryNotices::new()),
    )
}

/// A runtime counting into its metrics with one job tool, `tool`, that
/// does nothing, and a store in memory.
async fn one_noop_tool(tool: &str) -> (Arc<Metrics>, Runtime, Arc<dyn Store>) {
    let metrics = Arc::new(Metrics::new());
    let mut runtime = Runtime::builder().metrics(metrics.clone()).build();
    runtime
        .register(
            ToolDecl::job(tool)
                .run(|_: CallCtx, _: serde_json::Value| async { Ok::<_, ToolError>(json!({})) }),
        )
        .expect("tool registers");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().await.unwrap());
    (metrics, runtime, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_taken_over_waited_from_when_the_lost_lease_ended() {
    let (metrics, runtime, store) = one_noop_tool("resumed").await;
    let worker = Worker::new(
        WorkerConfig::new(POOL),
        Arc::new(runtime),
        store.clone(),
        Arc::new(MemoryBroker::new()),
        Arc::new(MemoryNotices::new()),
    );
    // Runnable two minutes ago; claimed a minute ago by a worker that died,
    // its lease over 10 s ago: it waited 10 s for this worker, not 2 min.
    let now = now_ms();
    let id = insert_at(store.as_ref(), "resumed", 3, now - 120_000).await;
    let first = store
        .claim(toolfleet_store::ClaimJob {
            id: &id,
            worker: "gone",
            now: now - 60_000,
            lease_ms: 50_000,
        })
        .await
        .unwrap()
        .expect("claimed by the worker that died");
    assert_eq!(first.run_at, now - 120_000);
    assert_eq!(
        worker.run_job(&id).await,
        toolfleet_worker::Handled::Ran(JobState::Succeeded)
    );
    let count = r#"toolfleet_job_queue_wait_seconds_count{tool="resumed"}"#;
    assert_eq!(sample(&metrics, count), Some(1.0));
    let waited = sample(
        &metrics,
        r#"toolfleet_job_queue_wait_seconds_sum{tool="resumed"}"#,
    )
    .expect("a wait");
    assert!((10.0..60.0).contains(&waited), "waited {waited} s");
}

/// A worker of `ahead` and `ahead_max` beyond its two slots draining
/// `jobs` quick jobs; answers the prefetch gauges read while they drain,
/// once all settled, and after the worker stopped.
async fn drain_quick_jobs(ahead: usize, ahead_max: usize, jobs: usize) -> (Vec<f64>, f64) {
    let (metrics, runtime, store) = one_noop_tool("quick").await;
    let broker = MemoryBroker::new();
    let mut config = WorkerConfig::new(POOL);
    config.concurrency = 2;
    config.ahead = ahead;
    config.ahead_max = ahead_max;
    let worker = memory_worker(config, runtime, &store, &broker);
    let prefetch = format!("toolfleet_worker_prefetch{{pool=\"{POOL}\"}}");
    let (stop, stopped) = watch::channel(false);
    let run = tokio::spawn(worker.run(stopped, Duration::from_secs(1)));
    let mut ids = Vec::new();
    for _ in 0..jobs {
        ids.push(insert(store.as_ref(), "quick", 1).await);
    }
    let usual = (2 + ahead) as f64;
    until(Duration::from_secs(5), "the worker consumes", async || {
        sample(&metrics, &prefetch) == Some(usual)
    })
    .await;
    let mut seen = vec![usual];
    for id in &ids {
        broker.publish(POOL, id).await.unwrap();
    }
    let settled = async || {
        for id in &ids {
            if store.job_by_id(id).await.unwrap().unwrap().state != JobState::Succeeded {
                return false;
            }
        }
        true
    };
    until(Duration::from_secs(20), "every job settles", async || {
        seen.extend(sample(&metrics, &prefetch));
        settled().await
    })
    .await;
    seen.extend(sample(&metrics, &prefetch));
    // Idle for a while: a deepened prefetch comes back.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let idle = sample(&metrics, &prefetch).expect("a prefetch");
    stop.send(true).unwrap();
    run.await.unwrap();
    seen.push(idle);
    seen.extend(sample(&metrics, &prefetch));
    (seen, idle)
}

/// Holding jobs ahead, a worker deepens its prefetch once a whole hand of
/// deliveries left it quickly, comes back to its usual depth once none
/// leaves for a second, and counts none once it stopped; one whose
/// `ahead_max` is its `ahead` keeps its depth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_deepens_its_prefetch_while_jobs_leave_quickly() {
    let (seen, idle) = drain_quick_jobs(4, 16, 200).await;
    assert_eq!(
        seen.first(),
        Some(&6.0),
        "starts at 2 slots + 4 ahead: {seen:?}"
    );
    assert!(seen.contains(&18.0), "deepened to 2 + 16: {seen:?}");
    assert_eq!(idle, 6.0, "back to 2 + 4 once idle: {seen:?}");
    assert_eq!(seen.last(), Some(&0.0), "none once stopped: {seen:?}");
    assert!(
        seen.iter().all(|p| [0.0, 6.0, 18.0].contains(p)),
        "{seen:?}"
    );

    let (seen, idle) = drain_quick_jobs(4, 4, 200).await;
    let counted: Vec<_> = seen[..seen.len() - 1]
        .iter()
        .filter(|p| **p != 0.0)
        .collect();
    assert!(
        !counted.is_empty() && counted.iter().all(|p| **p == 6.0),
        "a fixed depth stays: {seen:?}"
    );
    assert_eq!(idle, 6.0);
    assert_eq!(seen.last(), Some(&0.0));
}
