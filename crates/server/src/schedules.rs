//! `[[schedules]]` over HTTP: `GET /v1/schedules` lists them with their
//! next ticks and last jobs; `POST /v1/schedules/{name}/pause` and
//! `/resume` stop and restart their ticks for every dispatcher of the
//! fleet (the store keeps whether a schedule is paused). A schedule belongs
//! to the tenant its principal names: it is seen and paused by its own
//! user and by the tenant's holders of `fleet:operate`, and is missing to
//! everyone else. Pauses and resumes are audited with who asked.

use std::collections::HashMap;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use toolfleet_core::{Envelope, Json, Principal, ToolError, iso8601, now_ms};
use toolfleet_fleet::schedules::{CatchUp, Overlap, Schedule};
use toolfleet_fleet::store_error;
use toolfleet_store::ScheduleRecord;

use crate::AppState;
use crate::routes::{Caller, Id, reply};

/// How many next ticks a schedule's listing shows.
const NEXT_TICKS: usize = 3;

/// True when `principal` may see and pause `schedule`.
fn controls(principal: &Principal, schedule: &Schedule) -> bool {
    let runs_as = &schedule.principal;
    runs_as.tenant == principal.tenant
        && (runs_as.user == principal.user || principal.operates_fleet())
}

/// `GET /v1/schedules`.
pub(crate) async fn list(State(state): State<AppState>, Caller(principal): Caller) -> Response {
    let records = match state.store.schedules().await {
        Ok(records) => records,
        Err(error) => return reply(&Envelope::error(store_error(error))),
    };
    let records: HashMap<&str, &ScheduleRecord> =
        records.iter().map(|r| (r.name.as_str(), r)).collect();
    let mut shown = Vec::new();
    for schedule in state.schedules.iter().filter(|s| controls(&principal, s)) {
        let record = records.get(schedule.name()).copied();
        shown.push(view(&state, schedule, record).await);
    }
    axum::Json(json!({ "schedules": shown })).into_response()
}

/// `POST /v1/schedules/{name}/pause`.
pub(crate) async fn pause(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(name): Id,
) -> Response {
    set_paused(&state, &principal, &name, true).await
}

/// `POST /v1/schedules/{name}/resume`.
pub(crate) async fn resume(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(name): Id,
) -> Response {
    set_paused(&state, &principal, &name, false).await
}

async fn set_paused(state: &AppState, principal: &Principal, name: &str, paused: bool) -> Response {
    let shown = toolfleet_core::registry::truncate(name, 64);
    let schedule = state
        .schedules
        .iter()
        .find(|s| s.name() == name && controls(principal, s));
    let outcome = match schedule {
        None => Err(ToolError::not_found(format!(
            "no schedule `{shown}` for this caller; GET /v1/schedules lists yours"
        ))),
        Some(schedule) => state
            .store
            .pause_schedule(name, paused, now_ms())
            .await
            .map(|record| (schedule, record))
            .map_err(store_error),
    };
    let action = if paused {
        "pause_schedule"
    } else {
        "resume_schedule"
    };
    let audited = match &outcome {
        Ok(_) => Envelope::ok(Json::from(json!({"paused": paused})), ""),
        Err(error) => Envelope::error(error.clone()),
    };
    state
        .access
        .audit(principal, action, json!({"schedule": shown}), &audited);
    match outcome {
        Ok((schedule, record)) => {
            axum::Json(view(state, schedule, Some(&record)).await).into_response()
        }
        Err(error) => reply(&Envelope::error(error)),
    }
}

/// A schedule as the API shows it: as configured, where its ticks are,
/// and its last job's state.
async fn view(state: &AppState, schedule: &Schedule, record: Option<&ScheduleRecord>) -> Value {
    let now = now_ms();
    let spec = &schedule.spec;
    let paused = record.is_some_and(|r| r.paused);
    // The next ticks from where the schedule stands: after its last tick,
    // or after now when that is further on.
    let from = record.map_or(now, |r| r.last_tick.max(now));
    let next_ticks: Vec<String> = if paused {
        Vec::new()
    } else {
        schedule
            .upcoming(from, NEXT_TICKS)
            .into_iter()
            .map(iso8601)
            .collect()
    };
    let last_job = match record.and_then(|r| r.last_job.as_deref()) {
        Some(id) => match state.store.job(&schedule.principal.tenant, id).await {
            Ok(Some(job)) => json!({"job_id": job.id, "state": job.state.shown()}),
            // Deleted by retention, or the store did not answer.
            Ok(None) | Err(_) => json!({"job_id": id, "state": Value::Null}),
        },
        None => Value::Null,
    };
    json!({
        "name": spec.name,
        "cron": spec.cron,
        "timezone": spec.timezone,
        "tool": spec.tool,
        "overlap": match spec.overlap { Overlap::Skip => "skip", Overlap::Allow => "allow" },
        "catch_up": match spec.catch_up { CatchUp::Last => "last", CatchUp::None => "none" },
        "paused": paused,
        "next_ticks": next_ticks,
        "last_tick": record.map(|r| iso8601(r.last_tick)),
        "last_job": last_job,
    })
}
