//! The one place a backend is chosen: from the [`Settings`] of a
//! configuration, PostgreSQL when `database_url` is set (else SQLite), RabbitMQ
//! when `broker_url` is set (else the in-process queue), and the notices of
//! [`Settings::notices_backend`]: RabbitMQ's events exchange or PostgreSQL
//! `LISTEN`/`NOTIFY` behind one fan-out per process, else in-process.
//! `toolfleet serve`, `dispatcher` and `worker` call [`open`] and only wire
//! what it answers; nothing else in the workspace names a backend to use.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use toolfleet_broker::SETTLED_STATES;
use toolfleet_broker::fanout::{Fanout, FanoutOptions};
use toolfleet_broker::memory::{MemoryBroker, MemoryNotices};
use toolfleet_broker::postgres::{PgNotices, PgOptions};
use toolfleet_broker::rabbit::{MAX_IDS_PER_MESSAGE, RabbitBroker, RabbitOptions};
use toolfleet_broker::split::Split;
use toolfleet_broker::tee::Tee;
use toolfleet_broker::{Broker, EventState, Notices};
use toolfleet_core::JobState;
use toolfleet_store::Store;
use toolfleet_store::postgres::{PgConnectOptions, PgStore};
use toolfleet_store::sqlite::SqliteStore;

/// How settled work is announced to every process of a fleet: the `notices`
/// key, or `TOOLFLEET_NOTICES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum NoticesBackend {
    /// In-process: one process only (no server is configured).
    Memory,
    /// RabbitMQ's events exchange (`broker`; needs `broker_url`).
    Broker,
    /// PostgreSQL `LISTEN`/`NOTIFY` (`postgres`; needs `database_url`).
    Postgres,
}

impl std::str::FromStr for NoticesBackend {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        match value {
            "broker" => Ok(NoticesBackend::Broker),
            "postgres" => Ok(NoticesBackend::Postgres),
            other => Err(format!(
                "notices = {other:?} is not known: use \"broker\" (RabbitMQ's events exchange, \
                 needs broker_url) or \"postgres\" (PostgreSQL LISTEN/NOTIFY, needs database_url)"
            )),
        }
    }
}

impl TryFrom<String> for NoticesBackend {
    type Error = String;

    fn try_from(value: String) -> Result<Self, String> {
        value.parse()
    }
}

/// What the backends of a process are made from: the keys of the
/// configuration that name servers and how to use them.
#[derive(Debug, Clone)]
pub struct Settings {
    /// PostgreSQL, for the distributed mode; absent: SQLite at `sqlite_path`.
    pub database_url: Option<String>,
    /// The PostgreSQL schema of toolfleet's tables.
    pub database_schema: Option<String>,
    /// The CA of PostgreSQL's certificate.
    pub database_ca_file: Option<PathBuf>,
    /// PostgreSQL connections of this process.
    pub database_pool: usize,
    /// The SQLite file, whose directory the caller has made (owner-only).
    pub sqlite_path: PathBuf,
    /// RabbitMQ; absent: the in-process queue.
    pub broker_url: Option<String>,
    /// The first part of every RabbitMQ name.
    pub broker_prefix: String,
    /// The CA of RabbitMQ's certificate.
    pub broker_ca_file: Option<PathBuf>,
    /// The most job ids one RabbitMQ message carries.
    pub jobs_per_message: usize,
    /// RabbitMQ's delivery limit of the pool queues (`None`: RabbitMQ's).
    pub delivery_limit: Option<u32>,
    /// Pools whose jobs each travel alone.
    pub one_job_per_message: BTreeSet<String>,
    /// The `notices` key: `None` for the default.
    pub notices: Option<NoticesBackend>,
}

impl Settings {
    /// The notices a fleet announces on: the configured ones where their
    /// server is configured too, else RabbitMQ's exchange with `broker_url`,
    /// else in-process.
    pub fn notices_backend(&self) -> Result<NoticesBackend, String> {
        match self.notices {
            Some(NoticesBackend::Broker) if self.broker_url.is_none() => Err(
                "notices = \"broker\" announces over RabbitMQ, so it needs broker_url".to_owned(),
            ),
            Some(NoticesBackend::Postgres) if self.database_url.is_none() => Err(
                "notices = \"postgres\" announces over PostgreSQL LISTEN/NOTIFY, so it needs \
                 database_url"
                    .to_owned(),
            ),
            Some(chosen) => Ok(chosen),
            None if self.broker_url.is_some() => Ok(NoticesBackend::Broker),
            None => Ok(NoticesBackend::Memory),
        }
    }

