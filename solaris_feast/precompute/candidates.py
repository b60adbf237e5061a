"""Candidate items per active user: the pairs the verifier scores before the FM budget is spent.

Three sources, all computed from the log strictly before ``now`` (a replay never sees the future):

* **co-occurrence**: items that followed the user's recent items in other users' sequences
  (item transitions within ``cooccurrence_span`` steps, counted over the look-back);
* **category popularity**: the most popular items of the categories the user's recent items fall in;
* **recent popularity**: the items most consumed over the last ``recent_popularity_seconds``,
  which fills users with a thin history.

Each source gives a score in ``[0, 1]`` per ``(user, item)``; the final score is their weighted sum
and every user keeps the ``candidates_per_user`` best items, ties broken by ``item_id`` so that the
same log always yields the same table. The round's tables (each item's co-occurring
neighbours, each category's popular items, the popular items) are built once; users are then
scored ``USERS_PER_CHUNK`` at a time from those tables alone, vectorized within a chunk (every
step per user is independent, so the table is the one-pass table).

Complexity, with ``E`` events in the look-back, ``U`` active users, ``S`` the co-occurrence span,
``R`` recent items per user, ``K`` neighbours kept per item, ``C`` categories per user and ``N``
candidates per user: time ``O(E·S·log(E·S) + U·(R·K + C·N + N)·log(...))`` (dominated by the sorts
of the co-occurrence pairs and of the merged candidate rows), memory ``O(E + U·R + B·(R·K + C·N +
N))`` for chunks of ``B`` users (the co-occurrence pairs are counted one step of the span at a
time). Measured at 100,000 users (2M events, 10 candidates each): peak 1.2 GB against 4.0 GB for
one pass over every user.

A user-supplied candidate table can replace the generated one; :func:`validate_candidate_table`
checks it against the same contract.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from solaris_feast.data.schema import EVENT_TIMESTAMP, ITEM_ID, USER_ID, as_utc
from solaris_feast.errors import SchemaError
from solaris_feast.keys import (
    PairCodes,
    checked_id_column,
    fits_pair_keys,
    id_array,
    pair_keys,
    rank_within_runs,
    split_pair_keys,
)

logger = logging.getLogger(__name__)

USERS_PER_CHUNK = 20_000
"""Users scored together; a chunk's expansions (recent items x neighbours) bound the memory."""

CANDIDATE_SCORE = "candidate_score"
SOURCE = "source"
SOURCES: tuple[str, ...] = ("cooccurrence", "category", "popular")
"""Values of the ``source`` column: which source contributed most to a candidate's score."""


class CandidateConfig(BaseModel):
    """How candidates are generated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    candidates_per_user: int = Field(default=200, gt=0)
    """N: candidate items kept per active user."""
    lookback_seconds: int = Field(default=30 * 86400, gt=0)
    """Events older than ``now - lookback_seconds`` are ignored by every source."""
    active_window_seconds: int = Field(default=7 * 86400, gt=0)
    """A user is active when they have an event in ``[now - active_window_seconds, now)``."""
    recent_items_per_user: int = Field(default=10, gt=0)
    """R: the user's most recent distinct items that seed co-occurrence and categories."""
    cooccurrence_span: int = Field(default=3, gt=0)
    """S: an item co-occurs with the next S items of the same user's sequence (both directions)."""
    neighbours_per_item: int = Field(default=40, gt=0)
    """K: co-occurring items kept per item (the most frequent)."""
    category_column: str | None = None
    """Item categorical column used for category popularity; ``None`` turns that source off."""
    categories_per_user: int = Field(default=3, gt=0)
    """C: the user's most frequent categories among their recent items."""
    recent_popularity_seconds: int = Field(default=86400, gt=0)
    """Window of the "recently popular" source; falls back to the look-back when it is empty."""
    cooccurrence_weight: float = Field(default=1.0, ge=0.0)
    """Weight of the co-occurrence score in the final score."""
    category_weight: float = Field(default=0.5, ge=0.0)
    """Weight of the category popularity score in the final score."""
    popular_weight: float = Field(default=0.25, ge=0.0)
    """Weight of the recent popularity score in the final score."""
    exclude_recent_items: bool = False
    """Drop the user's own recent items from their candidates (off: re-consumption is common)."""
    exclude_seen_items: bool = False
    """Drop every item the user interacted with before ``now``, however long ago: for logs where
    an item is consumed once (ratings, purchases of durable goods), where no past pair recurs."""


