//! The routes of docs/API.md. Each handler authenticates, reads its input with
//! bounds, and answers an envelope; transport failures use the HTTP codes of
//! the contract (400, 401, 413, 503) with the same envelope as body.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::handler::Handler;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, any, get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use toolfleet_broker::{Broker, EventKind, EventState, Notices};
use toolfleet_core::adapters::{Format, tool_specs};
use toolfleet_core::metrics::{Denial, UNKNOWN_TOOL};
use toolfleet_core::{
    CallCtx, Envelope, ErrorCode, FLEET_OPERATE, JobState, Json, Principal, ToolError,
};
use toolfleet_store::{Answered, JobFilter, Store, TicketRecord};

use crate::AppState;
use crate::access::{self, Access};
use crate::metrics::{health_response, metrics_response, ready_response};
use crate::openapi::{self, Op, Route, Verb};
use toolfleet_fleet::{store_error, ticket_view};

/// The router of every route: the API's and the console's.
pub fn router(state: AppState) -> Router {
    let api = api_router(state.clone());
    api.clone().merge(crate::console::routes(state, api))
}

/// The routes of the API alone: what the console calls in process. They
/// are exactly those of [`openapi::ROUTES`], each operation mounted on its
/// handler, so the document served at `/v1/openapi.json` names every route
/// and no other.
fn api_router(state: AppState) -> Router {
    let body_timeout = state.limits.body_read_timeout;
    let document: Arc<str> =
        Arc::from(openapi::document(&state.limits, state.metrics_on_api).to_string());
    let mut router = Router::new();
    for route in openapi::ROUTES {
        if route.op == Op::Metrics && !state.metrics_on_api {
            continue;
        }
        router = router.route(route.path, handler(route, &state, &document));
    }
    router
        .fallback(|| async {
            reply_error(
                StatusCode::NOT_FOUND,
                ToolError::new(ErrorCode::NotFound, "no such route; see docs/API.md"),
            )
        })
        .layer(axum::middleware::from_fn(move |request, next| {
            crate::http::body_deadline(body_timeout, request, next)
        }))
        .with_state(state)
}

/// `handler` on the method of `verb`.
fn on<H, T>(verb: Verb, handler: H) -> MethodRouter<AppState>
where
    H: Handler<T, AppState>,
    T: 'static,
{
    match verb {
        Verb::Get => get(handler),
        Verb::Post => post(handler),
        Verb::Any => any(handler),
    }
}

/// The handler of `route`'s operation.
fn handler(route: Route, state: &AppState, document: &Arc<str>) -> MethodRouter<AppState> {
    let verb = route.verb;
    match route.op {
        Op::ListTools => on(verb, tools),
        Op::Call => on(verb, call),
        Op::ListJobs => on(verb, list_jobs),
        Op::GetJob => on(verb, read_job),
        Op::GetJobRecord => on(verb, job_record),
        Op::CancelJob => on(verb, cancel),
        Op::RetryJob => on(verb, crate::retry::retry_one),
        Op::RetryJobs => on(verb, crate::retry::retry_many),
        Op::GetQueues => on(verb, queues),
        Op::ListSchedules => on(verb, crate::schedules::list),
        Op::PauseSchedule => on(verb, crate::schedules::pause),
        Op::ResumeSchedule => on(verb, crate::schedules::resume),
        Op::ListTickets => on(verb, crate::runs::inbox),
        Op::GetTicket => on(verb, read_ticket),
        Op::AnswerTicket => on(verb, answer_ticket),
        Op::ApproveTicket => on(verb, crate::runs::approve),
        Op::RejectTicket => on(verb, crate::runs::reject),
        Op::StartRun => on(verb, crate::runs::start),
        Op::ListRuns => on(verb, crate::runs::list),
        Op::GetRun => on(verb, crate::runs::read),
        Op::MessageRun => on(verb, crate::runs::message),
        Op::WaitRun => on(verb, crate::runs::wait),
        Op::AnswerRun => on(verb, crate::runs::answer),
        Op::CancelRun => on(verb, crate::runs::cancel),
        Op::RunEvents => on(verb, crate::runs::events),
        Op::Events => on(verb, events),
        Op::Mcp => {
            let endpoint = crate::mcp::endpoint(state);
            on(
                verb,
                move |State(state): State<AppState>, request: axum::extract::Request| {
                    let endpoint = endpoint.clone();
                    async move { crate::mcp::mcp(&endpoint, &state, request).await }
                },
            )
        }
        Op::McpMetadata | Op::McpMetadataOfMcp => on(verb, crate::mcp::metadata),
        Op::OpenApi => {
            let document = document.clone();
            on(verb, move || {
                let document = document.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, "application/json")],
                        document.to_string(),
                    )
                }
            })
        }
        Op::Health => on(verb, || async { health_response() }),
        Op::Ready => on(verb, |State(state): State<AppState>| async move {
            ready_response(&state.ops).await
        }),
        Op::Metrics => on(verb, |State(state): State<AppState>| async move {
            metrics_response(&state.ops).await
        }),
    }
}

