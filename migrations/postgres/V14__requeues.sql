-- toolfleet's PostgreSQL schema, version 14: a failed or cancelled job may
-- be put back (`requeue`, POST /v1/jobs/{id}/retry). `requeues` counts how
-- often, so that the notices of each life of the job are its own (a webhook
-- key names it once it is past 0). Jobs written before have 0.

ALTER TABLE jobs ADD COLUMN requeues bigint NOT NULL DEFAULT 0 CHECK (requeues >= 0);
