"""The online store backends: one contract for Redis and SQLite, a deadline that bounds the read
itself, errors classified by type, and configurations that are refused.

Redis servers started here use a free port and are stopped in ``finally``; the shared Redis is
used with this test's own Feast project (its keys are deleted by the ``feast_project`` fixture).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd
import pytest
import redis
from conftest import free_port, start_throwaway_redis

from solaris_feast.errors import (
    ConfigError,
    DeadlineExceededError,
    RetryableStoreError,
    ViewsNotAppliedError,
    is_retryable,
)
from solaris_feast.serving.miss_queue import MissQueue
from solaris_feast.serving.retriever import SolarisRetriever
from solaris_feast.store.backends import (
    OnlineBatch,
    backend_for,
    online_kind,
)
from solaris_feast.store.backends.redis import RedisBackend, redis_client
from solaris_feast.store.config import (
    REDIS_CONNECTION_ENV,
    build_repo_config,
    open_repo_store,
    open_store,
    redis_connection_string,
)
from solaris_feast.store.definitions import solaris_definitions
from solaris_feast.store.layout import (
    ByteColumn,
    EntityKeyLayout,
    float_value_column,
    sqlite_table,
)
from solaris_feast.store.write import EmbeddingWriter
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from feast import FeatureStore

DIM = 32
VERSION = "cmp-backends-v1"
DEADLINE_MS = 50.0
# The target: an answer within 1.5x the deadline, plus scheduling slack on a shared box.
ANSWER_BOUND_MS = 1.5 * DEADLINE_MS + 20.0
MANY = 10_000


def pair_frame(user: int, items: np.ndarray, vectors: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "user_id": np.full(len(items), user, dtype=np.int64),
            "item_id": np.asarray(items, dtype=np.int64),
            "embedding": list(vectors),
            "model_version": VERSION,
            "computed_at": pd.Timestamp.now(tz="UTC"),
        }
    )


def store_with_online(project: str, repo: Path, online_store: dict[str, object]) -> FeatureStore:
    """A Feast store like ``build_repo_config``'s with another online store section."""
    from feast import FeatureStore, RepoConfig

    base = build_repo_config(project, repo, online="sqlite")
    config = RepoConfig(
        project=project,
        provider="local",
        registry=base.registry_config,
        online_store=online_store,
        offline_store={"type": "file"},
        entity_key_serialization_version=3,
        repo_path=base.repo_path,
    )
    return FeatureStore(config=config)


def applied_store(
    project: str, repo: Path, online: str, redis_url: str | None = None
) -> FeatureStore:
    store = open_store(project, repo, online=online, redis_url=redis_url)  # type: ignore[arg-type]
    store.apply(solaris_definitions().all())
    return store


@pytest.fixture
def debug_redis() -> Iterator[str]:
    """A throwaway redis-server that allows ``DEBUG SLEEP`` (a deliberately slowed store)."""
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="solaris-backends-")
    proc = start_throwaway_redis(port, workdir, "--enable-debug-command", "yes")
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _timed_fetch(retriever: SolarisRetriever, user: int, items: np.ndarray) -> tuple[object, float]:
    started = time.perf_counter()
    result = retriever.fetch(user, items)
    return result, (time.perf_counter() - started) * 1000.0


# -- the deadline bounds the read -----------------------------------------------------------------


def test_10k_candidates_on_a_sleeping_redis_answer_zero_within_1_5x_the_deadline(
    debug_redis: str, tmp_path: Path, feast_project: str
) -> None:
    store = applied_store(feast_project, tmp_path / "repo", "redis", debug_redis)
    vectors = np.ones((3, DIM), dtype=np.float32)
    EmbeddingWriter(store, "solaris_pair", offline=False).write(
        pair_frame(1, np.arange(3), vectors)
    )
    items = np.arange(MANY, dtype=np.int64)
    retriever = SolarisRetriever(
        store,
        VERSION,
        deadline_ms=DEADLINE_MS,
        record_misses=False,
    )
    strict = SolarisRetriever(
        store,
        VERSION,
        deadline_ms=DEADLINE_MS,
        record_misses=False,
        strict=True,
    )
    sleeper = redis.Redis.from_url(debug_redis)
    try:
        for _ in range(2):
            # The server answers nobody for 600 ms; the read must give up at the deadline.
            blocker = threading.Thread(
                target=sleeper.execute_command, args=("DEBUG", "SLEEP", "0.6"), daemon=True
            )
            blocker.start()
            time.sleep(0.05)
            result, elapsed_ms = _timed_fetch(retriever, 1, items)
            assert result.error  # type: ignore[attr-defined]
            assert (result.tiers == Tier.ZERO).all()  # type: ignore[attr-defined]
            assert not result.embeddings.any()  # type: ignore[attr-defined]
            assert elapsed_ms < ANSWER_BOUND_MS, elapsed_ms
            started = time.perf_counter()
            with pytest.raises(DeadlineExceededError):
                strict.fetch(1, items)
            assert (time.perf_counter() - started) * 1000.0 < ANSWER_BOUND_MS
            blocker.join(timeout=5)
        assert retriever.stats.deadline_exceeded == 2
        # The aborted reads dropped their connections: the next read is whole and correct.
        relaxed = SolarisRetriever(
            store,
            VERSION,
            deadline_ms=10_000,
            record_misses=False,
        )
        served = relaxed.fetch(1, items)
        assert not served.error
        assert served.tiers[:3].tolist() == [Tier.EXACT] * 3
        assert (served.tiers[3:] == Tier.ZERO).all()
        relaxed.close()
    finally:
        retriever.close()
        strict.close()
        sleeper.close()


