//! Faults with real processes: `toolfleet migrate`, dispatchers and workers
//! pointed at PostgreSQL and RabbitMQ servers, some of them private to the
//! test (see common/private.rs) so that the test may stop and restart them
//! while the machine's shared servers keep serving every other test.
//!
//! - PostgreSQL stopped and started again: calls and reads answer 503
//!   `unavailable` with `Retry-After` at once (none hangs), `/readyz` says
//!   so, and the same processes recover by themselves.
//! - RabbitMQ stopped and started again under 1,000 jobs: every job settles,
//!   none is lost, each side effect happens once.
//! - A job that always fails ends `failed` after its attempts with its last
//!   error readable; a message that is no job id is dead-lettered and does
//!   not hold the queue up.
//! - A worker sent SIGTERM finishes its running job, exits 0 and leaves the
//!   queued jobs to another worker.

mod common;
#[path = "common/private.rs"]
mod private;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{
    Client, Server, SharedCleanup, TOKEN, TempDir, config_with, eventually, settle,
    shared_amqp_url, shared_database_url,
};
use private::{PrivatePostgres, PrivateRabbit};
use serde_json::{Value, json};
use toolfleet_broker::Broker;
use toolfleet_broker::rabbit::{RabbitBroker, RabbitOptions};

/// One fleet's configuration: a schema and a prefix of its own on the
/// given servers, migrated.
struct Fleet {
    dir: TempDir,
    config: PathBuf,
    schema: String,
    prefix: String,
}

impl Fleet {
    /// `tools` makes the `[[tools]]` tables given the fleet's directory.
    fn new(
        name: &str,
        database_url: &str,
        amqp_url: &str,
        top: &str,
        tools: impl FnOnce(&Path) -> String,
    ) -> Fleet {
        let dir = TempDir::new(name);
        let tools = tools(&dir.0);
        let id = uuid::Uuid::now_v7().simple().to_string();
        let (schema, prefix) = (format!("tf_{id}"), format!("tf-{id}"));
        let top = format!(
            "database_url = {database_url:?}\ndatabase_schema = \"{schema}\"\nbroker_url = {amqp_url:?}\nbroker_prefix = \"{prefix}\"\nconfirm_secret = \"{}\"\n{top}",
            "ab".repeat(32)
        );
        let config = dir.0.join("toolfleet.toml");
        std::fs::write(&config, config_with(&dir.0, &top, &tools)).unwrap();
        let migrated = Command::new(env!("CARGO_BIN_EXE_toolfleet"))
            .arg("--config")
            .arg(&config)
            .arg("migrate")
            .output()
            .unwrap();
        assert!(
            migrated.status.success(),
            "migrate: {}",
            String::from_utf8_lossy(&migrated.stderr)
        );
        Fleet {
            dir,
            config,
            schema,
            prefix,
        }
    }

    fn dispatcher(&self) -> Server {
        Server::start_role(&self.config, "dispatcher", "toolfleet serving on ")
    }

    fn worker(&self) -> Server {
        Server::start_role(&self.config, "worker", "toolfleet worker running")
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.0.join(name)
    }
}

/// A job tool running `/bin/sh -c <script>`, with more tool keys in `extra`.
fn sh_tool(name: &str, script: &str, extra: &str) -> String {
    format!(
        "[[tools]]\nname = \"{name}\"\nshape = \"job\"\n{extra}\nexecutor = {{ kind = \"exec\", program = \"/bin/sh\", args = [\"-c\", {script:?}] }}\n"
    )
}

