//! The notices of a fleet that shares PostgreSQL, over `LISTEN`/`NOTIFY`.
//!
//! This module owns one notification channel (a name derived from the
//! fleet's schema or prefix by [`channel_for`], so fleets sharing a database
//! never hear each other) and two connections per [`PgNotices`]: one that
//! publishes with `pg_notify`, and one that `LISTEN`s and fans what it hears
//! out to every local subscriber through a broadcast ring. Each connection
//! has a supervisor that replaces it with backoff when it dies; the listener
//! `LISTEN`s again by itself, and checks its connection now and then by
//! repeating the `LISTEN` (which changes nothing), so a silently dead
//! connection is found within [`PgOptions::check_interval`].
//!
//! What it guarantees: a subscriber receives every event published, by any
//! process on the channel, after its `subscribe()` returned, and none
//! published before it was called, whole and, for one publisher, in publish
//! order, unless it falls behind (then it skips the oldest, as the trait
//! documents). For the "none before", `subscribe()` costs one round trip:
//! the listener sends a marker on a channel of its own and joins the
//! subscriber to the ring when it hears it, since PostgreSQL delivers
//! notifications in commit order. `NOTIFY` payloads must be shorter than
//! 8000 bytes, so an event is sent as ASCII JSON cut into chunks of at most
//! [`CHUNK_DATA`] bytes, each behind a small header (`<message id>:<index>:
//! <count>:`), all in one statement and so one transaction: PostgreSQL
//! delivers all of them or none. The listener puts them back together,
//! holding at most [`PgOptions::max_partial_bytes`] of incomplete messages,
//! none longer than [`PgOptions::partial_timeout`].
//!
//! What it does not: events published while the listener is reconnecting
//! are missed (as with RabbitMQ's per-subscriber queues), and `publish`
//! answers [`BrokerError::Unavailable`] at once while the publishing
//! connection is down; notices are announcements, and the store stays the
//! truth that pollers read. It never blocks a caller on an unreachable
//! database: connecting, `LISTEN` and every publish are bounded by
//! [`PgOptions::operation_timeout`]. An event larger than
//! [`PgOptions::max_event_bytes`] is refused rather than sent. It must never
//! be the record of anything: nothing here survives the process.
//!
//! Both connections honour the URL's `sslmode` and `sslrootcert` as libpq
//! does (or [`PgOptions::ca_file`] for the CA), through rustls, as the
//! store's do: see `toolfleet_tls::postgres`.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::path::PathBuf;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use backon::{BackoffBuilder, ExponentialBuilder};
use serde::Serialize;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_postgres::types::ToSql;
use tokio_postgres::{AsyncMessage, Client, Config, Statement};
use toolfleet_tls::postgres::{PgConnection, PgConnector};

use crate::memory::{DEFAULT_NOTICE_BUFFER, MAX_NOTICE_BUFFER};
use crate::{BrokerError, Event, Notices, Subscription};

/// The `application_name` of both connections when [`PgOptions`] does not
/// say otherwise.
pub const DEFAULT_APPLICATION_NAME: &str = "toolfleet-notices";

/// The longest channel name: PostgreSQL's identifiers hold 63 bytes.
pub const MAX_CHANNEL: usize = 63;

/// The most bytes of an event's JSON one notification carries. With its
/// header (a message id of at most 48 characters and two counts, well under
/// 199 bytes) a payload stays under PostgreSQL's limit of 8000 bytes.
pub const CHUNK_DATA: usize = 7_800;

/// How many bytes of payloads [`PgNotices::publish_all`] sends in one
/// statement at most (beyond one event's own, which always go together).
const BATCH_BYTES: usize = 1 << 20;

/// Publishes one notification per chunk, in chunk order, in one
/// transaction.
const NOTIFY: &str = "SELECT pg_notify($1, chunk) \
     FROM unnest($2::text[]) WITH ORDINALITY AS chunks(chunk, n) ORDER BY n";

/// The most incomplete messages the listener holds at once.
const MAX_PARTIALS: usize = 256;

/// How to reach PostgreSQL and how to bound the notices.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// The `application_name` of both connections (replacing one the URL
    /// names), so that an operator can tell them apart in
    /// `pg_stat_activity`.
    pub application_name: String,
    /// How long connecting, `LISTEN`, or one publish may take before it
    /// answers [`BrokerError::Unavailable`] (or, for the listener, counts
    /// its connection as lost).
    pub operation_timeout: Duration,
    /// The first pause between reconnect attempts; it doubles, with jitter,
    /// up to [`PgOptions::reconnect_max`].
    pub reconnect_min: Duration,
    /// The longest pause between reconnect attempts.
    pub reconnect_max: Duration,
    /// How often the listener checks that its connection still answers.
    pub check_interval: Duration,
    /// How far a subscriber may fall behind before it skips events.
    pub notice_buffer: usize,
    /// The largest event, as JSON, that is published or put back together.
    pub max_event_bytes: usize,
    /// The most bytes of incomplete messages the listener holds; beyond it,
    /// the oldest are dropped.
    pub max_partial_bytes: usize,
    /// How long an incomplete message is held. Its chunks come in one
    /// transaction, so only a listener reconnecting between them leaves one
    /// incomplete.
    pub partial_timeout: Duration,
    /// The PEM file of the CA that signed the server's certificate, used
    /// when the URL names no `sslrootcert` (toolfleet's `database_ca_file`).
    pub ca_file: Option<PathBuf>,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            application_name: DEFAULT_APPLICATION_NAME.to_owned(),
            operation_timeout: Duration::from_secs(5),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(10),
            check_interval: Duration::from_secs(30),
            notice_buffer: DEFAULT_NOTICE_BUFFER,
            max_event_bytes: 8 << 20,
            max_partial_bytes: 32 << 20,
            partial_timeout: Duration::from_secs(30),
            ca_file: None,
        }
    }
}

