//! The conformance suites: the behaviours every [`Broker`] and every
//! [`Notices`] implementation must show, written once and run against each
//! (`tests/memory.rs`, `tests/rabbit.rs` and, for notices,
//! `tests/postgres.rs`, each also behind a `Fanout`), so the backends are
//! proven equal by the same tests.
//!
//! This module owns the behaviours and the macros that turn them into one
//! test per behaviour. It must never depend on one implementation: anything
//! only an implementation can show (dead-letter lists, capacity bounds, what
//! closing means) belongs in that implementation's own tests. Each behaviour
//! uses pools and tenants of its own, so the tests may share one broker and
//! run in parallel; every wait is bounded, so a broken implementation fails
//! instead of hanging. A wait that times out drops the pending
//! `Consumer::next()`, so an implementation's `next()` must be cancel-safe:
//! dropping it while it waits must lose no message.
//!
//! ```ignore
//! toolfleet_broker::broker_conformance!(async { MemoryBroker::new() });
//! toolfleet_broker::notices_conformance!(async { MemoryNotices::new() });
//! ```
//!
//! Each expands to a module (`broker_conformance`, `notices_conformance`, or
//! a name given as `mod name, expr`) of `#[tokio::test]`s, so the calling
//! crate needs tokio with `macros` and `rt-multi-thread` among its
//! dev-dependencies. The expression is awaited once per test and must yield a
//! value of a type that implements the trait.

use std::time::Duration;

use serde_json::json;
use tokio::time::{Instant, timeout};

use crate::{Broker, Consumer, Delivery, Event, Notices, Subscription};

/// How long something that should arrive may take before the test fails.
/// Only a broken or badly stalled implementation ever waits this long.
pub const ARRIVAL: Duration = Duration::from_secs(5);

/// How long the suites watch for something that should not arrive.
pub const QUIET: Duration = Duration::from_millis(60);

/// Runs the [`Broker`] suite: one `#[tokio::test]` per behaviour of
/// [`broker`].
#[macro_export]
macro_rules! broker_conformance {
    ($make:expr $(,)?) => {
        $crate::broker_conformance!(mod broker_conformance, $make);
    };
    (mod $module:ident, $make:expr $(,)?) => {
        $crate::__conformance_suite!($module, broker, $make, [
            publish_then_consume,
            fifo_for_one_consumer,
            two_consumers_split_the_work,
            concurrent_consumers_lose_and_duplicate_nothing,
            concurrent_publishes_each_arrive_once,
            prefetch_bounds_unacked_deliveries,
            prefetch_grows_and_shrinks,
            requeue_redelivers,
            dropped_consumer_gives_back_unacked,
            rejected_message_is_not_redelivered,
            rejected_messages_are_dead_letters_until_taken,
            settlements_in_any_order_each_take_effect,
            delayed_message_waits_its_delay,
            pools_are_isolated,
            depth_counts_ready_messages,
            trace_context_travels_with_the_message,
        ]);
    };
}

/// Runs the [`Notices`] suite: one `#[tokio::test]` per behaviour of
/// [`notices`].
#[macro_export]
macro_rules! notices_conformance {
    ($make:expr $(,)?) => {
        $crate::notices_conformance!(mod notices_conformance, $make);
    };
    (mod $module:ident, $make:expr $(,)?) => {
        $crate::__conformance_suite!($module, notices, $make, [
            every_subscriber_receives_each_event_in_order,
            events_before_subscribing_are_not_received,
            event_arrives_whole_with_its_routing_key,
            lagging_subscriber_skips_and_keeps_up,
            a_batch_arrives_whole_each_jobs_events_in_order,
            a_settled_subscription_hears_every_outcome_in_order,
            whoever_subscribes_is_heard,
        ]);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_suite {
    ($module:ident, $suite:ident, $make:expr, [$($behaviour:ident),* $(,)?]) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    let subject = $make.await;
                    $crate::conformance::$suite::$behaviour(&subject).await;
                }
            )*
        }
    };
}

/// A name no other test uses, so tests may share one broker.
pub fn unique(prefix: &str) -> String {
    format!("conformance-{prefix}-{}", toolfleet_core::new_id())
}

/// Awaits one call to the implementation, failing the test if it does not
/// answer within [`ARRIVAL`].
pub async fn within<T>(what: &str, call: impl Future<Output = T>) -> T {
    match timeout(ARRIVAL, call).await {
        Ok(answer) => answer,
        Err(_) => panic!("{what}: no answer within {ARRIVAL:?}"),
    }
}

