//! The runtime: one entry point, [`Runtime::invoke`], for every call.
//!
//! A call is looked up, its arguments validated, its tool's middleware run,
//! and then its shape's contract: query and handle run inline, commands run
//! the two-step protocol, jobs and agents are handed to the fleet, human
//! tools open a ticket. Whatever happens, `invoke` answers an [`Envelope`]:
//! no panic and no `Err` escapes it.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde_json::{Value, json};

use crate::envelope::{Envelope, ErrorCode, Json, ToolError};
use crate::metrics::{Metrics, UNKNOWN_TOOL};
use crate::middleware::{
    AuditSink, Call, Endpoint, LayerServices, MemoryAuditSink, Next, RateLimits, ReadCache,
    TokenBuckets, redact_json,
};
use crate::registry::{RegistrationError, Registry, Tool};
use crate::shapes::command::{
    Binding, Claim, ClaimTerms, Commit, CommitLog, ConfirmSigner, MemoryCommitLog, OUTCOME_MARGIN,
    abandoned, commit_key, in_flight, is_commit, unix_now,
};
use crate::shapes::fleet::{
    Approval, ApprovalRequest, Fleet, JobRequest, NoFleet, TicketRequest, approval_question,
    approval_ticket_id,
};
use crate::shapes::handle::{HandleAnswer, HandleStore, MemoryHandleStore, read_handle_tool};
use crate::tool::{CallCtx, Shape, ToolDecl};

/// Settings of the runtime; every one has a default that suits a single machine.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Bounds every inline call whose tool declares no timeout.
    pub default_timeout: Duration,
    /// Handle tools: results above this many bytes become a handle.
    pub handle_threshold: usize,
    /// How long a confirm token stays valid.
    pub confirm_ttl: Duration,
    /// The poll hint of `running` answers when a tool declares none.
    pub default_poll_after_s: u32,
    /// The pool of job tools that name none.
    pub default_pool: String,
    /// The pool of agent tools that name none.
    pub default_agent_pool: String,
    /// Attempts of a job whose tool declares none.
    pub default_max_attempts: u32,
    /// Wall-time budget of one attempt of a job whose tool declares no timeout.
    pub default_job_timeout: Duration,
    /// Entries in the read cache.
    pub cache_capacity: usize,
    /// Pools whose waiting jobs are taken in turns by tenant: ordered pools
    /// where one tenant's backlog cannot starve another's jobs.
    pub fair_share: std::collections::BTreeSet<String>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            default_timeout: Duration::from_secs(30),
            handle_threshold: 8 * 1024,
            confirm_ttl: Duration::from_secs(15 * 60),
            default_poll_after_s: 5,
            default_pool: crate::tool::DEFAULT_POOL.to_owned(),
            default_agent_pool: "agents".to_owned(),
            default_max_attempts: 3,
            default_job_timeout: Duration::from_secs(15 * 60),
            cache_capacity: 10_000,
            fair_share: Default::default(),
        }
    }
}

/// Builds a [`Runtime`]; anything not set is kept in memory.
pub struct RuntimeBuilder {
    config: RuntimeConfig,
    secret: Option<[u8; 32]>,
    audit_sink: Option<Arc<dyn AuditSink>>,
    fleet: Option<Arc<dyn Fleet>>,
    commit_log: Option<Arc<dyn CommitLog>>,
    handles: Option<Arc<dyn HandleStore>>,
    metrics: Option<Arc<Metrics>>,
    rate_limits: Option<Arc<dyn TokenBuckets>>,
}

