//! `toolfleet bench runs`: runs a caller drives, parked and resumed through
//! the real HTTP path. Each run makes one call of a job that holds until the
//! bench releases it (a real job, running or queued in the fleet) and one of
//! a human tool (a real ticket), and parks with `/wait` on both. The bench
//! then reads the process's memory and the workers' busy slots, releases
//! the jobs (so that each run waits on its ticket alone, which must hold no
//! slot), answers every ticket from C clients and measures the resumes as
//! `run_resumed` events on `/v1/events`, checked at the end against
//! `GET /v1/runs?state=running`.
//!
//! Latencies: run to waiting is a run's four requests (start, the two
//! calls, the wait); answer to resumed is the time from sending a ticket's
//! answer to its run's `run_resumed` event.

use std::collections::{HashMap, HashSet};

use tokio::sync::watch;

use super::{Common, Latency, Local, RunsArgs, percentiles, read_events, spawn_bounded};
use crate::config::Config;

use serde::Serialize;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toolfleet_core::{CallCtx, ToolDecl, ToolError};

/// The job each run waits on: it holds until the bench releases it.
const HOLD: &str = "bench_hold";
/// The human tool whose ticket each run waits on.
const ASK: &str = "bench_ask";

/// How long the bench waits for what it waits on (jobs settling, runs
/// resuming) before it reports what it saw.
const PATIENCE: Duration = Duration::from_secs(120);

fn hold_tool(released: watch::Receiver<bool>) -> ToolDecl {
    ToolDecl::job(HOLD)
        .description("Holds until the bench releases it; measures waiting runs.")
        .idempotent(true)
        .destructive(false)
        .max_attempts(1)
        .run(move |_: CallCtx, _: Value| {
            let mut released = released.clone();
            async move {
                // A sender gone releases it too.
                let _ = released.wait_for(|released| *released).await;
                Ok::<_, ToolError>(json!({"released": true}))
            }
        })
}

fn ask_tool() -> ToolDecl {
    ToolDecl::human(ASK)
        .description("Asks the bench a question; the bench answers every one.")
        .input_schema(json!({
            "type": "object",
            "required": ["question"],
            "properties": {"question": {"type": "string"}}
        }))
}

/// Parking: N runs, each its four requests.
#[derive(Serialize, Debug, Clone, PartialEq)]
struct Park {
    /// Runs whose wait answered `waiting`.
    parked: usize,
    /// From the first run's start to the last run's wait.
    seconds: f64,
    runs_per_second: f64,
    run_to_waiting_ms: Option<Latency>,
}

/// The process's resident memory (`VmRSS`), in KiB.
#[derive(Serialize, Debug, Clone, PartialEq)]
struct Memory {
    /// The server up, before any run.
    rss_before_kib: u64,
    /// Every run parked, the jobs held.
    rss_parked_kib: u64,
    /// The jobs settled: every run waiting on its ticket alone.
    rss_waiting_on_tickets_kib: u64,
    /// Every run resumed.
    rss_resumed_kib: u64,
    /// (parked - before) / runs, in bytes: the server's and the bench's
    /// client's share together.
    parked_bytes_per_run: u64,
}

/// The workers' slots, summed over pools, from the runtime's metrics.
#[derive(Serialize, Debug, Clone, PartialEq)]
struct Slots {
    /// `toolfleet_worker_slots`: every pool's capacity.
    worker_slots: u64,
    /// `toolfleet_worker_busy_slots` with the jobs held (at most
    /// `concurrency`: the rest are queued).
    busy_with_jobs_held: u64,
    /// `toolfleet_worker_busy_slots` once the jobs settled, every run
    /// waiting on its ticket: 0 when a waiting run holds no slot.
    busy_waiting_on_tickets: u64,
    /// `toolfleet_worker_jobs_in_flight` then.
    jobs_in_flight_waiting_on_tickets: u64,
}

