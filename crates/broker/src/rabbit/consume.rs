//! A worker's side of a pool queue: its [`PoolFeed`] (manual acks, a
//! bounded prefetch), the [`RabbitConsumer`] handing out each id of a
//! message as a delivery of its own, and how those deliveries settle the
//! message: acknowledged once every one of them is, requeued (all of it) if
//! any was requeued or dropped unsettled, else dead-lettered if any was
//! rejected. It must never settle a message before each of its ids is
//! settled, nor hand out a delivery whose channel has closed (RabbitMQ has
//! put it back, and it comes again).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::StreamExt;
use lapin::message::Delivery as LapinDelivery;
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use tokio::sync::{Notify, mpsc};
use toolfleet_core::TraceContext;

use super::acks::AckGroup;
use super::link::{Feed, Link, Shared, Subscribed, start_feed};
use super::topology::{PoolQueues, name};
use super::{RabbitBroker, lock};
use crate::{Acker, BrokerError, Consumer, Delivery};

impl RabbitBroker {
    /// [`Broker::consume`](crate::Broker::consume): a worker's consumer of
    /// `pool`, subscribed now and again after every reconnect.
    pub(super) async fn consume_pool(
        &self,
        pool: &str,
        prefetch: u16,
    ) -> Result<Box<dyn Consumer>, BrokerError> {
        let prefetch = match prefetch {
            0 => self.shared().options.default_prefetch.max(1),
            n => n,
        };
        self.consume_queue(pool, prefetch, false).await
    }

    /// [`Broker::consume_dead`](crate::Broker::consume_dead): the pool's
    /// dead-letter queue, each delivery with its `x-first-death-reason`.
    pub(super) async fn consume_dead_letters(
        &self,
        pool: &str,
    ) -> Result<Box<dyn Consumer>, BrokerError> {
        self.consume_queue(pool, DEAD_PREFETCH, true).await
    }

    async fn consume_queue(
        &self,
        pool: &str,
        prefetch: u16,
        dead: bool,
    ) -> Result<Box<dyn Consumer>, BrokerError> {
        let shared = self.shared();
        let (sender, deliveries) = mpsc::unbounded_channel();
        let wanted = Arc::new(Wanted {
            prefetch: AtomicU16::new(prefetch),
            changed: Notify::new(),
        });
        let feed = PoolFeed {
            queues: self.queues(pool)?,
            prefetch,
            wanted: Arc::clone(&wanted),
            dead,
            sender,
        };
        start_feed(shared, feed).await?;
        Ok(Box::new(RabbitConsumer {
            shared: Arc::clone(shared),
            deliveries,
            wanted,
            timeout: shared.options.operation_timeout,
            dead,
            parts: VecDeque::new(),
            message: None,
            group: None,
        }))
    }
}

/// How many dead letters a consumer of them holds unacknowledged.
const DEAD_PREFETCH: u16 = 16;

/// The header RabbitMQ gives a message it dead-letters: why, the first time
/// (read when the message carries no `x-death`).
const DEATH_REASON: &str = "x-first-death-reason";

/// Why and when RabbitMQ last dead-lettered a message: the newest entry of
/// its `x-death` header (a message delayed on its way here died once
/// already, `expired`, in its delay queue), its time in Unix milliseconds
/// at the end of the second RabbitMQ gives; else `x-first-death-reason`.
fn death_of(headers: &FieldTable) -> (Option<String>, Option<i64>) {
    let newest = match headers.inner().get("x-death") {
        Some(AMQPValue::FieldArray(deaths)) => deaths.as_slice().first().and_then(|d| match d {
            AMQPValue::FieldTable(death) => Some(death.clone()),
            _ => None,
        }),
        _ => None,
    };
    let Some(death) = newest else {
        return (text_header(headers, DEATH_REASON).map(str::to_owned), None);
    };
    let reason = text_header(&death, "reason").map(str::to_owned);
    let at = match death.inner().get("time") {
        Some(AMQPValue::Timestamp(seconds)) => i64::try_from(*seconds)
            .ok()
            .map(|s| s.saturating_mul(1000).saturating_add(999)),
        _ => None,
    };
    (
        reason.or_else(|| text_header(headers, DEATH_REASON).map(str::to_owned)),
        at,
    )
}

/// A worker's feed: one pool queue (or its dead-letter queue), manual
/// acks, a bounded prefetch.
///
/// RabbitMQ counts a prefetch per consumer, fixed when it consumes, so a
/// feed grows past the prefetch it was opened with by a second consumer of
/// the same queue on the same channel (its deliveries acknowledged on that
/// channel like the first's), and shrinks back by cancelling it: what that
/// one delivered stays in hand until settled, and no more comes to it.
struct PoolFeed {
    queues: PoolQueues,
    /// The first consumer's prefetch.
    prefetch: u16,
    /// The prefetch the consumer asks for now.
    wanted: Arc<Wanted>,
    /// The dead-letter queue rather than the pool queue.
    dead: bool,
    /// Unbounded here because RabbitMQ bounds it: at most the prefetch of
    /// unacknowledged deliveries are ever in flight.
    sender: mpsc::UnboundedSender<Came>,
}