impl RuntimeBuilder {
    /// Where rate-limited tools take their tokens (this process's buckets
    /// when not set; a store's, for limits that hold across a fleet).
    pub fn rate_limits(mut self, buckets: Arc<dyn TokenBuckets>) -> Self {
        self.rate_limits = Some(buckets);
        self
    }
    /// Sets the defaults and bounds of the runtime.
    pub fn config(mut self, config: RuntimeConfig) -> Self {
        self.config = config;
        self
    }
    /// The key that signs confirm tokens; random when not set (tokens then
    /// do not survive a restart).
    pub fn secret(mut self, secret: [u8; 32]) -> Self {
        self.secret = Some(secret);
        self
    }
    /// Where audit records go (kept in memory when not set).
    pub fn audit_sink(mut self, sink: Arc<dyn AuditSink>) -> Self {
        self.audit_sink = Some(sink);
        self
    }
    /// The fleet that takes jobs and tickets (none when not set: enqueued shapes answer `unavailable`).
    pub fn fleet(mut self, fleet: Arc<dyn Fleet>) -> Self {
        self.fleet = Some(fleet);
        self
    }
    /// Where command commits are recorded, so a confirm token never runs its tool twice.
    pub fn commit_log(mut self, log: Arc<dyn CommitLog>) -> Self {
        self.commit_log = Some(log);
        self
    }
    /// Where the results of handle tools are kept for `read_handle`.
    pub fn handles(mut self, store: Arc<dyn HandleStore>) -> Self {
        self.handles = Some(store);
        self
    }
    /// The process's metrics, which every call is counted in (a registry of
    /// the runtime's own when not set).
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The runtime, with the built-in `read_handle` tool registered.
    pub fn build(self) -> Runtime {
        let secret = self.secret.unwrap_or_else(random_secret);
        let handles = self
            .handles
            .unwrap_or_else(|| Arc::new(MemoryHandleStore::default()));
        let services = LayerServices {
            audit_sink: self
                .audit_sink
                .unwrap_or_else(|| Arc::new(MemoryAuditSink::default())),
            cache: Arc::new(ReadCache::new(self.config.cache_capacity)),
            rate_limits: self
                .rate_limits
                .unwrap_or_else(|| Arc::new(RateLimits::default())),
            metrics: self.metrics.unwrap_or_default(),
        };
        let mut runtime = Runtime {
            signer: ConfirmSigner::new(secret, self.config.confirm_ttl),
            config: self.config,
            registry: Registry::default(),
            services,
            fleet: self.fleet.unwrap_or_else(|| Arc::new(NoFleet)),
            commit_log: self
                .commit_log
                .unwrap_or_else(|| Arc::new(MemoryCommitLog::default())),
            handles: handles.clone(),
            internal: Default::default(),
            ordered: Default::default(),
        };
        runtime
            .register(read_handle_tool(handles))
            .expect("the built-in read_handle declaration is valid");
        runtime
    }
}

