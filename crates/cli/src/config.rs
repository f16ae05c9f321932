//! `toolfleet.toml`: the keys of docs/API.md, the environment overrides, and the
//! tool files it includes. A backend is chosen here and nowhere else.
//!
//! The file is read with the `toml` crate directly: JSON Schemas sit inline
//! in it, and their keys (`additionalProperties`, `minItems`) must reach the
//! schema compiler exactly as written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toolfleet_core::config::{AgentDecl, ToolConfig, parse_agents, parse_tools, resolve_agents};
use toolfleet_server::callbacks::AllowRule;
use toolfleet_telemetry::LogFormat;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TokenConfig {
    pub sha256: String,
    pub tenant: String,
    pub user: String,
    #[serde(default)]
    pub scopes: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuthConfig {
    #[serde(default)]
    pub tokens: Vec<TokenConfig>,
}

/// `[webhooks]`: every tenant's, but those with their own.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WebhookConfig {
    /// What a `callback_url` may reach: `host` (ports 80 and 443),
    /// `host:port`, `host:*`, addresses and networks (see
    /// [`toolfleet_server::callbacks`]), read here, so a bad entry stops
    /// the start.
    #[serde(default)]
    pub allow: Vec<AllowRule>,
    /// The key webhooks are signed with; absent, one is kept in the data directory.
    pub secret: Option<String>,
}

/// `[tenants.<name>.webhooks]`: a tenant's own allow-list and key; each
/// one left out is the global one of `[webhooks]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TenantWebhookConfig {
    /// Replaces `[webhooks] allow` for the tenant (`[]`: no callback).
    pub allow: Option<Vec<AllowRule>>,
    /// Replaces `[webhooks] secret` for the tenant's notices.
    pub secret: Option<String>,
}

/// `[tenants.<name>]`: the settings of one tenant.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TenantConfig {
    pub webhooks: Option<TenantWebhookConfig>,
}

/// `[mcp]`: how `/mcp` and `toolfleet mcp` behave.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct McpConfig {
    /// Browser origins (`https://app.example.com`) that may call `/mcp`
    /// beside the server's own host.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Tools per `tools/list` page.
    #[serde(default = "default_mcp_page_size")]
    pub page_size: usize,
    /// Whether an `initialize` over HTTP opens a session of this process
    /// (2025 revisions): the server may then ask the client during a call
    /// and send resource updates. Behind a load balancer, route by
    /// `Mcp-Session-Id`, or turn sessions off.
    #[serde(default = "default_true")]
    pub sessions: bool,
    /// Sessions open at once in one process, at most (1 to 1,000,000).
    #[serde(default = "default_mcp_max_sessions")]
    pub max_sessions: usize,
    /// How often a subscribed declared resource is read again, in
    /// milliseconds (100 to 3,600,000).
    #[serde(default = "default_mcp_watch_ms")]
    pub watch_ms: u64,
}

fn default_true() -> bool {
    true
}

fn default_mcp_max_sessions() -> usize {
    toolfleet_mcp::DEFAULT_MAX_SESSIONS
}

fn default_mcp_watch_ms() -> u64 {
    toolfleet_mcp::DEFAULT_WATCH_EVERY.as_millis() as u64
}

fn default_mcp_page_size() -> usize {
    toolfleet_mcp::DEFAULT_PAGE_SIZE
}

impl McpConfig {
    /// How often a subscribed declared resource is read again, or what is
    /// wrong with `watch_ms`.
    pub(crate) fn watch_every(&self) -> Result<std::time::Duration, String> {
        if !(100..=3_600_000).contains(&self.watch_ms) {
            return Err(format!(
                "[mcp] watch_ms is {}; it must be from 100 to 3600000 (an hour)",
                self.watch_ms
            ));
        }
        Ok(std::time::Duration::from_millis(self.watch_ms))
    }

    /// Sessions open at once in one process, or what is wrong with
    /// `max_sessions`.
    pub(crate) fn max_sessions(&self) -> Result<usize, String> {
        if !(1..=1_000_000).contains(&self.max_sessions) {
            return Err(format!(
                "[mcp] max_sessions is {}; it must be from 1 to 1000000",
                self.max_sessions
            ));
        }
        Ok(self.max_sessions)
    }
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            allowed_origins: Vec::new(),
            page_size: default_mcp_page_size(),
            sessions: true,
            max_sessions: default_mcp_max_sessions(),
            watch_ms: default_mcp_watch_ms(),
        }
    }
}

