"""Where the Feast store lives: SQLite (embedded default) or Redis, chosen at run time.

``feature_repo/feature_store.yaml`` is the SQLite default; ``feature_repo/feature_store.redis.yaml``
reads its connection from ``SOLARIS_REDIS_CONNECTION`` (Feast expands environment variables in
the yaml), which :func:`export_redis_connection` derives from ``REDIS_URL``, so a password never
sits in a file. Tests and benchmarks build the same configuration in code with
:func:`build_repo_config`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote, urlparse

from solaris_feast.errors import ConfigError

if TYPE_CHECKING:
    from feast import FeatureStore, RepoConfig

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
REDIS_CONNECTION_ENV = "SOLARIS_REDIS_CONNECTION"
OnlineKind = Literal["sqlite", "redis"]


def redis_connection_string(redis_url: str) -> str:
    """Turn ``redis://[user:password@]host:port/db`` into Feast's ``host:port,db=N,...`` form."""
    parsed = urlparse(redis_url)
    if parsed.scheme not in ("redis", "rediss"):
        raise ConfigError(f"REDIS_URL must start with redis:// or rediss://, got {redis_url!r}")
    host = parsed.hostname or "127.0.0.1"
    port = parsed.port or 6379
    parts = [f"{host}:{port}"]
    db = parsed.path.lstrip("/")
    if db:
        if not db.isdigit():
            raise ConfigError(f"REDIS_URL database must be a number, got {db!r}")
        parts.append(f"db={db}")
    if parsed.username:
        parts.append(f"username={unquote(parsed.username)}")
    if parsed.password:
        parts.append(f"password={unquote(parsed.password)}")
    if parsed.scheme == "rediss":
        parts.append("ssl=true")
    return ",".join(parts)


def export_redis_connection(redis_url: str | None = None) -> str:
    """Set ``SOLARIS_REDIS_CONNECTION`` from ``REDIS_URL`` for ``feature_store.redis.yaml``."""
    connection = redis_connection_string(
        redis_url or os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
    )
    os.environ[REDIS_CONNECTION_ENV] = connection
    return connection


def build_repo_config(
    project: str,
    repo_path: Path,
    online: OnlineKind = "sqlite",
    redis_url: str | None = None,
    key_ttl_seconds: int | None = None,
) -> RepoConfig:
    """A local-provider configuration equal to the one in ``feature_repo/``.

    Args:
        project: Feast project name; it namespaces every online key and table.
        repo_path: folder holding the registry, the SQLite file and the offline parquet.
        online: ``"sqlite"`` (embedded) or ``"redis"`` (connection from ``redis_url`` or
            ``REDIS_URL``).
        key_ttl_seconds: Redis only; expires a whole entity hash (every view of the key).
    """
    from feast import RepoConfig

    repo_path = Path(repo_path).resolve()
    online_store: dict[str, object]
    if online == "sqlite":
        online_store = {"type": "sqlite", "path": str(repo_path / "data" / "online.db")}
    elif online == "redis":
        url = redis_url or os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
        online_store = {"type": "redis", "connection_string": redis_connection_string(url)}
        if key_ttl_seconds is not None:
            online_store["key_ttl_seconds"] = key_ttl_seconds
    else:
        raise ConfigError(f"online must be 'sqlite' or 'redis', got {online!r}")
    return RepoConfig(
        project=project,
        provider="local",
        registry={
            "registry_type": "file",
            "path": str(repo_path / "data" / "registry.db"),
            "cache_ttl_seconds": 60,
            "serve_features_while_materializing": True,
        },
        online_store=online_store,
        offline_store={"type": "file"},
        entity_key_serialization_version=3,
        repo_path=repo_path,
    )


def open_store(
    project: str,
    repo_path: Path,
    online: OnlineKind = "sqlite",
    redis_url: str | None = None,
) -> FeatureStore:
    """A ``FeatureStore`` over :func:`build_repo_config`; nothing is applied yet."""
    from feast import FeatureStore

    Path(repo_path, "data").mkdir(parents=True, exist_ok=True)
    return FeatureStore(
        config=build_repo_config(project, Path(repo_path), online=online, redis_url=redis_url)
    )


# --- How Feast lays values out in the online store -------------------------------------------
# The retriever and the writer talk to the online store directly (one round trip for all tiers,
# newest-wins writes), so they must produce and read exactly the bytes Feast does. Everything
# below is derived from Feast's own functions and checked against them when built.


