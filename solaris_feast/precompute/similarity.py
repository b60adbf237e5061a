"""The similarity tier: fill ``z(u, i)`` from the nearest users that hold an exact ``z(v, i)``.

For a target pair the budget did not cover, users close to ``u`` (in the FM's user-side
representation, or in the user aggregate space) that were themselves served item ``i`` recently
have an exact embedding for it; their distance-weighted mean (or the nearest one) stands in for
``u``'s own.

Speed comes from searching once per *distinct target user*, not per pair: each user's
``search_neighbours`` nearest users are fetched in one faiss call, and the per-pair step is a
vectorized lookup of ``(neighbour, item)`` keys in the sorted exact table. The ``k`` nearest
holders of ``i`` are therefore looked for among the user's ``search_neighbours`` nearest users; a
larger ``search_neighbours`` finds more holders of rare items at a linear cost.

The index is exact (``IndexFlatL2``) up to ``exact_index_max_users`` users and approximate above
(HNSW by default, or IVF), or forced by ``index_kind``.

Threads: faiss's OpenMP thread count is process-wide. ``SimilarityConfig.threads`` applies only
while this module builds or searches an index (:func:`faiss_threads`), and the process's count is
restored after, so a fill never changes the threads of other faiss (or OpenMP) users.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from solaris_feast.columns import MEAN_DISTANCE, NEIGHBOUR_COUNT
from solaris_feast.data.schema import ITEM_ID, USER_ID, as_utc
from solaris_feast.errors import SchemaError
from solaris_feast.keys import (
    PairCodes,
    id_array,
    pair_keys,
    rank_within_runs,
    run_starts,
    split_pair_keys,
)
from solaris_feast.pipeline.settings import DEFAULT_FILL_TARGETS_PER_BUDGET
from solaris_feast.precompute.aggregate import EMBEDDING, PairEmbeddings
from solaris_feast.precompute.compute import EmbeddingSink, OrderedWrites
from solaris_feast.precompute.plan import COMPUTED_AT, MODEL_VERSION

logger = logging.getLogger(__name__)


# Lookups per chunk of the (pair, neighbour) join: bounds memory at about 100 MB.
_LOOKUPS_PER_CHUNK = 4_000_000


class SimilarityConfig(BaseModel):
    """How the similarity fill finds and combines neighbours."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    neighbours: int = Field(default=10, gt=0)
    """k: at most this many nearest holders of the item are combined."""
    search_neighbours: int = Field(default=200, gt=0)
    """Users retrieved per distinct target user; the k holders are looked for among them."""
    mode: Literal["weighted", "nearest"] = "weighted"
    """``weighted``: mean weighted by ``1 / (distance + distance_epsilon)``; ``nearest``: the
    nearest holder's vector."""
    distance_epsilon: float = Field(default=1e-3, gt=0)
    """Keeps the weight of a zero-distance neighbour finite."""
    index_kind: Literal["auto", "flat", "hnsw", "ivf"] = "auto"
    """``auto``: ``flat`` up to ``exact_index_max_users`` users, else ``approximate_kind``."""
    approximate_kind: Literal["hnsw", "ivf"] = "ivf"
    """The approximate index ``auto`` picks above the threshold."""
    exact_index_max_users: int = Field(default=20_000, gt=0)
    """Largest user table indexed exactly under ``auto``."""
    hnsw_m: int = Field(default=32, gt=1)
    """HNSW graph degree."""
    hnsw_ef_construction: int = Field(default=64, gt=0)
    """HNSW build-time beam width."""
    hnsw_ef_search: int = Field(default=256, gt=0)
    """HNSW search beam width (raised to ``search_neighbours + 1`` when smaller)."""
    ivf_lists: int | None = Field(default=None, gt=0)
    """IVF cells; default ``sqrt(users)``."""
    ivf_train_points_per_list: int = Field(default=64, gt=0)
    """k-means of the IVF cells trains on at most this many users per cell (a seeded sample):
    the build then costs a fraction of a full k-means and the cells are as good for search."""
    ivf_probe: int = Field(default=16, gt=0)
    """IVF cells visited per query."""
    threads: int | None = Field(default=None, gt=0)
    """faiss OpenMP threads while this module builds or searches an index (restored after);
    ``None`` keeps the process's count."""


