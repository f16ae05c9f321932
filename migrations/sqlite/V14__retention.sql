-- toolfleet's SQLite schema, version 14: retention. Store::prune deletes
-- what settled before a time, oldest first, a bounded batch per statement;
-- each kind is found off an index in that order, so a prune never reads the
-- records it keeps. The queries name these indexes (INDEXED BY) and repeat
-- their predicate and expression as they are here.

-- Settled jobs by when they settled.
CREATE INDEX jobs_settled ON jobs (updated_at)
    WHERE state IN ('succeeded', 'failed', 'cancelled');

-- Closed tickets by when they closed; open tickets have neither time.
CREATE INDEX tickets_closed ON tickets (COALESCE(answered_at, expired_at));

-- Audit records by time, across tenants.
CREATE INDEX audit_at ON audit (at_ms);