/// The next delivery, failing the test if none comes within [`ARRIVAL`].
pub async fn next_delivery(consumer: &mut dyn Consumer, what: &str) -> Delivery {
    match timeout(ARRIVAL, consumer.next()).await {
        Ok(Some(delivery)) => delivery,
        Ok(None) => panic!("{what}: the consumer ended instead of delivering"),
        Err(_) => panic!("{what}: nothing delivered within {ARRIVAL:?}"),
    }
}

/// Fails the test if a delivery comes within [`QUIET`].
pub async fn assert_nothing_delivered(consumer: &mut dyn Consumer, what: &str) {
    if let Ok(Some(delivery)) = timeout(QUIET, consumer.next()).await {
        panic!("{what}: unexpected delivery of {}", delivery.job_id);
    }
}

/// The behaviours of every [`Broker`].
pub mod broker {
    use super::*;

    async fn publish_all(broker: &dyn Broker, pool: &str, ids: &[String]) {
        for id in ids {
            let published = within("publish", broker.publish(pool, id)).await;
            assert_eq!(published, Ok(()), "publishing {id} to {pool}");
        }
    }

    fn job_ids(count: usize) -> Vec<String> {
        (0..count).map(|n| format!("job-{n}")).collect()
    }

    async fn consume(broker: &dyn Broker, pool: &str, prefetch: u16) -> Box<dyn Consumer> {
        match within("consume", broker.consume(pool, prefetch)).await {
            Ok(consumer) => consumer,
            Err(e) => panic!("consuming {pool}: {e}"),
        }
    }

    async fn ack(delivery: Delivery) {
        let id = delivery.job_id.clone();
        assert_eq!(within("ack", delivery.ack()).await, Ok(()), "acking {id}");
    }

    /// A published job id is delivered, not marked redelivered.
    pub async fn publish_then_consume(broker: &dyn Broker) {
        let pool = unique("publish");
        publish_all(broker, &pool, &["job-a".to_owned()]).await;
        let mut consumer = consume(broker, &pool, 1).await;
        let delivery = next_delivery(consumer.as_mut(), "published message").await;
        assert_eq!(delivery.job_id, "job-a");
        assert!(!delivery.redelivered, "a first delivery is not redelivered");
        ack(delivery).await;
    }

    /// One consumer receives a pool's messages in publish order.
    pub async fn fifo_for_one_consumer(broker: &dyn Broker) {
        let pool = unique("fifo");
        let ids = job_ids(5);
        publish_all(broker, &pool, &ids).await;
        let mut consumer = consume(broker, &pool, 10).await;
        let mut received = Vec::new();
        for _ in &ids {
            let delivery = next_delivery(consumer.as_mut(), "fifo").await;
            received.push(delivery.job_id.clone());
            ack(delivery).await;
        }
        assert_eq!(received, ids, "one consumer receives in publish order");
    }

    /// With prefetch 1 and no ack in between, each consumer must take a
    /// different message, so alternating shows both get work.
    pub async fn two_consumers_split_the_work(broker: &dyn Broker) {
        let pool = unique("split");
        let ids = job_ids(10);
        publish_all(broker, &pool, &ids).await;
        let mut first = consume(broker, &pool, 1).await;
        let mut second = consume(broker, &pool, 1).await;
        let (mut got_first, mut got_second) = (Vec::new(), Vec::new());
        for _ in 0..ids.len() / 2 {
            let a = next_delivery(first.as_mut(), "first consumer").await;
            let b = next_delivery(second.as_mut(), "second consumer").await;
            got_first.push(a.job_id.clone());
            got_second.push(b.job_id.clone());
            ack(a).await;
            ack(b).await;
        }
        assert_nothing_delivered(first.as_mut(), "first consumer after all").await;
        assert_nothing_delivered(second.as_mut(), "second consumer after all").await;
        assert!(
            !got_first.is_empty() && !got_second.is_empty(),
            "both consumers get work"
        );
        let mut all: Vec<String> = got_first.iter().chain(&got_second).cloned().collect();
        all.sort();
        let mut expected = ids.clone();
        expected.sort();
        assert_eq!(all, expected, "together all messages, each once");
    }

