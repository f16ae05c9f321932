-- toolfleet's SQLite schema, version 2: sub-agents. Agent tools run as jobs,
-- and the tools an agent calls may be agents in turn; these columns carry
-- what a job needs to know of that tree, and what an agent loop needs to
-- resume where it stopped. Every column is new and NULL for the jobs and
-- records written before, which need none of it.

-- The Lineage of the call that made the job (JSON: parent_run_id, depth and
-- the budget left), NULL for a call a client made directly. Written once,
-- with the job; the worker hands it to the executor, so an agent called by
-- an agent knows its depth and its ceiling on whichever worker it runs.
ALTER TABLE jobs ADD COLUMN lineage TEXT;

-- The scopes of the principal whose call made the job (JSON array of
-- strings), NULL for none. The worker runs the job as that principal, so
-- what the job calls (an agent's tools) is authorised as its caller would be.
ALTER TABLE jobs ADD COLUMN scopes TEXT;

-- An agent loop's saved state (JSON, the loop's own shape), NULL until its
-- first completed step. Written only by the attempt that holds the job
-- ("state = 'running' AND attempts = ?"), so a worker that lost the job
-- cannot overwrite the new holder's; kept across claims and retries, so a
-- restarted loop resumes from its last completed step. Never shown to
-- clients.
ALTER TABLE jobs ADD COLUMN checkpoint TEXT;

-- The run id of the agent whose step this call was, beside the call's own
-- run_id (the sub-agent's); NULL for a call no agent made.
ALTER TABLE audit ADD COLUMN parent_run_id TEXT;

-- The ticket a parked job waits for: an agent whose tool asked a person
-- gives its worker back ("retrying", never due, no lease) until the ticket
-- is answered. NULL for every job not parked.
ALTER TABLE jobs ADD COLUMN waiting_on TEXT;

-- wake: "waiting_on = ?" when a ticket is answered. Partial: only parked
-- jobs are in it, so it stays as small as the number of open questions.
CREATE INDEX jobs_waiting ON jobs (waiting_on) WHERE waiting_on IS NOT NULL;
