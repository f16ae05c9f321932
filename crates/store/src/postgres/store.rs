//! The [`Store`] of PostgreSQL: each operation as the statements it runs on
//! a connection of the pool, or as a request to its group. It must never
//! read a job and then write it: each transition is one conditional
//! statement, and what is read after one that changed nothing only tells
//! why.

use async_trait::async_trait;
use deadpool_postgres::ClientWrapper;
use serde_json::Value;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;
use toolfleet_core::middleware::canonical_json;
use toolfleet_core::{AuditRecord, Envelope, ErrorCode, JobState, ToolError};

use super::PgStore;
use super::rows::{
    AuditColumns, Fields, Insert, audit_from_row, job_from_row, run_from_row, ticket_from_row,
};
use super::statements;
use crate::rows::{Columns, Paging, encode};
use crate::{AdvanceSchedule, ClaimNext, DeadLetter, Defer, PoolRow, ScheduleRecord, TakeToken};
use crate::{
    AnswerTicket, Answered, Answerer, CancelJob, ClaimCommit, ClaimJob, ClaimNotice, CommitClaim,
    Fail, Heartbeat, Inserted, JobFilter, JobPage, JobRecord, Lease, LeaseRef, ListJobs, ListRuns,
    ListTickets, NewJob, NewRun, NewTicket, Park, Prune, QueuedFrom, Requeue, RequeueMany,
    RespondStep, RespondTicket, Responded, Retained, RunFilter, RunInserted, RunPage, RunRecord,
    RunState, SaveCheckpoint, SetProgress, SettleCommit, SettleNotice, SettleTicket,
    SilentDispatcher, StaleRuns, Store, StoreError, Succeed, TicketKind, TicketPage, TicketRecord,
    TicketShown, Unnotified, UpdateRun,
};
use crate::{DueFrom, DueJobs, DuePage};
use crate::{HandleInfo, HandleOwner, HandleRecord, NewHandle};

/// Bound of one answer of [`Store::due_jobs`] and [`Store::audit`].
const MAX_BATCH: u32 = 1000;
/// Settled commit outcomes pruned per claim, so pruning stays cheap.
const PRUNE_BATCH: i64 = 100;
/// Claims of a commit key tried before giving up, when the key keeps being
/// released between the claim and the read of its outcome.
const CLAIM_COMMIT_TRIES: usize = 5;

type FromRow<T> = fn(&Row) -> Result<T, StoreError>;
pub(super) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

async fn query_one<T>(
    c: &ClientWrapper,
    sql: &str,
    params: Params<'_>,
    map: FromRow<T>,
) -> Result<Option<T>, StoreError> {
    let stmt = c.prepare_cached(sql).await?;
    c.query_opt(&stmt, params)
        .await?
        .as_ref()
        .map(map)
        .transpose()
}

async fn query_all<T>(
    c: &ClientWrapper,
    sql: &str,
    params: Params<'_>,
    map: FromRow<T>,
) -> Result<Vec<T>, StoreError> {
    let stmt = c.prepare_cached(sql).await?;
    c.query(&stmt, params).await?.iter().map(map).collect()
}

async fn execute(c: &ClientWrapper, sql: &str, params: Params<'_>) -> Result<u64, StoreError> {
    let stmt = c.prepare_cached(sql).await?;
    Ok(c.execute(&stmt, params).await?)
}

// Jobs.

pub(super) async fn insert_job(c: &ClientWrapper, insert: Insert) -> Result<Inserted, StoreError> {
    let (job, args) = (&insert.job, &insert.args);
    let max_attempts = i64::from(job.max_attempts);
    let params: Params<'_> = &[
        &job.id,
        &job.tenant,
        &job.user,
        &job.tool,
        &job.pool,
        &args,
        &max_attempts,
        &job.timeout_ms,
        &job.now,
        &job.idempotency_key,
        &job.run_id,
        &job.call_id,
        &job.callback_url,
        &insert.lineage,
        &insert.scopes,
        &insert.traceparent,
        &insert.tracestate,
        &job.origin,
        &insert.state,
        &insert.run_at,
        &job.priority,
        &job.concurrency_key,
        &job.concurrency_limit.map(i64::from),
        &job.fair_rank,
    ];
    // Inserted: the record is what was written, without reading it back.
    if execute(c, statements::INSERT_JOB, params).await? == 1 {
        return Ok(Inserted::Created(insert.job.created()));
    }
    // Nothing inserted: the key was taken (or, never in practice, the id).
    let existing = match &job.idempotency_key {
        Some(key) => {
            let params: Params<'_> = &[&job.tenant, &job.tool, key];
            query_one(c, statements::JOB_BY_KEY, params, job_from_row).await?
        }
        None => None,
    };
    match existing {
        Some(existing) if canonical_json(&existing.args) == *args => {
            Ok(Inserted::Existing(existing))
        }
        Some(_) => Err(StoreError::Conflict(format!(
            "idempotency_key was already used for a `{}` job with other arguments; use a new key for new work",
            job.tool
        ))),
        None => Err(StoreError::Conflict(format!(
            "a job with id {} already exists",
            job.id
        ))),
    }
}

async fn heartbeat(c: &ClientWrapper, beat: Heartbeat<'_>) -> Result<Lease, StoreError> {
    let (id, worker, attempt) = parts(beat.lease);
    let until = beat.now.saturating_add(beat.lease_ms);
    let params: Params<'_> = &[&id, &worker, &attempt, &beat.now, &until];
    if execute(c, &statements::HEARTBEAT, params).await? > 0 {
        return Ok(Lease::Held);
    }
    // Read after the update, so a cancel that the update waited for is seen.
    let stmt = c.prepare_cached(statements::STATE).await?;
    let row = c.query_opt(&stmt, &[&id]).await?;
    let state = match &row {
        Some(row) => Fields::named(row, "job", id).get::<&str>("state")?,
        None => "",
    };
    Ok(match JobState::parse(state) {
        Some(JobState::Cancelled) => Lease::Cancelled,
        _ => Lease::Lost,
    })
}

