//! Work interrupted mid-run takes effect once, with real processes.
//!
//! - A lease lost while its executor runs: `toolfleet serve` on PostgreSQL
//!   and RabbitMQ (a schema and a prefix of this test's own) runs a job
//!   whose exec tool writes its effect only when the test lets it. The test
//!   holds the job's row locked past `lease_s`, so the attempt's heartbeats
//!   cannot extend its lease, until the sweeper has handed the job to a new
//!   claim of the same worker; the heartbeat waiting on the lock ahead of
//!   the claim is cancelled, and the next waits behind it, so that the
//!   claim is first when the lock goes. The stale
//!   attempt learns at its next heartbeat that it lost the lease: its
//!   executor is killed before it could write anything, and the job ends
//!   succeeded once, with one effect.
//! - A command's commit interrupted: `toolfleet serve` on SQLite runs a
//!   command whose commit writes its effect only when the test lets it.
//!   The first commit's HTTP request is dropped while the tool runs; a
//!   second commit with the same token meanwhile answers `conflict` with
//!   `retry_after_s`; once the tool is released, the retry answers the
//!   first commit's result, and the tool ran once.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{
    Server, TOKEN, TempDir, config_with, eventually, migrate, psql_value, settle, shared_fleet,
};
use serde_json::json;

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Whether process `pid` still runs (neither gone nor a zombie).
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command's name, which is in parentheses.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, Some("Z" | "X") | None)
}

/// The value of the sample `name` (with its labels) on a `/metrics` page.
fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
}

/// A connection to the test's database, its task spawned.
async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("PostgreSQL answers");
    tokio::spawn(connection);
    client
}

/// A session waiting, directly or behind another waiter, on a lock that
/// the session of the test holds.
struct Waiter {
    pid: i32,
    /// Its statement.
    query: String,
    /// The sessions it waits for.
    blockers: Vec<i32>,
}

/// The sessions waiting on session `holder`'s locks.
async fn blocked_by(watcher: &tokio_postgres::Client, holder: i32) -> Vec<Waiter> {
    let rows = watcher
        .query(
            "WITH RECURSIVE blocked(pid) AS (
                SELECT a.pid FROM pg_stat_activity a WHERE $1::int = ANY(pg_blocking_pids(a.pid))
                UNION
                SELECT a.pid FROM pg_stat_activity a JOIN blocked b
                    ON b.pid = ANY(pg_blocking_pids(a.pid)))
            SELECT a.pid, a.query, pg_blocking_pids(a.pid)
            FROM pg_stat_activity a JOIN blocked USING (pid)",
            &[&holder],
        )
        .await
        .expect("pg_stat_activity");
    rows.iter()
        .map(|row| Waiter {
            pid: row.get(0),
            query: row.get(1),
            blockers: row.get(2),
        })
        .collect()
}

