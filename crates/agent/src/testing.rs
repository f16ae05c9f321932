//! A scripted model server for tests, here and in other crates: it speaks
//! the real OpenAI Chat Completions (`POST /v1/chat/completions`) and
//! Anthropic Messages (`POST /v1/messages`) wire formats over HTTP and
//! answers from a script.
//!
//! It owns the checking of what a client sends: a request that the real API
//! would refuse (roles out of order, a tool result that answers no call, a
//! missing header, arguments of the wrong type) gets a 400 in the route's
//! error format naming the reason, so client bugs show up in tests rather
//! than in production. It must never answer differently to the same
//! conversation: the reply is chosen by the request's `model` and its step,
//! the number of assistant messages already in it, so a client that restarts
//! and sends the conversation again gets the same reply.
//!
//! The server runs on a thread of its own, so a test may block (waiting on a
//! child process, say) without stalling it. It stops when dropped.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Map, Value, json};
use tokio::sync::oneshot;

use crate::model::Usage;

/// One scripted reply of the model.
#[derive(Debug, Clone, PartialEq)]
pub enum Scripted {
    /// Calls tools: `(tool, arguments)` in order. The call ids are
    /// `call_<step>_<n>`, `n` counting from 0 within the reply.
    Calls {
        /// The tool calls, `(tool, arguments)` in order.
        calls: Vec<(String, Value)>,
        /// The tokens the reply reports.
        usage: Usage,
    },
    /// Answers with text and no calls.
    Answer {
        /// The answer.
        text: String,
        /// The tokens the reply reports.
        usage: Usage,
    },
    /// Waits, then replies; for timeouts.
    Delay(Duration, Box<Scripted>),
}

/// In a scripted call's arguments, this string stands for the last
/// `confirm_token` the conversation shows (a dry run's result): a model
/// commits with the token its dry run answered, which no script can know.
pub const CONFIRM_TOKEN: &str = "{{confirm_token}}";

/// `reply` with [`CONFIRM_TOKEN`] replaced by the last confirm token found
/// in `request`'s messages.
fn with_confirm_token(reply: Scripted, request: &Value) -> Scripted {
    let Scripted::Calls { calls, usage } = reply else {
        return reply;
    };
    let text = request.to_string();
    let token = text.rmatch_indices("ct1.").next().map(|(at, _)| {
        text[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '.')
            .collect::<String>()
    });
    let calls = calls
        .into_iter()
        .map(|(name, mut args)| {
            if let (Some(token), Some(map)) = (&token, args.as_object_mut()) {
                for value in map.values_mut() {
                    if value == CONFIRM_TOKEN {
                        *value = Value::String(token.clone());
                    }
                }
            }
            (name, args)
        })
        .collect();
    Scripted::Calls { calls, usage }
}

/// The largest request body read.
const MAX_REQUEST_BYTES: usize = 16 << 20;

/// A scripted model server on `127.0.0.1`; see the module documentation.
pub struct ScriptedModel {
    addr: SocketAddr,
    state: Arc<Mutex<ServerState>>,
    shutdown: Option<oneshot::Sender<()>>,
}

#[derive(Default)]
struct ServerState {
    key: Option<String>,
    models: HashMap<String, ModelState>,
}

#[derive(Default)]
struct ModelState {
    script: Vec<Scripted>,
    failures: VecDeque<StatusCode>,
    requests: Vec<Value>,
}

type Shared = Arc<Mutex<ServerState>>;

impl ScriptedModel {
    /// Starts a server on a free port of `127.0.0.1`.
    ///
    /// # Panics
    ///
    /// When no port can be bound or no thread started; see [`Self::try_start`].
    pub async fn start() -> Self {
        match Self::try_start() {
            Ok(server) => server,
            Err(e) => panic!("the scripted model server could not start: {e}"),
        }
    }

