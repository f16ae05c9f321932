//! Distributed mode with real processes and the real servers of this
//! machine: `toolfleet migrate`, two dispatchers and two workers on one
//! PostgreSQL schema and one RabbitMQ prefix of this test's own. A call made
//! through one dispatcher is long-polled and announced through the other; a
//! worker killed with SIGKILL mid-job loses nothing, and each side effect of
//! the idempotent executor happens once. With `notices = "postgres"` the
//! same long poll and announcement cross processes over PostgreSQL
//! `LISTEN`/`NOTIFY` instead of RabbitMQ's events exchange.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{
    OTHER_TOKEN, Server, SharedCleanup, TOKEN, TempDir, events, events_at, eventually,
    hook_receiver, migrate, psql_value, settle, shared_amqp_url, shared_database_url, shared_fleet,
};
use serde_json::json;

fn tools(dir: &Path) -> String {
    let effects = dir.join("effects");
    let runs = dir.join("runs");
    let script = format!(
        "k=\"$TOOLFLEET_IDEMPOTENCY_KEY\"; echo \"$k\" >> {runs}; sleep 0.3; grep -qx \"$k\" {effects} 2>/dev/null || echo \"$k\" >> {effects}; echo '{{\"done\": true}}'",
        runs = runs.display(),
        effects = effects.display()
    );
    let slow = "sleep 2; echo '{\"slow\": true}'";
    let finished = dir.join("finished");
    let long = format!("sleep 4; touch {}; echo '{{}}'", finished.display());
    format!(
        "[[tools]]\nname = \"side_effect\"\nshape = \"job\"\nexecutor = {{ kind = \"exec\", program = \"/bin/sh\", args = [\"-c\", {script:?}] }}\n\n[[tools]]\nname = \"slow_job\"\nshape = \"job\"\nexecutor = {{ kind = \"exec\", program = \"/bin/sh\", args = [\"-c\", {slow:?}] }}\n\n[[tools]]\nname = \"long_job\"\nshape = \"job\"\nexecutor = {{ kind = \"exec\", program = \"/bin/sh\", args = [\"-c\", {long:?}] }}\n"
    )
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A fleet of this test's own: its directory, its configuration, its cleanup.
fn fleet(name: &str) -> (TempDir, std::path::PathBuf, SharedCleanup) {
    fleet_with(name, "")
}

/// As [`fleet`], with more top-level keys `top`.
fn fleet_with(name: &str, top: &str) -> (TempDir, std::path::PathBuf, SharedCleanup) {
    let (dir, config, cleanup, _) = shared_fleet(name, top, tools);
    (dir, config, cleanup)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_dead_between_write_and_publish_loses_nothing() {
    let (dir, config_path, _cleanup) = fleet("outbox");
    migrate(&config_path);
    let faulty = Server::start_role_env(
        &config_path,
        "dispatcher",
        "toolfleet serving on ",
        &[("TOOLFLEET_FAULT", "abort_after_job_write")],
    );
    let healthy = Server::start_role(&config_path, "dispatcher", "toolfleet serving on ");
    let _worker = Server::start_role(&config_path, "worker", "toolfleet worker running");
    // The faulty dispatcher writes the row, then dies before publishing.
    let answered = faulty
        .client(TOKEN)
        .http
        .post(format!("{}/v1/calls", faulty.base))
        .bearer_auth(TOKEN)
        .body(json!({"tool": "side_effect", "args": {}}).to_string())
        .send()
        .await;
    assert!(
        answered.is_err(),
        "the faulty dispatcher died before answering"
    );
    // The other dispatcher's sweeper publishes the orphaned row; it settles.
    let alice = healthy.client(TOKEN);
    let job = eventually(Duration::from_secs(15), || {
        let alice = alice.clone();
        async move {
            alice.get("/v1/jobs").await["jobs"][0]["job_id"]
                .as_str()
                .map(str::to_owned)
        }
    })
    .await;
    let done = settle(&alice, &job).await;
    assert_eq!(done["result"]["done"], true, "{done}");
    assert_eq!(lines(&dir.0.join("effects")), vec![job]);
}

/// A call answers `running` once its row is committed and publishes after:
/// a dispatcher killed in between loses no job, and another process starts
/// it within 2 s (its outbox beat, not the periodic sweep: the lease here
/// puts that sweep 10 s apart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_dead_between_answer_and_publish_loses_nothing() {
    let (dir, config_path, _cleanup, id) = shared_fleet("answered", "lease_s = 30", tools);
    migrate(&config_path);
    let mut faulty = Server::start_role_env(
        &config_path,
        "dispatcher",
        "toolfleet serving on ",
        &[("TOOLFLEET_FAULT", "abort_after_answer")],
    );
    let healthy = Server::start_role(&config_path, "dispatcher", "toolfleet serving on ");
    let _worker = Server::start_role(&config_path, "worker", "toolfleet worker running");
    let accepted = faulty.client(TOKEN).call("side_effect", json!({})).await;
    assert_eq!(accepted["status"], "running", "{accepted}");
    let job = accepted["job_id"].as_str().expect("a job id").to_owned();
    // It dies before publishing, and nothing was published.
    let died = faulty.child.wait().expect("the faulty dispatcher exits");
    assert!(!died.success(), "{died:?}");
    let schema = format!("tf_{id}");
    let created: i64 = psql_value(
        &shared_database_url(),
        &format!("SELECT created_at FROM {schema}.jobs WHERE id = '{job}'"),
    )
    .parse()
    .expect("the job's row");
    let done = settle(&healthy.client(TOKEN), &job).await;
    assert_eq!(done["result"]["done"], true, "{done}");
    assert_eq!(lines(&dir.0.join("effects")), vec![job.clone()]);
    // The job's script wrote `runs` once, when it started.
    let started = std::fs::metadata(dir.0.join("runs"))
        .and_then(|m| m.modified())
        .expect("the job ran")
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64;
    assert!(
        started - created < 2_000,
        "started {} ms after it was accepted",
        started - created
    );
}

/// The messages ready in the `default` pool's queue, as the dispatcher's
/// `/metrics` shows them.
async fn ready_in_default(client: &common::Client) -> Option<u64> {
    let (_, body) = client.raw(reqwest::Method::GET, "/metrics", None).await;
    body["raw"].as_str()?.lines().find_map(|line| {
        line.strip_prefix("toolfleet_queue_depth{pool=\"default\"} ")?
            .parse()
            .ok()
    })
}

/// A worker holds jobs beyond its slots (`prefetch_ahead`, by default four
/// per slot of its `concurrency`), so that the next job is at hand when a
/// slot frees; with `prefetch_ahead = 0` it holds only the job it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_holds_messages_ahead_of_its_slots() {
    for (ahead, left) in [
        ("", 1),
        ("prefetch_ahead = 2\n", 3),
        ("prefetch_ahead = 0\n", 5),
    ] {
        // Leases of 30 s: the sweep, 10 s apart, republishes nothing meanwhile.
        let top = format!("concurrency = 1\nlease_s = 30\njobs_per_message = 1\n{ahead}");
        let (_dir, config_path, _cleanup) = fleet_with("ahead", &top);
        migrate(&config_path);
        let dispatcher = Server::start_role(&config_path, "dispatcher", "toolfleet serving on ");
        let alice = dispatcher.client(TOKEN);
        for _ in 0..6 {
            let accepted = alice.call("long_job", json!({})).await;
            assert_eq!(accepted["status"], "running", "{accepted}");
        }
        let _worker = Server::start_role(&config_path, "worker", "toolfleet worker running");
        // Each job runs 4 s: while the first runs, the queue keeps what the
        // worker did not take.
        let alice = &alice;
        eventually(Duration::from_secs(10), || async move {
            (ready_in_default(alice).await == Some(left)).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(ready_in_default(alice).await, Some(left), "{ahead:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dispatchers_and_two_workers_share_one_fleet() {
    let (dir, config_path, _cleanup) = fleet("distributed");

    // Before migrating, a dispatcher refuses the unknown schema, clearly.
    let refused = Command::new(env!("CARGO_BIN_EXE_toolfleet"))
        .arg("--config")
        .arg(&config_path)
        .arg("dispatcher")
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("toolfleet migrate"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    migrate(&config_path);

    let a = Server::start_role(&config_path, "dispatcher", "toolfleet serving on ");
    let b = Server::start_role(&config_path, "dispatcher", "toolfleet serving on ");
    let mut w1 = Server::start_role(&config_path, "worker", "toolfleet worker running");
    let _w2 = Server::start_role(&config_path, "worker", "toolfleet worker running");
    let (alice_a, alice_b) = (a.client(TOKEN), b.client(TOKEN));
    // Both tenants listen on B, where none of these jobs is called.
    let mallory = b.client(OTHER_TOKEN);
    let (alice_heard, mallory_heard) = (events(&alice_b), events(&mallory));
    // A stream of outcomes alone, on B's binding of outcomes alone.
    let alice_outcomes = events_at(&alice_b, "/v1/events?state=succeeded,failed");
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Called through A, settled on a worker, long-polled through B.
    let mut ids = BTreeSet::new();
    for _ in 0..8 {
        let accepted = alice_a.call("side_effect", json!({})).await;
        assert_eq!(accepted["status"], "running", "{accepted}");
        ids.insert(accepted["job_id"].as_str().unwrap().to_owned());
    }
    for id in &ids {
        let done = settle(&alice_b, id).await;
        assert_eq!(done["result"]["done"], true, "{done}");
    }
    let first_eight = ids.clone();

    // A worker killed mid-job: every job still settles, each effect once.
    let mut second = BTreeSet::new();
    for _ in 0..12 {
        let accepted = alice_b.call("side_effect", json!({})).await;
        second.insert(accepted["job_id"].as_str().unwrap().to_owned());
    }
    eventually(Duration::from_secs(20), || {
        let runs = dir.0.join("runs");
        async move { (lines(&runs).len() > 9).then_some(()) }
    })
    .await;
    w1.kill();
    for id in &second {
        let done = settle(&alice_a, id).await;
        assert_eq!(done["status"], "ok", "{done}");
    }
    ids.extend(second);
    let effects = lines(&dir.0.join("effects"));
    assert_eq!(effects.len(), ids.len(), "each side effect happened once");
    assert_eq!(effects.into_iter().collect::<BTreeSet<_>>(), ids);

    // Events of jobs called on A and run on workers reach B's listeners,
    // and only the owning tenant's.
    let heard =
        |seen: &std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>| -> BTreeSet<String> {
            seen.lock()
                .unwrap()
                .iter()
                .filter(|e| e["state"] == "succeeded")
                .filter_map(|e| e["id"].as_str().map(str::to_owned))
                .collect()
        };
    let first = ids.iter().next().unwrap().clone();
    eventually(Duration::from_secs(10), || {
        let heard = heard(&alice_heard);
        let first = first.clone();
        async move { heard.contains(&first).then_some(()) }
    })
    .await;
    // The stream of every state heard the jobs queued on A; the stream of
    // outcomes heard the outcomes and nothing else. (Only the first eight
    // surely: a worker killed between a settle and its announcement takes
    // the event with it, while the store holds the outcome.)
    assert!(
        alice_heard
            .lock()
            .unwrap()
            .iter()
            .any(|e| e["state"] == "queued" && ids.contains(e["id"].as_str().unwrap_or(""))),
        "B's stream of every state heard no job queued on A"
    );
    eventually(Duration::from_secs(10), || {
        let heard = heard(&alice_outcomes);
        let first_eight = first_eight.clone();
        async move {
            first_eight
                .iter()
                .all(|id| heard.contains(id))
                .then_some(())
        }
    })
    .await;
    assert!(
        alice_outcomes
            .lock()
            .unwrap()
            .iter()
            .all(|e| e["state"] == "succeeded"),
        "the stream of outcomes heard: {:?}",
        alice_outcomes.lock().unwrap()
    );
    assert!(
        mallory_heard
            .lock()
            .unwrap()
            .iter()
            .all(|e| !ids.contains(e["id"].as_str().unwrap_or("")))
    );

    // The other tenant can neither read, list nor cancel any of it.
    assert_eq!(
        mallory.get(&format!("/v1/jobs/{first}")).await["error"]["code"],
        "not_found"
    );
    assert_eq!(
        mallory
            .post(&format!("/v1/jobs/{first}/cancel"), json!({}))
            .await["error"]["code"],
        "not_found"
    );
    assert!(
        mallory.get("/v1/jobs").await["jobs"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        alice_a.get("/v1/jobs?limit=100").await["jobs"]
            .as_array()
            .unwrap()
            .len(),
        20
    );
    assert_eq!(
        alice_b.get(&format!("/v1/jobs/{first}")).await["status"],
        "ok"
    );
}

/// With `notices = "postgres"`: a job called through dispatcher A and run on
/// the worker is long-polled through dispatcher B, whose poll answers the
/// settled result as soon as it settles (not at the end of its wait), and
/// B's SSE stream hears it. Every process LISTENs on the fleet's channel;
/// RabbitMQ's events exchange still carries the events for outside queues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_over_postgres_reach_another_dispatcher() {
    let (_dir, config_path, cleanup) = fleet_with("pg-notices", "notices = \"postgres\"");
    let (schema, prefix) = match (&cleanup.database, &cleanup.broker) {
        (Some((_, schema)), Some((_, prefix))) => (schema.clone(), prefix.clone()),
        _ => panic!("the fleet has a schema and a prefix"),
    };
    migrate(&config_path);
    let a = Server::start_role(&config_path, "dispatcher", "toolfleet serving on ");
    let b = Server::start_role(&config_path, "dispatcher", "toolfleet serving on ");
    let _worker = Server::start_role(&config_path, "worker", "toolfleet worker running");

    let listening = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN \"{}\"%'",
        toolfleet_broker::postgres::channel_for(&schema)
    );
    eventually(Duration::from_secs(10), || {
        let count = psql_value(&shared_database_url(), &listening);
        async move { (count == "3").then_some(()) }
    })
    .await;

    let (alice_a, alice_b) = (a.client(TOKEN), b.client(TOKEN));
    let heard = events(&alice_b);
    // An orchestrator's own queue on the events exchange.
    let connection =
        lapin::Connection::connect(&shared_amqp_url(), lapin::ConnectionProperties::default())
            .await
            .expect("RabbitMQ answers");
    let channel = connection.create_channel().await.expect("a channel");
    let exchange = format!("{prefix}.events");
    let durable = lapin::options::ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .exchange_declare(
            exchange.as_str().into(),
            lapin::ExchangeKind::Topic,
            durable,
            lapin::types::FieldTable::default(),
        )
        .await
        .expect("the events exchange");
    let exclusive = lapin::options::QueueDeclareOptions {
        exclusive: true,
        auto_delete: true,
        ..Default::default()
    };
    let queue = channel
        .queue_declare("".into(), exclusive, lapin::types::FieldTable::default())
        .await
        .expect("a queue")
        .name()
        .to_string();
    channel
        .queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            "acme.slow_job.*".into(),
            lapin::options::QueueBindOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .expect("bound");
    tokio::time::sleep(Duration::from_millis(300)).await;

    let accepted = alice_a.call("slow_job", json!({})).await;
    assert_eq!(accepted["status"], "running", "{accepted}");
    let id = accepted["job_id"].as_str().unwrap().to_owned();
    let asked = std::time::Instant::now();
    let done = alice_b.get(&format!("/v1/jobs/{id}?wait_s=25")).await;
    let waited = asked.elapsed();
    assert_eq!(done["status"], "ok", "{done}");
    assert_eq!(done["result"]["slow"], true, "{done}");
    // The job sleeps 2 s; without a notice B would answer after 25 s.
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_secs(10),
        "the long poll through B answered after {waited:?}"
    );

    eventually(Duration::from_secs(10), || {
        let heard = heard.lock().unwrap().clone();
        let id = id.clone();
        async move {
            heard
                .iter()
                .any(|e| e["id"] == id.as_str() && e["state"] == "succeeded")
                .then_some(())
        }
    })
    .await;

    // The fleet heard it over PostgreSQL, and RabbitMQ's events exchange
    // still carried it to whoever binds there.
    let outside = eventually(Duration::from_secs(10), || {
        let channel = channel.clone();
        let queue = queue.clone();
        async move {
            let got = channel
                .basic_get(
                    queue.as_str().into(),
                    lapin::options::BasicGetOptions { no_ack: true },
                )
                .await
                .ok()
                .flatten()?;
            Some(got.delivery.routing_key.to_string())
        }
    })
    .await;
    assert!(outside.starts_with("acme.slow_job."), "{outside}");
}

/// A cancel made through a dispatcher reaches the executor of the job
/// running on a worker in another process: the worker hears it over
/// RabbitMQ (a worker listens only for settled jobs' events, cancels among
/// them), kills the executor, and the job stays cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_the_executor_on_a_worker_of_another_process() {
    // Leases long enough that no heartbeat (every lease / 3) finds the
    // cancel in the store within the test: the notice alone must carry it.
    let (dir, config_path, _cleanup) = fleet_with("cancel-across", "lease_s = 60\n");
    migrate(&config_path);
    let dispatcher = Server::start_role(&config_path, "dispatcher", "toolfleet serving on ");
    let _worker = Server::start_role(&config_path, "worker", "toolfleet worker running");
    let client = dispatcher.client(TOKEN);
    let called = client.call("long_job", json!({})).await;
    let id = called["job_id"].as_str().expect("a job id").to_owned();
    eventually(Duration::from_secs(20), || {
        let client = &client;
        let id = &id;
        async move {
            let job = client.get(&format!("/v1/jobs/{id}")).await;
            (job["state"] == "running").then_some(())
        }
    })
    .await;
    let cancelled = client
        .post(&format!("/v1/jobs/{id}/cancel"), json!({}))
        .await;
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
    // The executor would finish 4 s after it started; killed, it never does.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        !dir.0.join("finished").exists(),
        "the cancelled job's executor ran to its end"
    );
    let job = client.get(&format!("/v1/jobs/{id}")).await;
    assert_eq!(job["state"], "cancelled", "{job}");
}

/// A webhook whose event every dispatcher missed is still sent, once: the
/// job settles while no dispatcher runs, and the next dispatcher to start
/// finds the notice nobody sent in the store and sends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_every_dispatcher_missed_is_sent_from_the_store() {
    // A lease a loaded machine's heartbeats keep, so the job settles on its
    // first attempt.
    let (_dir, config_path, _cleanup, id) = shared_fleet("missed-notice", "lease_s = 30\n", tools);
    migrate(&config_path);
    let (url, hooks) = hook_receiver(vec![200]).await;
    let mut first = Server::start_role(&config_path, "dispatcher", "toolfleet serving on ");
    let _worker = Server::start_role(&config_path, "worker", "toolfleet worker running");
    let called = first
        .client(TOKEN)
        .post(
            "/v1/calls",
            json!({"tool": "slow_job", "args": {}, "callback_url": url}),
        )
        .await;
    let job_id = called["job_id"].as_str().expect("a job id").to_owned();
    // No dispatcher hears the job settle.
    first.kill();
    let state = format!("SELECT state FROM tf_{id}.jobs WHERE id = '{job_id}'");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let now = psql_value(&shared_database_url(), &state);
        if now == "succeeded" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the job did not settle without a dispatcher: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(hooks.lock().unwrap().is_empty(), "nobody was listening");
    let _second = Server::start_role(&config_path, "dispatcher", "toolfleet serving on ");
    // Searched every 10 s, for jobs settled over 10 s ago.
    let got = eventually(Duration::from_secs(40), || {
        let hooks = hooks.clone();
        async move {
            let hooks = hooks.lock().unwrap();
            (!hooks.is_empty()).then(|| hooks.clone())
        }
    })
    .await;
    let notice: serde_json::Value = serde_json::from_str(&got[0].body).expect("a JSON notice");
    assert_eq!(notice["event"], "job.succeeded", "{notice}");
    assert_eq!(notice["job_id"], job_id.as_str(), "{notice}");
    assert_eq!(notice["result"], json!({"slow": true}), "{notice}");
    // The next search finds it sent.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(hooks.lock().unwrap().len(), 1, "sent once");
}