/// A delivery as it came: on which connection and channel, and when.
struct Came {
    generation: u64,
    /// The subscription whose channel it came on ([`Subscribed::serial`]).
    serial: u64,
    received: Instant,
    delivery: LapinDelivery,
}

/// The prefetch a consumer asks its feed for.
struct Wanted {
    prefetch: AtomicU16,
    changed: Notify,
}

impl PoolFeed {
    fn queue(&self) -> &str {
        match self.dead {
            true => &self.queues.dead,
            false => &self.queues.pool,
        }
    }

    /// Consumes the feed's queue on `channel`, at most `prefetch`
    /// unacknowledged.
    async fn consume_on(
        &self,
        shared: &Shared,
        channel: &lapin::Channel,
        prefetch: u16,
    ) -> Result<lapin::Consumer, BrokerError> {
        let qos = channel.basic_qos(prefetch, BasicQosOptions::default());
        shared.bounded("setting the prefetch", qos).await?;
        let queue = self.queue();
        let consume = channel.basic_consume(
            name(queue)?,
            ShortString::default(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        );
        shared.bounded(&format!("consuming {queue}"), consume).await
    }

    /// What the second consumer should take: the wanted prefetch beyond
    /// the first one's.
    fn extra(&self) -> u16 {
        self.wanted
            .prefetch
            .load(Ordering::Relaxed)
            .saturating_sub(self.prefetch)
    }
}

impl Feed for PoolFeed {
    async fn subscribe(&self, shared: &Shared, link: &Link) -> Result<Subscribed, BrokerError> {
        // Declared on every subscribe: the consumer may have ended because
        // the queue was deleted.
        {
            let _declaring = shared.declaring(link).await?;
            shared.declare_pool(link, &self.queues).await?;
        }
        let channel = shared.channel(link).await?;
        let consumer = self.consume_on(shared, &channel, self.prefetch).await?;
        let mut sub = Subscribed::new(link.generation, consumer, channel);
        self.adjust(shared, &mut sub).await?;
        Ok(sub)
    }

    fn forward(&self, generation: u64, serial: u64, delivery: LapinDelivery) -> bool {
        let came = Came {
            generation,
            serial,
            received: Instant::now(),
            delivery,
        };
        self.sender.send(came).is_ok()
    }

    async fn abandoned(&self) {
        self.sender.closed().await;
    }

    async fn wants_adjusting(&self) {
        self.wanted.changed.notified().await;
    }

    async fn adjust(&self, shared: &Shared, sub: &mut Subscribed) -> Result<(), BrokerError> {
        let wanted = self.extra();
        if sub.extra.as_ref().map_or(0, |(_, prefetch)| *prefetch) == wanted {
            return Ok(());
        }
        if let Some((mut extra, _)) = sub.extra.take() {
            let tag = extra.tag();
            let cancel = sub.channel.basic_cancel(tag, BasicCancelOptions::default());
            shared.bounded("cancelling a consumer", cancel).await?;
            // Once the cancel is answered, what it delivered is all in
            // lapin's hands: handed on, its stream ends.
            let handed = async {
                while let Some(next) = extra.next().await {
                    if let Ok(delivery) = next {
                        self.forward(sub.generation, sub.serial, delivery);
                    }
                }
            };
            if tokio::time::timeout(shared.options.operation_timeout, handed)
                .await
                .is_err()
            {
                return Err(BrokerError::Unavailable(
                    "a cancelled consumer did not end".into(),
                ));
            }
        }
        if wanted > 0 {
            let extra = self.consume_on(shared, &sub.channel, wanted).await?;
            sub.extra = Some((extra, wanted));
        }
        Ok(())
    }
}

struct RabbitConsumer {
    shared: Arc<Shared>,
    deliveries: mpsc::UnboundedReceiver<Came>,
    /// The prefetch asked of the feed.
    wanted: Arc<Wanted>,
    timeout: Duration,
    /// Of dead letters: each delivery says why it was dead-lettered.
    dead: bool,
    /// The ids of a message of several not handed out yet, and that
    /// message.
    parts: VecDeque<Delivery>,
    message: Option<Arc<Mutex<SharedMessage>>>,
    /// The acks of the current channel's deliveries, and the serial of its
    /// subscription: a delivery of another comes from a new channel (tags
    /// start at 1 on each).
    group: Option<(Arc<AckGroup>, u64)>,
}

#[async_trait]
impl Consumer for RabbitConsumer {
    /// Cancel-safe: a delivery leaves the channel only when `recv` returns,
    /// and nothing is awaited after that.
    async fn next(&mut self) -> Option<Delivery> {
        // The rest of a message whose channel has since closed is back in
        // its queue with the message: dropped here, not handed out twice.
        let usable = self.message.as_ref().is_some_and(|message| {
            lock(message)
                .acker
                .as_ref()
                .is_some_and(RabbitAcker::usable)
        });
        if usable && let Some(part) = self.parts.pop_front() {
            return Some(part);
        }
        self.parts.clear();
        self.message = None;
        loop {
            let came = self.deliveries.recv().await?;
            // One from a channel that has since closed is back in its queue
            // and comes again; handing it out would only fail its ack.
            if came.delivery.acker.usable() && !self.shared.is_gone(came.generation) {
                let (mut parts, message) = self.deliveries_of(came);
                if let Some(first) = parts.pop_front() {
                    self.parts = parts;
                    self.message = message;
                    return Some(first);
                }
            }
        }
    }

