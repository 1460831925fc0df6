-- A waiter's follow-up (see wait.lua), after what time did to the
-- resource: 'outcome' takes ticket's answer if it has one; 'leave' takes
-- it out of the queue (its session ended), serves the queue and takes its
-- answer if it had one; 'tick' only lets time act.
-- KEYS: 1 counts, 2 this server's contribution, 3 staging, 4 staging exp,
--       5 this operation's record
-- ARGV: 1 test clock, 2 record ttl, 3 'outcome', 'leave' or 'tick',
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
if op == 'leave' and redis.call('ZREM', W.q, ticket) == 1 then
  drop_waiter(ticket)
  walk(now)
end
local a = take(ticket)
if not a then
  if op == 'outcome' and not redis.call('ZSCORE', W.q, ticket) then return { 'ok', 'lost' } end
  return { 'none' }
end
-- Copies handed over are held from now on by the session that takes them:
-- if this reply is lost, the undo gives them back.
if a[1] > 0 then remember(KEYS[5], ARGV[2], { 'reserve', a[1], a[13], a[6] }) end
return answer_reply(a)
