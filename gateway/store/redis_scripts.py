"""The Redis store's key layout (:class:`RedisKeys`) and its Lua scripts, one module constant each.

Every script receives all the keys it touches through ``KEYS`` (so it is valid
on Redis Cluster: every key of an installation carries the same ``{prefix}``
hash tag) and does all of its checks before its first write, so a script that
fails fails before writing anything. Numbers cross the boundary as strings
written by Python (``repr(float)``): Lua compares them with ``tonumber`` but never
formats one, because Lua would print only 14 significant digits.

A sandbox is one small hash (``s:<id>``), kept compact: one-letter fields, each
value short enough (at most 64 bytes for ordinary IDs) that Redis keeps the hash
as a listpack, and no per-sandbox set. It holds the record, while there is one,
and the sessions bound to the sandbox, while there are any (so the key lives as
long as either):

``s``  state: ``creating`` | ``ready`` | ``suspending`` | ``suspended`` | ``resuming`` | ``deleting`` (the
       reaper's delete in progress; ``failed`` is never stored); present iff a record is
``p``  pool        ``o``  org the caps count by (absent: no org)        ``c``  created_at
``e``  endpoint ``"<scheme> <host> <port>"`` (absent while creating)
``l``  creation, suspend or resume lease deadline (the store's clock), ``0`` once ready or suspended
``g``  a token per reservation: tells one incarnation from the next
``u``, ``b``  the owner's user and bot (``u`` absent: a record of a version that kept no owner);
``v``  the owner's org as a JSON ``[org]``, only where it differs from ``o``
``m``  meta JSON (absent when empty)
``n``  how many sessions are bound (absent: none)      ``+<session_id>``  one field per bound session
``=``  a per-session sandbox's own session's binding, folded in: ``+<session_id>`` then holds the
       binding's head (pool, isolation, created) and ``=`` its tail (the owner), each short enough
       for a listpack; that session has no ``b:`` key, and no ``seen`` entry while a record exists

A record in any state but ``suspended`` and ``deleting`` is *live* and counted once in ``count:pool[pool]``
and (when it has an org) ``count:org[org]``; every record is counted once in
``count:state["<state>:<pool>"]`` and listed once in the zset ``ix:<state>:<pool>`` (scored like ``idx``);
every script that changes a state keeps that true (``restate``).
"""

from __future__ import annotations


class RedisKeys:
    """Every key and channel name of one installation (the table is in ``gateway.store.redis``)."""

    __slots__ = ("_base", "session_seen", "sandboxes", "count_pool", "count_org", "count_state", "count_sessions",
                 "settled", "invalidate", "epoch", "indexed", "sweep")

    # Fixed parts of the variable keys; kept prefix-free (tests check it). Short on purpose:
    # a key name is paid for once per session or sandbox.
    VARIABLE = ("b:", "s:", "streams:", "replica:", "lease:", "ix:")
    FIXED = ("seen", "idx", "count:pool", "count:org", "count:state", "count:sessions", "epoch", "indexed", "sweep")

    def __init__(self, prefix: str) -> None:
        if not prefix or "{" in prefix or "}" in prefix:
            raise ValueError(f"redis key prefix {prefix!r} must be non-empty and contain no braces")
        self._base = "{" + prefix + "}:"
        self.session_seen = self._base + "seen"
        self.sandboxes = self._base + "idx"
        self.count_pool = self._base + "count:pool"
        self.count_org = self._base + "count:org"
        self.count_state = self._base + "count:state"
        self.count_sessions = self._base + "count:sessions"
        self.settled = self._base + "settled"
        self.invalidate = self._base + "invalidate"
        self.epoch = self._base + "epoch"
        self.indexed = self._base + "indexed"
        self.sweep = self._base + "sweep"

    def binding(self, session_id: str) -> str:
        return self._base + "b:" + session_id

    def sandbox(self, sandbox_id: str) -> str:
        return self._base + "s:" + sandbox_id

    def streams(self, sandbox_id: str) -> str:
        return self._base + "streams:" + sandbox_id

    def replica(self, replica_id: str) -> str:
        return self._base + "replica:" + replica_id

    def lease(self, name: str) -> str:
        return self._base + "lease:" + name

    def state_index(self, state: str, pool: str) -> str:
        """The zset of the records in ``state`` of ``pool`` (the scripts name it the same way: ``restate``)."""
        return self._base + "ix:" + state + ":" + pool


