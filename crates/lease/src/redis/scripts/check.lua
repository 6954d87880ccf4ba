--[[
check: consume `cost` from every bucket of one identity, or from none.

KEYS[i]  state key of bucket i (a hash for counters; `<key>:log`, `<key>:slots` sorted sets),
         then the allowance and demand keys of the items that have one
ARGV[1]  nonce that makes concurrency slot ids unguessable
ARGV[2]  1: a peek, judged as a check but consuming nothing; 0: a check;
         R|<ttl us>|<k>: a reservation (nonce ARGV[1]): admitted, it also records the item's
         cost under the nonce in its reservations hash KEYS[k + 2(i-1)] and their ends
         KEYS[k + 2(i-1) + 1]
ARGV[3 + 9(i-1) ...]  per bucket: algorithm code, p1, p2, cost, then its allowance: KEYS index
         of the allowance key (0: none), region, interval us, unknown share; then the KEYS
         index of its penalty record (`<key>:penalty`; 0: its rule has no penalty)
Reply    per bucket: {allowed 0|1, remaining, retry_after_us, reset_after_us, slot id or '',
         blocked_for_us (the penalty block's time left; 0: not blocked)}

Invariants:
  - every bucket is judged before any is changed: all consume or none does;
  - an item with an allowance is admitted only if its allowance admits too, and consumes both;
  - an item whose identity is blocked (its penalty record's `until` is ahead) is denied with
    the block's time left as its retry-after, and the request consumes nothing;
  - a denied request, a peek and a cost of 0 write nothing but the demand record and a token
    bucket allowance's tracked capacity (only expired entries are pruned);
  - `remaining` is counted after consumption when the request is admitted;
  - a concurrency bucket returns a slot id only when the request is admitted;
  - a reservation is recorded in every bucket or in none (with the request's admission).
]]

local now = now_us()
local nonce = ARGV[1]
local peek = ARGV[2] == '1'
local rttl, rk = string.match(ARGV[2], '^R|(%d+)|(%d+)$')
rttl, rk = tonumber(rttl), tonumber(rk)
local n = (#ARGV - 2) / 9
local buckets, allowances, costs, ok, aok, blocks = {}, {}, {}, {}, {}, {}
local all = true
for i = 1, n do
  local a = 3 + (i - 1) * 9
  local alg, p1, p2 = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local b = load(alg, KEYS[i], p1, p2, now)
  local cost = tonumber(ARGV[a + 3])
  local al = load_allowance(KEYS, ARGV, alg, p1, p2, a + 4, now)
  buckets[i], allowances[i], costs[i] = b, al, cost
  ok[i] = admits(b, cost, now)
  aok[i] = (al == nil) or admits(al, cost, now)
  blocks[i] = blocked_for(KEYS, tonumber(ARGV[a + 8]), now)
  if not (ok[i] and aok[i]) or blocks[i] > 0 then all = false end
end

local reply = {}
for i = 1, n do
  local b, al, cost = buckets[i], allowances[i], costs[i]
  local take = all and cost > 0 and not peek
  local member = nil
  if take then member = consume(b, cost, now, nonce) end
  if rttl and all then
    local entry = ''
    if b.alg == LOG and member then entry = string.match(member, '^[^:]*') end
    local r = rk + 2 * (i - 1)
    record_reservation(KEYS[r], KEYS[r + 1], nonce, cost, b.alg, rttl, entry, now)
  end
  local retry = 0
  if not ok[i] then retry = retry_after(b, cost, now) end
  local slot = ''
  if b.alg == CONC and member then slot = member end
  local allowed = 0
  if ok[i] and aok[i] then allowed = 1 end
  local remaining, reset = available(b, now), reset_after(b, now)
  if al then
    if take then consume(al, cost, now, '') end
    remaining = math.min(remaining, available(al, now))
    if not aok[i] then retry = math.max(retry, retry_after(al, cost, now)) end
    reset = math.max(reset, reset_after(al, now))
    store_allowance(al, take, now)
  end
  if blocks[i] > 0 then
    allowed, retry = 0, math.max(retry, blocks[i])
  end
  reply[i] = {allowed, remaining, retry, reset, slot, blocks[i]}
  if take then store(b, now) end
end
return reply
