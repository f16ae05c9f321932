//! The store: where jobs, tickets, audit records and command outcomes live.
//!
//! [`Store`] is the smallest surface the dispatcher and the workers need.
//! Every job transition is one of [`toolfleet_core::lifecycle`]'s, executed
//! as one conditional statement that names the states it moves from (taken
//! from the lifecycle's lists), so no caller can move a settled job; every operation of a
//! running job's holder names the attempt that holds it ([`LeaseRef`]), so
//! an attempt whose lease expired and whose job was claimed again, by
//! another worker or by the same one, can no longer heartbeat, report,
//! checkpoint, park or settle it. Every read a client can
//! reach is scoped to a tenant. Times are Unix milliseconds passed in by the
//! caller, so transitions are deterministic under test.
//!
//! The [`conformance`] suite is what every implementation must pass.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolfleet_core::lifecycle::Transition;
use toolfleet_core::tool::Lineage;
use toolfleet_core::{AnsweredBy, AuditRecord, Envelope, JobState, Json, ToolError, TraceContext};

pub mod conformance;
mod due;
mod grouped;
pub mod metered;
pub mod postgres;
mod rows;
pub mod runs;
pub mod sqlite;
mod view;

pub use due::{DueAfter, DueFrom, DueJobs, DuePage};
pub use runs::{
    Answerer, ListRuns, ListTickets, NewRun, RunFilter, RunInserted, RunPage, RunRecord, RunState,
    RunWait, SettleTicket, StaleRuns, TicketKind, TicketPage, TicketShown, UpdateRun, WaitFor,
};

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The same idempotency key was used with other arguments.
    Conflict(String),
    /// The backend is unreachable or failed; the operation may be retried.
    Unavailable(String),
    /// The schema is not one this program knows.
    Schema(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Conflict(m) => write!(f, "conflict: {m}"),
            StoreError::Unavailable(m) => write!(f, "store unavailable: {m}"),
            StoreError::Schema(m) => write!(f, "store schema: {m}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl toolfleet_core::group::GroupError for StoreError {
    fn unanswered(message: String) -> Self {
        StoreError::Unavailable(message)
    }
}

/// A job to record, as the dispatcher accepted it.
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    /// UUIDv7.
    pub id: String,
    /// The caller's tenant; the job is scoped to it.
    pub tenant: String,
    /// The user of the tenant who made the job: its owner.
    pub user: String,
    /// The job tool called.
    pub tool: String,
    /// The worker pool that runs it.
    pub pool: String,
    /// The call's validated arguments, which the tool runs with.
    pub args: Value,
    /// With tenant and tool: a second job with the same key is the same job.
    pub idempotency_key: Option<String>,
    /// The agent run the call belongs to.
    pub run_id: String,
    /// The call that made the job.
    pub call_id: String,
    /// Where to announce the settled job, if the call named one.
    pub callback_url: Option<String>,
    /// Where the call that made the job stands among agents: set when a
    /// sub-agent's loop made it. The worker hands it to the executor.
    pub lineage: Option<Lineage>,
    /// The scopes of the caller: the worker runs the job with them.
    pub scopes: Vec<String>,
    /// The trace context of the dispatcher's span that enqueued the job:
    /// the worker's span of each attempt is its child. Republished with it.
    pub trace: Option<TraceContext>,
    /// How many attempts a retryable failure gets, the first included.
    pub max_attempts: u32,
    /// Wall-time budget of one attempt.
    pub timeout_ms: i64,
    /// When the job was accepted, in Unix milliseconds: it is due from then
    /// unless `run_at` says later.
    pub now: i64,
    /// When the job may start, in Unix milliseconds (the call's `run_at` or
    /// `delay_s`): later than `now`, the job is recorded `scheduled`
    /// ([`Transition::Schedule`]) and no claim takes it before then; else it
    /// is `queued` and due at once.
    pub run_at: Option<i64>,
    /// The job's priority in an ordered pool, whose workers claim the
    /// highest first ([`Store::claim_next`]); `None` in other pools.
    pub priority: Option<i16>,
    /// The key the job counts under for its tool's concurrency limit:
    /// [`Store::claim_next`] takes it only while fewer than
    /// `concurrency_limit` jobs of the key run.
    pub concurrency_key: Option<String>,
    /// The most jobs of `concurrency_key` running at once.
    pub concurrency_limit: Option<u32>,
    /// The job's turn in a fair pool ([`Store::fair_turn`]): within a
    /// priority, [`Store::claim_next`] takes the lowest turn first. 0 in
    /// other pools.
    pub fair_rank: i64,
    /// The dispatcher that publishes the job's first message: a process
    /// that answers `running` before that publish is confirmed names itself
    /// here and beats ([`Store::beat_dispatcher`]), so that another finds
    /// its unpublished jobs once it falls silent ([`Store::queued_from`]).
    pub origin: Option<String>,
}

/// [`Store::queue_stats`]'s statement, in both stores' SQL: `tenant` and
/// `since` as the store writes placeholders 1 and 2.
pub(crate) fn queue_stats_sql(tenant: &str, since: &str) -> String {
    use toolfleet_core::lifecycle::sql_list;
    let waiting: Vec<JobState> = JobState::ALL
        .into_iter()
        .filter(|s| !s.is_settled())
        .collect();
    format!(
        "SELECT pool, state, count(*) AS n, min(run_at) AS earliest, CAST(NULL AS BIGINT) AS minute, \
         0 AS waited, CAST(0 AS BIGINT) AS wait_total, CAST(NULL AS BIGINT) AS wait_max FROM jobs \
         WHERE tenant = {tenant} AND state IN {waiting} GROUP BY pool, state \
         UNION ALL \
         SELECT pool, state, count(*), NULL, (updated_at / 60000) * 60000, count(started_at), \
         CAST(COALESCE(sum(started_at - run_at), 0) AS BIGINT), max(started_at - run_at) FROM jobs \
         WHERE tenant = {tenant} AND state IN {settled} AND updated_at >= {since} \
         GROUP BY pool, state, (updated_at / 60000) * 60000",
        waiting = sql_list(&waiting),
        settled = sql_list(&JobState::SETTLED),
    )
}

/// The states of the partial index `jobs_tenant_state`: those the path of
/// every job never passes through, so it costs that path nothing.
const LISTED_APART: [JobState; 2] = [JobState::Failed, JobState::Cancelled];

/// The job list of a tenant in `states` (one shown state: one or two
/// stored ones), newest first, each state read off its own index (a page
/// at most) and merged. Failed and cancelled jobs are read off the partial
/// `jobs_tenant_state` (the statement names its condition, so that SQLite
/// sees it holds); the states a job passes through (queued, scheduled,
/// running, retrying, parked) are few at any time and read by state; a
/// succeeded job is most jobs, read off the tenant's jobs newest first.
/// `source(state)` is what each state's part reads `FROM`: `jobs` with
/// the store's index hint, or the store's join that walks the tenant's
/// jobs newest first. The parameters:
/// 1 tenant, 2 tool (or null), 3 the ceiling of ids, 4 the rows to fetch,
/// 5 the floor of ids, 6 the user (when `user` names its column).
/// `param(n)` writes placeholder `n` as the store's SQL does.
pub(crate) fn list_in_states(
    states: &[JobState],
    param: impl Fn(u8) -> String,
    source: impl Fn(JobState) -> &'static str,
    user: Option<&str>,
    columns: &str,
) -> String {
    let (tenant, tool, cursor, rows, floor) = (param(1), param(2), param(3), param(4), param(5));
    let owned = user.map_or_else(String::new, |column| format!("AND {column} = {}", param(6)));
    let apart = toolfleet_core::lifecycle::sql_list(&LISTED_APART);
    let one = |state: &JobState| {
        let source = source(*state);
        let term = if LISTED_APART.contains(state) {
            format!("AND state IN {apart}")
        } else {
            String::new()
        };
        format!(
            "SELECT {columns} FROM {source} WHERE tenant = {tenant} AND state = '{state}' {term} \
             AND id < {cursor} AND id >= {floor} AND ({tool} IS NULL OR tool = {tool}) {owned} \
             ORDER BY id DESC LIMIT {rows}"
        )
    };
    match states {
        [state] => one(state),
        many => {
            let parts: Vec<String> = many
                .iter()
                .enumerate()
                .map(|(n, state)| format!("SELECT * FROM ({}) AS part{n}", one(state)))
                .collect();
            format!(
                "{} ORDER BY id DESC LIMIT {rows}",
                parts.join(" UNION ALL ")
            )
        }
    }
}