/// The messages in RabbitMQ's queue `queue`, or `None` when no such queue
/// was ever declared.
async fn messages_in(queue: &str) -> Option<u32> {
    common::ready_in(&shared_amqp_url(), queue).await
}

/// A call with `delay_s` is `scheduled` across the fleet: `get_job` and the
/// list say so and when, it starts at its time (its delayed message, not
/// the sweep, which the 30 s lease puts 10 s apart) and never before; one
/// due in two weeks holds no message in RabbitMQ and is cancelled before
/// its time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_call_starts_at_its_time_across_the_fleet() {
    let (dir, config_path, _cleanup, id) = shared_fleet("delayed", "lease_s = 30", tools);
    migrate(&config_path);
    let dispatcher = Server::start_role(&config_path, "dispatcher", "toolfleet serving on ");
    let _worker = Server::start_role(&config_path, "worker", "toolfleet worker running");
    let alice = dispatcher.client(TOKEN);
    let accepted = alice
        .post(
            "/v1/calls",
            json!({"tool": "side_effect", "args": {}, "delay_s": 2}),
        )
        .await;
    assert_eq!(accepted["status"], "running", "{accepted}");
    let job = accepted["job_id"].as_str().expect("a job id").to_owned();
    let read = alice.get(&format!("/v1/jobs/{job}")).await;
    assert_eq!(read["state"], "scheduled", "{read}");
    let shown = read["run_at"].as_str().expect("run_at shown").to_owned();
    let listed = alice.get("/v1/jobs?state=scheduled").await;
    assert_eq!(listed["jobs"][0]["job_id"], job.as_str(), "{listed}");
    let run_at: i64 = psql_value(
        &shared_database_url(),
        &format!("SELECT run_at FROM tf_{id}.jobs WHERE id = '{job}'"),
    )
    .parse()
    .expect("the job's row");
    assert_eq!(shown, toolfleet_core::iso8601(run_at));

    let done = settle(&alice, &job).await;
    assert_eq!(done["result"]["done"], true, "{done}");
    let started = std::fs::metadata(dir.0.join("runs"))
        .and_then(|m| m.modified())
        .expect("the job ran")
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64;
    assert!(started >= run_at, "started {} ms early", run_at - started);
    assert!(
        started - run_at < 5_000,
        "started {} ms after its time",
        started - run_at
    );

    let weeks = alice
        .post(
            "/v1/calls",
            json!({"tool": "side_effect", "args": {}, "delay_s": 14 * 24 * 3600}),
        )
        .await;
    let later = weeks["job_id"].as_str().expect("a job id").to_owned();
    assert_eq!(
        alice.get(&format!("/v1/jobs/{later}")).await["state"],
        "scheduled"
    );
    let prefix = format!("tf-{id}");
    let bucket = toolfleet_broker::rabbit::delay_bucket(Duration::from_secs(14 * 24 * 3600));
    let delay_queue = toolfleet_broker::rabbit::delay_queue_name(
        &prefix,
        "default",
        u64::try_from(bucket.as_millis()).expect("a bucket in ms"),
    );
    assert_eq!(messages_in(&delay_queue).await, None, "no delayed message");
    let pool_queue = toolfleet_broker::rabbit::pool_queue_name(&prefix, "default");
    assert_eq!(messages_in(&pool_queue).await, Some(0), "no ready message");
    let cancelled = alice
        .post(&format!("/v1/jobs/{later}/cancel"), json!({}))
        .await;
    assert_eq!(cancelled["error"]["code"], "cancelled", "{cancelled}");
    assert_eq!(lines(&dir.0.join("effects")), vec![job]);
}

