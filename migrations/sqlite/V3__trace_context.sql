-- toolfleet's SQLite schema, version 3: trace context. A job carries the W3C
-- trace context of the dispatcher's span that enqueued it, so the worker
-- that runs it, after however many retries and restarts, continues the
-- caller's trace. Both columns are new and NULL for the jobs written before,
-- which start a trace of their own when they run.

-- The `traceparent` header of the enqueuing span
-- (`00-<trace id>-<span id>-<flags>`), written once, with the job.
ALTER TABLE jobs ADD COLUMN traceparent TEXT;

-- The `tracestate` header that came with it, NULL when the call sent none.
ALTER TABLE jobs ADD COLUMN tracestate TEXT;
