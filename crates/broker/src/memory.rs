//! The in-process broker and notices of the embedded default, where one
//! process runs the dispatcher and the workers.
//!
//! This module owns a per-pool FIFO of job ids, the unacknowledged deliveries
//! of each consumer, a dead-letter list per pool, and a broadcast channel of
//! events. It must never be the record of a job: nothing here survives the
//! process, and it never needs to, because the store is the truth and refills
//! the queue at start. It never blocks a caller on a delay or a full queue;
//! it answers `Full` instead, and waits only where a consumer waits for work.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Notify, broadcast};

use toolfleet_core::TraceContext;

use crate::{Acker, Broker, BrokerError, Consumer, Delivery, Event, Notices, Subscription};

/// The bound of [`MemoryBroker::new`]: large enough never to matter to a
/// healthy fleet, small enough that a runaway producer meets `Full` before the
/// process runs out of memory.
pub const DEFAULT_CAPACITY: usize = 100_000;

/// The buffer of [`MemoryNotices::new`]: how far a subscriber may fall behind
/// before it starts skipping events.
pub const DEFAULT_NOTICE_BUFFER: usize = 1024;

/// The largest buffer [`MemoryNotices::with_capacity`] allocates.
pub const MAX_NOTICE_BUFFER: usize = 1 << 20;

/// The in-process [`Broker`]. Clones share one set of queues; the queues
/// close (consumers end) when [`MemoryBroker::close`] is called or the last
/// clone is dropped.
#[derive(Clone)]
pub struct MemoryBroker {
    handle: Arc<CloseOnDrop>,
}

