--[[
reset: forget one bucket (`POST /admin/v1/counters/reset`).

KEYS     the bucket's state under every algorithm (`<key>`, `<key>:log`, `<key>:slots`), its
         lease table (`<key>:leases`), its regional allowance (`<key>:allowance`) and its
         penalty record (`<key>:penalty`, which lifts a block), its reservations: one
         identity, one slot; the last, the penalty records' lift epoch
         (`<key>:penalty:epoch`)
ARGV     none
Reply    {keys deleted}

Invariants: the next call finds the bucket full; a lease granted before the reset credits
nothing when returned (its record is gone), so what nodes give back cannot raise the fresh
bucket; a second reset deletes nothing; a new lift epoch starts, as with a lift (denials
from before the reset count nothing after it).
]]

local epoch_key = table.remove(KEYS)
next_epoch(epoch_key, now_us())
return {redis.call('DEL', unpack(KEYS))}
