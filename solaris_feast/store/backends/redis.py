"""One Redis: Feast's layout (one hash per entity key holding every view of that key), read in one
round trip per call and written with two transactions in flight.

Reads: N ``HMGET`` on the (user, item) hashes (pair and similar fields together), one on the user
hash and a ``GET`` of the miss queue's round counter, in one pipeline. The deadline bounds the
read itself: the connect, the send and every receive wait at most what is left of it, and a read
that cannot finish in time is aborted (its connection dropped, since unread replies would be
handed to the next caller).

Writes: newest wins, atomically. Each chunk of rows is one Lua script (compare the stored
``_ts:<view>`` with the new one, write when the new one is not older, ties to the later write);
up to ``atomic_rows`` rows go in one ``MULTI``/``EXEC``, so a crash mid-transaction stores all of
it or none and no reader sees part of it. A batch's transactions are sent on one connection, the
next one before the answers of the one before are read
(:data:`~solaris_feast.store.layout.DEFAULT_TRANSACTIONS_IN_FLIGHT`, the writer's ``in_flight``).

The commands of the read and the write are packed by hand (``packed=True``): their shape never
changes, and redis-py's generic packer and pipeline cost as much as the network round trip at
N = 100 (``solaris bench serve`` and ``bench write`` measure both side by side). ``packed=False``
sends the same commands through a redis-py pipeline: the reference the fast path is checked
against, and the contender in the benchmarks.

Miss queue: a stream ``solaris:{project}:misses``, per-pair markers with a TTL, a round counter
(see :mod:`solaris_feast.serving.miss_queue`); each operation is one Lua script.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from solaris_feast.columns import COMPUTED_AT, ITEM_ID, MODEL_VERSION, USER_ID
from solaris_feast.errors import (
    ConfigError,
    DeadlineExceededError,
    RetryableStoreError,
    describe_error,
    is_retryable,
)
from solaris_feast.store.backends import (
    READ_FEATURES,
    BackendKind,
    OnlineBatch,
    OnlineFacts,
    QueuedMiss,
    StoredScan,
    StoredValues,
    TierReads,
    online_facts,
    split_tiers,
)
from solaris_feast.store.ids import EntityId, decode_id, encode_id
from solaris_feast.store.layout import (
    DEFAULT_TRANSACTIONS_IN_FLIGHT,
    ByteColumn,
    SolarisKeyLayouts,
    check_serialization_version,
    miss_marker_prefix,
    miss_round_key,
    miss_stream_key,
    online_field,
    timestamp_field,
)
from solaris_feast.tiers import SEARCH_ORDER, Tier

if TYPE_CHECKING:
    from feast import FeatureStore

logger = logging.getLogger(__name__)

NANOS_PER_SECOND = 1_000_000_000
SCAN_READ_BATCH = 500
"""Keys per HMGET pipeline of a status scan."""

# Newest-wins write of a chunk of rows. ARGV: ts field, number of features F, key TTL (0 = none),
# the F field names, then per key: the Timestamp proto bytes and the F values. Timestamps are
# compared as (seconds, nanos) parsed from the protobuf varints: Lua numbers are doubles, which
# cannot hold nanoseconds since 1970 exactly.
WRITE_SCRIPT = """
local function varint(s, pos)
  local result, mult = 0, 1
  while pos <= #s do
    local b = string.byte(s, pos)
    pos = pos + 1
    result = result + (b % 128) * mult
    if b < 128 then return result, pos end
    mult = mult * 128
  end
  return result, pos
end
local function parse_ts(s)
  local secs, nanos, pos = 0, 0, 1
  while pos <= #s do
    local tag = string.byte(s, pos)
    local v
    v, pos = varint(s, pos + 1)
    if tag == 8 then secs = v elseif tag == 16 then nanos = v end
  end
  return secs, nanos
end
-- The seconds of a Timestamp without the varint loop: seconds from 1978 to 3058 are tag 8 and
-- exactly 5 varint bytes, read in one string.byte (over an older stored time: 7.9 -> 7.3 us a
-- row in Redis).
-- Anything else (no seconds field, another length) takes the loop.
local function ts_seconds(s)
  local tag, b1, b2, b3, b4, b5 = string.byte(s, 1, 6)
  if tag == 8 and b5 and b5 < 128 and b1 >= 128 and b2 >= 128 and b3 >= 128 and b4 >= 128 then
    return (b1 - 128) + (b2 - 128) * 128 + (b3 - 128) * 16384 + (b4 - 128) * 2097152
      + b5 * 268435456
  end
  return (parse_ts(s))
