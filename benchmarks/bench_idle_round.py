"""A precompute round with nothing to compute, under a real Airflow scheduler: wall time per tree.

    python benchmarks/bench_idle_round.py --tree before=/path/to/old/checkout --tree after=. \\
        --json benchmarks/results/idle_round.json

Issue 15, item 3. Per tree, one after the other: the test suite's own deployment (a user's
parquet log, an item table, a trained and promoted chain, a SQLite Feast repo; see
``tests/test_byo.py``), then the api-server, dag-processor and scheduler of Airflow 3 with the
LocalExecutor (parallelism 2, this machine's cores) and metadata in a throwaway PostgreSQL
database (SQLite where none runs), as ``tests/test_scheduler.py`` starts them. Two manual runs
of ``solaris_precompute``, triggered one after the other: the first computes every candidate
(the budget covers them all), the second finds every pair fresh and no miss queued (the log
ends before the first, and its history window is longer than the log). Recorded for both:
the run's wall time from the scheduler's start to its end, and each task's own duration and
queueing delay (from Airflow's metadata), plus how many pairs the FM computed (0 for the idle
round).

The DAG files and task code come from the tree (``PYTHONPATH`` and ``dags/``); the deployment
is prepared by this checkout's code for every tree, so the trees differ in their tasks only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from test_byo import config_dict, own_deployment, run_cli, write_config  # noqa: E402
from test_scheduler import (  # noqa: E402
    AIRFLOW,
    airflow_cli,
    free_port_in_range,
    local_executor_env,
    log_tails,
    metadata_database,
    query,
    start_deployment,
    stop,
)

from solaris_feast.console import parse_script_args  # noqa: E402

DAG_ID = "solaris_precompute"
SHARDS = 2
RUN_DEADLINE_SECONDS = 900.0


def prepare(root: Path, project: str) -> Path:
    """A trained, promoted deployment whose rounds are only triggered by hand."""
    from solaris_feast.models.cards import list_cards

    config = own_deployment(root, project)
    raw = config_dict(
        root,
        feast={"repo": "repo", "feature_store_yaml": "feature_store.yaml"},
        precompute={"budget_pairs": 100_000, "shards": SHARDS},
        schedules={"precompute": "none", "precompute_on_promotion": False},
    )
    # The log spans 2 days: a history window of 4 lets no event leave the round's window
    # between the two runs, so the second has nothing at all to compute.
    raw["log"]["history_seconds"] = 4 * 86_400
    config = write_config(root, raw)
    run_cli("train", "--config", str(config))
    [vm] = [c for c in list_cards(root / "models") if c.kind == "vm"]
    run_cli("promote", "--config", str(config), "--vm", vm.version, "--no-airflow")
    return config


def wait_for_run(conn_uri: str, run_id: str, procs: list[Any], logs: Path) -> str:
    deadline = time.monotonic() + RUN_DEADLINE_SECONDS
    while True:
        rows = query(conn_uri, "SELECT state FROM dag_run WHERE run_id = :r", r=run_id)
        if rows and rows[0][0] in ("success", "failed"):
            return str(rows[0][0])
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError(f"run {run_id} did not finish\n{log_tails(logs)}")
        time.sleep(0.5)


def measure_tree(label: str, tree: Path, workdir: Path) -> dict[str, Any]:
    root = workdir / label / "own"
    root.mkdir(parents=True)
    project = f"idle_bench_{label}_{secrets.token_hex(3)}"
    config = prepare(root, project)
    home, logs = workdir / label / "airflow_home", workdir / label / "logs"
    home.mkdir()
    logs.mkdir()
    port = free_port_in_range()
    with metadata_database(workdir / label) as conn_uri:
        # The tree's own dags/ and code come first on the path (the editable install is this one).
        env = local_executor_env(tree, config, home, conn_uri, port, os.cpu_count() or 2)
        airflow_cli(env, "db", "migrate")
        procs: list[Any] = []
        try:
            start_deployment(procs, env, port, logs, conn_uri)
            airflow_cli(env, "dags", "unpause", DAG_ID)
            states = {}
            for run_id in ("full", "idle"):
                airflow_cli(env, "dags", "trigger", DAG_ID, "--run-id", run_id)
                states[run_id] = wait_for_run(conn_uri, run_id, procs, logs)
                print(f"  {label}: run {run_id}: {states[run_id]}", flush=True)
            runs = query(
                conn_uri,
                "SELECT run_id, queued_at, start_date, end_date FROM dag_run WHERE dag_id = :d",
                d=DAG_ID,
            )
            tasks = query(
                conn_uri,
                "SELECT run_id, task_id, map_index, state, queued_dttm, start_date, end_date, "
                "duration FROM task_instance WHERE dag_id = :d",
                d=DAG_ID,
            )
        finally:
            for proc in reversed(procs):
                stop(proc)
    if any(s != "success" for s in states.values()):
        raise RuntimeError(f"{label}: {states}\n{log_tails(logs)}")
    report: dict[str, Any] = {"tree": str(tree)}
    for run_id, queued, started, ended in runs:
        own = sorted((t for t in tasks if t[0] == run_id), key=lambda t: t[5] or t[6] or started)
        report[run_id] = {
            "run_seconds": round((ended - started).total_seconds(), 1),
            "queued_to_end_seconds": round((ended - queued).total_seconds(), 1),
            "tasks": [
                {
                    "task": f"{t[1]}[{t[2]}]" if t[2] >= 0 else t[1],
                    "state": t[3],
                    "seconds": round(float(t[7] or 0.0), 2),
                    "queued_seconds": round((t[5] - t[4]).total_seconds(), 2)
                    if t[4] is not None and t[5] is not None
                    else None,
                }
                for t in own
            ],
        }
    plans = sorted(
        (json.loads(p.read_text()) for p in (root / "runs").glob("*/*/coverage.json")),
        key=lambda p: str(p["now"]),
    )
    report["full"]["fm_pairs"] = plans[0]["fm_pairs"] if plans else None
    # An idle round that ends in its start writes its coverage.json there.
    report["idle"]["fm_pairs"] = plans[-1]["fm_pairs"] if len(plans) > 1 else None
    return report


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "| tree | idle round (scheduler start to end) | tasks run | slowest task | full round |",
        "| --- | ---: | ---: | --- | ---: |",
    ]
    for label, tree in report["trees"].items():
        idle = tree["idle"]
        ran = [t for t in idle["tasks"] if t["state"] == "success"]
        slowest = max(ran, key=lambda t: t["seconds"]) if ran else None
        lines.append(
            f"| {label} | {idle['run_seconds']} s | {len(ran)} of {len(idle['tasks'])} | "
            + (f"{slowest['task']} {slowest['seconds']} s" if slowest else "-")
            + f" | {tree['full']['run_seconds']} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", required=True, help="LABEL=PATH")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parse_script_args(parser)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="idle_round_"))
    trees = dict(item.split("=", 1) for item in args.tree)
    report: dict[str, Any] = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), Python "
        f"{platform.python_version()}",
        "airflow": subprocess.run(
            [AIRFLOW, "version"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "round": "a manual run 2 min after one that computed every candidate: every pair "
        f"fresh, no queued misses; {SHARDS} shards, SQLite, LocalExecutor",
        "trees": {},
    }
    for label, path in trees.items():
        print(f"{label}: {path}", flush=True)
        report["trees"][label] = measure_tree(label, Path(path).resolve(), workdir)
    report["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2, default=str))
    print(markdown(report))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
