--[[
note_denials: count denials an identity was given under a rule with a penalty, and block the
identity when they reach the penalty's `after` within its `within`.

KEYS[1]  the bucket's penalty record (`<key>:penalty`)
KEYS[2]  the records' lift epoch (`<key>:penalty:epoch`)
ARGV[1]  denials to add (0: only read the record)
ARGV[2]  after: denials that start a block
ARGV[3]  within, us: the counting window, opened by the first denial counted
ARGV[4]  block, us: how long a block lasts
ARGV[5]  the lift epoch the denials were handed out under ('': count them whatever it is)
Reply    {block time left us (0: not blocked), denials counted in the window, 1 if this call
         started the block else 0, the lift epoch}

Invariants:
  - denials while blocked are not counted (a blocked request is not over the limit);
  - the block starts at the call that brings the count to `after`, lasts exactly `block`, and
    clears the count; a window that has ended counts from zero;
  - the record expires with the block or the window (plus MARGIN_MS), so an identity that
    stops being denied leaves nothing behind;
  - a read (0 denials) writes nothing;
  - denials handed out under another lift epoch than the store's are not counted: a lift or
    reset is never undone by denials from before it, whenever they arrive.
]]

local now = now_us()
local key = KEYS[1]
local add, after = tonumber(ARGV[1]), tonumber(ARGV[2])
local within, block = tonumber(ARGV[3]), tonumber(ARGV[4])
local epoch = lift_epoch(KEYS[2])
local s = redis.call('HMGET', key, 'until', 'ws', 'n')
local blocked_until = tonumber(s[1] or '0') or 0
if blocked_until > now then return {blocked_until - now, 0, 0, epoch} end
local ws, n = tonumber(s[2] or '') , tonumber(s[3] or '0') or 0
if ws == nil or ws + within <= now then ws, n = now, 0 end
if add == 0 then return {0, n, 0, epoch} end
if ARGV[5] ~= '' and tonumber(ARGV[5]) ~= epoch then return {0, n, 0, epoch} end
n = n + add
if n >= after then
  redis.call('DEL', key)
  redis.call('HSET', key, 'until', int(now + block))
  redis.call('PEXPIRE', key, ttl_ms(block))
  return {block, 0, 1, epoch}
end
redis.call('DEL', key)
redis.call('HSET', key, 'ws', int(ws), 'n', int(n))
redis.call('PEXPIRE', key, ttl_ms(ws + within - now))
return {0, n, 0, epoch}
