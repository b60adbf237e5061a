"""How the verifier's hit rate and the click uplift move with the world's dynamics.

One knob at a time around the defaults (interest drift, requests per session, and the early
stage's width, which sets how often it agrees with the VM; the agreement is measured, not
set), with the verifier, random and the oracle at one budget. Run as
``python -m solaris_feast.evaluation.funnel.sensitivity --json PATH``.

Rows are merged into ``PATH`` as each finishes (under a lock on the file, so several processes, each
given ``--knob``/``--values``, can share one file); a row already there with the same seeds,
scored hours and budget is kept rather than rerun, and the default setting, shared by every
knob, is simulated once.
"""

from __future__ import annotations

import argparse
import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from solaris_feast.evaluation.funnel import FunnelConfig, simulate_funnel
from solaris_feast.evaluation.metrics import strict_json

KNOBS: dict[str, tuple[str, tuple[float, ...]]] = {
    "drift_hours": ("world", (4.0, 12.0, 48.0)),
    "requests_per_session": ("world", (2.0, 4.0, 8.0)),
    "early_stage_dim": ("funnel", (2, 16, 64)),
}


def knob_config(base: FunnelConfig, knob: str, value: float, budget: float) -> FunnelConfig:
    """``base`` with one knob set, the three planners of the table and one budget."""
    where, _ = KNOBS[knob]
    if where == "world":
        cfg = base.model_copy(update={"world": base.world.model_copy(update={knob: value})})
    else:
        cfg = base.model_copy(update={knob: int(value)})
    return cfg.model_copy(
        update={
            "planners": ("verifier", "random", "oracle"),
            "precompute": base.precompute.model_copy(update={"budgets": (budget,)}),
        }
    )


def is_default(base: FunnelConfig, knob: str, value: float) -> bool:
    where, _ = KNOBS[knob]
    current = getattr(base.world if where == "world" else base, knob)
    return float(current) == float(value)


@contextmanager
def _locked(path: Path) -> Iterator[IO[str]]:
    """``path`` (created if missing) opened for update under an exclusive lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.seek(0)
            yield f
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _rows(f: IO[str]) -> list[dict[str, Any]]:
    text = f.read()
    return json.loads(text) if text.strip() else []


def read_rows(path: Path) -> list[dict[str, Any]]:
    with _locked(path) as f:
        return _rows(f)


def _order(row: dict[str, Any]) -> tuple[int, float]:
    return list(KNOBS).index(row["knob"]), float(row["value"])


def merge_row(path: Path, row: dict[str, Any]) -> None:
    """Replace the row of the same (knob, value) in ``path``, or add it; keep knob order."""
    key = (row["knob"], float(row["value"]))
    with _locked(path) as f:
        rows = [r for r in _rows(f) if (r["knob"], float(r["value"])) != key]
        rows.append(row)
        rows.sort(key=_order)
        f.seek(0)
        f.truncate()
        f.write(strict_json(rows, indent=2))


def _same_run(row: dict[str, Any], seeds: list[int], scored_hours: int, budget: float) -> bool:
    return (
        row["seeds"] == seeds
        and row.get("scored_hours") == scored_hours
        and float(row["budget"]) == budget
    )


def measure(cfg: FunnelConfig, seeds: list[int]) -> dict[str, Any]:
    """The table's columns for one configuration."""
    by = {r["planner"]: r for r in simulate_funnel(cfg, seeds)}
    return {
        "hit_verifier": by["verifier"]["exact_hit_rate"],
        "hit_verifier_ci95": by["verifier"]["exact_hit_rate_ci95"],
        "hit_random": by["random"]["exact_hit_rate"],
        "hit_oracle": by["oracle"]["exact_hit_rate"],
        "uplift_verifier": by["verifier"]["click_uplift_per_1k_requests"],
        "uplift_verifier_ci95": by["verifier"]["click_uplift_per_1k_requests_ci95"],
        "early_stage_vm_agreement": by["verifier"]["early_stage_vm_agreement"],
    }


def sensitivity(
    base: FunnelConfig,
    seeds: list[int],
    path: Path,
    budget: float = 0.1,
    settings: list[tuple[str, float]] | None = None,
) -> list[dict[str, Any]]:
    """One row per (knob, value) in ``settings`` (default: all of :data:`KNOBS`), merged
    into ``path`` as it finishes; rows of the same run already in ``path`` are reused."""
    if settings is None:
        settings = [(k, v) for k, (_, values) in KNOBS.items() for v in values]
    rows = []
    for knob, value in settings:
        done = [r for r in read_rows(path) if _same_run(r, seeds, base.scored_hours, budget)]
        default = is_default(base, knob, value)
        reuse = [
            r
            for r in done
            if (r["knob"], float(r["value"])) == (knob, float(value))
            or (default and is_default(base, r["knob"], r["value"]))
        ]
        if reuse:
            measured = {k: v for k, v in reuse[0].items() if k.startswith(("hit_", "uplift_"))}
            measured["early_stage_vm_agreement"] = reuse[0]["early_stage_vm_agreement"]
        else:
            measured = measure(knob_config(base, knob, value, budget), seeds)
        row = {
            "knob": knob,
            "value": value,
            "default": default,
            "seeds": seeds,
            "budget": budget,
            "scored_hours": base.scored_hours,
            **measured,
        }
        merge_row(path, row)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--scored-hours", type=int, default=12)
    parser.add_argument("--budget", type=float, default=0.1)
    parser.add_argument("--knob", choices=list(KNOBS), help="only this knob (default: all)")
    parser.add_argument("--values", type=float, nargs="+", help="only these values of --knob")
    args = parser.parse_args()
    if args.values and not args.knob:
        parser.error("--values needs --knob")
    knobs = [args.knob] if args.knob else list(KNOBS)
    settings = [
        (k, int(v) if KNOBS[k][0] == "funnel" else float(v))
        for k in knobs
        for v in (args.values or KNOBS[k][1])
    ]
    base = FunnelConfig().model_copy(update={"scored_hours": args.scored_hours})
    sensitivity(base, args.seeds, args.json, args.budget, settings)


if __name__ == "__main__":
    main()
