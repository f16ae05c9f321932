//! The hand-off of enqueued shapes. Job and agent calls become jobs, human
//! calls become tickets, through [`Fleet`]: the runtime answers `running` or
//! `suspended` at once. The fleet crates implement it on a store and a
//! broker; [`MemoryFleet`] keeps jobs and tickets in memory.

use std::collections::HashMap;
use std::sync::Mutex;

use futures_util::future::BoxFuture;
use serde_json::Value;

use crate::envelope::{ErrorCode, ToolError};
use crate::lifecycle::JobState;
use crate::middleware::canonical_json;
use crate::tool::{CallCtx, Shape, new_id};

/// A job to enqueue.
#[derive(Debug, Clone)]
pub struct JobRequest {
    /// The job tool called.
    pub tool: String,
    /// Job or agent.
    pub shape: Shape,
    /// The worker pool that runs it.
    pub pool: String,
    /// The call's validated arguments.
    pub args: Value,
    /// Principal, run id, call id, the caller's idempotency key and callback.
    pub ctx: CallCtx,
    /// How many attempts a retryable failure gets, the first included.
    pub max_attempts: u32,
    /// Wall-time budget of one attempt.
    pub timeout: std::time::Duration,
    /// The job's priority, in an ordered pool (the call's, else its
    /// tool's, else 0); `None` in a pool that is not ordered.
    pub priority: Option<i16>,
    /// Its tool's concurrency limit: the key the job counts under (tool,
    /// tenant and the declared key's value) and the most running at once
    /// under it.
    pub concurrency: Option<(String, u32)>,
    /// The pool shares its workers fairly between tenants: the job takes
    /// its tenant's next turn.
    pub fair: bool,
}

/// A question for a person.
#[derive(Debug, Clone)]
pub struct TicketRequest {
    /// The human tool called.
    pub tool: String,
    /// What the person is asked.
    pub question: String,
    /// The answers the person may choose from; empty for a free answer.
    pub options: Vec<String>,
    /// The call's validated arguments.
    pub args: Value,
    /// Principal, run id and call id of the call that opened the ticket.
    pub ctx: CallCtx,
    /// Who may answer it, as its tool declares.
    pub answered_by: crate::AnsweredBy,
    /// How long it stays open before it expires; `None`: never.
    pub expires_in: Option<std::time::Duration>,
}

/// A command's commit waiting for a person's approval.
#[derive(Debug, Clone)]
pub struct ApprovalRequest {
    /// The ticket's id, the same for every commit of one confirm token
    /// ([`approval_ticket_id`]).
    pub ticket: String,
    /// The command tool.
    pub tool: String,
    /// The commit's arguments, its confirm token included: what runs once approved.
    pub args: Value,
    /// What its dry run answers: the plan the person approves.
    pub plan: Value,
    /// Principal, run id and call id of the commit.
    pub ctx: CallCtx,
    /// Who may approve it.
    pub answered_by: crate::AnsweredBy,
    /// How long it stays open before it expires; `None`: never.
    pub expires_in: Option<std::time::Duration>,
}

/// Where an approval stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Approval {
    /// Nobody decided yet, or the approved commit still runs: its ticket.
    Pending(String),
    /// Decided and done: the commit's outcome, or `rejected` or `expired`.
    Settled(crate::Envelope),
}

/// What an approval ticket asks of the person deciding a commit of `tool`.
pub fn approval_question(tool: &str) -> String {
    format!("Approve this commit of `{tool}`? It runs once approved.")
}

/// The id of the approval ticket of the commit keyed `commit_key`: `t_`
/// and a UUID made of a SHA-256 of the key, so every commit of one confirm
/// token waits on one ticket.
pub fn approval_ticket_id(commit_key: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("approval:{commit_key}").as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    format!(
        "t_{}",
        uuid::Builder::from_custom_bytes(bytes).into_uuid().simple()
    )
}

/// Accepts jobs and tickets.
pub trait Fleet: Send + Sync + 'static {
    /// Records and enqueues a job; answers its id. The same tenant, tool and
    /// idempotency key answer the same job; the same key with other arguments
    /// answers `conflict`.
    fn submit<'a>(&'a self, job: JobRequest) -> BoxFuture<'a, Result<String, ToolError>>;
    /// Records a ticket; answers its id.
    fn open_ticket<'a>(&'a self, ticket: TicketRequest)
    -> BoxFuture<'a, Result<String, ToolError>>;
    /// Records the approval ticket of a commit, or finds it recorded
    /// already (the same ticket id), and answers where it stands.
    fn request_approval<'a>(
        &'a self,
        approval: ApprovalRequest,
    ) -> BoxFuture<'a, Result<Approval, ToolError>>;
}

