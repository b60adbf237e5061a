"""The tier rule, written once: which stored vector, if any, a (user, item) pair is served.

A stored value is *usable* when all of these hold:

- it was stored and decodes to a vector of the view's length D;
- every component is finite (a NaN or inf vector is a miss, never a normal tier);
- it was made by the embedding version the VM was trained with (spaces are never mixed);
- its ``computed_at`` is known and not later than ``now`` plus a clock-skew allowance
  (:data:`DEFAULT_CLOCK_SKEW_SECONDS`): a value from the future is a broken clock or a bad write;
- it is fresh: ``age <= ttl``, with ``age = now - computed_at`` (a vector exactly TTL old is still
  served, the boundary Feast's own point-in-time join uses: ``event_timestamp >= t - ttl``).

The best usable tier wins, exact > similar > user aggregate > zero; the served age is clipped at
0 for values up to the allowance in the future.

Everything that applies the rule calls :func:`resolve` (or :func:`usable_rows` for one tier): the
retriever, the replay, the coverage of a round, the store status, the user aggregate and the
similarity fill. The resolved on-demand view runs inside Feast without solaris installed, so its
generated source embeds the text of :func:`usable_rows` itself (see ``store/definitions.py``); a
parity test over a grid of cases pins the two.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from solaris_feast.tiers import SEARCH_ORDER, Tier

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_CLOCK_SKEW_SECONDS = 300.0
"""How far in the future a ``computed_at`` may lie (writers' and servers' clocks differ)."""


def clock_skew_of(resolved_tags: Mapping[str, str] | None) -> float:
    """The clock skew a deployment configured (``SolarisFeastConfig.clock_skew_seconds``, kept
    in the resolved view's tag), else :data:`DEFAULT_CLOCK_SKEW_SECONDS`: the one value every
    reader and writer of the repo applies."""
    from solaris_feast.store.tags import TAG_CLOCK_SKEW_SECONDS

    raw = (resolved_tags or {}).get(TAG_CLOCK_SKEW_SECONDS)
    return float(raw) if raw is not None else DEFAULT_CLOCK_SKEW_SECONDS


def repo_clock_skew(store: object, resolved_view: str | None = None) -> float:
    """:func:`clock_skew_of` the resolved view of a Feast store's registry (the default where
    the repo has none, as a writer-only repo may)."""
    from feast.errors import FeastObjectNotFoundException

    from solaris_feast.store.definitions import SolarisFeastConfig

    name = resolved_view or SolarisFeastConfig().resolved_view_name
    lookup = getattr(store, "get_on_demand_feature_view", None)
    if lookup is None:  # not a Feast store (a test double, a registry-less facts object)
        return DEFAULT_CLOCK_SKEW_SECONDS
    try:
        view = lookup(name)
    except FeastObjectNotFoundException:
        return DEFAULT_CLOCK_SKEW_SECONDS
    return clock_skew_of(view.tags)


TIER_DTYPE = np.int8
REJECTION_REASONS = ("other_version", "stale", "future", "non_finite")
"""Why a stored, decodable vector was not served (absent and undecodable values are counted by
the reader that decodes them)."""


def fresh_window(
    now: pd.Timestamp, ttl_seconds: float, clock_skew_seconds: float = 0.0
) -> tuple[pd.Timestamp, pd.Timestamp]:
    """``(start, end]``, the ``computed_at`` values :func:`usable_rows` calls fresh at ``now``,
    in the half-open form the offline log is read with (``store/offline.py``): ``start`` is one
    nanosecond before ``now - ttl``, so a value exactly TTL old is in, as the rule serves it;
    ``end`` is ``now`` plus the clock skew a reader allows."""
    import pandas as pd

    start = now - pd.Timedelta(seconds=ttl_seconds) - pd.Timedelta(1, "ns")
    return start, now + pd.Timedelta(seconds=clock_skew_seconds)


def usable_rows(
    vectors: np.ndarray,
    present: np.ndarray,
    version_matches: np.ndarray,
    computed_at_s: np.ndarray,
    now_s: float,
    ttl_seconds: float,
    clock_skew_seconds: float,
) -> np.ndarray:
    """``(N,)`` bool: which of one tier's N stored values may be served.

    Args:
        vectors: ``(N, D)`` float; rows where ``present`` is False are ignored.
        present: ``(N,)`` bool, a value was stored and decoded to length D.
        version_matches: ``(N,)`` bool, made by the expected embedding version.
        computed_at_s: ``(N,)`` float64 unix seconds, NaN where unknown.
        now_s: the time of the request, unix seconds.
        ttl_seconds: the tier's TTL.
        clock_skew_seconds: how far in the future ``computed_at`` may be.

    This function is copied verbatim into the resolved view's source: numpy only, no closures.
    """
    import numpy as np

    present = np.asarray(present, dtype=bool)
    computed = np.asarray(computed_at_s, dtype=np.float64)
    age = now_s - computed
    with np.errstate(invalid="ignore"):
        fresh = (age <= ttl_seconds) & (age >= -clock_skew_seconds)
    ok = present & np.asarray(version_matches, dtype=bool) & np.isfinite(computed) & fresh
    # Finiteness last and only on the rows still in: a precompute table holds millions of
    # vectors, and checking them all would copy every one.
    rows = np.flatnonzero(ok)
    vectors = np.asarray(vectors)
    for start in range(0, len(rows), 65536):
        chunk = rows[start : start + 65536]
        ok[chunk] = np.isfinite(vectors[chunk]).all(axis=1)
    return ok


@dataclass(frozen=True)
class TierValues:
    """One tier's stored values for N pairs, decoded.

    Attributes:
        vectors: ``(N, D)`` float32; any values where ``present`` is False.
        present: ``(N,)`` bool, a value was stored and decoded to length D.
        version_matches: ``(N,)`` bool, made by the expected embedding version.
        computed_at_s: ``(N,)`` float64 unix seconds, NaN where unknown.
    """

    vectors: np.ndarray
    present: np.ndarray
    version_matches: np.ndarray
    computed_at_s: np.ndarray

    @classmethod
    def absent(cls, n: int, dim: int) -> TierValues:
        """A tier that holds nothing for any of the N pairs."""
        return cls(
            vectors=np.zeros((n, dim), dtype=np.float32),
            present=np.zeros(n, dtype=bool),
            version_matches=np.zeros(n, dtype=bool),
            computed_at_s=np.full(n, np.nan),
        )


@dataclass(frozen=True)
class Resolution:
    """What the VM is served for N pairs.

    Attributes:
        embeddings: ``(N, D)`` float32; zeros where ``tiers`` is ZERO.
        tiers: ``(N,)`` int8 values of :class:`~solaris_feast.tiers.Tier`.
        age_seconds: ``(N,)`` float64 seconds since the served vector was computed (clipped at
            0); NaN for ZERO.
        rejected: how many stored, decodable values were refused, by reason
            (:data:`REJECTION_REASONS`), over all tiers, counting only the rows a tier was
            consulted for (a pair served exactly does not count its similar value); filled
            when ``count_rejections`` is set.
    """

    embeddings: np.ndarray
    tiers: np.ndarray
    age_seconds: np.ndarray
    rejected: dict[str, int] = field(default_factory=dict)


def rejection_counts(
    values: TierValues,
    now_s: float,
    ttl_seconds: float,
    clock_skew_seconds: float,
    rows: np.ndarray | None = None,
) -> dict[str, int]:
    """Why present values of one tier are refused (a value can have several reasons; each is
    counted under the first that applies, in the order of :data:`REJECTION_REASONS`).

    ``rows``: ``(N,)`` bool, the rows to count (default all); :func:`resolve` counts only the
    rows a better tier had not already served, the values it actually consulted. An unknown
    ``computed_at`` (NaN) counts as stale.
    """
    present = np.asarray(values.present, dtype=bool)
    left = present.copy() if rows is None else present & np.asarray(rows, dtype=bool)
    age = now_s - np.asarray(values.computed_at_s, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        future = age < -clock_skew_seconds
        checks = {
            "other_version": ~np.asarray(values.version_matches, dtype=bool),
            "stale": ~(age <= ttl_seconds) & ~future,
            "future": future,
            "non_finite": np.zeros(len(present), dtype=bool),
        }
    if left.any():
        checks["non_finite"][left] = ~np.isfinite(np.asarray(values.vectors)[left]).all(axis=1)
    counts: dict[str, int] = {}
    for reason in REJECTION_REASONS:
        hit = left & checks[reason]
        counts[reason] = int(hit.sum())
        left &= ~hit
    return counts


def resolve(
    tiers: Mapping[Tier, TierValues],
    *,
    now_s: float,
    ttl_seconds: Mapping[Tier, float],
    clock_skew_seconds: float = DEFAULT_CLOCK_SKEW_SECONDS,
    count_rejections: bool = False,
) -> Resolution:
    """Apply the tier rule to N pairs: the best usable tier each, exact > similar > user > zero.

    Args:
        tiers: the stored values of each vector tier; a tier left out holds nothing.
        now_s: the request time, unix seconds.
        ttl_seconds: TTL of each tier given in ``tiers``.
        clock_skew_seconds: how far in the future ``computed_at`` may lie.
        count_rejections: also count, per reason, the values that were refused.
    """
    given = [t for t in SEARCH_ORDER if t in tiers]
    if not given:
        raise ValueError("resolve needs at least one tier's values")
    n = len(tiers[given[0]].present)
    first = tiers[given[0]].vectors
    dim = first.shape[1] if first.ndim == 2 else 0
    embeddings = np.zeros((n, dim), dtype=np.float32)
    served = np.zeros(n, dtype=TIER_DTYPE)
    ages = np.full(n, np.nan, dtype=np.float64)
    open_rows = np.ones(n, dtype=bool)
    rejected = dict.fromkeys(REJECTION_REASONS, 0)
    for tier in given:
        values = tiers[tier]
        if len(values.present) != n:
            raise ValueError(f"tier {tier.name} has {len(values.present)} rows, expected {n}")
        if values.vectors.shape != (n, dim):
            raise ValueError(
                f"tier {tier.name} has vectors of shape {values.vectors.shape}, expected {(n, dim)}"
            )
        if tier not in ttl_seconds:
            raise ValueError(f"resolve got values for tier {tier.name} but no ttl for it")
        ok = usable_rows(
            values.vectors,
            values.present,
            values.version_matches,
            values.computed_at_s,
            now_s,
            float(ttl_seconds[tier]),
            clock_skew_seconds,
        )
        if count_rejections and (open_rows & values.present & ~ok).any():
            for reason, count in rejection_counts(
                values, now_s, float(ttl_seconds[tier]), clock_skew_seconds, rows=open_rows
            ).items():
                rejected[reason] += count
        take = ok & open_rows
        if take.any():
            embeddings[take] = values.vectors[take]
            served[take] = int(tier)
            ages[take] = np.maximum(now_s - values.computed_at_s[take], 0.0)
            open_rows &= ~take
        if not open_rows.any():
            break
    return Resolution(embeddings=embeddings, tiers=served, age_seconds=ages, rejected=rejected)
