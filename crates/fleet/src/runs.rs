//! Runs: what resumes a waiting run, and the job that drives an assistant's
//! loop. A run parks by writing its wait (the store indexes its items);
//! whoever settles one of those items (the worker settling a job, the
//! dispatcher answering or deciding a ticket, the sweeper expiring one)
//! calls [`wake_runs`], which resumes each waiting run whose wait now holds:
//! a compare-and-set from `waiting` to `running` that one writer wins, then,
//! for an assistant's run, the job of its loop ([`RUN_TOOL`], keyed by the
//! run's version, so a resume enqueues it once), and for a run its caller
//! drives, the `run.resumed` notice its callback hears. The sweeper looks
//! again at runs left waiting ([`resume_stale`]), for a wake a crash missed.
//!
//! This module never runs a model or a tool: the agent crate's loop does,
//! as the job's executor.

use serde_json::{Value, json};
use toolfleet_broker::{Broker, Event, EventKind, EventState, Notices, RunNotice};
use toolfleet_core::{Envelope, ErrorCode, Json, ToolError, new_id, now_ms};
use toolfleet_store::{
    NewJob, RunRecord, RunState, RunWait, StaleRuns, Store, StoreError, TicketKind, TicketRecord,
    UpdateRun, WaitFor,
};

use crate::dispatch::POLL_AFTER_S;

/// The job tool whose executor drives an assistant's run: registered by
/// every process that runs assistants, offered to no model or client (a
/// model's tool names never hold a dot).
pub const RUN_TOOL: &str = "toolfleet.run";

/// The pool an assistant's loop runs on when its checkpoint names none.
pub const DEFAULT_RUN_POOL: &str = "agents";

/// How long one job of an assistant's loop may take when its checkpoint
/// names no time (the loop's own budget stops it first).
const DEFAULT_RUN_TIMEOUT_MS: i64 = 15 * 60 * 1000;

/// Attempts of one job of an assistant's loop: each goes on from the checkpoint.
const RUN_ATTEMPTS: u32 = 5;

/// The final envelope of one settled item of a wait.
fn item(kind: &str, id: &str, envelope: &Envelope) -> Value {
    json!({"kind": kind, "id": id, "envelope": envelope})
}

/// What a ticket came to, once it did: its outcome (an approval's commit,
/// a rejection, an expiry), a question's answer, or `None` while open (and
/// for an approval decided whose commit still runs).
pub fn ticket_outcome(ticket: &TicketRecord) -> Option<Envelope> {
    if let Some(outcome) = &ticket.outcome {
        return Some(outcome.clone());
    }
    if ticket.expired_at.is_some() {
        return Some(Envelope::error(expired(&ticket.id)));
    }
    match (ticket.kind, &ticket.answer) {
        (TicketKind::Question | TicketKind::Input, Some(answer)) => Some(Envelope::ok(
            Json::from(json!({"answer": answer})),
            ticket.call_id.clone(),
        )),
        _ => None,
    }
}

/// The error of a ticket that expired unanswered.
pub fn expired(ticket: &str) -> ToolError {
    ToolError::new(
        ErrorCode::Expired,
        format!("ticket {ticket} expired before anyone answered it; ask again if it still matters"),
    )
}

/// A job or ticket a run waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item<'a> {
    /// A job, by id.
    Job(&'a str),
    /// A ticket, by id.
    Ticket(&'a str),
}

impl Item<'_> {
    fn kind(self) -> &'static str {
        match self {
            Item::Job(_) => "job",
            Item::Ticket(_) => "ticket",
        }
    }

    fn id(&self) -> &str {
        match self {
            Item::Job(id) | Item::Ticket(id) => id,
        }
    }
}

/// `item`'s final envelope once it settled (a job's as `get_job` answers
/// it, a ticket's [`ticket_outcome`]), `None` while it has not. An item
/// that is gone (not of the tenant, or pruned) counts as settled with
/// `not_found`, so nothing waits forever on it.
pub async fn item_outcome(
    store: &dyn Store,
    tenant: &str,
    item: Item<'_>,
) -> Result<Option<Envelope>, StoreError> {
    let gone = || {
        Some(Envelope::error(ToolError::new(
            ErrorCode::NotFound,
            format!("{} {} is gone", item.kind(), item.id()),
        )))
    };
    Ok(match item {
        Item::Job(id) => match store.job(tenant, id).await? {
            Some(job) if job.state.is_settled() => Some(job.envelope(POLL_AFTER_S)),
            Some(_) => None,
            None => gone(),
        },
        Item::Ticket(id) => match store.ticket(tenant, id).await? {
            Some(ticket) => ticket_outcome(&ticket),
            None => gone(),
        },
    })
}