/// Answering every ticket and the resumes.
#[derive(Serialize, Debug, Clone, PartialEq)]
struct Resume {
    /// Jobs whose settled event arrived after the release.
    jobs_settled: usize,
    /// Runs still `waiting` once their jobs settled (listed).
    waiting_after_jobs: usize,
    /// Tickets answered `ok`.
    answered: usize,
    /// Runs whose `run_resumed` event arrived after their answer was sent.
    resumed: usize,
    /// Runs whose `run_resumed` event arrived before their answer was sent
    /// (a run resumed while its ticket was open: a bug).
    resumed_before_answer: usize,
    /// Runs listed `running` with `resumed` holding both items.
    resumed_listed: usize,
    /// From the first answer sent to the last answered.
    answer_seconds: f64,
    answers_per_second: f64,
    /// Resumed runs per second, from the first answer sent to the last
    /// `run_resumed` event.
    resumed_runs_per_second: f64,
    answer_to_resumed_ms: Option<Latency>,
}

/// Everything one `toolfleet bench runs` measured: what `--json` prints.
#[derive(Serialize, Debug, Clone, PartialEq)]
struct Report {
    runs: usize,
    clients: usize,
    /// Worker slots per pool.
    concurrency: usize,
    /// `sqlite` or `postgres`.
    store: &'static str,
    /// `in-process` or `rabbitmq`.
    broker: &'static str,
    park: Park,
    memory: Memory,
    slots: Slots,
    resume: Resume,
}

/// One parked run: its id, the job and the ticket it waits on.
#[derive(Clone)]
struct Parked {
    run: String,
    job: String,
    ticket: String,
    took: Duration,
}

/// What `/v1/events` showed: settled jobs, and when each run resumed.
#[derive(Default)]
struct Heard {
    settled_jobs: HashSet<String>,
    resumed: HashMap<String, Instant>,
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    /// Answers the envelope of `path`, an error envelope as an error.
    async fn send(&self, request: reqwest::RequestBuilder, path: &str) -> Result<Value, String> {
        let response = request
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| format!("{path}: {e}"))?;
        let text = response.text().await.map_err(|e| format!("{path}: {e}"))?;
        let envelope: Value =
            serde_json::from_str(&text).map_err(|e| format!("{path}: {e}: {text}"))?;
        if envelope["status"] == "error" {
            return Err(format!("{path}: {text}"));
        }
        Ok(envelope)
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value, String> {
        let request = self
            .http
            .post(format!("{}{path}", self.base))
            .header("Content-Type", "application/json")
            .body(body.to_string());
        self.send(request, path).await
    }

    async fn get(&self, path: &str) -> Result<Value, String> {
        let request = self.http.get(format!("{}{path}", self.base));
        self.send(request, path).await
    }

    /// Starts run `i`, makes its two calls and parks it on both.
    async fn park(&self, i: usize) -> Result<Parked, String> {
        let begun = Instant::now();
        let started = self
            .post("/v1/runs", json!({"checkpoint": {"bench": i}}))
            .await?;
        let run = text(&started["result"]["run_id"], "a run id", &started)?;
        let called = self
            .post(
                "/v1/calls",
                json!({"tool": HOLD, "args": {}, "run_id": run}),
            )
            .await?;
        let job = text(&called["job_id"], "a job id", &called)?;
        let question = format!("run {i}: go on?");
        let asked = self
            .post(
                "/v1/calls",
                json!({"tool": ASK, "args": {"question": question}, "run_id": run}),
            )
            .await?;
        let ticket = text(&asked["ticket"], "a ticket", &asked)?;
        let wait = json!({"for": "all", "jobs": [job], "tickets": [ticket]});
        let waiting = self.post(&format!("/v1/runs/{run}/wait"), wait).await?;
        if waiting["result"]["state"] != "waiting" {
            return Err(format!("run {run} did not park: {waiting}"));
        }
        Ok(Parked {
            run,
            job,
            ticket,
            took: begun.elapsed(),
        })
    }

    /// The runs of `ours` in `state`, as `GET /v1/runs` lists them.
    async fn listed(&self, state: &str, ours: &HashSet<&str>) -> Result<Vec<Value>, String> {
        let mut found = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let path = match &cursor {
                Some(cursor) => format!("/v1/runs?state={state}&cursor={cursor}"),
                None => format!("/v1/runs?state={state}"),
            };
            let page = self.get(&path).await?;
            let runs = page["result"]["runs"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            found.extend(
                runs.into_iter()
                    .filter(|run| run["run_id"].as_str().is_some_and(|id| ours.contains(id))),
            );
            match page["result"]["next_cursor"].as_str() {
                // Newest first: once every one of ours is found, the rest
                // are older runs of the store.
                Some(next) if found.len() < ours.len() => cursor = Some(next.to_owned()),
                _ => return Ok(found),
            }
        }
    }
}