# Shared helpers, prepended to the scripts that need them.
_HELPERS = """
local RECORD = {'s', 'p', 'o', 'c', 'e', 'l', 'g', 'u', 'b', 'v', 'm'}
local function view(sandbox_key, index_key, sandbox_id)
  local h = redis.call('HMGET', sandbox_key, 's', 'p', 'o', 'c', 'e', 'l', 'g', 'u', 'b', 'v', 'm', 'n')
  if not h[1] then return false end
  h[13] = redis.call('ZSCORE', index_key, sandbox_id) or '0'
  return h
end
-- forget the record, keep the sessions bound to the sandbox (the key goes with its last field)
local function drop_record(sandbox_key)
  redis.call('HDEL', sandbox_key, unpack(RECORD))
end
-- true when a lease deadline (a record's 'l') is one of ARGV[first..], the deadlines a caller may hold
local function held(deadline, first)
  local at = tonumber(deadline or '0')
  for i = first, #ARGV do
    if tonumber(ARGV[i]) == at then return true end
  end
  return false
end
local function uncount(key, field)
  if redis.call('HINCRBY', key, field, -1) <= 0 then redis.call('HDEL', key, field) end
end
local function is_live(state)
  return state ~= 'suspended' and state ~= 'deleting'
end
-- count:state fields are '<state>:<pool>' (states hold no ':'): the gauges read one small hash. The
-- same pair names the record's entry in its state-and-pool index ('ix:<state>:<pool>', scored like idx:
-- the filtered listings and the reaper read it), moved here by every script that changes a state or
-- drops a record, so the two cannot drift; called after idx has the record's final score.
-- These index keys are named inside the script (from the record's own pool): they carry the same
-- {prefix} hash tag as the declared keys, so every script still touches one slot (what Redis Cluster checks).
local function restate(key, pool, from, to, index_key, id)
  if not pool then return end
  local base = string.sub(key, 1, -12)  -- key is '<base>count:state'
  if from then
    uncount(key, from .. ':' .. pool)
    redis.call('ZREM', base .. 'ix:' .. from .. ':' .. pool, id)
  end
  if to then
    redis.call('HINCRBY', key, to .. ':' .. pool, 1)
    redis.call('ZADD', base .. 'ix:' .. to .. ':' .. pool, redis.call('ZSCORE', index_key, id), id)
  end
end
-- a suspending or resuming record (cur: its s, p, o) -> suspended: no endpoint, not counted by the caps,
-- last activity = now (retention counts from it)
local function to_suspended(cur, sandbox_key, index_key, pool_key, org_key, state_key, id, now)
  if cur[2] then uncount(pool_key, cur[2]) end
  if cur[3] then uncount(org_key, cur[3]) end
  redis.call('HSET', sandbox_key, 's', 'suspended', 'l', '0')
  redis.call('HDEL', sandbox_key, 'e')
  redis.call('ZADD', index_key, now, id)
  restate(state_key, cur[2], cur[1], 'suspended', index_key, id)
end
-- forget a record (found: its view): its counts, its index entries; the sessions bound stay in the hash
local function release(found, sandbox_key, index_key, pool_key, org_key, state_key, id)
  local state, pool, org = found[1], found[2], found[3]
  if is_live(state) then
    if pool then uncount(pool_key, pool) end
    if org then uncount(org_key, org) end
  end
  restate(state_key, pool, state, nil, index_key, id)
  drop_record(sandbox_key)
  redis.call('ZREM', index_key, id)
end
-- the session whose binding is folded into this sandbox's hash (its '=' field), or nil: only a
-- per-session sandbox has one, and only its own session is bound to it, so its hash is small
local function folded_session(sandbox_key)
  if redis.call('HEXISTS', sandbox_key, '=') == 0 then return nil end
  for _, name in ipairs(redis.call('HKEYS', sandbox_key)) do
    if string.sub(name, 1, 1) == '+' then return string.sub(name, 2) end
  end
  return nil
end
"""

# A "view" (what the get/reserve/mark/release scripts return for a record) is the HMGET of
# {s, p, o, c, e, l, g, u, b, v, m, n} (nil where absent) followed by last_active from the index.

