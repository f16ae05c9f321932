//! The in-process broker and notices: the shared conformance suites, then
//! what only the in-process implementations promise (their bound, their
//! dead-letter list, where a requeued message goes, and what closing means),
//! and what the fan-out promises over any notices (one shared subscription,
//! made again when it ends).

use std::sync::OnceLock;
use std::time::Duration;

use toolfleet_broker::conformance::{
    ARRIVAL, QUIET, assert_nothing_delivered, next_delivery, unique,
};
use toolfleet_broker::fanout::{Fanout, FanoutOptions};
use toolfleet_broker::memory::{MemoryBroker, MemoryNotices};
use toolfleet_broker::{Broker, BrokerError, Consumer, Event, Notices, Subscription};

toolfleet_broker::broker_conformance!(async { MemoryBroker::new() });

/// One broker for every test of this suite, as a deployment would share one.
static SHARED: OnceLock<MemoryBroker> = OnceLock::new();

toolfleet_broker::broker_conformance!(mod broker_conformance_shared, async {
    SHARED.get_or_init(MemoryBroker::new).clone()
});

toolfleet_broker::notices_conformance!(async { MemoryNotices::new() });

// A buffer smaller than the lag test's burst, so that subscriber really lags.
toolfleet_broker::notices_conformance!(mod notices_conformance_small_buffer, async {
    MemoryNotices::with_capacity(8)
});

toolfleet_broker::notices_conformance!(mod fanout_conformance, async {
    Fanout::new(MemoryNotices::new())
});

// A ring smaller than the lag test's burst in front of a deep one.
toolfleet_broker::notices_conformance!(mod fanout_conformance_small_buffer, async {
    Fanout::with_options(
        MemoryNotices::new(),
        FanoutOptions {
            buffer: 8,
            ..FanoutOptions::default()
        },
    )
});

async fn consume(broker: &MemoryBroker, pool: &str, prefetch: u16) -> Box<dyn Consumer> {
    match broker.consume(pool, prefetch).await {
        Ok(consumer) => consumer,
        Err(e) => panic!("consuming {pool}: {e}"),
    }
}

#[tokio::test]
async fn capacity_bound_answers_full() {
    let broker = MemoryBroker::with_capacity(2);
    let pool = unique("bound");
    assert_eq!(broker.publish(&pool, "job-0").await, Ok(()));
    assert_eq!(broker.publish(&pool, "job-1").await, Ok(()));
    let refused = broker.publish(&pool, "job-2").await;
    assert!(matches!(refused, Err(BrokerError::Full(_))), "{refused:?}");
    assert!(matches!(
        broker.publish_delayed(&pool, "job-2", QUIET).await,
        Err(BrokerError::Full(_))
    ));
    assert_eq!(
        broker.publish(&unique("other"), "job-2").await,
        Ok(()),
        "the bound is per pool"
    );

    let mut consumer = consume(&broker, &pool, 1).await;
    let taken = next_delivery(consumer.as_mut(), "frees a place").await;
    assert_eq!(
        broker.publish(&pool, "job-2").await,
        Ok(()),
        "a delivered message is not ready"
    );
    assert_eq!(
        taken.requeue().await,
        Ok(()),
        "a requeue is never refused for the bound"
    );
    assert_eq!(broker.depth(&pool).await, Ok(3));
}

#[tokio::test]
async fn delayed_messages_hold_a_place_under_the_bound() {
    let broker = MemoryBroker::with_capacity(1);
    let pool = unique("bound-delayed");
    assert_eq!(
        broker.publish_delayed(&pool, "job-later", QUIET).await,
        Ok(())
    );
    assert!(matches!(
        broker.publish(&pool, "job-now").await,
        Err(BrokerError::Full(_))
    ));
    let mut consumer = consume(&broker, &pool, 1).await;
    let arrived = next_delivery(consumer.as_mut(), "delayed").await;
    assert_eq!(arrived.job_id, "job-later");
    assert_eq!(arrived.ack().await, Ok(()));
    assert_eq!(
        broker.publish(&pool, "job-now").await,
        Ok(()),
        "the place is free again"
    );
}

