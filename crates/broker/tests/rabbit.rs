//! The RabbitMQ broker and notices against a real RabbitMQ: the shared
//! conformance suites (the notices also behind a fan-out), then what only
//! RabbitMQ shows (the dead-letter queue, the bound, redelivery after a
//! dropped delivery, closing, coming back after the connection dies, and one
//! queue per fan-out however many subscribe through it).
//!
//! RabbitMQ is found at `TOOLFLEET_TEST_AMQP_URL` (default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`). These tests never skip: if
//! RabbitMQ is unreachable they fail and say so. Each test uses a prefix of
//! its own, so tests run in parallel, and deletes its queues and exchanges
//! when it ends. The server-side close test also needs `rabbitmqctl` (or the
//! command in `TOOLFLEET_TEST_RABBITMQCTL`, e.g. `docker exec rabbitmq
//! rabbitmqctl`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::{Connection, ConnectionProperties};
use tokio::time::{Instant, sleep, timeout};
use toolfleet_broker::conformance::{
    ARRIVAL, QUIET, assert_nothing_delivered, next_delivery, unique,
};
use toolfleet_broker::fanout::{Fanout, FanoutOptions};
use toolfleet_broker::rabbit::{RabbitBroker, RabbitNotices, RabbitOptions};
use toolfleet_broker::split::Split;
use toolfleet_broker::{
    Broker, BrokerError, Consumer, Delivery, Event, Notices, SETTLED_STATES, Subscription,
};
use toolfleet_core::TraceContext;

