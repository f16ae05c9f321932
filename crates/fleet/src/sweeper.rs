//! The sweeper: publishes again what the store says should run now and no
//! message will bring: jobs whose publish failed or whose dispatcher died
//! between the row and the message (the row is its own outbox), retries
//! whose delayed message was lost, and jobs whose worker stopped holding
//! their lease. It reads the store and publishes ids; it never changes a
//! job's state (a worker's claim does), and a duplicate it sends costs a
//! worker one failed claim.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use toolfleet_broker::{Broker, Notices};
use toolfleet_core::{JobState, Runtime, now_ms};
use toolfleet_store::{DueAfter, DueJobs, JobRecord, Store};

use crate::runs::{recover_loops, resume_stale};
use crate::tickets::{Deciding, sweep_tickets};

/// How often the sweeper passes: within a lease, at most every 10 s.
/// It is also how far ahead each pass publishes scheduled jobs, and the
/// horizon within which a dispatcher publishes a scheduled job at once
/// ([`crate::Dispatcher::with_horizon`]).
pub fn sweep_period(lease: Duration) -> Duration {
    lease.min(Duration::from_secs(10))
}

/// Every how many periods a pass publishes a queued job of a backlogged pool
/// again once it has waited this many.
const QUEUED_AGAIN_EVERY: i64 = 8;

/// How long a pass waits for a pool's queue to say whether it holds
/// messages ready, before it counts it empty (publishing as if it did).
const DEPTH_WAIT: Duration = Duration::from_secs(2);

/// Whether the pass of a sweep of `period` (milliseconds) that finds a job
/// queued `age` milliseconds ago publishes it again, `backlog` telling
/// whether its pool's queue holds messages ready. Never before a whole
/// period. While the queue holds none, at every pass, as a message that
/// was lost (a publish that failed past the outbox's retries, a broker that
/// lost it, a keyed job's wake that never went) is not waiting there. While
/// it holds some, the job's message most likely waits behind them: at the
/// pass in its first, second, fourth and eighth whole period of waiting,
/// then every eighth, a few duplicates for a wait of many periods instead
/// of one a pass, which would fill a slow pool's queue (and its depth,
/// which autoscalers read) with them. Passes come a period apart or a
/// little more, so now and then a job's wait skips a whole period between
/// two passes: skipping one of those named, it waits for the next.
pub fn publish_queued(age: i64, period: i64, backlog: bool) -> bool {
    if period <= 0 {
        return true;
    }
    match age.div_euclid(period) {
        i64::MIN..=0 => false,
        1 | 2 | 4 => true,
        whole => !backlog || whole % QUEUED_AGAIN_EVERY == 0,
    }
}

/// Due jobs of each kind one read of a pass asks the store for.
const PAGE: u32 = 1000;

/// Due jobs of each kind a periodic pass publishes at most: ten pages.
const PERIODIC_MOST: u32 = 10 * PAGE;

/// Publishes every job the store says should run now or within `ahead`:
/// at start (the in-process queue is empty after a restart) and then
/// periodically, for messages never confirmed, leases that expired, and
/// scheduled jobs and retries that fall due before the next pass (published
/// with the delay left, so they start on time). It reads them a page at a
/// time, up to `most` of each kind (waiting, scheduled, expired; rounded up
/// to a whole page), so a backlog longer than a page is published in one
/// pass, not a page a pass.
/// Given the sweep's `period`, a queued job is published again as
/// [`publish_queued`] says, its pool's queue asked (once a pass) whether it
/// holds messages ready when the answer matters (a queue that cannot say
/// counts as empty, and so does one this pass published to before it was
/// asked: what it holds may be the pass's own); without one (the first
/// sweep of an in-process fleet), every queued job. Duplicates are
/// harmless either way. A page's publishes
/// go at once, so a broker that groups publishes (RabbitMQ) carries them in
/// a few messages; the first failure, if any, is answered once all of its
/// page have been tried, and ends the pass.
pub async fn sweep(
    store: &dyn Store,
    broker: &dyn Broker,
    most: u32,
    period: Option<Duration>,
    ahead: Duration,
) -> Result<usize, String> {
    let now = now_ms();
    let ahead_ms = i64::try_from(ahead.as_millis()).unwrap_or(i64::MAX);
    let due_by = now.saturating_add(ahead_ms);
    let period_ms = period.map(|p| i64::try_from(p.as_millis()).unwrap_or(i64::MAX));
    let limit = PAGE.min(most).max(1);
    let mut after = DueAfter::default();
    let mut backlogged: HashMap<String, bool> = HashMap::new();
    let mut sent: HashSet<String> = HashSet::new();
    for _ in 0..most.div_ceil(limit).max(1) {
        let page = store
            .due_jobs(DueJobs {
                now,
                due_by,
                after: &after,
                limit,
            })
            .await
            .map_err(|e| e.to_string())?;
        let due: Vec<&JobRecord> = page
            .jobs
            .iter()
            .filter(|job| !sent.contains(&job.id))
            .collect();
        if let Some(period) = period_ms {
            ask_backlogs(broker, &due, now, period, &mut backlogged).await;
        }
        let stale: Vec<&JobRecord> = due
            .into_iter()
            .filter(|job| match period_ms {
                Some(period) if job.state == JobState::Queued => {
                    let backlog = backlogged.get(&job.pool).copied().unwrap_or(false);
                    publish_queued(now.saturating_sub(job.updated_at), period, backlog)
                }
                _ => true,
            })
            .collect();
        let published = futures_util::future::join_all(stale.iter().map(|job| {
            // Due later than now only while waiting (a taken-over job's
            // run_at is its old lease's end, already past).
            let wait = u64::try_from(job.run_at.saturating_sub(now)).unwrap_or(0);
            let delay = Duration::from_millis(wait);
            broker.publish_after_traced(&job.pool, &job.id, delay, job.trace.as_ref())
        }))
        .await;
        let failed = published.iter().find_map(|sent| sent.as_ref().err());
        for (job, _) in stale.iter().zip(&published).filter(|(_, p)| p.is_ok()) {
            sent.insert(job.id.clone());
            // What its queue holds now may be this pass's own: not asked.
            backlogged.entry(job.pool.clone()).or_insert(false);
        }
        if let Some(error) = failed {
            return Err(format!(
                "{error} ({} of the due jobs were published)",
                sent.len()
            ));
        }
        match page.next {
            Some(next) => after = next,
            None => break,
        }
    }
    Ok(sent.len())
}

