"""Redis Cluster failover: a primary fails while the retriever serves and a writer writes.

A cluster of 3 primaries, each with one replica, runs on loopback ports of this suite's block
(:mod:`ports`), started by the test and stopped by PID in ``finally``. One primary is reached
through a proxy process (``link_cut_proxy.py``) that can cut its replication link
and nothing else. While a thread writes batches of new keys (retrying what
:func:`~solaris_feast.errors.is_retryable` accepts, as an Airflow task retry would) and the
main thread serves, that primary is frozen for 0.4 s (SIGSTOP), then its replication link is
cut, it acknowledges a few more writes, and it is killed (SIGKILL). The cluster promotes its
replica, which never got those writes.

Pinned: every fetch answers within its deadline (frozen, dead or moving); while the slots move a
fetch answers ZERO for every item with ``error=True``, and afterwards every user is served its
exact embeddings again; when the writer is done, every row it was told is stored is there, whole
(its embedding, version, ``computed_at`` and Feast timestamp all of its batch), on exactly one
primary, and the primaries hold no other keys of the project.
"""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import redis
from ports import FAILOVER_BUS_OFFSET, FAILOVER_PORTS, FAILOVER_PROXY_PORT
from redis.cluster import ClusterNode, RedisCluster
from test_hardening_cluster import cluster_store
from test_hardening_support import DIM, VERSION, OwnedRedis, pair_frame, redis_cli, wait_until

from solaris_feast.errors import RetryableStoreError, is_retryable
from solaris_feast.serving.retriever import SolarisRetriever
from solaris_feast.store.backends import backend_for
from solaris_feast.store.backends.redis_cluster import RedisClusterBackend
from solaris_feast.store.definitions import solaris_definitions
from solaris_feast.store.layout import (
    EntityKeyLayout,
    FloatListCodec,
    online_field,
    stored_model_version,
)
from solaris_feast.store.write import WRITE_TIMEOUT_SECONDS, EmbeddingWriter
from solaris_feast.tiers import Tier

pytestmark = [pytest.mark.redis, pytest.mark.cluster_failover]

PORTS = FAILOVER_PORTS
PROXIED = PORTS[0]
"""The primary that is frozen and killed; its replication link goes through the proxy."""
PROXY_PORT = FAILOVER_PROXY_PORT


NODE_TIMEOUT_MS = 1000
DEADLINE_MS = 100.0
DEADLINE_SLACK_MS = 50.0
"""What a fetch may run past its deadline: the scheduler of a busy 2-core machine, not Redis."""
SERVED_USERS = range(1, 31)
SERVED_ITEMS = np.arange(20, dtype=np.int64)
FIRST_WRITTEN_USER = 1000
WRITTEN_ITEMS = np.arange(10, dtype=np.int64)
MAX_BATCHES = 20_000
BATCHES_AFTER_RECOVERY = 50


def bus_port(port: int) -> int:
    """The cluster bus of a node, in this suite's block of ports (Redis's default, port + 10000,
    is not)."""
    return port + FAILOVER_BUS_OFFSET


def served_vector(user: int, item: int) -> np.ndarray:
    return np.random.default_rng(user * 1000 + item).standard_normal(DIM).astype(np.float32)


def written_vector(user: int, item: int) -> np.ndarray:
    return np.random.default_rng(user * 100_000 + item + 7).standard_normal(DIM).astype(np.float32)


