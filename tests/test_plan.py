from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solaris_feast.errors import SchemaError
from solaris_feast.precompute.plan import (
    REASON_MISS,
    REASON_NEW,
    REASON_REFRESH,
    Plan,
    ShardRanking,
    merge_plans,
    plan_precompute,
    read_plan,
    read_plan_stats,
    request_score,
    shard,
    shard_of_users,
    split_budget,
    take_budget,
    write_plan,
)

NOW = pd.Timestamp("2026-06-01T12:00:00Z")
# Shards of 1000 of "user:1", "user:2", "alice" and of 0, 1, 2**62, as every release computes them.
PINNED_STRING_SHARDS = [951, 996, 53]
PINNED_INT_SHARDS = [535, 465, 75]
TTL = 6 * 3600
MARGIN = 3600


def _scored(users: list[int], items: list[int], scores: list[float]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "user_id": np.array(users, dtype=np.int64),
            "item_id": np.array(items, dtype=np.int64),
            "verifier_score": scores,
        }
    )


def _random_candidates(
    seed: int, users: int = 50, items: int = 40, rows: int = 800
) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {
            "user_id": rng.integers(0, users, rows).astype(np.int64),
            "item_id": rng.integers(0, items, rows).astype(np.int64),
            # Rounded so that ties occur and the tie-break is exercised.
            "verifier_score": np.round(rng.random(rows), 2),
        }
    )
    return frame.drop_duplicates(["user_id", "item_id"]).reset_index(drop=True)


def _plan(
    candidates: pd.DataFrame,
    misses: pd.DataFrame | None = None,
    state: pd.DataFrame | None = None,
    budget: int = 100,
    threshold: float = 0.5,
    **kwargs: object,
) -> Plan:
    return plan_precompute(candidates, misses, state, budget, NOW, TTL, MARGIN, threshold, **kwargs)  # type: ignore[arg-type]


def test_plan_keeps_budget_and_orders_misses_then_score_with_id_tie_break() -> None:
    cand = _random_candidates(0)
    misses = _random_candidates(1, rows=60)
    plan = _plan(cand, misses, budget=150, threshold=0.5)
    assert len(plan) == 150 == plan.stats.planned

    # Brute-force reference: rank every distinct pair by (tier, -score, user, item).
    rows: dict[tuple[int, int], list[float]] = {}
    for frame, is_miss in ((cand, False), (misses, True)):
        for u, i, s in frame[["user_id", "item_id", "verifier_score"]].itertuples(index=False):
            entry = rows.setdefault((int(u), int(i)), [-1.0, -np.inf])
            entry[0] = max(entry[0], s)
            if is_miss:
                entry[1] = max(entry[1], s)
    ranked = sorted(
        rows.items(), key=lambda kv: (0 if kv[1][1] >= 0.5 else 1, -kv[1][0], kv[0][0], kv[0][1])
    )
    expected = [pair for pair, _ in ranked[:150]]
    got = list(zip(plan.pairs["user_id"], plan.pairs["item_id"], strict=True))
    assert got == expected
    assert plan.pairs["priority"].tolist() == list(range(150))
    assert plan.stats.from_misses == sum(1 for _, v in ranked[:150] if v[1] >= 0.5)
    assert plan.stats.over_budget == len(ranked) - 150 == len(plan.uncovered)
    assert plan.uncovered["priority"].iloc[0] == 150


