//! The SQLite store: the embedded default, one file in the data directory.
//!
//! This module owns the SQL of every transition of a job, ticket, run and
//! command outcome for SQLite, and the opening of the file (pragmas, migrations
//! embedded from `migrations/sqlite`). It must never read a job and then write
//! it: each transition is one conditional `UPDATE ... RETURNING`, so two
//! workers or two processes on the same file cannot both win. It must never
//! panic on what it reads: a row it cannot decode is a
//! [`StoreError::Unavailable`] naming the row.
//!
//! All statements run on one connection thread of `tokio-rusqlite`, so the
//! async runtime never blocks on the file.

use std::borrow::Cow;
use std::path::Path;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rusqlite::{
    Connection, OptionalExtension, Params, Row, TransactionBehavior, named_params, params,
};
use serde_json::Value;
use toolfleet_core::middleware::canonical_json;
use toolfleet_core::{AuditRecord, Envelope, ErrorCode, JobState, ToolError, TraceContext};

use crate::rows::{self, Columns, Paging, RowName, encode, to_i64};
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

mod embedded {
    refinery::embed_migrations!("../../migrations/sqlite");
}

mod groups;

use groups::Groups;

/// How long a statement waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// The pause between two attempts to set up a database being set up by
/// another process too.
const SET_UP_PAUSE: Duration = Duration::from_millis(20);
/// Bound of one answer of [`Store::due_jobs`], [`Store::audit`] and the
/// other sweeps.
const MAX_BATCH: u32 = 1000;
/// Settled commit outcomes pruned per claim, so pruning stays cheap.
const PRUNE_BATCH: i64 = 100;

/// The statements that move a job: each executes one transition of
/// [`toolfleet_core::lifecycle`], naming the states it moves from and to as
/// the lifecycle lists them.
mod sql {
    use std::sync::LazyLock;

    use toolfleet_core::lifecycle::{JobState, Transition, sql_any, sql_list};

    use crate::RunState;

    /// A statement built once from the lifecycle's state lists.
    type Built = LazyLock<String>;

