//! Delayed jobs through the whole in-process path: a call with a start
//! time is recorded `scheduled`, holds a broker message only once it is
//! within the dispatcher's horizon or the sweeper's pass before it is due,
//! starts at its time and never before, and a cancel before then stops it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;
use toolfleet_broker::memory::{MemoryBroker, MemoryNotices};
use toolfleet_core::{
    CallCtx, Envelope, ErrorCode, JobState, Principal, Runtime, ToolDecl, ToolError, now_ms,
};
use toolfleet_fleet::{Dispatcher, sweep};
use toolfleet_store::sqlite::SqliteStore;
use toolfleet_store::{CancelJob, JobRecord, Store};
use toolfleet_worker::{Worker, WorkerConfig};

const POOL: &str = "later";
const TENANT: &str = "acme";

/// A runtime whose job tool `stamp` records when each run started, its
/// dispatcher publishing scheduled jobs due within `horizon`, and a worker
/// of the pool.
struct Rig {
    store: Arc<dyn Store>,
    broker: MemoryBroker,
    runtime: Arc<Runtime>,
    worker: Arc<Worker>,
    started: Arc<Mutex<Vec<i64>>>,
}

impl Rig {
    async fn new(horizon: Duration) -> Rig {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().await.unwrap());
        let broker = MemoryBroker::new();
        let notices = MemoryNotices::new();
        let dispatcher = Dispatcher::new(
            store.clone(),
            Arc::new(broker.clone()),
            Arc::new(notices.clone()),
        )
        .with_horizon(horizon);
        let mut runtime = Runtime::builder().fleet(Arc::new(dispatcher)).build();
        let started = Arc::new(Mutex::new(Vec::new()));
        let stamps = started.clone();
        let stamp = ToolDecl::job("stamp")
            .pool(POOL)
            .run(move |_ctx: CallCtx, _args: Value| {
                let stamps = stamps.clone();
                async move {
                    stamps.lock().unwrap().push(now_ms());
                    Ok::<_, ToolError>(json!({"stamped": true}))
                }
            });
        let now = ToolDecl::query("now")
            .run(|_ctx: CallCtx, _args: Value| async move { Ok::<_, ToolError>(json!(now_ms())) });
        let slow = ToolDecl::job("slow")
            .pool(POOL)
            .run(|_ctx: CallCtx, _args: Value| async move {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok::<_, ToolError>(json!({}))
            });
        runtime
            .register_all([stamp, now, slow])
            .expect("tools register");
        let runtime = Arc::new(runtime);
        let worker = Worker::new(
            WorkerConfig::new(POOL),
            runtime.clone(),
            store.clone(),
            Arc::new(broker.clone()),
            Arc::new(notices),
        );
        Rig {
            store,
            broker,
            runtime,
            worker,
            started,
        }
    }

    /// Calls `tool` to start at `run_at`: the envelope.
    async fn call_at(&self, tool: &str, run_at: i64) -> Envelope {
        let principal = Arc::new(Principal::new(TENANT, "alice", Vec::<String>::new()));
        let mut ctx = CallCtx::new(principal);
        ctx.run_at = Some(run_at);
        self.runtime.invoke(tool, json!({}), &ctx).await
    }

    /// Calls `stamp` to start at `run_at`: the job's id.
    async fn schedule(&self, run_at: i64) -> String {
        match self.call_at("stamp", run_at).await {
            Envelope::Running { job_id, .. } => job_id,
            other => panic!("a job call answers running: {other:?}"),
        }
    }

    async fn job(&self, id: &str) -> JobRecord {
        self.store.job_by_id(id).await.unwrap().expect("the job")
    }

    fn start(&self) -> watch::Sender<bool> {
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(self.worker.clone().run(stopped, Duration::from_secs(1)));
        stop
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_job_is_scheduled_and_starts_at_its_time_not_before() {
    let rig = Rig::new(Duration::from_secs(10)).await;
    let _stop = rig.start();
    let run_at = now_ms() + 1_500;
    let id = rig.schedule(run_at).await;
    let job = rig.job(&id).await;
    assert_eq!((job.state, job.run_at), (JobState::Scheduled, run_at));
    match job.envelope(5) {
        Envelope::Running {
            state, run_at: at, ..
        } => {
            assert_eq!(state, Some(JobState::Scheduled));
            assert_eq!(at, Some(toolfleet_core::iso8601(run_at)));
        }
        other => panic!("get_job of a scheduled job: {other:?}"),
    }
    // Within the horizon: published at once (after the answer, by the
    // outbox), as one delayed message, well before the job is due.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    while rig.broker.scheduled(POOL) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no delayed message half a second after the call"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(rig.broker.scheduled(POOL), 1);

    let done = rig
        .wait_state(&id, JobState::Succeeded, Duration::from_secs(20))
        .await;
    assert_eq!(done.attempts, 1);
    let started = rig.started.lock().unwrap().clone();
    assert_eq!(started.len(), 1, "ran once");
    assert!(
        started[0] >= run_at,
        "started {} ms before its run_at",
        run_at - started[0]
    );
    // Its own delayed message started it, not the sweeper's next pass,
    // which this rig never runs.
    assert_eq!(rig.broker.scheduled(POOL), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_due_weeks_ahead_holds_no_message_until_the_sweep_before_it() {
    let rig = Rig::new(Duration::from_secs(10)).await;
    let weeks = rig.schedule(now_ms() + 14 * 24 * 3_600_000).await;
    assert_eq!(rig.job(&weeks).await.state, JobState::Scheduled);
    assert_eq!(rig.broker.scheduled(POOL), 0, "no delayed message");
    use toolfleet_broker::Broker;
    assert_eq!(rig.broker.depth(POOL).await, Ok(0), "no ready message");

    // Past the horizon of a dispatcher that publishes none at once: the
    // sweeper's pass publishes what falls due within its reach, with its
    // delay, and nothing later.
    let rig = Rig::new(Duration::ZERO).await;
    let soon = rig.schedule(now_ms() + 1_000).await;
    let later = rig.schedule(now_ms() + 14 * 24 * 3_600_000).await;
    assert_eq!(rig.broker.scheduled(POOL), 0);
    let swept = sweep(
        rig.store.as_ref(),
        &rig.broker,
        100,
        None,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(swept, Ok(1), "only the job due within the pass");
    assert_eq!(rig.broker.scheduled(POOL), 1);
    let _stop = rig.start();
    rig.wait_state(&soon, JobState::Succeeded, Duration::from_secs(20))
        .await;
    assert_eq!(rig.job(&later).await.state, JobState::Scheduled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_job_cancelled_before_its_time_never_runs() {
    let rig = Rig::new(Duration::from_secs(10)).await;
    let _stop = rig.start();
    let run_at = now_ms() + 800;
    let id = rig.schedule(run_at).await;
    let cancel = CancelJob {
        tenant: TENANT,
        id: &id,
        now: now_ms(),
    };
    let cancelled = rig.store.cancel(cancel).await.unwrap().expect("the job");
    assert_eq!(cancelled.state, JobState::Cancelled);
    // Its message arrives at its time and finds nothing to claim.
    tokio::time::timeout(Duration::from_secs(20), async {
        while rig.broker.scheduled(POOL) > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the delayed message arrived");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(rig.started.lock().unwrap().is_empty(), "it never ran");
    let job = rig.job(&id).await;
    assert_eq!((job.state, job.attempts), (JobState::Cancelled, 0));
}

#[tokio::test]
async fn only_job_and_agent_tools_take_a_start_time() {
    let rig = Rig::new(Duration::from_secs(10)).await;
    match rig.call_at("now", now_ms() + 60_000).await {
        Envelope::Error { error, .. } => {
            assert_eq!(error.code, ErrorCode::BadRequest);
            assert!(error.message.contains("run_at"), "{}", error.message);
            assert!(error.message.contains("query"), "{}", error.message);
        }
        other => panic!("a query with a start time is refused: {other:?}"),
    }
    assert!(rig.started.lock().unwrap().is_empty());
}

/// A job put back after a cancel counts its attempts from 1 again; a claim
/// of its new life by the same worker has a lease owner of its own, so the
/// lease of the earlier life's attempt (the same worker, the same attempt
/// number) holds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_jobs_new_claim_is_not_its_earlier_lives() {
    use toolfleet_broker::Broker;
    use toolfleet_store::{Heartbeat, Lease, Requeue};
    let rig = Rig::new(Duration::from_secs(10)).await;
    let _stop = rig.start();
    let id = match rig.call_at("slow", now_ms()).await {
        Envelope::Running { job_id, .. } => job_id,
        other => panic!("{other:?}"),
    };
    let first = rig
        .wait_state(&id, JobState::Running, Duration::from_secs(10))
        .await;
    let earlier = first.lease_ref().expect("held");
    let cancel = CancelJob {
        tenant: TENANT,
        id: &id,
        now: now_ms(),
    };
    rig.store.cancel(cancel).await.unwrap();
    let requeue = Requeue {
        tenant: TENANT,
        id: &id,
        now: now_ms(),
    };
    let back = rig.store.requeue(requeue).await.unwrap().expect("put back");
    rig.broker.publish(POOL, &back.id).await.unwrap();
    let second = rig
        .wait_state(&id, JobState::Running, Duration::from_secs(10))
        .await;
    assert_eq!(
        second.attempts, earlier.attempt,
        "its attempts count from 1 again"
    );
    assert_ne!(second.lease_owner.as_deref(), Some(earlier.worker.as_str()));
    let beat = Heartbeat {
        lease: &earlier,
        now: now_ms(),
        lease_ms: 60_000,
    };
    assert_eq!(rig.store.heartbeat(beat).await.unwrap(), Lease::Lost);
}
