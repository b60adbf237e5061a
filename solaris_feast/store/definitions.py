"""Feast definitions for SOLARIS embeddings, made by factories.

The three tiers of the layered fallback are three feature views:

- ``solaris_pair`` (user, item): the FM's compressed embedding ``z(u, i)`` of shape ``(D,)``,
  the model version that made it and when; TTL 6 h by default.
- ``solaris_similar`` (user, item): ``z`` filled from the user's nearest neighbours, with the
  neighbour count and their mean distance; TTL 6 h by default.
- ``solaris_user`` (user): the mean of the user's pair embeddings over 24 h and how many pairs it
  averages; TTL 24 h.

A fourth, on-demand view (``solaris_resolved``) resolves them exact > similar > user > zero
inside Feast, so a client with no solaris code gets the resolved vector and its tier from a plain
``store.get_online_features(..., full_feature_names=True)``. It applies the same tier rule as the
retriever: its generated source carries the text of
:func:`solaris_feast.serving.resolve.usable_rows` (TTL, version, NaN/inf, length, null and future
values beyond the clock skew are misses), and a parity test over a grid of cases pins the two.
Full names are required on every online store: the three views share feature names, and without
them Feast hands the transformation one view's values under every name, so the view refuses.
Its ``resolved_age_seconds`` is -1 for ZERO where the retriever says NaN. Bytes that do not
decode as a Feast value never reach the view: Feast's own online read raises
``google.protobuf.message.DecodeError`` for the whole request first (the retriever answers a miss
for that value instead). Everything is built by :func:`solaris_definitions` from a
:class:`SolarisFeastConfig`, so a user can register the views in their own repo under their own
names, dimensions and TTLs.

The stored ``embedding`` is ``Array(Float32)`` with the default ``embedding_codec: float32``;
with ``float16`` or ``int8`` it is Feast ``Bytes`` holding the quantized vector (about 66 and
38 bytes at D = 32 instead of 135, see :mod:`solaris_feast.store.layout`), every view is tagged
``solaris.embedding_codec`` so readers know how to decode it, and the resolved view decodes it
with the text of :func:`solaris_feast.store.layout.dequantize_payloads` (a value of the wrong
size is a miss, served ZERO when no other tier has it). The offline parquet log of a quantized
view holds the same bytes under ``embedding`` (so ``feast materialize`` and Feast's
point-in-time reads see the feature's type) and the float32 vectors under ``embedding_float32``,
which training reads at full precision. Online, ``model_version``
holds the version's 8-character tag (:func:`solaris_feast.store.layout.stored_model_version`);
the resolved view accepts the tag or the full version, so a client asks with the full one.
"""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from solaris_feast.columns import (
    COMPUTED_AT,
    EMBEDDING,
    EVENT_TIMESTAMP,
    ITEM_ID,
    MEAN_DISTANCE,
    MODEL_VERSION,
    NEIGHBOUR_COUNT,
    PAIR_COUNT,
    USER_ID,
    WRITTEN_AT,
)
from solaris_feast.serving.resolve import DEFAULT_CLOCK_SKEW_SECONDS, SEARCH_ORDER, usable_rows
from solaris_feast.store.ids import IdType, feast_value_type
from solaris_feast.store.layout import (
    DEFAULT_EMBEDDING_CODEC,
    EmbeddingCodecName,
    accepted_model_versions,
    dequantize_payloads,
    stored_model_version,
    version_matches,
)
from solaris_feast.store.tags import (
    TAG_CLOCK_SKEW_SECONDS,
    TAG_COMPRESSOR_VERSION,
    TAG_EMBEDDING_CODEC,
    TAG_EMBEDDING_DIM,
    TAG_FM_VERSION,
    TAG_PRODUCING_DAG,
    TAG_SCHEDULE,
    TAG_TIER,
    TAG_TTL_SECONDS,
    TAG_VERIFIER_VERSION,
)
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from feast import Entity, FeatureService, FeatureStore, FeatureView, OnDemandFeatureView

