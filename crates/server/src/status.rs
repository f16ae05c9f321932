//! The status API: `get_job` (with long-poll) and cancel, shared by the HTTP
//! routes and by the `get_job` and `cancel_job` tools a model calls. Another
//! tenant's job reads exactly as a missing one does.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use toolfleet_broker::{Event, Notices};
use toolfleet_core::{CallCtx, Envelope, ToolDecl, ToolError};
use toolfleet_store::{JobRecord, Store};

use crate::dispatch::{now_ms, store_error};

/// The poll hint of `running` answers from the status API.
pub const POLL_AFTER_S: u32 = 5;

fn missing(id: &str) -> ToolError {
    ToolError::not_found(format!(
        "no job `{}` for this caller; check the job_id the `running` answer gave",
        toolfleet_core::registry::truncate(id, 64)
    ))
}

/// A job id is a UUID; anything else cannot name a job.
pub(crate) fn plausible(id: &str) -> bool {
    toolfleet_mcp::jobs::plausible(id)
}

/// Reads a job, waiting up to `wait` for it to settle.
pub async fn get_job(
    store: &dyn Store,
    notices: &dyn Notices,
    tenant: &str,
    id: &str,
    wait: Duration,
) -> Envelope {
    match wait_settled(store, notices, tenant, id, wait).await {
        Ok(Some(job)) => job.envelope(POLL_AFTER_S),
        Ok(None) => Envelope::error(missing(id)),
        Err(error) => Envelope::error(error),
    }
}

/// Reads the tenant's job, waiting up to `wait` for it to settle, woken by
/// the outcomes' feed alone; the job as it then stands.
pub async fn wait_settled(
    store: &dyn Store,
    notices: &dyn Notices,
    tenant: &str,
    id: &str,
    wait: Duration,
) -> Result<Option<JobRecord>, ToolError> {
    let settled = |job: &JobRecord| job.state.is_settled();
    wait_until(store, notices, tenant, id, wait, settled, Wakes::Settled).await
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

/// Reads the tenant's job and, unless `done` holds for it already, waits up
/// to `wait` for an event of it that `wakes`, then reads it again: the one
/// long poll behind `get_job` and MCP's task waits. Subscribes before
/// reading, so a change between the two is not missed; without events (the
/// subscription ended, or could not be made) it waits out the deadline, or
/// a second when subscribing failed, and reads again, rather than spin.
async fn wait_until(
    store: &dyn Store,
    notices: &dyn Notices,
    tenant: &str,
    id: &str,
    wait: Duration,
    done: impl Fn(&JobRecord) -> bool,
    wakes: Wakes,
) -> Result<Option<JobRecord>, ToolError> {
    if !plausible(id) {
        return Ok(None);
    }
    let subscribed = match wakes {
        _ if wait.is_zero() => None,
        Wakes::Settled => Some(notices.subscribe_settled().await),
        Wakes::Any => Some(notices.subscribe().await),
    };
    let refused = subscribed.as_ref().is_some_and(Result::is_err);
    let mut events = subscribed.and_then(Result::ok);
    let current = store.job(tenant, id).await.map_err(store_error)?;
    let Some(job) = current else {
        return Ok(None);
    };
    if refused && !done(&job) {
        // Notices down: a caller that waits again at once (a task's
        // result) polls the store once a second instead of spinning.
        tokio::time::sleep(wait.min(REFUSED_POLL)).await;
        return store.job(tenant, id).await.map_err(store_error);
    }
    let Some(events) = events.as_mut().filter(|_| !done(&job)) else {
        return Ok(Some(job));
    };
    let _ = tokio::time::timeout(wait, async {
        while let Some(event) = events.next().await {
            if event.kind == "job" && event.id == id && event.tenant == tenant && wakes.by(&event) {
                return;
            }
        }
        std::future::pending::<()>().await
    })
    .await;
    store.job(tenant, id).await.map_err(store_error)
}

/// Cancels a queued or running job; answers the job as it now stands.
pub async fn cancel_job(
    store: &dyn Store,
    notices: &dyn Notices,
    tenant: &str,
    id: &str,
) -> Envelope {
    match cancel_record(store, notices, tenant, id).await {
        Ok(Some(job)) => job.envelope(POLL_AFTER_S),
        Ok(None) => Envelope::error(missing(id)),
        Err(error) => Envelope::error(error),
    }
}

/// Cancels a queued or running job and tells subscribers; the job as it
/// now stands, `None` when the tenant has no such job.
pub async fn cancel_record(
    store: &dyn Store,
    notices: &dyn Notices,
    tenant: &str,
    id: &str,
) -> Result<Option<JobRecord>, ToolError> {
    if !plausible(id) {
        return Ok(None);
    }
    match store.cancel(tenant, id, now_ms()).await {
        Ok(Some(job)) => {
            let event = crate::dispatch::job_event(&job);
            let _ = notices.publish(&event).await;
            Ok(Some(job))
        }
        Ok(None) => Ok(None),
        Err(error) => Err(store_error(error)),
    }
}

/// Waits up to `wait` for any news of the tenant's job after `since` (its
/// `updated_at`), or for it to settle; the job as it then stands.
pub async fn wait_change(
    store: &dyn Store,
    notices: &dyn Notices,
    tenant: &str,
    id: &str,
    since: i64,
    wait: Duration,
) -> Result<Option<JobRecord>, ToolError> {
    let changed = |job: &JobRecord| job.updated_at != since || job.state.is_settled();
    wait_until(store, notices, tenant, id, wait, changed, Wakes::Any).await
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
pub fn status_tools(store: Arc<dyn Store>, notices: Arc<dyn Notices>) -> Vec<ToolDecl> {
    let (s, n) = (store.clone(), notices.clone());
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
            let (store, notices) = (s.clone(), n.clone());
            async move {
                let wait = Duration::from_secs(args.wait_s.min(30));
                as_result(get_job(store.as_ref(), notices.as_ref(), ctx.tenant(), &args.job_id, wait).await)
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
            let (store, notices) = (store.clone(), notices.clone());
            async move {
                if args.dry_run {
                    return as_result(get_job(store.as_ref(), notices.as_ref(), ctx.tenant(), &args.job_id, Duration::ZERO).await)
                        .map(|job| json!({"job": job, "effect": "a queued or running job becomes cancelled; a settled one is left as it is"}));
                }
                as_result(cancel_job(store.as_ref(), notices.as_ref(), ctx.tenant(), &args.job_id).await)
            }
        });
    vec![get, cancel]
}
