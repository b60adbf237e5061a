from __future__ import annotations

from pathlib import Path

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


def test_vectors_of_different_lengths_in_a_frame_are_refused_by_name() -> None:
    frame = pd.DataFrame(
        {
            "user_id": [1, 2],
            "item_id": [1, 1],
            "embedding": [np.zeros(4), np.zeros(3)],
            "model_version": "v1",
            "computed_at": NOW,
        }
    )
    with pytest.raises(SchemaError, match="one length") as err:
        PairEmbeddings.from_frame(frame)
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


# -- the precompute's user-view task on a real Feast repo ------------------------------------


def _round(repo: Path, now: pd.Timestamp, margin_seconds: int = 1800) -> dict[str, object]:
    """``aggregate_users`` of a round at ``now``, as the precompute DAG's task calls it."""
    from solaris_feast.pipeline.precompute import aggregate_users
    from solaris_feast.pipeline.settings import PrecomputeRun, PrecomputeSettings

    settings = PrecomputeSettings(
        feature_repo=str(repo), models_dir=str(repo / "models"),
        refresh_margin_seconds=margin_seconds,
    )  # fmt: skip
    spec = PrecomputeRun(
        settings=settings,
        now=now.to_pydatetime(),
        interval_key=f"k{now.value}",
        run_dir=str(repo / "run"),
        vm_version="vm-agg",
        fm_version="fm-agg",
        embedding_version="v1",
    )
    return aggregate_users(spec.model_dump(mode="json"))


def _write_pairs(repo: Path, users: list[int], item: int, at: pd.Timestamp) -> None:
    from solaris_feast.store.config import open_repo_store
    from solaris_feast.store.write import EmbeddingWriter

    rng = np.random.default_rng(item)
    writer = EmbeddingWriter(open_repo_store(repo), "solaris_pair")
    try:
        writer.write(
            pd.DataFrame(
                {
                    "user_id": np.array(users, dtype=np.int64),
                    "item_id": np.full(len(users), item, dtype=np.int64),
                    "embedding": list(rng.normal(size=(len(users), 32)).astype(np.float32)),
                    "model_version": "v1",
                    "computed_at": at,
                }
            )
        )
    finally:
        writer.close()


def test_a_round_with_nothing_new_appends_no_user_row_and_a_changed_user_gets_one(
    tmp_path: Path, feast_project: str
) -> None:
    """The user view used to get a row per user each round, changed or not."""
    from test_dags import make_feature_repo

    from solaris_feast.store.config import open_repo_store
    from solaris_feast.store.offline import offline_row_count, read_offline_rows

    repo = make_feature_repo(tmp_path / "repo", feast_project)
    (repo / "run").mkdir()
    start = pd.Timestamp.now(tz="UTC").floor("h") - pd.Timedelta(hours=5)
    users = list(range(6))
    _write_pairs(repo, users, item=1, at=start)

    def user_rows() -> int:
        return offline_row_count(open_repo_store(repo), "solaris_user")

    first = _round(repo, start + pd.Timedelta(hours=1))
    assert (first["users"], first["written"], user_rows()) == (6, 6, 6)
    # The next round: the same pairs, the same aggregates: nothing is appended.
    second = _round(repo, start + pd.Timedelta(hours=2))
    assert (second["written"], second["unchanged"], user_rows()) == (0, 6, 6)
    # User 2 gets a new pair: only its aggregate is written.
    _write_pairs(repo, [2], item=7, at=start + pd.Timedelta(hours=2, minutes=30))
    third_at = start + pd.Timedelta(hours=3)
    third = _round(repo, third_at)
    assert (third["written"], user_rows()) == (1, 7)
    # A retry of that round rewrites its own row (its online write may have failed): the same
    # content, so the offline log gains nothing.
    assert _round(repo, third_at)["written"] == 1
    assert user_rows() == 7
    stored = read_offline_rows(
        open_repo_store(repo), "solaris_user", third_at - pd.Timedelta(hours=1), third_at
    )
    assert stored["user_id"].tolist() == [2]
    assert stored["pair_count"].tolist() == [2]
    # An aggregate that nears the user view's TTL (24 h) is refreshed though unchanged.
    late = _round(repo, start + pd.Timedelta(hours=4), margin_seconds=86_400 - 3600)
    assert (late["written"], user_rows()) == (6, 13)


