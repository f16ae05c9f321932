//! The PostgreSQL store: the distributed backend, shared by every dispatcher
//! and worker of a fleet.
//!
//! This module owns the SQL of every transition of a job, ticket and command
//! outcome for PostgreSQL, the connection pool (deadpool-postgres, with a
//! bounded wait so calls during an outage answer promptly) and the schema:
//! migrations embedded from `migrations/postgres`, applied only by
//! [`migrate`] (`toolfleet migrate`), and checked by [`PgStore::connect`],
//! which refuses a schema it does not know. It must never read a job and
//! then write it: each transition is one conditional `UPDATE ... RETURNING`
//! (or `INSERT ... ON CONFLICT`), so two workers or two processes cannot both
//! win. It must never migrate on connect, and never panic on what it reads:
//! a row it cannot decode is a [`StoreError::Unavailable`] naming the row.
//!
//! Every connection, the pool's and `toolfleet migrate`'s, honours the URL's
//! `sslmode` and `sslrootcert` as libpq does (or [`PgConnectOptions::ca_file`]
//! for the CA), through rustls: see `toolfleet_tls::postgres`.

use std::collections::HashMap;
use std::fmt::Display;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{
    ClientWrapper, Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime, TimeoutType,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_postgres::config::Host;
use tokio_postgres::types::{FromSql, ToSql};
use tokio_postgres::{Config, Row};
use toolfleet_core::middleware::canonical_json;
use toolfleet_core::{
    AnsweredBy, AuditRecord, Envelope, ErrorCode, JobState, Json, ToolError, TraceContext,
};

use crate::{
    Answered, ClaimCommit, CommitClaim, Fail, Heartbeat, Inserted, JobFilter, JobPage, JobRecord,
    Lease, LeaseRef, NewJob, NewTicket, Park, SaveCheckpoint, SetProgress, Store, StoreError,
    Succeed, TicketRecord,
};
use toolfleet_core::group::Group;

mod embedded {
    refinery::embed_migrations!("../../migrations/postgres");
}

/// How long a call waits for a connection (taking one from the pool,
/// opening one, checking one) before it answers that the store is
/// unavailable.
const POOL_TIMEOUT: Duration = Duration::from_secs(5);
/// Where refinery records the applied migrations, in the store's schema.
const HISTORY: &str = "refinery_schema_history";
/// Bounds of one page of [`Store::list_jobs`].
const MAX_PAGE: u32 = 100;
/// Bound of one answer of [`Store::due_jobs`] and [`Store::audit`].
const MAX_BATCH: u32 = 1000;
/// Sorts after every id (ids use the "C" collation), so the first page needs
/// no second statement.
const NO_CURSOR: &str = "\u{10FFFF}";
/// Settled commit outcomes pruned per claim, so pruning stays cheap.
const PRUNE_BATCH: i64 = 100;
/// Claims of a commit key tried before giving up, when the key keeps being
/// released between the claim and the read of its outcome.
const CLAIM_COMMIT_TRIES: usize = 5;
/// Jobs one grouped statement carries at most.
const MAX_GROUP: usize = 256;
/// Grouped statements of one kind running at once. Few slots make large
/// groups: `toolfleet bench` settled 2,313 jobs/s with one slot, 2,251 with
/// two and 1,553 with eight (one process, 64 worker slots, pool of 32), and
/// a lone call still finds a slot free.
const GROUP_SLOTS: usize = 2;

/// The statements that move a job: each executes one transition of
/// [`toolfleet_core::lifecycle`], naming the states it moves from and to as
/// the lifecycle lists them.
///
/// Rows are read by named columns, never `*`: PostgreSQL refuses to run a
/// prepared statement whose result columns changed, so a column that a
/// later migration adds must not break the processes still running.
mod sql {
    use std::sync::LazyLock;

    use toolfleet_core::lifecycle::{JobState, Transition, sql_list};

    /// A statement built once from the lifecycle's state lists.
    type Built = LazyLock<String>;

    /// `WHERE` of a statement of the attempt holding a running job (`$1`
    /// the job, `$2` the lease owner, `$3` the attempt).
    fn held() -> String {
        format!(
            "id = $1 AND state IN {} AND lease_owner = $2 AND attempts = $3",
            sql_list(Transition::Heartbeat.from())
        )
    }

    macro_rules! job_columns {
        () => {
            r#"id, tenant, "user", tool, pool, args, state, attempts, max_attempts,
            timeout_ms, run_at, lease_owner, lease_until, progress, result, error,
            idempotency_key, run_id, call_id, callback_url, lineage, scopes,
            traceparent, tracestate, created_at, updated_at"#
        };
    }

    macro_rules! ticket_columns {
        () => {
            r#"id, tenant, "user", tool, question, options, args, run_id, call_id,
            callback_url, answer, answered_by, created_at, answered_at"#
        };
    }

    /// `enqueue`: (new) -> queued.
    pub static INSERT_JOB: Built = LazyLock::new(|| {
        format!(
            concat!(
                r#"
        INSERT INTO jobs (id, tenant, "user", tool, pool, args, state, attempts, max_attempts,
            timeout_ms, run_at, idempotency_key, run_id, call_id, callback_url, lineage,
            scopes, traceparent, tracestate, created_at, updated_at)
        VALUES ($1, $2, $3, $4, $5, $6, '{queued}', 0, $7,
            $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $9, $9)
        ON CONFLICT DO NOTHING
        RETURNING "#,
                job_columns!()
            ),
            queued = Transition::Enqueue.to()
        )
    });

    /// [`INSERT_JOB`] for many jobs at once. A job whose id or key is
    /// taken (by an earlier job or one earlier in the same batch) is not
    /// returned; its caller then takes the one-job path, which tells why.
    pub static INSERT_MANY: Built = LazyLock::new(|| {
        format!(
            concat!(
                r#"
        INSERT INTO jobs (id, tenant, "user", tool, pool, args, state, attempts, max_attempts,
            timeout_ms, run_at, idempotency_key, run_id, call_id, callback_url, lineage,
            scopes, traceparent, tracestate, created_at, updated_at)
        SELECT id, tenant, "user", tool, pool, args, '{queued}', 0, max_attempts,
            timeout_ms, now, idempotency_key, run_id, call_id, callback_url, lineage, scopes,
            traceparent, tracestate, now, now
        FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
            $7::bigint[], $8::bigint[], $9::bigint[], $10::text[], $11::text[], $12::text[],
            $13::text[], $14::text[], $15::text[], $16::text[], $17::text[])
            WITH ORDINALITY AS n(id, tenant, "user", tool, pool, args, max_attempts,
            timeout_ms, now, idempotency_key, run_id, call_id, callback_url, lineage, scopes,
            traceparent, tracestate, ord)
        ORDER BY ord
        ON CONFLICT DO NOTHING
        RETURNING "#,
                job_columns!()
            ),
            queued = Transition::Enqueue.to()
        )
    });

    pub const JOB_BY_KEY: &str = concat!(
        "SELECT ",
        job_columns!(),
        " FROM jobs WHERE tenant = $1 AND tool = $2 AND idempotency_key = $3"
    );

    /// queued or due retrying, or running with an expired lease -> running,
    /// for a batch of claims (one row of the arrays each): one conditional
    /// statement, so a job that two claims name, in one batch or in two, is
    /// claimed once. `c_ord` tells which claim won. A job taken over is
    /// runnable from when the expired lease ended.
    ///
    /// The grouped statements find their rows by the primary key alone:
    /// their conditions on the state are a `CASE`, which no partial index
    /// matches. Written as plain `state IN (...) AND run_at <= c_now`, the
    /// planner could walk `jobs_due` or `jobs_lease` (every waiting or
    /// running job) once per batch, and did: under a backlog of queued jobs
    /// each claim read thousands of index entries.
    ///
    /// `claim` moves the states of its list, `take_over` those of its own.
    pub static CLAIM_MANY: Built = LazyLock::new(|| {
        let mut cases = String::new();
        for state in Transition::Claim.from() {
            cases.push_str(&format!(" WHEN '{state}' THEN run_at <= c_now"));
        }
        for state in Transition::TakeOver.from() {
            cases.push_str(&format!(" WHEN '{state}' THEN lease_until < c_now"));
        }
        format!(
            concat!(
                "
        UPDATE jobs SET state = '{running}', attempts = attempts + 1,
            run_at = CASE WHEN state IN {taken} THEN COALESCE(lease_until, run_at)
                          ELSE run_at END,
            lease_owner = c_worker, lease_until = c_until, updated_at = c_now
        FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::bigint[])
            WITH ORDINALITY AS c(c_id, c_worker, c_now, c_until, c_ord)
        WHERE id = c_id
          AND CASE state{cases} ELSE false END
        RETURNING c_ord, ",
                job_columns!()
            ),
            running = Transition::Claim.to(),
            taken = sql_list(Transition::TakeOver.from()),
            cases = cases,
        )
    });

    // Every statement of a running job's holder names its attempt (`$1`
    // the job, `$2` the lease owner, `$3` the attempt): by lease owner and
    // attempt both, so an attempt that lost the job to a newer claim, even
    // its own worker's, no longer matches.

    /// `heartbeat`: running (this attempt) -> running, lease extended.
    pub static HEARTBEAT: Built = LazyLock::new(|| {
        format!(
            "UPDATE jobs SET lease_until = $5, updated_at = $4 WHERE {}",
            held()
        )
    });

    pub const STATE: &str = "SELECT state FROM jobs WHERE id = $1";

    /// Under `heartbeat`'s guard: progress recorded.
    pub static PROGRESS: Built = LazyLock::new(|| {
        format!(
            "UPDATE jobs SET progress = $4, updated_at = $5 WHERE {}",
            held()
        )
    });

    /// `park`: running (this attempt) -> parked on a ticket: unleased, the
    /// attempt given back.
    pub static PARK: Built = LazyLock::new(|| {
        format!(
            concat!(
                "
        UPDATE jobs SET state = '{parked}',
            attempts = attempts - 1, lease_owner = NULL, lease_until = NULL,
            waiting_on = $4, updated_at = $5
        WHERE {held}
        RETURNING ",
                job_columns!()
            ),
            parked = Transition::Park.to(),
            held = held()
        )
    });

    /// `wake`: parked on the ticket -> retrying, due now.
    pub static WAKE: Built = LazyLock::new(|| {
        format!(
            concat!(
                "
        UPDATE jobs SET state = '{to}', run_at = $2, waiting_on = NULL, updated_at = $2
        WHERE waiting_on = $1 AND state IN {from}
        RETURNING ",
                job_columns!()
            ),
            to = Transition::Wake.to(),
            from = sql_list(Transition::Wake.from())
        )
    });

    pub const READ_CHECKPOINT: &str = "SELECT checkpoint FROM jobs WHERE id = $1";

    /// Under `heartbeat`'s guard: checkpoint saved.
    pub static CHECKPOINT: Built = LazyLock::new(|| {
        format!(
            "UPDATE jobs SET checkpoint = $4, updated_at = $5 WHERE {}",
            held()
        )
    });

    /// `succeed`: running (this attempt) -> succeeded, for a batch of
    /// successes; `s_ord` tells whose each row was.
    pub static SUCCEED_MANY: Built = LazyLock::new(|| {
        format!(
            concat!(
                "
        UPDATE jobs SET state = '{to}', result = s_result,
            lease_owner = NULL, lease_until = NULL, updated_at = s_now
        FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bigint[])
            WITH ORDINALITY AS s(s_id, s_worker, s_attempt, s_result, s_now, s_ord)
        WHERE id = s_id
          AND CASE WHEN state IN {from} THEN lease_owner = s_worker AND attempts = s_attempt
                   ELSE false END
        RETURNING s_ord, ",
                job_columns!()
            ),
            to = Transition::Succeed.to(),
            from = sql_list(Transition::Succeed.from())
        )
    });

    /// `retry` (with a time $5) or `fail` (without): running (this
    /// attempt) -> retrying at $5, or failed. The lifecycle decided which
    /// ([`toolfleet_core::lifecycle::after_failure`]).
    pub static FAIL: Built = LazyLock::new(|| {
        format!(
            concat!(
                "
        UPDATE jobs SET
            state = CASE WHEN $5::bigint IS NOT NULL THEN '{retrying}' ELSE '{failed}' END,
            run_at = COALESCE($5::bigint, run_at),
            error = $4, lease_owner = NULL, lease_until = NULL, updated_at = $6
        WHERE {held}
        RETURNING ",
                job_columns!()
            ),
            retrying = Transition::Retry.to(),
            failed = Transition::Fail.to(),
            held = held()
        )
    });

    /// `cancel`: queued, retrying, parked or running -> cancelled.
    pub static CANCEL: Built = LazyLock::new(|| {
        format!(
            concat!(
                "
        UPDATE jobs SET state = '{to}', error = $3,
            lease_owner = NULL, lease_until = NULL, updated_at = $4
        WHERE id = $1 AND tenant = $2 AND state IN {from}
        RETURNING ",
                job_columns!()
            ),
            to = Transition::Cancel.to(),
            from = sql_list(Transition::Cancel.from())
        )
    });

    /// Two range scans, one per partial index, rather than an OR the planner
    /// may turn into a walk of the whole table.
    /// The earliest due of the waiting jobs and of the expired leases (at
    /// most `$2` of each, read in the order of `jobs_due` and `jobs_lease`,
    /// so a backlog is not read whole), oldest first.
    /// The lists are those of `claim` and `take_over`, as the partial
    /// indexes (migration 1) name them.
    pub static DUE: Built = LazyLock::new(|| {
        format!(
            concat!(
                "SELECT * FROM (SELECT ",
                job_columns!(),
                " FROM jobs WHERE state IN {claimed} AND run_at <= $1
            ORDER BY run_at LIMIT $2) waiting
        UNION ALL
        SELECT * FROM (SELECT ",
                job_columns!(),
                " FROM jobs WHERE state IN {taken} AND lease_until < $1
            ORDER BY lease_until LIMIT $2) expired
        ORDER BY id LIMIT $2"
            ),
            claimed = sql_list(Transition::Claim.from()),
            taken = sql_list(Transition::TakeOver.from()),
        )
    });

    pub const LIST: &str = concat!(
        "SELECT ",
        job_columns!(),
        " FROM jobs
        WHERE tenant = $1 AND id < $4
          AND ($2::text[] IS NULL OR state = ANY($2)) AND ($3::text IS NULL OR tool = $3)
        ORDER BY id DESC LIMIT $5"
    );

    /// [`LIST`] of one user's jobs, off `jobs_owner`.
    pub const LIST_OWNED: &str = concat!(
        "SELECT ",
        job_columns!(),
        r#" FROM jobs
        WHERE tenant = $1 AND "user" = $6 AND id < $4
          AND ($2::text[] IS NULL OR state = ANY($2)) AND ($3::text IS NULL OR tool = $3)
        ORDER BY id DESC LIMIT $5"#
    );

    pub const JOB: &str = concat!(
        "SELECT ",
        job_columns!(),
        " FROM jobs WHERE id = $1 AND tenant = $2"
    );

    pub const JOB_BY_ID: &str = concat!("SELECT ", job_columns!(), " FROM jobs WHERE id = $1");

    pub const COUNTS: &str = "SELECT state, COUNT(*) AS n FROM jobs GROUP BY state";

    /// A range of `jobs_callbacks`, each probed in the commit log by key.
    /// The key is built in the commit log's collation: built from `j.id`
    /// alone it would take the ids' ("C"), under which `commits_pkey` cannot
    /// be searched, and each job would read the whole log.
    ///
    /// The list is the settled states', as `jobs_callbacks` (migration 4)
    /// names them.
    pub static UNNOTIFIED: Built = LazyLock::new(|| {
        format!(
            concat!(
                "SELECT ",
                job_columns!(),
                " FROM jobs j
        WHERE callback_url IS NOT NULL
          AND state IN {settled}
          AND updated_at >= $2 AND updated_at < $3
          AND NOT EXISTS (SELECT 1 FROM commits c
            WHERE c.key = ($1 || j.id || ':' || j.state) COLLATE \"default\")
        ORDER BY updated_at, id LIMIT $4"
            ),
            settled = sql_list(&JobState::SETTLED)
        )
    });

    pub const UNNOTIFIED_TICKETS: &str = concat!(
        "SELECT ",
        ticket_columns!(),
        " FROM tickets t
        WHERE callback_url IS NOT NULL AND answer IS NOT NULL
          AND answered_at >= $2 AND answered_at < $3
          AND NOT EXISTS (SELECT 1 FROM commits c
            WHERE c.key = ($1 || t.id || ':answered') COLLATE \"default\")
        ORDER BY answered_at, id LIMIT $4"
    );

    pub const INSERT_TICKET: &str = concat!(
        r#"
        INSERT INTO tickets (id, tenant, "user", tool, question, options, args,
            run_id, call_id, callback_url, created_at, answered_by)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
        ON CONFLICT DO NOTHING
        RETURNING "#,
        ticket_columns!()
    );

    pub const TICKET: &str = concat!(
        "SELECT ",
        ticket_columns!(),
        " FROM tickets WHERE id = $1 AND tenant = $2"
    );

    /// open -> answered.
    pub const ANSWER: &str = concat!(
        "
        UPDATE tickets SET answer = $3, answered_at = $4
        WHERE id = $1 AND tenant = $2 AND answer IS NULL
        RETURNING ",
        ticket_columns!()
    );

    /// One statement for a whole batch: the arrays are the columns.
    pub const INSERT_AUDIT: &str = r#"
        INSERT INTO audit (at_ms, tenant, "user", tool, run_id, call_id, args, status,
            error_code, duration_us, parent_run_id)
        SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[],
            $6::text[], $7::text[], $8::text[], $9::text[], $10::bigint[], $11::text[])"#;

    pub const AUDIT: &str = r#"
        SELECT seq, at_ms, tenant, "user", tool, run_id, call_id, parent_run_id, args,
            status, error_code, duration_us
        FROM audit WHERE tenant = $1 ORDER BY at_ms DESC, seq DESC LIMIT $2"#;

    /// Skips rows another pruner holds, so concurrent claims never wait on
    /// each other's housekeeping; the array makes the delete a walk of the
    /// primary key, whatever the planner guesses of the batch size.
    /// Settled outcomes and abandoned claims past keep_until (up to $2 of
    /// each), each read off its partial index (migration 7).
    pub const PRUNE_COMMITS: &str = "
        DELETE FROM commits WHERE key = ANY (ARRAY(
            SELECT key FROM commits WHERE state = 'settled' AND keep_until < $1
            LIMIT $2 FOR UPDATE SKIP LOCKED) || ARRAY(
            SELECT key FROM commits WHERE state = 'pending' AND keep_until < $1
            LIMIT $2 FOR UPDATE SKIP LOCKED))";

    /// absent, kept past keep_until, or pending past its lease when $5 says
    /// to take it over -> pending until $3, kept until $4. The conflicting
    /// row is locked and its condition checked on its latest version, so
    /// two processes can never both claim a key.
    pub const CLAIM_COMMIT: &str = "
        INSERT INTO commits (key, state, lease_until, keep_until) VALUES ($1, 'pending', $3, $4)
        ON CONFLICT (key) DO UPDATE SET
            state = 'pending', envelope = NULL, lease_until = $3, keep_until = $4
        WHERE commits.keep_until < $2
           OR ($5 AND commits.state = 'pending' AND commits.lease_until < $2)
        RETURNING key";

    /// What a claim that did not win found.
    pub const COMMIT: &str = "SELECT state, envelope, lease_until FROM commits WHERE key = $1";

    /// pending (or absent) -> settled; a settled outcome is never replaced.
    pub const SETTLE_COMMIT: &str = "
        INSERT INTO commits (key, state, envelope, keep_until) VALUES ($1, 'settled', $2, $3)
        ON CONFLICT (key) DO UPDATE SET
            state = 'settled', envelope = $2, lease_until = NULL, keep_until = $3
        WHERE commits.state = 'pending'";

    /// pending -> absent: the claim is released.
    pub const RELEASE_COMMIT: &str = "DELETE FROM commits WHERE key = $1 AND state = 'pending'";
}

