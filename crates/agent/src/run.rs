//! The loop of a sub-agent, run as the executor of an agent tool's job.
//!
//! Each step asks the model for its next reply; each tool call in a reply
//! goes through [`Runtime::invoke`], the path every call takes (validation,
//! middleware, audit), as a principal holding only the scopes the agent was
//! given and its caller has. A job tool is awaited through `get_job`'s long
//! poll; a human tool's ticket is awaited on the notices. The state of the
//! loop is saved after every model reply and every tool result, so a worker
//! that dies mid-loop leaves a checkpoint the next attempt resumes from:
//! tool calls that settled are not made again, and a job or ticket being
//! awaited is awaited again rather than started again.
//!
//! Budgets are enforced, not advised: the loop stops at the first of its
//! steps, tokens and wall time (time waiting on a person excluded), and the
//! result says which. An agent called by an agent runs within what is left
//! of its caller's budget, its tokens are counted against its caller's, and
//! nesting is refused past [`AgentEnv::max_depth`].
//!
//! Each model reply is counted in the runtime's metrics, under the agent
//! tool whose loop it is (run as a job or inline): `toolfleet_agent_steps_total`
//! and `toolfleet_agent_tokens_total` by kind (input, output).

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use toolfleet_broker::Notices;
use toolfleet_core::config::AgentSpec;
use toolfleet_core::registry::truncate;
use toolfleet_core::{
    Budget, CallCtx, Envelope, Executor, Json, Lineage, Principal, Runtime, Shape, ToolError,
    new_id, now_ms,
};
use toolfleet_store::{LeaseRef, Park, SaveCheckpoint, Store};

use crate::model::{Model, ModelRequest, ToolCall, ToolResult, ToolSpec, Turn, Usage};

/// Agents nest this deep unless configured otherwise.
pub const DEFAULT_MAX_DEPTH: u32 = 3;
/// A tool result shown to the model is cut to this many characters.
const RESULT_CHARS: usize = 16_000;
/// An evidence excerpt is cut to this many characters.
const EXCERPT_CHARS: usize = 300;
/// One long poll of a job the agent awaits.
const POLL: Duration = Duration::from_secs(30);

/// What every agent of a process shares: the runtime its tool calls go
/// through (set once it is built), the store of checkpoints and tickets,
/// and the notices that say a ticket was answered.
pub struct AgentEnv {
    runtime: OnceLock<Weak<Runtime>>,
    store: Arc<dyn Store>,
    notices: Arc<dyn Notices>,
    /// Agents between a client and the deepest agent allowed.
    pub max_depth: u32,
}

impl AgentEnv {
    /// The environment over `store` and `notices`, agents nesting [`DEFAULT_MAX_DEPTH`] deep.
    pub fn new(store: Arc<dyn Store>, notices: Arc<dyn Notices>) -> Arc<AgentEnv> {
        Arc::new(AgentEnv {
            runtime: OnceLock::new(),
            store,
            notices,
            max_depth: DEFAULT_MAX_DEPTH,
        })
    }

    /// The environment over `store` and `notices`, agents nesting `max_depth` deep (at least one).
    pub fn with_max_depth(
        store: Arc<dyn Store>,
        notices: Arc<dyn Notices>,
        max_depth: u32,
    ) -> Arc<AgentEnv> {
        Arc::new(AgentEnv {
            runtime: OnceLock::new(),
            store,
            notices,
            max_depth: max_depth.max(1),
        })
    }

    /// Hands the agents the runtime they are registered in. The runtime
    /// holds the agents, so they hold it weakly.
    pub fn set_runtime(&self, runtime: &Arc<Runtime>) {
        let _ = self.runtime.set(Arc::downgrade(runtime));
    }

    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub(crate) fn notices(&self) -> &Arc<dyn Notices> {
        &self.notices
    }

    pub(crate) fn runtime_now(&self) -> Option<Arc<Runtime>> {
        self.runtime.get().and_then(Weak::upgrade)
    }