DEFAULT_EMBEDDING_DIM = 32
DEFAULT_PAIR_TTL_SECONDS = 6 * 3600
DEFAULT_USER_TTL_SECONDS = 24 * 3600
DEFAULT_SIMILAR_TTL_SECONDS = 6 * 3600
MAX_TTL_SECONDS = 10 * 366 * 24 * 3600
"""Ten years: past it ``timedelta`` overflows (an ``OverflowError``, not a config error)."""
MAX_EMBEDDING_DIM = 65_536
"""Bigger is a typo, and the codecs would allocate a vector of that length up front."""
MODEL_VERSION_REQUEST_FIELD = "solaris_model_version"
"""Request field of the resolved view: the embedding version the caller's VM was trained with."""


class SolarisFeastConfig(BaseModel):
    """Names, sizes, freshness and lineage of the SOLARIS feature views."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    embedding_dim: Annotated[int, Field(gt=0, le=MAX_EMBEDDING_DIM)] = DEFAULT_EMBEDDING_DIM
    """Length D of every stored embedding (the compressor's output size)."""
    embedding_codec: EmbeddingCodecName = DEFAULT_EMBEDDING_CODEC
    """How every view stores its embedding online: ``float32`` (Feast float list, exact),
    ``float16`` or ``int8`` (Feast bytes; smaller, with a measured NE cost, see
    ``benchmarks/README.md``). The precompute's ``embedding_codec`` setting must name the same."""
    user_entity_name: str = "user"
    """Name of the user entity; its join key is ``user_id`` (typed by ``user_id_type``)."""
    item_entity_name: str = "item"
    """Name of the item entity; its join key is ``item_id`` (typed by ``item_id_type``)."""
    user_id_type: IdType = "int64"
    """``int64`` (any id in [0, 2**63-1], sparse or dense) or ``string`` (Feast
    ``ValueType.STRING``): how user ids are typed in the views, the online keys and the queue."""
    item_id_type: IdType = "int64"
    """``int64`` or ``string``: how item ids are typed (see ``user_id_type``)."""
    pair_view_name: str = "solaris_pair"
    """Feature view of exact FM embeddings keyed by (user, item)."""
    user_view_name: str = "solaris_user"
    """Feature view of 24 h user aggregates keyed by user."""
    similar_view_name: str = "solaris_similar"
    """Feature view of similarity-filled embeddings keyed by (user, item)."""
    resolved_view_name: str = "solaris_resolved"
    """On-demand view that resolves the three tiers inside Feast."""
    service_name: str = "solaris_embeddings"
    """Feature service over the three stored views."""
    pair_ttl_seconds: Annotated[int, Field(gt=0, le=MAX_TTL_SECONDS)] = DEFAULT_PAIR_TTL_SECONDS
    """An exact embedding older than this is a miss."""
    user_ttl_seconds: Annotated[int, Field(gt=0, le=MAX_TTL_SECONDS)] = DEFAULT_USER_TTL_SECONDS
    """A user aggregate older than this is a miss."""
    similar_ttl_seconds: Annotated[int, Field(gt=0, le=MAX_TTL_SECONDS)] = (
        DEFAULT_SIMILAR_TTL_SECONDS
    )
    """A similarity-filled embedding older than this is a miss."""
    clock_skew_seconds: Annotated[float, Field(ge=0, le=MAX_TTL_SECONDS, allow_inf_nan=False)] = (
        DEFAULT_CLOCK_SKEW_SECONDS
    )
    """The resolved view distrusts (misses) a value whose ``computed_at`` lies further than this
    in the future: a writer's broken clock or a bad write."""
    offline_root: str = "data/offline"
    """Folder of the parquet files, one sub-folder per view; relative paths resolve against the
    Feast repo folder."""
    fm_version: str = "unversioned"
    """Lineage tag: version of the foundation model behind the embeddings."""
    compressor_version: str = "unversioned"
    """Lineage tag: version of the compressor; it defines the embedding space."""
    verifier_version: str = "unversioned"
    """Lineage tag: version of the VM used as verifier when planning the precompute."""
    pair_producing_dag: str = "solaris_precompute"
    """Lineage tag: the Airflow DAG that writes the pair view."""
    user_producing_dag: str = "solaris_precompute"
    """Lineage tag: the Airflow DAG that writes the user view (``dags/solaris_precompute.py``
    aggregates users in the same run that writes the pairs)."""
    similar_producing_dag: str = "solaris_precompute"
    """Lineage tag: the Airflow DAG that writes the similar view (the same run fills it)."""
    pair_schedule: str = "@hourly"
    """Lineage tag: cron or preset schedule of the pair DAG."""
    user_schedule: str = "@hourly"
    """Lineage tag: schedule of the DAG that writes the user view."""
    similar_schedule: str = "@hourly"
    """Lineage tag: schedule of the DAG that writes the similar view."""

    @model_validator(mode="after")
    def _names_are_distinct(self) -> SolarisFeastConfig:
        names = [
            self.pair_view_name,
            self.user_view_name,
            self.similar_view_name,
            self.resolved_view_name,
        ]
        if len(set(names)) != len(names):
            raise ValueError(f"feature view names must be distinct, got {names}")
        return self

    def ttl_seconds_by_tier(self) -> dict[Tier, int]:
        return {
            Tier.EXACT: self.pair_ttl_seconds,
            Tier.SIMILAR: self.similar_ttl_seconds,
            Tier.USER_AGG: self.user_ttl_seconds,
        }

    def view_name_by_tier(self) -> dict[Tier, str]:
        return {
            Tier.EXACT: self.pair_view_name,
            Tier.SIMILAR: self.similar_view_name,
            Tier.USER_AGG: self.user_view_name,
        }


_NAME_FIELD_BY_TIER_TAG = {
    Tier.EXACT.name: "pair_view_name",
    Tier.SIMILAR.name: "similar_view_name",
    Tier.USER_AGG.name: "user_view_name",
    "RESOLVED": "resolved_view_name",
}


def applied_view_names(store: FeatureStore) -> SolarisFeastConfig:
    """The names of the SOLARIS views applied in ``store``'s project, found by their tier tag
    (:data:`~solaris_feast.store.tags.TAG_TIER`): a repo that registered them under its own
    names (``SolarisFeastConfig(pair_view_name=...)``) is written and reviewed under those.

    A tier no view is tagged with keeps its default name (so a missing view is reported by the
    name a user would apply); where several views claim a tier, the default name wins if it is
    one of them, else the names are refused.

    Raises:
        ConfigError: two or more views of other names tagged with one tier.
    """
    from solaris_feast.errors import ConfigError

    tagged: dict[str, list[str]] = {}
    objects = [*store.list_feature_views(), *store.list_on_demand_feature_views()]
    for view in objects:
        tier = view.tags.get(TAG_TIER)
        if tier in _NAME_FIELD_BY_TIER_TAG:
            tagged.setdefault(tier, []).append(view.name)
    default = SolarisFeastConfig()
    chosen: dict[str, str] = {}
    for tier, field in _NAME_FIELD_BY_TIER_TAG.items():
        names = sorted(tagged.get(tier, []))
        if not names or getattr(default, field) in names:
            continue
        if len(names) > 1:
            raise ConfigError(
                f"feature views {names} of project {store.config.project!r} are all tagged "
                f"{TAG_TIER}={tier}: keep one SOLARIS registration per project"
            )
        chosen[field] = names[0]
    return default.model_copy(update=chosen)


@dataclass(frozen=True)
class SolarisDefinitions:
    """The Feast objects of one SOLARIS registration, ready for ``store.apply``."""

    config: SolarisFeastConfig
    user: Entity
    item: Entity
    pair_view: FeatureView
    user_view: FeatureView
    similar_view: FeatureView
    resolved_view: OnDemandFeatureView
    service: FeatureService

    def all(self) -> list[Any]:
        """Every object, in the order ``FeatureStore.apply`` accepts them."""
        return [
            self.user,
            self.item,
            self.pair_view,
            self.user_view,
            self.similar_view,
            self.resolved_view,
            self.service,
        ]

    def stored_views(self) -> list[FeatureView]:
        return [self.pair_view, self.similar_view, self.user_view]


def lineage_tags(
    config: SolarisFeastConfig, tier: Tier, producing_dag: str, schedule: str, ttl_seconds: int
) -> dict[str, str]:
    """Tags that trace a stored vector back to the models and the DAG that produced it."""
    return {
        TAG_TIER: tier.name,
        TAG_FM_VERSION: config.fm_version,
        TAG_COMPRESSOR_VERSION: config.compressor_version,
        TAG_VERIFIER_VERSION: config.verifier_version,
        TAG_EMBEDDING_DIM: str(config.embedding_dim),
        TAG_EMBEDDING_CODEC: config.embedding_codec,
        TAG_PRODUCING_DAG: producing_dag,
        TAG_SCHEDULE: schedule,
        TAG_TTL_SECONDS: str(ttl_seconds),
    }


# The resolved view's function is stored in the registry as source text and re-executed by
# Feast (``feast.transformation.udf_rehydrate``) with only numpy/pandas importable, so it must be
# self-contained: view names, TTLs and the tier rule's own text (``usable_rows``, nested so the
# registry text has one top-level function) are written into it rather than imported.
_RESOLVE_SOURCE = '''
def {function_name}(inputs):
    """Resolve exact > similar > user aggregate > zero with solaris's tier rule (generated)."""
    import datetime as _dt
    import time as _time

    import numpy as np

    now_s = _time.time()

    # <usable_rows>
    # <dequantize_payloads>
    # <version_matches>
    tiers = ({tiers})
    dim = {dim}
    codec = {codec!r}
    clock_skew_seconds = {clock_skew_seconds!r}
    views = [view for _tier, view, _ttl in tiers]

    # Every view has features named embedding/model_version/computed_at; only the full names
    # (asked for with full_feature_names=True) say which view a value came from. Without them
    # Feast hands over one view's values under every view's name: Redis adds its "_ts:" fields,
    # and on every store Feast fills the full names with the one short-named list, so they are
    # the very same object. A real request carries the join key; Feast's schema inference
    # (random inputs, shared lists, no join key) must still run.
    shared = [inputs[v + "__embedding"] for v in views if v + "__embedding" in inputs]
    if any("_ts:" + view in inputs for view in views) or (
        "user_id" in inputs and len(set(map(id, shared))) < len(shared)
    ):
        # A Feast error with a 4xx status: feast serve answers the client's mistake with 422,
        # not a 500 that reads as an outage. Still a ValueError for SDK callers.
        from feast.errors import FeastError

        class FullFeatureNamesRequired(FeastError, ValueError):
            def http_status_code(self):
                return 422

        raise FullFeatureNamesRequired(
            "{resolved_view}: call get_online_features(..., full_feature_names=True); "
            "the three tiers share feature names and cannot be told apart otherwise"
        )

    expected = np.fromiter(inputs["{request_field}"], dtype=object)
    n = len(expected)

    def column(view, feature):
        values = inputs.get(view + "__" + feature)
        return [None] * n if values is None else values

    def vectors_of(values, candidates):
        # Nulls, other lengths or other types are misses (not present); the rest are kept.
        if codec != "float32":
            # Quantized bytes: a payload of the wrong size decodes to nothing (a miss).
            picked = candidates.tolist()
            vectors = np.zeros((n, dim), dtype=np.float32)
            present = np.zeros(n, dtype=bool)
            if picked:
                decoded, ok = dequantize_payloads([values[i] for i in picked], codec, dim)
                vectors[picked] = decoded
                present[picked] = ok
            return vectors, present, np.flatnonzero(present).tolist()
        # A float list from Feast holds floats only (one proto type per value), so its first
        # element tells an embedding from an int, bool or string list of the same length.
        rows = [
            i
            for i in candidates.tolist()
            if isinstance(values[i], list)
            and len(values[i]) == dim
            and (dim == 0 or type(values[i][0]) is float)
        ]
        present = np.zeros(n, dtype=bool)
        present[rows] = True
        vectors = np.zeros((n, dim), dtype=np.float32)
        if rows:
            vectors[rows] = np.asarray([values[i] for i in rows], dtype=np.float32)
        return vectors, present, rows

    def seconds(value):
        if not isinstance(value, _dt.datetime):
            return float("nan")
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return value.timestamp()

    embedding_out = np.zeros((n, dim), dtype=np.float32)
    tier_out = np.zeros(n, dtype=np.int64)
    age_out = np.full(n, -1.0)
    open_rows = np.ones(n, dtype=bool)
    for tier, view, ttl_seconds in tiers:
        # Only the rows a better tier has not served are looked at, as the rule's order says.
        vectors, present, rows = vectors_of(column(view, "embedding"), np.flatnonzero(open_rows))
        stamps = column(view, "computed_at")
        computed = np.full(n, np.nan)
        computed[rows] = [seconds(stamps[i]) for i in rows]
        versions = np.fromiter(column(view, "model_version"), dtype=object, count=n)
        take = open_rows & usable_rows(
            vectors,
            present,
            version_matches(versions, expected),
            computed,
            now_s,
            ttl_seconds,
            clock_skew_seconds,
        )
        embedding_out[take] = vectors[take]
        tier_out[take] = tier
        age_out[take] = np.maximum(now_s - computed[take], 0.0)
        open_rows &= ~take
    out = dict(
        resolved_embedding=embedding_out.tolist(),
        resolved_tier=tier_out.tolist(),
        resolved_age_seconds=age_out.tolist(),
    )
    out.update({{"{resolved_view}__" + k: v for k, v in list(out.items())}})
    return out
'''
_USABLE_ROWS_MARK = "    # <usable_rows>\n"
_DEQUANTIZE_MARK = "    # <dequantize_payloads>\n"
_VERSION_MARK = "    # <version_matches>\n"


def resolved_view_source(config: SolarisFeastConfig) -> tuple[str, str]:
    """Source text and function name of the resolved view's transformation."""
    function_name = f"resolve_{config.resolved_view_name}"
    if not function_name.isidentifier():
        raise ValueError(
            f"resolved_view_name {config.resolved_view_name!r} must be a Python identifier"
        )
    ttl = config.ttl_seconds_by_tier()
    views = config.view_name_by_tier()
    tiers = ", ".join(f"({int(t)}, {views[t]!r}, {float(ttl[t])!r})" for t in SEARCH_ORDER)
    source = _RESOLVE_SOURCE.format(
        function_name=function_name,
        request_field=MODEL_VERSION_REQUEST_FIELD,
        tiers=tiers + ",",
        dim=config.embedding_dim,
        codec=config.embedding_codec,
        clock_skew_seconds=float(config.clock_skew_seconds),
        resolved_view=config.resolved_view_name,
    )
    # The rule's own text, not a copy: the retriever and the view cannot drift apart.
    rule = textwrap.indent(inspect.getsource(usable_rows), "    ")
    source = source.replace(_USABLE_ROWS_MARK, rule + "\n")
    # The codec's own decoder, not a copy, for the same reason.
    decoder = textwrap.indent(inspect.getsource(dequantize_payloads), "    ")
    source = source.replace(_DEQUANTIZE_MARK, decoder + "\n")
    # The stored-version rule's own text (tag, accepted values, match), for the same reason.
    versions = "\n".join(
        textwrap.indent(inspect.getsource(f), "    ")
        for f in (stored_model_version, accepted_model_versions, version_matches)
    )
    source = source.replace(_VERSION_MARK, versions + "\n")
    return source.strip() + "\n", function_name


def solaris_definitions(config: SolarisFeastConfig | None = None) -> SolarisDefinitions:
    """Build the entities, the three stored views, the resolved view and the feature service.

    Args:
        config: names, dimension, TTLs and lineage; the defaults give the names every other
            solaris module uses (``solaris_pair``, ``solaris_user``, ``solaris_similar``).
    """
    from feast import (
        Entity,
        FeatureService,
        FeatureView,
        FileSource,
        OnDemandFeatureView,
        RequestSource,
    )
    from feast import Field as FeastField
    from feast.types import Array, Bytes, Float32, Float64, Int64, String, UnixTimestamp

    cfg = config or SolarisFeastConfig()
    user = Entity(
        name=cfg.user_entity_name,
        join_keys=[USER_ID],
        value_type=feast_value_type(cfg.user_id_type),
        description="A user of the recommender",
    )
    item = Entity(
        name=cfg.item_entity_name,
        join_keys=[ITEM_ID],
        value_type=feast_value_type(cfg.item_id_type),
        description="A candidate item",
    )

    def source(view_name: str) -> FileSource:
        return FileSource(
            name=f"{view_name}_source",
            path=f"{cfg.offline_root.rstrip('/')}/{view_name}",
            timestamp_field=EVENT_TIMESTAMP,
            created_timestamp_column=WRITTEN_AT,
            description=f"Append-only parquet of {view_name}, one folder per UTC day",
        )

    stored_type = Array(Float32) if cfg.embedding_codec == "float32" else Bytes
    embedding = FeastField(name=EMBEDDING, dtype=stored_type)
    model_version = FeastField(name=MODEL_VERSION, dtype=String)
    computed_at = FeastField(name=COMPUTED_AT, dtype=UnixTimestamp)

    pair_view = FeatureView(
        name=cfg.pair_view_name,
        entities=[user, item],
        ttl=timedelta(seconds=cfg.pair_ttl_seconds),
        schema=[embedding, model_version, computed_at],
        source=source(cfg.pair_view_name),
        online=True,
        tags=lineage_tags(
            cfg, Tier.EXACT, cfg.pair_producing_dag, cfg.pair_schedule, cfg.pair_ttl_seconds
        ),
        description="Compressed FM embedding z(u, i), precomputed speculatively",
    )
    user_view = FeatureView(
        name=cfg.user_view_name,
        entities=[user],
        ttl=timedelta(seconds=cfg.user_ttl_seconds),
        schema=[
            embedding,
            FeastField(name=PAIR_COUNT, dtype=Int64),
            model_version,
            computed_at,
        ],
        source=source(cfg.user_view_name),
        online=True,
        tags=lineage_tags(
            cfg, Tier.USER_AGG, cfg.user_producing_dag, cfg.user_schedule, cfg.user_ttl_seconds
        ),
        description="Mean of the user's pair embeddings over the last 24 h",
    )
    similar_view = FeatureView(
        name=cfg.similar_view_name,
        entities=[user, item],
        ttl=timedelta(seconds=cfg.similar_ttl_seconds),
        schema=[
            embedding,
            FeastField(name=NEIGHBOUR_COUNT, dtype=Int64),
            FeastField(name=MEAN_DISTANCE, dtype=Float32),
            model_version,
            computed_at,
        ],
        source=source(cfg.similar_view_name),
        online=True,
        tags=lineage_tags(
            cfg,
            Tier.SIMILAR,
            cfg.similar_producing_dag,
            cfg.similar_schedule,
            cfg.similar_ttl_seconds,
        ),
        description="z for the same item, filled from the user's nearest neighbours",
    )

    request = RequestSource(
        name=f"{cfg.resolved_view_name}_request",
        schema=[FeastField(name=MODEL_VERSION_REQUEST_FIELD, dtype=String)],
        description="The embedding version the caller's vertical model was trained with",
    )
    source_text, function_name = resolved_view_source(cfg)
    namespace: dict[str, Any] = {}
    exec(source_text, namespace)  # the same text Feast will re-execute from the registry
    resolved_view = OnDemandFeatureView(
        name=cfg.resolved_view_name,
        # Only the features the rule reads: Feast reads and converts every feature of a source
        # for every row (neighbour_count, mean_distance, pair_count cost 8% of the read here).
        sources=[
            view[[EMBEDDING, MODEL_VERSION, COMPUTED_AT]]
            for view in (pair_view, similar_view, user_view)
        ]
        + [request],
        schema=[
            FeastField(name="resolved_embedding", dtype=Array(Float32)),
            FeastField(name="resolved_tier", dtype=Int64),
            FeastField(name="resolved_age_seconds", dtype=Float64),
        ],
        udf=namespace[function_name],
        udf_string=source_text,
        mode="python",
        tags={
            TAG_TIER: "RESOLVED",
            TAG_CLOCK_SKEW_SECONDS: repr(float(cfg.clock_skew_seconds)),
            TAG_EMBEDDING_DIM: str(cfg.embedding_dim),
            TAG_EMBEDDING_CODEC: cfg.embedding_codec,
            TAG_COMPRESSOR_VERSION: cfg.compressor_version,
        },
        description="Best available embedding, exact > similar > user aggregate > zero",
    )
    service = FeatureService(
        name=cfg.service_name,
        features=[pair_view, similar_view, user_view],
        description="The three SOLARIS embedding tiers",
    )
    return SolarisDefinitions(
        config=cfg,
        user=user,
        item=item,
        pair_view=pair_view,
        user_view=user_view,
        similar_view=similar_view,
        resolved_view=resolved_view,
        service=service,
    )
