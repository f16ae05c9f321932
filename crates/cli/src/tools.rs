//! The tools a process registers and where they run: the configured
//! `[[tools]]` bound to their executors, the status tools (`get_job`,
//! `cancel_job`), the agent tools and the checks of what they name, and
//! the pools of all of them (the workers' pools, and those whose jobs go
//! one to a message).

use std::collections::BTreeSet;
use std::sync::Arc;

use toolfleet_agent::{AgentEnv, Agents, Assistants};
use toolfleet_core::config::ExecutorSpec;
use toolfleet_core::{CallCtx, Runtime, RuntimeConfig, Shape, ToolDecl, ToolError, executor_fn};
use toolfleet_executors::{Binder, http_client};
use toolfleet_server::{Status, status_tools};

use crate::config::Config;

/// Registers the status tools and every configured tool.
pub(crate) fn register_tools(
    runtime: &mut Runtime,
    config: &Config,
    status: Status,
    agents: &Arc<AgentEnv>,
) -> Result<(), String> {
    runtime
        .register_all(status_tools(status))
        .map_err(|e| e.to_string())?;
    let mut builtins =
        toolfleet_expenses::builtins(Arc::new(toolfleet_expenses::ExpenseBook::default()));
    // A job that does nothing, for measuring the pipeline (`toolfleet bench --server`).
    builtins.insert(
        "toolfleet.noop".to_owned(),
        executor_fn(|_: CallCtx, _: serde_json::Value| async {
            Ok::<_, ToolError>(serde_json::json!({}))
        }),
    );
    let client = http_client()?;
    let factory = Agents::new(agents.clone(), client.clone());
    let assistants = config
        .agents
        .iter()
        .map(|decl| {
            factory
                .assistant(decl)
                .map_err(|e| format!("agent `{}`: {e}", decl.name))
        })
        .collect::<Result<Vec<_>, String>>()?;
    // The job that drives the declared assistants' runs.
    runtime.register_internal(
        toolfleet_fleet::runs::RUN_TOOL,
        Arc::new(Assistants::new(agents.clone(), assistants)),
    );
    let binder = Binder::new(builtins, client.clone())
        .with_agents(Arc::new(Agents::new(agents.clone(), client)));
    for (tool, dir) in &config.tools {
        let name = tool.name.clone();
        let executor = tool
            .executor
            .as_ref()
            .map(|spec| binder.bind(&name, spec))
            .transpose()
            .map_err(|e| format!("tool `{name}`: executor: {e}"))?;
        let read = |path: &str| std::fs::read_to_string(dir.join(path)).map_err(|e| e.to_string());
        let decl = tool
            .clone()
            .into_decl(&read, executor)
            .map_err(|e| e.to_string())?;
        runtime.register(decl).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// What `/v1/runs` knows of the declared assistants: each one's pool and
/// the time one job of its loop may take.
pub(crate) fn run_settings(config: &Config) -> toolfleet_server::RunSettings {
    let default_pool = RuntimeConfig::default().default_agent_pool;
    toolfleet_server::RunSettings {
        assistants: config
            .agents
            .iter()
            .map(|decl| {
                (
                    decl.name.clone(),
                    Assistants::placement(decl, &default_pool),
                )
            })
            .collect(),
        checkpoint_bytes: config.limits.run_checkpoint_bytes,
    }
}

/// Every declared assistant names only registered tools, and approves only
/// commands among them.
fn check_assistants(runtime: &Runtime, config: &Config) -> Result<(), String> {
    for agent in &config.agents {
        for name in &agent.spec.tools {
            if runtime.registry().get(name).is_none() {
                return Err(format!(
                    "agent `{}` names tool `{name}`, which is not registered",
                    agent.name
                ));
            }
        }
        for name in &agent.approve {
            let command = runtime
                .registry()
                .get(name)
                .is_some_and(|t| t.shape() == Shape::Command);
            if !agent.spec.tools.contains(name) || !command {
                return Err(format!(
                    "agent `{}`: approve names `{name}`, which is not a command tool among its tools",
                    agent.name
                ));
            }
        }
    }
    Ok(())
}

/// Every agent tool names only tools that are registered, and is of
/// shape `agent`; an agent executor on another shape is refused.
pub(crate) fn check_agents(runtime: &Runtime, config: &Config) -> Result<(), String> {
    check_assistants(runtime, config)?;
    for (tool, _) in &config.tools {
        let Some(ExecutorSpec::Agent(agent)) = &tool.executor else {
            continue;
        };
        let Some(spec) = agent.spec() else {
            return Err(format!(
                "tool `{}`: its assistant was not resolved to a declaration",
                tool.name
            ));
        };
        if tool.shape != Shape::Agent {
            return Err(format!(
                "tool `{}`: an agent executor needs shape = \"agent\"",
                tool.name
            ));
        }
        for name in &spec.tools {
            // What OpenAI and Anthropic accept as a function name.
            if !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(format!(
                    "agent tool `{}` names tool `{name}`: model providers take tool names of A-Z a-z 0-9 _ - only",
                    tool.name
                ));
            }
            if runtime.registry().get(name).is_none() {
                return Err(format!(
                    "agent tool `{}` names tool `{name}`, which is not registered",
                    tool.name
                ));
            }
        }
    }
    Ok(())
}

/// The pools the registered job and agent tools run on, and those of the
/// declared assistants' loops.
pub(crate) fn all_pools(runtime: &Runtime, declared: &Config) -> BTreeSet<String> {
    let config = runtime.config();
    let assistants = declared
        .agents
        .iter()
        .map(|a| Assistants::placement(a, &config.default_agent_pool).0);
    runtime
        .registry()
        .tools()
        .filter(|t| t.shape().is_enqueued())
        .map(|t| {
            t.declaration()
                .pool
                .clone()
                .unwrap_or_else(|| match t.shape() {
                    Shape::Agent => config.default_agent_pool.clone(),
                    _ => config.default_pool.clone(),
                })
        })
        .chain(assistants)
        .collect()
}

/// The pools where agent tools of the configuration or of `extra` run.
pub(crate) fn agent_pools(config: &Config, extra: &[ToolDecl]) -> BTreeSet<String> {
    let default_pool = RuntimeConfig::default().default_agent_pool;
    let configured = config
        .tools
        .iter()
        .map(|(tool, _)| (tool.shape, &tool.pool));
    let given = extra.iter().map(|tool| (tool.shape, &tool.pool));
    let assistants = config
        .agents
        .iter()
        .map(|a| Assistants::placement(a, &default_pool).0);
    configured
        .chain(given)
        .filter(|(shape, _)| *shape == Shape::Agent)
        .map(|(_, pool)| pool.clone().unwrap_or_else(|| default_pool.clone()))
        .chain(assistants)
        .collect()
}

/// The schedules of `config`, checked against `runtime`'s tools: names
/// unique, each naming a job or agent tool, its arguments valid for it.
pub(crate) fn schedules(
    runtime: &Runtime,
    config: &Config,
) -> Result<Arc<[toolfleet_fleet::schedules::Schedule]>, String> {
    let mut names = std::collections::BTreeSet::new();
    let mut schedules = Vec::with_capacity(config.schedules.len());
    for spec in &config.schedules {
        let schedule = toolfleet_fleet::schedules::Schedule::new(spec.clone())?;
        let name = schedule.name();
        if !names.insert(name.to_owned()) {
            return Err(format!("schedules: `{name}` is named twice"));
        }
        let Some(tool) = runtime.registry().get(&spec.tool) else {
            return Err(format!(
                "schedules.{name}.tool: no tool is named `{}`",
                spec.tool
            ));
        };
        if !matches!(tool.shape(), Shape::Job | Shape::Agent) {
            return Err(format!(
                "schedules.{name}.tool: `{}` is a {} tool; a schedule starts job or agent tools",
                spec.tool,
                tool.shape().as_str()
            ));
        }
        if let Err(error) = tool.validate(&spec.args) {
            return Err(format!("schedules.{name}.args: {}", error.message));
        }
        schedules.push(schedule);
    }
    Ok(schedules.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolfleet_broker::SETTLED_STATES;
    use toolfleet_fleet::backends::{CANCELLED_STATE, heard_states};

    fn parse(text: &str) -> Config {
        Config::parse(text, std::path::Path::new("toolfleet.toml")).expect("a configuration")
    }

    /// A worker that may run an agent hears settled jobs and answered
    /// tickets besides cancels; one that runs none of the agent tools (none
    /// declared, or none in its pools) hears only cancels.
    #[test]
    fn a_worker_hears_settled_jobs_only_where_it_runs_an_agent() {
        let job = parse(
            r#"
            [[tools]]
            name = "report"
            description = "A report."
            shape = "job"
            input_schema = { type = "object" }
            executor = { kind = "builtin", name = "toolfleet.noop" }
            "#,
        );
        assert_eq!(heard_states(&agent_pools(&job, &[]), None), CANCELLED_STATE);
        let agent = ToolDecl::agent("helper").description("Helps.");
        assert_eq!(
            heard_states(&agent_pools(&job, std::slice::from_ref(&agent)), None),
            SETTLED_STATES
        );
        let default = ["default".to_owned()];
        assert_eq!(
            heard_states(
                &agent_pools(&job, std::slice::from_ref(&agent)),
                Some(&default)
            ),
            CANCELLED_STATE
        );
        let agents = ["agents".to_owned()];
        assert_eq!(
            heard_states(
                &agent_pools(&job, std::slice::from_ref(&agent)),
                Some(&agents)
            ),
            SETTLED_STATES
        );
        let elsewhere = agent.pool("research");
        assert_eq!(
            heard_states(
                &agent_pools(&job, std::slice::from_ref(&elsewhere)),
                Some(&agents)
            ),
            CANCELLED_STATE
        );
        let research = ["research".to_owned()];
        assert_eq!(
            heard_states(&agent_pools(&job, &[elsewhere]), Some(&research)),
            SETTLED_STATES
        );
        let configured = parse(
            r#"
            [[tools]]
            name = "researcher"
            description = "Researches."
            shape = "agent"
            pool = "research"
            executor = { kind = "agent", provider = "openai", base_url = "http://127.0.0.1:9/v1", model = "m", system_prompt = "Research.", tools = [] }
            "#,
        );
        assert_eq!(
            heard_states(&agent_pools(&configured, &[]), Some(&research)),
            SETTLED_STATES
        );
        assert_eq!(
            heard_states(&agent_pools(&configured, &[]), None),
            SETTLED_STATES
        );
        assert_eq!(
            heard_states(&agent_pools(&configured, &[]), Some(&agents)),
            CANCELLED_STATE
        );
    }
}
