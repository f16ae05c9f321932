-- toolfleet's SQLite schema, version 17: scheduled jobs are found by
-- due_jobs off an index of their own ("state = 'scheduled' AND run_at <=
-- ?3 ORDER BY run_at"; the query names it), so a backlog of queued jobs,
-- which sorts before them in jobs_waiting_due, cannot keep them from the
-- sweeper's pass.

CREATE INDEX jobs_scheduled ON jobs (run_at) WHERE state = 'scheduled';
