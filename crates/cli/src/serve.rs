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
use toolfleet_core::{AuditSink, Runtime, RuntimeConfig, ToolDecl};
use toolfleet_fleet::backends::{Backends, heard_states};
use toolfleet_fleet::sweeper::sweep_period;
use toolfleet_fleet::{run_sweeper, sweep};
use toolfleet_server::bounds::Holds;
use toolfleet_server::http::ConnectionLimits;
use toolfleet_server::{
    Access, AppState, Auth, Dispatcher, McpSettings, Ops, Status, StoreAuditSink, StoreCommitLog,
    ops_router,
};
use toolfleet_store::Store;
use toolfleet_store::metered::MeteredStore;
use toolfleet_worker::{Worker, WorkerConfig};

use toolfleet_agent::AgentEnv;

use crate::config::{Config, DEFAULT_METRICS_LISTEN};
use crate::files::data_dir;
use crate::keys::{authentication, check_tokens, signing_key, webhooks};
use crate::tools::{agent_pools, all_pools, check_agents, register_tools};

/// How long running jobs may finish after a shutdown signal: `shutdown_grace_s`.
fn shutdown_grace(config: &Config) -> Result<Duration, String> {
    Duration::try_from_secs_f64(config.shutdown_grace_s).map_err(|_| {
        format!(
            "shutdown_grace_s must be a number of seconds, at least 0, got {}",
            config.shutdown_grace_s
        )
    })
}

/// `toolfleet migrate`: PostgreSQL's migrations with `database_url`, else
/// the SQLite file's (which `serve` also applies when it opens it).
pub(crate) async fn migrate(config: &Config) -> Result<(), String> {
    if config.database_url.is_none() {
        data_dir(&config.data_dir)?;
    }
    let done = toolfleet_fleet::backends::migrate(&config.backend_settings()).await?;
    eprintln!("{done}");
    Ok(())
}

/// Which parts a process runs.
#[derive(Debug, Clone)]
pub(crate) struct Roles {
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
    pub(crate) fn all() -> Roles {
        Roles {
            dispatcher: true,
            pools: None,
            no_workers: false,
            http: true,
        }
    }

    /// The `role` of `toolfleet_build_info`: what this process runs as.
    pub(crate) fn metrics_role(&self) -> Role {
        match (self.dispatcher, self.http, self.no_workers) {
            (false, _, _) => Role::Worker,
            (true, false, _) => Role::Mcp,
            (true, true, true) => Role::Dispatcher,
            (true, true, false) => Role::Serve,
        }
    }
}

