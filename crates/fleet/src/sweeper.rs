//! The sweeper: publishes again what the store says should run now and no
//! message will bring: jobs whose publish failed or whose dispatcher died
//! between the row and the message (the row is its own outbox), retries
//! whose delayed message was lost, and jobs whose worker stopped holding
//! their lease. It reads the store and publishes ids; it never changes a
//! job's state (a worker's claim does), and a duplicate it sends costs a
//! worker one failed claim.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use toolfleet_broker::Broker;
use toolfleet_core::{JobState, now_ms};
use toolfleet_store::Store;

/// Publishes every job the store says should run now: at start (the
/// in-process queue is empty after a restart) and then periodically, for
/// messages never confirmed and leases that expired. Queued jobs younger than
/// `queued_before` are left alone: their message is most likely still in the
/// queue. Duplicates are harmless either way. The publishes go at once, so a
/// broker that groups publishes (RabbitMQ) carries them in a few messages;
/// the first failure, if any, is answered once all have been tried.
pub async fn sweep(
    store: &dyn Store,
    broker: &dyn Broker,
    limit: u32,
    queued_before: Option<i64>,
) -> Result<usize, String> {
    let due = store
        .due_jobs(now_ms(), limit)
        .await
        .map_err(|e| e.to_string())?;
    let stale = due.iter().filter(|job| {
        let fresh =
            job.state == JobState::Queued && queued_before.is_some_and(|t| job.updated_at > t);
        !fresh
    });
    let sent = futures_util::future::join_all(
        stale.map(|job| broker.publish_traced(&job.pool, &job.id, job.trace.as_ref())),
    )
    .await;
    let published = sent.iter().filter(|sent| sent.is_ok()).count();
    match sent.into_iter().find_map(Result::err) {
        Some(error) => Err(format!(
            "{error} ({published} of the due jobs were published)"
        )),
        None => Ok(published),
    }
}

/// Sweeps every `period` until `shutdown`; a queued job is republished once
/// it has waited a whole `period` (and stays in the queue's order otherwise).
pub async fn run_sweeper(
    store: Arc<dyn Store>,
    broker: Arc<dyn Broker>,
    period: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.changed() => return,
        }
        let stale = now_ms() - period.as_millis() as i64;
        if let Err(error) = sweep(store.as_ref(), broker.as_ref(), 1000, Some(stale)).await {
            tracing::warn!(%error, "sweep failed");
        }
    }
}
