//! `toolfleet serve`: dispatcher, workers, sweeper and webhooks in one
//! process, on the embedded default (SQLite in the data directory and the
//! in-process queue). This is the one place the parts are wired together.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use toolfleet_broker::metered::{MeteredBroker, MeteredNotices};
use toolfleet_broker::{Broker, Notices};
use toolfleet_core::Metrics;
use toolfleet_core::metrics::Role;
use toolfleet_core::{
    AuditSink, CallCtx, Principal, Runtime, RuntimeConfig, Shape, ToolDecl, ToolError, executor_fn,
};
use toolfleet_executors::{Binder, http_client};
use toolfleet_fleet::backends::{Backends, heard_states};
use toolfleet_fleet::{run_sweeper, sweep};
use toolfleet_server::bounds::Holds;
use toolfleet_server::webhooks::{HookSettings, Webhooks};
use toolfleet_server::{
    Access, AppState, Auth, Dispatcher, McpSettings, Ops, Status, StoreAuditSink, StoreCommitLog,
    ops_router, status_tools, token_sha256,
};
use toolfleet_store::Store;
use toolfleet_store::metered::MeteredStore;
use toolfleet_worker::{Worker, WorkerConfig};

use toolfleet_agent::{AgentEnv, Agents};
use toolfleet_core::config::ExecutorSpec;

use crate::config::{Config, DEFAULT_METRICS_LISTEN};
use crate::files::{data_dir, kept_secret};

/// How long running jobs may finish after a shutdown signal: `shutdown_grace_s`.
fn shutdown_grace(config: &Config) -> Result<Duration, String> {
    Duration::try_from_secs_f64(config.shutdown_grace_s).map_err(|_| {
        format!(
            "shutdown_grace_s must be a number of seconds, at least 0, got {}",
            config.shutdown_grace_s
        )
    })
}

/// The development token's file in the data directory.
pub const DEV_TOKEN_FILE: &str = "dev-token";

fn random_hex(bytes: usize) -> String {
    let mut out = String::new();
    while out.len() < bytes * 2 {
        out.push_str(&uuid::Uuid::new_v4().simple().to_string());
    }
    out.truncate(bytes * 2);
    out
}

/// The key of confirm tokens: `confirm_secret` (shared by every dispatcher
/// of a fleet), else one kept in the data directory.
fn signing_key(config: &Config) -> Result<[u8; 32], String> {
    let dir = &config.data_dir;
    let text = match &config.confirm_secret {
        Some(secret) => secret.clone(),
        None => kept_secret(dir, "secret", || random_hex(32))?.0,
    };
    let wrong = || {
        format!(
            "the confirm-token key (confirm_secret, or {}/secret) must be 64 hex characters; delete the file to make a new one",
            dir.display()
        )
    };
    let bytes = hex::decode(text.trim()).map_err(|_| wrong())?;
    bytes.try_into().map_err(|_| wrong())
}

/// Whether `listen` names a loopback address: 127.0.0.0/8, ::1 or `localhost`.
fn is_loopback(listen: &str) -> bool {
    match listen.parse::<std::net::SocketAddr>() {
        Ok(address) => address.ip().to_canonical().is_loopback(),
        Err(_) => listen
            .rsplit_once(':')
            .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost")),
    }
}

/// Where and how to add a token, for the messages that ask for one.
const HOW_TO_ADD_A_TOKEN: &str = r#"the configuration file (toolfleet.toml, --config or TOOLFLEET_CONFIG):

  [[auth.tokens]]
  sha256 = "..."      # printf %s "$TOKEN" | sha256sum
  tenant = "acme"
  user = "alice"
  scopes = ["expenses:read", "expenses:submit"]

where TOKEN is a long random secret (TOKEN=tf_$(openssl rand -hex 24), say) that clients send as `Authorization: Bearer $TOKEN`; the file holds only its SHA-256."#;