end
local ts_field = ARGV[1]
local nf = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local base = 3 + nf
local applied = 0
-- One HSET argument table for every row: the field names stay, each row sets its values
-- (a table built per row was about a fifth of the script's time).
local args = {ts_field, false}
for f = 1, nf do args[1 + 2 * f] = ARGV[3 + f] end
for k = 1, #KEYS do
  local off = base + (k - 1) * (nf + 1)
  local new_ts = ARGV[off + 1]
  local old_ts = redis.call('HGET', KEYS[k], ts_field)
  local write = true
  -- Equal bytes are an equal time (a rewrite of the same round): written again, as before.
  if old_ts and old_ts ~= new_ts then
    local os, ns = ts_seconds(old_ts), ts_seconds(new_ts)
    if ns < os then
      write = false
    elseif ns == os then
      local _, on = parse_ts(old_ts)
      local _, nn = parse_ts(new_ts)
      if nn < on then write = false end
    end
  end
  if write then
    args[2] = new_ts
    for f = 1, nf do args[2 + 2 * f] = ARGV[off + 1 + f] end
    redis.call('HSET', KEYS[k], unpack(args))
    if ttl > 0 then redis.call('EXPIRE', KEYS[k], ttl) end
    applied = applied + 1
  end
end
return applied
"""

# One round trip for a whole fetch's misses; SET NX is the dedupe, so two servers missing the
# same pair at the same moment still queue it once. The round counter (KEYS[2]) is started at
# the server's clock in microseconds where it is missing: a retriever skips the pairs it queued
# until the counter changes, and a Redis restarted empty (markers and queue gone) must change
# it, even before any drain has bumped it (absent before and after would read as no change).
RECORD_SCRIPT = """
local stream = KEYS[1]
local marker_prefix = ARGV[1]
local ttl = tonumber(ARGV[2])
local maxlen = ARGV[3]
local user = ARGV[4]
local version = ARGV[5]
local now = ARGV[6]
local queued = 0
for i = 7, #ARGV do
  local item = ARGV[i]
  if redis.call('SET', marker_prefix .. user .. ':' .. item, '1', 'NX', 'EX', ttl) then
    redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*',
      'user_id', user, 'item_id', item, 'model_version', version, 'missed_at', now)
    queued = queued + 1
  end
end
if queued > 0 and redis.call('EXISTS', KEYS[2]) == 0 then
  local t = redis.call('TIME')
  redis.call('SET', KEYS[2], t[1] .. string.format('%06d', tonumber(t[2])))
end
return queued
"""

DRAIN_SCRIPT = """
local stream = KEYS[1]
local marker_prefix = ARGV[1]
local count = tonumber(ARGV[2])
local entries = redis.call('XRANGE', stream, '-', '+', 'COUNT', count)
for _, entry in ipairs(entries) do
  local f = entry[2]
  local user, item
  for j = 1, #f, 2 do
    if f[j] == 'user_id' then user = f[j + 1] elseif f[j] == 'item_id' then item = f[j + 1] end
  end
  redis.call('XDEL', stream, entry[1])
  redis.call('DEL', marker_prefix .. user .. ':' .. item)
end
if #entries > 0 then redis.call('INCR', KEYS[2]) end
return entries
"""

# Acknowledge entries a consumer group has finished: XACK, drop them from the stream and their
# markers (so the pair can be queued again next round), bump the round. One script, so a crash
# cannot acknowledge an entry and leave its marker blocking the pair until the marker expires.
ACK_SCRIPT = """
local stream = KEYS[1]
local group = ARGV[1]
local marker_prefix = ARGV[2]
local acked = 0
for i = 3, #ARGV, 2 do
  local n = redis.call('XACK', stream, group, ARGV[i])
  if n > 0 then
    redis.call('XDEL', stream, ARGV[i])
    redis.call('DEL', marker_prefix .. ARGV[i + 1])
    acked = acked + n
  end
