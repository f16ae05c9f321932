-- toolfleet's PostgreSQL schema, version 3: trace context, the same columns
-- as SQLite's. A job carries the W3C trace context of the dispatcher's span
-- that enqueued it, so the worker that runs it, on whichever host and after
-- however many retries, continues the caller's trace. Both columns are new,
-- nullable and without a default, so adding them rewrites no row and holds
-- the table's lock only for a moment; jobs written before read as NULL and
-- start a trace of their own when they run.
--
-- Applied by `toolfleet migrate`; a process of version 2 keeps running (it
-- names its columns, never `*`), and a process of this version refuses a
-- schema still at version 2.

-- The `traceparent` header of the enqueuing span
-- (`00-<trace id>-<span id>-<flags>`), written once, with the job. The
-- sweeper republishes a job with it, so a message that was lost and sent
-- again still names the same trace.
ALTER TABLE jobs ADD COLUMN traceparent text;

-- The `tracestate` header that came with it (vendors' opaque list, at most
-- 512 characters), NULL when the call sent none.
ALTER TABLE jobs ADD COLUMN tracestate text;
