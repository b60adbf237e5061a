"""The write path: batches of embeddings into the offline parquet log and the online store.

One code path serves the three SOLARIS views; the columns come from the view's schema in the
registry (the pair view needs ``user_id, item_id, embedding, model_version, computed_at``; the
user view ``user_id, embedding, pair_count, model_version, computed_at``; the similar view
``user_id, item_id, embedding, neighbour_count, mean_distance, model_version, computed_at``).

A batch is checked as a whole first (missing columns, wrong dtypes, negative or duplicate keys,
NaN/Inf or wrong-length vectors, empty versions, naive or missing timestamps); a bad batch raises
:class:`~solaris_feast.errors.WriteBatchError` naming the rows (positions in the frame) and
nothing of it is written.

Offline: parquet under ``<source path>/<YYYY-MM-DD of computed_at>/part-<content hash>.parquet``.
The log is append-only and the file name is a hash of the rows, so writing the same batch again
finds its file and writes nothing.

Online, newest wins: Feast's Redis writer reads the stored timestamps, then writes in a second
pipeline and silently drops a row whose timestamp is not newer than the stored one. Two things go
wrong with that: a recomputation with the same ``computed_at`` (a fixed model, a retried shard)
is lost, and two writers can interleave between the read and the write. Here each chunk of rows
is one Lua script: Redis runs it atomically, comparing the stored ``_ts:<view>`` with the new one
and writing when the new one is not older (ties go to the later write). Up to ``atomic_rows``
rows go in one MULTI/EXEC transaction, so a crash mid-batch stores all of it or none. On SQLite one
``INSERT ... ON CONFLICT DO UPDATE ... WHERE excluded.event_ts >= event_ts`` does the same; Feast's
own SQLite writer overwrites unconditionally, so an older late write would win there. The bytes
written are Feast's own (same keys, fields and ``ValueProto`` encodings), so
``get_online_features`` reads them and the retriever reads what Feast writes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from solaris_feast.errors import ConfigError, RetryableStoreError, WriteBatchError
from solaris_feast.store.config import (
    EntityKeyLayout,
    FloatListCodec,
    is_redis_cluster,
    online_field,
    online_kind,
    packed_round_trip,
    redis_client,
    sqlite_path,
    sqlite_table,
    timestamp_field,
)
from solaris_feast.store.definitions import CREATED_TIMESTAMP_COLUMN, EVENT_TIMESTAMP_COLUMN
from solaris_feast.store.tags import TAG_EMBEDDING_DIM

if TYPE_CHECKING:
    from feast import FeatureStore, FeatureView

logger = logging.getLogger(__name__)

DEFAULT_CHUNK_ROWS = 256
DEFAULT_ATOMIC_ROWS = 1024
"""Rows per Redis transaction: a batch up to this size is all-or-nothing online."""
NANOS_PER_SECOND = 1_000_000_000
NANOS_PER_DAY = 86_400 * NANOS_PER_SECOND

# Newest-wins write of a chunk of rows. ARGV: ts field, number of features F, key TTL (0 = none),
# the F field names, then per key: the Timestamp proto bytes and the F values. Timestamps are
# compared as (seconds, nanos) parsed from the protobuf varints: Lua numbers are doubles, which
# cannot hold nanoseconds since 1970 exactly.
_WRITE_SCRIPT = """
local function varint(s, pos)
  local result, mult = 0, 1
  while pos <= #s do
    local b = string.byte(s, pos)
    pos = pos + 1
    result = result + (b % 128) * mult
    if b < 128 then return result, pos end
    mult = mult * 128
  end
  return result, pos
end
local function parse_ts(s)
  local secs, nanos, pos = 0, 0, 1
  while pos <= #s do
    local tag = string.byte(s, pos)
    local v
    v, pos = varint(s, pos + 1)
    if tag == 8 then secs = v elseif tag == 16 then nanos = v end
  end
  return secs, nanos
