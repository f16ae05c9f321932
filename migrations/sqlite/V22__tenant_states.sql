-- toolfleet's SQLite schema, version 22: a tenant's jobs by state, newest
-- first, for the job list filtered by state (the console's failed jobs, a
-- tenant of 100,000 jobs with a hundred failed) and the counts by state,
-- which otherwise walk every job of the tenant.

CREATE INDEX jobs_tenant_state ON jobs (tenant, state, id DESC);
