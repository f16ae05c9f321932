-- toolfleet's PostgreSQL schema, version 12: a job called with `run_at` or
-- `delay_s` is recorded in a state of its own, `scheduled`
-- (toolfleet_core::lifecycle), until its run_at. The state's CHECK takes
-- the new list (JobState::ALL), and the index of waiting jobs takes the
-- claim's new list (Transition::Claim.from()), which due_jobs names as the
-- index's predicate does.
--
-- Applied by `toolfleet migrate`. The new CHECK reads the whole `jobs`
-- table and the new index is built before the old one is dropped; both
-- hold writes to `jobs` until they are done.

ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;

ALTER TABLE jobs ADD CONSTRAINT jobs_state_check CHECK (state IN
    ('queued', 'scheduled', 'running', 'retrying', 'parked', 'succeeded', 'failed',
     'cancelled'));

-- due_jobs, first half: "state IN ('queued', 'scheduled', 'retrying') AND
-- run_at <= $3", in run_at order.
CREATE INDEX jobs_due_next ON jobs (run_at)
    WHERE state IN ('queued', 'scheduled', 'retrying');

DROP INDEX jobs_due;

ALTER INDEX jobs_due_next RENAME TO jobs_due;
