-- toolfleet's SQLite schema, version 8: claims of the commit log keep their
-- keep_until while pending, and a command's claim left pending past its
-- lease (its process stopped mid-commit) is never taken over: its token
-- answers that the outcome is unknown until keep_until, when the token has
-- expired. Such claims are pruned then, as settled outcomes are.

-- Pruning of abandoned claims past keep_until ("state = 'pending' AND
-- keep_until < ?1", a bounded batch per claim): only pending rows are in it.
CREATE INDEX commits_pending_expiry ON commits (keep_until) WHERE state = 'pending';
