//! The tasks of revision 2025-11-25 (SEP-1686, "core" tasks), beside the
//! 2026-07-28 tasks extension rmcp implements.
//!
//! rmcp drops what 2025-11-25 adds for tasks (a `tools/call`'s `task`
//! parameter, `tasks/result`, `tasks/list`, the `tasks` server capability,
//! a tool's `execution.taskSupport`), so this module speaks that part of the
//! wire itself, on the JSON-RPC messages around rmcp: for a peer of
//! 2025-11-25 it answers task-augmented `tools/call` and `tasks/*` requests
//! (a task is its job, as with the extension), and adds the capability and
//! each job tool's `taskSupport` to rmcp's `initialize` and `tools/list`
//! answers. Every other message goes to rmcp as it came.
//!
//! Over HTTP the revision is each request's `MCP-Protocol-Version` header
//! (an `initialize` names it in its params); over stdio it is what the
//! session's `initialize` asked for.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use toolfleet_core::{Envelope, JobState, Principal, TraceContext};

use crate::jobs::{self, JobView};
use crate::{ToolServer, internal};

/// The revision whose tasks this module speaks.
pub const VERSION: &str = "2025-11-25";

/// Tasks per `tasks/list` page.
const LIST_PAGE: u32 = 50;
/// `_meta` key that ties a result to its task.
const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";
/// The longest one `tasks/result` round waits before looking again; a
/// missed notice costs a round, not the wait.
const RESULT_ROUND: Duration = Duration::from_secs(5);

/// What to do with one message from a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// A 2025-11-25 task request: this module answers it.
    Answer,
    /// rmcp answers; its result gains the `tasks` capability.
    PatchInitialize,
    /// rmcp answers; its job tools gain `execution.taskSupport`.
    PatchToolsList,
    /// rmcp's alone.
    Pass,
}

/// Where `message` goes; `legacy`: the peer speaks 2025-11-25.
pub fn route(message: &Value, legacy: bool) -> Route {
    let Some(method) = message.get("method").and_then(Value::as_str) else {
        return Route::Pass;
    };
    if message.get("id").is_none() {
        return Route::Pass;
    }
    let params = message.get("params");
    match method {
        "initialize"
            if params
                .and_then(|p| p.get("protocolVersion"))
                .and_then(Value::as_str)
                == Some(VERSION) =>
        {
            Route::PatchInitialize
        }
        _ if !legacy => Route::Pass,
        "tools/list" => Route::PatchToolsList,
        "tools/call" if params.and_then(|p| p.get("task")).is_some() => Route::Answer,
        "tasks/get" | "tasks/result" | "tasks/list" | "tasks/cancel" => Route::Answer,
        _ => Route::Pass,
    }
}

/// The JSON-RPC answer to request `id`.
pub fn reply(id: &Value, outcome: Result<Value, ErrorData>) -> Value {
    match outcome {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(error) => json!({"jsonrpc": "2.0", "id": id, "error": error}),
    }
}

/// Where a task's progress goes while the client polls it.
#[derive(Clone)]
pub enum Progress {
    /// The rmcp session's peer.
    Peer(rmcp::Peer<rmcp::RoleServer>),
    /// Lines this module writes to the client itself.
    Lines(mpsc::UnboundedSender<Value>),
}

impl Progress {
    /// Sends one notification; `false` when the client is gone.
    pub async fn send(&self, note: ProgressNotificationParam) -> bool {
        match self {
            Progress::Peer(peer) => peer.notify_progress(note).await.is_ok(),
            Progress::Lines(lines) => lines
                .send(json!({
                    "jsonrpc": "2.0",
                    "method": "notifications/progress",
                    "params": note,
                }))
                .is_ok(),
        }
    }
}