def test_user_balanced_plan_takes_every_users_best_pair_first() -> None:
    cand = _random_candidates(7)
    misses = _random_candidates(8, rows=30)
    plan = _plan(cand, misses, budget=120, threshold=0.6, user_balanced=True)
    best: dict[tuple[int, int], list[float]] = {}
    for frame, is_miss in ((cand, False), (misses, True)):
        for u, i, s in frame[["user_id", "item_id", "verifier_score"]].itertuples(index=False):
            entry = best.setdefault((int(u), int(i)), [-1.0, -np.inf])
            entry[0] = max(entry[0], s)
            if is_miss:
                entry[1] = max(entry[1], s)
    # Place of each pair in its user's ranking (score desc, item asc).
    place = {}
    for user in {u for u, _ in best}:
        mine = sorted((k for k in best if k[0] == user), key=lambda k: (-best[k][0], k[1]))
        place.update({k: n for n, k in enumerate(mine)})
    ranked = sorted(
        best,
        key=lambda k: (0 if best[k][1] >= 0.6 else 1, place[k], -best[k][0], k[0], k[1]),
    )
    got = list(zip(plan.pairs["user_id"], plan.pairs["item_id"], strict=True))
    assert got == ranked[:120]
    assert len(plan.uncovered) == len(ranked) - 120


def test_queued_miss_below_threshold_competes_by_score() -> None:
    cand = _scored([1, 2], [1, 1], [0.9, 0.8])
    misses = _scored([3, 4], [1, 1], [0.95, 0.2])
    plan = _plan(cand, misses, budget=3, threshold=0.9)
    assert plan.pairs["user_id"].tolist() == [3, 1, 2]
    assert plan.pairs["reason"].tolist() == [REASON_MISS, REASON_NEW, REASON_NEW]
    assert plan.stats.misses_below_threshold == 1


def test_fresh_pairs_are_skipped_and_expiring_or_expired_ones_planned_again() -> None:
    cand = _scored([1, 2, 3, 4, 5], [7, 7, 7, 7, 7], [0.9, 0.8, 0.7, 0.6, 0.5])
    age_s = {
        1: 60,  # fresh for ~6 h: skipped
        2: TTL - MARGIN - 60,  # 61 min left, beyond the 60 min margin: skipped
        3: TTL - MARGIN + 60,  # 59 min left: refresh
        4: TTL + 3600,  # expired an hour ago: refresh
    }
    state = pd.DataFrame(
        {
            "user_id": np.array(list(age_s), dtype=np.int64),
            "item_id": np.full(len(age_s), 7, dtype=np.int64),
            "computed_at": [NOW - pd.Timedelta(seconds=a) for a in age_s.values()],
        }
    )
    plan = _plan(cand, None, state, budget=10)
    assert plan.pairs["user_id"].tolist() == [3, 4, 5]
    assert plan.pairs["reason"].tolist() == [REASON_REFRESH, REASON_REFRESH, REASON_NEW]
    assert (plan.stats.skipped_fresh, plan.stats.refreshes, plan.stats.new) == (2, 2, 1)


def test_fresh_queued_miss_is_not_recomputed() -> None:
    cand = _scored([1], [1], [0.1])
    misses = _scored([2], [2], [0.99])
    state = pd.DataFrame(
        {"user_id": [2], "item_id": [2], "computed_at": [NOW.value / 1e9 - 10.0]}
    )  # unix seconds are accepted too
    plan = _plan(cand, misses, state, budget=5)
    assert plan.pairs["user_id"].tolist() == [1]
    assert plan.stats.skipped_fresh == 1
    assert plan.stats.from_misses == 0


def test_embeddings_of_another_model_version_count_as_absent() -> None:
    cand = _scored([1, 2], [1, 1], [0.9, 0.8])
    state = pd.DataFrame(
        {
            "user_id": [1, 2],
            "item_id": [1, 1],
            "computed_at": [NOW, NOW],
            "model_version": ["old", "new"],
        }
    )
    plan = _plan(cand, None, state, budget=5, model_version="new")
    assert plan.pairs["user_id"].tolist() == [1]
    assert plan.pairs["reason"].tolist() == [REASON_NEW]


