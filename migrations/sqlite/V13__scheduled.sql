-- toolfleet's SQLite schema, version 13: a job called with `run_at` or
-- `delay_s` is recorded in a state of its own, `scheduled`
-- (toolfleet_core::lifecycle), until its run_at. SQLite cannot change a
-- CHECK constraint, so the table is made again with the new list of states
-- (JobState::ALL), its rows copied as they are, and its indexes made again
-- as versions 1 to 12 had them, but for the index of waiting jobs, which
-- takes the claim's new list (Transition::Claim.from()) as the due-jobs
-- query names it. Nothing else changes.

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
    state           TEXT NOT NULL CHECK (state IN
                        ('queued', 'scheduled', 'running', 'retrying', 'parked',
                         'succeeded', 'failed', 'cancelled')),
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
    origin          TEXT
) STRICT;

INSERT INTO jobs_next (id, tenant, user, tool, pool, args, state, attempts, max_attempts,
    timeout_ms, run_at, lease_owner, lease_until, progress, result, error, idempotency_key,
    run_id, call_id, callback_url, created_at, updated_at, lineage, scopes, checkpoint,
    waiting_on, traceparent, tracestate, origin)
SELECT id, tenant, user, tool, pool, args, state,
    attempts, max_attempts, timeout_ms, run_at, lease_owner, lease_until, progress, result,
    error, idempotency_key, run_id, call_id, callback_url, created_at, updated_at, lineage,
    scopes, checkpoint, waiting_on, traceparent, tracestate, origin
FROM jobs;

DROP TABLE jobs;

ALTER TABLE jobs_next RENAME TO jobs;

CREATE UNIQUE INDEX jobs_idempotency ON jobs (tenant, tool, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE INDEX jobs_due ON jobs (state, run_at);

CREATE INDEX jobs_lease ON jobs (state, lease_until);

CREATE INDEX jobs_tenant ON jobs (tenant, id DESC);

CREATE INDEX jobs_waiting ON jobs (waiting_on) WHERE waiting_on IS NOT NULL;

CREATE INDEX jobs_callbacks ON jobs (updated_at, id)
    WHERE callback_url IS NOT NULL AND state IN ('succeeded', 'failed', 'cancelled');

-- Claim's states, literally as the due-jobs query names them (parked jobs
-- are not in it: they are never due).
CREATE INDEX jobs_waiting_due ON jobs (run_at)
    WHERE state IN ('queued', 'scheduled', 'retrying');

CREATE INDEX jobs_owner ON jobs (tenant, user, id DESC);
