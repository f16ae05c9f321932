//! A ticket's answer and what it wakes: the answer is recorded once (the
//! store's open -> answered), announced, and every job parked on the ticket
//! is moved by the lifecycle's `wake` and published at once (the sweeper
//! publishes any a failed publish misses). Who may answer is decided before
//! (the server's access rules, the ticket's `answered_by`): this module
//! takes the ticket as the caller already read it and allowed, and must
//! never be reached with one the caller may not answer.

use serde_json::Value;
use toolfleet_broker::{Broker, Notices};
use toolfleet_core::{ToolError, now_ms};
use toolfleet_store::{Answered, Store, TicketRecord};

use crate::dispatch::store_error;
use crate::events::ticket_event;

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
    }
    Ok(answered)
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
