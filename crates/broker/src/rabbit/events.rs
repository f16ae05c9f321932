//! Events on RabbitMQ: the `<prefix>.events` topic exchange, publishing
//! events to it (those that share a routing key in one message, a JSON
//! array), and each subscriber's exclusive, bounded queue, bound to the
//! keys it follows, whose messages turn back into events. It must never
//! hold RabbitMQ or a process back for a subscriber that falls behind (its
//! queue drops the oldest messages, its ring skips the oldest events), nor
//! treat an event as work: a subscriber's deliveries are auto-acked.

use std::sync::Arc;

use async_trait::async_trait;
use lapin::message::Delivery as LapinDelivery;
use lapin::options::{BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, ExchangeKind};
use tokio::sync::broadcast;

use super::RabbitOptions;
use super::heard::{LISTENING_KEY, Unheard};
use super::link::{CloseOnDrop, Feed, Link, Shared, Subscribed, redact, start_feed};
use super::publish::Route;
use super::topology::{name, text};
use crate::memory::MAX_NOTICE_BUFFER;
use crate::{BrokerError, Event, Notices, Subscription};

/// The most bytes a notices subscriber's queue holds before RabbitMQ drops
/// its oldest messages (the process has stalled: its events are stale).
const SUBSCRIBER_QUEUE_BYTES: i64 = 64 << 20;

/// The [`Notices`] on RabbitMQ: events go to the `<prefix>.events` topic
/// exchange, so every process of the deployment hears them; each
/// subscription is an exclusive queue of its own, bound to every key, or
/// only to the states it asks for ([`RabbitNotices::only_states`]).
#[derive(Clone)]
pub struct RabbitNotices {
    handle: Arc<CloseOnDrop>,
    exchange: String,
    /// The binding keys of its subscriptions.
    keys: Vec<String>,
}

impl RabbitNotices {
    /// Publishes one message of events to the exchange and awaits its
    /// confirm; one RabbitMQ returns, as no binding takes its key, marks
    /// the key unheard.
    async fn send(&self, key: &str, body: &[u8], what: &str) -> Result<(), BrokerError> {
        let shared = self.shared();
        let link = shared.link()?;
        let epoch = shared.unheard.epoch();
        let sent = async {
            shared.ensure_events(&link, &self.exchange).await?;
            let properties =
                BasicProperties::default().with_content_type("application/json".into());
            let route = Route {
                exchange: &self.exchange,
                key,
                mandatory: true,
            };
            match shared.confirm(&link, route, body, properties).await? {
                Confirmation::Nack(_) => Err(BrokerError::Unavailable(format!(
                    "RabbitMQ refused {what} on {}",
                    self.exchange
                ))),
                Confirmation::Ack(Some(_)) => {
                    shared.unheard.mark(key, epoch);
                    Ok(())
                }
                _ => Ok(()),
            }
        };
        shared.noting_loss(&link, sent.await)
    }

    /// Connects to RabbitMQ at `url` for notices alone; see
    /// [`RabbitBroker::notices`] to share the broker's connection.
    ///
    /// [`RabbitBroker::notices`]: super::RabbitBroker::notices
    pub async fn connect(url: &str, options: RabbitOptions) -> Result<Self, BrokerError> {
        let shared = Shared::start(url, options).await?;
        Ok(Self::on(Arc::new(CloseOnDrop(shared))))
    }

    pub(super) fn on(handle: Arc<CloseOnDrop>) -> Self {
        let exchange = format!("{}.events", handle.0.options.prefix);
        RabbitNotices {
            handle,
            exchange,
            keys: vec!["#".to_owned()],
        }
    }

    /// Subscriptions hear only events in one of `states` (the last word of
    /// the routing key `<tenant>.<tool>.<state>`), so RabbitMQ neither
    /// routes nor delivers the rest to this process: a worker that follows
    /// only cancels and settled jobs skips each job's `queued` and
    /// `running`. Publishing is unchanged.
    pub fn only_states(mut self, states: &[crate::EventState]) -> Self {
        self.keys = states.iter().map(|state| format!("#.{state}")).collect();
        self
    }

    /// As [`RabbitBroker::force_reconnect`]: subscriptions resubscribe by
    /// themselves, and miss what is published while they do.
    ///
    /// [`RabbitBroker::force_reconnect`]: super::RabbitBroker::force_reconnect
    pub async fn force_reconnect(&self) {
        self.shared().force_reconnect().await;
    }

