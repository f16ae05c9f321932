-- toolfleet's SQLite schema, version 22: a tenant's failed and cancelled
-- jobs, newest first, for the job list filtered by those states (the
-- console's failed jobs: a hundred among a tenant's 100,000 jobs), which
-- otherwise walks every job of the tenant. Partial: the jobs that run and
-- succeed never enter it, so the path of every job pays nothing for it.

CREATE INDEX jobs_tenant_state ON jobs (tenant, state, id DESC)
    WHERE state IN ('failed', 'cancelled');