/// The PostgreSQL implementation of [`Store`].
pub struct PgStore {
    pool: Pool,
    /// Where the store is, for messages: host, port, database and schema,
    /// never the password.
    place: Arc<str>,
    /// The operations every job pays for, grouped into shared commits.
    groups: Groups,
}

/// One group per operation on every job's path: inserts, claims and
/// successes. Under load each becomes one statement and one commit for
/// many jobs; alone, each runs at once (see [`toolfleet_core::group`]).
struct Groups {
    insert: Group<Insert, Inserted, StoreError>,
    claim: Group<Claim, Option<JobRecord>, StoreError>,
    succeed: Group<Success, Option<JobRecord>, StoreError>,
}

/// A job to record, its JSON columns encoded before it joins a group, so a
/// value that cannot be encoded fails its own call and no other.
struct Insert {
    job: NewJob,
    /// Canonical, as the idempotency check compares it.
    args: String,
    lineage: Option<String>,
    /// JSON array; `None` for no scopes.
    scopes: Option<String>,
    /// The trace context's two headers.
    traceparent: Option<String>,
    tracestate: Option<String>,
}

impl Insert {
    fn of(job: NewJob) -> Result<Insert, StoreError> {
        Ok(Insert {
            args: canonical_json(&job.args),
            lineage: job.lineage.as_ref().map(encode).transpose()?,
            scopes: (!job.scopes.is_empty())
                .then(|| encode(&job.scopes))
                .transpose()?,
            traceparent: job.trace.as_ref().map(TraceContext::traceparent),
            tracestate: job
                .trace
                .as_ref()
                .and_then(TraceContext::tracestate)
                .map(str::to_owned),
            job,
        })
    }
}

