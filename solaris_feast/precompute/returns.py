"""Who comes back: the planner's user weight, fitted on the log at every round.

The verifier scores a pair as if it were requested; it cannot say *whether* its user requests
while the pair's vector is fresh. That depends on the product's return process, which differs
between deployments: in a scrolling feed a user seen minutes ago is probably mid-session and asks
again within the hour, while in a log of daily visits the user who just left is the one least
likely to come back soon. So no fixed recency rule fits every log (measured both ways in
``benchmarks/README.md``). :func:`fit_return_model` learns the rule from the log the round
already read:

- anchors every ``anchor_step_seconds`` in the window, each at least ``horizon_seconds`` before
  the round, so that what follows an anchor is known;
- at each anchor, every user of the window is described by the time since their last event
  (binned on a log scale, :data:`ELAPSED_EDGES_SECONDS`; "none in the window" is a bin of its
  own) and by their events in the day before (:data:`VOLUME_EDGES`), and counted by their events
  in ``[anchor, anchor + horizon)``;
- a cell's value is its mean count, shrunk towards its time bin's mean (and that towards the
  overall mean) by ``prior_anchors`` pseudo-observations, so a cell seen rarely does not decide
  the plan.

:func:`return_weights` then looks every candidate's user up in the table (the expected number
of events in the coming horizon, by default the pair TTL) and turns it into the weight the
planner multiplies into the request score
(:func:`~solaris_feast.precompute.plan.request_score`). Only events strictly before the round
are read, by the fit and by the weights alike.

Cost: ``O(A * E)`` for ``A`` anchors and ``E`` events of the window (one pass of numpy per
anchor over the time-sorted events): a two-day window of the ``large`` preset (1.03 M events,
19k users, 47 anchors) took 0.13 s here, fit and weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from solaris_feast.columns import EVENT_TIMESTAMP, USER_ID
from solaris_feast.data.schema import as_utc
from solaris_feast.keys import id_array
from solaris_feast.precompute.plan import unix_seconds

ELAPSED_EDGES_SECONDS: tuple[float, ...] = (
    300.0,
    900.0,
    1800.0,
    3600.0,
    2 * 3600.0,
    4 * 3600.0,
    8 * 3600.0,
    16 * 3600.0,
    32 * 3600.0,
)
"""Upper edges of the time-since-last-event bins: minutes (mid-session), then hours, doubling.
A user with no event in the window falls in the bin after the last."""
VOLUME_EDGES: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
"""Upper edges of the bins of a user's events in the last :data:`VOLUME_WINDOW_SECONDS`: none,
one, then doubling. How often a user comes, beside how long ago they last came."""
VOLUME_WINDOW_SECONDS = 86_400.0
"""A day: the window a user's volume is counted over."""
DEFAULT_ANCHOR_STEP_SECONDS = 3600
"""One anchor an hour: a day's window gives 24 looks at who came back, each of every user."""
DEFAULT_PRIOR_ANCHORS = 20.0
"""Pseudo-observations added to every cell: at the mean of its time-since-last-event bin, and
to every such bin at the overall mean."""
_SHAPE = (len(ELAPSED_EDGES_SECONDS) + 1, len(VOLUME_EDGES) + 1)
_CodedEvents = tuple[np.ndarray, np.ndarray, np.ndarray]
"""User codes, the ids they stand for, and unix seconds of the events before the round, sorted
by time."""


@dataclass(frozen=True)
class ReturnModel:
    """Expected events of a user in the coming horizon, by the time since their last event and
    their events in the last day.

    Attributes:
        horizon_seconds: The horizon the counts are over.
        expected_by_cell: ``(len(ELAPSED_EDGES_SECONDS) + 1, len(VOLUME_EDGES) + 1)`` float64;
            the last row is for users with no event in the window.
        observations_by_cell: ``(same,)`` int64, (user, anchor) observations behind each cell.
    """

    horizon_seconds: float
    expected_by_cell: np.ndarray
    observations_by_cell: np.ndarray


def return_weights(
    users: np.ndarray,
    log: pd.DataFrame,
    now: pd.Timestamp,
    horizon_seconds: float,
    exponent: float,
) -> np.ndarray:
    """``(P,)`` weights in ``[0, 1]`` of ``users`` for the planner
    (:func:`~solaris_feast.precompute.plan.request_score`): their expected events within
    ``horizon_seconds`` after ``now`` (:func:`fit_return_model` on ``log``'s ``user_id`` and
    ``event_timestamp`` before ``now``) over the largest cell's, to the power ``exponent``.

    Over the model's largest, not over these users', so the shards of a round, each weighing
    its own users, stay comparable. ``exponent`` 1 weighs a pair by its user's expected events;
    the verifier's score is no calibrated probability of a request, so how hard to lean on the
    user is a choice (``PrecomputeSettings.return_weight_exponent``).
    """
    if exponent < 0:
        raise ValueError(f"exponent must be >= 0, got {exponent}")
    now_s = as_utc(now, "now").value / 1e9
    # The log is coded and sorted once: the fit's anchors and the weights at now read it alike.
    events = _coded_events(log[USER_ID].to_numpy(), log[EVENT_TIMESTAMP], now_s)
    model = _fit(events, now_s, horizon_seconds, DEFAULT_ANCHOR_STEP_SECONDS, DEFAULT_PRIOR_ANCHORS)
    codes, uniques, times_s = events
    elapsed, volume = _cells(codes, times_s, len(uniques), now_s)
    position = pd.Index(uniques).get_indexer(id_array(np.asarray(users)))
    known = position >= 0
    # A user with no event before now sits in the last row ("none in the window"), volume 0.
    row = np.full(len(position), _SHAPE[0] - 1)
    col = np.zeros(len(position), dtype=np.int64)
    row[known], col[known] = elapsed[position[known]], volume[position[known]]
    expected = model.expected_by_cell[row, col]
    return np.asarray((expected / model.expected_by_cell.max()) ** exponent, dtype=np.float64)