fn random_secret() -> [u8; 32] {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    key[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    key
}

/// The tool runtime.
pub struct Runtime {
    config: RuntimeConfig,
    registry: Registry,
    services: LayerServices,
    signer: ConfirmSigner,
    fleet: Arc<dyn Fleet>,
    commit_log: Arc<dyn CommitLog>,
    handles: Arc<dyn HandleStore>,
    /// Executors of the runtime's own jobs (an assistant's run), by job
    /// tool name: run by workers, never offered or callable as tools.
    internal: std::collections::BTreeMap<String, Arc<dyn crate::tool::Executor>>,
    /// The ordered pools: those of tools that declare a priority or a
    /// concurrency limit. Their workers take the waiting job of highest
    /// priority first whose key has a free slot ([`ToolDecl::priority`],
    /// [`ToolDecl::concurrency`]).
    ordered: std::collections::BTreeSet<String>,
}

impl Runtime {
    /// Registers the executor of the runtime's own job tool `name` (which a
    /// registered tool never shadows: its name holds a character tool names
    /// given to models never do).
    pub fn register_internal(&mut self, name: &str, executor: Arc<dyn crate::tool::Executor>) {
        self.internal.insert(name.to_owned(), executor);
    }

    /// The executor of the runtime's own job tool `name`, if registered.
    pub fn internal(&self, name: &str) -> Option<&Arc<dyn crate::tool::Executor>> {
        self.internal.get(name)
    }

    /// A builder with the default configuration and everything in memory.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder {
            config: RuntimeConfig::default(),
            secret: None,
            audit_sink: None,
            fleet: None,
            commit_log: None,
            handles: None,
            metrics: None,
            rate_limits: None,
        }
    }

    /// Checks and registers a tool.
    pub fn register(&mut self, decl: ToolDecl) -> Result<Arc<Tool>, RegistrationError> {
        let ordered =
            (decl.priority.is_some() || decl.concurrency.is_some()).then(|| self.pool_of(&decl));
        let tool = self
            .registry
            .register(decl, &self.services, self.config.default_timeout)?;
        self.ordered.extend(ordered);
        Ok(tool)
    }

    /// Takes a start of `tool`'s `start_rate` for a job of `ctx` with
    /// `args`, from the buckets calls' rate limits use (so, on
    /// PostgreSQL, the fleet's): `None` when taken or the tool declares
    /// none, else how long until one is free.
    pub async fn take_start(
        &self,
        tool: &Tool,
        ctx: &CallCtx,
        args: &serde_json::Value,
    ) -> Result<Option<Duration>, ToolError> {
        let Some(start) = &tool.declaration().start_rate else {
            return Ok(None);
        };
        let scope = start.by.scope(tool.name(), ctx, args, "starts")?;
        let bucket = format!("start\u{1f}{}", tool.name());
        self.services
            .rate_limits
            .take(&bucket, &scope, start.limit)
            .await
    }

    /// The pool the jobs of `decl` run in: its own, else the default pool
    /// of its shape.
    pub fn pool_of(&self, decl: &ToolDecl) -> String {
        decl.pool.clone().unwrap_or_else(|| {
            if decl.shape == Shape::Agent {
                self.config.default_agent_pool.clone()
            } else {
                self.config.default_pool.clone()
            }
        })
    }

    /// True when `pool` is ordered: its workers take the waiting job of
    /// highest priority first ([`Store::claim_next`](crate) in the
    /// worker), and calls of its tools may give a priority.
    pub fn is_ordered(&self, pool: &str) -> bool {
        self.ordered.contains(pool) || self.is_fair(pool)
    }

    /// True when `pool` shares its workers fairly between tenants
    /// (`fair_share`): within a priority, each tenant's next job takes its
    /// turn, so one tenant's backlog delays another's job by a turn, not by
    /// the backlog. A fair pool is ordered.
    pub fn is_fair(&self, pool: &str) -> bool {
        self.config.fair_share.contains(pool)
    }

    /// Registers every declaration, stopping at the first refused.
    pub fn register_all(
        &mut self,
        decls: impl IntoIterator<Item = ToolDecl>,
    ) -> Result<(), RegistrationError> {
        for decl in decls {
            self.register(decl)?;
        }
        Ok(())
    }

    /// The registered tools.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Where the results of handle tools are kept (what MCP reads as
    /// resources).
    pub fn handles(&self) -> &Arc<dyn HandleStore> {
        &self.handles
    }

    /// The runtime's defaults and bounds.
    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// Where audit records go.
    pub fn audit_sink(&self) -> &Arc<dyn AuditSink> {
        &self.services.audit_sink
    }

    /// The process's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.services.metrics
    }

    /// `name` as a metrics label: the name of a registered tool or of the
    /// runtime's own job tool (`toolfleet.run`), else `unknown`, so that no
    /// caller can grow the label set.
    pub fn tool_label<'a>(&self, name: &'a str) -> &'a str {
        if self.registry.get(name).is_some() || self.internal.contains_key(name) {
            name
        } else {
            UNKNOWN_TOOL
        }
    }

    /// Calls tool `name` with `args` for `ctx`. Always answers an envelope.
    /// Every call is counted in [`Runtime::metrics`]: its outcome, its time,
    /// and a validation failure or a denial when it is one. A call whose
    /// future is dropped before it answers (its client went away) is counted
    /// too, as `cancelled`, with the time it had run.
    /// A long poll (see [`ToolDecl::long_poll`]) is counted but not timed.
    pub async fn invoke(&self, name: &str, args: Value, ctx: &CallCtx) -> Envelope {
        let tool = self.registry.get(name);
        let label = tool.map_or(UNKNOWN_TOOL, |tool| tool.name());
        let metered = MeteredCall::start(&self.services.metrics, label)
            .long_poll(tool.is_some_and(|tool| is_long_poll(tool, &args)));
        let envelope = match tool {
            Some(tool) => self.invoke_tool(tool, args, ctx).await,
            None => Envelope::error(self.registry.unknown(name)),
        };
        metered.answered(&envelope);
        envelope
    }

    async fn invoke_tool(&self, tool: &Tool, args: Value, ctx: &CallCtx) -> Envelope {
        // What only the server gives a tool that asks its client is never
        // taken from a caller (see `CallCtx::client_input`).
        let args = match args {
            Value::Object(mut map) if tool.declaration().asks_client && !ctx.client_input => {
                for key in crate::CLIENT_INPUT {
                    map.remove(key);
                }
                Value::Object(map)
            }
            args => args,
        };
        if ctx.run_at.is_some() && !matches!(tool.shape(), Shape::Job | Shape::Agent) {
            return Envelope::error(ToolError::new(
                ErrorCode::BadRequest,
                format!(
                    "`run_at` and `delay_s` are for job and agent tools; `{}` is a {} tool and runs \
                     when called: call it without them",
                    tool.name(),
                    tool.shape().as_str()
                ),
            ));
        }
        if let Some(error) = self.refused_priority(tool, ctx) {
            return Envelope::error(error);
        }
        if let Err(error) = tool.validate(&args) {
            self.services.metrics.validation_failure(tool.name());
            return Envelope::error(error);
        }
        let call = Call { tool, ctx, args };
        let run = Next::new(tool.stack(), self).run(call);
        match AssertUnwindSafe(run).catch_unwind().await {
            Ok(envelope) => envelope,
            Err(panic) => Envelope::error(panicked(tool.name(), panic)),
        }
    }

    /// Why `ctx`'s priority is refused for `tool`, if it is: out of range,
    /// or for a tool whose jobs are not taken by priority.
    fn refused_priority(&self, tool: &Tool, ctx: &CallCtx) -> Option<ToolError> {
        let priority = ctx.priority?;
        if let Err(error) = crate::tool::priority_of(&serde_json::Value::from(priority)) {
            return Some(error);
        }
        let refused = |why: String| Some(ToolError::new(ErrorCode::BadRequest, why));
        if !matches!(tool.shape(), Shape::Job | Shape::Agent) {
            return refused(format!(
                "`priority` is for job and agent tools; `{}` is a {} tool and runs when called: \
                 call it without one",
                tool.name(),
                tool.shape().as_str()
            ));
        }
        let pool = self.pool_of(tool.declaration());
        if !self.is_ordered(&pool) {
            return refused(format!(
                "`priority`: the jobs of pool `{pool}` run in the order they came; call `{}` \
                 without one, or declare a `priority` on a tool of the pool",
                tool.name()
            ));
        }
        None
    }

    /// Runs a tool's executor directly, catching
    /// panics: what a worker does with a job. Middleware ran when the job was
    /// accepted.
    pub async fn execute(&self, tool: &Tool, args: Value, ctx: CallCtx) -> Result<Json, ToolError> {
        run_executor(tool, args, ctx).await
    }

    async fn run_inline(&self, call: Call<'_>) -> Envelope {
        match self.execute(call.tool, call.args, call.ctx.clone()).await {
            Ok(result) => Envelope::ok(result, call.ctx.call_id.clone()),
            Err(error) => Envelope::error(error),
        }
    }

    async fn run_handle(&self, call: Call<'_>) -> Envelope {
        let threshold = call
            .tool
            .declaration()
            .handle_threshold
            .unwrap_or(self.config.handle_threshold);
        let ctx = call.ctx;
        let result = match self.execute(call.tool, call.args, ctx.clone()).await {
            Ok(result) => result,
            Err(error) => return Envelope::error(error),
        };
        if result.len() <= threshold {
            return Envelope::ok(result, ctx.call_id.clone());
        }
        // The handle's pages leave through `read_handle`, which knows
        // nothing of this tool: they are kept as they may be read.
        let result = redact_json(result, &call.tool.middleware().redact);
        match self
            .handles
            .put(ctx.tenant(), ctx.user(), call.tool.name(), result.clone())
            .await
        {
            Ok(handle) => Envelope::ok(
                Json::encode(&HandleAnswer::new(handle, &result)).unwrap_or(result),
                ctx.call_id.clone(),
            ),
            Err(error) => Envelope::error(error),
        }
    }

    async fn run_command(&self, call: Call<'_>) -> Envelope {
        let (tool, ctx) = (call.tool, call.ctx);
        let binding = Binding {
            tenant: ctx.tenant(),
            user: ctx.user(),
            tool: tool.name(),
            args: &call.args,
        };
        let now = unix_now();
        if !is_commit(&call.args) {
            let (token, expires_at) = self.signer.issue(&binding, now);
            let plan = match self.execute(tool, call.args, ctx.clone()).await {
                Ok(plan) => plan,
                Err(error) => return Envelope::error(error),
            };
            let answer = json!({
                "plan": plan,
                "confirm_token": token,
                "expires_at": expires_at,
                "next": format!("to commit, call `{}` again with the same arguments, dry_run=false and this confirm_token", tool.name()),
            });
            return Envelope::ok(Json::from(answer), ctx.call_id.clone());
        }
        let Some(token) = call.args.get("confirm_token").and_then(Value::as_str) else {
            return Envelope::error(ToolError::new(
                ErrorCode::ConfirmRequired,
                format!(
                    "`{}` commits in two calls: call it with dry_run=true first, show the plan, then call it with dry_run=false and the confirm_token it returned",
                    tool.name()
                ),
            ));
        };
        let expires_at = match self.signer.verify(token, &binding, now) {
            Ok(exp) => exp,
            Err(error) => return Envelope::error(error),
        };
        let key = commit_key(ctx.tenant(), token);
        let approval = ctx
            .approval
            .clone()
            .or_else(|| tool.declaration().approval.clone());
        if let Some(answered_by) = approval {
            return self
                .await_approval(tool, call.args, ctx, &key, answered_by)
                .await;
        }
        let token = token.to_owned();
        self.commit(tool, call.args, ctx, key, token, expires_at)
            .await
    }

    /// A commit that needs approval: its ticket (opened with the plan of a
    /// dry run of the same arguments, or found open already) and
    /// `suspended`, or, once decided, what it came to.
    async fn await_approval(
        &self,
        tool: &Tool,
        args: Value,
        ctx: &CallCtx,
        key: &str,
        answered_by: crate::AnsweredBy,
    ) -> Envelope {
        let mut dry = args.clone();
        if let Some(map) = dry.as_object_mut() {
            map.insert("dry_run".to_owned(), Value::Bool(true));
            map.remove("confirm_token");
        }
        let limit = tool
            .middleware()
            .timeout
            .unwrap_or(self.config.default_timeout);
        let plan = match tokio::time::timeout(limit, self.execute(tool, dry, ctx.clone())).await {
            Ok(Ok(plan)) => plan,
            Ok(Err(error)) => return Envelope::error(error),
            Err(_) => {
                return Envelope::error(ToolError::new(
                    ErrorCode::Timeout,
                    format!(
                        "the plan of `{}` for its approval did not come within {} ms",
                        tool.name(),
                        limit.as_millis()
                    ),
                ));
            }
        };
        let plan_value = serde_json::from_str::<Value>(plan.get()).unwrap_or(Value::Null);
        let request = ApprovalRequest {
            ticket: approval_ticket_id(key),
            tool: tool.name().to_owned(),
            args,
            plan: plan_value,
            ctx: ctx.clone(),
            answered_by,
            expires_in: tool.declaration().expires_in,
        };
        match self.fleet.request_approval(request).await {
            Ok(Approval::Pending(ticket)) => Envelope::Suspended {
                ticket,
                question: approval_question(tool.name()),
                options: vec!["approve".to_owned(), "reject".to_owned()],
                plan: Some(plan),
            },
            Ok(Approval::Settled(envelope)) => with_call_id(envelope, &ctx.call_id),
            Err(error) => Envelope::error(error),
        }
    }

    /// Runs the commit of an approved command: what its approval ticket
    /// holds (`args`, the confirm token among them, and the caller's
    /// `ctx`), through the commit log as any commit, so it runs at most
    /// once per token. The token must be one this runtime issued for
    /// these arguments; it may have expired while the approval waited.
    pub async fn commit_approved(&self, tool: &str, args: Value, ctx: &CallCtx) -> Envelope {
        let Some(tool) = self.registry().get(tool).cloned() else {
            return Envelope::error(self.registry().unknown(tool));
        };
        if tool.shape() != Shape::Command {
            return Envelope::error(ToolError::invalid_arguments(format!(
                "`{}` is not a command, so it has no commit to approve",
                tool.name()
            )));
        }
        let Some(token) = args.get("confirm_token").and_then(Value::as_str) else {
            return Envelope::error(ToolError::invalid_arguments(
                "the approved commit carries no confirm_token",
            ));
        };
        let binding = Binding {
            tenant: ctx.tenant(),
            user: ctx.user(),
            tool: tool.name(),
            args: &args,
        };
        // Checked as issued; its expiry may have passed while people decided.
        let expires_at = match self.signer.verify(token, &binding, 0) {
            Ok(exp) => exp.max(unix_now()),
            Err(error) => return Envelope::error(error),
        };
        let (key, token) = (commit_key(ctx.tenant(), token), token.to_owned());
        self.commit(&tool, args.clone(), ctx, key, token, expires_at)
            .await
    }

    /// The commit of `token` (keyed `key` in the commit log), at most once.
    async fn commit(
        &self,
        tool: &Tool,
        args: Value,
        ctx: &CallCtx,
        key: String,
        token: String,
        expires_at: u64,
    ) -> Envelope {
        let limit = tool
            .middleware()
            .timeout
            .unwrap_or(self.config.default_timeout);
        // Kept as long as the token could be presented again.
        let keep_until_unix = expires_at + 60;
        let terms = ClaimTerms {
            lease: limit + OUTCOME_MARGIN,
            keep_until_unix,
        };
        match self.commit_log.claim(&key, terms).await {
            Err(error) => return Envelope::error(error),
            Ok(Claim::Settled(envelope)) => return with_call_id(envelope, &ctx.call_id),
            Ok(Claim::Busy) => return Envelope::error(in_flight(tool.name())),
            Ok(Claim::Abandoned) => return Envelope::error(abandoned(tool.name())),
            Ok(Claim::Run) => {}
        }
        let commit = Commit {
            key,
            tool: tool.name().to_owned(),
            limit,
            call_id: ctx.call_id.clone(),
            keep_until_unix,
            log: self.commit_log.clone(),
        };
        let executor = run_executor(tool, args, ctx.clone().with_idempotency_key(token));
        // The task owns the commit: a caller that goes away stops awaiting
        // it, never the tool's run or the record of its outcome.
        match tokio::spawn(commit.run(executor)).await {
            Ok(envelope) => envelope,
            Err(_) => Envelope::error(ToolError::failed(
                format!(
                    "the commit of `{}` stopped before it answered; call again with the same confirm_token to read its outcome",
                    tool.name()
                ),
                true,
            )),
        }
    }

    async fn run_enqueued(&self, call: Call<'_>) -> Envelope {
        let (tool, ctx) = (call.tool, call.ctx);
        let decl = tool.declaration();
        let pool = self.pool_of(decl);
        let priority = self
            .is_ordered(&pool)
            .then(|| ctx.priority.or(decl.priority).unwrap_or(0));
        let fair = self.is_fair(&pool);
        // The key its starts are counted by must be in the arguments now.
        if let Some(start) = &decl.start_rate
            && let Err(error) = start.by.scope(tool.name(), ctx, &call.args, "starts")
        {
            return Envelope::error(error);
        }
        let concurrency = match &decl.concurrency {
            Some(declared) => match concurrency_key(tool.name(), declared, ctx, &call.args) {
                Ok(key) => Some((key, declared.limit)),
                Err(error) => return Envelope::error(error),
            },
            None => None,
        };
        let request = JobRequest {
            tool: tool.name().to_owned(),
            shape: tool.shape(),
            pool,
            args: call.args,
            ctx: ctx.clone(),
            max_attempts: decl
                .max_attempts
                .unwrap_or(self.config.default_max_attempts)
                .max(1),
            timeout: decl
                .middleware
                .timeout
                .unwrap_or(self.config.default_job_timeout),
            priority,
            concurrency,
            fair,
        };
        match self.fleet.submit(request).await {
            Ok(job_id) => Envelope::running(
                job_id,
                decl.poll_after_s
                    .unwrap_or(self.config.default_poll_after_s),
            ),
            Err(error) => Envelope::error(error),
        }
    }

    async fn run_human(&self, call: Call<'_>) -> Envelope {
        let (tool, ctx) = (call.tool, call.ctx);
        let question = call
            .args
            .get("question")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| tool.description().to_owned());
        let options: Vec<String> = call
            .args
            .get("options")
            .and_then(Value::as_array)
            .map(|o| {
                o.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let request = TicketRequest {
            tool: tool.name().to_owned(),
            question: question.clone(),
            options: options.clone(),
            args: call.args,
            ctx: ctx.clone(),
            answered_by: tool.declaration().answered_by.clone(),
            expires_in: tool.declaration().expires_in,
        };
        match self.fleet.open_ticket(request).await {
            Ok(ticket) => Envelope::Suspended {
                ticket,
                question,
                options,
                plan: None,
            },
            Err(error) => Envelope::error(error),
        }
    }
}

