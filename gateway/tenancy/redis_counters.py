"""The clients' counters in Redis (or Valkey): one budget for every gateway process using it.

The arithmetic is :class:`~gateway.tenancy.counters.LocalStore`'s, run server-side as one Lua
script per operation, so a take over several meters is atomic across processes (Redis runs a
script alone). A request costs two round trips: :meth:`RedisCounters.enter_take` (the lease
and the meters in one script) before its call and :meth:`RedisCounters.settle_leave` after.
Levels and stamps travel as ``%.17g`` text, which both Lua and Python read back to the same
double, and the reading is computed in Python from the levels the script returns,
with the same function LocalStore uses: the two stores answer alike to the last bit.

Keys: ``llmgw:m:<meter key>`` a hash ``{l: level, t: stamp}``; ``llmgw:c:<key>`` a sorted set
of leases scored by their expiry. A meter's key expires once the meter would be full again
plus one period (an absent meter reads as full, so expiry changes nothing); a lease set expires
with its last lease.

Time is the caller's ``now`` (wall-clock seconds, ``time.time()``, in every process), not
Redis's ``TIME``: the store answers what LocalStore answers for the same calls (the contract
tests run one table against both), and replicas' clocks agree to milliseconds under NTP, far
below a bucket's refill step. A stamp never moves backwards: a process whose clock is behind
sees no refill from the others' later stamps, instead of granting the skew twice.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.tenancy.counters import Meter, Reading, SlotLease, reading
from gateway.tenancy.resp import (
    Arg,
    Redis,
    RedisError,
    Reply,
    Script,
    StoreFailed,
    bulk,
    parse_url,
)
from gateway.tenancy.store_errors import StoreErrors

PREFIX = "llmgw:"
_MAX_CACHED = 4096  # meters whose encoded key, limit and period are kept

# Shared by take and settle: a meter's level at now (absent: full), as counters.level_now.
_LEVEL = """
local function level(key, limit, rate, now)
  local got = redis.call('HMGET', key, 'l', 't')
  if not got[1] then return limit, now end
  local lv, stamp = tonumber(got[1]), tonumber(got[2])
  local dt = now - stamp
  if dt < 0 then dt = 0 end
  return math.min(limit, lv + dt * rate), math.max(stamp, now)
end
local function store(key, lv, stamp, limit, rate, period)
  redis.call('HSET', key, 'l', string.format('%.17g', lv), 't', string.format('%.17g', stamp))
  redis.call('PEXPIRE', key, math.ceil(math.min(1e12, ((limit - lv) / rate + period) * 1000)))
end
"""

# KEYS: meters; ARGV: now, then limit, period, need per meter
# -> {1 or 0, level per meter (after the take when it passed)}
_TAKE = Script(
    _LEVEL
    + """
local now = tonumber(ARGV[1])
local levels, stamps, out, ok = {}, {}, {}, 1
for i, key in ipairs(KEYS) do
  local limit, period = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i])
  local need = tonumber(ARGV[3 * i + 1])
  levels[i], stamps[i] = level(key, limit, limit / period, now)
  if levels[i] < math.min(need, limit) then ok = 0 end
end
for i, key in ipairs(KEYS) do
  if ok == 1 then
    local limit, period = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i])
    levels[i] = levels[i] - tonumber(ARGV[3 * i + 1])
    store(key, levels[i], stamps[i], limit, limit / period, period)
  end
  out[i + 1] = string.format('%.17g', levels[i])
end
out[1] = ok
return out
"""
)

# KEYS: meters; ARGV: now, then limit, period, amount per meter
_SETTLE = Script(
    _LEVEL
    + """
local now = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  local limit, period = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i])
  local rate = limit / period
  local lv, stamp = level(key, limit, rate, now)
  store(key, math.min(limit, lv - tonumber(ARGV[3 * i + 1])), stamp, limit, rate, period)
end
return 1
"""
)

# KEYS: the lease set; ARGV: limit, lease, now, ttl -> 1 held, 0 all taken
_ENTER = Script(
    """
local limit, now, ttl = tonumber(ARGV[1]), tonumber(ARGV[3]), tonumber(ARGV[4])
if redis.call('ZCARD', KEYS[1]) >= limit then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.17g', now))
  if redis.call('ZCARD', KEYS[1]) >= limit then return 0 end
