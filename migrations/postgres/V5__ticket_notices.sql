-- toolfleet's PostgreSQL schema, version 5: finding the answered tickets
-- whose webhook no dispatcher sent, as version 4 finds settled jobs'. A
-- ticket's notice is sent when a dispatcher hears its `answered` event; one
-- that every dispatcher missed is found here later, from the store.
--
-- Applied by `toolfleet migrate`; a process of version 4 keeps running (the
-- index changes no column), and a process of this version refuses a schema
-- still at version 4. Building the index reads the whole `tickets` table
-- and holds writes to it until it is built.

-- unnotified_tickets: "callback_url IS NOT NULL AND answer IS NOT NULL AND
-- answered_at >= $2 AND answered_at < $3 ORDER BY answered_at, id LIMIT $4",
-- read off a range of this index in its order; the commit log is then
-- probed by its key for each. Partial on exactly that condition, so open
-- tickets and those without a callback are never in it.
CREATE INDEX tickets_callbacks ON tickets (answered_at, id)
    WHERE callback_url IS NOT NULL AND answer IS NOT NULL;
