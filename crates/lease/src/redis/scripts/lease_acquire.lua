--[[
lease_acquire: take a batch of units from each bucket of one identity, independently.

KEYS[2i-1]  state key of bucket i;  KEYS[2i]  its lease table (`<key>:leases`); then the
            allowance and demand keys of the asks that have one
ARGV[1]     nonce that makes lease ids unguessable
ARGV[2]     lease TTL, microseconds
ARGV[3 + 11(i-1) ...]  per bucket: algorithm code, p1, p2, want, min, max_share, then its
            allowance: KEYS index of the allowance key (0: none), region, interval us,
            unknown share; then the KEYS index of its penalty record (0: no penalty)
Reply       per bucket: {units, lease id or '', valid_for_us, remaining, retry_after_us, reset_after_us,
            live leases (this one included), blocked_for_us (0: not blocked)}

Grant: min(want, max(min, floor(available * max_share))), or 0 when fewer than `min` units
are available (then retry_after is the time until `min` are). With an allowance, available is
the smaller of the bucket's and the allowance's, and the grant is taken from both.

Invariants:
  - an identity in its rule's penalty box is granted nothing (retry_after: the block's time
    left), and nothing is consumed;
  - granted units are consumed at once, exactly as a check of that cost would consume them;
  - a lease never outlives its window: fixed and sliding windows cap it at the window's end,
    the log at one window;
  - the lease id records the units, the window and the algorithm (plus 10 when taken from an
    allowance), so a return can credit at most what was granted, only into the same window
    and the same algorithm.
]]

local now = now_us()
local nonce = ARGV[1]
local ttl = tonumber(ARGV[2])
local n = (#ARGV - 2) / 11
local reply = {}
for i = 1, n do
  local key, lease_key = KEYS[2 * i - 1], KEYS[2 * i]
  local a = 3 + (i - 1) * 11
  local alg, p1, p2 = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local want, min, share = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  redis.call('ZREMRANGEBYSCORE', lease_key, '-inf', int(now))
  local b = load(alg, key, p1, p2, now)
  local al = load_allowance(KEYS, ARGV, alg, p1, p2, a + 6, now)
  local view_avail = available(b, now)
  local avail = view_avail
  if al then avail = math.min(avail, available(al, now)) end

  local blocked = blocked_for(KEYS, tonumber(ARGV[a + 10]), now)
  local grant = 0
  if avail >= min and blocked == 0 then
    grant = math.floor(avail * share)
    if grant < min then grant = min end
    if want < grant then grant = want end
  end

  if grant == 0 then
    local retry = 0
    if view_avail < min then retry = retry_after(b, min, now) end
    local reset = reset_after(b, now)
    if al then
      if available(al, now) < min then retry = math.max(retry, retry_after(al, min, now)) end
      reset = math.max(reset, reset_after(al, now))
      store_allowance(al, false, now)
    end
    if blocked > 0 then retry = math.max(retry, blocked) end
    reply[i] = {0, '', 0, avail, retry, reset, redis.call('ZCARD', lease_key), blocked}
  else
    local entry = consume(b, grant, now, '')
    local valid, ws = ttl, 0
    if alg == FW or alg == SW then
      valid, ws = math.min(ttl, pos(b.ws + b.p2 - now)), b.ws
    elseif alg == LOG then
      valid, ws = math.min(ttl, b.p2), now
    end
    local code = alg
    local remaining, reset = available(b, now), reset_after(b, now)
    if al then
      consume(al, grant, now, '')
      code = alg + 10
      remaining = math.min(remaining, available(al, now))
      reset = math.max(reset, reset_after(al, now))
      store_allowance(al, true, now)
    end
    -- The log's lease is named after its entry; other leases after the time and the ask's
    -- position in this request (the nonce tells requests apart).
    local id = entry or (int(now) .. '.' .. i .. ':' .. int(grant))
    local lease = id .. ':' .. int(ws) .. ':' .. code .. ':' .. nonce
    redis.call('ZADD', lease_key, int(now + valid), lease)
    reply[i] = {grant, lease, valid, remaining, 0, reset, redis.call('ZCARD', lease_key), 0}
    store(b, now)
    store_leases(lease_key, now)
  end
end
return reply
