"""Online reads for serving code: the best available embedding per candidate, in one round trip.

:class:`SolarisRetriever` reads the three SOLARIS views for one user and N candidate items and
resolves them exact > similar > user aggregate > zero. It enforces what Feast's
``get_online_features`` does not (feast issues 6821 and 6715) with the one tier rule of
:mod:`solaris_feast.serving.resolve`: a value older than its view's TTL, made by another model
version than the VM's, null (Redis answers a missing entity with a PRESENT null), with a NaN or
inf component, of another length, from further in the future than the clock skew allows, or
bytes that do not decode (by the views' ``solaris.embedding_codec``: Feast float lists, or
quantized bytes decoded by :func:`~solaris_feast.store.layout.dequantize_payloads`) is a miss,
counted in :class:`RetrieverStats`. Every exact miss goes to
the
:class:`~solaris_feast.serving.miss_queue.MissQueue`
for the next precompute round.

The read itself is the backend's (``store/backends/``, picked by the Feast online store config):
all tiers in one round trip, bounded by the deadline (socket and lock waits get what is left of
it, and a read that cannot finish in time is aborted).

When the store fails or is slower than the deadline the answer is ZERO for every item with
``error=True`` (and a counter), and the error's type is logged, so the VM still scores.
``strict=True`` raises instead: :class:`~solaris_feast.errors.RetryableStoreError` for what a
retry may fix (connection, timeout, deadline, a locked database), the original error for a final
one (a missing table, a wrong password, a bug), as :func:`~solaris_feast.errors.is_retryable`
classifies them.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from solaris_feast.columns import ITEM_ID, USER_ID
from solaris_feast.errors import (
    ConfigError,
    DeadlineExceededError,
    RetryableStoreError,
    ViewsNotAppliedError,
    describe_error,
    is_retryable,
)
from solaris_feast.models.cards import check_embedding_version
from solaris_feast.serving.miss_queue import MissQueue
from solaris_feast.serving.resolve import (
    REJECTION_REASONS,
    TierValues,
    repo_clock_skew,
    resolve,
)
from solaris_feast.store.backends import OnlineBackend, OnlineFacts, TierRead, backend_for
from solaris_feast.store.definitions import SolarisFeastConfig, applied_view_names
from solaris_feast.store.ids import EntityId, IdType, check_id, check_ids, join_key_types
from solaris_feast.store.layout import accepted_model_versions, decode_timestamp, embedding_codec
from solaris_feast.store.tags import TAG_EMBEDDING_CODEC, TAG_EMBEDDING_DIM
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from feast import FeatureView

logger = logging.getLogger(__name__)

DEFAULT_DEADLINE_MS = 50.0
TIER_DTYPE = np.int8
MAX_REMEMBERED_MISSES = 200_000
"""Pairs a retriever remembers having queued this round before it forgets them all."""


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


def _split(whole: FetchResult, sizes: list[int]) -> list[FetchResult]:
    """One batch's result cut into its requests' results (views of the batch's arrays)."""
    bounds = np.cumsum([0, *sizes]).tolist()
    return [
        FetchResult(
            whole.embeddings[lo:hi], whole.tiers[lo:hi], whole.age_seconds[lo:hi], whole.error
        )
        for lo, hi in itertools.pairwise(bounds)
    ]


@dataclass
class RetrieverStats:
    """Counters since the retriever was made; read them for metrics.

    ``undecodable`` and ``rejected`` count (candidate, tier) values that were stored but not
    served: ``undecodable`` the values whose bytes are not a vector of the view's length (garbage,
    truncated, another length or type) or whose ``computed_at`` or ``model_version`` does not
    parse; ``rejected`` by reason (:data:`~solaris_feast.serving.resolve.REJECTION_REASONS`) the
    decodable ones the tier rule refused, for the candidates a better tier had not served. The
    user aggregate is one stored value counted once per candidate it was consulted for.
    """

    fetches: int = 0
    items: int = 0
    errors: int = 0
    deadline_exceeded: int = 0
    misses_recorded: int = 0
    miss_queue_errors: int = 0
    undecodable: int = 0
    tier_counts: dict[Tier, int] = field(default_factory=lambda: {t: 0 for t in Tier})
    rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REJECTION_REASONS, 0))


