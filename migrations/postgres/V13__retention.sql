-- toolfleet's PostgreSQL schema, version 13: retention. Store::prune
-- deletes what settled before a time, oldest first, a bounded batch per
-- statement; each kind is found off an index in that order, so a prune
-- never reads the records it keeps.
--
-- Applied by `toolfleet migrate`; each index reads its whole table and
-- holds writes to it until it is built.

-- Settled jobs by when they settled: "state IN ('succeeded', 'failed',
-- 'cancelled') AND updated_at < $1 ORDER BY updated_at".
CREATE INDEX jobs_settled ON jobs (updated_at)
    WHERE state IN ('succeeded', 'failed', 'cancelled');

-- Closed tickets by when they closed: "COALESCE(answered_at, expired_at) <
-- $1"; open tickets have neither and are never in the range.
CREATE INDEX tickets_closed ON tickets ((COALESCE(answered_at, expired_at)));

-- Audit records by time, across tenants.
CREATE INDEX audit_at ON audit (at_ms);
