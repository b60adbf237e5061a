"""The closed-loop funnel world (issue 13): causal, deterministic, the oracle bounds every
planner, clicks follow what is shown, the verifier is not the early-stage ranker, and a tiny
world runs end to end."""

from __future__ import annotations

import copy
import itertools
import json
import math
import time
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
import typer
from typer.testing import CliRunner

from solaris_feast.data.schema import ITEM_ID, USER_ID
from solaris_feast.evaluation.funnel import (
    FUNNEL_PLANNERS,
    FunnelConfig,
    FunnelWorldConfig,
    World,
    format_funnel_summary,
    run_seed,
    simulate_funnel,
)
from solaris_feast.evaluation.funnel import request_model as request_model_module
from solaris_feast.evaluation.funnel.early_stage import TwoTower
from solaris_feast.evaluation.funnel.request_model import (
    FunnelTrafficLog,
    RequestModelConfig,
    RequestModelVerifier,
    train_request_model,
)
from solaris_feast.evaluation.replay import simulate_command
from solaris_feast.models.interface import PairsAsOf, checked_scores
from solaris_feast.precompute.candidates import CANDIDATE_SCORE
from solaris_feast.precompute.plan import VERIFIER_SCORE, plan_precompute

TINY = FunnelConfig(
    world=FunnelWorldConfig(num_users=80, num_items=120, sessions_per_day=6.0),
    retrieval_candidates=40,
    final_stage=10,
    warmup_hours=8,
    early_stage_first_hour=2,
    early_stage_retrain_hours=3,
    chain_retrain_hours=0,
    unscored_hours=1,
    scored_hours=2,
    fm_epochs=1,
)

RECORD_KEYS = {
    "planner",
    "budget",
    "exact_hit_rate",
    "exact_hit_rate_ci95",
    "coverage",
    "ne",
    "clicks_per_1k_requests",
    "clicks_per_1k_requests_ci95",
    "clicks_per_1k_requests_without_z",
    "clicks_per_1k_requests_fm_ranking",
    "fm_calls_per_request",
    "ablation",
}


class _Rounds:
    """Observer keeping each round's pool and every arm's exact keys and vectors."""

    def __init__(self) -> None:
        self.pools: dict[int, pd.DataFrame] = {}
        self.requested: dict[int, pd.DataFrame] = {}
        self.exact: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = {}

    def __call__(self, hour: int, step: Any, states: list[Any]) -> None:
        self.pools[hour] = step.pool.copy()
        self.requested[hour] = step.requests[[USER_ID, ITEM_ID]].copy()
        self.exact[hour] = {s.name: (s.exact.keys.copy(), s.exact.vectors.copy()) for s in states}


@pytest.fixture(scope="module")
def tiny_rounds() -> _Rounds:
    rounds = _Rounds()
    run_seed(TINY, 0, observer=rounds)
    return rounds


def test_world_is_deterministic_by_seed() -> None:
    a, b, c = (World(TINY.world, s, TINY.hours) for s in (4, 4, 5))
    for name in ("item_vectors", "long_term", "short_term", "successors", "slices", "users"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.long_term, c.long_term)
    ids = np.arange(50)
    np.testing.assert_array_equal(a.label_uniforms(ids, ids % 7), b.label_uniforms(ids, ids % 7))


def test_run_is_deterministic_by_seed(tiny_rounds: _Rounds) -> None:
    again = _Rounds()
    run_seed(TINY, 0, observer=again)
    assert again.exact.keys() == tiny_rounds.exact.keys()
    for hour, arms in tiny_rounds.exact.items():
        for name, (keys, vectors) in arms.items():
            np.testing.assert_array_equal(again.exact[hour][name][0], keys)
            np.testing.assert_allclose(again.exact[hour][name][1], vectors, atol=1e-6)


