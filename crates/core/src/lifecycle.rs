//! The job's life, written down once: its states ([`JobState`]), every
//! transition between them as a named operation ([`Transition`]) that says
//! which states it moves from, where it moves to and who calls it, and the
//! decisions the worker asks of it ([`after_failure`], [`may_run`]).
//!
//! Both stores execute these transitions: each of their statements takes
//! its state lists from here ([`sql_list`]), so a job changes state only
//! through one of them, and the store conformance suite runs every legal
//! transition and tries every illegal one on every store. This module does
//! no I/O and must never grow a state or a transition that the stores do
//! not execute and the suite does not try.
//!
//! ```text
//!  enqueue ──► queued ──claim──► running ──succeed──► succeeded
//!                          ▲      │  ▲ │
//!              claim (due) │ retry│  │ └──fail──► failed
//!                          │      ▼  │take_over (lease expired)
//!                        retrying ◄──┘
//!                          ▲
//!                     wake │      park (running ──► parked, on a ticket)
//!                        parked
//!  schedule ──► scheduled ──claim (due)──► running
//!  cancel: queued, scheduled, retrying, parked, running ──► cancelled
//!  requeue (a person's retry): failed, cancelled ──► queued, attempts anew
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where a job is in its life, as the store keeps it.
///
/// The contract shows seven of these: a parked job reads as `retrying` to
/// clients ([`JobState::shown`]), as it always has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Recorded and waiting for a worker.
    Queued,
    /// Recorded with a start time (the call's `run_at` or `delay_s`): no
    /// worker may claim it before its `run_at`.
    Scheduled,
    /// Claimed by one attempt, under a lease its worker keeps by heartbeats.
    Running,
    /// An attempt failed with a retryable error; due again at `run_at`.
    Retrying,
    /// An agent's attempt waits on a ticket (the row's `waiting_on`): it
    /// holds no lease, no worker slot and no attempt until the ticket's
    /// answer wakes it.
    Parked,
    /// Settled with a result.
    Succeeded,
    /// Settled with its last error.
    Failed,
    /// Settled by a cancel.
    Cancelled,
}

impl JobState {
    /// Every state, as the store may hold it.
    pub const ALL: [JobState; 8] = [
        JobState::Queued,
        JobState::Scheduled,
        JobState::Running,
        JobState::Retrying,
        JobState::Parked,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
    ];

    /// The states the contract shows, in its order.
    pub const SHOWN: [JobState; 7] = [
        JobState::Queued,
        JobState::Scheduled,
        JobState::Running,
        JobState::Retrying,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
    ];

    /// The settled states: no worker, sweeper or caller's own call moves
    /// them; only a person's [`Transition::Requeue`] puts a failed or
    /// cancelled job back.
    pub const SETTLED: [JobState; 3] = [JobState::Succeeded, JobState::Failed, JobState::Cancelled];

    /// The name the store and the contract use.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Scheduled => "scheduled",
            JobState::Running => "running",
            JobState::Retrying => "retrying",
            JobState::Parked => "parked",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    /// The state of the name `text`, any of [`JobState::ALL`].
    pub fn parse(text: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// The state of the name `text` as a client may name it: one of
    /// [`JobState::SHOWN`].
    pub fn parse_shown(text: &str) -> Option<JobState> {
        JobState::SHOWN.into_iter().find(|s| s.as_str() == text)
    }

    /// How the contract shows this state: a parked job is `retrying`.
    pub fn shown(self) -> JobState {
        match self {
            JobState::Parked => JobState::Retrying,
            state => state,
        }
    }

    /// The stored states a client's `state` filter of `self` means.
    pub fn stored_as(self) -> &'static [JobState] {
        match self {
            JobState::Retrying => &[JobState::Retrying, JobState::Parked],
            JobState::Queued => &[JobState::Queued],
            JobState::Scheduled => &[JobState::Scheduled],
            JobState::Running => &[JobState::Running],
            JobState::Parked => &[JobState::Parked],
            JobState::Succeeded => &[JobState::Succeeded],
            JobState::Failed => &[JobState::Failed],
            JobState::Cancelled => &[JobState::Cancelled],
        }
    }

