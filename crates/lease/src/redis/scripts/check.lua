--[[
check: consume `cost` from every bucket of one identity, or from none.

KEYS[i]  state key of bucket i (a hash for counters; `<key>:log`, `<key>:slots` sorted sets)
ARGV[1]  nonce that makes concurrency slot ids unguessable
ARGV[2]  1: a peek, judged as a check but consuming nothing; 0: a check
ARGV[3 + 4(i-1) ...]  per bucket: algorithm code, p1, p2, cost
Reply    per bucket: {allowed 0|1, remaining, retry_after_us, reset_after_us, slot id or ''}

Invariants:
  - every bucket is judged before any is changed: all consume or none does;
  - a denied request, a peek and a cost of 0 write nothing (only expired entries are pruned);
  - `remaining` is counted after consumption when the request is admitted;
  - a concurrency bucket returns a slot id only when the request is admitted.
]]

local now = now_us()
local nonce = ARGV[1]
local peek = ARGV[2] == '1'
local buckets, costs, ok = {}, {}, {}
local all = true
for i = 1, #KEYS do
  local a = 3 + (i - 1) * 4
  local b = load(tonumber(ARGV[a]), KEYS[i], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), now)
  local cost = tonumber(ARGV[a + 3])
  buckets[i], costs[i] = b, cost
  ok[i] = admits(b, cost, now)
  if not ok[i] then all = false end
end

local reply = {}
for i = 1, #KEYS do
  local b, cost = buckets[i], costs[i]
  local take = all and cost > 0 and not peek
  local member = nil
  if take then member = consume(b, cost, now, nonce) end
  local retry = 0
  if not ok[i] then retry = retry_after(b, cost, now) end
  local slot = ''
  if b.alg == CONC and member then slot = member end
  local allowed = 0
  if ok[i] then allowed = 1 end
  reply[i] = {allowed, available(b, now), retry, reset_after(b, now), slot}
  if take then store(b, now) end
end
return reply
