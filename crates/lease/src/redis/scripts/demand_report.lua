--[[
demand_report: record what nodes asked of buckets in their last interval.

KEYS[i]     demand key of report i (`<key>:demand`)
ARGV[1 + 4(i-1) ...]  per report: origin, region, units, interval us
Reply       the number of reports recorded

Invariants:
  - a later report of the same origin replaces the earlier one (a repeated report changes
    nothing);
  - a report counts for two intervals and a second, then is deleted;
  - the record expires when its last report and its last ask are over.
]]

local now = now_us()
for i = 1, #KEYS do
  local a = 1 + (i - 1) * 4
  local dkey = KEYS[i]
  local origin, region = ARGV[a], ARGV[a + 1]
  local units, interval = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local _, _, _, latest, fields = demand_reports(dkey, region, now)
  local untl = now + 2 * interval + REPORT_MARGIN_US
  redis.call('HSET', dkey, 'r:' .. origin, region .. '|' .. int(units) .. '|' .. int(untl))
  if untl > latest then latest = untl end
  demand_expire(dkey, latest, fields['last'] or 0, 0, now)
end
return #KEYS