class EntityKeyLayout:
    """Feast's serialized entity key for int64 join keys, built without a proto per row.

    ``feast.infra.key_encoding_utils.serialize_entity_key`` builds an ``EntityKeyProto`` per row,
    which costs more than the network read for 100 candidates. For int64 keys its output is a
    fixed prefix (sorted join key names) followed by one fixed-size block per value, so the bytes
    are assembled with ``struct``; the constructor checks the result against Feast's function.
    """

    def __init__(self, join_keys: list[str], serialization_version: int) -> None:
        import struct

        from feast.infra.key_encoding_utils import serialize_entity_key_prefix
        from feast.protos.feast.types.Value_pb2 import ValueType

        if serialization_version < 3:
            raise ConfigError(
                f"entity_key_serialization_version {serialization_version} is not supported; "
                "set entity_key_serialization_version: 3 in feature_store.yaml"
            )
        self.join_keys = list(join_keys)
        self.serialization_version = serialization_version
        self._sorted = sorted(self.join_keys)
        # Position of each sorted key in the caller's order.
        self._order = [self.join_keys.index(k) for k in self._sorted]
        self._prefix = serialize_entity_key_prefix(self._sorted, serialization_version)
        self._value_header = struct.pack("<II", ValueType.INT64, 8)
        self._pack = struct.Struct("<q").pack
        for sample in (
            [0] * len(join_keys),
            list(range(7, 7 + len(join_keys))),
            [2**40] * len(join_keys),
        ):
            if self.key(*sample) != self._feast_key(sample):
                raise ConfigError(
                    "Feast's entity key serialization changed; the fast key layout no longer "
                    f"matches it for join keys {join_keys}"
                )

    def _feast_key(self, values: list[int]) -> bytes:
        from feast.infra.key_encoding_utils import serialize_entity_key
        from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto
        from feast.protos.feast.types.Value_pb2 import Value as ValueProto

        proto = EntityKeyProto(
            join_keys=self.join_keys, entity_values=[ValueProto(int64_val=v) for v in values]
        )
        return serialize_entity_key(
            proto, entity_key_serialization_version=self.serialization_version
        )

    def key(self, *values: int) -> bytes:
        """Serialized key for join key values given in ``join_keys`` order."""
        parts = [self._prefix]
        for position in self._order:
            parts.append(self._value_header)
            parts.append(self._pack(values[position]))
        return b"".join(parts)


class FloatListCodec:
    """Feast's ``ValueProto(float_list_val=...)`` bytes for vectors of one length ``D``.

    A packed repeated float has a fixed header for a given ``D``, so encoding is header + the
    little-endian float32 bytes and decoding a ``np.frombuffer``. Values of any other shape (an
    older writer, another ``D``) fall back to parsing with ``ValueProto``.
    """

    def __init__(self, dim: int) -> None:
        from feast.protos.feast.types.Value_pb2 import FloatList
        from feast.protos.feast.types.Value_pb2 import Value as ValueProto

        self.dim = dim
        probe = ValueProto(float_list_val=FloatList(val=[0.0] * dim)).SerializeToString()
        self.header = probe[: len(probe) - 4 * dim]
        self.size = len(probe)
        check = ValueProto(float_list_val=FloatList(val=[1.5] * dim)).SerializeToString()
        import numpy as np

        if self.encode(np.full(dim, 1.5, dtype=np.float32)) != check:
            raise ConfigError("Feast's float list encoding changed; FloatListCodec is stale")

    def encode(self, vector: Any) -> bytes:
        """``vector``: ``(D,)`` float32 (little-endian on every platform Feast supports)."""
        import numpy as np

        return self.header + np.ascontiguousarray(vector, dtype="<f4").tobytes()

    def encode_rows(self, matrix: Any) -> list[bytes]:
        """``matrix``: ``(N, D)`` float32 -> N encoded values."""
        import numpy as np

        raw = np.ascontiguousarray(matrix, dtype="<f4").tobytes()
        step = 4 * self.dim
        header = self.header
        return [header + raw[i : i + step] for i in range(0, len(raw), step)]

    def decode(self, value: Any) -> Any:
        """``(D,)`` float32, or None when the value is empty, null, of another length or type,
        or not a ``ValueProto`` at all (garbage or truncated bytes). Never raises: one bad stored
        value must be one miss, not a failed request."""
        import numpy as np

        if not isinstance(value, bytes) or not value:
            return None
        if len(value) == self.size and value.startswith(self.header):
            return np.frombuffer(value, dtype="<f4", offset=len(self.header))
        from feast.protos.feast.types.Value_pb2 import Value as ValueProto
        from google.protobuf.message import DecodeError

        proto = ValueProto()
        try:
            proto.ParseFromString(value)
        except (DecodeError, ValueError):
            return None
        if proto.WhichOneof("val") != "float_list_val" or len(proto.float_list_val.val) != self.dim:
            return None
        return np.asarray(proto.float_list_val.val, dtype=np.float32)


