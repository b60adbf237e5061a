"""The DAGs that write the views: their schedules, tasks and the assets each task writes.

Read from Airflow's own DAG objects: ``DagBag`` imports every file of the DAG folder as Airflow's
DAG processor does (the folder is put on ``sys.path`` for the time, as Airflow has its DAGs
folder there), and the schedule is taken from ``dag.timetable``, tasks and outlets from
``dag.tasks``. Why objects and not the source text: the DAG files decide their schedule at parse
time (``os.environ.get("SOLARIS_PRECOMPUTE_SCHEDULE", "@hourly")``, asset conditions, timetable
classes), and a static evaluator of Python source only approximates that: the 600-line one this
replaces took an environment lookup's default rather than the value set, and reported computed
schedules and unknown timetable classes as unresolved. The views' ``solaris.producing_dag`` /
``solaris.schedule`` tags say what was configured when the views were applied; the DAG object
says what runs, so both are read and compared (:mod:`.checks`); without a DAG folder the tags are
all there is.

Cost, measured on this project's ``dags/`` (2 DAG files; a 2-core machine shared with other jobs,
load 5-7, three alternating runs each): reading the DAGs after Feast is imported took 0.12-0.23 s
with the static reader and 2.7-3.2 s with ``DagBag`` (importing Airflow's core is most of it); a
whole ``solaris lineage --format json`` took 8.5-10.6 s wall / 7.3-7.8 s CPU before and
9.5-16.4 s wall / 9.3-12.0 s CPU after, Feast's import (about 8 s alone) being the larger part.
A review run now and then can pay that for exact schedules. DAG files must import only
``airflow.sdk`` at module level (Airflow asks that of them anyway), and Airflow reads its
``AIRFLOW_HOME`` configuration as any Airflow command does. Airflow's log line "Filling up the
DagBag" and anything a DAG file prints go to stderr, so a report on stdout stays clean.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import warnings
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from solaris_feast.review.lineage.model import DagLineage, DagTask, Finding, ScheduleKind
from solaris_feast.review.lineage.schedule import (
    CRON_REFERENCE_START,
    cron_max_gap_seconds,
    format_seconds,
)


def read_dags(dags_dir: Path) -> tuple[list[DagLineage], list[Finding]]:
    """Every DAG Airflow finds in ``dags_dir``, with asset-triggered intervals filled in; a file
    that fails to import is a warning finding naming it."""
    findings: list[Finding] = []
    if not dags_dir.is_dir():
        findings.append(
            Finding(
                "lineage",
                str(dags_dir),
                "DAG folder not found; schedules come from tags only",
                "warning",
            )
        )
        return [], findings
    # Importing Airflow runs its logging setup: it replaces the root logger's handlers and level
    # and sets the "airflow" logger back to INFO, and routes warnings into logging. Undo that, so
    # the caller's logging (the CLI's, which keeps library chatter out of the console) is what
    # it was.
    root, airflow_logger = logging.getLogger(), logging.getLogger("airflow")
    saved = (root.level, list(root.handlers), airflow_logger.level, warnings.showwarning)
    from airflow.dag_processing.dagbag import DagBag

    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    airflow_logger.setLevel(saved[2])
    warnings.showwarning = saved[3]

    with _dag_folder_on_path(dags_dir), contextlib.redirect_stdout(sys.stderr):
        # safe_mode=False: every .py file is a DAG file, as in this project's dags/ (Airflow's
        # default skips files that do not mention "dag" and "airflow").
        bag = DagBag(dag_folder=dags_dir, safe_mode=False, load_op_links=False)
    for path, error in sorted(bag.import_errors.items()):
        last_line = str(error).strip().splitlines()[-1] if str(error).strip() else "import failed"
        findings.append(
            Finding("lineage", str(path), f"DAG file could not be imported: {last_line}", "warning")
        )
    dags = [dag_lineage(dag) for _, dag in sorted(bag.dags.items())]
    return resolve_asset_intervals(dags), findings


@contextlib.contextmanager
def _dag_folder_on_path(folder: Path) -> Iterator[None]:
    entry = str(folder.resolve())
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)


def dag_lineage(dag: Any) -> DagLineage:
    """A DAG object's id, file, schedule (as written and as its longest gap) and tasks."""
    kind, interval, assets, any_of = _timetable_schedule(dag.timetable)
    written = dag.schedule
    if isinstance(written, str):
        text: str | None = written
    elif kind == "assets":
        text = (" | " if any_of else " & ").join(assets)
    elif isinstance(written, timedelta) or (kind == "interval" and interval is not None):
        text = f"every {format_seconds(interval)}"
    elif written is None:
        text = None
    else:
        expression = getattr(dag.timetable, "expression", None)
        text = str(expression) if expression else type(dag.timetable).__name__
    tasks = tuple(
        DagTask(task.task_id, tuple(_asset_name(o) for o in getattr(task, "outlets", ()) or ()))
        for task in dag.tasks
    )
    return DagLineage(
        dag_id=dag.dag_id,
        path=str(dag.fileloc),
        schedule=text,
        schedule_kind=kind,
        interval_seconds=interval,
        triggering_assets=tuple(assets),
        tasks=tasks,
    )


def _asset_name(outlet: Any) -> str:
    return str(getattr(outlet, "name", None) or getattr(outlet, "uri", None) or outlet)


def _asset_names(condition: Any) -> list[str]:
    """Leaf asset names of an asset condition (``AssetAny`` / ``AssetAll`` nest)."""
    if condition is None:
        return []
    objects = getattr(condition, "objects", None)
    if objects is None:
        return [_asset_name(condition)]
    return [name for inner in objects for name in _asset_names(inner)]


def _timetable_schedule(timetable: Any) -> tuple[ScheduleKind, float | None, list[str], bool]:
    """(kind, longest gap in seconds, triggering assets, whether any one asset triggers)."""
    name = type(timetable).__name__
    condition = getattr(timetable, "asset_condition", None)
    assets = _asset_names(condition)
    any_of = type(condition).__name__ == "AssetAny"
    inner = getattr(timetable, "timetable", None)
    if inner is not None:
        # AssetOrTimeSchedule: asset events can only shorten the timetable's gaps, so the
        # timetable's longest gap bounds the schedule's.
        kind, interval, _, _ = _timetable_schedule(inner)
        return kind, interval, assets, any_of
    if assets:
        return "assets", None, assets, any_of
    expressions = _cron_expressions(timetable)
    if expressions:
        return "cron", cron_max_gap_seconds(expressions), [], False
    delta = getattr(timetable, "delta", None)
    if delta is not None:
        return "interval", _delta_seconds(delta), [], False
    if name in {"NullTimetable", "OnceTimetable", "ContinuousTimetable"}:
        return "manual", None, [], False
    return "unresolved", None, [], False


def _cron_expressions(timetable: Any) -> tuple[str, ...]:
    nested = getattr(timetable, "timetables", None)
    if nested:  # MultipleCronTriggerTimetable: the union of its crons' fires
        return tuple(e for t in nested for e in _cron_expressions(t))
    expression = getattr(timetable, "expression", None)
    return (str(expression),) if expression else ()


def _delta_seconds(delta: Any) -> float:
    if isinstance(delta, timedelta):
        return delta.total_seconds()
    # A relativedelta ("every month") has no fixed length: its longest over a year of starts.
    starts = [CRON_REFERENCE_START.replace(month=m) for m in range(1, 13)]
    return max(((s + delta) - s).total_seconds() for s in starts)


def resolve_asset_intervals(dags: Sequence[DagLineage]) -> list[DagLineage]:
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
