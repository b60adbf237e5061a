from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from solaris_feast.errors import SchemaError
from solaris_feast.precompute.aggregate import (
    AggregateConfig,
    PairEmbeddings,
    aggregate_user_embeddings,
)

NOW = pd.Timestamp("2026-06-01T12:00:00Z")
NOW_S = NOW.value / 1e9
DIM = 8
TOL = 1e-5


def _pairs(seed: int, rows: int = 600, users: int = 30) -> PairEmbeddings:
    rng = np.random.default_rng(seed)
    return PairEmbeddings(
        user_ids=rng.integers(0, users, rows).astype(np.int64),
        item_ids=rng.integers(0, 20, rows).astype(np.int64),  # repeats: recomputed pairs
        vectors=rng.normal(size=(rows, DIM)).astype(np.float32),
        # Spread over 36 h before NOW and 2 h after (the future must be ignored).
        computed_at_s=NOW_S - rng.uniform(-2 * 3600, 36 * 3600, rows),
        model_versions=rng.choice(np.array(["v1", "v0"], dtype=object), rows, p=[0.8, 0.2]),
    )


def _brute_force(pairs: PairEmbeddings, cfg: AggregateConfig) -> dict[int, tuple[np.ndarray, int]]:
    """Loop reference: newest row per pair of v1 within the window, weighted mean per user."""
    newest: dict[tuple[int, int], tuple[float, np.ndarray]] = {}
    for r in range(len(pairs)):
        t = pairs.computed_at_s[r]
        if pairs.model_versions[r] != "v1" or not NOW_S - cfg.window_seconds <= t <= NOW_S:
            continue
        key = (int(pairs.user_ids[r]), int(pairs.item_ids[r]))
        if key not in newest or t > newest[key][0]:
            newest[key] = (t, pairs.vectors[r].astype(np.float64))
    by_user: dict[int, list[tuple[float, np.ndarray]]] = {}
    for (user, _), (t, vec) in newest.items():
        by_user.setdefault(user, []).append((t, vec))
    out = {}
    for user, entries in by_user.items():
        if cfg.weighting == "recency":
            w = np.array([0.5 ** ((NOW_S - t) / cfg.half_life_seconds) for t, _ in entries])
        else:
            w = np.ones(len(entries))
        vecs = np.stack([v for _, v in entries])
        out[user] = ((w[:, None] * vecs).sum(0) / w.sum(), len(entries))
    return out


@pytest.mark.parametrize(
    "cfg",
    [
        AggregateConfig(),
        AggregateConfig(weighting="recency", half_life_seconds=3 * 3600),
        AggregateConfig(window_seconds=6 * 3600),
    ],
)
def test_aggregate_equals_brute_force_mean_over_the_window(cfg: AggregateConfig) -> None:
    pairs = _pairs(0)
    rows = aggregate_user_embeddings(pairs, NOW, "v1", cfg)
    expected = _brute_force(pairs, cfg)
    assert sorted(rows["user_id"].tolist()) == sorted(expected)
    for user, vec, count in rows[["user_id", "embedding", "pair_count"]].itertuples(index=False):
        np.testing.assert_allclose(vec, expected[user][0], rtol=TOL, atol=TOL)
        assert count == expected[user][1]
    assert (rows["model_version"] == "v1").all()
    assert (rows["computed_at"] == NOW).all()
    assert rows["embedding"].iloc[0].dtype == np.float32


def test_recomputed_pair_counts_once_with_its_newest_vector() -> None:
    pairs = PairEmbeddings(
        user_ids=np.array([1, 1, 1], dtype=np.int64),
        item_ids=np.array([5, 5, 6], dtype=np.int64),
        vectors=np.array([[0.0, 0.0], [2.0, 2.0], [4.0, 0.0]], dtype=np.float32),
        computed_at_s=np.array([NOW_S - 7200, NOW_S - 60, NOW_S - 100]),
        model_versions=np.array(["v1"] * 3, dtype=object),
    )
    rows = aggregate_user_embeddings(pairs, NOW, "v1")
    np.testing.assert_allclose(rows["embedding"].iloc[0], [3.0, 1.0])
    assert rows["pair_count"].iloc[0] == 2


def test_rerun_for_the_same_interval_writes_identical_rows() -> None:
    pairs = _pairs(1)
    first = aggregate_user_embeddings(pairs, NOW, "v1")
    doubled = PairEmbeddings(
        user_ids=np.concatenate([pairs.user_ids, pairs.user_ids]),
        item_ids=np.concatenate([pairs.item_ids, pairs.item_ids]),
        vectors=np.concatenate([pairs.vectors, pairs.vectors]),
        computed_at_s=np.concatenate([pairs.computed_at_s, pairs.computed_at_s]),
        model_versions=np.concatenate([pairs.model_versions, pairs.model_versions]),
    )  # the offline store holds every row twice (a retried write)
    second = aggregate_user_embeddings(doubled, NOW, "v1")
    pd.testing.assert_frame_equal(first, second)


def test_only_the_requested_model_version_is_averaged() -> None:
    pairs = _pairs(2)
    rows = aggregate_user_embeddings(pairs, NOW, "v0")
    expected_users = {
        int(u)
        for u, v, t in zip(pairs.user_ids, pairs.model_versions, pairs.computed_at_s, strict=True)
        if v == "v0" and NOW_S - 86400 <= t <= NOW_S
    }
    assert set(rows["user_id"]) == expected_users
    assert aggregate_user_embeddings(pairs, NOW, "v9").empty


def test_min_pairs_drops_users_with_too_little_evidence() -> None:
    pairs = _pairs(3)
    cfg = AggregateConfig(min_pairs=4)
    rows = aggregate_user_embeddings(pairs, NOW, "v1", cfg)
    assert (rows["pair_count"] >= 4).all()
    counts = {u: c for u, (_, c) in _brute_force(pairs, cfg).items()}
    assert set(rows["user_id"]) == {u for u, c in counts.items() if c >= 4}


def test_frame_form_gives_the_same_rows() -> None:
    pairs = _pairs(4)
    frame = pd.DataFrame(
        {
            "user_id": pairs.user_ids,
            "item_id": pairs.item_ids,
            "embedding": list(pairs.vectors),
            "model_version": pairs.model_versions,
            "computed_at": pd.to_datetime(
                np.round(pairs.computed_at_s * 1e6).astype(np.int64), unit="us", utc=True
            ),
        }
    )
    from_frame = aggregate_user_embeddings(frame, NOW, "v1")
    direct = aggregate_user_embeddings(pairs, NOW, "v1")
    assert from_frame["user_id"].tolist() == direct["user_id"].tolist()
    np.testing.assert_allclose(
        np.stack(from_frame["embedding"]), np.stack(direct["embedding"]), rtol=TOL, atol=TOL
    )


def test_frame_without_embedding_column_is_refused() -> None:
    with pytest.raises(SchemaError) as err:
        PairEmbeddings.from_frame(pd.DataFrame({"user_id": [1], "item_id": [1]}))
    assert err.value.column == "embedding"


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="item_ids"):
        PairEmbeddings(
            user_ids=np.zeros(2, dtype=np.int64),
            item_ids=np.zeros(3, dtype=np.int64),
            vectors=np.zeros((2, 4), dtype=np.float32),
            computed_at_s=np.zeros(2),
            model_versions=np.array(["v"] * 2, dtype=object),
        )
