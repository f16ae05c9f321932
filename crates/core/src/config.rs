//! Tool declarations from configuration: the `[[tools]]` tables of a
//! `toolfleet.toml`, with each schema inline or in a JSON file.
//!
//! This module parses text; reading a schema file is the caller's, through
//! the `read_file` function it passes, so the core does no I/O. The executor
//! is named here ([`ExecutorSpec`]) and bound by the caller, which knows the
//! builtin functions and how to call out over HTTP or run a program.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::middleware::RateLimit;
use crate::tool::{AnsweredBy, Executor, Hints, MiddlewareSpec, Shape, ToolDecl};

/// A configuration that could not be read, with where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Where the configuration is wrong and why, for the operator.
    pub message: String,
}

impl ConfigError {
    fn new(message: impl Into<String>) -> Self {
        ConfigError {
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// How a tool's work is done.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ExecutorSpec {
    /// A Rust function registered under `name`.
    Builtin {
        /// The name the function is registered under.
        name: String,
    },
    /// POST the arguments as JSON to `url`.
    Http {
        /// The service's endpoint.
        url: String,
        /// Headers sent with every request.
        #[serde(default)]
        headers: BTreeMap<String, String>,
        /// How long one request may take, in seconds.
        timeout_s: Option<f64>,
    },
    /// Run `program` with the arguments as JSON on standard input.
    Exec {
        /// The program to run.
        program: String,
        /// The program's command-line arguments.
        #[serde(default)]
        args: Vec<String>,
        /// How long one run may take, in seconds.
        timeout_s: Option<f64>,
        /// Variables set to these values in the program's environment.
        #[serde(default)]
        env: BTreeMap<String, String>,
        /// Variables copied from toolfleet's own environment, where set.
        #[serde(default)]
        pass_env: Vec<String>,
    },
    /// A sub-agent's loop (tools of shape `agent` only): declared inline,
    /// or naming a declared assistant (`agent = "NAME"`).
    Agent(AgentRef),
}

/// The loop of an agent tool: its spec, or the name of an `[[agents]]`
/// declaration, which [`resolve_agents`] replaces with that one's spec.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentRef {
    /// Declared in the tool's own table.
    Inline(Box<AgentSpec>),
    /// The declared assistant of this name.
    Named(String),
}

impl AgentRef {
    /// The spec, once resolved; `None` for a name not yet resolved.
    pub fn spec(&self) -> Option<&AgentSpec> {
        match self {
            AgentRef::Inline(spec) => Some(spec),
            AgentRef::Named(_) => None,
        }
    }
}

impl<'de> Deserialize<'de> for AgentRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let table = toml::Table::deserialize(d)?;
        match table.get("agent") {
            Some(toml::Value::String(name)) if table.len() == 1 => {
                Ok(AgentRef::Named(name.clone()))
            }
            Some(toml::Value::String(_)) => Err(D::Error::custom(
                "an agent executor naming a declared assistant (`agent = \"NAME\"`) takes no other key: declare the rest in its [[agents]] table",
            )),
            Some(_) => Err(D::Error::custom(
                "`agent` names a declared assistant: a string",
            )),
            None => AgentSpec::deserialize(toml::Value::Table(table))
                .map(|spec| AgentRef::Inline(Box::new(spec)))
                .map_err(D::Error::custom),
        }
    }
}

/// An assistant declared once in an `[[agents]]` table: started as a run
/// (`POST /v1/runs`), or named by agent tools.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentDecl {
    /// The name runs and agent tools name it by.
    pub name: String,
    /// What it does, for people choosing one.
    pub description: String,
    /// Its model, prompt, tools, scopes and budgets.
    pub spec: AgentSpec,
    /// The command tools whose commits, when it makes them, wait for its
    /// user's approval.
    pub approve: Vec<String>,
    /// The worker pool its runs' loops run on (the agents' pool by default).
    pub pool: Option<String>,
}

