//! Putting failed and cancelled jobs back: `POST /v1/jobs/{id}/retry` for
//! one, `POST /v1/jobs/retry` for those a filter names. A job put back is
//! the same job (its id, tool, arguments and caller), queued again with its
//! attempts counted anew ([`toolfleet_core::lifecycle::Transition::Requeue`]),
//! published to its pool and announced. Who may: the job's owner, and
//! holders of `fleet:operate` for any of the tenant's; every retry is
//! audited with who asked.

use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use toolfleet_core::{
    Envelope, ErrorCode, FLEET_OPERATE, JobState, Json, Principal, ToolError, now_ms,
};
use toolfleet_fleet::{job_event, store_error};
use toolfleet_store::{JobRecord, Requeue, RequeueMany};

use crate::AppState;
use crate::access;
use crate::routes::{Caller, Id, bad_request, field_error, read_json, reply, reply_error};
use crate::status::POLL_AFTER_S;

/// The most jobs one `POST /v1/jobs/retry` puts back.
pub(crate) const MAX_RETRY: u32 = 1_000;

/// The states a retry puts back.
const RETRIED: [JobState; 2] = [JobState::Failed, JobState::Cancelled];

/// `POST /v1/jobs/{id}/retry`.
pub(crate) async fn retry_one(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(id): Id,
) -> Response {
    let outcome = retry_job(&state, &principal, &id).await;
    let envelope = match &outcome {
        Ok(job) => state.status().answer(&principal, job),
        Err(error) => Envelope::error(error.clone()),
    };
    let audited = match &outcome {
        Ok(job) => Envelope::ok(Json::from(json!({"state": job.state.shown()})), ""),
        Err(error) => Envelope::error(error.clone()),
    };
    let args = json!({"job_id": toolfleet_core::registry::truncate(&id, 64)});
    state.access.audit(&principal, "retry_job", args, &audited);
    reply(&envelope)
}

/// Puts back `principal`'s job `id`: the job as it now stands, queued, or
/// why not, as a model or a person can act on it.
async fn retry_job(
    state: &AppState,
    principal: &Principal,
    id: &str,
) -> Result<JobRecord, ToolError> {
    let Some(job) = state.status().read(principal, id).await? else {
        return Err(crate::status::missing(id));
    };
    let shown = toolfleet_core::registry::truncate(id, 64);
    if !access::operates_job(principal, &job) {
        return Err(ToolError::new(
            ErrorCode::Forbidden,
            format!("job `{shown}` is another user's; retrying it needs scope `{FLEET_OPERATE}`"),
        ));
    }
    let requeue = Requeue {
        tenant: &principal.tenant,
        id,
        now: now_ms(),
    };
    match state.store.requeue(requeue).await.map_err(store_error)? {
        Some(job) => {
            published(state, &job).await;
            Ok(job)
        }
        None => Err(not_retried(&shown, job.state)),
    }
}

/// Why a job in `state` is not put back.
fn not_retried(id: &str, state: JobState) -> ToolError {
    let why = match state {
        JobState::Succeeded => {
            "a job that succeeded is not run again: call the tool again for new work".to_owned()
        }
        other => format!(
            "it is {} and has not settled: only a failed or cancelled job can be retried; cancel it first, or wait for it to settle",
            other.shown()
        ),
    };
    ToolError::new(
        ErrorCode::Conflict,
        format!("job `{id}` was not retried: {why}"),
    )
}

/// Publishes a job put back to its pool and announces it, queued. A
/// refused publish is left to the sweeper, which finds the queued job.
async fn published(state: &AppState, job: &JobRecord) {
    if let Err(error) = state
        .broker
        .publish_traced(&job.pool, &job.id, job.trace.as_ref())
        .await
    {
        tracing::warn!(job_id = %job.id, %error, "a retried job's publish failed; left to the sweeper");
    }
    let _ = state.notices.publish(&job_event(job, POLL_AFTER_S)).await;
}

/// The body of `POST /v1/jobs/retry`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RetryFilter {
    tool: Option<String>,
    state: Option<String>,
    error_code: Option<String>,
    since: Option<i64>,
    until: Option<i64>,
    limit: Option<u32>,
}

/// `POST /v1/jobs/retry`: puts back, oldest settled first, the failed or
/// cancelled jobs the filter names (the caller's own, or every user's of
/// the tenant for `fleet:operate`), and says how many.
pub(crate) async fn retry_many(
    State(state): State<AppState>,
    Caller(principal): Caller,
    body: Body,
) -> Response {
    let filter: RetryFilter = match read_json(&state, body).await {
        Ok(filter) => filter,
        Err(refusal) => return refusal.into_response(),
    };
    let states: Vec<JobState> = match filter.state.as_deref() {
        None => RETRIED.to_vec(),
        Some(name) => match JobState::parse_shown(name).filter(|s| RETRIED.contains(s)) {
            Some(one) => vec![one],
            None => {
                return bad_request(format!(
                    "`state` `{}` cannot be retried: give `failed` or `cancelled`, or leave it out for both",
                    toolfleet_core::registry::truncate(name, 32)
                ));
            }
        },
    };
    let limit = filter.limit.unwrap_or(100);
    if !(1..=MAX_RETRY).contains(&limit) {
        return bad_request(format!("`limit` must be 1 to {MAX_RETRY}: got {limit}"));
    }
    let (since, until) = (filter.since.unwrap_or(0), filter.until.unwrap_or(i64::MAX));
    if since >= until {
        return bad_request(format!(
            "`since` ({since}) must be before `until` ({until}), both Unix milliseconds"
        ));
    }
    let fields = [
        ("tool", filter.tool.as_deref(), 128),
        ("error_code", filter.error_code.as_deref(), 64),
    ];
    if let Some(error) = field_error(&fields) {
        return reply_error(StatusCode::BAD_REQUEST, error);
    }
    let user = (!principal.operates_fleet()).then(|| principal.user.clone());
    let many = RequeueMany {
        tenant: &principal.tenant,
        user: user.as_deref(),
        tool: filter.tool.as_deref(),
        states: &states,
        error_code: filter.error_code.as_deref(),
        since,
        until,
        limit,
        now: now_ms(),
    };
    let outcome = state.store.requeue_many(many).await.map_err(store_error);
    let audited = match &outcome {
        Ok(jobs) => Envelope::ok(Json::from(json!({"retried": jobs.len()})), ""),
        Err(error) => Envelope::error(error.clone()),
    };
    let args = json!({
        "tool": filter.tool, "state": filter.state, "error_code": filter.error_code,
        "since": filter.since, "until": filter.until, "limit": limit,
    });
    state.access.audit(&principal, "retry_jobs", args, &audited);
    match outcome {
        Ok(jobs) => {
            futures_util::future::join_all(jobs.iter().map(|job| published(&state, job))).await;
            let ids: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
            axum::Json(json!({"retried": ids.len(), "job_ids": ids})).into_response()
        }
        Err(error) => reply(&Envelope::error(error)),
    }
}
