//! Runs, their waits, and what the inbox asks of tickets: the records and
//! the parameters of the [`Store`](crate::Store) operations on them.
//!
//! A run is a conversation the runtime keeps: its loop driven by the
//! runtime (an `agent` is named, and its loop state is the run's
//! checkpoint) or by the caller (no agent; the checkpoint is the caller's
//! opaque JSON). A run moves between its states only by
//! [`Store::update_run`](crate::Store::update_run), a compare-and-set on
//! the run's `version` and its state, so two writers never both win. While
//! a run waits, the items of its [`RunWait`] are indexed, so the run is
//! found from any of them ([`Store::waiting_runs`](crate::Store::waiting_runs)).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use toolfleet_core::Envelope;

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Its loop is working (the runtime's, or the caller's).
    Running,
    /// Parked on jobs and tickets, named in its [`RunWait`].
    Waiting,
    /// The model answered; a next message continues it.
    Answered,
    /// Stopped by an error.
    Failed,
    /// Stopped by its budget.
    BudgetExceeded,
    /// Stopped by a cancel.
    Cancelled,
}

impl RunState {
    /// Every state.
    pub const ALL: [RunState; 6] = [
        RunState::Running,
        RunState::Waiting,
        RunState::Answered,
        RunState::Failed,
        RunState::BudgetExceeded,
        RunState::Cancelled,
    ];

    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Waiting => "waiting",
            RunState::Answered => "answered",
            RunState::Failed => "failed",
            RunState::BudgetExceeded => "budget_exceeded",
            RunState::Cancelled => "cancelled",
        }
    }

    /// The states of a run whose loop stopped (answered, failed, out of
    /// budget, cancelled): those retention deletes once old enough. An
    /// answered run may be continued until then.
    pub const STOPPED: [RunState; 4] = [
        RunState::Answered,
        RunState::Failed,
        RunState::BudgetExceeded,
        RunState::Cancelled,
    ];

    /// The state named `name`, if any.
    pub fn parse(name: &str) -> Option<RunState> {
        RunState::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// Failed, out of budget or cancelled: nothing moves it again.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            RunState::Failed | RunState::BudgetExceeded | RunState::Cancelled
        )
    }
}

/// [`RunState::STOPPED`] as an SQL list, as both stores' retention names it.
pub(crate) fn stopped_runs() -> String {
    let names: Vec<String> = RunState::STOPPED.iter().map(|s| format!("'{s}'")).collect();
    format!("({})", names.join(", "))
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a wait holds once every item settled, or once one has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitFor {
    /// Every job settled and every ticket answered (or expired).
    #[default]
    All,
    /// One of them.
    Any,
}

/// What a waiting run waits on: jobs and tickets of its tenant.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RunWait {
    /// All of them, or any one.
    #[serde(rename = "for", default)]
    pub wait_for: WaitFor,
    /// Job ids.
    #[serde(default)]
    pub jobs: Vec<String>,
    /// Ticket ids.
    #[serde(default)]
    pub tickets: Vec<String>,
}

impl RunWait {
    /// Every item, jobs first.
    pub fn items(&self) -> impl Iterator<Item = &str> {
        self.jobs.iter().chain(&self.tickets).map(String::as_str)
    }
}

/// A run to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    /// `run_` and a UUIDv7.
    pub id: String,
    /// The caller's tenant; the run is scoped to it.
    pub tenant: String,
    /// The user who started it: its owner.
    pub user: String,
    /// The declared assistant whose loop the runtime drives; `None` for a
    /// run the caller drives.
    pub agent: Option<String>,
    /// Its first checkpoint: the runtime's loop state, or the caller's JSON.
    pub checkpoint: Option<Value>,
    /// Where its notices go, if the caller named one.
    pub callback_url: Option<String>,
    /// With tenant and user: a second run with the same key is the same run.
    pub idempotency_key: Option<String>,
    /// The caller's scopes: the runtime's loop calls tools with them.
    pub scopes: Vec<String>,
    /// When it was started, in Unix milliseconds.
    pub now: i64,
}

