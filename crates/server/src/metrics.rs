//! `/metrics`, `/healthz` and `/readyz` of every process but `toolfleet mcp`
//! (stdio, which serves none): the dispatcher serves them beside its API,
//! and a process without one (a worker) serves them alone on
//! `metrics_listen` with [`ops_router`].
//!
//! The metrics themselves are [`toolfleet_core::Metrics`], one registry per
//! process. What only the backends know is read when scraped: jobs by state
//! from the store, by processes that dispatch only (a full count of the
//! jobs table, read at most every [`JOB_COUNTS_PERIOD`]), and the messages
//! ready in each pool's queue from the broker (a worker: its own pools;
//! scrapes less than [`DEPTHS_PERIOD`] apart share one read). A scrape
//! stays cheap and bounded: the reads run together under a timeout, and a
//! read that fails or times out withdraws its series rather than failing
//! the scrape. A failure is counted as a backend error (by the metered
//! backends); a timeout is not (a slow count of a large table is not a
//! failing store) but in `toolfleet_scrape_timeouts_total`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use toolfleet_broker::Broker;
use toolfleet_core::Metrics;
use toolfleet_core::metrics::{Backend, CONTENT_TYPE, Role};
use toolfleet_store::Store;

/// The longest a scrape or a readiness check waits on a backend.
const BACKEND_TIMEOUT: Duration = Duration::from_secs(2);
/// Scrapes closer together than this share one read of the queue depths.
const DEPTHS_PERIOD: Duration = Duration::from_secs(1);
/// Scrapes closer together than this share one count of the jobs by state.
const JOB_COUNTS_PERIOD: Duration = Duration::from_secs(15);
/// How long one answer of `/readyz` serves every probe after it.
const READY_PERIOD: Duration = Duration::from_secs(1);

/// What `/metrics`, `/healthz` and `/readyz` read.
pub struct Ops {
    metrics: Arc<Metrics>,
    /// The metered backends (see `toolfleet_store::metered` and
    /// `toolfleet_broker::metered`): their failures are counted there.
    store: Arc<dyn Store>,
    broker: Arc<dyn Broker>,
    /// The pools whose queue depth is shown: those this process works or
    /// dispatches to.
    pools: Vec<String>,
    /// Whether jobs by state are shown: the process dispatches (its
    /// metrics' [`Role::dispatches`], or it has no role).
    counts_jobs: bool,
    /// The pools this process works: it is ready once a worker consumes
    /// each of them.
    worked: Vec<String>,
    /// When the backends were last read.
    refreshed: tokio::sync::Mutex<Refreshed>,
    depths_period: Duration,
    job_counts_period: Duration,
    timeout: Duration,
    /// The last readiness found, and when: probes within `ready_period` of
    /// it share it, and one check runs at a time.
    readiness: tokio::sync::Mutex<Option<(Instant, bool, Value)>>,
    ready_period: Duration,
}

/// When each scrape-time read last ran (whatever its outcome).
#[derive(Default)]
struct Refreshed {
    depths: Option<Instant>,
    job_counts: Option<Instant>,
}

/// Whether a read that ran `at` is older than `period`, or never ran.
fn due(at: Option<Instant>, period: Duration) -> bool {
    at.is_none_or(|at| at.elapsed() >= period)
}

impl Ops {
    /// The jobs are counted when `metrics` is of a role that dispatches
    /// (or of none); the queue depths of `pools` are read by every role.
    pub fn new(
        metrics: Arc<Metrics>,
        store: Arc<dyn Store>,
        broker: Arc<dyn Broker>,
        pools: Vec<String>,
    ) -> Ops {
        let counts_jobs = metrics.role().is_none_or(Role::dispatches);
        Ops {
            metrics,
            store,
            broker,
            pools,
            counts_jobs,
            worked: Vec::new(),
            refreshed: tokio::sync::Mutex::new(Refreshed::default()),
            depths_period: DEPTHS_PERIOD,
            job_counts_period: JOB_COUNTS_PERIOD,
            timeout: BACKEND_TIMEOUT,
            readiness: tokio::sync::Mutex::new(None),
            ready_period: READY_PERIOD,
        }
    }