impl PgOptions {
    fn backoff(&self) -> impl Iterator<Item = Duration> + use<> {
        ExponentialBuilder::default()
            .with_min_delay(self.reconnect_min)
            .with_max_delay(self.reconnect_max)
            .with_jitter()
            .without_max_times()
            .build()
    }
}

/// The channel of a fleet whose schema (or, without one, prefix) is
/// `namespace`: `<namespace>.events`. A namespace too long for a channel
/// name is cut and followed by a hash of the whole, so that two long
/// namespaces still get channels of their own.
pub fn channel_for(namespace: &str) -> String {
    let channel = format!("{namespace}.events");
    if channel.len() <= MAX_CHANNEL {
        return channel;
    }
    let mut cut = MAX_CHANNEL - ".0123456789abcdef.events".len();
    while !namespace.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}.{:016x}.events", &namespace[..cut], fnv1a(namespace))
}

/// FNV-1a: a hash every build of every process computes alike.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Refuses a channel name that is not 1 to 63 ASCII letters, digits, `_`,
/// `-` and `.`: such a name is used verbatim by `pg_notify` and, quoted, by
/// `LISTEN`, and needs no escaping in either.
pub fn check_channel(channel: &str) -> Result<(), BrokerError> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if !channel.is_empty() && channel.len() <= MAX_CHANNEL && channel.chars().all(plain) {
        return Ok(());
    }
    Err(BrokerError::Unavailable(format!(
        "notification channel {channel:?} is not usable: use 1 to {MAX_CHANNEL} ASCII \
         letters, digits, '_', '-' and '.'"
    )))
}

/// The [`Notices`] on PostgreSQL `LISTEN`/`NOTIFY`. Clones share the
/// connections and subscribers; they close, and subscriptions end, when
/// [`PgNotices::close`] is called or the last clone is dropped.
#[derive(Clone)]
pub struct PgNotices {
    handle: Arc<CloseOnDrop>,
}

/// The supervisors hold the [`Shared`] state itself, so only the caller's
/// handles decide when the connections close.
struct CloseOnDrop(Arc<Shared>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl PgNotices {
    /// Connects to PostgreSQL at `url` (`postgres://user@host:5432/db`) with
    /// the default [`PgOptions`], and `LISTEN`s on `channel` before
    /// answering; [`BrokerError::Unavailable`] if it cannot.
    pub async fn connect(url: &str, channel: &str) -> Result<PgNotices, BrokerError> {
        Self::connect_with(url, channel, PgOptions::default()).await
    }

    /// As [`PgNotices::connect`], with `options`.
    pub async fn connect_with(
        url: &str,
        channel: &str,
        options: PgOptions,
    ) -> Result<PgNotices, BrokerError> {
        check_channel(channel)?;
        let target = toolfleet_tls::postgres::target(url, options.ca_file.as_deref())
            .map_err(BrokerError::Unavailable)?;
        let (mut config, connector) = (target.config, target.connector);
        config.application_name(options.application_name.as_str());
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(options.operation_timeout);
        }
        let place = toolfleet_tls::postgres::describe(&config);
        let buffer = options.notice_buffer.clamp(1, MAX_NOTICE_BUFFER);
        let (ring, _) = broadcast::channel(buffer);
        let origin = toolfleet_core::new_id().replace('-', "");
        let marker = format!("tfm_{origin}");
        let (waiting, waiters) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            config,
            connector,
            place,
            listen: format!("LISTEN \"{channel}\"; LISTEN \"{marker}\""),
            marker,
            waiting,
            channel: channel.to_owned(),
            options,
            origin,
            sequence: AtomicU64::new(0),
            ring: Mutex::new(Some(ring.clone())),
            publisher: watch::Sender::new(PublisherState::Down),
            listening: AtomicBool::new(false),
            closed: watch::Sender::new(false),
            generations: AtomicU64::new(0),
        });
        let publisher = shared.open_publisher().await?;
        let listener = shared.open_listener().await?;
        shared
            .publisher
            .send_replace(PublisherState::Up(Arc::new(publisher)));
        shared.listening.store(true, Ordering::SeqCst);
        tokio::spawn(Arc::clone(&shared).listen(listener, ring, waiters));
        Ok(PgNotices {
            handle: Arc::new(CloseOnDrop(shared)),
        })
    }

    /// The channel this listens and publishes on.
    pub fn channel(&self) -> &str {
        &self.shared().channel
    }

    /// True while the listener's connection is up and `LISTEN`ing.
    pub fn is_listening(&self) -> bool {
        self.shared().listening.load(Ordering::SeqCst)
    }

    /// Closes both connections and ends every subscription; publishing and
    /// subscribing then answer [`BrokerError::Closed`].
    pub fn close(&self) {
        self.shared().close();
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.handle.0
    }
}

