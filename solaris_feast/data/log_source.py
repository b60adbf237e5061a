"""The user's own tables: the interaction log, its attribute tables and per-round candidates.

A log is parquet: one file, a folder of files (read as one pyarrow dataset, recursively) or any
URL a pyarrow filesystem opens (``s3://``, ``gs://``, ``hdfs://``, ``file://``). Its columns are
mapped onto the project's schema (:mod:`solaris_feast.data.schema`) by :class:`LogColumns`; extra
columns are never read. A round reads only the time window it needs: :func:`read_log_window`
hands pyarrow a filter on the timestamp column, so row groups (and, with hive partitioning,
whole files) outside the window are skipped by their statistics and only the mapped columns of
the window's rows are materialized (measured in ``benchmarks/README.md``).

Bad input is refused before anything is written, naming the file and column: a mapped column
that is missing or has the wrong type, a timestamp without a zone (unless declared UTC),
duplicate ids in an attribute table, a path that does not exist.

Cost: the config models here import pydantic only, because the pipeline's settings (imported
while Airflow parses the DAG files) hold them; pyarrow and pandas are imported by the readers.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from solaris_feast.columns import EVENT_TIMESTAMP, ITEM_ID, USER_ID

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.dataset as pads

    from solaris_feast.data.schema import InteractionDataset

_CONFIG = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
logger = logging.getLogger(__name__)

DEFAULT_HISTORY_SECONDS = 7 * 86_400
"""A round reads a week of the log before its time unless told otherwise."""


class LogColumns(BaseModel):
    """Which of the log's columns hold the user, the item, the time and the labels."""

    model_config = _CONFIG

    user: str = USER_ID
    """Column of the user id: integers (up to 2**63-1) or strings (see id_space)."""
    item: str = ITEM_ID
    """Column of the item id: integers (up to 2**63-1) or strings (see id_space)."""
    timestamp: str = EVENT_TIMESTAMP
    """Column of the impression time (a parquet timestamp; with a zone, or see
    timestamps_without_zone_are_utc)."""
    labels: list[str] = Field(min_length=1)
    """Binary label columns (0/1 or booleans), main task first; their names become the models'
    task names."""

    @model_validator(mode="after")
    def _distinct(self) -> LogColumns:
        names = [self.user, self.item, self.timestamp, *self.labels]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"a column is mapped twice: {repeated}")
        # The log is read into columns of these names; a label of one of them would replace the
        # ids or times it names (a label 'user_id' made every user 0 or 1, unsaid).
        reserved = sorted({USER_ID, ITEM_ID, EVENT_TIMESTAMP} & set(self.labels))
        if reserved:
            raise ValueError(
                f"labels {reserved} are named like the columns the log is read into "
                f"({USER_ID}, {ITEM_ID}, {EVENT_TIMESTAMP}): rename them in the log"
            )
        return self


class AttributeTable(BaseModel):
    """A user or item attribute table: one row per id."""

    model_config = _CONFIG

    path: str = Field(min_length=1)
    """Parquet file, folder or URL."""
    id_column: str = Field(min_length=1)
    """Column of the user (or item) id, the same ids as the log's."""
    categorical: list[str] = []
    """Integer code columns (0..cardinality-1)."""
    dense: list[str] = []
    """Float columns."""