def fit_return_model(
    event_users: np.ndarray,
    event_times: pd.Series,
    now: pd.Timestamp,
    horizon_seconds: float,
    anchor_step_seconds: float = DEFAULT_ANCHOR_STEP_SECONDS,
    prior_anchors: float = DEFAULT_PRIOR_ANCHORS,
) -> ReturnModel:
    """Fit the expected events per cell (time since last event x events in the last day) on
    the log before ``now``.

    Args:
        event_users: ``(E,)`` user id of each logged event (Int64 or String ids).
        event_times: ``(E,)`` UTC datetimes of the events.
        now: The round's time (UTC); events at or after it are not read.
        horizon_seconds: What "comes back" means: events within this long after an anchor (> 0).
        anchor_step_seconds: Time between two anchors (> 0).
        prior_anchors: Shrinkage of each cell towards its row's mean, and of each row towards
            the overall mean (>= 0).

    Returns:
        The fitted :class:`ReturnModel`. With no anchor that fits in the window (a window
        shorter than the horizon), every cell is 1: every user weighs alike.
    """
    if len(event_users) != len(event_times):
        raise ValueError(f"event_users has {len(event_users)} rows, event_times {len(event_times)}")
    now_s = as_utc(now, "now").value / 1e9
    events = _coded_events(event_users, event_times, now_s)
    return _fit(events, now_s, horizon_seconds, anchor_step_seconds, prior_anchors)


def _fit(
    events: _CodedEvents,
    now_s: float,
    horizon_seconds: float,
    anchor_step_seconds: float,
    prior_anchors: float,
) -> ReturnModel:
    if horizon_seconds <= 0:
        raise ValueError(f"horizon_seconds must be > 0, got {horizon_seconds}")
    if anchor_step_seconds <= 0:
        raise ValueError(f"anchor_step_seconds must be > 0, got {anchor_step_seconds}")
    if prior_anchors < 0:
        raise ValueError(f"prior_anchors must be >= 0, got {prior_anchors}")
    codes, uniques, times_s = events
    flat = ReturnModel(float(horizon_seconds), np.ones(_SHAPE), np.zeros(_SHAPE, dtype=np.int64))
    if len(times_s) == 0:
        return flat
    # Anchors late enough to have history before them and early enough to see their horizon.
    anchors = np.arange(now_s - horizon_seconds, float(times_s[0]), -anchor_step_seconds)
    if len(anchors) == 0:
        return flat
    cells = _SHAPE[0] * _SHAPE[1]
    sums = np.zeros(cells)
    counts = np.zeros(cells, dtype=np.int64)
    for anchor in anchors:
        elapsed, volume = _cells(codes, times_s, len(uniques), anchor)
        cell = elapsed * _SHAPE[1] + volume
        seen = int(np.searchsorted(times_s, anchor, side="left"))
        upto = int(np.searchsorted(times_s, anchor + horizon_seconds, side="left"))
        returned = np.bincount(codes[seen:upto], minlength=len(uniques)).astype(np.float64)
        sums += np.bincount(cell, weights=returned, minlength=cells)
        counts += np.bincount(cell, minlength=cells)
    sums, counts = sums.reshape(_SHAPE), counts.reshape(_SHAPE)
    overall = sums.sum() / max(int(counts.sum()), 1)
    row_mean = (sums.sum(axis=1) + prior_anchors * overall) / (counts.sum(axis=1) + prior_anchors)
    expected = (sums + prior_anchors * row_mean[:, None]) / (counts + prior_anchors)
    if not np.any(expected > 0):
        expected = np.ones(_SHAPE)
    return ReturnModel(float(horizon_seconds), expected, counts)


def _coded_events(event_users: np.ndarray, event_times: pd.Series, now_s: float) -> _CodedEvents:
    """Events strictly before ``now_s``, sorted by time: user codes, the ids they stand for, and
    unix seconds."""
    times_s = unix_seconds(pd.Series(event_times).reset_index(drop=True))
    user_keys = id_array(np.asarray(event_users))
    before = times_s < now_s
    codes, uniques = pd.factorize(user_keys[before], sort=False)
    order = np.argsort(times_s[before], kind="stable")
    return codes[order], np.asarray(uniques), times_s[before][order]


def _cells(
    codes: np.ndarray, times_s: np.ndarray, num_users: int, at_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Row (time since last event before ``at_s``) and column (events in the day before it) of
    every user code, from time-sorted events."""
    seen = int(np.searchsorted(times_s, at_s, side="left"))
    day = int(np.searchsorted(times_s, at_s - VOLUME_WINDOW_SECONDS, side="left"))
    last = np.full(num_users, -np.inf)
    np.maximum.at(last, codes[:seen], times_s[:seen])
    elapsed = np.where(np.isfinite(last), at_s - last, np.nan)
    row = np.searchsorted(np.asarray(ELAPSED_EDGES_SECONDS), elapsed, side="right")
    row[np.isnan(elapsed)] = len(ELAPSED_EDGES_SECONDS)
    volume = np.bincount(codes[day:seen], minlength=num_users)
    col = np.searchsorted(np.asarray(VOLUME_EDGES), volume, side="right")
    return row.astype(np.int64), col.astype(np.int64)
