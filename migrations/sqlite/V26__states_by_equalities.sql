-- toolfleet's SQLite schema, version 26: the jobs table's state CHECK and
-- its partial indexes that name three or more states name them by
-- equalities joined by OR (lifecycle::sql_any) instead of an IN list.
-- SQLite builds a temporary b-tree for an IN list of three or more values
-- every time a statement runs, and every write of a job evaluates the
-- CHECK, and the condition of each partial index for the row it leaves
-- and for the row it writes: a claim built ten of them, a success nine.
-- The statements these indexes serve repeat each condition literally, as
-- SQLite requires. SQLite cannot change a CHECK constraint, so the table
-- is made again with the same columns in the same order, its rows copied,
-- and its indexes made again as versions 1 to 25 had them, but for the
-- four whose condition changes. The rows the table and each index hold do
-- not change.

CREATE TABLE jobs_next (
    id              TEXT PRIMARY KEY NOT NULL,  -- UUIDv7, so ids sort by creation time
    tenant          TEXT NOT NULL,
    user            TEXT NOT NULL,
    tool            TEXT NOT NULL,
    pool            TEXT NOT NULL,
    -- Canonical JSON (members sorted), so a repeated idempotency key is
    -- compared with the first call's arguments by plain text equality.
    args            TEXT NOT NULL,
    -- JobState::ALL.
    state           TEXT NOT NULL CHECK (state = 'queued' OR state = 'scheduled'
                        OR state = 'running' OR state = 'retrying' OR state = 'parked'
                        OR state = 'succeeded' OR state = 'failed' OR state = 'cancelled'),
    attempts        INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts    INTEGER NOT NULL CHECK (max_attempts >= 0),
    timeout_ms      INTEGER NOT NULL,
    run_at          INTEGER NOT NULL,
    -- A lease exists only while the job is running.
    lease_owner     TEXT,
    lease_until     INTEGER,
    progress        TEXT,
    result          TEXT,
    error           TEXT,
    idempotency_key TEXT,
    run_id          TEXT NOT NULL,
    call_id         TEXT NOT NULL,
    callback_url    TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    lineage         TEXT,
    scopes          TEXT,
    checkpoint      TEXT,
    -- The ticket a parked job waits on.
    waiting_on      TEXT,
    traceparent     TEXT,
    tracestate      TEXT,
    -- The dispatcher that publishes its first message (version 12).
    origin          TEXT,
    requeues        INTEGER NOT NULL DEFAULT 0 CHECK (requeues >= 0),
    priority        INTEGER,
    concurrency_key TEXT,
    concurrency_limit INTEGER,
    fair_rank       INTEGER NOT NULL DEFAULT 0,
    started_at      INTEGER,
    attempts_log    TEXT
) STRICT;

INSERT INTO jobs_next (id, tenant, user, tool, pool, args, state, attempts, max_attempts,
    timeout_ms, run_at, lease_owner, lease_until, progress, result, error, idempotency_key,
    run_id, call_id, callback_url, created_at, updated_at, lineage, scopes, checkpoint,
    waiting_on, traceparent, tracestate, origin, requeues, priority, concurrency_key,
    concurrency_limit, fair_rank, started_at, attempts_log)
SELECT id, tenant, user, tool, pool, args, state, attempts, max_attempts,
    timeout_ms, run_at, lease_owner, lease_until, progress, result, error, idempotency_key,
    run_id, call_id, callback_url, created_at, updated_at, lineage, scopes, checkpoint,
    waiting_on, traceparent, tracestate, origin, requeues, priority, concurrency_key,
    concurrency_limit, fair_rank, started_at, attempts_log
FROM jobs;

DROP TABLE jobs;

ALTER TABLE jobs_next RENAME TO jobs;

CREATE UNIQUE INDEX jobs_idempotency ON jobs (tenant, tool, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX jobs_due ON jobs (state, run_at);
CREATE INDEX jobs_lease ON jobs (state, lease_until);
CREATE INDEX jobs_tenant ON jobs (tenant, id DESC);
CREATE INDEX jobs_waiting ON jobs (waiting_on) WHERE waiting_on IS NOT NULL;
CREATE INDEX jobs_owner ON jobs (tenant, user, id DESC);
CREATE INDEX jobs_scheduled ON jobs (run_at) WHERE state = 'scheduled';
CREATE INDEX jobs_keyed ON jobs (concurrency_key, lease_until)
    WHERE concurrency_key IS NOT NULL AND state = 'running';
-- Two states: SQLite compares a list of two in place.
CREATE INDEX jobs_tenant_state ON jobs (tenant, state, id DESC)
    WHERE state IN ('failed', 'cancelled');

CREATE INDEX jobs_callbacks ON jobs (updated_at, id)
    WHERE callback_url IS NOT NULL
      AND (state = 'succeeded' OR state = 'failed' OR state = 'cancelled');
CREATE INDEX jobs_waiting_due ON jobs (run_at)
    WHERE (state = 'queued' OR state = 'scheduled' OR state = 'retrying');
CREATE INDEX jobs_settled ON jobs (updated_at)
    WHERE (state = 'succeeded' OR state = 'failed' OR state = 'cancelled');
CREATE INDEX jobs_ordered ON jobs (pool, priority DESC, fair_rank, run_at, id)
    WHERE priority IS NOT NULL
      AND (state = 'queued' OR state = 'scheduled' OR state = 'retrying' OR state = 'running');
