-- toolfleet's PostgreSQL schema, version 23: handles kept in the store, so
-- that every dispatcher of a fleet reads them and they outlive a restart.
-- One row per handle: the redacted result's JSON text, its size, who made
-- it and when it expires (Unix milliseconds). A tenant keeps at most so
-- many handles and bytes; its oldest go first (Store::put_handle).

CREATE TABLE handles (
    id         text COLLATE "C" PRIMARY KEY,  -- h_ and a UUIDv7: sorts by time
    tenant     text NOT NULL,
    "user"     text NOT NULL,
    tool       text NOT NULL,
    value      text NOT NULL,
    size_bytes bigint NOT NULL CHECK (size_bytes >= 0),
    created_at bigint NOT NULL,
    expires_at bigint NOT NULL
);

-- list_handles: a user's handles, newest first.
CREATE INDEX handles_owner ON handles (tenant, "user", id DESC);

-- put_handle's bound: a tenant's handles, newest first.
CREATE INDEX handles_tenant ON handles (tenant, id DESC);

-- prune_handles: the expired ones, oldest first.
CREATE INDEX handles_expiry ON handles (expires_at);