end
local ts_field = ARGV[1]
local nf = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local base = 3 + nf
local applied = 0
for k = 1, #KEYS do
  local off = base + (k - 1) * (nf + 1)
  local new_ts = ARGV[off + 1]
  local old_ts = redis.call('HGET', KEYS[k], ts_field)
  local write = true
  if old_ts then
    local os, on = parse_ts(old_ts)
    local ns, nn = parse_ts(new_ts)
    if ns < os or (ns == os and nn < on) then write = false end
  end
  if write then
    local args = {ts_field, new_ts}
    for f = 1, nf do
      args[#args + 1] = ARGV[3 + f]
      args[#args + 1] = ARGV[off + 1 + f]
    end
    redis.call('HSET', KEYS[k], unpack(args))
    if ttl > 0 then redis.call('EXPIRE', KEYS[k], ttl) end
    applied = applied + 1
  end
end
return applied
"""


def _bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


def _as_bytes(values: list[Any]) -> list[bytes]:
    return [v if isinstance(v, bytes) else str(v).encode() for v in values]


_MULTI = b"*1\r\n$5\r\nMULTI\r\n"
_EXEC = b"*1\r\n$4\r\nEXEC\r\n"
_EVAL_SCRIPT = _bulk(b"EVAL") + _bulk(_WRITE_SCRIPT.encode())


@dataclass(frozen=True)
class WriteReport:
    """What one ``write`` did.

    Attributes:
        rows: rows in the batch.
        online_applied: rows written online (the rest were older than what the store holds).
        offline_files: parquet files of this batch (written now or found from an earlier write).
        offline_files_written: how many of them were written now.
    """

    rows: int
    online_applied: int
    offline_files: list[Path]
    offline_files_written: int


@dataclass(frozen=True)
class _ValidBatch:
    """A checked batch, normalized: keys ``(N,)`` int64 per join key, embeddings ``(N, D)``."""

    keys: dict[str, np.ndarray]
    embeddings: np.ndarray
    features: dict[str, np.ndarray]
    computed_at_ns: np.ndarray


def _feature_kind(dtype: Any) -> str:
    from feast.types import Array, Float32, Float64, Int64, String, UnixTimestamp

    if dtype == Array(Float32):
        return "embedding"
    for kind, feast_type in (
        ("int64", Int64),
        ("float32", Float32),
        ("float64", Float64),
        ("string", String),
        ("timestamp", UnixTimestamp),
    ):
        if dtype == feast_type:
            return kind
    raise ConfigError(f"feature type {dtype} is not supported by the solaris write path")


class EmbeddingWriter:
    """Writes batches of one SOLARIS view to the offline parquet log and the online store.

    Args:
        store: a Feast store whose registry holds ``view_name``.
        view_name: ``solaris_pair``, ``solaris_user`` or ``solaris_similar`` (or your own names).
        offline: write the parquet log.
        online: write the online store.
        chunk_rows: rows per Redis script call.
        atomic_rows: rows per Redis transaction (MULTI/EXEC). A batch of at most this many rows
            is written all-or-nothing: a crash mid-batch leaves none of it and readers never see
            part of it. Bigger batches are written as several such transactions, because Redis
            answers no reader while one runs.
    """

    def __init__(
        self,
        store: FeatureStore,
        view_name: str = "solaris_pair",
        *,
        offline: bool = True,
        online: bool = True,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        atomic_rows: int = DEFAULT_ATOMIC_ROWS,
    ) -> None:
        if chunk_rows <= 0 or atomic_rows <= 0:
            raise ValueError(
                f"chunk_rows and atomic_rows must be positive, got {chunk_rows}, {atomic_rows}"
            )
        self.store = store
        self.view: FeatureView = store.get_feature_view(view_name)
        self.view_name = view_name
        self.offline = offline
        self.online = online
        self.chunk_rows = chunk_rows
        self.atomic_rows = atomic_rows
        self.project = store.config.project
        self.join_keys = list(self.view.join_keys)
        self.feature_kinds = {f.name: _feature_kind(f.dtype) for f in self.view.features}
        embedding_features = [n for n, k in self.feature_kinds.items() if k == "embedding"]
        if embedding_features != ["embedding"]:
            raise ConfigError(
                f"view {view_name} must have exactly one Array(Float32) feature named "
                f"'embedding', has {embedding_features}"
            )
        if self.feature_kinds.get("computed_at") != "timestamp":
            raise ConfigError(f"view {view_name} needs a UnixTimestamp feature 'computed_at'")
        dim_tag = self.view.tags.get(TAG_EMBEDDING_DIM)
        if dim_tag is None:
            raise ConfigError(f"view {view_name} has no {TAG_EMBEDDING_DIM} tag")
        self.dim = int(dim_tag)
        self.codec = FloatListCodec(self.dim)
        self.key_layout = EntityKeyLayout(
            self.join_keys, store.config.entity_key_serialization_version
        )
        self.kind = online_kind(store)
        key_ttl = getattr(store.config.online_store, "key_ttl_seconds", None)
        if key_ttl is not None and key_ttl < 0:
            # Feast would pass it to EXPIRE, which deletes the key at once: refuse it instead.
            raise ConfigError(
                f"online_store.key_ttl_seconds must be positive or unset, got {key_ttl}"
            )
        self._redis: Any = None
        self._sqlite: sqlite3.Connection | None = None

    # -- public -------------------------------------------------------------------------------

    @property
    def required_columns(self) -> list[str]:
        return [*self.join_keys, *self.feature_kinds]

    def write(self, frame: pd.DataFrame) -> WriteReport:
        """Check the whole batch, then write it offline and online.

        Args:
            frame: one row per entity key with the view's join keys (int64), ``embedding``
                (a length-D sequence of floats per row), ``model_version`` (str),
                ``computed_at`` (timezone-aware datetime) and the view's other features.

        Raises:
            WriteBatchError: the batch is refused; nothing was written.
        """
        batch = self.validate(frame)
        n = len(batch.computed_at_ns)
        files: list[Path] = []
        written = 0
        if n and self.offline:
            files, written = self._write_offline(batch)
        applied = 0
        if n and self.online:
            applied = self._write_online(batch)
        return WriteReport(
            rows=n, online_applied=applied, offline_files=files, offline_files_written=written
        )

    def validate(self, frame: pd.DataFrame) -> _ValidBatch:
        """Check a batch without writing it; raise :class:`WriteBatchError` naming bad rows."""
        if not isinstance(frame, pd.DataFrame):
            raise TypeError(f"expected a pandas DataFrame, got {type(frame).__name__}")
        missing = [c for c in self.required_columns if c not in frame.columns]
        if missing:
            raise WriteBatchError(
                f"{self.view_name}: missing columns {missing} (need {self.required_columns})", []
            )
        positions = np.arange(len(frame))

        def refuse(problem: str, bad: np.ndarray) -> None:
            rows = positions[bad].tolist()
            if rows:
                raise WriteBatchError(f"{self.view_name}: {problem}", rows)

        keys: dict[str, np.ndarray] = {}
        for key in self.join_keys:
            column = frame[key]
            if column.dtype == bool or not pd.api.types.is_integer_dtype(column.dtype):
                raise WriteBatchError(
                    f"{self.view_name}: column {key!r} must be int64, got {column.dtype}",
                    positions.tolist(),
                )
            values = column.to_numpy(dtype=np.int64)
            refuse(f"negative {key}", values < 0)
            keys[key] = values
        duplicated = (
            pd.DataFrame(keys).duplicated(keep=False).to_numpy()
            if len(frame)
            else np.zeros(0, dtype=bool)
        )
        refuse(f"duplicate keys {self.join_keys} within the batch", duplicated)

        embeddings = self._embedding_matrix(frame["embedding"], refuse)

        features: dict[str, np.ndarray] = {}
        computed_at_ns = np.zeros(0, dtype=np.int64)
        for name, kind in self.feature_kinds.items():
            if name == "embedding":
                continue
            column = frame[name]
            if kind == "timestamp":
                if not isinstance(column.dtype, pd.DatetimeTZDtype):
                    raise WriteBatchError(
                        f"{self.view_name}: column {name!r} must be a timezone-aware datetime "
                        f"(UTC), got {column.dtype}",
                        positions.tolist(),
                    )
                refuse(f"missing {name}", column.isna().to_numpy())
                utc = column.dt.tz_convert("UTC").astype("datetime64[ns, UTC]")
                values = pd.DatetimeIndex(utc).asi8.copy()
                refuse(f"{name} before 1970", values < 0)
                features[name] = values
                if name == "computed_at":
                    computed_at_ns = values
            elif kind == "string":
                bad = np.array(
                    [not (isinstance(v, str) and v) for v in column.tolist()], dtype=bool
                )
                refuse(f"{name} must be a non-empty string", bad)
                features[name] = column.to_numpy(dtype=object)
            elif kind == "int64":
                if column.dtype == bool or not pd.api.types.is_integer_dtype(column.dtype):
                    raise WriteBatchError(
                        f"{self.view_name}: column {name!r} must be int64, got {column.dtype}",
                        positions.tolist(),
                    )
                features[name] = column.to_numpy(dtype=np.int64)
            else:
                if not pd.api.types.is_numeric_dtype(column.dtype) or column.dtype == bool:
                    raise WriteBatchError(
                        f"{self.view_name}: column {name!r} must be numeric, got {column.dtype}",
                        positions.tolist(),
                    )
                values = column.to_numpy(dtype=np.float64)
                refuse(f"{name} is NaN or infinite", ~np.isfinite(values))
                features[name] = values
        return _ValidBatch(
            keys=keys, embeddings=embeddings, features=features, computed_at_ns=computed_at_ns
        )

    def close(self) -> None:
        if self._redis is not None:
            self._redis.close()
        if self._sqlite is not None:
            self._sqlite.close()
            self._sqlite = None

    # -- checks -------------------------------------------------------------------------------

    def _embedding_matrix(self, column: pd.Series, refuse: Any) -> np.ndarray:
        """``(N, D)`` float32 from a column of length-D sequences."""
        n = len(column)
        matrix = np.zeros((n, self.dim), dtype=np.float32)
        wrong_shape = np.zeros(n, dtype=bool)
        not_numeric = np.zeros(n, dtype=bool)
        for i, value in enumerate(column.tolist()):
            if value is None or isinstance(value, str | bytes):
                not_numeric[i] = True
                continue
            try:
                row = np.asarray(value, dtype=np.float64)
            except (TypeError, ValueError):
                not_numeric[i] = True
                continue
            if row.shape != (self.dim,):
                wrong_shape[i] = True
                continue
            matrix[i] = row
        refuse("embedding is missing or not numeric", not_numeric)
        refuse(f"embedding must have length {self.dim}", wrong_shape)
        refuse("embedding has NaN or Inf", ~np.isfinite(matrix).all(axis=1))
        return matrix

    # -- offline ------------------------------------------------------------------------------

    def _offline_root(self) -> Path:
        path = Path(self.view.batch_source.path)  # type: ignore[union-attr]
        if not path.is_absolute() and self.store.config.repo_path is not None:
            path = Path(self.store.config.repo_path) / path
        return path

    def _write_offline(self, batch: _ValidBatch) -> tuple[list[Path], int]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        root = self._offline_root()
        # UTC day of each row as an integer; only the distinct days are formatted.
        day_index = np.floor_divide(batch.computed_at_ns, NANOS_PER_DAY)
        files: list[Path] = []
        written = 0
        written_at = pd.Timestamp.now(tz="UTC")
        for index in np.unique(day_index).tolist():
            day = pd.Timestamp(index * NANOS_PER_DAY, unit="ns", tz="UTC").strftime("%Y-%m-%d")
            rows = np.flatnonzero(day_index == index)
            # Sorted by key so the same rows in another order hash to the same file.
            order = rows[np.lexsort([batch.keys[k][rows] for k in reversed(self.join_keys)])]
            digest = self._content_hash(batch, order)
            path = root / day / f"part-{digest}.parquet"
            files.append(path)
            if path.exists():
                continue
            columns: dict[str, Any] = {k: pa.array(batch.keys[k][order]) for k in self.join_keys}
            emb = batch.embeddings[order]
            columns["embedding"] = pa.FixedSizeListArray.from_arrays(
                pa.array(emb.reshape(-1), type=pa.float32()), self.dim
            ).cast(pa.list_(pa.float32()))
            for name, values in batch.features.items():
                kind = self.feature_kinds[name]
                if kind == "timestamp":
                    columns[name] = pa.array(values[order], type=pa.timestamp("ns", tz="UTC"))
                elif kind == "float32":
                    columns[name] = pa.array(values[order].astype(np.float32))
                else:
                    columns[name] = pa.array(values[order])
            columns[EVENT_TIMESTAMP_COLUMN] = pa.array(
                batch.computed_at_ns[order], type=pa.timestamp("ns", tz="UTC")
            )
            columns[CREATED_TIMESTAMP_COLUMN] = pa.array(
                [written_at.value] * len(order), type=pa.timestamp("ns", tz="UTC")
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            # Written beside and renamed: a reader never sees half a file.
            temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
            pq.write_table(pa.table(columns), temp)
            os.replace(temp, path)
            written += 1
        return files, written

    def _content_hash(self, batch: _ValidBatch, order: np.ndarray) -> str:
        digest = hashlib.sha256(self.view_name.encode())
        for key in self.join_keys:
            digest.update(np.ascontiguousarray(batch.keys[key][order]).tobytes())
        digest.update(np.ascontiguousarray(batch.embeddings[order]).tobytes())
        for name in sorted(batch.features):
            values = batch.features[name][order]
            if values.dtype == object:
                digest.update("\x1f".join(values.tolist()).encode())
            else:
                digest.update(np.ascontiguousarray(values).tobytes())
        return digest.hexdigest()[:24]

    # -- online -------------------------------------------------------------------------------

    def _encoded_rows(self, batch: _ValidBatch) -> tuple[list[str], list[list[bytes]]]:
        """Feature names and, per row, their ``ValueProto`` bytes in that order."""
        from feast.protos.feast.types.Value_pb2 import Value as ValueProto

        names = ["embedding"]
        columns: list[list[bytes]] = [self.codec.encode_rows(batch.embeddings)]
        for name, values in batch.features.items():
            kind = self.feature_kinds[name]
            names.append(name)
            cache: dict[Any, bytes] = {}
            encoded = []
            for value in values.tolist():
                if value not in cache:
                    if kind == "timestamp":
                        proto = ValueProto(unix_timestamp_val=int(value) // NANOS_PER_SECOND)
                    elif kind == "string":
                        proto = ValueProto(string_val=value)
                    elif kind == "int64":
                        proto = ValueProto(int64_val=int(value))
                    elif kind == "float32":
                        proto = ValueProto(float_val=float(value))
                    else:
                        proto = ValueProto(double_val=float(value))
                    cache[value] = proto.SerializeToString()
                encoded.append(cache[value])
            columns.append(encoded)
        return names, [list(row) for row in zip(*columns, strict=True)]

    def _row_keys(self, batch: _ValidBatch) -> list[bytes]:
        key = self.key_layout.key
        key_columns = [batch.keys[k].tolist() for k in self.join_keys]
        return [key(*values) for values in zip(*key_columns, strict=True)]

    def _write_online(self, batch: _ValidBatch) -> int:
        names, rows = self._encoded_rows(batch)
        keys = self._row_keys(batch)
        if self.kind == "redis":
            return self._write_redis(keys, names, rows, batch.computed_at_ns)
        return self._write_sqlite(keys, names, rows, batch.computed_at_ns)

    def _write_redis(
        self, keys: list[bytes], names: list[str], rows: list[list[bytes]], ts_ns: np.ndarray
    ) -> int:
        import redis
        from google.protobuf.timestamp_pb2 import Timestamp

        if self._redis is None:
            self._redis = redis_client(self.store, timeout_seconds=30.0)
        project = self.project.encode()
        fields = [online_field(self.view_name, name) for name in names]
        key_ttl = int(getattr(self.store.config.online_store, "key_ttl_seconds", None) or 0)
        head = [timestamp_field(self.view_name), len(fields), key_ttl, *fields]
        ts_cache: dict[int, bytes] = {}
        if is_redis_cluster(self.store):
            return self._write_redis_cluster(keys, rows, ts_ns, head, ts_cache)
        # MULTI/EXEC around up to atomic_rows rows of scripts: Redis queues them until EXEC, so
        # a crash or a dropped connection mid-transaction leaves nothing of it, and no reader
        # sees part of it. Redis serves nobody while an EXEC runs (about 3-10 us a row here),
        # so a bigger batch goes in several transactions, each all-or-nothing. The commands are
        # packed by hand (redis-py's generic packer was a third of the write time) and sent as
        # EVAL with the script text: a Redis restarted between a SCRIPT LOAD and the EXEC cannot
        # answer NOSCRIPT for some commands of a transaction and run the others.
        head_resp = b"".join(_bulk(part) for part in _as_bytes(head))
        applied = 0
        for lo in range(0, len(keys), self.atomic_rows):
            hi = min(lo + self.atomic_rows, len(keys))
            commands = [_MULTI]
            for start in range(lo, hi, self.chunk_rows):
                stop = min(start + self.chunk_rows, hi)
                parts = [
                    b"*%d\r\n"
                    % (3 + (stop - start) + len(head) + (stop - start) * (1 + len(names))),
                    _EVAL_SCRIPT,
                    _bulk(b"%d" % (stop - start)),
                ]
                parts.extend(_bulk(k + project) for k in keys[start:stop])
                parts.append(head_resp)
                for i in range(start, stop):
                    nanos = int(ts_ns[i])
                    if nanos not in ts_cache:
                        ts_cache[nanos] = _bulk(
                            Timestamp(
                                seconds=nanos // NANOS_PER_SECOND, nanos=nanos % NANOS_PER_SECOND
                            ).SerializeToString()
                        )
                    parts.append(ts_cache[nanos])
                    parts.extend(_bulk(value) for value in rows[i])
                commands.append(b"".join(parts))
            commands.append(_EXEC)
            try:
                answers = self._transaction(b"".join(commands), len(commands))
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                raise RetryableStoreError(
                    f"{self.view_name}: Redis failed while writing rows {lo}-{hi - 1} of "
                    f"{len(keys)} ({exc!r}); rows before {lo} are stored, none of rows "
                    f"{lo}-{hi - 1}; write the batch again (rewrites are idempotent)"
                ) from exc
            applied += sum(int(r) for r in answers)
        return applied

    def _transaction(self, payload: bytes, replies: int) -> list[Any]:
        """Send MULTI, the commands and EXEC on one pooled connection; EXEC's answers."""
        import redis

        # +OK for MULTI, QUEUED per command (a refused command raises here, and Redis then
        # aborts the EXEC), then EXEC's list of script results.
        answers = packed_round_trip(self._redis, payload, replies)[-1]
        if not isinstance(answers, list):
            raise redis.ResponseError(
                f"{self.view_name}: the transaction was not executed ({answers!r})"
            )
        for answer in answers:
            if isinstance(answer, Exception):
                # As redis-py's pipeline does: a script that fails at run time (out of memory,
                # a key of another type) fails the write; Redis has run the others.
                raise redis.ResponseError(f"{self.view_name}: a write script failed: {answer}")
        return answers

    def _write_redis_cluster(
        self,
        keys: list[bytes],
        rows: list[list[bytes]],
        ts_ns: np.ndarray,
        head: list[Any],
        ts_cache: dict[int, bytes],
    ) -> int:
        """One script call per key: a cluster runs a script on one slot, and keys spread over
        all of them. Each row stays atomic (no torn row); a batch is not atomic on a cluster."""
        from google.protobuf.timestamp_pb2 import Timestamp

        sha = self._redis.script_load(_WRITE_SCRIPT)  # on every primary
        project = self.project.encode()
        pipe = self._redis.pipeline()
        for i, key in enumerate(keys):
            nanos = int(ts_ns[i])
            if nanos not in ts_cache:
                ts_cache[nanos] = Timestamp(
                    seconds=nanos // NANOS_PER_SECOND, nanos=nanos % NANOS_PER_SECOND
                ).SerializeToString()
            # execute_command: redis-py blocks the evalsha method on cluster pipelines, not the
            # command, which it routes by its one key.
            pipe.execute_command("EVALSHA", sha, 1, key + project, *head, ts_cache[nanos], *rows[i])
        return sum(int(r) for r in pipe.execute(raise_on_error=True))

    def _write_sqlite(
        self, keys: list[bytes], names: list[str], rows: list[list[bytes]], ts_ns: np.ndarray
    ) -> int:
        from feast.protos.feast.types.Value_pb2 import Value as ValueProto

        if self._sqlite is None:
            self._sqlite = sqlite3.connect(
                sqlite_path(self.store), check_same_thread=False, timeout=30.0
            )
        conn = self._sqlite
        table = sqlite_table(self.project, self.view_name).replace('"', '""')
        # Feast stores event_ts as whole unix seconds (its registered datetime adapter).
        sql = (
            f'INSERT INTO "{table}" (entity_key, feature_name, value, value_text, event_ts, '
            "created_ts) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(entity_key, feature_name) DO "
            "UPDATE SET value = excluded.value, value_text = excluded.value_text, "
            "event_ts = excluded.event_ts, created_ts = excluded.created_ts "
            f'WHERE excluded.event_ts >= "{table}".event_ts'
        )
        now_seconds = int(pd.Timestamp.now(tz="UTC").timestamp())
        text_cache: dict[bytes, str | None] = {}

        def value_text(raw: bytes) -> str | None:
            # Feast fills value_text for strings and numbers (helpers.extract_text_and_num).
            if raw not in text_cache:
                proto = ValueProto()
                proto.ParseFromString(raw)
                kind = proto.WhichOneof("val")
                text_cache[raw] = (
                    str(getattr(proto, kind))
                    if kind in ("string_val", "int64_val", "int32_val", "double_val", "float_val")
                    else None
                )
            return text_cache[raw]

        params = []
        for key, row, nanos in zip(keys, rows, ts_ns.tolist(), strict=True):
            seconds = int(nanos) // NANOS_PER_SECOND
            for name, raw in zip(names, row, strict=True):
                text = None if name == "embedding" else value_text(raw)
                params.append((key, name, raw, text, seconds, now_seconds))
        try:
            with conn:
                before = conn.total_changes
                conn.executemany(sql, params)
                changed = conn.total_changes - before
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                raise ConfigError(
                    f"online table {table} does not exist: run feast apply first"
                ) from exc
            raise
        return changed // len(names)