    /// True once the job can no longer change.
    pub fn is_settled(self) -> bool {
        JobState::SETTLED.contains(&self)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who calls a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// A dispatcher, at the HTTP edge: a call, a cancel, a ticket's answer.
    Dispatcher,
    /// A worker that was handed the job's id (by the broker, or by the
    /// sweeper's republish) and claims it.
    Claimant,
    /// The attempt that holds the job's lease now, named by its
    /// `LeaseRef` (worker and attempt): an older attempt changes nothing.
    Holder,
}

/// What must hold beside the job's state for a transition to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Nothing else.
    None,
    /// The job is due: `run_at <= now`.
    Due,
    /// The job's lease has run out: `lease_until < now`.
    LeaseExpired,
    /// The caller is the attempt holding the lease (lease owner and attempt).
    Held,
    /// The job waits on the ticket answered (`waiting_on`).
    WaitsOnTicket,
    /// The job belongs to the caller's tenant.
    Tenant,
    /// No attempt holds the job: a running one's lease has run out.
    Unheld,
}

/// Every way a job changes state, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transition {
    /// (new) -> queued: a call of a job or agent tool is recorded.
    Enqueue,
    /// (new) -> scheduled: a call of a job or agent tool is recorded with a
    /// start time still to come (`run_at`).
    Schedule,
    /// queued, or scheduled or retrying and due -> running: attempts + 1,
    /// leased to the claiming worker.
    Claim,
    /// running with an expired lease -> running: attempts + 1, leased to
    /// the new attempt; runnable since the old lease ended.
    TakeOver,
    /// running (this attempt) -> running: the lease extended. Progress and
    /// checkpoints are saved under the same guard.
    Heartbeat,
    /// running (this attempt) -> parked on a ticket: the attempt given back
    /// (waiting for a person is not a failed attempt), the lease released.
    Park,
    /// parked -> retrying, due now: the ticket it waits on was answered.
    Wake,
    /// running (this attempt) -> retrying at a later time, the attempt
    /// given back and the lease released: its tool's `start_rate` has no
    /// start free now (waiting for a start is not a failed attempt).
    Defer,
    /// running (this attempt) -> succeeded.
    Succeed,
    /// running (this attempt) -> retrying at a later time: the attempt
    /// failed with a retryable error and attempts remain ([`after_failure`]).
    Retry,
    /// running (this attempt) -> failed: the error is not retryable, no
    /// attempt remains, or the job was claimed past its last attempt.
    Fail,
    /// queued, scheduled, retrying, parked or running -> cancelled.
    Cancel,
    /// failed or cancelled -> queued, due now: a person put it back
    /// (`POST /v1/jobs/{id}/retry`). Its attempts count anew from 0, its
    /// error, result, progress and checkpoint are cleared, and its
    /// `requeues` grows by one, so its notices are those of a new life.
    Requeue,
    /// queued, scheduled, retrying, or running with an expired lease ->
    /// failed (`dead_lettered`): the broker gave up delivering the job's
    /// message, so the store says what the broker did. A job held by a
    /// live lease, parked or settled is left as it is: that message was a
    /// duplicate of one already taken.
    DeadLetter,
}

impl Transition {
    /// Every transition.
    pub const ALL: [Transition; 14] = [
        Transition::Enqueue,
        Transition::Schedule,
        Transition::Claim,
        Transition::TakeOver,
        Transition::Heartbeat,
        Transition::Park,
        Transition::Wake,
        Transition::Defer,
        Transition::Succeed,
        Transition::Retry,
        Transition::Fail,
        Transition::Cancel,
        Transition::Requeue,
        Transition::DeadLetter,
    ];