/// Consumers, ackers and timers hold the [`Shared`] state itself, so only the
/// broker's own handles decide when the queues close.
struct CloseOnDrop(Arc<Shared>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

struct Shared {
    state: Mutex<State>,
    capacity: usize,
}

#[derive(Default)]
struct State {
    closed: bool,
    pools: HashMap<String, Pool>,
    /// One counter for consumer ids and delivery tags: both only need to be
    /// unique.
    next_id: u64,
}

#[derive(Default)]
struct Pool {
    ready: VecDeque<Message>,
    /// Delayed messages not yet ready; they hold a place under the bound so
    /// that their arrival never overflows it.
    scheduled: usize,
    /// Per consumer id, its unacknowledged deliveries by tag.
    unacked: HashMap<u64, BTreeMap<u64, Message>>,
    /// Woken on every change a waiting consumer may act on: a message became
    /// ready, a delivery was settled, or the broker closed. All waiters wake
    /// and look again, because only a consumer with room under its prefetch
    /// can take the message, and a single wake-up might reach a full one.
    changed: Arc<Notify>,
}

#[derive(Clone)]
struct Message {
    job_id: String,
    redelivered: bool,
    trace: Option<TraceContext>,
    dead_reason: Option<&'static str>,
}

/// How a delivery is settled.
#[derive(Clone, Copy)]
enum Settle {
    Ack,
    Requeue,
    Reject,
}

impl MemoryBroker {
    /// A broker whose pools each hold up to [`DEFAULT_CAPACITY`] messages.
    pub fn new() -> Self {
        Self::with_capacity(DEFAULT_CAPACITY)
    }

    /// A broker whose pools each hold up to `capacity` ready or scheduled
    /// messages; publishing beyond that answers [`BrokerError::Full`].
    pub fn with_capacity(capacity: usize) -> Self {
        let shared = Shared {
            state: Mutex::new(State::default()),
            capacity,
        };
        MemoryBroker {
            handle: Arc::new(CloseOnDrop(Arc::new(shared))),
        }
    }

    /// Ends every consumer and refuses further publishing. Messages still
    /// queued are dropped: the store refills the next broker.
    pub fn close(&self) {
        self.shared().close();
    }

    /// Delayed messages of `pool` whose delay has not run out: each holds
    /// a timer in this process until then.
    pub fn scheduled(&self, pool: &str) -> usize {
        let state = self.shared().lock();
        state.pools.get(pool).map_or(0, |p| p.scheduled)
    }

    /// The job ids rejected in `pool` and not yet taken from its dead
    /// letters ([`Broker::consume_dead`]), oldest first.
    pub fn dead_letters(&self, pool: &str) -> Vec<String> {
        let state = self.shared().lock();
        state
            .pools
            .get(&dead_queue(pool))
            .map(|p| p.ready.iter().map(|m| m.job_id.clone()).collect())
            .unwrap_or_default()
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.handle.0
    }
}

impl Default for MemoryBroker {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBroker")
            .field("capacity", &self.shared().capacity)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Broker for MemoryBroker {
    async fn ping(&self) -> Result<(), BrokerError> {
        self.shared().open().map(drop)
    }

    async fn publish_traced(
        &self,
        pool: &str,
        job_id: &str,
        trace: Option<&TraceContext>,
    ) -> Result<(), BrokerError> {
        self.shared().publish(pool, job_id, trace.cloned())
    }

    async fn publish_delayed_traced(
        &self,
        pool: &str,
        job_id: &str,
        delay: Duration,
        trace: Option<&TraceContext>,
    ) -> Result<(), BrokerError> {
        if delay.is_zero() {
            return self.shared().publish(pool, job_id, trace.cloned());
        }
        // Checked before reserving, so a refused call leaves no reservation.
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            BrokerError::Unavailable("publish_delayed needs a tokio runtime".into())
        })?;
        self.shared().reserve_scheduled(pool)?;
        let timer = Timer {
            shared: Arc::downgrade(self.shared()),
            pool: pool.to_owned(),
            job_id: job_id.to_owned(),
            trace: trace.cloned(),
            due: false,
        };
        runtime.spawn(timer.run(delay));
        Ok(())
    }

    async fn consume(&self, pool: &str, prefetch: u16) -> Result<Box<dyn Consumer>, BrokerError> {
        let (id, changed) = self.shared().register_consumer(pool)?;
        // AMQP reads 0 as "unlimited"; every queue here is bounded, so a
        // consumer always holds at least one and at most `prefetch`.
        let prefetch = usize::from(prefetch.max(1));
        Ok(Box::new(MemoryConsumer {
            shared: Arc::clone(self.shared()),
            pool: pool.to_owned(),
            id,
            prefetch,
            opened: prefetch,
            changed,
        }))
    }

    async fn depth(&self, pool: &str) -> Result<u64, BrokerError> {
        let state = self.shared().open()?;
        let ready = state.pools.get(pool).map_or(0, |p| p.ready.len());
        Ok(u64::try_from(ready).unwrap_or(u64::MAX))
    }

    async fn consume_dead(&self, pool: &str) -> Result<Box<dyn Consumer>, BrokerError> {
        self.consume(&dead_queue(pool), DEAD_PREFETCH).await
    }
}

/// How many dead letters a consumer of them holds at once.
const DEAD_PREFETCH: u16 = 16;

/// The queue of `pool`'s dead letters: a name no pool has (pool names hold
/// no NUL), so that its own rejects are dropped.
fn dead_queue(pool: &str) -> String {
    format!("{pool}{DEAD_SUFFIX}")
}

const DEAD_SUFFIX: &str = "\u{0}dead";

/// The timer of one delayed message. It holds the state weakly so that a
/// pending delay never keeps a dropped broker's queues alive, and it settles
/// its reservation when dropped, so a timer lost with its runtime does not
/// shrink the pool's bound for good.
struct Timer {
    shared: Weak<Shared>,
    pool: String,
    job_id: String,
    trace: Option<TraceContext>,
    due: bool,
}

