//! A ticket's answer and what it wakes: the answer is recorded once (the
//! store's open -> answered), announced, and every job parked on the ticket
//! is moved by the lifecycle's `wake` and published at once (the sweeper
//! publishes any a failed publish misses). Who may answer is decided before
//! (the server's access rules, the ticket's `answered_by`): this module
//! takes the ticket as the caller already read it and allowed, and must
//! never be reached with one the caller may not answer.

use std::sync::Arc;

use serde_json::{Value, json};
use toolfleet_broker::{Broker, Notices};
use toolfleet_core::{CallCtx, Envelope, ErrorCode, Principal, Runtime, ToolError, new_id, now_ms};
use toolfleet_store::{Answered, SettleTicket, Store, TicketKind, TicketRecord};

use crate::dispatch::store_error;
use crate::events::ticket_event;
use crate::runs::{expired, wake_runs};

/// Answers `ticket` with `answer` (one of its options, when it has them),
/// tells subscribers, and wakes the jobs parked on it. What the store did
/// ([`Answered::Now`], or [`Answered::Already`] with the first answer), or
/// `None` when the ticket is gone; an answer that is not one of the
/// ticket's options is `invalid_arguments`.
pub async fn answer(
    store: &dyn Store,
    broker: &dyn Broker,
    notices: &dyn Notices,
    ticket: &TicketRecord,
    answer: &Value,
) -> Result<Option<Answered>, ToolError> {
    if ticket.kind == TicketKind::Approval {
        return Err(ToolError::invalid_arguments(format!(
            "ticket {} is an approval of a `{}` commit, not a question: approve it (POST /v1/tickets/{}/approve) or reject it (POST /v1/tickets/{}/reject)",
            ticket.id, ticket.tool, ticket.id, ticket.id
        )));
    }
    if ticket.kind == TicketKind::Input {
        return Err(ToolError::invalid_arguments(format!(
            "ticket {} is what `{}` asks its caller's MCP client: it is answered by that client, with tasks/update of the task",
            ticket.id, ticket.tool
        )));
    }
    if !ticket.options.is_empty()
        && !answer
            .as_str()
            .is_some_and(|a| ticket.options.iter().any(|o| o == a))
    {
        return Err(ToolError::invalid_arguments(format!(
            "answer must be one of the ticket's options: {}",
            ticket.options.join(", ")
        )));
    }
    let answered = store
        .answer_ticket(toolfleet_store::AnswerTicket {
            tenant: &ticket.tenant,
            id: &ticket.id,
            answer,
            now: now_ms(),
        })
        .await
        .map_err(store_error)?;
    if let Some(Answered::Now(ticket)) = &answered {
        let _ = notices.publish(&ticket_event(ticket)).await;
        wake_parked(store, broker, &ticket.id).await;
        wake_runs(store, broker, notices, &ticket.id).await;
    }
    Ok(answered)
}

/// What a person decided of an approval.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Run the commit.
    Approve,
    /// Do not; with why, if they said.
    Reject(Option<String>),
}

/// The backends and the runtime an approval's decision reaches: the
/// commit runs through `runtime`, its outcome is kept in `store`.
pub struct Deciding<'a> {
    /// Where tickets live.
    pub store: &'a dyn Store,
    /// What wakes parked jobs.
    pub broker: &'a dyn Broker,
    /// Where the ticket's event goes.
    pub notices: &'a dyn Notices,
    /// Runs the approved commit.
    pub runtime: &'a Arc<Runtime>,
}