fn text(value: &Value, what: &str, envelope: &Value) -> Result<String, String> {
    value
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("expected {what}: {envelope}"))
}

/// The process's resident memory in KiB (0 where `/proc` has none).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                let kib = line.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?;
                kib.trim().parse().ok()
            })
        })
        .unwrap_or(0)
}

/// The sum over every label set of the gauge `name` in the metrics `text`.
fn gauge_total(text: &str, name: &str) -> u64 {
    let total: f64 = text
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let value = match rest.strip_prefix('{') {
                Some(labelled) => labelled.split_once('}')?.1,
                None => rest.strip_prefix(' ')?,
            };
            value.trim().parse::<f64>().ok()
        })
        .sum();
    total.max(0.0).round() as u64
}

/// Polls until `done` holds or `limit` passes.
async fn until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn per_second(count: usize, elapsed: Duration) -> f64 {
    (count as f64 / elapsed.as_secs_f64().max(1e-9)).round()
}

pub(super) async fn bench(config: Config, args: &RunsArgs) -> Result<(), String> {
    let store = if config.database_url.is_some() {
        "postgres"
    } else {
        "sqlite"
    };
    let broker = if config.broker_url.is_some() {
        "rabbitmq"
    } else {
        "in-process"
    };
    let (release, released) = watch::channel(false);
    let tools = vec![hold_tool(released), ask_tool()];
    let local = Local::start(config, tools, args.common.concurrency).await?;
    let outcome = measure(&local, &release, args.runs, &args.common).await;
    // Whatever happened, no job holds the server's stop.
    release.send_replace(true);
    let stopped = local.stop().await;
    let (parked, memory, slots, resume) = outcome?;
    stopped?;
    let report = Report {
        runs: args.runs,
        clients: args.common.clients,
        concurrency: args.common.concurrency,
        store,
        broker,
        park: parked,
        memory,
        slots,
        resume,
    };
    if args.common.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        print!("{}", render_text(&report));
    }
    Ok(())
}

/// Parks `runs` runs, measures them waiting, then resumes them.
async fn measure(
    local: &Local,
    release: &watch::Sender<bool>,
    runs: usize,
    common: &Common,
) -> Result<(Park, Memory, Slots, Resume), String> {
    let client = Arc::new(Client {
        http: toolfleet_executors::http_client()?,
        base: local.base.clone(),
        token: local.token.clone(),
    });
    let metrics = local.served.runtime.metrics().clone();
    let gauge = move |name: &str| gauge_total(&metrics.render(), name);

    // Subscribed once the answer's head arrives: no event after is missed.
    let states = "succeeded,failed,cancelled,run_resumed";
    let mut events = client
        .http
        .get(format!("{}/v1/events?state={states}", client.base))
        .bearer_auth(&client.token)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !events.status().is_success() {
        return Err(format!("/v1/events answered {}", events.status()));
    }
    let seen = Arc::new(Mutex::new(Heard::default()));
    let follower = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let read = read_events(&mut events, |event| {
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                match (&*event.kind, &*event.state) {
                    ("run", "run_resumed") => {
                        let now = Instant::now();
                        seen.resumed.entry(event.id.into_owned()).or_insert(now);
                    }
                    ("job", _) => {
                        seen.settled_jobs.insert(event.id.into_owned());
                    }
                    _ => {}
                }
            })
            .await;
            if let Err(error) = read {
                eprintln!("toolfleet bench: the event stream failed: {error}");
            }
        })
    };
    let outcome = phases(&client, &gauge, &seen, release, runs, common).await;
    follower.abort();
    outcome
}

