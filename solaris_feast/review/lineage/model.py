"""The lineage report: what :func:`build_lineage` learns, as frozen dataclasses."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

CHECK_MISSING_VERSION_TAGS = "missing_version_tags"
CHECK_MIXED_COMPRESSOR_VERSIONS = "mixed_compressor_versions"
CHECK_TTL_SHORTER_THAN_SCHEDULE = "ttl_shorter_than_schedule"
CHECK_STALE_VIEW = "stale_view"
CHECK_WEIGHTS_SHA256_MISMATCH = "weights_sha256_mismatch"
CHECK_VM_EXPECTS_OTHER_COMPRESSOR = "vm_expects_other_compressor"
CHECK_NO_SOLARIS_VIEWS = "no_solaris_views"

# The definitions' default when no model was named: as good as no tag for tracing a vector.
UNVERSIONED = frozenset({"", "unversioned", "unknown", "none"})

Severity = Literal["error", "warning"]
ScheduleKind = Literal["cron", "interval", "assets", "manual", "unresolved"]


@dataclass(frozen=True)
class Finding:
    """One result of a check.

    Attributes:
        check: Which check (one of the ``CHECK_*`` names, or ``lineage`` for notes).
        subject: The view, service, DAG or model card it concerns.
        message: What is wrong and what to do about it.
        severity: ``error`` fails the review; ``warning`` is reported only.
    """

    check: str
    subject: str
    message: str
    severity: Severity = "error"


@dataclass(frozen=True)
class DagTask:
    """A task of a DAG file and the asset names it declares as outlets."""

    task_id: str
    outlets: tuple[str, ...] = ()


@dataclass(frozen=True)
class DagLineage:
    """A DAG as Airflow parsed it from the DAG folder.

    Attributes:
        dag_id: The DAG id.
        path: The file that defines it.
        schedule: The schedule as written (cron or preset), ``every <gap>`` for an interval,
            asset names joined by ``|`` (any) or ``&`` (all); None for a manual DAG.
        schedule_kind: ``cron`` (presets included), ``interval``, ``assets``, ``manual`` or
            ``unresolved`` (a timetable class this review cannot measure).
        interval_seconds: Longest gap between two runs; for an asset-triggered DAG, derived from
            the DAGs that produce its assets; None when unknown or manual.
        triggering_assets: Asset names the schedule waits for.
        tasks: Tasks with their outlets.
    """

    dag_id: str
    path: str
    schedule: str | None
    schedule_kind: ScheduleKind
    interval_seconds: float | None
    triggering_assets: tuple[str, ...] = ()
    tasks: tuple[DagTask, ...] = ()

    @property
    def outlets(self) -> tuple[str, ...]:
        return tuple(a for t in self.tasks for a in t.outlets)


@dataclass(frozen=True)
class ModelCardLineage:
    """A model card and whether its weights file still matches it.

    Attributes:
        version: The card's version id.
        kind: ``fm``, ``compressor`` or ``vm``.
        parents: Versions this model was trained from (compressor -> FM, VM -> compressor).
        path: The card's JSON file.
        weights_file: The weights file, resolved against the card's folder.
        weights_sha256: The hash recorded in the card.
        weights_status: ``ok``, ``mismatch``, ``missing``, or ``unchecked`` for a card not in use.
        weights_actual_sha256: What the weights file hashes to (cards in use whose file exists).
        created_at: When the artifact was written (ISO 8601, UTC).
        role: ``serving`` for the chain in service: the newest VM and the compressor and FM it
            was trained on (what ``load_bundle`` loads), or the newest compressor and its FM
            before a VM exists; ``tagged`` for other versions named by view tags, with their
            parents; ``""`` for cards nothing uses (older runs).
        train_window: The training data window as written in the card.
    """

    version: str
    kind: str
    parents: tuple[str, ...]
    path: str
    weights_file: str
    weights_sha256: str
    weights_status: Literal["ok", "mismatch", "missing", "unchecked"] = "unchecked"
    weights_actual_sha256: str | None = None
    created_at: str | None = None
    role: Literal["serving", "tagged", ""] = ""
    train_window: tuple[str | None, str | None] = (None, None)

    @property
    def in_use(self) -> bool:
        return bool(self.role)


@dataclass(frozen=True)
class SourceLineage:
    """A Feast data source.

    Attributes:
        name: Source name.
        kind: ``file`` (an offline table), ``push``, ``request`` or the class name otherwise.
        path: Offline table location for file sources.
        batch_source: For a push source, the offline table behind it.
    """

    name: str
    kind: str
    path: str | None = None
    batch_source: str | None = None


@dataclass(frozen=True)
class ViewLineage:
    """One row of the review: a feature view and everything known about its provenance.

    Attributes:
        name: View name.
        kind: ``feature_view`` or ``on_demand``.
        entities: Entity names.
        ttl_seconds: Feast TTL; None for on-demand views and for an unset (infinite) TTL.
        tags: All tags.
        sources: Names of the data sources (batch, push/stream, request) or, for an on-demand
            view, the views it reads.
        producing_dag: The DAG that writes the view: the ``solaris.producing_dag`` tag when
            that DAG is in the DAG folder, else the DAG whose task declares an asset named
            after the view (or its source); the tag as written otherwise.
        producing_dag_tag: The ``solaris.producing_dag`` tag as written.
        schedule: The producing DAG's schedule, from its file when found, else the tag.
        schedule_interval_seconds: Longest gap between runs of the producing DAG.
        fm_version: ``solaris.fm_version`` tag.
        compressor_version: ``solaris.compressor_version`` tag.
        verifier_version: ``solaris.verifier_version`` tag.
        last_materialization: End of the latest materialization interval.
        last_write: Latest write found in the view's offline table.
        coverage: Share of served pairs that got this view's embedding, when supplied.
        services: Feature services that serve the view.
    """

    name: str
    kind: Literal["feature_view", "on_demand"]
    entities: tuple[str, ...]
    ttl_seconds: float | None
    tags: dict[str, str]
    sources: tuple[str, ...]
    # What an on-demand view lacks (it stores nothing) defaults to unknown.
    producing_dag: str | None = None
    schedule: str | None = None
    schedule_interval_seconds: float | None = None
    fm_version: str | None = None
    compressor_version: str | None = None
    verifier_version: str | None = None
    last_materialization: datetime | None = None
    last_write: datetime | None = None
    coverage: float | None = None
    services: tuple[str, ...] = ()
    producing_dag_tag: str | None = None


@dataclass(frozen=True)
class ServiceLineage:
    """A feature service, its views and the compressor versions behind them."""

    name: str
    views: tuple[str, ...]
    compressor_versions: tuple[str, ...]


@dataclass(frozen=True)
class GraphNode:
    """A node of the lineage graph; ``kind`` picks its shape and style."""

    id: str
    label: str
    kind: str
    group: str | None = None


@dataclass(frozen=True)
class GraphEdge:
    """A data-flow edge; ``dashed`` marks a provenance link rather than data moving."""

    source: str
    target: str
    label: str = ""
    dashed: bool = False


@dataclass(frozen=True)
class LineageReport:
    """Everything :func:`build_lineage` learned, ready to render or check."""

    project: str
    repo: str
    generated_at: datetime
    views: tuple[ViewLineage, ...]
    services: tuple[ServiceLineage, ...]
    sources: tuple[SourceLineage, ...]
    dags: tuple[DagLineage, ...]
    cards: tuple[ModelCardLineage, ...]
    findings: tuple[Finding, ...]
    nodes: tuple[GraphNode, ...] = ()
    edges: tuple[GraphEdge, ...] = ()
    coverage_source: str | None = None

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "error")

    def view(self, name: str) -> ViewLineage:
        for v in self.views:
            if v.name == name:
                return v
        raise KeyError(f"no view {name!r} in the lineage report (views: {self.view_names()})")

    def view_names(self) -> list[str]:
        return [v.name for v in self.views]


def is_versioned(value: str | None) -> bool:
    """Whether a version tag names a model (not empty, not ``unversioned``)."""
    return value is not None and value.strip().lower() not in UNVERSIONED
