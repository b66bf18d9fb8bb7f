"""The Lua scripts of the fleet half of the Redis store (``gateway.store.redis_fleet``): listing pages,
activity, the reaper's batch claim and settlement, and the one-time backfill of the state-and-pool
indexes. Conventions as in :mod:`gateway.store.redis_scripts`, whose helpers the reaper's scripts share.

The state-and-pool indexes (``ix:<state>:<pool>``) are named inside the scripts from a record's own
fields, under the installation's ``{prefix}`` hash tag: every script still touches one slot, which
is what Redis Cluster checks of keys a script did not declare.
"""

from __future__ import annotations

from gateway.store.redis_scripts import _HELPERS

# Where a page after the cursor (ARGV[1] its last activity, '' = from the start; ARGV[2] its sandbox ID)
# starts in a zset, by rank: O(log n), and right even when the cursor's own entry moved or went.
_CURSOR = """
local function start_after(key)
  if ARGV[1] == '' then return 0 end
  local at = tonumber(ARGV[1])
  local score = redis.call('ZSCORE', key, ARGV[2])
  if score and tonumber(score) == at then return redis.call('ZRANK', key, ARGV[2]) + 1 end
  -- the cursor's entry moved or went (or is in another key): start at its score, after the ties before its id
  local start = redis.call('ZCOUNT', key, '-inf', '(' .. ARGV[1])
  while true do
    local tie = redis.call('ZRANGE', key, start, start, 'WITHSCORES')
    if #tie == 0 or tonumber(tie[2]) ~= at or tie[1] > ARGV[2] then return start end
    start = start + 1
  end
end
"""

INDEX_PAGE = _CURSOR + """
-- KEYS[1..n] zsets (sandbox id -> last_active): idx, or the state-and-pool indexes a filter names
-- ARGV[1] the cursor's last_active ('' = from the start)  ARGV[2] the cursor's sandbox id
-- ARGV[3] before (exclusive upper bound on last_active)  ARGV[4] how many entries at most
-- returns {id, score, id, score, ...}: the entries after the cursor in (score, id) order over every key with
-- score < before, at most ARGV[4] of them plus one more (which tells the caller whether more follow).
-- Bounded whatever the index sizes: per key ZSCORE/ZRANK/ZCOUNT and one ZRANGE by rank, O(log n + count).
local count, before = tonumber(ARGV[4]), tonumber(ARGV[3])
local merged = {}
for _, key in ipairs(KEYS) do
  local start = start_after(key)
  local entries = redis.call('ZRANGE', key, start, start + count, 'WITHSCORES')
  for i = 1, #entries, 2 do
    local score = tonumber(entries[i + 1])
    if score >= before then break end
    merged[#merged + 1] = {score, entries[i], entries[i + 1]}
  end
end
if #KEYS > 1 then
  table.sort(merged, function(a, b) if a[1] ~= b[1] then return a[1] < b[1] end return a[2] < b[2] end)
end
local out = {}
for i = 1, math.min(#merged, count + 1) do
  out[#out + 1] = merged[i][2]
  out[#out + 1] = merged[i][3]
end
return out
"""

READ_RECORDS = """
-- KEYS[1..n] sandbox hashes
-- returns, per key, its record fields {s, p, o, c, e, l, g, u, b, v, m, n} (s nil: no record);
-- one reply for a whole page, where a pipeline would cost a reply (and its parsing) per sandbox
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('HMGET', key, 's', 'p', 'o', 'c', 'e', 'l', 'g', 'u', 'b', 'v', 'm', 'n')
end
return out
"""