/// An envelope as an HTTP answer. `unavailable` is a 503 with `Retry-After`.
pub(crate) fn reply(envelope: &Envelope) -> Response {
    let status = match envelope.error_code() {
        Some(ErrorCode::Unavailable) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::OK,
    };
    with_status(status, envelope)
}

fn with_status(status: StatusCode, envelope: &Envelope) -> Response {
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        envelope.to_json(),
    )
        .into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS {
        let seconds = match envelope {
            Envelope::Error { error, .. } => error.retry_after_s.unwrap_or(2),
            _ => 2,
        };
        if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
    }
    response
}

pub(crate) fn reply_error(status: StatusCode, error: ToolError) -> Response {
    with_status(status, &Envelope::error(error))
}

pub(crate) fn bad_request(message: impl Into<String>) -> Response {
    reply_error(
        StatusCode::BAD_REQUEST,
        ToolError::new(ErrorCode::BadRequest, message),
    )
}

/// The error of `fields` (name, value, most characters) when one is empty
/// or too long.
pub(crate) fn field_error(fields: &[(&str, Option<&str>, usize)]) -> Option<ToolError> {
    let (field, _, max) = fields
        .iter()
        .find(|(_, v, max)| v.is_some_and(|v| v.is_empty() || v.len() > *max))?;
    Some(ToolError::new(
        ErrorCode::BadRequest,
        format!("`{field}` must be 1 to {max} characters"),
    ))
}

/// The error of a `callback_url` the tenant's allow-list refuses (it is
/// checked again before each delivery, which connects only to the
/// addresses that pass then).
async fn callback_error(state: &AppState, principal: &Principal, url: &str) -> Option<ToolError> {
    let allow = &state.webhooks.of(&principal.tenant).allow;
    let refusal = crate::callbacks::check(url, allow).await.err()?;
    Some(ToolError::new(ErrorCode::BadRequest, refusal.message()))
}

/// The 400 of a request whose `fields` are empty or too long, or whose
/// `callback_url` the tenant's allow-list refuses; `None` when they pass.
pub(crate) async fn checked_fields(
    state: &AppState,
    principal: &Principal,
    fields: &[(&str, Option<&str>, usize)],
    callback_url: Option<&str>,
) -> Option<Response> {
    let error = match field_error(fields) {
        Some(error) => Some(error),
        None => match callback_url {
            Some(url) => callback_error(state, principal, url).await,
            None => None,
        },
    };
    error.map(|error| reply_error(StatusCode::BAD_REQUEST, error))
}

/// Takes one of the event streams `principal` and the process may hold,
/// or the answer when they hold all they may.
pub(crate) fn take_stream(
    state: &AppState,
    principal: &Principal,
) -> Result<crate::bounds::Held, Box<Response>> {
    state.streams.take(principal).map_err(|full| {
        let status = match full {
            crate::bounds::Full::Principal => StatusCode::TOO_MANY_REQUESTS,
            crate::bounds::Full::Process => StatusCode::SERVICE_UNAVAILABLE,
        };
        Box::new(reply_error(status, full.error("event streams")))
    })
}

/// A request refused before it reached a tool.
pub(crate) struct Refusal {
    status: StatusCode,
    error: Box<ToolError>,
}

impl Refusal {
    fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        Refusal {
            status,
            error: Box::new(ToolError::new(code, message)),
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut response = reply_error(self.status, *self.error);
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// The authenticated caller of a route: the bearer token's principal.
pub(crate) struct Caller(pub(crate) Arc<Principal>);

impl FromRequestParts<AppState> for Caller {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Refusal> {
        // The console's request in process, made for its signed-in
        // principal: the extension is only ever set inside this process.
        if let Some(crate::console::Signed(principal)) = parts.extensions.get() {
            return Ok(Caller(principal.clone()));
        }
        let header = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        state.auth.principal(header).map(Caller).map_err(|error| {
            // Refused before any body is read: no tool is known yet.
            state
                .runtime
                .metrics()
                .denied(UNKNOWN_TOOL, Denial::Unauthenticated);
            Refusal {
                status: StatusCode::UNAUTHORIZED,
                error: Box::new(error),
            }
        })
    }
}

/// A query string of `T`, or the contract's 400 envelope when it does not
/// read as one (a parameter twice, a number that is not one).
pub(crate) struct Params<T>(pub(crate) T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(params)) => Ok(Params(params)),
            Err(rejection) => Err(bad_request(format!(
                "the query is not what this route takes: {}",
                toolfleet_core::registry::truncate(&rejection.body_text(), 256)
            ))),
        }
    }
}

/// The one id of a route's path, or the contract's 400 envelope when it
/// does not decode (percent-encoding that is not UTF-8).
pub(crate) struct Id(pub(crate) String);

impl<S: Send + Sync> FromRequestParts<S> for Id {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(id)) => Ok(Id(id)),
            Err(rejection) => Err(bad_request(format!(
                "the path is not what this route takes: {}",
                toolfleet_core::registry::truncate(&rejection.body_text(), 256)
            ))),
        }
    }
}