/// A job whose every run is logged in `<name>.runs` and whose effect is
/// applied once per idempotency key in `<name>.effects`, after `sleep`
/// seconds.
fn side_effect_tool(name: &str, dir: &Path, sleep: &str) -> String {
    let pause = if sleep == "0" {
        String::new()
    } else {
        format!("sleep {sleep}; ")
    };
    let script = format!(
        "k=\"$TOOLFLEET_IDEMPOTENCY_KEY\"; echo \"$k\" >> {runs}; {pause}grep -qx \"$k\" {effects} 2>/dev/null || echo \"$k\" >> {effects}; echo '{{\"done\": true}}'",
        runs = dir.join(format!("{name}.runs")).display(),
        effects = dir.join(format!("{name}.effects")).display(),
    );
    sh_tool(name, &script, "")
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// One HTTP answer, read in full.
struct Answer {
    status: u16,
    retry_after: Option<String>,
    body: Value,
    took: Duration,
}

/// A request that must be answered within `limit` (a hang fails the test).
async fn request(
    client: &Client,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> Answer {
    let limit = Duration::from_secs(20);
    let started = Instant::now();
    let mut request = client
        .http
        .request(method.clone(), format!("{}{path}", client.base))
        .bearer_auth(&client.token);
    if let Some(body) = body {
        request = request
            .header("Content-Type", "application/json")
            .body(body.to_string());
    }
    let answered = tokio::time::timeout(limit, async {
        let response = request.send().await.expect("the server answers");
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let text = response.text().await.expect("a body");
        (status, retry_after, text)
    })
    .await;
    let Ok((status, retry_after, text)) = answered else {
        panic!("{method} {path} was not answered within {limit:?}");
    };
    Answer {
        status,
        retry_after,
        body: serde_json::from_str(&text).unwrap_or(json!({"raw": text})),
        took: started.elapsed(),
    }
}

async fn call_raw(client: &Client, tool: &str, args: Value) -> Answer {
    request(
        client,
        reqwest::Method::POST,
        "/v1/calls",
        Some(json!({"tool": tool, "args": args})),
    )
    .await
}

/// Every job of the caller's tenant, by id: (state, attempts).
async fn all_jobs(client: &Client) -> BTreeMap<String, (String, u64)> {
    let mut out = BTreeMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/jobs?limit=100&cursor={c}"),
            None => "/v1/jobs?limit=100".to_owned(),
        };
        let page = client.get(&path).await;
        for job in page["jobs"].as_array().unwrap() {
            out.insert(
                job["job_id"].as_str().unwrap().to_owned(),
                (
                    job["state"].as_str().unwrap().to_owned(),
                    job["attempts"].as_u64().unwrap(),
                ),
            );
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return out,
        }
    }
}

fn assert_unavailable(what: &str, answer: &Answer) {
    assert_eq!(answer.status, 503, "{what}: {}", answer.body);
    assert!(
        answer.retry_after.is_some(),
        "{what}: 503 without Retry-After: {}",
        answer.body
    );
    assert_eq!(
        answer.body["error"]["code"], "unavailable",
        "{what}: {}",
        answer.body
    );
}