    /// `enqueue`: (new) -> queued, or `schedule`: (new) -> scheduled, as
    /// [`NewJob::start`] says (`?19`, the state, and `?20`, when due).
    ///
    /// The writes on every job's path (this insert, [`CLAIM`] or
    /// [`CLAIM_NEXT`], and [`SUCCEED`]) say `OR FAIL`: each writes one row, whose constraints
    /// SQLite checks before it writes anything, so a failure leaves nothing
    /// to undo, as under the default `ABORT`; but a statement that may
    /// `ABORT` inside a batch's transaction opens a statement journal and
    /// copies there every page it is about to change (7 % of the
    /// instructions SQLite runs for a job).
    pub(super) const INSERT_JOB: &str = "
        INSERT OR FAIL INTO jobs (id, tenant, user, tool, pool, args, state, attempts, max_attempts,
            timeout_ms, run_at, idempotency_key, run_id, call_id, callback_url, lineage, scopes,
            traceparent, tracestate, origin, priority, concurrency_key, concurrency_limit,
            fair_rank, created_at, updated_at)
        VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?19, 0, ?7,
            ?8, ?20, ?10, ?11, ?12, ?13, ?14, ?15,
            ?16, ?17, ?18, ?21, ?22, ?23,
            ?24, ?9, ?9)
        ON CONFLICT DO NOTHING";

    /// The queued jobs a silent dispatcher made since a time, by id.
    pub(super) static QUEUED_FROM: Built = LazyLock::new(|| {
        format!(
            "SELECT * FROM jobs WHERE state = '{queued}' AND origin = ?1 AND created_at >= ?2
                AND id > ?3 ORDER BY id LIMIT ?4",
            queued = Transition::Enqueue.to()
        )
    });

    pub(super) const JOB_BY_KEY: &str =
        "SELECT * FROM jobs WHERE tenant = ?1 AND tool = ?2 AND idempotency_key = ?3";

    /// `claim` (queued or retrying, due) and `take_over` (running, its
    /// lease expired) -> running. A job taken over is runnable from when
    /// the expired lease ended.
    pub(super) static CLAIM: Built = LazyLock::new(|| {
        format!(
            "
        UPDATE OR FAIL jobs SET state = '{running}', attempts = attempts + 1,
            run_at = CASE WHEN state IN {taken} THEN COALESCE(lease_until, run_at)
                          ELSE run_at END,
            lease_owner = ?2, lease_until = ?4, updated_at = ?3, started_at = ?3
        WHERE id = ?1
          AND (({claimed} AND run_at <= ?3)
               OR (state IN {taken} AND lease_until < ?3))
        RETURNING *",
            running = Transition::Claim.to(),
            claimed = sql_any("state", Transition::Claim.from()),
            taken = sql_list(Transition::TakeOver.from()),
        )
    });

    /// [`CLAIM`] of the next job of the ordered pool ?1 off `jobs_ordered`
    /// (its predicate repeated, so SQLite uses it): the highest priority,
    /// then the earliest due, then the smallest id, of the jobs without a
    /// concurrency key and those whose key has fewer than its limit running
    /// with a lease that holds (off `jobs_keyed`). One statement under
    /// SQLite's one writer: no two claims count the same free slot.
    pub(super) static CLAIM_NEXT: Built = LazyLock::new(|| {
        format!(
            "
        UPDATE OR FAIL jobs SET state = '{running}', attempts = attempts + 1,
            run_at = CASE WHEN state IN {taken} THEN COALESCE(lease_until, run_at)
                          ELSE run_at END,
            lease_owner = ?2, lease_until = ?4, updated_at = ?3, started_at = ?3
        WHERE id = (SELECT id FROM jobs INDEXED BY jobs_ordered
            WHERE pool = ?1 AND priority IS NOT NULL
              AND {ordered}
              AND (({claimed} AND run_at <= ?3)
                   OR (state IN {taken} AND lease_until < ?3))
              AND (concurrency_key IS NULL OR concurrency_limit > (
                  SELECT count(*) FROM jobs r INDEXED BY jobs_keyed
                  WHERE r.concurrency_key = jobs.concurrency_key
                    AND r.concurrency_key IS NOT NULL AND r.state = 'running'
                    AND r.lease_until >= ?3))
            ORDER BY priority DESC, fair_rank, run_at, id LIMIT 1)
        RETURNING *",
            running = Transition::Claim.to(),
            ordered = sql_any("state", &ORDERED),
            claimed = sql_any("state", Transition::Claim.from()),
            taken = sql_list(Transition::TakeOver.from()),
        )
    });

    /// The states of `jobs_ordered`'s condition, as migration 26 writes
    /// them: the claim's and the take-over's.
    const ORDERED: [JobState; 4] = [
        JobState::Queued,
        JobState::Scheduled,
        JobState::Retrying,
        JobState::Running,
    ];

    // Every statement of a running job's holder names its attempt (`?1`
    // the job, `?2` the lease owner, `?3` the attempt): by lease owner and
    // attempt both, so an attempt that lost the job to a newer claim, even
    // its own worker's, no longer matches.

    /// `WHERE` of a statement of the attempt holding a running job.
    fn held() -> String {
        format!(
            "id = ?1 AND state IN {} AND lease_owner = ?2 AND attempts = ?3",
            sql_list(Transition::Heartbeat.from())
        )
    }

    /// `heartbeat`: running (this attempt) -> running, lease extended.
    pub(super) static HEARTBEAT: Built = LazyLock::new(|| {
        format!(
            "UPDATE jobs SET lease_until = ?5, updated_at = ?4 WHERE {}",
            held()
        )
    });

    /// Under `heartbeat`'s guard: progress recorded.
    pub(super) static PROGRESS: Built = LazyLock::new(|| {
        format!(
            "UPDATE jobs SET progress = ?4, updated_at = ?5 WHERE {}",
            held()
        )
    });

    /// `park`: running (this attempt) -> parked on a ticket: unleased, the
    /// attempt given back.
    pub(super) static PARK: Built = LazyLock::new(|| {
        format!(
            "
        UPDATE jobs SET state = '{parked}',
            attempts = attempts - 1, lease_owner = NULL, lease_until = NULL,
            waiting_on = ?4, updated_at = ?5
        WHERE {held}
        RETURNING *",
            parked = Transition::Park.to(),
            held = held()
        )
    });

    /// `defer`: running (this attempt) -> retrying, due at ?4, the
    /// attempt given back.
    pub(super) static DEFER: Built = LazyLock::new(|| {
        format!(
            "
        UPDATE jobs SET state = '{retrying}',
            attempts = attempts - 1, lease_owner = NULL, lease_until = NULL,
            run_at = ?4, updated_at = ?5
        WHERE {held}
        RETURNING *",
            retrying = Transition::Defer.to(),
            held = held()
        )
    });

    /// `wake`: parked on the ticket -> retrying, due now.
    pub(super) static WAKE: Built = LazyLock::new(|| {
        format!(
            "
        UPDATE jobs SET state = '{to}', run_at = ?2, waiting_on = NULL, updated_at = ?2
        WHERE waiting_on = ?1 AND state IN {from}
        RETURNING *",
            to = Transition::Wake.to(),
            from = sql_list(Transition::Wake.from())
        )
    });

    /// Under `heartbeat`'s guard: checkpoint saved.
    pub(super) static CHECKPOINT: Built = LazyLock::new(|| {
        format!(
            "UPDATE jobs SET checkpoint = ?4, updated_at = ?5 WHERE {}",
            held()
        )
    });

    /// `succeed`: running (this attempt) -> succeeded.
    pub(super) static SUCCEED: Built = LazyLock::new(|| succeed("*"));

    /// As [`SUCCEED`], reading back only what may change under a lease
    /// (its progress): for successes whose holder has the claimed record.
    pub(super) static SUCCEED_LEAN: Built = LazyLock::new(|| succeed("id, progress"));

    fn succeed(returning: &str) -> String {
        format!(
            "
        UPDATE OR FAIL jobs SET state = '{to}', result = ?4,
            lease_owner = NULL, lease_until = NULL, updated_at = ?5
        WHERE {held}
        RETURNING {returning}",
            to = Transition::Succeed.to(),
            held = held()
        )
    }

    /// `retry` (with a time ?5) or `fail` (without): running (this
    /// attempt) -> retrying at ?5, or failed. The lifecycle decided which
    /// ([`toolfleet_core::lifecycle::after_failure`]).
    pub(super) static FAIL: Built = LazyLock::new(|| {
        format!(
            "
        UPDATE jobs SET
            state = CASE WHEN ?5 IS NOT NULL THEN '{retrying}' ELSE '{failed}' END,
            run_at = COALESCE(?5, run_at),
            attempts_log = json_insert(COALESCE(attempts_log, '[]'), '$[#]', json_object(
                'attempt', attempts, 'started_at', started_at, 'ended_at', ?6,
                'error', json(?4))),
            error = ?4, lease_owner = NULL, lease_until = NULL, updated_at = ?6
        WHERE {held}
        RETURNING *",
            retrying = Transition::Retry.to(),
            failed = Transition::Fail.to(),
            held = held()
        )
    });

    /// `cancel`: queued, retrying, parked or running -> cancelled.
    pub(super) static CANCEL: Built = LazyLock::new(|| {
        format!(
            "
        UPDATE jobs SET state = '{to}', error = ?3,
            lease_owner = NULL, lease_until = NULL, waiting_on = NULL, updated_at = ?4
        WHERE id = ?1 AND tenant = ?2 AND {from}
        RETURNING *",
            to = Transition::Cancel.to(),
            from = sql_any("state", Transition::Cancel.from())
        )
    });

    /// `dead_letter`: waiting, or running with a lease that ended before
    /// `?3` -> failed with the error `?2`.
    pub(super) static DEAD_LETTER: Built = LazyLock::new(|| {
        format!(
            "
        UPDATE jobs SET state = '{to}', error = ?2,
            lease_owner = NULL, lease_until = NULL, updated_at = ?3
        WHERE id = ?1 AND ({waiting} OR (state = '{running}' AND lease_until < ?3))
          AND (?4 IS NULL OR updated_at <= ?4)
        RETURNING *",
            to = Transition::DeadLetter.to(),
            waiting = sql_any("state", crate::unheld_states()),
            running = JobState::Running,
        )
    });

    /// [`Store::queue_stats`](crate::Store::queue_stats).
    pub(super) static QUEUE_STATS: Built = LazyLock::new(|| crate::queue_stats_sql("?1", "?2"));

    /// `requeue`: failed or cancelled -> queued, due at `?3`.
    pub(super) static REQUEUE: Built = LazyLock::new(|| {
        format!(
            "UPDATE jobs SET {set} WHERE id = ?1 AND tenant = ?2 AND state IN {from}
            RETURNING *",
            set = crate::requeued("?3"),
            from = sql_list(Transition::Requeue.from())
        )
    });

    /// `requeue` of a tenant's jobs by filter (`?2` user, `?3` tool, `?4`
    /// states as a JSON list, `?5` error code, settled in [`?6`, `?7`)), at
    /// most `?8`, oldest settled first, due at `?9`.
    pub(super) static REQUEUE_MANY: Built = LazyLock::new(|| {
        format!(
            "UPDATE jobs SET {set} WHERE id IN (SELECT id FROM jobs
                WHERE tenant = ?1 AND (?2 IS NULL OR user = ?2) AND (?3 IS NULL OR tool = ?3)
                  AND state IN (SELECT value FROM json_each(?4)) AND state IN {from}
                  AND (?5 IS NULL OR json_extract(error, '$.code') = ?5)
                  AND updated_at >= ?6 AND updated_at < ?7
                ORDER BY updated_at LIMIT ?8)
            RETURNING *",
            set = crate::requeued("?9"),
            from = sql_list(Transition::Requeue.from())
        )
    });

    /// The due jobs of one kind ([`crate::Store::due_jobs`]), each a range
    /// scan of its own index in its order, rather than an OR the planner may
    /// turn into a walk of the whole table: the earliest past the key `?1`
    /// and id `?2` of the page before, at most `?4`, by key and then id, as
    /// the indexes hold them (migration 28). The indexes are partial:
    /// SQLite uses one only for a WHERE that implies its predicate, so the
    /// states here must stay as migrations 26 to 28 write them, by
    /// `sql_any` in the same order (the plan test checks). The lists are
    /// those of `claim` and `take_over`. Waiting jobs are read up to `?3`,
    /// a time that may be ahead of now; scheduled ones have an index of
    /// their own (`jobs_scheduled`), which a backlog of queued jobs cannot
    /// fill; expired leases ended before `?3`, now.
    pub(super) static DUE_WAITING: Built = LazyLock::new(|| {
        due_part(
            "jobs_waiting_due",
            &sql_any("state", Transition::Claim.from()),
            "run_at",
            "run_at <= ?3",
        )
    });

    /// [`DUE_WAITING`]'s scheduled part.
    pub(super) static DUE_SCHEDULED: Built = LazyLock::new(|| {
        let scheduled = format!("state = '{}'", Transition::Schedule.to());
        due_part("jobs_scheduled", &scheduled, "run_at", "run_at <= ?3")
    });

    /// [`DUE_WAITING`]'s expired part.
    pub(super) static DUE_EXPIRED: Built = LazyLock::new(|| {
        due_part(
            "jobs_lease",
            &sql_any("state", Transition::TakeOver.from()),
            "lease_until",
            "lease_until < ?3",
        )
    });

    /// One part of the due jobs: off `index`, of the jobs `states` names,
    /// by `key` past `?1` and id `?2`, within `bound`, at most `?4`.
    fn due_part(index: &str, states: &str, key: &str, bound: &str) -> String {
        format!(
            "SELECT * FROM jobs INDEXED BY {index}
            WHERE {states} AND {bound} AND ({key}, id) > (?1, ?2)
            ORDER BY {key}, id LIMIT ?4"
        )
    }

    /// The settled states, as `jobs_callbacks` (migration 26) names them.
    pub(super) static UNNOTIFIED: Built = LazyLock::new(|| {
        format!(
            "
        SELECT * FROM jobs j
        WHERE callback_url IS NOT NULL
          AND {settled}
          AND updated_at >= ?2 AND updated_at < ?3
          AND NOT EXISTS (SELECT 1 FROM notices n WHERE n.key = ?1 || j.id || ':' || j.state
            || CASE WHEN j.requeues > 0 THEN ':' || j.requeues ELSE '' END)
        ORDER BY updated_at, id LIMIT ?4",
            settled = sql_any("state", &JobState::SETTLED)
        )
    });

    pub(super) const UNNOTIFIED_TICKETS: &str = "
        SELECT * FROM tickets t
        WHERE callback_url IS NOT NULL AND answer IS NOT NULL
          AND answered_at >= ?2 AND answered_at < ?3
          AND NOT EXISTS (SELECT 1 FROM notices n WHERE n.key = ?1 || t.id || ':answered')
        ORDER BY answered_at, id LIMIT ?4";

    /// `?2`: a JSON array of the stored states of the state filter.
    pub(super) const LIST: &str = "
        SELECT * FROM jobs
        WHERE tenant = ?1 AND id < ?3 AND id >= ?5 AND (?2 IS NULL OR tool = ?2)
        ORDER BY id DESC LIMIT ?4";

    /// [`LIST`] of one user's jobs, off `jobs_owner`.
    pub(super) const LIST_OWNED: &str = "
        SELECT * FROM jobs INDEXED BY jobs_owner
        WHERE tenant = ?1 AND user = ?6 AND id < ?3 AND id >= ?5 AND (?2 IS NULL OR tool = ?2)
        ORDER BY id DESC LIMIT ?4";

    pub(super) const INSERT_TICKET: &str = "
        INSERT INTO tickets (id, tenant, user, tool, question, options, args,
            run_id, call_id, callback_url, answered_by, kind, plan, scopes, expires_at,
            input_requests, created_at)
        VALUES (:id, :tenant, :user, :tool, :question, :options, :args,
            :run_id, :call_id, :callback_url, :answered_by, :kind, :plan, :scopes, :expires_at,
            :input_requests, :now)
        ON CONFLICT DO NOTHING
        RETURNING *";

    /// open (neither answered nor expired) -> answered.
    pub(super) const ANSWER: &str = "
        UPDATE tickets SET answer = ?3, answered_at = ?4
        WHERE id = ?1 AND tenant = ?2 AND answer IS NULL AND expired_at IS NULL
        RETURNING *";

    /// An open input ticket's answers (?3) recorded, and when ?4 (they
    /// answer every request) answered at ?5; only while it holds the ?6
    /// answers it was read with (answers are only ever added, so their
    /// count names them).
    pub(super) const RESPOND: &str = "
        UPDATE tickets SET input_responses = ?3,
            answer = CASE WHEN ?4 THEN ?3 END, answered_at = CASE WHEN ?4 THEN ?5 END
        WHERE id = ?1 AND tenant = ?2 AND kind = 'input'
          AND answer IS NULL AND expired_at IS NULL
          AND (SELECT count(*) FROM json_each(input_responses)) = ?6
        RETURNING *";

    /// The conditions of the inbox's filters: `?2` open or answered (both
    /// when NULL), `?3` the kind (both when NULL).
    const TICKET_FILTERS: &str = "
          AND (?2 IS NULL OR (?2 = 'open') = (answer IS NULL AND expired_at IS NULL))
          AND (?3 IS NULL OR kind = ?3)";

    /// An operator's inbox: every ticket of the tenant, off `tickets_tenant`.
    pub(super) static LIST_TICKETS: Built = LazyLock::new(|| {
        format!(
            "
        SELECT * FROM tickets WHERE tenant = ?1 AND id < ?4 {TICKET_FILTERS}
        ORDER BY id DESC LIMIT ?5"
        )
    });

    /// A user's inbox (`?6`, holding the scopes of the JSON array `?7`):
    /// the tickets they opened that their caller answers, off
    /// `tickets_owner`, and those a scope they hold answers, off
    /// `tickets_scope`; each half a page at most.
    pub(super) static LIST_TICKETS_OF: Built = LazyLock::new(|| {
        format!(
            "
        SELECT * FROM (SELECT * FROM tickets INDEXED BY tickets_owner
            WHERE tenant = ?1 AND user = ?6 AND answered_by IS NULL AND id < ?4 {TICKET_FILTERS}
            ORDER BY id DESC LIMIT ?5)
        UNION ALL
        SELECT * FROM (SELECT * FROM tickets INDEXED BY tickets_scope
            WHERE tenant = ?1 AND answered_by IN (SELECT value FROM json_each(?7))
              AND id < ?4 {TICKET_FILTERS}
            ORDER BY id DESC LIMIT ?5)
        ORDER BY id DESC LIMIT ?5"
        )
    });

    /// open, its expiry passed -> expired at `?1`, at most `?2`, off
    /// `tickets_expiry`.
    pub(super) const EXPIRE_TICKETS: &str = "
        UPDATE tickets SET expired_at = ?1
        WHERE id IN (SELECT id FROM tickets
            WHERE answer IS NULL AND expired_at IS NULL AND expires_at IS NOT NULL
              AND expires_at <= ?1
            ORDER BY expires_at LIMIT ?2)
          AND answer IS NULL AND expired_at IS NULL
        RETURNING *";

    /// answered or expired, without an outcome -> its outcome recorded.
    pub(super) const SETTLE_TICKET: &str = "
        UPDATE tickets SET outcome = ?3
        WHERE id = ?1 AND tenant = ?2 AND outcome IS NULL
          AND (answer IS NOT NULL OR expired_at IS NOT NULL)
        RETURNING *";

    /// Off `tickets_unsettled`, in its order.
    pub(super) const UNSETTLED_TICKETS: &str = "
        SELECT * FROM tickets
        WHERE answer IS NOT NULL AND outcome IS NULL AND answered_at < ?1
        ORDER BY answered_at, id LIMIT ?2";

    /// (new) -> running, version 1.
    pub(super) static INSERT_RUN: Built = LazyLock::new(|| {
        format!(
            "
        INSERT INTO runs (id, tenant, user, agent, state, checkpoint, callback_url,
            idempotency_key, scopes, version, created_at, updated_at)
        VALUES (:id, :tenant, :user, :agent, '{running}', :checkpoint, :callback_url,
            :key, :scopes, 1, :now, :now)
        ON CONFLICT DO NOTHING
        RETURNING *",
            running = RunState::Running
        )
    });

    pub(super) const RUN_BY_KEY: &str =
        "SELECT * FROM runs WHERE tenant = ?1 AND user = ?2 AND idempotency_key = ?3";

    /// One of the states of the JSON array `:from`, at `:version` if given
    /// -> `:to`, version + 1; the fields given replace theirs, the wait is
    /// the one given (or kept) when waiting, and cleared otherwise.
    pub(super) static UPDATE_RUN: Built = LazyLock::new(|| {
        format!(
            "
        UPDATE runs SET state = :to, version = version + 1,
            checkpoint = COALESCE(:checkpoint, checkpoint),
            wait = CASE WHEN :to = '{waiting}' THEN COALESCE(:wait, wait) END,
            resumed = COALESCE(:resumed, resumed),
            answer = COALESCE(:answer, answer),
            error = COALESCE(:error, error),
            usage = COALESCE(:usage, usage),
            updated_at = :now
        WHERE id = :id AND (:version IS NULL OR version = :version)
          AND state IN (SELECT value FROM json_each(:from))
        RETURNING *",
            waiting = RunState::Waiting
        )
    });

    pub(super) const DROP_WAITS: &str = "DELETE FROM run_waits WHERE run_id = ?1";

    pub(super) const ADD_WAIT: &str =
        "INSERT INTO run_waits (item, run_id) VALUES (?1, ?2) ON CONFLICT DO NOTHING";

    /// The waiting runs an item of `run_waits` names.
    pub(super) static WAITING_RUNS: Built = LazyLock::new(|| {
        format!(
            "
        SELECT r.* FROM run_waits w JOIN runs r ON r.id = w.run_id
        WHERE w.item = ?1 AND r.state = '{waiting}'
        ORDER BY r.id",
            waiting = RunState::Waiting
        )
    });

    /// Off `runs_stale`, in its order.
    pub(super) const STALE_RUNS: &str = "
        SELECT * FROM runs WHERE state = ?1 AND updated_at < ?2
        ORDER BY updated_at, id LIMIT ?3";

    pub(super) const LIST_RUNS: &str = "
        SELECT * FROM runs
        WHERE tenant = ?1 AND id < ?4
          AND (?2 IS NULL OR state = ?2) AND (?3 IS NULL OR agent = ?3)
        ORDER BY id DESC LIMIT ?5";

    /// [`LIST_RUNS`] of one user's runs, off `runs_owner`.
    pub(super) const LIST_RUNS_OWNED: &str = "
        SELECT * FROM runs INDEXED BY runs_owner
        WHERE tenant = ?1 AND user = ?6 AND id < ?4
          AND (?2 IS NULL OR state = ?2) AND (?3 IS NULL OR agent = ?3)
        ORDER BY id DESC LIMIT ?5";

    pub(super) const INSERT_AUDIT: &str = "
        INSERT INTO audit (at_ms, tenant, user, tool, run_id, call_id, args, status,
            error_code, duration_us, parent_run_id)
        VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)";

    /// Notices past keep_until, up to ?2, off `notices_expiry`.
    pub(super) const PRUNE_NOTICES: &str = "
        DELETE FROM notices WHERE key IN (
            SELECT key FROM notices WHERE keep_until < ?1 LIMIT ?2)";

    /// absent, kept past keep_until, or sending past its lease -> sending
    /// until ?3, kept until ?4.
    pub(super) const CLAIM_NOTICE: &str = "
        INSERT INTO notices (key, state, lease_until, keep_until) VALUES (?1, 'sending', ?3, ?4)
        ON CONFLICT (key) DO UPDATE SET
            state = 'sending', delivered = NULL, lease_until = ?3, keep_until = ?4
        WHERE notices.keep_until < ?2
           OR (notices.state = 'sending' AND notices.lease_until < ?2)
        RETURNING key";

    /// sending (or absent) -> sent, delivered or given up.
    pub(super) const SETTLE_NOTICE: &str = "
        INSERT INTO notices (key, state, delivered, keep_until) VALUES (?1, 'sent', ?2, ?3)
        ON CONFLICT (key) DO UPDATE SET
            state = 'sent', delivered = ?2, lease_until = NULL, keep_until = ?3";

    /// Rate limits: the generic cell rate algorithm, as on PostgreSQL.
    /// `?1` the bucket, `?2` now, `?3` the interval, `?4` the tolerance;
    /// a row answers only when a token was taken.
    pub(super) const TAKE_TOKEN: &str = "INSERT INTO rate_limits (key, tat) VALUES (?1, ?2 + ?3)
        ON CONFLICT (key) DO UPDATE SET tat = MAX(rate_limits.tat, ?2) + ?3
            WHERE MAX(rate_limits.tat, ?2) - ?2 <= ?4
        RETURNING tat";

    /// The arrival time of a bucket that refused a token.
    pub(super) const TOKEN_TAT: &str = "SELECT tat FROM rate_limits WHERE key = ?1";

    // Retention: each statement deletes at most ?2 records settled before
    // ?1, oldest first, off the index migration 14 made for it (named, as
    // SQLite uses a partial index only where the WHERE repeats its
    // predicate, and an expression index only for the same expression).

    /// Settled jobs, off `jobs_settled`.
    pub(super) static PRUNE_JOBS: Built = LazyLock::new(|| {
        format!(
            "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs INDEXED BY jobs_settled
                WHERE {settled} AND updated_at < ?1
                  AND NOT EXISTS (SELECT 1 FROM run_waits w WHERE w.item = jobs.id)
                ORDER BY updated_at LIMIT ?2)",
            settled = sql_any("state", &JobState::SETTLED)
        )
    });

    /// Answered or expired tickets, off `tickets_closed`.
    pub(super) const PRUNE_TICKETS: &str =
        "DELETE FROM tickets WHERE id IN (SELECT id FROM tickets INDEXED BY tickets_closed
            WHERE COALESCE(answered_at, expired_at) < ?1
            ORDER BY COALESCE(answered_at, expired_at) LIMIT ?2)";

    /// Stopped runs, off `runs_stale` (a range per state, so in no order
    /// across them: unsorted, a batch reads no more than it deletes); their
    /// wait rows go with them in the same transaction ([`PRUNE_RUN_WAITS`]
    /// first).
    pub(super) static PRUNE_RUNS: Built = LazyLock::new(|| {
        format!(
            "DELETE FROM runs WHERE id IN (SELECT id FROM runs
                WHERE state IN {stopped} AND updated_at < ?1 LIMIT ?2)",
            stopped = crate::runs::stopped_runs()
        )
    });

    /// The wait rows of the runs [`PRUNE_RUNS`] deletes.
    pub(super) static PRUNE_RUN_WAITS: Built = LazyLock::new(|| {
        format!(
            "DELETE FROM run_waits WHERE run_id IN (SELECT id FROM runs
                WHERE state IN {stopped} AND updated_at < ?1 LIMIT ?2)",
            stopped = crate::runs::stopped_runs()
        )
    });

    /// Keeps a handle (?1 id, ?2 tenant, ?3 user, ?4 tool, ?5 value, ?6
    /// size, ?7 now, ?8 expiry).
    pub(super) const PUT_HANDLE: &str = "INSERT INTO handles
        (id, tenant, user, tool, value, size_bytes, created_at, expires_at)
        VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";

    /// Tenant ?1's handles past its newest ?2 or past ?3 bytes, newest
    /// counted first, off `handles_tenant`.
    pub(super) const EVICT_HANDLES: &str = "DELETE FROM handles WHERE id IN (
        SELECT id FROM (SELECT id,
            ROW_NUMBER() OVER newest AS n,
            SUM(size_bytes) OVER newest AS bytes
            FROM handles INDEXED BY handles_tenant WHERE tenant = ?1
            WINDOW newest AS (ORDER BY id DESC ROWS UNBOUNDED PRECEDING))
        WHERE n > ?2 OR bytes > ?3)";

    /// A user's unexpired handle (?1 id, ?2 tenant, ?3 user, ?4 now).
    pub(super) const HANDLE: &str = "SELECT id, tool, size_bytes, created_at, expires_at, value
        FROM handles WHERE id = ?1 AND tenant = ?2 AND user = ?3 AND expires_at > ?4";

    /// A user's unexpired handles older than ?4 (an id; NULL: from the
    /// newest), newest first, at most ?5, off `handles_owner`.
    pub(super) const LIST_HANDLES: &str = "SELECT id, tool, size_bytes, created_at, expires_at
        FROM handles INDEXED BY handles_owner
        WHERE tenant = ?1 AND user = ?2 AND expires_at > ?3 AND (?4 IS NULL OR id < ?4)
        ORDER BY id DESC LIMIT ?5";

    /// Expired handles, oldest first, at most ?2, off `handles_expiry`.
    pub(super) const PRUNE_HANDLES: &str = "DELETE FROM handles WHERE id IN (SELECT id FROM handles
        INDEXED BY handles_expiry WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)";

    /// Audit records, off `audit_at`.
    pub(super) const PRUNE_AUDIT: &str = "DELETE FROM audit WHERE seq IN (SELECT seq FROM audit
        INDEXED BY audit_at WHERE at_ms < ?1 ORDER BY at_ms LIMIT ?2)";

    /// Settled outcomes and abandoned claims past keep_until (up to ?2 of
    /// each), each read off its partial index (migration 8).
    pub(super) const PRUNE_COMMITS: &str = "
        DELETE FROM commits WHERE key IN (
            SELECT key FROM (SELECT key FROM commits
                WHERE state = 'settled' AND keep_until < ?1 LIMIT ?2)
            UNION ALL
            SELECT key FROM (SELECT key FROM commits
                WHERE state = 'pending' AND keep_until < ?1 LIMIT ?2))";

    /// absent, kept past keep_until, or pending past its lease when ?5 says
    /// to take it over -> pending until ?3, kept until ?4.
    pub(super) const CLAIM_COMMIT: &str = "
        INSERT INTO commits (key, state, lease_until, keep_until) VALUES (?1, 'pending', ?3, ?4)
        ON CONFLICT (key) DO UPDATE SET
            state = 'pending', envelope = NULL, lease_until = ?3, keep_until = ?4
        WHERE commits.keep_until < ?2
           OR (?5 AND commits.state = 'pending' AND commits.lease_until < ?2)
        RETURNING key";

    /// What a claim that did not win found.
    pub(super) const COMMIT: &str = "SELECT envelope, lease_until FROM commits WHERE key = ?1";

    /// pending (or absent) -> settled; a settled outcome is never replaced.
    pub(super) const SETTLE_COMMIT: &str = "
        INSERT INTO commits (key, state, envelope, keep_until) VALUES (?1, 'settled', ?2, ?3)
        ON CONFLICT (key) DO UPDATE SET
            state = 'settled', envelope = ?2, lease_until = NULL, keep_until = ?3
        WHERE commits.state = 'pending'";

    /// How many jobs of concurrency key ?1 run with a lease that holds at
    /// ?2, off `jobs_keyed` (as [`CLAIM_NEXT`] counts them).
    pub(super) const RUNNING_WITH_KEY: &str = "SELECT count(*) FROM jobs INDEXED BY jobs_keyed
        WHERE concurrency_key = ?1 AND concurrency_key IS NOT NULL AND state = 'running'
          AND lease_until >= ?2";

    // Schedules (migration 18).

    /// Every schedule's record.
    /// The next turn of tenant ?2 in fair pool ?1, past the pool's clock.
    pub(super) const FAIR_TURN: &str = "INSERT INTO fair_turns (pool, tenant, rank)
        VALUES (?1, ?2, COALESCE((SELECT rank FROM fair_clocks WHERE pool = ?1), 0) + 1)
        ON CONFLICT (pool, tenant) DO UPDATE SET rank = MAX(fair_turns.rank,
            COALESCE((SELECT rank FROM fair_clocks WHERE pool = ?1), 0)) + 1
        RETURNING rank";

    /// Pool ?1's clock moved on to turn ?2 (never back).
    pub(super) const FAIR_CLOCK: &str = "INSERT INTO fair_clocks (pool, rank) VALUES (?1, ?2)
        ON CONFLICT (pool) DO UPDATE SET rank = MAX(fair_clocks.rank, ?2)";

    pub(super) const SCHEDULES: &str =
        "SELECT name, last_tick, last_job, paused, updated_at FROM schedules ORDER BY name";

    /// The first record of schedule ?1, at tick ?2.
    pub(super) const SCHEDULE_FIRST: &str =
        "INSERT INTO schedules (name, last_tick, last_job, updated_at)
        VALUES (?1, ?2, ?3, ?4) ON CONFLICT (name) DO NOTHING";

    /// Schedule ?1 at tick ?2, not paused -> at tick ?3, having started ?4.
    pub(super) const SCHEDULE_ADVANCE: &str = "UPDATE schedules
        SET last_tick = ?3, last_job = COALESCE(?4, last_job), updated_at = ?5
        WHERE name = ?1 AND last_tick = ?2 AND NOT paused";

    /// Schedule ?1 paused (?2) or resumed at ?3, made if missing; resumed,
    /// its ticks count from ?3.
    pub(super) const SCHEDULE_PAUSE: &str =
        "INSERT INTO schedules (name, last_tick, paused, updated_at)
        VALUES (?1, ?3, ?2, ?3)
        ON CONFLICT (name) DO UPDATE SET paused = ?2, updated_at = ?3,
            last_tick = CASE WHEN ?2 THEN schedules.last_tick ELSE MAX(schedules.last_tick, ?3) END
        RETURNING name, last_tick, last_job, paused, updated_at";
}

