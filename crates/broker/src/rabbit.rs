//! The RabbitMQ broker and notices of the distributed fleet, on lapin.
//!
//! This module owns toolfleet's topology on RabbitMQ, every name under one
//! prefix (`toolfleet` unless [`RabbitOptions::prefix`] says otherwise):
//!
//! | name | what it is |
//! |---|---|
//! | `<prefix>.pool.<pool>` | durable quorum queue of a pool's job ids, bounded by `x-max-length` (messages) with `reject-publish` |
//! | `<prefix>.dlx` | durable direct exchange taking a pool's rejected messages, keyed by pool |
//! | `<prefix>.dead.<pool>` | durable quorum queue of a pool's dead letters, for an operator |
//! | `<prefix>.delay.<pool>.<ms>` | durable quorum queue holding delayed job ids `<ms>` milliseconds, then dead-lettering them into the pool queue |
//! | `<prefix>.events` | durable topic exchange of [`Event`]s, keyed `<tenant>.<tool>.<state>` |
//!
//! It also owns one connection per [`RabbitBroker`] (or [`RabbitNotices`])
//! and the supervisor that replaces it: when the connection dies, callers get
//! [`BrokerError::Unavailable`] at once, a reconnect with backoff starts, and
//! every consumer and subscription subscribes again by itself.
//!
//! It must never be the record of a job: a message carries a job id (and, in
//! its `traceparent` and `tracestate` headers, the job's W3C trace context,
//! which dead-lettering out of a delay queue keeps) and the store decides
//! what it means, so a lost confirm may be retried and a duplicate is
//! harmless. It must never block a caller on an unreachable broker (every
//! call to RabbitMQ is bounded by [`RabbitOptions::operation_timeout`]), nor
//! hold a worker for a delay (delays wait in RabbitMQ, not here).
//!
//! Publishes to a pool share messages under load, as claims share a commit
//! in the store: a publish that finds one of [`PUBLISH_SLOTS`] free goes at
//! once (with any made while its task yields once), a lone one in a message
//! of its own with its trace headers; while every slot waits for its
//! confirm, the job ids published meanwhile wait too, and the next free slot
//! sends them together (up to
//! [`RabbitOptions::jobs_per_message`]), one id per line and no trace headers
//! (the worker takes each job's trace from the store). A consumer hands out
//! each id of such a message as a delivery of its own; the message is
//! acknowledged once every one of them is, requeued (all of it) if any of
//! them was requeued or dropped (the ones already settled are then refused by
//! their claim), else dead-lettered if any was rejected. So RabbitMQ carries
//! one message per confirm round trip, not one per job, and a queue's depth
//! and bound count messages, each of one or more jobs. A consumer's prefetch
//! counts messages too, so a worker may hold more ids than it has slots, the
//! last of a message waiting for the others: pools of long jobs (the pools
//! in [`RabbitOptions::one_job_per_message`], or every pool with
//! `jobs_per_message` 1) publish each job alone, so that no message waits
//! unacknowledged past RabbitMQ's `consumer_timeout`.
//!
//! An `amqps://` URL connects over TLS through rustls (see `amqps`), the
//! server's certificate checked in full, its chain and its host name,
//! against the URL's `cacertfile`, else [`RabbitOptions::ca_file`], else the
//! platform's roots (`toolfleet_tls::amqp` decides).

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use backon::{BackoffBuilder, ExponentialBuilder};
use futures_util::StreamExt;
use lapin::message::Delivery as LapinDelivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    BasicRejectOptions, ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind,
    ExchangeKind,
};
use rustls::ClientConfig;
use tokio::sync::{broadcast, mpsc, watch};
use toolfleet_core::TraceContext;
use toolfleet_core::group::{Group, GroupError};

use crate::memory::{DEFAULT_CAPACITY, DEFAULT_NOTICE_BUFFER, MAX_NOTICE_BUFFER};
use crate::{Acker, Broker, BrokerError, Consumer, Delivery, Event, Notices, Subscription};

/// The prefix of every name when [`RabbitOptions`] does not say otherwise.
pub const DEFAULT_PREFIX: &str = "toolfleet";

/// The longest delay [`RabbitBroker::publish_delayed`] honours, 2^31 ms
/// (about 24.8 days); a longer delay is shortened to it.
pub const MAX_DELAY: Duration = Duration::from_millis(MAX_DELAY_MS);

const MAX_DELAY_MS: u64 = 1 << 31;

/// One doubling of the delay ladder, in milliseconds; each later doubling
/// multiplies these by a power of two. Four steps per doubling keep a delay
/// at most about 21% late while a pool needs few delay queues.
const LADDER_STEPS: [u64; 4] = [16, 19, 23, 27];

/// The most bytes a notices subscriber's queue holds before RabbitMQ drops
/// its oldest messages (the process has stalled: its events are stale).
const SUBSCRIBER_QUEUE_BYTES: i64 = 64 << 20;

/// AMQP names and routing keys are short strings.
const MAX_NAME: usize = 255;

/// Messages of one pool waiting for their confirm at once, per broker.
pub const PUBLISH_SLOTS: usize = 2;

/// The most job ids one message carries: the default of
/// [`RabbitOptions::jobs_per_message`] and its bound.
pub const MAX_IDS_PER_MESSAGE: usize = 64;

/// How to reach RabbitMQ and how to lay out and bound the queues.
#[derive(Clone, Debug)]
pub struct RabbitOptions {
    /// The first part of every queue and exchange name, so that deployments
    /// (or tests) sharing one RabbitMQ never see each other's messages. It
    /// also names the connection in RabbitMQ's tools.
    pub prefix: String,
    /// The prefetch of a consumer asked for 0, which AMQP would read as
    /// "unlimited": a worker never wants more than it can run.
    pub default_prefetch: u16,
    /// The bound of a pool queue (and of each of its delay queues): once a
    /// queue holds more, publishing answers [`BrokerError::Full`] until it
    /// is below the bound again. RabbitMQ's quorum queues check after
    /// taking a message, so a queue takes one beyond it (or a few, when
    /// publishers race) before refusing. `None`: unbounded. Fixed when a
    /// queue is first declared: one that exists with other arguments is used
    /// as it is (change it with a RabbitMQ policy).
    pub max_length: Option<u32>,
    /// How long one call to RabbitMQ (connect, declare, publish confirm) may
    /// take before it answers [`BrokerError::Unavailable`].
    pub operation_timeout: Duration,
    /// The first pause between reconnect (and resubscribe) attempts; it
    /// doubles, with jitter, up to [`RabbitOptions::reconnect_max`].
    pub reconnect_min: Duration,
    /// The longest pause between reconnect attempts.
    pub reconnect_max: Duration,
    /// How far a notice subscriber may fall behind before it skips events.
    pub notice_buffer: usize,
    /// The most job ids a message published under load carries (see the
    /// module's documentation); 1 publishes each job in a message of its
    /// own, so that a queue's length counts jobs.
    pub jobs_per_message: usize,
    /// Pools whose jobs are each published in a message of their own
    /// whatever `jobs_per_message` says: pools of long jobs (agents), whose
    /// ids would otherwise wait in a worker behind each other's runs.
    pub one_job_per_message: BTreeSet<String>,
    /// The PEM file of the CA that signed RabbitMQ's certificate, for an
    /// `amqps://` URL without `cacertfile` (toolfleet's `broker_ca_file`);
    /// `None`: the platform's roots. Refused with an `amqp://` URL.
    pub ca_file: Option<PathBuf>,
}