    fn set_prefetch(&mut self, prefetch: u16) {
        let before = self.wanted.prefetch.swap(prefetch, Ordering::Relaxed);
        if before != prefetch {
            self.wanted.changed.notify_one();
        }
    }
}

impl RabbitConsumer {
    /// The deliveries of one message: one, or one per id of a message of
    /// several (their acks settle the message together, which comes too).
    fn deliveries_of(
        &mut self,
        came: Came,
    ) -> (VecDeque<Delivery>, Option<Arc<Mutex<SharedMessage>>>) {
        let Came {
            generation,
            serial,
            received,
            delivery,
        } = came;
        let tag = delivery.delivery_tag;
        let group = match &self.group {
            Some((group, of)) if *of == serial => Arc::clone(group),
            _ => AckGroup::start(Arc::clone(&self.shared), generation),
        };
        group.delivered(tag);
        self.group = Some((Arc::clone(&group), serial));
        let acker = RabbitAcker {
            acker: delivery.acker,
            timeout: self.timeout,
            settled: false,
            group,
            tag,
        };
        // A body that is not UTF-8 is no job id; the worker finds no such
        // job and rejects it into the dead-letter queue.
        let body = String::from_utf8_lossy(&delivery.data);
        let ids: Vec<&str> = body.split('\n').filter(|id| !id.is_empty()).collect();
        let headers = delivery.properties.headers().as_ref();
        let (reason, died_at) = headers.filter(|_| self.dead).map_or((None, None), death_of);
        if ids.len() <= 1 {
            let trace = headers.and_then(trace_of);
            let one = Delivery::new(body.into_owned(), delivery.redelivered, Box::new(acker))
                .with_received(received)
                .with_trace(trace)
                .with_dead_reason(reason)
                .with_died_at(died_at);
            return (VecDeque::from([one]), None);
        }
        let message = Arc::new(Mutex::new(SharedMessage {
            acker: Some(acker),
            unsettled: ids.len(),
            requeue: false,
            reject: false,
        }));
        let parts = ids
            .into_iter()
            .map(|id| {
                let part = PartAcker {
                    message: message.clone(),
                    settled: false,
                };
                Delivery::new(id.to_owned(), delivery.redelivered, Box::new(part))
                    .with_received(received)
                    .with_dead_reason(reason.clone())
                    .with_died_at(died_at)
            })
            .collect();
        (parts, Some(message))
    }
}

/// A message of several job ids, settled once each of its deliveries is.
struct SharedMessage {
    /// Taken by the last delivery settled.
    acker: Option<RabbitAcker>,
    unsettled: usize,
    /// A delivery asked for the message back (or was dropped unsettled).
    requeue: bool,
    /// A delivery could not be processed.
    reject: bool,
}

/// The acker of one job id of a message of several.
struct PartAcker {
    message: Arc<Mutex<SharedMessage>>,
    settled: bool,
}

impl PartAcker {
    /// Notes how this part is settled; the last part takes the message's
    /// acker and how the message is to be settled: requeued if any part
    /// asked, else rejected if any was, else acknowledged.
    fn note(&mut self, how: Settle) -> Option<(RabbitAcker, Settle)> {
        self.settled = true;
        let mut message = lock(&self.message);
        match how {
            Settle::Ack => {}
            Settle::Requeue => message.requeue = true,
            Settle::Reject => message.reject = true,
        }
        message.unsettled = message.unsettled.saturating_sub(1);
        if message.unsettled > 0 {
            return None;
        }
        let how = if message.requeue {
            Settle::Requeue
        } else if message.reject {
            Settle::Reject
        } else {
            Settle::Ack
        };
        message.acker.take().map(|acker| (acker, how))
    }
}

#[async_trait]
impl Settles for PartAcker {
    async fn settle(mut self: Box<Self>, how: Settle) -> Result<(), BrokerError> {
        match self.note(how) {
            Some((acker, how)) => Box::new(acker).settle(how).await,
            None => Ok(()),
        }
    }
}

/// A part dropped unsettled asks for the message back; the last one
/// dropped drops the message's acker unsettled, which requeues it.
impl Drop for PartAcker {
    fn drop(&mut self) {
        if !self.settled {
            drop(self.note(Settle::Requeue));
        }
    }
}

/// The trace context of a message's headers; `None` without a valid
/// `traceparent` (a message from an older publisher, or someone else's).
fn trace_of(headers: &FieldTable) -> Option<TraceContext> {
    let text = |name| text_header(headers, name);
    TraceContext::parse(text("traceparent")?, text("tracestate"))
}

/// The header `name` of a message, when it is text.
fn text_header<'a>(headers: &'a FieldTable, name: &str) -> Option<&'a str> {
    match headers.inner().get(name) {
        Some(AMQPValue::LongString(value)) => std::str::from_utf8(value.as_bytes()).ok(),
        Some(AMQPValue::ShortString(value)) => Some(value.as_str()),
        _ => None,
    }
}