struct Claim {
    id: String,
    worker: String,
    now: i64,
    until: i64,
}

struct Success {
    lease: LeaseRef,
    result: String,
    now: i64,
}

impl Groups {
    /// Each group runs at most [`GROUP_SLOTS`] statements at once, and never
    /// more than a quarter of the pool's connections, so the three together
    /// leave room for reads, heartbeats and the rest.
    fn spawn(pool: &Pool, place: &Arc<str>, pool_size: usize) -> Groups {
        let slots = GROUP_SLOTS.min(pool_size / 4).max(1);
        Groups {
            insert: grouped("recording jobs", slots, pool, place, insert_many),
            claim: grouped("claiming jobs", slots, pool, place, claim_many),
            succeed: grouped("settling jobs", slots, pool, place, succeed_many),
        }
    }
}

/// A group running its batches through `run` on connections of `pool`.
fn grouped<R, O, F, Fut>(
    what: &'static str,
    slots: usize,
    pool: &Pool,
    place: &Arc<str>,
    run: F,
) -> Group<R, O, StoreError>
where
    R: Send + 'static,
    O: Send + 'static,
    F: Fn(Pool, Arc<str>, Vec<R>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Answers<O>> + Send + 'static,
{
    let (pool, place) = (pool.clone(), place.clone());
    Group::spawn(what, slots, MAX_GROUP, move |batch| {
        run(pool.clone(), place.clone(), batch)
    })
}

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

    async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
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
    let manager = Manager::from_config(
        config,
        target.tls,
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
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(name)) => name.clone(),
        #[cfg(unix)]
        Some(Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let database = config
        .get_dbname()
        .or(config.get_user())
        .unwrap_or("postgres");
    match schema {
        Some(schema) => format!("{database} on {host}:{port} (schema {schema})"),
        None => format!("{database} on {host}:{port}"),
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

fn pool_error(e: PoolError, place: &str) -> StoreError {
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

// Reading rows.

/// The columns of one row, with errors that name the row.
struct Fields<'a> {
    row: &'a Row,
    table: &'static str,
    id: String,
}

impl<'a> Fields<'a> {
    /// `id_column` only labels errors, so reading it never fails here.
    fn new(row: &'a Row, table: &'static str, id_column: &str) -> Self {
        let id = row
            .try_get::<_, String>(id_column)
            .or_else(|_| row.try_get::<_, i64>(id_column).map(|n| n.to_string()))
            .unwrap_or_default();
        Fields { row, table, id }
    }

    /// For a row without its id among the columns.
    fn named(row: &'a Row, table: &'static str, id: &str) -> Self {
        let id = id.to_owned();
        Fields { row, table, id }
    }

    fn corrupt(&self, column: &str, e: impl Display) -> StoreError {
        StoreError::Unavailable(format!(
            "corrupt row: {} {} column {column}: {e}",
            self.table, self.id
        ))
    }

    fn get<T: FromSql<'a>>(&self, column: &str) -> Result<T, StoreError> {
        self.row
            .try_get(column)
            .map_err(|e| self.corrupt(column, e))
    }

    fn int<T: TryFrom<i64>>(&self, column: &str) -> Result<T, StoreError> {
        let n: i64 = self.get(column)?;
        T::try_from(n).map_err(|_| self.corrupt(column, format!("{n} is out of range")))
    }

    fn json<T: DeserializeOwned>(&self, column: &str) -> Result<T, StoreError> {
        let text: &str = self.get(column)?;
        serde_json::from_str(text).map_err(|e| self.corrupt(column, e))
    }

    /// SQL NULL is `None`; JSON `null` text is a present value.
    fn json_opt<T: DeserializeOwned>(&self, column: &str) -> Result<Option<T>, StoreError> {
        let text: Option<&str> = self.get(column)?;
        text.map(|t| serde_json::from_str(t).map_err(|e| self.corrupt(column, e)))
            .transpose()
    }

    fn raw_json_opt(&self, column: &str) -> Result<Option<Json>, StoreError> {
        let text: Option<&str> = self.get(column)?;
        text.map(|t| Json::parse(t).map_err(|e| self.corrupt(column, e)))
            .transpose()
    }

    fn state(&self) -> Result<JobState, StoreError> {
        let text: &str = self.get("state")?;
        JobState::parse(text)
            .ok_or_else(|| self.corrupt("state", format!("unknown state {text:?}")))
    }
}

fn job_from_row(row: &Row) -> Result<JobRecord, StoreError> {
    let f = Fields::new(row, "job", "id");
    Ok(JobRecord {
        id: f.get("id")?,
        tenant: f.get("tenant")?,
        user: f.get("user")?,
        tool: f.get("tool")?,
        pool: f.get("pool")?,
        args: f.json("args")?,
        state: f.state()?,
        attempts: f.int("attempts")?,
        max_attempts: f.int("max_attempts")?,
        timeout_ms: f.get("timeout_ms")?,
        run_at: f.get("run_at")?,
        lease_owner: f.get("lease_owner")?,
        lease_until: f.get("lease_until")?,
        progress: f.json_opt("progress")?,
        result: f.raw_json_opt("result")?,
        error: f.json_opt("error")?,
        idempotency_key: f.get("idempotency_key")?,
        run_id: f.get("run_id")?,
        call_id: f.get("call_id")?,
        callback_url: f.get("callback_url")?,
        lineage: f.json_opt("lineage")?,
        scopes: f.json_opt("scopes")?.unwrap_or_default(),
        trace: crate::trace_of(f.get("traceparent")?, f.get("tracestate")?),
        created_at: f.get("created_at")?,
        updated_at: f.get("updated_at")?,
    })
}

fn ticket_from_row(row: &Row) -> Result<TicketRecord, StoreError> {
    let f = Fields::new(row, "ticket", "id");
    Ok(TicketRecord {
        id: f.get("id")?,
        tenant: f.get("tenant")?,
        user: f.get("user")?,
        tool: f.get("tool")?,
        question: f.get("question")?,
        options: f.json("options")?,
        args: f.json("args")?,
        run_id: f.get("run_id")?,
        call_id: f.get("call_id")?,
        callback_url: f.get("callback_url")?,
        answer: f.json_opt("answer")?,
        answered_by: AnsweredBy::from_scope(f.get("answered_by")?),
        created_at: f.get("created_at")?,
        answered_at: f.get("answered_at")?,
    })
}

fn audit_from_row(row: &Row) -> Result<AuditRecord, StoreError> {
    let f = Fields::new(row, "audit", "seq");
    // AuditRecord's status is static text: map back onto the four words.
    let status = match f.get::<&str>("status")? {
        "ok" => "ok",
        "error" => "error",
        "running" => "running",
        "suspended" => "suspended",
        other => return Err(f.corrupt("status", format!("unknown status {other:?}"))),
    };
    let error_code: Option<String> = f.get("error_code")?;
    let error_code = error_code
        .map(|code| serde_json::from_value::<ErrorCode>(Value::String(code)))
        .transpose()
        .map_err(|e| f.corrupt("error_code", e))?;
    Ok(AuditRecord {
        at_ms: f.int("at_ms")?,
        tool: f.get("tool")?,
        tenant: f.get("tenant")?,
        user: f.get("user")?,
        run_id: f.get("run_id")?,
        call_id: f.get("call_id")?,
        parent_run_id: f.get("parent_run_id")?,
        args: f.json("args")?,
        status,
        error_code,
        duration_us: f.int("duration_us")?,
    })
}

type FromRow<T> = fn(&Row) -> Result<T, StoreError>;
type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

async fn query_one<T>(
    c: &ClientWrapper,
    sql: &str,
    params: Params<'_>,
    map: FromRow<T>,
) -> Result<Option<T>, StoreError> {
    let stmt = c.prepare_cached(sql).await?;
    c.query_opt(&stmt, params)
        .await?
        .as_ref()
        .map(map)
        .transpose()
}

async fn query_all<T>(
    c: &ClientWrapper,
    sql: &str,
    params: Params<'_>,
    map: FromRow<T>,
) -> Result<Vec<T>, StoreError> {
    let stmt = c.prepare_cached(sql).await?;
    c.query(&stmt, params).await?.iter().map(map).collect()
}

async fn execute(c: &ClientWrapper, sql: &str, params: Params<'_>) -> Result<u64, StoreError> {
    let stmt = c.prepare_cached(sql).await?;
    Ok(c.execute(&stmt, params).await?)
}

fn encode<T: Serialize + ?Sized>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::Unavailable(format!("cannot encode a value to store: {e}")))
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

// Jobs.

async fn insert_job(c: &ClientWrapper, insert: &Insert) -> Result<Inserted, StoreError> {
    let (job, args) = (&insert.job, &insert.args);
    let max_attempts = i64::from(job.max_attempts);
    let params: Params<'_> = &[
        &job.id,
        &job.tenant,
        &job.user,
        &job.tool,
        &job.pool,
        &args,
        &max_attempts,
        &job.timeout_ms,
        &job.now,
        &job.idempotency_key,
        &job.run_id,
        &job.call_id,
        &job.callback_url,
        &insert.lineage,
        &insert.scopes,
        &insert.traceparent,
        &insert.tracestate,
    ];
    if let Some(created) = query_one(c, &sql::INSERT_JOB, params, job_from_row).await? {
        return Ok(Inserted::Created(created));
    }
    // Nothing inserted: the key was taken (or, never in practice, the id).
    let existing = match &job.idempotency_key {
        Some(key) => {
            let params: Params<'_> = &[&job.tenant, &job.tool, key];
            query_one(c, sql::JOB_BY_KEY, params, job_from_row).await?
        }
        None => None,
    };
    match existing {
        Some(existing) if canonical_json(&existing.args) == *args => {
            Ok(Inserted::Existing(existing))
        }
        Some(_) => Err(StoreError::Conflict(format!(
            "idempotency_key was already used for a `{}` job with other arguments; use a new key for new work",
            job.tool
        ))),
        None => Err(StoreError::Conflict(format!(
            "a job with id {} already exists",
            job.id
        ))),
    }
}