/// Asks, at once, the queues of the pools of `due` not asked yet this pass
/// (nor published to) whether they hold messages ready, only those with a
/// queued job that only a backlog would hold back; a queue that does not
/// answer within [`DEPTH_WAIT`] counts as empty.
async fn ask_backlogs(
    broker: &dyn Broker,
    due: &[&JobRecord],
    now: i64,
    period: i64,
    backlogged: &mut HashMap<String, bool>,
) {
    let asked: HashSet<&str> = due
        .iter()
        .filter(|job| job.state == JobState::Queued && !backlogged.contains_key(&job.pool))
        .filter(|job| {
            let age = now.saturating_sub(job.updated_at);
            publish_queued(age, period, false) && !publish_queued(age, period, true)
        })
        .map(|job| job.pool.as_str())
        .collect();
    let answers = futures_util::future::join_all(asked.into_iter().map(|pool| async move {
        let depth = tokio::time::timeout(DEPTH_WAIT, broker.depth(pool)).await;
        (pool.to_owned(), matches!(depth, Ok(Ok(n)) if n > 0))
    }))
    .await;
    backlogged.extend(answers);
}

/// What the sweeper of people's tickets and waiting runs works on.
pub struct People {
    /// Tickets and runs.
    pub store: Arc<dyn Store>,
    /// Where woken jobs and runs' loops are published.
    pub broker: Arc<dyn Broker>,
    /// Where settled tickets and resumed runs are announced.
    pub notices: Arc<dyn Notices>,
    /// Runs the commits of approvals a stopped process left decided.
    pub runtime: Arc<Runtime>,
}

/// How long a decided ticket may go without its outcome before the sweeper
/// settles it (the deciding dispatcher stopped between the two).
const UNSETTLED_AFTER_MS: i64 = 30_000;
/// How long an assistant's run may go unwritten while running before the
/// sweeper looks whether its loop's job is alive.
const LOOP_QUIET_MS: i64 = 30_000;
/// How long a run may wait before the sweeper looks whether its wait holds
/// (a wake a crash missed).
const WAITING_AFTER_MS: i64 = 5_000;

/// Every `period` until `shutdown`: expires tickets past their time,
/// settles decided ones a stopped process left, and resumes waiting runs
/// whose wait holds. Several dispatchers may run it: each change is a
/// compare-and-set one of them wins.
pub async fn run_people_sweeper(
    people: People,
    period: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.changed() => return,
        }
        let on = Deciding {
            store: people.store.as_ref(),
            broker: people.broker.as_ref(),
            notices: people.notices.as_ref(),
            runtime: &people.runtime,
        };
        let now = now_ms();
        if let Err(error) = sweep_tickets(&on, now - UNSETTLED_AFTER_MS, 100).await {
            tracing::warn!(%error, "sweeping tickets failed");
        }
        let (store, broker, notices) = (on.store, on.broker, on.notices);
        if let Err(error) = resume_stale(store, broker, notices, now - WAITING_AFTER_MS, 100).await
        {
            tracing::warn!(%error, "sweeping waiting runs failed");
        }
        if let Err(error) = recover_loops(store, broker, notices, now - LOOP_QUIET_MS, 100).await {
            tracing::warn!(%error, "sweeping running runs failed");
        }
    }
}

/// Sweeps every `period` until `shutdown`; a queued job is republished once
/// it has waited a whole `period` (and stays in the queue's order otherwise),
/// while its pool has a backlog only now and then ([`publish_queued`]), and
/// what falls due within the next `period` is published with its delay.
pub async fn run_sweeper(
    store: Arc<dyn Store>,
    broker: Arc<dyn Broker>,
    period: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.changed() => return,
        }
        let swept = sweep(
            store.as_ref(),
            broker.as_ref(),
            PERIODIC_MOST,
            Some(period),
            period,
        )
        .await;
        if let Err(error) = swept {
            tracing::warn!(%error, "sweep failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queued job is published again at every pass once it waited a
    /// period while its pool's queue holds nothing ready; while it holds
    /// some, at the passes in its first, second, fourth and eighth whole
    /// period of waiting, then every eighth. Never while younger than a
    /// period.
    #[test]
    fn a_queued_job_behind_a_backlog_is_published_again_ever_less_often() {
        let period = 10_000;
        let passes = |backlog| -> Vec<i64> {
            (0..50)
                .filter(|whole| publish_queued(whole * period + 3_000, period, backlog))
                .collect()
        };
        assert_eq!(passes(true), [1, 2, 4, 8, 16, 24, 32, 40, 48]);
        assert_eq!(passes(false), (1..50).collect::<Vec<_>>());
        for backlog in [true, false] {
            assert!(!publish_queued(period - 1, period, backlog));
            assert!(publish_queued(period, period, backlog));
            assert!(
                !publish_queued(-5, period, backlog),
                "a clock a little behind"
            );
            assert!(publish_queued(0, 0, backlog), "no period: every pass");
        }
    }
}
