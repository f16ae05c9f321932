//! `/metrics`, `/healthz` and `/readyz` of every process: the dispatcher
//! serves them beside its API, and a process without one (a worker) serves
//! them alone on `metrics_listen` with [`ops_router`].
//!
//! The metrics themselves are [`toolfleet_core::Metrics`], one registry per
//! process. What only the backends know is read when scraped: jobs by state
//! from the store and the messages waiting in each pool from the broker. A
//! scrape stays cheap and bounded: the reads run together under a timeout,
//! scrapes less than a second apart share one read, and a read that fails
//! withdraws its series for that scrape and counts a backend error rather
//! than failing the scrape.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use toolfleet_broker::Broker;
use toolfleet_core::Metrics;
use toolfleet_core::metrics::{Backend, CONTENT_TYPE};
use toolfleet_store::Store;

/// The longest a scrape or a readiness check waits on a backend.
const BACKEND_TIMEOUT: Duration = Duration::from_secs(2);
/// Scrapes closer together than this share one read of the backends.
const MIN_REFRESH: Duration = Duration::from_secs(1);

/// What `/metrics`, `/healthz` and `/readyz` read.
pub struct Ops {
    metrics: Arc<Metrics>,
    /// The metered backends (see `toolfleet_store::metered` and
    /// `toolfleet_broker::metered`): their failures are counted there.
    store: Arc<dyn Store>,
    broker: Arc<dyn Broker>,
    /// The pools whose queue depth is shown: those this process works or
    /// dispatches to.
    pools: Vec<String>,
    /// When the backends were last read.
    refreshed: tokio::sync::Mutex<Option<Instant>>,
    timeout: Duration,
}

impl Ops {
    pub fn new(
        metrics: Arc<Metrics>,
        store: Arc<dyn Store>,
        broker: Arc<dyn Broker>,
        pools: Vec<String>,
    ) -> Ops {
        Ops {
            metrics,
            store,
            broker,
            pools,
            refreshed: tokio::sync::Mutex::new(None),
            timeout: BACKEND_TIMEOUT,
        }
    }

    /// Waits at most `timeout` on each backend read (default 2 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Ops {
        self.timeout = timeout;
        self
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The text exposition, with the state of the fleet read just now.
    pub async fn render(&self) -> String {
        self.refresh().await;
        self.metrics.render()
    }

    /// Reads jobs by state and the depth of each pool, unless another scrape
    /// did less than [`MIN_REFRESH`] ago.
    async fn refresh(&self) {
        let mut refreshed = self.refreshed.lock().await;
        if refreshed.is_some_and(|at| at.elapsed() < MIN_REFRESH) {
            return;
        }
        let counts = tokio::time::timeout(self.timeout, self.store.job_counts());
        let depths = futures_util::future::join_all(
            self.pools
                .iter()
                .map(|pool| tokio::time::timeout(self.timeout, self.broker.depth(pool))),
        );
        let (counts, depths) = tokio::join!(counts, depths);
        match counts {
            Ok(Ok(counts)) => self.metrics.set_job_counts(&counts),
            Ok(Err(error)) => {
                tracing::warn!(%error, "metrics: cannot count jobs");
                self.metrics.clear_job_counts();
            }
            Err(_) => {
                tracing::warn!("metrics: counting jobs timed out");
                self.metrics.backend_error(Backend::Store);
                self.metrics.clear_job_counts();
            }
        }
        for (pool, depth) in self.pools.iter().zip(depths) {
            let depth = match depth {
                Ok(Ok(depth)) => Some(depth),
                Ok(Err(error)) => {
                    tracing::warn!(pool, %error, "metrics: cannot read a queue's depth");
                    None
                }
                Err(_) => {
                    tracing::warn!(pool, "metrics: reading a queue's depth timed out");
                    self.metrics.backend_error(Backend::Broker);
                    None
                }
            };
            self.metrics.set_queue_depth(pool, depth);
        }
        *refreshed = Some(Instant::now());
    }

    /// Whether the store and the broker answer, each within the timeout.
    pub async fn ready(&self) -> (bool, Value) {
        let (store, broker) = tokio::join!(
            tokio::time::timeout(self.timeout, self.store.ping()),
            tokio::time::timeout(self.timeout, self.broker.ping()),
        );
        let up = |answer: Result<Result<(), String>, _>, backend: Backend| match answer {
            Ok(Ok(())) => true,
            Ok(Err(_)) => false,
            Err(_) => {
                self.metrics.backend_error(backend);
                false
            }
        };
        let store = up(store.map(|r| r.map_err(|e| e.to_string())), Backend::Store);
        let broker = up(
            broker.map(|r| r.map_err(|e| e.to_string())),
            Backend::Broker,
        );
        let word = |up: bool| if up { "ok" } else { "down" };
        (
            store && broker,
            json!({"store": word(store), "broker": word(broker)}),
        )
    }
}

