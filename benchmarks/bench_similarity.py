"""Similarity-fill throughput at 100k users (issue 4 target: >= 10k pairs/s on 2 cores).

Synthetic, seeded: users drawn around cluster centres in a 32-d space, each user holding fresh
exact embeddings for ``--exact-per-user`` items drawn from their cluster's item pool (so
neighbours share items, as users with similar taste do). Target pairs are the uncovered items of
``--target-users`` users. Reports the index build time and the fill throughput (search + join),
each for the ``auto`` index choice (HNSW above 20k users) and, optionally, the exact flat index.

    python benchmarks/bench_similarity.py --json benchmarks/results/similarity.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd

from solaris_feast.console import parse_script_args
from solaris_feast.precompute.aggregate import PairEmbeddings
from solaris_feast.precompute.similarity import SimilarityConfig, build_user_index, similarity_fill


def make_data(
    users: int, items: int, clusters: int, exact_per_user: int, dim: int, seed: int
) -> tuple[np.ndarray, np.ndarray, PairEmbeddings, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dim)).astype(np.float32)
    cluster = rng.integers(0, clusters, users)
    user_vectors = centres[cluster] + 0.3 * rng.normal(size=(users, dim)).astype(np.float32)
    pool = items // clusters
    # Each cluster owns a pool of items; popularity inside the pool is skewed (Zipf-like).
    local = np.minimum(rng.zipf(1.5, size=(users, exact_per_user)) - 1, pool - 1)
    item = (cluster[:, None] * pool + local).ravel()
    user = np.repeat(np.arange(users, dtype=np.int64), exact_per_user)
    now_s = pd.Timestamp("2026-11-30T00:00:00Z").value / 1e9
    exact = PairEmbeddings(
        user_ids=user,
        item_ids=item.astype(np.int64),
        vectors=rng.normal(size=(len(user), 32)).astype(np.float32),
        computed_at_s=now_s - rng.uniform(0, 3600, len(user)),
        model_versions=np.full(len(user), "bench", dtype=object),
    )
    return np.arange(users, dtype=np.int64), user_vectors, exact, cluster


def targets_for(
    target_users: int,
    pairs_per_user: int,
    users: int,
    items: int,
    clusters: int,
    cluster: np.ndarray,
    seed: int,
) -> pd.DataFrame:
    rng = np.random.default_rng(seed + 1)
    chosen = rng.choice(users, size=target_users, replace=False)
    pool = items // clusters
    local = np.minimum(rng.zipf(1.5, size=(target_users, pairs_per_user)) - 1, pool - 1)
    item = cluster[chosen][:, None] * pool + local
    return pd.DataFrame(
        {"user_id": np.repeat(chosen, pairs_per_user), "item_id": item.ravel()}
    ).drop_duplicates()


def run(args: argparse.Namespace) -> dict[str, object]:
    now = pd.Timestamp("2026-11-30T00:00:00Z")
    user_ids, user_vectors, exact, cluster = make_data(
        args.users, args.items, args.clusters, args.exact_per_user, args.dim, args.seed
    )
    targets = targets_for(
        args.target_users,
        args.pairs_per_user,
        args.users,
        args.items,
        args.clusters,
        cluster,
        args.seed,
    )
    # Only pairs the exact tier does not serve need a fill: drop the users' own held items.
    held = pd.DataFrame({"user_id": exact.user_ids, "item_id": exact.item_ids, "_held": True})
    targets = targets.merge(held.drop_duplicates(), on=["user_id", "item_id"], how="left")
    targets = targets.loc[targets["_held"].isna(), ["user_id", "item_id"]]
    results: list[dict[str, object]] = []
    reference: pd.DataFrame | None = None
    fills: dict[str, pd.DataFrame] = {}
    for kind in args.index_kinds.split(","):
        cfg = SimilarityConfig(
            index_kind=kind,
            neighbours=args.k,
            search_neighbours=args.search_neighbours,
            threads=args.threads,
            ivf_lists=args.ivf_lists,
            ivf_probe=args.ivf_probe,
        )
        index = build_user_index(user_ids, user_vectors, cfg)
        started = time.perf_counter()
        rows = similarity_fill(index, targets, exact, now, "bench", 6 * 3600, cfg)
        fill_s = time.perf_counter() - started
        fills[kind] = rows
        if index.kind == "flat":
            reference = rows
        results.append(
            {
                "index_kind": index.kind,
                "build_seconds": round(index.build_seconds, 3),
                "fill_seconds": round(fill_s, 3),
                "target_pairs": len(targets),
                "distinct_target_users": int(targets["user_id"].nunique()),
                "filled_pairs": len(rows),
                "pairs_per_second": round(len(targets) / fill_s, 1),
                "pairs_per_second_with_build": round(
                    len(targets) / (fill_s + index.build_seconds), 1
                ),
                "mean_neighbour_count": round(float(rows["neighbour_count"].mean()), 2)
                if len(rows)
                else 0.0,
            }
        )
        print(json.dumps(results[-1]))
    if reference is not None:
        # Share of pairs whose filled vector matches the exact (flat) index's within 1e-4: the
        # recall of the approximate index where it matters.
        for result, kind in zip(results, args.index_kinds.split(","), strict=True):
            rows = fills[kind]
            merged = rows.merge(reference, on=["user_id", "item_id"], suffixes=("", "_ref"))
            same = [
                bool(np.allclose(a, b, atol=1e-4))
                for a, b in zip(merged["embedding"], merged["embedding_ref"], strict=True)
            ]
            result["agreement_with_flat"] = round(sum(same) / max(len(reference), 1), 4)
    return {
        "benchmark": "similarity_fill",
        "users": args.users,
        "items": args.items,
        "user_dim": args.dim,
        "embedding_dim": 32,
        "exact_pairs": len(exact),
        "k": args.k,
        "search_neighbours": args.search_neighbours,
        "threads": args.threads,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "results": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--items", type=int, default=50_000)
    parser.add_argument("--clusters", type=int, default=200)
    parser.add_argument("--dim", type=int, default=64, help="user vector dimension")
    parser.add_argument("--exact-per-user", type=int, default=20)
    parser.add_argument("--target-users", type=int, default=10_000)
    parser.add_argument("--pairs-per-user", type=int, default=20)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--search-neighbours", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ivf-lists", type=int, default=None)
    parser.add_argument("--ivf-probe", type=int, default=16)
    parser.add_argument("--index-kinds", default="auto,hnsw,flat")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/similarity.json"))
    args = parse_script_args(parser)
    report = run(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