// 1. PostgreSQL stopped and started again.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_answers_unavailable_then_recovers() {
    let began = Instant::now();
    let pg = blocking(PrivatePostgres::start);
    let fleet = Fleet::new(
        "faults-pg",
        &pg.url(),
        &shared_amqp_url(),
        "lease_s = 1\nconcurrency = 4",
        |dir| side_effect_tool("quick", dir, "0") + &side_effect_tool("slow", dir, "2"),
    );
    let _cleanup = SharedCleanup {
        database: None,
        broker: Some((shared_amqp_url(), fleet.prefix.clone())),
    };
    let dispatcher = fleet.dispatcher();
    let _worker = fleet.worker();
    let alice = dispatcher.client(TOKEN);

    let before = alice.call("quick", json!({})).await;
    let before = before["job_id"].as_str().expect("a job id").to_owned();
    assert_eq!(settle(&alice, &before).await["status"], "ok");
    assert_eq!(
        request(&alice, reqwest::Method::GET, "/readyz", None)
            .await
            .status,
        200
    );

    // A job that is running when the store goes away.
    let slow = alice.call("slow", json!({})).await;
    let slow = slow["job_id"].as_str().expect("a job id").to_owned();
    let slow_runs = fleet.file("slow.runs");
    eventually(Duration::from_secs(20), || {
        let runs = slow_runs.clone();
        async move { (!lines(&runs).is_empty()).then_some(()) }
    })
    .await;

    let stopped = Instant::now();
    blocking(|| pg.stop());
    eprintln!("PostgreSQL stopped ({:?} into the test)", began.elapsed());

    let call = call_raw(&alice, "quick", json!({})).await;
    assert_unavailable("a job call while PostgreSQL is down", &call);
    let read = request(
        &alice,
        reqwest::Method::GET,
        &format!("/v1/jobs/{before}"),
        None,
    )
    .await;
    assert_unavailable("get_job while PostgreSQL is down", &read);
    let polled = request(
        &alice,
        reqwest::Method::GET,
        &format!("/v1/jobs/{slow}?wait_s=3"),
        None,
    )
    .await;
    assert_unavailable("a long-polled get_job while PostgreSQL is down", &polled);
    let listed = request(&alice, reqwest::Method::GET, "/v1/jobs", None).await;
    assert_unavailable("list_jobs while PostgreSQL is down", &listed);
    // Readiness is answered from a check at most a second old.
    let ready = eventually(Duration::from_secs(10), || async {
        let ready = request(&alice, reqwest::Method::GET, "/readyz", None).await;
        (ready.status == 503).then_some(ready)
    })
    .await;
    assert!(ready.retry_after.is_some());
    assert_eq!(ready.body["store"], "down", "{}", ready.body);
    // A query tool that needs no store still answers.
    let query = call_raw(&alice, "find_expenses", json!({"month": "2026-09"})).await;
    assert_eq!(query.status, 200, "{}", query.body);
    assert_eq!(query.body["status"], "ok", "{}", query.body);
    let slowest = [&call, &read, &polled, &listed, &ready]
        .iter()
        .map(|a| a.took)
        .max()
        .unwrap();
    eprintln!("outage answers: slowest took {slowest:?}");
    assert!(
        slowest < Duration::from_secs(12),
        "an answer during the outage took {slowest:?}"
    );
    // The outage outlasts the running job, so its settle fails too.
    let outage = Duration::from_secs(3);
    tokio::time::sleep(outage.saturating_sub(stopped.elapsed())).await;

    blocking(|| pg.start_again());
    let restarted = Instant::now();
    eprintln!(
        "PostgreSQL started again after {:?} down",
        stopped.elapsed()
    );
    eventually(Duration::from_secs(30), || {
        let alice = alice.clone();
        async move {
            let ready = request(&alice, reqwest::Method::GET, "/readyz", None).await;
            (ready.status == 200).then_some(())
        }
    })
    .await;
    eprintln!("ready again {:?} after the restart", restarted.elapsed());

    // The same processes: a new call succeeds and its job settles, and the
    // job interrupted by the outage settles too, its effect applied once.
    let after = eventually(Duration::from_secs(30), || {
        let alice = alice.clone();
        async move {
            let answer = call_raw(&alice, "quick", json!({})).await;
            (answer.status == 200).then_some(answer.body)
        }
    })
    .await;
    assert_eq!(after["status"], "running", "{after}");
    let after = after["job_id"].as_str().unwrap().to_owned();
    assert_eq!(settle(&alice, &after).await["status"], "ok");
    let done = settle(&alice, &slow).await;
    assert_eq!(done["status"], "ok", "{done}");
    assert_eq!(lines(&fleet.file("slow.effects")), vec![slow.clone()]);
    let quick = lines(&fleet.file("quick.effects"));
    assert_eq!(
        quick.iter().collect::<BTreeSet<_>>(),
        [&before, &after].into_iter().collect()
    );
    assert_eq!(quick.len(), 2, "each effect once: {quick:?}");
    eprintln!(
        "the interrupted job ran {} times; recovered {:?} after the restart; test took {:?}",
        lines(&fleet.file("slow.runs")).len(),
        restarted.elapsed(),
        began.elapsed()
    );
}

// 2. RabbitMQ stopped and started again under 1,000 jobs.