def generate_candidates(
    interactions: pd.DataFrame,
    now: pd.Timestamp,
    config: CandidateConfig | None = None,
    *,
    items: pd.DataFrame | None = None,
    users: Sequence[int] | Sequence[str] | np.ndarray | None = None,
) -> pd.DataFrame:
    """Candidate items for each active user, from the log strictly before ``now``.

    Args:
        interactions: The log (``user_id``, ``item_id``, ``event_timestamp`` UTC); rows at or after
            ``now`` are ignored.
        now: The time the candidates are for (UTC).
        config: Generation settings; defaults to :class:`CandidateConfig`.
        items: Item attribute table holding ``config.category_column`` (needed by that source).
        users: The users to generate for; default: users active in the active window. Users with no
            history get the recently popular items only.

    Returns:
        ``user_id``, ``item_id`` (int64, or str for String ids, as in the log),
        ``candidate_score`` float32, ``source`` str; at most ``candidates_per_user`` rows per
        user, sorted by user, then score descending, then item.

    Sparse int64 ids (up to 2**63-1) and String ids are mapped to this call's dense codes
    (:class:`~solaris_feast.keys.PairCodes`, sorted ids, so every tie breaks as by id) and back;
    ids that fit a pair key as they are skip the mapping.
    """
    for column in (USER_ID, ITEM_ID, EVENT_TIMESTAMP):
        if column not in interactions.columns:
            raise SchemaError("interactions", column, "is missing")
    log_users = checked_id_column("interactions", interactions, USER_ID)
    log_items = checked_id_column("interactions", interactions, ITEM_ID)
    wanted = None if users is None else id_array(np.asarray(users))
    if fits_pair_keys(log_users, log_items) and (wanted is None or fits_pair_keys(wanted, wanted)):
        return _generate_candidates(interactions, now, config, items=items, users=users)
    codes = PairCodes.of([log_users], [log_items])
    coded_items = None
    if items is not None and ITEM_ID in items.columns:
        # Items the log never saw can never be candidates: their attributes are not needed.
        known = codes.has_items(items[ITEM_ID])
        coded_items = items.loc[known].assign(
            **{ITEM_ID: codes.item_codes(items.loc[known, ITEM_ID])}
        )
    coded_users = None if wanted is None else codes.user_codes(wanted[codes.has_users(wanted)])
    out = _generate_candidates(
        interactions.assign(
            **{USER_ID: codes.user_codes(log_users), ITEM_ID: codes.item_codes(log_items)}
        ),
        now,
        config,
        items=items if coded_items is None else coded_items,
        users=coded_users,
    )
    user_ids, item_ids = out[USER_ID].to_numpy(), out[ITEM_ID].to_numpy()
    return out.assign(**{USER_ID: codes.users[user_ids], ITEM_ID: codes.items[item_ids]})


