//! Putting job ids on a pool's queue: under load, or close behind the last
//! message (within [`PUBLISH_LINGER`], or [`IDLE_PUBLISH_LINGER`] while the
//! queue has no consumer), through the pool's [`Publisher`],
//! several to a message (one per line, no trace headers);
//! alone, one id and its trace headers; delayed, through the delay queue of
//! its step on the ladder. Every publish, of events too, waits for
//! RabbitMQ's confirm ([`Shared::confirm`]). It must never answer a publish
//! before RabbitMQ has confirmed it, nor put trace headers on a message of
//! several ids (the worker takes each job's trace from the store), nor hold
//! a caller for a delay.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Confirmation};
use toolfleet_core::TraceContext;
use toolfleet_core::group::{Group, GroupError};

use super::link::{Link, Shared};
use super::topology::{PoolQueues, bucket_ms, name};
use super::{RabbitBroker, lock};
use crate::BrokerError;

/// Messages of one pool waiting for their confirm at once, per broker.
pub const PUBLISH_SLOTS: usize = 2;

/// How long a job id published close behind its pool's last message waits
/// for others, by default: one caller after another (each awaiting its
/// answer) then shares a message and a confirm with the next few, where a
/// message each cost RabbitMQ some 300 us of processor time per job; a job
/// starts at most this much later.
pub const PUBLISH_LINGER: Duration = Duration::from_millis(1);

/// The linger of a pool whose queue has no consumer, by default: no job
/// published to it can start before a worker comes (a pool scaled to none,
/// or a backlog queued before the workers start), so its ids wait this
/// long for others and the worker that comes takes fewer, fuller messages
/// (each message costs RabbitMQ and the worker more than each id in it).
/// A worker that comes finds its first jobs at most this much later, for
/// about [`CONSUMER_CHECK`] and a count's round trip. A message still
/// carries at most `jobs_per_message` ids, as under load: the first worker
/// to come takes its prefetch of them.
pub const IDLE_PUBLISH_LINGER: Duration = Duration::from_millis(20);

/// How often a pool's publisher counts its queue's consumers, while it
/// publishes: one passive declare each time.
pub const CONSUMER_CHECK: Duration = Duration::from_millis(100);

/// The most job ids one message carries: the default of
/// [`RabbitOptions::jobs_per_message`] and its bound.
///
/// [`RabbitOptions::jobs_per_message`]: super::RabbitOptions::jobs_per_message
pub const MAX_IDS_PER_MESSAGE: usize = 64;

/// Publishes job ids to one pool's queue, several to a message under load.
pub(super) type Publisher = Group<Publish, (), BrokerError>;

/// A pool's [`Publisher`], and whether it has published since its queue's
/// consumers were last counted.
pub(super) struct PoolPublisher {
    group: Publisher,
    busy: AtomicBool,
}

/// One job id to publish.
pub(super) struct Publish {
    job_id: String,
    trace: Option<TraceContext>,
}

impl GroupError for BrokerError {
    fn unanswered(message: String) -> Self {
        BrokerError::Unavailable(message)
    }
}

impl RabbitBroker {
    /// The publisher of `pool`, started on its first publish; `None` where
    /// each job goes in a message of its own.
    fn publisher(&self, pool: &str) -> Result<Option<Arc<PoolPublisher>>, BrokerError> {
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
        let group = Group::spawn_lingering(
            "publishing job ids",
            PUBLISH_SLOTS,
            shared
                .options
                .jobs_per_message
                .clamp(1, MAX_IDS_PER_MESSAGE),
            shared.options.publish_linger,
            {
                let (shared, queues) = (shared.clone(), queues.clone());
                move |batch: Vec<Publish>| {
                    let (shared, queues) = (shared.clone(), queues.clone());
                    async move {
                        let sent = shared.publish_ids(&queues, &batch).await;
                        Ok(vec![sent; batch.len()])
                    }
                }
            },
        );
        let publisher = Arc::new(PoolPublisher {
            group,
            busy: AtomicBool::new(true),
        });
        if shared.options.idle_publish_linger > shared.options.publish_linger {
            let follow = follow_consumers(shared, queues, Arc::downgrade(&publisher));
            tokio::spawn(follow);
        }
        publishers.insert(pool.to_owned(), publisher.clone());
        Ok(Some(publisher))
    }

    /// [`Broker::publish_traced`](crate::Broker::publish_traced): through
    /// the pool's publisher, or alone where each job goes in a message of
    /// its own.
    pub(super) async fn publish_now(
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
            Some(publisher) => {
                publisher.busy.store(true, Ordering::Relaxed);
                publisher.group.run(publish).await
            }
            None => {
                let queues = self.queues(pool)?;
                self.shared().publish_ids(&queues, &[publish]).await
            }
        }
    }

    /// [`Broker::publish_delayed_traced`](crate::Broker::publish_delayed_traced):
    /// alone, to the delay queue of the delay's step, which dead-letters it
    /// into the pool queue.
    pub(super) async fn publish_after(
        &self,
        pool: &str,
        job_id: &str,
        delay: Duration,
        trace: Option<&TraceContext>,
    ) -> Result<(), BrokerError> {
        if delay.is_zero() {
            return self.publish_now(pool, job_id, trace).await;
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
}

/// Keeps `publisher` lingering [`RabbitOptions::idle_publish_linger`] while
/// its pool's queue has no consumer, and
/// [`RabbitOptions::publish_linger`] while it has one or RabbitMQ cannot
/// say: counted at once, then every [`CONSUMER_CHECK`] in which the pool
/// published, until the publisher or the broker is gone. The channel the
/// counts are asked on is closed while the pool publishes nothing.
///
/// [`RabbitOptions::idle_publish_linger`]: super::RabbitOptions::idle_publish_linger
/// [`RabbitOptions::publish_linger`]: super::RabbitOptions::publish_linger
async fn follow_consumers(
    shared: Arc<Shared>,
    queues: Arc<PoolQueues>,
    publisher: Weak<PoolPublisher>,
) {
    let mut channel = None;
    loop {
        let Some(pool) = publisher.upgrade() else {
            return;
        };
        if pool.busy.swap(false, Ordering::Relaxed) {
            let consumers = shared.consumers(&queues.pool, &mut channel).await;
            pool.group.set_linger(match consumers {
                Some(0) => shared.options.idle_publish_linger,
                _ => shared.options.publish_linger,
            });
        } else if let Some(idle) = channel.take() {
            let _ = shared.timed(idle.close(200, "toolfleet".into())).await;
        }
        drop(pool);
        tokio::select! {
            () = tokio::time::sleep(CONSUMER_CHECK) => {}
            () = shared.until_closed() => return,
        }
    }
}

/// Where a message goes.
pub(super) struct Route<'a> {
    pub(super) exchange: &'a str,
    pub(super) key: &'a str,
    /// Return the message if no queue takes it.
    pub(super) mandatory: bool,
}

/// Publishing over a link, each publish awaiting its confirm.
impl Shared {
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

    pub(super) async fn confirm(
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
