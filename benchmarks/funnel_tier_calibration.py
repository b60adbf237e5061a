"""Why the enrichment tiers cost clicks in the funnel world: the VM's calibration per served tier.

Issue 13's ablation (exact / exact+user / exact+user+similar) loses clicks when the user
aggregate is added, for every planner. This script runs the funnel as ``solaris simulate --world
funnel`` does and, at every scored hour, scores **every final-stage pair** (all K, not only the
shown ones) for each arm, split by the tier the arm serves it:

- ``mean_predicted``: the VM's click probability with the served ``z`` and tier;
- ``mean_predicted_as_zero``: the same pairs served ZERO (zero vector, tier ZERO);
- ``mean_true``: the world's click probability (the ground truth);
- ``mse`` / ``mse_as_zero``: squared error against the truth, both ways;
- ``user_tier_zero_vector``: for USER_AGG pairs, the VM with tier USER_AGG and a zero vector, what
  the tier alone adds;
- ``user_aggregate_on_exact_pairs``: the user aggregate served on pairs the arm holds exact, against
  their truth (is the aggregate vector itself off?).

It reads the loop through an observer of ``_serve_arms`` and changes nothing that is scored; the
clicks it prints are the run's own ablation.

    python benchmarks/funnel_tier_calibration.py --seeds 0,1,2 --scored-hours 4 \\
        [--fm-rows own_tier] --json benchmarks/results/funnel_tier_calibration.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, cast, get_args

import numpy as np
import torch

from solaris_feast.console import parse_script_args
from solaris_feast.evaluation.funnel import loop
from solaris_feast.serving.resolve import resolve
from solaris_feast.tiers import FmRowsTier, Tier


def _add(
    bucket: dict[str, float], predicted: np.ndarray, as_zero: np.ndarray, true: np.ndarray
) -> None:
    bucket["n"] = bucket.get("n", 0.0) + len(true)
    for key, values in (
        ("predicted", predicted),
        ("as_zero", as_zero),
        ("true", true),
        ("sq_err", (predicted - true) ** 2),
        ("sq_err_as_zero", (as_zero - true) ** 2),
    ):
        bucket[key] = bucket.get(key, 0.0) + float(values.sum())


def _summary(bucket: dict[str, float]) -> dict[str, float]:
    n = bucket["n"]
    return {
        "pairs": int(n),
        "mean_predicted": round(bucket["predicted"] / n, 4),
        "mean_predicted_as_zero": round(bucket["as_zero"] / n, 4),
        "mean_true": round(bucket["true"] / n, 4),
        "mse": round(bucket["sq_err"] / n, 5),
        "mse_as_zero": round(bucket["sq_err_as_zero"] / n, 5),
    }


def run(
    seed: int, scored_hours: int, budget: float, fm_rows: FmRowsTier = "zero"
) -> dict[str, Any]:
    """One seed: per arm and tier, the sums above; then the arms' ablation clicks."""
    sums: dict[str, dict[str, dict[str, float]]] = {}
    serve_arms = loop._serve_arms

    def observed(run: Any, records: Any, outcome: Any, scored: bool, shown: Any) -> Any:
        if scored:
            ttl = run.cfg.ttl_seconds_by_tier()
            vm = run.bundle.vm
            for state in run.states:
                arm = sums.setdefault(loop._arm_name(state.planner, state.budget), {})
                for rec in records:
                    stored = state.stored_values(rec.users, rec.items)
                    now_s = rec.now.value / 1e9
                    served = resolve(stored, now_s=now_s, ttl_seconds=ttl)
                    z = torch.from_numpy(served.embeddings)
                    tiers = torch.from_numpy(served.tiers.astype(np.int64))
                    zero_z, zero_t = torch.zeros_like(z), torch.full_like(tiers, int(Tier.ZERO))
                    p = vm.predict_proba(rec.batch, z, tiers)[:, 0].numpy()
                    p0 = vm.predict_proba(rec.batch, zero_z, zero_t)[:, 0].numpy()
                    # The user tier alone, over every pair the aggregate covers.
                    user = resolve(
                        {Tier.USER_AGG: stored[Tier.USER_AGG]}, now_s=now_s, ttl_seconds=ttl
                    )
                    uz = torch.from_numpy(user.embeddings)
                    ut = torch.from_numpy(user.tiers.astype(np.int64))
                    pu = vm.predict_proba(rec.batch, uz, ut)[:, 0].numpy()
                    pu0 = vm.predict_proba(rec.batch, torch.zeros_like(uz), ut)[:, 0].numpy()
                    for tier in Tier:
                        rows = served.tiers == int(tier)
                        if rows.any():
                            _add(
                                arm.setdefault(tier.name, {}), p[rows], p0[rows], rec.click_p[rows]
                            )
                    covered_by_user = user.tiers == int(Tier.USER_AGG)
                    for name, rows, predicted in (
                        ("user_tier_zero_vector", served.tiers == int(Tier.USER_AGG), pu0),
                        (
                            "user_aggregate_on_exact_pairs",
                            (served.tiers == int(Tier.EXACT)) & covered_by_user,
                            pu,
                        ),
                    ):
                        if rows.any():
                            _add(
                                arm.setdefault(name, {}),
                                predicted[rows],
                                p0[rows],
                                rec.click_p[rows],
                            )
        return serve_arms(run, records, outcome, scored, shown)

    cfg = loop.FunnelConfig(scored_hours=scored_hours, planners=("verifier", "oracle"))
    cfg = cfg.model_copy(
        update={
            "precompute": cfg.precompute.model_copy(
                update={"budgets": (budget,), "fm_rows_tier": fm_rows}
            )
        }
    )
    started = time.perf_counter()
    loop._serve_arms = observed
    try:
        outcome = loop.run_seed(cfg, seed)
    finally:
        loop._serve_arms = serve_arms
    return {
        "seed": seed,
        "seconds": round(time.perf_counter() - started, 1),
        "arms": {
            name: {
                "by_served_tier": {k: _summary(v) for k, v in sums.get(name, {}).items()},
                "ablation_expected_clicks": {k: round(v, 2) for k, v in arm.clicks.items()},
            }
            for name, arm in outcome.arms.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--scored-hours", type=int, default=4)
    parser.add_argument("--budget", type=float, default=0.1)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument(
        "--fm-rows", choices=get_args(FmRowsTier), default="zero", help="TierMix.fm_rows"
    )
    args = parse_script_args(parser)
    torch.set_num_threads(1)
    results = []
    for seed in (int(s) for s in args.seeds.split(",")):
        results.append(run(seed, args.scored_hours, args.budget, cast(FmRowsTier, args.fm_rows)))
        print(f"seed {seed} done in {results[-1]['seconds']} s", flush=True)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "scored_hours": args.scored_hours,
                    "budget": args.budget,
                    "fm_rows": args.fm_rows,
                    "seeds": results,
                },
                indent=2,
            )
        )
    for r in results:
        for name, arm in r["arms"].items():
            user = arm["by_served_tier"].get("USER_AGG")
            if user:
                print(
                    f"seed {r['seed']} {name}: USER_AGG pairs predicted {user['mean_predicted']} "
                    f"(as ZERO {user['mean_predicted_as_zero']}), true {user['mean_true']}; "
                    f"clicks {arm['ablation_expected_clicks']}"
                )
    print(f"JSON: {args.json}")


if __name__ == "__main__":
    main()