    /// As [`RabbitBroker::close_and_delete`], including the events exchange.
    ///
    /// [`RabbitBroker::close_and_delete`]: super::RabbitBroker::close_and_delete
    pub async fn close_and_delete(&self) -> Result<(), BrokerError> {
        self.shared().close_and_delete().await
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.handle.0
    }
}

impl std::fmt::Debug for RabbitNotices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitNotices")
            .field("url", &redact(&self.shared().url))
            .field("exchange", &self.exchange)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Notices for RabbitNotices {
    async fn publish(&self, event: &Event) -> Result<(), BrokerError> {
        let key = event.routing_key();
        if !self.hears(&key) {
            return Ok(());
        }
        let body = serde_json::to_vec(event)
            .map_err(|e| BrokerError::Unavailable(format!("encoding event {}: {e}", event.id)))?;
        self.send(&key, &body, &event.id).await
    }

    /// Events that share a routing key go as one message whose body is a
    /// JSON array of them (one event alone is a JSON object, as from
    /// [`Notices::publish`]); the messages are published back to back and
    /// their confirms awaited together. Those of a key nobody listens for
    /// are not sent.
    async fn publish_all(&self, events: &[Event]) -> Result<(), BrokerError> {
        let mut messages = Vec::new();
        for (key, group) in crate::batches(events) {
            if !self.hears(&key) {
                continue;
            }
            let body = match group.as_slice() {
                [one] => serde_json::to_vec(one),
                many => serde_json::to_vec(many),
            }
            .map_err(|e| BrokerError::Unavailable(format!("encoding events for {key}: {e}")))?;
            let what = format!("{} events for {key}", group.len());
            messages.push((key, body, what));
        }
        let sent = messages
            .iter()
            .map(|(key, body, what)| self.send(key, body, what));
        futures_util::future::join_all(sent)
            .await
            .into_iter()
            .collect()
    }

    /// Whether events of `key` are sent: someone listened for them when
    /// last published, or a listener told since.
    fn hears(&self, key: &str) -> bool {
        self.shared().unheard.is_heard(key)
    }

    async fn subscribe(&self) -> Result<Box<dyn Subscription>, BrokerError> {
        let shared = self.shared();
        let buffer = shared.options.notice_buffer.clamp(1, MAX_NOTICE_BUFFER);
        let (sender, events) = broadcast::channel(buffer);
        let mut keys = self.keys.clone();
        if !keys.iter().any(|key| key == "#") {
            keys.push(LISTENING_KEY.to_owned());
        }
        let feed = EventFeed {
            exchange: self.exchange.clone(),
            keys,
            buffer,
            sender,
            unheard: Arc::clone(&shared.unheard),
        };
        start_feed(shared, feed).await?;
        Ok(Box::new(RabbitSubscription { events }))
    }
}

/// The events exchange over a link.
impl Shared {
    async fn ensure_events(&self, link: &Link, exchange: &str) -> Result<(), BrokerError> {
        if !link.is_ready(exchange) {
            self.declare_exchange(link, exchange, ExchangeKind::Topic)
                .await?;
            link.mark_ready(exchange);
        }
        Ok(())
    }
}

/// The events of a message on the events exchange: one event (an object),
/// or several that share the message's routing key (an array). Told apart
/// by the first byte, so each is parsed once, straight into events.
fn events_of(body: &[u8]) -> serde_json::Result<Vec<Event>> {
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'[') => serde_json::from_slice(body),
        _ => serde_json::from_slice(body).map(|event| vec![event]),
    }
}

/// A notices subscriber's feed: an exclusive queue bound to its keys and
/// to [`LISTENING_KEY`], auto-acked (events are announcements, not work),
/// turned into events. Once bound, it tells every process it listens.
struct EventFeed {
    exchange: String,
    /// What its queue is bound to.
    keys: Vec<String>,
    buffer: usize,
    /// A broadcast ring: a subscriber that falls behind skips the oldest
    /// events instead of holding RabbitMQ or this process back.
    sender: broadcast::Sender<Event>,
    /// The keys this process found nobody listening for.
    unheard: Arc<Unheard>,
}

