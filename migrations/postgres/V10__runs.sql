-- toolfleet's PostgreSQL schema, version 10: runs, their waits, and the
-- inbox, the same tables and columns as SQLite's. A run is a conversation
-- the runtime keeps; it moves between its states only by a compare-and-set
-- on its version. While it waits, the jobs and tickets it waits on are
-- indexed in run_waits, so it is found from any of them. Tickets gain what
-- the inbox asks of them: a kind (a question, or an approval of a
-- command's commit), an approval's plan, the scopes of the caller who
-- opened it, an expiry, and what the ticket came to. JSON as text, as in
-- version 1.
--
-- Applied by `toolfleet migrate`; a process of version 9 keeps running (it
-- names its columns, never `*`, and the new columns of tickets have
-- defaults), and a process of this version refuses a schema still at
-- version 9. The defaults are constants, so adding the columns rewrites no
-- row; building the indexes of tickets reads the whole table and holds
-- writes to it until they are built. Tickets written before are questions
-- without scopes, expiry or outcome.

ALTER TABLE tickets ADD COLUMN kind text NOT NULL DEFAULT 'question'
    CHECK (kind IN ('question', 'approval'));

-- An approval's plan (JSON: what the command's dry run answered).
ALTER TABLE tickets ADD COLUMN plan text;

-- The scopes of the caller who opened it (JSON array of strings).
ALTER TABLE tickets ADD COLUMN scopes text NOT NULL DEFAULT '[]';

-- When it expires unanswered; NULL: never.
ALTER TABLE tickets ADD COLUMN expires_at bigint;

-- When it expired unanswered; NULL otherwise.
ALTER TABLE tickets ADD COLUMN expired_at bigint;

-- What it came to (a JSON envelope), recorded once; NULL until then.
ALTER TABLE tickets ADD COLUMN outcome text;

-- An operator's inbox: a tenant's tickets, newest first, paged by
-- "id < cursor".
CREATE INDEX tickets_tenant ON tickets (tenant, id DESC);

-- A user's inbox, first half: the tickets they opened that their caller
-- answers (answered_by IS NULL).
CREATE INDEX tickets_owner ON tickets (tenant, "user", id DESC) WHERE answered_by IS NULL;

-- A user's inbox, second half: the tickets answered by a scope they hold.
CREATE INDEX tickets_scope ON tickets (tenant, answered_by, id DESC)
    WHERE answered_by IS NOT NULL;

-- expire_tickets: "answer IS NULL AND expired_at IS NULL AND expires_at <=
-- $1 ORDER BY expires_at LIMIT $2": open tickets with an expiry alone.
CREATE INDEX tickets_expiry ON tickets (expires_at)
    WHERE answer IS NULL AND expired_at IS NULL AND expires_at IS NOT NULL;

-- unsettled_tickets: answered tickets without an outcome, oldest first.
CREATE INDEX tickets_unsettled ON tickets (answered_at, id)
    WHERE answer IS NOT NULL AND outcome IS NULL;

CREATE TABLE runs (
    id              text COLLATE "C" PRIMARY KEY,  -- run_ and a UUIDv7: sorts by time
    tenant          text NOT NULL,
    "user"          text NOT NULL,
    agent           text,                          -- NULL: the caller drives it
    -- RunState::ALL.
    state           text NOT NULL CHECK (state IN
                        ('running', 'waiting', 'answered', 'failed', 'budget_exceeded',
                         'cancelled')),
    checkpoint      text,                          -- JSON
    wait            text,                          -- JSON RunWait; set while waiting
    resumed         text,                          -- JSON
    answer          text,
    error           text,                          -- JSON
    usage           text,                          -- JSON
    callback_url    text,
    idempotency_key text,
    scopes          text NOT NULL DEFAULT '[]',    -- JSON array of strings
    version         bigint NOT NULL CHECK (version >= 1),
    created_at      bigint NOT NULL,
    updated_at      bigint NOT NULL
);

-- insert_run: a second run of one tenant, user and key is the first.
CREATE UNIQUE INDEX runs_idempotency ON runs (tenant, "user", idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- list_runs: a tenant's runs, newest first, and a user's own.
CREATE INDEX runs_tenant ON runs (tenant, id DESC);
CREATE INDEX runs_owner ON runs (tenant, "user", id DESC);

-- stale_runs: the runs of one state written longest ago first.
CREATE INDEX runs_stale ON runs (state, updated_at, id);

-- The items (job and ticket ids) a waiting run waits on, one row each,
-- written with the run's move to waiting and dropped with its move out.
CREATE TABLE run_waits (
    item   text COLLATE "C" NOT NULL,
    run_id text COLLATE "C" NOT NULL,
    PRIMARY KEY (item, run_id)
);

-- update_run: a run's rows, dropped when it moves.
CREATE INDEX run_waits_run ON run_waits (run_id);