def _generate_candidates(
    interactions: pd.DataFrame,
    now: pd.Timestamp,
    config: CandidateConfig | None,
    *,
    items: pd.DataFrame | None,
    users: Sequence[int] | Sequence[str] | np.ndarray | None,
) -> pd.DataFrame:
    """:func:`generate_candidates` on ids that fit a pair key."""
    cfg = config or CandidateConfig()
    now = as_utc(now, "now")
    for column in (USER_ID, ITEM_ID, EVENT_TIMESTAMP):
        if column not in interactions.columns:
            raise SchemaError("interactions", column, "is missing")
    ts = interactions[EVENT_TIMESTAMP]
    start = now - pd.Timedelta(seconds=cfg.lookback_seconds)
    log = interactions.loc[(ts >= start) & (ts < now), [USER_ID, ITEM_ID, EVENT_TIMESTAMP]]
    # Stable sort by time within user: the sequence order that co-occurrence and recency rely on.
    log = log.sort_values([USER_ID, EVENT_TIMESTAMP, ITEM_ID], kind="stable").reset_index(drop=True)

    if users is None:
        active = active_users(log, now, cfg)
    else:
        active = np.unique(np.asarray(users, dtype=np.int64))
    if len(active) == 0 or log.empty:
        return _empty_candidates()

    seen_keys = np.zeros(0, dtype=np.int64)
    if cfg.exclude_seen_items:
        past = interactions.loc[ts < now, [USER_ID, ITEM_ID]]
        past = past.loc[past[USER_ID].isin(active)]
        seen_keys = pair_keys(past[USER_ID].to_numpy(np.int64), past[ITEM_ID].to_numpy(np.int64))
    recent = _recent_items(log, active, cfg.recent_items_per_user)
    wants_category = cfg.category_weight > 0 and cfg.category_column is not None
    if wants_category and (items is None or cfg.category_column not in items.columns):
        raise SchemaError(
            "items", str(cfg.category_column), "is missing (needed by category_column)"
        )
    tables = _RoundTables.of(log, items, now, cfg)
    # The round's tables are computed once; each chunk of users is scored from them alone, so
    # memory is bounded by the chunk, not by the users (every step per user is independent).
    parts = []
    for lo in range(0, len(active), USERS_PER_CHUNK):
        users_chunk = active[lo : lo + USERS_PER_CHUNK]
        # recent is sorted by user: the chunk's rows are one slice of it.
        first = np.searchsorted(recent.user, users_chunk[0], side="left")
        last = np.searchsorted(recent.user, users_chunk[-1], side="right")
        chunk_recent = _Scores(
            recent.user[first:last], recent.item[first:last], recent.score[first:last]
        )
        parts.append(_score_users(users_chunk, chunk_recent, tables, seen_keys, cfg))
    out = pd.concat(parts, ignore_index=True) if parts else _empty_candidates()
    logger.info("candidates: %d pairs for %d users from %d events", len(out), len(active), len(log))
    return out


def _score_users(
    users: np.ndarray,
    recent: _Scores,
    tables: _RoundTables,
    seen_keys: np.ndarray,
    cfg: CandidateConfig,
) -> pd.DataFrame:
    """Candidates of ``users`` (sorted) from their ``recent`` items and the round's tables."""
    parts: list[tuple[int, _Scores]] = []
    if tables.neighbours is not None:
        parts.append((0, tables.neighbours.scores(recent)))
    if tables.category is not None:
        parts.append((1, tables.category.scores(recent, cfg)))
    if tables.popular is not None:
        top_items, top_scores = tables.popular
        # Cross join of the users and the top-N items: O(U·N) rows, the fill for thin histories.
        parts.append(
            (
                2,
                _Scores(
                    np.repeat(users, len(top_items)),
                    np.tile(top_items, len(users)),
                    np.tile(top_scores, len(users)),
                ),
            )
        )
    parts = [(src, s) for src, s in parts if len(s.user)]
    if not parts:
        return _empty_candidates()

    weights = (cfg.cooccurrence_weight, cfg.category_weight, cfg.popular_weight)
    # One int64 key per pair turns the merge of the sources into a sort plus bincounts.
    keys = np.concatenate([pair_keys(s.user, s.item) for _, s in parts])
    unique_keys, inverse = np.unique(keys, return_inverse=True)
    per_source = np.zeros((len(unique_keys), len(SOURCES)), dtype=np.float64)
    offset = 0
    for src, s in parts:
        part_inverse = inverse[offset : offset + len(s.user)]
        per_source[:, src] = np.bincount(
            part_inverse, weights=s.score * weights[src], minlength=len(unique_keys)
        )
        offset += len(s.user)
    total = per_source.sum(axis=1)
    # The source label is the biggest contributor (argmax keeps the first on ties).
    source = per_source.argmax(axis=1)
    user, item = split_pair_keys(unique_keys)
    if cfg.exclude_recent_items or cfg.exclude_seen_items:
        seen = np.isin(unique_keys, pair_keys(recent.user, recent.item))
        if cfg.exclude_seen_items:
            seen |= np.isin(unique_keys, seen_keys)
        user, item, total, source = user[~seen], item[~seen], total[~seen], source[~seen]
    # Rows are sorted by (user, item), so position breaks score ties by item_id.
    order = _order_group_then_score_desc(user, total)
    user, item, total, source = user[order], item[order], total[order], source[order]
    keep = rank_within_runs(user) < cfg.candidates_per_user
    return pd.DataFrame(
        {
            USER_ID: user[keep].astype(np.int64),
            ITEM_ID: item[keep].astype(np.int64),
            CANDIDATE_SCORE: total[keep].astype(np.float32),
            SOURCE: np.asarray(SOURCES, dtype=object)[source[keep]],
        }
    )


