-- toolfleet's SQLite schema, version 25: tickets of a third kind, `input`:
-- what a job tool declared `asks_client` asks its caller's MCP client
-- while its job waits (parked on the ticket). `input_requests` holds the
-- requests by key (JSON object), `input_responses` the answers recorded so
-- far (JSON object, its keys among the requests'; NULL before the first);
-- once every key is answered, `answer` holds them all. SQLite cannot change
-- a CHECK constraint, so the table is made again with the new list of
-- kinds, its rows copied, and its indexes made again as versions 1 to 24
-- had them. Nothing else changes.

CREATE TABLE tickets_next (
    id              TEXT PRIMARY KEY NOT NULL,
    tenant          TEXT NOT NULL,
    user            TEXT NOT NULL,
    tool            TEXT NOT NULL,
    question        TEXT NOT NULL,
    options         TEXT NOT NULL,  -- JSON array of strings
    args            TEXT NOT NULL,  -- JSON
    run_id          TEXT NOT NULL,
    call_id         TEXT NOT NULL,
    callback_url    TEXT,
    answer          TEXT,           -- JSON; NULL while open
    created_at      INTEGER NOT NULL,
    answered_at     INTEGER,
    answered_by     TEXT,
    kind            TEXT NOT NULL DEFAULT 'question'
                        CHECK (kind IN ('question', 'approval', 'input')),
    plan            TEXT,
    scopes          TEXT NOT NULL DEFAULT '[]',
    expires_at      INTEGER,
    expired_at      INTEGER,
    outcome         TEXT,
    input_requests  TEXT,           -- JSON object; input tickets only
    input_responses TEXT            -- JSON object; NULL before the first answer
) STRICT;

INSERT INTO tickets_next (id, tenant, user, tool, question, options, args, run_id, call_id,
    callback_url, answer, created_at, answered_at, answered_by, kind, plan, scopes,
    expires_at, expired_at, outcome)
SELECT id, tenant, user, tool, question, options, args, run_id, call_id,
    callback_url, answer, created_at, answered_at, answered_by, kind, plan, scopes,
    expires_at, expired_at, outcome
FROM tickets;

DROP TABLE tickets;

ALTER TABLE tickets_next RENAME TO tickets;

CREATE INDEX tickets_callbacks ON tickets (answered_at, id)
    WHERE callback_url IS NOT NULL AND answer IS NOT NULL;

CREATE INDEX tickets_tenant ON tickets (tenant, id DESC);

CREATE INDEX tickets_owner ON tickets (tenant, user, id DESC);

CREATE INDEX tickets_scope ON tickets (tenant, answered_by, id DESC);

CREATE INDEX tickets_expiry ON tickets (expires_at)
    WHERE answer IS NULL AND expired_at IS NULL AND expires_at IS NOT NULL;

CREATE INDEX tickets_unsettled ON tickets (answered_at, id)
    WHERE answer IS NOT NULL AND outcome IS NULL;

CREATE INDEX tickets_closed ON tickets (COALESCE(answered_at, expired_at));