fn url() -> String {
    std::env::var("TOOLFLEET_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

fn options() -> RabbitOptions {
    RabbitOptions {
        prefix: format!("tftest-{}", toolfleet_core::new_id()),
        ..RabbitOptions::default()
    }
}

fn unreachable(e: BrokerError) -> ! {
    panic!(
        "RabbitMQ is unreachable ({e}); start it or set TOOLFLEET_TEST_AMQP_URL \
         (these tests never skip)"
    )
}

async fn broker_with(options: RabbitOptions) -> Isolated<RabbitBroker> {
    match RabbitBroker::connect(&url(), options).await {
        Ok(broker) => Isolated(broker),
        Err(e) => unreachable(e),
    }
}

async fn broker() -> Isolated<RabbitBroker> {
    broker_with(options()).await
}

async fn notices() -> Isolated<RabbitNotices> {
    match RabbitNotices::connect(&url(), options()).await {
        Ok(notices) => Isolated(notices),
        Err(e) => unreachable(e),
    }
}

/// What a test's broker or notices deletes when the test ends.
trait Teardown: Send + Sync + 'static {
    fn teardown(&self) -> impl Future<Output = Result<(), BrokerError>> + Send;
}

impl Teardown for RabbitBroker {
    fn teardown(&self) -> impl Future<Output = Result<(), BrokerError>> + Send {
        self.close_and_delete()
    }
}

impl Teardown for RabbitNotices {
    fn teardown(&self) -> impl Future<Output = Result<(), BrokerError>> + Send {
        self.close_and_delete()
    }
}

/// A test's broker or notices: deletes its queues and exchanges when
/// dropped, which the conformance macros do at the end of each test.
struct Isolated<T: Teardown>(T);

impl<T: Teardown> Drop for Isolated<T> {
    fn drop(&mut self) {
        let teardown = timeout(ARRIVAL, self.0.teardown());
        let runtime = tokio::runtime::Handle::current();
        let done = tokio::task::block_in_place(|| runtime.block_on(teardown));
        if !std::thread::panicking() {
            assert!(
                matches!(done, Ok(Ok(()))),
                "deleting the test's queues: {done:?}"
            );
        }
    }
}

#[async_trait]
impl Broker for Isolated<RabbitBroker> {
    async fn ping(&self) -> Result<(), BrokerError> {
        self.0.ping().await
    }

    async fn publish_traced(
        &self,
        pool: &str,
        job_id: &str,
        trace: Option<&TraceContext>,
    ) -> Result<(), BrokerError> {
        self.0.publish_traced(pool, job_id, trace).await
    }

    async fn publish_delayed_traced(
        &self,
        pool: &str,
        job_id: &str,
        delay: Duration,
        trace: Option<&TraceContext>,
    ) -> Result<(), BrokerError> {
        self.0
            .publish_delayed_traced(pool, job_id, delay, trace)
            .await
    }

    async fn consume(&self, pool: &str, prefetch: u16) -> Result<Box<dyn Consumer>, BrokerError> {
        self.0.consume(pool, prefetch).await
    }

    async fn depth(&self, pool: &str) -> Result<u64, BrokerError> {
        self.0.depth(pool).await
    }

    async fn consume_dead(&self, pool: &str) -> Result<Box<dyn Consumer>, BrokerError> {
        self.0.consume_dead(pool).await
    }
}

#[async_trait]
impl Notices for Isolated<RabbitNotices> {
    async fn publish(&self, event: &Event) -> Result<(), BrokerError> {
        self.0.publish(event).await
    }

    async fn subscribe(&self) -> Result<Box<dyn Subscription>, BrokerError> {
        self.0.subscribe().await
    }
}

toolfleet_broker::broker_conformance!(broker());

toolfleet_broker::notices_conformance!(notices());

/// A test's notices behind a [`Fanout`]; the fan-out goes first, then the
/// notices delete what they declared.
struct FannedOut {
    fanout: Fanout<RabbitNotices>,
    _isolated: Isolated<RabbitNotices>,
}

async fn fanned_out() -> FannedOut {
    let isolated = notices().await;
    FannedOut {
        fanout: Fanout::new(isolated.0.clone()),
        _isolated: isolated,
    }
}

#[async_trait]
impl Notices for FannedOut {
    async fn publish(&self, event: &Event) -> Result<(), BrokerError> {
        self.fanout.publish(event).await
    }

    async fn subscribe(&self) -> Result<Box<dyn Subscription>, BrokerError> {
        self.fanout.subscribe().await
    }
}

toolfleet_broker::notices_conformance!(mod fanout_conformance, fanned_out());

/// A test's notices split as a dispatcher's are: every event through one
/// fan-out, outcomes through another bound to their states alone.
struct SplitUp {
    split: Split,
    _isolated: Isolated<RabbitNotices>,
}

async fn split_up() -> SplitUp {
    let isolated = notices().await;
    let all = Fanout::new(isolated.0.clone());
    let settled = Fanout::new(isolated.0.clone().only_states(&SETTLED_STATES));
    SplitUp {
        split: Split::new(Arc::new(all), Arc::new(settled)),
        _isolated: isolated,
    }
}

#[async_trait]
impl Notices for SplitUp {
    async fn publish(&self, event: &Event) -> Result<(), BrokerError> {
        self.split.publish(event).await
    }

    async fn publish_all(&self, events: &[Event]) -> Result<(), BrokerError> {
        self.split.publish_all(events).await
    }

    async fn subscribe(&self) -> Result<Box<dyn Subscription>, BrokerError> {
        self.split.subscribe().await
    }

    async fn subscribe_settled(&self) -> Result<Box<dyn Subscription>, BrokerError> {
        self.split.subscribe_settled().await
    }
}

toolfleet_broker::notices_conformance!(mod split_conformance, split_up());

/// Split notices route outcomes alone to a process whose subscribers all
/// wait for outcomes: a job's `queued` and `running` are not even bound
/// until a subscriber asks for every event, which then hears them, and are
/// unbound again once it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_notices_bind_every_state_only_once_asked() {
    let options = options();
    let prefix = options.prefix.clone();
    let isolated = match RabbitNotices::connect(&url(), options).await {
        Ok(notices) => Isolated(notices),
        Err(e) => unreachable(e),
    };
    // Ended at the first event unheard, not a linger later.
    let at_once = FanoutOptions {
        linger: Duration::ZERO,
        ..FanoutOptions::default()
    };
    let split = Split::new(
        Arc::new(Fanout::with_options(isolated.0.clone(), at_once.clone())),
        Arc::new(Fanout::with_options(
            isolated.0.clone().only_states(&SETTLED_STATES),
            at_once,
        )),
    );
    let mut outcomes = split.subscribe_settled().await.expect("subscribing");
    let mut others = split.subscribe_settled().await.expect("subscribing again");
    // And to listeners' notices (`LISTENING_KEY`).
    let outcomes_only = SETTLED_STATES.len() + 1;
    assert_eq!(
        event_bindings(&prefix).await,
        outcomes_only,
        "one queue, bound to the outcomes' states alone"
    );
    let tenant = unique("tenant");
    let event = |state: &str| job_event(&tenant, state);
    for state in ["queued", "running", "succeeded"] {
        assert_eq!(split.publish(&event(state)).await, Ok(()));
    }
    for subscription in [&mut outcomes, &mut others] {
        let got = timeout(ARRIVAL, subscription.next()).await;
        assert_eq!(
            got.ok().flatten().map(|e| e.state.as_str()),
            Some("succeeded"),
            "the first event an outcome subscriber hears is the outcome"
        );
    }
    let mut every = split.subscribe().await.expect("subscribing to every event");
    assert_eq!(
        event_bindings(&prefix).await,
        outcomes_only + 1,
        "a second queue, bound to every key"
    );
    assert_eq!(split.publish(&event("running")).await, Ok(()));
    let got = timeout(ARRIVAL, every.next()).await;
    assert_eq!(
        got.ok().flatten().map(|e| e.state.as_str()),
        Some("running")
    );
    // Once that subscriber is gone, the next event unheard unbinds every key.
    drop(every);
    assert_eq!(split.publish(&event("running")).await, Ok(()));
    // rabbitmqctl answers slowly on a loaded machine.
    let deadline = Instant::now() + ARRIVAL * 4;
    while event_bindings(&prefix).await != outcomes_only {
        assert!(Instant::now() < deadline, "every key stayed bound");
        sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(split.publish(&event("succeeded")).await, Ok(()));
    let got = timeout(ARRIVAL, outcomes.next()).await;
    assert_eq!(
        got.ok().flatten().map(|e| e.state.as_str()),
        Some("succeeded")
    );
}

/// The event of job `job-a` of `tenant` in `state`.
fn job_event(tenant: &str, state: &str) -> Event {
    Event {
        kind: toolfleet_broker::EventKind::Job,
        id: "job-a".to_owned(),
        tenant: tenant.to_owned(),
        tool: "receipt_ocr".to_owned(),
        state: toolfleet_broker::EventState::parse(state).expect("a state"),
        run_id: "run-1".to_owned(),
        body: serde_json::json!({"state": state}).into(),
        callback: false,
        life: 0,
        ..Default::default()
    }
}

async fn consume(broker: &RabbitBroker, pool: &str, prefetch: u16) -> Box<dyn Consumer> {
    match broker.consume(pool, prefetch).await {
        Ok(consumer) => consumer,
        Err(e) => panic!("consuming {pool}: {e}"),
    }
}

async fn publish(broker: &RabbitBroker, pool: &str, job_id: &str) {
    assert_eq!(
        broker.publish(pool, job_id).await,
        Ok(()),
        "publishing {job_id}"
    );
}

/// Publishes until RabbitMQ takes it, as a dispatcher's outbox sweeper
/// would while the broker comes back or the pool drains.
async fn publish_eventually(broker: &RabbitBroker, pool: &str, job_id: &str) {
    let deadline = Instant::now() + ARRIVAL;
    loop {
        match broker.publish(pool, job_id).await {
            Ok(()) => return,
            Err(e) if Instant::now() >= deadline => panic!("publishing {job_id}: {e}"),
            Err(BrokerError::Closed) => panic!("publishing {job_id}: closed"),
            Err(_) => sleep(Duration::from_millis(50)).await,
        }
    }
}

/// A plain connection of the test's own, to look into queues the broker
/// does not expose.
async fn raw_connection() -> Connection {
    match Connection::connect(&url(), ConnectionProperties::default()).await {
        Ok(connection) => connection,
        Err(e) => panic!("RabbitMQ is unreachable ({e})"),
    }
}

/// Takes the next message of `queue`, waiting (bounded) for one to arrive.
async fn get_from(connection: &Connection, queue: &str) -> String {
    let channel = connection.create_channel().await.expect("a channel");
    let deadline = Instant::now() + ARRIVAL;
    loop {
        let got = channel
            .basic_get(queue.into(), BasicGetOptions::default())
            .await
            .expect("basic.get");
        if let Some(message) = got {
            message
                .delivery
                .acker
                .ack(BasicAckOptions::default())
                .await
                .expect("ack");
            return String::from_utf8_lossy(&message.delivery.data).into_owned();
        }
        assert!(Instant::now() < deadline, "nothing arrived in {queue}");
        sleep(Duration::from_millis(20)).await;
    }
}

/// The job ids of the next message of `queue` (one per line), sorted.
async fn sorted_ids_from(connection: &Connection, queue: &str) -> Vec<String> {
    let mut ids: Vec<String> = get_from(connection, queue)
        .await
        .split('\n')
        .map(str::to_owned)
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_message_lands_in_the_dead_letter_queue() {
    let options = options();
    let dead = |pool: &str| format!("{}.dead.{pool}", options.prefix);
    let broker = broker_with(options.clone()).await;
    let pool = unique("dead");
    publish(&broker.0, &pool, "not-a-job").await;
    publish(&broker.0, &pool, "job-b").await;
    let mut consumer = consume(&broker.0, &pool, 1).await;
    let bad = next_delivery(consumer.as_mut(), "to reject").await;
    assert_eq!(bad.job_id, "not-a-job");
    assert_eq!(bad.reject().await, Ok(()));
    let next = next_delivery(consumer.as_mut(), "after the reject").await;
    assert_eq!(
        next.job_id, "job-b",
        "a rejected message does not block the next"
    );
    assert_eq!(next.ack().await, Ok(()));

    let connection = raw_connection().await;
    assert_eq!(get_from(&connection, &dead(&pool)).await, "not-a-job");
    assert_eq!(broker.0.depth(&pool).await, Ok(0));
}

/// A pool queue with a delivery limit dead-letters a message that keeps
/// coming back unsettled once it is over the limit, requeued or dropped
/// with its consumer alike; its dead letter says `delivery_limit`, and the
/// pool's next message is not held up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_its_delivery_limit_is_a_dead_letter() {
    let broker = broker_with(RabbitOptions {
        delivery_limit: Some(1),
        ..options()
    })
    .await;
    let pool = unique("limit");
    publish(&broker.0, &pool, "job-poison").await;
    let mut consumer = consume(&broker.0, &pool, 1).await;
    let first = next_delivery(consumer.as_mut(), "the first delivery").await;
    assert_eq!(first.requeue().await, Ok(()));
    let second = next_delivery(consumer.as_mut(), "the second delivery").await;
    assert_eq!(second.job_id, "job-poison");
    drop(second);
    publish(&broker.0, &pool, "job-next").await;
    let next = next_delivery(consumer.as_mut(), "the next message").await;
    assert_eq!(next.job_id, "job-next", "the poison message is gone");
    assert_eq!(next.ack().await, Ok(()));

    let mut dead = broker.0.consume_dead(&pool).await.expect("consume dead");
    let letter = next_delivery(dead.as_mut(), "the dead letter").await;
    assert_eq!(letter.job_id, "job-poison");
    assert_eq!(letter.dead_reason.as_deref(), Some("delivery_limit"));
    assert_eq!(letter.ack().await, Ok(()));
}

/// A quorum queue checks its bound after taking a message, so it takes one
/// beyond the bound before refusing, and takes more once below it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_pool_answers_full() {
    let bound = 2;
    let broker = broker_with(RabbitOptions {
        max_length: Some(bound),
        ..options()
    })
    .await;
    let pool = unique("full");
    let mut taken = 0;
    let refusal = loop {
        match broker.0.publish(&pool, &format!("job-{taken}")).await {
            Ok(()) => taken += 1,
            Err(e) => break e,
        }
        assert!(
            taken <= bound + 1,
            "{taken} messages taken under a bound of {bound}"
        );
    };
    assert!(matches!(refusal, BrokerError::Full(_)), "{refusal:?}");
    assert!(
        taken >= bound,
        "refused at {taken} under a bound of {bound}"
    );
    publish(&broker.0, &unique("other"), "job-other").await;

    let mut consumer = consume(&broker.0, &pool, u16::try_from(taken).unwrap_or(1)).await;
    for _ in 0..taken {
        let delivery = next_delivery(consumer.as_mut(), "draining").await;
        assert_eq!(delivery.ack().await, Ok(()));
    }
    publish_eventually(&broker.0, &pool, "job-after").await;
}

