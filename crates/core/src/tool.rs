//! A tool declaration: what a tool is, written once, in Rust or in configuration.
//!
//! A declaration is data plus an executor. It is checked when it is registered
//! (see [`crate::Registry`]); nothing here runs a tool or touches the outside.

use std::collections::BTreeSet;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::envelope::{Json, ToolError};
use crate::middleware::{Layer, RateLimit};

/// The six shapes of docs/ARCHITECTURE.md. The shape fixes a tool's contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// A read that answers inline.
    Query,
    /// A read whose large result comes back as a handle to page through.
    Handle,
    /// A change that runs only once its caller confirms it with a token.
    Command,
    /// Work enqueued on the fleet as a job and polled for.
    Job,
    /// A sub-agent's model loop, run as a job on the agent pool.
    Agent,
    /// A question a person answers through a ticket.
    Human,
}

impl Shape {
    /// The shape's name as declarations and envelopes write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Shape::Query => "query",
            Shape::Handle => "handle",
            Shape::Command => "command",
            Shape::Job => "job",
            Shape::Agent => "agent",
            Shape::Human => "human",
        }
    }

    /// Shapes whose work goes to the fleet rather than running inline.
    pub fn is_enqueued(self) -> bool {
        matches!(self, Shape::Job | Shape::Agent)
    }

    /// The hints a shape implies when a declaration leaves them out.
    fn default_hints(self) -> ResolvedHints {
        let reads = matches!(self, Shape::Query | Shape::Handle);
        ResolvedHints {
            read_only: reads,
            destructive: !reads && self != Shape::Human,
            idempotent: reads,
            open_world: self == Shape::Human,
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Hints as declared; `None` takes the shape's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hints {
    /// The tool only reads; `None` takes the shape's default.
    pub read_only: Option<bool>,
    /// The tool may destroy data; `None` takes the shape's default.
    pub destructive: Option<bool>,
    /// Calling the tool twice with the same arguments does no more than once.
    pub idempotent: Option<bool>,
    /// The tool reaches outside the system (people, the internet).
    pub open_world: Option<bool>,
}

/// Hints after the shape's defaults are applied: what clients are told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ResolvedHints {
    /// The tool only reads.
    pub read_only: bool,
    /// The tool may destroy data.
    pub destructive: bool,
    /// Repeating a call with the same arguments does no more than once.
    pub idempotent: bool,
    /// The tool reaches outside the system.
    pub open_world: bool,
}

impl Hints {
    pub(crate) fn resolve(self, shape: Shape) -> ResolvedHints {
        let d = shape.default_hints();
        let read_only = self.read_only.unwrap_or(d.read_only);
        ResolvedHints {
            read_only,
            // A tool that only reads destroys nothing.
            destructive: self.destructive.unwrap_or(d.destructive && !read_only),
            idempotent: self.idempotent.unwrap_or(d.idempotent || read_only),
            open_world: self.open_world.unwrap_or(d.open_world),
        }
    }
}

/// Who is calling: the identity every policy and every key is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The tenant the caller acts in; every job, ticket and key is scoped to it.
    pub tenant: String,
    /// The user within the tenant.
    pub user: String,
    /// The scopes the caller was granted.
    pub scopes: BTreeSet<String>,
}

impl Principal {
    /// A principal of `user` in `tenant` holding `scopes`.
    pub fn new<S: Into<String>>(
        tenant: impl Into<String>,
        user: impl Into<String>,
        scopes: impl IntoIterator<Item = S>,
    ) -> Self {
        Principal {
            tenant: tenant.into(),
            user: user.into(),
            scopes: scopes.into_iter().map(Into::into).collect(),
        }
    }

    /// Holds `scope`.
    pub fn has_scope(&self, scope: &str) -> bool {
        self.scopes.contains(scope)
    }

    /// Holds [`FLEET_READ`] or [`FLEET_OPERATE`]: sees every job and
    /// ticket of its tenant, not only its own.
    pub fn reads_fleet(&self) -> bool {
        self.has_scope(FLEET_READ) || self.has_scope(FLEET_OPERATE)
    }

    /// Holds [`FLEET_OPERATE`]: also cancels every job and answers every
    /// ticket of its tenant.
    pub fn operates_fleet(&self) -> bool {
        self.has_scope(FLEET_OPERATE)
    }
}