/// A rate limit holds across the fleet: two dispatchers together let
/// through the declared rate (20 calls a second, a burst of 20), not twice
/// it, within 10 %; each refusal says when to call again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_holds_across_two_dispatchers() {
    let limited = |_: &Path| {
        "[[tools]]\nname = \"limited\"\nshape = \"query\"\nmiddleware = { rate_limit = { max = 20, per_s = 1 } }\nexecutor = { kind = \"exec\", program = \"/bin/sh\", args = [\"-c\", \"echo '{}'\"] }\n".to_owned()
    };
    let (_dir, config_path, _cleanup, _) = shared_fleet("limited", "", limited);
    migrate(&config_path);
    let one = Server::start_role(&config_path, "dispatcher", "toolfleet serving on ");
    let two = Server::start_role(&config_path, "dispatcher", "toolfleet serving on ");
    let clients = [one.client(TOKEN), two.client(TOKEN)];
    let started = std::time::Instant::now();
    let window = Duration::from_secs(4);
    let mut callers = tokio::task::JoinSet::new();
    for n in 0..8 {
        let client = clients[n % 2].clone();
        callers.spawn(async move {
            let (mut passed, mut refused) = (0u32, 0u32);
            while started.elapsed() < window {
                let answer = client.call("limited", json!({})).await;
                match answer["error"]["code"].as_str() {
                    None => passed += 1,
                    Some("rate_limited") => {
                        assert!(
                            answer["error"]["retry_after_s"].as_u64() >= Some(1),
                            "{answer}"
                        );
                        refused += 1;
                    }
                    Some(_) => panic!("{answer}"),
                }
            }
            (passed, refused)
        });
    }
    let (mut passed, mut refused) = (0, 0);
    while let Some(done) = callers.join_next().await {
        let (p, r) = done.expect("a caller");
        passed += p;
        refused += r;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let declared = 20.0 + 20.0 * elapsed;
    println!(
        "two dispatchers: {passed} calls passed and {refused} refused in {elapsed:.2} s; declared {declared:.0} (a burst of 20, then 20/s)"
    );
    assert!(refused > 0, "the callers asked for more than the limit");
    let passed = f64::from(passed);
    assert!(
        passed <= declared * 1.1 && passed >= declared * 0.9,
        "{passed} passed where the fleet allows {declared:.0}"
    );
}

