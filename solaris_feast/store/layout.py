"""How values are laid out in the online store, written once: keys, hash fields and codecs.

The retriever, the writer, the status and the miss queue talk to the online store directly (one
round trip for all tiers, newest-wins writes), so they must produce and read exactly the bytes
Feast does. Everything Feast-shaped here is derived from Feast's own functions and checked
against them when built; any other code that packs an entity key, a hash field or a table name
calls these.

- Entity keys: ``serialize_entity_key`` (version 3) of Int64 or String join keys, see
  :class:`EntityKeyLayout`; on Redis the key of a hash is that plus the project name.
- Redis hash fields: ``mmh3("<view>:<feature>")`` per feature, ``_ts:<view>`` for the event
  timestamp; one hash per entity key holds every view of that key.
- SQLite tables: ``<project>_<view>``, one row per (entity key, feature).
- The miss queue's Redis keys, all under the hash tag ``{project}`` (one cluster slot).
"""

from __future__ import annotations

import struct
from typing import Any

from solaris_feast.errors import ConfigError

MIN_SERIALIZATION_VERSION = 3


def _check_serialization_version(version: int) -> None:
    if version < MIN_SERIALIZATION_VERSION:
        raise ConfigError(
            f"entity_key_serialization_version {version} is not supported; "
            "set entity_key_serialization_version: 3 in feature_store.yaml"
        )


class EntityKeyLayout:
    """Feast's serialized entity key for Int64 and String join keys, built without a proto per row.

    ``feast.infra.key_encoding_utils.serialize_entity_key`` builds an ``EntityKeyProto`` per row,
    which costs more than the network read for 100 candidates. Its output is a fixed prefix
    (sorted join key names) followed by one block per value: ``<I INT64> <I 8> <q value>`` for an
    int, ``<I STRING> <I length> <utf-8 bytes>`` for a str. Each value is packed by its Python
    type (``int`` or ``str``); which type a join key has is checked where ids enter
    (:func:`solaris_feast.store.ids.check_ids`), not here. The constructor checks the result
    against Feast's function for int, string (unicode, ``:``) and mixed keys.
    """

    def __init__(self, join_keys: list[str], serialization_version: int) -> None:
        from feast.infra.key_encoding_utils import serialize_entity_key_prefix
        from feast.protos.feast.types.Value_pb2 import ValueType

        _check_serialization_version(serialization_version)
        self.join_keys = list(join_keys)
        self.serialization_version = serialization_version
        self._sorted = sorted(self.join_keys)
        # Position of each sorted key in the caller's order.
        self._order = [self.join_keys.index(k) for k in self._sorted]
        self._prefix = serialize_entity_key_prefix(self._sorted, serialization_version)
        self._int64_type = int(ValueType.INT64)
        self._string_type = int(ValueType.STRING)
        self._int_header = struct.pack("<II", self._int64_type, 8)
        self._pack = struct.Struct("<q").pack
        self._string_header = struct.Struct("<II").pack
        n = len(join_keys)
        samples: list[list[int | str]] = [
            [0] * n,
            list(range(7, 7 + n)),
            [2**63 - 1] * n,
        ]
        strings: list[int | str] = ["u:1", "ü-ß \u2603:x", *["z"] * max(n - 2, 0)]
        mixed: list[int | str] = [5, "item:5", *[0] * max(n - 2, 0)]
        samples += [strings[:n], mixed[:n]]
        for sample in samples:
            key = self.key(*sample)
            if key != self._feast_key(sample) or self.decode(key) != dict(
                zip(self.join_keys, sample, strict=True)
            ):
                raise ConfigError(
                    "Feast's entity key serialization changed; the fast key layout no longer "
                    f"matches it for join keys {join_keys}"
                )

    def _feast_key(self, values: list[int | str]) -> bytes:
        from feast.infra.key_encoding_utils import serialize_entity_key
        from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto
        from feast.protos.feast.types.Value_pb2 import Value as ValueProto

        proto = EntityKeyProto(
            join_keys=self.join_keys,
            entity_values=[
                ValueProto(string_val=v) if isinstance(v, str) else ValueProto(int64_val=v)
                for v in values
            ],
        )
        return serialize_entity_key(
            proto, entity_key_serialization_version=self.serialization_version
        )

    def key(self, *values: int | str) -> bytes:
        """Serialized key for join key values given in ``join_keys`` order."""
        parts = [self._prefix]
        for position in self._order:
            value = values[position]
            if isinstance(value, str):
                raw = value.encode("utf-8")
                parts.append(self._string_header(self._string_type, len(raw)))
                parts.append(raw)
            else:
                parts.append(self._int_header)
                parts.append(self._pack(value))
        return b"".join(parts)

    def decode(self, key: bytes) -> dict[str, int | str] | None:
        """Join key values of a serialized key of this layout; None for any other key."""
        if not key.startswith(self._prefix):
            return None
        values: dict[str, int | str] = {}
        offset = len(self._prefix)
        for name in self._sorted:
            if offset + 8 > len(key):
                return None
            value_type, size = struct.unpack_from("<II", key, offset)
            offset += 8
            if offset + size > len(key):
                return None
            if value_type == self._int64_type and size == 8:
                values[name] = struct.unpack_from("<q", key, offset)[0]
            elif value_type == self._string_type:
                try:
                    values[name] = key[offset : offset + size].decode("utf-8")
                except UnicodeDecodeError:
                    return None
            else:
                return None
            offset += size
        return values if offset == len(key) else None


class FloatListCodec:
    """Feast's ``ValueProto(float_list_val=...)`` bytes for vectors of one length ``D``.

    A packed repeated float has a fixed header for a given ``D``, so encoding is header + the
    little-endian float32 bytes and decoding a ``np.frombuffer``. Values of any other shape (an
    older writer, another ``D``) fall back to parsing with ``ValueProto``.
    """

    def __init__(self, dim: int) -> None:
        import numpy as np
        from feast.protos.feast.types.Value_pb2 import FloatList
        from feast.protos.feast.types.Value_pb2 import Value as ValueProto

        self.dim = dim
        probe = ValueProto(float_list_val=FloatList(val=[0.0] * dim)).SerializeToString()
        self.header = probe[: len(probe) - 4 * dim]
        self.size = len(probe)
        check = ValueProto(float_list_val=FloatList(val=[1.5] * dim)).SerializeToString()
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


def quoted_sqlite_table(project: str, view_name: str) -> str:
    """:func:`sqlite_table` as a quoted SQL identifier (project names may hold any text)."""
    return '"' + sqlite_table(project, view_name).replace('"', '""') + '"'


# --- The miss queue's keys (Redis) ---------------------------------------------------------------


def miss_stream_key(project: str) -> str:
    """The stream of queued misses, one entry per pair."""
    return f"solaris:{{{project}}}:misses"


def miss_round_key(project: str) -> str:
    """Counter bumped by every drain that took pairs: a new round has begun."""
    return f"solaris:{{{project}}}:miss_round"


def miss_marker_prefix(project: str) -> str:
    """Prefix of the per-pair markers (``<prefix><user>:<item>``) that dedupe a round."""
    return f"solaris:{{{project}}}:missed:"


def miss_marker(project: str, user: int | str, item: int | str) -> str:
    """The per-pair marker: ids in their typed text form (``5``, ``"a:b"``), so ints read as
    before (``<prefix>5:7``) and a ``:`` inside a string id cannot make two pairs collide."""
    from solaris_feast.store.ids import encode_id

    return f"{miss_marker_prefix(project)}{encode_id(user)}:{encode_id(item)}"