/// A job as a 2025-11-25 task. Jobs are kept (`ttl` null); a failed job's
/// task is `failed`, as the revision says of a tool result with `isError`.
pub fn task(job: &JobView, poll_after_s: u32) -> Value {
    let status = serde_json::to_value(jobs::task_status(job.state)).unwrap_or(json!("working"));
    json!({
        "taskId": job.id,
        "status": status,
        "statusMessage": jobs::status_message(job),
        "createdAt": jobs::iso8601(job.created_at),
        "lastUpdatedAt": jobs::iso8601(job.updated_at),
        "ttl": null,
        "pollInterval": u64::from(poll_after_s.max(1)) * 1000,
    })
}

/// The `tasks` capability of an `initialize` result.
pub fn patch_initialize(result: &mut Value) {
    if let Some(capabilities) = result
        .get_mut("capabilities")
        .and_then(Value::as_object_mut)
    {
        capabilities.insert(
            "tasks".into(),
            json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}),
        );
    }
}

impl ToolServer {
    /// Whether 2025-11-25 tasks are served: only with the fleet's jobs.
    pub(crate) fn serves_tasks(&self) -> bool {
        self.options.jobs.is_some()
    }

    /// A `tools/list` result's job and agent tools may run as tasks; the
    /// others, as the revision's default says, may not.
    pub(crate) fn patch_tools_list(&self, result: &mut Value) {
        let Some(tools) = result.get_mut("tools").and_then(Value::as_array_mut) else {
            return;
        };
        for tool in tools.iter_mut().filter_map(Value::as_object_mut) {
            let registered = tool
                .get("name")
                .and_then(Value::as_str)
                .and_then(|name| self.runtime.registry().get(name))
                .filter(|t| t.shape().is_enqueued());
            if let Some(registered) = registered {
                let support = if registered.declaration().requires_task {
                    "required"
                } else {
                    "optional"
                };
                tool.insert("execution".into(), json!({"taskSupport": support}));
            }
        }
    }