/// Reads a JSON body of at most `limits.max_body` bytes. A larger body is
/// read on (and dropped) up to a further bound, so the client reads the 413
/// instead of a reset connection.
pub(crate) async fn read_json<T: serde::de::DeserializeOwned>(
    state: &AppState,
    body: Body,
) -> Result<T, Refusal> {
    use futures_util::StreamExt;
    let limit = state.limits.max_body;
    let mut bytes = Vec::new();
    let mut seen = 0usize;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(error) if crate::http::timed_out(&error) => {
                return Err(Refusal::new(
                    StatusCode::REQUEST_TIMEOUT,
                    ErrorCode::Timeout,
                    format!(
                        "the body did not arrive within {} s; send it whole, promptly",
                        state.limits.body_read_timeout.as_secs_f64()
                    ),
                ));
            }
            Err(_) => {
                return Err(Refusal::new(
                    StatusCode::BAD_REQUEST,
                    ErrorCode::BadRequest,
                    "the body could not be read",
                ));
            }
        };
        seen = seen.saturating_add(chunk.len());
        if seen <= limit {
            bytes.extend_from_slice(&chunk);
        } else if seen > limit.saturating_mul(16) {
            break;
        }
    }
    if seen > limit {
        return Err(Refusal::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::PayloadTooLarge,
            format!("the body is larger than {limit} bytes; send less"),
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            format!("the body is not the JSON this route takes: {e}"),
        )
    })
}

#[derive(Deserialize)]
struct ToolsQuery {
    format: Option<String>,
}

