-- toolfleet's PostgreSQL schema, version 22: each attempt of a job, for
-- the console's job page. `started_at` is when the running attempt was
-- claimed (every claim sets it, in the statement it already runs);
-- `attempts_log` is a JSON array of the attempts that failed (their
-- number, start, end and error), appended to by the statement that records
-- the failure. A job that succeeds at its first attempt never writes it.

ALTER TABLE jobs ADD COLUMN started_at bigint;
ALTER TABLE jobs ADD COLUMN attempts_log text;