    /// Its name, as the docs and the logs say it.
    pub fn name(self) -> &'static str {
        match self {
            Transition::Enqueue => "enqueue",
            Transition::Schedule => "schedule",
            Transition::Claim => "claim",
            Transition::TakeOver => "take_over",
            Transition::Heartbeat => "heartbeat",
            Transition::Park => "park",
            Transition::Wake => "wake",
            Transition::Defer => "defer",
            Transition::Succeed => "succeed",
            Transition::Retry => "retry",
            Transition::Fail => "fail",
            Transition::Cancel => "cancel",
            Transition::Requeue => "requeue",
            Transition::DeadLetter => "dead_letter",
        }
    }

    /// The states it moves a job from (none for [`Transition::Enqueue`] and
    /// [`Transition::Schedule`], which make the job).
    pub fn from(self) -> &'static [JobState] {
        use JobState::*;
        match self {
            Transition::Enqueue | Transition::Schedule => &[],
            Transition::Claim => &[Queued, Scheduled, Retrying],
            Transition::TakeOver
            | Transition::Heartbeat
            | Transition::Park
            | Transition::Defer
            | Transition::Succeed
            | Transition::Retry
            | Transition::Fail => &[Running],
            Transition::Wake => &[Parked],
            Transition::Cancel => &[Queued, Scheduled, Retrying, Parked, Running],
            Transition::Requeue => &[Failed, Cancelled],
            Transition::DeadLetter => &[Queued, Scheduled, Retrying, Running],
        }
    }

    /// The state it moves a job to.
    pub fn to(self) -> JobState {
        match self {
            Transition::Enqueue | Transition::Requeue => JobState::Queued,
            Transition::Schedule => JobState::Scheduled,
            Transition::Claim | Transition::TakeOver | Transition::Heartbeat => JobState::Running,
            Transition::Park => JobState::Parked,
            Transition::Wake | Transition::Retry | Transition::Defer => JobState::Retrying,
            Transition::Succeed => JobState::Succeeded,
            Transition::Fail | Transition::DeadLetter => JobState::Failed,
            Transition::Cancel => JobState::Cancelled,
        }
    }

    /// Who calls it.
    pub fn by(self) -> Caller {
        match self {
            Transition::Enqueue
            | Transition::Schedule
            | Transition::Wake
            | Transition::Cancel
            | Transition::Requeue
            | Transition::DeadLetter => Caller::Dispatcher,
            Transition::Claim | Transition::TakeOver => Caller::Claimant,
            Transition::Heartbeat
            | Transition::Park
            | Transition::Defer
            | Transition::Succeed
            | Transition::Retry
            | Transition::Fail => Caller::Holder,
        }
    }

    /// What must hold beside the job's state.
    pub fn guard(self) -> Guard {
        match self {
            Transition::Enqueue | Transition::Schedule => Guard::None,
            Transition::Claim => Guard::Due,
            Transition::TakeOver => Guard::LeaseExpired,
            Transition::Heartbeat
            | Transition::Park
            | Transition::Defer
            | Transition::Succeed
            | Transition::Retry
            | Transition::Fail => Guard::Held,
            Transition::Wake => Guard::WaitsOnTicket,
            Transition::Cancel | Transition::Requeue => Guard::Tenant,
            Transition::DeadLetter => Guard::Unheld,
        }
    }

    /// True when a job in `state` may take this transition (its guard
    /// holding).
    pub fn leaves(self, state: JobState) -> bool {
        self.from().contains(&state)
    }
}