    fn runtime(&self) -> Result<Arc<Runtime>, ToolError> {
        self.runtime
            .get()
            .and_then(Weak::upgrade)
            .ok_or_else(|| ToolError::failed("the agent runtime is not ready", true))
    }
}

/// One agent tool's executor.
pub struct AgentExecutor {
    /// The agent tool's name, which its metrics are counted under.
    tool: String,
    spec: AgentSpec,
    model: Arc<dyn Model>,
    env: Arc<AgentEnv>,
}

impl AgentExecutor {
    /// The executor of the agent tool `tool`.
    pub fn new(
        tool: impl Into<String>,
        spec: AgentSpec,
        model: Arc<dyn Model>,
        env: Arc<AgentEnv>,
    ) -> Self {
        AgentExecutor {
            tool: tool.into(),
            spec,
            model,
            env,
        }
    }

    /// The budget the spec declares.
    pub fn declared_budget(spec: &AgentSpec) -> Budget {
        Budget {
            max_steps: spec.max_steps,
            max_tokens: spec.max_tokens,
            max_wall_ms: secs_to_ms(spec.max_wall_s),
        }
    }
}

fn secs_to_ms(seconds: f64) -> u64 {
    if seconds.is_finite() && seconds > 0.0 {
        (seconds * 1000.0).min(u64::MAX as f64) as u64
    } else {
        0
    }
}

impl Executor for AgentExecutor {
    fn execute(&self, ctx: CallCtx, args: Value) -> BoxFuture<'static, Result<Json, ToolError>> {
        let run = Run {
            tool: self.tool.clone(),
            spec: self.spec.clone(),
            model: self.model.clone(),
            env: self.env.clone(),
        };
        Box::pin(async move { run.run(ctx, args).await })
    }
}

/// Why the loop stopped without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Exceeded {
    /// The run made as many model calls as its budget allows.
    Steps,
    /// The run used as many tokens as its budget allows.
    Tokens,
    /// The run took as long as its budget allows.
    WallTime,
}

/// A tool call the answer relied on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// The tool called.
    pub tool: String,
    /// The arguments it was called with.
    pub args: Value,
    /// The start of the result.
    pub excerpt: String,
}

/// What the loop is waiting on for the tool call it is at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Waiting {
    Job { id: String },
    Ticket { id: String },
}

/// The checkpoint: everything the loop needs to go on from where it was.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct State {
    /// The sub-agent's own run id: its tool calls are audited under it.
    run_id: String,
    /// When the first attempt started (Unix ms).
    started_at: i64,
    /// Time spent waiting on people, not counted as wall time.
    suspended_ms: u64,
    /// When the job was parked on a ticket, while it is.
    #[serde(default)]
    parked_at: Option<i64>,
    steps: u32,
    usage: Usage,
    /// Tokens used by agents this one called.
    child_tokens: u64,
    turns: Vec<Turn>,
    evidence: Vec<Evidence>,
    /// Results of the last reply's tool calls so far.
    pending: Vec<ToolResult>,
    waiting: Option<Waiting>,
}

impl State {
    fn fresh(task: &str) -> State {
        State {
            run_id: new_id(),
            started_at: now_ms(),
            suspended_ms: 0,
            parked_at: None,
            steps: 0,
            usage: Usage::default(),
            child_tokens: 0,
            turns: vec![Turn::User {
                text: task.to_owned(),
            }],
            evidence: Vec::new(),
            pending: Vec::new(),
            waiting: None,
        }
    }

    fn tokens(&self) -> u64 {
        self.usage.total().saturating_add(self.child_tokens)
    }

    fn elapsed_ms(&self) -> u64 {
        elapsed_ms(self.started_at, self.suspended_ms)
    }

    fn spent(&self) -> Spent {
        Spent {
            steps: self.steps,
            tokens: self.tokens(),
            wall_ms: self.elapsed_ms(),
        }
    }
}

