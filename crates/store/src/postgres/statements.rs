//! The SQL text of the PostgreSQL store, each statement built once: every
//! statement that moves a job executes one transition of
//! [`toolfleet_core::lifecycle`], naming the states it moves from and to as
//! the lifecycle lists them. It owns no state list of its own, and must
//! never run a statement or decode a row.
//!
//! Rows are read by named columns, never `*`: PostgreSQL refuses to run a
//! prepared statement whose result columns changed, so a column that a
//! later migration adds must not break the processes still running.

use std::sync::LazyLock;

use toolfleet_core::lifecycle::{JobState, Transition, sql_list};

use crate::RunState;

/// A statement built once from the lifecycle's state lists.
type Built = LazyLock<String>;

/// `WHERE` of a statement of the attempt holding a running job (`$1`
/// the job, `$2` the lease owner, `$3` the attempt).
fn held() -> String {
    format!(
        "id = $1 AND state IN {} AND lease_owner = $2 AND attempts = $3",
        sql_list(Transition::Heartbeat.from())
    )
}

macro_rules! job_columns {
    () => {
        r#"id, tenant, "user", tool, pool, args, state, attempts, max_attempts,
            timeout_ms, run_at, lease_owner, lease_until, progress, result, error,
            idempotency_key, run_id, call_id, callback_url, lineage, scopes,
            traceparent, tracestate, requeues, priority, concurrency_key, concurrency_limit,
            fair_rank, started_at, attempts_log, created_at, updated_at"#
    };
}

/// The columns of a job row, for statements built at run time.
pub(super) const JOB_COLUMNS: &str = job_columns!();

macro_rules! ticket_columns {
    () => {
        r#"id, tenant, "user", tool, question, options, args, run_id, call_id,
            callback_url, answer, answered_by, kind, plan, scopes, expires_at, expired_at,
            outcome, input_requests, input_responses, created_at, answered_at"#
    };
}

macro_rules! run_columns {
    () => {
        r#"id, tenant, "user", agent, state, checkpoint, wait, resumed, answer, error,
            usage, callback_url, idempotency_key, scopes, version, created_at, updated_at"#
    };
}

/// `enqueue`: (new) -> queued, or `schedule`: (new) -> scheduled, as
/// [`crate::NewJob::start`] says (`$19`, the state, and `$20`, when due).
/// It returns nothing: a row inserted is the job as given.
pub(super) const INSERT_JOB: &str = r#"
        INSERT INTO jobs (id, tenant, "user", tool, pool, args, state, attempts, max_attempts,
            timeout_ms, run_at, idempotency_key, run_id, call_id, callback_url, lineage,
            scopes, traceparent, tracestate, origin, priority, concurrency_key, concurrency_limit,
            fair_rank, created_at, updated_at)
        VALUES ($1, $2, $3, $4, $5, $6, $19, 0, $7,
            $8, $20, $10, $11, $12, $13, $14, $15, $16, $17, $18, $21, $22, $23, $24, $9, $9)
        ON CONFLICT DO NOTHING"#;

/// [`INSERT_JOB`] for many jobs at once, answering the ids it inserted.
/// A job whose id or key is taken (by an earlier job or one earlier in
/// the same batch) is not returned; its caller then takes the one-job
/// path, which tells why.
pub(super) const INSERT_MANY: &str = r#"
        INSERT INTO jobs (id, tenant, "user", tool, pool, args, state, attempts, max_attempts,
            timeout_ms, run_at, idempotency_key, run_id, call_id, callback_url, lineage,
            scopes, traceparent, tracestate, origin, priority, concurrency_key, concurrency_limit,
            fair_rank, created_at, updated_at)
        SELECT id, tenant, "user", tool, pool, args, state, 0, max_attempts,
            timeout_ms, run_at, idempotency_key, run_id, call_id, callback_url, lineage, scopes,
            traceparent, tracestate, origin, priority, concurrency_key, concurrency_limit,
            fair_rank, now, now
        FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
            $7::bigint[], $8::bigint[], $9::bigint[], $10::text[], $11::text[], $12::text[],
            $13::text[], $14::text[], $15::text[], $16::text[], $17::text[], $18::text[],
            $19::text[], $20::bigint[], $21::smallint[], $22::text[], $23::bigint[],
            $24::bigint[])
            WITH ORDINALITY AS n(id, tenant, "user", tool, pool, args, max_attempts,
            timeout_ms, now, idempotency_key, run_id, call_id, callback_url, lineage, scopes,
            traceparent, tracestate, origin, state, run_at, priority, concurrency_key,
            concurrency_limit, fair_rank, ord)
        ORDER BY ord
        ON CONFLICT DO NOTHING
        RETURNING id"#;

/// A dispatcher's beat; a late beat never moves `seen_at` back.
pub(super) const BEAT_DISPATCHER: &str = "INSERT INTO dispatchers (origin, seen_at) VALUES ($1, $2)
    ON CONFLICT (origin) DO UPDATE SET seen_at = GREATEST(dispatchers.seen_at, EXCLUDED.seen_at)";

/// Dispatchers silent since a time, the longest silent first.
pub(super) const SILENT_DISPATCHERS: &str = "SELECT origin, seen_at FROM dispatchers
    WHERE seen_at < $1 ORDER BY seen_at, origin LIMIT $2";

