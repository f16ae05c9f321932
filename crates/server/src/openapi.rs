//! The OpenAPI 3.1 document of the HTTP API, served at `GET
//! /v1/openapi.json`. [`ROUTES`] is the one table of the API's routes: the
//! router mounts exactly these (each [`Op`] to its handler, in
//! `routes.rs`), and the document describes exactly these, so neither can
//! name a route the other lacks. Each operation's parameters, bodies and
//! answers are written here beside the codes, states and bounds the
//! handlers use (`ErrorCode::ALL`, `JobState::SHOWN`, the batch and wait
//! bounds, the process's own limits).

use serde_json::{Map, Value, json};
use toolfleet_broker::EventState;
use toolfleet_core::adapters::Format;
use toolfleet_core::{ErrorCode, JobState, PRIORITIES};
use toolfleet_store::RunState;

use crate::Limits;

/// The HTTP method a route answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    Get,
    Post,
    /// Every method, the handler choosing (`/mcp`); the document shows POST.
    Any,
}

impl Verb {
    /// The method's key in a path item of the document.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::Post | Verb::Any => "post",
        }
    }
}

/// Every operation of the API: the router maps each to its handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    ListTools,
    Call,
    ListJobs,
    GetJob,
    GetJobRecord,
    CancelJob,
    RetryJob,
    RetryJobs,
    GetQueues,
    ListSchedules,
    PauseSchedule,
    ResumeSchedule,
    ListTickets,
    GetTicket,
    AnswerTicket,
    ApproveTicket,
    RejectTicket,
    StartRun,
    ListRuns,
    GetRun,
    MessageRun,
    WaitRun,
    AnswerRun,
    CancelRun,
    RunEvents,
    Events,
    Mcp,
    McpMetadata,
    McpMetadataOfMcp,
    OpenApi,
    Health,
    Ready,
    Metrics,
}

/// One route: where, which method, what it does.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Route {
    pub path: &'static str,
    pub verb: Verb,
    pub op: Op,
}

const fn route(verb: Verb, path: &'static str, op: Op) -> Route {
    Route { path, verb, op }
}

impl Route {
    /// The method as the contract writes it.
    #[cfg(test)]
    fn verb_name(&self) -> &'static str {
        match self.verb {
            Verb::Get => "GET",
            Verb::Post => "POST",
            Verb::Any => "ANY",
        }
    }
}

/// The routes of the API, as the router mounts them and the document
/// describes them. `Op::Metrics` is mounted only where the process serves
/// `/metrics` beside the API (no `metrics_listen`).
pub(crate) const ROUTES: [Route; 33] = [
    route(Verb::Get, "/v1/tools", Op::ListTools),
    route(Verb::Post, "/v1/calls", Op::Call),
    route(Verb::Get, "/v1/jobs", Op::ListJobs),
    route(Verb::Get, "/v1/jobs/{job_id}", Op::GetJob),
    route(Verb::Get, "/v1/jobs/{job_id}/record", Op::GetJobRecord),
    route(Verb::Post, "/v1/jobs/{job_id}/cancel", Op::CancelJob),
    route(Verb::Post, "/v1/jobs/{job_id}/retry", Op::RetryJob),
    route(Verb::Post, "/v1/jobs/retry", Op::RetryJobs),
    route(Verb::Get, "/v1/queues", Op::GetQueues),
    route(Verb::Get, "/v1/schedules", Op::ListSchedules),
    route(Verb::Post, "/v1/schedules/{name}/pause", Op::PauseSchedule),
    route(
        Verb::Post,
        "/v1/schedules/{name}/resume",
        Op::ResumeSchedule,
    ),
    route(Verb::Get, "/v1/tickets", Op::ListTickets),
    route(Verb::Get, "/v1/tickets/{ticket}", Op::GetTicket),
    route(Verb::Post, "/v1/tickets/{ticket}/answer", Op::AnswerTicket),
    route(
        Verb::Post,
        "/v1/tickets/{ticket}/approve",
        Op::ApproveTicket,
    ),
    route(Verb::Post, "/v1/tickets/{ticket}/reject", Op::RejectTicket),
    route(Verb::Post, "/v1/runs", Op::StartRun),
    route(Verb::Get, "/v1/runs", Op::ListRuns),
    route(Verb::Get, "/v1/runs/{run}", Op::GetRun),
    route(Verb::Post, "/v1/runs/{run}/messages", Op::MessageRun),
    route(Verb::Post, "/v1/runs/{run}/wait", Op::WaitRun),
    route(Verb::Post, "/v1/runs/{run}/answer", Op::AnswerRun),
    route(Verb::Post, "/v1/runs/{run}/cancel", Op::CancelRun),
    route(Verb::Get, "/v1/runs/{run}/events", Op::RunEvents),
    route(Verb::Get, "/v1/events", Op::Events),
    route(Verb::Any, "/mcp", Op::Mcp),
    route(
        Verb::Get,
        "/.well-known/oauth-protected-resource",
        Op::McpMetadata,
    ),
    route(
        Verb::Get,
        "/.well-known/oauth-protected-resource/mcp",
        Op::McpMetadataOfMcp,
    ),
    route(Verb::Get, "/v1/openapi.json", Op::OpenApi),
    route(Verb::Get, "/healthz", Op::Health),
    route(Verb::Get, "/readyz", Op::Ready),
    route(Verb::Get, "/metrics", Op::Metrics),
];

/// The version of the document's format.
pub const OPENAPI_VERSION: &str = "3.1.0";