/// A schedule's record off a row of `name, last_tick, last_job, paused,
/// updated_at`.
fn schedule_record(row: &Row<'_>) -> rusqlite::Result<ScheduleRecord> {
    Ok(ScheduleRecord {
        name: row.get(0)?,
        last_tick: row.get(1)?,
        last_job: row.get(2)?,
        paused: row.get(3)?,
        updated_at: row.get(4)?,
    })
}

/// A handle's row, as [`sql::HANDLE`] and [`sql::LIST_HANDLES`] read it.
fn handle_info(row: &Row<'_>) -> rusqlite::Result<HandleInfo> {
    Ok(HandleInfo {
        id: row.get(0)?,
        tool: row.get(1)?,
        size_bytes: row.get(2)?,
        created_at: row.get(3)?,
        expires_at: row.get(4)?,
    })
}

/// The SQLite implementation of [`Store`].
pub struct SqliteStore {
    conn: tokio_rusqlite::Connection,
    /// Inserts, claims and successes, many to a transaction under load.
    groups: Groups,
    /// Checkpoints the WAL beside the writer; stops when the store drops.
    _checkpointer: Option<Checkpointer>,
}

/// Moves WAL pages into the database file from a connection of its own,
/// and has the WAL start over.
///
/// SQLite's automatic checkpoint runs inside the commit that crosses the WAL
/// threshold, copying and syncing the file while every other statement of
/// the store's single connection waits: a stall of hundreds of milliseconds
/// every few thousand writes. A passive checkpoint on another connection
/// takes no write lock, so the writer never waits for it.
///
/// A passive checkpoint copies the frames written before it began, and a
/// write starts the WAL over only if it finds every frame copied. Under
/// steady writes one always lands while the checkpoint runs, so the WAL
/// never started over: it grew by every write (254 MB after 3,000 jobs
/// called one at a time), and each write past the file's end made the
/// kernel zero the rest of its pages. So when the WAL holds
/// [`Checkpointer::RESTART_FRAMES`] frames or more after a pass, the
/// writer's own connection runs one more passive checkpoint between two of
/// its statements (the pass cannot tell: it counts only the frames there
/// were when it began, all copied or not): it copies only what came
/// since, no write of this store can come between, and the writer's next
/// transaction writes from the WAL's start. (Other processes writing the
/// same file, or holding a read open, can still keep it from starting
/// over at that pass; a later one does.) A pass that fails is logged once
/// until one succeeds again: while none does, the WAL grows.
struct Checkpointer {
    task: tokio::task::JoinHandle<()>,
}

