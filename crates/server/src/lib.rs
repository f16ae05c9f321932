//! The dispatcher: the HTTP API of docs/API.md over one [`Runtime`].
//!
//! It authenticates, turns each request into one `invoke` (or one store read
//! for the status API), and renders envelopes. It holds no state of its own
//! beyond caches: jobs, tickets and outcomes live in the store, so any number
//! of dispatchers can serve the same fleet. Everything a client sends is
//! untrusted: bodies are bounded, parsed without panics, and every failure
//! answers the contract's error envelope.

pub mod access;
pub mod auth;
pub mod bounds;
pub mod callbacks;
pub mod console;
pub mod http;
mod mcp;
mod metrics;
pub mod openapi;
mod retry;
mod routes;
mod runs;
mod schedules;
mod status;
#[cfg(test)]
mod testing;
pub mod webhooks;

use std::sync::Arc;

use toolfleet_broker::{Broker, Notices};
use toolfleet_core::Runtime;
use toolfleet_store::Store;

pub use access::Access;
pub use auth::{Auth, token_sha256};
pub use mcp::McpJobs;
pub use metrics::{Ops, ops_router};
pub use routes::router;
pub use runs::RunSettings;
pub use status::{Status, status_tools};
pub use toolfleet_fleet::{Dispatcher, StoreAuditSink, StoreCommitLog};

/// Limits on what a client may send and hold.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body, in bytes.
    pub max_body: usize,
    /// Longest `wait_s` of a long poll.
    pub max_wait_s: u64,
    /// How long a request's whole body may take to arrive.
    pub body_read_timeout: std::time::Duration,
    /// Event streams (`/v1/events`) open at once in this process.
    pub max_streams: usize,
    /// Event streams one principal holds open at once.
    pub max_streams_per_principal: usize,
    /// Long polls (`get_job` with `wait_s`, MCP task waits) one principal
    /// holds at once.
    pub max_long_polls_per_principal: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body: 1024 * 1024,
            max_wait_s: 30,
            body_read_timeout: std::time::Duration::from_secs(30),
            max_streams: 1024,
            max_streams_per_principal: 8,
            max_long_polls_per_principal: 32,
        }
    }
}

/// How `/mcp` behaves.
#[derive(Debug, Clone)]
pub struct McpSettings {
    /// Browser origins (`scheme://host[:port]`, or `null`) allowed beside the
    /// server's own host; any other `Origin` is refused with 403.
    pub allowed_origins: Arc<Vec<String>>,
    /// Tools per `tools/list` page.
    pub page_size: usize,
    /// The resources `[[resources]]` declares.
    pub resources: Arc<[toolfleet_mcp::declared::Declared]>,
    /// The key of the state tools that ask the client hand on.
    pub state_key: Option<[u8; 32]>,
    /// Whether an `initialize` opens a session of this process.
    pub sessions: bool,
    /// Sessions open at once, at most.
    pub max_sessions: usize,
    /// How often a subscribed declared resource is read again.
    pub watch_every: std::time::Duration,
}

impl Default for McpSettings {
    fn default() -> Self {
        McpSettings {
            allowed_origins: Arc::new(Vec::new()),
            page_size: toolfleet_mcp::DEFAULT_PAGE_SIZE,
            resources: Arc::from(Vec::new()),
            state_key: None,
            sessions: true,
            max_sessions: toolfleet_mcp::DEFAULT_MAX_SESSIONS,
            watch_every: toolfleet_mcp::DEFAULT_WATCH_EVERY,
        }
    }
}

/// Everything a request handler reaches.
#[derive(Clone)]
pub struct AppState {
    /// The tool runtime every call goes through.
    pub runtime: Arc<Runtime>,
    /// The store of jobs, tickets and outcomes.
    pub store: Arc<dyn Store>,
    /// The broker that hands jobs to workers.
    pub broker: Arc<dyn Broker>,
    /// The notices that announce settled jobs and answered tickets.
    pub notices: Arc<dyn Notices>,
    /// The known bearer tokens and their principals.
    pub auth: Arc<Auth>,
    /// Each tenant's webhook allow-list (which `callback_url`s a call may
    /// name) and signing key.
    pub webhooks: Arc<webhooks::Webhooks>,
    /// What a client may send and hold.
    pub limits: Limits,
    /// `/metrics` and `/readyz`; the metrics are also the runtime's.
    pub ops: Arc<Ops>,
    /// How `/mcp` behaves.
    pub mcp: McpSettings,
    /// Turns true when the server stops; long-lived answers end then.
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// Who may see and touch which job and ticket, and their audit.
    pub access: Access,
    /// The event streams open now, within `limits`.
    pub streams: bounds::Holds,
    /// `/metrics` is served beside the API (false where the process serves
    /// it on a port of its own, `metrics_listen`).
    pub metrics_on_api: bool,
    /// The declared assistants runs may name, and the bound of a checkpoint.
    pub runs: runs::RunSettings,
    /// `[[schedules]]`: what `/v1/schedules` lists, pauses and resumes.
    pub schedules: Arc<[toolfleet_fleet::schedules::Schedule]>,
    /// The key of the console's sessions and CSRF tokens.
    pub console_key: console::session::ConsoleKey,
}

impl AppState {
    /// The status API over this state's store and notices.
    pub fn status(&self) -> Status {
        Status::new(
            self.store.clone(),
            self.notices.clone(),
            self.access.clone(),
        )
    }
}
