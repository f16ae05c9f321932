-- toolfleet's PostgreSQL schema, version 26: the indexes due_jobs reads
-- end with the job's id, so the sweeper reads a backlog a page at a time,
-- each page from the key and id the page before ended at ("(run_at, id) >
-- ($1, $2) ORDER BY run_at, id"), however many jobs share one time (a
-- schedule's fan-out, a batch accepted within a millisecond): with the
-- time alone, every page read and sorted every job of its first time.
--
-- Applied by `toolfleet migrate`. Each new index is built before the old
-- one is dropped; building it holds writes to `jobs` until it is done.

CREATE INDEX jobs_due_paged ON jobs (run_at, id)
    WHERE state IN ('queued', 'scheduled', 'retrying');
DROP INDEX jobs_due;
ALTER INDEX jobs_due_paged RENAME TO jobs_due;

CREATE INDEX jobs_scheduled_paged ON jobs (run_at, id) WHERE state = 'scheduled';
DROP INDEX jobs_scheduled;
ALTER INDEX jobs_scheduled_paged RENAME TO jobs_scheduled;

CREATE INDEX jobs_lease_paged ON jobs (lease_until, id) WHERE state = 'running';
DROP INDEX jobs_lease;
ALTER INDEX jobs_lease_paged RENAME TO jobs_lease;
