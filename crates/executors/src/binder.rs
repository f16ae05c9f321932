//! Binding: from the executor a tool names in configuration to one that runs.
//!
//! The [`Binder`] knows the builtin functions of the process and its shared
//! HTTP client, and checks what configuration says before any call is made:
//! a builtin that exists, a URL that is http or https, headers that HTTP can
//! carry, a program that is named with environment variables of valid
//! names, a timeout that is a positive number of seconds. It must never start a program or open a connection.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Client;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use toolfleet_core::config::{AgentRef, AgentSpec, ConfigError, ExecutorSpec, parse_tools};
use toolfleet_core::{Executor, ToolDecl};

use crate::http::RESERVED_HEADERS;
use crate::{DEFAULT_MAX_RESULT_BYTES, ExecExecutor, HttpExecutor};

/// The wall time of one attempt when a tool's executor names none. Every
/// attempt is bounded; the tool's own `timeout_s` middleware may cut it shorter.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Makes the executor of an agent tool: the sub-agent's loop, which needs
/// the runtime, the store and a model client that this crate does not hold.
pub trait AgentFactory: Send + Sync {
    /// The executor of the agent tool named `tool` (its metrics are counted
    /// under that name).
    fn bind(&self, tool: &str, spec: &AgentSpec) -> Result<Arc<dyn Executor>, String>;
}

/// Turns [`ExecutorSpec`]s into executors.
#[derive(Clone)]
pub struct Binder {
    builtins: BTreeMap<String, Arc<dyn Executor>>,
    client: Client,
    default_timeout: Duration,
    max_result_bytes: usize,
    agents: Option<Arc<dyn AgentFactory>>,
}

impl Binder {
    /// A binder over the process's builtin executors, by name, and the HTTP
    /// client its HTTP executors share (see [`crate::http_client`]).
    pub fn new(builtins: BTreeMap<String, Arc<dyn Executor>>, client: Client) -> Self {
        Binder {
            builtins,
            client,
            default_timeout: DEFAULT_TIMEOUT,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            agents: None,
        }
    }

    /// Where the executors of agent tools come from.
    pub fn with_agents(mut self, agents: Arc<dyn AgentFactory>) -> Self {
        self.agents = Some(agents);
        self
    }

    /// The timeout of executors whose configuration gives no `timeout_s`.
    pub fn with_default_timeout(mut self, timeout: Duration) -> Self {
        self.default_timeout = timeout;
        self
    }

    /// The largest result an HTTP or exec executor accepts.
    pub fn with_max_result_bytes(mut self, bytes: usize) -> Self {
        self.max_result_bytes = bytes;
        self
    }

    /// The executor `spec` names for the tool named `tool`, or why it
    /// cannot be had.
    pub fn bind(&self, tool: &str, spec: &ExecutorSpec) -> Result<Arc<dyn Executor>, String> {
        match spec {
            ExecutorSpec::Builtin { name } => self.builtin(name),
            ExecutorSpec::Http {
                url,
                headers,
                timeout_s,
            } => {
                let executor = HttpExecutor::new(self.client.clone(), url)?
                    .with_headers(header_map(headers)?)
                    .with_timeout(self.timeout(*timeout_s)?)
                    .with_max_response_bytes(self.max_result_bytes);
                Ok(Arc::new(executor))
            }
            ExecutorSpec::Exec {
                program,
                args,
                timeout_s,
                env,
                pass_env,
            } => {
                let executor = ExecExecutor::new(program.clone(), args.clone())?
                    .with_environment(env.clone(), pass_env.clone())?
                    .with_timeout(self.timeout(*timeout_s)?)
                    .with_max_output_bytes(self.max_result_bytes);
                Ok(Arc::new(executor))
            }
            ExecutorSpec::Agent(AgentRef::Named(name)) => Err(format!(
                "the agent executor names the assistant `{name}`, which was not resolved to its [[agents]] declaration"
            )),
            ExecutorSpec::Agent(AgentRef::Inline(spec)) => match &self.agents {
                Some(agents) => agents.bind(tool, spec),
                None => {
                    Err("agent executors need the agent runtime, which this process lacks".into())
                }
            },
        }
    }

    /// The `[[tools]]` of a configuration file as declarations, each with its
    /// executor bound; schema files are read through `read_file`.
    pub fn load_tools(
        &self,
        text: &str,
        read_file: &dyn Fn(&str) -> Result<String, String>,
    ) -> Result<Vec<ToolDecl>, ConfigError> {
        parse_tools(text)?
            .into_iter()
            .map(|tool| {
                let executor = tool
                    .executor
                    .as_ref()
                    .map(|spec| self.bind(&tool.name, spec))
                    .transpose()
                    .map_err(|message| ConfigError {
                        message: format!("tool `{}`: executor: {message}", tool.name),
                    })?;
                tool.into_decl(read_file, executor)
            })
            .collect()
    }

    fn builtin(&self, name: &str) -> Result<Arc<dyn Executor>, String> {
        self.builtins.get(name).cloned().ok_or_else(|| {
            let known = self.builtins.keys().map(String::as_str).collect::<Vec<_>>();
            let known = if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            };
            format!("no builtin executor is named `{name}`; known: {known}")
        })
    }

    fn timeout(&self, seconds: Option<f64>) -> Result<Duration, String> {
        let Some(s) = seconds else {
            return Ok(self.default_timeout);
        };
        Duration::try_from_secs_f64(s)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("timeout_s must be a positive number of seconds, got {s}"))
    }
}

/// Configured headers, checked once here rather than on every call. Values
/// are never quoted back: they are often credentials.
fn header_map(headers: &BTreeMap<String, String>) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("header name `{name}` is not a valid HTTP header name"))?;
        if RESERVED_HEADERS.contains(&header.as_str()) {
            return Err(format!(
                "header `{name}` is set by toolfleet itself; remove it"
            ));
        }
        let value = HeaderValue::from_str(value).map_err(|_| {
            format!("the value of header `{name}` contains characters HTTP cannot carry")
        })?;
        map.insert(header, value);
    }
    Ok(map)
}
