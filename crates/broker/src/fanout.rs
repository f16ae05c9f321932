//! One subscription per process and kind: [`Fanout`] wraps any [`Notices`]
//! so that every local subscriber (each `get_job` long poll, each SSE
//! stream, the webhook sender, each worker's cancel follower) shares a
//! single subscription of the wrapped notices, fanned out through a
//! broadcast ring. On RabbitMQ that is one queue per process (one for
//! outcomes and one for every event, where [`crate::split::Split`] puts two
//! fan-outs side by side) instead of one per subscriber; on PostgreSQL it is
//! one more ring in front of the one `LISTEN`.
//!
//! This module owns the shared subscription and its ring. The shared
//! subscription is made by the first `subscribe()`, before that call
//! returns, so every event published after a local `subscribe()` returns
//! reaches the local subscriber, as the trait promises. If the shared
//! subscription ends, it is made again (with backoff while that fails), and
//! a local `subscribe()` that finds none makes it itself, answering the
//! wrapped notices' error if it cannot. When an event arrives and no local
//! subscriber has been left for [`FanoutOptions::linger`], the shared
//! subscription ends (on RabbitMQ its queue goes, and nothing more is routed
//! to this process for it) until the next `subscribe()`. Publishing passes
//! straight through.
//!
//! What it does not promise: events published while the shared subscription
//! is being made again are missed (as when the wrapped notices reconnect),
//! and an event published shortly before a local `subscribe()` may still
//! reach it if the shared subscription had it in hand but had not yet
//! handed it on. Local subscriptions end when the last [`Fanout`] clone is
//! dropped or the wrapped notices close; a local subscriber too slow to keep
//! up skips the oldest events.
//! Every wait is bounded by [`FanoutOptions::subscribe_timeout`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::{broadcast, watch};

use crate::memory::{DEFAULT_NOTICE_BUFFER, MAX_NOTICE_BUFFER};
use crate::{BrokerError, Event, Notices, Subscription};

/// How deep the ring is and how the shared subscription is made.
#[derive(Clone, Debug)]
pub struct FanoutOptions {
    /// How far a local subscriber may fall behind before it skips events,
    /// between one and [`MAX_NOTICE_BUFFER`].
    pub buffer: usize,
    /// How long making the shared subscription may take before
    /// `subscribe()` answers [`BrokerError::Unavailable`].
    pub subscribe_timeout: Duration,
    /// The first pause between attempts to make an ended shared
    /// subscription again; it doubles, with jitter, up to `retry_max`.
    pub retry_min: Duration,
    /// The longest pause between those attempts.
    pub retry_max: Duration,
    /// How long the shared subscription outlives its last local
    /// subscriber: it ends at the first event after this long with none,
    /// so that subscribers coming and going do not make it again each time.
    pub linger: Duration,
}

impl Default for FanoutOptions {
    fn default() -> Self {
        FanoutOptions {
            buffer: DEFAULT_NOTICE_BUFFER,
            subscribe_timeout: Duration::from_secs(10),
            retry_min: Duration::from_millis(100),
            retry_max: Duration::from_secs(10),
            linger: Duration::from_secs(30),
        }
    }
}

impl FanoutOptions {
    fn backoff(&self) -> impl Iterator<Item = Duration> + use<> {
        ExponentialBuilder::default()
            .with_min_delay(self.retry_min)
            .with_max_delay(self.retry_max)
            .with_jitter()
            .without_max_times()
            .build()
    }
}

/// [`Notices`] sharing one subscription of `N` among every local
/// subscriber. Clones share it.
pub struct Fanout<N: Notices> {
    handle: Arc<CloseOnDrop<N>>,
}

impl<N: Notices> Clone for Fanout<N> {
    fn clone(&self) -> Self {
        Fanout {
            handle: Arc::clone(&self.handle),
        }
    }
}

/// The pump holds the [`Shared`] state itself, so only the caller's handles
/// decide when it stops.
struct CloseOnDrop<N: Notices>(Arc<Shared<N>>);

