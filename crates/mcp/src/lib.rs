//! toolfleet over the Model Context Protocol: the one registry as MCP
//! `tools/list` and `tools/call`, over Streamable HTTP ([`HttpEndpoint`],
//! mounted at `/mcp` by the server) and over stdio ([`serve_stdio`], for
//! `toolfleet mcp`).
//!
//! MCP adds no second path to a tool: a `tools/call` is read, invoked and
//! rendered by the same [`adapters`](toolfleet_core::adapters) as
//! `POST /v1/calls` with `format=mcp`, so validation, middleware, scopes and
//! the fleet behave exactly as there. Validation failures and tool errors are
//! results with `isError: true` and the envelope's message; a job answers its
//! `running` envelope (as `structuredContent` and as text) and `get_job`, a
//! registered tool, polls it; a human tool answers its `suspended` envelope
//! with the ticket.
//!
//! Authentication is not done here: the HTTP endpoint is handed the principal
//! its caller authenticated (the server checks the bearer token first), and
//! stdio runs as the one principal of its token. Each principal lists only the
//! tools its scopes allow and calls go through the runtime's scope check.
//!
//! # Why rmcp
//!
//! The protocol itself is the official Rust SDK, `rmcp`, pinned to one
//! version and kept behind this module: only this crate names its types. It
//! implements the three revisions we speak (2025-06-18 and 2025-11-25 with the
//! `initialize` handshake, 2026-07-28 with per-request `_meta` and
//! `server/discover`) and their negotiation (all but 2025-11-25's tasks,
//! which [`core_tasks`] adds around it), Streamable HTTP as a tower service
//! that mounts under our own axum routes and auth, and stdio. Its cost is
//! schemars (its `server` feature needs it) and a second sha2 0.11 and rand
//! 0.10 beside the workspace's; writing the 2026-07-28 lifecycle ourselves
//! would cost more and drift from the clients that follow the SDKs.

use std::borrow::Cow;
use std::sync::Arc;

use std::time::Duration;

use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
    CreateTaskResult, DiscoverResult, ElicitRequestParams, ElicitResult, ElicitationAction,
    ErrorCode, GetTaskParams, GetTaskResult, Implementation, InputRequest, InputRequests,
    InputRequiredResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ProtocolVersion,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, ResultType,
    ServerCapabilities, ServerConfig, SubscribeRequestParams, Tool as McpTool,
    UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Map, Value, json};
use toolfleet_core::adapters::{Format, ProviderCall, parse_call, render_result, tool_specs};
use toolfleet_core::{
    CallCtx, CallEvent, CallEvents, Envelope, LogLevel, Principal, Runtime, Shape, Tool, ToolError,
    TraceContext,
};

pub mod asking;
pub mod core_tasks;
pub mod declared;
pub mod http;
pub mod jobs;
pub mod resources;
mod subscriptions;
pub use http::HttpEndpoint;
pub use jobs::{BoxFuture, JobList, JobView, Jobs};

/// The protocol revisions this server speaks, oldest first.
pub const PROTOCOL_VERSIONS: [&str; 3] = ["2025-06-18", "2025-11-25", "2026-07-28"];

const SUPPORTED: [ProtocolVersion; 3] = [
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2026_07_28,
];

/// Tools per `tools/list` page unless configured.
pub const DEFAULT_PAGE_SIZE: usize = 50;
/// The largest page a configuration may ask for.
pub const MAX_PAGE_SIZE: usize = 500;
/// Sessions open at once in one process unless configured.
pub const DEFAULT_MAX_SESSIONS: usize = 10_000;
/// How often a subscribed declared resource is read again unless configured.
pub const DEFAULT_WATCH_EVERY: Duration = Duration::from_secs(5);
/// A cursor is a decimal offset: anything longer was not made here.
const MAX_CURSOR_LEN: usize = 20;

/// Told of every call answered without reaching the runtime (which counts
/// the calls it runs), with the tool name (or `unknown`) and the envelope:
/// a call naming no registered tool, or whose arguments are not a JSON
/// object. The server counts them in its metrics with it.
pub type CallHook = Arc<dyn Fn(&str, &Envelope) + Send + Sync>;

/// How the MCP server behaves.
#[derive(Clone)]
pub struct Options {
    /// Tools per `tools/list` page, 1 to [`MAX_PAGE_SIZE`].
    pub page_size: usize,
    /// Largest request body over HTTP, in bytes.
    pub max_body: usize,
    /// Told of every call answered without reaching the runtime.
    pub on_call: Option<CallHook>,
    /// The fleet's jobs and tickets: with them, job and agent calls become
    /// tasks for clients of the tasks extension, and human tools ask clients
    /// that can elicit. Without them, only the envelopes.
    pub jobs: Option<Arc<dyn Jobs>>,
    /// The longest a call waits on a job for a client that asked for
    /// progress, and the longest a task's progress is followed.
    pub max_wait: Duration,
    /// Becomes `true` when the process stops: a 2025-11-25 `tasks/result`
    /// still waiting then answers an error the client retries elsewhere.
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
    /// The resources `[[resources]]` declares, each read through its tool.
    pub declared: Arc<[declared::Declared]>,
    /// The key that signs the state a tool asking the client hands on
    /// (`asks_client`), the same on every dispatcher. Without it such a
    /// tool's questions are not put to the client.
    pub state_key: Option<[u8; 32]>,
    /// Whether an `initialize` over HTTP (2025 revisions) opens a session
    /// of this process, in which the server asks the client and sends it
    /// resource updates (see [`http`]).
    pub sessions: bool,
    /// Sessions open at once in this process, at most.
    pub max_sessions: usize,
    /// How often a subscribed resource that may change (a declared one) is
    /// read again to learn whether it did.
    pub watch_every: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            page_size: DEFAULT_PAGE_SIZE,
            max_body: 1024 * 1024,
            on_call: None,
            jobs: None,
            max_wait: Duration::from_secs(30),
            stop: None,
            declared: Arc::from(Vec::new()),
            state_key: None,
            sessions: true,
            max_sessions: DEFAULT_MAX_SESSIONS,
            watch_every: DEFAULT_WATCH_EVERY,
        }
    }
}

