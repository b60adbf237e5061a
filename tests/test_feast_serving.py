"""Online reads with layered fallback, against a real Redis and a real SQLite online store."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pytest
from conftest import start_throwaway_redis
from ports import FEAST_SERVING_REDIS_PORT

from solaris_feast.errors import RetryableStoreError
from solaris_feast.serving.miss_queue import MissQueue
from solaris_feast.serving.retriever import SolarisRetriever
from solaris_feast.store.config import open_store
from solaris_feast.store.definitions import MODEL_VERSION_REQUEST_FIELD, solaris_definitions
from solaris_feast.store.write import EmbeddingWriter
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from feast import FeatureStore

DIM = 32
VERSION = "cmp-test-v1"
THROWAWAY_REDIS_PORT = FEAST_SERVING_REDIS_PORT
rng = np.random.default_rng(42)


def vectors(n: int) -> np.ndarray:
    return rng.standard_normal((n, DIM)).astype(np.float32)


def ago(hours: float) -> pd.Timestamp:
    return pd.Timestamp.now(tz="UTC") - pd.Timedelta(hours=hours)


def write_pairs(
    store: FeatureStore,
    users: list[int],
    items: list[int],
    vecs: np.ndarray,
    version: str = VERSION,
    hours_ago: float = 0.0,
) -> None:
    EmbeddingWriter(store, "solaris_pair", offline=False).write(
        pd.DataFrame(
            {
                "user_id": np.asarray(users, dtype=np.int64),
                "item_id": np.asarray(items, dtype=np.int64),
                "embedding": list(vecs),
                "model_version": version,
                "computed_at": ago(hours_ago),
            }
        )
    )


def write_similar(
    store: FeatureStore,
    users: list[int],
    items: list[int],
    vecs: np.ndarray,
    version: str = VERSION,
    hours_ago: float = 0.0,
) -> None:
    n = len(items)
    EmbeddingWriter(store, "solaris_similar", offline=False).write(
        pd.DataFrame(
            {
                "user_id": np.asarray(users, dtype=np.int64),
                "item_id": np.asarray(items, dtype=np.int64),
                "embedding": list(vecs),
                "neighbour_count": np.full(n, 4, dtype=np.int64),
                "mean_distance": np.full(n, 0.25),
                "model_version": version,
                "computed_at": ago(hours_ago),
            }
        )
    )


def write_user(
    store: FeatureStore, user: int, vec: np.ndarray, version: str = VERSION, hours_ago: float = 0.0
) -> None:
    EmbeddingWriter(store, "solaris_user", offline=False).write(
        pd.DataFrame(
            {
                "user_id": [user],
                "embedding": [vec],
                "pair_count": [12],
                "model_version": version,
                "computed_at": ago(hours_ago),
            }
        )
    )


@pytest.fixture(params=["redis", "sqlite"])
def store(
    request: pytest.FixtureRequest, feast_project: str, tmp_path: Path, redis_url: str
) -> FeatureStore:
    feast_store = open_store(feast_project, tmp_path, online=request.param, redis_url=redis_url)
    feast_store.apply(solaris_definitions().all())
    return feast_store


def test_priority_exact_over_similar_over_user_over_zero(store: FeatureStore) -> None:
    pair, similar, user = vectors(2), vectors(2), vectors(1)[0]
    write_pairs(store, [1, 1], [10, 11], pair)
    write_similar(store, [1, 1], [10, 12], similar)  # item 10 has both: exact must win
    write_user(store, 1, user)
    retriever = SolarisRetriever(store, VERSION, record_misses=False)

    result = retriever.fetch(1, [10, 11, 12, 13])

    assert not result.error
    assert result.tiers.tolist() == [Tier.EXACT, Tier.EXACT, Tier.SIMILAR, Tier.USER_AGG]
    assert result.tiers.dtype == np.int8 and result.embeddings.dtype == np.float32
    np.testing.assert_array_equal(result.embeddings[0], pair[0])
    np.testing.assert_array_equal(result.embeddings[1], pair[1])
    np.testing.assert_array_equal(result.embeddings[2], similar[1])
    np.testing.assert_array_equal(result.embeddings[3], user)
    assert np.all((result.age_seconds >= 0) & (result.age_seconds < 60))

    unknown = retriever.fetch(999, [10, 11])
    assert unknown.tiers.tolist() == [Tier.ZERO, Tier.ZERO]
    assert not unknown.error
    assert np.all(unknown.embeddings == 0) and np.all(np.isnan(unknown.age_seconds))


def test_fetch_many_answers_each_user_as_a_fetch_of_its_own_would(store: FeatureStore) -> None:
    """Several users in one call (one round trip on Redis): the same tiers, vectors and
    counters as one fetch per user, each user's aggregate kept to its own candidates; a bad
    request refuses the batch before any read."""
    pair, similar = vectors(2), vectors(1)
    user_1, user_2 = vectors(2)
    write_pairs(store, [1, 2], [10, 20], pair)
    write_similar(store, [2], [21], similar)
    write_user(store, 1, user_1)
    write_user(store, 2, user_2, hours_ago=30.0)  # older than the aggregate's TTL
    requests = [(1, [10, 11]), (2, [20, 21, 22]), (999, [10]), (1, [12])]
    batched = SolarisRetriever(store, VERSION, record_misses=False)
    single = SolarisRetriever(store, VERSION, record_misses=False)

    together = batched.fetch_many(requests)
    apart = [single.fetch(user, items) for user, items in requests]

    assert [r.tiers.tolist() for r in together] == [
        [Tier.EXACT, Tier.USER_AGG],
        [Tier.EXACT, Tier.SIMILAR, Tier.ZERO],
        [Tier.ZERO],
        [Tier.USER_AGG],
    ]
    for a, b in zip(together, apart, strict=True):
        assert a.tiers.tolist() == b.tiers.tolist() and not a.error
        np.testing.assert_array_equal(a.embeddings, b.embeddings)
    np.testing.assert_array_equal(together[0].embeddings[1], user_1)
    np.testing.assert_array_equal(together[3].embeddings[0], user_1)
    assert batched.stats.tier_counts == single.stats.tier_counts
    assert batched.stats.rejected == single.stats.rejected
    assert (batched.stats.fetches, batched.stats.items) == (4, 7)
    with pytest.raises(ValueError, match="duplicates"):
        batched.fetch_many([(1, [10]), (2, [20, 20])])
    assert batched.stats.fetches == 4  # refused before any read
    assert batched.fetch_many([]) == []
    batched.close()
    single.close()


def test_expired_values_fall_through_to_the_next_tier(store: FeatureStore) -> None:
    # TTLs: pair 6 h, similar 6 h, user 24 h. Feast itself would serve every one of these.
    write_pairs(store, [2, 2, 2], [20, 21, 22], vectors(3), hours_ago=7)
    fresh_similar = vectors(1)
    write_similar(store, [2], [20], fresh_similar)
    write_similar(store, [2], [21], vectors(1), hours_ago=6.5)
    user = vectors(1)[0]
    write_user(store, 2, user, hours_ago=23)
    write_pairs(store, [3], [30], vectors(1), hours_ago=8)
    write_user(store, 3, vectors(1)[0], hours_ago=25)
    retriever = SolarisRetriever(store, VERSION, record_misses=False)

    result = retriever.fetch(2, [20, 21, 22])
    assert result.tiers.tolist() == [Tier.SIMILAR, Tier.USER_AGG, Tier.USER_AGG]
    np.testing.assert_array_equal(result.embeddings[0], fresh_similar[0])
    np.testing.assert_array_equal(result.embeddings[1], user)
    assert 23 * 3600 - 60 < result.age_seconds[1] < 23 * 3600 + 60

    everything_expired = retriever.fetch(3, [30])
    assert everything_expired.tiers.tolist() == [Tier.ZERO]
    assert np.all(everything_expired.embeddings == 0)


def test_other_model_version_is_a_miss(store: FeatureStore) -> None:
    write_pairs(store, [4, 4], [40, 41], vectors(2), version="cmp-old")
    current = vectors(1)
    write_similar(store, [4], [40], current)
    write_user(store, 4, vectors(1)[0], version="cmp-old")
    retriever = SolarisRetriever(store, VERSION, record_misses=False)

    result = retriever.fetch(4, [40, 41])

    assert result.tiers.tolist() == [Tier.SIMILAR, Tier.ZERO]
    np.testing.assert_array_equal(result.embeddings[0], current[0])
    assert np.all(result.embeddings[1] == 0)


def test_exact_misses_are_queued_once_per_round(store: FeatureStore) -> None:
    write_pairs(store, [5], [50], vectors(1))
    write_user(store, 5, vectors(1)[0])
    retriever = SolarisRetriever(store, VERSION)
    queue = retriever.miss_queue
    assert queue is not None

    for _ in range(3):
        result = retriever.fetch(5, [50, 51, 52])
        assert result.tiers.tolist() == [Tier.EXACT, Tier.USER_AGG, Tier.USER_AGG]
    assert queue.pending() == 2
    assert retriever.stats.misses_recorded == 2

    planner_queue = MissQueue.for_store(store)  # the precompute side, another process
    drained = planner_queue.drain()
    assert sorted(zip(drained.user_id, drained.item_id, strict=True)) == [(5, 51), (5, 52)]
    assert set(drained.model_version) == {VERSION}
    assert drained["missed_at"].dt.tz is not None
    assert queue.pending() == 0

    retriever.fetch(5, [51, 53])  # a new round: 51 is queued again, with the new miss 53
    retriever.fetch(5, [51, 53])
    assert sorted(planner_queue.drain()["item_id"].tolist()) == [51, 53]
    assert planner_queue.drain().empty


def test_fetch_matches_the_feast_native_resolved_view(store: FeatureStore) -> None:
    users = [6] * 6
    write_pairs(store, users[:2], [60, 61], vectors(2))
    write_pairs(store, [6], [62], vectors(1), hours_ago=7)  # expired
    write_pairs(store, [6], [63], vectors(1), version="cmp-old")  # other space
    write_similar(store, [6, 6, 6], [61, 62, 64], vectors(3))
    write_user(store, 6, vectors(1)[0])
    items = [60, 61, 62, 63, 64, 65]
    retriever = SolarisRetriever(store, VERSION, record_misses=False)

    ours = retriever.fetch(6, items)
    feast_answer = store.get_online_features(
        features=["solaris_resolved:resolved_embedding", "solaris_resolved:resolved_tier"],
        entity_rows=[
            {"user_id": 6, "item_id": item, MODEL_VERSION_REQUEST_FIELD: VERSION} for item in items
        ],
        full_feature_names=True,
    ).to_dict()

    feast_tiers = feast_answer["solaris_resolved__resolved_tier"]
    feast_vectors = np.asarray(feast_answer["solaris_resolved__resolved_embedding"], np.float32)
    assert ours.tiers.tolist() == [3, 3, 2, 1, 2, 1]
    assert feast_tiers == ours.tiers.tolist()
    np.testing.assert_array_equal(feast_vectors, ours.embeddings)
    # Unknown user: both answer ZERO.
    nobody = store.get_online_features(
        features=["solaris_resolved:resolved_tier"],
        entity_rows=[{"user_id": 4242, "item_id": 1, MODEL_VERSION_REQUEST_FIELD: VERSION}],
        full_feature_names=True,
    ).to_dict()
    assert nobody["solaris_resolved__resolved_tier"] == [0]
    assert retriever.fetch(4242, [1]).tiers.tolist() == [0]


def test_feast_written_values_are_read_by_the_retriever(store: FeatureStore) -> None:
    vec = vectors(2)
    now = pd.Timestamp.now(tz="UTC").floor("s")
    store.write_to_online_store(
        "solaris_pair",
        pd.DataFrame(
            {
                "user_id": [8, 8],
                "item_id": [80, 81],
                "embedding": [v.tolist() for v in vec],
                "model_version": [VERSION, "cmp-old"],
                "computed_at": [now, now],
                "event_timestamp": [now, now],
                "written_at": [now, now],
            }
        ),
    )
    result = SolarisRetriever(store, VERSION, record_misses=False).fetch(8, [80, 81])
    assert result.tiers.tolist() == [Tier.EXACT, Tier.ZERO]
    np.testing.assert_array_equal(result.embeddings[0], vec[0])


@pytest.mark.parametrize(
    ("user_id", "item_ids", "error"),
    [
        (1, [], ValueError),
        (1, [3, 4, 3], ValueError),
        (-1, [3], ValueError),
        (1, [3, -4], ValueError),
        ("1", [3], TypeError),
        (True, [3], TypeError),
        (1, [1.5, 2.0], TypeError),
        (1, "12", TypeError),
        (1, [[1, 2]], ValueError),
    ],
)
def test_fetch_refuses_malformed_requests(
    store: FeatureStore,
    user_id: object,
    item_ids: object,
    error: type[Exception],
) -> None:
    retriever = SolarisRetriever(store, VERSION, record_misses=False)
    with pytest.raises(error):
        retriever.fetch(user_id, item_ids)  # type: ignore[arg-type]


@pytest.fixture
def throwaway_redis(tmp_path: Path) -> Iterator[str]:
    proc = start_throwaway_redis(THROWAWAY_REDIS_PORT, str(tmp_path))
    try:
        yield f"redis://127.0.0.1:{THROWAWAY_REDIS_PORT}/0"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_stopped_or_slow_redis_answers_zero_with_error_flag(
    throwaway_redis: str, feast_project: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import redis

    store = open_store(feast_project, tmp_path / "repo", online="redis", redis_url=throwaway_redis)
    store.apply(solaris_definitions().all())
    write_pairs(store, [9], [90], vectors(1))
    retriever = SolarisRetriever(store, VERSION, deadline_ms=50)
    strict = SolarisRetriever(store, VERSION, deadline_ms=50, strict=True)
    assert retriever.fetch(9, [90]).tiers.tolist() == [Tier.EXACT]

    # Slower than the deadline: the server holds every client for 2 s. A fetch that waited for
    # it would take 2 s; the bound leaves a loaded machine's pauses room above the 50 ms.
    redis.Redis.from_url(throwaway_redis).execute_command("CLIENT", "PAUSE", 2000, "ALL")
    started = time.perf_counter()
    slow = retriever.fetch(9, [90, 91])
    assert time.perf_counter() - started < 1.0
    assert slow.error and slow.tiers.tolist() == [Tier.ZERO, Tier.ZERO]
    assert np.all(slow.embeddings == 0) and slow.embeddings.shape == (2, DIM)
    time.sleep(2.1)
    assert retriever.fetch(9, [90]).tiers.tolist() == [Tier.EXACT]

    # Stopped: no exception reaches the VM, the answer comes within the deadline.
    server = redis.Redis.from_url(throwaway_redis)
    with contextlib.suppress(redis.ConnectionError):
        server.shutdown(nosave=True)
    started = time.perf_counter()
    down = retriever.fetch(9, [90, 91, 92])
    assert time.perf_counter() - started < 0.2
    assert down.error and down.tiers.tolist() == [0, 0, 0]
    assert retriever.stats.errors == 2
    # A serving loop during the outage: every fetch counted, one log line per interval.
    with caplog.at_level("WARNING", logger="solaris_feast.serving.retriever"):
        for _ in range(30):
            assert retriever.fetch(9, [90]).error
    assert retriever.stats.errors == 32
    lines = [r.getMessage() for r in caplog.records if "serving ZERO" in r.getMessage()]
    assert len(lines) <= 2, lines  # one per error kind (refused, reset) and interval
    with pytest.raises(RetryableStoreError):
        strict.fetch(9, [90])


def test_read_slower_than_the_deadline_answers_zero_or_raises_in_strict_mode(
    store: FeatureStore,
) -> None:
    write_pairs(store, [10], [100], vectors(1))
    # A deadline no real read can meet: the answer must still come, as ZERO with the flag.
    hurried = SolarisRetriever(store, VERSION, deadline_ms=0.001, record_misses=False)
    result = hurried.fetch(10, [100, 101])
    assert result.error and result.tiers.tolist() == [Tier.ZERO, Tier.ZERO]
    assert hurried.stats.errors == 1
    assert hurried.stats.tier_counts[Tier.ZERO] == 2
    with pytest.raises(RetryableStoreError):
        SolarisRetriever(store, VERSION, deadline_ms=0.001, strict=True).fetch(10, [100])
    relaxed = SolarisRetriever(store, VERSION, record_misses=False)
    assert relaxed.fetch(10, [100]).tiers.tolist() == [Tier.EXACT]
