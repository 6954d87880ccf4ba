--[[
debit: subtract units consumed elsewhere (by the peer region).

KEYS[i]  state key of bucket i
ARGV[1 + 5(i-1) ...]  per bucket: algorithm code, p1, p2, units, consumed_at_us ('' = now)
Reply    per bucket: units applied

Invariants:
  - a token bucket may go below zero (a debt that refill repays), floored at -capacity;
  - window algorithms count the units in the window they were consumed in: the current one,
    the previous one (sliding window), or nowhere if that window no longer counts. A time in
    the future is taken as now.
]]

local now = now_us()
local reply = {}
for i = 1, #KEYS do
  local a = 1 + (i - 1) * 5
  local alg = tonumber(ARGV[a])
  local units = tonumber(ARGV[a + 3])
  local at = now
  if ARGV[a + 4] ~= '' then at = math.min(tonumber(ARGV[a + 4]), now) end
  local b = load(alg, KEYS[i], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), now)
  local applied = 0
  if alg == TB then
    b.tokens = math.max(-b.p1, b.tokens - units)
    applied = units
  elseif alg == FW then
    if window_start(at, b.p2) >= b.ws then
      b.count = b.count + units
      applied = units
    end
  elseif alg == SW then
    local ws_at = window_start(at, b.p2)
    if ws_at >= b.ws then
      b.cur = b.cur + units
      applied = units
    elseif ws_at + b.p2 == b.ws then
      b.prev = b.prev + units
      applied = units
    end
  elseif alg == LOG then
    if at > pos(now - b.p2) then
      add_entry(b, at, at, units, '')
      applied = units
    end
  end
  if applied > 0 then store(b, now) end
  reply[i] = applied
end
return reply
