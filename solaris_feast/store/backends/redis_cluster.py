"""Redis Cluster (``redis_type: redis_cluster``): Feast's layout, spread over the cluster's slots.

Keys live on many nodes, so no single connection can take the packed pipeline of
:mod:`.redis`: reads and writes go through redis-py's cluster pipeline, which groups commands by
node (one round trip per node holding some of the keys). Each receive is bounded by the client's
socket timeout (the reader's deadline) and the whole read is checked against the deadline after.

Writes: one script call per key, since a cluster runs a script on one slot and keys spread over
all of them. Each row stays atomic (no torn row); a batch is not atomic on a cluster.

The miss queue's keys share the hash tag ``{project}``, so they sit on one slot and its scripts
run as on one Redis; the status scan visits every primary.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from solaris_feast.errors import DeadlineExceededError
from solaris_feast.store.backends import BackendKind, OnlineBatch, TierReads, split_tiers
from solaris_feast.store.backends.redis import WRITE_SCRIPT, RedisBackend, connection_kwargs
from solaris_feast.store.ids import EntityId
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from feast import FeatureStore


def cluster_client(store: FeatureStore, timeout_seconds: float | None) -> Any:
    """A ``RedisCluster`` on the store's startup nodes, with no retries."""
    from redis.backoff import NoBackoff
    from redis.cluster import ClusterNode, RedisCluster
    from redis.retry import Retry

    nodes, kwargs = connection_kwargs(store)
    kwargs.pop("db", None)  # a cluster has database 0 only
    return RedisCluster(
        startup_nodes=[ClusterNode(n["host"], int(n["port"])) for n in nodes],
        socket_timeout=timeout_seconds,
        socket_connect_timeout=timeout_seconds,
        retry=Retry(NoBackoff(), 0),
        **kwargs,
    )


class RedisClusterBackend(RedisBackend):
    """A Redis Cluster; the miss queue and the scan are the single-Redis ones."""

    kind: BackendKind = "redis_cluster"

    @classmethod
    def for_store(cls, store: FeatureStore, timeout_seconds: float | None) -> RedisClusterBackend:
        return cls(
            cluster_client(store, timeout_seconds),
            store.config.project,
            store.config.entity_key_serialization_version,
        )

    def read_tiers(
        self, user: EntityId, items: np.ndarray, views: Mapping[Tier, str], deadline_s: float
    ) -> TierReads:
        started = time.perf_counter()
        pair_fields, user_fields = self.read_fields(views)
        project = self.project.encode()
        pipe = self.client.pipeline()
        for item in items.tolist():
            pipe.execute_command("HMGET", self.pair_key.key(user, item) + project, *pair_fields)
        pipe.execute_command("HMGET", self.user_key.key(user) + project, *user_fields)
        pipe.execute_command("GET", self._round_key.encode())
        replies = list(pipe.execute(raise_on_error=True))
        if time.perf_counter() > deadline_s:
            raise DeadlineExceededError("Redis Cluster read", (deadline_s - started) * 1000.0)
        return TierReads(split_tiers(replies[:-2], replies[-2], len(items)), replies[-1])

    def write_batch(self, batch: OnlineBatch, *, chunk_rows: int, atomic_rows: int) -> int:
        sha = self.client.script_load(WRITE_SCRIPT)  # on every primary
        head = self._write_head(batch)
        project = self.project.encode()
        timestamps = self._timestamps(batch.event_ts_ns)
        pipe = self.client.pipeline()
        for i, key in enumerate(batch.keys):
            # execute_command: redis-py blocks the evalsha method on cluster pipelines, not the
            # command, which it routes by its one key.
            pipe.execute_command(
                "EVALSHA", sha, 1, key + project, *head, timestamps[i], *batch.values[i]
            )
        return sum(int(r) for r in pipe.execute(raise_on_error=True))