/// The document of the API of a process with `limits`, which serves
/// `/metrics` beside the API when `metrics_on_api`.
pub fn document(limits: &Limits, metrics_on_api: bool) -> Value {
    let mut paths = Map::new();
    for route in ROUTES {
        if route.op == Op::Metrics && !metrics_on_api {
            continue;
        }
        let item = paths
            .entry(route.path.to_owned())
            .or_insert_with(|| json!({}));
        let mut operation = operation(route.op, limits);
        // A path whose id does not decode is refused before the handler.
        if route.path.contains('{') && operation["responses"]["400"].is_null() {
            operation["responses"]["400"] = answer("BadRequest");
        }
        item[route.verb.key()] = operation;
    }
    json!({
        "openapi": OPENAPI_VERSION,
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
        "info": {
            "title": "toolfleet",
            "version": env!("CARGO_PKG_VERSION"),
            "summary": "A runtime for LLM tools: calls, jobs, people's answers and runs over HTTP.",
            "description": "The HTTP contract of docs/API.md. Tool-level outcomes, errors included, answer HTTP 200 with the result envelope; `unavailable` answers 503 with `Retry-After`, and transport failures (400, 401, 408, 413, 429) carry the same error envelope as their body. A known route called with another method answers 405; any other path answers 404 with a `not_found` envelope. Names on the wire are never renamed; fields may be added.",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "servers": [{"url": "/", "description": "this server"}],
        "security": [{"bearer": []}],
        "tags": [
            {"name": "tools", "description": "Tool specs and calls."},
            {"name": "jobs", "description": "The status API of jobs: read, cancel, retry, list."},
            {"name": "schedules", "description": "`[[schedules]]` as they stand; pause and resume."},
            {"name": "tickets", "description": "People's questions and approvals."},
            {"name": "runs", "description": "Conversations the runtime keeps."},
            {"name": "events", "description": "Server-Sent Events."},
            {"name": "mcp", "description": "MCP over Streamable HTTP."},
            {"name": "operations", "description": "Health, readiness, metrics and this document."},
        ],
        "paths": paths,
        "components": components(limits),
    })
}

/// A `$ref` to the schema `name` of the components.
fn schema(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

/// A `$ref` to the answer `name` of the components.
fn answer(name: &str) -> Value {
    json!({"$ref": format!("#/components/responses/{name}")})
}

/// A JSON answer of `body`, with `examples` (name, value) when given.
fn json_answer(description: &str, body: Value, examples: &[(&str, Value)]) -> Value {
    let mut media = json!({"schema": body});
    if !examples.is_empty() {
        let named: Map<String, Value> = examples
            .iter()
            .map(|(name, value)| ((*name).to_owned(), json!({"value": value})))
            .collect();
        media["examples"] = Value::Object(named);
    }
    json!({"description": description, "content": {"application/json": media}})
}

/// The 200 of an envelope route: `ok` with a result of `result`, else an
/// error envelope (any code but `unavailable`, which is 503).
fn ok_or_error(description: &str, result: Value, example: Value) -> Value {
    json_answer(
        description,
        json!({"oneOf": [ok_of(result), schema("ErrorEnvelope")]}),
        &[("ok", example)],
    )
}

/// An `ok` envelope whose `result` is `result`.
fn ok_of(result: Value) -> Value {
    json!({
        "type": "object",
        "required": ["status", "result", "call_id"],
        "properties": {
            "status": {"const": "ok"},
            "result": result,
            "call_id": {"type": "string"},
        },
    })
}

/// A parameter `name` in `place` (`path`, `query`) of `body`.
fn param(place: &str, name: &str, description: &str, body: Value) -> Value {
    json!({
        "name": name,
        "in": place,
        "required": place == "path",
        "description": description,
        "schema": body,
    })
}

/// A JSON request body of `body`, required, with its `examples`.
fn request(body: Value, examples: &[(&str, Value)]) -> Value {
    let named: Map<String, Value> = examples
        .iter()
        .map(|(name, value)| ((*name).to_owned(), json!({"value": value})))
        .collect();
    let mut media = json!({"schema": body});
    if !named.is_empty() {
        media["examples"] = Value::Object(named);
    }
    json!({"required": true, "content": {"application/json": media}})
}

/// The answers of an authenticated route: `own` and 401, 503.
fn authed(own: Vec<(&str, Value)>) -> Map<String, Value> {
    let mut answers: Map<String, Value> = own
        .into_iter()
        .map(|(status, body)| (status.to_owned(), body))
        .collect();
    answers.insert("401".into(), answer("Unauthenticated"));
    answers.insert("503".into(), answer("Unavailable"));
    answers
}

/// The answers of a route that reads a JSON body: `own`, 400, 401, 408,
/// 413, 503.
fn with_body(own: Vec<(&str, Value)>) -> Map<String, Value> {
    let mut answers = authed(own);
    answers.entry("400").or_insert_with(|| answer("BadRequest"));
    answers.insert("408".into(), answer("BodyTimeout"));
    answers.insert("413".into(), answer("PayloadTooLarge"));
    answers
}

/// The answers of a route with query parameters: `own`, 400, 401, 503.
fn with_query(own: Vec<(&str, Value)>) -> Map<String, Value> {
    let mut answers = authed(own);
    answers.entry("400").or_insert_with(|| answer("BadRequest"));
    answers
}

/// What one operation is: its id, tag, text, parameters, body and answers.
struct Spec {
    id: &'static str,
    tag: &'static str,
    summary: &'static str,
    description: String,
    params: Vec<Value>,
    body: Option<Value>,
    answers: Map<String, Value>,
    public: bool,
}

impl Spec {
    fn new(id: &'static str, tag: &'static str, summary: &'static str) -> Spec {
        Spec {
            id,
            tag,
            summary,
            description: String::new(),
            params: Vec::new(),
            body: None,
            answers: Map::new(),
            public: false,
        }
    }

    fn describe(mut self, text: impl Into<String>) -> Spec {
        self.description = text.into();
        self
    }

    fn param(mut self, param: Value) -> Spec {
        self.params.push(param);
        self
    }

    fn body(mut self, body: Value) -> Spec {
        self.body = Some(body);
        self
    }

    fn answers(mut self, answers: Map<String, Value>) -> Spec {
        self.answers = answers;
        self
    }

    fn public(mut self) -> Spec {
        self.public = true;
        self
    }

    fn into_value(self) -> Value {
        let mut op = json!({
            "operationId": self.id,
            "tags": [self.tag],
            "summary": self.summary,
            "responses": self.answers,
        });
        if !self.description.is_empty() {
            op["description"] = json!(self.description);
        }
        if !self.params.is_empty() {
            op["parameters"] = json!(self.params);
        }
        if let Some(body) = self.body {
            op["requestBody"] = body;
        }
        if self.public {
            op["security"] = json!([]);
        }
        op
    }
}

fn job_id_param() -> Value {
    param(
        "path",
        "job_id",
        "The job's id (a UUID). Another tenant's or user's job, or an id that is not a UUID, reads as missing.",
        json!({"type": "string"}),
    )
}

fn ticket_param() -> Value {
    param(
        "path",
        "ticket",
        "The ticket's id (`t_` and 32 hex digits).",
        json!({"type": "string"}),
    )
}

fn run_param() -> Value {
    param(
        "path",
        "run",
        "The run's id (`run_` and 32 hex digits).",
        json!({"type": "string"}),
    )
}

fn schedule_param() -> Value {
    param(
        "path",
        "name",
        "The schedule's name, as `[[schedules]]` gives it.",
        json!({"type": "string"}),
    )
}

fn names<T: Copy>(all: &[T], name: impl Fn(T) -> &'static str) -> Vec<&'static str> {
    all.iter().map(|v| name(*v)).collect()
}

/// The operation object of `op`.
fn operation(op: Op, limits: &Limits) -> Value {
    let job_states = names(&JobState::SHOWN, JobState::as_str);
    let run_states = names(&RunState::ALL, RunState::as_str);
    let max_wait = limits.max_wait_s;
    let spec = match op {
        Op::ListTools => Spec::new("listTools", "tools", "The tool specs the caller may call")
            .describe("A JSON array of the specs whose required scopes the caller holds, in the form of `format` (`gemini`: one object with `functionDeclarations`). Besides the configured tools every runtime registers `get_job`, `cancel_job` and `read_handle`.")
            .param(param(
                "query",
                "format",
                "The provider form of the specs (default `neutral`).",
                json!({"type": "string", "enum": names(&Format::ALL, Format::as_str), "default": "neutral"}),
            ))
            .answers(with_query(vec![(
                "200",
                json_answer(
                    "The specs.",
                    json!({"type": "array", "items": {"type": "object"}}),
                    &[("gemini", json!([{"functionDeclarations": [{"name": "find_expenses", "description": "Finds the expenses of a month.", "parameters": {"type": "object"}}]}])), ("neutral", json!([{
                        "name": "find_expenses", "description": "Finds the expenses of a month.",
                        "shape": "query", "input_schema": {"type": "object"},
                        "hints": {"read_only": true, "destructive": false, "idempotent": true, "open_world": false},
                        "scopes": ["expenses:read"],
                    }]))],
                ),
            )])),
        Op::Call => Spec::new("callTools", "tools", "Call a tool, or many")
            .describe(format!("One call answers the tool's envelope: `ok` or `error` for query, handle and command tools (run inline), `running` at once for job and agent tools, `suspended` for human tools. `{{\"calls\": [...]}}` (1 to {} calls) makes every call at once and answers `{{\"results\": [...]}}`, one envelope per call, in order; a field of one call out of its bounds is that call's `bad_request` envelope. A valid W3C `traceparent` header is continued; a single call's answer carries its own `traceparent`.", crate::routes::MAX_BATCH))
            .param(param(
                "header",
                "traceparent",
                "A W3C trace context to continue (version `00`); an invalid one is ignored.",
                json!({"type": "string"}),
            ))
            .body(request(
                json!({"oneOf": [schema("CallRequest"), schema("BatchRequest")]}),
                &[
                    ("query", json!({"tool": "find_expenses", "args": {"month": "2026-09"}})),
                    ("job", json!({"tool": "start_receipt_ocr", "args": {"receipt_id": "r-1"}, "idempotency_key": "ocr-r-1", "delay_s": 60})),
                    ("batch", json!({"calls": [{"tool": "find_expenses", "args": {"month": "2026-09"}}, {"tool": "find_expenses", "args": {"month": "2026-10"}}]})),
                ],
            ))
            .answers(with_body(vec![(
                "200",
                json!({
                    "description": "The call's envelope, or the batch's envelopes.",
                    "headers": {"traceparent": {"description": "The call's place in its trace (a single call).", "schema": {"type": "string"}}},
                    "content": {"application/json": {
                        "schema": {"oneOf": [schema("Envelope"), schema("BatchResults")]},
                        "examples": {
                            "ok": {"value": {"status": "ok", "result": {"expenses": []}, "call_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e"}},
                            "running": {"value": {"status": "running", "job_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "poll_after_s": 5}},
                            "suspended": {"value": {"status": "suspended", "ticket": "t_0190f5c27d3e7b2a9c1e2f4a5b6c7d8e", "question": "Travel or meals?", "options": ["travel", "meals"]}},
                            "unknown_tool": {"value": {"status": "error", "error": {"code": "unknown_tool", "message": "no tool `find_expense`; did you mean find_expenses?", "retryable": false, "details": {"suggestions": ["find_expenses"]}}}},
                            "batch": {"value": {"results": [{"status": "ok", "result": {}, "call_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e"}]}},
                        },
                    }},
                }),
            )])),
        Op::ListJobs => Spec::new("listJobs", "jobs", "List jobs, newest first")
            .describe("The caller's jobs (every user's of the tenant for `fleet:read` or `fleet:operate`). Not an envelope; a store that refuses answers its error envelope (503 when unavailable).")
            .param(param("query", "state", "Only jobs in this state (`retrying` finds parked ones too).", json!({"type": "string", "enum": job_states})))
            .param(param("query", "tool", "Only this tool's jobs.", json!({"type": "string", "maxLength": 128})))
            .param(param("query", "since", "Made at or after (Unix milliseconds); before `until`.", json!({"type": "integer", "minimum": 0, "format": "int64"})))
            .param(param("query", "until", "Made before (Unix milliseconds).", json!({"type": "integer", "minimum": 0, "format": "int64"})))
            .param(param("query", "limit", "Jobs per page (default 20).", json!({"type": "integer", "minimum": 1, "maximum": 100, "default": 20})))
            .param(param("query", "cursor", "The `next_cursor` of the previous page.", json!({"type": "string", "maxLength": 64})))
            .answers(with_query(vec![(
                "200",
                json_answer(
                    "A page of jobs.",
                    json!({"oneOf": [schema("JobPage"), schema("ErrorEnvelope")]}),
                    &[("page", json!({"jobs": [{"job_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "tool": "start_receipt_ocr", "state": "succeeded", "attempts": 1, "run_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8f", "run_at": 1790000000000_i64, "priority": null, "created_at": 1790000000000_i64, "updated_at": 1790000000500_i64}], "next_cursor": null}))],
                ),
            )])),
        Op::GetJob => Spec::new("getJob", "jobs", "A job's envelope, optionally long-polled")
            .describe(format!("`get_job`: `running` with its `state`, `ok` with the result, or the final `error` with `state` `failed` or `cancelled`. `wait_s` waits up to that long for the job to settle. A principal holds at most `long_polls_per_principal` waits ({} here); one more is 429.", limits.max_long_polls_per_principal))
            .param(job_id_param())
            .param(param("query", "wait_s", "Seconds to wait for the job to settle.", json!({"type": "integer", "minimum": 0, "maximum": max_wait})))
            .answers(with_query(vec![
                ("200", json_answer("The job's envelope, or `not_found`, `forbidden`.", schema("Envelope"), &[
                    ("running", json!({"status": "running", "job_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "poll_after_s": 5, "state": "queued", "attempts": 0})),
                    ("cancelled", json!({"status": "error", "error": {"code": "cancelled", "message": "the job was cancelled", "retryable": false}, "state": "cancelled"})),
                ])),
                ("429", answer("RateLimited")),
            ])),
        Op::GetJobRecord => Spec::new("getJobRecord", "jobs", "A job's record beside its envelope")
            .describe("Its arguments (with the tool's `redact` fields redacted), attempts, pool, run, trace and times; `outcome` is the `get_job` envelope. Read as `get_job` reads.")
            .param(job_id_param())
            .answers(authed(vec![("200", ok_or_error("The record, or `not_found`, `forbidden`.", schema("JobRecord"), json!({"status": "ok", "call_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8f", "result": {"job_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "tool": "start_receipt_ocr", "pool": "default", "user": "alice", "state": "queued", "attempts": 0, "max_attempts": 3, "requeues": 0, "args": {"receipt_id": "r-1"}, "run_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8f", "call_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8f", "trace_id": null, "priority": null, "run_at": 1790000000000_i64, "started_at": null, "attempts_log": [], "created_at": 1790000000000_i64, "updated_at": 1790000000000_i64, "outcome": {"status": "running", "job_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "poll_after_s": 5, "state": "queued", "attempts": 0}}})))])),
        Op::CancelJob => Spec::new("cancelJob", "jobs", "Cancel a job")
            .describe("Cancels a job that has not settled and answers its envelope as it now stands; a settled job is answered as it is. The owner and `fleet:operate` may; `fleet:read` gets `forbidden`, anyone else `not_found`. No body is read.")
            .param(job_id_param())
            .answers(authed(vec![("200", json_answer("The job's envelope.", schema("Envelope"), &[
                ("cancelled", json!({"status": "error", "error": {"code": "cancelled", "message": "the job was cancelled", "retryable": false}, "state": "cancelled"})),
                ("forbidden", json!({"status": "error", "error": {"code": "forbidden", "message": "job `0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e` is another user's; cancelling it needs scope `fleet:operate`", "retryable": false}})),
            ]))])),
        Op::RetryJob => Spec::new("retryJob", "jobs", "Put a failed or cancelled job back")
            .describe("The same job, `queued` and due now, its attempts counted anew. A job that has not settled, or that succeeded, is `conflict`. No body is read.")
            .param(job_id_param())
            .answers(authed(vec![("200", json_answer("The job's envelope (`running` with `state` `queued`), or why not.", schema("Envelope"), &[
                ("queued", json!({"status": "running", "job_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "poll_after_s": 5, "state": "queued", "attempts": 0})),
                ("conflict", json!({"status": "error", "error": {"code": "conflict", "message": "job `0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e` was not retried: a job that succeeded is not run again: call the tool again for new work", "retryable": false}})),
            ]))])),
        Op::RetryJobs => Spec::new("retryJobs", "jobs", "Put back the failed and cancelled jobs a filter names")
            .describe(format!("Oldest settled first: the caller's own, or every user's of the tenant for `fleet:operate`; at most `limit` ({} at most) a request; call again for the next ones.", crate::retry::MAX_RETRY))
            .body(request(schema("RetryFilter"), &[("failed", json!({"tool": "start_receipt_ocr", "state": "failed", "error_code": "timeout", "since": 1790000000000_i64, "until": 1790003600000_i64, "limit": 100}))]))
            .answers(with_body(vec![("200", json_answer(
                "How many were put back, and which.",
                json!({"oneOf": [schema("Retried"), schema("ErrorEnvelope")]}),
                &[("retried", json!({"retried": 1, "job_ids": ["0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e"]}))],
            ))])),
        Op::GetQueues => Spec::new("getQueues", "jobs", "The tenant's jobs by pool")
            .describe("For the tenant's operators (`fleet:read` or `fleet:operate`; anyone else gets `forbidden`): how many jobs wait in each state, and what settled in the last `since_s` seconds, in all and minute by minute.")
            .param(param("query", "since_s", "The window, in seconds (default 3600).", json!({"type": "integer", "minimum": 60, "maximum": 86400, "default": 3600})))
            .answers(with_query(vec![("200", ok_or_error("The pools, or `forbidden`.", schema("Queues"), json!({"status": "ok", "call_id": "", "result": {"since": 1790000000000_i64, "pools": [{"pool": "default", "queued": 2, "scheduled": 0, "running": 1, "retrying": 0, "earliest_due": 1790000000000_i64, "settled": {"succeeded": 10, "failed": 1, "cancelled": 0}, "per_minute": [{"at": 1790000040000_i64, "succeeded": 10, "failed": 1, "wait_avg_ms": 120}], "wait_avg_ms": 120, "wait_max_ms": 900}]}})))])),
        Op::ListSchedules => Spec::new("listSchedules", "schedules", "The caller's schedules")
            .describe("The schedules whose principal is the caller (every one of the tenant for `fleet:operate`), with their next three ticks and last jobs. Not an envelope.")
            .answers(authed(vec![("200", json_answer(
                "The schedules.",
                json!({"oneOf": [schema("Schedules"), schema("ErrorEnvelope")]}),
                &[("nightly", json!({"schedules": [{"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Berlin", "tool": "reconcile_month", "overlap": "skip", "catch_up": "last", "paused": false, "next_ticks": ["2026-12-03T02:00:00.000Z", "2026-12-04T02:00:00.000Z", "2026-12-05T02:00:00.000Z"], "last_tick": "2026-12-02T02:00:00.000Z", "last_job": {"job_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "state": "succeeded"}}]}))],
            ))])),
        Op::PauseSchedule | Op::ResumeSchedule => {
            let (id, summary) = if op == Op::PauseSchedule {
                ("pauseSchedule", "Stop a schedule's ticks")
            } else {
                ("resumeSchedule", "Restart a schedule's ticks")
            };
            Spec::new(id, "schedules", summary)
                .describe("On every dispatcher of the fleet; ticks while paused are not made up. Answers the schedule as listed, or `not_found`. No body is read.")
                .param(schedule_param())
                .answers(authed(vec![("200", json_answer(
                    "The schedule, or `not_found`.",
                    json!({"oneOf": [schema("Schedule"), schema("ErrorEnvelope")]}),
                    &[("paused", json!({"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Berlin", "tool": "reconcile_month", "overlap": "skip", "catch_up": "last", "paused": true, "next_ticks": [], "last_tick": "2026-12-02T02:00:00.000Z", "last_job": null}))],
                ))]))
        }
        Op::ListTickets => Spec::new("listTickets", "tickets", "The caller's inbox")
            .describe("The tickets the caller may answer, newest first, 50 a page.")
            .param(param("query", "state", "Only open or answered tickets.", json!({"type": "string", "enum": ["open", "answered"]})))
            .param(param("query", "kind", "Only questions, approvals or input tickets.", json!({"type": "string", "enum": ["question", "approval", "input"]})))
            .param(param("query", "cursor", "The `next_cursor` of the previous page.", json!({"type": "string", "maxLength": 256})))
            .answers(with_query(vec![("200", ok_or_error("A page of tickets.", schema("TicketPage"), json!({"status": "ok", "call_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "result": {"tickets": [], "next_cursor": null}})))])),
        Op::GetTicket => Spec::new("getTicket", "tickets", "Read a ticket")
            .param(ticket_param())
            .answers(authed(vec![("200", ok_or_error("The ticket, or `not_found`.", schema("Ticket"), json!({"status": "ok", "call_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "result": ticket_example()})))])),
        Op::AnswerTicket => Spec::new("answerTicket", "tickets", "Answer a question")
            .describe("The first answer stands; a later one is `conflict` with the ticket in `details`. For a ticket with options the answer must be one of them as a string (`invalid_arguments`).")
            .param(ticket_param())
            .body(request(json!({"type": "object", "required": ["answer"], "additionalProperties": false, "properties": {"answer": {"description": "Any JSON."}}}), &[("option", json!({"answer": "travel"}))]))
            .answers(with_body(vec![("200", ok_or_error("The answered ticket, or why not.", schema("Ticket"), json!({"status": "ok", "call_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "result": ticket_example()})))])),
        Op::ApproveTicket => Spec::new("approveTicket", "tickets", "Approve a commit awaiting approval")
            .describe("Runs the commit exactly once; the ticket settles with the commit's envelope as its `outcome`. Answers the ticket.")
            .param(ticket_param())
            .body(request(json!({"type": "object", "additionalProperties": false}), &[("approve", json!({}))]))
            .answers(with_body(vec![("200", ok_or_error("The decided ticket, or why not.", schema("Ticket"), json!({"status": "ok", "call_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "result": ticket_example()})))])),
        Op::RejectTicket => Spec::new("rejectTicket", "tickets", "Reject a commit awaiting approval")
            .describe("Settles the ticket with the error `rejected` (`details.reason`).")
            .param(ticket_param())
            .body(request(json!({"type": "object", "additionalProperties": false, "properties": {"reason": {"type": ["string", "null"], "maxLength": 2000}}}), &[("reason", json!({"reason": "not this month"}))]))
            .answers(with_body(vec![("200", ok_or_error("The decided ticket, or why not.", schema("Ticket"), json!({"status": "ok", "call_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "result": ticket_example()})))])),
        Op::StartRun => Spec::new("startRun", "runs", "Start a run")
            .describe("`agent` and `input`: a run of a declared assistant; `checkpoint` alone: a run the caller drives. An unknown agent is `invalid_arguments` naming those declared; the same `idempotency_key` answers the same run.")
            .body(request(schema("StartRun"), &[("driven", json!({"checkpoint": {"step": 1}, "idempotency_key": "conversation-42"}))]))
            .answers(with_body(vec![("200", ok_or_error("The run, or why not.", schema("Run"), json!({"status": "ok", "call_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "result": run_example()})))])),
        Op::ListRuns => Spec::new("listRuns", "runs", "List the caller's runs")
            .describe("Newest first, 50 a page, without their transcripts (an operator's: the tenant's).")
            .param(param("query", "state", "Only runs in this state.", json!({"type": "string", "enum": run_states})))
            .param(param("query", "agent", "Only this assistant's runs.", json!({"type": "string", "maxLength": 128})))
            .param(param("query", "cursor", "The `next_cursor` of the previous page.", json!({"type": "string", "maxLength": 256})))
            .answers(with_query(vec![("200", ok_or_error("A page of runs.", schema("RunPage"), json!({"status": "ok", "call_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "result": {"runs": [], "next_cursor": null}})))])),
        Op::GetRun => Spec::new("getRun", "runs", "Read a run")
            .param(run_param())
            .answers(authed(vec![("200", ok_or_error("The run with its transcript, or `not_found`.", schema("Run"), json!({"status": "ok", "call_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "result": run_example()})))])),
        Op::MessageRun => Spec::new("messageRun", "runs", "The user's next message to an answered run")
            .describe("Any state but `answered`, or a run its caller drives, is `conflict`.")
            .param(run_param())
            .body(request(json!({"type": "object", "required": ["content"], "additionalProperties": false, "properties": {"content": {"type": "string", "description": "1 to 32,000 characters, not blank (else `invalid_arguments`)."}}}), &[("message", json!({"content": "And last month?"}))]))
            .answers(with_body(vec![("200", ok_or_error("The run, running again, or why not.", schema("Run"), json!({"status": "ok", "call_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "result": run_example()})))])),
        Op::WaitRun => Spec::new("waitRun", "runs", "Park a run the caller drives")
            .describe("Parks the run on its jobs and tickets (1 to 100 items, each the caller's own) with its checkpoint; once all (or any) settled it is `running` again with `resumed`.")
            .param(run_param())
            .body(request(schema("WaitRequest"), &[("jobs", json!({"for": "all", "jobs": ["0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e"], "checkpoint": {"step": 2}}))]))
            .answers(with_body(vec![("200", ok_or_error("The run, or why not.", schema("Run"), json!({"status": "ok", "call_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "result": run_example()})))])),
        Op::AnswerRun => Spec::new("answerRun", "runs", "Record the answer of a run the caller drives")
            .describe("The run is `answered` and its callback hears `run.answered`; a later `/wait` continues it. A run not `running`, or an assistant's, is `conflict`.")
            .param(run_param())
            .body(request(json!({"type": "object", "required": ["answer"], "additionalProperties": false, "properties": {"answer": {"type": "string", "description": "At most 32,000 characters (else `invalid_arguments`)."}, "checkpoint": {"description": "Opaque JSON, within the run's checkpoint bound."}}}), &[("answer", json!({"answer": "Done: 3 receipts filed."}))]))
            .answers(with_body(vec![("200", ok_or_error("The run, or why not.", schema("Run"), json!({"status": "ok", "call_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "result": run_example()})))])),
        Op::CancelRun => Spec::new("cancelRun", "runs", "Stop a run")
            .describe("Stops the run and cancels the jobs it waits on; a settled run answers as it is. No body is read.")
            .param(run_param())
            .answers(authed(vec![("200", ok_or_error("The run, or `not_found`.", schema("Run"), json!({"status": "ok", "call_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "result": run_example()})))])),
        Op::RunEvents => Spec::new("streamRunEvents", "runs", "Server-Sent Events of one run")
            .describe("`event: run.<state>`, data the run without its transcript plus `entries` (the transcript entries it gained, the first at position `from`): first the run as it stands, then as it moves, ending once it answered or stopped. A run the caller may not see answers a `not_found` envelope (JSON).")
            .param(run_param())
            .answers(authed(vec![
                ("200", json!({"description": "The stream, or a `not_found` envelope.", "content": {
                    "text/event-stream": {"schema": run_event_schema(), "example": {"event": "run.waiting", "data": "{\"run_id\": \"run_0190f5c27d3e7b2a9c1e2f4a5b6c7d8e\", \"state\": \"waiting\", \"from\": 0, \"entries\": []}"}},
                    "application/json": {"schema": schema("ErrorEnvelope"), "example": {"status": "error", "error": {"code": "not_found", "message": "no run `run_0190f5c27d3e7b2a9c1e2f4a5b6c7d8e` for this caller", "retryable": false}}},
                }})),
                ("429", answer("RateLimited")),
            ])),
        Op::Events => Spec::new("streamEvents", "events", "Server-Sent Events of jobs and tickets")
            .describe(format!("The caller's jobs and tickets (the tenant's for `fleet:read` or `fleet:operate`). Each event: `event: job` or `ticket`, `id`, `data` {{\"kind\", \"id\", \"tool\", \"state\", \"run_id\", \"body\"}}. Keep-alive comments; the stream ends when the server stops. A principal holds at most {} streams (429), a process {} (503).", limits.max_streams_per_principal, limits.max_streams))
            .param(param(
                "query",
                "state",
                "A comma-separated list of states to hear (default: every state).",
                json!({"type": "string", "pattern": event_states_pattern()}),
            ))
            .answers(with_query(vec![
                ("200", json!({"description": "The stream: each event as its schema says (keep-alive comments between).", "content": {"text/event-stream": {"schema": event_schema(), "example": {"event": "job", "id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e", "data": "{\"kind\": \"job\", \"id\": \"0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8e\", \"tool\": \"start_receipt_ocr\", \"state\": \"succeeded\", \"run_id\": \"0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8f\", \"body\": {\"status\": \"ok\", \"result\": {}, \"call_id\": \"0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8f\"}}"}}}})),
                ("429", answer("RateLimited")),
            ])),
        Op::Mcp => Spec::new("mcp", "mcp", "MCP over Streamable HTTP")
            .describe("JSON-RPC 2.0 messages of the Model Context Protocol (revisions 2025-06-18, 2025-11-25, 2026-07-28): `tools/list` and `tools/call` through the same path as `POST /v1/calls`. Stateless, JSON answers. Without a token it answers 401 with `WWW-Authenticate: Bearer resource_metadata=...`; a request with an `Origin` not allowed answers 403.")
            .body(request(
                json!({"type": "object", "required": ["jsonrpc"], "description": "One JSON-RPC 2.0 message (a request, notification or answer); a batch (an array) is refused with 415.", "properties": {
                    "jsonrpc": {"const": "2.0"},
                    "id": {"description": "A request's id: a string or an integer."},
                    "method": {"description": "`initialize`, `tools/list`, `tools/call`, ...; one MCP does not know is answered a JSON-RPC error (200)."},
                    "params": {"description": "The method's parameters; ones it cannot read are answered a JSON-RPC error (200)."},
                    }}),
                &[
                    ("list", json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})),
                    ("call", json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "find_expenses", "arguments": {"month": "2026-09"}}})),
                ],
            ))
            .answers({
                let mut answers = authed(vec![
                    ("200", json_answer(
                        "The JSON-RPC answer: its `result`, or its `error`.",
                        json!({"type": "object", "required": ["jsonrpc"], "properties": {
                            "jsonrpc": {"const": "2.0"},
                            "id": {"type": ["string", "integer", "null"]},
                            "result": {"type": "object"},
                            "error": {"type": "object", "required": ["code", "message"], "properties": {
                                "code": {"type": "integer"}, "message": {"type": "string"}, "data": {},
                            }},
                        }}),
                        &[("tools", json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": "find_expenses", "description": "Finds the expenses of a month.", "inputSchema": {"type": "object"}}]}}))],
                    )),
                    ("202", json!({"description": "A notification or answer accepted."})),
                    ("400", json!({"description": "Not a JSON-RPC message MCP takes (the MCP transport's text)."})),
                    ("403", answer("Forbidden")),
                    ("405", json!({"description": "A method other than POST (the MCP transport's text)."})),
                    ("406", json!({"description": "An `Accept` header that does not take both `application/json` and `text/event-stream` (the MCP transport's text)."})),
                    ("413", json!({"description": "A body over `max_body_bytes`.", "content": {"application/json": {"schema": {}}}})),
                    ("415", json!({"description": "A body that is not `application/json` (the MCP transport's text)."})),
                ]);
                answers.insert("401".into(), answer("McpUnauthenticated"));
                answers
            }),
        Op::McpMetadata | Op::McpMetadataOfMcp => Spec::new(
            if op == Op::McpMetadata { "mcpResourceMetadata" } else { "mcpResourceMetadataOfMcp" },
            "mcp",
            "RFC 9728 protected-resource metadata of `/mcp`",
        )
            .public()
            .answers(Map::from_iter([("200".to_owned(), json_answer(
                "The metadata.",
                json!({"type": "object", "required": ["resource", "resource_name", "bearer_methods_supported", "scopes_supported"], "properties": {
                    "resource": {"type": "string"}, "resource_name": {"type": "string"},
                    "bearer_methods_supported": {"type": "array", "items": {"type": "string"}},
                    "scopes_supported": {"type": "array", "items": {"type": "string"}},
                }}),
                &[("local", json!({"resource": "http://127.0.0.1:8080/mcp", "resource_name": "toolfleet", "bearer_methods_supported": ["header"], "scopes_supported": ["expenses:read"]}))],
            ))])),
        Op::OpenApi => Spec::new("getOpenApi", "operations", "This document")
            .describe("The OpenAPI 3.1 document of this API, made from the same table the router mounts. Needs no token.")
            .public()
            .answers(Map::from_iter([("200".to_owned(), json_answer("The document.", json!({"type": "object", "required": ["openapi", "info", "paths"]}), &[("head", json!({"openapi": OPENAPI_VERSION, "info": {"title": "toolfleet", "version": env!("CARGO_PKG_VERSION")}, "paths": {}}))]))])),
        Op::Health => Spec::new("healthz", "operations", "Liveness")
            .public()
            .answers(Map::from_iter([("200".to_owned(), json_answer("The process answers.", json!({"type": "object", "required": ["status"], "properties": {"status": {"const": "ok"}}}), &[("ok", json!({"status": "ok"}))]))])),
        Op::Ready => {
            let body = json!({"type": "object", "required": ["store", "broker"], "properties": {
                "store": {"type": "string", "enum": ["ok", "down"]},
                "broker": {"type": "string", "enum": ["ok", "down"]},
            }});
            Spec::new("readyz", "operations", "Readiness")
                .describe("From a check at most a second old.")
                .public()
                .answers(Map::from_iter([
                    ("200".to_owned(), json_answer("The store and the broker answer.", body.clone(), &[("ready", json!({"store": "ok", "broker": "ok"}))])),
                    ("503".to_owned(), {
                        let mut down = json_answer("One does not answer (`Retry-After: 2`).", body, &[("down", json!({"store": "ok", "broker": "down"}))]);
                        down["headers"] = json!({"Retry-After": {"$ref": "#/components/headers/RetryAfter"}});
                        down
                    }),
                ]))
        }
        Op::Metrics => Spec::new("metrics", "operations", "Prometheus metrics")
            .describe("OpenMetrics text; the README's Metrics section lists the series. Served here unless `metrics_listen` names a port of its own.")
            .public()
            .answers(Map::from_iter([("200".to_owned(), json!({"description": "The series.", "content": {"application/openmetrics-text": {"schema": {"type": "string"}, "example": "# TYPE toolfleet_calls counter\ntoolfleet_calls_total{tool=\"find_expenses\",status=\"ok\"} 3\n# EOF\n"}}}))])),
    };
    spec.into_value()
}

/// One event of `GET /v1/events`, as a client of Server-Sent Events reads
/// it: its `event`, `id` and `data` (JSON text).
fn event_schema() -> Value {
    let states = names(&EventState::ALL, EventState::as_str);
    json!({
        "type": "object",
        "required": ["event", "id", "data"],
        "properties": {
            "event": {"type": "string", "enum": ["job", "ticket"]},
            "id": {"type": "string", "description": "The job's or ticket's id."},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": {
                    "type": "object",
                    "required": ["kind", "id", "tool", "state", "run_id", "body"],
                    "properties": {
                        "kind": {"type": "string", "enum": ["job", "ticket"]},
                        "id": {"type": "string"},
                        "tool": {"type": "string"},
                        "state": {"type": "string", "enum": states},
                        "run_id": {"type": "string"},
                        "body": {"description": "The `get_job` envelope (a `forbidden` one for a caller without the tool's scopes), or the ticket."},
                    },
                },
            },
        },
    })
}

/// One event of `GET /v1/runs/{run}/events`: `run.<state>` and the run.
fn run_event_schema() -> Value {
    json!({
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"type": "string", "pattern": "^run\\.[a-z_]+$"},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": {
                    "description": "The run as `getRun` shows it without its transcript, with `entries` (the transcript entries it gained) and, first, `from` (their position).",
                    "type": "object",
                    "required": ["run_id", "state", "entries"],
                },
            },
        },
    })
}

/// The pattern of `/v1/events?state=`: event states, comma-separated.
fn event_states_pattern() -> String {
    let words = names(&EventState::ALL, EventState::as_str).join("|");
    format!("^ *({words}) *(, *({words}) *)*$")
}

fn ticket_example() -> Value {
    json!({
        "ticket": "t_0190f5c27d3e7b2a9c1e2f4a5b6c7d8e", "tool": "ask_user", "question": "Travel or meals?",
        "options": ["travel", "meals"], "state": "open", "kind": "question", "plan": null,
        "answer": null, "outcome": null, "answered_by": "caller", "run_id": "0190f5c2-7d3e-7b2a-9c1e-2f4a5b6c7d8f",
        "created_at": 1790000000000_i64, "answered_at": null, "expires_at": null,
    })
}

fn run_example() -> Value {
    json!({
        "run_id": "run_0190f5c27d3e7b2a9c1e2f4a5b6c7d8e", "agent": null, "state": "running",
        "wait": null, "answer": null, "error": null, "usage": null, "checkpoint": {"step": 1},
        "resumed": null, "callback_url": null, "version": 1, "transcript": [],
        "created_at": 1790000000000_i64, "updated_at": 1790000000000_i64,
    })
}

/// A nullable `schema`.
fn nullable(body: Value) -> Value {
    json!({"oneOf": [body, {"type": "null"}]})
}

fn components(limits: &Limits) -> Value {
    let call = json!({
        "type": "object",
        "required": ["tool"],
        "additionalProperties": false,
        "properties": {
            "tool": {"type": "string", "description": "The tool's name."},
            "args": {"description": "The arguments (default `{}`), validated against the tool's schema.", "default": {}},
            "idempotency_key": {"type": ["string", "null"], "minLength": 1, "maxLength": 255},
            "run_id": {"type": ["string", "null"], "minLength": 1, "maxLength": 128, "description": "The agent run this call belongs to (default: the call's own id)."},
            "callback_url": {"type": ["string", "null"], "minLength": 1, "maxLength": 2048, "description": "`http` or `https`: where the settled job or answered ticket is POSTed; the tenant's allow-list must open it."},
            "run_at": {"type": ["string", "null"], "description": "For a job or agent tool: an RFC 3339 time with its offset, not past, at most a year ahead. Not with `delay_s`."},
            "delay_s": {"type": ["number", "null"], "minimum": 0, "maximum": crate::routes::MAX_DELAY_S, "description": "For a job or agent tool: seconds from now. Not with `run_at`."},
            "priority": {"type": ["integer", "null"], "minimum": PRIORITIES.start(), "maximum": PRIORITIES.end(), "description": "For a job or agent tool of an ordered pool: higher first."},
        },
    });
    json!({
        "securitySchemes": {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "A token configured by its SHA-256 in `[[auth.tokens]]` (at most 512 characters), naming a tenant, user and scopes.",
            },
        },
        "headers": {
            "RetryAfter": {"description": "Seconds to wait before calling again.", "schema": {"type": "integer", "minimum": 0}},
        },
        "responses": {
            "BadRequest": error_answer("The request is not what the route takes: a body that is not its JSON (unknown fields included), a parameter or field out of its bounds (`bad_request`).", "bad_request", "`limit` must be 1 to 1000: got 0", None),
            "Unauthenticated": error_answer("No `Authorization: Bearer <token>`, or a token not configured (`unauthenticated`; `WWW-Authenticate: Bearer`).", "unauthenticated", "send `Authorization: Bearer <token>`", Some("WWW-Authenticate")),
            "McpUnauthenticated": error_answer("No bearer token, or one not configured (`WWW-Authenticate: Bearer resource_metadata=...`).", "unauthenticated", "send `Authorization: Bearer <token>`", Some("WWW-Authenticate")),
            "Forbidden": error_answer("An `Origin` that may not call `/mcp` (`forbidden`).", "forbidden", "Origin `https://elsewhere.example` may not call /mcp on this server; add it to [mcp] allowed_origins", None),
            "BodyTimeout": error_answer(&format!("The body did not arrive whole within `body_read_timeout_s` ({} s here) (`timeout`).", limits.body_read_timeout.as_secs()), "timeout", "the body did not arrive within 30 s; send it whole, promptly", None),
            "PayloadTooLarge": error_answer(&format!("The body is over `max_body_bytes` ({} here) (`payload_too_large`).", limits.max_body), "payload_too_large", "the body is larger than 1048576 bytes; send less", None),
            "RateLimited": error_answer("The caller holds as many long polls or event streams as it may (`rate_limited`, with `Retry-After`).", "rate_limited", "this caller holds as many event streams as it may; close one first", Some("Retry-After")),
            "Unavailable": error_answer("A backend (store, broker, notices) is down or refused, the server is starting, or the process is full (`unavailable`, with `Retry-After`).", "unavailable", "the job store is unavailable (connection refused); try again shortly", Some("Retry-After")),
        },
        "schemas": schemas(call),
    })
}

/// The schemas of the components.
fn schemas(call: Value) -> Value {
    let mut all = Map::new();
    for part in [
        envelope_schemas(),
        call_schemas(call),
        job_schemas(),
        fleet_schemas(),
        people_schemas(),
    ] {
        if let Value::Object(part) = part {
            all.extend(part);
        }
    }
    Value::Object(all)
}

fn envelope_schemas() -> Value {
    let codes = names(&ErrorCode::ALL, ErrorCode::as_str);
    json!({
            "ErrorCode": {"type": "string", "enum": codes, "description": "The error codes of the contract; never renamed."},
            "ToolError": {
                "type": "object",
                "required": ["code", "message", "retryable"],
                "properties": {
                    "code": schema("ErrorCode"),
                    "message": {"type": "string", "description": "What went wrong and what to do next, written for a model."},
                    "retryable": {"type": "boolean"},
                    "retry_after_s": {"type": "integer", "minimum": 0},
                    "details": {"description": "Machine-readable: `violations`, `suggestions`, `outcome`, `reason`, a ticket."},
                },
            },
            "OkEnvelope": ok_of(json!({"description": "The tool's JSON result."})),
            "ErrorEnvelope": {
                "type": "object",
                "required": ["status", "error"],
                "properties": {
                    "status": {"const": "error"},
                    "error": schema("ToolError"),
                    "state": {"type": "string", "enum": ["failed", "cancelled"], "description": "`get_job` of a settled job."},
                },
            },
            "RunningEnvelope": {
                "type": "object",
                "required": ["status", "job_id", "poll_after_s"],
                "properties": {
                    "status": {"const": "running"},
                    "job_id": {"type": "string"},
                    "poll_after_s": {"type": "integer", "minimum": 0},
                    "state": {"type": "string", "enum": ["queued", "scheduled", "running", "retrying"]},
                    "attempts": {"type": "integer", "minimum": 0},
                    "progress": {},
                    "run_at": {"type": "string", "description": "RFC 3339, UTC, to the millisecond."},
                    "waiting_for": {"type": "string", "enum": ["concurrency_key"]},
                },
            },
            "SuspendedEnvelope": {
                "type": "object",
                "required": ["status", "ticket", "question", "options"],
                "properties": {
                    "status": {"const": "suspended"},
                    "ticket": {"type": "string"},
                    "question": {"type": "string"},
                    "options": {"type": "array", "items": {"type": "string"}},
                    "plan": {"description": "An approval's: what the commit's dry run answered."},
                },
            },
            "Envelope": {
                "oneOf": [schema("OkEnvelope"), schema("ErrorEnvelope"), schema("RunningEnvelope"), schema("SuspendedEnvelope")],
                "discriminator": {"propertyName": "status", "mapping": {
                    "ok": "#/components/schemas/OkEnvelope",
                    "error": "#/components/schemas/ErrorEnvelope",
                    "running": "#/components/schemas/RunningEnvelope",
                    "suspended": "#/components/schemas/SuspendedEnvelope",
                }},
            },
    })
}

fn call_schemas(call: Value) -> Value {
    // In a batch a field out of its bounds is that call's `bad_request`
    // envelope, not a 400 of the request: its items have the types alone.
    let mut batched = call.clone();
    if let Some(properties) = batched["properties"].as_object_mut() {
        for property in properties.values_mut().filter_map(Value::as_object_mut) {
            for bound in ["minLength", "maxLength", "minimum", "maximum"] {
                property.remove(bound);
            }
        }
        // Any JSON reads as a priority; one that is not a whole number in
        // bounds is the call's envelope.
        if let Some(priority) = properties
            .get_mut("priority")
            .and_then(Value::as_object_mut)
        {
            priority.remove("type");
        }
    }
    batched["description"] = json!(
        "A call of a batch: its fields' bounds are checked call by call, each answering its own `bad_request` envelope."
    );
    json!({
            "CallRequest": call,
            "BatchCall": batched,
            "BatchRequest": {
                "type": "object",
                "required": ["calls"],
                "additionalProperties": false,
                "properties": {"calls": {"type": "array", "minItems": 1, "maxItems": crate::routes::MAX_BATCH, "items": schema("BatchCall")}},
            },
            "BatchResults": {
                "type": "object",
                "required": ["results"],
                "properties": {"results": {"type": "array", "items": schema("Envelope")}},
            },
    })
}

fn job_schemas() -> Value {
    let job_states = names(&JobState::SHOWN, JobState::as_str);
    let int = json!({"type": "integer", "format": "int64"});
    let ms = json!({"type": "integer", "format": "int64", "description": "Unix milliseconds."});
    json!({
            "JobSummary": {
                "type": "object",
                "required": ["job_id", "tool", "state", "attempts", "run_id", "run_at", "priority", "created_at", "updated_at"],
                "properties": {
                    "job_id": {"type": "string"},
                    "tool": {"type": "string"},
                    "state": {"type": "string", "enum": job_states},
                    "attempts": {"type": "integer", "minimum": 0},
                    "run_id": {"type": "string"},
                    "run_at": nullable(ms.clone()),
                    "priority": nullable(json!({"type": "integer"})),
                    "created_at": ms,
                    "updated_at": ms,
                },
            },
            "JobPage": {
                "type": "object",
                "required": ["jobs", "next_cursor"],
                "properties": {
                    "jobs": {"type": "array", "items": schema("JobSummary")},
                    "next_cursor": nullable(json!({"type": "string"})),
                },
            },
            "JobRecord": {
                "type": "object",
                "required": ["job_id", "tool", "pool", "user", "state", "attempts", "max_attempts", "requeues", "args", "run_id", "call_id", "trace_id", "priority", "run_at", "started_at", "attempts_log", "created_at", "updated_at", "outcome"],
                "properties": {
                    "job_id": {"type": "string"},
                    "tool": {"type": "string"},
                    "pool": {"type": "string"},
                    "user": {"type": "string"},
                    "state": {"type": "string", "enum": job_states},
                    "attempts": {"type": "integer", "minimum": 0},
                    "max_attempts": {"type": "integer", "minimum": 0},
                    "requeues": {"type": "integer", "minimum": 0},
                    "args": {"description": "As the call gave them, the tool's `redact` fields replaced by `\"[redacted]\"`."},
                    "run_id": {"type": "string"},
                    "call_id": {"type": "string"},
                    "trace_id": nullable(json!({"type": "string"})),
                    "priority": nullable(json!({"type": "integer"})),
                    "run_at": nullable(int.clone()),
                    "started_at": nullable(int.clone()),
                    "attempts_log": nullable(json!({"type": "array", "items": {"type": "object", "properties": {
                        "attempt": {"type": "integer"}, "started_at": nullable(int.clone()), "ended_at": nullable(int.clone()), "error": {},
                    }}})),
                    "created_at": int,
                    "updated_at": int,
                    "outcome": schema("Envelope"),
                },
            },
            "RetryFilter": {
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "tool": {"type": ["string", "null"], "minLength": 1, "maxLength": 128},
                    "state": {"type": ["string", "null"], "enum": ["failed", "cancelled", null], "description": "Default both."},
                    "error_code": {"type": ["string", "null"], "minLength": 1, "maxLength": 64, "description": "A code of the job's error."},
                    "since": {"type": ["integer", "null"], "format": "int64", "description": "Settled at or after (Unix milliseconds); before `until`."},
                    "until": {"type": ["integer", "null"], "format": "int64", "description": "Settled before (Unix milliseconds)."},
                    "limit": {"type": ["integer", "null"], "minimum": 1, "maximum": crate::retry::MAX_RETRY, "default": 100},
                },
            },
            "Retried": {
                "type": "object",
                "required": ["retried", "job_ids"],
                "properties": {
                    "retried": {"type": "integer", "minimum": 0},
                    "job_ids": {"type": "array", "items": {"type": "string"}},
                },
            },
    })
}

fn fleet_schemas() -> Value {
    let job_states = names(&JobState::SHOWN, JobState::as_str);
    let int = json!({"type": "integer", "format": "int64"});
    json!({
            "Queues": {
                "type": "object",
                "required": ["since", "pools"],
                "properties": {
                    "since": int,
                    "pools": {"type": "array", "items": {"type": "object", "required": ["pool", "queued", "scheduled", "running", "retrying", "earliest_due", "settled", "per_minute", "wait_avg_ms", "wait_max_ms"], "properties": {
                        "pool": {"type": "string"},
                        "queued": {"type": "integer"}, "scheduled": {"type": "integer"}, "running": {"type": "integer"}, "retrying": {"type": "integer"},
                        "earliest_due": nullable(int.clone()),
                        "settled": {"type": "object", "required": ["succeeded", "failed", "cancelled"], "properties": {
                            "succeeded": {"type": "integer"}, "failed": {"type": "integer"}, "cancelled": {"type": "integer"},
                        }},
                        "per_minute": {"type": "array", "items": {"type": "object", "required": ["at", "wait_avg_ms"], "properties": {
                            "at": int, "succeeded": {"type": "integer"}, "failed": {"type": "integer"}, "cancelled": {"type": "integer"},
                            "wait_avg_ms": nullable(int.clone()),
                        }}},
                        "wait_avg_ms": nullable(int.clone()),
                        "wait_max_ms": nullable(int.clone()),
                    }}},
                },
            },
            "Schedule": {
                "type": "object",
                "required": ["name", "cron", "timezone", "tool", "overlap", "catch_up", "paused", "next_ticks", "last_tick", "last_job"],
                "properties": {
                    "name": {"type": "string"},
                    "cron": {"type": "string"},
                    "timezone": {"type": "string"},
                    "tool": {"type": "string"},
                    "overlap": {"type": "string", "enum": ["skip", "allow"]},
                    "catch_up": {"type": "string", "enum": ["last", "none"]},
                    "paused": {"type": "boolean"},
                    "next_ticks": {"type": "array", "items": {"type": "string"}, "description": "The next three (RFC 3339, UTC); empty while paused."},
                    "last_tick": nullable(json!({"type": "string"})),
                    "last_job": nullable(json!({"type": "object", "required": ["job_id", "state"], "properties": {
                        "job_id": {"type": "string"},
                        "state": nullable(json!({"type": "string", "enum": job_states})),
                    }})),
                },
            },
            "Schedules": {
                "type": "object",
                "required": ["schedules"],
                "properties": {"schedules": {"type": "array", "items": schema("Schedule")}},
            },
    })
}

fn people_schemas() -> Value {
    let run_states = names(&RunState::ALL, RunState::as_str);
    let int = json!({"type": "integer", "format": "int64"});
    json!({
            "Ticket": {
                "type": "object",
                "required": ["ticket", "tool", "question", "options", "state", "kind", "answered_by", "run_id", "created_at"],
                "properties": {
                    "ticket": {"type": "string"},
                    "tool": {"type": "string"},
                    "question": {"type": "string"},
                    "options": {"type": "array", "items": {"type": "string"}},
                    "state": {"type": "string", "enum": ["open", "answered", "expired"]},
                    "kind": {"type": "string", "enum": ["question", "approval", "input"]},
                    "plan": {"description": "An approval's: what the command's dry run answered."},
                    "input_requests": {"type": "object", "description": "An input ticket's: what a job tool asks its caller's MCP client, by key."},
                    "pending": {"type": "array", "items": {"type": "string"}, "description": "An input ticket's keys not answered yet."},
                    "answer": {"description": "The answer, once given."},
                    "outcome": {"description": "The envelope it came to, once it did."},
                    "answered_by": {"oneOf": [{"const": "caller"}, {"type": "object", "required": ["scope"], "properties": {"scope": {"type": "string"}}}]},
                    "run_id": {"type": "string"},
                    "created_at": int,
                    "answered_at": nullable(int.clone()),
                    "expires_at": nullable(int.clone()),
                },
            },
            "TicketPage": {
                "type": "object",
                "required": ["tickets", "next_cursor"],
                "properties": {
                    "tickets": {"type": "array", "items": schema("Ticket")},
                    "next_cursor": nullable(json!({"type": "string"})),
                },
            },
            "StartRun": {
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "agent": {"type": ["string", "null"], "minLength": 1, "maxLength": 128, "description": "A declared assistant, with `input`."},
                    "input": {"type": ["string", "null"], "description": "The user's first message: 1 to 32,000 characters, not blank."},
                    "checkpoint": {"description": "A run the caller drives: opaque JSON within `run_checkpoint_bytes`."},
                    "callback_url": {"type": ["string", "null"], "minLength": 1, "maxLength": 2048},
                    "idempotency_key": {"type": ["string", "null"], "minLength": 1, "maxLength": 255},
                },
            },
            "WaitRequest": {
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "for": {"type": "string", "enum": ["all", "any"], "default": "all"},
                    "jobs": {"type": "array", "items": {"type": "string"}, "description": "With `tickets`, 1 to 100 items (else `invalid_arguments`)."},
                    "tickets": {"type": "array", "items": {"type": "string"}},
                    "checkpoint": {"description": "Opaque JSON within `run_checkpoint_bytes`."},
                },
            },
            "Run": {
                "type": "object",
                "required": ["run_id", "agent", "state", "wait", "answer", "error", "usage", "checkpoint", "resumed", "callback_url", "version", "created_at", "updated_at"],
                "properties": {
                    "run_id": {"type": "string"},
                    "agent": nullable(json!({"type": "string"})),
                    "state": {"type": "string", "enum": run_states},
                    "wait": nullable(json!({"type": "object", "required": ["for", "jobs", "tickets"], "description": "While `waiting`: what the run waits on.", "properties": {
                        "for": {"type": "string", "enum": ["all", "any"]},
                        "jobs": {"type": "array", "items": {"type": "string"}},
                        "tickets": {"type": "array", "items": {"type": "string"}},
                    }})),
                    "answer": nullable(json!({"type": "string"})),
                    "error": {"description": "When `failed` or `budget_exceeded`."},
                    "usage": {"description": "An assistant's steps, tokens and wall time."},
                    "checkpoint": {"description": "A run the caller drives: its checkpoint."},
                    "resumed": {"description": "`{\"checkpoint\", \"items\"}` once a wait resumed."},
                    "callback_url": nullable(json!({"type": "string"})),
                    "version": {"type": "integer"},
                    "transcript": {"type": "array", "items": {"type": "object"}},
                    "created_at": int,
                    "updated_at": int,
                },
            },
            "RunPage": {
                "type": "object",
                "required": ["runs", "next_cursor"],
                "properties": {
                    "runs": {"type": "array", "items": schema("Run")},
                    "next_cursor": nullable(json!({"type": "string"})),
                },
            },
    })
}

/// A component answer: the error envelope of `code`, with an example, and
/// `header` when the answer carries one.
fn error_answer(description: &str, code: &str, message: &str, header: Option<&str>) -> Value {
    let mut body = json_answer(
        description,
        schema("ErrorEnvelope"),
        &[(
            code,
            json!({"status": "error", "error": {"code": code, "message": message, "retryable": ErrorCode::ALL.iter().find(|c| c.as_str() == code).is_some_and(|c| c.retryable_by_default())}}),
        )],
    );
    match header {
        Some("Retry-After") => {
            body["headers"] = json!({"Retry-After": {"$ref": "#/components/headers/RetryAfter"}});
        }
        Some(name) => {
            body["headers"] =
                json!({name: {"description": "The challenge.", "schema": {"type": "string"}}});
        }
        None => {}
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn the_document_is_openapi_3_1_with_every_route_once() {
        let doc = document(&Limits::default(), true);
        assert_eq!(doc["openapi"], "3.1.0");
        let mut ids = HashSet::new();
        let mut routes = HashSet::new();
        for route in ROUTES {
            assert!(
                routes.insert((route.path, route.verb.key())),
                "{} {} twice",
                route.verb.key(),
                route.path
            );
            let op = &doc["paths"][route.path][route.verb.key()];
            let id = op["operationId"].as_str().expect("an operationId");
            assert!(ids.insert(id.to_owned()), "operationId {id} twice");
            assert!(op["responses"]["200"].is_object(), "{id} answers 200");
            // Every path parameter of the template is declared, and no other.
            let declared: HashSet<&str> = op["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "path")
                .filter_map(|p| p["name"].as_str())
                .collect();
            let templated: HashSet<&str> = route
                .path
                .split('/')
                .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
                .collect();
            assert_eq!(declared, templated, "{id}");
        }
        let operations: usize = doc["paths"]
            .as_object()
            .unwrap()
            .values()
            .map(|item| item.as_object().unwrap().len())
            .sum();
        assert_eq!(operations, ROUTES.len());
        let without = document(&Limits::default(), false);
        assert!(without["paths"]["/metrics"].is_null());
    }

    #[test]
    fn the_router_mounts_the_table_alone() {
        // routes.rs mounts each route of the table in one loop, and no
        // module of the API adds one of its own.
        let routes = include_str!("routes.rs");
        assert_eq!(routes.matches(".route(").count(), 1, "routes.rs");
        assert_eq!(include_str!("mcp.rs").matches(".route(").count(), 0);
        let metadata = crate::mcp::METADATA_PATH;
        assert!(ROUTES.iter().any(|r| r.path == metadata));
        assert!(ROUTES.iter().any(|r| r.path == format!("{metadata}/mcp")));
    }

    #[test]
    fn the_contract_names_every_route() {
        let contract = include_str!("../../../docs/API.md");
        for route in ROUTES {
            if route.op == Op::McpMetadataOfMcp {
                continue; // `(and `.../mcp`)` beside the plain path
            }
            let named = match route.verb {
                Verb::Any => format!("`{}`", route.path),
                _ => format!("`{} {}", route.verb_name(), route.path),
            };
            assert!(
                contract.contains(&named),
                "docs/API.md does not name {}",
                route.path
            );
        }
    }

    #[test]
    fn every_operation_answers_with_an_example() {
        let doc = document(&Limits::default(), true);
        for route in ROUTES {
            let op = &doc["paths"][route.path][route.verb.key()];
            let ok = op["responses"]
                .as_object()
                .and_then(|r| r.get("200").or_else(|| r.get("202")))
                .expect("a success");
            let content = ok["content"].as_object().expect("a body");
            for (media, body) in content {
                let named = body["examples"].as_object().is_some_and(|e| !e.is_empty());
                assert!(
                    named || !body["example"].is_null(),
                    "{}: no example of {media}",
                    route.path
                );
            }
        }
    }

    #[test]
    fn every_reference_names_a_component() {
        let doc = document(&Limits::default(), true);
        let mut refs = Vec::new();
        collect_refs(&doc, &mut refs);
        assert!(!refs.is_empty());
        for reference in refs {
            let pointer = reference.strip_prefix('#').expect("a local reference");
            assert!(doc.pointer(pointer).is_some(), "{reference} names nothing");
        }
    }

    fn collect_refs(value: &Value, refs: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, v) in map {
                    match (key.as_str(), v) {
                        ("$ref", Value::String(r)) => refs.push(r.clone()),
                        _ => collect_refs(v, refs),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| collect_refs(v, refs)),
            _ => {}
        }
    }

    #[test]
    fn the_codes_and_states_are_the_cores() {
        let doc = document(&Limits::default(), true);
        let codes = doc["components"]["schemas"]["ErrorCode"]["enum"]
            .as_array()
            .unwrap();
        assert_eq!(codes.len(), ErrorCode::ALL.len());
        assert!(codes.contains(&json!("dead_lettered")));
        let states = &doc["paths"]["/v1/jobs"]["get"]["parameters"][0]["schema"]["enum"];
        assert_eq!(states.as_array().unwrap().len(), JobState::SHOWN.len());
    }

    #[test]
    fn the_examples_of_envelopes_are_envelopes() {
        let doc = document(&Limits::default(), true);
        let examples = &doc["paths"]["/v1/calls"]["post"]["responses"]["200"]["content"]["application/json"]
            ["examples"];
        for (name, example) in examples.as_object().unwrap() {
            if name == "batch" {
                continue;
            }
            let envelope: Result<toolfleet_core::Envelope, _> =
                serde_json::from_value(example["value"].clone());
            assert!(envelope.is_ok(), "{name}: {:?}", envelope.err());
        }
    }
}
