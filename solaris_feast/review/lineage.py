"""Feature lineage review: where a served vector came from, is it fresh, which model made it.

Three sources are joined:

- the Feast registry: feature views (TTL, tags, sources, materialization intervals), on-demand
  views, feature services and every data source, push sources included (Feast's own lineage
  leaves those out);
- the model cards (JSON) in ``models/``: FM, compressor and VM versions, parents, weight hashes;
- the Airflow DAG files in ``dags/``, read with :mod:`ast` and never imported (importing a DAG
  file pulls in Airflow and runs its top-level code): DAG ids, schedules, tasks, asset outlets.

The result is a :class:`LineageReport`: a graph (data sources, DAGs and their tasks, assets,
offline tables, feature views, feature services, model cards), a table per view, and findings.
Findings of severity ``error`` make :func:`lineage_command` exit non-zero:

- ``missing_version_tags``: a view lacks ``solaris.fm_version`` / ``compressor_version`` /
  ``verifier_version`` (an on-demand view needs ``compressor_version``);
- ``mixed_compressor_versions``: one feature service serves views made by different
  compressors, i.e. vectors from different embedding spaces;
- ``ttl_shorter_than_schedule``: a view's TTL is shorter than the longest gap between runs of its
  producing DAG, so every entry expires before the next run refreshes it;
- ``stale_view``: the last materialization (or offline write) is older than the TTL;
- ``weights_sha256_mismatch``: a model card's weights file is not the file it was trained into;
- ``vm_expects_other_compressor``: the VM was trained on another compressor's embeddings than
  the views of the service it consumes.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import html
import json
import logging
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)

TAG_PREFIX = "solaris."
TAG_TIER = f"{TAG_PREFIX}tier"
TAG_FM_VERSION = f"{TAG_PREFIX}fm_version"
TAG_COMPRESSOR_VERSION = f"{TAG_PREFIX}compressor_version"
TAG_VERIFIER_VERSION = f"{TAG_PREFIX}verifier_version"
TAG_EMBEDDING_DIM = f"{TAG_PREFIX}embedding_dim"
TAG_PRODUCING_DAG = f"{TAG_PREFIX}producing_dag"
TAG_SCHEDULE = f"{TAG_PREFIX}schedule"
TAG_TTL_SECONDS = f"{TAG_PREFIX}ttl_seconds"

VERSION_TAGS = (TAG_FM_VERSION, TAG_COMPRESSOR_VERSION, TAG_VERIFIER_VERSION)
ON_DEMAND_VERSION_TAGS = (TAG_COMPRESSOR_VERSION,)
MODEL_KINDS = ("fm", "compressor", "vm")
# The definitions' default when no model was named: as good as no tag for tracing a vector.
UNVERSIONED = frozenset({"", "unversioned", "unknown", "none"})

CHECK_MISSING_VERSION_TAGS = "missing_version_tags"
CHECK_MIXED_COMPRESSOR_VERSIONS = "mixed_compressor_versions"
CHECK_TTL_SHORTER_THAN_SCHEDULE = "ttl_shorter_than_schedule"
CHECK_STALE_VIEW = "stale_view"
CHECK_WEIGHTS_SHA256_MISMATCH = "weights_sha256_mismatch"
CHECK_VM_EXPECTS_OTHER_COMPRESSOR = "vm_expects_other_compressor"

FORMATS = ("md", "html", "json")
Severity = Literal["error", "warning"]
ScheduleKind = Literal["cron", "interval", "assets", "manual", "unresolved"]

# Airflow's presets as cron, so one gap computation serves both.
PRESET_CRON = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@quarterly": "0 0 1 */3 *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
NO_INTERVAL_PRESETS = frozenset({"@once", "@continuous", "none"})
# Gaps are measured from a fixed start so the report does not depend on the day it runs.
CRON_REFERENCE_START = datetime(2026, 1, 1, tzinfo=UTC)
CRON_MAX_FIRES = 50_000

MERMAID_CDN = "https://cdn.jsdelivr.net/npm/mermaid@11/dist/mermaid.min.js"


# ----------------------------------------------------------------------------------------------
# Report data


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
    """A DAG found by reading a DAG file statically.

    Attributes:
        dag_id: The DAG id.
        path: The file that defines it.
        schedule: The schedule as written (cron, preset, ``timedelta(...)`` or asset names).
        schedule_kind: ``cron`` (presets included), ``interval``, ``assets``, ``manual`` or
            ``unresolved`` (an expression only Airflow could evaluate).
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
        created_at: When the artifact was written, as in the card.
        role: ``serving`` for the newest VM and the compressor and FM it was trained on (what
            ``load_bundle`` loads), ``tagged`` for other versions named by view tags, ``""`` for
            cards nothing uses (older runs).
        train_window: The training data window as written in the card.
    """

    version: str
    kind: str
    parents: tuple[str, ...]
    path: str
    weights_file: str
    weights_sha256: str
    weights_status: Literal["ok", "mismatch", "missing", "unchecked"] = "unchecked"
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
    producing_dag: str | None
    schedule: str | None
    schedule_interval_seconds: float | None
    fm_version: str | None
    compressor_version: str | None
    verifier_version: str | None
    last_materialization: datetime | None
    last_write: datetime | None
    coverage: float | None
    services: tuple[str, ...]
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

    def failed_checks(self) -> set[str]:
        return {f.check for f in self.errors}


# ----------------------------------------------------------------------------------------------
# Schedules


def schedule_interval_seconds(schedule: str | None) -> float | None:
    """Longest gap in seconds between two runs of a cron or preset schedule.

    The longest gap, not the typical one, decides whether a TTL guarantees misses: a view
    written by ``0 9-17 * * 1-5`` must live through the weekend. ``@once``, ``None`` and asset
    schedules have no interval (None). An unparseable expression raises ``ValueError``.
    """
    if schedule is None:
        return None
    text = schedule.strip()
    lowered = text.lower()
    if lowered in NO_INTERVAL_PRESETS:
        return None
    cron = PRESET_CRON.get(lowered, text)
    return _cron_max_gap_seconds(cron)


@lru_cache(maxsize=256)
def _cron_max_gap_seconds(cron: str) -> float:
    from croniter import croniter

    if not croniter.is_valid(cron):
        raise ValueError(f"{cron!r} is neither an Airflow preset nor a cron expression")
    fields = cron.split()
    # Day-of-month and month fields repeat over a year; everything else within a week.
    yearly = len(fields) >= 4 and (fields[2] != "*" or fields[3] != "*")
    horizon = CRON_REFERENCE_START + (timedelta(days=800) if yearly else timedelta(days=15))
    fires = croniter(cron, CRON_REFERENCE_START)
    previous = fires.get_next(datetime)
    widest = 0.0
    for _ in range(CRON_MAX_FIRES):
        current = fires.get_next(datetime)
        widest = max(widest, (current - previous).total_seconds())
        if current > horizon:
            break
        previous = current
    return widest


def format_seconds(seconds: float | None) -> str:
    """``21600`` -> ``6h``; ``90`` -> ``1m30s``; None -> ``-``."""
    if seconds is None:
        return "-"
    remaining = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if remaining >= size:
            parts.append(f"{remaining // size}{unit}")
            remaining %= size
    return "".join(parts) or "0s"


# ----------------------------------------------------------------------------------------------
# DAG files, read statically


@dataclass(frozen=True)
class _AssetRef:
    name: str
    uri: str | None


@dataclass(frozen=True)
class _Interval:
    seconds: float


@dataclass(frozen=True)
class _Unresolved:
    text: str


@dataclass(frozen=True)
class _AssetCondition:
    """Assets a schedule waits for; ``any_of`` for ``a | b``, all of them otherwise."""

    assets: tuple[str, ...]
    any_of: bool = False


_TIMEDELTA_POSITIONAL = ("days", "seconds", "microseconds", "milliseconds", "minutes", "hours")
_TIMEDELTA_SECONDS = {
    "weeks": 604800.0,
    "days": 86400.0,
    "hours": 3600.0,
    "minutes": 60.0,
    "seconds": 1.0,
    "milliseconds": 1e-3,
    "microseconds": 1e-6,
}


def _call_name(node: ast.AST) -> str:
    """``Asset`` for ``Asset(...)``, ``sdk.Asset`` -> ``Asset``, ``task.python`` -> ``python``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    return ""


