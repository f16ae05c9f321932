//! Model clients: one conversation shape, two wire formats.
//!
//! The loop speaks in [`Turn`]s (the task, the model's replies with their
//! tool calls, the tools' results) and asks a [`Model`] for the next reply.
//! Each client translates to its wire format over HTTP, with a timeout on
//! every request and retries with backoff on 429 and 5xx. The API key comes
//! from the environment or a secret file and is never logged: [`ApiKey`]
//! prints as `***`, and error messages never carry request headers.

mod anthropic;
mod http;
mod openai;
mod wire;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolfleet_core::config::{AgentSpec, ModelProvider};

pub use anthropic::Anthropic;
pub use anthropic::{ANTHROPIC_VERSION, AnthropicModel};
pub use http::{DEFAULT_MIN_DELAY, DEFAULT_RETRIES, KeyHeader, MAX_REPLY_BYTES, MAX_RETRY_AFTER};
pub use openai::{OpenAi, OpenAiModel};
pub use wire::{Wire, WireModel};

/// A tool as the model is offered it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The registered tool's name.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON Schema of the arguments.
    pub input_schema: Value,
}

/// A tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The model's id of the call; the result names it.
    pub id: String,
    /// The tool the model wants called.
    pub name: String,
    /// The arguments as the model sent them: a JSON value, or, when the
    /// model's text was not JSON, that text as a JSON string.
    pub args: Value,
}

/// What a tool call came to, as the model is told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The model's id of the call this answers.
    pub call_id: String,
    /// The tool that was called.
    pub name: String,
    /// Text for the model: the result's JSON, or an error it can act on.
    pub content: String,
    /// The call failed; `content` says why.
    pub is_error: bool,
}

/// One turn of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Turn {
    /// The task, from the caller.
    User {
        /// What the agent is asked to do.
        text: String,
    },
    /// A reply of the model: text, tool calls, or both.
    Assistant {
        /// What the model said, if anything.
        text: Option<String>,
        /// The tool calls it asked for, in its order.
        calls: Vec<ToolCall>,
    },
    /// The results of the previous reply's tool calls, in its order.
    Tool {
        /// One result per call, in the reply's order.
        results: Vec<ToolResult>,
    },
}

/// Tokens a model call used, as the model reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens the model read.
    pub input_tokens: u64,
    /// Tokens the model wrote.
    pub output_tokens: u64,
}

impl Usage {
    /// Input plus output tokens.
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// Adds another call's usage to this one.
    pub fn add(&mut self, other: Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
    }
}

/// What the loop asks of a model.
#[derive(Debug, Clone, Copy)]
pub struct ModelRequest<'a> {
    /// The agent's system prompt.
    pub system: &'a str,
    /// The conversation so far.
    pub turns: &'a [Turn],
    /// The tools the agent may call.
    pub tools: &'a [ToolSpec],
    /// Output tokens the reply may use.
    pub max_output_tokens: u32,
}

/// The model's next reply.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelReply {
    /// What the model said, if anything.
    pub text: Option<String>,
    /// The tool calls it asked for; none ends the loop.
    pub calls: Vec<ToolCall>,
    /// Tokens the call used.
    pub usage: Usage,
}

/// Why a model call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelError {
    /// Unreachable, timed out, or 429/5xx after every retry.
    Unavailable(String),
    /// Refused the request (4xx other than 429): key, model name, request.
    Refused(String),
    /// Answered something that is not a reply of its wire format.
    Malformed(String),
}

impl std::fmt::Display for ModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelError::Unavailable(m) => write!(f, "model unavailable: {m}"),
            ModelError::Refused(m) => write!(f, "model refused the request: {m}"),
            ModelError::Malformed(m) => write!(f, "model answered malformed: {m}"),
        }
    }
}

impl std::error::Error for ModelError {}

/// A model endpoint.
#[async_trait]
pub trait Model: Send + Sync {
    /// Asks the model for its next reply to the conversation in `request`.
    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelReply, ModelError>;
}

/// An API key. It prints as `***`, so it can sit in structs that are
/// logged; only the clients read it, to set their header.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps the key text.
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// The agent's API key: the variable `api_key_env` names, or the trimmed
/// contents of `api_key_file`; `None` when neither is given, which local
/// servers accept. Errors name the variable or file, never a value.
pub fn api_key(spec: &AgentSpec) -> Result<Option<ApiKey>, String> {
    let key = match (&spec.api_key_env, &spec.api_key_file) {
        (Some(_), Some(_)) => {
            return Err("give api_key_env or api_key_file, not both".to_owned());
        }
        (None, None) => return Ok(None),
        (Some(var), None) => match std::env::var(var) {
            Ok(key) => (
                key.trim().to_owned(),
                format!("environment variable `{var}`"),
            ),
            Err(std::env::VarError::NotPresent) => {
                return Err(format!(
                    "the API key's environment variable `{var}` is not set"
                ));
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(format!(
                    "the API key's environment variable `{var}` is not valid UTF-8"
                ));
            }
        },
        (None, Some(path)) => match std::fs::read_to_string(path) {
            Ok(key) => (key.trim().to_owned(), format!("file `{path}`")),
            // io::Error's text names the cause, never the contents.
            Err(e) => return Err(format!("cannot read the API key file `{path}`: {e}")),
        },
    };
    match key {
        (key, source) if key.is_empty() => Err(format!("the API key's {source} is empty")),
        (key, _) => Ok(Some(ApiKey(key))),
    }
}

/// The client of `spec.provider` for `spec.model` at `spec.base_url`, with
/// `spec.timeout_s` on every attempt (so one call may take up to
/// `(1 + DEFAULT_RETRIES) * timeout_s` plus backoff; the loop's wall budget
/// bounds the whole) and [`DEFAULT_RETRIES`] retries on 429, 5xx, connect
/// failures and timeouts.
pub fn model_for(spec: &AgentSpec, client: reqwest::Client) -> Result<Arc<dyn Model>, String> {
    let timeout = Duration::try_from_secs_f64(spec.timeout_s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            format!(
                "timeout_s must be a positive number of seconds, got {}",
                spec.timeout_s
            )
        })?;
    if spec.model.trim().is_empty() {
        return Err("model must name the model to call".to_owned());
    }
    let key = api_key(spec)?;
    Ok(match spec.provider {
        ModelProvider::Openai => Arc::new(OpenAiModel::new(
            client,
            &spec.base_url,
            &spec.model,
            key,
            timeout,
        )?),
        ModelProvider::Anthropic => Arc::new(AnthropicModel::new(
            client,
            &spec.base_url,
            &spec.model,
            key,
            timeout,
        )?),
    })
}