def test_clicks_depend_on_what_is_shown() -> None:
    world = World(TINY.world, 1, TINY.hours)
    rng = np.random.default_rng(0)
    users = np.repeat(np.arange(TINY.world.num_users), 20)
    items = rng.integers(0, TINY.world.num_items, len(users))
    click, _ = world.probabilities(users, items, 3, np.full(len(users), -1))
    p = click.reshape(-1, 20)
    by_truth = np.sort(p, axis=1)[:, -4:].sum()
    by_chance = p[:, rng.permutation(20)[:4]].sum()
    assert by_truth > 1.5 * by_chance


def test_no_round_reads_the_future(tiny_rounds: _Rounds) -> None:
    cut = TINY.warmup_hours + 2
    world = World(TINY.world, 0, TINY.hours)
    future = copy.deepcopy(world)
    # From the cut on: other interests, and a different schedule of who comes when.
    rng = np.random.default_rng(99)
    future.short_term[cut:] = rng.normal(0, 1, future.short_term[cut:].shape)
    first = cut * world.slices_per_hour
    later = future.slices >= first
    future.users = np.where(later, (future.users + 17) % TINY.world.num_users, future.users)
    order = np.lexsort((future.users, future.slices))
    future.slices, future.users = future.slices[order], future.users[order]
    altered = _Rounds()
    run_seed(TINY, 0, world=future, observer=altered)
    for hour in range(TINY.warmup_hours, cut):
        for name, (keys, vectors) in tiny_rounds.exact[hour].items():
            np.testing.assert_array_equal(altered.exact[hour][name][0], keys, err_msg=name)
            np.testing.assert_allclose(altered.exact[hour][name][1], vectors, atol=1e-6)
    # At the cut, only the oracle (which reads the coming hour by definition) may differ.
    for name, (keys, _) in tiny_rounds.exact[cut].items():
        if not name.startswith("oracle"):
            np.testing.assert_array_equal(altered.exact[cut][name][0], keys, err_msg=name)
    assert any(
        not np.array_equal(altered.exact[cut][n][0], k)
        for n, (k, _) in tiny_rounds.exact[cut].items()
        if n.startswith("oracle")
    )


def _planned_hits(pool: pd.DataFrame, requested: pd.DataFrame, column: str, budget: int) -> int:
    """Requested pairs among ``budget`` pairs planned by ``column`` from an empty store."""
    scored = pool[[USER_ID, ITEM_ID, column]].rename(columns={column: VERIFIER_SCORE})
    now = pd.Timestamp("2026-01-05", tz="UTC")
    plan = plan_precompute(scored, None, None, budget, now, 3600, 0, 1.0)
    return len(plan.pairs.merge(requested, on=[USER_ID, ITEM_ID]))


def test_oracle_is_an_upper_bound_on_the_same_pool(tiny_rounds: _Rounds) -> None:
    for hour, pool in tiny_rounds.pools.items():
        requested = tiny_rounds.requested[hour]
        for share in (0.05, 0.1, 0.2):
            budget = round(share * len(pool))
            oracle = _planned_hits(pool, requested, "oracle", budget)
            in_pool = len(pool.merge(requested, on=[USER_ID, ITEM_ID]))
            assert oracle == min(budget, in_pool)
            for planner in (p for p in FUNNEL_PLANNERS if p != "oracle"):
                assert _planned_hits(pool, requested, planner, budget) <= oracle, planner


def test_verifier_is_not_the_early_stage_ranker(tiny_rounds: _Rounds) -> None:
    pool = tiny_rounds.pools[max(tiny_rounds.pools)]
    # Both columns are percentile ranks already: their Pearson correlation is Spearman's.
    corr = pool["verifier"].corr(pool["early_stage"])
    assert corr < 0.95
    budget = len(pool) // 10
    top_v = set(pool.nlargest(budget, "verifier").index)
    top_e = set(pool.nlargest(budget, "early_stage").index)
    assert len(top_v & top_e) < 0.9 * budget