impl Checkpointer {
    const PERIOD: std::time::Duration = std::time::Duration::from_millis(200);
    /// Frames in the WAL (4 KiB pages) past which it starts over: SQLite's
    /// own automatic checkpoint threshold.
    const RESTART_FRAMES: i64 = 1000;

    async fn start(
        path: &Path,
        writer: tokio_rusqlite::Connection,
    ) -> Result<Checkpointer, StoreError> {
        let own = tokio_rusqlite::Connection::open(path)
            .await
            .map_err(|e| StoreError::Unavailable(format!("cannot start the checkpointer: {e}")))?;
        call(&own, |c| Ok(c.busy_timeout(BUSY_TIMEOUT)?)).await?;
        let name = path.display().to_string();
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(Self::PERIOD);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            let mut failing = false;
            loop {
                ticks.tick().await;
                // A failed pass is tried again on the next tick (a busy one
                // is no error: it copies what it can).
                match Self::pass(&own, &writer).await {
                    Ok(()) if failing => {
                        failing = false;
                        tracing::info!(database = %name, "WAL checkpoints succeed again");
                    }
                    Ok(()) => {}
                    Err(error) if !failing => {
                        failing = true;
                        tracing::warn!(database = %name, %error, "a WAL checkpoint failed; the WAL grows until one succeeds");
                    }
                    Err(_) => {}
                }
            }
        });
        Ok(Checkpointer { task })
    }

    /// One pass: a passive checkpoint on `own`, then, if the WAL held
    /// [`Checkpointer::RESTART_FRAMES`] frames or more when it began, one
    /// on the `writer`'s connection (on an idle store whose WAL is copied
    /// whole, it finds nothing to do).
    async fn pass(
        own: &tokio_rusqlite::Connection,
        writer: &tokio_rusqlite::Connection,
    ) -> Result<(), StoreError> {
        if call(own, checkpoint).await? >= Self::RESTART_FRAMES {
            call(writer, checkpoint).await?;
        }
        Ok(())
    }
}

/// A passive checkpoint on `c`, answering the frames in the WAL when it
/// began.
fn checkpoint(c: &mut Connection) -> Result<i64, StoreError> {
    Ok(c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(1))?)
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SqliteStore {
    /// Opens (creating it and its directory if needed) and migrates the
    /// database at `path`. Refuses a database migrated by a newer toolfleet.
    ///
    /// On unix the file is owner-only from its first byte, and so are its
    /// `-wal` and `-shm` files (see `owner_only`); a directory it makes is
    /// owner-only too.
    pub async fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            let mut builder = std::fs::DirBuilder::new();
            builder.recursive(true);
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
            builder.create(dir).map_err(|e| {
                StoreError::Unavailable(format!("cannot create directory {}: {e}", dir.display()))
            })?;
        }
        #[cfg(unix)]
        owner_only(path)?;
        let conn = tokio_rusqlite::Connection::open(path)
            .await
            .map_err(|e| StoreError::Unavailable(format!("cannot open {}: {e}", path.display())))?;
        let mut store = SqliteStore::prepare(conn, path.display().to_string()).await?;
        store
            .call(|c| {
                // Checkpoints are the checkpointer's, off the writer's path.
                c.pragma_update(None, "wal_autocheckpoint", 0)?;
                Ok(())
            })
            .await?;
        store._checkpointer = Some(Checkpointer::start(path, store.conn.clone()).await?);
        Ok(store)
    }

    /// A private database that lives as long as this store, for tests.
    pub async fn open_in_memory() -> Result<SqliteStore, StoreError> {
        let conn = tokio_rusqlite::Connection::open_in_memory()
            .await
            .map_err(|e| StoreError::Unavailable(format!("cannot open a memory database: {e}")))?;
        SqliteStore::prepare(conn, ":memory:".to_owned()).await
    }

    /// Closes the connection, waiting for its thread to finish.
    pub async fn close(self) -> Result<(), StoreError> {
        self.conn
            .close()
            .await
            .map_err(|e| StoreError::Unavailable(format!("closing the database failed: {e}")))
    }

    async fn prepare(
        conn: tokio_rusqlite::Connection,
        name: String,
    ) -> Result<SqliteStore, StoreError> {
        let store = SqliteStore {
            groups: Groups::spawn(&conn),
            conn,
            _checkpointer: None,
        };
        store.call(move |c| set_up(c, &name)).await?;
        Ok(store)
    }

    async fn call<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
        R: Send + 'static,
    {
        call(&self.conn, f).await
    }
}

/// Runs `f` on `conn`'s thread.
async fn call<R, F>(conn: &tokio_rusqlite::Connection, f: F) -> Result<R, StoreError>
where
    F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
    R: Send + 'static,
{
    conn.call(f).await.map_err(|e| match e {
        tokio_rusqlite::Error::Error(e) => e,
        other => StoreError::Unavailable(format!("sqlite: {other}")),
    })
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Unavailable(format!("sqlite: {e}"))
    }
}

/// Makes the database at `path` owner-only (0600) before SQLite opens it:
/// a new file is created so, empty (SQLite takes an empty file for a new
/// database), and SQLite creates the `-wal`, `-shm` and `-journal` files
/// with the database file's permissions, so none of them is ever readable by
/// others. A file of these that an older toolfleet left readable by others is
/// made owner-only.
#[cfg(unix)]
fn owner_only(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    match created {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(StoreError::Unavailable(format!(
                "cannot create {}: {e}",
                path.display()
            )));
        }
    }
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let file = std::path::PathBuf::from(file);
        let Ok(metadata) = std::fs::metadata(&file) else {
            continue;
        };
        if metadata.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).map_err(
                |e| {
                    StoreError::Unavailable(format!(
                        "{} may be read by others and cannot be made owner-only ({e}): chmod 600 {}",
                        file.display(),
                        file.display()
                    ))
                },
            )?;
        }
    }
    Ok(())
}

/// WAL lets readers run beside the one writer; NORMAL is durable across
/// process crashes in WAL mode and loses at most the last commits on power loss.
fn configure(c: &mut Connection) -> Result<(), StoreError> {
    c.busy_timeout(BUSY_TIMEOUT)?;
    // A memory database answers "memory" and stays so; that is fine.
    let _mode: String = c.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    c.pragma_update(None, "synchronous", "NORMAL")?;
    c.pragma_update(None, "foreign_keys", true)?;
    // Every statement of the store stays prepared (rusqlite keeps 16 by
    // default; the store has more, and a batch's BEGIN and COMMIT besides).
    c.set_prepared_statement_cache_capacity(STATEMENTS_CACHED);
    Ok(())
}

/// Prepared statements kept per connection: more than the store has.
const STATEMENTS_CACHED: usize = 256;

/// Configures the connection and applies the embedded migrations, after
/// checking that the database was not migrated by a newer program, whose
/// schema this one would misread.
///
/// Processes opening a new file together contend in ways the busy timeout
/// does not cover (switching to WAL, a migration that read the history just
/// before another process applied it), so a failed attempt is tried again
/// until the busy timeout has passed; the refusal of a newer schema is final.
fn set_up(c: &mut Connection, name: &str) -> Result<(), StoreError> {
    // Grouped: all pending migrations and their history rows commit in one
    // transaction, so no process ever sees tables without their history.
    let runner = embedded::migrations::runner().set_grouped(true);
    let known = runner
        .get_migrations()
        .iter()
        .map(|m| i64::from(m.version()))
        .max()
        .unwrap_or(0);
    let give_up = Instant::now() + BUSY_TIMEOUT;
    loop {
        let outcome = match configure(c).and_then(|()| applied_version(c)) {
            Ok(Some(applied)) if applied > known => {
                return Err(StoreError::Schema(format!(
                    "the database {name} has schema version {applied}, newer than the newest \
                     this toolfleet knows ({known}); run a newer toolfleet, or use another \
                     database file"
                )));
            }
            Ok(_) => runner.run(c).map(drop).map_err(|e| {
                StoreError::Schema(format!("migrating the database {name} failed: {e}"))
            }),
            Err(e) => Err(e),
        };
        match outcome {
            Err(e) if Instant::now() < give_up => drop(e),
            done => return done,
        }
        std::thread::sleep(SET_UP_PAUSE);
    }
}

fn applied_version(c: &Connection) -> Result<Option<i64>, StoreError> {
    let exists: bool = c.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'refinery_schema_history')",
        [],
        |r| r.get(0),
    )?;
    if !exists {
        return Ok(None);
    }
    Ok(c.query_row(
        "SELECT MAX(version) FROM refinery_schema_history",
        [],
        |r| r.get(0),
    )?)
}

// Reading rows.

/// The columns of one row, with errors that name the row.
struct Fields<'a, 'r> {
    row: &'a Row<'r>,
    name: RowName,
    /// The row's column names, read once: a lookup by name through the
    /// row itself asks SQLite for every column's name in turn, each time.
    columns: Vec<&'a str>,
    /// Where the next lookup starts: past the column found last, as
    /// `rows` reads a record's columns in about the table's order.
    next: std::cell::Cell<usize>,
}

impl<'a, 'r> Fields<'a, 'r> {
    fn new(row: &'a Row<'r>, table: &'static str, id_column: &str) -> Result<Self, StoreError> {
        let columns = row.as_ref().column_names();
        let id = match row.get_ref(position(&columns, id_column)?)? {
            rusqlite::types::ValueRef::Integer(n) => n.to_string(),
            other => other.as_str().map(str::to_owned).unwrap_or_default(),
        };
        let name = RowName { table, id };
        let next = std::cell::Cell::new(0);
        Ok(Fields {
            row,
            name,
            columns,
            next,
        })
    }

    fn get<T: rusqlite::types::FromSql>(&self, column: &str) -> Result<T, StoreError> {
        position_from(&self.columns, column, self.next.get())
            .and_then(|at| {
                self.next.set(at + 1);
                self.row.get(at)
            })
            .map_err(|e| self.corrupt(column, e))
    }
}

/// Where `column` is among a row's `columns`, named as SQLite matches
/// names (ASCII case aside).
fn position(columns: &[&str], column: &str) -> rusqlite::Result<usize> {
    position_from(columns, column, 0)
}

/// [`position`], looking from `start` on and then before it.
fn position_from(columns: &[&str], column: &str, start: usize) -> rusqlite::Result<usize> {
    let start = start.min(columns.len());
    let (before, after) = columns.split_at(start);
    let matches = |name: &&str| name.eq_ignore_ascii_case(column);
    after
        .iter()
        .position(matches)
        .map(|at| start + at)
        .or_else(|| before.iter().position(matches))
        .ok_or_else(|| rusqlite::Error::InvalidColumnName(column.to_owned()))
}

impl Columns for Fields<'_, '_> {
    fn name(&self) -> &RowName {
        &self.name
    }

    /// The id read to name the row.
    fn id(&self) -> Result<String, StoreError> {
        Ok(self.name.id.clone())
    }

    fn text(&self, column: &str) -> Result<Cow<'_, str>, StoreError> {
        self.get(column).map(Cow::Owned)
    }

    fn text_opt(&self, column: &str) -> Result<Option<Cow<'_, str>>, StoreError> {
        Ok(self.get::<Option<String>>(column)?.map(Cow::Owned))
    }

    fn string(&self, column: &str) -> Result<String, StoreError> {
        self.get(column)
    }

    fn string_opt(&self, column: &str) -> Result<Option<String>, StoreError> {
        self.get(column)
    }

    fn integer(&self, column: &str) -> Result<i64, StoreError> {
        self.get(column)
    }

    fn integer_opt(&self, column: &str) -> Result<Option<i64>, StoreError> {
        self.get(column)
    }
}

fn job_from_row(row: &Row<'_>) -> Result<JobRecord, StoreError> {
    rows::job(&Fields::new(row, "job", "id")?)
}

fn ticket_from_row(row: &Row<'_>) -> Result<TicketRecord, StoreError> {
    rows::ticket(&Fields::new(row, "ticket", "id")?)
}

fn run_from_row(row: &Row<'_>) -> Result<RunRecord, StoreError> {
    rows::run(&Fields::new(row, "run", "id")?)
}

fn audit_from_row(row: &Row<'_>) -> Result<AuditRecord, StoreError> {
    rows::audit(&Fields::new(row, "audit", "seq")?)
}

type FromRow<T> = fn(&Row<'_>) -> Result<T, StoreError>;

fn query_one<T>(
    c: &Connection,
    sql: &str,
    params: impl Params,
    map: FromRow<T>,
) -> Result<Option<T>, StoreError> {
    let mut stmt = c.prepare_cached(sql)?;
    let mut rows = stmt.query(params)?;
    rows.next()?.map(map).transpose()
}

fn query_all<T>(
    c: &Connection,
    sql: &str,
    params: impl Params,
    map: FromRow<T>,
) -> Result<Vec<T>, StoreError> {
    let mut stmt = c.prepare_cached(sql)?;
    let mut rows = stmt.query(params)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(map(row)?);
    }
    Ok(out)
}

// Jobs.

