-- toolfleet's SQLite schema, version 1. Times are Unix milliseconds; JSON
-- columns hold JSON text. Tables are STRICT so a wrong type is an error at
-- write time instead of a surprise at read time.

-- One row per accepted job. The row is also the job's outbox: a job written
-- but never published is found again by the due-jobs query, so it is not lost.
CREATE TABLE jobs (
    id              TEXT PRIMARY KEY NOT NULL,  -- UUIDv7, so ids sort by creation time
    tenant          TEXT NOT NULL,
    user            TEXT NOT NULL,
    tool            TEXT NOT NULL,
    pool            TEXT NOT NULL,
    -- Canonical JSON (members sorted), so a repeated idempotency key is
    -- compared with the first call's arguments by plain text equality.
    args            TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN
                        ('queued', 'running', 'retrying', 'succeeded', 'failed', 'cancelled')),
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
    updated_at      INTEGER NOT NULL
) STRICT;

-- Effectively once: a tenant's second call of a tool with the same key finds
-- the first job instead of making another. Calls without a key never collide.
CREATE UNIQUE INDEX jobs_idempotency ON jobs (tenant, tool, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Due jobs: "state IN ('queued', 'retrying') AND run_at <= now" is a range
-- per state, so settled jobs, the bulk of the table, are never scanned.
CREATE INDEX jobs_due ON jobs (state, run_at);

-- Abandoned jobs: "state = 'running' AND lease_until < now" finds the jobs
-- whose worker died without scanning the ones still held.
CREATE INDEX jobs_lease ON jobs (state, lease_until);

-- The job list of one tenant, newest first, paged by "id < cursor": a walk
-- down this index; the state and tool filters are checked on the way.
CREATE INDEX jobs_tenant ON jobs (tenant, id DESC);

-- Questions for a person. Read by id and tenant only, so the key suffices.
CREATE TABLE tickets (
    id           TEXT PRIMARY KEY NOT NULL,
    tenant       TEXT NOT NULL,
    user         TEXT NOT NULL,
    tool         TEXT NOT NULL,
    question     TEXT NOT NULL,
    options      TEXT NOT NULL,  -- JSON array of strings
    args         TEXT NOT NULL,  -- JSON
    run_id       TEXT NOT NULL,
    call_id      TEXT NOT NULL,
    callback_url TEXT,
    answer       TEXT,           -- JSON; NULL while open
    created_at   INTEGER NOT NULL,
    answered_at  INTEGER
) STRICT;

-- One record per call, append only. seq keeps the order of records that
-- share a millisecond.
CREATE TABLE audit (
    seq         INTEGER PRIMARY KEY,
    at_ms       INTEGER NOT NULL,
    tenant      TEXT NOT NULL,
    user        TEXT NOT NULL,
    tool        TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    call_id     TEXT NOT NULL,
    args        TEXT NOT NULL,   -- JSON, redacted fields already masked
    status      TEXT NOT NULL CHECK (status IN ('ok', 'error', 'running', 'suspended')),
    error_code  TEXT,
    duration_us INTEGER NOT NULL
) STRICT;

-- A tenant's latest records, newest first: this index read backwards (seq,
-- the rowid, is implicitly its last column and breaks ties the same way).
CREATE INDEX audit_tenant ON audit (tenant, at_ms);

-- The durable commit log of command tools: a commit key is claimed while its
-- command runs (pending, until lease_until), then holds the outcome
-- (settled, until keep_until) so a retried commit answers the same envelope.
CREATE TABLE commits (
    key         TEXT PRIMARY KEY NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('pending', 'settled')),
    envelope    TEXT,            -- JSON; set once settled
    lease_until INTEGER,
    keep_until  INTEGER,
    CHECK ((state = 'pending') = (envelope IS NULL))
) STRICT;

-- Pruning of settled outcomes past keep_until.
CREATE INDEX commits_expiry ON commits (keep_until) WHERE state = 'settled';
