//! The PostgreSQL store against the conformance suite, plus what only
//! PostgreSQL has: a schema that `toolfleet migrate` must have made, refusal
//! of an unknown one, and migrations that apply once.
//!
//! Each test works in a fresh schema of its own (`tf_<uuid>`) in the
//! database named by `TOOLFLEET_TEST_DATABASE_URL` (by default the local
//! server, `postgres://postgres@127.0.0.1:5432/test`), and drops it at the
//! end. An unreachable database fails the tests with a message saying so:
//! they are meant to run wherever the project is built, CI included.

use std::time::Duration;

use serde_json::json;
use tokio_postgres::NoTls;
use toolfleet_core::{JobState, new_id};
use toolfleet_store::postgres::{self, PgStore};
use toolfleet_store::{
    ClaimCommit, CommitClaim, Inserted, JobFilter, JobRecord, ListJobs, NewJob, Prune, Retained,
    Store, StoreError, Succeed,
};

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

fn url() -> String {
    std::env::var("TOOLFLEET_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

fn fresh_name() -> String {
    format!("tf_{}", new_id().replace('-', ""))
}

/// A direct connection for what the store does not do (dropping schemas,
/// forging history); panics with directions when the server is not there.
async fn admin() -> tokio_postgres::Client {
    let url = url();
    let connected = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_postgres::connect(&url, NoTls),
    )
    .await;
    let (client, connection) = match connected {
        Ok(Ok(pair)) => pair,
        Ok(Err(e)) => {
            let cause = std::error::Error::source(&e).map(|c| format!(": {c}"));
            unreachable_database(&url, &format!("{e}{}", cause.unwrap_or_default()))
        }
        Err(_) => unreachable_database(&url, "no answer within 10s"),
    };
    tokio::spawn(connection);
    client
}

fn unreachable_database(url: &str, why: &str) -> ! {
    let where_ = if std::env::var_os("CI").is_some() {
        "CI must start PostgreSQL before these tests"
    } else {
        "start PostgreSQL locally, or point TOOLFLEET_TEST_DATABASE_URL at one"
    };
    panic!("the PostgreSQL store tests need a database at {url} ({why}); {where_}")
}

/// A migrated schema of its own, dropped when the test ends, panicking or not.
struct Schema {
    name: String,
}

impl Schema {
    async fn migrated() -> Schema {
        let schema = Schema::empty().await;
        postgres::migrate_in_schema(&url(), &schema.name)
            .await
            .expect("migrate a fresh schema");
        schema
    }

    /// Reserves a name; the schema itself does not exist yet.
    async fn empty() -> Schema {
        // Fails early, with directions, when the server is not there.
        drop(admin().await);
        Schema { name: fresh_name() }
    }

    async fn store(&self) -> PgStore {
        PgStore::connect_in_schema(&url(), &self.name, 4)
            .await
            .expect("connect to a migrated schema")
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        // The test's runtime may be ending, so the drop gets its own.
        let sql = format!(r#"DROP SCHEMA IF EXISTS "{}" CASCADE"#, self.name);
        let url = url();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to drop the schema");
            runtime.block_on(async move {
                let (client, connection) = tokio_postgres::connect(&url, NoTls).await?;
                tokio::spawn(connection);
                client.batch_execute(&sql).await
            })
        })
        .join();
        if let Ok(Err(e)) = dropped {
            eprintln!("could not drop test schema {}: {e}", self.name);
        }
    }
}

/// A store in a fresh schema, for the conformance suite, which takes the
/// store alone. The schema's guard goes to a task that never ends: the
/// test's runtime drops it when the test ends, and the guard drops the schema.
async fn conformance_store() -> PgStore {
    let schema = Schema::migrated().await;
    let store = schema.store().await;
    tokio::spawn(async move {
        let _schema = schema;
        std::future::pending::<()>().await;
    });
    store
}

mod conformance {
    toolfleet_store::store_conformance!(super::conformance_store().await);
}

fn job(tenant: &str) -> NewJob {
    NewJob {
        id: new_id(),
        tenant: tenant.to_owned(),
        user: "alice".to_owned(),
        tool: "start_receipt_ocr".to_owned(),
        pool: "default".to_owned(),
        args: json!({"line": 3}),
        idempotency_key: Some("k".to_owned()),
        run_id: new_id(),
        call_id: new_id(),
        callback_url: None,
        lineage: None,
        scopes: Vec::new(),
        trace: None,
        max_attempts: 3,
        timeout_ms: 60_000,
        now: 1_700_000_000_000,
        run_at: None,
        priority: None,
        concurrency_key: None,
        concurrency_limit: None,

        fair_rank: 0,
        origin: None,
    }
}

/// A command's claim of commit `key` at `now`.
fn commit_claim(key: &str, now: i64) -> ClaimCommit<'_> {
    ClaimCommit {
        key,
        now,
        lease_ms: 30_000,
        keep_until: now + 60_000,
        take_over: false,
    }
}