def online_field(view_name: str, feature_name: str) -> bytes:
    """The Redis hash field Feast uses for one feature of one view."""
    from feast.infra.online_stores.helpers import _mmh3

    return bytes(_mmh3(f"{view_name}:{feature_name}"))


def timestamp_field(view_name: str) -> bytes:
    """The Redis hash field holding a view's event timestamp (a protobuf ``Timestamp``)."""
    return f"_ts:{view_name}".encode()


def sqlite_table(project: str, view_name: str) -> str:
    """Feast's SQLite online table of one view (online feature view versioning off)."""
    return f"{project}_{view_name}"


def online_kind(store: FeatureStore) -> OnlineKind:
    """``"redis"`` or ``"sqlite"``; any other online store is refused with a clear error."""
    kind = str(getattr(store.config.online_store, "type", ""))
    if kind == "redis" or kind.endswith("RedisOnlineStore"):
        return "redis"
    if kind == "sqlite" or kind.endswith("SqliteOnlineStore"):
        return "sqlite"
    raise ConfigError(f"online store {kind!r} is not supported; use 'redis' or 'sqlite'")


def sqlite_path(store: FeatureStore) -> str:
    cfg = store.config
    path = Path(cfg.online_store.path)
    if not path.is_absolute() and cfg.repo_path is not None:
        path = Path(cfg.repo_path) / path
    return str(path)


def is_redis_cluster(store: FeatureStore) -> bool:
    """True when the online store is configured with ``redis_type: redis_cluster``."""
    return str(getattr(store.config.online_store, "redis_type", "redis")).endswith("cluster")


def packed_round_trip(client: Any, payload: bytes, replies: int) -> list[Any]:
    """Send hand-packed RESP commands on one of ``client``'s pooled connections and read
    ``replies`` answers (an error reply raises, as redis-py's ``read_response`` does; errors
    nested in an answer, such as EXEC's, are returned as exception objects)."""
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_packed_command([payload])
        return [conn.read_response() for _ in range(replies)]
    except BaseException:
        # Unread replies would be handed to the next caller: drop the connection.
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


def redis_client(store: FeatureStore, timeout_seconds: float | None = None) -> Any:
    """A redis-py client on the store's Redis (a ``RedisCluster`` for ``redis_cluster``), with no
    retries (fallback code retries itself)."""
    import redis
    from feast.infra.online_stores.redis import RedisOnlineStore
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    cfg = store.config.online_store
    nodes, params = RedisOnlineStore._parse_connection_string(cfg.connection_string)
    kwargs: dict[str, Any] = {
        k: v
        for k, v in params.items()
        if k in {"db", "password", "username", "ssl", "socket_keepalive"}
    }
    if is_redis_cluster(store):
        from redis.cluster import ClusterNode, RedisCluster

        kwargs.pop("db", None)  # a cluster has database 0 only
        return RedisCluster(
            startup_nodes=[ClusterNode(n["host"], int(n["port"])) for n in nodes],
            socket_timeout=timeout_seconds,
            socket_connect_timeout=timeout_seconds,
            retry=Retry(NoBackoff(), 0),
            **kwargs,
        )
    return redis.Redis(
        host=nodes[0]["host"],
        port=int(nodes[0]["port"]),
        socket_timeout=timeout_seconds,
        socket_connect_timeout=timeout_seconds,
        retry=Retry(NoBackoff(), 0),
        **kwargs,
    )


def open_repo_store(repo: Path, config: Path | None = None) -> FeatureStore:
    """The Feast store of a repo folder, from ``feature_store.yaml`` or another config file
    (a relative ``config`` resolves against the repo); a Redis config's connection comes from
    ``SOLARIS_REDIS_CONNECTION``, derived from ``REDIS_URL`` when unset."""
    from feast import FeatureStore

    repo = Path(repo)
    yaml_file = Path(config) if config is not None else repo / "feature_store.yaml"
    if config is not None and not yaml_file.is_absolute() and not yaml_file.is_file():
        yaml_file = repo / yaml_file
    if not yaml_file.is_file():
        raise ConfigError(
            f"{repo} is not a Feast repo ({yaml_file} not found); pass --repo pointing at the "
            "folder you run `feast apply` in, or --config naming its yaml"
        )
    if REDIS_CONNECTION_ENV not in os.environ:
        export_redis_connection()  # a SQLite config ignores it
    return FeatureStore(repo_path=str(repo), fs_yaml_file=yaml_file)
