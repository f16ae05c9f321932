-- toolfleet's SQLite schema, version 28: the indexes due_jobs reads end
-- with the job's id, so the sweeper reads a backlog a page at a time, each
-- page from the key and id the page before ended at, however many jobs
-- share one time (a schedule's fan-out, a batch accepted within a
-- millisecond): with the time alone, every page read and sorted every job
-- of its first time. The states stay as migrations 26 and 27 write them
-- (SQLite uses a partial index only for a WHERE that implies it).

DROP INDEX jobs_waiting_due;
CREATE INDEX jobs_waiting_due ON jobs (run_at, id)
    WHERE (state = 'queued' OR state = 'scheduled' OR state = 'retrying');

DROP INDEX jobs_scheduled;
CREATE INDEX jobs_scheduled ON jobs (run_at, id) WHERE state = 'scheduled';

DROP INDEX jobs_lease;
CREATE INDEX jobs_lease ON jobs (lease_until, id) WHERE state = 'running';