end
if acked > 0 then redis.call('INCR', KEYS[2]) end
return acked
"""


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


def _as_bytes(values: Sequence[Any]) -> list[bytes]:
    return [v if isinstance(v, bytes) else str(v).encode() for v in values]


class _RespRows:
    """Each row's values as consecutive RESP bulk strings, so a chunk of rows is one slice.

    Columns that all have one width per column (:class:`ByteColumn` matrices: Int64 keys,
    vectors, a round's version and time) are packed with numpy, a few copies for the whole batch;
    any other column makes the rows Python bytes, one join per row.
    """

    def __init__(self, columns: list[ByteColumn], suffix: bytes = b"") -> None:
        self.width = len(columns)
        """Bulk strings a row."""
        self._matrix: np.ndarray | None = None
        self._rows: list[bytes] = []
        matrices = [c.matrix for c in columns if c.matrix is not None]
        if len(matrices) == len(columns):
            n = len(columns[0])
            parts: list[np.ndarray] = []
            for m in matrices:
                header = b"$%d\r\n" % (m.shape[1] + len(suffix))
                parts += [_repeated(header, n), m, _repeated(suffix + b"\r\n", n)]
            self._matrix = np.concatenate(parts, axis=1)
        else:
            lists = [c.tolist() for c in columns]
            self._rows = [
                b"".join(bulk(v + suffix) for v in row) for row in zip(*lists, strict=True)
            ]

    def chunk(self, start: int, stop: int) -> bytes:
        if self._matrix is not None:
            return self._matrix[start:stop].tobytes()
        return b"".join(self._rows[start:stop])


def _repeated(value: bytes, n: int) -> np.ndarray:
    """``(n, len(value))`` uint8, ``value`` on every row (a view, for concatenation)."""
    return np.broadcast_to(np.frombuffer(value, dtype=np.uint8), (n, len(value)))


def _interrupted(
    view_name: str, exc: BaseException, n: int, unsure_lo: int, unsure_hi: int
) -> RetryableStoreError:
    """What a write lost to a dropped connection or a timeout raises: rows before ``unsure_lo``
    are stored, each transaction of rows ``unsure_lo..unsure_hi`` whole or not at all."""
    return RetryableStoreError(
        f"{view_name}: Redis failed while writing rows {unsure_lo}-{unsure_hi - 1} of {n} "
        f"({describe_error(exc)}); rows before {unsure_lo} are stored, each transaction of rows "
        f"{unsure_lo}-{unsure_hi - 1} whole or not at all; write the batch again (rewrites "
        "are idempotent)"
    )


_MULTI = b"*1\r\n$5\r\nMULTI\r\n"
_EXEC = b"*1\r\n$4\r\nEXEC\r\n"
_EVAL_SCRIPT = bulk(b"EVAL") + bulk(WRITE_SCRIPT.encode())


def _hmget_template(fields: list[bytes]) -> tuple[bytes, bytes]:
    """RESP bytes of ``HMGET <key> <fields...>`` before and after the key."""
    head = b"*%d\r\n$5\r\nHMGET\r\n" % (len(fields) + 2)
    tail = b"".join(bulk(f) for f in fields)
    return head, tail


def parse_connection_string(connection_string: str) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """Nodes and options of Feast's ``host:port[,host:port...],key=value,...`` form, parsed as
    ``RedisOnlineStore._parse_connection_string`` does (values JSON-decoded where they parse);
    kept here so a task that only touches Redis need not import Feast, and pinned to Feast's
    parser by ``tests/test_backends.py``."""
    nodes = [
        dict(zip(["host", "port"], part.split(":"), strict=False))
        for part in connection_string.split(",")
        if "=" not in part
    ]
    params: dict[str, Any] = {}
    for part in connection_string.split(","):
        if "=" in part:
            key, raw = part.split("=", 1)
            try:
                params[key] = json.loads(raw)
            except json.JSONDecodeError:
                params[key] = raw
    return nodes, params


def connection_kwargs(
    store: FeatureStore | OnlineFacts,
) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """Nodes and client options from the store's ``connection_string``."""
    nodes, params = parse_connection_string(online_facts(store).connection_string)
    kwargs = {
        k: v
        for k, v in params.items()
        if k in {"db", "password", "username", "ssl", "socket_keepalive"}
    }
    return nodes, kwargs


def redis_client(store: FeatureStore | OnlineFacts, timeout_seconds: float | None = None) -> Any:
    """A redis-py client on the store's Redis (a ``RedisCluster`` for ``redis_cluster``), with no
    retries (fallback code retries itself); ``redis_sentinel`` is refused."""
    from solaris_feast.store.backends import redis_type

    if redis_type(store) == "redis_cluster":
        from solaris_feast.store.backends.redis_cluster import cluster_client

        return cluster_client(store, timeout_seconds)
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    nodes, kwargs = connection_kwargs(store)
    if not nodes or not str(nodes[0].get("port", "")).isdigit():
        from solaris_feast.errors import ConfigError

        raise ConfigError(
            f"the Redis connection_string names no host:port with a numeric port "
            f"(first node {nodes[0] if nodes else None}): write it as host:port[,db=N,...]"
        )
    return redis.Redis(
        host=nodes[0]["host"],
        port=int(nodes[0]["port"]),
        socket_timeout=timeout_seconds,
        socket_connect_timeout=timeout_seconds,
        retry=Retry(NoBackoff(), 0),
        **kwargs,
    )


def _glob_escaped(text: str) -> str:
    """``text`` matched literally by a ``SCAN MATCH`` pattern."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _is_nogroup(exc: BaseException) -> bool:
    """Redis's answer for a stream or consumer group that does not exist."""
    return str(exc).startswith("NOGROUP")


def _remaining(deadline_s: float, deadline_ms: float, what: str) -> float:
    left = deadline_s - time.perf_counter()
    if left <= 0:
        raise DeadlineExceededError(what, deadline_ms)
    return left


class DeadlineConnections:
    """Connections for reads bounded by a deadline, made like the client's own.

    redis-py's pool connects (and runs its handshake) with the client's fixed timeouts, inside
    ``get_connection``; a read that must end at a deadline needs every wait, the connect
    included, to get only what is left of it. So reads keep their own few connections, built
    from the pool's class and arguments: a new one connects within the remaining time, and
    before the send and each receive the socket timeout is set to what is left. A connection
    whose round trip failed or was aborted is dropped (unread replies would reach the next
    read). Uses redis-py 8's connection API (``connection_class``/``connection_kwargs``,
    ``read_response(timeout=...)``); ``pyproject.toml`` pins it.
    """

    def __init__(self, client: Any) -> None:
        import threading

        self._pool = client.connection_pool
        self._idle: list[Any] = []
        self._lock = threading.Lock()

    def round_trip(
        self, payload: bytes, replies: int, deadline_s: float, deadline_ms: float
    ) -> list[Any]:
        import redis

        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is not None:
            try:
                return self._exchange(conn, payload, replies, deadline_s, deadline_ms)
            except redis.ConnectionError:
                # A kept connection the server closed while it was idle (a restart, a failover,
                # its idle timeout): the others kept from before it are as likely gone, so they
                # go too, and the read, which changes nothing, is sent once more on a new
                # connection within what is left of the deadline. Without this every kept
                # connection failed one request after a restart (redis-py's pool checks a
                # connection before lending it; these are not lent by the pool).
                self.close()
        return self._exchange(None, payload, replies, deadline_s, deadline_ms)

    def _exchange(
        self, conn: Any, payload: bytes, replies: int, deadline_s: float, deadline_ms: float
    ) -> list[Any]:
        """One send and its replies on ``conn`` (a new connection when None); the connection is
        kept for the next read when every reply came, dropped otherwise."""
        import redis

        what = "Redis read"
        try:
            if conn is None:
                left = _remaining(deadline_s, deadline_ms, what)
                kwargs = dict(self._pool.connection_kwargs)
                kwargs.update(socket_timeout=left, socket_connect_timeout=left)
                conn = self._pool.connection_class(**kwargs)
                conn.connect()
            # sendall's timeout bounds the whole send (Python >= 3.5), not each chunk.
            conn._sock.settimeout(_remaining(deadline_s, deadline_ms, what))
            conn.send_packed_command([payload], check_health=False)
            answers = []
            for _ in range(replies):
                left = _remaining(deadline_s, deadline_ms, what)
                answers.append(conn.read_response(timeout=left))
        except BaseException as exc:
            if conn is not None:
                conn.disconnect()
            # The socket's clock and perf_counter differ by a little: a connect, send or
            # receive that timed out within a millisecond of the deadline ran into it.
            if isinstance(exc, redis.TimeoutError) and time.perf_counter() >= deadline_s - 0.001:
                raise DeadlineExceededError(what, deadline_ms) from exc
            raise
        with self._lock:
            self._idle.append(conn)
        return answers

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.disconnect()


class RedisBackend(SolarisKeyLayouts):
    """One Redis server (see the module docstring for layout, atomicity and cost).

    Args:
        client: a redis-py ``Redis`` (its pool is shared safely between threads).
        project: the Feast project.
        serialization_version: Feast's ``entity_key_serialization_version``.
        packed: hand-packed RESP for reads and batch writes (True) or a redis-py pipeline.
    """

    kind: BackendKind = "redis"
    reads_miss_round = True

    def __init__(
        self, client: Any, project: str, serialization_version: int = 3, *, packed: bool = True
    ) -> None:
        self.client = client
        self.project = project
        self.packed = packed
        self._project_bytes = project.encode()
        check_serialization_version(serialization_version)
        self.serialization_version = serialization_version
        self._stream_key = miss_stream_key(project)
        self._round_key = miss_round_key(project)
        self._marker_prefix = miss_marker_prefix(project)
        round_key = self._round_key.encode()
        self._round_command = b"*2\r\n$3\r\nGET\r\n%s" % bulk(round_key)
        self._read_fields: dict[tuple[str, ...], tuple[list[bytes], list[bytes]]] = {}
        self._scripts: dict[str, Any] = {}
        # Made on the first packed read: a cluster client has no single pool to take it from.
        self._reads: DeadlineConnections | None = None

    @classmethod
    def for_store(
        cls, store: FeatureStore | OnlineFacts, timeout_seconds: float | None
    ) -> RedisBackend:
        facts = online_facts(store)
        return cls(redis_client(facts, timeout_seconds), facts.project, facts.serialization_version)

    # -- reading ------------------------------------------------------------------------------

    def read_fields(self, views: Mapping[Tier, str]) -> tuple[list[bytes], list[bytes]]:
        """Hash fields of a serving read: pair then similar on the pair hash, and the user's."""
        cache_key = tuple(views[t] for t in SEARCH_ORDER)
        if cache_key not in self._read_fields:
            pair, similar, user = cache_key
            pair_fields = [online_field(pair, f) for f in READ_FEATURES] + [
                online_field(similar, f) for f in READ_FEATURES
            ]
            user_fields = [online_field(user, f) for f in READ_FEATURES]
            self._read_fields[cache_key] = (pair_fields, user_fields)
        return self._read_fields[cache_key]

    def read_tiers(
        self, user: EntityId, items: np.ndarray, views: Mapping[Tier, str], deadline_s: float
    ) -> TierReads:
        return self.read_tiers_many([(user, items)], views, deadline_s)[0]

    def read_tiers_many(
        self,
        requests: Sequence[tuple[EntityId, np.ndarray]],
        views: Mapping[Tier, str],
        deadline_s: float,
    ) -> list[TierReads]:
        deadline_ms = self._deadline_ms(deadline_s)
        pair_fields, user_fields = self.read_fields(views)
        project = self._project_bytes
        pair_key = self.pair_key.key
        keyed = [
            ([pair_key(user, item) + project for item in items.tolist()], self.user_key.key(user))
            for user, items in requests
        ]
        if not self.packed:
            out = []
            for keys, user_key in keyed:
                replies = self._pipeline_read(
                    keys, user_key + project, pair_fields, user_fields, deadline_s
                )
                out.append(
                    TierReads(split_tiers(replies[:-2], replies[-2], len(keys)), replies[-1])
                )
            return out
        # Every request's HMGETs (its pairs, then its user) and one GET of the round, sent
        # together: one round trip for the batch.
        pair_head, pair_tail = _hmget_template(pair_fields)
        user_head, user_tail = _hmget_template(user_fields)
        parts: list[bytes] = []
        for keys, user_key in keyed:
            parts.extend(b"%s%s%s" % (pair_head, bulk(key), pair_tail) for key in keys)
            parts.append(b"%s%s%s" % (user_head, bulk(user_key + project), user_tail))
        parts.append(self._round_command)
        # Packing 10k commands takes milliseconds: what is left after it bounds the wait.
        if self._reads is None:
            self._reads = DeadlineConnections(self.client)
        replies = self._reads.round_trip(b"".join(parts), len(parts), deadline_s, deadline_ms)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        out, start = [], 0
        for keys, _ in keyed:
            n = len(keys)
            out.append(
                TierReads(
                    split_tiers(replies[start : start + n], replies[start + n], n), replies[-1]
                )
            )
            start += n + 1
        return out

    def _pipeline_read(
        self,
        keys: list[bytes],
        user_key: bytes,
        pair_fields: list[bytes],
        user_fields: list[bytes],
        deadline_s: float,
    ) -> list[Any]:
        """The same read through redis-py's pipeline: the reference and the bench contender.
        Bounded by the client's socket timeout per receive, and checked after."""
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.execute_command("HMGET", key, *pair_fields)
        pipe.execute_command("HMGET", user_key, *user_fields)
        pipe.execute_command("GET", self._round_key)
        replies = list(pipe.execute(raise_on_error=True))
        _remaining(deadline_s, self._deadline_ms(deadline_s), "Redis read")
        return replies

    @staticmethod
    def _deadline_ms(deadline_s: float) -> float:
        return max(deadline_s - time.perf_counter(), 0.0) * 1000.0

    # -- writing ------------------------------------------------------------------------------

    def _write_head(self, batch: OnlineBatch) -> list[Any]:
        fields = [online_field(batch.view_name, name) for name in batch.feature_names]
        return [timestamp_field(batch.view_name), len(fields), batch.key_ttl_seconds, *fields]

    @staticmethod
    def _timestamps(ts_ns: np.ndarray) -> ByteColumn:
        """Feast's ``_ts`` value (a protobuf ``Timestamp``) of each row."""
        from google.protobuf.timestamp_pb2 import Timestamp

        def encode(nanos: int) -> bytes:
            return Timestamp(
                seconds=nanos // NANOS_PER_SECOND, nanos=nanos % NANOS_PER_SECOND
            ).SerializeToString()

        return ByteColumn.encoded(np.asarray(ts_ns, dtype=np.int64), encode)

    def write_batch(
        self,
        batch: OnlineBatch,
        *,
        chunk_rows: int,
        atomic_rows: int,
        in_flight: int = DEFAULT_TRANSACTIONS_IN_FLIGHT,
    ) -> int:
        import redis

        # MULTI/EXEC around up to atomic_rows rows of scripts: Redis queues them until EXEC, so
        # a crash or a dropped connection mid-transaction leaves nothing of it, and no reader
        # sees part of it. Redis serves nobody while an EXEC runs (about 3-10 us a row here),
        # so a bigger batch goes in several transactions, each all-or-nothing. Sent as EVAL
        # with the script text: a Redis restarted between a SCRIPT LOAD and the EXEC cannot
        # answer NOSCRIPT for some commands of a transaction and run the others.
        head = self._write_head(batch)
        n = len(batch.keys)
        timestamps = self._timestamps(batch.event_ts_ns)
        if self.packed:
            head_resp = b"".join(bulk(part) for part in _as_bytes(head))
            keys = _RespRows([batch.keys], suffix=self._project_bytes)
            # Per row, the script's ARGV after the head: the timestamp, then the F values.
            rows = _RespRows([timestamps, *batch.columns])
        else:
            key_list, value_rows = batch.keys.tolist(), batch.rows()
            ts_list = timestamps.tolist()
        if self.packed:
            return self._packed_transactions(
                batch.view_name,
                head_resp,
                len(head),
                keys,
                rows,
                n,
                atomic_rows,
                chunk_rows,
                in_flight,
            )
        applied = 0
        for lo in range(0, n, atomic_rows):
            hi = min(lo + atomic_rows, n)
            try:
                answers = self._pipeline_transaction(
                    batch.view_name, head, key_list, value_rows, ts_list, lo, hi, chunk_rows
                )
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if not is_retryable(exc):
                    raise  # a wrong password or missing permission: final, as it is
                raise _interrupted(batch.view_name, exc, n, lo, hi) from exc
            applied += sum(int(r) for r in answers)
        return applied

    def _packed_transactions(
        self,
        view_name: str,
        head_resp: bytes,
        head_args: int,
        keys: _RespRows,
        rows: _RespRows,
        n: int,
        atomic_rows: int,
        chunk_rows: int,
        in_flight_max: int,
    ) -> int:
        """The batch's MULTI/EXECs of ``atomic_rows`` rows on one connection, up to
        ``in_flight_max`` (:data:`~solaris_feast.store.layout.DEFAULT_TRANSACTIONS_IN_FLIGHT`)
        sent before the first one's answers are read. Rows applied."""
        import redis

        pool = self.client.connection_pool
        conn = pool.get_connection()
        in_flight: deque[tuple[int, int]] = deque()  # (hi, replies) of transactions sent, not read
        applied = 0
        stored = 0  # rows before this are answered as stored
        sent = 0  # rows before this may be stored
        try:
            for lo in range(0, n, atomic_rows):
                hi = sent = min(lo + atomic_rows, n)
                commands = self._transaction(head_resp, head_args, keys, rows, lo, hi, chunk_rows)
                conn.send_packed_command([b"".join(commands)])
                in_flight.append((hi, len(commands)))
                if len(in_flight) >= in_flight_max:
                    applied += self._answers(view_name, conn, in_flight[0][1])
                    stored = in_flight.popleft()[0]
            while in_flight:
                applied += self._answers(view_name, conn, in_flight[0][1])
                stored = in_flight.popleft()[0]
        except BaseException as exc:
            # Unread answers would reach the next user of the connection: drop it.
            conn.disconnect()
            if isinstance(exc, redis.ConnectionError | redis.TimeoutError) and is_retryable(exc):
                raise _interrupted(view_name, exc, n, stored, sent) from exc
            raise  # a wrong password or missing permission is final, as it is
        finally:
            pool.release(conn)
        return applied

    @staticmethod
    def _answers(view_name: str, conn: Any, replies: int) -> int:
        """Read one transaction's ``replies`` answers; the rows it applied."""
        import redis

        # +OK for MULTI, QUEUED per command (a refused command raises here, and Redis then
        # aborts the EXEC), then EXEC's list of script results.
        answers = [conn.read_response() for _ in range(replies)][-1]
        if not isinstance(answers, list):
            raise redis.ResponseError(
                f"{view_name}: the transaction was not executed ({answers!r})"
            )
        for answer in answers:
            if isinstance(answer, Exception):
                # As redis-py's pipeline does: a script that fails at run time (out of memory,
                # a key of another type) fails the write; Redis has run the others.
                raise redis.ResponseError(f"{view_name}: a write script failed: {answer}")
        return sum(int(r) for r in answers)

    @staticmethod
    def _transaction(
        head_resp: bytes,
        head_args: int,
        keys: _RespRows,
        rows: _RespRows,
        lo: int,
        hi: int,
        chunk_rows: int,
    ) -> list[bytes]:
        """The commands of one MULTI/EXEC of rows ``lo..hi``: per chunk an EVAL whose ARGV is
        the head (packed once per batch as ``head_resp``, ``head_args`` arguments), then each
        row's timestamp and values (``rows.width`` arguments a row)."""
        commands = [_MULTI]
        for start in range(lo, hi, chunk_rows):
            stop = min(start + chunk_rows, hi)
            count = stop - start
            commands.append(
                b"".join(
                    [
                        b"*%d\r\n" % (3 + count + head_args + count * rows.width),
                        _EVAL_SCRIPT,
                        bulk(b"%d" % count),
                        keys.chunk(start, stop),
                        head_resp,
                        rows.chunk(start, stop),
                    ]
                )
            )
        commands.append(_EXEC)
        return commands

    def _pipeline_transaction(
        self,
        view_name: str,
        head: list[Any],
        keys: list[bytes],
        values: list[list[bytes]],
        timestamps: list[bytes],
        lo: int,
        hi: int,
        chunk_rows: int,
    ) -> list[Any]:
        """The same transaction through redis-py's pipeline (the reference and bench contender)."""
        import redis

        project = self._project_bytes
        pipe = self.client.pipeline(transaction=True)
        for start in range(lo, hi, chunk_rows):
            stop = min(start + chunk_rows, hi)
            args: list[Any] = [k + project for k in keys[start:stop]] + head
            for i in range(start, stop):
                args.append(timestamps[i])
                args.extend(values[i])
            pipe.execute_command("EVAL", WRITE_SCRIPT, stop - start, *args)
        try:
            return list(pipe.execute(raise_on_error=True))
        except redis.ResponseError as exc:
            raise redis.ResponseError(f"{view_name}: a write script failed: {exc}") from exc

    # -- miss queue ---------------------------------------------------------------------------

    def _script(self, name: str, text: str) -> Any:
        if name not in self._scripts:
            self._scripts[name] = self.client.register_script(text)
        return self._scripts[name]

    def record_misses(
        self,
        user: EntityId,
        items: Sequence[EntityId],
        model_version: str,
        *,
        now: int,
        round_ttl_seconds: int,
        max_stream_length: int,
    ) -> int:
        script = self._script("record", RECORD_SCRIPT)
        return int(
            script(
                keys=[self._stream_key, self._round_key],
                args=[
                    self._marker_prefix,
                    round_ttl_seconds,
                    max_stream_length,
                    encode_id(user),
                    model_version,
                    now,
                    *(encode_id(item) for item in items),
                ],
            )
        )

    def drain_misses(self, max_pairs: int) -> list[QueuedMiss]:
        script = self._script("drain", DRAIN_SCRIPT)
        entries = script(
            keys=[self._stream_key, self._round_key], args=[self._marker_prefix, max_pairs]
        )
        out = []
        for _entry_id, flat in entries:
            fields = {_text(flat[j]): _text(flat[j + 1]) for j in range(0, len(flat), 2)}
            out.append(_queued(fields))
        return out

    def pending_misses(self) -> int:
        return int(self.client.xlen(self._stream_key))

    def read_miss_group(
        self, group: str, consumer: str, max_pairs: int, min_idle_ms: int
    ) -> list[QueuedMiss]:
        import redis

        try:
            self.client.xgroup_create(self._stream_key, group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        entries: list[tuple[Any, Any]] = []
        # This consumer's own unacknowledged entries first: a retried drain of the same round
        # (same consumer) gets back what its failed try took, instead of nothing until another
        # round claims them as idle; a second process of the same round reads the same ones.
        mine = self.client.xreadgroup(group, consumer, {self._stream_key: "0"}, count=max_pairs)
        for _stream, stream_entries in mine or []:
            # Entries deleted from the stream (drained) while pending come back without fields.
            entries.extend(e for e in stream_entries if e is not None and e[1])
        cursor: Any = "0-0"
        # Bounded: each pass claims up to the remaining count; the cursor ends at 0-0.
        for _ in range(max_pairs if len(entries) < max_pairs else 0):
            reply = self.client.xautoclaim(
                self._stream_key,
                group,
                consumer,
                min_idle_time=min_idle_ms,
                start_id=cursor,
                count=max_pairs - len(entries),
            )
            cursor, claimed = reply[0], reply[1]
            # Entries deleted from the stream (drained) while pending come back as None.
            entries.extend(e for e in claimed if e is not None and e[1] is not None)
            if len(entries) >= max_pairs or cursor in (b"0-0", "0-0"):
                break
        if len(entries) < max_pairs:
            fresh = self.client.xreadgroup(
                group, consumer, {self._stream_key: ">"}, count=max_pairs - len(entries)
            )
            for _stream, stream_entries in fresh or []:
                entries.extend(stream_entries)
        return [
            _queued({_text(k): _text(v) for k, v in flat.items()}, _text(entry_id))
            for entry_id, flat in entries
        ]

    def ack_misses(self, group: str, taken: Sequence[QueuedMiss]) -> int:
        if not taken:
            return 0
        args: list[Any] = [group, self._marker_prefix]
        for miss in taken:
            if miss.entry_id is None:
                raise ValueError("ack needs the entry_id of each pair, as read_group returns it")
            args += [miss.entry_id, f"{encode_id(miss.user_id)}:{encode_id(miss.item_id)}"]
        import redis

        script = self._script("ack", ACK_SCRIPT)
        try:
            return int(script(keys=[self._stream_key, self._round_key], args=args))
        except redis.ResponseError as exc:
            if not _is_nogroup(exc):
                raise
            # The group went with the store's data (a restart without persistence, a flush):
            # its entries are gone, none is left to acknowledge. A pair still missed is queued
            # again by the next request that misses it.
            logger.warning(
                "miss queue %s has no group %s (the online store lost its data): %d taken "
                "misses cannot be acknowledged and are not needed to be",
                self._stream_key,
                group,
                len(taken),
            )
            return 0

    def retire_consumer(self, group: str, consumer: str) -> bool:
        import redis

        # DELCONSUMER drops the consumer's pending entries with it: only an idle one goes.
        try:
            pending = self.client.xpending_range(
                self._stream_key, group, min="-", max="+", count=1, consumername=consumer
            )
            if pending:
                return False
            return bool(self.client.xgroup_delconsumer(self._stream_key, group, consumer) == 0)
        except redis.ResponseError as exc:
            if not _is_nogroup(exc):
                raise
            return True  # the group, and the consumer with it, went with the store's data

    def clear_miss_queue(self) -> int:
        # Every key of the queue carries the project's hash tag: one slot, one node in a cluster.
        pattern = _glob_escaped(self._marker_prefix) + "*"
        markers = self.client.scan_iter(match=pattern, count=1000)
        keys = [self._stream_key, self._round_key, *markers]
        deleted = 0
        for start in range(0, len(keys), 1000):
            deleted += int(self.client.delete(*keys[start : start + 1000]))
        return deleted

    # -- status -------------------------------------------------------------------------------

    def scan(self, views: Mapping[Tier, str], max_keys: int, scan_count: int) -> StoredScan:
        """``SCAN ... COUNT`` over keys ending with the project name (Feast's layout), never
        ``KEYS``; stops after ``max_keys`` keys."""
        project = self._project_bytes
        pair_keys: list[tuple[bytes, dict[str, EntityId]]] = []
        user_keys: list[tuple[bytes, dict[str, EntityId]]] = []
        keys_read = 0
        truncated = False
        # The miss queue's keys do not end with the project name, and the key layouts refuse
        # trailing bytes, which drops other projects whose names end with this one.
        for key in self._scan_keys(b"*" + _glob_escape(project), scan_count):
            if keys_read >= max_keys:
                truncated = True
                break
            keys_read += 1
            body = key[: -len(project)]
            decoded = self.pair_key.decode(body)
            if decoded is not None:
                pair_keys.append((key, decoded))
                continue
            decoded = self.user_key.decode(body)
            if decoded is not None:
                user_keys.append((key, decoded))
        rows: list[StoredValues] = []
        # Pair and similar live in the same (user, item) hash: one HMGET reads both.
        pair_tiers = (Tier.EXACT, Tier.SIMILAR)
        for keys, tiers in ((pair_keys, pair_tiers), (user_keys, (Tier.USER_AGG,))):
            fields = [
                field
                for tier in tiers
                for field in (
                    timestamp_field(views[tier]),
                    online_field(views[tier], MODEL_VERSION),
                    online_field(views[tier], COMPUTED_AT),
                )
            ]
            for start in range(0, len(keys), SCAN_READ_BATCH):
                batch = keys[start : start + SCAN_READ_BATCH]
                pipe = self.client.pipeline(transaction=False)
                for key, _ in batch:
                    pipe.hmget(key, fields)
                for (_, decoded), values in zip(batch, pipe.execute(), strict=True):
                    for i, tier in enumerate(tiers):
                        written, version_raw, computed_raw = values[3 * i : 3 * i + 3]
                        if written is None and version_raw is None:
                            continue  # this view was never written for the key
                        rows.append(StoredValues(tier, decoded, version_raw, computed_raw))
        return StoredScan(rows, keys_read, truncated)

    def _scan_keys(self, match: bytes, count: int) -> Iterator[bytes]:
        yield from self.client.scan_iter(match=match, count=count)

    def close(self) -> None:
        if self._reads is not None:
            self._reads.close()
        self.client.close()


def _glob_escape(raw: bytes) -> bytes:
    out = bytearray()
    for byte in raw:
        if byte in b"*?[]\\":
            out += b"\\"
        out.append(byte)
    return bytes(out)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _queued(fields: dict[str, str], entry_id: str | None = None) -> QueuedMiss:
    return QueuedMiss(
        decode_id(fields[USER_ID]),
        decode_id(fields[ITEM_ID]),
        fields[MODEL_VERSION],
        int(fields["missed_at"]),
        entry_id,
    )


def backend_for_client(client: Any, project: str) -> RedisBackend:
    """The backend over a client you made (a ``RedisCluster`` gets the cluster backend)."""
    from redis.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        from solaris_feast.store.backends.redis_cluster import RedisClusterBackend

        return RedisClusterBackend(client, project)
    if not hasattr(client, "connection_pool"):
        raise ConfigError(f"expected a redis-py client, got {type(client).__name__}")
    return RedisBackend(client, project)