GET_SANDBOX = _HELPERS + """
-- KEYS[1] sandbox hash  KEYS[2] sandboxes index (zset)
-- ARGV[1] sandbox id
-- returns the record's view, or false (nil) when there is no record
return view(KEYS[1], KEYS[2], ARGV[1])
"""

GET_BINDING = """
-- KEYS[1] binding string  KEYS[2] the session's per-session sandbox hash (where a binding may be folded)
-- ARGV[1] session id
-- returns the binding as stored (a folded one rejoined), or false (nil)
local current = redis.call('GET', KEYS[1])
if current then return current end
local f = redis.call('HMGET', KEYS[2], '+' .. ARGV[1], '=')
if f[2] then return f[1] .. '\\31' .. f[2] end
return false
"""

PUT_BINDING = """
-- KEYS[1] binding string  KEYS[2] seen zset  KEYS[3] the binding's sandbox hash  KEYS[4] count:sessions hash
-- KEYS[5] the session's per-session sandbox hash (where a binding may be folded)
-- ARGV[1] binding (compact; folded: its head)  ARGV[2] session id  ARGV[3] created_at (first "seen" time)
-- ARGV[4] the binding's pool  ARGV[5] folded: the binding's tail, kept in KEYS[3] (= KEYS[5]) field '='; '' = not
-- returns the binding already stored: it wins; false (nil) when ARGV[1] was stored
local current = redis.call('GET', KEYS[1])
if current then return current end
local f = redis.call('HMGET', KEYS[5], '+' .. ARGV[2], '=')
if f[2] then return f[1] .. '\\31' .. f[2] end
local session = '+' .. ARGV[2]
if ARGV[5] == '' then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
  if redis.call('HSETNX', KEYS[3], session, '') == 1 then redis.call('HINCRBY', KEYS[3], 'n', 1) end
else
  -- folded: no key of its own; listed in seen only while its sandbox has no record (RESERVE_SANDBOX
  -- takes it out, RELEASE_SANDBOX puts it back): until then it lives as long as its sandbox
  if not redis.call('HGET', KEYS[3], 's') then redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2]) end
  if redis.call('HEXISTS', KEYS[3], session) == 0 then redis.call('HINCRBY', KEYS[3], 'n', 1) end
  redis.call('HSET', KEYS[3], session, ARGV[1], '=', ARGV[5])
end
redis.call('HINCRBY', KEYS[4], ARGV[4], 1)
return false
"""

DELETE_BINDING = _HELPERS + """
-- KEYS[1] binding string  KEYS[2] seen zset  KEYS[3] the sandbox hash named in ARGV[2]  KEYS[4] count:sessions hash
-- (a folded binding is in KEYS[3], its per-session sandbox's hash)
-- ARGV[1] session id  ARGV[2] the binding the caller read, as GET_BINDING returns it (KEYS[3] and ARGV[5] were derived from it)
-- ARGV[3] invalidate channel  ARGV[4] invalidate message  ARGV[5] the binding's pool
-- returns the deleted binding; false (nil) when there was none;
--         0 when the binding changed since the caller read it (read again and retry)
local current = redis.call('GET', KEYS[1])
local folded = false
if not current then
  local f = redis.call('HMGET', KEYS[3], '+' .. ARGV[1], '=')
  if f[2] then current, folded = f[1] .. '\\31' .. f[2], true end
end
if not current then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return false
end
if current ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('HDEL', KEYS[3], '+' .. ARGV[1]) == 1 then uncount(KEYS[3], 'n') end
if folded then redis.call('HDEL', KEYS[3], '=') end
uncount(KEYS[4], ARGV[5])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return current
"""

