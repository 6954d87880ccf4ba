-- The penalty box (docs/penalty-box.md): a rule may block an identity for `block` after
-- `after` denials within `within`. NULL: the rule has none. Written as the rule document's
-- `penalty` field: {"after": 10, "within": "1m", "block": "15m"}.
ALTER TABLE rate_limit_rules ADD COLUMN penalty_json JSONB;
