"""Feast online stores that answer the resolved view with the retriever's one-round-trip read.

A client with no solaris code reads the resolved embedding with a plain Feast call::

    store.get_online_features(
        features=["solaris_resolved:resolved_embedding", "solaris_resolved:resolved_tier"],
        entity_rows=[{"user_id": 1, "item_id": 7, "solaris_model_version": "cmp-v3"}],
        full_feature_names=True,
    )

On Feast's own stores that runs the on-demand view ``solaris_resolved``: Feast reads the three
stored views one after another (a hash per row per view), converts them to Python lists, runs
the generated function and converts its answer back, about 3x a one-view read
(``benchmarks/README.md``). With ``online_store.type`` set to one of the stores here the same
call, from the SDK or ``feast serve``, is answered by
:class:`~solaris_feast.serving.retriever.SolarisRetriever` instead: all tiers in one round trip,
the tier rule of :mod:`solaris_feast.serving.resolve`, misses queued for the next round. The
registry, the request and the answer (names, types, ZERO's age of -1) are the same;
``tests/test_resolve_parity.py`` pins the two paths to each other.

A request of several users is read in one round trip for all of them
(:meth:`~solaris_feast.serving.retriever.SolarisRetriever.fetch_checked`). A request that mixes
the resolved view with plain views gets the rest from Feast's own read in the same call. Every
other request (plain views alone, a feature service, another on-demand view, short feature
names, ids the retriever refuses, more than 16 embedding versions) goes to Feast's own store
unchanged, so the store is a drop-in for ``redis`` and ``sqlite``::

    online_store:
      type: solaris_feast.serving.online_store.SolarisRedisOnlineStore
      connection_string: ${SOLARIS_REDIS_CONNECTION}
      deadline_ms: 1000      # per 1,000 rows of a request: slower raises OnlineStoreUnavailable
      record_misses: true    # queue exact misses for the planner, as the retriever does

A store failure raises as Feast's own read does: a store that is down or too slow as
:class:`OnlineStoreUnavailable` (a :class:`~solaris_feast.errors.RetryableStoreError`, so a
``ConnectionError``, and a Feast error that ``feast serve`` answers with HTTP 503), any other
failure as the final error itself: a Feast response has no field to say "every row is ZERO
because Redis is down".
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from feast.errors import FeastError
from feast.infra.online_stores.redis import RedisOnlineStore, RedisOnlineStoreConfig
from feast.infra.online_stores.sqlite import SqliteOnlineStore, SqliteOnlineStoreConfig
from feast.repo_config import FeastConfigBaseModel
from pydantic import Field

from solaris_feast.columns import ITEM_ID, USER_ID
from solaris_feast.errors import ConfigError, ModelVersionError, RetryableStoreError
from solaris_feast.serving.resolve import clock_skew_of
from solaris_feast.serving.retriever import RetrieverStats, SolarisRetriever, validate_request
from solaris_feast.store.definitions import MODEL_VERSION_REQUEST_FIELD, SolarisFeastConfig
from solaris_feast.store.ids import join_key_types
from solaris_feast.store.tags import TAG_CLOCK_SKEW_SECONDS, TAG_TIER
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from feast import Entity, FeatureView, OnDemandFeatureView
    from feast.infra.registry.base_registry import BaseRegistry
    from feast.online_response import OnlineResponse
    from feast.repo_config import RepoConfig

    _StoreBase = RedisOnlineStore
else:
    _StoreBase = object


class ResolvedRequestRefused(FeastError, ConfigError):
    """A resolved-view request that cannot be answered as asked: the client's mistake, so
    ``feast serve`` answers 422, not a 500 that reads as an outage; a ``ConfigError`` for SDK
    callers."""

    def http_status_code(self) -> int:
        return 422


class ModelVersionRefused(ResolvedRequestRefused):
    """A request's ``solaris_model_version`` no stored vector carries (an FM's or a VM's card
    version)."""


class OnlineStoreUnavailable(FeastError, RetryableStoreError):
    """The resolved read could not reach the store or finish within its deadline: ``feast
    serve`` answers 503, which clients and load balancers retry, not the 500 of a server bug; a
    :class:`~solaris_feast.errors.RetryableStoreError` (a ``ConnectionError``) for SDK callers,
    as before. Feast's own reads of plain views keep Feast's answer (redis-py's error, a 500)."""

    def http_status_code(self) -> int:
        return 503


DEFAULT_STORE_DEADLINE_MS = 1000.0
"""A Feast client has no deadline of its own; a read slower than this raises instead of waiting
on the socket timeout (the retriever's 50 ms is for serving code that answers ZERO instead)."""
ROWS_PER_DEADLINE = 1000
"""``deadline_ms`` bounds a request of up to this many rows; a larger one gets the deadline in
proportion (:func:`request_deadline_ms`)."""


def request_deadline_ms(deadline_ms: float, rows: int) -> float:
    """The deadline of one resolved read of ``rows`` rows: ``deadline_ms`` up to
    :data:`ROWS_PER_DEADLINE` rows, in proportion above. Feast's own store answers a 50,000-row
    batch in its own time; a fixed second failed such a request (a 500, then a 503) where the
    store it stands in for answered it, while a stalled Redis still fails a request in bounded
    time."""
    return deadline_ms * max(1.0, rows / ROWS_PER_DEADLINE)


MAX_RETRIEVERS_PER_THREAD = 16
"""Retrievers (one per embedding version and set of views) a serving thread keeps. A request
with more versions than this goes to Feast's own read: the versions come from the client, and a
retriever (a connection, the views' decoding) per version would thrash the cache."""
TEARDOWN_TIMEOUT_S = 10.0
"""The longest one store command of a teardown may wait (a large queue's SCAN and DEL)."""
RESOLVED_OUTPUTS = ("resolved_embedding", "resolved_tier", "resolved_age_seconds")
_TIER_BY_NAME = {tier.name: tier for tier in Tier}


class ResolvedReadOptions(FeastConfigBaseModel):
    """How the resolved view's reads behave, beside the Feast store's own options."""

    deadline_ms: float = Field(DEFAULT_STORE_DEADLINE_MS, gt=0)
    """A resolved read of up to :data:`ROWS_PER_DEADLINE` rows slower than this raises
    :class:`OnlineStoreUnavailable` (``feast serve``: 503); a larger request gets it in
    proportion."""
    record_misses: bool = True
    """Queue the pairs served without an exact embedding for the next precompute round."""


class SolarisRedisOnlineStoreConfig(RedisOnlineStoreConfig, ResolvedReadOptions):
    """Feast's Redis config, plus :class:`ResolvedReadOptions`."""

    type: Literal["solaris_feast.serving.online_store.SolarisRedisOnlineStore"] = (
        "solaris_feast.serving.online_store.SolarisRedisOnlineStore"  # type: ignore[assignment]
    )


class SolarisSqliteOnlineStoreConfig(SqliteOnlineStoreConfig, ResolvedReadOptions):
    """Feast's SQLite config, plus :class:`ResolvedReadOptions`."""

    type: Literal["solaris_feast.serving.online_store.SolarisSqliteOnlineStore"] = (
        "solaris_feast.serving.online_store.SolarisSqliteOnlineStore"  # type: ignore[assignment]
    )


class _RequestViews:
    """The registered views of one request as a retriever reads them (``FeatureViewSource``):
    the views Feast resolved for the request, so no second registry lookup is made."""

    def __init__(self, config: RepoConfig, views: Mapping[str, FeatureView]) -> None:
        self._config = config
        self._views = dict(views)

    @property
    def config(self) -> RepoConfig:
        return self._config

    def get_feature_view(self, name: str) -> FeatureView:
        from feast.errors import FeatureViewNotFoundException

        try:
            return self._views[name]
        except KeyError:
            raise FeatureViewNotFoundException(name) from None


class _ResolvedRequest:
    """The resolved view of a request this store answers: its view, tiers and outputs."""

    def __init__(
        self, odfv: OnDemandFeatureView, views_by_tier: dict[Tier, FeatureView], outputs: list[str]
    ) -> None:
        self.odfv = odfv
        self.views_by_tier = views_by_tier
        self.outputs = outputs
        """The requested outputs (``resolved_tier``, ...), in the view's own order."""
        first = views_by_tier[Tier.EXACT]
        self.key = (
            tuple(
                (int(tier), view.name, view.ttl, tuple(sorted(view.tags.items())))
                for tier, view in sorted(views_by_tier.items())
            ),
            tuple(sorted(join_key_types(first).items())),
            odfv.tags.get(TAG_CLOCK_SKEW_SECONDS),
        )

    @property
    def clock_skew_seconds(self) -> float:
        return clock_skew_of(self.odfv.tags)

    def view_names(self) -> SolarisFeastConfig:
        return SolarisFeastConfig(
            pair_view_name=self.views_by_tier[Tier.EXACT].name,
            similar_view_name=self.views_by_tier[Tier.SIMILAR].name,
            user_view_name=self.views_by_tier[Tier.USER_AGG].name,
            resolved_view_name=self.odfv.name,
        )


def resolved_request(
    registry: BaseRegistry, project: str, features: Any
) -> tuple[_ResolvedRequest, list[str]] | None:
    """The solaris resolved view asked for in ``features`` (a request with full names) and the
    other feature refs of the request; None when there is none (Feast answers the request
    itself, refusals included)."""
    from feast import utils

    if (
        not isinstance(features, list)
        or not features
        or not all(isinstance(ref, str) and ":" in ref for ref in features)
    ):
        return None
    context = utils._get_cached_request_context(registry, project, features, True)
    odfvs, grouped_refs = context[1], context[5]
    resolved = [odfv for odfv in odfvs if odfv.tags.get(TAG_TIER) == "RESOLVED"]
    if len(resolved) != 1 or len(odfvs) != 1:
        return None  # another on-demand view in the request: Feast transforms them all
    odfv = resolved[0]
    name = odfv.projection.name_to_use()
    mine = [ref for ref in features if ref.split(":", 1)[0] == name]
    others = [ref for ref in features if ref.split(":", 1)[0] != name]
    outputs = [ref.split(":", 1)[1] for ref in mine]
    if any(out not in RESOLVED_OUTPUTS for out in outputs) or len(set(outputs)) != len(outputs):
        return None
    sources = {projection.name for projection in odfv.source_feature_view_projections.values()}
    views_by_tier: dict[Tier, FeatureView] = {}
    for view, _ in grouped_refs:
        if view.name not in sources:
            continue
        tier = _TIER_BY_NAME.get(view.tags.get(TAG_TIER, ""))
        if tier is None or tier in views_by_tier:
            return None
        views_by_tier[tier] = view
    if set(views_by_tier) != {Tier.EXACT, Tier.SIMILAR, Tier.USER_AGG}:
        return None
    # Feast appends an on-demand view's outputs in the order its function returns them.
    outputs.sort(key=RESOLVED_OUTPUTS.index)
    return _ResolvedRequest(odfv, views_by_tier, outputs), others


def _columns(entity_rows: Any) -> dict[str, list[Any]] | None:
    """Entity rows as columns of plain Python values; None for protos (Feast handles those)."""
    if isinstance(entity_rows, list):
        if not entity_rows or not all(isinstance(row, Mapping) for row in entity_rows):
            return None
        keys = list(entity_rows[0])  # in the caller's order, as Feast builds its columns
        if any(set(row) != set(keys) for row in entity_rows):
            return None
        return {key: [row[key] for row in entity_rows] for key in keys}
    if isinstance(entity_rows, Mapping):
        columns: dict[str, list[Any]] = {}
        for key, values in entity_rows.items():
            if isinstance(values, np.ndarray):
                values = values.tolist()
            if not isinstance(values, list | tuple):
                return None
            columns[key] = list(values)
        return columns
    return None


class ResolvedViewReads(_StoreBase):
    """Answers the resolved view's requests with the retriever; the rest goes to Feast's store.

    One retriever per serving thread, embedding version and set of views (``feast serve`` runs
    requests on a thread pool, and a retriever's counters are not locked).
    """

    _local: threading.local

    def _retrievers(self) -> OrderedDict[tuple[Any, ...], SolarisRetriever]:
        local = self.__dict__.setdefault("_local", threading.local())
        cache: OrderedDict[tuple[Any, ...], SolarisRetriever] | None = getattr(
            local, "retrievers", None
        )
        if cache is None:
            cache = local.retrievers = OrderedDict()
        return cache

    def thread_stats(self) -> list[RetrieverStats]:
        """The counters of the retrievers this thread has read the resolved view with (one per
        embedding version and set of views), for metrics."""
        return [retriever.stats for retriever in self._retrievers().values()]

    def _retriever(
        self, config: RepoConfig, request: _ResolvedRequest, version: str
    ) -> SolarisRetriever:
        """The thread's retriever for ``version``. The one pushed out of the cache is closed:
        a request brings at most :data:`MAX_RETRIEVERS_PER_THREAD` versions, so it is never one
        this request uses."""
        online = config.online_store
        key = (config.project, repr(online), version, request.key)
        cache = self._retrievers()
        retriever = cache.get(key)
        if retriever is not None:
            cache.move_to_end(key)
            return retriever
        # The retriever checks the version (once per new version: a cached one passed).
        try:
            retriever = SolarisRetriever(
                _RequestViews(config, {view.name: view for view in request.views_by_tier.values()}),
                version,
                deadline_ms=float(getattr(online, "deadline_ms", DEFAULT_STORE_DEADLINE_MS)),
                strict=True,
                record_misses=bool(getattr(online, "record_misses", True)),
                views=request.view_names(),
                clock_skew_seconds=request.clock_skew_seconds,
            )
        except ModelVersionError as exc:
            raise ModelVersionRefused(str(exc)) from None
        cache[key] = retriever
        while len(cache) > MAX_RETRIEVERS_PER_THREAD:
            cache.popitem(last=False)[1].close()
        return retriever

    def _answer_resolved(
        self,
        config: RepoConfig,
        features: list[str],
        entity_rows: Any,
        registry: BaseRegistry,
        project: str,
    ) -> OnlineResponse | None:
        """The resolved view's answer, or None when the request is one Feast should answer."""
        from feast import utils
        from feast.online_response import OnlineResponse
        from feast.protos.feast.serving.ServingService_pb2 import (
            FieldStatus,
            GetOnlineFeaturesResponse,
        )
        from feast.protos.feast.types.Value_pb2 import FloatList
        from feast.protos.feast.types.Value_pb2 import Value as ValueProto
        from google.protobuf.timestamp_pb2 import Timestamp

        found = resolved_request(registry, project, features)
        columns = _columns(entity_rows)
        if found is None or columns is None:
            return None
        request, others = found
        keys = [name for name in (USER_ID, ITEM_ID) if name not in columns]
        if keys:
            # Feast's own read answers it: the pair views find nothing without the item, the
            # user view finds the user, so every row came back as the user's aggregate.
            raise ResolvedRequestRefused(
                f"the resolved view needs {' and '.join(keys)} in every entity row "
                f"(it reads pairs); the request has {sorted(columns)}"
            )
        needed = (USER_ID, ITEM_ID, MODEL_VERSION_REQUEST_FIELD)
        if any(name not in columns for name in needed):
            return None  # Feast names what is missing
        users, items, versions = (columns[name] for name in needed)
        n = len(users)
        if n == 0 or len(items) != n or len(versions) != n:
            return None
        groups: dict[tuple[Any, Any], list[int]] = {}
        for row, (user, version) in enumerate(zip(users, versions, strict=True)):
            try:
                groups.setdefault((user, version), []).append(row)
            except TypeError:  # an unhashable id: Feast's own conversion says what is wrong
                return None
        if len({version for _, version in groups}) > MAX_RETRIEVERS_PER_THREAD:
            return None
        # Every group is checked before any read, so a refused id costs no round trip.
        by_version: dict[str, list[tuple[Any, list[Any], list[int]]]] = {}
        for (user, version), rows in groups.items():
            if not isinstance(version, str) or not version:
                return None  # the view's own rule: no version matches, ZERO
            try:
                distinct = list(dict.fromkeys(items[i] for i in rows))
            except TypeError:  # an unhashable item id, as for the user above
                return None
            by_version.setdefault(version, []).append((user, distinct, rows))
        planned = []
        for version, reads in by_version.items():
            retriever = self._retriever(config, request, version)
            try:
                checked = [
                    validate_request(user, distinct, retriever.user_id_type, retriever.item_id_type)
                    for user, distinct, _ in reads
                ]
            except (TypeError, ValueError):
                return None
            planned.append((retriever, checked, reads))
        embeddings = np.zeros((n, planned[0][0].dim), dtype=np.float32)
        tiers = np.zeros(n, dtype=np.int64)
        ages = np.full(n, -1.0)
        # One batched read per version: every user of it in one round trip.
        for retriever, checked, reads in planned:
            try:
                results = retriever.fetch_checked(
                    checked, request_deadline_ms(retriever.deadline_ms, n)
                )
            except RetryableStoreError as exc:
                raise OnlineStoreUnavailable(str(exc)) from exc
            for (_, distinct, rows), result in zip(reads, results, strict=True):
                if len(distinct) == len(rows):  # no repeated pair: rows in items' order
                    picked: Any = slice(None)
                else:
                    position = {item: k for k, item in enumerate(distinct)}
                    picked = [position[items[i]] for i in rows]
                embeddings[rows] = result.embeddings[picked]
                tiers[rows] = result.tiers[picked]
                ages[rows] = result.age_seconds[picked]
        # The on-demand view answers -1 for ZERO's age where the retriever says NaN.
        ages = np.nan_to_num(ages, nan=-1.0)

        (
            join_key_values,
            grouped_refs,
            key_of_entity,
            _,
            _,
            requested_names,
            response,
        ) = utils._prepare_entities_to_read_from_online_store(
            registry=registry,
            project=project,
            features=features,
            entity_values=columns,
            full_feature_names=True,
            native_entity_values=True,
        )
        if others:
            # The request's other features are read as Feast reads them, before the resolved
            # view's columns, as Feast orders them; only the features asked for by name (the
            # three tiers' features the resolved view needs were read above).
            wanted = {tuple(ref.split(":", 1)) for ref in others}
            plain_refs = [
                (view, [f for f in names if (view.projection.name_to_use(), f) in wanted])
                for view, names in grouped_refs
            ]
            self._read_features_per_fv(
                config,
                [(view, names) for view, names in plain_refs if names],
                join_key_values,
                key_of_entity,
                response,
                True,
                False,
            )
        view_name = request.odfv.projection.name_to_use()
        proto_columns: dict[str, list[ValueProto]] = {
            "resolved_embedding": [
                ValueProto(float_list_val=FloatList(val=row)) for row in embeddings.tolist()
            ],
            "resolved_tier": [ValueProto(int64_val=t) for t in tiers.tolist()],
            "resolved_age_seconds": [ValueProto(double_val=a) for a in ages.tolist()],
        }
        empty = Timestamp()
        for output in request.outputs:
            response.metadata.feature_names.val.append(f"{view_name}__{output}")
            response.results.append(
                GetOnlineFeaturesResponse.FeatureVector(
                    values=proto_columns[output],
                    statuses=[FieldStatus.PRESENT] * n,
                    event_timestamps=[empty] * n,
                )
            )
        utils._drop_unneeded_columns(response, requested_names)
        return OnlineResponse(response, feature_types=self._build_feature_types(grouped_refs))

    def teardown(
        self, config: RepoConfig, tables: Sequence[FeatureView], entities: Sequence[Entity]
    ) -> None:
        """Feast's teardown, and the project's miss queue with it: the queue is the plugin's
        own, beside Feast's rows, and Feast's teardown left it (a Redis stream without expiry),
        so a project applied again under the same name drained misses from before."""
        super().teardown(config, tables, entities)
        from solaris_feast.store.backends import OnlineFacts, backend_for

        backend = backend_for(OnlineFacts.of_store(_RequestViews(config, {})), TEARDOWN_TIMEOUT_S)
        try:
            backend.clear_miss_queue()
        finally:
            backend.close()

    def get_online_features(
        self,
        config: RepoConfig,
        features: Any,
        entity_rows: Any,
        registry: BaseRegistry,
        project: str,
        full_feature_names: bool = False,
        include_feature_view_version_metadata: bool = False,
    ) -> OnlineResponse:
        if full_feature_names and not include_feature_view_version_metadata:
            answer = self._answer_resolved(config, features, entity_rows, registry, project)
            if answer is not None:
                return answer
        return super().get_online_features(
            config,
            features,
            entity_rows,
            registry,
            project,
            full_feature_names,
            include_feature_view_version_metadata,
        )

    async def get_online_features_async(
        self,
        config: RepoConfig,
        features: Any,
        entity_rows: Any,
        registry: BaseRegistry,
        project: str,
        full_feature_names: bool = False,
        include_feature_view_version_metadata: bool = False,
    ) -> OnlineResponse:
        # feast serve awaits this on Redis; the retriever's read is synchronous, so it runs on
        # a worker thread (as Feast runs its own sync reads) instead of blocking the event loop.
        if full_feature_names and not include_feature_view_version_metadata:
            answer = await asyncio.to_thread(
                self._answer_resolved, config, features, entity_rows, registry, project
            )
            if answer is not None:
                return answer
        return await super().get_online_features_async(
            config,
            features,
            entity_rows,
            registry,
            project,
            full_feature_names,
            include_feature_view_version_metadata,
        )


class SolarisRedisOnlineStore(ResolvedViewReads, RedisOnlineStore):
    """Feast's Redis online store; the resolved view is answered in one round trip."""


class SolarisSqliteOnlineStore(ResolvedViewReads, SqliteOnlineStore):
    """Feast's SQLite online store; the resolved view is answered by the retriever's read."""


__all__ = [
    "DEFAULT_STORE_DEADLINE_MS",
    "ResolvedReadOptions",
    "ResolvedViewReads",
    "SolarisRedisOnlineStore",
    "SolarisRedisOnlineStoreConfig",
    "SolarisSqliteOnlineStore",
    "SolarisSqliteOnlineStoreConfig",
    "resolved_request",
]
