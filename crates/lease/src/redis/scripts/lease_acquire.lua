--[[
lease_acquire: take a batch of units from each bucket of one identity, independently.

KEYS[2i-1]  state key of bucket i;  KEYS[2i]  its lease table (`<key>:leases`)
ARGV[1]     nonce that makes lease ids unguessable
ARGV[2]     lease TTL, microseconds
ARGV[3 + 6(i-1) ...]  per bucket: algorithm code, p1, p2, want, min, max_share
Reply       per bucket: {units, lease id or '', valid_for_us, remaining, retry_after_us, reset_after_us}

Grant: min(want, max(min, floor(available * max_share))), or 0 when fewer than `min` units
are available (then retry_after is the time until `min` are).

Invariants:
  - granted units are consumed at once, exactly as a check of that cost would consume them;
  - a lease never outlives its window: fixed and sliding windows cap it at the window's end,
    the log at one window;
  - the lease id records the units, the window and the algorithm, so a return can credit at
    most what was granted, only into the same window and the same algorithm.
]]

local now = now_us()
local nonce = ARGV[1]
local ttl = tonumber(ARGV[2])
local reply = {}
for i = 1, #KEYS / 2 do
  local key, lease_key = KEYS[2 * i - 1], KEYS[2 * i]
  local a = 3 + (i - 1) * 6
  local alg = tonumber(ARGV[a])
  local want, min, share = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  redis.call('ZREMRANGEBYSCORE', lease_key, '-inf', int(now))
  local b = load(alg, key, tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), now)
  local avail = available(b, now)

  local grant = 0
  if avail >= min then
    grant = math.floor(avail * share)
    if grant < min then grant = min end
    if want < grant then grant = want end
  end

  if grant == 0 then
    reply[i] = {0, '', 0, avail, retry_after(b, min, now), reset_after(b, now)}
  else
    local entry = consume(b, grant, now, '')
    local valid, ws = ttl, 0
    if alg == FW or alg == SW then
      valid, ws = math.min(ttl, pos(b.ws + b.p2 - now)), b.ws
    elseif alg == LOG then
      valid, ws = math.min(ttl, b.p2), now
    end
    -- The log's lease is named after its entry; other leases after the time and the ask's
    -- position in this request (the nonce tells requests apart).
    local id = entry or (int(now) .. '.' .. i .. ':' .. int(grant))
    local lease = id .. ':' .. int(ws) .. ':' .. alg .. ':' .. nonce
    redis.call('ZADD', lease_key, int(now + valid), lease)
    reply[i] = {grant, lease, valid, available(b, now), 0, reset_after(b, now)}
    store(b, now)
    store_leases(lease_key, now)
  end
end
return reply
