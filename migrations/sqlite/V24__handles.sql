-- toolfleet's SQLite schema, version 24: handles kept in the store, so that
-- every process of a fleet reads them and they outlive a restart. One row
-- per handle: the redacted result's JSON text, its size, who made it and
-- when it expires (Unix milliseconds). A tenant keeps at most so many
-- handles and bytes; its oldest go first (Store::put_handle).

CREATE TABLE handles (
    id         TEXT PRIMARY KEY NOT NULL,  -- h_ and a UUIDv7: sorts by time
    tenant     TEXT NOT NULL,
    user       TEXT NOT NULL,
    tool       TEXT NOT NULL,
    value      TEXT NOT NULL,
    size_bytes INTEGER NOT NULL CHECK (size_bytes >= 0),
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
) STRICT;

-- list_handles: a user's handles, newest first.
CREATE INDEX handles_owner ON handles (tenant, user, id DESC);

-- put_handle's bound: a tenant's handles, newest first.
CREATE INDEX handles_tenant ON handles (tenant, id DESC);

-- prune_handles: the expired ones, oldest first.
CREATE INDEX handles_expiry ON handles (expires_at);
