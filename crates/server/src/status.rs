//! The status API: `get_job` (with long-poll) and cancel, shared by the HTTP
//! routes, MCP's tasks and the `get_job` and `cancel_job` tools a model
//! calls. Another tenant's or another user's job reads exactly as a missing
//! one does (see [`crate::access`]).

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use toolfleet_broker::{Event, Notices};
use toolfleet_core::{
    CallCtx, Envelope, ErrorCode, FLEET_OPERATE, JobState, Json, Principal, ToolDecl, ToolError,
};
use toolfleet_store::{JobRecord, Store};

use crate::access::{self, Access};
use toolfleet_core::now_ms;
use toolfleet_fleet::store_error;

/// The poll hint of `running` answers from the status API.
pub(crate) use toolfleet_fleet::dispatch::POLL_AFTER_S;

pub(crate) fn missing(id: &str) -> ToolError {
    ToolError::not_found(format!(
        "no job `{}` for this caller; check the job_id the `running` answer gave",
        toolfleet_core::registry::truncate(id, 64)
    ))
}

/// A job id is a UUID; anything else cannot name a job.
pub(crate) fn plausible(id: &str) -> bool {
    toolfleet_mcp::jobs::plausible(id)
}

/// The status API over one store and its notices, keeping to the rules of
/// [`crate::access`]: what `get_job`, `cancel_job`, their routes and MCP's
/// tasks share.
#[derive(Clone)]
pub struct Status {
    /// The store of jobs and tickets.
    pub store: Arc<dyn Store>,
    /// The notices that say a job settled or a ticket was answered.
    pub notices: Arc<dyn Notices>,
    /// Who may read, cancel and answer what.
    pub access: Access,
}

impl Status {
    /// The status API over `store` and `notices`, under `access`.
    pub fn new(store: Arc<dyn Store>, notices: Arc<dyn Notices>, access: Access) -> Self {
        Status {
            store,
            notices,
            access,
        }
    }

    /// Reads a job of `principal`'s, waiting up to `wait` for it to settle:
    /// its envelope, if `principal` may read its result.
    pub async fn get_job(&self, principal: &Principal, id: &str, wait: Duration) -> Envelope {
        match self.wait_settled(principal, id, wait).await {
            Ok(Some(job)) => {
                self.waiting_for_key(&job, self.answer(principal, &job))
                    .await
            }
            Ok(None) => Envelope::error(missing(id)),
            Err(error) => Envelope::error(error),
        }
    }

    /// `envelope`, of a queued `job`, saying it waits for its concurrency
    /// key when as many of its key run as its tool allows.
    async fn waiting_for_key(&self, job: &JobRecord, mut envelope: Envelope) -> Envelope {
        let (Some(key), Some(limit)) = (&job.concurrency_key, job.concurrency_limit) else {
            return envelope;
        };
        if job.state != toolfleet_core::JobState::Queued {
            return envelope;
        }
        let full = matches!(
            self.store.running_with_key(key, toolfleet_core::now_ms()).await,
            Ok(running) if running >= limit
        );
        if let Envelope::Running { waiting_for, .. } = &mut envelope
            && full
        {
            *waiting_for = Some("concurrency_key".to_owned());
        }
        envelope
    }

    /// What `principal` reads of `job`: its envelope, or why its result is
    /// not for this caller.
    pub fn answer(&self, principal: &Principal, job: &JobRecord) -> Envelope {
        self.access
            .screen(principal, &job.tool, job.envelope(POLL_AFTER_S))
    }

    /// Reads a job `principal` may see, waiting up to `wait` for it to
    /// settle, woken by the outcomes' feed alone; the job as it then stands.
    pub async fn wait_settled(
        &self,
        principal: &Principal,
        id: &str,
        wait: Duration,
    ) -> Result<Option<JobRecord>, ToolError> {
        self.until_settled(principal, id, wait, true).await
    }

    /// As [`Status::wait_settled`], for a watch the server keeps on its own
    /// (an MCP resource subscription): it holds none of `principal`'s
    /// long-poll places, which are for its own requests.
    pub async fn watch_settled(
        &self,
        principal: &Principal,
        id: &str,
        wait: Duration,
    ) -> Result<Option<JobRecord>, ToolError> {
        self.until_settled(principal, id, wait, false).await
    }

    async fn until_settled(
        &self,
        principal: &Principal,
        id: &str,
        wait: Duration,
        held: bool,
    ) -> Result<Option<JobRecord>, ToolError> {
        let settled = |job: &JobRecord| job.state.is_settled();
        self.wait_until(principal, id, wait, settled, Wakes::Settled, held)
            .await
    }