class FeatureViewSource(Protocol):
    """What a retriever reads of its store: the Feast config and the registered views by name.
    A ``FeatureStore`` is one; the Feast online store of :mod:`solaris_feast.serving.online_store`
    passes the views Feast has already resolved for the request."""

    @property
    def config(self) -> Any: ...

    def get_feature_view(self, name: str) -> FeatureView: ...


_TierRead = TierRead
"""Raw stored values of one tier for N items (the backends' :class:`TierRead`)."""


FAILURE_LOG_INTERVAL_SECONDS = 10.0
"""A failing store is logged once per error kind per this many seconds, with the count."""


def validate_request(
    user_id: Any,
    item_ids: Any,
    user_id_type: IdType = "int64",
    item_id_type: IdType = "int64",
) -> tuple[EntityId, np.ndarray]:
    """Check one fetch request; return the user id and the item ids as ``(N,)`` int64 (Int64
    item keys) or ``(N,)`` object of str (String item keys)."""
    user = check_id(user_id, user_id_type, USER_ID)
    if isinstance(item_ids, str | bytes) or not isinstance(item_ids, Sequence | np.ndarray):
        raise TypeError(
            f"item_ids must be a sequence or array of ids, got {type(item_ids).__name__}"
        )
    if len(item_ids) == 0:
        raise ValueError("item_ids is empty: ask for at least one candidate item")
    ids = check_ids(item_ids, item_id_type, "item_ids")
    unique, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"item_ids has duplicates: {unique[counts > 1][:10].tolist()}")
    return user, ids


