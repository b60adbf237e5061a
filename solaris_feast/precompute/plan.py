"""The verifier-driven precompute plan: which ``(user, item)`` pairs get the FM this run.

Like speculative decoding, a cheap model (the verifier, i.e. the current VM scoring a pair with a
zero embedding) decides where the expensive one (the FM) is spent. Priority, within a budget of
``budget_pairs`` pairs per run:

1. queued misses (pairs served with no exact embedding) whose verifier score is at least
   ``min_miss_score``, highest score first;
2. every other candidate or queued miss, highest score first.

The score a candidate is planned by is :func:`request_score`: the verifier's probability times
the candidate generator's retrieval score (relative to the user's best candidate). A pair is
requested when retrieval proposes it *and* the ranker keeps it; the VM knows the second factor
only. Measured in the replay (:mod:`solaris_feast.evaluation.replay`), the VM's score alone picks
requested pairs no better than chance, because how often an item is retrieved (its popularity)
varies far more than how well it ranks; the retrieval score carries most of the signal. Neither
says *who* requests within the TTL: :mod:`solaris_feast.precompute.returns` learns that from the
log at each round, and its expected events per user weigh each pair.

A pair whose stored exact embedding stays fresh for longer than ``refresh_margin_seconds`` is
skipped (computing it again would spend budget on nothing); one that expires within the margin,
or has expired, is planned again as a refresh. Ties are broken by ``user_id`` then ``item_id``, so
the same inputs always give the same plan. With ``user_balanced`` the score order is taken per
user first (every user's best pair, then every user's second best, ...), which spreads the
budget when it is unknown which users request next.

Sharded rounds (users hashed to shards by :func:`shard_of_users`, a user's pairs in one shard)
plan each shard with no budget limit, split the round's budget by :func:`split_budget` and cut
each shard's ranking with :func:`take_budget`; :func:`merge_plans` puts the shards' plans back
together for the steps that read the whole round.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from solaris_feast.columns import COMPUTED_AT, MODEL_VERSION
from solaris_feast.data.schema import ITEM_ID, USER_ID, as_utc
from solaris_feast.errors import SchemaError
from solaris_feast.keys import (
    PairCodes,
    checked_id_column,
    id_array,
    rank_within_runs,
    run_starts,
    split_pair_keys,
    stable_id_hash,
)
from solaris_feast.store.layout import version_matches
from solaris_feast.store.offline import in_write_order

logger = logging.getLogger(__name__)

VERIFIER_SCORE = "verifier_score"
REASON = "reason"
PRIORITY = "priority"
QUEUED_MISS = "queued_miss"

REASON_MISS = "miss"
"""Planned from the miss queue (score at least ``min_miss_score``)."""
REASON_REFRESH = "refresh"
"""Planned by score; its stored exact embedding expires within the margin or has expired."""
REASON_NEW = "new"
"""Planned by score; no exact embedding of the current model version is stored."""


@dataclass(frozen=True)
class PlanStats:
    """Counts of one plan.

    Attributes:
        from_misses: Planned pairs taken from the miss queue's priority tier.
        refreshes: Planned pairs (outside the miss tier) whose stored embedding is about to expire.
        new: Planned pairs (outside the miss tier) with no stored embedding.
        skipped_fresh: Distinct candidate or miss pairs skipped because their embedding is fresh.
        over_budget: Eligible pairs left out by the budget (they are :attr:`Plan.uncovered`).
        misses_below_threshold: Queued misses whose score is under ``min_miss_score``; they
            compete with the candidates by score instead of going first.
        budget_pairs: The budget the plan was made under.

    ``from_misses + refreshes + new`` is the number of planned pairs. A shard reports its own
    planned counts; ``skipped_fresh`` and ``misses_below_threshold`` stay run-level figures.
    """

    from_misses: int
    refreshes: int
    new: int
    skipped_fresh: int
    over_budget: int
    misses_below_threshold: int
    budget_pairs: int

    @property
    def planned(self) -> int:
        return self.from_misses + self.refreshes + self.new


@dataclass(frozen=True)
class Plan:
    """The pairs to precompute, in priority order.

    Attributes:
        pairs: ``user_id``, ``item_id``, ``verifier_score`` (float32), ``reason``
            (``miss``/``refresh``/``new``), ``priority`` (0 = first) and ``queued_miss`` (bool).
        uncovered: Pairs that were eligible but did not fit the budget, same columns, in priority
            order: the targets of the similarity fill.
        stats: See :class:`PlanStats`.
        planned_at: The ``now`` the plan was made for.
    """

    pairs: pd.DataFrame
    uncovered: pd.DataFrame
    stats: PlanStats
    planned_at: pd.Timestamp

    def __len__(self) -> int:
        return len(self.pairs)


def plan_precompute(
    candidates: pd.DataFrame,
    queued_misses: pd.DataFrame | None,
    fresh_state: pd.DataFrame | None,
    budget_pairs: int,
    now: pd.Timestamp,
    ttl_seconds: int,
    refresh_margin_seconds: int,
    min_miss_score: float,
    *,
    model_version: str | None = None,
    user_balanced: bool = False,
    log: bool = True,
) -> Plan:
    """Pick at most ``budget_pairs`` pairs for the FM, misses first, then by verifier score.

    Args:
        candidates: ``user_id``, ``item_id``, ``verifier_score``. Duplicate pairs keep their best
            score.
        queued_misses: Same columns (the caller scores the drained queue with the verifier);
            ``None`` or empty when the queue is empty.
        fresh_state: Stored exact embeddings: ``user_id``, ``item_id``, ``computed_at`` (UTC
            datetime or unix seconds), optionally ``model_version``. ``None`` when nothing is
            stored.
        budget_pairs: Most pairs to plan (>= 0).
        now: Planning time (UTC).
        ttl_seconds: TTL of an exact embedding.
        refresh_margin_seconds: A stored embedding that expires within this margin is planned
            again; one that stays fresh longer is skipped. Must be below ``ttl_seconds``.
        min_miss_score: Queued misses scoring at least this go before every candidate.
        model_version: When given, stored rows of another ``model_version`` count as absent, so
            a model change re-plans everything.
        user_balanced: Rank by each pair's place in its user's own ranking first (every user's
            best pair, then every user's second best, ...), then by score. The global order
            spends the budget on the users whose scores run high; the balanced one spreads it
            over every user with candidates, which pays when it is unknown who comes back next.

    Complexity: ``O(P log P)`` for ``P`` candidate and miss rows (a few sorts of int64 keys).
    """
    if budget_pairs < 0:
        raise ValueError(f"budget_pairs must be >= 0, got {budget_pairs}")
    if ttl_seconds <= 0:
        raise ValueError(f"ttl_seconds must be > 0, got {ttl_seconds}")
    if not 0 <= refresh_margin_seconds < ttl_seconds:
        raise ValueError(
            f"refresh_margin_seconds must lie in [0, ttl_seconds={ttl_seconds}), "
            f"got {refresh_margin_seconds}"
        )
    now = as_utc(now, "now")
    cand_user, cand_item, cand_score = _scored_pairs("candidates", candidates)
    if queued_misses is not None and len(queued_misses):
        miss_user, miss_item, miss_score = _scored_pairs("queued_misses", queued_misses)
    else:
        miss_user = miss_item = np.zeros(0, dtype=np.int64)
        miss_score = np.zeros(0, dtype=np.float64)

    # Merge candidates and misses on one int64 key; a pair in both keeps its best score and
    # remembers it was queued.
    user = np.concatenate([cand_user, miss_user])
    item = np.concatenate([cand_item, miss_item])
    score = np.concatenate([cand_score, miss_score])
    is_miss = np.concatenate([np.zeros(len(cand_user), bool), np.ones(len(miss_user), bool)])
    # This round's dense codes: sparse int64 and string ids pack in one int64 key.
    codes = PairCodes.for_round([user], [item])
    key = codes.keys(user, item)
    # Sorted by key and reduced per run of one key (a pandas groupby was 40% of the plan).
    by_key = np.argsort(key, kind="stable")
    key = key[by_key]
    starts = run_starts(key)
    key = key[starts]
    miss_score = np.where(is_miss, score, -np.inf)[by_key]
    score = _run_max(score[by_key], starts)
    queued = _run_max(is_miss[by_key], starts)
    miss_priority = queued & (_run_max(miss_score, starts) >= min_miss_score)
    misses_below = int((queued & ~miss_priority).sum())

    stored, remaining_s = _remaining_seconds(
        fresh_state, key, now, ttl_seconds, model_version, codes
    )
    fresh = stored & (remaining_s > refresh_margin_seconds)
    skipped_fresh = int(fresh.sum())
    eligible = ~fresh
    key, score, queued = key[eligible], score[eligible], queued[eligible]
    miss_priority, stored = miss_priority[eligible], stored[eligible]

    # key is sorted by (user, item): a stable sort on -score then a stable partition by tier gives
    # the order (tier, -score, user, item) without a multi-key lexsort.
    by_score = np.argsort(-score, kind="stable")
    if user_balanced:
        # Place of each pair in its user's ranking, then a stable sort on it: the order becomes
        # (tier, place in the user's ranking, -score, user, item).
        user_of = split_pair_keys(key)[0]
        by_user = by_score[np.argsort(user_of[by_score], kind="stable")]
        place = np.empty(len(key), dtype=np.int64)
        place[by_user] = rank_within_runs(user_of[by_user])
        by_score = by_score[np.argsort(place[by_score], kind="stable")]
    order = np.concatenate([by_score[miss_priority[by_score]], by_score[~miss_priority[by_score]]])
    take, rest = order[:budget_pairs], order[budget_pairs:]

    # Three shared str objects picked by code: np.where over the strings, then astype(object),
    # made one str per pair (21 of a 60 ms plan over 160k candidates).
    reasons = np.array([REASON_NEW, REASON_REFRESH, REASON_MISS], dtype=object)
    reason = reasons[np.where(miss_priority, 2, stored.astype(np.int64))]
    pairs = _pair_frame(codes, key, score, reason, queued, take, first_priority=0)
    uncovered = _pair_frame(codes, key, score, reason, queued, rest, first_priority=len(take))
    planned_reason = reason[take]
    stats = PlanStats(
        from_misses=int((planned_reason == REASON_MISS).sum()),
        refreshes=int((planned_reason == REASON_REFRESH).sum()),
        new=int((planned_reason == REASON_NEW).sum()),
        skipped_fresh=skipped_fresh,
        over_budget=len(rest),
        misses_below_threshold=misses_below,
        budget_pairs=budget_pairs,
    )
    (logger.info if log else logger.debug)(
        "plan: %d pairs (misses %d, refreshes %d, new %d), skipped fresh %d, over budget %d",
        stats.planned,
        stats.from_misses,
        stats.refreshes,
        stats.new,
        stats.skipped_fresh,
        stats.over_budget,
    )
    return Plan(pairs=pairs, uncovered=uncovered, stats=stats, planned_at=now)


def request_score(
    users: np.ndarray,
    verifier_score: np.ndarray,
    retrieval_score: np.ndarray | None,
    retrieval_weight: float = 1.0,
    user_weight: np.ndarray | None = None,
) -> np.ndarray:
    """Planning score of candidate pairs: ``verifier x (retrieval / user's best) ** weight``,
    times the user's weight when given.

    Args:
        users: ``(P,)`` user id of each pair.
        verifier_score: ``(P,)`` the VM's probability with no embedding.
        retrieval_score: ``(P,)`` the candidate generator's score (>= 0, higher = retrieved
            more surely), ``None`` or NaN for pairs with none (a queued miss that is no longer
            a candidate: having just been requested, it counts as retrieved for sure).
        retrieval_weight: 0 plans by the verifier alone; 1 (default) weighs both equally.
        user_weight: ``(P,)`` weights in ``[0, 1]`` of each pair's user: how many events the
            user is expected to have while the pair is fresh, relative to the most any user has
            (:func:`solaris_feast.precompute.returns.return_weights`); ``None`` weighs every
            user alike.

    Returns:
        ``(P,)`` float64 scores in ``[0, max verifier]``; dividing by the user's best retrieval
        score keeps users of few and of many co-occurrences comparable in a global order.
    """
    verifier = np.asarray(verifier_score, dtype=np.float64)
    if retrieval_weight < 0:
        raise ValueError(f"retrieval_weight must be >= 0, got {retrieval_weight}")
    if user_weight is not None:
        weight = np.asarray(user_weight, dtype=np.float64)
        if weight.shape != verifier.shape:
            raise ValueError(
                f"user_weight has shape {weight.shape}, verifier_score {verifier.shape}"
            )
        if not ((weight >= 0) & (weight <= 1)).all():
            raise ValueError("user_weight must lie in [0, 1]")
        verifier = verifier * weight
    if retrieval_score is None or retrieval_weight == 0 or len(verifier) == 0:
        return verifier.copy()
    retrieval = np.asarray(retrieval_score, dtype=np.float64)
    if retrieval.shape != verifier.shape:
        raise ValueError(
            f"retrieval_score has shape {retrieval.shape}, verifier_score {verifier.shape}"
        )
    if (retrieval < 0).any() or np.isinf(retrieval).any():
        raise SchemaError("candidates", "candidate_score", "has negative or infinite scores")
    user_ids = id_array(users)  # Int64 or String ids: only grouped by
    known = ~np.isnan(retrieval)
    best = pd.Series(retrieval[known]).groupby(user_ids[known]).max()
    user_best = best.reindex(user_ids).to_numpy(dtype=np.float64)
    # Pairs without a score, and users whose best score is 0, keep a relative score of 1.
    relative = np.ones(len(verifier))
    scored = known & (user_best > 0)
    relative[scored] = retrieval[scored] / user_best[scored]
    return verifier * relative**retrieval_weight


def shard_of_users(user_ids: np.ndarray, count: int) -> np.ndarray:
    """Shard number ``0..count-1`` of each user: a fixed 64-bit mix of the id, modulo ``count``.

    The mix (splitmix64's finalizer) of the id's :func:`~solaris_feast.keys.stable_id_hash`
    spreads consecutive ids evenly and does not depend on the Python process (``hash()`` would,
    for strings and negative ints), so every worker agrees. Int64 and String ids alike.
    """
    if count <= 0:
        raise ValueError(f"shard count must be > 0, got {count}")
    x = stable_id_hash(user_ids).view(np.uint64).copy()
    with np.errstate(over="ignore"):
        x += np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(count)).astype(np.int64)


def users_of_shard(user_ids: np.ndarray, index: int, count: int) -> np.ndarray:
    """Boolean mask of the ``user_ids`` that hash to shard ``index`` of ``count``."""
    if not 0 <= index < count:
        raise ValueError(f"shard index must lie in 0..{count - 1}, got {index}")
    if count == 1:
        return np.ones(len(user_ids), dtype=bool)
    return shard_of_users(user_ids, count) == index


def shard(plan: Plan, index: int, count: int) -> Plan:
    """Shard ``index`` of ``count``: the plan's pairs whose user hashes to ``index``.

    The shards of one plan are disjoint and their union is the plan (each pair's user maps to
    exactly one shard); a user's pairs stay together, so one worker sees a whole user. Priority
    order is kept within the shard.
    """
    mine = users_of_shard(plan.pairs[USER_ID].to_numpy(), index, count)
    pairs = plan.pairs.loc[mine].reset_index(drop=True)
    mine_uncovered = users_of_shard(plan.uncovered[USER_ID].to_numpy(), index, count)
    uncovered = plan.uncovered.loc[mine_uncovered].reset_index(drop=True)
    stats = replace(plan.stats, **_planned_counts(pairs), over_budget=len(uncovered))
    return Plan(pairs=pairs, uncovered=uncovered, stats=stats, planned_at=plan.planned_at)


def _planned_counts(pairs: pd.DataFrame) -> dict[str, int]:
    """:class:`PlanStats`' planned counts of a plan's (or a part's) pairs, by reason."""
    reason = pairs[REASON].to_numpy()
    return {
        "from_misses": int((reason == REASON_MISS).sum()),
        "refreshes": int((reason == REASON_REFRESH).sum()),
        "new": int((reason == REASON_NEW).sum()),
    }


@dataclass(frozen=True)
class ShardRanking:
    """What the budget split needs to know of one shard's ranked pairs (a plan made with no
    budget limit: every eligible pair, in priority order).

    Attributes:
        priority: Pairs in the miss tier (they go before any candidate, in every shard).
        mass: Sum of the planning scores of the other eligible pairs: the shard's expected
            share of the requested pairs.
        eligible: Every eligible pair of the shard (the most it can take).
    """

    priority: int
    mass: float
    eligible: int

    @classmethod
    def of(cls, ranked: Plan) -> ShardRanking:
        tier = ranked.pairs[REASON].to_numpy() == REASON_MISS
        score = ranked.pairs[VERIFIER_SCORE].to_numpy(dtype=np.float64)
        return cls(
            priority=int(tier.sum()), mass=float(score[~tier].sum()), eligible=len(ranked.pairs)
        )


def split_budget(budget_pairs: int, rankings: list[ShardRanking]) -> list[int]:
    """The round's budget per shard: the miss tier first, the rest by each shard's mass.

    Misses in the priority tier are served first across shards, as in one plan (if they exceed
    the budget, the budget is split by their counts). The remainder goes by
    :attr:`ShardRanking.mass` (largest remainder, ties to the lower shard), never above a
    shard's eligible pairs; what a shard cannot take goes to the others by mass. With users
    hashed evenly, each shard's ranking is a sample of the round's, so this approximates the
    single plan without any task seeing every shard's scores; ``benchmarks/shard_scaling.py``
    measures how close.
    """
    if budget_pairs < 0:
        raise ValueError(f"budget_pairs must be >= 0, got {budget_pairs}")
    count = len(rankings)
    budgets = np.zeros(count, dtype=np.int64)
    if count == 0:
        return []
    priority = np.array([r.priority for r in rankings], dtype=np.int64)
    room = np.array([r.eligible for r in rankings], dtype=np.int64)
    if priority.sum() >= budget_pairs:
        return [int(b) for b in _apportion(budget_pairs, priority.astype(np.float64), priority)]
    budgets += priority
    room -= priority
    left = budget_pairs - int(priority.sum())
    mass = np.array([max(r.mass, 0.0) for r in rankings], dtype=np.float64)
    while left > 0 and room.sum() > 0:
        open_ = room > 0
        weights = np.where(open_, mass, 0.0)
        if weights.sum() <= 0:  # no scores to go by: by room
            weights = room.astype(np.float64)
        share = _apportion(min(left, int(room.sum())), weights, room)
        budgets += share
        room -= share
        left -= int(share.sum())
        if share.sum() == 0:
            break
    return [int(b) for b in budgets]


def _apportion(total: int, weights: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """``total`` split by ``weights`` (largest remainder), each part capped by ``caps``."""
    if total <= 0 or weights.sum() <= 0:
        return np.zeros(len(weights), dtype=np.int64)
    exact = total * weights / weights.sum()
    parts = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - parts), kind="stable")
    parts[order[: total - int(parts.sum())]] += 1
    return np.minimum(parts, caps)


def take_budget(ranked: Plan, budget_pairs: int) -> Plan:
    """The plan ``ranked`` (every eligible pair in priority order) cut to ``budget_pairs``: the
    first pairs are planned, the rest join :attr:`Plan.uncovered` ahead of what was already
    there. The same as planning under that budget, since the order does not depend on it."""
    if budget_pairs < 0:
        raise ValueError(f"budget_pairs must be >= 0, got {budget_pairs}")
    pairs = ranked.pairs.iloc[:budget_pairs].reset_index(drop=True)
    uncovered = pd.concat([ranked.pairs.iloc[budget_pairs:], ranked.uncovered], ignore_index=True)
    uncovered[PRIORITY] = np.arange(len(pairs), len(pairs) + len(uncovered), dtype=np.int64)
    stats = replace(
        ranked.stats,
        **_planned_counts(pairs),
        over_budget=len(uncovered),
        budget_pairs=budget_pairs,
    )
    return Plan(pairs=pairs, uncovered=uncovered, stats=stats, planned_at=ranked.planned_at)


def merge_plans(plans: list[Plan]) -> Plan:
    """One plan from the shards' plans of a round: pairs and uncovered pairs in the priority
    order of one plan (miss tier first, then by score; ties by shard order), counts summed."""
    if not plans:
        raise ValueError("no plans to merge")
    pairs = merge_in_priority_order([p.pairs for p in plans])
    return Plan(
        pairs=pairs,
        uncovered=merge_in_priority_order([p.uncovered for p in plans], first=len(pairs)),
        stats=sum_plan_stats([p.stats for p in plans]),
        planned_at=plans[0].planned_at,
    )


def merge_in_priority_order(frames: list[pd.DataFrame], first: int = 0) -> pd.DataFrame:
    """The shards' pairs (planned, or uncovered) in one plan's priority order: the miss tier
    first, then by score, ties by shard order; ``priority`` renumbered from ``first``."""
    frame = pd.concat(frames, ignore_index=True)
    tier = (frame[REASON] != REASON_MISS).to_numpy()
    score = frame[VERIFIER_SCORE].to_numpy(dtype=np.float64)
    frame = frame.iloc[np.lexsort((-score, tier))].reset_index(drop=True)
    frame[PRIORITY] = np.arange(first, first + len(frame), dtype=np.int64)
    return frame


def sum_plan_stats(stats: list[PlanStats]) -> PlanStats:
    """The counts of a round from its shards' counts."""
    return PlanStats(
        **{name: sum(getattr(s, name) for s in stats) for name in PlanStats.__annotations__}
    )


def write_plan(plan: Plan, directory: str | Path) -> Path:
    """Store a plan as ``pairs.parquet``, ``uncovered.parquet`` and ``plan.json`` in ``directory``.

    This is how the plan crosses task boundaries (Airflow XCom should only carry the path).
    """
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    plan.pairs.to_parquet(path / "pairs.parquet", index=False)
    plan.uncovered.to_parquet(path / "uncovered.parquet", index=False)
    meta = {"stats": asdict(plan.stats), "planned_at": plan.planned_at.isoformat()}
    (path / "plan.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    return path


def _read_plan_meta(directory: Path) -> tuple[PlanStats, pd.Timestamp]:
    """A stored plan's counts and time (its ``plan.json``)."""
    meta = json.loads((directory / "plan.json").read_text())
    return PlanStats(**meta["stats"]), pd.Timestamp(meta["planned_at"])


def read_plan_stats(directory: str | Path) -> PlanStats:
    """The counts of a plan stored by :func:`write_plan`, without reading its pairs."""
    return _read_plan_meta(Path(directory))[0]


def read_plan(directory: str | Path) -> Plan:
    """Read a plan stored by :func:`write_plan` (a fill reads only what it needs of one:
    :func:`read_uncovered`)."""
    path = Path(directory)
    stats, planned_at = _read_plan_meta(path)
    return Plan(
        pairs=pd.read_parquet(path / "pairs.parquet"),
        uncovered=read_uncovered(path),
        stats=stats,
        planned_at=planned_at,
    )


def read_uncovered(directory: str | Path, rows: int | None = None) -> pd.DataFrame:
    """A stored plan's uncovered pairs, best first; with ``rows``, only the first that many,
    without reading the rest (nor the planned pairs: a fill needs only these)."""
    path = Path(directory) / "uncovered.parquet"
    if rows is None:
        return pd.read_parquet(path)
    import pyarrow.parquet as pq

    source = pq.ParquetFile(path)
    batch = next(source.iter_batches(batch_size=max(rows, 1)), None)
    frame = source.schema_arrow.empty_table().to_pandas() if batch is None else batch.to_pandas()
    return frame.head(rows)


def _run_max(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The largest of ``values`` in each run that begins at ``starts`` (bools: any)."""
    if len(starts) == 0:
        return values[:0]
    return np.maximum.reduceat(values, starts)


def _scored_pairs(table: str, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    for column in (USER_ID, ITEM_ID, VERIFIER_SCORE):
        if column not in frame.columns:
            raise SchemaError(table, column, f"is missing (columns present: {list(frame.columns)})")
    ids = {column: checked_id_column(table, frame, column) for column in (USER_ID, ITEM_ID)}
    score = frame[VERIFIER_SCORE].to_numpy(dtype=np.float64)
    if not np.isfinite(score).all():
        raise SchemaError(table, VERIFIER_SCORE, "has NaN or infinite scores")
    return ids[USER_ID], ids[ITEM_ID], score


def _remaining_seconds(
    fresh_state: pd.DataFrame | None,
    key: np.ndarray,
    now: pd.Timestamp,
    ttl_seconds: int,
    model_version: str | None,
    codes: PairCodes,
) -> tuple[np.ndarray, np.ndarray]:
    """For each pair key: whether an exact embedding is stored, and its seconds of life left."""
    stored = np.zeros(len(key), dtype=bool)
    remaining = np.full(len(key), -np.inf)
    if fresh_state is None or len(fresh_state) == 0 or len(key) == 0:
        return stored, remaining
    for column in (USER_ID, ITEM_ID, COMPUTED_AT):
        if column not in fresh_state.columns:
            raise SchemaError("fresh_state", column, "is missing")
    state = in_write_order(fresh_state)  # a tie of computed_at goes to the later write
    computed_s = unix_seconds(state[COMPUTED_AT])
    if model_version is not None and MODEL_VERSION in state.columns:
        of_version = np.asarray(version_matches(state[MODEL_VERSION], model_version), dtype=bool)
    else:
        of_version = np.ones(len(state), dtype=bool)
    # Stored pairs of ids this round does not plan cannot matter; the rest get their codes.
    state_user, state_item = id_array(state[USER_ID]), id_array(state[ITEM_ID])
    inside = codes.contains(state_user, state_item)
    computed_s, of_version = computed_s[inside], of_version[inside]
    state_key = codes.keys(state_user[inside], state_item[inside])
    if len(state_key) == 0:
        return stored, remaining
    # Several rows for one pair: the newest decides, as it does when served; a newer row of
    # another version hides an older one of this version (served: no exact vector), so the
    # pair counts as not stored and is planned again.
    order = np.lexsort((np.arange(len(state_key)), computed_s, state_key))
    last = np.r_[state_key[order][1:] != state_key[order][:-1], True]
    newest = order[last]
    newest = newest[of_version[newest]]
    known_key, known_s = state_key[newest], computed_s[newest]
    if len(known_key) == 0:
        return stored, remaining
    pos = np.minimum(np.searchsorted(known_key, key), len(known_key) - 1)
    stored = known_key[pos] == key
    now_s = now.value / 1e9
    remaining = np.where(stored, known_s[pos] + ttl_seconds - now_s, -np.inf)
    return stored, remaining


def unix_seconds(values: pd.Series) -> np.ndarray:
    """Seconds since the epoch (float64) of a datetime column (any unit, UTC) or numeric one."""
    if pd.api.types.is_datetime64_any_dtype(values):
        dt = (
            values.dt.tz_convert("UTC")
            if values.dt.tz is not None
            else values.dt.tz_localize("UTC")
        )
        return dt.astype("datetime64[ns, UTC]").astype(np.int64).to_numpy() / 1e9
    if pd.api.types.is_numeric_dtype(values):
        return values.to_numpy(dtype=np.float64)
    raise SchemaError(
        "fresh_state", COMPUTED_AT, f"must be a datetime or unix seconds, got {values.dtype}"
    )


def _pair_frame(
    codes: PairCodes,
    key: np.ndarray,
    score: np.ndarray,
    reason: np.ndarray,
    queued: np.ndarray,
    rows: np.ndarray,
    first_priority: int,
) -> pd.DataFrame:
    users, items = codes.split(key[rows])
    return pd.DataFrame(
        {
            USER_ID: users,
            ITEM_ID: items,
            VERIFIER_SCORE: score[rows].astype(np.float32),
            REASON: reason[rows],
            PRIORITY: np.arange(first_priority, first_priority + len(rows), dtype=np.int64),
            QUEUED_MISS: queued[rows],
        }
    )