    /// Starts a server on a free port of `127.0.0.1`, on a thread of its own.
    pub fn try_start() -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let listener = {
            let _context = runtime.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        let state = Shared::default();
        let app = Router::new()
            .route("/v1/chat/completions", post(chat_completions))
            .route("/v1/messages", post(messages))
            .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
            .with_state(state.clone());
        let (shutdown, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(format!("scripted-model-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::select! {
                        _ = axum::serve(listener, app) => {}
                        _ = stopped => {}
                    }
                });
            })?;
        Ok(ScriptedModel {
            addr,
            state,
            shutdown: Some(shutdown),
        })
    }

    /// The API root to configure as `base_url`: `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Sets the replies of `model`, one per step, replacing any before.
    pub fn script(&self, model: &str, replies: Vec<Scripted>) {
        lock(&self.state).model(model).script = replies;
    }

    /// Answers `status` to the next `times` requests for `model` (after the
    /// key check), with `Retry-After: 0` on a 429, before the script resumes.
    /// Calls add up: failures queue in the order given.
    ///
    /// # Panics
    ///
    /// When `status` is not an HTTP status code.
    pub fn fail_next(&self, model: &str, status: u16, times: usize) {
        let status = match StatusCode::from_u16(status) {
            Ok(status) => status,
            Err(_) => panic!("fail_next: {status} is not an HTTP status code"),
        };
        let mut state = lock(&self.state);
        let failures = &mut state.model(model).failures;
        failures.extend(std::iter::repeat_n(status, times));
    }

    /// Every JSON body naming `model` received so far, in order, whatever
    /// was answered to it.
    pub fn requests(&self, model: &str) -> Vec<Value> {
        lock(&self.state)
            .models
            .get(model)
            .map(|m| m.requests.clone())
            .unwrap_or_default()
    }

    /// From now on, refuses with 401 every request that does not carry
    /// `key` in its format's header (`Authorization: Bearer` or `x-api-key`).
    pub fn expect_key(&self, key: &str) {
        lock(&self.state).key = Some(key.to_owned());
    }
}

impl Drop for ScriptedModel {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            // The server may already be gone; there is nothing left to stop then.
            let _ = shutdown.send(());
        }
    }
}

impl std::fmt::Debug for ScriptedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedModel")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl ServerState {
    fn model(&mut self, model: &str) -> &mut ModelState {
        self.models.entry(model.to_owned()).or_default()
    }
}

/// A panic elsewhere while the lock was held leaves plain data behind.
fn lock(state: &Mutex<ServerState>) -> MutexGuard<'_, ServerState> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn chat_completions(
    State(state): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    serve(Wire::OpenAi, &state, &headers, &body).await
}

async fn messages(State(state): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    serve(Wire::Anthropic, &state, &headers, &body).await
}

/// What to answer to one request, decided under the lock.
enum Decision {
    Refuse(StatusCode, String),
    Fail(StatusCode),
    Reply(Scripted),
}

async fn serve(wire: Wire, state: &Shared, headers: &HeaderMap, body: &[u8]) -> Response {
    let request: Value = match serde_json::from_slice(body) {
        Ok(request) => request,
        Err(e) => {
            return wire.error(
                StatusCode::BAD_REQUEST,
                &format!("the body is not JSON: {e}"),
            );
        }
    };
    let Some(model) = request
        .get("model")
        .and_then(Value::as_str)
        .map(str::to_owned)
    else {
        return wire.error(StatusCode::BAD_REQUEST, "the request names no `model`");
    };
    let step = step(&request);
    let checked = wire.check(headers, &request);
    let decision = {
        let mut state = lock(state);
        let key_ok = state
            .key
            .as_deref()
            .is_none_or(|key| wire.has_key(headers, key));
        let entry = state.model(&model);
        entry.requests.push(request.clone());
        if !key_ok {
            Decision::Refuse(StatusCode::UNAUTHORIZED, wire.bad_key().to_owned())
        } else if let Some(status) = entry.failures.pop_front() {
            Decision::Fail(status)
        } else if let Err(reason) = checked {
            Decision::Refuse(StatusCode::BAD_REQUEST, reason)
        } else if let Some(reply) = entry.script.get(step) {
            Decision::Reply(reply.clone())
        } else {
            let message = format!(
                "the script of model `{model}` has no reply for step {step} (it has {} steps)",
                entry.script.len()
            );
            Decision::Refuse(StatusCode::BAD_REQUEST, message)
        }
    };
    match decision {
        Decision::Refuse(status, message) => wire.error(status, &message),
        Decision::Fail(status) => {
            let mut response = wire.error(status, "scripted failure");
            if status == StatusCode::TOO_MANY_REQUESTS {
                let zero = HeaderValue::from_static("0");
                response.headers_mut().insert(header::RETRY_AFTER, zero);
            }
            response
        }
        Decision::Reply(mut reply) => {
            while let Scripted::Delay(delay, next) = reply {
                tokio::time::sleep(delay).await;
                reply = *next;
            }
            let reply = with_confirm_token(reply, &request);
            (StatusCode::OK, axum::Json(wire.reply(&model, step, reply))).into_response()
        }
    }
}