/// A schedule ticking every second, run by two dispatchers for 30 s with
/// one of them killed (SIGKILL) midway and two workers running its jobs:
/// every tick from the first to the last made exactly one job, none was
/// lost to the kill, and each ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_makes_one_job_per_tick_across_dispatchers_one_killed_midway() {
    let ticking = |_: &Path| {
        "[[tools]]\nname = \"tick\"\nshape = \"job\"\nexecutor = { kind = \"exec\", program = \"/bin/sh\", args = [\"-c\", \"echo '{}'\"] }\n\n[[schedules]]\nname = \"pulse\"\ncron = \"* * * * * *\"\ntool = \"tick\"\noverlap = \"allow\"\nprincipal = { tenant = \"acme\", user = \"alice\" }\n".to_owned()
    };
    let (_dir, config_path, _cleanup, id) = shared_fleet("schedules", "", ticking);
    migrate(&config_path);
    let mut one = Server::start_role(&config_path, "dispatcher", "toolfleet serving on ");
    let two = Server::start_role(&config_path, "dispatcher", "toolfleet serving on ");
    let _workers = [
        Server::start_role(&config_path, "worker", "toolfleet worker running"),
        Server::start_role(&config_path, "worker", "toolfleet worker running"),
    ];
    tokio::time::sleep(Duration::from_secs(15)).await;
    one.kill();
    tokio::time::sleep(Duration::from_secs(15)).await;
    drop(two);
    let keys = psql_value(
        &shared_database_url(),
        &format!(
            "SELECT string_agg(idempotency_key || '=' || n, ',' ORDER BY idempotency_key) FROM (SELECT idempotency_key, count(*) AS n FROM tf_{id}.jobs WHERE tool = 'tick' GROUP BY idempotency_key) k"
        ),
    );
    let ticks: Vec<(i64, u32)> = keys
        .split(',')
        .map(|pair| {
            let (key, n) = pair.split_once('=').expect("key=count");
            let tick = key
                .strip_prefix("schedule:pulse:")
                .expect("a schedule's key");
            (tick.parse().expect("a tick"), n.parse().expect("a count"))
        })
        .collect();
    assert!(ticks.len() >= 25, "about 30 ticks in 30 s: {ticks:?}");
    assert!(
        ticks.iter().all(|(_, n)| *n == 1),
        "one job per tick: {ticks:?}"
    );
    let gaps: Vec<_> = ticks
        .windows(2)
        .filter(|w| w[1].0 - w[0].0 != 1_000)
        .collect();
    assert!(
        gaps.is_empty(),
        "no tick lost, before or after the kill: {gaps:?}"
    );
    let unsettled = psql_value(
        &shared_database_url(),
        &format!(
            "SELECT count(*) FROM tf_{id}.jobs WHERE tool = 'tick' AND state <> 'succeeded' AND created_at < (SELECT max(created_at) - 3000 FROM tf_{id}.jobs)"
        ),
    );
    assert_eq!(unsettled, "0", "every tick's job ran");
    println!(
        "{} ticks, one job each, from {} to {}",
        ticks.len(),
        ticks[0].0,
        ticks[ticks.len() - 1].0
    );
}

