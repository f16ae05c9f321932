//! `toolfleet bench`: no-op jobs through the real HTTP path, measured the same
//! way by everyone. It starts a server in this process on the configured
//! backends (with a temporary data directory on the embedded default), adds
//! the no-op job tool, and drives it over HTTP: a burn-down of N jobs as fast
//! as C clients can call, then, with `--rate`, calls at a fixed rate.
//!
//! Latencies: call to `running` is the POST round trip; call to settled is
//! the time from the call to the job's settled event on `/v1/events` (one
//! SSE stream, read as the events arrive). Fixed-rate calls are issued on
//! schedule whatever the server does, so a slow server cannot hide its delay.
//!
//! `toolfleet bench runs` ([`runs`]) parks runs a caller drives on jobs and
//! tickets instead, and measures them waiting and resuming.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use toolfleet_core::{CallCtx, ToolDecl, ToolError};

mod runs;

use crate::config::Config;
use crate::keys::DEV_TOKEN_FILE;
use crate::serve::{Roles, Served, start};

/// The no-op job every run measures.
const NOOP: &str = "bench_noop";

#[derive(clap::Args, Clone)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct BenchArgs {
    /// What to measure instead of the no-op jobs' burn-down.
    #[command(subcommand)]
    mode: Option<BenchMode>,
    /// Jobs of the burn-down.
    #[arg(long, short = 'n', default_value_t = 5000)]
    jobs: usize,
    /// Calls per second of the fixed-rate run (none: burn-down only).
    #[arg(long)]
    rate: Option<u32>,
    /// Seconds of the fixed-rate run.
    #[arg(long, default_value_t = 10)]
    secs: u64,
    #[command(flatten)]
    common: Common,
    /// Drive running dispatchers instead of a server in this process (repeat
    /// for several; calls go round-robin, events are read from the first).
    /// Their configuration must declare a no-op job tool, for example with
    /// the builtin executor `toolfleet.noop`.
    #[arg(long = "server")]
    servers: Vec<String>,
    /// The bearer token for `--server`.
    #[arg(long, env = "TOOLFLEET_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The no-op job tool to call.
    #[arg(long, default_value = NOOP)]
    tool: String,
}

/// The flags every bench takes.
#[derive(clap::Args, Clone)]
struct Common {
    /// Concurrent HTTP clients.
    #[arg(long, short = 'c', default_value_t = 32)]
    clients: usize,
    /// Worker slots per pool of the server in this process.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Print the results as one JSON object instead of text, units in the
    /// field names (see the README's Benchmarks).
    #[arg(long)]
    json: bool,
}

#[derive(clap::Subcommand, Clone)]
enum BenchMode {
    /// Park runs a caller drives, each on a job and a ticket, then release
    /// the jobs, answer the tickets and measure the resumes.
    Runs(RunsArgs),
}

#[derive(clap::Args, Clone)]
struct RunsArgs {
    /// Runs to park and resume.
    #[arg(long, short = 'n', default_value_t = 1000)]
    runs: usize,
    #[command(flatten)]
    common: Common,
}

fn noop_tool() -> ToolDecl {
    ToolDecl::job(NOOP)
        .description("Does nothing; measures the job pipeline.")
        .idempotent(true)
        .destructive(false)
        .run(|_: CallCtx, _: Value| async { Ok::<_, ToolError>(json!({})) })
}

/// What the bench reads of an event on `/v1/events`.
#[derive(serde::Deserialize)]
struct Seen<'a> {
    #[serde(borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    id: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    state: std::borrow::Cow<'a, str>,
}

/// Latency percentiles of one series, in milliseconds.
#[derive(Serialize, Debug, Clone, PartialEq)]
struct Latency {
    p50: f64,
    p95: f64,
    p99: f64,
    max: f64,
    /// Samples measured.
    count: usize,
}

/// The percentiles of `samples` (none: no sample).
fn percentiles(mut samples: Vec<Duration>) -> Option<Latency> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_unstable();
    let at = |p: f64| {
        let i = ((samples.len() as f64 * p).ceil() as usize).clamp(1, samples.len()) - 1;
        (samples[i].as_secs_f64() * 1e5).round() / 100.0
    };
    Some(Latency {
        p50: at(0.50),
        p95: at(0.95),
        p99: at(0.99),
        max: at(1.0),
        count: samples.len(),
    })
}