/// The key of the one input request a human tool's elicitation makes.
const ANSWER_KEY: &str = "answer";
/// `requestState` of an elicitation retry names the ticket after this.
const TICKET_STATE: &str = "ticket:";

/// The principal an HTTP request was authenticated as, put in the request's
/// extensions by whoever checked its credentials.
#[derive(Clone, Debug)]
pub struct Authenticated(pub Arc<Principal>);

/// The MCP server of one runtime: answers `tools/list` and `tools/call`.
#[derive(Clone)]
pub struct ToolServer {
    runtime: Arc<Runtime>,
    /// The principal of every request (stdio); `None`: each HTTP request's own.
    principal: Option<Arc<Principal>>,
    options: Options,
    /// The least severe log message a client asked for with
    /// `logging/setLevel`: kept for the stdio session; over stateless HTTP
    /// each request gets its own, so it holds for that request only.
    log_level: Arc<std::sync::Mutex<Option<LogLevel>>>,
    /// The resource subscriptions of the session (stdio, or one over HTTP).
    watches: Arc<subscriptions::Watches>,
}

impl ToolServer {
    /// A server of `runtime`: every request as `principal` (stdio), or, `None`, as the principal each HTTP request carries.
    pub fn new(runtime: Arc<Runtime>, principal: Option<Arc<Principal>>, options: Options) -> Self {
        let page_size = options.page_size.clamp(1, MAX_PAGE_SIZE);
        ToolServer {
            runtime,
            principal,
            options: Options {
                page_size,
                ..options
            },
            log_level: Arc::default(),
            watches: Arc::default(),
        }
    }

    /// This server for one stateless HTTP request or one session: nothing
    /// one sets (its log level, its subscriptions) reaches another.
    fn for_request(&self) -> Self {
        ToolServer {
            log_level: Arc::default(),
            watches: Arc::default(),
            ..self.clone()
        }
    }

    /// The least severe log message to send for a request: its own
    /// `_meta` level (2026-07-28), else the session's; a 2026-07-28 request
    /// that names none gets none, an older one every level.
    fn min_log_level(&self, context: &RequestContext<RoleServer>) -> Option<LogLevel> {
        #[allow(deprecated)]
        let asked = context
            .meta
            .log_level()
            .and_then(|level| serde_json::to_value(level).ok())
            .and_then(|level| serde_json::from_value::<LogLevel>(level).ok());
        if asked.is_some() {
            return asked;
        }
        let modern = context
            .protocol_version()
            .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
        if modern {
            return None;
        }
        let set = *self.log_level.lock().unwrap_or_else(|e| e.into_inner());
        Some(set.unwrap_or(LogLevel::Debug))
    }

