//! The routes of runs and of people's decisions: `/v1/runs` (start, list,
//! read, messages, wait, cancel, events), the inbox (`GET /v1/tickets`)
//! and approvals (`approve`, `reject`). A run is its owner's and its
//! tenant's operators': anyone else's id answers exactly as a missing one.
//! Every state change is the store's compare-and-set; resuming and the
//! loop's job are the fleet's ([`toolfleet_fleet::runs`]).

use std::collections::BTreeMap;
use std::convert::Infallible;

use axum::body::Body;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use toolfleet_broker::{EventKind, EventState};
use toolfleet_core::{Envelope, ErrorCode, Json, Principal, ToolError, now_ms};
use toolfleet_fleet::runs::{enqueue_loop, resume_if_ready, run_event, run_view};
use toolfleet_fleet::tickets::{Deciding, Decision, decide};
use toolfleet_fleet::{store_error, ticket_view};
use toolfleet_store::{
    Answerer, CancelJob, ListRuns, ListTickets, NewRun, RunFilter, RunRecord, RunState, RunWait,
    TicketKind, TicketShown, UpdateRun,
};

use crate::AppState;
use crate::access;
use crate::routes::{
    Caller, Id, Params, bad_request, checked_fields, read_json, reply, take_stream, ticket_missing,
};

/// What `/v1/runs` knows of the declared assistants and its bounds.
#[derive(Debug, Clone, Default)]
pub struct RunSettings {
    /// Each assistant by name: the pool its loop runs on and how long one
    /// job of its loop may take, in milliseconds.
    pub assistants: BTreeMap<String, (String, u64)>,
    /// The largest checkpoint a caller may keep with a run, in bytes.
    pub checkpoint_bytes: usize,
}

/// A user's message: 1 to this many characters.
const MESSAGE_CHARS: usize = 32_000;
/// The most items one wait names.
const WAIT_ITEMS: usize = 100;
/// Runs or tickets per page.
const PAGE: u32 = 50;

fn run_missing(id: &str) -> Envelope {
    Envelope::error(ToolError::not_found(format!(
        "no run `{}` for this caller",
        toolfleet_core::registry::truncate(id, 64)
    )))
}

fn ok(value: Value) -> Envelope {
    Envelope::ok(Json::from(value), toolfleet_core::new_id())
}

fn conflict(message: String) -> Envelope {
    Envelope::error(ToolError::new(ErrorCode::Conflict, message))
}

/// True when `principal` may see and touch `run`.
fn owns(principal: &Principal, run: &RunRecord) -> bool {
    run.tenant == principal.tenant && (run.user == principal.user || principal.operates_fleet())
}

/// The caller's run `id`, or the answer to give instead.
pub(crate) async fn owned(
    state: &AppState,
    principal: &Principal,
    id: &str,
) -> Result<RunRecord, Envelope> {
    match state.store.run(&principal.tenant, id).await {
        Ok(Some(run)) if owns(principal, &run) => Ok(run),
        Ok(_) => Err(run_missing(id)),
        Err(error) => Err(Envelope::error(store_error(error))),
    }
}

