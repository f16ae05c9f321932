//! The worked example as a run of `expense_assistant` in distributed mode,
//! with real processes on the real servers of this machine: `toolfleet
//! migrate`, two dispatchers and two workers (each working every pool,
//! `agents` included) on a PostgreSQL schema and a RabbitMQ prefix of this
//! test's own, every process's model one scripted server. The run starts
//! on dispatcher A and parks on the OCR job and the question; the worker
//! that ran its loop is killed with SIGKILL while it waits, holding
//! nothing; the question is answered on dispatcher B, and the run resumes
//! on the other worker; its commit waits for an approval, decided with
//! `toolfleet approve --server B` (the commit runs in B); the run answers,
//! and a retried commit through A answers the same report.

mod common;

use std::time::Duration;

use common::month::{self, Month};
use common::{Server, SharedCleanup, TOKEN, TempDir, eventually, migrate, shared_fleet};
use serde_json::{Value, json};
use toolfleet_agent::testing::ScriptedModel;

/// The run as it stands.
async fn run_of(client: &common::Client, run: &str) -> Value {
    client.get(&format!("/v1/runs/{run}")).await["result"].clone()
}

/// Waits until the run is in `state`, answering it then.
async fn run_in(client: &common::Client, run: &str, state: &str) -> Value {
    eventually(Duration::from_secs(30), || {
        let client = client.clone();
        let (run, state) = (run.to_owned(), state.to_owned());
        async move {
            let now = run_of(&client, &run).await;
            (now["state"] == state.as_str()).then_some(now)
        }
    })
    .await
}

/// A worker and where its metrics are served.
struct Worker {
    server: Server,
    metrics: String,
}

impl Worker {
    fn start(config: &std::path::Path, env: &[(&str, &str)]) -> Worker {
        let server = Server::start_role_env(config, "worker", "toolfleet worker running", env);
        let metrics = server
            .startup
            .iter()
            .find_map(|l| l.strip_prefix("toolfleet worker metrics on "))
            .map(|rest| {
                rest.split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            })
            .expect("the worker prints where its metrics are served");
        Worker { server, metrics }
    }