pub(crate) use toolfleet_fleet::backends::NoticesBackend;

/// `[retention]`: days each kind of settled record is kept before the
/// dispatchers delete it; 0 keeps it for ever.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RetentionConfig {
    /// Jobs that succeeded, failed or were cancelled.
    pub jobs_days: u32,
    /// Tickets answered or expired.
    pub tickets_days: u32,
    /// Runs that stopped: answered, failed, out of budget, cancelled.
    pub runs_days: u32,
    /// Audit records.
    pub audit_days: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        let days = (toolfleet_fleet::retention::DEFAULT_RETENTION.as_secs() / 86_400) as u32;
        RetentionConfig {
            jobs_days: days,
            tickets_days: days,
            runs_days: days,
            audit_days: days,
        }
    }
}

impl RetentionConfig {
    /// The retention it names; 0 days keeps a kind for ever.
    pub(crate) fn retention(&self) -> toolfleet_fleet::retention::Retention {
        let kept = |days: u32| {
            (days > 0).then(|| std::time::Duration::from_secs(u64::from(days) * 86_400))
        };
        toolfleet_fleet::retention::Retention {
            jobs: kept(self.jobs_days),
            tickets: kept(self.tickets_days),
            runs: kept(self.runs_days),
            audit: kept(self.audit_days),
        }
    }
}

/// `[handles]`: how long the large results of handle tools are kept, and
/// how much of them each tenant keeps (its oldest go first).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct HandlesConfig {
    /// Seconds a handle is readable after it was made (1 to 30 days' worth).
    pub ttl_s: u64,
    /// The most handles a tenant keeps.
    pub max_per_tenant: u32,
    /// The most bytes of handles a tenant keeps.
    pub max_bytes_per_tenant: u64,
}

impl Default for HandlesConfig {
    fn default() -> Self {
        let bounds = toolfleet_fleet::HandleBounds::default();
        HandlesConfig {
            ttl_s: bounds.ttl.as_secs(),
            max_per_tenant: bounds.max_per_tenant,
            max_bytes_per_tenant: bounds.max_bytes_per_tenant,
        }
    }
}

impl HandlesConfig {
    /// The bounds it names, or what is wrong with it.
    pub(crate) fn bounds(&self) -> Result<toolfleet_fleet::HandleBounds, String> {
        if !(1..=30 * 86_400).contains(&self.ttl_s) {
            return Err(format!(
                "[handles] ttl_s is {}; it must be from 1 to 2592000 (30 days)",
                self.ttl_s
            ));
        }
        if self.max_per_tenant == 0 || self.max_bytes_per_tenant == 0 {
            return Err("[handles] max_per_tenant and max_bytes_per_tenant must be above 0".into());
        }
        Ok(toolfleet_fleet::HandleBounds {
            ttl: std::time::Duration::from_secs(self.ttl_s),
            max_per_tenant: self.max_per_tenant,
            max_bytes_per_tenant: self.max_bytes_per_tenant,
        })
    }
}

/// `[limits]`: how many connections, streams and long polls a process
/// holds, and how long a request may take to arrive.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct LimitsConfig {
    /// Connections held at once by one process; one more is answered 503.
    pub connections: usize,
    /// Seconds a request's head may take to arrive, and a keep-alive
    /// connection may stay idle between requests.
    pub header_read_timeout_s: f64,
    /// Seconds a request's whole body may take to arrive.
    pub body_read_timeout_s: f64,
    /// Event streams open at once in one process; past it, 503.
    pub event_streams: usize,
    /// Event streams one principal holds open at once; past it, 429.
    pub event_streams_per_principal: usize,
    /// Long polls one principal holds at once; past it, 429 (`rate_limited`).
    pub long_polls_per_principal: usize,
    /// The largest checkpoint a caller keeps with a run, in bytes.
    pub run_checkpoint_bytes: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let limits = toolfleet_server::Limits::default();
        let connections = toolfleet_server::http::ConnectionLimits::default();
        LimitsConfig {
            connections: connections.max_connections,
            header_read_timeout_s: connections.header_read_timeout.as_secs_f64(),
            body_read_timeout_s: limits.body_read_timeout.as_secs_f64(),
            event_streams: limits.max_streams,
            event_streams_per_principal: limits.max_streams_per_principal,
            long_polls_per_principal: limits.max_long_polls_per_principal,
            run_checkpoint_bytes: 1024 * 1024,
        }
    }
}

