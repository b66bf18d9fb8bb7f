"""The shared side of per-org limits: one token bucket and one stream-slot ledger per org in Redis.

Replicas do not ask Redis per request: :mod:`gateway.limit_leases` takes tokens and slots from
here in batches, in the background, and admits requests from what it holds. This module is only the
two scripts and their calls. Keys (``P`` the installation's prefix, ``K`` the limit key: an org ID
or ``user:<id>``, always the last component)::

    {P}:lim:rate:<K>      hash  burst/rate + 1 s   t: tokens left (may be fractional), u: updated (ms,
                                                   the Redis server's clock: replicas' clocks never mix)
    {P}:lim:streams:<K>   hash  2 x lease          <holder> -> "<slots held>:<until ms>", one field per
                                                   replica process; a field past its until is nobody's
                                                   (a replica killed with slots gives them back so)

Both scripts read the time with ``TIME`` (effects replication, the default since Redis 7; asked
for explicitly on 5 and 6) so every replica refills one bucket by one clock.
"""

from __future__ import annotations

import math

from redis.asyncio import Redis

from gateway.store.redis_errors import translated

__all__ = ["RedisLimitLedger"]

# KEYS[1] the bucket. ARGV[1] rate (tokens/s), ARGV[2] burst, ARGV[3] tokens wanted.
# Returns {granted, tokens left after the grant (a string: it may be fractional)}.
TAKE_TOKENS = """
if redis.replicate_commands then pcall(redis.replicate_commands) end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local rate, burst, want = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 't', 'u')
local tokens = tonumber(state[1]) or burst
local updated = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - updated) * rate / 1000)
local granted = math.max(0, math.min(want, math.floor(tokens)))
tokens = tokens - granted
redis.call('HSET', KEYS[1], 't', tostring(tokens), 'u', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return {granted, tostring(tokens)}
"""

# KEYS[1] the slot ledger. ARGV[1] holder, ARGV[2] slots wanted, ARGV[3] slots in use (held whatever
# the room: streams already open cannot be refused), ARGV[4] the cap, ARGV[5] lease (ms; 0 gives
# everything back). Returns {held now, room left for anyone (the cap minus everyone's held), holders}.
HOLD_SLOTS = """
if redis.replicate_commands then pcall(redis.replicate_commands) end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local me, want, used, cap, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local entries = redis.call('HGETALL', KEYS[1])
local others, holders = 0, 1
for i = 1, #entries, 2 do
  local holder, value = entries[i], entries[i + 1]
  if holder ~= me then
    local sep = string.find(value, ':', 1, true)
    local held, untl = tonumber(string.sub(value, 1, sep - 1)), tonumber(string.sub(value, sep + 1))
    if untl < now then
      redis.call('HDEL', KEYS[1], holder)
    else
      others = others + held
      holders = holders + 1
    end
  end
end
local held = math.max(math.min(want, cap - others), used, 0)
if lease > 0 and held > 0 then
  redis.call('HSET', KEYS[1], me, held .. ':' .. (now + lease))
  redis.call('PEXPIRE', KEYS[1], 2 * lease)
else
  redis.call('HDEL', KEYS[1], me)
  held = 0
end
return {held, cap - others - held, holders}
"""


class RedisLimitLedger:
    """The two scripts on the store's client (its pool, retries and timeouts) under its prefix."""

    def __init__(self, redis: Redis, prefix: str, holder: str) -> None:
        self.holder = holder
        self._prefix = prefix
        self._take = redis.register_script(TAKE_TOKENS)
        self._hold = redis.register_script(HOLD_SLOTS)

    def rate_key(self, key: str) -> str:
        return f"{{{self._prefix}}}:lim:rate:{key}"

    def streams_key(self, key: str) -> str:
        return f"{{{self._prefix}}}:lim:streams:{key}"

    @translated("take request tokens")
    async def take_tokens(self, key: str, rate: float, burst: float, want: int) -> tuple[int, float]:
        """Up to ``want`` tokens from the installation's bucket: (granted, tokens left there)."""
        granted, left = await self._take(keys=[self.rate_key(key)], args=[repr(rate), repr(burst), want])
        return int(granted), float(left)

    @translated("hold stream slots")
    async def hold_slots(self, key: str, want: int, used: int, cap: int, lease: float) -> tuple[int, int, int]:
        """Hold ``want`` of ``key``'s ``cap`` stream slots (at least ``used``) for ``lease`` seconds:
        (held, room left for anyone, holders). ``lease`` 0 gives this holder's slots back."""
        held, room, holders = await self._hold(
            keys=[self.streams_key(key)],
            args=[self.holder, want, used, cap, 0 if lease <= 0 else max(1, math.ceil(lease * 1000))])
        return int(held), int(room), int(holders)
