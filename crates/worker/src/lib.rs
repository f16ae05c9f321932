//! A worker: takes job ids from its pool, claims each job in the store with
//! a lease, runs the tool's executor under the job's wall-time budget while
//! heartbeating, and settles it: succeeded, retrying with backoff (only for
//! retryable errors, while attempts remain) or failed. Every transition is
//! announced on [`Notices`].
//!
//! The store is the truth. A worker never runs a job it could not claim, so a
//! duplicate or stale message only costs an ack. Each attempt acts on its
//! job through the lease its claim gave it ([`LeaseRef`]: the worker and the
//! attempt number), so an attempt whose lease expired and whose job was
//! claimed again, by another worker or by this one, learns at its next
//! heartbeat that it lost the lease: its executor is cancelled, and it
//! settles and announces nothing. Cancelling a job reaches its executor:
//! the worker drops the executor's future (an `exec` child is killed with it).
//!
//! A worker counts what it does in its runtime's [`Runtime::metrics`]: jobs
//! started, settled and retried, time waiting and running, dead letters, and
//! the gauges of its pool (slots, busy slots, jobs in flight).
//!
//! Each job claimed runs in a `job` span carrying the job's tool, id, run
//! id, tenant and attempt, a child (W3C trace context) of the dispatcher's
//! span that enqueued it: the message's `traceparent`, else the one stored
//! with the job. The span is made once the job is claimed, every field given
//! at creation; every line logged while the job runs carries them.

mod depth;
mod input;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use depth::{Depth, Place};
use tokio::sync::{Notify, Semaphore, watch};
use toolfleet_broker::{Broker, Delivery, EventState, Notices, Subscription};
use toolfleet_core::lifecycle::{self, Transition};
use toolfleet_core::metrics::{Gauge, PoolGauges};
use toolfleet_core::middleware::redact_json;
use toolfleet_fleet::Announcer;
use toolfleet_fleet::runs::{is_run_id, wake_runs};

use toolfleet_core::{
    CallCtx, ErrorCode, JobState, Principal, Runtime, ToolError, TraceContext, is_job_id, now_ms,
};
use toolfleet_store::{Fail, Heartbeat, JobRecord, Lease, LeaseRef, Store, Succeed};
use toolfleet_telemetry::Placement;
use tracing::Instrument;

/// How long a delivery that could not be handled waits before going back.
const REQUEUE_PAUSE: Duration = Duration::from_millis(500);

/// How a worker behaves.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Unique per worker process and pool; the lease owner.
    pub id: String,
    /// The pool whose jobs the worker takes.
    pub pool: String,
    /// Jobs run at once.
    pub concurrency: usize,
    /// Deliveries held beyond `concurrency`, their jobs claimed, so that
    /// the next job is at hand the moment a slot frees (the prefetch is
    /// `concurrency + ahead`). Where it is not 0 (and the pool is not
    /// ordered) a delivery is acknowledged once its job has run, before
    /// it is settled. A worker that stops hands them back unrun.
    pub ahead: usize,
    /// Where above `ahead` (and the worker holds jobs ahead), the most it
    /// holds ahead while its pool's messages leave the hand quickly: it
    /// deepens its prefetch to `concurrency + ahead_max` once a whole hand
    /// left within a fraction of a second, and comes back to `concurrency
    /// + ahead` as soon as one was held over a second or none left for a
    /// second (see the `depth` module).
    pub ahead_max: usize,
    /// A claim holds the job this long; heartbeats extend it.
    pub lease: Duration,
    /// First retry delay; doubled per attempt, with jitter.
    pub backoff_min: Duration,
    /// The longest retry delay.
    pub backoff_max: Duration,
    /// The poll hint written into announced envelopes.
    pub poll_after_s: u32,
    /// The pool is ordered: each message claims the pool's next job by
    /// priority ([`Store::claim_next`]), whichever job it names.
    pub ordered: bool,
}

impl WorkerConfig {
    /// A worker of `pool`: 8 jobs at once, 30 s leases, retries backing off from 1 s to 5 min.
    pub fn new(pool: impl Into<String>) -> Self {
        let pool = pool.into();
        WorkerConfig {
            id: format!("{pool}-{}", toolfleet_core::new_id()),
            pool,
            concurrency: 8,
            ahead: 0,
            ahead_max: 0,
            lease: Duration::from_secs(30),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            poll_after_s: 5,
            ordered: false,
        }
    }
}

/// The retry delay before attempt `attempt + 1`: exponential with jitter.
pub fn retry_delay(config: &WorkerConfig, attempt: u32) -> Duration {
    ExponentialBuilder::default()
        .with_min_delay(config.backoff_min)
        .with_max_delay(config.backoff_max)
        .with_jitter()
        .without_max_times()
        .build()
        .nth(attempt.saturating_sub(1) as usize)
        .unwrap_or(config.backoff_max)
}

/// What became of one delivery.
#[derive(Debug, Clone, PartialEq)]
pub enum Handled {
    /// The job was not claimable: settled, leased elsewhere, not due or gone.
    Skipped,
    /// The job ran and now stands in this state.
    Ran(JobState),
    /// The lease was lost or the store failed while settling: the message
    /// goes back so the job is picked up again.
    Interrupted,
}

