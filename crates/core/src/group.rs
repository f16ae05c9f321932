//! Grouping: many callers' operations of one kind share one round trip (one
//! statement and one commit in a store, one message and one confirm on a
//! broker).
//!
//! A [`Group`] takes requests from any number of tasks and runs them in
//! batches through one function (a multi-row statement, say). Unless it
//! lingers (below), it never waits on a timer to fill a batch: a request
//! that finds a batch slot free goes at once (with those sent while the
//! batching task yields once, the rest of a burst already under way), so
//! a lightly loaded store answers as fast as without grouping; a request
//! made while no other is in flight runs in its caller's own task, a batch
//! of one without the hops to the batching task and back. Only while every slot is busy do requests queue, and
//! the next free slot takes all of them (up to a bound) in one statement.
//! Under load, then, the number of commits (or confirms) per second stays
//! near `slots` times the commit rate while the jobs per commit grow with
//! the load, which is what lets a database whose commit rate binds serve
//! many more jobs than commits.
//!
//! A group may *linger* ([`Group::spawn_lingering`]): a request made within
//! the linger of the last batch's start waits, at most until the linger has
//! passed since that start, for others to join it. Requests that come
//! further apart than the linger go at once as before; those that come
//! closer (one caller after another, each awaiting its answer) go a few to
//! a batch instead of one each, so a broker confirms one message for them.
//! Its owner may change the linger as it runs ([`Group::set_linger`]): a
//! broker's publisher lingers longer while no consumer could take what it
//! sends.
//!
//! Each request gets its own answer; a batch that fails as a whole answers
//! every request in it with the same error.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

/// The errors of a grouped operation.
pub trait GroupError: Clone + Send + 'static {
    /// The error of a request its group could not answer: the group is
    /// closed, or its batch was dropped or answered short.
    fn unanswered(message: String) -> Self;
}

type Reply<O, E> = oneshot::Sender<Result<O, E>>;

/// What runs a batch.
type RunBatch<R, O, E> =
    Arc<dyn Fn(Vec<R>) -> BoxFuture<'static, Result<Vec<Result<O, E>>, E>> + Send + Sync>;

/// Runs requests of type `R` in batches; each answers an `O` or an `E`.
pub struct Group<R, O, E> {
    requests: mpsc::UnboundedSender<(R, Reply<O, E>)>,
    what: &'static str,
    run: RunBatch<R, O, E>,
    slots: Arc<Semaphore>,
    /// Requests made and not yet answered, of either path.
    in_flight: Arc<AtomicUsize>,
    /// When the last batch started, and how long after it a request waits.
    pace: Arc<Pace>,
}

/// The linger of a group and when its last batch started.
struct Pace {
    /// The linger in microseconds (zero: none).
    linger: AtomicU64,
    born: Instant,
    /// Microseconds from `born` to the last batch's start, plus one (zero:
    /// none yet).
    last: AtomicU64,
}

impl Pace {
    fn linger(&self) -> Duration {
        Duration::from_micros(self.linger.load(Ordering::Relaxed))
    }

    /// A batch starts now (noted only while the group lingers).
    fn started(&self) {
        if self.linger().is_zero() {
            return;
        }
        let since = self.born.elapsed().as_micros();
        let since = u64::try_from(since).unwrap_or(u64::MAX - 1);
        self.last.store(since + 1, Ordering::Release);
    }

    /// How long a request made now waits for others: what is left of the
    /// linger since the last batch's start.
    fn wait(&self) -> Duration {
        let linger = self.linger();
        if linger.is_zero() {
            return Duration::ZERO;
        }
        let last = match self.last.load(Ordering::Acquire) {
            0 => return Duration::ZERO,
            n => Duration::from_micros(n - 1),
        };
        (last + linger).saturating_sub(self.born.elapsed())
    }
}

