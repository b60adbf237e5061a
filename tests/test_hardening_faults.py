"""Faults: Redis killed or frozen while serving, killed in the middle of a write batch, and a
miss-queue consumer that dies between reading and acknowledging.

Each test runs its own redis-server (on this suite's ports, :mod:`ports`, with the cutting
proxy) so it can kill it without touching the shared one, and stops it in ``finally``.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import redis
from test_hardening_support import (
    DIM,
    PROXY_PORT,
    THROWAWAY_PORT,
    VERSION,
    CuttingProxy,
    owned_redis,
    pair_frame,
    project_snapshot,
    wait_until,
)

from solaris_feast.errors import RetryableStoreError
from solaris_feast.serving.miss_queue import MissQueue
from solaris_feast.serving.retriever import SolarisRetriever
from solaris_feast.store.config import open_store
from solaris_feast.store.definitions import solaris_definitions
from solaris_feast.store.layout import DEFAULT_ATOMIC_ROWS, DEFAULT_TRANSACTIONS_IN_FLIGHT
from solaris_feast.store.write import EmbeddingWriter
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from feast import FeatureStore

DEADLINE_MS = 50.0
# Wall-clock slack over the deadline for a loaded 2-core machine (thread scheduling, GC).
SLACK_MS = 250.0


def _store_with_pairs(
    project: str, tmp_path: Path, redis_url: str, items: np.ndarray, vectors: np.ndarray
) -> FeatureStore:
    """A store on ``redis_url`` with the views applied and user 7's pairs ``items`` written."""
    store = open_store(project, tmp_path / "repo", online="redis", redis_url=redis_url)
    store.apply(solaris_definitions().all())
    writer = EmbeddingWriter(store, "solaris_pair", offline=False)
    writer.write(pair_frame(7, items, vectors))
    writer.close()
    return store


def test_redis_killed_while_serving_answers_zero_within_deadline_and_recovers(
    tmp_path: Path, feast_project: str
) -> None:
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((40, DIM)).astype(np.float32)
    items = np.arange(40, dtype=np.int64)
    with owned_redis(THROWAWAY_PORT, tmp_path / "redis", durable=True) as server:
        store = _store_with_pairs(feast_project, tmp_path, server.url, items, vectors)
        retriever = SolarisRetriever(store, VERSION, deadline_ms=DEADLINE_MS, record_misses=True)
        healthy = retriever.fetch(7, items)
        assert not healthy.error and (healthy.tiers == Tier.EXACT).all()

        # Frozen: the socket accepts bytes but nothing answers, the slowest failure there is.
        server.freeze()
        try:
            for _ in range(3):
                started = time.perf_counter()
                frozen = retriever.fetch(7, items)
                elapsed_ms = (time.perf_counter() - started) * 1000
                assert frozen.error
                assert (frozen.tiers == Tier.ZERO).all() and not frozen.embeddings.any()
                assert elapsed_ms < DEADLINE_MS + SLACK_MS, elapsed_ms
        finally:
            server.thaw()

        server.kill()
        for _ in range(3):
            started = time.perf_counter()
            down = retriever.fetch(7, items)
            elapsed_ms = (time.perf_counter() - started) * 1000
            assert down.error and (down.tiers == Tier.ZERO).all()
            assert down.embeddings.shape == (40, DIM) and not down.embeddings.any()
            assert np.isnan(down.age_seconds).all()
            assert elapsed_ms < DEADLINE_MS + SLACK_MS, elapsed_ms
        assert retriever.stats.errors == 6
        # What a Feast client or `feast serve` shows of the failure names the server and the
        # cause, not redis-py's repr of the error's category (network:ConnectionError).
        strict = SolarisRetriever(store, VERSION, deadline_ms=DEADLINE_MS, strict=True)
        with pytest.raises(RetryableStoreError, match=rf":{server.port}\. Connection refused"):
            strict.fetch(7, items)

        # Same retriever object, no reconnect call: the next fetches must heal by themselves.
        server.start()
        recovered = None
        deadline = time.monotonic() + 5.0
        attempts = 0
        while time.monotonic() < deadline:
            attempts += 1
            recovered = retriever.fetch(7, items)
            if not recovered.error:
                break
            time.sleep(0.05)
        assert recovered is not None and not recovered.error
        assert attempts <= 2, f"took {attempts} fetches to recover"
        assert (recovered.tiers == Tier.EXACT).all()
        np.testing.assert_array_equal(recovered.embeddings, vectors)
        retriever.close()


