"""Longest gap between two runs of a schedule, found by walking its cron fires.

The longest gap, not the typical one, decides whether a TTL guarantees misses. Cost: one cron
walk of at most 15 days (800 when day-of-month or month fields are set), cached per expression.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

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
    return cron_max_gap_seconds(cron)


@lru_cache(maxsize=256)
def cron_max_gap_seconds(expressions: str | tuple[str, ...]) -> float:
    """Longest gap between two fires of one cron expression, or of the union of several (as
    Airflow's ``MultipleCronTriggerTimetable`` runs them). Measured in UTC from a fixed start.

    Raises:
        ValueError: an expression is not cron.
    """
    from croniter import croniter

    crons = (expressions,) if isinstance(expressions, str) else expressions
    horizon = CRON_REFERENCE_START
    streams = []
    for cron in crons:
        if not croniter.is_valid(cron):
            raise ValueError(f"{cron!r} is neither an Airflow preset nor a cron expression")
        fields = cron.split()
        # Day-of-month and month fields repeat over a year; everything else within a week.
        yearly = len(fields) >= 4 and (fields[2] != "*" or fields[3] != "*")
        horizon = max(horizon, CRON_REFERENCE_START + timedelta(days=800 if yearly else 15))
        streams.append(_fires(croniter(cron, CRON_REFERENCE_START)))
    fires = heapq.merge(*streams)
    previous = next(fires)
    widest = 0.0
    for _ in range(CRON_MAX_FIRES * len(crons)):
        current = next(fires)
        widest = max(widest, (current - previous).total_seconds())
        if current > horizon:
            break
        previous = current
    return widest


def _fires(schedule: Any) -> Iterator[datetime]:
    while True:
        yield schedule.get_next(datetime)


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
