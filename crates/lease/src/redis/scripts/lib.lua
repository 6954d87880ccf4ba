--[[
lib.lua: helpers shared by every Tollgate script; prepended to each operation before loading.

This file mirrors crates/lease/src/algorithm/*.rs: the same formulas with the same order of
floating-point operations, so the Redis store and the in-memory store answer bit for bit alike.

Time:  microseconds since the Unix epoch, from Redis TIME (never from the caller's clock).
       Windows are aligned to the epoch; math.fmod keeps `now - now % W` exact.
Codes: 1 token bucket, 2 sliding window, 3 sliding log, 4 fixed window, 5 concurrency, 6 GCRA,
       7 leaky bucket.
State: token bucket    HASH  alg=1 tokens=<%.17g> ts=<us> [cap=<n>: an allowance, see below]
       GCRA            HASH  alg=6 ahead=<%.17g us> ts=<us>  (the TAT is ts + ahead)
       leaky bucket    HASH  alg=7 level=<%.17g> ts=<us>
       sliding window  HASH  alg=2 ws=<us> prev=<n> cur=<n>  (cur past the limit: a debt)
       fixed window    HASH  alg=4 ws=<us> count=<n>
       sliding log     ZSET  <key>:log    member <id>:<units>          score = admission time
                       (or later: a debt's entry, a window on per limit's worth owed)
       concurrency     ZSET  <key>:slots  member <id>:<units>:<nonce>  score = slot expiry
       leases          ZSET  <key>:leases member <id>:<units>:<ws>:<alg>:<nonce>  score = expiry
                       (<id> is the log entry's id, else <now>.<ask position>)
       allowance       <key>:allowance, the bucket's state at this region's share
       demand          HASH  <key>:demand  since=<us> last=<us>  r:<origin>=<region>|<units>|<until>
       penalty         HASH  <key>:penalty ws=<us> n=<denials>  or  until=<us> (a block)
       lift epoch      STRING <key>:penalty:epoch  the store time (us) of the latest lift or
                       reset of the identity's penalty records, kept EPOCH_TTL_MS
       reservations    HASH  <key>:reservations  <nonce>=o|units|at|alg|expires|entry  or  s
                       ZSET  <key>:reservations:ends  member <nonce>  score = record's end
Invariants:
  - a hash written by another algorithm (the rule changed) reads as no state;
  - every key expires once its state is neutral (bucket full, windows over, entries gone)
    plus MARGIN_MS, so idle keys vanish and an expiry is never observable;
  - counts are integers far below 2^53 (validated by the caller), so sums stay exact;
  - a token bucket's debt is floored at -capacity, but for a settlement's excess (owed whole);
  - tokens within EPSILON below a whole number count as it;
  - a GCRA key is never more than 2τ ahead (burst · interval, its debt floor) but by a
    settlement's excess, and times within GCRA_SLACK_US count as equal;
  - a leaky bucket's level is never below 0 nor, by a debit, above twice its burst (a
    settlement's excess goes whole).
]]

local MARGIN_MS = 1000
-- Tokens (and sliding window room) this close below a whole number count as it
-- (token_bucket.rs EPSILON): refill and weighting are done in doubles, and a retry at the
-- retry-after given must fit.
local EPSILON = 1e-9
local TB, SW, LOG, FW, CONC, GCRA, LB = 1, 2, 3, 4, 5, 6, 7
-- gcra.rs SLACK_US.
local GCRA_SLACK_US = 1e-3

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function int(x) return string.format('%.0f', x) end
local function float(x) return string.format('%.17g', x) end

local function ttl_ms(neutral_in_us)
  return int(math.ceil(neutral_in_us / 1000) + MARGIN_MS)
end

-- How long a lift epoch is kept: far longer than any flush of denials can be on its way.
local EPOCH_TTL_MS = 86400000

-- The lift epoch of a bucket's penalty records (0: no lift or reset in EPOCH_TTL_MS).
local function lift_epoch(key)
  return tonumber(redis.call('GET', key) or '0') or 0
end

-- Starts a new lift epoch: the store's time, or one past the last if the clock stepped
-- back, so an epoch never comes back and a node that remembers an old one is never current.
local function next_epoch(key, now)
  local e = math.max(lift_epoch(key) + 1, now)
  redis.call('SET', key, int(e), 'PX', EPOCH_TTL_MS)
  return e
end

local function window_start(t, w) return t - math.fmod(t, w) end

local function pos(x) if x < 0 then return 0 end return x end

local function member_units(member)
  return tonumber(string.match(member, '^[^:]*:(%d+)')) or 0
end

-- The bucket of algorithm `alg` stored at `key`, as of `now`.
-- p1, p2: capacity and refill/s (1); limit and window us (2, 3, 4); slots and slot TTL us (5);
-- burst and rate/s (6); burst and leak/s (7).
local function load(alg, key, p1, p2, now)
  local b = {alg = alg, key = key, p1 = p1, p2 = p2}
  if alg == GCRA then
    local s = redis.call('HMGET', key, 'alg', 'ahead', 'ts')
    if s[1] == '6' then
      local ahead, ts = tonumber(s[2]), tonumber(s[3])
      b.ahead = math.max(0, ahead - pos(now - ts))
      b.ts = math.max(ts, now)
    else
      b.ahead, b.ts = 0, now
    end
  elseif alg == LB then
    local s = redis.call('HMGET', key, 'alg', 'level', 'ts')
    if s[1] == '7' then
      local level, ts = tonumber(s[2]), tonumber(s[3])
      b.level = math.max(0, level - pos(now - ts) * p2 / 1000000)
      b.ts = math.max(ts, now)
    else
      b.level, b.ts = 0, now
    end
  elseif alg == TB then
    local s = redis.call('HMGET', key, 'alg', 'tokens', 'ts', 'cap')
    if s[1] == '1' then
      local tokens, ts, cap = tonumber(s[2]), tonumber(s[3]), tonumber(s[4])
      -- A tracked capacity (an allowance) that moved moves the level with it: used tokens
      -- carry over (a debt floored at one bucket, as a debit's is).
      if cap and p1 ~= cap then tokens = math.max(-p1, tokens + (p1 - cap)) end
      local elapsed = pos(now - ts)
      b.tokens = math.min(p1, tokens + elapsed * p2 / 1000000)
      b.ts = math.max(ts, now)
      if cap then b.cap = p1 end
    else
      b.tokens, b.ts = p1, now
    end
  elseif alg == FW then
    local s = redis.call('HMGET', key, 'alg', 'ws', 'count')
    local ws = window_start(now, p2)
    if s[1] == '4' and tonumber(s[2]) >= ws then
      b.ws, b.count = tonumber(s[2]), tonumber(s[3])
    elseif s[1] == '4' then
      -- A count past the limit is a debt: each window since paid off a limit's worth.
      local windows = (ws - tonumber(s[2])) / p2
      b.ws, b.count = ws, pos(tonumber(s[3]) - windows * p1)
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
      else
        -- Each window that ended hands a limit's worth on as the decaying count; what is past
        -- it is a debt that stays counted (sliding_window.rs `load`).
        local limit = math.max(p1, 1)
        local windows = (ws - sws) / p2
        local before = pos(tonumber(s[4]) - (windows - 1) * limit)
        b.prev, b.cur = math.min(before, limit), pos(before - limit)
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

-- The time left (us) of a penalty block on the identity whose penalty record is keys[idx]
-- (idx 0: the item's rule has no penalty; 0 when not blocked).
local function blocked_for(keys, idx, now)
  if idx == 0 then return 0 end
  local u = tonumber(redis.call('HGET', keys[idx], 'until') or '0') or 0
  return pos(u - now)
end

local function sw_estimate(b, now)
  local w = b.p2
  local e = pos(now - b.ws)
  return b.prev * (w - e) / w + b.cur
end

-- A GCRA's emission interval (us).
local function gcra_t(b) return 1000000 / b.p2 end

local function admits(b, cost, now)
  if b.alg == TB then return b.tokens + EPSILON >= cost end
  if b.alg == GCRA then
    local t = gcra_t(b)
    return b.ahead + cost * t <= b.p1 * t + GCRA_SLACK_US
  end
  if b.alg == LB then return b.level + cost <= b.p1 + EPSILON end
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
  if b.alg == GCRA then
    local t = gcra_t(b)
    local units = math.floor((b.p1 * t - b.ahead + GCRA_SLACK_US) / t)
    if units <= 0 then return 0 end
    return units
  end
  if b.alg == LB then
    local room = math.floor(b.p1 - b.level + EPSILON)
    if room <= 0 then return 0 end
    return room
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
  elseif b.alg == GCRA then b.ahead = b.ahead + units * gcra_t(b)
  elseif b.alg == LB then b.level = b.level + units
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

local function lb_reset(b)
  local us = math.ceil((b.level - EPSILON) * 1000000 / b.p2)
  if us <= 0 then return 0 end
  return us
end

local function gcra_reset(b)
  local us = math.ceil(b.ahead - GCRA_SLACK_US)
  if us <= 0 then return 0 end
  return us
end

-- Microseconds until `cost` fits (called only when it does not fit now).
local function retry_after(b, cost, now)
  if b.alg == TB then return tb_retry(b, cost) end
  if b.alg == GCRA then
    local t = gcra_t(b)
    local us = math.ceil(b.ahead + cost * t - b.p1 * t - GCRA_SLACK_US)
    if us <= 0 then return 0 end
    return us
  end
  if b.alg == LB then
    local us = math.ceil((b.level + cost - b.p1 - EPSILON) * 1000000 / b.p2)
    if us <= 0 then return 0 end
    return us
  end
  if b.alg == FW then
    -- The first window a debt leaves room in (fixed_window.rs `windows_before_room`).
    local limit = math.max(b.p1, 1)
    local after = pos(math.ceil(pos(b.count + cost - limit) / limit) - 1)
    return pos(b.ws + b.p2 - now) + after * b.p2
  end
  if b.alg == SW then
    local w, limit = b.p2, b.p1
    local e = pos(now - b.ws)
    local need = pos(limit - cost)
    local t
    if b.cur <= need then
      if b.prev == 0 then return 1 end
      t = math.ceil(w - (need - b.cur) * w / b.prev) - e
    else
      -- The first window whose debt leaves room (sliding_window.rs `retry_after`).
      local step = math.max(limit, 1)
      local ahead = math.max(math.ceil((b.cur - need) / step), 1)
      local cur = pos(b.cur - ahead * step)
      local prev = math.min(pos(b.cur - (ahead - 1) * step), step)
      t = (w - e) + (ahead - 1) * w + math.ceil(w - (need - cur) * w / prev)
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

-- Microseconds until a fixed window's state is no different from none: its window's end, or
-- the end of the last window its debt counts in (fixed_window.rs `neutral_in`).
local function fw_neutral(b, now)
  local debt_windows = pos(math.ceil(b.count / math.max(b.p1, 1)) - 1)
  return pos(b.ws + b.p2 - now) + debt_windows * b.p2
end

-- Microseconds until the bucket is back to its full capacity.
local function reset_after(b, now)
  if b.alg == TB then return tb_retry(b, b.p1) end
  if b.alg == GCRA then return gcra_reset(b) end
  if b.alg == LB then return lb_reset(b) end
  if b.alg == FW then
    if b.count > 0 then return fw_neutral(b, now) end
    return 0
  end
  if b.alg == SW then
    local left = pos(b.ws + b.p2 - now)
    if b.cur > 0 then return left + math.ceil(b.cur / math.max(b.p1, 1)) * b.p2 end
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
    if b.cap then redis.call('HSET', b.key, 'cap', int(b.cap)) end
    redis.call('PEXPIRE', b.key, ttl_ms(reset_after(b, now)))
  elseif b.alg == GCRA then
    redis.call('HSET', b.key, 'alg', '6', 'ahead', float(b.ahead), 'ts', int(b.ts))
    redis.call('PEXPIRE', b.key, ttl_ms(gcra_reset(b)))
  elseif b.alg == LB then
    redis.call('HSET', b.key, 'alg', '7', 'level', float(b.level), 'ts', int(b.ts))
    redis.call('PEXPIRE', b.key, ttl_ms(lb_reset(b)))
  elseif b.alg == FW then
    redis.call('HSET', b.key, 'alg', '4', 'ws', int(b.ws), 'count', int(b.count))
    redis.call('PEXPIRE', b.key, ttl_ms(fw_neutral(b, now)))
  elseif b.alg == SW then
    redis.call('HSET', b.key, 'alg', '2', 'ws', int(b.ws), 'prev', int(b.prev), 'cur', int(b.cur))
    local windows = math.max(math.ceil(b.cur / math.max(b.p1, 1)), 1)
    redis.call('PEXPIRE', b.key, ttl_ms(pos(b.ws + b.p2 - now) + windows * b.p2))
  elseif last_score(b.key) then
    redis.call('PEXPIRE', b.key, ttl_ms(reset_after(b, now)))
  end
end

-- A lease table keeps its newest lease (plus the margin).
local function store_leases(lease_key, now)
  local last = last_score(lease_key)
  if last then redis.call('PEXPIRE', lease_key, ttl_ms(pos(last - now))) end
end

-- Regional allowances (crates/lease/src/ops/allowance.rs).
local FLOOR_SHARE = 0.05
local REPORT_MARGIN_US = 1000000
local MAX_PERIOD_S = 316224000

-- The demand record's live reports: this region's units, the peer's, whether the peer
-- reported, the latest report expiry; expired reports are deleted.
local function demand_reports(dkey, region, now)
  local flat = redis.call('HGETALL', dkey)
  local fields = {}
  local own, peer, known, latest = 0, 0, false, 0
  local expired = {}
  for i = 1, #flat, 2 do
    local f, v = flat[i], flat[i + 1]
    if string.sub(f, 1, 2) == 'r:' then
      local r, units, untl = string.match(v, '^([^|]*)|(%d+)|(%d+)$')
      untl = tonumber(untl)
      if untl and untl > now then
        if untl > latest then latest = untl end
        if r == region then own = own + tonumber(units)
        else peer = peer + tonumber(units); known = true end
      else
        expired[#expired + 1] = f
      end
    else
      fields[f] = tonumber(v)
    end
  end
  if #expired > 0 then redis.call('HDEL', dkey, unpack(expired)) end
  return own, peer, known, latest, fields
end

local function demand_expire(dkey, latest, last, horizon, now)
  redis.call('PEXPIRE', dkey, ttl_ms(pos(math.max(latest, last + horizon) - now)))
end

-- This region's share (Demand::share), noting that it asks now.
local function demand_share(dkey, region, interval, unknown, now)
  local horizon = 2 * interval + REPORT_MARGIN_US
  local own, peer, known, latest, fields = demand_reports(dkey, region, now)
  local since, last = fields['since'] or 0, fields['last'] or 0
  if last == 0 or pos(now - last) > horizon then since = now end
  redis.call('HSET', dkey, 'since', int(since), 'last', int(now))
  demand_expire(dkey, latest, now, horizon, now)
  if not known then
    if pos(now - since) >= interval + REPORT_MARGIN_US then return 1.0 - FLOOR_SHARE end
    return unknown
  end
  if own == 0 then return FLOOR_SHARE end
  local s = own / (own + peer)
  if s < FLOOR_SHARE then return FLOOR_SHARE end
  if s > 1.0 - FLOOR_SHARE then return 1.0 - FLOOR_SHARE end
  return s
end

-- p1, p2 of a limit at `s` of it (allowance.rs share_of).
local function share_params(alg, p1, p2, s)
  if s >= 1 then return p1, p2 end
  local c = math.floor(p1 * s)
  if c < 1 then c = 1 end
  if alg == TB or alg == GCRA or alg == LB then
    local rate = p2 * s
    local slowest = c / MAX_PERIOD_S
    if rate < slowest then rate = slowest end
    return c, rate
  end
  return c, p2
end

-- The allowance of a bucket at this region's share, or nil when `ai` is 0. `argv` from
-- position `a`: `keys` index of the allowance key (the demand key follows it), region,
-- interval us, unknown share. (The script's KEYS and ARGV, passed in: in a batch they are the
-- request's own.)
local function load_allowance(keys, argv, alg, p1, p2, a, now)
  local ai = tonumber(argv[a])
  if ai == 0 then return nil end
  local s = demand_share(keys[ai + 1], argv[a + 1], tonumber(argv[a + 2]), tonumber(argv[a + 3]), now)
  local q1, q2 = share_params(alg, p1, p2, s)
  local al = load(alg, keys[ai], q1, q2, now)
  if alg == TB then al.cap = q1 end
  return al
end

-- Writes an allowance back: always for a token bucket (its capacity is tracked), else when
-- it changed.
local function store_allowance(al, changed, now)
  if al and (changed or al.alg == TB) then store(al, now) end
end

-- Credits a counting bucket `credit` units a lease or reservation took in the window starting
-- at `ws` (windows credit only that window, never below zero); returns what was credited.
local function credit_counter(b, credit, ws)
  if b.alg == TB then
    b.tokens = math.min(b.p1, b.tokens + credit)
    return credit
  elseif b.alg == GCRA then
    b.ahead = math.max(0, b.ahead - credit * gcra_t(b))
    return credit
  elseif b.alg == LB then
    b.level = math.max(0, b.level - credit)
    return credit
  elseif b.alg == FW and b.ws == ws then
    local c = math.min(credit, b.count)
    b.count = b.count - c
    return c
  elseif b.alg == SW and b.ws == ws then
    local c = math.min(credit, b.cur)
    b.cur = b.cur - c
    return c
  end
  return 0
end

-- Gives `credit` back as credit_counter does; returns what the bucket kept of it (whole
-- units, to the nearest): into a token bucket already full (a GCRA key at now, a leaky bucket empty), none.
local function credit_kept(b, credit, ws)
  local kept
  if b.alg == TB then
    local before = b.tokens
    credit_counter(b, credit, ws)
    kept = b.tokens - before
  elseif b.alg == GCRA then
    local before = b.ahead
    credit_counter(b, credit, ws)
    kept = (before - b.ahead) / gcra_t(b)
  elseif b.alg == LB then
    local before = b.level
    credit_counter(b, credit, ws)
    kept = before - b.level
  else
    return credit_counter(b, credit, ws)
  end
  -- Whole units, to the nearest: a bucket that refilled a hair meanwhile still says it kept
  -- the unit it was given.
  return math.min(credit, math.max(0, math.floor(kept + 0.5)))
end

-- Subtracts `units` consumed at `at` (at most now); returns the units applied (0 when their
-- window no longer counts). A debit's debt is floored at one full bucket; `in_full` (a
-- settlement's excess over its estimate) is owed whole: a token bucket, GCRA key or leaky
-- bucket goes as deep into debt as the excess takes it.
local function debit_bucket(b, units, at, now, in_full)
  local alg = b.alg
  if in_full and alg == TB then
    b.tokens = b.tokens - units
    return units
  elseif in_full and alg == GCRA then
    b.ahead = b.ahead + units * gcra_t(b)
    return units
  elseif in_full and alg == LB then
    b.level = b.level + units
    return units
  end
  -- A token bucket's debt stops at one full bucket, GCRA's and the leaky bucket's at two
  -- bursts: what is returned is what was taken (whole units), `units` unless it stopped.
  if alg == TB then
    local floor = -b.p1
    local wanted = b.tokens - units
    if wanted >= floor then
      b.tokens = wanted
      return units
    end
    local taken = math.floor(math.max(0, b.tokens - floor))
    b.tokens = floor
    return taken
  elseif alg == GCRA then
    local t = gcra_t(b)
    local most = 2 * (b.p1 * t)
    local wanted = b.ahead + units * t
    if wanted <= most then
      b.ahead = wanted
      return units
    end
    local taken = math.floor(math.max(0, (most - b.ahead) / t))
    b.ahead = most
    return taken
  elseif alg == LB then
    local most = 2 * b.p1
    local wanted = b.level + units
    if wanted <= most then
      b.level = wanted
      return units
    end
    local taken = math.floor(math.max(0, most - b.level))
    b.level = most
    return taken
  elseif alg == FW then
    if window_start(at, b.p2) >= b.ws then
      b.count = b.count + units
      return units
    end
  elseif alg == SW then
    local ws_at = window_start(at, b.p2)
    if ws_at >= b.ws then
      b.cur = b.cur + units
      return units
    elseif ws_at + b.p2 == b.ws then
      -- Past the limit, the previous count hands the rest on, as its roll would have.
      local prev = b.prev + units
      b.prev = math.min(prev, math.max(b.p1, 1, b.prev))
      b.cur = b.cur + prev - b.prev
      return units
    end
  elseif alg == LOG then
    if at > pos(now - b.p2) then
      -- What fits counts from `at`; the debt past the limit is dated a window on for each
      -- limit's worth owed (entry_log.rs `add_owed`).
      local limit = math.max(b.p1, 1)
      local over = pos(b.used + units - limit)
      local debt = math.min(over, units)
      if units > debt then add_entry(b, at, at, units - debt, '') end
      if debt > 0 then
        local later = at + math.ceil(over / limit) * b.p2
        add_entry(b, later, later, debt, '')
      end
      return units
    end
  end
  return 0
end

-- Reservations (crates/lease/src/ops/reservation.rs): a hash nonce -> record, and a sorted
-- set nonce -> when the record may go (its TTL + SETTLED_KEPT_US).
--   open:     o|<units>|<at us>|<alg>|<expires us>|<log entry id or ''>
--   settled:  s
local SETTLED_KEPT_US = 600000000
local PRUNE_AT_ONCE = 1000

local function prune_reservations(rkey, ekey, now)
  local gone = redis.call('ZRANGEBYSCORE', ekey, '-inf', int(now), 'LIMIT', 0, PRUNE_AT_ONCE)
  if #gone > 0 then
    redis.call('HDEL', rkey, unpack(gone))
    redis.call('ZREM', ekey, unpack(gone))
  end
end

local function keep_reservations(rkey, ekey, now)
  local last = last_score(ekey)
  if last then
    local ms = ttl_ms(pos(last - now))
    redis.call('PEXPIRE', rkey, ms)
    redis.call('PEXPIRE', ekey, ms)
  end
end

local function record_reservation(rkey, ekey, nonce, units, alg, ttl, entry, now)
  prune_reservations(rkey, ekey, now)
  local expires = now + ttl
  redis.call('HSET', rkey, nonce, 'o|' .. int(units) .. '|' .. int(now) .. '|' .. alg .. '|'
    .. int(expires) .. '|' .. entry)
  redis.call('ZADD', ekey, int(expires + SETTLED_KEPT_US), nonce)
  keep_reservations(rkey, ekey, now)
end
