//! A worker's part of a job's life, driven directly: claim with a lease, run
//! under the wall-time budget, retry with backoff, settle, and stop on cancel
//! or shutdown. Each test has its own in-memory store, broker and notices.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::sync::watch;
use toolfleet_broker::memory::{MemoryBroker, MemoryNotices};
use toolfleet_broker::{Acker, Broker, BrokerError, Delivery, Notices};
use toolfleet_core::now_ms;
use toolfleet_core::tool::{Budget, Lineage};
use toolfleet_core::{CallCtx, ErrorCode, JobState, Json, Runtime, ToolDecl, ToolError, new_id};
use toolfleet_fleet::{job_event, sweep};
use toolfleet_store::sqlite::SqliteStore;
use toolfleet_store::{Heartbeat, Inserted, JobRecord, Lease, NewJob, Store, Succeed};
use toolfleet_worker::{Handled, Worker, WorkerConfig};

const TENANT: &str = "acme";
const POOL: &str = "lifecycle";
const BACKOFF_MIN_MS: i64 = 10;
const BACKOFF_MAX_MS: i64 = 50;

fn worker_config(lease: Duration, concurrency: usize) -> WorkerConfig {
    let mut config = WorkerConfig::new(POOL);
    config.concurrency = concurrency;
    config.lease = lease;
    config.backoff_min = Duration::from_millis(BACKOFF_MIN_MS as u64);
    config.backoff_max = Duration::from_millis(BACKOFF_MAX_MS as u64);
    config.poll_after_s = 1;
    config
}