    fn principal(&self, context: &RequestContext<RoleServer>) -> Result<Arc<Principal>, ErrorData> {
        if let Some(principal) = &self.principal {
            return Ok(principal.clone());
        }
        context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Authenticated>())
            .map(|a| a.0.clone())
            .ok_or_else(|| {
                ErrorData::new(
                    ErrorCode::INVALID_REQUEST,
                    "unauthenticated: send `Authorization: Bearer <token>`",
                    None,
                )
            })
    }

    /// One page of the tools `principal` may call, from `cursor`.
    pub fn list(&self, principal: &Principal, cursor: Option<&str>) -> Result<Value, ErrorData> {
        let start = match cursor {
            None => 0,
            Some(cursor) => cursor
                .parse::<usize>()
                .ok()
                .filter(|_| cursor.len() <= MAX_CURSOR_LEN)
                .ok_or_else(|| {
                    ErrorData::invalid_params(
                        "the cursor is not one this server gave; list again without a cursor",
                        None,
                    )
                })?,
        };
        let visible: Vec<&Arc<Tool>> = self
            .runtime
            .registry()
            .tools()
            .filter(|t| t.required_scopes().iter().all(|s| principal.has_scope(s)))
            .collect();
        let end = start
            .saturating_add(self.options.page_size)
            .min(visible.len());
        let page = visible.get(start..end).unwrap_or_default();
        let mut out = Map::new();
        out.insert(
            "tools".into(),
            tool_specs(Format::Mcp, page.iter().copied()),
        );
        if end < visible.len() {
            out.insert("nextCursor".into(), json!(end.to_string()));
        }
        Ok(Value::Object(out))
    }

    /// Answers one `tools/call` (its `params`) as a `CallToolResult`: the
    /// same path as `POST /v1/calls`, rendered by the MCP adapter.
    pub async fn call(&self, principal: Arc<Principal>, params: &Value) -> Value {
        let (call, envelope) = self.invoke(principal, params, None, None).await;
        render_result(Format::Mcp, &call, &envelope)
    }

    /// Runs one `tools/call` (its `params`): the call as read and its envelope.
    /// `events`, when given, hears the tool's progress and log reports; a
    /// job it makes continues `trace`, the caller's.
    async fn invoke(
        &self,
        principal: Arc<Principal>,
        params: &Value,
        events: Option<CallEvents>,
        trace: Option<TraceContext>,
    ) -> (ProviderCall, Envelope) {
        let raw = serde_json::to_vec(params).unwrap_or_default();
        let registry = self.runtime.registry();
        let (call, envelope) = match parse_call(Format::Mcp, registry, &raw) {
            Ok(call) => {
                let envelope = match &call.args {
                    Ok(args) => {
                        let mut ctx = CallCtx::new(principal);
                        ctx.events = events;
                        ctx.trace = trace;
                        // Each call made here carries in those names only what
                        // this server checked (`call_tool` drops the client's
                        // own, `ask_in_session` and a hand-on set them anew).
                        ctx.client_input = true;
                        // Counted by the runtime, not the hook.
                        let envelope = self.runtime.invoke(&call.name, args.clone(), &ctx).await;
                        return (call, envelope);
                    }
                    Err(error) => Envelope::error(error.clone()),
                };
                (call, envelope)
            }
            Err(error) => {
                let call = ProviderCall {
                    id: None,
                    name: String::new(),
                    wire_name: String::new(),
                    tool: None,
                    args: Err(error.clone()),
                };
                (call, Envelope::error(error))
            }
        };
        if let Some(hook) = &self.options.on_call {
            let label = if call.tool.is_some() {
                call.name.as_str()
            } else {
                toolfleet_core::metrics::UNKNOWN_TOOL
            };
            hook(label, &envelope);
        }
        (call, envelope)
    }

    /// [`Self::invoke`], the tool's reports sent to the client as they come
    /// and all before the result: progress when the request carries a
    /// progress token, log messages at the level asked. Over HTTP the first
    /// report turns the answer into an event stream (rmcp does so when a
    /// notification precedes the response).
    #[allow(deprecated)]
    async fn invoke_reporting(
        &self,
        principal: Arc<Principal>,
        params: &Value,
        context: &RequestContext<RoleServer>,
        token: Option<ProgressToken>,
    ) -> (ProviderCall, Envelope) {
        let min_level = self.min_log_level(context);
        let trace = incoming_trace(context);
        if token.is_none() && min_level.is_none() {
            return self.invoke(principal, params, None, trace).await;
        }
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let events = CallEvents::new(move |event| {
            let _ = tx.send(event);
        });
        let tool = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let send = |event: CallEvent| {
            let (peer, token, tool) = (&context.peer, &token, &tool);
            async move {
                match event {
                    CallEvent::Progress {
                        progress,
                        total,
                        message,
                    } => {
                        if let Some(token) = token {
                            let mut note = ProgressNotificationParam::new(token.clone(), progress);
                            note.total = total;
                            note.message = message;
                            let _ = peer.notify_progress(note).await;
                        }
                    }
                    CallEvent::Log { level, message } => {
                        if min_level.is_some_and(|min| level >= min)
                            && let Some(note) = log_message(level, tool, message)
                        {
                            let _ = peer.notify_logging_message(note).await;
                        }
                    }
                }
            }
        };
        let invoke = self.invoke(principal, params, Some(events), trace);
        tokio::pin!(invoke);
        loop {
            tokio::select! {
                biased;
                Some(event) = rx.recv() => send(event).await,
                out = &mut invoke => {
                    while let Ok(event) = rx.try_recv() {
                        send(event).await;
                    }
                    return out;
                }
            }
        }
    }

    /// Whether the server may ask the client (elicitation, sampling, roots)
    /// during a call, or tell it of something after answering: over stdio,
    /// yes; over HTTP, in a session ([`http`]); a stateless request has
    /// nothing to carry the client's answer or a later notification.
    /// (Progress and log messages during a call go out over all three.)
    fn streams(&self, context: &RequestContext<RoleServer>) -> bool {
        self.principal.is_some()
            || context
                .extensions
                .get::<axum::http::request::Parts>()
                .is_some_and(|parts| parts.extensions.get::<http::InSession>().is_some())
    }

    /// The poll hint of a job's tool.
    fn poll_after(&self, tool: &str) -> u32 {
        self.runtime
            .registry()
            .get(tool)
            .and_then(|t| t.declaration().poll_after_s)
            .unwrap_or(5)
    }

    /// A job's task; a completed one carries the tool result `tools/call`
    /// would have answered. A job whose tool answered an error
    /// (`tool_failed`) is completed too, its result an error result
    /// (`isError`), as a call answered at once would be; a job that failed
    /// otherwise (its time ran out, its delivery gave up) is a failed task.
    fn task(&self, job: &JobView) -> rmcp::model::DetailedTask {
        let answered = match (job.state, &job.envelope) {
            (toolfleet_core::JobState::Succeeded, _) => true,
            (toolfleet_core::JobState::Failed, Envelope::Error { error, .. }) => {
                error.code == toolfleet_core::ErrorCode::ToolFailed
            }
            _ => false,
        };
        let result = if answered {
            match self.render_for(&job.tool, &job.envelope) {
                Value::Object(map) => Some(map),
                _ => None,
            }
        } else {
            None
        };
        jobs::task_of(job, self.poll_after(&job.tool), result)
    }

    /// `envelope` as the result of a call to `tool`.
    fn render_for(&self, tool: &str, envelope: &Envelope) -> Value {
        let call = ProviderCall {
            id: None,
            name: tool.to_owned(),
            wire_name: tool.to_owned(),
            tool: self.runtime.registry().get(tool).cloned(),
            args: Ok(Value::Object(Map::new())),
        };
        render_result(Format::Mcp, &call, envelope)
    }

    /// Waits for a job on behalf of a client that asked for progress,
    /// telling it of every change, up to [`Options::max_wait`]; answers the
    /// job's envelope as it then stands (still `running` if it has not settled).
    async fn follow(
        &self,
        jobs: &dyn Jobs,
        principal: &Principal,
        job_id: &str,
        token: &ProgressToken,
        progress: &core_tasks::Progress,
    ) -> Option<Envelope> {
        let deadline = tokio::time::Instant::now() + self.options.max_wait;
        let mut since = 0;
        let mut step = 0.0;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            // Bounded rounds: a missed event costs a round, not the wait.
            let round = left.min(Duration::from_secs(2));
            let job = match jobs.wait(principal, job_id, since, round).await {
                Ok(Some(job)) => job,
                _ => return None,
            };
            if job.updated_at != since {
                since = job.updated_at;
                step += 1.0;
                let mut note = ProgressNotificationParam::new(token.clone(), step);
                note.message = Some(jobs::status_message(&job));
                if job.state.is_settled() {
                    note.total = Some(step);
                }
                if !progress.send(note).await {
                    return Some(job.envelope);
                }
            }
            if job.state.is_settled() || left.is_zero() {
                return Some(job.envelope);
            }
        }
    }

    /// Asks the client the ticket's question (form elicitation); answers
    /// the tool result: the answered ticket, or an error saying the person
    /// declined (the ticket left open).
    async fn elicit(
        &self,
        jobs: &dyn Jobs,
        principal: &Principal,
        call: &ProviderCall,
        (ticket, question, options): (&str, &str, &[String]),
        peer: &rmcp::Peer<RoleServer>,
    ) -> Value {
        let params = match elicit_params(question, options) {
            Ok(params) => params,
            Err(error) => return render_result(Format::Mcp, call, &Envelope::error(error)),
        };
        let envelope = match peer.create_elicitation(params).await {
            Ok(answer) => answered(jobs, principal, ticket, answer).await,
            Err(error) => {
                tracing::warn!(%error, ticket, "mcp: elicitation failed; the ticket stays open");
                Envelope::error(
                    ToolError::new(
                        toolfleet_core::ErrorCode::Unavailable,
                        format!("the question could not be asked ({error}); ticket `{ticket}` stays open for a person to answer"),
                    )
                    .with_details(json!({"ticket": ticket})),
                )
            }
        };
        render_result(Format::Mcp, call, &envelope)
    }
}