impl Timer {
    async fn run(mut self, delay: Duration) {
        tokio::time::sleep(delay).await;
        self.due = true;
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            let job_id = std::mem::take(&mut self.job_id);
            shared.arrive(&self.pool, job_id, self.trace.take(), self.due);
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No critical section leaves the state half-changed, so a panic
        // elsewhere while holding the lock does not make it untrustworthy.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn open(&self) -> Result<MutexGuard<'_, State>, BrokerError> {
        let state = self.lock();
        if state.closed {
            return Err(BrokerError::Closed);
        }
        Ok(state)
    }

    fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        for pool in state.pools.values_mut() {
            pool.ready.clear();
            pool.changed.notify_waiters();
        }
    }

    fn publish(
        &self,
        pool: &str,
        job_id: &str,
        trace: Option<TraceContext>,
    ) -> Result<(), BrokerError> {
        let mut state = self.open()?;
        let pool_state = state.pools.entry(pool.to_owned()).or_default();
        self.check_room(pool, pool_state)?;
        pool_state.make_ready(job_id.to_owned(), trace);
        Ok(())
    }

    fn reserve_scheduled(&self, pool: &str) -> Result<(), BrokerError> {
        let mut state = self.open()?;
        let pool_state = state.pools.entry(pool.to_owned()).or_default();
        self.check_room(pool, pool_state)?;
        pool_state.scheduled += 1;
        Ok(())
    }

    fn check_room(&self, name: &str, pool: &Pool) -> Result<(), BrokerError> {
        if pool.ready.len() + pool.scheduled >= self.capacity {
            return Err(BrokerError::Full(format!(
                "pool '{name}' holds {} messages, its bound",
                self.capacity
            )));
        }
        Ok(())
    }

    /// Ends a delayed message's reservation and, when its delay is over,
    /// makes it ready. Its place was reserved when it was published, so it
    /// needs no room check; one lock for both keeps the bound exact.
    fn arrive(&self, pool: &str, job_id: String, trace: Option<TraceContext>, due: bool) {
        let mut state = self.lock();
        let closed = state.closed;
        let Some(pool_state) = state.pools.get_mut(pool) else {
            return;
        };
        pool_state.scheduled = pool_state.scheduled.saturating_sub(1);
        if due && !closed {
            pool_state.make_ready(job_id, trace);
        }
    }

    fn register_consumer(&self, pool: &str) -> Result<(u64, Arc<Notify>), BrokerError> {
        let mut state = self.open()?;
        let id = next_tag(&mut state.next_id);
        let pool_state = state.pools.entry(pool.to_owned()).or_default();
        pool_state.unacked.insert(id, BTreeMap::new());
        Ok((id, Arc::clone(&pool_state.changed)))
    }

    /// Hands the next ready message to `consumer` if it has room under its
    /// prefetch; `Err(Closed)` once the broker is closed or the consumer gone.
    fn take(
        &self,
        pool: &str,
        consumer: u64,
        prefetch: usize,
    ) -> Result<Option<(u64, Message)>, BrokerError> {
        let mut state = self.open()?;
        let State { pools, next_id, .. } = &mut *state;
        let pool_state = pools.get_mut(pool).ok_or(BrokerError::Closed)?;
        let unacked = pool_state
            .unacked
            .get_mut(&consumer)
            .ok_or(BrokerError::Closed)?;
        if unacked.len() >= prefetch {
            return Ok(None);
        }
        let Some(message) = pool_state.ready.pop_front() else {
            return Ok(None);
        };
        let tag = next_tag(next_id);
        unacked.insert(tag, message.clone());
        Ok(Some((tag, message)))
    }

    /// `Err(Closed)` when the delivery was already given back because its
    /// consumer was dropped: another consumer may hold it now.
    fn settle(&self, pool: &str, consumer: u64, tag: u64, how: Settle) -> Result<(), BrokerError> {
        let mut state = self.lock();
        let pool_state = state.pools.get_mut(pool).ok_or(BrokerError::Closed)?;
        let message = pool_state
            .unacked
            .get_mut(&consumer)
            .and_then(|unacked| unacked.remove(&tag))
            .ok_or(BrokerError::Closed)?;
        // Even an ack frees a place under the consumer's prefetch.
        pool_state.changed.notify_waiters();
        match how {
            Settle::Ack => {}
            Settle::Requeue => pool_state.give_back([message]),
            // A dead letter rejected is dropped, as from a queue without a
            // dead-letter exchange; any other message joins its pool's dead
            // letters, which must always take it (no bound).
            Settle::Reject if pool.ends_with(DEAD_SUFFIX) => {}
            Settle::Reject => {
                let dead = state.pools.entry(dead_queue(pool)).or_default();
                dead.ready.push_back(Message {
                    redelivered: false,
                    dead_reason: Some("rejected"),
                    ..message
                });
                dead.changed.notify_waiters();
            }
        }
        Ok(())
    }

    /// A dropped consumer's unacknowledged deliveries return to the queue, as
    /// they would from a closed AMQP channel.
    fn release_consumer(&self, pool: &str, consumer: u64) {
        let mut state = self.lock();
        let Some(pool_state) = state.pools.get_mut(pool) else {
            return;
        };
        if let Some(unacked) = pool_state.unacked.remove(&consumer) {
            pool_state.give_back(unacked.into_values());
            pool_state.changed.notify_waiters();
        }
    }
}