/// The scope that lets a principal read, list and stream every job and
/// ticket of its tenant; without it, a principal sees only its own.
pub const FLEET_READ: &str = "fleet:read";
/// The scope of [`FLEET_READ`] that also lets a principal cancel every job
/// and answer every ticket of its tenant.
pub const FLEET_OPERATE: &str = "fleet:operate";

/// Who may answer the tickets of a human tool, beside holders of
/// [`FLEET_OPERATE`], who always may. Written `"caller"` or
/// `{ scope = "expenses:approve" }`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "AnsweredByText", into = "AnsweredByText")]
pub enum AnsweredBy {
    /// The user whose call made the ticket.
    #[default]
    Caller,
    /// Any holder of this scope in the tenant.
    Scope {
        /// The scope an answerer holds.
        scope: String,
    },
}

/// [`AnsweredBy`] as configuration writes it.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum AnsweredByText {
    Word(String),
    Scope { scope: String },
}

impl TryFrom<AnsweredByText> for AnsweredBy {
    type Error = String;

    fn try_from(text: AnsweredByText) -> Result<Self, String> {
        match text {
            AnsweredByText::Word(word) if word == "caller" => Ok(AnsweredBy::Caller),
            AnsweredByText::Word(other) => Err(format!(
                "answered_by = {other:?} is not known: use \"caller\" or {{ scope = \"...\" }}"
            )),
            AnsweredByText::Scope { scope } if scope.is_empty() || scope.len() > 128 => {
                Err("answered_by.scope must name a scope of 1 to 128 characters".to_owned())
            }
            AnsweredByText::Scope { scope } => Ok(AnsweredBy::Scope { scope }),
        }
    }
}

impl From<AnsweredBy> for AnsweredByText {
    fn from(who: AnsweredBy) -> Self {
        match who {
            AnsweredBy::Caller => AnsweredByText::Word("caller".to_owned()),
            AnsweredBy::Scope { scope } => AnsweredByText::Scope { scope },
        }
    }
}

impl AnsweredBy {
    /// The scope an answerer needs, `None` for the caller alone.
    pub fn scope(&self) -> Option<&str> {
        match self {
            AnsweredBy::Caller => None,
            AnsweredBy::Scope { scope } => Some(scope),
        }
    }

    /// From a stored scope: `None` is the caller.
    pub fn from_scope(scope: Option<String>) -> Self {
        match scope {
            None => AnsweredBy::Caller,
            Some(scope) => AnsweredBy::Scope { scope },
        }
    }
}

/// The context of one call: principal, run and call ids, and the keys a
/// caller may attach.
#[derive(Debug, Clone)]
pub struct CallCtx {
    /// Who makes the call.
    pub principal: Arc<Principal>,
    /// The agent run this call belongs to; its events and audit share it.
    pub run_id: String,
    /// This call; the `ok` envelope carries it.
    pub call_id: String,
    /// The caller's idempotency key (jobs) or, for the executor of a command,
    /// the confirm token. Downstream systems deduplicate on it.
    pub idempotency_key: Option<String>,
    /// Where to announce the settled job (checked against the allow-list by the server).
    pub callback_url: Option<String>,
    /// Set when a sub-agent's loop makes the call: whose run it serves, how
    /// deep it is, and what is left of the calling agent's budget.
    pub lineage: Option<Lineage>,
    /// Where the call reports progress and log messages while it runs, when
    /// its caller listens (an MCP client); `None`: nobody does, and a tool's
    /// reports are dropped.
    pub events: Option<CallEvents>,
    /// The span of the trace this call belongs to (W3C trace context): the
    /// job it makes continues the trace under it. `None`: a job starts one.
    pub trace: Option<crate::TraceContext>,
    /// Set by a run's loop for a command its assistant names in `approve`:
    /// its commit waits for this approval, whatever the tool declares.
    pub approval: Option<AnsweredBy>,
    /// When the job this call makes may start, in Unix milliseconds (the
    /// call's `run_at` or `delay_s`); `None`: at once. Only job and agent
    /// tools take one.
    pub run_at: Option<i64>,
    /// The priority of the job this call makes (higher first, within
    /// [`PRIORITIES`]); `None`: its tool's. Only tools of ordered pools
    /// take one (see [`ToolDecl::priority`]).
    pub priority: Option<i16>,
    /// Whether the MCP server put the arguments [`CLIENT_INPUT`] names
    /// there itself (checked: a client's answers, the tool's own signed
    /// state, the client's declared capabilities). Otherwise a tool that
    /// asks the client (`asks_client`) never sees them: whatever a caller
    /// gives under those names is dropped before the call.
    pub client_input: bool,
}