/// The queued jobs a silent dispatcher made since a time, by id.
pub(super) static QUEUED_FROM: Built = LazyLock::new(|| {
    format!(
        concat!(
            "SELECT ",
            job_columns!(),
            " FROM jobs WHERE state = '{queued}' AND origin = $1 AND created_at >= $2
            AND id > $3 ORDER BY id LIMIT $4"
        ),
        queued = Transition::Enqueue.to()
    )
});

pub(super) const JOB_BY_KEY: &str = concat!(
    "SELECT ",
    job_columns!(),
    " FROM jobs WHERE tenant = $1 AND tool = $2 AND idempotency_key = $3"
);

/// queued or due retrying, or running with an expired lease -> running,
/// for a batch of claims (one row of the arrays each): one conditional
/// statement, so a job that two claims name, in one batch or in two, is
/// claimed once. `c_ord` tells which claim won. A job taken over is
/// runnable from when the expired lease ended.
///
/// The grouped statements find their rows by the primary key alone:
/// their conditions on the state are a `CASE`, which no partial index
/// matches. Written as plain `state IN (...) AND run_at <= c_now`, the
/// planner could walk `jobs_due` or `jobs_lease` (every waiting or
/// running job) once per batch, and did: under a backlog of queued jobs
/// each claim read thousands of index entries.
///
/// `claim` moves the states of its list, `take_over` those of its own.
pub(super) static CLAIM_MANY: Built = LazyLock::new(|| {
    let mut cases = String::new();
    for state in Transition::Claim.from() {
        cases.push_str(&format!(" WHEN '{state}' THEN run_at <= c_now"));
    }
    for state in Transition::TakeOver.from() {
        cases.push_str(&format!(" WHEN '{state}' THEN lease_until < c_now"));
    }
    format!(
        concat!(
            "
        UPDATE jobs SET state = '{running}', attempts = attempts + 1,
            run_at = CASE WHEN state IN {taken} THEN COALESCE(lease_until, run_at)
                          ELSE run_at END,
            lease_owner = c_worker, lease_until = c_until, updated_at = c_now, started_at = c_now
        FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::bigint[])
            WITH ORDINALITY AS c(c_id, c_worker, c_now, c_until, c_ord)
        WHERE id = c_id
          AND CASE state{cases} ELSE false END
        RETURNING c_ord, ",
            job_columns!()
        ),
        running = Transition::Claim.to(),
        taken = sql_list(Transition::TakeOver.from()),
        cases = cases,
    )
});

// Every statement of a running job's holder names its attempt (`$1`
// the job, `$2` the lease owner, `$3` the attempt): by lease owner and
// attempt both, so an attempt that lost the job to a newer claim, even
// its own worker's, no longer matches.

/// `heartbeat`: running (this attempt) -> running, lease extended.
pub(super) static HEARTBEAT: Built = LazyLock::new(|| {
    format!(
        "UPDATE jobs SET lease_until = $5, updated_at = $4 WHERE {}",
        held()
    )
});

pub(super) const STATE: &str = "SELECT state FROM jobs WHERE id = $1";

/// Under `heartbeat`'s guard: progress recorded.
pub(super) static PROGRESS: Built = LazyLock::new(|| {
    format!(
        "UPDATE jobs SET progress = $4, updated_at = $5 WHERE {}",
        held()
    )
});

/// `park`: running (this attempt) -> parked on a ticket: unleased, the
/// attempt given back.
/// `defer`: running (this attempt) -> retrying, due at `$4`, the attempt
/// given back.
pub(super) static DEFER: Built = LazyLock::new(|| {
    format!(
        concat!(
            "
        UPDATE jobs SET state = '{retrying}',
            attempts = attempts - 1, lease_owner = NULL, lease_until = NULL,
            run_at = $4, updated_at = $5
        WHERE {held}
        RETURNING ",
            job_columns!()
        ),
        retrying = Transition::Defer.to(),
        held = held()
    )
});

pub(super) static PARK: Built = LazyLock::new(|| {
    format!(
        concat!(
            "
        UPDATE jobs SET state = '{parked}',
            attempts = attempts - 1, lease_owner = NULL, lease_until = NULL,
            waiting_on = $4, updated_at = $5
        WHERE {held}
        RETURNING ",
            job_columns!()
        ),
        parked = Transition::Park.to(),
        held = held()
    )
});

/// `wake`: parked on the ticket -> retrying, due now.
pub(super) static WAKE: Built = LazyLock::new(|| {
    format!(
        concat!(
            "
        UPDATE jobs SET state = '{to}', run_at = $2, waiting_on = NULL, updated_at = $2
        WHERE waiting_on = $1 AND state IN {from}
        RETURNING ",
            job_columns!()
        ),
        to = Transition::Wake.to(),
        from = sql_list(Transition::Wake.from())
    )
});

pub(super) const READ_CHECKPOINT: &str = "SELECT checkpoint FROM jobs WHERE id = $1";

/// Under `heartbeat`'s guard: checkpoint saved.
pub(super) static CHECKPOINT: Built = LazyLock::new(|| {
    format!(
        "UPDATE jobs SET checkpoint = $4, updated_at = $5 WHERE {}",
        held()
    )
});

/// `succeed`: running (this attempt) -> succeeded, for a batch of
/// successes; `s_ord` tells whose each row was.
pub(super) static SUCCEED_MANY: Built = LazyLock::new(|| succeed_many(JOB_COLUMNS));

/// As [`SUCCEED_MANY`], reading back only what may change under a lease
/// (its progress): for successes whose holder has the claimed record.
pub(super) static SUCCEED_MANY_LEAN: Built = LazyLock::new(|| succeed_many("id, progress"));

