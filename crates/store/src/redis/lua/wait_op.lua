-- A waiter's follow-up (see wait.lua), after what time did to the
-- resource: 'outcome' takes ticket's answer if it has one; 'leave' takes
-- it out of the queue (its session ended), serves the queue and takes its
-- answer if it had one; 'abandon' is 'leave' for a waiter nobody follows
-- up any more (its leave failed): copies handed to it are given back;
-- 'tick' only lets time act.
-- KEYS: 1 counts, 2 this server's contribution, 3 staging, 4 staging exp,
--       5 this operation's record
-- ARGV: 1 test clock, 2 record ttl, 3 'outcome', 'leave', 'abandon' or 'tick',
--       4 ticket
-- Reply: {'ok', 'answer', ...} (see answer_reply in wait.lua), {'none'}: no
--        answer (still waiting, or it left), {'ok', 'lost'}: the ticket is
--        unknown to the queue (its keys expired, or Redis lost its data),
--        {'fenced'} or {'cancelled'}
local now = clock(ARGV[1])
if fenced(KEYS[2]) then return { 'fenced' } end
if cancelled(KEYS[5]) then return { 'cancelled' } end
wait_keys(KEYS[1])
pass_time(now, KEYS[3], KEYS[4])
local op, ticket = ARGV[3], ARGV[4]
if op == 'tick' then return { 'none' } end
if op ~= 'outcome' and redis.call('ZREM', W.q, ticket) == 1 then
  drop_waiter(ticket)
  walk(now)
end
local a = take(ticket)
if op == 'abandon' then
  if a and a[1] > 0 then
    local fs = fields(a[13], a[6])
    sub(KEYS[1], fs, a[1])
    sub(W.base .. ':s:' .. a[12], fs, a[1])
    if waiting() then walk(now) end
  end
  return { 'none' }
end
if not a then
  if op == 'outcome' and not redis.call('ZSCORE', W.q, ticket) then return { 'ok', 'lost' } end
  return { 'none' }
end
-- Copies handed over are held from now on by the session that takes them:
-- if this reply is lost, the undo gives them back.
if a[1] > 0 then remember(KEYS[5], ARGV[2], { 'reserve', a[1], a[13], a[6] }) end
return answer_reply(a)
