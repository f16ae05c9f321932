//! The loop of a declared assistant's run, as the executor of the job that
//! drives it ([`toolfleet_fleet::runs::RUN_TOOL`]).
//!
//! The run's record is the loop's only state: its checkpoint holds the
//! conversation, the tool calls of the model's last reply and what each
//! started, the usage and the transcript people read. Every write is a
//! compare-and-set on the run's version, so a loop whose run was cancelled
//! or resumed elsewhere stops at its next write, and nothing is done twice:
//! a settled call is never made again, a job or ticket a call started is
//! awaited, never started again (a job call's idempotency key is the run,
//! the step and the call's place).
//!
//! The calls of one reply are started together. Those that answer at once
//! (queries, commands, errors) are results; those that start a job or open
//! a ticket (a person's question, an approval) park the run: it is written
//! `waiting` on all of them and the job ends, so a waiting run holds no
//! worker slot, connection or task. Whoever settles the last of them
//! resumes the run ([`toolfleet_fleet::runs::wake_runs`]), which enqueues
//! this loop again, on any worker. Budgets stop it: steps, tokens and wall
//! time, the time spent waiting left out.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use toolfleet_broker::RunNotice;
use toolfleet_core::config::AgentDecl;
use toolfleet_core::registry::truncate;
use toolfleet_core::{
    AnsweredBy, Budget, CallCtx, Envelope, Executor, Json, Lineage, Principal, Shape, ToolError,
    new_id, now_ms,
};
use toolfleet_fleet::runs::{Item, item_outcome, notice_of, run_event};
use toolfleet_store::{RunRecord, RunState, RunWait, StoreError, UpdateRun, WaitFor};

use crate::model::{Model, ModelRequest, ToolCall, ToolResult, ToolSpec, Turn, Usage};
use crate::run::{AgentEnv, AgentExecutor, Exceeded, Spent, elapsed_ms, open_calls};

/// A tool result shown to the model is cut to this many characters.
const RESULT_CHARS: usize = 16_000;

/// One declared assistant: its declaration and its model client.
pub struct Assistant {
    /// As `[[agents]]` declares it.
    pub decl: AgentDecl,
    model: Arc<dyn Model>,
}

impl Assistant {
    /// The assistant of `decl`, asking `model`.
    pub fn new(decl: AgentDecl, model: Arc<dyn Model>) -> Self {
        Assistant { decl, model }
    }
}

/// The declared assistants of a process: the executor of the job that
/// drives their runs.
pub struct Assistants {
    env: Arc<AgentEnv>,
    by_name: BTreeMap<String, Arc<Assistant>>,
}

impl Assistants {
    /// The pool of `decl`'s loop (`default_pool` unless it names one) and
    /// how long one job of it may take: its wall time and a margin for its
    /// writes, in milliseconds.
    pub fn placement(decl: &AgentDecl, default_pool: &str) -> (String, u64) {
        let budget = AgentExecutor::declared_budget(&decl.spec);
        let pool = decl.pool.clone().unwrap_or_else(|| default_pool.to_owned());
        (pool, budget.max_wall_ms.saturating_add(60_000))
    }

    /// `assistants`, their tool calls going through `env`'s runtime.
    pub fn new(env: Arc<AgentEnv>, assistants: Vec<Assistant>) -> Self {
        let by_name = assistants
            .into_iter()
            .map(|a| (a.decl.name.clone(), Arc::new(a)))
            .collect();
        Assistants { env, by_name }
    }
}

/// A call the last reply made, and what became of it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Slot {
    /// The job or ticket it started, awaited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    started: Option<Started>,
    /// What the model is told of it, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<ToolResult>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case")]
enum Started {
    Job(String),
    Ticket(String),
}

/// The loop's state, in the run's checkpoint under `loop`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Loop {
    started_at: i64,
    /// Time spent waiting on jobs and people, not counted as wall time.
    waited_ms: u64,
    /// When the run parked, while it waits.
    #[serde(default)]
    waiting_since: Option<i64>,
    /// When the run answered, until the user's next message: that time is
    /// the user's, not the run's.
    #[serde(default)]
    answered_at: Option<i64>,
    steps: u32,
    usage: Usage,
    turns: Vec<Turn>,
    /// One per call of the last reply while its calls are open.
    #[serde(default)]
    calls: Vec<Slot>,
}