/// Priorities on RabbitMQ and PostgreSQL: a worker of one slot busy with a
/// job while seven wait starts them highest priority first, equal
/// priorities in the order they came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_busy_slot_the_fleet_starts_the_highest_priority_first() {
    let ranked = |dir: &Path| {
        let order = dir.join("order");
        let stamp = format!(
            "read -r args; echo \"$args\" | sed 's/.*\"name\": *\"\\([a-z0-9]*\\)\".*/\\1/' >> {}; echo '{{}}'",
            order.display()
        );
        format!(
            "[[tools]]\nname = \"stamp\"\nshape = \"job\"\npool = \"ranked\"\npriority = 0\nexecutor = {{ kind = \"exec\", program = \"/bin/sh\", args = [\"-c\", {stamp:?}] }}\n\n[[tools]]\nname = \"hold\"\nshape = \"job\"\npool = \"ranked\"\nexecutor = {{ kind = \"exec\", program = \"/bin/sh\", args = [\"-c\", \"sleep 3; echo '{{}}'\"] }}\n"
        )
    };
    let (dir, config_path, _cleanup, _) =
        shared_fleet("priorities", "concurrency = 1\nlease_s = 30", ranked);
    migrate(&config_path);
    let dispatcher = Server::start_role(&config_path, "dispatcher", "toolfleet serving on ");
    let alice = dispatcher.client(TOKEN);
    let _worker = Server::start_role(&config_path, "worker", "toolfleet worker running");
    let busy = alice.call("hold", json!({})).await;
    let busy = busy["job_id"].as_str().expect("a job").to_owned();
    eventually(Duration::from_secs(10), || {
        let (alice, busy) = (alice.clone(), busy.clone());
        async move {
            let job = alice.get(&format!("/v1/jobs/{busy}")).await;
            (job["state"] == "running").then_some(())
        }
    })
    .await;
    let mut ids = Vec::new();
    for (name, priority) in [
        ("low1", None),
        ("low2", Some(0)),
        ("high1", Some(7)),
        ("low3", None),
        ("lowest", Some(-5)),
        ("high2", Some(7)),
        ("mid", Some(3)),
    ] {
        let mut call = json!({"tool": "stamp", "args": {"name": name}});
        if let Some(priority) = priority {
            call["priority"] = json!(priority);
        }
        let accepted = alice.post("/v1/calls", call).await;
        assert_eq!(accepted["status"], "running", "{accepted}");
        ids.push(accepted["job_id"].as_str().unwrap().to_owned());
    }
    let listed = alice.get("/v1/jobs?tool=stamp").await;
    let shown: Vec<i64> = listed["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|j| j["priority"].as_i64())
        .collect();
    assert_eq!(shown, [3, 7, -5, 0, 7, 0, 0], "newest first: {listed}");
    for id in &ids {
        assert_eq!(settle(&alice, id).await["status"], "ok");
    }
    assert_eq!(
        lines(&dir.0.join("order")),
        ["high1", "high2", "mid", "low1", "low2", "low3", "lowest"]
    );
}