impl<'de> Deserialize<'de> for AgentDecl {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut table = toml::Table::deserialize(d)?;
        let mut take = |key: &str| table.remove(key);
        let name = match take("name") {
            Some(toml::Value::String(name)) => name,
            _ => {
                return Err(D::Error::custom(
                    "an [[agents]] table needs `name`, a string",
                ));
            }
        };
        let text = |v: Option<toml::Value>, key: &str| match v {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(D::Error::custom(format!(
                "agent `{name}`: `{key}` is a string"
            ))),
        };
        let description = text(take("description"), "description")?.unwrap_or_default();
        let pool = text(take("pool"), "pool")?;
        let approve = match take("approve") {
            None => Vec::new(),
            Some(v) => Vec::<String>::deserialize(v).map_err(|e| {
                D::Error::custom(format!("agent `{name}`: `approve` lists tool names: {e}"))
            })?,
        };
        let spec = AgentSpec::deserialize(toml::Value::Table(table))
            .map_err(|e| D::Error::custom(format!("agent `{name}`: {e}")))?;
        Ok(AgentDecl {
            name,
            description,
            spec,
            approve,
            pool,
        })
    }
}

/// The `[[agents]]` tables of a configuration file; other keys are ignored here.
pub fn parse_agents(text: &str) -> Result<Vec<AgentDecl>, ConfigError> {
    #[derive(Deserialize)]
    struct AgentTables {
        #[serde(default)]
        agents: Vec<AgentDecl>,
    }
    toml::from_str::<AgentTables>(text)
        .map(|t| t.agents)
        .map_err(|e| ConfigError::new(format!("agent configuration: {e}")))
}

/// Replaces each agent tool's `agent = "NAME"` with the spec of the
/// assistant of that name; an unknown name is refused, naming those known.
pub fn resolve_agents(tools: &mut [ToolConfig], agents: &[AgentDecl]) -> Result<(), ConfigError> {
    for tool in tools {
        let Some(ExecutorSpec::Agent(agent)) = &mut tool.executor else {
            continue;
        };
        let AgentRef::Named(name) = agent else {
            continue;
        };
        let Some(decl) = agents.iter().find(|a| &a.name == name) else {
            let known: Vec<&str> = agents.iter().map(|a| a.name.as_str()).collect();
            return Err(ConfigError::new(format!(
                "tool `{}`: no assistant named `{name}` is declared in [[agents]]; declared: {}",
                tool.name,
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            )));
        };
        *agent = AgentRef::Inline(Box::new(decl.spec.clone()));
    }
    Ok(())
}

/// The wire format of a model endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelProvider {
    /// OpenAI Chat Completions, also spoken by vLLM, llama.cpp and Ollama.
    Openai,
    /// Anthropic Messages.
    Anthropic,
}

/// A sub-agent: its model, prompt, tools, scopes and budget.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// The wire format the model endpoint speaks.
    pub provider: ModelProvider,
    /// The API root, e.g. `https://api.openai.com/v1` or
    /// `https://api.anthropic.com/v1`; the client appends
    /// `/chat/completions` or `/messages`.
    pub base_url: String,
    /// An environment variable that, when set, replaces `base_url` (one
    /// declaration, a model server per deployment).
    pub base_url_env: Option<String>,
    /// The model to ask for, as the endpoint names it.
    pub model: String,
    /// The environment variable holding the API key.
    pub api_key_env: Option<String>,
    /// A file holding the API key (a mounted secret).
    pub api_key_file: Option<String>,
    /// The system prompt of every run.
    pub system_prompt: String,
    /// The registered tools the sub-agent may call.
    #[serde(default)]
    pub tools: Vec<String>,
    /// The scopes it runs with, intersected with the caller's.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// Model calls a run may make (8 by default).
    #[serde(default = "default_max_steps")]
    pub max_steps: u32,
    /// Input plus output tokens a run may use (50,000 by default).
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u64,
    /// Wall time a run may take, in seconds (300 by default).
    #[serde(default = "default_max_wall_s")]
    pub max_wall_s: f64,
    /// Output tokens one model call may produce.
    #[serde(default = "default_max_output_tokens")]
    pub max_output_tokens: u32,
    /// How long one model call may take.
    #[serde(default = "default_model_timeout_s")]
    pub timeout_s: f64,
}

fn default_max_steps() -> u32 {
    8
}
fn default_max_tokens() -> u64 {
    50_000
}
fn default_max_wall_s() -> f64 {
    300.0
}
fn default_max_output_tokens() -> u32 {
    1024
}
fn default_model_timeout_s() -> f64 {
    60.0
}

