"""The funnel world with the chain retrained on its own traffic, beside one trained once.

``python benchmarks/funnel_retrain.py --seeds 5 --json benchmarks/results/funnel_retrain.json``

Both settings run the same seeds, planners and budget; the only difference is
``chain_retrain_hours`` (0: the chain trained once at the end of the warm-up; 6: FM, compressor
and VM trained again every 6 hours on the log the funnel produced, every store restarting in the
new embedding space). Records are the funnel's own (``build_funnel_records``), plus which hours
each seed trained at.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from solaris_feast.console import parse_script_args
from solaris_feast.evaluation.funnel import FunnelConfig, run_seed
from solaris_feast.evaluation.funnel.report import build_funnel_records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--retrain-hours", type=int, default=6)
    parser.add_argument("--budget", type=float, default=0.1)
    parser.add_argument("--json", type=Path, required=True)
    args = parse_script_args(parser)
    default = FunnelConfig()
    results = []
    for retrain in (0, args.retrain_hours):
        config = default.model_copy(
            update={
                "planners": ("verifier", "random"),
                "chain_retrain_hours": retrain,
                "precompute": default.precompute.model_copy(update={"budgets": (args.budget,)}),
            }
        )
        started = time.perf_counter()
        outcomes = []
        for seed in range(args.seeds):
            outcomes.append(run_seed(config, seed))
            print(f"retrain every {retrain} h: seed {seed} done", flush=True)
        results.append(
            {
                "chain_retrain_hours": retrain,
                "seconds": round(time.perf_counter() - started, 1),
                "chain_trainings": [[h for h, _ in o.chain_trainings] for o in outcomes],
                "records": build_funnel_records(outcomes),
            }
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2, allow_nan=True))
    for result in results:
        for record in result["records"]:
            print(
                f"retrain {result['chain_retrain_hours']:>2} h  {record['planner']:<9} "
                f"hit {record['exact_hit_rate']:.3f} {record['exact_hit_rate_ci95']}  "
                f"clicks/1k {record['clicks_per_1k_requests']:.1f} "
                f"{record['clicks_per_1k_requests_ci95']}  "
                f"without z {record['clicks_per_1k_requests_without_z']:.1f}"
            )
    print(f"JSON: {args.json}")


if __name__ == "__main__":
    main()
