//! The operations on every job's path, grouped: inserts, claims and
//! successes, each a [`Group`] whose batch runs as one statement and one
//! commit (alone, a request runs at once: see [`toolfleet_core::group`]).
//! It owns how a batch becomes one statement's arrays and how each request
//! finds its answer among the rows. It must never let one request answer
//! for another: a job the batch did not insert takes the one-job path,
//! which says why, and a request that no row names answers `None`.

use std::collections::HashSet;
use std::sync::Arc;

use deadpool_postgres::Pool;
use futures_util::future::join_all;
use tokio_postgres::Row;
use toolfleet_core::group::Group;

use super::rows::{Fields, Insert, job_from_row};
use super::schema::pool_error;
use super::statements;
use super::store::{Params, insert_job};
use crate::grouped::{Claim, MAX_GROUP, Success};
use crate::rows::Columns;
use crate::{Inserted, JobRecord, StoreError};

/// Grouped statements of one kind running at once. Few slots make large
/// groups: `toolfleet bench` settled 2,313 jobs/s with one slot, 2,251 with
/// two and 1,553 with eight (one process, 64 worker slots, pool of 32), and
/// a lone call still finds a slot free.
const GROUP_SLOTS: usize = 2;

/// One group per operation on every job's path: inserts, claims and
/// successes. Under load each becomes one statement and one commit for
/// many jobs; alone, each runs at once (see [`toolfleet_core::group`]).
pub(super) type Groups = crate::grouped::Groups<Insert>;

/// Statements each group runs at once with a pool of `pool_size`.
fn slots(pool_size: usize) -> usize {
    GROUP_SLOTS.min(pool_size / 4).max(1)
}

impl super::PgStore {
    /// [`Store::warm`](crate::Store::warm): as many connections as the
    /// claim and success groups run statements at once, each with their
    /// statements prepared (the connection a statement gets is any of the
    /// pool's), all at once.
    pub(super) async fn warm_groups(&self) -> Result<(), StoreError> {
        let wanted = 2 * slots(self.pool.status().max_size);
        let clients = join_all((0..wanted).map(|_| self.client())).await;
        let prepared = clients.into_iter().map(|client| async move {
            let c = client?;
            let claim = c.prepare_cached(&statements::CLAIM_MANY);
            let succeed = c.prepare_cached(&statements::SUCCEED_MANY_LEAN);
            let (claim, succeed) = futures_util::future::join(claim, succeed).await;
            claim?;
            succeed?;
            Ok::<(), StoreError>(())
        });
        join_all(prepared).await.into_iter().collect()
    }
}

impl crate::grouped::Groups<Insert> {
    /// Each group runs at most [`GROUP_SLOTS`] statements at once, and never
    /// more than a quarter of the pool's connections, so the three together
    /// leave room for reads, heartbeats and the rest.
    pub(super) fn spawn(pool: &Pool, place: &Arc<str>, pool_size: usize) -> Groups {
        let slots = slots(pool_size);
        Groups {
            insert: grouped("recording jobs", slots, pool, place, insert_many),
            claim: grouped("claiming jobs", slots, pool, place, claim_many),
            succeed: grouped("settling jobs", slots, pool, place, succeed_many),
        }
    }
}

/// A group running its batches through `run` on connections of `pool`.
fn grouped<R, O, F, Fut>(
    what: &'static str,
    slots: usize,
    pool: &Pool,
    place: &Arc<str>,
    run: F,
) -> Group<R, O, StoreError>
where
    R: Send + 'static,
    O: Send + 'static,
    F: Fn(Pool, Arc<str>, Vec<R>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Answers<O>> + Send + 'static,
{
    let (pool, place) = (pool.clone(), place.clone());
    Group::spawn(what, slots, MAX_GROUP, move |batch| {
        run(pool.clone(), place.clone(), batch)
    })
}

/// Answers of a grouped statement, one per request, in the batch's order.
type Answers<T> = Result<Vec<Result<T, StoreError>>, StoreError>;

/// Records a batch of jobs in one statement. A job it inserted answers
/// the record it was given ([`crate::NewJob::created`]), read back from
/// nothing; a job it did not insert (its key or id taken) takes the
/// one-job path, which finds the earlier job or says why not.
async fn insert_many(pool: Pool, place: Arc<str>, mut jobs: Vec<Insert>) -> Answers<Inserted> {
    let c = pool.get().await.map_err(|e| pool_error(e, &place))?;
    if jobs.len() == 1
        && let Some(alone) = jobs.pop()
    {
        // One job: the plain statement, cheaper to plan than the arrays.
        return Ok(vec![insert_job(&c, alone).await]);
    }
    let inserted: HashSet<String> = {
        let column = |f: fn(&Insert) -> &str| jobs.iter().map(f).collect::<Vec<&str>>();
        let optional =
            |f: fn(&Insert) -> Option<&str>| jobs.iter().map(f).collect::<Vec<Option<&str>>>();
        let number = |f: fn(&Insert) -> i64| jobs.iter().map(f).collect::<Vec<i64>>();
        let params: Params<'_> = &[
            &column(|i| &i.job.id),
            &column(|i| &i.job.tenant),
            &column(|i| &i.job.user),
            &column(|i| &i.job.tool),
            &column(|i| &i.job.pool),
            &column(|i| &i.args),
            &number(|i| i64::from(i.job.max_attempts)),
            &number(|i| i.job.timeout_ms),
            &number(|i| i.job.now),
            &optional(|i| i.job.idempotency_key.as_deref()),
            &column(|i| &i.job.run_id),
            &column(|i| &i.job.call_id),
            &optional(|i| i.job.callback_url.as_deref()),
            &optional(|i| i.lineage.as_deref()),
            &optional(|i| i.scopes.as_deref()),
            &optional(|i| i.traceparent.as_deref()),
            &optional(|i| i.tracestate.as_deref()),
            &optional(|i| i.job.origin.as_deref()),
            &column(|i| i.state),
            &number(|i| i.run_at),
            &jobs
                .iter()
                .map(|i| i.job.priority)
                .collect::<Vec<Option<i16>>>(),
            &optional(|i| i.job.concurrency_key.as_deref()),
            &jobs
                .iter()
                .map(|i| i.job.concurrency_limit.map(i64::from))
                .collect::<Vec<Option<i64>>>(),
            &number(|i| i.job.fair_rank),
        ];
        let stmt = c.prepare_cached(statements::INSERT_MANY).await?;
        let rows = c.query(&stmt, params).await?;
        let mut inserted = HashSet::with_capacity(rows.len());
        for row in &rows {
            inserted.insert(Fields::new(row, "job", "id").get::<String>("id")?);
        }
        inserted
    };
    let mut answers = Vec::with_capacity(jobs.len());
    for insert in jobs {
        answers.push(if inserted.contains(&insert.job.id) {
            Ok(Inserted::Created(insert.job.created()))
        } else {
            insert_job(&c, insert).await
        });
    }
    Ok(answers)
}