/// Counts a request in flight until dropped.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<R: Send + 'static, O: Send + 'static, E: GroupError> Group<R, O, E> {
    /// Spawns the batching task. `run` gets a batch and answers one result
    /// per request, in the batch's order. At most `slots` batches run at
    /// once, each of at most `max_batch` requests.
    pub fn spawn<F, Fut>(what: &'static str, slots: usize, max_batch: usize, run: F) -> Self
    where
        F: Fn(Vec<R>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Result<O, E>>, E>> + Send + 'static,
    {
        Self::spawn_lingering(what, slots, max_batch, Duration::ZERO, run)
    }

    /// As [`Group::spawn`], a request made within `linger` of the last
    /// batch's start waiting for others until `linger` has passed since it.
    pub fn spawn_lingering<F, Fut>(
        what: &'static str,
        slots: usize,
        max_batch: usize,
        linger: Duration,
        run: F,
    ) -> Self
    where
        F: Fn(Vec<R>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Result<O, E>>, E>> + Send + 'static,
    {
        let (requests, mut queue) = mpsc::unbounded_channel::<(R, Reply<O, E>)>();
        let slots = Arc::new(Semaphore::new(slots.max(1)));
        let max_batch = max_batch.max(1);
        let run: RunBatch<R, O, E> = Arc::new(move |batch| Box::pin(run(batch)));
        let group = Group {
            requests,
            what,
            run: run.clone(),
            slots: slots.clone(),
            in_flight: Arc::new(AtomicUsize::new(0)),
            pace: Arc::new(Pace {
                linger: AtomicU64::new(micros(linger)),
                born: Instant::now(),
                last: AtomicU64::new(0),
            }),
        };
        let pace = group.pace.clone();
        tokio::spawn(async move {
            let mut waiting = Vec::with_capacity(max_batch);
            loop {
                // A slot first: while none is free, requests gather in the queue.
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                if queue.recv_many(&mut waiting, max_batch).await == 0 {
                    return; // Every handle is gone.
                }
                // Close behind the last batch: let others join, a while.
                let wait = pace.wait();
                if !wait.is_zero() && waiting.len() < max_batch {
                    tokio::time::sleep(wait).await;
                }
                // Requests made together (the ids of one message, the calls
                // a commit released) reach the queue a moment apart: one
                // yield lets the tasks already running add theirs, without
                // waiting on a timer.
                if waiting.len() < max_batch {
                    tokio::task::yield_now().await;
                    while waiting.len() < max_batch {
                        match queue.try_recv() {
                            Ok(request) => waiting.push(request),
                            Err(_) => break,
                        }
                    }
                }
                let batch = std::mem::replace(&mut waiting, Vec::with_capacity(max_batch));
                pace.started();
                let run = run.clone();
                tokio::spawn(async move {
                    let (requests, replies): (Vec<R>, Vec<Reply<O, E>>) = batch.into_iter().unzip();
                    let count = requests.len();
                    let answers = run(requests).await;
                    drop(slot);
                    match answers {
                        Ok(answers) if answers.len() == count => {
                            for (reply, answer) in replies.into_iter().zip(answers) {
                                let _ = reply.send(answer);
                            }
                        }
                        Ok(answers) => {
                            let error: E = short(what, count, answers.len());
                            for reply in replies {
                                let _ = reply.send(Err(error.clone()));
                            }
                        }
                        Err(error) => {
                            for reply in replies {
                                let _ = reply.send(Err(error.clone()));
                            }
                        }
                    }
                });
            }
        });
        group
    }

    /// Changes the linger from the next request on (zero: none); a request
    /// already waiting keeps the wait it began.
    pub fn set_linger(&self, linger: Duration) {
        self.pace.linger.store(micros(linger), Ordering::Relaxed);
    }

    /// The linger now.
    pub fn linger(&self) -> Duration {
        self.pace.linger()
    }

    /// Runs `request` in the next batch and answers its result. A request
    /// made while no other is in flight, with a slot free beside the one
    /// the batching task waits with, and not within the linger of the last
    /// batch's start, runs at once in the caller's task: a batch of one,
    /// without the hops to the batching task and back.
    pub async fn run(&self, request: R) -> Result<O, E> {
        let alone = self.in_flight.fetch_add(1, Ordering::AcqRel) == 0;
        let _counted = InFlight(self.in_flight.clone());
        if alone
            && self.pace.wait().is_zero()
            && let Ok(slot) = self.slots.clone().try_acquire_owned()
        {
            self.pace.started();
            let answers = (self.run)(vec![request]).await;
            drop(slot);
            let answers = answers?;
            let answered = answers.len();
            return match <[_; 1]>::try_from(answers) {
                Ok([answer]) => answer,
                Err(_) => Err(short(self.what, 1, answered)),
            };
        }
        let (reply, answer) = oneshot::channel();
        self.requests
            .send((request, reply))
            .map_err(|_| E::unanswered(format!("{}: closed", self.what)))?;
        answer.await.map_err(|_| {
            E::unanswered(format!("{}: the batch was dropped unanswered", self.what))
        })?
    }
}

/// `linger` in whole microseconds, at most `u64::MAX`.
fn micros(linger: Duration) -> u64 {
    u64::try_from(linger.as_micros()).unwrap_or(u64::MAX)
}

/// The error of a batch of `count` that answered `answered` results.
fn short<E: GroupError>(what: &str, count: usize, answered: usize) -> E {
    E::unanswered(format!(
        "{what}: a batch of {count} answered {answered} results"
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    enum TestError {
        Unavailable(String),
    }

    impl GroupError for TestError {
        fn unanswered(message: String) -> Self {
            TestError::Unavailable(message)
        }
    }

    #[tokio::test]
    async fn a_lone_request_runs_at_once_in_a_batch_of_one() {
        let sizes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = sizes.clone();
        let group = Group::<u32, u32, TestError>::spawn("double", 2, 16, move |batch: Vec<u32>| {
            seen.lock().unwrap().push(batch.len());
            async move { Ok(batch.into_iter().map(|n| Ok(n * 2)).collect()) }
        });
        assert_eq!(group.run(21).await, Ok(42));
        assert_eq!(*sizes.lock().unwrap(), vec![1]);
    }

    /// A request made alone runs in the caller's own task while a slot is
    /// free beside the batching task's; with a single slot (the batching
    /// task's) it goes through the batching task.
    #[tokio::test]
    async fn a_lone_request_runs_in_its_callers_task_while_a_slot_is_free() {
        for (slots, inline) in [(2, true), (1, false)] {
            let group = Group::<u32, Option<tokio::task::Id>, TestError>::spawn(
                "where",
                slots,
                16,
                |batch: Vec<u32>| async move {
                    Ok(batch
                        .into_iter()
                        .map(|_| Ok(tokio::task::try_id()))
                        .collect())
                },
            );
            let caller = tokio::spawn(async move {
                let ran_in = group.run(1).await.expect("answered");
                (tokio::task::id(), ran_in)
            });
            let (caller, ran_in) = caller.await.expect("the caller ran");
            assert_eq!(ran_in == Some(caller), inline, "{slots} slots");
        }
    }

    /// A request sent a moment after the one that woke the group (by a task
    /// that was already running, as the ids of one message are) joins its
    /// batch rather than going in the next.
    #[tokio::test(flavor = "current_thread")]
    async fn requests_made_together_share_a_batch_though_one_woke_the_group() {
        let sizes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = sizes.clone();
        let group = Arc::new(Group::<u32, u32, TestError>::spawn(
            "together",
            1,
            16,
            move |batch: Vec<u32>| {
                seen.lock().unwrap().push(batch.len());
                async move { Ok(batch.into_iter().map(Ok).collect()) }
            },
        ));
        // Let the group wait for its first request.
        tokio::task::yield_now().await;
        let calls = {
            let group = group.clone();
            tokio::spawn(async move {
                // The first request is sent (its call polled once), which
                // wakes the group; only then are the others' tasks started,
                // behind the group.
                let mut first = Box::pin(group.run(1));
                std::future::poll_fn(|cx| {
                    let _ = first.as_mut().poll(cx);
                    std::task::Poll::Ready(())
                })
                .await;
                let later: Vec<_> = (2..=3u32)
                    .map(|n| {
                        let group = group.clone();
                        tokio::spawn(async move { group.run(n).await })
                    })
                    .collect();
                let mut answers = vec![first.await];
                for call in later {
                    answers.push(call.await.unwrap());
                }
                answers
            })
        };
        assert_eq!(calls.await.unwrap(), [Ok(1), Ok(2), Ok(3)]);
        assert_eq!(*sizes.lock().unwrap(), vec![3]);
    }

    #[tokio::test]
    async fn requests_waiting_for_a_slot_share_one_batch_and_each_gets_its_answer() {
        let batches = Arc::new(AtomicUsize::new(0));
        let counted = batches.clone();
        let group = Arc::new(Group::<u32, u32, TestError>::spawn(
            "slow",
            1,
            1000,
            move |batch: Vec<u32>| {
                counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok(batch.into_iter().map(|n| Ok(n + 1)).collect())
                }
            },
        ));
        let calls: Vec<_> = (0..100u32)
            .map(|n| {
                let group = group.clone();
                tokio::spawn(async move { (n, group.run(n).await) })
            })
            .collect();
        for call in calls {
            let (n, answer) = call.await.unwrap();
            assert_eq!(answer, Ok(n + 1));
        }
        // The first request (or few) ran alone; the rest waited and shared.
        let batches = batches.load(Ordering::SeqCst);
        assert!(batches <= 3, "100 requests took {batches} batches");
    }

    #[tokio::test]
    async fn a_failed_batch_answers_every_request_with_its_error_and_a_short_one_too() {
        let group =
            Group::<u32, u32, TestError>::spawn("broken", 1, 8, |batch: Vec<u32>| async move {
                if batch.contains(&0) {
                    Err(TestError::Unavailable("down".into()))
                } else {
                    Ok(Vec::new())
                }
            });
        assert_eq!(
            group.run(0).await,
            Err::<u32, _>(TestError::Unavailable("down".into()))
        );
        let short = group.run(1).await;
        assert!(matches!(short, Err(TestError::Unavailable(m)) if m.contains("answered 0")));
    }

    #[tokio::test]
    async fn at_most_slots_batches_run_at_once() {
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (r, m) = (running.clone(), most.clone());
        let group = Arc::new(Group::<u32, u32, TestError>::spawn(
            "bounded",
            3,
            2,
            move |batch: Vec<u32>| {
                let (r, m) = (r.clone(), m.clone());
                async move {
                    let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                    m.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    r.fetch_sub(1, Ordering::SeqCst);
                    Ok(batch.into_iter().map(Ok).collect())
                }
            },
        ));
        let calls: Vec<_> = (0..40u32)
            .map(|n| {
                let group = group.clone();
                tokio::spawn(async move { group.run(n).await })
            })
            .collect();
        for call in calls {
            assert!(call.await.unwrap().is_ok());
        }
        let most = most.load(Ordering::SeqCst);
        assert!((1..=3).contains(&most), "{most} batches ran at once");
    }

    /// The batches a test's group ran, in order.
    type Batches = Arc<std::sync::Mutex<Vec<Vec<u32>>>>;

    /// A group lingering `linger`, recording the batches it runs.
    fn lingering(linger: Duration) -> (Arc<Group<u32, u32, TestError>>, Batches) {
        let batches = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = batches.clone();
        let group = Group::spawn_lingering("linger", 2, 16, linger, move |batch: Vec<u32>| {
            seen.lock().unwrap().push(batch.clone());
            async move { Ok(batch.into_iter().map(Ok).collect()) }
        });
        (Arc::new(group), batches)
    }

    /// Runs `first` in a task of its own and `then` 10 ms later; both
    /// answers.
    async fn ten_ms_apart(
        group: &Arc<Group<u32, u32, TestError>>,
        first: u32,
        then: u32,
    ) -> (Result<u32, TestError>, Result<u32, TestError>) {
        let earlier = tokio::spawn({
            let group = group.clone();
            async move { group.run(first).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let later = group.run(then).await;
        (earlier.await.expect("the earlier caller"), later)
    }

    /// Requests one after another, each awaited, within the linger of the
    /// last batch's start: the next waits for others (here one made 10 ms
    /// later joins it), at most until the linger has passed since that start.
    #[tokio::test(start_paused = true)]
    async fn requests_close_behind_a_batch_wait_for_others_within_the_linger() {
        let linger = Duration::from_millis(100);
        let (group, batches) = lingering(linger);
        let began = Instant::now();
        assert_eq!(group.run(1).await, Ok(1));
        assert_eq!(began.elapsed(), Duration::ZERO, "the first goes at once");
        assert_eq!(ten_ms_apart(&group, 2, 3).await, (Ok(2), Ok(3)));
        assert_eq!(began.elapsed(), linger, "held until the linger had passed");
        assert_eq!(*batches.lock().unwrap(), vec![vec![1], vec![2, 3]]);
    }

    /// A linger changed as the group runs holds from the next request on:
    /// lengthened, a request close behind the last batch waits for it;
    /// set to zero, requests go at once again.
    #[tokio::test(start_paused = true)]
    async fn a_changed_linger_holds_from_the_next_request() {
        let (group, batches) = lingering(Duration::ZERO);
        assert_eq!(group.linger(), Duration::ZERO);
        assert_eq!(group.run(1).await, Ok(1));
        let linger = Duration::from_millis(100);
        group.set_linger(linger);
        assert_eq!(group.linger(), linger);
        // The batch of 1 went while the group did not linger, so nothing
        // is close behind a batch yet: 2 goes at once.
        let began = Instant::now();
        assert_eq!(group.run(2).await, Ok(2));
        assert_eq!(
            began.elapsed(),
            Duration::ZERO,
            "the first after the change"
        );
        assert_eq!(ten_ms_apart(&group, 3, 4).await, (Ok(3), Ok(4)));
        assert_eq!(
            began.elapsed(),
            linger,
            "held until the new linger had passed"
        );
        group.set_linger(Duration::ZERO);
        let asked = Instant::now();
        assert_eq!(group.run(5).await, Ok(5));
        assert_eq!(asked.elapsed(), Duration::ZERO, "no linger, no wait");
        let mut seen = batches.lock().unwrap().clone();
        for batch in &mut seen {
            batch.sort_unstable();
        }
        assert_eq!(seen, vec![vec![1], vec![2], vec![3, 4], vec![5]]);
    }

    /// Requests further apart than the linger each go at once, alone.
    #[tokio::test(start_paused = true)]
    async fn requests_further_apart_than_the_linger_go_at_once() {
        let linger = Duration::from_millis(100);
        let (group, batches) = lingering(linger);
        for n in 0..3 {
            let asked = Instant::now();
            assert_eq!(group.run(n).await, Ok(n));
            assert_eq!(asked.elapsed(), Duration::ZERO, "request {n} waited");
            tokio::time::sleep(linger * 2).await;
        }
        assert_eq!(*batches.lock().unwrap(), vec![vec![0], vec![1], vec![2]]);
    }
}
