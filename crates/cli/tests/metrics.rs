//! Prometheus metrics of real `toolfleet` processes. A scripted run against
//! `toolfleet serve` on the embedded default (a cached query called twice, a
//! validation failure, denials of every reason, a job that succeeds and
//! calls back a webhook that fails once, a job that fails after a retry, an
//! agent on a scripted model, `get_job` read and long-polled) then one
//! scrape of `/metrics` that must show every metric of the contract with the
//! values the run moved. And a
//! `toolfleet worker` of the distributed mode (this machine's PostgreSQL and
//! RabbitMQ, a schema and a prefix of the test's own) serving `/metrics`,
//! `/healthz` and `/readyz` on `metrics_listen`, counting a job a dispatcher
//! enqueued and a message it dead-lettered, and refusing a port in use; each
//! process names its role in `toolfleet_build_info`, and only the dispatcher
//! counts the jobs in the store.
//!
//! The distributed test never skips: without the servers it fails and says
//! what to start (`TOOLFLEET_TEST_DATABASE_URL`, `TOOLFLEET_TEST_AMQP_URL`).

mod common;

use std::time::Duration;

use common::scripted::{Scrape, reqwest_client, scripted_run};
use common::{
    Server, SharedCleanup, TOKEN, TempDir, amqp_channel, eventually, migrate, settle,
    shared_amqp_url, shared_database_url, shared_fleet,
};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_counts_a_scripted_run_in_one_registry() {
    let run = scripted_run().await;
    let scrape = &run.scrape;
    for (family, kind) in [
        ("toolfleet_calls", "counter"),
        ("toolfleet_call_duration_seconds", "histogram"),
        ("toolfleet_job_queue_wait_seconds", "histogram"),
        ("toolfleet_job_run_seconds", "histogram"),
        ("toolfleet_worker_slots", "gauge"),
        ("toolfleet_jobs", "gauge"),
        ("toolfleet_queue_depth", "gauge"),
    ] {
        assert!(scrape.has_type(family, kind), "{family} {kind}");
    }
    let exactly = [
        // The call path.
        (
            r#"toolfleet_calls_total{tool="find_expenses",outcome="ok"}"#,
            2.0,
        ),
        (
            r#"toolfleet_calls_total{tool="find_expenses",outcome="invalid_arguments"}"#,
            1.0,
        ),
        (
            r#"toolfleet_calls_total{tool="find_expenses",outcome="forbidden"}"#,
            1.0,
        ),
        (
            r#"toolfleet_calls_total{tool="unknown",outcome="unknown_tool"}"#,
            1.0,
        ),
        (
            r#"toolfleet_calls_total{tool="fine_job",outcome="running"}"#,
            1.0,
        ),
        (
            r#"toolfleet_call_duration_seconds_count{tool="find_expenses"}"#,
            4.0,
        ),
        (
            r#"toolfleet_validation_failures_total{tool="find_expenses"}"#,
            1.0,
        ),
        (
            r#"toolfleet_denials_total{tool="find_expenses",reason="forbidden"}"#,
            1.0,
        ),
        (
            r#"toolfleet_denials_total{tool="unknown",reason="unauthenticated"}"#,
            1.0,
        ),
        (
            r#"toolfleet_denials_total{tool="limited",reason="rate_limited"}"#,
            1.0,
        ),
        (r#"toolfleet_cache_hits_total{tool="find_expenses"}"#, 1.0),
        (r#"toolfleet_cache_misses_total{tool="find_expenses"}"#, 1.0),
        (r#"toolfleet_jobs_enqueued_total{tool="fine_job"}"#, 1.0),
        (r#"toolfleet_jobs_enqueued_total{tool="flaky_job"}"#, 1.0),
        (
            r#"toolfleet_jobs_enqueued_total{tool="counting_agent"}"#,
            1.0,
        ),
        // Webhooks: the refused attempt, then the delivered one.
        (
            r#"toolfleet_webhook_deliveries_total{outcome="failed"}"#,
            1.0,
        ),
        (
            r#"toolfleet_webhook_deliveries_total{outcome="delivered"}"#,
            1.0,
        ),
        ("toolfleet_webhook_abandoned_total", 0.0),
        // Workers.
        (r#"toolfleet_jobs_started_total{tool="fine_job"}"#, 1.0),
        (r#"toolfleet_jobs_started_total{tool="flaky_job"}"#, 2.0),
        (
            r#"toolfleet_jobs_settled_total{tool="fine_job",state="succeeded"}"#,
            1.0,
        ),
        (
            r#"toolfleet_jobs_settled_total{tool="flaky_job",state="failed"}"#,
            1.0,
        ),
        (
            r#"toolfleet_jobs_settled_total{tool="counting_agent",state="succeeded"}"#,
            1.0,
        ),
        (r#"toolfleet_job_retries_total{tool="flaky_job"}"#, 1.0),
        (r#"toolfleet_dead_letters_total{pool="default"}"#, 0.0),
        (
            r#"toolfleet_job_queue_wait_seconds_count{tool="fine_job"}"#,
            1.0,
        ),
        (r#"toolfleet_job_run_seconds_count{tool="flaky_job"}"#, 2.0),
        (r#"toolfleet_worker_slots{pool="default"}"#, 4.0),
        (r#"toolfleet_worker_slots{pool="agents"}"#, 4.0),
        (r#"toolfleet_worker_jobs_in_flight{pool="default"}"#, 0.0),
        // Agents.
        (r#"toolfleet_agent_steps_total{tool="counting_agent"}"#, 1.0),
        (
            r#"toolfleet_agent_tokens_total{tool="counting_agent",kind="input"}"#,
            50.0,
        ),
        (
            r#"toolfleet_agent_tokens_total{tool="counting_agent",kind="output"}"#,
            10.0,
        ),
        // Backends: nothing failed.
        (r#"toolfleet_backend_errors_total{backend="store"}"#, 0.0),
        (r#"toolfleet_backend_errors_total{backend="broker"}"#, 0.0),
        (r#"toolfleet_backend_errors_total{backend="notices"}"#, 0.0),
        (r#"toolfleet_scrape_timeouts_total{backend="store"}"#, 0.0),
        (r#"toolfleet_scrape_timeouts_total{backend="broker"}"#, 0.0),
        // get_job: a read and a long poll are both counted; only the read is
        // timed, a wait is not the time of a call.
        (r#"toolfleet_calls_total{tool="get_job",outcome="ok"}"#, 2.0),
        (
            r#"toolfleet_call_duration_seconds_count{tool="get_job"}"#,
            1.0,
        ),
        // Read when scraped.
        (r#"toolfleet_jobs{state="succeeded"}"#, 2.0),
        (r#"toolfleet_jobs{state="failed"}"#, 1.0),
        (r#"toolfleet_jobs{state="queued"}"#, 0.0),
        (r#"toolfleet_queue_depth{pool="default"}"#, 0.0),
        (r#"toolfleet_queue_depth{pool="agents"}"#, 0.0),
    ];
    for (series, value) in exactly {
        assert_eq!(scrape.get(series), value, "{series} in\n{}", scrape.text);
    }
    // The process says what it runs as: `serve`, both roles.
    let version = format!(
        r#"toolfleet_build_info{{version="{}",role="serve"}}"#,
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(scrape.get(&version), 1.0);
    assert_eq!(scrape.text.matches("toolfleet_build_info{").count(), 1);
    // Histograms moved: their sums are positive and their buckets cumulative.
    assert!(scrape.get(r#"toolfleet_job_run_seconds_sum{tool="fine_job"}"#) > 0.0);
    assert_eq!(
        scrape.get(r#"toolfleet_call_duration_seconds_bucket{le="+Inf",tool="find_expenses"}"#),
        4.0
    );
    // No label outside its bounded set: an unknown tool is `unknown`.
    assert!(!scrape.text.contains("no_such_tool"), "{}", scrape.text);
}

/// A fleet of this test's own on the shared servers, with one job tool,
/// migrated; and its RabbitMQ prefix.
fn fleet(name: &str) -> (TempDir, std::path::PathBuf, SharedCleanup, String) {
    let job = "[[tools]]\nname = \"fine_job\"\nshape = \"job\"\ninput_schema = { type = \"object\" }\nexecutor = { kind = \"exec\", program = \"sh\", args = [\"-c\", \"echo '{}'\"] }\n";
    let (dir, config, cleanup, _) = shared_fleet(name, "", |_| job.to_owned());
    let prefix = match &cleanup.broker {
        Some((_, prefix)) => prefix.clone(),
        None => unreachable!("the fleet has a prefix"),
    };
    migrate(&config);
    (dir, config, cleanup, prefix)
}

/// Fails, never skips, when the shared servers are not there, saying which.
async fn require_servers() {
    let where_ = if std::env::var_os("CI").is_some() {
        "CI must start PostgreSQL and RabbitMQ before these tests"
    } else {
        "start them locally, or point TOOLFLEET_TEST_DATABASE_URL and TOOLFLEET_TEST_AMQP_URL at them"
    };
    let database = shared_database_url();
    let psql = std::process::Command::new("psql")
        .arg(&database)
        .args(["-XtAq", "-c", "SELECT 1"])
        .output();
    match psql {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "PostgreSQL at {database} does not answer ({}); {where_}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => panic!("psql cannot run ({e}); {where_}"),
    }
    let amqp = shared_amqp_url();
    let options = toolfleet_broker::rabbit::RabbitOptions {
        prefix: format!("tf-probe-{}", uuid::Uuid::now_v7().simple()),
        ..Default::default()
    };
    if let Err(e) = toolfleet_broker::rabbit::RabbitBroker::connect(&amqp, options).await {
        panic!("RabbitMQ at {amqp} does not answer ({e}); {where_}");
    }
}

/// A worker whose pool's queue cannot be consumed (here a queue of the same
/// name, exclusive to another connection, is in the way) answers `/readyz` 503 naming the
/// pool, though the servers answer; once the queue can be declared, it
/// consumes and is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_is_ready_only_once_it_consumes_its_pool() {
    require_servers().await;
    let (_dir, config, _cleanup, prefix) = fleet("metrics-consuming");
    let queue = format!("{prefix}.pool.default");
    // Held to the end: the exclusive queue lives as long as its connection.
    let (_connection, channel) = amqp_channel(&shared_amqp_url()).await;
    let exclusive = lapin::options::QueueDeclareOptions {
        exclusive: true,
        ..Default::default()
    };
    channel
        .queue_declare(queue.as_str().into(), exclusive, Default::default())
        .await
        .expect("a queue of this connection alone in the pool queue's place");

    let worker = Server::start_role(&config, "worker", "toolfleet worker metrics on ");
    let http = reqwest_client();
    let probe = || {
        let (http, base) = (http.clone(), worker.base.clone());
        async move {
            let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
            let status = ready.status().as_u16();
            let body: Value = serde_json::from_str(&ready.text().await.unwrap()).unwrap();
            (status, body)
        }
    };
    // It keeps trying to consume (once a second) and stays unready.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(
            probe().await,
            (
                503,
                json!({"store": "ok", "broker": "ok", "workers": {"waiting": ["default"]}})
            )
        );
    }
    channel
        .queue_delete(queue.as_str().into(), Default::default())
        .await
        .expect("the exclusive queue deleted");
    let ready = eventually(Duration::from_secs(15), || async {
        let (status, body) = probe().await;
        (status == 200).then_some(body)
    })
    .await;
    assert_eq!(
        ready,
        json!({"store": "ok", "broker": "ok", "workers": "ok"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_serves_metrics_health_and_readiness_on_metrics_listen() {
    require_servers().await;
    let (_dir, config, _cleanup, prefix) = fleet("metrics-worker");
    let dispatcher = Server::start_role(&config, "dispatcher", "toolfleet serving on ");
    // Port 0 (TOOLFLEET_METRICS_LISTEN, which the test helpers set): the
    // worker prints where it listens.
    let worker = Server::start_role(&config, "worker", "toolfleet worker metrics on ");
    assert!(
        worker.base.starts_with("http://127.0.0.1:") && !worker.base.ends_with(":0"),
        "{}",
        worker.base
    );
    let http = reqwest_client();

    let health = http
        .get(format!("{}/healthz", worker.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    // Ready once it consumes its pool (its metrics answer from the start).
    let ready = eventually(Duration::from_secs(15), || {
        let (http, base) = (http.clone(), worker.base.clone());
        async move {
            let ready = http.get(format!("{base}/readyz")).send().await.ok()?;
            (ready.status() == 200).then_some(ready)
        }
    })
    .await;
    assert_eq!(
        serde_json::from_str::<Value>(&ready.text().await.unwrap()).unwrap(),
        json!({"store": "ok", "broker": "ok", "workers": "ok"})
    );

    // A job enqueued by the dispatcher and run by the worker: each process
    // counts its own part.
    let alice = dispatcher.client(TOKEN);
    let accepted = alice.call("fine_job", json!({})).await;
    let job = accepted["job_id"].as_str().expect("a job id").to_owned();
    assert_eq!(settle(&alice, &job).await["status"], "ok");
    // A message that is not a job id: the worker dead-letters it.
    let options = toolfleet_broker::rabbit::RabbitOptions {
        prefix,
        ..Default::default()
    };
    let broker = toolfleet_broker::rabbit::RabbitBroker::connect(&shared_amqp_url(), options)
        .await
        .expect("RabbitMQ answers");
    toolfleet_broker::Broker::publish(&broker, "default", "not a job id")
        .await
        .expect("published");

    let scrape = eventually(Duration::from_secs(15), || {
        let base = worker.base.clone();
        async move {
            let scrape = Scrape::of(&base).await;
            (scrape.value(r#"toolfleet_dead_letters_total{pool="default"}"#) == Some(1.0)
                && scrape.value(r#"toolfleet_worker_busy_slots{pool="default"}"#) == Some(0.0))
            .then_some(scrape)
        }
    })
    .await;
    for (series, value) in [
        (r#"toolfleet_jobs_started_total{tool="fine_job"}"#, 1.0),
        (
            r#"toolfleet_jobs_settled_total{tool="fine_job",state="succeeded"}"#,
            1.0,
        ),
        (r#"toolfleet_worker_slots{pool="default"}"#, 2.0),
        (r#"toolfleet_worker_jobs_in_flight{pool="default"}"#, 0.0),
        (r#"toolfleet_queue_depth{pool="default"}"#, 0.0),
        (r#"toolfleet_backend_errors_total{backend="store"}"#, 0.0),
    ] {
        assert_eq!(scrape.get(series), value, "{series} in\n{}", scrape.text);
    }
    // A worker says it is one, and leaves counting the jobs to dispatchers.
    let version = env!("CARGO_PKG_VERSION");
    let worker_info = format!(r#"toolfleet_build_info{{version="{version}",role="worker"}}"#);
    assert_eq!(scrape.get(&worker_info), 1.0);
    assert!(!scrape.text.contains("toolfleet_jobs{"), "{}", scrape.text);
    assert!(scrape.get(r#"toolfleet_job_queue_wait_seconds_count{tool="fine_job"}"#) >= 1.0);
    assert!(scrape.get(r#"toolfleet_job_run_seconds_count{tool="fine_job"}"#) >= 1.0);
    // Nothing was enqueued by the worker; the dispatcher counted the job.
    assert_eq!(
        scrape.value(r#"toolfleet_jobs_enqueued_total{tool="fine_job"}"#),
        None
    );
    let dispatched = Scrape::of(&dispatcher.base).await;
    let dispatcher_info =
        format!(r#"toolfleet_build_info{{version="{version}",role="dispatcher"}}"#);
    assert_eq!(dispatched.get(&dispatcher_info), 1.0);
    assert_eq!(dispatched.get(r#"toolfleet_jobs{state="succeeded"}"#), 1.0);
    assert_eq!(
        dispatched.get(r#"toolfleet_queue_depth{pool="default"}"#),
        0.0
    );
    assert_eq!(
        dispatched.get(r#"toolfleet_jobs_enqueued_total{tool="fine_job"}"#),
        1.0
    );
    assert_eq!(
        dispatched.value(r#"toolfleet_jobs_started_total{tool="fine_job"}"#),
        None
    );
    let other = http
        .get(format!("{}/v1/tools", worker.base))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 404, "a worker serves no API");

    // A second worker asked for the first one's port stops, saying why.
    let address = worker.base.trim_start_matches("http://").to_owned();
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_toolfleet"))
        .arg("--config")
        .arg(&config)
        .arg("worker")
        .env("TOOLFLEET_METRICS_LISTEN", &address)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains(&format!("cannot listen for metrics on {address}")),
        "{said}"
    );
    assert!(!said.contains("toolfleet worker running"), "{said}");
    drop(broker);
}