class _ModuleScope:
    """Module-level names of a DAG file, resolved lazily, following ``from x import y`` into
    modules that can be found without importing them (sibling files, the library)."""

    def __init__(self, tree: ast.Module, path: Path, search_root: Path, depth: int = 0) -> None:
        self.path = path
        self.search_root = search_root
        self.depth = depth
        self.assignments: dict[str, ast.expr] = {}
        self.imports: dict[str, tuple[str, str]] = {}
        for statement in tree.body:
            if isinstance(statement, ast.Assign):
                for target in statement.targets:
                    if isinstance(target, ast.Name):
                        self.assignments[target.id] = statement.value
            elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
                if isinstance(statement.target, ast.Name):
                    self.assignments[statement.target.id] = statement.value
            elif (
                isinstance(statement, ast.ImportFrom) and statement.module and statement.level == 0
            ):
                for alias in statement.names:
                    self.imports[alias.asname or alias.name] = (statement.module, alias.name)
        self._resolving: set[str] = set()

    def lookup(self, name: str) -> object:
        if name in self._resolving:
            return _Unresolved(name)
        if name in self.assignments:
            self._resolving.add(name)
            try:
                return self.evaluate(self.assignments[name])
            finally:
                self._resolving.discard(name)
        if name in self.imports and self.depth < 2:
            module, attribute = self.imports[name]
            scope = self._module_scope(module)
            if scope is not None:
                return scope.lookup(attribute)
        return _Unresolved(name)

    def _module_scope(self, module: str) -> _ModuleScope | None:
        # Airflow's own modules are never read: only project code holds schedules and assets.
        if module.split(".")[0] in {"airflow", "datetime", "pendulum", "os", "typing"}:
            return None
        relative = Path(*module.split("."))
        # Looked up on disk along the DAG folder and sys.path, never through the import system:
        # even find_spec would run the parent packages' __init__ files.
        roots = [self.search_root, *(Path(p) for p in sys.path if p)]
        candidates = [
            c
            for root in roots
            for c in (root / relative.with_suffix(".py"), root / relative / "__init__.py")
        ]
        for candidate in candidates:
            if candidate.is_file():
                try:
                    tree = ast.parse(candidate.read_text(encoding="utf-8"))
                except (SyntaxError, UnicodeDecodeError, OSError):
                    return None
                return _ModuleScope(tree, candidate, self.search_root, self.depth + 1)
        return None

    def evaluate(self, node: ast.expr) -> object:
        """The value of a constant expression, or :class:`_Unresolved` with its source."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self.lookup(node.id)
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            return [self.evaluate(e) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr | ast.BitAnd):
            left, right = self.evaluate(node.left), self.evaluate(node.right)
            names = _asset_names(left) + _asset_names(right)
            if names and not isinstance(left, _Unresolved) and not isinstance(right, _Unresolved):
                return _AssetCondition(tuple(names), any_of=isinstance(node.op, ast.BitOr))
        if isinstance(node, ast.Call):
            return self._evaluate_call(node)
        return _Unresolved(ast.unparse(node))

    def _evaluate_call(self, node: ast.Call) -> object:
        name = _call_name(node)
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        if name in {"Asset", "Dataset", "AssetAlias"}:
            raw_name = node.args[0] if node.args else keywords.get("name")
            raw_uri = node.args[1] if len(node.args) > 1 else keywords.get("uri")
            asset_name = self.evaluate(raw_name) if raw_name is not None else None
            uri = self.evaluate(raw_uri) if raw_uri is not None else None
            uri_text = uri if isinstance(uri, str) else None
            if isinstance(asset_name, str):
                return _AssetRef(asset_name, uri_text)
            if uri_text is not None:
                return _AssetRef(uri_text, uri_text)
            return _Unresolved(ast.unparse(node))
        if name in {"AssetAny", "AssetAll", "DatasetAny", "DatasetAll"}:
            names = [n for arg in node.args for n in _asset_names(self.evaluate(arg))]
            return _AssetCondition(tuple(names), any_of=name.endswith("Any"))
        if name in {"timedelta", "duration"}:
            return self._timedelta(node)
        if name in {"CronTriggerTimetable", "CronDataIntervalTimetable", "CronPartitionTimetable"}:
            raw = node.args[0] if node.args else keywords.get("cron")
            return self.evaluate(raw) if raw is not None else _Unresolved(ast.unparse(node))
        if name in {"DeltaTriggerTimetable", "DeltaDataIntervalTimetable"}:
            raw = node.args[0] if node.args else keywords.get("delta")
            return self.evaluate(raw) if raw is not None else _Unresolved(ast.unparse(node))
        if name == "AssetOrTimeSchedule":
            raw = keywords.get("timetable")
            return self.evaluate(raw) if raw is not None else _Unresolved(ast.unparse(node))
        # os.environ.get("X", "@hourly") / os.getenv("X", "@hourly"): the default is what runs
        # unless someone overrides it, which is the best a static reading can say.
        if _dotted(node.func) in {"os.environ.get", "os.getenv", "environ.get", "getenv"}:
            default = node.args[1] if len(node.args) > 1 else keywords.get("default")
            return self.evaluate(default) if default is not None else _Unresolved(ast.unparse(node))
        return _Unresolved(ast.unparse(node))

    def _timedelta(self, node: ast.Call) -> object:
        total = 0.0
        pairs = list(zip(_TIMEDELTA_POSITIONAL, node.args, strict=False))
        pairs += [(k.arg, k.value) for k in node.keywords if k.arg]
        for unit, raw in pairs:
            value = self.evaluate(raw)
            if unit not in _TIMEDELTA_SECONDS or not isinstance(value, int | float):
                return _Unresolved(ast.unparse(node))
            total += float(value) * _TIMEDELTA_SECONDS[unit]
        return _Interval(total)


def _asset_names(value: object) -> list[str]:
    if isinstance(value, _AssetRef):
        return [value.name]
    if isinstance(value, _AssetCondition):
        return list(value.assets)
    if isinstance(value, list):
        return [n for v in value for n in _asset_names(v)]
    return []


def _is_decorator(node: ast.expr, names: set[str]) -> bool:
    """``@dag``, ``@dag(...)``, ``@task``, ``@task.python(...)``, ``@sdk.task``."""
    target = node.func if isinstance(node, ast.Call) else node
    dotted = _dotted(target).split(".")
    return bool(set(dotted) & names) and dotted[-1] not in {"override"}


def _keyword(node: ast.Call, name: str) -> ast.expr | None:
    for keyword in node.keywords:
        if keyword.arg == name:
            return keyword.value
    return None


@dataclass
class _DagDraft:
    dag_id: str
    schedule: object
    body: list[ast.stmt]
    tasks: list[DagTask] = field(default_factory=list)


def _task_from_function(fn: ast.FunctionDef | ast.AsyncFunctionDef, scope: _ModuleScope) -> DagTask:
    task_id = fn.name
    outlets: list[str] = []
    for decorator in fn.decorator_list:
        if isinstance(decorator, ast.Call) and _is_decorator(decorator, {"task"}):
            raw_id = _keyword(decorator, "task_id")
            value = scope.evaluate(raw_id) if raw_id is not None else None
            if isinstance(value, str):
                task_id = value
            raw_outlets = _keyword(decorator, "outlets")
            if raw_outlets is not None:
                outlets += _asset_names(scope.evaluate(raw_outlets))
    return DagTask(task_id, tuple(outlets))


def _tasks_in(body: Iterable[ast.stmt], scope: _ModuleScope) -> list[DagTask]:
    """Decorated task functions and operator calls (anything called with ``task_id=``)."""
    found: dict[str, DagTask] = {}
    for statement in body:
        for node in ast.walk(statement):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                _is_decorator(d, {"task"}) for d in node.decorator_list
            ):
                task = _task_from_function(node, scope)
                found.setdefault(task.task_id, task)
            elif isinstance(node, ast.Call) and _call_name(node) != "override":
                raw_id = _keyword(node, "task_id")
                task_id = scope.evaluate(raw_id) if raw_id is not None else None
                if isinstance(task_id, str):
                    raw_outlets = _keyword(node, "outlets")
                    outlets = (
                        _asset_names(scope.evaluate(raw_outlets)) if raw_outlets is not None else []
                    )
                    found.setdefault(task_id, DagTask(task_id, tuple(outlets)))
    return list(found.values())


def parse_dag_file(path: Path, search_root: Path | None = None) -> list[DagLineage]:
    """DAGs defined in one file, read with :mod:`ast` (the file is not imported).

    Intervals of asset-triggered DAGs are left None here; :func:`read_dags` derives them from
    the DAGs that produce the assets.

    Raises:
        SyntaxError: the file is not valid Python.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    scope = _ModuleScope(tree, path, search_root or path.parent)
    drafts: list[_DagDraft] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in node.decorator_list:
                if _is_decorator(decorator, {"dag"}):
                    call = decorator if isinstance(decorator, ast.Call) else None
                    raw_id = _keyword(call, "dag_id") if call else None
                    dag_id = scope.evaluate(raw_id) if raw_id is not None else node.name
                    raw_schedule = _keyword(call, "schedule") if call else None
                    drafts.append(
                        _DagDraft(
                            dag_id if isinstance(dag_id, str) else node.name,
                            scope.evaluate(raw_schedule) if raw_schedule is not None else None,
                            list(node.body),
                        )
                    )
        elif isinstance(node, ast.With):
            for item in node.items:
                context = item.context_expr
                if isinstance(context, ast.Call) and _call_name(context) == "DAG":
                    drafts.append(_draft_from_dag_call(context, scope, list(node.body)))
    # A DAG(...) assigned at module level and used through ``dag=`` arguments.
    with_calls = {
        id(item.context_expr)
        for node in ast.walk(tree)
        if isinstance(node, ast.With)
        for item in node.items
    }
    for statement in tree.body:
        value = statement.value if isinstance(statement, ast.Assign | ast.Expr) else None
        if (
            isinstance(value, ast.Call)
            and _call_name(value) == "DAG"
            and id(value) not in with_calls
        ):
            drafts.append(_draft_from_dag_call(value, scope, list(tree.body)))

    module_tasks = [
        _task_from_function(s, scope)
        for s in tree.body
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)
        and any(_is_decorator(d, {"task"}) for d in s.decorator_list)
    ]
    dags = []
    for draft in drafts:
        tasks = _tasks_in(draft.body, scope)
        # Task functions defined at module level belong to the file's only DAG.
        if len(drafts) == 1:
            known = {t.task_id for t in tasks}
            tasks += [t for t in module_tasks if t.task_id not in known]
        dags.append(_dag_lineage(draft, path, tasks))
    return dags


