//! A [`Broker`] and [`Notices`] that count the failures of those they wrap
//! in `toolfleet_backend_errors_total{backend="broker"|"notices"}`: every
//! operation is passed through unchanged, and each one that answers
//! [`BrokerError::Unavailable`] or [`BrokerError::Full`] is counted
//! ([`BrokerError::Closed`] is a shutdown, not a failure).
//!
//! Every method of both traits is forwarded through
//! [`toolfleet_core::forward_to_inner!`], those with a default body
//! included, so that the wrapped implementation's own always runs.

use std::sync::Arc;
use std::time::Duration;

use toolfleet_core::metrics::Backend;
use toolfleet_core::{Metrics, TraceContext};

use crate::{Broker, BrokerError, Consumer, Event, Notices, Subscription};

fn seen<T>(
    metrics: &Metrics,
    backend: Backend,
    result: Result<T, BrokerError>,
) -> Result<T, BrokerError> {
    if let Err(BrokerError::Unavailable(_) | BrokerError::Full(_)) = &result {
        metrics.backend_error(backend);
    }
    result
}

/// The broker `inner`, its failures counted in `metrics`.
pub struct MeteredBroker {
    inner: Arc<dyn Broker>,
    metrics: Arc<Metrics>,
}

impl MeteredBroker {
    /// The broker `inner`, its failures counted in `metrics`.
    pub fn new(inner: Arc<dyn Broker>, metrics: Arc<Metrics>) -> Self {
        MeteredBroker { inner, metrics }
    }

    fn seen<T>(&self, result: Result<T, BrokerError>) -> Result<T, BrokerError> {
        seen(&self.metrics, Backend::Broker, result)
    }
}

toolfleet_core::forward_to_inner! {
    impl Broker, for MeteredBroker, error BrokerError {
        fn ping(&self) -> ();
        fn publish_traced(
            &self,
            pool: &str,
            job_id: &str,
            trace: Option<&TraceContext>
        ) -> ();
        fn publish_delayed_traced(
            &self,
            pool: &str,
            job_id: &str,
            delay: Duration,
            trace: Option<&TraceContext>
        ) -> ();
        fn consume(&self, pool: &str, prefetch: u16) -> Box<dyn Consumer>;
        fn depth(&self, pool: &str) -> u64;
        fn consume_dead(&self, pool: &str) -> Box<dyn Consumer>;
    }
}

/// The notices `inner`, their failures counted in `metrics`.
pub struct MeteredNotices {
    inner: Arc<dyn Notices>,
    metrics: Arc<Metrics>,
}

impl MeteredNotices {
    /// The notices `inner`, their failures counted in `metrics`.
    pub fn new(inner: Arc<dyn Notices>, metrics: Arc<Metrics>) -> Self {
        MeteredNotices { inner, metrics }
    }

    fn seen<T>(&self, result: Result<T, BrokerError>) -> Result<T, BrokerError> {
        seen(&self.metrics, Backend::Notices, result)
    }
}

toolfleet_core::forward_to_inner! {
    impl Notices, for MeteredNotices, error BrokerError {
        fn publish(&self, event: &Event) -> ();
        fn publish_all(&self, events: &[Event]) -> ();
        fn subscribe(&self) -> Box<dyn Subscription>;
        fn subscribe_settled(&self) -> Box<dyn Subscription>;
    } plain {
        fn hears(&self, key: &str) -> bool;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{MemoryBroker, MemoryNotices};

    fn errors(metrics: &Metrics, backend: &str) -> f64 {
        let series = format!("toolfleet_backend_errors_total{{backend=\"{backend}\"}} ");
        metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1.0)
    }

    #[tokio::test]
    async fn failures_are_counted_per_backend_and_shutdowns_are_not() {
        let metrics = Arc::new(Metrics::new());
        let broker = MeteredBroker::new(Arc::new(MemoryBroker::new()), metrics.clone());
        let notices = MeteredNotices::new(Arc::new(MemoryNotices::new()), metrics.clone());
        broker.ping().await.expect("ping");
        broker.publish("default", "job").await.expect("publish");
        assert_eq!(broker.depth("default").await, Ok(1));
        let mut events = notices.subscribe().await.expect("subscribe");
        let event = Event {
            kind: crate::EventKind::Job,
            id: "j".into(),
            tenant: "t".into(),
            tool: "ocr".into(),
            state: crate::EventState::parse("succeeded").expect("a state"),
            run_id: "r".into(),
            body: Default::default(),
            callback: false,
            life: 0,
            ..Default::default()
        };
        notices
            .publish_all(std::slice::from_ref(&event))
            .await
            .expect("publish");
        assert_eq!(events.next().await, Some(event));
        assert_eq!(
            (errors(&metrics, "broker"), errors(&metrics, "notices")),
            (0.0, 0.0)
        );

        let down = BrokerError::Unavailable("down".into());
        assert!(broker.seen::<()>(Err(down.clone())).is_err());
        assert!(
            broker
                .seen::<()>(Err(BrokerError::Full("bound".into())))
                .is_err()
        );
        assert!(broker.seen::<()>(Err(BrokerError::Closed)).is_err());
        assert!(notices.seen::<()>(Err(down)).is_err());
        assert_eq!(
            (errors(&metrics, "broker"), errors(&metrics, "notices")),
            (2.0, 1.0)
        );
        assert_eq!(errors(&metrics, "store"), 0.0);
    }

    /// Notices that know nobody listens for anything.
    struct Deaf;

    #[async_trait::async_trait]
    impl Notices for Deaf {
        async fn publish(&self, _: &Event) -> Result<(), BrokerError> {
            Ok(())
        }

        async fn subscribe(&self) -> Result<Box<dyn Subscription>, BrokerError> {
            Err(BrokerError::Closed)
        }

        fn hears(&self, _: &str) -> bool {
            false
        }
    }

    /// Whether anyone listens is asked of what the metered notices wrap.
    #[tokio::test]
    async fn whether_anyone_listens_is_the_inner_notices_answer() {
        let metrics = Arc::new(Metrics::new());
        let deaf = MeteredNotices::new(Arc::new(Deaf), metrics.clone());
        assert!(!deaf.hears("t.ocr.queued"));
        // In-process notices hear what their subscribers wait for.
        let inner = Arc::new(MemoryNotices::new());
        let hearing = MeteredNotices::new(inner.clone(), metrics);
        assert!(!hearing.hears("t.ocr.queued"));
        let _every = inner.subscribe().await.expect("subscribed");
        assert!(hearing.hears("t.ocr.queued"));
    }
}