impl Feed for EventFeed {
    async fn subscribe(&self, shared: &Shared, link: &Link) -> Result<Subscribed, BrokerError> {
        shared.ensure_events(link, &self.exchange).await?;
        let channel = shared.channel(link).await?;
        let queue = self.declare_queue(shared, &channel).await?;
        for key in &self.keys {
            let bind = channel.queue_bind(
                queue.clone(),
                name(&self.exchange)?,
                name(key)?,
                QueueBindOptions::default(),
                FieldTable::default(),
            );
            shared.bounded("binding a subscriber queue", bind).await?;
        }
        let auto_ack = BasicConsumeOptions {
            no_ack: true,
            exclusive: true,
            ..BasicConsumeOptions::default()
        };
        let consume = channel.basic_consume(
            queue,
            ShortString::default(),
            auto_ack,
            FieldTable::default(),
        );
        let consumer = shared.bounded("consuming events", consume).await?;
        // Bound: every process sends what it held back again, this one
        // before its subscriber hears anything.
        self.unheard.forget();
        let notice = Route {
            exchange: &self.exchange,
            key: LISTENING_KEY,
            mandatory: false,
        };
        let me = self.unheard.me.as_bytes();
        let told = shared.confirm(link, notice, me, BasicProperties::default());
        if let Confirmation::Nack(_) = told.await? {
            return Err(BrokerError::Unavailable(format!(
                "RabbitMQ refused a listening notice on {}",
                self.exchange
            )));
        }
        Ok(Subscribed::new(link.generation, consumer, channel))
    }

    fn forward(&self, _generation: u64, _serial: u64, delivery: LapinDelivery) -> bool {
        if delivery.routing_key.as_str() == LISTENING_KEY {
            self.unheard.heard_from(&delivery.data);
            return true;
        }
        match events_of(&delivery.data) {
            Ok(events) => events
                .into_iter()
                .all(|event| self.sender.send(event).is_ok()),
            Err(error) => {
                tracing::debug!(%error, key = %delivery.routing_key, "skipping a malformed event");
                true
            }
        }
    }

    async fn abandoned(&self) {
        self.sender.closed().await;
    }
}

impl EventFeed {
    /// A server-named queue of this subscriber alone, gone with its
    /// connection, bounded like the ring (dropping its oldest) so that a
    /// stalled process cannot fill RabbitMQ.
    async fn declare_queue(
        &self,
        shared: &Shared,
        channel: &Channel,
    ) -> Result<ShortString, BrokerError> {
        let options = QueueDeclareOptions {
            exclusive: true,
            auto_delete: true,
            ..QueueDeclareOptions::default()
        };
        let mut args = FieldTable::default();
        // Classic whatever the vhost's default type: exclusive queues are.
        args.insert("x-queue-type".into(), text("classic"));
        let bound = i64::try_from(self.buffer).unwrap_or(i64::MAX);
        args.insert("x-max-length".into(), AMQPValue::LongLongInt(bound));
        // A message carries up to a few hundred events: bound the bytes
        // too, so a deep buffer cannot hold RabbitMQ's memory.
        args.insert(
            "x-max-length-bytes".into(),
            AMQPValue::LongLongInt(SUBSCRIBER_QUEUE_BYTES),
        );
        let declare = channel.queue_declare(ShortString::default(), options, args);
        let queue = shared
            .bounded("declaring a subscriber queue", declare)
            .await?;
        Ok(queue.name().clone())
    }
}

struct RabbitSubscription {
    events: broadcast::Receiver<Event>,
}

#[async_trait]
impl Subscription for RabbitSubscription {
    async fn next(&mut self) -> Option<Event> {
        loop {
            match self.events.recv().await {
                Ok(event) => return Some(event),
                // Already moved past what it missed; carry on.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One event or an array of them, whitespace before either, and
    /// anything else refused.
    #[test]
    fn an_events_message_holds_one_event_or_an_array() {
        let event = |id: &str| Event {
            kind: crate::EventKind::Job,
            id: id.into(),
            tenant: "t".into(),
            tool: "x".into(),
            state: crate::EventState::parse("succeeded").expect("a state"),
            run_id: "r".into(),
            body: serde_json::json!({"status": "ok"}).into(),
            callback: false,
            life: 0,
            ..Default::default()
        };
        let one = serde_json::to_vec(&event("a")).expect("json");
        assert_eq!(events_of(&one).expect("one"), [event("a")]);
        let many = serde_json::to_vec(&[event("a"), event("b")]).expect("json");
        assert_eq!(events_of(&many).expect("many"), [event("a"), event("b")]);
        let spaced = [b" \n".as_slice(), &many].concat();
        assert_eq!(events_of(&spaced).expect("spaced").len(), 2);
        for bad in [&b""[..], b"[1]", b"{}", b"42", b"[{\"id\": 1}]"] {
            assert!(
                events_of(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
