"""Progress bars for long steps, one bar per stage name, shared by every command."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

console = Console(stderr=True)

LINE_EVERY_SECONDS = 30.0
"""How often a stage's progress line repeats where no bar can be drawn."""


class StageProgress(Protocol):
    def __call__(self, stage: str, done: int, total: int) -> None: ...


@contextmanager
def stage_bars(enabled: bool = True) -> Iterator[StageProgress]:
    """Yield a ``(stage, done, total)`` callback that draws one bar per stage; where stderr is
    no terminal (a log file, CI, ``nohup``), where rich draws nothing until the end, one line
    per stage at its start, every :data:`LINE_EVERY_SECONDS` and at its end."""
    if not enabled:
        yield lambda stage, done, total: None
        return
    if not console.is_terminal:
        yield _stage_lines()
        return
    bars = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    tasks: dict[str, TaskID] = {}

    def update(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = bars.add_task(stage, total=total)
        bars.update(tasks[stage], completed=done, total=total)

    with bars:
        yield update


def _stage_lines() -> StageProgress:
    """``(stage, done, total)`` as plain lines on stderr: a run whose output goes to a file
    showed nothing for minutes (``solaris train`` wrote no line in 8 minutes of FM training)."""
    import sys
    import time

    started: dict[str, float] = {}
    said: dict[str, float] = {}
    ended: set[str] = set()

    def update(stage: str, done: int, total: int) -> None:
        if stage in ended:
            return
        now = time.monotonic()
        first = stage not in started
        started.setdefault(stage, now)
        finished = total > 0 and done >= total
        if first or finished or now - said[stage] >= LINE_EVERY_SECONDS:
            elapsed = now - started[stage]
            print(f"{stage}: {done}/{total} ({elapsed:.0f} s)", file=sys.stderr, flush=True)
            said[stage] = now
        if finished:
            ended.add(stage)

    return update
