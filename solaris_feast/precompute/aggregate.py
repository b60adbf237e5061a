"""The user-only tier: each user's mean exact pair embedding over the last window (default 24 h).

When the cache holds no exact ``z(u, i)`` for a requested pair, the user's recent pair embeddings
still say a lot about the user; their mean is the second fallback after the similarity fill. Only
one ``model_version`` is averaged at a time: vectors of two compressors live in different spaces,
so mixing them would produce a meaningless point.

A pair computed several times in the window counts once, with its newest vector: refreshes and
re-runs of the same interval must not weigh a pair more (the precompute DAG is retried).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from solaris_feast.columns import EMBEDDING, PAIR_COUNT
from solaris_feast.data.schema import ITEM_ID, USER_ID, as_utc
from solaris_feast.errors import SchemaError
from solaris_feast.keys import dense_pair_keys, id_array, run_starts
from solaris_feast.pipeline.settings import DEFAULT_AGGREGATE_WINDOW_SECONDS
from solaris_feast.precompute.plan import COMPUTED_AT, MODEL_VERSION, unix_seconds
from solaris_feast.serving.resolve import usable_rows
from solaris_feast.store.layout import version_matches
from solaris_feast.store.offline import in_write_order, newest_per_key

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PairEmbeddings:
    """Exact pair embeddings as parallel arrays (the fast form of the ``solaris_pair`` rows).

    Attributes:
        user_ids: ``(N,)`` int64, or object of str for String ids.
        item_ids: ``(N,)`` int64, or object of str.
        vectors: ``(N, d)`` float32.
        computed_at_s: ``(N,)`` float64 unix seconds.
        model_versions: ``(N,)`` object array of version strings.
    """

    user_ids: np.ndarray
    item_ids: np.ndarray
    vectors: np.ndarray
    computed_at_s: np.ndarray
    model_versions: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.user_ids)
        if self.vectors.ndim != 2:
            raise ValueError(f"vectors must be (N, d), got shape {self.vectors.shape}")
        for name in ("item_ids", "vectors", "computed_at_s", "model_versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} rows, user_ids has {n}")

    def __len__(self) -> int:
        return len(self.user_ids)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, dim: int | None = None) -> PairEmbeddings:
        """From ``user_id``, ``item_id``, ``embedding`` (one array per row), ``model_version``,
        ``computed_at`` (UTC datetime or unix seconds), as read from the offline or online store.
        """
        table = "pair_embeddings"
        for column in (USER_ID, ITEM_ID, EMBEDDING, MODEL_VERSION, COMPUTED_AT):
            if column not in frame.columns:
                raise SchemaError(table, column, f"is missing (columns: {list(frame.columns)})")
        frame = in_write_order(frame)  # a later row is a later write (ties of computed_at)
        if len(frame):
            rows = [np.asarray(v, dtype=np.float32) for v in frame[EMBEDDING]]
            shapes = {row.shape for row in rows}
            if len(shapes) != 1 or len(next(iter(shapes))) != 1:
                raise SchemaError(
                    table, EMBEDDING, f"rows must be vectors of one length, got shapes {shapes}"
                )
            # One concatenate is 3x np.stack's speed on a round's rows.
            vectors = np.concatenate(rows).reshape(len(rows), -1)
        else:
            vectors = np.zeros((0, dim or 0), dtype=np.float32)
        if dim is not None and vectors.shape[1] != dim:
            raise SchemaError(table, EMBEDDING, f"has dimension {vectors.shape[1]}, expected {dim}")
        return cls(
            user_ids=id_array(frame[USER_ID]),
            item_ids=id_array(frame[ITEM_ID]),
            vectors=vectors,
            computed_at_s=unix_seconds(frame[COMPUTED_AT]),
            model_versions=frame[MODEL_VERSION].astype(object).to_numpy(),
        )

    def select(self, rows: np.ndarray) -> PairEmbeddings:
        """The rows picked by a boolean mask or an index array."""
        return PairEmbeddings(
            user_ids=self.user_ids[rows],
            item_ids=self.item_ids[rows],
            vectors=self.vectors[rows],
            computed_at_s=self.computed_at_s[rows],
            model_versions=self.model_versions[rows],
        )

    def usable(self, model_version: str, now_s: float, ttl_seconds: float) -> PairEmbeddings:
        """Rows the tier rule would serve at ``now_s`` with ``ttl_seconds``, newest per pair
        only, sorted by ``(user_id, item_id)``; see :meth:`usable_rows`."""
        return self.select(self.usable_rows(model_version, now_s, ttl_seconds))

    def usable_rows(self, model_version: str, now_s: float, ttl_seconds: float) -> np.ndarray:
        """Indices of the rows :meth:`usable` keeps, in its order (no vectors are copied).

        Freshness is the serving rule itself (:func:`~solaris_feast.serving.resolve.usable_rows`:
        ``0 <= now_s - computed_at <= ttl_seconds``, a vector exactly TTL old is in, as served),
        with no clock-skew allowance: a pair computed after ``now_s`` is never averaged, so a
        re-run for the same interval makes the same rows. NaN or inf vectors are left out too.
        """
        keep = usable_rows(
            self.vectors,
            np.ones(len(self), dtype=bool),
            version_matches(self.model_versions, model_version),
            self.computed_at_s,
            now_s,
            ttl_seconds,
            clock_skew_seconds=0.0,
        )
        rows = np.flatnonzero(keep)
        if len(rows) == 0:
            return rows
        # Dense codes of this table's ids: sparse int64 and string ids pack in one int64 key.
        pair_key = dense_pair_keys(self.user_ids[rows], self.item_ids[rows])
        if not (np.diff(pair_key) > 0).all():
            # One stable sort by pair, then the newest row of each run of equal pairs (the last
            # of the newest on ties, the later write, as the online store keeps it): a single
            # int64 sort is several times faster than a lexsort.
            by_pair = np.argsort(pair_key, kind="stable")
            rows, pair_key = rows[by_pair], pair_key[by_pair]
            starts = run_starts(pair_key)
            run = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(rows)]))
            at = self.computed_at_s[rows]
            newest = np.flatnonzero(at == np.maximum.reduceat(at, starts)[run])
            keep_last = np.r_[run[newest][1:] != run[newest][:-1], True]
            rows = rows[newest[keep_last]]
        return rows


class AggregateConfig(BaseModel):
    """How the user-only tier is computed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window_seconds: int = Field(default=DEFAULT_AGGREGATE_WINDOW_SECONDS, gt=0)
    """Pairs computed in ``[now - window_seconds, now]`` are averaged (the tier rule's TTL
    boundary: a pair exactly ``window_seconds`` old is in)."""
    weighting: Literal["uniform", "recency"] = "uniform"
    """``uniform``: plain mean; ``recency``: weight ``0.5 ** (age / half_life_seconds)``."""
    half_life_seconds: float = Field(default=6 * 3600.0, gt=0)
    """Half-life of the recency weighting (ignored by ``uniform``)."""
    min_pairs: int = Field(default=1, gt=0)
    """Users with fewer distinct pairs in the window get no aggregate row."""


