//! The result envelope of docs/API.md: what every call, and `get_job`, answers.
//!
//! An envelope is a message to a model with a small context window, so it is
//! compact and explicit. Errors are values here, never panics: every way a
//! call can fail has an [`ErrorCode`] and a message that names the field, the
//! rule and what to do next.

use std::fmt;
use std::sync::Arc;

use crate::lifecycle::JobState;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

/// One JSON document, already encoded, cheap to clone.
///
/// Results travel as encoded JSON: they are written once by the executor and
/// then cached, stored, sent and measured without being copied value by value.
#[derive(Clone)]
pub struct Json(Arc<RawValue>);

impl Json {
    /// Encodes any serialisable value.
    pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Json, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(|raw| Json(Arc::from(raw)))
    }

    /// Parses JSON text; fails when the text is not one JSON document.
    pub fn parse(text: &str) -> Result<Json, serde_json::Error> {
        RawValue::from_string(text.to_owned()).map(|raw| Json(Arc::from(raw)))
    }

    /// The encoded text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// Size of the encoded text in bytes.
    pub fn len(&self) -> usize {
        self.0.get().len()
    }

    /// True for an empty document, which valid JSON never is.
    pub fn is_empty(&self) -> bool {
        self.0.get().is_empty()
    }

    /// Decodes into a [`Value`] for code that inspects the document.
    pub fn to_value(&self) -> Value {
        // The text was produced by serde_json or validated when parsed.
        serde_json::from_str(self.get()).unwrap_or(Value::Null)
    }
}

impl From<Value> for Json {
    fn from(value: Value) -> Self {
        Json::from(&value)
    }
}

impl From<&Value> for Json {
    fn from(value: &Value) -> Self {
        // Encoding a Value cannot fail: its keys are strings and its numbers finite.
        Json::encode(value).unwrap_or_else(|_| Json(Arc::from(null_raw())))
    }
}

fn null_raw() -> Box<RawValue> {
    RawValue::from_string("null".to_owned()).expect("null is JSON")
}

impl PartialEq for Json {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get() || self.to_value() == other.to_value()
    }
}

impl fmt::Debug for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.get())
    }
}

impl fmt::Display for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.get())
    }
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Through Value, because envelopes are internally tagged and serde
        // buffers their fields, which raw JSON cannot be read from.
        Value::deserialize(deserializer).map(Json::from)
    }
}

/// The error codes of docs/API.md. They are part of the contract: never renamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// No registered tool of that name.
    UnknownTool,
    /// The arguments do not match the tool's JSON Schema.
    InvalidArguments,
    /// The caller lacks a scope the tool or the job requires.
    Forbidden,
    /// No bearer token, or one that is not configured.
    Unauthenticated,
    /// The tool's rate limit refused the call; `retry_after_s` says when to call again.
    RateLimited,
    /// The call or the job's attempt ran past its time budget.
    Timeout,
    /// The tool's executor failed or panicked.
    ToolFailed,
    /// No such job, ticket or handle for this caller.
    NotFound,
    /// An idempotency key reused with other arguments, a confirm token in use, or a ticket answered already.
    Conflict,
    /// A command's commit without its confirm token.
    ConfirmRequired,
    /// A confirm token this runtime did not issue, expired, or made for another call.
    InvalidConfirmToken,
    /// An agent's budget ran out (reserved in the contract).
    BudgetExceeded,
    /// The job was cancelled.
    Cancelled,
    /// A backend (store, broker, notices) is down, or the process is full or starting.
    Unavailable,
    /// A request body, provider tool call or tool answer over its bound.
    PayloadTooLarge,
    /// A request the route cannot take: malformed, out of bounds or refused by the allow-list.
    BadRequest,
    /// A person rejected the commit awaiting their approval (`details.reason`).
    Rejected,
    /// A ticket expired before anyone answered it.
    Expired,
    /// The broker gave up delivering the job's message (RabbitMQ's delivery
    /// limit, or a policy's time or length bound) before the job settled.
    DeadLettered,
}

impl ErrorCode {
    /// Every code, in the order of the contract's table (the OpenAPI
    /// document's enum of codes).
    pub const ALL: [ErrorCode; 19] = [
        ErrorCode::UnknownTool,
        ErrorCode::InvalidArguments,
        ErrorCode::Forbidden,
        ErrorCode::Unauthenticated,
        ErrorCode::RateLimited,
        ErrorCode::Timeout,
        ErrorCode::ToolFailed,
        ErrorCode::NotFound,
        ErrorCode::Conflict,
        ErrorCode::ConfirmRequired,
        ErrorCode::InvalidConfirmToken,
        ErrorCode::BudgetExceeded,
        ErrorCode::Cancelled,
        ErrorCode::Unavailable,
        ErrorCode::PayloadTooLarge,
        ErrorCode::BadRequest,
        ErrorCode::Rejected,
        ErrorCode::Expired,
        ErrorCode::DeadLettered,
    ];