impl Loop {
    fn fresh() -> Loop {
        Loop {
            started_at: now_ms(),
            waited_ms: 0,
            waiting_since: None,
            answered_at: None,
            steps: 0,
            usage: Usage::default(),
            turns: Vec::new(),
            calls: Vec::new(),
        }
    }

    fn elapsed_ms(&self) -> u64 {
        elapsed_ms(self.started_at, self.waited_ms)
    }

    fn spent(&self) -> Spent {
        Spent {
            steps: self.steps,
            tokens: self.usage.total(),
            wall_ms: self.elapsed_ms(),
        }
    }

    fn usage_json(&self, budget: &Budget) -> Value {
        json!({
            "steps": self.steps,
            "input_tokens": self.usage.input_tokens,
            "output_tokens": self.usage.output_tokens,
            "total_tokens": self.usage.total(),
            "wall_ms": self.elapsed_ms(),
            "waited_ms": self.waited_ms,
            "budget": budget,
        })
    }
}

/// How one pass of the loop ended.
enum End {
    /// Written waiting: the job ends, the run waits.
    Parked,
    /// Moved on elsewhere (cancelled, resumed by another): stop, write nothing.
    Gone,
    /// Finished in this state, with its answer or error.
    Done(RunState, Option<String>, Option<Value>),
}

/// One pass of one run: the run as last written and its loop.
struct Pass {
    assistant: Arc<Assistant>,
    env: Arc<AgentEnv>,
    run: RunRecord,
    checkpoint: Value,
    state: Loop,
    /// Transcript entries already announced.
    announced: usize,
}

impl Executor for Assistants {
    fn execute(&self, ctx: CallCtx, args: Value) -> BoxFuture<'static, Result<Json, ToolError>> {
        let env = self.env.clone();
        let by_name = self.by_name.clone();
        Box::pin(async move {
            let Some(run_id) = args.get("run_id").and_then(Value::as_str) else {
                return Err(ToolError::invalid_arguments(
                    "the run's loop needs its run_id",
                ));
            };
            let run = match env.store().run_by_id(run_id).await {
                Ok(Some(run)) => run,
                Ok(None) => return Ok(Json::from(json!({"run_id": run_id, "state": "gone"}))),
                Err(error) => return Err(unavailable(error)),
            };
            if run.state != RunState::Running {
                // Cancelled, or moved on by a loop before this one.
                return Ok(Json::from(json!({"run_id": run.id, "state": run.state})));
            }
            let Some(assistant) = run.agent.as_ref().and_then(|a| by_name.get(a)).cloned() else {
                let why = format!(
                    "the assistant `{}` is not declared in this worker",
                    run.agent.as_deref().unwrap_or("")
                );
                return Err(ToolError::failed(why, false));
            };
            let mut pass = Pass::start(assistant, env, run);
            // The job driving the loop now: the sweeper looks at it.
            if let Some(job) = ctx.idempotency_key {
                pass.checkpoint["job"] = Value::String(job);
            }
            let end = pass.go().await.map_err(unavailable)?;
            Ok(Json::from(pass.finish(end).await.map_err(unavailable)?))
        })
    }
}

fn unavailable(error: StoreError) -> ToolError {
    ToolError::failed(format!("the run's store failed: {error}"), true)
}

fn entry(kind: &str, fields: Value) -> Value {
    let mut entry = json!({"at": now_ms(), "type": kind});
    if let (Some(map), Some(fields)) = (entry.as_object_mut(), fields.as_object()) {
        map.extend(fields.clone());
    }
    entry
}

