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
//!
//! Each concern has a module of its own: `topology` (the names above and
//! their declarations), `link` (the connection and its supervisor),
//! `publish` (publisher confirms, job ids grouped into messages, delays),
//! `consume` (a worker's deliveries and how they settle a message) and
//! `events` (the events exchange and its subscriptions). This one holds the
//! options and the broker's handle.
//!
//! [`Event`]: crate::Event

mod acks;
mod consume;
mod events;
mod heard;
mod link;
mod publish;
mod topology;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use toolfleet_core::TraceContext;

pub use self::events::RabbitNotices;
pub use self::heard::{LISTENING_KEY, UNHEARD_FOR};
use self::link::{CloseOnDrop, Shared, redact};
use self::publish::PoolPublisher;
pub use self::publish::{
    CONSUMER_CHECK, IDLE_PUBLISH_LINGER, MAX_IDS_PER_MESSAGE, PUBLISH_LINGER, PUBLISH_SLOTS,
};
use self::topology::PoolQueues;
pub use self::topology::{
    MAX_DELAY, dead_letter_queue_name, delay_bucket, delay_queue_name, pool_queue_name,
};
use crate::memory::{DEFAULT_CAPACITY, DEFAULT_NOTICE_BUFFER};
use crate::{Broker, BrokerError, Consumer};

/// The prefix of every name when [`RabbitOptions`] does not say otherwise.
pub const DEFAULT_PREFIX: &str = "toolfleet";

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
    /// How many times a pool queue delivers a message that comes back
    /// unsettled (its worker died holding it, or requeued it) before it
    /// dead-letters it: RabbitMQ's `x-delivery-limit`. `None`: RabbitMQ's
    /// default (none before 4.0, 20 from 4.0) or a policy's. Fixed when a
    /// queue is first declared, like `max_length`.
    pub delivery_limit: Option<u32>,
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
    /// How long the events of a routing key nobody listened for are held
    /// back without a listener's notice ([`UNHEARD_FOR`]).
    pub unheard_for: Duration,
    /// How long a job id published within this of the last message of its
    /// pool waits for others to share a message ([`PUBLISH_LINGER`]; zero:
    /// never). Ids further apart go at once.
    pub publish_linger: Duration,
    /// The linger of a pool whose queue has no consumer
    /// ([`IDLE_PUBLISH_LINGER`]): no job published to it can start before a
    /// worker comes, so its ids wait longer for others and fewer, fuller
    /// messages wait for the worker. If not above `publish_linger`, the
    /// consumers are not counted and the pool always lingers
    /// `publish_linger`.
    pub idle_publish_linger: Duration,
}

impl Default for RabbitOptions {
    fn default() -> Self {
        RabbitOptions {
            prefix: DEFAULT_PREFIX.to_owned(),
            default_prefetch: 1,
            max_length: u32::try_from(DEFAULT_CAPACITY).ok(),
            delivery_limit: None,
            operation_timeout: Duration::from_secs(5),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(10),
            notice_buffer: DEFAULT_NOTICE_BUFFER,
            jobs_per_message: MAX_IDS_PER_MESSAGE,
            one_job_per_message: BTreeSet::new(),
            ca_file: None,
            unheard_for: UNHEARD_FOR,
            publish_linger: PUBLISH_LINGER,
            idle_publish_linger: IDLE_PUBLISH_LINGER,
        }
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
    publishers: Arc<Mutex<HashMap<String, Arc<PoolPublisher>>>>,
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
        self.publish_now(pool, job_id, trace).await
    }

    async fn publish_delayed_traced(
        &self,
        pool: &str,
        job_id: &str,
        delay: Duration,
        trace: Option<&TraceContext>,
    ) -> Result<(), BrokerError> {
        self.publish_after(pool, job_id, delay, trace).await
    }

    async fn consume(&self, pool: &str, prefetch: u16) -> Result<Box<dyn Consumer>, BrokerError> {
        self.consume_pool(pool, prefetch).await
    }

    async fn consume_dead(&self, pool: &str) -> Result<Box<dyn Consumer>, BrokerError> {
        self.consume_dead_letters(pool).await
    }

    async fn depth(&self, pool: &str) -> Result<u64, BrokerError> {
        let queues = self.queues(pool)?;
        let shared = self.shared();
        let link = shared.link()?;
        let counted = shared.count(&link, &queues.pool).await;
        shared.noting_loss(&link, counted)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is a single insert or remove, so a panic
    // elsewhere cannot leave the set half-changed.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
