"""The queue of exact misses that the next precompute round should cover.

Serving records every ``(user, item)`` that got no exact embedding; the precompute planner drains
the queue and adds those pairs to its candidates. A pair is queued once per round: serving the
same miss a thousand times before the next round must not inflate it a thousand-fold.

Redis layout (all keys share the hash tag ``{project}``, so a Redis Cluster keeps them on one
slot):

- ``solaris:{project}:misses``: a stream, one entry per queued pair with fields ``user_id``,
  ``item_id``, ``model_version``, ``missed_at`` (unix seconds). Ids are kept in their JSON text
  form (``5`` for an Int64 id, ``"a:b"`` for a String one), so they read back with their type.
  Consumer groups work on it as on any stream (``XGROUP CREATE ... 0``, ``XREADGROUP``,
  ``XACK``); :meth:`MissQueue.drain` is the simple single-consumer path,
  :meth:`MissQueue.read_group` and :meth:`MissQueue.ack` the at-least-once one (a worker
  that dies before acknowledging leaves its pairs to be claimed).
- ``solaris:{project}:missed:<user>:<item>`` (the ids' JSON text): a marker with a TTL
  (``round_ttl_seconds``); while it exists the pair is not queued again. Draining deletes the
  markers, which opens the next round.
- ``solaris:{project}:miss_round``: a counter that every drain bumps, started by the first
  record at the server's clock (so a Redis restarted empty changes it too). The retriever reads
  it in the same round trip as the embeddings and skips re-sending pairs it already queued this
  round.

SQLite layout: one table ``solaris_miss_queue`` in the online store's database file, described
with its consumer groups in ``store/backends/sqlite.py``.

The storage operations live in the backends (``store/backends/redis.py``, ``sqlite.py``); this
module holds the queue's policy (round TTL, stream bound) and its frames.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from solaris_feast.columns import ITEM_ID, MODEL_VERSION, USER_ID
from solaris_feast.store.backends import OnlineBackend, QueuedMiss
from solaris_feast.store.ids import EntityId, IdType, check_id, check_ids, id_column
from solaris_feast.store.layout import miss_marker_prefix, miss_round_key, miss_stream_key

if TYPE_CHECKING:
    from feast import FeatureStore

    from solaris_feast.store.backends import OnlineFacts

DEFAULT_ROUND_TTL_SECONDS = 3600
DEFAULT_MAX_STREAM_LENGTH = 1_000_000
DEFAULT_QUEUE_TIMEOUT_SECONDS = 1.0
"""Longest wait of a queue operation of its own (a retriever's queue shares its deadline)."""
MISS_COLUMNS = [USER_ID, ITEM_ID, MODEL_VERSION, "missed_at"]


class MissQueue:
    """Pairs that missed the exact tier, queued once per round.

    Build with :meth:`for_store` (or over a backend you hold); ``record`` is called by the
    retriever, ``drain`` by the precompute planner. ``redis=`` and ``sqlite_file=`` build the
    backend from a redis-py client or a database file.
    """

    def __init__(
        self,
        project: str,
        *,
        redis: Any = None,
        sqlite_file: str | None = None,
        backend: OnlineBackend | None = None,
        round_ttl_seconds: int = DEFAULT_ROUND_TTL_SECONDS,
        max_stream_length: int = DEFAULT_MAX_STREAM_LENGTH,
    ) -> None:
        if sum(x is not None for x in (redis, sqlite_file, backend)) != 1:
            raise ValueError("give exactly one of redis, sqlite_file and backend")
        if round_ttl_seconds <= 0:
            raise ValueError(f"round_ttl_seconds must be positive, got {round_ttl_seconds}")
        self.project = project
        self.round_ttl_seconds = round_ttl_seconds
        self.max_stream_length = max_stream_length
        self.stream_key = miss_stream_key(project)
        self.round_key = miss_round_key(project)
        self.marker_prefix = miss_marker_prefix(project)
        if redis is not None:
            from solaris_feast.store.backends.redis import backend_for_client

            backend = backend_for_client(redis, project)
        elif sqlite_file is not None:
            from solaris_feast.store.backends.sqlite import SqliteBackend

            backend = SqliteBackend(
                sqlite_file, project, timeout_seconds=DEFAULT_QUEUE_TIMEOUT_SECONDS
            )
        if backend is None or backend.project != project:
            raise ValueError(f"the backend serves another project than {project!r}")
        self.backend: OnlineBackend = backend

    @classmethod
    def for_store(
        cls,
        store: FeatureStore | OnlineFacts,
        round_ttl_seconds: int = DEFAULT_ROUND_TTL_SECONDS,
    ) -> MissQueue:
        """The queue beside a Feast store's online store (a stream on Redis, a table on SQLite);
        ``store`` may be its :class:`~solaris_feast.store.backends.OnlineFacts`, read from the
        repo's yaml without importing Feast."""
        from solaris_feast.store.backends import backend_for, online_facts

        return cls(
            online_facts(store).project,
            backend=backend_for(store, timeout_seconds=DEFAULT_QUEUE_TIMEOUT_SECONDS),
            round_ttl_seconds=round_ttl_seconds,
        )

    def record(
        self,
        user_id: EntityId,
        item_ids: Sequence[EntityId] | np.ndarray,
        model_version: str,
    ) -> int:
        """Queue the pairs ``(user_id, item)`` not already queued this round; return how many.

        Ids are ints (Int64 join keys) or str (String join keys), all items of one type; they
        come back from :meth:`drain` with the same type.
        """
        if isinstance(user_id, str):
            user: EntityId = check_id(user_id, "string", USER_ID)
        else:
            user = check_id(user_id, "int64", USER_ID)
        values = list(np.asarray(item_ids, dtype=object).tolist())
        if not values:
            return 0
        item_type: IdType = "string" if isinstance(values[0], str) else "int64"
        checked = check_ids(np.asarray(values, dtype=object), item_type, "item_ids").tolist()
        items = [str(i) for i in checked] if item_type == "string" else [int(i) for i in checked]
        return self.backend.record_misses(
            user,
            items,
            model_version,
            now=int(time.time()),
            round_ttl_seconds=self.round_ttl_seconds,
            max_stream_length=self.max_stream_length,
        )

    def drain(self, max_pairs: int = 100_000) -> pd.DataFrame:
        """Take up to ``max_pairs`` queued pairs off the queue, oldest first.

        Returns:
            columns ``user_id`` and ``item_id`` (int64 for Int64 ids, object of str for String
            ids), ``model_version`` str,
            ``missed_at`` datetime64[ns, UTC]. The drained pairs can be queued again.
        """
        if max_pairs <= 0:
            # No round trip: Redis's XRANGE COUNT 0 answers nil, which the drain script could
            # not iterate (a round with max_drained_misses 0 failed its drain on Redis).
            return _frame([], with_entry_ids=False)
        return _frame(self.backend.drain_misses(max_pairs), with_entry_ids=False)

    def read_group(
        self,
        group: str,
        consumer: str,
        max_pairs: int = 10_000,
        min_idle_ms: int = 600_000,
    ) -> pd.DataFrame:
        """Take up to ``max_pairs`` pairs for ``consumer`` of ``group`` without removing them.

        At-least-once delivery for precompute workers: the consumer's own unacknowledged pairs
        first, then pairs another consumer took and has not acknowledged for ``min_idle_ms``
        (it died, or hangs; ``XAUTOCLAIM`` on Redis), then pairs nobody took yet
        (``XREADGROUP``). SQLite marks rows taken (one group at a time). Taken pairs stay queued,
        so serving does not queue them again, until :meth:`ack` after their embeddings are
        written.

        Returns:
            the columns of :meth:`drain` plus ``entry_id`` (str), which :meth:`ack` needs.
        """
        if max_pairs <= 0 or min_idle_ms < 0:
            raise ValueError(
                f"max_pairs must be positive and min_idle_ms non-negative, got {max_pairs}, "
                f"{min_idle_ms}"
            )
        taken = self.backend.read_miss_group(group, consumer, max_pairs, min_idle_ms)
        return _frame(taken, with_entry_ids=True)

    def ack(self, group: str, taken: pd.DataFrame) -> int:
        """Mark pairs from :meth:`read_group` done: they leave the queue; return how many."""
        if taken.empty:
            return 0
        misses = [
            QueuedMiss(_id(user), _id(item), "", 0, str(entry_id))
            for entry_id, user, item in zip(
                taken["entry_id"], taken[USER_ID], taken[ITEM_ID], strict=True
            )
        ]
        return self.backend.ack_misses(group, misses)

    def retire(self, group: str, consumer: str) -> bool:
        """Remove a consumer that holds nothing any more (a round whose misses are
        acknowledged) from ``group``; one holding entries stays, for a later claim."""
        return self.backend.retire_consumer(group, consumer)

    def pending(self) -> int:
        """How many pairs wait in the queue."""
        return self.backend.pending_misses()

    def close(self) -> None:
        self.backend.close()


def _frame(misses: list[QueuedMiss], *, with_entry_ids: bool) -> pd.DataFrame:
    columns = [*MISS_COLUMNS, "entry_id"] if with_entry_ids else MISS_COLUMNS
    rows = [
        (m.user_id, m.item_id, m.model_version, m.missed_at, m.entry_id)[: len(columns)]
        for m in misses
    ]
    frame = pd.DataFrame(rows, columns=columns)
    frame = frame.assign(
        user_id=id_column([m.user_id for m in misses]),
        item_id=id_column([m.item_id for m in misses]),
    ).assign(missed_at=pd.to_datetime(frame["missed_at"].astype("int64"), unit="s", utc=True))
    if with_entry_ids:
        frame = frame.assign(entry_id=frame["entry_id"].astype(str))
    return frame


def _id(value: Any) -> EntityId:
    # A frame's numpy ints become Python ints; str ids stay str.
    return value if isinstance(value, str) else int(value)