/// Waits on a blocking server operation without stalling the runtime.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rabbitmq_restart_under_a_thousand_jobs_loses_none() {
    const JOBS: usize = 1000;
    let began = Instant::now();
    let mut rabbit = blocking(PrivateRabbit::start);
    eprintln!("private RabbitMQ up after {:?}", began.elapsed());
    let fleet = Fleet::new(
        "faults-rabbit",
        &shared_database_url(),
        &rabbit.url(),
        "lease_s = 10\nconcurrency = 16",
        |dir| side_effect_tool("noop", dir, "0"),
    );
    let _cleanup = SharedCleanup {
        database: Some((shared_database_url(), fleet.schema.clone())),
        broker: None,
    };
    let dispatcher = fleet.dispatcher();
    let _w1 = fleet.worker();
    let _w2 = fleet.worker();
    let alice = dispatcher.client(TOKEN);
    let effects = fleet.file("noop.effects");

    // Calls go on in the background, 16 at a time, through the restart.
    let submitted = Instant::now();
    let calls = tokio::spawn({
        let alice = alice.clone();
        async move {
            use futures_util::StreamExt;
            futures_util::stream::iter(0..JOBS)
                .map(|_| {
                    let alice = alice.clone();
                    async move { call_raw(&alice, "noop", json!({})).await }
                })
                .buffer_unordered(16)
                .collect::<Vec<Answer>>()
                .await
        }
    });
    eventually(Duration::from_secs(60), || {
        let effects = effects.clone();
        async move { (lines(&effects).len() >= 150).then_some(()) }
    })
    .await;
    let done_at_stop = lines(&effects).len();
    let stopped = Instant::now();
    blocking(|| rabbit.stop());
    eprintln!(
        "RabbitMQ stopped {:?} into the calls, with {done_at_stop} of {JOBS} effects applied (stop took {:?})",
        submitted.elapsed(),
        stopped.elapsed()
    );
    // Calls made while it is down still answer.
    let mut during = Vec::new();
    for _ in 0..10 {
        during.push(call_raw(&alice, "noop", json!({})).await);
    }
    blocking(|| rabbit.start_again());
    eprintln!("RabbitMQ back after {:?} down", stopped.elapsed());
    let restarted = Instant::now();

    let mut answers = calls.await.expect("the calls ran");
    answers.extend(during);
    let mut accepted = BTreeSet::new();
    let mut refused = 0;
    for answer in &answers {
        match (answer.status, answer.body["status"].as_str()) {
            (200, Some("running")) => {
                accepted.insert(answer.body["job_id"].as_str().unwrap().to_owned());
            }
            (503, _) => {
                assert_eq!(
                    answer.body["error"]["code"], "unavailable",
                    "{}",
                    answer.body
                );
                refused += 1;
            }
            _ => panic!("a call answered {}: {}", answer.status, answer.body),
        }
    }
    eprintln!(
        "{} calls accepted, {refused} answered unavailable; calls took up to {:?}",
        accepted.len(),
        answers.iter().map(|a| a.took).max().unwrap()
    );
    assert!(
        accepted.len() >= JOBS,
        "the calls before the outage were accepted"
    );
    assert!(
        done_at_stop < accepted.len(),
        "every job was done before the restart; nothing was in flight"
    );

    // Every accepted job settles, each effect applied exactly once.
    let settled = eventually(Duration::from_secs(90), || {
        let effects = effects.clone();
        let want = accepted.len();
        async move {
            let done = lines(&effects);
            (done.len() >= want).then_some(done)
        }
    })
    .await;
    eprintln!(
        "all {} effects applied {:?} after RabbitMQ came back ({:?} after the first call)",
        settled.len(),
        restarted.elapsed(),
        submitted.elapsed()
    );
    let unique: BTreeSet<String> = settled.iter().cloned().collect();
    assert_eq!(unique.len(), settled.len(), "an effect was applied twice");
    assert_eq!(
        unique, accepted,
        "the effects are those of the accepted jobs"
    );
    // An effect is written just before its job settles: wait for the store.
    let jobs = eventually(Duration::from_secs(60), || {
        let alice = alice.clone();
        async move {
            let jobs = all_jobs(&alice).await;
            let settled = jobs.values().all(|(state, _)| state == "succeeded");
            settled.then_some(jobs)
        }
    })
    .await;
    assert_eq!(jobs.keys().cloned().collect::<BTreeSet<_>>(), accepted);
    let retried = jobs.values().filter(|(_, attempts)| *attempts > 1).count();
    let runs = lines(&fleet.file("noop.runs")).len();
    eprintln!(
        "{retried} jobs took more than one attempt; {runs} runs for {} jobs; test took {:?}",
        jobs.len(),
        began.elapsed()
    );
}

