//! How many deliveries a worker holds: its prefetch, deepened while its
//! pool's messages come and go quickly, back to its usual depth as soon as
//! they do not.
//!
//! A worker that holds more ahead of its slots claims and settles in larger
//! groups, each costing the store and the broker less per job, so a pool of
//! short jobs drains faster. But RabbitMQ closes a consumer's channel when a
//! message stays unacknowledged past its `consumer_timeout`, and every
//! message held waits its turn behind those before it: a deep prefetch is
//! only safe while messages leave the hand quickly. So a worker starts at
//! its usual depth (`concurrency + ahead`), deepens (to `concurrency +
//! ahead_max`) once a whole hand of deliveries left it quickly enough that
//! the deep hand would still turn over within [`SLOW`], and comes back as
//! soon as one delivery stayed longer than [`SLOW`] or none left for
//! [`STALL`] (jobs grown long, or the pool idle: the next burst starts at
//! the usual depth again).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

/// A delivery in hand longer than this brings the prefetch back to its
/// usual depth.
pub(crate) const SLOW: Duration = Duration::from_secs(1);

/// With no delivery leaving the hand for this long, the prefetch comes back
/// to its usual depth.
pub(crate) const STALL: Duration = Duration::from_secs(1);

/// Once back at its usual depth, the prefetch deepens again only after
/// this long: what the deep hand took is settled by then, and a pool of
/// mostly short jobs with a few long ones does not go back and forth.
pub(crate) const HOLD_DOWN: Duration = Duration::from_secs(5);

/// A worker's prefetch: the usual depth and the deep one, and the one it
/// wants now.
pub(crate) struct Depth {
    usual: u16,
    deep: u16,
    state: Mutex<State>,
    wanted: watch::Sender<u16>,
    /// Places in hand still to be taken out of the worker's semaphore
    /// since the prefetch came back: each is forgotten as it is given back.
    owed: AtomicUsize,
}

struct State {
    /// Deliveries that left the hand quickly, in a row.
    quick: usize,
    /// When the last one left.
    last: Instant,
    /// When the prefetch last came back to its usual depth.
    back: Option<Instant>,
    /// The prefetch the places in hand were last brought to.
    placed: u16,
}

impl Depth {
    /// A prefetch between `usual` and `deep`, at `usual` first.
    pub(crate) fn new(usual: u16, deep: u16) -> Arc<Depth> {
        Arc::new(Depth {
            usual,
            deep: deep.max(usual),
            state: Mutex::new(State {
                quick: 0,
                last: Instant::now(),
                back: None,
                placed: usual,
            }),
            wanted: watch::Sender::new(usual),
            owed: AtomicUsize::new(0),
        })
    }

    /// The prefetch wanted, as it changes.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u16> {
        self.wanted.subscribe()
    }

    /// The prefetch wanted now.
    pub(crate) fn wanted(&self) -> u16 {
        *self.wanted.borrow()
    }

    /// How long a delivery may stay in hand at the usual depth for the
    /// deep one to turn over within [`SLOW`]: a hand's time scales with
    /// its depth.
    fn quick(&self) -> Duration {
        SLOW.mul_f64(f64::from(self.usual) / f64::from(self.deep))
    }

    /// A delivery left the hand `age` after its message came.
    pub(crate) fn left(&self, age: Duration) {
        let mut state = lock(&self.state);
        state.last = Instant::now();
        let deep = self.wanted() == self.deep;
        if age > SLOW {
            state.quick = 0;
            if deep {
                self.come_back(&mut state);
            }
        } else if age <= self.quick() {
            state.quick = state.quick.saturating_add(1);
            let held_down = state.back.is_some_and(|back| back.elapsed() < HOLD_DOWN);
            if !deep && !held_down && state.quick >= usize::from(self.usual) {
                self.wanted.send_replace(self.deep);
            }
        } else {
            state.quick = 0;
        }
    }

    fn come_back(&self, state: &mut State) {
        state.quick = 0;
        state.back = Some(Instant::now());
        self.wanted.send_replace(self.usual);
    }

    /// Brings the prefetch back to its usual depth if no delivery left the
    /// hand for [`STALL`].
    pub(crate) fn check_stall(&self) {
        let mut state = lock(&self.state);
        if self.wanted() == self.deep && state.last.elapsed() >= STALL {
            self.come_back(&mut state);
        }
    }

    /// Brings the places in hand, `slots`, to `prefetch`: added at once
    /// when it deepens; when it comes back, those free are taken out at
    /// once and the rest as they are given back.
    pub(crate) fn resize(&self, slots: &Semaphore, prefetch: u16) {
        {
            let mut state = lock(&self.state);
            if state.placed == prefetch {
                return;
            }
            state.placed = prefetch;
        }
        let extra = usize::from(self.deep - self.usual);
        if prefetch == self.deep {
            let repaid = self
                .owed
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                    Some(owed.saturating_sub(extra))
                })
                .map_or(0, |owed| owed.min(extra));
            slots.add_permits(extra - repaid);
        } else {
            let taken = slots.forget_permits(extra);
            self.owed.fetch_add(extra - taken, Ordering::AcqRel);
        }
    }

    /// Whether a place given back is to be taken out rather than freed.
    fn take_owed(&self) -> bool {
        self.owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                owed.checked_sub(1)
            })
            .is_ok()
    }

    /// Checks for stalls until dropped.
    pub(crate) async fn watch_stalls(self: Arc<Self>) {
        let mut ticks = tokio::time::interval(STALL / 4);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            self.check_stall();
        }
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A delivery's place in hand: given back when dropped, telling its
/// [`Depth`] how long the delivery's message was held.
pub(crate) struct Place {
    permit: Option<OwnedSemaphorePermit>,
    received: Instant,
    depth: Option<Arc<Depth>>,
}

