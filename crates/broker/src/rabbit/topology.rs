//! The names of toolfleet's queues and exchanges on RabbitMQ and their
//! declarations: a pool's queue, its dead-letter queue and exchange, and
//! the ladder of delay queues, each declared once per connection and one at
//! a time ([`Shared::once_declared`]), remembered for
//! [`Shared::close_and_delete`], and counted for a pool's depth. It must
//! never publish nor consume, nor refuse or redeclare a queue that exists
//! with other arguments: that one is used as it is, and an operator changes
//! it with a policy.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lapin::options::{
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{ErrorKind, ExchangeKind};

use super::link::{Link, Shared, unavailable};
use super::lock;
use crate::BrokerError;

/// The longest delay [`RabbitBroker::publish_delayed`] honours, 2^31 ms
/// (about 24.8 days); a longer delay is shortened to it.
///
/// [`RabbitBroker::publish_delayed`]: super::RabbitBroker#method.publish_delayed
pub const MAX_DELAY: Duration = Duration::from_millis(MAX_DELAY_MS);

const MAX_DELAY_MS: u64 = 1 << 31;

/// One doubling of the delay ladder, in milliseconds; each later doubling
/// multiplies these by a power of two. Four steps per doubling keep a delay
/// at most about 21% late while a pool needs few delay queues.
const LADDER_STEPS: [u64; 4] = [16, 19, 23, 27];

/// AMQP names and routing keys are short strings.
const MAX_NAME: usize = 255;

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

pub(super) fn bucket_ms(delay: Duration) -> u64 {
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
pub(super) struct PoolQueues {
    pub(super) pool: String,
    pub(super) dead: String,
    /// The pool name: the dead-letter routing key.
    key: String,
    prefix: String,
}

impl PoolQueues {
    pub(super) fn new(prefix: &str, pool: &str) -> Result<Self, BrokerError> {
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

/// What close_and_delete removes.
#[derive(Default)]
pub(super) struct Declared {
    queues: BTreeSet<String>,
    exchanges: BTreeSet<String>,
}

/// The topology over a link: each call bounded by the operation timeout,
/// and each declaration remembered for [`Shared::close_and_delete`].
impl Shared {
    /// Declares a pool's queue, its dead-letter queue and their exchange,
    /// once per connection.
    pub(super) async fn ensure_pool(
        &self,
        link: &Link,
        queues: &PoolQueues,
    ) -> Result<(), BrokerError> {
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
    pub(super) async fn declaring<'a>(
        &self,
        link: &'a Link,
    ) -> Result<tokio::sync::MutexGuard<'a, ()>, BrokerError> {
        let wait = self.options.operation_timeout * 4;
        tokio::time::timeout(wait, link.declaring.lock())
            .await
            .map_err(|_| BrokerError::Unavailable(format!("declaring queues took over {wait:?}")))
    }

    pub(super) async fn declare_pool(
        &self,
        link: &Link,
        queues: &PoolQueues,
    ) -> Result<(), BrokerError> {
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
    pub(super) async fn ensure_delay(
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

    pub(super) async fn declare_exchange(
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
        let channel = self.timed(link.connection.create_channel()).await?;
        Ok(self.passive(&channel, queue).await?.message_count())
    }

    /// What RabbitMQ says of `queue` (its ready messages, its consumers),
    /// asked on `channel`, which a refusal closes.
    async fn passive(&self, channel: &lapin::Channel, queue: &str) -> lapin::Result<lapin::Queue> {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let queue = ShortString::try_new(queue).map_err(std::io::Error::other)?;
        self.timed(channel.queue_declare(queue, passive, FieldTable::default()))
            .await
    }

    /// How many consumers `queue` has, asked on `channel` (opened on the
    /// connection of the moment when it has none or has lost it); `None`
    /// when RabbitMQ cannot say (down, or the queue is not declared yet, a
    /// refusal that closes the channel, so the next count opens another).
    pub(super) async fn consumers(
        self: &Arc<Self>,
        queue: &str,
        channel: &mut Option<lapin::Channel>,
    ) -> Option<u32> {
        let open = channel.take().filter(|c| c.status().connected());
        let asking = match open {
            Some(open) => open,
            None => self.channel(&*self.link().ok()?).await.ok()?,
        };
        match self.passive(&asking, queue).await {
            Ok(declared) => {
                *channel = Some(asking);
                Some(declared.consumer_count())
            }
            Err(_) => {
                // A refusal closed it already; one that timed out is closed
                // here rather than left open on the connection.
                if asking.status().connected() {
                    let _ = self.timed(asking.close(200, "toolfleet".into())).await;
                }
                None
            }
        }
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

    pub(super) async fn close_and_delete(self: &Arc<Self>) -> Result<(), BrokerError> {
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

    pub(super) async fn count(&self, link: &Link, queue: &str) -> Result<u64, BrokerError> {
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
        if let Some(limit) = self.options.delivery_limit {
            args.insert(
                "x-delivery-limit".into(),
                AMQPValue::LongLongInt(i64::from(limit)),
            );
        }
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

pub(super) fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(value.into())
}

/// An AMQP short string, refused (not panicked on) beyond 255 bytes.
pub(super) fn name(value: &str) -> Result<ShortString, BrokerError> {
    ShortString::try_new(value)
        .map_err(|e| BrokerError::Unavailable(format!("name '{value}' is not usable: {e}")))
}

fn is_soft(error: &lapin::Error, soft: AMQPSoftError) -> bool {
    matches!(error.kind(), ErrorKind::ProtocolError(e) if *e.kind() == AMQPErrorKind::Soft(soft))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
