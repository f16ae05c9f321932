//! The connection of the moment ([`Link`]) and the supervisor that replaces
//! it: [`LinkState`] says whether it is up, the first call to find it lost
//! starts the one reconnect, with backoff, and each [`Feed`] (a worker's
//! consumer, a notices subscription) subscribes again by itself on the next
//! link. Every call to RabbitMQ is bounded here by the operation timeout.
//! It must never make a caller wait for a reconnect (while the link is down
//! a call answers [`BrokerError::Unavailable`] at once), nor start a second
//! supervisor for a loss already being repaired.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use futures_util::StreamExt;
use lapin::message::Delivery as LapinDelivery;
use lapin::options::ConfirmSelectOptions;
use lapin::{Channel, Connection, ConnectionProperties};
use rustls::ClientConfig;
use tokio::sync::watch;

use super::heard::Unheard;
use super::topology::{Declared, name};
use super::{RabbitOptions, lock};
use crate::BrokerError;

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

/// Consumers and the supervisor hold the [`Shared`] state itself, so only
/// the caller's handles decide when the connection closes.
pub(super) struct CloseOnDrop(pub(super) Arc<Shared>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
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
pub(super) struct Link {
    pub(super) generation: u64,
    pub(super) connection: Connection,
    /// In confirm mode; lapin serialises concurrent publishes on it.
    pub(super) publisher: Channel,
    /// What is declared on this connection. Declared again on the next one,
    /// in case the broker came back without it (a fresh node).
    ready: Mutex<HashSet<String>>,
    /// Held while a pool's queues (or a delay queue) are declared, so that
    /// publishes and consumers racing to a new queue declare it one at a
    /// time: RabbitMQ has nacked the first publishes to a quorum queue that
    /// several declared at once.
    pub(super) declaring: tokio::sync::Mutex<()>,
}

impl Link {
    fn is_open(&self) -> bool {
        self.connection.status().connected() && self.publisher.status().connected()
    }

    pub(super) fn is_ready(&self, name: &str) -> bool {
        lock(&self.ready).contains(name)
    }

    pub(super) fn mark_ready(&self, name: &str) {
        lock(&self.ready).insert(name.to_owned());
    }

    pub(super) fn forget(&self, name: &str) {
        lock(&self.ready).remove(name);
    }
}

/// The state behind a broker or notices handle: the connection of the
/// moment, and the supervisor replacing it.
pub(super) struct Shared {
    pub(super) url: String,
    /// How to speak TLS to an `amqps://` URL; `None` for `amqp://`.
    tls: Option<Arc<ClientConfig>>,
    pub(super) options: RabbitOptions,
    state: watch::Sender<LinkState>,
    generations: AtomicU64,
    pub(super) declared: Mutex<Declared>,
    /// The events' routing keys nobody listened for lately.
    pub(super) unheard: Arc<Unheard>,
}

/// The supervisor: the connection of the moment, noticing its loss, and
/// replacing it with backoff.
impl Shared {
    pub(super) async fn start(url: &str, options: RabbitOptions) -> Result<Arc<Self>, BrokerError> {
        name(&format!("{}.events", options.prefix))?;
        let tls = toolfleet_tls::amqp::tls_config(url, options.ca_file.as_deref())
            .map_err(BrokerError::Unavailable)?
            .map(Arc::new);
        let unheard = Arc::new(Unheard::new(options.unheard_for));
        let shared = Arc::new(Shared {
            url: url.to_owned(),
            tls,
            options,
            state: watch::Sender::new(LinkState::Down),
            generations: AtomicU64::new(0),
            declared: Mutex::default(),
            unheard,
        });
        let link = shared.open_link().await?;
        shared.state.send_replace(LinkState::Up(Arc::new(link)));
        Ok(shared)
    }

    pub(super) async fn open_link(&self) -> Result<Link, BrokerError> {
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
    pub(super) fn link(self: &Arc<Self>) -> Result<Arc<Link>, BrokerError> {
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

    pub(super) async fn until_closed(&self) {
        let mut states = self.state.subscribe();
        // An error means the sender is gone, which is closed too.
        let _ = states.wait_for(|s| matches!(s, LinkState::Closed)).await;
    }

    /// Completes once connection `generation` is no longer the one in use
    /// (lost, replaced or closed): its channels are gone, and RabbitMQ has
    /// put back what they held unsettled.
    pub(super) async fn gone(&self, generation: u64) {
        let mut states = self.state.subscribe();
        // An error means the sender is gone, which is gone too.
        let _ = states
            .wait_for(|s| !matches!(s, LinkState::Up(link) if link.generation == generation))
            .await;
    }

    pub(super) fn is_gone(&self, generation: u64) -> bool {
        !matches!(&*self.state.borrow(), LinkState::Up(link) if link.generation == generation)
    }

    fn is_closed(&self) -> bool {
        matches!(*self.state.borrow(), LinkState::Closed)
    }

    /// Passes `result` on, starting a reconnect if it failed because the
    /// connection is gone.
    pub(super) fn noting_loss<T>(
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

    pub(super) fn close(&self) {
        // Dropping the link closes the connection once the consumers, who
        // watch this state, have dropped their channels.
        self.state.send_replace(LinkState::Closed);
    }

    pub(super) async fn force_reconnect(self: &Arc<Self>) {
        let state = self.state.borrow().clone();
        if let LinkState::Up(link) = state {
            let _ = self
                .timed(link.connection.close(200, "toolfleet reconnecting".into()))
                .await;
            self.lost(link.generation);
        }
    }
}

/// Calls to RabbitMQ over a link, each bounded by the operation timeout.
impl Shared {
    /// A lapin call bounded by the operation timeout; a timeout reads as an
    /// IO error, which it most likely is.
    pub(super) async fn timed<T>(
        &self,
        call: impl Future<Output = lapin::Result<T>>,
    ) -> lapin::Result<T> {
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

    pub(super) async fn bounded<T>(
        &self,
        what: &str,
        call: impl Future<Output = lapin::Result<T>>,
    ) -> Result<T, BrokerError> {
        self.timed(call).await.map_err(|e| unavailable(what, &e))
    }

    pub(super) async fn channel(&self, link: &Link) -> Result<Channel, BrokerError> {
        self.bounded("opening a channel", link.connection.create_channel())
            .await
    }
}

pub(super) fn unavailable(what: &str, error: &lapin::Error) -> BrokerError {
    BrokerError::Unavailable(format!("{what}: {error}"))
}

fn reconnecting() -> BrokerError {
    BrokerError::Unavailable("the connection to RabbitMQ is down; reconnecting".into())
}

/// The URL without its password, for messages and logs.
pub(super) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

/// Numbers each subscription, so that deliveries say which channel they
/// came on.
static SUBSCRIPTIONS: AtomicU64 = AtomicU64::new(0);

/// One channel consuming one queue.
pub(super) struct Subscribed {
    pub(super) generation: u64,
    /// This subscription's channel among every one of the process: its
    /// deliveries' tags are counted on it.
    pub(super) serial: u64,
    pub(super) consumer: lapin::Consumer,
    /// A second consumer of the same queue on the same channel, and its
    /// prefetch: what a feed takes beyond its first consumer's prefetch
    /// ([`Feed::adjust`]).
    pub(super) extra: Option<(lapin::Consumer, u16)>,
    /// Held so that the channel lives exactly as long as the subscription:
    /// dropping it closes the channel and RabbitMQ requeues what was unacked.
    pub(super) channel: Channel,
}

impl Subscribed {
    /// The first consumer of `channel`, on connection `generation`.
    pub(super) fn new(generation: u64, consumer: lapin::Consumer, channel: Channel) -> Self {
        Subscribed {
            generation,
            serial: SUBSCRIPTIONS.fetch_add(1, Ordering::Relaxed),
            consumer,
            extra: None,
            channel,
        }
    }
}

/// What a consumer or subscription consumes, and where its messages go.
pub(super) trait Feed: Send + Sync + 'static {
    /// Opens a channel on `link` and starts consuming.
    fn subscribe(
        &self,
        shared: &Shared,
        link: &Link,
    ) -> impl Future<Output = Result<Subscribed, BrokerError>> + Send;
    /// Hands one message on, delivered on connection `generation` and the
    /// channel of subscription `serial`; false once nobody listens.
    fn forward(&self, generation: u64, serial: u64, delivery: LapinDelivery) -> bool;
    /// Completes once nobody listens.
    fn abandoned(&self) -> impl Future<Output = ()> + Send;
    /// Completes when the feed wants its subscription adjusted
    /// ([`Feed::adjust`]); never, for a feed that is not.
    fn wants_adjusting(&self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }
    /// Brings `sub` to what the feed wants now (a pool's prefetch); after
    /// an error the subscription ends and the feed subscribes again.
    fn adjust(
        &self,
        _shared: &Shared,
        _sub: &mut Subscribed,
    ) -> impl Future<Output = Result<(), BrokerError>> + Send {
        std::future::ready(Ok(()))
    }
}

/// Subscribes `feed` now, so a caller learns at once if it cannot, then
/// keeps it subscribed across reconnects in a task of its own.
pub(super) async fn start_feed<F: Feed>(shared: &Arc<Shared>, feed: F) -> Result<(), BrokerError> {
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
                // lapin follows an error with the end of the stream.
                Some(next) => {
                    if !hand_on(feed, &sub, next) {
                        return false;
                    }
                }
                None => {
                    shared.check(sub.generation);
                    return true;
                }
            },
            next = next_extra(&mut sub.extra) => match next {
                Some(next) => {
                    if !hand_on(feed, &sub, next) {
                        return false;
                    }
                }
                // Cancelled by RabbitMQ, or its channel closed (the first
                // consumer ends too): consumed again while the feed wants it.
                None => {
                    sub.extra = None;
                    if !adjusted(shared, feed, &mut sub).await {
                        return true;
                    }
                }
            },
            () = feed.wants_adjusting() => {
                if !adjusted(shared, feed, &mut sub).await {
                    return true;
                }
            }
        }
    }
}

/// Hands on what one of `sub`'s consumers gave; false once nobody listens.
fn hand_on<F: Feed>(feed: &F, sub: &Subscribed, next: lapin::Result<LapinDelivery>) -> bool {
    match next {
        Ok(delivery) => feed.forward(sub.generation, sub.serial, delivery),
        Err(error) => {
            tracing::debug!(%error, "consumer interrupted");
            true
        }
    }
}

/// Adjusts `sub` ([`Feed::adjust`]); false when it could not, and the
/// subscription is to end: its channel closes (RabbitMQ takes back what it
/// holds) and the feed subscribes again, rather than go on with a consumer
/// whose deliveries nobody reads.
async fn adjusted<F: Feed>(shared: &Arc<Shared>, feed: &F, sub: &mut Subscribed) -> bool {
    match feed.adjust(shared, sub).await {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(%error, "could not adjust a subscription; subscribing again");
            false
        }
    }
}

/// The next delivery of a subscription's second consumer; never, while it
/// has none.
async fn next_extra(
    extra: &mut Option<(lapin::Consumer, u16)>,
) -> Option<lapin::Result<LapinDelivery>> {
    match extra {
        Some((consumer, _)) => consumer.next().await,
        None => std::future::pending().await,
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

#[cfg(test)]
mod tests {
    use super::*;

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