class SolarisRetriever:
    """Layered-fallback reads of SOLARIS embeddings for serving code.

    Args:
        store: a Feast store whose registry holds the SOLARIS views (Redis or SQLite online).
        expected_model_version: the embedding version the VM was trained with; a value made by
            any other version is a miss, so embedding spaces are never mixed.
        deadline_ms: a read slower than this answers ZERO for all with ``error=True``.
        strict: raise instead of answering ZERO when the store fails or is slow:
            :class:`~solaris_feast.errors.RetryableStoreError` (or its subclass
            :class:`~solaris_feast.errors.DeadlineExceededError`) when a retry may fix it, the
            original error when it is final (e.g.
            :class:`~solaris_feast.errors.ViewsNotAppliedError`).
        record_misses: queue every exact miss for the next precompute round.
        views: names of the views (default: those the registry holds, found by their tier tags);
            TTLs and the dimension are read from the registry.
        clock_skew_seconds: how far in the future a stored ``computed_at`` may lie before the
            value is distrusted (a miss); writers' clocks differ from this one. Default: the
            repo's setting (``SolarisFeastConfig.clock_skew_seconds``, the resolved view's tag),
            else :data:`~solaris_feast.serving.resolve.DEFAULT_CLOCK_SKEW_SECONDS`.

    The Redis connection pool is shared safely between threads; the counters in ``stats`` and
    the memory of queued misses are not locked, so give each serving thread its own retriever.
    With ``redis_type: redis_cluster`` the same commands go to each node holding some of the keys
    (one round trip per node, all within the deadline); ``redis_sentinel`` is refused.
    """

    def __init__(
        self,
        store: FeatureViewSource,
        expected_model_version: str,
        *,
        deadline_ms: float = DEFAULT_DEADLINE_MS,
        strict: bool = False,
        record_misses: bool = True,
        views: SolarisFeastConfig | None = None,
        clock_skew_seconds: float | None = None,
    ) -> None:
        from feast.protos.feast.types.Value_pb2 import Value as ValueProto

        if not isinstance(expected_model_version, str) or not expected_model_version:
            raise ConfigError(
                "expected_model_version must be a non-empty string, the compressor version "
                f"clients ask with; got {expected_model_version!r} (None is what "
                "serving_embedding_version answers where there is no serving chain to expect: "
                "is the models folder the one `solaris train` wrote, and has a chain been "
                "trained or promoted there?)"
            )
        repo_path = getattr(store.config, "repo_path", None)
        check_embedding_version(expected_model_version, Path(repo_path) if repo_path else None)
        if deadline_ms <= 0:
            raise ValueError(f"deadline_ms must be positive, got {deadline_ms}")
        if views is not None:
            names = views
        elif hasattr(store, "list_on_demand_feature_views"):  # a Feast store: its own names
            names = applied_view_names(store)  # type: ignore[arg-type]
        else:
            names = SolarisFeastConfig()
        if clock_skew_seconds is None:
            # The deployment's setting, as the resolved view applies it.
            clock_skew_seconds = repo_clock_skew(store, names.resolved_view_name)
        if not np.isfinite(clock_skew_seconds) or clock_skew_seconds < 0:
            raise ValueError(
                f"clock_skew_seconds must be finite and >= 0, got {clock_skew_seconds}"
            )
        self.clock_skew_seconds = float(clock_skew_seconds)
        self.store = store
        self.expected_model_version = expected_model_version
        self.deadline_ms = float(deadline_ms)
        self.strict = strict
        self.record_misses = record_misses
        self.stats = RetrieverStats()
        self.view_names = names.view_name_by_tier()
        self.project = store.config.project

        self.ttl_seconds: dict[Tier, float] = {}
        dims = set()
        codecs = set()
        from feast.errors import FeatureViewNotFoundException

        for tier, name in self.view_names.items():
            try:
                view = store.get_feature_view(name)
            except FeatureViewNotFoundException as exc:
                raise ViewsNotAppliedError(str(store.config.repo_path), [name]) from exc
            if view.ttl is None or view.ttl.total_seconds() <= 0:
                raise ConfigError(f"feature view {name} needs a positive ttl")
            self.ttl_seconds[tier] = view.ttl.total_seconds()
            dims.add(int(view.tags.get(TAG_EMBEDDING_DIM, names.embedding_dim)))
            codecs.add(view.tags.get(TAG_EMBEDDING_CODEC, "float32"))
        if len(dims) != 1:
            raise ConfigError(f"the three views disagree on the embedding dimension: {dims}")
        if len(codecs) != 1:
            raise ConfigError(f"the three views disagree on the embedding codec: {codecs}")
        self.dim = dims.pop()
        # Ids are typed as the registry's pair view says (Int64 or String join keys).
        key_types = join_key_types(store.get_feature_view(self.view_names[Tier.EXACT]))
        self.user_id_type: IdType = key_types.get(USER_ID, "int64")
        self.item_id_type: IdType = key_types.get(ITEM_ID, "int64")
        # The views' codec (store/layout.py): Feast's float list, or quantized Feast bytes.
        self.codec = embedding_codec(codecs.pop(), self.dim)
        # Stored model versions are compared as bytes: Feast serializes a string value the same
        # way every time, so equal bytes mean equal versions without parsing each value. The
        # store holds the version's tag or, from the offline log, the version itself.
        self._accepted_version_bytes = tuple(
            ValueProto(string_val=v).SerializeToString()
            for v in accepted_model_versions(expected_model_version)
        )
        # The backend's timeouts bound a single wait; each read is bounded by its own deadline.
        self.backend: OnlineBackend = backend_for(
            OnlineFacts.of_store(store), timeout_seconds=self.deadline_ms / 1000
        )
        self.kind = self.backend.kind
        self.miss_queue: MissQueue | None = None
        if record_misses:
            # The queue shares the read backend, so it inherits the deadline timeout.
            self.miss_queue = MissQueue(self.project, backend=self.backend)
        # Pairs this process queued in the current round: while the round lasts, a repeated
        # miss needs no second round trip. The round number rides along with every read.
        self._miss_round: bytes | None = None
        self._queued_round: bytes | None = None
        self._queued_since = 0.0
        self._queued: set[tuple[EntityId, EntityId]] = set()
        self._warned_undecodable = False
        self._last_warned: dict[str, float] = {}
        self._unlogged_failures: dict[str, int] = {}

    # -- public -------------------------------------------------------------------------------

    def fetch(self, user_id: EntityId, item_ids: Sequence[EntityId] | np.ndarray) -> FetchResult:
        """Best available embedding for each of N candidate items of one user.

        Args:
            user_id: the user: a non-negative int (Int64 join key) or a non-empty str
                (String join key), as the registered views type it.
            item_ids: ``(N,)`` distinct item ids of the item join key's type.

        Returns:
            :class:`FetchResult` with embeddings ``(N, D)``, tiers ``(N,)`` and ages ``(N,)``.
        """
        return self.fetch_many([(user_id, item_ids)])[0]

    def fetch_many(
        self, requests: Sequence[tuple[EntityId, Sequence[EntityId] | np.ndarray]]
    ) -> list[FetchResult]:
        """:meth:`fetch` for several users at once: one round trip for all of them on Redis
        (one read per user on SQLite and on a cluster), one deadline for the whole batch, and
        one pass of the tier rule over every row. On a failure every request gets ZERO with
        ``error=True`` (strict: the error is raised), as one fetch would.

        Args:
            requests: ``(user_id, item_ids)`` pairs, each as :meth:`fetch` takes them; a user
                may appear more than once.

        Returns:
            One :class:`FetchResult` per request, in order.
        """
        return self.fetch_checked(
            [
                validate_request(user_id, item_ids, self.user_id_type, self.item_id_type)
                for user_id, item_ids in requests
            ]
        )

    def fetch_checked(
        self, checked: list[tuple[EntityId, np.ndarray]], deadline_ms: float | None = None
    ) -> list[FetchResult]:
        """:meth:`fetch_many` of requests already checked by :func:`validate_request` with this
        retriever's id types (the Feast online store checks a whole request before any read);
        ``deadline_ms``: this read's, instead of the retriever's."""
        if deadline_ms is None:
            deadline_ms = self.deadline_ms
        sizes = [len(items) for _, items in checked]
        started = time.perf_counter()
        self.stats.fetches += len(checked)
        self.stats.items += sum(sizes)
        if not checked:
            return []
        try:
            reads = self._read(checked, started + deadline_ms / 1000.0)
        except Exception as exc:  # the store's own errors vary by backend and client
            return self._fail_each(sizes, f"online store read failed: {describe_error(exc)}", exc)
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        if elapsed_ms > deadline_ms:
            self.stats.deadline_exceeded += 1
            return self._fail_each(
                sizes,
                f"online store read took {elapsed_ms:.1f} ms, deadline {deadline_ms} ms",
                DeadlineExceededError("online store read", deadline_ms),
            )
        whole = self._resolve(reads, sizes)
        counts = np.bincount(whole.tiers, minlength=len(Tier))
        for tier in Tier:
            self.stats.tier_counts[tier] += int(counts[tier])
        results = _split(whole, sizes)
        if self.miss_queue is not None:
            for result, (user, items) in zip(results, checked, strict=True):
                self._queue_misses(user, items[result.tiers != Tier.EXACT])
        return results

    def _fail_each(self, sizes: list[int], reason: str, exc: BaseException) -> list[FetchResult]:
        """:meth:`_fail` for a batch: one error, every request ZERO."""
        return _split(self._fail(sum(sizes), reason, exc), sizes)

    def _queue_misses(self, user: EntityId, missed: np.ndarray) -> None:
        if self.miss_queue is None or not missed.size:
            return
        if self.backend.reads_miss_round:
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
            self._warn_limited(
                f"miss queue {type(exc).__name__}",
                "miss queue write failed: %s (%d failed writes since the last such line)",
                describe_error(exc),
            )
            return
        if self.backend.reads_miss_round:
            self._queued.update((user, item) for item in fresh)

    def close(self) -> None:
        self.backend.close()

    # -- reading ------------------------------------------------------------------------------

    def _read(
        self, requests: list[tuple[EntityId, np.ndarray]], deadline_s: float
    ) -> list[dict[Tier, _TierRead]]:
        """The backend's read of all tiers for every request, aborted at ``deadline_s``
        (``perf_counter`` time); the miss queue's round number rides along where the backend
        reads it."""
        reads = self.backend.read_tiers_many(requests, self.view_names, deadline_s)
        self._miss_round = reads[-1].miss_round
        return [read.tiers for read in reads]

    # -- resolving ----------------------------------------------------------------------------

    def _resolve(self, reads: list[dict[Tier, _TierRead]], sizes: list[int]) -> FetchResult:
        """The tier rule over every request's rows at once: the pair tiers decoded row by row,
        each request's user aggregate (one stored value for all its candidates, the backends'
        contract) decoded once and repeated."""
        n = sum(sizes)

        def joined(tier: Tier) -> _TierRead:
            if len(reads) == 1:
                return reads[0][tier]
            return _TierRead(
                [v for read in reads for v in read[tier].embedding],
                [v for read in reads for v in read[tier].model_version],
                [v for read in reads for v in read[tier].computed_at],
            )

        values = {tier: self._decode_tier(joined(tier), n) for tier in (Tier.EXACT, Tier.SIMILAR)}
        user_raw = _TierRead(
            [read[Tier.USER_AGG].embedding[0] for read in reads],
            [read[Tier.USER_AGG].model_version[0] for read in reads],
            [read[Tier.USER_AGG].computed_at[0] for read in reads],
        )
        users = self._decode_tier(user_raw, len(reads))
        repeats = np.asarray(sizes)
        # An undecodable aggregate counts once per candidate, like the other tiers' values.
        stored = np.fromiter((bool(raw) for raw in user_raw.embedding), bool, len(reads))
        self.stats.undecodable += int(((repeats - 1) * (stored & ~users.present)).sum())
        values[Tier.USER_AGG] = TierValues(
            vectors=np.repeat(users.vectors, repeats, axis=0),
            present=np.repeat(users.present, repeats),
            version_matches=np.repeat(users.version_matches, repeats),
            computed_at_s=np.repeat(users.computed_at_s, repeats),
        )
        resolution = resolve(
            values,
            now_s=time.time(),
            ttl_seconds=self.ttl_seconds,
            clock_skew_seconds=self.clock_skew_seconds,
            count_rejections=True,
        )
        for reason, count in resolution.rejected.items():
            self.stats.rejected[reason] += count
        return FetchResult(resolution.embeddings, resolution.tiers, resolution.age_seconds)

    def _decode_tier(self, read: _TierRead, n: int) -> TierValues:
        """Decode one tier's raw values; a value that does not decode is not present (and
        counted), never an error: one bad stored value must not fail the whole request."""
        embedding, model_version, computed_at = read.embedding, read.model_version, read.computed_at
        codec = self.codec
        size, header = codec.size, codec.header
        # Redis answers a missing entity with empty values: a miss, never a zero vector.
        stored = [i for i, raw in enumerate(embedding) if raw]
        stamps = [decode_timestamp(computed_at[i]) for i in stored]
        versions = [model_version[i] for i in stored]
        rows: list[int] = []
        packed: list[bytes] = []  # the codec's own layout for length D: header + payload
        packed_rows: list[int] = []
        other: list[tuple[int, np.ndarray]] = []  # any other layout, parsed as a proto
        for i, stamp, version in zip(stored, stamps, versions, strict=True):
            if stamp != stamp or type(version) is not bytes:  # NaN: no usable computed_at
                continue
            raw = embedding[i]
            if type(raw) is bytes and len(raw) == size and raw.startswith(header):
                packed.append(raw)
                packed_rows.append(i)
            else:
                vector = codec.decode(raw)
                if vector is None:  # garbage, truncated, another length or type
                    continue
                other.append((i, vector))
            rows.append(i)
        undecodable = len(stored) - len(rows)
        if undecodable:
            self.stats.undecodable += undecodable
            # Loud once (a writer with another codec, corrupt bytes), then only counted.
            log = logger.debug if self._warned_undecodable else logger.warning
            self._warned_undecodable = True
            log(
                "%d stored values are not %s embeddings of length %d (or lack a computed_at "
                "or model_version): served as misses (RetrieverStats.undecodable)",
                undecodable,
                codec.name,
                self.dim,
            )
        vectors = np.zeros((n, self.dim), dtype=np.float32)
        if packed:
            vectors[packed_rows] = codec.decode_packed(packed)
        for i, vector in other:
            vectors[i] = vector
        present = np.zeros(n, dtype=bool)
        present[rows] = True
        # Feast serializes a string the same way every time: equal bytes, equal versions.
        version_matches = np.zeros(n, dtype=bool)
        stored_versions = np.asarray(versions, dtype=object)
        for accepted in self._accepted_version_bytes:
            version_matches[stored] |= stored_versions == accepted
        version_matches &= present
        computed = np.full(n, np.nan)
        computed[stored] = stamps
        computed[~present] = np.nan
        return TierValues(
            vectors=vectors,
            present=present,
            version_matches=version_matches,
            computed_at_s=computed,
        )

    def _warn_limited(self, key: str, message: str, *args: object) -> None:
        """``message % (*args, count)`` at WARNING once per ``key`` per
        :data:`FAILURE_LOG_INTERVAL_SECONDS`, ``count`` the lines left out since plus this one:
        a serving loop during an outage fails hundreds of fetches a second (an audit counted
        2,027 identical lines in 2 s from one client), and a SQLite queue under a writer's lock
        fails each request's queue write; RetrieverStats counts every one."""
        now = time.monotonic()
        if now - self._last_warned.get(key, -math.inf) >= FAILURE_LOG_INTERVAL_SECONDS:
            logger.warning(message, *args, self._unlogged_failures.get(key, 0) + 1)
            self._last_warned[key] = now
            self._unlogged_failures[key] = 0
        else:
            self._unlogged_failures[key] = self._unlogged_failures.get(key, 0) + 1

    def _fail(self, n: int, reason: str, exc: BaseException) -> FetchResult:
        """ZERO for all with ``error=True``; in strict mode raise, by the error's class."""
        self.stats.errors += 1
        retryable = is_retryable(exc)
        if isinstance(exc, DeadlineExceededError):
            self.stats.deadline_exceeded += 1
        if self.strict:
            if not retryable:
                raise exc  # final: a retry repeats it, so the caller sees the cause itself
            if isinstance(exc, RetryableStoreError):
                raise exc
            raise RetryableStoreError(reason) from exc
        kind = type(exc).__name__
        self._warn_limited(
            kind,
            "serving ZERO for %d items: %s error %s: %s (%d failed fetches since the last "
            "such line)",
            n,
            "retryable" if retryable else "final",
            kind,
            reason,
        )
        self.stats.tier_counts[Tier.ZERO] += n
        return FetchResult(
            embeddings=np.zeros((n, self.dim), dtype=np.float32),
            tiers=np.zeros(n, dtype=TIER_DTYPE),
            age_seconds=np.full(n, np.nan),
            error=True,
        )
