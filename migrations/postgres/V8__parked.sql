-- toolfleet's PostgreSQL schema, version 8: a job waiting on a ticket is in
-- a state of its own, `parked` (toolfleet_core::lifecycle), instead of
-- `retrying` with a run_at that never comes. The state's CHECK takes the
-- new list (JobState::ALL) and the jobs parked now move to it.
--
-- Applied by `toolfleet migrate` with every process of version 7 stopped:
-- such a process would park jobs as `retrying` again. Both statements read
-- the whole `jobs` table (the UPDATE through `jobs_waiting`) and hold
-- writes to it until they are done.

ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;

ALTER TABLE jobs ADD CONSTRAINT jobs_state_check CHECK (state IN
    ('queued', 'running', 'retrying', 'parked', 'succeeded', 'failed', 'cancelled'));

UPDATE jobs SET state = 'parked'
WHERE waiting_on IS NOT NULL AND state = 'retrying';