// 3. A job that always fails; a message that is no job id.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_jobs_fail_after_their_attempts_and_garbage_is_dead_lettered() {
    let began = Instant::now();
    let rabbit = blocking(PrivateRabbit::start);
    let fleet = Fleet::new(
        "faults-dead",
        &shared_database_url(),
        &rabbit.url(),
        "lease_s = 5\nconcurrency = 4",
        |dir| {
            // 75 (EX_TEMPFAIL) is a retryable failure; any other status fails at once.
            let doomed = format!(
                "echo run >> {}; echo 'disk on fire: quota exceeded' >&2; exit 75",
                dir.join("doomed.runs").display()
            );
            sh_tool("doomed", &doomed, "max_attempts = 3")
                + &sh_tool(
                    "broken",
                    "echo 'no such ledger' >&2; exit 1",
                    "max_attempts = 3",
                )
                + &side_effect_tool("quick", dir, "0")
        },
    );
    let _cleanup = SharedCleanup {
        database: Some((shared_database_url(), fleet.schema.clone())),
        broker: None,
    };
    let dispatcher = fleet.dispatcher();
    let _worker = fleet.worker();
    let alice = dispatcher.client(TOKEN);

    // Garbage straight onto the pool queue, ahead of real work.
    let options = RabbitOptions {
        prefix: fleet.prefix.clone(),
        ..Default::default()
    };
    let broker = RabbitBroker::connect(&rabbit.url(), options)
        .await
        .expect("the private RabbitMQ answers");
    broker
        .publish("default", "not-a-job-id")
        .await
        .expect("published");

    let doomed = alice.call("doomed", json!({})).await;
    let doomed = doomed["job_id"].as_str().expect("a job id").to_owned();
    let broken = alice.call("broken", json!({})).await;
    let broken = broken["job_id"].as_str().expect("a job id").to_owned();
    let quick = alice.call("quick", json!({})).await;
    let quick = quick["job_id"].as_str().expect("a job id").to_owned();

    // The garbage did not hold the queue up.
    assert_eq!(settle(&alice, &quick).await["status"], "ok");
    assert_eq!(lines(&fleet.file("quick.effects")), vec![quick.clone()]);

    // Retried with backoff, then failed with the last error kept.
    let failed = settle(&alice, &doomed).await;
    assert_eq!(failed["status"], "error", "{failed}");
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], "tool_failed", "{failed}");
    let message = failed["error"]["message"].as_str().unwrap();
    assert!(message.contains("disk on fire: quota exceeded"), "{failed}");
    assert!(message.contains("status 75"), "{failed}");
    assert_eq!(lines(&fleet.file("doomed.runs")).len(), 3, "three attempts");
    // The same through the get_job tool a model calls.
    let read = alice.call("get_job", json!({"job_id": doomed})).await;
    assert_eq!(read["status"], "ok", "{read}");
    assert_eq!(read["result"]["status"], "error", "{read}");
    assert_eq!(read["result"]["error"]["code"], "tool_failed", "{read}");
    assert!(
        read["result"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("disk on fire"),
        "{read}"
    );
    // A failure that is not retryable fails at its first attempt.
    let broken_read = settle(&alice, &broken).await;
    assert_eq!(broken_read["state"], "failed", "{broken_read}");
    assert!(
        broken_read["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no such ledger"),
        "{broken_read}"
    );
    let jobs = all_jobs(&alice).await;
    assert_eq!(jobs[&doomed], ("failed".to_owned(), 3));
    assert_eq!(jobs[&broken], ("failed".to_owned(), 1));
    assert_eq!(jobs[&quick], ("succeeded".to_owned(), 1));

    // The garbage was dead-lettered, and a dispatcher took the letter (it
    // names no job, so nothing in the store changes): neither the pool nor
    // the dead-letter queue holds it.
    let dead = format!("{}.dead.default", fleet.prefix);
    eventually(Duration::from_secs(10), || {
        let (url, dead) = (rabbit.url(), dead.clone());
        async move { (common::ready_in(&url, &dead).await == Some(0)).then_some(()) }
    })
    .await;
    eventually(Duration::from_secs(10), || {
        let broker = broker.clone();
        async move { (broker.depth("default").await.ok()? == 0).then_some(()) }
    })
    .await;
    broker.close();
    eprintln!("test took {:?}", began.elapsed());
}