/// The states `dead_letter` fails a job from without looking at a lease:
/// those of [`Transition::DeadLetter`] but running.
pub(crate) fn unheld_states() -> &'static [JobState] {
    let from = toolfleet_core::lifecycle::Transition::DeadLetter.from();
    debug_assert_eq!(from.last(), Some(&JobState::Running));
    &from[..from.len() - 1]
}

/// What `requeue` sets, in both stores' SQL: the job due at `now` (a
/// placeholder), its attempts anew, its last life's outcome and lease gone.
pub(crate) fn requeued(now: &str) -> String {
    format!(
        "state = '{to}', attempts = 0, requeues = requeues + 1, run_at = {now},
            lease_owner = NULL, lease_until = NULL, progress = NULL, result = NULL,
            error = NULL, checkpoint = NULL, waiting_on = NULL, updated_at = {now},
            started_at = NULL, attempts_log = NULL",
        to = Transition::Requeue.to()
    )
}

impl TakeToken<'_> {
    /// The interval between tokens and the tolerance of the algorithm (how
    /// far ahead of now a bucket's arrival time may be), in its unit.
    pub fn terms(&self) -> (i64, i64) {
        let interval = self.interval.max(1);
        let tolerance = interval.saturating_mul(i64::from(self.burst.max(1) - 1));
        (interval, tolerance)
    }

    /// How long a bucket whose arrival time is `tat` makes a refused call
    /// wait, in its unit (at least 1).
    pub fn wait(&self, tat: i64) -> i64 {
        let (_, tolerance) = self.terms();
        (tat.max(self.now) - self.now - tolerance).max(1)
    }
}

impl NewJob {
    /// The state the job is recorded in and when it is due: `scheduled` at
    /// its `run_at` when that is later than `now`, else `queued` at `now`.
    pub fn start(&self) -> (JobState, i64) {
        match self.run_at {
            Some(at) if at > self.now => (Transition::Schedule.to(), at),
            _ => (Transition::Enqueue.to(), self.now),
        }
    }

    /// The record the store keeps of this job once inserted: what a backend
    /// answers for a job it created, without reading the row back.
    pub(crate) fn created(self) -> JobRecord {
        let (state, run_at) = self.start();
        JobRecord {
            id: self.id,
            tenant: self.tenant,
            user: self.user,
            tool: self.tool,
            pool: self.pool,
            args: self.args,
            state,
            attempts: 0,
            max_attempts: self.max_attempts,
            timeout_ms: self.timeout_ms,
            run_at,
            lease_owner: None,
            lease_until: None,
            progress: None,
            result: None,
            error: None,
            idempotency_key: self.idempotency_key,
            run_id: self.run_id,
            call_id: self.call_id,
            callback_url: self.callback_url,
            lineage: self.lineage,
            scopes: self.scopes,
            trace: self.trace,
            requeues: 0,
            priority: self.priority,
            concurrency_key: self.concurrency_key,
            concurrency_limit: self.concurrency_limit,
            fair_rank: self.fair_rank,
            started_at: None,
            attempts_log: None,
            created_at: self.now,
            updated_at: self.now,
        }
    }
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// The [`NewJob::id`] it was made with.
    pub id: String,
    /// The [`NewJob::tenant`] it was made with.
    pub tenant: String,
    /// The [`NewJob::user`] it was made with.
    pub user: String,
    /// The [`NewJob::tool`] it was made with.
    pub tool: String,
    /// The [`NewJob::pool`] it was made with.
    pub pool: String,
    /// The [`NewJob::args`] it was made with.
    pub args: Value,
    /// Where the job stands, as stored: a parked job is `parked` here
    /// ([`JobState::shown`] makes it `retrying`).
    pub state: JobState,
    /// Attempts started so far.
    pub attempts: u32,
    /// The [`NewJob::max_attempts`] it was made with.
    pub max_attempts: u32,
    /// The [`NewJob::timeout_ms`] it was made with.
    pub timeout_ms: i64,
    /// Not before this time (retries wait here); for a job running, when it
    /// became runnable for its attempt: inserted, due again, woken, or, for
    /// one taken over after its lease expired, when that lease ended.
    pub run_at: i64,
    /// The worker whose attempt holds the job while it runs; `None` otherwise.
    pub lease_owner: Option<String>,
    /// When the lease of the running job ends, in Unix milliseconds; `None`
    /// when not leased.
    pub lease_until: Option<i64>,
    /// The progress the tool last reported ([`Store::set_progress`]).
    pub progress: Option<Value>,
    /// The tool's result, once the job succeeded.
    pub result: Option<Json>,
    /// The last error; for a failed job, the final one.
    pub error: Option<ToolError>,
    /// The [`NewJob::idempotency_key`] it was made with.
    pub idempotency_key: Option<String>,
    /// The [`NewJob::run_id`] it was made with.
    pub run_id: String,
    /// The [`NewJob::call_id`] it was made with.
    pub call_id: String,
    /// The [`NewJob::callback_url`] it was made with.
    pub callback_url: Option<String>,
    /// The [`NewJob::lineage`] it was made with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<Lineage>,
    /// The [`NewJob::scopes`] it was made with.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// The [`NewJob::trace`] it was made with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceContext>,
    /// How often a person put the job back after it failed or was
    /// cancelled ([`Store::requeue`]): each time starts a life of its own,
    /// with its own notices.
    #[serde(default)]
    pub requeues: u32,
    /// The [`NewJob::priority`] it was made with.
    #[serde(default)]
    pub priority: Option<i16>,
    /// The [`NewJob::concurrency_key`] it was made with.
    #[serde(default)]
    pub concurrency_key: Option<String>,
    /// The [`NewJob::concurrency_limit`] it was made with.
    #[serde(default)]
    pub concurrency_limit: Option<u32>,
    /// The [`NewJob::fair_rank`] it was made with.
    #[serde(default)]
    pub fair_rank: i64,
    /// When the running (or last) attempt was claimed, in Unix
    /// milliseconds; `None` before the first claim.
    #[serde(default)]
    pub started_at: Option<i64>,
    /// The attempts that failed, oldest first: each `{attempt,
    /// started_at, ended_at, error}`; `None` while none has.
    #[serde(default)]
    pub attempts_log: Option<Value>,
    /// When the job was recorded, in Unix milliseconds.
    pub created_at: i64,
    /// When the job was last written (a transition, heartbeat, progress or
    /// checkpoint), in Unix milliseconds.
    pub updated_at: i64,
}

/// What [`Store::insert_job`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Inserted {
    /// No such job existed: this call recorded it.
    Created(JobRecord),
    /// A job with the same tenant, tool, key and arguments already existed.
    Existing(JobRecord),
}

impl Inserted {
    /// The job, created or existing.
    pub fn job(&self) -> &JobRecord {
        match self {
            Inserted::Created(job) | Inserted::Existing(job) => job,
        }
    }
}

/// Filters of the job list.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobFilter {
    /// A state as the contract shows it: `retrying` finds parked jobs too
    /// ([`JobState::stored_as`]).
    pub state: Option<JobState>,
    /// Only the jobs of this tool.
    pub tool: Option<String>,
    /// Only the jobs this user of the tenant made (a caller's own list).
    pub user: Option<String>,
    /// Only the jobs made at or after this time (Unix milliseconds).
    pub made_since: Option<i64>,
    /// Only the jobs made before this time (Unix milliseconds).
    pub made_before: Option<i64>,
}

