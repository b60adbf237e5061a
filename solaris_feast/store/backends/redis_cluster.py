"""Redis Cluster (``redis_type: redis_cluster``): Feast's layout, spread over the cluster's slots.

Keys live on many nodes, so no single connection can take the packed pipeline of
:mod:`.redis`. Commands are grouped by the node that serves their slot (redis-py's slot map),
and each node gets one round trip on a plain connection to it; none of redis-py's cluster
retries run (they re-send failed commands one by one, each refreshing the slot map and some
sleeping 250 ms, which no deadline survives). Any error fails the call at once, as the
retryable or final error it is (a MOVED or CLUSTERDOWN during a failover is retryable), and
refreshes the slot map: in the background for a read, before the error is raised for a write.

Reads: the packed HMGETs of :mod:`.redis` per node, each on a deadline connection whose connect,
send and receives get only what is left of the deadline.

Writes: one script call per key, since a cluster runs a script on one slot and keys spread over
all of them. Each row stays atomic (no torn row); a batch is not atomic on a cluster. Each node's
round trip loads the script first (a promoted replica has no script cache: Redis does not
replicate ``SCRIPT LOAD``) and asks the primary for its ``ROLE``: where the primary has a replica
online, a write counts as done only when one replica has it (``WAIT``, on the same connection,
in the same round trip once the node is known to have one). Replication is asynchronous, so
without it a primary that dies right after acknowledging loses the rows at failover, and nobody
writes them again; a ``WAIT`` that times out raises a retryable error and the rewrite is
idempotent. Whether to wait is the primary's own answer, not the slot map's: ``CLUSTER SLOTS``
leaves out a replica the answering node has not yet heard report an offset (for a second or so
after it syncs) and one flagged failing, and a map read then would acknowledge every later write
to that shard unreplicated (seen: a writer started 0.4 s after its cluster lost 17 acknowledged
rows at the failover).

The miss queue's keys share the hash tag ``{project}``, so they sit on one slot and its scripts
run as on one Redis (through redis-py's cluster client); the status scan visits every primary.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from solaris_feast.errors import RetryableStoreError, describe_error, is_retryable
from solaris_feast.store.backends import (
    BackendKind,
    OnlineBatch,
    OnlineFacts,
    ReadsOneRequestAtATime,
    TierReads,
    online_facts,
    split_tiers,
)
from solaris_feast.store.backends.redis import (
    WRITE_SCRIPT,
    DeadlineConnections,
    RedisBackend,
    _hmget_template,
    bulk,
    connection_kwargs,
)
from solaris_feast.store.ids import EntityId
from solaris_feast.store.layout import DEFAULT_TRANSACTIONS_IN_FLIGHT
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from feast import FeatureStore

logger = logging.getLogger(__name__)

REPLICA_ACK_TIMEOUT_MS = 1000
"""How long a write waits for a replica to acknowledge it before it fails as retryable."""
_WRITE_SHA = hashlib.sha1(WRITE_SCRIPT.encode()).hexdigest()


def cluster_client(store: FeatureStore | OnlineFacts, timeout_seconds: float | None) -> Any:
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


class RedisClusterBackend(ReadsOneRequestAtATime, RedisBackend):
    """A Redis Cluster; the miss queue and the scan are the single-Redis ones.

    Args:
        client: a redis-py ``RedisCluster``.
        project: the Feast project.
        serialization_version: Feast's ``entity_key_serialization_version``.
        replica_ack_timeout_ms: how long a write waits for a replica (``WAIT``).
    """

    kind: BackendKind = "redis_cluster"

    def __init__(
        self,
        client: Any,
        project: str,
        serialization_version: int = 3,
        *,
        replica_ack_timeout_ms: int = REPLICA_ACK_TIMEOUT_MS,
    ) -> None:
        super().__init__(client, project, serialization_version)
        self.replica_ack_timeout_ms = replica_ack_timeout_ms
        self._node_reads: dict[str, DeadlineConnections] = {}
        self._reads_lock = threading.Lock()
        self._refreshing = threading.Event()
        self._replicas_online: dict[str, int] = {}
        """Per primary, its online replicas as its last ``ROLE`` said (none known: ask first)."""

    @classmethod
    def for_store(
        cls, store: FeatureStore | OnlineFacts, timeout_seconds: float | None
    ) -> RedisClusterBackend:
        facts = online_facts(store)
        return cls(
            cluster_client(facts, timeout_seconds), facts.project, facts.serialization_version
        )

    # -- the slot map -------------------------------------------------------------------------

    def _primary_of(self, key: bytes | str) -> Any:
        """The primary serving ``key``'s slot, by redis-py's slot map."""
        from redis.exceptions import SlotNotCoveredError

        slot = self.client.keyslot(key)
        nodes = self.client.nodes_manager.slots_cache.get(slot)
        if not nodes:
            raise SlotNotCoveredError(f"slot {slot} is not covered by the cluster's slot map")
        return nodes[0]

    def _refresh_slot_map(self) -> None:
        try:
            self.client.nodes_manager.initialize()
        except Exception as exc:  # the next call fails and refreshes again
            logger.warning("Redis Cluster slot map refresh failed: %r", exc)

    def _refresh_in_background(self) -> None:
        """One refresh at a time, off the request path: reads keep their deadline."""
        if self._refreshing.is_set():
            return
        self._refreshing.set()

        def run() -> None:
            try:
                self._refresh_slot_map()
            finally:
                self._refreshing.clear()

        threading.Thread(target=run, name="solaris-cluster-slot-map", daemon=True).start()

    # -- reading ------------------------------------------------------------------------------

    def _reads_on(self, node: Any) -> DeadlineConnections:
        with self._reads_lock:
            if node.name not in self._node_reads:
                self._node_reads[node.name] = DeadlineConnections(
                    self.client.get_redis_connection(node)
                )
            return self._node_reads[node.name]

    def read_tiers(
        self, user: EntityId, items: np.ndarray, views: Mapping[Tier, str], deadline_s: float
    ) -> TierReads:
        deadline_ms = self._deadline_ms(deadline_s)
        pair_fields, user_fields = self.read_fields(views)
        project = self._project_bytes
        pair_head, pair_tail = _hmget_template(pair_fields)
        user_head, user_tail = _hmget_template(user_fields)
        commands = [
            (self.pair_key.key(user, item) + project, pair_head, pair_tail)
            for item in items.tolist()
        ]
        commands.append((self.user_key.key(user) + project, user_head, user_tail))
        replies: list[Any] = [None] * (len(commands) + 1)
        try:
            by_node: dict[str, tuple[Any, list[int], list[bytes]]] = {}
            for position, (key, head, tail) in enumerate(commands):
                node = self._primary_of(key)
                entry = by_node.setdefault(node.name, (node, [], []))
                entry[1].append(position)
                entry[2].append(b"%s%s%s" % (head, bulk(key), tail))
            round_node = self._primary_of(self._round_key)
            entry = by_node.setdefault(round_node.name, (round_node, [], []))
            entry[1].append(len(commands))
            entry[2].append(self._round_command)
            for node, positions, parts in by_node.values():
                answers = self._reads_on(node).round_trip(
                    b"".join(parts), len(parts), deadline_s, deadline_ms
                )
                for position, answer in zip(positions, answers, strict=True):
                    if isinstance(answer, Exception):
                        raise answer
                    replies[position] = answer
        except Exception:
            self._refresh_in_background()
            raise
        return TierReads(split_tiers(replies[:-2], replies[-2], len(items)), replies[-1])

    # -- writing ------------------------------------------------------------------------------

    def write_batch(
        self,
        batch: OnlineBatch,
        *,
        chunk_rows: int,
        atomic_rows: int,
        in_flight: int = DEFAULT_TRANSACTIONS_IN_FLIGHT,
    ) -> int:
        # in_flight is the single node's: here each node's rows go in one pipeline already.
        import redis

        head = self._write_head(batch)
        project = self._project_bytes
        timestamps = self._timestamps(batch.event_ts_ns).tolist()
        keys, values = batch.keys.tolist(), batch.rows()
        by_node: dict[str, tuple[Any, list[int]]] = {}
        try:
            for i, key in enumerate(keys):
                node = self._primary_of(key + project)
                by_node.setdefault(node.name, (node, []))[1].append(i)
        except redis.RedisError:
            self._refresh_slot_map()
            raise
        applied = 0
        for node, rows in by_node.values():
            commands: list[tuple[Any, ...]] = [("SCRIPT", "LOAD", WRITE_SCRIPT)]
            for i in rows:
                commands.append(
                    ("EVALSHA", _WRITE_SHA, 1, keys[i] + project, *head, timestamps[i], *values[i])
                )
            where = f"{batch.view_name}: {len(rows)} of {len(keys)} rows on {node.name}"
            try:
                answers, replicas, acked = self._write_on(node, commands)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if not is_retryable(exc):
                    raise
                self._refresh_slot_map()
                raise RetryableStoreError(
                    f"{where}: the node failed ({describe_error(exc)}); write the batch again "
                    "(rewrites are idempotent)"
                ) from exc
            for answer in answers:
                if isinstance(answer, Exception):
                    if not is_retryable(answer):
                        raise answer
                    self._refresh_slot_map()
                    raise RetryableStoreError(
                        f"{where}: {answer!r} (the cluster is moving slots); write the batch "
                        "again (rewrites are idempotent)"
                    ) from answer
            if replicas and acked < 1:
                self._refresh_slot_map()
                raise RetryableStoreError(
                    f"{where}: written on the primary, but none of its {replicas} replicas "
                    f"acknowledged them within {self.replica_ack_timeout_ms} ms, so a failover "
                    "could lose them; write the batch again (rewrites are idempotent)"
                )
            applied += sum(int(a) for a in answers[1:])
        return applied

    def _write_on(self, node: Any, commands: list[tuple[Any, ...]]) -> tuple[list[Any], int, int]:
        """Send ``commands`` to primary ``node`` in one round trip, with ``ROLE`` after them and,
        where the node is known to have a replica online, ``WAIT``; a node that turns out to have
        one gets its ``WAIT`` in a second round trip on the same connection (``WAIT`` covers
        the writes of its own connection only). Returns the commands' replies (error replies as
        exceptions), the replicas the primary has online and how many acknowledged the writes."""
        import redis

        wait = ("WAIT", 1, self.replica_ack_timeout_ms)
        known = self._replicas_online.get(node.name, 0) > 0
        sent = [*commands, ("ROLE",), *((wait,) if known else ())]
        pool = self.client.get_redis_connection(node).connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command(conn.pack_commands(sent))
            replies = []
            for _ in sent:
                try:
                    replies.append(conn.read_response())
                except redis.ResponseError as exc:  # an error reply; the next ones still come
                    replies.append(exc)
            answers, role = replies[: len(commands)], replies[len(commands)]
            replicas = _online_replicas(role)
            acked = int(replies[-1]) if known and not isinstance(replies[-1], Exception) else 0
            failed = any(isinstance(a, Exception) for a in answers)  # raised by the caller
            if replicas and not known and not failed:
                conn.send_command(*wait)
                acked = int(conn.read_response())
        except BaseException:
            conn.disconnect()  # unread replies would reach the next command on it
            raise
        finally:
            pool.release(conn)
        self._replicas_online[node.name] = replicas
        return answers, replicas, acked

    def close(self) -> None:
        with self._reads_lock:
            reads, self._node_reads = self._node_reads, {}
        for connections in reads.values():
            connections.close()
        super().close()


def _online_replicas(role: Any) -> int:
    """Online replicas in a primary's ``ROLE`` reply (``[master, offset, [[ip, port, offset],
    ...]]``; Redis lists only replicas past their initial sync); 0 for any other reply."""
    if isinstance(role, list) and len(role) >= 3 and role[0] in (b"master", "master"):
        return len(role[2])
    return 0
