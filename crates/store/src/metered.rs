//! A [`Store`] that counts the failures of the store it wraps in
//! `toolfleet_backend_errors_total{backend="store"}`: every operation is
//! passed through unchanged, and each one that answers
//! [`StoreError::Unavailable`] or [`StoreError::Schema`] is counted (a
//! [`StoreError::Conflict`] is an answer, not a failure).
//!
//! Every method of [`Store`] is forwarded here, those with a default body
//! included, so that the wrapped store's own implementation always runs.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use toolfleet_core::metrics::Backend;
use toolfleet_core::{AuditRecord, Envelope, JobState, Metrics};

use crate::{
    Answered, ClaimCommit, CommitClaim, Fail, Heartbeat, Inserted, JobFilter, JobPage, JobRecord,
    Lease, NewJob, NewTicket, Park, SaveCheckpoint, SetProgress, Store, StoreError, Succeed,
    TicketRecord,
};

/// The store `inner`, its failures counted in `metrics`.
pub struct MeteredStore {
    inner: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl MeteredStore {
    pub fn new(inner: Arc<dyn Store>, metrics: Arc<Metrics>) -> Self {
        MeteredStore { inner, metrics }
    }

    fn seen<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(StoreError::Unavailable(_) | StoreError::Schema(_)) = &result {
            self.metrics.backend_error(Backend::Store);
        }
        result
    }
}

#[async_trait]
impl Store for MeteredStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.seen(self.inner.ping().await)
    }

    async fn insert_job(&self, job: NewJob) -> Result<Inserted, StoreError> {
        self.seen(self.inner.insert_job(job).await)
    }

    async fn job(&self, tenant: &str, id: &str) -> Result<Option<JobRecord>, StoreError> {
        self.seen(self.inner.job(tenant, id).await)
    }

    async fn job_by_id(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        self.seen(self.inner.job_by_id(id).await)
    }

    async fn list_jobs(
        &self,
        tenant: &str,
        filter: &JobFilter,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<JobPage, StoreError> {
        self.seen(self.inner.list_jobs(tenant, filter, limit, cursor).await)
    }

    async fn claim(
        &self,
        id: &str,
        worker: &str,
        now: i64,
        lease_ms: i64,
    ) -> Result<Option<JobRecord>, StoreError> {
        self.seen(self.inner.claim(id, worker, now, lease_ms).await)
    }

    async fn heartbeat(&self, beat: Heartbeat<'_>) -> Result<Lease, StoreError> {
        self.seen(self.inner.heartbeat(beat).await)
    }

    async fn set_progress(&self, report: SetProgress<'_>) -> Result<bool, StoreError> {
        self.seen(self.inner.set_progress(report).await)
    }

    async fn checkpoint(&self, id: &str) -> Result<Option<Value>, StoreError> {
        self.seen(self.inner.checkpoint(id).await)
    }

    async fn save_checkpoint(&self, save: SaveCheckpoint<'_>) -> Result<bool, StoreError> {
        self.seen(self.inner.save_checkpoint(save).await)
    }

    async fn park(&self, park: Park<'_>) -> Result<Option<JobRecord>, StoreError> {
        self.seen(self.inner.park(park).await)
    }

    async fn wake(&self, ticket: &str, now: i64) -> Result<Vec<JobRecord>, StoreError> {
        self.seen(self.inner.wake(ticket, now).await)
    }

    async fn succeed(&self, done: Succeed<'_>) -> Result<Option<JobRecord>, StoreError> {
        self.seen(self.inner.succeed(done).await)
    }

    async fn fail(&self, failed: Fail<'_>) -> Result<Option<JobRecord>, StoreError> {
        self.seen(self.inner.fail(failed).await)
    }

    async fn cancel(
        &self,
        tenant: &str,
        id: &str,
        now: i64,
    ) -> Result<Option<JobRecord>, StoreError> {
        self.seen(self.inner.cancel(tenant, id, now).await)
    }

    async fn due_jobs(&self, now: i64, limit: u32) -> Result<Vec<JobRecord>, StoreError> {
        self.seen(self.inner.due_jobs(now, limit).await)
    }

    async fn job_counts(&self) -> Result<Vec<(JobState, u64)>, StoreError> {
        self.seen(self.inner.job_counts().await)
    }

    async fn unnotified_jobs(
        &self,
        notice_prefix: &str,
        since: i64,
        until: i64,
        limit: u32,
    ) -> Result<Vec<JobRecord>, StoreError> {
        self.seen(
            self.inner
                .unnotified_jobs(notice_prefix, since, until, limit)
                .await,
        )
    }

    async fn unnotified_tickets(
        &self,
        notice_prefix: &str,
        since: i64,
        until: i64,
        limit: u32,
    ) -> Result<Vec<TicketRecord>, StoreError> {
        self.seen(
            self.inner
                .unnotified_tickets(notice_prefix, since, until, limit)
                .await,
        )
    }

    async fn insert_ticket(&self, ticket: NewTicket) -> Result<TicketRecord, StoreError> {
        self.seen(self.inner.insert_ticket(ticket).await)
    }

    async fn ticket(&self, tenant: &str, id: &str) -> Result<Option<TicketRecord>, StoreError> {
        self.seen(self.inner.ticket(tenant, id).await)
    }

    async fn answer_ticket(
        &self,
        tenant: &str,
        id: &str,
        answer: &Value,
        now: i64,
    ) -> Result<Option<Answered>, StoreError> {
        self.seen(self.inner.answer_ticket(tenant, id, answer, now).await)
    }

    async fn append_audit(&self, records: &[AuditRecord]) -> Result<(), StoreError> {
        self.seen(self.inner.append_audit(records).await)
    }

    async fn audit(&self, tenant: &str, limit: u32) -> Result<Vec<AuditRecord>, StoreError> {
        self.seen(self.inner.audit(tenant, limit).await)
    }

    async fn claim_commit(&self, claim: ClaimCommit<'_>) -> Result<CommitClaim, StoreError> {
        self.seen(self.inner.claim_commit(claim).await)
    }

    async fn settle_commit(
        &self,
        key: &str,
        outcome: Option<&Envelope>,
        keep_until: i64,
    ) -> Result<(), StoreError> {
        self.seen(self.inner.settle_commit(key, outcome, keep_until).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend_errors(metrics: &Metrics) -> f64 {
        metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix("toolfleet_backend_errors_total{backend=\"store\"} "))
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1.0)
    }

    #[tokio::test]
    async fn failures_are_counted_and_answers_are_not() {
        let metrics = Arc::new(Metrics::new());
        let sqlite = crate::sqlite::SqliteStore::open_in_memory()
            .await
            .expect("an in-memory store");
        let store = MeteredStore::new(Arc::new(sqlite), metrics.clone());
        store.ping().await.expect("ping");
        assert_eq!(
            store.job_counts().await.map(|c| c.len()),
            Ok(JobState::ALL.len())
        );
        assert_eq!(store.job_by_id("missing").await, Ok(None));
        assert_eq!(backend_errors(&metrics), 0.0);
        for (error, counted) in [
            (StoreError::Unavailable("down".into()), 1.0),
            (StoreError::Schema("old".into()), 2.0),
            (StoreError::Conflict("same key".into()), 2.0),
        ] {
            assert_eq!(store.seen::<()>(Err(error.clone())), Err(error));
            assert_eq!(backend_errors(&metrics), counted);
        }
    }
}