def test_a_round_reads_a_pair_exactly_its_window_old_as_the_tier_rule_serves_it(
    tmp_path: Path, feast_project: str
) -> None:
    """The tier rule serves a value exactly TTL old (``age <= ttl``); the offline log is read
    ``(start, end]``, and the round's readers started at ``now - window``, so a pair written by
    the round one window earlier (every scheduled round writes on the hour) was left out."""
    from test_dags import make_feature_repo

    from solaris_feast.pipeline.settings import PrecomputeSettings
    from solaris_feast.store.config import open_repo_store
    from solaris_feast.store.offline import read_offline_rows

    repo = make_feature_repo(tmp_path / "repo", feast_project)
    (repo / "run").mkdir()
    now = pd.Timestamp.now(tz="UTC").floor("h")
    window = pd.Timedelta(
        seconds=PrecomputeSettings.model_fields["aggregate_window_seconds"].default
    )
    _write_pairs(repo, [0], item=1, at=now - window)  # exactly the window old
    _write_pairs(repo, [0], item=2, at=now - pd.Timedelta(hours=1))
    assert _round(repo, now)["written"] == 1
    stored = read_offline_rows(
        open_repo_store(repo), "solaris_user", now - pd.Timedelta(hours=1), now
    )
    assert stored["pair_count"].tolist() == [2]


def test_a_pair_written_twice_at_one_time_counts_with_its_later_write_everywhere(
    tmp_path: Path, feast_project: str
) -> None:
    """Two writes of a pair with the same ``computed_at`` (a round re-run with another FM): the
    online store keeps the later one, and so must the round's readers of the offline log,
    whose files are ordered by their content hash, not by when they were written."""
    from test_dags import make_feature_repo

    from solaris_feast.serving.retriever import SolarisRetriever
    from solaris_feast.store.config import open_repo_store
    from solaris_feast.store.offline import newest_per_key, read_offline_rows
    from solaris_feast.store.write import EmbeddingWriter
    from solaris_feast.tiers import Tier

    repo = make_feature_repo(tmp_path / "repo", feast_project)
    (repo / "run").mkdir()
    now = pd.Timestamp.now(tz="UTC").floor("h")
    at = now - pd.Timedelta(hours=1)
    for value in (1.0, 3.0, 2.0):  # three writes, the last one's vector is 2
        writer = EmbeddingWriter(open_repo_store(repo), "solaris_pair")
        try:
            writer.write(
                pd.DataFrame(
                    {
                        "user_id": np.array([0], dtype=np.int64),
                        "item_id": np.array([1], dtype=np.int64),
                        "embedding": [np.full(32, value, dtype=np.float32)],
                        "model_version": "v1",
                        "computed_at": at,
                    }
                )
            )
        finally:
            writer.close()
    served = SolarisRetriever(open_repo_store(repo), "v1", record_misses=False).fetch(0, [1])
    assert served.tiers.tolist() == [Tier.EXACT]
    np.testing.assert_allclose(served.embeddings[0], 2.0)
    logged = read_offline_rows(
        open_repo_store(repo), "solaris_pair", at - pd.Timedelta(1, "s"), now
    )
    assert len(logged) == 3
    np.testing.assert_allclose(newest_per_key(logged, ["user_id", "item_id"])["embedding"][0], 2.0)
    assert _round(repo, now)["written"] == 1
    user = read_offline_rows(open_repo_store(repo), "solaris_user", at, now)
    np.testing.assert_allclose(user["embedding"][0], 2.0)  # the aggregate of the later write