async fn phases(
    client: &Arc<Client>,
    gauge: &impl Fn(&str) -> u64,
    seen: &Arc<Mutex<Heard>>,
    release: &watch::Sender<bool>,
    runs: usize,
    common: &Common,
) -> Result<(Park, Memory, Slots, Resume), String> {
    let lock = || seen.lock().unwrap_or_else(|e| e.into_inner());
    let rss_before_kib = rss_kib();

    // Park every run.
    let begun = Instant::now();
    let mut parking = spawn_bounded(runs, common.clients, |i| {
        let client = client.clone();
        async move { client.park(i).await }
    })
    .await?;
    let mut parked = Vec::with_capacity(runs);
    while let Some(one) = parking.join_next().await {
        parked.push(one.map_err(|e| e.to_string())??);
    }
    let park_took = begun.elapsed();
    let park = Park {
        parked: parked.len(),
        seconds: (park_took.as_secs_f64() * 1000.0).round() / 1000.0,
        runs_per_second: per_second(parked.len(), park_took),
        run_to_waiting_ms: percentiles(parked.iter().map(|p| p.took).collect()),
    };

    // Waiting, the jobs held: as many busy slots as jobs could start.
    let running = runs.min(common.concurrency) as u64;
    until(Duration::from_secs(5), || {
        gauge("toolfleet_worker_busy_slots") >= running
    })
    .await;
    let busy_with_jobs_held = gauge("toolfleet_worker_busy_slots");
    let worker_slots = gauge("toolfleet_worker_slots");
    let rss_parked_kib = rss_kib();

    // The jobs released: each run waits on its ticket alone.
    release.send_replace(true);
    let jobs: HashSet<&str> = parked.iter().map(|p| p.job.as_str()).collect();
    let all_settled = || {
        let seen = lock();
        jobs.iter().all(|job| seen.settled_jobs.contains(*job))
    };
    until(PATIENCE, all_settled).await;
    let jobs_settled = {
        let seen = lock();
        jobs.iter()
            .filter(|job| seen.settled_jobs.contains(**job))
            .count()
    };
    // A slot is given back just after its job's settled event goes out.
    until(Duration::from_secs(5), || {
        gauge("toolfleet_worker_busy_slots") == 0
    })
    .await;
    let busy_waiting_on_tickets = gauge("toolfleet_worker_busy_slots");
    let jobs_in_flight_waiting_on_tickets = gauge("toolfleet_worker_jobs_in_flight");
    let ours: HashSet<&str> = parked.iter().map(|p| p.run.as_str()).collect();
    let waiting_after_jobs = client.listed("waiting", &ours).await?.len();
    let rss_waiting_on_tickets_kib = rss_kib();

    // Every ticket answered, each answer's time noted before it is sent.
    let answered_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let begun = Instant::now();
    let shared: Arc<Vec<Parked>> = Arc::new(parked.clone());
    let mut answering = spawn_bounded(runs, common.clients, |i| {
        let (client, shared, answered_at) = (client.clone(), shared.clone(), answered_at.clone());
        async move {
            let one = &shared[i];
            answered_at
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(one.run.clone(), Instant::now());
            let path = format!("/v1/tickets/{}/answer", one.ticket);
            client
                .post(&path, json!({"answer": "yes"}))
                .await
                .map(|_| ())
        }
    })
    .await?;
    let mut answered = 0;
    while let Some(one) = answering.join_next().await {
        one.map_err(|e| e.to_string())??;
        answered += 1;
    }
    let answer_took = begun.elapsed();
    until(PATIENCE, || {
        let seen = lock();
        ours.iter().all(|run| seen.resumed.contains_key(*run))
    })
    .await;
    let answered_at = answered_at
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let (mut latencies, mut early, mut last) = (Vec::new(), 0, begun);
    {
        let seen = lock();
        for run in &ours {
            let (Some(resumed), Some(sent)) = (seen.resumed.get(*run), answered_at.get(*run))
            else {
                continue;
            };
            if resumed < sent {
                early += 1;
            } else {
                latencies.push(resumed.saturating_duration_since(*sent));
                last = last.max(*resumed);
            }
        }
    }
    let resumed_listed = client
        .listed("running", &ours)
        .await?
        .iter()
        .filter(|run| {
            run["resumed"]["items"]
                .as_array()
                .is_some_and(|i| i.len() == 2)
        })
        .count();
    let rss_resumed_kib = rss_kib();
    let resume = Resume {
        jobs_settled,
        waiting_after_jobs,
        answered,
        resumed: latencies.len(),
        resumed_before_answer: early,
        resumed_listed,
        answer_seconds: (answer_took.as_secs_f64() * 1000.0).round() / 1000.0,
        answers_per_second: per_second(answered, answer_took),
        resumed_runs_per_second: per_second(latencies.len(), last.saturating_duration_since(begun)),
        answer_to_resumed_ms: percentiles(latencies),
    };
    let memory = Memory {
        rss_before_kib,
        rss_parked_kib,
        rss_waiting_on_tickets_kib,
        rss_resumed_kib,
        parked_bytes_per_run: rss_parked_kib.saturating_sub(rss_before_kib) * 1024
            / runs.max(1) as u64,
    };
    let slots = Slots {
        worker_slots,
        busy_with_jobs_held,
        busy_waiting_on_tickets,
        jobs_in_flight_waiting_on_tickets,
    };
    Ok((park, memory, slots, resume))
}

