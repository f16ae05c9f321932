-- toolfleet's PostgreSQL schema, version 1: the same tables as SQLite's.
-- Times are Unix milliseconds (bigint). JSON columns hold JSON text, not
-- jsonb: jsonb reorders members, and a job's arguments are compared by exact
-- text and its result is handed back byte for byte. Ids are text with the
-- "C" collation, so ids sort by their bytes (a UUIDv7 by creation time)
-- whatever the database's locale, exactly as on SQLite.
--
-- Applied by `toolfleet migrate`; a process refuses to start against a
-- schema version it does not know.

-- One row per accepted job. The row is also the job's outbox: a job written
-- but never published is found again by the due-jobs query, so it is not lost.
CREATE TABLE jobs (
    id              text COLLATE "C" PRIMARY KEY,  -- UUIDv7, so ids sort by creation time
    tenant          text NOT NULL,
    "user"          text NOT NULL,
    tool            text NOT NULL,
    pool            text NOT NULL,
    -- Canonical JSON (members sorted), so a repeated idempotency key is
    -- compared with the first call's arguments by plain text equality.
    args            text NOT NULL,
    state           text NOT NULL CHECK (state IN
                        ('queued', 'running', 'retrying', 'succeeded', 'failed', 'cancelled')),
    attempts        bigint NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts    bigint NOT NULL CHECK (max_attempts >= 0),
    timeout_ms      bigint NOT NULL,
    run_at          bigint NOT NULL,
    -- A lease exists only while the job is running.
    lease_owner     text,
    lease_until     bigint,
    progress        text,
    result          text,
    error           text,
    idempotency_key text,
    run_id          text NOT NULL,
    call_id         text NOT NULL,
    callback_url    text,
    created_at      bigint NOT NULL,
    updated_at      bigint NOT NULL
);

-- insert_job: effectively once. A tenant's second call of a tool with the
-- same key conflicts here (INSERT ... ON CONFLICT DO NOTHING inserts
-- nothing), and the lookup "tenant = $1 AND tool = $2 AND idempotency_key =
-- $3" then finds the first job by this index. Calls without a key never
-- collide and take no room in it.
CREATE UNIQUE INDEX jobs_idempotency ON jobs (tenant, tool, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- due_jobs, first half: "state IN ('queued', 'retrying') AND run_at <= $1".
-- Partial on exactly that state list, so the index holds only waiting jobs
-- and settled jobs, the bulk of the table, are never in it nor scanned.
CREATE INDEX jobs_due ON jobs (run_at) WHERE state IN ('queued', 'retrying');

-- due_jobs, second half: abandoned jobs, "state = 'running' AND lease_until
-- < $1", the jobs whose worker died, without scanning the ones still held
-- beyond the lease bound nor any job in another state.
CREATE INDEX jobs_lease ON jobs (lease_until) WHERE state = 'running';

-- list_jobs: one tenant's jobs, newest first, paged by "id < cursor": a walk
-- down this index from the cursor; the state and tool filters are checked on
-- the way, and the walk stops after one page.
CREATE INDEX jobs_tenant ON jobs (tenant, id DESC);

-- Questions for a person. Read by id (and tenant) only, so the key suffices.
CREATE TABLE tickets (
    id           text COLLATE "C" PRIMARY KEY,
    tenant       text NOT NULL,
    "user"       text NOT NULL,
    tool         text NOT NULL,
    question     text NOT NULL,
    options      text NOT NULL,  -- JSON array of strings
    args         text NOT NULL,  -- JSON
    run_id       text NOT NULL,
    call_id      text NOT NULL,
    callback_url text,
    answer       text,           -- JSON; NULL while open
    created_at   bigint NOT NULL,
    answered_at  bigint
);

-- One record per call, append only. seq keeps the order of records that
-- share a millisecond.
CREATE TABLE audit (
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at_ms       bigint NOT NULL,
    tenant      text NOT NULL,
    "user"      text NOT NULL,
    tool        text NOT NULL,
    run_id      text NOT NULL,
    call_id     text NOT NULL,
    args        text NOT NULL,   -- JSON, redacted fields already masked
    status      text NOT NULL CHECK (status IN ('ok', 'error', 'running', 'suspended')),
    error_code  text,
    duration_us bigint NOT NULL
);

-- audit: a tenant's latest records, "WHERE tenant = $1 ORDER BY at_ms DESC,
-- seq DESC LIMIT $2", read straight off this index with no sort. Unlike
-- SQLite's rowid, seq is not implied, so it is the last column here.
CREATE INDEX audit_tenant ON audit (tenant, at_ms DESC, seq DESC);

-- The durable commit log of command tools: a commit key is claimed while its
-- command runs (pending, until lease_until), then holds the outcome
-- (settled, until keep_until) so a retried commit answers the same envelope.
-- claim_commit and settle_commit find a key by the primary key.
CREATE TABLE commits (
    key         text PRIMARY KEY,
    state       text NOT NULL CHECK (state IN ('pending', 'settled')),
    envelope    text,            -- JSON; set once settled
    lease_until bigint,
    keep_until  bigint,
    CHECK ((state = 'pending') = (envelope IS NULL))
);

-- Pruning of settled outcomes past keep_until ("state = 'settled' AND
-- keep_until < $1", a bounded batch per claim): only settled rows are in it.
CREATE INDEX commits_expiry ON commits (keep_until) WHERE state = 'settled';