RESERVE_SANDBOX = _HELPERS + """
-- KEYS[1] sandbox hash  KEYS[2] sandboxes index  KEYS[3] count:pool hash  KEYS[4] count:org hash
-- KEYS[5] count:state hash  KEYS[6] seen zset  KEYS[7] the 'indexed' marker (set by the installation's first record)
-- ARGV[1] now  ARGV[2] sandbox id  ARGV[3] pool  ARGV[4] org id ('' when none)  ARGV[5] '1' when there is an org
-- ARGV[6] pool cap ('' = none)  ARGV[7] org cap ('' = none)  ARGV[8] lease_until  ARGV[9] last_active
-- ARGV[10] reservation token (gen)  ARGV[11] invalidate channel  ARGV[12] invalidate message (on a takeover)
-- ARGV[13..] the record's other fields as field, value pairs (c, u, b, v, m: those present)
-- returns {'created' | 'taken' | 'resume' | 'existing', view...}, or {'cap', 'pool' | 'org'} when a cap is reached
-- ('resume': the record was suspended, or a suspend or resume whose lease expired; it is resuming now)
local cur = redis.call('HMGET', KEYS[1], 's', 'l', 'g', 'p', 'o')
local state = cur[1]
local stale = false
if state then
  if cur[3] == ARGV[10] and (state == 'creating' or state == 'resuming') then
    -- our own reservation: this call is a retry of one that succeeded
    local mine = 'created'
    if state == 'resuming' then mine = 'resume' end
    return {mine, unpack(view(KEYS[1], KEYS[2], ARGV[2]))}
  end
  local expired = tonumber(cur[2] or '0') < tonumber(ARGV[1])
  if state == 'suspended' or (expired and (state == 'suspending' or state == 'resuming')) then
    -- wake once: the caller resumes it, under its lease, counted by the caps again
    local pool, org = cur[4], cur[5]
    local counted = 0
    if state ~= 'suspended' then counted = 1 end
    if ARGV[6] ~= '' and tonumber(redis.call('HGET', KEYS[3], pool) or '0') - counted >= tonumber(ARGV[6]) then
      return {'cap', 'pool'}
    end
    if org and ARGV[7] ~= '' and tonumber(redis.call('HGET', KEYS[4], org) or '0') - counted >= tonumber(ARGV[7]) then
      return {'cap', 'org'}
    end
    if counted == 0 then
      redis.call('HINCRBY', KEYS[3], pool, 1)
      if org then redis.call('HINCRBY', KEYS[4], org, 1) end
    end
    restate(KEYS[5], pool, state, 'resuming', KEYS[2], ARGV[2])
    redis.call('HSET', KEYS[1], 's', 'resuming', 'l', ARGV[8], 'g', ARGV[10])
    return {'resume', unpack(view(KEYS[1], KEYS[2], ARGV[2]))}
  end
  if not ((state == 'creating' or state == 'deleting') and expired) then
    return {'existing', unpack(view(KEYS[1], KEYS[2], ARGV[2]))}
  end
  stale = cur  -- a creation (or a reaper's delete) whose holder's lease expired: take it over
end
local has_org = ARGV[5] == '1'
local pool_live = tonumber(redis.call('HGET', KEYS[3], ARGV[3]) or '0')
local org_live = 0
if has_org then org_live = tonumber(redis.call('HGET', KEYS[4], ARGV[4]) or '0') end
if stale and is_live(stale[1]) then
  -- the stale record is live and counted, but it does not count against its own takeover
  if stale[4] == ARGV[3] then pool_live = pool_live - 1 end
  if has_org and stale[5] == ARGV[4] then org_live = org_live - 1 end
end
if ARGV[6] ~= '' and pool_live >= tonumber(ARGV[6]) then return {'cap', 'pool'} end
if has_org and ARGV[7] ~= '' and org_live >= tonumber(ARGV[7]) then return {'cap', 'org'} end
if stale then
  if is_live(stale[1]) then
    if stale[4] then uncount(KEYS[3], stale[4]) end
    if stale[5] then uncount(KEYS[4], stale[5]) end
  end
  restate(KEYS[5], stale[4], stale[1], nil, KEYS[2], ARGV[2])
  drop_record(KEYS[1])
end
redis.call('HSET', KEYS[1], 's', 'creating', 'l', ARGV[8], 'g', ARGV[10], 'p', ARGV[3])
if #ARGV > 12 then redis.call('HSET', KEYS[1], unpack(ARGV, 13)) end
redis.call('HINCRBY', KEYS[3], ARGV[3], 1)
if has_org then
  redis.call('HSET', KEYS[1], 'o', ARGV[4])
  redis.call('HINCRBY', KEYS[4], ARGV[4], 1)
end
if redis.call('EXISTS', KEYS[2]) == 0 then redis.call('SET', KEYS[7], 'd') end  -- nothing to backfill
redis.call('ZADD', KEYS[2], ARGV[9], ARGV[2])
restate(KEYS[5], ARGV[3], nil, 'creating', KEYS[2], ARGV[2])
local folded = folded_session(KEYS[1])
if folded then redis.call('ZREM', KEYS[6], folded) end  -- it lives as long as this record now
if stale then redis.call('PUBLISH', ARGV[11], ARGV[12]) end
local v = view(KEYS[1], KEYS[2], ARGV[2])
if stale then return {'taken', unpack(v)} end
return {'created', unpack(v)}
"""

