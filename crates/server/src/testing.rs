//! What this crate's tests build again and again: an in-memory store, and
//! the jobs and tickets they put in it.

use std::sync::Arc;

use serde_json::json;
use toolfleet_core::{AnsweredBy, JobState};
use toolfleet_store::{JobRecord, NewJob, NewTicket, Store, TicketRecord};

/// The tenant of the jobs and tickets built here.
pub const TENANT: &str = "acme";

/// A store of a test's own, in memory.
pub async fn memory_store() -> Arc<dyn Store> {
    Arc::new(
        toolfleet_store::sqlite::SqliteStore::open_in_memory()
            .await
            .expect("a store"),
    )
}

/// A queued job of tenant `acme`, recorded at `now`, with a new id.
pub fn new_job(callback_url: Option<&str>, now: i64) -> NewJob {
    NewJob {
        id: toolfleet_core::new_id(),
        tenant: TENANT.to_owned(),
        user: "alice".to_owned(),
        tool: "ocr".to_owned(),
        pool: "default".to_owned(),
        args: json!({}),
        idempotency_key: None,
        run_id: toolfleet_core::new_id(),
        call_id: toolfleet_core::new_id(),
        callback_url: callback_url.map(str::to_owned),
        lineage: None,
        scopes: Vec::new(),
        trace: None,
        max_attempts: 3,
        timeout_ms: 60_000,
        now,
    }
}

/// An open ticket of tenant `acme`, opened at `now`, with a new id.
pub fn new_ticket(callback_url: Option<&str>, now: i64) -> NewTicket {
    NewTicket {
        id: format!("t_{}", toolfleet_core::new_id()),
        tenant: TENANT.to_owned(),
        user: "alice".to_owned(),
        tool: "ask_user".to_owned(),
        question: "travel or meals?".to_owned(),
        options: Vec::new(),
        args: json!({}),
        run_id: toolfleet_core::new_id(),
        call_id: toolfleet_core::new_id(),
        callback_url: callback_url.map(str::to_owned),
        answered_by: AnsweredBy::Caller,
        now,
    }
}

/// `job` as the store records it, queued.
pub fn record_of(job: NewJob) -> JobRecord {
    JobRecord {
        id: job.id,
        tenant: job.tenant,
        user: job.user,
        tool: job.tool,
        pool: job.pool,
        args: job.args,
        state: JobState::Queued,
        attempts: 0,
        max_attempts: job.max_attempts,
        timeout_ms: job.timeout_ms,
        run_at: job.now,
        lease_owner: None,
        lease_until: None,
        progress: None,
        result: None,
        error: None,
        idempotency_key: job.idempotency_key,
        run_id: job.run_id,
        call_id: job.call_id,
        callback_url: job.callback_url,
        lineage: job.lineage,
        scopes: job.scopes,
        trace: job.trace,
        created_at: job.now,
        updated_at: job.now,
    }
}

/// `ticket` as the store records it, open.
pub fn ticket_record(ticket: NewTicket) -> TicketRecord {
    TicketRecord {
        id: ticket.id,
        tenant: ticket.tenant,
        user: ticket.user,
        tool: ticket.tool,
        question: ticket.question,
        options: ticket.options,
        args: ticket.args,
        run_id: ticket.run_id,
        call_id: ticket.call_id,
        callback_url: ticket.callback_url,
        answer: None,
        answered_by: ticket.answered_by,
        created_at: ticket.now,
        answered_at: None,
    }
}

/// The user who makes the jobs and tickets built here.
pub fn alice() -> toolfleet_core::Principal {
    toolfleet_core::Principal::new(TENANT, "alice", Vec::<String>::new())
}

/// The status API over `store` and `notices`, knowing no tool's scopes (a
/// job's result needs none) and auditing into memory.
pub fn status(store: Arc<dyn Store>, notices: Arc<dyn toolfleet_broker::Notices>) -> crate::Status {
    let access = crate::Access::new(Arc::new(toolfleet_core::MemoryAuditSink::default()));
    access.learn(toolfleet_core::Runtime::builder().build().registry());
    crate::Status::new(store, notices, access)
}