def test_a_newer_embedding_of_another_version_hides_an_older_one_of_this_version() -> None:
    """Serving takes the newest stored row, then checks its version (a rollback to "old"
    serves no exact vector while a newer "new" row is stored); the planner must see the same,
    not find the older "old" row fresh and skip the pair."""
    cand = _scored([1, 2], [1, 1], [0.9, 0.8])
    hour = pd.Timedelta(hours=1)
    state = pd.DataFrame(
        {
            "user_id": [1, 1, 2, 2],
            "item_id": [1, 1, 1, 1],
            "computed_at": [NOW - 2 * hour, NOW - hour, NOW - hour, NOW - 2 * hour],
            "model_version": ["old", "new", "old", "new"],
        }
    )
    plan = _plan(cand, None, state, budget=5, model_version="old")
    assert plan.pairs["user_id"].tolist() == [1]  # user 2's newest row is "old": fresh
    assert plan.stats.skipped_fresh == 1


def test_plan_is_identical_for_shuffled_inputs() -> None:
    cand = _random_candidates(2)
    misses = _random_candidates(3, rows=40)
    first = _plan(cand, misses, budget=200)
    second = _plan(
        cand.sample(frac=1, random_state=1), misses.sample(frac=1, random_state=2), budget=200
    )
    pd.testing.assert_frame_equal(first.pairs, second.pairs)
    pd.testing.assert_frame_equal(first.uncovered, second.uncovered)
    assert first.stats == second.stats


def test_zero_budget_plans_nothing_and_leaves_everything_uncovered() -> None:
    cand = _random_candidates(4)
    plan = _plan(cand, budget=0)
    assert len(plan) == 0
    assert len(plan.uncovered) == len(cand)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    count=st.integers(1, 9),
    budget=st.integers(0, 400),
)
def test_shards_partition_the_plan_with_no_overlap_and_no_gap(
    seed: int, count: int, budget: int
) -> None:
    plan = _plan(_random_candidates(seed, rows=300), budget=budget)
    parts = [shard(plan, i, count) for i in range(count)]
    combined = pd.concat([p.pairs for p in parts]).sort_values("priority").reset_index(drop=True)
    pd.testing.assert_frame_equal(combined, plan.pairs.reset_index(drop=True))
    # No user is split over two shards, and shard stats add up to the plan's.
    owners = [set(p.pairs["user_id"]) for p in parts]
    assert sum(len(o) for o in owners) == len(set().union(*owners))
    assert sum(p.stats.planned for p in parts) == plan.stats.planned
    for p in parts:  # priority order is kept within a shard
        assert (np.diff(p.pairs["priority"].to_numpy()) > 0).all()


def test_shard_of_user_is_stable_and_spreads_consecutive_ids() -> None:
    ids = np.arange(10_000, dtype=np.int64)
    shards = shard_of_users(ids, 4)
    np.testing.assert_array_equal(shards, shard_of_users(ids.copy(), 4))
    counts = np.bincount(shards, minlength=4)
    assert counts.min() > 2300  # about 2500 each
    assert (
        shard_of_users(np.array([123456789], dtype=np.int64), 7)[0]
        == shard_of_users(np.array([123456789], dtype=np.int64), 7)[0]
    )


def test_plan_survives_a_round_trip_through_files(tmp_path: Path) -> None:
    plan = _plan(_random_candidates(5), _random_candidates(6, rows=30), budget=50)
    back = read_plan(write_plan(plan, tmp_path / "plan"))
    pd.testing.assert_frame_equal(back.pairs, plan.pairs)
    pd.testing.assert_frame_equal(back.uncovered, plan.uncovered)
    assert back.stats == plan.stats
    assert back.planned_at == plan.planned_at
    # The counts alone, as the fill task reads them to size its targets.
    assert read_plan_stats(tmp_path / "plan") == plan.stats
    assert plan.stats.planned == len(plan.pairs) == 50


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"budget": -1}, "budget_pairs"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _plan(_random_candidates(0), **kwargs)  # type: ignore[arg-type]


def test_margin_not_below_ttl_is_refused() -> None:
    with pytest.raises(ValueError, match="refresh_margin_seconds"):
        plan_precompute(_random_candidates(0), None, None, 5, NOW, 100, 100, 0.5)


def test_candidates_without_scores_are_refused() -> None:
    with pytest.raises(SchemaError) as err:
        _plan(pd.DataFrame({"user_id": [1], "item_id": [1]}))
    assert err.value.column == "verifier_score"


