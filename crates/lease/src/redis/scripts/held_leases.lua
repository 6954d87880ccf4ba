--[[
held_leases: the live leases on one bucket, for support (`GET /admin/v1/counters`).

KEYS[1]  the bucket's lease table (`<key>:leases`)
ARGV     none
Reply    {live leases, the units they were granted}

Invariants: reads only; an expired lease counts for nothing (it can no longer be spent or
returned); a lease id says its units second (`<id>:<units>:...`).
]]

local now = now_us()
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. int(now), '+inf')
local units = 0
for _, lease in ipairs(live) do
  local u = string.match(lease, '^[^:]+:(%d+)')
  if u then
    units = units + tonumber(u)
  end
end
return {#live, units}
