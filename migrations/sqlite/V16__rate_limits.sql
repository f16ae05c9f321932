-- toolfleet's SQLite schema, version 16: rate limits kept in the store.
-- One row per tenant and rate-limited tool: `tat`, the theoretical arrival
-- time of the generic cell rate algorithm (Unix microseconds), moved
-- forward by each call let through (Store::take_token).

CREATE TABLE rate_limits (
    key TEXT PRIMARY KEY NOT NULL,
    tat INTEGER NOT NULL
) STRICT;