impl JobFilter {
    /// The ids of the jobs made within the filter's times, as bounds of
    /// ids: `(floor, ceiling)`, the list taking `floor <= id < ceiling`
    /// (a job's id, a UUIDv7, begins with the millisecond it was made, so
    /// the tenant's jobs newest first are also its jobs by time). `cursor`
    /// lowers the ceiling.
    pub(crate) fn id_bounds(&self, cursor: &str) -> (String, String) {
        let floor = self.made_since.map(id_at).unwrap_or_default();
        let ceiling = match self.made_before.map(id_at) {
            Some(before) if before.as_str() < cursor => before,
            _ => cursor.to_owned(),
        };
        (floor, ceiling)
    }
}

/// The smallest id of a job made at `ms`: its UUIDv7 text with every bit
/// after the time zero.
fn id_at(ms: i64) -> String {
    let ms = u64::try_from(ms).unwrap_or(0).min((1 << 48) - 1);
    let hex = format!("{ms:012x}");
    format!("{}-{}-0000-0000-000000000000", &hex[..8], &hex[8..])
}

/// One page of the job list, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct JobPage {
    /// The jobs of the page, newest first.
    pub jobs: Vec<JobRecord>,
    /// Pass back to get the next page; absent on the last.
    pub next_cursor: Option<String>,
}

/// What a heartbeat found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// Extended: this attempt still holds the job.
    Held,
    /// The job was cancelled: stop the executor.
    Cancelled,
    /// Another attempt holds it (another worker's, or a newer one of the
    /// same worker), or it settled: stop, settle nothing.
    Lost,
}

/// The attempt that holds a running job: the worker that claimed it and
/// the attempt its claim started (the [`JobRecord::attempts`] the claim
/// answered). Every operation of a job's holder names it, and the store
/// applies it only while the job runs under that same lease owner and
/// attempt: once a lease expired and the job was claimed again, even by
/// the same worker, the older attempt changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseRef {
    /// The running job.
    pub job_id: String,
    /// The worker that claimed it: the job's [`JobRecord::lease_owner`].
    pub worker: String,
    /// The attempt its claim started.
    pub attempt: u32,
}

impl JobRecord {
    /// The attempt that holds this job now: `Some` for a running job with a
    /// lease owner (what [`Store::claim`] answers).
    pub fn lease_ref(&self) -> Option<LeaseRef> {
        let worker = self
            .lease_owner
            .as_ref()
            .filter(|_| self.state == JobState::Running)?;
        Some(LeaseRef {
            job_id: self.id.clone(),
            worker: worker.clone(),
            attempt: self.attempts,
        })
    }
}

/// What [`Store::heartbeat`] takes: extend `lease` to `now + lease_ms`.
#[derive(Debug, Clone, Copy)]
pub struct Heartbeat<'a> {
    /// The attempt that holds the job.
    pub lease: &'a LeaseRef,
    /// When the worker beats, in Unix milliseconds.
    pub now: i64,
    /// How long the lease holds from `now`, in milliseconds.
    pub lease_ms: i64,
}

/// What [`Store::set_progress`] takes.
#[derive(Debug, Clone, Copy)]
pub struct SetProgress<'a> {
    /// The attempt that holds the job.
    pub lease: &'a LeaseRef,
    /// The progress the tool reported.
    pub progress: &'a Value,
    /// When it was reported, in Unix milliseconds.
    pub now: i64,
}

/// What [`Store::save_checkpoint`] takes.
#[derive(Debug, Clone, Copy)]
pub struct SaveCheckpoint<'a> {
    /// The attempt that holds the job.
    pub lease: &'a LeaseRef,
    /// The agent loop's state to save.
    pub checkpoint: &'a Value,
    /// When it is saved, in Unix milliseconds.
    pub now: i64,
}

/// What [`Store::park`] takes: park the job of `lease` on `ticket`.
#[derive(Debug, Clone, Copy)]
pub struct Park<'a> {
    /// The attempt that holds the job.
    pub lease: &'a LeaseRef,
    /// The id of the ticket the job waits on.
    pub ticket: &'a str,
    /// When the job is parked, in Unix milliseconds.
    pub now: i64,
}

/// What [`Store::defer`] takes.
#[derive(Debug, Clone, Copy)]
pub struct Defer<'a> {
    /// The attempt that holds the job.
    pub lease: &'a LeaseRef,
    /// When the job is due again, in Unix milliseconds.
    pub until: i64,
    /// When it is deferred, in Unix milliseconds.
    pub now: i64,
}

/// What [`Store::succeed`] takes.
#[derive(Debug, Clone, Copy)]
pub struct Succeed<'a> {
    /// The attempt that holds the job.
    pub lease: &'a LeaseRef,
    /// The tool's result.
    pub result: &'a Json,
    /// When the job succeeded, in Unix milliseconds.
    pub now: i64,
    /// The record this attempt's claim answered, where the caller holds
    /// it: a store may build its answer from it and read back only what
    /// can change under a lease (both stores do, so a job's arguments are
    /// not sent back). One of another job or attempt is not used.
    pub claimed: Option<&'a JobRecord>,
}

/// What [`Store::fail`] takes: `retry_at` when the lifecycle decided to
/// retry ([`toolfleet_core::lifecycle::after_failure`]), `None` to fail.
#[derive(Debug, Clone, Copy)]
pub struct Fail<'a> {
    /// The attempt that holds the job.
    pub lease: &'a LeaseRef,
    /// The error the attempt failed with.
    pub error: &'a ToolError,
    /// When the job is due again, in Unix milliseconds; `None` to fail it.
    pub retry_at: Option<i64>,
    /// When the attempt failed, in Unix milliseconds.
    pub now: i64,
}

/// A question for a person.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTicket {
    /// `t_` and a UUIDv7, as the dispatcher makes it.
    pub id: String,
    /// The caller's tenant; the ticket is scoped to it.
    pub tenant: String,
    /// The user of the tenant who opened the ticket: its owner.
    pub user: String,
    /// The human tool called.
    pub tool: String,
    /// What the person is asked.
    pub question: String,
    /// The answers the person may choose from; empty for a free answer.
    pub options: Vec<String>,
    /// The call's validated arguments.
    pub args: Value,
    /// The agent run the call belongs to.
    pub run_id: String,
    /// The call that opened the ticket.
    pub call_id: String,
    /// Where to announce the answer, if the call named one.
    pub callback_url: Option<String>,
    /// Who may answer it beside the tenant's operators.
    pub answered_by: AnsweredBy,
    /// A question, or an approval of a command's commit.
    pub kind: TicketKind,
    /// An approval's plan: what the command's dry run answered.
    pub plan: Option<Value>,
    /// The scopes of the caller who opened it: an approved commit runs with them.
    pub scopes: Vec<String>,
    /// When it expires unanswered, in Unix milliseconds; `None`: never.
    pub expires_at: Option<i64>,
    /// An input ticket's requests by key (a JSON object); `None` for the
    /// other kinds.
    pub input_requests: Option<Value>,
    /// When the ticket was opened, in Unix milliseconds.
    pub now: i64,
}