/// The arguments only the server gives a tool that asks the client (see
/// [`CallCtx::client_input`]).
pub const CLIENT_INPUT: [&str; 3] = ["input_responses", "request_state", "client_capabilities"];

/// Rounds of questions one call or one job of a tool that asks its client
/// may ask, at most.
pub const MAX_ASKING_ROUNDS: usize = 16;

/// What a tool that asks its client (`asks_client`) answered instead of
/// its result: its `input_requests` by key (at least one) and the
/// `request_state` it hands on, if any; `None` for a plain result. Read
/// alike by the MCP server (a call answered at once) and the worker (a
/// job).
pub fn client_requests(
    result: &Value,
) -> Option<(&serde_json::Map<String, Value>, Option<&Value>)> {
    let requests = result.get("input_requests")?.as_object()?;
    if requests.is_empty() {
        return None;
    }
    let state = result.get("request_state").filter(|s| !s.is_null());
    Some((requests, state))
}

/// How many of a tool's jobs may run at once, per key: `concurrency = {
/// limit, key }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Concurrency {
    /// The most running at once per key, across the fleet (1 to
    /// [`MAX_CONCURRENCY`]).
    pub limit: u32,
    /// What the jobs are counted by.
    pub key: CountedBy,
}

/// The longest value of the arguments a count is kept by, as canonical
/// JSON.
const MAX_KEY_VALUE: usize = 256;

/// How often a tool's executor may start: `start_rate = { max, per_s,
/// key }`, counted as `rate_limit` counts calls.
#[derive(Debug, Clone, PartialEq)]
pub struct StartRate {
    /// At most `max` starts per `per`, a burst of `max` at most.
    pub limit: RateLimit,
    /// What the starts are counted by, within a tenant.
    pub by: CountedBy,
}

/// The largest [`Concurrency::limit`].
pub const MAX_CONCURRENCY: u32 = 10_000;

/// What a tool's running jobs (`concurrency`) or calls (`rate_limit`) are
/// counted by: always within the caller's tenant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CountedBy {
    /// One count per tenant: `key = "tenant"`.
    #[default]
    Tenant,
    /// One count per user of the tenant: `key = "user"`.
    User,
    /// One count per value of the arguments at a JSON pointer:
    /// `key = "/account"`.
    Pointer(String),
}

impl CountedBy {
    /// The count of a call of `tool` by `ctx` with `args` belongs to: the
    /// tenant, and the user or the argument's value (canonical JSON) after
    /// it, joined by a separator no name holds; the error a model can act
    /// on when the argument is missing or too long.
    pub fn scope(
        &self,
        tool: &str,
        ctx: &CallCtx,
        args: &Value,
        what: &str,
    ) -> Result<String, crate::ToolError> {
        use crate::{ErrorCode, ToolError};
        let value = match self {
            CountedBy::Tenant => return Ok(ctx.tenant().to_owned()),
            CountedBy::User => ctx.user().to_owned(),
            CountedBy::Pointer(pointer) => {
                let Some(value) = args.pointer(pointer) else {
                    return Err(ToolError::new(
                        ErrorCode::InvalidArguments,
                        format!(
                            "`{tool}` counts its {what} by the argument at `{pointer}`, which \
                             this call does not give: give it"
                        ),
                    ));
                };
                let text = crate::middleware::canonical_json(value);
                if text.len() > MAX_KEY_VALUE {
                    return Err(ToolError::new(
                        ErrorCode::InvalidArguments,
                        format!(
                            "the argument at `{pointer}`, which `{tool}` counts its {what} by, \
                             is longer than {MAX_KEY_VALUE} characters: give a shorter one"
                        ),
                    ));
                }
                text
            }
        };
        Ok(format!("{}\u{1f}{value}", ctx.tenant()))
    }

    /// How the count is described to a model: `per tenant`, `per user`,
    /// `per value of /account`.
    pub fn describe(&self) -> String {
        match self {
            CountedBy::Tenant => "per tenant".to_owned(),
            CountedBy::User => "per user".to_owned(),
            CountedBy::Pointer(pointer) => format!("per value of `{pointer}`"),
        }
    }