/// Wall time since `started_at`, less `waited_ms` (time waiting on people
/// and jobs, which is not the loop's).
/// The tool calls of the last reply of `turns`, when some are still to be
/// made (or their results are still to come).
pub(crate) fn open_calls(turns: &[Turn]) -> Option<Vec<ToolCall>> {
    match turns.last() {
        Some(Turn::Assistant { calls, .. }) if !calls.is_empty() => Some(calls.clone()),
        _ => None,
    }
}

pub(crate) fn elapsed_ms(started_at: i64, waited_ms: u64) -> u64 {
    let wall = u64::try_from(now_ms().saturating_sub(started_at)).unwrap_or(0);
    wall.saturating_sub(waited_ms)
}

/// What a loop has spent of its budget.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spent {
    pub steps: u32,
    pub tokens: u64,
    pub wall_ms: u64,
}

impl Spent {
    /// The first budget used up, if any: tokens, then wall time, then steps.
    pub(crate) fn exceeded(&self, budget: &Budget) -> Option<Exceeded> {
        if self.tokens >= budget.max_tokens {
            Some(Exceeded::Tokens)
        } else if self.wall_ms >= budget.max_wall_ms {
            Some(Exceeded::WallTime)
        } else if self.steps >= budget.max_steps {
            Some(Exceeded::Steps)
        } else {
            None
        }
    }

    /// What is left of `budget`.
    pub(crate) fn remaining(&self, budget: &Budget) -> Budget {
        Budget {
            max_steps: budget.max_steps.saturating_sub(self.steps),
            max_tokens: budget.max_tokens.saturating_sub(self.tokens),
            max_wall_ms: budget.max_wall_ms.saturating_sub(self.wall_ms),
        }
    }
}

/// How the loop ended.
enum End {
    Answered(String),
    Exceeded(Exceeded),
    Failed(String),
    /// Parked on a ticket: the job waits, its worker free, until answered.
    Parked(String),
}

/// One run of one agent tool: as a job, or inline.
struct Run {
    /// The agent tool's name.
    tool: String,
    spec: AgentSpec,
    model: Arc<dyn Model>,
    env: Arc<AgentEnv>,
}

/// Where the loop keeps its checkpoint: the job and the attempt holding it
/// (its worker and attempt number), so that an attempt that lost its lease
/// to a newer claim can no longer write or park it.
type Slot = LeaseRef;

/// What one run works within: the runtime its calls go through, the call
/// that started it, its depth among agents, its budget, and its checkpoint.
struct Frame {
    runtime: Arc<Runtime>,
    ctx: CallCtx,
    depth: u32,
    budget: Budget,
    slot: Option<Slot>,
}

impl Run {
    async fn run(self, ctx: CallCtx, args: Value) -> Result<Json, ToolError> {
        let task = match args.get("task").and_then(Value::as_str) {
            Some(task) => task.to_owned(),
            None => args.to_string(),
        };
        let depth = ctx.lineage.as_ref().map_or(0, |l| l.depth) + 1;
        if depth > self.env.max_depth {
            return Err(ToolError::failed(
                format!(
                    "agents nest at most {} deep; this one would be at depth {depth}",
                    self.env.max_depth
                ),
                false,
            ));
        }
        let mut budget = AgentExecutor::declared_budget(&self.spec);
        if let Some(lineage) = &ctx.lineage {
            budget = budget.within(lineage.budget);
        }
        let runtime = self.env.runtime()?;
        let (slot, saved) = self.resume(&ctx).await?;
        let mut state = match saved {
            Some(state) => state,
            None => State::fresh(&task),
        };
        // Woken after waiting for a person: that wait is not wall time.
        if let Some(parked_at) = state.parked_at.take() {
            let waited = u64::try_from(now_ms().saturating_sub(parked_at)).unwrap_or(0);
            state.suspended_ms = state.suspended_ms.saturating_add(waited);
        }
        self.save(slot.as_ref(), &state).await;
        let frame = Frame {
            runtime,
            ctx,
            depth,
            budget,
            slot,
        };
        let end = self.steps(&frame, &mut state).await;
        if let End::Parked(ticket) = end {
            // Saved and parked already; the answer wakes the job.
            return Err(ToolError::parked(format!("waiting for ticket {ticket}")));
        }
        self.save(frame.slot.as_ref(), &state).await;
        Ok(Json::from(outcome(&end, &state, &frame.budget)))
    }