/// Cache settings of a tool.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    /// How long a read's answer is cached, in seconds.
    pub ttl_s: f64,
}

/// Rate limit settings of a tool: `max` calls per `per_s` seconds per tenant.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Calls allowed per window.
    pub max: u32,
    /// The window, in seconds.
    pub per_s: f64,
    /// What the calls are counted by: `"tenant"` (the default), `"user"`
    /// or a JSON pointer into the arguments.
    pub key: Option<String>,
}

/// `concurrency = { limit, key }` of a tool.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencyConfig {
    /// The most jobs running at once per key.
    pub limit: u32,
    /// `"tenant"`, `"user"` or a JSON pointer into the arguments.
    pub key: String,
}

/// The middleware table of a tool.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MiddlewareConfig {
    /// Records each call in the audit log.
    #[serde(default)]
    pub audit: bool,
    /// The scopes a caller must hold, all of them.
    #[serde(default)]
    pub require_scope: Vec<String>,
    /// How often the tool may be called, per tenant.
    pub rate_limit: Option<RateLimitConfig>,
    /// Caches the `ok` answers of a read-only tool.
    pub cache_reads: Option<CacheConfig>,
    /// How long a call may run, in seconds.
    pub timeout_s: Option<f64>,
    /// Fields masked in audit records and in results.
    #[serde(default)]
    pub redact: Vec<String>,
}

/// One `[[tools]]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolConfig {
    /// The name clients call the tool by.
    pub name: String,
    /// The tool's shape.
    pub shape: Shape,
    /// A human-readable title.
    pub title: Option<String>,
    /// What the tool does and when to call it, for the model.
    #[serde(default)]
    pub description: String,
    /// The JSON Schema of the arguments, inline.
    pub input_schema: Option<Value>,
    /// A JSON file holding the schema of the arguments.
    pub input_schema_file: Option<String>,
    /// The JSON Schema of the result, inline.
    pub output_schema: Option<Value>,
    /// A JSON file holding the schema of the result.
    pub output_schema_file: Option<String>,
    /// The hints as declared; left out, the shape's defaults.
    #[serde(default)]
    pub hints: Hints,
    /// The tool's middleware table.
    #[serde(default)]
    pub middleware: MiddlewareConfig,
    /// How the tool's work is done; human tools have none.
    pub executor: Option<ExecutorSpec>,
    /// Handle tools: results larger than this many bytes become a handle.
    pub handle_threshold: Option<usize>,
    /// Job and agent tools: the poll hint of the `running` answer, in seconds.
    pub poll_after_s: Option<u32>,
    /// Job and agent tools: the worker pool that runs them.
    pub pool: Option<String>,
    /// Job and agent tools: how many times a retryable failure is tried.
    pub max_attempts: Option<u32>,
    /// Job and agent tools: the priority of a call that gives none; makes
    /// the tool's pool ordered (see [`ToolDecl::priority`]).
    pub priority: Option<i16>,
    /// Job and agent tools: `{ limit, key }`, at most `limit` jobs running
    /// at once per `key` (`"tenant"`, `"user"` or a JSON pointer into the
    /// arguments); makes the tool's pool ordered.
    pub concurrency: Option<ConcurrencyConfig>,
    /// Job and agent tools: `{ max, per_s, key }`, how often the executor
    /// may start across the fleet; jobs over it wait, they do not fail.
    pub start_rate: Option<RateLimitConfig>,
    /// The result is MCP content blocks (see [`ToolDecl::content_blocks`]).
    #[serde(default)]
    pub content_blocks: bool,
    /// The tool may ask the MCP client for input (see [`ToolDecl::asks_client`]).
    #[serde(default)]
    pub asks_client: bool,
    /// Job and agent tools: MCP calls must run as tasks (see [`ToolDecl::requires_task`]).
    #[serde(default)]
    pub requires_task: bool,
    /// Human tools: who may answer their tickets (see [`AnsweredBy`]).
    pub answered_by: Option<AnsweredBy>,
    /// Command tools: whose approval each commit waits for (`"caller"` or
    /// `{ scope = "..." }`, see [`AnsweredBy`]).
    pub approval: Option<AnsweredBy>,
    /// Human tools and commands: seconds a ticket (a question, an
    /// approval) stays open before it expires; for a job tool that asks
    /// its client, how long its input tickets wait (24 hours unless set).
    pub expires_in_s: Option<f64>,
}