READ_MATCHING = """
-- KEYS[1..n] sandbox hashes, in index order
-- ARGV[1] state ('' = any)  ARGV[2] pool ('' = any)  ARGV[3] org ('' = any)  ARGV[4] how many matches at most
-- returns {examined, i1, fields1, i2, fields2, ...}: the matching records (fields as READ_RECORDS gives them,
-- i their position in KEYS) and how many keys were examined (all of them, or up to the last match kept):
-- a filtered listing decodes only what it returns, not every record it looked at
local want_state, want_pool, want_org, limit = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local out = {0}
local found = 0
for i, key in ipairs(KEYS) do
  out[1] = i
  local h = redis.call('HMGET', key, 's', 'p', 'o')
  if h[1] and (want_state == '' or h[1] == want_state) and (want_pool == '' or h[2] == want_pool)
      and (want_org == '' or h[3] == want_org) then
    out[#out + 1] = i
    out[#out + 1] = redis.call('HMGET', key, 's', 'p', 'o', 'c', 'e', 'l', 'g', 'u', 'b', 'v', 'm', 'n')
    found = found + 1
    if found >= limit then break end
  end
end
return out
"""

TOUCH = """
-- KEYS[1] sandboxes index  KEYS[2] seen zset  KEYS[3..n+2] the hashes of the n sandboxes in ARGV
-- ARGV[1] n  ARGV[2..2n+1] sandbox id, time pairs  ARGV[2n+2..] session id, time pairs
-- activity only moves forward (GT), and only for entries that exist (XX): in idx and in the record's
-- state-and-pool index alike (named as restate names it, under the same hash tag)
local base = string.sub(KEYS[1], 1, -4)  -- KEYS[1] is '<base>idx'
local n = tonumber(ARGV[1])
for i = 1, n do
  local id, at = ARGV[2 * i], ARGV[2 * i + 1]
  if redis.call('ZADD', KEYS[1], 'XX', 'GT', 'CH', at, id) == 1 then
    local h = redis.call('HMGET', KEYS[2 + i], 's', 'p')
    if h[1] and h[2] then redis.call('ZADD', base .. 'ix:' .. h[1] .. ':' .. h[2], 'XX', 'GT', at, id) end
  end
end
for j = 2 * n + 2, #ARGV, 2 do
  redis.call('ZADD', KEYS[2], 'XX', 'GT', ARGV[j + 1], ARGV[j])
end
return 0
"""

CLAIM_DUE = _HELPERS + """
-- KEYS[1] sandboxes index  KEYS[2] count:pool hash  KEYS[3] count:org hash  KEYS[4] count:state hash
-- KEYS[3 + 2i], KEYS[4 + 2i] claim i's sandbox hash and streams hash
-- ARGV[1] now  ARGV[2] lease_until  ARGV[3] the claim's token (the records' new g)  ARGV[4] invalidate channel
-- ARGV[5] this store's origin (for the invalidation messages)
-- ARGV[1 + 5i .. 5 + 5i] claim i: sandbox id, the state the verdict saw ('ready' | 'suspended', or 'deleting' |
-- 'suspending': a delete or suspend whose holder's lease lapsed, moved to the same state again), before (its activity must be older), the state it moves to
-- ('suspending' | 'deleting'), '1' to refuse a record while streams are recorded for it
-- returns per claim: 1 claimed (moved, under the lease and token; every replica drops its route: one
-- message for the batch, [origin, 'sandboxes', [ids]]); 0 not as the verdict saw it (nothing done);
-- 2 streams are recorded for it (nothing done)
local now = tonumber(ARGV[1])
local out, claimed = {}, {}
for i = 1, (#KEYS - 4) / 2 do
  local hash, streams, a = KEYS[3 + 2 * i], KEYS[4 + 2 * i], 5 * i
  local id, seen, to = ARGV[a + 1], ARGV[a + 2], ARGV[a + 4]
  local cur = redis.call('HMGET', hash, 's', 'p', 'o', 'l')
  local due = cur[1] == seen
  if due and (seen == 'deleting' or seen == 'suspending') then
    due = tonumber(cur[4] or '0') < now
  elseif due then
    local at = redis.call('ZSCORE', KEYS[1], id)
    due = at and tonumber(at) < tonumber(ARGV[a + 3])
  end
  if not due then
    out[i] = 0
  elseif ARGV[a + 5] == '1' and redis.call('EXISTS', streams) == 1 then
    out[i] = 2
  else
    if is_live(seen) and not is_live(to) then
      if cur[2] then uncount(KEYS[2], cur[2]) end
      if cur[3] then uncount(KEYS[3], cur[3]) end
    end
    redis.call('HSET', hash, 's', to, 'l', ARGV[2], 'g', ARGV[3])
    restate(KEYS[4], cur[2], seen, to, KEYS[1], id)
    claimed[#claimed + 1] = id
    out[i] = 1
  end
end
if #claimed > 0 then redis.call('PUBLISH', ARGV[4], cjson.encode({ARGV[5], 'sandboxes', claimed})) end
return out
"""

