//! The operations on every job's path, grouped: inserts, claims and
//! successes, each a [`Group`] whose batch runs in one transaction on the
//! store's connection thread (alone, a request runs at once in autocommit:
//! see [`toolfleet_core::group`]).
//!
//! SQLite writes every page a commit touched to the WAL, a whole page
//! each: consecutive inserts, claims and successes touch the same leaf
//! pages of the table and its indexes, so one commit for many writes those
//! pages once instead of once per job. It owns how a batch becomes one
//! transaction. It must never let one request answer for another: each
//! runs its own statement and gets its own answer, and a batch whose
//! transaction SQLite rolled back (a full disk, an I/O error) answers every
//! request with the error, as nothing of it holds.

use rusqlite::{Connection, Row, params};
use serde_json::Value;
use toolfleet_core::group::Group;

use super::{Fields, call, insert_job, job_from_row, query_one, sql};
use crate::grouped::{Claim, MAX_GROUP, Success};
use crate::rows::Columns;
use crate::{Inserted, JobRecord, NewJob, StoreError};

/// Batches in flight at once: one runs on the connection's thread while
/// the next one waits in its queue, already formed.
const GROUP_SLOTS: usize = 2;

/// One group per operation on every job's path.
pub(super) type Groups = crate::grouped::Groups<Insert>;

/// A job to record, its JSON columns encoded before it joins a group, so a
/// value that cannot be encoded fails its own call and no other.
pub(super) struct Insert {
    pub(super) job: NewJob,
    /// Canonical, as the idempotency check compares it.
    pub(super) args: String,
    pub(super) lineage: Option<String>,
    pub(super) scopes: Option<String>,
}

impl crate::grouped::Groups<Insert> {
    pub(super) fn spawn(conn: &tokio_rusqlite::Connection) -> Groups {
        Groups {
            insert: grouped("recording jobs", conn, insert_one),
            claim: grouped("claiming jobs", conn, claim_one),
            succeed: grouped("settling jobs", conn, succeed_one),
        }
    }
}

fn insert_one(c: &Connection, insert: Insert) -> Result<Inserted, StoreError> {
    let (lineage, scopes) = (insert.lineage.as_deref(), insert.scopes.as_deref());
    insert_job(c, insert.job, &insert.args, lineage, scopes)
}

fn claim_one(c: &Connection, claim: Claim) -> Result<Option<JobRecord>, StoreError> {
    let params = params![claim.id, claim.worker, claim.now, claim.until];
    query_one(c, &sql::CLAIM, params, job_from_row)
}

/// A success, given the record its claim answered, reads back only the
/// job's progress and builds the settled record from the claimed one, as
/// PostgreSQL does: SQLite's RETURNING stores every row it answers in a
/// temporary table, and decoding the whole row again costs more than the
/// claimed record's copy.
fn succeed_one(c: &Connection, done: Success) -> Result<Option<JobRecord>, StoreError> {
    let lease = &done.lease;
    let params = params![
        lease.job_id,
        lease.worker,
        lease.attempt,
        done.result.get(),
        done.now
    ];
    if done.claimed.is_none() {
        return query_one(c, &sql::SUCCEED, params, job_from_row);
    }
    // The claimed record becomes the settled one, moved rather than copied.
    Ok(query_one(c, &sql::SUCCEED_LEAN, params, progress_of)?
        .and_then(|progress| done.settled(progress)))
}

/// The progress a lean success read back.
fn progress_of(row: &Row<'_>) -> Result<Option<Value>, StoreError> {
    Fields::new(row, "job", "id")?.json_opt("progress")
}

/// The operation that runs one request on a connection.
type Op<R, O> = fn(&Connection, R) -> Result<O, StoreError>;

/// A group running its batches through `op`, one transaction each, on
/// `conn`'s thread.
fn grouped<R, O>(
    what: &'static str,
    conn: &tokio_rusqlite::Connection,
    op: Op<R, O>,
) -> Group<R, O, StoreError>
where
    R: Send + 'static,
    O: Send + 'static,
{
    let conn = conn.clone();
    Group::spawn(what, GROUP_SLOTS, MAX_GROUP, move |batch: Vec<R>| {
        let conn = conn.clone();
        async move { call(&conn, move |c| in_one_transaction(c, batch, op)).await }
    })
}

