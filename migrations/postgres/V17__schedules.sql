-- toolfleet's PostgreSQL schema, version 17: schedules. One row per
-- `[[schedules]]` name, made the first time a dispatcher sees it: the last
-- tick handled (Unix milliseconds), the job it last started and whether it
-- is paused. Dispatchers move `last_tick` on by compare-and-set
-- (Store::advance_schedule), so one of them handles each tick; the job a
-- tick starts is keyed by the schedule and the tick, so a tick started
-- twice still makes one job.

CREATE TABLE schedules (
    name text PRIMARY KEY,
    last_tick bigint NOT NULL,
    last_job text,
    paused boolean NOT NULL DEFAULT false,
    updated_at bigint NOT NULL
);
