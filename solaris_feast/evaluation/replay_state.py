"""State of one replay: in-memory equivalents of the three Feast views, and its counters.

A :class:`TierStore` keeps the newest row per key (a pair key from :mod:`solaris_feast.keys`, or a
user id), as the writer does: keys ``(K,)`` int64 sorted, vectors ``(K, D)`` float32 and
``computed_at`` in unix seconds. :meth:`TierStore.values` hands the rows of the requested keys
to :func:`~solaris_feast.serving.resolve.resolve` as :class:`TierValues`, so the replay serves
with exactly the rule the retriever applies (fresh while ``age <= ttl``, best tier first).

A replay writes one embedding version only, so every stored row matches the expected version.
Lookups are one ``searchsorted`` over the sorted keys: O(N log K) for N requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from solaris_feast.data.schema import ITEM_ID, USER_ID
from solaris_feast.evaluation.replay_config import PlannerName
from solaris_feast.keys import pair_keys, split_pair_keys
from solaris_feast.precompute.aggregate import PairEmbeddings
from solaris_feast.serving.resolve import TierValues
from solaris_feast.tiers import Tier


@dataclass
class TierStore:
    """Newest row per key of one in-memory view."""

    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    computed_at_s: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1]) if self.vectors.ndim == 2 else 0

    def upsert(self, keys: np.ndarray, vectors: np.ndarray, computed_at_s: np.ndarray) -> None:
        """Newest wins; on equal times the later write wins (the writer's rule)."""
        if len(keys) == 0:
            return
        all_keys = np.concatenate([self.keys, keys])
        all_vecs = vectors if len(self.keys) == 0 else np.concatenate([self.vectors, vectors])
        all_t = np.concatenate([self.computed_at_s, computed_at_s])
        # Sort by key, then time, then write order; keep the last row of each key.
        order = np.lexsort((np.arange(len(all_keys)), all_t, all_keys))
        all_keys, all_vecs, all_t = all_keys[order], all_vecs[order], all_t[order]
        last = np.r_[all_keys[1:] != all_keys[:-1], True]
        self.keys, self.vectors, self.computed_at_s = all_keys[last], all_vecs[last], all_t[last]

    def prune(self, older_than_s: float) -> None:
        """Drop rows computed before ``older_than_s``. A row computed exactly then is kept: at
        an age equal to its TTL it is still served (``age <= ttl``)."""
        keep = self.computed_at_s >= older_than_s
        self.keys, self.vectors, self.computed_at_s = (
            self.keys[keep],
            self.vectors[keep],
            self.computed_at_s[keep],
        )

    def values(self, keys: np.ndarray, dim: int) -> TierValues:
        """The stored row of each of N ``keys`` (absent where none), for ``resolve``."""
        if len(self.keys) == 0:
            return TierValues.absent(len(keys), dim)
        pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        present = self.keys[pos] == keys
        return TierValues(
            vectors=self.vectors[pos],
            present=present,
            version_matches=present,
            computed_at_s=np.where(present, self.computed_at_s[pos], np.nan),
        )

    def as_pair_embeddings(self, version: str) -> PairEmbeddings:
        """The rows of a store keyed by pair, as the aggregate and the similarity fill read them."""
        users, items = split_pair_keys(self.keys)
        return PairEmbeddings(
            user_ids=users,
            item_ids=items,
            vectors=self.vectors if len(self.keys) else np.zeros((0, self.dim), dtype=np.float32),
            computed_at_s=self.computed_at_s,
            model_versions=np.full(len(self.keys), version, dtype=object),
        )


@dataclass
class PlannerState:
    """Stores and counters of one (planner, budget, user space) replay."""

    planner: PlannerName
    budget: float
    space: str
    dim: int
    """Length of the served embedding (the VM's ``embedding_dim``)."""
    exact: TierStore = field(default_factory=TierStore)
    similar: TierStore = field(default_factory=TierStore)
    user: TierStore = field(default_factory=TierStore)
    misses: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(
            {USER_ID: np.zeros(0, dtype=np.int64), ITEM_ID: np.zeros(0, dtype=np.int64)}
        )
    )
    fm_pairs: int = 0
    plan_totals: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    tier_counts: dict[str, np.ndarray] = field(default_factory=dict)
    probs: dict[str, list[np.ndarray]] = field(default_factory=dict)
    served: int = 0
    budget_pairs: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        """``planner@budget/space``, how observers and logs name this replay."""
        return f"{self.planner}@{self.budget}/{self.space}"

    def add_seconds(self, part: str, seconds: float) -> None:
        self.seconds[part] = self.seconds.get(part, 0.0) + seconds

    def stored_values(self, users: np.ndarray, items: np.ndarray) -> dict[Tier, TierValues]:
        """What each vector tier holds for N ``(user, item)`` requests."""
        keys = pair_keys(users, items)
        return {
            Tier.EXACT: self.exact.values(keys, self.dim),
            Tier.SIMILAR: self.similar.values(keys, self.dim),
            Tier.USER_AGG: self.user.values(np.asarray(users, dtype=np.int64), self.dim),
        }
