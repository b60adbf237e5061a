"""The tier rule against a brute-force, one-pair-at-a-time reference on a seeded grid.

The reference below is written from the rule as stated in ``serving/resolve.py`` (fresh is
``age <= ttl``; a value from further in the future than the clock skew, of another version, with
a NaN or inf component, or not present is a miss; exact > similar > user aggregate > zero), with
plain Python floats and no numpy, so a vectorisation slip in :func:`resolve` shows up here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from solaris_feast.serving.resolve import (
    DEFAULT_CLOCK_SKEW_SECONDS,
    REJECTION_REASONS,
    SEARCH_ORDER,
    TierValues,
    resolve,
    usable_rows,
)
from solaris_feast.tiers import Tier

NOW = 1_700_000_000.0
DIM = 4
TTL = {Tier.EXACT: 3600.0, Tier.SIMILAR: 1800.0, Tier.USER_AGG: 86400.0}
SKEW = DEFAULT_CLOCK_SKEW_SECONDS


def reference_usable(
    vector: list[float], present: bool, version_ok: bool, computed_at: float, ttl: float
) -> bool:
    if not present or not version_ok or math.isnan(computed_at):
        return False
    if any(math.isnan(x) or math.isinf(x) for x in vector):
        return False
    age = NOW - computed_at
    return -SKEW <= age <= ttl


def reference_resolve(grid: dict[Tier, TierValues], i: int) -> tuple[int, list[float], float]:
    for tier in (Tier.EXACT, Tier.SIMILAR, Tier.USER_AGG):
        v = grid[tier]
        vector = [float(x) for x in v.vectors[i]]
        if reference_usable(
            vector, bool(v.present[i]), bool(v.version_matches[i]), v.computed_at_s[i], TTL[tier]
        ):
            return int(tier), vector, max(NOW - v.computed_at_s[i], 0.0)
    return int(Tier.ZERO), [0.0] * DIM, math.nan


def random_tier(rng: np.random.Generator, n: int, ttl: float) -> TierValues:
    """Values spread over every case: around the TTL edge and the skew edge to the second,
    NaN/inf components, unknown times, other versions, absent rows."""
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    bad = rng.random(n)
    vectors[bad < 0.08, rng.integers(0, DIM)] = np.nan
    vectors[(bad >= 0.08) & (bad < 0.14), 0] = np.inf
    vectors[(bad >= 0.14) & (bad < 0.18), 1] = -np.inf
    edges = np.array([0.0, ttl - 1, ttl, ttl + 1, -SKEW - 1, -SKEW, -SKEW + 1, 2 * ttl, -1e8])
    age = np.where(rng.random(n) < 0.5, rng.choice(edges, n), rng.uniform(-2 * SKEW, 2 * ttl, n))
    computed = NOW - age
    computed[rng.random(n) < 0.05] = np.nan
    return TierValues(
        vectors=vectors,
        present=rng.random(n) < 0.8,
        version_matches=rng.random(n) < 0.8,
        computed_at_s=computed,
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_resolve_matches_the_one_pair_at_a_time_reference_on_a_seeded_grid(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 4000
    grid = {tier: random_tier(rng, n, TTL[tier]) for tier in SEARCH_ORDER}

    got = resolve(grid, now_s=NOW, ttl_seconds=TTL, clock_skew_seconds=SKEW)

    expected = [reference_resolve(grid, i) for i in range(n)]
    assert got.tiers.tolist() == [e[0] for e in expected]
    np.testing.assert_array_equal(got.embeddings, np.asarray([e[1] for e in expected], np.float32))
    np.testing.assert_array_equal(got.age_seconds, np.asarray([e[2] for e in expected]))
    # Every tier and the zero answer occur, so the grid exercises the whole order.
    assert set(got.tiers.tolist()) == {0, 1, 2, 3}
    assert got.tiers.dtype == np.int8 and got.embeddings.dtype == np.float32


@pytest.mark.parametrize(
    ("age", "usable"),
    [
        (TTL[Tier.EXACT] - 1, True),
        (TTL[Tier.EXACT], True),  # exactly TTL old: fresh, as Feast's point-in-time join
        (TTL[Tier.EXACT] + 1, False),
        (0.0, True),
        (-SKEW, True),  # at the clock-skew allowance: still trusted
        (-SKEW - 1, False),  # beyond it: a broken clock or a bad write
    ],
)
def test_ttl_and_clock_skew_boundaries(age: float, usable: bool) -> None:
    ok = usable_rows(
        np.ones((1, DIM), np.float32),
        np.array([True]),
        np.array([True]),
        np.array([NOW - age]),
        NOW,
        TTL[Tier.EXACT],
        SKEW,
    )
    assert ok.tolist() == [usable]


def test_a_value_within_the_skew_in_the_future_is_served_with_age_zero() -> None:
    values = TierValues(
        np.ones((1, DIM), np.float32), np.array([True]), np.array([True]), np.array([NOW + 60.0])
    )
    got = resolve({Tier.EXACT: values}, now_s=NOW, ttl_seconds=TTL)
    assert got.tiers.tolist() == [Tier.EXACT] and got.age_seconds.tolist() == [0.0]


def test_rejections_are_counted_by_reason_only_for_consulted_rows() -> None:
    vectors = np.ones((6, DIM), np.float32)
    vectors[3, 2] = np.nan
    exact = TierValues(
        vectors=vectors,
        present=np.array([True, True, True, True, False, True]),
        version_matches=np.array([False, True, True, True, True, True]),
        computed_at_s=np.array([NOW, NOW - 7200, NOW + 3600, NOW, NOW, NOW]),
    )
    # The user aggregate is stale for every row, but rows served exactly never consult it.
    user = TierValues(
        np.ones((6, DIM), np.float32),
        np.ones(6, bool),
        np.ones(6, bool),
        np.full(6, NOW - 2 * 86400),
    )

    got = resolve(
        {Tier.EXACT: exact, Tier.USER_AGG: user}, now_s=NOW, ttl_seconds=TTL, count_rejections=True
    )

    assert got.tiers.tolist() == [0, 0, 0, 0, 0, 3]
    assert got.rejected == {"other_version": 1, "stale": 1 + 5, "future": 1, "non_finite": 1}
    assert set(got.rejected) == set(REJECTION_REASONS)


def test_resolve_refuses_inconsistent_tiers() -> None:
    three = TierValues.absent(3, DIM)
    with pytest.raises(ValueError, match="at least one tier"):
        resolve({}, now_s=NOW, ttl_seconds=TTL)
    with pytest.raises(ValueError, match="rows, expected 3"):
        resolve(
            {Tier.EXACT: three, Tier.SIMILAR: TierValues.absent(2, DIM)}, now_s=NOW, ttl_seconds=TTL
        )
    with pytest.raises(ValueError, match="shape"):
        resolve(
            {Tier.EXACT: three, Tier.SIMILAR: TierValues.absent(3, DIM + 1)},
            now_s=NOW,
            ttl_seconds=TTL,
        )
    with pytest.raises(ValueError, match="no ttl"):
        resolve({Tier.EXACT: three}, now_s=NOW, ttl_seconds={Tier.SIMILAR: 1.0})


def test_user_aggregate_window_uses_the_serving_boundary_and_skips_non_finite_pairs() -> None:
    import pandas as pd

    from solaris_feast.precompute.aggregate import (
        AggregateConfig,
        PairEmbeddings,
        aggregate_user_embeddings,
    )

    window = 3600
    now = pd.Timestamp(NOW, unit="s", tz="UTC")
    ages = [0.0, window - 1, window, window + 1, -1.0, 10.0]
    vectors = np.arange(len(ages) * 2, dtype=np.float32).reshape(len(ages), 2) + 1
    vectors[5, 0] = np.nan  # a poisoned pair must not poison the user's mean
    pairs = PairEmbeddings(
        user_ids=np.full(len(ages), 7, dtype=np.int64),
        item_ids=np.arange(len(ages), dtype=np.int64),
        vectors=vectors,
        computed_at_s=NOW - np.asarray(ages),
        model_versions=np.full(len(ages), "v1", dtype=object),
    )

    rows = aggregate_user_embeddings(pairs, now, "v1", AggregateConfig(window_seconds=window))

    # Exactly the rows the serving rule calls fresh at `now` with TTL = window (no skew: the
    # future row is left out, so a re-run for the same interval makes the same rows).
    served = usable_rows(
        vectors, np.ones(6, bool), np.ones(6, bool), NOW - np.asarray(ages), NOW, window, 0.0
    )
    assert served.tolist() == [True, True, True, False, False, False]
    assert rows["pair_count"].tolist() == [3]
    np.testing.assert_allclose(rows["embedding"].iloc[0], vectors[:3].mean(axis=0))