/// A ticket as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TicketRecord {
    /// The [`NewTicket::id`] it was made with.
    pub id: String,
    /// The [`NewTicket::tenant`] it was made with.
    pub tenant: String,
    /// The [`NewTicket::user`] it was made with.
    pub user: String,
    /// The [`NewTicket::tool`] it was made with.
    pub tool: String,
    /// The [`NewTicket::question`] it was made with.
    pub question: String,
    /// The [`NewTicket::options`] it was made with.
    pub options: Vec<String>,
    /// The [`NewTicket::args`] it was made with.
    pub args: Value,
    /// The [`NewTicket::run_id`] it was made with.
    pub run_id: String,
    /// The [`NewTicket::call_id`] it was made with.
    pub call_id: String,
    /// The [`NewTicket::callback_url`] it was made with.
    pub callback_url: Option<String>,
    /// `None` while open.
    pub answer: Option<Value>,
    /// Who may answer it beside the tenant's operators.
    #[serde(default)]
    pub answered_by: AnsweredBy,
    /// The [`NewTicket::kind`] it was made with.
    #[serde(default)]
    pub kind: TicketKind,
    /// The [`NewTicket::plan`] it was made with.
    #[serde(default)]
    pub plan: Option<Value>,
    /// The [`NewTicket::scopes`] it was made with.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// The [`NewTicket::expires_at`] it was made with.
    #[serde(default)]
    pub expires_at: Option<i64>,
    /// When it expired unanswered ([`Store::expire_tickets`]); `None` otherwise.
    #[serde(default)]
    pub expired_at: Option<i64>,
    /// What it came to ([`Store::settle_ticket`]): an approval's commit,
    /// its rejection, an expiry; `None` until then.
    #[serde(default)]
    pub outcome: Option<Envelope>,
    /// The [`NewTicket::input_requests`] it was made with.
    #[serde(default)]
    pub input_requests: Option<Value>,
    /// An input ticket's answers recorded so far, by key
    /// ([`Store::respond_ticket`]); `None` before the first. Once every
    /// request is answered, [`TicketRecord::answer`] holds them all.
    #[serde(default)]
    pub input_responses: Option<Value>,
    /// When the ticket was opened, in Unix milliseconds.
    pub created_at: i64,
    /// When it was answered, in Unix milliseconds; `None` while open.
    pub answered_at: Option<i64>,
}

impl TicketRecord {
    /// Neither answered nor expired.
    pub fn is_open(&self) -> bool {
        self.answer.is_none() && self.expired_at.is_none()
    }

    /// An open input ticket's requests not answered yet, by key (empty for
    /// any other ticket).
    pub fn pending_inputs(&self) -> serde_json::Map<String, Value> {
        let (Some(Value::Object(requests)), true) = (&self.input_requests, self.is_open()) else {
            return serde_json::Map::new();
        };
        let answered = self.input_responses.as_ref().and_then(Value::as_object);
        requests
            .iter()
            .filter(|(key, _)| !answered.is_some_and(|a| a.contains_key(*key)))
            .map(|(key, request)| (key.clone(), request.clone()))
            .collect()
    }
}

/// What [`Store::respond_ticket`] takes: answers to some of the requests of
/// `tenant`'s input ticket `id`, by key, at `now`.
#[derive(Debug, Clone, Copy)]
pub struct RespondTicket<'a> {
    /// The tenant the ticket must belong to.
    pub tenant: &'a str,
    /// The input ticket answered.
    pub id: &'a str,
    /// Answers by key; a key the ticket does not ask, or answered before,
    /// is left out (the first answer to each key stands).
    pub responses: &'a serde_json::Map<String, Value>,
    /// When they were given, in Unix milliseconds.
    pub now: i64,
}

/// What [`Store::respond_ticket`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Responded {
    /// This call answered the ticket's last pending request: the ticket is
    /// answered, its `answer` every response by key.
    Answered(TicketRecord),
    /// The ticket as it now stands: still open with requests pending, or
    /// answered, expired or not an input ticket, untouched.
    Recorded(TicketRecord),
}

impl Responded {
    /// What writing answers that are `complete` (or not) made of `ticket`.
    pub(crate) fn written(ticket: TicketRecord, complete: bool) -> Responded {
        if complete {
            Responded::Answered(ticket)
        } else {
            Responded::Recorded(ticket)
        }
    }
}

/// Compare-and-set passes of [`Store::respond_ticket`] before it gives up.
pub(crate) const RESPOND_TRIES: usize = 16;

/// Why [`Store::respond_ticket`] gave up on ticket `id`.
pub(crate) fn respond_conflict(id: &str) -> StoreError {
    StoreError::Conflict(format!(
        "ticket {id} kept changing while its answers were recorded; try again"
    ))
}

/// What [`Store::respond_ticket`] does with the ticket it read.
pub(crate) enum RespondStep {
    /// Nothing to write: it is no input ticket, or `given` adds nothing.
    Stands(Box<TicketRecord>),
    /// Write `answers` (all of them when `complete`), if the ticket still
    /// holds the `had` answers it was read with (answers are only ever
    /// added, so their count names them).
    Write {
        answers: serde_json::Map<String, Value>,
        complete: bool,
        had: i64,
    },
}

/// How `given` answers `ticket`, as read: backends loop on it, reading
/// again when their compare-and-set finds the ticket changed.
pub(crate) fn respond_step(
    ticket: TicketRecord,
    given: &serde_json::Map<String, Value>,
) -> RespondStep {
    if ticket.kind != TicketKind::Input {
        return RespondStep::Stands(Box::new(ticket));
    }
    let Some((answers, complete)) = merge_responses(&ticket, given) else {
        return RespondStep::Stands(Box::new(ticket));
    };
    let had = ticket
        .input_responses
        .as_ref()
        .and_then(Value::as_object)
        .map_or(0, |had| i64::try_from(had.len()).unwrap_or(i64::MAX));
    RespondStep::Write {
        answers,
        complete,
        had,
    }
}

/// The answers of `ticket` once `given` joins those it has, and whether
/// they then answer every request: `None` when `given` adds nothing (no
/// key it asks and has not answered).
fn merge_responses(
    ticket: &TicketRecord,
    given: &serde_json::Map<String, Value>,
) -> Option<(serde_json::Map<String, Value>, bool)> {
    let pending = ticket.pending_inputs();
    let mut merged = match &ticket.input_responses {
        Some(Value::Object(had)) => had.clone(),
        _ => serde_json::Map::new(),
    };
    let mut added = false;
    for (key, response) in given {
        if pending.contains_key(key) {
            merged.insert(key.clone(), response.clone());
            added = true;
        }
    }
    added.then(|| {
        let complete = pending.keys().all(|key| merged.contains_key(key));
        (merged, complete)
    })
}

/// What [`Store::answer_ticket`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Answered {
    /// This call answered it.
    Now(TicketRecord),
    /// It had been answered before; the record holds the first answer.
    Already(TicketRecord),
}

/// What [`Store::claim_commit`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum CommitClaim {
    /// Nobody committed this key: run the command, then settle.
    Run,
    /// Committed before: answer this.
    Settled(Envelope),
    /// Another commit of this key holds it until its lease ends.
    Pending,
    /// Claimed, and still pending past its lease: its claimant stopped
    /// before recording an outcome. Answered to claims that do not take
    /// such a claim over ([`ClaimCommit::take_over`]).
    Abandoned,
}

/// What [`Store::claim_commit`] takes.
#[derive(Debug, Clone, Copy)]
pub struct ClaimCommit<'a> {
    /// The key the commit is recorded under (a confirm token's).
    pub key: &'a str,
    /// When the claim is made, in Unix milliseconds.
    pub now: i64,
    /// The claim holds until `now + lease_ms`.
    pub lease_ms: i64,
    /// Until when the key's record is kept, pending or settled: past it, it
    /// is pruned (kept at least as long as the claim holds).
    pub keep_until: i64,
    /// What becomes of a claim left pending past its lease: taken over by
    /// this one (`true`: work that is safe to repeat, a webhook's notice),
    /// or answered [`CommitClaim::Abandoned`], so the work never runs again
    /// (`false`: a command's commit).
    pub take_over: bool,
}

/// What [`Store::list_jobs`] takes: a page of `tenant`'s jobs.
#[derive(Debug, Clone, Copy)]
pub struct ListJobs<'a> {
    /// The tenant whose jobs are listed.
    pub tenant: &'a str,
    /// Which of its jobs.
    pub filter: &'a JobFilter,
    /// The most jobs on the page (bounded by the store).
    pub limit: u32,
    /// The `next_cursor` of the page before.
    pub cursor: Option<&'a str>,
}

