--[[
penalty_lift: lift one identity's penalty block under one rule, and forget its denial count
(`DELETE /admin/v1/penalties`). The bucket itself is untouched.

KEYS[1]  the bucket's penalty record (`<key>:penalty`); KEYS[2] its SHADOW rule's record
         (`<key>:penalty:shadow`); KEYS[3] their lift epoch (`<key>:penalty:epoch`)
ARGV     none
Reply    {1 if a block was lifted, else 0; the new lift epoch}

Invariants: a count in progress is forgotten with the block (the client starts from zero);
only the penalty records are deleted; a new lift epoch starts, so that denials handed out
before the lift and counted after it (by nodes that had not heard of it) count nothing.
]]

local now = now_us()
local blocked_until = tonumber(redis.call('HGET', KEYS[1], 'until') or '0') or 0
redis.call('DEL', KEYS[1], KEYS[2])
local epoch = next_epoch(KEYS[3], now)
if blocked_until > now then return {1, epoch} end
return {0, epoch}