@dataclass
class Cluster:
    """The nodes by listening port; ``PROXIED`` is reached through the link-cut proxy."""

    nodes: dict[int, OwnedRedis]
    proxy: subprocess.Popen[bytes]

    @staticmethod
    def announced(port: int) -> int:
        return PROXY_PORT if port == PROXIED else port

    @property
    def connection(self) -> str:
        return ",".join(f"127.0.0.1:{self.announced(p)}" for p in PORTS)

    def client(self) -> RedisCluster:
        alive = [self.announced(p) for p, n in self.nodes.items() if n.proc is not None]
        return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in alive])

    def role(self, port: int) -> dict[str, object]:
        return dict(redis.Redis(port=port, socket_timeout=1).info("replication"))

    def replica_of(self, primary: int) -> int:
        for port, node in self.nodes.items():
            if port != primary and node.proc is not None:
                info = self.role(port)
                master = int(str(info.get("master_port", 0)))
                if info.get("role") == "slave" and master == self.announced(primary):
                    return port
        raise AssertionError(f"primary {primary} has no replica")

    def healthy(self) -> bool:
        """Every live node sees the whole cluster serving, and every replica is in sync."""
        for port, node in self.nodes.items():
            if node.proc is None:
                continue
            state = redis.Redis(port=port, socket_timeout=1).cluster("info").get("cluster_state")
            if state != "ok":
                return False
            info = self.role(port)
            if info.get("role") == "slave" and info.get("master_link_status") != "up":
                return False
        return True

    def cut_replication(self) -> None:
        self.proxy.send_signal(signal.SIGUSR1)


@pytest.fixture
def replicated_cluster(tmp_path: Path) -> Iterator[Cluster]:
    nodes = {
        port: OwnedRedis(
            port,
            tmp_path / f"node-{port}",
            extra=(
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(tmp_path / f"nodes-{port}.conf"),
                "--cluster-node-timeout",
                str(NODE_TIMEOUT_MS),
                "--cluster-port",
                str(bus_port(port)),
                # The proxied node tells the cluster (and so its replica and every client) to
                # reach it through the proxy; its bus stays direct.
                *(("--cluster-announce-port", str(PROXY_PORT)) if port == PROXIED else ()),
                *(("--cluster-announce-bus-port", str(bus_port(port))) if port == PROXIED else ()),
            ),
        )
        for port in PORTS
    }
    proxy = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("link_cut_proxy.py")),
            str(PROXY_PORT),
            str(PROXIED),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert proxy.stdout is not None and proxy.stdout.readline().strip() == b"ready"
        for node in nodes.values():
            node.start()
        cluster = Cluster(nodes, proxy)
        subprocess.run(
            [
                redis_cli(),
                *("--cluster", "create", *cluster.connection.split(",")),
                *("--cluster-replicas", "1", "--cluster-yes"),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )

        def three_synced_replicas() -> bool:
            roles = [cluster.role(p) for p in PORTS]
            synced = [r for r in roles if r["role"] == "slave" and r["master_link_status"] == "up"]
            return len(synced) == 3 and cluster.healthy()

        assert wait_until(three_synced_replicas, timeout_s=30, interval_s=0.1), (
            "the cluster did not reach cluster_state:ok with 3 synced replicas"
        )
        if cluster.role(PROXIED)["role"] != "master":  # make the proxied node a primary
            redis.Redis(port=PROXIED).cluster("failover")
            assert wait_until(
                lambda: cluster.role(PROXIED)["role"] == "master" and three_synced_replicas(),
                timeout_s=30,
                interval_s=0.1,
            ), "the proxied node did not become a primary"
        yield cluster
    finally:
        for node in nodes.values():
            node.stop()
        proxy.terminate()
        try:
            proxy.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait(timeout=10)


@dataclass
class WriterLog:
    batches_done: int = 0
    attempts: int = 0
    retried: list[str] = field(default_factory=list)
    final_error: BaseException | None = None


def written_batch(index: int, computed_at: pd.Timestamp) -> pd.DataFrame:
    """Batch ``index``: user ``FIRST_WRITTEN_USER + index``, each key written by one batch only,
    so a row the store loses is not written again by a later batch."""
    user = FIRST_WRITTEN_USER + index
    vectors = np.stack([written_vector(user, i) for i in WRITTEN_ITEMS.tolist()])
    return pair_frame(
        user, WRITTEN_ITEMS, vectors, computed_at=computed_at + pd.Timedelta(seconds=index)
    )


def write_batches(
    store: object, computed_at: pd.Timestamp, stop: threading.Event, log: WriterLog
) -> None:
    """Batches of new keys until ``stop`` is set. A batch that fails with a retryable error is
    written again after a backoff (what a task retry does); a final error ends the writer."""
    writer = EmbeddingWriter(store, "solaris_pair", offline=False)  # type: ignore[arg-type]
    try:
        while not stop.is_set() and log.batches_done < MAX_BATCHES:
            frame = written_batch(log.batches_done, computed_at)
            backoff, give_up_at = 0.05, time.monotonic() + 30
            while True:
                log.attempts += 1
                try:
                    writer.write(frame)
                    break
                except Exception as exc:
                    if not is_retryable(exc) or time.monotonic() > give_up_at:
                        raise
                    log.retried.append(type(exc).__name__)
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 0.4)
            log.batches_done += 1
    except BaseException as exc:
        log.final_error = exc
    finally:
        writer.close()


