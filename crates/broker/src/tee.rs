//! Two ways out, one way in: [`Tee`] publishes every event to the notices
//! the fleet listens on (`inner`: PostgreSQL `LISTEN`/`NOTIFY`, say) and
//! to another it only publishes to (`outer`: RabbitMQ's events exchange,
//! for orchestrators that bind their own queues), and subscribes to `inner`
//! alone. The fleet's own wake-ups then cost RabbitMQ no queue and no
//! delivery, while the exchange still carries every event.
//!
//! The inner notices decide the answer: an event the fleet heard is
//! published, whatever the exchange said. A failure of the outer one is
//! logged (to stderr, as the announcer does) and otherwise ignored; the
//! store holds the truth either way.

use async_trait::async_trait;

use crate::{BrokerError, Event, Notices, Subscription};

/// Publishes to both, subscribes to `inner`.
pub struct Tee<I, O> {
    inner: I,
    outer: O,
}

impl<I: Notices, O: Notices> Tee<I, O> {
    /// Publishes to both `inner` and `outer`, subscribes to `inner`.
    pub fn new(inner: I, outer: O) -> Self {
        Tee { inner, outer }
    }

    fn outer_failed(&self, what: &str, error: &BrokerError) {
        eprintln!("toolfleet: {what} not published to the outer notices: {error}");
    }
}

#[async_trait]
impl<I: Notices, O: Notices> Notices for Tee<I, O> {
    async fn publish(&self, event: &Event) -> Result<(), BrokerError> {
        let (inner, outer) = tokio::join!(self.inner.publish(event), self.outer.publish(event));
        if let Err(error) = outer {
            self.outer_failed(&format!("event {} {}", event.id, event.state), &error);
        }
        inner
    }

    async fn publish_all(&self, events: &[Event]) -> Result<(), BrokerError> {
        let (inner, outer) = tokio::join!(
            self.inner.publish_all(events),
            self.outer.publish_all(events)
        );
        if let Err(error) = outer {
            self.outer_failed(&format!("{} events", events.len()), &error);
        }
        inner
    }

    async fn subscribe(&self) -> Result<Box<dyn Subscription>, BrokerError> {
        self.inner.subscribe().await
    }

    fn hears(&self, key: &str) -> bool {
        self.inner.hears(key) || self.outer.hears(key)
    }

    async fn subscribe_settled(&self) -> Result<Box<dyn Subscription>, BrokerError> {
        self.inner.subscribe_settled().await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::memory::MemoryNotices;

    fn event(n: usize) -> Event {
        Event {
            kind: crate::EventKind::Job,
            id: format!("job-{n}"),
            tenant: "t".into(),
            tool: "ocr".into(),
            state: crate::EventState::parse("succeeded").expect("a state"),
            run_id: "r".into(),
            body: json!({"n": n}).into(),
            callback: false,
            life: 0,
            ..Default::default()
        }
    }

    async fn next(sub: &mut Box<dyn Subscription>) -> Option<Event> {
        tokio::time::timeout(Duration::from_secs(2), sub.next())
            .await
            .ok()
            .flatten()
    }

    #[tokio::test]
    async fn both_hear_every_event_and_subscribers_hear_the_inner() {
        let (inner, outer) = (MemoryNotices::new(), MemoryNotices::new());
        let mut outside = outer.subscribe().await.unwrap();
        let tee = Tee::new(inner, outer);
        let mut inside = tee.subscribe().await.unwrap();
        tee.publish(&event(1)).await.unwrap();
        tee.publish_all(&[event(2), event(3)]).await.unwrap();
        for n in 1..=3 {
            assert_eq!(
                next(&mut inside).await.map(|e| e.id),
                Some(format!("job-{n}"))
            );
            assert_eq!(
                next(&mut outside).await.map(|e| e.id),
                Some(format!("job-{n}"))
            );
        }
    }

    /// Outer notices that refuse everything.
    struct Down;

    #[async_trait]
    impl Notices for Down {
        async fn publish(&self, _: &Event) -> Result<(), BrokerError> {
            Err(BrokerError::Unavailable("down".into()))
        }
        async fn subscribe(&self) -> Result<Box<dyn Subscription>, BrokerError> {
            Err(BrokerError::Unavailable("down".into()))
        }
    }

    #[tokio::test]
    async fn an_outer_failure_does_not_keep_the_fleet_from_hearing() {
        let tee = Tee::new(MemoryNotices::new(), Down);
        let mut inside = tee.subscribe().await.unwrap();
        assert_eq!(tee.publish(&event(1)).await, Ok(()));
        assert_eq!(tee.publish_all(&[event(2)]).await, Ok(()));
        assert_eq!(next(&mut inside).await.map(|e| e.id), Some("job-1".into()));
        assert_eq!(next(&mut inside).await.map(|e| e.id), Some("job-2".into()));
    }
}