MARK_READY = _HELPERS + """
-- KEYS[1] sandbox hash  KEYS[2] sandboxes index  KEYS[3] count:state hash
-- ARGV[1] sandbox id  ARGV[2] endpoint ("<scheme> <host> <port>")  ARGV[3] settled channel
-- ARGV[4] invalidate channel  ARGV[5] invalidate message (published after a resume: the endpoint may be new)
-- ARGV[6] now: becoming ready is activity (a creation or wake that took longer than an idle timeout, or a
--         record suspended long ago, is not idle the moment it is ready)
-- ARGV[7] '1' when the caller holds a lease to check (absent: none), ARGV[8..] the lease deadlines it may hold:
--         the record must be creating or resuming under one of them (the fence: a holder whose lease was
--         taken over completes nothing)
-- returns the ready record's view and then the state it came from; false (nil) when there is no record
-- to complete (none; without a lease to check also suspending, suspended, or being deleted); 0 when the
-- record is not reserved under a deadline the caller holds (nothing changed)
local cur = redis.call('HMGET', KEYS[1], 's', 'p', 'g', 'l')
if not cur[1] then return false end
if #ARGV > 6 then
  if cur[1] ~= 'creating' and cur[1] ~= 'resuming' then return 0 end
  if not held(cur[4], 8) then return 0 end
elseif cur[1] == 'suspending' or cur[1] == 'suspended' or cur[1] == 'deleting' then
  return false
end
redis.call('HSET', KEYS[1], 's', 'ready', 'e', ARGV[2], 'l', '0')
redis.call('ZADD', KEYS[2], 'GT', ARGV[6], ARGV[1])
restate(KEYS[3], cur[2], cur[1], 'ready', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[3], cjson.encode({id = ARGV[1], gen = cur[3] or '', state = 'ready'}))
if cur[1] == 'resuming' then redis.call('PUBLISH', ARGV[4], ARGV[5]) end
local v = view(KEYS[1], KEYS[2], ARGV[1])
v[14] = cur[1]
return v
"""

RELEASE_SANDBOX = _HELPERS + """
-- KEYS[1] sandbox hash  KEYS[2] sandboxes index  KEYS[3] count:pool hash  KEYS[4] count:org hash
-- KEYS[5] streams hash  KEYS[6] count:state hash  KEYS[7] seen zset
-- ARGV[1] sandbox id  ARGV[2] error for the waiters  ARGV[3] settled channel
-- ARGV[4] invalidate channel  ARGV[5] invalidate message
-- ARGV[6] only this endpoint ('' = any): release a ready record only while it still has that endpoint
-- ARGV[7] now: a binding folded into this hash is listed in seen from now (it outlived its sandbox)
-- ARGV[8] '1' when the caller undoes its own reservation (absent: any record), ARGV[9..] the lease deadlines
--         it may hold: only a record creating under one of them is released (else 0, nobody woken)
-- returns the removed record's view; false (nil) when there was no record (waiters are woken either way);
--         with ARGV[6] (nothing changed, nobody woken): 0 when the record does not match, -1 when there is none
local found = view(KEYS[1], KEYS[2], ARGV[1])
if ARGV[6] ~= '' then
  if not found then return -1 end
  if not (found[1] == 'ready' and found[5] == ARGV[6]) then return 0 end
end
if ARGV[8] == '1' and not (found and found[1] == 'creating' and held(found[6], 9)) then return 0 end
if found then
  release(found, KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6], ARGV[1])
  local folded = folded_session(KEYS[1])
  if folded then redis.call('ZADD', KEYS[7], ARGV[7], folded) end
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
redis.call('DEL', KEYS[5])
redis.call('PUBLISH', ARGV[3], cjson.encode({id = ARGV[1], gen = found and found[7] or '', state = 'removed',
                                             error = ARGV[2]}))
return found
"""