/// Answers of a grouped statement, one per request, in the batch's order.
type Answers<T> = Result<Vec<Result<T, StoreError>>, StoreError>;

/// Records a batch of jobs in one statement. A job it did not insert (its
/// key or id taken) takes the one-job path, which finds the earlier job or
/// says why not.
async fn insert_many(pool: Pool, place: Arc<str>, jobs: Vec<Insert>) -> Answers<Inserted> {
    let c = pool.get().await.map_err(|e| pool_error(e, &place))?;
    let column = |f: fn(&Insert) -> &str| jobs.iter().map(f).collect::<Vec<&str>>();
    let optional =
        |f: fn(&Insert) -> Option<&str>| jobs.iter().map(f).collect::<Vec<Option<&str>>>();
    let number = |f: fn(&Insert) -> i64| jobs.iter().map(f).collect::<Vec<i64>>();
    let params: Params<'_> = &[
        &column(|i| &i.job.id),
        &column(|i| &i.job.tenant),
        &column(|i| &i.job.user),
        &column(|i| &i.job.tool),
        &column(|i| &i.job.pool),
        &column(|i| &i.args),
        &number(|i| i64::from(i.job.max_attempts)),
        &number(|i| i.job.timeout_ms),
        &number(|i| i.job.now),
        &optional(|i| i.job.idempotency_key.as_deref()),
        &column(|i| &i.job.run_id),
        &column(|i| &i.job.call_id),
        &optional(|i| i.job.callback_url.as_deref()),
        &optional(|i| i.lineage.as_deref()),
        &optional(|i| i.scopes.as_deref()),
        &optional(|i| i.traceparent.as_deref()),
        &optional(|i| i.tracestate.as_deref()),
    ];
    let stmt = c.prepare_cached(&sql::INSERT_MANY).await?;
    let mut created: HashMap<String, Result<JobRecord, StoreError>> = HashMap::new();
    for row in c.query(&stmt, params).await? {
        let id: String = Fields::new(&row, "job", "id").get("id")?;
        created.insert(id, job_from_row(&row));
    }
    let mut answers = Vec::with_capacity(jobs.len());
    for insert in &jobs {
        answers.push(match created.remove(&insert.job.id) {
            Some(record) => record.map(Inserted::Created),
            None => insert_job(&c, insert).await,
        });
    }
    Ok(answers)
}

