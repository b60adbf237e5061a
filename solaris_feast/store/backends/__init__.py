"""The online store behind one contract: read tiers, write a batch, queue misses, scan.

Feast keeps one ``OnlineStore`` contract and one module per store (``feast/infra/online_stores/``);
so does this package. Serving (``serving/retriever.py``), the writer (``store/write.py``), the miss
queue (``serving/miss_queue.py``) and the status (``review/status.py``) hold no backend branches:
they call an :class:`OnlineBackend` that :func:`backend_for` picks by the Feast online store
config.

- :mod:`.redis`: one Redis; every operation is one round trip (hand-packed where measured to pay).
- :mod:`.redis_cluster`: the same layout over a cluster's slots (one round trip per node; a
  batch is atomic per row only, since a cluster cannot run one transaction over slots, and a
  write is done when a replica has it).
- :mod:`.sqlite`: Feast's SQLite tables, the embedded default.

Errors: a backend raises what its client raises, or one of :mod:`solaris_feast.errors`; a read
past its deadline raises :class:`~solaris_feast.errors.DeadlineExceededError`.
:func:`~solaris_feast.errors.is_retryable` tells which a retry may fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from solaris_feast.columns import COMPUTED_AT, EMBEDDING, MODEL_VERSION
from solaris_feast.errors import ConfigError
from solaris_feast.store.ids import EntityId
from solaris_feast.store.layout import DEFAULT_TRANSACTIONS_IN_FLIGHT, ByteColumn
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from feast import FeatureStore

OnlineKind = Literal["sqlite", "redis"]
BackendKind = Literal["sqlite", "redis", "redis_cluster"]
READ_FEATURES = (EMBEDDING, MODEL_VERSION, COMPUTED_AT)
"""Features of each tier that a serving read fetches, in this order."""
SCAN_FEATURES = (MODEL_VERSION, COMPUTED_AT)


@dataclass(frozen=True)
class TierRead:
    """Raw stored values of one tier for N items, as Feast serialized them (None = absent)."""

    embedding: Sequence[bytes | None]
    model_version: Sequence[bytes | None]
    computed_at: Sequence[bytes | None]


@dataclass(frozen=True)
class TierReads:
    """One serving read: the raw values per tier and, where the backend reads it in the same
    round trip, the miss queue's round counter (None when absent or not read)."""

    tiers: dict[Tier, TierRead]
    miss_round: bytes | None = None


@dataclass(frozen=True)
class OnlineBatch:
    """Rows of one view, encoded as Feast stores them, ready for :meth:`OnlineBackend.write_batch`.

    Held by column: the writer encodes a column at a time, and the Redis backend packs
    fixed-width columns without a Python call per value (:class:`ByteColumn`).

    Attributes:
        view_name: the feature view.
        keys: ``N`` serialized entity keys (without the project suffix).
        feature_names: the ``F`` features written per row.
        columns: ``F`` columns of ``N`` ``ValueProto`` bytes, in ``feature_names`` order.
        event_ts_ns: ``(N,)`` int64 event timestamps in ns since 1970 (newest wins).
        key_ttl_seconds: Redis only, expire each written hash after this many seconds (0: never).
    """

    view_name: str
    keys: ByteColumn
    feature_names: list[str]
    columns: list[ByteColumn]
    event_ts_ns: np.ndarray
    key_ttl_seconds: int = 0

    @classmethod
    def from_rows(
        cls,
        view_name: str,
        keys: list[bytes],
        feature_names: list[str],
        rows: list[list[bytes]],
        event_ts_ns: np.ndarray,
        key_ttl_seconds: int = 0,
    ) -> OnlineBatch:
        """A batch of ``N`` rows of ``F`` values each."""
        if any(len(row) != len(feature_names) for row in rows):
            raise ValueError(f"{view_name}: every row needs {len(feature_names)} values")
        return cls(
            view_name,
            ByteColumn.of(keys),
            feature_names,
            [ByteColumn.of([row[f] for row in rows]) for f in range(len(feature_names))],
            event_ts_ns,
            key_ttl_seconds,
        )

    def rows(self) -> list[list[bytes]]:
        """``N`` rows of ``F`` values, for backends that write a row at a time."""
        return [list(row) for row in zip(*(c.tolist() for c in self.columns), strict=True)]


@dataclass(frozen=True)
class StoredValues:
    """One stored row of one view as the status needs it (raw bytes, None = absent)."""

    tier: Tier
    keys: dict[str, EntityId]
    model_version: bytes | None
    computed_at: bytes | None


@dataclass(frozen=True)
class StoredScan:
    """What a bounded scan of the online store found."""

    rows: list[StoredValues]
    keys_read: int
    truncated: bool


