//! Prometheus metrics of one process: one [`Metrics`] per process, shared as
//! an `Arc` and handed explicitly to whatever records (the runtime and its
//! middleware, the dispatcher's fleet, the workers, webhooks, agents and the
//! metered backends), one registry, rendered in the OpenMetrics text format
//! of the official client.
//!
//! Every label comes from a bounded set: `tool` is a registered tool name or
//! `unknown` ([`crate::Runtime::tool_label`]), `pool` a configured pool, and
//! the others ([`Denial`], [`Backend`], job states, token kinds, webhook
//! outcomes, error codes) from small fixed sets. The names are a contract
//! dashboards are built on: metrics may be added, never renamed.
//!
//! The state of the fleet at scrape time is read by the process that serves
//! `/metrics`, which sets it here just before rendering: `toolfleet_jobs`
//! from the store, by processes that dispatch only ([`Role::dispatches`]),
//! and `toolfleet_queue_depth`, RabbitMQ's count of the messages ready in
//! each pool queue the process works or dispatches to.
//!
//! `toolfleet_build_info` names the process's [`Role`], which is how
//! dashboards tell dispatchers from workers.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use crate::envelope::{Envelope, ErrorCode};
use crate::lifecycle::JobState;

/// The gauge type of [`PoolGauges`].
pub use prometheus_client::metrics::gauge::Gauge;

/// The content type `/metrics` answers with.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The label of a tool that is not registered, or not known yet.
pub const UNKNOWN_TOOL: &str = "unknown";

/// Why a call was refused: the `reason` of `toolfleet_denials_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Denial {
    /// No bearer token, or one that is not known.
    Unauthenticated,
    /// A scope the tool requires is missing, or the request is not allowed.
    Forbidden,
    /// Over the tool's rate limit.
    RateLimited,
}

impl Denial {
    /// The `reason` label of `toolfleet_denials_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Denial::Unauthenticated => "unauthenticated",
            Denial::Forbidden => "forbidden",
            Denial::RateLimited => "rate_limited",
        }
    }

    /// The denial an error code stands for, if it is one.
    pub fn of(code: ErrorCode) -> Option<Denial> {
        match code {
            ErrorCode::Unauthenticated => Some(Denial::Unauthenticated),
            ErrorCode::Forbidden => Some(Denial::Forbidden),
            ErrorCode::RateLimited => Some(Denial::RateLimited),
            _ => None,
        }
    }
}

/// A backend whose failures are counted: the `backend` of
/// `toolfleet_backend_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The job and ticket store.
    Store,
    /// The broker that hands jobs to workers.
    Broker,
    /// The notices that announce settled work.
    Notices,
}

impl Backend {
    /// Every backend, in label order.
    pub const ALL: [Backend; 3] = [Backend::Store, Backend::Broker, Backend::Notices];

    /// The `backend` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Store => "store",
            Backend::Broker => "broker",
            Backend::Notices => "notices",
        }
    }
}

/// What a process runs as: the `role` of `toolfleet_build_info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// `toolfleet dispatcher`: the HTTP API, webhooks and the sweeper.
    Dispatcher,
    /// `toolfleet worker`: workers of some pools, `/metrics` on `metrics_listen`.
    Worker,
    /// `toolfleet serve`: both in one process.
    Serve,
    /// `toolfleet mcp`: MCP over stdio with workers; it serves no `/metrics`.
    Mcp,
}

impl Role {
    /// Every role, in label order.
    pub const ALL: [Role; 4] = [Role::Dispatcher, Role::Worker, Role::Serve, Role::Mcp];

