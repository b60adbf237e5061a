"""Point-in-time training data: each row sees the embedding tier it would have been served.

The VM is trained on logged ``(user, item, event_timestamp)`` rows. For each row Feast's
``get_historical_features`` joins the latest value of each SOLARIS view at or before the row's
time and within the view's TTL; the same rules as serving then decide the tier (model version
must match, TTL counted from ``computed_at``, exact > similar > user aggregate > zero), so the VM
learns on the mix of tiers it will meet online, not on exact embeddings everywhere.

Not modelled: the delay between computing an embedding and its write to the online store (the
offline log records ``computed_at`` as the event time), so training sees a value slightly earlier
than serving would have.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from solaris_feast.errors import SchemaError
from solaris_feast.store.definitions import EVENT_TIMESTAMP_COLUMN, SolarisFeastConfig
from solaris_feast.store.tags import TAG_EMBEDDING_DIM
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from feast import FeatureStore

_SEARCH_ORDER = (Tier.EXACT, Tier.SIMILAR, Tier.USER_AGG)


def _has_offline_data(store: FeatureStore, view_name: str) -> bool:
    source_path = Path(store.get_feature_view(view_name).batch_source.path)  # type: ignore[union-attr]
    if not source_path.is_absolute() and store.config.repo_path is not None:
        source_path = Path(store.config.repo_path) / source_path
    return source_path.exists() and any(source_path.rglob("*.parquet"))


def _join_view(store: FeatureStore, rows: pd.DataFrame, view_name: str) -> pd.DataFrame:
    """Left-join one view's point-in-time values onto ``rows``, keeping every row.

    Feast's file (dask) offline store drops an entity row whose only matches lie outside the
    TTL, and deduplicates on the view's own join keys plus the timestamp, which collapses rows of
    one user with different items. So each view is asked for its distinct keys only, and the
    answer is merged back; a row Feast dropped gets nulls, which is a miss, as it should be.
    """
    join_keys = list(store.get_feature_view(view_name).join_keys)
    keys = rows[[*join_keys, EVENT_TIMESTAMP_COLUMN]].drop_duplicates(ignore_index=True)
    features = [f"{view_name}:{f}" for f in ("embedding", "model_version", "computed_at")]
    values = store.get_historical_features(
        entity_df=keys, features=features, full_feature_names=True
    ).to_df()
    values[EVENT_TIMESTAMP_COLUMN] = pd.to_datetime(values[EVENT_TIMESTAMP_COLUMN], utc=True)
    merged = rows.merge(values, on=[*join_keys, EVENT_TIMESTAMP_COLUMN], how="left")
    if len(merged) != len(rows):
        raise RuntimeError(f"point-in-time join of {view_name} changed the row count")
    return merged


def training_frame(
    store: FeatureStore,
    entity_df: pd.DataFrame,
    expected_model_version: str,
    views: SolarisFeastConfig | None = None,
) -> pd.DataFrame:
    """The entity rows with the embedding, tier and age each would have been served.

    Args:
        store: Feast store with the SOLARIS views applied and their parquet written.
        entity_df: ``user_id`` int64, ``item_id`` int64, ``event_timestamp`` (UTC) per row.
        expected_model_version: embedding version of the VM to be trained; others are misses.
        views: view names (TTLs come from the registry).

    Returns:
        ``entity_df`` (same row order) plus ``embedding`` (a float32 ``(D,)`` array per row, zeros
        for ZERO), ``tier`` (int8 :class:`Tier`) and ``age_seconds`` (NaN for ZERO). Stack the
        embeddings with :func:`embedding_matrix`.
    """
    names = views or SolarisFeastConfig()
    for column in ("user_id", "item_id", EVENT_TIMESTAMP_COLUMN):
        if column not in entity_df.columns:
            raise SchemaError("entity_df", column, "is missing")
    if not isinstance(entity_df[EVENT_TIMESTAMP_COLUMN].dtype, pd.DatetimeTZDtype):
        raise SchemaError("entity_df", EVENT_TIMESTAMP_COLUMN, "must be timezone-aware (UTC)")
    view_names = names.view_name_by_tier()
    ttl = {t: store.get_feature_view(n).ttl.total_seconds() for t, n in view_names.items()}  # type: ignore[union-attr]
    dim = int(store.get_feature_view(view_names[Tier.EXACT]).tags[TAG_EMBEDDING_DIM])

    rows = entity_df[["user_id", "item_id", EVENT_TIMESTAMP_COLUMN]].reset_index(drop=True)
    rows[EVENT_TIMESTAMP_COLUMN] = (
        rows[EVENT_TIMESTAMP_COLUMN].dt.tz_convert("UTC").astype("datetime64[ns, UTC]")
    )
    joined = rows.copy()
    available = [t for t in _SEARCH_ORDER if _has_offline_data(store, view_names[t])]
    for tier in available:
        joined = _join_view(store, joined, view_names[tier])

    n = len(rows)
    embeddings = np.zeros((n, dim), dtype=np.float32)
    tiers = np.zeros(n, dtype=np.int8)
    ages = np.full(n, np.nan)
    open_rows = np.ones(n, dtype=bool)
    at = pd.to_datetime(joined[EVENT_TIMESTAMP_COLUMN], utc=True)
    for tier in available:
        view = view_names[tier]
        vectors = joined[f"{view}__embedding"].tolist()
        versions = joined[f"{view}__model_version"].tolist()
        computed = pd.to_datetime(joined[f"{view}__computed_at"], utc=True)
        age = (at - computed).dt.total_seconds().to_numpy()
        for i in np.flatnonzero(open_rows):
            vector = vectors[i]
            if vector is None or versions[i] != expected_model_version or np.isnan(age[i]):
                continue
            if age[i] > ttl[tier] or age[i] < 0 or len(vector) != dim:
                continue
            embeddings[i] = np.asarray(vector, dtype=np.float32)
            tiers[i] = tier
            ages[i] = age[i]
            open_rows[i] = False

    out = entity_df.copy()
    out["embedding"] = list(embeddings)
    out["tier"] = tiers
    out["age_seconds"] = ages
    return out


def embedding_matrix(frame: pd.DataFrame) -> np.ndarray:
    """``(N, D)`` float32 from the ``embedding`` column of :func:`training_frame`."""
    return np.stack(frame["embedding"].to_list()).astype(np.float32)