/// What [`Store::claim`] takes: `worker` claims job `id` at `now` for
/// `lease_ms`.
#[derive(Debug, Clone, Copy)]
pub struct ClaimJob<'a> {
    /// The job to claim.
    pub id: &'a str,
    /// The worker claiming it: the lease owner if the claim wins.
    pub worker: &'a str,
    /// When the claim is made, in Unix milliseconds.
    pub now: i64,
    /// How long the lease holds from `now`, in milliseconds.
    pub lease_ms: i64,
}

/// What [`Store::claim_next`] takes: `worker` claims the next job of the
/// ordered pool `pool` at `now` for `lease_ms`.
#[derive(Debug, Clone, Copy)]
pub struct ClaimNext<'a> {
    /// The ordered pool.
    pub pool: &'a str,
    /// The worker claiming: the lease owner if the claim wins.
    pub worker: &'a str,
    /// When the claim is made, in Unix milliseconds.
    pub now: i64,
    /// How long the lease holds from `now`, in milliseconds.
    pub lease_ms: i64,
}

/// What [`Store::cancel`] takes: `tenant`'s job `id`, cancelled at `now`.
#[derive(Debug, Clone, Copy)]
pub struct CancelJob<'a> {
    /// The tenant the job must belong to.
    pub tenant: &'a str,
    /// The job to cancel.
    pub id: &'a str,
    /// When it is cancelled, in Unix milliseconds.
    pub now: i64,
}

/// One row of [`Store::queue_stats`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRow {
    /// The pool.
    pub pool: String,
    /// The stored state counted.
    pub state: JobState,
    /// How many jobs.
    pub count: u64,
    /// Of jobs not settled: the earliest `run_at` among them.
    pub earliest: Option<i64>,
    /// Of settled jobs: the minute they settled in (Unix milliseconds at
    /// its start).
    pub minute: Option<i64>,
    /// Of settled jobs: how many had started, and their waits from due to
    /// their last attempt's start, in all and the longest (milliseconds).
    pub waited: u64,
    /// The sum of those waits.
    pub wait_total_ms: i64,
    /// The longest of them.
    pub wait_max_ms: Option<i64>,
}

/// What [`Store::dead_letter`] fails: a job of any tenant (the broker's
/// dead letters name ids, not principals).
#[derive(Debug, Clone, Copy)]
pub struct DeadLetter<'a> {
    /// The job whose message the broker dead-lettered.
    pub id: &'a str,
    /// Its final error (`dead_lettered`).
    pub error: &'a ToolError,
    /// When, in Unix milliseconds; a running job's lease must have ended
    /// before it.
    pub now: i64,
    /// When the broker dead-lettered the message, if it says: a job
    /// written since (put back by a retry, claimed again) is left as it is,
    /// the letter being of an earlier life.
    pub died_at: Option<i64>,
}

/// What [`Store::take_token`] takes: a token of the bucket `key`, which
/// gains one every `interval` and holds at most `burst`. Times are in one
/// unit the caller keeps for every take of a bucket (toolfleet's buckets
/// count Unix microseconds, so rates above 1,000 a second hold).
#[derive(Debug, Clone, Copy)]
pub struct TakeToken<'a> {
    /// The bucket: one per tenant and tool.
    pub key: &'a str,
    /// When, as a time since the Unix epoch in the caller's unit.
    pub now: i64,
    /// How often a token is added, in the same unit (at least 1).
    pub interval: i64,
    /// The most tokens the bucket holds: the largest burst (at least 1).
    pub burst: u32,
}

/// What [`Store::requeue`] takes: `tenant`'s job `id`, put back at `now`.
#[derive(Debug, Clone, Copy)]
pub struct Requeue<'a> {
    /// The tenant the job must belong to.
    pub tenant: &'a str,
    /// The job to put back.
    pub id: &'a str,
    /// When, in Unix milliseconds: the job is due then.
    pub now: i64,
}

/// What [`Store::requeue_many`] takes: the failed or cancelled jobs of one
/// tenant that a filter names.
#[derive(Debug, Clone, Copy)]
pub struct RequeueMany<'a> {
    /// The tenant the jobs belong to.
    pub tenant: &'a str,
    /// Only this user's jobs; `None`: every user's.
    pub user: Option<&'a str>,
    /// Only this tool's jobs.
    pub tool: Option<&'a str>,
    /// The states to put back, of [`Transition::Requeue`]'s (others are
    /// never moved).
    pub states: &'a [JobState],
    /// Only jobs whose error has this code.
    pub error_code: Option<&'a str>,
    /// Only jobs settled at or after this Unix millisecond...
    pub since: i64,
    /// ...and before this one.
    pub until: i64,
    /// The most one call puts back (bounded by the store).
    pub limit: u32,
    /// When, in Unix milliseconds.
    pub now: i64,
}

/// Where a schedule's ticks have got to, as [`Store::schedules`] reads it.
/// A schedule's record is made the first time a dispatcher sees it (or
/// when it is paused first), and its ticks count from then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleRecord {
    /// The schedule's name, as `[[schedules]]` gives it.
    pub name: String,
    /// The last tick handled (a job started, or the tick skipped), in Unix
    /// milliseconds; the next tick is the first after it.
    pub last_tick: i64,
    /// The job the last tick that started one started.
    pub last_job: Option<String>,
    /// True while the schedule is paused: no tick starts a job.
    pub paused: bool,
    /// When the record last changed, in Unix milliseconds.
    pub updated_at: i64,
}

/// What [`Store::advance_schedule`] takes: the schedule `name` moves from
/// the tick `from` to the tick `to`, having started `job` (or skipped).
#[derive(Debug, Clone, Copy)]
pub struct AdvanceSchedule<'a> {
    /// The schedule.
    pub name: &'a str,
    /// The last tick the caller read; `None`: the caller saw no record, and
    /// one is made with `to` as its last tick.
    pub from: Option<i64>,
    /// The tick handled, in Unix milliseconds.
    pub to: i64,
    /// The job the tick started; `None` keeps the last one named.
    pub job: Option<&'a str>,
    /// When, in Unix milliseconds.
    pub now: i64,
}

/// A dispatcher [`Store::silent_dispatchers`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SilentDispatcher {
    /// The origin its jobs name.
    pub origin: String,
    /// When it last beat, in Unix milliseconds.
    pub seen_at: i64,
}

/// The kinds of record [`Store::prune`] deletes once their retention ran
/// out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Retained {
    /// Settled jobs (succeeded, failed, cancelled), by when they settled.
    Jobs,
    /// Answered or expired tickets, by when they were.
    Tickets,
    /// Runs that stopped (answered, failed, out of budget, cancelled), by
    /// their last write.
    Runs,
    /// Audit records, by when the call was made.
    Audit,
}

impl Retained {
    /// Every kind.
    pub const ALL: [Retained; 4] = [
        Retained::Jobs,
        Retained::Tickets,
        Retained::Runs,
        Retained::Audit,
    ];

    /// Its name, as `[retention]` and the logs say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Retained::Jobs => "jobs",
            Retained::Tickets => "tickets",
            Retained::Runs => "runs",
            Retained::Audit => "audit",
        }
    }
}

/// A large result kept for the caller that made it ([`Store::put_handle`]).
#[derive(Debug, Clone, Copy)]
pub struct NewHandle<'a> {
    /// Its id (`h_` and a UUIDv7, so ids sort by creation).
    pub id: &'a str,
    /// The tenant and user it was made for, who alone read it.
    pub tenant: &'a str,
    /// The user it was made for.
    pub user: &'a str,
    /// The tool whose result it is.
    pub tool: &'a str,
    /// The result's JSON text, already redacted as its tool declares.
    pub value: &'a str,
    /// When it was made, Unix milliseconds.
    pub now: i64,
    /// When it stops being readable, Unix milliseconds.
    pub expires_at: i64,
    /// The tenant keeps at most this many handles: its oldest go first.
    pub max_per_tenant: u32,
    /// The tenant keeps at most this many bytes of handles: its oldest go first.
    pub max_bytes_per_tenant: i64,
}