/// One worker of one pool.
pub struct Worker {
    config: WorkerConfig,
    runtime: Arc<Runtime>,
    store: Arc<dyn Store>,
    broker: Arc<dyn Broker>,
    notices: Arc<dyn Notices>,
    /// Publishes this worker's events in order, off the job's path.
    announcer: Announcer,
    /// Running jobs, so a cancel notice reaches their executor at once.
    running: Mutex<HashMap<String, Arc<Notify>>>,
    /// Counts this worker's claims: each claim's lease owner is the
    /// worker's id and its number, so no two claims share an owner.
    claims: std::sync::atomic::AtomicU64,
    /// The gauges of this worker's pool.
    gauges: PoolGauges,
    /// Its slots: one per job running at once (`concurrency`). A job takes
    /// one only to run: it is claimed before, and settled after, outside
    /// them (see [`Worker::run`]).
    executors: Arc<Semaphore>,
    /// Turns true when the worker stops taking jobs: those it claimed and
    /// has not started go back.
    stopping: watch::Sender<bool>,
}

/// Adds to a gauge for as long as it lives (a task aborted at shutdown, or
/// a future dropped, drops it too).
struct Held(Gauge, i64);

impl Held {
    fn new(gauge: &Gauge) -> Held {
        Held::by(gauge, 1)
    }

    fn by(gauge: &Gauge, n: i64) -> Held {
        gauge.inc_by(n);
        Held(gauge.clone(), n)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.dec_by(self.1);
    }
}

/// A job this worker listens for cancels of, from before its claim until
/// it is settled (or dropped): a cancel announced meanwhile is kept by the
/// [`Notify`] until the executor waits on it.
struct Listening<'a> {
    worker: &'a Worker,
    job_id: String,
    notify: Arc<Notify>,
}

impl<'a> Listening<'a> {
    fn new(worker: &'a Worker, job_id: &str) -> Listening<'a> {
        // A duplicate delivery of a job this worker already holds shares
        // its listener.
        let notify = worker
            .lock_running()
            .entry(job_id.to_owned())
            .or_insert_with(|| Arc::new(Notify::new()))
            .clone();
        Listening {
            worker,
            job_id: job_id.to_owned(),
            notify,
        }
    }
}

impl Drop for Listening<'_> {
    fn drop(&mut self) {
        // The last of its listeners removes it: the map's reference and
        // this one are all that remain (every clone is made and dropped
        // under this lock).
        let mut running = self.worker.lock_running();
        if Arc::strong_count(&self.notify) <= 2 {
            running.remove(&self.job_id);
        }
    }
}