/// Runs `roles` until SIGTERM or Ctrl-C, then stops gracefully.
pub(crate) async fn run(config: Config, roles: Roles) -> Result<(), String> {
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
pub(crate) struct Served {
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
    pub(crate) async fn stop(self) -> Result<(), String> {
        let _ = self.stop.send(true);
        self.done.await.map_err(|e| e.to_string())?
    }
}

/// Opens the backends `config` names, through the fleet's one choice of
/// them ([`toolfleet_fleet::backends::open`]); the SQLite file's directory
/// is made owner-only first.
pub(crate) async fn open_backends(
    config: &Config,
    prefetch: u16,
    only_states: Option<&[toolfleet_broker::EventState]>,
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

/// Starts `roles`, with `extra` tools beside the configured ones: the
/// backends and the runtime every role shares, then `/metrics` off the API
/// port where it is served there, the workers of its pools, and the
/// dispatcher (the sweeper, webhooks and the HTTP API).
pub(crate) async fn start(
    config: Config,
    extra: Vec<ToolDecl>,
    roles: Roles,
) -> Result<Served, String> {
    // Refused before anything is opened. The data directory is made when
    // something is kept in it (SQLite, a secret, the development token).
    check_tokens(&config, &roles)?;
    let api_limits = config.limits.api(config.max_body_bytes)?;
    let connection_limits = config.limits.connections()?;
    let lease = lease_of(&config)?;
    let grace = shutdown_grace(&config)?;
    let horizon = sweep_period(lease);
    let (shared, in_process) = open_shared(&config, extra, &roles, &api_limits, horizon).await?;
    if in_process {
        // The in-process queue starts empty: refill it from the store first.
        let (store, broker) = (shared.store.as_ref(), shared.broker.as_ref());
        let refilled = sweep(store, broker, 100_000, None, horizon).await?;
        if refilled > 0 {
            tracing::info!(jobs = refilled, "requeued jobs left from the last run");
        }
    }
    let (stop, stopped) = watch::channel(false);
    let pools = match (&roles.pools, roles.no_workers) {
        (_, true) => Vec::new(),
        (Some(pools), false) => pools.clone(),
        (None, false) => all_pools(&shared.runtime, &config).into_iter().collect(),
    };
    // The queues /metrics shows: those this process works, and every pool
    // of the registered tools where it dispatches.
    let mut shown: BTreeSet<String> = pools.iter().cloned().collect();
    if roles.dispatcher {
        shown.extend(all_pools(&shared.runtime, &config));
    }
    // Ready once its workers consume their pools, as well as once the
    // servers answer.
    let ops = Arc::new(
        Ops::new(
            shared.metrics.clone(),
            shared.store.clone(),
            shared.broker.clone(),
            shown.into_iter().collect(),
        )
        .working(pools.clone()),
    );
    let mut servers: Vec<Serving> = Vec::new();
    let metrics_off_api =
        match metrics_server(&config, &roles, &ops, connection_limits, &stopped).await? {
            Some(server) => {
                servers.push(server);
                true
            }
            None => false,
        };
    let workers: Vec<_> = pools
        .into_iter()
        .map(|pool| {
            let long =
                shared.agent_pools.contains(&pool) || config.one_job_per_message.contains(&pool);
            let ordered = shared.runtime.is_ordered(&pool);
            let mut worker_config = WorkerConfig::new(pool);
            worker_config.ordered = ordered;
            worker_config.concurrency = config.concurrency;
            (worker_config.ahead, worker_config.ahead_max) = prefetch_ahead(&config, long);
            worker_config.lease = lease;
            let worker = Worker::new(
                worker_config,
                shared.runtime.clone(),
                shared.store.clone(),
                shared.broker.clone(),
                shared.notices.clone(),
            );
            tokio::spawn(worker.run(stopped.clone(), grace))
        })
        .collect();
    let runtime = shared.runtime.clone();
    // Every process beats for the jobs it publishes after answering, and
    // publishes those of one that fell silent.
    let outbox = tokio::spawn(toolfleet_fleet::run_outbox(
        shared.store.clone(),
        shared.broker.clone(),
        shared.outbox.clone(),
        grace,
        stopped.clone(),
    ));
    let (address, auth, mcp_jobs) = if roles.dispatcher {
        let dispatching = Dispatching {
            api_limits,
            connection_limits,
            metrics_off_api,
            lease,
            ops,
        };
        let served = dispatch(&config, &roles, shared, dispatching, &stopped).await?;
        servers.extend(served.server);
        (served.address, Some(served.auth), Some(served.mcp_jobs))
    } else {
        eprintln!("toolfleet worker running ({} pools)", workers.len());
        (None, None, None)
    };
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
        let _ = outbox.await;
        Ok(())
    });
    Ok(Served {
        address,
        runtime,
        auth,
        mcp_jobs,
        stop,
        done,
    })
}

/// What every role of a process shares: its backends, metered, the
/// metrics registry, and the runtime with every tool registered.
struct Shared {
    store: Arc<dyn Store>,
    broker: Arc<dyn Broker>,
    notices: Arc<dyn Notices>,
    metrics: Arc<Metrics>,
    runtime: Arc<Runtime>,
    access: Access,
    /// Where this process's jobs are published from.
    outbox: Arc<toolfleet_fleet::Outbox>,
    /// The pools of agents' jobs: long, each in a message of its own.
    agent_pools: BTreeSet<String>,
    /// `[[schedules]]`, checked against the tools.
    schedules: Arc<[toolfleet_fleet::schedules::Schedule]>,
}