fn succeed_many(returning: &str) -> String {
    format!(
        "
        UPDATE jobs SET state = '{to}', result = s_result,
            lease_owner = NULL, lease_until = NULL, updated_at = s_now
        FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bigint[])
            WITH ORDINALITY AS s(s_id, s_worker, s_attempt, s_result, s_now, s_ord)
        WHERE id = s_id
          AND CASE WHEN state IN {from} THEN lease_owner = s_worker AND attempts = s_attempt
                   ELSE false END
        RETURNING s_ord, {returning}",
        to = Transition::Succeed.to(),
        from = sql_list(Transition::Succeed.from())
    )
}

/// `retry` (with a time $5) or `fail` (without): running (this
/// attempt) -> retrying at $5, or failed. The lifecycle decided which
/// ([`toolfleet_core::lifecycle::after_failure`]).
pub(super) static FAIL: Built = LazyLock::new(|| {
    format!(
        concat!(
            "
        UPDATE jobs SET
            state = CASE WHEN $5::bigint IS NOT NULL THEN '{retrying}' ELSE '{failed}' END,
            run_at = COALESCE($5::bigint, run_at),
            attempts_log = (COALESCE(attempts_log, '[]')::jsonb || jsonb_build_array(
                jsonb_build_object('attempt', attempts, 'started_at', started_at,
                    'ended_at', $6::bigint, 'error', $4::text::jsonb)))::text,
            error = $4, lease_owner = NULL, lease_until = NULL, updated_at = $6
        WHERE {held}
        RETURNING ",
            job_columns!()
        ),
        retrying = Transition::Retry.to(),
        failed = Transition::Fail.to(),
        held = held()
    )
});

/// `cancel`: queued, retrying, parked or running -> cancelled.
pub(super) static CANCEL: Built = LazyLock::new(|| {
    format!(
        concat!(
            "
        UPDATE jobs SET state = '{to}', error = $3,
            lease_owner = NULL, lease_until = NULL, updated_at = $4
        WHERE id = $1 AND tenant = $2 AND state IN {from}
        RETURNING ",
            job_columns!()
        ),
        to = Transition::Cancel.to(),
        from = sql_list(Transition::Cancel.from())
    )
});

/// `dead_letter`: waiting, or running with a lease that ended before `$3`
/// -> failed with the error `$2`.
pub(super) static DEAD_LETTER: Built = LazyLock::new(|| {
    format!(
        concat!(
            "
        UPDATE jobs SET state = '{to}', error = $2,
            lease_owner = NULL, lease_until = NULL, updated_at = $3
        WHERE id = $1 AND (state IN {waiting} OR (state = '{running}' AND lease_until < $3))
          AND ($4::bigint IS NULL OR updated_at <= $4::bigint)
        RETURNING ",
            job_columns!()
        ),
        to = Transition::DeadLetter.to(),
        waiting = sql_list(crate::unheld_states()),
        running = toolfleet_core::JobState::Running,
    )
});

/// [`Store::queue_stats`](crate::Store::queue_stats): `$2` a bigint.
pub(super) static QUEUE_STATS: Built = LazyLock::new(|| crate::queue_stats_sql("$1", "$2::bigint"));

/// `requeue`: failed or cancelled -> queued, due at `$3`.
pub(super) static REQUEUE: Built = LazyLock::new(|| {
    format!(
        concat!(
            "UPDATE jobs SET {set} WHERE id = $1 AND tenant = $2 AND state IN {from}
            RETURNING ",
            job_columns!()
        ),
        set = crate::requeued("$3"),
        from = sql_list(Transition::Requeue.from())
    )
});

/// `requeue` of a tenant's jobs by filter (`$2` user, `$3` tool, `$4`
/// states, `$5` error code, settled in [`$6`, `$7`)), at most `$8`, oldest
/// settled first, due at `$9`. `SKIP LOCKED`: a job another process is
/// putting back is left to it.
pub(super) static REQUEUE_MANY: Built = LazyLock::new(|| {
    format!(
        concat!(
            r#"UPDATE jobs SET {set} WHERE id IN (SELECT id FROM jobs
                WHERE tenant = $1 AND ($2::text IS NULL OR "user" = $2)
                  AND ($3::text IS NULL OR tool = $3)
                  AND state = ANY($4::text[]) AND state IN {from}
                  AND ($5::text IS NULL OR error::jsonb ->> 'code' = $5)
                  AND updated_at >= $6 AND updated_at < $7
                ORDER BY updated_at LIMIT $8 FOR UPDATE SKIP LOCKED)
            RETURNING "#,
            job_columns!()
        ),
        set = crate::requeued("$9"),
        from = sql_list(Transition::Requeue.from())
    )
});

/// The due jobs of one kind ([`crate::Store::due_jobs`]), each a range
/// scan of its own partial index in its order, rather than an OR the
/// planner may turn into a walk of the whole table: the earliest past the
/// key `$1` and id `$2` of the page before, at most `$4`, by key and then
/// id, as the indexes hold them (migration 26). The lists are those of
/// `claim` and `take_over`, as the partial indexes (migrations 12 and 26)
/// name them. Waiting jobs are read up to `$3`, a time that may be ahead
/// of now; scheduled ones have an index of their own (`jobs_scheduled`,
/// migrations 16 and 26): in `jobs_due` a backlog of queued jobs sorts
/// before them and would fill the limit; expired leases ended before `$3`,
/// now.
pub(super) static DUE_WAITING: Built = LazyLock::new(|| {
    let waiting = format!("state IN {}", sql_list(Transition::Claim.from()));
    due_part(&waiting, "run_at", "run_at <= $3")
});