/// How a delivery is settled.
#[derive(Clone, Copy)]
enum Settle {
    Ack,
    Requeue,
    Reject,
}

struct RabbitAcker {
    acker: lapin::Acker,
    timeout: Duration,
    settled: bool,
    /// Its channel's acks, which send this one's.
    group: Arc<AckGroup>,
    tag: u64,
}

#[async_trait]
impl Settles for RabbitAcker {
    /// `Closed` when the delivery's channel is gone, or goes while the
    /// settlement is under way: RabbitMQ has already put the message back,
    /// and another consumer may hold it now. An ack goes through its
    /// channel's flusher (see [`AckGroup`]), which sends acks in groups;
    /// each is answered once sent.
    async fn settle(mut self: Box<Self>, how: Settle) -> Result<(), BrokerError> {
        self.settled = true;
        if !self.usable() {
            return Err(BrokerError::Closed);
        }
        let acker = &self.acker;
        let sent = async {
            match how {
                Settle::Ack => {
                    Ok(self.group.ack(self.tag, acker.clone()).await && !acker.poisoned())
                }
                Settle::Requeue => {
                    let acker = acker.clone();
                    let nack = async move { acker.nack(requeue()).await };
                    let sent = self.group.settle_alone(self.tag, nack).await;
                    sent.unwrap_or(Ok(false))
                }
                Settle::Reject => {
                    let acker = acker.clone();
                    let options = BasicRejectOptions { requeue: false };
                    let reject = async move { acker.reject(options).await };
                    let sent = self.group.settle_alone(self.tag, reject).await;
                    sent.unwrap_or(Ok(false))
                }
            }
        };
        match tokio::time::timeout(self.timeout, sent).await {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false) | Err(_)) => Err(BrokerError::Closed),
            Err(_) => Err(BrokerError::Unavailable(format!(
                "settling a delivery took over {:?}",
                self.timeout
            ))),
        }
    }
}

impl RabbitAcker {
    /// Neither settled nor of a channel that is gone.
    fn usable(&self) -> bool {
        self.acker.usable() && !self.group.is_gone()
    }
}

fn requeue() -> BasicNackOptions {
    BasicNackOptions {
        multiple: false,
        requeue: true,
    }
}

/// Settles a delivery one way or another; each is an [`Acker`].
#[async_trait]
trait Settles: Send + Sync {
    async fn settle(self: Box<Self>, how: Settle) -> Result<(), BrokerError>;
}

#[async_trait]
impl<T: Settles + 'static> Acker for T {
    async fn ack(self: Box<Self>) -> Result<(), BrokerError> {
        self.settle(Settle::Ack).await
    }

    async fn requeue(self: Box<Self>) -> Result<(), BrokerError> {
        self.settle(Settle::Requeue).await
    }

    async fn reject(self: Box<Self>) -> Result<(), BrokerError> {
        self.settle(Settle::Reject).await
    }
}

/// A delivery dropped unsettled (its worker panicked or gave up) goes back
/// to the queue at once instead of holding a place under the prefetch until
/// its channel closes.
impl Drop for RabbitAcker {
    fn drop(&mut self) {
        if self.settled || !self.usable() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (acker, group, tag) = (self.acker.clone(), Arc::clone(&self.group), self.tag);
            runtime.spawn(async move {
                // Failing means the channel closed, which requeues it too.
                let nack = async move { acker.nack(requeue()).await };
                let _ = group.settle_alone(tag, nack).await;
            });
        }
    }
}
