-- Mode overrides: the kill switch for any rule, from a file or stored here. One row per rule
-- id (a Tollgate rule's id, or an envoyproxy/ratelimit descriptor's path); every node sets
-- that rule's mode to this one while the row exists. Writes append to the rule's history
-- (change 'overridden' or 'override-lifted') and bump the revision like any rule write.
CREATE TABLE rule_mode_overrides (
    rule_id     VARCHAR(512) PRIMARY KEY,
    mode        VARCHAR(16)  NOT NULL,                -- ENFORCE, SHADOW, DISABLED
    reason      TEXT,
    version     BIGINT       NOT NULL,
    updated_at  TIMESTAMPTZ  NOT NULL DEFAULT now(),
    updated_by  TEXT         NOT NULL
);

-- An envoyproxy/ratelimit path can be longer than a Tollgate rule id.
ALTER TABLE rate_limit_rule_history ALTER COLUMN rule_id TYPE VARCHAR(512);
