"""One precompute round of the demo, side by side on two or more code trees.

Each tree's round runs in fresh Python processes (as a round's tasks do), one warm-up round and
then ``--rounds`` measured rounds a process, ``--processes`` processes a tree, the trees
interleaved process by process so that they see the same load on a shared machine. A round is
``solaris_feast.bench.run_round_benchmark`` (the round ``solaris bench precompute`` times: plan,
FM, writes, user aggregate, similarity fill) with one torch thread; the medians over every
measured round of a tree are reported, and every round is kept in the JSON.

    python benchmarks/round_ab.py --tree before=/path/to/old/checkout --tree after=. \\
        --json benchmarks/results/precompute_round_ab.json

Every tree must have ``run_round_benchmark`` with the ``online``, ``threads`` arguments and the
``non_fm_share``, ``round_seconds``, ``seconds`` and per-pair keys of its record. Redis at
``$REDIS_URL``; each round cleans up its own Feast project's keys.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from solaris_feast.console import parse_script_args

ROUND_SCRIPT = r"""
import json, sys
from solaris_feast.bench import run_round_benchmark
online, rounds = sys.argv[1], int(sys.argv[2])
run_round_benchmark(online=online, threads=1)  # warm-up: the first round of a process
for _ in range(rounds):
    r = run_round_benchmark(online=online, threads=1)
    print("RESULT " + json.dumps({key: r[key] for key in (
        "non_fm_share", "round_seconds", "seconds", "non_fm_microseconds_per_planned_pair",
        "fm_microseconds_per_pair", "planned_pairs", "similar_rows")}))
"""

MEDIAN_KEYS = (
    "non_fm_share",
    "round_seconds",
    "non_fm_microseconds_per_planned_pair",
    "fm_microseconds_per_pair",
)


def run_process(tree: Path, online: str, rounds: int) -> list[dict[str, Any]]:
    """The measured rounds of one fresh process on ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", ROUND_SCRIPT, online, str(rounds)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the round on {tree} failed:\n{done.stderr[-3000:]}")
    return [
        json.loads(line[len("RESULT ") :])
        for line in done.stdout.splitlines()
        if line.startswith("RESULT ")
    ]


def medians(records: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        key: round(statistics.median(r[key] for r in records), 4) for key in MEDIAN_KEYS
    }
    out["seconds"] = {
        key: round(statistics.median(r["seconds"][key] for r in records), 3)
        for key in records[0]["seconds"]
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH, repeatable")
    parser.add_argument("--processes", type=int, default=3, help="fresh processes per tree")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per process")
    parser.add_argument("--online", default="redis", choices=("redis", "sqlite"))
    parser.add_argument("--json", type=Path, help="where to write the records and medians")
    args = parse_script_args(parser)
    trees = {}
    for spec in args.tree:
        name, _, path = spec.partition("=")
        if not name or not path or not Path(path).is_dir():
            parser.error(f"--tree takes NAME=PATH to a checkout, got {spec!r}")
        trees[name] = Path(path).resolve()

    records: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    total, step = args.processes * len(trees), 0
    for _ in range(args.processes):
        for name, tree in trees.items():
            step += 1
            print(f"[{step}/{total}] {name}: {args.rounds} rounds in a fresh process", flush=True)
            records[name].extend(run_process(tree, args.online, args.rounds))

    summary = {name: medians(rs) for name, rs in records.items()}
    print(f"\nmedians over {args.processes} x {args.rounds} rounds per tree:")
    print("| tree | non-FM share | non-FM us a planned pair | FM us a pair | round s |")
    print("| --- | --- | --- | --- | --- |")
    for name, m in summary.items():
        print(
            f"| {name} | {100 * m['non_fm_share']:.1f}% | "
            f"{m['non_fm_microseconds_per_planned_pair']:.1f} | "
            f"{m['fm_microseconds_per_pair']:.1f} | {m['round_seconds']:.3f} |"
        )
    if args.json:
        result = {
            "meta": {
                "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
                "load_average_end": os.getloadavg()[0],
                "command": " ".join(sys.argv),
                "trees": {name: str(tree) for name, tree in trees.items()},
                "online": args.online,
            },
            "rounds": records,
            "medians": summary,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
        print(f"JSON: {args.json}")


if __name__ == "__main__":
    main()
