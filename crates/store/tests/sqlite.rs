//! The SQLite store against the conformance suite, plus what only SQLite
//! has: a file that survives a reopen, refusal of a newer schema, WAL mode,
//! owner-only files.

use std::path::PathBuf;
use std::sync::OnceLock;

use serde_json::json;
use toolfleet_core::{JobState, new_id};
use toolfleet_store::sqlite::SqliteStore;
use toolfleet_store::{Inserted, NewJob, Store, StoreError};

/// A path in the temp directory no other test uses.
fn temp_db() -> PathBuf {
    std::env::temp_dir()
        .join(format!("toolfleet-store-test-{}", new_id()))
        .join("toolfleet.db")
}

/// Removes a test database directory (file, WAL and shared-memory files).
fn remove(path: &std::path::Path) {
    if let Some(dir) = path.parent() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// One file for the whole suite, each test on a connection of its own, as
/// the suite promises tests can share a database and as several toolfleet
/// processes share one data directory. One file per run of this binary.
fn shared_db() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(temp_db)
}

mod shared_file {
    toolfleet_store::store_conformance!(
        toolfleet_store::sqlite::SqliteStore::open(super::shared_db())
            .await
            .expect("open the shared database")
    );
}

mod memory {
    toolfleet_store::store_conformance!(
        toolfleet_store::sqlite::SqliteStore::open_in_memory()
            .await
            .expect("open in memory")
    );
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

/// [`job`] without an idempotency key, so that many can be inserted.
fn keyless_job(tenant: &str) -> NewJob {
    NewJob {
        idempotency_key: None,
        ..job(tenant)
    }
}

#[tokio::test]
async fn jobs_survive_a_reopen() {
    let path = temp_db();
    let store = SqliteStore::open(&path).await.expect("open");
    let Inserted::Created(created) = store.insert_job(job("acme")).await.expect("insert") else {
        panic!("a new job was expected");
    };
    store.close().await.expect("close");

    let store = SqliteStore::open(&path).await.expect("reopen");
    assert_eq!(
        store.job("acme", &created.id).await.expect("job"),
        Some(created.clone())
    );
    let again = store.insert_job(job("acme")).await.expect("insert again");
    assert_eq!(again, Inserted::Existing(created));
    store.close().await.expect("close");
    remove(&path);
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let path = temp_db();
    SqliteStore::open(&path)
        .await
        .expect("open")
        .close()
        .await
        .expect("close");
    let conn = rusqlite::Connection::open(&path).expect("open directly");
    conn.execute(
        "INSERT INTO refinery_schema_history (version, name, applied_on, checksum)
         VALUES (9999, 'from_the_future', '2030-01-01T00:00:00Z', '0')",
        [],
    )
    .expect("record a future migration");
    drop(conn);

    match SqliteStore::open(&path).await {
        Err(StoreError::Schema(message)) => {
            assert!(message.contains("9999"), "{message}");
            assert!(message.contains("newer"), "{message}");
            assert!(message.contains(&path.display().to_string()), "{message}");
        }
        Err(other) => panic!("expected a schema error, got {other}"),
        Ok(_) => panic!("a database from a newer toolfleet was opened"),
    }
    remove(&path);
}

mod embedded {
    refinery::embed_migrations!("../../migrations/sqlite");
}

/// A new file brought to schema `version` only, as an older toolfleet
/// left it, and a connection to it.
fn file_at_version(version: i32) -> (PathBuf, rusqlite::Connection) {
    let path = temp_db();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("create the directory");
    }
    let mut conn = rusqlite::Connection::open(&path).expect("open directly");
    embedded::migrations::runner()
        .set_target(refinery::Target::Version(version))
        .run(&mut conn)
        .expect("migrate to the version");
    (path, conn)
}