/// The burn-down: `jobs` calls as fast as `clients` clients can make them.
#[derive(Serialize, Debug, Clone, PartialEq)]
struct BurnDown {
    jobs: usize,
    clients: usize,
    /// Jobs whose settled event arrived.
    settled: usize,
    /// Calls answered `running`, per second of calling.
    calls_per_second: f64,
    /// Jobs settled end to end, per second from the first call to the last
    /// settled event.
    jobs_per_second: f64,
    /// Processor time of this process (user and system) per settled job,
    /// in microseconds: the server's and the bench's own clients' when the
    /// server runs in this process, the clients' alone with `--server`.
    /// Steadier than throughput on a shared machine, so builds compare by
    /// it; the backends' servers (PostgreSQL, RabbitMQ) are not in it.
    process_cpu_us_per_job: Option<f64>,
    call_to_running_ms: Option<Latency>,
    call_to_settled_ms: Option<Latency>,
}

/// Processor time this process has used, user and system, or `None` where
/// the system does not say.
fn process_cpu() -> Option<Duration> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the rusage it is pointed at, which lives
    // (zeroed) for the call; it is read only when the call succeeded.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return None;
        }
        usage.assume_init()
    };
    let time = |t: libc::timeval| {
        let secs = u64::try_from(t.tv_sec).ok()?;
        let micros = u64::try_from(t.tv_usec).ok()?;
        Some(Duration::from_secs(secs) + Duration::from_micros(micros))
    };
    Some(time(usage.ru_utime)? + time(usage.ru_stime)?)
}

/// Microseconds of `used` per job of `jobs`, to a tenth; `None` without
/// a reading or a job.
fn per_job(used: Option<Duration>, jobs: usize) -> Option<f64> {
    let used = used?;
    (jobs > 0).then(|| (used.as_secs_f64() * 1e7 / jobs as f64).round() / 10.0)
}

/// The fixed-rate run: calls on schedule whatever the server does.
#[derive(Serialize, Debug, Clone, PartialEq)]
struct FixedRate {
    /// The schedule's calls per second.
    target_calls_per_second: u32,
    duration_seconds: u64,
    jobs: usize,
    settled: usize,
    call_to_running_ms: Option<Latency>,
    call_to_settled_ms: Option<Latency>,
}

/// Everything one `toolfleet bench` measured: what `--json` prints.
#[derive(Serialize, Debug, Clone, PartialEq)]
struct Report {
    /// The dispatchers called (the one in this process, without `--server`).
    servers: Vec<String>,
    /// Whether the server ran in this process.
    in_process: bool,
    tool: String,
    burn_down: BurnDown,
    /// Absent without `--rate`.
    fixed_rate: Option<FixedRate>,
}

#[derive(Default)]
struct Pending {
    /// Call start times of jobs whose settled event has not arrived.
    started: HashMap<String, Instant>,
    /// Settled times of jobs whose call has not returned.
    settled: HashMap<String, Instant>,
}

struct Probe {
    http: reqwest::Client,
    /// Dispatchers, called round-robin; events are read from the first.
    bases: Vec<String>,
    next: std::sync::atomic::AtomicUsize,
    tool: String,
    token: String,
    /// Whichever of a job's call and settled event comes first waits here
    /// for the other; one lock, so the two can never miss each other.
    pending: Mutex<Pending>,
    settled: Mutex<Vec<(Instant, Duration)>>,
}

/// Reads the Server-Sent Events of `response` until it ends, handing each
/// event's data to `on` as it arrives.
async fn read_events(
    response: &mut reqwest::Response,
    mut on: impl FnMut(Seen<'_>),
) -> Result<(), String> {
    let mut text = String::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
        text.push_str(&String::from_utf8_lossy(&chunk));
        // Each whole block is read in place; they leave the buffer together.
        let mut read = 0;
        while let Some(end) = text[read..].find("\n\n") {
            let block = &text[read..read + end];
            read += end + 2;
            let Some(data) = block.lines().find_map(|l| l.strip_prefix("data: ")) else {
                continue;
            };
            // Only what is needed: the rest of the event (its envelope)
            // is skipped, not built, so the client spends little of the
            // processor time it shares with the fleet.
            if let Ok(event) = serde_json::from_str::<Seen>(data) {
                on(event);
            }
        }
        text.drain(..read);
    }
    Ok(())
}