/// The report as text, as `toolfleet bench runs` prints it.
fn render_text(report: &Report) -> String {
    let p = |l: &Option<Latency>| match l {
        Some(l) => format!("p50 {} / p95 {} / p99 {} ms", l.p50, l.p95, l.p99),
        None => "no samples".to_owned(),
    };
    let mib = |kib: u64| format!("{:.1} MiB", kib as f64 / 1024.0);
    let (park, memory, slots, resume) =
        (&report.park, &report.memory, &report.slots, &report.resume);
    format!(
        "runs: {} parked of {} on a job and a ticket each ({} clients, {} slots per pool; {}, {} queue)\n  \
         park: {} s ({} runs/s); run to waiting: {}\n  \
         memory (RSS): {} before, {} parked ({} bytes a run), {} waiting on tickets, {} resumed\n  \
         worker slots: {} busy of {} with the jobs held; {} busy ({} jobs in flight) waiting on tickets\n  \
         resume: {} jobs settled, {} runs still waiting; {} answered in {} s ({} answers/s)\n  \
         resumed: {} ({} runs/s; {} before their answer), {} listed running with both items\n  \
         answer to resumed: {}\n",
        park.parked,
        report.runs,
        report.clients,
        report.concurrency,
        report.store,
        report.broker,
        park.seconds,
        park.runs_per_second,
        p(&park.run_to_waiting_ms),
        mib(memory.rss_before_kib),
        mib(memory.rss_parked_kib),
        memory.parked_bytes_per_run,
        mib(memory.rss_waiting_on_tickets_kib),
        mib(memory.rss_resumed_kib),
        slots.busy_with_jobs_held,
        slots.worker_slots,
        slots.busy_waiting_on_tickets,
        slots.jobs_in_flight_waiting_on_tickets,
        resume.jobs_settled,
        resume.waiting_after_jobs,
        resume.answered,
        resume.answer_seconds,
        resume.answers_per_second,
        resume.resumed,
        resume.resumed_runs_per_second,
        resume.resumed_before_answer,
        resume.resumed_listed,
        p(&resume.answer_to_resumed_ms),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_are_summed_over_their_labels() {
        let text = "# HELP toolfleet_worker_busy_slots Worker slots\n\
                    # TYPE toolfleet_worker_busy_slots gauge\n\
                    toolfleet_worker_busy_slots{pool=\"default\"} 3\n\
                    toolfleet_worker_busy_slots{pool=\"agents\"} 2\n\
                    toolfleet_worker_slots{pool=\"default\"} 64\n\
                    toolfleet_up 1\n";
        assert_eq!(gauge_total(text, "toolfleet_worker_busy_slots"), 5);
        assert_eq!(gauge_total(text, "toolfleet_worker_slots"), 64);
        assert_eq!(gauge_total(text, "toolfleet_up"), 1);
        assert_eq!(gauge_total(text, "toolfleet_worker"), 0);
    }

    #[test]
    fn rss_is_read_from_proc() {
        if std::path::Path::new("/proc/self/status").exists() {
            assert!(rss_kib() > 0);
        }
    }
}