#[tokio::test]
async fn rejected_message_goes_to_dead_letters() {
    let broker = MemoryBroker::new();
    let pool = unique("dead");
    assert_eq!(broker.publish(&pool, "not-a-job").await, Ok(()));
    let mut consumer = consume(&broker, &pool, 1).await;
    let bad = next_delivery(consumer.as_mut(), "to reject").await;
    assert_eq!(bad.reject().await, Ok(()));
    assert_eq!(broker.dead_letters(&pool), vec!["not-a-job".to_owned()]);
    assert!(broker.dead_letters(&unique("other")).is_empty());
    assert_eq!(broker.depth(&pool).await, Ok(0));
}

#[tokio::test]
async fn requeue_puts_the_message_at_the_front() {
    let broker = MemoryBroker::new();
    let pool = unique("front");
    for id in ["job-a", "job-b"] {
        assert_eq!(broker.publish(&pool, id).await, Ok(()));
    }
    let mut first = consume(&broker, &pool, 1).await;
    let delivery = next_delivery(first.as_mut(), "before requeue").await;
    assert_eq!(delivery.job_id, "job-a");
    assert_eq!(delivery.requeue().await, Ok(()));
    let mut other = consume(&broker, &pool, 1).await;
    let again = next_delivery(other.as_mut(), "after requeue").await;
    assert_eq!(
        again.job_id, "job-a",
        "a requeued message goes ahead of job-b"
    );
    assert!(again.redelivered);
}

#[tokio::test]
async fn dropped_delivery_returns_to_the_queue() {
    let broker = MemoryBroker::new();
    let pool = unique("dropped-delivery");
    assert_eq!(broker.publish(&pool, "job-a").await, Ok(()));
    let mut consumer = consume(&broker, &pool, 1).await;
    drop(next_delivery(consumer.as_mut(), "to drop").await);
    let again = next_delivery(consumer.as_mut(), "after drop").await;
    assert_eq!(again.job_id, "job-a");
    assert!(
        again.redelivered,
        "a dropped delivery comes back redelivered"
    );
}

#[tokio::test]
async fn settling_after_the_consumer_dropped_answers_closed() {
    let broker = MemoryBroker::new();
    let pool = unique("late-ack");
    assert_eq!(broker.publish(&pool, "job-a").await, Ok(()));
    let mut consumer = consume(&broker, &pool, 1).await;
    let delivery = next_delivery(consumer.as_mut(), "held").await;
    drop(consumer);
    assert_eq!(
        broker.depth(&pool).await,
        Ok(1),
        "given back when the consumer dropped"
    );
    assert_eq!(delivery.ack().await, Err(BrokerError::Closed));
    assert_eq!(
        broker.depth(&pool).await,
        Ok(1),
        "a late ack does not take it again"
    );
}

#[tokio::test]
async fn zero_prefetch_holds_one() {
    let broker = MemoryBroker::new();
    let pool = unique("zero-prefetch");
    for id in ["job-a", "job-b"] {
        assert_eq!(broker.publish(&pool, id).await, Ok(()));
    }
    let mut consumer = consume(&broker, &pool, 0).await;
    let held = next_delivery(consumer.as_mut(), "first").await;
    assert_nothing_delivered(consumer.as_mut(), "beyond one").await;
    assert_eq!(held.ack().await, Ok(()));
    next_delivery(consumer.as_mut(), "after ack").await;
}

#[tokio::test(start_paused = true)]
async fn publish_delayed_holds_no_one_for_its_delay() {
    let broker = MemoryBroker::new();
    let pool = unique("long-delay");
    let hour = Duration::from_secs(3600);
    let started = tokio::time::Instant::now();
    assert_eq!(
        broker.publish_delayed(&pool, "job-later", hour).await,
        Ok(())
    );
    assert!(
        started.elapsed() < hour,
        "publish_delayed waited out its delay"
    );
    let mut consumer = consume(&broker, &pool, 1).await;
    let early = tokio::time::timeout(hour - Duration::from_secs(1), consumer.next()).await;
    assert!(early.is_err(), "delivered before its delay");
    let due = next_delivery(consumer.as_mut(), "when due").await;
    assert_eq!(due.job_id, "job-later");
    assert!(started.elapsed() >= hour);
}

