//! The acknowledgements of one consumer channel, sent in groups.
//!
//! A worker settles its deliveries out of order and, under load, many at
//! once (a grouped `succeed` answers a batch of jobs together). Each ack is
//! queued here and answered once sent; one flusher per channel sends what
//! is queued, all that came while it sent the last: the deliveries acknowledged below the channel's oldest one still
//! unsettled as one `basic.ack` with `multiple` (naming the highest), every
//! other one alone, at once, so that no delivery waits on a slower one and
//! holds a place under the prefetch. Requeues and rejects go at once, in
//! turn with the flusher, and leave the unsettled set only once sent.
//!
//! It must never send a `multiple` ack that reaches a delivery not
//! acknowledged by its holder (one still running, or being requeued or
//! rejected, or not handed out yet), nor name a delivery tag twice
//! (RabbitMQ closes the channel for an unknown tag): a tag is named only
//! from the queue, which holds each tag once, and a `multiple` ack covers
//! only tags below every unsettled one and below every one not seen yet.
//! A channel's tags count its deliveries from 1, but with two consumers on
//! the channel they may be handed out of order: one seen proves nothing
//! of those below it.
//! An ack that cannot be sent (the channel closed) is lost with the channel,
//! and RabbitMQ delivers the message again, as it does for every delivery
//! unsettled when a channel closes. Once the group's connection is gone,
//! nothing waits on a send any more: lapin may never answer one on a
//! connection it has closed, so every settlement still waiting answers that
//! its channel is gone, and the flusher ends.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::BasicAckOptions;
use tokio::sync::{Notify, watch};

use super::link::Shared;
use super::lock;

/// How long an idle flusher waits before looking whether its channel's
/// deliveries are all gone.
const IDLE: Duration = Duration::from_secs(1);

/// One channel's deliveries: those unsettled, and the acks to send.
pub(super) struct AckGroup {
    /// The connection of the group's channel, and its generation.
    link: Arc<Shared>,
    generation: u64,
    state: Mutex<Pending>,
    /// Held while a frame is sent: acks, requeues and rejects reach
    /// RabbitMQ one at a time, in the order the unsettled set saw them.
    turn: tokio::sync::Mutex<()>,
    queued: Notify,
    /// The last round of acks sent.
    sent: watch::Sender<u64>,
}

/// `A`: how an ack is sent (lapin's acker; a tag alone in the tests).
struct Pending<A = lapin::Acker> {
    /// Delivered and neither acknowledged nor sent back.
    open: BTreeSet<u64>,
    /// Acknowledged by their holder, not sent yet.
    acked: BTreeMap<u64, A>,
    /// Rounds of acks taken to be sent: those queued now go in the next.
    round: u64,
    /// Every tag up to this one has been delivered (tags start at 1).
    seen_through: u64,
    /// Tags delivered above `seen_through + 1`.
    seen_ahead: BTreeSet<u64>,
}

impl<A> Default for Pending<A> {
    fn default() -> Self {
        Pending {
            open: BTreeSet::new(),
            acked: BTreeMap::new(),
            round: 0,
            seen_through: 0,
            seen_ahead: BTreeSet::new(),
        }
    }
}

impl<A> Pending<A> {
    /// `tag` was delivered and is unsettled.
    fn delivered(&mut self, tag: u64) {
        self.open.insert(tag);
        self.seen(tag);
    }

    fn seen(&mut self, tag: u64) {
        if tag != self.seen_through + 1 {
            if tag > self.seen_through {
                self.seen_ahead.insert(tag);
            }
            return;
        }
        self.seen_through = tag;
        while self.seen_ahead.remove(&(self.seen_through + 1)) {
            self.seen_through += 1;
        }
    }

    /// The acks queued, to be sent as the next round, and its number.
    fn take_round(&mut self) -> (Plan<A>, u64) {
        let acked = std::mem::take(&mut self.acked);
        self.round += 1;
        (plan(acked, self.bound()), self.round)
    }

    /// The lowest tag a `multiple` ack must not reach: the oldest
    /// unsettled, or the first not seen.
    fn bound(&self) -> u64 {
        let unseen = self.seen_through.saturating_add(1);
        self.open
            .first()
            .map_or(unseen, |oldest| unseen.min(*oldest))
    }
}

/// What one flush sends: one `multiple` ack naming the highest of the
/// acknowledged tags below every unsettled one, then each other one alone.
#[derive(Debug, PartialEq)]
struct Plan<T> {
    multiple: Option<T>,
    single: Vec<T>,
}

/// Splits `acked` (ascending tags) around `below`, the lowest tag a
/// `multiple` ack must not reach.
fn plan<T>(acked: BTreeMap<u64, T>, below: u64) -> Plan<T> {
    let mut multiple = None;
    let mut single = Vec::new();
    for (tag, acker) in acked {
        if tag < below {
            // Ascending: the last one below names them all.
            multiple = Some(acker);
        } else {
            single.push(acker);
        }
    }
    Plan { multiple, single }
}

impl AckGroup {
    /// A group for a new channel on connection `generation`, its flusher
    /// running until the group's last delivery is settled and the consumer
    /// moved on, or the connection is gone.
    pub(super) fn start(link: Arc<Shared>, generation: u64) -> Arc<AckGroup> {
        let group = Arc::new(AckGroup {
            link,
            generation,
            state: Mutex::new(Pending::default()),
            turn: tokio::sync::Mutex::new(()),
            queued: Notify::new(),
            sent: watch::Sender::new(0),
        });
        tokio::spawn(Arc::clone(&group).flush());
        group
    }