impl LimitsConfig {
    /// The limits of the HTTP API with a body of at most `max_body` bytes,
    /// or what is wrong with them.
    pub(crate) fn api(&self, max_body: usize) -> Result<toolfleet_server::Limits, String> {
        let at_least_one = [
            ("event_streams", self.event_streams),
            (
                "event_streams_per_principal",
                self.event_streams_per_principal,
            ),
            ("long_polls_per_principal", self.long_polls_per_principal),
        ];
        if let Some((key, _)) = at_least_one.iter().find(|(_, n)| *n == 0) {
            return Err(format!("[limits] {key} must be at least 1"));
        }
        Ok(toolfleet_server::Limits {
            max_body,
            body_read_timeout: seconds("body_read_timeout_s", self.body_read_timeout_s)?,
            max_streams: self.event_streams,
            max_streams_per_principal: self.event_streams_per_principal,
            max_long_polls_per_principal: self.long_polls_per_principal,
            ..toolfleet_server::Limits::default()
        })
    }

    /// The limits of a process's connections, or what is wrong with them.
    pub(crate) fn connections(&self) -> Result<toolfleet_server::http::ConnectionLimits, String> {
        if self.connections == 0 {
            return Err("[limits] connections must be at least 1".to_owned());
        }
        Ok(toolfleet_server::http::ConnectionLimits {
            max_connections: self.connections,
            header_read_timeout: seconds("header_read_timeout_s", self.header_read_timeout_s)?,
        })
    }
}

/// `s` seconds of `[limits] key`, which must be positive and at most a day.
fn seconds(key: &str, s: f64) -> Result<std::time::Duration, String> {
    std::time::Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero() && d.as_secs() <= 86_400)
        .ok_or_else(|| {
            format!("[limits] {key} must be a number of seconds above 0 and at most 86400, got {s}")
        })
}

/// The settings of a process.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Config {
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Where `/metrics`, `/healthz` and `/readyz` are served off the API
    /// port: always for a worker (at [`DEFAULT_METRICS_LISTEN`] when
    /// unset), and for a dispatcher or `serve` when set, which then serves
    /// none of them on `listen` beside its API.
    pub metrics_listen: Option<String>,
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    pub database_url: Option<String>,
    pub broker_url: Option<String>,
    /// The PostgreSQL schema of toolfleet's tables (default: the search path's).
    pub database_schema: Option<String>,
    /// The PEM file of the CA that signed PostgreSQL's certificate, when
    /// `database_url` names no `sslrootcert`.
    pub database_ca_file: Option<PathBuf>,
    /// Connections to PostgreSQL per process.
    #[serde(default = "default_database_pool")]
    pub database_pool: usize,
    /// The PEM file of the CA that signed RabbitMQ's certificate, for an
    /// `amqps://` `broker_url` without `cacertfile`.
    pub broker_ca_file: Option<PathBuf>,
    /// First part of every RabbitMQ queue and exchange name.
    #[serde(default = "default_broker_prefix")]
    pub broker_prefix: String,
    /// The most job ids one RabbitMQ message carries under load.
    #[serde(default = "default_jobs_per_message")]
    pub jobs_per_message: usize,
    /// Pools whose jobs each travel in a message of their own whatever
    /// `jobs_per_message` says (pools of long jobs); agents' pools always do.
    #[serde(default)]
    pub one_job_per_message: Vec<String>,
    /// RabbitMQ's `x-delivery-limit` of the pool queues this fleet declares:
    /// a message that came back unsettled more often is dead-lettered.
    pub delivery_limit: Option<u32>,
    /// Pools whose waiting jobs are taken in turns by tenant, so that one
    /// tenant's backlog cannot starve another's jobs.
    #[serde(default)]
    pub fair_share: Vec<String>,
    /// How settled work is announced across processes; see
    /// [`toolfleet_fleet::backends::Settings::notices_backend`] for the default.
    pub notices: Option<NoticesBackend>,
    /// Key of confirm tokens (hex, 64 characters), shared by every dispatcher
    /// of a fleet; absent, one is kept in `data_dir`.
    pub confirm_secret: Option<String>,
    #[serde(default)]
    pub include: Vec<PathBuf>,
    #[serde(default)]
    pub auth: AuthConfig,
    #[serde(default)]
    pub webhooks: WebhookConfig,
    /// Settings of single tenants, by name.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantConfig>,
    #[serde(default)]
    pub mcp: McpConfig,
    /// Parsed separately, with their file's directory for schema files.
    #[serde(default, rename = "tools")]
    _tools: Vec<toml::Value>,
    /// Parsed separately, like the tools.
    #[serde(default, rename = "agents")]
    _agents: Vec<toml::Value>,
    /// Worker slots per pool in `serve`.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Jobs a worker holds beyond its slots, claimed ahead, so the next job
    /// is at hand when one frees; `None`: four per slot. Pools of long
    /// jobs (`one_job_per_message`, agents' pools) hold none.
    #[serde(default)]
    pub prefetch_ahead: Option<usize>,
    /// How long a worker's claim on a job lasts without a heartbeat, in seconds.
    #[serde(default = "default_lease_s")]
    pub lease_s: f64,
    /// How long running jobs may finish after SIGTERM, in seconds.
    #[serde(default = "default_shutdown_grace_s")]
    pub shutdown_grace_s: f64,
    /// Largest request body, in bytes.
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
    /// `[limits]`: what a client may hold of a process.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// `[retention]`: how long settled records are kept.
    #[serde(default)]
    pub retention: RetentionConfig,
    /// `[handles]`: how long handles are kept and how much of them.
    #[serde(default)]
    pub handles: HandlesConfig,
    /// `[[resources]]`: MCP resources, each read through a query tool.
    #[serde(default)]
    pub resources: Vec<toolfleet_mcp::declared::Declared>,
    /// `[[schedules]]`: jobs started at the ticks of cron expressions.
    #[serde(default)]
    pub schedules: Vec<toolfleet_fleet::schedules::ScheduleSpec>,
    /// How deep agents may call agents: 1 lets no agent call another.
    #[serde(default = "default_max_agent_depth")]
    pub max_agent_depth: u32,
    /// How log lines are written: `"text"` (the default) or `"json"`.
    #[serde(default)]
    pub log_format: LogFormat,
    /// The base URL of an OTLP/HTTP receiver spans are exported to
    /// (`http://collector:4318`; `/v1/traces` is added); absent, none are.
    pub otlp_endpoint: Option<String>,
    /// The tools, each with the directory its schema files are relative to.
    #[serde(skip)]
    pub tools: Vec<(ToolConfig, PathBuf)>,
    /// The assistants of `[[agents]]`, of this file and its includes.
    #[serde(skip)]
    pub agents: Vec<AgentDecl>,
    /// The file this came from, if any.
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