class InteractionLogConfig(BaseModel):
    """The user's interaction log: where it is, how its columns map, how much a round reads."""

    model_config = _CONFIG

    path: str = ""
    """Parquet file, folder or URL of the log (or set feast_source instead)."""
    feast_source: str = ""
    """Name of a Feast FileSource registered in the Feast repo whose path is the log."""
    name: str = "log"
    """Short name of the log, recorded on the model cards as their data set."""
    id_space: Literal["vocabulary", "dense"] = "vocabulary"
    """vocabulary: ids as your systems have them (Int64 up to 2**63-1 or strings); the reference
    models map them through a vocabulary built at training time, and ids they never saw share an
    out-of-vocabulary row. dense: integer ids 0..N-1 that index the reference models' tables
    directly (sized by num_users / num_items)."""
    columns: LogColumns
    """Column mapping."""
    users: AttributeTable | None = None
    """Optional user attribute table."""
    items: AttributeTable | None = None
    """Optional item attribute table."""
    history_seconds: int = Field(DEFAULT_HISTORY_SECONDS, gt=0)
    """A round reads the log from its time minus history_seconds: the users' histories and the
    built-in candidate generators see that window, never older events."""
    num_users: int | None = Field(None, gt=0)
    """With id_space dense: size of the user id space (ids 0..num_users-1); null: the largest id
    read plus one. Set it so models trained today have room for tomorrow's users."""
    num_items: int | None = Field(None, gt=0)
    """With id_space dense: size of the item id space, as num_users."""
    timestamps_without_zone_are_utc: bool = False
    """Read a timestamp column stored without a time zone as UTC (refused otherwise)."""
    partition_column: str = ""
    """Hive partition folder name holding the UTC day of the rows (``<name>=YYYY-MM-DD/``):
    files of days outside a round's window are never opened. Empty: no day partitions (row
    groups outside the window are still skipped by their statistics)."""

    @model_validator(mode="after")
    def _one_location(self) -> InteractionLogConfig:
        if bool(self.path) == bool(self.feast_source):
            raise ValueError("log: set exactly one of path or feast_source")
        if self.id_space == "vocabulary" and (self.num_users or self.num_items):
            raise ValueError("log: num_users / num_items size a dense id space (id_space: dense)")
        return self

    @property
    def dense_ids(self) -> bool:
        return self.id_space == "dense"