/// Spawns `count` tasks of `task`, at most `clients` at once; answers as
/// soon as the last is spawned.
async fn spawn_bounded<T, F, Fut>(
    count: usize,
    clients: usize,
    task: F,
) -> Result<tokio::task::JoinSet<Result<T, String>>, String>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<T, String>> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(clients.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..count {
        let permit = slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| e.to_string())?;
        let running = task(i);
        tasks.spawn(async move {
            let outcome = running.await;
            drop(permit);
            outcome
        });
    }
    Ok(tasks)
}

impl Probe {
    /// One call; the call-to-`running` latency.
    async fn call(&self) -> Result<Duration, String> {
        let begun = Instant::now();
        let body = json!({"tool": self.tool, "args": {}}).to_string();
        let turn = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let base = &self.bases[turn % self.bases.len()];
        let response = self
            .http
            .post(format!("{base}/v1/calls"))
            .bearer_auth(&self.token)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let text = response.text().await.map_err(|e| e.to_string())?;
        let took = begun.elapsed();
        let envelope: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let job_id = envelope["job_id"]
            .as_str()
            .ok_or_else(|| format!("not running: {text}"))?
            .to_owned();
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        // The settled event may already have arrived.
        match pending.settled.remove(&job_id) {
            Some(at) => self.record(at, at.saturating_duration_since(begun)),
            None => {
                pending.started.insert(job_id, begun);
            }
        }
        Ok(took)
    }

    fn record(&self, at: Instant, latency: Duration) {
        self.settled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((at, latency));
    }

