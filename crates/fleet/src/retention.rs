//! Retention: what settled long enough ago is deleted, so no table grows
//! for ever. Every dispatching process prunes, a bounded batch at a time
//! ([`Store::prune`]), pausing between batches so that calls have the store
//! meanwhile; several prune at once without deleting a record twice (the
//! store sees to it). Only settled records go: jobs succeeded, failed or
//! cancelled, answered or expired tickets, stopped runs, audit records.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use toolfleet_core::now_ms;
use toolfleet_store::{Prune, Retained, Store, StoreError};

/// How long each kind is kept once settled; `None` keeps it for ever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Settled jobs.
    pub jobs: Option<Duration>,
    /// Answered or expired tickets.
    pub tickets: Option<Duration>,
    /// Stopped runs.
    pub runs: Option<Duration>,
    /// Audit records.
    pub audit: Option<Duration>,
}

/// The default retention of every kind: 30 days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

impl Default for Retention {
    fn default() -> Self {
        let kept = Some(DEFAULT_RETENTION);
        Retention {
            jobs: kept,
            tickets: kept,
            runs: kept,
            audit: kept,
        }
    }
}

impl Retention {
    /// How long `kind` is kept.
    pub fn of(&self, kind: Retained) -> Option<Duration> {
        match kind {
            Retained::Jobs => self.jobs,
            Retained::Tickets => self.tickets,
            Retained::Runs => self.runs,
            Retained::Audit => self.audit,
        }
    }
}

/// Records one prune deletes at most.
pub const BATCH: u32 = 1_000;
/// The pause between two batches.
pub const PAUSE: Duration = Duration::from_millis(20);
/// How often a process looks for what to delete.
pub const PERIOD: Duration = Duration::from_secs(60);

/// Deletes, batch after batch with `pause` between them, every record of
/// each kind settled longer ago than its retention at `now`, until none is
/// left or `shutdown` turns; how many of each kind it deleted.
pub async fn prune_all(
    store: &dyn Store,
    retention: &Retention,
    now: i64,
    pause: Duration,
    shutdown: &watch::Receiver<bool>,
) -> Result<Vec<(Retained, u64)>, StoreError> {
    let mut deleted = Vec::new();
    for kind in Retained::ALL {
        let Some(kept) = retention.of(kind) else {
            continue;
        };
        let kept_ms = i64::try_from(kept.as_millis()).unwrap_or(i64::MAX);
        let before = now.saturating_sub(kept_ms);
        let mut total = 0;
        loop {
            let limit = BATCH;
            let gone = store
                .prune(Prune {
                    kind,
                    before,
                    limit,
                })
                .await?;
            total += gone;
            if gone < u64::from(limit) || *shutdown.borrow() {
                break;
            }
            tokio::time::sleep(pause).await;
        }
        deleted.push((kind, total));
    }
    Ok(deleted)
}

/// Deletes, batch after batch with `pause` between them, the handles
/// expired by `now` ([`Store::prune_handles`]), until none is left or
/// `shutdown` turns; how many.
pub async fn prune_handles(
    store: &dyn Store,
    now: i64,
    pause: Duration,
    shutdown: &watch::Receiver<bool>,
) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let gone = store.prune_handles(now, BATCH).await?;
        total += gone;
        if gone < u64::from(BATCH) || *shutdown.borrow() {
            return Ok(total);
        }
        tokio::time::sleep(pause).await;
    }
}

/// Prunes every `period` until `shutdown`, as [`prune_all`] says, and the
/// expired handles ([`prune_handles`]).
pub async fn run_retention(
    store: Arc<dyn Store>,
    retention: Retention,
    period: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.changed() => return,
        }
        match prune_all(store.as_ref(), &retention, now_ms(), PAUSE, &shutdown).await {
            Ok(deleted) => {
                for (kind, n) in deleted.into_iter().filter(|(_, n)| *n > 0) {
                    tracing::info!(
                        kind = kind.as_str(),
                        deleted = n,
                        "retention deleted settled records"
                    );
                }
            }
            Err(error) => tracing::warn!(%error, "retention failed; trying again next period"),
        }
        match prune_handles(store.as_ref(), now_ms(), PAUSE, &shutdown).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "retention deleted expired handles"),
            Err(error) => tracing::warn!(%error, "handle expiry failed; trying again next period"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use toolfleet_store::sqlite::SqliteStore;
    use toolfleet_store::{ClaimJob, LeaseRef, NewJob, Succeed};

    const DAY_MS: i64 = 86_400_000;

    async fn settled(store: &dyn Store, at: i64) -> String {
        let job = NewJob {
            max_attempts: 1,
            ..crate::testing::new_job(at)
        };
        let id = job.id.clone();
        store.insert_job(job).await.expect("insert");
        let claim = ClaimJob {
            id: &id,
            worker: "w",
            now: at,
            lease_ms: 1_000,
        };
        store.claim(claim).await.expect("claim").expect("claimed");
        let lease = LeaseRef {
            job_id: id.clone(),
            worker: "w".into(),
            attempt: 1,
        };
        let result = json!({}).into();
        let done = Succeed {
            lease: &lease,
            result: &result,
            now: at,
            claimed: None,
        };
        store
            .succeed(done)
            .await
            .expect("succeed")
            .expect("settled");
        id
    }

    /// Every job settled past its retention goes, batch after batch; the
    /// newer stay, and a kind kept for ever is not touched.
    #[tokio::test]
    async fn every_batch_past_retention_goes_and_nothing_newer() {
        let store = SqliteStore::open_in_memory().await.expect("a store");
        let now = 1_800_000_000_000;
        let old = u64::from(BATCH) + 7;
        for _ in 0..old {
            settled(&store, now - 3 * DAY_MS).await;
        }
        let recent = settled(&store, now - DAY_MS / 2).await;
        let (_stop, stopped) = watch::channel(false);
        let day = Some(Duration::from_secs(86_400));
        let forever = Retention {
            jobs: None,
            ..Retention::default()
        };
        let kept = prune_all(&store, &forever, now, Duration::ZERO, &stopped).await;
        assert!(
            kept.expect("prune")
                .iter()
                .all(|(k, _)| *k != Retained::Jobs)
        );
        let retention = Retention {
            jobs: day,
            ..Retention::default()
        };
        let deleted = prune_all(&store, &retention, now, Duration::ZERO, &stopped)
            .await
            .expect("prune");
        assert_eq!(deleted[0], (Retained::Jobs, old));
        assert!(store.job_by_id(&recent).await.expect("read").is_some());
        let again = prune_all(&store, &retention, now, Duration::ZERO, &stopped).await;
        assert_eq!(again.expect("prune")[0], (Retained::Jobs, 0));
    }
}