/// The next prefetch `wanted`; never, for a worker whose depth is fixed.
async fn wanted_change(wanted: &mut Option<watch::Receiver<u16>>) -> u16 {
    match wanted {
        Some(wanted) => match wanted.changed().await {
            Ok(()) => *wanted.borrow_and_update(),
            Err(_) => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Worker {
    /// A worker taking jobs of its pool from `broker`, claiming them in `store` and announcing on `notices`.
    pub fn new(
        config: WorkerConfig,
        runtime: Arc<Runtime>,
        store: Arc<dyn Store>,
        broker: Arc<dyn Broker>,
        notices: Arc<dyn Notices>,
    ) -> Arc<Self> {
        let slots = config.concurrency.max(1);
        Arc::new(Worker {
            announcer: Announcer::spawn(notices.clone(), 65_536),
            gauges: runtime.metrics().pool_gauges(&config.pool),
            config,
            runtime,
            store,
            broker,
            notices,
            running: Mutex::new(HashMap::new()),
            claims: std::sync::atomic::AtomicU64::new(0),
            executors: Arc::new(Semaphore::new(slots)),
            stopping: watch::Sender::new(false),
        })
    }

    /// How the worker behaves.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Consumes the pool until `shutdown` turns true, then lets running jobs
    /// finish within `grace` and hands back what it still holds.
    ///
    /// Its slots count in `toolfleet_worker_slots` only while it consumes:
    /// not while the broker cannot be reached, and not once it stops
    /// taking jobs, however it stops (its future dropped included), while
    /// its running jobs finish too.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>, grace: Duration) {
        let capacity = self.config.concurrency.max(1);
        // Deliveries in hand: waiting to be claimed, claimed and waiting for
        // a slot (claimed ahead), running, or (holding none ahead) being
        // settled. A job holds a slot only while it runs, so the store's
        // round trips of one job overlap the run of another; `ahead` bounds
        // what waits. Holding jobs ahead, a delivery leaves the hand (and is
        // acknowledged) once its job has run, while it settles.
        let in_hand = capacity.saturating_add(self.config.ahead);
        let prefetch = u16::try_from(in_hand).unwrap_or(u16::MAX);
        // Holding jobs ahead, the prefetch deepens while messages leave the
        // hand quickly, and the places in hand with it.
        let early = self.config.ahead > 0 && !self.config.ordered;
        let deepest = capacity.saturating_add(self.config.ahead_max);
        let depth = (early && deepest > in_hand)
            .then(|| Depth::new(prefetch, u16::try_from(deepest).unwrap_or(u16::MAX)));
        let slots = Arc::new(Semaphore::new(in_hand));
        let subscribing = async {
            loop {
                match self.broker.consume(&self.config.pool, prefetch).await {
                    Ok(consumer) => break Some(consumer),
                    Err(error) => {
                        tracing::warn!(pool = %self.config.pool, %error, "cannot consume; retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                            _ = shutdown.changed() => break None,
                        }
                    }
                }
            }
        };
        // The store's connections open while the queue is subscribed, so
        // that the first jobs do not wait for them.
        let warming = async {
            if let Err(error) = self.store.warm().await {
                tracing::debug!(%error, "cannot open the store's connections ahead; the first jobs will");
            }
        };
        // Listening for cancels before the first job is taken, so none is
        // announced unheard (the heartbeat would find it, a lease later).
        // A cancel is an outcome: the feed of outcomes carries it.
        let listening = async {
            match self.notices.subscribe_settled().await {
                Ok(events) => Some(events),
                Err(error) => {
                    tracing::warn!(pool = %self.config.pool, %error, "cannot follow cancels; heartbeats will find them");
                    None
                }
            }
        };
        let (_, consumer, cancels) = tokio::join!(warming, subscribing, listening);
        let Some(mut consumer) = consumer else { return };
        let capacity = Held::by(
            &self.gauges.slots,
            i64::try_from(capacity).unwrap_or(i64::MAX),
        );
        let _cancels =
            cancels.map(|events| AbortOnDrop(tokio::spawn(self.clone().follow_cancels(events))));
        let mut prefetched = Held::by(&self.gauges.prefetch, i64::from(prefetch));
        let mut wanted = depth.as_ref().map(|depth| depth.subscribe());
        let _stalls = depth
            .clone()
            .map(|depth| AbortOnDrop(tokio::spawn(depth.watch_stalls())));
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            // Shutdown comes first, both while every slot is busy and when a
            // delivery is ready at the same moment: after it, nothing is
            // taken. A change of depth is made while waiting for either.
            let permit = tokio::select! {
                biased;
                _ = shutdown.changed() => break,
                prefetch = wanted_change(&mut wanted) => {
                    prefetched = self.follow_depth(consumer.as_mut(), depth.as_deref(), &slots, prefetch);
                    continue;
                }
                permit = slots.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => break,
                },
            };
            let delivery = loop {
                tokio::select! {
                    biased;
                    _ = shutdown.changed() => break None,
                    prefetch = wanted_change(&mut wanted) => {
                        prefetched = self.follow_depth(consumer.as_mut(), depth.as_deref(), &slots, prefetch);
                    }
                    delivery = consumer.next() => break delivery,
                }
            };
            let Some(delivery) = delivery else { break };
            let place = Place::new(permit, delivery.received, depth.clone());
            let worker = self.clone();
            // Boxed: a job's future is large (some 7 KB), and a task
            // moves its future a few times as it is spawned.
            tasks.spawn(Box::pin(async move {
                worker.handle_holding(delivery, Some(place)).await;
            }));
            while tasks.try_join_next().is_some() {}
        }
        drop(prefetched);
        // Jobs claimed ahead and not started go back now. The worker takes
        // no more: its slots stop counting (and its process stops being
        // ready) while the running jobs finish.
        self.stopping.send_replace(true);
        drop(consumer);
        drop(capacity);
        let drained =
            tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            // Dropping the tasks drops their deliveries unacked: the broker
            // hands them back, and the leases let another worker claim them.
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
    }

    /// Brings the consumer, the places in hand and the prefetch gauge to
    /// `prefetch`, the depth wanted now; answers the gauge's new share.
    fn follow_depth(
        &self,
        consumer: &mut dyn toolfleet_broker::Consumer,
        depth: Option<&Depth>,
        slots: &Semaphore,
        prefetch: u16,
    ) -> Held {
        consumer.set_prefetch(prefetch);
        if let Some(depth) = depth {
            depth.resize(slots, prefetch);
        }
        Held::by(&self.gauges.prefetch, i64::from(prefetch))
    }

    /// Handles one delivery and acknowledges it; a message that is not a
    /// job id is rejected (dead-lettered).
    pub async fn handle(&self, delivery: Delivery) {
        self.handle_holding(delivery, None).await;
    }

    /// [`Worker::handle`], holding `held` (its place among the deliveries
    /// in hand) until its job has run or the delivery is settled.
    ///
    /// A worker that holds jobs ahead of its slots acknowledges a delivery
    /// as soon as its job has run, and gives its place in hand back then:
    /// the job's lease keeps it until it is settled (a worker that dies
    /// meanwhile leaves it to the sweeper once the lease runs out, as it
    /// does a job whose message came back while the lease held), and the
    /// broker's next message is taken and claimed while it settles. A
    /// worker that holds none (long jobs) acknowledges once the job
    /// settled.
    async fn handle_holding(&self, delivery: Delivery, held: Option<Place>) {
        if !is_job_id(&delivery.job_id) {
            // No job can be claimed for it: dead-letter it rather than drop it.
            let body: String = delivery.job_id.chars().take(64).collect();
            tracing::warn!(pool = %self.config.pool, body, "not a job id; dead-lettering the message");
            match delivery.reject().await {
                Ok(()) => self.runtime.metrics().dead_letter(&self.config.pool),
                Err(error) => tracing::warn!(%error, "could not reject a delivery"),
            }
            return;
        }
        let job_id = delivery.job_id.clone();
        let trace = delivery.trace.clone();
        let early = self.config.ahead > 0 && !self.config.ordered;
        let mut delivery = Some(delivery);
        // Holding none ahead, the place in hand is kept until the delivery
        // is settled, as the prefetch is.
        let (held, kept) = if early { (held, None) } else { (None, held) };
        let hold = Hold {
            held,
            delivery: early.then_some(&mut delivery),
            ..Hold::default()
        };
        let (handled, span) = self.claim_and_run(&job_id, trace.as_ref(), hold).await;
        // `delivery` is `None` once acknowledged after its job ran.
        let settle = async {
            let settled = match (handled, delivery) {
                (Handled::Interrupted, delivery) => {
                    // The store or the lease failed: give it a moment rather than
                    // take the same message straight back in a tight loop.
                    tokio::time::sleep(REQUEUE_PAUSE).await;
                    // Sent again as a new message rather than given back, so
                    // a broker's delivery limit counts only the deliveries
                    // a worker lost (its process died holding them), never a
                    // store's outage; given back when the broker refuses, or,
                    // acknowledged already, left to the sweeper once its
                    // lease runs out.
                    let pool = &self.config.pool;
                    let published = self
                        .broker
                        .publish_traced(pool, &job_id, trace.as_ref())
                        .await;
                    match (published, delivery) {
                        (Ok(()), Some(delivery)) => delivery.ack().await,
                        (Err(_), Some(delivery)) => delivery.requeue().await,
                        (Err(error), None) => {
                            tracing::warn!(job_id = %job_id, %error, "an interrupted job was not published again; left to the sweeper");
                            Ok(())
                        }
                        (Ok(()), None) => Ok(()),
                    }
                }
                (_, Some(delivery)) => delivery.ack().await,
                (_, None) => Ok(()),
            };
            if let Err(error) = settled {
                tracing::warn!(job_id = %job_id, %error, "could not settle a delivery with the broker");
            }
        };
        match span {
            Some(span) => settle.instrument(span).await,
            None => settle.await,
        }
        drop(kept);
    }

    /// Claims and runs one job.
    pub async fn run_job(&self, job_id: &str) -> Handled {
        self.claim_and_run(job_id, None, Hold::default()).await.0
    }

    /// Claims `job_id` and runs it in its `job` span, which it answers when
    /// the job was claimed. The span is made once the job is claimed, with
    /// every field at creation: the job's tool, id, run id, tenant and
    /// attempt, and its place in the trace, a child of the span that
    /// enqueued it (`parent`, the message's context, else the one stored
    /// with the job). At ERROR level, so that it is enabled whatever
    /// TOOLFLEET_LOG lets through and every line logged while the job runs
    /// carries its fields. What is logged before the claim names the job
    /// itself.
    ///
    /// `hold`: a delivery to acknowledge (taken) once the job has run, and
    /// a place in hand to give back then.
    async fn claim_and_run(
        &self,
        job_id: &str,
        parent: Option<&TraceContext>,
        mut hold: Hold<'_>,
    ) -> (Handled, Option<tracing::Span>) {
        let lease_ms = self.config.lease.as_millis() as i64;
        let ordered = self.config.ordered;
        // Listening for its cancel before the claim: a cancel announced
        // between the claim and the executor's start is kept, not missed.
        // In an ordered pool the job is known only once claimed; a cancel
        // before then is found by the first heartbeat.
        // An ordered pool claims its next job when a slot is free, so the
        // job chosen is the best one then; any other claims ahead.
        if ordered {
            match self.slot(None).await {
                Slot::Taken(taken) => hold.slot = Some(taken),
                // Stopping: its message goes back unclaimed.
                Slot::Stopping | Slot::Lost(_) => return (Handled::Interrupted, None),
            }
        }
        let listening = (!ordered).then(|| Listening::new(self, job_id));
        let claimed_at = now_ms();
        // The lease owner of this claim alone: a job put back after it
        // failed or was cancelled counts its attempts from 1 again, so an
        // attempt of its earlier life that still runs here must not match
        // the new claim's owner and attempt.
        let n = self
            .claims
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let owner = format!("{}.{n}", self.config.id);
        let by_id = toolfleet_store::ClaimJob {
            id: job_id,
            worker: &owner,
            now: claimed_at,
            lease_ms,
        };
        let claimed = if ordered {
            let next = toolfleet_store::ClaimNext {
                pool: &self.config.pool,
                worker: &owner,
                now: claimed_at,
                lease_ms,
            };
            match self.store.claim_next(next).await {
                // Nothing of the pool's ordered jobs is claimable: the
                // message's own job, if it carries no priority (made before
                // the pool was ordered), is claimed by id. One with a
                // priority is left to claim_next: its key may be full.
                Ok(None) => match self.store.job_by_id(job_id).await {
                    Ok(Some(own)) if own.priority.is_none() => self.store.claim(by_id).await,
                    Ok(_) => Ok(None),
                    Err(error) => Err(error),
                },
                claimed => claimed,
            }
        } else {
            self.store.claim(by_id).await
        };
        let pool = &self.config.pool;
        // Boxed: a record is some 700 bytes, which every future it passes
        // through (the run, its settling) would otherwise hold a copy of.
        let job = match claimed {
            Ok(Some(job)) => Box::new(job),
            Ok(None) => {
                tracing::debug!(
                    pool = %pool,
                    job_id = %job_id,
                    "not claimable: settled, held elsewhere or not due"
                );
                return (Handled::Skipped, None);
            }
            Err(error) => {
                tracing::warn!(pool = %pool, job_id = %job_id, %error, "claim failed; the message goes back");
                return (Handled::Interrupted, None);
            }
        };
        let cancel = match listening {
            Some(listening) => listening,
            None => Listening::new(self, &job.id),
        };
        // The message's trace is its own job's: another job claimed in its
        // place continues the trace stored with it.
        let parent = parent.filter(|_| job.id == job_id);
        let placement = Placement::new(parent.or(job.trace.as_ref()));
        let span = tracing::error_span!(
            "job",
            pool = %pool,
            tool = %job.tool,
            job_id = %job.id,
            run_id = %job.run_id,
            tenant = %job.tenant,
            attempt = job.attempts,
            trace_id = placement.trace_id(),
            span_id = placement.span_id(),
            parent_span_id = placement.parent_span_id(),
        );
        let trace = placement.place(&span);
        // The attempt this claim started: every later step of this run acts
        // through it, and stops acting once a newer attempt holds the job.
        let lease = LeaseRef {
            job_id: job.id.clone(),
            worker: owner,
            attempt: job.attempts,
        };
        let keyed = job.concurrency_key.is_some();
        let handled = self
            .run_claimed(job, &lease, claimed_at, trace, &cancel.notify, hold)
            .instrument(span.clone())
            .await;
        if keyed {
            self.slot_freed(&lease.job_id).await;
        }
        (handled, Some(span))
    }

    /// How long `job` must wait for a start of its tool's `start_rate`;
    /// `None` when it may start now (or its tool declares none). Starts
    /// the buckets cannot give now (the store unreachable) wait a second.
    async fn start_wait(&self, job: &JobRecord) -> Option<Duration> {
        let tool = self.runtime.registry().get(&job.tool)?;
        tool.declaration().start_rate.as_ref()?;
        let principal = Principal::new(&job.tenant, &job.user, Vec::<String>::new());
        let ctx = CallCtx::new(Arc::new(principal));
        match self.runtime.take_start(tool, &ctx, &job.args).await {
            Ok(wait) => wait,
            Err(error) if error.code == ErrorCode::InvalidArguments => {
                // Its arguments lack the key (the call checks it, so the
                // tool's declaration changed since): it is not held back.
                tracing::warn!(%error, "a job's start_rate key is missing; it starts");
                None
            }
            Err(error) => {
                tracing::warn!(%error, "no start could be taken; the job waits a second");
                Some(Duration::from_secs(1))
            }
        }
    }

    /// Puts `job` back to wait `wait` for a start of its tool's
    /// `start_rate` (`defer`: the attempt given back), its message
    /// published with that delay; the sweeper finds it if the publish is
    /// lost.
    async fn defer(&self, job: &JobRecord, lease: &LeaseRef, wait: Duration) -> Handled {
        let now = now_ms();
        let wait_ms = i64::try_from(wait.as_millis()).unwrap_or(i64::MAX).max(1);
        let deferred = self
            .store
            .defer(toolfleet_store::Defer {
                lease,
                until: now.saturating_add(wait_ms),
                now,
            })
            .await;
        match deferred {
            Ok(Some(job)) => {
                tracing::debug!(wait_ms, "job waits for a start of its tool's start_rate");
                let delay = Duration::from_millis(u64::try_from(wait_ms).unwrap_or(1));
                if let Err(error) = self
                    .broker
                    .publish_after_traced(&job.pool, &job.id, delay, job.trace.as_ref())
                    .await
                {
                    tracing::warn!(%error, "a deferred job's publish failed; left to the sweeper");
                }
                Handled::Ran(JobState::Retrying)
            }
            Ok(None) => Handled::Skipped,
            Err(error) => {
                tracing::warn!(job_id = %job.id, %error, "could not defer a job; the message goes back");
                Handled::Interrupted
            }
        }
    }

    /// A job with a concurrency key stopped running here (settled, put
    /// back to retry, parked or lost): a message to the pool, so that a job
    /// waiting for its key's free slot is claimed now (any message claims
    /// the pool's next job). Lost, the sweeper's pass publishes the waiting
    /// job again.
    async fn slot_freed(&self, job_id: &str) {
        if let Err(error) = self.broker.publish(&self.config.pool, job_id).await {
            tracing::warn!(job_id = %job_id, %error, "a freed slot's message was not published; left to the sweeper");
        }
    }

    /// Runs a job this worker has just claimed as `lease`, in the trace `trace`.
    async fn run_claimed(
        &self,
        job: Box<JobRecord>,
        lease: &LeaseRef,
        claimed_at: i64,
        trace: TraceContext,
        cancelled: &Notify,
        hold: Hold<'_>,
    ) -> Handled {
        let Hold {
            slot,
            held,
            delivery,
        } = hold;
        if !lifecycle::may_run(job.attempts, job.max_attempts) {
            // Claimed again after its holders stopped mid-run, past its last attempt.
            let error = ToolError::failed(
                format!(
                    "`{}` was interrupted on each of its {} attempts",
                    job.tool, job.max_attempts
                ),
                false,
            );
            return self.settle(job, lease, Outcome::Done(Err(error))).await;
        }
        // A slot to run in, the lease kept meanwhile; a worker that stops
        // gives the job back rather than start it.
        let slot = match slot {
            Some(slot) => Slot::Taken(slot),
            None => self.slot(Some((lease, cancelled))).await,
        };
        let slot = match slot {
            Slot::Taken(slot) => slot,
            Slot::Stopping => return Box::pin(self.defer(&job, lease, GIVE_BACK)).await,
            Slot::Lost(outcome) => return self.settle(job, lease, outcome).await,
        };
        let busy = Held::new(&self.gauges.busy_slots);
        if let Some(wait) = self.start_wait(&job).await {
            return Box::pin(self.defer(&job, lease, wait)).await;
        }
        tracing::info!("job started");
        let metrics = self.runtime.metrics();
        let tool = self.runtime.tool_label(&job.tool);
        // Runnable since `run_at`: its insert, its retry time, its wake or,
        // for a job taken over after a lost lease, the end of that lease (the
        // claim sets it), so the attempt that stopped is not counted as waiting.
        let waited = u64::try_from(claimed_at.saturating_sub(job.run_at)).unwrap_or(0);
        metrics.job_started(tool, Duration::from_millis(waited));
        self.announce(&job).await;
        let started = Instant::now();
        let outcome = {
            let _running = Held::new(&self.gauges.in_flight);
            self.execute(&job, lease, trace, cancelled).await
        };
        metrics.job_ran(tool, started.elapsed());
        // Settled outside the slot and its place in hand: the next job
        // runs, and the next delivery is claimed, meanwhile. Its delivery,
        // if the worker holds jobs ahead, is acknowledged meanwhile too:
        // the lease keeps the job until it is settled.
        drop(slot);
        drop(busy);
        drop(held);
        let acked = async {
            if let Some(delivery) = delivery.and_then(Option::take)
                && let Err(error) = delivery.ack().await
            {
                // The message comes back, and its claim finds the job held
                // or settled.
                tracing::warn!(%error, "could not acknowledge the delivery of a job that ran");
            }
        };
        let ((), handled) =
            futures_util::future::join(acked, self.settle(job, lease, outcome)).await;
        handled
    }

    /// A slot to run in, waiting while every slot is taken, unless the
    /// worker stops first. `claimed`: the lease of the job already claimed
    /// (and its cancel), kept meanwhile; the wait ends if it is lost or
    /// the job cancelled first.
    async fn slot(&self, claimed: Option<(&LeaseRef, &Notify)>) -> Slot {
        if let Ok(slot) = self.executors.clone().try_acquire_owned() {
            return Slot::Taken(slot);
        }
        let mut stopping = self.stopping.subscribe();
        let lost = async {
            match claimed {
                Some((lease, cancelled)) => tokio::select! {
                    lost = self.keep_lease(lease) => lost,
                    _ = cancelled.notified() => Outcome::Cancelled,
                },
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = stopping.wait_for(|stopping| *stopping) => Slot::Stopping,
            slot = self.executors.clone().acquire_owned() => match slot {
                Ok(slot) => Slot::Taken(slot),
                Err(_) => Slot::Stopping,
            },
            lost = lost => Slot::Lost(lost),
        }
    }

    /// Runs the executor of `job` until it answers, its budget runs out, it
    /// is cancelled, or `lease` is lost (another attempt holds the job now):
    /// in the last two cases its future is dropped.
    async fn execute(
        &self,
        job: &JobRecord,
        lease: &LeaseRef,
        trace: TraceContext,
        cancelled: &Notify,
    ) -> Outcome {
        let tool = self.runtime.registry().get(&job.tool).cloned();
        let internal = self.runtime.internal(&job.tool).cloned();
        // The caller's scopes: what the job calls is authorised as they would be.
        let principal = Arc::new(Principal::new(&job.tenant, &job.user, job.scopes.clone()));
        let ctx = CallCtx {
            principal,
            run_id: job.run_id.clone(),
            call_id: job.call_id.clone(),
            // The stable key downstream systems deduplicate retries on.
            idempotency_key: Some(job.id.clone()),
            callback_url: job.callback_url.clone(),
            // Where the call that made the job stands among agents, so an
            // agent tool run here knows its depth and its budget.
            lineage: job.lineage.clone(),
            // A job's caller is not listening while a worker runs it.
            events: None,
            // The jobs it makes (an agent's) continue the trace under this attempt.
            trace: Some(trace),
            approval: None,
            // What the job calls starts at once.
            run_at: None,
            priority: None,
            // The worker puts a job's answers in its arguments itself.
            client_input: true,
        };
        let budget = Duration::from_millis(job.timeout_ms.max(1) as u64);
        // The result is stored as every reader gets it (get_job, the job
        // list, events, webhooks, MCP tasks): with the tool's redacted
        // fields masked.
        // A tool that asked its client runs again with the answers.
        let args = if input::asks(&self.runtime, &job.tool) {
            match input::arguments(self.store.as_ref(), job).await {
                Ok(args) => args,
                // Its question expired unanswered.
                Err(error) => return Outcome::Done(Err(error)),
            }
        } else {
            job.args.clone()
        };
        // Boxed: the executor's future is the largest part of a job's, and
        // boxing it keeps what moves with the job's task small.
        let run = Box::pin(async {
            match (&tool, &internal) {
                (Some(tool), _) => {
                    let result = self.runtime.execute(tool, args, ctx).await;
                    result.map(|result| redact_json(result, &tool.middleware().redact))
                }
                (None, Some(executor)) => executor.execute(ctx, job.args.clone()).await,
                (None, None) => Err(ToolError::failed(
                    format!("no tool `{}` is registered on this worker", job.tool),
                    false,
                )),
            }
        });
        let outcome = tokio::select! {
            result = tokio::time::timeout(budget, run) => Outcome::Done(result.unwrap_or_else(|_| Err(ToolError::new(
                ErrorCode::Timeout,
                format!("`{}` ran past its wall-time budget of {} ms", job.tool, job.timeout_ms),
            )))),
            lost = self.keep_lease(lease) => lost,
            _ = cancelled.notified() => Outcome::Cancelled,
        };
        outcome
    }

    /// Heartbeats `lease` until it is lost or the job cancelled.
    async fn keep_lease(&self, lease: &LeaseRef) -> Outcome {
        let lease_ms = self.config.lease.as_millis() as i64;
        let mut tick = tokio::time::interval(self.config.lease / 3);
        tick.tick().await;
        loop {
            tick.tick().await;
            let beat = Heartbeat {
                lease,
                now: now_ms(),
                lease_ms,
            };
            match self.store.heartbeat(beat).await {
                Ok(Lease::Held) => {}
                Ok(Lease::Cancelled) => return Outcome::Cancelled,
                Ok(Lease::Lost) => return Outcome::LeaseLost,
                // A store hiccup is not a lost lease; the next beat may pass.
                Err(error) => tracing::warn!(%error, "heartbeat failed"),
            }
        }
    }

    /// Settles what the attempt `lease` of `job` came to, as its holder: an
    /// attempt that no longer holds the job settles and announces nothing.
    ///
    /// The paths few jobs take (asking the client, reading a job someone
    /// else settled, deferring) are boxed here and in `run_claimed`: a
    /// future is as large as its largest path, and each job's is copied
    /// whole into the task that runs it.
    async fn settle(&self, job: Box<JobRecord>, lease: &LeaseRef, outcome: Outcome) -> Handled {
        let now = now_ms();
        let settled = match outcome {
            Outcome::Done(Err(error)) if error.is_parked() => {
                // The executor parked its job (it waits for a person): the
                // store says how it stands; there is nothing to settle.
                tracing::info!("job parked: {}", error.message);
                return Box::pin(self.as_it_stands(&job.id, true)).await;
            }
            Outcome::Done(Ok(result)) => {
                // A tool that asks its client may answer with questions.
                if input::asks(&self.runtime, &job.tool) {
                    let value = result.to_value();
                    if let Some((requests, state)) = toolfleet_core::client_requests(&value) {
                        let (requests, state) = (requests.clone(), state.cloned());
                        return Box::pin(self.ask(job, lease, requests, state)).await;
                    }
                }
                let done = Succeed {
                    lease,
                    result: &result,
                    now,
                    // The store need not send back what the claim answered.
                    claimed: Some(&job),
                };
                self.store.succeed(done).await
            }
            Outcome::Done(Err(error)) => {
                // The lifecycle decides between `retry` and `fail`; the
                // store executes what it decided.
                let next =
                    lifecycle::after_failure(job.attempts, job.max_attempts, error.retryable);
                let retry =
                    (next == Transition::Retry).then(|| retry_delay(&self.config, job.attempts));
                let retry_at = retry.map(|d| now + d.as_millis() as i64);
                let failed = Fail {
                    lease,
                    error: &error,
                    retry_at,
                    now,
                };
                let settled = self.store.fail(failed).await;
                if let Ok(Some(j)) = &settled {
                    let (code, message) = (error.code.as_str(), error.message.as_str());
                    match retry {
                        Some(delay) if j.state == JobState::Retrying => {
                            tracing::warn!(
                                code,
                                error = message,
                                retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                                "job failed; retrying"
                            );
                            let trace = job.trace.as_ref();
                            let published = self
                                .broker
                                .publish_delayed_traced(&job.pool, &job.id, delay, trace)
                                .await;
                            if let Err(e) = published {
                                // The sweeper republishes due retries from the store.
                                tracing::warn!(error = %e, "delayed publish failed; left to the sweeper");
                            }
                        }
                        _ => tracing::warn!(code, error = message, "job failed"),
                    }
                }
                settled
            }
            Outcome::Cancelled => {
                tracing::info!("job cancelled while running");
                let handled = Box::pin(self.as_it_stands(&job.id, false)).await;
                if let Handled::Ran(state @ JobState::Cancelled) = handled {
                    let tool = self.runtime.tool_label(&job.tool);
                    self.runtime.metrics().job_state(tool, state);
                }
                return handled;
            }
            Outcome::LeaseLost => {
                tracing::warn!(
                    attempt = lease.attempt,
                    "lease lost; the executor was stopped and the job is left to whoever holds it now"
                );
                return Handled::Interrupted;
            }
        };
        match settled {
            Ok(Some(job)) => {
                tracing::info!(state = %job.state, "job settled");
                let tool = self.runtime.tool_label(&job.tool);
                self.runtime.metrics().job_state(tool, job.state);
                self.announce(&job).await;
                if job.state.is_settled() && is_run_id(&job.run_id) {
                    // A run may wait on it: woken off the slot, which is
                    // free for the next job (the sweeper resumes what a
                    // crash here leaves waiting).
                    let (store, broker) = (self.store.clone(), self.broker.clone());
                    let (notices, id) = (self.notices.clone(), job.id.clone());
                    tokio::spawn(async move {
                        wake_runs(store.as_ref(), broker.as_ref(), notices.as_ref(), &id).await;
                    });
                }
                Handled::Ran(job.state)
            }
            // Someone else holds it now (our lease expired meanwhile).
            Ok(None) => {
                tracing::warn!(
                    "lease lost before settling; the job is left to whoever holds it now"
                );
                Handled::Skipped
            }
            Err(error) => {
                tracing::warn!(%error, "could not settle; the message goes back");
                Handled::Interrupted
            }
        }
    }

    /// The tool of `job` asked its client `requests` (see [`input`]): an
    /// input ticket is opened, the job's checkpoint names it with the
    /// tool's state, and the job parks on it. A question past
    /// [`toolfleet_core::MAX_ASKING_ROUNDS`], or one a client cannot answer, fails the job.
    async fn ask(
        &self,
        job: Box<JobRecord>,
        lease: &LeaseRef,
        requests: serde_json::Map<String, serde_json::Value>,
        state: Option<serde_json::Value>,
    ) -> Handled {
        let saved = match self.store.checkpoint(&job.id).await {
            Ok(saved) => saved,
            Err(error) => {
                tracing::warn!(%error, "could not read the job's last question; the message goes back");
                return Handled::Interrupted;
            }
        };
        let round = toolfleet_fleet::tickets::input_round_of(saved.as_ref()) + 1;
        let checked = input::check(&requests).and_then(|()| {
            let most = toolfleet_core::MAX_ASKING_ROUNDS;
            if round > u64::try_from(most).unwrap_or(u64::MAX) {
                Err(ToolError::failed(
                    format!("`{}` asked its client more than {most} rounds", job.tool),
                    false,
                ))
            } else {
                Ok(())
            }
        });
        if let Err(error) = checked {
            return Box::pin(self.settle(job, lease, Outcome::Done(Err(error)))).await;
        }
        let now = now_ms();
        let ttl = self
            .runtime
            .registry()
            .get(&job.tool)
            .and_then(|t| t.declaration().expires_in)
            .unwrap_or(input::INPUT_TTL);
        let ticket = input::ticket(&job, requests, now, ttl);
        let id = ticket.id.clone();
        if let Err(error) = self.store.insert_ticket(ticket).await {
            tracing::warn!(%error, "could not open the input ticket; the message goes back");
            return Handled::Interrupted;
        }
        let checkpoint = toolfleet_fleet::tickets::input_checkpoint(&id, round, state.as_ref());
        let save = toolfleet_store::SaveCheckpoint {
            lease,
            checkpoint: &checkpoint,
            now,
        };
        match self.store.save_checkpoint(save).await {
            Ok(true) => {}
            Ok(false) => return Handled::Skipped,
            Err(error) => {
                tracing::warn!(%error, "could not save the job's question; the message goes back");
                return Handled::Interrupted;
            }
        }
        let park = toolfleet_store::Park {
            lease,
            ticket: &id,
            now,
        };
        match self.store.park(park).await {
            Ok(Some(parked)) => {
                tracing::info!(ticket = %id, round, "job parked: its tool asked its client");
                self.announce(&parked).await;
                Handled::Ran(parked.state)
            }
            Ok(None) => Handled::Skipped,
            Err(error) => {
                tracing::warn!(%error, "could not park the job; the message goes back");
                Handled::Interrupted
            }
        }
    }

    /// A job that something other than this worker settled or parked, as
    /// the store now has it; announced when nobody else did.
    async fn as_it_stands(&self, id: &str, announce: bool) -> Handled {
        match self.store.job_by_id(id).await {
            Ok(Some(job)) => {
                if announce {
                    self.announce(&job).await;
                }
                Handled::Ran(job.state)
            }
            _ => Handled::Interrupted,
        }
    }

    async fn announce(&self, job: &JobRecord) {
        self.announcer.announce_job(job, self.config.poll_after_s);
    }

    /// Stops running executors of jobs announced as cancelled in `events`.
    async fn follow_cancels(self: Arc<Self>, mut events: Box<dyn Subscription>) {
        while let Some(event) = events.next().await {
            if event.state == EventState::Job(JobState::Cancelled)
                && let Some(cancelled) = self.lock_running().get(&event.id)
            {
                cancelled.notify_one();
            }
        }
    }

    fn lock_running(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }
}

enum Outcome {
    Done(Result<toolfleet_core::Json, ToolError>),
    Cancelled,
    LeaseLost,
}

/// What a delivery's job holds while it is claimed and run (nothing, by
/// default: a job run by its id alone).
#[derive(Default)]
struct Hold<'a> {
    /// The slot an ordered pool takes before its claim.
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
    /// The delivery's place in hand, given back once the job has run.
    held: Option<Place>,
    /// The delivery, taken and acknowledged once its job has run.
    delivery: Option<&'a mut Option<Delivery>>,
}

/// What waiting for a slot came to.
enum Slot {
    Taken(tokio::sync::OwnedSemaphorePermit),
    /// The worker stops: the claimed job goes back unstarted.
    Stopping,
    /// Its lease was lost or it was cancelled while it waited.
    Lost(Outcome),
}

/// How soon a claimed job a stopping worker gives back is due again.
const GIVE_BACK: Duration = Duration::from_millis(1);