    /// Four consumers acking at once, each with prefetch 3: every message is
    /// delivered exactly once.
    pub async fn concurrent_consumers_lose_and_duplicate_nothing(broker: &dyn Broker) {
        let pool = unique("concurrent");
        let ids = job_ids(100);
        let (sender, mut received) = tokio::sync::mpsc::unbounded_channel();
        let mut workers = Vec::new();
        for _ in 0..4 {
            let consumer = consume(broker, &pool, 3).await;
            workers.push(tokio::spawn(ack_all(consumer, sender.clone())));
        }
        publish_all(broker, &pool, &ids).await;
        let mut seen = Vec::new();
        for _ in &ids {
            match timeout(ARRIVAL, received.recv()).await {
                Ok(Some(id)) => seen.push(id),
                _ => panic!("only {} of {} messages delivered", seen.len(), ids.len()),
            }
        }
        let extra = timeout(QUIET, received.recv()).await;
        drop(received);
        workers.iter().for_each(tokio::task::JoinHandle::abort);
        assert!(
            !matches!(extra, Ok(Some(_))),
            "a message was delivered twice: {extra:?}"
        );
        seen.sort();
        let mut expected = ids;
        expected.sort();
        assert_eq!(seen, expected, "every message exactly once");
    }

    /// Publishes made at once (which a broker may put in shared messages)
    /// each arrive once, and once all are acknowledged nothing is left.
    pub async fn concurrent_publishes_each_arrive_once(broker: &dyn Broker) {
        let pool = unique("concurrent-publishes");
        let ids = job_ids(200);
        let published =
            futures_util::future::join_all(ids.iter().map(|id| broker.publish(&pool, id))).await;
        assert!(published.iter().all(Result::is_ok), "{published:?}");
        let mut consumer = consume(broker, &pool, 16).await;
        let mut seen = Vec::new();
        for _ in &ids {
            let delivery = next_delivery(consumer.as_mut(), "a published id").await;
            seen.push(delivery.job_id.clone());
            ack(delivery).await;
        }
        assert_nothing_delivered(consumer.as_mut(), "after every id was acknowledged").await;
        seen.sort();
        let mut expected = ids;
        expected.sort();
        assert_eq!(seen, expected, "every id exactly once");
        depth_becomes(broker, &pool, 0, "all acknowledged").await;
    }

    /// Stops once the test stops listening, and yields after each message,
    /// so that even a broker that delivers without end (a duplicating one)
    /// cannot keep the task from being aborted.
    async fn ack_all(
        mut consumer: Box<dyn Consumer>,
        seen: tokio::sync::mpsc::UnboundedSender<String>,
    ) {
        while let Some(delivery) = consumer.next().await {
            if seen.send(delivery.job_id.clone()).is_err() {
                return;
            }
            let _ = delivery.ack().await;
            tokio::task::yield_now().await;
        }
    }

    /// A consumer holds at most `prefetch` unacknowledged deliveries; an ack
    /// lets the next one through, in order.
    pub async fn prefetch_bounds_unacked_deliveries(broker: &dyn Broker) {
        let pool = unique("prefetch");
        let ids = job_ids(5);
        publish_all(broker, &pool, &ids).await;
        let mut consumer = consume(broker, &pool, 2).await;
        let first = next_delivery(consumer.as_mut(), "first under prefetch").await;
        let second = next_delivery(consumer.as_mut(), "second under prefetch").await;
        assert_nothing_delivered(consumer.as_mut(), "a third beyond prefetch 2").await;
        ack(first).await;
        let third = next_delivery(consumer.as_mut(), "third after an ack").await;
        assert_eq!(third.job_id, ids[2], "the wait lost or reordered nothing");
        ack(second).await;
        ack(third).await;
    }

