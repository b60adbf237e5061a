"""What the Feast registry says about each view: sources, TTL, tags, last refresh."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

from solaris_feast.review.lineage.coverage import coverage_of
from solaris_feast.review.lineage.model import (
    DagLineage,
    ServiceLineage,
    SourceLineage,
    ViewLineage,
    is_versioned,
)
from solaris_feast.review.lineage.schedule import schedule_interval_seconds
from solaris_feast.store.tags import (
    TAG_COMPRESSOR_VERSION,
    TAG_FM_VERSION,
    TAG_PRODUCING_DAG,
    TAG_SCHEDULE,
    TAG_VERIFIER_VERSION,
)

logger = logging.getLogger(__name__)


def _last_offline_write(
    path_text: str | None, repo: Path, columns: Sequence[str]
) -> datetime | None:
    """Latest value of the first of ``columns`` found in the parquet files under a source path.

    Row-group statistics answer without reading the data; a file without them is read for that
    one column.
    """
    if not path_text or "://" in path_text:
        return None
    from solaris_feast.store.offline import source_path

    path = source_path(path_text, repo)
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path] if path.is_file() else []
    if not files:
        return None
    import pyarrow.parquet as pq

    latest: datetime | None = None
    for file in files:
        try:
            parquet = pq.ParquetFile(file)
        except (OSError, ValueError) as exc:
            logger.warning("skipping unreadable parquet %s: %s", file, exc)
            continue
        names = parquet.schema_arrow.names
        column = next((c for c in columns if c and c in names), None)
        if column is None:
            continue
        value = _parquet_column_max(parquet, column)
        if value is not None and (latest is None or value > latest):
            latest = value
    return latest


def _parquet_column_max(parquet: Any, column: str) -> datetime | None:
    import pandas as pd

    index = parquet.schema_arrow.names.index(column)
    maxima: list[Any] = []
    for group in range(parquet.metadata.num_row_groups):
        stats = parquet.metadata.row_group(group).column(index).statistics
        if stats is None or not stats.has_min_max:
            maxima = []
            break
        maxima.append(stats.max)
    if not maxima:
        values = parquet.read(columns=[column]).column(0).to_pandas()
        maxima = [values.max()] if len(values) else []
    stamps = [as_utc(pd.Timestamp(m)) for m in maxima if m is not None]
    return max((s for s in stamps if s is not None), default=None)


def as_utc(stamp: Any) -> datetime | None:
    import pandas as pd

    if stamp is None or pd.isna(stamp):
        return None
    stamp = pd.Timestamp(stamp)
    stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
    return stamp.to_pydatetime()


def source_lineage(source: Any) -> SourceLineage:
    from feast import FileSource, PushSource, RequestSource

    if isinstance(source, PushSource):
        batch = source.batch_source
        return SourceLineage(
            source.name,
            "push",
            path=getattr(batch, "path", None),
            batch_source=batch.name if batch else None,
        )
    if isinstance(source, FileSource):
        return SourceLineage(source.name, "file", path=source.path)
    if isinstance(source, RequestSource):
        return SourceLineage(source.name, "request")
    return SourceLineage(source.name, type(source).__name__)


def feature_view_lineage(
    fv: Any,
    repo: Path,
    dag_by_id: Mapping[str, DagLineage],
    sources: Mapping[str, SourceLineage],
    services_of: Mapping[str, list[str]],
    coverage: Mapping[str, float] | None,
) -> ViewLineage:
    tags = dict(fv.tags or {})
    ttl = fv.ttl.total_seconds() if fv.ttl else None
    source_names = [s.name for s in (fv.batch_source, fv.stream_source) if s is not None]
    producing_dag_tag = tags.get(TAG_PRODUCING_DAG) or None
    dag = dag_by_id.get(producing_dag_tag) if producing_dag_tag else None
    if dag is None:
        # The asset a task declares is the DAG file's own word on what it writes.
        named = {fv.name, *source_names}
        dag = next((d for d in dag_by_id.values() if any(a in named for a in d.outlets)), None)
    producing_dag = dag.dag_id if dag is not None else producing_dag_tag
    schedule = tags.get(TAG_SCHEDULE) or None
    interval: float | None = None
    if dag is not None:
        # The DAG file is what actually runs; the tag is what someone wrote down.
        schedule, interval = dag.schedule, dag.interval_seconds
    elif schedule is not None:
        try:
            interval = schedule_interval_seconds(schedule)
        except ValueError:
            interval = None
    intervals = list(fv.materialization_intervals or [])
    last_materialization = max((as_utc(end) for _, end in intervals), default=None, key=_sort_key)
    batch = fv.batch_source
    last_write = _last_offline_write(
        getattr(batch, "path", None) if batch is not None else None,
        repo,
        [getattr(batch, "created_timestamp_column", ""), getattr(batch, "timestamp_field", "")],
    )
    return ViewLineage(
        name=fv.name,
        kind="feature_view",
        entities=tuple(fv.entities),
        ttl_seconds=ttl,
        tags=tags,
        sources=tuple(dict.fromkeys(source_names)),
        producing_dag=producing_dag,
        producing_dag_tag=producing_dag_tag,
        schedule=schedule,
        schedule_interval_seconds=interval,
        **_version_tags(tags),
        last_materialization=last_materialization,
        last_write=last_write,
        coverage=coverage_of(coverage, fv.name, tags),
        services=tuple(services_of.get(fv.name, [])),
    )


class _VersionTags(TypedDict):
    fm_version: str | None
    compressor_version: str | None
    verifier_version: str | None


def _version_tags(tags: Mapping[str, str]) -> _VersionTags:
    return {
        "fm_version": tags.get(TAG_FM_VERSION),
        "compressor_version": tags.get(TAG_COMPRESSOR_VERSION),
        "verifier_version": tags.get(TAG_VERIFIER_VERSION),
    }


def _sort_key(value: datetime | None) -> datetime:
    return value or datetime.min.replace(tzinfo=UTC)


def on_demand_view_lineage(
    odfv: Any, services_of: Mapping[str, list[str]], coverage: Mapping[str, float] | None
) -> ViewLineage:
    """An on-demand view: computed at read time, so no DAG, TTL or refresh time."""
    tags = dict(odfv.tags or {})
    inputs = [p.name for p in odfv.source_feature_view_projections.values()]
    inputs += list(odfv.source_request_sources)
    return ViewLineage(
        name=odfv.name,
        kind="on_demand",
        entities=(),
        ttl_seconds=None,
        tags=tags,
        sources=tuple(inputs),
        coverage=coverage_of(coverage, odfv.name, tags),
        services=tuple(services_of.get(odfv.name, [])),
        **_version_tags(tags),
    )


def service_lineage(services: Iterable[Any], views: Sequence[ViewLineage]) -> list[ServiceLineage]:
    """Each feature service with its views and the (versioned) compressors behind them."""
    view_by_name = {v.name: v for v in views}
    lineage = []
    for service in sorted(services, key=lambda s: s.name):
        names = tuple(p.name for p in service.feature_view_projections)
        versions = {
            view_by_name[n].compressor_version
            for n in names
            if n in view_by_name and is_versioned(view_by_name[n].compressor_version)
        }
        lineage.append(ServiceLineage(service.name, names, tuple(sorted(v for v in versions if v))))
    return lineage