def test_tiny_world_end_to_end_under_a_minute() -> None:
    t0 = time.perf_counter()
    records = simulate_funnel(TINY, [0, 1])
    assert time.perf_counter() - t0 < 60
    assert len(records) == len(TINY.planners) * len(TINY.precompute.budgets)
    for r in records:
        assert set(r) >= RECORD_KEYS
        assert set(r["coverage"]) >= {"exact", "similar", "user", "zero"}
        assert abs(sum(r["coverage"][t] for t in ("exact", "similar", "user", "zero")) - 1) < 1e-9
        lo, hi = r["exact_hit_rate_ci95"]
        assert lo <= r["exact_hit_rate"] <= hi
        assert [a["tiers"] for a in r["ablation"]] == ["exact", "exact+user", "exact+user+similar"]
        assert all(
            {"ne", "clicks_per_1k_requests", "ne_final_stage"} <= set(a) for a in r["ablation"]
        )
        # NE on every final-stage pair is paired across steps: each step after the first
        # carries its change from the one before, the difference of the two means.
        for before, after in itertools.pairwise(r["ablation"]):
            change = after["ne_final_stage"] - before["ne_final_stage"]
            assert abs(after["ne_final_stage_change"] - change) < 1e-9
            lo, hi = after["ne_final_stage_change_ci95"]
            assert lo <= after["ne_final_stage_change"] <= hi
        assert r["fm_calls_per_request"] > 0
        assert r["clicks_per_1k_requests"] > 0
    by = {(r["planner"], r["budget"]): r for r in records}
    for (planner, budget), r in by.items():
        # Paired within seeds: each seed's hit rate over that seed's oracle's, then the mean.
        oracle = by[("oracle", budget)]["exact_hit_rate_per_seed"]
        ratios = [h / o for h, o in zip(r["exact_hit_rate_per_seed"], oracle, strict=True)]
        assert r["exact_hit_rate_over_oracle_per_seed"] == pytest.approx(ratios)
        assert r["exact_hit_rate_over_oracle"] == pytest.approx(np.mean(ratios))
        lo, hi = r["exact_hit_rate_over_oracle_ci95"]
        assert lo <= r["exact_hit_rate_over_oracle"] <= hi
        if planner == "oracle":
            assert ratios == pytest.approx([1.0, 1.0])
    assert "share of the oracle's" in format_funnel_summary(records)
    # One seed has no interval and a run without FM gain no transfer ratio: the table says
    # n/a, as the transfer table does, not nan.
    alone = {
        **records[0],
        "exact_hit_rate_ci95": [math.nan, math.nan],
        "click_uplift_per_1k_requests_ci95": [None, None],
        "online_transfer_ratio": math.nan,
    }
    table = format_funnel_summary([alone])
    assert "nan" not in table and table.count("n/a") == 3, table
    assert len(table.splitlines()[1]) == len(format_funnel_summary(records[:1]).splitlines()[1])
    # More budget buys more exact hits for the oracle.
    assert by[("oracle", 0.2)]["exact_hit_rate"] >= by[("oracle", 0.05)]["exact_hit_rate"]


def test_simulate_rejects_an_unknown_world() -> None:
    app = typer.Typer()
    app.command()(simulate_command)
    result = CliRunner().invoke(app, ["--world", "moon"])
    assert result.exit_code != 0
    assert "--world must be log or funnel" in result.output


