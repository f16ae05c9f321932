-- toolfleet's SQLite schema, version 5: finding the answered tickets whose
-- webhook was never sent (the process stopped between the answer and its
-- notice), so that it is sent when the process runs again.

-- unnotified_tickets: a range of answered tickets with a callback, in the
-- order the query reads them (answered_at, id); partial, so open tickets
-- and those without a callback are never in it.
CREATE INDEX tickets_callbacks ON tickets (answered_at, id)
    WHERE callback_url IS NOT NULL AND answer IS NOT NULL;