/// [`DUE_WAITING`]'s scheduled part.
pub(super) static DUE_SCHEDULED: Built = LazyLock::new(|| {
    let scheduled = format!("state = '{}'", Transition::Schedule.to());
    due_part(&scheduled, "run_at", "run_at <= $3")
});

/// [`DUE_WAITING`]'s expired part.
pub(super) static DUE_EXPIRED: Built = LazyLock::new(|| {
    let taken = format!("state IN {}", sql_list(Transition::TakeOver.from()));
    due_part(&taken, "lease_until", "lease_until < $3")
});

/// One part of the due jobs: of the jobs `states` names, by `key` past `$1`
/// and id `$2`, within `bound`, at most `$4`.
fn due_part(states: &str, key: &str, bound: &str) -> String {
    format!(
        concat!(
            "SELECT ",
            job_columns!(),
            " FROM jobs WHERE {states} AND {bound} AND ({key}, id) > ($1, $2)
            ORDER BY {key}, id LIMIT $4"
        ),
        states = states,
        bound = bound,
        key = key,
    )
}

/// Jobs by their owner rows (migration 25), newest first: `USING` merges
/// the id, tenant and user of both, so the columns read as `jobs`' own,
/// and an inner join's merged column is the left table's, which the
/// conditions and the order then take off `job_owners`' indexes.
pub(super) const OWNED_JOBS: &str = r#"job_owners JOIN jobs USING (id, tenant, "user")"#;

/// A tenant's jobs, newest first, off `job_owners_tenant`.
pub(super) static LIST: Built = LazyLock::new(|| {
    format!(
        concat!(
            "SELECT ",
            job_columns!(),
            " FROM {owned}
        WHERE tenant = $1 AND id < $3 AND id >= $5 AND ($2::text IS NULL OR tool = $2)
        ORDER BY id DESC LIMIT $4"
        ),
        owned = OWNED_JOBS
    )
});

/// [`LIST`] of one user's jobs, off `job_owners_user`.
pub(super) static LIST_OWNED: Built = LazyLock::new(|| {
    format!(
        concat!(
            "SELECT ",
            job_columns!(),
            r#" FROM {owned}
        WHERE tenant = $1 AND "user" = $6 AND id < $3 AND id >= $5 AND ($2::text IS NULL OR tool = $2)
        ORDER BY id DESC LIMIT $4"#
        ),
        owned = OWNED_JOBS
    )
});

pub(super) const JOB: &str = concat!(
    "SELECT ",
    job_columns!(),
    " FROM jobs WHERE id = $1 AND tenant = $2"
);

pub(super) const JOB_BY_ID: &str = concat!("SELECT ", job_columns!(), " FROM jobs WHERE id = $1");

pub(super) const COUNTS: &str = "SELECT state, COUNT(*) AS n FROM jobs GROUP BY state";