impl std::fmt::Debug for PgNotices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgNotices")
            .field("database", &self.shared().place)
            .field("channel", &self.shared().channel)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Notices for PgNotices {
    async fn publish(&self, event: &Event) -> Result<(), BrokerError> {
        let shared = self.shared();
        let chunks = encode(
            event,
            &shared.next_message_id(),
            shared.options.max_event_bytes,
        )?;
        shared.notify(&chunks, &format!("event {}", event.id)).await
    }

    /// The chunks of many events in one statement (so one transaction and
    /// one round trip), in the order given, up to a mebibyte (`BATCH_BYTES`) a
    /// statement. An event over the size bound is left out and named in the
    /// answer; the others still go.
    async fn publish_all(&self, events: &[Event]) -> Result<(), BrokerError> {
        let shared = self.shared();
        let mut refused = None;
        let mut chunks: Vec<String> = Vec::new();
        let mut bytes = 0;
        for event in events {
            match encode(
                event,
                &shared.next_message_id(),
                shared.options.max_event_bytes,
            ) {
                Ok(encoded) => {
                    bytes += encoded.iter().map(String::len).sum::<usize>();
                    chunks.extend(encoded);
                }
                Err(error) => refused = Some(error),
            }
            if bytes >= BATCH_BYTES {
                shared
                    .notify(&chunks, &format!("{} chunks", chunks.len()))
                    .await?;
                chunks.clear();
                bytes = 0;
            }
        }
        if !chunks.is_empty() {
            shared
                .notify(&chunks, &format!("{} chunks", chunks.len()))
                .await?;
        }
        refused.map_or(Ok(()), Err)
    }

    async fn subscribe(&self) -> Result<Box<dyn Subscription>, BrokerError> {
        let shared = self.shared();
        if shared.is_closed() {
            return Err(BrokerError::Closed);
        }
        let down = || {
            BrokerError::Unavailable(format!(
                "the listening connection to {} is down; reconnecting",
                shared.place
            ))
        };
        if !shared.listening.load(Ordering::SeqCst) {
            return Err(down());
        }
        // The listener joins this subscriber to the ring once it hears a
        // marker it sent after this call began. PostgreSQL delivers
        // notifications in commit order, so by then every event published
        // before this call has been handed on without it, and every event
        // published after it returns comes later.
        let (joined, ring) = oneshot::channel();
        shared
            .waiting
            .send(joined)
            .map_err(|_| BrokerError::Closed)?;
        let limit = shared.options.operation_timeout;
        match tokio::time::timeout(limit, ring).await {
            Ok(Ok(events)) => Ok(Box::new(PgSubscription { events })),
            Ok(Err(_)) if shared.is_closed() => Err(BrokerError::Closed),
            Ok(Err(_)) => Err(down()),
            Err(_) => Err(BrokerError::Unavailable(format!(
                "the listener on {} did not answer within {limit:?}",
                shared.place
            ))),
        }
    }
}

struct PgSubscription {
    events: broadcast::Receiver<Event>,
}

#[async_trait]
impl Subscription for PgSubscription {
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

/// The publishing connection of the moment.
#[derive(Clone)]
enum PublisherState {
    Up(Arc<Publisher>),
    /// The supervisor is reconnecting.
    Down,
    Closed,
}

/// A connection for `pg_notify`, its statement prepared. Concurrent
/// publishes share it: tokio-postgres pipelines them, and sends each on its
/// first poll, so they reach PostgreSQL in the order they were started.
struct Publisher {
    generation: u64,
    client: Client,
    notify: Statement,
}

/// The listening connection, `LISTEN`ing, and what it heard while it
/// started to.
struct Listener {
    client: Client,
    connection: PgConnection,
    early: Vec<AsyncMessage>,
}

/// A subscriber waiting for the listener to join it to the ring.
type Waiter = oneshot::Sender<broadcast::Receiver<Event>>;

/// What the listener keeps while it pumps: incomplete events, and the
/// subscribers waiting for their marker, by the marker's token.
struct Hearing {
    chunks: Reassembler,
    waiting: HashMap<String, Vec<Waiter>>,
    tokens: u64,
}

/// Why the listener stopped pumping.
enum Stopped {
    Closed,
    Lost(String),
}

/// The state behind a [`PgNotices`] handle and its supervisors.
struct Shared {
    config: Config,
    connector: PgConnector,
    /// "db on host:port", for messages (never the password).
    place: String,
    channel: String,
    /// The channel of this handle's markers alone (`tfm_<origin>`).
    marker: String,
    /// `LISTEN "<channel>"; LISTEN "<marker>"`.
    listen: String,
    /// Subscribers for the listener to join to the ring.
    waiting: mpsc::UnboundedSender<Waiter>,
    options: PgOptions,
    /// The first part of this process's message ids.
    origin: String,
    sequence: AtomicU64,
    /// Taken on close, so subscriptions end once the listener has stopped.
    ring: Mutex<Option<broadcast::Sender<Event>>>,
    publisher: watch::Sender<PublisherState>,
    listening: AtomicBool,
    closed: watch::Sender<bool>,
    generations: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The only critical section is a take or a clone.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn next_message_id(&self) -> String {
        let n = self.sequence.fetch_add(1, Ordering::Relaxed);
        format!("{}{n:x}", self.origin)
    }

    fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    async fn until_closed(&self) {
        let mut closed = self.closed.subscribe();
        // An error means the sender is gone, which is closed too.
        let _ = closed.wait_for(|c| *c).await;
    }

    fn close(&self) {
        self.closed.send_replace(true);
        self.publisher.send_replace(PublisherState::Closed);
        self.listening.store(false, Ordering::SeqCst);
        drop(lock(&self.ring).take());
    }

    /// Sleeps `pause`; false if closed meanwhile.
    async fn pause(&self, pause: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(pause) => !self.is_closed(),
            () = self.until_closed() => false,
        }
    }

    async fn connect(&self, what: &str) -> Result<(Client, PgConnection), BrokerError> {
        let limit = self.options.operation_timeout;
        match tokio::time::timeout(limit, self.connector.connect(&self.config)).await {
            Ok(Ok(pair)) => Ok(pair),
            Ok(Err(e)) => Err(BrokerError::Unavailable(format!(
                "connecting to {} for {what}: {}",
                self.place,
                pg_error(&e)
            ))),
            Err(_) => Err(BrokerError::Unavailable(format!(
                "connecting to {} for {what}: no answer within {limit:?}",
                self.place
            ))),
        }
    }
}

/// The publishing side: the connection of the moment, noticing its loss,
/// and replacing it with backoff.
impl Shared {
    async fn open_publisher(self: &Arc<Self>) -> Result<Publisher, BrokerError> {
        let (client, connection) = self.connect("publishing notices").await?;
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        // The connection reports its own end, so a killed backend is
        // replaced before the next publish has to fail on it.
        let shared = Arc::downgrade(self);
        tokio::spawn(drive_publisher(connection, shared, generation));
        let limit = self.options.operation_timeout;
        let notify = match tokio::time::timeout(limit, client.prepare(NOTIFY)).await {
            Ok(Ok(statement)) => statement,
            Ok(Err(e)) => {
                return Err(BrokerError::Unavailable(format!(
                    "preparing pg_notify on {}: {}",
                    self.place,
                    pg_error(&e)
                )));
            }
            Err(_) => {
                return Err(BrokerError::Unavailable(format!(
                    "preparing pg_notify on {}: no answer within {limit:?}",
                    self.place
                )));
            }
        };
        Ok(Publisher {
            generation,
            client,
            notify,
        })
    }

    /// The publisher to use now; `Unavailable` at once while reconnecting.
    fn publisher(self: &Arc<Self>) -> Result<Arc<Publisher>, BrokerError> {
        let state = self.publisher.borrow().clone();
        match state {
            PublisherState::Up(publisher) if !publisher.client.is_closed() => Ok(publisher),
            PublisherState::Up(publisher) => {
                self.publisher_lost(publisher.generation);
                Err(self.reconnecting())
            }
            PublisherState::Down => Err(self.reconnecting()),
            PublisherState::Closed => Err(BrokerError::Closed),
        }
    }

    /// Sends `payloads` on the channel, in order, in one transaction.
    async fn notify(self: &Arc<Self>, payloads: &[String], what: &str) -> Result<(), BrokerError> {
        let publisher = self.publisher()?;
        let limit = self.options.operation_timeout;
        let params: [&(dyn ToSql + Sync); 2] = [&self.channel, &payloads];
        let sent = publisher.client.execute(&publisher.notify, &params);
        match tokio::time::timeout(limit, sent).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => {
                if publisher.client.is_closed() {
                    self.publisher_lost(publisher.generation);
                }
                Err(BrokerError::Unavailable(format!(
                    "publishing {what} on {}: {}",
                    self.place,
                    pg_error(&error)
                )))
            }
            Err(_) => {
                // A publish that hangs leaves the connection behind it
                // unusable (its answers would come out of order): replace it.
                self.publisher_lost(publisher.generation);
                Err(BrokerError::Unavailable(format!(
                    "publishing {what} on {}: no answer within {limit:?}",
                    self.place
                )))
            }
        }
    }

    fn reconnecting(&self) -> BrokerError {
        BrokerError::Unavailable(format!(
            "the publishing connection to {} is down; reconnecting",
            self.place
        ))
    }

    /// Marks publisher `generation` lost and starts the one supervisor that
    /// replaces it; later reports of the same loss change nothing.
    fn publisher_lost(self: &Arc<Self>, generation: u64) {
        let replaced = self.publisher.send_if_modified(|state| match state {
            PublisherState::Up(publisher) if publisher.generation == generation => {
                *state = PublisherState::Down;
                true
            }
            _ => false,
        });
        if replaced {
            tracing::warn!(channel = %self.channel, "publishing connection to PostgreSQL lost; reconnecting");
            tokio::spawn(Arc::clone(self).reconnect_publisher());
        }
    }

    async fn reconnect_publisher(self: Arc<Self>) {
        let mut pauses = self.options.backoff();
        while !self.is_closed() {
            match self.open_publisher().await {
                Ok(publisher) => {
                    let publisher = Arc::new(publisher);
                    // Not installed means closed meanwhile; dropping it closes it.
                    self.publisher.send_if_modified(|state| {
                        if !matches!(state, PublisherState::Down) {
                            return false;
                        }
                        *state = PublisherState::Up(publisher);
                        true
                    });
                    tracing::info!(channel = %self.channel, "publishing connection to PostgreSQL back");
                    return;
                }
                Err(error) => tracing::warn!(%error, "reconnecting the notices publisher failed"),
            }
            let pause = pauses.next().unwrap_or(self.options.reconnect_max);
            if !self.pause(pause).await {
                return;
            }
        }
    }
}

