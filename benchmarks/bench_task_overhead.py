"""What each precompute task costs in its own process on a round with nothing to compute.

Under a real executor every Airflow task is a fresh process: it parses the DAG file, then runs
the task body, importing what the body needs. This script prepares a trained tiny chain, a
Feast repo (SQLite) and one full round whose budget covers every candidate, then runs the next
round five minutes later (every candidate's vector still fresh, no queued misses: nothing for
the FM, the aggregates or the fill to do) task by task, each in a fresh Python process that has
imported ``airflow.sdk`` first (as the executor's worker has), and records per task: the DAG
file parse, the body's wall time, and whether torch, feast or faiss got imported.

    python benchmarks/bench_task_overhead.py --tree before=/path/to/old/checkout --tree after=. \\
        --json benchmarks/results/task_overhead.json

Every tree must have this version's task bodies (``rank_shard`` and ``split_budget`` replaced
``generate_candidates`` and ``plan`` with the sharded round); the figures in
``results/task_overhead.json`` were measured before that, on the old names.

Each ``--tree`` is prepared on its own (models, repo, first round), then the trees' tasks run
interleaved, task by task, so both see the same load on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

TASKS = (
    "start",
    "drain_miss_queue",
    "rank_shard[0]",
    "rank_shard[1]",
    "split_budget",
    "precompute_shard[0]",
    "precompute_shard[1]",
    "aggregate_users",
    "fill_similar",
    "publish_coverage",
)
HEAVY = ("torch", "feast", "faiss")

# One task in a fresh process: import airflow.sdk (the worker has it), parse the DAG file, run
# the body the DAG task calls, report timings and the heavy modules that got imported.
TASK_SCRIPT = r"""
import importlib.util, json, sys, time
import airflow.sdk  # noqa: F401  the executor's worker has imported it before a task starts
task, state_path, dag_file = sys.argv[1], sys.argv[2], sys.argv[3]
state = json.loads(open(state_path).read())
t0 = time.perf_counter()
spec = importlib.util.spec_from_file_location("solaris_precompute_dag", dag_file)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
t1 = time.perf_counter()
from solaris_feast.pipeline.round import run_task
out = run_task(task, state)
t2 = time.perf_counter()
heavy = [m for m in sys.argv[4].split(",") if m in sys.modules]
print("RESULT " + json.dumps({"parse_s": t1 - t0, "body_s": t2 - t1, "heavy": heavy,
                              "out": out}, default=str))
"""

FEATURE_STORE_YAML = """project: {project}
provider: local
registry:
  registry_type: file
  path: data/registry.db
  cache_ttl_seconds: 0
online_store:
  type: sqlite
  path: data/online.db
offline_store:
  type: file
