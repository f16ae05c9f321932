-- toolfleet's PostgreSQL schema, version 15: rate limits that hold across a
-- fleet. One row per tenant and rate-limited tool: `tat`, the theoretical
-- arrival time of the generic cell rate algorithm (Unix microseconds),
-- moved forward by each call let through (Store::take_token). A row lost
-- costs a burst, never a call: it is written without waiting for the disk.

CREATE TABLE rate_limits (
    key text PRIMARY KEY,
    tat bigint NOT NULL
);
