--[[
slot_renew: renew concurrency slots held by requests still running.

KEYS[i]        slot table of bucket i (`<key>:slots`)
ARGV[2i-1]     slot id to renew
ARGV[2i]       the slot's TTL from now, microseconds (its limit's slot TTL)
Reply          per slot: 1 if it was held (and now lives its TTL from now), 0 if it had been
               released or had expired

Invariants: a released or expired slot is not brought back (ZADD XX, after expired slots are
pruned); the table's key lives as long as its last slot (plus the margin); renewing adds no
slot, so it runs when Redis is at its maxmemory (flags=allow-oom).
]]

local now = now_us()
local reply = {}
for i = 1, #KEYS do
  local slot, ttl = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', int(now))
  if redis.call('ZSCORE', KEYS[i], slot) then
    redis.call('ZADD', KEYS[i], 'XX', int(now + ttl), slot)
    store_leases(KEYS[i], now)
    reply[i] = 1
  else
    reply[i] = 0
  end
end
return reply