entity_key_serialization_version: 3
"""


def apply_sqlite_repo(repo: Path, project: str) -> None:
    """A Feast repo in ``repo`` (SQLite online, file offline) with the SOLARIS views applied."""
    from feast import FeatureStore

    from solaris_feast.store.definitions import SolarisFeastConfig, solaris_definitions

    (repo / "data").mkdir(parents=True)
    (repo / "feature_store.yaml").write_text(FEATURE_STORE_YAML.format(project=project))
    config = SolarisFeastConfig(
        user_producing_dag="solaris_precompute", similar_producing_dag="solaris_precompute"
    )
    FeatureStore(repo_path=str(repo)).apply(solaris_definitions(config).all())


def _prepare(root: Path) -> dict[str, Any]:
    """Models, an applied repo, and one full round an hour before the measured one."""

    from solaris_feast.pipeline import training
    from solaris_feast.pipeline.round import precompute_round

    models, repo = root / "models", root / "repo"
    apply_sqlite_repo(repo, "af_bench")
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    manual = {"data_interval_start": None, "data_interval_end": None, "run_after": None}
    train = {
        "models_dir": str(models),
        "dataset": "synthetic",
        "dataset_size": "tiny",
        "train_window_hours": 6,
        "fm_epochs": 1,
        "compressor_epochs": 1,
        "vm_epochs": 1,
    }
    run = training.start_training(
        train, {**manual, "logical_date": now - timedelta(hours=2), "run_id": "bench_train"}
    )
    fm = training.train_foundation_stage(run)
    compressor = training.train_compressor_stage(run, fm["version"])
    training.train_vertical_stage(run, compressor["version"])
    settings = {
        "feature_repo": str(repo),
        "models_dir": str(models),
        "dataset": "synthetic",
        "dataset_size": "tiny",
        "budget_pairs": 100_000,  # every candidate: the next round finds them all fresh
        "shards": 2,
        "candidates_per_user": 20,
        "fill_targets": 3000,
    }
    precompute_round(
        settings, {**manual, "logical_date": now - timedelta(minutes=5), "run_id": "bench_full"}
    )
    return {
        "settings": settings,
        "interval": {**manual, "logical_date": now.isoformat(), "run_id": "bench_idle"},
    }


def _tree_env(tree: Path, home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(tree),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "SOLARIS_CONFIG": "",
    }


def _run_task(task: str, state_path: Path, tree: Path, env: dict[str, str]) -> dict[str, Any]:
    started = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            TASK_SCRIPT,
            task,
            str(state_path),
            str(tree / "dags" / "solaris_precompute.py"),
            ",".join(HEAVY),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    wall = time.perf_counter() - started
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{task} failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    result["process_s"] = wall
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tree",
        action="append",
        required=True,
        metavar="LABEL=PATH",
        help="A checkout to measure (its solaris_feast and dags/); repeat to compare, the trees' "
        "tasks run interleaved so they share the machine's load.",
    )
    parser.add_argument("--json", type=Path, default=None, help="Write the runs here.")
    parser.add_argument("--prepare", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.prepare is not None:  # in a subprocess, with PYTHONPATH on one tree
        (args.prepare / "state.json").write_text(json.dumps(_prepare(args.prepare)))
        return
    trees = {label: Path(path).resolve() for label, path in (t.split("=", 1) for t in args.tree)}

    with tempfile.TemporaryDirectory(prefix="af_task_overhead_", dir=os.environ.get("TMPDIR")) as d:
        states: dict[str, dict[str, Any]] = {}
        envs: dict[str, dict[str, str]] = {}
        for label, tree in trees.items():
            root = Path(d) / label
            (root / "airflow_home").mkdir(parents=True)
            envs[label] = _tree_env(tree, root / "airflow_home")
            subprocess.run(
                [sys.executable, __file__, "--tree", f"{label}={tree}", "--prepare", str(root)],
                env=envs[label],
                check=True,
                capture_output=True,
                timeout=1200,
            )
            states[label] = json.loads((root / "state.json").read_text())
        rows: dict[str, dict[str, Any]] = {label: {} for label in trees}
        plans: dict[str, dict[str, Any]] = {}
        for task in TASKS:
            for label, tree in trees.items():
                state_path = Path(d) / label / "task_state.json"
                state_path.write_text(json.dumps(states[label]))
                result = _run_task(task, state_path, tree, envs[label])
                if task == "start":
                    states[label]["run"] = result["out"]
                if task == "split_budget":
                    plans[label] = {"planned": result["out"].get("planned")}
                rows[label][task] = {
                    "process_s": round(result["process_s"], 2),
                    "parse_s": round(result["parse_s"], 2),
                    "body_s": round(result["body_s"], 2),
                    "heavy_imports": result["heavy"],
                }
                print(
                    f"{label:<8} {task:<22} process {result['process_s']:6.2f} s  parse "
                    f"{result['parse_s']:5.2f} s  body {result['body_s']:6.2f} s  "
                    f"{','.join(result['heavy']) or '-'}"
                )
    runs = []
    for label, tasks in rows.items():
        total = sum(r["process_s"] for r in tasks.values())
        ours = sum(r["parse_s"] + r["body_s"] for r in tasks.values())
        print(f"{label}: round of {len(TASKS)} tasks with nothing to compute: {total:.1f} s")
        runs.append(
            {
                "label": label,
                "plan": plans.get(label),
                "tasks": tasks,
                "total_process_s": round(total, 1),
                "total_parse_and_body_s": round(ours, 1),
                "with_torch": sum("torch" in r["heavy_imports"] for r in tasks.values()),
                "with_feast": sum("feast" in r["heavy_imports"] for r in tasks.values()),
            }
        )
    record = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), "
        f"Python {platform.python_version()}, 1-min load {os.getloadavg()[0]:.1f} at the end",
        "round": "5 min after a round that computed every candidate: all fresh, no queued "
        "misses; synthetic tiny, SQLite, 2 shards",
        "process_s": "a fresh interpreter that imports airflow.sdk, parses the DAG file and runs "
        "the task body; parse_s and body_s are the last two (a LocalExecutor worker has "
        "imported airflow.sdk before it forks a task)",
        "runs": runs,
    }
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