/// The number of assistant messages already in the conversation.
fn step(request: &Value) -> usize {
    request
        .get("messages")
        .and_then(Value::as_array)
        .map_or(0, |messages| {
            messages
                .iter()
                .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
                .count()
        })
}

/// The wire format of a route.
#[derive(Debug, Clone, Copy)]
enum Wire {
    OpenAi,
    Anthropic,
}

impl Wire {
    fn has_key(self, headers: &HeaderMap, key: &str) -> bool {
        let sent = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        match self {
            Wire::OpenAi => sent("authorization") == Some(&format!("Bearer {key}")),
            Wire::Anthropic => sent("x-api-key") == Some(key),
        }
    }

    fn bad_key(self) -> &'static str {
        match self {
            Wire::OpenAi => "Incorrect API key provided.",
            Wire::Anthropic => "invalid x-api-key",
        }
    }

    /// An error in the route's format.
    fn error(self, status: StatusCode, message: &str) -> Response {
        let kind = match status.as_u16() {
            400 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            529 => "overloaded_error",
            500..=599 => "api_error",
            _ => "invalid_request_error",
        };
        let body = match self {
            Wire::OpenAi => json!({
                "error": {"message": message, "type": kind, "param": null, "code": null},
            }),
            Wire::Anthropic => json!({
                "type": "error",
                "error": {"type": kind, "message": message},
            }),
        };
        (status, axum::Json(body)).into_response()
    }

    fn check(self, headers: &HeaderMap, request: &Value) -> Result<(), String> {
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !content_type.starts_with("application/json") {
            return Err(format!(
                "content-type must be application/json, not `{content_type}`"
            ));
        }
        match self {
            Wire::OpenAi => check_openai(request),
            Wire::Anthropic => {
                if !headers.contains_key("anthropic-version") {
                    return Err("the anthropic-version header is missing".to_owned());
                }
                check_anthropic(request)
            }
        }
    }

    /// A reply of the script (no longer a delay) in the route's format.
    fn reply(self, model: &str, step: usize, reply: Scripted) -> Value {
        let (text, calls, usage) = match reply {
            Scripted::Calls { calls, usage } => (None, calls, usage),
            Scripted::Answer { text, usage } => (Some(text), Vec::new(), usage),
            Scripted::Delay(_, next) => return self.reply(model, step, *next),
        };
        let calls = calls
            .into_iter()
            .enumerate()
            .map(|(n, (name, args))| (format!("call_{step}_{n}"), name, args));
        match self {
            Wire::OpenAi => {
                let calls: Vec<Value> = calls
                    .map(|(id, name, args)| {
                        json!({
                            "id": id,
                            "type": "function",
                            "function": {"name": name, "arguments": args.to_string()},
                        })
                    })
                    .collect();
                let finish = if calls.is_empty() {
                    "stop"
                } else {
                    "tool_calls"
                };
                let mut message = Map::new();
                message.insert("role".into(), json!("assistant"));
                message.insert("content".into(), json!(text));
                if !calls.is_empty() {
                    message.insert("tool_calls".into(), calls.into());
                }
                json!({
                    "id": format!("chatcmpl-{step}"),
                    "object": "chat.completion",
                    "created": 0,
                    "model": model,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": {
                        "prompt_tokens": usage.input_tokens,
                        "completion_tokens": usage.output_tokens,
                        "total_tokens": usage.total(),
                    },
                })
            }
            Wire::Anthropic => {
                let text = text.map(|text| json!({"type": "text", "text": text}));
                let uses = calls.map(|(id, name, input)| {
                    json!({"type": "tool_use", "id": id, "name": name, "input": input})
                });
                let content: Vec<Value> = text.into_iter().chain(uses).collect();
                let uses_tools = content.iter().any(|b| b["type"] == "tool_use");
                json!({
                    "id": format!("msg_{step}"),
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": content,
                    "stop_reason": if uses_tools { "tool_use" } else { "end_turn" },
                    "stop_sequence": null,
                    "usage": {
                        "input_tokens": usage.input_tokens,
                        "output_tokens": usage.output_tokens,
                    },
                })
            }
        }
    }
}

