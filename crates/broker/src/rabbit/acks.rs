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
//! rejected), nor name a delivery tag twice (RabbitMQ closes the channel
//! for an unknown tag): a tag is named only from the queue, which holds each
//! tag once, and a `multiple` ack covers only tags below every unsettled one.
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

#[derive(Default)]
struct Pending {
    /// Delivered and neither acknowledged nor sent back.
    open: BTreeSet<u64>,
    /// Acknowledged by their holder, not sent yet.
    acked: BTreeMap<u64, lapin::Acker>,
    /// Rounds of acks taken to be sent: those queued now go in the next.
    round: u64,
}

/// What one flush sends: one `multiple` ack naming the highest of the
/// acknowledged tags below every unsettled one, then each other one alone.
#[derive(Debug, PartialEq)]
struct Plan<T> {
    multiple: Option<T>,
    single: Vec<T>,
}

/// Splits `acked` (ascending tags) around the oldest unsettled tag.
fn plan<T>(acked: BTreeMap<u64, T>, oldest_open: Option<u64>) -> Plan<T> {
    let below = oldest_open.unwrap_or(u64::MAX);
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

    /// The group's channel is on connection `generation`.
    pub(super) fn is_on(&self, generation: u64) -> bool {
        self.generation == generation
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
        lock(&self.state).open.insert(tag);
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
            let (planned, round) = {
                let mut state = lock(&self.state);
                let acked = std::mem::take(&mut state.acked);
                state.round += 1;
                (plan(acked, state.open.first().copied()), state.round)
            };
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
        let planned = plan(acked(&[1, 2, 3, 7, 9]), Some(5));
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
        let planned = plan(acked(&[4, 5, 6]), None);
        assert_eq!(
            planned,
            Plan {
                multiple: Some(6),
                single: vec![]
            }
        );
    }

    #[test]
    fn an_unsettled_oldest_delivery_keeps_every_ack_alone() {
        let planned = plan(acked(&[2, 3]), Some(1));
        assert_eq!(
            planned,
            Plan {
                multiple: None,
                single: vec![2, 3]
            }
        );
        let none = plan(acked(&[]), Some(1));
        assert_eq!(
            none,
            Plan {
                multiple: None,
                single: vec![]
            }
        );
    }
}
