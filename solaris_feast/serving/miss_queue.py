"""The queue of exact misses that the next precompute round should cover.

Serving records every ``(user, item)`` that got no exact embedding; the precompute planner drains
the queue and adds those pairs to its candidates. A pair is queued once per round: serving the
same miss a thousand times before the next round must not inflate it a thousand-fold.

Redis layout (all keys share the hash tag ``{project}``, so a Redis Cluster keeps them on one
slot):

- ``solaris:{project}:misses``: a stream, one entry per queued pair with fields ``user_id``,
  ``item_id``, ``model_version``, ``missed_at`` (unix seconds). Consumer groups work on it as on
  any stream (``XGROUP CREATE ... 0``, ``XREADGROUP``, ``XACK``); :meth:`MissQueue.drain` is the
  simple single-consumer path, :meth:`MissQueue.read_group` and :meth:`MissQueue.ack` the
  at-least-once one (a worker that dies before acknowledging leaves its pairs to be claimed).
- ``solaris:{project}:missed:<user>:<item>``: a marker with a TTL (``round_ttl_seconds``); while it
  exists the pair is not queued again. Draining deletes the markers, which opens the next round.
- ``solaris:{project}:miss_round``: a counter that every drain bumps. The retriever reads it in
  the same round trip as the embeddings and skips re-sending pairs it already queued this round.

SQLite layout: one table ``solaris_miss_queue`` in the online store's database file, primary key
``(project, user_id, item_id)``; ``INSERT OR IGNORE`` is the dedupe and draining deletes the rows.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from solaris_feast.store.config import online_kind, redis_client, sqlite_path

if TYPE_CHECKING:
    from feast import FeatureStore

DEFAULT_ROUND_TTL_SECONDS = 3600
DEFAULT_MAX_STREAM_LENGTH = 1_000_000
MISS_COLUMNS = ["user_id", "item_id", "model_version", "missed_at"]

# One round trip for a whole fetch's misses; SET NX is the dedupe, so two servers missing the
# same pair at the same moment still queue it once.
_RECORD_SCRIPT = """
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
return queued
"""

_DRAIN_SCRIPT = """
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
_ACK_SCRIPT = """
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


class MissQueue:
    """Pairs that missed the exact tier, queued once per round.

    Build with :meth:`for_store`; ``record`` is called by the retriever, ``drain`` by the
    precompute planner.
    """

    def __init__(
        self,
        project: str,
        *,
        redis: Any = None,
        sqlite_file: str | None = None,
        round_ttl_seconds: int = DEFAULT_ROUND_TTL_SECONDS,
        max_stream_length: int = DEFAULT_MAX_STREAM_LENGTH,
    ) -> None:
        if (redis is None) == (sqlite_file is None):
            raise ValueError("give exactly one of redis and sqlite_file")
        if round_ttl_seconds <= 0:
            raise ValueError(f"round_ttl_seconds must be positive, got {round_ttl_seconds}")
        self.project = project
        self.round_ttl_seconds = round_ttl_seconds
        self.max_stream_length = max_stream_length
        self.stream_key = f"solaris:{{{project}}}:misses"
        self.round_key = self.round_key_for(project)
        self.marker_prefix = f"solaris:{{{project}}}:missed:"
        self._redis = redis
        self._sqlite_file = sqlite_file
        self._sqlite: sqlite3.Connection | None = None
        if redis is not None:
            self._record = redis.register_script(_RECORD_SCRIPT)
            self._drain = redis.register_script(_DRAIN_SCRIPT)
            self._ack = redis.register_script(_ACK_SCRIPT)

    @staticmethod
    def round_key_for(project: str) -> str:
        """Counter bumped by every drain that took pairs: a new round has begun."""
        return f"solaris:{{{project}}}:miss_round"

    @classmethod
    def for_store(
        cls, store: FeatureStore, round_ttl_seconds: int = DEFAULT_ROUND_TTL_SECONDS
    ) -> MissQueue:
        """The queue beside a Feast store's online store (a stream on Redis, a table on SQLite)."""
        if online_kind(store) == "redis":
            return cls(
                store.config.project,
                redis=redis_client(store, timeout_seconds=1.0),
                round_ttl_seconds=round_ttl_seconds,
            )
        return cls(
            store.config.project,
            sqlite_file=sqlite_path(store),
            round_ttl_seconds=round_ttl_seconds,
        )

    def record(self, user_id: int, item_ids: Sequence[int] | np.ndarray, model_version: str) -> int:
        """Queue the pairs ``(user_id, item)`` not already queued this round; return how many."""
        items = [int(i) for i in np.asarray(item_ids, dtype=np.int64).tolist()]
        if not items:
            return 0
        now = int(time.time())
        if self._redis is not None:
            return int(
                self._record(
                    keys=[self.stream_key],
                    args=[
                        self.marker_prefix,
                        self.round_ttl_seconds,
                        self.max_stream_length,
                        int(user_id),
                        model_version,
                        now,
                        *items,
                    ],
                )
            )
        conn = self._connection()
        with conn:
            before = conn.total_changes
            conn.executemany(
                "INSERT OR IGNORE INTO solaris_miss_queue "
                "(project, user_id, item_id, model_version, missed_at) VALUES (?, ?, ?, ?, ?)",
                [(self.project, int(user_id), item, model_version, now) for item in items],
            )
            return conn.total_changes - before

    def drain(self, max_pairs: int = 100_000) -> pd.DataFrame:
        """Take up to ``max_pairs`` queued pairs off the queue, oldest first.

        Returns:
            columns ``user_id`` int64, ``item_id`` int64, ``model_version`` str,
            ``missed_at`` datetime64[ns, UTC]. The drained pairs can be queued again.
        """
        rows: list[tuple[int, int, str, int]] = []
        if self._redis is not None:
            entries = self._drain(
                keys=[self.stream_key, self.round_key], args=[self.marker_prefix, max_pairs]
            )
            for _entry_id, flat in entries:
                fields = {flat[j].decode(): flat[j + 1].decode() for j in range(0, len(flat), 2)}
                rows.append(
                    (
                        int(fields["user_id"]),
                        int(fields["item_id"]),
                        fields["model_version"],
                        int(fields["missed_at"]),
                    )
                )
        else:
            conn = self._connection()
            with conn:
                rows = conn.execute(
                    "SELECT user_id, item_id, model_version, missed_at FROM solaris_miss_queue "
                    "WHERE project = ? ORDER BY missed_at, rowid LIMIT ?",
                    (self.project, max_pairs),
                ).fetchall()
                conn.executemany(
                    "DELETE FROM solaris_miss_queue WHERE project = ? AND user_id = ? "
                    "AND item_id = ?",
                    [(self.project, r[0], r[1]) for r in rows],
                )
        frame = pd.DataFrame(rows, columns=MISS_COLUMNS)
        return frame.astype({"user_id": "int64", "item_id": "int64"}).assign(
            missed_at=pd.to_datetime(frame["missed_at"].astype("int64"), unit="s", utc=True)
        )

    def read_group(
        self,
        group: str,
        consumer: str,
        max_pairs: int = 10_000,
        min_idle_ms: int = 600_000,
    ) -> pd.DataFrame:
        """Take up to ``max_pairs`` pairs for ``consumer`` of ``group`` without removing them.

        At-least-once delivery for precompute workers (Redis only): pairs another consumer took
        and has not acknowledged for ``min_idle_ms`` (it died, or hangs) are claimed first
        (``XAUTOCLAIM``), then pairs nobody took yet (``XREADGROUP``). Taken pairs stay queued,
        so serving does not queue them again, until :meth:`ack` after their embeddings are
        written.

        Returns:
            the columns of :meth:`drain` plus ``entry_id`` (str), which :meth:`ack` needs.
        """
        import redis

        if self._redis is None:
            raise ValueError("consumer groups need the Redis miss queue; use drain() on SQLite")
        if max_pairs <= 0 or min_idle_ms < 0:
            raise ValueError(
                f"max_pairs must be positive and min_idle_ms non-negative, got {max_pairs}, "
                f"{min_idle_ms}"
            )
        try:
            self._redis.xgroup_create(self.stream_key, group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        entries: list[tuple[Any, Any]] = []
        cursor: Any = "0-0"
        # Bounded: each pass claims up to the remaining count; the cursor ends at 0-0.
        for _ in range(max_pairs):
            reply = self._redis.xautoclaim(
                self.stream_key,
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
            fresh = self._redis.xreadgroup(
                group, consumer, {self.stream_key: ">"}, count=max_pairs - len(entries)
            )
            for _stream, stream_entries in fresh or []:
                entries.extend(stream_entries)
        rows = []
        for entry_id, flat in entries:
            fields = {_text(k): _text(v) for k, v in flat.items()}
            rows.append(
                (
                    int(fields["user_id"]),
                    int(fields["item_id"]),
                    fields["model_version"],
                    int(fields["missed_at"]),
                    _text(entry_id),
                )
            )
        frame = pd.DataFrame(rows, columns=[*MISS_COLUMNS, "entry_id"])
        return frame.astype({"user_id": "int64", "item_id": "int64"}).assign(
            missed_at=pd.to_datetime(frame["missed_at"].astype("int64"), unit="s", utc=True),
            entry_id=frame["entry_id"].astype(str),
        )

    def ack(self, group: str, taken: pd.DataFrame) -> int:
        """Mark pairs from :meth:`read_group` done: they leave the queue; return how many."""
        if self._redis is None:
            raise ValueError("consumer groups need the Redis miss queue; use drain() on SQLite")
        if taken.empty:
            return 0
        args: list[Any] = [group, self.marker_prefix]
        for entry_id, user, item in zip(
            taken["entry_id"], taken["user_id"], taken["item_id"], strict=True
        ):
            args += [str(entry_id), f"{int(user)}:{int(item)}"]
        return int(self._ack(keys=[self.stream_key, self.round_key], args=args))

    def pending(self) -> int:
        """How many pairs wait in the queue."""
        if self._redis is not None:
            return int(self._redis.xlen(self.stream_key))
        row = (
            self._connection()
            .execute("SELECT COUNT(*) FROM solaris_miss_queue WHERE project = ?", (self.project,))
            .fetchone()
        )
        return int(row[0])

    def _connection(self) -> sqlite3.Connection:
        if self._sqlite is None:
            if self._sqlite_file is None:
                raise ValueError("this queue is on Redis")
            conn = sqlite3.connect(self._sqlite_file, check_same_thread=False, timeout=1.0)
            conn.execute(
                "CREATE TABLE IF NOT EXISTS solaris_miss_queue ("
                "project TEXT NOT NULL, user_id INTEGER NOT NULL, item_id INTEGER NOT NULL, "
                "model_version TEXT NOT NULL, missed_at INTEGER NOT NULL, "
                "PRIMARY KEY (project, user_id, item_id))"
            )
            conn.commit()
            self._sqlite = conn
        return self._sqlite


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
