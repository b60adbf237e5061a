"""Soak: N concurrent serving clients for a bounded time while a precompute writer rewrites rows.

Each client is its own process (forked after the heavy imports, so no GIL is shared) with its own
:class:`~solaris_feast.serving.retriever.SolarisRetriever`; it fetches 1 user x ``--candidates``
items at
``--rate`` fetches/s (open loop; ``--rate 0`` = as fast as it can) for ``--seconds``.
Meanwhile a writer process rewrites pair embeddings of random users in batches through
:class:`~solaris_feast.store.write.EmbeddingWriter`, as a precompute run would.

Reported: fetch throughput, p50/p99/max latency, errors (store failures, deadline misses and
exceptions; must all be 0), tier shares, writer rows/s, each client's RSS growth from the end of
warm-up to the end, and Redis ``used_memory`` growth. The run uses its own Feast project
(``solaris_hard_soak_<hex>``) on ``$REDIS_URL`` and deletes its keys afterwards.

    python benchmarks/soak.py --clients 4 --seconds 20 --json benchmarks/results/soak.json

What a round's writes cost serving: ``--writer-atomic-rows 0,256,1024 --repeats 2`` runs one
soak per setting, the settings interleaved, on the same stored rows: ``0`` is no writer (the
baseline), any other number the writer's rows per MULTI/EXEC transaction
(``EmbeddingWriter(atomic_rows=...)``; Redis answers no reader while one runs). Each soak also
reports Redis's own time per transaction (``INFO commandstats``, ``cmdstat_exec``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from solaris_feast.console import parse_script_args
from solaris_feast.store.layout import DEFAULT_ATOMIC_ROWS, DEFAULT_TRANSACTIONS_IN_FLIGHT

DIM = 32
VERSION = "cmp-soak-v1"
WARMUP_SECONDS = 2.0
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    """Resident set size of this process now, in MiB (from /proc, Linux)."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE_BYTES / 2**20


def open_soak_store(project: str, repo: Path, redis_url: str) -> Any:
    from solaris_feast.store.config import open_store

    return open_store(project, repo, online="redis", redis_url=redis_url)


def populate(store: Any, users: int, candidates: int, seed: int) -> None:
    """Pair rows for 60% of each user's candidates, similar rows for 20%, every user's aggregate."""
    from solaris_feast.store.write import EmbeddingWriter

    rng = np.random.default_rng(seed)
    now = pd.Timestamp.now(tz="UTC").floor("s")
    exact = int(candidates * 0.6)
    similar = int(candidates * 0.2)
    pairs = EmbeddingWriter(store, "solaris_pair", offline=False)
    similars = EmbeddingWriter(store, "solaris_similar", offline=False)
    for user in range(users):
        pairs.write(pair_batch(user, np.arange(exact), rng, now))
        batch = pair_batch(user, np.arange(exact, exact + similar), rng, now)
        batch["neighbour_count"] = np.full(similar, 5, dtype=np.int64)
        batch["mean_distance"] = np.full(similar, 0.3)
        similars.write(batch)
    EmbeddingWriter(store, "solaris_user", offline=False).write(
        pd.DataFrame(
            {
                "user_id": np.arange(users, dtype=np.int64),
                "embedding": list(rng.standard_normal((users, DIM)).astype(np.float32)),
                "pair_count": np.full(users, exact, dtype=np.int64),
                "model_version": VERSION,
                "computed_at": now,
            }
        )
    )
    pairs.close()
    similars.close()


def pair_batch(
    user: int, items: np.ndarray, rng: np.random.Generator, at: pd.Timestamp
) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "user_id": np.full(len(items), user, dtype=np.int64),
            "item_id": items.astype(np.int64),
            "embedding": list(rng.standard_normal((len(items), DIM)).astype(np.float32)),
            "model_version": VERSION,
            "computed_at": at,
        }
    )