/// Decides the approval `ticket` (read and allowed by the caller, as in
/// [`answer`]) by `by`: the decision is recorded once (the first stands);
/// an approval runs the command's commit exactly once (its confirm token
/// the key) and the ticket settles with the commit's envelope, a rejection
/// with `rejected`. Runs waiting on it resume. Answers the ticket as it
/// then stands; a question, or an approval decided or expired before, is
/// `invalid_arguments` or `conflict`.
pub async fn decide(
    on: &Deciding<'_>,
    ticket: &TicketRecord,
    decision: Decision,
    by: &str,
) -> Result<TicketRecord, ToolError> {
    if ticket.kind != TicketKind::Approval {
        return Err(ToolError::invalid_arguments(format!(
            "ticket {} is a question, not an approval: answer it (POST /v1/tickets/{}/answer)",
            ticket.id, ticket.id
        )));
    }
    let record = match &decision {
        Decision::Approve => json!({"decision": "approve", "by": by}),
        Decision::Reject(reason) => json!({"decision": "reject", "by": by, "reason": reason}),
    };
    let answered = on
        .store
        .answer_ticket(toolfleet_store::AnswerTicket {
            tenant: &ticket.tenant,
            id: &ticket.id,
            answer: &record,
            now: now_ms(),
        })
        .await
        .map_err(store_error)?;
    let decided = match answered {
        Some(Answered::Now(decided)) => decided,
        Some(Answered::Already(first)) => {
            let why = if first.expired_at.is_some() {
                format!("ticket {} expired before anyone decided it", first.id)
            } else {
                format!(
                    "ticket {} was decided already; the first decision stands",
                    first.id
                )
            };
            return Err(ToolError::new(ErrorCode::Conflict, why)
                .with_details(crate::events::ticket_view(&first)));
        }
        None => {
            return Err(ToolError::new(
                ErrorCode::NotFound,
                format!("no ticket {}", ticket.id),
            ));
        }
    };
    // Announced once settled: its event, and its callback's notice, carry
    // the outcome.
    let outcome = match decision {
        Decision::Approve => commit(on.runtime, &decided).await,
        Decision::Reject(reason) => Envelope::error(rejected(&decided, reason)),
    };
    settle(on, &decided, &outcome).await
}

/// The error of a commit a person rejected.
fn rejected(ticket: &TicketRecord, reason: Option<String>) -> ToolError {
    let said = reason
        .as_deref()
        .map(|r| format!(": {r}"))
        .unwrap_or_default();
    ToolError::new(
        ErrorCode::Rejected,
        format!(
            "the commit of `{}` was rejected{said}; do not commit it again as it was: change the plan, or ask the person what they want",
            ticket.tool
        ),
    )
    .with_details(json!({"ticket": ticket.id, "reason": reason}))
}

/// Runs an approved ticket's commit as the caller who made it.
async fn commit(runtime: &Arc<Runtime>, ticket: &TicketRecord) -> Envelope {
    let principal = Arc::new(Principal::new(
        &ticket.tenant,
        &ticket.user,
        ticket.scopes.clone(),
    ));
    let mut ctx = CallCtx::new(principal).with_run_id(ticket.run_id.clone());
    ctx.call_id = if ticket.call_id.is_empty() {
        new_id()
    } else {
        ticket.call_id.clone()
    };
    runtime
        .commit_approved(&ticket.tool, ticket.args.clone(), &ctx)
        .await
}

/// Records `outcome` as what `ticket` came to, announces it and resumes
/// the runs waiting on it; answers the ticket as stored.
async fn settle(
    on: &Deciding<'_>,
    ticket: &TicketRecord,
    outcome: &Envelope,
) -> Result<TicketRecord, ToolError> {
    let settled = on
        .store
        .settle_ticket(SettleTicket {
            tenant: &ticket.tenant,
            id: &ticket.id,
            outcome,
            now: now_ms(),
        })
        .await
        .map_err(store_error)?
        .unwrap_or_else(|| ticket.clone());
    let _ = on.notices.publish(&ticket_event(&settled)).await;
    wake_parked(on.store, on.broker, &settled.id).await;
    wake_runs(on.store, on.broker, on.notices, &settled.id).await;
    Ok(settled)
}