/// Runs each request of `batch` through `op`, all in one transaction (a
/// request alone in autocommit), answering each request's own result. A
/// request that fails leaves the others' writes standing (SQLite undoes a
/// failed statement alone), unless SQLite rolled the whole transaction
/// back, which fails the batch.
///
/// The transaction's `BEGIN IMMEDIATE` and `COMMIT` are cached statements
/// of the connection, as the requests' own are: begun and committed through
/// rusqlite's `Transaction`, each would be parsed and compiled again for
/// every batch.
fn in_one_transaction<R, O>(
    c: &Connection,
    batch: Vec<R>,
    op: Op<R, O>,
) -> Result<Vec<Result<O, StoreError>>, StoreError> {
    if batch.len() == 1 {
        return Ok(batch.into_iter().map(|request| op(c, request)).collect());
    }
    let open = Open::begin(c)?;
    let mut answers = Vec::with_capacity(batch.len());
    for request in batch {
        let answer = op(open.0, request);
        if open.0.is_autocommit() {
            // SQLite ended the transaction: nothing of the batch holds.
            return Err(answer.err().unwrap_or_else(|| {
                StoreError::Unavailable("sqlite: a batch's transaction was rolled back".into())
            }));
        }
        answers.push(answer);
    }
    open.commit()?;
    Ok(answers)
}

/// A batch's open transaction, rolled back when dropped uncommitted (an
/// error, a panic) so the connection is left in autocommit either way.
struct Open<'c>(&'c Connection);

impl<'c> Open<'c> {
    fn begin(c: &'c Connection) -> Result<Self, StoreError> {
        c.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        Ok(Open(c))
    }

    fn commit(self) -> Result<(), StoreError> {
        self.0.prepare_cached("COMMIT")?.execute([])?;
        // Dropped committed: nothing is left to roll back.
        Ok(())
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        if !self.0.is_autocommit() {
            // A failed COMMIT (SQLite busy, a full disk) leaves it open.
            let _ = self.0.execute_batch("ROLLBACK");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> Connection {
        let c = Connection::open_in_memory().expect("a database");
        c.execute_batch("CREATE TABLE t (n INTEGER NOT NULL UNIQUE)")
            .expect("a table");
        c
    }

    fn add(c: &Connection, n: i64) -> Result<bool, StoreError> {
        // Inside a batch's transaction whenever the batch holds more than one.
        let alone = c.is_autocommit();
        c.execute("INSERT INTO t (n) VALUES (?1)", [n])?;
        Ok(alone)
    }

    fn count(c: &Connection) -> i64 {
        c.query_row("SELECT count(*) FROM t", [], |row| row.get(0))
            .expect("a count")
    }

    #[test]
    fn a_batch_runs_in_one_transaction_and_each_request_gets_its_own_answer() {
        let c = memory();
        let answers = in_one_transaction(&c, vec![1, 2, 1, 3], add).expect("committed");
        assert_eq!(answers.len(), 4);
        assert_eq!(answers[0].as_ref().ok(), Some(&false));
        assert_eq!(answers[1].as_ref().ok(), Some(&false));
        assert!(answers[2].is_err(), "a duplicate fails alone");
        assert_eq!(answers[3].as_ref().ok(), Some(&false));
        // The others' writes hold, and the transaction is over.
        assert_eq!(count(&c), 3);
        assert!(c.is_autocommit());
    }

    #[test]
    fn a_request_alone_runs_in_autocommit() {
        let c = memory();
        let answers = in_one_transaction(&c, vec![7], add).expect("committed");
        assert_eq!(answers[0].as_ref().ok(), Some(&true));
        assert_eq!(count(&c), 1);
    }

    #[test]
    fn a_batch_whose_transaction_ended_answers_an_error_and_keeps_nothing() {
        fn end(c: &Connection, n: i64) -> Result<bool, StoreError> {
            if n == 2 {
                // What SQLite does on a full disk or an I/O error.
                c.execute_batch("ROLLBACK")?;
                return Err(StoreError::Unavailable("disk full".into()));
            }
            add(c, n)
        }
        let c = memory();
        let failed = in_one_transaction(&c, vec![1, 2, 3], end);
        assert!(
            matches!(&failed, Err(StoreError::Unavailable(m)) if m == "disk full"),
            "{:?}",
            failed.map(|a| a.len())
        );
        assert_eq!(count(&c), 0, "nothing of the batch holds");
        assert!(c.is_autocommit());
    }

    #[test]
    fn a_batch_left_uncommitted_is_rolled_back() {
        let c = memory();
        {
            let open = Open::begin(&c).expect("begun");
            add(open.0, 1).expect("added");
            assert!(!c.is_autocommit());
        }
        assert_eq!(count(&c), 0, "nothing of it holds");
        assert!(c.is_autocommit());
        // The cached statements begin and commit the next batch as before.
        let answers = in_one_transaction(&c, vec![4, 5], add).expect("committed");
        assert_eq!(answers.len(), 2);
        assert_eq!(count(&c), 2);
        assert!(c.is_autocommit());
    }
}
