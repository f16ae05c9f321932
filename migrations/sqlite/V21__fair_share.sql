-- toolfleet's SQLite schema, version 21: fair share. A job of a pool in
-- `fair_share` takes its tenant's next turn (`fair_rank`): one past the
-- tenant's last turn in the pool, and never before the pool's clock, the
-- turn of the job claimed last (fair_turns, fair_clocks). Store::claim_next
-- takes the lowest turn within the highest priority. Jobs of other pools
-- keep turn 0.

ALTER TABLE jobs ADD COLUMN fair_rank INTEGER NOT NULL DEFAULT 0;

DROP INDEX jobs_ordered;
CREATE INDEX jobs_ordered ON jobs (pool, priority DESC, fair_rank, run_at, id)
    WHERE priority IS NOT NULL AND state IN ('queued', 'scheduled', 'retrying', 'running');

CREATE TABLE fair_turns (
    pool TEXT NOT NULL,
    tenant TEXT NOT NULL,
    rank INTEGER NOT NULL,
    PRIMARY KEY (pool, tenant)
) STRICT;

CREATE TABLE fair_clocks (
    pool TEXT PRIMARY KEY NOT NULL,
    rank INTEGER NOT NULL
) STRICT;