    /// Answers one 2025-11-25 task request (`message`, routed
    /// [`Route::Answer`]) as `principal`.
    pub(crate) async fn answer_core_task(
        &self,
        principal: Arc<Principal>,
        message: &Value,
        progress: Option<Progress>,
        trace: Option<TraceContext>,
    ) -> Value {
        let id = message.get("id").cloned().unwrap_or(Value::Null);
        let params = message.get("params").cloned().unwrap_or(json!({}));
        let method = message
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let outcome = if !self.serves_tasks() {
            Err(ErrorData::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                "tasks are not served here",
                None,
            ))
        } else {
            match method {
                "tools/call" => self.call_as_task(principal, &params, progress, trace).await,
                "tasks/get" => match task_id(&params) {
                    Ok(id) => self
                        .job(&principal, id)
                        .await
                        .map(|job| task(&job, self.poll_after(&job.tool))),
                    Err(error) => Err(error),
                },
                "tasks/result" => self.task_result(&principal, &params).await,
                "tasks/list" => self.list_tasks(&principal, &params).await,
                "tasks/cancel" => self.cancel_core_task(&principal, &params).await,
                other => Err(ErrorData::new(
                    rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                    format!(
                        "`{}` is not a task method",
                        toolfleet_core::registry::truncate(other, 64)
                    ),
                    None,
                )),
            }
        };
        reply(&id, outcome)
    }

    /// A task-augmented `tools/call`: a job or agent tool answers its task
    /// (`CreateTaskResult`); a tool of another shape, whose listing claims
    /// no task support, is refused (-32601) as the revision says; an
    /// unknown tool or bad arguments answer their error result.
    async fn call_as_task(
        &self,
        principal: Arc<Principal>,
        params: &Value,
        progress: Option<Progress>,
        trace: Option<TraceContext>,
    ) -> Result<Value, ErrorData> {
        if !params.get("task").is_some_and(Value::is_object) {
            return Err(ErrorData::invalid_params(
                "`task` must be an object, such as {\"ttl\": 60000}",
                None,
            ));
        }
        let call = json!({
            "name": params.get("name").cloned().unwrap_or(Value::Null),
            "arguments": params.get("arguments").cloned().unwrap_or(Value::Null),
        });
        let name = call["name"].as_str().unwrap_or_default();
        if let Some(tool) = self.runtime.registry().get(name)
            && !tool.shape().is_enqueued()
        {
            // Its `execution.taskSupport` is absent: it may not run as a task.
            return Err(ErrorData::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                format!(
                    "`{name}` does not run as a task (a {} tool answers at once): call it without `task`",
                    tool.shape()
                ),
                None,
            ));
        }
        let (call, envelope) = self.invoke(principal.clone(), &call, None, trace).await;
        let enqueued = call.tool.as_ref().is_some_and(|t| t.shape().is_enqueued());
        let job_id = match &envelope {
            Envelope::Running { job_id, .. } if enqueued => job_id.clone(),
            _ => {
                return Ok(toolfleet_core::adapters::render_result(
                    toolfleet_core::adapters::Format::Mcp,
                    &call,
                    &envelope,
                ));
            }
        };
        let job = self.job(&principal, &job_id).await?;
        let token = params
            .get("_meta")
            .and_then(|m| m.get("progressToken"))
            .and_then(|t| serde_json::from_value::<ProgressToken>(t.clone()).ok());
        if let (Some(token), Some(progress), Some(jobs)) =
            (token, progress, self.options.jobs.clone())
        {
            let server = self.clone();
            let (tenant, id) = (principal.clone(), job.id.clone());
            tokio::spawn(async move {
                server
                    .follow(jobs.as_ref(), &tenant, &id, &token, &progress)
                    .await;
            });
        }
        Ok(json!({"task": task(&job, self.poll_after(&job.tool))}))
    }

    /// `tasks/result`: waits for the job to settle, then answers the tool
    /// result `tools/call` would have (an error result for a failed or
    /// cancelled job), tied to its task.
    async fn task_result(&self, principal: &Principal, params: &Value) -> Result<Value, ErrorData> {
        let id = task_id(params)?;
        let jobs = self.jobs()?.clone();
        let mut job = self.job(principal, id).await?;
        while !job.state.is_settled() {
            let round = jobs.wait_settled(principal, id, job.updated_at, RESULT_ROUND);
            job = match self.unless_stopping(round).await {
                None => {
                    return Err(ErrorData::internal_error(
                        format!(
                            "the server is stopping before task `{id}` settled; call tasks/result again"
                        ),
                        None,
                    ));
                }
                Some(Ok(Some(job))) => job,
                Some(Ok(None)) => return Err(jobs::no_task(id)),
                Some(Err(error)) => return Err(internal("waiting on a job", error.message)),
            };
        }
        let mut result = self.render_for(&job.tool, &job.envelope);
        if let Some(map) = result.as_object_mut() {
            let meta = map
                .entry("_meta")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(meta) = meta.as_object_mut() {
                meta.insert(RELATED_TASK.into(), json!({"taskId": job.id}));
            }
        }
        Ok(result)
    }

    /// `work`'s output, or `None` when the process starts to stop first.
    async fn unless_stopping<T>(&self, work: impl std::future::Future<Output = T>) -> Option<T> {
        let Some(mut stop) = self.options.stop.clone() else {
            return Some(work.await);
        };
        tokio::select! {
            biased;
            _ = stop.wait_for(|stopping| *stopping) => None,
            out = work => Some(out),
        }
    }

    /// `tasks/list`: the caller's tenant's jobs, newest first.
    async fn list_tasks(&self, principal: &Principal, params: &Value) -> Result<Value, ErrorData> {
        let cursor = match params.get("cursor") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) if c.len() <= 64 => Some(c.as_str()),
            Some(_) => {
                return Err(ErrorData::invalid_params(
                    "the cursor is not one this server gave; list again without a cursor",
                    None,
                ));
            }
        };
        let page = self
            .jobs()?
            .list(principal, cursor, LIST_PAGE)
            .await
            .map_err(|e| {
                if e.code == toolfleet_core::ErrorCode::InvalidArguments {
                    ErrorData::invalid_params(e.message, None)
                } else {
                    internal("listing jobs", e.message)
                }
            })?;
        let tasks: Vec<Value> = page
            .jobs
            .iter()
            .map(|job| task(job, self.poll_after(&job.tool)))
            .collect();
        let mut out = json!({"tasks": tasks});
        if let Some(next) = page.next_cursor {
            out["nextCursor"] = json!(next);
        }
        Ok(out)
    }

    /// `tasks/cancel`: a settled task cannot be cancelled; any other is,
    /// and answers as it then stands. A job that settles otherwise between
    /// the read and the cancel (the store leaves it as it is) is refused
    /// the same way.
    async fn cancel_core_task(
        &self,
        principal: &Principal,
        params: &Value,
    ) -> Result<Value, ErrorData> {
        let id = task_id(params)?;
        let job = self.job(principal, id).await?;
        if job.state.is_settled() {
            return Err(not_cancellable(id, job.state));
        }
        match self.jobs()?.cancel(principal, id).await {
            Ok(Some(job)) if job.state.is_settled() && job.state != JobState::Cancelled => {
                Err(not_cancellable(id, job.state))
            }
            Ok(Some(job)) => Ok(task(&job, self.poll_after(&job.tool))),
            Ok(None) => Err(jobs::no_task(id)),
            Err(error) => Err(internal("cancelling a job", error.message)),
        }
    }
}

