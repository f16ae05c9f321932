-- toolfleet's PostgreSQL schema, version 25: a job's owner apart from its
-- row. Every change of a job's state writes a new version of its row, and
-- each version enters every index of `jobs` whose columns or condition it
-- matches: with `jobs_tenant` and `jobs_owner` on `jobs`, a job that ran
-- and succeeded entered them three times each, though its tenant, user and
-- id never change. `job_owners` holds them once, in a row written when the
-- job is inserted and deleted with it, never updated; the tenant's and the
-- user's job lists walk its indexes, newest first, and join each job by
-- its id. A job's claim and settlement now enter only the primary key and
-- the partial index of the state they move it to.
--
-- Statement triggers keep the two tables together, whatever inserts or
-- deletes jobs (one statement per batch, not per row): a process of
-- version 24 keeps running, and its jobs are listed as this version's are.
-- Applied by `toolfleet migrate`; copying the owners reads the whole
-- `jobs` table once.

CREATE TABLE job_owners (
    id       text COLLATE "C" NOT NULL,
    tenant   text NOT NULL,
    "user"   text NOT NULL
);

INSERT INTO job_owners (id, tenant, "user") SELECT id, tenant, "user" FROM jobs;

-- The tenant's job list, newest first, paged by "id < cursor"; and the
-- way to a job's owner row by its tenant and id, when the job goes.
CREATE INDEX job_owners_tenant ON job_owners (tenant, id DESC);
-- A user's own job list, newest first: never over the tenant's other
-- users' jobs.
CREATE INDEX job_owners_user ON job_owners (tenant, "user", id DESC);

DROP INDEX jobs_tenant;
DROP INDEX jobs_owner;

-- `SET search_path FROM CURRENT`: the functions name the tables of the
-- schema they were made in, whatever the session's path.
CREATE FUNCTION job_owners_born() RETURNS trigger LANGUAGE plpgsql
    SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO job_owners (id, tenant, "user") SELECT id, tenant, "user" FROM born;
    RETURN NULL;
END $$;

CREATE FUNCTION job_owners_gone() RETURNS trigger LANGUAGE plpgsql
    SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM job_owners o USING gone WHERE o.tenant = gone.tenant AND o.id = gone.id;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_owners_born AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS born FOR EACH STATEMENT EXECUTE FUNCTION job_owners_born();
CREATE TRIGGER jobs_owners_gone AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION job_owners_gone();
