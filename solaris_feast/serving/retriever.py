"""Online reads for serving code: the best available embedding per candidate, in one round trip.

:class:`SolarisRetriever` reads the three SOLARIS views for one user and N candidate items and
resolves them exact > similar > user aggregate > zero. It enforces what Feast's
``get_online_features`` does not (feast issues 6821 and 6715): a value older than its view's TTL,
made by another model version than the VM's, or null (Redis answers a missing entity with a
PRESENT null) is a miss. Every exact miss goes to the
:class:`~solaris_feast.serving.miss_queue.MissQueue`
for the next precompute round.

With Redis all tiers come from one pipeline: Feast keeps one hash per entity key holding every
view of that key, so N HMGETs on the (user, item) hashes read the pair and similar tiers together
and one HMGET on the user hash reads the aggregate. With SQLite one ``UNION ALL`` statement reads
Feast's three tables.

When the store is unreachable or slower than the deadline the answer is ZERO for every item with
``error=True`` (and a counter), so the VM still scores; ``strict=True`` raises instead.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from solaris_feast.errors import ConfigError, RetryableStoreError
from solaris_feast.serving.miss_queue import MissQueue
from solaris_feast.store.config import (
    EntityKeyLayout,
    FloatListCodec,
    online_field,
    online_kind,
    packed_round_trip,
    sqlite_path,
    sqlite_table,
)
from solaris_feast.store.definitions import SolarisFeastConfig
from solaris_feast.store.tags import TAG_EMBEDDING_DIM
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from feast import FeatureStore

logger = logging.getLogger(__name__)

DEFAULT_DEADLINE_MS = 50.0
TIER_DTYPE = np.int8
MAX_REMEMBERED_MISSES = 200_000
"""Pairs a retriever remembers having queued this round before it forgets them all."""
_FEATURES = ("embedding", "model_version", "computed_at")
_INT64_MAX = 2**63 - 1
_SEARCH_ORDER = (Tier.EXACT, Tier.SIMILAR, Tier.USER_AGG)


def _hmget_template(fields: list[bytes]) -> tuple[bytes, bytes]:
    """RESP bytes of ``HMGET <key> <fields...>`` before and after the key."""
    head = b"*%d\r\n$5\r\nHMGET\r\n" % (len(fields) + 2)
    tail = b"".join(b"$%d\r\n%s\r\n" % (len(f), f) for f in fields)
    return head, tail


@dataclass(frozen=True)
class FetchResult:
    """What the VM gets for one user and N candidate items.

    Attributes:
        embeddings: ``(N, D)`` float32; zeros where ``tiers`` is ZERO.
        tiers: ``(N,)`` int8 values of :class:`~solaris_feast.tiers.Tier`.
        age_seconds: ``(N,)`` float64, seconds since the served vector was computed; NaN for ZERO.
        error: True when the store failed or missed the deadline and every tier is ZERO.
    """

    embeddings: np.ndarray
    tiers: np.ndarray
    age_seconds: np.ndarray
    error: bool = False


@dataclass
class RetrieverStats:
    """Counters since the retriever was made; read them for metrics."""

    fetches: int = 0
    items: int = 0
    errors: int = 0
    deadline_exceeded: int = 0
    misses_recorded: int = 0
    miss_queue_errors: int = 0
    tier_counts: dict[Tier, int] = field(default_factory=lambda: {t: 0 for t in Tier})


@dataclass(frozen=True)
class _TierRead:
    """Raw stored values of one tier for N items, as Feast serialized them (None = absent)."""

    embedding: Sequence[bytes | None]
    model_version: Sequence[bytes | None]
    computed_at: Sequence[bytes | None]


def validate_request(user_id: Any, item_ids: Any) -> tuple[int, np.ndarray]:
    """Check one fetch request; return the user id and the item ids as ``(N,)`` int64."""
    if isinstance(user_id, bool) or not isinstance(user_id, int | np.integer):
        raise TypeError(f"user_id must be an integer, got {type(user_id).__name__}")
    if not 0 <= int(user_id) <= _INT64_MAX:
        raise ValueError(f"user_id must be in [0, 2**63 - 1] (an Int64 join key), got {user_id}")
    if isinstance(item_ids, str | bytes) or not isinstance(item_ids, Sequence | np.ndarray):
        raise TypeError(
            f"item_ids must be a sequence or array of integers, got {type(item_ids).__name__}"
        )
    array = np.asarray(item_ids)
    if array.ndim != 1:
        raise ValueError(f"item_ids must be one-dimensional, got shape {array.shape}")
    if array.size == 0:
        raise ValueError("item_ids is empty: ask for at least one candidate item")
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"item_ids must be integers, got dtype {array.dtype}")
    if array.size and array.dtype.kind == "u" and int(array.max()) > _INT64_MAX:
        raise ValueError("item_ids must fit in int64 (Int64 join keys); got values above 2**63 - 1")
    ids = array.astype(np.int64)
    negative = np.flatnonzero(ids < 0)
    if negative.size:
        raise ValueError(f"item_ids must be non-negative; negative at positions {negative[:10]}")
    unique, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"item_ids has duplicates: {unique[counts > 1][:10].tolist()}")
    return int(user_id), ids


class SolarisRetriever:
    """Layered-fallback reads of SOLARIS embeddings for serving code.

    Args:
        store: a Feast store whose registry holds the SOLARIS views (Redis or SQLite online).
        expected_model_version: the embedding version the VM was trained with; a value made by
            any other version is a miss, so embedding spaces are never mixed.
        deadline_ms: a read slower than this answers ZERO for all with ``error=True``.
        strict: raise :class:`~solaris_feast.errors.RetryableStoreError` instead of answering
            ZERO when the store fails or is slow.
        record_misses: queue every exact miss for the next precompute round.
        views: names of the views; TTLs and the dimension are read from the registry.

    The Redis connection pool is shared safely between threads; the counters in ``stats`` and
    the memory of queued misses are not locked, so give each serving thread its own retriever.
    With ``redis_type: redis_cluster`` the same commands go through redis-py's cluster pipeline
    (one round trip per node holding some of the keys).
    """

    def __init__(
        self,
        store: FeatureStore,
        expected_model_version: str,
        *,
        deadline_ms: float = DEFAULT_DEADLINE_MS,
        strict: bool = False,
        record_misses: bool = True,
        views: SolarisFeastConfig | None = None,
    ) -> None:
        from feast.protos.feast.types.Value_pb2 import Value as ValueProto

        if not isinstance(expected_model_version, str) or not expected_model_version:
            raise ValueError("expected_model_version must be a non-empty string")
        if deadline_ms <= 0:
            raise ValueError(f"deadline_ms must be positive, got {deadline_ms}")
        self.store = store
        self.expected_model_version = expected_model_version
        self.deadline_ms = float(deadline_ms)
        self.strict = strict
        self.record_misses = record_misses
        self.stats = RetrieverStats()
        names = views or SolarisFeastConfig()
        self.view_names = names.view_name_by_tier()
        self.project = store.config.project
        self.kind = online_kind(store)

        self.ttl_seconds: dict[Tier, float] = {}
        dims = set()
        for tier, name in self.view_names.items():
            view = store.get_feature_view(name)
            if view.ttl is None or view.ttl.total_seconds() <= 0:
                raise ConfigError(f"feature view {name} needs a positive ttl")
            self.ttl_seconds[tier] = view.ttl.total_seconds()
            dims.add(int(view.tags.get(TAG_EMBEDDING_DIM, names.embedding_dim)))
        if len(dims) != 1:
            raise ConfigError(f"the three views disagree on the embedding dimension: {dims}")
        self.dim = dims.pop()
        self.codec = FloatListCodec(self.dim)
        # Stored model versions are compared as bytes: Feast serializes a string value the same
        # way every time, so equal bytes mean equal versions without parsing each value.
        self._expected_version_bytes = ValueProto(
            string_val=expected_model_version
        ).SerializeToString()
        version = store.config.entity_key_serialization_version
        self._pair_key = EntityKeyLayout(["user_id", "item_id"], version)
        self._user_key = EntityKeyLayout(["user_id"], version)
        self._project_bytes = self.project.encode()
        self._redis: Any = None
        self._sqlite: sqlite3.Connection | None = None
        self._cluster_fields: tuple[list[bytes], list[bytes], bytes] | None = None
        if self.kind == "redis":
            from solaris_feast.store.config import is_redis_cluster, redis_client

            self._redis = redis_client(store, timeout_seconds=self.deadline_ms / 1000.0)
            pair, similar, user = (self.view_names[t] for t in _SEARCH_ORDER)
            pair_fields = [online_field(pair, f) for f in _FEATURES] + [
                online_field(similar, f) for f in _FEATURES
            ]
            user_fields = [online_field(user, f) for f in _FEATURES]
            self._pair_command = _hmget_template(pair_fields)
            self._user_command = _hmget_template(user_fields)
            if is_redis_cluster(store):
                # Keys live on many nodes: no single connection can take the packed pipeline.
                self._cluster_fields = (
                    pair_fields,
                    user_fields,
                    MissQueue.round_key_for(self.project).encode(),
                )
        self.miss_queue: MissQueue | None = None
        if record_misses:
            # On Redis the queue shares the read client, so it inherits the deadline timeout.
            self.miss_queue = (
                MissQueue(self.project, redis=self._redis)
                if self._redis is not None
                else MissQueue.for_store(store)
            )
        round_key = MissQueue.round_key_for(self.project).encode()
        self._round_command = b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (
            len(round_key),
            round_key,
        )
        # Pairs this process queued in the current round: while the round lasts, a repeated
        # miss needs no second round trip. The round number rides along with every read.
        self._miss_round: bytes | None = None
        self._queued_round: bytes | None = None
        self._queued_since = 0.0
        self._queued: set[tuple[int, int]] = set()

    # -- public -------------------------------------------------------------------------------

    def fetch(self, user_id: int, item_ids: Sequence[int] | np.ndarray) -> FetchResult:
        """Best available embedding for each of N candidate items of one user.

        Args:
            user_id: the user, a non-negative integer.
            item_ids: ``(N,)`` distinct non-negative integers.

        Returns:
            :class:`FetchResult` with embeddings ``(N, D)``, tiers ``(N,)`` and ages ``(N,)``.
        """
        user, items = validate_request(user_id, item_ids)
        started = time.perf_counter()
        self.stats.fetches += 1
        self.stats.items += len(items)
        try:
            reads = self._read(user, items)
        except Exception as exc:  # the store's own errors vary by backend and client
            return self._fail(len(items), f"online store read failed: {exc!r}", exc)
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        if elapsed_ms > self.deadline_ms:
            self.stats.deadline_exceeded += 1
            return self._fail(
                len(items),
                f"online store read took {elapsed_ms:.1f} ms, deadline {self.deadline_ms} ms",
                None,
            )
        result = self._resolve(reads, len(items))
        for tier in Tier:
            self.stats.tier_counts[tier] += int(np.count_nonzero(result.tiers == tier))
        if self.miss_queue is not None:
            self._queue_misses(user, items[result.tiers != Tier.EXACT])
        return result

    def _queue_misses(self, user: int, missed: np.ndarray) -> None:
        if self.miss_queue is None or not missed.size:
            return
        if self.kind == "redis":
            now = time.monotonic()
            if (
                self._miss_round != self._queued_round
                or now - self._queued_since > self.miss_queue.round_ttl_seconds
                or len(self._queued) > MAX_REMEMBERED_MISSES
            ):
                self._queued.clear()
                self._queued_round = self._miss_round
                self._queued_since = now
            fresh = [item for item in missed.tolist() if (user, item) not in self._queued]
        else:
            fresh = missed.tolist()
        if not fresh:
            return
        try:
            self.stats.misses_recorded += self.miss_queue.record(
                user, fresh, self.expected_model_version
            )
        except Exception as exc:  # a full or down queue must not fail the request
            self.stats.miss_queue_errors += 1
            logger.warning("miss queue write failed: %r", exc)
            return
        if self.kind == "redis":
            self._queued.update((user, item) for item in fresh)

    def close(self) -> None:
        if self._redis is not None:
            self._redis.close()
        if self._sqlite is not None:
            self._sqlite.close()
            self._sqlite = None

    # -- reading ------------------------------------------------------------------------------

    def _read(self, user: int, items: np.ndarray) -> dict[Tier, _TierRead]:
        if self.kind == "redis":
            return self._read_redis(user, items)
        return self._read_sqlite(user, items)

    def _read_redis(self, user: int, items: np.ndarray) -> dict[Tier, _TierRead]:
        # One pipeline: N HMGETs on the (user, item) hashes (pair and similar fields together,
        # Feast keeps both views in one hash), one HMGET on the user hash, and the miss queue's
        # round number. The commands are packed by hand: their shape never changes, and
        # redis-py's generic packer costs as much as the network round trip at N = 100.
        project = self._project_bytes
        pair_key = self._pair_key.key
        if self._cluster_fields is not None:
            replies = self._cluster_round_trip(user, items)
        else:
            head, tail = self._pair_command
            parts = []
            for item in items.tolist():
                key = pair_key(user, item) + project
                parts.append(b"%s$%d\r\n%s\r\n%s" % (head, len(key), key, tail))
            user_key = self._user_key.key(user) + project
            head, tail = self._user_command
            parts.append(b"%s$%d\r\n%s\r\n%s" % (head, len(user_key), user_key, tail))
            parts.append(self._round_command)
            replies = self._round_trip(b"".join(parts), len(parts))
        pair_rows = replies[:-2]
        user_row = replies[-2]
        self._miss_round = replies[-1]
        n = len(items)
        return {
            Tier.EXACT: _TierRead(
                [r[0] for r in pair_rows], [r[1] for r in pair_rows], [r[2] for r in pair_rows]
            ),
            Tier.SIMILAR: _TierRead(
                [r[3] for r in pair_rows], [r[4] for r in pair_rows], [r[5] for r in pair_rows]
            ),
            Tier.USER_AGG: _TierRead([user_row[0]] * n, [user_row[1]] * n, [user_row[2]] * n),
        }

    def _cluster_round_trip(self, user: int, items: np.ndarray) -> list[Any]:
        """The same commands through redis-py's cluster pipeline, which groups them by node."""
        if self._cluster_fields is None:
            raise ConfigError("not a Redis Cluster store")
        pair_fields, user_fields, round_key = self._cluster_fields
        project = self._project_bytes
        pipe = self._redis.pipeline()
        for item in items.tolist():
            pipe.execute_command("HMGET", self._pair_key.key(user, item) + project, *pair_fields)
        pipe.execute_command("HMGET", self._user_key.key(user) + project, *user_fields)
        pipe.execute_command("GET", round_key)
        return list(pipe.execute(raise_on_error=True))

    def _round_trip(self, payload: bytes, replies: int) -> list[Any]:
        """Send packed commands on one pooled connection and read ``replies`` answers."""
        answers = packed_round_trip(self._redis, payload, replies)
        for answer in answers:
            if isinstance(answer, Exception):
                raise answer
        return answers

    def _sqlite_connection(self) -> sqlite3.Connection:
        if self._sqlite is None:
            # Our own connection: Feast's is created lazily and shared with its writes.
            self._sqlite = sqlite3.connect(
                sqlite_path(self.store), check_same_thread=False, timeout=self.deadline_ms / 1000
            )
        return self._sqlite

    def _read_sqlite(self, user: int, items: np.ndarray) -> dict[Tier, _TierRead]:
        conn = self._sqlite_connection()
        deadline = time.perf_counter() + self.deadline_ms / 1000.0
        # Abort a statement that runs past the deadline instead of blocking the request.
        conn.set_progress_handler(lambda: int(time.perf_counter() > deadline), 1000)
        pair_keys = [self._pair_key.key(user, item) for item in items.tolist()]
        user_key = self._user_key.key(user)
        marks = ",".join("?" * len(pair_keys))
        statements = []
        params: list[Any] = []
        for tier in _SEARCH_ORDER:
            table = sqlite_table(self.project, self.view_names[tier]).replace('"', '""')
            keys = [user_key] if tier == Tier.USER_AGG else pair_keys
            where = "entity_key = ?" if tier == Tier.USER_AGG else f"entity_key IN ({marks})"
            statements.append(
                f'SELECT {int(tier)}, entity_key, feature_name, value FROM "{table}" '
                f"WHERE {where} AND feature_name IN ('embedding', 'model_version', 'computed_at')"
            )
            params.extend(keys)
        try:
            rows = conn.execute(" UNION ALL ".join(statements), params).fetchall()
        finally:
            conn.set_progress_handler(None, 1000)
        position = {key: i for i, key in enumerate(pair_keys)}
        n = len(items)
        columns: dict[Tier, dict[str, list[bytes | None]]] = {
            tier: {f: [None] * n for f in _FEATURES} for tier in _SEARCH_ORDER
        }
        user_values: dict[str, bytes] = {}
        for tier_value, key, feature, value in rows:
            tier = Tier(tier_value)
            if tier == Tier.USER_AGG:
                user_values[feature] = value
            else:
                columns[tier][feature][position[key]] = value
        for feature, value in user_values.items():
            columns[Tier.USER_AGG][feature] = [value] * n
        return {
            tier: _TierRead(
                columns[tier]["embedding"],
                columns[tier]["model_version"],
                columns[tier]["computed_at"],
            )
            for tier in _SEARCH_ORDER
        }

    # -- resolving ----------------------------------------------------------------------------

    def _resolve(self, reads: dict[Tier, _TierRead], n: int) -> FetchResult:
        from feast.protos.feast.types.Value_pb2 import Value as ValueProto

        now = time.time()
        embeddings = np.zeros((n, self.dim), dtype=np.float32)
        tiers = np.zeros(n, dtype=TIER_DTYPE)
        ages = np.full(n, np.nan, dtype=np.float64)
        expected = self._expected_version_bytes
        decode = self.codec.decode
        open_rows = list(range(n))
        parsed_ts = ValueProto()
        for tier in _SEARCH_ORDER:
            read = reads[tier]
            ttl = self.ttl_seconds[tier]
            still_open = []
            for i in open_rows:
                raw = read.embedding[i]
                # Redis answers a missing entity with an empty value: a miss, never a zero vector.
                if not raw or read.model_version[i] != expected or not read.computed_at[i]:
                    still_open.append(i)
                    continue
                parsed_ts.ParseFromString(read.computed_at[i])
                age = max(now - parsed_ts.unix_timestamp_val, 0.0)
                vector = decode(raw) if age <= ttl else None
                if vector is None:
                    still_open.append(i)
                    continue
                embeddings[i] = vector
                tiers[i] = tier
                ages[i] = age
            open_rows = still_open
            if not open_rows:
                break
        return FetchResult(embeddings=embeddings, tiers=tiers, age_seconds=ages, error=False)

    def _fail(self, n: int, reason: str, exc: BaseException | None) -> FetchResult:
        self.stats.errors += 1
        if self.strict:
            raise RetryableStoreError(reason) from exc
        logger.warning("serving ZERO for %d items: %s", n, reason)
        self.stats.tier_counts[Tier.ZERO] += n
        return FetchResult(
            embeddings=np.zeros((n, self.dim), dtype=np.float32),
            tiers=np.zeros(n, dtype=TIER_DTYPE),
            age_seconds=np.full(n, np.nan),
            error=True,
        )