    /// How the store reaches PostgreSQL beyond `database_url`: its schema
    /// and the CA of its certificate.
    pub fn pg_connect_options(&self) -> PgConnectOptions {
        PgConnectOptions {
            schema: self.database_schema.clone(),
            ca_file: self.database_ca_file.clone(),
        }
    }
}

/// The store, broker and notices a configuration names.
pub struct Backends {
    /// The store of jobs, tickets and outcomes.
    pub store: Arc<dyn Store>,
    /// The broker that hands jobs to workers.
    pub broker: Arc<dyn Broker>,
    /// The notices that announce settled work.
    pub notices: Arc<dyn Notices>,
    /// True for the in-process queue, which starts empty and is refilled
    /// from the store.
    pub in_process: bool,
}

/// The longest pool name `one_job_per_message` takes: a RabbitMQ name's
/// bound (the pool's queues add the prefix to it, and say so if too long).
const MAX_POOL_NAME: usize = 255;

/// What a worker that runs no agent hears: cancels.
pub const CANCELLED_STATE: [EventState; 1] = [EventState::Job(JobState::Cancelled)];

/// How far a process's local subscribers (SSE streams, webhooks, long
/// polls) may fall behind before they skip events: deep enough to keep up
/// with bursts.
pub const NOTICE_BUFFER: usize = 65_536;

/// The largest `delivery_limit`: past it, a message a worker keeps losing
/// might as well have none.
pub const MAX_DELIVERY_LIMIT: u32 = 10_000;

/// How this process uses RabbitMQ: the configured prefix and prefetch, and
/// event subscriptions as deep as the process's fan-out ([`NOTICE_BUFFER`]
/// events), since one message carries up to a few hundred events: a ring
/// of the default depth overflowed in bursts under load, and the events it
/// skipped never reached SSE streams or webhooks. Messages carry up to
/// `jobs_per_message` job ids, but agents' pools and the pools named in
/// `one_job_per_message` publish one job per message (an agent runs for
/// minutes; its ids must not wait behind each other in a worker).
pub fn rabbit_options(
    settings: &Settings,
    prefetch: u16,
    agent_pools: &BTreeSet<String>,
) -> Result<RabbitOptions, String> {
    let jobs_per_message = settings.jobs_per_message;
    if !(1..=MAX_IDS_PER_MESSAGE).contains(&jobs_per_message) {
        return Err(format!(
            "jobs_per_message must be 1 to {MAX_IDS_PER_MESSAGE}, got {jobs_per_message}"
        ));
    }
    if let Some(bad) = settings
        .one_job_per_message
        .iter()
        .find(|pool| pool.is_empty() || pool.len() > MAX_POOL_NAME)
    {
        return Err(format!(
            "one_job_per_message names pools (1 to {MAX_POOL_NAME} bytes each), not `{}`",
            toolfleet_core::registry::truncate(bad, 32)
        ));
    }
    if let Some(limit) = settings.delivery_limit
        && !(1..=MAX_DELIVERY_LIMIT).contains(&limit)
    {
        return Err(format!(
            "delivery_limit must be 1 to {MAX_DELIVERY_LIMIT}, got {limit}"
        ));
    }
    let mut one_job_per_message = agent_pools.clone();
    one_job_per_message.extend(settings.one_job_per_message.iter().cloned());
    Ok(RabbitOptions {
        prefix: settings.broker_prefix.clone(),
        default_prefetch: prefetch,
        notice_buffer: NOTICE_BUFFER,
        jobs_per_message,
        one_job_per_message,
        delivery_limit: settings.delivery_limit,
        ca_file: settings.broker_ca_file.clone(),
        ..RabbitOptions::default()
    })
}

/// The states a process without the HTTP API hears over RabbitMQ: cancels
/// (to stop the executors of cancelled jobs) and, where one of its `pools`
/// (`None`: every pool) is one of the `agent_pools`, settled jobs (an agent
/// awaiting a job tool) and answered tickets (an agent awaiting a person).
/// Never a job's `queued` or `running`.
pub fn heard_states(
    agent_pools: &BTreeSet<String>,
    pools: Option<&[String]>,
) -> &'static [EventState] {
    let runs_agents = agent_pools
        .iter()
        .any(|pool| pools.is_none_or(|pools| pools.contains(pool)));
    if runs_agents {
        &SETTLED_STATES
    } else {
        &CANCELLED_STATE
    }
}