async fn tools(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Params(q): Params<ToolsQuery>,
) -> Response {
    let name = q.format.as_deref().unwrap_or("neutral");
    let Some(format) = Format::parse(name) else {
        return bad_request(format!(
            "format `{}` is not one of neutral, openai, openai-responses, anthropic, gemini, mcp",
            toolfleet_core::registry::truncate(name, 32)
        ));
    };
    // A principal sees only the tools its scopes allow it to call.
    let visible = state
        .runtime
        .registry()
        .tools()
        .filter(|t| t.required_scopes().iter().all(|s| principal.has_scope(s)));
    axum::Json(tool_specs(format, visible)).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CallRequest {
    tool: String,
    #[serde(default = "empty_object")]
    args: Value,
    idempotency_key: Option<String>,
    run_id: Option<String>,
    callback_url: Option<String>,
    /// When the job may start (RFC 3339); `delay_s` says it relatively.
    run_at: Option<String>,
    delay_s: Option<f64>,
    /// The job's priority in an ordered pool, higher first.
    priority: Option<Value>,
}

fn empty_object() -> Value {
    json!({})
}

/// How far ahead a call's `run_at` or `delay_s` may be: a year.
pub(crate) const MAX_DELAY_S: i64 = 366 * 24 * 3600;

/// When the job of a call with `run_at` (RFC 3339) or `delay_s` (seconds,
/// fractions allowed) may start, in Unix milliseconds, as of `now`; `None`
/// for neither. Refused, naming the field: both at once, a time that does
/// not parse, one in the past, a negative delay, or either beyond a year.
pub(crate) fn start_time(
    run_at: Option<&str>,
    delay_s: Option<f64>,
    now: i64,
) -> Result<Option<i64>, ToolError> {
    let bad = |message: String| ToolError::new(ErrorCode::BadRequest, message);
    let latest = now.saturating_add(MAX_DELAY_S * 1000);
    match (run_at, delay_s) {
        (None, None) => Ok(None),
        (Some(_), Some(_)) => Err(bad(
            "give `run_at` or `delay_s`, not both: `run_at` names a time, `delay_s` a wait from now"
                .to_owned(),
        )),
        (Some(text), None) => {
            let shown: String = text.chars().take(64).collect();
            let at = chrono::DateTime::parse_from_rfc3339(text)
                .map_err(|e| {
                    bad(format!(
                        "`run_at` must be an RFC 3339 time such as 2026-12-24T09:00:00Z ({e}): got `{shown}`"
                    ))
                })?
                .timestamp_millis();
            if at < now {
                return Err(bad(format!(
                    "`run_at` {shown} is in the past (now is {}); give a later time, or leave it out to run at once",
                    toolfleet_core::iso8601(now)
                )));
            }
            if at > latest {
                return Err(bad(format!(
                    "`run_at` {shown} is more than a year ahead; the latest is {}",
                    toolfleet_core::iso8601(latest)
                )));
            }
            Ok(Some(at))
        }
        (None, Some(delay)) => {
            if !delay.is_finite() || delay < 0.0 {
                return Err(bad(format!(
                    "`delay_s` must be a number of seconds, 0 or more: got {delay}"
                )));
            }
            if delay > MAX_DELAY_S as f64 {
                return Err(bad(format!(
                    "`delay_s` {delay} is more than a year ({MAX_DELAY_S} s)"
                )));
            }
            // Within a year in milliseconds: far inside i64.
            Ok(Some(now.saturating_add((delay * 1000.0).round() as i64)))
        }
    }
}

/// The most calls one `POST /v1/calls` carries.
pub(crate) const MAX_BATCH: usize = 1000;

/// The calls of a batch one task makes.
const CALLS_PER_TASK: usize = 125;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchRequest {
    calls: Vec<CallRequest>,
}

/// Why a call was refused before it reached its tool.
enum Refused {
    /// A field out of its bounds or a callback the allow-list refuses: a
    /// 400 alone, an error envelope in a batch.
    BadRequest(ToolError),
    /// An envelope to answer (a run that is not the caller's).
    Answer(Envelope),
}

/// `POST /v1/calls`: one call, or `{"calls": [...]}`, each answered in order.
async fn call(
    State(state): State<AppState>,
    Caller(principal): Caller,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let body: Value = match read_json(&state, body).await {
        Ok(r) => r,
        Err(refusal) => return refusal.into_response(),
    };
    let incoming = toolfleet_mcp::trace_of(&headers);
    if body.get("calls").is_some() {
        let batch: BatchRequest = match serde_json::from_value(body) {
            Ok(batch) => batch,
            Err(e) => return bad_request(format!("the body is not a batch of calls: {e}")),
        };
        return calls(&state, &principal, incoming.as_ref(), batch.calls).await;
    }
    let request: CallRequest = match serde_json::from_value(body) {
        Ok(request) => request,
        Err(e) => return bad_request(format!("the body is not a call: {e}")),
    };
    match make_call(&state, &principal, incoming.as_ref(), request).await {
        Ok((envelope, trace)) => {
            let mut response = reply(&envelope);
            if let Ok(value) = HeaderValue::from_str(&trace.traceparent()) {
                response.headers_mut().insert("traceparent", value);
            }
            response
        }
        Err(Refused::BadRequest(error)) => reply_error(StatusCode::BAD_REQUEST, error),
        Err(Refused::Answer(envelope)) => reply(&envelope),
    }
}

/// A batch: every call made at once (so the store groups their commits
/// and the broker their messages), each answered on its own, in order:
/// `{"results": [...]}`.
async fn calls(
    state: &AppState,
    principal: &Arc<Principal>,
    incoming: Option<&toolfleet_core::TraceContext>,
    calls: Vec<CallRequest>,
) -> Response {
    if calls.is_empty() || calls.len() > MAX_BATCH {
        return bad_request(format!(
            "a batch carries 1 to {MAX_BATCH} calls; this one carries {}",
            calls.len()
        ));
    }
    // A few tasks share the batch, so that every core of the process makes
    // calls of it; each task makes its share at once.
    let count = calls.len();
    let mut calls = calls.into_iter();
    let mut shares = Vec::with_capacity(count.div_ceil(CALLS_PER_TASK));
    loop {
        let share: Vec<CallRequest> = calls.by_ref().take(CALLS_PER_TASK).collect();
        if share.is_empty() {
            break;
        }
        let size = share.len();
        let (state, principal, incoming) = (state.clone(), principal.clone(), incoming.cloned());
        let making = async move {
            // Each call's future boxed: polled where it was made, never
            // moved whole (a call's future is large).
            let made = share
                .into_iter()
                .map(|request| Box::pin(make_call(&state, &principal, incoming.as_ref(), request)));
            futures_util::future::join_all(made)
                .await
                .into_iter()
                .map(|made| match made {
                    Ok((envelope, _)) => envelope,
                    Err(Refused::BadRequest(error)) => Envelope::error(error),
                    Err(Refused::Answer(envelope)) => envelope,
                })
                .collect::<Vec<Envelope>>()
        };
        shares.push((
            size,
            tokio::spawn(tracing::Instrument::in_current_span(making)),
        ));
    }
    let mut results = Vec::with_capacity(count);
    for (size, share) in shares {
        match share.await {
            Ok(envelopes) => results.extend(envelopes),
            // Only a server stopping (or a fault outside the runtime, which
            // catches its tools' panics) ends a share early.
            Err(error) => {
                tracing::warn!(%error, "a share of a batch of calls ended unanswered");
                let lost = ToolError::new(
                    ErrorCode::Unavailable,
                    "the server stopped while making this call: call it again with the same \
                     idempotency_key to learn whether it was made",
                );
                results.extend(std::iter::repeat_n(Envelope::error(lost), size));
            }
        }
    }
    // Written straight from the envelopes, as each call's own answer is.
    let mut body = String::with_capacity(16 + 96 * results.len());
    body.push_str(r#"{"results":["#);
    for (at, envelope) in results.iter().enumerate() {
        if at > 0 {
            body.push(',');
        }
        body.push_str(&envelope.to_json());
    }
    body.push_str("]}");
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// Checks one call's fields and makes it, in its own `call` span: its
/// envelope and its place in the trace.
async fn make_call(
    state: &AppState,
    principal: &Arc<Principal>,
    incoming: Option<&toolfleet_core::TraceContext>,
    request: CallRequest,
) -> Result<(Envelope, toolfleet_core::TraceContext), Refused> {
    let fields = [
        ("idempotency_key", request.idempotency_key.as_deref(), 255),
        ("run_id", request.run_id.as_deref(), 128),
        ("callback_url", request.callback_url.as_deref(), 2048),
    ];
    if let Some(error) = field_error(&fields) {
        return Err(Refused::BadRequest(error));
    }
    let start = start_time(
        request.run_at.as_deref(),
        request.delay_s,
        toolfleet_core::now_ms(),
    )
    .map_err(Refused::BadRequest)?;
    let priority = request
        .priority
        .as_ref()
        .map(toolfleet_core::priority_of)
        .transpose()
        .map_err(Refused::BadRequest)?;
    if let Some(url) = request.callback_url.as_deref()
        && let Some(error) = callback_error(state, principal, url).await
    {
        return Err(Refused::BadRequest(error));
    }
    // A call naming a run belongs to it: the run must be the caller's.
    if let Some(run_id) = request
        .run_id
        .as_deref()
        .filter(|id| toolfleet_fleet::runs::is_run_id(id))
        && let Err(answer) = crate::runs::owned(state, principal, run_id).await
    {
        return Err(Refused::Answer(answer));
    }
    let mut ctx = CallCtx::new(principal.clone());
    if let Some(run_id) = request.run_id {
        ctx.run_id = run_id;
    }
    ctx.idempotency_key = request.idempotency_key;
    ctx.callback_url = request.callback_url;
    ctx.run_at = start;
    ctx.priority = priority;
    // The call's span, in the caller's trace or a new one; a job it makes
    // continues the trace. At ERROR level, so that it is enabled whatever
    // TOOLFLEET_LOG lets through.
    let placement = toolfleet_telemetry::Placement::new(incoming);
    let span = tracing::error_span!(
        "call",
        tool = %toolfleet_core::registry::truncate(&request.tool, 128),
        run_id = %ctx.run_id,
        tenant = %ctx.principal.tenant,
        trace_id = placement.trace_id(),
        span_id = placement.span_id(),
        parent_span_id = placement.parent_span_id(),
    );
    let trace = placement.place(&span);
    ctx.trace = Some(trace.clone());
    // The runtime counts the call in the process's metrics.
    let envelope = tracing::Instrument::instrument(
        state.runtime.invoke(&request.tool, request.args, &ctx),
        span,
    )
    .await;
    Ok((envelope, trace))
}

#[derive(Deserialize)]
struct WaitQuery {
    wait_s: Option<String>,
}

async fn read_job(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(id): Id,
    Params(q): Params<WaitQuery>,
) -> Response {
    let max = state.limits.max_wait_s;
    let wait_s = match q.wait_s.as_deref().map(str::parse::<u64>) {
        None => 0,
        Some(Ok(n)) if n <= max => n,
        Some(_) => {
            return bad_request(format!(
                "wait_s must be a whole number of seconds, 0 to {max}"
            ));
        }
    };
    let envelope = state
        .status()
        .get_job(&principal, &id, Duration::from_secs(wait_s))
        .await;
    if envelope.error_code() == Some(ErrorCode::RateLimited) {
        // Past the caller's bound of long polls.
        return with_status(StatusCode::TOO_MANY_REQUESTS, &envelope);
    }
    reply(&envelope)
}

/// `GET /v1/jobs/{id}/record`: the job's record beside its `get_job`
/// envelope (`outcome`), for the console's page and an operator's look:
/// its arguments (with the tool's `redact` fields redacted), attempts,
/// pool, run, trace and times. Read as `get_job` reads: a job the caller
/// may not see is `not_found`, one whose tool's scopes the caller lacks
/// is `forbidden`.
async fn job_record(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(id): Id,
) -> Response {
    let status = state.status();
    let outcome = status.get_job(&principal, &id, Duration::ZERO).await;
    if let Envelope::Error { state: None, .. } = outcome {
        return reply(&outcome);
    }
    let job = match status.read(&principal, &id).await {
        Ok(Some(job)) => job,
        Ok(None) => return reply(&outcome),
        Err(error) => return reply(&Envelope::error(error)),
    };
    let redact = state
        .runtime
        .registry()
        .get(&job.tool)
        .map(|tool| tool.declaration().middleware.redact.clone())
        .unwrap_or_default();
    let args = toolfleet_core::middleware::redact_json(Json::from(job.args.clone()), &redact);
    let record = json!({
        "job_id": job.id, "tool": job.tool, "pool": job.pool, "user": job.user,
        "state": job.state.shown(), "attempts": job.attempts, "max_attempts": job.max_attempts,
        "requeues": job.requeues, "args": args.to_value(), "run_id": job.run_id,
        "call_id": job.call_id, "trace_id": job.trace.as_ref().map(|t| t.trace_id()),
        "priority": job.priority, "run_at": job.run_at, "started_at": job.started_at,
        "attempts_log": job.attempts_log, "created_at": job.created_at,
        "updated_at": job.updated_at, "outcome": serde_json::to_value(&outcome).unwrap_or_default(),
    });
    reply(&Envelope::ok(Json::from(record), job.call_id.clone()))
}

/// One pool's figures in `GET /v1/queues`, summed from the store's rows.
#[derive(Default)]
struct PoolFigures {
    /// Jobs not settled, by shown state, and the earliest due of them.
    waiting: BTreeMap<&'static str, u64>,
    earliest_due: Option<i64>,
    /// Jobs settled in the window, by shown state, in all and by minute.
    settled: BTreeMap<&'static str, u64>,
    minutes: BTreeMap<i64, (BTreeMap<&'static str, u64>, Wait)>,
    wait: Wait,
}

/// The waits from due to start of settled jobs.
#[derive(Default)]
struct Wait {
    waited: u64,
    total_ms: i64,
    max_ms: Option<i64>,
}

impl Wait {
    fn add(&mut self, row: &toolfleet_store::PoolRow) {
        self.waited += row.waited;
        self.total_ms = self.total_ms.saturating_add(row.wait_total_ms);
        self.max_ms = self.max_ms.max(row.wait_max_ms);
    }

    fn average_ms(&self) -> Option<i64> {
        let waited = i64::try_from(self.waited).ok().filter(|n| *n > 0)?;
        Some(self.total_ms / waited)
    }
}

impl PoolFigures {
    fn view(&self, pool: &str) -> Value {
        let count =
            |counts: &BTreeMap<&str, u64>, state: &str| counts.get(state).copied().unwrap_or(0);
        let minutes: Vec<Value> = self
            .minutes
            .iter()
            .map(|(at, (counts, wait))| {
                let mut minute = json!({"at": at, "wait_avg_ms": wait.average_ms()});
                for (state, n) in counts {
                    minute[*state] = json!(n);
                }
                minute
            })
            .collect();
        json!({
            "pool": pool,
            "queued": count(&self.waiting, "queued"),
            "scheduled": count(&self.waiting, "scheduled"),
            "running": count(&self.waiting, "running"),
            "retrying": count(&self.waiting, "retrying"),
            "earliest_due": self.earliest_due,
            "settled": {
                "succeeded": count(&self.settled, "succeeded"),
                "failed": count(&self.settled, "failed"),
                "cancelled": count(&self.settled, "cancelled"),
            },
            "per_minute": minutes,
            "wait_avg_ms": self.wait.average_ms(),
            "wait_max_ms": self.wait.max_ms,
        })
    }
}

#[derive(Deserialize)]
struct QueuesQuery {
    since_s: Option<String>,
}

/// `GET /v1/queues?since_s=N`: the tenant's jobs by pool, for its
/// operators (`fleet:read` or `fleet:operate`): how many wait in each
/// state and since when, and what settled in the last `since_s` seconds
/// (60 to 86,400; default 3,600), in all and minute by minute.
async fn queues(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Params(q): Params<QueuesQuery>,
) -> Response {
    let since_s = match q.since_s.as_deref().map(str::parse::<i64>) {
        None => 3_600,
        Some(Ok(n)) if (60..=86_400).contains(&n) => n,
        Some(_) => return bad_request("since_s must be a whole number of seconds, 60 to 86400"),
    };
    if !principal.reads_fleet() {
        return reply(&Envelope::error(ToolError::new(
            ErrorCode::Forbidden,
            "the queues are for the tenant's operators: they need scope `fleet:read` or `fleet:operate`",
        )));
    }
    let since = toolfleet_core::now_ms() - since_s * 1000;
    let rows = match state.store.queue_stats(&principal.tenant, since).await {
        Ok(rows) => rows,
        Err(error) => return reply(&Envelope::error(store_error(error))),
    };
    let mut pools: BTreeMap<String, PoolFigures> = BTreeMap::new();
    for row in &rows {
        let pool = pools.entry(row.pool.clone()).or_default();
        let shown = row.state.shown().as_str();
        match row.minute {
            None => {
                *pool.waiting.entry(shown).or_default() += row.count;
                pool.earliest_due = match (pool.earliest_due, row.earliest) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            Some(minute) => {
                *pool.settled.entry(shown).or_default() += row.count;
                let (counts, wait) = pool.minutes.entry(minute).or_default();
                *counts.entry(shown).or_default() += row.count;
                wait.add(row);
                pool.wait.add(row);
            }
        }
    }
    let pools: Vec<Value> = pools
        .into_iter()
        .map(|(name, pool)| pool.view(&name))
        .collect();
    reply(&Envelope::ok(
        Json::from(json!({"pools": pools, "since": since})),
        "",
    ))
}

async fn cancel(State(state): State<AppState>, Caller(principal): Caller, Id(id): Id) -> Response {
    reply(&state.status().cancel_job(&principal, &id).await)
}

#[derive(Deserialize)]
struct ListQuery {
    state: Option<String>,
    tool: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
    since: Option<String>,
    until: Option<String>,
}

async fn list_jobs(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Params(q): Params<ListQuery>,
) -> Response {
    let job_state = match q
        .state
        .as_deref()
        .map(|s| JobState::parse_shown(s).ok_or(s))
    {
        Some(Err(s)) => {
            let names: Vec<&str> = JobState::SHOWN.iter().map(|s| s.as_str()).collect();
            return bad_request(format!(
                "state `{}` is not one of {}",
                toolfleet_core::registry::truncate(s, 32),
                names.join(", ")
            ));
        }
        Some(Ok(s)) => Some(s),
        None => None,
    };
    let limit = match q.limit.as_deref().map(str::parse::<u32>) {
        None => 20,
        Some(Ok(n)) if (1..=100).contains(&n) => n,
        Some(_) => return bad_request("limit must be a whole number, 1 to 100"),
    };
    if q.cursor.as_ref().is_some_and(|c| c.len() > 64)
        || q.tool.as_ref().is_some_and(|t| t.len() > 128)
    {
        return bad_request("cursor or tool is too long");
    }
    let time = |name: &str, value: Option<&str>| match value.map(str::parse::<i64>) {
        None => Ok(None),
        Some(Ok(ms)) if ms >= 0 => Ok(Some(ms)),
        Some(_) => Err(format!(
            "{name} must be a time in Unix milliseconds, 0 or more"
        )),
    };
    let (since, until) = match (
        time("since", q.since.as_deref()),
        time("until", q.until.as_deref()),
    ) {
        (Ok(since), Ok(until)) => (since, until),
        (Err(message), _) | (_, Err(message)) => return bad_request(message),
    };
    if let (Some(since), Some(until)) = (since, until)
        && since >= until
    {
        return bad_request("since must be before until");
    }
    let filter = JobFilter {
        state: job_state,
        tool: q.tool,
        user: access::listed_user(&principal),
        made_since: since,
        made_before: until,
    };
    match state
        .store
        .list_jobs(toolfleet_store::ListJobs {
            tenant: &principal.tenant,
            filter: &filter,
            limit,
            cursor: q.cursor.as_deref(),
        })
        .await
    {
        Ok(page) => {
            let jobs: Vec<Value> = page
                .jobs
                .iter()
                .map(|j| {
                    json!({
                        "job_id": j.id, "tool": j.tool, "state": j.state.shown(), "attempts": j.attempts,
                        "run_id": j.run_id, "run_at": j.run_at, "priority": j.priority,
                        "created_at": j.created_at,
                        "updated_at": j.updated_at,
                    })
                })
                .collect();
            axum::Json(json!({"jobs": jobs, "next_cursor": page.next_cursor})).into_response()
        }
        Err(error) => reply(&Envelope::error(store_error(error))),
    }
}

pub(crate) fn ticket_missing(id: &str) -> Envelope {
    Envelope::error(ToolError::not_found(format!(
        "no ticket `{}` for this caller",
        toolfleet_core::registry::truncate(id, 64)
    )))
}

async fn read_ticket(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(id): Id,
) -> Response {
    match state.store.ticket(&principal.tenant, &id).await {
        Ok(Some(ticket)) if access::sees_ticket(&principal, &ticket) => reply(&Envelope::ok(
            Json::from(ticket_view(&ticket)),
            ticket.call_id.clone(),
        )),
        Ok(_) => reply(&ticket_missing(&id)),
        Err(error) => reply(&Envelope::error(store_error(error))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerRequest {
    answer: Value,
}

async fn answer_ticket(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(id): Id,
    body: Body,
) -> Response {
    let request: AnswerRequest = match read_json(&state, body).await {
        Ok(r) => r,
        Err(refusal) => return refusal.into_response(),
    };
    let answerer = Answerer {
        store: state.store.as_ref(),
        broker: state.broker.as_ref(),
        notices: state.notices.as_ref(),
        access: &state.access,
    };
    reply(&answerer.answer(&principal, &id, &request.answer).await)
}

/// What answering a ticket touches: the store, the broker that wakes the
/// jobs parked on it, the notices and the audit.
pub(crate) struct Answerer<'a> {
    pub store: &'a dyn Store,
    pub broker: &'a dyn Broker,
    pub notices: &'a dyn Notices,
    pub access: &'a Access,
}

impl Answerer<'_> {
    /// Answers ticket `id` as `principal` (see [`access::answers_ticket`])
    /// and audits who did: `POST /v1/tickets/{id}/answer` and MCP
    /// elicitation both answer through here.
    pub(crate) async fn answer(&self, principal: &Principal, id: &str, answer: &Value) -> Envelope {
        let envelope = self.answer_unaudited(principal, id, answer).await;
        let args = json!({
            "ticket": toolfleet_core::registry::truncate(id, 64),
            "answer": answer,
        });
        self.access
            .audit(principal, "answer_ticket", args, &envelope);
        envelope
    }

    async fn answer_unaudited(&self, principal: &Principal, id: &str, answer: &Value) -> Envelope {
        let ticket = match self.store.ticket(&principal.tenant, id).await {
            Ok(Some(ticket)) if access::sees_ticket(principal, &ticket) => ticket,
            Ok(_) => return ticket_missing(id),
            Err(error) => return Envelope::error(store_error(error)),
        };
        if !access::answers_ticket(principal, &ticket) {
            let who = match ticket.answered_by.scope() {
                Some(scope) => format!("a holder of scope `{scope}`"),
                None => "the user whose call opened it".to_owned(),
            };
            return Envelope::error(ToolError::new(
                ErrorCode::Forbidden,
                format!(
                    "ticket `{id}` is answered by {who}, or by an operator (`{FLEET_OPERATE}`)"
                ),
            ));
        }
        answer_ticket_as(self.store, self.broker, self.notices, &ticket, answer).await
    }
}

/// Answers `ticket` (one the caller may answer) with `answer` through the
/// fleet, which announces it and wakes the jobs parked on it: the answered
/// ticket, or why not.
async fn answer_ticket_as(
    store: &dyn Store,
    broker: &dyn Broker,
    notices: &dyn Notices,
    ticket: &TicketRecord,
    answer: &Value,
) -> Envelope {
    match toolfleet_fleet::tickets::answer(store, broker, notices, ticket, answer).await {
        Ok(Some(Answered::Now(ticket))) => {
            Envelope::ok(Json::from(ticket_view(&ticket)), ticket.call_id.clone())
        }
        Ok(Some(Answered::Already(ticket))) => {
            let why = if ticket.expired_at.is_some() {
                format!(
                    "ticket {} expired before anyone answered it and takes no answer now; ask again if it still matters",
                    ticket.id
                )
            } else {
                "this ticket was answered already; its first answer stands".to_owned()
            };
            Envelope::error(
                ToolError::new(ErrorCode::Conflict, why).with_details(ticket_view(&ticket)),
            )
        }
        Ok(None) => ticket_missing(&ticket.id),
        Err(error) => Envelope::error(error),
    }
}

#[derive(Deserialize)]
struct EventsQuery {
    /// States to hear, comma-separated (none: every state).
    state: Option<String>,
}

/// The states a job or ticket event can carry.
/// The states of `?state=a,b`: each one of [`EventState::ALL`]; `None` for
/// every state.
fn event_states(query: Option<&str>) -> Result<Option<Vec<EventState>>, String> {
    let Some(query) = query else {
        return Ok(None);
    };
    let mut states = Vec::new();
    for word in query.split(',').map(str::trim) {
        match EventState::parse(word) {
            Some(state) if !states.contains(&state) => states.push(state),
            Some(_) => {}
            None => {
                let names: Vec<&str> = EventState::ALL.iter().map(|s| s.as_str()).collect();
                return Err(format!(
                    "state `{}` is not one of {}",
                    toolfleet_core::registry::truncate(word, 32),
                    names.join(", ")
                ));
            }
        }
    }
    Ok(Some(states))
}

/// What an SSE stream sends of an event, its keys in the order `json!`
/// would give them, borrowed from the event: the body is written as it
/// stands, not copied into a new value first.
#[derive(serde::Serialize)]
struct SseData<'a> {
    body: &'a Value,
    id: &'a str,
    kind: EventKind,
    run_id: &'a str,
    state: EventState,
    tool: &'a str,
}

async fn events(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Params(q): Params<EventsQuery>,
) -> Response {
    let states = match event_states(q.state.as_deref()) {
        Ok(states) => states,
        Err(message) => return bad_request(message),
    };
    // Held until the stream ends: a principal's streams, and the process's,
    // are bounded.
    let held = match take_stream(&state, &principal) {
        Ok(held) => held,
        Err(refused) => return *refused,
    };
    // A stream of outcomes alone takes the feed of outcomes, which on
    // RabbitMQ routes nothing else to this process.
    let outcomes = states.as_ref().is_some_and(|states| {
        states
            .iter()
            .all(|s| toolfleet_broker::SETTLED_STATES.contains(s))
    });
    let subscribed = if outcomes {
        state.notices.subscribe_settled().await
    } else {
        state.notices.subscribe().await
    };
    let subscription = match subscribed {
        Ok(s) => s,
        Err(error) => {
            return reply(&Envelope::error(ToolError::new(
                ErrorCode::Unavailable,
                format!("events are unavailable ({error})"),
            )));
        }
    };
    let (access, stopping) = (state.access.clone(), state.stopping.clone());
    let stream = futures_util::stream::unfold(subscription, move |mut subscription| {
        let _held = &held;
        let (principal, access) = (principal.clone(), access.clone());
        let states = states.clone();
        let mut stopping = stopping.clone();
        async move {
            loop {
                // The stream ends when the server stops, so shutdown never
                // waits on a client that listens forever.
                let event = tokio::select! {
                    event = subscription.next() => event?,
                    _ = stopping.wait_for(|stop| *stop) => return None,
                };
                // Another tenant's or another user's events never leave
                // the server.
                if !access::hears(&principal, &event)
                    || states
                        .as_ref()
                        .is_some_and(|states| !states.contains(&event.state))
                {
                    continue;
                }
                // A job's result only to those who may read it.
                let refused;
                let body = match access.result_refused(&principal, &event.tool) {
                    Some(refusal) if event.kind == EventKind::Job => {
                        refused =
                            serde_json::to_value(Envelope::error(refusal)).unwrap_or_default();
                        &refused
                    }
                    _ => event.body.as_ref(),
                };
                let data = SseData {
                    body,
                    id: &event.id,
                    kind: event.kind,
                    run_id: &event.run_id,
                    state: event.state,
                    tool: &event.tool,
                };
                let sse = SseEvent::default()
                    .event(event.kind.as_str())
                    .id(event.id.clone())
                    .data(serde_json::to_string(&data).unwrap_or_default());
                return Some((Ok::<_, Infallible>(sse), subscription));
            }
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}
