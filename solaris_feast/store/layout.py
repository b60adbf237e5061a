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
- Embeddings: ``float32`` as Feast's ``float_list_val`` (:class:`FloatListCodec`), or quantized
  as Feast ``bytes_val`` (:class:`QuantizedCodec`): ``float16`` holds D little-endian halves
  (2D bytes), ``int8`` a little-endian float32 scale then D int8 (4 + D bytes; the vector is
  ``q * scale``). The codec of a view is its ``solaris.embedding_codec`` tag; every reader
  decodes quantized bytes with :func:`dequantize_payloads` (the resolved view carries its text).
- Written values travel as :class:`ByteColumn` s: one ``(N, width)`` matrix per column where the
  values share a width, so the Redis writer packs a batch with numpy (Int64 keys by
  :meth:`EntityKeyLayout.key_column`, vectors by the codecs, floats by :func:`float_value_column`).
- Model versions: the online store keeps an 8-character tag of the embedding version beside
  every value (:func:`stored_model_version`), the offline log the version in full; a reader
  accepts either (:func:`version_matches`; the resolved view carries its text).
- The miss queue's Redis keys, all under the hash tag ``{project}`` (one cluster slot).
"""

from __future__ import annotations

import functools
import struct
import sys
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

from solaris_feast.columns import ITEM_ID, USER_ID
from solaris_feast.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

MIN_SERIALIZATION_VERSION = 3

EmbeddingCodecName = Literal["float32", "float16", "int8"]
"""How a stored embedding is encoded online (see the module docstring for the bytes)."""
EMBEDDING_CODECS: tuple[str, ...] = get_args(EmbeddingCodecName)
DEFAULT_EMBEDDING_CODEC: EmbeddingCodecName = "float32"
INT8_SCALE_BYTES = 4

DEFAULT_ATOMIC_ROWS = 256
"""Rows per Redis transaction: a write of up to this many rows is all-or-nothing online, and
Redis answers no reader while one runs. 1,024 until 2026-12-05: its EXECs held Redis 9.3 ms each
(float32 pair rows), and serving's p99 during a writer's batches went from 8.5 ms with no writer
to 25.1 ms; 256 rows hold it 2.2 ms, p99 10.5 ms, at the same writer rows/s (``benchmarks/
soak.py --writer-atomic-rows``; the table in benchmarks/README.md). Every row is its own newest-
wins write, so a batch stored as several transactions loses nothing: a crash between two leaves
whole transactions, and the retry of the batch rewrites the rest."""

DEFAULT_TRANSACTIONS_IN_FLIGHT = 2
"""A write's transactions sent before the first one's answers are read: the next one is packed
and on its way while Redis runs the one before, so a store farther away costs a round trip a
batch, not a round trip a transaction. Two, not all: Redis runs a transaction once its EXEC has
arrived, so a reader waits behind at most the one or two that are complete in its buffer
(measured on loopback at 256 rows: serving p99 during writes 1.33-1.60x its figure without them,
1.16-1.34x with one in flight; the writer 50-60% faster 0.5-2 ms away, benchmarks/README.md).
A deployment's own trade (``precompute.write_transactions_in_flight``) depends on how far its
Redis is. The transaction after one whose script fails has been sent already and may be stored
too (a retry of the batch rewrites it: rewrites are idempotent)."""


_VALUE_TYPE_INT64 = 4
_VALUE_TYPE_STRING = 2
"""``feast.types.Value_pb2.ValueType.INT64`` and ``.STRING`` (checked against Feast's own)."""


def check_serialization_version(version: int) -> None:
    """Refuse a Feast key serialization this layout does not build (before any key is)."""
    if version < MIN_SERIALIZATION_VERSION:
        raise ConfigError(
            f"entity_key_serialization_version {version} is not supported; "
            "set entity_key_serialization_version: 3 in feature_store.yaml"
        )


class ByteColumn:
    """``N`` byte strings of one column (entity keys, or one feature's encoded values).

    Held as one ``(N, width)`` uint8 matrix when every value has the same width, which the write
    path's Int64 keys, vectors and constant versions and timestamps do, and as a list otherwise
    (String ids, varints). The matrix lets the Redis writer pack a chunk's RESP with a few numpy
    copies instead of a Python call per value: per value the Python path cost about as much as
    Redis's own work on the row, and it held the GIL the precompute's FM and fill need.
    """

    __slots__ = ("_items", "_matrix")

    def __init__(self, matrix: np.ndarray | None = None, items: list[bytes] | None = None) -> None:
        if (matrix is None) == (items is None):
            raise ValueError("a ByteColumn holds a matrix or a list, exactly one")
        if matrix is not None and (matrix.ndim != 2 or matrix.dtype.name != "uint8"):
            raise ValueError(f"a ByteColumn matrix is (N, width) uint8, got {matrix.dtype}")
        self._matrix = matrix
        self._items = items

    @classmethod
    def of(cls, values: list[bytes]) -> ByteColumn:
        """A column of ``values``, as a matrix when they all have one width."""
        import numpy as np

        width = len(values[0]) if values else 0
        if values and all(len(v) == width for v in values):
            joined = b"".join(values)
            return cls(matrix=np.frombuffer(joined, dtype=np.uint8).reshape(len(values), width))
        return cls(items=list(values))

    @classmethod
    def encoded(cls, values: np.ndarray, encode: Any) -> ByteColumn:
        """``encode(value) -> bytes`` of each of ``values`` (an ``(N,)`` array), calling it once
        per distinct value: a round's versions and times are one value for every row."""
        import numpy as np

        distinct, inverse = np.unique(values, return_inverse=True)
        column = cls.of([encode(v) for v in distinct.tolist()])
        if column._matrix is not None:
            return cls(matrix=column._matrix[inverse.reshape(-1)])
        items = column.tolist()
        return cls(items=[items[i] for i in inverse.reshape(-1).tolist()])

    def __len__(self) -> int:
        return len(self._matrix) if self._matrix is not None else len(self._items or [])

    @property
    def matrix(self) -> np.ndarray | None:
        """``(N, width)`` uint8 when the values share a width, else None."""
        return self._matrix

    def tolist(self) -> list[bytes]:
        if self._matrix is None:
            return list(self._items or [])
        import numpy as np

        width = self._matrix.shape[1]
        if width == 0:
            return [b""] * len(self._matrix)
        rows = np.ascontiguousarray(self._matrix).view(np.dtype((np.void, width)))
        return cast("list[bytes]", rows.reshape(-1).tolist())  # void rows give bytes


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
        check_serialization_version(serialization_version)
        self.join_keys = list(join_keys)
        self.serialization_version = serialization_version
        self._sorted = sorted(self.join_keys)
        # Position of each sorted key in the caller's order.
        self._order = [self.join_keys.index(k) for k in self._sorted]
        # Feast's serialize_entity_key_prefix for version 3: the key count, then per sorted key
        # <I STRING> <I length> <utf-8 name>. Written out here so a task that only reads the
        # online store (a round with nothing to compute) need not import Feast (about 10 s);
        # checked against Feast's own functions below whenever Feast is loaded, and in the tests.
        self._int64_type = _VALUE_TYPE_INT64
        self._string_type = _VALUE_TYPE_STRING
        self._prefix = struct.pack("<I", len(self._sorted)) + b"".join(
            struct.pack("<II", self._string_type, len(k.encode("utf-8"))) + k.encode("utf-8")
            for k in self._sorted
        )
        self._int_header = struct.pack("<II", self._int64_type, 8)
        self._pack = struct.Struct("<q").pack
        self._string_header = struct.Struct("<II").pack
        if "feast" in sys.modules:
            self.check_against_feast()

    def check_against_feast(self) -> None:
        """Raise :class:`ConfigError` unless the keys built here are Feast's, byte for byte."""
        from feast.infra.key_encoding_utils import serialize_entity_key_prefix
        from feast.protos.feast.types.Value_pb2 import ValueType

        if (
            self._int64_type,
            self._string_type,
            serialize_entity_key_prefix(self._sorted, self.serialization_version),
        ) != (int(ValueType.INT64), int(ValueType.STRING), self._prefix):
            raise ConfigError(
                "Feast's entity key serialization changed; the fast key layout no longer "
                f"matches it for join keys {self.join_keys}"
            )
        n = len(self.join_keys)
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
            if all(isinstance(v, int) for v in sample):
                import numpy as np

                (built,) = self.key_column([np.array([v], dtype=np.int64) for v in sample]).tolist()
                if built != key:
                    raise ConfigError(
                        f"the matrix-built entity keys of {self.join_keys} differ from key()"
                    )
            if key != self._feast_key(sample) or self.decode(key) != dict(
                zip(self.join_keys, sample, strict=True)
            ):
                raise ConfigError(
                    "Feast's entity key serialization changed; the fast key layout no longer "
                    f"matches it for join keys {self.join_keys}"
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

    def key_column(self, columns: list[np.ndarray]) -> ByteColumn:
        """Serialized keys of N rows, ``columns`` the ``(N,)`` values of each join key in
        ``join_keys`` order: built as one matrix when every key is Int64 (int64 arrays), else
        row by row with :meth:`key`."""
        import numpy as np

        if any(np.asarray(c).dtype != np.int64 for c in columns):
            return ByteColumn.of(
                [self.key(*row) for row in zip(*(c.tolist() for c in columns), strict=True)]
            )
        n = len(columns[0]) if columns else 0
        prefix = np.frombuffer(self._prefix, dtype=np.uint8)
        header = np.frombuffer(self._int_header, dtype=np.uint8)
        parts = [np.broadcast_to(prefix, (n, len(prefix)))]
        for position in self._order:
            values = np.ascontiguousarray(columns[position], dtype="<i8")
            parts.append(np.broadcast_to(header, (n, len(header))))
            parts.append(values.view(np.uint8).reshape(n, 8))
        return ByteColumn(matrix=np.concatenate(parts, axis=1))

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


class SolarisKeyLayouts:
    """The pair and user key layouts of a backend, built on first use; each checks itself
    against Feast's serializer where Feast is loaded, and a task that only reads the online
    store (the precompute's ``drain_miss_queue``, a shard's online check) never imports it."""

    serialization_version: int

    @cached_property
    def pair_key(self) -> EntityKeyLayout:
        return EntityKeyLayout([USER_ID, ITEM_ID], self.serialization_version)

    @cached_property
    def user_key(self) -> EntityKeyLayout:
        return EntityKeyLayout([USER_ID], self.serialization_version)


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

        self.name = "float32"
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

    def encode_column(self, matrix: Any) -> ByteColumn:
        """``matrix``: ``(N, D)`` float32 -> the N encoded values, one row each."""
        import numpy as np

        floats = np.ascontiguousarray(matrix, dtype="<f4").reshape(-1, self.dim)
        return _with_header(self.header, floats.view(np.uint8))

    def encode_rows(self, matrix: Any) -> list[bytes]:
        """``matrix``: ``(N, D)`` float32 -> N encoded values."""
        return self.encode_column(matrix).tolist()

    def unrepresentable(self, matrix: Any) -> Any:
        """``(N,)`` bool: none (every finite float32 vector is held exactly)."""
        import numpy as np

        return np.zeros(len(matrix), dtype=bool)

    def decode_packed(self, values: list[bytes]) -> Any:
        """``(N, D)`` float32 from N values already known to be header + D floats."""
        import numpy as np

        as_bytes = np.frombuffer(b"".join(values), dtype=np.uint8).reshape(len(values), self.size)
        return np.ascontiguousarray(as_bytes[:, len(self.header) :]).view("<f4")

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


_FLOAT_WIDTHS = {"float": "<f4", "double": "<f8"}


@functools.cache
def _float_value_header(kind: str) -> bytes:
    """The bytes of ``ValueProto(<kind>_val=x)`` before ``x``'s little-endian bytes, checked
    against Feast's encoder (a oneof member is written even when it is 0)."""
    import numpy as np
    from feast.protos.feast.types.Value_pb2 import Value as ValueProto

    dtype = np.dtype(_FLOAT_WIDTHS[kind])
    headers = set()
    for sample in (1.5, 0.0, -3.25e-7):
        proto = ValueProto()
        setattr(proto, f"{kind}_val", sample)
        probe = proto.SerializeToString()
        if probe[-dtype.itemsize :] != np.array(sample, dtype=dtype).tobytes():
            raise ConfigError(f"Feast's {kind}_val encoding changed; the float column is stale")
        headers.add(probe[: -dtype.itemsize])
    if len(headers) != 1:
        raise ConfigError(f"Feast's {kind}_val encoding changed; the float column is stale")
    return headers.pop()


def float_value_column(values: np.ndarray, kind: Literal["float", "double"]) -> ByteColumn:
    """Feast's ``ValueProto(float_val=...)`` (or ``double_val``) bytes of each of ``values``,
    built as one matrix: a fill writes a distinct mean distance on every row."""
    import numpy as np

    raw = np.ascontiguousarray(values, dtype=_FLOAT_WIDTHS[kind])
    return _with_header(_float_value_header(kind), raw.view(np.uint8).reshape(len(raw), -1))


@functools.lru_cache(maxsize=4096)
def decode_timestamp(raw: Any) -> float:
    """Unix seconds of a stored ``computed_at`` (``ValueProto(unix_timestamp_val=...)``), NaN
    when it is absent or does not parse as one: one bad stored value is a miss, never an error.
    Cached: a precompute round writes one ``computed_at`` for many pairs."""
    from feast.protos.feast.types.Value_pb2 import Value as ValueProto
    from google.protobuf.message import DecodeError

    if not isinstance(raw, bytes) or not raw:
        return float("nan")
    proto = ValueProto()
    try:
        proto.ParseFromString(raw)
    except (DecodeError, ValueError):
        return float("nan")
    if proto.WhichOneof("val") != "unix_timestamp_val":
        return float("nan")
    return float(proto.unix_timestamp_val)


@functools.lru_cache(maxsize=4096)
def decode_string(raw: Any) -> str | None:
    """The text of a stored string value (a ``model_version``), None when it is absent, empty
    or does not parse as one. Cached: a view holds few distinct versions."""
    from feast.protos.feast.types.Value_pb2 import Value as ValueProto
    from google.protobuf.message import DecodeError

    if not isinstance(raw, bytes) or not raw:
        return None
    proto = ValueProto()
    try:
        proto.ParseFromString(raw)
    except (DecodeError, ValueError):
        return None
    return (proto.string_val or None) if proto.WhichOneof("val") == "string_val" else None


def stored_model_version(version: str) -> str:
    """The embedding version as the online store keeps it beside each value: 8 hex characters of
    blake2b of the full version.

    A card's version (``compressor-20261201T120000-1a2b3c4d``) is 35 characters; beside an int8
    vector of D = 32 it takes a Redis hash from 232 to 280 bytes (listpack, allocator size
    classes; ``benchmarks/README.md``, Memory). 32 bits tell apart the few embedding spaces a
    deployment holds at once (two clash with chance 2**-32). The offline log keeps the full
    version, and a full version stored online (``feast materialize`` of that log, rows written
    before the tag) is still accepted (:func:`accepted_model_versions`). Copied verbatim into the
    resolved view's source: no closures.
    """
    import hashlib

    return hashlib.blake2b(version.encode(), digest_size=4).hexdigest()


def accepted_model_versions(expected: str) -> tuple[str, str]:
    """The stored ``model_version`` values that mean "made by ``expected``": its tag, as solaris
    writes online, and the full version, as the offline log and ``feast materialize`` keep it.
    Copied verbatim into the resolved view's source."""
    return stored_model_version(expected), expected


def version_matches(stored: Any, expected: Any) -> np.ndarray:
    """``(N,)`` bool: which of N stored ``model_version`` values (str, None or anything else) were
    made by the embedding version ``expected``, one version for all rows or one per row (the
    resolved view's request column); see :func:`accepted_model_versions`. An expected value that
    is not a non-empty string matches nothing. Copied verbatim into the resolved view's source:
    numpy only, no closures.
    """
    import numpy as np

    values = np.fromiter(stored, dtype=object, count=len(stored))
    n = len(values)
    matches = np.zeros(n, dtype=bool)
    if isinstance(expected, str) or expected is None:  # None: no chain to expect
        if expected:
            for accepted in accepted_model_versions(expected):
                matches |= values == accepted
        return matches
    wanted = np.fromiter(expected, dtype=object, count=n)
    for version in {v for v in wanted.tolist() if isinstance(v, str) and v}:
        rows = wanted == version
        for accepted in accepted_model_versions(version):
            matches[rows] |= values[rows] == accepted
    return matches


def quantized_payload_size(codec: str, dim: int) -> int:
    """Bytes of one quantized payload (the ``bytes_val`` content) of length ``dim``."""
    if codec == "float16":
        return 2 * dim
    if codec == "int8":
        return INT8_SCALE_BYTES + dim
    raise ValueError(f"{codec!r} is not a quantized codec; choose float16 or int8")


def dequantize_payloads(
    payloads: list[bytes | None], codec: str, dim: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(N, D)`` float32 vectors and ``(N,)`` bool ``decoded`` from N quantized payloads.

    A payload that is not ``bytes`` of exactly the codec's size (null, truncated, another
    length or codec) is not decoded: its row stays zero and ``decoded`` is False. A non-finite
    scale or half gives a non-finite vector, which the tier rule refuses. Copied verbatim into
    the resolved view's source: numpy only, no closures.
    """
    import numpy as np

    n = len(payloads)
    size = 2 * dim if codec == "float16" else 4 + dim
    vectors = np.zeros((n, dim), dtype=np.float32)
    decoded = np.zeros(n, dtype=bool)
    rows = []
    chosen = []
    for i, payload in enumerate(payloads):
        if type(payload) is bytes and len(payload) == size:
            rows.append(i)
            chosen.append(payload)
    if not rows:
        return vectors, decoded
    decoded[rows] = True
    raw = np.frombuffer(b"".join(chosen), dtype=np.uint8)
    raw = raw.reshape(len(rows), size)
    if codec == "float16":
        vectors[rows] = np.ascontiguousarray(raw).view("<f2").astype(np.float32)
    else:
        scale = np.ascontiguousarray(raw[:, :4]).view("<f4").astype(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            vectors[rows] = np.ascontiguousarray(raw[:, 4:]).view(np.int8) * scale
    return vectors, decoded


class QuantizedCodec:
    """Feast's ``ValueProto(bytes_val=...)`` bytes of quantized vectors of one length ``D``.

    ``float16``: 2 bytes a component, relative error about 5e-4. ``int8``: one float32 scale per
    vector (``max |x| / 127``) and one signed byte a component, absolute error at most
    ``scale / 2``. The ``bytes_val`` header is fixed for a given payload size, so encoding is
    header + payload; the constructor checks that against Feast's own encoder and the round
    trip against :func:`dequantize_payloads`.
    """

    def __init__(self, codec: str, dim: int) -> None:
        import numpy as np
        from feast.protos.feast.types.Value_pb2 import Value as ValueProto

        self.name = codec
        self.dim = dim
        self.payload_size = quantized_payload_size(codec, dim)
        probe = ValueProto(bytes_val=b"\0" * self.payload_size).SerializeToString()
        self.header = probe[: len(probe) - self.payload_size]
        self.size = len(probe)
        sample = np.linspace(-1.5, 2.0, dim, dtype=np.float32)[None]
        (encoded,) = self.encode_rows(sample)
        check = ValueProto()
        check.ParseFromString(encoded)
        if encoded[len(self.header) :] != check.bytes_val or len(encoded) != self.size:
            raise ConfigError(f"Feast's bytes encoding changed; the {codec} codec is stale")
        back = self.decode(encoded)
        if back is None or not np.allclose(back, sample[0], atol=self.tolerance(sample)[0]):
            raise ConfigError(f"the {codec} codec does not round-trip its own bytes")

    def _payload_matrix(self, matrix: Any) -> np.ndarray:
        """``matrix``: ``(N, D)`` finite float32 -> ``(N, payload_size)`` uint8 payloads."""
        import numpy as np

        values = np.ascontiguousarray(matrix, dtype=np.float32).reshape(-1, self.dim)
        if self.name == "float16":
            return values.astype("<f2").view(np.uint8).reshape(len(values), self.payload_size)
        scale = (np.abs(values).max(axis=1, initial=0.0) / 127.0).astype(np.float32)
        safe = np.where(scale > 0, scale, 1.0)[:, None]
        q = np.clip(np.rint(values / safe), -127, 127).astype(np.int8)
        packed = np.empty((len(values), self.payload_size), dtype=np.uint8)
        packed[:, :INT8_SCALE_BYTES] = scale.astype("<f4").view(np.uint8).reshape(-1, 4)
        packed[:, INT8_SCALE_BYTES:] = q.view(np.uint8)
        return packed

    def payloads(self, matrix: Any) -> list[bytes]:
        """``matrix``: ``(N, D)`` finite float32 -> N payloads (``bytes_val`` contents)."""
        return ByteColumn(matrix=self._payload_matrix(matrix)).tolist()

    def encode_column(self, matrix: Any) -> ByteColumn:
        """``matrix``: ``(N, D)`` float32 -> the N encoded ``ValueProto`` values, one row each."""
        return _with_header(self.header, self._payload_matrix(matrix))

    def encode_rows(self, matrix: Any) -> list[bytes]:
        """``matrix``: ``(N, D)`` float32 -> N encoded ``ValueProto`` values."""
        return self.encode_column(matrix).tolist()

    def unrepresentable(self, matrix: Any) -> Any:
        """``(N,)`` bool: rows the codec cannot hold (float16 overflows past 65504)."""
        import numpy as np

        values = np.asarray(matrix, dtype=np.float32).reshape(-1, self.dim)
        if self.name == "float16":
            return (np.abs(values) > np.finfo(np.float16).max).any(axis=1)
        return np.zeros(len(values), dtype=bool)

    def tolerance(self, matrix: Any) -> Any:
        """``(N,)`` the largest absolute error of a component of each row after a round trip."""
        import numpy as np

        peak = np.abs(np.asarray(matrix, dtype=np.float32)).max(axis=1, initial=0.0)
        if self.name == "float16":
            return peak * 2.0**-11 + 2.0**-24
        return peak / 254.0 * (1 + 1e-6) + 1e-12

    def decode_packed(self, values: list[bytes]) -> Any:
        """``(N, D)`` float32 from N values already known to be header + payload of this size."""
        start = len(self.header)
        vectors, _ = dequantize_payloads([v[start:] for v in values], self.name, self.dim)
        return vectors

    def decode(self, value: Any) -> Any:
        """``(D,)`` float32, or None when the value is empty, null, not a ``bytes_val`` of this
        codec's size, or not a ``ValueProto`` at all. Never raises (see FloatListCodec)."""
        if not isinstance(value, bytes) or not value:
            return None
        if len(value) == self.size and value.startswith(self.header):
            payload = value[len(self.header) :]
        else:
            from feast.protos.feast.types.Value_pb2 import Value as ValueProto
            from google.protobuf.message import DecodeError

            proto = ValueProto()
            try:
                proto.ParseFromString(value)
            except (DecodeError, ValueError):
                return None
            if proto.WhichOneof("val") != "bytes_val":
                return None
            payload = proto.bytes_val
        vectors, decoded = dequantize_payloads([payload], self.name, self.dim)
        return vectors[0] if decoded[0] else None


EmbeddingCodec = FloatListCodec | QuantizedCodec


def _with_header(header: bytes, payloads: np.ndarray) -> ByteColumn:
    """Each ``(N, P)`` uint8 payload row after the same ``header``."""
    import numpy as np

    column = np.empty((len(payloads), len(header) + payloads.shape[1]), dtype=np.uint8)
    column[:, : len(header)] = np.frombuffer(header, dtype=np.uint8)
    column[:, len(header) :] = payloads
    return ByteColumn(matrix=column)


def embedding_codec(codec: str, dim: int) -> EmbeddingCodec:
    """The codec called ``codec`` for vectors of length ``dim``.

    Raises:
        ConfigError: an unknown codec name (a view tag or config value with a typo).
    """
    if codec not in EMBEDDING_CODECS:
        raise ConfigError(
            f"unknown embedding codec {codec!r}; choose one of {', '.join(EMBEDDING_CODECS)}"
        )
    return FloatListCodec(dim) if codec == "float32" else QuantizedCodec(codec, dim)


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
    """Prefix of the per-pair markers that dedupe a round: ``<prefix><user>:<item>``, the ids
    in their typed text form (``store/ids.py``'s ``encode_id``: ints read ``5``, a string id
    ``"a:b"``, so a ``:`` inside one cannot make two pairs collide). The Redis backend's
    scripts join the parts (``store/backends/redis.py``)."""
    return f"solaris:{{{project}}}:missed:"