    /// `set_prefetch` takes effect on a live consumer: growing, more come at
    /// once; shrinking, those in hand stay and no more come until they are
    /// settled; never below the prefetch the consumer was opened with.
    /// Each delivery came between the consume and its taking.
    pub async fn prefetch_grows_and_shrinks(broker: &dyn Broker) {
        let pool = unique("reprefetch");
        let ids = job_ids(12);
        publish_all(broker, &pool, &ids).await;
        let opened = std::time::Instant::now();
        let mut consumer = consume(broker, &pool, 2).await;
        let mut held = Vec::new();
        for _ in 0..2 {
            held.push(next_delivery(consumer.as_mut(), "under prefetch 2").await);
        }
        assert_nothing_delivered(consumer.as_mut(), "a third beyond prefetch 2").await;
        consumer.set_prefetch(5);
        for _ in 0..3 {
            held.push(next_delivery(consumer.as_mut(), "the prefetch grown to 5").await);
        }
        assert_nothing_delivered(consumer.as_mut(), "a sixth beyond prefetch 5").await;
        consumer.set_prefetch(2);
        assert_nothing_delivered(consumer.as_mut(), "more while 5 are held, shrunk to 2").await;
        for delivery in &held {
            let taken = std::time::Instant::now();
            assert!(
                delivery.received >= opened && delivery.received <= taken,
                "{} received between the consume and its taking",
                delivery.job_id
            );
        }
        for delivery in held.drain(..) {
            ack(delivery).await;
        }
        for _ in 0..2 {
            held.push(next_delivery(consumer.as_mut(), "the prefetch back at 2").await);
        }
        assert_nothing_delivered(consumer.as_mut(), "a third beyond prefetch 2 again").await;
        consumer.set_prefetch(1);
        for delivery in held.drain(..) {
            ack(delivery).await;
        }
        for _ in 0..2 {
            held.push(next_delivery(consumer.as_mut(), "never below the prefetch opened").await);
        }
        assert_nothing_delivered(consumer.as_mut(), "a third after asking for 1").await;
        for delivery in held {
            ack(delivery).await;
        }
    }

    /// A requeued message comes back, marked redelivered.
    pub async fn requeue_redelivers(broker: &dyn Broker) {
        let pool = unique("requeue");
        publish_all(broker, &pool, &["job-a".to_owned()]).await;
        let mut consumer = consume(broker, &pool, 1).await;
        let delivery = next_delivery(consumer.as_mut(), "before requeue").await;
        assert!(!delivery.redelivered);
        assert_eq!(within("requeue", delivery.requeue()).await, Ok(()));
        let again = next_delivery(consumer.as_mut(), "after requeue").await;
        assert_eq!(again.job_id, "job-a");
        assert!(
            again.redelivered,
            "a requeued message is marked redelivered"
        );
        ack(again).await;
    }

    /// Both the consumer and its deliveries are dropped, as when a worker
    /// dies: some backends tie a delivery to its channel, others to the
    /// consumer, and either way the messages must come back.
    pub async fn dropped_consumer_gives_back_unacked(broker: &dyn Broker) {
        let pool = unique("dropped");
        let ids = job_ids(2);
        publish_all(broker, &pool, &ids).await;
        let mut doomed = consume(broker, &pool, 2).await;
        let held = [
            next_delivery(doomed.as_mut(), "first before drop").await,
            next_delivery(doomed.as_mut(), "second before drop").await,
        ];
        drop(doomed);
        drop(held);
        let mut survivor = consume(broker, &pool, 2).await;
        let mut back = Vec::new();
        for _ in &ids {
            let delivery = next_delivery(survivor.as_mut(), "given back").await;
            assert!(
                delivery.redelivered,
                "{} comes back redelivered",
                delivery.job_id
            );
            back.push(delivery.job_id.clone());
            ack(delivery).await;
        }
        back.sort();
        assert_eq!(back, ids);
    }

    /// Many deliveries settled at once and out of order, acks among
    /// requeues, a reject and drops (as a worker's jobs finish): each takes
    /// its own effect. No ack settles a delivery that was to come back, the
    /// ones given back return once, and acked or rejected ones never return.
    pub async fn settlements_in_any_order_each_take_effect(broker: &dyn Broker) {
        const COUNT: usize = 40;
        let pool = unique("settle-mix");
        let ids = job_ids(COUNT);
        publish_all(broker, &pool, &ids).await;
        let mut consumer = consume(broker, &pool, COUNT as u16).await;
        let mut held = Vec::with_capacity(COUNT);
        for _ in 0..COUNT {
            held.push(next_delivery(consumer.as_mut(), "taking the batch").await);
        }
        // Newest first, so later deliveries finish before older ones.
        held.reverse();
        let mut back = Vec::new();
        let mut settling = tokio::task::JoinSet::new();
        for (n, delivery) in held.into_iter().enumerate() {
            let id = delivery.job_id.clone();
            match n % 10 {
                3 | 7 => {
                    back.push(id);
                    settling.spawn(async move { ("requeue", delivery.requeue().await) });
                }
                5 => {
                    back.push(id);
                    drop(delivery);
                }
                9 if n == 9 => {
                    settling.spawn(async move { ("reject", delivery.reject().await) });
                }
                _ => {
                    settling.spawn(async move { ("ack", delivery.ack().await) });
                }
            }
        }
        while let Some(settled) = within("settling", settling.join_next()).await {
            let (how, answer) = settled.expect("a settling task");
            assert_eq!(answer, Ok(()), "{how} answered");
        }
        let mut again = Vec::new();
        for _ in &back {
            let delivery = next_delivery(consumer.as_mut(), "given back").await;
            assert!(
                delivery.redelivered,
                "{} comes back redelivered",
                delivery.job_id
            );
            again.push(delivery.job_id.clone());
            ack(delivery).await;
        }
        back.sort();
        again.sort();
        assert_eq!(
            again, back,
            "exactly the requeued and dropped deliveries return"
        );
        assert_nothing_delivered(consumer.as_mut(), "after every settlement").await;
    }