    fn settled_count(&self) -> usize {
        self.settled.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Reads `/v1/events` and records each settled job.
    async fn follow(self: Arc<Self>) -> Result<(), String> {
        let mut response = self
            .http
            // Outcomes alone: what the bench reads, and on RabbitMQ all
            // that is routed to a dispatcher for it.
            .get(format!(
                "{}/v1/events?state={}",
                self.bases[0],
                toolfleet_core::JobState::SETTLED
                    .map(|s| s.as_str())
                    .join(",")
            ))
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        read_events(&mut response, |event| {
            let settled = toolfleet_core::JobState::parse(&event.state)
                .is_some_and(toolfleet_core::JobState::is_settled);
            if event.kind != "job" || !settled {
                return;
            }
            let now = Instant::now();
            let id = event.id.into_owned();
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            match pending.started.remove(&id) {
                Some(begun) => self.record(now, now.saturating_duration_since(begun)),
                None => {
                    pending.settled.insert(id, now);
                }
            }
        })
        .await
    }

    async fn wait_settled(&self, count: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.settled_count() < count && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits for `calls` and for their `count` jobs to settle; answers the
    /// call-to-`running` latencies and the settlements recorded after `before`.
    async fn gather(
        &self,
        mut calls: tokio::task::JoinSet<Result<Duration, String>>,
        before: usize,
        count: usize,
    ) -> Result<(Vec<Duration>, Vec<(Instant, Duration)>), String> {
        let mut accepted = Vec::with_capacity(count);
        while let Some(took) = calls.join_next().await {
            accepted.push(took.map_err(|e| e.to_string())??);
        }
        self.wait_settled(before + count, Duration::from_secs(120))
            .await;
        let settled = self
            .settled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .split_off(before);
        Ok((accepted, settled))
    }
}

/// Runs the burn-down: `jobs` calls from `clients` clients.
async fn burn_down(probe: &Arc<Probe>, jobs: usize, clients: usize) -> Result<BurnDown, String> {
    let before = probe.settled_count();
    let cpu_before = process_cpu();
    let begun = Instant::now();
    let calls = spawn_bounded(jobs, clients, |_| {
        let probe = probe.clone();
        async move { probe.call().await }
    })
    .await?;
    let (accepted, all) = probe.gather(calls, before, jobs).await?;
    let cpu = process_cpu()
        .zip(cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    let called = begun.elapsed();
    let last = all.iter().map(|(at, _)| *at).max().unwrap_or(begun);
    let elapsed = last
        .saturating_duration_since(begun)
        .as_secs_f64()
        .max(1e-9);
    Ok(BurnDown {
        jobs,
        clients,
        settled: all.len(),
        calls_per_second: (jobs as f64 / called.as_secs_f64().max(1e-9)).round(),
        jobs_per_second: (all.len() as f64 / elapsed).round(),
        process_cpu_us_per_job: per_job(cpu, all.len()),
        call_to_running_ms: percentiles(accepted),
        call_to_settled_ms: percentiles(all.into_iter().map(|(_, l)| l).collect()),
    })
}

/// Calls at `rate` per second for `secs` seconds, on schedule.
async fn fixed_rate(probe: &Arc<Probe>, rate: u32, secs: u64) -> Result<FixedRate, String> {
    let before = probe.settled_count();
    let total = rate as usize * secs as usize;
    let period = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let begun = tokio::time::Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..total {
        tokio::time::sleep_until(begun + period * i as u32).await;
        let probe = probe.clone();
        calls.spawn(async move { probe.call().await });
    }
    let (accepted, all) = probe.gather(calls, before, total).await?;
    Ok(FixedRate {
        target_calls_per_second: rate,
        duration_seconds: secs,
        jobs: total,
        settled: all.len(),
        call_to_running_ms: percentiles(accepted),
        call_to_settled_ms: percentiles(all.into_iter().map(|(_, l)| l).collect()),
    })
}

/// The report as text, as `toolfleet bench` prints it.
fn render_text(report: &Report) -> String {
    let p = |l: &Option<Latency>| match l {
        Some(l) => format!("p50 {} / p95 {} / p99 {} ms", l.p50, l.p95, l.p99),
        None => "no samples".to_owned(),
    };
    let b = &report.burn_down;
    let mut text = format!(
        "burn-down: {} jobs, {} settled\n  settled end to end: {} jobs/s (calls accepted at {} /s)\n  call to running: {}\n  call to settled: {}\n",
        b.jobs,
        b.settled,
        b.jobs_per_second,
        b.calls_per_second,
        p(&b.call_to_running_ms),
        p(&b.call_to_settled_ms),
    );
    if let Some(cpu) = b.process_cpu_us_per_job {
        let whose = if report.in_process {
            "server and clients"
        } else {
            "clients"
        };
        text.push_str(&format!(
            "  processor time of this process ({whose}): {cpu} us per job\n"
        ));
    }
    if let Some(f) = &report.fixed_rate {
        text.push_str(&format!(
            "fixed-rate: {} jobs ({} calls/s for {} s), {} settled\n  call to running: {}\n  call to settled: {}\n",
            f.jobs,
            f.target_calls_per_second,
            f.duration_seconds,
            f.settled,
            p(&f.call_to_running_ms),
            p(&f.call_to_settled_ms),
        ));
    }
    text
}

/// The report as one JSON object, as `toolfleet bench --json` prints it.
fn render_json(report: &Report) -> String {
    serde_json::to_string_pretty(report).unwrap_or_default()
}

/// A server in this process, on the configured backends with a temporary
/// data directory, and the development token it made.
struct Local {
    served: Served,
    data: PathBuf,
    base: String,
    token: String,
}

impl Local {
    async fn start(
        mut config: Config,
        tools: Vec<ToolDecl>,
        concurrency: usize,
    ) -> Result<Local, String> {
        let data =
            std::env::temp_dir().join(format!("toolfleet-bench-{}", uuid::Uuid::now_v7().simple()));
        config.data_dir = PathBuf::from(&data);
        config.listen = "127.0.0.1:0".to_owned();
        config.auth.tokens.clear();
        config.concurrency = concurrency;
        let served = match start(config, tools, Roles::all()).await {
            Ok(served) => served,
            Err(error) => {
                let _ = std::fs::remove_dir_all(&data);
                return Err(error);
            }
        };
        let found = served
            .address
            .ok_or_else(|| "the bench server has no address".to_owned())
            .and_then(|address| {
                let token = std::fs::read_to_string(data.join(DEV_TOKEN_FILE))
                    .map_err(|e| e.to_string())?;
                Ok((format!("http://{address}"), token.trim().to_owned()))
            });
        let local = Local {
            served,
            data,
            base: String::new(),
            token: String::new(),
        };
        match found {
            Ok((base, token)) => Ok(Local {
                base,
                token,
                ..local
            }),
            Err(error) => {
                let _ = local.stop().await;
                Err(error)
            }
        }
    }

    /// Stops the server and removes its data directory.
    async fn stop(self) -> Result<(), String> {
        let stopped = self.served.stop().await;
        let _ = std::fs::remove_dir_all(&self.data);
        stopped
    }
}

pub(crate) async fn bench(config: Config, args: BenchArgs) -> Result<(), String> {
    if let Some(BenchMode::Runs(mode)) = &args.mode {
        return runs::bench(config, mode).await;
    }
    let report = if args.servers.is_empty() {
        let local = Local::start(config, vec![noop_tool()], args.common.concurrency).await?;
        let outcome = run(vec![local.base.clone()], local.token.clone(), &args).await;
        let stopped = local.stop().await;
        let mut report = outcome?;
        stopped?;
        report.in_process = true;
        report
    } else {
        let token = args
            .token
            .clone()
            .ok_or("--server needs --token (or TOOLFLEET_TOKEN)")?;
        let bases = args
            .servers
            .iter()
            .map(|s| s.trim_end_matches('/').to_owned())
            .collect();
        run(bases, token, &args).await?
    };
    if args.common.json {
        println!("{}", render_json(&report));
    } else {
        print!("{}", render_text(&report));
    }
    Ok(())
}

async fn run(bases: Vec<String>, token: String, args: &BenchArgs) -> Result<Report, String> {
    let probe = Arc::new(Probe {
        http: toolfleet_executors::http_client()?,
        bases: bases.clone(),
        next: std::sync::atomic::AtomicUsize::new(0),
        tool: args.tool.clone(),
        token,
        pending: Mutex::default(),
        settled: Mutex::default(),
    });
    let follower = probe.clone();
    tokio::spawn(async move {
        if let Err(error) = follower.follow().await {
            eprintln!("toolfleet bench: the event stream failed: {error}");
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A short warm-up, so connection set-up is not measured.
    burn_down(&probe, 200.min(args.jobs), args.common.clients).await?;
    let burn_down = burn_down(&probe, args.jobs, args.common.clients).await?;
    let fixed_rate = match args.rate {
        Some(rate) => Some(fixed_rate(&probe, rate, args.secs).await?),
        None => None,
    };
    Ok(Report {
        servers: bases,
        in_process: false,
        tool: args.tool.clone(),
        burn_down,
        fixed_rate,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(values: impl IntoIterator<Item = u64>) -> Vec<Duration> {
        values.into_iter().map(Duration::from_millis).collect()
    }

    fn report(fixed_rate: bool) -> Report {
        let latency = percentiles(ms(1..=100));
        Report {
            servers: vec!["http://127.0.0.1:8080".to_owned()],
            in_process: true,
            tool: NOOP.to_owned(),
            burn_down: BurnDown {
                jobs: 100,
                clients: 4,
                settled: 100,
                calls_per_second: 2000.0,
                jobs_per_second: 1500.0,
                process_cpu_us_per_job: Some(412.5),
                call_to_running_ms: latency.clone(),
                call_to_settled_ms: percentiles(ms([7])),
            },
            fixed_rate: fixed_rate.then_some(FixedRate {
                target_calls_per_second: 50,
                duration_seconds: 2,
                jobs: 100,
                settled: 99,
                call_to_running_ms: latency,
                call_to_settled_ms: None,
            }),
        }
    }

    fn keys(value: &Value) -> Vec<&str> {
        let mut keys: Vec<&str> = value
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        keys
    }

    #[test]
    fn percentiles_are_nearest_rank_in_milliseconds() {
        let latency = percentiles(ms(1..=100)).unwrap();
        assert_eq!(
            latency,
            Latency {
                p50: 50.0,
                p95: 95.0,
                p99: 99.0,
                max: 100.0,
                count: 100,
            }
        );
        let one = percentiles(vec![Duration::from_micros(1234)]).unwrap();
        assert_eq!(
            (one.p50, one.p99, one.max, one.count),
            (1.23, 1.23, 1.23, 1)
        );
        assert_eq!(percentiles(Vec::new()), None);
    }

    #[test]
    fn json_is_one_object_with_units_in_its_field_names() {
        let value: Value = serde_json::from_str(&render_json(&report(true))).unwrap();
        assert_eq!(
            keys(&value),
            ["burn_down", "fixed_rate", "in_process", "servers", "tool"]
        );
        assert_eq!(value["servers"], json!(["http://127.0.0.1:8080"]));
        assert_eq!(value["in_process"], true);
        assert_eq!(value["tool"], NOOP);

        let burn_down = &value["burn_down"];
        assert_eq!(
            keys(burn_down),
            [
                "call_to_running_ms",
                "call_to_settled_ms",
                "calls_per_second",
                "clients",
                "jobs",
                "jobs_per_second",
                "process_cpu_us_per_job",
                "settled",
            ]
        );
        assert_eq!(burn_down["process_cpu_us_per_job"], 412.5);
        assert_eq!(burn_down["jobs"], 100);
        assert_eq!(burn_down["clients"], 4);
        assert_eq!(burn_down["settled"], 100);
        assert_eq!(burn_down["calls_per_second"], 2000.0);
        assert_eq!(burn_down["jobs_per_second"], 1500.0);
        assert_eq!(
            burn_down["call_to_running_ms"],
            json!({"p50": 50.0, "p95": 95.0, "p99": 99.0, "max": 100.0, "count": 100})
        );
        assert_eq!(
            burn_down["call_to_settled_ms"],
            json!({"p50": 7.0, "p95": 7.0, "p99": 7.0, "max": 7.0, "count": 1})
        );

        let fixed = &value["fixed_rate"];
        assert_eq!(
            keys(fixed),
            [
                "call_to_running_ms",
                "call_to_settled_ms",
                "duration_seconds",
                "jobs",
                "settled",
                "target_calls_per_second",
            ]
        );
        assert_eq!(fixed["target_calls_per_second"], 50);
        assert_eq!(fixed["duration_seconds"], 2);
        assert_eq!(fixed["settled"], 99);
        assert_eq!(fixed["call_to_running_ms"]["p99"], 99.0);
        assert_eq!(fixed["call_to_settled_ms"], Value::Null);

        let without_rate: Value = serde_json::from_str(&render_json(&report(false))).unwrap();
        assert_eq!(without_rate["fixed_rate"], Value::Null);
    }

    #[test]
    fn processor_time_is_read_and_shared_among_jobs() {
        let before = process_cpu().expect("getrusage answers");
        // Work that takes processor time (kept from being optimised away)
        // until the reading has grown by 20 ms; it must, well within 10 s
        // of work however busy the machine.
        let mut x = 0u64;
        let started = Instant::now();
        let mut used = Duration::ZERO;
        while used < Duration::from_millis(20) && started.elapsed() < Duration::from_secs(10) {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            used = process_cpu()
                .expect("getrusage answers")
                .saturating_sub(before);
        }
        assert!(
            used >= Duration::from_millis(20),
            "{used:?} after 10 s of work"
        );
        assert_eq!(per_job(Some(Duration::from_millis(5)), 4), Some(1250.0));
        assert_eq!(per_job(Some(Duration::from_micros(1)), 3), Some(0.3));
        assert_eq!(per_job(Some(Duration::from_millis(5)), 0), None);
        assert_eq!(per_job(None, 4), None);
    }

    #[test]
    fn text_carries_the_same_figures() {
        let text = render_text(&report(true));
        assert_eq!(
            text,
            "burn-down: 100 jobs, 100 settled\n  \
             settled end to end: 1500 jobs/s (calls accepted at 2000 /s)\n  \
             call to running: p50 50 / p95 95 / p99 99 ms\n  \
             call to settled: p50 7 / p95 7 / p99 7 ms\n  \
             processor time of this process (server and clients): 412.5 us per job\n\
             fixed-rate: 100 jobs (50 calls/s for 2 s), 99 settled\n  \
             call to running: p50 50 / p95 95 / p99 99 ms\n  \
             call to settled: no samples\n"
        );
        assert!(!render_text(&report(false)).contains("fixed-rate"));
    }
}
