//! Reaching the PostgreSQL store's database: each connection's
//! configuration (TLS through `toolfleet_tls::postgres`, the schema as its
//! `search_path`, the planner's settings), the pool, the migrations embedded
//! from `migrations/postgres` that only [`migrate`] applies, the check of the
//! schema's version on connect, and what a failure of the server or the
//! pool says. It must never migrate on connect, never accept a schema
//! version it does not know, and never name the password in a message.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{
    ClientWrapper, Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime, TimeoutType,
};
use futures_util::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio_postgres::Config;

use super::PgStore;
use super::groups::Groups;
use crate::StoreError;

mod embedded {
    refinery::embed_migrations!("../../migrations/postgres");
}

/// How long a call waits for a connection (taking one from the pool,
/// opening one, checking one) before it answers that the store is
/// unavailable.
const POOL_TIMEOUT: Duration = Duration::from_secs(5);
/// Where refinery records the applied migrations, in the store's schema.
const HISTORY: &str = "refinery_schema_history";

/// How to reach the database, beyond its URL.
#[derive(Clone, Debug, Default)]
pub struct PgConnectOptions {
    /// The schema of toolfleet's tables: every connection's `search_path`
    /// (`None`: the connection's own).
    pub schema: Option<String>,
    /// The PEM file of the CA that signed the server's certificate, used
    /// when the URL names no `sslrootcert` (toolfleet's `database_ca_file`).
    /// Without `sslmode` in the URL, naming one means `verify-full`.
    pub ca_file: Option<PathBuf>,
}

impl PgStore {
    /// Connects to the database at `url` (a `postgres://` URL or a
    /// `key=value` string) with a pool of at most `pool_size` connections.
    /// Refuses a database whose schema `toolfleet migrate` has not brought
    /// to this program's version, or that a newer program migrated.
    pub async fn connect(url: &str, pool_size: usize) -> Result<PgStore, StoreError> {
        PgStore::connect_with(url, pool_size, &PgConnectOptions::default()).await
    }

    /// As [`PgStore::connect`], with every connection's `search_path` set
    /// to `schema`, so several stores (tests, say) can share one database.
    pub async fn connect_in_schema(
        url: &str,
        schema: &str,
        pool_size: usize,
    ) -> Result<PgStore, StoreError> {
        let options = PgConnectOptions {
            schema: Some(schema.to_owned()),
            ..PgConnectOptions::default()
        };
        PgStore::connect_with(url, pool_size, &options).await
    }

    /// As [`PgStore::connect`], with `options`.
    pub async fn connect_with(
        url: &str,
        pool_size: usize,
        options: &PgConnectOptions,
    ) -> Result<PgStore, StoreError> {
        let store = unchecked(url, options, pool_size)?;
        let client = store.client().await?;
        let applied = applied_version(&client).await?;
        check_version(applied, &store.place)?;
        drop(client);
        Ok(store)
    }

    /// Closes the pool: idle connections now, busy ones as they come back;
    /// calls after this answer [`StoreError::Unavailable`].
    pub fn close(&self) {
        self.pool.close();
    }

    pub(super) async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        self.pool
            .get()
            .await
            .map_err(|e| pool_error(e, &self.place))
    }
}

/// Applies the embedded migrations to the database at `url`: what
/// `toolfleet migrate` does. Applying them again changes nothing. Refuses a
/// database that a newer program migrated.
pub async fn migrate(url: &str) -> Result<(), StoreError> {
    migrate_with(url, &PgConnectOptions::default()).await
}

/// As [`migrate`], in `schema`, which is created if missing; refinery's
/// history table lives there too.
pub async fn migrate_in_schema(url: &str, schema: &str) -> Result<(), StoreError> {
    let options = PgConnectOptions {
        schema: Some(schema.to_owned()),
        ..PgConnectOptions::default()
    };
    migrate_with(url, &options).await
}