/// Each awaited item's final envelope, in the wait's order (jobs, then
/// tickets), when the wait holds: all settled, or for `any` one; `None`
/// while it does not.
pub async fn wait_outcome(
    store: &dyn Store,
    tenant: &str,
    wait: &RunWait,
) -> Result<Option<Vec<Value>>, StoreError> {
    let mut settled = Vec::new();
    let mut open = 0usize;
    let jobs = wait.jobs.iter().map(|id| Item::Job(id));
    for each in jobs.chain(wait.tickets.iter().map(|id| Item::Ticket(id))) {
        match item_outcome(store, tenant, each).await? {
            Some(envelope) => settled.push(item(each.kind(), each.id(), &envelope)),
            None => open += 1,
        }
    }
    let holds = match wait.wait_for {
        WaitFor::All => open == 0,
        WaitFor::Any => !settled.is_empty() || open == 0,
    };
    Ok(holds.then_some(settled))
}

/// The notice of a run's state.
pub fn notice_of(state: RunState) -> RunNotice {
    match state {
        RunState::Running => RunNotice::Step,
        RunState::Waiting => RunNotice::Waiting,
        RunState::Answered => RunNotice::Answered,
        RunState::Failed => RunNotice::Failed,
        RunState::BudgetExceeded => RunNotice::BudgetExceeded,
        RunState::Cancelled => RunNotice::Cancelled,
    }
}

/// A run as clients read it: with its transcript (the loop's, kept in an
/// assistant's checkpoint) or without.
pub fn run_view(run: &RunRecord, transcript: bool) -> Value {
    let assistant = run.agent.is_some();
    let mut view = json!({
        "run_id": run.id,
        "agent": run.agent,
        "state": run.state.as_str(),
        "wait": run.wait,
        "answer": run.answer,
        "error": run.error,
        "usage": run.usage,
        // A caller's checkpoint is theirs to read; an assistant's is the
        // runtime's loop, shown as its transcript.
        "checkpoint": if assistant { Value::Null } else { run.checkpoint.clone().unwrap_or(Value::Null) },
        "resumed": run.resumed,
        "callback_url": run.callback_url,
        "version": run.version,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
    });
    if transcript {
        view["transcript"] = run
            .checkpoint
            .as_ref()
            .filter(|_| assistant)
            .and_then(|c| c.get("transcript").cloned())
            .unwrap_or_else(|| json!([]));
    }
    view
}

/// The event of `run` as it now stands, with the transcript `entries` it
/// gained (for its event stream).
pub fn run_event(run: &RunRecord, notice: RunNotice, entries: Vec<Value>) -> Event {
    let mut body = run_view(run, false);
    body["entries"] = Value::Array(entries);
    Event {
        kind: EventKind::Run,
        id: run.id.clone(),
        tenant: run.tenant.clone(),
        user: run.user.clone(),
        audience: None,
        tool: run.agent.clone().unwrap_or_else(|| "run".to_owned()),
        state: EventState::Run(notice),
        run_id: run.id.clone(),
        body: body.into(),
        callback: run.callback_url.is_some(),
        life: 0,
    }
}

/// The checkpoint an assistant's run starts from: the pool its loop runs
/// on, how long one job of its loop may take, and the user's first message
/// waiting in its inbox (the loop moves it into the conversation).
pub fn first_checkpoint(pool: &str, timeout_ms: u64, input: &str) -> Value {
    json!({
        "pool": pool,
        "timeout_ms": timeout_ms,
        "inbox": [input],
        "transcript": [],
        "loop": null,
    })
}

/// Records the job that drives `run`'s loop now and publishes it: keyed by
/// the run's version, so every writer that resumed this version enqueues
/// the same job. A publish that fails leaves the row to the sweeper.
pub async fn enqueue_loop(
    store: &dyn Store,
    broker: &dyn Broker,
    run: &RunRecord,
) -> Result<(), StoreError> {
    let checkpoint = run.checkpoint.as_ref();
    let pool = checkpoint
        .and_then(|c| c.get("pool"))
        .and_then(Value::as_str)
        .unwrap_or(DEFAULT_RUN_POOL)
        .to_owned();
    let timeout_ms = checkpoint
        .and_then(|c| c.get("timeout_ms"))
        .and_then(Value::as_i64)
        .filter(|ms| *ms > 0)
        .unwrap_or(DEFAULT_RUN_TIMEOUT_MS);
    let job = NewJob {
        id: new_id(),
        tenant: run.tenant.clone(),
        user: run.user.clone(),
        tool: RUN_TOOL.to_owned(),
        pool,
        args: json!({"run_id": run.id}),
        idempotency_key: Some(format!("run:{}:{}", run.id, run.version)),
        run_id: run.id.clone(),
        call_id: new_id(),
        callback_url: None,
        lineage: None,
        scopes: run.scopes.clone(),
        trace: None,
        max_attempts: RUN_ATTEMPTS,
        timeout_ms,
        now: now_ms(),
        run_at: None,
        priority: None,
        concurrency_key: None,
        concurrency_limit: None,

        fair_rank: 0,
        origin: None,
    };
    let inserted = store.insert_job(job).await?;
    let job = inserted.job();
    if !job.state.is_settled()
        && let Err(error) = broker
            .publish_traced(&job.pool, &job.id, job.trace.as_ref())
            .await
    {
        tracing::warn!(run_id = %run.id, job_id = %job.id, %error, "publishing a run's loop failed; left to the sweeper");
    }
    Ok(())
}