/// The parts of `lease` as the statements of its holder bind them.
fn parts(lease: &LeaseRef) -> (&str, &str, i64) {
    (&lease.job_id, &lease.worker, i64::from(lease.attempt))
}

async fn cancel(
    c: &ClientWrapper,
    tenant: &str,
    id: &str,
    now: i64,
) -> Result<Option<JobRecord>, StoreError> {
    let error = encode(&ToolError::new(
        ErrorCode::Cancelled,
        "the job was cancelled before it finished; call the tool again if the work is still needed",
    ))?;
    let params: Params<'_> = &[&id, &tenant, &error, &now];
    if let Some(job) = query_one(c, &statements::CANCEL, params, job_from_row).await? {
        return Ok(Some(job));
    }
    // Settled, missing or another tenant's: answered as it stands.
    query_one(c, statements::JOB, &[&id, &tenant], job_from_row).await
}

async fn list_jobs(
    c: &ClientWrapper,
    tenant: &str,
    filter: &JobFilter,
    limit: u32,
    cursor: Option<&str>,
) -> Result<JobPage, StoreError> {
    let page = Paging::new(limit, cursor);
    let (floor, cursor) = filter.id_bounds(page.cursor);
    let fetch = page.fetch();
    let tool = &filter.tool;
    let mut jobs = match (filter.state, &filter.user) {
        // The stored states the filter means (retrying finds parked jobs
        // too), each in its order: failed and cancelled off
        // jobs_tenant_state, succeeded off the tenant's owner rows, the
        // others off the partial index of their state.
        (Some(state), user) => {
            let placeholder = |n: u8| match n {
                2 | 3 | 5 => format!("${n}::text"),
                4 => "$4::bigint".to_owned(),
                n => format!("${n}"),
            };
            let owned = user.as_ref().map(|_| "\"user\"");
            let columns = statements::JOB_COLUMNS;
            let statement =
                crate::list_in_states(state.stored_as(), placeholder, list_source, owned, columns);
            match user {
                None => {
                    let params: Params<'_> = &[&tenant, tool, &cursor, &fetch, &floor];
                    query_all(c, &statement, params, job_from_row).await?
                }
                Some(user) => {
                    let params: Params<'_> = &[&tenant, tool, &cursor, &fetch, &floor, user];
                    query_all(c, &statement, params, job_from_row).await?
                }
            }
        }
        (None, None) => {
            let params: Params<'_> = &[&tenant, tool, &cursor, &fetch, &floor];
            query_all(c, &statements::LIST, params, job_from_row).await?
        }
        (None, Some(user)) => {
            let params: Params<'_> = &[&tenant, tool, &cursor, &fetch, &floor, user];
            query_all(c, &statements::LIST_OWNED, params, job_from_row).await?
        }
    };
    let next_cursor = page.cut(&mut jobs, |job| &job.id);
    Ok(JobPage { jobs, next_cursor })
}

/// What the job list in `state` reads (see [`crate::list_in_states`]):
/// succeeded jobs, most of a tenant's, by its owner rows newest first;
/// the others off `jobs`' partial index of their state.
fn list_source(state: JobState) -> &'static str {
    match state {
        JobState::Succeeded => statements::OWNED_JOBS,
        _ => "jobs",
    }
}

async fn job_counts(c: &ClientWrapper) -> Result<Vec<(JobState, u64)>, StoreError> {
    let mut counts: Vec<(JobState, u64)> = JobState::ALL.into_iter().map(|s| (s, 0)).collect();
    let stmt = c.prepare_cached(statements::COUNTS).await?;
    for row in c.query(&stmt, &[]).await? {
        let f = Fields::new(&row, "job count", "state");
        let state = f.state()?;
        let n: u64 = f.int("n")?;
        if let Some(slot) = counts.iter_mut().find(|(s, _)| *s == state) {
            slot.1 = n;
        }
    }
    Ok(counts)
}

// Tickets, audit and commits.

async fn insert_ticket(c: &ClientWrapper, t: &NewTicket) -> Result<TicketRecord, StoreError> {
    let (options, args) = (encode(&t.options)?, encode(&t.args)?);
    let (plan, scopes) = (t.plan.as_ref().map(encode).transpose()?, encode(&t.scopes)?);
    let input_requests = t.input_requests.as_ref().map(encode).transpose()?;
    let params: Params<'_> = &[
        &t.id,
        &t.tenant,
        &t.user,
        &t.tool,
        &t.question,
        &options,
        &args,
        &t.run_id,
        &t.call_id,
        &t.callback_url,
        &t.now,
        &t.answered_by.scope(),
        &t.kind.as_str(),
        &plan,
        &scopes,
        &t.expires_at,
        &input_requests,
    ];
    query_one(c, statements::INSERT_TICKET, params, ticket_from_row)
        .await?
        .ok_or_else(|| StoreError::Conflict(format!("a ticket with id {} already exists", t.id)))
}

async fn answer_ticket(
    c: &ClientWrapper,
    tenant: &str,
    id: &str,
    answer: &str,
    now: i64,
) -> Result<Option<Answered>, StoreError> {
    let params: Params<'_> = &[&id, &tenant, &answer, &now];
    if let Some(t) = query_one(c, statements::ANSWER, params, ticket_from_row).await? {
        return Ok(Some(Answered::Now(t)));
    }
    let ticket = query_one(c, statements::TICKET, &[&id, &tenant], ticket_from_row).await?;
    Ok(ticket.map(Answered::Already))
}