fn next_tag(counter: &mut u64) -> u64 {
    *counter += 1;
    *counter
}

impl Pool {
    fn make_ready(&mut self, job_id: String, trace: Option<TraceContext>) {
        self.ready.push_back(Message {
            job_id,
            redelivered: false,
            trace,
            dead_reason: None,
        });
        self.changed.notify_waiters();
    }

    /// Puts messages back at the front, oldest first, marked redelivered. A
    /// message given back was already accepted, so the bound does not apply.
    fn give_back(
        &mut self,
        messages: impl IntoIterator<Item = Message, IntoIter: DoubleEndedIterator>,
    ) {
        for mut message in messages.into_iter().rev() {
            message.redelivered = true;
            self.ready.push_front(message);
        }
    }
}

struct MemoryConsumer {
    shared: Arc<Shared>,
    pool: String,
    id: u64,
    prefetch: usize,
    /// The prefetch it was opened with: the least it holds.
    opened: usize,
    changed: Arc<Notify>,
}

#[async_trait]
impl Consumer for MemoryConsumer {
    /// Cancel-safe: a message is taken only between awaits, so a `next()`
    /// dropped while waiting (a timeout) loses nothing.
    async fn next(&mut self) -> Option<Delivery> {
        loop {
            // Registered before looking, so a change made between the look
            // and the wait still wakes this consumer.
            let mut changed = std::pin::pin!(self.changed.notified());
            changed.as_mut().enable();
            match self.shared.take(&self.pool, self.id, self.prefetch) {
                Err(_) => return None,
                Ok(Some((tag, message))) => return Some(self.delivery(tag, message)),
                Ok(None) => changed.await,
            }
        }
    }

    fn set_prefetch(&mut self, prefetch: u16) {
        self.prefetch = usize::from(prefetch).max(self.opened);
    }
}

impl MemoryConsumer {
    fn delivery(&self, tag: u64, message: Message) -> Delivery {
        let acker = MemoryAcker {
            shared: Arc::clone(&self.shared),
            pool: self.pool.clone(),
            consumer: self.id,
            tag,
            settled: false,
        };
        Delivery::new(message.job_id, message.redelivered, Box::new(acker))
            .with_trace(message.trace)
            .with_dead_reason(message.dead_reason.map(str::to_owned))
    }
}

impl Drop for MemoryConsumer {
    fn drop(&mut self) {
        self.shared.release_consumer(&self.pool, self.id);
    }
}

struct MemoryAcker {
    shared: Arc<Shared>,
    pool: String,
    consumer: u64,
    tag: u64,
    settled: bool,
}

