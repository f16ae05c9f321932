//! What MCP tasks, progress and elicitation need from the fleet: jobs read,
//! awaited and cancelled in the store (the one truth: a task id is a job id,
//! so any dispatcher answers for a task another made), and tickets answered.
//! The server implements [`Jobs`]; this crate only maps jobs to tasks.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use rmcp::model::{DetailedTask, InputRequests, Task, TaskPayload, TaskStatus};
use serde_json::{Map, Value, json};
pub use toolfleet_core::iso8601;
use toolfleet_core::{Envelope, JobState, Principal, ToolError};

/// A boxed future, as the fleet's traits use.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One job as a task needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct JobView {
    /// The job id.
    pub id: String,
    /// The job tool called.
    pub tool: String,
    /// Where the job is in its life.
    pub state: JobState,
    /// What `get_job` answers for it now.
    pub envelope: Envelope,
    /// The progress the tool last reported.
    pub progress: Option<Value>,
    /// Milliseconds since the epoch.
    pub created_at: i64,
    /// Milliseconds since the epoch of the job's last change.
    pub updated_at: i64,
    /// What the job's tool asks its caller's client and is not answered
    /// yet, by key (`{"method", "params"}` each), while the job waits for
    /// it; `None` otherwise.
    pub input_requests: Option<Map<String, Value>>,
}

/// One page of a tenant's jobs, newest first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobList {
    /// The jobs of this page.
    pub jobs: Vec<JobView>,
    /// Pass back for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

/// Jobs and tickets as one principal may see and touch them: its own, or
/// its whole tenant's where its scopes say so; another tenant's or another
/// user's job or ticket reads as a missing one (`Ok(None)`).
pub trait Jobs: Send + Sync + 'static {
    /// The tenant's job `id`.
    fn job<'a>(
        &'a self,
        principal: &'a Principal,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<JobView>, ToolError>>;
    /// Waits up to `wait` for the job to change after `since` (its
    /// `updated_at`) or to settle, then answers it as it stands.
    fn wait<'a>(
        &'a self,
        principal: &'a Principal,
        id: &'a str,
        since: i64,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Option<JobView>, ToolError>>;
    /// Waits up to `wait` for the job to settle, then answers it as it
    /// stands: what a caller waiting only for the outcome asks, which an
    /// implementation may serve with fewer wake-ups. By default, as
    /// [`Jobs::wait`] from `since` (its `updated_at`).
    fn wait_settled<'a>(
        &'a self,
        principal: &'a Principal,
        id: &'a str,
        since: i64,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Option<JobView>, ToolError>> {
        self.wait(principal, id, since, wait)
    }
    /// As [`Jobs::wait_settled`] from the start, for a watch the server
    /// keeps on its own (a resource subscription) rather than a caller's
    /// request: it holds none of the caller's long-poll places. By default,
    /// as [`Jobs::wait_settled`] (for those that hold none).
    fn watch_settled<'a>(
        &'a self,
        principal: &'a Principal,
        id: &'a str,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Option<JobView>, ToolError>> {
        self.wait_settled(principal, id, 0, wait)
    }
    /// Cancels a queued or running job; answers it as it now stands.
    fn cancel<'a>(
        &'a self,
        principal: &'a Principal,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<JobView>, ToolError>>;
    /// One page of the tenant's jobs, newest first, at most `limit`, after
    /// `cursor` (one this method gave); with the cursor of the next page.
    fn list<'a>(
        &'a self,
        principal: &'a Principal,
        cursor: Option<&'a str>,
        limit: u32,
    ) -> BoxFuture<'a, Result<JobList, ToolError>>;
    /// Records the client's answers (by key) to what job `id`'s tool asks
    /// (see [`JobView::input_requests`]) for the job's owner alone: keys it
    /// does not ask, or answered before, are left out, and the answer to
    /// the last one resumes the job. `Ok(None)` for a job that is missing,
    /// another tenant's or another user's; `Ok(Some(()))` otherwise,
    /// recorded or not. By default no job asks, so nothing is recorded.
    fn respond<'a>(
        &'a self,
        principal: &'a Principal,
        id: &'a str,
        responses: &'a Map<String, Value>,
    ) -> BoxFuture<'a, Result<Option<()>, ToolError>> {
        let _ = responses;
        Box::pin(async move { Ok(self.job(principal, id).await?.map(|_| ())) })
    }
    /// Answers the tenant's ticket as `POST /v1/tickets/{id}/answer` does:
    /// the answered ticket, or the error that route would answer.
    fn answer<'a>(
        &'a self,
        principal: &'a Principal,
        ticket: &'a str,
        answer: Value,
    ) -> BoxFuture<'a, Envelope>;
}