/// A delayed message due while its pool is full does not overflow it. It is
/// not lost either: dead-lettering is at least once, so it stays in its
/// delay queue and RabbitMQ retries (every few minutes by default, too late
/// for a test to wait for) until the pool takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_message_due_in_a_full_pool_does_not_overflow_it() {
    let broker = broker_with(RabbitOptions {
        max_length: Some(1),
        ..options()
    })
    .await;
    let pool = unique("full-delayed");
    let mut taken = 0;
    while broker
        .0
        .publish(&pool, &format!("job-{taken}"))
        .await
        .is_ok()
    {
        taken += 1;
        assert!(taken <= 3, "the pool never filled");
    }
    assert_eq!(
        broker.0.publish_delayed(&pool, "job-later", QUIET).await,
        Ok(())
    );
    sleep(QUIET * 5).await;
    assert_eq!(
        broker.0.depth(&pool).await,
        Ok(taken),
        "the pool stays full"
    );
    let mut consumer = consume(&broker.0, &pool, 1).await;
    for n in 0..taken {
        let delivery = next_delivery(consumer.as_mut(), "the pool's own").await;
        assert_eq!(delivery.job_id, format!("job-{n}"));
        assert_eq!(delivery.ack().await, Ok(()));
    }
}

/// A queue declared with another bound (an older configuration) is used as
/// it is rather than refused, so a changed setting never stops a fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn existing_queue_with_other_arguments_is_used_as_it_is() {
    let options = options();
    let older = broker_with(RabbitOptions {
        max_length: Some(5),
        ..options.clone()
    })
    .await;
    let newer = broker_with(RabbitOptions {
        max_length: Some(50),
        ..options
    })
    .await;
    let pool = unique("arguments");
    publish(&older.0, &pool, "job-a").await;
    publish(&newer.0, &pool, "job-b").await;
    assert_eq!(newer.0.publish_delayed(&pool, "job-c", QUIET).await, Ok(()));
    let mut consumer = consume(&newer.0, &pool, 3).await;
    for id in ["job-a", "job-b", "job-c"] {
        let delivery = next_delivery(consumer.as_mut(), id).await;
        assert_eq!(delivery.job_id, id);
        assert_eq!(delivery.ack().await, Ok(()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_delivery_returns_to_the_queue() {
    let broker = broker().await;
    let pool = unique("dropped-delivery");
    publish(&broker.0, &pool, "job-a").await;
    let mut consumer = consume(&broker.0, &pool, 1).await;
    drop(next_delivery(consumer.as_mut(), "to drop").await);
    let again = next_delivery(consumer.as_mut(), "after the drop").await;
    assert_eq!(again.job_id, "job-a");
    assert!(
        again.redelivered,
        "a dropped delivery comes back redelivered"
    );
    assert_eq!(again.ack().await, Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_prefetch_takes_the_default() {
    let broker = broker().await;
    let pool = unique("zero-prefetch");
    publish(&broker.0, &pool, "job-a").await;
    publish(&broker.0, &pool, "job-b").await;
    let mut consumer = consume(&broker.0, &pool, 0).await;
    let held = next_delivery(consumer.as_mut(), "first").await;
    let beyond = timeout(QUIET, consumer.next()).await;
    assert!(beyond.is_err(), "a default prefetch of one held two");
    assert_eq!(held.ack().await, Ok(()));
    let second = next_delivery(consumer.as_mut(), "after the ack").await;
    assert_eq!(second.ack().await, Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_ends_consumers_and_refuses_work() {
    let broker = broker().await;
    let pool = unique("close");
    let mut consumer = consume(&broker.0, &pool, 1).await;
    let waiting = tokio::spawn(async move { consumer.next().await.map(|d| d.job_id.clone()) });
    sleep(QUIET).await;
    broker.0.close();
    let ended = timeout(ARRIVAL, waiting).await;
    assert!(
        matches!(ended, Ok(Ok(None))),
        "a waiting consumer ends on close: {ended:?}"
    );
    assert_eq!(
        broker.0.publish(&pool, "job-a").await,
        Err(BrokerError::Closed)
    );
    assert_eq!(broker.0.ping().await, Err(BrokerError::Closed));
    assert!(broker.0.consume(&pool, 1).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_broker_answers_unavailable() {
    let connecting = RabbitBroker::connect("amqp://guest:guest@127.0.0.1:1/%2f", options());
    let answer = timeout(ARRIVAL * 2, connecting).await;
    assert!(
        matches!(answer, Ok(Err(BrokerError::Unavailable(_)))),
        "{answer:?}"
    );
}

/// A consumer holding an unacked delivery loses its connection; the
/// delivery's ack fails cleanly, the message comes again on the same
/// consumer, and the consumer takes new work once publishing is back.
async fn comes_back_after(broker: &RabbitBroker, kill: impl Future<Output = ()>) {
    let pool = unique("reconnect");
    publish(broker, &pool, "job-a").await;
    let mut consumer = consume(broker, &pool, 1).await;
    let held = next_delivery(consumer.as_mut(), "before the close").await;

    kill.await;
    let right_after = timeout(Duration::from_secs(1), broker.publish(&pool, "job-b")).await;
    assert!(
        matches!(right_after, Ok(Ok(()) | Err(BrokerError::Unavailable(_)))),
        "publishing while the connection is down answers at once: {right_after:?}"
    );
    let stale = held.ack().await;
    assert!(
        matches!(stale, Err(BrokerError::Closed) | Ok(())),
        "acking a delivery of the dead channel: {stale:?}"
    );

    let again = redelivery(consumer.as_mut(), "job-a").await;
    assert!(
        again.redelivered,
        "the unacked message comes back redelivered"
    );
    assert_eq!(again.ack().await, Ok(()));
    publish_eventually(broker, &pool, "job-c").await;
    loop {
        let delivery = redelivery(consumer.as_mut(), "new work after the reconnect").await;
        let id = delivery.job_id.clone();
        assert_eq!(delivery.ack().await, Ok(()));
        if id == "job-c" {
            break;
        }
        assert_eq!(id, "job-b", "only job-b may come before job-c");
    }
}

/// The next delivery on a consumer that is coming back: up to twice
/// [`ARRIVAL`], since reconnecting comes first.
async fn redelivery(consumer: &mut dyn Consumer, what: &str) -> Delivery {
    match timeout(ARRIVAL * 2, consumer.next()).await {
        Ok(Some(delivery)) => delivery,
        Ok(None) => panic!("{what}: the consumer ended instead of coming back"),
        Err(_) => panic!("{what}: nothing delivered within {:?}", ARRIVAL * 2),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_comes_back_after_its_connection_closes() {
    let broker = broker().await;
    comes_back_after(&broker.0, broker.0.force_reconnect()).await;
}

/// Once the connection a delivery came on is replaced, settling it in any
/// way answers `Closed` at once (RabbitMQ has put it back): nothing waits
/// on a send over a connection that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settling_after_the_connection_is_replaced_answers_closed() {
    let broker = broker().await;
    let pool = unique("replaced");
    for id in ["job-a", "job-b", "job-c"] {
        publish(&broker.0, &pool, id).await;
    }
    let mut consumer = consume(&broker.0, &pool, 3).await;
    let a = next_delivery(consumer.as_mut(), "the first, before the reconnect").await;
    let b = next_delivery(consumer.as_mut(), "the second, before the reconnect").await;
    let c = next_delivery(consumer.as_mut(), "the third, before the reconnect").await;
    broker.0.force_reconnect().await;
    assert_eq!(a.ack().await, Err(BrokerError::Closed));
    assert_eq!(b.requeue().await, Err(BrokerError::Closed));
    assert_eq!(c.reject().await, Err(BrokerError::Closed));
    let mut again = Vec::new();
    for _ in 0..3 {
        let delivery = redelivery(consumer.as_mut(), "after the reconnect").await;
        assert!(
            delivery.redelivered,
            "{} comes back redelivered",
            delivery.job_id
        );
        again.push(delivery.job_id.clone());
        assert_eq!(delivery.ack().await, Ok(()));
    }
    again.sort();
    assert_eq!(again, ["job-a", "job-b", "job-c"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_comes_back_after_the_server_closes_its_connection() {
    let options = options();
    let connection_name = options.prefix.clone();
    let broker = broker_with(options).await;
    comes_back_after(&broker.0, close_from_server(&connection_name)).await;
}

/// Closes, from RabbitMQ's side, the one connection named `name` (the test's
/// prefix), as a node going down would, and no other.
async fn close_from_server(name: &str) {
    let listed = rabbitmqctl(&[
        "list_connections",
        "--no-table-headers",
        "pid",
        "client_properties",
    ])
    .await;
    let pid = listed
        .lines()
        .find(|line| line.contains(name))
        .and_then(|line| line.split_whitespace().next())
        .unwrap_or_else(|| panic!("connection {name} not listed by rabbitmqctl:\n{listed}"))
        .to_owned();
    rabbitmqctl(&["close_connection", &pid, "toolfleet test: node going down"]).await;
}

async fn rabbitmqctl(args: &[&str]) -> String {
    let command =
        std::env::var("TOOLFLEET_TEST_RABBITMQCTL").unwrap_or_else(|_| "rabbitmqctl".into());
    let mut words = command.split_whitespace();
    let program = words.next().unwrap_or("rabbitmqctl");
    let run = tokio::process::Command::new(program)
        .args(words)
        .arg("--quiet")
        .args(args)
        .output();
    let output = match timeout(Duration::from_secs(60), run).await {
        Ok(Ok(output)) if output.status.success() => output,
        other => panic!(
            "running {command} {args:?} failed ({other:?}); this test closes a connection \
             from the server side and needs rabbitmqctl (set TOOLFLEET_TEST_RABBITMQCTL)"
        ),
    };
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_comes_back_after_a_reconnect() {
    let notices = notices().await;
    let mut subscription = notices.0.subscribe().await.expect("subscribing");
    notices.0.force_reconnect().await;
    let tenant = unique("tenant");
    let event = job_event(&tenant, "succeeded");
    // Events published while the subscription rebinds are missed, so keep
    // publishing until one arrives.
    let deadline = Instant::now() + ARRIVAL * 2;
    loop {
        let _ = notices.0.publish(&event).await;
        if let Ok(Some(got)) = timeout(Duration::from_millis(100), subscription.next()).await {
            assert_eq!(got, event);
            return;
        }
        assert!(Instant::now() < deadline, "no event after the reconnect");
    }
}

/// The bindings of the events exchange of `prefix` (one per queue and
/// key), as RabbitMQ lists them.
async fn event_bindings(prefix: &str) -> usize {
    let exchange = format!("{prefix}.events");
    let listed = rabbitmqctl(&[
        "list_bindings",
        "--no-table-headers",
        "source_name",
        "destination_name",
    ])
    .await;
    listed
        .lines()
        .filter(|line| line.split_whitespace().next() == Some(exchange.as_str()))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_binds_one_queue_however_many_subscribe() {
    let options = options();
    let prefix = options.prefix.clone();
    let notices = match RabbitNotices::connect(&url(), options).await {
        Ok(notices) => Isolated(notices),
        Err(e) => unreachable(e),
    };
    let fanout = Fanout::new(notices.0.clone());
    let mut locals = Vec::new();
    for _ in 0..5 {
        locals.push(fanout.subscribe().await.expect("subscribing"));
    }
    assert_eq!(
        event_bindings(&prefix).await,
        1,
        "one queue for five subscribers"
    );
    let direct = notices.0.subscribe().await.expect("subscribing directly");
    assert_eq!(
        event_bindings(&prefix).await,
        2,
        "without the fan-out, a subscriber declares its own"
    );
    drop(direct);
    let tenant = unique("tenant");
    let event = job_event(&tenant, "succeeded");
    assert_eq!(fanout.publish(&event).await, Ok(()));
    for local in &mut locals {
        loop {
            match timeout(ARRIVAL, local.next()).await {
                Ok(Some(got)) if got.tenant == tenant => {
                    assert_eq!(got, event);
                    break;
                }
                Ok(Some(_)) => {}
                other => panic!("a local subscriber heard nothing: {:?}", other.ok()),
            }
        }
    }
    drop(fanout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_carries_on_after_a_reconnect() {
    let notices = notices().await;
    let fanout = Fanout::new(notices.0.clone());
    let mut subscription = fanout.subscribe().await.expect("subscribing");
    notices.0.force_reconnect().await;
    let tenant = unique("tenant");
    let event = job_event(&tenant, "succeeded");
    // Events published while the subscription rebinds are missed, so keep
    // publishing until one arrives.
    let deadline = Instant::now() + ARRIVAL * 2;
    loop {
        let _ = fanout.publish(&event).await;
        if let Ok(Some(got)) = timeout(Duration::from_millis(100), subscription.next()).await {
            assert_eq!(got, event);
            break;
        }
        assert!(Instant::now() < deadline, "no event after the reconnect");
    }
    drop(fanout);
}

/// A subscription asking only for some states hears those, whatever dots
/// the tenant and tool names hold, and nothing else reaches it: RabbitMQ
/// does not route the rest to its queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_for_some_states_hears_only_those() {
    let notices = notices().await;
    let settled = notices.0.clone().only_states(&[
        toolfleet_broker::EventState::parse("succeeded").expect("a state"),
        toolfleet_broker::EventState::parse("cancelled").expect("a state"),
    ]);
    let mut some = settled
        .subscribe()
        .await
        .expect("subscribing to some states");
    let mut every = notices
        .0
        .subscribe()
        .await
        .expect("subscribing to every state");
    let tenant = format!("{}.eu", unique("tenant"));
    let event = |id: &str, state: &str| Event {
        kind: toolfleet_broker::EventKind::Job,
        id: id.to_owned(),
        tenant: tenant.clone(),
        tool: "receipt.ocr.v2".to_owned(),
        state: toolfleet_broker::EventState::parse(state).expect("a state"),
        run_id: "run-1".to_owned(),
        body: serde_json::json!({"state": state}).into(),
        callback: false,
        life: 0,
        ..Default::default()
    };
    let sent = [
        event("job-a", "queued"),
        event("job-a", "running"),
        event("job-a", "succeeded"),
        event("job-b", "retrying"),
        event("job-b", "cancelled"),
    ];
    for one in &sent {
        assert_eq!(
            notices.0.publish(one).await,
            Ok(()),
            "publishing {}",
            one.state
        );
    }
    // Everything reaches the subscription of every state, in order; by the
    // time it has, the other has been routed all it will get.
    for one in &sent {
        let got = timeout(ARRIVAL, every.next())
            .await
            .expect("an event in time");
        assert_eq!(got.as_ref(), Some(one));
    }
    let mut heard = Vec::new();
    while let Ok(Some(got)) = timeout(Duration::from_millis(300), some.next()).await {
        heard.push((got.id, got.state.as_str().to_owned()));
    }
    assert_eq!(
        heard,
        [
            ("job-a".to_owned(), "succeeded".to_owned()),
            ("job-b".to_owned(), "cancelled".to_owned())
        ]
    );
}

/// Publishes `body` to `queue` over a connection of the test's own, as
/// another program (or an older one) could, and waits for the confirm.
async fn raw_publish(connection: &Connection, queue: &str, body: &str) {
    raw_publish_all(connection, queue, &[body]).await;
}

/// Publishes each of `bodies` to `queue` as a message of its own, on one
/// channel, and waits until RabbitMQ confirmed every one.
async fn raw_publish_all(connection: &Connection, queue: &str, bodies: &[&str]) {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    let channel = connection.create_channel().await.expect("a channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let mut confirms = Vec::with_capacity(bodies.len());
    for body in bodies {
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                lapin::BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .expect("published");
        confirms.push((body, confirm));
    }
    for (body, confirm) in confirms {
        assert!(
            confirm.await.expect("confirmed").is_ack(),
            "RabbitMQ took {body}"
        );
    }
}

/// The next `count` deliveries' job ids, and the deliveries.
async fn next_deliveries(consumer: &mut dyn Consumer, count: usize, what: &str) -> Vec<Delivery> {
    let mut deliveries = Vec::new();
    for _ in 0..count {
        deliveries.push(next_delivery(consumer, what).await);
    }
    deliveries
}

fn ids_of(deliveries: &[Delivery]) -> Vec<&str> {
    deliveries.iter().map(|d| d.job_id.as_str()).collect()
}

/// Ids published while every publishing slot of a pool waits for its
/// confirm share messages: the queue holds fewer messages than ids, and
/// each id is in exactly one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_made_together_share_messages() {
    let options = options();
    let broker = broker_with(options.clone()).await;
    let pool = unique("shared");
    let ids: Vec<String> = (0..300).map(|n| format!("job-{n}")).collect();
    let published =
        futures_util::future::join_all(ids.iter().map(|id| broker.0.publish(&pool, id))).await;
    assert!(published.iter().all(Result::is_ok), "{published:?}");

    let connection = raw_connection().await;
    let queue = format!("{}.pool.{pool}", options.prefix);
    let (mut messages, mut seen) = (0, Vec::new());
    while seen.len() < ids.len() {
        let body = get_from(&connection, &queue).await;
        messages += 1;
        seen.extend(body.split('\n').map(str::to_owned));
    }
    assert!(
        messages < ids.len(),
        "{} ids took {messages} messages",
        ids.len()
    );
    seen.sort();
    let mut expected = ids;
    expected.sort();
    assert_eq!(seen, expected, "each id in exactly one message");
}

/// Ids published one after another, each awaited, close behind the pool's
/// last message share the next one (the publisher lingers); ids further
/// apart than the linger each go alone, with their trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_close_behind_the_last_message_share_the_next() {
    let options = RabbitOptions {
        publish_linger: Duration::from_millis(300),
        ..options()
    };
    let broker = broker_with(options.clone()).await;
    let pool = unique("linger");
    // The first goes at once; the next two, each awaited, come within the
    // linger of its message and go together.
    let second = tokio::spawn({
        let broker = broker.0.clone();
        let pool = pool.clone();
        async move {
            broker.publish(&pool, "job-1").await.expect("published");
            let third = tokio::spawn({
                let (broker, pool) = (broker.clone(), pool.clone());
                async move { broker.publish(&pool, "job-3").await }
            });
            broker.publish(&pool, "job-2").await.expect("published");
            third.await.expect("the third caller")
        }
    });
    assert_eq!(second.await.expect("the callers"), Ok(()));
    let connection = raw_connection().await;
    let queue = format!("{}.pool.{pool}", options.prefix);
    assert_eq!(get_from(&connection, &queue).await, "job-1");
    let together = sorted_ids_from(&connection, &queue).await;
    assert_eq!(together, ["job-2", "job-3"], "one message for both");
    // Well past the linger, an id goes alone again.
    sleep(Duration::from_millis(600)).await;
    assert_eq!(broker.0.publish(&pool, "job-4").await, Ok(()));
    assert_eq!(get_from(&connection, &queue).await, "job-4");
}

/// While a pool's queue has no consumer no job published to it can start,
/// so its publisher lingers `idle_publish_linger`: ids further apart than
/// `publish_linger` (here none) share a message. Once a worker consumes the
/// queue, the publisher counts it (within `CONSUMER_CHECK` of a publish) and
/// lingers `publish_linger` again: each id goes alone, with its trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_without_consumers_lingers_longer() {
    let idle = Duration::from_millis(300);
    let options = RabbitOptions {
        publish_linger: Duration::ZERO,
        idle_publish_linger: idle,
        ..options()
    };
    let broker = broker_with(options.clone()).await;
    let pool = unique("idle");
    let queue = format!("{}.pool.{pool}", options.prefix);
    let connection = raw_connection().await;
    // The first publish declares the queue; one after it is counted with
    // the queue there and no consumer (basic.get consumes nothing).
    publish(&broker.0, &pool, "job-0").await;
    sleep(toolfleet_broker::rabbit::CONSUMER_CHECK * 2).await;
    publish(&broker.0, &pool, "job-1").await;
    sleep(idle + toolfleet_broker::rabbit::CONSUMER_CHECK * 2).await;
    assert_eq!(get_from(&connection, &queue).await, "job-0");
    assert_eq!(get_from(&connection, &queue).await, "job-1");

    // Idle: the first goes at once; the next two, 50 ms apart, wait for
    // the idle linger and go together.
    publish(&broker.0, &pool, "job-2").await;
    let third = tokio::spawn({
        let (broker, pool) = (broker.0.clone(), pool.clone());
        async move { broker.publish(&pool, "job-3").await }
    });
    sleep(Duration::from_millis(50)).await;
    publish(&broker.0, &pool, "job-4").await;
    assert_eq!(third.await.expect("the third caller"), Ok(()));
    assert_eq!(get_from(&connection, &queue).await, "job-2");
    let together = sorted_ids_from(&connection, &queue).await;
    assert_eq!(together, ["job-3", "job-4"], "one message while idle");

    // A consumer: counted after the next publish, the pool lingers no more.
    let mut consumer = consume(&broker.0, &pool, 10).await;
    publish(&broker.0, &pool, "job-5").await;
    sleep(idle + toolfleet_broker::rabbit::CONSUMER_CHECK * 2).await;
    let fifth = next_delivery(consumer.as_mut(), "job-5").await;
    assert_eq!(fifth.job_id, "job-5");
    assert_eq!(fifth.ack().await, Ok(()));
    let trace = TraceContext::new_root();
    let traced = |id: &'static str| {
        let (broker, pool, trace) = (broker.0.clone(), pool.clone(), trace.clone());
        async move { broker.publish_traced(&pool, id, Some(&trace)).await }
    };
    assert_eq!(traced("job-6").await, Ok(()));
    let seventh = tokio::spawn(traced("job-7"));
    sleep(Duration::from_millis(50)).await;
    assert_eq!(traced("job-8").await, Ok(()));
    assert_eq!(seventh.await.expect("the seventh caller"), Ok(()));
    let alone = next_deliveries(consumer.as_mut(), 3, "jobs 6 to 8").await;
    let mut ids = ids_of(&alone);
    ids.sort_unstable();
    assert_eq!(ids, ["job-6", "job-7", "job-8"]);
    assert!(
        alone.iter().all(|d| d.trace.as_ref() == Some(&trace)),
        "each went alone, with its trace"
    );
}

/// A message of several ids is handed out one delivery per id, and settled
/// as a whole once each is: acknowledged when all are, requeued (all of it)
/// when one was requeued or dropped, dead-lettered when one was rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_of_several_ids_is_settled_once_each_id_is() {
    let options = options();
    let broker = broker_with(options.clone()).await;
    let pool = unique("several");
    let queue = format!("{}.pool.{pool}", options.prefix);
    let dead = format!("{}.dead.{pool}", options.prefix);
    publish(&broker.0, &pool, "first").await;
    // A prefetch of one message: the ids of one come all the same.
    let mut consumer = consume(&broker.0, &pool, 1).await;
    let first = next_delivery(consumer.as_mut(), "the first").await;
    assert_eq!(first.ack().await, Ok(()));
    let connection = raw_connection().await;
    raw_publish(&connection, &queue, "id-1\nid-2\nid-3").await;

    let parts = next_deliveries(consumer.as_mut(), 3, "the ids of one message").await;
    assert_eq!(ids_of(&parts), ["id-1", "id-2", "id-3"]);
    assert!(parts.iter().all(|d| !d.redelivered && d.trace.is_none()));
    let mut parts = parts.into_iter();
    let (a, b, c) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    assert_eq!(b.requeue().await, Ok(()));
    assert_eq!(a.ack().await, Ok(()));
    assert_eq!(c.ack().await, Ok(()));

    let again = next_deliveries(consumer.as_mut(), 3, "after one was requeued").await;
    assert_eq!(ids_of(&again), ["id-1", "id-2", "id-3"]);
    assert!(again.iter().all(|d| d.redelivered));
    let mut again = again.into_iter();
    drop(again.next());
    for delivery in again {
        assert_eq!(delivery.ack().await, Ok(()));
    }

    let third = next_deliveries(consumer.as_mut(), 3, "after one was dropped").await;
    assert_eq!(ids_of(&third), ["id-1", "id-2", "id-3"]);
    let mut third = third.into_iter();
    let (a, b, c) = (
        third.next().unwrap(),
        third.next().unwrap(),
        third.next().unwrap(),
    );
    assert_eq!(c.reject().await, Ok(()));
    assert_eq!(a.ack().await, Ok(()));
    assert_nothing_delivered(consumer.as_mut(), "while one id is unsettled").await;
    assert_eq!(b.ack().await, Ok(()));
    assert_eq!(get_from(&connection, &dead).await, "id-1\nid-2\nid-3");

    raw_publish(&connection, &queue, "id-4\nid-5").await;
    for delivery in next_deliveries(consumer.as_mut(), 2, "the ids of another").await {
        assert_eq!(delivery.ack().await, Ok(()));
    }
    assert_nothing_delivered(consumer.as_mut(), "once every id was acknowledged").await;
    assert_eq!(broker.0.depth(&pool).await, Ok(0));
}

/// A consumer whose prefetch grew takes from two consumers of the queue on
/// one channel, whose deliveries may reach it out of their tags' order:
/// acknowledged as they come, each on its own task, each is acknowledged
/// once (an ack naming a tag twice would close the channel, and what it
/// held would come again, redelivered), and none stays behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grown_prefetch_acknowledges_each_delivery_once() {
    let options = options();
    let broker = broker_with(options.clone()).await;
    let pool = unique("grown");
    let queue = format!("{}.pool.{pool}", options.prefix);
    broker.0.publish(&pool, "job-first").await.unwrap();
    // A message each, published at once.
    let ids: Vec<String> = (0..3000).map(|n| format!("job-{n}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    raw_publish_all(&raw_connection().await, &queue, &ids).await;
    let ids: Vec<&str> = std::iter::once("job-first").chain(ids).collect();
    let mut consumer = consume(&broker.0, &pool, 4).await;
    let held = next_deliveries(consumer.as_mut(), 4, "under prefetch 4").await;
    consumer.set_prefetch(400);
    let mut acks = tokio::task::JoinSet::new();
    let mut seen = std::collections::HashSet::new();
    for delivery in held {
        seen.insert(delivery.job_id.clone());
        acks.spawn(delivery.ack());
    }
    while seen.len() < ids.len() {
        let delivery = next_delivery(consumer.as_mut(), "the rest").await;
        assert!(!delivery.redelivered, "{} came again", delivery.job_id);
        assert!(
            seen.insert(delivery.job_id.clone()),
            "{} twice",
            delivery.job_id
        );
        acks.spawn(delivery.ack());
    }
    while let Some(ack) = acks.join_next().await {
        assert_eq!(ack.expect("an ack's task"), Ok(()));
    }
    assert_nothing_delivered(consumer.as_mut(), "once every one was acknowledged").await;
    drop(consumer);
    let mut after = consume(&broker.0, &pool, 10).await;
    assert_nothing_delivered(after.as_mut(), "a new consumer: nothing came back").await;
    assert_eq!(broker.0.depth(&pool).await, Ok(0));
}

/// A pool of long jobs (and every pool with `jobs_per_message` 1) has each
/// job published alone, however many are published together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_of_one_job_per_message_publish_each_alone() {
    for (grouped, alone) in [(64, true), (1, false)] {
        let pool = unique("alone");
        let options = RabbitOptions {
            jobs_per_message: grouped,
            one_job_per_message: if alone {
                std::collections::BTreeSet::from([pool.clone()])
            } else {
                std::collections::BTreeSet::new()
            },
            ..options()
        };
        let broker = broker_with(options.clone()).await;
        let ids: Vec<String> = (0..50).map(|n| format!("job-{n}")).collect();
        let published =
            futures_util::future::join_all(ids.iter().map(|id| broker.0.publish(&pool, id))).await;
        assert!(published.iter().all(Result::is_ok), "{published:?}");
        let connection = raw_connection().await;
        let queue = format!("{}.pool.{pool}", options.prefix);
        for _ in &ids {
            let body = get_from(&connection, &queue).await;
            assert!(!body.contains('\n'), "one id per message: {body:?}");
        }
        assert_eq!(broker.0.depth(&pool).await, Ok(0));
    }
}

/// The ids of a message not yet handed out when its channel closes are
/// not handed out: the message is back in its queue and comes again whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_of_a_message_goes_back_with_it_when_its_channel_closes() {
    let options = options();
    let broker = broker_with(options.clone()).await;
    let pool = unique("stale-parts");
    publish(&broker.0, &pool, "first").await;
    let mut consumer = consume(&broker.0, &pool, 1).await;
    let first = next_delivery(consumer.as_mut(), "the first").await;
    assert_eq!(first.ack().await, Ok(()));
    let connection = raw_connection().await;
    let queue = format!("{}.pool.{pool}", options.prefix);
    raw_publish(&connection, &queue, "id-1\nid-2\nid-3").await;
    let held = next_delivery(consumer.as_mut(), "the first id").await;
    assert_eq!(held.job_id, "id-1");
    broker.0.force_reconnect().await;
    // Once the broker takes a publish again, the old connection is gone
    // and its channel with it.
    publish_eventually(&broker.0, &unique("marker"), "marker").await;
    drop(held);
    let again = next_deliveries(consumer.as_mut(), 3, "after the reconnect").await;
    assert_eq!(ids_of(&again), ["id-1", "id-2", "id-3"]);
    assert!(again.iter().all(|d| d.redelivered), "the message came back");
    for delivery in again {
        assert_eq!(delivery.ack().await, Ok(()));
    }
}

/// Acks go in groups (see the consumer's `AckGroup`), yet each reaches
/// RabbitMQ: deliveries settled out of order, one requeued among them,
/// leave only the requeued one to come again, and nothing once it is
/// acknowledged too, even after the consumer is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_settled_out_of_order_all_reach_the_queue() {
    let broker = broker().await;
    let pool = unique("grouped-acks");
    let ids: Vec<String> = (1..=8).map(|n| format!("job-{n}")).collect();
    for id in &ids {
        publish(&broker.0, &pool, id).await;
    }
    let mut consumer = consume(&broker.0, &pool, 8).await;
    let deliveries = next_deliveries(consumer.as_mut(), 8, "the first eight").await;
    let mut deliveries: Vec<Option<Delivery>> = deliveries.into_iter().map(Some).collect();
    let mut take = |n: usize| deliveries[n - 1].take().expect("not settled yet");
    let back = take(4);
    let back_id = back.job_id.clone();
    assert_eq!(back.requeue().await, Ok(()));
    // Above the oldest unsettled (1), each goes alone; then 2 and 3, and
    // 1 last, which lets the acks below 4 go as one.
    for n in [8, 7, 6, 5, 2, 3, 1] {
        assert_eq!(take(n).ack().await, Ok(()), "acking the {n}th");
    }
    let again = next_delivery(consumer.as_mut(), "the requeued one").await;
    assert_eq!(again.job_id, back_id);
    assert!(again.redelivered);
    assert_eq!(again.ack().await, Ok(()));
    assert_nothing_delivered(consumer.as_mut(), "once each was acknowledged").await;
    drop(consumer);
    // Nothing came back when the channel closed: every ack had reached it.
    sleep(QUIET).await;
    assert_eq!(broker.0.depth(&pool).await, Ok(0));
}

/// A delivery still running holds back no ack of the ones after it: their
/// places under the prefetch free at once, and the next message comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsettled_delivery_holds_back_no_later_ack() {
    let broker = broker().await;
    let pool = unique("acks-not-held");
    for id in ["job-a", "job-b", "job-c"] {
        publish(&broker.0, &pool, id).await;
    }
    let mut consumer = consume(&broker.0, &pool, 2).await;
    let first = next_delivery(consumer.as_mut(), "the first").await;
    let second = next_delivery(consumer.as_mut(), "the second").await;
    assert_eq!(second.ack().await, Ok(()));
    let third = next_delivery(consumer.as_mut(), "the third, in the second's place").await;
    assert_eq!(third.job_id, "job-c");
    assert_eq!(third.ack().await, Ok(()));
    assert_eq!(first.ack().await, Ok(()));
    assert_nothing_delivered(consumer.as_mut(), "once all were acknowledged").await;
    drop(consumer);
    sleep(QUIET).await;
    assert_eq!(broker.0.depth(&pool).await, Ok(0));
}

/// Events nobody listens for are not sent: RabbitMQ returns the first of
/// a key no binding takes, and the publisher holds that key's events back.
/// A subscription, once bound, tells every process it listens: the one
/// that subscribes at once, another as soon as it hears the notice (not
/// because its hold ran out: here it never would), and both send again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_nobody_listens_for_wait_for_a_listener_to_say_so() {
    let options = RabbitOptions {
        unheard_for: Duration::from_secs(3600),
        ..options()
    };
    let prefix = options.prefix.clone();
    let publisher = match RabbitNotices::connect(&url(), options).await {
        Ok(notices) => Isolated(notices),
        Err(e) => unreachable(e),
    };
    // The publisher hears outcomes alone, as a worker does.
    let _outcomes = publisher
        .0
        .clone()
        .only_states(&SETTLED_STATES)
        .subscribe()
        .await
        .expect("subscribing to outcomes");
    let tenant = unique("tenant");
    let event = |id: &str, state: &str| Event {
        id: id.to_owned(),
        ..job_event(&tenant, state)
    };
    let queued = event("job-a", "queued");
    let key = queued.routing_key();
    assert_eq!(publisher.0.publish(&queued).await, Ok(()));
    assert!(
        !publisher.0.hears(&key),
        "nobody listens for `queued`: its events are held back"
    );
    // Asked through the wrappers a process puts around its notices.
    let fanned = Fanout::new(publisher.0.clone());
    let split = Split::new(
        Arc::new(Fanout::new(publisher.0.clone())),
        Arc::new(Fanout::new(
            publisher.0.clone().only_states(&SETTLED_STATES),
        )),
    );
    let tee = toolfleet_broker::tee::Tee::new(publisher.0.clone(), publisher.0.clone());
    assert_eq!(
        [fanned.hears(&key), split.hears(&key), tee.hears(&key)],
        [false; 3],
        "whoever asks is told"
    );
    let succeeded = event("job-a", "succeeded");
    assert_eq!(publisher.0.publish(&succeeded).await, Ok(()));
    assert!(
        publisher.0.hears(&succeeded.routing_key()),
        "outcomes are heard"
    );

    // Another process subscribes to every event.
    let listener = RabbitNotices::connect(
        &url(),
        RabbitOptions {
            prefix,
            ..RabbitOptions::default()
        },
    )
    .await
    .unwrap_or_else(|e| unreachable(e));
    let mut every = listener
        .subscribe()
        .await
        .expect("subscribing to every event");
    let deadline = Instant::now() + ARRIVAL;
    while !publisher.0.hears(&key) {
        assert!(
            Instant::now() < deadline,
            "the publisher never heard of the listener"
        );
        sleep(Duration::from_millis(10)).await;
    }
    let next = event("job-b", "queued");
    assert_eq!(
        publisher.0.publish_all(std::slice::from_ref(&next)).await,
        Ok(())
    );
    let got = timeout(ARRIVAL, every.next())
        .await
        .expect("an event in time");
    assert_eq!(got.as_ref(), Some(&next));
    drop(every);
    drop(listener);

    // Held back again once the listener is gone; the publisher's own
    // subscription to every event sends them at once.
    // The listener's queue goes with its connection, a moment later.
    let third = event("job-c", "running");
    let key = third.routing_key();
    let deadline = Instant::now() + ARRIVAL;
    while publisher.0.hears(&key) {
        assert!(Instant::now() < deadline, "`running` is still routed");
        assert_eq!(publisher.0.publish(&third).await, Ok(()));
    }
    let mut own = publisher
        .0
        .subscribe()
        .await
        .expect("subscribing to every event");
    assert!(publisher.0.hears(&key), "its own subscriber listens");
    assert_eq!(publisher.0.publish(&third).await, Ok(()));
    let got = timeout(ARRIVAL, own.next())
        .await
        .expect("an event in time");
    assert_eq!(got.as_ref(), Some(&third));
}