    /// The value of the metric `series` (its name and labels, as the text
    /// format writes them) on this worker.
    async fn metric(&self, http: &reqwest::Client, series: &str) -> Option<f64> {
        let text = http
            .get(format!("{}/metrics", self.metrics))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    /// The loop jobs of runs this worker started.
    async fn loops_started(&self, http: &reqwest::Client) -> f64 {
        self.metric(http, "toolfleet_jobs_started_total{tool=\"toolfleet.run\"}")
            .await
            .unwrap_or(0.0)
    }
}

/// A fleet of this test's own: the expense pack and nothing more.
fn fleet(name: &str) -> (TempDir, std::path::PathBuf, SharedCleanup) {
    // Leases a loaded machine's heartbeats keep, so that no attempt is
    // taken over but the killed worker's.
    let (dir, config, cleanup, _) = shared_fleet(name, "lease_s = 5\n", |_| String::new());
    (dir, config, cleanup)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worked_example_runs_across_two_dispatchers_and_two_workers_one_killed() {
    let began = std::time::Instant::now();
    let model = ScriptedModel::start().await;
    let (_dir, path, _cleanup) = fleet("runs-distributed");
    migrate(&path);
    let env = [("EXPENSES_MODEL_URL", model.base_url())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = Server::start_role_env(&path, "dispatcher", "toolfleet serving on ", &env);
    let b = Server::start_role_env(&path, "dispatcher", "toolfleet serving on ", &env);
    let mut workers = [Worker::start(&path, &env), Worker::start(&path, &env)];
    let (alice_a, alice_b) = (a.client(TOKEN), b.client(TOKEN));
    let http = alice_a.http.clone();

    // What the script needs to know of the month. Every process's book
    // starts from the same seed, so these are every process's lines.
    let month = Month::read(&alice_a).await;
    assert_eq!(month.lines.len(), 62);
    model.script(
        "llama3.1",
        month.script("Your September report is submitted."),
    );

    // Started on A.
    let started = alice_a
        .post(
            "/v1/runs",
            json!({"agent": "expense_assistant", "input": "Submit my expenses for 2026-09."}),
        )
        .await;
    assert_eq!(started["status"], "ok", "{started}");
    let run = started["result"]["run_id"].as_str().unwrap().to_owned();

    // Parked on the OCR job and the question at once.
    let waiting = run_in(&alice_a, &run, "waiting").await;
    let parked_at = began.elapsed();
    let tickets = waiting["wait"]["tickets"].as_array().unwrap().clone();
    assert_eq!(tickets.len(), 1, "{waiting}");
    let question = tickets[0].as_str().unwrap().to_owned();
    // The job may have settled before the run parked (the wait then names
    // the ticket alone): the job's id is in its call's envelope.
    let ocr = waiting["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "tool_call" && e["tool"] == "start_receipt_ocr")
        .and_then(|e| e["envelope"]["job_id"].as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("the OCR job's id: {waiting}"));

    // The worker that ran the loop (its metrics count the loop's job),
    // killed while the run waits, once its loop gave its slot back.
    let mut started_loops = Vec::new();
    for worker in &workers {
        started_loops.push(worker.loops_started(&http).await);
    }
    assert!(
        started_loops.iter().sum::<f64>() >= 1.0,
        "a worker ran the loop: {started_loops:?}"
    );
    let ran = usize::from(started_loops[1] > started_loops[0]);
    eventually(Duration::from_secs(10), || {
        let (worker, http) = (&workers[ran], &http);
        async move {
            let busy = worker
                .metric(http, "toolfleet_worker_busy_slots{pool=\"agents\"}")
                .await;
            (busy == Some(0.0)).then_some(())
        }
    })
    .await;
    workers[ran].server.kill();
    let survivor = &workers[1 - ran];
    let survivor_loops = started_loops[1 - ran];

    // The job settles (on the survivor if the killed worker held it); the
    // run still waits for the person, and the survivor holds no slot of
    // the agents' pool.
    let still = eventually(Duration::from_secs(30), || {
        let alice = alice_b.clone();
        let (run, ocr) = (run.clone(), ocr.clone());
        async move {
            let job = alice.get(&format!("/v1/jobs/{ocr}")).await;
            (job["status"] == "ok").then_some(run_of(&alice, &run).await)
        }
    })
    .await;
    assert_eq!(still["state"], "waiting", "{still}");
    assert_eq!(
        survivor
            .metric(&http, "toolfleet_worker_busy_slots{pool=\"agents\"}")
            .await,
        Some(0.0),
        "the waiting run holds no slot"
    );
    assert_eq!(
        model.requests("llama3.1").len(),
        3,
        "no model call while it waits"
    );

    // The question, in B's inbox, answered on B.
    let inbox = alice_b.get("/v1/tickets?state=open").await;
    let listed: Vec<&str> = inbox["result"]["tickets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["ticket"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [question.as_str()], "{inbox}");
    let answered = alice_b
        .post(
            &format!("/v1/tickets/{question}/answer"),
            json!({"answer": "travel"}),
        )
        .await;
    assert_eq!(answered["status"], "ok", "{answered}");
    let answered_at = began.elapsed();

    // The run resumes on the survivor: the dry run, then the commit waits
    // for its approval.
    let approving = eventually(Duration::from_secs(30), || {
        let alice = alice_b.clone();
        async move {
            let inbox = alice.get("/v1/tickets?state=open&kind=approval").await;
            inbox["result"]["tickets"][0]
                .get("ticket")
                .and_then(Value::as_str)
                .map(str::to_owned)
        }
    })
    .await;
    let ticket = alice_b.get(&format!("/v1/tickets/{approving}")).await;
    assert_eq!(ticket["result"]["kind"], "approval", "{ticket}");
    assert_eq!(ticket["result"]["run_id"], run.as_str(), "{ticket}");
    assert_eq!(
        ticket["result"]["plan"]["lines"],
        month.known.len(),
        "{ticket}"
    );
    let parked = run_in(&alice_a, &run, "waiting").await;
    assert_eq!(parked["wait"]["tickets"][0], approving.as_str(), "{parked}");
    assert!(
        survivor.loops_started(&http).await > survivor_loops,
        "the survivor ran the resumed loop"
    );

    // Approved on B with the command line: the commit runs there.
    let approved = common::toolfleet(&[
        "--config",
        path.to_str().unwrap(),
        "approve",
        &approving,
        "--server",
        &b.base,
        "--token",
        TOKEN,
    ]);
    assert!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    let done = run_in(&alice_a, &run, "answered").await;
    let answered_run_at = began.elapsed();
    assert_eq!(done["answer"], "Your September report is submitted.");
    let approval = alice_a.get(&format!("/v1/tickets/{approving}")).await;
    let outcome = &approval["result"]["outcome"];
    let report = outcome["result"]["report_id"].clone();
    assert!(report.is_string(), "{approval}");
    assert_eq!(
        outcome["result"]["line_ids"].as_array().map(Vec::len),
        Some(month.known.len()),
        "{approval}"
    );

    // A retried commit, as the run made it, through A (which never ran
    // it) answers the same report.
    let again = month::commit_args(&done);
    assert!(
        again["confirm_token"].as_str().unwrap().starts_with("ct1."),
        "{again}"
    );
    let retried = alice_a.call("submit_report", again.clone()).await;
    assert_eq!(retried["result"]["report_id"], report, "{retried}");
    let retried = alice_b.call("submit_report", again).await;
    assert_eq!(retried["result"]["report_id"], report, "{retried}");

    // The transcript shows each step.
    month::assert_steps(&done);
    assert_eq!(model.requests("llama3.1").len(), 6, "one model call a step");
    eprintln!(
        "parked after {parked_at:?}, answered the question at {answered_at:?}, the run answered at {answered_run_at:?}, done at {:?}",
        began.elapsed()
    );
}