/// Drives a publishing connection until it ends (its client dropped, or the
/// server gone), then reports the loss.
async fn drive_publisher(connection: PgConnection, shared: Weak<Shared>, generation: u64) {
    if let Err(error) = connection.await {
        tracing::debug!(error = %pg_error(&error), "notices publishing connection ended");
    }
    if let Some(shared) = shared.upgrade() {
        shared.publisher_lost(generation);
    }
}

/// The listening side: one connection `LISTEN`ing, its notifications put
/// back together and fanned out, and its replacement when it dies.
impl Shared {
    async fn open_listener(&self) -> Result<Listener, BrokerError> {
        let (client, mut connection) = self.connect("listening").await?;
        // What is heard as soon as LISTEN takes effect is kept for the pump.
        let mut early = Vec::new();
        let listened = drive(
            &mut connection,
            self.options.operation_timeout,
            client.batch_execute(&self.listen),
            &mut |message| early.push(message),
        )
        .await;
        match listened {
            Ok(()) => Ok(Listener {
                client,
                connection,
                early,
            }),
            Err(why) => Err(BrokerError::Unavailable(format!(
                "listening on {} at {}: {why}",
                self.channel, self.place
            ))),
        }
    }

    /// The listener's task: pumps notifications into `ring` and, when the
    /// connection dies, connects and `LISTEN`s again with backoff, until
    /// closed.
    async fn listen(
        self: Arc<Self>,
        first: Listener,
        ring: broadcast::Sender<Event>,
        mut waiters: mpsc::UnboundedReceiver<Waiter>,
    ) {
        let mut current = Some(first);
        let mut pauses = self.options.backoff();
        loop {
            if let Some(listener) = current.take() {
                self.listening.store(true, Ordering::SeqCst);
                let stopped = self.pump(listener, &ring, &mut waiters).await;
                self.listening.store(false, Ordering::SeqCst);
                match stopped {
                    Stopped::Closed => return,
                    Stopped::Lost(why) => {
                        tracing::warn!(channel = %self.channel, %why, "listening connection to PostgreSQL lost; reconnecting");
                    }
                }
                pauses = self.options.backoff();
            } else {
                let pause = pauses.next().unwrap_or(self.options.reconnect_max);
                if !self.pause(pause).await {
                    return;
                }
            }
            if self.is_closed() {
                return;
            }
            match self.open_listener().await {
                Ok(listener) => {
                    tracing::info!(channel = %self.channel, "listening on PostgreSQL again");
                    current = Some(listener);
                }
                Err(error) => tracing::warn!(%error, "reconnecting the notices listener failed"),
            }
        }
    }