/// A range of `jobs_callbacks`, each probed in the commit log by key.
/// The key is built in the commit log's collation: built from `j.id`
/// alone it would take the ids' ("C"), under which `commits_pkey` cannot
/// be searched, and each job would read the whole log.
///
/// The list is the settled states', as `jobs_callbacks` (migration 4)
/// names them.
pub(super) static UNNOTIFIED: Built = LazyLock::new(|| {
    format!(
        concat!(
            "SELECT ",
            job_columns!(),
            " FROM jobs j
        WHERE callback_url IS NOT NULL
          AND state IN {settled}
          AND updated_at >= $2 AND updated_at < $3
          AND NOT EXISTS (SELECT 1 FROM notices n
            WHERE n.key = ($1 || j.id || ':' || j.state
                || CASE WHEN j.requeues > 0 THEN ':' || j.requeues::text ELSE '' END)
                COLLATE \"default\")
        ORDER BY updated_at, id LIMIT $4"
        ),
        settled = sql_list(&JobState::SETTLED)
    )
});

pub(super) const UNNOTIFIED_TICKETS: &str = concat!(
    "SELECT ",
    ticket_columns!(),
    " FROM tickets t
        WHERE callback_url IS NOT NULL AND answer IS NOT NULL
          AND answered_at >= $2 AND answered_at < $3
          AND NOT EXISTS (SELECT 1 FROM notices n
            WHERE n.key = ($1 || t.id || ':answered') COLLATE \"default\")
        ORDER BY answered_at, id LIMIT $4"
);

pub(super) const INSERT_TICKET: &str = concat!(
    r#"
        INSERT INTO tickets (id, tenant, "user", tool, question, options, args,
            run_id, call_id, callback_url, created_at, answered_by, kind, plan, scopes,
            expires_at, input_requests)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
        ON CONFLICT DO NOTHING
        RETURNING "#,
    ticket_columns!()
);

pub(super) const TICKET: &str = concat!(
    "SELECT ",
    ticket_columns!(),
    " FROM tickets WHERE id = $1 AND tenant = $2"
);

/// open (neither answered nor expired) -> answered.
pub(super) const ANSWER: &str = concat!(
    "
        UPDATE tickets SET answer = $3, answered_at = $4
        WHERE id = $1 AND tenant = $2 AND answer IS NULL AND expired_at IS NULL
        RETURNING ",
    ticket_columns!()
);

/// An open input ticket's answers (`$3`) recorded, and when `$4` (they
/// answer every request) answered at `$5`; only while it holds the `$6`
/// answers it was read with (answers are only ever added, so their count
/// names them).
pub(super) const RESPOND: &str = concat!(
    "
        UPDATE tickets SET input_responses = $3,
            answer = CASE WHEN $4::boolean THEN $3 END,
            answered_at = CASE WHEN $4::boolean THEN $5::bigint END
        WHERE id = $1 AND tenant = $2 AND kind = 'input'
          AND answer IS NULL AND expired_at IS NULL
          AND (SELECT count(*) FROM json_object_keys(COALESCE(input_responses, '{}')::json))
              = $6::bigint
        RETURNING ",
    ticket_columns!()
);

/// The conditions of the inbox's filters: `$2` open or answered (both
/// when NULL), `$3` the kind (both when NULL).
macro_rules! ticket_filters {
    () => {
        "
          AND ($2::text IS NULL OR ($2::text = 'open') = (answer IS NULL AND expired_at IS NULL))
          AND ($3::text IS NULL OR kind = $3::text)"
    };
}

/// An operator's inbox: every ticket of the tenant, off `tickets_tenant`.
pub(super) const LIST_TICKETS: &str = concat!(
    "SELECT ",
    ticket_columns!(),
    " FROM tickets WHERE tenant = $1 AND id < $4",
    ticket_filters!(),
    " ORDER BY id DESC LIMIT $5"
);

/// A user's inbox (`$6`, holding the scopes `$7`): the tickets they opened
/// that their caller answers, off `tickets_owner`, and those a scope they
/// hold answers, off `tickets_scope`; each half a page at most.
pub(super) const LIST_TICKETS_OF: &str = concat!(
    "SELECT * FROM ((SELECT ",
    ticket_columns!(),
    r#" FROM tickets
        WHERE tenant = $1 AND "user" = $6 AND answered_by IS NULL AND id < $4"#,
    ticket_filters!(),
    " ORDER BY id DESC LIMIT $5)
        UNION ALL
        (SELECT ",
    ticket_columns!(),
    " FROM tickets
        WHERE tenant = $1 AND answered_by = ANY($7::text[]) AND id < $4",
    ticket_filters!(),
    " ORDER BY id DESC LIMIT $5)) inbox
        ORDER BY id DESC LIMIT $5"
);

/// open, its expiry passed -> expired at `$1`, at most `$2`, off
/// `tickets_expiry`; rows another sweep holds are skipped, and each row's
/// condition is checked again on its latest version.
pub(super) const EXPIRE_TICKETS: &str = concat!(
    "
        UPDATE tickets SET expired_at = $1
        WHERE id = ANY (ARRAY(
            SELECT id FROM tickets
            WHERE answer IS NULL AND expired_at IS NULL AND expires_at IS NOT NULL
              AND expires_at <= $1
            ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED))
          AND answer IS NULL AND expired_at IS NULL
        RETURNING ",
    ticket_columns!()
);

/// answered or expired, without an outcome -> its outcome recorded.
pub(super) const SETTLE_TICKET: &str = concat!(
    "
        UPDATE tickets SET outcome = $3
        WHERE id = $1 AND tenant = $2 AND outcome IS NULL
          AND (answer IS NOT NULL OR expired_at IS NOT NULL)
        RETURNING ",
    ticket_columns!()
);

/// Off `tickets_unsettled`, in its order.
pub(super) const UNSETTLED_TICKETS: &str = concat!(
    "SELECT ",
    ticket_columns!(),
    " FROM tickets
        WHERE answer IS NOT NULL AND outcome IS NULL AND answered_at < $1
        ORDER BY answered_at, id LIMIT $2"
);

/// (new) -> running, version 1.
pub(super) static INSERT_RUN: Built = LazyLock::new(|| {
    format!(
        concat!(
            r#"
        INSERT INTO runs (id, tenant, "user", agent, state, checkpoint, callback_url,
            idempotency_key, scopes, version, created_at, updated_at)
        VALUES ($1, $2, $3, $4, '{running}', $5, $6, $7, $8, 1, $9, $9)
        ON CONFLICT DO NOTHING
        RETURNING "#,
            run_columns!()
        ),
        running = RunState::Running
    )
});

pub(super) const RUN_BY_KEY: &str = concat!(
    "SELECT ",
    run_columns!(),
    r#" FROM runs WHERE tenant = $1 AND "user" = $2 AND idempotency_key = $3"#
);

pub(super) const RUN: &str = concat!(
    "SELECT ",
    run_columns!(),
    " FROM runs WHERE id = $1 AND tenant = $2"
);

pub(super) const RUN_BY_ID: &str = concat!("SELECT ", run_columns!(), " FROM runs WHERE id = $1");

/// One of the states `$3`, at version `$2` if given -> `$4`, version + 1;
/// the fields given replace theirs, the wait is the one given (or kept)
/// when waiting, and cleared otherwise.
pub(super) static UPDATE_RUN: Built = LazyLock::new(|| {
    format!(
        concat!(
            "
        UPDATE runs SET state = $4, version = version + 1,
            checkpoint = COALESCE($5, checkpoint),
            wait = CASE WHEN $4 = '{waiting}' THEN COALESCE($6, wait) END,
            resumed = COALESCE($7, resumed),
            answer = COALESCE($8, answer),
            error = COALESCE($9, error),
            usage = COALESCE($10, usage),
            updated_at = $11
        WHERE id = $1 AND ($2::bigint IS NULL OR version = $2::bigint)
          AND state = ANY($3::text[])
        RETURNING ",
            run_columns!()
        ),
        waiting = RunState::Waiting
    )
});

pub(super) const DROP_WAITS: &str = "DELETE FROM run_waits WHERE run_id = $1";

pub(super) const ADD_WAITS: &str = "
        INSERT INTO run_waits (item, run_id)
        SELECT DISTINCT item, $2::text FROM UNNEST($1::text[]) AS w(item)
        ON CONFLICT DO NOTHING";

/// The waiting runs an item of `run_waits` names: the item's rows read
/// first, off `run_waits`' key, then each run by its own. The state is
/// checked in a `CASE`, which `runs_stale` does not match: written as a
/// plain condition (or as a join), a plan made on an empty table walked
/// every waiting run off that index instead.
pub(super) static WAITING_RUNS: Built = LazyLock::new(|| {
    format!(
        concat!(
            "SELECT ",
            run_columns!(),
            " FROM runs
        WHERE id = ANY (ARRAY(SELECT run_id FROM run_waits WHERE item = $1))
          AND CASE state WHEN '{waiting}' THEN true ELSE false END
        ORDER BY id"
        ),
        waiting = RunState::Waiting
    )
});

/// Off `runs_stale`, in its order.
pub(super) const STALE_RUNS: &str = concat!(
    "SELECT ",
    run_columns!(),
    " FROM runs WHERE state = $1 AND updated_at < $2
        ORDER BY updated_at, id LIMIT $3"
);

pub(super) const LIST_RUNS: &str = concat!(
    "SELECT ",
    run_columns!(),
    " FROM runs
        WHERE tenant = $1 AND id < $4
          AND ($2::text IS NULL OR state = $2) AND ($3::text IS NULL OR agent = $3)
        ORDER BY id DESC LIMIT $5"
);

/// [`LIST_RUNS`] of one user's runs, off `runs_owner`.
pub(super) const LIST_RUNS_OWNED: &str = concat!(
    "SELECT ",
    run_columns!(),
    r#" FROM runs
        WHERE tenant = $1 AND "user" = $6 AND id < $4
          AND ($2::text IS NULL OR state = $2) AND ($3::text IS NULL OR agent = $3)
        ORDER BY id DESC LIMIT $5"#
);

/// One statement for a whole batch: the arrays are the columns.
pub(super) const INSERT_AUDIT: &str = r#"
        INSERT INTO audit (at_ms, tenant, "user", tool, run_id, call_id, args, status,
            error_code, duration_us, parent_run_id)
        SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[],
            $6::text[], $7::text[], $8::text[], $9::text[], $10::bigint[], $11::text[])"#;

pub(super) const AUDIT: &str = r#"
        SELECT seq, at_ms, tenant, "user", tool, run_id, call_id, parent_run_id, args,
            status, error_code, duration_us
        FROM audit WHERE tenant = $1 ORDER BY at_ms DESC, seq DESC LIMIT $2"#;

/// Notices past keep_until, up to $2, off `notices_expiry`; rows another
/// pruner holds are skipped.
pub(super) const PRUNE_NOTICES: &str = "
        DELETE FROM notices WHERE key = ANY (ARRAY(
            SELECT key FROM notices WHERE keep_until < $1
            LIMIT $2 FOR UPDATE SKIP LOCKED))";

/// absent, kept past keep_until, or sending past its lease -> sending
/// until $3, kept until $4. The conflicting row is locked and its
/// condition checked on its latest version, so two dispatchers can never
/// both claim a notice.
pub(super) const CLAIM_NOTICE: &str = "
        INSERT INTO notices (key, state, lease_until, keep_until) VALUES ($1, 'sending', $3, $4)
        ON CONFLICT (key) DO UPDATE SET
            state = 'sending', delivered = NULL, lease_until = $3, keep_until = $4
        WHERE notices.keep_until < $2
           OR (notices.state = 'sending' AND notices.lease_until < $2)
        RETURNING key";

/// sending (or absent) -> sent, delivered or given up.
pub(super) const SETTLE_NOTICE: &str = "
        INSERT INTO notices (key, state, delivered, keep_until) VALUES ($1, 'sent', $2, $3)
        ON CONFLICT (key) DO UPDATE SET
            state = 'sent', delivered = $2, lease_until = NULL, keep_until = $3";

/// Skips rows another pruner holds, so concurrent claims never wait on
/// each other's housekeeping; the array makes the delete a walk of the
/// primary key, whatever the planner guesses of the batch size.
/// Settled outcomes and abandoned claims past keep_until (up to $2 of
/// each), each read off its partial index (migration 7).
pub(super) const PRUNE_COMMITS: &str = "
        DELETE FROM commits WHERE key = ANY (ARRAY(
            SELECT key FROM commits WHERE state = 'settled' AND keep_until < $1
            LIMIT $2 FOR UPDATE SKIP LOCKED) || ARRAY(
            SELECT key FROM commits WHERE state = 'pending' AND keep_until < $1
            LIMIT $2 FOR UPDATE SKIP LOCKED))";

/// absent, kept past keep_until, or pending past its lease when $5 says
/// to take it over -> pending until $3, kept until $4. The conflicting
/// row is locked and its condition checked on its latest version, so
/// two processes can never both claim a key.
pub(super) const CLAIM_COMMIT: &str = "
        INSERT INTO commits (key, state, lease_until, keep_until) VALUES ($1, 'pending', $3, $4)
        ON CONFLICT (key) DO UPDATE SET
            state = 'pending', envelope = NULL, lease_until = $3, keep_until = $4
        WHERE commits.keep_until < $2
           OR ($5 AND commits.state = 'pending' AND commits.lease_until < $2)
        RETURNING key";

/// What a claim that did not win found.
pub(super) const COMMIT: &str = "SELECT state, envelope, lease_until FROM commits WHERE key = $1";

/// pending (or absent) -> settled; a settled outcome is never replaced.
pub(super) const SETTLE_COMMIT: &str = "
        INSERT INTO commits (key, state, envelope, keep_until) VALUES ($1, 'settled', $2, $3)
        ON CONFLICT (key) DO UPDATE SET
            state = 'settled', envelope = $2, lease_until = NULL, keep_until = $3
        WHERE commits.state = 'pending'";

/// pending -> absent: the claim is released.
pub(super) const RELEASE_COMMIT: &str = "DELETE FROM commits WHERE key = $1 AND state = 'pending'";

// Retention: each statement deletes at most `$2` records settled before
// `$1`, oldest first, off the index migration 13 made for it. `SKIP
// LOCKED`: a record another process's prune holds is left to it, so
// several prune at once without waiting on one another or deleting twice.

/// Settled jobs, off `jobs_settled`.
pub(super) static PRUNE_JOBS: Built = LazyLock::new(|| {
    format!(
        "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs
            WHERE state IN {settled} AND updated_at < $1
              AND NOT EXISTS (SELECT 1 FROM run_waits w WHERE w.item = jobs.id)
            ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
        settled = sql_list(&JobState::SETTLED)
    )
});

/// Answered or expired tickets, off `tickets_closed`.
pub(super) const PRUNE_TICKETS: &str = "DELETE FROM tickets WHERE id IN (SELECT id FROM tickets
    WHERE COALESCE(answered_at, expired_at) < $1
    ORDER BY COALESCE(answered_at, expired_at) LIMIT $2 FOR UPDATE SKIP LOCKED)";

/// Stopped runs, off `runs_stale` (a range per state, in no order across
/// them), with any wait rows they kept.
pub(super) static PRUNE_RUNS: Built = LazyLock::new(|| {
    format!(
        "WITH gone AS (DELETE FROM runs WHERE id IN (SELECT id FROM runs
                WHERE state IN {stopped} AND updated_at < $1
                LIMIT $2 FOR UPDATE SKIP LOCKED)
            RETURNING id),
        waits AS (DELETE FROM run_waits WHERE run_id IN (SELECT id FROM gone))
        SELECT count(*) FROM gone",
        stopped = crate::runs::stopped_runs()
    )
});