class CandidateTableConfig(BaseModel):
    """The user's retrieval output: a candidate table per round."""

    model_config = _CONFIG

    path: str = Field(min_length=1)
    """Parquet file, folder or URL of a round's candidates. May name the round's time as
    ``{now:%Y%m%dT%H%M%SZ}`` (any strftime format): one table per round."""
    user_column: str = USER_ID
    """Column of the user id."""
    item_column: str = ITEM_ID
    """Column of the item id."""
    score_column: str = ""
    """Column of the retrieval score (>= 0, higher is better); empty: the row order within a user
    is the rank."""

    @field_validator("path")
    @classmethod
    def _placeholders_are_the_rounds_time(cls, path: str) -> str:
        # Checked when the config loads, not when a round has already made its folder: a
        # placeholder other than {now...} (a KeyError) or a broken brace (a ValueError).
        from datetime import UTC

        try:
            path.format(now=datetime(2026, 1, 1, tzinfo=UTC))
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise ValueError(
                f"{path!r} may name only the round's time, as {{now:%Y%m%dT%H%M%SZ}} (a literal "
                f"brace is written twice: {{{{ }}}}); formatting it failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return path

    def path_at(self, now: datetime) -> str:
        """The table of the round planned for ``now``."""
        return self.path.format(now=now)


# -- readers ------------------------------------------------------------------------------------


def open_parquet(
    location: str, what: str, days: tuple[str, str, str] | None = None
) -> pads.Dataset:
    """``location`` (file, folder or URL) as a pyarrow dataset; ``what`` names it in errors.

    ``days`` (partition column, first and last UTC day ``YYYY-MM-DD``) keeps only the files
    under ``<column>=<day>/`` folders of those days, chosen by their paths before any is opened.

    Raises:
        ConfigError: the location does not exist or is not parquet.
    """
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs

    from solaris_feast.errors import ConfigError

    try:
        filesystem, path = pafs.FileSystem.from_uri(location)
    except (ValueError, TypeError):  # a plain local path (relative, or with odd characters)
        filesystem, path = pafs.LocalFileSystem(), location
    try:
        info = filesystem.get_file_info(path)
    except OSError as exc:
        raise ConfigError(f"{what} {location}: cannot be reached: {exc}") from exc
    if info.type == pafs.FileType.NotFound:
        raise ConfigError(f"{what} {location} does not exist")
    source: str | list[str] = path
    if days is not None and info.type == pafs.FileType.Directory:
        source = _files_of_days(filesystem, path, *days)
        if not source:
            raise ConfigError(
                f"{what} {location} has no {days[0]}=<day> folder from {days[1]} to {days[2]}"
            )
    try:
        return pads.dataset(source, filesystem=filesystem, format="parquet", partitioning="hive")
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... for a non-parquet file
        raise ConfigError(f"{what} {location} is not readable as parquet: {exc}") from exc


def _files_of_days(filesystem: Any, root: str, column: str, first: str, last: str) -> list[str]:
    """Parquet files under ``root`` whose ``<column>=<day>`` folder lies in ``[first, last]``
    (ISO days compare as strings); files outside any such folder are kept."""
    import pyarrow.fs as pafs

    prefix = f"{column}="
    chosen: list[str] = []
    partitioned = 0
    other_folders: set[str] = set()
    for entry in filesystem.get_file_info(pafs.FileSelector(root, recursive=True)):
        if entry.type != pafs.FileType.File or Path(entry.path).name.startswith((".", "_")):
            continue
        # Below the root only: a root such as s3://b/env=prod/log is not partitioned by env.
        below = entry.path[len(root) :] if entry.path.startswith(root) else entry.path
        folders = Path(below).parts[:-1]
        parts = [p[len(prefix) :] for p in folders if p.startswith(prefix)]
        partitioned += bool(parts)
        other_folders.update(p.split("=")[0] for p in folders if "=" in p)
        if not parts or first <= parts[-1] <= last:
            chosen.append(entry.path)
    if chosen and not partitioned:
        # Correct rows either way, but every file is opened each round: most likely a
        # misnamed column, which nothing else would say.
        seen = f" (its folders are partitioned by {sorted(other_folders)})" if other_folders else ""
        logger.warning(
            "log.partition_column %r: no %s<day> folder under %s%s, so every file is read",
            column,
            prefix,
            root,
            seen,
        )
    return sorted(chosen)


def _require_columns(
    schema: pa.Schema, where: str, columns: dict[str, str], check: dict[str, str]
) -> None:
    """Refuse a mapped column that is missing or of the wrong kind, naming file and column.

    ``columns`` maps a role (``user``) to the user's column; ``check`` a role to the kind it must
    be: ``integer``, ``id`` (integer or string), ``timestamp``, ``label`` (integer, boolean or
    float) or ``float``.
    """
    import pyarrow.types as pat

    from solaris_feast.errors import SchemaError

    def is_id(t: pa.DataType) -> bool:
        # A pandas category column is stored dictionary-encoded: its values are the ids.
        if pat.is_dictionary(t):
            t = t.value_type
        return pat.is_integer(t) or pat.is_string(t) or pat.is_large_string(t)

    kinds = {
        "integer": pat.is_integer,
        "id": is_id,
        "timestamp": pat.is_timestamp,
        "label": lambda t: pat.is_integer(t) or pat.is_boolean(t) or pat.is_floating(t),
        "float": lambda t: pat.is_integer(t) or pat.is_floating(t),
    }
    for role, column in columns.items():
        if column not in schema.names:
            raise SchemaError(
                where, column, f"(mapped as {role}) is missing; columns present: {schema.names}"
            )
        kind = check[role]
        if pat.is_null(schema.field(column).type):
            raise SchemaError(
                where,
                column,
                f"(mapped as {role}) has no type (pyarrow null): every value is missing, or the "
                f"file was written from an empty untyped column (pandas' empty object column); "
                f"write it as {kind}",
            )
        if not kinds[kind](schema.field(column).type):
            raise SchemaError(
                where,
                column,
                f"(mapped as {role}) must be {kind}, got {schema.field(column).type}",
            )


def _window_filter(
    column: str, arrow_type: pa.DataType, start: datetime | None, end: datetime
) -> pads.Expression:
    """``[start, end)`` of ``column`` in its own type; a row without a time is kept, so that
    the schema check refuses it (a comparison with null is null, and the filter alone would
    drop it unsaid)."""
    import pyarrow.dataset as pads

    window = pads.field(column) < _as_scalar(end, arrow_type)
    if start is not None:
        window = window & (pads.field(column) >= _as_scalar(start, arrow_type))
    return window | pads.field(column).is_null()


def _read_window(
    dataset: pads.Dataset,
    columns: list[str],
    timestamp: str,
    start: datetime | None,
    end: datetime,
    where: str,
) -> pa.Table:
    """The window's rows of ``columns``. Files whose timestamp column has another zone or unit
    than the first file's (two writers, one in Europe/Berlin) hold the same instants, but
    pyarrow cannot compare them under one filter; those logs are read file by file, each
    filtered in its own type and cast to the first file's.

    Raises:
        SchemaError: naming the file and the column that a file lacks, holds another kind in
            than the first file (text ids beside integer ones, floats beside booleans, a time
            without a zone beside one with), or stores in a type that cannot be read as the
            first file's.
    """
    import pyarrow as pa

    from solaris_feast.errors import SchemaError

    ts_type = dataset.schema.field(timestamp).type
    target = pa.schema([dataset.schema.field(name) for name in columns])
    fragments = list(dataset.get_fragments())
    # pyarrow reads every file as the first file's schema and casts what it can: integer ids
    # to text (item 7 beside "sku:7"), a label of 0.5 to True, a time without a zone to UTC,
    # each unsaid. Every file's own types are checked first (a footer read per file of the
    # window, which the read opens anyway); only a width or a zone may differ.
    for fragment in fragments:
        _check_file_kinds(fragment, target, where)
    try:
        return dataset.to_table(
            columns=columns, filter=_window_filter(timestamp, ts_type, start, end)
        )
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowInvalid):
        pass  # types differ between files: each file in its own
    tables = []
    for fragment in fragments:
        own = fragment.physical_schema
        path = getattr(fragment, "path", "?")
        try:
            piece = fragment.to_table(
                columns=columns,
                filter=_window_filter(timestamp, own.field(timestamp).type, start, end),
            )
            tables.append(piece.cast(target))
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowInvalid) as exc:
            differs = [name for name in columns if own.field(name).type != target.field(name).type]
            column = differs[0] if differs else timestamp
            raise SchemaError(
                f"{where} (file {path})",
                column,
                f"is {own.field(column).type} here and {target.field(column).type} in the "
                f"log's first file, which cannot be read as one ({exc}): write every file "
                "with the same column types",
            ) from exc
    return pa.concat_tables(tables) if tables else target.empty_table()