    /// The group's connection is no longer the one in use.
    pub(super) fn is_gone(&self) -> bool {
        self.link.is_gone(self.generation)
    }

    async fn gone(&self) {
        self.link.gone(self.generation).await;
    }

    /// `tag` was delivered and is unsettled.
    pub(super) fn delivered(&self, tag: u64) {
        lock(&self.state).delivered(tag);
    }

    /// `tag` is acknowledged: answered once the flusher sent it, with
    /// the others that came meanwhile (false if the flusher or the
    /// connection is gone).
    pub(super) async fn ack(&self, tag: u64, acker: lapin::Acker) -> bool {
        let round = {
            let mut state = lock(&self.state);
            state.open.remove(&tag);
            state.acked.insert(tag, acker);
            state.round
        };
        let mut sent = self.sent.subscribe();
        self.queued.notify_one();
        tokio::select! {
            done = sent.wait_for(|done| *done > round) => done.is_ok(),
            () = self.gone() => false,
        }
    }

    /// Sends `tag` back (`send`: its requeue or reject) in turn with the
    /// acks, then lets the acks below it go. It goes however its caller
    /// fares (a timeout, an aborted task): a task of its own sends it, and
    /// the caller awaits that; `None` if that task died or the connection
    /// went first.
    pub(super) async fn settle_alone<F, T>(self: &Arc<Self>, tag: u64, send: F) -> Option<T>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let group = Arc::clone(self);
        let sending = tokio::spawn(async move {
            let sent = tokio::select! {
                sent = async {
                    let _turn = group.turn.lock().await;
                    send.await
                } => Some(sent),
                () = group.gone() => None,
            };
            lock(&group.state).open.remove(&tag);
            group.queued.notify_one();
            sent
        });
        sending.await.ok().flatten()
    }

    /// Sends what is queued, as it comes, until nothing more can come or
    /// the connection is gone.
    async fn flush(self: Arc<Self>) {
        tokio::select! {
            () = self.flush_rounds() => {}
            () = self.gone() => {}
        }
    }

    async fn flush_rounds(self: &Arc<Self>) {
        loop {
            let _ = tokio::time::timeout(IDLE, self.queued.notified()).await;
            let turn = self.turn.lock().await;
            let (planned, round) = lock(&self.state).take_round();
            if let Some(acker) = planned.multiple {
                let multiple = BasicAckOptions { multiple: true };
                if let Err(error) = acker.ack(multiple).await {
                    tracing::debug!(%error, "acknowledgements lost with their channel");
                }
            }
            for acker in planned.single {
                if let Err(error) = acker.ack(BasicAckOptions::default()).await {
                    tracing::debug!(%error, "an acknowledgement lost with its channel");
                }
            }
            drop(turn);
            self.sent.send_replace(round);
            // Only this task holds the group, and nothing is queued: no
            // delivery of its channel can settle any more.
            let idle = lock(&self.state).acked.is_empty();
            if idle && Arc::strong_count(self) == 1 {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acked(tags: &[u64]) -> BTreeMap<u64, u64> {
        tags.iter().map(|t| (*t, *t)).collect()
    }

    #[test]
    fn acks_below_the_oldest_unsettled_go_as_one_the_rest_alone() {
        let planned = plan(acked(&[1, 2, 3, 7, 9]), 5);
        assert_eq!(
            planned,
            Plan {
                multiple: Some(3),
                single: vec![7, 9]
            }
        );
    }

    #[test]
    fn with_nothing_unsettled_one_ack_names_them_all() {
        let planned = plan(acked(&[4, 5, 6]), u64::MAX);
        assert_eq!(
            planned,
            Plan {
                multiple: Some(6),
                single: vec![]
            }
        );
    }

    /// Tags seen out of order (two consumers on one channel): a round's
    /// `multiple` ack stops below the first not seen, and below the oldest
    /// unsettled.
    #[test]
    fn a_multiple_ack_never_reaches_a_tag_not_seen() {
        let mut pending = Pending::<u64>::default();
        for tag in [2, 3, 5] {
            pending.delivered(tag);
        }
        pending.acked = acked(&[2, 3, 5]);
        pending.open.clear();
        let (planned, round) = pending.take_round();
        assert_eq!(round, 1);
        assert_eq!(
            planned,
            Plan {
                multiple: None,
                single: vec![2, 3, 5]
            },
            "1 not seen: nothing may go as one"
        );
        pending.delivered(1);
        pending.delivered(4);
        pending.delivered(7);
        pending.open = [4].into();
        pending.acked = acked(&[1, 7]);
        let (planned, _) = pending.take_round();
        assert_eq!(
            planned,
            Plan {
                multiple: Some(1),
                single: vec![7]
            },
            "1 to 5 seen, 4 unsettled, 6 not seen"
        );
        pending.delivered(6);
        pending.delivered(2);
        pending.open.clear();
        pending.acked = acked(&[4, 6]);
        let (planned, round) = pending.take_round();
        assert_eq!(round, 3);
        assert_eq!(
            planned,
            Plan {
                multiple: Some(6),
                single: vec![]
            },
            "1 to 7 seen, none unsettled"
        );
    }

    #[test]
    fn an_unsettled_oldest_delivery_keeps_every_ack_alone() {
        let planned = plan(acked(&[2, 3]), 1);
        assert_eq!(
            planned,
            Plan {
                multiple: None,
                single: vec![2, 3]
            }
        );
        let none = plan(acked(&[]), 1);
        assert_eq!(
            none,
            Plan {
                multiple: None,
                single: vec![]
            }
        );
    }
}