def serve_client(index: int, args: dict[str, Any], start_at: float, results: Any) -> None:
    """One serving client: fetch until the shared end time; report latencies and RSS."""
    from solaris_feast.serving.retriever import SolarisRetriever

    store = open_soak_store(args["project"], Path(args["repo"]), args["redis_url"])
    retriever = SolarisRetriever(store, VERSION, deadline_ms=args["deadline_ms"])
    rng = np.random.default_rng(100 + index)
    items = np.arange(args["candidates"], dtype=np.int64)
    latencies: list[float] = []
    exceptions = 0
    tiers = np.zeros(4, dtype=np.int64)
    rss_after_warmup = None
    end = start_at + args["seconds"]
    while time.monotonic() < start_at:
        time.sleep(0.005)
    while (now := time.monotonic()) < end:
        if rss_after_warmup is None and now >= start_at + WARMUP_SECONDS:
            rss_after_warmup = rss_mb()
        if args["interval_s"]:
            # Open-loop pacing: a client sends at its rate whether or not the last one was slow,
            # so a slow read shows up in the latencies instead of lowering the load.
            next_at = start_at + len(latencies) * args["interval_s"]
            if next_at > now:
                time.sleep(min(next_at - now, end - now))
                continue
        user = int(rng.integers(0, args["users"]))
        began = time.perf_counter()
        try:
            result = retriever.fetch(user, items)
        except Exception:
            exceptions += 1
            continue
        latencies.append((time.perf_counter() - began) * 1000.0)
        tiers += np.bincount(result.tiers, minlength=4)
    stats = retriever.stats
    retriever.close()
    results.put(
        {
            "client": index,
            "latencies_ms": latencies,
            "exceptions": exceptions,
            "store_errors": stats.errors - stats.deadline_exceeded,
            "deadline_exceeded": stats.deadline_exceeded,
            "miss_queue_errors": stats.miss_queue_errors,
            "tiers": tiers.tolist(),
            "rss_after_warmup_mb": rss_after_warmup or rss_mb(),
            "rss_end_mb": rss_mb(),
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    )


def precompute_writer(args: dict[str, Any], start_at: float, results: Any) -> None:
    """Rewrite the pair rows of random users, batch after batch, until the end time."""
    from solaris_feast.store.write import EmbeddingWriter

    store = open_soak_store(args["project"], Path(args["repo"]), args["redis_url"])
    # A script chunk never crosses a transaction, so the chunk size needs no change here.
    writer = EmbeddingWriter(
        store,
        "solaris_pair",
        offline=False,
        atomic_rows=args["atomic_rows"],
        in_flight=args["in_flight"],
    )
    rng = np.random.default_rng(7)
    exact = int(args["candidates"] * 0.6)
    rows = 0
    batches = 0
    errors = 0
    end = start_at + args["seconds"]
    while time.monotonic() < start_at:
        time.sleep(0.005)
    while time.monotonic() < end:
        users = rng.choice(args["users"], size=max(1, args["write_batch"] // exact), replace=False)
        at = pd.Timestamp.now(tz="UTC")
        frame = pd.concat([pair_batch(int(u), np.arange(exact), rng, at) for u in users])
        try:
            rows += writer.write(frame.reset_index(drop=True)).online_applied
            batches += 1
        except Exception:
            errors += 1
        time.sleep(args["write_pause_s"])
    writer.close()
    results.put({"writer_rows": rows, "writer_batches": batches, "writer_errors": errors})


def percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else float("nan")


def exec_stats(client: Any) -> tuple[int, int]:
    """Redis's count of EXECs and their total microseconds so far (``INFO commandstats``)."""
    stat = client.info("commandstats").get("cmdstat_exec", {})
    return int(stat.get("calls", 0)), int(stat.get("usec", 0))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One soak per ``--writer-atomic-rows`` setting, ``--repeats`` times interleaved, on one
    populated project; the flat record of :func:`soak` when there is one soak."""
    import redis

    from solaris_feast.store.definitions import solaris_definitions

    redis_url = args.redis_url or os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    project = f"solaris_hard_soak_{uuid.uuid4().hex[:8]}"
    repo = Path(tempfile.mkdtemp(prefix="solaris-soak-"))
    client = redis.Redis.from_url(redis_url)
    soaks: list[dict[str, Any]] = []
    try:
        store = open_soak_store(project, repo, redis_url)
        store.apply(solaris_definitions().all())
        populate(store, args.users, args.candidates, seed=1)
        for repeat in range(args.repeats):
            for atomic_rows in args.writer_atomic_rows:
                print(
                    f"soak {len(soaks) + 1}/{args.repeats * len(args.writer_atomic_rows)}: "
                    + (
                        f"writer at {atomic_rows} rows a transaction"
                        if atomic_rows
                        else "no writer"
                    ),
                    flush=True,
                )
                soaks.append(
                    soak(args, client, project, repo, redis_url, atomic_rows) | {"repeat": repeat}
                )
    finally:
        keys = list(client.scan_iter(match=f"*{project}*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])
        client.close()
        shutil.rmtree(repo, ignore_errors=True)
    if len(soaks) == 1:
        return soaks[0]
    return {"soaks": soaks, "by_setting": by_setting(soaks)}


def by_setting(soaks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per writer setting, the median over its repeats of the figures the table shows."""
    out = []
    for atomic_rows in dict.fromkeys(s["writer_atomic_rows"] for s in soaks):
        runs = [s for s in soaks if s["writer_atomic_rows"] == atomic_rows]
        row: dict[str, Any] = {"writer_atomic_rows": atomic_rows, "repeats": len(runs)}
        for key in ("p50_ms", "p99_ms", "max_ms", "writer_rows_per_s", "exec_ms_mean"):
            values = [r[key] for r in runs if r[key] is not None]
            row[key] = float(np.median(values)) if values else None
        row["errors"] = sum(r["errors"] for r in runs)
        out.append(row)
    return out


def soak(
    args: argparse.Namespace,
    client: Any,
    project: str,
    repo: Path,
    redis_url: str,
    atomic_rows: int,
) -> dict[str, Any]:
    """One soak of ``args.seconds``: the clients, and a writer unless ``atomic_rows`` is 0."""
    memory_before = int(client.info("memory")["used_memory"])
    execs_before = exec_stats(client)
    shared = {
        "project": project,
        "repo": str(repo),
        "redis_url": redis_url,
        "users": args.users,
        "candidates": args.candidates,
        "seconds": args.seconds,
        "deadline_ms": args.deadline_ms,
        "write_batch": args.write_batch,
        "write_pause_s": args.write_pause_s,
        "interval_s": 1.0 / args.rate if args.rate > 0 else 0.0,
        "atomic_rows": atomic_rows,
        "in_flight": args.writer_in_flight,
    }
    # Forked after the imports above: every process starts warm, none shares a GIL.
    context = mp.get_context("fork")
    results = context.Queue()
    start_at = time.monotonic() + 1.0
    processes = [
        context.Process(target=serve_client, args=(i, shared, start_at, results))
        for i in range(args.clients)
    ]
    if atomic_rows:
        processes.append(
            context.Process(target=precompute_writer, args=(shared, start_at, results))
        )
    for process in processes:
        process.start()
    reports = [results.get(timeout=args.seconds + 120) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    memory_after = int(client.info("memory")["used_memory"])
    execs_after = exec_stats(client)
    load = os.getloadavg()

    clients = [r for r in reports if "client" in r]
    writer = next(
        (r for r in reports if "writer_rows" in r),
        {"writer_rows": 0, "writer_batches": 0, "writer_errors": 0},
    )
    # The soak's own EXECs: nothing else on this Redis runs transactions during a benchmark
    # (another session's writes would show here; the count says how many there were).
    exec_calls = execs_after[0] - execs_before[0]
    exec_usec = execs_after[1] - execs_before[1]
    latencies = np.concatenate([np.asarray(c["latencies_ms"]) for c in clients])
    tiers = np.sum([c["tiers"] for c in clients], axis=0)
    served = max(int(tiers.sum()), 1)
    errors = sum(c["exceptions"] + c["store_errors"] + c["deadline_exceeded"] for c in clients)
    growth = [c["rss_end_mb"] - c["rss_after_warmup_mb"] for c in clients]
    return {
        "clients": args.clients,
        "seconds": args.seconds,
        "candidates_per_fetch": args.candidates,
        "users": args.users,
        "deadline_ms": args.deadline_ms,
        "target_fetches_per_s_per_client": args.rate if args.rate > 0 else None,
        "fetches": int(latencies.size),
        "fetches_per_s": latencies.size / args.seconds,
        "candidates_per_s": latencies.size * args.candidates / args.seconds,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "max_ms": float(latencies.max()) if latencies.size else float("nan"),
        "errors": errors,
        "exceptions": sum(c["exceptions"] for c in clients),
        "store_errors": sum(c["store_errors"] for c in clients),
        "deadline_exceeded": sum(c["deadline_exceeded"] for c in clients),
        "miss_queue_errors": sum(c["miss_queue_errors"] for c in clients),
        "tier_share": {
            name: float(tiers[value] / served)
            for name, value in (("zero", 0), ("user_agg", 1), ("similar", 2), ("exact", 3))
        },
        "writer_atomic_rows": atomic_rows,
        "writer_in_flight": shared["in_flight"] if atomic_rows else None,
        "exec_calls": exec_calls,
        "exec_ms_mean": exec_usec / exec_calls / 1000.0 if exec_calls else None,
        "writer_rows": writer["writer_rows"],
        "writer_rows_per_s": writer["writer_rows"] / args.seconds,
        "writer_batches": writer["writer_batches"],
        "writer_errors": writer["writer_errors"],
        "client_rss_growth_mb_max": max(growth),
        "client_rss_growth_mb_mean": float(np.mean(growth)),
        "client_rss_end_mb_max": max(c["rss_end_mb"] for c in clients),
        "redis_used_memory_growth_mb": (memory_after - memory_before) / 2**20,
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_1m_at_end": load[0],
            "python": platform.python_version(),
            "redis_url_host": redis_url.rsplit("@", 1)[-1].split("/")[2],
        },
    }


def settings_table(result: dict[str, Any]) -> str:
    """One row per writer setting (medians over the repeats), the no-writer baseline first."""
    lines = [
        "| writer | p50 / p99 / max ms (median of repeats) | p99 / no writer | Redis per EXEC "
        "| writer rows/s | errors |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    rows = result["by_setting"]
    base = next((r["p99_ms"] for r in rows if r["writer_atomic_rows"] == 0), None)
    for r in rows:
        name = (
            "none (baseline)"
            if r["writer_atomic_rows"] == 0
            else f"{r['writer_atomic_rows']} rows a transaction"
        )
        ratio = f"{r['p99_ms'] / base:.2f}x" if base else "-"
        exec_ms = "-" if r["exec_ms_mean"] is None else f"{r['exec_ms_mean']:.2f} ms"
        lines.append(
            f"| {name} | {r['p50_ms']:.2f} / {r['p99_ms']:.2f} / {r['max_ms']:.1f} | {ratio} "
            f"| {exec_ms} | {r['writer_rows_per_s']:.0f} | {r['errors']} |"
        )
    return "\n".join(lines)


def table(result: dict[str, Any]) -> str:
    if "by_setting" in result:
        return settings_table(result)
    machine = result["machine"]
    rows = [
        ("serving clients (processes)", f"{result['clients']}"),
        (
            "offered load per client",
            "unpaced (saturation)"
            if result["target_fetches_per_s_per_client"] is None
            else f"{result['target_fetches_per_s_per_client']:.0f} fetches/s",
        ),
        ("duration", f"{result['seconds']:.0f} s"),
        ("candidates per fetch", f"{result['candidates_per_fetch']}"),
        ("fetches", f"{result['fetches']}"),
        (
            "throughput",
            f"{result['fetches_per_s']:.0f} fetches/s "
            f"({result['candidates_per_s']:.0f} candidates/s)",
        ),
        (
            "p50 / p99 / max",
            f"{result['p50_ms']:.2f} / {result['p99_ms']:.2f} / {result['max_ms']:.1f} ms",
        ),
        (
            "errors (store, deadline, exceptions)",
            f"{result['errors']} ({result['store_errors']}, "
            f"{result['deadline_exceeded']}, {result['exceptions']})",
        ),
        (
            "writer during the soak",
            f"{result['writer_rows_per_s']:.0f} rows/s, {result['writer_errors']} errors",
        ),
        (
            "client RSS growth after warm-up",
            f"max {result['client_rss_growth_mb_max']:.2f} MiB, "
            f"mean {result['client_rss_growth_mb_mean']:.2f} MiB",
        ),
        ("Redis used_memory growth", f"{result['redis_used_memory_growth_mb']:.2f} MiB"),
        (
            "exact / similar / user / zero",
            " / ".join(
                f"{result['tier_share'][k]:.0%}" for k in ("exact", "similar", "user_agg", "zero")
            ),
        ),
        ("machine", f"{machine['cpus']} CPUs, 1-min load {machine['load_average_1m_at_end']:.1f}"),
    ]
    lines = ["| soak | value |", "| --- | --- |"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--candidates", type=int, default=100)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--deadline-ms", type=float, default=50.0)
    parser.add_argument(
        "--rate",
        type=float,
        default=50.0,
        help="fetches/s each client sends (paced); 0 = as fast as it can (saturation)",
    )
    # 4096 rows per EmbeddingWriter.write call: four of the precompute's batches
    # (precompute.batch_size, 1,024) at once, a heavier writer than a round's (the published soak
    # ran with it); kept literal so the soak needs no precompute import.
    parser.add_argument("--write-batch", type=int, default=4096, help="rows per writer batch")
    parser.add_argument("--write-pause-s", type=float, default=0.05, help="pause between batches")
    parser.add_argument(
        "--writer-atomic-rows",
        type=lambda text: [int(v) for v in text.split(",")],
        default=[DEFAULT_ATOMIC_ROWS],
        help="comma list: the writer's rows per transaction, one soak each; 0 = no writer",
    )
    parser.add_argument(
        "--writer-in-flight",
        type=int,
        default=DEFAULT_TRANSACTIONS_IN_FLIGHT,
        help="the writer's transactions sent before the first one's answers are read",
    )
    parser.add_argument("--repeats", type=int, default=1, help="soaks per setting, interleaved")
    parser.add_argument("--redis-url", default=None, help="default: $REDIS_URL")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/soak.json"))
    args = parse_script_args(parser)
    if args.clients <= 0 or args.seconds <= WARMUP_SECONDS:
        parser.error(f"need --clients > 0 and --seconds > {WARMUP_SECONDS}")
    if args.repeats <= 0 or any(rows < 0 for rows in args.writer_atomic_rows):
        parser.error("need --repeats > 0 and --writer-atomic-rows >= 0")
    if args.writer_in_flight <= 0:
        parser.error("need --writer-in-flight > 0")
    result = run(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"JSON: {args.json}")


if __name__ == "__main__":
    main()