    /// Hands every notification on, and joins waiting subscribers to the
    /// ring, until the connection dies or the notices close; checks the
    /// connection every `check_interval`. Subscribers still waiting for
    /// their marker when it stops are told (their sender is dropped).
    async fn pump(
        &self,
        listener: Listener,
        ring: &broadcast::Sender<Event>,
        waiters: &mut mpsc::UnboundedReceiver<Waiter>,
    ) -> Stopped {
        let Listener {
            client,
            mut connection,
            early,
        } = listener;
        let mut hearing = Hearing {
            chunks: Reassembler::new(&self.options),
            waiting: HashMap::new(),
            tokens: 0,
        };
        for message in early {
            self.receive(message, &mut hearing, ring);
        }
        let limit = self.options.operation_timeout;
        let period = self.options.check_interval.max(Duration::from_millis(10));
        let mut check = tokio::time::interval_at(Instant::now() + period, period);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Every statement starts with LISTEN (again: a no-op), so the
            // session's last query in pg_stat_activity is always a LISTEN.
            let statement = tokio::select! {
                () = self.until_closed() => return Stopped::Closed,
                // An answer proves the connection alive.
                _ = check.tick() => self.listen.clone(),
                waiter = waiters.recv() => {
                    let Some(first) = waiter else {
                        return Stopped::Closed;
                    };
                    let mut batch = vec![first];
                    while let Ok(more) = waiters.try_recv() {
                        batch.push(more);
                    }
                    hearing.tokens += 1;
                    let token = hearing.tokens.to_string();
                    hearing.waiting.insert(token.clone(), batch);
                    format!("{}; NOTIFY \"{}\", '{token}'", self.listen, self.marker)
                }
                message = poll_fn(|cx| connection.poll_message(cx)) => {
                    match message {
                        Some(Ok(message)) => self.receive(message, &mut hearing, ring),
                        Some(Err(error)) => return Stopped::Lost(pg_error(&error)),
                        None => return Stopped::Lost("the server closed the connection".into()),
                    }
                    continue;
                }
            };
            let answered = drive(
                &mut connection,
                limit,
                client.batch_execute(&statement),
                &mut |message| self.receive(message, &mut hearing, ring),
            )
            .await;
            if let Err(why) = answered {
                return Stopped::Lost(why);
            }
        }
    }

    fn receive(
        &self,
        message: AsyncMessage,
        hearing: &mut Hearing,
        ring: &broadcast::Sender<Event>,
    ) {
        let AsyncMessage::Notification(notification) = message else {
            return;
        };
        if notification.channel() == self.marker {
            for waiter in hearing
                .waiting
                .remove(notification.payload())
                .unwrap_or_default()
            {
                // An error only says that the subscriber stopped waiting.
                drop(waiter.send(ring.subscribe()));
            }
            return;
        }
        if notification.channel() != self.channel {
            return;
        }
        let Some(json) = hearing.chunks.accept(notification.payload()) else {
            return;
        };
        match serde_json::from_str::<Event>(&json) {
            // An error only says that nobody is subscribed.
            Ok(event) => drop(ring.send(event)),
            Err(error) => tracing::debug!(%error, "skipping a malformed event"),
        }
    }
}

/// Awaits `call` (a request on the client of `connection`) while driving
/// the connection, handing whatever it hears meanwhile to `heard`; bounded
/// by `limit`. `Err` says why the connection is no longer usable.
async fn drive<T>(
    connection: &mut PgConnection,
    limit: Duration,
    call: impl Future<Output = Result<T, tokio_postgres::Error>>,
    heard: &mut impl FnMut(AsyncMessage),
) -> Result<T, String> {
    let mut call = pin!(call);
    let deadline = tokio::time::sleep(limit);
    let mut deadline = pin!(deadline);
    loop {
        tokio::select! {
            answer = &mut call => return answer.map_err(|e| pg_error(&e)),
            message = poll_fn(|cx| connection.poll_message(cx)) => match message {
                Some(Ok(message)) => heard(message),
                Some(Err(error)) => return Err(pg_error(&error)),
                None => return Err("the server closed the connection".into()),
            },
            () = &mut deadline => return Err(format!("no answer within {limit:?}")),
        }
    }
}

/// An event as the payloads of its notifications: its JSON, every
/// character beyond ASCII escaped (so a chunk may end at any byte, and no
/// database encoding changes its length), cut into chunks of at most
/// [`CHUNK_DATA`] bytes, each behind `<id>:<index>:<count>:`.
fn encode(event: &Event, id: &str, max_event_bytes: usize) -> Result<Vec<String>, BrokerError> {
    let json = ascii_json(event)
        .map_err(|e| BrokerError::Unavailable(format!("encoding event {}: {e}", event.id)))?;
    if json.len() > max_event_bytes {
        return Err(BrokerError::Unavailable(format!(
            "event {} is {} bytes as JSON, over the {max_event_bytes}-byte bound of notices",
            event.id,
            json.len()
        )));
    }
    let pieces: Vec<&[u8]> = json.as_bytes().chunks(CHUNK_DATA).collect();
    let count = pieces.len().max(1);
    let mut payloads = Vec::with_capacity(count);
    for (index, piece) in pieces.into_iter().enumerate() {
        // ASCII throughout, so every cut is a character boundary.
        let piece = std::str::from_utf8(piece)
            .map_err(|e| BrokerError::Unavailable(format!("encoding event {}: {e}", event.id)))?;
        payloads.push(format!("{id}:{index}:{count}:{piece}"));
    }
    Ok(payloads)
}

/// JSON with every non-ASCII character written as `\uXXXX`.
fn ascii_json(value: &impl Serialize) -> Result<String, serde_json::Error> {
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, AsciiFormatter);
    value.serialize(&mut serializer)?;
    // Only ASCII was written.
    Ok(String::from_utf8_lossy(&out).into_owned())
}

struct AsciiFormatter;

impl serde_json::ser::Formatter for AsciiFormatter {
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut plain = 0;
        for (at, c) in fragment.char_indices() {
            if c.is_ascii() {
                continue;
            }
            writer.write_all(&fragment.as_bytes()[plain..at])?;
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                write!(writer, "\\u{unit:04x}")?;
            }
            plain = at + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[plain..])
    }
}

/// Puts chunked events back together, within bounds: at most
/// `max_partial_bytes` and [`MAX_PARTIALS`] incomplete messages, each held
/// at most `timeout`; beyond, the oldest are dropped.
struct Reassembler {
    partial: HashMap<String, Partial>,
    bytes: usize,
    max_bytes: usize,
    max_chunks: usize,
    timeout: Duration,
}