/// Resumes `run` if it waits and its wait holds: the run as this call
/// resumed it, `None` when it did not. An assistant's run gets the job of its loop; a run its
/// caller drives gets `resumed` (its checkpoint and each item's final
/// envelope) and its `run.resumed` notice.
pub async fn resume_if_ready(
    store: &dyn Store,
    broker: &dyn Broker,
    notices: &dyn Notices,
    run: &RunRecord,
) -> Result<Option<RunRecord>, StoreError> {
    let (RunState::Waiting, Some(wait)) = (run.state, &run.wait) else {
        return Ok(None);
    };
    let Some(items) = wait_outcome(store, &run.tenant, wait).await? else {
        return Ok(None);
    };
    let resumed = json!({
        "checkpoint": if run.agent.is_some() { Value::Null } else { run.checkpoint.clone().unwrap_or(Value::Null) },
        "items": items,
        "at": now_ms(),
    });
    let update = UpdateRun {
        version: Some(run.version),
        resumed: Some(&resumed),
        ..UpdateRun::new(&run.id, &[RunState::Waiting], RunState::Running, now_ms())
    };
    let Some(running) = store.update_run(update).await? else {
        // Another writer resumed or cancelled it first.
        return Ok(None);
    };
    if running.agent.is_some() {
        enqueue_loop(store, broker, &running).await?;
    } else if let Err(error) = notices
        .publish(&run_event(&running, RunNotice::Resumed, Vec::new()))
        .await
    {
        tracing::warn!(run_id = %running.id, %error, "announcing a resumed run failed");
    }
    Ok(Some(running))
}

/// Resumes every run waiting on `item` (a job or ticket id) whose wait now
/// holds. Failures are logged: the sweeper looks at waiting runs again.
pub async fn wake_runs(store: &dyn Store, broker: &dyn Broker, notices: &dyn Notices, item: &str) {
    let runs = match store.waiting_runs(item).await {
        Ok(runs) => runs,
        Err(error) => {
            tracing::warn!(item, %error, "finding the runs waiting on an item failed; left to the sweeper");
            return;
        }
    };
    for run in runs {
        if let Err(error) = resume_if_ready(store, broker, notices, &run).await {
            tracing::warn!(run_id = %run.id, %error, "resuming a run failed; left to the sweeper");
        }
    }
}

/// True for the run id of a run: the jobs a run's calls make carry it, and
/// only their settling can resume one.
pub fn is_run_id(id: &str) -> bool {
    id.starts_with("run_")
}

/// Looks at assistants' runs left `running` since before `before` (at most
/// `limit`): the loop job the checkpoint names (under `job`) is alive, or
/// the run gets one again (its first enqueue or a resume's was lost with
/// its process), or, when that job failed for good, the run fails with
/// its error. Answers how many it moved.
pub async fn recover_loops(
    store: &dyn Store,
    broker: &dyn Broker,
    notices: &dyn Notices,
    before: i64,
    limit: u32,
) -> Result<usize, StoreError> {
    let stale = StaleRuns {
        state: RunState::Running,
        before,
        limit,
    };
    let mut moved = 0;
    for run in store.stale_runs(stale).await? {
        if run.agent.is_none() {
            continue;
        }
        let job = run
            .checkpoint
            .as_ref()
            .and_then(|c| c.get("job"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let record = match &job {
            Some(id) => store.job_by_id(id).await?,
            None => None,
        };
        match record {
            Some(job) if !job.state.is_settled() => {}
            Some(job) if job.state == toolfleet_core::JobState::Failed => {
                let error = json!({
                    "code": "tool_failed",
                    "message": format!("the run's loop failed on every attempt: {}", job.error.map(|e| e.message).unwrap_or_default()),
                });
                let update = UpdateRun {
                    version: Some(run.version),
                    error: Some(&error),
                    ..UpdateRun::new(&run.id, &[RunState::Running], RunState::Failed, now_ms())
                };
                if let Some(failed) = store.update_run(update).await? {
                    let _ = notices
                        .publish(&run_event(&failed, RunNotice::Failed, Vec::new()))
                        .await;
                    moved += 1;
                }
            }
            _ => {
                enqueue_loop(store, broker, &run).await?;
                moved += 1;
            }
        }
    }
    Ok(moved)
}

/// Looks again at runs waiting since before `before`, at most `limit`,
/// resuming those whose wait holds (a wake that a crash or a lost write
/// missed); answers how many it resumed.
pub async fn resume_stale(
    store: &dyn Store,
    broker: &dyn Broker,
    notices: &dyn Notices,
    before: i64,
    limit: u32,
) -> Result<usize, StoreError> {
    let stale = StaleRuns {
        state: RunState::Waiting,
        before,
        limit,
    };
    let mut resumed = 0;
    for run in store.stale_runs(stale).await? {
        if resume_if_ready(store, broker, notices, &run)
            .await?
            .is_some()
        {
            resumed += 1;
        }
    }
    Ok(resumed)
}
