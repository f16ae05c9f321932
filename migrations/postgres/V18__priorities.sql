-- toolfleet's PostgreSQL schema, version 18: priorities. A job of an
-- ordered pool (one whose tools declare a priority) carries its priority
-- (higher first); other jobs carry none and are claimed by id as before.
-- The workers of an ordered pool claim its next job off jobs_ordered:
-- the highest priority first, then the earliest due (Store::claim_next).
-- Only ordered jobs enter the index, so other pools pay nothing for it.

ALTER TABLE jobs ADD COLUMN priority smallint;

CREATE INDEX jobs_ordered ON jobs (pool, priority DESC, run_at, id)
    WHERE priority IS NOT NULL AND state IN ('queued', 'scheduled', 'retrying', 'running');
