//! What this crate's tests build again and again: an in-memory store, and
//! the jobs and tickets they put in it.

use std::sync::Arc;

use serde_json::json;
use toolfleet_core::{AnsweredBy, JobState};
use toolfleet_store::{JobRecord, NewJob, NewTicket, Store, TicketRecord};

/// The tenant of the jobs and tickets built here.
pub(crate) const TENANT: &str = "acme";

/// A store of a test's own, in memory.
pub(crate) async fn memory_store() -> Arc<dyn Store> {
    Arc::new(
        toolfleet_store::sqlite::SqliteStore::open_in_memory()
            .await
            .expect("a store"),
    )
}

/// A queued job of tenant `acme`, recorded at `now`, with a new id.
pub(crate) fn new_job(callback_url: Option<&str>, now: i64) -> NewJob {
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
        run_at: None,
        priority: None,
        concurrency_key: None,
        concurrency_limit: None,

        fair_rank: 0,
        origin: None,
    }
}

/// An open ticket of tenant `acme`, opened at `now`, with a new id.
pub(crate) fn new_ticket(callback_url: Option<&str>, now: i64) -> NewTicket {
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
        kind: toolfleet_store::TicketKind::Question,
        plan: None,
        scopes: Vec::new(),
        expires_at: None,
        input_requests: None,
        now,
    }
}

/// `job` as the store records it, queued.
pub(crate) fn record_of(job: NewJob) -> JobRecord {
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
        requeues: 0,
        priority: job.priority,
        concurrency_key: job.concurrency_key,
        concurrency_limit: job.concurrency_limit,
        fair_rank: job.fair_rank,
        started_at: None,
        attempts_log: None,
        created_at: job.now,
        updated_at: job.now,
    }
}

/// `ticket` as the store records it, open.
pub(crate) fn ticket_record(ticket: NewTicket) -> TicketRecord {
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
        kind: ticket.kind,
        plan: ticket.plan,
        scopes: ticket.scopes,
        expires_at: ticket.expires_at,
        expired_at: None,
        outcome: None,
        input_requests: ticket.input_requests,
        input_responses: None,
        created_at: ticket.now,
        answered_at: None,
    }
}

/// The user who makes the jobs and tickets built here.
pub(crate) fn alice() -> toolfleet_core::Principal {
    toolfleet_core::Principal::new(TENANT, "alice", Vec::<String>::new())
}

/// The status API over `store` and `notices`, knowing no tool's scopes (a
/// job's result needs none) and auditing into memory.
pub(crate) fn status(
    store: Arc<dyn Store>,
    notices: Arc<dyn toolfleet_broker::Notices>,
) -> crate::Status {
    let access = crate::Access::new(Arc::new(toolfleet_core::MemoryAuditSink::default()), 32);
    access.learn(toolfleet_core::Runtime::builder().build().registry());
    crate::Status::new(store, notices, access)
}

/// What a server at `address` answers a `GET path` (the whole response,
/// read to its close), asked again until it answers, for ten seconds.
pub(crate) async fn eventually_get(address: &str, path: &str) -> String {
    let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let answer = raw(address, request.as_bytes()).await;
        if answer.starts_with("HTTP/1.1 200") || tokio::time::Instant::now() > deadline {
            return answer;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// What a server at `address` answers a `POST path` of `body`.
pub(crate) async fn raw_post(address: &str, path: &str, body: &str) -> String {
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    raw(address, request.as_bytes()).await
}

/// Sends `request` to `address` and reads the answer to its close.
async fn raw(address: &str, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(address).await else {
        return String::new();
    };
    let _ = stream.write_all(request).await;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer).into_owned()
}