/// Audit records, off `audit_at`.
pub(super) const PRUNE_AUDIT: &str = "DELETE FROM audit WHERE seq IN (SELECT seq FROM audit
    WHERE at_ms < $1 ORDER BY at_ms LIMIT $2 FOR UPDATE SKIP LOCKED)";

// Rate limits: the generic cell rate algorithm. `$1` the bucket, `$2` now,
// `$3` the interval between tokens, `$4` the tolerance (the burst less one,
// in intervals). A call passes when the bucket's arrival time is at most
// the tolerance ahead of now, and moves it one interval on; the row's lock
// serialises the takes of every process. Written without waiting for the
// disk (`async_commit`): a row lost to a crash costs a burst, no call.

/// Takes a token; a row answers only when one was taken.
pub(super) const TAKE_TOKEN: &str = "INSERT INTO rate_limits (key, tat)
    SELECT $1::text, $2::bigint + $3::bigint
    FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
    ON CONFLICT (key) DO UPDATE SET tat = GREATEST(rate_limits.tat, $2::bigint) + $3::bigint
        WHERE GREATEST(rate_limits.tat, $2::bigint) - $2::bigint <= $4::bigint
    RETURNING tat";

/// The arrival time of a bucket that refused a token.
pub(super) const TOKEN_TAT: &str = "SELECT tat FROM rate_limits WHERE key = $1";