def _draft_from_dag_call(call: ast.Call, scope: _ModuleScope, body: list[ast.stmt]) -> _DagDraft:
    raw_id = call.args[0] if call.args else _keyword(call, "dag_id")
    dag_id = scope.evaluate(raw_id) if raw_id is not None else None
    raw_schedule = _keyword(call, "schedule")
    return _DagDraft(
        dag_id if isinstance(dag_id, str) else f"<unnamed DAG line {call.lineno}>",
        scope.evaluate(raw_schedule) if raw_schedule is not None else None,
        body,
    )


def _dag_lineage(draft: _DagDraft, path: Path, tasks: list[DagTask]) -> DagLineage:
    schedule = draft.schedule

    def made(
        text: str | None,
        kind: ScheduleKind,
        interval: float | None = None,
        assets: Sequence[str] = (),
    ) -> DagLineage:
        return DagLineage(
            dag_id=draft.dag_id,
            path=str(path),
            schedule=text,
            schedule_kind=kind,
            interval_seconds=interval,
            triggering_assets=tuple(assets),
            tasks=tuple(tasks),
        )

    if schedule is None:
        return made(None, "manual")
    if isinstance(schedule, str):
        try:
            interval = schedule_interval_seconds(schedule)
        except ValueError:
            return made(schedule, "unresolved")
        return made(schedule, "cron" if interval is not None else "manual", interval)
    if isinstance(schedule, _Interval):
        return made(f"every {format_seconds(schedule.seconds)}", "interval", schedule.seconds)
    assets = _asset_names(schedule)
    if assets:
        any_of = isinstance(schedule, _AssetCondition) and schedule.any_of
        return made((" | " if any_of else " & ").join(assets), "assets", None, assets)
    text = schedule.text if isinstance(schedule, _Unresolved) else repr(schedule)
    return made(text, "unresolved")