    /// The key as configured: `tenant`, `user`, or a JSON pointer
    /// (`/account`); `None` for anything else.
    pub fn parse(text: &str) -> Option<CountedBy> {
        match text {
            "tenant" => Some(CountedBy::Tenant),
            "user" => Some(CountedBy::User),
            pointer if pointer.starts_with('/') && pointer.len() <= 256 => {
                Some(CountedBy::Pointer(pointer.to_owned()))
            }
            _ => None,
        }
    }
}

/// The priorities a job may have: higher first, 0 when neither the call
/// nor its tool gives one.
pub const PRIORITIES: std::ops::RangeInclusive<i16> = -100..=100;

/// A call's `priority` as it was given (any JSON), within [`PRIORITIES`],
/// or the `bad_request` naming the field and its bounds.
pub fn priority_of(value: &Value) -> Result<i16, crate::ToolError> {
    value
        .as_i64()
        .and_then(|n| i16::try_from(n).ok())
        .filter(|n| PRIORITIES.contains(n))
        .ok_or_else(|| {
            crate::ToolError::new(
                crate::ErrorCode::BadRequest,
                format!(
                    "`priority` must be a whole number from {} to {} (higher first): got {}",
                    PRIORITIES.start(),
                    PRIORITIES.end(),
                    crate::registry::truncate(&value.to_string(), 32)
                ),
            )
        })
}

/// Something a running call tells its caller before its result.
#[derive(Debug, Clone, PartialEq)]
pub enum CallEvent {
    /// How far the call has got: `progress` of `total` (when known).
    Progress {
        /// The work done so far.
        progress: f64,
        /// The work there is in all, when known.
        total: Option<f64>,
        /// What the call is doing now.
        message: Option<String>,
    },
    /// A log message at a syslog severity.
    Log {
        /// How severe the message is.
        level: LogLevel,
        /// The message.
        message: String,
    },
}

/// The syslog severities of a [`CallEvent::Log`], least severe first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    /// Detail for debugging.
    Debug,
    /// Information.
    Info,
    /// Normal but significant.
    Notice,
    /// A warning.
    Warning,
    /// An error.
    Error,
    /// A critical condition.
    Critical,
    /// Action must be taken at once.
    Alert,
    /// The system is unusable.
    Emergency,
}

/// The listener of a call's [`CallEvent`]s. Reporting never blocks the
/// tool: a listener queues what it cannot forward at once.
#[derive(Clone)]
pub struct CallEvents(Arc<dyn Fn(CallEvent) + Send + Sync>);

impl CallEvents {
    /// A listener that hands each event to `listener`.
    pub fn new(listener: impl Fn(CallEvent) + Send + Sync + 'static) -> Self {
        CallEvents(Arc::new(listener))
    }

    /// Hands `event` to the listener.
    pub fn report(&self, event: CallEvent) {
        (self.0)(event)
    }
}

impl fmt::Debug for CallEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CallEvents(..)")
    }
}

/// Where a call made by a sub-agent stands in the tree of agents. Travels
/// with a job (stored beside it), so an agent tool called by an agent
/// knows its depth and its ceiling on whichever worker it runs.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Lineage {
    /// The run id of the call that started the calling agent: audit records
    /// of the agent's steps carry it beside the agent's own run id.
    pub parent_run_id: String,
    /// Agents between the client and this call: 1 for a call made by an
    /// agent a client called.
    pub depth: u32,
    /// What is left of the calling agent's budget; an agent tool called
    /// here runs within it.
    pub budget: Budget,
}

/// The limits of an agent's loop; the loop stops at the first reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Budget {
    /// Model calls.
    pub max_steps: u32,
    /// Input plus output tokens, as the model reports them.
    pub max_tokens: u64,
    /// Wall time from the job's first start, in milliseconds.
    pub max_wall_ms: u64,
}

impl Budget {
    /// The tighter of the two in each dimension.
    pub fn within(self, ceiling: Budget) -> Budget {
        Budget {
            max_steps: self.max_steps.min(ceiling.max_steps),
            max_tokens: self.max_tokens.min(ceiling.max_tokens),
            max_wall_ms: self.max_wall_ms.min(ceiling.max_wall_ms),
        }
    }
}