/// As [`migrate`], with `options` (in its schema, if it names one).
///
/// Migrations of one schema run one at a time across processes (an advisory
/// lock held by this session), and all pending ones commit together, so no
/// process ever sees tables without their history.
pub async fn migrate_with(url: &str, options: &PgConnectOptions) -> Result<(), StoreError> {
    let schema = options.schema.as_deref();
    let store = unchecked(url, options, 1)?;
    let mut client = store.client().await?;
    let lock = format!("toolfleet migrate {}", schema.unwrap_or_default());
    client
        .execute("SELECT pg_advisory_lock(hashtext($1))", &[&lock])
        .await?;
    if let Some(schema) = schema {
        client
            .batch_execute(&format!(r#"CREATE SCHEMA IF NOT EXISTS "{schema}""#))
            .await?;
    }
    if let Some(applied) = applied_version(&client).await?
        && applied > known_version()
    {
        return Err(newer_schema(applied, &store.place));
    }
    let runner = embedded::migrations::runner().set_grouped(true);
    runner.run_async(&mut **client).await.map_err(|e| {
        StoreError::Schema(format!(
            "migrating the database {} failed: {e}",
            store.place
        ))
    })?;
    client
        .execute("SELECT pg_advisory_unlock(hashtext($1))", &[&lock])
        .await?;
    Ok(())
}

/// Adds `option` to the server options of `config` (after any given).
fn add_option(config: &mut Config, option: &str) {
    let options = match config.get_options() {
        Some(given) => format!("{given} {option}"),
        None => option.to_owned(),
    };
    config.options(&options);
}

/// A store for `url`, its connections in the schema of `options`, not yet
/// connected and its schema not yet checked.
fn unchecked(url: &str, options: &PgConnectOptions, size: usize) -> Result<PgStore, StoreError> {
    let schema = options.schema.as_deref();
    let target = toolfleet_tls::postgres::target(url, options.ca_file.as_deref())
        .map_err(StoreError::Unavailable)?;
    let mut config = target.config;
    if let Some(schema) = schema {
        check_schema_name(schema)?;
        add_option(&mut config, &format!("-c search_path={schema}"));
    }
    // Each statement is planned once per connection, and every statement of
    // the store finds its rows through an index. Left to itself, PostgreSQL
    // settles on a cached generic plan after a connection's first five runs
    // of a statement, costed for the table as it was then: on a new,
    // near-empty table a sequential scan (or a hash join over one), which
    // the connection kept as the table grew (until an ANALYZE). Without
    // sequential scans, hash joins and merge joins (the only plans left are
    // index lookups), a plan made on an empty table is the one a full table
    // needs, so it is safe to plan once; planning each execution instead
    // cost as much as running it.
    add_option(
        &mut config,
        "-c plan_cache_mode=force_generic_plan -c enable_seqscan=off \
         -c enable_hashjoin=off -c enable_mergejoin=off",
    );
    if config.get_application_name().is_none() {
        config.application_name("toolfleet");
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(POOL_TIMEOUT);
    }
    let place: Arc<str> = describe(&config, schema).into();
    let manager = Manager::from_connect(
        config,
        Connecting(target.connector),
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(size.max(1))
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(POOL_TIMEOUT))
        .create_timeout(Some(POOL_TIMEOUT))
        .recycle_timeout(Some(POOL_TIMEOUT))
        .build()
        .map_err(|e| StoreError::Unavailable(format!("cannot build the pool for {place}: {e}")))?;
    let groups = Groups::spawn(&pool, &place, size.max(1));
    Ok(PgStore {
        pool,
        place,
        groups,
    })
}

/// Opens the pool's connections through toolfleet's connector (TLS as
/// `sslmode` says; plaintext first on the loopback without it).
struct Connecting(toolfleet_tls::postgres::PgConnector);

impl deadpool_postgres::Connect for Connecting {
    fn connect(
        &self,
        config: &Config,
    ) -> BoxFuture<'_, Result<(tokio_postgres::Client, JoinHandle<()>), tokio_postgres::Error>>
    {
        let config = config.clone();
        Box::pin(async move {
            let (client, connection) = self.0.connect(&config).await?;
            // A connection that ends in error fails the statement using it,
            // which says why; the pool then drops it.
            let task = tokio::spawn(async move {
                let _ = connection.await;
            });
            Ok((client, task))
        })
    }
}

/// The name goes into `search_path` and a `CREATE SCHEMA`, so it is held to
/// plain identifiers, which need no quoting or escaping.
fn check_schema_name(schema: &str) -> Result<(), StoreError> {
    let plain = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    let starts_well = schema
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    if starts_well && schema.len() <= 63 && schema.chars().all(plain) {
        return Ok(());
    }
    Err(StoreError::Schema(format!(
        "schema name {schema:?} is not allowed: use 1 to 63 lowercase letters, digits and \
         underscores, starting with a letter or an underscore"
    )))
}

/// "test on 127.0.0.1:5432 (schema tf_1)", for messages.
fn describe(config: &Config, schema: Option<&str>) -> String {
    let place = toolfleet_tls::postgres::describe(config);
    match schema {
        Some(schema) => format!("{place} (schema {schema})"),
        None => place,
    }
}

fn known_version() -> i64 {
    embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| i64::from(m.version()))
        .max()
        .unwrap_or(0)
}

/// The newest migration recorded in the store's schema, `None` when there
/// is no history at all.
async fn applied_version(c: &ClientWrapper) -> Result<Option<i64>, StoreError> {
    let exists: bool = c
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&HISTORY])
        .await?
        .try_get(0)?;
    if !exists {
        return Ok(None);
    }
    let sql = format!("SELECT MAX(version)::bigint FROM {HISTORY}");
    Ok(c.query_one(&sql, &[]).await?.try_get(0)?)
}