impl Endpoint for Runtime {
    fn run<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Envelope> {
        Box::pin(async move {
            match call.tool.shape() {
                Shape::Query => self.run_inline(call).await,
                Shape::Handle => self.run_handle(call).await,
                Shape::Command => self.run_command(call).await,
                Shape::Job | Shape::Agent => self.run_enqueued(call).await,
                Shape::Human => self.run_human(call).await,
            }
        })
    }
}

/// Counts one call of [`Runtime::invoke`] in the metrics once it ends: by
/// its envelope when it answers, else, when it is dropped first, as
/// `cancelled`.
struct MeteredCall<'a> {
    metrics: &'a Metrics,
    tool: &'a str,
    started: Instant,
    counted: bool,
    /// False for a long poll: counted, not timed.
    timed: bool,
}

impl<'a> MeteredCall<'a> {
    fn start(metrics: &'a Metrics, tool: &'a str) -> Self {
        MeteredCall {
            metrics,
            tool,
            started: Instant::now(),
            counted: false,
            timed: true,
        }
    }

    fn long_poll(mut self, yes: bool) -> Self {
        self.timed = !yes;
        self
    }

    fn answered(mut self, envelope: &Envelope) {
        self.count(envelope);
    }

    fn count(&mut self, envelope: &Envelope) {
        self.counted = true;
        self.metrics.call(self.tool, envelope);
        if self.timed {
            self.metrics.call_time(self.tool, self.started.elapsed());
        }
    }
}