type Checked = Result<(), String>;

fn object<'a>(value: &'a Value, at: &str) -> Result<&'a Map<String, Value>, String> {
    value
        .as_object()
        .ok_or_else(|| format!("{at} must be an object"))
}

fn text<'a>(value: Option<&'a Value>, at: &str) -> Result<&'a str, String> {
    value
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{at} must be a string"))
}

fn array<'a>(value: Option<&'a Value>, at: &str) -> Result<&'a [Value], String> {
    match value.and_then(Value::as_array) {
        Some(items) if !items.is_empty() => Ok(items),
        Some(_) => Err(format!("{at} must not be empty")),
        None => Err(format!("{at} must be an array")),
    }
}

fn max_tokens(body: &Map<String, Value>, required: bool) -> Checked {
    match body.get("max_tokens") {
        None if !required => Ok(()),
        Some(n) if n.as_u64().is_some_and(|n| n > 0) => Ok(()),
        _ => Err("max_tokens must be a positive integer".to_owned()),
    }
}

/// The names both APIs accept for a tool.
fn tool_name(name: &str, at: &str) -> Checked {
    let valid = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{at} `{name}` must be 1 to 64 characters of a-z A-Z 0-9 _ -"
        ))
    }
}

/// The offered tools: `name_of` checks one and returns its name.
fn tools(
    body: &Map<String, Value>,
    name_of: fn(&Value, &str) -> Result<String, String>,
) -> Checked {
    let Some(tools) = body.get("tools") else {
        return Ok(());
    };
    let tools = tools.as_array().ok_or("tools must be an array")?;
    let mut names = Vec::with_capacity(tools.len());
    for (n, tool) in tools.iter().enumerate() {
        let name = name_of(tool, &format!("tools[{n}]"))?;
        if names.contains(&name) {
            return Err(format!("tools[{n}]: the tool `{name}` is offered twice"));
        }
        names.push(name);
    }
    Ok(())
}