/// What is known of a kept handle, without its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandleInfo {
    /// Its id.
    pub id: String,
    /// The tool whose result it is.
    pub tool: String,
    /// The size of its JSON text in bytes.
    pub size_bytes: i64,
    /// When it was made, Unix milliseconds.
    pub created_at: i64,
    /// When it stops being readable, Unix milliseconds.
    pub expires_at: i64,
}

/// A kept handle and its value ([`Store::handle`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandleRecord {
    /// What is known of it.
    pub info: HandleInfo,
    /// The result's JSON text.
    pub value: String,
}

/// Whose handles [`Store::handle`] and [`Store::list_handles`] read.
#[derive(Debug, Clone, Copy)]
pub struct HandleOwner<'a> {
    /// The tenant.
    pub tenant: &'a str,
    /// The user.
    pub user: &'a str,
    /// Now, Unix milliseconds: what expired by then is not read.
    pub now: i64,
}

/// The most handles one [`Store::list_handles`] answers.
pub const MAX_HANDLE_LIST: u32 = 100;

/// The most records one [`Store::prune`] deletes, in either store: one
/// statement stays short.
pub(crate) const MAX_PRUNE: u32 = 10_000;

/// What [`Store::prune`] takes.
#[derive(Debug, Clone, Copy)]
pub struct Prune {
    /// What to delete.
    pub kind: Retained,
    /// Records settled before this Unix millisecond go.
    pub before: i64,
    /// The most one call deletes (bounded by the store).
    pub limit: u32,
}

/// What [`Store::queued_from`] takes.
#[derive(Debug, Clone, Copy)]
pub struct QueuedFrom<'a> {
    /// The dispatcher whose jobs these are.
    pub origin: &'a str,
    /// The earliest `created_at` included.
    pub since: i64,
    /// The last id of the page before, if any.
    pub after: Option<&'a str>,
    /// At most this many (bounded by the store).
    pub limit: u32,
}

/// What [`Store::unnotified_jobs`] and [`Store::unnotified_tickets`] take:
/// records settled (or answered) at or after `since` and before `until`
/// whose notice has no record under `<notice_prefix><id>:<state>`, at most
/// `limit`.
#[derive(Debug, Clone, Copy)]
pub struct Unnotified<'a> {
    /// The start of the notice keys looked up: `webhook:job:` or
    /// `webhook:ticket:` in the server.
    pub notice_prefix: &'a str,
    /// The earliest settle (or answer) time included, in Unix milliseconds.
    pub since: i64,
    /// The settle (or answer) time from which records are left out, in Unix
    /// milliseconds.
    pub until: i64,
    /// The most records answered.
    pub limit: u32,
}

/// What [`Store::answer_ticket`] takes: `tenant`'s ticket `id` answered
/// `answer` at `now`.
#[derive(Debug, Clone, Copy)]
pub struct AnswerTicket<'a> {
    /// The tenant the ticket must belong to.
    pub tenant: &'a str,
    /// The ticket answered.
    pub id: &'a str,
    /// The person's answer.
    pub answer: &'a Value,
    /// When it was answered, in Unix milliseconds.
    pub now: i64,
}

/// What [`Store::settle_commit`] takes: the outcome of `key` (kept until
/// `keep_until`), or `None` to release the claim.
#[derive(Debug, Clone, Copy)]
pub struct SettleCommit<'a> {
    /// The key claimed.
    pub key: &'a str,
    /// The command's outcome, answered to later claims; `None` releases the
    /// claim.
    pub outcome: Option<&'a Envelope>,
    /// Until when the settled record is kept, in Unix milliseconds.
    pub keep_until: i64,
}

/// What [`Store::claim_notice`] takes: the webhook notice `key`
/// (`webhook:<kind>:<id>:<state>`) claimed at `now` for `lease_ms`, its
/// record kept until `keep_until` (at least as long as the claim holds).
#[derive(Debug, Clone, Copy)]
pub struct ClaimNotice<'a> {
    /// The notice's key, `webhook:<kind>:<id>:<state>`.
    pub key: &'a str,
    /// When the claim is made, in Unix milliseconds.
    pub now: i64,
    /// How long the claim holds from `now`, in milliseconds.
    pub lease_ms: i64,
    /// Until when the notice's record is kept, in Unix milliseconds.
    pub keep_until: i64,
}

/// What [`Store::settle_notice`] takes: the notice `key` was sent,
/// `delivered` (a 2xx) or given up, and is kept until `keep_until`.
#[derive(Debug, Clone, Copy)]
pub struct SettleNotice<'a> {
    /// The notice's key, as it was claimed.
    pub key: &'a str,
    /// True when the receiver answered a 2xx; false when sending gave up.
    pub delivered: bool,
    /// Until when the notice's record is kept, in Unix milliseconds.
    pub keep_until: i64,
}