impl Pass {
    fn start(assistant: Arc<Assistant>, env: Arc<AgentEnv>, run: RunRecord) -> Pass {
        let checkpoint = run.checkpoint.clone().unwrap_or_else(|| json!({}));
        let state = checkpoint
            .get("loop")
            .cloned()
            .and_then(|l| serde_json::from_value::<Loop>(l).ok())
            .unwrap_or_else(Loop::fresh);
        let announced = transcript_len(&checkpoint);
        Pass {
            assistant,
            env,
            run,
            checkpoint,
            state,
            announced,
        }
    }

    fn budget(&self) -> Budget {
        AgentExecutor::declared_budget(&self.assistant.decl.spec)
    }

    fn push(&mut self, entry: Value) {
        match self
            .checkpoint
            .get_mut("transcript")
            .and_then(Value::as_array_mut)
        {
            Some(list) => list.push(entry),
            None => self.checkpoint["transcript"] = json!([entry]),
        }
    }

    /// Writes the loop as it stands, moving the run from `running` to `to`
    /// (with `wait` when waiting); false when the run moved on elsewhere.
    async fn write(
        &mut self,
        to: RunState,
        wait: Option<&RunWait>,
        answer: Option<&str>,
        error: Option<&Value>,
    ) -> Result<bool, StoreError> {
        self.checkpoint["loop"] = serde_json::to_value(&self.state).unwrap_or(Value::Null);
        let usage = self.state.usage_json(&self.budget());
        let update = UpdateRun {
            version: Some(self.run.version),
            checkpoint: Some(&self.checkpoint),
            wait,
            answer,
            error,
            usage: Some(&usage),
            ..UpdateRun::new(&self.run.id, &[RunState::Running], to, now_ms())
        };
        let Some(run) = self.env.store().update_run(update).await? else {
            return Ok(false);
        };
        self.run = run;
        self.announce(notice_of(to)).await;
        Ok(true)
    }

    /// Tells the run's listeners what it gained since the last time.
    async fn announce(&mut self, notice: RunNotice) {
        let entries: Vec<Value> = self
            .checkpoint
            .get("transcript")
            .and_then(Value::as_array)
            .map(|t| t.iter().skip(self.announced).cloned().collect())
            .unwrap_or_default();
        if entries.is_empty() && notice == RunNotice::Step {
            return;
        }
        let from = self.announced;
        self.announced += entries.len();
        let mut event = run_event(&self.run, notice, entries);
        // Where its entries sit in the transcript.
        std::sync::Arc::make_mut(&mut event.body)["from"] = json!(from);
        if let Err(error) = self.env.notices().publish(&event).await {
            tracing::warn!(run_id = %self.run.id, %error, "announcing a run's step failed");
        }
    }