/// Places each returned row at the request its `ord` column names
/// (1-based, as `WITH ORDINALITY` counts), decoded as a whole job row;
/// requests no row names answer `None`.
fn by_ordinal(rows: &[Row], ord: &str, count: usize) -> Vec<Result<Option<JobRecord>, StoreError>> {
    by_ordinal_with(rows, ord, count, |row, _| job_from_row(row))
}

/// As [`by_ordinal`], each row decoded by `decode` with its request's
/// place in the batch.
fn by_ordinal_with(
    rows: &[Row],
    ord: &str,
    count: usize,
    mut decode: impl FnMut(&Row, usize) -> Result<JobRecord, StoreError>,
) -> Vec<Result<Option<JobRecord>, StoreError>> {
    let mut answers: Vec<Result<Option<JobRecord>, StoreError>> =
        (0..count).map(|_| Ok(None)).collect();
    for row in rows {
        let at = row
            .try_get::<_, i64>(ord)
            .ok()
            .and_then(|n| usize::try_from(n - 1).ok());
        if let Some((i, answer)) = at.and_then(|i| answers.get_mut(i).map(|a| (i, a))) {
            *answer = decode(row, i).map(Some);
        }
    }
    answers
}

/// Claims a batch of jobs in one conditional statement.
async fn claim_many(pool: Pool, place: Arc<str>, claims: Vec<Claim>) -> Answers<Option<JobRecord>> {
    let c = pool.get().await.map_err(|e| pool_error(e, &place))?;
    let ids: Vec<&str> = claims.iter().map(|c| c.id.as_str()).collect();
    let workers: Vec<&str> = claims.iter().map(|c| c.worker.as_str()).collect();
    let nows: Vec<i64> = claims.iter().map(|c| c.now).collect();
    let untils: Vec<i64> = claims.iter().map(|c| c.until).collect();
    let stmt = c.prepare_cached(&statements::CLAIM_MANY).await?;
    let rows = c.query(&stmt, &[&ids, &workers, &nows, &untils]).await?;
    Ok(by_ordinal(&rows, "c_ord", claims.len()))
}

/// Settles a batch of successes in one conditional statement.
async fn succeed_many(
    pool: Pool,
    place: Arc<str>,
    done: Vec<Success>,
) -> Answers<Option<JobRecord>> {
    let c = pool.get().await.map_err(|e| pool_error(e, &place))?;
    // Where every holder gave its claimed record, the settled records are
    // built from them, and only what may have changed under the lease is
    // read back (not the arguments, nor anything else the claim answered).
    let lean = done.iter().all(|s| s.claimed.is_some());
    let rows = {
        let ids: Vec<&str> = done.iter().map(|s| s.lease.job_id.as_str()).collect();
        let workers: Vec<&str> = done.iter().map(|s| s.lease.worker.as_str()).collect();
        let attempts: Vec<i64> = done.iter().map(|s| i64::from(s.lease.attempt)).collect();
        let results: Vec<&str> = done.iter().map(|s| s.result.get()).collect();
        let nows: Vec<i64> = done.iter().map(|s| s.now).collect();
        let params: Params<'_> = &[&ids, &workers, &attempts, &results, &nows];
        let sql = if lean {
            &statements::SUCCEED_MANY_LEAN
        } else {
            &statements::SUCCEED_MANY
        };
        let stmt = c.prepare_cached(sql).await?;
        c.query(&stmt, params).await?
    };
    if !lean {
        return Ok(by_ordinal(&rows, "s_ord", done.len()));
    }
    // Each success's claimed record becomes its settled one (moved, not
    // copied), once: a second row of the same place finds none.
    let count = done.len();
    let mut done: Vec<Option<Success>> = done.into_iter().map(Some).collect();
    Ok(by_ordinal_with(&rows, "s_ord", count, |row, i| {
        let fields = Fields::new(row, "job", "id");
        let progress = fields.json_opt("progress")?;
        done.get_mut(i)
            .and_then(Option::take)
            .and_then(|success| success.settled(progress))
            .ok_or_else(|| fields.corrupt("s_ord", "no success of the batch has it"))
    }))
}