def _type_kind(arrow_type: pa.DataType) -> str:
    """What a column holds, whatever its width: files may differ in width (int32 beside int64,
    large_string beside string) or a timestamp's zone and unit, never in kind."""
    import pyarrow.types as pat

    if pat.is_dictionary(arrow_type):  # a pandas category column: its values are what counts
        arrow_type = arrow_type.value_type
    for kind, test in (
        ("integer", pat.is_integer),
        ("floating", pat.is_floating),
        ("boolean", pat.is_boolean),
        ("text", lambda t: pat.is_string(t) or pat.is_large_string(t)),
    ):
        if test(arrow_type):
            return kind
    if pat.is_timestamp(arrow_type):
        return "timestamp without a zone" if arrow_type.tz is None else "timestamp with a zone"
    return str(arrow_type)


def _check_file_kinds(fragment: Any, target: pa.Schema, where: str) -> None:
    """Refuse a file of the log that lacks a column or holds another kind in it than the first
    file, naming the file, the column and both types."""
    from solaris_feast.errors import SchemaError

    own = fragment.physical_schema
    path = getattr(fragment, "path", "?")
    for field in target:
        if own.get_field_index(field.name) < 0:
            raise SchemaError(f"{where} (file {path})", field.name, "is missing from this file")
        here = own.field(field.name).type
        if _type_kind(here) != _type_kind(field.type):
            raise SchemaError(
                f"{where} (file {path})",
                field.name,
                f"is {here} here and {field.type} in the log's first file "
                f"({_type_kind(here)} against {_type_kind(field.type)}), which would be read "
                "as the first file's kind unsaid: write every file with the same column types",
            )


def _as_scalar(moment: datetime, arrow_type: pa.DataType) -> pa.Scalar:
    """``moment`` in the timestamp column's own type, so the filter compares without a cast
    (a cast of the column would defeat the row-group statistics)."""
    import pandas as pd
    import pyarrow as pa

    stamp = pd.Timestamp(moment).tz_convert("UTC")
    if getattr(arrow_type, "tz", None) is None:
        stamp = stamp.tz_localize(None)
    return pa.scalar(stamp, type=arrow_type)


def own_column(config: InteractionLogConfig, column: str) -> str:
    """The log's own name of a schema column (``user_id`` -> the column mapped as user), for an
    error about the log to name the column its owner knows."""
    cols = config.columns
    return {USER_ID: cols.user, ITEM_ID: cols.item, EVENT_TIMESTAMP: cols.timestamp}.get(
        column, column
    )


def log_location(config: InteractionLogConfig) -> str:
    """Where the log is read from (the FileSource's path is resolved by the config first)."""
    from solaris_feast.errors import ConfigError

    if not config.path:
        raise ConfigError(
            f"log: feast_source {config.feast_source!r} was not resolved to a path; "
            "load the config through solaris_feast.config.load_config"
        )
    return config.path