impl Default for RabbitOptions {
    fn default() -> Self {
        RabbitOptions {
            prefix: DEFAULT_PREFIX.to_owned(),
            default_prefetch: 1,
            max_length: u32::try_from(DEFAULT_CAPACITY).ok(),
            operation_timeout: Duration::from_secs(5),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(10),
            notice_buffer: DEFAULT_NOTICE_BUFFER,
            jobs_per_message: MAX_IDS_PER_MESSAGE,
            one_job_per_message: BTreeSet::new(),
            ca_file: None,
        }
    }
}

impl RabbitOptions {
    fn backoff(&self) -> impl Iterator<Item = Duration> + use<> {
        ExponentialBuilder::default()
            .with_min_delay(self.reconnect_min)
            .with_max_delay(self.reconnect_max)
            .with_jitter()
            .without_max_times()
            .build()
    }
}

/// The delay a message published with `delay` really waits: `delay` rounded
/// up to whole milliseconds, then up to the next step of a fixed ladder of
/// 16, 19, 23 and 27 ms times a power of two (16, 19, 23, 27, 32, 38, 46,
/// 54, 64, ... ms), capped at [`MAX_DELAY`]. Each step is one delay queue
/// with one TTL, and a queue with one TTL expires in publish order, so a
/// shorter delay published after a longer one arrives first whenever the two
/// fall on different steps, and in publish order when they share one.
pub fn delay_bucket(delay: Duration) -> Duration {
    Duration::from_millis(bucket_ms(delay))
}

fn bucket_ms(delay: Duration) -> u64 {
    let whole = delay.as_millis() + u128::from(!delay.subsec_nanos().is_multiple_of(1_000_000));
    let wanted = u64::try_from(whole).unwrap_or(u64::MAX).min(MAX_DELAY_MS);
    let mut scale = 1;
    loop {
        // Terminates: MAX_DELAY_MS is itself a step (16 * 2^27).
        if let Some(step) = LADDER_STEPS
            .iter()
            .map(|s| s * scale)
            .find(|s| *s >= wanted)
        {
            return step;
        }
        scale *= 2;
    }
}

/// The [`Broker`] on RabbitMQ. Clones share one connection; it closes (and
/// consumers end) when [`RabbitBroker::close`] is called or the last clone,
/// and the last [`RabbitNotices`] made by [`RabbitBroker::notices`], is
/// dropped.
#[derive(Clone)]
pub struct RabbitBroker {
    handle: Arc<CloseOnDrop>,
    /// Each pool's publishes, grouped into shared messages under load.
    publishers: Arc<Mutex<HashMap<String, Arc<Publisher>>>>,
}

/// Publishes job ids to one pool's queue, several to a message under load.
type Publisher = Group<Publish, (), BrokerError>;

/// One job id to publish.
struct Publish {
    job_id: String,
    trace: Option<TraceContext>,
}

impl GroupError for BrokerError {
    fn unanswered(message: String) -> Self {
        BrokerError::Unavailable(message)
    }
}