    /// Waits up to `wait` for any news of a job `principal` may see after
    /// `since` (its `updated_at`), or for it to settle; the job as it then
    /// stands.
    pub async fn wait_change(
        &self,
        principal: &Principal,
        id: &str,
        since: i64,
        wait: Duration,
    ) -> Result<Option<JobRecord>, ToolError> {
        let changed = |job: &JobRecord| job.updated_at != since || job.state.is_settled();
        self.wait_until(principal, id, wait, changed, Wakes::Any, true)
            .await
    }

    /// The job `id` if `principal` may see it: another tenant's or another
    /// user's reads as a missing one.
    pub(crate) async fn read(
        &self,
        principal: &Principal,
        id: &str,
    ) -> Result<Option<JobRecord>, ToolError> {
        if !plausible(id) {
            return Ok(None);
        }
        let job = self
            .store
            .job(&principal.tenant, id)
            .await
            .map_err(store_error)?;
        Ok(job.filter(|job| access::sees_job(principal, job)))
    }

    /// Reads the job and, unless `done` holds for it already, waits up to
    /// `wait` for an event of it that `wakes`, then reads it again: the one
    /// long poll behind `get_job` and MCP's task waits (`held`: against the
    /// principal's bound of long polls). Subscribes before
    /// reading, so a change between the two is not missed; without events
    /// (the subscription ended, or could not be made) it waits out the
    /// deadline, or a second when subscribing failed, and reads again,
    /// rather than spin.
    async fn wait_until(
        &self,
        principal: &Principal,
        id: &str,
        wait: Duration,
        done: impl Fn(&JobRecord) -> bool,
        wakes: Wakes,
        held: bool,
    ) -> Result<Option<JobRecord>, ToolError> {
        if !plausible(id) {
            return Ok(None);
        }
        // A caller's wait is held against the principal's bound until it ends.
        let _held = match wait.is_zero() || !held {
            true => None,
            false => Some(self.access.long_poll(principal)?),
        };
        let subscribed = match wakes {
            _ if wait.is_zero() => None,
            Wakes::Settled => Some(self.notices.subscribe_settled().await),
            Wakes::Any => Some(self.notices.subscribe().await),
        };
        let refused = subscribed.as_ref().is_some_and(Result::is_err);
        let mut events = subscribed.and_then(Result::ok);
        let Some(job) = self.read(principal, id).await? else {
            return Ok(None);
        };
        if refused && !done(&job) {
            // Notices down: a caller that waits again at once (a task's
            // result) polls the store once a second instead of spinning.
            tokio::time::sleep(wait.min(REFUSED_POLL)).await;
            return self.read(principal, id).await;
        }
        let Some(events) = events.as_mut().filter(|_| !done(&job)) else {
            return Ok(Some(job));
        };
        let tenant = &principal.tenant;
        let _ = tokio::time::timeout(wait, async {
            while let Some(event) = events.next().await {
                if event.kind == toolfleet_broker::EventKind::Job
                    && event.id == id
                    && &event.tenant == tenant
                    && wakes.by(&event)
                {
                    return;
                }
            }
            std::future::pending::<()>().await
        })
        .await;
        self.read(principal, id).await
    }

    /// Cancels a queued or running job `principal` may cancel; answers the
    /// job as it now stands.
    pub async fn cancel_job(&self, principal: &Principal, id: &str) -> Envelope {
        match self.cancel_record(principal, id).await {
            // An operator without the tool's scopes learns that the cancel
            // took, and nothing of what the job had done.
            Ok(Some(job))
                if job.state == JobState::Cancelled
                    && self.access.result_refused(principal, &job.tool).is_some() =>
            {
                Envelope::Error {
                    error: ToolError::new(ErrorCode::Cancelled, format!("job `{id}` is cancelled")),
                    state: Some(JobState::Cancelled),
                }
            }
            Ok(Some(job)) => self.answer(principal, &job),
            Ok(None) => Envelope::error(missing(id)),
            Err(error) => Envelope::error(error),
        }
    }