def test_simulate_runs_the_funnel_on_seeds_the_caller_names(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--seed S --seeds N`` runs seeds S..S+N-1, so a reviewer can check a result on seeds
    that were never published (the tiny world stands in for the default one)."""
    import solaris_feast.evaluation.funnel as funnel

    monkeypatch.setattr(funnel, "FunnelConfig", lambda: TINY)
    app = typer.Typer()
    app.command()(simulate_command)
    out = tmp_path / "funnel.json"
    args = ["--world", "funnel", "--seed", "7", "--seeds", "2", "--budget", "0.1"]
    args += ["--fill-targets", "2.5"]
    result = CliRunner().invoke(app, [*args, "--planner", "verifier,random", "--json", str(out)])
    assert result.exit_code == 0, result.output
    records = json.loads(out.read_text())
    assert {r["planner"] for r in records} == {"verifier", "random"}
    assert all(r["seeds"] == [7, 8] for r in records)
    # Each record names the round settings it was measured with.
    assert all(r["precompute_settings"]["fill_targets_per_budget"] == 2.5 for r in records)


def test_the_chain_retrains_on_its_own_traffic_on_schedule() -> None:
    """With chain_retrain_hours set, FM, compressor and VM are trained again on the log the
    funnel itself produced, and every arm's store starts over in the new embedding space."""
    rounds = _Rounds()
    cfg = TINY.model_copy(update={"chain_retrain_hours": 1, "scored_hours": 1})
    outcome = run_seed(cfg, 0, observer=rounds)
    hours = [hour for hour, _ in outcome.chain_trainings]
    assert hours == list(range(cfg.warmup_hours, cfg.hours))  # at the warm-up's end, then hourly
    assert len({version for _, version in outcome.chain_trainings}) == len(hours)
    # After a retrain no vector of the old space is served: a pair stored both before and after
    # holds a new vector (the stores restart and the new chain computes it again).
    shared = 0
    for hour in hours[1:]:
        for arm, (keys, vectors) in rounds.exact[hour].items():
            old_keys, old_vectors = rounds.exact[hour - 1][arm]
            common, new_at, old_at = np.intersect1d(keys, old_keys, return_indices=True)
            shared += len(common)
            assert not np.isclose(vectors[new_at], old_vectors[old_at]).all(axis=1).any()
    assert shared > 0


# -- the request model: a verifier learned from the funnel's logs ---------------------------------

_U, _I, _CUT = 40, 60, 10


class _ToyVM:
    """A fixed stand-in for the VM without ``z`` (the Verifier protocol), so the request model's
    own inputs are the only thing that varies."""

    def score(self, pairs: Any) -> np.ndarray:
        return ((pairs.users * 31 + pairs.items * 17) % 97 + 1) / 99.0


def _synthetic_traffic(alter_from: int | None = None, hours: int = 14) -> FunnelTrafficLog:
    """Hourly candidates and 12 slices an hour; the final stage keeps each request's candidates
    of highest hidden affinity. From hour ``alter_from`` on, other users ask for other items;
    retrieval changes after it (the candidates at its start come from the logs before it)."""
    affinity = np.random.default_rng(0).normal(size=(_U, _I))
    traffic = FunnelTrafficLog()
    for h in range(hours):
        altered = alter_from is not None and h >= alter_from
        retrieval = np.random.default_rng([int(altered and h > (alter_from or 0)), h, 1])
        rng = np.random.default_rng([int(altered), h])
        start = h * 3600
        users = np.repeat(np.arange(_U), 15)
        items = np.concatenate([retrieval.choice(_I, 15, replace=False) for _ in range(_U)])
        traffic.log_candidates(
            start,
            pd.DataFrame(
                {
                    USER_ID: users,
                    ITEM_ID: items,
                    CANDIDATE_SCORE: retrieval.random(len(users)) + 0.1,
                }
            ),
        )
        for s in range(12):
            asking = np.flatnonzero(rng.random(_U) < (0.5 if altered else 0.15))
            final_u, final_i = [], []
            for u in asking:
                own = items[users == u]
                top = own[np.argsort(-(-affinity[u, own] if altered else affinity[u, own]))[:4]]
                final_u.append(np.full(4, u))
                final_i.append(top)
            traffic.log_slice(
                start + 300 * s,
                asking,
                np.concatenate(final_u) if final_u else np.zeros(0, np.int64),
                np.concatenate(final_i) if final_i else np.zeros(0, np.int64),
            )
    return traffic


def _fit(traffic: FunnelTrafficLog, hour: int) -> Any:
    until = pd.Timestamp(hour * 3600, unit="s", tz="UTC")
    # No interaction log: _ToyVM reads none, though the signature asks for one.
    return train_request_model(
        traffic,
        until,
        _ToyVM(),
        None,  # type: ignore[arg-type]
        _U,
        _I,
        config=RequestModelConfig(epochs=3),
        seed=3,
    )


def _scores(model: Any, traffic: FunnelTrafficLog, hour: int) -> np.ndarray:
    candidates = traffic.candidates[hour * 3600]
    verifier = RequestModelVerifier(model, traffic, _ToyVM(), candidates)
    at = pd.Timestamp(hour * 3600, unit="s", tz="UTC")
    pairs = PairsAsOf.of(candidates[USER_ID], candidates[ITEM_ID], at, None)  # type: ignore[arg-type]
    return checked_scores(verifier.score(pairs), len(pairs), "request model")


def test_request_model_learns_from_past_logs_only() -> None:
    """Altering the traffic from the cut on leaves the fit and its scores as of the cut
    unchanged; the same alteration does move scores of a later time (the test can see it)."""
    past_only, altered = _synthetic_traffic(), _synthetic_traffic(alter_from=_CUT)
    model, model_altered = _fit(past_only, _CUT), _fit(altered, _CUT)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(model_altered.state_dict()[name], value, rtol=0, atol=0)
    np.testing.assert_array_equal(_scores(model, past_only, _CUT), _scores(model, altered, _CUT))
    later = _CUT + 2
    assert not np.array_equal(_scores(model, past_only, later), _scores(model, altered, later))
    # It learned the logged funnel: pairs that reach the final stage in the cut's hour rank
    # above those that do not.
    candidates = past_only.candidates[_CUT * 3600]
    _, fu, fi = past_only.final_between(_CUT * 3600, (_CUT + 1) * 3600)
    keys = candidates[USER_ID].to_numpy() * _I + candidates[ITEM_ID].to_numpy()
    reached = np.isin(keys, fu * _I + fi)
    scores = _scores(model, past_only, _CUT)
    ranks = pd.Series(scores).rank().to_numpy()
    auc = (ranks[reached].sum() - reached.sum() * (reached.sum() + 1) / 2) / (
        reached.sum() * (~reached).sum()
    )
    assert auc > 0.75


def test_request_model_is_not_the_early_stage_ranker(tiny_rounds: _Rounds) -> None:
    """Nothing of the two-tower reaches the request model's fit (its inputs are logs and the
    VM), and its plan in the tiny world is its own."""
    assert "early_stage" not in request_model_module.__dict__
    assert not any(
        isinstance(v, type) and issubclass(v, TwoTower)
        for v in request_model_module.__dict__.values()
    )
    pool = tiny_rounds.pools[max(tiny_rounds.pools)]
    assert pool["request_model"].nunique() > 1  # it was fitted and scored
    corr = pool["request_model"].corr(pool["early_stage"])
    assert corr < 0.95
    budget = len(pool) // 10
    top_r = set(pool.nlargest(budget, "request_model").index)
    top_e = set(pool.nlargest(budget, "early_stage").index)
    assert len(top_r & top_e) < 0.9 * budget


def test_seeds_in_worker_processes_give_the_serial_run_s_records() -> None:
    """``--workers`` only spreads the seeds over processes: each seed is a pure function of
    the config and the seed, so the records equal the serial run's, to the last digit. The
    progress bar counts hours when serial, finished seeds with workers, and ends full."""
    hours: list[tuple[str, int, int]] = []
    seeds: list[tuple[str, int, int]] = []
    serial = simulate_funnel(TINY, [0, 1], progress=lambda *bar: hours.append(bar))
    spread = simulate_funnel(TINY, [0, 1], workers=2, progress=lambda *bar: seeds.append(bar))
    assert json.dumps(spread, sort_keys=True) == json.dumps(serial, sort_keys=True)
    assert [done for _, done, _ in hours] == list(range(1, 2 * TINY.hours + 1))
    assert hours[-1][2] == 2 * TINY.hours
    assert seeds == [("funnel seeds", done, 2) for done in range(3)]
