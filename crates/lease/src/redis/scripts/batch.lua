--[[
batch: several independent requests for the operations that take units (check and
lease_acquire), from several identities, in one call. Each request runs as its own script runs
alone: the operations above are those scripts' bodies, each made a function of its own KEYS and
ARGV. All of them read the same clock (the batch's one TIME), as requests arriving at the same
instant would.

KEYS[1]  the first request's first key: it routes the call (a cluster sends it to the node that
         serves that key). Every key of the batch is meant to be on that node; the others
         travel in ARGV, since Redis Cluster refuses declared keys of several slots.
ARGV[1]  the number of requests, n
ARGV[2]  1: first check that each request's keys are served here (a cluster: a slot may have
         moved since the caller read the slot map), so that a request whose keys are not
         fails before it writes anything; 0: a single server
ARGV[3 ...]  per request: its operation (1: check, 2: lease_acquire), its key count k, its
         argument count m, then its k keys and its m arguments, as its own script takes them
Reply    per request, in order: {1, the operation's reply} or {0, the error it raised}; a
         malformed batch is an error before any request runs

Invariants:
  - each request is atomic and all-or-nothing within itself, as when it runs alone;
  - the requests run in order, each against the state the previous ones left (what separate
    calls arriving in that order do); the batch is not a transaction across requests;
  - one request's error (a key of another type, a key this node no longer serves) is that
    request's reply, and changes nothing for the others.
]]

local n, local_first = tonumber(ARGV[1]), ARGV[2] == '1'
-- Where each request is, found before any runs.
local requests, at = {}, 3
for r = 1, n do
  local op, k, m = tonumber(ARGV[at]), tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  if not (op and k and m) then return redis.error_reply('ERR malformed batch') end
  requests[r] = {op, at + 3, k, m}
  at = at + 3 + k + m
end
if at ~= #ARGV + 1 then return redis.error_reply('ERR malformed batch') end

local replies = {}
for r = 1, n do
  local op, from, k, m = unpack(requests[r])
  local keys = {unpack(ARGV, from, from + k - 1)}
  local args = {unpack(ARGV, from + k, from + k + m - 1)}
  local ok, reply = true, nil
  if local_first then ok, reply = pcall(redis.call, 'EXISTS', unpack(keys)) end
  if ok then ok, reply = pcall(OPERATIONS[op], keys, args) end
  if ok then
    replies[r] = {1, reply}
  else
    if type(reply) == 'table' then reply = reply.err end
    replies[r] = {0, tostring(reply)}
  end
end
return replies