// 4. A worker stopped with SIGTERM.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_sent_sigterm_finishes_its_job_and_leaves_the_queue() {
    let began = Instant::now();
    let fleet = Fleet::new(
        "faults-sigterm",
        &shared_database_url(),
        &shared_amqp_url(),
        "lease_s = 5\nconcurrency = 1",
        |dir| side_effect_tool("slow", dir, "2"),
    );
    let _cleanup = SharedCleanup {
        database: Some((shared_database_url(), fleet.schema.clone())),
        broker: Some((shared_amqp_url(), fleet.prefix.clone())),
    };
    let dispatcher = fleet.dispatcher();
    let mut first = fleet.worker();
    let alice = dispatcher.client(TOKEN);
    let runs = fleet.file("slow.runs");
    let effects = fleet.file("slow.effects");

    let running = alice.call("slow", json!({})).await;
    let running = running["job_id"].as_str().expect("a job id").to_owned();
    eventually(Duration::from_secs(20), || {
        let runs = runs.clone();
        async move { (!lines(&runs).is_empty()).then_some(()) }
    })
    .await;
    // Behind it: the worker runs one job at a time (and claims the others
    // ahead, waiting for its one slot).
    let mut queued = BTreeSet::new();
    for _ in 0..3 {
        let accepted = alice.call("slow", json!({})).await;
        queued.insert(accepted["job_id"].as_str().expect("a job id").to_owned());
    }
    assert_eq!(lines(&runs), vec![running.clone()], "one job runs");

    let signalled = Instant::now();
    private::signal(first.child.id(), "TERM");
    let status = eventually(Duration::from_secs(25), || {
        let exited = first.child.try_wait().expect("the worker's status");
        async move { exited }
    })
    .await;
    let stopped_in = signalled.elapsed();
    eprintln!("the worker exited {status} {stopped_in:?} after SIGTERM");
    assert!(status.success(), "the worker exited {status}");
    assert!(
        stopped_in < Duration::from_secs(20),
        "the worker stopped within its grace period"
    );
    // It finished the running job and started no other.
    assert_eq!(lines(&effects), vec![running.clone()]);
    assert_eq!(lines(&runs), vec![running.clone()]);
    let done = alice.get(&format!("/v1/jobs/{running}")).await;
    assert_eq!(done["status"], "ok", "{done}");
    // Those it held ahead it gave back unstarted (`retrying`, due at once,
    // no attempt counted); any it never took are still `queued`.
    for id in &queued {
        let waiting = alice.get(&format!("/v1/jobs/{id}")).await;
        assert_eq!(waiting["status"], "running", "{waiting}");
        let state = waiting["state"].as_str().unwrap_or_default();
        assert!(["queued", "retrying"].contains(&state), "{waiting}");
        assert_eq!(waiting["attempts"], 0, "{waiting}");
    }

    // Another worker runs the queued jobs, each once.
    let _second = fleet.worker();
    for id in &queued {
        let done = settle(&alice, id).await;
        assert_eq!(done["status"], "ok", "{done}");
    }
    let applied = lines(&effects);
    assert_eq!(applied.len(), 4, "each effect once: {applied:?}");
    let mut all = queued.clone();
    all.insert(running.clone());
    assert_eq!(applied.into_iter().collect::<BTreeSet<_>>(), all);
    assert_eq!(lines(&runs).len(), 4, "no job ran twice");
    eprintln!("test took {:?}", began.elapsed());
}
