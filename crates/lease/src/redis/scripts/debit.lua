--[[
debit: subtract units consumed elsewhere (by the peer region).

KEYS[2i-1]  state key of bucket i;  KEYS[2i]  its debit-once records (`<key>:remote`)
ARGV[1 + 7(i-1) ...]  per bucket: algorithm code, p1, p2, units, consumed_at_us ('' = now),
                      origin ('' = a plain debit), until_us (debit-once: the epoch's end)
Reply    per bucket: units applied

Invariants:
  - a token bucket may go below zero (a debt that refill repays), floored at -capacity;
  - window algorithms count the units in the window they were consumed in: the current one,
    the previous one (sliding window), or nowhere if that window no longer counts. A time in
    the future is taken as now;
  - debit-once (origin given): `units` is the origin's running total for the epoch ending at
    until_us; the records hash keeps the largest total applied per `origin|until` and only the
    excess is debited, so totals apply as a max (duplicates and reorderings change nothing).
    Nothing is applied from until_us on. Mirrors crates/lease/src/algorithm/once_marks.rs.
]]

-- The units a debit-once adds beyond what was recorded (0 if none), recording the new total.
local function once_excess(rkey, origin, until_us, total, now)
  if until_us <= now then return 0 end
  local field = origin .. '|' .. int(until_us)
  local seen = redis.call('HGET', rkey, field)
  local excess = total - (tonumber(seen) or 0)
  if excess <= 0 then return 0 end
  local last = until_us
  if not seen then
    -- A new epoch: forget the ones that have ended.
    local all = redis.call('HKEYS', rkey)
    for _, f in ipairs(all) do
      local u = tonumber(string.match(f, '|(%d+)$'))
      if u == nil or u <= now then
        redis.call('HDEL', rkey, f)
      elseif u > last then
        last = u
      end
    end
  else
    for _, f in ipairs(redis.call('HKEYS', rkey)) do
      local u = tonumber(string.match(f, '|(%d+)$'))
      if u ~= nil and u > last then last = u end
    end
  end
  redis.call('HSET', rkey, field, int(total))
  redis.call('PEXPIRE', rkey, ttl_ms(last - now))
  return excess
end

local now = now_us()
local reply = {}
for i = 1, #KEYS / 2 do
  local a = 1 + (i - 1) * 7
  local alg = tonumber(ARGV[a])
  local units = tonumber(ARGV[a + 3])
  if ARGV[a + 5] ~= '' then
    units = once_excess(KEYS[2 * i], ARGV[a + 5], tonumber(ARGV[a + 6]), units, now)
  end
  local applied = 0
  if units > 0 then
    local at = now
    if ARGV[a + 4] ~= '' then at = math.min(tonumber(ARGV[a + 4]), now) end
    local b = load(alg, KEYS[2 * i - 1], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), now)
    applied = debit_bucket(b, units, at, now)
    if applied > 0 then store(b, now) end
  end
  reply[i] = applied
end
return reply