def test_strict_retriever_raises_retryable_error_when_redis_is_killed(
    tmp_path: Path, feast_project: str
) -> None:
    with owned_redis(THROWAWAY_PORT, tmp_path / "redis") as server:
        store = open_store(feast_project, tmp_path / "repo", online="redis", redis_url=server.url)
        store.apply(solaris_definitions().all())
        retriever = SolarisRetriever(store, VERSION, deadline_ms=DEADLINE_MS, strict=True)
        assert not retriever.fetch(1, [1, 2]).error
        server.kill()
        with pytest.raises(RetryableStoreError):
            retriever.fetch(1, [1, 2])
        server.start()
        assert wait_until(lambda: _fetch_ok(retriever), timeout_s=5.0)
        retriever.close()


def test_reads_after_a_redis_restart_reconnect_without_failing_a_request(
    tmp_path: Path, feast_project: str
) -> None:
    """Kept read connections that a restart closed while idle: the next read must find a new
    connection by itself (as Feast's own Redis read does), not fail once per kept connection."""
    from solaris_feast.store.backends.redis import DeadlineConnections

    items = np.arange(8, dtype=np.int64)
    vectors = np.ones((8, DIM), dtype=np.float32)
    with owned_redis(THROWAWAY_PORT, tmp_path / "redis", durable=True) as server:
        store = _store_with_pairs(feast_project, tmp_path, server.url, items, vectors)
        retriever = SolarisRetriever(store, VERSION, deadline_ms=1000, strict=True)
        assert (retriever.fetch(7, items).tiers == Tier.EXACT).all()

        # Three kept connections: three reads that each hold theirs for 0.3 s at once.
        client = redis.Redis.from_url(server.url)
        reads = DeadlineConnections(client)
        blpop = b"*3\r\n$5\r\nBLPOP\r\n$12\r\nsolaris-none\r\n$3\r\n0.3\r\n"
        threads = [
            threading.Thread(
                target=reads.round_trip, args=(blpop, 1, time.perf_counter() + 5, 5000.0)
            )
            for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(reads._idle) == 3

        server.stop()  # a clean shutdown: the server closes every client's socket
        server.start()
        assert wait_until(lambda: _answers(client), timeout_s=10.0)

        # Strict: a failed read raises instead of answering ZERO.
        after = retriever.fetch(7, items)
        assert (after.tiers == Tier.EXACT).all()
        np.testing.assert_array_equal(after.embeddings, vectors)
        ping = b"*1\r\n$4\r\nPING\r\n"
        for _ in range(3):
            assert reads.round_trip(ping, 1, time.perf_counter() + 5, 5000.0) == [b"PONG"]
        assert len(reads._idle) == 1  # the closed ones dropped, the new one kept
        reads.close()
        client.close()
        retriever.close()


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def _fetch_ok(retriever: SolarisRetriever) -> bool:
    try:
        return not retriever.fetch(1, [1, 2]).error
    except RetryableStoreError:
        return False


def _pair_keys(client: redis.Redis, project: str) -> int:
    return sum(1 for _ in client.scan_iter(match=f"*{project}", count=1000))


@pytest.mark.parametrize(
    ("rows", "atomic_rows", "in_flight"),
    [
        (DEFAULT_ATOMIC_ROWS, DEFAULT_ATOMIC_ROWS, DEFAULT_TRANSACTIONS_IN_FLIGHT),
        (1500, 500, DEFAULT_TRANSACTIONS_IN_FLIGHT),
        (1500, 250, 1),
    ],
    ids=["one-transaction", "three-transactions", "six-transactions-one-in-flight"],
)
def test_redis_killed_mid_batch_leaves_no_half_batch_and_a_retry_completes(
    tmp_path: Path, feast_project: str, rows: int, atomic_rows: int, in_flight: int
) -> None:
    """Redis receives the first half of a batch's bytes, executes what it got, and is killed.

    A proxy holds back the batch's tail, so the kill lands mid-batch every run. Redis fsyncs
    every write to its append-only file, so after the restart the store shows exactly what Redis
    executed before dying: none of a batch of up to ``atomic_rows`` rows, and whole
    ``atomic_rows`` slices of a bigger one, never part of a slice. Then a retry completes it.
    """
    rng = np.random.default_rng(2)
    vectors = rng.standard_normal((rows, DIM)).astype(np.float32)
    items = np.arange(rows, dtype=np.int64)
    # computed_at fixed, as the precompute uses its plan's time: the retry is the same batch.
    batch = pair_frame(3, items, vectors, computed_at=pd.Timestamp.now(tz="UTC").floor("s"))
    with owned_redis(THROWAWAY_PORT, tmp_path / "redis", durable=True) as server:
        direct = redis.Redis.from_url(server.url)
        # Roughly half the batch's bytes (about 190 bytes a row) reach Redis before the cut.
        proxy = CuttingProxy(PROXY_PORT, server.port, cut_after_bytes=rows * 190 // 2)
        try:
            store = open_store(
                feast_project,
                tmp_path / "repo",
                online="redis",
                redis_url=f"redis://127.0.0.1:{PROXY_PORT}/0",
            )
            store.apply(solaris_definitions().all())

            def writer() -> EmbeddingWriter:
                return EmbeddingWriter(
                    store,
                    "solaris_pair",
                    offline=True,
                    chunk_rows=64,
                    atomic_rows=atomic_rows,
                    in_flight=in_flight,
                )

            failure: list[BaseException] = []

            def crash_when_cut() -> None:
                proxy.cut.wait(timeout=20)
                time.sleep(0.3)  # Redis executes (and fsyncs) everything it has received
                server.kill()
                proxy.sever()

            killer = threading.Thread(target=crash_when_cut, daemon=True)
            killer.start()
            first = writer()
            try:
                first.write(batch)
            except RetryableStoreError as exc:
                failure.append(exc)
            killer.join(timeout=25)
            assert proxy.cut.is_set(), "the batch never crossed the cut: make the batch larger"
            assert failure, "the write must fail when Redis dies under it"
            assert "write the batch again" in str(failure[0])
            first.close()

            server.start()
            survivors = _pair_keys(direct, feast_project)
            if rows <= atomic_rows:
                assert survivors == 0, f"{survivors} rows of a {rows}-row batch survived"
            else:
                assert survivors % atomic_rows == 0 and survivors < rows, survivors
            # The error says what it knows: rows before `stored` were answered as stored, and
            # the transactions in flight (up to `in_flight`) end at `sent`; what survived lies
            # between, and no more than `in_flight` transactions were unanswered.
            said = re.search(
                r"rows before (\d+) are stored, each transaction of rows \d+-(\d+)", str(failure[0])
            )
            assert said, str(failure[0])
            assert int(said[1]) <= survivors <= int(said[2]) + 1, (str(failure[0]), survivors)
            assert int(said[2]) + 1 - int(said[1]) <= in_flight * atomic_rows, str(failure[0])

            # The retry: a new writer, as a retried Airflow task would make.
            proxy.heal()
            retry = writer()
            report = retry.write(batch)
            retry.close()
        finally:
            proxy.close()
        assert report.online_applied == rows
        assert report.offline_files_written == 0  # the first attempt's parquet file is reused
        assert _pair_keys(direct, feast_project) == rows
        files = sorted(Path(tmp_path / "repo" / "data" / "offline").rglob("*.parquet"))
        assert len(files) == 1
        offline = pq.read_table(files[0]).to_pandas()
        assert len(offline) == rows and not offline.duplicated(["user_id", "item_id"]).any()

        reader_store = open_store(
            feast_project, tmp_path / "repo", online="redis", redis_url=server.url
        )
        retriever = SolarisRetriever(reader_store, VERSION, record_misses=False, deadline_ms=2000)
        served = retriever.fetch(3, items)
        assert (served.tiers == Tier.EXACT).all()
        np.testing.assert_array_equal(served.embeddings, vectors)
        retriever.close()
        direct.close()


def pairs_of(frame: pd.DataFrame) -> list[tuple[int, int]]:
    return sorted(zip(frame.user_id.tolist(), frame.item_id.tolist(), strict=True))


def test_miss_queue_redelivers_what_a_dead_consumer_read_and_never_acked(
    tmp_path: Path, feast_project: str, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    serving = MissQueue(feast_project, redis=client)
    misses = [(user, item) for user in (1, 2, 3) for item in range(10)]
    for user in (1, 2, 3):
        assert serving.record(user, list(range(10)), VERSION) == 10

    store = open_store(feast_project, tmp_path / "repo", online="redis", redis_url=redis_url)
    store.apply(solaris_definitions().all())
    computed_at = pd.Timestamp.now(tz="UTC").floor("s")

    def embed_and_write(taken: pd.DataFrame) -> None:
        # z is a function of the pair, as the FM's would be: a redelivered pair gets equal rows.
        vectors = np.stack(
            [np.full(DIM, u * 1000 + i, dtype=np.float32) for u, i in pairs_of(taken)]
        )
        for user, group in taken.groupby("user_id"):
            EmbeddingWriter(store, "solaris_pair", offline=True).write(
                pair_frame(
                    int(user),
                    group.item_id.to_numpy(),
                    vectors[group.index.to_numpy()],
                    computed_at=computed_at,
                )
            )

    # Worker A reads 12 misses and dies before writing or acknowledging anything.
    dead = MissQueue(feast_project, redis=redis.Redis.from_url(redis_url))
    taken_by_dead = dead.read_group("precompute", "worker-a", max_pairs=12, min_idle_ms=300)
    assert len(taken_by_dead) == 12
    # While they are pending they are still queued: serving the same misses adds nothing.
    assert serving.record(1, list(range(10)), VERSION) == 0

    # Worker B gets only what nobody holds, writes it and acknowledges it. Until the last read,
    # a claim counts as stale after a minute: a loaded machine's pauses cannot make A's stale.
    live = MissQueue(feast_project, redis=redis.Redis.from_url(redis_url))
    first = live.read_group("precompute", "worker-b", max_pairs=100, min_idle_ms=60_000)
    assert len(first) == 18
    assert not set(pairs_of(first)) & set(pairs_of(taken_by_dead))
    embed_and_write(first.reset_index(drop=True))
    assert live.ack("precompute", first) == 18

    # Nothing more until A's claim goes stale; then B takes over exactly A's 12.
    assert live.read_group("precompute", "worker-b", max_pairs=100, min_idle_ms=60_000).empty
    time.sleep(0.35)
    second = live.read_group("precompute", "worker-b", max_pairs=100, min_idle_ms=300)
    assert pairs_of(second) == pairs_of(taken_by_dead)
    embed_and_write(second.reset_index(drop=True))
    assert live.ack("precompute", second) == 12
    assert live.ack("precompute", second) == 0  # acknowledging twice is harmless

    assert live.pending() == 0
    assert client.xpending(live.stream_key, "precompute")["pending"] == 0
    assert live.read_group("precompute", "worker-b", max_pairs=100, min_idle_ms=0).empty
    # Every miss written exactly once, online and offline.
    offline = pd.concat(
        pq.read_table(p).to_pandas()
        for p in Path(tmp_path / "repo" / "data" / "offline").rglob("*.parquet")
    )
    assert len(offline) == len(misses)
    assert pairs_of(offline) == sorted(misses)
    assert _pair_keys(client, feast_project) == len(misses)
    # Acknowledged pairs open a new round: the same miss is queued again.
    assert serving.record(1, [0], VERSION) == 1
    assert project_snapshot(client, feast_project)  # keys exist; fixture teardown deletes them


def test_a_retried_drain_gets_back_what_its_failed_try_took(
    feast_project: str, redis_url: str
) -> None:
    """The same consumer (a round's retried drain) reads its own unacknowledged entries again
    at once, instead of nothing until another round claims them as idle; other consumers still
    get only what nobody holds."""
    client = redis.Redis.from_url(redis_url)
    MissQueue(feast_project, redis=client).record(3, list(range(8)), VERSION)
    first_try = MissQueue(feast_project, redis=client)
    taken = first_try.read_group("precompute", "round-10h", max_pairs=5, min_idle_ms=600_000)
    assert len(taken) == 5
    retry = MissQueue(feast_project, redis=redis.Redis.from_url(redis_url))
    again = retry.read_group("precompute", "round-10h", max_pairs=100, min_idle_ms=600_000)
    assert pairs_of(again)[:5] == pairs_of(taken) and len(again) == 8  # its 5, then the 3 left
    other = MissQueue(feast_project, redis=client)
    assert other.read_group("precompute", "round-11h", max_pairs=100, min_idle_ms=600_000).empty
    # A consumer that still holds entries stays in the group; one that holds none leaves it.
    assert not retry.retire("precompute", "round-10h")
    assert retry.ack("precompute", again) == 8
    assert retry.retire("precompute", "round-10h")
    consumers = {c["name"] for c in client.xinfo_consumers(retry.stream_key, "precompute")}
    assert b"round-10h" not in consumers and "round-10h" not in consumers
    assert retry.read_group("precompute", "round-10h", max_pairs=100, min_idle_ms=0).empty


def test_a_queue_lost_with_the_stores_data_is_acknowledged_and_retired_without_error(
    feast_project: str, redis_url: str
) -> None:
    """A Redis restarted without persistence loses the stream and its group mid-round: the
    round's ack and retire met NOGROUP, a final error, and the round failed at its last task."""
    client = redis.Redis.from_url(redis_url)
    queue = MissQueue(feast_project, redis=client)
    queue.record(3, list(range(4)), VERSION)
    taken = queue.read_group("precompute", "round-12h", max_pairs=10, min_idle_ms=600_000)
    assert len(taken) == 4
    client.delete(queue.stream_key)  # the data loss (this test's own key only)
    assert queue.ack("precompute", taken) == 0
    assert queue.retire("precompute", "round-12h")
    # A request after the restart queues into a new stream, still without the group.
    assert queue.record(3, [9], VERSION) == 1
    assert queue.ack("precompute", taken) == 0
    assert queue.retire("precompute", "round-12h")


def test_a_consumer_that_dies_after_writing_causes_no_duplicate_rows(
    tmp_path: Path, feast_project: str, redis_url: str
) -> None:
    """At-least-once delivery plus idempotent writes: the pairs a dead worker wrote but never
    acknowledged are delivered again, and writing them again adds no row online or offline."""
    client = redis.Redis.from_url(redis_url)
    MissQueue(feast_project, redis=client).record(4, list(range(8)), VERSION)
    store = open_store(feast_project, tmp_path / "repo", online="redis", redis_url=redis_url)
    store.apply(solaris_definitions().all())
    planned_at = pd.Timestamp.now(tz="UTC").floor("s")

    def embed_and_write(taken: pd.DataFrame) -> None:
        items = taken.item_id.to_numpy()
        vectors = np.stack([np.full(DIM, 4000 + item, dtype=np.float32) for item in items])
        EmbeddingWriter(store, "solaris_pair", offline=True).write(
            pair_frame(4, items, vectors, computed_at=planned_at)
        )

    doomed = MissQueue(feast_project, redis=redis.Redis.from_url(redis_url))
    taken = doomed.read_group("precompute", "worker-c", max_pairs=100, min_idle_ms=200)
    embed_and_write(taken)  # ... and dies before ack
    time.sleep(0.25)
    heir = MissQueue(feast_project, redis=redis.Redis.from_url(redis_url))
    again = heir.read_group("precompute", "worker-d", max_pairs=100, min_idle_ms=200)
    assert pairs_of(again) == pairs_of(taken) == [(4, i) for i in range(8)]
    embed_and_write(again)
    assert heir.ack("precompute", again) == 8
    assert heir.pending() == 0

    files = list(Path(tmp_path / "repo" / "data" / "offline").rglob("*.parquet"))
    offline = pd.concat(pq.read_table(p).to_pandas() for p in files)
    assert len(files) == 1 and len(offline) == 8
    assert _pair_keys(client, feast_project) == 8


def test_misses_are_queued_again_after_redis_restarts_empty(
    tmp_path: Path, feast_project: str
) -> None:
    """A retriever skips the pairs it queued until the round counter changes. A Redis that
    restarts empty loses the queue and its markers; before any drain had bumped the counter it
    was absent before and after, so the retriever kept skipping its pairs for the round TTL
    (an hour) and every miss of that hour was lost."""
    from solaris_feast.store.layout import miss_stream_key

    items = np.arange(6, dtype=np.int64)
    with owned_redis(THROWAWAY_PORT, tmp_path / "redis") as server:
        store = _store_with_pairs(
            feast_project, tmp_path, server.url, items[:1], np.ones((1, DIM), dtype=np.float32)
        )
        client = redis.Redis.from_url(server.url)
        stream = miss_stream_key(feast_project)
        retriever = SolarisRetriever(store, VERSION, deadline_ms=1000)
        assert retriever.fetch(7, items).tiers.tolist() == [Tier.EXACT] + [Tier.ZERO] * 5
        retriever.fetch(7, items)  # the counter's first read: nothing is sent twice
        assert client.xlen(stream) == 5 and retriever.stats.misses_recorded == 5

        server.stop()  # nothing on disk: it comes back empty
        server.start()
        assert wait_until(lambda: _answers(client), timeout_s=10.0)
        assert client.xlen(stream) == 0
        for _ in range(2):  # the stored pair is gone too: six misses now
            answer = retriever.fetch(7, items)
            assert not answer.error and (answer.tiers == Tier.ZERO).all()
        assert client.xlen(stream) == 6, "the misses served after the restart were not queued"
        assert retriever.stats.misses_recorded == 11
        retriever.close()
        client.close()
