--[[
reset: forget one bucket (`POST /admin/v1/counters/reset`).

KEYS     the bucket's state under every algorithm (`<key>`, `<key>:log`, `<key>:slots`), its
         lease table (`<key>:leases`), its regional allowance (`<key>:allowance`) and its
         penalty record (`<key>:penalty`, which lifts a block), its reservations: one
         identity, one slot
ARGV     none
Reply    {keys deleted}

Invariants: the next call finds the bucket full; a lease granted before the reset credits
nothing when returned (its record is gone), so what nodes give back cannot raise the fresh
bucket; idempotent (a second reset deletes nothing).
]]

return {redis.call('DEL', unpack(KEYS))}
