//! Priorities through the in-process path: in an ordered pool whose one
//! slot is busy, the waiting jobs start highest priority first, equal
//! priorities in the order they came, whichever message a worker gets; a
//! priority is refused where it cannot be honoured.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{Notify, watch};
use toolfleet_broker::memory::{MemoryBroker, MemoryNotices};
use toolfleet_core::{
    CallCtx, Envelope, ErrorCode, JobState, Principal, Runtime, ToolDecl, ToolError,
};
use toolfleet_fleet::Dispatcher;
use toolfleet_store::Store;
use toolfleet_store::sqlite::SqliteStore;
use toolfleet_worker::{Worker, WorkerConfig};

const POOL: &str = "ranked";

struct Rig {
    store: Arc<dyn Store>,
    broker: MemoryBroker,
    runtime: Arc<Runtime>,
    worker: Arc<Worker>,
    order: Arc<Mutex<Vec<String>>>,
    release: Arc<Notify>,
}

impl Rig {
    async fn new() -> Rig {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().await.unwrap());
        let broker = MemoryBroker::new();
        let notices = MemoryNotices::new();
        let dispatcher = Dispatcher::new(
            store.clone(),
            Arc::new(broker.clone()),
            Arc::new(notices.clone()),
        );
        let mut runtime = Runtime::builder().fleet(Arc::new(dispatcher)).build();
        let order = Arc::new(Mutex::new(Vec::new()));
        let release = Arc::new(Notify::new());
        let ran = order.clone();
        let stamp =
            ToolDecl::job("stamp")
                .pool(POOL)
                .priority(0)
                .run(move |_ctx: CallCtx, args: Value| {
                    let ran = ran.clone();
                    async move {
                        ran.lock()
                            .unwrap()
                            .push(args["name"].as_str().unwrap_or("?").to_owned());
                        Ok::<_, ToolError>(json!({}))
                    }
                });
        let held = release.clone();
        let hold = ToolDecl::job("hold")
            .pool(POOL)
            .run(move |_ctx: CallCtx, _args: Value| {
                let held = held.clone();
                async move {
                    held.notified().await;
                    Ok::<_, ToolError>(json!({}))
                }
            });
        let plain = ToolDecl::job("plain")
            .run(|_ctx: CallCtx, _args: Value| async move { Ok::<_, ToolError>(json!({})) });
        let look = ToolDecl::query("look")
            .run(|_ctx: CallCtx, _args: Value| async move { Ok::<_, ToolError>(json!({})) });
        runtime
            .register_all([stamp, hold, plain, look])
            .expect("tools register");
        assert!(runtime.is_ordered(POOL), "a tool declares a priority");
        assert!(!runtime.is_ordered("default"));
        let runtime = Arc::new(runtime);
        let mut config = WorkerConfig::new(POOL);
        config.concurrency = 1;
        config.ahead = 2;
        config.ordered = true;
        let worker = Worker::new(
            config,
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
            order,
            release,
        }
    }

    async fn call(&self, tool: &str, args: Value, priority: Option<i16>) -> Envelope {
        let principal = Arc::new(Principal::new("acme", "alice", Vec::<String>::new()));
        let mut ctx = CallCtx::new(principal);
        ctx.priority = priority;
        self.runtime.invoke(tool, args, &ctx).await
    }

    async fn job_of(&self, tool: &str, args: Value, priority: Option<i16>) -> String {
        match self.call(tool, args, priority).await {
            Envelope::Running { job_id, .. } => job_id,
            other => panic!("a job call answers running: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_one_slot_busy_the_highest_priority_starts_first_then_in_order() {
    let rig = Rig::new().await;
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(rig.worker.clone().run(stopped, Duration::from_secs(1)));
    let busy = rig.job_of("hold", json!({}), Some(1)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while rig.store.job_by_id(&busy).await.unwrap().unwrap().state != JobState::Running {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot never got busy"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for (name, priority) in [
        ("low1", None),
        ("low2", Some(0)),
        ("high1", Some(7)),
        ("low3", None),
        ("lowest", Some(-5)),
        ("high2", Some(7)),
        ("mid", Some(3)),
    ] {
        let id = rig.job_of("stamp", json!({"name": name}), priority).await;
        let job = rig.store.job_by_id(&id).await.unwrap().unwrap();
        assert_eq!(job.priority, Some(priority.unwrap_or(0)), "{name}");
    }
    rig.release.notify_one();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while rig.order.lock().unwrap().len() < 7 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            rig.order.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        *rig.order.lock().unwrap(),
        ["high1", "high2", "mid", "low1", "low2", "low3", "lowest"]
    );
    let _ = stop.send(true);
}

#[tokio::test]
async fn a_priority_is_refused_where_it_cannot_be_honoured() {
    let rig = Rig::new().await;
    let refused = |envelope: Envelope| match envelope {
        Envelope::Error { error, .. } => {
            assert_eq!(error.code, ErrorCode::BadRequest, "{error:?}");
            assert!(error.message.contains("`priority`"), "{}", error.message);
            error.message
        }
        other => panic!("refused: {other:?}"),
    };
    let range = refused(rig.call("stamp", json!({"name": "x"}), Some(101)).await);
    assert!(range.contains("-100 to 100"), "{range}");
    let unordered = refused(rig.call("plain", json!({}), Some(1)).await);
    assert!(unordered.contains("pool `default`"), "{unordered}");
    let query = refused(rig.call("look", json!({}), Some(1)).await);
    assert!(query.contains("query tool"), "{query}");
    assert!(
        matches!(
            rig.call("plain", json!({}), None).await,
            Envelope::Running { .. }
        ),
        "without one, the unordered pool's job is made"
    );
    let declared = ToolDecl::query("q")
        .priority(1)
        .run(|_ctx: CallCtx, _args: Value| async move { Ok::<_, ToolError>(json!({})) });
    let mut runtime = Runtime::builder().build();
    let error = runtime
        .register(declared)
        .expect_err("a query takes no priority");
    assert_eq!(error.rule, "priority");
    let out_of_range = ToolDecl::job("j")
        .priority(500)
        .run(|_ctx: CallCtx, _args: Value| async move { Ok::<_, ToolError>(json!({})) });
    assert_eq!(runtime.register(out_of_range).unwrap_err().rule, "priority");
}

/// A job of the pool that carries no priority (made before a tool of the
/// pool declared one) is claimed by its own message once no job with a
/// priority waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_made_before_its_pool_was_ordered_still_runs() {
    use toolfleet_broker::Broker;
    use toolfleet_store::{Inserted, NewJob};
    let rig = Rig::new().await;
    let now = toolfleet_core::now_ms();
    let old = NewJob {
        id: toolfleet_core::new_id(),
        tenant: "acme".to_owned(),
        user: "alice".to_owned(),
        tool: "stamp".to_owned(),
        pool: POOL.to_owned(),
        args: json!({"name": "old"}),
        idempotency_key: None,
        run_id: toolfleet_core::new_id(),
        call_id: toolfleet_core::new_id(),
        callback_url: None,
        lineage: None,
        scopes: Vec::new(),
        trace: None,
        max_attempts: 1,
        timeout_ms: 60_000,
        now,
        run_at: None,
        priority: None,
        concurrency_key: None,
        concurrency_limit: None,

        fair_rank: 0,
        origin: None,
    };
    let Inserted::Created(old) = rig.store.insert_job(old).await.unwrap() else {
        panic!("a new job");
    };
    rig.broker.publish(POOL, &old.id).await.unwrap();
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(rig.worker.clone().run(stopped, Duration::from_secs(1)));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while rig.store.job_by_id(&old.id).await.unwrap().unwrap().state != JobState::Succeeded {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the old job never ran"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(*rig.order.lock().unwrap(), ["old"]);
    let _ = stop.send(true);
}