/// Opens the backends `config` names (as deep a subscription as `roles`
/// needs), meters them, and builds the runtime on them with the
/// configured tools and `extra`; true beside it for the in-process queue.
/// Its dispatcher publishes at once the scheduled jobs due within
/// `horizon`, the sweep period.
async fn open_shared(
    config: &Config,
    extra: Vec<ToolDecl>,
    roles: &Roles,
    api_limits: &toolfleet_server::Limits,
    horizon: Duration,
) -> Result<(Shared, bool), String> {
    let prefetch = u16::try_from(config.concurrency.max(1)).unwrap_or(u16::MAX);
    let agent_pools = agent_pools(config, &extra);
    let Backends {
        store,
        broker,
        notices,
        in_process,
    } = {
        let heard = (!roles.dispatcher).then(|| heard_states(&agent_pools, roles.pools.as_deref()));
        open_backends(config, prefetch, heard, &agent_pools).await?
    };
    // One registry for every part of this process, and the backends'
    // failures counted in it.
    let metrics = Arc::new(Metrics::for_role(roles.metrics_role()));
    let store: Arc<dyn Store> = Arc::new(MeteredStore::new(store, metrics.clone()));
    let broker: Arc<dyn Broker> = Arc::new(MeteredBroker::new(broker, metrics.clone()));
    let notices: Arc<dyn Notices> = Arc::new(MeteredNotices::new(notices, metrics.clone()));
    // Answers and cancels are audited beside the tools' calls.
    let audit: Arc<dyn AuditSink> = Arc::new(StoreAuditSink::spawn(store.clone(), 10_000));
    let access = Access::new(audit.clone(), api_limits.max_long_polls_per_principal);
    let dispatcher = Dispatcher::new(store.clone(), broker.clone(), notices.clone())
        .with_metrics(metrics.clone())
        .with_horizon(horizon);
    let outbox = dispatcher.outbox();
    let mut runtime = Runtime::builder()
        .config(RuntimeConfig {
            fair_share: config.fair_share.iter().cloned().collect(),
            ..RuntimeConfig::default()
        })
        .secret(signing_key(config)?)
        .metrics(metrics.clone())
        .fleet(Arc::new(dispatcher))
        .commit_log(Arc::new(StoreCommitLog::new(store.clone())))
        .handles(Arc::new(toolfleet_fleet::StoreHandles::new(
            store.clone(),
            config.handles.bounds()?,
        )))
        .audit_sink(audit);
    if config.database_url.is_some() {
        // Dispatchers that share PostgreSQL share their rate limits too;
        // one process on SQLite keeps them in its memory.
        let buckets = toolfleet_fleet::limits::StoreBuckets::new(store.clone());
        runtime = runtime.rate_limits(Arc::new(buckets));
    }
    let mut runtime = runtime.build();
    let agents = AgentEnv::with_max_depth(store.clone(), notices.clone(), config.max_agent_depth);
    let status = Status::new(store.clone(), notices.clone(), access.clone());
    register_tools(&mut runtime, config, status, &agents)?;
    runtime.register_all(extra).map_err(|e| e.to_string())?;
    check_agents(&runtime, config)?;
    let schedules = crate::tools::schedules(&runtime, config)?;
    toolfleet_mcp::declared::check(&config.resources, runtime.registry())?;
    access.learn(runtime.registry());
    let runtime = Arc::new(runtime);
    agents.set_runtime(&runtime);
    let shared = Shared {
        store,
        broker,
        notices,
        metrics,
        runtime,
        access,
        outbox,
        agent_pools,
        schedules,
    };
    Ok((shared, in_process))
}

/// Jobs a worker holds beyond its slots unless `prefetch_ahead` says, per
/// slot: claimed as they come, so that a slot runs one job while the
/// store's round trips of others overlap it (as Celery's default prefetch
/// multiplier).
const AHEAD_PER_SLOT: usize = 4;

/// Jobs a worker holds beyond its slots, per slot, at most, while its
/// pool's messages leave its hand quickly (unless `prefetch_ahead` says):
/// its claims and settlements go to the store in larger groups.
const DEEP_AHEAD_PER_SLOT: usize = 16;

