-- toolfleet's SQLite schema, version 27: jobs_lease holds running jobs
-- only, by when their lease ends, as PostgreSQL's always has. It held
-- every job by (state, lease_until), and no statement reads it for any
-- state but running (due_jobs's abandoned half, "state = 'running' AND
-- lease_until < ?", the one statement that reads it): each job entered it
-- when inserted, moved in it when claimed, and again when settled, where
-- it stayed until pruned. Now a job enters it when claimed and leaves it
-- when settled: an insert never changes it, a claim adds an entry where
-- it moved one, and a settlement removes one where it moved one.
-- Counting jobs by state reads jobs_due, which still holds every job by
-- state.

DROP INDEX jobs_lease;
CREATE INDEX jobs_lease ON jobs (lease_until) WHERE state = 'running';
