"""How a precompute round's cost grows with users (issue 16, target 4, in part).

``python benchmarks/round_scaling.py --json benchmarks/results/round_scaling.json``

One round (``solaris_feast.bench.run_round_benchmark``: candidates, verifier, plan, FM,
writes, aggregate, similarity fill) on the synthetic presets tiny / demo / default / large
(300 to 20,000 users), the same candidates per user and budget share, SQLite online store,
seeded reference models. The growth exponent is the least-squares slope of log(wall seconds)
against log(users), and of log(seconds) against log(planned pairs).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from solaris_feast.bench import run_round_benchmark
from solaris_feast.console import parse_script_args
from solaris_feast.data.datasets import SYNTHETIC_PRESETS


def slope(xs: list[float], ys: list[float]) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,demo,default,large")
    parser.add_argument("--candidates-per-user", type=int, default=50)
    parser.add_argument("--budget", type=float, default=0.1)
    parser.add_argument("--json", type=Path, required=True)
    args = parse_script_args(parser)
    rows = []
    for size in args.sizes.split(","):
        started = time.perf_counter()
        result = run_round_benchmark(
            size=size, candidates_per_user=args.candidates_per_user, budget=args.budget
        )
        wall = time.perf_counter() - started
        users = SYNTHETIC_PRESETS[size].num_users
        rows.append(
            {
                "size": size,
                "users": users,
                "candidate_pairs": result["candidate_pairs"],
                "planned_pairs": result["planned_pairs"],
                "round_seconds": round(sum(result["seconds"].values()), 2),
                "wall_seconds_with_setup": round(wall, 2),
                "seconds": result["seconds"],
            }
        )
        print(
            f"{size:>8}: {users:>6} users, {result['planned_pairs']:>7} planned pairs, "
            f"round {rows[-1]['round_seconds']:.1f} s",
            flush=True,
        )
    report = {
        "rows": rows,
        "exponent_vs_users": round(
            slope([r["users"] for r in rows], [r["round_seconds"] for r in rows]), 3
        ),
        "exponent_vs_planned_pairs": round(
            slope([r["planned_pairs"] for r in rows], [r["round_seconds"] for r in rows]), 3
        ),
        "candidates_per_user": args.candidates_per_user,
        "budget": args.budget,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print(
        f"exponent vs users {report['exponent_vs_users']}, "
        f"vs planned pairs {report['exponent_vs_planned_pairs']}; JSON: {args.json}"
    )


if __name__ == "__main__":
    main()
