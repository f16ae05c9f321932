//! The dead letters: makes the store say what the broker did, so that the
//! broker's dead-lettered messages and the store's failed jobs agree.
//!
//! A pool's dead letters are the messages its workers rejected (a body that
//! names no job) and those the broker gave up delivering: RabbitMQ's
//! delivery limit (a message that came back unsettled too often, as from a
//! job that kills every worker taking it), or a policy's time or length
//! bound. Every dispatching process takes them from each pool's dead-letter
//! queue ([`Broker::consume_dead`]; competing consumers, each letter to
//! one) and, for each job id a letter the broker gave up on names, takes
//! the `dead_letter` transition: a job still waiting, or running under a
//! lease that ran out, fails with `dead_lettered` (`details.reason`, the
//! broker's), is announced, and wakes the runs waiting on it. A job a live
//! lease holds, parked or settled is left as it is (that letter was a
//! duplicate of a message already taken). A letter is acknowledged only
//! once the store has answered, so one the store could not take comes
//! again; the transition is a compare-and-set, so two processes taking
//! copies of one letter fail the job once.
//!
//! So the store's failed jobs are the one list of what did not run to the
//! end, and the dead-letter queue holds only letters on their way there:
//! none names a job the store does not show failed or still running, and
//! `POST /v1/jobs/{id}/retry` is the one way back for both. A rejected
//! letter (a worker's: no job id) is logged and taken away; the worker
//! counted it when it rejected it.

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use serde_json::json;
use tokio::sync::watch;
use toolfleet_broker::{Broker, Delivery, Notices};
use toolfleet_core::{ErrorCode, JobState, Runtime, ToolError, is_job_id, now_ms};
use toolfleet_store::{DeadLetter, Store};

use crate::job_event;
use crate::runs::{is_run_id, wake_runs};

/// The reason a broker gives a letter its worker rejected.
pub const REJECTED: &str = "rejected";

/// The pauses between tries of a letter the store could not take, before
/// it is given back: about a minute in all.
const STORE_PAUSES: [Duration; 7] = [
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(15),
    Duration::from_secs(30),
];

/// The `poll_after_s` of the announced job's envelope.
const POLL_AFTER_S: u32 = 5;

/// What the dead letters are reconciled with.
#[derive(Clone)]
pub struct Reconciler {
    /// Where the jobs are failed.
    pub store: Arc<dyn Store>,
    /// Whose dead letters are taken.
    pub broker: Arc<dyn Broker>,
    /// Where failed jobs are announced.
    pub notices: Arc<dyn Notices>,
    /// Counts each job failed, under its tool.
    pub runtime: Arc<Runtime>,
}

/// What became of one letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconciled {
    /// The job it names failed: it was waiting or its lease had run out.
    Failed(String),
    /// The job it names was left as it is: held by a live lease, parked,
    /// settled or missing.
    Left(String),
    /// A worker rejected it (no job id), or it names no job: taken away.
    Dropped,
    /// The store could not answer: the letter was given back.
    Kept,
}

