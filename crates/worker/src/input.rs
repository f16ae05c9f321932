//! A job tool declared `asks_client` that asks while its job runs: a result
//! `{"input_requests": {key: {"method", "params"}}, "request_state"?}` does
//! not settle the job. The worker opens an input ticket holding the
//! requests, saves on the job which ticket it asked and the tool's state
//! (kept in the store, never handed to the client), and parks the job on
//! the ticket. Its MCP task is then `input_required`; `tasks/update`
//! records answers on the ticket, and the last one wakes the job. The next
//! attempt runs the tool again with its arguments plus `input_responses`
//! (every answer by key), `request_state` and `client_capabilities`, as the
//! inline path of an `asks_client` query does, over as many rounds as it
//! asks, up to [`toolfleet_core::MAX_ASKING_ROUNDS`].
//!
//! What the tool asks is bounded ([`MAX_REQUESTS`], [`MAX_KEY`]) and must be
//! requests a client answers; anything else fails the job, for good.

use serde_json::{Map, Value, json};
use toolfleet_core::{AnsweredBy, ErrorCode, Runtime, Shape, ToolError, new_id};
use toolfleet_fleet::tickets::{input_request_state, input_ticket_of};
use toolfleet_store::{JobRecord, NewTicket, Store, TicketKind};

/// Requests one round may ask, at most.
pub(crate) const MAX_REQUESTS: usize = 16;
/// The longest key of a request, in bytes.
pub(crate) const MAX_KEY: usize = 128;

/// The methods a client answers.
const METHODS: [&str; 3] = ["elicitation/create", "sampling/createMessage", "roots/list"];

/// Whether `tool` is a job tool that may ask its client while it runs.
pub(crate) fn asks(runtime: &Runtime, tool: &str) -> bool {
    runtime
        .registry()
        .get(tool)
        .is_some_and(|t| t.shape() == Shape::Job && t.declaration().asks_client)
}

/// Why `requests` cannot be put to a client, if they cannot.
pub(crate) fn check(requests: &Map<String, Value>) -> Result<(), ToolError> {
    let refuse = |why: String| Err(ToolError::failed(why, false));
    if requests.len() > MAX_REQUESTS {
        return refuse(format!(
            "the tool asked {} requests at once; at most {MAX_REQUESTS}",
            requests.len()
        ));
    }
    for (key, request) in requests {
        if key.is_empty() || key.len() > MAX_KEY {
            return refuse(format!(
                "the tool asked under a key of {} bytes; keys have 1 to {MAX_KEY}",
                key.len()
            ));
        }
        let method = request.get("method").and_then(Value::as_str).unwrap_or("");
        if !METHODS.contains(&method) || !request.get("params").is_some_and(Value::is_object) {
            return refuse(format!(
                "the tool's request `{}` is not one a client answers ({} with `params`)",
                toolfleet_core::registry::truncate(key, 64),
                METHODS.join(", ")
            ));
        }
    }
    Ok(())
}

/// How long an input ticket waits for its client's answers unless the
/// tool declares `expires_in_s`.
pub(crate) const INPUT_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The open input ticket of `job`, asking `requests` of its caller's
/// client, expiring after `ttl` (the job then fails: see [`arguments`]).
pub(crate) fn ticket(
    job: &JobRecord,
    requests: Map<String, Value>,
    now: i64,
    ttl: std::time::Duration,
) -> NewTicket {
    let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    let keys: Vec<&str> = requests.keys().map(String::as_str).collect();
    NewTicket {
        id: format!("t_{}", new_id()),
        tenant: job.tenant.clone(),
        user: job.user.clone(),
        tool: job.tool.clone(),
        question: format!(
            "`{}` (job {}) asks its caller's MCP client for: {}; answered by tasks/update of task {}",
            job.tool,
            job.id,
            keys.join(", "),
            job.id
        ),
        options: Vec::new(),
        args: job.args.clone(),
        run_id: job.run_id.clone(),
        call_id: job.call_id.clone(),
        // Its answer is the task's business: no webhook of its own.
        callback_url: None,
        answered_by: AnsweredBy::Caller,
        kind: TicketKind::Input,
        plan: None,
        scopes: job.scopes.clone(),
        expires_at: Some(now.saturating_add(ttl_ms)),
        input_requests: Some(Value::Object(requests)),
        now,
    }
}

/// The arguments the tool of `job` runs with: as called, without what the
/// server alone gives under the names of [`toolfleet_core::CLIENT_INPUT`]
/// but `client_capabilities` (which only the MCP server records at the
/// call), plus, once the input ticket its checkpoint names is answered,
/// `input_responses` (every answer by key), `request_state` (as the tool
/// gave it, kept here) and `client_capabilities` (`{}` when none came).
///
/// A ticket that expired unanswered fails the job (`timeout`): its client
/// never answered.
pub(crate) async fn arguments(store: &dyn Store, job: &JobRecord) -> Result<Value, ToolError> {
    let Value::Object(mut args) = job.args.clone() else {
        return Ok(job.args.clone());
    };
    // Never a caller's: the answers and the state come from the store.
    args.remove("input_responses");
    args.remove("request_state");
    let saved = match store.checkpoint(&job.id).await {
        Ok(saved) => saved,
        Err(error) => {
            tracing::warn!(%error, "reading what the job asked failed; running it as called");
            return Ok(Value::Object(args));
        }
    };
    let Some(id) = input_ticket_of(saved.as_ref()) else {
        return Ok(Value::Object(args));
    };
    let answer = match store.ticket(&job.tenant, id).await {
        Ok(Some(ticket)) if ticket.kind == TicketKind::Input => {
            if ticket.answer.is_none() && ticket.expired_at.is_some() {
                return Err(ToolError::new(
                    ErrorCode::Timeout,
                    format!(
                        "`{}` asked its MCP client for input (ticket {id}), which was not answered before it expired",
                        job.tool
                    ),
                ));
            }
            ticket.answer
        }
        _ => None,
    };
    let Some(answer) = answer else {
        return Ok(Value::Object(args));
    };
    args.insert("input_responses".into(), answer);
    if let Some(state) = input_request_state(saved.as_ref()) {
        args.insert("request_state".into(), state);
    }
    args.entry("client_capabilities")
        .or_insert_with(|| json!({}));
    Ok(Value::Object(args))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_requests_a_client_answers_within_bounds_pass() {
        let good = json!({"a": {"method": "elicitation/create", "params": {"message": "?"}}});
        assert!(check(good.as_object().expect("object")).is_ok());
        for bad in [
            json!({"a": {"method": "tools/call", "params": {}}}),
            json!({"a": {"method": "roots/list"}}),
            json!({"a": "elicitation/create"}),
            json!({"": {"method": "roots/list", "params": {}}}),
            json!({"k".repeat(MAX_KEY + 1): {"method": "roots/list", "params": {}}}),
        ] {
            let error = check(bad.as_object().expect("object")).expect_err("refused");
            assert!(!error.retryable, "{bad}");
        }
        let many: Map<String, Value> = (0..=MAX_REQUESTS)
            .map(|n| {
                (
                    format!("k{n}"),
                    json!({"method": "roots/list", "params": {}}),
                )
            })
            .collect();
        assert!(check(&many).is_err());
    }
}