def aggregate_user_embeddings(
    pairs: PairEmbeddings | pd.DataFrame,
    now: pd.Timestamp,
    model_version: str,
    config: AggregateConfig | None = None,
) -> pd.DataFrame:
    """Rows for the ``solaris_user`` view: each user's weighted mean pair embedding.

    Args:
        pairs: Exact pair embeddings (:class:`PairEmbeddings` or its frame form); rows of another
            ``model_version``, outside the window, after ``now`` or with a NaN/inf component
            are ignored.
        now: End of the window (UTC); also the ``computed_at`` of the rows, so a re-run for the
            same interval writes the same rows.
        model_version: The embedding version to average (the compressor card's version).
        config: Window and weighting.

    Returns:
        ``user_id`` (int64, or str for String ids), ``embedding`` (one float32 ``(d,)`` array
        per row), ``pair_count`` int64, ``model_version`` str, ``computed_at`` UTC timestamp;
        sorted by ``user_id``.
    """
    cfg = config or AggregateConfig()
    table = pairs if isinstance(pairs, PairEmbeddings) else PairEmbeddings.from_frame(pairs)
    now_s = as_utc(now, "now").value / 1e9
    window = table.usable(model_version, now_s, cfg.window_seconds)
    if len(window) == 0:
        return _empty_user_rows()
    # usable() sorted by user, so each user's rows are one contiguous run.
    user = window.user_ids
    starts = run_starts(user)
    counts = np.diff(np.r_[starts, len(user)])
    if cfg.weighting == "recency":
        weight = np.power(0.5, (now_s - window.computed_at_s) / cfg.half_life_seconds)
    else:
        weight = np.ones(len(window), dtype=np.float64)
    weighted = window.vectors.astype(np.float64) * weight[:, None]
    sums = np.add.reduceat(weighted, starts, axis=0)
    weight_sums = np.add.reduceat(weight, starts)
    means = (sums / weight_sums[:, None]).astype(np.float32)
    keep = counts >= cfg.min_pairs
    logger.info(
        "user aggregate: %d users from %d pairs (version %s)",
        int(keep.sum()),
        len(window),
        model_version,
    )
    return pd.DataFrame(
        {
            USER_ID: user[starts][keep],
            EMBEDDING: list(means[keep]),
            PAIR_COUNT: counts[keep].astype(np.int64),
            MODEL_VERSION: model_version,
            COMPUTED_AT: pd.Timestamp(now).tz_convert("UTC"),
        }
    )