/// `GET /metrics`.
pub(crate) async fn metrics_response(ops: &Ops) -> Response {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], ops.render().await).into_response()
}

/// `GET /healthz`: the process answers.
pub(crate) fn health_response() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

/// `GET /readyz`: 200 when the store and the broker answer, else 503.
pub(crate) async fn ready_response(ops: &Ops) -> Response {
    let (ready, body) = ops.ready().await;
    if ready {
        return (StatusCode::OK, axum::Json(body)).into_response();
    }
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
    response
}

/// `/metrics`, `/healthz` and `/readyz` alone: what a process without the
/// API (a worker) serves on `metrics_listen`.
pub fn ops_router(ops: Arc<Ops>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(ops): State<Arc<Ops>>| async move { metrics_response(&ops).await }),
        )
        .route("/healthz", get(|| async { health_response() }))
        .route(
            "/readyz",
            get(|State(ops): State<Arc<Ops>>| async move { ready_response(&ops).await }),
        )
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "no such route: /metrics, /healthz or /readyz",
            )
        })
        .with_state(ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use toolfleet_broker::memory::MemoryBroker;
    use toolfleet_broker::{BrokerError, Consumer};
    use toolfleet_core::JobState;
    use toolfleet_store::sqlite::SqliteStore;

    /// A broker that never answers.
    struct Hung;

    #[async_trait]
    impl Broker for Hung {
        async fn ping(&self) -> Result<(), BrokerError> {
            std::future::pending().await
        }
        async fn publish(&self, _: &str, _: &str) -> Result<(), BrokerError> {
            std::future::pending().await
        }
        async fn publish_delayed(&self, _: &str, _: &str, _: Duration) -> Result<(), BrokerError> {
            std::future::pending().await
        }
        async fn consume(&self, _: &str, _: u16) -> Result<Box<dyn Consumer>, BrokerError> {
            std::future::pending().await
        }
        async fn depth(&self, _: &str) -> Result<u64, BrokerError> {
            std::future::pending().await
        }
    }

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    async fn store() -> Arc<dyn Store> {
        Arc::new(SqliteStore::open_in_memory().await.expect("a store"))
    }

    #[tokio::test]
    async fn a_scrape_reads_jobs_and_queue_depths() {
        let metrics = Arc::new(Metrics::new());
        let broker = MemoryBroker::new();
        broker.publish("default", "j1").await.unwrap();
        broker.publish("default", "j2").await.unwrap();
        let ops = Ops::new(
            metrics,
            store().await,
            Arc::new(broker),
            vec!["default".into(), "agents".into()],
        );
        let text = ops.render().await;
        assert_eq!(
            sample(&text, r#"toolfleet_queue_depth{pool="default"}"#),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, r#"toolfleet_queue_depth{pool="agents"}"#),
            Some(0.0)
        );
        for state in [JobState::Queued, JobState::Succeeded, JobState::Cancelled] {
            let series = format!("toolfleet_jobs{{state=\"{state}\"}}");
            assert_eq!(sample(&text, &series), Some(0.0), "{text}");
        }
        assert!(ops.ready().await.0);
    }

    #[tokio::test]
    async fn a_backend_that_hangs_is_counted_and_the_scrape_still_answers() {
        let metrics = Arc::new(Metrics::new());
        let ops = Ops::new(
            metrics,
            store().await,
            Arc::new(Hung),
            vec!["default".into()],
        )
        .with_timeout(Duration::from_millis(50));
        let started = Instant::now();
        let text = ops.render().await;
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(!text.contains("toolfleet_queue_depth{"), "{text}");
        assert!(
            text.contains(r#"toolfleet_jobs{state="queued"} 0"#),
            "{text}"
        );
        assert_eq!(
            sample(&text, r#"toolfleet_backend_errors_total{backend="broker"}"#),
            Some(1.0)
        );
        // A second scrape at once reuses the first read.
        let text = ops.render().await;
        assert_eq!(
            sample(&text, r#"toolfleet_backend_errors_total{backend="broker"}"#),
            Some(1.0)
        );
        let (ready, body) = ops.ready().await;
        assert!(!ready);
        assert_eq!(body, json!({"store": "ok", "broker": "down"}));
    }
}