/// Places each returned row at the request its `ord` column names
/// (1-based, as `WITH ORDINALITY` counts); requests no row names answer
/// `None`.
fn by_ordinal(rows: &[Row], ord: &str, count: usize) -> Vec<Result<Option<JobRecord>, StoreError>> {
    let mut answers: Vec<Result<Option<JobRecord>, StoreError>> =
        (0..count).map(|_| Ok(None)).collect();
    for row in rows {
        let at = row
            .try_get::<_, i64>(ord)
            .ok()
            .and_then(|n| usize::try_from(n - 1).ok());
        if let Some(answer) = at.and_then(|i| answers.get_mut(i)) {
            *answer = job_from_row(row).map(Some);
        }
    }
    answers
}

/// Claims a batch of jobs in one conditional statement.
async fn claim_many(pool: Pool, place: Arc<str>, claims: Vec<Claim>) -> Answers<Option<JobRecord>> {
    let c = pool.get().await.map_err(|e| pool_error(e, &place))?;
    let ids: Vec<&str> = claims.iter().map(|c| c.id.as_str()).collect();
    let workers: Vec<&str> = claims.iter().map(|c| c.worker.as_str()).collect();
    let nows: Vec<i64> = claims.iter().map(|c| c.now).collect();
    let untils: Vec<i64> = claims.iter().map(|c| c.until).collect();
    let stmt = c.prepare_cached(&sql::CLAIM_MANY).await?;
    let rows = c.query(&stmt, &[&ids, &workers, &nows, &untils]).await?;
    Ok(by_ordinal(&rows, "c_ord", claims.len()))
}