// Schedules (migration 17).

/// Every schedule's record.
/// Keeps a handle ($1 id, $2 tenant, $3 user, $4 tool, $5 value, $6
/// size, $7 now, $8 expiry).
pub(super) const PUT_HANDLE: &str = r#"INSERT INTO handles
    (id, tenant, "user", tool, value, size_bytes, created_at, expires_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"#;

/// Tenant $1's handles past its newest $2 or past $3 bytes, newest
/// counted first (off `handles_tenant`).
pub(super) const EVICT_HANDLES: &str = "DELETE FROM handles WHERE id IN (
    SELECT id FROM (SELECT id,
        ROW_NUMBER() OVER newest AS n,
        (SUM(size_bytes) OVER newest)::bigint AS bytes
        FROM handles WHERE tenant = $1
        WINDOW newest AS (ORDER BY id DESC ROWS UNBOUNDED PRECEDING)) counted
    WHERE n > $2 OR bytes > $3)";

/// A user's unexpired handle ($1 id, $2 tenant, $3 user, $4 now).
pub(super) const HANDLE: &str = r#"SELECT id, tool, size_bytes, created_at, expires_at, value
    FROM handles WHERE id = $1 AND tenant = $2 AND "user" = $3 AND expires_at > $4"#;

/// A user's unexpired handles older than $4 (an id; NULL: from the newest),
/// newest first, at most $5 (off `handles_owner`).
pub(super) const LIST_HANDLES: &str = r#"SELECT id, tool, size_bytes, created_at, expires_at
    FROM handles
    WHERE tenant = $1 AND "user" = $2 AND expires_at > $3 AND ($4::text IS NULL OR id < $4)
    ORDER BY id DESC LIMIT $5"#;

