//! What both stores group on every job's path: inserts, claims and
//! successes, each a [`Group`] (see [`toolfleet_core::group`]). Each store
//! says what an insert and a success carry and how a batch runs: one
//! statement on PostgreSQL (`postgres/groups.rs`), one transaction on
//! SQLite (`sqlite/groups.rs`).

use toolfleet_core::group::Group;

use crate::{ClaimJob, Inserted, JobRecord, StoreError};

/// Requests one batch carries at most: one statement on PostgreSQL, one
/// transaction on SQLite.
pub(crate) const MAX_GROUP: usize = 256;

/// One group per operation on every job's path, the store's own insert
/// (`I`) and success (`S`) requests.
pub(crate) struct Groups<I, S> {
    pub(crate) insert: Group<I, Inserted, StoreError>,
    pub(crate) claim: Group<Claim, Option<JobRecord>, StoreError>,
    pub(crate) succeed: Group<S, Option<JobRecord>, StoreError>,
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