@dataclass
class Fetch:
    at: float
    elapsed_ms: float
    error: bool
    all_zero: bool
    exact_and_right: bool


@pytest.fixture
def frozen_garbage() -> Iterator[None]:
    """Move what the suite allocated so far out of the collector's reach for this test: a full
    collection over a whole test session's objects pauses this process for hundreds of
    milliseconds (seen in the suite as 600-700 ms fetches, never when the test runs alone),
    which would be the interpreter's pause, not the retriever's deadline, that is measured."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@pytest.mark.usefixtures("frozen_garbage")
def test_primary_killed_while_serving_and_writing(
    replicated_cluster: Cluster, tmp_path: Path
) -> None:
    cluster = replicated_cluster
    project = f"cl_failover_{uuid.uuid4().hex[:8]}"
    store = cluster_store(project, tmp_path / "repo", cluster.connection)
    store.apply(solaris_definitions().all())
    computed_at = pd.Timestamp.now(tz="UTC").floor("s") - pd.Timedelta(minutes=10)
    seed = EmbeddingWriter(store, "solaris_pair", offline=False)
    for user in SERVED_USERS:
        vectors = np.stack([served_vector(user, i) for i in SERVED_ITEMS.tolist()])
        seed.write(pair_frame(user, SERVED_ITEMS, vectors, computed_at=computed_at))
    seed.close()

    layout = EntityKeyLayout(["user_id", "item_id"], store.config.entity_key_serialization_version)
    victim = PROXIED
    replica = cluster.replica_of(victim)
    retriever = SolarisRetriever(store, VERSION, deadline_ms=DEADLINE_MS)
    # Two unknown items per request: a fetch also queues misses, on the cluster too.
    requested = np.concatenate([SERVED_ITEMS, [900, 901]])

    fetches: list[Fetch] = []

    def serve(user: int) -> Fetch:
        started = time.perf_counter()
        result = retriever.fetch(user, requested)
        elapsed_ms = (time.perf_counter() - started) * 1000
        expected = np.stack([served_vector(user, i) for i in SERVED_ITEMS.tolist()])
        exact = bool(
            (result.tiers[: len(SERVED_ITEMS)] == Tier.EXACT).all()
            and np.array_equal(result.embeddings[: len(SERVED_ITEMS)], expected)
        )
        fetch = Fetch(
            time.monotonic(),
            elapsed_ms,
            result.error,
            bool((result.tiers == Tier.ZERO).all() and not result.embeddings.any()),
            exact,
        )
        fetches.append(fetch)
        return fetch

    for user in SERVED_USERS:
        assert serve(user).exact_and_right, "the cluster did not serve before the failure"

    stop = threading.Event()
    log = WriterLog()
    writer = threading.Thread(target=write_batches, args=(store, computed_at, stop, log))
    writer.start()
    killed_at = recovered_at = None
    try:
        assert wait_until(lambda: log.batches_done >= 20, timeout_s=30), "the writer never ran"
        # A primary that stops answering (frozen, not dead) must not hold a fetch past its
        # deadline either; it comes back before the cluster gives up on it.
        cluster.nodes[victim].freeze()
        frozen_until = time.monotonic() + 0.4
        while time.monotonic() < frozen_until:
            serve(SERVED_USERS[len(fetches) % len(SERVED_USERS)])
        cluster.nodes[victim].thaw()
        assert wait_until(cluster.healthy, timeout_s=10), "the cluster did not settle"
        # The replica loses its link to the primary, which goes on acknowledging writes, and
        # dies before the replica reconnects: what it acknowledged since was never replicated.
        unreplicated = cut_replication_then_kill(cluster, victim, log)
        killed_at = time.monotonic()

        users = list(SERVED_USERS)
        while time.monotonic() < killed_at + 60:
            round_ok = [serve(u).exact_and_right for u in users]
            if all(round_ok) and cluster.healthy():
                recovered_at = time.monotonic()
                break
        assert recovered_at is not None, "serving did not recover within 60 s of the kill"
        batches_at_recovery = log.batches_done
        wait_until(
            lambda: (
                log.batches_done >= batches_at_recovery + BATCHES_AFTER_RECOVERY
                or log.final_error is not None
            ),
            timeout_s=60,
            interval_s=0.05,
        )
    finally:
        stop.set()
        writer.join(timeout=90)
        retriever.close()
    assert not writer.is_alive(), "the writer did not stop"
    assert log.final_error is None, f"the writer failed for good: {log.final_error!r}"

    # Serving: within the deadline throughout; ZERO with the error flag while slots moved.
    during = [f for f in fetches if killed_at <= f.at <= recovered_at]
    errors = [f for f in during if f.error]
    assert errors, "no fetch saw the failover: the kill did not reach the serving path"
    assert all(f.all_zero for f in errors), "an error answer carried non-zero embeddings"
    assert all(f.exact_and_right for f in fetches if not f.error), "a fetch served wrong vectors"
    slowest = max(f.elapsed_ms for f in fetches)
    assert slowest <= DEADLINE_MS + DEADLINE_SLACK_MS, f"a fetch took {slowest:.0f} ms"
    assert new_primary_is(cluster, replica)

    # Writes: every row the writer was told is stored is there, whole, once.
    assert log.retried, "the writer never saw the failure"
    codec = FloatListCodec(DIM)
    written_keys = set()
    lost = []
    with cluster.client() as client:
        for index in range(log.batches_done):
            batch = written_batch(index, computed_at)
            for item, vector in zip(batch.item_id.tolist(), batch.embedding, strict=True):
                key = layout.key(int(batch.user_id.iloc[0]), item) + project.encode()
                written_keys.add(key)
                row = client.hgetall(key)
                if not row:
                    lost.append((index, item))
                    continue
                stored = codec.decode(row.get(online_field("solaris_pair", "embedding")))
                np.testing.assert_array_equal(stored, vector, err_msg=f"batch {index}")
                assert_row_of_time(row, batch.computed_at.iloc[0])
        assert not lost, f"{len(lost)} acknowledged rows lost (batch, item): {lost[:10]}"
        keys_per_primary = [
            set(redis.Redis(port=int(node.port)).scan_iter(match=f"*{project}", count=1000))
            for node in client.get_primaries()
        ]
    every_key = [k for keys in keys_per_primary for k in keys]
    assert len(every_key) == len(set(every_key)), "a key is held by two primaries"
    served_keys = {layout.key(u, i) + project.encode() for u in SERVED_USERS for i in range(20)}
    assert set(every_key) == written_keys | served_keys
    print(
        f"\nfailover: killed {victim}, promoted {replica}; recovered in "
        f"{recovered_at - killed_at:.2f} s; {len(errors)}/{len(during)} fetches errored; "
        f"slowest fetch {slowest:.1f} ms; writer {log.batches_done} batches "
        f"({unreplicated} acknowledged while the link was cut), "
        f"{len(log.retried)} retries ({sorted(set(log.retried))})"
    )


def test_write_waits_for_the_replica_its_primary_has_not_the_slot_map(
    replicated_cluster: Cluster, tmp_path: Path
) -> None:
    """``CLUSTER SLOTS`` leaves out a replica its answering node has not yet heard report an
    offset (for a second or so after the replica syncs) and one flagged failing. A writer whose
    slot map was read then must still wait for the replica the primary has: with every replica
    taken out of its map, a write to the primary whose replication link is cut fails as
    retryable instead of being acknowledged unreplicated, and the other primaries' rows are
    on their replicas when the write returns."""
    cluster = replicated_cluster
    project = f"cl_wait_{uuid.uuid4().hex[:8]}"
    store = cluster_store(project, tmp_path / "repo", cluster.connection)
    store.apply(solaris_definitions().all())
    backend = backend_for(store, timeout_seconds=WRITE_TIMEOUT_SECONDS)
    assert isinstance(backend, RedisClusterBackend)
    slots = backend.client.nodes_manager.slots_cache
    for slot, nodes in slots.items():
        slots[slot] = nodes[:1]  # the map as read before any replica's offset was heard
    layout = EntityKeyLayout(["user_id", "item_id"], store.config.entity_key_serialization_version)
    victim = f"127.0.0.1:{cluster.announced(PROXIED)}"

    def primary_of(user: int, item: int) -> str:
        return str(backend._primary_of(layout.key(user, item) + project.encode()).name)

    # A batch with rows on the victim and on another primary.
    user = next(
        u
        for u in range(FIRST_WRITTEN_USER, FIRST_WRITTEN_USER + 1000)
        if len({primary_of(u, i) == victim for i in WRITTEN_ITEMS.tolist()}) == 2
    )
    computed_at = pd.Timestamp.now(tz="UTC").floor("s")
    vectors = np.stack([written_vector(user, i) for i in WRITTEN_ITEMS.tolist()])
    others = [i for i in WRITTEN_ITEMS.tolist() if primary_of(user, i) != victim]
    writer = EmbeddingWriter(store, "solaris_pair", offline=False, backend=backend)
    try:
        healthy = pair_frame(user, WRITTEN_ITEMS, vectors, computed_at=computed_at)
        assert writer.write(healthy).online_applied == len(WRITTEN_ITEMS)
        for item in others:  # WAIT returned: each row is on its primary's replica already
            key = layout.key(user, item) + project.encode()
            primary = int(primary_of(user, item).rsplit(":", 1)[1])
            on_replica = redis.Redis(port=cluster.replica_of(primary))
            on_replica.execute_command("READONLY")
            assert on_replica.hexists(key, b"_ts:solaris_pair"), f"item {item} not replicated"
        cluster.cut_replication()
        later = pair_frame(
            user, WRITTEN_ITEMS, vectors, computed_at=computed_at + pd.Timedelta(1, "s")
        )
        with pytest.raises(RetryableStoreError, match="replicas acknowledged"):
            writer.write(later)
    finally:
        writer.close()


def cut_replication_then_kill(cluster: Cluster, victim: int, log: WriterLog) -> int:
    """Cut the replication link of ``victim``, let it acknowledge a few batches its replica
    never gets, and SIGKILL it. Returns how many batches were acknowledged after the cut."""
    before = log.batches_done
    cluster.cut_replication()
    cut_at = time.monotonic()
    while log.batches_done < before + 5 and time.monotonic() < cut_at + 1.5:
        time.sleep(0.005)  # the writer needs the GIL more than serving does here
    cluster.nodes[victim].kill()
    return log.batches_done - before


def new_primary_is(cluster: Cluster, port: int) -> bool:
    return redis.Redis(port=port).info("replication").get("role") == "master"


def assert_row_of_time(row: dict[bytes, bytes], computed_at: pd.Timestamp) -> None:
    """The row's version, ``computed_at`` and Feast event timestamp are all of its batch."""
    from feast.protos.feast.types.Value_pb2 import Value as ValueProto
    from google.protobuf.timestamp_pb2 import Timestamp

    version = ValueProto()
    version.ParseFromString(row[online_field("solaris_pair", "model_version")])
    assert version.string_val == stored_model_version(VERSION)  # the online store's tag
    stamp = ValueProto()
    stamp.ParseFromString(row[online_field("solaris_pair", "computed_at")])
    assert stamp.unix_timestamp_val == int(computed_at.timestamp())
    event = Timestamp()
    event.ParseFromString(row[b"_ts:solaris_pair"])
    assert event.seconds == int(computed_at.timestamp())