fn check_version(applied: Option<i64>, place: &str) -> Result<(), StoreError> {
    let known = known_version();
    match applied {
        Some(applied) if applied == known => Ok(()),
        Some(applied) if applied > known => Err(newer_schema(applied, place)),
        Some(applied) => Err(StoreError::Schema(format!(
            "the database {place} has schema version {applied}, older than this toolfleet's \
             ({known}); run `toolfleet migrate` to bring it up to date"
        ))),
        None => Err(StoreError::Schema(format!(
            "the database {place} has no toolfleet tables; run `toolfleet migrate` to create them"
        ))),
    }
}

fn newer_schema(applied: i64, place: &str) -> StoreError {
    StoreError::Schema(format!(
        "the database {place} has schema version {applied}, newer than the newest this \
         toolfleet knows ({known}): a newer toolfleet's `toolfleet migrate` made it, and this \
         one would misread it; run the newer toolfleet",
        known = known_version()
    ))
}

// Errors.

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        StoreError::Unavailable(format!("postgres: {}", pg_message(&e)))
    }
}

/// What went wrong, readably: tokio-postgres's own text is "db error" for
/// everything the server says.
fn pg_message(e: &tokio_postgres::Error) -> String {
    let text = if let Some(db) = e.as_db_error() {
        format!("{} {}: {}", db.severity(), db.code().code(), db.message())
    } else if e.is_closed() {
        "the connection closed (the server may be restarting); try again".to_owned()
    } else {
        match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        }
    };
    // What to check when the server refused what sslmode asked for.
    match toolfleet_tls::postgres::hint(e) {
        Some(hint) => format!("{text} ({hint})"),
        None => text,
    }
}

pub(super) fn pool_error(e: PoolError, place: &str) -> StoreError {
    let secs = POOL_TIMEOUT.as_secs();
    let message = match e {
        PoolError::Timeout(TimeoutType::Wait) => {
            format!("every connection to {place} stayed busy for {secs}s")
        }
        PoolError::Timeout(_) => {
            format!("no connection to {place} within {secs}s: is PostgreSQL up and reachable?")
        }
        PoolError::Backend(e) => format!("cannot connect to {place}: {}", pg_message(&e)),
        PoolError::Closed => format!("the pool of {place} was closed"),
        other => format!("cannot connect to {place}: {other}"),
    };
    StoreError::Unavailable(message)
}