/// The W3C trace context a request continues: its one `traceparent` header
/// when valid (with its `tracestate` headers, joined as one list), else
/// none, and the call starts a trace of its own. Never an error.
pub fn trace_of(headers: &axum::http::HeaderMap) -> Option<TraceContext> {
    let values = |name| {
        headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap_or_default())
    };
    TraceContext::from_headers(values("traceparent"), values("tracestate"))
}

/// The trace context of the HTTP request a call came in (none over stdio).
fn incoming_trace(context: &RequestContext<RoleServer>) -> Option<TraceContext> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| trace_of(&parts.headers))
}

/// A form elicitation of `question`: one `answer` field, the options as an enum.
fn elicit_params(question: &str, options: &[String]) -> Result<ElicitRequestParams, ToolError> {
    let mut field = json!({"type": "string", "title": "Answer", "description": question});
    if !options.is_empty() {
        field["enum"] = json!(options);
    }
    let params = json!({
        "mode": "form",
        "message": question,
        "requestedSchema": {
            "type": "object",
            "properties": {ANSWER_KEY: field},
            "required": [ANSWER_KEY]
        }
    });
    serde_json::from_value(params).map_err(|e| {
        ToolError::new(
            toolfleet_core::ErrorCode::ToolFailed,
            format!("the question could not be put as a form: {e}"),
        )
    })
}

/// A tool's log message as MCP's, its logger the tool.
#[allow(deprecated)]
fn log_message(
    level: LogLevel,
    tool: &str,
    message: String,
) -> Option<rmcp::model::LoggingMessageNotificationParam> {
    let level = serde_json::to_value(level)
        .and_then(serde_json::from_value::<rmcp::model::LoggingLevel>)
        .ok()?;
    Some(rmcp::model::LoggingMessageNotificationParam::new(level, json!(message)).with_logger(tool))
}

/// Writes an elicitation's answer to the ticket; a decline leaves it open.
async fn answered(
    jobs: &dyn Jobs,
    principal: &Principal,
    ticket: &str,
    answer: ElicitResult,
) -> Envelope {
    match answer.action {
        ElicitationAction::Accept => {
            let value = answer
                .content
                .as_ref()
                .and_then(|c| c.get(ANSWER_KEY))
                .cloned()
                .unwrap_or(Value::Null);
            jobs.answer(principal, ticket, value).await
        }
        _ => Envelope::error(
            ToolError::new(
                toolfleet_core::ErrorCode::Cancelled,
                format!("the person declined to answer; ticket `{ticket}` stays open"),
            )
            .with_details(json!({"ticket": ticket})),
        ),
    }
}

fn internal(what: &str, error: impl std::fmt::Display) -> ErrorData {
    tracing::error!(%error, "mcp: {what}");
    ErrorData::internal_error(format!("{what} failed on the server"), None)
}

