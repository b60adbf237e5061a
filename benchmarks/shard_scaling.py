"""A precompute round sharded by user: wall time and peak memory per task against shards and users.

``python benchmarks/shard_scaling.py --users 20000,1000000 --shards 1,2,4 --json
benchmarks/results/shard_scaling.json``

Issue 15, item 4. For each user count: a synthetic log (the generator's world, one day, a
session of 8 impressions 1.5 times a day per user; about 20 events per user) written as a
user's own parquet log with an item table, a chain trained on its last ``--train-hours`` (the
reference FM, compressor and VM, one epoch each), and, per shard count, a fresh Feast repo
(SQLite online store, file offline store) and one round whose every task runs in its own
Python process, as under a real executor: start, drain, ``rank_shard`` per shard, the budget
split, ``precompute_shard`` per shard, aggregates, fill, coverage. Mapped tasks run
``--parallelism`` at a time (the machine's cores by default). Recorded per task: wall seconds
and peak resident memory (the process's ``VmHWM``); per round: the sum of the phases'
walls (what a scheduler with that parallelism takes, start-up included) and how the sharded
plan compares with the 1-shard plan of the same log (share of the same pairs).

``--preset large`` runs the synthetic ``large`` preset's world as it is (20,000 users over 7
days, about 3.7 M events) instead of ``--users``; its rows say ``preset``.

The round's cost against users is the least-squares slope of log(round seconds) against
log(users) at each shard count.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from bench_task_overhead import apply_sqlite_repo

CANDIDATES_PER_USER = 10
BUDGET_SHARE = 0.1

# One task in a fresh process: run the body the DAG task calls, print its report.
TASK_SCRIPT = r"""
import json, sys
from solaris_feast.pipeline.round import run_task
out = run_task(sys.argv[1], json.loads(open(sys.argv[2]).read()))
# VmHWM: this process's own peak resident set (ru_maxrss would carry the parent's over exec).
hwm_kb = next(
    int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")
)
print("RESULT " + json.dumps({"out": out, "peak_rss_kb": hwm_kb}, default=str))
"""


def slope(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 2:
        return None
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx
    )


def _env() -> dict[str, str]:
    return {**os.environ, "SOLARIS_CONFIG": "", "OMP_NUM_THREADS": "1"}


class TaskOverMemory(RuntimeError):
    """A task passed ``--max-task-rss-gb`` and was killed (it would not fit a worker)."""


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    except (FileNotFoundError, StopIteration, ProcessLookupError):
        return 0


def run_task_measured(task: str, state_path: Path, max_rss_kb: int) -> dict[str, Any]:
    """``task`` in its own process: its report, wall seconds and peak RSS (MB, VmHWM).

    A task whose resident memory passes ``max_rss_kb`` is killed (polled every 0.2 s) and
    raises :class:`TaskOverMemory`, before it can drive the machine out of memory."""
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", TASK_SCRIPT, task, str(state_path)],
            env=_env(),
            stdout=out,
            stderr=err,
            text=True,
        )
        peak_kb = 0
        while proc.poll() is None:
            peak_kb = max(peak_kb, _rss_kb(proc.pid))
            if peak_kb > max_rss_kb:
                proc.kill()
                proc.wait()
                raise TaskOverMemory(
                    f"{task} passed {max_rss_kb / 2**20:.0f} GB after "
                    f"{time.perf_counter() - started:.0f} s and was killed"
                )
            time.sleep(0.2)
        wall = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{task} failed:\n{(stdout + stderr)[-4000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    return {
        "task": task,
        "seconds": round(wall, 2),
        "peak_rss_mb": round(result["peak_rss_kb"] / 1024, 1),
        "report": result["out"],
    }


def prepare(
    root: Path, users: int, train_hours: float, preset: str | None = None
) -> tuple[Path, dict[str, Any]]:
    """Log, item table, trained chain and the config for ``users`` (or the synthetic
    ``preset``'s world as it is, ending now); the config and facts.

    A ``root`` prepared before (its ``facts.json``) is reused as it is."""
    from solaris_feast.data.datasets import SYNTHETIC_PRESETS
    from solaris_feast.data.synthetic import SyntheticConfig, generate

    if (root / "facts.json").is_file():
        return root / "solaris.yaml", json.loads((root / "facts.json").read_text())

    end = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    if preset is not None:
        world_config = SYNTHETIC_PRESETS[preset]
        days = world_config.days
        world_config = world_config.model_copy(
            update={"start": (pd.Timestamp(end) - pd.Timedelta(days=days)).isoformat()}
        )
    else:
        days = 1.0
        world_config = SyntheticConfig(
            num_users=users,
            num_items=5_000,
            num_categories=40,
            days=days,
            sessions_per_day=1.5,
            impressions_per_session=8,
            start=(pd.Timestamp(end) - pd.Timedelta(days=days)).isoformat(),
        )
    started = time.perf_counter()
    world = generate(world_config)
    log = world.interactions
    (root / "log").mkdir(parents=True, exist_ok=True)
    log.to_parquet(root / "log" / "events.parquet", index=False)
    world.items.to_parquet(root / "items.parquet", index=False)
    generated = time.perf_counter() - started
    raw: dict[str, Any] = {
        "feast": {"repo": "repo"},
        "log": {
            "path": "log",
            "name": f"scaling{users}",
            "columns": {
                "user": "user_id",
                "item": "item_id",
                "timestamp": "event_timestamp",
                "labels": ["click", "conversion"],
            },
            "items": {"path": "items.parquet", "id_column": "item_id", "categorical": ["category"]},
        },
        "models": {"dir": "models"},
        "precompute": {
            "budget_pairs": int(BUDGET_SHARE * users * CANDIDATES_PER_USER),
            "candidates_per_user": CANDIDATES_PER_USER,
            "fill_targets": 20_000,
            "runs_dir": "runs",
        },
        "training": {
            "train_window_hours": train_hours,
            "fm_epochs": 1,
            "compressor_epochs": 1,
            "vm_epochs": 1,
        },
    }
    config = root / "solaris.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "solaris_feast.cli", "train", "--config", str(config)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=7200,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"training failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    trained = time.perf_counter() - started
    facts = {
        "users": users,
        "events": len(log),
        "items": int(world.items["item_id"].nunique()),
        "log_mb": round(float(log.memory_usage(deep=True).sum()) / 1e6, 1),
        "generate_seconds": round(generated, 1),
        "train_seconds": round(trained, 1),
        "end": end.isoformat(),
        "train_hours": train_hours,
        "preset": preset,
    }
    (root / "facts.json").write_text(json.dumps(facts, indent=2))
    return config, facts


def run_round(
    config: Path, root: Path, shards: int, parallelism: int, at: datetime, max_rss_kb: int
) -> dict[str, Any]:
    """One round with ``shards`` shards, every task in its own process."""
    from solaris_feast.config import load_config, precompute_settings

    repo = root / f"repo_{shards}"
    apply_sqlite_repo(repo, f"shardbench{shards}")
    settings = precompute_settings(load_config(config)).model_dump(mode="json")
    settings.update(
        feature_repo=str(repo),
        shards=shards,
        runs_dir=str(root / f"runs_{shards}"),
        allow_expired_rounds=True,  # the round runs at the recorded log's end
    )
    interval = {
        "data_interval_start": None,
        "data_interval_end": None,
        "logical_date": at.isoformat(),
        "run_after": None,
        "run_id": f"shard_bench_{shards}",
    }
    state_path = root / f"state_{shards}.json"
    state_path.write_text(json.dumps({"settings": settings, "interval": interval}))
    tasks: list[dict[str, Any]] = []
    phases: list[dict[str, Any]] = []

    def phase(name: str, names: list[str]) -> list[dict[str, Any]]:
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=parallelism) as pool:
            done = list(pool.map(lambda t: run_task_measured(t, state_path, max_rss_kb), names))
        phases.append({"phase": name, "seconds": round(time.perf_counter() - started, 2)})
        tasks.extend(done)
        for t in done:
            print(
                f"    {t['task']:<22} {t['seconds']:>8.1f} s  {t['peak_rss_mb']:>8.0f} MB",
                flush=True,
            )
        return done

    [start] = phase("start", ["start"])
    state_path.write_text(
        json.dumps({"settings": settings, "interval": interval, "run": start["report"]})
    )
    phase("drain_miss_queue", ["drain_miss_queue"])
    phase("rank_shard", [f"rank_shard[{i}]" for i in range(shards)])
    [split] = phase("split_budget", ["split_budget"])
    phase("precompute_shard", [f"precompute_shard[{i}]" for i in range(shards)])
    phase("aggregate_users", ["aggregate_users"])
    [fill] = phase("fill_similar", ["fill_similar"])
    [covered] = phase("publish_coverage", ["publish_coverage"])
    run_dir = Path(start["report"]["run_dir"])
    planned = pd.concat(
        [pd.read_parquet(p) for p in sorted(run_dir.glob("shards/*/plan/pairs.parquet"))],
        ignore_index=True,
    )
    by_phase: dict[str, float] = {}
    for t in tasks:
        kind = t["task"].split("[")[0]
        by_phase[kind] = max(by_phase.get(kind, 0.0), t["peak_rss_mb"])
    return {
        "shards": shards,
        "round_seconds": round(sum(p["seconds"] for p in phases), 1),
        "phases": phases,
        "tasks": tasks,
        "peak_rss_mb_by_task": by_phase,
        "peak_rss_mb_max": max(by_phase.values()),
        "budgets": split["report"]["budgets"],
        "planned": len(planned),
        "filled": fill["report"].get("filled", 0),
        "coverage": covered["report"]["coverage"],
        "_pairs": set(
            zip(planned["user_id"].to_numpy(), planned["item_id"].to_numpy(), strict=True)
        ),
    }


def makespan(seconds: list[float], workers: int) -> float:
    """Wall time of independent tasks on ``workers`` (longest first, each to the least loaded):
    what a phase of mapped tasks would take with that parallelism, from measured task times."""
    loads = [0.0] * workers
    for t in sorted(seconds, reverse=True):
        loads[loads.index(min(loads))] += t
    return max(loads)


def _exponents(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Slope of log(round seconds) against log(users) per shard count, over the rounds run."""
    by_shards: dict[int, list[tuple[float, float]]] = {}
    for row in rows:
        for r in row["rounds"]:
            if "round_seconds" in r:
                by_shards.setdefault(r["shards"], []).append((row["users"], r["round_seconds"]))
    out: dict[str, float | None] = {}
    for shards, points in sorted(by_shards.items()):
        e = slope([p[0] for p in points], [p[1] for p in points])
        out[str(shards)] = None if e is None else round(e, 3)
    return out


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def markdown_table(report: dict[str, Any]) -> str:
    """The JSON's rounds as the table in ``benchmarks/README.md``."""
    lines = [
        "| users | events | shards | workers | round s | round s, 2 workers (computed) "
        "| peak MB: rank_shard / precompute_shard / aggregate / fill | same pairs as 1 shard |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["rows"]:
        for r in row["rounds"]:
            workers = r.get("parallelism", "")
            head = f"| {row['users']:,} | {row['events']:,} | {r['shards']} | {workers}"
            if "failed" in r:
                lines.append(f"{head} | not run: {r['failed'].splitlines()[0][:90]} | | | |")
                continue
            peak = r["peak_rss_mb_by_task"]
            mb = " / ".join(
                f"{peak.get(k, 0):,.0f}"
                for k in ("rank_shard", "precompute_shard", "aggregate_users", "fill_similar")
            )
            lines.append(
                f"{head} | {r['round_seconds']:.0f} | "
                f"{r['round_seconds_computed_for_2_workers']:.0f} | {mb} | "
                f"{_share(r.get('same_pairs_as_first_measured'))} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", default="20000,1000000")
    parser.add_argument(
        "--preset",
        default=None,
        help="a synthetic preset's world as it is (its own users and days) instead of --users",
    )
    parser.add_argument("--shards", default="1,2,4")
    parser.add_argument("--parallelism", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--train-hours", type=float, default=2.0)
    parser.add_argument(
        "--max-task-rss-gb",
        type=float,
        default=16.0,
        help="kill a task past this resident memory and record the round as not fitting",
    )
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument(
        "--append", action="store_true", help="keep the JSON's rows of other user counts"
    )
    args = parser.parse_args()
    shard_counts = [int(s) for s in args.shards.split(",")]
    max_rss_kb = int(args.max_task_rss_gb * 2**20)
    rows: list[dict[str, Any]] = []
    if args.append and args.json.is_file():
        rows = json.loads(args.json.read_text())["rows"]
    base = args.workdir or Path(tempfile.mkdtemp(prefix="shard_scaling_"))

    def save() -> None:
        report = {
            "meta": {
                "measured_at": datetime.now(UTC).isoformat(),
                "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
                "python": platform.python_version(),
                "candidates_per_user": CANDIDATES_PER_USER,
                "budget_share": BUDGET_SHARE,
                "online_store": "sqlite",
                "load_average_1m_at_end": round(os.getloadavg()[0], 2),
            },
            "rows": sorted(rows, key=lambda r: r["users"]),
            "round_exponent_vs_users": _exponents(rows),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=float))

    if args.preset is not None:
        from solaris_feast.data.datasets import SYNTHETIC_PRESETS

        user_counts = [SYNTHETIC_PRESETS[args.preset].num_users]
    else:
        user_counts = [int(u) for u in args.users.split(",")]
    for users in user_counts:
        root = base / (f"preset_{args.preset}" if args.preset else f"users_{users}")
        root.mkdir(parents=True, exist_ok=True)
        print(f"{users} users: generating the log and training the chain ...", flush=True)
        config, facts = prepare(root, users, args.train_hours, args.preset)
        print(
            f"  {facts['events']} events ({facts['log_mb']} MB), generated in "
            f"{facts['generate_seconds']} s, trained in {facts['train_seconds']} s",
            flush=True,
        )
        at = datetime.fromisoformat(facts["end"]) + timedelta(minutes=5)
        rounds: list[dict[str, Any]] = []
        first: set[tuple[Any, Any]] | None = None
        for shards in shard_counts:
            print(f"  {shards} shard(s):", flush=True)
            try:
                done = run_round(config, root, shards, args.parallelism, at, max_rss_kb)
            except (TaskOverMemory, RuntimeError) as err:
                print(f"  {shards} shard(s): not measured: {err}", flush=True)
                rounds.append({"shards": shards, "failed": str(err)[-600:]})
                continue
            pairs = done.pop("_pairs")
            first = pairs if first is None else first
            done["same_pairs_as_first_measured"] = round(len(pairs & first) / max(len(first), 1), 4)
            done["round_seconds_computed_for_2_workers"] = round(
                sum(
                    makespan(
                        [t["seconds"] for t in done["tasks"] if t["task"].startswith(p["phase"])],
                        2,
                    )
                    for p in done["phases"]
                ),
                1,
            )
            rounds.append(done)
            print(
                f"  {shards} shard(s): round {done['round_seconds']} s, peak "
                f"{done['peak_rss_mb_max']:.0f} MB per task",
                flush=True,
            )
        for r in rounds:
            r["parallelism"] = args.parallelism
        # --append: this run's shard counts replace those of an earlier run, the others stay.
        earlier = [r for r in rows if r["users"] == users]
        kept = [r for row in earlier for r in row["rounds"] if r["shards"] not in shard_counts]
        rows = [r for r in rows if r["users"] != users]
        rows.append({**facts, "rounds": sorted(kept + rounds, key=lambda r: r["shards"])})
        save()
    print(markdown_table(json.loads(args.json.read_text())))
    print(f"exponent of round seconds vs users by shards: {_exponents(rows)}; JSON: {args.json}")


if __name__ == "__main__":
    main()