fn check_openai(request: &Value) -> Checked {
    let body = object(request, "the body")?;
    max_tokens(body, false)?;
    tools(body, |tool, at| {
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return Err(format!("{at}.type must be \"function\""));
        }
        let function = tool
            .get("function")
            .ok_or(format!("{at}.function is missing"))?;
        let name = text(function.get("name"), &format!("{at}.function.name"))?;
        tool_name(name, &format!("{at}.function.name"))?;
        if function.get("parameters").is_some_and(|p| !p.is_object()) {
            return Err(format!(
                "{at}.function.parameters must be a JSON Schema object"
            ));
        }
        Ok(name.to_owned())
    })?;
    let messages = array(body.get("messages"), "messages")?;
    // The ids of the last assistant message's tool calls not yet answered.
    let mut pending: Vec<String> = Vec::new();
    let mut asked_at = 0;
    for (i, message) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = text(message.get("role"), &format!("{at}.role"))?;
        if role == "tool" {
            let id = text(message.get("tool_call_id"), &format!("{at}.tool_call_id"))?;
            let Some(k) = pending.iter().position(|p| p == id) else {
                return Err(format!(
                    "{at} answers tool call `{id}`, which is not an unanswered call of the assistant message before it"
                ));
            };
            pending.remove(k);
            openai_content(message.get("content"), &at, false)?;
            continue;
        }
        if !pending.is_empty() {
            return Err(format!(
                "{at}: the tool calls {} of messages[{asked_at}] have no tool message",
                pending.join(", ")
            ));
        }
        match role {
            "system" | "developer" | "user" => openai_content(message.get("content"), &at, false)?,
            "assistant" => {
                pending = openai_assistant(message, &at)?;
                asked_at = i;
            }
            other => {
                return Err(format!(
                    "{at}.role `{other}` is not system, developer, user, assistant or tool"
                ));
            }
        }
    }
    if pending.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the tool calls {} of messages[{asked_at}] have no tool message",
            pending.join(", ")
        ))
    }
}

fn openai_content(content: Option<&Value>, at: &str, nullable: bool) -> Checked {
    match content {
        Some(Value::String(_)) => Ok(()),
        Some(Value::Array(parts))
            if parts
                .iter()
                .all(|p| p.get("type").is_some_and(Value::is_string)) =>
        {
            Ok(())
        }
        None | Some(Value::Null) if nullable => Ok(()),
        _ => Err(format!(
            "{at}.content must be a string or an array of typed parts"
        )),
    }
}

/// Checks an assistant message and returns the ids of its tool calls.
fn openai_assistant(message: &Value, at: &str) -> Result<Vec<String>, String> {
    openai_content(message.get("content"), at, true)?;
    let calls = match message.get("tool_calls") {
        None | Some(Value::Null) => &[][..],
        Some(calls) => array(Some(calls), &format!("{at}.tool_calls"))?,
    };
    if calls.is_empty() && message.get("content").is_none_or(Value::is_null) {
        return Err(format!(
            "{at}: an assistant message needs content or tool_calls"
        ));
    }
    let mut ids = Vec::with_capacity(calls.len());
    for (n, call) in calls.iter().enumerate() {
        let at = format!("{at}.tool_calls[{n}]");
        let id = text(call.get("id"), &format!("{at}.id"))?;
        if id.is_empty() || ids.iter().any(|seen| seen == id) {
            return Err(format!("{at}.id must be a unique, non-empty id"));
        }
        if call.get("type").and_then(Value::as_str) != Some("function") {
            return Err(format!("{at}.type must be \"function\""));
        }
        let function = call
            .get("function")
            .ok_or(format!("{at}.function is missing"))?;
        text(function.get("name"), &format!("{at}.function.name"))?;
        text(
            function.get("arguments"),
            &format!("{at}.function.arguments (JSON text)"),
        )?;
        ids.push(id.to_owned());
    }
    Ok(ids)
}