def test_shard_index_out_of_range_is_refused() -> None:
    plan = _plan(_random_candidates(0), budget=5)
    with pytest.raises(ValueError, match="shard index"):
        shard(plan, 3, 3)


def test_request_score_weighs_the_verifier_by_retrieval_relative_to_the_users_best() -> None:
    users = np.array([1, 1, 1, 2, 2])
    verifier = np.array([0.9, 0.5, 0.4, 0.2, 0.8])
    # User 1: item 0 is rarely retrieved, item 1 is the user's best; user 2 scores on another
    # scale entirely, which the division by the user's best takes out.
    retrieval = np.array([0.1, 1.0, np.nan, 30.0, 60.0])
    score = request_score(users, verifier, retrieval)
    np.testing.assert_allclose(score, [0.09, 0.5, 0.4, 0.1, 0.8])
    # A pair without a retrieval score (a queued miss) counts as retrieved for sure.
    assert score[2] == verifier[2]
    np.testing.assert_allclose(request_score(users, verifier, retrieval, 0.0), verifier)
    np.testing.assert_allclose(request_score(users, verifier, None), verifier)
    half = request_score(users, verifier, retrieval, 0.5)
    np.testing.assert_allclose(half[0], 0.9 * np.sqrt(0.1))


def test_request_score_groups_string_user_ids_as_it_groups_int_ids() -> None:
    """String ids (the vocabulary's default) reach the planner as they are: the relative
    retrieval score is per user, whatever the ids' type."""
    verifier = np.array([0.9, 0.5, 0.2, 0.8])
    retrieval = np.array([0.1, 1.0, 30.0, 60.0])
    by_int = request_score(np.array([1, 1, 2, 2]), verifier, retrieval)
    names = np.array(["u-00001", "u-00001", "sku/ABC-9", "sku/ABC-9"], dtype=object)
    np.testing.assert_allclose(request_score(names, verifier, retrieval), by_int)
    # A fixed-width str array, as a plain list of str becomes in numpy.
    np.testing.assert_allclose(request_score(np.array(list(names)), verifier, retrieval), by_int)


def test_plan_by_request_score_prefers_what_retrieval_will_propose() -> None:
    # The VM likes item 7 best, but retrieval proposes it far less often than item 3.
    candidates = _scored([5, 5, 5], [7, 3, 4], [0.9, 0.6, 0.1])
    retrieval = np.array([0.05, 1.0, 0.9])
    by_vm = _plan(candidates, budget=1)
    assert by_vm.pairs["item_id"].tolist() == [7]
    candidates["verifier_score"] = request_score(
        candidates["user_id"].to_numpy(), candidates["verifier_score"].to_numpy(), retrieval
    )
    assert _plan(candidates, budget=2).pairs["item_id"].tolist() == [3, 4]


def test_request_score_weighs_each_pair_by_its_users_weight() -> None:
    """Two users with the same candidates and verifier scores: the one expected to come back
    gets the budget, the other what is left."""
    candidates = _scored([1, 1, 2, 2], [7, 8, 7, 8], [0.6, 0.5, 0.6, 0.5])
    candidates["verifier_score"] = request_score(
        candidates["user_id"].to_numpy(),
        candidates["verifier_score"].to_numpy(),
        None,
        user_weight=np.array([0.2, 0.2, 1.0, 1.0]),
    )
    np.testing.assert_allclose(candidates["verifier_score"], [0.12, 0.1, 0.6, 0.5])
    assert _plan(candidates, budget=2).pairs[["user_id", "item_id"]].values.tolist() == [
        [2, 7],
        [2, 8],
    ]
    with pytest.raises(ValueError, match="user_weight has shape"):
        request_score(np.array([1, 2]), np.array([0.5, 0.5]), None, user_weight=np.ones(3))
    with pytest.raises(ValueError, match=r"user_weight must lie in \[0, 1\]"):
        request_score(np.array([1, 2]), np.array([0.5, 0.5]), None, user_weight=np.array([1, 2]))


