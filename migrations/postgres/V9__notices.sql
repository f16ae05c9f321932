-- toolfleet's PostgreSQL schema, version 9: the webhook notices a fleet has
-- sent (or is sending) have a table of their own instead of sharing the
-- commit log of confirm tokens. A notice is claimed by the first
-- dispatcher to hear its event (`sending`, until lease_until: one that
-- stopped meanwhile is taken over) and then recorded as `sent`, delivered
-- or given up, until keep_until, so neither a redelivered event nor a
-- search of the store sends it again in that time. The notices the commit
-- log held move here.
--
-- Applied by `toolfleet migrate` with every process of version 8 stopped:
-- such a process would record notices in the commit log again, where this
-- version no longer looks. Moving them reads the commit log once.

CREATE TABLE notices (
    key         text PRIMARY KEY,  -- webhook:<kind>:<id>:<state>
    state       text NOT NULL CHECK (state IN ('sending', 'sent')),
    delivered   boolean,           -- set once sent
    lease_until bigint,
    keep_until  bigint NOT NULL,
    CHECK ((state = 'sent') = (delivered IS NOT NULL))
);

-- Pruning of notices past keep_until, a bounded batch per claim.
CREATE INDEX notices_expiry ON notices (keep_until);

INSERT INTO notices (key, state, delivered, lease_until, keep_until)
SELECT key,
    CASE state WHEN 'settled' THEN 'sent' ELSE 'sending' END,
    CASE state WHEN 'settled'
        THEN COALESCE((envelope::jsonb #>> '{result,delivered}')::boolean, false) END,
    lease_until,
    COALESCE(keep_until, lease_until, 0)
FROM commits WHERE key LIKE 'webhook:%';

DELETE FROM commits WHERE key LIKE 'webhook:%';
