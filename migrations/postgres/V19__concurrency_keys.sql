-- toolfleet's PostgreSQL schema, version 19: concurrency keys. A job of a
-- tool that declares `concurrency = { limit, key }` carries the key it
-- counts under and the limit; Store::claim_next takes it only while fewer
-- than `concurrency_limit` jobs of its key run with a lease that holds,
-- counted off jobs_keyed (running keyed jobs alone).

ALTER TABLE jobs ADD COLUMN concurrency_key text;
ALTER TABLE jobs ADD COLUMN concurrency_limit bigint;

CREATE INDEX jobs_keyed ON jobs (concurrency_key, lease_until)
    WHERE concurrency_key IS NOT NULL AND state = 'running';