/// Settles a batch of successes in one conditional statement.
async fn succeed_many(
    pool: Pool,
    place: Arc<str>,
    done: Vec<Success>,
) -> Answers<Option<JobRecord>> {
    let c = pool.get().await.map_err(|e| pool_error(e, &place))?;
    let ids: Vec<&str> = done.iter().map(|s| s.lease.job_id.as_str()).collect();
    let workers: Vec<&str> = done.iter().map(|s| s.lease.worker.as_str()).collect();
    let attempts: Vec<i64> = done.iter().map(|s| i64::from(s.lease.attempt)).collect();
    let results: Vec<&str> = done.iter().map(|s| s.result.as_str()).collect();
    let nows: Vec<i64> = done.iter().map(|s| s.now).collect();
    let stmt = c.prepare_cached(&sql::SUCCEED_MANY).await?;
    let params: Params<'_> = &[&ids, &workers, &attempts, &results, &nows];
    let rows = c.query(&stmt, params).await?;
    Ok(by_ordinal(&rows, "s_ord", done.len()))
}

async fn heartbeat(c: &ClientWrapper, beat: Heartbeat<'_>) -> Result<Lease, StoreError> {
    let (id, worker, attempt) = parts(beat.lease);
    let until = beat.now.saturating_add(beat.lease_ms);
    let params: Params<'_> = &[&id, &worker, &attempt, &beat.now, &until];
    if execute(c, &sql::HEARTBEAT, params).await? > 0 {
        return Ok(Lease::Held);
    }
    // Read after the update, so a cancel that the update waited for is seen.
    let stmt = c.prepare_cached(sql::STATE).await?;
    let row = c.query_opt(&stmt, &[&id]).await?;
    let state = match &row {
        Some(row) => Fields::named(row, "job", id).get::<&str>("state")?,
        None => "",
    };
    Ok(match JobState::parse(state) {
        Some(JobState::Cancelled) => Lease::Cancelled,
        _ => Lease::Lost,
    })
}

/// The parts of `lease` as the statements of its holder bind them.
fn parts(lease: &LeaseRef) -> (&str, &str, i64) {
    (&lease.job_id, &lease.worker, i64::from(lease.attempt))
}

async fn cancel(
    c: &ClientWrapper,
    tenant: &str,
    id: &str,
    now: i64,
) -> Result<Option<JobRecord>, StoreError> {
    let error = encode(&ToolError::new(
        ErrorCode::Cancelled,
        "the job was cancelled before it finished; call the tool again if the work is still needed",
    ))?;
    let params: Params<'_> = &[&id, &tenant, &error, &now];
    if let Some(job) = query_one(c, &sql::CANCEL, params, job_from_row).await? {
        return Ok(Some(job));
    }
    // Settled, missing or another tenant's: answered as it stands.
    query_one(c, sql::JOB, &[&id, &tenant], job_from_row).await
}

async fn list_jobs(
    c: &ClientWrapper,
    tenant: &str,
    filter: &JobFilter,
    limit: u32,
    cursor: Option<&str>,
) -> Result<JobPage, StoreError> {
    let limit = limit.clamp(1, MAX_PAGE) as usize;
    // The stored states the filter means: retrying finds parked jobs too.
    let state: Option<Vec<&str>> = filter
        .state
        .map(|state| state.stored_as().iter().map(|s| s.as_str()).collect());
    // One row more than the page tells whether there is a next page.
    let fetch = limit as i64 + 1;
    let cursor = cursor.unwrap_or(NO_CURSOR);
    let mut jobs = match &filter.user {
        None => {
            let params: Params<'_> = &[&tenant, &state, &filter.tool, &cursor, &fetch];
            query_all(c, sql::LIST, params, job_from_row).await?
        }
        Some(user) => {
            let params: Params<'_> = &[&tenant, &state, &filter.tool, &cursor, &fetch, user];
            query_all(c, sql::LIST_OWNED, params, job_from_row).await?
        }
    };
    let next_cursor = if jobs.len() > limit {
        jobs.truncate(limit);
        jobs.last().map(|job| job.id.clone())
    } else {
        None
    };
    Ok(JobPage { jobs, next_cursor })
}