FINISH_DUE = _HELPERS + """
-- KEYS[1] sandboxes index  KEYS[2] count:pool hash  KEYS[3] count:org hash  KEYS[4] count:state hash
-- KEYS[5] seen zset  KEYS[6] count:sessions hash  KEYS[5 + 2i], KEYS[6 + 2i] sandbox i's hash and streams hash
-- ARGV[1] now  ARGV[2] the claim's token  ARGV[3] settled channel  ARGV[4] invalidate channel  ARGV[5] origin
-- ARGV[4 + 2i] sandbox i's id  ARGV[5 + 2i] 's': its compute is gone, it is suspended now; 'd': it is deleted,
-- its record goes, with the binding folded into its hash (a per-session sandbox's own session)
-- returns per sandbox i two values: out[2i - 1] 0 when the record is not this claim's any more (taken over once
-- its lease lapsed: left alone), 1 done, 2 deleted but sessions other than its folded one are still bound to
-- it (the caller deletes them); out[2i] the folded session deleted with it ('' when none).
-- One message per kind for the whole batch: settled {ids, gen, state} for the suspended and for the deleted,
-- and [origin, 'sandboxes', [ids], [sessions]] to drop routes: a replica reads three, not four per sandbox.
local out, settled, dropped, sessions = {}, {s = {}, d = {}}, {}, {}
for i = 1, (#KEYS - 6) / 2 do
  local hash, streams, id, kind = KEYS[5 + 2 * i], KEYS[6 + 2 * i], ARGV[4 + 2 * i], ARGV[5 + 2 * i]
  local cur = redis.call('HMGET', hash, 's', 'p', 'o', 'g')
  local want = 'deleting'
  if kind == 's' then want = 'suspending' end
  out[2 * i], out[2 * i - 1] = '', 0
  if cur[1] == want and cur[4] == ARGV[2] then
    if kind == 's' then
      to_suspended(cur, hash, KEYS[1], KEYS[2], KEYS[3], KEYS[4], id, ARGV[1])
      out[2 * i - 1] = 1
    else
      release(cur, hash, KEYS[1], KEYS[2], KEYS[3], KEYS[4], id)
      local folded = folded_session(hash)
      if folded then
        local head = redis.call('HGET', hash, '+' .. folded)
        redis.call('HDEL', hash, '+' .. folded, '=')
        uncount(hash, 'n')
        redis.call('ZREM', KEYS[5], folded)
        uncount(KEYS[6], string.match(head, '^[^\\31]*'))
        sessions[#sessions + 1] = folded
        out[2 * i] = folded
      end
      redis.call('DEL', streams)
      out[2 * i - 1] = 1
      if redis.call('HEXISTS', hash, 'n') == 1 then out[2 * i - 1] = 2 end
    end
    settled[kind][#settled[kind] + 1] = id
    dropped[#dropped + 1] = id
  end
end
if #settled.s > 0 then
  redis.call('PUBLISH', ARGV[3], cjson.encode({ids = settled.s, gen = ARGV[2], state = 'suspended', error = ''}))
end
if #settled.d > 0 then
  redis.call('PUBLISH', ARGV[3], cjson.encode({ids = settled.d, gen = ARGV[2], state = 'removed', error = ''}))
end
if #dropped > 0 then redis.call('PUBLISH', ARGV[4], cjson.encode({ARGV[5], 'sandboxes', dropped, sessions})) end
return out
"""