impl<N: Notices> Drop for CloseOnDrop<N> {
    fn drop(&mut self) {
        self.0.closed.send_replace(true);
    }
}

struct Shared<N> {
    notices: N,
    options: FanoutOptions,
    /// Dropped with the last holder of this state (the handles and the
    /// pump), which ends the local subscriptions.
    ring: broadcast::Sender<Event>,
    /// Held while the shared subscription is checked or made, so that only
    /// one is made at a time.
    slot: tokio::sync::Mutex<Slot>,
    closed: watch::Sender<bool>,
}

/// The shared subscription as `subscribe()` sees it.
#[derive(Default)]
struct Slot {
    /// Bumped for each shared subscription made by a local `subscribe()`;
    /// a pump whose generation is not current stops.
    generation: u64,
    /// A pump is forwarding a shared subscription.
    live: bool,
    /// Since when an event found no local subscriber, none having joined
    /// since.
    unheard_since: Option<tokio::time::Instant>,
}

/// What an attempt to make the shared subscription again came to.
enum Again {
    Made(Box<dyn Subscription>),
    Failed,
    /// Closed, or another pump took over.
    Stop,
}

impl<N: Notices> Fanout<N> {
    /// Wraps `notices` with the default [`FanoutOptions`].
    pub fn new(notices: N) -> Self {
        Self::with_options(notices, FanoutOptions::default())
    }

    /// Wraps `notices`. Nothing is subscribed until the first `subscribe()`.
    pub fn with_options(notices: N, options: FanoutOptions) -> Self {
        let (ring, _) = broadcast::channel(options.buffer.clamp(1, MAX_NOTICE_BUFFER));
        let shared = Shared {
            notices,
            options,
            ring,
            slot: tokio::sync::Mutex::new(Slot::default()),
            closed: watch::Sender::new(false),
        };
        Fanout {
            handle: Arc::new(CloseOnDrop(Arc::new(shared))),
        }
    }

    /// The wrapped notices.
    pub fn inner(&self) -> &N {
        &self.shared().notices
    }

    /// True while a shared subscription is being forwarded.
    pub async fn is_subscribed(&self) -> bool {
        self.shared().slot.lock().await.live
    }

    fn shared(&self) -> &Arc<Shared<N>> {
        &self.handle.0
    }
}

impl<N: Notices> std::fmt::Debug for Fanout<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fanout")
            .field("notices", &std::any::type_name::<N>())
            .field("options", &self.shared().options)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<N: Notices> Notices for Fanout<N> {
    async fn publish(&self, event: &Event) -> Result<(), BrokerError> {
        self.shared().notices.publish(event).await
    }

    /// Passed through too, so the wrapped notices batch as they do.
    async fn publish_all(&self, events: &[Event]) -> Result<(), BrokerError> {
        self.shared().notices.publish_all(events).await
    }

    fn hears(&self, key: &str) -> bool {
        self.shared().notices.hears(key)
    }

    async fn subscribe(&self) -> Result<Box<dyn Subscription>, BrokerError> {
        let shared = self.shared();
        if shared.is_closed() {
            return Err(BrokerError::Closed);
        }
        let limit = shared.options.subscribe_timeout;
        // Whoever holds the slot holds it at most one bounded subscribe.
        let mut slot = tokio::time::timeout(limit * 2, shared.slot.lock())
            .await
            .map_err(|_| {
                BrokerError::Unavailable(format!(
                    "the shared subscription was not ready within {:?}",
                    limit * 2
                ))
            })?;
        if !slot.live {
            let made = shared.subscribe_within().await?;
            slot.generation += 1;
            slot.live = true;
            tokio::spawn(pump(Arc::clone(shared), slot.generation, made));
        }
        // Only now: the shared subscription hears everything from here on.
        let events = shared.ring.subscribe();
        slot.unheard_since = None;
        drop(slot);
        Ok(Box::new(FanoutSubscription {
            events,
            closed: shared.closed.subscribe(),
        }))
    }
}