struct Partial {
    chunks: Vec<Option<String>>,
    missing: usize,
    bytes: usize,
    started: Instant,
}

impl Reassembler {
    fn new(options: &PgOptions) -> Reassembler {
        Reassembler {
            partial: HashMap::new(),
            bytes: 0,
            max_bytes: options.max_partial_bytes,
            max_chunks: options.max_event_bytes.div_ceil(CHUNK_DATA).max(1),
            timeout: options.partial_timeout,
        }
    }

    /// Takes one payload; the whole JSON once its message is complete.
    fn accept(&mut self, payload: &str) -> Option<String> {
        let Some((id, index, count, data)) = parse(payload) else {
            tracing::debug!("skipping a notification that is not a toolfleet event");
            return None;
        };
        if count == 1 {
            return Some(data.to_owned());
        }
        if count > self.max_chunks {
            tracing::debug!(count, "skipping an event over the size bound");
            return None;
        }
        self.expire();
        if !self.partial.contains_key(id) {
            self.make_room(data.len());
            if self.partial.len() >= MAX_PARTIALS || self.bytes + data.len() > self.max_bytes {
                tracing::warn!("dropping part of an event: too many incomplete events held");
                return None;
            }
            let partial = Partial {
                chunks: vec![None; count],
                missing: count,
                bytes: 0,
                started: Instant::now(),
            };
            self.partial.insert(id.to_owned(), partial);
        }
        let fits = self.bytes + data.len() <= self.max_bytes;
        let partial = self.partial.get_mut(id)?;
        let fresh = partial.chunks.get(index).is_some_and(Option::is_none);
        if partial.chunks.len() != count || !fresh {
            // Not of this message's shape, or a chunk heard twice.
            return None;
        }
        if !fits {
            self.drop_message(id);
            tracing::warn!("dropping an event: incomplete events over their memory bound");
            return None;
        }
        if let Some(slot) = partial.chunks.get_mut(index) {
            *slot = Some(data.to_owned());
        }
        partial.missing -= 1;
        partial.bytes += data.len();
        let complete = partial.missing == 0;
        self.bytes += data.len();
        if !complete {
            return None;
        }
        let done = self.partial.remove(id)?;
        self.bytes -= done.bytes;
        Some(done.chunks.into_iter().flatten().collect())
    }

    fn expire(&mut self) {
        let timeout = self.timeout;
        let expired: Vec<String> = self
            .partial
            .iter()
            .filter(|(_, p)| p.started.elapsed() > timeout)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            tracing::debug!("dropping an event whose chunks stopped coming");
            self.drop_message(&id);
        }
    }

    /// Drops the oldest incomplete messages until a new one of `bytes` fits.
    fn make_room(&mut self, bytes: usize) {
        while !self.partial.is_empty()
            && (self.partial.len() >= MAX_PARTIALS || self.bytes + bytes > self.max_bytes)
        {
            let oldest = self
                .partial
                .iter()
                .min_by_key(|(_, p)| p.started)
                .map(|(id, _)| id.clone());
            let Some(oldest) = oldest else { return };
            tracing::warn!("dropping an incomplete event to bound memory");
            self.drop_message(&oldest);
        }
    }

    fn drop_message(&mut self, id: &str) {
        if let Some(gone) = self.partial.remove(id) {
            self.bytes -= gone.bytes;
        }
    }
}

/// `<id>:<index>:<count>:<data>`, with `index < count`.
fn parse(payload: &str) -> Option<(&str, usize, usize, &str)> {
    let mut parts = payload.splitn(4, ':');
    let id = parts.next()?;
    let index = parts.next()?.parse::<usize>().ok()?;
    let count = parts.next()?.parse::<usize>().ok()?;
    let data = parts.next()?;
    (!id.is_empty() && index < count).then_some((id, index, count, data))
}

