from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable
from typing import Literal

import numpy as np
import pandas as pd
import pytest

from solaris_feast.precompute import similarity
from solaris_feast.precompute.aggregate import PairEmbeddings
from solaris_feast.precompute.compute import CollectingSink
from solaris_feast.precompute.similarity import (
    SimilarityConfig,
    UserIndex,
    build_user_index,
    fill_and_write,
    fill_target_count,
    similarity_fill,
    similarity_fill_parts,
)

NOW = pd.Timestamp("2026-06-01T12:00:00Z")
NOW_S = NOW.value / 1e9
TTL = 6 * 3600
USERS = 120
ITEMS = 15
DIM = 6
# faiss computes squared L2 as |x|^2 + |y|^2 - 2xy in float32; after the square root and the
# 1/d weights, 1e-4 bounds the difference from the float64 reference on this data.
TOL = 1e-4

Expected = dict[tuple[int, int], tuple[np.ndarray, int, float]]
"""Reference fill per (user, item): vector, neighbour count, mean distance."""


def _world(seed: int) -> tuple[np.ndarray, np.ndarray, PairEmbeddings, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    user_ids = rng.permutation(np.arange(1000, 1000 + USERS)).astype(np.int64)
    user_vecs = rng.normal(size=(USERS, 4)).astype(np.float32)
    rows = 700
    exact = PairEmbeddings(
        user_ids=rng.choice(user_ids, rows),
        item_ids=rng.integers(0, ITEMS, rows).astype(np.int64),
        vectors=rng.normal(size=(rows, DIM)).astype(np.float32),
        # A third are stale (older than the TTL); some are in the future.
        computed_at_s=NOW_S - rng.uniform(-600, 1.5 * TTL, rows),
        model_versions=rng.choice(np.array(["v1", "v0"], dtype=object), rows, p=[0.85, 0.15]),
    )
    targets = pd.DataFrame(
        {
            "user_id": rng.choice(user_ids, 300),
            "item_id": rng.integers(0, ITEMS, 300).astype(np.int64),
        }
    )
    return user_ids, user_vecs, exact, targets


def _brute_force(
    user_ids: np.ndarray,
    user_vecs: np.ndarray,
    exact: PairEmbeddings,
    targets: pd.DataFrame,
    k: int,
    mode: str,
    eps: float,
) -> Expected:
    vec_of = {int(u): user_vecs[r].astype(np.float64) for r, u in enumerate(user_ids)}
    newest: dict[tuple[int, int], tuple[float, np.ndarray]] = {}
    for r in range(len(exact)):
        t = exact.computed_at_s[r]
        if exact.model_versions[r] != "v1" or not NOW_S - TTL < t <= NOW_S:
            continue
        key = (int(exact.user_ids[r]), int(exact.item_ids[r]))
        if key not in newest or t > newest[key][0]:
            newest[key] = (t, exact.vectors[r].astype(np.float64))
    out = {}
    for u, i in set(zip(targets["user_id"].tolist(), targets["item_id"].tolist(), strict=True)):
        if (u, i) in newest:
            continue  # served exactly: no fill
        holders = [v for (v, item) in newest if item == i and v != u]
        if not holders:
            continue
        dist = sorted((float(np.linalg.norm(vec_of[u] - vec_of[v])), v) for v in holders)
        chosen = dist[:1] if mode == "nearest" else dist[:k]
        w = np.array([1.0 if mode == "nearest" else 1.0 / (d + eps) for d, _ in chosen])
        vecs = np.stack([newest[(v, i)][1] for _, v in chosen])
        mean_d = float(np.mean([d for d, _ in chosen]))
        out[(u, i)] = ((w[:, None] * vecs).sum(0) / w.sum(), len(chosen), mean_d)
    return out


def _check_against_reference(rows: pd.DataFrame, expected: Expected) -> None:
    got = {
        (int(u), int(i)): r
        for u, i, r in zip(
            rows["user_id"], rows["item_id"], rows.itertuples(index=False), strict=True
        )
    }
    assert set(got) == set(expected)
    for key, (vec, count, mean_d) in expected.items():
        row = got[key]
        np.testing.assert_allclose(row.embedding, vec, rtol=TOL, atol=TOL)
        assert row.neighbour_count == count
        assert row.mean_distance == pytest.approx(mean_d, rel=TOL, abs=TOL)


@pytest.mark.parametrize("lookup", ["dense", "hash"])
@pytest.mark.parametrize(("mode", "k"), [("weighted", 3), ("weighted", 1), ("nearest", 5)])
def test_exact_index_fill_equals_brute_force_reference(
    mode: Literal["weighted", "nearest"], k: int, lookup: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both ways of finding a neighbour's z (a dense users x items table for small rounds, a
    hash of pair keys for big ones) give the reference's rows."""
    if lookup == "hash":
        monkeypatch.setattr(similarity, "DENSE_LOOKUP_CELLS", 0)
    user_ids, user_vecs, exact, targets = _world(0)
    cfg = SimilarityConfig(
        neighbours=k,
        search_neighbours=USERS,
        mode=mode,
        index_kind="flat",
    )
    index = build_user_index(user_ids, user_vecs, cfg)
    rows = similarity_fill(index, targets, exact, NOW, "v1", TTL, cfg)
    expected = _brute_force(user_ids, user_vecs, exact, targets, k, mode, cfg.distance_epsilon)
    assert len(expected) > 100  # the data exercises the fill, not just the empty case
    _check_against_reference(rows, expected)
    assert (rows["model_version"] == "v1").all()
    assert (rows["computed_at"] == NOW).all()


def test_ivf_probing_every_cell_equals_the_reference() -> None:
    user_ids, user_vecs, exact, targets = _world(1)
    cfg = SimilarityConfig(
        neighbours=4,
        search_neighbours=USERS,
        index_kind="auto",
        approximate_kind="ivf",
        exact_index_max_users=50,
        ivf_lists=8,
        ivf_probe=8,
    )
    index = build_user_index(user_ids, user_vecs, cfg)
    assert index.kind == "ivf"  # 120 users > 50: auto goes approximate
    rows = similarity_fill(index, targets, exact, NOW, "v1", TTL, cfg)
    _check_against_reference(
        rows, _brute_force(user_ids, user_vecs, exact, targets, 4, "weighted", 1e-3)
    )


def test_hnsw_fill_matches_the_reference_on_a_small_table() -> None:
    user_ids, user_vecs, exact, targets = _world(2)
    cfg = SimilarityConfig(
        neighbours=4, search_neighbours=USERS, index_kind="hnsw", hnsw_ef_search=400
    )
    index = build_user_index(user_ids, user_vecs, cfg)
    assert index.kind == "hnsw"
    rows = similarity_fill(index, targets, exact, NOW, "v1", TTL, cfg)
    expected = _brute_force(user_ids, user_vecs, exact, targets, 4, "weighted", 1e-3)
    # HNSW is approximate; at this size with a wide beam it should find (nearly) every neighbour.
    got = {
        (int(u), int(i)): v
        for u, i, v in zip(rows["user_id"], rows["item_id"], rows["embedding"], strict=True)
    }
    agree = sum(np.allclose(got[k], v[0], atol=TOL) for k, v in expected.items() if k in got)
    assert agree >= 0.95 * len(expected)


def test_few_search_neighbours_only_use_holders_among_them() -> None:
    user_ids, user_vecs, exact, targets = _world(3)
    cfg = SimilarityConfig(neighbours=3, search_neighbours=10, index_kind="flat")
    index = build_user_index(user_ids, user_vecs, cfg)
    rows = similarity_fill(index, targets, exact, NOW, "v1", TTL, cfg)
    full = similarity_fill(
        index, targets, exact, NOW, "v1", TTL, cfg.model_copy(update={"search_neighbours": USERS})
    )
    assert 0 < len(rows) < len(full)
    # Within the 10 nearest, distances can only be smaller than or equal to the full search's.
    merged = rows.merge(full, on=["user_id", "item_id"], suffixes=("", "_full"))
    assert (merged["mean_distance"] <= merged["mean_distance_full"] + TOL).all()


def test_stale_or_other_version_embeddings_are_never_used() -> None:
    user_ids = np.array([1, 2, 3], dtype=np.int64)
    user_vecs = np.array([[0.0], [1.0], [2.0]], dtype=np.float32)
    exact = PairEmbeddings(
        user_ids=np.array([2, 3, 3], dtype=np.int64),
        item_ids=np.array([9, 9, 8], dtype=np.int64),
        vectors=np.array([[5.0, 5.0], [7.0, 7.0], [1.0, 1.0]], dtype=np.float32),
        computed_at_s=np.array([NOW_S - TTL - 1, NOW_S - 10, NOW_S - 10]),  # user 2's is stale
        model_versions=np.array(["v1", "v1", "v0"], dtype=object),
    )
    targets = pd.DataFrame({"user_id": [1, 1], "item_id": [9, 8]})
    cfg = SimilarityConfig(neighbours=2, index_kind="flat")
    rows = similarity_fill(
        build_user_index(user_ids, user_vecs, cfg), targets, exact, NOW, "v1", TTL, cfg
    )
    assert rows[["user_id", "item_id"]].values.tolist() == [[1, 9]]
    np.testing.assert_allclose(rows["embedding"].iloc[0], [7.0, 7.0])
    assert rows["neighbour_count"].iloc[0] == 1
    assert rows["mean_distance"].iloc[0] == pytest.approx(2.0, abs=TOL)


def test_target_served_exactly_or_unindexed_gets_no_row() -> None:
    user_ids = np.array([1, 2], dtype=np.int64)
    user_vecs = np.array([[0.0], [1.0]], dtype=np.float32)
    exact = PairEmbeddings(
        user_ids=np.array([1, 2], dtype=np.int64),
        item_ids=np.array([4, 4], dtype=np.int64),
        vectors=np.ones((2, 3), dtype=np.float32),
        computed_at_s=np.array([NOW_S - 5, NOW_S - 5]),
        model_versions=np.array(["v1", "v1"], dtype=object),
    )
    targets = pd.DataFrame({"user_id": [1, 77], "item_id": [4, 4]})
    cfg = SimilarityConfig(index_kind="flat")
    rows = similarity_fill(
        build_user_index(user_ids, user_vecs, cfg), targets, exact, NOW, "v1", TTL, cfg
    )
    assert rows.empty


def test_search_leaves_the_query_user_out() -> None:
    rng = np.random.default_rng(5)
    ids = np.arange(50, dtype=np.int64)
    index = build_user_index(ids, rng.normal(size=(50, 3)), SimilarityConfig(index_kind="flat"))
    neighbours, distances = index.search(ids[:10], 5)
    assert neighbours.shape == (10, 5)
    assert not (neighbours == ids[:10, None]).any()
    assert (np.diff(distances, axis=1) >= 0).all()


def test_duplicate_users_in_the_index_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicates"):
        build_user_index(np.array([1, 1]), np.zeros((2, 2)))


def test_thread_setting_applies_to_the_index_only_and_restores_the_process_count() -> None:
    import faiss

    before = faiss.omp_get_max_threads()
    wanted = 1 if before != 1 else 2
    rng = np.random.default_rng(11)
    index = build_user_index(
        np.arange(50),
        rng.standard_normal((50, 8)).astype(np.float32),
        SimilarityConfig(threads=wanted),
    )
    assert faiss.omp_get_max_threads() == before
    neighbours, _ = index.search(np.arange(5), 3)
    assert neighbours.shape == (5, 3)
    assert faiss.omp_get_max_threads() == before
    assert index.threads == wanted


def _parts_of(
    index: UserIndex,
    exact: PairEmbeddings,
    targets: pd.DataFrame,
    parts: int,
    cfg: SimilarityConfig | None = None,
) -> Iterable[pd.DataFrame]:
    """The fill in parts, as the fill task asks for it."""
    return similarity_fill_parts(index, targets, exact, NOW, "v1", TTL, cfg, parts=parts)


@pytest.mark.parametrize("parts", [1, 3, 4, 500])
@pytest.mark.parametrize("string_ids", [False, True])
def test_a_fill_written_in_parts_writes_the_rows_of_one_fill(parts: int, string_ids: bool) -> None:
    user_ids, user_vecs, exact, targets = _world(3)
    if string_ids:
        as_str = np.vectorize(lambda v: f"u{v}", otypes=[object])
        user_ids, targets = as_str(user_ids), targets.assign(user_id=as_str(targets["user_id"]))
        exact = dataclasses.replace(exact, user_ids=as_str(exact.user_ids))
    cfg = SimilarityConfig(neighbours=3, search_neighbours=40, index_kind="flat")
    index = build_user_index(user_ids, user_vecs, cfg)
    whole = similarity_fill(index, targets, exact, NOW, "v1", TTL, cfg)
    sink = CollectingSink()

    written = fill_and_write(_parts_of(index, exact, targets, parts, cfg), sink)

    assert len(whole) > 100
    assert written.filled == len(whole)
    assert len(sink.frames) == min(parts, len(whole["user_id"].unique()))
    assert all(len(frame) for frame in sink.frames)
    pd.testing.assert_frame_equal(sink.rows(), whole)  # same rows, values and order
    with pytest.raises(ValueError, match="parts must be positive"):
        _parts_of(index, exact, targets, 0, cfg)


def test_a_failed_part_stops_the_fill_and_no_later_part_is_written() -> None:
    user_ids, user_vecs, exact, targets = _world(4)
    index = build_user_index(user_ids, user_vecs, SimilarityConfig(index_kind="flat"))
    stored: list[pd.DataFrame] = []

    class FailsOnSecond:
        def write(self, frame: pd.DataFrame) -> int:
            if len(stored) == 1:
                raise ConnectionError("the store went away")
            stored.append(frame)
            return len(frame)

    with pytest.raises(ConnectionError, match="went away"):
        fill_and_write(_parts_of(index, exact, targets, 4), FailsOnSecond())
    assert len(stored) == 1


def test_the_fill_encodes_a_part_on_its_own_thread_while_the_one_before_is_sent() -> None:
    user_ids, user_vecs, exact, targets = _world(4)
    index = build_user_index(user_ids, user_vecs, SimilarityConfig(index_kind="flat"))
    calls: list[tuple[str, int, bool]] = []  # (half, part, on the fill's own thread)
    caller = threading.get_ident()

    class StagedStore:
        """The two halves of EmbeddingWriter.write; the second send fails."""

        def write(self, frame: pd.DataFrame) -> int:
            raise AssertionError("the fill sends staged parts, not whole writes")

        def write_offline(self, frame: pd.DataFrame) -> int:
            part = sum(half == "offline" for half, _, _ in calls)
            calls.append(("offline", part, threading.get_ident() == caller))
            return part

        def write_online(self, part: int) -> int:
            calls.append(("online", part, threading.get_ident() == caller))
            if part == 1:
                raise ConnectionError("the store went away")
            return part

    with pytest.raises(ConnectionError, match="went away"):
        fill_and_write(_parts_of(index, exact, targets, 4), StagedStore())

    # Every part is checked, logged and encoded on the fill's thread and sent from the writer's,
    # in order; after the failed send, the part staged meanwhile is not sent and none later is
    # staged.
    assert [(half, part) for half, part, _ in calls if half == "online"] == [
        ("online", 0),
        ("online", 1),
    ]
    assert [part for half, part, _ in calls if half == "offline"] == [0, 1, 2]
    assert all(on_caller == (half == "offline") for half, _, on_caller in calls)


@pytest.mark.parametrize(
    ("planned", "per_budget", "cap", "expected"),
    [
        (1000, 1.0, None, 1000),  # the default: as many targets as the round planned
        (1000, 2.5, None, 2500),
        (1000, 2.5, 1200, 1200),  # a cap bounds a large round
        (3, 0.5, None, 2),  # rounded, not truncated (1.5 -> 2)
        (1000, 0.0, 500, 0),  # 0: the queued misses only
        (0, 3.0, None, 0),  # a round that planned nothing fills no over-budget pair
    ],
)
def test_fill_targets_are_a_multiple_of_the_planned_pairs_under_a_cap(
    planned: int, per_budget: float, cap: int | None, expected: int
) -> None:
    assert fill_target_count(planned, per_budget, cap) == expected


@pytest.mark.parametrize(
    ("planned", "per_budget", "cap"), [(-1, 1.0, None), (10, -0.5, None), (10, 1.0, -1)]
)
def test_negative_fill_target_settings_are_refused(
    planned: int, per_budget: float, cap: int | None
) -> None:
    with pytest.raises(ValueError, match="fill targets"):
        fill_target_count(planned, per_budget, cap)