/// Consumers and the supervisor hold the [`Shared`] state itself, so only
/// the caller's handles decide when the connection closes.
struct CloseOnDrop(Arc<Shared>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl RabbitBroker {
    /// Connects to RabbitMQ at `url` (`amqp://user:password@host:5672/vhost`,
    /// or `amqps://` and port 5671 for TLS), answering
    /// [`BrokerError::Unavailable`] if it cannot. Queues are declared when a
    /// pool is first used.
    pub async fn connect(url: &str, options: RabbitOptions) -> Result<Self, BrokerError> {
        let shared = Shared::start(url, options).await?;
        Ok(RabbitBroker {
            handle: Arc::new(CloseOnDrop(shared)),
            publishers: Arc::default(),
        })
    }

    /// The notices of this deployment on the same connection.
    pub fn notices(&self) -> RabbitNotices {
        RabbitNotices::on(Arc::clone(&self.handle))
    }

    /// Ends every consumer and refuses further work. Messages stay in
    /// RabbitMQ; unacknowledged deliveries return to their queues.
    pub fn close(&self) {
        self.shared().close();
    }

    /// Drops the connection as a broker restart would: calls answer
    /// `Unavailable` until the supervisor has reconnected, and consumers
    /// resubscribe by themselves. For tests and for moving to another node.
    pub async fn force_reconnect(&self) {
        self.shared().force_reconnect().await;
    }

    /// Closes the broker (if it is not already), then deletes every queue
    /// and exchange it declared, with their messages, over a connection of
    /// its own. For tests and for retiring a prefix; never part of running a
    /// fleet.
    pub async fn close_and_delete(&self) -> Result<(), BrokerError> {
        self.shared().close_and_delete().await
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.handle.0
    }

    fn queues(&self, pool: &str) -> Result<PoolQueues, BrokerError> {
        PoolQueues::new(&self.shared().options.prefix, pool)
    }

    /// The publisher of `pool`, started on its first publish; `None` where
    /// each job goes in a message of its own.
    fn publisher(&self, pool: &str) -> Result<Option<Arc<Publisher>>, BrokerError> {
        let options = &self.shared().options;
        if options.jobs_per_message <= 1 || options.one_job_per_message.contains(pool) {
            return Ok(None);
        }
        let mut publishers = lock(&self.publishers);
        if let Some(publisher) = publishers.get(pool) {
            return Ok(Some(publisher.clone()));
        }
        let queues = Arc::new(self.queues(pool)?);
        let shared = self.shared().clone();
        let publisher = Arc::new(Group::spawn(
            "publishing job ids",
            PUBLISH_SLOTS,
            shared
                .options
                .jobs_per_message
                .clamp(1, MAX_IDS_PER_MESSAGE),
            move |batch: Vec<Publish>| {
                let (shared, queues) = (shared.clone(), queues.clone());
                async move {
                    let sent = shared.publish_ids(&queues, &batch).await;
                    Ok(vec![sent; batch.len()])
                }
            },
        ));
        publishers.insert(pool.to_owned(), publisher.clone());
        Ok(Some(publisher))
    }
}

impl std::fmt::Debug for RabbitBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitBroker")
            .field("url", &redact(&self.shared().url))
            .field("options", &self.shared().options)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Broker for RabbitBroker {
    async fn ping(&self) -> Result<(), BrokerError> {
        self.shared().link().map(drop)
    }

    async fn publish_traced(
        &self,
        pool: &str,
        job_id: &str,
        trace: Option<&TraceContext>,
    ) -> Result<(), BrokerError> {
        let publish = Publish {
            job_id: job_id.to_owned(),
            trace: trace.cloned(),
        };
        match self.publisher(pool)? {
            Some(publisher) => publisher.run(publish).await,
            None => {
                let queues = self.queues(pool)?;
                self.shared().publish_ids(&queues, &[publish]).await
            }
        }
    }

    async fn publish_delayed_traced(
        &self,
        pool: &str,
        job_id: &str,
        delay: Duration,
        trace: Option<&TraceContext>,
    ) -> Result<(), BrokerError> {
        if delay.is_zero() {
            return self.publish_traced(pool, job_id, trace).await;
        }
        let queues = self.queues(pool)?;
        let shared = self.shared();
        let link = shared.link()?;
        let sent = async {
            let queue = shared
                .ensure_delay(&link, &queues, bucket_ms(delay))
                .await?;
            shared
                .publish_job(&link, &queues, &queue, job_id.as_bytes(), trace)
                .await
        };
        shared.noting_loss(&link, sent.await)
    }

    async fn consume(&self, pool: &str, prefetch: u16) -> Result<Box<dyn Consumer>, BrokerError> {
        let shared = self.shared();
        let prefetch = match prefetch {
            0 => shared.options.default_prefetch.max(1),
            n => n,
        };
        let (sender, deliveries) = mpsc::unbounded_channel();
        let feed = PoolFeed {
            queues: self.queues(pool)?,
            prefetch,
            sender,
        };
        start_feed(shared, feed).await?;
        Ok(Box::new(RabbitConsumer {
            deliveries,
            timeout: shared.options.operation_timeout,
            parts: VecDeque::new(),
            message: None,
        }))
    }

    async fn depth(&self, pool: &str) -> Result<u64, BrokerError> {
        let queues = self.queues(pool)?;
        let shared = self.shared();
        let link = shared.link()?;
        let counted = shared.count(&link, &queues.pool).await;
        shared.noting_loss(&link, counted)
    }
}

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
    /// Publishes one message of events to the exchange and awaits its confirm.
    async fn send(&self, key: &str, body: &[u8], what: &str) -> Result<(), BrokerError> {
        let shared = self.shared();
        let link = shared.link()?;
        let sent = async {
            shared.ensure_events(&link, &self.exchange).await?;
            let properties =
                BasicProperties::default().with_content_type("application/json".into());
            let route = Route {
                exchange: &self.exchange,
                key,
                mandatory: false,
            };
            match shared.confirm(&link, route, body, properties).await? {
                Confirmation::Nack(_) => Err(BrokerError::Unavailable(format!(
                    "RabbitMQ refused {what} on {}",
                    self.exchange
                ))),
                _ => Ok(()),
            }
        };
        shared.noting_loss(&link, sent.await)
    }

    /// Connects to RabbitMQ at `url` for notices alone; see
    /// [`RabbitBroker::notices`] to share the broker's connection.
    pub async fn connect(url: &str, options: RabbitOptions) -> Result<Self, BrokerError> {
        let shared = Shared::start(url, options).await?;
        Ok(Self::on(Arc::new(CloseOnDrop(shared))))
    }

    fn on(handle: Arc<CloseOnDrop>) -> Self {
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
    pub fn only_states(mut self, states: &[&str]) -> Self {
        self.keys = states.iter().map(|state| format!("#.{state}")).collect();
        self
    }

    /// As [`RabbitBroker::force_reconnect`]: subscriptions resubscribe by
    /// themselves, and miss what is published while they do.
    pub async fn force_reconnect(&self) {
        self.shared().force_reconnect().await;
    }

    /// As [`RabbitBroker::close_and_delete`], including the events exchange.
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
        let body = serde_json::to_vec(event)
            .map_err(|e| BrokerError::Unavailable(format!("encoding event {}: {e}", event.id)))?;
        self.send(&event.routing_key(), &body, &event.id).await
    }

    /// Events that share a routing key go as one message whose body is a
    /// JSON array of them (one event alone is a JSON object, as from
    /// [`Notices::publish`]); the messages are published back to back and
    /// their confirms awaited together.
    async fn publish_all(&self, events: &[Event]) -> Result<(), BrokerError> {
        let mut messages = Vec::new();
        for (key, group) in crate::batches(events) {
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

    async fn subscribe(&self) -> Result<Box<dyn Subscription>, BrokerError> {
        let shared = self.shared();
        let buffer = shared.options.notice_buffer.clamp(1, MAX_NOTICE_BUFFER);
        let (sender, events) = broadcast::channel(buffer);
        let feed = EventFeed {
            exchange: self.exchange.clone(),
            keys: self.keys.clone(),
            buffer,
            sender,
        };
        start_feed(shared, feed).await?;
        Ok(Box::new(RabbitSubscription { events }))
    }
}

/// The queue the workers of `pool` consume under `prefix`:
/// `<prefix>.pool.<pool>` (what an autoscaler watching a pool's backlog names).
pub fn pool_queue_name(prefix: &str, pool: &str) -> String {
    format!("{prefix}.pool.{pool}")
}

/// The queue where the workers of `pool` under `prefix` reject what they
/// cannot process: `<prefix>.dead.<pool>`, for an operator.
pub fn dead_letter_queue_name(prefix: &str, pool: &str) -> String {
    format!("{prefix}.dead.{pool}")
}

/// The queue holding job ids of `pool` under `prefix` delayed by `ms`
/// milliseconds (a [`delay_bucket`]): `<prefix>.delay.<pool>.<ms>`.
pub fn delay_queue_name(prefix: &str, pool: &str, ms: u64) -> String {
    format!("{prefix}.delay.{pool}.{ms}")
}

/// The names of one pool's queues.
struct PoolQueues {
    pool: String,
    dead: String,
    /// The pool name: the dead-letter routing key.
    key: String,
    prefix: String,
}

impl PoolQueues {
    fn new(prefix: &str, pool: &str) -> Result<Self, BrokerError> {
        let queues = PoolQueues {
            pool: pool_queue_name(prefix, pool),
            dead: dead_letter_queue_name(prefix, pool),
            key: pool.to_owned(),
            prefix: prefix.to_owned(),
        };
        // The longest name is that of the longest delay queue.
        if queues.delay(MAX_DELAY_MS).len() > MAX_NAME {
            return Err(BrokerError::Unavailable(format!(
                "pool name '{pool}' is too long: with prefix '{prefix}' its queue names \
                 exceed RabbitMQ's {MAX_NAME} bytes"
            )));
        }
        Ok(queues)
    }

    fn delay(&self, ms: u64) -> String {
        delay_queue_name(&self.prefix, &self.key, ms)
    }
}

/// The connection of the moment, as the supervisor sees it.
#[derive(Clone)]
enum LinkState {
    Up(Arc<Link>),
    /// The supervisor is reconnecting.
    Down,
    Closed,
}

/// One connection and its publishing channel.
struct Link {
    generation: u64,
    connection: Connection,
    /// In confirm mode; lapin serialises concurrent publishes on it.
    publisher: Channel,
    /// What is declared on this connection. Declared again on the next one,
    /// in case the broker came back without it (a fresh node).
    ready: Mutex<HashSet<String>>,
    /// Held while a pool's queues (or a delay queue) are declared, so that
    /// publishes and consumers racing to a new queue declare it one at a
    /// time: RabbitMQ has nacked the first publishes to a quorum queue that
    /// several declared at once.
    declaring: tokio::sync::Mutex<()>,
}

impl Link {
    fn is_open(&self) -> bool {
        self.connection.status().connected() && self.publisher.status().connected()
    }

    fn is_ready(&self, name: &str) -> bool {
        lock(&self.ready).contains(name)
    }

    fn mark_ready(&self, name: &str) {
        lock(&self.ready).insert(name.to_owned());
    }

    fn forget(&self, name: &str) {
        lock(&self.ready).remove(name);
    }
}

/// What close_and_delete removes.
#[derive(Default)]
struct Declared {
    queues: BTreeSet<String>,
    exchanges: BTreeSet<String>,
}

/// Where a message goes.
struct Route<'a> {
    exchange: &'a str,
    key: &'a str,
    /// Return the message if no queue takes it.
    mandatory: bool,
}

/// The state behind a broker or notices handle: the connection of the
/// moment, and the supervisor replacing it.
struct Shared {
    url: String,
    /// How to speak TLS to an `amqps://` URL; `None` for `amqp://`.
    tls: Option<Arc<ClientConfig>>,
    options: RabbitOptions,
    state: watch::Sender<LinkState>,
    generations: AtomicU64,
    declared: Mutex<Declared>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is a single insert or remove, so a panic
    // elsewhere cannot leave the set half-changed.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The supervisor: the connection of the moment, noticing its loss, and
/// replacing it with backoff.
impl Shared {
    async fn start(url: &str, options: RabbitOptions) -> Result<Arc<Self>, BrokerError> {
        name(&format!("{}.events", options.prefix))?;
        let tls = toolfleet_tls::amqp::tls_config(url, options.ca_file.as_deref())
            .map_err(BrokerError::Unavailable)?
            .map(Arc::new);
        let shared = Arc::new(Shared {
            url: url.to_owned(),
            tls,
            options,
            state: watch::Sender::new(LinkState::Down),
            generations: AtomicU64::new(0),
            declared: Mutex::default(),
        });
        let link = shared.open_link().await?;
        shared.state.send_replace(LinkState::Up(Arc::new(link)));
        Ok(shared)
    }

    async fn open_link(&self) -> Result<Link, BrokerError> {
        let properties = ConnectionProperties::default()
            .with_connection_name(self.options.prefix.as_str().into());
        let what = format!("connecting to RabbitMQ at {}", redact(&self.url));
        let connection = match &self.tls {
            Some(tls) => {
                let connect = crate::amqps::connect(&self.url, Arc::clone(tls), properties);
                self.bounded(&what, connect).await?
            }
            None => {
                self.bounded(&what, Connection::connect(&self.url, properties))
                    .await?
            }
        };
        let publisher = self
            .bounded("opening a channel", connection.create_channel())
            .await?;
        let confirms = publisher.confirm_select(ConfirmSelectOptions::default());
        self.bounded("enabling publisher confirms", confirms)
            .await?;
        Ok(Link {
            generation: self.generations.fetch_add(1, Ordering::Relaxed),
            connection,
            publisher,
            ready: Mutex::default(),
            declaring: tokio::sync::Mutex::default(),
        })
    }

    /// The connection to use now; `Unavailable` at once while reconnecting.
    fn link(self: &Arc<Self>) -> Result<Arc<Link>, BrokerError> {
        let state = self.state.borrow().clone();
        match state {
            LinkState::Up(link) if link.is_open() => Ok(link),
            LinkState::Up(link) => {
                self.lost(link.generation);
                Err(reconnecting())
            }
            LinkState::Down => Err(reconnecting()),
            LinkState::Closed => Err(BrokerError::Closed),
        }
    }

    /// Waits for a usable connection; `None` once closed.
    async fn wait_link(self: &Arc<Self>) -> Option<Arc<Link>> {
        let mut states = self.state.subscribe();
        loop {
            let state = states.borrow_and_update().clone();
            match state {
                LinkState::Up(link) if link.is_open() => return Some(link),
                LinkState::Up(link) => self.lost(link.generation),
                LinkState::Down => {}
                LinkState::Closed => return None,
            }
            states.changed().await.ok()?;
        }
    }

    async fn until_closed(&self) {
        let mut states = self.state.subscribe();
        // An error means the sender is gone, which is closed too.
        let _ = states.wait_for(|s| matches!(s, LinkState::Closed)).await;
    }

    fn is_closed(&self) -> bool {
        matches!(*self.state.borrow(), LinkState::Closed)
    }

    /// Passes `result` on, starting a reconnect if it failed because the
    /// connection is gone.
    fn noting_loss<T>(
        self: &Arc<Self>,
        link: &Link,
        result: Result<T, BrokerError>,
    ) -> Result<T, BrokerError> {
        if result.is_err() && !link.is_open() {
            self.lost(link.generation);
        }
        result
    }

    /// Starts a reconnect if connection `generation` is current but no
    /// longer open.
    fn check(self: &Arc<Self>, generation: u64) {
        let state = self.state.borrow().clone();
        if let LinkState::Up(link) = state
            && link.generation == generation
            && !link.is_open()
        {
            self.lost(generation);
        }
    }

    /// Marks connection `generation` lost and starts the one supervisor
    /// that replaces it; later reports of the same loss change nothing.
    fn lost(self: &Arc<Self>, generation: u64) {
        let mut old = None;
        self.state.send_if_modified(|state| match state {
            LinkState::Up(link) if link.generation == generation => {
                old = Some(Arc::clone(link));
                *state = LinkState::Down;
                true
            }
            _ => false,
        });
        if let Some(old) = old {
            tracing::warn!(prefix = %self.options.prefix, "RabbitMQ connection lost; reconnecting");
            tokio::spawn(Arc::clone(self).reconnect(old));
        }
    }

    async fn reconnect(self: Arc<Self>, old: Arc<Link>) {
        // A link dropped for a dead publishing channel may still be
        // connected; closing it ends its consumers, which follow to the new.
        if old.connection.status().connected() {
            let _ = self
                .timed(old.connection.close(200, "toolfleet reconnecting".into()))
                .await;
        }
        drop(old);
        let mut pauses = self.options.backoff();
        while !self.is_closed() {
            match self.open_link().await {
                Ok(link) => return self.install(link),
                Err(e) => tracing::warn!(error = %e, "RabbitMQ reconnect failed"),
            }
            let pause = pauses.next().unwrap_or(self.options.reconnect_max);
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = self.until_closed() => return,
            }
        }
    }

    fn install(&self, link: Link) {
        let link = Arc::new(link);
        let installed = self.state.send_if_modified(|state| {
            if !matches!(state, LinkState::Down) {
                return false;
            }
            *state = LinkState::Up(Arc::clone(&link));
            true
        });
        // Not installed means closed meanwhile; dropping the link closes it.
        if installed {
            tracing::info!(prefix = %self.options.prefix, "RabbitMQ reconnected");
        }
    }

    fn close(&self) {
        // Dropping the link closes the connection once the consumers, who
        // watch this state, have dropped their channels.
        self.state.send_replace(LinkState::Closed);
    }

    async fn force_reconnect(self: &Arc<Self>) {
        let state = self.state.borrow().clone();
        if let LinkState::Up(link) = state {
            let _ = self
                .timed(link.connection.close(200, "toolfleet reconnecting".into()))
                .await;
            self.lost(link.generation);
        }
    }

    async fn close_and_delete(self: &Arc<Self>) -> Result<(), BrokerError> {
        self.close();
        // A connection of its own: the shared one is closing, and may have
        // been down or closed before.
        let link = self.open_link().await?;
        let declared = std::mem::take(&mut *lock(&self.declared));
        let mut outcome = Ok(());
        // Queues first: an exchange still bound to a queue is in use.
        for queue in &declared.queues {
            outcome = outcome.and(self.delete_queue(&link, queue).await);
        }
        for exchange in &declared.exchanges {
            outcome = outcome.and(self.delete_exchange(&link, exchange).await);
        }
        outcome
    }
}

/// Calls to RabbitMQ over a link: the topology, publishing and counting.
/// Each is bounded by the operation timeout, and each declaration is
/// remembered for [`Shared::close_and_delete`].
impl Shared {
    /// A lapin call bounded by the operation timeout; a timeout reads as an
    /// IO error, which it most likely is.
    async fn timed<T>(&self, call: impl Future<Output = lapin::Result<T>>) -> lapin::Result<T> {
        let limit = self.options.operation_timeout;
        match tokio::time::timeout(limit, call).await {
            Ok(answer) => answer,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("RabbitMQ did not answer within {limit:?}"),
            )
            .into()),
        }
    }

    async fn bounded<T>(
        &self,
        what: &str,
        call: impl Future<Output = lapin::Result<T>>,
    ) -> Result<T, BrokerError> {
        self.timed(call).await.map_err(|e| unavailable(what, &e))
    }

    async fn channel(&self, link: &Link) -> Result<Channel, BrokerError> {
        self.bounded("opening a channel", link.connection.create_channel())
            .await
    }

    /// Publishes `batch` to the pool queue of `queues` in one message: one
    /// id with its trace headers, or several, one per line, without.
    async fn publish_ids(
        self: &Arc<Self>,
        queues: &PoolQueues,
        batch: &[Publish],
    ) -> Result<(), BrokerError> {
        let link = self.link()?;
        let sent = match batch {
            [one] => {
                let (body, trace) = (one.job_id.as_bytes(), one.trace.as_ref());
                self.publish_job(&link, queues, &queues.pool, body, trace)
                    .await
            }
            many => {
                let ids: Vec<&str> = many.iter().map(|p| p.job_id.as_str()).collect();
                let body = ids.join("\n");
                self.publish_job(&link, queues, &queues.pool, body.as_bytes(), None)
                    .await
            }
        };
        self.noting_loss(&link, sent)
    }

    /// Publishes a message of job ids (`body`) to `queue` of `queues`,
    /// persistent, and waits for the confirm. The pool queue is declared
    /// first: a delay queue dead-letters into it.
    async fn publish_job(
        &self,
        link: &Link,
        queues: &PoolQueues,
        queue: &str,
        body: &[u8],
        trace: Option<&TraceContext>,
    ) -> Result<(), BrokerError> {
        self.ensure_pool(link, queues).await?;
        let route = Route {
            exchange: "",
            key: queue,
            mandatory: true,
        };
        let mut persistent = BasicProperties::default().with_delivery_mode(2);
        if let Some(trace) = trace {
            persistent = persistent.with_headers(trace_headers(trace));
        }
        match self.confirm(link, route, body, persistent).await? {
            Confirmation::Ack(Some(_)) => {
                // Returned: the queue was deleted under us.
                link.forget(queue);
                link.forget(&queues.pool);
                Err(BrokerError::Unavailable(format!(
                    "queue {queue} is missing; it is declared again on the next publish"
                )))
            }
            Confirmation::Nack(_) => Err(self.refused(queue)),
            Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
        }
    }

    /// Why RabbitMQ nacked a publish: with a bound, almost always the bound.
    fn refused(&self, queue: &str) -> BrokerError {
        match self.options.max_length {
            Some(bound) => {
                BrokerError::Full(format!("queue {queue} holds {bound} messages, its bound"))
            }
            None => BrokerError::Unavailable(format!("RabbitMQ refused a message for {queue}")),
        }
    }

    async fn confirm(
        &self,
        link: &Link,
        route: Route<'_>,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<Confirmation, BrokerError> {
        let (exchange, key) = (name(route.exchange)?, name(route.key)?);
        let options = BasicPublishOptions {
            mandatory: route.mandatory,
            ..BasicPublishOptions::default()
        };
        let publish = async {
            let confirm = link
                .publisher
                .basic_publish(exchange, key, options, body, properties);
            confirm.await?.await
        };
        self.bounded("publishing", publish).await
    }

    /// Declares a pool's queue, its dead-letter queue and their exchange,
    /// once per connection.
    async fn ensure_pool(&self, link: &Link, queues: &PoolQueues) -> Result<(), BrokerError> {
        self.once_declared(link, &queues.pool, || self.declare_pool(link, queues))
            .await
    }

    /// Runs `declare` unless `name` is ready on `link`, one declaration at a
    /// time, and marks it ready.
    async fn once_declared<F>(
        &self,
        link: &Link,
        name: &str,
        declare: impl FnOnce() -> F,
    ) -> Result<(), BrokerError>
    where
        F: Future<Output = Result<(), BrokerError>>,
    {
        if link.is_ready(name) {
            return Ok(());
        }
        let _declaring = self.declaring(link).await?;
        if !link.is_ready(name) {
            declare().await?;
            link.mark_ready(name);
        }
        Ok(())
    }

    /// The link's declaring lock, waited for at most a few operations' time
    /// (after a reconnect every consumer declares its pool again, one at a
    /// time).
    async fn declaring<'a>(
        &self,
        link: &'a Link,
    ) -> Result<tokio::sync::MutexGuard<'a, ()>, BrokerError> {
        let wait = self.options.operation_timeout * 4;
        tokio::time::timeout(wait, link.declaring.lock())
            .await
            .map_err(|_| BrokerError::Unavailable(format!("declaring queues took over {wait:?}")))
    }

    async fn declare_pool(&self, link: &Link, queues: &PoolQueues) -> Result<(), BrokerError> {
        let dlx = format!("{}.dlx", self.options.prefix);
        self.declare_exchange(link, &dlx, ExchangeKind::Direct)
            .await?;
        self.declare_queue(link, &queues.dead, self.dead_args())
            .await?;
        let channel = self.channel(link).await?;
        let bind = channel.queue_bind(
            name(&queues.dead)?,
            name(&dlx)?,
            name(&queues.key)?,
            QueueBindOptions::default(),
            FieldTable::default(),
        );
        self.bounded(&format!("binding {}", queues.dead), bind)
            .await?;
        self.declare_queue(link, &queues.pool, self.pool_args(queues, &dlx))
            .await?;
        link.mark_ready(&queues.pool);
        Ok(())
    }

    /// Declares the delay queue of `ms` for a pool, once per connection, and
    /// names it.
    async fn ensure_delay(
        &self,
        link: &Link,
        queues: &PoolQueues,
        ms: u64,
    ) -> Result<String, BrokerError> {
        let queue = queues.delay(ms);
        let declare = || self.declare_queue(link, &queue, self.delay_args(queues, ms));
        self.once_declared(link, &queue, declare).await?;
        Ok(queue)
    }

    async fn ensure_events(&self, link: &Link, exchange: &str) -> Result<(), BrokerError> {
        if !link.is_ready(exchange) {
            self.declare_exchange(link, exchange, ExchangeKind::Topic)
                .await?;
            link.mark_ready(exchange);
        }
        Ok(())
    }

    async fn declare_exchange(
        &self,
        link: &Link,
        exchange: &str,
        kind: ExchangeKind,
    ) -> Result<(), BrokerError> {
        let channel = self.channel(link).await?;
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        let declare =
            channel.exchange_declare(name(exchange)?, kind, durable, FieldTable::default());
        self.bounded(&format!("declaring {exchange}"), declare)
            .await?;
        lock(&self.declared).exchanges.insert(exchange.to_owned());
        Ok(())
    }

    /// Declares a durable queue. One that exists with other arguments (an
    /// older bound, say) is used as it is rather than refused: the fleet
    /// keeps running and the operator changes it with a policy.
    async fn declare_queue(
        &self,
        link: &Link,
        queue: &str,
        args: FieldTable,
    ) -> Result<(), BrokerError> {
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        let channel = self.channel(link).await?;
        let what = format!("declaring {queue}");
        match self
            .timed(channel.queue_declare(name(queue)?, durable, args))
            .await
        {
            Ok(_) => {}
            Err(e) if is_soft(&e, AMQPSoftError::PRECONDITIONFAILED) => {
                tracing::warn!(%queue, error = %e, "queue exists with other arguments; using it as it is");
                self.passive_declare(link, queue)
                    .await
                    .map_err(|e| unavailable(&what, &e))?;
            }
            Err(e) => return Err(unavailable(&what, &e)),
        }
        lock(&self.declared).queues.insert(queue.to_owned());
        Ok(())
    }

    /// The queue's ready messages; a refusal names why (not found, say).
    /// The server closes the channel on a refusal, so it gets its own.
    async fn passive_declare(&self, link: &Link, queue: &str) -> lapin::Result<u32> {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let channel = self.timed(link.connection.create_channel()).await?;
        let queue = ShortString::try_new(queue).map_err(std::io::Error::other)?;
        let declared = self
            .timed(channel.queue_declare(queue, passive, FieldTable::default()))
            .await?;
        Ok(declared.message_count())
    }

    async fn delete_queue(&self, link: &Link, queue: &str) -> Result<(), BrokerError> {
        let channel = self.channel(link).await?;
        let deleted = channel.queue_delete(name(queue)?, QueueDeleteOptions::default());
        self.bounded(&format!("deleting {queue}"), deleted)
            .await
            .map(drop)
    }

    async fn delete_exchange(&self, link: &Link, exchange: &str) -> Result<(), BrokerError> {
        let channel = self.channel(link).await?;
        let deleted = channel.exchange_delete(name(exchange)?, ExchangeDeleteOptions::default());
        self.bounded(&format!("deleting {exchange}"), deleted).await
    }

    async fn count(&self, link: &Link, queue: &str) -> Result<u64, BrokerError> {
        match self.passive_declare(link, queue).await {
            Ok(ready) => Ok(u64::from(ready)),
            // A pool nobody has used yet holds nothing.
            Err(e) if is_soft(&e, AMQPSoftError::NOTFOUND) => Ok(0),
            Err(e) => Err(unavailable(&format!("counting {queue}"), &e)),
        }
    }

    fn pool_args(&self, queues: &PoolQueues, dlx: &str) -> FieldTable {
        let mut args = self.quorum_args();
        // At-least-once dead-lettering (RabbitMQ keeps a rejected message
        // until the dead-letter queue has it) needs reject-publish.
        args.insert("x-overflow".into(), text("reject-publish"));
        args.insert("x-dead-letter-exchange".into(), text(dlx));
        args.insert("x-dead-letter-routing-key".into(), text(&queues.key));
        args.insert("x-dead-letter-strategy".into(), text("at-least-once"));
        args
    }

    /// A delay queue: its TTL is the delay, then the message is
    /// dead-lettered, at least once, into the pool queue through the
    /// default exchange. A full pool queue holds it back rather than losing
    /// it: RabbitMQ retries (every few minutes by default) until it fits.
    fn delay_args(&self, queues: &PoolQueues, ms: u64) -> FieldTable {
        let mut args = self.quorum_args();
        let ttl = i64::try_from(ms).unwrap_or(i64::MAX);
        args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ttl));
        args.insert("x-overflow".into(), text("reject-publish"));
        args.insert("x-dead-letter-exchange".into(), text(""));
        args.insert("x-dead-letter-routing-key".into(), text(&queues.pool));
        args.insert("x-dead-letter-strategy".into(), text("at-least-once"));
        args
    }

    /// A dead-letter queue drops its oldest beyond the bound (RabbitMQ's
    /// default overflow): it must always take what a pool rejects.
    fn dead_args(&self) -> FieldTable {
        self.quorum_args()
    }

    fn quorum_args(&self) -> FieldTable {
        let mut args = FieldTable::default();
        args.insert("x-queue-type".into(), text("quorum"));
        if let Some(bound) = self.options.max_length {
            args.insert(
                "x-max-length".into(),
                AMQPValue::LongLongInt(i64::from(bound)),
            );
        }
        args
    }
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(value.into())
}

