"""Run time and run folders: where a run's state lives between its tasks and across retries.

A precompute run keeps its files in ``<runs_dir>/<interval>/<vm version>/``: ``manifest.json``
(planning time, model versions), ``misses.parquet``, per shard of users
``shards/<i>/{candidates.parquet, ranked/, ranking.json, plan/, report.json}``, the round's
``budget.json`` (its split over the shards) and ``coverage.json``. Each step writes its file once,
atomically (a
temporary name, then ``os.replace``), and a retried or re-run step reads the file back instead
of computing it again, so it sees exactly the inputs of the first attempt. A new VM version gets
a new folder: a full re-plan, since stored vectors of another version count as absent to the
planner and as misses to the retriever.

A training run keeps one marker per stage under ``<models_dir>/.training_runs/<interval>/``
naming the version the stage registered, so a retried stage returns that card instead of
training again.

A scheduled round also records how it sits on its cron (:func:`round_ticks`): ticks skipped
since the previous round and whether it started late, logged and kept in ``coverage.json``.

A round's tasks run with fewer garbage collections and an allocator that keeps freed tensor
memory (:func:`round_process_settings`): a process that holds Feast, torch and a round's frames
tracks about 400k objects, and each full collection of them stopped a round for 0.2 s, wherever
the allocation count happened to cross the threshold; and glibc handed the FM's batch tensors
back to the kernel after every batch, so each batch paid its page faults again.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from solaris_feast.pipeline.settings import PrecomputeSettings

logger = logging.getLogger(__name__)

ROUND_GC_THRESHOLDS = (50_000, 20, 100)
"""``gc.set_threshold`` while a round's task runs; Python's default is ``(700, 10, 10)``.