@dataclass(frozen=True)
class QueuedMiss:
    """One queued (user, item) miss; ``entry_id`` is set by consumer-group reads only."""

    user_id: EntityId
    item_id: EntityId
    model_version: str
    missed_at: int
    entry_id: str | None = None


class OnlineBackend(Protocol):
    """What serving, writing, the miss queue and the status need from an online store.

    Attributes:
        kind: ``"redis"``, ``"redis_cluster"`` or ``"sqlite"``.
        project: the Feast project; it namespaces every key and table.
        reads_miss_round: True when :meth:`read_tiers` returns the miss queue's round counter,
            so a reader can skip re-queuing pairs it queued this round.
    """

    kind: BackendKind
    project: str
    reads_miss_round: bool

    def read_tiers(
        self, user: EntityId, items: np.ndarray, views: Mapping[Tier, str], deadline_s: float
    ) -> TierReads:
        """Stored values of every tier for ``user`` and ``(N,)`` ``items`` (int64 or str ids),
        in one round trip; aborted with :class:`~solaris_feast.errors.DeadlineExceededError`
        when it cannot finish within ``deadline_s`` seconds (a ``time.perf_counter()`` instant)."""
        ...

    def read_tiers_many(
        self,
        requests: Sequence[tuple[EntityId, np.ndarray]],
        views: Mapping[Tier, str],
        deadline_s: float,
    ) -> list[TierReads]:
        """:meth:`read_tiers` for several ``(user, items)`` requests, in one round trip where
        the backend can batch them (single-node Redis), one after another where it cannot;
        the whole batch within ``deadline_s``."""
        ...

    def write_batch(
        self,
        batch: OnlineBatch,
        *,
        chunk_rows: int,
        atomic_rows: int,
        in_flight: int = DEFAULT_TRANSACTIONS_IN_FLIGHT,
    ) -> int:
        """Write newest-wins (a row not older than the stored one replaces it); up to
        ``atomic_rows`` rows all-or-nothing where the store allows it, up to ``in_flight`` such
        transactions sent before the first is answered where the store pipelines them. Return
        rows applied."""
        ...

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
        """Queue the pairs not already queued this round; return how many were queued."""
        ...

    def drain_misses(self, max_pairs: int) -> list[QueuedMiss]:
        """Take up to ``max_pairs`` queued pairs off the queue, oldest first (a new round)."""
        ...

    def pending_misses(self) -> int:
        """How many pairs wait in the queue."""
        ...

    def read_miss_group(
        self, group: str, consumer: str, max_pairs: int, min_idle_ms: int
    ) -> list[QueuedMiss]:
        """Consumer-group read (at-least-once); see ``MissQueue.read_group``."""
        ...

    def ack_misses(self, group: str, taken: Sequence[QueuedMiss]) -> int:
        """Acknowledge consumer-group entries; they leave the queue. Return how many."""
        ...

    def retire_consumer(self, group: str, consumer: str) -> bool:
        """Remove ``consumer`` from ``group`` if it holds no unacknowledged entry (one consumer
        per round would otherwise pile up in the group). True when it was removed."""
        ...

    def clear_miss_queue(self) -> int:
        """Delete the project's miss queue, its consumer groups and round markers (the project
        is torn down); return how many keys or rows went."""
        ...

    def scan(self, views: Mapping[Tier, str], max_keys: int, scan_count: int) -> StoredScan:
        """Up to ``max_keys`` stored keys of the views, with their version and timestamp."""
        ...

    def close(self) -> None:
        """Release connections; the backend may not be used afterwards."""
        ...


class HasFeastConfig(Protocol):
    """Anything holding a Feast ``RepoConfig`` as ``config``, as a ``FeatureStore`` does."""

    @property
    def config(self) -> Any: ...


@dataclass(frozen=True)
class OnlineFacts:
    """What the backends read of a Feast config: built from a ``FeatureStore``
    (:meth:`of_store`) or, without importing Feast, from the repo's yaml
    (:func:`solaris_feast.store.config.repo_online_facts`), so a task that only touches the
    online store (the miss queue) skips Feast's import (about 10 s of a task's process here)."""

    project: str
    serialization_version: int
    type: str
    """Feast's ``online_store.type`` (``redis``, ``sqlite`` or a class path)."""
    redis_type: str = "redis"
    connection_string: str = ""
    sqlite_path: str = ""
    """Absolute path of the SQLite file (a relative one is resolved against the repo)."""
    repo: str | None = None

    @classmethod
    def of_store(cls, store: FeatureStore | HasFeastConfig) -> OnlineFacts:
        cfg = store.config
        online = cfg.online_store
        value = getattr(online, "redis_type", "redis")
        path = str(getattr(online, "path", "") or "")
        if path and not Path(path).is_absolute() and cfg.repo_path is not None:
            path = str(Path(cfg.repo_path) / path)
        return cls(
            project=cfg.project,
            serialization_version=cfg.entity_key_serialization_version,
            type=str(getattr(online, "type", "")),
            redis_type=str(getattr(value, "value", value)),
            connection_string=str(getattr(online, "connection_string", "") or ""),
            sqlite_path=path,
            repo=str(cfg.repo_path) if cfg.repo_path is not None else None,
        )