/// The jobs a worker of a pool holds beyond its slots, claimed ahead, and
/// the most it holds while they leave its hand quickly: none for a pool of
/// long jobs (they wait in the queue, where any worker may take them), else
/// `prefetch_ahead` (both), by default [`AHEAD_PER_SLOT`] per slot deepening
/// to [`DEEP_AHEAD_PER_SLOT`] on RabbitMQ (a message may carry many jobs,
/// and each held message's clock toward RabbitMQ's `consumer_timeout` runs
/// from its delivery), at most what a prefetch counts. The in-process
/// queue does not deepen: it hands a message over only when the worker
/// takes it, and there the claims of a deeper hand only contend with the
/// calls' inserts for SQLite's one writer.
fn prefetch_ahead(config: &Config, long: bool) -> (usize, usize) {
    if long {
        return (0, 0);
    }
    let most = usize::from(u16::MAX).saturating_sub(config.concurrency);
    let per_slot = |n: usize| config.concurrency.saturating_mul(n).min(most);
    match (config.prefetch_ahead, &config.broker_url) {
        (Some(ahead), _) => (ahead.min(most), ahead.min(most)),
        (None, Some(_)) => (per_slot(AHEAD_PER_SLOT), per_slot(DEEP_AHEAD_PER_SLOT)),
        (None, None) => (per_slot(AHEAD_PER_SLOT), per_slot(AHEAD_PER_SLOT)),
    }
}

/// `lease_s`, at least 0.3 seconds.
fn lease_of(config: &Config) -> Result<Duration, String> {
    Duration::try_from_secs_f64(config.lease_s)
        .ok()
        .filter(|l| *l >= Duration::from_millis(300))
        .ok_or_else(|| {
            format!(
                "lease_s must be at least 0.3 seconds, got {}",
                config.lease_s
            )
        })
}

/// `/metrics`, `/healthz` and `/readyz` off the API port: always without
/// the API (a worker), and beside it where `metrics_listen` is set; `None`
/// where the API serves them. Bound before any work is taken, so a port in
/// use stops the process with nothing started.
async fn metrics_server(
    config: &Config,
    roles: &Roles,
    ops: &Arc<Ops>,
    limits: ConnectionLimits,
    stopped: &watch::Receiver<bool>,
) -> Result<Option<Serving>, String> {
    let listen = match (roles.dispatcher, roles.http, &config.metrics_listen) {
        (false, _, listen) => listen.as_deref().unwrap_or(DEFAULT_METRICS_LISTEN),
        (true, true, Some(listen)) => listen.as_str(),
        (true, _, _) => return Ok(None),
    };
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
    Ok(Some(serving(
        listener,
        ops_router(ops.clone()),
        limits,
        stopped,
    )))
}

/// How the dispatcher of a process serves, beside what every role shares.
struct Dispatching {
    api_limits: toolfleet_server::Limits,
    connection_limits: ConnectionLimits,
    /// `/metrics` is served off the API port.
    metrics_off_api: bool,
    lease: Duration,
    ops: Arc<Ops>,
}

/// A dispatcher running: its HTTP server (where it listens for HTTP), the
/// tokens it knows and its jobs for MCP.
struct Dispatched {
    server: Option<Serving>,
    address: Option<std::net::SocketAddr>,
    auth: Arc<Auth>,
    mcp_jobs: Arc<dyn toolfleet_mcp::Jobs>,
}