/// A file that an older toolfleet left at schema version 1 is brought up to
/// date on open; its jobs read back without lineage or checkpoint, and take
/// a checkpoint once claimed.
#[tokio::test]
async fn a_version_1_file_is_migrated_on_open() {
    let (path, conn) = file_at_version(1);
    let id = new_id();
    conn.execute(
        "INSERT INTO jobs (id, tenant, user, tool, pool, args, state, max_attempts, timeout_ms,
             run_at, run_id, call_id, created_at, updated_at)
         VALUES (?1, 'acme', 'alice', 'ocr', 'default', '{}', 'queued', 3, 60000,
             1700000000000, 'run-1', 'call-1', 1700000000000, 1700000000000)",
        [&id],
    )
    .expect("a job of version 1");
    drop(conn);

    let store = SqliteStore::open(&path).await.expect("open and migrate");
    let job = store.job("acme", &id).await.expect("job").expect("kept");
    assert_eq!(job.lineage, None);
    assert_eq!(store.checkpoint(&id).await.expect("checkpoint"), None);
    let now = 1_700_000_000_000;
    let claimed = store
        .claim(toolfleet_store::ClaimJob {
            id: &id,
            worker: "w1",
            now,
            lease_ms: 30_000,
        })
        .await
        .expect("claim")
        .expect("claimable");
    let save = toolfleet_store::SaveCheckpoint {
        lease: &claimed.lease_ref().expect("held"),
        checkpoint: &json!({"step": 1}),
        now: now + 1,
    };
    assert!(store.save_checkpoint(save).await.expect("save_checkpoint"));
    assert_eq!(
        store.checkpoint(&id).await.expect("checkpoint"),
        Some(json!({"step": 1}))
    );
    store.close().await.expect("close");
    remove(&path);
}

/// A file of schema version 8, where a parked job was `retrying` with a
/// `run_at` that never comes, is brought to version 9 on open: the parked
/// job is `parked` and wakes on its ticket, a retrying one stays so, and
/// the jobs table keeps every index it had (through version 13, which made
/// the table again too).
#[tokio::test]
async fn a_version_8_file_moves_its_parked_jobs_to_their_state() {
    let (path, conn) = file_at_version(8);
    let indexes = |conn: &rusqlite::Connection| -> Vec<String> {
        let mut stmt = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'jobs' AND sql IS NOT NULL ORDER BY name")
            .expect("prepare");
        stmt.query_map([], |r| r.get(0))
            .expect("indexes")
            .collect::<Result<_, _>>()
            .expect("names")
    };
    let before = indexes(&conn);
    let (parked, retrying) = (new_id(), new_id());
    for (id, run_at, waiting_on) in [
        (&parked, i64::MAX, Some("t_1")),
        (&retrying, 1_700_000_000_000, None),
    ] {
        conn.execute(
            "INSERT INTO jobs (id, tenant, user, tool, pool, args, state, max_attempts, timeout_ms,
                 run_at, run_id, call_id, created_at, updated_at, waiting_on)
             VALUES (?1, 'acme', 'alice', 'ocr', 'default', '{}', 'retrying', 3, 60000,
                 ?2, 'run-1', 'call-1', 1700000000000, 1700000000000, ?3)",
            rusqlite::params![id, run_at, waiting_on],
        )
        .expect("a job of version 8");
    }
    drop(conn);

    let store = SqliteStore::open(&path).await.expect("open and migrate");
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
    store.close().await.expect("close");
    let conn = rusqlite::Connection::open(&path).expect("open directly");
    // Every index of version 8 is still there (later versions add theirs).
    let after = indexes(&conn);
    let lost: Vec<&String> = before.iter().filter(|i| !after.contains(i)).collect();
    assert!(lost.is_empty(), "indexes of version 8 lost: {lost:?}");
    drop(conn);
    remove(&path);
}