def _empty_user_rows() -> pd.DataFrame:
    return pd.DataFrame(
        {
            USER_ID: np.zeros(0, dtype=np.int64),
            EMBEDDING: pd.Series([], dtype=object),
            PAIR_COUNT: np.zeros(0, dtype=np.int64),
            MODEL_VERSION: pd.Series([], dtype=object),
            COMPUTED_AT: pd.Series([], dtype="datetime64[ns, UTC]"),
        }
    )


def changed_user_rows(
    rows: pd.DataFrame,
    stored: pd.DataFrame,
    now: pd.Timestamp,
    rewrite_after_seconds: float,
    rtol: float = 1e-6,
) -> pd.DataFrame:
    """The rows of ``rows`` (from :func:`aggregate_user_embeddings`) worth writing: each user's
    aggregate unless the newest ``stored`` row of that user holds the same one.

    A round that computed nothing new would otherwise append a row per user to the offline log
    (the rows carry the round's time, so the content-hashed file is new each round). A stored
    row is the same when its ``model_version`` and ``pair_count`` are equal and its vector is
    within ``rtol`` (the recency weighting rescales every weight each round); it is rewritten
    anyway once it is ``rewrite_after_seconds`` old, so that an unchanged aggregate never runs
    past its view's TTL.

    Args:
        rows: this round's aggregates, one row per user.
        stored: rows already in the user view (``user_id``, ``embedding``, ``pair_count``,
            ``model_version``, ``computed_at``), any number per user; the newest counts. Pass
            only rows older than ``now``: a retried round must rewrite what it wrote itself
            (its online write may not have happened).
        now: the round's time.
        rewrite_after_seconds: age from which a stored aggregate is refreshed even if equal.
    """
    if len(rows) == 0 or len(stored) == 0:
        return rows
    newest = newest_per_key(stored, [USER_ID])
    newest = newest.assign(_at=pd.to_datetime(newest[COMPUTED_AT], utc=True)).set_index(USER_ID)
    old = newest.reindex(rows[USER_ID].to_numpy())
    known = old["_at"].notna().to_numpy()
    age = (as_utc(now, "now") - old["_at"]).dt.total_seconds().to_numpy()
    same = (
        known
        & (age < rewrite_after_seconds)
        & (old[MODEL_VERSION].to_numpy() == rows[MODEL_VERSION].to_numpy())
        & (old[PAIR_COUNT].fillna(-1).to_numpy(dtype=np.int64) == rows[PAIR_COUNT].to_numpy())
    )
    for i in np.flatnonzero(same):
        before = np.asarray(old[EMBEDDING].iat[i], dtype=np.float32)
        after = np.asarray(rows[EMBEDDING].iat[i], dtype=np.float32)
        same[i] = before.shape == after.shape and bool(
            np.allclose(before, after, rtol=rtol, atol=rtol * 1e-1)
        )
    return rows.loc[~same].reset_index(drop=True)