@pytest.mark.parametrize(
    ("retrieval", "weight", "error"),
    [
        (np.array([1.0, -1.0]), 1.0, SchemaError),
        (np.array([1.0, np.inf]), 1.0, SchemaError),
        (np.array([1.0]), 1.0, ValueError),
        (np.array([1.0, 2.0]), -0.5, ValueError),
    ],
)
def test_request_score_refuses_bad_retrieval_scores(
    retrieval: np.ndarray, weight: float, error: type[Exception]
) -> None:
    with pytest.raises(error):
        request_score(np.array([0, 0]), np.array([0.5, 0.5]), retrieval, weight)


# -- sharded rounds: rank per shard, split the budget, cut each ranking ----------------------


def _ranked(candidates: pd.DataFrame, misses: pd.DataFrame | None = None) -> Plan:
    """A plan with no budget limit: every eligible pair in the planner's order."""
    rows = len(candidates) + (0 if misses is None else len(misses))
    return _plan(candidates, misses, budget=rows)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), budget=st.integers(0, 900))
def test_a_ranking_cut_to_a_budget_is_the_plan_under_that_budget(seed: int, budget: int) -> None:
    candidates = _random_candidates(seed, rows=400)
    misses = _random_candidates(seed + 1, rows=20)
    cut = take_budget(_ranked(candidates, misses), budget)
    direct = _plan(candidates, misses, budget=budget)
    pd.testing.assert_frame_equal(cut.pairs, direct.pairs)
    pd.testing.assert_frame_equal(cut.uncovered, direct.uncovered)
    assert cut.stats == direct.stats


@settings(max_examples=60, deadline=None)
@given(
    budget=st.integers(0, 3000),
    shards=st.lists(
        st.tuples(st.integers(0, 50), st.floats(0, 100), st.integers(0, 500)),
        min_size=1,
        max_size=6,
    ),
)
def test_budget_split_serves_misses_first_then_mass_and_never_overfills_a_shard(
    budget: int, shards: list[tuple[int, float, int]]
) -> None:
    rankings = [ShardRanking(priority=min(p, e), mass=m, eligible=e) for p, m, e in shards]
    parts = split_budget(budget, rankings)
    eligible = sum(r.eligible for r in rankings)
    assert sum(parts) == min(budget, eligible)  # nothing lost, nothing over budget
    assert all(0 <= b <= r.eligible for b, r in zip(parts, rankings, strict=True))
    priority = sum(r.priority for r in rankings)
    if budget >= priority:  # every miss-tier pair fits: each shard gets at least its own
        assert all(b >= r.priority for b, r in zip(parts, rankings, strict=True))


def test_budget_split_follows_the_shards_mass() -> None:
    rankings = [
        ShardRanking(priority=10, mass=300.0, eligible=1000),
        ShardRanking(priority=0, mass=100.0, eligible=1000),
        ShardRanking(priority=0, mass=0.0, eligible=1000),
    ]
    # 10 misses first, then 190 split 3:1 by mass; a shard with no mass gets nothing.
    assert split_budget(200, rankings) == [10 + 143, 47, 0]
    # A shard that cannot take its share passes the rest to the others, by mass.
    small = [ShardRanking(0, 300.0, 20), ShardRanking(0, 100.0, 1000)]
    assert split_budget(200, small) == [20, 180]
    # Misses beyond the budget: split by their counts.
    assert split_budget(10, [ShardRanking(30, 1.0, 40), ShardRanking(10, 9.0, 40)]) == [8, 2]


