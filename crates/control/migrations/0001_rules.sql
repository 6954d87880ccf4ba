-- Rules, after the seed's rate_limit_rules table, with the rule's full document split into
-- columns an operator can query. Every write bumps the rule's version and the rule set's
-- revision, appends to the history, and notifies listening nodes, in one transaction.

CREATE TABLE rate_limit_rules (
    id                VARCHAR(64)  PRIMARY KEY,
    domain            VARCHAR(64)  NOT NULL,
    name              VARCHAR(128),
    match_json        JSONB        NOT NULL,          -- {"plan":"gold","route":"POST /orders"}
    per_json          JSONB,                          -- ["api_key"]; NULL: the default identity
    algorithm         VARCHAR(32)  NOT NULL,          -- TOKEN_BUCKET, SLIDING_WINDOW, ...
    parameters        JSONB        NOT NULL,          -- {"capacity":100,"refillPerSecond":10}
    mode              VARCHAR(16)  NOT NULL,          -- ENFORCE, SHADOW, DISABLED
    fail_mode         VARCHAR(16)  NOT NULL,          -- OPEN, CLOSED, LOCAL
    regional_policy   JSONB,                          -- region sync (NULL: the default, SPLIT)
    version           BIGINT       NOT NULL,
    updated_at        TIMESTAMPTZ  NOT NULL DEFAULT now(),
    updated_by        TEXT         NOT NULL
);

CREATE INDEX rate_limit_rules_domain_mode ON rate_limit_rules (domain, mode);

-- Append-only: who changed what, when, and the rule before and after.
CREATE TABLE rate_limit_rule_history (
    seq         BIGSERIAL    PRIMARY KEY,
    rule_id     VARCHAR(64)  NOT NULL,
    change      VARCHAR(16)  NOT NULL,                -- created, updated, deleted
    version     BIGINT       NOT NULL,                -- the rule's version after the change
    revision    BIGINT       NOT NULL,                -- the rule set's revision after it
    changed_by  TEXT         NOT NULL,
    changed_at  TIMESTAMPTZ  NOT NULL DEFAULT now(),
    old_rule    JSONB,
    new_rule    JSONB
);

CREATE INDEX rate_limit_rule_history_rule ON rate_limit_rule_history (rule_id, seq);

CREATE RULE rate_limit_rule_history_no_update AS ON UPDATE TO rate_limit_rule_history DO INSTEAD NOTHING;
CREATE RULE rate_limit_rule_history_no_delete AS ON DELETE TO rate_limit_rule_history DO INSTEAD NOTHING;

-- envoyproxy/ratelimit configurations, one document per domain (imported from YAML files).
CREATE TABLE envoy_ratelimit_domains (
    domain      VARCHAR(64)  PRIMARY KEY,
    config      JSONB        NOT NULL,
    version     BIGINT       NOT NULL,
    updated_at  TIMESTAMPTZ  NOT NULL DEFAULT now(),
    updated_by  TEXT         NOT NULL
);

-- The rule set's revision: one row, bumped by every change; nodes compare it to theirs.
CREATE TABLE rule_set_revision (
    singleton  BOOLEAN  PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    revision   BIGINT   NOT NULL
);

INSERT INTO rule_set_revision (revision) VALUES (0);