/// Sets its flag when dropped: proof that an executor's future was dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Counts how many times it was dropped.
struct DropCount(Arc<AtomicUsize>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

struct Rig {
    store: Arc<dyn Store>,
    broker: MemoryBroker,
    notices: MemoryNotices,
    worker: Arc<Worker>,
}

impl Rig {
    async fn new(tools: Vec<ToolDecl>, config: WorkerConfig) -> Rig {
        let mut runtime = Runtime::builder().build();
        runtime.register_all(tools).expect("tools register");
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().await.unwrap());
        let broker = MemoryBroker::new();
        let notices = MemoryNotices::new();
        let worker = Rig::worker_on(&store, &broker, &notices, Arc::new(runtime), config);
        Rig {
            store,
            broker,
            notices,
            worker,
        }
    }

    fn worker_on(
        store: &Arc<dyn Store>,
        broker: &MemoryBroker,
        notices: &MemoryNotices,
        runtime: Arc<Runtime>,
        config: WorkerConfig,
    ) -> Arc<Worker> {
        Worker::new(
            config,
            runtime,
            store.clone(),
            Arc::new(broker.clone()),
            Arc::new(notices.clone()),
        )
    }

    async fn insert(&self, tool: &str, max_attempts: u32, timeout_ms: i64) -> String {
        self.insert_keyed(tool, max_attempts, timeout_ms, None)
            .await
    }

    async fn insert_keyed(
        &self,
        tool: &str,
        max_attempts: u32,
        timeout_ms: i64,
        key: Option<&str>,
    ) -> String {
        self.insert_at(tool, max_attempts, timeout_ms, key, now_ms())
            .await
    }

    /// A job queued at `now`.
    async fn insert_at(
        &self,
        tool: &str,
        max_attempts: u32,
        timeout_ms: i64,
        key: Option<&str>,
        now: i64,
    ) -> String {
        let id = new_id();
        let inserted = self
            .store
            .insert_job(NewJob {
                id: id.clone(),
                tenant: TENANT.into(),
                user: "alice".into(),
                tool: tool.into(),
                pool: POOL.into(),
                args: json!({}),
                idempotency_key: key.map(str::to_owned),
                run_id: "run-1".into(),
                call_id: new_id(),
                callback_url: None,
                lineage: None,
                scopes: Vec::new(),
                trace: None,
                max_attempts,
                timeout_ms,
                now,
                run_at: None,
                priority: None,
                concurrency_key: None,
                concurrency_limit: None,

                fair_rank: 0,
                origin: None,
            })
            .await
            .unwrap();
        assert!(matches!(inserted, Inserted::Created(_)), "{inserted:?}");
        id
    }

    async fn publish(&self, id: &str) {
        self.broker.publish(POOL, id).await.unwrap();
    }

    async fn job(&self, id: &str) -> JobRecord {
        self.store.job_by_id(id).await.unwrap().expect("the job")
    }

    /// Waits (at most `limit`) until the job is in `state`.
    async fn wait_state(&self, id: &str, state: JobState, limit: Duration) -> JobRecord {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let job = self.job(id).await;
            if job.state == state {
                return job;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "job never reached {state} within {limit:?}: {job:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Claims `id` as the worker, as of a minute from now (once a lease of
    /// the tests' had run out): a new attempt of the same lease owner.
    async fn claim_a_minute_later(&self, id: &str) -> JobRecord {
        let worker = self.worker.config().id.clone();
        self.store
            .claim(toolfleet_store::ClaimJob {
                id,
                worker: &worker,
                now: now_ms() + 60_000,
                lease_ms: 60_000,
            })
            .await
            .unwrap()
            .expect("claimable once the lease is over")
    }

    /// Runs the worker's loop until the sender turns true.
    fn start(&self, grace: Duration) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
        let (stop, stopped) = watch::channel(false);
        let run = tokio::spawn(self.worker.clone().run(stopped, grace));
        (stop, run)
    }
}

/// Waits (at most `limit`) until `f` is true.
async fn until(limit: Duration, what: &str, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sleeps until the store's clock passes `at` (Unix ms).
async fn sleep_past(at: i64) {
    let left = at + 1 - now_ms();
    if left > 0 {
        tokio::time::sleep(Duration::from_millis(left as u64)).await;
    }
}

/// A job tool whose first `fail_first` runs fail (retryably or not), saying
/// which attempt failed; it counts its runs.
fn flaky(name: &str, runs: Arc<AtomicUsize>, fail_first: usize, retryable: bool) -> ToolDecl {
    ToolDecl::job(name).run(move |_ctx: CallCtx, _args: Value| {
        let runs = runs.clone();
        async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            if n <= fail_first {
                return Err(ToolError::failed(format!("attempt {n} failed"), retryable));
            }
            Ok(json!({"attempt": n}))
        }
    })
}

/// A job tool that marks it started, then sleeps `sleep` holding a drop flag.
fn sleeper(
    name: &str,
    runs: Arc<AtomicUsize>,
    dropped: Arc<AtomicBool>,
    sleep: Duration,
) -> ToolDecl {
    ToolDecl::job(name).run(move |_ctx: CallCtx, _args: Value| {
        let (runs, dropped) = (runs.clone(), dropped.clone());
        async move {
            let _guard = DropFlag(dropped);
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(sleep).await;
            Ok::<_, ToolError>(json!({"slept_ms": sleep.as_millis() as u64}))
        }
    })
}

// 1. Retries with backoff.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retryable_failure_is_retried_with_backoff_until_it_succeeds() {
    let runs = Arc::new(AtomicUsize::new(0));
    let rig = Rig::new(
        vec![flaky("flaky", runs.clone(), 2, true)],
        worker_config(Duration::from_millis(400), 4),
    )
    .await;
    let id = rig.insert("flaky", 3, 5_000).await;

    let mut previous_delay = 0;
    for attempt in 1..=2u32 {
        assert_eq!(
            rig.worker.run_job(&id).await,
            Handled::Ran(JobState::Retrying)
        );
        let job = rig.job(&id).await;
        assert_eq!(job.state, JobState::Retrying);
        assert_eq!(job.attempts, attempt);
        assert_eq!(job.lease_owner, None, "a retrying job holds no lease");
        let error = job.error.clone().expect("the error is kept");
        assert_eq!(error.code, ErrorCode::ToolFailed);
        assert_eq!(error.message, format!("attempt {attempt} failed"));
        // Exponential: attempt n waits at least min * 2^(n-1), at most twice the cap.
        let delay = job.run_at - job.updated_at;
        let floor = BACKOFF_MIN_MS << (attempt - 1);
        assert!(
            (floor..=2 * BACKOFF_MAX_MS).contains(&delay),
            "attempt {attempt}: retry delay {delay} ms"
        );
        assert!(delay >= previous_delay.min(BACKOFF_MAX_MS));
        previous_delay = delay;
        // Not claimable before run_at, by anyone.
        assert_eq!(
            rig.store
                .claim(toolfleet_store::ClaimJob {
                    id: &id,
                    worker: "someone-else",
                    now: job.run_at - 1,
                    lease_ms: 1_000
                })
                .await
                .unwrap(),
            None,
            "a retrying job is not claimable before its run_at"
        );
        assert_eq!(runs.load(Ordering::SeqCst), attempt as usize);
        sleep_past(job.run_at).await;
    }
    assert_eq!(
        rig.worker.run_job(&id).await,
        Handled::Ran(JobState::Succeeded)
    );
    let job = rig.job(&id).await;
    assert_eq!((job.state, job.attempts), (JobState::Succeeded, 3));
    assert_eq!(
        job.result.expect("a result").to_value(),
        json!({"attempt": 3})
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_reach_the_worker_through_the_broker() {
    let runs = Arc::new(AtomicUsize::new(0));
    let rig = Rig::new(
        vec![flaky("flaky", runs.clone(), 2, true)],
        worker_config(Duration::from_millis(400), 4),
    )
    .await;
    let mut states = rig.notices.subscribe().await.unwrap();
    let (_stop, _run) = rig.start(Duration::from_secs(1));
    let id = rig.insert("flaky", 3, 5_000).await;
    rig.publish(&id).await;
    let job = rig
        .wait_state(&id, JobState::Succeeded, Duration::from_secs(10))
        .await;
    assert_eq!(job.attempts, 3);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    // Every transition was announced: running, retrying, ..., succeeded.
    let mut seen = Vec::new();
    while seen.last().map(String::as_str) != Some("succeeded") {
        let event = tokio::time::timeout(Duration::from_secs(5), states.next())
            .await
            .expect("an event")
            .expect("notices open");
        if event.id == id {
            seen.push(event.state.as_str().to_owned());
        }
    }
    assert_eq!(
        seen,
        [
            "running",
            "retrying",
            "running",
            "retrying",
            "running",
            "succeeded"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_always_fails_retryably_fails_after_exactly_max_attempts() {
    let runs = Arc::new(AtomicUsize::new(0));
    let rig = Rig::new(
        vec![flaky("doomed", runs.clone(), usize::MAX, true)],
        worker_config(Duration::from_millis(400), 4),
    )
    .await;
    let (_stop, _run) = rig.start(Duration::from_secs(1));
    let id = rig.insert("doomed", 4, 5_000).await;
    rig.publish(&id).await;
    let job = rig
        .wait_state(&id, JobState::Failed, Duration::from_secs(10))
        .await;
    assert_eq!(job.attempts, 4);
    let error = job.error.expect("the last error is kept");
    assert_eq!(error.code, ErrorCode::ToolFailed);
    assert_eq!(
        error.message, "attempt 4 failed",
        "the last error, not the first"
    );
    // Well past any backoff: no fifth attempt comes.
    tokio::time::sleep(Duration::from_millis(4 * BACKOFF_MAX_MS as u64)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    assert_eq!(rig.job(&id).await.state, JobState::Failed);
    assert_eq!(rig.worker.run_job(&id).await, Handled::Skipped);
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_retryable_failure_fails_at_once() {
    let runs = Arc::new(AtomicUsize::new(0));
    let rig = Rig::new(
        vec![flaky("broken", runs.clone(), usize::MAX, false)],
        worker_config(Duration::from_millis(400), 4),
    )
    .await;
    let id = rig.insert("broken", 5, 5_000).await;
    assert_eq!(
        rig.worker.run_job(&id).await,
        Handled::Ran(JobState::Failed)
    );
    let job = rig.job(&id).await;
    assert_eq!((job.state, job.attempts), (JobState::Failed, 1));
    let error = job.error.expect("the error is kept");
    assert_eq!(
        (error.message.as_str(), error.retryable),
        ("attempt 1 failed", false)
    );
    assert_eq!(rig.worker.run_job(&id).await, Handled::Skipped);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// 2. Duplicate deliveries.

/// Records how a delivery was settled.
struct RecordingAcker(Arc<Mutex<Vec<&'static str>>>);

#[async_trait]
impl Acker for RecordingAcker {
    async fn ack(self: Box<Self>) -> Result<(), BrokerError> {
        self.0.lock().unwrap().push("ack");
        Ok(())
    }
    async fn requeue(self: Box<Self>) -> Result<(), BrokerError> {
        self.0.lock().unwrap().push("requeue");
        Ok(())
    }
    async fn reject(self: Box<Self>) -> Result<(), BrokerError> {
        self.0.lock().unwrap().push("reject");
        Ok(())
    }
}

/// Each delivery's future is copied whole into the task that runs it, so
/// its size is paid once per job: the record a claim answers and the
/// paths few jobs take (asking the client, deferring, reading a job that
/// someone else settled) are boxed, and it stays under 8 KB (it was 13).
#[tokio::test]
async fn a_deliverys_future_stays_small() {
    let rig = Rig::new(Vec::new(), worker_config(Duration::from_secs(1), 1)).await;
    let acks = Arc::new(Mutex::new(Vec::new()));
    let delivery = Delivery::new(new_id(), false, Box::new(RecordingAcker(acks.clone())));
    let handling = rig.worker.handle(delivery);
    let size = std::mem::size_of_val(&handling);
    assert!(size <= 8 * 1024, "a delivery's future is {size} bytes");
    // And it is the future that handles the delivery: an unknown job's is
    // acknowledged.
    handling.await;
    assert_eq!(*acks.lock().unwrap(), ["ack"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_delivery_never_reruns_the_executor() {
    let runs = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicBool::new(false));
    let rig = Rig::new(
        vec![sleeper(
            "once",
            runs.clone(),
            dropped,
            Duration::from_millis(300),
        )],
        worker_config(Duration::from_millis(400), 4),
    )
    .await;

    // A duplicate while the first delivery runs: the lease is held, so skipped.
    let id = rig.insert("once", 3, 5_000).await;
    let first = tokio::spawn({
        let worker = rig.worker.clone();
        let id = id.clone();
        async move { worker.run_job(&id).await }
    });
    until(Duration::from_secs(5), "the first run starts", || {
        runs.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(rig.worker.run_job(&id).await, Handled::Skipped);
    assert_eq!(first.await.unwrap(), Handled::Ran(JobState::Succeeded));
    // A redelivery of the settled job is acknowledged and not run.
    let settled = Arc::new(Mutex::new(Vec::new()));
    rig.worker
        .handle(Delivery::new(
            id.clone(),
            true,
            Box::new(RecordingAcker(settled.clone())),
        ))
        .await;
    assert_eq!(*settled.lock().unwrap(), ["ack"]);
    assert_eq!(rig.worker.run_job(&id).await, Handled::Skipped);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(rig.job(&id).await.attempts, 1);

    // Through the broker: the same id published three times at once, then
    // twice more after it settled.
    let (_stop, _run) = rig.start(Duration::from_secs(1));
    let id = rig.insert("once", 3, 5_000).await;
    for _ in 0..3 {
        rig.publish(&id).await;
    }
    rig.wait_state(&id, JobState::Succeeded, Duration::from_secs(10))
        .await;
    rig.publish(&id).await;
    rig.publish(&id).await;
    // A marker job published after the duplicates: once it ran, they were
    // all taken (the queue is FIFO) and handled by a free slot.
    let marker = rig.insert("once", 1, 5_000).await;
    rig.publish(&marker).await;
    rig.wait_state(&marker, JobState::Succeeded, Duration::from_secs(10))
        .await;
    assert_eq!(rig.broker.depth(POOL).await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 3, "one run per job: {id}");
    assert_eq!(rig.job(&id).await.attempts, 1);
}

// 3. Expired leases.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_lease_expired_is_claimed_again_and_runs() {
    let runs = Arc::new(AtomicUsize::new(0));
    let rig = Rig::new(
        vec![flaky("steady", runs.clone(), 0, true)],
        worker_config(Duration::from_millis(400), 4),
    )
    .await;
    let (_stop, _run) = rig.start(Duration::from_secs(1));
    let id = rig.insert("steady", 3, 5_000).await;
    let ghost = rig
        .store
        .claim(toolfleet_store::ClaimJob {
            id: &id,
            worker: "ghost",
            now: now_ms(),
            lease_ms: 600,
        })
        .await
        .unwrap()
        .expect("the ghost claims it");
    // While the ghost's lease holds, nobody else runs it.
    assert_eq!(rig.worker.run_job(&id).await, Handled::Skipped);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // The ghost never settles. Once its lease is over the sweeper finds it.
    sleep_past(ghost.lease_until.unwrap()).await;
    assert_eq!(
        sweep(rig.store.as_ref(), &rig.broker, 100, None, Duration::ZERO).await,
        Ok(1)
    );
    let job = rig
        .wait_state(&id, JobState::Succeeded, Duration::from_secs(10))
        .await;
    assert_eq!(job.attempts, 2, "the ghost's attempt counts");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The ghost, waking up late, can neither settle nor hold it.
    let ghost = ghost.lease_ref().expect("the ghost's attempt");
    let late = Succeed {
        lease: &ghost,
        result: &Json::from(json!({"late": true})),
        now: now_ms(),
        claimed: None,
    };
    assert_eq!(rig.store.succeed(late).await.unwrap(), None);
    let beat = Heartbeat {
        lease: &ghost,
        now: now_ms(),
        lease_ms: 600,
    };
    assert_eq!(rig.store.heartbeat(beat).await.unwrap(), Lease::Lost);
    assert_eq!(
        rig.job(&id).await.result.unwrap().to_value(),
        json!({"attempt": 1})
    );

    // A job abandoned on its last attempt is failed, not run a further time.
    let last = rig.insert("steady", 1, 5_000).await;
    let ghost = rig
        .store
        .claim(toolfleet_store::ClaimJob {
            id: &last,
            worker: "ghost",
            now: now_ms(),
            lease_ms: 50,
        })
        .await
        .unwrap()
        .unwrap();
    sleep_past(ghost.lease_until.unwrap()).await;
    assert_eq!(
        rig.worker.run_job(&last).await,
        Handled::Ran(JobState::Failed)
    );
    let job = rig.job(&last).await;
    assert!(
        job.error.unwrap().message.contains("interrupted"),
        "the reason is given"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// An attempt whose lease expired and whose job the same worker claimed
/// again (a newer attempt, same lease owner) learns at its next heartbeat
/// that it lost the lease: its executor is dropped, and it settles and
/// announces nothing, leaving the job to the new attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_attempt_of_the_same_worker_is_stopped_and_settles_nothing() {
    let runs = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicBool::new(false));
    let marker_runs = Arc::new(AtomicUsize::new(0));
    let rig = Rig::new(
        vec![
            sleeper(
                "long",
                runs.clone(),
                dropped.clone(),
                Duration::from_secs(60),
            ),
            flaky("marker", marker_runs.clone(), 0, false),
        ],
        worker_config(Duration::from_millis(300), 4),
    )
    .await;
    let mut events = rig.notices.subscribe().await.unwrap();
    let id = rig.insert("long", 3, 120_000).await;
    let first = tokio::spawn({
        let worker = rig.worker.clone();
        let id = id.clone();
        async move { worker.run_job(&id).await }
    });
    until(Duration::from_secs(5), "the executor starts", || {
        runs.load(Ordering::SeqCst) == 1
    })
    .await;
    // The same worker claims the job again, as it would once the lease had
    // expired (the store reads time from its callers, so the claim is made
    // as of a minute later): a new attempt of the same lease owner.
    let worker = rig.worker.config().id.clone();
    let second = rig.claim_a_minute_later(&id).await;
    assert_eq!(
        (second.attempts, second.lease_owner.as_deref()),
        (2, Some(worker.as_str()))
    );
    let handled = tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .expect("the stale attempt stops at its next heartbeat")
        .unwrap();
    assert_eq!(handled, Handled::Interrupted);
    assert!(dropped.load(Ordering::SeqCst), "its executor was dropped");
    let job = rig.job(&id).await;
    assert_eq!(
        (job.state, job.attempts, job.lease_owner.as_deref()),
        (JobState::Running, 2, Some(worker.as_str())),
        "the stale attempt settled nothing"
    );
    // The new attempt holds it, and settles it.
    let done = Succeed {
        lease: &second.lease_ref().expect("the new attempt"),
        result: &Json::from(json!({"attempt": 2})),
        now: now_ms(),
        claimed: None,
    };
    let done = rig.store.succeed(done).await.unwrap().expect("held");
    assert_eq!(done.state, JobState::Succeeded);
    // The worker announces in order: once a later job's outcome is out,
    // everything the stale attempt announced is too. It announced its
    // start and nothing after.
    let marker = rig.insert("marker", 1, 5_000).await;
    assert_eq!(
        rig.worker.run_job(&marker).await,
        Handled::Ran(JobState::Succeeded)
    );
    let mut seen = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(5), events.next())
            .await
            .expect("an event")
            .expect("notices open");
        if event.id == marker && event.state.as_str() == "succeeded" {
            break;
        }
        if event.id == id {
            seen.push(event.state.as_str());
        }
    }
    assert_eq!(seen, ["running"]);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// 4. Cancel.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_notice_stops_a_running_executor() {
    let runs = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicBool::new(false));
    // A long lease: heartbeats are 10 s apart, so only the notice can stop it.
    let rig = Rig::new(
        vec![sleeper(
            "long",
            runs.clone(),
            dropped.clone(),
            Duration::from_secs(60),
        )],
        worker_config(Duration::from_secs(30), 4),
    )
    .await;
    let (_stop, _run) = rig.start(Duration::from_secs(1));
    let id = rig.insert("long", 3, 120_000).await;
    rig.publish(&id).await;
    until(Duration::from_secs(5), "the executor starts", || {
        runs.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(rig.job(&id).await.state, JobState::Running);
    // As the server's cancel does: the store, then the event.
    let cancelled = rig
        .store
        .cancel(toolfleet_store::CancelJob {
            tenant: TENANT,
            id: &id,
            now: now_ms(),
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(cancelled.state, JobState::Cancelled);
    rig.notices
        .publish(&job_event(&cancelled, 1))
        .await
        .unwrap();
    until(
        Duration::from_secs(3),
        "the executor's future is dropped",
        || dropped.load(Ordering::SeqCst),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let job = rig.job(&id).await;
    assert_eq!(job.state, JobState::Cancelled, "nothing settles it after");
    assert_eq!(job.error.unwrap().code, ErrorCode::Cancelled);
    assert_eq!((job.attempts, runs.load(Ordering::SeqCst)), (1, 1));
    assert_eq!(rig.worker.run_job(&id).await, Handled::Skipped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_finds_a_cancelled_job_and_stops_its_executor() {
    let runs = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicBool::new(false));
    let rig = Rig::new(
        vec![sleeper(
            "long",
            runs.clone(),
            dropped.clone(),
            Duration::from_secs(60),
        )],
        worker_config(Duration::from_millis(300), 4),
    )
    .await;
    let id = rig.insert("long", 3, 120_000).await;
    // run_job alone follows no notices: only the heartbeat can see the cancel.
    let run = tokio::spawn({
        let worker = rig.worker.clone();
        let id = id.clone();
        async move { worker.run_job(&id).await }
    });
    until(Duration::from_secs(5), "the executor starts", || {
        runs.load(Ordering::SeqCst) == 1
    })
    .await;
    rig.store
        .cancel(toolfleet_store::CancelJob {
            tenant: TENANT,
            id: &id,
            now: now_ms(),
        })
        .await
        .unwrap();
    let handled = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("the run stops")
        .unwrap();
    assert_eq!(handled, Handled::Ran(JobState::Cancelled));
    assert!(dropped.load(Ordering::SeqCst));
    let job = rig.job(&id).await;
    assert_eq!((job.state, job.attempts), (JobState::Cancelled, 1));
}

// 5. The wall-time budget.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_its_wall_time_budget_times_out_and_is_retried_until_it_fails() {
    let runs = Arc::new(AtomicUsize::new(0));
    let drops = Arc::new(AtomicUsize::new(0));
    let tool = ToolDecl::job("slow").run({
        let (runs, drops) = (runs.clone(), drops.clone());
        move |_ctx: CallCtx, _args: Value| {
            let (runs, drops) = (runs.clone(), drops.clone());
            async move {
                let _guard = DropCount(drops);
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok::<_, ToolError>(json!({}))
            }
        }
    });
    let rig = Rig::new(vec![tool], worker_config(Duration::from_secs(5), 4)).await;
    let id = rig.insert("slow", 2, 100).await;

    let started = tokio::time::Instant::now();
    assert_eq!(
        rig.worker.run_job(&id).await,
        Handled::Ran(JobState::Retrying)
    );
    assert!(started.elapsed() >= Duration::from_millis(100));
    let job = rig.job(&id).await;
    let error = job.error.expect("the timeout is kept");
    assert_eq!((error.code, error.retryable), (ErrorCode::Timeout, true));
    assert!(error.message.contains("100 ms"), "{}", error.message);
    assert_eq!(drops.load(Ordering::SeqCst), 1, "the attempt was stopped");

    sleep_past(job.run_at).await;
    assert_eq!(
        rig.worker.run_job(&id).await,
        Handled::Ran(JobState::Failed)
    );
    let job = rig.job(&id).await;
    assert_eq!((job.state, job.attempts), (JobState::Failed, 2));
    assert_eq!(job.error.unwrap().code, ErrorCode::Timeout);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(drops.load(Ordering::SeqCst), 2);
}

// 6. The idempotency key.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executors_get_the_job_id_as_idempotency_key_on_every_attempt() {
    let keys = Arc::new(Mutex::new(Vec::new()));
    let tool = ToolDecl::job("keyed").run({
        let keys = keys.clone();
        move |ctx: CallCtx, _args: Value| {
            let keys = keys.clone();
            async move {
                let n = {
                    let mut keys = keys.lock().unwrap();
                    keys.push(ctx.idempotency_key.clone());
                    keys.len()
                };
                if n < 3 {
                    return Err(ToolError::failed("try again", true));
                }
                Ok(json!({}))
            }
        }
    });
    let rig = Rig::new(vec![tool], worker_config(Duration::from_millis(400), 4)).await;
    let (_stop, _run) = rig.start(Duration::from_secs(1));
    // The caller's key identifies the job; the executor's key is the job id.
    let id = rig
        .insert_keyed("keyed", 3, 5_000, Some("client-key-1"))
        .await;
    rig.publish(&id).await;
    let job = rig
        .wait_state(&id, JobState::Succeeded, Duration::from_secs(10))
        .await;
    assert_eq!(job.attempts, 3);
    assert_eq!(*keys.lock().unwrap(), vec![Some(id.clone()); 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_lineage_and_its_callers_scopes_reach_its_executor() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let tool = ToolDecl::agent("research").run({
        let seen = seen.clone();
        move |ctx: CallCtx, _args: Value| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push((
                    ctx.run_id.clone(),
                    ctx.lineage.clone(),
                    ctx.principal.scopes.iter().cloned().collect::<Vec<_>>(),
                ));
                Ok::<_, ToolError>(json!({}))
            }
        }
    });
    let rig = Rig::new(vec![tool], worker_config(Duration::from_millis(400), 4)).await;
    let lineage = Lineage {
        parent_run_id: "run-of-the-caller".to_owned(),
        depth: 2,
        budget: Budget {
            max_steps: 7,
            max_tokens: 20_000,
            max_wall_ms: 45_000,
        },
    };
    let with = new_id();
    let inserted = rig
        .store
        .insert_job(NewJob {
            id: with.clone(),
            tenant: TENANT.into(),
            user: "alice".into(),
            tool: "research".into(),
            pool: POOL.into(),
            args: json!({}),
            idempotency_key: None,
            run_id: "run-of-the-sub-agent".into(),
            call_id: new_id(),
            callback_url: None,
            lineage: Some(lineage.clone()),
            scopes: vec!["ledger:read".into()],
            trace: None,
            max_attempts: 1,
            timeout_ms: 5_000,
            now: now_ms(),
            run_at: None,
            priority: None,
            concurrency_key: None,
            concurrency_limit: None,

            fair_rank: 0,
            origin: None,
        })
        .await
        .unwrap();
    assert!(matches!(inserted, Inserted::Created(_)), "{inserted:?}");
    let without = rig.insert("research", 1, 5_000).await;
    for id in [&with, &without] {
        assert_eq!(
            rig.worker.run_job(id).await,
            Handled::Ran(JobState::Succeeded)
        );
    }
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            (
                "run-of-the-sub-agent".to_owned(),
                Some(lineage),
                vec!["ledger:read".to_owned()]
            ),
            ("run-1".to_owned(), None, Vec::new()),
        ]
    );
}

// 7. Shutdown.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_shutdown_a_worker_takes_nothing_and_finishes_what_runs() {
    let runs = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicBool::new(false));
    let rig = Rig::new(
        vec![sleeper(
            "work",
            runs.clone(),
            dropped.clone(),
            Duration::from_millis(400),
        )],
        worker_config(Duration::from_millis(600), 1),
    )
    .await;
    let (stop, run) = rig.start(Duration::from_secs(10));
    let running = rig.insert("work", 3, 5_000).await;
    rig.publish(&running).await;
    until(Duration::from_secs(5), "the first job starts", || {
        runs.load(Ordering::SeqCst) == 1
    })
    .await;
    let queued = rig.insert("work", 3, 5_000).await;
    rig.publish(&queued).await;
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the worker stops within its grace")
        .unwrap();
    // The running job finished within the grace.
    let job = rig.job(&running).await;
    assert_eq!((job.state, job.attempts), (JobState::Succeeded, 1));
    // The queued one was not taken and is not lost: queued in the store and
    // still in the queue (beside, possibly, a harmless copy of the first one's
    // message, handed back when the worker stopped consuming).
    let job = rig.job(&queued).await;
    assert_eq!((job.state, job.attempts), (JobState::Queued, 0));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(rig.broker.depth(POOL).await.unwrap() >= 1);

    // The next worker runs it, and only it.
    let (_stop, _run) = rig.start(Duration::from_secs(1));
    let job = rig
        .wait_state(&queued, JobState::Succeeded, Duration::from_secs(10))
        .await;
    assert_eq!(job.attempts, 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(rig.job(&running).await.attempts, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_still_running_when_the_grace_ends_is_handed_back() {
    let runs = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicBool::new(false));
    let rig = Rig::new(
        vec![sleeper(
            "long",
            runs.clone(),
            dropped.clone(),
            Duration::from_secs(60),
        )],
        // Every slot busy: the shutdown must still be seen at once.
        worker_config(Duration::from_millis(300), 1),
    )
    .await;
    let (stop, run) = rig.start(Duration::from_millis(200));
    let id = rig.insert("long", 3, 120_000).await;
    rig.publish(&id).await;
    until(Duration::from_secs(5), "the job starts", || {
        runs.load(Ordering::SeqCst) == 1
    })
    .await;
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the worker stops once the grace is over, not when the job ends")
        .unwrap();
    until(Duration::from_secs(5), "the executor is stopped", || {
        dropped.load(Ordering::SeqCst)
    })
    .await;
    // Its message is back in the queue, and its lease runs out for the next worker.
    assert_eq!(rig.broker.depth(POOL).await.unwrap(), 1);
    let job = rig.job(&id).await;
    assert_eq!(job.state, JobState::Running);
    sleep_past(job.lease_until.unwrap()).await;
    let next = rig
        .store
        .claim(toolfleet_store::ClaimJob {
            id: &id,
            worker: "next-worker",
            now: now_ms(),
            lease_ms: 1_000,
        })
        .await
        .unwrap()
        .expect("claimable again");
    assert_eq!(next.attempts, 2);
}

/// A broker that holds each publish a moment, counting how many are in
/// flight at once.
struct Overlapping {
    inner: MemoryBroker,
    in_flight: AtomicUsize,
    most: AtomicUsize,
    /// The pools whose depth was asked.
    depths: Mutex<Vec<String>>,
    /// Whether asking a depth fails.
    depth_fails: bool,
}

impl Overlapping {
    fn new(depth_fails: bool) -> Overlapping {
        Overlapping {
            inner: MemoryBroker::new(),
            in_flight: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            depths: Mutex::new(Vec::new()),
            depth_fails,
        }
    }
}

#[async_trait]
impl Broker for Overlapping {
    async fn ping(&self) -> Result<(), BrokerError> {
        self.inner.ping().await
    }

    async fn publish_traced(
        &self,
        pool: &str,
        job_id: &str,
        trace: Option<&toolfleet_core::TraceContext>,
    ) -> Result<(), BrokerError> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let sent = self.inner.publish_traced(pool, job_id, trace).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        sent
    }

    async fn publish_delayed_traced(
        &self,
        pool: &str,
        job_id: &str,
        delay: Duration,
        trace: Option<&toolfleet_core::TraceContext>,
    ) -> Result<(), BrokerError> {
        self.inner
            .publish_delayed_traced(pool, job_id, delay, trace)
            .await
    }

    async fn consume(
        &self,
        pool: &str,
        prefetch: u16,
    ) -> Result<Box<dyn toolfleet_broker::Consumer>, BrokerError> {
        self.inner.consume(pool, prefetch).await
    }

    async fn depth(&self, pool: &str) -> Result<u64, BrokerError> {
        self.depths.lock().unwrap().push(pool.to_owned());
        if self.depth_fails {
            return Err(BrokerError::Unavailable("no answer".into()));
        }
        self.inner.depth(pool).await
    }

    async fn consume_dead(
        &self,
        pool: &str,
    ) -> Result<Box<dyn toolfleet_broker::Consumer>, BrokerError> {
        self.inner.consume_dead(pool).await
    }
}

/// The sweeper publishes what is due all at once, so that a broker that
/// groups publishes carries a backlog's worth in a few messages, not one
/// confirm round trip after another; each due job is published once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_publishes_what_is_due_at_once() {
    let rig = Rig::new(vec![], worker_config(Duration::from_secs(5), 1)).await;
    for _ in 0..50 {
        rig.insert("nothing", 1, 5_000).await;
    }
    let broker = Overlapping::new(false);
    assert_eq!(
        sweep(rig.store.as_ref(), &broker, 100, None, Duration::ZERO).await,
        Ok(50)
    );
    assert_eq!(broker.most.load(Ordering::SeqCst), 50);
    assert_eq!(broker.inner.depth(POOL).await, Ok(50));
}

/// A periodic pass publishes a queued job that waited a period again at
/// every pass while its pool's queue holds nothing ready (its message is
/// not there); while the queue holds some, only at the passes in its first,
/// second, fourth and eighth whole period of waiting and every eighth
/// after: a backlog waiting many periods gets a duplicate at a few passes,
/// not at each. A fleet's first sweep publishes them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_publishes_a_job_behind_a_backlog_again_ever_less_often() {
    let rig = Rig::new(vec![], worker_config(Duration::from_secs(5), 1)).await;
    let period = Duration::from_secs(10);
    let now = now_ms();
    let (mut again, mut stale) = (Vec::new(), Vec::new());
    for whole in [0, 1, 2, 3, 4, 5, 8, 9, 16] {
        let queued = now - whole * 10_000 - 2_000;
        let id = rig.insert_at("nothing", 1, 5_000, None, queued).await;
        if [1, 2, 4, 8, 16].contains(&whole) {
            again.push(id.clone());
        }
        if whole > 0 {
            stale.push(id.clone());
        } else {
            // The young job's message waits in the queue: a backlog.
            rig.publish(&id).await;
            again.push(id);
        }
    }
    let swept = sweep(rig.store.as_ref(), &rig.broker, 100, Some(period), period).await;
    assert_eq!(swept, Ok(5));
    let mut queue = rig.broker.consume(POOL, 100).await.unwrap();
    let mut held = Vec::new();
    again.sort();
    assert_eq!(
        take_held(queue.as_mut(), again.len(), &mut held).await,
        again
    );
    assert_eq!(rig.broker.depth(POOL).await, Ok(0), "nothing else");

    // Nothing ready in the queue: every job that waited a period.
    let swept = sweep(rig.store.as_ref(), &rig.broker, 100, Some(period), period).await;
    assert_eq!(swept, Ok(stale.len()));
    stale.sort();
    assert_eq!(
        take_held(queue.as_mut(), stale.len(), &mut held).await,
        stale
    );
    assert_eq!(
        sweep(rig.store.as_ref(), &rig.broker, 100, None, period).await,
        Ok(9)
    );
}

/// A restarted in-process fleet's first sweep publishes every due job of a
/// backlog longer than the store's page (1,000 of each kind a read), read a
/// page at a time, each once; a later pass publishes what is due again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_publishes_a_backlog_longer_than_a_page_in_one_pass() {
    let rig = Rig::new(vec![], worker_config(Duration::from_secs(5), 1)).await;
    // All of one millisecond, as a schedule's fan-out makes them: a page
    // starts past the last job read by its id.
    let queued = now_ms() - 1_000;
    let mut ids = Vec::new();
    for _ in 0..2_500 {
        ids.push(rig.insert_at("nothing", 1, 5_000, None, queued).await);
    }
    let swept = sweep(
        rig.store.as_ref(),
        &rig.broker,
        100_000,
        None,
        Duration::ZERO,
    )
    .await;
    assert_eq!(swept, Ok(2_500));
    assert_eq!(rig.broker.depth(POOL).await, Ok(2_500));
    let mut queue = rig.broker.consume(POOL, 2_500).await.unwrap();
    let mut held = Vec::new();
    ids.sort();
    assert_eq!(take_held(queue.as_mut(), 2_500, &mut held).await, ids);
    assert_eq!(rig.broker.depth(POOL).await, Ok(0), "each once");
    // At most a page of each kind when asked for no more.
    drop(held);
    drop(queue);
    let swept = sweep(rig.store.as_ref(), &rig.broker, 1_000, None, Duration::ZERO).await;
    assert_eq!(swept, Ok(1_000));
}

/// A pool whose queued jobs span more than a page is asked for its depth
/// before the pass publishes to it, or not at all: a later page does not
/// take the pass's own publishes for a backlog and hold back jobs whose
/// message was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_page_does_not_take_the_pass_own_publishes_for_a_backlog() {
    let rig = Rig::new(vec![], worker_config(Duration::from_secs(5), 1)).await;
    let period = Duration::from_secs(10);
    let now = now_ms();
    // A page of jobs sixteen periods old (published whatever the queue
    // holds), then five three periods old (published only while it holds
    // nothing ready). The queue holds nothing.
    for _ in 0..1_000 {
        rig.insert_at("nothing", 1, 5_000, None, now - 162_000)
            .await;
    }
    for _ in 0..5 {
        rig.insert_at("nothing", 1, 5_000, None, now - 32_000).await;
    }
    let swept = sweep(
        rig.store.as_ref(),
        &rig.broker,
        10_000,
        Some(period),
        period,
    )
    .await;
    assert_eq!(swept, Ok(1_005));
    assert_eq!(rig.broker.depth(POOL).await, Ok(1_005));
}

/// A pass asks a pool's queue for its depth once, however many of its
/// queued jobs the answer decides, and a queue that cannot answer counts
/// as empty: every job that waited a period is published, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_asks_each_queue_once_and_publishes_when_it_cannot_tell() {
    let rig = Rig::new(vec![], worker_config(Duration::from_secs(5), 1)).await;
    let period = Duration::from_secs(10);
    let now = now_ms();
    for whole in [3, 5, 6, 9] {
        let queued = now - whole * 10_000 - 2_000;
        rig.insert_at("nothing", 1, 5_000, None, queued).await;
    }
    for depth_fails in [false, true] {
        let broker = Overlapping::new(depth_fails);
        // A backlog, for a queue that can say so.
        broker.inner.publish(POOL, "young").await.unwrap();
        let swept = sweep(rig.store.as_ref(), &broker, 100, Some(period), period).await;
        assert_eq!(swept, Ok(if depth_fails { 4 } else { 0 }), "{depth_fails}");
        assert_eq!(*broker.depths.lock().unwrap(), [POOL], "asked once");
    }
}

/// The ids of the next `n` deliveries of `queue`, sorted; the deliveries
/// are kept in `held`, unacknowledged (one dropped goes back to the queue).
async fn take_held(
    queue: &mut dyn toolfleet_broker::Consumer,
    n: usize,
    held: &mut Vec<Delivery>,
) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        let delivery = tokio::time::timeout(Duration::from_secs(5), queue.next())
            .await
            .expect("a published job")
            .expect("the queue is open");
        ids.push(delivery.job_id.clone());
        held.push(delivery);
    }
    ids.sort();
    ids
}

// Claiming ahead.

/// A worker claims the jobs it holds beyond its slots as they come, yet
/// runs no more at once than its slots; stopping, it gives back the ones
/// it claimed and did not start (due again at once, the attempt not
/// counted), and lets the running one finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_claimed_ahead_wait_for_a_slot_and_go_back_when_the_worker_stops() {
    let runs = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicBool::new(false));
    let mut config = worker_config(Duration::from_secs(30), 1);
    config.ahead = 2;
    let rig = Rig::new(
        vec![sleeper(
            "slow",
            runs.clone(),
            dropped.clone(),
            Duration::from_millis(1_500),
        )],
        config,
    )
    .await;
    let (stop, run) = rig.start(Duration::from_secs(5));
    let ids = [
        rig.insert("slow", 3, 10_000).await,
        rig.insert("slow", 3, 10_000).await,
        rig.insert("slow", 3, 10_000).await,
    ];
    for id in &ids {
        rig.publish(id).await;
    }
    // All three claimed (one slot running one): the other two claimed ahead.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut running = 0;
        for id in &ids {
            running += usize::from(rig.job(id).await.state == JobState::Running);
        }
        if running == 3 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{running} of 3 claimed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one slot: one runs");
    let _ = stop.send(true);
    run.await.expect("the worker stops");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "nothing more started");
    let mut states = Vec::new();
    for id in &ids {
        let job = rig.job(id).await;
        states.push((job.state, job.attempts));
    }
    states.sort_by_key(|(state, _)| state.as_str());
    assert_eq!(
        states,
        [
            (JobState::Retrying, 0),
            (JobState::Retrying, 0),
            (JobState::Succeeded, 1)
        ],
        "the two claimed ahead went back unstarted"
    );
}