    /// The code as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::UnknownTool => "unknown_tool",
            ErrorCode::InvalidArguments => "invalid_arguments",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::Timeout => "timeout",
            ErrorCode::ToolFailed => "tool_failed",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Conflict => "conflict",
            ErrorCode::ConfirmRequired => "confirm_required",
            ErrorCode::InvalidConfirmToken => "invalid_confirm_token",
            ErrorCode::BudgetExceeded => "budget_exceeded",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::Rejected => "rejected",
            ErrorCode::Expired => "expired",
            ErrorCode::DeadLettered => "dead_lettered",
        }
    }

    /// Whether the same call may succeed if simply made again later.
    pub fn retryable_by_default(self) -> bool {
        matches!(
            self,
            ErrorCode::RateLimited
                | ErrorCode::Timeout
                | ErrorCode::Unavailable
                | ErrorCode::DeadLettered
        )
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error a model can read and act on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolError {
    /// What went wrong, from the fixed list of the contract.
    pub code: ErrorCode,
    /// What went wrong and what to do next, written for a model.
    pub message: String,
    /// Whether making the same call again later may succeed.
    pub retryable: bool,
    /// Set with `rate_limited`, and with the `conflict` of a commit whose
    /// confirm token another commit still runs: when the call may be made
    /// again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u64>,
    /// Machine-readable detail, such as the list of schema violations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

impl ToolError {
    /// An error whose retryability follows its code.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ToolError {
            code,
            message: message.into(),
            retryable: code.retryable_by_default(),
            retry_after_s: None,
            details: None,
        }
    }

    /// The executor failed; `retryable` says whether a retry may succeed.
    pub fn failed(message: impl Into<String>, retryable: bool) -> Self {
        ToolError::new(ErrorCode::ToolFailed, message).retryable(retryable)
    }

    /// The attempt gave its job back to wait (an agent parked on a
    /// person's answer, see `Store::park`): not a failure, and nothing for
    /// a worker to settle. Never reaches a client.
    pub fn parked(message: impl Into<String>) -> Self {
        ToolError::failed(message, false).with_details(serde_json::json!({"parked": true}))
    }

    /// True for [`ToolError::parked`].
    pub fn is_parked(&self) -> bool {
        self.code == ErrorCode::ToolFailed
            && self
                .details
                .as_ref()
                .and_then(|d| d.get("parked"))
                .and_then(Value::as_bool)
                .unwrap_or(false)
    }

    /// The arguments do not match what the tool takes.
    pub fn invalid_arguments(message: impl Into<String>) -> Self {
        ToolError::new(ErrorCode::InvalidArguments, message)
    }

    /// No such job, ticket or handle for this caller.
    pub fn not_found(message: impl Into<String>) -> Self {
        ToolError::new(ErrorCode::NotFound, message)
    }

    /// Overrides whether a retry may succeed.
    pub fn retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }

    /// Attaches machine-readable detail.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// Says the call may be made again after `seconds`.
    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds);
        self
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ToolError {}

/// The answer to every call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Envelope {
    /// The call succeeded.
    Ok {
        /// The tool's JSON result.
        result: Json,
        /// The call that produced the result (for a job, the call that made it).
        call_id: String,
    },
    /// The call failed.
    Error {
        /// The error, with its code and message.
        error: ToolError,
        /// Set by `get_job` for a settled job: `failed` or `cancelled`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        state: Option<JobState>,
    },
    /// A job was accepted or has not settled.
    Running {
        /// The job to poll.
        job_id: String,
        /// How long to wait before polling again, in seconds.
        poll_after_s: u32,
        /// Set by `get_job`: `queued`, `scheduled`, `running` or `retrying`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        state: Option<JobState>,
        /// Set by `get_job`: the attempts started so far.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attempts: Option<u32>,
        /// Set by `get_job`: the progress the tool last reported.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        progress: Option<Value>,
        /// Set by `get_job` for a `scheduled` job: when it may start (RFC
        /// 3339, UTC).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run_at: Option<String>,
        /// Set by `get_job` for a `queued` job whose tool's concurrency
        /// limit is reached for its key: `"concurrency_key"`. It starts
        /// when a job of its key stops running.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        waiting_for: Option<String>,
    },
    /// A human tool opened a ticket and waits for its answer.
    Suspended {
        /// The ticket id (`t_` and 32 hex digits).
        ticket: String,
        /// What the person is asked.
        question: String,
        /// The answers the person may choose from; empty for a free answer.
        options: Vec<String>,
        /// For an approval: the plan of the commit awaiting it (what its dry run answered).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        plan: Option<Json>,
    },
}

impl Envelope {
    /// A successful call's answer.
    pub fn ok(result: Json, call_id: impl Into<String>) -> Self {
        Envelope::Ok {
            result,
            call_id: call_id.into(),
        }
    }