end
redis.call('ZADD', KEYS[1], string.format('%.17g', now + ttl), ARGV[2])
local want = math.ceil(ttl * 1000) + 1000
if redis.call('PTTL', KEYS[1]) < want then redis.call('PEXPIRE', KEYS[1], want) end
return 1
"""
)


# KEYS: meters, then the lease set if any; ARGV: now, the number of meters, limit, period,
# need per meter, then the lease's limit, name and ttl -> {-1}: every lease held (nothing
# touched); else _TAKE's reply, the lease added when the take passed
_ENTER_TAKE = Script(
    _LEVEL
    + """
local now, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local leases = KEYS[n + 1]
local climit = tonumber(ARGV[3 * n + 3])
if leases and redis.call('ZCARD', leases) >= climit then
  redis.call('ZREMRANGEBYSCORE', leases, '-inf', string.format('%.17g', now))
  if redis.call('ZCARD', leases) >= climit then return {-1} end
end
local levels, stamps, out, ok = {}, {}, {}, 1
for i = 1, n do
  local limit, period = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  local need = tonumber(ARGV[3 * i + 2])
  levels[i], stamps[i] = level(KEYS[i], limit, limit / period, now)
  if levels[i] < math.min(need, limit) then ok = 0 end
end
for i = 1, n do
  if ok == 1 then
    local limit, period = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
    levels[i] = levels[i] - tonumber(ARGV[3 * i + 2])
    store(KEYS[i], levels[i], stamps[i], limit, limit / period, period)
  end
  out[i + 1] = string.format('%.17g', levels[i])
end
out[1] = ok
if ok == 1 and leases then
  local ttl = tonumber(ARGV[3 * n + 5])
  redis.call('ZADD', leases, string.format('%.17g', now + ttl), ARGV[3 * n + 4])
  local want = math.ceil(ttl * 1000) + 1000
  if redis.call('PTTL', leases) < want then redis.call('PEXPIRE', leases, want) end
end
return out
"""
)

# KEYS: meters, then the lease set if any; ARGV: now, the number of meters, limit, period,
# amount per meter, then the lease's name
_SETTLE_LEAVE = Script(
    _LEVEL
    + """
local now, n = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 1, n do
  local limit, period = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  local rate = limit / period
  local lv, stamp = level(KEYS[i], limit, rate, now)
  store(KEYS[i], math.min(limit, lv - tonumber(ARGV[3 * i + 2])), stamp, limit, rate, period)