/// A concurrency limit of 2 per key holds across two workers of 8 slots
/// each: 200 jobs of 5 accounts, the running jobs of each account read
/// from the store all along, never above 2, and every job done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_limit_per_key_holds_across_two_workers() {
    let keyed = |_: &Path| {
        "[[tools]]\nname = \"sync\"\nshape = \"job\"\npool = \"sync\"\ninput_schema = { type = \"object\", properties = { account = { type = \"string\" } }, required = [\"account\"] }\nconcurrency = { limit = 2, key = \"/account\" }\nexecutor = { kind = \"exec\", program = \"/bin/sh\", args = [\"-c\", \"sleep 0.2; echo '{}'\"] }\n".to_owned()
    };
    let (_dir, config_path, _cleanup, id) =
        shared_fleet("keys", "concurrency = 8\nlease_s = 30", keyed);
    migrate(&config_path);
    let dispatcher = Server::start_role(&config_path, "dispatcher", "toolfleet serving on ");
    let _workers = [
        Server::start_role(&config_path, "worker", "toolfleet worker running"),
        Server::start_role(&config_path, "worker", "toolfleet worker running"),
    ];
    let alice = dispatcher.client(TOKEN);
    let calls: Vec<_> = (0..200)
        .map(|n| json!({"tool": "sync", "args": {"account": format!("acct-{}", n % 5)}}))
        .collect();
    let accepted = alice.post("/v1/calls", json!({"calls": calls})).await;
    let ids: Vec<String> = accepted["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["job_id"].as_str().expect("a job").to_owned())
        .collect();
    assert_eq!(ids.len(), 200, "{accepted}");
    // The last job of an account waits for its key, and says so.
    let last = ids[199].clone();
    let waiting = eventually(Duration::from_secs(10), || {
        let (alice, last) = (alice.clone(), last.clone());
        async move {
            let job = alice.get(&format!("/v1/jobs/{last}")).await;
            (job["waiting_for"] == "concurrency_key").then_some(job)
        }
    })
    .await;
    assert_eq!(waiting["state"], "queued", "{waiting}");
    let url = shared_database_url();
    let mut most = 0u32;
    let mut busiest = String::new();
    let started = std::time::Instant::now();
    loop {
        let counts = psql_value(
            &url,
            &format!(
                "SELECT coalesce(string_agg(n::text, ','), '') FROM (SELECT count(*) AS n FROM tf_{id}.jobs WHERE state = 'running' AND lease_until >= (extract(epoch from now()) * 1000)::bigint GROUP BY concurrency_key) k"
            ),
        );
        for n in counts.split(',').filter(|n| !n.is_empty()) {
            let n: u32 = n.parse().expect("a count");
            if n > most {
                most = n;
                busiest = counts.clone();
            }
        }
        let left = psql_value(
            &url,
            &format!("SELECT count(*) FROM tf_{id}.jobs WHERE state <> 'succeeded'"),
        );
        if left == "0" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{left} jobs left"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "200 jobs of 5 keys in {:.1} s; at most {most} of one key running at once ({busiest})",
        started.elapsed().as_secs_f64()
    );
    assert!(most <= 2, "a key ran {most} at once: {busiest}");
    assert_eq!(most, 2, "the limit is reached, not undercut");
}