/// The error with its causes: tokio-postgres says "db error" and keeps
/// what the server said in the source.
fn pg_error(error: &tokio_postgres::Error) -> String {
    let mut text = error.to_string();
    let mut cause = std::error::Error::source(error);
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    // What to check when the server refused what sslmode asked for.
    if let Some(hint) = toolfleet_tls::postgres::hint(error) {
        text.push_str(&format!(" ({hint})"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(body: serde_json::Value) -> Event {
        Event {
            kind: crate::EventKind::Job,
            id: "job-1".into(),
            tenant: "acme".into(),
            tool: "ocr".into(),
            state: crate::EventState::parse("succeeded").expect("a state"),
            run_id: "run-1".into(),
            body: body.into(),
            callback: true,
            life: 0,
            ..Default::default()
        }
    }

    fn options() -> PgOptions {
        PgOptions::default()
    }

    fn reassemble(chunks: &mut Reassembler, payloads: &[String]) -> Option<Event> {
        let mut whole = None;
        for payload in payloads {
            assert!(whole.is_none(), "complete before its last chunk");
            whole = chunks.accept(payload);
        }
        whole.map(|json| serde_json::from_str(&json).expect("an event"))
    }

    #[test]
    fn small_event_is_one_payload_and_comes_back() {
        let sent = event(json!({"status": "ok", "text": "café ☕ 𝄞"}));
        let payloads = encode(&sent, "m1", 1 << 20).expect("encoded");
        assert_eq!(payloads.len(), 1);
        assert!(payloads[0].starts_with("m1:0:1:"));
        assert!(payloads[0].is_ascii(), "{}", payloads[0]);
        let mut chunks = Reassembler::new(&options());
        assert_eq!(reassemble(&mut chunks, &payloads), Some(sent));
    }

    #[test]
    fn large_event_is_chunked_under_the_limit_and_comes_back_in_any_order() {
        let text: String = "é-𝄞-abc".repeat(5_000);
        let sent = event(json!({"status": "ok", "text": text}));
        let mut payloads = encode(&sent, "m2", 1 << 20).expect("encoded");
        assert!(payloads.len() > 3, "{} chunks", payloads.len());
        assert!(payloads.iter().all(|p| p.len() < 8000 && p.is_ascii()));
        payloads.reverse();
        let mut chunks = Reassembler::new(&options());
        assert_eq!(reassemble(&mut chunks, &payloads), Some(sent));
        assert_eq!(chunks.bytes, 0, "nothing is held after a whole message");
        assert!(chunks.partial.is_empty());
    }

    #[test]
    fn interleaved_messages_are_kept_apart_and_duplicates_ignored() {
        let (a, b) = (
            event(json!({"a": "x".repeat(20_000)})),
            event(json!({"b": "y".repeat(20_000)})),
        );
        let pa = encode(&a, "a", 1 << 20).expect("a");
        let pb = encode(&b, "b", 1 << 20).expect("b");
        let mut chunks = Reassembler::new(&options());
        let mut got = Vec::new();
        for (x, y) in pa.iter().zip(&pb) {
            for payload in [x, x, y] {
                if let Some(json) = chunks.accept(payload) {
                    got.push(serde_json::from_str::<Event>(&json).expect("event"));
                }
            }
        }
        assert_eq!(got, vec![a, b]);
    }

    #[test]
    fn oversized_events_are_refused_and_partials_are_bounded() {
        let sent = event(json!({"text": "z".repeat(50_000)}));
        assert!(matches!(
            encode(&sent, "m", 10_000),
            Err(BrokerError::Unavailable(_))
        ));
        let payloads = encode(&sent, "m", 1 << 20).expect("encoded");
        let small = PgOptions {
            max_event_bytes: 10_000,
            ..options()
        };
        let mut chunks = Reassembler::new(&small);
        assert!(payloads.iter().all(|p| chunks.accept(p).is_none()));

        // Memory for two chunks only: a third message evicts the oldest.
        let tight = PgOptions {
            max_partial_bytes: 2 * CHUNK_DATA,
            ..options()
        };
        let mut chunks = Reassembler::new(&tight);
        for id in ["one", "two", "three"] {
            let payloads = encode(&sent, id, 1 << 20).expect("encoded");
            assert_eq!(chunks.accept(&payloads[0]), None);
            assert!(chunks.bytes <= 2 * CHUNK_DATA);
        }
        assert!(!chunks.partial.contains_key("one"), "the oldest went first");
        assert_eq!(chunks.partial.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn incomplete_messages_expire() {
        let sent = event(json!({"text": "z".repeat(20_000)}));
        let payloads = encode(&sent, "late", 1 << 20).expect("encoded");
        let mut chunks = Reassembler::new(&options());
        assert_eq!(chunks.accept(&payloads[0]), None);
        tokio::time::advance(options().partial_timeout + Duration::from_secs(1)).await;
        let other = encode(&sent, "fresh", 1 << 20).expect("encoded");
        assert_eq!(chunks.accept(&other[0]), None);
        assert!(!chunks.partial.contains_key("late"));
        assert!(payloads[1..].iter().all(|p| chunks.accept(p).is_none()));
    }

    #[test]
    fn foreign_payloads_are_skipped() {
        let mut chunks = Reassembler::new(&options());
        for payload in ["", "hello", "x:1:1:{}", "x:a:2:{}", ":0:1:{}", "x:0:0:"] {
            assert_eq!(chunks.accept(payload), None, "{payload:?}");
        }
        assert_eq!(chunks.accept("x:0:1:{}"), Some("{}".to_owned()));
    }

    #[test]
    fn channels_are_checked_and_derived_names_fit() {
        assert!(check_channel("tf_0123.events").is_ok());
        assert!(check_channel("tf-abc.events").is_ok());
        for bad in ["", "a\"b", "a b", "é", &"x".repeat(64)] {
            assert!(check_channel(bad).is_err(), "{bad:?}");
        }
        assert_eq!(channel_for("toolfleet"), "toolfleet.events");
        let long = "s".repeat(200);
        let (a, b) = (channel_for(&long), channel_for(&format!("{long}t")));
        assert!(a.len() <= MAX_CHANNEL && check_channel(&a).is_ok(), "{a}");
        assert_ne!(a, b, "long namespaces keep channels of their own");
    }
}