    /// A rejected message is not delivered again, and does not block the next.
    pub async fn rejected_message_is_not_redelivered(broker: &dyn Broker) {
        let pool = unique("reject");
        let ids = job_ids(2);
        publish_all(broker, &pool, &ids).await;
        let mut consumer = consume(broker, &pool, 1).await;
        let bad = next_delivery(consumer.as_mut(), "to reject").await;
        assert_eq!(bad.job_id, ids[0]);
        assert_eq!(within("reject", bad.reject()).await, Ok(()));
        let next = next_delivery(consumer.as_mut(), "after a reject").await;
        assert_eq!(
            next.job_id, ids[1],
            "a rejected message does not block the next"
        );
        ack(next).await;
        assert_nothing_delivered(consumer.as_mut(), "the rejected message").await;
    }

    /// A rejected message is among its pool's dead letters (none of another
    /// pool's), reason `rejected`, carrying its id; a dead letter requeued
    /// comes again, one acked or rejected never does.
    pub async fn rejected_messages_are_dead_letters_until_taken(broker: &dyn Broker) {
        let (pool, other) = (unique("dead"), unique("dead-other"));
        let ids = job_ids(3);
        publish_all(broker, &pool, &ids).await;
        publish_all(broker, &other, &job_ids(1)).await;
        let mut consumer = consume(broker, &pool, 1).await;
        for _ in 0..ids.len() {
            let delivery = next_delivery(consumer.as_mut(), "to reject").await;
            assert_eq!(within("reject", delivery.reject()).await, Ok(()));
        }
        let mut elsewhere = consume(broker, &other, 1).await;
        let kept = next_delivery(elsewhere.as_mut(), "another pool's").await;
        assert_eq!(within("reject", kept.reject()).await, Ok(()));
        let mut dead = within("consume_dead", broker.consume_dead(&pool))
            .await
            .expect("consume the dead letters");
        // Held together (a consumer of dead letters holds several), then
        // given back.
        let mut letters = Vec::new();
        for _ in 0..ids.len() {
            letters.push(next_delivery(dead.as_mut(), "a dead letter").await);
        }
        let mut seen = Vec::new();
        for letter in letters {
            assert_eq!(letter.dead_reason.as_deref(), Some("rejected"));
            seen.push(letter.job_id.clone());
            assert_eq!(within("requeue", letter.requeue()).await, Ok(()));
        }
        seen.sort();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(seen, sorted, "each rejected message, and only this pool's");
        let again = next_delivery(dead.as_mut(), "a requeued dead letter").await;
        assert!(ids.contains(&again.job_id));
        assert_eq!(within("reject", again.reject()).await, Ok(()));
        for _ in 1..ids.len() {
            ack(next_delivery(dead.as_mut(), "the rest").await).await;
        }
        assert_nothing_delivered(dead.as_mut(), "a dead letter taken").await;
    }