/// A job tool that records its shell's pid in `starts` when an attempt
/// starts, waits for the file `release`, then writes its effect (the job's
/// id) in `effects` and answers. Its timeout is far longer than the test:
/// only a lost lease stops an attempt before it is released (or the test's
/// directory going away, so that a failed test leaves no program behind).
fn held_job(dir: &Path) -> String {
    let file = |name: &str| dir.join(name).display().to_string();
    let script = format!(
        "echo $$ >> {starts}; while [ ! -e {release} ] && [ -e {starts} ]; do sleep 0.05; done; [ -e {release} ] || exit 1; echo \"$TOOLFLEET_IDEMPOTENCY_KEY\" >> {effects}; echo '{{\"done\": true}}'",
        starts = file("starts"),
        release = file("release"),
        effects = file("effects"),
    );
    format!(
        "[[tools]]\nname = \"held_job\"\nshape = \"job\"\nexecutor = {{ kind = \"exec\", program = \"/bin/sh\", args = [\"-c\", {script:?}], timeout_s = 600 }}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_while_its_executor_runs_ends_with_one_effect() {
    let (dir, config, _cleanup, id) = shared_fleet("lease-lost", "lease_s = 1\n", held_job);
    let schema = format!("tf_{id}");
    let file = |name: &str| -> PathBuf { dir.0.join(name) };
    migrate(&config);
    // One process: the dispatcher (and its sweeper) and one worker per pool,
    // so the attempt that takes the job over is the same worker's.
    let server = Server::start_with(&config);
    let alice = server.client(TOKEN);
    let accepted = alice.call("held_job", json!({})).await;
    assert_eq!(accepted["status"], "running", "{accepted}");
    let job = accepted["job_id"].as_str().expect("a job id").to_owned();
    let first = eventually(Duration::from_secs(30), || {
        let starts = file("starts");
        async move {
            lines(&starts)
                .first()
                .and_then(|pid| pid.parse::<u32>().ok())
        }
    })
    .await;

    // The job's row locked: heartbeats wait, and the lease runs out.
    let url = common::shared_database_url();
    let (locker, watcher) = (connect(&url).await, connect(&url).await);
    locker
        .batch_execute(&format!("SET search_path = {schema}; BEGIN"))
        .await
        .expect("begin");
    let holder: i32 = locker
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("backend pid")
        .get(0);
    locker
        .execute("SELECT id FROM jobs WHERE id = $1 FOR UPDATE", &[&job])
        .await
        .expect("the row locked");
    // Past the lease, the sweeper republishes the job and the worker's
    // claim of a new attempt waits on the lock too, behind the heartbeat.
    let is_claim = |w: &Waiter| w.query.contains("attempts = attempts + 1");
    let is_heartbeat = |w: &Waiter| w.query.contains("SET lease_until");
    let claim = eventually(Duration::from_secs(30), || {
        let watcher = &watcher;
        async move {
            let waiting = blocked_by(watcher, holder).await;
            waiting.into_iter().find(is_claim).map(|w| w.pid)
        }
    })
    .await;
    // The heartbeat waiting ahead of the claim fails (as it would on a
    // timeout or a lost connection)...
    for waiter in blocked_by(&watcher, holder).await {
        if is_heartbeat(&waiter) && waiter.blockers.contains(&holder) {
            watcher
                .execute("SELECT pg_cancel_backend($1)", &[&waiter.pid])
                .await
                .expect("cancel the waiting heartbeat");
        }
    }
    // ... and the next one waits behind the claim, so that the claim
    // updates the row first when the lock goes.
    eventually(Duration::from_secs(30), || {
        let watcher = &watcher;
        async move {
            let waiting = blocked_by(watcher, holder).await;
            let behind = |w: &Waiter| is_heartbeat(w) && w.blockers.contains(&claim);
            waiting.iter().any(behind).then_some(())
        }
    })
    .await;
    locker.batch_execute("COMMIT").await.expect("commit");

    // The new attempt starts; the stale one's executor is killed at its
    // next heartbeat, before it wrote its effect.
    let second = eventually(Duration::from_secs(30), || {
        let starts = file("starts");
        async move {
            lines(&starts)
                .get(1)
                .and_then(|pid| pid.parse::<u32>().ok())
        }
    })
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while alive(first) {
        assert!(
            std::time::Instant::now() < deadline,
            "the stale attempt's executor (pid {first}) still runs 30 s after the new \
             attempt took the job: it did not learn that it lost its lease"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(alive(second), "the new attempt's executor runs");
    std::fs::write(file("release"), "").expect("release");

    let done = settle(&alice, &job).await;
    assert_eq!(done["status"], "ok", "{done}");
    assert_eq!(done["result"]["done"], true, "{done}");
    assert_eq!(lines(&file("effects")), vec![job.clone()], "one effect");
    assert_eq!(lines(&file("starts")).len(), 2, "two attempts started");
    let stored = psql_value(
        &url,
        &format!("SELECT state || ' ' || attempts FROM {schema}.jobs WHERE id = '{job}'"),
    );
    assert_eq!(stored, "succeeded 2");
    // The worker started two attempts and settled one.
    let metrics = format!("{}/metrics", server.base);
    let page = eventually(Duration::from_secs(10), || {
        let (http, metrics) = (alice.http.clone(), metrics.clone());
        async move {
            let page = http.get(&metrics).send().await.ok()?.text().await.ok()?;
            let settled = r#"toolfleet_jobs_settled_total{tool="held_job",state="succeeded"}"#;
            sample(&page, settled).is_some().then_some(page)
        }
    })
    .await;
    let started = r#"toolfleet_jobs_started_total{tool="held_job"}"#;
    assert_eq!(sample(&page, started), Some(2.0), "{page}");
    let settled = r#"toolfleet_jobs_settled_total{tool="held_job",state="succeeded"}"#;
    assert_eq!(sample(&page, settled), Some(1.0), "{page}");
}

/// A command whose commit records its shell's pid in `runs`, waits for the
/// file `release`, then writes its effect (its confirm token) in `effects`
/// and answers a report numbered after its pid; its dry run answers a plan
/// at once.
fn held_command(dir: &Path) -> String {
    let file = |name: &str| dir.join(name).display().to_string();
    let script = format!(
        "input=$(cat); case \"$input\" in *'\"dry_run\":true'*) echo '{{\"total\": 42}}'; exit 0;; esac; echo $$ >> {runs}; while [ ! -e {release} ] && [ -e {runs} ]; do sleep 0.05; done; [ -e {release} ] || exit 1; echo \"$TOOLFLEET_IDEMPOTENCY_KEY\" >> {effects}; echo \"{{\\\"report_id\\\": \\\"rep-$$\\\"}}\"",
        runs = file("runs"),
        release = file("release"),
        effects = file("effects"),
    );
    format!(
        "[[tools]]\nname = \"held_report\"\nshape = \"command\"\ninput_schema = {{ type = \"object\", required = [\"dry_run\"], properties = {{ dry_run = {{ type = \"boolean\" }} }} }}\nmiddleware = {{ timeout_s = 600 }}\nexecutor = {{ kind = \"exec\", program = \"/bin/sh\", args = [\"-c\", {script:?}], timeout_s = 600 }}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_commit_runs_its_tool_once() {
    let dir = TempDir::new("commit-interrupted");
    let server = Server::start(&dir.0, &config_with(&dir.0, "", &held_command(&dir.0)));
    let file = |name: &str| -> PathBuf { dir.0.join(name) };
    let alice = server.client(TOKEN);
    let dry = alice.call("held_report", json!({"dry_run": true})).await;
    assert_eq!(dry["status"], "ok", "{dry}");
    let token = dry["result"]["confirm_token"].clone();
    let commit = json!({"dry_run": false, "confirm_token": token});

    // The first commit's request is dropped while its tool runs.
    let first = tokio::spawn({
        let (alice, commit) = (alice.clone(), commit.clone());
        async move { alice.call("held_report", commit).await }
    });
    let pid = eventually(Duration::from_secs(30), || {
        let runs = file("runs");
        async move { lines(&runs).first().and_then(|pid| pid.parse::<u32>().ok()) }
    })
    .await;
    first.abort();
    assert!(first.await.expect_err("dropped").is_cancelled());
    // The server saw its caller go away.
    let metrics = format!("{}/metrics", server.base);
    let cancelled = r#"toolfleet_calls_total{tool="held_report",outcome="cancelled"}"#;
    eventually(Duration::from_secs(10), || {
        let (http, metrics) = (alice.http.clone(), metrics.clone());
        async move {
            let page = http.get(&metrics).send().await.ok()?.text().await.ok()?;
            (sample(&page, cancelled) == Some(1.0)).then_some(())
        }
    })
    .await;
    assert!(alive(pid), "the commit's tool still runs");

    // A second commit meanwhile: conflict, and when to call again.
    let second = alice.call("held_report", commit.clone()).await;
    assert_eq!(second["status"], "error", "{second}");
    assert_eq!(second["error"]["code"], "conflict", "{second}");
    assert_eq!(second["error"]["retryable"], true, "{second}");
    assert_eq!(second["error"]["retry_after_s"], 1, "{second}");

    // Released, the first commit ends and records its outcome, which the
    // retries answer.
    std::fs::write(file("release"), "").expect("release");
    let report = json!(format!("rep-{pid}"));
    let retried = eventually(Duration::from_secs(30), || {
        let (alice, commit) = (alice.clone(), commit.clone());
        async move {
            let answer = alice.call("held_report", commit).await;
            (answer["status"] != "error" || answer["error"]["code"] != "conflict").then_some(answer)
        }
    })
    .await;
    assert_eq!(retried["status"], "ok", "{retried}");
    assert_eq!(retried["result"]["report_id"], report, "{retried}");
    let again = alice.call("held_report", commit).await;
    assert_eq!(again["result"], retried["result"], "{again}");
    assert_eq!(lines(&file("runs")).len(), 1, "the tool ran once");
    assert_eq!(
        lines(&file("effects")),
        vec![token.as_str().expect("a token").to_owned()],
        "one effect"
    );
}
