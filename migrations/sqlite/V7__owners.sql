-- toolfleet's SQLite schema, version 7: jobs and tickets belong to the user
-- who made them, inside their tenant.

-- Who may answer a ticket beside its caller's own user and the tenant's
-- operators: a scope its tool declared (`answered_by = { scope = "..." }`);
-- NULL for the caller alone, as every ticket made before this version.
ALTER TABLE tickets ADD COLUMN answered_by TEXT;

-- A user's own job list, newest first, paged by "id < cursor": a walk down
-- this index, never over the tenant's other users' jobs.
CREATE INDEX jobs_owner ON jobs (tenant, user, id DESC);