async fn respond_ticket(
    c: &ClientWrapper,
    respond: RespondTicket<'_>,
) -> Result<Option<Responded>, StoreError> {
    let RespondTicket {
        tenant,
        id,
        responses,
        now,
    } = respond;
    // Another dispatcher may record answers between the read and the
    // write: the compare-and-set then fails, and the ticket is read again.
    for _ in 0..crate::RESPOND_TRIES {
        let Some(ticket) =
            query_one(c, statements::TICKET, &[&id, &tenant], ticket_from_row).await?
        else {
            return Ok(None);
        };
        let (answers, complete, had) = match crate::respond_step(ticket, responses) {
            RespondStep::Stands(ticket) => return Ok(Some(Responded::Recorded(*ticket))),
            RespondStep::Write {
                answers,
                complete,
                had,
            } => (encode(&answers)?, complete, had),
        };
        let params: Params<'_> = &[&id, &tenant, &answers, &complete, &now, &had];
        if let Some(t) = query_one(c, statements::RESPOND, params, ticket_from_row).await? {
            return Ok(Some(Responded::written(t, complete)));
        }
    }
    Err(crate::respond_conflict(id))
}

async fn list_tickets(c: &ClientWrapper, list: ListTickets<'_>) -> Result<TicketPage, StoreError> {
    let page = Paging::new(list.limit, list.cursor);
    let shown = list.shown.map(|shown| match shown {
        TicketShown::Open => "open",
        TicketShown::Answered => "answered",
    });
    let kind = list.kind.map(TicketKind::as_str);
    let (tenant, cursor, fetch) = (list.tenant, page.cursor, page.fetch());
    let mut tickets = match list.answerer {
        Answerer::Operator => {
            let params: Params<'_> = &[&tenant, &shown, &kind, &cursor, &fetch];
            query_all(c, statements::LIST_TICKETS, params, ticket_from_row).await?
        }
        Answerer::User { user, scopes } => {
            let params: Params<'_> = &[&tenant, &shown, &kind, &cursor, &fetch, user, scopes];
            query_all(c, statements::LIST_TICKETS_OF, params, ticket_from_row).await?
        }
    };
    let next_cursor = page.cut(&mut tickets, |t| &t.id);
    Ok(TicketPage {
        tickets,
        next_cursor,
    })
}

async fn settle_ticket(
    c: &ClientWrapper,
    settle: SettleTicket<'_>,
) -> Result<Option<TicketRecord>, StoreError> {
    let (id, tenant, outcome) = (settle.id, settle.tenant, settle.outcome.to_json());
    let params: Params<'_> = &[&id, &tenant, &outcome];
    if let Some(t) = query_one(c, statements::SETTLE_TICKET, params, ticket_from_row).await? {
        return Ok(Some(t));
    }
    // Missing, another tenant's, open, or settled before: only the last
    // is answered, as it stands.
    let ticket = query_one(c, statements::TICKET, &[&id, &tenant], ticket_from_row).await?;
    Ok(ticket.filter(|t| t.outcome.is_some()))
}

// Runs.

async fn insert_run(c: &ClientWrapper, run: &NewRun) -> Result<RunInserted, StoreError> {
    let checkpoint = run.checkpoint.as_ref().map(encode).transpose()?;
    let scopes = encode(&run.scopes)?;
    let params: Params<'_> = &[
        &run.id,
        &run.tenant,
        &run.user,
        &run.agent,
        &checkpoint,
        &run.callback_url,
        &run.idempotency_key,
        &scopes,
        &run.now,
    ];
    if let Some(created) = query_one(c, &statements::INSERT_RUN, params, run_from_row).await? {
        return Ok(RunInserted::Created(created));
    }
    // Nothing inserted: the key was taken (or, never in practice, the id).
    let existing = match &run.idempotency_key {
        Some(key) => {
            let params: Params<'_> = &[&run.tenant, &run.user, key];
            query_one(c, statements::RUN_BY_KEY, params, run_from_row).await?
        }
        None => None,
    };
    existing
        .map(RunInserted::Existing)
        .ok_or_else(|| StoreError::Conflict(format!("a run with id {} already exists", run.id)))
}

/// The compare-and-set and the index of the run's waits, in one
/// transaction: the rows of a run that moved are dropped, and those of the
/// wait it moved to written.
async fn update_run(
    c: &mut ClientWrapper,
    u: UpdateRun<'_>,
) -> Result<Option<RunRecord>, StoreError> {
    let json = |v: Option<&Value>| v.map(encode).transpose();
    let from: Vec<&str> = u.from.iter().map(|s| s.as_str()).collect();
    let (checkpoint, resumed) = (json(u.checkpoint)?, json(u.resumed)?);
    let (error, usage) = (json(u.error)?, json(u.usage)?);
    let wait = u.wait.map(encode).transpose()?;
    let params: Params<'_> = &[
        &u.id,
        &u.version,
        &from,
        &u.to.as_str(),
        &checkpoint,
        &wait,
        &resumed,
        &u.answer,
        &error,
        &usage,
        &u.now,
    ];
    let tx = c.transaction().await?;
    let stmt = tx.prepare_cached(&statements::UPDATE_RUN).await?;
    let Some(row) = tx.query_opt(&stmt, params).await? else {
        return Ok(None);
    };
    let run = run_from_row(&row)?;
    let drop_waits = tx.prepare_cached(statements::DROP_WAITS).await?;
    tx.execute(&drop_waits, &[&run.id]).await?;
    if let Some(wait) = run.wait.as_ref().filter(|_| run.state == RunState::Waiting) {
        let items: Vec<&str> = wait.items().collect();
        let add = tx.prepare_cached(statements::ADD_WAITS).await?;
        tx.execute(&add, &[&items, &run.id]).await?;
    }
    tx.commit().await?;
    Ok(Some(run))
}