impl<N: Notices> Shared<N> {
    fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    async fn until_closed(&self) {
        let mut closed = self.closed.subscribe();
        // An error means the sender is gone, which is closed too.
        let _ = closed.wait_for(|c| *c).await;
    }

    async fn subscribe_within(&self) -> Result<Box<dyn Subscription>, BrokerError> {
        let limit = self.options.subscribe_timeout;
        match tokio::time::timeout(limit, self.notices.subscribe()).await {
            Ok(answer) => answer,
            Err(_) => Err(BrokerError::Unavailable(format!(
                "subscribing took over {limit:?}"
            ))),
        }
    }

    /// Whether pump `generation` should stop, its shared subscription
    /// ending with it: no local subscriber has been left for
    /// [`FanoutOptions::linger`] (the next `subscribe()` makes a new one),
    /// or another pump has taken over.
    async fn idle(&self, generation: u64) -> bool {
        let mut slot = self.slot.lock().await;
        if slot.generation != generation {
            return true;
        }
        // Local subscribers join the ring while holding the slot: none can
        // join between this count and marking the subscription gone.
        if self.ring.receiver_count() > 0 {
            return false;
        }
        let now = tokio::time::Instant::now();
        let since = *slot.unheard_since.get_or_insert(now);
        if now.duration_since(since) < self.options.linger {
            return false;
        }
        slot.live = false;
        true
    }

    /// Makes the shared subscription of pump `generation` again, unless a
    /// local `subscribe()` already made a newer one or the fan-out closed.
    async fn again(&self, generation: u64) -> Again {
        let mut slot = self.slot.lock().await;
        if slot.generation != generation || self.is_closed() {
            return Again::Stop;
        }
        match self.subscribe_within().await {
            Ok(made) => {
                slot.live = true;
                Again::Made(made)
            }
            Err(BrokerError::Closed) => {
                // The wrapped notices are closed for good: so is this, and
                // local subscriptions end as theirs would.
                slot.live = false;
                self.closed.send_replace(true);
                Again::Stop
            }
            Err(error) => {
                tracing::warn!(%error, "making the shared notices subscription again failed");
                slot.live = false;
                Again::Failed
            }
        }
    }
}

/// Forwards the shared subscription into the ring until the fan-out
/// closes, making it again whenever it ends.
async fn pump<N: Notices>(shared: Arc<Shared<N>>, generation: u64, first: Box<dyn Subscription>) {
    let mut current = first;
    loop {
        loop {
            let next = tokio::select! {
                () = shared.until_closed() => return,
                next = current.next() => next,
            };
            match next {
                Some(event) => {
                    // An error says that no local subscriber is listening:
                    // once none has been for the linger, the shared
                    // subscription ends, so that this process is no longer
                    // sent what nobody in it hears.
                    if shared.ring.send(event).is_err() && shared.idle(generation).await {
                        return;
                    }
                }
                None => break,
            }
        }
        tracing::warn!("the shared notices subscription ended; subscribing again");
        let mut pauses = shared.options.backoff();
        current = loop {
            match shared.again(generation).await {
                Again::Made(made) => break made,
                Again::Stop => return,
                Again::Failed => {}
            }
            let pause = pauses.next().unwrap_or(shared.options.retry_max);
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = shared.until_closed() => return,
            }
        };
    }
}

struct FanoutSubscription {
    events: broadcast::Receiver<Event>,
    closed: watch::Receiver<bool>,
}

#[async_trait]
impl Subscription for FanoutSubscription {
    async fn next(&mut self) -> Option<Event> {
        loop {
            let received = tokio::select! {
                // What the ring holds is handed out before the end.
                biased;
                received = self.events.recv() => received,
                _ = self.closed.wait_for(|c| *c) => return None,
            };
            match received {
                Ok(event) => return Some(event),
                // Already moved past what it missed; carry on.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}