def test_10k_candidates_on_a_locked_sqlite_answer_zero_within_1_5x_the_deadline(
    tmp_path: Path, feast_project: str
) -> None:
    store = applied_store(feast_project, tmp_path / "repo", "sqlite")
    EmbeddingWriter(store, "solaris_pair", offline=False).write(
        pair_frame(1, np.arange(3), np.ones((3, DIM), dtype=np.float32))
    )
    items = np.arange(MANY, dtype=np.int64)
    retriever = SolarisRetriever(
        store,
        VERSION,
        deadline_ms=DEADLINE_MS,
        record_misses=False,
    )
    strict = SolarisRetriever(
        store,
        VERSION,
        deadline_ms=DEADLINE_MS,
        record_misses=False,
        strict=True,
    )
    # A writer holds an exclusive lock: readers wait (busy) until it commits.
    writer = sqlite3.connect(tmp_path / "repo" / "data" / "online.db", isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")
    try:
        result, elapsed_ms = _timed_fetch(retriever, 1, items)
        assert result.error and (result.tiers == Tier.ZERO).all()  # type: ignore[attr-defined]
        assert elapsed_ms < ANSWER_BOUND_MS, elapsed_ms
        assert retriever.stats.deadline_exceeded == 1
        with pytest.raises(RetryableStoreError):
            strict.fetch(1, items)
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    served = retriever.fetch(1, np.arange(3))
    assert not served.error and served.tiers.tolist() == [Tier.EXACT] * 3
    retriever.close()
    strict.close()


def test_sqlite_repeated_misses_are_not_rewritten_and_wait_for_no_writer(
    tmp_path: Path, feast_project: str
) -> None:
    """A miss already queued is found by a read: while a writer holds the database's write
    lock, serving the same user again queues nothing and waits for no lock; a new miss still
    needs the lock, and is queued once the writer is gone; string ids too."""
    store = applied_store(feast_project, tmp_path / "repo", "sqlite")
    backend = backend_for(store, 0.2)

    def record(user: int | str, items: Sequence[int | str]) -> int:
        return backend.record_misses(
            user, items, VERSION, now=1, round_ttl_seconds=60, max_stream_length=100
        )

    try:
        assert record(4, [9, 10, 9]) == 2
        assert record("u-1", ["sku/1"]) == 1
        writer = sqlite3.connect(tmp_path / "repo" / "data" / "online.db", isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")  # the write lock, as a precompute batch holds it
        try:
            assert record(4, [10, 9]) == 0
            assert record("u-1", ["sku/1"]) == 0
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                record(4, [9, 11])  # 11 is new: it needs the lock
        finally:
            writer.execute("ROLLBACK")
            writer.close()
        assert record(4, [9, 11]) == 1
        assert backend.pending_misses() == 4
        drained = backend.drain_misses(10)
        assert sorted(str((m.user_id, m.item_id)) for m in drained) == sorted(
            str(pair) for pair in [(4, 9), (4, 10), (4, 11), ("u-1", "sku/1")]
        )
        assert record(4, [9]) == 1  # drained pairs can be queued again
    finally:
        backend.close()


def test_sqlite_queueing_a_miss_does_not_wait_out_the_timeout_for_a_writers_lock(
    tmp_path: Path, feast_project: str
) -> None:
    """Queueing runs on the request path: under a writer's lock a new miss fails at once, not
    after the backend's 30 s timeout; the timeout is restored after, so draining the queue
    (the precompute's side, off the request path) still waits for a lock that is released."""
    store = applied_store(feast_project, tmp_path / "repo", "sqlite")
    backend = backend_for(store, 30.0)
    db = tmp_path / "repo" / "data" / "online.db"

    def record(items: Sequence[int]) -> int:
        return backend.record_misses(
            4, items, VERSION, now=1, round_ttl_seconds=60, max_stream_length=100
        )

    try:
        assert record([1]) == 1
        # The timer below releases the lock from its own thread.
        writer = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        writer.execute("BEGIN IMMEDIATE")
        t0 = time.perf_counter()
        try:
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                record([2])
        finally:
            writer.execute("ROLLBACK")
        assert time.perf_counter() - t0 < 5.0  # not the 30 s timeout
        assert backend.pending_misses() == 1
        # A lock held for 0.3 s: the drain waits for it (the timeout is back).
        writer.execute("BEGIN IMMEDIATE")
        release = threading.Timer(0.3, lambda: writer.execute("ROLLBACK"))
        release.start()
        try:
            drained = backend.drain_misses(10)
        finally:
            release.join()
            writer.close()
        assert [(m.user_id, m.item_id) for m in drained] == [(4, 1)]
        assert record([2]) == 1 and backend.pending_misses() == 1
    finally:
        backend.close()


def test_a_locked_sqlite_queue_fails_each_requests_misses_counted_and_logged_once(
    tmp_path: Path, feast_project: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Under a writer's lock every request's queue write fails: each is counted, the requests
    are served, and the log gets one line with the count, not one per request."""
    store = applied_store(feast_project, tmp_path / "repo", "sqlite")
    retriever = SolarisRetriever(store, VERSION, deadline_ms=2_000, record_misses=True)
    retriever.fetch(1, np.arange(2))  # the queue table exists before the lock is taken
    writer = sqlite3.connect(tmp_path / "repo" / "data" / "online.db", isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    try:
        with caplog.at_level(logging.WARNING, logger="solaris_feast.serving.retriever"):
            served = [retriever.fetch(user, np.arange(5)) for user in (2, 3, 4)]
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert not any(result.error for result in served)
    assert retriever.stats.miss_queue_errors == 3
    lines = [r.getMessage() for r in caplog.records if "miss queue write failed" in r.getMessage()]
    assert len(lines) == 1 and "(1 failed writes since the last such line)" in lines[0]
    retriever.close()


def test_sqlite_consumer_groups_keep_taken_misses_until_acknowledged(
    tmp_path: Path, feast_project: str
) -> None:
    """As the Redis stream's group: a round's read marks its rows taken, not gone; its retry gets
    them back, another round only once they are idle; only the ack deletes them. A queue
    table from before the groups gets their columns, its rows untaken."""
    store = applied_store(feast_project, tmp_path / "repo", "sqlite")
    db = tmp_path / "repo" / "data" / "online.db"
    old = sqlite3.connect(db)
    old.execute(
        "CREATE TABLE solaris_miss_queue (project TEXT NOT NULL, user_id INTEGER NOT NULL, "
        "item_id INTEGER NOT NULL, model_version TEXT NOT NULL, missed_at INTEGER NOT NULL, "
        "PRIMARY KEY (project, user_id, item_id))"
    )
    old.executemany(
        "INSERT INTO solaris_miss_queue VALUES (?, 3, ?, ?, ?)",
        [(feast_project, item, VERSION, item) for item in range(2)],
    )
    old.commit()
    old.close()

    def queue() -> MissQueue:
        return MissQueue(feast_project, backend=backend_for(store, 5.0))

    def pairs_of(frame: pd.DataFrame) -> list[tuple[int, int]]:
        return list(zip(frame.user_id.tolist(), frame.item_id.tolist(), strict=True))

    serving = queue()
    assert serving.record(3, list(range(8)), VERSION) == 6  # 0 and 1 were queued before
    first_try = queue()
    taken = first_try.read_group("precompute", "round-10h", max_pairs=5, min_idle_ms=600_000)
    assert pairs_of(taken) == [(3, i) for i in range(5)]
    assert serving.record(3, list(range(8)), VERSION) == 0  # taken pairs are still queued
    retry = queue()
    again = retry.read_group("precompute", "round-10h", max_pairs=100, min_idle_ms=600_000)
    assert pairs_of(again)[:5] == pairs_of(taken) and len(again) == 8  # its 5, then the 3 left
    other = queue()
    assert other.read_group("precompute", "round-11h", max_pairs=100, min_idle_ms=600_000).empty
    assert not retry.retire("precompute", "round-10h")  # it holds rows
    # round-10h died: once its rows are idle long enough, another round claims them.
    claimed = other.read_group("precompute", "round-11h", max_pairs=3, min_idle_ms=0)
    assert len(claimed) == 3 and retry.pending() == 8
    assert other.ack("precompute", claimed) == 3
    assert other.ack("precompute", claimed) == 0  # acknowledging twice is harmless
    assert retry.ack("precompute", again) == 5
    assert retry.retire("precompute", "round-10h") and retry.pending() == 0
    assert serving.record(3, [0], VERSION) == 1  # acknowledged pairs are queued anew
    for q in (serving, first_try, retry, other):
        q.close()


def test_sqlite_reads_more_candidates_than_sqlite_binds_in_one_statement(
    tmp_path: Path, feast_project: str
) -> None:
    store = applied_store(feast_project, tmp_path / "repo", "sqlite")
    vectors = np.arange(2 * DIM, dtype=np.float32).reshape(2, DIM)
    EmbeddingWriter(store, "solaris_pair", offline=False).write(
        pair_frame(5, np.array([7, 39_999]), vectors)
    )
    retriever = SolarisRetriever(
        store,
        VERSION,
        deadline_ms=30_000,
        record_misses=False,
    )
    # 40k candidates: two IN lists of 40k would pass SQLite's 32766 bound variables.
    served = retriever.fetch(5, np.arange(40_000, dtype=np.int64))
    assert not served.error
    assert np.flatnonzero(served.tiers == Tier.EXACT).tolist() == [7, 39_999]
    np.testing.assert_array_equal(served.embeddings[[7, 39_999]], vectors)
    retriever.close()


# -- errors by type -------------------------------------------------------------------------------


def test_a_missing_table_is_final_raised_as_itself_in_strict_mode_and_logged_by_type(
    tmp_path: Path, feast_project: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = applied_store(feast_project, tmp_path / "repo", "sqlite")
    retriever = SolarisRetriever(store, VERSION, record_misses=False)
    strict = SolarisRetriever(store, VERSION, record_misses=False, strict=True)
    with sqlite3.connect(tmp_path / "repo" / "data" / "online.db") as conn:
        conn.execute(f'DROP TABLE "{sqlite_table(feast_project, "solaris_similar")}"')
    with pytest.raises(ViewsNotAppliedError) as raised:
        strict.fetch(1, [1, 2])
    assert not isinstance(raised.value, RetryableStoreError)
    assert "solaris_similar" in str(raised.value) and "feast apply" in str(raised.value)
    with caplog.at_level(logging.WARNING, logger="solaris_feast.serving.retriever"):
        answer = retriever.fetch(1, [1, 2])
    assert answer.error and answer.tiers.tolist() == [Tier.ZERO, Tier.ZERO]
    assert "final error ViewsNotAppliedError" in caplog.text
    retriever.close()
    strict.close()


def test_a_wrong_redis_password_is_final_not_retryable(
    tmp_path: Path, feast_project: str, redis_url: str
) -> None:
    good = applied_store(feast_project, tmp_path / "repo", "redis", redis_url)
    host_port = redis_connection_string(redis_url).split(",")[0]
    bad: Any = store_with_online(
        feast_project,
        tmp_path / "repo",
        {"type": "redis", "connection_string": f"{host_port},username=nobody,password=wrong"},
    )
    assert good is not None and bad.get_feature_view("solaris_pair").name == "solaris_pair"
    strict = SolarisRetriever(bad, VERSION, record_misses=False, strict=True)
    with pytest.raises(redis.AuthenticationError) as raised:
        strict.fetch(1, [1])
    assert not isinstance(raised.value, RetryableStoreError)
    assert not is_retryable(raised.value)
    lenient = SolarisRetriever(bad, VERSION, record_misses=False)
    assert lenient.fetch(1, [1]).error
    strict.close()
    lenient.close()


def test_a_refused_connection_is_retryable_in_strict_mode_and_zero_otherwise(
    tmp_path: Path, feast_project: str, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = applied_store(feast_project, tmp_path / "repo", "redis", redis_url)
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    down = open_store(feast_project, tmp_path / "repo", online="redis", redis_url=nobody)
    assert down.get_feature_view("solaris_pair").name == "solaris_pair"
    strict = SolarisRetriever(down, VERSION, record_misses=False, strict=True)
    with pytest.raises(RetryableStoreError) as raised:
        strict.fetch(1, [1, 2])
    assert is_retryable(raised.value.__cause__)  # type: ignore[arg-type]
    lenient = SolarisRetriever(down, VERSION, record_misses=False)
    with caplog.at_level(logging.WARNING, logger="solaris_feast.serving.retriever"):
        answer = lenient.fetch(1, [1, 2])
    assert answer.error and answer.tiers.tolist() == [Tier.ZERO, Tier.ZERO]
    assert "retryable error ConnectionError" in caplog.text
    assert store is not None
    strict.close()
    lenient.close()


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (sqlite3.OperationalError("database is locked"), True),
        (sqlite3.OperationalError("interrupted"), True),
        (sqlite3.OperationalError("no such table: p_solaris_pair"), False),
        (redis.TimeoutError("Timeout reading from socket"), True),
        (redis.ConnectionError("Connection refused"), True),
        (ConnectionRefusedError(111, "refused"), True),
        (redis.AuthenticationError("invalid username-password pair"), False),
        (redis.ResponseError("WRONGTYPE Operation against a key"), False),
        (redis.exceptions.MovedError("3999 127.0.0.1:6381"), True),  # a failover moved a slot
        (redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"), True),
        (redis.exceptions.NoScriptError("NOSCRIPT No matching script"), False),
        (DeadlineExceededError("Redis read", 50.0), True),
        (ViewsNotAppliedError("repo", ["solaris_pair"]), False),
        (ConfigError("bad yaml"), False),
        (TypeError("a bug"), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_errors_are_retryable_only_for_an_explicit_tuple(
    error: BaseException, retryable: bool
) -> None:
    assert is_retryable(error) is retryable


# -- configurations refused or derived -------------------------------------------------------------


def test_redis_sentinel_is_refused_with_a_clear_config_error(tmp_path: Path) -> None:
    store: Any = store_with_online(
        "sentinel_check",
        tmp_path,
        {"type": "redis", "redis_type": "redis_sentinel", "connection_string": "127.0.0.1:26379"},
    )
    for call in (
        lambda: backend_for(store, 1.0),
        lambda: online_kind(store),
        lambda: redis_client(store, 1.0),
        lambda: MissQueue.for_store(store),
    ):
        with pytest.raises(ConfigError, match="redis_sentinel is not supported") as raised:
            call()
        assert "redis_type: redis" in str(raised.value)


def test_open_repo_store_derives_the_redis_connection_without_touching_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(REDIS_CONNECTION_ENV, raising=False)
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6390/3")
    (tmp_path / "feature_store.redis.yaml").write_text(
        "project: env_check\nprovider: local\nregistry: data/registry.db\n"
        "online_store:\n  type: redis\n  connection_string: ${SOLARIS_REDIS_CONNECTION}\n"
        "entity_key_serialization_version: 3\n"
    )
    before = dict(os.environ)
    store = open_repo_store(tmp_path, Path("feature_store.redis.yaml"))
    assert store.config.online_store.connection_string == "127.0.0.1:6390,db=3"
    assert dict(os.environ) == before
    # An explicit variable wins over REDIS_URL, as Feast's own expansion would have it.
    monkeypatch.setenv(REDIS_CONNECTION_ENV, "127.0.0.1:6391")
    assert (
        open_repo_store(
            tmp_path, Path("feature_store.redis.yaml")
        ).config.online_store.connection_string
        == "127.0.0.1:6391"
    )


@pytest.mark.parametrize(
    "connection_string",
    [
        "127.0.0.1:6379",
        "127.0.0.1:6379,db=3,password=s3cr=t,ssl=true",
        "redis1:7000,redis2:7001,skip_full_coverage_check=true,username=me",
        "host:1,socket_keepalive=false,db=0",
        'host:1,username=me,password="ab\\u002ccd\\u0020#"',  # as redis_connection_string escapes
    ],
)
def test_connection_strings_parse_as_feasts_own_parser_does(connection_string: str) -> None:
    from feast.infra.online_stores.redis import RedisOnlineStore

    from solaris_feast.store.backends.redis import parse_connection_string

    assert parse_connection_string(connection_string) == (
        RedisOnlineStore._parse_connection_string(connection_string)
    )


@pytest.mark.parametrize(
    ("yaml_name", "text"),
    [
        ("feature_store.yaml", None),
        ("feature_store.redis.yaml", None),
        ("defaults.yaml", "project: defaults_check\nprovider: local\nregistry: reg.db\n"),
        (
            "cluster.yaml",
            "project: cluster_check\nprovider: local\nregistry: data/registry.db\n"
            "online_store:\n  type: redis\n  redis_type: redis_cluster\n"
            "  connection_string: 127.0.0.1:7000,127.0.0.1:7001\n"
            "entity_key_serialization_version: 3\n",
        ),
        (
            "absolute.yaml",
            "project: absolute_check\nprovider: local\nregistry: data/registry.db\n"
            "online_store:\n  type: sqlite\n  path: /tmp/elsewhere/online.db\n",
        ),
    ],
)
def test_the_online_store_read_from_the_yaml_without_feast_equals_feasts_reading(
    yaml_name: str, text: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """drain_miss_queue opens the queue from the yaml alone; it must see the store Feast sees."""
    import shutil

    from solaris_feast.store.backends import OnlineFacts
    from solaris_feast.store.config import repo_online_facts

    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6390/2")
    monkeypatch.delenv(REDIS_CONNECTION_ENV, raising=False)
    if text is None:
        shutil.copy(Path(__file__).parents[1] / "feature_repo" / yaml_name, tmp_path / yaml_name)
    else:
        (tmp_path / yaml_name).write_text(text)
    from_feast = OnlineFacts.of_store(open_repo_store(tmp_path, Path(yaml_name)))
    assert repo_online_facts(tmp_path, Path(yaml_name)) == from_feast
    assert repo_online_facts(tmp_path, tmp_path / yaml_name) == from_feast


def test_the_registry_fingerprint_follows_the_registry_file_and_the_config(
    tmp_path: Path,
) -> None:
    from solaris_feast.store.config import registry_fingerprint

    yaml_file = tmp_path / "feature_store.yaml"
    yaml_file.write_text("project: fp_check\nprovider: local\nregistry: data/registry.db\n")
    assert registry_fingerprint(tmp_path) is None  # no registry written yet: read with Feast
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "registry.db").write_bytes(b"first")
    first = registry_fingerprint(tmp_path)
    assert first is not None and registry_fingerprint(tmp_path, yaml_file) == first
    (tmp_path / "data" / "registry.db").write_bytes(b"second")  # feast apply rewrote it
    assert registry_fingerprint(tmp_path) not in (None, first)
    yaml_file.write_text(
        "project: fp_check\nprovider: local\nregistry:\n  registry_type: sql\n"
        "  path: postgresql://127.0.0.1/feast\n"
    )
    assert registry_fingerprint(tmp_path) is None  # a SQL registry is read through Feast


# -- the contract, on every backend ---------------------------------------------------------------


@pytest.mark.parametrize("online", ["sqlite", "redis"])
def test_every_backend_writes_reads_queues_and_scans_the_same_rows(
    online: str, tmp_path: Path, feast_project: str, redis_url: str
) -> None:
    store = applied_store(feast_project, tmp_path / "repo", online, redis_url)
    writer = EmbeddingWriter(store, "solaris_pair", offline=False)
    vectors = np.arange(3 * DIM, dtype=np.float32).reshape(3, DIM)
    assert writer.write(pair_frame(4, np.array([1, 2, 3]), vectors)).online_applied == 3
    writer.close()
    backend = backend_for(store, 5.0)
    try:
        assert backend.kind == online
        views = {Tier.EXACT: "solaris_pair", Tier.SIMILAR: "solaris_similar"}
        views[Tier.USER_AGG] = "solaris_user"
        reads = backend.read_tiers(4, np.array([3, 9, 1]), views, time.perf_counter() + 5.0)
        exact = reads.tiers[Tier.EXACT]
        assert [e is not None and len(e) > 0 for e in exact.embedding] == [True, False, True]
        assert not any(reads.tiers[Tier.SIMILAR].embedding)
        assert (
            backend.record_misses(
                4, [9, 10], VERSION, now=1, round_ttl_seconds=60, max_stream_length=100
            )
            == 2
        )
        assert (
            backend.record_misses(
                4, [9], VERSION, now=2, round_ttl_seconds=60, max_stream_length=100
            )
            == 0
        )  # queued once per round
        assert backend.pending_misses() == 2
        drained = backend.drain_misses(10)
        assert sorted((m.user_id, m.item_id) for m in drained) == [(4, 9), (4, 10)]
        scan = backend.scan(views, 100, 100)
        assert sorted(r.keys["item_id"] for r in scan.rows if r.tier == Tier.EXACT) == [1, 2, 3]
        assert scan.keys_read == 3 and not scan.truncated
    finally:
        backend.close()


def test_hand_packed_redis_reads_and_writes_match_the_redis_py_pipeline(
    tmp_path: Path, feast_project: str, redis_url: str
) -> None:
    """The fast path against the obviously right one: same bytes written, same tiers read."""
    store = applied_store(feast_project, tmp_path / "repo", "redis", redis_url)
    client = redis.Redis.from_url(redis_url)
    packed = RedisBackend(redis_client(store, 5.0), feast_project, packed=True)
    plain = RedisBackend(redis_client(store, 5.0), feast_project, packed=False)
    layout = EntityKeyLayout(["user_id", "item_id"], 3)
    from feast.protos.feast.types.Value_pb2 import FloatList
    from feast.protos.feast.types.Value_pb2 import Value as ValueProto

    def batch(user: int, items: list[int], ts_ns: int, versions: int = 1) -> OnlineBatch:
        # versions > 1: versions of different lengths, a column the packed path cannot pack
        # as one matrix (it takes the row-by-row path).
        values = [
            [
                ValueProto(float_list_val=FloatList(val=[float(i)] * DIM)).SerializeToString(),
                ValueProto(string_val=VERSION + "x" * (i % versions)).SerializeToString(),
                ValueProto(unix_timestamp_val=ts_ns // 10**9).SerializeToString(),
            ]
            for i in items
        ]
        return OnlineBatch.from_rows(
            "solaris_pair",
            [layout.key(user, i) for i in items],
            ["embedding", "model_version", "computed_at"],
            values,
            np.full(len(items), ts_ns, dtype=np.int64),
        )

    now_ns = time.time_ns()
    try:
        assert packed.write_batch(batch(1, [1, 2, 3], now_ns), chunk_rows=2, atomic_rows=2) == 3
        assert plain.write_batch(batch(2, [1, 2, 3], now_ns), chunk_rows=2, atomic_rows=2) == 3
        # Newest wins on both: an older rewrite is dropped, a tie is applied.
        assert packed.write_batch(batch(1, [1], now_ns - 1), chunk_rows=8, atomic_rows=8) == 0
        assert plain.write_batch(batch(2, [1], now_ns - 1), chunk_rows=8, atomic_rows=8) == 0
        assert plain.write_batch(batch(2, [1], now_ns), chunk_rows=8, atomic_rows=8) == 1
        assert packed.write_batch(batch(3, [1, 2, 3], now_ns, 3), chunk_rows=2, atomic_rows=8) == 3
        assert plain.write_batch(batch(4, [1, 2, 3], now_ns, 3), chunk_rows=2, atomic_rows=8) == 3
        for item in (1, 2, 3):
            first = client.hgetall(layout.key(1, item) + feast_project.encode())
            second = client.hgetall(layout.key(2, item) + feast_project.encode())
            assert first == second and first
            third = client.hgetall(layout.key(3, item) + feast_project.encode())
            assert third == client.hgetall(layout.key(4, item) + feast_project.encode())
            # Items 1 and 2 got a longer version than the first batch's; item 3 the same one.
            assert (third == first) == (item == 3)

        # Newest wins row by row inside one script call: the older middle row is skipped and
        # the row after it still gets its own values.
        def stored_hashes(user: int) -> list[dict[bytes, bytes]]:
            # A client without decode_responses: its stubs say bytes | str, it answers bytes.
            return [
                cast(
                    dict[bytes, bytes], client.hgetall(layout.key(user, i) + feast_project.encode())
                )
                for i in (1, 2, 3)
            ]

        for user, backend in ((5, packed), (6, plain)):
            assert backend.write_batch(batch(user, [1, 2, 3], now_ns), chunk_rows=8, atomic_rows=8)
            before = [
                client.hgetall(layout.key(user, i) + feast_project.encode()) for i in (1, 2, 3)
            ]
            mixed = dataclasses.replace(
                batch(user, [1, 2, 3], now_ns, 3),
                event_ts_ns=np.array([now_ns + 10, now_ns - 10, now_ns + 10], dtype=np.int64),
            )
            assert backend.write_batch(mixed, chunk_rows=8, atomic_rows=8) == 2
            after = [
                client.hgetall(layout.key(user, i) + feast_project.encode()) for i in (1, 2, 3)
            ]
            assert [a == b for a, b in zip(after, before, strict=True)] == [False, True, False]
            assert after[0][b"_ts:solaris_pair"] == after[2][b"_ts:solaris_pair"]
        assert stored_hashes(5) == stored_hashes(6)
        views = {Tier.EXACT: "solaris_pair", Tier.SIMILAR: "solaris_similar"}
        views[Tier.USER_AGG] = "solaris_user"
        items = np.array([3, 1, 99])
        deadline = time.perf_counter() + 5.0
        assert packed.read_tiers(1, items, views, deadline) == plain.read_tiers(
            1, items, views, deadline
        )
        # Several users in one round trip read what one read per user reads.
        requests = [(1, items), (2, np.array([2])), (7, np.array([1, 2])), (1, np.array([2]))]
        batched = packed.read_tiers_many(requests, views, deadline)
        assert batched == [plain.read_tiers(u, i, views, deadline) for u, i in requests]
        assert batched == plain.read_tiers_many(requests, views, deadline)
        assert [len(r.tiers[Tier.EXACT].embedding) for r in batched] == [3, 1, 2, 1]
    finally:
        packed.close()
        plain.close()
        client.close()


def test_entity_key_layout_builds_feasts_keys_without_importing_feast() -> None:
    """A task that only reads the online store builds keys without Feast's import; the keys
    are Feast's own, byte for byte (checked against Feast here, and by the layout itself in any
    process that has Feast loaded)."""
    import subprocess
    import sys

    script = (
        "import sys; from solaris_feast.store.layout import EntityKeyLayout; "
        "k = EntityKeyLayout(['user_id', 'item_id'], 3).key(7, 'sku/9'); "
        "print(k.hex(), 'feast' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[1] == "False"
    layout = EntityKeyLayout(["user_id", "item_id"], 3)
    layout.check_against_feast()
    assert bytes.fromhex(out[0]) == layout._feast_key([7, "sku/9"])


def test_byte_columns_keep_every_byte_and_build_feasts_keys_as_a_matrix() -> None:
    """The writer's columns: a matrix when the values share a width (trailing NUL bytes kept:
    Int64 keys end in them), a list otherwise; ``encoded`` encodes each distinct value once;
    Int64 keys built as one matrix are Feast's keys from ``key()``, String keys fall back."""
    fixed = ByteColumn.of([b"a\x00", b"\x00\x00", b"zz"])
    assert fixed.matrix is not None and fixed.matrix.shape == (3, 2)
    assert fixed.tolist() == [b"a\x00", b"\x00\x00", b"zz"]
    ragged = ByteColumn.of([b"a", b"bc", b""])
    assert ragged.matrix is None and ragged.tolist() == [b"a", b"bc", b""] and len(ragged) == 3
    assert len(ByteColumn.of([])) == 0 and ByteColumn.of([]).tolist() == []
    with pytest.raises(ValueError, match="exactly one"):
        ByteColumn()

    calls: list[int] = []

    def encode(value: int) -> bytes:
        calls.append(value)
        return str(value).encode()

    column = ByteColumn.encoded(np.array([5, 7, 5, 5, 7]), encode)
    assert column.tolist() == [b"5", b"7", b"5", b"5", b"7"] and sorted(calls) == [5, 7]
    assert ByteColumn.encoded(np.array([5, 10, 5]), encode).tolist() == [b"5", b"10", b"5"]

    layout = EntityKeyLayout(["user_id", "item_id"], 3)
    users, items = np.array([0, 7, 2**63 - 1, 256]), np.array([256, 0, 1, 2**40])
    keys = layout.key_column([users, items])
    assert keys.matrix is not None
    pairs = zip(users.tolist(), items.tolist(), strict=True)
    assert keys.tolist() == [layout.key(u, i) for u, i in pairs]
    assert keys.tolist()[0] == layout._feast_key([0, 256])
    strings = layout.key_column([np.array(["u:1", "ü"], dtype=object), np.array([3, 4])])
    assert strings.tolist() == [layout.key("u:1", 3), layout.key("ü", 4)]

    from feast.protos.feast.types.Value_pb2 import Value as ValueProto

    values = np.array([0.0, -0.0, 1.5, 3.3e38, 1e-45, 0.1])
    assert float_value_column(values, "float").tolist() == [
        ValueProto(float_val=v).SerializeToString() for v in values.tolist()
    ]
    assert float_value_column(values, "double").tolist() == [
        ValueProto(double_val=v).SerializeToString() for v in values.tolist()
    ]


def test_entity_key_layout_decodes_its_own_keys_and_refuses_others() -> None:
    pair = EntityKeyLayout(["user_id", "item_id"], 3)
    user = EntityKeyLayout(["user_id"], 3)
    assert pair.decode(pair.key(12, 2**40)) == {"user_id": 12, "item_id": 2**40}
    assert user.decode(user.key(7)) == {"user_id": 7}
    assert pair.decode(user.key(7)) is None and user.decode(pair.key(1, 2)) is None
    assert pair.decode(pair.key(1, 2)[:-1]) is None


def test_a_port_that_is_no_number_and_a_damaged_sqlite_file_end_a_command_in_one_line(
    tmp_path: Path, feast_project: str
) -> None:
    """Both used to end a command in a traceback: ``ValueError: invalid literal for int()`` and
    ``DatabaseError: file is not a database``, neither naming what to fix."""
    from solaris_feast.cli import _one_line_error

    bad: Any = store_with_online(
        feast_project, tmp_path / "repo", {"type": "redis", "connection_string": "localhost:nope"}
    )
    with pytest.raises(ConfigError, match="numeric port") as raised:
        redis_client(bad)
    assert _one_line_error(raised.value) == f"error: ConfigError: {raised.value}"

    damaged = tmp_path / "online.db"
    damaged.write_bytes(os.urandom(5000))
    with pytest.raises(sqlite3.DatabaseError) as caught:
        sqlite3.connect(damaged).execute("SELECT name FROM sqlite_master")
    line = _one_line_error(caught.value)
    assert line is not None and line.startswith("error: DatabaseError: file is not a database")
    assert "feature_store yaml" in line


def test_describe_error_names_the_redis_server_of_a_wrapped_refusal_and_nothing_else(
    redis_url: str,
) -> None:
    from urllib.parse import urlparse

    from solaris_feast.errors import FinalStoreError, describe_error

    client = redis.Redis.from_url(redis_url)
    where = urlparse(redis_url)
    try:
        try:
            client.execute_command("SOLARIS-NO-SUCH-COMMAND")
        except redis.ResponseError as exc:
            raise FinalStoreError("the write failed") from exc
    except FinalStoreError as wrapped:
        text = describe_error(wrapped)
    assert text.startswith("FinalStoreError: the write failed (Redis at ")
    assert f"{where.hostname}:{where.port}" in text
    connection = client.connection_pool.get_connection()
    try:
        raise ValueError("bad plan")  # a connection in this frame, but no Redis error
    except ValueError as exc:
        assert describe_error(exc) == "ValueError: bad plan"
    client.connection_pool.release(connection)
    client.close()


def test_a_retriever_asked_to_expect_no_version_says_no_chain_was_found(
    tmp_path: Path, feast_project: str
) -> None:
    """The README's snippet passes serving_embedding_version(Path("models")), None for a folder
    without a chain: the client got "expected_model_version must be a non-empty string"."""
    from solaris_feast.models.cards import serving_embedding_version

    store = applied_store(feast_project, tmp_path / "repo", "sqlite", None)
    version = serving_embedding_version(tmp_path / "models")
    assert version is None
    with pytest.raises(ConfigError, match=r"no serving chain .*solaris train"):
        SolarisRetriever(store, version)  # type: ignore[arg-type]