/// A run as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The [`NewRun::id`] it was made with.
    pub id: String,
    /// The [`NewRun::tenant`] it was made with.
    pub tenant: String,
    /// The [`NewRun::user`] it was made with.
    pub user: String,
    /// The [`NewRun::agent`] it was made with.
    pub agent: Option<String>,
    /// Where it stands.
    pub state: RunState,
    /// Its checkpoint, as last written.
    pub checkpoint: Option<Value>,
    /// What it waits on while [`RunState::Waiting`]; `None` otherwise.
    pub wait: Option<RunWait>,
    /// What its last wait came to (the items' final envelopes), as last written.
    pub resumed: Option<Value>,
    /// The model's answer, when answered.
    pub answer: Option<String>,
    /// Why it stopped, when it failed or ran out of budget.
    pub error: Option<Value>,
    /// Its usage (steps, tokens, wall time), as last written.
    pub usage: Option<Value>,
    /// The [`NewRun::callback_url`] it was made with.
    pub callback_url: Option<String>,
    /// The [`NewRun::idempotency_key`] it was made with.
    pub idempotency_key: Option<String>,
    /// The [`NewRun::scopes`] it was made with.
    pub scopes: Vec<String>,
    /// Bumped by every [`Store::update_run`](crate::Store::update_run); 1 when made.
    pub version: i64,
    /// When it was made, in Unix milliseconds.
    pub created_at: i64,
    /// When it was last written, in Unix milliseconds.
    pub updated_at: i64,
}

/// What [`Store::insert_run`](crate::Store::insert_run) did.
#[derive(Debug, Clone, PartialEq)]
pub enum RunInserted {
    /// No run had its key: this call recorded it.
    Created(RunRecord),
    /// A run of the same tenant, user and idempotency key existed.
    Existing(RunRecord),
}

impl RunInserted {
    /// The run, created or existing.
    pub fn run(&self) -> &RunRecord {
        match self {
            RunInserted::Created(run) | RunInserted::Existing(run) => run,
        }
    }
}

/// What [`Store::update_run`](crate::Store::update_run) takes: run `id`,
/// while its version is `version` (any, when `None`) and its state one of
/// `from`, moves to `to`, version + 1. A field left `None` keeps its value,
/// except `wait`: set when `to` is [`RunState::Waiting`], cleared otherwise
/// (and the run's waited items indexed, or their index dropped, in the
/// same statement or transaction).
#[derive(Debug, Clone, Copy)]
pub struct UpdateRun<'a> {
    /// The run.
    pub id: &'a str,
    /// The version the writer read; `None`: whatever it is now.
    pub version: Option<i64>,
    /// The states the run may be in.
    pub from: &'a [RunState],
    /// The state it moves to.
    pub to: RunState,
    /// A new checkpoint.
    pub checkpoint: Option<&'a Value>,
    /// What it waits on, when `to` is waiting.
    pub wait: Option<&'a RunWait>,
    /// A new [`RunRecord::resumed`].
    pub resumed: Option<&'a Value>,
    /// A new answer.
    pub answer: Option<&'a str>,
    /// A new error.
    pub error: Option<&'a Value>,
    /// A new usage.
    pub usage: Option<&'a Value>,
    /// When it is written, in Unix milliseconds.
    pub now: i64,
}

impl<'a> UpdateRun<'a> {
    /// Moves `id` from `from` to `to`, keeping every field but the wait.
    pub fn new(id: &'a str, from: &'a [RunState], to: RunState, now: i64) -> Self {
        UpdateRun {
            id,
            version: None,
            from,
            to,
            checkpoint: None,
            wait: None,
            resumed: None,
            answer: None,
            error: None,
            usage: None,
            now,
        }
    }
}