    /// Cancels a queued or running job and tells subscribers, auditing who
    /// asked; the job as it now stands, `None` when `principal` cannot see
    /// such a job. One who sees it but may not cancel it (a reader of the
    /// tenant) is refused with `forbidden`.
    pub async fn cancel_record(
        &self,
        principal: &Principal,
        id: &str,
    ) -> Result<Option<JobRecord>, ToolError> {
        let outcome = self.cancel_unaudited(principal, id).await;
        let envelope = match &outcome {
            Ok(Some(job)) => Envelope::ok(Json::from(json!({"state": job.state.shown()})), ""),
            Ok(None) => Envelope::error(missing(id)),
            Err(error) => Envelope::error(error.clone()),
        };
        let args = json!({"job_id": toolfleet_core::registry::truncate(id, 64)});
        self.access.audit(principal, "cancel_job", args, &envelope);
        outcome
    }

    async fn cancel_unaudited(
        &self,
        principal: &Principal,
        id: &str,
    ) -> Result<Option<JobRecord>, ToolError> {
        let Some(job) = self.read(principal, id).await? else {
            return Ok(None);
        };
        if !access::operates_job(principal, &job) {
            return Err(ToolError::new(
                ErrorCode::Forbidden,
                format!(
                    "job `{id}` is another user's; cancelling it needs scope `{FLEET_OPERATE}`"
                ),
            ));
        }
        match self
            .store
            .cancel(toolfleet_store::CancelJob {
                tenant: &principal.tenant,
                id,
                now: now_ms(),
            })
            .await
        {
            Ok(Some(job)) => {
                let event = toolfleet_fleet::job_event(&job, POLL_AFTER_S);
                let _ = self.notices.publish(&event).await;
                Ok(Some(job))
            }
            Ok(None) => Ok(None),
            Err(error) => Err(store_error(error)),
        }
    }
}

/// How long a wait whose subscription was refused waits before it reads the
/// job again.
const REFUSED_POLL: Duration = Duration::from_secs(1);

/// Which events of a job end a wait, and so which subscription it takes.
#[derive(Clone, Copy)]
enum Wakes {
    /// Its outcome: the wait takes [`Notices::subscribe_settled`].
    Settled,
    /// Any of its events: the wait hears every event.
    Any,
}

impl Wakes {
    fn by(self, event: &Event) -> bool {
        match self {
            Wakes::Settled => event.is_settled_job(),
            Wakes::Any => true,
        }
    }
}

#[derive(Deserialize)]
struct GetJobArgs {
    job_id: String,
    #[serde(default)]
    wait_s: u64,
}

#[derive(Deserialize)]
struct CancelArgs {
    job_id: String,
    dry_run: bool,
}

/// Turns an envelope from the status API into a tool result.
fn as_result(envelope: Envelope) -> Result<Value, ToolError> {
    match envelope {
        Envelope::Error { error, state: None } => Err(error),
        other => Ok(serde_json::to_value(other).unwrap_or_default()),
    }
}

/// `get_job` and `cancel_job` as tools a model calls.
pub fn status_tools(status: Status) -> Vec<ToolDecl> {
    let for_get = status.clone();
    let get = ToolDecl::query("get_job")
        .title("Get a job")
        .description("Read a job started by another tool: `running` with its state until it settles, then its result or final error. `wait_s` (0 to 30) waits for it to settle.")
        .input_schema(json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["job_id"],
            "properties": {
                "job_id": {"type": "string", "maxLength": 64},
                "wait_s": {"type": "integer", "minimum": 0, "maximum": 30}
            }
        }))
        // A wait is not work: it is counted, not timed.
        .long_poll("wait_s")
        .timeout(Duration::from_secs(35))
        .run(move |ctx: CallCtx, args: GetJobArgs| {
            let status = for_get.clone();
            async move {
                let wait = Duration::from_secs(args.wait_s.min(30));
                as_result(status.get_job(&ctx.principal, &args.job_id, wait).await)
            }
        });
    let cancel = ToolDecl::command("cancel_job")
        .title("Cancel a job")
        .description("Cancel a queued or running job. Call with dry_run=true to see the job's state, then with dry_run=false and the confirm_token.")
        .input_schema(json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["job_id", "dry_run"],
            "properties": {
                "job_id": {"type": "string", "maxLength": 64},
                "dry_run": {"type": "boolean"}
            }
        }))
        .idempotent(true)
        .run(move |ctx: CallCtx, args: CancelArgs| {
            let status = status.clone();
            async move {
                if args.dry_run {
                    return as_result(status.get_job(&ctx.principal, &args.job_id, Duration::ZERO).await)
                        .map(|job| json!({"job": job, "effect": "a queued or running job becomes cancelled; a settled one is left as it is"}));
                }
                as_result(status.cancel_job(&ctx.principal, &args.job_id).await)
            }
        });
    vec![get, cancel]
}