impl ServerHandler for ToolServer {
    // `logging` is deprecated by SEP-2577 but still part of the revisions
    // we speak; rmcp keeps it functional.
    #[allow(deprecated)]
    fn get_info(&self) -> ServerConfig {
        let mut info = Implementation::new("toolfleet", env!("CARGO_PKG_VERSION"));
        info.title = Some("toolfleet".into());
        let capabilities = if self.options.jobs.is_some() {
            ServerCapabilities::builder()
                .enable_tools()
                .enable_logging()
                .enable_resources()
                .enable_resources_subscribe()
                .enable_tasks()
                .build()
        } else {
            ServerCapabilities::builder()
                .enable_tools()
                .enable_logging()
                .enable_resources()
                .enable_resources_subscribe()
                .build()
        };
        ServerConfig::new(capabilities)
            .with_server_info(info)
            .with_instructions(
                "Every tool answers a JSON envelope whose `status` is ok, error, running or suspended. \
                 `running` carries a `job_id`: call `get_job` with it after `poll_after_s` seconds \
                 until the status is ok or error. `suspended` carries a `ticket` a person answers.",
            )
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(&SUPPORTED)
    }

    /// What `server/discover` (2026-07-28) answers: the capabilities of
    /// `initialize` but for `resources.subscribe`. That revision's
    /// subscriptions are `subscriptions/listen` streams, which a stateless
    /// server does not keep, and nothing here would send on one: the tool
    /// list is fixed at start, a handle or a settled job never changes.
    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        let mut result = DiscoverResult::from_server_info(SUPPORTED.to_vec(), self.get_info());
        if let Some(resources) = result.capabilities.resources.as_mut() {
            resources.subscribe = None;
        }
        Ok(result)
    }

    /// A registered tool as `tools/list` shows it: rmcp checks a
    /// `tools/call`'s `Mcp-Param-*` headers against its input schema's
    /// `x-mcp-header` properties with it (SEP-2243), before the call. It
    /// says nothing of who may call the tool; the call itself checks that.
    fn get_tool(&self, name: &str) -> Option<McpTool> {
        let tool = self.runtime.registry().get(name)?;
        let spec = tool_specs(Format::Mcp, std::iter::once(tool));
        let first = spec.as_array()?.first()?.clone();
        serde_json::from_value(first).ok()
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let principal = self.principal(&context)?;
        let cursor = request.as_ref().and_then(|r| r.cursor.as_deref());
        let page = self.list(&principal, cursor)?;
        let tools: Vec<McpTool> = match page.get("tools") {
            Some(tools) => serde_json::from_value(tools.clone())
                .map_err(|e| internal("rendering the tool list", e))?,
            None => Vec::new(),
        };
        let mut result = ListToolsResult::with_all_items(tools)
            .with_ttl_ms(0)
            // Each principal sees its own list.
            .with_cache_scope(CacheScope::Private);
        result.next_cursor = page
            .get("nextCursor")
            .and_then(Value::as_str)
            .map(str::to_owned);
        Ok(result)
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let principal = self.principal(&context)?;
        let cursor = request.as_ref().and_then(|r| r.cursor.as_deref());
        let jobs = self.options.jobs.as_deref();
        let listed = resources::list(
            &self.runtime,
            jobs,
            &principal,
            cursor,
            self.options.page_size,
        )
        .await?;
        let mut all = Vec::new();
        if cursor.is_none() {
            all.extend(declared::listed(&self.options.declared));
        }
        all.extend(listed.resources);
        let mut result = ListResourcesResult::with_all_items(all)
            .with_ttl_ms(0)
            .with_cache_scope(CacheScope::Private);
        result.next_cursor = listed.next_cursor;
        Ok(result)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        self.principal(&context)?;
        let mut templates = resources::templates();
        templates.extend(declared::templates(&self.options.declared));
        Ok(ListResourceTemplatesResult::with_all_items(templates))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let principal = self.principal(&context)?;
        if let Some((declared, args)) = declared::find(&self.options.declared, &request.uri) {
            let contents =
                declared::read(&self.runtime, principal, declared, args, &request.uri).await?;
            // Read through its tool each time: nothing says it holds still.
            let result = ReadResourceResult::new(vec![contents])
                .with_ttl_ms(0)
                .with_cache_scope(CacheScope::Private);
            return Ok(result.into());
        }
        let jobs = self.options.jobs.as_deref();
        let contents = resources::read(&self.runtime, jobs, &principal, &request.uri).await?;
        // A handle's page and a settled job never change; each is the caller's.
        let result = ReadResourceResult::new(vec![contents])
            .with_ttl_ms(60_000)
            .with_cache_scope(CacheScope::Private);
        Ok(result.into())
    }

    /// See [`subscriptions`].
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscribe_to(&request.uri, &context).await
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.unsubscribe_from(&request.uri, &context).await
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let principal = self.principal(&context)?;
        let tool = self.runtime.registry().get(&request.name).cloned();
        let mut shape = tool.as_ref().map(|t| t.shape());
        let capabilities = context.client_capabilities();
        let jobs = self.options.jobs.clone();
        // A retry carrying a person's answer to the question this call asked.
        if let (Some(jobs), Some(Shape::Human), Some(responses), Some(state)) = (
            &jobs,
            shape,
            &request.input_responses,
            request.request_state.as_deref(),
        ) && let Some(ticket) = state.strip_prefix(TICKET_STATE)
        {
            let call = ProviderCall {
                id: None,
                name: request.name.to_string(),
                wire_name: request.name.to_string(),
                tool: tool.clone(),
                args: Ok(Value::Object(Map::new())),
            };
            let envelope = match responses
                .get(ANSWER_KEY)
                .and_then(|r| serde_json::from_value::<ElicitResult>(r.clone()).ok())
            {
                Some(answer) => answered(jobs.as_ref(), &principal, ticket, answer).await,
                None => Envelope::error(ToolError::invalid_arguments(format!(
                    "inputResponses must carry `{ANSWER_KEY}`, the answer to the question asked"
                ))),
            };
            return complete(render_result(Format::Mcp, &call, &envelope));
        }
        let name = request.name.to_string();
        // A tool that runs only as a task, called by a client that speaks
        // none: refused before any job is made.
        let task_only = tool
            .as_ref()
            .is_some_and(|t| t.shape().is_enqueued() && t.declaration().requires_task);
        if task_only && jobs.is_some() && !capabilities.as_ref().is_some_and(|c| c.supports_tasks())
        {
            let required: rmcp::model::ClientCapabilities = serde_json::from_value(
                json!({"extensions": {rmcp::model::TASKS_EXTENSION_ID: {}}}),
            )
            .map_err(|e| internal("naming the tasks extension", e))?;
            return Err(ErrorData::missing_required_client_capability(required));
        }
        let asks = tool.as_ref().is_some_and(|t| t.declaration().asks_client);
        let mut arguments = request.arguments.map(Value::Object);
        if asks {
            // The retry of a question: the client's answers and the tool's
            // own state, checked unaltered, join the arguments.
            let state = match (request.request_state.as_deref(), &self.options.state_key) {
                (Some(token), Some(key)) => Some(asking::verify(key, &name, &principal, token)?),
                (Some(_), None) => {
                    return Err(ErrorData::invalid_params(
                        "requestState is not one this server gave",
                        None,
                    ));
                }
                (None, _) => None,
            };
            let mut args = match arguments {
                Some(Value::Object(args)) => args,
                _ => Map::new(),
            };
            // Never the client's own under these names: only what is checked.
            for key in toolfleet_core::CLIENT_INPUT {
                args.remove(key);
            }
            let responses: Map<String, Value> = request
                .input_responses
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect();
            args.insert("input_responses".into(), Value::Object(responses));
            if let Some(state) = state {
                args.insert("request_state".into(), state);
            }
            let declared = capabilities
                .as_ref()
                .and_then(|c| serde_json::to_value(c).ok())
                .unwrap_or_else(|| json!({}));
            args.insert("client_capabilities".into(), declared);
            arguments = Some(Value::Object(args));
        }
        let params = json!({
            "name": request.name,
            "arguments": arguments,
        });
        let token = context.meta.get_progress_token();
        let (mut call, mut envelope) = self
            .invoke_reporting(principal.clone(), &params, &context, token.clone())
            .await;
        let modern = context
            .protocol_version()
            .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
        if asks && !modern && self.streams(&context) {
            let asking = Asking {
                principal: &principal,
                name: &name,
                arguments: &params["arguments"],
                context: &context,
                token: token.clone(),
            };
            (call, envelope) = self.ask_in_session(asking, call, envelope).await?;
        }
        // Having asked what it needed, the tool hands the call on: the tool
        // it names is called as the client would have called it (a job
        // tool then answers a task to a client of the tasks extension).
        let handed_on = match &envelope {
            Envelope::Ok { result, .. } if asks => asking::handed_on(&result.to_value()),
            _ => None,
        };
        if let Some(next) = handed_on {
            shape = self.runtime.registry().get(&next.name).map(|t| t.shape());
            let mut arguments = next.arguments;
            // The call handed on is a new call: nothing answered yet.
            if let Value::Object(args) = &mut arguments {
                for key in toolfleet_core::CLIENT_INPUT {
                    args.remove(key);
                }
            }
            let params = json!({"name": next.name, "arguments": arguments});
            (call, envelope) = self
                .invoke_reporting(principal.clone(), &params, &context, token.clone())
                .await;
        }
        let result = match &envelope {
            Envelope::Ok { result, .. } if asks && call.name == name => Some(result.to_value()),
            _ => None,
        };
        if let Some((asked, state)) = result.as_ref().and_then(toolfleet_core::client_requests) {
            let Some(key) = self.options.state_key.as_ref().filter(|_| modern) else {
                let error = ToolError::new(
                    toolfleet_core::ErrorCode::Unavailable,
                    "this tool asks the client for input, which needs MCP 2026-07-28 (an `input_required` result) or a 2025 session (initialize, then send its Mcp-Session-Id)",
                );
                return complete(render_result(Format::Mcp, &call, &Envelope::error(error)));
            };
            let requests = asking::requests(asked, capabilities.as_ref())?;
            let state = state.map(|state| asking::sign(key, &name, &principal, state));
            return Ok(CallToolResponse::InputRequired(InputRequiredResult::new(
                Some(requests),
                state,
            )));
        }
        match (&jobs, &envelope) {
            (Some(jobs), Envelope::Running { job_id, .. })
                if shape.is_some_and(Shape::is_enqueued)
                    && capabilities.as_ref().is_some_and(|c| c.supports_tasks()) =>
            {
                let job = match jobs.job(&principal, job_id).await {
                    Ok(Some(job)) => job,
                    Ok(None) => return Err(jobs::no_task(job_id)),
                    Err(error) => return Err(internal("reading a new job", error.message)),
                };
                if let Some(token) = token
                    && self.streams(&context)
                {
                    // Progress while the client polls the task.
                    let (server, jobs, peer) = (self.clone(), jobs.clone(), context.peer.clone());
                    let (tenant, id) = (principal.clone(), job.id.clone());
                    let progress = core_tasks::Progress::Peer(peer);
                    tokio::spawn(async move {
                        server
                            .follow(jobs.as_ref(), &tenant, &id, &token, &progress)
                            .await;
                    });
                }
                let task = self.task(&job).task;
                Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
            }
            // A job call that asked for progress, over either transport:
            // followed (bounded by `max_wait`), its news as notifications.
            (Some(jobs), Envelope::Running { job_id, .. }) if token.is_some() => {
                let token = token.unwrap_or(ProgressToken(rmcp::model::NumberOrString::Number(0)));
                let progress = core_tasks::Progress::Peer(context.peer.clone());
                let envelope = self
                    .follow(jobs.as_ref(), &principal, job_id, &token, &progress)
                    .await
                    .unwrap_or(envelope.clone());
                complete(render_result(Format::Mcp, &call, &envelope))
            }
            (
                Some(jobs),
                Envelope::Suspended {
                    ticket,
                    question,
                    options,
                    // An approval is decided in the inbox, not answered here.
                    plan: None,
                },
            ) if capabilities
                .as_ref()
                .is_some_and(|c| c.elicitation.is_some()) =>
            {
                if modern {
                    // 2026-07-28: ask in the result; the client retries the
                    // call with the answer, to any dispatcher.
                    let params = match elicit_params(question, options) {
                        Ok(params) => params,
                        Err(error) => {
                            return complete(render_result(
                                Format::Mcp,
                                &call,
                                &Envelope::error(error),
                            ));
                        }
                    };
                    let request: InputRequest = serde_json::from_value(json!({
                        "method": "elicitation/create",
                        "params": params,
                    }))
                    .map_err(|e| internal("rendering an elicitation", e))?;
                    let mut requests = InputRequests::new();
                    requests.insert(ANSWER_KEY.to_owned(), request);
                    return Ok(CallToolResponse::InputRequired(InputRequiredResult::new(
                        Some(requests),
                        Some(format!("{TICKET_STATE}{ticket}")),
                    )));
                }
                if !self.streams(&context) {
                    // Stateless HTTP cannot carry a request to the client.
                    return complete(render_result(Format::Mcp, &call, &envelope));
                }
                let result = self
                    .elicit(
                        jobs.as_ref(),
                        &principal,
                        &call,
                        (ticket, question, options),
                        &context.peer,
                    )
                    .await;
                complete(result)
            }
            _ => complete(render_result(Format::Mcp, &call, &envelope)),
        }
    }

    /// The least severe of the log messages tools report during a call that
    /// the client wants. Over stdio it holds for the session; stateless HTTP
    /// keeps nothing between requests, so there it holds for this request
    /// alone, and a call's messages come at every level (2025 revisions) or
    /// at the call's own `_meta` level (2026-07-28).
    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.principal(&context)?;
        let level = serde_json::to_value(request.level)
            .and_then(serde_json::from_value::<LogLevel>)
            .map_err(|e| ErrorData::invalid_params(format!("unknown log level: {e}"), None))?;
        *self.log_level.lock().unwrap_or_else(|e| e.into_inner()) = Some(level);
        Ok(())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let principal = self.principal(&context)?;
        let job = self.job(&principal, &request.task_id).await?;
        Ok(GetTaskResult::new(self.task(&job)))
    }

    /// The client's answers to what a task's tool asks (its
    /// `inputRequests`), for the task's owner alone: bounded
    /// ([`check_responses`]), recorded on the job's input ticket, and the
    /// last one resumes the job. Keys the task does not ask (now), or
    /// answered before, are left out, so a retried update is harmless; the
    /// ack is `{resultType: "complete"}` either way, and `tasks/get` shows
    /// what is still pending.
    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let principal = self.principal(&context)?;
        let jobs = self.jobs()?;
        if !jobs::plausible(&request.task_id) {
            return Err(jobs::no_task(&request.task_id));
        }
        let responses = check_responses(&request.input_responses)?;
        match jobs.respond(&principal, &request.task_id, &responses).await {
            Ok(Some(())) => Ok(()),
            Ok(None) => Err(jobs::no_task(&request.task_id)),
            Err(error) => Err(internal("recording a task's input", error.message)),
        }
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let principal = self.principal(&context)?;
        let jobs = self.jobs()?;
        if !jobs::plausible(&request.task_id) {
            return Err(jobs::no_task(&request.task_id));
        }
        match jobs.cancel(&principal, &request.task_id).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(jobs::no_task(&request.task_id)),
            Err(error) => Err(internal("cancelling a job", error.message)),
        }
    }
}

