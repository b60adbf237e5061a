"""One replay step through the real Feast path: the replay's in-memory stores must give the
tier the retriever gives.

The rows the step's requests touch are written with :class:`EmbeddingWriter` into a temporary
SQLite online store and read back with :class:`SolarisRetriever`; the record counts the pairs
whose tier differs. It costs a ``feast apply`` and a few hundred writes: seconds, once a replay.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from solaris_feast.columns import (
    COMPUTED_AT,
    EMBEDDING,
    MEAN_DISTANCE,
    MODEL_VERSION,
    NEIGHBOUR_COUNT,
    PAIR_COUNT,
)
from solaris_feast.data.schema import ITEM_ID, USER_ID
from solaris_feast.evaluation.replay_config import SimulationConfig
from solaris_feast.evaluation.replay_state import PlannerState
from solaris_feast.keys import pair_keys, split_pair_keys
from solaris_feast.serving.resolve import DEFAULT_CLOCK_SKEW_SECONDS
from solaris_feast.tiers import Tier


def check_against_feast(
    step_index: int,
    step_start: pd.Timestamp,
    requests: pd.DataFrame,
    expected: np.ndarray,
    state: PlannerState,
    cfg: SimulationConfig,
    version: str,
) -> dict[str, Any]:
    """Write the rows a step's ``requests`` touch through the Feast writer (SQLite online store)
    and read them back with :class:`SolarisRetriever`; count pairs whose tier differs from the
    replay's ``expected`` ``(N,)`` tiers."""
    from solaris_feast.serving.retriever import SolarisRetriever
    from solaris_feast.store.config import open_store
    from solaris_feast.store.definitions import SolarisFeastConfig, solaris_definitions
    from solaris_feast.store.write import EmbeddingWriter

    started = time.perf_counter()
    keys = pair_keys(requests[USER_ID].to_numpy(), requests[ITEM_ID].to_numpy())
    dim = state.dim
    views = SolarisFeastConfig(
        embedding_dim=dim,
        pair_ttl_seconds=cfg.pair_ttl_seconds,
        user_ttl_seconds=cfg.user_ttl_seconds,
        similar_ttl_seconds=cfg.similar_ttl_seconds,
    )
    # Simulated time t maps to wall time (now + lead) + (t - step start): the retriever's clock
    # reads every age `lead` minus the check's own duration younger than the replay does. Every
    # simulated time is a whole step from every other, so that moves no age across a TTL, and a
    # value exactly TTL old stays fresh on both sides (age <= ttl). The newest values then lie
    # up to `lead` in the future, inside the clock-skew allowance the rule grants.
    lead_s = DEFAULT_CLOCK_SKEW_SECONDS / 2
    offset_s = time.time() + lead_s - step_start.value / 1e9
    with tempfile.TemporaryDirectory(prefix="solaris-simulate-feast-") as tmp:
        store = open_store(f"solaris_sim_{step_index}", Path(tmp), online="sqlite")
        store.apply(solaris_definitions(views).all())
        wanted = np.unique(keys)
        for tier_store, view_name, key_cols in (
            (state.exact, views.pair_view_name, (USER_ID, ITEM_ID)),
            (state.similar, views.similar_view_name, (USER_ID, ITEM_ID)),
            (state.user, views.user_view_name, (USER_ID,)),
        ):
            if key_cols == (USER_ID,):
                mask = np.isin(tier_store.keys, requests[USER_ID].to_numpy())
            else:
                mask = np.isin(tier_store.keys, wanted)
            if not mask.any():
                continue
            frame = pd.DataFrame(
                {
                    EMBEDDING: list(tier_store.vectors[mask]),
                    MODEL_VERSION: version,
                    COMPUTED_AT: pd.to_datetime(
                        np.round((tier_store.computed_at_s[mask] + offset_s) * 1e6).astype(
                            np.int64
                        ),
                        unit="us",
                        utc=True,
                    ),
                }
            )
            if key_cols == (USER_ID,):
                frame.insert(0, USER_ID, tier_store.keys[mask])
                frame[PAIR_COUNT] = np.ones(int(mask.sum()), dtype=np.int64)
            else:
                users, items = split_pair_keys(tier_store.keys[mask])
                frame.insert(0, USER_ID, users)
                frame.insert(1, ITEM_ID, items)
                if view_name == views.similar_view_name:
                    frame[NEIGHBOUR_COUNT] = np.ones(int(mask.sum()), dtype=np.int64)
                    frame[MEAN_DISTANCE] = np.zeros(int(mask.sum()), dtype=np.float32)
            writer = EmbeddingWriter(store, view_name, offline=False, online=True)
            try:
                writer.write(frame)
            finally:
                writer.close()
        retriever = SolarisRetriever(store, version, record_misses=False, deadline_ms=10_000)
        got = np.zeros(len(requests), dtype=np.int64)
        try:
            users = requests[USER_ID].to_numpy()
            items = requests[ITEM_ID].to_numpy()
            for user_id in np.unique(users):
                rows = np.flatnonzero(users == user_id)
                distinct, inverse = np.unique(items[rows], return_inverse=True)
                result = retriever.fetch(int(user_id), distinct)
                got[rows] = result.tiers.astype(np.int64)[inverse]
        finally:
            retriever.close()
    mismatches = int((got != expected).sum())
    return {
        "planner": state.planner,
        "budget": state.budget,
        "space": state.space,
        "step": step_index,
        "pairs": len(requests),
        "tiers_seen": {Tier(t).name.lower(): int((expected == t).sum()) for t in Tier},
        "mismatches": mismatches,
        "identical": mismatches == 0,
        "seconds": round(time.perf_counter() - started, 2),
    }
