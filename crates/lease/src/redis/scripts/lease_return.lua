--[[
lease_return: give back the unspent units of named leases.

KEYS[2i-1]  state key of bucket i;  KEYS[2i]  its lease table; then the allowance and demand
            keys of the returns that have one
ARGV[1 + 9(i-1) ...]  per return: algorithm code, p1, p2, lease id, unspent units, then the
            allowance: KEYS index of the allowance key (0: none), region, interval us,
            unknown share
Reply       per return: units credited

Invariants:
  - a lease is returned at most once: its record is removed on the first return;
  - an unknown (forged), already returned or expired lease credits nothing;
  - the credit is at most the units the lease granted, and never raises a token bucket above
    its capacity;
  - window algorithms credit only the window the lease was taken in (a late return never
    lands in a newer window), and never below zero;
  - a lease taken from an allowance credits the allowance too, when the return names it.
]]

local now = now_us()
local reply = {}

for i = 1, #ARGV / 9 do
  local key, lease_key = KEYS[2 * i - 1], KEYS[2 * i]
  local a = 1 + (i - 1) * 9
  local alg, p1, p2 = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local lease, unspent = ARGV[a + 3], tonumber(ARGV[a + 4])
  local credited = 0
  local expiry = redis.call('ZSCORE', lease_key, lease)
  if expiry then
    redis.call('ZREM', lease_key, lease)
    local id, units, ws, lalg = string.match(lease, '^([^:]+):(%d+):(%d+):(%d+):[^:]+$')
    lalg = tonumber(lalg)
    if id and tonumber(expiry) > now and math.fmod(lalg, 10) == alg then
      units, ws = tonumber(units), tonumber(ws)
      local credit = math.min(unspent, units)
      if lalg > 10 then
        local al = load_allowance(KEYS, ARGV, alg, p1, p2, a + 5, now)
        if al then
          local back = credit_counter(al, credit, ws)
          store_allowance(al, back > 0, now)
        end
      end
      local b = load(alg, key, p1, p2, now)
      if alg == TB or alg == GCRA or alg == LB or alg == FW or alg == SW then
        credited = credit_counter(b, credit, ws)
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