/// An AMQP short string, refused (not panicked on) beyond 255 bytes.
fn name(value: &str) -> Result<ShortString, BrokerError> {
    ShortString::try_new(value)
        .map_err(|e| BrokerError::Unavailable(format!("name '{value}' is not usable: {e}")))
}

fn is_soft(error: &lapin::Error, soft: AMQPSoftError) -> bool {
    matches!(error.kind(), ErrorKind::ProtocolError(e) if *e.kind() == AMQPErrorKind::Soft(soft))
}

fn unavailable(what: &str, error: &lapin::Error) -> BrokerError {
    BrokerError::Unavailable(format!("{what}: {error}"))
}

fn reconnecting() -> BrokerError {
    BrokerError::Unavailable("the connection to RabbitMQ is down; reconnecting".into())
}

/// The URL without its password, for messages and logs.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

/// One channel consuming one queue.
struct Subscribed {
    generation: u64,
    consumer: lapin::Consumer,
    /// Held so that the channel lives exactly as long as the subscription:
    /// dropping it closes the channel and RabbitMQ requeues what was unacked.
    _channel: Channel,
}

/// What a consumer or subscription consumes, and where its messages go.
trait Feed: Send + Sync + 'static {
    /// Opens a channel on `link` and starts consuming.
    fn subscribe(
        &self,
        shared: &Shared,
        link: &Link,
    ) -> impl Future<Output = Result<Subscribed, BrokerError>> + Send;
    /// Hands one message on; false once nobody listens.
    fn forward(&self, delivery: LapinDelivery) -> bool;
    /// Completes once nobody listens.
    fn abandoned(&self) -> impl Future<Output = ()> + Send;
}