    /// Delays are per message: a shorter delay published after a longer one
    /// arrives first, and an undelayed message published last arrives before
    /// both (which also shows `publish_delayed` did not wait out its delay).
    pub async fn delayed_message_waits_its_delay(broker: &dyn Broker) {
        let pool = unique("delayed");
        let (long, short) = (Duration::from_millis(500), Duration::from_millis(200));
        let start = Instant::now();
        publish_delayed(broker, &pool, "job-long", long).await;
        publish_delayed(broker, &pool, "job-short", short).await;
        publish_all(broker, &pool, &["job-now".to_owned()]).await;
        let mut consumer = consume(broker, &pool, 3).await;
        for (id, delay) in [
            ("job-now", Duration::ZERO),
            ("job-short", short),
            ("job-long", long),
        ] {
            let delivery = next_delivery(consumer.as_mut(), id).await;
            let waited = start.elapsed();
            assert_eq!(delivery.job_id, id, "delayed messages arrive by due time");
            assert!(
                waited >= delay,
                "{id} arrived after {waited:?}, before its delay {delay:?}"
            );
            ack(delivery).await;
        }
    }

    /// A message published with a trace context delivers it back, whole
    /// (`tracestate` included), at once, after a delay and when requeued;
    /// one published without any delivers none.
    pub async fn trace_context_travels_with_the_message(broker: &dyn Broker) {
        use toolfleet_core::TraceContext;
        let pool = unique("traced");
        let traced = TraceContext::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            Some("congo=t61rcWkgMzE"),
        );
        let later = Some(TraceContext::new_root());
        let now = within(
            "publish_traced",
            broker.publish_traced(&pool, "job-traced", traced.as_ref()),
        )
        .await;
        assert_eq!(now, Ok(()));
        let delayed = within(
            "publish_delayed_traced",
            broker.publish_delayed_traced(
                &pool,
                "job-later",
                Duration::from_millis(100),
                later.as_ref(),
            ),
        )
        .await;
        assert_eq!(delayed, Ok(()));
        publish_all(broker, &pool, &["job-bare".to_owned()]).await;
        let mut consumer = consume(broker, &pool, 3).await;
        let first = next_delivery(consumer.as_mut(), "traced message").await;
        assert_eq!(
            (first.job_id.as_str(), &first.trace),
            ("job-traced", &traced)
        );
        assert_eq!(within("requeue", first.requeue()).await, Ok(()));
        let mut seen = Vec::new();
        for _ in 0..3 {
            let delivery = next_delivery(consumer.as_mut(), "traced messages").await;
            seen.push((delivery.job_id.clone(), delivery.trace.clone()));
            ack(delivery).await;
        }
        seen.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            seen,
            vec![
                ("job-bare".to_owned(), None),
                ("job-later".to_owned(), later),
                ("job-traced".to_owned(), traced),
            ],
            "each message keeps its own context, a requeued one too"
        );
    }

    async fn publish_delayed(broker: &dyn Broker, pool: &str, id: &str, delay: Duration) {
        let published = within("publish_delayed", broker.publish_delayed(pool, id, delay)).await;
        assert_eq!(
            published,
            Ok(()),
            "publishing {id} to {pool} after {delay:?}"
        );
    }

    /// A consumer receives only the messages of its own pool.
    pub async fn pools_are_isolated(broker: &dyn Broker) {
        let (left, right) = (unique("left"), unique("right"));
        publish_all(broker, &left, &["job-left".to_owned()]).await;
        publish_all(broker, &right, &["job-right".to_owned()]).await;
        let mut left_consumer = consume(broker, &left, 5).await;
        let delivery = next_delivery(left_consumer.as_mut(), "left pool").await;
        assert_eq!(delivery.job_id, "job-left");
        ack(delivery).await;
        assert_nothing_delivered(left_consumer.as_mut(), "right pool's message in left").await;
        let mut right_consumer = consume(broker, &right, 5).await;
        let delivery = next_delivery(right_consumer.as_mut(), "right pool").await;
        assert_eq!(delivery.job_id, "job-right");
        ack(delivery).await;
    }

    /// Depth may lag a little behind in a remote broker, so each expected
    /// value is awaited (bounded) rather than read once.
    pub async fn depth_counts_ready_messages(broker: &dyn Broker) {
        let pool = unique("depth");
        depth_becomes(broker, &pool, 0, "an unused pool").await;
        publish_all(broker, &pool, &job_ids(3)).await;
        depth_becomes(broker, &pool, 3, "three published").await;
        publish_delayed(broker, &pool, "job-later", ARRIVAL).await;
        depth_becomes(broker, &pool, 3, "a delayed message is not ready").await;
        let mut consumer = consume(broker, &pool, 1).await;
        let delivery = next_delivery(consumer.as_mut(), "one taken").await;
        depth_becomes(broker, &pool, 2, "an unacked delivery is not ready").await;
        ack(delivery).await;
    }

    async fn depth_becomes(broker: &dyn Broker, pool: &str, expected: u64, what: &str) {
        let deadline = Instant::now() + ARRIVAL;
        loop {
            let depth = within("depth", broker.depth(pool)).await;
            if depth == Ok(expected) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: depth {depth:?}, expected {expected}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The behaviours of every [`Notices`].
pub mod notices {
    use super::*;

    fn event(tenant: &str, n: usize) -> Event {
        Event {
            kind: crate::EventKind::Job,
            id: format!("job-{n}"),
            tenant: tenant.to_owned(),
            tool: "receipt_ocr".to_owned(),
            state: crate::EventState::parse("succeeded").expect("a state"),
            run_id: "run-1".to_owned(),
            body: json!({"status": "ok", "n": n}).into(),
            callback: n % 2 == 1,
            life: 0,
            ..Default::default()
        }
    }

    async fn subscribe(notices: &dyn Notices) -> Box<dyn Subscription> {
        match within("subscribe", notices.subscribe()).await {
            Ok(subscription) => subscription,
            Err(e) => panic!("subscribing: {e}"),
        }
    }

    async fn publish(notices: &dyn Notices, event: &Event) {
        assert_eq!(
            within("publish", notices.publish(event)).await,
            Ok(()),
            "publishing {}",
            event.id
        );
    }

    /// The next event of `tenant`, skipping those of tests sharing the
    /// implementation; fails if none comes within [`ARRIVAL`].
    async fn next_of(subscription: &mut dyn Subscription, tenant: &str, what: &str) -> Event {
        let wait = async {
            loop {
                match subscription.next().await {
                    Some(event) if event.tenant == tenant => return Some(event),
                    Some(_) => {}
                    None => return None,
                }
            }
        };
        match timeout(ARRIVAL, wait).await {
            Ok(Some(event)) => event,
            Ok(None) => panic!("{what}: the subscription ended"),
            Err(_) => panic!("{what}: no event within {ARRIVAL:?}"),
        }
    }

    /// Every subscriber receives each event, in publish order.
    pub async fn every_subscriber_receives_each_event_in_order(notices: &dyn Notices) {
        let tenant = unique("tenant");
        let mut subscribers = [subscribe(notices).await, subscribe(notices).await];
        let events: Vec<Event> = (0..5).map(|n| event(&tenant, n)).collect();
        for event in &events {
            publish(notices, event).await;
        }
        for subscriber in &mut subscribers {
            for expected in &events {
                let got = next_of(subscriber.as_mut(), &tenant, "each event").await;
                assert_eq!(got.id, expected.id, "events arrive in publish order");
            }
        }
    }

    /// A subscriber receives only the events published after it subscribed.
    pub async fn events_before_subscribing_are_not_received(notices: &dyn Notices) {
        let tenant = unique("tenant");
        publish(notices, &event(&tenant, 0)).await;
        let mut subscriber = subscribe(notices).await;
        publish(notices, &event(&tenant, 1)).await;
        let got = next_of(subscriber.as_mut(), &tenant, "after subscribing").await;
        assert_eq!(
            got.id, "job-1",
            "an event from before subscribing was received"
        );
    }

    /// An event arrives whole, and its routing key is
    /// `<tenant>.<tool>.<state>`.
    pub async fn event_arrives_whole_with_its_routing_key(notices: &dyn Notices) {
        let tenant = unique("tenant");
        let mut subscriber = subscribe(notices).await;
        let sent = event(&tenant, 7);
        publish(notices, &sent).await;
        let got = next_of(subscriber.as_mut(), &tenant, "whole event").await;
        assert_eq!(got, sent);
        assert_eq!(got.routing_key(), format!("{tenant}.receipt_ocr.succeeded"));
    }

    /// A subscriber that reads nothing while many events are published must
    /// not hold the publisher back, and must still see the newest event.
    pub async fn lagging_subscriber_skips_and_keeps_up(notices: &dyn Notices) {
        let tenant = unique("tenant");
        let mut idle = subscribe(notices).await;
        let count = 200;
        let burst = async {
            for n in 0..count {
                publish(notices, &event(&tenant, n)).await;
            }
        };
        assert!(
            timeout(ARRIVAL, burst).await.is_ok(),
            "publishing {count} events with an idle subscriber did not finish"
        );
        let last = format!("job-{}", count - 1);
        loop {
            let got = next_of(idle.as_mut(), &tenant, "after lagging").await;
            if got.id == last {
                break;
            }
        }
    }

    /// `publish_all` of the events of two jobs, their states
    /// interleaved: every event arrives whole, once, and each job's events
    /// in the order given.
    pub async fn a_batch_arrives_whole_each_jobs_events_in_order(notices: &dyn Notices) {
        let tenant = unique("tenant");
        let mut subscriber = subscribe(notices).await;
        // Eight events: within the smallest buffer the suites run with.
        let states = ["running", "retrying", "running", "succeeded"];
        let mut events = Vec::new();
        for state in states {
            for n in 0..2 {
                let mut e = event(&tenant, n);
                e.state = crate::EventState::parse(state).expect("a state");
                e.body = json!({"n": n, "state": state}).into();
                events.push(e);
            }
        }
        assert_eq!(
            within("publish_all", notices.publish_all(&events)).await,
            Ok(()),
            "publishing a batch"
        );
        let mut got = Vec::new();
        while got.len() < events.len() {
            got.push(next_of(subscriber.as_mut(), &tenant, "each event of the batch").await);
        }
        for n in 0..2 {
            let id = format!("job-{n}");
            let order: Vec<&str> = got
                .iter()
                .filter(|e| e.id == id)
                .map(|e| e.state.as_str())
                .collect();
            assert_eq!(order, states, "the events of {id}");
        }
        for event in &events {
            assert!(
                got.contains(event),
                "{} {} arrived whole",
                event.id,
                event.state
            );
        }
    }

    /// `subscribe_settled` hears every settled job and answered ticket, in
    /// order, whatever else it may hear (an implementation may deliver
    /// everything); the job's and ticket's other events are not outcomes.
    pub async fn a_settled_subscription_hears_every_outcome_in_order(notices: &dyn Notices) {
        let tenant = unique("tenant");
        let mut outcomes = match within("subscribe_settled", notices.subscribe_settled()).await {
            Ok(subscription) => subscription,
            Err(e) => panic!("subscribing to outcomes: {e}"),
        };
        let job = |n: usize, state: &str| {
            let mut e = event(&tenant, n);
            e.state = crate::EventState::parse(state).expect("a state");
            e
        };
        let ticket = |state: &str| {
            let mut e = job(9, state);
            e.kind = crate::EventKind::Ticket;
            e.id = "t_1".to_owned();
            e
        };
        let sent = [
            job(0, "queued"),
            job(0, "running"),
            job(0, "succeeded"),
            job(1, "retrying"),
            job(1, "failed"),
            job(2, "queued"),
            job(2, "cancelled"),
            ticket("open"),
            ticket("answered"),
        ];
        for event in &sent {
            publish(notices, event).await;
        }
        let expected: Vec<&Event> = sent
            .iter()
            .filter(|e| crate::SETTLED_STATES.contains(&e.state))
            .collect();
        let mut heard = Vec::new();
        while heard.len() < expected.len() {
            let got = next_of(outcomes.as_mut(), &tenant, "each outcome").await;
            if crate::SETTLED_STATES.contains(&got.state) {
                heard.push(got);
            }
        }
        assert_eq!(heard.iter().collect::<Vec<_>>(), expected);
    }

    /// `hears` may answer false only where no subscriber would get the
    /// event: with a subscription to outcomes, every outcome's key is heard;
    /// with a subscription to everything, every key.
    pub async fn whoever_subscribes_is_heard(notices: &dyn Notices) {
        let tenant = unique("tenant");
        let key = |state: &str| {
            let state = crate::EventState::parse(state).expect("a state");
            Event::key(&tenant, "receipt_ocr", state)
        };
        let outcomes = match within("subscribe_settled", notices.subscribe_settled()).await {
            Ok(subscription) => subscription,
            Err(e) => panic!("subscribing to outcomes: {e}"),
        };
        for state in ["succeeded", "failed", "cancelled", "answered"] {
            assert!(notices.hears(&key(state)), "an outcome, {state}, unheard");
        }
        drop(outcomes);
        let _every = subscribe(notices).await;
        for state in ["queued", "running", "retrying", "succeeded", "open"] {
            assert!(notices.hears(&key(state)), "{state} unheard");
        }
    }
}