async fn job_counts(c: &ClientWrapper) -> Result<Vec<(JobState, u64)>, StoreError> {
    let mut counts: Vec<(JobState, u64)> = JobState::ALL.into_iter().map(|s| (s, 0)).collect();
    let stmt = c.prepare_cached(sql::COUNTS).await?;
    for row in c.query(&stmt, &[]).await? {
        let f = Fields::new(&row, "job count", "state");
        let state = f.state()?;
        let n: u64 = f.int("n")?;
        if let Some(slot) = counts.iter_mut().find(|(s, _)| *s == state) {
            slot.1 = n;
        }
    }
    Ok(counts)
}

// Tickets, audit and commits.

async fn insert_ticket(c: &ClientWrapper, t: &NewTicket) -> Result<TicketRecord, StoreError> {
    let (options, args) = (encode(&t.options)?, encode(&t.args)?);
    let params: Params<'_> = &[
        &t.id,
        &t.tenant,
        &t.user,
        &t.tool,
        &t.question,
        &options,
        &args,
        &t.run_id,
        &t.call_id,
        &t.callback_url,
        &t.now,
        &t.answered_by.scope(),
    ];
    query_one(c, sql::INSERT_TICKET, params, ticket_from_row)
        .await?
        .ok_or_else(|| StoreError::Conflict(format!("a ticket with id {} already exists", t.id)))
}

async fn answer_ticket(
    c: &ClientWrapper,
    tenant: &str,
    id: &str,
    answer: &str,
    now: i64,
) -> Result<Option<Answered>, StoreError> {
    let params: Params<'_> = &[&id, &tenant, &answer, &now];
    if let Some(t) = query_one(c, sql::ANSWER, params, ticket_from_row).await? {
        return Ok(Some(Answered::Now(t)));
    }
    let ticket = query_one(c, sql::TICKET, &[&id, &tenant], ticket_from_row).await?;
    Ok(ticket.map(Answered::Already))
}

/// The records as columns, for one `INSERT ... SELECT FROM UNNEST`.
#[derive(Default)]
struct AuditColumns {
    at_ms: Vec<i64>,
    tenant: Vec<String>,
    user: Vec<String>,
    tool: Vec<String>,
    run_id: Vec<String>,
    call_id: Vec<String>,
    args: Vec<String>,
    status: Vec<&'static str>,
    error_code: Vec<Option<&'static str>>,
    duration_us: Vec<i64>,
    parent_run_id: Vec<Option<String>>,
}

impl AuditColumns {
    fn of(records: &[AuditRecord]) -> Result<AuditColumns, StoreError> {
        let mut cols = AuditColumns::default();
        for r in records {
            cols.at_ms.push(to_i64(r.at_ms));
            cols.tenant.push(r.tenant.clone());
            cols.user.push(r.user.clone());
            cols.tool.push(r.tool.clone());
            cols.run_id.push(r.run_id.clone());
            cols.call_id.push(r.call_id.clone());
            cols.args.push(encode(&r.args)?);
            cols.status.push(r.status);
            cols.error_code.push(r.error_code.map(ErrorCode::as_str));
            cols.duration_us.push(to_i64(r.duration_us));
            cols.parent_run_id.push(r.parent_run_id.clone());
        }
        Ok(cols)
    }
}

async fn append_audit(c: &ClientWrapper, records: &[AuditRecord]) -> Result<(), StoreError> {
    let cols = AuditColumns::of(records)?;
    let params: Params<'_> = &[
        &cols.at_ms,
        &cols.tenant,
        &cols.user,
        &cols.tool,
        &cols.run_id,
        &cols.call_id,
        &cols.args,
        &cols.status,
        &cols.error_code,
        &cols.duration_us,
        &cols.parent_run_id,
    ];
    execute(c, sql::INSERT_AUDIT, params).await?;
    Ok(())
}

/// The claim and the read of an unclaimable key's outcome are two
/// statements; a key released or pruned in between is claimed afresh.
async fn claim_commit(
    c: &ClientWrapper,
    claim: ClaimCommit<'_>,
) -> Result<CommitClaim, StoreError> {
    let (key, now) = (claim.key, claim.now);
    let until = now.saturating_add(claim.lease_ms);
    let keep = claim.keep_until.max(until);
    execute(c, sql::PRUNE_COMMITS, &[&now, &PRUNE_BATCH]).await?;
    for _ in 0..CLAIM_COMMIT_TRIES {
        let stmt = c.prepare_cached(sql::CLAIM_COMMIT).await?;
        let params: Params<'_> = &[&key, &now, &until, &keep, &claim.take_over];
        if c.query_opt(&stmt, params).await?.is_some() {
            return Ok(CommitClaim::Run);
        }
        let read = c.prepare_cached(sql::COMMIT).await?;
        let Some(row) = c.query_opt(&read, &[&key]).await? else {
            continue;
        };
        let f = Fields::named(&row, "commit", key);
        let lease_until: Option<i64> = f.get("lease_until")?;
        return match f.get::<Option<&str>>("envelope")? {
            Some(text) => Ok(CommitClaim::Settled(
                serde_json::from_str(text).map_err(|e| f.corrupt("envelope", e))?,
            )),
            None if lease_until.is_some_and(|until| until < now) => Ok(CommitClaim::Abandoned),
            None => Ok(CommitClaim::Pending),
        };
    }
    Err(StoreError::Unavailable(format!(
        "commit {key} was claimed and released {CLAIM_COMMIT_TRIES} times while this claim \
         ran; try again"
    )))
}

async fn settle_commit(
    c: &ClientWrapper,
    key: &str,
    envelope: Option<&str>,
    keep_until: i64,
) -> Result<(), StoreError> {
    match envelope {
        Some(envelope) => execute(c, sql::SETTLE_COMMIT, &[&key, &envelope, &keep_until]).await?,
        None => execute(c, sql::RELEASE_COMMIT, &[&key]).await?,
    };
    Ok(())
}