impl MemoryAcker {
    fn settle(mut self, how: Settle) -> Result<(), BrokerError> {
        self.settled = true;
        self.shared.settle(&self.pool, self.consumer, self.tag, how)
    }
}

#[async_trait]
impl Acker for MemoryAcker {
    async fn ack(self: Box<Self>) -> Result<(), BrokerError> {
        self.settle(Settle::Ack)
    }

    async fn requeue(self: Box<Self>) -> Result<(), BrokerError> {
        self.settle(Settle::Requeue)
    }

    async fn reject(self: Box<Self>) -> Result<(), BrokerError> {
        self.settle(Settle::Reject)
    }
}

/// A delivery dropped unsettled (its worker panicked or gave up) goes back to
/// the queue at once instead of holding a place under the prefetch forever.
impl Drop for MemoryAcker {
    fn drop(&mut self) {
        if !self.settled {
            // Already given back if its consumer was dropped first; either
            // way the message is in the queue, so the answer does not matter.
            let _ = self
                .shared
                .settle(&self.pool, self.consumer, self.tag, Settle::Requeue);
        }
    }
}

/// The in-process [`Notices`]: two bounded broadcast channels, one of every
/// event and one of the outcomes alone ([`crate::SETTLED_STATES`], what
/// [`Notices::subscribe_settled`] hears). An event goes only to a channel
/// someone receives from, and [`Notices::hears`] answers whether it would
/// go to either: where every subscriber waits for outcomes (a worker's
/// cancels, long polls, an SSE stream of outcomes), a job's `queued` and
/// `running` events are not even made. Clones publish to the same
/// subscribers; subscriptions end when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct MemoryNotices {
    every: broadcast::Sender<Event>,
    settled: broadcast::Sender<Event>,
}

impl MemoryNotices {
    /// Notices whose subscribers may fall [`DEFAULT_NOTICE_BUFFER`] events
    /// behind before skipping.
    pub fn new() -> Self {
        Self::with_capacity(DEFAULT_NOTICE_BUFFER)
    }

    /// Notices whose subscribers may fall `buffer` events behind before
    /// skipping, between one and [`MAX_NOTICE_BUFFER`].
    pub fn with_capacity(buffer: usize) -> Self {
        // The channel refuses (panics on) zero and absurdly large buffers.
        let buffer = buffer.clamp(1, MAX_NOTICE_BUFFER);
        MemoryNotices {
            every: broadcast::channel(buffer).0,
            settled: broadcast::channel(buffer).0,
        }
    }
}

impl Default for MemoryNotices {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Notices for MemoryNotices {
    async fn publish(&self, event: &Event) -> Result<(), BrokerError> {
        // An error only says that nobody is subscribed, which is no failure:
        // events are announcements, not messages anyone must receive.
        if self.every.receiver_count() > 0 {
            let _ = self.every.send(event.clone());
        }
        if self.settled.receiver_count() > 0 && crate::SETTLED_STATES.contains(&event.state) {
            let _ = self.settled.send(event.clone());
        }
        Ok(())
    }

    async fn subscribe(&self) -> Result<Box<dyn Subscription>, BrokerError> {
        Ok(Box::new(MemorySubscription {
            receiver: self.every.subscribe(),
        }))
    }

    async fn subscribe_settled(&self) -> Result<Box<dyn Subscription>, BrokerError> {
        Ok(Box::new(MemorySubscription {
            receiver: self.settled.subscribe(),
        }))
    }

    fn hears(&self, key: &str) -> bool {
        self.every.receiver_count() > 0
            || (self.settled.receiver_count() > 0 && crate::settled_key(key))
    }
}

struct MemorySubscription {
    receiver: broadcast::Receiver<Event>,
}

#[async_trait]
impl Subscription for MemorySubscription {
    async fn next(&mut self) -> Option<Event> {
        loop {
            match self.receiver.recv().await {
                Ok(event) => return Some(event),
                // The channel already moved this receiver past what it
                // missed; carry on with the oldest event still held.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}