def active_users(
    interactions: pd.DataFrame, now: pd.Timestamp, config: CandidateConfig | None = None
) -> np.ndarray:
    """The users candidates are generated for by default: those with an event in the active
    window before ``now`` (sorted distinct ids, as in the log). A sharded round takes its
    shard's part of them (:func:`solaris_feast.precompute.plan.users_of_shard`)."""
    cfg = config or CandidateConfig()
    now = as_utc(now, "now")
    ts = interactions[EVENT_TIMESTAMP]
    start = now - pd.Timedelta(seconds=min(cfg.active_window_seconds, cfg.lookback_seconds))
    return np.unique(id_array(interactions.loc[(ts >= start) & (ts < now), USER_ID]))


def validate_candidate_table(
    frame: pd.DataFrame,
    *,
    candidates_per_user: int | None = None,
    num_items: int | None = None,
) -> pd.DataFrame:
    """Check a user-supplied candidate table and return it in the generated table's form.

    Required columns: ``user_id`` and ``item_id`` (non-negative integers or non-empty strings,
    no duplicate pairs).
    ``candidate_score`` (float, >= 0, higher is better) is optional; without it the row order
    within a user is the rank.
    A user with more than ``candidates_per_user`` rows keeps the best ones (by score, then item).

    Raises:
        SchemaError: naming the first column that breaks the contract.
    """
    table = "candidates"
    ids = {}
    for column in (USER_ID, ITEM_ID):
        if column not in frame.columns:
            raise SchemaError(table, column, f"is missing (columns present: {list(frame.columns)})")
        ids[column] = checked_id_column(table, frame, column)
    dense_items = ids[ITEM_ID].dtype != object
    if num_items is not None and dense_items and len(frame) and frame[ITEM_ID].max() >= num_items:
        raise SchemaError(table, ITEM_ID, f"has ids outside 0..{num_items - 1}")
    duplicated = frame.duplicated([USER_ID, ITEM_ID])
    if duplicated.any():
        first = frame.loc[duplicated].iloc[0]
        raise SchemaError(
            table,
            ITEM_ID,
            f"has {int(duplicated.sum())} duplicate (user_id, item_id) pairs, "
            f"for instance ({first[USER_ID]}, {first[ITEM_ID]})",
        )
    if CANDIDATE_SCORE in frame.columns:
        scores = frame[CANDIDATE_SCORE].to_numpy(dtype=np.float64)
        if not np.isfinite(scores).all():
            raise SchemaError(table, CANDIDATE_SCORE, "has NaN or infinite scores")
        # The planner weighs a candidate by its score over its user's best: a ratio that needs
        # scores >= 0, kept as float32 (a larger score became inf there).
        negative = scores < 0
        if negative.any():
            raise SchemaError(
                table,
                CANDIDATE_SCORE,
                f"has {int(negative.sum())} negative scores (the lowest {scores.min():.6g}): "
                "scores must be >= 0, higher is better; map a log-probability or a negative "
                "distance to one first (exp, or 1 / (1 + distance))",
            )
        if len(scores) and scores.max() > np.finfo(np.float32).max:
            raise SchemaError(
                table,
                CANDIDATE_SCORE,
                f"has scores beyond float32's range (the highest {scores.max():.6g}): "
                "scale them down",
            )
    else:
        # Row order is the user's ranking: turn it into a decreasing score so sorting keeps it.
        rank = frame.groupby(USER_ID, sort=False).cumcount().to_numpy()
        scores = 1.0 / (1.0 + rank)
    out = pd.DataFrame(
        {
            USER_ID: ids[USER_ID],
            ITEM_ID: ids[ITEM_ID],
            CANDIDATE_SCORE: scores.astype(np.float32),
            SOURCE: frame[SOURCE].astype(str).to_numpy() if SOURCE in frame.columns else "supplied",
        }
    )
    out = out.sort_values(
        [USER_ID, CANDIDATE_SCORE, ITEM_ID], ascending=[True, False, True], kind="stable"
    )
    if candidates_per_user is not None:
        keep = out.groupby(USER_ID, sort=False).cumcount() < candidates_per_user
        if not keep.all():
            logger.info(
                "candidate table: dropped %d rows over the per-user cap", int((~keep).sum())
            )
        out = out.loc[keep]
    return out.reset_index(drop=True)