#[async_trait]
impl Store for PgStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.client().await?.simple_query("SELECT 1").await?;
        Ok(())
    }

    async fn insert_job(&self, job: NewJob) -> Result<Inserted, StoreError> {
        self.groups.insert.run(Insert::of(job)?).await
    }

    async fn job(&self, tenant: &str, id: &str) -> Result<Option<JobRecord>, StoreError> {
        let c = self.client().await?;
        query_one(&c, sql::JOB, &[&id, &tenant], job_from_row).await
    }

    async fn job_by_id(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        let c = self.client().await?;
        query_one(&c, sql::JOB_BY_ID, &[&id], job_from_row).await
    }

    async fn list_jobs(
        &self,
        tenant: &str,
        filter: &JobFilter,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<JobPage, StoreError> {
        list_jobs(&*self.client().await?, tenant, filter, limit, cursor).await
    }

    async fn claim(
        &self,
        id: &str,
        worker: &str,
        now: i64,
        lease_ms: i64,
    ) -> Result<Option<JobRecord>, StoreError> {
        let claim = Claim {
            id: id.to_owned(),
            worker: worker.to_owned(),
            now,
            until: now.saturating_add(lease_ms),
        };
        self.groups.claim.run(claim).await
    }

    async fn heartbeat(&self, beat: Heartbeat<'_>) -> Result<Lease, StoreError> {
        heartbeat(&*self.client().await?, beat).await
    }

    async fn set_progress(&self, report: SetProgress<'_>) -> Result<bool, StoreError> {
        let (id, worker, attempt) = parts(report.lease);
        let progress = encode(report.progress)?;
        let c = self.client().await?;
        let params: Params<'_> = &[&id, &worker, &attempt, &progress, &report.now];
        Ok(execute(&c, &sql::PROGRESS, params).await? > 0)
    }

    async fn checkpoint(&self, id: &str) -> Result<Option<Value>, StoreError> {
        let c = self.client().await?;
        let read = |row: &Row| Fields::named(row, "job", id).json_opt("checkpoint");
        let stmt = c.prepare_cached(sql::READ_CHECKPOINT).await?;
        match c.query_opt(&stmt, &[&id]).await? {
            Some(row) => read(&row),
            None => Ok(None),
        }
    }

    async fn save_checkpoint(&self, save: SaveCheckpoint<'_>) -> Result<bool, StoreError> {
        let (id, worker, attempt) = parts(save.lease);
        let checkpoint = encode(save.checkpoint)?;
        let c = self.client().await?;
        let params: Params<'_> = &[&id, &worker, &attempt, &checkpoint, &save.now];
        Ok(execute(&c, &sql::CHECKPOINT, params).await? > 0)
    }

    async fn park(&self, park: Park<'_>) -> Result<Option<JobRecord>, StoreError> {
        let (id, worker, attempt) = parts(park.lease);
        let c = self.client().await?;
        let params: Params<'_> = &[&id, &worker, &attempt, &park.ticket, &park.now];
        query_one(&c, &sql::PARK, params, job_from_row).await
    }

    async fn wake(&self, ticket: &str, now: i64) -> Result<Vec<JobRecord>, StoreError> {
        let c = self.client().await?;
        query_all(&c, &sql::WAKE, &[&ticket, &now], job_from_row).await
    }

    async fn succeed(&self, done: Succeed<'_>) -> Result<Option<JobRecord>, StoreError> {
        let success = Success {
            lease: done.lease.clone(),
            result: done.result.get().to_owned(),
            now: done.now,
        };
        self.groups.succeed.run(success).await
    }

    async fn fail(&self, failed: Fail<'_>) -> Result<Option<JobRecord>, StoreError> {
        let (id, worker, attempt) = parts(failed.lease);
        let error = encode(failed.error)?;
        let c = self.client().await?;
        let params: Params<'_> = &[
            &id,
            &worker,
            &attempt,
            &error,
            &failed.retry_at,
            &failed.now,
        ];
        query_one(&c, &sql::FAIL, params, job_from_row).await
    }

    async fn cancel(
        &self,
        tenant: &str,
        id: &str,
        now: i64,
    ) -> Result<Option<JobRecord>, StoreError> {
        cancel(&*self.client().await?, tenant, id, now).await
    }

    /// At most 1000 jobs per call, so one sweep stays bounded.
    async fn due_jobs(&self, now: i64, limit: u32) -> Result<Vec<JobRecord>, StoreError> {
        let limit = i64::from(limit.min(MAX_BATCH));
        let c = self.client().await?;
        query_all(&c, &sql::DUE, &[&now, &limit], job_from_row).await
    }

    async fn unnotified_jobs(
        &self,
        notice_prefix: &str,
        since: i64,
        until: i64,
        limit: u32,
    ) -> Result<Vec<JobRecord>, StoreError> {
        let limit = i64::from(limit.min(MAX_BATCH));
        let c = self.client().await?;
        let params: Params<'_> = &[&notice_prefix, &since, &until, &limit];
        query_all(&c, &sql::UNNOTIFIED, params, job_from_row).await
    }

    async fn job_counts(&self) -> Result<Vec<(JobState, u64)>, StoreError> {
        job_counts(&*self.client().await?).await
    }

    async fn unnotified_tickets(
        &self,
        notice_prefix: &str,
        since: i64,
        until: i64,
        limit: u32,
    ) -> Result<Vec<TicketRecord>, StoreError> {
        let limit = i64::from(limit.min(MAX_BATCH));
        let c = self.client().await?;
        let params: Params<'_> = &[&notice_prefix, &since, &until, &limit];
        query_all(&c, sql::UNNOTIFIED_TICKETS, params, ticket_from_row).await
    }

    async fn insert_ticket(&self, ticket: NewTicket) -> Result<TicketRecord, StoreError> {
        insert_ticket(&*self.client().await?, &ticket).await
    }

    async fn ticket(&self, tenant: &str, id: &str) -> Result<Option<TicketRecord>, StoreError> {
        let c = self.client().await?;
        query_one(&c, sql::TICKET, &[&id, &tenant], ticket_from_row).await
    }

    async fn answer_ticket(
        &self,
        tenant: &str,
        id: &str,
        answer: &Value,
        now: i64,
    ) -> Result<Option<Answered>, StoreError> {
        let answer = encode(answer)?;
        answer_ticket(&*self.client().await?, tenant, id, &answer, now).await
    }

    /// One statement per call, so a batch is appended whole or not at all.
    async fn append_audit(&self, records: &[AuditRecord]) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        append_audit(&*self.client().await?, records).await
    }

    /// At most 1000 records per call.
    async fn audit(&self, tenant: &str, limit: u32) -> Result<Vec<AuditRecord>, StoreError> {
        let limit = i64::from(limit.clamp(1, MAX_BATCH));
        let c = self.client().await?;
        query_all(&c, sql::AUDIT, &[&tenant, &limit], audit_from_row).await
    }

    async fn claim_commit(&self, claim: ClaimCommit<'_>) -> Result<CommitClaim, StoreError> {
        claim_commit(&*self.client().await?, claim).await
    }

    async fn settle_commit(
        &self,
        key: &str,
        outcome: Option<&Envelope>,
        keep_until: i64,
    ) -> Result<(), StoreError> {
        let envelope = outcome.map(Envelope::to_json);
        let c = self.client().await?;
        settle_commit(&c, key, envelope.as_deref(), keep_until).await
    }
}
