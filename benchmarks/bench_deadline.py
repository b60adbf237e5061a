"""How long a fetch takes to answer against its deadline, by request size (issue 11 target: an
answer within 1.5x the deadline for any request size).

A healthy Redis holds fresh exact embeddings for one user and ``--max-items`` items; the retriever
asks for the first N of them with a ``--deadline-ms`` deadline, ``--repeats`` times per N. Small
requests are served; large ones cannot be read in time and answer ZERO with ``error=True``. The
figure is the worst answer time over all N as a multiple of the deadline. Keys live under a
Feast project of this run's own and are deleted afterwards.

    python benchmarks/bench_deadline.py --json benchmarks/results/deadline.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd

from solaris_feast.console import parse_script_args
from solaris_feast.serving.retriever import SolarisRetriever
from solaris_feast.store.config import open_store
from solaris_feast.store.definitions import solaris_definitions
from solaris_feast.store.write import EmbeddingWriter

VERSION = "bench-deadline"
SIZES = (100, 1_000, 2_000, 3_000, 4_000, 5_000, 6_000, 8_000, 10_000, 20_000)


def run(redis_url: str, deadline_ms: float, repeats: int, max_items: int) -> dict[str, object]:
    import logging

    import redis

    logging.getLogger("solaris_feast").setLevel(logging.ERROR)  # one warning per ZERO answer
    project = f"solaris_bench_{uuid.uuid4().hex[:8]}"
    repo = Path(tempfile.mkdtemp(prefix="solaris-bench-deadline-"))
    store = open_store(project, repo, online="redis", redis_url=redis_url)
    store.apply(solaris_definitions().all())
    items = np.arange(max_items, dtype=np.int64)
    vectors = np.random.default_rng(0).normal(size=(max_items, 32)).astype(np.float32)
    rows = pd.DataFrame(
        {
            "user_id": np.ones(max_items, dtype=np.int64),
            "item_id": items,
            "embedding": list(vectors),
            "model_version": VERSION,
            "computed_at": pd.Timestamp.now(tz="UTC"),
        }
    )
    records = []
    try:
        EmbeddingWriter(store, "solaris_pair").write(rows)
        retriever = SolarisRetriever(store, VERSION, deadline_ms=deadline_ms, record_misses=False)
        for n in (s for s in SIZES if s <= max_items):
            walls, errors = [], 0
            for _ in range(repeats):
                started = time.perf_counter()
                result = retriever.fetch(1, items[:n])
                walls.append((time.perf_counter() - started) * 1000.0)
                errors += int(result.error)
            records.append(
                {
                    "candidates": n,
                    "p50_ms": round(float(np.median(walls)), 2),
                    "max_ms": round(max(walls), 2),
                    "answered_zero_for_deadline": errors,
                    "repeats": repeats,
                }
            )
            print(
                f"N={n:>6}: p50 {records[-1]['p50_ms']:7.2f} ms, max {records[-1]['max_ms']:7.2f} "
                f"ms, {errors}/{repeats} past the deadline"
            )
        retriever.close()
    finally:
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=f"*{project}*", count=1000))
        if keys:
            client.delete(*keys)
    worst = max(float(r["max_ms"]) for r in records)  # type: ignore[arg-type]
    return {
        "deadline_ms": deadline_ms,
        "worst_answer_ms": worst,
        "worst_answer_over_deadline": round(worst / deadline_ms, 3),
        "target_over_deadline": 1.5,
        "by_size": records,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--deadline-ms", type=float, default=50.0)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--max-items", type=int, default=20_000)
    parser.add_argument("--json", type=Path, default=None)
    args = parse_script_args(parser)
    results = run(args.redis_url, args.deadline_ms, args.repeats, args.max_items)
    print(
        f"worst answer {results['worst_answer_ms']:.1f} ms = "
        f"{results['worst_answer_over_deadline']}x the {args.deadline_ms} ms deadline (target 1.5x)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"JSON: {args.json}")


if __name__ == "__main__":
    main()