/// The `taskId` of a `tasks/*` request.
fn task_id(params: &Value) -> Result<&str, ErrorData> {
    params
        .get("taskId")
        .and_then(Value::as_str)
        .ok_or_else(|| ErrorData::invalid_params("`taskId` (a string) is required", None))
}

/// Ids of requests whose answers this module completes.
#[derive(Default)]
struct Pending {
    initialize: HashSet<String>,
    tools_list: HashSet<String>,
}

/// MCP over a byte stream pair (stdin and stdout) for `server`, with the
/// 2025-11-25 tasks: the transport to hand rmcp, and the task that writes
/// to `output` (it ends when rmcp closes its side; await it before exiting
/// so nothing rmcp wrote is lost).
pub fn stdio<R, W>(
    server: ToolServer,
    principal: Arc<Principal>,
    input: R,
    output: W,
    max_line: usize,
) -> (
    (
        tokio::io::ReadHalf<tokio::io::DuplexStream>,
        tokio::io::WriteHalf<tokio::io::DuplexStream>,
    ),
    tokio::task::JoinHandle<()>,
)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let (from_rmcp, mut to_rmcp) = tokio::io::split(ours);
    let (our_lines, mut answers) = mpsc::unbounded_channel::<Value>();
    let legacy = Arc::new(AtomicBool::new(false));
    let pending = Arc::new(Mutex::new(Pending::default()));
    let patcher = server.clone();

    // The client's lines: ours answered here, the rest to rmcp.
    let reading = {
        let pending = pending.clone();
        async move {
            let mut input = BufReader::new(input);
            let mut line = Vec::new();
            loop {
                line.clear();
                match read_line(&mut input, &mut line, max_line).await {
                    Ok(Line::End) | Err(_) => break,
                    Ok(Line::TooLong) => {
                        let error = ErrorData::new(
                            rmcp::model::ErrorCode::PARSE_ERROR,
                            format!("a message is longer than {max_line} bytes"),
                            None,
                        );
                        let _ = our_lines.send(reply(&Value::Null, Err(error)));
                        continue;
                    }
                    Ok(Line::Read) => {}
                }
                let message: Option<Value> = serde_json::from_slice(&line).ok();
                let route = message
                    .as_ref()
                    .map(|m| route(m, legacy.load(Ordering::Relaxed)))
                    .unwrap_or(Route::Pass);
                let id = message
                    .as_ref()
                    .and_then(|m| m.get("id"))
                    .map(Value::to_string);
                match (route, message, id) {
                    (Route::Answer, Some(message), _) => {
                        let (server, principal) = (server.clone(), principal.clone());
                        let lines = our_lines.clone();
                        tokio::spawn(async move {
                            let progress = Progress::Lines(lines.clone());
                            let answer = server
                                .answer_core_task(principal, &message, Some(progress), None)
                                .await;
                            let _ = lines.send(answer);
                        });
                        continue;
                    }
                    (Route::PatchInitialize, _, Some(id)) => {
                        legacy.store(true, Ordering::Relaxed);
                        lock(&pending).initialize.insert(id);
                    }
                    (Route::PatchToolsList, _, Some(id)) => {
                        lock(&pending).tools_list.insert(id);
                    }
                    _ => {}
                }
                if !line.ends_with(b"\n") {
                    line.push(b'\n');
                }
                if to_rmcp.write_all(&line).await.is_err() {
                    break;
                }
            }
            // The client is gone: rmcp sees its input end and stops.
            let _ = to_rmcp.shutdown().await;
        }
    };

    // rmcp's lines and ours, one whole line at a time, to the client.
    let writing = async move {
        let mut output = output;
        let mut from_rmcp = BufReader::new(from_rmcp).lines();
        loop {
            let line = tokio::select! {
                biased;
                Some(answer) = answers.recv() => answer.to_string(),
                read = from_rmcp.next_line() => match read {
                    Ok(Some(line)) => server_line(&patcher, &pending, line),
                    // rmcp has stopped: so has the session.
                    _ => break,
                },
            };
            if output.write_all(line.as_bytes()).await.is_err()
                || output.write_all(b"\n").await.is_err()
                || output.flush().await.is_err()
            {
                break;
            }
        }
    };
    tokio::spawn(reading);
    let handle = tokio::spawn(writing);
    (tokio::io::split(theirs), handle)
}