async fn list_runs(
    c: &ClientWrapper,
    tenant: &str,
    filter: &RunFilter,
    page: &Paging<'_>,
) -> Result<RunPage, StoreError> {
    let state = filter.state.map(RunState::as_str);
    let (cursor, fetch) = (page.cursor, page.fetch());
    let mut runs = match &filter.user {
        None => {
            let params: Params<'_> = &[&tenant, &state, &filter.agent, &cursor, &fetch];
            query_all(c, statements::LIST_RUNS, params, run_from_row).await?
        }
        Some(user) => {
            let params: Params<'_> = &[&tenant, &state, &filter.agent, &cursor, &fetch, user];
            query_all(c, statements::LIST_RUNS_OWNED, params, run_from_row).await?
        }
    };
    let next_cursor = page.cut(&mut runs, |run| &run.id);
    Ok(RunPage { runs, next_cursor })
}

async fn append_audit(c: &ClientWrapper, records: &[AuditRecord]) -> Result<(), StoreError> {
    let cols = AuditColumns::of(records)?;
    let params: Params<'_> = &[
        &cols.at_ms,
        &cols.tenant,
        &cols.user,
        &cols.tool,
        &cols.run_id,
        &cols.call_id,
        &cols.args,
        &cols.status,
        &cols.error_code,
        &cols.duration_us,
        &cols.parent_run_id,
    ];
    execute(c, statements::INSERT_AUDIT, params).await?;
    Ok(())
}

/// The claim and the read of an unclaimable key's outcome are two
/// statements; a key released or pruned in between is claimed afresh.
async fn claim_commit(
    c: &ClientWrapper,
    claim: ClaimCommit<'_>,
) -> Result<CommitClaim, StoreError> {
    let (key, now) = (claim.key, claim.now);
    let until = now.saturating_add(claim.lease_ms);
    let keep = claim.keep_until.max(until);
    execute(c, statements::PRUNE_COMMITS, &[&now, &PRUNE_BATCH]).await?;
    for _ in 0..CLAIM_COMMIT_TRIES {
        let stmt = c.prepare_cached(statements::CLAIM_COMMIT).await?;
        let params: Params<'_> = &[&key, &now, &until, &keep, &claim.take_over];
        if c.query_opt(&stmt, params).await?.is_some() {
            return Ok(CommitClaim::Run);
        }
        let read = c.prepare_cached(statements::COMMIT).await?;
        let Some(row) = c.query_opt(&read, &[&key]).await? else {
            continue;
        };
        let f = Fields::named(&row, "commit", key);
        let lease_until: Option<i64> = f.get("lease_until")?;
        return match f.get::<Option<&str>>("envelope")? {
            Some(text) => Ok(CommitClaim::Settled(
                serde_json::from_str(text).map_err(|e| f.corrupt("envelope", e))?,
            )),
            None if lease_until.is_some_and(|until| until < now) => Ok(CommitClaim::Abandoned),
            None => Ok(CommitClaim::Pending),
        };
    }
    Err(StoreError::Unavailable(format!(
        "commit {key} was claimed and released {CLAIM_COMMIT_TRIES} times while this claim \
         ran; try again"
    )))
}

/// Claims a notice (see [`Store::claim_notice`]), pruning a batch of
/// expired ones first.
async fn claim_notice(c: &ClientWrapper, claim: ClaimNotice<'_>) -> Result<bool, StoreError> {
    let until = claim.now.saturating_add(claim.lease_ms);
    let keep = claim.keep_until.max(until);
    execute(c, statements::PRUNE_NOTICES, &[&claim.now, &PRUNE_BATCH]).await?;
    let stmt = c.prepare_cached(statements::CLAIM_NOTICE).await?;
    let params: Params<'_> = &[&claim.key, &claim.now, &until, &keep];
    Ok(c.query_opt(&stmt, params).await?.is_some())
}

async fn settle_commit(
    c: &ClientWrapper,
    key: &str,
    envelope: Option<&str>,
    keep_until: i64,
) -> Result<(), StoreError> {
    match envelope {
        Some(envelope) => {
            execute(
                c,
                statements::SETTLE_COMMIT,
                &[&key, &envelope, &keep_until],
            )
            .await?
        }
        None => execute(c, statements::RELEASE_COMMIT, &[&key]).await?,
    };
    Ok(())
}