impl CallCtx {
    /// A fresh call for `principal`, its run id the same as its call id.
    pub fn new(principal: Arc<Principal>) -> Self {
        let call_id = new_id();
        CallCtx {
            principal,
            run_id: call_id.clone(),
            call_id,
            idempotency_key: None,
            callback_url: None,
            lineage: None,
            events: None,
            trace: None,
            approval: None,
            run_at: None,
            priority: None,
            client_input: false,
        }
    }

    /// Reports `event` to whoever listens to this call, if anyone does.
    pub fn report(&self, event: CallEvent) {
        if let Some(events) = &self.events {
            events.report(event);
        }
    }

    /// The call as part of the agent run `run_id`.
    pub fn with_run_id(mut self, run_id: impl Into<String>) -> Self {
        self.run_id = run_id.into();
        self
    }

    /// The call with the caller's idempotency key.
    pub fn with_idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// The caller's tenant.
    pub fn tenant(&self) -> &str {
        &self.principal.tenant
    }

    /// The calling user.
    pub fn user(&self) -> &str {
        &self.principal.user
    }
}

/// A new time-ordered id (UUIDv7).
pub fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// True for an id of the form [`new_id`] makes (a hyphenated UUID): what a
/// job id must be before anyone looks it up.
pub fn is_job_id(id: &str) -> bool {
    id.len() == 36
        && id.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

/// Unix milliseconds now, as the store counts time (0 before 1970).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Unix milliseconds as RFC 3339 (ISO 8601) UTC, to the millisecond:
/// `2026-12-02T14:05:00.000Z`.
pub fn iso8601(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The pool of a job or agent tool that names none.
pub const DEFAULT_POOL: &str = "default";

/// Runs a tool's work. Implemented for async closures by [`executor_fn`] and
/// [`executor_value`]; the fleet adds executors that call out over HTTP or
/// run programs.
pub trait Executor: Send + Sync + 'static {
    /// Runs one call of the tool on its validated arguments; the result is encoded JSON.
    fn execute(&self, ctx: CallCtx, args: Value) -> BoxFuture<'static, Result<Json, ToolError>>;
}

struct FnExecutor<F>(F);

impl<F, Fut> Executor for FnExecutor<F>
where
    F: Fn(CallCtx, Value) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Json, ToolError>> + Send + 'static,
{
    fn execute(&self, ctx: CallCtx, args: Value) -> BoxFuture<'static, Result<Json, ToolError>> {
        Box::pin((self.0)(ctx, args))
    }
}

/// An executor from an async function of typed arguments and a serialisable
/// output. Arguments that do not decode answer `invalid_arguments`.
pub fn executor_fn<A, T, F, Fut>(f: F) -> Arc<dyn Executor>
where
    A: DeserializeOwned + Send + 'static,
    T: Serialize + Send + 'static,
    F: Fn(CallCtx, A) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, ToolError>> + Send + 'static,
{
    let f = Arc::new(f);
    Arc::new(FnExecutor(move |ctx: CallCtx, args: Value| {
        let f = f.clone();
        async move {
            let args: A = serde_json::from_value(args)
                .map_err(|e| ToolError::invalid_arguments(format!("arguments: {e}")))?;
            let out = f(ctx, args).await?;
            Json::encode(&out).map_err(|e| {
                ToolError::failed(format!("the result could not be encoded: {e}"), false)
            })
        }
    }))
}

/// An executor from an async function of raw JSON arguments.
pub fn executor_value<F, Fut>(f: F) -> Arc<dyn Executor>
where
    F: Fn(CallCtx, Value) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Json, ToolError>> + Send + 'static,
{
    Arc::new(FnExecutor(f))
}

/// The middleware a tool declares. The runtime composes it at call time in
/// the fixed order audit, redact, authorise, rate limit, cache, timeout,
/// custom layers, tool, whatever order it was written in.
#[derive(Clone, Default)]
pub struct MiddlewareSpec {
    /// Records each call in the audit log.
    pub audit: bool,
    /// The scopes a caller must hold, all of them.
    pub scopes: Vec<String>,
    /// How often the tool may be called, per tenant.
    pub rate_limit: Option<RateLimit>,
    /// What `rate_limit` counts by: the tenant (the default), its users,
    /// or the values of an argument.
    pub rate_limit_by: CountedBy,
    /// How long a read's `ok` answer is cached, per tenant, user and arguments.
    pub cache_ttl: Option<Duration>,
    /// How long a call may run before it fails with a timeout.
    pub timeout: Option<Duration>,
    /// Fields masked in audit records and in results.
    pub redact: Vec<String>,
    /// Layers of the user's own, innermost after the built-in ones.
    pub custom: Vec<Arc<dyn Layer>>,
}