impl Reconciler {
    /// Takes `pool`'s dead letters until `shutdown`, subscribing again
    /// (with backoff) whenever the broker refuses or the consumer ends.
    pub async fn run(self, pool: String, mut shutdown: watch::Receiver<bool>) {
        let mut backoff = pause();
        loop {
            let consumer = tokio::select! {
                biased;
                _ = shutdown.changed() => return,
                consumer = self.broker.consume_dead(&pool) => consumer,
            };
            match consumer {
                Ok(mut consumer) => loop {
                    let delivery = tokio::select! {
                        biased;
                        _ = shutdown.changed() => return,
                        delivery = consumer.next() => delivery,
                    };
                    let Some(delivery) = delivery else { break };
                    backoff = pause();
                    self.reconcile(&pool, delivery).await;
                },
                Err(error) => {
                    tracing::warn!(pool, %error, "consuming the dead letters failed; trying again");
                }
            }
            let wait = backoff.next().unwrap_or(Duration::from_secs(10));
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Reconciles one letter of `pool` and settles it with the broker.
    pub async fn reconcile(&self, pool: &str, delivery: Delivery) -> Reconciled {
        let reason = delivery.dead_reason.clone().unwrap_or_default();
        let id = delivery.job_id.clone();
        if reason == REJECTED || !is_job_id(&id) {
            let body: String = id.chars().take(64).collect();
            tracing::warn!(
                pool,
                body,
                reason,
                "a dead letter that names no job; dropped"
            );
            settle(delivery.ack().await, &id);
            return Reconciled::Dropped;
        }
        let error = ToolError::new(
            ErrorCode::DeadLettered,
            format!(
                "the broker gave up delivering this job's message ({reason}) before it finished; \
                 an operator may put it back with POST /v1/jobs/{id}/retry"
            ),
        )
        .with_details(json!({"reason": reason}));
        let answered = self.failed(&id, &error, delivery.died_at).await;
        match answered {
            Ok(Some(job)) => {
                tracing::warn!(pool, job_id = %id, reason, "a dead-lettered job failed");
                let tool = self.runtime.tool_label(&job.tool);
                self.runtime.metrics().job_state(tool, JobState::Failed);
                self.runtime.metrics().dead_letter(pool);
                if let Err(error) = self.notices.publish(&job_event(&job, POLL_AFTER_S)).await {
                    tracing::warn!(job_id = %id, %error, "announcing a dead-lettered job failed");
                }
                if is_run_id(&job.run_id) {
                    let (store, broker) = (self.store.as_ref(), self.broker.as_ref());
                    wake_runs(store, broker, self.notices.as_ref(), &id).await;
                }
                settle(delivery.ack().await, &id);
                Reconciled::Failed(id)
            }
            Ok(None) => {
                tracing::debug!(pool, job_id = %id, reason, "a dead letter of a job held, parked or settled; left as it is");
                settle(delivery.ack().await, &id);
                Reconciled::Left(id)
            }
            Err(error) => {
                tracing::warn!(pool, job_id = %id, %error, "the store could not take a dead letter; it comes again");
                settle(delivery.requeue().await, &id);
                Reconciled::Kept
            }
        }
    }

    /// The `dead_letter` transition of job `id`, tried again while the
    /// store is down (for about a minute), so that an outage does not
    /// hand the letter back again and again: a dead-letter queue may
    /// count those returns against a delivery limit of its own.
    async fn failed(
        &self,
        id: &str,
        error: &ToolError,
        died_at: Option<i64>,
    ) -> Result<Option<toolfleet_store::JobRecord>, toolfleet_store::StoreError> {
        let mut pauses = STORE_PAUSES.iter();
        loop {
            let dead = DeadLetter {
                id,
                error,
                now: now_ms(),
                died_at,
            };
            match self.store.dead_letter(dead).await {
                Err(error) => match pauses.next() {
                    Some(pause) => tokio::time::sleep(*pause).await,
                    None => return Err(error),
                },
                answered => return answered,
            }
        }
    }
}

/// Takes every pool's dead letters until `shutdown`: one task per pool.
pub async fn run_dead_letters(
    reconciler: Reconciler,
    pools: Vec<String>,
    shutdown: watch::Receiver<bool>,
) {
    let mut tasks = tokio::task::JoinSet::new();
    for pool in pools {
        tasks.spawn(reconciler.clone().run(pool, shutdown.clone()));
    }
    while tasks.join_next().await.is_some() {}
}

fn pause() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(10))
        .with_jitter()
        .without_max_times()
        .build()
}