end
if KEYS[n + 1] then redis.call('ZREM', KEYS[n + 1], ARGV[3 * n + 3]) end
return 1
"""
)


def _num(text: str) -> float:
    return float(text)


class RedisCounters:
    """The :class:`~gateway.tenancy.counters.CounterStore` in Redis. Every failure raises
    :class:`~gateway.tenancy.counters.CountersUnavailable`, after counting it in ``errors``
    (the metric and the rate-limited log line): the caller applies ``on_store_error`` and
    counts nothing itself."""

    __slots__ = ("_errors", "_meters", "_redis")

    def __init__(self, url: str, timeout: float, errors: StoreErrors | None = None) -> None:
        self._redis = Redis(parse_url(url), timeout)
        self._errors = errors
        self._meters: dict[Meter, tuple[bytes, bytes, bytes]] = {}

    @property
    def redis(self) -> Redis:
        return self._redis

    def _failed(self, exc: StoreFailed) -> StoreFailed:
        if self._errors is not None:
            self._errors.failed(exc)
        return exc

    async def _run(self, script: Script, nkeys: int, parts: Sequence[bytes]) -> Reply:
        try:
            return await script.run(self._redis, nkeys, parts)
        except StoreFailed as exc:
            raise self._failed(exc) from None

    def _meter_parts(
        self, meters: Sequence[Meter], amounts: Sequence[int], now: float
    ) -> list[bytes]:
        """The scripts' keys and arguments, each a bulk string; a meter's key, limit and period
        are encoded once (meters come from the configured clients: a bounded set)."""
        cached = self._meters
        keys, args = [], [bulk(repr(float(now)))]
        for m, n in zip(meters, amounts, strict=True):
            got = cached.get(m)
            if got is None:
                if len(cached) >= _MAX_CACHED:
                    cached.clear()
                got = cached[m] = (
                    bulk(PREFIX + "m:" + m.key),
                    bulk(m.limit),
                    bulk(repr(float(m.period))),
                )
            keys.append(got[0])
            args += (got[1], got[2], bulk(int(n)))
        return keys + args

    def _leased_parts(
        self,
        meters: Sequence[Meter],
        amounts: Sequence[int],
        now: float,
        lease: SlotLease | None,
        lease_args: tuple[Arg, ...],
    ) -> tuple[int, list[bytes]]:
        """The merged scripts' key count and parts: the meters' keys, the lease set's, then
        now, the meter count, the meters' arguments and ``lease_args``."""
        parts = self._meter_parts(meters, amounts, now)
        n = len(meters)
        keys, args = parts[:n], parts[n:]
        if lease is None:
            return n, [*keys, args[0], bulk(n), *args[1:]]
        tail = [bulk(a) for a in lease_args]
        return n + 1, [*keys, bulk(PREFIX + "c:" + lease.key), args[0], bulk(n), *args[1:], *tail]

    async def enter_take(
        self, meters: Sequence[Meter], needs: Sequence[int], now: float, lease: SlotLease | None
    ) -> Reading | None:
        extra: tuple[Arg, ...] = ()
        if lease is not None:
            extra = (lease.limit, lease.name, repr(float(lease.ttl)))
        nkeys, parts = self._leased_parts(meters, needs, now, lease, extra)
        reply = await self._run(_ENTER_TAKE, nkeys, parts)
        if reply == [-1]:
            return None
        return self._reading(reply, meters, needs)

    async def settle_leave(
        self, meters: Sequence[Meter], amounts: Sequence[int], now: float, lease: SlotLease | None
    ) -> None:
        extra: tuple[Arg, ...] = () if lease is None else (lease.name,)
        nkeys, parts = self._leased_parts(meters, amounts, now, lease, extra)
        await self._run(_SETTLE_LEAVE, nkeys, parts)

    async def take(self, meters: Sequence[Meter], needs: Sequence[int], now: float) -> Reading:
        reply = await self._run(_TAKE, len(meters), self._meter_parts(meters, needs, now))
        return self._reading(reply, meters, needs)

    def _reading(self, reply: Reply, meters: Sequence[Meter], needs: Sequence[int]) -> Reading:
        try:
            assert isinstance(reply, list) and len(reply) == len(meters) + 1
            levels = [_num(x.decode()) for x in reply[1:]]  # type: ignore[union-attr]
            ok = reply[0] == 1
        except (AssertionError, AttributeError, ValueError):
            raise self._failed(StoreFailed("protocol", "unexpected script reply")) from None
        return reading(ok, meters, levels, needs)

    async def settle(self, meters: Sequence[Meter], amounts: Sequence[int], now: float) -> None:
        await self._run(_SETTLE, len(meters), self._meter_parts(meters, amounts, now))

    async def enter(self, key: str, limit: int, lease: str, now: float, ttl: float) -> bool:
        args: tuple[Arg, ...] = (
            PREFIX + "c:" + key,
            limit,
            lease,
            repr(float(now)),
            repr(float(ttl)),
        )
        reply = await self._run(_ENTER, 1, [bulk(a) for a in args])
        return reply == 1

    async def leave(self, key: str, lease: str) -> None:
        try:
            reply = await self._redis.call("ZREM", PREFIX + "c:" + key, lease)
        except StoreFailed as exc:
            raise self._failed(exc) from None
        if isinstance(reply, RedisError):
            raise self._failed(StoreFailed("reply", reply.code))

    async def ping(self) -> bool:
        """Connect now (at start, so the first request finds the connection made); False
        when Redis cannot be reached (counted like any failure)."""
        try:
            reply = await self._redis.call("PING")
        except StoreFailed as exc:
            self._failed(exc)
            return False
        return reply == b"PONG"

    async def close(self) -> None:
        await self._redis.close()
