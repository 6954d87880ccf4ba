--[[
lease_return: give back the unspent units of named leases.

KEYS[2i-1]  state key of bucket i;  KEYS[2i]  its lease table
ARGV[1 + 5(i-1) ...]  per return: algorithm code, p1, p2, lease id, unspent units
Reply       per return: units credited

Invariants:
  - a lease is returned at most once: its record is removed on the first return;
  - an unknown (forged), already returned or expired lease credits nothing;
  - the credit is at most the units the lease granted, and never raises a token bucket above
    its capacity;
  - window algorithms credit only the window the lease was taken in (a late return never
    lands in a newer window), and never below zero.
]]

local now = now_us()
local reply = {}
for i = 1, #KEYS / 2 do
  local key, lease_key = KEYS[2 * i - 1], KEYS[2 * i]
  local a = 1 + (i - 1) * 5
  local alg = tonumber(ARGV[a])
  local lease, unspent = ARGV[a + 3], tonumber(ARGV[a + 4])
  local credited = 0
  local expiry = redis.call('ZSCORE', lease_key, lease)
  if expiry then
    redis.call('ZREM', lease_key, lease)
    local id, units, ws, lalg = string.match(lease, '^([^:]+):(%d+):(%d+):(%d+):[^:]+$')
    if id and tonumber(expiry) > now and tonumber(lalg) == alg then
      units, ws = tonumber(units), tonumber(ws)
      local credit = math.min(unspent, units)
      local b = load(alg, key, tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), now)
      if alg == TB then
        b.tokens = math.min(b.p1, b.tokens + credit)
        credited = credit
      elseif alg == FW and b.ws == ws then
        credited = math.min(credit, b.count)
        b.count = b.count - credited
      elseif alg == SW and b.ws == ws then
        credited = math.min(credit, b.cur)
        b.cur = b.cur - credited
      elseif alg == LOG then
        local entry = id .. ':' .. int(units)
        local score = redis.call('ZSCORE', b.key, entry)
        if score then
          credited = credit
          redis.call('ZREM', b.key, entry)
          if units > credit then
            redis.call('ZADD', b.key, score, id .. ':' .. int(units - credit))
          end
        end
      end
      if credited > 0 then store(b, now) end
    end
  end
  reply[i] = credited
end
return reply