A round allocates millions of short-lived containers (frames, row lists, encoded values) and
almost no reference cycles, so the default's frequent collections find nothing to free while
each full one walks every object the imports and the data left. Measured on the demo round
(reference FM, Redis, `solaris bench precompute`'s round): garbage collection took 0.27-0.31 s
of a 1.7-1.9 s round with the defaults, including a full collection of 0.20-0.24 s, and
0.07-0.11 s with these, with no full collection."""


ALLOCATOR_MMAP_THRESHOLD = 32 << 20
"""glibc's ``M_MMAP_THRESHOLD`` for a round's process: blocks below 32 MiB (glibc's upper bound)
come from the heap, not from a fresh ``mmap`` that is unmapped again when freed."""
ALLOCATOR_TRIM_THRESHOLD = 256 << 20
"""glibc's ``M_TRIM_THRESHOLD``: up to 256 MiB freed at the heap's top stays with the process.

With both, the reference FM in a fresh process runs 1.65x faster per pair (48 -> 29 us, four
rounds of `run_round_benchmark` each, 2026-12-04; peak RSS 665 -> 674 MB): glibc's defaults
return a batch's tensors to the kernel when they are freed and page-fault them in again for the
next batch, until a large enough free happens to raise its dynamic thresholds (which is why a
process that had run other work first was already fast). Either setting alone does nothing.
Training is not faster with them (22.6 against 24.0 s on the demo's chain), so only a round's
tasks set them."""


@functools.cache
def keep_freed_memory() -> bool:
    """Set :data:`ALLOCATOR_MMAP_THRESHOLD` and :data:`ALLOCATOR_TRIM_THRESHOLD` for this
    process, where the C library is glibc; True when both were taken. Process-wide and not put
    back (glibc has no getter for them): each Airflow task of a round runs in a process of its
    own, and a process that runs rounds keeps running them. Once a process: every round task
    asks, the first sets them."""
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    taken = libc.mallopt(m_mmap_threshold, ALLOCATOR_MMAP_THRESHOLD) == 1
    return bool(libc.mallopt(m_trim_threshold, ALLOCATOR_TRIM_THRESHOLD) == 1 and taken)


@contextmanager
def round_process_settings() -> Iterator[None]:
    """Run the block (or, as ``@round_process_settings()``, the function) with
    :data:`ROUND_GC_THRESHOLDS`, then put back the thresholds found (cycles are still collected,
    only less often), and with freed memory kept for the next batch (:func:`keep_freed_memory`,
    left set)."""
    keep_freed_memory()
    before = gc.get_threshold()
    gc.set_threshold(*ROUND_GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)


RUNS_SUBDIR = Path("data") / "precompute_runs"
"""Default runs folder, inside the Feast repo."""
TRAINING_MARKERS_SUBDIR = ".training_runs"


def interval_of(context: Mapping[str, Any]) -> dict[str, Any]:
    """The Airflow task context's fields :func:`run_time` takes, as a DAG's first task passes
    them on (JSON-ready for XCom once serialized by Airflow)."""
    return {
        "data_interval_start": context.get("data_interval_start"),
        "data_interval_end": context.get("data_interval_end"),
        "logical_date": context.get("logical_date"),
        "run_after": getattr(context["dag_run"], "run_after", None),
        "run_id": context["run_id"],
        "run_type": _run_type(context["dag_run"]),
    }


INTERVAL_RUN_TYPES = frozenset({"scheduled", "backfill"})
"""Airflow run types whose data interval is the time they work for. A manual run's interval is
inferred from when it was triggered (Airflow 3's ``trigger_dag``), not from its logical date."""


LIVE_ROUND_LAG_SECONDS = 900
"""How far behind the clock a manual round (or a command's ``--at``) may work and still answer
the miss queue. The queue holds pairs served *now*; a round for an earlier moment computes them
from the log as it was then, and their vectors, stored as fresh for a pair TTL, kept the live
rounds from computing them again (measured under a real scheduler: a backfill of 22:20 run at
23:43 took the 37 misses served at 23:43 and stored 22:20 vectors for them, fresh until 04:20).
15 minutes covers a trigger's own delay and a command run for "now" by hand."""


def takes_live_misses(
    now: datetime, run_type: str | None, started: datetime, later_round: bool = False
) -> bool:
    """Whether a round working for ``now``, started at ``started``, takes the miss queue.

    A backfill never does; a scheduled round (the DAG runs without catchup, so it is the latest
    tick, however late it starts) and an asset-triggered one do unless a round for a later time
    has started already (``later_round``: the run was cleared and re-run after newer rounds,
    so it is no longer the live one); any other round does when ``now`` is at most
    :data:`LIVE_ROUND_LAG_SECONDS` before ``started``. A round that does not take them plans
    from its candidates alone and leaves the queue to the live rounds.
    """
    if run_type == "backfill":
        return False
    if run_type in ("scheduled", "asset_triggered"):
        return not later_round
    return (started - now).total_seconds() <= LIVE_ROUND_LAG_SECONDS


def later_round_started(settings: PrecomputeSettings, now: datetime) -> bool:
    """Whether a round for a time after ``now`` has opened its folder under :func:`runs_root`.
    Interval folders are named by their times (:func:`run_time`), so only a folder of a run
    without an interval (``run_<id>``) has its manifest read."""
    root = runs_root(settings)
    if not root.is_dir():
        return False
    for interval in root.iterdir():
        end = _interval_end(interval.name)
        if end is not None and end <= now:
            continue  # the name says it: no folder of an earlier round is opened
        for manifest in interval.glob("*/manifest.json"):
            moment = end if end is not None else _manifest_time(manifest)
            if moment is not None and moment > now:
                return True
    return False


def _interval_end(name: str) -> datetime | None:
    """The end of an interval folder's name ``<start>_<end>`` (:func:`_stamp`), else None."""
    parts = name.split("_")
    if len(parts) != 2:
        return None
    try:
        return datetime.strptime(parts[1], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def _manifest_time(manifest: Path) -> datetime | None:
    import json

    try:
        moment = datetime.fromisoformat(json.loads(manifest.read_text(encoding="utf-8"))["now"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _run_type(dag_run: Any) -> str | None:
    run_type = getattr(dag_run, "run_type", None)
    return None if run_type is None else str(getattr(run_type, "value", run_type))


def run_time(
    data_interval_start: datetime | None,
    data_interval_end: datetime | None,
    logical_date: datetime | None,
    run_after: datetime | None,
    run_id: str,
    run_type: str | None = None,
) -> tuple[datetime, str]:
    """The time a run works for and a file-name-safe key of it.

    Scheduled (and backfill) runs use their data interval's end, so a re-run of an interval
    plans for the same moment and reuses its files. Other runs (manual, asset-triggered) with a
    logical date work for it, keyed as the interval that starts and ends there (a re-run for
    the same moment reuses its files too): Airflow gives a manual run triggered for a logical
    date an interval of the trigger's time, and reading that interval planned a run triggered
    for 06:00 at the time of the trigger. Runs without either use the time they were queued
    for, keyed by their run id. ``run_type`` None (a command's own round): the interval when
    there is one.
    """
    import pandas as pd

    by_interval = run_type is None or run_type in INTERVAL_RUN_TYPES
    if data_interval_end is not None and by_interval:
        now = pd.Timestamp(data_interval_end)
        start = pd.Timestamp(data_interval_start or data_interval_end)
        key = f"{_stamp(start)}_{_stamp(now)}"
    elif logical_date is not None:
        now = pd.Timestamp(logical_date)
        key = f"{_stamp(now)}_{_stamp(now)}"
    else:
        now = pd.Timestamp(run_after) if run_after is not None else pd.Timestamp.now(tz="UTC")
        key = "run_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id).strip("_")
    if now.tzinfo is None:
        now = now.tz_localize("UTC")
    now = now.tz_convert("UTC").floor("s")
    return now.to_pydatetime(), key


def _stamp(ts: pd.Timestamp) -> str:
    if ts.tzinfo is None:
        ts = ts.tz_localize("UTC")
    return str(ts.tz_convert("UTC").strftime("%Y%m%dT%H%M%SZ"))


def runs_root(settings: PrecomputeSettings) -> Path:
    """The folder of every round's folder: ``runs_dir``, or inside the Feast repo when empty."""
    return (
        Path(settings.runs_dir) if settings.runs_dir else Path(settings.feature_repo) / RUNS_SUBDIR
    )


def precompute_run_dir(settings: PrecomputeSettings, interval_key: str, vm_version: str) -> Path:
    """``<runs_dir>/<interval>/<vm version>/`` (:func:`runs_root`)."""
    return runs_root(settings) / interval_key / vm_version


def earlier_round_published(settings: PrecomputeSettings, run_dir: Path) -> bool:
    """Whether any round other than ``run_dir``'s has published its ``coverage.json`` under
    :func:`runs_root`: after one has, the views' offline logs should exist, and a missing
    folder means storage this worker does not see. Stops at the first one found."""
    root = runs_root(settings)
    if not root.is_dir():
        return False
    here = run_dir.resolve()
    for interval in root.iterdir():
        if not interval.is_dir():
            continue
        for folder in interval.iterdir():
            if (folder / "coverage.json").is_file() and folder.resolve() != here:
                return True
    return False


def training_stage_marker(models_dir: Path, interval_key: str, stage: str) -> Path:
    """The file naming the version a training stage registered for one run."""
    return models_dir / TRAINING_MARKERS_SUBDIR / interval_key / stage


TRAINING_SETTINGS_FILE = "settings.json"
"""Beside a training run's stage markers: the settings the run started with."""


def refuse_changed_settings(
    record: Path,
    what: str,
    settings_of: Callable[[str], Mapping[str, Any]],
    now: Mapping[str, Any],
    remedy: str,
) -> None:
    """Refuse to re-run a run whose files (``record``'s folder) were made with other settings.

    A retry of the same run reuses what its earlier try wrote (a round's candidates, plan and
    shard reports; a training run's registered cards): that is what makes a retry idempotent.
    With other settings those files would be reused silently, made under the old ones.
    ``settings_of`` reads the settings out of the record's text (``what``: the record's kind).

    Raises:
        ConfigError: the record does not read, or naming the keys that differ, their values,
            the files and ``remedy``.
    """
    from solaris_feast.errors import ConfigError

    where = record.parent
    try:
        before = settings_of(record.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{record} is not a readable {what}: {exc}") from exc
    changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
    if changed:
        differences = "; ".join(f"{k}: {before.get(k)!r} then, {now.get(k)!r} now" for k in changed)
        raise ConfigError(
            f"this run already ran in {where} with other settings ({differences}); a re-run "
            f"reuses what it wrote, so {remedy}"
        )


def shard_dir(run_dir: Path, shard_index: int) -> Path:
    """The folder of one shard of users' files in a precompute run."""
    return run_dir / "shards" / str(shard_index)


def shard_report_path(run_dir: Path, shard_index: int) -> Path:
    """What a shard's FM task computed and wrote."""
    return shard_dir(run_dir, shard_index) / "report.json"


def shard_candidates_path(run_dir: Path, shard_index: int) -> Path:
    """The candidates of a shard's users."""
    return shard_dir(run_dir, shard_index) / "candidates.parquet"


def shard_ranking_path(run_dir: Path, shard_index: int) -> Path:
    """The shard's ranking facts the budget split reads (miss tier, mass, eligible pairs)."""
    return shard_dir(run_dir, shard_index) / "ranking.json"


def shard_lost_path(run_dir: Path, shard_index: int) -> Path:
    """Pairs the shard found missing from the online store though the log calls them fresh
    (written only when there are any): the round's coverage does not count them as exact."""
    return shard_dir(run_dir, shard_index) / "lost_online.parquet"


def shard_ranked_dir(run_dir: Path, shard_index: int) -> Path:
    """Every eligible pair of the shard, in the planner's order (a plan with no budget limit)."""
    return shard_dir(run_dir, shard_index) / "ranked"


def shard_plan_dir(run_dir: Path, shard_index: int) -> Path:
    """The shard's plan: its ranking cut to its part of the round's budget."""
    return shard_dir(run_dir, shard_index) / "plan"


def fill_report_path(run_dir: Path) -> Path:
    """What the round's similarity fill was asked for and wrote."""
    return run_dir / "fill.json"


def budget_path(run_dir: Path) -> Path:
    """The round's budget split over its shards."""
    return run_dir / "budget.json"


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never half."""
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    temp.write_text(text)
    os.replace(temp, path)


def write_once(path: Path, text: str) -> bool:
    """Write ``path`` atomically unless it exists (a retried step keeps the first attempt's
    file). True when this call wrote it."""
    if path.is_file():
        return False
    write_atomic(path, text)
    return True


def write_parquet_once(frame: pd.DataFrame, path: Path) -> bool:
    """Write ``path`` unless it exists, atomically and exclusively: of two processes writing
    the same step at once, one file wins and the other gets False (and should read it back).
    True when this call wrote it."""
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    frame.to_parquet(temp, index=False)
    try:
        os.link(temp, path)  # fails if the file exists: no second writer replaces the first
    except FileExistsError:
        return False
    finally:
        temp.unlink(missing_ok=True)
    return True


def write_parquet_atomic(frame: pd.DataFrame, path: Path) -> None:
    """Atomic :meth:`DataFrame.to_parquet` (no index), as :func:`write_atomic`."""
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    frame.to_parquet(temp, index=False)
    os.replace(temp, path)


def replace_folder_atomic(staging: Path, target: Path) -> None:
    """Move a fully written ``staging`` folder to ``target`` in one rename: a reader (a shard
    reading the plan) never sees half of it. A ``target`` left by a try that died before its
    step's marker file was written is replaced."""
    if target.exists():
        import shutil

        shutil.rmtree(target)
    os.replace(staging, target)


def staging_folder(target: Path) -> Path:
    """A fresh sibling of ``target`` to write into before :func:`replace_folder_atomic`."""
    return target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")


# -- schedule ticks ------------------------------------------------------------------------------


def schedule_ticks(
    schedule: str,
    run_at: datetime,
    previous_run_at: datetime | None,
    started_at: datetime | None,
) -> dict[str, object] | None:
    """How a scheduled round sits on its cron: ticks skipped since the previous round, and
    whether it started late.

    ``run_at`` is the tick the round is for (its data interval's end: the tick itself under
    Airflow 3's default trigger timetable), ``previous_run_at`` the previous round's. A tick is
    skipped when a round overran its interval (``max_active_runs=1`` and no catch-up: Airflow
    drops the ticks that came due meanwhile) or the scheduler was down. A round is late when it
    started after its next tick was already due. Returns None for a schedule that is not a
    cron expression or preset (an asset schedule has no ticks).

    Returns:
        ``schedule``, ``run_at``, ``previous_run_at`` (ISO strings), ``skipped_ticks`` (ticks
        strictly between the two rounds), ``started_late_seconds`` (start - ``run_at``; None
        without a start) and ``late`` (bool).
    """
    from croniter import croniter

    if not croniter.is_valid(schedule):
        return None
    skipped = 0
    if previous_run_at is not None and previous_run_at < run_at:
        ticks = croniter(schedule, previous_run_at)
        while ticks.get_next(datetime) < run_at:
            skipped += 1
    late_seconds = (started_at - run_at).total_seconds() if started_at is not None else None
    due_next = croniter(schedule, run_at).get_next(datetime)
    late = started_at is not None and started_at >= due_next
    return {
        "schedule": schedule,
        "run_at": run_at.isoformat(),
        "previous_run_at": previous_run_at.isoformat() if previous_run_at else None,
        "skipped_ticks": skipped,
        "started_late_seconds": late_seconds,
        "late": late,
    }


def round_ticks(schedule: str | None, dag_run: Any, previous: Any) -> dict[str, object] | None:
    """:func:`schedule_ticks` of an Airflow DAG run against the previous run of its DAG (any
    state, any type; None when there is none); None unless ``dag_run`` is a scheduled run (a
    manual or asset-triggered round is on no tick) of a DAG with a schedule."""
    if schedule is None:
        return None
    if str(getattr(dag_run, "run_type", "")).split(".")[-1].lower() != "scheduled":
        return None
    run_at = dag_run.data_interval_end or dag_run.logical_date or dag_run.run_after
    previous_at = None
    if previous is not None:
        previous_at = previous.data_interval_end or previous.logical_date or previous.run_after
    report = schedule_ticks(schedule, run_at, previous_at, getattr(dag_run, "start_date", None))
    if report is not None and (report["skipped_ticks"] or report["late"]):
        logger.warning(
            "round for %s: %s tick(s) of %s skipped since the previous round (%s); started %s s "
            "after its tick%s",
            report["run_at"],
            report["skipped_ticks"],
            schedule,
            report["previous_run_at"],
            report["started_late_seconds"],
            ", after its next tick was due (late)" if report["late"] else "",
        )
    return report
