"""Served coverage per view, from a precompute run's ``coverage.json``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from solaris_feast.store.tags import TAG_TIER

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


def coverage_of(
    coverage: Mapping[str, float] | None, view_name: str, tags: Mapping[str, str]
) -> float | None:
    if not coverage:
        return None
    tier = tags.get(TAG_TIER, "").upper()
    for key in (view_name.lower(), tier.lower(), *COVERAGE_KEYS_BY_TIER.get(tier, ())):
        if key and key in coverage:
            return coverage[key]
    return None