fn default_listen() -> String {
    "127.0.0.1:8080".to_owned()
}
/// Where a worker serves its metrics when `metrics_listen` is not set.
pub(crate) const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9091";
fn default_data_dir() -> PathBuf {
    PathBuf::from(".toolfleet")
}
fn default_database_pool() -> usize {
    16
}
fn default_broker_prefix() -> String {
    "toolfleet".to_owned()
}
fn default_jobs_per_message() -> usize {
    toolfleet_broker::rabbit::MAX_IDS_PER_MESSAGE
}
fn default_concurrency() -> usize {
    16
}
fn default_lease_s() -> f64 {
    30.0
}
fn default_shutdown_grace_s() -> f64 {
    20.0
}
fn default_max_agent_depth() -> u32 {
    toolfleet_agent::DEFAULT_MAX_DEPTH
}
fn default_max_body() -> usize {
    1024 * 1024
}

/// The shortest webhook key (`[webhooks] secret`, TOOLFLEET_WEBHOOK_SECRET)
/// taken, in bytes: as long as the HMAC-SHA256 it keys.
pub(crate) const MIN_WEBHOOK_SECRET_BYTES: usize = 32;

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

impl Config {
    /// The file named by `--config`, else `TOOLFLEET_CONFIG`, else
    /// `./toolfleet.toml`; with none, the defaults and the expense pack
    /// (`examples/expenses/toolfleet.toml`, built into the binary).
    pub(crate) fn load(explicit: Option<&Path>) -> Result<Config, String> {
        let named = explicit
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("TOOLFLEET_CONFIG").map(PathBuf::from));
        let path = named.clone().or_else(|| {
            let here = PathBuf::from("toolfleet.toml");
            here.exists().then_some(here)
        });
        let mut config = match &path {
            Some(path) => Config::parse(&read(path)?, path)?,
            // The expense pack is built in, so this works from any directory.
            None => Config::parse(toolfleet_expenses::TOOLS_TOML, Path::new("."))?,
        };
        config.source = path;
        config.apply_env()?;
        config.check_secrets()?;
        config.load_includes()?;
        config.resolve_agents()?;
        Ok(config)
    }

    /// Gives each agent tool naming a declared assistant that one's spec;
    /// refuses two assistants of one name.
    pub(crate) fn resolve_agents(&mut self) -> Result<(), String> {
        let mut names = std::collections::BTreeSet::new();
        for agent in &self.agents {
            if !names.insert(agent.name.as_str()) {
                return Err(format!(
                    "two [[agents]] tables are named `{}`: an assistant is declared once",
                    agent.name
                ));
            }
        }
        let mut tools: Vec<ToolConfig> = self.tools.iter().map(|(t, _)| t.clone()).collect();
        resolve_agents(&mut tools, &self.agents).map_err(|e| e.to_string())?;
        for ((tool, _), resolved) in self.tools.iter_mut().zip(tools) {
            *tool = resolved;
        }
        Ok(())
    }

    /// Refuses secrets of the configuration or the environment that are too
    /// short to be keys: a webhook key (global or a tenant's) under
    /// [`MIN_WEBHOOK_SECRET_BYTES`], a confirm-token key that is not 32
    /// bytes in hex.
    pub(crate) fn check_secrets(&self) -> Result<(), String> {
        if let Some(secret) = &self.webhooks.secret
            && secret.len() < MIN_WEBHOOK_SECRET_BYTES
        {
            return Err(format!(
                "[webhooks] secret (or TOOLFLEET_WEBHOOK_SECRET) is {} bytes long; the key webhooks are signed with must be at least {MIN_WEBHOOK_SECRET_BYTES} bytes: make one with `openssl rand -hex 32`, or leave it out and one is kept in data_dir",
                secret.len()
            ));
        }
        for (tenant, settings) in &self.tenants {
            if let Some(secret) = settings.webhooks.as_ref().and_then(|w| w.secret.as_ref())
                && secret.len() < MIN_WEBHOOK_SECRET_BYTES
            {
                return Err(format!(
                    "[tenants.{tenant}.webhooks] secret is {} bytes long; the key a tenant's webhooks are signed with must be at least {MIN_WEBHOOK_SECRET_BYTES} bytes: make one with `openssl rand -hex 32`, or leave it out and the tenant's webhooks are signed with [webhooks] secret",
                    secret.len()
                ));
            }
        }
        if let Some(secret) = &self.confirm_secret {
            let secret = secret.trim();
            if secret.len() != 64 || !secret.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(format!(
                    "confirm_secret (or TOOLFLEET_CONFIRM_SECRET) must be 64 hex characters (a 32-byte key), not {} characters: make one with `openssl rand -hex 32`, or leave it out and one is kept in data_dir",
                    secret.chars().count()
                ));
            }
        }
        Ok(())
    }

    /// Parses one file's text; `path` places its tool schema files.
    pub(crate) fn parse(text: &str, path: &Path) -> Result<Config, String> {
        let mut config: Config =
            toml::from_str(text).map_err(|e| format!("{}: {e}", path.display()))?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        config.tools = parse_tools(text)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .into_iter()
            .map(|t| (t, dir.clone()))
            .collect();
        config.agents = parse_agents(text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(config)
    }

    fn apply_env(&mut self) -> Result<(), String> {
        if let Ok(listen) = std::env::var("TOOLFLEET_LISTEN") {
            self.listen = listen;
        }
        if let Ok(listen) = std::env::var("TOOLFLEET_METRICS_LISTEN") {
            self.metrics_listen = Some(listen);
        }
        if let Ok(url) = std::env::var("TOOLFLEET_DATABASE_URL") {
            self.database_url = Some(url);
        }
        if let Ok(path) = std::env::var("TOOLFLEET_DATABASE_CA_FILE") {
            self.database_ca_file = Some(PathBuf::from(path));
        }
        // Dispatchers and workers share a file but not their needs.
        if let Ok(pool) = std::env::var("TOOLFLEET_DATABASE_POOL") {
            self.database_pool = pool
                .trim()
                .parse()
                .map_err(|e| format!("TOOLFLEET_DATABASE_POOL: {e}"))?;
        }
        if let Ok(url) = std::env::var("TOOLFLEET_BROKER_URL") {
            self.broker_url = Some(url);
        }
        if let Ok(path) = std::env::var("TOOLFLEET_BROKER_CA_FILE") {
            self.broker_ca_file = Some(PathBuf::from(path));
        }
        if let Ok(secret) = std::env::var("TOOLFLEET_CONFIRM_SECRET") {
            self.confirm_secret = Some(secret);
        }
        if let Ok(secret) = std::env::var("TOOLFLEET_WEBHOOK_SECRET") {
            self.webhooks.secret = Some(secret);
        }
        if let Ok(grace) = std::env::var("TOOLFLEET_SHUTDOWN_GRACE_S") {
            self.shutdown_grace_s = grace
                .trim()
                .parse()
                .map_err(|e| format!("TOOLFLEET_SHUTDOWN_GRACE_S: {e}"))?;
        }
        if let Ok(format) = std::env::var("TOOLFLEET_LOG_FORMAT") {
            self.log_format = format
                .trim()
                .parse()
                .map_err(|e| format!("TOOLFLEET_LOG_FORMAT: {e}"))?;
        }
        // OpenTelemetry's own variable; set but empty counts as unset.
        if let Ok(endpoint) = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
            && !endpoint.trim().is_empty()
        {
            self.otlp_endpoint = Some(endpoint.trim().to_owned());
        }
        if let Ok(notices) = std::env::var("TOOLFLEET_NOTICES") {
            self.notices = Some(
                notices
                    .parse()
                    .map_err(|e| format!("TOOLFLEET_NOTICES: {e}"))?,
            );
        }
        Ok(())
    }

    /// What the backends are made from ([`toolfleet_fleet::backends`]).
    pub(crate) fn backend_settings(&self) -> toolfleet_fleet::backends::Settings {
        toolfleet_fleet::backends::Settings {
            database_url: self.database_url.clone(),
            database_schema: self.database_schema.clone(),
            database_ca_file: self.database_ca_file.clone(),
            database_pool: self.database_pool,
            sqlite_path: self.data_dir.join("toolfleet.db"),
            broker_url: self.broker_url.clone(),
            broker_prefix: self.broker_prefix.clone(),
            broker_ca_file: self.broker_ca_file.clone(),
            jobs_per_message: self.jobs_per_message,
            delivery_limit: self.delivery_limit,
            one_job_per_message: self.one_job_per_message.iter().cloned().collect(),
            notices: self.notices,
        }
    }

    /// Adds the tools of every included file (paths relative to this file).
    fn load_includes(&mut self) -> Result<(), String> {
        let base = self
            .source
            .as_deref()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        for include in self.include.clone() {
            let path = base.join(&include);
            let text = read(&path)?;
            let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
            let tools = parse_tools(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            self.tools
                .extend(tools.into_iter().map(|t| (t, dir.clone())));
            let agents = parse_agents(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            self.agents.extend(agents);
            let tables = toml::from_str::<IncludedTables>(&text)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            self.schedules.extend(tables.schedules);
            self.resources.extend(tables.resources);
        }
        Ok(())
    }
}

/// The `[[schedules]]` and `[[resources]]` tables of an included file;
/// other keys are read elsewhere.
#[derive(Deserialize)]
struct IncludedTables {
    #[serde(default)]
    schedules: Vec<toolfleet_fleet::schedules::ScheduleSpec>,
    #[serde(default)]
    resources: Vec<toolfleet_mcp::declared::Declared>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_are_read_from_included_files_too() {
        let dir = std::env::temp_dir().join(format!("tf-include-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let more = "[[schedules]]\nname = \"weekly\"\ncron = \"0 9 * * MON\"\ntool = \"t\"\nprincipal = { tenant = \"acme\", user = \"ops\" }\n";
        std::fs::write(dir.join("more.toml"), more).unwrap();
        let main = "include = [\"more.toml\"]\n\n[[schedules]]\nname = \"nightly\"\ncron = \"0 3 * * *\"\ntool = \"t\"\nprincipal = { tenant = \"acme\", user = \"ops\" }\n";
        std::fs::write(dir.join("toolfleet.toml"), main).unwrap();
        let config = Config::load(Some(&dir.join("toolfleet.toml"))).unwrap();
        let names: Vec<&str> = config.schedules.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["nightly", "weekly"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn retention_keeps_each_kind_its_days_and_zero_for_ever() {
        let month = Some(std::time::Duration::from_secs(30 * 86_400));
        let defaults = Config::parse("", Path::new("t.toml")).unwrap();
        let kept = defaults.retention.retention();
        assert_eq!(
            (kept.jobs, kept.tickets, kept.runs, kept.audit),
            (month, month, month, month)
        );
        let text = "[retention]\njobs_days = 7\naudit_days = 0\nruns_days = 365\n";
        let config = Config::parse(text, Path::new("t.toml")).unwrap();
        let kept = config.retention.retention();
        assert_eq!(kept.jobs, Some(std::time::Duration::from_secs(7 * 86_400)));
        assert_eq!(kept.tickets, month);
        assert_eq!(
            kept.runs,
            Some(std::time::Duration::from_secs(365 * 86_400))
        );
        assert_eq!(kept.audit, None, "0 keeps audit records for ever");
        let wrong = Config::parse("[retention]\njobs = 7\n", Path::new("t.toml"));
        assert!(wrong.is_err(), "an unknown key is refused");
        let negative = Config::parse("[retention]\njobs_days = -1\n", Path::new("t.toml"));
        assert!(negative.is_err(), "a negative count of days is refused");
    }

    #[test]
    fn every_key_of_the_contract_reads() {
        let text = r#"
listen = "127.0.0.1:9999"
metrics_listen = "0.0.0.0:9191"
data_dir = "/tmp/tf"
database_url = "postgres://x"
database_ca_file = "/etc/toolfleet/db-ca.pem"
broker_url = "amqp://y"
broker_ca_file = "/etc/toolfleet/rabbit-ca.pem"
include = ["more.toml"]
fair_share = ["crawl"]

[[schedules]]
name = "nightly"
cron = "0 3 * * *"
timezone = "Europe/Berlin"
tool = "t"
principal = { tenant = "acme", user = "alice" }

[[auth.tokens]]
sha256 = "ab"
tenant = "acme"
user = "alice"
scopes = ["expenses:read"]

[webhooks]
allow = ["127.0.0.1", "hooks.example.com:8443", "10.0.0.0/8:*"]

[tenants.globex.webhooks]
allow = ["globex.example:*"]
secret = "globex-webhook-key-0123456789abcdef"

[[tools]]
name = "t"
shape = "query"
input_schema_file = "schemas/t.json"
"#;
        let config = Config::parse(text, Path::new("/etc/toolfleet/toolfleet.toml")).unwrap();
        assert_eq!(config.listen, "127.0.0.1:9999");
        assert_eq!(config.metrics_listen.as_deref(), Some("0.0.0.0:9191"));
        assert_eq!(
            config.database_ca_file.as_deref(),
            Some(Path::new("/etc/toolfleet/db-ca.pem"))
        );
        assert_eq!(
            config.broker_ca_file.as_deref(),
            Some(Path::new("/etc/toolfleet/rabbit-ca.pem"))
        );
        let defaults = Config::parse("", Path::new("t.toml")).unwrap();
        assert_eq!(defaults.metrics_listen, None);
        assert_eq!(config.auth.tokens[0].scopes, ["expenses:read"]);
        let allow: Vec<String> = config
            .webhooks
            .allow
            .iter()
            .map(|r| r.to_string())
            .collect();
        assert_eq!(
            allow,
            ["127.0.0.1", "hooks.example.com:8443", "10.0.0.0/8:*"]
        );
        let globex = config.tenants["globex"]
            .webhooks
            .as_ref()
            .expect("globex's");
        assert_eq!(globex.allow.as_ref().map(Vec::len), Some(1));
        assert!(globex.secret.is_some());
        assert_eq!(config.tools[0].1, PathBuf::from("/etc/toolfleet"));
        assert_eq!(config.include, [PathBuf::from("more.toml")]);
        assert_eq!(config.fair_share, ["crawl"]);
        assert_eq!(config.schedules[0].name, "nightly");
        assert_eq!(config.schedules[0].timezone, "Europe/Berlin");
        let typo = Config::parse("lisen = \"x\"", Path::new("t.toml")).unwrap_err();
        assert!(typo.contains("lisen"), "{typo}");
    }

    #[test]
    fn notices_default_to_the_servers_configured_and_refuse_what_cannot_work() {
        let parse = |text: &str| Config::parse(text, Path::new("t.toml"));
        let backend = |text: &str| parse(text).and_then(|c| c.backend_settings().notices_backend());
        assert_eq!(backend(""), Ok(NoticesBackend::Memory));
        assert_eq!(
            backend("database_url = \"postgres://x\""),
            Ok(NoticesBackend::Memory)
        );
        assert_eq!(
            backend("broker_url = \"amqp://y\""),
            Ok(NoticesBackend::Broker)
        );
        assert_eq!(
            backend(
                "broker_url = \"amqp://y\"\ndatabase_url = \"postgres://x\"\nnotices = \"postgres\""
            ),
            Ok(NoticesBackend::Postgres)
        );
        let without = backend("broker_url = \"amqp://y\"\nnotices = \"postgres\"").unwrap_err();
        assert!(without.contains("database_url"), "{without}");
        let without = backend("database_url = \"postgres://x\"\nnotices = \"broker\"").unwrap_err();
        assert!(without.contains("broker_url"), "{without}");
        let unknown = parse("notices = \"carrier-pigeon\"").unwrap_err();
        assert!(
            unknown.contains("carrier-pigeon") && unknown.contains("\"postgres\""),
            "{unknown}"
        );
        assert!("redis".parse::<NoticesBackend>().is_err());
    }

    #[test]
    fn secrets_shorter_than_a_key_are_refused() {
        let check = |text: &str| {
            Config::parse(text, Path::new("t.toml"))
                .unwrap()
                .check_secrets()
        };
        assert_eq!(check(""), Ok(()));
        let short = check("[webhooks]\nsecret = \"0123456789abcdef0123456789abcde\"").unwrap_err();
        assert!(
            short.contains("31 bytes") && short.contains("at least 32"),
            "{short}"
        );
        assert_eq!(
            check(&format!("[webhooks]\nsecret = \"{}\"", "k".repeat(32))),
            Ok(())
        );
        let confirm = check("confirm_secret = \"abcd\"").unwrap_err();
        assert!(confirm.contains("64 hex characters"), "{confirm}");
        let not_hex = check(&format!("confirm_secret = \"{}\"", "zz".repeat(32))).unwrap_err();
        assert!(not_hex.contains("confirm_secret"), "{not_hex}");
        assert_eq!(
            check(&format!("confirm_secret = \"{}\"", "ab".repeat(32))),
            Ok(())
        );
    }

    #[test]
    fn webhook_entries_and_tenant_tables_are_read_at_load_and_bad_ones_refused() {
        let parse = |text: &str| Config::parse(text, Path::new("t.toml"));
        let bad = parse("[webhooks]\nallow = [\"hooks.example.com:http\"]").unwrap_err();
        assert!(
            bad.contains("hooks.example.com:http") && bad.contains("not a port"),
            "{bad}"
        );
        let url = parse("[webhooks]\nallow = [\"https://hooks.example.com/\"]").unwrap_err();
        assert!(url.contains("is a URL"), "{url}");
        let idn = parse("[tenants.acme.webhooks]\nallow = [\"bücher.example\"]").unwrap_err();
        assert!(idn.contains("xn--"), "{idn}");
        let typo = parse("[tenants.acme.webhooks]\nallows = []").unwrap_err();
        assert!(typo.contains("allows"), "{typo}");
        let typo = parse("[tenants.acme]\nwebhook = {}").unwrap_err();
        assert!(typo.contains("webhook"), "{typo}");
        // Each key left out is the global one; `allow = []` is none.
        let config = parse(
            "[tenants.acme.webhooks]\nsecret = \"k\"\n[tenants.globex.webhooks]\nallow = []\n",
        )
        .unwrap();
        let acme = config.tenants["acme"].webhooks.as_ref().unwrap();
        assert!(acme.allow.is_none());
        let globex = config.tenants["globex"].webhooks.as_ref().unwrap();
        assert_eq!(
            (globex.allow.as_deref(), &globex.secret),
            (Some(&[][..]), &None)
        );
        let short = config.check_secrets().unwrap_err();
        assert!(
            short.contains("[tenants.acme.webhooks] secret is 1 bytes long")
                && short.contains("at least 32"),
            "{short}"
        );
    }

    #[test]
    fn logs_and_traces_read_and_refuse_an_unknown_format() {
        let parse = |text: &str| Config::parse(text, Path::new("t.toml"));
        let defaults = parse("").unwrap();
        assert_eq!(defaults.log_format, LogFormat::Text);
        assert_eq!(defaults.otlp_endpoint, None);
        let set =
            parse("log_format = \"json\"\notlp_endpoint = \"http://127.0.0.1:4318\"").unwrap();
        assert_eq!(set.log_format, LogFormat::Json);
        assert_eq!(set.otlp_endpoint.as_deref(), Some("http://127.0.0.1:4318"));
        let unknown = parse("log_format = \"xml\"").unwrap_err();
        assert!(unknown.contains("\"json\""), "{unknown}");
    }
}
