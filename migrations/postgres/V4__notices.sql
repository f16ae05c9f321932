-- toolfleet's PostgreSQL schema, version 4: finding the settled jobs whose
-- webhook no dispatcher sent. A webhook is sent when a dispatcher hears the
-- job's settled event; one that every dispatcher missed (all were down or
-- reconnecting) is found here later, from the store, and sent then.
--
-- Applied by `toolfleet migrate`; a process of version 3 keeps running (the
-- index changes no column), and a process of this version refuses a schema
-- still at version 3. Building the index reads the whole table and holds
-- writes to `jobs` until it is built: on a large table, migrate at a quiet
-- time.

-- unnotified_jobs: "callback_url IS NOT NULL AND state IN (settled) AND
-- updated_at >= $2 AND updated_at < $3 ORDER BY updated_at, id LIMIT $4",
-- read off a range of this index in its order; the commit log is then
-- probed by its key for each. Partial on exactly that condition, so it
-- holds only settled jobs that named a callback: jobs without one, the bulk
-- of most fleets, are never in it.
CREATE INDEX jobs_callbacks ON jobs (updated_at, id)
    WHERE callback_url IS NOT NULL AND state IN ('succeeded', 'failed', 'cancelled');
