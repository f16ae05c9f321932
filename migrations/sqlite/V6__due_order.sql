-- toolfleet's SQLite schema, version 6: due_jobs reads the earliest of the
-- waiting backlog off an index in its order, instead of sorting it whole.

-- due_jobs, first half: "state IN ('queued', 'retrying') AND run_at <= ?1
-- ORDER BY run_at LIMIT ?2". On (state, run_at) the two states are two
-- ranges that SQLite merges by sorting every waiting job; partial on exactly
-- that state list, this index is one range in run_at order, read up to the
-- limit. Settled jobs, the bulk of the table, are never in it. SQLite uses
-- a partial index only where the query's WHERE implies its predicate: the
-- query names this index (INDEXED BY) and repeats this state list as it is.
CREATE INDEX jobs_waiting_due ON jobs (run_at) WHERE state IN ('queued', 'retrying');