fn insert_job(
    c: &Connection,
    job: NewJob,
    args: &str,
    lineage: Option<&str>,
    scopes: Option<&str>,
) -> Result<Inserted, StoreError> {
    let (state, run_at) = job.start();
    // By position, as PostgreSQL's INSERT_JOB numbers them: SQLite finds a
    // named parameter by comparing its name with each of the statement's
    // (14 % of an insert's instructions for these 24).
    let params = params![
        job.id,
        job.tenant,
        job.user,
        job.tool,
        job.pool,
        args,
        job.max_attempts,
        job.timeout_ms,
        job.now,
        job.idempotency_key,
        job.run_id,
        job.call_id,
        job.callback_url,
        lineage,
        scopes,
        job.trace.as_ref().map(TraceContext::traceparent),
        job.trace.as_ref().and_then(TraceContext::tracestate),
        job.origin,
        state.as_str(),
        run_at,
        job.priority,
        job.concurrency_key,
        job.concurrency_limit,
        job.fair_rank,
    ];
    // Inserted: the record is what was written, without reading it back.
    if c.prepare_cached(sql::INSERT_JOB)?.execute(params)? == 1 {
        return Ok(Inserted::Created(job.created()));
    }
    // Nothing inserted: the key was taken (or, never in practice, the id).
    let existing = match &job.idempotency_key {
        Some(key) => query_one(
            c,
            sql::JOB_BY_KEY,
            params![job.tenant, job.tool, key],
            job_from_row,
        )?,
        None => None,
    };
    match existing {
        Some(existing) if canonical_json(&existing.args) == args => {
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

fn heartbeat(c: &Connection, lease: &LeaseRef, now: i64, until: i64) -> Result<Lease, StoreError> {
    let LeaseRef {
        job_id,
        worker,
        attempt,
    } = lease;
    if c.prepare_cached(&sql::HEARTBEAT)?
        .execute(params![job_id, worker, attempt, now, until])?
        > 0
    {
        return Ok(Lease::Held);
    }
    let state: Option<String> = c
        .query_row("SELECT state FROM jobs WHERE id = ?1", [job_id], |r| {
            r.get(0)
        })
        .optional()?;
    Ok(match state.as_deref().and_then(JobState::parse) {
        Some(JobState::Cancelled) => Lease::Cancelled,
        _ => Lease::Lost,
    })
}

fn cancel(
    c: &Connection,
    tenant: &str,
    id: &str,
    now: i64,
) -> Result<Option<JobRecord>, StoreError> {
    let error = encode(&ToolError::new(
        ErrorCode::Cancelled,
        "the job was cancelled before it finished; call the tool again if the work is still needed",
    ))?;
    if let Some(job) = query_one(
        c,
        &sql::CANCEL,
        params![id, tenant, error, now],
        job_from_row,
    )? {
        return Ok(Some(job));
    }
    // Settled, missing or another tenant's: answered as it stands.
    query_one(
        c,
        "SELECT * FROM jobs WHERE id = ?1 AND tenant = ?2",
        params![id, tenant],
        job_from_row,
    )
}

fn list_jobs(
    c: &Connection,
    tenant: &str,
    filter: &JobFilter,
    limit: u32,
    cursor: Option<&str>,
) -> Result<JobPage, StoreError> {
    let page = Paging::new(limit, cursor);
    let (floor, cursor) = filter.id_bounds(page.cursor);
    let (tool, rows) = (&filter.tool, page.fetch());
    let mut jobs = match (filter.state, &filter.user) {
        // The stored states the filter means (retrying finds parked jobs
        // too), each off jobs_tenant_state in its order.
        (Some(state), user) => {
            let owned = user.as_ref().map(|_| "user");
            let statement = crate::list_in_states(
                state.stored_as(),
                |n| format!("?{n}"),
                list_hint,
                owned,
                "*",
            );
            match user {
                None => query_all(
                    c,
                    &statement,
                    params![tenant, tool, cursor, rows, floor],
                    job_from_row,
                )?,
                Some(user) => query_all(
                    c,
                    &statement,
                    params![tenant, tool, cursor, rows, floor, user],
                    job_from_row,
                )?,
            }
        }
        (None, None) => query_all(
            c,
            sql::LIST,
            params![tenant, tool, cursor, rows, floor],
            job_from_row,
        )?,
        (None, Some(user)) => query_all(
            c,
            sql::LIST_OWNED,
            params![tenant, tool, cursor, rows, floor, user],
            job_from_row,
        )?,
    };
    let next_cursor = page.cut(&mut jobs, |job| &job.id);
    Ok(JobPage { jobs, next_cursor })
}

/// What the job list in `state` reads, with its index (see
/// [`crate::list_in_states`]).
fn list_hint(state: JobState) -> &'static str {
    match state {
        JobState::Failed | JobState::Cancelled => "jobs INDEXED BY jobs_tenant_state",
        JobState::Succeeded => "jobs INDEXED BY jobs_tenant",
        _ => "jobs INDEXED BY jobs_due",
    }
}

/// Jobs by state, off `jobs_due`, which holds every job by state.
const JOB_COUNTS: &str = "SELECT state, COUNT(*) FROM jobs GROUP BY state";

fn job_counts(c: &Connection) -> Result<Vec<(JobState, u64)>, StoreError> {
    let mut stmt = c.prepare_cached(JOB_COUNTS)?;
    let mut rows = stmt.query([])?;
    let mut counts: Vec<(JobState, u64)> = JobState::ALL.into_iter().map(|s| (s, 0)).collect();
    while let Some(row) = rows.next()? {
        let (state, n): (String, i64) = (row.get(0)?, row.get(1)?);
        let state = JobState::parse(&state).ok_or_else(|| {
            StoreError::Unavailable(format!("corrupt row: a job has unknown state {state:?}"))
        })?;
        if let Some(slot) = counts.iter_mut().find(|(s, _)| *s == state) {
            slot.1 = u64::try_from(n).unwrap_or(0);
        }
    }
    Ok(counts)
}

/// The parts of `lease`, owned, for a statement on the connection's thread.
fn owned(lease: &LeaseRef) -> (String, String, u32) {
    (lease.job_id.clone(), lease.worker.clone(), lease.attempt)
}

// Tickets, audit and commits.

fn insert_ticket(c: &Connection, t: &NewTicket) -> Result<TicketRecord, StoreError> {
    let params = named_params! {
        ":id": t.id, ":tenant": t.tenant, ":user": t.user, ":tool": t.tool,
        ":question": t.question, ":options": encode(&t.options)?, ":args": encode(&t.args)?,
        ":run_id": t.run_id, ":call_id": t.call_id, ":callback_url": t.callback_url,
        ":answered_by": t.answered_by.scope(), ":kind": t.kind.as_str(),
        ":plan": t.plan.as_ref().map(encode).transpose()?, ":scopes": encode(&t.scopes)?,
        ":expires_at": t.expires_at,
        ":input_requests": t.input_requests.as_ref().map(encode).transpose()?, ":now": t.now,
    };
    query_one(c, sql::INSERT_TICKET, params, ticket_from_row)?
        .ok_or_else(|| StoreError::Conflict(format!("a ticket with id {} already exists", t.id)))
}

fn answer_ticket(
    c: &Connection,
    tenant: &str,
    id: &str,
    answer: &str,
    now: i64,
) -> Result<Option<Answered>, StoreError> {
    if let Some(t) = query_one(
        c,
        sql::ANSWER,
        params![id, tenant, answer, now],
        ticket_from_row,
    )? {
        return Ok(Some(Answered::Now(t)));
    }
    let sql = "SELECT * FROM tickets WHERE id = ?1 AND tenant = ?2";
    Ok(query_one(c, sql, params![id, tenant], ticket_from_row)?.map(Answered::Already))
}

fn respond_ticket(
    c: &Connection,
    tenant: &str,
    id: &str,
    responses: &serde_json::Map<String, Value>,
    now: i64,
) -> Result<Option<Responded>, StoreError> {
    let read = "SELECT * FROM tickets WHERE id = ?1 AND tenant = ?2";
    // Another process may record answers between the read and the write:
    // the compare-and-set then fails, and the ticket is read again.
    for _ in 0..crate::RESPOND_TRIES {
        let Some(ticket) = query_one(c, read, params![id, tenant], ticket_from_row)? else {
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
        let params = params![id, tenant, answers, complete, now, had];
        if let Some(t) = query_one(c, sql::RESPOND, params, ticket_from_row)? {
            return Ok(Some(Responded::written(t, complete)));
        }
    }
    Err(crate::respond_conflict(id))
}

/// The filters of [`Store::list_tickets`] as its statements bind them.
fn shown_name(shown: Option<TicketShown>) -> Option<&'static str> {
    shown.map(|shown| match shown {
        TicketShown::Open => "open",
        TicketShown::Answered => "answered",
    })
}

fn list_tickets(
    c: &Connection,
    tenant: &str,
    answerer: &Answerer,
    (shown, kind): (Option<TicketShown>, Option<TicketKind>),
    page: &Paging<'_>,
) -> Result<TicketPage, StoreError> {
    let (shown, kind) = (shown_name(shown), kind.map(TicketKind::as_str));
    let (cursor, rows) = (page.cursor, page.fetch());
    let mut tickets = match answerer {
        Answerer::Operator => query_all(
            c,
            &sql::LIST_TICKETS,
            params![tenant, shown, kind, cursor, rows],
            ticket_from_row,
        )?,
        Answerer::User { user, scopes } => query_all(
            c,
            &sql::LIST_TICKETS_OF,
            params![tenant, shown, kind, cursor, rows, user, encode(scopes)?],
            ticket_from_row,
        )?,
    };
    let next_cursor = page.cut(&mut tickets, |t| &t.id);
    Ok(TicketPage {
        tickets,
        next_cursor,
    })
}

fn settle_ticket(
    c: &Connection,
    tenant: &str,
    id: &str,
    outcome: &str,
) -> Result<Option<TicketRecord>, StoreError> {
    let settled = query_one(
        c,
        sql::SETTLE_TICKET,
        params![id, tenant, outcome],
        ticket_from_row,
    )?;
    if settled.is_some() {
        return Ok(settled);
    }
    // Missing, another tenant's, open, or settled before: only the last
    // is answered, as it stands.
    let sql = "SELECT * FROM tickets WHERE id = ?1 AND tenant = ?2";
    let ticket = query_one(c, sql, params![id, tenant], ticket_from_row)?;
    Ok(ticket.filter(|t| t.outcome.is_some()))
}

// Runs.

fn insert_run(c: &Connection, run: &NewRun) -> Result<RunInserted, StoreError> {
    let params = named_params! {
        ":id": run.id, ":tenant": run.tenant, ":user": run.user, ":agent": run.agent,
        ":checkpoint": run.checkpoint.as_ref().map(encode).transpose()?,
        ":callback_url": run.callback_url, ":key": run.idempotency_key,
        ":scopes": encode(&run.scopes)?, ":now": run.now,
    };
    if let Some(created) = query_one(c, &sql::INSERT_RUN, params, run_from_row)? {
        return Ok(RunInserted::Created(created));
    }
    // Nothing inserted: the key was taken (or, never in practice, the id).
    let existing = match &run.idempotency_key {
        Some(key) => query_one(
            c,
            sql::RUN_BY_KEY,
            params![run.tenant, run.user, key],
            run_from_row,
        )?,
        None => None,
    };
    existing
        .map(RunInserted::Existing)
        .ok_or_else(|| StoreError::Conflict(format!("a run with id {} already exists", run.id)))
}

/// [`UpdateRun`] with its values encoded, to move to the connection's thread.
struct RunUpdate {
    id: String,
    version: Option<i64>,
    /// JSON array of the states it may move from.
    from: String,
    to: RunState,
    checkpoint: Option<String>,
    wait: Option<String>,
    resumed: Option<String>,
    answer: Option<String>,
    error: Option<String>,
    usage: Option<String>,
    now: i64,
}

impl RunUpdate {
    fn of(u: &UpdateRun<'_>) -> Result<RunUpdate, StoreError> {
        let json = |v: Option<&Value>| v.map(encode).transpose();
        let from: Vec<&str> = u.from.iter().map(|s| s.as_str()).collect();
        Ok(RunUpdate {
            id: u.id.to_owned(),
            version: u.version,
            from: encode(&from)?,
            to: u.to,
            checkpoint: json(u.checkpoint)?,
            wait: u.wait.map(encode).transpose()?,
            resumed: json(u.resumed)?,
            answer: u.answer.map(str::to_owned),
            error: json(u.error)?,
            usage: json(u.usage)?,
            now: u.now,
        })
    }
}

/// The compare-and-set and the index of the run's waits, in one
/// transaction: the rows of a run that moved are dropped, and those of the
/// wait it moved to written.
fn update_run(c: &mut Connection, u: &RunUpdate) -> Result<Option<RunRecord>, StoreError> {
    let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let params = named_params! {
        ":id": u.id, ":version": u.version, ":from": u.from, ":to": u.to.as_str(),
        ":checkpoint": u.checkpoint, ":wait": u.wait, ":resumed": u.resumed,
        ":answer": u.answer, ":error": u.error, ":usage": u.usage, ":now": u.now,
    };
    let Some(run) = query_one(&tx, &sql::UPDATE_RUN, params, run_from_row)? else {
        return Ok(None);
    };
    tx.prepare_cached(sql::DROP_WAITS)?.execute([&run.id])?;
    if let Some(wait) = run.wait.as_ref().filter(|_| run.state == RunState::Waiting) {
        let mut add = tx.prepare_cached(sql::ADD_WAIT)?;
        for item in wait.items() {
            add.execute(params![item, run.id])?;
        }
    }
    tx.commit()?;
    Ok(Some(run))
}

fn list_runs(
    c: &Connection,
    tenant: &str,
    filter: &RunFilter,
    page: &Paging<'_>,
) -> Result<RunPage, StoreError> {
    let state = filter.state.map(RunState::as_str);
    let (agent, cursor, rows) = (&filter.agent, page.cursor, page.fetch());
    let mut runs = match &filter.user {
        None => query_all(
            c,
            sql::LIST_RUNS,
            params![tenant, state, agent, cursor, rows],
            run_from_row,
        )?,
        Some(user) => query_all(
            c,
            sql::LIST_RUNS_OWNED,
            params![tenant, state, agent, cursor, rows, user],
            run_from_row,
        )?,
    };
    let next_cursor = page.cut(&mut runs, |run| &run.id);
    Ok(RunPage { runs, next_cursor })
}

fn append_audit(c: &mut Connection, records: &[AuditRecord]) -> Result<(), StoreError> {
    let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut stmt = tx.prepare_cached(sql::INSERT_AUDIT)?;
        for r in records {
            stmt.execute(params![
                to_i64(r.at_ms),
                r.tenant,
                r.user,
                r.tool,
                r.run_id,
                r.call_id,
                encode(&r.args)?,
                r.status,
                r.error_code.map(ErrorCode::as_str),
                to_i64(r.duration_us),
                r.parent_run_id,
            ])?;
        }
    }
    Ok(tx.commit()?)
}

/// [`Store::claim_commit`] of `key` at `now`, pending until `until` and
/// kept until `keep`.
/// Claims a notice (see [`Store::claim_notice`]), pruning a batch of
/// expired ones first.
/// `(until, keep)`: the claim's lease ends at `until`, its record is kept
/// until `keep`.
fn claim_notice(
    c: &mut Connection,
    key: &str,
    now: i64,
    (until, keep): (i64, i64),
) -> Result<bool, StoreError> {
    let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.prepare_cached(sql::PRUNE_NOTICES)?
        .execute(params![now, PRUNE_BATCH])?;
    let claimed = tx
        .prepare_cached(sql::CLAIM_NOTICE)?
        .query_row(params![key, now, until, keep], |_| Ok(()))
        .optional()?;
    tx.commit()?;
    Ok(claimed.is_some())
}

fn claim_commit(
    c: &mut Connection,
    key: &str,
    now: i64,
    (until, keep): (i64, i64),
    take_over: bool,
) -> Result<CommitClaim, StoreError> {
    // Immediate: the write lock is taken first, under the busy timeout; a
    // transaction that read first could not wait for it.
    let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.prepare_cached(sql::PRUNE_COMMITS)?
        .execute(params![now, PRUNE_BATCH])?;
    let claimed = tx
        .prepare_cached(sql::CLAIM_COMMIT)?
        .query_row(params![key, now, until, keep, take_over], |_| Ok(()))
        .optional()?;
    let answer = match claimed {
        Some(()) => CommitClaim::Run,
        None => {
            let (envelope, lease_until): (Option<String>, Option<i64>) = tx
                .prepare_cached(sql::COMMIT)?
                .query_row([key], |r| Ok((r.get(0)?, r.get(1)?)))?;
            match envelope {
                Some(text) => CommitClaim::Settled(serde_json::from_str(&text).map_err(|e| {
                    let (table, id) = ("commit", key.to_owned());
                    RowName { table, id }.corrupt("envelope", e)
                })?),
                None if lease_until.is_some_and(|until| until < now) => CommitClaim::Abandoned,
                None => CommitClaim::Pending,
            }
        }
    };
    tx.commit()?;
    Ok(answer)
}

fn settle_commit(
    c: &Connection,
    key: &str,
    envelope: Option<&str>,
    keep_until: i64,
) -> Result<(), StoreError> {
    match envelope {
        Some(envelope) => c
            .prepare_cached(sql::SETTLE_COMMIT)?
            .execute(params![key, envelope, keep_until])?,
        None => c
            .prepare_cached("DELETE FROM commits WHERE key = ?1 AND state = 'pending'")?
            .execute([key])?,
    };
    Ok(())
}

#[async_trait]
impl Store for SqliteStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.call(|c| Ok(c.query_row("SELECT 1", [], |_| Ok(()))?))
            .await
    }

    async fn insert_job(&self, job: NewJob) -> Result<Inserted, StoreError> {
        let args = canonical_json(&job.args);
        let lineage = job.lineage.as_ref().map(encode).transpose()?;
        let scopes = (!job.scopes.is_empty())
            .then(|| encode(&job.scopes))
            .transpose()?;
        let insert = groups::Insert {
            job,
            args,
            lineage,
            scopes,
        };
        self.groups.insert.run(insert).await
    }

    async fn job(&self, tenant: &str, id: &str) -> Result<Option<JobRecord>, StoreError> {
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.call(move |c| {
            let sql = "SELECT * FROM jobs WHERE id = ?1 AND tenant = ?2";
            query_one(c, sql, params![id, tenant], job_from_row)
        })
        .await
    }

    async fn job_by_id(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        let id = id.to_owned();
        self.call(move |c| query_one(c, "SELECT * FROM jobs WHERE id = ?1", [id], job_from_row))
            .await
    }

    async fn list_jobs(&self, list: ListJobs<'_>) -> Result<JobPage, StoreError> {
        let ListJobs {
            tenant,
            filter,
            limit,
            cursor,
        } = list;
        let (tenant, filter) = (tenant.to_owned(), filter.clone());
        let cursor = cursor.map(str::to_owned);
        self.call(move |c| list_jobs(c, &tenant, &filter, limit, cursor.as_deref()))
            .await
    }

    async fn claim(&self, claim: ClaimJob<'_>) -> Result<Option<JobRecord>, StoreError> {
        self.groups.claim.run(claim.into()).await
    }

    async fn running_with_key(&self, key: &str, now: i64) -> Result<u32, StoreError> {
        let key = key.to_owned();
        self.call(move |c| {
            let n: i64 = c.query_row(sql::RUNNING_WITH_KEY, params![key, now], |row| row.get(0))?;
            Ok(u32::try_from(n).unwrap_or(u32::MAX))
        })
        .await
    }

    async fn claim_next(&self, claim: ClaimNext<'_>) -> Result<Option<JobRecord>, StoreError> {
        let (pool, worker) = (claim.pool.to_owned(), claim.worker.to_owned());
        let (now, until) = (claim.now, claim.now.saturating_add(claim.lease_ms));
        self.call(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let job = query_one(
                &tx,
                &sql::CLAIM_NEXT,
                params![pool, worker, now, until],
                job_from_row,
            )?;
            if let Some(job) = job.as_ref().filter(|job| job.fair_rank > 0) {
                tx.execute(sql::FAIR_CLOCK, params![pool, job.fair_rank])?;
            }
            tx.commit()?;
            Ok(job)
        })
        .await
    }

    async fn fair_turn(&self, pool: &str, tenant: &str) -> Result<i64, StoreError> {
        let (pool, tenant) = (pool.to_owned(), tenant.to_owned());
        self.call(
            move |c| Ok(c.query_row(sql::FAIR_TURN, params![pool, tenant], |row| row.get(0))?),
        )
        .await
    }

    async fn heartbeat(&self, beat: Heartbeat<'_>) -> Result<Lease, StoreError> {
        let lease = beat.lease.clone();
        let (now, until) = (beat.now, beat.now.saturating_add(beat.lease_ms));
        self.call(move |c| heartbeat(c, &lease, now, until)).await
    }

    async fn set_progress(&self, report: SetProgress<'_>) -> Result<bool, StoreError> {
        let (job_id, worker, attempt) = owned(report.lease);
        let (progress, now) = (encode(report.progress)?, report.now);
        self.call(move |c| {
            Ok(c.prepare_cached(&sql::PROGRESS)?
                .execute(params![job_id, worker, attempt, progress, now])?
                > 0)
        })
        .await
    }

    async fn checkpoint(&self, id: &str) -> Result<Option<Value>, StoreError> {
        let id = id.to_owned();
        self.call(move |c| {
            let mut stmt = c.prepare_cached("SELECT id, checkpoint FROM jobs WHERE id = ?1")?;
            let mut rows = stmt.query([&id])?;
            match rows.next()? {
                Some(row) => Fields::new(row, "job", "id")?.json_opt("checkpoint"),
                None => Ok(None),
            }
        })
        .await
    }

    async fn save_checkpoint(&self, save: SaveCheckpoint<'_>) -> Result<bool, StoreError> {
        let (job_id, worker, attempt) = owned(save.lease);
        let (checkpoint, now) = (encode(save.checkpoint)?, save.now);
        self.call(move |c| {
            Ok(c.prepare_cached(&sql::CHECKPOINT)?
                .execute(params![job_id, worker, attempt, checkpoint, now])?
                > 0)
        })
        .await
    }

    async fn park(&self, park: Park<'_>) -> Result<Option<JobRecord>, StoreError> {
        let (job_id, worker, attempt) = owned(park.lease);
        let (ticket, now) = (park.ticket.to_owned(), park.now);
        self.call(move |c| {
            let params = params![job_id, worker, attempt, ticket, now];
            query_one(c, &sql::PARK, params, job_from_row)
        })
        .await
    }

    async fn defer(&self, defer: Defer<'_>) -> Result<Option<JobRecord>, StoreError> {
        let (job_id, worker, attempt) = owned(defer.lease);
        let (until, now) = (defer.until, defer.now);
        self.call(move |c| {
            let params = params![job_id, worker, attempt, until, now];
            query_one(c, &sql::DEFER, params, job_from_row)
        })
        .await
    }

    async fn wake(&self, ticket: &str, now: i64) -> Result<Vec<JobRecord>, StoreError> {
        let ticket = ticket.to_owned();
        self.call(move |c| query_all(c, &sql::WAKE, params![ticket, now], job_from_row))
            .await
    }

    async fn succeed(&self, done: Succeed<'_>) -> Result<Option<JobRecord>, StoreError> {
        self.groups.succeed.run(done.into()).await
    }

    async fn fail(&self, failed: Fail<'_>) -> Result<Option<JobRecord>, StoreError> {
        let (job_id, worker, attempt) = owned(failed.lease);
        let (error, retry_at, now) = (encode(failed.error)?, failed.retry_at, failed.now);
        self.call(move |c| {
            let params = params![job_id, worker, attempt, error, retry_at, now];
            query_one(c, &sql::FAIL, params, job_from_row)
        })
        .await
    }

    async fn cancel(&self, job: CancelJob<'_>) -> Result<Option<JobRecord>, StoreError> {
        let CancelJob { tenant, id, now } = job;
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.call(move |c| cancel(c, &tenant, &id, now)).await
    }

    async fn dead_letter(&self, dead: DeadLetter<'_>) -> Result<Option<JobRecord>, StoreError> {
        let (id, error, now, died) = (
            dead.id.to_owned(),
            encode(dead.error)?,
            dead.now,
            dead.died_at,
        );
        self.call(move |c| {
            query_one(
                c,
                &sql::DEAD_LETTER,
                params![id, error, now, died],
                job_from_row,
            )
        })
        .await
    }

    async fn requeue(&self, requeue: Requeue<'_>) -> Result<Option<JobRecord>, StoreError> {
        let Requeue { tenant, id, now } = requeue;
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.call(move |c| query_one(c, &sql::REQUEUE, params![id, tenant, now], job_from_row))
            .await
    }

    /// At most 1000 jobs per call.
    async fn requeue_many(&self, many: RequeueMany<'_>) -> Result<Vec<JobRecord>, StoreError> {
        let states: Vec<&str> = many.states.iter().map(|s| s.as_str()).collect();
        let states =
            serde_json::to_string(&states).map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let (tenant, user) = (many.tenant.to_owned(), many.user.map(str::to_owned));
        let (tool, code) = (
            many.tool.map(str::to_owned),
            many.error_code.map(str::to_owned),
        );
        let (since, until, now) = (many.since, many.until, many.now);
        let limit = many.limit.min(MAX_BATCH);
        self.call(move |c| {
            let params = params![tenant, user, tool, states, code, since, until, limit, now];
            query_all(c, &sql::REQUEUE_MANY, params, job_from_row)
        })
        .await
    }

    /// At most 1000 jobs of each kind per call, so one read stays bounded.
    async fn due_jobs(&self, due: DueJobs<'_>) -> Result<DuePage, StoreError> {
        let (now, limit, after) = (due.now, due.limit.min(MAX_BATCH), due.after.clone());
        let due_by = due.due_by.max(now);
        self.call(move |c| {
            let part = |sql: &str, from: &DueFrom, bound: i64| match from.key() {
                Some((at, id)) => query_all(c, sql, params![at, id, bound, limit], job_from_row),
                None => Ok(Vec::new()),
            };
            Ok(DuePage::of(
                part(&sql::DUE_WAITING, &after.waiting, due_by)?,
                part(&sql::DUE_SCHEDULED, &after.scheduled, due_by)?,
                part(&sql::DUE_EXPIRED, &after.expired, now)?,
                limit,
            ))
        })
        .await
    }

    async fn job_counts(&self) -> Result<Vec<(JobState, u64)>, StoreError> {
        self.call(|c| job_counts(c)).await
    }

    async fn queue_stats(&self, tenant: &str, since: i64) -> Result<Vec<PoolRow>, StoreError> {
        let tenant = tenant.to_owned();
        self.call(move |c| {
            query_all(c, &sql::QUEUE_STATS, params![tenant, since], |row| {
                rows::pool_row(&Fields::new(row, "pool", "pool")?)
            })
        })
        .await
    }

    async fn beat_dispatcher(&self, origin: &str, now: i64) -> Result<(), StoreError> {
        let origin = origin.to_owned();
        self.call(move |c| {
            let sql = "INSERT INTO dispatchers (origin, seen_at) VALUES (?1, ?2)
                ON CONFLICT (origin) DO UPDATE SET seen_at = max(seen_at, excluded.seen_at)";
            c.execute(sql, params![origin, now])?;
            Ok(())
        })
        .await
    }

    async fn silent_dispatchers(
        &self,
        seen_before: i64,
        limit: u32,
    ) -> Result<Vec<SilentDispatcher>, StoreError> {
        let limit = limit.min(MAX_BATCH);
        self.call(move |c| {
            let sql = "SELECT origin, seen_at FROM dispatchers WHERE seen_at < ?1
                ORDER BY seen_at, origin LIMIT ?2";
            let mut statement = c.prepare_cached(sql)?;
            let rows = statement.query_map(params![seen_before, limit], |row| {
                Ok(SilentDispatcher {
                    origin: row.get(0)?,
                    seen_at: row.get(1)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn queued_from(&self, from: QueuedFrom<'_>) -> Result<Vec<JobRecord>, StoreError> {
        let QueuedFrom {
            origin,
            since,
            after,
            limit,
        } = from;
        let (origin, after) = (origin.to_owned(), after.unwrap_or("").to_owned());
        let limit = limit.min(MAX_BATCH);
        self.call(move |c| {
            let params = params![origin, since, after, limit];
            query_all(c, &sql::QUEUED_FROM, params, job_from_row)
        })
        .await
    }

    async fn forget_dispatcher(&self, origin: &str, seen_before: i64) -> Result<bool, StoreError> {
        let origin = origin.to_owned();
        self.call(move |c| {
            let sql = "DELETE FROM dispatchers WHERE origin = ?1 AND seen_at < ?2";
            Ok(c.execute(sql, params![origin, seen_before])? > 0)
        })
        .await
    }

    async fn unnotified_jobs(&self, search: Unnotified<'_>) -> Result<Vec<JobRecord>, StoreError> {
        let Unnotified {
            notice_prefix,
            since,
            until,
            limit,
        } = search;
        let limit = limit.min(MAX_BATCH);
        let prefix = notice_prefix.to_owned();
        self.call(move |c| {
            let params = params![prefix, since, until, limit];
            query_all(c, &sql::UNNOTIFIED, params, job_from_row)
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
        let limit = limit.min(MAX_BATCH);
        let prefix = notice_prefix.to_owned();
        self.call(move |c| {
            let params = params![prefix, since, until, limit];
            query_all(c, sql::UNNOTIFIED_TICKETS, params, ticket_from_row)
        })
        .await
    }

    async fn insert_ticket(&self, ticket: NewTicket) -> Result<TicketRecord, StoreError> {
        self.call(move |c| insert_ticket(c, &ticket)).await
    }

    async fn ticket(&self, tenant: &str, id: &str) -> Result<Option<TicketRecord>, StoreError> {
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.call(move |c| {
            let sql = "SELECT * FROM tickets WHERE id = ?1 AND tenant = ?2";
            query_one(c, sql, params![id, tenant], ticket_from_row)
        })
        .await
    }

    async fn respond_ticket(
        &self,
        respond: RespondTicket<'_>,
    ) -> Result<Option<Responded>, StoreError> {
        let (tenant, id) = (respond.tenant.to_owned(), respond.id.to_owned());
        let (responses, now) = (respond.responses.clone(), respond.now);
        self.call(move |c| respond_ticket(c, &tenant, &id, &responses, now))
            .await
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
        let (tenant, id, answer) = (tenant.to_owned(), id.to_owned(), encode(answer)?);
        self.call(move |c| answer_ticket(c, &tenant, &id, &answer, now))
            .await
    }

    async fn list_tickets(&self, list: ListTickets<'_>) -> Result<TicketPage, StoreError> {
        let ListTickets {
            tenant,
            answerer,
            shown,
            kind,
            limit,
            cursor,
        } = list;
        let (tenant, answerer) = (tenant.to_owned(), answerer.clone());
        let cursor = cursor.map(str::to_owned);
        self.call(move |c| {
            let page = Paging::new(limit, cursor.as_deref());
            list_tickets(c, &tenant, &answerer, (shown, kind), &page)
        })
        .await
    }

    /// At most 1000 tickets per call, so one sweep stays bounded.
    async fn expire_tickets(&self, now: i64, limit: u32) -> Result<Vec<TicketRecord>, StoreError> {
        let limit = limit.min(MAX_BATCH);
        self.call(move |c| query_all(c, sql::EXPIRE_TICKETS, params![now, limit], ticket_from_row))
            .await
    }

    async fn settle_ticket(
        &self,
        settle: SettleTicket<'_>,
    ) -> Result<Option<TicketRecord>, StoreError> {
        let (tenant, id) = (settle.tenant.to_owned(), settle.id.to_owned());
        let outcome = settle.outcome.to_json();
        self.call(move |c| settle_ticket(c, &tenant, &id, &outcome))
            .await
    }

    /// At most 1000 tickets per call.
    async fn unsettled_tickets(
        &self,
        before: i64,
        limit: u32,
    ) -> Result<Vec<TicketRecord>, StoreError> {
        let limit = limit.min(MAX_BATCH);
        self.call(move |c| {
            let params = params![before, limit];
            query_all(c, sql::UNSETTLED_TICKETS, params, ticket_from_row)
        })
        .await
    }

    async fn insert_run(&self, run: NewRun) -> Result<RunInserted, StoreError> {
        self.call(move |c| insert_run(c, &run)).await
    }

    async fn run(&self, tenant: &str, id: &str) -> Result<Option<RunRecord>, StoreError> {
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.call(move |c| {
            let sql = "SELECT * FROM runs WHERE id = ?1 AND tenant = ?2";
            query_one(c, sql, params![id, tenant], run_from_row)
        })
        .await
    }

    async fn run_by_id(&self, id: &str) -> Result<Option<RunRecord>, StoreError> {
        let id = id.to_owned();
        self.call(move |c| query_one(c, "SELECT * FROM runs WHERE id = ?1", [id], run_from_row))
            .await
    }

    async fn list_runs(&self, list: ListRuns<'_>) -> Result<RunPage, StoreError> {
        let ListRuns {
            tenant,
            filter,
            limit,
            cursor,
        } = list;
        let (tenant, filter) = (tenant.to_owned(), filter.clone());
        let cursor = cursor.map(str::to_owned);
        self.call(move |c| {
            let page = Paging::new(limit, cursor.as_deref());
            list_runs(c, &tenant, &filter, &page)
        })
        .await
    }

    async fn update_run(&self, update: UpdateRun<'_>) -> Result<Option<RunRecord>, StoreError> {
        let update = RunUpdate::of(&update)?;
        self.call(move |c| update_run(c, &update)).await
    }

    async fn waiting_runs(&self, item: &str) -> Result<Vec<RunRecord>, StoreError> {
        let item = item.to_owned();
        self.call(move |c| query_all(c, &sql::WAITING_RUNS, [item], run_from_row))
            .await
    }

    /// At most 1000 runs per call.
    async fn stale_runs(&self, stale: StaleRuns) -> Result<Vec<RunRecord>, StoreError> {
        let StaleRuns {
            state,
            before,
            limit,
        } = stale;
        let limit = limit.min(MAX_BATCH);
        self.call(move |c| {
            let params = params![state.as_str(), before, limit];
            query_all(c, sql::STALE_RUNS, params, run_from_row)
        })
        .await
    }

    async fn append_audit(&self, records: &[AuditRecord]) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let records = records.to_vec();
        self.call(move |c| append_audit(c, &records)).await
    }

    /// At most 1000 records per call.
    async fn audit(&self, tenant: &str, limit: u32) -> Result<Vec<AuditRecord>, StoreError> {
        let tenant = tenant.to_owned();
        let limit = limit.clamp(1, MAX_BATCH);
        self.call(move |c| {
            let sql =
                "SELECT * FROM audit WHERE tenant = ?1 ORDER BY at_ms DESC, seq DESC LIMIT ?2";
            query_all(c, sql, params![tenant, limit], audit_from_row)
        })
        .await
    }

    async fn claim_notice(&self, claim: ClaimNotice<'_>) -> Result<bool, StoreError> {
        let (key, now) = (claim.key.to_owned(), claim.now);
        let until = now.saturating_add(claim.lease_ms);
        let keep = claim.keep_until.max(until);
        self.call(move |c| claim_notice(c, &key, now, (until, keep)))
            .await
    }

    async fn settle_notice(&self, settle: SettleNotice<'_>) -> Result<(), StoreError> {
        let key = settle.key.to_owned();
        let (delivered, keep_until) = (settle.delivered, settle.keep_until);
        self.call(move |c| {
            c.prepare_cached(sql::SETTLE_NOTICE)?
                .execute(params![key, delivered, keep_until])?;
            Ok(())
        })
        .await
    }

    async fn claim_commit(&self, claim: ClaimCommit<'_>) -> Result<CommitClaim, StoreError> {
        let (key, now, take_over) = (claim.key.to_owned(), claim.now, claim.take_over);
        let until = now.saturating_add(claim.lease_ms);
        let held = (until, claim.keep_until.max(until));
        self.call(move |c| claim_commit(c, &key, now, held, take_over))
            .await
    }

    async fn settle_commit(&self, settle: SettleCommit<'_>) -> Result<(), StoreError> {
        let SettleCommit {
            key,
            outcome,
            keep_until,
        } = settle;
        let (key, envelope) = (key.to_owned(), outcome.map(Envelope::to_json));
        self.call(move |c| settle_commit(c, &key, envelope.as_deref(), keep_until))
            .await
    }

    async fn take_token(&self, take: TakeToken<'_>) -> Result<Option<i64>, StoreError> {
        let (interval, tolerance) = take.terms();
        let (key, now) = (take.key.to_owned(), take.now);
        let tat = self
            .call(move |c| {
                let taken: Option<i64> = c
                    .query_row(
                        sql::TAKE_TOKEN,
                        params![key, now, interval, tolerance],
                        |row| row.get(0),
                    )
                    .optional()?;
                if taken.is_some() {
                    return Ok(None);
                }
                let tat: Option<i64> = c
                    .query_row(sql::TOKEN_TAT, params![key], |row| row.get(0))
                    .optional()?;
                Ok(Some(tat.unwrap_or(now)))
            })
            .await?;
        Ok(tat.map(|tat| take.wait(tat)))
    }

    /// At most 10,000 records per call, so the write lock is held briefly.
    async fn prune(&self, prune: Prune) -> Result<u64, StoreError> {
        let (before, limit) = (prune.before, prune.limit.min(crate::MAX_PRUNE));
        self.call(move |c| {
            let gone = match prune.kind {
                Retained::Jobs => c.execute(&sql::PRUNE_JOBS, params![before, limit])?,
                Retained::Tickets => c.execute(sql::PRUNE_TICKETS, params![before, limit])?,
                Retained::Audit => c.execute(sql::PRUNE_AUDIT, params![before, limit])?,
                Retained::Runs => {
                    let tx = c.transaction()?;
                    tx.execute(&sql::PRUNE_RUN_WAITS, params![before, limit])?;
                    let gone = tx.execute(&sql::PRUNE_RUNS, params![before, limit])?;
                    tx.commit()?;
                    gone
                }
            };
            Ok(u64::try_from(gone).unwrap_or(u64::MAX))
        })
        .await
    }

    async fn put_handle(&self, handle: NewHandle<'_>) -> Result<u64, StoreError> {
        let (id, tenant, user) = (
            handle.id.to_owned(),
            handle.tenant.to_owned(),
            handle.user.to_owned(),
        );
        let (tool, value) = (handle.tool.to_owned(), handle.value.to_owned());
        let size = i64::try_from(value.len()).unwrap_or(i64::MAX);
        let (now, expires_at) = (handle.now, handle.expires_at);
        let (max, max_bytes) = (handle.max_per_tenant, handle.max_bytes_per_tenant);
        self.call(move |c| {
            let tx = c.transaction()?;
            tx.prepare_cached(sql::PUT_HANDLE)?.execute(params![
                id, tenant, user, tool, value, size, now, expires_at
            ])?;
            let gone = tx
                .prepare_cached(sql::EVICT_HANDLES)?
                .execute(params![tenant, max, max_bytes])?;
            tx.commit()?;
            Ok(u64::try_from(gone).unwrap_or(u64::MAX))
        })
        .await
    }

    async fn handle(
        &self,
        owner: HandleOwner<'_>,
        id: &str,
    ) -> Result<Option<HandleRecord>, StoreError> {
        let (id, tenant, user, now) = (
            id.to_owned(),
            owner.tenant.to_owned(),
            owner.user.to_owned(),
            owner.now,
        );
        self.call(move |c| {
            let mut stmt = c.prepare_cached(sql::HANDLE)?;
            let record = stmt
                .query_row(params![id, tenant, user, now], |row| {
                    Ok(HandleRecord {
                        info: handle_info(row)?,
                        value: row.get(5)?,
                    })
                })
                .optional()?;
            Ok(record)
        })
        .await
    }

    async fn list_handles(
        &self,
        owner: HandleOwner<'_>,
        before: Option<&str>,
        limit: u32,
    ) -> Result<Vec<HandleInfo>, StoreError> {
        let (tenant, user, now) = (owner.tenant.to_owned(), owner.user.to_owned(), owner.now);
        let before = before.map(str::to_owned);
        let limit = limit.min(crate::MAX_HANDLE_LIST);
        self.call(move |c| {
            let mut stmt = c.prepare_cached(sql::LIST_HANDLES)?;
            let rows = stmt.query_map(params![tenant, user, now, before, limit], handle_info)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn prune_handles(&self, now: i64, limit: u32) -> Result<u64, StoreError> {
        let limit = limit.min(crate::MAX_PRUNE);
        self.call(move |c| {
            let gone = c.execute(sql::PRUNE_HANDLES, params![now, limit])?;
            Ok(u64::try_from(gone).unwrap_or(u64::MAX))
        })
        .await
    }

    async fn schedules(&self) -> Result<Vec<ScheduleRecord>, StoreError> {
        self.call(|c| {
            let mut stmt = c.prepare_cached(sql::SCHEDULES)?;
            let rows = stmt.query_map([], schedule_record)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn advance_schedule(&self, advance: AdvanceSchedule<'_>) -> Result<bool, StoreError> {
        let name = advance.name.to_owned();
        let job = advance.job.map(str::to_owned);
        let (from, to, now) = (advance.from, advance.to, advance.now);
        self.call(move |c| {
            let moved = match from {
                None => c.execute(sql::SCHEDULE_FIRST, params![name, to, job, now])?,
                Some(from) => {
                    c.execute(sql::SCHEDULE_ADVANCE, params![name, from, to, job, now])?
                }
            };
            Ok(moved == 1)
        })
        .await
    }

    async fn pause_schedule(
        &self,
        name: &str,
        paused: bool,
        now: i64,
    ) -> Result<ScheduleRecord, StoreError> {
        let name = name.to_owned();
        self.call(move |c| {
            Ok(c.query_row(
                sql::SCHEDULE_PAUSE,
                params![name, paused, now],
                schedule_record,
            )?)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows SQLite explains `statement` with (`how`: `EXPLAIN` or
    /// `EXPLAIN QUERY PLAN`), each read by `read`, its first parameter 0
    /// and every other 10.
    async fn explained_rows<T, F>(
        store: &SqliteStore,
        how: &str,
        statement: &'static str,
        read: F,
    ) -> Vec<T>
    where
        T: Send + 'static,
        F: Fn(&Row<'_>) -> rusqlite::Result<T> + Send + 'static,
    {
        let explain = format!("{how} {statement}");
        store
            .call(move |c| {
                let mut explaining = c.prepare(&explain)?;
                let count = explaining.parameter_count();
                let values: Vec<i64> = (0..count).map(|n| if n == 0 { 0 } else { 10 }).collect();
                let params = rusqlite::params_from_iter(values);
                let rows = explaining.query_map(params, read)?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await
            .expect("an explanation")
    }

    /// Column `column` of each row of [`explained_rows`].
    async fn explained(
        store: &SqliteStore,
        how: &str,
        statement: &'static str,
        column: usize,
    ) -> Vec<String> {
        explained_rows(store, how, statement, move |row| row.get(column)).await
    }

    /// The steps of SQLite's plan for `statement`.
    async fn plan(store: &SqliteStore, statement: &'static str) -> Vec<String> {
        explained(store, "EXPLAIN QUERY PLAN", statement, 3).await
    }

    /// Retention reads each kind off its own index, in its order: never
    /// the records it keeps.
    #[tokio::test]
    async fn retention_reads_its_indexes() {
        let store = SqliteStore::open_in_memory().await.expect("a store");
        for (statement, index) in [
            (sql::PRUNE_JOBS.as_str(), "jobs_settled"),
            (sql::PRUNE_TICKETS, "tickets_closed"),
            (sql::PRUNE_AUDIT, "audit_at"),
            (sql::PRUNE_RUNS.as_str(), "runs_stale"),
        ] {
            let text = plan(&store, statement).await.join("\n");
            assert!(text.contains(&format!("INDEX {index} ")), "{text}");
            assert!(!text.contains("TEMP B-TREE"), "sorted whole:\n{text}");
        }
    }

    /// Pruning reads settled outcomes and abandoned claims off their own
    /// partial indexes, never the whole commit log.
    #[tokio::test]
    async fn commit_pruning_reads_its_indexes() {
        let store = SqliteStore::open_in_memory().await.expect("a store");
        let text = plan(&store, sql::PRUNE_COMMITS).await.join("\n");
        assert!(text.contains("USING INDEX commits_expiry"), "{text}");
        assert!(
            text.contains("USING INDEX commits_pending_expiry"),
            "{text}"
        );
        assert!(!text.contains("SCAN commits\n"), "{text}");
    }

    /// The job list in a state reads each stored state off its index:
    /// failed and cancelled jobs off jobs_tenant_state and succeeded ones
    /// off jobs_tenant, in their order (never sorted); the states a job
    /// passes through off jobs_due (by state: the few there are, sorted).
    #[tokio::test]
    async fn the_job_list_in_a_state_reads_its_index_in_order() {
        let store = SqliteStore::open_in_memory().await.expect("a store");
        for (state, user, index) in [
            (JobState::Failed, None, "jobs_tenant_state"),
            (JobState::Cancelled, Some("user"), "jobs_tenant_state"),
            (JobState::Succeeded, None, "jobs_tenant"),
            (JobState::Queued, None, "jobs_due"),
            (JobState::Retrying, None, "jobs_due"),
        ] {
            let statement =
                crate::list_in_states(state.stored_as(), |n| format!("?{n}"), list_hint, user, "*");
            let parts = state.stored_as().len();
            let text = plan(&store, Box::leak(statement.into_boxed_str()))
                .await
                .join("\n");
            let used = format!("USING INDEX {index} ");
            assert_eq!(text.matches(&used).count(), parts, "{state}: {text}");
            if index != "jobs_due" && parts == 1 {
                assert!(!text.contains("TEMP B-TREE"), "{state} sorted:\n{text}");
            }
        }
    }

    /// A column is found by name wherever the lookup starts, ASCII case
    /// aside; a name the row lacks is an error from every start.
    #[test]
    fn a_column_is_found_from_any_start() {
        let columns = ["id", "tenant", "State", "run_at"];
        for start in 0..=columns.len() + 1 {
            for (at, name) in ["ID", "tenant", "state", "run_at"].iter().enumerate() {
                assert_eq!(
                    position_from(&columns, name, start).ok(),
                    Some(at),
                    "{name} from {start}"
                );
            }
            assert!(position_from(&columns, "args", start).is_err());
        }
    }

    /// The opcodes SQLite runs `statement` with.
    async fn opcodes(store: &SqliteStore, statement: &'static str) -> Vec<String> {
        explained(store, "EXPLAIN", statement, 1).await
    }

    /// A job's writes build no temporary b-tree for the states they test:
    /// an insert none, a claim and a success (whole or lean) one each, for
    /// the rows of RETURNING. Before migration 26 an insert built five, a
    /// claim ten and a success nine besides: one for a statement's own IN
    /// list, one for the state CHECK's and one for each partial index's
    /// condition, for the row left and the row written. The statements,
    /// the CHECK and the indexes name their states by equalities
    /// (`sql_any`).
    #[tokio::test]
    async fn a_jobs_writes_build_no_temporary_tree_for_its_states() {
        let store = SqliteStore::open_in_memory().await.expect("a store");
        for (statement, returning) in [
            (sql::INSERT_JOB, 0),
            (sql::CLAIM.as_str(), 1),
            (sql::SUCCEED.as_str(), 1),
            (sql::SUCCEED_LEAN.as_str(), 1),
        ] {
            let ops = opcodes(&store, statement).await;
            let built = ops.iter().filter(|op| *op == "OpenEphemeral").count();
            assert_eq!(built, returning, "{statement}: {ops:?}");
        }
    }

    /// A job's writes can fail but never abort: every constraint they
    /// check halts with `OR FAIL` (SQLite's `OE_Fail`, 3), none with the
    /// default `ABORT` (2), so SQLite opens no statement journal for them
    /// inside a batch's transaction. Each writes one row, whose constraints
    /// are checked before anything is written: a failure undoes nothing.
    #[tokio::test]
    async fn a_jobs_writes_open_no_statement_journal() {
        const OE_FAIL: i64 = 3;
        let store = SqliteStore::open_in_memory().await.expect("a store");
        for statement in [
            sql::INSERT_JOB,
            sql::CLAIM.as_str(),
            sql::CLAIM_NEXT.as_str(),
            sql::SUCCEED.as_str(),
            sql::SUCCEED_LEAN.as_str(),
        ] {
            // Each step's opcode, P1 and P2.
            let steps = explained_rows(&store, "EXPLAIN", statement, |row| {
                Ok((
                    row.get::<_, String>(1)?,
                    row.get::<_, i64>(2)?,
                    row.get::<_, i64>(3)?,
                ))
            })
            .await;
            // A halt with an error code is a constraint's; P2 its conflict.
            let checks: Vec<_> = steps
                .into_iter()
                .filter(|(op, code, _)| op.starts_with("Halt") && *code != 0)
                .collect();
            assert!(!checks.is_empty(), "{statement}: no constraint checked");
            assert!(
                checks.iter().all(|(_, _, on)| *on == OE_FAIL),
                "{statement} may abort: {checks:?}"
            );
        }
    }

    /// Counting jobs by state (the queue-depth gauges) reads an index that
    /// holds every job by state, never the table's rows: `jobs_lease`
    /// holds running jobs only since migration 27.
    #[tokio::test]
    async fn jobs_are_counted_by_state_off_an_index() {
        let store = SqliteStore::open_in_memory().await.expect("a store");
        let text = plan(&store, JOB_COUNTS).await.join("\n");
        assert!(text.contains("USING COVERING INDEX jobs_due"), "{text}");
    }

    /// due_jobs reads each kind off its index in its order, from the page's
    /// key and id on: nothing is sorted, however many jobs share a time.
    #[tokio::test]
    async fn due_jobs_read_each_kind_in_index_order() {
        let store = SqliteStore::open_in_memory().await.expect("a store");
        for (statement, index) in [
            (&sql::DUE_WAITING, "jobs_waiting_due"),
            (&sql::DUE_SCHEDULED, "jobs_scheduled"),
            (&sql::DUE_EXPIRED, "jobs_lease"),
        ] {
            let text = plan(&store, statement).await.join("\n");
            assert!(text.contains(&format!("USING INDEX {index} (")), "{text}");
            assert!(
                text.contains("(run_at,id)>(?,?)") || text.contains("(lease_until,id)>(?,?)"),
                "a range from the page's key and id: {text}"
            );
            assert!(
                !text.contains("TEMP B-TREE"),
                "a read of jobs is sorted:\n{text}"
            );
        }
    }
}