#[tokio::test]
async fn close_ends_consumers_and_refuses_work() {
    let broker = MemoryBroker::new();
    let pool = unique("close");
    let mut consumer = consume(&broker, &pool, 1).await;
    let waiting = tokio::spawn(async move { consumer.next().await.map(|d| d.job_id.clone()) });
    tokio::time::sleep(QUIET).await;
    broker.close();
    let ended = tokio::time::timeout(ARRIVAL, waiting).await;
    assert!(
        matches!(ended, Ok(Ok(None))),
        "a waiting consumer ends on close: {ended:?}"
    );
    assert_eq!(
        broker.publish(&pool, "job-a").await,
        Err(BrokerError::Closed)
    );
    assert_eq!(broker.ping().await, Err(BrokerError::Closed));
    assert!(broker.consume(&pool, 1).await.is_err());
}

#[tokio::test]
async fn dropping_the_last_clone_ends_consumers() {
    let broker = MemoryBroker::new();
    let pool = unique("drop");
    let clone = broker.clone();
    let mut consumer = consume(&broker, &pool, 1).await;
    drop(broker);
    assert_eq!(
        clone.publish(&pool, "job-a").await,
        Ok(()),
        "a clone keeps it open"
    );
    let delivery = next_delivery(consumer.as_mut(), "through the clone").await;
    assert_eq!(delivery.ack().await, Ok(()));
    drop(clone);
    let ended = tokio::time::timeout(ARRIVAL, consumer.next()).await;
    assert!(
        matches!(ended, Ok(None)),
        "consumer ends when the last clone drops"
    );
}

#[tokio::test]
async fn dropping_notices_ends_subscriptions() {
    let notices = MemoryNotices::new();
    let mut subscription = match notices.subscribe().await {
        Ok(subscription) => subscription,
        Err(e) => panic!("subscribing: {e}"),
    };
    drop(notices);
    let ended = tokio::time::timeout(ARRIVAL, subscription.next()).await;
    assert!(matches!(ended, Ok(None)), "{ended:?}");
}

/// Where every subscriber waits for outcomes, a job's other events are
/// not heard (so the announcer does not make them) and do not reach them;
/// with nobody subscribed nothing is heard; a subscriber to everything
/// hears everything.
#[tokio::test]
async fn notices_hear_only_what_their_subscribers_wait_for() {
    let notices = MemoryNotices::new();
    let event = |state: &str| toolfleet_broker::Event {
        kind: toolfleet_broker::EventKind::Job,
        id: format!("job-{state}"),
        tenant: "acme".to_owned(),
        tool: "receipt_ocr".to_owned(),
        state: toolfleet_broker::EventState::parse(state).expect("a state"),
        ..Default::default()
    };
    let (running, succeeded) = (event("running"), event("succeeded"));
    assert!(!notices.hears(&running.routing_key()));
    assert!(!notices.hears(&succeeded.routing_key()));

    let mut outcomes = notices.subscribe_settled().await.expect("subscribed");
    assert!(
        !notices.hears(&running.routing_key()),
        "nobody waits for it"
    );
    assert!(notices.hears(&succeeded.routing_key()));
    notices.publish(&running).await.expect("published");
    notices.publish(&succeeded).await.expect("published");
    let got = tokio::time::timeout(ARRIVAL, outcomes.next()).await;
    assert_eq!(got.ok().flatten().map(|e| e.id), Some(succeeded.id.clone()));

    let mut every = notices.subscribe().await.expect("subscribed");
    assert!(notices.hears(&running.routing_key()));
    notices.publish(&running).await.expect("published");
    notices.publish(&succeeded).await.expect("published");
    for expected in [&running, &succeeded] {
        let got = tokio::time::timeout(ARRIVAL, every.next()).await;
        assert_eq!(got.ok().flatten().map(|e| e.id), Some(expected.id.clone()));
    }
    let got = tokio::time::timeout(ARRIVAL, outcomes.next()).await;
    assert_eq!(got.ok().flatten().map(|e| e.id), Some(succeeded.id.clone()));
}

#[tokio::test]
async fn notices_take_any_buffer_and_need_no_subscriber() {
    for buffer in [0, usize::MAX] {
        let notices = MemoryNotices::with_capacity(buffer);
        let event = toolfleet_broker::Event {
            kind: toolfleet_broker::EventKind::Job,
            id: "job-a".to_owned(),
            tenant: "acme".to_owned(),
            tool: "receipt_ocr".to_owned(),
            state: toolfleet_broker::EventState::parse("succeeded").expect("a state"),
            run_id: "run-1".to_owned(),
            body: serde_json::json!({}).into(),
            callback: false,
            life: 0,
            ..Default::default()
        };
        assert_eq!(notices.publish(&event).await, Ok(()), "buffer {buffer}");
    }
}

