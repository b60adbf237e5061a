"""The write path: batches of embeddings into the offline parquet log and the online store.

One code path serves the three SOLARIS views; the columns come from the view's schema in the
registry (the pair view needs ``user_id, item_id, embedding, model_version, computed_at``; the
user view ``user_id, embedding, pair_count, model_version, computed_at``; the similar view
``user_id, item_id, embedding, neighbour_count, mean_distance, model_version, computed_at``).

A batch is checked as a whole first (missing columns, wrong dtypes, negative or duplicate keys,
string ids that are empty or not ``str`` for String join keys,
NaN/Inf or wrong-length vectors, empty versions, naive or missing timestamps, a ``computed_at``
more than the serving clock skew in the future); a bad batch raises
:class:`~solaris_feast.errors.WriteBatchError` naming the rows (positions in the frame) and
nothing of it is written.

Embeddings are encoded by the view's codec (its ``solaris.embedding_codec`` tag, see
:mod:`solaris_feast.store.layout`): online as Feast's float list or quantized bytes, offline
always as float32 lists (training reads the log at full precision). ``model_version`` is stored
online as the version's 8-character tag (:func:`~solaris_feast.store.layout.stored_model_version`:
a 35-character card version costs a quarter of an int8 pair's Redis bytes), offline in full.

Offline: parquet under ``<source path>/<YYYY-MM-DD of computed_at>/part-<content hash>.parquet``.
The log is append-only and the file name is a hash of the rows, so writing the same batch again
finds its file and writes nothing.

Online, newest wins: Feast's Redis writer reads the stored timestamps, then writes in a second
pipeline and silently drops a row whose timestamp is not newer than the stored one. Two things go
wrong with that: a recomputation with the same ``computed_at`` (a fixed model, a retried shard)
is lost, and two writers can interleave between the read and the write. The backend
(``store/backends/``) writes a row when its timestamp is not older than the stored one (ties go
to the later write), atomically: on Redis a Lua script per chunk of rows and up to
``atomic_rows`` rows per MULTI/EXEC transaction (``store.layout.DEFAULT_ATOMIC_ROWS``), so a
crash mid-transaction stores all of it or none and a batch is stored in whole transactions;
on SQLite one upsert transaction per batch; on a Redis Cluster atomic per row. The bytes written
are Feast's own (same keys, fields and ``ValueProto`` encodings), so ``get_online_features``
reads them and the retriever reads what Feast writes.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from solaris_feast.columns import (
    COMPUTED_AT,
    EMBEDDING,
    EVENT_TIMESTAMP,
    FLOAT_EMBEDDING,
    MODEL_VERSION,
    WRITTEN_AT,
)
from solaris_feast.errors import ConfigError, WriteBatchError
from solaris_feast.keys import duplicated_rows
from solaris_feast.serving.resolve import repo_clock_skew
from solaris_feast.store.backends import OnlineBackend, OnlineBatch, backend_for, backend_kind
from solaris_feast.store.ids import join_key_types
from solaris_feast.store.layout import (
    DEFAULT_ATOMIC_ROWS,
    DEFAULT_TRANSACTIONS_IN_FLIGHT,
    ByteColumn,
    EntityKeyLayout,
    QuantizedCodec,
    embedding_codec,
    float_value_column,
    stored_model_version,
)
from solaris_feast.store.tags import TAG_EMBEDDING_CODEC, TAG_EMBEDDING_DIM

if TYPE_CHECKING:
    from feast import FeatureStore, FeatureView

logger = logging.getLogger(__name__)

DEFAULT_CHUNK_ROWS = 256
WRITE_TIMEOUT_SECONDS = 30.0
NANOS_PER_SECOND = 1_000_000_000
NANOS_PER_DAY = 86_400 * NANOS_PER_SECOND


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
class StagedWrite:
    """A batch checked, in the offline log and encoded for the online store: what
    :meth:`EmbeddingWriter.write_offline` returns and :meth:`EmbeddingWriter.write_online`
    sends."""

    rows: int
    offline_files: list[Path]
    offline_files_written: int
    online: OnlineBatch | None
    """``None`` for a writer that does not write online, or an empty batch."""


@dataclass(frozen=True)
class _ValidBatch:
    """A checked batch, normalized: keys ``(N,)`` int64 or object (str) per join key,
    embeddings ``(N, D)``."""

    keys: dict[str, np.ndarray]
    embeddings: np.ndarray
    features: dict[str, np.ndarray]
    computed_at_ns: np.ndarray


def _feature_kind(name: str, dtype: Any) -> str:
    from feast.types import Array, Bytes, Float32, Float64, Int64, String, UnixTimestamp

    # A quantized view stores its embedding as Bytes (store/layout.py); no other Bytes feature.
    if dtype == Array(Float32) or (name == EMBEDDING and dtype == Bytes):
        return EMBEDDING
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


def _bytes_type() -> Any:
    from feast.types import Bytes

    return Bytes


def _key_order(batch: _ValidBatch, rows: np.ndarray, join_keys: list[str]) -> np.ndarray:
    """Positions into ``rows`` sorting them by the join keys (ints or strings)."""
    # np.lexsort cannot sort str objects; sorted unique codes keep each key's order.
    columns = [np.unique(batch.keys[k][rows], return_inverse=True)[1] for k in join_keys]
    return np.lexsort(list(reversed(columns)))


_FLOAT_VALUE_KINDS: dict[str, Literal["float", "double"]] = {
    "float32": "float",
    "float64": "double",
}


def _encoded_value(kind: str, is_model_version: bool, value: Any) -> bytes:
    """Feast's ``ValueProto`` bytes of one timestamp, string or int64 feature value."""
    from feast.protos.feast.types.Value_pb2 import Value as ValueProto

    if kind == "timestamp":
        proto = ValueProto(unix_timestamp_val=int(value) // NANOS_PER_SECOND)
    elif is_model_version:
        proto = ValueProto(string_val=stored_model_version(value))
    elif kind == "string":
        proto = ValueProto(string_val=value)
    elif kind == "int64":
        proto = ValueProto(int64_val=int(value))
    else:
        raise ValueError(f"no scalar ValueProto encoding for {kind} values")
    return proto.SerializeToString()


FLOAT32_MAX = float(np.finfo(np.float32).max)
STALE_TEMP_SECONDS = 3600.0
"""A writer's temp file this old in a day folder is a crashed try's (a live write renames its
own within seconds): removed by the next write there."""


def _remove_stale_temp_files(folder: Path) -> None:
    """Remove the temp files crashed writes left in ``folder`` (readers never open them, but
    they fill the disk); a file another writer removes first is no error."""
    cutoff = time.time() - STALE_TEMP_SECONDS
    for temp in folder.glob(".part-*.tmp"):
        try:
            if temp.stat().st_mtime < cutoff:
                temp.unlink()
                logger.info("removed %s, left by a write that did not finish", temp)
        except FileNotFoundError:
            pass


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
        in_flight: transactions sent before the first one's answers are read (Redis): more
            hides the round trips of a store farther away, fewer keeps serving reads from
            queueing behind several complete transactions.
        backend: the online backend to write through (default: the store's own, made on the
            first write); the writer closes it.
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
        in_flight: int = DEFAULT_TRANSACTIONS_IN_FLIGHT,
        backend: OnlineBackend | None = None,
    ) -> None:
        if chunk_rows <= 0 or atomic_rows <= 0 or in_flight <= 0:
            raise ValueError(
                "chunk_rows, atomic_rows and in_flight must be positive, got "
                f"{chunk_rows}, {atomic_rows}, {in_flight}"
            )
        self.store = store
        self.view: FeatureView = store.get_feature_view(view_name)
        self.view_name = view_name
        self.offline = offline
        self.online = online
        self.chunk_rows = chunk_rows
        self.atomic_rows = atomic_rows
        self.in_flight = in_flight
        self.project = store.config.project
        self.join_keys = list(self.view.join_keys)
        self.feature_kinds = {f.name: _feature_kind(f.name, f.dtype) for f in self.view.features}
        embedding_features = [n for n, k in self.feature_kinds.items() if k == EMBEDDING]
        if embedding_features != [EMBEDDING]:
            raise ConfigError(
                f"view {view_name} must have exactly one Array(Float32) (or, quantized, Bytes) "
                f"feature named 'embedding', has {embedding_features}"
            )
        if self.feature_kinds.get(COMPUTED_AT) != "timestamp":
            raise ConfigError(f"view {view_name} needs a UnixTimestamp feature 'computed_at'")
        dim_tag = self.view.tags.get(TAG_EMBEDDING_DIM)
        if dim_tag is None:
            raise ConfigError(f"view {view_name} has no {TAG_EMBEDDING_DIM} tag")
        self.dim = int(dim_tag)
        # Views applied before codecs existed carry no codec tag: they are float32.
        self.codec = embedding_codec(self.view.tags.get(TAG_EMBEDDING_CODEC, "float32"), self.dim)
        stored_type = next(f.dtype for f in self.view.features if f.name == EMBEDDING)
        if (self.codec.name == "float32") != (stored_type != _bytes_type()):
            raise ConfigError(
                f"view {view_name}: its embedding is {stored_type} but its "
                f"{TAG_EMBEDDING_CODEC} tag says {self.codec.name}; rebuild it with "
                "solaris_definitions and feast apply"
            )
        self.key_layout = EntityKeyLayout(
            self.join_keys, store.config.entity_key_serialization_version
        )
        self.key_types = join_key_types(self.view)
        self.kind = backend_kind(store)  # refuses unsupported stores before any write
        key_ttl = getattr(store.config.online_store, "key_ttl_seconds", None)
        if key_ttl is not None and key_ttl < 0:
            # Feast would pass it to EXPIRE, which deletes the key at once: refuse it instead.
            raise ConfigError(
                f"online_store.key_ttl_seconds must be positive or unset, got {key_ttl}"
            )
        self.key_ttl_seconds = int(key_ttl or 0)
        if backend is not None and backend.project != self.project:
            raise ConfigError(
                f"the backend writes project {backend.project!r}, the store is {self.project!r}"
            )
        self._backend: OnlineBackend | None = backend

    # -- public -------------------------------------------------------------------------------

    @property
    def required_columns(self) -> list[str]:
        return [*self.join_keys, *self.feature_kinds]

    def write(self, frame: pd.DataFrame) -> WriteReport:
        """Check the whole batch, then write it offline and online.

        Args:
            frame: one row per entity key with the view's join keys (int64, or str for String
                keys), ``embedding``
                (a length-D sequence of floats per row), ``model_version`` (str),
                ``computed_at`` (timezone-aware datetime) and the view's other features.

        Raises:
            WriteBatchError: the batch is refused; nothing was written.
        """
        return self.write_online(self.write_offline(frame))

    def write_offline(self, frame: pd.DataFrame) -> StagedWrite:
        """The first half of :meth:`write`: check the whole batch, write it to the offline log
        (a writer with ``offline=True``) and encode it for the online store; nothing is sent
        online.

        The half that needs the CPU and the disk, where :meth:`write_online` mostly waits on
        the store: a caller may run the two on different threads, so that one batch is encoded
        while the one before it is in flight (:class:`~solaris_feast.precompute.compute.
        OrderedWrites` with ``offline_on_caller``). The batch is refused (``WriteBatchError``)
        before anything is written.
        """
        batch = self.validate(frame)
        n = len(batch.computed_at_ns)
        files: list[Path] = []
        written = 0
        if n and self.offline:
            files, written = self._write_offline(batch)
        online = self._online_batch(batch) if n and self.online else None
        return StagedWrite(
            rows=n, offline_files=files, offline_files_written=written, online=online
        )

    def write_online(self, staged: StagedWrite) -> WriteReport:
        """The second half of :meth:`write`: send a batch :meth:`write_offline` staged to the
        online store (all-or-nothing per transaction, see the class)."""
        applied = 0
        if staged.online is not None:
            if self._backend is None:
                # Writes may wait for a busy store far longer than a serving read.
                self._backend = backend_for(self.store, timeout_seconds=WRITE_TIMEOUT_SECONDS)
            applied = self._backend.write_batch(
                staged.online,
                chunk_rows=self.chunk_rows,
                atomic_rows=self.atomic_rows,
                in_flight=self.in_flight,
            )
        return WriteReport(
            rows=staged.rows,
            online_applied=applied,
            offline_files=staged.offline_files,
            offline_files_written=staged.offline_files_written,
        )

    @functools.cached_property
    def clock_skew_seconds(self) -> float:
        """The repo's clock skew (kept in its resolved view's tags): how far a ``computed_at`` may
        be ahead of this machine's clock. Read on first need: parsing the resolved view from the
        registry was most of opening a writer (8.3-8.6 against 2.1-3.9 ms without), and a
        round's rows are never ahead of the clock."""
        return repo_clock_skew(self.store)

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
            keys[key] = self._key_column(frame[key], key, positions, refuse)
        refuse(
            f"duplicate keys {self.join_keys} within the batch",
            duplicated_rows([keys[k] for k in self.join_keys]),
        )

        embeddings = self._embedding_matrix(frame[EMBEDDING], refuse)

        features: dict[str, np.ndarray] = {}
        computed_at_ns = np.zeros(0, dtype=np.int64)
        for name, kind in self.feature_kinds.items():
            if name == EMBEDDING:
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
                if name == COMPUTED_AT:
                    computed_at_ns = values
                    # Serving rejects a vector from the future, and newest-wins would keep it
                    # over every correct rewrite until its time had passed. The repo's skew
                    # (>= 0) is looked up only for a batch with a row ahead of the clock.
                    clock_ns = pd.Timestamp.now(tz="UTC").value
                    if (values > clock_ns).any():
                        skew = self.clock_skew_seconds
                        refuse(
                            f"{name} is more than {skew:.0f} s after this machine's clock (a "
                            "vector from the future is not served, and it would keep later "
                            "rewrites out)",
                            values > clock_ns + int(skew * NANOS_PER_SECOND),
                        )
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
        if self._backend is not None:
            self._backend.close()
            self._backend = None

    # -- checks -------------------------------------------------------------------------------

    def _key_column(
        self, column: pd.Series, key: str, positions: np.ndarray, refuse: Any
    ) -> np.ndarray:
        """``(N,)`` int64 or object (str) ids of one join key, typed as the registry says."""
        id_type = self.key_types[key]
        if id_type == "int64":
            if column.dtype == bool or not pd.api.types.is_integer_dtype(column.dtype):
                raise WriteBatchError(
                    f"{self.view_name}: column {key!r} must be int64, got {column.dtype}",
                    positions.tolist(),
                )
            values = column.to_numpy(dtype=np.int64)
            refuse(f"negative {key}", values < 0)
            return values
        values = column.to_numpy(dtype=object)
        refuse(
            f"{key} must be a non-empty str (String join key)",
            np.array([not (isinstance(v, str) and v) for v in values.tolist()], dtype=bool),
        )
        return values

    def _embedding_matrix(self, column: pd.Series, refuse: Any) -> np.ndarray:
        """``(N, D)`` float32 from a column of length-D sequences."""
        values = column.tolist()
        stacked = self._stacked_embeddings(values)
        if stacked is not None:
            # Every row a numeric length-D vector (what the precompute and the fill write): the
            # checks below run on the whole matrix; per row they were a fifth of a write's time.
            if stacked.dtype.kind == "f" and stacked.dtype.itemsize > 4:
                # Only a wider float can hold a finite value float32 would make inf.
                refuse(
                    "embedding has values beyond float32's range (about 3.4e38)",
                    (np.abs(stacked) > FLOAT32_MAX).any(axis=1) & np.isfinite(stacked).all(axis=1),
                )
            matrix = stacked.astype(np.float32, copy=False)
        else:
            matrix = self._embedding_rows(values, refuse)
        refuse("embedding has NaN or Inf", ~np.isfinite(matrix).all(axis=1))
        refuse(
            f"embedding is out of the range of the view's {self.codec.name} codec",
            self.codec.unrepresentable(matrix),
        )
        return matrix

    def _stacked_embeddings(self, values: list[Any]) -> np.ndarray | None:
        """``(N, D)`` in the rows' own dtype when every row is a numeric ndarray of shape
        ``(D,)``, else None (the row-by-row path then names the bad rows)."""
        shape = (self.dim,)
        if not all(
            type(v) is np.ndarray and v.shape == shape and v.dtype.kind in "fiub" for v in values
        ):
            return None
        if not values:
            return np.zeros((0, self.dim), dtype=np.float32)
        # The rows are (D,) each (checked above): one concatenate is 3x np.stack's speed.
        return np.concatenate(values).reshape(len(values), self.dim)

    def _embedding_rows(self, values: list[Any], refuse: Any) -> np.ndarray:
        """The row-by-row conversion of :meth:`_embedding_matrix`, refusing rows that are not
        numeric, have another length or overflow float32."""
        n = len(values)
        matrix = np.zeros((n, self.dim), dtype=np.float32)
        wrong_shape = np.zeros(n, dtype=bool)
        not_numeric = np.zeros(n, dtype=bool)
        too_large = np.zeros(n, dtype=bool)
        for i, value in enumerate(values):
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
            if (np.abs(row) > FLOAT32_MAX).any() and np.isfinite(row).all():
                too_large[i] = True  # finite, but float32 would hold inf
                continue
            matrix[i] = row
        refuse("embedding is missing or not numeric", not_numeric)
        refuse(f"embedding must have length {self.dim}", wrong_shape)
        refuse("embedding has values beyond float32's range (about 3.4e38)", too_large)
        return matrix

    # -- offline ------------------------------------------------------------------------------

    def _write_offline(self, batch: _ValidBatch) -> tuple[list[Path], int]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from solaris_feast.store.offline import offline_view_root

        root = offline_view_root(self.store, self.view)
        # UTC day of each row as an integer; only the distinct days are formatted.
        day_index = np.floor_divide(batch.computed_at_ns, NANOS_PER_DAY)
        files: list[Path] = []
        written = 0
        written_at = pd.Timestamp.now(tz="UTC")
        for index in np.unique(day_index).tolist():
            day = pd.Timestamp(index * NANOS_PER_DAY, unit="ns", tz="UTC").strftime("%Y-%m-%d")
            rows = np.flatnonzero(day_index == index)
            # Sorted by key so the same rows in another order hash to the same file.
            order = rows[_key_order(batch, rows, self.join_keys)]
            digest = self._content_hash(batch, order)
            path = root / day / f"part-{digest}.parquet"
            files.append(path)
            if path.exists():
                try:
                    pq.read_metadata(path)
                    continue  # the same rows, written before: nothing to do
                except (pa.ArrowInvalid, OSError) as exc:
                    # Named by its rows' hash: these very rows, left unreadable (a crash, a
                    # disk fault). Written again below, whole.
                    logger.warning(
                        "offline file %s is unreadable (%s): writing it again", path, exc
                    )
            columns: dict[str, Any] = {k: pa.array(batch.keys[k][order]) for k in self.join_keys}
            emb = batch.embeddings[order]
            floats = pa.FixedSizeListArray.from_arrays(
                pa.array(emb.reshape(-1), type=pa.float32()), self.dim
            ).cast(pa.list_(pa.float32()))
            if isinstance(self.codec, QuantizedCodec):
                # The feature is Feast Bytes: `feast materialize` copies this column online, so
                # it holds the bytes this writer stores online (float lists there became null
                # embeddings, silently); training reads the float32 beside it.
                columns[EMBEDDING] = pa.array(self.codec.payloads(emb), type=pa.binary())
                columns[FLOAT_EMBEDDING] = floats
            else:
                columns[EMBEDDING] = floats
            for name, values in batch.features.items():
                kind = self.feature_kinds[name]
                if kind == "timestamp":
                    columns[name] = pa.array(values[order], type=pa.timestamp("ns", tz="UTC"))
                elif kind == "float32":
                    columns[name] = pa.array(values[order].astype(np.float32))
                else:
                    columns[name] = pa.array(values[order])
            columns[EVENT_TIMESTAMP] = pa.array(
                batch.computed_at_ns[order], type=pa.timestamp("ns", tz="UTC")
            )
            columns[WRITTEN_AT] = pa.array(
                [written_at.value] * len(order), type=pa.timestamp("ns", tz="UTC")
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            _remove_stale_temp_files(path.parent)
            # Written beside and renamed: a reader never sees half a file.
            temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
            # Dictionary-encode every column but the vectors: their values are nearly all
            # distinct, and trying a dictionary on them made the write 3.7x slower and its file
            # 1.4x bigger (12.7k rows, D = 32).
            pq.write_table(
                pa.table(columns),
                temp,
                use_dictionary=[name for name in columns if name != EMBEDDING],
            )
            os.replace(temp, path)
            written += 1
        return files, written

    def _content_hash(self, batch: _ValidBatch, order: np.ndarray) -> str:
        digest = hashlib.sha256(self.view_name.encode())
        for key in self.join_keys:
            values = batch.keys[key][order]
            if values.dtype == object:
                # Length-prefixed, so ("a:", "b") and ("a", ":b") hash apart.
                for text in values.tolist():
                    raw = text.encode("utf-8")
                    digest.update(len(raw).to_bytes(4, "little") + raw)
            else:
                digest.update(np.ascontiguousarray(values).tobytes())
        digest.update(np.ascontiguousarray(batch.embeddings[order]).tobytes())
        for name in sorted(batch.features):
            values = batch.features[name][order]
            if values.dtype == object:
                digest.update("\x1f".join(values.tolist()).encode())
            else:
                digest.update(np.ascontiguousarray(values).tobytes())
        return digest.hexdigest()[:24]

    # -- online -------------------------------------------------------------------------------

    def _encoded_columns(self, batch: _ValidBatch) -> tuple[list[str], list[ByteColumn]]:
        """Feature names and, per feature, its rows' ``ValueProto`` bytes in that order."""
        names = [EMBEDDING]
        columns = [self.codec.encode_column(batch.embeddings)]
        for name, values in batch.features.items():
            kind = self.feature_kinds[name]
            names.append(name)
            if kind in _FLOAT_VALUE_KINDS:
                # Nearly every row distinct (a fill's mean distances): packed as one matrix.
                columns.append(float_value_column(values, _FLOAT_VALUE_KINDS[kind]))
            else:
                # One encoding per distinct value: a round's version and time are one value.
                encode = functools.partial(_encoded_value, kind, name == MODEL_VERSION)
                columns.append(ByteColumn.encoded(values, encode))
        return names, columns

    def _online_batch(self, batch: _ValidBatch) -> OnlineBatch:
        names, columns = self._encoded_columns(batch)
        return OnlineBatch(
            view_name=self.view_name,
            keys=self.key_layout.key_column([batch.keys[k] for k in self.join_keys]),
            feature_names=names,
            columns=columns,
            event_ts_ns=batch.computed_at_ns,
            key_ttl_seconds=self.key_ttl_seconds,
        )
