//! A [`Store`] that counts the failures of the store it wraps in
//! `toolfleet_backend_errors_total{backend="store"}`: every operation is
//! passed through unchanged, and each one that answers
//! [`StoreError::Unavailable`] or [`StoreError::Schema`] is counted (a
//! [`StoreError::Conflict`] is an answer, not a failure).
//!
//! Every method of [`Store`] is forwarded through
//! [`toolfleet_core::forward_to_inner!`], those with a
//! default body included, so that the wrapped store's own implementation
//! always runs.

use std::sync::Arc;

use serde_json::Value;
use toolfleet_core::metrics::Backend;
use toolfleet_core::{AuditRecord, JobState, Metrics};

use crate::{
    AdvanceSchedule, AnswerTicket, Answered, CancelJob, ClaimCommit, ClaimJob, ClaimNext,
    ClaimNotice, CommitClaim, DeadLetter, Defer, DueJobs, DuePage, Fail, HandleInfo, HandleOwner,
    HandleRecord, Heartbeat, Inserted, JobPage, JobRecord, Lease, ListJobs, ListRuns, ListTickets,
    NewHandle, NewJob, NewRun, NewTicket, Park, PoolRow, Prune, QueuedFrom, Requeue, RequeueMany,
    RespondTicket, Responded, RunInserted, RunPage, RunRecord, SaveCheckpoint, ScheduleRecord,
    SetProgress, SettleCommit, SettleNotice, SettleTicket, SilentDispatcher, StaleRuns, Store,
    StoreError, Succeed, TakeToken, TicketPage, TicketRecord, Unnotified, UpdateRun,
};

/// The store `inner`, its failures counted in `metrics`.
pub struct MeteredStore {
    inner: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl MeteredStore {
    /// The store `inner`, its failures counted in `metrics`.
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

toolfleet_core::forward_to_inner! {
impl Store, for MeteredStore, error StoreError {
    fn ping(&self) -> ();
    fn warm(&self) -> ();
    fn insert_job(&self, job: NewJob) -> Inserted;
    fn job(&self, tenant: &str, id: &str) -> Option<JobRecord>;
    fn job_by_id(&self, id: &str) -> Option<JobRecord>;
    fn list_jobs(&self, list: ListJobs<'_>) -> JobPage;
    fn claim(&self, claim: ClaimJob<'_>) -> Option<JobRecord>;
    fn claim_next(&self, claim: ClaimNext<'_>) -> Option<JobRecord>;
    fn defer(&self, defer: Defer<'_>) -> Option<JobRecord>;
    fn running_with_key(&self, key: &str, now: i64) -> u32;
    fn fair_turn(&self, pool: &str, tenant: &str) -> i64;
    fn heartbeat(&self, beat: Heartbeat<'_>) -> Lease;
    fn set_progress(&self, report: SetProgress<'_>) -> bool;
    fn checkpoint(&self, id: &str) -> Option<Value>;
    fn save_checkpoint(&self, save: SaveCheckpoint<'_>) -> bool;
    fn park(&self, park: Park<'_>) -> Option<JobRecord>;
    fn wake(&self, ticket: &str, now: i64) -> Vec<JobRecord>;
    fn succeed(&self, done: Succeed<'_>) -> Option<JobRecord>;
    fn fail(&self, failed: Fail<'_>) -> Option<JobRecord>;
    fn cancel(&self, cancel: CancelJob<'_>) -> Option<JobRecord>;
    fn due_jobs(&self, due: DueJobs<'_>) -> DuePage;
    fn job_counts(&self) -> Vec<(JobState, u64)>;
    fn queue_stats(&self, tenant: &str, since: i64) -> Vec<PoolRow>;
    fn beat_dispatcher(&self, origin: &str, now: i64) -> ();
    fn silent_dispatchers(&self, seen_before: i64, limit: u32) -> Vec<SilentDispatcher>;
    fn queued_from(&self, from: QueuedFrom<'_>) -> Vec<JobRecord>;
    fn put_handle(&self, handle: NewHandle<'_>) -> u64;
    fn handle(&self, owner: HandleOwner<'_>, id: &str) -> Option<HandleRecord>;
    fn list_handles(&self, owner: HandleOwner<'_>, before: Option<&str>, limit: u32) -> Vec<HandleInfo>;
    fn prune_handles(&self, now: i64, limit: u32) -> u64;
    fn forget_dispatcher(&self, origin: &str, seen_before: i64) -> bool;
    fn unnotified_jobs(&self, search: Unnotified<'_>) -> Vec<JobRecord>;
    fn unnotified_tickets(&self, search: Unnotified<'_>) -> Vec<TicketRecord>;
    fn insert_ticket(&self, ticket: NewTicket) -> TicketRecord;
    fn ticket(&self, tenant: &str, id: &str) -> Option<TicketRecord>;
    fn answer_ticket(&self, answer: AnswerTicket<'_>) -> Option<Answered>;
    fn respond_ticket(&self, respond: RespondTicket<'_>) -> Option<Responded>;
    fn list_tickets(&self, list: ListTickets<'_>) -> TicketPage;
    fn expire_tickets(&self, now: i64, limit: u32) -> Vec<TicketRecord>;
    fn settle_ticket(&self, settle: SettleTicket<'_>) -> Option<TicketRecord>;
    fn unsettled_tickets(&self, before: i64, limit: u32) -> Vec<TicketRecord>;
    fn insert_run(&self, run: NewRun) -> RunInserted;
    fn run(&self, tenant: &str, id: &str) -> Option<RunRecord>;
    fn run_by_id(&self, id: &str) -> Option<RunRecord>;
    fn list_runs(&self, list: ListRuns<'_>) -> RunPage;
    fn update_run(&self, update: UpdateRun<'_>) -> Option<RunRecord>;
    fn waiting_runs(&self, item: &str) -> Vec<RunRecord>;
    fn stale_runs(&self, stale: StaleRuns) -> Vec<RunRecord>;
    fn append_audit(&self, records: &[AuditRecord]) -> ();
    fn audit(&self, tenant: &str, limit: u32) -> Vec<AuditRecord>;
    fn claim_notice(&self, claim: ClaimNotice<'_>) -> bool;
    fn settle_notice(&self, settle: SettleNotice<'_>) -> ();
    fn claim_commit(&self, claim: ClaimCommit<'_>) -> CommitClaim;
    fn settle_commit(&self, settle: SettleCommit<'_>) -> ();
    fn prune(&self, prune: Prune) -> u64;
    fn take_token(&self, take: TakeToken<'_>) -> Option<i64>;
    fn schedules(&self) -> Vec<ScheduleRecord>;
    fn advance_schedule(&self, advance: AdvanceSchedule<'_>) -> bool;
    fn pause_schedule(&self, name: &str, paused: bool, now: i64) -> ScheduleRecord;
    fn dead_letter(&self, dead: DeadLetter<'_>) -> Option<JobRecord>;
    fn requeue(&self, requeue: Requeue<'_>) -> Option<JobRecord>;
    fn requeue_many(&self, many: RequeueMany<'_>) -> Vec<JobRecord>;
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
