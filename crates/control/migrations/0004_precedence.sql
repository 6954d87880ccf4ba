-- Rules that say what they mean (docs/rules-precedence.md).
-- replaces_json: the ids of the rules a rule replaces for the requests it matches, as a JSON
-- list (["api-key-default"]); NULL: none. Every write and delete checks the whole set first:
-- each rule named exists in the domain, and no rules replace each other in a circle.
-- without_json: keys that must be in none of a request's descriptors (["api_key"]); NULL: none.
ALTER TABLE rate_limit_rules ADD COLUMN replaces_json JSONB, ADD COLUMN without_json JSONB;