impl fmt::Debug for MiddlewareSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MiddlewareSpec")
            .field("audit", &self.audit)
            .field("scopes", &self.scopes)
            .field("rate_limit", &self.rate_limit)
            .field("rate_limit_by", &self.rate_limit_by)
            .field("cache_ttl", &self.cache_ttl)
            .field("timeout", &self.timeout)
            .field("redact", &self.redact)
            .field("custom", &self.custom.len())
            .finish()
    }
}

/// A tool as declared, before registration checks it.
#[derive(Clone)]
pub struct ToolDecl {
    /// The name clients call the tool by, unique in a registry.
    pub name: String,
    /// A human-readable title for clients that show one.
    pub title: Option<String>,
    /// What the tool does and when to call it, for the model.
    pub description: String,
    /// The tool's shape, which fixes its contract.
    pub shape: Shape,
    /// The JSON Schema the arguments are validated against.
    pub input_schema: Value,
    /// The JSON Schema of the result, when declared.
    pub output_schema: Option<Value>,
    /// The hints as declared.
    pub hints: Hints,
    /// The middleware the tool declares.
    pub middleware: MiddlewareSpec,
    /// Runs the tool. Human tools have none: a person answers them.
    pub executor: Option<Arc<dyn Executor>>,
    /// Handle tools: results larger than this many bytes become a handle.
    pub handle_threshold: Option<usize>,
    /// Job and agent tools: the poll hint of the `running` answer.
    pub poll_after_s: Option<u32>,
    /// Job and agent tools: the worker pool that runs them.
    pub pool: Option<String>,
    /// Job and agent tools: how many times a retryable failure is tried.
    pub max_attempts: Option<u32>,
    /// Job and agent tools: the priority of a call that gives none (higher
    /// first, within [`PRIORITIES`]). Declaring one makes the tool's pool
    /// ordered: its workers take the waiting job of highest priority first,
    /// and calls of its tools may give a `priority`.
    pub priority: Option<i16>,
    /// Job and agent tools: at most so many of its jobs run at once per
    /// key, across the fleet; the others wait in order. Declaring it makes
    /// the tool's pool ordered, as [`ToolDecl::priority`] does.
    pub concurrency: Option<Concurrency>,
    /// Job and agent tools: how often their executor may start, across the
    /// fleet (for a downstream API that allows so many calls a second): a
    /// job over it waits for a start, `retrying`, without spending an
    /// attempt; it never fails for it.
    pub start_rate: Option<StartRate>,
    /// The result is MCP content: `{"content": [blocks]}` of text, image,
    /// audio and resource blocks, which MCP clients get as such (other
    /// providers get the JSON). For tools that answer pictures or files.
    pub content_blocks: bool,
    /// The tool may ask an MCP client for input before it answers: a result
    /// `{"input_requests": {key: {"method", "params"}}, "request_state"?}`
    /// reaches a 2026-07-28 client as an `input_required` result, and its
    /// retry calls the tool again with the arguments plus `input_responses`
    /// (the client's answers by key), `request_state` (as the tool gave
    /// it, checked unaltered) and `client_capabilities`. Its input schema
    /// must admit those three arguments. A result `{"call": {"name",
    /// "arguments"}}` hands the call on to that tool, for the same caller.
    pub asks_client: bool,
    /// Job and agent tools: over MCP they run only as tasks. Their
    /// `execution.taskSupport` is `required`, and a call from a client that
    /// speaks no tasks is refused (-32021, naming the tasks extension)
    /// before any job is made, rather than answered `running`.
    pub requires_task: bool,
    /// The argument, in seconds, a call of this tool may wait (`get_job`'s
    /// `wait_s`): a call where it is above 0 is a long poll, counted in
    /// `toolfleet_calls_total` but not timed in
    /// `toolfleet_call_duration_seconds`, whose time is work, not waiting.
    pub long_poll: Option<String>,
    /// Human tools: who may answer their tickets.
    pub answered_by: AnsweredBy,
    /// Command tools: whose approval every commit waits for; `None`: none.
    pub approval: Option<AnsweredBy>,
    /// Human tools and commands: how long a ticket (a question, an
    /// approval) stays open before it expires; `None`: never.
    pub expires_in: Option<std::time::Duration>,
}

