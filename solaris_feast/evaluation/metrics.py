"""The measures the method is judged by, each written once.

- :func:`normalized_entropy`: log loss over the entropy of the labels' base rate (1.0 is no
  better than predicting the base rate; lower is better);
- :func:`transfer_ratio`: the share of the FM's NE gain that reaches the VM;
- :func:`coverage_shares`: the share of served pairs per tier;
- :func:`percentile_rank`: scores as ranks in ``[0, 1]``, so one threshold fits every planner;
- :func:`mean_ci95`: a mean over seeds with its 95 % Student-t interval.

numpy only (torch tensors are accepted and read as arrays), so models, the replay, the demo and
benchmarks can all import it cheaply.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from solaris_feast.tiers import Tier

PROBABILITY_CLIP = 1e-7
"""Probabilities (and the base rate) are clipped to ``[c, 1 - c]``: a confident wrong answer
costs ``-log(c)``, about 16 nats, instead of infinity."""


def _as_float64(values: Any) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor, possibly made under inference_mode
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=np.float64)


def normalized_entropy(probabilities: Any, labels: Any) -> list[float]:
    """NE per task of ``(N,)`` or ``(N, T)`` probabilities against 0/1 labels of that shape.

    Returns one value per task (a single one for ``(N,)`` input).

    Raises:
        ValueError: the shapes differ or there are no rows.
    """
    p = _as_float64(probabilities)
    y = _as_float64(labels)
    if p.shape != y.shape:
        raise ValueError(f"probabilities {p.shape} and labels {y.shape} differ in shape")
    if p.ndim not in (1, 2) or len(p) == 0:
        raise ValueError(f"NE needs (N,) or (N, T) values with N > 0, got shape {p.shape}")
    if p.ndim == 1:
        p, y = p[:, None], y[:, None]
    p = np.clip(p, PROBABILITY_CLIP, 1 - PROBABILITY_CLIP)
    logloss = -(y * np.log(p) + (1 - y) * np.log(1 - p)).mean(axis=0)
    rate = np.clip(y.mean(axis=0), PROBABILITY_CLIP, 1 - PROBABILITY_CLIP)
    entropy = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
    return [float(v) for v in logloss / entropy]


def transfer_ratio(ne_vm: float, ne_with_transfer: float, ne_fm: float) -> float:
    """Share of the FM's NE gain that reaches the VM: ``(NE_vm - NE_x) / (NE_vm - NE_fm)``.

    NaN when the FM is not better than the VM: there is no gain to transfer, and any number
    would mislead (a tiny denominator makes the ratio explode).
    """
    gap = ne_vm - ne_fm
    if gap <= 0:
        return math.nan
    return (ne_vm - ne_with_transfer) / gap


def coverage_shares(tier_counts: np.ndarray) -> dict[str, float]:
    """Share of served pairs per tier from ``(len(Tier),)`` counts indexed by tier value, and
    ``any``: the share that got a non-zero embedding."""
    counts = np.asarray(tier_counts)
    total = max(int(counts.sum()), 1)
    zero = float(counts[int(Tier.ZERO)]) / total
    return {
        "exact": float(counts[int(Tier.EXACT)]) / total,
        "similar": float(counts[int(Tier.SIMILAR)]) / total,
        "user": float(counts[int(Tier.USER_AGG)]) / total,
        "zero": zero,
        "any": 1.0 - zero,
    }


def percentile_rank(values: np.ndarray) -> np.ndarray:
    """Rank of each value in ``[0, 1]`` (1 = highest); ties share the lowest rank of their
    group, so a block of equal scores never jumps a threshold that a better score misses."""
    if len(values) <= 1:
        return np.ones(len(values))
    ranks = pd.Series(values).rank(method="min").to_numpy()
    return np.asarray((ranks - 1) / (len(values) - 1), dtype=np.float64)


def cluster_bootstrap_weights(
    rng: np.random.Generator, num_clusters: int, replicates: int
) -> np.ndarray:
    """``(replicates, num_clusters)`` draw counts of a cluster bootstrap: each replicate draws
    ``num_clusters`` clusters (users) with replacement, so rows of one user stay together and the
    interval reflects how many users, not how many rows, the figure rests on."""
    if num_clusters <= 0 or replicates <= 0:
        raise ValueError(f"need clusters and replicates > 0, got {num_clusters}, {replicates}")
    return rng.multinomial(num_clusters, np.full(num_clusters, 1.0 / num_clusters), replicates)


def clustered_normalized_entropy(
    loss_sums: np.ndarray, row_counts: np.ndarray, positive_counts: np.ndarray, weights: np.ndarray
) -> np.ndarray:
    """NE of one task under cluster weights: ``(R,)`` from per-cluster sums ``(C,)`` of row log
    loss, rows and positives, and weights ``(R, C)``. With all weights 1 it equals
    :func:`normalized_entropy` over the rows (the test pins that). A replicate that draws no row
    (a few cold users, say) has no NE: NaN, which :func:`ratio_of_means_interval` counts as a
    failed replicate; numpy's divide warning for it is kept off the console."""
    w = np.asarray(weights, dtype=np.float64)
    rows = w @ np.asarray(row_counts, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        logloss = (w @ np.asarray(loss_sums, dtype=np.float64)) / rows
        rate = np.clip(
            (w @ np.asarray(positive_counts, np.float64)) / rows,
            PROBABILITY_CLIP,
            1 - PROBABILITY_CLIP,
        )
    entropy = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
    return np.asarray(logloss / entropy, dtype=np.float64)


def row_log_loss(probabilities: Any, labels: Any) -> np.ndarray:
    """Per-row log loss ``(N, T)`` with the clip :func:`normalized_entropy` uses."""
    p = np.clip(_as_float64(probabilities), PROBABILITY_CLIP, 1 - PROBABILITY_CLIP)
    y = _as_float64(labels)
    if p.shape != y.shape:
        raise ValueError(f"probabilities {p.shape} and labels {y.shape} differ in shape")
    return np.asarray(-(y * np.log(p) + (1 - y) * np.log(1 - p)), dtype=np.float64)


def ratio_of_means_interval(
    numerators: np.ndarray, denominators: np.ndarray, level: float = 0.95
) -> tuple[float, float] | None:
    """Percentile interval of ``sum(num) / sum(den)`` over bootstrap replicates ``(R, K)`` (K
    splits x seeds); None when a replicate's denominator is not positive in more than
    ``1 - level`` of them (no FM gain to share, no ratio)."""
    num = np.asarray(numerators, dtype=np.float64).sum(axis=1)
    den = np.asarray(denominators, dtype=np.float64).sum(axis=1)
    ok = den > 0
    if ok.mean() < level:
        return None
    ratios = np.where(ok, num / np.where(ok, den, 1.0), -np.inf)
    tail = (1 - level) / 2
    # Order statistics, not interpolation: between two failed replicates (-inf) interpolating
    # gives NaN. A lower end that falls on a failed replicate is -inf: unbounded below (null in
    # the JSON reports).
    return (
        float(np.quantile(ratios, tail, method="inverted_cdf")),
        float(np.quantile(ratios, 1 - tail, method="inverted_cdf")),
    )


MIN_BOOTSTRAP_UNITS = 5
"""Fewest units (seeds) a percentile bootstrap over units reports an interval for: with K units
there are C(2K-1, K) distinct resamples (3 at K = 2, 35 at K = 4, 126 at K = 5)."""


def bootstrap_ratio_of_means(
    numerators: Any, denominators: Any, replicates: int = 2000, seed: int = 0
) -> tuple[float, tuple[float, float] | None]:
    """``sum(num) / sum(den)`` over K units (seeds) and its percentile interval from
    ``replicates`` resamplings of the units (:func:`ratio_of_means_interval`); NaN and None
    when the denominators do not sum to a positive gain. Fewer than
    :data:`MIN_BOOTSTRAP_UNITS` units give the ratio and no interval: one seed's "interval" was
    the point itself, two seeds' came from 3 distinct resamples."""
    num, den = _as_float64(numerators).ravel(), _as_float64(denominators).ravel()
    if len(num) == 0 or den.sum() <= 0:
        return math.nan, None
    if len(num) < MIN_BOOTSTRAP_UNITS:
        return float(num.sum() / den.sum()), None
    picks = np.random.default_rng(seed).integers(0, len(num), (replicates, len(num)))
    return float(num.sum() / den.sum()), ratio_of_means_interval(num[picks], den[picks])


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinite float (Python or numpy) replaced by None: strict
    JSON has no NaN, and ``json.dumps`` would write the bare token most parsers refuse."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def strict_json(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`json_safe` ``(value)``, refusing any NaN left."""
    import json

    return json.dumps(json_safe(value), allow_nan=False, **kwargs)


_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
"""Two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom."""


def _t975(df: int) -> float:
    """Student's t 0.975 quantile: the table to 30 degrees of freedom, beyond it the
    Cornish-Fisher expansion around the normal's 1.95996 (error below 1e-3 from df 31)."""
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_ci95(values: Any) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: the mean of per-seed values and its 95 % Student-t interval.

    One value gives ``(v, nan, nan)``: an interval needs at least two seeds. NaN values (a seed
    where a measure is undefined) are left out.
    """
    v = _as_float64(values).ravel()
    v = v[~np.isnan(v)]
    if len(v) == 0:
        return math.nan, math.nan, math.nan
    mean = float(v.mean())
    if len(v) < 2:
        return mean, math.nan, math.nan
    half = _t975(len(v) - 1) * float(v.std(ddof=1)) / math.sqrt(len(v))
    return mean, mean - half, mean + half


def paired_ratios(numerators: Any, denominators: Any) -> np.ndarray:
    """Per seed, ``numerator / denominator`` (a planner's hit rate over the oracle's or random's
    in the same seed), NaN where the denominator is not positive; :func:`mean_ci95` of the
    result is the paired share with its interval, NaN seeds left out."""
    num, den = _as_float64(numerators), _as_float64(denominators)
    if num.shape != den.shape:
        raise ValueError(f"{num.shape} numerators for {den.shape} denominators")
    out = np.full(num.shape, np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out
