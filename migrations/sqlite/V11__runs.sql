-- toolfleet's SQLite schema, version 11: runs, their waits, and the inbox.
-- A run is a conversation the runtime keeps; it moves between its states
-- only by a compare-and-set on its version. While it waits, the jobs and
-- tickets it waits on are indexed in run_waits, so it is found from any of
-- them. Tickets gain what the inbox asks of them: a kind (a question, or
-- an approval of a command's commit), an approval's plan, the scopes of the
-- caller who opened it, an expiry, and what the ticket came to. Tickets
-- written before are questions without scopes, expiry or outcome.

ALTER TABLE tickets ADD COLUMN kind TEXT NOT NULL DEFAULT 'question'
    CHECK (kind IN ('question', 'approval'));

-- An approval's plan (JSON: what the command's dry run answered).
ALTER TABLE tickets ADD COLUMN plan TEXT;

-- The scopes of the caller who opened it (JSON array of strings).
ALTER TABLE tickets ADD COLUMN scopes TEXT NOT NULL DEFAULT '[]';

-- When it expires unanswered; NULL: never.
ALTER TABLE tickets ADD COLUMN expires_at INTEGER;

-- When it expired unanswered; NULL otherwise.
ALTER TABLE tickets ADD COLUMN expired_at INTEGER;

-- What it came to (a JSON envelope), recorded once; NULL until then.
ALTER TABLE tickets ADD COLUMN outcome TEXT;

-- An operator's inbox: a tenant's tickets, newest first, paged by
-- "id < cursor".
CREATE INDEX tickets_tenant ON tickets (tenant, id DESC);

-- A user's inbox, first half: the tickets they opened that their caller
-- answers (answered_by IS NULL).
CREATE INDEX tickets_owner ON tickets (tenant, user, id DESC);

-- A user's inbox, second half: the tickets answered by a scope they hold.
CREATE INDEX tickets_scope ON tickets (tenant, answered_by, id DESC);

-- expire_tickets: open tickets with an expiry, earliest first.
CREATE INDEX tickets_expiry ON tickets (expires_at)
    WHERE answer IS NULL AND expired_at IS NULL AND expires_at IS NOT NULL;

-- unsettled_tickets: answered tickets without an outcome, oldest first.
CREATE INDEX tickets_unsettled ON tickets (answered_at, id)
    WHERE answer IS NOT NULL AND outcome IS NULL;

CREATE TABLE runs (
    id              TEXT PRIMARY KEY NOT NULL,  -- run_ and a UUIDv7: sorts by time
    tenant          TEXT NOT NULL,
    user            TEXT NOT NULL,
    agent           TEXT,                       -- NULL: the caller drives it
    -- RunState::ALL.
    state           TEXT NOT NULL CHECK (state IN
                        ('running', 'waiting', 'answered', 'failed', 'budget_exceeded',
                         'cancelled')),
    checkpoint      TEXT,                       -- JSON
    wait            TEXT,                       -- JSON RunWait; set while waiting
    resumed         TEXT,                       -- JSON
    answer          TEXT,
    error           TEXT,                       -- JSON
    usage           TEXT,                       -- JSON
    callback_url    TEXT,
    idempotency_key TEXT,
    scopes          TEXT NOT NULL DEFAULT '[]', -- JSON array of strings
    version         INTEGER NOT NULL CHECK (version >= 1),
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
) STRICT;

-- insert_run: a second run of one tenant, user and key is the first.
CREATE UNIQUE INDEX runs_idempotency ON runs (tenant, user, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- list_runs: a tenant's runs, newest first, and a user's own.
CREATE INDEX runs_tenant ON runs (tenant, id DESC);
CREATE INDEX runs_owner ON runs (tenant, user, id DESC);

-- stale_runs: the runs of one state written longest ago first.
CREATE INDEX runs_stale ON runs (state, updated_at, id);

-- The items (job and ticket ids) a waiting run waits on, one row each,
-- written with the run's move to waiting and dropped with its move out.
CREATE TABLE run_waits (
    item   TEXT NOT NULL,
    run_id TEXT NOT NULL,
    PRIMARY KEY (item, run_id)
) STRICT, WITHOUT ROWID;

-- update_run: a run's rows, dropped when it moves.
CREATE INDEX run_waits_run ON run_waits (run_id);
