-- toolfleet's PostgreSQL schema, version 11: the dispatcher that answers a call
-- `running` before its job's message is confirmed names itself on the job
-- (origin) and beats in dispatchers while it lives. Once one falls silent,
-- another publishes the queued jobs it made lately: the row is its own
-- outbox, and what a crash left unpublished starts within seconds. Jobs
-- written before name no origin; the periodic sweep covers them as before.

ALTER TABLE jobs ADD COLUMN origin text;

CREATE TABLE dispatchers (
    origin  text PRIMARY KEY,
    seen_at bigint NOT NULL
);

-- The longest silent first.
CREATE INDEX dispatchers_seen ON dispatchers (seen_at);