    /// The job this run belongs to and its checkpoint, if it has one. A
    /// call outside the fleet (no job) runs without checkpoints.
    async fn resume(&self, ctx: &CallCtx) -> Result<(Option<Slot>, Option<State>), ToolError> {
        let Some(job_id) = ctx.idempotency_key.clone() else {
            return Ok((None, None));
        };
        let job = match self.env.store.job_by_id(&job_id).await {
            Ok(Some(job)) => job,
            // Not a job of this store: an inline call keyed by its caller.
            Ok(None) => return Ok((None, None)),
            Err(error) => {
                return Err(ToolError::failed(
                    format!("cannot read the agent's job: {error}"),
                    true,
                ));
            }
        };
        let saved = match self.env.store.checkpoint(&job_id).await {
            Ok(saved) => saved.and_then(|c| serde_json::from_value::<State>(c).ok()),
            Err(error) => {
                return Err(ToolError::failed(
                    format!("cannot read the agent's checkpoint: {error}"),
                    true,
                ));
            }
        };
        // The attempt holding the job as this run starts: the worker's, which
        // claimed it just before running this executor.
        let slot = Slot {
            job_id,
            worker: job.lease_owner.clone().unwrap_or_default(),
            attempt: job.attempts,
        };
        Ok((Some(slot), saved))
    }