    /// Runs the loop until it parks, finishes, or the run moves on.
    async fn go(&mut self) -> Result<End, StoreError> {
        // Back from a wait: that time is not wall time.
        if let Some(since) = self.state.waiting_since.take() {
            let waited = u64::try_from(now_ms().saturating_sub(since)).unwrap_or(0);
            self.state.waited_ms = self.state.waited_ms.saturating_add(waited);
            self.push(entry("resume", json!({"waited_ms": waited})));
        }
        // The user's next message after an answer: the time between is not
        // wall time either.
        if let Some(since) = self.state.answered_at.take() {
            let idle = u64::try_from(now_ms().saturating_sub(since)).unwrap_or(0);
            self.state.waited_ms = self.state.waited_ms.saturating_add(idle);
        }
        let inbox: Vec<String> = self
            .checkpoint
            .get_mut("inbox")
            .and_then(Value::as_array_mut)
            .map(|list| {
                list.drain(..)
                    .filter_map(|m| m.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        for text in inbox {
            self.push(entry("user", json!({"content": text})));
            self.state.turns.push(Turn::User { text });
        }
        if !self.write(RunState::Running, None, None, None).await? {
            return Ok(End::Gone);
        }
        let budget = self.budget();
        let tools = self.offered();
        loop {
            if let Some(calls) = open_calls(&self.state.turns) {
                if let Some(exceeded) = self.state.spent().exceeded(&budget) {
                    return Ok(exceeded_end(exceeded));
                }
                match self.settle_calls(&calls).await? {
                    Some(End::Gone) => return Ok(End::Gone),
                    Some(end) => return Ok(end),
                    None => {}
                }
            }
            if let Some(exceeded) = self.state.spent().exceeded(&budget) {
                return Ok(exceeded_end(exceeded));
            }
            let reply = match self.ask_model(&tools, &budget).await {
                Ok(reply) => reply,
                Err(end) => return Ok(end),
            };
            self.state.steps += 1;
            self.state.usage.add(reply.usage);
            if let Some(runtime) = self.env.runtime_now() {
                runtime.metrics().agent_step(
                    runtime.tool_label(toolfleet_fleet::runs::RUN_TOOL),
                    reply.usage.input_tokens,
                    reply.usage.output_tokens,
                );
            }
            let calls: Vec<Value> = reply
                .calls
                .iter()
                .map(|c| json!({"id": c.id, "name": c.name, "args": c.args}))
                .collect();
            self.push(entry("model", json!({"text": reply.text, "calls": calls})));
            let done = reply.calls.is_empty();
            let text = reply.text.clone();
            self.state.turns.push(Turn::Assistant {
                text: reply.text,
                calls: reply.calls,
            });
            if done {
                return Ok(End::Done(
                    RunState::Answered,
                    Some(text.unwrap_or_default()),
                    None,
                ));
            }
            if !self.write(RunState::Running, None, None, None).await? {
                return Ok(End::Gone);
            }
        }
    }

    /// Asks the model for its next reply; `Err` ends the run.
    async fn ask_model(
        &self,
        tools: &[ToolSpec],
        budget: &Budget,
    ) -> Result<crate::model::ModelReply, End> {
        let spec = &self.assistant.decl.spec;
        let request = ModelRequest {
            system: &spec.system_prompt,
            turns: &self.state.turns,
            tools,
            max_output_tokens: spec.max_output_tokens,
        };
        let left = Duration::from_millis(self.state.spent().remaining(budget).max_wall_ms);
        // The model client retries what a retry may cure.
        match tokio::time::timeout(left, self.assistant.model.complete(&request)).await {
            Err(_) => Err(exceeded_end(Exceeded::WallTime)),
            Ok(Err(error)) => Err(End::Done(
                RunState::Failed,
                None,
                Some(
                    json!({"code": "tool_failed", "message": format!("the model failed: {error}")}),
                ),
            )),
            Ok(Ok(reply)) => Ok(reply),
        }
    }

    /// The tools offered to the model: the assistant's that are registered.
    fn offered(&self) -> Vec<ToolSpec> {
        let Some(runtime) = self.env.runtime_now() else {
            return Vec::new();
        };
        self.assistant
            .decl
            .spec
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

    /// Starts the calls of the last reply not started yet, all of them,
    /// then awaits those that started a job or a ticket: `None` once every
    /// result is in (the results turn written), else how the pass ends.
    async fn settle_calls(&mut self, calls: &[ToolCall]) -> Result<Option<End>, StoreError> {
        self.state.calls.resize(calls.len(), Slot::default());
        for (n, call) in calls.iter().enumerate() {
            if self.state.calls[n].started.is_some() || self.state.calls[n].result.is_some() {
                continue;
            }
            let (started, envelope) = self.start_call(n, call).await;
            self.push(entry(
                "tool_call",
                json!({"call_id": call.id, "tool": call.name, "args": call.args, "envelope": envelope}),
            ));
            let slot = &mut self.state.calls[n];
            match started {
                Some(started) => slot.started = Some(started),
                None => slot.result = Some(to_result(call, &envelope)),
            }
            // Written once made: a restart awaits what it started.
            if !self.write(RunState::Running, None, None, None).await? {
                return Ok(Some(End::Gone));
            }
        }
        loop {
            let waiting = self.collect(calls).await?;
            if waiting.jobs.is_empty() && waiting.tickets.is_empty() {
                break;
            }
            self.state.waiting_since = Some(now_ms());
            self.push(entry(
                "wait",
                json!({"jobs": waiting.jobs, "tickets": waiting.tickets}),
            ));
            if !self
                .write(RunState::Waiting, Some(&waiting), None, None)
                .await?
            {
                return Ok(Some(End::Gone));
            }
            // Settled between the look and the write: nobody will wake it.
            if !self.collect_would_finish(calls).await? {
                return Ok(Some(End::Parked));
            }
            let resumed = UpdateRun {
                version: Some(self.run.version),
                ..UpdateRun::new(
                    &self.run.id,
                    &[RunState::Waiting],
                    RunState::Running,
                    now_ms(),
                )
            };
            match self.env.store().update_run(resumed).await? {
                Some(run) => self.run = run,
                // Resumed by whoever settled it: that loop goes on.
                None => return Ok(Some(End::Gone)),
            }
            if let Some(since) = self.state.waiting_since.take() {
                let waited = u64::try_from(now_ms().saturating_sub(since)).unwrap_or(0);
                self.state.waited_ms = self.state.waited_ms.saturating_add(waited);
            }
            self.push(entry("resume", json!({})));
        }
        let results: Vec<ToolResult> = std::mem::take(&mut self.state.calls)
            .into_iter()
            .zip(calls)
            .map(|(slot, call)| {
                slot.result.unwrap_or_else(|| ToolResult {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    content: json!({"error": {"code": "tool_failed", "message": "no result was recorded for this call"}}).to_string(),
                    is_error: true,
                })
            })
            .collect();
        self.state.turns.push(Turn::Tool { results });
        if !self.write(RunState::Running, None, None, None).await? {
            return Ok(Some(End::Gone));
        }
        Ok(None)
    }

    /// Fills in the result of each started call whose job or ticket
    /// settled; answers what the rest wait on.
    async fn collect(&mut self, calls: &[ToolCall]) -> Result<RunWait, StoreError> {
        let mut wait = RunWait {
            wait_for: WaitFor::All,
            ..RunWait::default()
        };
        for (n, call) in calls.iter().enumerate() {
            let slot = &self.state.calls[n];
            if slot.result.is_some() {
                continue;
            }
            let Some(started) = slot.started.clone() else {
                continue;
            };
            match self.settled(&started).await? {
                Some(envelope) => {
                    let (kind, id) = match &started {
                        Started::Job(id) => ("job", id),
                        Started::Ticket(id) => ("ticket", id),
                    };
                    self.push(entry(
                        "tool_result",
                        json!({"call_id": call.id, "tool": call.name, kind: id, "envelope": envelope}),
                    ));
                    self.state.calls[n].result = Some(to_result(call, &envelope));
                }
                None => match started {
                    Started::Job(id) => wait.jobs.push(id),
                    Started::Ticket(id) => wait.tickets.push(id),
                },
            }
        }
        Ok(wait)
    }

    /// Whether every started call has settled now, without recording it.
    async fn collect_would_finish(&self, calls: &[ToolCall]) -> Result<bool, StoreError> {
        for slot in self.state.calls.iter().take(calls.len()) {
            if slot.result.is_some() {
                continue;
            }
            if let Some(started) = &slot.started
                && self.settled(started).await?.is_none()
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The final envelope of what a call started, once settled.
    async fn settled(&self, started: &Started) -> Result<Option<Envelope>, StoreError> {
        let item = match started {
            Started::Job(id) => Item::Job(id),
            Started::Ticket(id) => Item::Ticket(id),
        };
        item_outcome(self.env.store().as_ref(), &self.run.tenant, item).await
    }

    /// Makes call `n` of the reply: what it started to await (a job, a
    /// ticket), and the envelope it answered.
    async fn start_call(&self, n: usize, call: &ToolCall) -> (Option<Started>, Envelope) {
        let decl = &self.assistant.decl;
        let refuse = |message: String| {
            (
                None,
                Envelope::error(ToolError::new(
                    toolfleet_core::ErrorCode::Forbidden,
                    message,
                )),
            )
        };
        if !decl.spec.tools.iter().any(|t| t == &call.name) {
            return refuse(format!(
                "`{}` is not one of this assistant's tools; it may call: {}",
                call.name,
                decl.spec.tools.join(", ")
            ));
        }
        let Some(runtime) = self.env.runtime_now() else {
            let error = ToolError::failed("the runtime is not ready", true);
            return (None, Envelope::error(error));
        };
        let Some(tool) = runtime.registry().get(&call.name).cloned() else {
            return refuse(format!("`{}` is not registered", call.name));
        };
        let ctx = self.call_ctx(n, tool.shape(), &call.name);
        let envelope = runtime.invoke(&call.name, call.args.clone(), &ctx).await;
        let started = match &envelope {
            Envelope::Running { job_id, .. } => Some(Started::Job(job_id.clone())),
            Envelope::Suspended { ticket, .. } => Some(Started::Ticket(ticket.clone())),
            _ => None,
        };
        (started, envelope)
    }

    /// The context of call `n`: the run's user with the assistant's scopes
    /// that the user holds; for a job, a key that names the run, the step
    /// and the call, so a loop started again finds the same job; for a
    /// command the assistant names in `approve`, its user's approval.
    fn call_ctx(&self, n: usize, shape: Shape, tool: &str) -> CallCtx {
        let decl = &self.assistant.decl;
        let given: BTreeSet<&String> = decl.spec.scopes.iter().collect();
        let scopes: Vec<String> = self
            .run
            .scopes
            .iter()
            .filter(|s| given.contains(s))
            .cloned()
            .collect();
        let principal = Arc::new(Principal::new(&self.run.tenant, &self.run.user, scopes));
        let idempotency_key = matches!(shape, Shape::Job | Shape::Agent)
            .then(|| format!("{}:{}:{n}", self.run.id, self.state.steps));
        CallCtx {
            principal,
            run_id: self.run.id.clone(),
            call_id: new_id(),
            idempotency_key,
            callback_url: None,
            lineage: Some(Lineage {
                parent_run_id: self.run.id.clone(),
                depth: 1,
                budget: self.state.spent().remaining(&self.budget()),
            }),
            events: None,
            trace: None,
            approval: decl
                .approve
                .iter()
                .any(|t| t == tool)
                .then_some(AnsweredBy::Caller),
            run_at: None,
            priority: None,
            // A model's arguments are a caller's.
            client_input: false,
        }
    }

    /// Writes how the pass ended; answers the job's result.
    async fn finish(&mut self, end: End) -> Result<Value, StoreError> {
        match end {
            End::Parked => Ok(json!({"run_id": self.run.id, "state": "waiting"})),
            End::Gone => Ok(json!({"run_id": self.run.id, "state": "moved_on"})),
            End::Done(state, answer, error) => {
                if state == RunState::Answered {
                    self.state.answered_at = Some(now_ms());
                }
                let written = self
                    .write(state, None, answer.as_deref(), error.as_ref())
                    .await?;
                Ok(
                    json!({"run_id": self.run.id, "state": if written { state.as_str() } else { "moved_on" }}),
                )
            }
        }
    }
}

fn exceeded_end(which: Exceeded) -> End {
    let name = serde_json::to_value(which).unwrap_or(Value::Null);
    End::Done(
        RunState::BudgetExceeded,
        None,
        Some(json!({
            "code": "budget_exceeded",
            "exceeded": name,
            "message": format!("the run used up its {} budget", name.as_str().unwrap_or("")),
        })),
    )
}

fn transcript_len(checkpoint: &Value) -> usize {
    checkpoint
        .get("transcript")
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

/// What the model is told of a call's envelope.
fn to_result(call: &ToolCall, envelope: &Envelope) -> ToolResult {
    let (content, is_error) = match envelope {
        Envelope::Ok { result, .. } => (truncate(result.get(), RESULT_CHARS), false),
        Envelope::Error { error, .. } => (
            json!({"error": {"code": error.code, "message": error.message, "details": error.details}})
                .to_string(),
            true,
        ),
        other => (serde_json::to_string(other).unwrap_or_default(), true),
    };
    ToolResult {
        call_id: call.id.clone(),
        name: call.name.clone(),
        content,
        is_error,
    }
}