    /// Ready only while a worker of this process consumes each of `pools`
    /// (those it works): not while a worker subscribes, nor while it
    /// cannot (a queue it may not declare, say).
    pub fn working(mut self, pools: Vec<String>) -> Ops {
        self.worked = pools;
        self
    }

    /// Waits at most `timeout` on each backend read (default 2 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Ops {
        self.timeout = timeout;
        self
    }

    /// The process's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The text exposition, with the state of the fleet read just now (or
    /// within the periods above).
    pub async fn render(&self) -> String {
        self.refresh().await;
        self.metrics.render()
    }

    /// Reads jobs by state (if this process counts them) and the depth of
    /// each pool, each unless another scrape read it within its period.
    async fn refresh(&self) {
        let mut refreshed = self.refreshed.lock().await;
        let count_jobs = self.counts_jobs && due(refreshed.job_counts, self.job_counts_period);
        let read_depths = due(refreshed.depths, self.depths_period);
        let counts = async {
            if count_jobs {
                Some(tokio::time::timeout(self.timeout, self.store.job_counts()).await)
            } else {
                None
            }
        };
        let depths = async {
            if read_depths {
                let reads = self
                    .pools
                    .iter()
                    .map(|pool| tokio::time::timeout(self.timeout, self.broker.depth(pool)));
                Some(futures_util::future::join_all(reads).await)
            } else {
                None
            }
        };
        let (counts, depths) = tokio::join!(counts, depths);
        let now = Instant::now();
        if let Some(counts) = counts {
            match counts {
                Ok(Ok(counts)) => self.metrics.set_job_counts(&counts),
                Ok(Err(error)) => {
                    tracing::warn!(%error, "metrics: cannot count jobs");
                    self.metrics.clear_job_counts();
                }
                Err(_) => {
                    tracing::warn!("metrics: counting jobs timed out");
                    self.metrics.scrape_timeout(Backend::Store);
                    self.metrics.clear_job_counts();
                }
            }
            refreshed.job_counts = Some(now);
        }
        if let Some(depths) = depths {
            for (pool, depth) in self.pools.iter().zip(depths) {
                let depth = match depth {
                    Ok(Ok(depth)) => Some(depth),
                    Ok(Err(error)) => {
                        tracing::warn!(pool, %error, "metrics: cannot read a queue's depth");
                        None
                    }
                    Err(_) => {
                        tracing::warn!(pool, "metrics: reading a queue's depth timed out");
                        self.metrics.scrape_timeout(Backend::Broker);
                        None
                    }
                };
                self.metrics.set_queue_depth(pool, depth);
            }
            refreshed.depths = Some(now);
        }
    }

    /// Whether the store and the broker answer, each within the timeout,
    /// and each pool this process works is consumed (read at each probe:
    /// the process's own state, not a backend's).
    pub async fn ready(&self) -> (bool, Value) {
        let (mut ready, mut body) = self.backends_ready().await;
        if !self.worked.is_empty() {
            let waiting: Vec<&str> = self
                .worked
                .iter()
                .filter(|pool| !self.metrics.consuming(pool))
                .map(String::as_str)
                .collect();
            body["workers"] = if waiting.is_empty() {
                json!("ok")
            } else {
                json!({ "waiting": waiting })
            };
            ready &= waiting.is_empty();
        }
        (ready, body)
    }

    /// Whether the store and the broker answer, from a check at most
    /// `ready_period` old.
    async fn backends_ready(&self) -> (bool, Value) {
        // A flood of probes waits for one check and shares its answer, so
        // it cannot take the store's connections.
        let mut last = self.readiness.lock().await;
        if let Some((at, ready, body)) = last.as_ref()
            && at.elapsed() < self.ready_period
        {
            return (*ready, body.clone());
        }
        let (ready, body) = self.check_backends().await;
        *last = Some((Instant::now(), ready, body.clone()));
        (ready, body)
    }

    async fn check_backends(&self) -> (bool, Value) {
        let (store, broker) = tokio::join!(
            tokio::time::timeout(self.timeout, self.store.ping()),
            tokio::time::timeout(self.timeout, self.broker.ping()),
        );
        let up = |answer: Result<Result<(), String>, _>, backend: Backend| match answer {
            Ok(Ok(())) => true,
            Ok(Err(_)) => false,
            Err(_) => {
                self.metrics.backend_error(backend);
                false
            }
        };
        let store = up(store.map(|r| r.map_err(|e| e.to_string())), Backend::Store);
        let broker = up(
            broker.map(|r| r.map_err(|e| e.to_string())),
            Backend::Broker,
        );
        let word = |up: bool| if up { "ok" } else { "down" };
        (
            store && broker,
            json!({"store": word(store), "broker": word(broker)}),
        )
    }
}