fn lock(pending: &Mutex<Pending>) -> std::sync::MutexGuard<'_, Pending> {
    pending.lock().unwrap_or_else(|e| e.into_inner())
}

/// One of rmcp's lines, completed if it answers a request this module
/// completes.
fn server_line(server: &ToolServer, pending: &Mutex<Pending>, line: String) -> String {
    {
        let pending = lock(pending);
        if pending.initialize.is_empty() && pending.tools_list.is_empty() {
            return line;
        }
    }
    let Ok(mut message) = serde_json::from_str::<Value>(&line) else {
        return line;
    };
    let Some(id) = message.get("id").map(Value::to_string) else {
        return line;
    };
    let (initialize, tools_list) = {
        let mut pending = lock(pending);
        (
            pending.initialize.remove(&id),
            pending.tools_list.remove(&id),
        )
    };
    match message.get_mut("result") {
        Some(result) if initialize && server.serves_tasks() => patch_initialize(result),
        Some(result) if tools_list && server.serves_tasks() => server.patch_tools_list(result),
        _ => return line,
    }
    message.to_string()
}

enum Line {
    Read,
    TooLong,
    End,
}

/// Reads one line into `line`, at most `max` bytes; a longer one is skipped
/// to its end.
async fn read_line<R: AsyncBufReadExt + Unpin>(
    input: &mut R,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Line> {
    let mut too_long = false;
    loop {
        let buffer = input.fill_buf().await?;
        if buffer.is_empty() {
            return Ok(if line.is_empty() && !too_long {
                Line::End
            } else if too_long {
                Line::TooLong
            } else {
                Line::Read
            });
        }
        let (chunk, done) = match buffer.iter().position(|&b| b == b'\n') {
            Some(at) => (&buffer[..=at], true),
            None => (buffer, false),
        };
        let used = chunk.len();
        if !too_long {
            if line.len() + used > max.saturating_add(1) {
                too_long = true;
                line.clear();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        input.consume(used);
        if done {
            return Ok(if too_long { Line::TooLong } else { Line::Read });
        }
    }
}

/// The refusal of `tasks/cancel` for task `id`, settled in `state`.
fn not_cancellable(id: &str, state: JobState) -> ErrorData {
    let status = serde_json::to_value(jobs::task_status(state)).unwrap_or_default();
    ErrorData::invalid_params(
        format!("task `{id}` is already {status} and cannot be cancelled"),
        None,
    )
}