/// Claims job `id` as worker `w` and settles it, with an empty result.
async fn run_to_success(store: &PgStore, id: &str, now: i64) {
    let claimed = store
        .claim(toolfleet_store::ClaimJob {
            id,
            worker: "w",
            now,
            lease_ms: 30_000,
        })
        .await
        .expect("claim")
        .expect("claimed");
    succeed(store, &claimed, now).await.expect("settled");
}

/// Settles `claimed` as its holder, with an empty result.
async fn succeed(store: &PgStore, claimed: &JobRecord, now: i64) -> Option<JobRecord> {
    let done = Succeed {
        lease: &claimed.lease_ref().expect("held"),
        result: &json!({}).into(),
        now,
        claimed: None,
    };
    store.succeed(done).await.expect("succeed")
}

fn expect_schema_error(outcome: Result<PgStore, StoreError>) -> String {
    match outcome {
        Err(StoreError::Schema(message)) => message,
        Err(other) => panic!("expected a schema error, got {other}"),
        Ok(_) => panic!("a schema this toolfleet does not know was accepted"),
    }
}

#[tokio::test]
async fn an_unmigrated_schema_is_refused() {
    let schema = Schema::empty().await;
    let message = expect_schema_error(PgStore::connect_in_schema(&url(), &schema.name, 2).await);
    assert!(message.contains("toolfleet migrate"), "{message}");
    assert!(message.contains(&schema.name), "{message}");
    assert!(!message.contains("postgres://"), "{message}");
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let schema = Schema::migrated().await;
    let forge = format!(
        "INSERT INTO {}.refinery_schema_history (version, name, applied_on, checksum)
         VALUES (9999, 'from_the_future', '2030-01-01T00:00:00Z', '0')",
        schema.name
    );
    admin()
        .await
        .batch_execute(&forge)
        .await
        .expect("record a future migration");

    let message = expect_schema_error(PgStore::connect_in_schema(&url(), &schema.name, 2).await);
    assert!(message.contains("9999"), "{message}");
    assert!(message.contains("newer"), "{message}");
    assert!(message.contains("toolfleet migrate"), "{message}");
    match postgres::migrate_in_schema(&url(), &schema.name).await {
        Err(StoreError::Schema(message)) => assert!(message.contains("9999"), "{message}"),
        other => panic!("migrating a newer schema should be refused, got {other:?}"),
    }
}

mod embedded {
    refinery::embed_migrations!("../../migrations/postgres");
}