/// Records the job's state as the store has it when its delivery is
/// acknowledged, and any other settlement.
struct StateAtAck {
    store: Arc<dyn Store>,
    id: String,
    seen: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl Acker for StateAtAck {
    async fn ack(self: Box<Self>) -> Result<(), BrokerError> {
        let job = self.store.job_by_id(&self.id).await.unwrap().unwrap();
        self.seen
            .lock()
            .unwrap()
            .push(format!("ack while {}", job.state));
        Ok(())
    }
    async fn requeue(self: Box<Self>) -> Result<(), BrokerError> {
        self.seen.lock().unwrap().push("requeue".into());
        Ok(())
    }
    async fn reject(self: Box<Self>) -> Result<(), BrokerError> {
        self.seen.lock().unwrap().push("reject".into());
        Ok(())
    }
}

impl Rig {
    /// Handles a delivery of `id` in a task of its own, recording its
    /// settlements in `seen`.
    fn handle_recorded(
        &self,
        id: &str,
        seen: &Arc<Mutex<Vec<String>>>,
    ) -> tokio::task::JoinHandle<()> {
        let acker = Box::new(StateAtAck {
            store: self.store.clone(),
            id: id.to_owned(),
            seen: seen.clone(),
        });
        let (worker, delivery) = (self.worker.clone(), Delivery::new(id.into(), false, acker));
        tokio::spawn(async move { worker.handle(delivery).await })
    }
}

/// A worker that holds jobs ahead of its slots acknowledges a delivery as
/// soon as its job has run, before the job is settled (the lease keeps it
/// until then), so that the broker's next message comes while it settles.
/// An attempt interrupted then (here, its lease lost to a newer claim)
/// puts the job's id on the queue again, as a new message, its delivery
/// acknowledged once only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_is_acknowledged_once_its_job_ran_when_the_worker_holds_jobs_ahead() {
    let runs = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicBool::new(false));
    let mut config = worker_config(Duration::from_millis(300), 4);
    config.ahead = 2;
    let rig = Rig::new(
        vec![
            sleeper(
                "long",
                runs.clone(),
                dropped.clone(),
                Duration::from_secs(60),
            ),
            flaky("quick", Arc::new(AtomicUsize::new(0)), 0, false),
        ],
        config,
    )
    .await;
    let quick = rig.insert("quick", 3, 5_000).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    rig.handle_recorded(&quick, &seen).await.unwrap();
    assert_eq!(rig.job(&quick).await.state, JobState::Succeeded);
    assert_eq!(*seen.lock().unwrap(), ["ack while running"]);

    // A job whose lease is lost while it runs: a newer attempt takes it
    // (as once the lease had run out), the first one stops at its next
    // heartbeat, and the job's id goes back on the queue.
    let id = rig.insert("long", 3, 120_000).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let handling = rig.handle_recorded(&id, &seen);
    until(Duration::from_secs(5), "the executor starts", || {
        runs.load(Ordering::SeqCst) == 1
    })
    .await;
    assert!(seen.lock().unwrap().is_empty(), "held while it runs");
    let mut queue = rig.broker.consume(POOL, 1).await.unwrap();
    rig.claim_a_minute_later(&id).await;
    tokio::time::timeout(Duration::from_secs(5), handling)
        .await
        .expect("the interrupted attempt ends")
        .unwrap();
    assert!(dropped.load(Ordering::SeqCst), "its executor was dropped");
    let again = tokio::time::timeout(Duration::from_secs(5), queue.next())
        .await
        .expect("the job's id is published again")
        .expect("the queue is open");
    assert_eq!(again.job_id, id);
    assert_eq!(*seen.lock().unwrap(), ["ack while running"], "settled once");
}

/// A worker that holds no jobs ahead (a pool of long jobs) acknowledges a
/// delivery only once its job settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_is_acknowledged_once_its_job_settled_when_the_worker_holds_none_ahead() {
    let rig = Rig::new(
        vec![flaky("quick", Arc::new(AtomicUsize::new(0)), 0, false)],
        worker_config(Duration::from_secs(30), 4),
    )
    .await;
    let id = rig.insert("quick", 3, 5_000).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    rig.handle_recorded(&id, &seen).await.unwrap();
    assert_eq!(*seen.lock().unwrap(), ["ack while succeeded"]);
}
