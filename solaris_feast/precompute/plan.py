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
requested
pairs no better than chance, because how often an item is retrieved (its popularity) varies far
more than how well it ranks; the retrieval score carries most of the signal.

A pair whose stored exact embedding stays fresh for longer than ``refresh_margin_seconds`` is
skipped (computing it again would spend budget on nothing); one that expires within the margin,
or has expired, is planned again as a refresh. Ties are broken by ``user_id`` then ``item_id``, so
the same inputs always give the same plan. With ``user_balanced`` the score order is taken per
user first (every user's best pair, then every user's second best, ...), which spreads the
budget when it is unknown which users request next. :func:`shard` cuts a plan into disjoint
parts for parallel workers, keeping each user's pairs in one shard.
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
    split_pair_keys,
)

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
    frame = pd.DataFrame({"key": key, "score": score, "miss": is_miss, "miss_score": score})
    frame.loc[~frame["miss"], "miss_score"] = -np.inf
    grouped = frame.groupby("key", sort=True).agg(
        score=("score", "max"), miss=("miss", "max"), miss_score=("miss_score", "max")
    )
    key = grouped.index.to_numpy(dtype=np.int64)
    score = grouped["score"].to_numpy(dtype=np.float64)
    queued = grouped["miss"].to_numpy(dtype=bool)
    miss_priority = queued & (grouped["miss_score"].to_numpy() >= min_miss_score)
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

    reason = np.where(
        miss_priority, REASON_MISS, np.where(stored, REASON_REFRESH, REASON_NEW)
    ).astype(object)
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
    logger.info(
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
) -> np.ndarray:
    """Planning score of candidate pairs: ``verifier x (retrieval / user's best) ** weight``.

    Args:
        users: ``(P,)`` user id of each pair.
        verifier_score: ``(P,)`` the VM's probability with no embedding.
        retrieval_score: ``(P,)`` the candidate generator's score (>= 0, higher = retrieved
            more surely), ``None`` or NaN for pairs with none (a queued miss that is no longer
            a candidate: having just been requested, it counts as retrieved for sure).
        retrieval_weight: 0 plans by the verifier alone; 1 (default) weighs both equally.

    Returns:
        ``(P,)`` float64 scores in ``[0, max verifier]``; dividing by the user's best retrieval
        score keeps users of few and of many co-occurrences comparable in a global order.
    """
    verifier = np.asarray(verifier_score, dtype=np.float64)
    if retrieval_weight < 0:
        raise ValueError(f"retrieval_weight must be >= 0, got {retrieval_weight}")
    if retrieval_score is None or retrieval_weight == 0 or len(verifier) == 0:
        return verifier.copy()
    retrieval = np.asarray(retrieval_score, dtype=np.float64)
    if retrieval.shape != verifier.shape:
        raise ValueError(
            f"retrieval_score has shape {retrieval.shape}, verifier_score {verifier.shape}"
        )
    if (retrieval < 0).any() or np.isinf(retrieval).any():
        raise SchemaError("candidates", "candidate_score", "has negative or infinite scores")
    user_ids = np.asarray(users, dtype=np.int64)
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

    The mix (splitmix64's finalizer) spreads consecutive ids evenly and does not depend on the
    Python process (``hash()`` of an int would, for negative ids), so every worker agrees.
    """
    if count <= 0:
        raise ValueError(f"shard count must be > 0, got {count}")
    x = np.asarray(user_ids, dtype=np.int64).view(np.uint64).copy()
    with np.errstate(over="ignore"):
        x += np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(count)).astype(np.int64)


def shard(plan: Plan, index: int, count: int) -> Plan:
    """Shard ``index`` of ``count``: the plan's pairs whose user hashes to ``index``.

    The shards of one plan are disjoint and their union is the plan (each pair's user maps to
    exactly one shard); a user's pairs stay together, so one worker sees a whole user. Priority
    order is kept within the shard.
    """
    if not 0 <= index < count:
        raise ValueError(f"shard index must lie in 0..{count - 1}, got {index}")
    mine = shard_of_users(plan.pairs[USER_ID].to_numpy(), count) == index
    pairs = plan.pairs.loc[mine].reset_index(drop=True)
    mine_uncovered = shard_of_users(plan.uncovered[USER_ID].to_numpy(), count) == index
    uncovered = plan.uncovered.loc[mine_uncovered].reset_index(drop=True)
    reason = pairs[REASON].to_numpy()
    stats = replace(
        plan.stats,
        from_misses=int((reason == REASON_MISS).sum()),
        refreshes=int((reason == REASON_REFRESH).sum()),
        new=int((reason == REASON_NEW).sum()),
        over_budget=len(uncovered),
    )
    return Plan(pairs=pairs, uncovered=uncovered, stats=stats, planned_at=plan.planned_at)


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


def read_plan(directory: str | Path) -> Plan:
    """Read a plan stored by :func:`write_plan`."""
    path = Path(directory)
    meta = json.loads((path / "plan.json").read_text())
    return Plan(
        pairs=pd.read_parquet(path / "pairs.parquet"),
        uncovered=pd.read_parquet(path / "uncovered.parquet"),
        stats=PlanStats(**meta["stats"]),
        planned_at=pd.Timestamp(meta["planned_at"]),
    )


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
    state = fresh_state
    if model_version is not None and MODEL_VERSION in state.columns:
        state = state.loc[state[MODEL_VERSION] == model_version]
    computed_s = unix_seconds(state[COMPUTED_AT])
    # Stored pairs of ids this round does not plan cannot matter; the rest get their codes.
    state_user, state_item = id_array(state[USER_ID]), id_array(state[ITEM_ID])
    inside = codes.contains(state_user, state_item)
    computed_s = computed_s[inside]
    state_key = codes.keys(state_user[inside], state_item[inside])
    # Several rows for one pair: the newest decides.
    newest = pd.Series(computed_s).groupby(state_key).max()
    known_key = newest.index.to_numpy(dtype=np.int64)
    known_s = newest.to_numpy(dtype=np.float64)
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