/// A process serving the HTTP API needs a configured token, but for
/// `serve` on a loopback address, which makes a development token;
/// `toolfleet mcp` (stdio) may use that token, and workers need none.
fn check_tokens(config: &Config, roles: &Roles) -> Result<(), String> {
    if !roles.dispatcher || !roles.http || !config.auth.tokens.is_empty() {
        return Ok(());
    }
    match roles.metrics_role() {
        Role::Serve if is_loopback(&config.listen) => Ok(()),
        Role::Serve => Err(format!(
            "serve makes a development token only when it listens on a loopback address (127.0.0.1, ::1, localhost), and listen (or TOOLFLEET_LISTEN) is {}, with no [[auth.tokens]] configured. Listen on 127.0.0.1, or add a token to {HOW_TO_ADD_A_TOKEN}",
            config.listen
        )),
        _ => Err(format!(
            "the dispatcher needs at least one token in [[auth.tokens]] (it makes no development token). Add one to {HOW_TO_ADD_A_TOKEN}"
        )),
    }
}

/// The principals of the configuration, or a development token (`serve`
/// on a loopback address and `toolfleet mcp` only, see [`check_tokens`]).
fn authentication(config: &Config, runtime: &Runtime) -> Result<Auth, String> {
    let mut auth = Auth::default();
    for token in &config.auth.tokens {
        if token.sha256.len() != 64 || hex::decode(&token.sha256).is_err() {
            return Err(format!(
                "auth.tokens: sha256 of `{}` must be 64 hex characters",
                token.user
            ));
        }
        auth.insert(
            &token.sha256,
            Principal::new(&token.tenant, &token.user, token.scopes.iter().cloned()),
        );
    }
    if auth.is_empty() {
        let (token, made) = kept_secret(&config.data_dir, DEV_TOKEN_FILE, || {
            format!("tf_dev_{}", random_hex(24))
        })?;
        // The newcomer can try every tool, so the token holds every scope.
        let scopes: BTreeSet<String> = runtime
            .registry()
            .tools()
            .flat_map(|t| t.required_scopes().to_vec())
            .collect();
        auth.insert(&token_sha256(&token), Principal::new("dev", "dev", scopes));
        let file = config.data_dir.join(DEV_TOKEN_FILE);
        eprintln!(
            "{} development token (kept in {}):\n  export TOOLFLEET_TOKEN={token}\n  curl -H \"Authorization: Bearer $TOOLFLEET_TOKEN\" http://{}/v1/tools",
            if made { "made a" } else { "using the" },
            file.display(),
            config.listen
        );
    }
    Ok(auth)
}