impl Drop for MeteredCall<'_> {
    fn drop(&mut self) {
        if !self.counted {
            let error = ToolError::new(
                ErrorCode::Cancelled,
                "the call was dropped before it answered",
            );
            self.count(&Envelope::error(error));
        }
    }
}

/// Whether a call of `tool` with `args` is a long poll: the argument the
/// tool names as its wait ([`ToolDecl::long_poll`]) is above 0.
fn is_long_poll(tool: &Tool, args: &Value) -> bool {
    tool.declaration()
        .long_poll
        .as_deref()
        .and_then(|arg| args.get(arg))
        .and_then(Value::as_f64)
        .is_some_and(|wait| wait > 0.0)
}

/// Calls `tool`'s executor: a future that owns what it needs and turns a
/// panic into an error.
fn run_executor(
    tool: &Tool,
    args: Value,
    ctx: CallCtx,
) -> BoxFuture<'static, Result<Json, ToolError>> {
    let name = tool.name().to_owned();
    let Some(executor) = tool.executor() else {
        let error = ToolError::failed(format!("`{name}` has no executor"), false);
        return Box::pin(std::future::ready(Err(error)));
    };
    let run = AssertUnwindSafe(executor.execute(ctx, args)).catch_unwind();
    Box::pin(async move {
        match run.await {
            Ok(result) => result,
            Err(panic) => Err(panicked(&name, panic)),
        }
    })
}

fn with_call_id(envelope: Envelope, call_id: &str) -> Envelope {
    match envelope {
        Envelope::Ok { result, .. } => Envelope::ok(result, call_id),
        other => other,
    }
}

fn panicked(tool: &str, panic: Box<dyn std::any::Any + Send>) -> ToolError {
    let detail = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned());
    ToolError::failed(
        format!(
            "`{tool}` failed inside its executor ({}); this is a fault of the tool, not of the arguments",
            crate::registry::truncate(&detail, 200)
        ),
        false,
    )
}

/// The key a job of `tool` counts under for its concurrency limit: the
/// tool, then the scope of the declared key ([`CountedBy::scope`]).
fn concurrency_key(
    tool: &str,
    declared: &crate::tool::Concurrency,
    ctx: &CallCtx,
    args: &serde_json::Value,
) -> Result<String, ToolError> {
    let scope = declared.key.scope(tool, ctx, args, "running jobs")?;
    Ok(format!("{tool}\u{1f}{scope}"))
}