    async fn save(&self, slot: Option<&Slot>, state: &State) {
        let Some(slot) = slot else { return };
        let Ok(checkpoint) = serde_json::to_value(state) else {
            return;
        };
        let save = SaveCheckpoint {
            lease: slot,
            checkpoint: &checkpoint,
            now: now_ms(),
        };
        match self.env.store.save_checkpoint(save).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(job_id = %slot.job_id, "checkpoint not saved: the job moved on")
            }
            Err(error) => tracing::warn!(job_id = %slot.job_id, %error, "checkpoint not saved"),
        }
    }

    async fn steps(&self, f: &Frame, state: &mut State) -> End {
        let (budget, slot) = (&f.budget, &f.slot);
        let tools = self.offered(&f.runtime);
        loop {
            if let Some(calls) = open_calls(&state.turns) {
                // A reply whose calls the model can never see the results of
                // (no step left) is not worth running.
                if let Some(exceeded) = state.spent().exceeded(budget) {
                    return End::Exceeded(exceeded);
                }
                for (n, call) in calls.iter().enumerate().skip(state.pending.len()) {
                    let made = self.call_tool(f, state, n, call).await;
                    let result = match made {
                        Ok(result) => result,
                        Err(end) => return end,
                    };
                    state.pending.push(result);
                    state.waiting = None;
                    self.save(slot.as_ref(), state).await;
                }
                let results = std::mem::take(&mut state.pending);
                state.turns.push(Turn::Tool { results });
                self.save(slot.as_ref(), state).await;
            }
            if let Some(exceeded) = state.spent().exceeded(budget) {
                return End::Exceeded(exceeded);
            }
            let request = ModelRequest {
                system: &self.spec.system_prompt,
                turns: &state.turns,
                tools: &tools,
                max_output_tokens: self.spec.max_output_tokens,
            };
            let left = Duration::from_millis(state.spent().remaining(budget).max_wall_ms);
            let reply = match tokio::time::timeout(left, self.model.complete(&request)).await {
                Err(_) => return End::Exceeded(Exceeded::WallTime),
                Ok(Err(error)) => return End::Failed(error.to_string()),
                Ok(Ok(reply)) => reply,
            };
            state.steps += 1;
            state.usage.add(reply.usage);
            // Under the agent tool's own name, in a job or not.
            f.runtime.metrics().agent_step(
                f.runtime.tool_label(&self.tool),
                reply.usage.input_tokens,
                reply.usage.output_tokens,
            );
            let done = reply.calls.is_empty();
            let text = reply.text.clone();
            state.turns.push(Turn::Assistant {
                text: reply.text,
                calls: reply.calls,
            });
            self.save(slot.as_ref(), state).await;
            if done {
                return End::Answered(text.unwrap_or_default());
            }
        }
    }

    /// The tools the model is offered: the agent's subset that is registered.
    fn offered(&self, runtime: &Runtime) -> Vec<ToolSpec> {
        self.spec
            .tools
            .iter()
            .filter_map(|name| runtime.registry().get(name))
            .map(|tool| ToolSpec {
                name: tool.name().to_owned(),
                description: tool.description().to_owned(),
                input_schema: tool.input_schema().clone(),
            })
            .collect()
    }

    /// Makes one tool call and awaits what it started; `Err` ends the loop.
    async fn call_tool(
        &self,
        f: &Frame,
        state: &mut State,
        n: usize,
        call: &ToolCall,
    ) -> Result<ToolResult, End> {
        let (runtime, slot) = (&f.runtime, &f.slot);
        let refuse = |message: String| ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            content: json!({"error": {"code": "forbidden", "message": message}}).to_string(),
            is_error: true,
        };
        if !self.spec.tools.iter().any(|t| t == &call.name) {
            return Ok(refuse(format!(
                "`{}` is not one of this agent's tools; it may call: {}",
                call.name,
                self.spec.tools.join(", ")
            )));
        }
        let Some(tool) = runtime.registry().get(&call.name).cloned() else {
            return Ok(refuse(format!("`{}` is not registered", call.name)));
        };
        if tool.shape() == Shape::Agent && f.depth + 1 > self.env.max_depth {
            return Ok(refuse(format!(
                "`{}` is an agent, and agents nest at most {} deep: do this part yourself",
                call.name, self.env.max_depth
            )));
        }
        let call_ctx = self.call_ctx(f, state, n, tool.shape());
        let envelope = match state.waiting.clone() {
            // Resumed while awaiting what this call started: await it again.
            Some(Waiting::Job { id }) => self.await_job(f, &call_ctx, &id, state).await?,
            Some(Waiting::Ticket { id }) => self.await_ticket(&call_ctx, &id, slot, state).await?,
            None => {
                let first = runtime
                    .invoke(&call.name, call.args.clone(), &call_ctx)
                    .await;
                match first {
                    Envelope::Running { job_id, .. } => {
                        state.waiting = Some(Waiting::Job { id: job_id.clone() });
                        self.save(slot.as_ref(), state).await;
                        self.await_job(f, &call_ctx, &job_id, state).await?
                    }
                    Envelope::Suspended { ticket, .. } => {
                        state.waiting = Some(Waiting::Ticket { id: ticket.clone() });
                        self.save(slot.as_ref(), state).await;
                        self.await_ticket(&call_ctx, &ticket, slot, state).await?
                    }
                    other => other,
                }
            }
        };
        Ok(self.result_of(call, tool.shape(), envelope, state))
    }

    /// The context of a call the agent makes: its own run, the scopes it
    /// was given that its caller also has, and its lineage.
    fn call_ctx(&self, f: &Frame, state: &State, n: usize, shape: Shape) -> CallCtx {
        let ctx = &f.ctx;
        let given: BTreeSet<&String> = self.spec.scopes.iter().collect();
        let scopes: Vec<String> = ctx
            .principal
            .scopes
            .iter()
            .filter(|s| given.contains(s))
            .cloned()
            .collect();
        let principal = Arc::new(Principal::new(
            ctx.principal.tenant.clone(),
            ctx.principal.user.clone(),
            scopes,
        ));
        // A job started again after a restart is the same job.
        let idempotency_key = match (&f.slot, shape) {
            (Some(slot), Shape::Job | Shape::Agent) => {
                Some(format!("{}:{}:{n}", slot.job_id, state.steps))
            }
            _ => None,
        };
        CallCtx {
            principal,
            run_id: state.run_id.clone(),
            call_id: new_id(),
            idempotency_key,
            callback_url: None,
            lineage: Some(Lineage {
                parent_run_id: ctx.run_id.clone(),
                depth: f.depth,
                budget: state.spent().remaining(&f.budget),
            }),
            events: None,
            // The jobs it starts continue its caller's trace.
            trace: ctx.trace.clone(),
            approval: None,
            run_at: None,
            priority: None,
            // A model's arguments are a caller's.
            client_input: false,
        }
    }

    /// Long-polls a job until it settles; `Err` when the wall time runs out.
    async fn await_job(
        &self,
        f: &Frame,
        ctx: &CallCtx,
        job_id: &str,
        state: &State,
    ) -> Result<Envelope, End> {
        loop {
            let left = state.spent().remaining(&f.budget).max_wall_ms;
            if left == 0 {
                return Err(End::Exceeded(Exceeded::WallTime));
            }
            let wait_s = Duration::from_millis(left).min(POLL).as_secs().max(1);
            let args = json!({"job_id": job_id, "wait_s": wait_s});
            let poll = f.runtime.invoke("get_job", args, ctx).await;
            let job = match poll {
                Envelope::Ok { result, .. } => serde_json::from_str::<Envelope>(result.get()).ok(),
                other => return Ok(other),
            };
            match job {
                Some(Envelope::Running { .. }) => continue,
                Some(settled) => return Ok(settled),
                None => {
                    return Ok(Envelope::error(ToolError::failed(
                        format!("`get_job` answered something unreadable for {job_id}"),
                        false,
                    )));
                }
            }
        }
    }

    /// The answer to a ticket: at once if it has one; else, for a job, the
    /// job is parked until it does (`Err(End::Parked)`), and outside the
    /// fleet the call waits. The wait is not wall time.
    async fn await_ticket(
        &self,
        ctx: &CallCtx,
        ticket: &str,
        slot: &Option<Slot>,
        state: &mut State,
    ) -> Result<Envelope, End> {
        if let Some(slot) = slot {
            match self.env.store.ticket(ctx.tenant(), ticket).await {
                Ok(Some(record)) => {
                    if let Some(answer) = record.answer {
                        return Ok(answered(ctx, answer));
                    }
                }
                Ok(None) => return Ok(gone(ticket)),
                // Park anyway: the answer wakes the job, whatever this read met.
                Err(error) => tracing::warn!(ticket, %error, "reading a ticket failed"),
            }
            return Err(self.park(ctx, ticket, slot, state).await);
        }
        let began = now_ms();
        let answer = loop {
            // Subscribe before reading, so an answer between the two is seen;
            // an answered ticket is an outcome.
            let events = self.env.notices.subscribe_settled().await.ok();
            match self.env.store.ticket(ctx.tenant(), ticket).await {
                Ok(Some(record)) => {
                    if let Some(answer) = record.answer {
                        break Ok(answer);
                    }
                }
                Ok(None) => break Err(format!("ticket {ticket} is gone")),
                Err(error) => tracing::warn!(ticket, %error, "reading a ticket failed"),
            }
            let Some(mut events) = events else {
                tokio::time::sleep(POLL).await;
                continue;
            };
            let answered = async {
                while let Some(event) = events.next().await {
                    if event.kind == toolfleet_broker::EventKind::Ticket && event.id == ticket {
                        return;
                    }
                }
                std::future::pending::<()>().await;
            };
            let _ = tokio::time::timeout(POLL, answered).await;
        };
        let waited = u64::try_from(now_ms().saturating_sub(began)).unwrap_or(0);
        state.suspended_ms = state.suspended_ms.saturating_add(waited);
        Ok(match answer {
            Ok(answer) => answered(ctx, answer),
            Err(_) => gone(ticket),
        })
    }

    /// Saves the loop and parks its job on `ticket`. An answer that came
    /// between the read and the park would have found nothing to wake, so
    /// the ticket is read again after parking and the job woken if so.
    async fn park(&self, ctx: &CallCtx, ticket: &str, slot: &Slot, state: &mut State) -> End {
        state.parked_at = Some(now_ms());
        self.save(Some(slot), state).await;
        let store = &self.env.store;
        let park = Park {
            lease: slot,
            ticket,
            now: now_ms(),
        };
        match store.park(park).await {
            Ok(Some(_)) => {
                let answered = matches!(
                    store.ticket(ctx.tenant(), ticket).await,
                    Ok(Some(record)) if record.answer.is_some()
                );
                if answered && let Err(error) = store.wake(ticket, now_ms()).await {
                    tracing::warn!(ticket, %error, "waking a job parked on an answered ticket failed");
                }
            }
            Ok(None) => tracing::warn!(job_id = %slot.job_id, "not parked: the job moved on"),
            Err(error) => tracing::warn!(job_id = %slot.job_id, %error, "parking failed"),
        }
        End::Parked(ticket.to_owned())
    }

    /// What the model is told of a call, and the evidence it leaves.
    fn result_of(
        &self,
        call: &ToolCall,
        shape: Shape,
        envelope: Envelope,
        state: &mut State,
    ) -> ToolResult {
        let (content, is_error) = match &envelope {
            Envelope::Ok { result, .. } => {
                let text = result.get().to_owned();
                if shape == Shape::Agent {
                    state.child_tokens = state.child_tokens.saturating_add(child_tokens(result));
                }
                state.evidence.push(Evidence {
                    tool: call.name.clone(),
                    args: call.args.clone(),
                    excerpt: truncate(&text, EXCERPT_CHARS),
                });
                (truncate(&text, RESULT_CHARS), false)
            }
            Envelope::Error { error, .. } => (
                json!({"error": {"code": error.code, "message": error.message, "details": error.details}})
                    .to_string(),
                true,
            ),
            other => (
                serde_json::to_string(other).unwrap_or_default(),
                true,
            ),
        };
        ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            content,
            is_error,
        }
    }
}