/// Answers one `tasks/update` may carry, at most.
const MAX_INPUT_RESPONSES: usize = 16;
/// The longest key of an answer, in bytes.
const MAX_INPUT_KEY: usize = 128;
/// The largest answer, as JSON, in bytes.
const MAX_INPUT_RESPONSE: usize = 64 * 1024;

/// `tasks/update`'s answers as the fleet records them, or -32602: at most
/// [`MAX_INPUT_RESPONSES`], each an object (an elicitation's, a sampling's
/// or a roots result) under a key of at most [`MAX_INPUT_KEY`] bytes, of
/// at most [`MAX_INPUT_RESPONSE`] bytes.
fn check_responses(given: &rmcp::model::InputResponses) -> Result<Map<String, Value>, ErrorData> {
    let refuse = |why: String| Err(ErrorData::invalid_params(why, None));
    if given.len() > MAX_INPUT_RESPONSES {
        return refuse(format!(
            "inputResponses has {} answers; at most {MAX_INPUT_RESPONSES}",
            given.len()
        ));
    }
    let mut responses = Map::new();
    for (key, response) in given {
        let shown = toolfleet_core::registry::truncate(key, 64);
        if key.is_empty() || key.len() > MAX_INPUT_KEY {
            return refuse(format!(
                "inputResponses key `{shown}` has {} bytes; keys have 1 to {MAX_INPUT_KEY}",
                key.len()
            ));
        }
        if !response.is_object() {
            return refuse(format!(
                "inputResponses `{shown}` must be an object (the result of the request it answers)"
            ));
        }
        let size = response.to_string().len();
        if size > MAX_INPUT_RESPONSE {
            return refuse(format!(
                "inputResponses `{shown}` has {size} bytes; at most {MAX_INPUT_RESPONSE}"
            ));
        }
        responses.insert(key.clone(), response.clone());
    }
    Ok(responses)
}