/// The refusal of a checkpoint over its bound.
fn oversized(state: &AppState, checkpoint: &Value) -> Option<Envelope> {
    let size = checkpoint.to_string().len();
    let max = state.runs.checkpoint_bytes;
    (size > max).then(|| {
        Envelope::error(ToolError::new(
            ErrorCode::PayloadTooLarge,
            format!("the checkpoint is {size} bytes; a run keeps at most {max}: keep less in it (ids, not documents)"),
        ))
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StartRequest {
    agent: Option<String>,
    input: Option<String>,
    checkpoint: Option<Value>,
    callback_url: Option<String>,
    idempotency_key: Option<String>,
}

pub(crate) async fn start(
    State(state): State<AppState>,
    Caller(principal): Caller,
    body: Body,
) -> Response {
    let request: StartRequest = match read_json(&state, body).await {
        Ok(r) => r,
        Err(refusal) => return refusal.into_response(),
    };
    let fields = [
        ("idempotency_key", request.idempotency_key.as_deref(), 255),
        ("callback_url", request.callback_url.as_deref(), 2048),
        ("agent", request.agent.as_deref(), 128),
    ];
    if let Some(refused) =
        checked_fields(&state, &principal, &fields, request.callback_url.as_deref()).await
    {
        return refused;
    }
    let checkpoint = match (&request.agent, request.checkpoint, request.input) {
        (Some(agent), None, Some(input)) => {
            let Some((pool, timeout_ms)) = state.runs.assistants.get(agent) else {
                let known: Vec<&str> = state.runs.assistants.keys().map(String::as_str).collect();
                return reply(&Envelope::error(ToolError::invalid_arguments(format!(
                    "no assistant `{}` is declared; declared: {}",
                    toolfleet_core::registry::truncate(agent, 64),
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ))));
            };
            if input.trim().is_empty() || input.chars().count() > MESSAGE_CHARS {
                return reply(&Envelope::error(ToolError::invalid_arguments(format!(
                    "`input` is the user's first message: 1 to {MESSAGE_CHARS} characters"
                ))));
            }
            toolfleet_fleet::runs::first_checkpoint(pool, *timeout_ms, &input)
        }
        (Some(_), _, _) => {
            return reply(&Envelope::error(ToolError::invalid_arguments(
                "a run of an assistant takes `agent` and `input`, and no `checkpoint` (the runtime keeps its loop's)",
            )));
        }
        (None, checkpoint, None) => {
            let checkpoint = checkpoint.unwrap_or_else(|| json!({}));
            if let Some(refused) = oversized(&state, &checkpoint) {
                return reply(&refused);
            }
            checkpoint
        }
        (None, _, Some(_)) => {
            return reply(&Envelope::error(ToolError::invalid_arguments(
                "`input` goes to an assistant: name it in `agent`, or drive the run yourself with `checkpoint` alone",
            )));
        }
    };
    let new = NewRun {
        id: format!("run_{}", uuid::Uuid::now_v7().simple()),
        tenant: principal.tenant.clone(),
        user: principal.user.clone(),
        agent: request.agent,
        checkpoint: Some(checkpoint),
        callback_url: request.callback_url,
        idempotency_key: request.idempotency_key,
        scopes: principal.scopes.iter().cloned().collect(),
        now: now_ms(),
    };
    let inserted = match state.store.insert_run(new).await {
        Ok(inserted) => inserted,
        Err(error) => return reply(&Envelope::error(store_error(error))),
    };
    let run = inserted.run().clone();
    if let toolfleet_store::RunInserted::Created(run) = &inserted
        && run.agent.is_some()
        && let Err(error) = enqueue_loop(state.store.as_ref(), state.broker.as_ref(), run).await
    {
        return reply(&Envelope::error(store_error(error)));
    }
    reply(&ok(run_view(&run, true)))
}

#[derive(Deserialize)]
pub(crate) struct ListQuery {
    state: Option<String>,
    agent: Option<String>,
    cursor: Option<String>,
}

pub(crate) async fn list(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Params(q): Params<ListQuery>,
) -> Response {
    let run_state = match q.state.as_deref().map(|s| (s, RunState::parse(s))) {
        None => None,
        Some((_, Some(parsed))) => Some(parsed),
        Some((given, None)) => {
            let names: Vec<&str> = RunState::ALL.iter().map(|s| s.as_str()).collect();
            return bad_request(format!(
                "`state` must be one of {}; got `{}`",
                names.join(", "),
                toolfleet_core::registry::truncate(given, 32)
            ));
        }
    };
    if q.cursor.as_deref().is_some_and(|c| c.len() > 256)
        || q.agent.as_deref().is_some_and(|a| a.len() > 128)
    {
        return bad_request("`cursor` and `agent` are at most 256 and 128 characters");
    }
    let filter = RunFilter {
        state: run_state,
        agent: q.agent,
        user: (!principal.operates_fleet()).then(|| principal.user.clone()),
    };
    let list = ListRuns {
        tenant: &principal.tenant,
        filter: &filter,
        limit: PAGE,
        cursor: q.cursor.as_deref(),
    };
    match state.store.list_runs(list).await {
        Ok(page) => {
            let runs: Vec<Value> = page.runs.iter().map(|r| run_view(r, false)).collect();
            reply(&ok(json!({"runs": runs, "next_cursor": page.next_cursor})))
        }
        Err(error) => reply(&Envelope::error(store_error(error))),
    }
}

pub(crate) async fn read(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(id): Id,
) -> Response {
    match owned(&state, &principal, &id).await {
        Ok(run) => reply(&ok(run_view(&run, true))),
        Err(answer) => reply(&answer),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MessageRequest {
    content: String,
}

pub(crate) async fn message(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(id): Id,
    body: Body,
) -> Response {
    let request: MessageRequest = match read_json(&state, body).await {
        Ok(r) => r,
        Err(refusal) => return refusal.into_response(),
    };
    if request.content.trim().is_empty() || request.content.chars().count() > MESSAGE_CHARS {
        return reply(&Envelope::error(ToolError::invalid_arguments(format!(
            "`content` is the user's next message: 1 to {MESSAGE_CHARS} characters"
        ))));
    }
    let run = match owned(&state, &principal, &id).await {
        Ok(run) => run,
        Err(answer) => return reply(&answer),
    };
    if run.agent.is_none() {
        return reply(&conflict(format!(
            "run {id} is driven by its caller: its messages are the caller's own; messages go to an assistant's run"
        )));
    }
    if run.state != RunState::Answered {
        return reply(&conflict(format!(
            "run {id} is {}: a message goes to a run that answered; wait for its answer (GET /v1/runs/{id}) and send it then",
            run.state
        )));
    }
    let mut checkpoint = run.checkpoint.clone().unwrap_or_else(|| json!({}));
    match checkpoint.get_mut("inbox").and_then(Value::as_array_mut) {
        Some(inbox) => inbox.push(Value::String(request.content)),
        None => checkpoint["inbox"] = json!([request.content]),
    }
    let update = UpdateRun {
        version: Some(run.version),
        checkpoint: Some(&checkpoint),
        ..UpdateRun::new(&run.id, &[RunState::Answered], RunState::Running, now_ms())
    };
    let running = match state.store.update_run(update).await {
        Ok(Some(running)) => running,
        Ok(None) => {
            return reply(&conflict(format!(
                "run {id} moved on while the message came; read it and send again if it answered"
            )));
        }
        Err(error) => return reply(&Envelope::error(store_error(error))),
    };
    if let Err(error) = enqueue_loop(state.store.as_ref(), state.broker.as_ref(), &running).await {
        return reply(&Envelope::error(store_error(error)));
    }
    reply(&ok(run_view(&running, true)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WaitRequest {
    #[serde(rename = "for", default)]
    wait_for: toolfleet_store::WaitFor,
    #[serde(default)]
    jobs: Vec<String>,
    #[serde(default)]
    tickets: Vec<String>,
    checkpoint: Option<Value>,
}

pub(crate) async fn wait(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(id): Id,
    body: Body,
) -> Response {
    let request: WaitRequest = match read_json(&state, body).await {
        Ok(r) => r,
        Err(refusal) => return refusal.into_response(),
    };
    let count = request.jobs.len() + request.tickets.len();
    if count == 0 || count > WAIT_ITEMS {
        return reply(&Envelope::error(ToolError::invalid_arguments(format!(
            "a wait names 1 to {WAIT_ITEMS} jobs and tickets; it names {count}"
        ))));
    }
    if let Some(refused) = request
        .checkpoint
        .as_ref()
        .and_then(|c| oversized(&state, c))
    {
        return reply(&refused);
    }
    let run = match owned(&state, &principal, &id).await {
        Ok(run) => run,
        Err(answer) => return reply(&answer),
    };
    if run.agent.is_some() {
        return reply(&conflict(format!(
            "run {id} is an assistant's: the runtime parks it on what it starts; only a run its caller drives is parked with /wait"
        )));
    }
    if !matches!(run.state, RunState::Running | RunState::Answered) {
        return reply(&conflict(format!(
            "run {id} is {}: only a running or answered run parks; a waiting one resumes first",
            run.state
        )));
    }
    // Each item the caller's own: another's reads as missing.
    for job in &request.jobs {
        match state.store.job(&principal.tenant, job).await {
            Ok(Some(record)) if access::sees_job(&principal, &record) => {}
            Ok(_) => {
                return reply(&Envelope::error(ToolError::not_found(format!(
                    "no job `{}` for this caller",
                    toolfleet_core::registry::truncate(job, 64)
                ))));
            }
            Err(error) => return reply(&Envelope::error(store_error(error))),
        }
    }
    for ticket in &request.tickets {
        match state.store.ticket(&principal.tenant, ticket).await {
            Ok(Some(record)) if access::sees_ticket(&principal, &record) => {}
            Ok(_) => return reply(&ticket_missing(ticket)),
            Err(error) => return reply(&Envelope::error(store_error(error))),
        }
    }
    let wait = RunWait {
        wait_for: request.wait_for,
        jobs: request.jobs,
        tickets: request.tickets,
    };
    let update = UpdateRun {
        version: Some(run.version),
        checkpoint: request.checkpoint.as_ref(),
        wait: Some(&wait),
        ..UpdateRun::new(
            &run.id,
            &[RunState::Running, RunState::Answered],
            RunState::Waiting,
            now_ms(),
        )
    };
    let waiting = match state.store.update_run(update).await {
        Ok(Some(waiting)) => waiting,
        Ok(None) => {
            return reply(&conflict(format!(
                "run {id} moved on; read it and wait again"
            )));
        }
        Err(error) => return reply(&Envelope::error(store_error(error))),
    };
    let _ = state
        .notices
        .publish(&run_event(
            &waiting,
            toolfleet_broker::RunNotice::Waiting,
            Vec::new(),
        ))
        .await;
    // Settled already: nobody else would wake it.
    let (store, broker, notices) = (
        state.store.as_ref(),
        state.broker.as_ref(),
        state.notices.as_ref(),
    );
    match resume_if_ready(store, broker, notices, &waiting).await {
        Ok(Some(resumed)) => return reply(&ok(run_view(&resumed, true))),
        Ok(None) => {}
        Err(error) => {
            tracing::warn!(run_id = %waiting.id, %error, "resuming a run whose wait held failed; left to the sweeper")
        }
    }
    // Not resumed by this call: as it stands now (a waker may have).
    match state.store.run(&principal.tenant, &id).await {
        Ok(Some(run)) => reply(&ok(run_view(&run, true))),
        _ => reply(&ok(run_view(&waiting, true))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AnswerRunRequest {
    answer: String,
    checkpoint: Option<Value>,
}

/// `POST /v1/runs/{id}/answer`: the caller's loop answered; the run is
/// `answered` (a later `/wait` continues it) and its callback hears
/// `run.answered`.
pub(crate) async fn answer(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(id): Id,
    body: Body,
) -> Response {
    let request: AnswerRunRequest = match read_json(&state, body).await {
        Ok(r) => r,
        Err(refusal) => return refusal.into_response(),
    };
    if request.answer.chars().count() > MESSAGE_CHARS {
        return reply(&Envelope::error(ToolError::invalid_arguments(format!(
            "`answer` is at most {MESSAGE_CHARS} characters"
        ))));
    }
    if let Some(refused) = request
        .checkpoint
        .as_ref()
        .and_then(|c| oversized(&state, c))
    {
        return reply(&refused);
    }
    let run = match owned(&state, &principal, &id).await {
        Ok(run) => run,
        Err(answer) => return reply(&answer),
    };
    if run.agent.is_some() || run.state != RunState::Running {
        return reply(&conflict(format!(
            "run {id} is {}{}: only a running run its caller drives takes its caller's answer",
            run.state,
            if run.agent.is_some() {
                " and an assistant's"
            } else {
                ""
            }
        )));
    }
    let update = UpdateRun {
        version: Some(run.version),
        checkpoint: request.checkpoint.as_ref(),
        answer: Some(&request.answer),
        ..UpdateRun::new(&run.id, &[RunState::Running], RunState::Answered, now_ms())
    };
    let answered = match state.store.update_run(update).await {
        Ok(Some(answered)) => answered,
        Ok(None) => return reply(&conflict(format!("run {id} moved on; read it first"))),
        Err(error) => return reply(&Envelope::error(store_error(error))),
    };
    announced(&state, &answered, toolfleet_broker::RunNotice::Answered).await
}

/// Announces `run`'s `notice` and answers the run.
async fn announced(
    state: &AppState,
    run: &RunRecord,
    notice: toolfleet_broker::RunNotice,
) -> Response {
    if let Err(error) = state
        .notices
        .publish(&run_event(run, notice, Vec::new()))
        .await
    {
        tracing::warn!(run_id = %run.id, %error, "announcing a run failed");
    }
    reply(&ok(run_view(run, true)))
}

pub(crate) async fn cancel(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(id): Id,
) -> Response {
    let run = match owned(&state, &principal, &id).await {
        Ok(run) => run,
        Err(answer) => return reply(&answer),
    };
    if run.state.is_final() {
        return reply(&ok(run_view(&run, true)));
    }
    let from = [RunState::Running, RunState::Waiting, RunState::Answered];
    let update = UpdateRun::new(&run.id, &from, RunState::Cancelled, now_ms());
    let cancelled = match state.store.update_run(update).await {
        Ok(Some(cancelled)) => cancelled,
        Ok(None) => {
            return match owned(&state, &principal, &id).await {
                Ok(run) => reply(&ok(run_view(&run, true))),
                Err(answer) => reply(&answer),
            };
        }
        Err(error) => return reply(&Envelope::error(store_error(error))),
    };
    // What it waited on stops too.
    for job in run.wait.iter().flat_map(|w| w.jobs.iter()) {
        let cancel = CancelJob {
            tenant: &run.tenant,
            id: job,
            now: now_ms(),
        };
        if let Ok(Some(job)) = state.store.cancel(cancel).await {
            let _ = state
                .notices
                .publish(&toolfleet_fleet::job_event(
                    &job,
                    toolfleet_fleet::dispatch::POLL_AFTER_S,
                ))
                .await;
        }
    }
    announced(&state, &cancelled, toolfleet_broker::RunNotice::Cancelled).await
}

/// `GET /v1/runs/{id}/events`: the run's steps as they happen, until it
/// answers or stops.
pub(crate) async fn events(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(id): Id,
) -> Response {
    let run = match owned(&state, &principal, &id).await {
        Ok(run) => run,
        Err(answer) => return reply(&answer),
    };
    let held = match take_stream(&state, &principal) {
        Ok(held) => held,
        Err(refused) => return *refused,
    };
    let subscription = match state.notices.subscribe().await {
        Ok(s) => s,
        Err(error) => {
            return reply(&Envelope::error(ToolError::new(
                ErrorCode::Unavailable,
                format!("events are unavailable ({error})"),
            )));
        }
    };
    // What it is now, first: a client that connects late still learns it.
    let transcript = run_view(&run, true)["transcript"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut first = run_event(
        &run,
        toolfleet_fleet::runs::notice_of(run.state),
        transcript,
    );
    std::sync::Arc::make_mut(&mut first.body)["from"] = json!(0);
    let stopping = state.stopping.clone();
    let start = (Some(first), subscription, false);
    let stream = futures_util::stream::unfold(start, move |(first, mut subscription, ended)| {
        let _held = &held;
        let id = id.clone();
        let mut stopping = stopping.clone();
        async move {
            if ended {
                return None;
            }
            let event = match first {
                Some(first) => first,
                None => loop {
                    let event = tokio::select! {
                        event = subscription.next() => event?,
                        _ = stopping.wait_for(|stop| *stop) => return None,
                    };
                    if event.kind == EventKind::Run && event.id == id {
                        break event;
                    }
                },
            };
            let state = event.body["state"].as_str().unwrap_or("").to_owned();
            let over = matches!(
                RunState::parse(&state),
                Some(
                    RunState::Answered
                        | RunState::Failed
                        | RunState::BudgetExceeded
                        | RunState::Cancelled
                )
            );
            let name = match event.state {
                EventState::Run(notice) => format!("run.{}", notice.name()),
                other => other.to_string(),
            };
            let sse = SseEvent::default().event(name).data(event.body.to_string());
            Some((Ok::<_, Infallible>(sse), (None, subscription, over)))
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

#[derive(Deserialize)]
pub(crate) struct InboxQuery {
    state: Option<String>,
    kind: Option<String>,
    cursor: Option<String>,
}

/// `GET /v1/tickets`: the tickets the caller may answer, newest first.
pub(crate) async fn inbox(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Params(q): Params<InboxQuery>,
) -> Response {
    let shown = match q.state.as_deref() {
        None => None,
        Some("open") => Some(TicketShown::Open),
        Some("answered") => Some(TicketShown::Answered),
        Some(_) => return bad_request("`state` is `open` or `answered`"),
    };
    let kind = match q.kind.as_deref() {
        None => None,
        Some(kind) => match TicketKind::parse(kind) {
            Some(kind) => Some(kind),
            None => return bad_request("`kind` is `question` or `approval`"),
        },
    };
    if q.cursor.as_deref().is_some_and(|c| c.len() > 256) {
        return bad_request("`cursor` is at most 256 characters");
    }
    let answerer = if principal.operates_fleet() {
        Answerer::Operator
    } else {
        Answerer::User {
            user: principal.user.clone(),
            scopes: principal.scopes.iter().cloned().collect(),
        }
    };
    let list = ListTickets {
        tenant: &principal.tenant,
        answerer: &answerer,
        shown,
        kind,
        limit: PAGE,
        cursor: q.cursor.as_deref(),
    };
    match state.store.list_tickets(list).await {
        Ok(page) => {
            let tickets: Vec<Value> = page.tickets.iter().map(ticket_view).collect();
            reply(&ok(
                json!({"tickets": tickets, "next_cursor": page.next_cursor}),
            ))
        }
        Err(error) => reply(&Envelope::error(store_error(error))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ApproveRequest {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RejectRequest {
    reason: Option<String>,
}

pub(crate) async fn approve(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(id): Id,
    body: Body,
) -> Response {
    let _: ApproveRequest = match read_json(&state, body).await {
        Ok(r) => r,
        Err(refusal) => return refusal.into_response(),
    };
    decided(&state, &principal, &id, Decision::Approve).await
}

pub(crate) async fn reject(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(id): Id,
    body: Body,
) -> Response {
    let request: RejectRequest = match read_json(&state, body).await {
        Ok(r) => r,
        Err(refusal) => return refusal.into_response(),
    };
    if request
        .reason
        .as_deref()
        .is_some_and(|r| r.chars().count() > 2000)
    {
        return bad_request("`reason` is at most 2,000 characters");
    }
    decided(&state, &principal, &id, Decision::Reject(request.reason)).await
}

/// Decides ticket `id` as `principal`, who must be one who may answer it,
/// and audits who did.
async fn decided(
    state: &AppState,
    principal: &Principal,
    id: &str,
    decision: Decision,
) -> Response {
    let action = match decision {
        Decision::Approve => "approve_ticket",
        Decision::Reject(_) => "reject_ticket",
    };
    let envelope = decide_unaudited(state, principal, id, decision).await;
    let args = json!({"ticket": toolfleet_core::registry::truncate(id, 64)});
    state.access.audit(principal, action, args, &envelope);
    reply(&envelope)
}

async fn decide_unaudited(
    state: &AppState,
    principal: &Principal,
    id: &str,
    decision: Decision,
) -> Envelope {
    let ticket = match state.store.ticket(&principal.tenant, id).await {
        Ok(Some(ticket)) if access::sees_ticket(principal, &ticket) => ticket,
        Ok(_) => return ticket_missing(id),
        Err(error) => return Envelope::error(store_error(error)),
    };
    if !access::answers_ticket(principal, &ticket) {
        return Envelope::error(ToolError::new(
            ErrorCode::Forbidden,
            format!(
                "ticket `{id}` is decided by whom its tool or assistant names, or by an operator"
            ),
        ));
    }
    let on = Deciding {
        store: state.store.as_ref(),
        broker: state.broker.as_ref(),
        notices: state.notices.as_ref(),
        runtime: &state.runtime,
    };
    match decide(&on, &ticket, decision, &principal.user).await {
        Ok(ticket) => Envelope::ok(Json::from(ticket_view(&ticket)), ticket.call_id.clone()),
        Err(error) => Envelope::error(error),
    }
}