/// A runtime with no fleet: enqueued shapes answer `unavailable`.
pub struct NoFleet;

impl Fleet for NoFleet {
    fn request_approval<'a>(
        &'a self,
        approval: ApprovalRequest,
    ) -> BoxFuture<'a, Result<Approval, ToolError>> {
        Box::pin(async move {
            Err(ToolError::new(
                ErrorCode::Unavailable,
                format!(
                    "`{}` needs approval, which needs an inbox for tickets, and this runtime has none configured",
                    approval.tool
                ),
            )
            .retryable(false))
        })
    }

    fn submit<'a>(&'a self, job: JobRequest) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            Err(ToolError::new(
                ErrorCode::Unavailable,
                format!(
                    "`{}` runs on the fleet, and this runtime has none configured",
                    job.tool
                ),
            )
            .retryable(false))
        })
    }

    fn open_ticket<'a>(
        &'a self,
        ticket: TicketRequest,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            Err(ToolError::new(
                ErrorCode::Unavailable,
                format!(
                    "`{}` needs an inbox for tickets, and this runtime has none configured",
                    ticket.tool
                ),
            )
            .retryable(false))
        })
    }
}

/// A job as [`MemoryFleet`] keeps it.
#[derive(Debug, Clone)]
pub struct MemoryJob {
    /// The job id.
    pub id: String,
    /// The job as submitted.
    pub request: JobRequest,
    /// Where the job is in its life.
    pub state: JobState,
}

#[derive(Default)]
struct Tables {
    jobs: HashMap<String, MemoryJob>,
    /// (tenant, tool, idempotency key) -> job id
    keys: HashMap<(String, String, String), String>,
    tickets: Vec<(String, TicketRequest)>,
    /// Approvals by ticket id; none is ever decided in memory.
    approvals: HashMap<String, ApprovalRequest>,
}

/// Jobs and tickets in memory, with the idempotency rules of the contract.
#[derive(Default)]
pub struct MemoryFleet {
    tables: Mutex<Tables>,
}

impl MemoryFleet {
    /// The job `id`, if submitted.
    pub fn job(&self, id: &str) -> Option<MemoryJob> {
        self.lock().jobs.get(id).cloned()
    }

    /// Every job submitted, in no order.
    pub fn jobs(&self) -> Vec<MemoryJob> {
        self.lock().jobs.values().cloned().collect()
    }

    /// Every ticket opened, with its id, oldest first.
    pub fn tickets(&self) -> Vec<(String, TicketRequest)> {
        self.lock().tickets.clone()
    }

    /// The approval waiting on ticket `id`, if requested.
    pub fn approval(&self, id: &str) -> Option<ApprovalRequest> {
        self.lock().approvals.get(id).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Fleet for MemoryFleet {
    fn submit<'a>(&'a self, job: JobRequest) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let mut tables = self.lock();
            let key = job
                .ctx
                .idempotency_key
                .clone()
                .map(|k| (job.ctx.principal.tenant.clone(), job.tool.clone(), k));
            if let Some(existing) = key.as_ref().and_then(|k| tables.keys.get(k)) {
                let existing = &tables.jobs[existing];
                if canonical_json(&existing.request.args) != canonical_json(&job.args) {
                    return Err(ToolError::new(
                        ErrorCode::Conflict,
                        format!(
                            "idempotency_key was already used for a `{}` job with other arguments; use a new key for new work",
                            job.tool
                        ),
                    ));
                }
                return Ok(existing.id.clone());
            }
            let id = new_id();
            if let Some(key) = key {
                tables.keys.insert(key, id.clone());
            }
            tables.jobs.insert(
                id.clone(),
                MemoryJob {
                    id: id.clone(),
                    request: job,
                    state: JobState::Queued,
                },
            );
            Ok(id)
        })
    }

    fn open_ticket<'a>(
        &'a self,
        ticket: TicketRequest,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let id = format!("t_{}", uuid::Uuid::now_v7().simple());
            self.lock().tickets.push((id.clone(), ticket));
            Ok(id)
        })
    }

    fn request_approval<'a>(
        &'a self,
        approval: ApprovalRequest,
    ) -> BoxFuture<'a, Result<Approval, ToolError>> {
        Box::pin(async move {
            let id = approval.ticket.clone();
            self.lock().approvals.entry(id.clone()).or_insert(approval);
            Ok(Approval::Pending(id))
        })
    }
}