/// Notices over [`MemoryNotices`] that count their subscriptions, can end
/// them all at once, and can refuse new ones, to show what [`Fanout`] does
/// with the notices it wraps.
#[derive(Clone)]
struct Flaky {
    inner: MemoryNotices,
    state: std::sync::Arc<FlakyState>,
}

struct FlakyState {
    subscribed: std::sync::atomic::AtomicUsize,
    refuse: std::sync::atomic::AtomicBool,
    cut: tokio::sync::watch::Sender<u64>,
}

impl Flaky {
    fn new() -> Flaky {
        Flaky {
            inner: MemoryNotices::new(),
            state: std::sync::Arc::new(FlakyState {
                subscribed: 0.into(),
                refuse: false.into(),
                cut: tokio::sync::watch::Sender::new(0),
            }),
        }
    }

    fn subscribed(&self) -> usize {
        self.state
            .subscribed
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    fn refuse(&self, refuse: bool) {
        self.state
            .refuse
            .store(refuse, std::sync::atomic::Ordering::SeqCst);
    }

    /// Ends every subscription made so far.
    fn cut(&self) {
        self.state.cut.send_modify(|n| *n += 1);
    }
}

#[async_trait::async_trait]
impl Notices for Flaky {
    async fn publish(&self, event: &Event) -> Result<(), BrokerError> {
        self.inner.publish(event).await
    }

    async fn subscribe(&self) -> Result<Box<dyn Subscription>, BrokerError> {
        if self.state.refuse.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(BrokerError::Unavailable("refusing, for the test".into()));
        }
        let mut cut = self.state.cut.subscribe();
        cut.mark_unchanged();
        let inner = self.inner.subscribe().await?;
        self.state
            .subscribed
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(Box::new(FlakySubscription { inner, cut }))
    }
}

struct FlakySubscription {
    inner: Box<dyn Subscription>,
    cut: tokio::sync::watch::Receiver<u64>,
}

#[async_trait::async_trait]
impl Subscription for FlakySubscription {
    async fn next(&mut self) -> Option<Event> {
        tokio::select! {
            biased;
            _ = self.cut.changed() => None,
            event = self.inner.next() => event,
        }
    }
}

fn event(tenant: &str, id: &str) -> Event {
    Event {
        kind: toolfleet_broker::EventKind::Job,
        id: id.to_owned(),
        tenant: tenant.to_owned(),
        tool: "receipt_ocr".to_owned(),
        state: toolfleet_broker::EventState::parse("succeeded").expect("a state"),
        run_id: "run-1".to_owned(),
        body: serde_json::json!({}).into(),
        callback: false,
        life: 0,
        ..Default::default()
    }
}

async fn subscribe(notices: &dyn Notices) -> Box<dyn Subscription> {
    match tokio::time::timeout(ARRIVAL, notices.subscribe()).await {
        Ok(Ok(subscription)) => subscription,
        Ok(Err(e)) => panic!("subscribing: {e}"),
        Err(_) => panic!("subscribing: no answer within {ARRIVAL:?}"),
    }
}

async fn next_event(subscription: &mut dyn Subscription, what: &str) -> Event {
    match tokio::time::timeout(ARRIVAL, subscription.next()).await {
        Ok(Some(event)) => event,
        Ok(None) => panic!("{what}: the subscription ended"),
        Err(_) => panic!("{what}: nothing within {ARRIVAL:?}"),
    }
}

#[tokio::test]
async fn fanout_shares_one_subscription_among_local_subscribers() {
    let flaky = Flaky::new();
    let fanout = Fanout::new(flaky.clone());
    assert_eq!(flaky.subscribed(), 0, "nothing is subscribed before asked");
    assert!(!fanout.is_subscribed().await);
    let mut locals = Vec::new();
    for _ in 0..5 {
        locals.push(subscribe(&fanout).await);
    }
    assert_eq!(
        flaky.subscribed(),
        1,
        "one subscription for five subscribers"
    );
    assert!(fanout.is_subscribed().await);
    let sent = event("acme", "job-a");
    assert_eq!(fanout.publish(&sent).await, Ok(()));
    for local in &mut locals {
        assert_eq!(
            next_event(local.as_mut(), "each local subscriber").await,
            sent
        );
    }
}