/// Messages RabbitMQ dead-letters and the store's failed jobs agree. A job
/// whose message comes back unsettled more often than the pool's
/// `delivery_limit` (here a consumer that loses it twice, as a worker
/// killed holding it would) is dead-lettered by RabbitMQ, and the
/// dispatcher takes the letter: the job is `failed` with `dead_lettered`
/// (the broker's reason in `details`), listed among the failed jobs, and
/// neither its pool queue nor its dead-letter queue holds it any more.
/// `POST /v1/jobs/{id}/retry` puts it back, and a worker runs it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_rabbitmq_dead_letters_is_a_failed_job_until_retried() {
    use toolfleet_broker::Broker;
    use toolfleet_broker::rabbit::{RabbitBroker, RabbitOptions};
    // Leases of 30 s: the sweep, 10 s apart, republishes nothing meanwhile.
    let top = "delivery_limit = 1\njobs_per_message = 1\nlease_s = 30";
    let (dir, config_path, _cleanup, id) = shared_fleet("dead", top, tools);
    migrate(&config_path);
    let dispatcher = Server::start_role(&config_path, "dispatcher", "toolfleet serving on ");
    let alice = dispatcher.client(TOKEN);
    let accepted = alice.call("side_effect", json!({})).await;
    let job = accepted["job_id"].as_str().expect("a job id").to_owned();

    let prefix = format!("tf-{id}");
    let options = RabbitOptions {
        prefix: prefix.clone(),
        delivery_limit: Some(1),
        ..RabbitOptions::default()
    };
    let rogue = RabbitBroker::connect(&shared_amqp_url(), options)
        .await
        .expect("RabbitMQ");
    let mut consumer = rogue.consume("default", 1).await.expect("consume");
    for lost in 0..2 {
        let delivery = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .unwrap_or_else(|_| panic!("delivery {lost} of the job's message"))
            .expect("a delivery");
        assert_eq!(delivery.job_id, job);
        drop(delivery);
    }
    let failed = eventually(Duration::from_secs(15), || {
        let alice = &alice;
        let job = &job;
        async move {
            let read = alice.get(&format!("/v1/jobs/{job}")).await;
            (read["state"] == "failed").then_some(read)
        }
    })
    .await;
    assert_eq!(failed["error"]["code"], "dead_lettered", "{failed}");
    assert_eq!(failed["error"]["details"]["reason"], "delivery_limit");
    assert_eq!(failed["error"]["retryable"], true);
    let listed = alice.get("/v1/jobs?state=failed").await;
    assert_eq!(listed["jobs"][0]["job_id"], job.as_str(), "{listed}");
    let dead = toolfleet_broker::rabbit::dead_letter_queue_name(&prefix, "default");
    let pool = toolfleet_broker::rabbit::pool_queue_name(&prefix, "default");
    eventually(Duration::from_secs(5), || {
        let dead = &dead;
        async move { (messages_in(dead).await == Some(0)).then_some(()) }
    })
    .await;
    assert_eq!(messages_in(&pool).await, Some(0), "no message left");
    // Dropped, not deleted: the fleet's queues stay (the cleanup takes them).
    drop(consumer);
    drop(rogue);

    let retried = alice
        .post(&format!("/v1/jobs/{job}/retry"), json!({}))
        .await;
    assert_eq!(retried["state"], "queued", "{retried}");
    let _worker = Server::start_role(&config_path, "worker", "toolfleet worker running");
    let done = settle(&alice, &job).await;
    assert_eq!(done["result"]["done"], true, "{done}");
    assert_eq!(lines(&dir.0.join("effects")), vec![job]);
}