@dataclass(frozen=True)
class _Scores:
    """Per-source scores as parallel arrays (``user``, ``item`` int64; ``score`` in [0, 1])."""

    user: np.ndarray
    item: np.ndarray
    score: np.ndarray


def _order_group_then_score_desc(group: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Indices ordering rows by ``group`` ascending, then ``score`` descending, then position.

    Equivalent to ``np.lexsort((position, -score, group))`` but two plain sorts, about twice as
    fast as lexsort on millions of rows.
    """
    n = len(group)
    by_score = np.argsort(-score, kind="stable")
    score_rank = np.empty(n, dtype=np.int64)
    score_rank[by_score] = np.arange(n, dtype=np.int64)
    shift = max(int(group.min(initial=0)), 0) if n else 0
    return np.argsort((group - shift).astype(np.int64) * max(n, 1) + score_rank, kind="stable")


def _expand_ranges(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For row j, the indices ``starts[j] .. starts[j] + lengths[j] - 1``, with their row j."""
    owner = np.repeat(np.arange(len(starts)), lengths)
    offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return owner, np.repeat(starts, lengths) + offsets


def _recent_items(log: pd.DataFrame, active: np.ndarray, per_user: int) -> _Scores:
    """The user's ``per_user`` most recent distinct items; ``score`` is ``1 / (1 + rank)``."""
    user = log[USER_ID].to_numpy(dtype=np.int64)
    item = log[ITEM_ID].to_numpy(dtype=np.int64)
    mine = np.isin(user, active)
    user, item = user[mine], item[mine]
    # log is sorted by (user, time); reversed, each user's events run newest first.
    user, item = user[::-1], item[::-1]
    order = np.argsort(user, kind="stable")
    user, item = user[order], item[order]
    frame = pd.DataFrame({"u": user, "i": item})
    first_seen = ~frame.duplicated(["u", "i"], keep="first").to_numpy()
    user, item = user[first_seen], item[first_seen]
    rank = rank_within_runs(user)
    keep = rank < per_user
    return _Scores(user[keep], item[keep], 1.0 / (1.0 + rank[keep]))


@dataclass(frozen=True)
class _Neighbours:
    """Each seed item's best ``neighbours_per_item`` co-occurring items, their counts scaled by
    the seed's best (the round's, from every user's sequences)."""

    seeds: np.ndarray
    seed_start: np.ndarray
    seed_len: np.ndarray
    neighbour: np.ndarray
    norm: np.ndarray

    @classmethod
    def of(cls, log: pd.DataFrame, cfg: CandidateConfig) -> _Neighbours | None:
        user = log[USER_ID].to_numpy(dtype=np.int64)
        item = log[ITEM_ID].to_numpy(dtype=np.int64)
        # Counted step by step (S passes over E events), so at most one step's transitions are
        # held at once rather than all S.
        counted: list[pd.Series] = []
        for step in range(1, cfg.cooccurrence_span + 1):
            same_user = user[:-step] == user[step:]
            a, b = item[:-step][same_user], item[step:][same_user]
            a, b = np.concatenate([a, b]), np.concatenate([b, a])
            distinct = a != b
            keys, counts = np.unique(pair_keys(a[distinct], b[distinct]), return_counts=True)
            counted.append(pd.Series(counts, index=keys))
        if not counted:
            return None
        total = pd.concat(counted).groupby(level=0, sort=True).sum()
        if len(total) == 0:
            return None
        a, b = split_pair_keys(total.index.to_numpy(dtype=np.int64))
        counts = total.to_numpy(dtype=np.float64)
        order = _order_group_then_score_desc(a, counts)
        a, b, counts = a[order], b[order], counts[order]
        keep = rank_within_runs(a) < cfg.neighbours_per_item
        a, b, counts = a[keep], b[keep], counts[keep]
        seeds, seed_start, seed_len = np.unique(a, return_index=True, return_counts=True)
        norm = counts / np.repeat(counts[seed_start], seed_len)
        return cls(seeds, seed_start, seed_len, b, norm)

    def scores(self, recent: _Scores) -> _Scores:
        """Each seed item contributes at most 1 (its best neighbour), scaled by its recency."""
        if len(recent.item) == 0:
            return _empty_scores()
        pos = np.minimum(np.searchsorted(self.seeds, recent.item), len(self.seeds) - 1)
        has = self.seeds[pos] == recent.item
        owner, idx = _expand_ranges(self.seed_start[pos[has]], self.seed_len[pos[has]])
        return _sum_per_pair(
            recent.user[has][owner], self.neighbour[idx], recent.score[has][owner] * self.norm[idx]
        )


@dataclass(frozen=True)
class _CategoryPopular:
    """Each category's most engaged items, scaled by its best (the round's)."""

    category_of: np.ndarray
    cat_ids: np.ndarray
    cat_start: np.ndarray
    cat_len: np.ndarray
    popular_items: np.ndarray
    norm: np.ndarray

    @classmethod
    def of(cls, log: pd.DataFrame, items: pd.DataFrame, cfg: CandidateConfig) -> _CategoryPopular:
        column = cfg.category_column
        item_ids = items[ITEM_ID].to_numpy(dtype=np.int64)
        category_of = np.full(int(item_ids.max(initial=0)) + 1, -1, dtype=np.int64)
        category_of[item_ids] = items[column].to_numpy(dtype=np.int64)
        popular_items, popularity = np.unique(
            log[ITEM_ID].to_numpy(dtype=np.int64), return_counts=True
        )
        cats = _category(category_of, popular_items)
        known = cats >= 0
        popular_items, popularity, cats = popular_items[known], popularity[known], cats[known]
        order = np.lexsort((popular_items, -popularity, cats))
        popular_items, popularity, cats = popular_items[order], popularity[order], cats[order]
        keep = rank_within_runs(cats) < cfg.candidates_per_user
        popular_items, popularity, cats = popular_items[keep], popularity[keep], cats[keep]
        cat_ids, cat_start, cat_len = np.unique(cats, return_index=True, return_counts=True)
        norm = popularity / np.repeat(popularity[cat_start], cat_len).astype(np.float64)
        return cls(category_of, cat_ids, cat_start, cat_len, popular_items, norm)

    def scores(self, recent: _Scores, cfg: CandidateConfig) -> _Scores:
        """The user's category shares among their recent items, recency-weighted, top C of
        them, each bringing its popular items."""
        if len(self.cat_ids) == 0:
            return _empty_scores()
        recent_cats = _category(self.category_of, recent.item)
        known = recent_cats >= 0
        affinity = _sum_per_pair(recent.user[known], recent_cats[known], recent.score[known])
        if len(affinity.user) == 0:
            return _empty_scores()
        user_total = pd.Series(affinity.score).groupby(affinity.user).transform("sum").to_numpy()
        share = affinity.score / user_total
        order = np.lexsort((affinity.item, -share, affinity.user))
        a_user, a_cat, share = affinity.user[order], affinity.item[order], share[order]
        keep = rank_within_runs(a_user) < cfg.categories_per_user
        a_user, a_cat, share = a_user[keep], a_cat[keep], share[keep]
        pos = np.minimum(np.searchsorted(self.cat_ids, a_cat), len(self.cat_ids) - 1)
        has = self.cat_ids[pos] == a_cat
        owner, idx = _expand_ranges(self.cat_start[pos[has]], self.cat_len[pos[has]])
        return _normalize_per_user(
            _Scores(a_user[has][owner], self.popular_items[idx], share[has][owner] * self.norm[idx])
        )


def _category(category_of: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Category of each item id; -1 for ids the item table does not hold."""
    inside = ids < len(category_of)
    return np.where(inside, category_of[np.minimum(ids, len(category_of) - 1)], -1)


def _top_items(
    log: pd.DataFrame, now: pd.Timestamp, cfg: CandidateConfig
) -> tuple[np.ndarray, np.ndarray]:
    """The round's ``candidates_per_user`` most engaged items lately, scores scaled by the best."""
    window = log.loc[
        log[EVENT_TIMESTAMP] >= now - pd.Timedelta(seconds=cfg.recent_popularity_seconds)
    ]
    if window.empty:
        window = log
    top_items, counts = np.unique(window[ITEM_ID].to_numpy(dtype=np.int64), return_counts=True)
    order = np.lexsort((top_items, -counts))[: cfg.candidates_per_user]
    return top_items[order], (counts[order] / counts[order].max()).astype(np.float64)


@dataclass(frozen=True)
class _RoundTables:
    """What every user's candidates are scored from: the round's co-occurrence neighbours,
    popular items per category and popular items (None: that source is off)."""

    neighbours: _Neighbours | None
    category: _CategoryPopular | None
    popular: tuple[np.ndarray, np.ndarray] | None

    @classmethod
    def of(
        cls, log: pd.DataFrame, items: pd.DataFrame | None, now: pd.Timestamp, cfg: CandidateConfig
    ) -> _RoundTables:
        category = None
        if cfg.category_weight > 0 and cfg.category_column is not None and items is not None:
            category = _CategoryPopular.of(log, items, cfg)
        return cls(
            neighbours=_Neighbours.of(log, cfg) if cfg.cooccurrence_weight > 0 else None,
            category=category,
            popular=_top_items(log, now, cfg) if cfg.popular_weight > 0 else None,
        )


def _sum_per_pair(user: np.ndarray, item: np.ndarray, score: np.ndarray) -> _Scores:
    keys, inverse = np.unique(pair_keys(user, item), return_inverse=True)
    summed = np.bincount(inverse, weights=score, minlength=len(keys))
    return _normalize_per_user(_Scores(*split_pair_keys(keys), summed))


def _normalize_per_user(scores: _Scores) -> _Scores:
    """Scale ``score`` to ``[0, 1]`` per user so the sources' weights mean the same for everyone."""
    if len(scores.user) == 0:
        return _empty_scores()
    best = pd.Series(scores.score).groupby(scores.user).transform("max").to_numpy()
    return _Scores(scores.user, scores.item, scores.score / best)


def _empty_scores() -> _Scores:
    return _Scores(
        np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    )


def _empty_candidates() -> pd.DataFrame:
    return pd.DataFrame(
        {
            USER_ID: np.array([], dtype=np.int64),
            ITEM_ID: np.array([], dtype=np.int64),
            CANDIDATE_SCORE: np.array([], dtype=np.float32),
            SOURCE: np.array([], dtype=object),
        }
    )