@pytest.mark.parametrize("count", [2, 4])
def test_sharded_planning_spends_the_budget_like_one_plan(count: int) -> None:
    """Users hashed to shards, each shard ranked alone, the budget split by mass: disjoint
    shards, exactly the budget, and the pairs of one plan but for the cut's edge."""
    candidates = _random_candidates(11, users=400, items=300, rows=12_000)
    budget = 1500
    whole = _plan(candidates, budget=budget)
    owner = shard_of_users(candidates["user_id"].to_numpy(), count)
    rankings = [_ranked(candidates.loc[owner == i]) for i in range(count)]
    budgets = split_budget(budget, [ShardRanking.of(r) for r in rankings])
    plans = [take_budget(r, b) for r, b in zip(rankings, budgets, strict=True)]
    merged = merge_plans(plans)
    assert sum(budgets) == budget == merged.stats.planned == len(merged.pairs)
    users = [set(p.pairs["user_id"]) for p in plans]
    assert sum(len(u) for u in users) == len(set().union(*users))
    pairs = set(zip(merged.pairs["user_id"], merged.pairs["item_id"], strict=True))
    one = set(zip(whole.pairs["user_id"], whole.pairs["item_id"], strict=True))
    assert len(pairs & one) / budget >= 0.95
    # The merged order is one plan's: by score, the uncovered after the planned.
    assert (np.diff(merged.pairs["verifier_score"].to_numpy()) <= 0).all()
    assert merged.uncovered["priority"].min() == budget


def test_string_users_shard_by_a_pinned_hash() -> None:
    """Workers on other hosts and versions must agree: the hash of a String id is pinned."""
    ids = np.array(["user:1", "user:2", "alice"], dtype=object)
    assert shard_of_users(ids, 1000).tolist() == shard_of_users(ids.copy(), 1000).tolist()
    assert shard_of_users(ids, 1000).tolist() == PINNED_STRING_SHARDS
    ints = np.array([0, 1, 2**62], dtype=np.int64)
    assert shard_of_users(ints, 1000).tolist() == PINNED_INT_SHARDS


def test_a_rounds_fill_targets_and_counts_come_from_the_shards_without_their_planned_pairs(
    tmp_path: Path,
) -> None:
    """The fill takes the round's best uncovered pairs and coverage.json the round's counts;
    both are read from the shards' ``uncovered.parquet`` and ``plan.json`` alone (a large
    round's planned pairs are the biggest file of a shard), and agree with one merged plan."""
    from solaris_feast.pipeline.precompute import round_plan_stats, round_uncovered
    from solaris_feast.pipeline.runs import shard_plan_dir
    from solaris_feast.pipeline.settings import PrecomputeRun, PrecomputeSettings

    count = 3
    candidates = _random_candidates(5, users=300, items=200, rows=9_000)
    misses = _random_candidates(6, users=300, items=200, rows=60)
    owner = shard_of_users(candidates["user_id"].to_numpy(), count)
    missed_by = shard_of_users(misses["user_id"].to_numpy(), count)
    rankings = [
        _ranked(candidates.loc[owner == i], misses.loc[missed_by == i]) for i in range(count)
    ]
    budgets = split_budget(1000, [ShardRanking.of(r) for r in rankings])
    plans = [take_budget(r, b) for r, b in zip(rankings, budgets, strict=True)]
    run_dir = tmp_path / "run"
    for i, plan in enumerate(plans):
        write_plan(plan, shard_plan_dir(run_dir, i))
        (shard_plan_dir(run_dir, i) / "pairs.parquet").unlink()  # proves it is not read
    spec = PrecomputeRun(
        settings=PrecomputeSettings(
            feature_repo=str(tmp_path), models_dir=str(tmp_path / "models"), shards=count
        ),
        now=NOW.to_pydatetime(),
        interval_key="k",
        run_dir=str(run_dir),
        vm_version="vm",
        fm_version="fm",
        embedding_version="v1",
    )
    merged = merge_plans(plans)
    assert round_plan_stats(spec) == merged.stats
    for rows in (0, 1, 250, 10_000):
        got = round_uncovered(spec, rows)
        want = merged.uncovered.head(rows)
        assert len(got) == min(rows, len(merged.uncovered))
        for column in ("user_id", "item_id", "verifier_score", "reason"):
            assert got[column].tolist() == want[column].tolist(), (rows, column)