fn check_anthropic(request: &Value) -> Checked {
    let body = object(request, "the body")?;
    max_tokens(body, true)?;
    match body.get("system") {
        None | Some(Value::String(_)) => {}
        Some(Value::Array(blocks))
            if blocks
                .iter()
                .all(|b| b["type"] == "text" && b["text"].is_string()) => {}
        Some(_) => return Err("system must be a string or an array of text blocks".to_owned()),
    }
    tools(body, |tool, at| {
        let name = text(tool.get("name"), &format!("{at}.name"))?;
        tool_name(name, &format!("{at}.name"))?;
        if !tool.get("input_schema").is_some_and(Value::is_object) {
            return Err(format!("{at}.input_schema must be a JSON Schema object"));
        }
        if tool.get("description").is_some_and(|d| !d.is_string()) {
            return Err(format!("{at}.description must be a string"));
        }
        Ok(name.to_owned())
    })?;
    let messages = array(body.get("messages"), "messages")?;
    // The ids of the last assistant message's tool uses.
    let mut pending: Vec<String> = Vec::new();
    let mut last_role = "";
    for (i, message) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = text(message.get("role"), &format!("{at}.role"))?;
        match (i, role) {
            (0, "assistant") => return Err("messages[0] must be a user message".to_owned()),
            (_, "user" | "assistant") if role == last_role => {
                return Err(format!(
                    "{at} is a second `{role}` message in a row: roles must alternate"
                ));
            }
            (_, "user" | "assistant") => {}
            (_, other) => return Err(format!("{at}.role `{other}` is not user or assistant")),
        }
        let blocks = anthropic_blocks(message.get("content"), &at)?;
        if role == "user" {
            anthropic_results(&blocks, &mut pending, &at, i)?;
        } else {
            pending = anthropic_uses(&blocks, &at)?;
        }
        last_role = role;
    }
    if pending.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the tool_use blocks {} of the last message have no tool_result",
            pending.join(", ")
        ))
    }
}

/// The content as blocks: a string is one text block.
fn anthropic_blocks(content: Option<&Value>, at: &str) -> Result<Vec<Value>, String> {
    let blocks = match content {
        Some(Value::String(text)) => vec![json!({"type": "text", "text": text})],
        other => array(other, &format!("{at}.content"))?.to_vec(),
    };
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        let kind = text(block.get("type"), &format!("{at}.type"))?;
        if kind == "text"
            && text(block.get("text"), &format!("{at}.text"))?
                .trim()
                .is_empty()
        {
            return Err(format!(
                "{at}: text blocks must contain non-whitespace text"
            ));
        }
    }
    Ok(blocks)
}

/// Checks that a user message answers every pending tool use, with its
/// tool_result blocks first.
fn anthropic_results(blocks: &[Value], pending: &mut Vec<String>, at: &str, i: usize) -> Checked {
    let mut others = false;
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        if block["type"] != "tool_result" {
            others = true;
            continue;
        }
        if others {
            return Err(format!(
                "{at}: tool_result blocks must come before any other block"
            ));
        }
        let id = text(block.get("tool_use_id"), &format!("{at}.tool_use_id"))?;
        let Some(k) = pending.iter().position(|p| p == id) else {
            return Err(format!(
                "{at} answers tool_use `{id}`, which is not an unanswered tool_use of the previous message"
            ));
        };
        pending.remove(k);
        match block.get("content") {
            None | Some(Value::String(_) | Value::Array(_)) => {}
            Some(_) => {
                return Err(format!(
                    "{at}.content must be a string or an array of blocks"
                ));
            }
        }
        if block.get("is_error").is_some_and(|e| !e.is_boolean()) {
            return Err(format!("{at}.is_error must be a boolean"));
        }
    }
    if pending.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{at} has no tool_result for the tool_use blocks {} of messages[{}]",
            pending.join(", "),
            i.saturating_sub(1)
        ))
    }
}

