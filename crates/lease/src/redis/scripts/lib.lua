--[[
lib.lua: helpers shared by every Tollgate script; prepended to each operation before loading.

This file mirrors crates/lease/src/algorithm/*.rs: the same formulas with the same order of
floating-point operations, so the Redis store and the in-memory store answer bit for bit alike.

Time:  microseconds since the Unix epoch, from Redis TIME (never from the caller's clock).
       Windows are aligned to the epoch; math.fmod keeps `now - now % W` exact.
Codes: 1 token bucket, 2 sliding window, 3 sliding log, 4 fixed window, 5 concurrency.
State: token bucket    HASH  alg=1 tokens=<%.17g> ts=<us>
       sliding window  HASH  alg=2 ws=<us> prev=<n> cur=<n>
       fixed window    HASH  alg=4 ws=<us> count=<n>
       sliding log     ZSET  <key>:log    member <id>:<units>          score = admission time
       concurrency     ZSET  <key>:slots  member <id>:<units>:<nonce>  score = slot expiry
       leases          ZSET  <key>:leases member <id>:<units>:<ws>:<alg>:<nonce>  score = expiry
                       (<id> is the log entry's id, else <now>.<ask position>)
Invariants:
  - a hash written by another algorithm (the rule changed) reads as no state;
  - every key expires once its state is neutral (bucket full, windows over, entries gone)
    plus MARGIN_MS, so idle keys vanish and an expiry is never observable;
  - counts are integers far below 2^53 (validated by the caller), so sums stay exact;
  - a token bucket's debt is floored at -capacity;
  - tokens within EPSILON below a whole number count as it.
]]

local MARGIN_MS = 1000
-- Tokens (and sliding window room) this close below a whole number count as it
-- (token_bucket.rs EPSILON): refill and weighting are done in doubles, and a retry at the
-- retry-after given must fit.
local EPSILON = 1e-9
local TB, SW, LOG, FW, CONC = 1, 2, 3, 4, 5

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function int(x) return string.format('%.0f', x) end
local function float(x) return string.format('%.17g', x) end

local function ttl_ms(neutral_in_us)
  return int(math.ceil(neutral_in_us / 1000) + MARGIN_MS)
end

local function window_start(t, w) return t - math.fmod(t, w) end

local function pos(x) if x < 0 then return 0 end return x end

local function member_units(member)
  return tonumber(string.match(member, '^[^:]*:(%d+)')) or 0
end

-- The bucket of algorithm `alg` stored at `key`, as of `now`.
-- p1, p2: capacity and refill/s (1); limit and window us (2, 3, 4); slots and slot TTL us (5).
local function load(alg, key, p1, p2, now)
  local b = {alg = alg, key = key, p1 = p1, p2 = p2}
  if alg == TB then
    local s = redis.call('HMGET', key, 'alg', 'tokens', 'ts')
    if s[1] == '1' then
      local tokens, ts = tonumber(s[2]), tonumber(s[3])
      local elapsed = pos(now - ts)
      b.tokens = math.min(p1, tokens + elapsed * p2 / 1000000)
      b.ts = math.max(ts, now)
    else
      b.tokens, b.ts = p1, now
    end
  elseif alg == FW then
    local s = redis.call('HMGET', key, 'alg', 'ws', 'count')
    local ws = window_start(now, p2)
    if s[1] == '4' and tonumber(s[2]) >= ws then
      b.ws, b.count = tonumber(s[2]), tonumber(s[3])
    else
      b.ws, b.count = ws, 0
    end
  elseif alg == SW then
    local s = redis.call('HMGET', key, 'alg', 'ws', 'prev', 'cur')
    local ws = window_start(now, p2)
    b.ws, b.prev, b.cur = ws, 0, 0
    if s[1] == '2' then
      local sws = tonumber(s[2])
      if sws >= ws then
        b.ws, b.prev, b.cur = sws, tonumber(s[3]), tonumber(s[4])
      elseif sws + p2 == ws then
        b.prev = tonumber(s[4])
      end
    end
  else
    -- LOG entries leave a window after admission; CONC slots at their expiry.
    local cutoff = now
    if alg == LOG then cutoff = pos(now - p2) end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', int(cutoff))
    local flat = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
    local entries, used = {}, 0
    for i = 1, #flat, 2 do
      local units = member_units(flat[i])
      entries[#entries + 1] = {tonumber(flat[i + 1]), units}
      used = used + units
    end
    b.entries, b.used = entries, used
  end
  return b
end

local function sw_estimate(b, now)
  local w = b.p2
  local e = pos(now - b.ws)
  return b.prev * (w - e) / w + b.cur
end

local function admits(b, cost, now)
  if b.alg == TB then return b.tokens + EPSILON >= cost end
  if b.alg == FW then return b.count + cost <= b.p1 end
  if b.alg == SW then return sw_estimate(b, now) + cost <= b.p1 + EPSILON end
  return b.used + cost <= b.p1
end

-- Whole units available now.
local function available(b, now)
  if b.alg == TB then
    local tokens = math.floor(b.tokens + EPSILON)
    if tokens <= 0 then return 0 end
    return tokens
  end
  if b.alg == FW then return pos(b.p1 - b.count) end
  if b.alg == SW then
    local left = math.floor(b.p1 - sw_estimate(b, now) + EPSILON)
    if left <= 0 then return 0 end
    return left
  end
  return pos(b.p1 - b.used)
end

-- Adds an entry of `units` scored `score` to a LOG or CONC bucket; returns its member.
-- The entry's id (`<base>`, else `<base>-1`, ...) is unique among the entries of the same
-- score whatever their units, so shrinking one entry on a return never lands on another.
local function add_entry(b, base, score, units, tail)
  local taken = {}
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', b.key, int(score), int(score))) do
    taken[string.match(m, '^[^:]*')] = true
  end
  local id, n = int(base), 0
  while taken[id] do
    n = n + 1
    id = int(base) .. '-' .. n
  end
  local member = id .. ':' .. int(units) .. tail
  redis.call('ZADD', b.key, int(score), member)
  b.used = b.used + units
  return member
end

-- Consumes `units`; returns the new member for LOG and CONC buckets.
local function consume(b, units, now, nonce)
  if b.alg == TB then b.tokens = b.tokens - units
  elseif b.alg == FW then b.count = b.count + units
  elseif b.alg == SW then b.cur = b.cur + units
  elseif b.alg == LOG then return add_entry(b, now, now, units, '')
  else return add_entry(b, now, now + b.p2, units, ':' .. nonce)
  end
  return nil
end

local function tb_retry(b, cost)
  local us = math.ceil((cost - b.tokens - EPSILON) * 1000000 / b.p2)
  if us <= 0 then return 0 end
  return us
end

-- Microseconds until `cost` fits (called only when it does not fit now).
local function retry_after(b, cost, now)
  if b.alg == TB then return tb_retry(b, cost) end
  if b.alg == FW then return pos(b.ws + b.p2 - now) end
  if b.alg == SW then
    local w, limit = b.p2, b.p1
    local e = pos(now - b.ws)
    local need = limit - cost
    local t
    if b.cur <= need then
      if b.prev == 0 then return 1 end
      t = math.ceil(w - (need - b.cur) * w / b.prev) - e
    else
      t = (w - e) + math.ceil(w - need * w / b.cur)
    end
    if t < 1 then return 1 end
    return t
  end
  -- LOG and CONC: entries leave in score order, each at score + hold.
  local hold = 0
  if b.alg == LOG then hold = b.p2 end
  local freed = 0
  for _, entry in ipairs(b.entries) do
    freed = freed + entry[2]
    if b.used - freed + cost <= b.p1 then
      local t = entry[1] + hold - now
      if t < 1 then return 1 end
      return t
    end
  end
  return 1
end

-- Score of the last member of a sorted set, or nil.
local function last_score(key)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then return tonumber(last[2]) end
  return nil
end

-- Microseconds until the bucket is back to its full capacity.
local function reset_after(b, now)
  if b.alg == TB then return tb_retry(b, b.p1) end
  if b.alg == FW then
    if b.count > 0 then return pos(b.ws + b.p2 - now) end
    return 0
  end
  if b.alg == SW then
    local left = pos(b.ws + b.p2 - now)
    if b.cur > 0 then return left + b.p2 end
    if b.prev > 0 then return left end
    return 0
  end
  local hold = 0
  if b.alg == LOG then hold = b.p2 end
  local last = last_score(b.key)
  if last then return pos(last + hold - now) end
  return 0
end

-- Writes the bucket back and sets its expiry.
local function store(b, now)
  if b.alg == TB then
    redis.call('HSET', b.key, 'alg', '1', 'tokens', float(b.tokens), 'ts', int(b.ts))
    redis.call('PEXPIRE', b.key, ttl_ms(reset_after(b, now)))
  elseif b.alg == FW then
    redis.call('HSET', b.key, 'alg', '4', 'ws', int(b.ws), 'count', int(b.count))
    redis.call('PEXPIRE', b.key, ttl_ms(pos(b.ws + b.p2 - now)))
  elseif b.alg == SW then
    redis.call('HSET', b.key, 'alg', '2', 'ws', int(b.ws), 'prev', int(b.prev), 'cur', int(b.cur))
    redis.call('PEXPIRE', b.key, ttl_ms(pos(b.ws + b.p2 - now) + b.p2))
  elseif last_score(b.key) then
    redis.call('PEXPIRE', b.key, ttl_ms(reset_after(b, now)))
  end
end

-- A lease table keeps its newest lease (plus the margin).
local function store_leases(lease_key, now)
  local last = last_score(lease_key)
  if last then redis.call('PEXPIRE', lease_key, ttl_ms(pos(last - now))) end
end
