-- toolfleet's PostgreSQL schema, version 7: claims of the commit log keep
-- their keep_until while pending, and a command's claim left pending past
-- its lease (its dispatcher stopped mid-commit) is never taken over: its
-- token answers that the outcome is unknown until keep_until, when the
-- token has expired. Such claims are pruned then, as settled outcomes are.
--
-- Applied by `toolfleet migrate`; a process of version 6 keeps running (the
-- index changes no column, and its claims leave keep_until unset, which is
-- never pruned), and a process of this version refuses a schema still at
-- version 6. Building the index reads the whole `commits` table and holds
-- writes to it until it is built.

-- Pruning of abandoned claims past keep_until ("state = 'pending' AND
-- keep_until < $1", a bounded batch per claim): only pending rows are in
-- it, the few commits in flight and those abandoned.
CREATE INDEX commits_pending_expiry ON commits (keep_until) WHERE state = 'pending';
