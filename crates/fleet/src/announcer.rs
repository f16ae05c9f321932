//! Announcing without waiting: events go to a bounded in-process queue that
//! one task publishes in order, so a job's path never waits on the notices'
//! round trip. Notices are best-effort by nature (the store holds the truth
//! and pollers read it); a queue that overflows drops events, and says so.

use std::sync::Arc;

use tokio::sync::mpsc;

/// Events published together at most.
const BATCH: usize = 256;

use toolfleet_broker::{Event, EventKind, EventState, Notices};
use toolfleet_store::JobRecord;

use crate::events::job_event;

/// Hands events to the publishing task.
#[derive(Clone)]
pub struct Announcer {
    queue: mpsc::Sender<Event>,
    /// Asked whether anyone listens before an event is made.
    notices: Arc<dyn Notices>,
}

impl Announcer {
    /// Spawns the task publishing to `notices`, holding at most `capacity` events.
    pub fn spawn(notices: Arc<dyn Notices>, capacity: usize) -> Announcer {
        let (queue, mut events) = mpsc::channel::<Event>(capacity.max(1));
        let publishing = Arc::clone(&notices);
        tokio::spawn(async move {
            let notices = publishing;
            let mut batch = Vec::with_capacity(BATCH);
            // A batch is published together, so a broker that confirms each
            // event is paid one round trip per batch, not per event; the
            // events of a batch are sent in queue order.
            while events.recv_many(&mut batch, BATCH).await > 0 {
                coalesce(&mut batch);
                if let Err(error) = notices.publish_all(&batch).await {
                    // Some of the batch may have gone; say which could not.
                    for event in &batch {
                        tracing_warn(event, &error.to_string());
                    }
                }
                batch.clear();
            }
        });
        Announcer { queue, notices }
    }

    /// Queues the event of `job` as it stands (see [`job_event`]), made
    /// only if someone may hear it ([`Notices::hears`]); never waits.
    pub fn announce_job(&self, job: &JobRecord, poll_after_s: u32) {
        let state = EventState::Job(job.state.shown());
        if self
            .notices
            .hears(&Event::key(&job.tenant, &job.tool, state))
        {
            self.announce(job_event(job, poll_after_s));
        }
    }

    /// Queues `event`; never waits.
    pub fn announce(&self, event: Event) {
        if let Err(error) = self.queue.try_send(event) {
            let event = match &error {
                mpsc::error::TrySendError::Full(e) | mpsc::error::TrySendError::Closed(e) => e,
            };
            tracing_warn(event, "the announcement queue is full or closed");
        }
    }
}

/// Leaves, of a job's events waiting together, only the last: a job that
/// ran and settled while the previous batch was out is announced settled,
/// not running and then settled, so under load each job costs one event
/// instead of two. An event of a settled job always goes (an event read
/// back from the store may follow a newer one), and tickets' events all go.
fn coalesce(batch: &mut Vec<Event>) {
    use std::collections::HashSet;
    if batch.len() < 2 {
        return;
    }
    let mut later: HashSet<(&str, &str)> = HashSet::new();
    let mut keep = vec![true; batch.len()];
    for (at, event) in batch.iter().enumerate().rev() {
        if event.kind != EventKind::Job {
            continue;
        }
        let seen_later = !later.insert((&event.tenant, &event.id));
        let settled = event.is_settled_job();
        if seen_later && !settled {
            keep[at] = false;
        }
    }
    let mut flags = keep.into_iter();
    batch.retain(|_| flags.next().unwrap_or(true));
}

fn tracing_warn(event: &Event, why: &str) {
    // This crate logs nothing of its own; stderr keeps the loss visible.
    eprintln!(
        "toolfleet: event {} {} not announced: {why}",
        event.id, event.state
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolfleet_broker::memory::MemoryNotices;

    fn event(n: usize) -> Event {
        Event {
            kind: toolfleet_broker::EventKind::Job,
            id: n.to_string(),
            tenant: "t".into(),
            tool: "x".into(),
            state: toolfleet_broker::EventState::parse("running").expect("a state"),
            run_id: "r".into(),
            body: Default::default(),
            callback: false,
            life: 0,
            ..Default::default()
        }
    }

    /// Of a job's events waiting together only the last goes, but a settled
    /// job's event always does; other jobs' and tickets' events all go, in
    /// order.
    #[test]
    fn a_jobs_events_waiting_together_leave_only_the_last() {
        let with = |n: usize, kind: &str, state: &str| Event {
            kind: if kind == "ticket" {
                EventKind::Ticket
            } else {
                EventKind::Job
            },
            state: toolfleet_broker::EventState::parse(state).expect("a state"),
            ..event(n)
        };
        let mut batch = vec![
            with(1, "job", "running"),
            with(2, "job", "running"),
            with(7, "ticket", "open"),
            with(1, "job", "succeeded"),
            with(7, "ticket", "answered"),
            with(3, "job", "queued"),
            with(4, "job", "failed"),
            with(4, "job", "retrying"),
        ];
        coalesce(&mut batch);
        let left: Vec<(&str, &str)> = batch
            .iter()
            .map(|e| (e.id.as_str(), e.state.as_str()))
            .collect();
        assert_eq!(
            left,
            [
                ("2", "running"),
                ("7", "open"),
                ("1", "succeeded"),
                ("7", "answered"),
                ("3", "queued"),
                ("4", "failed"),
                ("4", "retrying")
            ]
        );
    }

    #[tokio::test]
    async fn events_are_published_in_order_without_waiting() {
        let notices = Arc::new(MemoryNotices::new());
        let mut subscription = notices.subscribe().await.unwrap();
        let announcer = Announcer::spawn(notices.clone(), 16);
        for n in 0..10 {
            announcer.announce(event(n));
        }
        for n in 0..10 {
            let got = tokio::time::timeout(std::time::Duration::from_secs(5), subscription.next())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(got.id, n.to_string());
        }
    }

    /// Notices that hear nothing but outcomes, keeping what is published.
    struct Outcomes(MemoryNotices);

    #[async_trait::async_trait]
    impl Notices for Outcomes {
        async fn publish(&self, event: &Event) -> Result<(), toolfleet_broker::BrokerError> {
            self.0.publish(event).await
        }

        async fn subscribe(
            &self,
        ) -> Result<Box<dyn toolfleet_broker::Subscription>, toolfleet_broker::BrokerError>
        {
            self.0.subscribe().await
        }

        fn hears(&self, key: &str) -> bool {
            toolfleet_broker::settled_key(key)
        }
    }

    /// A job's event nobody may hear is not made; one somebody may is
    /// announced as it stands.
    #[tokio::test]
    async fn a_jobs_event_is_made_only_if_someone_may_hear_it() {
        use toolfleet_store::{Inserted, Store};
        let notices = MemoryNotices::new();
        let mut subscription = notices.subscribe().await.expect("subscribing");
        let announcer = Announcer::spawn(Arc::new(Outcomes(notices)), 16);
        let store = toolfleet_store::sqlite::SqliteStore::open_in_memory()
            .await
            .expect("a store");
        let now = toolfleet_core::now_ms();
        let Ok(Inserted::Created(queued)) = store.insert_job(crate::testing::new_job(now)).await
        else {
            panic!("a job recorded");
        };
        announcer.announce_job(&queued, 5);
        let mut done = queued.clone();
        done.state = toolfleet_core::JobState::Succeeded;
        announcer.announce_job(&done, 5);
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), subscription.next())
            .await
            .expect("an event in time")
            .expect("an event");
        assert_eq!(
            got,
            job_event(&done, 5),
            "the outcome, and nothing before it"
        );
    }
}
