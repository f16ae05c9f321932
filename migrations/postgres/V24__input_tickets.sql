-- toolfleet's PostgreSQL schema, version 24: tickets of a third kind,
-- `input`, the same columns as SQLite's: what a job tool declared
-- `asks_client` asks its caller's MCP client while its job waits (parked
-- on the ticket). `input_requests` holds the requests by key (JSON object
-- as text), `input_responses` the answers recorded so far (NULL before the
-- first); once every key is answered, `answer` holds them all.
--
-- Applied by `toolfleet migrate`; a process of version 23 keeps running
-- (it names its columns, never `*`, and writes no input ticket). Adding
-- nullable columns rewrites no row; the new CHECK reads the table once.

ALTER TABLE tickets DROP CONSTRAINT IF EXISTS tickets_kind_check;

ALTER TABLE tickets ADD CONSTRAINT tickets_kind_check
    CHECK (kind IN ('question', 'approval', 'input'));

ALTER TABLE tickets ADD COLUMN input_requests text;

ALTER TABLE tickets ADD COLUMN input_responses text;