@contextmanager
def faiss_threads(threads: int | None) -> Iterator[None]:
    """faiss's OpenMP threads set to ``threads`` inside the block (``None``: left as they are),
    and the process's previous count restored after it."""
    if threads is None:
        yield
        return
    import faiss

    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(threads)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(previous)


@dataclass
class UserIndex:
    """A faiss index over user vectors, with the id map from rows to ``user_id``.

    Attributes:
        user_ids: ``(U,)`` int64 (or object of str for String ids), sorted; row ``r`` of the
            index is ``user_ids[r]``.
        vectors: ``(U, D)`` float32 user vectors in the same order.
        kind: ``flat``, ``hnsw`` or ``ivf``.
        index: The faiss index.
        build_seconds: Wall time of the build.
        threads: faiss threads of its searches (``None``: the process's count).
    """

    user_ids: np.ndarray
    vectors: np.ndarray
    kind: str
    index: Any
    build_seconds: float
    threads: int | None = None

    def rows_of(self, user_ids: np.ndarray) -> np.ndarray:
        """Row of each user in the index, ``-1`` for users it does not hold."""
        pos = np.minimum(np.searchsorted(self.user_ids, user_ids), max(len(self.user_ids) - 1, 0))
        found = len(self.user_ids) > 0
        hit = (self.user_ids[pos] == user_ids) if found else np.zeros(len(user_ids), bool)
        return np.where(hit, pos, -1)

    def search(self, user_ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest other users of each (indexed) user.

        Returns:
            ``(Q, k)`` neighbour ``user_id`` (``-1`` where fewer were found; ``None`` for String
            ids) and ``(Q, k)`` L2 distances (not squared), nearest first; the query user itself
            is left out.
        """
        rows = self.rows_of(id_array(user_ids))
        if (rows < 0).any():
            raise ValueError(f"{int((rows < 0).sum())} query users are not in the index")
        found, distance = self.search_rows(rows, k)
        missing: Any = None if self.user_ids.dtype == object else -1
        neighbour = np.where(found >= 0, self.user_ids[np.maximum(found, 0)], missing)
        return neighbour, distance

    def search_rows(self, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`search` by index row: ``(Q, k)`` neighbour rows (``-1`` where fewer were
        found) and distances. Rows are int64 whatever the id type."""
        k_total = min(k + 1, len(self.user_ids))
        if self.kind == "hnsw":
            self.index.hnsw.efSearch = max(self.index.hnsw.efSearch, k_total)
        with faiss_threads(self.threads):
            squared, found = self.index.search(self.vectors[rows], k_total)
        neighbour = np.where(found == np.asarray(rows)[:, None], -1, found).astype(np.int64)
        # Drop the query user (mostly in column 0) by shifting each row's kept entries left.
        keep = neighbour >= 0
        order = np.argsort(~keep, axis=1, kind="stable")[:, :k]
        neighbour = np.take_along_axis(neighbour, order, axis=1)
        distance = np.sqrt(np.maximum(np.take_along_axis(squared, order, axis=1), 0.0))
        distance = np.where(neighbour >= 0, distance, np.inf).astype(np.float32)
        if neighbour.shape[1] < k:
            pad = k - neighbour.shape[1]
            neighbour = np.pad(neighbour, ((0, 0), (0, pad)), constant_values=-1)
            distance = np.pad(distance, ((0, 0), (0, pad)), constant_values=np.inf)
        return neighbour, distance


def build_user_index(
    user_ids: np.ndarray, vectors: np.ndarray, config: SimilarityConfig | None = None
) -> UserIndex:
    """Index ``(U, D)`` user vectors; the index type follows ``config.index_kind``.

    Duplicate user ids are refused. Vectors are copied to contiguous float32.
    """
    import faiss  # heavy import kept off the DAG parse path

    cfg = config or SimilarityConfig()
    ids = id_array(user_ids)
    vecs = np.asarray(vectors, dtype=np.float32)
    if vecs.ndim != 2 or len(vecs) != len(ids):
        raise ValueError(f"vectors must be (U, D) with U={len(ids)}, got {vecs.shape}")
    if not np.isfinite(vecs).all():
        raise ValueError("user vectors hold NaN or infinite values")
    order = np.argsort(ids, kind="stable")
    ids, vecs = ids[order], np.ascontiguousarray(vecs[order])
    if len(ids) > 1 and (ids[1:] == ids[:-1]).any():
        raise ValueError("user_ids has duplicates: one vector per user")
    kind = cfg.index_kind
    if kind == "auto":
        kind = "flat" if len(ids) <= cfg.exact_index_max_users else cfg.approximate_kind
    dim = vecs.shape[1]
    started = time.perf_counter()
    index: Any
    with faiss_threads(cfg.threads):
        if kind == "flat":
            index = faiss.IndexFlatL2(dim)
        elif kind == "hnsw":
            index = faiss.IndexHNSWFlat(dim, cfg.hnsw_m)
            index.hnsw.efConstruction = cfg.hnsw_ef_construction
            index.hnsw.efSearch = cfg.hnsw_ef_search
        else:
            lists = cfg.ivf_lists or max(1, int(np.sqrt(len(ids))))
            lists = min(lists, max(1, len(ids)))
            quantizer = faiss.IndexFlatL2(dim)
            index = faiss.IndexIVFFlat(quantizer, dim, lists)
            sample_size = min(len(ids), lists * cfg.ivf_train_points_per_list)
            sample = np.random.default_rng(0).choice(len(ids), size=sample_size, replace=False)
            index.cp.max_points_per_centroid = cfg.ivf_train_points_per_list
            index.train(vecs[np.sort(sample)])
            index.nprobe = min(cfg.ivf_probe, lists)
        if len(ids):
            index.add(vecs)
    built = time.perf_counter() - started
    logger.info("user index: %s over %d users (D=%d) in %.2f s", kind, len(ids), dim, built)
    return UserIndex(
        user_ids=ids,
        vectors=vecs,
        kind=kind,
        index=index,
        build_seconds=built,
        threads=cfg.threads,
    )


def aggregate_user_index(
    user_rows: pd.DataFrame, config: SimilarityConfig | None = None
) -> UserIndex:
    """The index a round's fill searches: the ``solaris_user`` view's rows (``user_id``, one
    ``embedding`` each, as :func:`~solaris_feast.precompute.aggregate.aggregate_user_embeddings`
    gives them), so neighbours are users whose recent pair embeddings agree."""
    return build_user_index(
        id_array(user_rows[USER_ID]),
        np.stack(user_rows[EMBEDDING].to_list()).astype(np.float32),
        config,
    )


def similarity_fill(
    index: UserIndex,
    targets: pd.DataFrame,
    exact: PairEmbeddings,
    now: pd.Timestamp,
    model_version: str,
    exact_ttl_seconds: int,
    config: SimilarityConfig | None = None,
    *,
    log: bool = True,
) -> pd.DataFrame:
    """Rows for the ``solaris_similar`` view, one per target pair that found a neighbour.

    Args:
        index: User vectors (see :func:`build_user_index`); targets of unindexed users get no row.
        targets: ``user_id``, ``item_id`` pairs to fill (duplicates are merged).
        exact: Exact pair embeddings; only rows of ``model_version`` computed in
            ``[now - exact_ttl_seconds, now]`` are used, newest per pair. A target that holds a
            fresh exact embedding itself is skipped: the exact tier already serves it.
        now: Fill time (UTC); also the rows' ``computed_at``.
        model_version: The embedding version (the compressor card's version).
        exact_ttl_seconds: Freshness of a usable exact embedding.
        config: ``neighbours`` (k), ``search_neighbours``, ``mode``.
        log: Log the fill's one-line summary at INFO (at DEBUG when False).

    Returns:
        ``user_id``, ``item_id`` (int64, or str for String ids), ``embedding`` (float32
        ``(d,)`` per row), ``neighbour_count`` int64 (holders combined, <= k),
        ``mean_distance`` float32 (mean L2 distance to them), ``model_version``,
        ``computed_at``; sorted by user then item.
    """
    frames = list(
        similarity_fill_parts(
            index, targets, exact, now, model_version, exact_ttl_seconds, config, parts=1, log=log
        )
    )
    return frames[0] if frames else _empty_similar_rows()


def similarity_fill_parts(
    index: UserIndex,
    targets: pd.DataFrame,
    exact: PairEmbeddings,
    now: pd.Timestamp,
    model_version: str,
    exact_ttl_seconds: int,
    config: SimilarityConfig | None = None,
    *,
    parts: int = 1,
    log: bool = False,
) -> Iterable[pd.DataFrame]:
    """:func:`similarity_fill` over ``parts`` ranges of the target users, in user order: the
    rows of part ``p`` are those of the one fill for its users, and the parts together are
    exactly the one fill's rows (a user's targets stay in one part; its neighbours and their
    holders are the same). Each part is computed only when iterated, so a caller can write one
    while the next is computed (:func:`fill_and_write`).

    What the parts share is prepared once, here: the fresh exact rows, the round's id codes,
    the targets left to fill and the holder lookup (before 2026-12-04 each part prepared all of
    it again from the whole exact table). Parts with no row are skipped.
    """
    if parts <= 0:
        raise ValueError(f"parts must be positive, got {parts}")
    cfg = config or SimilarityConfig()
    now_ts = as_utc(now, "now")
    now_s = now_ts.value / 1e9
    for column in (USER_ID, ITEM_ID):
        if column not in targets.columns:
            raise SchemaError("targets", column, "is missing")
    # Row indices rather than a copy: the exact table can hold millions of vectors.
    fresh_rows = exact.usable_rows(model_version, now_s, exact_ttl_seconds)
    fresh_user, fresh_item = exact.user_ids[fresh_rows], exact.item_ids[fresh_rows]
    target_user_ids, target_item_ids = id_array(targets[USER_ID]), id_array(targets[ITEM_ID])
    # From here on users and items are this round's dense codes (sorted ids, so code order is
    # id order): sparse int64 and string ids pack in one int64 pair key; ids come back at the end.
    codes = PairCodes.for_round(
        [index.user_ids, target_user_ids, fresh_user], [target_item_ids, fresh_item]
    )
    index_code = codes.user_codes(index.user_ids)  # sorted, as index.user_ids is
    target_key = np.unique(codes.keys(target_user_ids, target_item_ids))
    exact_key = codes.keys(fresh_user, fresh_item)  # sorted: usable_rows() orders by pair
    # A target served exactly needs no fill; an unindexed user has no neighbours.
    target_key = target_key[~_contains(exact_key, target_key)]
    target_user, target_item = split_pair_keys(target_key)  # sorted by user
    indexed = _contains(index_code, target_user)
    target_user, target_item = target_user[indexed], target_item[indexed]
    # A target whose item no user holds fresh finds no neighbour's z: leave it out before the
    # search rather than scan all its neighbours for nothing (a fifth of the demo round's
    # targets, each scanning every column).
    fresh_item_code = codes.item_codes(fresh_item)
    held = _contains(np.unique(fresh_item_code), target_item)
    target_user, target_item = target_user[held], target_item[held]
    if len(target_user) == 0 or len(fresh_rows) == 0:
        return iter(())
    # Only holders of a target item can match: a smaller table stays in cache.
    exact_rows = np.flatnonzero(np.isin(fresh_item_code, np.unique(target_item)))
    round_ = _FillRound(
        index=index,
        exact=exact,
        codes=codes,
        index_code=index_code,
        target_user=target_user,
        target_item=target_item,
        holder_rows=fresh_rows[exact_rows],
        holders_of=_HolderLookup(index_code, target_item, exact_key[exact_rows]),
        config=cfg,
        now=now_ts,
        model_version=model_version,
        log=log,
    )
    # Target positions where each part's users start: the targets are sorted by user.
    user_starts = run_starts(target_user)
    bounds = [int(chunk[0]) for chunk in np.array_split(user_starts, parts) if len(chunk)]
    return round_.parts(list(zip(bounds, [*bounds[1:], len(target_user)], strict=True)))


@dataclass(frozen=True)
class _FillRound:
    """What the parts of a fill share (:func:`similarity_fill_parts`); ``fill(lo, hi)`` fills
    the targets at positions ``[lo, hi)``, whole users."""

    index: UserIndex
    exact: PairEmbeddings
    codes: PairCodes
    index_code: np.ndarray
    target_user: np.ndarray
    target_item: np.ndarray
    holder_rows: np.ndarray
    """Row in ``exact`` of each holder the lookup answers with."""
    holders_of: _HolderLookup
    config: SimilarityConfig
    now: pd.Timestamp
    model_version: str
    log: bool

    def parts(self, ranges: list[tuple[int, int]]) -> Iterator[pd.DataFrame]:
        """Each range's rows, computed when the caller asks for the next; empty parts skipped."""
        for lo, hi in ranges:
            rows = self.fill(lo, hi)
            if len(rows):
                yield rows

    def fill(self, lo: int, hi: int) -> pd.DataFrame:
        cfg = self.config
        target_user, target_item = self.target_user[lo:hi], self.target_item[lo:hi]
        query_users, query_row = np.unique(target_user, return_inverse=True)
        k_search = min(cfg.search_neighbours, max(len(self.index.user_ids) - 1, 1))
        started = time.perf_counter()
        neighbour_rows, distance = self.index.search_rows(
            np.searchsorted(self.index_code, query_users), k_search
        )
        searched = time.perf_counter() - started
        started = time.perf_counter()

        k = 1 if cfg.mode == "nearest" else cfg.neighbours
        # Per target, the (neighbour column, exact row) of its holders, nearest first. Neighbours
        # are scanned in doubling column blocks and a target leaves the scan once it has k
        # holders: popular items find them among the first few dozen users, so most lookups are
        # skipped.
        found_target: list[np.ndarray] = []
        found_col: list[np.ndarray] = []
        found_row: list[np.ndarray] = []
        holders = np.zeros(len(target_user), dtype=np.int64)
        open_targets = np.arange(len(target_user))
        lo_col, width = 0, min(k_search, max(4 * k, 16))
        while lo_col < k_search and len(open_targets):
            hi_col = min(lo_col + width, k_search)
            step = max(1, _LOOKUPS_PER_CHUNK // (hi_col - lo_col))
            for start in range(0, len(open_targets), step):
                rows_t = open_targets[start : start + step]
                # (T, W) position among the holders of each neighbour's z for the target's item,
                # or -1 (the lookup knows the targets by their position in the whole fill).
                found = self.holders_of.find(
                    neighbour_rows[query_row[rows_t], lo_col:hi_col], rows_t + lo
                ).ravel()
                # Row-major: by target, then nearest first (a flat scan is about twice as fast
                # as a 2-d nonzero).
                at = np.flatnonzero(found >= 0)
                r, c = np.divmod(at, hi_col - lo_col)
                found_target.append(rows_t[r])
                found_col.append(c + lo_col)
                found_row.append(self.holder_rows[found[at]])
                holders += np.bincount(rows_t[r], minlength=len(target_user))
            open_targets = open_targets[holders[open_targets] < k]
            lo_col, width = hi_col, 2 * width

        dim = self.exact.dim
        out_vectors = np.zeros((len(target_user), dim), dtype=np.float32)
        out_count = np.zeros(len(target_user), dtype=np.int64)
        out_distance = np.zeros(len(target_user), dtype=np.float32)
        if found_target:
            t = np.concatenate(found_target)
            c = np.concatenate(found_col)
            e = np.concatenate(found_row)
            # Each column block's finds are in (target, column) order and the blocks follow
            # each other in column order, so a stable sort on the target alone gives the
            # (target, column) order: a merge of a few sorted runs, not a two-key lexsort
            # (10.6 of a fill's 71 ms on the demo round).
            order = np.argsort(t, kind="stable")
            t, c, e = t[order], c[order], e[order]
            rank = rank_within_runs(t)
            keep = rank < k  # the k nearest holders of each target
            t, c, e, rank = t[keep], c[keep], e[keep], rank[keep]
            if len(t):
                dist = distance[query_row[t], c].astype(np.float64)
                weight = 1.0 / (dist + cfg.distance_epsilon) if k > 1 else np.ones_like(dist)
                starts = run_starts(t)
                filled = t[starts]
                counts = np.diff(np.r_[starts, len(t)])
                # The weighted sums as one batched (1 x k) @ (k x D) product over a padded
                # (filled, k) table of holders (a padded slot weighs 0): 4x faster than a
                # reduceat over the gathered rows (30 against 7.5 ms, random 13k targets x 10).
                # float32 sums of at most k terms lose nothing that matters.
                slot = np.repeat(np.arange(len(filled)), counts)
                padded_weight = np.zeros((len(filled), k), dtype=np.float32)
                padded_row = np.zeros((len(filled), k), dtype=np.int64)
                padded_weight[slot, rank] = weight
                padded_row[slot, rank] = e
                weighted = np.matmul(padded_weight[:, None, :], self.exact.vectors[padded_row])
                out_vectors[filled] = (
                    weighted[:, 0, :].astype(np.float64) / np.add.reduceat(weight, starts)[:, None]
                ).astype(np.float32)
                out_count[filled] = counts
                out_distance[filled] = np.add.reduceat(dist, starts) / counts
        done = out_count > 0
        logger.log(
            logging.INFO if self.log else logging.DEBUG,
            "similarity fill: %d of %d pairs filled; %d users searched in %.2f s, joined in %.2f s",
            int(done.sum()),
            len(done),
            len(query_users),
            searched,
            time.perf_counter() - started,
        )
        return pd.DataFrame(
            {
                USER_ID: self.codes.user_ids(target_user[done]),
                ITEM_ID: self.codes.item_ids(target_item[done]),
                EMBEDDING: list(out_vectors[done]),
                NEIGHBOUR_COUNT: out_count[done],
                MEAN_DISTANCE: out_distance[done],
                MODEL_VERSION: self.model_version,
                COMPUTED_AT: self.now,
            }
        )


DENSE_LOOKUP_CELLS = 1 << 20
"""Largest (indexed users x target items) table the fill looks holders up in directly (4 MiB of
int32); a bigger one is a hash lookup of pair keys. The table pays while it stays near the cache:
measured (a whole fill, min of 3) 800 x 201 cells 0.080 s against the hash's 0.117, 2,000 x 250
0.104 against 0.112, level at 4,000 x 400 and 8,000 x 500, and at 20,000 x 800 (16M cells)
1.50 against 1.17 s."""


class _HolderLookup:
    """Which neighbours hold an exact ``z`` for a target's item: ``find`` maps ``(T, W)``
    neighbour rows of the index and the targets' positions to positions in ``holder_keys``.

    Up to :data:`DENSE_LOOKUP_CELLS` cells, a dense ``(users, target items)`` table indexed
    directly (the demo round: 800 x 201); above, a hash lookup (pandas Index) of pair keys, which
    is several times faster than searchsorted for millions of keys. Both answer the same.
    """

    def __init__(
        self, index_code: np.ndarray, target_item: np.ndarray, holder_keys: np.ndarray
    ) -> None:
        self._index_code = index_code
        self._target_item = target_item
        items = np.unique(target_item)
        self._table: np.ndarray | None = None
        if len(index_code) * max(len(items), 1) <= DENSE_LOOKUP_CELLS:
            user, item = split_pair_keys(holder_keys)
            row = np.searchsorted(index_code, user)
            indexed = _contains(index_code, user)  # a holder outside the index is no neighbour
            # One row more than the index, all -1: a missing neighbour (row -1) looks up the last
            # row, so no mask is needed. Flat: one take instead of a 2-d fancy index.
            self._table = np.full((len(index_code) + 1) * len(items), -1, dtype=np.int32)
            self._table[row[indexed] * len(items) + np.searchsorted(items, item[indexed])] = (
                np.flatnonzero(indexed)
            )
            self._item_column = np.searchsorted(items, target_item)
            self._items = len(items)
        else:
            self._keys = pd.Index(holder_keys)

    def find(self, neighbour_rows: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """``(T, W)`` holder position (or -1) of each neighbour row (-1: none) of each target."""
        if self._table is not None:
            # Row -1 times the width lands in the sentinel row (negative indices count from the
            # end).
            return self._table[neighbour_rows * self._items + self._item_column[targets, None]]
        present = neighbour_rows >= 0
        rows = np.maximum(neighbour_rows, 0)
        keys = pair_keys(self._index_code[rows], self._target_item[targets, None])
        found = self._keys.get_indexer(np.where(present, keys, -1).ravel())
        return found.reshape(keys.shape)


def fill_target_count(
    planned_pairs: int, per_budget: float = DEFAULT_FILL_TARGETS_PER_BUDGET, cap: int | None = None
) -> int:
    """How many over-budget pairs a round gives the similarity fill: ``per_budget`` times the
    round's planned pairs, at most ``cap`` when one is set. The DAG, the replay and the round
    benchmark all count their targets here."""
    if planned_pairs < 0 or per_budget < 0 or (cap is not None and cap < 0):
        raise ValueError(
            f"fill targets need planned_pairs, per_budget and cap >= 0, got {planned_pairs}, "
            f"{per_budget}, {cap}"
        )
    count = round(per_budget * planned_pairs)
    return count if cap is None else min(count, cap)


FILL_WRITE_PARTS = 4
"""Parts of users a round's fill is computed and written in (:func:`fill_and_write`): part
``p + 1`` is computed while part ``p`` is written, so only the last part's write is left after the
fill. Measured on the demo round (16k targets): 4 parts cost 7% more fill time than one call
(0.142 s against 0.133 s), 8 parts 32% more. Since the fill got faster (2026-12-05: 65 ms against
a 94 ms write, Redis on loopback) 1, 2 and 4 parts took the same 0.18-0.22 s with their writes;
with each part encoded on the fill's thread while the one before is sent (:func:`fill_and_write`),
4 parts take 153-176 ms against 209-211 for 1 and 177-190 for 8 (medians, two runs)."""


@dataclass(frozen=True)
class FillWrites:
    """What :func:`fill_and_write` filled and wrote."""

    filled: int
    answers: list[Any]
    write_seconds: float
    """Seconds the writes took."""
    write_wait_seconds: float
    """Seconds of them the fill waited for (not hidden behind computing the next part)."""


def fill_and_write(
    parts: Iterable[pd.DataFrame],
    writer: EmbeddingSink,
    *,
    overlap_writes: bool = True,
) -> FillWrites:
    """Each part's rows written through ``writer`` while the next part is computed.

    ``parts`` is a fill in parts, computed as it is iterated: :func:`similarity_fill_parts`
    (``parts=FILL_WRITE_PARTS``). Each part is its own write (whole all-or-nothing transactions
    online, a content-named file offline), so a retry of the same targets rewrites the same rows.

    Returns:
        :class:`FillWrites`: rows filled, the writer's answers (one per non-empty part, in
        order) and the writes' seconds.

    Raises:
        Whatever the writer raises; no later part is written online. With an
        :class:`~solaris_feast.store.write.EmbeddingWriter` each part is checked and logged
        offline on this thread while the one before is sent (``OrderedWrites``'
        ``offline_on_caller``), so the part after a failed send is in the offline log only.
    """
    started = time.perf_counter()
    filled = 0
    with OrderedWrites(writer, overlap=overlap_writes, offline_on_caller=True) as writes:
        for rows in parts:
            if len(rows):
                writes.submit(rows)
                filled += len(rows)
        answers = writes.finish()
    logger.info(
        "similarity fill: %d pairs filled and written in %.2f s (%d parts; %.2f s of writes, "
        "%.2f s not overlapped)",
        filled,
        time.perf_counter() - started,
        len(answers),
        writes.busy_seconds,
        writes.wait_seconds,
    )
    return FillWrites(
        filled=filled,
        answers=answers,
        write_seconds=writes.busy_seconds,
        write_wait_seconds=writes.wait_seconds,
    )


def _contains(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    if len(sorted_keys) == 0:
        return np.zeros(len(keys), dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return np.asarray(sorted_keys[pos] == keys)


def _empty_similar_rows() -> pd.DataFrame:
    return pd.DataFrame(
        {
            USER_ID: np.zeros(0, dtype=np.int64),
            ITEM_ID: np.zeros(0, dtype=np.int64),
            EMBEDDING: pd.Series([], dtype=object),
            NEIGHBOUR_COUNT: np.zeros(0, dtype=np.int64),
            MEAN_DISTANCE: np.zeros(0, dtype=np.float32),
            MODEL_VERSION: pd.Series([], dtype=object),
            COMPUTED_AT: pd.Series([], dtype="datetime64[ns, UTC]"),
        }
    )