#[derive(Deserialize)]
struct ToolTables {
    #[serde(default)]
    tools: Vec<ToolConfig>,
}

fn seconds(what: &str, tool: &str, s: f64) -> Result<Duration, ConfigError> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            ConfigError::new(format!(
                "tool `{tool}`: {what} must be a positive number of seconds, got {s}"
            ))
        })
}

impl ToolConfig {
    /// Turns the table into a declaration, reading schema files through
    /// `read_file` and taking the executor the caller bound.
    pub fn into_decl(
        self,
        read_file: &dyn Fn(&str) -> Result<String, String>,
        executor: Option<Arc<dyn Executor>>,
    ) -> Result<ToolDecl, ConfigError> {
        let name = self.name.clone();
        let schema = |inline: Option<Value>,
                      file: Option<String>,
                      which: &str|
         -> Result<Option<Value>, ConfigError> {
            match (inline, file) {
                (Some(_), Some(_)) => Err(ConfigError::new(format!(
                    "tool `{name}`: give {which} inline or {which}_file, not both"
                ))),
                (Some(v), None) => Ok(Some(v)),
                (None, Some(path)) => {
                    let text = read_file(&path).map_err(|e| {
                        ConfigError::new(format!(
                            "tool `{name}`: cannot read {which}_file `{path}`: {e}"
                        ))
                    })?;
                    serde_json::from_str(&text).map(Some).map_err(|e| {
                        ConfigError::new(format!(
                            "tool `{name}`: {which}_file `{path}` is not JSON: {e}"
                        ))
                    })
                }
                (None, None) => Ok(None),
            }
        };
        let input = schema(self.input_schema, self.input_schema_file, "input_schema")?
            .unwrap_or_else(|| serde_json::json!({"type": "object"}));
        let output = schema(self.output_schema, self.output_schema_file, "output_schema")?;
        if self.answered_by.is_some() && self.shape != Shape::Human {
            return Err(ConfigError::new(format!(
                "tool `{name}`: answered_by is for human tools, whose tickets a person answers"
            )));
        }
        if self.approval.is_some() && self.shape != Shape::Command {
            return Err(ConfigError::new(format!(
                "tool `{name}`: approval is for command tools, whose commits a person approves"
            )));
        }
        if self.expires_in_s.is_some()
            && !matches!(self.shape, Shape::Human | Shape::Command)
            && !(self.asks_client && self.shape == Shape::Job)
        {
            return Err(ConfigError::new(format!(
                "tool `{name}`: expires_in_s is for human tools, commands and job tools that ask their client, whose tickets (questions, approvals, input) expire"
            )));
        }
        let expires_in = self
            .expires_in_s
            .map(|s| seconds("expires_in_s", &name, s))
            .transpose()?;
        let concurrency = self
            .concurrency
            .map(|c| match crate::tool::CountedBy::parse(&c.key) {
                Some(key) => Ok(crate::tool::Concurrency {
                    limit: c.limit,
                    key,
                }),
                None => Err(ConfigError::new(format!(
                    "tool `{name}`: concurrency.key must be \"tenant\", \"user\" or a JSON pointer \
                     into the arguments such as \"/account\", not {:?}",
                    c.key
                ))),
            })
            .transpose()?;
        let m = self.middleware;
        let counted_by = |key: Option<&str>, field: &str| match key {
            None => Ok(crate::tool::CountedBy::Tenant),
            Some(key) => crate::tool::CountedBy::parse(key).ok_or_else(|| {
                ConfigError::new(format!(
                    "tool `{name}`: {field}.key must be \"tenant\", \"user\" or a JSON pointer \
                     into the arguments such as \"/account\", not {key:?}"
                ))
            }),
        };
        let rate_limit_by = counted_by(
            m.rate_limit.as_ref().and_then(|r| r.key.as_deref()),
            "rate_limit",
        )?;
        let start_rate = match self.start_rate {
            Some(start) => Some(crate::tool::StartRate {
                by: counted_by(start.key.as_deref(), "start_rate")?,
                limit: RateLimit {
                    max: start.max,
                    per: seconds("start_rate.per_s", &name, start.per_s)?,
                },
            }),
            None => None,
        };
        let middleware = MiddlewareSpec {
            rate_limit_by,
            audit: m.audit,
            scopes: m.require_scope,
            rate_limit: m
                .rate_limit
                .map(|r| {
                    Ok::<_, ConfigError>(RateLimit {
                        max: r.max,
                        per: seconds("rate_limit.per_s", &name, r.per_s)?,
                    })
                })
                .transpose()?,
            cache_ttl: m
                .cache_reads
                .map(|c| seconds("cache_reads.ttl_s", &name, c.ttl_s))
                .transpose()?,
            timeout: m
                .timeout_s
                .map(|t| seconds("timeout_s", &name, t))
                .transpose()?,
            redact: m.redact,
            custom: Vec::new(),
        };
        Ok(ToolDecl {
            name: self.name,
            title: self.title,
            description: self.description,
            shape: self.shape,
            input_schema: input,
            output_schema: output,
            hints: self.hints,
            middleware,
            executor,
            handle_threshold: self.handle_threshold,
            poll_after_s: self.poll_after_s,
            pool: self.pool,
            max_attempts: self.max_attempts,
            priority: self.priority,
            concurrency,
            start_rate,
            content_blocks: self.content_blocks,
            asks_client: self.asks_client,
            requires_task: self.requires_task,
            long_poll: None,
            answered_by: self.answered_by.unwrap_or_default(),
            approval: self.approval,
            expires_in,
        })
    }
}