/// A file of schema version 25 is brought to version 26 on open, where the
/// jobs table is made again with its CHECK and partial indexes naming
/// their states by equalities: every row reads back as it was, column by
/// column, every index is there, and a state outside the lifecycle's is
/// still refused.
#[tokio::test]
async fn a_version_25_file_keeps_its_jobs_whole() {
    let (path, conn) = file_at_version(25);
    for (n, state, lease, priority, callback) in [
        (1, "queued", None, None, None),
        (2, "running", Some(1_700_000_030_000_i64), Some(5_i64), None),
        (
            3,
            "succeeded",
            None,
            None,
            Some("https://hooks.example/done"),
        ),
        (4, "parked", None, Some(1), None),
    ] {
        conn.execute(
            "INSERT INTO jobs (id, tenant, user, tool, pool, args, state, attempts, max_attempts,
                 timeout_ms, run_at, lease_owner, lease_until, result, idempotency_key, run_id,
                 call_id, callback_url, created_at, updated_at, requeues, priority,
                 concurrency_key, concurrency_limit, fair_rank, started_at, attempts_log)
             VALUES (?1, 'acme', 'alice', 'ocr', 'default', '{\"n\":1}', ?2, 1, 3, 60000,
                 1700000000000, ?3, ?4, ?5, ?6, 'run-1', 'call-1', ?7, 1700000000000,
                 1700000000001, 2, ?8, 'key-1', 4, 7, 1700000000002, '[]')",
            rusqlite::params![
                format!("j{n}"),
                state,
                lease.map(|_| "w1"),
                lease,
                (state == "succeeded").then_some("{\"ok\":true}"),
                format!("idem-{n}"),
                callback,
                priority,
            ],
        )
        .expect("a job of version 25");
    }
    let everything =
        |conn: &rusqlite::Connection| -> (Vec<Vec<rusqlite::types::Value>>, Vec<String>) {
            let mut rows = conn
                .prepare("SELECT * FROM jobs ORDER BY id")
                .expect("prepare");
            let columns = rows.column_count();
            let rows = rows
                .query_map([], |r| (0..columns).map(|i| r.get(i)).collect())
                .expect("rows")
                .collect::<Result<Vec<Vec<rusqlite::types::Value>>, _>>()
                .expect("values");
            let mut names = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'jobs' ORDER BY name")
            .expect("prepare");
            let names = names
                .query_map([], |r| r.get(0))
                .expect("indexes")
                .collect::<Result<Vec<String>, _>>()
                .expect("names");
            (rows, names)
        };
    let before = everything(&conn);
    drop(conn);

    let store = SqliteStore::open(&path).await.expect("open and migrate");
    let job = store.job("acme", "j2").await.expect("job").expect("kept");
    assert_eq!((job.state, job.priority), (JobState::Running, Some(5)));
    store.close().await.expect("close");
    let conn = rusqlite::Connection::open(&path).expect("open directly");
    assert_eq!(everything(&conn), before);
    let table: String = conn
        .query_row(
            "SELECT sql FROM sqlite_master WHERE name = 'jobs'",
            [],
            |r| r.get(0),
        )
        .expect("the table");
    assert!(table.contains("state = 'cancelled'"), "{table}");
    let refused = conn.execute("UPDATE jobs SET state = 'lost' WHERE id = 'j1'", []);
    assert!(
        refused.is_err(),
        "a state outside the lifecycle was written"
    );
    drop(conn);
    remove(&path);
}