/// Registers the status tools and every configured tool.
fn register_tools(
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

/// Every agent tool names only tools that are registered, and is of
/// shape `agent`; an agent executor on another shape is refused.
fn check_agents(runtime: &Runtime, config: &Config) -> Result<(), String> {
    for (tool, _) in &config.tools {
        let Some(ExecutorSpec::Agent(spec)) = &tool.executor else {
            continue;
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

/// The pools the registered job and agent tools run on.
fn all_pools(runtime: &Runtime) -> BTreeSet<String> {
    let config = runtime.config();
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
        .collect()
}

/// `toolfleet migrate`: PostgreSQL's migrations with `database_url`, else
/// the SQLite file's (which `serve` also applies when it opens it).
pub async fn migrate(config: &Config) -> Result<(), String> {
    if config.database_url.is_none() {
        data_dir(&config.data_dir)?;
    }
    let done = toolfleet_fleet::backends::migrate(&config.backend_settings()).await?;
    eprintln!("{done}");
    Ok(())
}

/// Which parts a process runs.
#[derive(Debug, Clone)]
pub struct Roles {
    /// The HTTP API, webhooks and the sweeper.
    pub dispatcher: bool,
    /// Workers of these pools; `None`: every pool of the registered tools.
    pub pools: Option<Vec<String>>,
    /// Run no workers at all.
    pub no_workers: bool,
    /// With `dispatcher`: listen for HTTP (`toolfleet mcp` speaks on stdio instead).
    pub http: bool,
}

impl Roles {
    /// `toolfleet serve`: everything.
    pub fn all() -> Roles {
        Roles {
            dispatcher: true,
            pools: None,
            no_workers: false,
            http: true,
        }
    }

    /// The `role` of `toolfleet_build_info`: what this process runs as.
    pub fn metrics_role(&self) -> Role {
        match (self.dispatcher, self.http, self.no_workers) {
            (false, _, _) => Role::Worker,
            (true, false, _) => Role::Mcp,
            (true, true, true) => Role::Dispatcher,
            (true, true, false) => Role::Serve,
        }
    }
}

/// Runs `roles` until SIGTERM or Ctrl-C, then stops gracefully.
pub async fn run(config: Config, roles: Roles) -> Result<(), String> {
    let grace = shutdown_grace(&config)?;
    let served = start(config, Vec::new(), roles).await?;
    wait_for_signal().await;
    eprintln!(
        "stopping: finishing running jobs (up to {} s)",
        grace.as_secs_f64()
    );
    served.stop().await
}

/// A server running in this process.
pub struct Served {
    /// Where the HTTP API listens, for processes that serve it.
    pub address: Option<std::net::SocketAddr>,
    /// The runtime every call goes through.
    pub runtime: Arc<Runtime>,
    /// The known tokens, for processes that dispatch.
    pub auth: Option<Arc<Auth>>,
    /// Jobs and tickets for MCP tasks and elicitation, for processes that dispatch.
    pub mcp_jobs: Option<Arc<dyn toolfleet_mcp::Jobs>>,
    stop: watch::Sender<bool>,
    done: tokio::task::JoinHandle<Result<(), String>>,
}

impl Served {
    /// Stops taking calls and work, lets running jobs finish, and waits.
    pub async fn stop(self) -> Result<(), String> {
        let _ = self.stop.send(true);
        self.done.await.map_err(|e| e.to_string())?
    }
}

/// The pools where agent tools of the configuration or of `extra` run.
fn agent_pools(config: &Config, extra: &[ToolDecl]) -> BTreeSet<String> {
    let default_pool = RuntimeConfig::default().default_agent_pool;
    let configured = config
        .tools
        .iter()
        .map(|(tool, _)| (tool.shape, &tool.pool));
    let given = extra.iter().map(|tool| (tool.shape, &tool.pool));
    configured
        .chain(given)
        .filter(|(shape, _)| *shape == Shape::Agent)
        .map(|(_, pool)| pool.clone().unwrap_or_else(|| default_pool.clone()))
        .collect()
}

/// Opens the backends `config` names, through the fleet's one choice of
/// them ([`toolfleet_fleet::backends::open`]); the SQLite file's directory
/// is made owner-only first.
pub async fn open_backends(
    config: &Config,
    prefetch: u16,
    only_states: Option<&[&str]>,
    agent_pools: &BTreeSet<String>,
) -> Result<Backends, String> {
    if config.database_url.is_none() {
        data_dir(&config.data_dir)?;
    }
    toolfleet_fleet::backends::open(
        &config.backend_settings(),
        prefetch,
        only_states,
        agent_pools,
    )
    .await
}

/// Starts `roles`, with `extra` tools beside the configured ones.
pub async fn start(config: Config, extra: Vec<ToolDecl>, roles: Roles) -> Result<Served, String> {
    // Refused before anything is opened. The data directory is made when
    // something is kept in it (SQLite, a secret, the development token).
    check_tokens(&config, &roles)?;
    let prefetch = u16::try_from(config.concurrency.max(1)).unwrap_or(u16::MAX);
    let Backends {
        store,
        broker,
        notices,
        in_process,
    } = {
        let agent_pools = agent_pools(&config, &extra);
        let heard = (!roles.dispatcher).then(|| heard_states(&agent_pools, roles.pools.as_deref()));
        open_backends(&config, prefetch, heard, &agent_pools).await?
    };
    // One registry for every part of this process, and the backends'
    // failures counted in it.
    let metrics = Arc::new(Metrics::for_role(roles.metrics_role()));
    let store: Arc<dyn Store> = Arc::new(MeteredStore::new(store, metrics.clone()));
    let broker: Arc<dyn Broker> = Arc::new(MeteredBroker::new(broker, metrics.clone()));
    let notices: Arc<dyn Notices> = Arc::new(MeteredNotices::new(notices, metrics.clone()));
    // Answers and cancels are audited beside the tools' calls.
    let audit: Arc<dyn AuditSink> = Arc::new(StoreAuditSink::spawn(store.clone(), 10_000));
    let api_limits = config.limits.api(config.max_body_bytes)?;
    let connection_limits = config.limits.connections()?;
    let access = Access::new(audit.clone(), api_limits.max_long_polls_per_principal);
    let mut runtime = Runtime::builder()
        .config(RuntimeConfig::default())
        .secret(signing_key(&config)?)
        .metrics(metrics.clone())
        .fleet(Arc::new(
            Dispatcher::new(store.clone(), broker.clone(), notices.clone())
                .with_metrics(metrics.clone()),
        ))
        .commit_log(Arc::new(StoreCommitLog::new(store.clone())))
        .audit_sink(audit.clone())
        .build();
    let agents = AgentEnv::with_max_depth(store.clone(), notices.clone(), config.max_agent_depth);
    let status = Status::new(store.clone(), notices.clone(), access.clone());
    register_tools(&mut runtime, &config, status, &agents)?;
    runtime.register_all(extra).map_err(|e| e.to_string())?;
    check_agents(&runtime, &config)?;
    access.learn(runtime.registry());
    let runtime = Arc::new(runtime);
    agents.set_runtime(&runtime);
    let (stop, stopped) = watch::channel(false);

    if in_process {
        // The in-process queue starts empty: refill it from the store first.
        let refilled = sweep(store.as_ref(), broker.as_ref(), 100_000, None).await?;
        if refilled > 0 {
            tracing::info!(jobs = refilled, "requeued jobs left from the last run");
        }
    }
    let lease = Duration::try_from_secs_f64(config.lease_s)
        .ok()
        .filter(|l| *l >= Duration::from_millis(300))
        .ok_or_else(|| {
            format!(
                "lease_s must be at least 0.3 seconds, got {}",
                config.lease_s
            )
        })?;
    let grace = shutdown_grace(&config)?;
    let mut workers = Vec::new();
    let pools = match (&roles.pools, roles.no_workers) {
        (_, true) => Vec::new(),
        (Some(pools), false) => pools.clone(),
        (None, false) => all_pools(&runtime).into_iter().collect(),
    };
    // The queues /metrics shows: those this process works, and every pool
    // of the registered tools where it dispatches.
    let mut shown: BTreeSet<String> = pools.iter().cloned().collect();
    if roles.dispatcher {
        shown.extend(all_pools(&runtime));
    }
    let ops = Arc::new(Ops::new(
        metrics.clone(),
        store.clone(),
        broker.clone(),
        shown.into_iter().collect(),
    ));
    let mut servers: Vec<Serving> = Vec::new();
    // /metrics, /healthz and /readyz off the API port: always without the
    // API (a worker), and beside it where metrics_listen is set. Bound
    // before any work is taken, so a port in use stops the process with
    // nothing started.
    let metrics_listen = match (roles.dispatcher, roles.http, &config.metrics_listen) {
        (false, _, listen) => Some(listen.as_deref().unwrap_or(DEFAULT_METRICS_LISTEN)),
        (true, true, Some(listen)) => Some(listen.as_str()),
        (true, _, _) => None,
    };
    if let Some(listen) = metrics_listen {
        let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
            format!(
                "cannot listen for metrics on {listen} (metrics_listen, TOOLFLEET_METRICS_LISTEN): {e}"
            )
        })?;
        let bound = listener.local_addr().map_err(|e| e.to_string())?;
        if roles.dispatcher {
            eprintln!("toolfleet metrics on http://{bound}");
        } else {
            eprintln!("toolfleet worker metrics on http://{bound}");
        }
        servers.push(serving(
            listener,
            ops_router(ops.clone()),
            connection_limits,
            &stopped,
        ));
    }
    for pool in pools {
        let mut worker_config = WorkerConfig::new(pool);
        worker_config.concurrency = config.concurrency;
        worker_config.lease = lease;
        let worker = Worker::new(
            worker_config,
            runtime.clone(),
            store.clone(),
            broker.clone(),
            notices.clone(),
        );
        workers.push(tokio::spawn(worker.run(stopped.clone(), grace)));
    }
    let mut address = None;
    let mut known = None;
    let mut mcp_jobs: Option<Arc<dyn toolfleet_mcp::Jobs>> = None;
    let served_runtime = runtime.clone();
    if roles.dispatcher {
        // Expired leases and lost retries are found within a lease, at most 10 s.
        let period = lease.min(Duration::from_secs(10));
        tokio::spawn(run_sweeper(
            store.clone(),
            broker.clone(),
            period,
            stopped.clone(),
        ));
        let webhooks = Arc::new(webhooks(&config)?);
        let tls = toolfleet_executors::tls_config()?;
        tokio::spawn(toolfleet_server::webhooks::deliver(
            store.clone(),
            notices.clone(),
            webhooks.clone(),
            Arc::new(move || toolfleet_executors::client_builder(tls.clone())),
            metrics.clone(),
            stopped.clone(),
        ));
        let auth = Arc::new(authentication(&config, &runtime)?);
        known = Some(auth.clone());
        let state = AppState {
            runtime,
            store,
            broker,
            notices,
            auth,
            webhooks,
            streams: Holds::new(api_limits.max_streams_per_principal, api_limits.max_streams),
            metrics_on_api: metrics_listen.is_none(),
            limits: api_limits,
            ops,
            mcp: McpSettings {
                allowed_origins: Arc::new(config.mcp.allowed_origins.clone()),
                page_size: config.mcp.page_size,
            },
            stopping: stopped.clone(),
            access,
        };
        mcp_jobs = Some(Arc::new(toolfleet_server::McpJobs::of(&state)));
        if roles.http {
            let listener = tokio::net::TcpListener::bind(&config.listen)
                .await
                .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
            let bound = listener.local_addr().map_err(|e| e.to_string())?;
            eprintln!(
                "toolfleet serving on http://{bound} (data in {})",
                config.data_dir.display()
            );
            address = Some(bound);
            servers.push(serving(
                listener,
                toolfleet_server::router(state),
                connection_limits,
                &stopped,
            ));
        }
    } else {
        eprintln!("toolfleet worker running ({} pools)", workers.len());
    }
    let done = tokio::spawn(async move {
        let servers: Vec<_> = servers.into_iter().map(tokio::spawn).collect();
        for server in servers {
            server
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
        }
        for worker in workers {
            let _ = worker.await;
        }
        Ok(())
    });
    Ok(Served {
        address,
        runtime: served_runtime,
        auth: known,
        mcp_jobs,
        stop,
        done,
    })
}

/// Every tenant's webhook settings: `[webhooks]` (its key, when absent,
/// kept in `data_dir`), and for each `[tenants.<name>.webhooks]` its own
/// `allow` and `secret`, each one left out being the global one.
fn webhooks(config: &Config) -> Result<Webhooks, String> {
    let key = match &config.webhooks.secret {
        Some(secret) => secret.clone(),
        None => kept_secret(&config.data_dir, "webhook-secret", || random_hex(32))?.0,
    };
    let global = HookSettings {
        allow: config.webhooks.allow.clone().into(),
        key: key.into_bytes().into(),
    };
    let mut webhooks = Webhooks::new(global.clone());
    for (tenant, settings) in &config.tenants {
        let Some(own) = &settings.webhooks else {
            continue;
        };
        if !config.auth.tokens.is_empty() && !config.auth.tokens.iter().any(|t| &t.tenant == tenant)
        {
            tracing::warn!(%tenant, "[tenants.{tenant}.webhooks] names a tenant no token of [[auth.tokens]] has");
        }
        let settings = HookSettings {
            allow: match &own.allow {
                Some(allow) => allow.clone().into(),
                None => global.allow.clone(),
            },
            key: match &own.secret {
                Some(secret) => secret.as_bytes().into(),
                None => global.key.clone(),
            },
        };
        webhooks = webhooks.with_tenant(tenant.clone(), settings);
    }
    Ok(webhooks)
}

/// An HTTP server running until the process stops.
type Serving = std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<()>> + Send>>;

/// Serves `router` on `listener` within `limits` until `stopped` turns
/// true.
fn serving(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: toolfleet_server::http::ConnectionLimits,
    stopped: &watch::Receiver<bool>,
) -> Serving {
    Box::pin(toolfleet_server::http::serve(
        listener,
        router,
        limits,
        stopped.clone(),
    ))
}

/// Resolves on SIGTERM or Ctrl-C.
async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// `toolfleet mcp`: MCP over stdio as the principal of `TOOLFLEET_TOKEN`
/// (a configured token, or the development token when none is configured),
/// with this process's own runtime, workers and sweeper on the configured
/// backends. Refuses to start without a known token. Logs go to stderr:
/// stdout carries only the protocol.
pub async fn mcp_stdio(config: Config) -> Result<(), String> {
    let token = std::env::var("TOOLFLEET_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| {
            "toolfleet mcp needs TOOLFLEET_TOKEN: a token of [[auth.tokens]], or the development token `toolfleet serve` prints".to_owned()
        })?;
    let mut options = toolfleet_mcp::Options {
        page_size: config.mcp.page_size,
        max_body: config.max_body_bytes,
        ..toolfleet_mcp::Options::default()
    };
    let roles = Roles {
        dispatcher: true,
        pools: None,
        no_workers: false,
        http: false,
    };
    let served = start(config, Vec::new(), roles).await?;
    options.jobs = served.mcp_jobs.clone();
    let bearer = format!("Bearer {}", token.trim());
    let principal = match served.auth.as_ref().map(|a| a.principal(Some(&bearer))) {
        Some(Ok(principal)) => principal,
        Some(Err(error)) => {
            let _ = served.stop().await;
            return Err(format!("TOOLFLEET_TOKEN: {}", error.message));
        }
        None => {
            let _ = served.stop().await;
            return Err("no tokens are known to this process".to_owned());
        }
    };
    let outcome = tokio::select! {
        outcome = toolfleet_mcp::serve_stdio(served.runtime.clone(), principal, options) => outcome,
        _ = wait_for_signal() => Ok(()),
    };
    let stopped = served.stop().await;
    outcome.and(stopped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolfleet_broker::SETTLED_STATES;
    use toolfleet_core::JobState;
    use toolfleet_fleet::backends::{CANCELLED_STATE, NOTICE_BUFFER};

    fn parse(text: &str) -> Config {
        Config::parse(text, std::path::Path::new("toolfleet.toml")).expect("a configuration")
    }

    #[test]
    fn a_tenant_takes_each_webhook_setting_it_leaves_out_from_webhooks() {
        let global_key = "g".repeat(32);
        let own_key = "o".repeat(32);
        let config = parse(&format!(
            r#"
[webhooks]
allow = ["127.0.0.1:*"]
secret = "{global_key}"

[tenants.keyed.webhooks]
secret = "{own_key}"

[tenants.listed.webhooks]
allow = ["hooks.listed.example"]

[tenants.closed.webhooks]
allow = []

[tenants.bare]
"#
        ));
        let webhooks = webhooks(&config).expect("settings");
        let allow = |tenant: &str| -> Vec<String> {
            webhooks
                .of(tenant)
                .allow
                .iter()
                .map(|r| r.to_string())
                .collect()
        };
        let key = |tenant: &str| webhooks.of(tenant).key.to_vec();
        assert_eq!(allow("keyed"), ["127.0.0.1:*"]);
        assert_eq!(key("keyed"), own_key.as_bytes());
        assert_eq!(allow("listed"), ["hooks.listed.example"]);
        assert_eq!(key("listed"), global_key.as_bytes());
        assert!(allow("closed").is_empty());
        for other in ["bare", "anyone"] {
            assert_eq!(allow(other), ["127.0.0.1:*"]);
            assert_eq!(key(other), global_key.as_bytes());
        }
    }

    #[test]
    fn loopback_means_127_0_0_0_8_the_ipv6_loopback_and_localhost() {
        for listen in [
            "127.0.0.1:8080",
            "127.1.2.3:0",
            "[::1]:8080",
            "[::ffff:127.0.0.1]:80",
            "localhost:8080",
            "LocalHost:0",
        ] {
            assert!(is_loopback(listen), "{listen}");
        }
        for listen in [
            "0.0.0.0:8080",
            "[::]:8080",
            "10.0.0.1:8080",
            "example.com:8080",
            "localhost.example.com:80",
            "localhost",
        ] {
            assert!(!is_loopback(listen), "{listen}");
        }
    }

    /// Only the HTTP API needs a token; `serve` makes one on loopback only.
    #[test]
    fn the_http_api_without_tokens_is_refused_but_serve_on_loopback() {
        let dispatcher = Roles {
            no_workers: true,
            ..Roles::all()
        };
        let worker = Roles {
            dispatcher: false,
            http: false,
            ..Roles::all()
        };
        let mcp = Roles {
            http: false,
            ..Roles::all()
        };
        let open = parse("listen = \"0.0.0.0:8080\"");
        let local = parse("listen = \"127.0.0.1:8080\"");
        let token = "\n[[auth.tokens]]\nsha256 = \"ab\"\ntenant = \"t\"\nuser = \"u\"\n";
        let open_with_token = parse(&format!("listen = \"0.0.0.0:8080\"{token}"));

        assert_eq!(check_tokens(&local, &Roles::all()), Ok(()));
        let serve = check_tokens(&open, &Roles::all()).unwrap_err();
        assert!(
            serve.contains("0.0.0.0:8080") && serve.contains("sha256sum"),
            "{serve}"
        );
        assert_eq!(check_tokens(&open_with_token, &Roles::all()), Ok(()));

        for config in [&local, &open] {
            let refused = check_tokens(config, &dispatcher).unwrap_err();
            assert!(refused.contains("[[auth.tokens]]"), "{refused}");
            assert_eq!(
                check_tokens(config, &worker),
                Ok(()),
                "workers serve no API"
            );
            assert_eq!(check_tokens(config, &mcp), Ok(()), "mcp speaks on stdio");
        }
        assert_eq!(check_tokens(&open_with_token, &dispatcher), Ok(()));
    }

    /// The RabbitMQ options of `config`, as `open_backends` makes them.
    fn rabbit_options(
        config: &Config,
        prefetch: u16,
        agent_pools: &BTreeSet<String>,
    ) -> Result<toolfleet_broker::rabbit::RabbitOptions, String> {
        toolfleet_fleet::backends::rabbit_options(&config.backend_settings(), prefetch, agent_pools)
    }

    /// A process's event subscriptions on RabbitMQ are as deep as its fan-out.
    #[test]
    fn event_subscriptions_hold_as_many_events_as_the_fan_out() {
        let options = rabbit_options(&parse(""), 16, &BTreeSet::new()).expect("valid options");
        assert_eq!(options.notice_buffer, NOTICE_BUFFER);
        assert_eq!(options.default_prefetch, 16);
    }

    /// Messages carry up to 64 job ids unless `jobs_per_message` says
    /// otherwise; 0 or more than 64 is refused, saying what is allowed.
    #[test]
    fn jobs_per_message_is_64_by_default_and_bounded() {
        let options = rabbit_options(&parse(""), 16, &BTreeSet::new()).expect("the default");
        assert_eq!(options.jobs_per_message, 64);
        let one =
            rabbit_options(&parse("jobs_per_message = 1"), 16, &BTreeSet::new()).expect("one");
        assert_eq!(one.jobs_per_message, 1);
        let agents = BTreeSet::from(["agents".to_owned()]);
        let options = rabbit_options(&parse(""), 16, &agents).expect("agents");
        assert_eq!(options.one_job_per_message, agents, "agents' jobs go alone");
        let named = rabbit_options(&parse(r#"one_job_per_message = ["reports"]"#), 16, &agents)
            .expect("named pools");
        assert_eq!(
            named.one_job_per_message,
            BTreeSet::from(["agents".to_owned(), "reports".to_owned()]),
            "named pools' jobs go alone too"
        );
        assert_eq!(named.jobs_per_message, 64, "the others' are grouped");
        let long = format!(r#"one_job_per_message = ["{}"]"#, "p".repeat(300));
        for refused in [r#"one_job_per_message = [""]"#, long.as_str()] {
            let error = rabbit_options(&parse(refused), 16, &agents).expect_err(refused);
            assert!(error.contains("one_job_per_message names pools"), "{error}");
        }
        for refused in ["jobs_per_message = 0", "jobs_per_message = 65"] {
            let error = rabbit_options(&parse(refused), 16, &BTreeSet::new()).expect_err(refused);
            assert!(
                error.contains("jobs_per_message must be 1 to 64"),
                "{error}"
            );
        }
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

    /// The job states a worker running agents hears are exactly the settled
    /// ones, cancelled among them (its executors stop on it), and it hears
    /// answered tickets.
    #[test]
    fn settled_states_are_the_settled_job_states() {
        for state in JobState::ALL {
            let name = state.as_str();
            assert_eq!(SETTLED_STATES.contains(&name), state.is_settled(), "{name}");
        }
        assert!(SETTLED_STATES.contains(&"answered"));
        for state in SETTLED_STATES.iter().filter(|s| **s != "answered") {
            assert!(
                JobState::parse(state).is_some_and(JobState::is_settled),
                "{state}"
            );
        }
    }
}
