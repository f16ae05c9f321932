//! Pages of [`crate::Store::due_jobs`]: what each store reads of the three
//! kinds of due jobs (waiting, scheduled, expired leases), each in its own
//! order, and where the next page of each goes on from, so the sweeper can
//! read a backlog of any length a page at a time.

use std::collections::HashSet;

use crate::JobRecord;

/// Where one kind of due jobs is read from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum DueFrom {
    /// From its earliest.
    #[default]
    Start,
    /// Past this job: its key (`run_at`; `lease_until` for an expired
    /// lease), then its id.
    After {
        /// The key of the last job read.
        at: i64,
        /// Its id.
        id: String,
    },
    /// Read to its end: nothing more of it is read.
    Done,
}

impl DueFrom {
    /// The key and id a read starts after (the earliest: before every
    /// job), or `None` once it is read to its end.
    pub fn key(&self) -> Option<(i64, &str)> {
        match self {
            DueFrom::Start => Some((i64::MIN, "")),
            DueFrom::After { at, id } => Some((*at, id)),
            DueFrom::Done => None,
        }
    }

    /// Where the read after `read` goes on from: past its last job while
    /// the read was full (`limit`), else nothing more.
    fn next(read: &[JobRecord], limit: u32, key: fn(&JobRecord) -> i64) -> DueFrom {
        match read.last() {
            Some(last) if read.len() >= limit as usize => DueFrom::After {
                at: key(last),
                id: last.id.clone(),
            },
            _ => DueFrom::Done,
        }
    }
}

/// Where each kind of a [`crate::Store::due_jobs`] read starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DueAfter {
    /// Queued, scheduled or retrying and due: by `run_at`, then id.
    pub waiting: DueFrom,
    /// Scheduled and due: by `run_at`, then id (a backlog of queued jobs,
    /// which sorts before them among the waiting, does not hide them).
    pub scheduled: DueFrom,
    /// Running with the lease expired: by `lease_until`, then id.
    pub expired: DueFrom,
}

/// What [`crate::Store::due_jobs`] takes.
#[derive(Debug, Clone, Copy)]
pub struct DueJobs<'a> {
    /// Now: a lease that ended before it is expired.
    pub now: i64,
    /// Waiting and scheduled jobs due by this time (at or after `now`).
    pub due_by: i64,
    /// Where each kind is read from.
    pub after: &'a DueAfter,
    /// At most this many of each kind (bounded by the store).
    pub limit: u32,
}

/// A page of due jobs.
#[derive(Debug, Clone, Default)]
pub struct DuePage {
    /// The jobs, by id, each once (a scheduled job may be read as waiting
    /// too).
    pub jobs: Vec<JobRecord>,
    /// Where the next page starts, or `None` when every kind was read to
    /// its end.
    pub next: Option<DueAfter>,
}

impl DuePage {
    /// The page of what a store read of each kind (nothing of a kind read
    /// to its end), each kind at most `limit`.
    pub(crate) fn of(
        waiting: Vec<JobRecord>,
        scheduled: Vec<JobRecord>,
        expired: Vec<JobRecord>,
        limit: u32,
    ) -> DuePage {
        let run_at = |job: &JobRecord| job.run_at;
        let lease = |job: &JobRecord| job.lease_until.unwrap_or(i64::MAX);
        let after = DueAfter {
            waiting: DueFrom::next(&waiting, limit, run_at),
            scheduled: DueFrom::next(&scheduled, limit, run_at),
            expired: DueFrom::next(&expired, limit, lease),
        };
        let mut seen = HashSet::new();
        let mut jobs: Vec<JobRecord> = [waiting, scheduled, expired]
            .into_iter()
            .flatten()
            .filter(|job| seen.insert(job.id.clone()))
            .collect();
        jobs.sort_by(|a, b| a.id.cmp(&b.id));
        let kinds = [&after.waiting, &after.scheduled, &after.expired];
        let more = kinds.iter().any(|from| **from != DueFrom::Done);
        DuePage {
            jobs,
            next: more.then_some(after),
        }
    }
}