    /// The `role` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Dispatcher => "dispatcher",
            Role::Worker => "worker",
            Role::Serve => "serve",
            Role::Mcp => "mcp",
        }
    }

    /// Whether the process takes calls and dispatches jobs: only those
    /// report `toolfleet_jobs`.
    pub fn dispatches(self) -> bool {
        !matches!(self, Role::Worker)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabel {
    tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    tool: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DenialLabels {
    tool: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SettledLabels {
    tool: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabel {
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    tool: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabel {
    backend: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    role: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Inline calls take milliseconds, slow ones up to their timeout (30 s by
/// default). Long polls (`get_job` with `wait_s`) are not timed.
fn call_buckets() -> Histogram {
    Histogram::new([
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ])
}

/// From a few milliseconds on an idle fleet to an hour behind a backlog.
fn wait_buckets() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
        3600.0,
    ])
}

/// Jobs run up to their wall-time budget (15 min by default).
fn run_buckets() -> Histogram {
    Histogram::new([
        0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
    ])
}

/// The gauges of one worker pool in this process. Clones share their values.
#[derive(Clone, Debug)]
pub struct PoolGauges {
    /// Jobs claimed and running their executor.
    pub in_flight: Gauge,
    /// Slots holding a delivery (claiming, running, settling it).
    pub busy_slots: Gauge,
    /// Slots of the pool: its capacity.
    pub slots: Gauge,
    /// Messages its workers may hold unacknowledged: their prefetch.
    pub prefetch: Gauge,
}

/// The metrics of one process.
pub struct Metrics {
    registry: Registry,
    calls: Family<CallLabels, Counter>,
    call_duration: Histograms<ToolLabel>,
    validation_failures: Family<ToolLabel, Counter>,
    denials: Family<DenialLabels, Counter>,
    cache_hits: Family<ToolLabel, Counter>,
    cache_misses: Family<ToolLabel, Counter>,
    jobs_enqueued: Family<ToolLabel, Counter>,
    webhook_deliveries: Family<OutcomeLabel, Counter>,
    webhook_abandoned: Counter,
    jobs_started: Family<ToolLabel, Counter>,
    jobs_settled: Family<SettledLabels, Counter>,
    job_retries: Family<ToolLabel, Counter>,
    dead_letters: Family<PoolLabel, Counter>,
    job_queue_wait: Histograms<ToolLabel>,
    job_run: Histograms<ToolLabel>,
    worker_in_flight: Family<PoolLabel, Gauge>,
    worker_busy_slots: Family<PoolLabel, Gauge>,
    worker_slots: Family<PoolLabel, Gauge>,
    worker_prefetch: Family<PoolLabel, Gauge>,
    agent_steps: Family<ToolLabel, Counter>,
    agent_tokens: Family<TokenLabels, Counter>,
    backend_errors: Family<BackendLabel, Counter>,
    scrape_timeouts: Family<BackendLabel, Counter>,
    jobs: Family<StateLabel, Gauge>,
    queue_depth: Family<PoolLabel, Gauge>,
    role: Option<Role>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A registry of every toolfleet metric; series with fixed labels start
    /// at 0. Without a role: a runtime embedded in a program of its own
    /// (the `toolfleet` processes use [`Metrics::for_role`]).
    pub fn new() -> Metrics {
        Metrics::build(None)
    }

    /// The registry of a `toolfleet` process running as `role`.
    pub fn for_role(role: Role) -> Metrics {
        Metrics::build(Some(role))
    }

    /// The role this registry was made for, if any.
    pub fn role(&self) -> Option<Role> {
        self.role
    }

    fn build(role: Option<Role>) -> Metrics {
        let mut r = Registry::with_prefix("toolfleet");
        let m = Metrics {
            calls: Family::default(),
            call_duration: Family::new_with_constructor(call_buckets),
            validation_failures: Family::default(),
            denials: Family::default(),
            cache_hits: Family::default(),
            cache_misses: Family::default(),
            jobs_enqueued: Family::default(),
            webhook_deliveries: Family::default(),
            webhook_abandoned: Counter::default(),
            jobs_started: Family::default(),
            jobs_settled: Family::default(),
            job_retries: Family::default(),
            dead_letters: Family::default(),
            job_queue_wait: Family::new_with_constructor(wait_buckets),
            job_run: Family::new_with_constructor(run_buckets),
            worker_in_flight: Family::default(),
            worker_busy_slots: Family::default(),
            worker_slots: Family::default(),
            worker_prefetch: Family::default(),
            agent_steps: Family::default(),
            agent_tokens: Family::default(),
            backend_errors: Family::default(),
            scrape_timeouts: Family::default(),
            jobs: Family::default(),
            queue_depth: Family::default(),
            role,
            registry: Registry::default(),
        };
        r.register(
            "calls",
            "Tool calls through the call path, by tool and outcome (envelope status, or error code)",
            m.calls.clone(),
        );
        r.register_with_unit(
            "call_duration",
            "Time of a call through the call path (validation, middleware, the shape's contract); long polls (get_job with wait_s > 0) are counted in calls, not timed",
            Unit::Seconds,
            m.call_duration.clone(),
        );
        r.register(
            "validation_failures",
            "Calls whose arguments did not match the tool's schema",
            m.validation_failures.clone(),
        );
        r.register(
            "denials",
            "Calls and requests refused: unauthenticated, forbidden (scope or origin), rate_limited",
            m.denials.clone(),
        );
        r.register(
            "cache_hits",
            "Calls answered by the read cache",
            m.cache_hits.clone(),
        );
        r.register(
            "cache_misses",
            "Calls of cached tools the read cache could not answer",
            m.cache_misses.clone(),
        );
        r.register(
            "jobs_enqueued",
            "Jobs recorded and handed to the fleet (an idempotent repeat is not a new job)",
            m.jobs_enqueued.clone(),
        );
        r.register(
            "webhook_deliveries",
            "Webhook attempts, by outcome (delivered: a 2xx answer; refused: the allow-list refuses the callback now; failed: anything else)",
            m.webhook_deliveries.clone(),
        );
        r.register(
            "webhook_abandoned",
            "Webhooks given up: after their last attempt, or refused by the allow-list",
            m.webhook_abandoned.clone(),
        );
        r.register(
            "jobs_started",
            "Job attempts a worker claimed and started",
            m.jobs_started.clone(),
        );
        r.register(
            "jobs_settled",
            "Jobs a worker saw reach a final state: succeeded, failed or cancelled",
            m.jobs_settled.clone(),
        );
        r.register(
            "job_retries",
            "Failed attempts a worker scheduled for another try",
            m.job_retries.clone(),
        );
        r.register(
            "dead_letters",
            "Dead letters: messages a worker could not process, and jobs failed because the broker gave up delivering them",
            m.dead_letters.clone(),
        );
        r.register_with_unit(
            "job_queue_wait",
            "Time from when a job became runnable to when a worker claimed it",
            Unit::Seconds,
            m.job_queue_wait.clone(),
        );
        r.register_with_unit(
            "job_run",
            "Time a job attempt ran its executor",
            Unit::Seconds,
            m.job_run.clone(),
        );
        r.register(
            "worker_jobs_in_flight",
            "Jobs running their executor on this process's workers",
            m.worker_in_flight.clone(),
        );
        r.register(
            "worker_busy_slots",
            "Worker slots running a job (busy ratio: busy_slots / slots)",
            m.worker_busy_slots.clone(),
        );
        r.register(
            "worker_slots",
            "Worker slots: jobs a pool runs at once in this process",
            m.worker_slots.clone(),
        );
        r.register(
            "worker_prefetch",
            "Messages a pool's workers in this process may hold unacknowledged: slots and jobs held ahead, deeper while jobs are short",
            m.worker_prefetch.clone(),
        );
        r.register(
            "agent_steps",
            "Model replies in agent loops",
            m.agent_steps.clone(),
        );
        r.register(
            "agent_tokens",
            "Model tokens used by agent loops, by kind (input, output)",
            m.agent_tokens.clone(),
        );
        r.register(
            "backend_errors",
            "Failures of a backend seen by this process (unavailable, timed out, schema)",
            m.backend_errors.clone(),
        );
        r.register(
            "scrape_timeouts",
            "Reads of the store or the broker at scrape time that timed out: their series are left out of that scrape",
            m.scrape_timeouts.clone(),
        );
        r.register(
            "jobs",
            "Jobs in the store by state, read when scraped (at most every 15 s) by processes that dispatch",
            m.jobs.clone(),
        );
        r.register(
            "queue_depth",
            "Messages ready in a pool's RabbitMQ queue (waiting, not delivered) as the broker counts them, read when scraped",
            m.queue_depth.clone(),
        );
        let version = env!("CARGO_PKG_VERSION");
        match role {
            Some(role) => r.register(
                "build",
                "The running toolfleet's version and the role of the process (always 1)",
                Info::new(BuildLabels {
                    version,
                    role: role.as_str(),
                }),
            ),
            None => r.register(
                "build",
                "The running toolfleet's version (always 1)",
                Info::new(VersionLabel { version }),
            ),
        }
        for outcome in ["delivered", "failed", "refused"] {
            m.webhook_deliveries
                .get_or_create(&OutcomeLabel { outcome })
                .inc_by(0);
        }
        for backend in Backend::ALL {
            let label = BackendLabel {
                backend: backend.as_str(),
            };
            m.backend_errors.get_or_create(&label).inc_by(0);
        }
        for backend in [Backend::Store, Backend::Broker] {
            let label = BackendLabel {
                backend: backend.as_str(),
            };
            m.scrape_timeouts.get_or_create(&label).inc_by(0);
        }
        Metrics { registry: r, ..m }
    }

    /// The text exposition, in the OpenMetrics format ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            // Writing into a String does not fail; never serve half a page.
            out.clear();
        }
        out
    }

    // The call path.

    /// Counts one call of `tool` (registered, or [`UNKNOWN_TOOL`]) by its
    /// outcome, and a denial when its error is one.
    pub fn call(&self, tool: &str, envelope: &Envelope) {
        let code = envelope.error_code();
        let outcome = code.map(ErrorCode::as_str).unwrap_or(envelope.status());
        self.calls
            .get_or_create(&CallLabels {
                tool: tool.to_owned(),
                outcome,
            })
            .inc();
        if let Some(denial) = code.and_then(Denial::of) {
            self.denied(tool, denial);
        }
    }

    /// The time one call of `tool` took through the call path. The runtime
    /// leaves long polls out (see [`crate::ToolDecl::long_poll`]).
    pub fn call_time(&self, tool: &str, elapsed: Duration) {
        self.call_duration
            .get_or_create(&tool_label(tool))
            .observe(elapsed.as_secs_f64());
    }

    /// Counts a call of `tool` whose arguments failed validation.
    pub fn validation_failure(&self, tool: &str) {
        self.validation_failures
            .get_or_create(&tool_label(tool))
            .inc();
    }

    /// A request refused before it reached a tool (or by its middleware).
    pub fn denied(&self, tool: &str, reason: Denial) {
        self.denials
            .get_or_create(&DenialLabels {
                tool: tool.to_owned(),
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Counts a call of `tool` answered from the read cache.
    pub fn cache_hit(&self, tool: &str) {
        self.cache_hits.get_or_create(&tool_label(tool)).inc();
    }

    /// Counts a call of `tool` the read cache could not answer.
    pub fn cache_miss(&self, tool: &str) {
        self.cache_misses.get_or_create(&tool_label(tool)).inc();
    }

    /// Counts a job of `tool` enqueued.
    pub fn job_enqueued(&self, tool: &str) {
        self.jobs_enqueued.get_or_create(&tool_label(tool)).inc();
    }

    /// One webhook attempt: delivered (a 2xx) or failed.
    pub fn webhook_attempt(&self, delivered: bool) {
        let outcome = if delivered { "delivered" } else { "failed" };
        self.webhook_deliveries
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// A webhook attempt not made: the allow-list refuses its callback now.
    pub fn webhook_refused(&self) {
        self.webhook_deliveries
            .get_or_create(&OutcomeLabel { outcome: "refused" })
            .inc();
    }

    /// Counts a webhook given up: after its last attempt, or refused by the allow-list.
    pub fn webhook_abandoned(&self) {
        self.webhook_abandoned.inc();
    }

    // Workers.

    /// A worker claimed an attempt of a job of `tool`, `waited` after it
    /// became runnable.
    pub fn job_started(&self, tool: &str, waited: Duration) {
        let label = tool_label(tool);
        self.jobs_started.get_or_create(&label).inc();
        self.job_queue_wait
            .get_or_create(&label)
            .observe(waited.as_secs_f64());
    }

    /// How long one attempt ran its executor.
    pub fn job_ran(&self, tool: &str, elapsed: Duration) {
        self.job_run
            .get_or_create(&tool_label(tool))
            .observe(elapsed.as_secs_f64());
    }

    /// A job of `tool` now stands in `state`: final states are counted as
    /// settled, `retrying` as a retry, others not at all.
    pub fn job_state(&self, tool: &str, state: JobState) {
        match state {
            JobState::Succeeded | JobState::Failed | JobState::Cancelled => self
                .jobs_settled
                .get_or_create(&SettledLabels {
                    tool: tool.to_owned(),
                    state: state.as_str(),
                })
                .inc(),
            JobState::Retrying => self.job_retries.get_or_create(&tool_label(tool)).inc(),
            // Parking waits for a person: no attempt failed.
            JobState::Queued | JobState::Scheduled | JobState::Running | JobState::Parked => 0,
        };
    }

    /// Counts a dead letter of `pool`: a message a worker could not process
    /// and rejected, or a job failed because the broker gave up on its message.
    pub fn dead_letter(&self, pool: &str) {
        self.dead_letters.get_or_create(&pool_label(pool)).inc();
    }

    /// The gauges of `pool`, created at 0, as is its dead-letter count:
    /// a worker of the pool shows every series of it from the start.
    pub fn pool_gauges(&self, pool: &str) -> PoolGauges {
        let label = pool_label(pool);
        self.dead_letters.get_or_create(&label).inc_by(0);
        PoolGauges {
            in_flight: self.worker_in_flight.get_or_create_owned(&label),
            busy_slots: self.worker_busy_slots.get_or_create_owned(&label),
            slots: self.worker_slots.get_or_create_owned(&label),
            prefetch: self.worker_prefetch.get_or_create_owned(&label),
        }
    }

    /// Whether a worker of `pool` in this process consumes its queue: its
    /// slots count (`toolfleet_worker_slots` above 0) once it subscribed,
    /// and until it stops.
    pub fn consuming(&self, pool: &str) -> bool {
        self.worker_slots
            .get(&pool_label(pool))
            .is_some_and(|slots| slots.get() > 0)
    }

    // Agents.

    /// One model reply of the agent `tool`, with the tokens it used.
    pub fn agent_step(&self, tool: &str, input_tokens: u64, output_tokens: u64) {
        self.agent_steps.get_or_create(&tool_label(tool)).inc();
        for (kind, n) in [("input", input_tokens), ("output", output_tokens)] {
            self.agent_tokens
                .get_or_create(&TokenLabels {
                    tool: tool.to_owned(),
                    kind,
                })
                .inc_by(n);
        }
    }

    // Backends and the state at scrape time.

    /// Counts a failure of `backend`.
    pub fn backend_error(&self, backend: Backend) {
        self.backend_errors
            .get_or_create(&BackendLabel {
                backend: backend.as_str(),
            })
            .inc();
    }

    /// A read of `backend` at scrape time that timed out. Not a backend
    /// error: the read is left out of that scrape (a slow count on a large
    /// store is not a failing store).
    pub fn scrape_timeout(&self, backend: Backend) {
        self.scrape_timeouts
            .get_or_create(&BackendLabel {
                backend: backend.as_str(),
            })
            .inc();
    }

    /// Jobs by state as the store counts them now, by the states the
    /// contract shows (parked jobs count as `retrying`); states it does not
    /// name are 0.
    pub fn set_job_counts(&self, counts: &[(JobState, u64)]) {
        for state in JobState::SHOWN {
            let n = counts
                .iter()
                .filter(|(s, _)| s.shown() == state)
                .map(|(_, n)| *n)
                .sum::<u64>();
            self.jobs
                .get_or_create(&StateLabel {
                    state: state.as_str(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// The job counts could not be read: show none rather than stale ones.
    pub fn clear_job_counts(&self) {
        self.jobs.clear();
    }

    /// Messages ready in the queue of `pool` as the broker counts them, or
    /// `None` when they could not be counted.
    pub fn set_queue_depth(&self, pool: &str, depth: Option<u64>) {
        let label = pool_label(pool);
        match depth {
            Some(n) => {
                self.queue_depth
                    .get_or_create(&label)
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            None => {
                self.queue_depth.remove(&label);
            }
        }
    }
}

fn tool_label(tool: &str) -> ToolLabel {
    ToolLabel {
        tool: tool.to_owned(),
    }
}

fn pool_label(pool: &str) -> PoolLabel {
    PoolLabel {
        pool: pool.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::ToolError;
    use crate::tool::new_id;

    /// The value of the sample `series` (name and labels as rendered).
    pub(super) fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn series_of_fixed_labels_start_at_zero_and_empty_families_are_not_rendered() {
        let text = Metrics::new().render();
        assert_eq!(
            sample(&text, "toolfleet_webhook_abandoned_total"),
            Some(0.0)
        );
        for backend in ["store", "broker", "notices"] {
            let series = format!("toolfleet_backend_errors_total{{backend=\"{backend}\"}}");
            assert_eq!(sample(&text, &series), Some(0.0), "{text}");
        }
        for backend in ["store", "broker"] {
            let series = format!("toolfleet_scrape_timeouts_total{{backend=\"{backend}\"}}");
            assert_eq!(sample(&text, &series), Some(0.0), "{text}");
        }
        assert!(!text.contains("toolfleet_calls"), "{text}");
    }

    #[test]
    fn every_contracted_name_is_rendered_with_its_type() {
        let m = Metrics::new();
        let ok = Envelope::ok(crate::Json::from(serde_json::json!({})), new_id());
        m.call("t", &ok);
        m.call_time("t", Duration::from_millis(1));
        m.validation_failure("t");
        m.denied("t", Denial::Unauthenticated);
        m.cache_hit("t");
        m.cache_miss("t");
        m.job_enqueued("t");
        m.job_started("t", Duration::from_millis(1));
        m.job_ran("t", Duration::from_millis(1));
        m.job_state("t", JobState::Succeeded);
        m.job_state("t", JobState::Retrying);
        m.dead_letter("default");
        m.pool_gauges("default");
        m.agent_step("t", 1, 1);
        m.set_job_counts(&[]);
        m.set_queue_depth("default", Some(0));
        let text = m.render();
        for (name, kind) in [
            ("toolfleet_calls", "counter"),
            ("toolfleet_call_duration_seconds", "histogram"),
            ("toolfleet_validation_failures", "counter"),
            ("toolfleet_denials", "counter"),
            ("toolfleet_cache_hits", "counter"),
            ("toolfleet_cache_misses", "counter"),
            ("toolfleet_jobs_enqueued", "counter"),
            ("toolfleet_webhook_deliveries", "counter"),
            ("toolfleet_webhook_abandoned", "counter"),
            ("toolfleet_jobs_started", "counter"),
            ("toolfleet_jobs_settled", "counter"),
            ("toolfleet_job_retries", "counter"),
            ("toolfleet_dead_letters", "counter"),
            ("toolfleet_job_queue_wait_seconds", "histogram"),
            ("toolfleet_job_run_seconds", "histogram"),
            ("toolfleet_worker_jobs_in_flight", "gauge"),
            ("toolfleet_worker_busy_slots", "gauge"),
            ("toolfleet_worker_slots", "gauge"),
            ("toolfleet_worker_prefetch", "gauge"),
            ("toolfleet_agent_steps", "counter"),
            ("toolfleet_agent_tokens", "counter"),
            ("toolfleet_backend_errors", "counter"),
            ("toolfleet_scrape_timeouts", "counter"),
            ("toolfleet_jobs", "gauge"),
            ("toolfleet_queue_depth", "gauge"),
            ("toolfleet_build", "info"),
        ] {
            let line = format!("# TYPE {name} {kind}");
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        let version = format!(
            "toolfleet_build_info{{version=\"{}\"}}",
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(sample(&text, &version), Some(1.0), "{text}");
        assert_eq!(m.role(), None);
    }

    #[test]
    fn build_info_names_the_role_of_the_process() {
        let names: Vec<&str> = Role::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names, ["dispatcher", "worker", "serve", "mcp"]);
        for role in Role::ALL {
            let m = Metrics::for_role(role);
            assert_eq!(m.role(), Some(role));
            let text = m.render();
            let series = format!(
                "toolfleet_build_info{{version=\"{}\",role=\"{}\"}}",
                env!("CARGO_PKG_VERSION"),
                role.as_str()
            );
            assert_eq!(sample(&text, &series), Some(1.0), "{text}");
            assert_eq!(text.matches("toolfleet_build_info{").count(), 1, "{text}");
        }
        assert!(Role::Dispatcher.dispatches() && Role::Serve.dispatches());
        assert!(!Role::Worker.dispatches());
    }

    #[test]
    fn calls_count_outcomes_and_denials_from_their_codes() {
        let m = Metrics::new();
        m.call(
            "find",
            &Envelope::ok(crate::Json::from(serde_json::json!({})), new_id()),
        );
        m.call(
            "find",
            &Envelope::error(ToolError::new(ErrorCode::Forbidden, "no")),
        );
        m.call(
            "find",
            &Envelope::error(ToolError::new(ErrorCode::RateLimited, "slow down")),
        );
        m.call(
            UNKNOWN_TOOL,
            &Envelope::error(ToolError::new(ErrorCode::UnknownTool, "no such tool")),
        );
        m.call_time("find", Duration::from_millis(3));
        let text = m.render();
        for (series, value) in [
            (r#"toolfleet_calls_total{tool="find",outcome="ok"}"#, 1.0),
            (
                r#"toolfleet_calls_total{tool="find",outcome="forbidden"}"#,
                1.0,
            ),
            (
                r#"toolfleet_calls_total{tool="unknown",outcome="unknown_tool"}"#,
                1.0,
            ),
            (
                r#"toolfleet_denials_total{tool="find",reason="forbidden"}"#,
                1.0,
            ),
            (
                r#"toolfleet_denials_total{tool="find",reason="rate_limited"}"#,
                1.0,
            ),
            (r#"toolfleet_call_duration_seconds_count{tool="find"}"#, 1.0),
            (
                r#"toolfleet_call_duration_seconds_bucket{le="0.005",tool="find"}"#,
                1.0,
            ),
            (
                r#"toolfleet_call_duration_seconds_bucket{le="0.0025",tool="find"}"#,
                0.0,
            ),
        ] {
            assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
        }
        assert!(!text.contains(r#"reason="unknown_tool""#), "{text}");
    }

    #[test]
    fn job_states_split_into_settled_and_retries() {
        let m = Metrics::new();
        for state in JobState::ALL {
            m.job_state("ocr", state);
        }
        m.job_state("ocr", JobState::Retrying);
        let text = m.render();
        for state in ["succeeded", "failed", "cancelled"] {
            let series = format!(r#"toolfleet_jobs_settled_total{{tool="ocr",state="{state}"}}"#);
            assert_eq!(sample(&text, &series), Some(1.0), "{text}");
        }
        assert_eq!(
            sample(&text, r#"toolfleet_job_retries_total{tool="ocr"}"#),
            Some(2.0)
        );
        assert!(!text.contains(r#"state="queued""#), "{text}");
    }

    #[test]
    fn pool_gauges_are_shared_and_scrape_state_can_be_withdrawn() {
        let m = Metrics::new();
        let a = m.pool_gauges("default");
        let b = m.pool_gauges("default");
        a.slots.inc_by(4);
        b.slots.inc_by(4);
        a.busy_slots.inc();
        m.set_job_counts(&[(JobState::Queued, 3)]);
        m.set_queue_depth("default", Some(7));
        let text = m.render();
        assert_eq!(
            sample(&text, r#"toolfleet_worker_slots{pool="default"}"#),
            Some(8.0)
        );
        assert_eq!(
            sample(&text, r#"toolfleet_worker_busy_slots{pool="default"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, r#"toolfleet_jobs{state="queued"}"#),
            Some(3.0)
        );
        assert_eq!(
            sample(&text, r#"toolfleet_jobs{state="failed"}"#),
            Some(0.0)
        );
        assert_eq!(
            sample(&text, r#"toolfleet_queue_depth{pool="default"}"#),
            Some(7.0)
        );
        m.clear_job_counts();
        m.set_queue_depth("default", None);
        let text = m.render();
        assert!(!text.contains("toolfleet_jobs{"), "{text}");
        assert!(!text.contains("toolfleet_queue_depth{"), "{text}");
    }

    #[test]
    fn agent_tokens_count_by_kind() {
        let m = Metrics::new();
        m.agent_step("reconcile", 50, 10);
        m.agent_step("reconcile", 5, 1);
        let text = m.render();
        assert_eq!(
            sample(&text, r#"toolfleet_agent_steps_total{tool="reconcile"}"#),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"toolfleet_agent_tokens_total{tool="reconcile",kind="input"}"#
            ),
            Some(55.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"toolfleet_agent_tokens_total{tool="reconcile",kind="output"}"#
            ),
            Some(11.0)
        );
    }
}
