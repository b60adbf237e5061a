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


class StageProgress(Protocol):
    def __call__(self, stage: str, done: int, total: int) -> None: ...


@contextmanager
def stage_bars(enabled: bool = True) -> Iterator[StageProgress]:
    """Yield a ``(stage, done, total)`` callback that draws one bar per stage."""
    if not enabled:
        yield lambda stage, done, total: None
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
