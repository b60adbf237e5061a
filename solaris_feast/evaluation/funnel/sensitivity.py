"""How the verifier's hit rate and the click uplift move with the world's dynamics.

One knob at a time around the defaults (interest drift, requests per session, and the early
stage's width, which sets how often it agrees with the VM; the agreement is measured, not
set), with the verifier, random and the oracle at one budget. Run as
``python -m solaris_feast.evaluation.funnel.sensitivity --json PATH``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from solaris_feast.evaluation.funnel import FunnelConfig, simulate_funnel

KNOBS: dict[str, tuple[str, tuple[float, ...]]] = {
    "drift_hours": ("world", (4.0, 12.0, 48.0)),
    "requests_per_session": ("world", (2.0, 4.0, 8.0)),
    "early_stage_dim": ("funnel", (2, 16, 64)),
}


def sensitivity(base: FunnelConfig, seeds: list[int], budget: float = 0.1) -> list[dict[str, Any]]:
    """One row per (knob, value): hit rates of verifier, random and oracle, uplift, agreement."""
    rows = []
    for knob, (where, values) in KNOBS.items():
        for value in values:
            if where == "world":
                world = base.world.model_copy(update={knob: value})
                cfg = base.model_copy(update={"world": world})
            else:
                cfg = base.model_copy(update={knob: int(value)})
            cfg = cfg.model_copy(
                update={
                    "planners": ("verifier", "random", "oracle"),
                    "precompute": base.precompute.model_copy(update={"budgets": (budget,)}),
                }
            )
            by = {r["planner"]: r for r in simulate_funnel(cfg, seeds)}
            rows.append(
                {
                    "knob": knob,
                    "value": value,
                    "seeds": seeds,
                    "budget": budget,
                    "hit_verifier": by["verifier"]["exact_hit_rate"],
                    "hit_verifier_ci95": by["verifier"]["exact_hit_rate_ci95"],
                    "hit_random": by["random"]["exact_hit_rate"],
                    "hit_oracle": by["oracle"]["exact_hit_rate"],
                    "uplift_verifier": by["verifier"]["click_uplift_per_1k_requests"],
                    "uplift_verifier_ci95": by["verifier"]["click_uplift_per_1k_requests_ci95"],
                    "early_stage_vm_agreement": by["verifier"]["early_stage_vm_agreement"],
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--scored-hours", type=int, default=12)
    args = parser.parse_args()
    base = FunnelConfig().model_copy(update={"scored_hours": args.scored_hours})
    rows = sensitivity(base, list(range(args.seeds)))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