/// A person's answer, as the model is shown it.
fn answered(ctx: &CallCtx, answer: Value) -> Envelope {
    Envelope::ok(Json::from(json!({"answer": answer})), ctx.call_id.clone())
}

fn gone(ticket: &str) -> Envelope {
    Envelope::error(ToolError::failed(format!("ticket {ticket} is gone"), false))
}

/// The tokens an agent tool's result reports it used.
fn child_tokens(result: &Json) -> u64 {
    serde_json::from_str::<Value>(result.get())
        .ok()
        .and_then(|v| v.pointer("/usage/total_tokens").and_then(Value::as_u64))
        .unwrap_or(0)
}

/// The agent tool's result: `{status, answer, evidence, usage}`, and for a
/// budget run out, which one.
fn outcome(end: &End, state: &State, budget: &Budget) -> Value {
    let usage = json!({
        "steps": state.steps,
        "input_tokens": state.usage.input_tokens,
        "output_tokens": state.usage.output_tokens,
        "total_tokens": state.tokens(),
        "wall_ms": state.elapsed_ms(),
        "budget": budget,
    });
    let (status, answer, extra) = match end {
        End::Answered(text) => ("answered", Value::String(text.clone()), json!({})),
        End::Exceeded(which) => ("budget_exceeded", Value::Null, json!({"exceeded": which})),
        End::Failed(why) => ("failed", Value::Null, json!({"error": why})),
        End::Parked(ticket) => (
            "failed",
            Value::Null,
            json!({"error": format!("parked on {ticket}")}),
        ),
    };
    let mut out = json!({
        "status": status,
        "answer": answer,
        "evidence": state.evidence,
        "usage": usage,
        "run_id": state.run_id,
    });
    if let (Some(out), Some(extra)) = (out.as_object_mut(), extra.as_object()) {
        out.extend(extra.clone());
    }
    out
}