/// Subscribes `feed` now, so a caller learns at once if it cannot, then
/// keeps it subscribed across reconnects in a task of its own.
async fn start_feed<F: Feed>(shared: &Arc<Shared>, feed: F) -> Result<(), BrokerError> {
    let link = shared.link()?;
    let first = feed.subscribe(shared, &link).await;
    let first = shared.noting_loss(&link, first)?;
    tokio::spawn(run_feed(Arc::clone(shared), feed, first));
    Ok(())
}

async fn run_feed<F: Feed>(shared: Arc<Shared>, feed: F, first: Subscribed) {
    let mut current = first;
    while pump(&shared, &feed, current).await {
        match resubscribe(&shared, &feed).await {
            Some(next) => current = next,
            None => return,
        }
    }
}

/// Forwards messages until the subscription ends; true to subscribe again,
/// false when nobody listens or the broker closed.
async fn pump<F: Feed>(shared: &Arc<Shared>, feed: &F, mut sub: Subscribed) -> bool {
    loop {
        tokio::select! {
            () = feed.abandoned() => return false,
            () = shared.until_closed() => return false,
            next = sub.consumer.next() => match next {
                Some(Ok(delivery)) => {
                    if !feed.forward(delivery) {
                        return false;
                    }
                }
                // lapin follows an error with the end of the stream.
                Some(Err(error)) => tracing::debug!(%error, "consumer interrupted"),
                None => {
                    shared.check(sub.generation);
                    return true;
                }
            },
        }
    }
}