/// The `[[tools]]` tables of a configuration file; other keys are ignored here.
pub fn parse_tools(text: &str) -> Result<Vec<ToolConfig>, ConfigError> {
    toml::from_str::<ToolTables>(text)
        .map(|t| t.tools)
        .map_err(|e| ConfigError::new(format!("tool configuration: {e}")))
}

/// Parses the tools of `text` and binds builtin executors from `builtins`;
/// a tool naming another kind of executor is refused (the fleet binds those).
pub fn load_builtin_tools(
    text: &str,
    read_file: &dyn Fn(&str) -> Result<String, String>,
    builtins: &BTreeMap<String, Arc<dyn Executor>>,
) -> Result<Vec<ToolDecl>, ConfigError> {
    parse_tools(text)?
        .into_iter()
        .map(|tool| bind_builtin(tool, read_file, builtins))
        .collect()
}

/// One tool of [`parse_tools`] as a declaration, its executor one of
/// `builtins`; a tool naming another kind of executor is refused.
pub fn bind_builtin(
    tool: ToolConfig,
    read_file: &dyn Fn(&str) -> Result<String, String>,
    builtins: &BTreeMap<String, Arc<dyn Executor>>,
) -> Result<ToolDecl, ConfigError> {
    let executor = match &tool.executor {
        None => None,
        Some(ExecutorSpec::Builtin { name }) => {
            Some(builtins.get(name).cloned().ok_or_else(|| {
                ConfigError::new(format!(
                    "tool `{}`: no builtin executor named `{name}`; known: {}",
                    tool.name,
                    builtins.keys().cloned().collect::<Vec<_>>().join(", ")
                ))
            })?)
        }
        Some(other) => {
            return Err(ConfigError::new(format!(
                "tool `{}`: executor {other:?} needs the fleet to bind it",
                tool.name
            )));
        }
    };
    tool.into_decl(read_file, executor)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"
listen = "127.0.0.1:8080"

[[tools]]
name = "find_things"
shape = "query"
description = "Find things."
input_schema = { type = "object", properties = { q = { type = "string" } }, required = ["q"] }
hints = { idempotent = true }
middleware = { audit = true, require_scope = ["things:read"], cache_reads = { ttl_s = 60 }, rate_limit = { max = 5, per_s = 1, key = "user" }, timeout_s = 2.5, redact = ["secret"] }
executor = { kind = "builtin", name = "things.find" }

[[tools]]
name = "fetch_report"
shape = "job"
input_schema_file = "schemas/report.json"
executor = { kind = "http", url = "http://127.0.0.1:9000/report" }
poll_after_s = 20
priority = 3
concurrency = { limit = 2, key = "/id" }
"#;

    #[test]
    fn tables_become_declarations() {
        let tools = parse_tools(TEXT).unwrap();
        assert_eq!(tools.len(), 2);
        let read = |path: &str| {
            assert_eq!(path, "schemas/report.json");
            Ok::<_, String>(
                r#"{"type": "object", "properties": {"id": {"type": "integer"}}}"#.to_owned(),
            )
        };
        let find = tools[0].clone().into_decl(&read, None).unwrap();
        assert_eq!(find.shape, Shape::Query);
        assert_eq!(find.middleware.scopes, vec!["things:read".to_owned()]);
        assert_eq!(find.middleware.cache_ttl, Some(Duration::from_secs(60)));
        assert_eq!(find.middleware.timeout, Some(Duration::from_millis(2500)));
        assert_eq!(find.middleware.rate_limit.unwrap().max, 5);
        assert_eq!(find.middleware.rate_limit_by, crate::tool::CountedBy::User);
        assert_eq!(find.input_schema["required"][0], "q");
        let report = tools[1].clone().into_decl(&read, None).unwrap();
        assert_eq!(report.input_schema["properties"]["id"]["type"], "integer");
        assert_eq!(report.poll_after_s, Some(20));
        assert_eq!(report.priority, Some(3));
        assert_eq!(
            report.concurrency,
            Some(crate::tool::Concurrency {
                limit: 2,
                key: crate::tool::CountedBy::Pointer("/id".to_owned())
            })
        );
        assert!(matches!(tools[1].executor, Some(ExecutorSpec::Http { .. })));
    }

    #[test]
    fn an_exec_executor_reads_its_environment() {
        let text = r#"
[[tools]]
name = "x"
shape = "query"
executor = { kind = "exec", program = "tool", env = { MODE = "fast" }, pass_env = ["TOOL_TOKEN"] }
"#;
        let tools = parse_tools(text).unwrap();
        let Some(ExecutorSpec::Exec { env, pass_env, .. }) = &tools[0].executor else {
            panic!("expected an exec executor, got {:?}", tools[0].executor);
        };
        assert_eq!(env, &BTreeMap::from([("MODE".into(), "fast".into())]));
        assert_eq!(pass_env, &["TOOL_TOKEN".to_owned()]);
        let typo = text.replace("pass_env", "passenv");
        let err = parse_tools(&typo).unwrap_err();
        assert!(err.message.contains("passenv"), "{}", err.message);
    }

    #[test]
    fn mistakes_are_named() {
        let typo = "[[tools]]\nname = \"x\"\nshape = \"query\"\nmiddlewre = {}\n";
        assert!(parse_tools(typo).unwrap_err().message.contains("middlewre"));
        let shape = "[[tools]]\nname = \"x\"\nshape = \"querry\"\n";
        assert!(parse_tools(shape).unwrap_err().message.contains("querry"));
        let both = "[[tools]]\nname = \"x\"\nshape = \"query\"\ninput_schema = {type = \"object\"}\ninput_schema_file = \"a.json\"\n";
        let tool = parse_tools(both).unwrap().remove(0);
        let err = tool.into_decl(&|_| Ok(String::new()), None).unwrap_err();
        assert!(err.message.contains("not both"), "{}", err.message);
        let missing =
            "[[tools]]\nname = \"x\"\nshape = \"query\"\ninput_schema_file = \"nope.json\"\n";
        let tool = parse_tools(missing).unwrap().remove(0);
        let err = tool
            .into_decl(&|_| Err("no such file".into()), None)
            .unwrap_err();
        assert!(err.message.contains("nope.json") && err.message.contains("no such file"));
        for (bad, says) in [
            (
                "middleware = { rate_limit = { max = 1, per_s = 1, key = \"account\" } }",
                "rate_limit.key",
            ),
            (
                "concurrency = { limit = 1, key = \"everyone\" }",
                "concurrency.key",
            ),
        ] {
            let text = format!("[[tools]]\nname = \"x\"\nshape = \"job\"\n{bad}\n");
            let tool = parse_tools(&text).unwrap().remove(0);
            let err = tool.into_decl(&|_| Ok(String::new()), None).unwrap_err();
            assert!(err.message.contains(says), "{}", err.message);
        }
        let zero = "[[tools]]\nname = \"x\"\nshape = \"query\"\nmiddleware = { timeout_s = 0 }\n";
        let tool = parse_tools(zero).unwrap().remove(0);
        assert!(tool.into_decl(&|_| Ok(String::new()), None).is_err());
    }

    #[test]
    fn an_agent_executor_reads_its_model_tools_scopes_and_budget() {
        let text = r#"
[[tools]]
name = "reconcile_month"
shape = "agent"
description = "Reconciles a month of expenses."
input_schema = { type = "object", properties = { task = { type = "string" } }, required = ["task"] }

[tools.executor]
kind = "agent"
provider = "anthropic"
base_url = "http://127.0.0.1:9/v1"
model = "claude-test"
api_key_env = "ANTHROPIC_API_KEY"
system_prompt = "You reconcile expenses."
tools = ["find_expenses"]
scopes = ["expenses:read"]
max_steps = 4
max_wall_s = 30
"#;
        let tools = parse_tools(text).unwrap();
        let Some(ExecutorSpec::Agent(AgentRef::Inline(spec))) = &tools[0].executor else {
            panic!("expected an agent executor, got {:?}", tools[0].executor);
        };
        assert_eq!(spec.provider, ModelProvider::Anthropic);
        assert_eq!(spec.tools, vec!["find_expenses".to_owned()]);
        assert_eq!(
            (spec.max_steps, spec.max_tokens, spec.max_wall_s),
            (4, 50_000, 30.0)
        );
        let unknown = text.replace("max_steps = 4", "max_stepz = 4");
        let error = parse_tools(&unknown).expect_err("unknown keys are refused");
        assert!(error.to_string().contains("max_stepz"), "{error}");
    }

    /// An `[[agents]]` table declares an assistant once, with its approve
    /// list and pool; an agent tool naming it gets its spec, a name nobody
    /// declared is refused naming those declared, and an unknown key of the
    /// table is refused.
    #[test]
    fn assistants_are_declared_once_and_named_by_agent_tools() {
        let text = r#"
            [[agents]]
            name = "helper"
            description = "Helps."
            provider = "openai"
            base_url = "http://127.0.0.1:9/v1"
            model = "m"
            system_prompt = "Help."
            tools = ["find", "submit"]
            approve = ["submit"]
            pool = "assistants"
            max_steps = 5

            [[tools]]
            name = "delegate"
            shape = "agent"
            executor = { kind = "agent", agent = "helper" }
        "#;
        let agents = parse_agents(text).unwrap();
        assert_eq!(agents.len(), 1);
        let helper = &agents[0];
        assert_eq!(
            (helper.name.as_str(), helper.description.as_str()),
            ("helper", "Helps.")
        );
        assert_eq!(helper.approve, vec!["submit".to_owned()]);
        assert_eq!(helper.pool.as_deref(), Some("assistants"));
        assert_eq!(helper.spec.max_steps, 5);
        let mut tools = parse_tools(text).unwrap();
        assert_eq!(
            tools[0].executor,
            Some(ExecutorSpec::Agent(AgentRef::Named("helper".into())))
        );
        resolve_agents(&mut tools, &agents).unwrap();
        assert_eq!(
            tools[0].executor,
            Some(ExecutorSpec::Agent(AgentRef::Inline(Box::new(
                helper.spec.clone()
            ))))
        );
        let mut stranger =
            parse_tools(&text.replace("agent = \"helper\"", "agent = \"nobody\"")).unwrap();
        let error = resolve_agents(&mut stranger, &agents)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("nobody") && error.contains("helper"),
            "{error}"
        );
        let misspelt = text.replace("max_steps = 5", "max_stepz = 5");
        let error = parse_agents(&misspelt).unwrap_err().to_string();
        assert!(error.contains("max_stepz"), "{error}");
        let both = text.replace(
            "agent = \"helper\" }",
            "agent = \"helper\", model = \"m\" }",
        );
        assert!(
            parse_tools(&both).is_err(),
            "a named assistant takes no other key"
        );
    }
}