/// Expires the open tickets past their `expires_at` (at most `limit`),
/// each settling with `expired` and resuming what waits on it; then runs
/// the commits of approvals decided but never settled before `before` (a
/// process that stopped between the decision and the commit; the commit
/// log keeps each to one run). Answers how many tickets it settled.
pub async fn sweep_tickets(on: &Deciding<'_>, before: i64, limit: u32) -> Result<usize, ToolError> {
    let mut settled = 0;
    let expired_now = on
        .store
        .expire_tickets(now_ms(), limit)
        .await
        .map_err(store_error)?;
    for ticket in expired_now {
        settle(on, &ticket, &Envelope::error(expired(&ticket.id))).await?;
        settled += 1;
    }
    let unsettled = on
        .store
        .unsettled_tickets(before, limit)
        .await
        .map_err(store_error)?;
    for ticket in unsettled {
        let outcome = match (ticket.kind, ticket.answer.as_ref()) {
            (TicketKind::Approval, Some(answer)) if answer["decision"] == "approve" => {
                commit(on.runtime, &ticket).await
            }
            (TicketKind::Approval, Some(answer)) => {
                let reason = answer["reason"].as_str().map(str::to_owned);
                Envelope::error(rejected(&ticket, reason))
            }
            (_, Some(answer)) => Envelope::ok(
                toolfleet_core::Json::from(json!({"answer": answer})),
                ticket.call_id.clone(),
            ),
            (_, None) => continue,
        };
        settle(on, &ticket, &outcome).await?;
        settled += 1;
    }
    Ok(settled)
}

/// The member of a job's checkpoint naming the input ticket its tool
/// asked last (a job tool declared `asks_client`; see the worker).
const INPUT_CHECKPOINT: &str = "input";

/// The checkpoint of a job whose tool asked input ticket `ticket` in
/// `round`, handing on `state` (kept here, never shown to the client).
pub fn input_checkpoint(ticket: &str, round: u64, state: Option<&Value>) -> Value {
    json!({INPUT_CHECKPOINT: {"ticket": ticket, "round": round, "request_state": state}})
}

/// The input ticket a job's checkpoint names, if any.
pub fn input_ticket_of(checkpoint: Option<&Value>) -> Option<&str> {
    checkpoint?.get(INPUT_CHECKPOINT)?.get("ticket")?.as_str()
}

/// The round of the job's last question (0: it asked none).
pub fn input_round_of(checkpoint: Option<&Value>) -> u64 {
    checkpoint
        .and_then(|c| c.get(INPUT_CHECKPOINT))
        .and_then(|i| i.get("round"))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// The state the tool handed on with its last question, if any.
pub fn input_request_state(checkpoint: Option<&Value>) -> Option<Value> {
    checkpoint?
        .get(INPUT_CHECKPOINT)?
        .get("request_state")
        .filter(|s| !s.is_null())
        .cloned()
}

/// Records `responses` on the input ticket `ticket` (kind `input`, read
/// and allowed by the caller): keys it does not ask, or answered before,
/// are left out. The answer to its last pending request answers it,
/// announces it and wakes the job parked on it. The ticket as it then
/// stands, or `None` when it is gone.
pub async fn respond(
    store: &dyn Store,
    broker: &dyn Broker,
    notices: &dyn Notices,
    ticket: &TicketRecord,
    responses: &serde_json::Map<String, Value>,
) -> Result<Option<TicketRecord>, ToolError> {
    let responded = store
        .respond_ticket(toolfleet_store::RespondTicket {
            tenant: &ticket.tenant,
            id: &ticket.id,
            responses,
            now: now_ms(),
        })
        .await
        .map_err(store_error)?;
    Ok(match responded {
        Some(toolfleet_store::Responded::Answered(ticket)) => {
            let _ = notices.publish(&ticket_event(&ticket)).await;
            wake_parked(store, broker, &ticket.id).await;
            Some(ticket)
        }
        Some(toolfleet_store::Responded::Recorded(ticket)) => Some(ticket),
        None => None,
    })
}

/// Jobs parked on an answered ticket (agents waiting for this answer) are
/// due again: publish them now. The sweeper publishes any this misses.
pub async fn wake_parked(store: &dyn Store, broker: &dyn Broker, ticket: &str) {
    match store.wake(ticket, now_ms()).await {
        Ok(jobs) => {
            for job in jobs {
                if let Err(error) = broker
                    .publish_traced(&job.pool, &job.id, job.trace.as_ref())
                    .await
                {
                    tracing::warn!(job_id = %job.id, %error, "publishing a woken job failed; left to the sweeper");
                }
            }
        }
        Err(error) => tracing::warn!(ticket, %error, "waking the jobs parked on a ticket failed"),
    }
}