/// A file of schema version 9, whose webhook notices were kept in the
/// commit log, is brought to version 10 on open: the notices move to their
/// own table (a sent one is not claimed again) and the commit log keeps the
/// confirm tokens' outcomes only.
#[tokio::test]
async fn a_version_9_file_moves_its_notices_out_of_the_commit_log() {
    let (path, conn) = file_at_version(9);
    let far = 4_000_000_000_000_i64;
    conn.execute(
        "INSERT INTO commits (key, state, envelope, keep_until) VALUES
            ('webhook:job:j1:succeeded', 'settled',
             '{\"status\":\"ok\",\"result\":{\"delivered\":true},\"call_id\":\"\"}', ?1),
            ('ct1.command', 'settled',
             '{\"status\":\"ok\",\"result\":{\"report\":\"r1\"},\"call_id\":\"\"}', ?1)",
        [far],
    )
    .expect("commits of version 9");
    drop(conn);

    let store = SqliteStore::open(&path).await.expect("open and migrate");
    let now = 1_700_000_000_000;
    let notice = toolfleet_store::ClaimNotice {
        key: "webhook:job:j1:succeeded",
        now,
        lease_ms: 30_000,
        keep_until: far,
    };
    assert_eq!(store.claim_notice(notice).await, Ok(false), "sent already");
    let command = toolfleet_store::ClaimCommit {
        key: "ct1.command",
        now,
        lease_ms: 30_000,
        keep_until: far,
        take_over: false,
    };
    assert!(
        matches!(
            store.claim_commit(command).await,
            Ok(toolfleet_store::CommitClaim::Settled(_))
        ),
        "the command's outcome stays in the commit log"
    );
    let moved = toolfleet_store::ClaimCommit {
        key: "webhook:job:j1:succeeded",
        ..command
    };
    assert_eq!(
        store.claim_commit(moved).await,
        Ok(toolfleet_store::CommitClaim::Run),
        "the notice left the commit log"
    );
    store.close().await.expect("close");
    remove(&path);
}

/// A file of schema version 10 is brought to version 11 on open: its
/// tickets are questions without scopes, plan, expiry or outcome, listed in
/// the inbox and answered as before.
#[tokio::test]
async fn a_version_10_file_keeps_its_tickets_as_questions() {
    let (path, conn) = file_at_version(10);
    let id = format!("t_{}", new_id());
    conn.execute(
        "INSERT INTO tickets (id, tenant, user, tool, question, options, args, run_id,
             call_id, created_at)
         VALUES (?1, 'acme', 'alice', 'ask_user', 'travel or meals?', '[]', '{}', 'run-1',
             'call-1', 1700000000000)",
        [&id],
    )
    .expect("a ticket of version 10");
    drop(conn);

    let store = SqliteStore::open(&path).await.expect("open and migrate");
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
    store.close().await.expect("close");
    remove(&path);
}

#[tokio::test]
async fn the_file_is_in_wal_mode() {
    let path = temp_db();
    let store = SqliteStore::open(&path).await.expect("open");
    let conn = rusqlite::Connection::open(&path).expect("open directly");
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("journal_mode");
    assert_eq!(mode, "wal");
    drop(conn);
    store.close().await.expect("close");
    remove(&path);
}

/// The database, its WAL and its shared-memory file are owner-only from
/// their first byte, in a directory the store made owner-only; files an
/// older toolfleet left readable by others are made owner-only on open.
#[cfg(unix)]
#[tokio::test]
async fn the_file_its_wal_and_its_shm_are_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let path = temp_db();
    let beside = |suffix: &str| {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        PathBuf::from(file)
    };
    let mode = |file: &std::path::Path| {
        std::fs::metadata(file)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
            .permissions()
            .mode()
            & 0o7777
    };
    let store = SqliteStore::open(&path).await.expect("open");
    store
        .insert_job(job("acme"))
        .await
        .expect("a write, in the WAL");
    let dir = path.parent().expect("a directory");
    assert_eq!(mode(dir), 0o700, "the directory the store made");
    for suffix in ["", "-wal", "-shm"] {
        let file = beside(suffix);
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }

    // As an older toolfleet left them: readable by everyone.
    for suffix in ["", "-wal", "-shm"] {
        std::fs::set_permissions(beside(suffix), std::fs::Permissions::from_mode(0o644))
            .expect("chmod");
    }
    let again = SqliteStore::open(&path).await.expect("reopen");
    for suffix in ["", "-wal", "-shm"] {
        let file = beside(suffix);
        assert_eq!(mode(&file), 0o600, "made owner-only: {}", file.display());
    }
    again.close().await.expect("close");
    store.close().await.expect("close");
    remove(&path);
}

