-- toolfleet's SQLite schema, version 4: finding the settled jobs whose
-- webhook was never sent (the process stopped between settling a job and
-- sending its notice), so that it is sent when the process runs again.

-- unnotified_jobs: a range of settled jobs with a callback, in the order the
-- query reads them (updated_at, id); partial, so jobs without a callback
-- are never in it.
CREATE INDEX jobs_callbacks ON jobs (updated_at, id)
    WHERE callback_url IS NOT NULL AND state IN ('succeeded', 'failed', 'cancelled');