#[tokio::test]
async fn fanout_subscribes_again_when_its_subscription_ends() {
    let flaky = Flaky::new();
    let fanout = Fanout::with_options(
        flaky.clone(),
        FanoutOptions {
            retry_min: Duration::from_millis(5),
            retry_max: Duration::from_millis(20),
            ..FanoutOptions::default()
        },
    );
    let mut local = subscribe(&fanout).await;
    // The first attempt to subscribe again fails; a later one succeeds.
    flaky.refuse(true);
    flaky.cut();
    tokio::time::sleep(QUIET).await;
    flaky.refuse(false);
    let deadline = tokio::time::Instant::now() + ARRIVAL;
    let sent = event("acme", "job-after");
    loop {
        assert_eq!(fanout.publish(&sent).await, Ok(()));
        if let Ok(Some(got)) = tokio::time::timeout(Duration::from_millis(20), local.next()).await {
            assert_eq!(got, sent, "the same local subscription carries on");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing after the shared subscription ended"
        );
    }
    assert_eq!(flaky.subscribed(), 2, "made again once");
    // A new local subscriber joins the new shared subscription.
    let mut late = subscribe(&fanout).await;
    let next = event("acme", "job-next");
    assert_eq!(fanout.publish(&next).await, Ok(()));
    assert_eq!(next_event(late.as_mut(), "a late subscriber").await, next);
    assert_eq!(flaky.subscribed(), 2);
}

#[tokio::test]
async fn fanout_answers_the_wrapped_error_and_tries_again_on_the_next_subscribe() {
    let flaky = Flaky::new();
    let fanout = Fanout::new(flaky.clone());
    flaky.refuse(true);
    let refused = fanout.subscribe().await.err();
    assert!(
        matches!(refused, Some(BrokerError::Unavailable(_))),
        "{refused:?}"
    );
    flaky.refuse(false);
    let mut local = subscribe(&fanout).await;
    let sent = event("acme", "job-a");
    assert_eq!(fanout.publish(&sent).await, Ok(()));
    assert_eq!(next_event(local.as_mut(), "after a refusal").await, sent);
    assert_eq!(flaky.subscribed(), 1);
}

#[tokio::test]
async fn dropping_the_fanout_ends_local_subscriptions() {
    let fanout = Fanout::new(MemoryNotices::new());
    let mut local = subscribe(&fanout).await;
    drop(fanout);
    let ended = tokio::time::timeout(ARRIVAL, local.next()).await;
    assert!(matches!(ended, Ok(None)), "{ended:?}");
}

#[tokio::test]
async fn fanout_ends_its_subscription_once_nobody_listens_and_makes_it_again() {
    let flaky = Flaky::new();
    let linger = Duration::from_millis(200);
    let fanout = Fanout::with_options(
        flaky.clone(),
        FanoutOptions {
            linger,
            ..FanoutOptions::default()
        },
    );
    let first = subscribe(&fanout).await;
    drop(first);
    // Still subscribed while events come within the linger.
    for n in 0..3 {
        let unheard = event("acme", &format!("job-unheard-{n}"));
        assert_eq!(fanout.publish(&unheard).await, Ok(()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(fanout.is_subscribed().await, "ended within the linger");
    // Past it, the next event shows that nobody listens.
    tokio::time::sleep(linger).await;
    let deadline = tokio::time::Instant::now() + ARRIVAL;
    while fanout.is_subscribed().await {
        assert_eq!(fanout.publish(&event("acme", "job-late")).await, Ok(()));
        assert!(
            tokio::time::Instant::now() < deadline,
            "the shared subscription outlived its last subscriber"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(flaky.subscribed(), 1, "not made again meanwhile");
    let mut again = subscribe(&fanout).await;
    assert_eq!(flaky.subscribed(), 2, "made again for the next subscriber");
    let sent = event("acme", "job-b");
    assert_eq!(fanout.publish(&sent).await, Ok(()));
    assert_eq!(next_event(again.as_mut(), "after ending").await, sent);
    // A subscriber that stays keeps it: events flow, nothing is made again.
    for n in 0..3 {
        let sent = event("acme", &format!("job-{n}"));
        assert_eq!(fanout.publish(&sent).await, Ok(()));
        assert_eq!(next_event(again.as_mut(), "while listening").await, sent);
    }
    assert_eq!(flaky.subscribed(), 2);
}