/// Filters of the run list.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunFilter {
    /// Only runs in this state.
    pub state: Option<RunState>,
    /// Only runs of this assistant.
    pub agent: Option<String>,
    /// Only this user's runs (a caller's own list).
    pub user: Option<String>,
}

/// What [`Store::list_runs`](crate::Store::list_runs) takes.
#[derive(Debug, Clone, Copy)]
pub struct ListRuns<'a> {
    /// The tenant whose runs are listed.
    pub tenant: &'a str,
    /// Which of them.
    pub filter: &'a RunFilter,
    /// The most runs on the page (bounded by the store).
    pub limit: u32,
    /// The `next_cursor` of the page before.
    pub cursor: Option<&'a str>,
}

/// One page of runs, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPage {
    /// The runs, newest first.
    pub runs: Vec<RunRecord>,
    /// Pass back for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

/// What [`Store::stale_runs`](crate::Store::stale_runs) takes: runs in
/// `state` not written since `before`, oldest written first, at most `limit`.
#[derive(Debug, Clone, Copy)]
pub struct StaleRuns {
    /// Their state.
    pub state: RunState,
    /// Not written at or after this time, in Unix milliseconds.
    pub before: i64,
    /// The most answered (bounded by the store).
    pub limit: u32,
}

/// What a ticket asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TicketKind {
    /// A question, answered with text or one of its options.
    #[default]
    Question,
    /// A command's commit, approved or rejected.
    Approval,
    /// What a job tool declared `asks_client` asks its caller's MCP client
    /// while its job waits: requests by key ([`TicketRecord::input_requests`](crate::TicketRecord::input_requests)),
    /// answered by [`Store::respond_ticket`](crate::Store::respond_ticket).
    Input,
}

impl TicketKind {
    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            TicketKind::Question => "question",
            TicketKind::Approval => "approval",
            TicketKind::Input => "input",
        }
    }

    /// The kind named `name`, if any.
    pub fn parse(name: &str) -> Option<TicketKind> {
        [
            TicketKind::Question,
            TicketKind::Approval,
            TicketKind::Input,
        ]
        .into_iter()
        .find(|k| k.as_str() == name)
    }
}

/// Which tickets of the inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TicketShown {
    /// Not answered and not expired.
    Open,
    /// Answered (or expired).
    Answered,
}

/// Who reads the inbox: the tickets they may answer are listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answerer {
    /// An operator of the tenant: every ticket.
    Operator,
    /// A user holding these scopes: tickets answered by their caller that
    /// they opened, and those answered by a scope they hold.
    User {
        /// The user.
        user: String,
        /// Their scopes.
        scopes: Vec<String>,
    },
}

/// What [`Store::list_tickets`](crate::Store::list_tickets) takes.
#[derive(Debug, Clone, Copy)]
pub struct ListTickets<'a> {
    /// The tenant whose tickets are listed.
    pub tenant: &'a str,
    /// Whose inbox.
    pub answerer: &'a Answerer,
    /// Open or answered; both when `None`.
    pub shown: Option<TicketShown>,
    /// Of one kind; both when `None`.
    pub kind: Option<TicketKind>,
    /// The most tickets on the page (bounded by the store).
    pub limit: u32,
    /// The `next_cursor` of the page before.
    pub cursor: Option<&'a str>,
}

/// One page of tickets, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct TicketPage {
    /// The tickets, newest first.
    pub tickets: Vec<crate::TicketRecord>,
    /// Pass back for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

/// What [`Store::settle_ticket`](crate::Store::settle_ticket) takes:
/// `tenant`'s answered or expired ticket `id` gets its `outcome`, once.
#[derive(Debug, Clone, Copy)]
pub struct SettleTicket<'a> {
    /// The tenant the ticket must belong to.
    pub tenant: &'a str,
    /// The ticket.
    pub id: &'a str,
    /// What it came to: an approval's commit, its rejection, its expiry.
    pub outcome: &'a Envelope,
    /// When, in Unix milliseconds.
    pub now: i64,
}