/// Applies the store's migrations: PostgreSQL's with `database_url`, else
/// the SQLite file's (which [`open`] also applies when it opens it). What
/// was migrated, for the operator.
pub async fn migrate(settings: &Settings) -> Result<String, String> {
    match &settings.database_url {
        Some(url) => {
            toolfleet_store::postgres::migrate_with(url, &settings.pg_connect_options())
                .await
                .map_err(|e| e.to_string())?;
            Ok("the PostgreSQL schema is up to date".to_owned())
        }
        None => {
            SqliteStore::open(&settings.sqlite_path)
                .await
                .map_err(|e| e.to_string())?;
            Ok(format!(
                "the SQLite schema of {} is up to date",
                settings.sqlite_path.display()
            ))
        }
    }
}

/// Opens the backends `settings` name (see the module's documentation).
///
/// A process given `only_states` hears, over RabbitMQ, only events of those
/// states (see [`heard_states`]); `None`, every event, with outcomes on a
/// binding of their own ([`Split`]).
pub async fn open(
    settings: &Settings,
    prefetch: u16,
    only_states: Option<&[EventState]>,
    agent_pools: &BTreeSet<String>,
) -> Result<Backends, String> {
    let notices_backend = settings.notices_backend()?;
    let store: Arc<dyn Store> = match &settings.database_url {
        Some(url) => Arc::new(
            PgStore::connect_with(url, settings.database_pool, &settings.pg_connect_options())
                .await
                .map_err(|e| e.to_string())?,
        ),
        None => Arc::new(
            SqliteStore::open(&settings.sqlite_path)
                .await
                .map_err(|e| e.to_string())?,
        ),
    };
    let rabbit = match &settings.broker_url {
        Some(url) => {
            let options = rabbit_options(settings, prefetch, agent_pools)?;
            let broker = RabbitBroker::connect(url, options)
                .await
                .map_err(|e| format!("cannot reach the broker: {e}"))?;
            Some(broker)
        }
        None => None,
    };
    let fanout = FanoutOptions {
        buffer: NOTICE_BUFFER,
        ..FanoutOptions::default()
    };
    let notices: Arc<dyn Notices> = match (notices_backend, &rabbit, &settings.database_url) {
        (NoticesBackend::Broker, Some(broker), _) => {
            match only_states {
                Some(states) => Arc::new(Fanout::with_options(
                    broker.notices().only_states(states),
                    fanout,
                )),
                // Outcomes on a binding of their own: while no subscriber
                // asks for every event, each job's `queued` and `running`
                // are not routed here.
                None => Arc::new(Split::new(
                    Arc::new(Fanout::with_options(broker.notices(), fanout.clone())),
                    Arc::new(Fanout::with_options(
                        broker.notices().only_states(&SETTLED_STATES),
                        fanout,
                    )),
                )),
            }
        }
        (NoticesBackend::Postgres, _, Some(url)) => {
            // Fleets sharing a database keep apart by schema, else by prefix.
            let namespace = settings
                .database_schema
                .as_deref()
                .unwrap_or(&settings.broker_prefix);
            let channel = toolfleet_broker::postgres::channel_for(namespace);
            let options = PgOptions {
                notice_buffer: NOTICE_BUFFER,
                ca_file: settings.database_ca_file.clone(),
                ..PgOptions::default()
            };
            let notices = PgNotices::connect_with(url, &channel, options)
                .await
                .map_err(|e| format!("cannot listen for notices on PostgreSQL: {e}"))?;
            match &rabbit {
                // The fleet listens on PostgreSQL; the exchange still carries
                // every event for those who bind to it.
                Some(broker) => Arc::new(Fanout::with_options(
                    Tee::new(notices, broker.notices()),
                    fanout,
                )),
                None => Arc::new(Fanout::with_options(notices, fanout)),
            }
        }
        (NoticesBackend::Memory, _, _) => Arc::new(MemoryNotices::with_capacity(NOTICE_BUFFER)),
        // notices_backend refuses these before anything is opened.
        (NoticesBackend::Broker, None, _) | (NoticesBackend::Postgres, _, None) => {
            return Err(format!(
                "notices {notices_backend:?} need a server that is not configured"
            ));
        }
    };
    let in_process = rabbit.is_none();
    let broker: Arc<dyn Broker> = match rabbit {
        Some(broker) => Arc::new(broker),
        None => Arc::new(MemoryBroker::new()),
    };
    Ok(Backends {
        store,
        broker,
        notices,
        in_process,
    })
}
