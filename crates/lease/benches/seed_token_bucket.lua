--[[
The seed design's per-request token bucket script, verbatim: the baseline every Tollgate
benchmark is measured against (one EVALSHA per check, one rule).

KEYS[1]  bucket key
ARGV     capacity, refill per second, cost
Reply    {allowed, floor(tokens), retry_ms}
Invariants: as in the seed (time from Redis TIME, state in a hash, PEXPIRE on every call).
]]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)   -- ms
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2]) / 1000                                   -- token/ms
local cost = tonumber(ARGV[3])

local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or capacity
local ts = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - ts) * rate)

local allowed, retry_ms = 0, 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  retry_ms = math.ceil((cost - tokens) / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity / rate) + 1000)
return {allowed, math.floor(tokens), retry_ms}
