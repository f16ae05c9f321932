//! What both stores group on every job's path: inserts, claims and
//! successes, each a [`Group`] (see [`toolfleet_core::group`]). Each store
//! says what an insert and a success carry and how a batch runs: one
//! statement on PostgreSQL (`postgres/groups.rs`), one transaction on
//! SQLite (`sqlite/groups.rs`).

use serde_json::Value;
use toolfleet_core::Json;
use toolfleet_core::group::Group;
use toolfleet_core::lifecycle::Transition;

use crate::{ClaimJob, Inserted, JobRecord, LeaseRef, StoreError, Succeed};

/// Requests one batch carries at most: one statement on PostgreSQL, one
/// transaction on SQLite.
pub(crate) const MAX_GROUP: usize = 256;

/// One group per operation on every job's path, the store's own insert
/// (`I`) requests.
pub(crate) struct Groups<I> {
    pub(crate) insert: Group<I, Inserted, StoreError>,
    pub(crate) claim: Group<Claim, Option<JobRecord>, StoreError>,
    pub(crate) succeed: Group<Success, Option<JobRecord>, StoreError>,
}

/// A claim of one job by `worker` at `now`, its lease until `until`.
pub(crate) struct Claim {
    pub(crate) id: String,
    pub(crate) worker: String,
    pub(crate) now: i64,
    pub(crate) until: i64,
}

impl From<ClaimJob<'_>> for Claim {
    fn from(claim: ClaimJob<'_>) -> Self {
        Claim {
            id: claim.id.to_owned(),
            worker: claim.worker.to_owned(),
            now: claim.now,
            until: claim.now.saturating_add(claim.lease_ms),
        }
    }
}

/// A success of the attempt `lease` holds.
pub(crate) struct Success {
    pub(crate) lease: LeaseRef,
    pub(crate) result: Json,
    pub(crate) now: i64,
    /// The record this attempt's claim answered (its id and attempt the
    /// lease's), when the holder gave it: the settled record is then built
    /// from it ([`Success::settled`]) and the store reads back only the
    /// job's progress.
    pub(crate) claimed: Option<JobRecord>,
}

impl From<Succeed<'_>> for Success {
    fn from(done: Succeed<'_>) -> Self {
        let lease = done.lease;
        let claimed = done
            .claimed
            .filter(|job| job.id == lease.job_id && job.attempts == lease.attempt);
        Success {
            lease: lease.clone(),
            result: done.result.clone(),
            now: done.now,
            claimed: claimed.cloned(),
        }
    }
}

impl Success {
    /// The record of the job as its claim answered it (the record this
    /// success carries, taken), once this success settled it: what the
    /// success set, and `progress` as read back (the one column that
    /// changes under a lease besides those). `None` without a claimed
    /// record.
    pub(crate) fn settled(self, progress: Option<Value>) -> Option<JobRecord> {
        let job = self.claimed?;
        Some(JobRecord {
            state: Transition::Succeed.to(),
            result: Some(self.result),
            progress,
            lease_owner: None,
            lease_until: None,
            updated_at: self.now,
            ..job
        })
    }
}
