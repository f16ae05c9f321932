//! The outbox: a call answers `running` once its job's row is committed,
//! and the job's first message is published after, off the call's path.
//!
//! The row is its own outbox. Every job a process accepts names the
//! process's origin ([`NewJob::origin`](toolfleet_store::NewJob::origin)),
//! and the process beats under that origin while it lives. A publish that
//! fails is tried again with backoff for a while, in the background. When a
//! process stops between the answer and the publish (a crash, a kill), its
//! beat stops: within [`SILENT_AFTER`] another process (a dispatcher or a
//! worker, whichever beats next) takes the silent origin's queued jobs of
//! its last [`LOOKBACK`] and publishes them, then forgets the origin.
//! Anything older is the periodic sweep's ([`crate::sweeper`]). A duplicate
//! message costs a worker one failed claim; nothing here changes a job's
//! state.

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::{Semaphore, watch};
use toolfleet_broker::Broker;
use toolfleet_core::{TraceContext, now_ms};
use toolfleet_store::{QueuedFrom, Store};

use crate::dispatch::Fault;

/// How often a process beats and looks for silent ones.
pub const BEAT: Duration = Duration::from_millis(250);
/// How long a process may go without a beat before its unpublished jobs
/// are published by another, in milliseconds.
pub const SILENT_AFTER: i64 = 1_000;
/// How far back before its last beat a silent process's queued jobs are
/// published again, in milliseconds: further than a publish is retried.
pub const LOOKBACK: i64 = 30_000;
/// How long a failed publish is retried before the periodic sweep is left
/// to it.
const RETRY_FOR: Duration = Duration::from_secs(20);
/// Publishes under way at once; a call past it waits for a free one.
const IN_FLIGHT: u32 = 65_536;
/// Jobs published per page of a silent process's jobs.
const PAGE: u32 = 1_000;

/// Publishes accepted jobs in the background, each until it is confirmed
/// or [`RETRY_FOR`] has passed.
pub struct Outbox {
    origin: String,
    broker: Arc<dyn Broker>,
    in_flight: Arc<Semaphore>,
    fault: Option<Fault>,
}

impl Outbox {
    /// An outbox publishing on `broker`, under a new origin of its own.
    pub fn new(broker: Arc<dyn Broker>, fault: Option<Fault>) -> Self {
        Outbox {
            origin: format!("o_{}", uuid::Uuid::now_v7().simple()),
            broker,
            in_flight: Arc::new(Semaphore::new(IN_FLIGHT as usize)),
            fault,
        }
    }

    /// The origin this process's jobs name.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Publishes job `id` on `pool` in the background, to be delivered
    /// `after` from now (a scheduled job due soon; zero for any other).
    /// Waits only while [`IN_FLIGHT`] publishes are under way.
    pub async fn publish(
        &self,
        pool: &str,
        id: &str,
        trace: Option<&TraceContext>,
        after: Duration,
    ) {
        let Ok(permit) = self.in_flight.clone().acquire_owned().await else {
            return; // Never closed.
        };
        let (broker, fault) = (self.broker.clone(), self.fault);
        let (pool, id, trace) = (pool.to_owned(), id.to_owned(), trace.cloned());
        tokio::spawn(async move {
            let _permit = permit;
            if fault == Some(Fault::AbortAfterAnswer) {
                // Long enough for the answer to leave; then die unpublished.
                tokio::time::sleep(Duration::from_millis(200)).await;
                std::process::abort();
            }
            let mut delays = ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(50))
                .with_max_delay(Duration::from_secs(2))
                .with_jitter()
                .without_max_times()
                .build();
            let started = tokio::time::Instant::now();
            loop {
                // What is left of the delay, if any.
                let left = after.saturating_sub(started.elapsed());
                let published = broker
                    .publish_after_traced(&pool, &id, left, trace.as_ref())
                    .await;
                match published {
                    Ok(()) => {
                        tracing::debug!(job_id = %id, %pool, "job published");
                        return;
                    }
                    Err(error) => match delays.next() {
                        Some(delay) if started.elapsed() + delay < RETRY_FOR => {
                            tracing::debug!(job_id = %id, %error, "publish failed; trying again");
                            tokio::time::sleep(delay).await;
                        }
                        _ => {
                            tracing::warn!(job_id = %id, %pool, %error, "publish failed; left to the sweeper");
                            return;
                        }
                    },
                }
            }
        });
    }

    /// Waits until every publish under way has ended, at most `within`;
    /// whether they all did.
    pub async fn flush(&self, within: Duration) -> bool {
        let all = self.in_flight.acquire_many(IN_FLIGHT);
        matches!(tokio::time::timeout(within, all).await, Ok(Ok(_)))
    }
}

/// Beats for `outbox` every [`BEAT`] and publishes the unpublished jobs of
/// processes that fell silent, until `shutdown`; then waits up to `grace`
/// for its own publishes and, when they all ended, forgets its origin (so
/// nobody publishes its jobs again).
pub async fn run_outbox(
    store: Arc<dyn Store>,
    broker: Arc<dyn Broker>,
    outbox: Arc<Outbox>,
    grace: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let now = now_ms();
        if let Err(error) = store.beat_dispatcher(outbox.origin(), now).await {
            tracing::warn!(%error, "the outbox's beat failed");
        }
        match publish_silent(store.as_ref(), broker.as_ref(), now - SILENT_AFTER).await {
            Ok(0) => {}
            Ok(published) => {
                tracing::info!(jobs = published, "published the jobs of a silent process")
            }
            Err(error) => tracing::warn!(%error, "publishing a silent process's jobs failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(BEAT) => {}
            _ = shutdown.changed() => break,
        }
    }
    if outbox.flush(grace).await {
        let forgot = store.forget_dispatcher(outbox.origin(), i64::MAX).await;
        if let Err(error) = forgot {
            tracing::warn!(%error, "the outbox could not forget its origin");
        }
    } else {
        tracing::warn!("publishes still under way at shutdown: another process publishes them");
    }
}

/// Publishes the queued jobs of every process last seen before
/// `seen_before` (made in its last [`LOOKBACK`]), then forgets each;
/// how many it published.
pub async fn publish_silent(
    store: &dyn Store,
    broker: &dyn Broker,
    seen_before: i64,
) -> Result<usize, String> {
    let mut published = 0;
    let silent = store.silent_dispatchers(seen_before, 10).await;
    for silent in silent.map_err(|e| e.to_string())? {
        let mut after: Option<String> = None;
        loop {
            let page = store
                .queued_from(QueuedFrom {
                    origin: &silent.origin,
                    since: silent.seen_at - LOOKBACK,
                    after: after.as_deref(),
                    limit: PAGE,
                })
                .await
                .map_err(|e| e.to_string())?;
            let sent = futures_util::future::join_all(
                page.iter()
                    .map(|job| broker.publish_traced(&job.pool, &job.id, job.trace.as_ref())),
            )
            .await;
            if let Some(error) = sent.iter().find_map(|sent| sent.as_ref().err()) {
                // Kept: the next beat tries this origin again.
                return Err(format!(
                    "the broker refused a silent process's job: {error}"
                ));
            }
            published += sent.len();
            match page.last() {
                Some(last) if page.len() == PAGE as usize => after = Some(last.id.clone()),
                _ => break,
            }
        }
        store
            .forget_dispatcher(&silent.origin, seen_before)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(published)
}
