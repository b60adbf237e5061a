"""Redis Cluster: the retriever, the write path and the miss queue on a 3-node cluster give the
same answers as on a single Redis.

The cluster runs on loopback ports of this suite's block (:mod:`ports`), started by the test
and stopped in ``finally``.
Feast reaches it through ``redis_type: redis_cluster``; the same rows are written to the single
Redis of ``REDIS_URL`` and both are read back and compared, with Feast's own
``get_online_features`` on the cluster as a third witness.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster
from test_hardening_support import (
    CLUSTER_PORTS,
    DIM,
    VERSION,
    OwnedRedis,
    pair_frame,
    redis_cli,
    wait_until,
)

from solaris_feast.serving.retriever import SolarisRetriever
from solaris_feast.store.config import build_repo_config, open_store
from solaris_feast.store.definitions import solaris_definitions
from solaris_feast.store.write import EmbeddingWriter
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from feast import FeatureStore

CLUSTER_CONNECTION = ",".join(f"127.0.0.1:{p}" for p in CLUSTER_PORTS)


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[str]:
    nodes = [
        OwnedRedis(
            port,
            tmp_path / f"node-{port}",
            extra=(
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(tmp_path / f"nodes-{port}.conf"),
                "--cluster-node-timeout",
                "2000",
            ),
        )
        for port in CLUSTER_PORTS
    ]
    try:
        for node in nodes:
            node.start()
        subprocess.run(
            [
                redis_cli(),
                "--cluster",
                "create",
                *CLUSTER_CONNECTION.split(","),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )

        def cluster_ok() -> bool:
            return all(
                redis.Redis(port=port).cluster("info").get("cluster_state") == "ok"
                for port in CLUSTER_PORTS
            )

        assert wait_until(cluster_ok, timeout_s=15), "the cluster did not reach cluster_state:ok"
        yield CLUSTER_CONNECTION
    finally:
        for node in nodes:
            node.stop()


def cluster_store(project: str, repo: Path, connection: str) -> FeatureStore:
    from feast import FeatureStore, RepoConfig

    single = build_repo_config(project, repo, online="redis")
    config = single.model_dump(exclude={"online_store", "online_config"}, by_alias=True)
    (repo / "data").mkdir(parents=True, exist_ok=True)
    return FeatureStore(
        config=RepoConfig(
            **{
                **config,
                "online_store": {
                    "type": "redis",
                    "redis_type": "redis_cluster",
                    "connection_string": connection,
                },
            }
        )
    )


def write_everything(store: FeatureStore, computed_at: pd.Timestamp) -> None:
    rng = np.random.default_rng(9)
    pairs = EmbeddingWriter(store, "solaris_pair", offline=False)
    similars = EmbeddingWriter(store, "solaris_similar", offline=False)
    for user in range(1, 6):
        items = np.arange(20 * user, 20 * user + 12)
        pairs.write(
            pair_frame(user, items[:6], rng.standard_normal((6, DIM)), computed_at=computed_at)
        )
        similar = pair_frame(
            user, items[4:9], rng.standard_normal((5, DIM)), computed_at=computed_at
        )
        similar["neighbour_count"] = np.full(5, 3, dtype=np.int64)
        similar["mean_distance"] = np.linspace(0.1, 0.5, 5)
        similars.write(similar)
    odd_users = np.array([1, 3, 5], dtype=np.int64)
    EmbeddingWriter(store, "solaris_user", offline=False).write(
        pd.DataFrame(
            {
                "user_id": odd_users,
                "embedding": list(rng.standard_normal((3, DIM)).astype(np.float32)),
                "pair_count": np.full(3, 6, dtype=np.int64),
                "model_version": VERSION,
                "computed_at": computed_at,
            }
        )
    )
    # A version from another embedding space, which both must treat as a miss.
    pairs.write(
        pair_frame(
            2, [50], rng.standard_normal((1, DIM)), version="cmp-other", computed_at=computed_at
        )
    )
    pairs.close()
    similars.close()


def test_cluster_serves_and_writes_exactly_like_a_single_redis(
    redis_cluster: str, tmp_path: Path, feast_project: str, redis_url: str
) -> None:
    computed_at = pd.Timestamp.now(tz="UTC").floor("s") - pd.Timedelta(minutes=5)
    definitions = solaris_definitions().all()
    single = open_store(feast_project, tmp_path / "single", online="redis", redis_url=redis_url)
    single.apply(definitions)
    cluster = cluster_store(feast_project, tmp_path / "cluster", redis_cluster)
    cluster.apply(definitions)
    write_everything(single, computed_at)
    write_everything(cluster, computed_at)

    nodes_client = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in CLUSTER_PORTS])
    keys_per_node = [redis.Redis(port=port).dbsize() for port in CLUSTER_PORTS]
    assert all(n > 0 for n in keys_per_node), f"keys did not spread over the nodes: {keys_per_node}"

    on_single = SolarisRetriever(single, VERSION, deadline_ms=2000)
    on_cluster = SolarisRetriever(cluster, VERSION, deadline_ms=2000)
    for user in range(1, 7):
        items = np.arange(20 * user - 2, 20 * user + 14)
        a = on_single.fetch(user, items)
        b = on_cluster.fetch(user, items)
        assert not a.error and not b.error
        np.testing.assert_array_equal(a.tiers, b.tiers)
        np.testing.assert_array_equal(a.embeddings, b.embeddings)
        np.testing.assert_allclose(a.age_seconds, b.age_seconds, atol=5.0)
        if user <= 5:
            assert {Tier.EXACT, Tier.SIMILAR} <= set(b.tiers.tolist())
            assert (Tier.USER_AGG in b.tiers.tolist()) == bool(user % 2)
    assert on_cluster.fetch(2, [50]).tiers.tolist() == [Tier.ZERO]  # other version: a miss

    # Feast's own cluster reader sees the bytes our writer put on the cluster.
    feast_rows = cluster.get_online_features(
        features=["solaris_pair:embedding"], entity_rows=[{"user_id": 3, "item_id": 60}]
    ).to_dict()
    np.testing.assert_array_equal(
        np.asarray(feast_rows["embedding"][0], dtype=np.float32),
        on_cluster.fetch(3, [60]).embeddings[0],
    )

    # Misses were queued the same way, and the queue drains the same pairs.
    assert on_single.miss_queue is not None and on_cluster.miss_queue is not None
    single_misses = on_single.miss_queue.drain()
    cluster_misses = on_cluster.miss_queue.drain()
    assert len(cluster_misses) > 0
    assert sorted(zip(single_misses.user_id, single_misses.item_id, strict=True)) == sorted(
        zip(cluster_misses.user_id, cluster_misses.item_id, strict=True)
    )

    # Newest wins on the cluster too: an older rewrite is dropped, a newer one lands.
    older = pair_frame(1, [20], np.zeros((1, DIM)), computed_at=computed_at - pd.Timedelta("1h"))
    assert EmbeddingWriter(cluster, "solaris_pair", offline=False).write(older).online_applied == 0
    newer = pair_frame(1, [20], np.ones((1, DIM)), computed_at=computed_at + pd.Timedelta("1s"))
    assert EmbeddingWriter(cluster, "solaris_pair", offline=False).write(newer).online_applied == 1
    assert (on_cluster.fetch(1, [20]).embeddings == 1).all()

    # Feast's teardown clears the project's queue on a cluster too: stream, round and markers,
    # all under the project's hash tag, are gone from every node.
    on_cluster.fetch(4, [900, 901])  # two more misses: a stream entry and a marker each
    queue_keys = f"*{{{feast_project}}}*"
    assert any(redis.Redis(port=port).keys(queue_keys) for port in CLUSTER_PORTS)
    assert on_cluster.miss_queue.backend.clear_miss_queue() >= 3
    assert not any(redis.Redis(port=port).keys(queue_keys) for port in CLUSTER_PORTS)
    assert on_cluster.miss_queue.pending() == 0
    on_single.close()
    on_cluster.close()
    nodes_client.close()
