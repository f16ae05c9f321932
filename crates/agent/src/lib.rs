//! Sub-agents: a tool of shape `agent` runs its own model loop as a job on
//! the workers' agent pool, with its own prompt, a subset of the registered
//! tools, scopes no wider than its caller's, and a budget it cannot exceed.
//!
//! [`model`] speaks the two wire formats (OpenAI Chat Completions, which
//! OpenAI-compatible servers share, and Anthropic Messages); [`run`] is the
//! loop; [`Agents`] binds the agent tools of a configuration.

use std::sync::Arc;

use toolfleet_core::Executor;
use toolfleet_core::config::AgentSpec;
use toolfleet_executors::AgentFactory;

pub mod assistant;
pub mod model;
pub mod run;
#[cfg(feature = "testing")]
pub mod testing;

pub use assistant::{Assistant, Assistants};
pub use run::{AgentEnv, AgentExecutor, DEFAULT_MAX_DEPTH, Evidence, Exceeded};

/// Binds agent executors: checks the spec, makes its model client.
pub struct Agents {
    env: Arc<AgentEnv>,
    client: reqwest::Client,
}

impl Agents {
    /// Binds agents sharing `env`, whose model calls go through `client`.
    pub fn new(env: Arc<AgentEnv>, client: reqwest::Client) -> Self {
        Agents { env, client }
    }
}

impl Agents {
    /// The declared assistant of `decl`, its spec checked and its model
    /// client made.
    pub fn assistant(&self, decl: &toolfleet_core::config::AgentDecl) -> Result<Assistant, String> {
        let (spec, model) = self.model(&decl.spec)?;
        let mut decl = decl.clone();
        decl.spec = spec;
        Ok(Assistant::new(decl, model))
    }

    /// The spec as it runs (its `base_url_env` applied) and its model client.
    fn model(&self, spec: &AgentSpec) -> Result<(AgentSpec, Arc<dyn model::Model>), String> {
        if spec.max_steps == 0 || spec.max_tokens == 0 {
            return Err("an agent's max_steps and max_tokens must be at least 1".into());
        }
        if !(spec.max_wall_s.is_finite() && spec.max_wall_s > 0.0) {
            return Err("an agent's max_wall_s must be a positive number of seconds".into());
        }
        if spec.system_prompt.trim().is_empty() {
            return Err("an agent needs a system_prompt".into());
        }
        let mut spec = spec.clone();
        if let Some(url) = spec
            .base_url_env
            .as_deref()
            .and_then(|v| std::env::var(v).ok())
        {
            spec.base_url = url;
        }
        let model = model::model_for(&spec, self.client.clone())?;
        Ok((spec, model))
    }
}

impl AgentFactory for Agents {
    fn bind(&self, tool: &str, spec: &AgentSpec) -> Result<Arc<dyn Executor>, String> {
        let (spec, model) = self.model(spec)?;
        Ok(Arc::new(AgentExecutor::new(
            tool,
            spec,
            model,
            self.env.clone(),
        )))
    }
}
