--[[
settle: charge a reservation its actual cost, exactly once per bucket and nonce
(crates/lease/src/ops/reservation.rs).

KEYS[3i-2]  state key of bucket i;  KEYS[3i-1]  its reservations hash;  KEYS[3i]  their ends
ARGV[1 + 5(i-1) ...]  per bucket: algorithm code, p1, p2, nonce, actual units
Reply    per bucket: {code, refunded, charged}: code 1 settled while live, 2 settled after the
         reservation's TTL, 3 already settled, 4 unknown

Invariants:
  - a record is settled once: it becomes `s` (kept until its end) on the first settle;
  - less than the estimate, while the reservation lives, gives the difference back as a lease
    return does (never above capacity; windows only into the reservation's own window; the
    log shrinks the reservation's own entry), and says what the bucket kept of it;
  - more than the estimate charges the excess whole (a token bucket, GCRA key or leaky
    bucket into debt as deep as it takes, no floor; windows into the reservation's window if
    it still counts), live or expired;
  - an expired reservation refunds nothing: its estimate stands;
  - an unknown or settled nonce, or a record of another algorithm (the rule changed it),
    changes no bucket.
]]

local now = now_us()
local reply = {}
for i = 1, #ARGV / 5 do
  local skey, rkey, ekey = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local a = 1 + (i - 1) * 5
  local alg, p1, p2 = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local nonce, actual = ARGV[a + 3], tonumber(ARGV[a + 4])
  prune_reservations(rkey, ekey, now)
  local rec = redis.call('HGET', rkey, nonce)
  if not rec then
    reply[i] = {4, 0, 0}
  elseif rec == 's' then
    reply[i] = {3, 0, 0}
  else
    local units, at, ralg, expires, entry =
      string.match(rec, '^o|(%d+)|(%d+)|(%d+)|(%d+)|(.*)$')
    units, at, ralg, expires = tonumber(units), tonumber(at), tonumber(ralg), tonumber(expires)
    local live = now < expires
    local refunded, charged = 0, 0
    if ralg == alg then
      local b = load(alg, skey, p1, p2, now)
      if actual < units and live then
        local back = units - actual
        if alg == LOG then
          local member = entry .. ':' .. int(units)
          local score = redis.call('ZSCORE', b.key, member)
          if score then
            refunded = back
            redis.call('ZREM', b.key, member)
            if units > back then
              redis.call('ZADD', b.key, score, entry .. ':' .. int(units - back))
            end
          end
        else
          local ws = 0
          if alg == FW or alg == SW then ws = window_start(at, p2) end
          refunded = credit_kept(b, back, ws)
        end
      elseif actual > units then
        charged = debit_bucket(b, actual - units, math.min(at, now), now, true)
      end
      if refunded > 0 or charged > 0 then store(b, now) end
    end
    redis.call('HSET', rkey, nonce, 's')
    keep_reservations(rkey, ekey, now)
    if live then
      reply[i] = {1, refunded, charged}
    else
      reply[i] = {2, 0, charged}
    end
  end
end
return reply