BEGIN_SUSPEND = _HELPERS + """
-- KEYS[1] sandbox hash  KEYS[2] sandboxes index  KEYS[3] count:state hash
-- ARGV[1] sandbox id  ARGV[2] lease_until  ARGV[3] invalidate channel  ARGV[4] invalidate message
-- ARGV[5] idle before ('' = any): refuse a record whose last activity (its index score) is at or after it
-- returns the suspending record's view; false (nil) when the record is not ready, or was active since
-- (nothing changed)
local cur = redis.call('HMGET', KEYS[1], 's', 'p')
if cur[1] ~= 'ready' then return false end
if ARGV[5] ~= '' then
  local at = redis.call('ZSCORE', KEYS[2], ARGV[1])
  if at and tonumber(at) >= tonumber(ARGV[5]) then return false end
end
restate(KEYS[3], cur[2], 'ready', 'suspending', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], 's', 'suspending', 'l', ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return view(KEYS[1], KEYS[2], ARGV[1])
"""

EXTEND_LEASE = _HELPERS + """
-- KEYS[1] sandbox hash
-- ARGV[1] the new deadline  ARGV[2..] the deadlines the caller may hold (its last confirmed one, and those
--         of renewals whose answer was lost: they may have run)
-- returns 1 when the record is creating, suspending, resuming or deleting under one of them (now ARGV[1]);
-- 0 when the caller holds it no more (settled, released, or taken over: a takeover writes a new deadline)
local cur = redis.call('HMGET', KEYS[1], 's', 'l')
if cur[1] ~= 'creating' and cur[1] ~= 'suspending' and cur[1] ~= 'resuming' and cur[1] ~= 'deleting' then return 0 end
if not held(cur[2], 2) then return 0 end
redis.call('HSET', KEYS[1], 'l', ARGV[1])
return 1
"""

MARK_SUSPENDED = _HELPERS + """
-- KEYS[1] sandbox hash  KEYS[2] sandboxes index  KEYS[3] count:pool hash  KEYS[4] count:org hash
-- KEYS[5] count:state hash
-- ARGV[1] sandbox id  ARGV[2] now (the new last activity: retention counts from it)  ARGV[3] error ('' = none)
-- ARGV[4] settled channel  ARGV[5] invalidate channel  ARGV[6] invalidate message
-- ARGV[7] '1' when the caller holds a lease to check (absent: none), ARGV[8..] the lease deadlines it may hold
-- returns the suspended record's view; false (nil) unless it was suspending or resuming (under one of
-- those deadlines, when given): nothing changed
local cur = redis.call('HMGET', KEYS[1], 's', 'p', 'o', 'g', 'l')
if cur[1] ~= 'suspending' and cur[1] ~= 'resuming' then return false end
if ARGV[7] == '1' and not held(cur[5], 8) then return false end
to_suspended(cur, KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], ARGV[2])
redis.call('PUBLISH', ARGV[4], cjson.encode({id = ARGV[1], gen = cur[4] or '', state = 'suspended', error = ARGV[3]}))
redis.call('PUBLISH', ARGV[5], ARGV[6])
return view(KEYS[1], KEYS[2], ARGV[1])
"""


RELEASE_LEASE = """
-- KEYS[1] lease hash {holder, until}
-- ARGV[1] holder
-- returns 1 when ARGV[1] held the lease and it is gone now, 0 when someone else holds it (left alone)
if redis.call('HGET', KEYS[1], 'holder') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""

ACQUIRE_LEASE = """
-- KEYS[1] lease hash {holder, until}
-- ARGV[1] holder  ARGV[2] now (the store's clock)  ARGV[3] until = now + ttl  ARGV[4] ttl in milliseconds
-- returns 1 when ARGV[1] now holds the lease (taken or renewed), 0 while another holder's lease runs.
-- A lease ends when its deadline passes on the store's clock or when Redis expires the key, whichever
-- is first: with the real clock they agree, and an injected clock drives expiry in tests.
local current = redis.call('HMGET', KEYS[1], 'holder', 'until')
if current[1] and current[1] ~= ARGV[1] and tonumber(current[2]) >= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'until', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""