/// The task status of a job state.
pub fn task_status(state: JobState) -> TaskStatus {
    match state {
        JobState::Queued
        | JobState::Scheduled
        | JobState::Running
        | JobState::Retrying
        | JobState::Parked => TaskStatus::Working,
        JobState::Succeeded => TaskStatus::Completed,
        JobState::Failed => TaskStatus::Failed,
        JobState::Cancelled => TaskStatus::Cancelled,
    }
}

/// The task of a job: `result` is the tool result a completed one answers
/// (as `tools/call` would have), `poll_after_s` the tool's poll hint.
pub fn task_of(
    job: &JobView,
    poll_after_s: u32,
    result: Option<Map<String, Value>>,
) -> DetailedTask {
    // A failed job given a result is one whose tool answered an error:
    // completed, its result an error result.
    let tool_error = job.state == JobState::Failed && result.is_some();
    let status = if tool_error {
        TaskStatus::Completed
    } else {
        task_status(job.state)
    };
    let asking = job
        .input_requests
        .as_ref()
        .filter(|r| !r.is_empty() && !job.state.is_settled())
        .and_then(|r| serde_json::from_value::<InputRequests>(Value::Object(r.clone())).ok());
    let status = if asking.is_some() {
        TaskStatus::InputRequired
    } else {
        status
    };
    let mut task = Task::new(
        job.id.clone(),
        status,
        iso8601(job.created_at),
        iso8601(job.updated_at),
    )
    .with_poll_interval_ms(u64::from(poll_after_s.max(1)) * 1000)
    .with_status_message(status_message(job));
    task.ttl_ms = None;
    let payload = match job.state {
        _ if asking.is_some() => TaskPayload::InputRequired {
            input_requests: asking.unwrap_or_default(),
        },
        JobState::Queued
        | JobState::Scheduled
        | JobState::Running
        | JobState::Retrying
        | JobState::Parked => TaskPayload::Working,
        JobState::Succeeded => TaskPayload::Completed {
            result: result.unwrap_or_default(),
        },
        JobState::Cancelled => TaskPayload::Cancelled,
        JobState::Failed if tool_error => TaskPayload::Completed {
            result: result.unwrap_or_default(),
        },
        JobState::Failed => {
            let (message, data) = match &job.envelope {
                Envelope::Error { error, .. } => (
                    error.message.clone(),
                    serde_json::to_value(&job.envelope).unwrap_or_default(),
                ),
                other => (
                    "the job failed".to_owned(),
                    serde_json::to_value(other).unwrap_or_default(),
                ),
            };
            let error = json!({"code": -32603, "message": message, "data": data});
            TaskPayload::Failed {
                error: match error {
                    Value::Object(map) => map,
                    _ => Map::new(),
                },
            }
        }
    };
    DetailedTask::new(task, payload)
}

/// The job's state, its attempts and progress, for people.
pub fn status_message(job: &JobView) -> String {
    if let Some(asked) = job.input_requests.as_ref().filter(|r| !r.is_empty()) {
        let keys: Vec<&str> = asked.keys().map(String::as_str).collect();
        return format!(
            "input_required `{}`: waiting for tasks/update with {}",
            job.tool,
            keys.join(", ")
        );
    }
    let mut message = format!("{} `{}`", job.state, job.tool);
    if let Envelope::Running {
        attempts: Some(attempts),
        ..
    } = &job.envelope
        && *attempts > 1
    {
        message.push_str(&format!(", attempt {attempts}"));
    }
    if let Some(progress) = &job.progress {
        message.push_str(&format!(", progress {progress}"));
    }
    message
}

/// A job id is a UUID; anything else cannot name a job (or a task).
pub fn plausible(id: &str) -> bool {
    toolfleet_core::is_job_id(id)
}

/// The `tasks/*` error for an id this caller has no job for.
pub fn no_task(id: &str) -> rmcp::ErrorData {
    rmcp::ErrorData::invalid_params(
        format!(
            "no task `{}` for this caller",
            toolfleet_core::registry::truncate(id, 64)
        ),
        None,
    )
}