impl fmt::Debug for ToolDecl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolDecl")
            .field("name", &self.name)
            .field("shape", &self.shape)
            .field("hints", &self.hints)
            .field("middleware", &self.middleware)
            .finish_non_exhaustive()
    }
}

impl ToolDecl {
    /// A declaration of `shape` with an empty object schema.
    pub fn new(name: impl Into<String>, shape: Shape) -> Self {
        ToolDecl {
            name: name.into(),
            title: None,
            description: String::new(),
            shape,
            input_schema: serde_json::json!({"type": "object"}),
            output_schema: None,
            hints: Hints::default(),
            middleware: MiddlewareSpec::default(),
            executor: None,
            handle_threshold: None,
            poll_after_s: None,
            pool: None,
            max_attempts: None,
            priority: None,
            concurrency: None,
            start_rate: None,
            content_blocks: false,
            asks_client: false,
            requires_task: false,
            long_poll: None,
            answered_by: AnsweredBy::Caller,
            approval: None,
            expires_in: None,
        }
    }

    /// A declaration of a query tool.
    pub fn query(name: impl Into<String>) -> Self {
        ToolDecl::new(name, Shape::Query)
    }
    /// A declaration of a handle tool.
    pub fn handle(name: impl Into<String>) -> Self {
        ToolDecl::new(name, Shape::Handle)
    }
    /// A declaration of a command tool.
    pub fn command(name: impl Into<String>) -> Self {
        ToolDecl::new(name, Shape::Command)
    }
    /// A declaration of a job tool.
    pub fn job(name: impl Into<String>) -> Self {
        ToolDecl::new(name, Shape::Job)
    }
    /// A declaration of an agent tool.
    pub fn agent(name: impl Into<String>) -> Self {
        ToolDecl::new(name, Shape::Agent)
    }
    /// A declaration of a human tool.
    pub fn human(name: impl Into<String>) -> Self {
        ToolDecl::new(name, Shape::Human)
    }

    /// Human tools: who may answer their tickets (the caller by default).
    pub fn answered_by(mut self, who: AnsweredBy) -> Self {
        self.answered_by = who;
        self
    }

    /// Makes every commit of this command wait for `who`'s approval.
    pub fn approval(mut self, who: AnsweredBy) -> Self {
        self.approval = Some(who);
        self
    }

    /// Makes this tool's tickets (a human tool's questions, a command's
    /// approvals) expire unanswered after `after`.
    pub fn expires_in(mut self, after: std::time::Duration) -> Self {
        self.expires_in = Some(after);
        self
    }