/// Subscribes `feed` again once a connection is up, with backoff while
/// subscribing fails; `None` when nobody listens or the broker closed.
async fn resubscribe<F: Feed>(shared: &Arc<Shared>, feed: &F) -> Option<Subscribed> {
    let mut pauses = shared.options.backoff();
    loop {
        let link = tokio::select! {
            () = feed.abandoned() => return None,
            link = shared.wait_link() => link?,
        };
        let attempt = tokio::select! {
            () = feed.abandoned() => return None,
            attempt = feed.subscribe(shared, &link) => attempt,
        };
        match attempt {
            Ok(sub) => return Some(sub),
            Err(error) => {
                tracing::warn!(%error, "resubscribing failed");
                shared.check(link.generation);
            }
        }
        let pause = pauses.next().unwrap_or(shared.options.reconnect_max);
        tokio::select! {
            () = feed.abandoned() => return None,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// A worker's feed: one pool queue, manual acks, a bounded prefetch.
struct PoolFeed {
    queues: PoolQueues,
    prefetch: u16,
    /// Unbounded here because RabbitMQ bounds it: at most `prefetch`
    /// unacknowledged deliveries are ever in flight.
    sender: mpsc::UnboundedSender<LapinDelivery>,
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
        let qos = channel.basic_qos(self.prefetch, BasicQosOptions::default());
        shared.bounded("setting the prefetch", qos).await?;
        let consume = channel.basic_consume(
            name(&self.queues.pool)?,
            ShortString::default(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        );
        let consumer = shared
            .bounded(&format!("consuming {}", self.queues.pool), consume)
            .await?;
        Ok(Subscribed {
            generation: link.generation,
            consumer,
            _channel: channel,
        })
    }

    fn forward(&self, delivery: LapinDelivery) -> bool {
        self.sender.send(delivery).is_ok()
    }

    async fn abandoned(&self) {
        self.sender.closed().await;
    }
}

struct RabbitConsumer {
    deliveries: mpsc::UnboundedReceiver<LapinDelivery>,
    timeout: Duration,
    /// The ids of a message of several not handed out yet, and that
    /// message.
    parts: VecDeque<Delivery>,
    message: Option<Arc<Mutex<SharedMessage>>>,
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
                .is_some_and(|acker| acker.acker.usable())
        });
        if usable && let Some(part) = self.parts.pop_front() {
            return Some(part);
        }
        self.parts.clear();
        self.message = None;
        loop {
            let delivery = self.deliveries.recv().await?;
            // One from a channel that has since closed is back in its queue
            // and comes again; handing it out would only fail its ack.
            if delivery.acker.usable() {
                let (mut parts, message) = self.deliveries_of(delivery);
                if let Some(first) = parts.pop_front() {
                    self.parts = parts;
                    self.message = message;
                    return Some(first);
                }
            }
        }
    }
}