/// Starts the dispatcher's parts on `shared`: the sweeper, the webhook
/// sender and, where `roles` listen for HTTP, the API on `listen`.
async fn dispatch(
    config: &Config,
    roles: &Roles,
    shared: Shared,
    how: Dispatching,
    stopped: &watch::Receiver<bool>,
) -> Result<Dispatched, String> {
    let Shared {
        store,
        broker,
        notices,
        metrics,
        runtime,
        access,
        outbox: _,
        agent_pools: _,
        schedules,
    } = shared;
    // Expired leases and lost retries are found within a lease, at most 10
    // s; scheduled jobs are published a period before they are due.
    let period = sweep_period(how.lease);
    tokio::spawn(run_sweeper(
        store.clone(),
        broker.clone(),
        period,
        stopped.clone(),
    ));
    // The broker's dead letters end in the store: each pool's are taken
    // here, their jobs failed `dead_lettered`.
    tokio::spawn(toolfleet_fleet::dead_letters::run_dead_letters(
        toolfleet_fleet::dead_letters::Reconciler {
            store: store.clone(),
            broker: broker.clone(),
            notices: notices.clone(),
            runtime: runtime.clone(),
        },
        all_pools(&runtime, config).into_iter().collect(),
        stopped.clone(),
    ));
    tokio::spawn(toolfleet_fleet::retention::run_retention(
        store.clone(),
        config.retention.retention(),
        toolfleet_fleet::retention::PERIOD,
        stopped.clone(),
    ));
    tokio::spawn(toolfleet_fleet::schedules::run_schedules(
        toolfleet_fleet::schedules::Ticker {
            store: store.clone(),
            runtime: runtime.clone(),
            schedules: schedules.clone(),
        },
        stopped.clone(),
    ));
    tokio::spawn(toolfleet_fleet::sweeper::run_people_sweeper(
        toolfleet_fleet::sweeper::People {
            store: store.clone(),
            broker: broker.clone(),
            notices: notices.clone(),
            runtime: runtime.clone(),
        },
        Duration::from_secs(5),
        stopped.clone(),
    ));
    let webhooks = Arc::new(webhooks(config)?);
    let tls = toolfleet_executors::tls_config()?;
    tokio::spawn(toolfleet_server::webhooks::deliver(
        store.clone(),
        notices.clone(),
        webhooks.clone(),
        Arc::new(move || toolfleet_executors::client_builder(tls.clone())),
        metrics,
        stopped.clone(),
    ));
    let auth = Arc::new(authentication(config, &runtime)?);
    let state = AppState {
        runtime,
        store,
        broker,
        notices,
        auth: auth.clone(),
        webhooks,
        streams: Holds::new(
            how.api_limits.max_streams_per_principal,
            how.api_limits.max_streams,
        ),
        metrics_on_api: !how.metrics_off_api,
        limits: how.api_limits,
        ops: how.ops,
        mcp: McpSettings {
            allowed_origins: Arc::new(config.mcp.allowed_origins.clone()),
            page_size: config.mcp.page_size,
            resources: Arc::from(config.resources.clone()),
            state_key: Some(toolfleet_mcp::asking::derive_key(&signing_key(config)?)),
            sessions: config.mcp.sessions,
            max_sessions: config.mcp.max_sessions()?,
            watch_every: config.mcp.watch_every()?,
        },
        stopping: stopped.clone(),
        access,
        runs: crate::tools::run_settings(config),
        schedules,
        console_key: toolfleet_server::console::session::ConsoleKey::derive(&signing_key(config)?),
    };
    let mcp_jobs: Arc<dyn toolfleet_mcp::Jobs> = Arc::new(toolfleet_server::McpJobs::of(&state));
    let (server, address) = if roles.http {
        let listener = tokio::net::TcpListener::bind(&config.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
        let bound = listener.local_addr().map_err(|e| e.to_string())?;
        eprintln!(
            "toolfleet serving on http://{bound} (data in {})",
            config.data_dir.display()
        );
        let router = toolfleet_server::router(state);
        let server = serving(listener, router, how.connection_limits, stopped);
        (Some(server), Some(bound))
    } else {
        (None, None)
    };
    Ok(Dispatched {
        server,
        address,
        auth,
        mcp_jobs,
    })
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
pub(crate) async fn mcp_stdio(config: Config) -> Result<(), String> {
    let token = std::env::var("TOOLFLEET_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| {
            "toolfleet mcp needs TOOLFLEET_TOKEN: a token of [[auth.tokens]], or the development token `toolfleet serve` prints".to_owned()
        })?;
    let mut options = toolfleet_mcp::Options {
        page_size: config.mcp.page_size,
        max_body: config.max_body_bytes,
        declared: Arc::from(config.resources.clone()),
        state_key: Some(toolfleet_mcp::asking::derive_key(&signing_key(&config)?)),
        watch_every: config.mcp.watch_every()?,
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
    use toolfleet_fleet::backends::NOTICE_BUFFER;

    fn parse(text: &str) -> Config {
        Config::parse(text, std::path::Path::new("toolfleet.toml")).expect("a configuration")
    }

    /// The RabbitMQ options of `config`, as `open_backends` makes them.
    fn rabbit_options(
        config: &Config,
        prefetch: u16,
        agent_pools: &BTreeSet<String>,
    ) -> Result<toolfleet_broker::rabbit::RabbitOptions, String> {
        toolfleet_fleet::backends::rabbit_options(&config.backend_settings(), prefetch, agent_pools)
    }

    /// A worker holds four jobs ahead per slot, on RabbitMQ sixteen while
    /// they leave its hand quickly, unless `prefetch_ahead` fixes it,
    /// bounded by what a prefetch counts; a pool of long jobs holds none.
    #[test]
    fn workers_hold_messages_ahead_except_for_long_jobs() {
        let rabbit = "database_url = \"postgres://x\"\nbroker_url = \"amqp://y\"\n";
        let config = parse(&format!("{rabbit}concurrency = 8"));
        assert_eq!(prefetch_ahead(&config, false), (32, 128));
        assert_eq!(prefetch_ahead(&config, true), (0, 0));
        let config = parse("concurrency = 8");
        assert_eq!(prefetch_ahead(&config, false), (32, 32), "in-process");
        let config = parse(&format!("{rabbit}concurrency = 8\nprefetch_ahead = 5"));
        assert_eq!(prefetch_ahead(&config, false), (5, 5));
        assert_eq!(prefetch_ahead(&config, true), (0, 0));
        let config = parse(&format!("{rabbit}concurrency = 8\nprefetch_ahead = 100000"));
        assert_eq!(prefetch_ahead(&config, false), (65_535 - 8, 65_535 - 8));
        let config = parse(&format!("{rabbit}concurrency = 5000"));
        assert_eq!(prefetch_ahead(&config, false), (20_000, 65_535 - 5000));
    }

    /// A process's event subscriptions on RabbitMQ are as deep as its fan-out.
    #[test]
    fn event_subscriptions_hold_as_many_events_as_the_fan_out() {
        let options = rabbit_options(&parse(""), 16, &BTreeSet::new()).expect("valid options");
        assert_eq!(options.notice_buffer, NOTICE_BUFFER);
        assert_eq!(options.default_prefetch, 16);
    }

    /// RabbitMQ's own delivery limit holds unless `delivery_limit` sets one,
    /// of 1 to 10,000.
    #[test]
    fn a_delivery_limit_is_rabbitmqs_unless_set_and_bounded() {
        let none = BTreeSet::new();
        let options = rabbit_options(&parse(""), 16, &none).expect("the default");
        assert_eq!(options.delivery_limit, None);
        let set = rabbit_options(&parse("delivery_limit = 5"), 16, &none).expect("five");
        assert_eq!(set.delivery_limit, Some(5));
        for refused in ["delivery_limit = 0", "delivery_limit = 10001"] {
            let error = rabbit_options(&parse(refused), 16, &none).expect_err(refused);
            assert!(
                error.contains("delivery_limit must be 1 to 10000"),
                "{error}"
            );
        }
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

    /// The job states a worker running agents hears are exactly the settled
    /// ones, cancelled among them (its executors stop on it), and it hears
    /// answered tickets.
    #[test]
    fn settled_states_are_the_settled_job_states() {
        use toolfleet_broker::{EventState, TicketState};
        for state in JobState::SHOWN {
            assert_eq!(
                SETTLED_STATES.contains(&EventState::Job(state)),
                state.is_settled(),
                "{state}"
            );
        }
        assert!(SETTLED_STATES.contains(&EventState::Ticket(TicketState::Answered)));
        assert!(!SETTLED_STATES.contains(&EventState::Ticket(TicketState::Open)));
        for state in EventState::ALL {
            assert_eq!(
                SETTLED_STATES.contains(&state),
                state.is_outcome(),
                "{state}"
            );
        }
    }
}