#[async_trait]
impl Store for PgStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.client().await?.simple_query("SELECT 1").await?;
        Ok(())
    }

    async fn warm(&self) -> Result<(), StoreError> {
        self.warm_groups().await
    }

    async fn insert_job(&self, job: NewJob) -> Result<Inserted, StoreError> {
        self.groups.insert.run(Insert::of(job)?).await
    }

    async fn job(&self, tenant: &str, id: &str) -> Result<Option<JobRecord>, StoreError> {
        let c = self.client().await?;
        query_one(&c, statements::JOB, &[&id, &tenant], job_from_row).await
    }

    async fn job_by_id(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        let c = self.client().await?;
        query_one(&c, statements::JOB_BY_ID, &[&id], job_from_row).await
    }

    async fn list_jobs(&self, list: ListJobs<'_>) -> Result<JobPage, StoreError> {
        let ListJobs {
            tenant,
            filter,
            limit,
            cursor,
        } = list;
        list_jobs(&*self.client().await?, tenant, filter, limit, cursor).await
    }

    async fn claim_next(&self, claim: ClaimNext<'_>) -> Result<Option<JobRecord>, StoreError> {
        let mut c = self.client().await?;
        let until = claim.now.saturating_add(claim.lease_ms);
        let lock = c.prepare_cached(statements::LOCK_POOL).await?;
        let next = c.prepare_cached(&statements::CLAIM_NEXT).await?;
        let tx = c.transaction().await?;
        tx.execute(&lock, &[&claim.pool]).await?;
        let row = tx
            .query_opt(&next, &[&claim.pool, &claim.worker, &claim.now, &until])
            .await?;
        let job = row.as_ref().map(job_from_row).transpose()?;
        if let Some(job) = job.as_ref().filter(|job| job.fair_rank > 0) {
            let clock = tx.prepare_cached(statements::FAIR_CLOCK).await?;
            tx.execute(&clock, &[&claim.pool, &job.fair_rank]).await?;
        }
        tx.commit().await?;
        Ok(job)
    }

    async fn fair_turn(&self, pool: &str, tenant: &str) -> Result<i64, StoreError> {
        let c = self.client().await?;
        let stmt = c.prepare_cached(statements::FAIR_TURN).await?;
        let row = c.query_one(&stmt, &[&pool, &tenant]).await?;
        Fields::named(&row, "fair_turns", tenant).get("rank")
    }

    async fn running_with_key(&self, key: &str, now: i64) -> Result<u32, StoreError> {
        let c = self.client().await?;
        let stmt = c.prepare_cached(&statements::RUNNING_WITH_KEY).await?;
        let row = c.query_one(&stmt, &[&key, &now]).await?;
        let n: i64 = Fields::named(&row, "jobs", key).get("n")?;
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    async fn claim(&self, claim: ClaimJob<'_>) -> Result<Option<JobRecord>, StoreError> {
        self.groups.claim.run(claim.into()).await
    }

    async fn heartbeat(&self, beat: Heartbeat<'_>) -> Result<Lease, StoreError> {
        heartbeat(&*self.client().await?, beat).await
    }

    async fn set_progress(&self, report: SetProgress<'_>) -> Result<bool, StoreError> {
        let (id, worker, attempt) = parts(report.lease);
        let progress = encode(report.progress)?;
        let c = self.client().await?;
        let params: Params<'_> = &[&id, &worker, &attempt, &progress, &report.now];
        Ok(execute(&c, &statements::PROGRESS, params).await? > 0)
    }

    async fn checkpoint(&self, id: &str) -> Result<Option<Value>, StoreError> {
        let c = self.client().await?;
        let read = |row: &Row| Fields::named(row, "job", id).json_opt("checkpoint");
        let stmt = c.prepare_cached(statements::READ_CHECKPOINT).await?;
        match c.query_opt(&stmt, &[&id]).await? {
            Some(row) => read(&row),
            None => Ok(None),
        }
    }

    async fn save_checkpoint(&self, save: SaveCheckpoint<'_>) -> Result<bool, StoreError> {
        let (id, worker, attempt) = parts(save.lease);
        let checkpoint = encode(save.checkpoint)?;
        let c = self.client().await?;
        let params: Params<'_> = &[&id, &worker, &attempt, &checkpoint, &save.now];
        Ok(execute(&c, &statements::CHECKPOINT, params).await? > 0)
    }

    async fn park(&self, park: Park<'_>) -> Result<Option<JobRecord>, StoreError> {
        let (id, worker, attempt) = parts(park.lease);
        let c = self.client().await?;
        let params: Params<'_> = &[&id, &worker, &attempt, &park.ticket, &park.now];
        query_one(&c, &statements::PARK, params, job_from_row).await
    }

    async fn defer(&self, defer: Defer<'_>) -> Result<Option<JobRecord>, StoreError> {
        let (id, worker, attempt) = parts(defer.lease);
        let c = self.client().await?;
        let params: Params<'_> = &[&id, &worker, &attempt, &defer.until, &defer.now];
        query_one(&c, &statements::DEFER, params, job_from_row).await
    }

    async fn wake(&self, ticket: &str, now: i64) -> Result<Vec<JobRecord>, StoreError> {
        let c = self.client().await?;
        query_all(&c, &statements::WAKE, &[&ticket, &now], job_from_row).await
    }

    async fn succeed(&self, done: Succeed<'_>) -> Result<Option<JobRecord>, StoreError> {
        self.groups.succeed.run(done.into()).await
    }

    async fn fail(&self, failed: Fail<'_>) -> Result<Option<JobRecord>, StoreError> {
        let (id, worker, attempt) = parts(failed.lease);
        let error = encode(failed.error)?;
        let c = self.client().await?;
        let params: Params<'_> = &[
            &id,
            &worker,
            &attempt,
            &error,
            &failed.retry_at,
            &failed.now,
        ];
        query_one(&c, &statements::FAIL, params, job_from_row).await
    }

    async fn cancel(&self, job: CancelJob<'_>) -> Result<Option<JobRecord>, StoreError> {
        let CancelJob { tenant, id, now } = job;
        cancel(&*self.client().await?, tenant, id, now).await
    }

    async fn dead_letter(&self, dead: DeadLetter<'_>) -> Result<Option<JobRecord>, StoreError> {
        let error = encode(dead.error)?;
        let c = self.client().await?;
        let params: Params<'_> = &[&dead.id, &error, &dead.now, &dead.died_at];
        query_one(&c, &statements::DEAD_LETTER, params, job_from_row).await
    }

    async fn requeue(&self, requeue: Requeue<'_>) -> Result<Option<JobRecord>, StoreError> {
        let Requeue { tenant, id, now } = requeue;
        let c = self.client().await?;
        query_one(
            &c,
            &statements::REQUEUE,
            &[&id, &tenant, &now],
            job_from_row,
        )
        .await
    }

    /// At most 1000 jobs per call.
    async fn requeue_many(&self, many: RequeueMany<'_>) -> Result<Vec<JobRecord>, StoreError> {
        let states: Vec<&str> = many.states.iter().map(|s| s.as_str()).collect();
        let limit = i64::from(many.limit.min(MAX_BATCH));
        let c = self.client().await?;
        let params: Params<'_> = &[
            &many.tenant,
            &many.user,
            &many.tool,
            &states,
            &many.error_code,
            &many.since,
            &many.until,
            &limit,
            &many.now,
        ];
        query_all(&c, &statements::REQUEUE_MANY, params, job_from_row).await
    }

    /// At most 1000 jobs of each kind per call, so one read stays bounded.
    async fn due_jobs(&self, due: DueJobs<'_>) -> Result<DuePage, StoreError> {
        let limit = due.limit.min(MAX_BATCH);
        let due_by = due.due_by.max(due.now);
        let c = self.client().await?;
        let part = async |sql: &str, from: &DueFrom, bound: i64| match from.key() {
            Some((at, id)) => {
                let params: [&(dyn ToSql + Sync); 4] = [&at, &id, &bound, &i64::from(limit)];
                query_all(&c, sql, &params, job_from_row).await
            }
            None => Ok(Vec::new()),
        };
        Ok(DuePage::of(
            part(&statements::DUE_WAITING, &due.after.waiting, due_by).await?,
            part(&statements::DUE_SCHEDULED, &due.after.scheduled, due_by).await?,
            part(&statements::DUE_EXPIRED, &due.after.expired, due.now).await?,
            limit,
        ))
    }

    async fn beat_dispatcher(&self, origin: &str, now: i64) -> Result<(), StoreError> {
        let c = self.client().await?;
        execute(&c, statements::BEAT_DISPATCHER, &[&origin, &now]).await?;
        Ok(())
    }

    async fn silent_dispatchers(
        &self,
        seen_before: i64,
        limit: u32,
    ) -> Result<Vec<SilentDispatcher>, StoreError> {
        let limit = i64::from(limit.min(MAX_BATCH));
        let c = self.client().await?;
        let stmt = c.prepare_cached(statements::SILENT_DISPATCHERS).await?;
        let rows = c.query(&stmt, &[&seen_before, &limit]).await?;
        rows.iter()
            .map(|row| {
                let f = Fields::new(row, "dispatcher", "origin");
                Ok(SilentDispatcher {
                    origin: f.get("origin")?,
                    seen_at: f.get("seen_at")?,
                })
            })
            .collect()
    }

    async fn queued_from(&self, from: QueuedFrom<'_>) -> Result<Vec<JobRecord>, StoreError> {
        let QueuedFrom {
            origin,
            since,
            after,
            limit,
        } = from;
        let limit = i64::from(limit.min(MAX_BATCH));
        let after = after.unwrap_or("");
        let c = self.client().await?;
        let params: Params<'_> = &[&origin, &since, &after, &limit];
        query_all(&c, &statements::QUEUED_FROM, params, job_from_row).await
    }

    async fn forget_dispatcher(&self, origin: &str, seen_before: i64) -> Result<bool, StoreError> {
        let c = self.client().await?;
        let sql = "DELETE FROM dispatchers WHERE origin = $1 AND seen_at < $2";
        Ok(execute(&c, sql, &[&origin, &seen_before]).await? > 0)
    }

    async fn unnotified_jobs(&self, search: Unnotified<'_>) -> Result<Vec<JobRecord>, StoreError> {
        let Unnotified {
            notice_prefix,
            since,
            until,
            limit,
        } = search;
        let limit = i64::from(limit.min(MAX_BATCH));
        let c = self.client().await?;
        let params: Params<'_> = &[&notice_prefix, &since, &until, &limit];
        query_all(&c, &statements::UNNOTIFIED, params, job_from_row).await
    }

    async fn job_counts(&self) -> Result<Vec<(JobState, u64)>, StoreError> {
        job_counts(&*self.client().await?).await
    }

    async fn queue_stats(&self, tenant: &str, since: i64) -> Result<Vec<PoolRow>, StoreError> {
        let c = self.client().await?;
        let statement = &*statements::QUEUE_STATS;
        query_all(&c, statement, &[&tenant, &since], |row| {
            crate::rows::pool_row(&super::rows::Fields::new(row, "pool", "pool"))
        })
        .await
    }

    async fn unnotified_tickets(
        &self,
        search: Unnotified<'_>,
    ) -> Result<Vec<TicketRecord>, StoreError> {
        let Unnotified {
            notice_prefix,
            since,
            until,
            limit,
        } = search;
        let limit = i64::from(limit.min(MAX_BATCH));
        let c = self.client().await?;
        let params: Params<'_> = &[&notice_prefix, &since, &until, &limit];
        query_all(&c, statements::UNNOTIFIED_TICKETS, params, ticket_from_row).await
    }

    async fn insert_ticket(&self, ticket: NewTicket) -> Result<TicketRecord, StoreError> {
        insert_ticket(&*self.client().await?, &ticket).await
    }

    async fn ticket(&self, tenant: &str, id: &str) -> Result<Option<TicketRecord>, StoreError> {
        let c = self.client().await?;
        query_one(&c, statements::TICKET, &[&id, &tenant], ticket_from_row).await
    }

    async fn respond_ticket(
        &self,
        respond: RespondTicket<'_>,
    ) -> Result<Option<Responded>, StoreError> {
        respond_ticket(&*self.client().await?, respond).await
    }

    async fn answer_ticket(
        &self,
        answering: AnswerTicket<'_>,
    ) -> Result<Option<Answered>, StoreError> {
        let AnswerTicket {
            tenant,
            id,
            answer,
            now,
        } = answering;
        let answer = encode(answer)?;
        answer_ticket(&*self.client().await?, tenant, id, &answer, now).await
    }

    async fn list_tickets(&self, list: ListTickets<'_>) -> Result<TicketPage, StoreError> {
        list_tickets(&*self.client().await?, list).await
    }

    /// At most 1000 tickets per call, so one sweep stays bounded.
    async fn expire_tickets(&self, now: i64, limit: u32) -> Result<Vec<TicketRecord>, StoreError> {
        let limit = i64::from(limit.min(MAX_BATCH));
        let c = self.client().await?;
        query_all(
            &c,
            statements::EXPIRE_TICKETS,
            &[&now, &limit],
            ticket_from_row,
        )
        .await
    }

    async fn settle_ticket(
        &self,
        settle: SettleTicket<'_>,
    ) -> Result<Option<TicketRecord>, StoreError> {
        settle_ticket(&*self.client().await?, settle).await
    }

    /// At most 1000 tickets per call.
    async fn unsettled_tickets(
        &self,
        before: i64,
        limit: u32,
    ) -> Result<Vec<TicketRecord>, StoreError> {
        let limit = i64::from(limit.min(MAX_BATCH));
        let c = self.client().await?;
        let params: Params<'_> = &[&before, &limit];
        query_all(&c, statements::UNSETTLED_TICKETS, params, ticket_from_row).await
    }

    async fn insert_run(&self, run: NewRun) -> Result<RunInserted, StoreError> {
        insert_run(&*self.client().await?, &run).await
    }

    async fn run(&self, tenant: &str, id: &str) -> Result<Option<RunRecord>, StoreError> {
        let c = self.client().await?;
        query_one(&c, statements::RUN, &[&id, &tenant], run_from_row).await
    }

    async fn run_by_id(&self, id: &str) -> Result<Option<RunRecord>, StoreError> {
        let c = self.client().await?;
        query_one(&c, statements::RUN_BY_ID, &[&id], run_from_row).await
    }

    async fn list_runs(&self, list: ListRuns<'_>) -> Result<RunPage, StoreError> {
        let page = Paging::new(list.limit, list.cursor);
        list_runs(&*self.client().await?, list.tenant, list.filter, &page).await
    }

    async fn update_run(&self, update: UpdateRun<'_>) -> Result<Option<RunRecord>, StoreError> {
        update_run(&mut *self.client().await?, update).await
    }

    async fn waiting_runs(&self, item: &str) -> Result<Vec<RunRecord>, StoreError> {
        let c = self.client().await?;
        query_all(&c, &statements::WAITING_RUNS, &[&item], run_from_row).await
    }

    /// At most 1000 runs per call.
    async fn stale_runs(&self, stale: StaleRuns) -> Result<Vec<RunRecord>, StoreError> {
        let limit = i64::from(stale.limit.min(MAX_BATCH));
        let c = self.client().await?;
        let params: Params<'_> = &[&stale.state.as_str(), &stale.before, &limit];
        query_all(&c, statements::STALE_RUNS, params, run_from_row).await
    }

    /// One statement per call, so a batch is appended whole or not at all.
    async fn append_audit(&self, records: &[AuditRecord]) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        append_audit(&*self.client().await?, records).await
    }

    /// At most 1000 records per call.
    async fn audit(&self, tenant: &str, limit: u32) -> Result<Vec<AuditRecord>, StoreError> {
        let limit = i64::from(limit.clamp(1, MAX_BATCH));
        let c = self.client().await?;
        query_all(&c, statements::AUDIT, &[&tenant, &limit], audit_from_row).await
    }

    async fn claim_notice(&self, claim: ClaimNotice<'_>) -> Result<bool, StoreError> {
        claim_notice(&*self.client().await?, claim).await
    }

    async fn settle_notice(&self, settle: SettleNotice<'_>) -> Result<(), StoreError> {
        let params: Params<'_> = &[&settle.key, &settle.delivered, &settle.keep_until];
        execute(&*self.client().await?, statements::SETTLE_NOTICE, params).await?;
        Ok(())
    }

    async fn claim_commit(&self, claim: ClaimCommit<'_>) -> Result<CommitClaim, StoreError> {
        claim_commit(&*self.client().await?, claim).await
    }

    async fn settle_commit(&self, settle: SettleCommit<'_>) -> Result<(), StoreError> {
        let SettleCommit {
            key,
            outcome,
            keep_until,
        } = settle;
        let envelope = outcome.map(Envelope::to_json);
        let c = self.client().await?;
        settle_commit(&c, key, envelope.as_deref(), keep_until).await
    }

    async fn take_token(&self, take: TakeToken<'_>) -> Result<Option<i64>, StoreError> {
        let (interval, tolerance) = take.terms();
        let c = self.client().await?;
        let params: Params<'_> = &[&take.key, &take.now, &interval, &tolerance];
        let stmt = c.prepare_cached(statements::TAKE_TOKEN).await?;
        if c.query_opt(&stmt, params).await?.is_some() {
            return Ok(None);
        }
        let stmt = c.prepare_cached(statements::TOKEN_TAT).await?;
        let tat: i64 = match c.query_opt(&stmt, &[&take.key]).await? {
            Some(row) => Fields::named(&row, "rate_limits", take.key).get("tat")?,
            None => take.now,
        };
        Ok(Some(take.wait(tat)))
    }

    /// At most 10,000 records per call, so one statement stays short.
    async fn prune(&self, prune: Prune) -> Result<u64, StoreError> {
        let limit = i64::from(prune.limit.min(crate::MAX_PRUNE));
        let c = self.client().await?;
        let params: Params<'_> = &[&prune.before, &limit];
        match prune.kind {
            Retained::Jobs => execute(&c, &statements::PRUNE_JOBS, params).await,
            Retained::Tickets => execute(&c, statements::PRUNE_TICKETS, params).await,
            Retained::Audit => execute(&c, statements::PRUNE_AUDIT, params).await,
            Retained::Runs => {
                let stmt = c.prepare_cached(&statements::PRUNE_RUNS).await?;
                let row = c.query_one(&stmt, params).await?;
                let gone: i64 = Fields::named(&row, "runs", "prune").get("count")?;
                Ok(u64::try_from(gone).unwrap_or(0))
            }
        }
    }

    async fn put_handle(&self, handle: NewHandle<'_>) -> Result<u64, StoreError> {
        let size = i64::try_from(handle.value.len()).unwrap_or(i64::MAX);
        let max = i64::from(handle.max_per_tenant);
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let put = tx.prepare_cached(statements::PUT_HANDLE).await?;
        let params: Params<'_> = &[
            &handle.id,
            &handle.tenant,
            &handle.user,
            &handle.tool,
            &handle.value,
            &size,
            &handle.now,
            &handle.expires_at,
        ];
        tx.execute(&put, params).await?;
        let evict = tx.prepare_cached(statements::EVICT_HANDLES).await?;
        let gone = tx
            .execute(
                &evict,
                &[&handle.tenant, &max, &handle.max_bytes_per_tenant],
            )
            .await?;
        tx.commit().await?;
        Ok(gone)
    }

    async fn handle(
        &self,
        owner: HandleOwner<'_>,
        id: &str,
    ) -> Result<Option<HandleRecord>, StoreError> {
        let c = self.client().await?;
        let stmt = c.prepare_cached(statements::HANDLE).await?;
        let params: Params<'_> = &[&id, &owner.tenant, &owner.user, &owner.now];
        let Some(row) = c.query_opt(&stmt, params).await? else {
            return Ok(None);
        };
        let info = handle_info(&row)?;
        let value = Fields::named(&row, "handles", &info.id).get("value")?;
        Ok(Some(HandleRecord { info, value }))
    }

    async fn list_handles(
        &self,
        owner: HandleOwner<'_>,
        before: Option<&str>,
        limit: u32,
    ) -> Result<Vec<HandleInfo>, StoreError> {
        let limit = i64::from(limit.min(crate::MAX_HANDLE_LIST));
        let c = self.client().await?;
        let stmt = c.prepare_cached(statements::LIST_HANDLES).await?;
        let params: Params<'_> = &[&owner.tenant, &owner.user, &owner.now, &before, &limit];
        let rows = c.query(&stmt, params).await?;
        rows.iter().map(handle_info).collect()
    }

    async fn prune_handles(&self, now: i64, limit: u32) -> Result<u64, StoreError> {
        let limit = i64::from(limit.min(crate::MAX_PRUNE));
        let c = self.client().await?;
        execute(&c, statements::PRUNE_HANDLES, &[&now, &limit]).await
    }

    async fn schedules(&self) -> Result<Vec<ScheduleRecord>, StoreError> {
        let c = self.client().await?;
        let stmt = c.prepare_cached(statements::SCHEDULES).await?;
        let rows = c.query(&stmt, &[]).await?;
        rows.iter().map(schedule_record).collect()
    }

    async fn advance_schedule(&self, advance: AdvanceSchedule<'_>) -> Result<bool, StoreError> {
        let c = self.client().await?;
        let moved = match advance.from {
            None => {
                let params: Params<'_> = &[&advance.name, &advance.to, &advance.job, &advance.now];
                execute(&c, statements::SCHEDULE_FIRST, params).await?
            }
            Some(from) => {
                let params: Params<'_> = &[
                    &advance.name,
                    &from,
                    &advance.to,
                    &advance.job,
                    &advance.now,
                ];
                execute(&c, statements::SCHEDULE_ADVANCE, params).await?
            }
        };
        Ok(moved == 1)
    }

    async fn pause_schedule(
        &self,
        name: &str,
        paused: bool,
        now: i64,
    ) -> Result<ScheduleRecord, StoreError> {
        let c = self.client().await?;
        let stmt = c.prepare_cached(statements::SCHEDULE_PAUSE).await?;
        let row = c.query_one(&stmt, &[&name, &paused, &now]).await?;
        schedule_record(&row)
    }
}

/// A schedule's record off a row of `schedules`.
fn handle_info(row: &Row) -> Result<HandleInfo, StoreError> {
    let id: String = Fields::named(row, "handles", "").get("id")?;
    let fields = Fields::named(row, "handles", &id);
    Ok(HandleInfo {
        tool: fields.get("tool")?,
        size_bytes: fields.get("size_bytes")?,
        created_at: fields.get("created_at")?,
        expires_at: fields.get("expires_at")?,
        id,
    })
}

fn schedule_record(row: &Row) -> Result<ScheduleRecord, StoreError> {
    let name: String = Fields::named(row, "schedules", "").get("name")?;
    let fields = Fields::named(row, "schedules", &name);
    Ok(ScheduleRecord {
        last_tick: fields.get("last_tick")?,
        last_job: fields.get("last_job")?,
        paused: fields.get("paused")?,
        updated_at: fields.get("updated_at")?,
        name,
    })
}
