//! The events that announce a change of a job or a ticket: what `/v1/events`,
//! long polls, webhooks, workers' cancel followers and waiting agents hear.
//! Each is made from the record as the store now has it, never from what a
//! caller believes, and shows a job's state as the contract does (a parked
//! job is `retrying`).

use serde_json::json;
use toolfleet_broker::{Event, EventState, TicketState};
use toolfleet_store::{JobRecord, TicketRecord};

/// The event announcing `job` as it stands: its `get_job` envelope with the
/// poll hint `poll_after_s`, and whether its call named a callback.
pub fn job_event(job: &JobRecord, poll_after_s: u32) -> Event {
    let envelope = job.envelope(poll_after_s);
    let mut event = Event::job(
        &job.id,
        (&job.tenant, &job.user),
        &job.tool,
        job.state,
        &job.run_id,
        &envelope,
    );
    event.callback = job.callback_url.is_some();
    event.life = job.requeues;
    event
}

/// The event announcing `ticket` as it stands: `open` or `answered`, to
/// its owner and to those its tool names as who may answer it.
pub fn ticket_event(ticket: &TicketRecord) -> Event {
    Event {
        kind: toolfleet_broker::EventKind::Ticket,
        id: ticket.id.clone(),
        tenant: ticket.tenant.clone(),
        user: ticket.user.clone(),
        audience: ticket.answered_by.scope().map(str::to_owned),
        tool: ticket.tool.clone(),
        state: ticket_state(ticket),
        run_id: ticket.run_id.clone(),
        body: ticket_view(ticket).into(),
        callback: ticket.callback_url.is_some(),
        life: 0,
    }
}

/// `answered` once a ticket has its answer (or expired), else `open`.
fn ticket_state(ticket: &TicketRecord) -> EventState {
    EventState::Ticket(if !ticket.is_open() {
        TicketState::Answered
    } else {
        TicketState::Open
    })
}

/// A ticket as clients read it.
pub fn ticket_view(ticket: &TicketRecord) -> serde_json::Value {
    let mut view = ticket_fields(ticket);
    if ticket.kind == toolfleet_store::TicketKind::Input
        && let Some(fields) = view.as_object_mut()
    {
        // What the tool asks its caller's MCP client, and which keys no
        // answer reached yet.
        let pending: Vec<String> = ticket.pending_inputs().keys().cloned().collect();
        fields.insert("input_requests".into(), json!(ticket.input_requests));
        fields.insert("pending".into(), json!(pending));
    }
    view
}

fn ticket_fields(ticket: &TicketRecord) -> serde_json::Value {
    json!({
        "ticket": ticket.id,
        "tool": ticket.tool,
        "question": ticket.question,
        "options": ticket.options,
        "state": if ticket.expired_at.is_some() { "expired" } else { ticket_state(ticket).as_str() },
        "kind": ticket.kind.as_str(),
        "plan": ticket.plan,
        "answer": ticket.answer,
        "outcome": ticket.outcome,
        "answered_by": ticket.answered_by,
        "run_id": ticket.run_id,
        "created_at": ticket.created_at,
        "answered_at": ticket.answered_at,
        "expires_at": ticket.expires_at,
    })
}