fn settle(settled: Result<(), toolfleet_broker::BrokerError>, id: &str) {
    if let Err(error) = settled {
        tracing::warn!(job_id = %id, %error, "could not settle a dead letter; it comes again");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolfleet_broker::memory::{MemoryBroker, MemoryNotices};
    use toolfleet_broker::{Consumer, EventState};
    use toolfleet_store::ClaimJob;
    use toolfleet_store::sqlite::SqliteStore;

    const POOL: &str = "default";

    struct Rig {
        store: Arc<dyn Store>,
        broker: MemoryBroker,
        notices: MemoryNotices,
        reconciler: Reconciler,
    }

    async fn rig() -> Rig {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().await.expect("sqlite"));
        let (broker, notices) = (MemoryBroker::new(), MemoryNotices::new());
        let reconciler = Reconciler {
            store: store.clone(),
            broker: Arc::new(broker.clone()),
            notices: Arc::new(notices.clone()),
            runtime: Arc::new(Runtime::builder().build()),
        };
        Rig {
            store,
            broker,
            notices,
            reconciler,
        }
    }

    async fn queued(store: &dyn Store) -> String {
        let job = crate::testing::new_job(now_ms());
        let id = job.id.clone();
        store.insert_job(job).await.expect("insert");
        id
    }

    /// A letter of `id` as the broker would hand one out for `reason`, and
    /// the consumer holding it (whose drop would give it back).
    async fn letter(rig: &Rig, id: &str, reason: &str) -> (Box<dyn Consumer>, Delivery) {
        rig.broker.publish(POOL, id).await.expect("publish");
        let mut consumer = rig.broker.consume(POOL, 1).await.expect("consume");
        let mut delivery = consumer.next().await.expect("a delivery");
        delivery.dead_reason = Some(reason.to_owned());
        (consumer, delivery)
    }

    /// A job whose message the broker gave up on fails `dead_lettered`,
    /// with the broker's reason, is announced failed, and its letter is
    /// taken; a second copy of the letter changes nothing.
    #[tokio::test]
    async fn a_letter_the_broker_gave_up_on_fails_its_waiting_job() {
        let rig = rig().await;
        let id = queued(rig.store.as_ref()).await;
        let mut events = rig.notices.subscribe().await.expect("subscribe");
        let (_held, dead) = letter(&rig, &id, "delivery_limit").await;
        assert_eq!(
            rig.reconciler.reconcile(POOL, dead).await,
            Reconciled::Failed(id.clone())
        );
        let job = rig.store.job_by_id(&id).await.unwrap().expect("the job");
        assert_eq!(job.state, JobState::Failed);
        let error = job.error.expect("its error");
        assert_eq!(error.code, ErrorCode::DeadLettered);
        assert!(error.retryable);
        assert_eq!(error.details, Some(json!({"reason": "delivery_limit"})));
        let event = events.next().await.expect("an event");
        assert_eq!(
            (event.id.as_str(), event.state),
            (id.as_str(), EventState::Job(JobState::Failed))
        );
        assert_eq!(rig.broker.depth(POOL).await, Ok(0), "the letter was taken");
        let (_held, again) = letter(&rig, &id, "delivery_limit").await;
        assert_eq!(
            rig.reconciler.reconcile(POOL, again).await,
            Reconciled::Left(id)
        );
        assert_eq!(rig.broker.depth(POOL).await, Ok(0));
    }

    /// A letter of a job a live lease holds leaves the job running; one a
    /// worker rejected (no job id) is dropped from the dead letters.
    #[tokio::test]
    async fn a_held_job_is_left_and_a_rejected_letter_dropped() {
        let rig = rig().await;
        let id = queued(rig.store.as_ref()).await;
        let claim = ClaimJob {
            id: &id,
            worker: "w",
            now: now_ms(),
            lease_ms: 60_000,
        };
        rig.store.claim(claim).await.unwrap().expect("claimed");
        let (held, stale) = letter(&rig, &id, "delivery_limit").await;
        assert_eq!(
            rig.reconciler.reconcile(POOL, stale).await,
            Reconciled::Left(id.clone())
        );
        let job = rig.store.job_by_id(&id).await.unwrap().expect("the job");
        assert_eq!(job.state, JobState::Running);
        drop(held);

        rig.broker
            .publish(POOL, "not-a-job")
            .await
            .expect("publish");
        let mut consumer = rig.broker.consume(POOL, 1).await.expect("consume");
        let garbage = consumer.next().await.expect("a delivery");
        garbage.reject().await.expect("reject");
        assert_eq!(rig.broker.dead_letters(POOL), ["not-a-job"]);
        let mut dead = rig.broker.consume_dead(POOL).await.expect("consume dead");
        let letter = dead.next().await.expect("the dead letter");
        assert_eq!(letter.dead_reason.as_deref(), Some(REJECTED));
        assert_eq!(
            rig.reconciler.reconcile(POOL, letter).await,
            Reconciled::Dropped
        );
        drop(dead);
        assert!(rig.broker.dead_letters(POOL).is_empty(), "taken for good");
    }
}