/// A schema an older toolfleet migrated (version 1) is refused with
/// directions until `toolfleet migrate` brings it up to date; its jobs then
/// read back without lineage or checkpoint, and are listed as their
/// tenant's and their user's (migration 25 copies their owners).
#[tokio::test]
async fn an_older_schema_is_refused_until_migrated() {
    let schema = Schema::empty().await;
    admin()
        .await
        .batch_execute(&format!(r#"CREATE SCHEMA "{}""#, schema.name))
        .await
        .expect("create the schema");
    let mut config: tokio_postgres::Config = url().parse().expect("the test URL");
    config.options(format!("-c search_path={}", schema.name));
    let (mut client, connection) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(connection);
    embedded::migrations::runner()
        .set_target(refinery::Target::Version(1))
        .run_async(&mut client)
        .await
        .expect("migrate to version 1");
    let id = new_id();
    client
        .execute(
            r#"INSERT INTO jobs (id, tenant, "user", tool, pool, args, state, max_attempts,
                 timeout_ms, run_at, run_id, call_id, created_at, updated_at)
             VALUES ($1, 'acme', 'alice', 'ocr', 'default', '{}', 'queued', 3, 60000,
                 1700000000000, 'run-1', 'call-1', 1700000000000, 1700000000000)"#,
            &[&id],
        )
        .await
        .expect("a job of version 1");

    let message = expect_schema_error(PgStore::connect_in_schema(&url(), &schema.name, 2).await);
    assert!(message.contains("version 1"), "{message}");
    assert!(message.contains("older"), "{message}");
    assert!(message.contains("toolfleet migrate"), "{message}");

    postgres::migrate_in_schema(&url(), &schema.name)
        .await
        .expect("migrate to the latest version");
    let store = schema.store().await;
    let job = store.job("acme", &id).await.expect("job").expect("kept");
    assert_eq!(job.lineage, None);
    assert_eq!(store.checkpoint(&id).await.expect("checkpoint"), None);
    for user in [None, Some("alice".to_owned())] {
        let filter = JobFilter {
            user,
            ..JobFilter::default()
        };
        let list = ListJobs {
            tenant: "acme",
            filter: &filter,
            limit: 10,
            cursor: None,
        };
        let page = store.list_jobs(list).await.expect("a page");
        let listed: Vec<&str> = page.jobs.iter().map(|j| j.id.as_str()).collect();
        assert_eq!(listed, [id.as_str()], "{filter:?}");
    }
}

/// A schema of version 7, where a parked job was `retrying` with a
/// `run_at` that never comes, migrated to version 8: the parked job is
/// `parked` and wakes on its ticket, a retrying one stays so.
#[tokio::test]
async fn a_version_7_schema_moves_its_parked_jobs_to_their_state() {
    let schema = Schema::empty().await;
    admin()
        .await
        .batch_execute(&format!(r#"CREATE SCHEMA "{}""#, schema.name))
        .await
        .expect("create the schema");
    let mut config: tokio_postgres::Config = url().parse().expect("the test URL");
    config.options(format!("-c search_path={}", schema.name));
    let (mut client, connection) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(connection);
    embedded::migrations::runner()
        .set_target(refinery::Target::Version(7))
        .run_async(&mut client)
        .await
        .expect("migrate to version 7");
    let (parked, retrying) = (new_id(), new_id());
    for (id, run_at, waiting_on) in [
        (&parked, i64::MAX, Some("t_1")),
        (&retrying, 1_700_000_000_000, None),
    ] {
        client
            .execute(
                r#"INSERT INTO jobs (id, tenant, "user", tool, pool, args, state, max_attempts,
                     timeout_ms, run_at, run_id, call_id, created_at, updated_at, waiting_on)
                 VALUES ($1, 'acme', 'alice', 'ocr', 'default', '{}', 'retrying', 3, 60000,
                     $2, 'run-1', 'call-1', 1700000000000, 1700000000000, $3)"#,
                &[id, &run_at, &waiting_on],
            )
            .await
            .expect("a job of version 7");
    }
    postgres::migrate_in_schema(&url(), &schema.name)
        .await
        .expect("migrate to the latest version");
    let store = schema.store().await;
    let state = |id: String| {
        let store = &store;
        async move {
            store
                .job("acme", &id)
                .await
                .expect("job")
                .expect("kept")
                .state
        }
    };
    assert_eq!(state(parked.clone()).await, JobState::Parked);
    assert_eq!(state(retrying.clone()).await, JobState::Retrying);
    let woken = store.wake("t_1", 1_700_000_000_001).await.expect("wake");
    assert_eq!(
        woken
            .iter()
            .map(|j| (j.id.as_str(), j.state))
            .collect::<Vec<_>>(),
        [(parked.as_str(), JobState::Retrying)]
    );
}

/// A schema of version 9 migrated to version 10: its tickets are
/// questions without scopes, plan, expiry or outcome, listed in the inbox
/// and answered as before.
#[tokio::test]
async fn a_version_9_schema_keeps_its_tickets_as_questions() {
    let schema = Schema::empty().await;
    admin()
        .await
        .batch_execute(&format!(r#"CREATE SCHEMA "{}""#, schema.name))
        .await
        .expect("create the schema");
    let mut config: tokio_postgres::Config = url().parse().expect("the test URL");
    config.options(format!("-c search_path={}", schema.name));
    let (mut client, connection) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(connection);
    embedded::migrations::runner()
        .set_target(refinery::Target::Version(9))
        .run_async(&mut client)
        .await
        .expect("migrate to version 9");
    let id = format!("t_{}", new_id());
    client
        .execute(
            r#"INSERT INTO tickets (id, tenant, "user", tool, question, options, args, run_id,
                 call_id, created_at)
             VALUES ($1, 'acme', 'alice', 'ask_user', 'travel or meals?', '[]', '{}', 'run-1',
                 'call-1', 1700000000000)"#,
            &[&id],
        )
        .await
        .expect("a ticket of version 9");
    postgres::migrate_in_schema(&url(), &schema.name)
        .await
        .expect("migrate to the latest version");
    let store = schema.store().await;
    let ticket = store
        .ticket("acme", &id)
        .await
        .expect("ticket")
        .expect("kept");
    assert_eq!(ticket.kind, toolfleet_store::TicketKind::Question);
    assert_eq!(
        (ticket.plan, ticket.scopes, ticket.expires_at),
        (None, Vec::new(), None)
    );
    assert_eq!((ticket.expired_at, ticket.outcome), (None, None));
    let page = store
        .list_tickets(toolfleet_store::ListTickets {
            tenant: "acme",
            answerer: &toolfleet_store::Answerer::User {
                user: "alice".to_owned(),
                scopes: Vec::new(),
            },
            shown: Some(toolfleet_store::TicketShown::Open),
            kind: Some(toolfleet_store::TicketKind::Question),
            limit: 10,
            cursor: None,
        })
        .await
        .expect("list_tickets");
    assert_eq!(
        page.tickets
            .iter()
            .map(|t| t.id.as_str())
            .collect::<Vec<_>>(),
        [id.as_str()]
    );
    let answered = store
        .answer_ticket(toolfleet_store::AnswerTicket {
            tenant: "acme",
            id: &id,
            answer: &json!("travel"),
            now: 1_700_000_000_001,
        })
        .await
        .expect("answer");
    assert!(matches!(answered, Some(toolfleet_store::Answered::Now(_))));
}

#[tokio::test]
async fn migrating_twice_changes_nothing() {
    let schema = Schema::migrated().await;
    let store = schema.store().await;
    let Inserted::Created(created) = store.insert_job(job("acme")).await.expect("insert") else {
        panic!("a new job was expected");
    };
    let history = format!(
        "SELECT COUNT(*) FROM {}.refinery_schema_history",
        schema.name
    );
    let count = |c: tokio_postgres::Client| {
        let history = history.clone();
        async move {
            let row = c.query_one(&history, &[]).await.expect("count history");
            row.get::<_, i64>(0)
        }
    };
    let before = count(admin().await).await;
    postgres::migrate_in_schema(&url(), &schema.name)
        .await
        .expect("migrate again");
    assert_eq!(count(admin().await).await, before);
    assert_eq!(
        store.job("acme", &created.id).await.expect("job"),
        Some(created)
    );
}

#[tokio::test]
async fn concurrent_migrations_of_one_schema_both_succeed() {
    let schema = Schema::empty().await;
    let (url, name) = (url(), schema.name.clone());
    let (a, b) = tokio::join!(
        postgres::migrate_in_schema(&url, &name),
        postgres::migrate_in_schema(&url, &name)
    );
    a.expect("first migration");
    b.expect("second migration");
    schema.store().await.ping().await.expect("ping");
}

/// Two processes (two pools on one schema) racing for the same commit key
/// and the same job: exactly one wins each.
#[tokio::test]
async fn racing_processes_never_both_win() {
    let schema = Schema::migrated().await;
    let (a, b) = (schema.store().await, schema.store().await);
    let now = 1_700_000_000_000;
    for _ in 0..20 {
        let key = new_id();
        let (x, y) = tokio::join!(
            a.claim_commit(commit_claim(&key, now)),
            b.claim_commit(commit_claim(&key, now))
        );
        let runs = [x.expect("claim a"), y.expect("claim b")]
            .into_iter()
            .filter(|c| *c == CommitClaim::Run)
            .count();
        assert_eq!(runs, 1);

        let fresh = NewJob {
            idempotency_key: None,
            ..job("acme")
        };
        let Inserted::Created(created) = a.insert_job(fresh).await.expect("insert") else {
            panic!("a new job was expected");
        };
        let (x, y) = tokio::join!(
            a.claim(toolfleet_store::ClaimJob {
                id: &created.id,
                worker: "w1",
                now,
                lease_ms: 30_000
            }),
            b.claim(toolfleet_store::ClaimJob {
                id: &created.id,
                worker: "w2",
                now,
                lease_ms: 30_000
            })
        );
        let winners = [x.expect("claim a"), y.expect("claim b")];
        assert_eq!(winners.iter().flatten().count(), 1, "{winners:?}");
        a.cancel(toolfleet_store::CancelJob {
            tenant: "acme",
            id: &created.id,
            now,
        })
        .await
        .expect("cancel");
    }
}

#[tokio::test]
async fn a_bad_schema_name_is_refused() {
    let long = "t".repeat(64);
    for name in ["", "Tf", "tf-1", "1tf", "tf; DROP TABLE jobs", &long] {
        match postgres::migrate_in_schema(&url(), name).await {
            Err(StoreError::Schema(message)) => assert!(message.contains("schema name")),
            other => panic!("{name:?} should be refused, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn an_unreachable_database_is_unavailable_promptly() {
    // Port 1 on the loopback: nothing listens there.
    let started = std::time::Instant::now();
    let outcome = PgStore::connect("postgres://postgres@127.0.0.1:1/test", 2).await;
    match outcome {
        Err(StoreError::Unavailable(message)) => {
            assert!(message.contains("127.0.0.1:1"), "{message}");
        }
        Err(other) => panic!("expected unavailable, got {other}"),
        Ok(_) => panic!("connected to nothing"),
    }
    assert!(started.elapsed() < Duration::from_secs(8));
}

/// A server that accepts connections and never answers, as a database
/// mid-outage may: calls give up after the pool's bound instead of hanging.
#[tokio::test]
async fn a_silent_server_is_unavailable_within_the_pool_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("address").port();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let started = std::time::Instant::now();
    let url = format!("postgres://postgres@127.0.0.1:{port}/test");
    match PgStore::connect(&url, 2).await {
        Err(StoreError::Unavailable(message)) => {
            assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
        }
        Err(other) => panic!("expected unavailable, got {other}"),
        Ok(_) => panic!("connected to a server that never answered"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    silent.abort();
}

#[tokio::test]
async fn a_corrupt_row_is_an_error_not_a_panic() {
    let schema = Schema::migrated().await;
    let store = schema.store().await;
    let Inserted::Created(created) = store.insert_job(job("acme")).await.expect("insert") else {
        panic!("a new job was expected");
    };
    let corrupt = format!(
        "UPDATE {}.jobs SET args = '{{not json' WHERE id = $1",
        schema.name
    );
    admin()
        .await
        .execute(&corrupt, &[&created.id])
        .await
        .expect("corrupt the row");

    match store.job("acme", &created.id).await {
        Err(StoreError::Unavailable(message)) => {
            assert!(message.contains("corrupt row"), "{message}");
            assert!(message.contains(&created.id), "{message}");
            assert!(message.contains("args"), "{message}");
        }
        other => panic!("expected a corrupt-row error, got {other:?}"),
    }
    assert_eq!(
        store.job_counts().await.expect("counts").first(),
        Some(&(JobState::Queued, 1))
    );
}

#[tokio::test]
async fn a_closed_store_is_unavailable() {
    let schema = Schema::migrated().await;
    let store = schema.store().await;
    store.ping().await.expect("ping");
    store.close();
    assert!(matches!(
        store.ping().await,
        Err(StoreError::Unavailable(_))
    ));
}

/// Three numbers from the statistics collector, read by `sql` (`$1` the
/// schema), once the last reaches `counted`: a connection reports its
/// statistics when it ends, a moment after. As they stand after ten
/// seconds otherwise.
async fn statistics(
    admin: &tokio_postgres::Client,
    schema: &str,
    sql: &str,
    counted: i64,
) -> (i64, i64, i64) {
    let read = || async {
        let row = admin.query_one(sql, &[&schema]).await.expect("statistics");
        (row.get(0), row.get(1), row.get(2))
    };
    let mut numbers = read().await;
    for _ in 0..100 {
        if numbers.2 >= counted {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        numbers = read().await;
    }
    numbers
}

/// Rows of `jobs` read other than through its primary key: (sequential
/// scans, entries of the partial indexes `jobs_due` and `jobs_lease`), and
/// the rows updated so far.
const READS_BESIDE_THE_KEY: &str = "SELECT COALESCE(t.seq_tup_read, 0),
       (SELECT COALESCE(SUM(idx_tup_read), 0)::bigint FROM pg_stat_user_indexes
         WHERE schemaname = $1 AND indexrelname IN ('jobs_due', 'jobs_lease')),
       t.n_tup_upd
     FROM pg_stat_user_tables t WHERE t.schemaname = $1 AND t.relname = 'jobs'";

/// Claims and settlements find their job by its primary key whatever the
/// table held when a connection first ran them: a connection that ran them
/// on a near-empty table (where a scan is the cheapest plan) must not keep
/// scanning once a backlog is queued, nor walk the partial indexes of
/// waiting and running jobs to find one job.
#[tokio::test]
async fn claims_read_jobs_by_key_whatever_the_table_held_before() {
    let schema = Schema::migrated().await;
    // One connection, so the statements it prepared early are the ones
    // that run later.
    let store = PgStore::connect_in_schema(&url(), &schema.name, 1)
        .await
        .expect("connect");
    let now = 1_700_000_000_000;
    let lease = 30_000;
    // A near-empty table: each statement runs more than the five times
    // after which PostgreSQL may settle on a generic plan.
    for _ in 0..8 {
        let mut new = job("acme");
        new.idempotency_key = None;
        let id = new.id.clone();
        store.insert_job(new).await.expect("insert");
        let claimed = store
            .claim(toolfleet_store::ClaimJob {
                id: &id,
                worker: "w",
                now,
                lease_ms: lease,
            })
            .await
            .expect("claim")
            .expect("claimed");
        let done = succeed(&store, &claimed, now).await;
        assert!(done.is_some(), "the warm-up job settles");
    }
    // Then a backlog.
    const BACKLOG: usize = 2_000;
    let mut ids = Vec::with_capacity(BACKLOG);
    for _ in 0..BACKLOG {
        let mut new = job("acme");
        new.idempotency_key = None;
        ids.push(new.id.clone());
        store.insert_job(new).await.expect("insert");
    }
    const CLAIMED: usize = 100;
    for id in ids.iter().take(CLAIMED) {
        let claimed = store
            .claim(toolfleet_store::ClaimJob {
                id,
                worker: "w",
                now,
                lease_ms: lease,
            })
            .await
            .expect("claim")
            .expect("claimed");
        let done = succeed(&store, &claimed, now).await;
        assert!(done.is_some(), "a claimed job settles");
    }
    // A connection reports its statistics when it ends.
    store.close();
    drop(store);
    let admin = admin().await;
    let updates = (2 * (8 + CLAIMED)) as i64;
    let (scanned, partial, updated) =
        statistics(&admin, &schema.name, READS_BESIDE_THE_KEY, updates).await;
    assert_eq!(updated, updates, "every claim and settlement was counted");
    // One scan of the backlog would read 2,000 rows; the warm-up's scans of
    // a table of at most eight rows read a few dozen in all.
    assert!(
        scanned < 500,
        "{scanned} rows of jobs were read by sequential scans"
    );
    assert!(
        partial < 500,
        "{partial} entries of jobs_due and jobs_lease were read to find jobs by id"
    );
}

/// The sweeper's search for due jobs reads the earliest of a backlog, not
/// all of it: a few from `jobs_due` and no sequential scan, however long
/// the queue.
#[tokio::test]
async fn due_jobs_read_the_earliest_of_a_backlog_not_all_of_it() {
    let schema = Schema::migrated().await;
    let store = PgStore::connect_in_schema(&url(), &schema.name, 1)
        .await
        .expect("connect");
    const BACKLOG: usize = 2_000;
    let mut first = None;
    for _ in 0..BACKLOG {
        let mut new = job("acme");
        new.idempotency_key = None;
        first.get_or_insert_with(|| new.id.clone());
        store.insert_job(new).await.expect("insert");
    }
    let after = toolfleet_store::DueAfter::default();
    let due = toolfleet_store::DueJobs {
        now: i64::MAX,
        due_by: i64::MAX,
        after: &after,
        limit: 10,
    };
    let due = store.due_jobs(due).await.expect("due jobs").jobs;
    assert_eq!(due.len(), 10);
    assert_eq!(due.first().map(|j| j.id.clone()), first, "oldest first");
    store.close();
    drop(store);
    let admin = admin().await;
    let inserted = BACKLOG as i64;
    let (scanned, from_index, counted) =
        statistics(&admin, &schema.name, DUE_READS, inserted).await;
    assert_eq!(counted, inserted, "every insert was counted");
    assert_eq!(scanned, 0, "rows read by sequential scans");
    assert!(
        from_index <= 20,
        "{from_index} entries of jobs_due were read for 10 due jobs"
    );
}

/// Rows of `jobs` read by sequential scans, entries of `jobs_due` read, and
/// rows inserted.
const DUE_READS: &str = "SELECT COALESCE(t.seq_tup_read, 0),
       (SELECT COALESCE(SUM(idx_tup_read), 0)::bigint FROM pg_stat_user_indexes
         WHERE schemaname = $1 AND indexrelname = 'jobs_due'),
       t.n_tup_ins
     FROM pg_stat_user_tables t WHERE t.schemaname = $1 AND t.relname = 'jobs'";

/// The rows of `job_owners` in `schema`.
async fn owner_rows(admin: &tokio_postgres::Client, schema: &str) -> i64 {
    let sql = format!(r#"SELECT count(*) FROM "{schema}".job_owners"#);
    admin.query_one(&sql, &[]).await.expect("owner rows").get(0)
}

/// A job's owner (tenant, user, id) is written once, apart from its row
/// (migration 25): the only index of `jobs` that every version of a row
/// enters is the primary key, the owner row comes with the job's insert,
/// stays untouched while the job is claimed and settled, and goes with the
/// job, whatever statement inserts or deletes it.
#[tokio::test]
async fn a_jobs_owner_is_written_once_apart_from_its_row() {
    let schema = Schema::migrated().await;
    let admin = admin().await;
    let unconditional = admin
        .query(
            // pg_index itself, not the pg_indexes view: the view decompiles
            // every index it reads, and another test's dropped schema may
            // take one away meanwhile ("cache lookup failed").
            "SELECT c.relname::text FROM pg_index i
               JOIN pg_class c ON c.oid = i.indexrelid
               JOIN pg_class t ON t.oid = i.indrelid
               JOIN pg_namespace n ON n.oid = t.relnamespace
             WHERE n.nspname = $1 AND t.relname = 'jobs' AND i.indpred IS NULL
             ORDER BY 1",
            &[&schema.name],
        )
        .await
        .expect("the indexes of jobs");
    let names: Vec<String> = unconditional.iter().map(|row| row.get(0)).collect();
    assert_eq!(
        names,
        ["jobs_pkey"],
        "indexes every version of a job enters"
    );

    let store = PgStore::connect_in_schema(&url(), &schema.name, 4)
        .await
        .expect("connect");
    let now = 1_700_000_000_000;
    // Thirty at once (grouped into few statements) and one alone.
    let inserted = futures_util::future::join_all((0..30).map(|_| {
        let mut new = job("acme");
        new.idempotency_key = None;
        store.insert_job(new)
    }))
    .await;
    let mut ids: Vec<String> = inserted
        .into_iter()
        .map(|i| i.expect("insert").job().id.clone())
        .collect();
    let mut alone = job("acme");
    alone.user = "bob".to_owned();
    ids.push(
        store
            .insert_job(alone)
            .await
            .expect("insert")
            .job()
            .id
            .clone(),
    );
    assert_eq!(owner_rows(&admin, &schema.name).await, 31, "one per job");
    let matching = format!(
        r#"SELECT count(*) FROM "{s}".job_owners o JOIN "{s}".jobs j
             ON j.id = o.id AND j.tenant = o.tenant AND j."user" = o."user""#,
        s = schema.name
    );
    let matching: i64 = admin.query_one(&matching, &[]).await.expect("join").get(0);
    assert_eq!(
        matching, 31,
        "each owner row names its job's tenant and user"
    );

    for id in &ids {
        run_to_success(&store, id, now).await;
    }
    store.close();
    drop(store);
    let written = statistics(
        &admin,
        &schema.name,
        "SELECT n_tup_ins, n_tup_upd, (SELECT n_tup_upd FROM pg_stat_user_tables
           WHERE schemaname = $1 AND relname = 'jobs')
         FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'job_owners'",
        62,
    )
    .await;
    assert_eq!(
        written,
        (31, 0, 62),
        "owner rows inserted, updated; jobs updated"
    );

    let store = PgStore::connect_in_schema(&url(), &schema.name, 1)
        .await
        .expect("connect");
    let prune = Prune {
        kind: Retained::Jobs,
        before: now + 1,
        limit: 20,
    };
    assert_eq!(store.prune(prune).await.expect("prune"), 20);
    assert_eq!(
        owner_rows(&admin, &schema.name).await,
        11,
        "gone with their jobs"
    );
    // A statement of someone else's (an operator's, an older process's).
    admin
        .batch_execute(&format!(r#"DELETE FROM "{}".jobs"#, schema.name))
        .await
        .expect("delete");
    assert_eq!(
        owner_rows(&admin, &schema.name).await,
        0,
        "gone with their jobs"
    );
}

/// A tenant's job list, a user's and the list of succeeded jobs walk the
/// tenant's owner rows newest first and read each job by its key: a page
/// of ten reads about ten entries, however many jobs other tenants hold,
/// and nothing is read by a sequential scan.
#[tokio::test]
async fn job_lists_walk_the_tenants_owner_rows_newest_first() {
    let schema = Schema::migrated().await;
    let store = PgStore::connect_in_schema(&url(), &schema.name, 1)
        .await
        .expect("connect");
    let now = 1_700_000_000_000;
    // Forty of acme's jobs among some two thousand of globex's, every
    // other one of acme's its user bob's.
    let (mut acme, mut alices) = (Vec::new(), Vec::new());
    for n in 0..2_030 {
        let mine = n % 100 == 7 || n >= 2_011;
        let mut new = job(if mine { "acme" } else { "globex" });
        new.idempotency_key = None;
        if mine && acme.len() % 2 == 1 {
            new.user = "bob".to_owned();
        }
        let (id, user) = (new.id.clone(), new.user.clone());
        store.insert_job(new).await.expect("insert");
        if user == "alice" && mine {
            alices.push(id.clone());
        }
        if mine {
            run_to_success(&store, &id, now).await;
            acme.push(id);
        }
    }
    assert_eq!(acme.len(), 40);
    acme.reverse();
    alices.reverse();
    let pages = [
        (JobFilter::default(), acme.clone()),
        (
            JobFilter {
                user: Some("alice".to_owned()),
                ..JobFilter::default()
            },
            alices,
        ),
        (
            JobFilter {
                state: Some(JobState::Succeeded),
                ..JobFilter::default()
            },
            acme.clone(),
        ),
    ];
    for (filter, all) in &pages {
        let page = store
            .list_jobs(ListJobs {
                tenant: "acme",
                filter,
                limit: 10,
                cursor: None,
            })
            .await
            .expect("a page");
        let got: Vec<&str> = page.jobs.iter().map(|j| j.id.as_str()).collect();
        let want: Vec<&str> = all.iter().take(10).map(String::as_str).collect();
        assert_eq!(got, want, "newest first: {filter:?}");
        assert!(page.jobs.iter().all(|j| j.tenant == "acme"));
    }
    store.close();
    drop(store);
    let admin = admin().await;
    let read = statistics(
        &admin,
        &schema.name,
        "SELECT
           (SELECT COALESCE(sum(seq_tup_read), 0)::bigint FROM pg_stat_user_tables
             WHERE schemaname = $1 AND relname IN ('jobs', 'job_owners')),
           (SELECT COALESCE(sum(idx_tup_read), 0)::bigint FROM pg_stat_user_indexes
             WHERE schemaname = $1 AND relname = 'job_owners'),
           (SELECT n_tup_ins FROM pg_stat_user_tables
             WHERE schemaname = $1 AND relname = 'jobs')",
        2_030,
    )
    .await;
    let (scanned, owners, inserted) = read;
    assert_eq!(inserted, 2_030, "every insert was counted");
    assert_eq!(scanned, 0, "rows read by sequential scans");
    assert!(
        owners <= 3 * 12,
        "{owners} owner rows were read for three pages of ten"
    );
}

/// A worker's store opens, as the worker starts, the connections its
/// grouped claims and successes run on (two statements each at once with
/// a pool of eight), each with those statements prepared, before any job.
#[tokio::test]
async fn warming_opens_the_groups_connections_with_their_statements_prepared() {
    let schema = Schema::migrated().await;
    let name = fresh_name();
    let url = url();
    let joiner = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{joiner}application_name={name}");
    let store = PgStore::connect_in_schema(&url, &schema.name, 8)
        .await
        .expect("connect");
    store.warm().await.expect("warm");
    let admin = admin().await;
    let row = admin
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE query LIKE '%UPDATE jobs SET state%UNNEST%')
             FROM pg_stat_activity WHERE application_name = $1",
            &[&name],
        )
        .await
        .expect("activity");
    let (open, prepared): (i64, i64) = (row.get(0), row.get(1));
    assert!(open >= 4, "{open} connections open");
    assert!(
        prepared >= 4,
        "{prepared} of {open} prepared a grouped statement last"
    );
    store.close();
}

/// The webhook searches probe the notices by key for each settled job and
/// each answered ticket: thousands of notices sent are not read for every
/// one.
#[tokio::test]
async fn webhook_searches_probe_the_notices_by_key() {
    let schema = Schema::migrated().await;
    let admin = admin().await;
    admin
        .batch_execute(&format!(
            r#"INSERT INTO "{}".notices (key, state, delivered, keep_until)
               SELECT 'webhook:job:' || g || ':succeeded', 'sent', true, 0
               FROM generate_series(1, 3000) g"#,
            schema.name
        ))
        .await
        .expect("3,000 notices sent");
    let store = PgStore::connect_in_schema(&url(), &schema.name, 1)
        .await
        .expect("connect");
    let now = 1_700_000_000_000;
    for _ in 0..5 {
        let mut new = job("acme");
        new.idempotency_key = None;
        new.callback_url = Some("http://127.0.0.1:9/hook".to_owned());
        let id = new.id.clone();
        store.insert_job(new).await.expect("insert");
        let claimed = store
            .claim(toolfleet_store::ClaimJob {
                id: &id,
                worker: "w",
                now,
                lease_ms: 30_000,
            })
            .await
            .expect("claim")
            .expect("claimed");
        succeed(&store, &claimed, now + 1).await.expect("settled");
    }
    let found = store
        .unnotified_jobs(toolfleet_store::Unnotified {
            notice_prefix: "webhook:job:",
            since: now,
            until: now + 10,
            limit: 100,
        })
        .await
        .expect("unnotified jobs");
    assert_eq!(found.len(), 5);
    for _ in 0..5 {
        let ticket = toolfleet_store::NewTicket {
            id: toolfleet_core::new_id(),
            tenant: "acme".to_owned(),
            user: "alice".to_owned(),
            tool: "ask_user".to_owned(),
            question: "travel or meals?".to_owned(),
            options: Vec::new(),
            args: json!({}),
            run_id: toolfleet_core::new_id(),
            call_id: toolfleet_core::new_id(),
            callback_url: Some("http://127.0.0.1:9/hook".to_owned()),
            answered_by: toolfleet_core::AnsweredBy::Caller,
            kind: toolfleet_store::TicketKind::Question,
            plan: None,
            scopes: Vec::new(),
            expires_at: None,
            input_requests: None,
            now,
        };
        let id = store.insert_ticket(ticket).await.expect("insert").id;
        store
            .answer_ticket(toolfleet_store::AnswerTicket {
                tenant: "acme",
                id: &id,
                answer: &json!("travel"),
                now: now + 1,
            })
            .await
            .expect("answer")
            .expect("answered");
    }
    let found = store
        .unnotified_tickets(toolfleet_store::Unnotified {
            notice_prefix: "webhook:ticket:",
            since: now,
            until: now + 10,
            limit: 100,
        })
        .await
        .expect("unnotified tickets");
    assert_eq!(found.len(), 5);
    store.close();
    drop(store);
    let (scanned, from_index, probes) = statistics(
        &admin,
        &schema.name,
        "SELECT COALESCE(t.seq_tup_read, 0), COALESCE(i.idx_tup_read, 0), i.idx_scan
         FROM pg_stat_user_tables t JOIN pg_stat_user_indexes i USING (relid)
         WHERE t.schemaname = $1 AND t.relname = 'notices'
           AND i.indexrelname = 'notices_pkey'",
        10,
    )
    .await;
    assert!(
        probes >= 10,
        "the notices were searched by key, once for each job and ticket"
    );
    assert_eq!(scanned, 0, "notices read by sequential scans");
    assert!(
        from_index < 100,
        "{from_index} entries of notices_pkey were read to probe 10 keys"
    );
}

/// Several processes prune at once: each settled job is deleted by one of
/// them, none is left, and no unsettled job goes.
#[tokio::test]
async fn concurrent_prunes_delete_each_settled_job_once() {
    let schema = Schema::migrated().await;
    let admin = admin().await;
    const SETTLED: i64 = 5_000;
    // Written directly: 5,000 jobs that succeeded long ago, and one queued.
    admin
        .batch_execute(&format!(
            "INSERT INTO {s}.jobs (id, tenant, \"user\", tool, pool, args, state, attempts,
                max_attempts, timeout_ms, run_at, run_id, call_id, created_at, updated_at)
             SELECT 'job-' || n, 'acme', 'alice', 'ocr', 'default', '{{}}', 'succeeded', 1,
                3, 60000, n, 'run', 'call', n, n
             FROM generate_series(1, {SETTLED}) AS n;
             INSERT INTO {s}.jobs (id, tenant, \"user\", tool, pool, args, state, attempts,
                max_attempts, timeout_ms, run_at, run_id, call_id, created_at, updated_at)
             VALUES ('waiting', 'acme', 'alice', 'ocr', 'default', '{{}}', 'queued', 0, 3,
                60000, 1, 'run', 'call', 1, 1)",
            s = schema.name
        ))
        .await
        .expect("jobs written");
    let mut pruners = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let store = schema.store().await;
        pruners.spawn(async move {
            let (mut total, mut calls) = (0, 0);
            loop {
                let prune = Prune {
                    kind: Retained::Jobs,
                    before: SETTLED + 1,
                    limit: 300,
                };
                let gone = store.prune(prune).await.expect("prune");
                assert!(gone <= 300, "a call deletes at most its limit");
                calls += 1;
                total += gone;
                if gone == 0 {
                    return (total, calls);
                }
            }
        });
    }
    let mut deleted = 0;
    while let Some(done) = pruners.join_next().await {
        deleted += done.expect("a pruner").0;
    }
    assert_eq!(deleted, SETTLED as u64, "each deleted once, none left");
    let left: i64 = admin
        .query_one(&format!("SELECT count(*) FROM {}.jobs", schema.name), &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(left, 1, "the queued job stays");
}