    /// Sets the title clients show.
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(title.into());
        self
    }
    /// Sets the description the model reads.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }
    /// Sets the JSON Schema of the arguments.
    pub fn input_schema(mut self, schema: Value) -> Self {
        self.input_schema = schema;
        self
    }
    /// Sets the JSON Schema of the result.
    pub fn output_schema(mut self, schema: Value) -> Self {
        self.output_schema = Some(schema);
        self
    }
    /// Sets all hints at once.
    pub fn hints(mut self, hints: Hints) -> Self {
        self.hints = hints;
        self
    }
    /// Declares whether the tool only reads.
    pub fn read_only(mut self, yes: bool) -> Self {
        self.hints.read_only = Some(yes);
        self
    }
    /// Declares whether the tool may destroy data.
    pub fn destructive(mut self, yes: bool) -> Self {
        self.hints.destructive = Some(yes);
        self
    }
    /// Declares whether repeating a call does no more than once.
    pub fn idempotent(mut self, yes: bool) -> Self {
        self.hints.idempotent = Some(yes);
        self
    }
    /// Declares whether the tool reaches outside the system.
    pub fn open_world(mut self, yes: bool) -> Self {
        self.hints.open_world = Some(yes);
        self
    }
    /// Sets the executor that runs the tool.
    pub fn executor(mut self, executor: Arc<dyn Executor>) -> Self {
        self.executor = Some(executor);
        self
    }
    /// Runs `f` on typed arguments; see [`executor_fn`].
    pub fn run<A, T, F, Fut>(self, f: F) -> Self
    where
        A: DeserializeOwned + Send + 'static,
        T: Serialize + Send + 'static,
        F: Fn(CallCtx, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, ToolError>> + Send + 'static,
    {
        self.executor(executor_fn(f))
    }
    /// Handle tools: results larger than `bytes` become a handle.
    pub fn handle_threshold(mut self, bytes: usize) -> Self {
        self.handle_threshold = Some(bytes);
        self
    }
    /// Job and agent tools: the poll hint of the `running` answer, in seconds.
    pub fn poll_after_s(mut self, seconds: u32) -> Self {
        self.poll_after_s = Some(seconds);
        self
    }
    /// Job and agent tools: the worker pool that runs them.
    pub fn pool(mut self, pool: impl Into<String>) -> Self {
        self.pool = Some(pool.into());
        self
    }
    /// See [`ToolDecl::content_blocks`].
    pub fn content_blocks(mut self) -> Self {
        self.content_blocks = true;
        self
    }

    /// Job and agent tools: how many times a retryable failure is tried.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// Job and agent tools: the priority of a call that gives none; see
    /// [`ToolDecl::priority`].
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = Some(priority);
        self
    }

    /// Job and agent tools: at most `limit.max` executor starts per
    /// `limit.per`, counted `by`; see [`ToolDecl::start_rate`].
    pub fn start_rate(mut self, limit: RateLimit, by: CountedBy) -> Self {
        self.start_rate = Some(StartRate { limit, by });
        self
    }

    /// Job and agent tools: at most `limit` jobs running at once per `key`;
    /// see [`ToolDecl::concurrency`].
    pub fn concurrency(mut self, limit: u32, key: CountedBy) -> Self {
        self.concurrency = Some(Concurrency { limit, key });
        self
    }

    /// See [`ToolDecl::long_poll`]: `arg` names the seconds a call waits.
    pub fn long_poll(mut self, arg: impl Into<String>) -> Self {
        self.long_poll = Some(arg.into());
        self
    }

    // Middleware, in any order: the runtime fixes the order.
    /// Records each call in the audit log.
    pub fn audit(mut self) -> Self {
        self.middleware.audit = true;
        self
    }
    /// Requires callers to hold `scope` (in addition to any already required).
    pub fn require_scope(mut self, scope: impl Into<String>) -> Self {
        self.middleware.scopes.push(scope.into());
        self
    }
    /// Limits how often the tool may be called, per tenant.
    pub fn rate_limit(mut self, limit: RateLimit) -> Self {
        self.middleware.rate_limit = Some(limit);
        self
    }
    /// Caches a read's `ok` answers for `ttl`, per tenant, user and arguments.
    pub fn cache_reads(mut self, ttl: Duration) -> Self {
        self.middleware.cache_ttl = Some(ttl);
        self
    }
    /// Fails a call that runs longer than `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.middleware.timeout = Some(timeout);
        self
    }
    /// Masks these fields in audit records and in results.
    pub fn redact<S: Into<String>>(mut self, fields: impl IntoIterator<Item = S>) -> Self {
        self.middleware
            .redact
            .extend(fields.into_iter().map(Into::into));
        self
    }
    /// Adds a layer of the user's own.
    pub fn layer(mut self, layer: Arc<dyn Layer>) -> Self {
        self.middleware.custom.push(layer);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_result_asks_the_client_only_with_a_request() {
        let asked = json!({"input_requests": {"a": {}}, "request_state": 1});
        let (requests, state) = client_requests(&asked).expect("asks");
        assert_eq!((requests.len(), state), (1, Some(&json!(1))));
        let stateless = json!({"input_requests": {"a": {}}, "request_state": null});
        assert_eq!(client_requests(&stateless).map(|(_, s)| s), Some(None));
        assert!(client_requests(&json!({"input_requests": {}})).is_none());
        assert!(client_requests(&json!({"text": "done"})).is_none());
    }

    #[test]
    fn shapes_imply_honest_default_hints() {
        let q = Hints::default().resolve(Shape::Query);
        assert!(q.read_only && q.idempotent && !q.destructive && !q.open_world);
        let c = Hints::default().resolve(Shape::Command);
        assert!(!c.read_only && c.destructive && !c.idempotent);
        let h = Hints::default().resolve(Shape::Human);
        assert!(h.open_world && !h.destructive);
        let declared = Hints {
            destructive: Some(false),
            idempotent: Some(true),
            ..Hints::default()
        }
        .resolve(Shape::Command);
        assert!(!declared.destructive && declared.idempotent);
    }
}