def online_facts(store: FeatureStore | OnlineFacts) -> OnlineFacts:
    return store if isinstance(store, OnlineFacts) else OnlineFacts.of_store(store)


def redis_type(store: FeatureStore | OnlineFacts) -> str:
    """``redis`` or ``redis_cluster``; ``redis_sentinel`` is refused with what to do instead.

    Feast's own reader asks the sentinel for the master; the direct reads and writes here would
    talk to the sentinel itself as if it were the master, so a sentinel config is an error, not
    a silent misroute.
    """
    name = online_facts(store).redis_type
    if name.endswith("sentinel"):
        raise ConfigError(
            "online_store.redis_type: redis_sentinel is not supported by solaris-feast's reads "
            "and writes (they would connect to the sentinel as if it were the master); point "
            "connection_string at the current master with redis_type: redis, or use a Redis "
            "Cluster (redis_type: redis_cluster)"
        )
    if name.endswith("cluster"):
        return "redis_cluster"
    if name.endswith("redis"):
        return "redis"
    raise ConfigError(f"online_store.redis_type {name!r} is not supported")


def online_kind(store: FeatureStore | OnlineFacts) -> OnlineKind:
    """``"redis"`` (one Redis or a cluster) or ``"sqlite"``; any other store is refused."""
    kind = online_facts(store).type
    if kind == "redis" or kind.endswith("RedisOnlineStore"):
        redis_type(store)  # refuses a sentinel config here already
        return "redis"
    if kind == "sqlite" or kind.endswith("SqliteOnlineStore"):
        return "sqlite"
    raise ConfigError(f"online store {kind!r} is not supported; use 'redis' or 'sqlite'")


def backend_kind(store: FeatureStore | OnlineFacts) -> BackendKind:
    """Which backend module serves this store."""
    if online_kind(store) == "sqlite":
        return "sqlite"
    return "redis_cluster" if redis_type(store) == "redis_cluster" else "redis"


def backend_for(store: FeatureStore | OnlineFacts, timeout_seconds: float | None) -> OnlineBackend:
    """The backend for a Feast store's online store.

    Args:
        store: a Feast store with a Redis (``redis`` or ``redis_cluster``) or SQLite online store,
            or its :class:`OnlineFacts`.
        timeout_seconds: the longest a single network or lock wait may take (connect, send,
            receive, SQLite busy wait); reads are bounded tighter by their own deadline.

    Raises:
        ConfigError: another online store, or ``redis_type: redis_sentinel``.
    """
    store = online_facts(store)  # read the Feast config once
    kind = backend_kind(store)
    if kind == "sqlite":
        from solaris_feast.store.backends.sqlite import SqliteBackend

        return SqliteBackend.for_store(store, timeout_seconds)
    if kind == "redis_cluster":
        from solaris_feast.store.backends.redis_cluster import RedisClusterBackend

        return RedisClusterBackend.for_store(store, timeout_seconds)
    from solaris_feast.store.backends.redis import RedisBackend

    return RedisBackend.for_store(store, timeout_seconds)


class ReadsOneRequestAtATime:
    """:meth:`OnlineBackend.read_tiers_many` for a backend with no batched read (SQLite, where a
    read has no round trip to save; a cluster, whose keys live on several nodes): one
    :meth:`~OnlineBackend.read_tiers` per request, each bounded by what is left of the one
    deadline."""

    def read_tiers_many(
        self: OnlineBackend,
        requests: Sequence[tuple[EntityId, np.ndarray]],
        views: Mapping[Tier, str],
        deadline_s: float,
    ) -> list[TierReads]:
        return [self.read_tiers(user, items, views, deadline_s) for user, items in requests]


def split_tiers(
    pair_rows: Sequence[Sequence[Any]], user_row: Sequence[Any], n: int
) -> dict[Tier, TierRead]:
    """Tier reads from Redis-shaped replies: per pair ``[pair 3 fields, similar 3 fields]`` and
    one user row of 3 fields shared by all N items (shared by both Redis backends)."""
    return {
        Tier.EXACT: TierRead(
            [r[0] for r in pair_rows], [r[1] for r in pair_rows], [r[2] for r in pair_rows]
        ),
        Tier.SIMILAR: TierRead(
            [r[3] for r in pair_rows], [r[4] for r in pair_rows], [r[5] for r in pair_rows]
        ),
        Tier.USER_AGG: TierRead([user_row[0]] * n, [user_row[1]] * n, [user_row[2]] * n),
    }