_REPEATS_SAID: set[tuple[str, datetime | None, datetime, int]] = set()
"""Windows whose repeated rows this process has warned of already."""


def read_log_window(
    config: InteractionLogConfig, start: datetime | None, end: datetime
) -> InteractionDataset:
    """The log's events in ``[start, end)`` (``start`` None: from the beginning) as the schema's
    :class:`InteractionDataset`, with the attribute tables read whole.

    Only the mapped columns of the window's rows are read. ``metadata["rows_read"]`` is the
    number of log rows pyarrow returned, ``metadata["repeated_rows"]`` how many of them repeat
    another row exactly (kept, and logged as a warning).

    Raises:
        ConfigError: the log or a table does not exist or is not parquet.
        SchemaError: naming the file and column, for a missing mapped column, a wrong type, a
            timestamp without a zone, non-binary labels, ids outside the id space, or duplicate
            ids in an attribute table.
    """
    import numpy as np
    import pandas as pd
    import pyarrow.types as pat

    from solaris_feast.data.schema import (
        EVENT_TIMESTAMP,
        ITEM_ID,
        USER_ID,
        InteractionDataset,
        validate_interactions,
    )
    from solaris_feast.errors import SchemaError
    from solaris_feast.store.ids import id_type_of

    location = log_location(config)
    where = f"log {location}"
    days = None
    if config.partition_column:
        first = "0000-00-00" if start is None else f"{_utc_day(start)}"
        days = (config.partition_column, first, _utc_day(end))
    dataset = open_parquet(location, "log", days)
    cols = config.columns
    roles = {"user": cols.user, "item": cols.item, "timestamp": cols.timestamp}
    roles |= {f"label {name}": name for name in cols.labels}
    id_kind = "integer" if config.dense_ids else "id"
    kinds = {"user": id_kind, "item": id_kind, "timestamp": "timestamp"}
    kinds |= {f"label {name}": "label" for name in cols.labels}
    _require_columns(dataset.schema, where, roles, kinds)
    ts_type = dataset.schema.field(cols.timestamp).type
    if ts_type.tz is None and not config.timestamps_without_zone_are_utc:
        raise SchemaError(
            where,
            cols.timestamp,
            "is a timestamp without a time zone: store it with one, or set "
            "log.timestamps_without_zone_are_utc: true if it is UTC",
        )
    table = _read_window(dataset, list(roles.values()), cols.timestamp, start, end, where)
    frame = table.to_pandas()
    ts = pd.to_datetime(frame[cols.timestamp])
    ts = ts.dt.tz_localize("UTC") if ts.dt.tz is None else ts.dt.tz_convert("UTC")
    interactions = pd.DataFrame(
        {
            USER_ID: _ids(frame[cols.user], where),
            ITEM_ID: _ids(frame[cols.item], where),
            EVENT_TIMESTAMP: ts.astype("datetime64[ns, UTC]"),
        }
    )
    for name in cols.labels:
        values = frame[name]
        if pat.is_boolean(table.schema.field(name).type):
            # A null stays missing (NaN), for the check below to count and name; a cast to
            # int64 raised pandas's "cannot convert NA to integer" without a column.
            floats = values.astype("Float64").to_numpy(np.float64, na_value=np.nan)
            values = floats if np.isnan(floats).any() else floats.astype(np.int64)
        interactions[name] = values
    try:
        validate_interactions(interactions, tuple(cols.labels), config.dense_ids)
    except SchemaError as exc:
        raise SchemaError(where, own_column(config, exc.column), exc.problem) from exc
    interactions = interactions.sort_values(EVENT_TIMESTAMP, kind="stable").reset_index(drop=True)
    repeated = int(interactions.duplicated().sum())
    said = (location, start, end, repeated)
    if repeated and said not in _REPEATS_SAID:
        # Read as they are (a feed may log one impression twice on purpose), but said, once
        # per window in a process (a round reads its window in several steps): a writer that
        # retried its upload without dedup inflates histories and labels unsaid.
        _REPEATS_SAID.add(said)
        logger.warning(
            "%s: %d of %d rows in the window repeat another row exactly (user, item, time and "
            "labels); they are read as they are: drop them upstream if they are a writer's "
            "retries",
            where,
            repeated,
            len(interactions),
        )

    users, user_cat, user_dense = _attributes(config.users, USER_ID, "users", config.dense_ids)
    items, item_cat, item_dense = _attributes(config.items, ITEM_ID, "items", config.dense_ids)
    for attribute_table, attributes, key, column in (
        (config.users, users, USER_ID, cols.user),
        (config.items, items, ITEM_ID, cols.item),
    ):
        # A table keyed by another id type than the log's matches no row: every attribute
        # would be missing, unsaid.
        if attribute_table is not None and len(attributes) and len(interactions):
            have, log_has = id_type_of(attributes[key]), id_type_of(interactions[key])
            if have != log_has:
                raise SchemaError(
                    f"{'users' if key == USER_ID else 'items'} table {attribute_table.path}",
                    attribute_table.id_column,
                    f"holds {have} ids, the log's column {column!r} holds {log_has} ids",
                )
    if config.dense_ids:
        num_users = _id_space(config.num_users, interactions[USER_ID], users[USER_ID])
        num_items = _id_space(config.num_items, interactions[ITEM_ID], items[ITEM_ID])
        _check_dense_ids(interactions, where, cols, num_users, num_items)
    else:  # any Int64 or String ids: the counts are for reports only
        num_users = int(interactions[USER_ID].nunique())
        num_items = int(interactions[ITEM_ID].nunique())
    return InteractionDataset(
        name=config.name,
        interactions=interactions,
        users=users,
        items=items,
        label_columns=tuple(cols.labels),
        num_users=num_users,
        num_items=num_items,
        user_categorical=user_cat,
        item_categorical=item_cat,
        user_dense=user_dense,
        item_dense=item_dense,
        metadata={"rows_read": table.num_rows, "source": location, "repeated_rows": repeated},
        dense_ids=config.dense_ids,
    )


