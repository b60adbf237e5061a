"""The planner's user weight (:mod:`solaris_feast.precompute.returns`): fitted on the log
before the round, against a brute-force count, in two worlds with opposite return processes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pytest

from solaris_feast.precompute.returns import (
    ELAPSED_EDGES_SECONDS,
    VOLUME_EDGES,
    VOLUME_WINDOW_SECONDS,
    fit_return_model,
    return_weights,
)

NOW = pd.Timestamp("2026-06-01T12:00:00Z")
HOUR = 3600.0


def _log(users: Sequence[object], hours_before_now: Sequence[float]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "user_id": np.array(users, dtype=object if isinstance(users[0], str) else np.int64),
            "event_timestamp": [NOW - pd.Timedelta(hours=h) for h in hours_before_now],
        }
    )


def _brute_force(
    log: pd.DataFrame, horizon_s: float, step_s: float, prior: float
) -> tuple[np.ndarray, np.ndarray]:
    """The same estimate by loops over anchors, users and events, in ages (seconds before now):
    an anchor at age ``a`` has seen the events older than ``a``."""
    ages_by_user = [
        sorted((NOW - t).total_seconds() for t in g)
        for _, g in log.groupby("user_id")["event_timestamp"]
    ]
    oldest = max(a for ages in ages_by_user for a in ages)
    shape = (len(ELAPSED_EDGES_SECONDS) + 1, len(VOLUME_EDGES) + 1)
    sums, counts = np.zeros(shape), np.zeros(shape)
    anchor = horizon_s
    while anchor < oldest:
        for ages in ages_by_user:
            before = [a for a in ages if a > anchor]
            row = (
                sum(min(before) - anchor >= edge for edge in ELAPSED_EDGES_SECONDS)
                if before
                else shape[0] - 1
            )
            volume = sum(anchor < a <= anchor + VOLUME_WINDOW_SECONDS for a in ages)
            col = sum(volume >= edge for edge in VOLUME_EDGES)
            sums[row, col] += sum(anchor - horizon_s < a <= anchor for a in ages)
            counts[row, col] += 1
        anchor += step_s
    overall = sums.sum() / counts.sum()
    row_mean = (sums.sum(axis=1) + prior * overall) / (counts.sum(axis=1) + prior)
    return (sums + prior * row_mean[:, None]) / (counts + prior), counts


def test_return_model_matches_a_brute_force_count_over_anchors() -> None:
    rng = np.random.default_rng(3)
    users = rng.integers(0, 12, 400).tolist()
    ages = np.round(rng.uniform(0.01, 60.0, 400), 3).tolist()
    log = _log(users, ages)
    model = fit_return_model(
        log["user_id"].to_numpy(), log["event_timestamp"], NOW, 3 * HOUR, HOUR, prior_anchors=2.0
    )
    expected, counts = _brute_force(log, 3 * HOUR, HOUR, 2.0)
    assert (counts > 0).sum() >= 10  # the log fills many cells, not one
    np.testing.assert_allclose(model.expected_by_cell, expected, rtol=1e-9)
    np.testing.assert_array_equal(model.observations_by_cell, counts)


def _feed(rng: np.random.Generator, users: int) -> tuple[list[int], list[float]]:
    """Sessions of many events spread over minutes, then silence for a day or more."""
    who, when = [], []
    for u in range(users):
        start = rng.uniform(0, 48)
        while start < 96:
            for k in range(12):  # a session: an event every 5 minutes for an hour
                who.append(u)
                when.append(start + k / 12)
            start += rng.uniform(20, 40)
    return who, when


def test_a_user_mid_session_weighs_more_than_one_gone_for_hours_in_a_feed() -> None:
    rng = np.random.default_rng(0)
    who, ages = _feed(rng, 60)
    log = _log(who, ages).loc[lambda f: f["event_timestamp"] < NOW]
    # User 1000 was seen 10 minutes ago for the first time in a while; 1001 nine hours ago.
    extra = _log([1000, 1000, 1001], [0.17, 30.0, 9.0])
    log = pd.concat([log, extra], ignore_index=True)
    weight = return_weights(np.array([1000, 1001]), log, NOW, 6 * HOUR, 1.0)
    assert weight[0] > 2 * weight[1], weight
    assert ((weight > 0) & (weight <= 1)).all()
    # The exponent sharpens the same weights; 0 weighs every user alike.
    squared = return_weights(np.array([1000, 1001]), log, NOW, 6 * HOUR, 2.0)
    np.testing.assert_allclose(squared, weight**2)
    np.testing.assert_array_equal(
        return_weights(np.array([1000, 1001]), log, NOW, 6 * HOUR, 0.0), 1.0
    )
    with pytest.raises(ValueError, match="exponent"):
        return_weights(np.array([1000]), log, NOW, 6 * HOUR, -1.0)


def test_in_daily_visits_the_user_who_just_left_weighs_less_than_one_due_back() -> None:
    """Each user comes once every 24 h, one event a visit: the user seen an hour ago will not be
    back within 6 h; the one seen 20 h ago will."""
    users, ages = [], []
    for u in range(50):
        offset = u * 24 / 50
        users += [u] * 4
        ages += [offset + 24 * k for k in range(4)]
    log = _log(users, ages)
    just_left, due_back = 2, 41  # last seen 0.96 h and 19.7 h ago
    weight = return_weights(np.array([just_left, due_back]), log, NOW, 6 * HOUR, 1.0)
    assert weight[1] > 3 * weight[0], weight


def test_events_at_or_after_the_round_change_nothing() -> None:
    rng = np.random.default_rng(1)
    who, ages = _feed(rng, 30)
    log = _log(who, ages)
    past = log.loc[log["event_timestamp"] < NOW]
    future = _log([0, 0, 5, 99], [0.0, -1.0, -0.5, -2.0])
    altered = pd.concat([log, future], ignore_index=True)
    users = np.array([0, 5, 7, 99])
    np.testing.assert_array_equal(
        return_weights(users, past, NOW, 6 * HOUR, 1.0),
        return_weights(users, altered, NOW, 6 * HOUR, 1.0),
    )


def test_string_ids_weigh_as_int_ids_and_a_short_window_weighs_everyone_alike() -> None:
    rng = np.random.default_rng(2)
    who, ages = _feed(rng, 20)
    by_int = _log(who, ages)
    by_name = by_int.assign(user_id=[f"member-{u}" for u in who])
    ints = return_weights(np.array([0, 3, 19]), by_int, NOW, 6 * HOUR, 1.0)
    names = return_weights(
        np.array(["member-0", "member-3", "member-19"], dtype=object), by_name, NOW, 6 * HOUR, 1.0
    )
    np.testing.assert_allclose(ints, names)
    empty = _log([1], [1.0]).iloc[:0]
    np.testing.assert_array_equal(return_weights(np.array([1, 2]), empty, NOW, 6 * HOUR, 3.0), 1.0)
    short = _log([1, 2, 2], [1.0, 2.0, 0.5])  # 2 h of log, a 6 h horizon: nothing to learn from
    np.testing.assert_array_equal(
        return_weights(np.array([1, 2, 3]), short, NOW, 6 * HOUR, 1.0), 1.0
    )


def test_fit_return_model_refuses_bad_arguments() -> None:
    log = _log([1], [1.0])
    users, times = log["user_id"].to_numpy(), log["event_timestamp"]
    with pytest.raises(ValueError, match="horizon_seconds"):
        fit_return_model(users, times, NOW, 0)
    with pytest.raises(ValueError, match="anchor_step_seconds"):
        fit_return_model(users, times, NOW, HOUR, anchor_step_seconds=-1)
    with pytest.raises(ValueError, match="prior_anchors"):
        fit_return_model(users, times, NOW, HOUR, prior_anchors=-1)
    with pytest.raises(ValueError, match="event_times"):
        fit_return_model(np.array([1, 2]), times, NOW, HOUR)