#[tokio::test]
async fn a_corrupt_row_is_an_error_not_a_panic() {
    let path = temp_db();
    let store = SqliteStore::open(&path).await.expect("open");
    let Inserted::Created(created) = store.insert_job(job("acme")).await.expect("insert") else {
        panic!("a new job was expected");
    };
    let conn = rusqlite::Connection::open(&path).expect("open directly");
    conn.execute(
        "UPDATE jobs SET args = '{not json' WHERE id = ?1",
        [&created.id],
    )
    .expect("corrupt the row");
    drop(conn);

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
    store.close().await.expect("close");
    remove(&path);
}

/// The frames in the WAL, as the shared-memory index's header says
/// (`mxFrame`: a native-endian u32 at byte 16 of the `-shm` file).
fn wal_frames(path: &std::path::Path) -> u32 {
    let mut shm = path.as_os_str().to_owned();
    shm.push("-shm");
    let index = std::fs::read(PathBuf::from(shm)).expect("the WAL index");
    let bytes: [u8; 4] = index[16..20].try_into().expect("a header");
    u32::from_ne_bytes(bytes)
}

/// Under writes that never pause, the WAL still starts over: the
/// checkpointer's passes alone always overlap a write, so every write
/// found a frame uncopied and the WAL grew by each (hundreds of MB).
#[tokio::test]
async fn the_wal_starts_over_though_writes_never_pause() {
    let path = temp_db();
    let store = SqliteStore::open(&path).await.expect("a store");
    let mut most = 0;
    let mut started_over = false;
    for _ in 0..30_000 {
        let inserted = store.insert_job(keyless_job("t-wal")).await;
        inserted.expect("inserted");
        let frames = wal_frames(&path);
        if frames < most {
            started_over = true;
            break;
        }
        most = most.max(frames);
    }
    drop(store);
    remove(&path);
    assert!(
        started_over,
        "the WAL reached {most} frames and never started over"
    );
}

/// jobs_lease holds the running jobs only (version 27): a queued job and a
/// settled one hold no place in it, so inserting a job never changes it
/// and settling one only removes its entry. `ANALYZE` counts the index's
/// entries (the first number of its `sqlite_stat1` row).
#[tokio::test]
async fn only_running_jobs_hold_a_place_in_the_lease_index() {
    let path = temp_db();
    let store = SqliteStore::open(&path).await.expect("a store");
    let now = 1_700_000_000_000;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let one = keyless_job("t-lease");
        ids.push(one.id.clone());
        store.insert_job(one).await.expect("inserted");
    }
    let mut claimed = Vec::new();
    for id in &ids[..2] {
        let claim = toolfleet_store::ClaimJob {
            id,
            worker: "w1",
            now,
            lease_ms: 30_000,
        };
        claimed.push(store.claim(claim).await.expect("claim").expect("claimable"));
    }
    let lease = claimed[0].lease_ref().expect("held");
    let done = toolfleet_store::Succeed {
        lease: &lease,
        result: &toolfleet_core::Json::encode(&json!({"ok": true})).expect("json"),
        now: now + 1,
        claimed: Some(&claimed[0]),
    };
    assert!(store.succeed(done).await.expect("succeed").is_some());
    store.close().await.expect("close");

    let conn = rusqlite::Connection::open(&path).expect("open directly");
    conn.execute_batch("ANALYZE jobs").expect("analyze");
    let stat: String = conn
        .query_row(
            "SELECT stat FROM sqlite_stat1 WHERE idx = 'jobs_lease'",
            [],
            |r| r.get(0),
        )
        .expect("the index's statistics");
    assert_eq!(stat.split(' ').next(), Some("1"), "entries: {stat}");
    drop(conn);
    remove(&path);
}