def _check_dense_ids(
    interactions: pd.DataFrame, where: str, cols: LogColumns, num_users: int, num_items: int
) -> None:
    from solaris_feast.errors import SchemaError

    for column, mapped, bound, table_name in (
        (USER_ID, cols.user, num_users, "num_users"),
        (ITEM_ID, cols.item, num_items, "num_items"),
    ):
        values = interactions[column].to_numpy()
        if len(values) and (values.min() < 0 or values.max() >= bound):
            raise SchemaError(
                where,
                mapped,
                f"has ids outside 0..{bound - 1} (log.{table_name}; "
                f"min {values.min()}, max {values.max()})",
            )


def _ids(column: pd.Series, where: str) -> Any:
    """A column of ids as the schema holds them: int64, or object of str.

    Raises:
        SchemaError: unsigned ids beyond int64 (``where`` names the file), which a cast would
            wrap into negative ones and the schema check would then call negative.
    """
    import numpy as np
    import pandas as pd

    from solaris_feast.errors import SchemaError

    if isinstance(column.dtype, pd.CategoricalDtype):
        # Dictionary-encoded in the file (a pandas category column): its values are the ids.
        column = column.astype(object if column.hasnans else column.cat.categories.dtype)
    if pd.api.types.is_unsigned_integer_dtype(column) and len(column):
        largest = int(column.max())
        if largest > np.iinfo(np.int64).max:
            raise SchemaError(
                where,
                str(column.name),
                f"holds unsigned ids up to {largest}, beyond int64, the widest integer key "
                "Feast stores: store them as strings",
            )
    if pd.api.types.is_integer_dtype(column) and not column.hasnans:
        return column.to_numpy(np.int64)
    # A nullable Int64 column with nulls stays object, its nulls None: the schema check then
    # refuses it naming the file, the column and the positions, as it does a null string id.
    return column.astype(object).where(column.notna(), None).to_numpy()


def _utc_day(moment: datetime) -> str:
    import pandas as pd

    return str(pd.Timestamp(moment).tz_convert("UTC").strftime("%Y-%m-%d"))


def _id_space(configured: int | None, *ids: pd.Series) -> int:
    if configured is not None:
        return configured
    return max([int(s.max()) + 1 for s in ids if len(s)] or [1])