/// Where toolfleet's state lives.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Checks that the backend answers (readiness).
    async fn ping(&self) -> Result<(), StoreError>;
    /// Opens the connections a worker's grouped claims and successes run
    /// on and prepares their statements, so that a worker's first jobs do
    /// not wait for them; nothing where there is nothing to open. A
    /// worker calls it as it starts, beside its subscription to the queue.
    async fn warm(&self) -> Result<(), StoreError> {
        Ok(())
    }

    // Jobs.

    /// Records a job in state `queued`, or answers the job that the same
    /// tenant, tool and idempotency key made before; the same key with other
    /// arguments is a [`StoreError::Conflict`].
    async fn insert_job(&self, job: NewJob) -> Result<Inserted, StoreError>;
    /// A job of `tenant`; another tenant's job is `None`, as a missing one is.
    async fn job(&self, tenant: &str, id: &str) -> Result<Option<JobRecord>, StoreError>;
    /// A job by id alone, for workers.
    async fn job_by_id(&self, id: &str) -> Result<Option<JobRecord>, StoreError>;
    /// The tenant's jobs (of [`JobFilter::user`] alone, if given), newest
    /// first, at most `limit`, after `cursor`.
    async fn list_jobs(&self, list: ListJobs<'_>) -> Result<JobPage, StoreError>;
    /// `claim` (queued or due retrying) or `take_over` (running with an
    /// expired lease) -> running, attempts + 1, leased to `worker` until
    /// `now + lease_ms`; a job taken over has `run_at` set to when the
    /// expired lease ended.
    /// `None` when the job is not claimable (settled, leased, not due, missing).
    async fn claim(&self, claim: ClaimJob<'_>) -> Result<Option<JobRecord>, StoreError>;
    /// As [`Store::claim`], of the job of the ordered pool `claim.pool`
    /// that comes next: of every claimable job there (queued, due
    /// scheduled or retrying, running with an expired lease) whose
    /// priority is set, the highest priority, then the lowest turn (a fair
    /// pool's [`NewJob::fair_rank`], moving the pool's clock to it), then
    /// the earliest due, then the smallest id, of those without a
    /// concurrency key or whose key has fewer than its limit running with
    /// a lease that holds (a job whose key is full waits, queued, until a
    /// slot frees). A worker of an ordered pool claims this way on each
    /// message it gets, whichever job the message names: each job has a
    /// message, so each is claimed by one. `None` when no job there is
    /// claimable.
    async fn claim_next(&self, claim: ClaimNext<'_>) -> Result<Option<JobRecord>, StoreError>;
    /// How many jobs of concurrency key `key` run with a lease that holds
    /// at `now`: those [`Store::claim_next`] counts against its limit.
    async fn running_with_key(&self, key: &str, now: i64) -> Result<u32, StoreError>;
    /// The next turn of `tenant` in the fair pool `pool`: one past its last
    /// turn there, and past the pool's clock (the turn of the job
    /// [`Store::claim_next`] took last), so a tenant that comes later is
    /// behind a turn, not behind another's backlog. Every call answers a
    /// turn of its own.
    async fn fair_turn(&self, pool: &str, tenant: &str) -> Result<i64, StoreError>;
    /// Extends the lease of a running job while `beat.lease` holds it;
    /// [`Lease::Lost`] once another attempt does (or it settled),
    /// [`Lease::Cancelled`] once it was cancelled.
    async fn heartbeat(&self, beat: Heartbeat<'_>) -> Result<Lease, StoreError>;
    /// Records progress of a running job while its lease holds it; false
    /// if not held.
    async fn set_progress(&self, report: SetProgress<'_>) -> Result<bool, StoreError>;
    /// The agent loop's last saved state of job `id` (see
    /// [`Store::save_checkpoint`]), kept apart from [`JobRecord`] so that
    /// reading and listing jobs never carries a conversation; `None` when
    /// none was saved or the job is missing.
    async fn checkpoint(&self, id: &str) -> Result<Option<Value>, StoreError>;
    /// Saves an agent loop's state on a running job, for the attempt that
    /// holds it: written only while the job is `running` under that lease,
    /// so an attempt that lost the job to a newer claim (even its own
    /// worker's) cannot overwrite the new holder's checkpoint. True if
    /// written. The checkpoint stays on the job across later claims and
    /// retries.
    async fn save_checkpoint(&self, save: SaveCheckpoint<'_>) -> Result<bool, StoreError>;
    /// `park`: running (this attempt) -> parked on `ticket` (shown as
    /// `retrying`), unleased until [`Store::wake`], and the attempt given
    /// back (waiting for a person is not a failed attempt). For an agent
    /// whose tool asked a person: its worker is free meanwhile. The parked
    /// job, or `None` when this attempt no longer holds it.
    async fn park(&self, park: Park<'_>) -> Result<Option<JobRecord>, StoreError>;
    /// `defer`: running (this attempt) -> retrying, due at `defer.until`,
    /// the attempt given back (its tool's `start_rate` had no start free:
    /// not a failed attempt) and the lease released. The deferred job, or
    /// `None` when this attempt no longer holds it.
    async fn defer(&self, defer: Defer<'_>) -> Result<Option<JobRecord>, StoreError>;
    /// `wake`: jobs parked on `ticket` -> retrying, due at `now`. The jobs
    /// woken, to publish.
    async fn wake(&self, ticket: &str, now: i64) -> Result<Vec<JobRecord>, StoreError>;
    /// `succeed`: running (held by this attempt) -> succeeded. The settled job, or
    /// `None` when the attempt no longer held it.
    async fn succeed(&self, done: Succeed<'_>) -> Result<Option<JobRecord>, StoreError>;
    /// `retry`: running (held by this attempt) -> retrying at `retry_at`
    /// if given, else `fail`: -> failed, with `error` kept either way. The
    /// lifecycle decides which; the store does not look at attempts. `None`
    /// when not held.
    async fn fail(&self, failed: Fail<'_>) -> Result<Option<JobRecord>, StoreError>;
    /// `cancel`: queued, scheduled, retrying, parked or running -> cancelled. The job as it now stands
    /// (already settled ones unchanged), `None` if missing or another tenant's.
    async fn cancel(&self, cancel: CancelJob<'_>) -> Result<Option<JobRecord>, StoreError>;
    /// `dead_letter`: queued, scheduled, retrying, or running with a lease
    /// that ran out before `now` -> failed with `error`: the broker gave up
    /// delivering the job's message. The job failed, or `None` when it is
    /// missing, held by a live lease, parked or settled (then that message
    /// was a duplicate, and the job is left as it is).
    async fn dead_letter(&self, dead: DeadLetter<'_>) -> Result<Option<JobRecord>, StoreError>;
    /// `requeue`: failed or cancelled -> queued, due at `now`, its attempts
    /// counted anew, its error, result, progress and checkpoint cleared,
    /// its `requeues` one more. The job put back, or `None` when it is
    /// missing, another tenant's, or in another state.
    async fn requeue(&self, requeue: Requeue<'_>) -> Result<Option<JobRecord>, StoreError>;
    /// [`Store::requeue`] of the jobs `many` names, oldest settled first,
    /// at most its `limit` (bounded); the jobs put back. Several processes
    /// may run it at once: each job is put back by one.
    async fn requeue_many(&self, many: RequeueMany<'_>) -> Result<Vec<JobRecord>, StoreError>;
    /// Jobs a worker should run now or soon: queued, scheduled or retrying
    /// and due by `due_by` (a time at or after `now`: the sweeper reads a
    /// period ahead, to publish what falls due before its next pass), or
    /// running with a lease expired at `now`; by id, at most `limit` of
    /// each kind (waiting, scheduled, expired), each kind read in its own
    /// order from where `after` says (so a long backlog is read a page at a
    /// time, never whole, and a backlog of queued jobs does not hide the
    /// scheduled ones), with where the next page of each starts.
    async fn due_jobs(&self, due: DueJobs<'_>) -> Result<DuePage, StoreError>;
    /// Counts of jobs by state, for metrics.
    async fn job_counts(&self) -> Result<Vec<(JobState, u64)>, StoreError>;
    /// `tenant`'s jobs by pool: those not settled by state (with the
    /// earliest due of each), and those settled since `since` by state
    /// and minute. For the queues an operator looks at.
    async fn queue_stats(&self, tenant: &str, since: i64) -> Result<Vec<PoolRow>, StoreError>;

    // The outbox: dispatchers that answer before they publish.

    /// Records that the dispatcher `origin` was alive at `now`.
    async fn beat_dispatcher(&self, origin: &str, now: i64) -> Result<(), StoreError>;
    /// Dispatchers last seen before `seen_before`, longest silent first, at
    /// most `limit` (bounded).
    async fn silent_dispatchers(
        &self,
        seen_before: i64,
        limit: u32,
    ) -> Result<Vec<SilentDispatcher>, StoreError>;
    /// Queued jobs whose [`NewJob::origin`] is `origin`, made at or after
    /// `since`, with ids after `after`; by id, at most `limit` (bounded).
    async fn queued_from(&self, from: QueuedFrom<'_>) -> Result<Vec<JobRecord>, StoreError>;
    /// Forgets the dispatcher `origin` if it was last seen before
    /// `seen_before` (one that beat since is kept); whether it did.
    async fn forget_dispatcher(&self, origin: &str, seen_before: i64) -> Result<bool, StoreError>;
    /// Settled jobs that named a `callback_url`, last updated at or after
    /// `since` and before `until`, whose notice has no record among the
    /// notices ([`Store::claim_notice`]) under the key
    /// `<notice_prefix><id>:<state>`, followed by `:<requeues>` for a job
    /// put back ([`JobRecord::requeues`] past 0): notices nobody has
    /// claimed. Oldest
    /// first (then by id), at most `limit` (bounded).
    async fn unnotified_jobs(&self, search: Unnotified<'_>) -> Result<Vec<JobRecord>, StoreError>;

    // Tickets.

    /// Answered tickets that named a `callback_url`, answered at or after
    /// `since` and before `until`, whose notice has no record among the
    /// notices under the key `<notice_prefix><id>:answered`: notices nobody
    /// has claimed. Oldest first (then by id), at most `limit` (bounded).
    async fn unnotified_tickets(
        &self,
        search: Unnotified<'_>,
    ) -> Result<Vec<TicketRecord>, StoreError>;

    /// Records an open ticket, as given.
    async fn insert_ticket(&self, ticket: NewTicket) -> Result<TicketRecord, StoreError>;
    /// A ticket of `tenant`; another tenant's ticket is `None`.
    async fn ticket(&self, tenant: &str, id: &str) -> Result<Option<TicketRecord>, StoreError>;
    /// open -> answered; `None` if missing or another tenant's. An expired
    /// ticket is not answered: `Already`, with the record as it is.
    async fn answer_ticket(&self, answer: AnswerTicket<'_>)
    -> Result<Option<Answered>, StoreError>;
    /// Records answers to an open input ticket's pending requests (keys it
    /// does not ask, or answered before, are left out: the first answer to
    /// each key stands); the answer to its last pending request answers it
    /// (open -> answered, `answer` every response by key). A compare-and-set
    /// on the answers recorded, so concurrent calls lose none. `None` if
    /// missing or another tenant's.
    async fn respond_ticket(
        &self,
        respond: RespondTicket<'_>,
    ) -> Result<Option<Responded>, StoreError>;
    /// A page of the tickets of `list.tenant` its answerer may answer
    /// (an operator: all), newest first.
    async fn list_tickets(&self, list: ListTickets<'_>) -> Result<TicketPage, StoreError>;
    /// open with `expires_at <= now` -> expired (`expired_at = now`), at
    /// most `limit` (bounded): the tickets this call expired.
    async fn expire_tickets(&self, now: i64, limit: u32) -> Result<Vec<TicketRecord>, StoreError>;
    /// Records what an answered or expired ticket came to, once: `None` if
    /// missing, another tenant's or still open; the record as it is when
    /// its outcome was recorded before (the first outcome is kept).
    async fn settle_ticket(
        &self,
        settle: SettleTicket<'_>,
    ) -> Result<Option<TicketRecord>, StoreError>;
    /// Answered tickets whose outcome was not recorded, answered before
    /// `before`, oldest first, at most `limit`: approvals whose commit a
    /// stopped process left to run.
    async fn unsettled_tickets(
        &self,
        before: i64,
        limit: u32,
    ) -> Result<Vec<TicketRecord>, StoreError>;

    // Runs.

    /// Records a run; the same tenant, user and idempotency key answer the
    /// existing run.
    async fn insert_run(&self, run: NewRun) -> Result<RunInserted, StoreError>;
    /// A run of `tenant`; another tenant's is `None`.
    async fn run(&self, tenant: &str, id: &str) -> Result<Option<RunRecord>, StoreError>;
    /// A run by id alone, for the runtime's own loop.
    async fn run_by_id(&self, id: &str) -> Result<Option<RunRecord>, StoreError>;
    /// A page of a tenant's runs, newest first.
    async fn list_runs(&self, list: ListRuns<'_>) -> Result<RunPage, StoreError>;
    /// Compare-and-set of a run's state (see [`UpdateRun`]): the run as
    /// written, or `None` when it is missing, its version moved on, or its
    /// state is not one of `from`.
    async fn update_run(&self, update: UpdateRun<'_>) -> Result<Option<RunRecord>, StoreError>;
    /// The waiting runs whose wait names `item` (a job or ticket id).
    async fn waiting_runs(&self, item: &str) -> Result<Vec<RunRecord>, StoreError>;
    /// Runs left in one state since before some time (see [`StaleRuns`]).
    async fn stale_runs(&self, stale: StaleRuns) -> Result<Vec<RunRecord>, StoreError>;

    // Audit.

    /// Appends `records` to the audit, in order.
    async fn append_audit(&self, records: &[AuditRecord]) -> Result<(), StoreError>;
    /// The tenant's latest audit records, newest first.
    async fn audit(&self, tenant: &str, limit: u32) -> Result<Vec<AuditRecord>, StoreError>;

    // Webhook notices: which a fleet has sent, or is sending.

    /// Claims the notice `claim.key` for sending: true when it was absent,
    /// kept past its `keep_until`, or claimed by a sender whose lease ran
    /// out (a dispatcher that stopped; the notice may then be sent twice,
    /// never lost); false when it was sent, or another sender holds it.
    async fn claim_notice(&self, claim: ClaimNotice<'_>) -> Result<bool, StoreError>;
    /// Records the notice `settle.key` as sent, delivered or given up.
    async fn settle_notice(&self, settle: SettleNotice<'_>) -> Result<(), StoreError>;

    // Command outcomes (the durable commit log).

    /// Claims a key (absent, settled past its `keep_until`, or pending past
    /// its lease when the claim takes over), or answers its recorded
    /// outcome, that another claim holds it, or that a claim abandoned it.
    async fn claim_commit(&self, claim: ClaimCommit<'_>) -> Result<CommitClaim, StoreError>;
    /// Records the outcome of `key` (kept until `keep_until`), or with `None`
    /// releases the claim so the commit may run again.
    async fn settle_commit(&self, settle: SettleCommit<'_>) -> Result<(), StoreError>;

    // Rate limits.

    /// Takes a token of the bucket `take.key` (the generic cell rate
    /// algorithm: `take.burst` calls at once, then one every
    /// `take.interval`): `None` when taken, else how long until one is
    /// free, in the take's unit. Every process sharing the store shares the
    /// bucket; concurrent takes are serialised, none taken twice.
    async fn take_token(&self, take: TakeToken<'_>) -> Result<Option<i64>, StoreError>;

    // Handles.

    /// Keeps a handle, then deletes the tenant's oldest handles beyond its
    /// bounds (`max_per_tenant`, `max_bytes_per_tenant`); answers how many
    /// went. A value larger than the byte bound alone is the caller's to
    /// refuse before it comes here.
    async fn put_handle(&self, handle: NewHandle<'_>) -> Result<u64, StoreError>;
    /// The handle `id` if it belongs to `owner`'s tenant and user and has
    /// not expired; another's, or an expired one, answers `None`.
    async fn handle(
        &self,
        owner: HandleOwner<'_>,
        id: &str,
    ) -> Result<Option<HandleRecord>, StoreError>;
    /// `owner`'s unexpired handles, newest first, at most `limit` (bounded
    /// by [`MAX_HANDLE_LIST`]), those older than `before` (an id) when given.
    async fn list_handles(
        &self,
        owner: HandleOwner<'_>,
        before: Option<&str>,
        limit: u32,
    ) -> Result<Vec<HandleInfo>, StoreError>;
    /// Deletes at most `limit` (bounded like [`Store::prune`]) handles
    /// expired by `now`, and says how many.
    async fn prune_handles(&self, now: i64, limit: u32) -> Result<u64, StoreError>;

    // Schedules.

    /// Every schedule's record, by name.
    async fn schedules(&self) -> Result<Vec<ScheduleRecord>, StoreError>;
    /// Moves schedule `advance.name` on to the tick `advance.to` if its last
    /// tick is still `advance.from` (no record, for `None`) and it is not
    /// paused: a compare-and-set, so of several dispatchers handling one
    /// tick one moves it. True if moved.
    async fn advance_schedule(&self, advance: AdvanceSchedule<'_>) -> Result<bool, StoreError>;
    /// Pauses schedule `name` (`paused`) or resumes it at `now`, making its
    /// record if it has none: a schedule resumed counts its ticks from
    /// `now` (those while it was paused are not made up). The record.
    async fn pause_schedule(
        &self,
        name: &str,
        paused: bool,
        now: i64,
    ) -> Result<ScheduleRecord, StoreError>;

    // Retention.

    /// Deletes at most `limit` (bounded: 10,000) records of `kind`
    /// settled before `before`, oldest first (runs in no order), and says
    /// how many: jobs that succeeded, failed or were cancelled (their
    /// idempotency keys name nothing afterwards), answered or expired
    /// tickets, runs that stopped, audit records. Open tickets, running and
    /// waiting runs, unsettled jobs and settled jobs a waiting run still
    /// waits on are never deleted. Several processes may prune at once,
    /// each record deleted by one of them, and a call holds its rows only
    /// for its own short statement.
    async fn prune(&self, prune: Prune) -> Result<u64, StoreError>;
}