impl RabbitConsumer {
    /// The deliveries of one message: one, or one per id of a message of
    /// several (their acks settle the message together, which comes too).
    fn deliveries_of(
        &self,
        delivery: LapinDelivery,
    ) -> (VecDeque<Delivery>, Option<Arc<Mutex<SharedMessage>>>) {
        let acker = RabbitAcker {
            acker: delivery.acker,
            timeout: self.timeout,
            settled: false,
        };
        // A body that is not UTF-8 is no job id; the worker finds no such
        // job and rejects it into the dead-letter queue.
        let body = String::from_utf8_lossy(&delivery.data);
        let ids: Vec<&str> = body.split('\n').filter(|id| !id.is_empty()).collect();
        if ids.len() <= 1 {
            let trace = delivery.properties.headers().as_ref().and_then(trace_of);
            let one = Delivery::new(body.into_owned(), delivery.redelivered, Box::new(acker))
                .with_trace(trace);
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

/// The `traceparent` and `tracestate` headers of a job's message.
fn trace_headers(trace: &TraceContext) -> FieldTable {
    let mut headers = FieldTable::default();
    headers.insert(
        ShortString::from("traceparent"),
        AMQPValue::LongString(trace.traceparent().into()),
    );
    if let Some(state) = trace.tracestate() {
        headers.insert(
            ShortString::from("tracestate"),
            AMQPValue::LongString(state.into()),
        );
    }
    headers
}

/// The trace context of a message's headers; `None` without a valid
/// `traceparent` (a message from an older publisher, or someone else's).
fn trace_of(headers: &FieldTable) -> Option<TraceContext> {
    let text = |name: &str| match headers.inner().get(name) {
        Some(AMQPValue::LongString(value)) => std::str::from_utf8(value.as_bytes()).ok(),
        Some(AMQPValue::ShortString(value)) => Some(value.as_str()),
        _ => None,
    };
    TraceContext::parse(text("traceparent")?, text("tracestate"))
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
}

#[async_trait]
impl Settles for RabbitAcker {
    /// `Closed` when the delivery's channel is gone: RabbitMQ has already
    /// put the message back, and another consumer may hold it now.
    async fn settle(mut self: Box<Self>, how: Settle) -> Result<(), BrokerError> {
        self.settled = true;
        let acker = &self.acker;
        let sent = async {
            match how {
                Settle::Ack => acker.ack(BasicAckOptions::default()).await,
                Settle::Requeue => acker.nack(requeue()).await,
                Settle::Reject => acker.reject(BasicRejectOptions { requeue: false }).await,
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
        if self.settled || !self.acker.usable() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let acker = self.acker.clone();
            runtime.spawn(async move {
                // Failing means the channel closed, which requeues it too.
                let _ = acker.nack(requeue()).await;
            });
        }
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

/// A notices subscriber's feed: an exclusive queue bound to its keys,
/// auto-acked (events are announcements, not work), turned into events.
struct EventFeed {
    exchange: String,
    /// What its queue is bound to.
    keys: Vec<String>,
    buffer: usize,
    /// A broadcast ring: a subscriber that falls behind skips the oldest
    /// events instead of holding RabbitMQ or this process back.
    sender: broadcast::Sender<Event>,
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
        Ok(Subscribed {
            generation: link.generation,
            consumer,
            _channel: channel,
        })
    }

    fn forward(&self, delivery: LapinDelivery) -> bool {
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
            kind: "job".into(),
            id: id.into(),
            tenant: "t".into(),
            tool: "x".into(),
            state: "succeeded".into(),
            run_id: "r".into(),
            body: serde_json::json!({"status": "ok"}),
            callback: false,
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

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn delays_round_up_to_the_ladder() {
        let cases = [
            (Duration::from_micros(1), 16),
            (ms(16), 16),
            (ms(17), 19),
            (Duration::from_micros(16_001), 19),
            (ms(200), 216),
            (ms(500), 512),
            (ms(1000), 1024),
            (ms(60_000), 65_536),
            (ms(3_600_000), 4_194_304),
        ];
        for (delay, bucket) in cases {
            assert_eq!(bucket_ms(delay), bucket, "{delay:?}");
        }
    }

    #[test]
    fn ladder_is_never_early_nor_much_late_and_caps() {
        for wanted in (1..5_000).chain([123_456, 9_999_999]) {
            let bucket = bucket_ms(ms(wanted));
            assert!(bucket >= wanted, "{wanted} ms rounded down to {bucket}");
            assert!(
                bucket * 100 <= wanted.max(16) * 122,
                "{wanted} ms rounded up to {bucket}"
            );
        }
        assert_eq!(bucket_ms(MAX_DELAY), MAX_DELAY_MS);
        assert_eq!(bucket_ms(Duration::from_secs(u64::MAX)), MAX_DELAY_MS);
    }

    #[test]
    fn pool_names_fit_amqp() {
        assert!(PoolQueues::new("toolfleet", "ocr").is_ok());
        let refused = PoolQueues::new("toolfleet", &"p".repeat(230));
        assert!(matches!(refused, Err(BrokerError::Unavailable(_))));
        assert!(name(&"x".repeat(256)).is_err());
    }

    #[test]
    fn urls_lose_their_password() {
        assert_eq!(
            redact("amqp://guest:secret@host:5672/%2f"),
            "amqp://***@host:5672/%2f"
        );
        assert_eq!(redact("amqp://host/vh@x"), "amqp://host/vh@x");
        assert_eq!(redact("not a url"), "not a url");
    }
}