def _attributes(
    table: AttributeTable | None, key: str, kind: str, dense_ids: bool = True
) -> tuple[pd.DataFrame, tuple[str, ...], tuple[str, ...]]:
    """An attribute table renamed to the schema's key, with its categorical and dense columns."""
    import numpy as np
    import pandas as pd

    from solaris_feast.errors import SchemaError

    if table is None:
        return pd.DataFrame({key: np.zeros(0, dtype=np.int64)}), (), ()
    where = f"{kind} table {table.path}"
    dataset = open_parquet(table.path, f"{kind} table")
    roles = {"id": table.id_column}
    roles |= {f"categorical {c}": c for c in table.categorical}
    roles |= {f"dense {c}": c for c in table.dense}
    id_kind = "integer" if dense_ids else "id"
    kinds = {"id": id_kind} | {f"categorical {c}": "integer" for c in table.categorical}
    kinds |= {f"dense {c}": "float" for c in table.dense}
    _require_columns(dataset.schema, where, roles, kinds)
    frame = dataset.to_table(columns=list(dict.fromkeys(roles.values()))).to_pandas()
    duplicated = frame[table.id_column].duplicated()
    if duplicated.any():
        first = frame.loc[duplicated, table.id_column].iloc[0]
        raise SchemaError(
            where,
            table.id_column,
            f"has {int(duplicated.sum())} duplicate ids, for instance {first}",
        )
    ids = _ids(frame[table.id_column], where)
    if len(ids) and ids.dtype != object and ids.min() < 0:
        raise SchemaError(where, table.id_column, "has negative ids")
    for column in table.categorical:
        missing = int(frame[column].isna().sum())
        if missing:
            raise SchemaError(where, column, f"has {missing} missing codes")
        if len(frame) and frame[column].min() < 0:
            raise SchemaError(where, column, "must hold non-negative integer codes")
    for column in table.dense:
        if not np.isfinite(frame[column].to_numpy(np.float64)).all():
            raise SchemaError(where, column, "has NaN or infinite values")
    out = frame.drop(columns=[table.id_column]).assign(**{key: ids})
    out = out[[key, *table.categorical, *table.dense]]
    return out.reset_index(drop=True), tuple(table.categorical), tuple(table.dense)


def read_candidate_table(
    config: CandidateTableConfig,
    now: datetime,
    num_users: int | None,
    num_items: int | None,
    candidates_per_user: int | None = None,
) -> pd.DataFrame:
    """The candidate table of the round at ``now`` in the generated table's form
    (:func:`solaris_feast.precompute.candidates.validate_candidate_table`), each user's best
    ``candidates_per_user`` rows; with ``num_users`` / ``num_items`` (a dense id space) ids must
    lie in them, else they are Int64 or String ids of any value.

    Raises:
        ConfigError: the table does not exist or is not parquet.
        SchemaError: naming the file and column.
    """
    from solaris_feast.data.schema import ITEM_ID, USER_ID
    from solaris_feast.errors import SchemaError
    from solaris_feast.precompute.candidates import CANDIDATE_SCORE, validate_candidate_table

    location = config.path_at(now)
    where = f"candidate table {location}"
    dataset = open_parquet(location, "candidate table")
    roles = {"user": config.user_column, "item": config.item_column}
    id_kind = "id" if num_users is None else "integer"
    kinds = {"user": id_kind, "item": id_kind}
    if config.score_column:
        roles["score"] = config.score_column
        kinds["score"] = "float"
    _require_columns(dataset.schema, where, roles, kinds)
    frame = dataset.to_table(columns=list(roles.values())).to_pandas()
    renamed = frame.rename(
        columns={config.user_column: USER_ID, config.item_column: ITEM_ID}
        | ({config.score_column: CANDIDATE_SCORE} if config.score_column else {})
    )
    users = renamed[USER_ID].to_numpy() if len(renamed) else None
    if num_users is not None and users is not None and users.max() >= num_users:
        raise SchemaError(
            where, config.user_column, f"has user ids beyond the log's 0..{num_users - 1}"
        )
    try:
        return validate_candidate_table(
            renamed, candidates_per_user=candidates_per_user, num_items=num_items
        )
    except SchemaError as exc:
        # Named by the user's column, not the internal name it was renamed to.
        internal = {USER_ID: config.user_column, ITEM_ID: config.item_column}
        if config.score_column:
            internal[CANDIDATE_SCORE] = config.score_column
        raise SchemaError(where, internal.get(exc.column, exc.column), exc.problem) from exc
