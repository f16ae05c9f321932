//! The PostgreSQL notices against a real PostgreSQL: the shared conformance
//! suite (plain, behind a [`Fanout`], and with a small ring), then what only
//! `LISTEN`/`NOTIFY` shows: events beyond the 8000-byte payload limit arrive
//! whole, the listener and the publisher come back after their backends are
//! killed, channels keep fleets apart, and closing ends everything.
//!
//! PostgreSQL is found at `TOOLFLEET_TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`). These tests never skip: if
//! the database is unreachable they fail and say so (under `CI`, that CI
//! must start it). Each test listens on a channel of its own and names its
//! connections with an `application_name` of its own, so tests run in
//! parallel and kill only their own backends. Channels leave nothing behind.

use std::time::Duration;

use serde_json::json;
use tokio::time::{Instant, sleep, timeout};
use tokio_postgres::NoTls;
use toolfleet_broker::conformance::{ARRIVAL, QUIET, unique};
use toolfleet_broker::fanout::Fanout;
use toolfleet_broker::postgres::{PgNotices, PgOptions, channel_for};
use toolfleet_broker::{BrokerError, Event, Notices, Subscription};

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

fn url() -> String {
    std::env::var("TOOLFLEET_TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

fn unreachable_database(why: &str) -> ! {
    let where_ = if std::env::var_os("CI").is_some() {
        "CI must start PostgreSQL before these tests"
    } else {
        "start PostgreSQL locally, or point TOOLFLEET_TEST_DATABASE_URL at one"
    };
    panic!(
        "the PostgreSQL notices tests need a database at {} ({why}); {where_}",
        url()
    )
}

/// A channel of this test's own.
fn channel() -> String {
    channel_for(&format!(
        "tftest_{}",
        toolfleet_core::new_id().replace('-', "")
    ))
}

/// Options naming the connections after this test alone.
fn options() -> PgOptions {
    PgOptions {
        application_name: format!("tftest-{}", toolfleet_core::new_id()),
        ..PgOptions::default()
    }
}

async fn notices_with(channel: &str, options: PgOptions) -> PgNotices {
    match PgNotices::connect_with(&url(), channel, options).await {
        Ok(notices) => notices,
        Err(e) => unreachable_database(&e.to_string()),
    }
}

async fn notices() -> PgNotices {
    notices_with(&channel(), options()).await
}

toolfleet_broker::notices_conformance!(notices());

toolfleet_broker::notices_conformance!(mod fanout_conformance, async {
    Fanout::new(notices().await)
});

// A ring smaller than the lag test's burst, so that subscriber really lags.
toolfleet_broker::notices_conformance!(mod small_buffer_conformance, async {
    notices_with(
        &channel(),
        PgOptions {
            notice_buffer: 8,
            ..options()
        },
    )
    .await
});

// Checks of the connection (LISTEN again) all the time, so events and
// subscribers also arrive while one is under way.
toolfleet_broker::notices_conformance!(mod busy_listener_conformance, async {
    notices_with(
        &channel(),
        PgOptions {
            check_interval: Duration::from_millis(2),
            ..options()
        },
    )
    .await
});

/// A plain connection of the test's own, for what the notices do not do.
async fn admin() -> tokio_postgres::Client {
    let connected = timeout(
        Duration::from_secs(10),
        tokio_postgres::connect(&url(), NoTls),
    )
    .await;
    let (client, connection) = match connected {
        Ok(Ok(pair)) => pair,
        Ok(Err(e)) => unreachable_database(&e.to_string()),
        Err(_) => unreachable_database("no answer within 10s"),
    };
    tokio::spawn(connection);
    client
}

/// Terminates the backends named `application_name` whose last statement
/// is (or, with `listening` false, is not) a `LISTEN`; how many.
async fn kill_backends(application_name: &str, listening: bool) -> usize {
    let sql = if listening {
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = $1 AND query LIKE 'LISTEN%'"
    } else {
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = $1 AND query NOT LIKE 'LISTEN%'"
    };
    let rows = admin()
        .await
        .query(sql, &[&application_name])
        .await
        .expect("terminating backends");
    rows.len()
}

/// How many sessions named `application_name` are `LISTEN`ing.
async fn listening_sessions(application_name: &str) -> i64 {
    admin()
        .await
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE application_name = $1 AND query LIKE 'LISTEN%'",
            &[&application_name],
        )
        .await
        .expect("counting sessions")
        .get(0)
}

fn event(tenant: &str, id: &str, body: serde_json::Value) -> Event {
    Event {
        kind: toolfleet_broker::EventKind::Job,
        id: id.to_owned(),
        tenant: tenant.to_owned(),
        tool: "receipt_ocr".to_owned(),
        state: toolfleet_broker::EventState::parse("succeeded").expect("a state"),
        run_id: "run-1".to_owned(),
        body: body.into(),
        callback: true,
        life: 0,
        ..Default::default()
    }
}

async fn subscribe(notices: &dyn Notices) -> Box<dyn Subscription> {
    match timeout(ARRIVAL, notices.subscribe()).await {
        Ok(Ok(subscription)) => subscription,
        other => panic!("subscribing: {other:?}", other = other.map(|r| r.err())),
    }
}

/// The next event of `tenant`, within [`ARRIVAL`].
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

/// Publishes `event` until `subscription` hears it, as a fleet's later
/// events would after a reconnect; fails after twice [`ARRIVAL`].
async fn heard_eventually(
    publisher: &dyn Notices,
    subscription: &mut dyn Subscription,
    event: &Event,
) {
    let deadline = Instant::now() + ARRIVAL * 2;
    loop {
        let _ = publisher.publish(event).await;
        if let Ok(Some(got)) = timeout(Duration::from_millis(100), subscription.next()).await
            && got.tenant == event.tenant
        {
            assert_eq!(&got, event);
            return;
        }
        assert!(Instant::now() < deadline, "no event after the reconnect");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_larger_than_a_notification_arrives_whole() {
    let channel = channel();
    // Publisher and subscriber in different "processes", as in a fleet.
    let (publisher, listener) = (
        notices_with(&channel, options()).await,
        notices_with(&channel, options()).await,
    );
    let mut subscription = subscribe(&listener).await;
    let tenant = unique("tenant");
    // Beyond ASCII too, which travels escaped.
    let text = "receipt é ☕ 𝄞 ".repeat(6_000);
    let big = event(&tenant, "job-big", json!({"status": "ok", "text": text}));
    assert!(serde_json::to_vec(&big).expect("json").len() > 8_000 * 10);
    let small = event(&tenant, "job-small", json!({"status": "ok"}));
    for sent in [&big, &small, &big] {
        assert_eq!(
            publisher.publish(sent).await,
            Ok(()),
            "publishing {}",
            sent.id
        );
    }
    for sent in [&big, &small, &big] {
        let got = next_of(subscription.as_mut(), &tenant, "a chunked event").await;
        assert_eq!(&got, sent, "arrives whole, in order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_over_the_bound_is_refused() {
    let notices = notices_with(
        &channel(),
        PgOptions {
            max_event_bytes: 20_000,
            ..options()
        },
    )
    .await;
    let tenant = unique("tenant");
    let huge = event(&tenant, "job-huge", json!({"text": "x".repeat(30_000)}));
    let refused = notices.publish(&huge).await;
    assert!(
        matches!(refused, Err(BrokerError::Unavailable(_))),
        "{refused:?}"
    );
    let mut subscription = subscribe(&notices).await;
    let fine = event(&tenant, "job-fine", json!({"text": "x".repeat(10_000)}));
    assert_eq!(notices.publish(&fine).await, Ok(()));
    assert_eq!(
        next_of(subscription.as_mut(), &tenant, "under the bound").await,
        fine
    );
}

/// A batch larger than one statement carries goes in several, in order,
/// and an event over the bound in it is refused without holding back the
/// others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_batch_arrives_in_order_without_its_oversized_event() {
    let notices = notices_with(
        &channel(),
        PgOptions {
            max_event_bytes: 700_000,
            ..options()
        },
    )
    .await;
    let mut subscription = subscribe(&notices).await;
    let tenant = unique("tenant");
    let sized = |n: usize, bytes: usize| {
        event(
            &tenant,
            &format!("job-{n}"),
            json!({"text": "b".repeat(bytes)}),
        )
    };
    let batch = vec![
        sized(0, 10),
        sized(1, 600_000),
        sized(2, 800_000),
        sized(3, 600_000),
        sized(4, 10),
    ];
    let answer = timeout(ARRIVAL, notices.publish_all(&batch)).await;
    assert!(
        matches!(answer, Ok(Err(BrokerError::Unavailable(ref why))) if why.contains("job-2")),
        "{answer:?}"
    );
    for expected in [&batch[0], &batch[1], &batch[3], &batch[4]] {
        let got = next_of(subscription.as_mut(), &tenant, "a batched event").await;
        assert_eq!(&got, expected, "arrives whole, in order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_comes_back_after_its_backend_is_killed() {
    let channel = channel();
    let options = options();
    let application = options.application_name.clone();
    let listener = notices_with(&channel, options).await;
    let publisher = notices_with(&channel, self::options()).await;
    let mut subscription = subscribe(&listener).await;
    assert_eq!(listening_sessions(&application).await, 1);

    assert_eq!(
        kill_backends(&application, true).await,
        1,
        "exactly this test's listening backend is killed"
    );
    // Events published while it reconnects are missed, so keep publishing
    // until one arrives on the subscription made before the kill.
    let tenant = unique("tenant");
    heard_eventually(
        &publisher,
        subscription.as_mut(),
        &event(&tenant, "job-after", json!({"n": 1})),
    )
    .await;
    assert!(listener.is_listening());
    assert_eq!(listening_sessions(&application).await, 1, "LISTENing again");
    // And a later event arrives at once, in order.
    let later = event(&tenant, "job-later", json!({"n": 2}));
    assert_eq!(publisher.publish(&later).await, Ok(()));
    loop {
        let got = next_of(subscription.as_mut(), &tenant, "after coming back").await;
        if got.id == later.id {
            break;
        }
        assert_eq!(got.id, "job-after", "only repeats may come first");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publisher_comes_back_after_its_backend_is_killed() {
    let channel = channel();
    let options = options();
    let application = options.application_name.clone();
    let notices = notices_with(&channel, options).await;
    let mut subscription = subscribe(&notices).await;
    assert_eq!(
        kill_backends(&application, false).await,
        1,
        "exactly this test's publishing backend is killed"
    );
    let tenant = unique("tenant");
    let sent = event(&tenant, "job-a", json!({}));
    // Right after, publishing answers at once: done, or unavailable.
    let right_after = timeout(Duration::from_secs(1), notices.publish(&sent)).await;
    assert!(
        matches!(right_after, Ok(Ok(()) | Err(BrokerError::Unavailable(_)))),
        "{right_after:?}"
    );
    heard_eventually(&notices, subscription.as_mut(), &sent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_keep_fleets_apart() {
    let (ours, theirs) = (notices().await, notices().await);
    let mut heard_here = subscribe(&ours).await;
    let mut heard_there = subscribe(&theirs).await;
    let tenant = unique("tenant");
    let sent = event(&tenant, "job-a", json!({}));
    assert_eq!(ours.publish(&sent).await, Ok(()));
    assert_eq!(
        next_of(heard_here.as_mut(), &tenant, "our channel").await,
        sent
    );
    let leaked = timeout(QUIET * 3, heard_there.next()).await;
    assert!(leaked.is_err(), "another channel heard {leaked:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_ends_subscriptions_and_refuses_work() {
    let notices = notices().await;
    let mut subscription = subscribe(&notices).await;
    let waiting = tokio::spawn(async move { subscription.next().await });
    sleep(QUIET).await;
    notices.close();
    let ended = timeout(ARRIVAL, waiting).await;
    assert!(
        matches!(ended, Ok(Ok(None))),
        "a waiting subscription ends on close: {ended:?}"
    );
    let tenant = unique("tenant");
    assert_eq!(
        notices.publish(&event(&tenant, "job-a", json!({}))).await,
        Err(BrokerError::Closed)
    );
    assert!(matches!(
        notices.subscribe().await,
        Err(BrokerError::Closed)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_channels_and_unreachable_databases_answer_unavailable() {
    for bad in ["", "has space", "quote\"d", &"x".repeat(64)] {
        let refused = PgNotices::connect(&url(), bad).await;
        assert!(
            matches!(refused, Err(BrokerError::Unavailable(_))),
            "{bad:?}: {refused:?}"
        );
    }
    let channel = channel();
    let connecting = PgNotices::connect("postgres://postgres@127.0.0.1:1/test", &channel);
    let answer = timeout(ARRIVAL * 2, connecting).await;
    assert!(
        matches!(answer, Ok(Err(BrokerError::Unavailable(_)))),
        "{answer:?}"
    );
    let garbled = PgNotices::connect("not a url at all", &channel).await;
    assert!(
        matches!(garbled, Err(BrokerError::Unavailable(_))),
        "{garbled:?}"
    );
}