    /// A failed call's answer.
    pub fn error(error: ToolError) -> Self {
        Envelope::Error { error, state: None }
    }

    /// A job was accepted: the answer to a job or agent call.
    pub fn running(job_id: impl Into<String>, poll_after_s: u32) -> Self {
        Envelope::Running {
            job_id: job_id.into(),
            poll_after_s,
            state: None,
            attempts: None,
            progress: None,
            run_at: None,
            waiting_for: None,
        }
    }

    /// The status word on the wire.
    pub fn status(&self) -> &'static str {
        match self {
            Envelope::Ok { .. } => "ok",
            Envelope::Error { .. } => "error",
            Envelope::Running { .. } => "running",
            Envelope::Suspended { .. } => "suspended",
        }
    }

    /// True for an `ok` envelope.
    pub fn is_ok(&self) -> bool {
        matches!(self, Envelope::Ok { .. })
    }

    /// The result of an `ok` envelope.
    pub fn result(&self) -> Option<&Json> {
        match self {
            Envelope::Ok { result, .. } => Some(result),
            _ => None,
        }
    }

    /// The error of an `error` envelope.
    pub fn error_ref(&self) -> Option<&ToolError> {
        match self {
            Envelope::Error { error, .. } => Some(error),
            _ => None,
        }
    }

    /// The error code, for `error` envelopes.
    pub fn error_code(&self) -> Option<ErrorCode> {
        self.error_ref().map(|e| e.code)
    }

    /// The envelope as JSON text.
    pub fn to_json(&self) -> String {
        // Every field serialises infallibly: strings, numbers and Values.
        serde_json::to_string(self).unwrap_or_else(|_| {
            r#"{"status":"error","error":{"code":"tool_failed","message":"the result could not be encoded","retryable":false}}"#.to_owned()
        })
    }
}

impl From<ToolError> for Envelope {
    fn from(error: ToolError) -> Self {
        Envelope::error(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn envelopes_have_the_wire_form_of_the_contract() {
        let ok = Envelope::ok(Json::from(json!({"a": 1})), "c1");
        assert_eq!(
            serde_json::to_value(&ok).unwrap(),
            json!({"status": "ok", "result": {"a": 1}, "call_id": "c1"})
        );
        let err = Envelope::error(
            ToolError::new(ErrorCode::RateLimited, "slow down").with_retry_after(3),
        );
        assert_eq!(
            serde_json::to_value(&err).unwrap(),
            json!({"status": "error", "error": {"code": "rate_limited", "message": "slow down", "retryable": true, "retry_after_s": 3}})
        );
        let running = Envelope::running("j1", 20);
        assert_eq!(
            serde_json::to_value(&running).unwrap(),
            json!({"status": "running", "job_id": "j1", "poll_after_s": 20})
        );
        let suspended = Envelope::Suspended {
            ticket: "t1".into(),
            question: "which?".into(),
            options: vec!["a".into(), "b".into()],
            plan: None,
        };
        assert_eq!(
            serde_json::to_value(&suspended).unwrap(),
            json!({"status": "suspended", "ticket": "t1", "question": "which?", "options": ["a", "b"]})
        );
    }

    #[test]
    fn every_code_is_listed_once() {
        // Each arm names the code's place in `ALL`: a code added to the
        // enum stops this match from compiling until it has one.
        let place = |code: ErrorCode| match code {
            ErrorCode::UnknownTool => 0,
            ErrorCode::InvalidArguments => 1,
            ErrorCode::Forbidden => 2,
            ErrorCode::Unauthenticated => 3,
            ErrorCode::RateLimited => 4,
            ErrorCode::Timeout => 5,
            ErrorCode::ToolFailed => 6,
            ErrorCode::NotFound => 7,
            ErrorCode::Conflict => 8,
            ErrorCode::ConfirmRequired => 9,
            ErrorCode::InvalidConfirmToken => 10,
            ErrorCode::BudgetExceeded => 11,
            ErrorCode::Cancelled => 12,
            ErrorCode::Unavailable => 13,
            ErrorCode::PayloadTooLarge => 14,
            ErrorCode::BadRequest => 15,
            ErrorCode::Rejected => 16,
            ErrorCode::Expired => 17,
            ErrorCode::DeadLettered => 18,
        };
        for (i, code) in ErrorCode::ALL.into_iter().enumerate() {
            assert_eq!(place(code), i, "{code}");
            let wire = serde_json::to_value(code).unwrap();
            assert_eq!(wire, json!(code.as_str()));
        }
    }

    #[test]
    fn envelopes_read_back_what_they_write() {
        let env = Envelope::ok(Json::from(json!([1, 2])), "c");
        let back: Envelope = serde_json::from_str(&env.to_json()).unwrap();
        assert_eq!(back, env);
    }
}