/// Fair share across the fleet: in a `fair_share` pool worked by two
/// workers, a job another tenant calls while one tenant's 20,000-job
/// backlog drains starts before 1 % more of that backlog has run (counted
/// from the order the executors started in, and printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_fair_pool_another_tenants_job_starts_before_one_percent_of_a_backlog() {
    const BACKLOG: usize = 20_000;
    let crawl = |dir: &Path| {
        let starts = dir.join("starts");
        let script = format!(
            "echo \"$TOOLFLEET_TENANT\" >> {}; echo '{{}}'",
            starts.display()
        );
        format!(
            "[[tools]]\nname = \"crawl\"\nshape = \"job\"\npool = \"crawl\"\nexecutor = {{ kind = \"exec\", program = \"/bin/sh\", args = [\"-c\", {script:?}] }}\n"
        )
    };
    let top = "concurrency = 8\nlease_s = 30\nfair_share = [\"crawl\"]";
    let (dir, config_path, _cleanup, _) = shared_fleet("fair", top, crawl);
    migrate(&config_path);
    let dispatcher = Server::start_role(&config_path, "dispatcher", "toolfleet serving on ");
    let (acme, globex) = (dispatcher.client(TOKEN), dispatcher.client(OTHER_TOKEN));
    let batch: Vec<_> = (0..1000)
        .map(|_| json!({"tool": "crawl", "args": {}}))
        .collect();
    for _ in 0..BACKLOG / batch.len() {
        let accepted = acme.post("/v1/calls", json!({"calls": batch})).await;
        let results = accepted["results"].as_array().expect("results");
        assert_eq!(results.len(), batch.len(), "{accepted}");
        assert!(
            results.iter().all(|r| r["status"] == "running"),
            "{accepted}"
        );
    }
    let _workers = [
        Server::start_role(&config_path, "worker", "toolfleet worker running"),
        Server::start_role(&config_path, "worker", "toolfleet worker running"),
    ];
    // The backlog drains; then the other tenant calls.
    let starts = dir.0.join("starts");
    let draining = eventually(Duration::from_secs(30), || {
        let starts = starts.clone();
        async move {
            let started = lines(&starts).len();
            (started >= 50).then_some(started)
        }
    })
    .await;
    let at_call = lines(&starts).len();
    let newcomer = globex.call("crawl", json!({})).await;
    let job = newcomer["job_id"].as_str().expect("a job id").to_owned();
    let done = settle(&globex, &job).await;
    assert_eq!(done["status"], "ok", "{done}");
    let started = lines(&starts);
    let position = started
        .iter()
        .position(|tenant| tenant == "globex")
        .expect("the newcomer started");
    let before = position.saturating_sub(at_call);
    println!(
        "fair share across two workers: with {draining}+ of a {BACKLOG}-job backlog started, the other tenant's job started after {before} more ({:.2} %)",
        before as f64 * 100.0 / BACKLOG as f64
    );
    assert!(
        before < BACKLOG / 100,
        "{before} of the backlog started first"
    );
}