/// Expired handles, oldest first, at most $2; `SKIP LOCKED`, so several
/// dispatchers share the work.
pub(super) const PRUNE_HANDLES: &str = "DELETE FROM handles WHERE id IN (SELECT id FROM handles
    WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)";

pub(super) const SCHEDULES: &str =
    "SELECT name, last_tick, last_job, paused, updated_at FROM schedules ORDER BY name";

/// The first record of schedule `$1`, at tick `$2`.
pub(super) const SCHEDULE_FIRST: &str =
    "INSERT INTO schedules (name, last_tick, last_job, updated_at)
    VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO NOTHING";

/// Schedule `$1` at tick `$2`, not paused -> at tick `$3`, having started `$4`.
pub(super) const SCHEDULE_ADVANCE: &str = "UPDATE schedules
    SET last_tick = $3, last_job = COALESCE($4, last_job), updated_at = $5
    WHERE name = $1 AND last_tick = $2 AND NOT paused";

/// Schedule `$1` paused (`$2`) or resumed at `$3`, made if missing;
/// resumed, its ticks count from `$3`.
pub(super) const SCHEDULE_PAUSE: &str =
    "INSERT INTO schedules (name, last_tick, paused, updated_at)
    VALUES ($1, $3, $2, $3)
    ON CONFLICT (name) DO UPDATE SET paused = $2, updated_at = $3,
        last_tick = CASE WHEN $2 THEN schedules.last_tick
                         ELSE GREATEST(schedules.last_tick, $3) END
    RETURNING name, last_tick, last_job, paused, updated_at";

/// `claim` or `take_over` of the next job of the ordered pool `$1`
/// (`$2` the lease owner, `$3` now, `$4` the lease's end) off
/// `jobs_ordered` (migration 18): the highest priority, then the earliest
/// due, then the smallest id, of the jobs without a concurrency key and
/// those whose key has fewer than its limit running with a lease that
/// holds (counted off `jobs_keyed`, migration 19); a row another claim
/// holds is skipped. Run after [`LOCK_POOL`] in one transaction, so that
/// two claims never both count a key's last free slot.
pub(super) static CLAIM_NEXT: Built = LazyLock::new(|| {
    format!(
        concat!(
            "UPDATE jobs SET state = '{running}', attempts = attempts + 1,
                run_at = CASE WHEN state IN {taken} THEN COALESCE(lease_until, run_at)
                              ELSE run_at END,
                lease_owner = $2, lease_until = $4, updated_at = $3, started_at = $3
            WHERE id = (SELECT id FROM jobs
                WHERE pool = $1 AND priority IS NOT NULL
                  AND state IN ('queued', 'scheduled', 'retrying', 'running')
                  AND ((state IN {claimed} AND run_at <= $3)
                       OR (state IN {taken} AND lease_until < $3))
                  AND (concurrency_key IS NULL OR concurrency_limit > (
                      SELECT count(*) FROM jobs r
                      WHERE r.concurrency_key = jobs.concurrency_key AND r.state = '{running}'
                        AND r.lease_until >= $3))
                ORDER BY priority DESC, fair_rank, run_at, id LIMIT 1
                FOR UPDATE SKIP LOCKED)
            RETURNING ",
            job_columns!()
        ),
        running = Transition::Claim.to(),
        claimed = sql_list(Transition::Claim.from()),
        taken = sql_list(Transition::TakeOver.from()),
    )
});

/// Serialises the claims of ordered pool `$1` until the transaction ends.
pub(super) const LOCK_POOL: &str =
    "SELECT pg_advisory_xact_lock(hashtextextended('toolfleet.claim_next:' || $1, 0))";

/// How many jobs of concurrency key `$1` run with a lease that holds at `$2`.
pub(super) static RUNNING_WITH_KEY: Built = LazyLock::new(|| {
    format!(
        "SELECT count(*) AS n FROM jobs WHERE concurrency_key = $1 AND state = '{running}'
            AND lease_until >= $2",
        running = Transition::Claim.to()
    )
});

/// The next turn of tenant `$2` in fair pool `$1`, past the pool's clock.
pub(super) const FAIR_TURN: &str = "INSERT INTO fair_turns (pool, tenant, rank)
    VALUES ($1, $2, COALESCE((SELECT rank FROM fair_clocks WHERE pool = $1), 0) + 1)
    ON CONFLICT (pool, tenant) DO UPDATE SET rank = GREATEST(fair_turns.rank,
        COALESCE((SELECT rank FROM fair_clocks WHERE pool = $1), 0)) + 1
    RETURNING rank";

/// Pool `$1`'s clock moved on to turn `$2` (never back).
pub(super) const FAIR_CLOCK: &str = "INSERT INTO fair_clocks (pool, rank) VALUES ($1, $2)
    ON CONFLICT (pool) DO UPDATE SET rank = GREATEST(fair_clocks.rank, EXCLUDED.rank)";