/// Checks an assistant message and returns the ids of its tool uses.
fn anthropic_uses(blocks: &[Value], at: &str) -> Result<Vec<String>, String> {
    let mut ids: Vec<String> = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        match block["type"].as_str() {
            Some("tool_use") => {
                let id = text(block.get("id"), &format!("{at}.id"))?;
                if id.is_empty() || ids.iter().any(|seen| seen == id) {
                    return Err(format!("{at}.id must be a unique, non-empty id"));
                }
                text(block.get("name"), &format!("{at}.name"))?;
                if !block.get("input").is_some_and(Value::is_object) {
                    return Err(format!("{at}.input must be an object"));
                }
                ids.push(id.to_owned());
            }
            Some("tool_result") => {
                return Err(format!("{at}: tool_result blocks belong in user messages"));
            }
            _ => {}
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn openai(messages: Value) -> Checked {
        check_openai(&json!({"model": "m", "messages": messages}))
    }

    fn anthropic(messages: Value) -> Checked {
        check_anthropic(&json!({"model": "m", "max_tokens": 5, "messages": messages}))
    }

    fn call(id: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}})
    }

    #[test]
    fn openai_tool_messages_must_answer_the_calls() {
        let user = json!({"role": "user", "content": "go"});
        let asked =
            json!({"role": "assistant", "content": null, "tool_calls": [call("a"), call("b")]});
        let answer = |id: &str| json!({"role": "tool", "tool_call_id": id, "content": "ok"});
        assert_eq!(
            openai(json!([user, asked, answer("b"), answer("a")])),
            Ok(())
        );
        let missing = openai(json!([user, asked, answer("a")])).unwrap_err();
        assert!(missing.contains("tool calls b of messages[1]"), "{missing}");
        let stray = openai(json!([user, answer("a")])).unwrap_err();
        assert!(stray.contains("`a`"), "{stray}");
        let twice = openai(json!([user, asked, answer("a"), answer("a")])).unwrap_err();
        assert!(twice.contains("messages[3]"), "{twice}");
        let object_args = json!({"role": "assistant", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": {}}}]});
        assert!(
            openai(json!([user, object_args]))
                .unwrap_err()
                .contains("arguments")
        );
        let empty = json!({"role": "assistant", "content": null});
        assert!(openai(json!([user, empty])).is_err());
        assert!(openai(json!([])).is_err());
    }

    #[test]
    fn anthropic_roles_alternate_and_results_answer_uses() {
        let user = json!({"role": "user", "content": "go"});
        let uses = json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": "a", "name": "f", "input": {}}]});
        let result = |id: &str| {
            json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": "ok", "is_error": false}]})
        };
        assert_eq!(anthropic(json!([user, uses, result("a")])), Ok(()));
        assert!(
            anthropic(json!([user, user]))
                .unwrap_err()
                .contains("alternate")
        );
        assert!(
            anthropic(json!([uses]))
                .unwrap_err()
                .contains("messages[0]")
        );
        assert!(
            anthropic(json!([user, uses, result("b")]))
                .unwrap_err()
                .contains("`b`")
        );
        assert!(
            anthropic(json!([user, uses, user]))
                .unwrap_err()
                .contains("no tool_result")
        );
        assert!(
            anthropic(json!([user, uses]))
                .unwrap_err()
                .contains("no tool_result")
        );
        let late = json!({"role": "user", "content": [
            {"type": "text", "text": "first"},
            {"type": "tool_result", "tool_use_id": "a", "content": "ok"}]});
        assert!(
            anthropic(json!([user, uses, late]))
                .unwrap_err()
                .contains("before")
        );
        let blank = json!({"role": "user", "content": " "});
        assert!(
            anthropic(json!([blank]))
                .unwrap_err()
                .contains("non-whitespace")
        );
        let no_max = check_anthropic(&json!({"model": "m", "messages": [user]}));
        assert!(no_max.unwrap_err().contains("max_tokens"));
    }

    #[test]
    fn tool_names_follow_the_apis() {
        let offer = |name: &str| {
            check_anthropic(&json!({"model": "m", "max_tokens": 5,
                "messages": [{"role": "user", "content": "go"}],
                "tools": [{"name": name, "input_schema": {"type": "object"}}]}))
        };
        assert_eq!(offer("find_things-2"), Ok(()));
        assert!(offer("things.find").unwrap_err().contains("things.find"));
        assert!(offer("").is_err());
    }

    #[test]
    fn steps_count_assistant_messages() {
        let request = json!({"messages": [
            {"role": "user"}, {"role": "assistant"}, {"role": "tool"}, {"role": "assistant"}]});
        assert_eq!(step(&request), 2);
        assert_eq!(step(&json!({})), 0);
    }
}