impl Place {
    /// The place `permit` of a delivery whose message came at `received`.
    pub(crate) fn new(
        permit: OwnedSemaphorePermit,
        received: Instant,
        depth: Option<Arc<Depth>>,
    ) -> Place {
        Place {
            permit: Some(permit),
            received,
            depth,
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(depth) = &self.depth {
            depth.left(self.received.elapsed());
            if depth.take_owed()
                && let Some(permit) = self.permit.take()
            {
                permit.forget();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUICKLY: Duration = Duration::from_millis(5);

    /// `n` deliveries left `depth` quickly.
    fn quick(depth: &Depth, n: usize) {
        for _ in 0..n {
            depth.left(QUICKLY);
        }
    }

    #[test]
    fn a_whole_hand_leaving_quickly_deepens_it() {
        let depth = Depth::new(10, 40);
        assert_eq!(depth.wanted(), 10);
        quick(&depth, 9);
        assert_eq!(depth.wanted(), 10, "nine of a hand of ten");
        depth.left(QUICKLY);
        assert_eq!(depth.wanted(), 40, "a whole hand left quickly");
    }

    #[test]
    fn a_delivery_held_too_long_for_the_deep_hand_starts_the_count_again() {
        let depth = Depth::new(10, 40);
        quick(&depth, 9);
        // Quick at 10, but a hand four times deeper would take over SLOW.
        depth.left(SLOW / 3);
        quick(&depth, 9);
        assert_eq!(depth.wanted(), 10, "the count started again");
        depth.left(QUICKLY);
        assert_eq!(depth.wanted(), 40);
    }

    #[test]
    fn one_slow_delivery_brings_it_back() {
        let depth = Depth::new(10, 40);
        quick(&depth, 10);
        assert_eq!(depth.wanted(), 40);
        depth.left(SLOW / 2);
        assert_eq!(
            depth.wanted(),
            40,
            "slower, but the deep hand turns over within SLOW"
        );
        depth.left(SLOW + Duration::from_millis(1));
        assert_eq!(depth.wanted(), 10, "held past SLOW");
    }

    #[test]
    fn a_hand_none_leaves_comes_back() {
        let depth = Depth::new(10, 40);
        quick(&depth, 10);
        depth.check_stall();
        assert_eq!(depth.wanted(), 40, "one left just now");
        lock(&depth.state).last = Instant::now() - STALL;
        depth.check_stall();
        assert_eq!(depth.wanted(), 10, "none left for STALL");
    }

    #[test]
    fn once_back_it_deepens_again_only_after_the_hold_down() {
        let depth = Depth::new(10, 40);
        quick(&depth, 10);
        depth.left(SLOW * 2);
        assert_eq!(depth.wanted(), 10, "back");
        quick(&depth, 30);
        assert_eq!(depth.wanted(), 10, "held down");
        lock(&depth.state).back = Some(Instant::now() - HOLD_DOWN);
        quick(&depth, 10);
        assert_eq!(depth.wanted(), 40, "deep again after the hold-down");
    }

    /// The places in hand follow the prefetch: added when it deepens,
    /// taken out when it comes back, those in use as they are given back.
    #[tokio::test]
    async fn the_places_in_hand_follow_the_prefetch() {
        let depth = Depth::new(2, 5);
        let slots = Arc::new(Semaphore::new(2));
        depth.resize(&slots, 5);
        assert_eq!(slots.available_permits(), 5);
        depth.resize(&slots, 5);
        assert_eq!(slots.available_permits(), 5, "once only");
        let place = |slots: &Arc<Semaphore>| {
            let permit = slots.clone().try_acquire_owned().expect("a place");
            Place::new(permit, Instant::now(), Some(depth.clone()))
        };
        let held: Vec<Place> = (0..4).map(|_| place(&slots)).collect();
        depth.resize(&slots, 2);
        assert_eq!(slots.available_permits(), 0, "the free one taken out");
        let mut held = held.into_iter();
        drop(held.next());
        drop(held.next());
        assert_eq!(
            slots.available_permits(),
            0,
            "two more taken out as given back"
        );
        drop(held.next());
        assert_eq!(slots.available_permits(), 1, "then given back");
        depth.resize(&slots, 5);
        assert_eq!(slots.available_permits(), 4, "three added back");
        drop(held);
        assert_eq!(slots.available_permits(), 5);
    }

    #[tokio::test]
    async fn a_place_tells_its_depth_when_it_is_given_back() {
        let depth = Depth::new(1, 4);
        let permits = Arc::new(tokio::sync::Semaphore::new(1));
        let permit = permits.clone().try_acquire_owned().unwrap();
        let place = Place::new(permit, Instant::now(), Some(depth.clone()));
        assert_eq!(permits.available_permits(), 0);
        drop(place);
        assert_eq!(permits.available_permits(), 1, "the place is given back");
        assert_eq!(depth.wanted(), 4, "a hand of one left quickly");
    }
}
