"""Where the wall time of one precompute run goes: FM work against planning, writes, aggregation
and fill (issue 4 target: non-FM overhead <= 25 % of the run).

One run as the hourly DAG does it, on the synthetic ``demo`` log, through the real write path
(SQLite or Redis online store and the parquet offline log in a temporary Feast repo): candidates ->
verifier scores -> plan (10 % of candidate pairs) -> FM + compressor + pair writes -> user
aggregate + writes -> similarity fill + writes. The round itself is
:func:`solaris_feast.bench.run_round_benchmark` (``solaris bench precompute`` runs it for the
reference FM and a 2-layer FM, with and without history reuse).

    python benchmarks/bench_precompute.py --json benchmarks/results/precompute.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

from solaris_feast.bench import run_round_benchmark
from solaris_feast.console import parse_script_args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="demo")
    parser.add_argument("--candidates", type=int, default=200)
    parser.add_argument("--budget", type=float, default=0.1)
    parser.add_argument(
        "--batch-size", type=int, default=None, help="pairs per batch (default: the DAG's)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", default=None, help="load trained models from this folder")
    parser.add_argument(
        "--fm-layers", type=int, default=0, help="self-attention layers of a seeded FM"
    )
    parser.add_argument("--fm-dim", type=int, default=64, help="embed_dim of a seeded FM")
    parser.add_argument("--online", choices=("sqlite", "redis"), default="sqlite")
    parser.add_argument(
        "--per-pair", action="store_true", help="encode the history per pair (no reuse)"
    )
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/precompute.json"))
    args = parse_script_args(parser)
    report = run_round_benchmark(
        size=args.size,
        candidates_per_user=args.candidates,
        budget=args.budget,
        batch_size=args.batch_size,
        threads=args.threads,
        models=Path(args.models) if args.models else None,
        fm_layers=args.fm_layers,
        fm_dim=args.fm_dim,
        online=args.online,
        reuse_history=not args.per_pair,
    )
    report |= {"cpu_count": os.cpu_count(), "machine": platform.machine()}
    print(json.dumps(report, indent=2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
