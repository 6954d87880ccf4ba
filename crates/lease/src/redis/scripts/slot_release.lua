--[[
slot_release: release concurrency slots.

KEYS[i]  slot table of bucket i (`<key>:slots`)
ARGV[i]  slot id to release
Reply    per slot: 1 if it was held, 0 if it was already released or had expired

Invariants: idempotent (a second release finds nothing); expired slots are pruned first, so
releasing an expired slot reports 0.
]]

local now = now_us()
local reply = {}
for i = 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', int(now))
  reply[i] = redis.call('ZREM', KEYS[i], ARGV[i])
end
return reply