impl fmt::Display for Transition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What becomes of a running job whose attempt number `attempts` (of
/// `max_attempts`) failed: [`Transition::Retry`] when the error is
/// retryable and attempts remain, else [`Transition::Fail`]. The worker
/// asks; the store executes the answer.
pub fn after_failure(attempts: u32, max_attempts: u32, retryable: bool) -> Transition {
    if retryable && attempts < max_attempts {
        Transition::Retry
    } else {
        Transition::Fail
    }
}

/// True when an attempt numbered `attempts` may run: a job claimed past
/// its last attempt (its holders stopped mid-run each time) is failed
/// instead, without running.
pub fn may_run(attempts: u32, max_attempts: u32) -> bool {
    attempts <= max_attempts
}

/// `states` as an SQL list, `('queued', 'retrying')`: how the stores'
/// statements name the states a transition moves from.
pub fn sql_list(states: &[JobState]) -> String {
    let names: Vec<String> = states.iter().map(|s| format!("'{s}'")).collect();
    format!("({})", names.join(", "))
}

/// `states` as a condition on `column` by equalities, `(state = 'queued'
/// OR state = 'retrying')`: what SQLite's statements and partial indexes
/// write instead of [`sql_list`]. SQLite evaluates an `IN` list of three
/// or more values by building a temporary b-tree of them, again on every
/// run of a statement (for a write, once for each partial index and CHECK
/// that names one); equalities are compared in place. A partial index
/// serves a statement only when the statement repeats its condition, so
/// both must be written by this function, in the same order.
pub fn sql_any(column: &str, states: &[JobState]) -> String {
    let terms: Vec<String> = states.iter().map(|s| format!("{column} = '{s}'")).collect();
    format!("({})", terms.join(" OR "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_has_one_name() {
        for state in JobState::ALL {
            assert_eq!(JobState::parse(state.as_str()), Some(state));
            let text = serde_json::to_string(&state).expect("serialise");
            assert_eq!(text, format!("\"{state}\""));
        }
        assert_eq!(JobState::parse("waiting"), None);
    }

    #[test]
    fn a_parked_job_shows_as_retrying_and_clients_name_only_shown_states() {
        assert_eq!(JobState::Parked.shown(), JobState::Retrying);
        for state in JobState::SHOWN {
            assert_eq!(state.shown(), state);
            assert_eq!(JobState::parse_shown(state.as_str()), Some(state));
            assert!(state.stored_as().iter().all(|s| s.shown() == state));
        }
        assert_eq!(JobState::parse_shown("parked"), None);
        // Every stored state is found by the filter of the state it shows as.
        for state in JobState::ALL {
            assert!(state.shown().stored_as().contains(&state), "{state}");
        }
    }

    #[test]
    fn settled_states_are_left_only_by_a_requeue_and_every_other_by_one() {
        for state in JobState::ALL {
            let leaving: Vec<Transition> = Transition::ALL
                .into_iter()
                .filter(|t| t.leaves(state) && *t != Transition::Requeue)
                .collect();
            assert_eq!(leaving.is_empty(), state.is_settled(), "{state}");
        }
        // A requeue leaves only settled states, and not a success.
        assert_eq!(
            Transition::Requeue.from(),
            &[JobState::Failed, JobState::Cancelled]
        );
        // Every state is reached by some transition.
        for state in JobState::ALL {
            assert!(
                Transition::ALL.iter().any(|t| t.to() == state),
                "{state} is unreachable"
            );
        }
        // A holder's transitions all start from running.
        for t in Transition::ALL {
            if t.by() == Caller::Holder {
                assert_eq!(t.from(), &[JobState::Running], "{t}");
                assert_eq!(t.guard(), Guard::Held, "{t}");
            }
        }
    }

    #[test]
    fn a_failure_retries_only_while_retryable_and_attempts_remain() {
        assert_eq!(after_failure(1, 3, true), Transition::Retry);
        assert_eq!(after_failure(2, 3, true), Transition::Retry);
        assert_eq!(after_failure(3, 3, true), Transition::Fail);
        assert_eq!(after_failure(1, 3, false), Transition::Fail);
        assert_eq!(after_failure(1, 1, true), Transition::Fail);
        assert!(may_run(3, 3));
        assert!(!may_run(4, 3));
    }

    #[test]
    fn state_lists_read_as_sql() {
        assert_eq!(
            sql_list(Transition::Claim.from()),
            "('queued', 'scheduled', 'retrying')"
        );
        assert_eq!(
            sql_list(&JobState::SETTLED),
            "('succeeded', 'failed', 'cancelled')"
        );
        assert_eq!(
            sql_any("state", Transition::Claim.from()),
            "(state = 'queued' OR state = 'scheduled' OR state = 'retrying')"
        );
        assert_eq!(
            sql_any("r.state", &[JobState::Running]),
            "(r.state = 'running')"
        );
    }
}
