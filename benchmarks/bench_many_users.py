"""The resolved view for requests of several users, through plain Feast calls (SDK, Redis).

A VM usually asks for one user's candidates; a batch scorer asks for many users at once. The
solaris Feast online store (``SolarisRedisOnlineStore``) reads every user of a request in one
round trip (``SolarisRetriever.fetch_many``); before it did, it made one round trip per user and
lost to Feast's one pipeline when users brought few candidates each. Each shape is timed on
Feast's own store (the on-demand view: the baseline a user has without solaris-feast installed)
and on the solaris store, interleaved, over the same registry and rows; medians of ``--repeats``
calls per shape and contender, in ``--rounds`` interleaved rounds. Keys live under a Feast project
of this run's own and are deleted afterwards.

    python benchmarks/bench_many_users.py --json benchmarks/results/many_users.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from solaris_feast.bench import BENCH_USER, _meta, _populate, bench_store, solaris_store_beside
from solaris_feast.console import parse_script_args
from solaris_feast.store.definitions import MODEL_VERSION_REQUEST_FIELD

VERSION = "bench-v1"
SHAPES = ((1, 100), (10, 10), (100, 1), (100, 10), (300, 1), (1000, 1))
FEATURES = ["solaris_resolved:resolved_embedding", "solaris_resolved:resolved_tier"]


def run(redis_url: str | None, repeats: int, rounds: int) -> dict[str, Any]:
    results: dict[str, Any] = {"shapes": {}}
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(bench_store(redis_url, 32, "float32"))
        _populate(store, 100, 32, VERSION)  # one user's three tiers; the others read as misses
        solaris = solaris_store_beside(store, redis_url)
        for users, items in SHAPES:
            rows = [
                {"user_id": BENCH_USER + u, "item_id": i, MODEL_VERSION_REQUEST_FIELD: VERSION}
                for u in range(users)
                for i in range(items)
            ]
            contenders = {"feast_store": store, "solaris_store": solaris}
            samples: dict[str, list[float]] = {name: [] for name in contenders}
            for on in contenders.values():  # warm-up: registry caches, connections
                on.get_online_features(features=FEATURES, entity_rows=rows, full_feature_names=True)
            for _ in range(rounds):
                for name, on in contenders.items():
                    for _ in range(max(repeats // rounds, 1)):
                        started = time.perf_counter()
                        on.get_online_features(
                            features=FEATURES, entity_rows=rows, full_feature_names=True
                        )
                        samples[name].append((time.perf_counter() - started) * 1000.0)
            feast_p50 = statistics.median(samples["feast_store"])
            solaris_p50 = statistics.median(samples["solaris_store"])
            results["shapes"][f"{users}x{items}"] = {
                "users": users,
                "candidates_per_user": items,
                "feast_store_p50_ms": round(feast_p50, 3),
                "solaris_store_p50_ms": round(solaris_p50, 3),
                "solaris_vs_feast_p50": round(solaris_p50 / feast_p50, 3),
            }
    results["meta"] = _meta(repeats=repeats, rounds=rounds, host=platform.node())
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    args = parse_script_args(parser)
    results = run(os.environ.get("REDIS_URL"), args.repeats, args.rounds)
    print("| users x candidates | Feast's store p50 ms | solaris store p50 ms | ratio |")
    print("| --- | --- | --- | --- |")
    for shape, row in results["shapes"].items():
        print(
            f"| {shape} | {row['feast_store_p50_ms']:.2f} | {row['solaris_store_p50_ms']:.2f} "
            f"| {row['solaris_vs_feast_p50']:.2f}x |"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
