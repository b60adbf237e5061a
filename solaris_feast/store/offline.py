"""The offline parquet log of a feature view: where it lives and the rows of a time window.

Layout (written by :class:`solaris_feast.store.write.EmbeddingWriter`): one folder per view, the
view's FileSource path (relative to the repo unless absolute), holding one folder per UTC day of
``computed_at`` (``YYYY-MM-DD``) of content-hashed ``part-*.parquet`` files. A window's read only
opens the day folders it touches. :func:`offline_view_root` is the one place that turns a view's
source path into a folder.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from solaris_feast.columns import COMPUTED_AT, EMBEDDING, FLOAT_EMBEDDING, WRITTEN_AT
from solaris_feast.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from feast import FeatureStore, FeatureView

logger = logging.getLogger(__name__)
_SAID_MISSING: set[Path] = set()


def source_path(path: str, repo_path: Path | str | None) -> Path:
    """A FileSource path as Feast's file offline store reads it: relative to the repo folder."""
    resolved = Path(path)
    if not resolved.is_absolute() and repo_path is not None:
        resolved = Path(repo_path) / resolved
    return resolved


def offline_view_root(store: FeatureStore, view: str | FeatureView) -> Path:
    """Folder of a view's parquet log: its FileSource path, resolved against the repo."""
    feature_view = store.get_feature_view(view) if isinstance(view, str) else view
    return source_path(feature_view.batch_source.path, store.config.repo_path)  # type: ignore[union-attr]


def read_offline_rows(
    store: FeatureStore,
    view_name: str,
    start: pd.Timestamp,
    end: pd.Timestamp,
    columns: list[str] | None = None,
    *,
    first_round: bool = False,
) -> pd.DataFrame:
    """Rows of a view's offline log with ``computed_at`` in ``(start, end]``.

    Only the day folders the window touches are read (the writer files rows under the UTC day
    of their ``computed_at``). ``first_round``: as :func:`read_offline_folder`'s.
    """
    view = store.get_feature_view(view_name)
    every = [*view.join_keys, *(f.name for f in view.features)]
    return read_offline_folder(
        offline_view_root(store, view), start, end, columns, every, first_round=first_round
    )


def read_offline_folder(
    root: Path,
    start: pd.Timestamp,
    end: pd.Timestamp,
    columns: list[str] | None,
    all_columns: list[str],
    *,
    first_round: bool = False,
) -> pd.DataFrame:
    """:func:`read_offline_rows` from a view's folder (:func:`offline_view_root`) without Feast:
    for a task that knows the folder and the view's columns (``all_columns``, the columns of an
    empty result when ``columns`` is None). ``first_round``: no earlier round has published, so
    a missing folder is expected (said at INFO, not as a warning)."""
    import pandas as pd
    import pyarrow as pa

    if not root.is_dir() and root not in _SAID_MISSING:
        # A first round has no log yet; a worker without the shared storage mounted sees the
        # same: said (once per folder and process), since a round then plans and aggregates as
        # if nothing had been written. A warning only where an earlier round has published:
        # on a first round (make demo's, a new deployment's) it is what should happen.
        _SAID_MISSING.add(root)
        if first_round:
            logger.info("offline log folder %s does not exist yet: a first round", root)
        else:
            logger.warning(
                "offline log folder %s does not exist: read as empty, though an earlier round "
                "published (check that this worker mounts the shared storage)",
                root,
            )
    days = pd.date_range(start.floor("D"), end.floor("D"), freq="D")
    files = [
        f for day in days for f in sorted((root / day.strftime("%Y-%m-%d")).glob("part-*.parquet"))
    ]
    wanted = None if columns is None else sorted(set(columns) | {COMPUTED_AT})
    tables = []
    for f in files:
        try:
            tables.append(_read_offline_file(f, wanted))
        except (pa.ArrowInvalid, OSError) as exc:
            raise ConfigError(
                f"offline log file {f} is not readable parquet ({exc}): a write that died "
                "mid-file, or a disk fault. Its rows cannot be read: move it aside and run "
                "again (re-running the round that wrote it writes it anew)"
            ) from exc
    if not tables:
        return pd.DataFrame(columns=all_columns if columns is None else columns)
    frame = pa.concat_tables(tables, promote_options="default").to_pandas()
    at = pd.to_datetime(frame[COMPUTED_AT], utc=True)
    frame = frame.loc[(at > start) & (at <= end)].reset_index(drop=True)
    return frame if columns is None else frame[columns]


def _read_offline_file(path: Path, columns: list[str] | None) -> pa.Table:
    """One file of a view's log with its float32 vectors under ``embedding``: a quantized view's
    file keeps them in :data:`~solaris_feast.columns.FLOAT_EMBEDDING`, its ``embedding`` being
    the codec's bytes (files written before that hold the floats under ``embedding``)."""
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    names = parquet.schema_arrow.names
    if FLOAT_EMBEDDING not in names:
        return parquet.read(columns=columns)
    kept = [c for c in (columns or names) if c != FLOAT_EMBEDDING]
    table = parquet.read(columns=[FLOAT_EMBEDDING if c == EMBEDDING else c for c in kept])
    return table.rename_columns(kept)


def in_write_order(frame: pd.DataFrame) -> pd.DataFrame:
    """The log's rows in the order they were written (``written_at``, stable; the files' order
    where the column was not read): later rows are later writes, as the online store saw them."""
    if WRITTEN_AT not in frame.columns or frame[WRITTEN_AT].is_monotonic_increasing:
        return frame
    return frame.iloc[frame[WRITTEN_AT].argsort(kind="stable")].reset_index(drop=True)


def newest_per_key(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The row of each key the online store holds: the newest ``computed_at``, a tie going to
    the later write (``written_at``), as the online write and Feast's materialize break it."""
    import pandas as pd

    ordered = in_write_order(frame)
    at = pd.to_datetime(ordered[COMPUTED_AT], utc=True)
    newest = at.argsort(kind="stable")
    return (
        ordered.iloc[newest].drop_duplicates(keys, keep="last").sort_index().reset_index(drop=True)
    )


def offline_row_count(store: FeatureStore, view_name: str) -> int:
    """Rows in a view's whole offline log (a re-run must not change it)."""
    import pyarrow.parquet as pq

    root = offline_view_root(store, view_name)
    return sum(pq.ParquetFile(f).metadata.num_rows for f in root.glob("*/part-*.parquet"))