/// A call whose tool asks a 2025 client in a session (see
/// [`ToolServer::ask_in_session`]).
struct Asking<'a> {
    principal: &'a Arc<Principal>,
    name: &'a str,
    /// The call's arguments as first given to the tool.
    arguments: &'a Value,
    context: &'a RequestContext<RoleServer>,
    token: Option<ProgressToken>,
}

impl ToolServer {
    /// What the tool asks a 2025 client in a session (or over stdio) is put
    /// to it as requests of the server's, and the tool called again with
    /// the answers, its state and the client's capabilities, round after
    /// round while it asks, up to [`toolfleet_core::MAX_ASKING_ROUNDS`]. A question the
    /// client does not answer ends the call with a tool error naming it.
    async fn ask_in_session(
        &self,
        asking: Asking<'_>,
        mut call: ProviderCall,
        mut envelope: Envelope,
    ) -> Result<(ProviderCall, Envelope), ErrorData> {
        let capabilities = asking.context.client_capabilities();
        let declared = capabilities
            .as_ref()
            .and_then(|c| serde_json::to_value(c).ok())
            .unwrap_or_else(|| json!({}));
        let mut rounds = 0;
        loop {
            let result = match &envelope {
                Envelope::Ok { result, .. } if call.name == asking.name => result.to_value(),
                _ => return Ok((call, envelope)),
            };
            let Some((asked, state)) = toolfleet_core::client_requests(&result) else {
                return Ok((call, envelope));
            };
            if rounds == toolfleet_core::MAX_ASKING_ROUNDS {
                let error = ToolError::new(
                    toolfleet_core::ErrorCode::ToolFailed,
                    format!(
                        "`{}` kept asking the client past {} rounds",
                        asking.name,
                        toolfleet_core::MAX_ASKING_ROUNDS
                    ),
                );
                return Ok((call, Envelope::error(error)));
            }
            rounds += 1;
            let requests = asking::requests(asked, capabilities.as_ref())?;
            let mut responses = Map::new();
            for (key, request) in requests {
                match asking::ask(&asking.context.peer, request).await {
                    Ok(answer) => {
                        responses.insert(key, answer);
                    }
                    Err(why) => {
                        let error = ToolError::new(
                            toolfleet_core::ErrorCode::Unavailable,
                            format!("the client did not answer `{key}`: {why}"),
                        );
                        return Ok((call, Envelope::error(error)));
                    }
                }
            }
            let mut args = asking.arguments.as_object().cloned().unwrap_or_default();
            args.insert("input_responses".into(), Value::Object(responses));
            match state {
                Some(state) => args.insert("request_state".into(), state.clone()),
                None => args.remove("request_state"),
            };
            args.insert("client_capabilities".into(), declared.clone());
            let params = json!({"name": asking.name, "arguments": args});
            (call, envelope) = self
                .invoke_reporting(
                    asking.principal.clone(),
                    &params,
                    asking.context,
                    asking.token.clone(),
                )
                .await;
        }
    }
}

