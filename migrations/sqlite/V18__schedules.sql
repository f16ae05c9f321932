-- toolfleet's SQLite schema, version 18: schedules. One row per
-- `[[schedules]]` name, made the first time the dispatcher sees it: the
-- last tick handled (Unix milliseconds), the job it last started and
-- whether it is paused (Store::advance_schedule moves it on).

CREATE TABLE schedules (
    name TEXT PRIMARY KEY NOT NULL,
    last_tick INTEGER NOT NULL,
    last_job TEXT,
    paused INTEGER NOT NULL DEFAULT 0,
    updated_at INTEGER NOT NULL
) STRICT;