def read_dags(dags_dir: Path) -> tuple[list[DagLineage], list[Finding]]:
    """Every DAG in ``dags_dir`` (recursively), with asset-triggered intervals filled in."""
    dags: list[DagLineage] = []
    findings: list[Finding] = []
    if not dags_dir.is_dir():
        findings.append(
            Finding("lineage", str(dags_dir), "DAG folder not found; schedules come from tags only",
                    "warning")
        )  # fmt: skip
        return dags, findings
    for path in sorted(dags_dir.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        try:
            dags += parse_dag_file(path, dags_dir)
        except (SyntaxError, UnicodeDecodeError) as exc:
            findings.append(
                Finding("lineage", str(path), f"DAG file could not be parsed: {exc}", "warning")
            )
    return _resolve_asset_intervals(dags), findings


def _resolve_asset_intervals(dags: list[DagLineage]) -> list[DagLineage]:
    """An asset-triggered DAG runs as often as its producers: the slowest of them when it waits
    for all its assets, the fastest when any one will do."""
    producers: dict[str, list[str]] = {}
    for dag in dags:
        for asset in dag.outlets:
            producers.setdefault(asset, []).append(dag.dag_id)
    by_id = {d.dag_id: d for d in dags}

    def interval(dag_id: str, seen: frozenset[str]) -> float | None:
        dag = by_id[dag_id]
        if dag.schedule_kind != "assets":
            return dag.interval_seconds
        if dag_id in seen:
            return None
        per_asset: list[float] = []
        for asset in dag.triggering_assets:
            gaps = [interval(p, seen | {dag_id}) for p in producers.get(asset, [])]
            known = [g for g in gaps if g is not None]
            if not known:
                return None
            per_asset.append(min(known))
        if not per_asset:
            return None
        any_of = " | " in (dag.schedule or "")
        return min(per_asset) if any_of else max(per_asset)

    return [
        dataclasses.replace(d, interval_seconds=interval(d.dag_id, frozenset()))
        if d.schedule_kind == "assets"
        else d
        for d in dags
    ]


# ----------------------------------------------------------------------------------------------
# Model cards


def _file_sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def read_model_cards(models_dir: Path) -> tuple[list[ModelCardLineage], list[Finding]]:
    """Model cards in ``models_dir`` (``<version>.card.json``, as ``save_model`` writes them).

    Any top-level JSON with ``version``, ``kind`` and ``weights_file`` counts as a card; other
    JSON files (metrics) are skipped. Weights are not hashed here: :func:`verify_cards` hashes
    only the cards in use, so old runs with large weights cost nothing. The cards are read as
    JSON against the ``ModelCard`` fields rather than through the registry module, which imports
    torch: a review should not load a deep learning framework.
    """
    cards: list[ModelCardLineage] = []
    findings: list[Finding] = []
    if not models_dir.is_dir():
        findings.append(Finding("lineage", str(models_dir), "model folder not found", "warning"))
        return cards, findings
    for path in sorted(models_dir.glob("*.json")):
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            findings.append(Finding("lineage", str(path), f"unreadable JSON: {exc}", "warning"))
            continue
        if not isinstance(raw, dict) or not {"version", "kind", "weights_file"} <= raw.keys():
            continue
        problem = _card_problem(raw)
        if problem:
            findings.append(
                Finding("lineage", str(path), f"not a valid model card: {problem}")
            )  # fmt: skip
            continue
        weights = Path(str(raw["weights_file"]))
        parents = raw.get("parents") or []
        cards.append(
            ModelCardLineage(
                version=str(raw["version"]),
                kind=str(raw["kind"]),
                parents=tuple(str(p) for p in ([parents] if isinstance(parents, str) else parents)),
                path=str(path),
                weights_file=str(weights if weights.is_absolute() else path.parent / weights),
                weights_sha256=str(raw["weights_sha256"]).lower(),
                created_at=_optional_text(raw.get("created_at")),
                train_window=(
                    _optional_text(raw.get("train_window_start")),
                    _optional_text(raw.get("train_window_end")),
                ),
            )
        )
    return cards, findings


def _card_problem(raw: dict[str, Any]) -> str | None:
    if raw.get("kind") not in MODEL_KINDS:
        return f"kind {raw.get('kind')!r} is not one of {MODEL_KINDS}"
    sha = raw.get("weights_sha256")
    if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", sha):
        return f"weights_sha256 {sha!r} is not a sha256 hex digest"
    parents = raw.get("parents", [])
    if not isinstance(parents, list | tuple | str):
        return f"parents must be a list of versions, got {parents!r}"
    return None


def verify_cards(
    cards: Sequence[ModelCardLineage], tagged_versions: Iterable[str]
) -> list[ModelCardLineage]:
    """Mark the cards in use and hash their weights.

    In use: the newest VM with its compressor and FM (what ``load_bundle`` loads) and every
    version a view's tags name, with their parents.
    """
    by_version = {c.version: c for c in cards}

    def lineage_of(versions: Iterable[str]) -> set[str]:
        seen: set[str] = set()
        pending = [v for v in versions if v in by_version]
        while pending:
            version = pending.pop()
            if version not in seen:
                seen.add(version)
                pending += [p for p in by_version[version].parents if p in by_version]
        return seen

    vms = [c for c in cards if c.kind == "vm"]
    newest_vm = max(vms, key=lambda c: (c.created_at or "", c.version), default=None)
    serving = lineage_of([newest_vm.version] if newest_vm else [])
    tagged = lineage_of(tagged_versions) - serving
    checked = []
    for card in cards:
        role: Literal["serving", "tagged", ""] = (
            "serving" if card.version in serving else "tagged" if card.version in tagged else ""
        )
        status: Literal["ok", "mismatch", "missing", "unchecked"] = "unchecked"
        if role:
            weights = Path(card.weights_file)
            if not weights.is_file():
                status = "missing"
            else:
                status = "ok" if _file_sha256(weights) == card.weights_sha256 else "mismatch"
        checked.append(dataclasses.replace(card, role=role, weights_status=status))
    return checked


def _optional_text(value: object) -> str | None:
    return None if value is None else str(value)


# ----------------------------------------------------------------------------------------------
# Feast registry


def _last_offline_write(
    path_text: str | None, repo: Path, columns: Sequence[str]
) -> datetime | None:
    """Latest value of the first of ``columns`` found in the parquet files under a source path.

    Row-group statistics answer without reading the data; a file without them is read for that
    one column.
    """
    if not path_text or "://" in path_text:
        return None
    path = Path(path_text)
    if not path.is_absolute():
        path = repo / path
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
    stamps = [_as_utc(pd.Timestamp(m)) for m in maxima if m is not None]
    return max((s for s in stamps if s is not None), default=None)


def _as_utc(stamp: Any) -> datetime | None:
    import pandas as pd

    if stamp is None or pd.isna(stamp):
        return None
    stamp = pd.Timestamp(stamp)
    stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
    return stamp.to_pydatetime()


def _source_lineage(source: Any) -> SourceLineage:
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


# Tier names as the precompute run's coverage.json spells them, by the views' tier tag.
COVERAGE_KEYS_BY_TIER = {
    "EXACT": ("exact",),
    "SIMILAR": ("similar",),
    "USER_AGG": ("user", "user_agg"),
    "RESOLVED": ("resolved", "any_tier"),
}
COVERAGE_FILE = "coverage.json"
PRECOMPUTE_RUNS = Path("data") / "precompute_runs"


def latest_coverage_file(repo: Path) -> Path | None:
    """The newest ``coverage.json`` a precompute run left under ``<repo>/data/precompute_runs``."""
    runs = repo / PRECOMPUTE_RUNS
    if not runs.is_dir():
        return None
    files = [p for p in runs.rglob(COVERAGE_FILE) if p.is_file()]
    return max(files, key=lambda p: p.stat().st_mtime, default=None)


def read_coverage(path: Path) -> dict[str, float]:
    """Coverage fractions keyed in lower case.

    Accepts a precompute run's ``coverage.json`` (``{"coverage": {"exact": .., "similar": ..,
    "user": .., "zero": ..}, "any_tier": ..}``) or a flat object keyed by view or tier name.
    """
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object of coverage fractions")
    flat = raw["coverage"] if isinstance(raw.get("coverage"), dict) else raw
    shares = {str(k).lower(): float(v) for k, v in flat.items() if isinstance(v, int | float)}
    if isinstance(raw.get("any_tier"), int | float):
        shares.setdefault("any_tier", float(raw["any_tier"]))
    return shares


def _coverage_of(
    coverage: Mapping[str, float] | None, view_name: str, tags: Mapping[str, str]
) -> float | None:
    if not coverage:
        return None
    tier = tags.get(TAG_TIER, "").upper()
    for key in (view_name.lower(), tier.lower(), *COVERAGE_KEYS_BY_TIER.get(tier, ())):
        if key and key in coverage:
            return coverage[key]
    return None


def build_lineage(
    repo: Path,
    models_dir: Path,
    dags_dir: Path,
    *,
    now: datetime | None = None,
    coverage_json: Path | None = None,
    feature_store_yaml: Path | None = None,
) -> LineageReport:
    """Read the registry, model cards and DAG files, and run every check.

    Args:
        repo: The Feast repo folder (holds ``feature_store.yaml``).
        models_dir: Folder of model cards.
        dags_dir: Folder of Airflow DAG files.
        now: The time freshness is judged at (UTC); defaults to the current time.
        coverage_json: Coverage per view or tier: the ``coverage.json`` of a precompute run
            or any ``{"exact": 0.6, ...}`` object. Without one, the newest run's file under
            ``<repo>/data/precompute_runs`` is used when there is one.
        feature_store_yaml: Another config than ``<repo>/feature_store.yaml`` (the Redis one);
            a relative path is tried as given, then under ``repo``.
    """
    repo = Path(repo)
    now = now or datetime.now(UTC)
    from solaris_feast.store.config import open_repo_store

    store = open_repo_store(repo, feature_store_yaml)
    dags, findings = read_dags(Path(dags_dir))
    cards, card_findings = read_model_cards(Path(models_dir))
    findings += card_findings
    dag_by_id = {d.dag_id: d for d in dags}
    coverage_path = coverage_json or latest_coverage_file(repo)
    coverage = read_coverage(coverage_path) if coverage_path is not None else None

    sources = {s.name: _source_lineage(s) for s in store.list_data_sources()}
    services = store.list_feature_services()
    services_of: dict[str, list[str]] = {}
    for service in services:
        for projection in service.feature_view_projections:
            services_of.setdefault(projection.name, []).append(service.name)

    views: list[ViewLineage] = []
    for fv in sorted(store.list_feature_views(), key=lambda v: v.name):
        views.append(_feature_view_lineage(fv, repo, dag_by_id, sources, services_of, coverage))
    for odfv in sorted(store.list_on_demand_feature_views(), key=lambda v: v.name):
        tags = dict(odfv.tags or {})
        inputs = [p.name for p in odfv.source_feature_view_projections.values()]
        inputs += list(odfv.source_request_sources)
        views.append(
            ViewLineage(
                name=odfv.name,
                kind="on_demand",
                entities=(),
                ttl_seconds=None,
                tags=tags,
                sources=tuple(inputs),
                producing_dag=None,
                schedule=None,
                schedule_interval_seconds=None,
                fm_version=tags.get(TAG_FM_VERSION),
                compressor_version=tags.get(TAG_COMPRESSOR_VERSION),
                verifier_version=tags.get(TAG_VERIFIER_VERSION),
                last_materialization=None,
                last_write=None,
                coverage=_coverage_of(coverage, odfv.name, tags),
                services=tuple(services_of.get(odfv.name, [])),
            )
        )
    view_by_name = {v.name: v for v in views}
    service_lineage = []
    for service in sorted(services, key=lambda s: s.name):
        names = tuple(p.name for p in service.feature_view_projections)
        versions: set[str] = set()
        for n in names:
            version = view_by_name[n].compressor_version if n in view_by_name else None
            if version is not None and _is_versioned(version):
                versions.add(version)
        service_lineage.append(ServiceLineage(service.name, names, tuple(sorted(versions))))

    report = LineageReport(
        project=store.project,
        repo=str(repo),
        generated_at=now,
        views=tuple(views),
        services=tuple(service_lineage),
        sources=tuple(sorted(sources.values(), key=lambda s: s.name)),
        dags=tuple(dags),
        cards=tuple(
            verify_cards(
                cards,
                {
                    version
                    for view in views
                    for version in (
                        view.fm_version,
                        view.compressor_version,
                        view.verifier_version,
                    )
                    if version
                },
            )
        ),
        findings=(),
        coverage_source=str(coverage_path) if coverage_path is not None else None,
    )
    nodes, edges = lineage_graph(report)
    return dataclasses.replace(
        report,
        findings=tuple(findings + check_lineage(report, now)),
        nodes=tuple(nodes),
        edges=tuple(edges),
    )


def _feature_view_lineage(
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
    last_materialization = max((_as_utc(end) for _, end in intervals), default=None, key=_sort_key)
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
        fm_version=tags.get(TAG_FM_VERSION),
        compressor_version=tags.get(TAG_COMPRESSOR_VERSION),
        verifier_version=tags.get(TAG_VERIFIER_VERSION),
        last_materialization=last_materialization,
        last_write=last_write,
        coverage=_coverage_of(coverage, fv.name, tags),
        services=tuple(services_of.get(fv.name, [])),
    )


def _sort_key(value: datetime | None) -> datetime:
    return value or datetime.min.replace(tzinfo=UTC)


def _is_versioned(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in UNVERSIONED


# ----------------------------------------------------------------------------------------------
# Checks


def check_lineage(report: LineageReport, now: datetime) -> list[Finding]:
    """Run every check over a report; the order is stable so output diffs cleanly."""
    findings: list[Finding] = []
    for view in report.views:
        findings += _check_version_tags(view)
        findings += _check_ttl_against_schedule(view, report)
        findings += _check_freshness(view, now)
    findings += _check_services(report)
    findings += _check_cards(report)
    return findings


def _check_version_tags(view: ViewLineage) -> list[Finding]:
    required = VERSION_TAGS if view.kind == "feature_view" else ON_DEMAND_VERSION_TAGS
    missing = [t for t in required if not _is_versioned(view.tags.get(t))]
    if not missing:
        return []
    shown = ", ".join(f"{t}={view.tags.get(t)!r}" if t in view.tags else t for t in missing)
    return [
        Finding(
            CHECK_MISSING_VERSION_TAGS,
            view.name,
            f"view {view.name!r} has no usable version tags ({shown}): a vector it serves cannot "
            "be traced to the models that made it. Build it with solaris_definitions() and set "
            "fm_version, compressor_version and verifier_version from the model cards.",
        )
    ]


def _check_ttl_against_schedule(view: ViewLineage, report: LineageReport) -> list[Finding]:
    findings: list[Finding] = []
    if view.kind != "feature_view":
        return findings
    tag_ttl = view.tags.get(TAG_TTL_SECONDS)
    if tag_ttl is not None and view.ttl_seconds is not None:
        try:
            mismatch = abs(float(tag_ttl) - view.ttl_seconds) > 0.5
        except ValueError:
            mismatch = True
        if mismatch:
            findings.append(
                Finding(
                    "lineage",
                    view.name,
                    f"tag {TAG_TTL_SECONDS}={tag_ttl!r} disagrees with the view's TTL of "
                    f"{view.ttl_seconds:.0f} s; the TTL is what readers enforce",
                    "warning",
                )
            )
    dag = next((d for d in report.dags if d.dag_id == view.producing_dag), None)
    tag_schedule = view.tags.get(TAG_SCHEDULE)
    if dag is not None and tag_schedule and dag.interval_seconds is not None:
        try:
            tag_interval = schedule_interval_seconds(tag_schedule)
        except ValueError:
            tag_interval = None
        if tag_interval != dag.interval_seconds:
            findings.append(
                Finding(
                    "lineage",
                    view.name,
                    f"tag {TAG_SCHEDULE}={tag_schedule!r} disagrees with DAG {dag.dag_id!r} "
                    f"({dag.schedule}, in {dag.path}); the DAG file is what runs",
                    "warning",
                )
            )
    if view.producing_dag_tag and dag is not None and view.producing_dag_tag != dag.dag_id:
        findings.append(
            Finding(
                "lineage",
                view.name,
                f"tag {TAG_PRODUCING_DAG}={view.producing_dag_tag!r} names no DAG in the DAG "
                f"folder, but {dag.dag_id!r} ({dag.path}) declares the view's asset; set the tag "
                f"to {dag.dag_id!r}",
                "warning",
            )
        )
    if view.producing_dag and dag is None:
        findings.append(
            Finding(
                "lineage",
                view.name,
                f"producing DAG {view.producing_dag!r} was not found in the DAG folder; "
                "its schedule is taken from the view's tag",
                "warning",
            )
        )
    interval = view.schedule_interval_seconds
    if view.ttl_seconds is None or interval is None:
        return findings
    if view.ttl_seconds < interval:
        findings.append(
            Finding(
                CHECK_TTL_SHORTER_THAN_SCHEDULE,
                view.name,
                f"TTL {format_seconds(view.ttl_seconds)} of {view.name!r} is shorter than the "
                f"{format_seconds(interval)} between runs of its producing DAG "
                f"{view.producing_dag!r} ({view.schedule}): every entry expires before the next "
                "run refreshes it, so misses are guaranteed. Raise the TTL or run the DAG more "
                "often.",
            )
        )
    return findings


def _check_freshness(view: ViewLineage, now: datetime) -> list[Finding]:
    if view.kind != "feature_view" or view.ttl_seconds is None:
        return []
    refreshed = [t for t in (view.last_materialization, view.last_write) if t is not None]
    if not refreshed:
        return [
            Finding(
                CHECK_STALE_VIEW,
                view.name,
                f"{view.name!r} has never been materialized and its offline table holds no "
                "writes: every read is a miss until its producing DAG runs",
                "warning",
            )
        ]
    last = max(refreshed)
    age = (now - last).total_seconds()
    if age <= view.ttl_seconds:
        return []
    return [
        Finding(
            CHECK_STALE_VIEW,
            view.name,
            f"{view.name!r} was last refreshed at {last.isoformat()} "
            f"({format_seconds(age)} ago), longer ago than its TTL of "
            f"{format_seconds(view.ttl_seconds)}: every stored entry has expired. Check the "
            f"producing DAG {view.producing_dag!r}.",
        )
    ]


def _check_services(report: LineageReport) -> list[Finding]:
    findings = []
    views = {v.name: v for v in report.views}
    # The VM that reads the service is the one load_bundle serves: the newest.
    vm_cards = [c for c in report.cards if c.kind == "vm" and c.role == "serving"]
    compressor_versions = {c.version for c in report.cards if c.kind == "compressor"}
    for service in report.services:
        if len(service.compressor_versions) > 1:
            by_version = {
                version: [
                    n
                    for n in service.views
                    if n in views and views[n].compressor_version == version
                ]
                for version in service.compressor_versions
            }
            shown = "; ".join(f"{v}: {', '.join(names)}" for v, names in by_version.items())
            findings.append(
                Finding(
                    CHECK_MIXED_COMPRESSOR_VERSIONS,
                    service.name,
                    f"feature service {service.name!r} serves views made by different "
                    f"compressors ({shown}): their vectors live in different embedding spaces "
                    "and must not be mixed. Rewrite the stale views with the current compressor.",
                )
            )
        for vm in vm_cards:
            expected = set(vm.parents) & compressor_versions
            if not expected:
                continue  # the card does not say which compressor it was trained on
            other = sorted(set(service.compressor_versions) - expected)
            if other:
                findings.append(
                    Finding(
                        CHECK_VM_EXPECTS_OTHER_COMPRESSOR,
                        service.name,
                        f"VM {vm.version!r} was trained on embeddings of compressor "
                        f"{sorted(expected)}, but {service.name!r} serves compressor {other}",
                    )
                )
    return findings


def _check_cards(report: LineageReport) -> list[Finding]:
    findings = []
    for card in report.cards:
        if card.weights_status == "mismatch":
            findings.append(
                Finding(
                    CHECK_WEIGHTS_SHA256_MISMATCH,
                    card.version,
                    f"{card.kind} card {card.version!r} ({card.path}) records sha256 "
                    f"{card.weights_sha256 or '<none>'} but {card.weights_file} hashes to "
                    f"{_file_sha256(Path(card.weights_file))}: the weights changed after the card "
                    "was written. Retrain, or restore the original file.",
                )
            )
        elif card.weights_status == "missing":
            findings.append(
                Finding(
                    CHECK_WEIGHTS_SHA256_MISMATCH,
                    card.version,
                    f"{card.kind} card {card.version!r}: weights file {card.weights_file} is "
                    "missing, so it cannot be verified",
                    "warning",
                )
            )
    return findings


# ----------------------------------------------------------------------------------------------
# Graph


def _node_id(kind: str, name: str) -> str:
    return f"{kind}_{re.sub(r'[^0-9A-Za-z_]', '_', name)}"


def lineage_graph(report: LineageReport) -> tuple[list[GraphNode], list[GraphEdge]]:
    """Nodes and edges from data sources and DAGs through views and services to model cards."""
    nodes: dict[str, GraphNode] = {}
    edges: list[GraphEdge] = []

    def node(kind: str, name: str, label: str, group: str | None = None) -> str:
        key = _node_id(kind, name)
        nodes.setdefault(key, GraphNode(key, label, kind, group))
        return key

    def edge(source: str, target: str, label: str = "", dashed: bool = False) -> None:
        candidate = GraphEdge(source, target, label, dashed)
        if candidate not in edges:
            edges.append(candidate)

    dag_by_id = {d.dag_id: d for d in report.dags}
    asset_producer: dict[str, str] = {}
    for dag in report.dags:
        group = _node_id("dag", dag.dag_id)
        for task in dag.tasks:
            task_node = node("task", f"{dag.dag_id}.{task.task_id}", task.task_id, group)
            for asset in task.outlets:
                edge(task_node, node("asset", asset, f"asset {asset}"), "outlet")
                asset_producer.setdefault(asset, task_node)
    for dag in report.dags:
        for asset in dag.triggering_assets:
            edge(node("asset", asset, f"asset {asset}"), _node_id("dag", dag.dag_id), "triggers")

    for registered in report.sources:
        if registered.kind == "file":
            node("table", registered.name, f"offline table {registered.path or registered.name}")
        elif registered.kind == "push":
            node("push", registered.name, f"push source {registered.name}")
        elif registered.kind == "request":
            node("request", registered.name, f"request {registered.name}")
        else:
            node("table", registered.name, f"{registered.kind} {registered.name}")
        if registered.kind == "push" and registered.batch_source:
            node("table", registered.batch_source, f"offline table {registered.path or ''}")
            edge(
                _node_id("push", registered.name),
                _node_id("table", registered.batch_source),
                "offline",
            )

    kinds = {s.name: s.kind for s in report.sources}
    for view in report.views:
        label = f"{view.name}<br/>TTL {format_seconds(view.ttl_seconds)}"
        if view.kind == "on_demand":
            view_node = node("odfv", view.name, f"on-demand {view.name}")
            view_kinds = {v.name: v.kind for v in report.views}
            for source in view.sources:
                if source in view_kinds:
                    kind = "odfv" if view_kinds[source] == "on_demand" else "view"
                    edge(_node_id(kind, source), view_node)
                else:
                    # Not a view, so a request source (Feast does not always list those).
                    edge(node("request", source, f"request {source}"), view_node)
            continue
        view_node = node("view", view.name, label)
        for source in view.sources:
            kind = kinds.get(source, "file")
            source_node = _node_id("push" if kind == "push" else "table", source)
            if source_node not in nodes:
                node("table", source, f"source {source}")
                source_node = _node_id("table", source)
            edge(source_node, view_node, "push" if kind == "push" else "materialize")
        if view.producing_dag:
            writer = _producer_node(view, report, dag_by_id, asset_producer, node)
            push_sources = [s for s in view.sources if kinds.get(s) == "push"]
            table_sources = [s for s in view.sources if kinds.get(s) != "push"]
            for push in push_sources:
                edge(writer, _node_id("push", push), "push")
            if not push_sources:
                for table in table_sources:
                    edge(writer, _node_id("table", table), "writes")
                # Embeddings also go straight to the online store, not only through the table.
                edge(writer, view_node, "online write", dashed=True)

    for service in report.services:
        service_node = node("service", service.name, f"feature service {service.name}")
        for name in service.views:
            kind = next((v.kind for v in report.views if v.name == name), "feature_view")
            edge(_node_id("odfv" if kind == "on_demand" else "view", name), service_node)

    cards_by_version = {c.version: c for c in report.cards if c.in_use}
    for card in cards_by_version.values():
        card_node = node("card", card.version, f"{card.kind.upper()} {card.version}")
        for parent in card.parents:
            if parent in cards_by_version:
                edge(_node_id("card", parent), card_node, "parent", dashed=True)
        # A training DAG marks an asset per model kind (``solaris_model_vm``): link it.
        for dag in report.dags:
            for asset in dag.outlets:
                if card.role == "serving" and asset.endswith(f"_{card.kind}"):
                    edge(_node_id("asset", asset), card_node, "registers", dashed=True)
        if card.kind == "vm" and card.role == "serving":
            for service in report.services:
                edge(_node_id("service", service.name), card_node, "consumes")
    for view in report.views:
        version = view.compressor_version
        if version in cards_by_version and view.kind == "feature_view":
            edge(_node_id("card", version), _node_id("view", view.name), "z space", dashed=True)
        verifier = view.verifier_version
        # The verifier plans which pairs get precomputed; the other tiers only derive from them.
        plans = view.tags.get(TAG_TIER, "EXACT") == "EXACT"
        if verifier in cards_by_version and view.producing_dag and plans:
            dag_node = _node_id("dag", view.producing_dag)
            if view.producing_dag in dag_by_id:
                edge(_node_id("card", verifier), dag_node, "verifier", dashed=True)
    return list(nodes.values()), edges


def _producer_node(
    view: ViewLineage,
    report: LineageReport,
    dag_by_id: Mapping[str, DagLineage],
    asset_producer: Mapping[str, str],
    node: Any,
) -> str:
    """The task (via its asset) or the DAG that writes a view; a placeholder when not found."""
    dag_id = view.producing_dag or ""
    dag = dag_by_id.get(dag_id)
    if dag is None:
        return str(node("dag", dag_id, f"DAG {dag_id}<br/>{view.schedule or '?'} (file not found)"))
    needles = {view.name, *view.sources}
    needles |= {Path(s.path).name for s in report.sources if s.name in view.sources and s.path}
    outlets = [a for t in dag.tasks for a in t.outlets]
    exact = [a for a in outlets if a in needles]
    loose = [a for a in outlets if any(n and n in a for n in needles)]
    for asset in exact or loose:
        return _node_id("asset", asset)
    return _node_id("dag", dag_id)


def to_mermaid(report: LineageReport) -> str:
    """The graph as a Mermaid ``flowchart LR``, DAG tasks grouped in one subgraph per DAG."""
    shapes = {
        "table": ('[("', '")]'),
        "push": ('>"', '"]'),
        "request": ('(["', '"])'),
        "asset": ('{{"', '"}}'),
        "view": ('["', '"]'),
        "odfv": ('[/"', '"/]'),
        "service": ('(["', '"])'),
        "card": ('[["', '"]]'),
        "task": ('("', '")'),
        "dag": ('("', '")'),
    }
    lines = ["flowchart LR"]
    grouped: dict[str, list[GraphNode]] = {}
    for n in report.nodes:
        if n.group:
            grouped.setdefault(n.group, []).append(n)
    dag_by_node = {_node_id("dag", d.dag_id): d for d in report.dags}
    for group_id, dag in dag_by_node.items():
        title = _mermaid_text(f"DAG {dag.dag_id} ({dag.schedule or 'manual'})")
        lines.append(f'  subgraph {group_id}["{title}"]')
        for n in grouped.get(group_id, []):
            left, right = shapes[n.kind]
            lines.append(f"    {n.id}{left}{_mermaid_text(n.label)}{right}")
        if not grouped.get(group_id):
            lines.append(f'    {group_id}_empty["no tasks found"]')
        lines.append("  end")
    for n in report.nodes:
        if n.group or n.id in dag_by_node:
            continue
        left, right = shapes.get(n.kind, ('["', '"]'))
        lines.append(f"  {n.id}{left}{_mermaid_text(n.label)}{right}")
    for e in report.edges:
        arrow = "-.->" if e.dashed else "-->"
        label = f"|{_mermaid_text(e.label)}|" if e.label else ""
        lines.append(f"  {e.source} {arrow}{label} {e.target}")
    lines += [
        "  classDef table fill:#eef,stroke:#557",
        "  classDef push fill:#ffe9cc,stroke:#c80",
        "  classDef view fill:#e6ffe6,stroke:#393",
        "  classDef card fill:#f3e6ff,stroke:#739",
        "  classDef problem fill:#ffd6d6,stroke:#c00,stroke-width:2px",
    ]
    by_kind: dict[str, list[str]] = {}
    for n in report.nodes:
        if n.kind in {"table", "push", "view", "card"}:
            by_kind.setdefault(n.kind, []).append(n.id)
    for kind, ids in by_kind.items():
        lines.append(f"  class {','.join(ids)} {kind}")
    flagged = {f.subject for f in report.errors}
    problem_ids = [
        n.id
        for n in report.nodes
        if n.kind in {"view", "odfv", "service", "card"} and n.id.split("_", 1)[1] in {
            re.sub(r"[^0-9A-Za-z_]", "_", s) for s in flagged
        }
    ]  # fmt: skip
    if problem_ids:
        lines.append(f"  class {','.join(problem_ids)} problem")
    return "\n".join(lines) + "\n"


def _mermaid_text(text: str) -> str:
    return text.replace('"', "#quot;").replace("\n", "<br/>")


# ----------------------------------------------------------------------------------------------
# Rendering


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "never"


def _schedule_text(view: ViewLineage) -> str:
    if not view.producing_dag:
        return "-"
    every = view.schedule_interval_seconds
    gap = f", longest gap {format_seconds(every)}" if every is not None else ""
    return f"{view.producing_dag} ({view.schedule or 'schedule unknown'}{gap})"


def view_rows(view: ViewLineage) -> list[tuple[str, str]]:
    """The per-view table as (field, value) rows, shared by Markdown and HTML."""
    coverage = f"{view.coverage:.1%}" if view.coverage is not None else "n/a"

    def stored(text: str) -> str:
        # On-demand views compute at read time: nothing is written or materialized.
        return text if view.kind == "feature_view" else "-"

    other_tags = {k: v for k, v in sorted(view.tags.items())}
    return [
        ("Kind", "on-demand view" if view.kind == "on_demand" else "feature view"),
        ("Entities", ", ".join(view.entities) or "-"),
        ("TTL", f"{format_seconds(view.ttl_seconds)}" + (
            f" ({view.ttl_seconds:.0f} s)" if view.ttl_seconds is not None else "")),
        ("Sources", ", ".join(view.sources) or "-"),
        ("Producing DAG", _schedule_text(view)),
        ("FM version", view.fm_version or "-"),
        ("Compressor version", view.compressor_version or "-"),
        ("Verifier version", view.verifier_version or "-"),
        ("Last write (offline)", stored(_when(view.last_write))),
        ("Last materialization", stored(_when(view.last_materialization))),
        ("Coverage", coverage),
        ("Feature services", ", ".join(view.services) or "-"),
        ("Tags", ", ".join(f"{k}={v}" for k, v in other_tags.items()) or "-"),
    ]  # fmt: skip


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(report: LineageReport) -> str:
    """The review as Markdown with a Mermaid graph (renders on GitHub and in most viewers)."""
    out = [
        f"# Feature lineage: project `{report.project}`",
        "",
        f"Repo `{report.repo}`, generated {_when(report.generated_at)}. Coverage from "
        f"{'`' + report.coverage_source + '`' if report.coverage_source else 'nowhere (n/a)'}.",
        "",
        "## Checks",
        "",
    ]
    if not report.findings:
        out.append("All checks passed.")
    for f in report.findings:
        mark = "FAIL" if f.severity == "error" else "warn"
        out.append(f"- **{mark}** `{f.check}` {f.subject}: {f.message}")
    out += ["", "## Graph", "", "```mermaid", to_mermaid(report).rstrip(), "```", ""]
    out += ["## Feature views", ""]
    for view in report.views:
        out += [f"### {view.name}", "", "| Field | Value |", "| --- | --- |"]
        out += [f"| {k} | {_md_cell(v)} |" for k, v in view_rows(view)]
        out.append("")
    out += [
        "## Feature services",
        "",
        "| Service | Views | Compressor versions |",
        "| --- | --- | --- |",
    ]
    for s in report.services:
        out.append(
            f"| {s.name} | {', '.join(s.views)} | {', '.join(s.compressor_versions) or '-'} |"
        )
    out += [
        "",
        "## Data sources",
        "",
        "| Source | Kind | Path | Backed by |",
        "| --- | --- | --- | --- |",
    ]
    for src in report.sources:
        out.append(f"| {src.name} | {src.kind} | {src.path or '-'} | {src.batch_source or '-'} |")
    out += ["", "## DAGs", "", "| DAG | Schedule | Longest gap | Tasks | Outlets | File |",
            "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for d in report.dags:
        out.append(
            f"| {d.dag_id} | {_md_cell(d.schedule or 'manual')} | "
            f"{format_seconds(d.interval_seconds)} | {', '.join(t.task_id for t in d.tasks)} | "
            f"{', '.join(d.outlets) or '-'} | {d.path} |"
        )
    out += ["", "## Model cards", "", "| Version | Kind | Role | Parents | Created | Weights |",
            "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for c in report.cards:
        out.append(
            f"| {c.version} | {c.kind} | {c.role or 'not in use'} | {', '.join(c.parents) or '-'} "
            f"| {c.created_at or '-'} | {c.weights_status} (`{c.weights_sha256[:12]}`) |"
        )
    return "\n".join(out) + "\n"


def to_html(report: LineageReport) -> str:
    """A self-contained page; the graph renders with Mermaid from a CDN when online and shows
    its source text otherwise."""
    esc = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>Feature lineage: {esc(report.project)}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1200px}"
        "table{border-collapse:collapse;margin-bottom:1.5em}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}"
        ".error{color:#b00}.warning{color:#a60}</style></head><body>",
        f"<h1>Feature lineage: project <code>{esc(report.project)}</code></h1>",
        f"<p>Repo <code>{esc(report.repo)}</code>, "
        f"generated {esc(_when(report.generated_at))}.</p>",
        "<h2>Checks</h2>",
    ]
    if not report.findings:
        parts.append("<p>All checks passed.</p>")
    else:
        parts.append("<ul>")
        for f in report.findings:
            parts.append(
                f"<li class='{f.severity}'><b>{'FAIL' if f.severity == 'error' else 'warn'}</b> "
                f"<code>{esc(f.check)}</code> {esc(f.subject)}: {esc(f.message)}</li>"
            )
        parts.append("</ul>")
    parts += [
        "<h2>Graph</h2>",
        f"<pre class='mermaid'>{esc(to_mermaid(report))}</pre>",
        "<h2>Feature views</h2>",
    ]
    for view in report.views:
        parts.append(f"<h3>{esc(view.name)}</h3><table>")
        parts += [f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in view_rows(view)]
        parts.append("</table>")
    parts.append("<h2>Feature services</h2><table><tr><th>Service</th><th>Views</th>"
                 "<th>Compressor versions</th></tr>")  # fmt: skip
    for s in report.services:
        parts.append(
            f"<tr><td>{esc(s.name)}</td><td>{esc(', '.join(s.views))}</td>"
            f"<td>{esc(', '.join(s.compressor_versions) or '-')}</td></tr>"
        )
    parts.append("</table><h2>Model cards</h2><table><tr><th>Version</th><th>Kind</th>"
                 "<th>Role</th><th>Parents</th><th>Weights</th></tr>")  # fmt: skip
    for c in report.cards:
        parts.append(
            f"<tr><td>{esc(c.version)}</td><td>{esc(c.kind)}</td>"
            f"<td>{esc(c.role or 'not in use')}</td><td>{esc(', '.join(c.parents) or '-')}</td>"
            f"<td>{esc(c.weights_status)}</td></tr>"
        )
    parts += [
        "</table>",
        f"<script src='{MERMAID_CDN}'></script>",
        "<script>if(window.mermaid){mermaid.initialize({startOnLoad:true});}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def to_json(report: LineageReport) -> str:
    """Everything in the report, plus the Mermaid text, as JSON."""

    def encode(value: object) -> object:
        if isinstance(value, datetime):
            return value.isoformat()
        raise TypeError(f"not JSON serializable: {type(value).__name__}")

    payload = dataclasses.asdict(report)
    payload["ok"] = not report.errors
    payload["mermaid"] = to_mermaid(report)
    return json.dumps(payload, indent=2, default=encode, sort_keys=False) + "\n"


def render(report: LineageReport, fmt: str) -> str:
    """Render in ``md``, ``html`` or ``json``."""
    if fmt == "md":
        return to_markdown(report)
    if fmt == "html":
        return to_html(report)
    if fmt == "json":
        return to_json(report)
    raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")


# ----------------------------------------------------------------------------------------------
# Command


def lineage_command(
    repo: Path,
    models_dir: Path,
    dags_dir: Path,
    fmt: str = "md",
    output: Path | None = None,
    *,
    coverage_json: Path | None = None,
    feature_store_yaml: Path | None = None,
    now: datetime | None = None,
) -> int:
    """Build, render and check the lineage; the return value is the process exit code.

    0 when no check failed, 1 when one did (the findings are printed to stderr), 2 when the
    inputs could not be read at all. The report goes to ``output`` or, without one, to stdout.
    """
    from solaris_feast.errors import SolarisError

    if fmt not in FORMATS:
        print(f"solaris lineage: --format must be one of {', '.join(FORMATS)}", file=sys.stderr)
        return 2
    try:
        report = build_lineage(
            repo,
            models_dir,
            dags_dir,
            now=now,
            coverage_json=coverage_json,
            feature_store_yaml=feature_store_yaml,
        )
    except (SolarisError, OSError, ValueError) as exc:
        print(f"solaris lineage: {exc}", file=sys.stderr)
        return 2
    text = render(report, fmt)
    if output is None:
        sys.stdout.write(text)
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
        print(f"lineage report written to {output}", file=sys.stderr)
    for finding in report.findings:
        mark = "FAIL" if finding.severity == "error" else "warn"
        print(f"{mark} [{finding.check}] {finding.subject}: {finding.message}", file=sys.stderr)
    if report.errors:
        print(f"{len(report.errors)} lineage check(s) failed", file=sys.stderr)
        return 1
    return 0


def lineage_cli(
    repo: Annotated[
        Path, typer.Option("--repo", help="Feast repo folder (holds feature_store.yaml).")
    ] = Path("feature_repo"),
    models_dir: Annotated[
        Path, typer.Option("--models", help="Folder of model cards (JSON).")
    ] = Path("models"),
    dags_dir: Annotated[Path, typer.Option("--dags", help="Folder of Airflow DAG files.")] = Path(
        "dags"
    ),
    fmt: Annotated[str, typer.Option("--format", "-f", help="md, html or json.")] = "md",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")
    ] = None,
    coverage_json: Annotated[
        Path | None,
        typer.Option("--coverage", help="A precompute run's coverage.json (default: the newest)."),
    ] = None,
    feature_store_yaml: Annotated[
        Path | None,
        typer.Option("--config", help="Feast config other than <repo>/feature_store.yaml."),
    ] = None,
) -> None:
    """Review where each SOLARIS feature view comes from; exits 1 when a check fails."""
    code = lineage_command(
        repo,
        models_dir,
        dags_dir,
        fmt,
        output,
        coverage_json=coverage_json,
        feature_store_yaml=feature_store_yaml,
    )
    if code:
        raise typer.Exit(code)