impl ToolServer {
    fn jobs(&self) -> Result<&Arc<dyn Jobs>, ErrorData> {
        self.options.jobs.as_ref().ok_or_else(|| {
            ErrorData::new(
                ErrorCode::METHOD_NOT_FOUND,
                "tasks are not served here",
                None,
            )
        })
    }

    /// The tenant's job named by a task id.
    async fn job(&self, principal: &Principal, id: &str) -> Result<JobView, ErrorData> {
        let jobs = self.jobs()?;
        if !jobs::plausible(id) {
            return Err(jobs::no_task(id));
        }
        match jobs.job(principal, id).await {
            Ok(Some(job)) => Ok(job),
            Ok(None) => Err(jobs::no_task(id)),
            Err(error) => Err(internal("reading a job", error.message)),
        }
    }
}

/// A rendered tool result as rmcp's.
fn complete(result: Value) -> Result<CallToolResponse, ErrorData> {
    let mut result: CallToolResult =
        serde_json::from_value(result).map_err(|e| internal("rendering a tool result", e))?;
    // 2026-07-28 requires it; rmcp drops it for older peers.
    result.result_type = Some(ResultType::COMPLETE);
    Ok(CallToolResponse::Complete(result))
}

/// MCP over stdin and stdout as `principal`, until the client closes stdin.
pub async fn serve_stdio(
    runtime: Arc<Runtime>,
    principal: Arc<Principal>,
    options: Options,
) -> Result<(), String> {
    let max_line = options.max_body;
    let server = ToolServer::new(runtime, Some(principal.clone()), options);
    let (transport, writing) = core_tasks::stdio(
        server.clone(),
        principal,
        tokio::io::stdin(),
        tokio::io::stdout(),
        max_line,
    );
    let running = server
        .serve(transport)
        .await
        .map_err(|e| format!("MCP over stdio could not start: {e}"))?;
    let stopped = running
        .waiting()
        .await
        .map(|_| ())
        .map_err(|e| format!("MCP over stdio stopped: {e}"));
    // Everything rmcp wrote reaches stdout before the process ends.
    let _ = writing.await;
    stopped
}

#[cfg(test)]
mod tests;