BACKFILL_INDEXES = _CURSOR + """
-- KEYS[1] sandboxes index  KEYS[2] the 'indexed' marker: absent (not begun), 'p <score> <id>' (partial: the
-- cursor of the last entry done), 'd' (done; no sweep under way), 'd <score> <id>' (done; a sweep round under way)
-- KEYS[3] the sweep's hash: sig, the drift (below) its round began with or it went idle with; added, the
--         entries its round under way listed  KEYS[4] count:state hash
-- ARGV[1], ARGV[2] unused (the cursor comes from KEYS[2])  ARGV[3] how many idx entries at most
-- returns 1 once every record of idx was listed in its state-and-pool index at least once, else 0.
-- Records written before these indexes existed are listed in them here, page by page, with idx's score.
-- After that, a replica of that version still running (a rolling upgrade) writes around the indexes, and only
-- then is a sweep needed. Every script of this version keeps each count:state field equal to the size of its
-- index, and their sum equal to idx's size; an earlier version's writes move the counts (or idx) but not the
-- indexes. So the drift (a digest of those differences) is read on each call, and a sweep round runs from
-- the start when it moved since the last round; a round after which it moved, or that listed anything, is
-- followed by another; one that found all as it began leaves the sweep idle, at the cost of one digest a call.
-- ZADD is idempotent, and entries only move forward (activity is GT), so a (score, id) cursor passes none by.
-- The index keys are named here, from count:state's fields (same {prefix} hash tag: one slot, as restate).
local base = string.sub(KEYS[1], 1, -4)  -- KEYS[1] is '<base>idx'
local function drift()
  local parts, total = {}, 0
  local counts = redis.call('HGETALL', KEYS[4])
  for i = 1, #counts, 2 do
    local n = tonumber(counts[i + 1])
    total = total + n
    local off = n - redis.call('ZCARD', base .. 'ix:' .. counts[i])
    if off ~= 0 then parts[#parts + 1] = counts[i] .. '=' .. off end
  end
  table.sort(parts)
  parts[#parts + 1] = tostring(redis.call('ZCARD', KEYS[1]) - total)
  return redis.sha1hex(table.concat(parts, ' '))
end
local mark = redis.call('GET', KEYS[2]) or 'p'
local done = string.sub(mark, 1, 1) == 'd'
if mark == 'd' then
  local now = drift()
  if redis.call('HGET', KEYS[3], 'sig') == now then return 1 end  -- nothing written around the indexes
  redis.call('HSET', KEYS[3], 'sig', now, 'added', 0)  -- a round, from the start
end
local at, id = string.match(mark, '^%a (%S+) (.*)$')
ARGV[1], ARGV[2] = at or '', id or ''
local start = start_after(KEYS[1])
local entries = redis.call('ZRANGE', KEYS[1], start, start + tonumber(ARGV[3]) - 1, 'WITHSCORES')
local added = 0
for i = 1, #entries, 2 do
  local h = redis.call('HMGET', base .. 's:' .. entries[i], 's', 'p')
  if h[1] and h[2] then
    added = added + redis.call('ZADD', base .. 'ix:' .. h[1] .. ':' .. h[2], entries[i + 1], entries[i])
  end
end
added = redis.call('HINCRBY', KEYS[3], 'added', added)
if #entries < 2 * tonumber(ARGV[3]) then
  -- the backfill or a round is complete: idle only when it found everything listed and nothing moved meanwhile
  local now = drift()
  if not (done and added == 0 and redis.call('HGET', KEYS[3], 'sig') == now) then now = '' end
  redis.call('HSET', KEYS[3], 'sig', now, 'added', 0)
  redis.call('SET', KEYS[2], 'd')
  return 1
end
local state = 'p'
if done then state = 'd' end
redis.call('SET', KEYS[2], state .. ' ' .. entries[#entries] .. ' ' .. entries[#entries - 1])
if done then return 1 end
return 0
"""