/// `GET /metrics`.
pub(crate) async fn metrics_response(ops: &Ops) -> Response {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], ops.render().await).into_response()
}

/// `GET /healthz`: the process answers.
pub(crate) fn health_response() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

/// `GET /readyz`: 200 when the store and the broker answer, else 503.
pub(crate) async fn ready_response(ops: &Ops) -> Response {
    let (ready, body) = ops.ready().await;
    if ready {
        return (StatusCode::OK, axum::Json(body)).into_response();
    }
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
    response
}

/// `/metrics`, `/healthz` and `/readyz` alone: what a process without the
/// API (a worker) serves on `metrics_listen`.
pub fn ops_router(ops: Arc<Ops>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(ops): State<Arc<Ops>>| async move { metrics_response(&ops).await }),
        )
        .route("/healthz", get(|| async { health_response() }))
        .route(
            "/readyz",
            get(|State(ops): State<Arc<Ops>>| async move { ready_response(&ops).await }),
        )
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "no such route: /metrics, /healthz or /readyz",
            )
        })
        .with_state(ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use toolfleet_broker::memory::MemoryBroker;
    use toolfleet_broker::{BrokerError, Consumer};
    use toolfleet_core::{AuditRecord, JobState, TraceContext};
    use toolfleet_store::{
        AnswerTicket, Answered, CancelJob, ClaimCommit, ClaimJob, ClaimNotice, CommitClaim,
        DueJobs, DuePage, Fail, Heartbeat, Inserted, JobPage, JobRecord, Lease, ListJobs, ListRuns,
        ListTickets, NewJob, NewRun, NewTicket, Park, RunInserted, RunPage, RunRecord,
        SaveCheckpoint, SetProgress, SettleCommit, SettleNotice, SettleTicket, StaleRuns,
        StoreError, Succeed, TicketPage, TicketRecord, Unnotified, UpdateRun,
    };

    /// A broker that never answers.
    struct Hung;

    #[async_trait]
    impl Broker for Hung {
        async fn ping(&self) -> Result<(), BrokerError> {
            std::future::pending().await
        }
        async fn publish_traced(
            &self,
            _: &str,
            _: &str,
            _: Option<&TraceContext>,
        ) -> Result<(), BrokerError> {
            std::future::pending().await
        }
        async fn publish_delayed_traced(
            &self,
            _: &str,
            _: &str,
            _: Duration,
            _: Option<&TraceContext>,
        ) -> Result<(), BrokerError> {
            std::future::pending().await
        }
        async fn consume(&self, _: &str, _: u16) -> Result<Box<dyn Consumer>, BrokerError> {
            std::future::pending().await
        }
        async fn depth(&self, _: &str) -> Result<u64, BrokerError> {
            std::future::pending().await
        }
        async fn consume_dead(&self, _: &str) -> Result<Box<dyn Consumer>, BrokerError> {
            std::future::pending().await
        }
    }

    /// A store of which a scrape reads only `ping` and `job_counts`: these
    /// answer at once (counting the counts) or, `hung`, the counts never.
    #[derive(Default)]
    struct Counts {
        hung: bool,
        read: AtomicUsize,
        pings: AtomicUsize,
    }

    #[async_trait]
    impl Store for Counts {
        async fn ping(&self) -> Result<(), StoreError> {
            self.pings.fetch_add(1, Ordering::SeqCst);
            // A moment, so probes arriving together find the check running.
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(())
        }
        async fn job_counts(&self) -> Result<Vec<(JobState, u64)>, StoreError> {
            self.read.fetch_add(1, Ordering::SeqCst);
            if self.hung {
                std::future::pending::<()>().await;
            }
            Ok(vec![(JobState::Queued, 3)])
        }
        async fn unnotified_jobs(&self, _: Unnotified<'_>) -> Result<Vec<JobRecord>, StoreError> {
            unreachable!()
        }
        async fn unnotified_tickets(
            &self,
            _: Unnotified<'_>,
        ) -> Result<Vec<TicketRecord>, StoreError> {
            unreachable!()
        }
        async fn insert_job(&self, _: NewJob) -> Result<Inserted, StoreError> {
            unreachable!()
        }
        async fn beat_dispatcher(&self, _: &str, _: i64) -> Result<(), StoreError> {
            unreachable!()
        }
        async fn silent_dispatchers(
            &self,
            _: i64,
            _: u32,
        ) -> Result<Vec<toolfleet_store::SilentDispatcher>, StoreError> {
            unreachable!()
        }
        async fn queued_from(
            &self,
            _: toolfleet_store::QueuedFrom<'_>,
        ) -> Result<Vec<JobRecord>, StoreError> {
            unreachable!()
        }
        async fn forget_dispatcher(&self, _: &str, _: i64) -> Result<bool, StoreError> {
            unreachable!()
        }
        async fn job(&self, _: &str, _: &str) -> Result<Option<JobRecord>, StoreError> {
            unreachable!()
        }
        async fn job_by_id(&self, _: &str) -> Result<Option<JobRecord>, StoreError> {
            unreachable!()
        }
        async fn list_jobs(&self, _: ListJobs<'_>) -> Result<JobPage, StoreError> {
            unreachable!()
        }
        async fn defer(
            &self,
            _: toolfleet_store::Defer<'_>,
        ) -> Result<Option<JobRecord>, StoreError> {
            unreachable!()
        }
        async fn running_with_key(&self, _: &str, _: i64) -> Result<u32, StoreError> {
            unreachable!()
        }
        async fn fair_turn(&self, _: &str, _: &str) -> Result<i64, StoreError> {
            unreachable!()
        }
        async fn claim_next(
            &self,
            _: toolfleet_store::ClaimNext<'_>,
        ) -> Result<Option<JobRecord>, StoreError> {
            unreachable!()
        }
        async fn claim(&self, _: ClaimJob<'_>) -> Result<Option<JobRecord>, StoreError> {
            unreachable!()
        }
        async fn heartbeat(&self, _: Heartbeat<'_>) -> Result<Lease, StoreError> {
            unreachable!()
        }
        async fn set_progress(&self, _: SetProgress<'_>) -> Result<bool, StoreError> {
            unreachable!()
        }
        async fn checkpoint(&self, _: &str) -> Result<Option<Value>, StoreError> {
            unreachable!()
        }
        async fn save_checkpoint(&self, _: SaveCheckpoint<'_>) -> Result<bool, StoreError> {
            unreachable!()
        }
        async fn park(&self, _: Park<'_>) -> Result<Option<JobRecord>, StoreError> {
            unreachable!()
        }
        async fn wake(&self, _: &str, _: i64) -> Result<Vec<JobRecord>, StoreError> {
            unreachable!()
        }
        async fn succeed(&self, _: Succeed<'_>) -> Result<Option<JobRecord>, StoreError> {
            unreachable!()
        }
        async fn fail(&self, _: Fail<'_>) -> Result<Option<JobRecord>, StoreError> {
            unreachable!()
        }
        async fn cancel(&self, _: CancelJob<'_>) -> Result<Option<JobRecord>, StoreError> {
            unreachable!()
        }
        async fn due_jobs(&self, _: DueJobs<'_>) -> Result<DuePage, StoreError> {
            unreachable!()
        }
        async fn insert_ticket(&self, _: NewTicket) -> Result<TicketRecord, StoreError> {
            unreachable!()
        }
        async fn ticket(&self, _: &str, _: &str) -> Result<Option<TicketRecord>, StoreError> {
            unreachable!()
        }
        async fn answer_ticket(&self, _: AnswerTicket<'_>) -> Result<Option<Answered>, StoreError> {
            unreachable!()
        }
        async fn respond_ticket(
            &self,
            _: toolfleet_store::RespondTicket<'_>,
        ) -> Result<Option<toolfleet_store::Responded>, StoreError> {
            unreachable!()
        }
        async fn append_audit(&self, _: &[AuditRecord]) -> Result<(), StoreError> {
            unreachable!()
        }
        async fn audit(&self, _: &str, _: u32) -> Result<Vec<AuditRecord>, StoreError> {
            unreachable!()
        }
        async fn claim_notice(&self, _: ClaimNotice<'_>) -> Result<bool, StoreError> {
            unreachable!()
        }
        async fn settle_notice(&self, _: SettleNotice<'_>) -> Result<(), StoreError> {
            unreachable!()
        }
        async fn claim_commit(&self, _: ClaimCommit<'_>) -> Result<CommitClaim, StoreError> {
            unreachable!()
        }
        async fn settle_commit(&self, _: SettleCommit<'_>) -> Result<(), StoreError> {
            unreachable!()
        }
        async fn prune(&self, _: toolfleet_store::Prune) -> Result<u64, StoreError> {
            unreachable!()
        }
        async fn put_handle(&self, _: toolfleet_store::NewHandle<'_>) -> Result<u64, StoreError> {
            unreachable!()
        }
        async fn handle(
            &self,
            _: toolfleet_store::HandleOwner<'_>,
            _: &str,
        ) -> Result<Option<toolfleet_store::HandleRecord>, StoreError> {
            unreachable!()
        }
        async fn list_handles(
            &self,
            _: toolfleet_store::HandleOwner<'_>,
            _: Option<&str>,
            _: u32,
        ) -> Result<Vec<toolfleet_store::HandleInfo>, StoreError> {
            unreachable!()
        }
        async fn prune_handles(&self, _: i64, _: u32) -> Result<u64, StoreError> {
            unreachable!()
        }
        async fn take_token(
            &self,
            _: toolfleet_store::TakeToken<'_>,
        ) -> Result<Option<i64>, StoreError> {
            unreachable!()
        }
        async fn schedules(&self) -> Result<Vec<toolfleet_store::ScheduleRecord>, StoreError> {
            unreachable!()
        }
        async fn advance_schedule(
            &self,
            _: toolfleet_store::AdvanceSchedule<'_>,
        ) -> Result<bool, StoreError> {
            unreachable!()
        }
        async fn pause_schedule(
            &self,
            _: &str,
            _: bool,
            _: i64,
        ) -> Result<toolfleet_store::ScheduleRecord, StoreError> {
            unreachable!()
        }
        async fn queue_stats(
            &self,
            _: &str,
            _: i64,
        ) -> Result<Vec<toolfleet_store::PoolRow>, StoreError> {
            unreachable!()
        }
        async fn dead_letter(
            &self,
            _: toolfleet_store::DeadLetter<'_>,
        ) -> Result<Option<JobRecord>, StoreError> {
            unreachable!()
        }
        async fn requeue(
            &self,
            _: toolfleet_store::Requeue<'_>,
        ) -> Result<Option<JobRecord>, StoreError> {
            unreachable!()
        }
        async fn requeue_many(
            &self,
            _: toolfleet_store::RequeueMany<'_>,
        ) -> Result<Vec<JobRecord>, StoreError> {
            unreachable!()
        }
        async fn list_tickets(&self, _: ListTickets<'_>) -> Result<TicketPage, StoreError> {
            unreachable!()
        }
        async fn expire_tickets(&self, _: i64, _: u32) -> Result<Vec<TicketRecord>, StoreError> {
            unreachable!()
        }
        async fn settle_ticket(
            &self,
            _: SettleTicket<'_>,
        ) -> Result<Option<TicketRecord>, StoreError> {
            unreachable!()
        }
        async fn unsettled_tickets(&self, _: i64, _: u32) -> Result<Vec<TicketRecord>, StoreError> {
            unreachable!()
        }
        async fn insert_run(&self, _: NewRun) -> Result<RunInserted, StoreError> {
            unreachable!()
        }
        async fn run(&self, _: &str, _: &str) -> Result<Option<RunRecord>, StoreError> {
            unreachable!()
        }
        async fn run_by_id(&self, _: &str) -> Result<Option<RunRecord>, StoreError> {
            unreachable!()
        }
        async fn list_runs(&self, _: ListRuns<'_>) -> Result<RunPage, StoreError> {
            unreachable!()
        }
        async fn update_run(&self, _: UpdateRun<'_>) -> Result<Option<RunRecord>, StoreError> {
            unreachable!()
        }
        async fn waiting_runs(&self, _: &str) -> Result<Vec<RunRecord>, StoreError> {
            unreachable!()
        }
        async fn stale_runs(&self, _: StaleRuns) -> Result<Vec<RunRecord>, StoreError> {
            unreachable!()
        }
    }

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[tokio::test]
    async fn a_scrape_reads_jobs_and_queue_depths() {
        let metrics = Arc::new(Metrics::new());
        let broker = MemoryBroker::new();
        broker.publish("default", "j1").await.unwrap();
        broker.publish("default", "j2").await.unwrap();
        let ops = Ops::new(
            metrics,
            crate::testing::memory_store().await,
            Arc::new(broker),
            vec!["default".into(), "agents".into()],
        );
        let text = ops.render().await;
        assert_eq!(
            sample(&text, r#"toolfleet_queue_depth{pool="default"}"#),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, r#"toolfleet_queue_depth{pool="agents"}"#),
            Some(0.0)
        );
        for state in [JobState::Queued, JobState::Succeeded, JobState::Cancelled] {
            let series = format!("toolfleet_jobs{{state=\"{state}\"}}");
            assert_eq!(sample(&text, &series), Some(0.0), "{text}");
        }
        assert!(ops.ready().await.0);
    }

    #[tokio::test]
    async fn a_process_that_works_pools_is_ready_once_each_is_consumed() {
        let metrics = Arc::new(Metrics::for_role(Role::Worker));
        let ops = Ops::new(
            metrics.clone(),
            crate::testing::memory_store().await,
            Arc::new(MemoryBroker::new()),
            vec!["default".into(), "agents".into()],
        )
        .working(vec!["default".into(), "agents".into()]);
        // The servers answer, and no worker consumes yet.
        let (ready, body) = ops.ready().await;
        assert!(!ready, "{body}");
        assert_eq!(
            body,
            json!({"store": "ok", "broker": "ok", "workers": {"waiting": ["default", "agents"]}})
        );
        // A worker counts its slots once it consumes its pool; the answer
        // sees it at once, whatever the backends' check is kept for.
        let default = metrics.pool_gauges("default");
        default.slots.inc_by(16);
        let (ready, body) = ops.ready().await;
        assert!(!ready);
        assert_eq!(body["workers"], json!({"waiting": ["agents"]}));
        let agents = metrics.pool_gauges("agents");
        agents.slots.inc_by(4);
        let (ready, body) = ops.ready().await;
        assert!(ready, "{body}");
        assert_eq!(
            body,
            json!({"store": "ok", "broker": "ok", "workers": "ok"})
        );
        // A worker that stopped takes its slots back: not ready again.
        default.slots.dec_by(16);
        let (ready, body) = ops.ready().await;
        assert!(!ready);
        assert_eq!(body["workers"], json!({"waiting": ["default"]}));

        // A process that works no pool answers for its servers alone.
        let dispatcher = Ops::new(
            Arc::new(Metrics::for_role(Role::Dispatcher)),
            crate::testing::memory_store().await,
            Arc::new(MemoryBroker::new()),
            vec!["default".into()],
        );
        assert_eq!(
            dispatcher.ready().await,
            (true, json!({"store": "ok", "broker": "ok"}))
        );
    }

    #[tokio::test]
    async fn only_processes_that_dispatch_count_jobs() {
        for role in Role::ALL {
            let store = Arc::new(Counts::default());
            let ops = Ops::new(
                Arc::new(Metrics::for_role(role)),
                store.clone(),
                Arc::new(MemoryBroker::new()),
                vec!["default".into()],
            );
            let text = ops.render().await;
            let jobs = sample(&text, r#"toolfleet_jobs{state="queued"}"#);
            let read = store.read.load(Ordering::SeqCst);
            if role == Role::Worker {
                assert_eq!((jobs, read), (None, 0), "{text}");
            } else {
                assert_eq!((jobs, read), (Some(3.0), 1), "{role:?}: {text}");
            }
            // Every role shows the depth of its pools.
            assert_eq!(
                sample(&text, r#"toolfleet_queue_depth{pool="default"}"#),
                Some(0.0),
                "{role:?}: {text}"
            );
        }
    }

    #[tokio::test]
    async fn a_flood_of_readiness_probes_asks_the_store_once() {
        let store = Arc::new(Counts::default());
        let mut ops = Ops::new(
            Arc::new(Metrics::for_role(Role::Dispatcher)),
            store.clone(),
            Arc::new(MemoryBroker::new()),
            vec![],
        );
        let probes = (0..200).map(|_| ops.ready());
        let answers = futures_util::future::join_all(probes).await;
        assert!(answers.iter().all(|(ready, _)| *ready));
        assert_eq!(store.pings.load(Ordering::SeqCst), 1);
        assert_eq!(ops.ready_period, Duration::from_secs(1));
        // An answer older than the period is not reused.
        ops.ready_period = Duration::ZERO;
        ops.ready().await;
        assert_eq!(store.pings.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn jobs_are_counted_less_often_than_queues_are_read() {
        let store = Arc::new(Counts::default());
        let broker = Arc::new(MemoryBroker::new());
        let mut ops = Ops::new(
            Arc::new(Metrics::for_role(Role::Dispatcher)),
            store.clone(),
            broker.clone(),
            vec!["default".into()],
        );
        assert_eq!(ops.job_counts_period, Duration::from_secs(15));
        // Every scrape reads the queues; the jobs are counted once a period.
        ops.depths_period = Duration::ZERO;
        for published in 0..3 {
            let text = ops.render().await;
            assert_eq!(
                sample(&text, r#"toolfleet_queue_depth{pool="default"}"#),
                Some(f64::from(published)),
                "{text}"
            );
            assert_eq!(
                sample(&text, r#"toolfleet_jobs{state="queued"}"#),
                Some(3.0)
            );
            broker.publish("default", "j").await.unwrap();
        }
        assert_eq!(store.read.load(Ordering::SeqCst), 1);
        ops.job_counts_period = Duration::ZERO;
        ops.render().await;
        assert_eq!(store.read.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_count_that_times_out_drops_its_series_and_is_no_backend_error() {
        let store = Arc::new(Counts {
            hung: true,
            ..Counts::default()
        });
        let ops = Ops::new(
            Arc::new(Metrics::for_role(Role::Serve)),
            store.clone(),
            Arc::new(MemoryBroker::new()),
            vec!["default".into()],
        )
        .with_timeout(Duration::from_millis(50));
        let started = Instant::now();
        let text = ops.render().await;
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(!text.contains("toolfleet_jobs{"), "{text}");
        assert_eq!(
            sample(&text, r#"toolfleet_scrape_timeouts_total{backend="store"}"#),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, r#"toolfleet_backend_errors_total{backend="store"}"#),
            Some(0.0),
            "{text}"
        );
        // The queues were read all the same.
        assert_eq!(
            sample(&text, r#"toolfleet_queue_depth{pool="default"}"#),
            Some(0.0)
        );
        // The next scrapes within the period do not try again.
        let text = ops.render().await;
        assert!(!text.contains("toolfleet_jobs{"), "{text}");
        assert_eq!(store.read.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_broker_that_hangs_is_a_scrape_timeout_and_the_scrape_still_answers() {
        let metrics = Arc::new(Metrics::new());
        let ops = Ops::new(
            metrics,
            crate::testing::memory_store().await,
            Arc::new(Hung),
            vec!["default".into()],
        )
        .with_timeout(Duration::from_millis(50));
        let started = Instant::now();
        let text = ops.render().await;
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(!text.contains("toolfleet_queue_depth{"), "{text}");
        assert!(
            text.contains(r#"toolfleet_jobs{state="queued"} 0"#),
            "{text}"
        );
        assert_eq!(
            sample(
                &text,
                r#"toolfleet_scrape_timeouts_total{backend="broker"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, r#"toolfleet_backend_errors_total{backend="broker"}"#),
            Some(0.0)
        );
        // A second scrape at once reuses the first read.
        let text = ops.render().await;
        assert_eq!(
            sample(
                &text,
                r#"toolfleet_scrape_timeouts_total{backend="broker"}"#
            ),
            Some(1.0)
        );
        // Readiness is another matter: a broker that does not answer is down.
        let (ready, body) = ops.ready().await;
        assert!(!ready);
        assert_eq!(body, json!({"store": "ok", "broker": "down"}));
        let text = ops.metrics().render();
        assert_eq!(
            sample(&text, r#"toolfleet_backend_errors_total{backend="broker"}"#),
            Some(1.0)
        );
    }
}
