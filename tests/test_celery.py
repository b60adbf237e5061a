"""Airflow's CeleryExecutor: one precompute round whose mapped shards run on two Celery workers,
with the same rows as a LocalExecutor round (``dag.test()``) on the same inputs.

Everything is started by the test, on loopback, and stopped by process group in ``finally``:

- a throwaway metadata database ``cl_meta_<random>`` on the PostgreSQL of
  ``SOLARIS_TEST_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``),
  dropped afterwards; it is also the Celery result backend;
- the API server (execution API only, on a port of this suite's block, :mod:`ports`), a
  scheduler, a dag-processor and two
  ``airflow celery worker`` processes (concurrency 1 each, their own Celery and task-instance
  hostnames), on the broker of ``SOLARIS_TEST_CELERY_BROKER`` (default: the RabbitMQ on
  127.0.0.1:5672 when it answers, else ``REDIS_URL``), on a queue of the test's own, so workers
  of anyone else on the same broker never take its tasks.

The LocalExecutor round (``dag.test()`` in a subprocess) runs at the same time, on a SQLite
metadata database of its own: on the Celery one, the scheduler would take a running
``dag.test()`` run of the unpaused DAG as its own. Both rounds are queued for the same moment,
in Feast repos of their own, with the same models: their offline rows and online values must be
equal.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pandas as pd
import pytest
from ports import CELERY_API_PORT
from test_dags import (
    DAGS_FOLDER,
    REPO_ROOT,
    TRAINING_CONF,
    last_hour,
    make_feature_repo,
    offline_frame,
    precompute_conf,
)

API_PORT = CELERY_API_PORT
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"
WORKERS = ("cl-worker-1", "cl-worker-2")
ROUND_TIMEOUT_S = 300
VIEWS = ("solaris_pair", "solaris_user", "solaris_similar")
DAG_ID = "solaris_precompute"

# Both rounds are manual runs with no logical date, queued for the same moment (``run_after``):
# a round plans for that moment (solaris_feast.pipeline.runs.run_time), so both write the rows
# of one round. ``airflow dags trigger`` cannot set ``run_after`` (it is the time of the call),
# so the trigger goes through the function the CLI calls.
DAG_TEST_SCRIPT = """
import json, sys
from datetime import datetime
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
assert not bag.import_errors, bag.import_errors
run = bag.dags["solaris_precompute"].test(
    logical_date=None,
    run_after=datetime.fromisoformat(sys.argv[2]),
    run_conf=json.loads(sys.argv[3]),
)
tasks = {f"{ti.task_id}[{ti.map_index}]": str(ti.state) for ti in run.get_task_instances()}
print("RESULT " + json.dumps({"state": str(run.state), "run_id": run.run_id, "tasks": tasks}))
"""

TRIGGER_SCRIPT = """
import json, sys
from datetime import datetime
from sqlalchemy import update
from airflow.api.common.trigger_dag import trigger_dag
from airflow.models.dag import DagModel
from airflow.utils.session import create_session
from airflow.utils.types import DagRunTriggeredByType
run = trigger_dag(
    "solaris_precompute",
    triggered_by=DagRunTriggeredByType.CLI,
    run_id=sys.argv[1],
    run_after=datetime.fromisoformat(sys.argv[2]),
    logical_date=None,
    conf=json.loads(sys.argv[3]),
)
with create_session() as session:  # as `airflow dags unpause` does
    session.execute(
        update(DagModel).where(DagModel.dag_id == "solaris_precompute").values(is_paused=False)
    )
print("RESULT " + json.dumps({"run_id": run.run_id}))
"""


WORKER_NAME_MODULE = '''"""The task-instance hostname of a test worker (both share one machine)."""
import os


def hostname() -> str:
    return os.environ["SOLARIS_TEST_WORKER_NAME"]
'''


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def broker_url(redis_url: str) -> str:
    configured = os.environ.get("SOLARIS_TEST_CELERY_BROKER")
    if configured:
        return configured
    return DEFAULT_RABBITMQ_URL if _answers("127.0.0.1", 5672) else redis_url


@pytest.fixture
def metadata_database() -> Iterator[str]:
    """A fresh PostgreSQL database for Airflow's metadata, dropped afterwards."""
    import psycopg2

    admin_url = os.environ.get("SOLARIS_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    name = f"cl_meta_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg2.connect(admin_url, connect_timeout=5)
    except psycopg2.OperationalError as exc:
        pytest.fail(
            f"the CeleryExecutor test needs a PostgreSQL for Airflow's metadata ({exc}); start "
            "one or point SOLARIS_TEST_POSTGRES_URL at a server where the user may create "
            "databases"
        )
    admin.autocommit = True
    try:
        with admin.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{name}"')
        parts = urlsplit(admin_url)
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@dataclass
class Stack:
    """Processes started by the test, each in a process group of its own."""

    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    services: set[str] = field(default_factory=set)
    """The processes that must not exit while the test runs."""

    def start(self, name: str, args: list[str], env: dict[str, str], service: bool = True) -> None:
        if service:
            self.services.add(name)
        log = (self.logs / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def check_alive(self) -> None:
        for name in self.services:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.tail(name)}")

    def finish(self, name: str, timeout_s: float) -> str:
        """Wait for a process that is not a service; return its output."""
        returncode = self.procs[name].wait(timeout=timeout_s)
        output = (self.logs / f"{name}.log").read_text(errors="replace")
        if returncode != 0:
            raise AssertionError(f"{name} exited with {returncode}:\n{output[-6000:]}")
        return output

    def tail(self, name: str, chars: int = 4000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop(self) -> None:
        """SIGTERM to every group, then SIGKILL to what is left after 30 s."""
        for proc in self.procs.values():
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        for proc in self.procs.values():
            # The group, not the leader only: a worker's forked children outlive it.
            _signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def airflow_env(home: Path, metadata: str, broker: str, queue: str) -> dict[str, str]:
    sqlalchemy = metadata.replace("postgresql://", "postgresql+psycopg2://", 1)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO_ROOT), str(home), os.environ.get("PYTHONPATH", "")]
        ),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{API_PORT}/execution/",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{API_PORT}",
        "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sqlalchemy,
        "AIRFLOW__CELERY__BROKER_URL": broker,
        "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + sqlalchemy,
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",
        "AIRFLOW__OPERATORS__DEFAULT_QUEUE": queue,
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        # No schedule: unpausing the DAG must not start a round of its own with the param
        # defaults (any cron does, for its latest tick, and writes into feature_repo/).
        "SOLARIS_PRECOMPUTE_SCHEDULE": "none",
    }


def airflow(*args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("airflow")), *args]


def run_script(env: dict[str, str], script: str, *args: str) -> dict[str, Any]:
    """Run ``script`` with Airflow's environment; return the JSON of its ``RESULT`` line."""
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=ROUND_TIMEOUT_S,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout + proc.stderr)[-6000:]
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def train_tiny_chain(models: Path) -> None:
    """FM, compressor and VM on the tiny synthetic log, as the training DAG's tasks do."""
    from solaris_feast.pipeline import training

    run = training.start_training(
        {**TRAINING_CONF, "models_dir": str(models)},
        {
            "data_interval_start": None,
            "data_interval_end": None,
            "logical_date": None,
            "run_after": None,
            "run_id": "cl_training",
        },
    )
    fm = training.train_foundation_stage(run)
    compressor = training.train_compressor_stage(run, fm["version"])
    training.train_vertical_stage(run, compressor["version"])


def query(metadata: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    import psycopg2

    with psycopg2.connect(metadata, connect_timeout=5) as connection, connection.cursor() as cur:
        cur.execute(sql, params)
        return list(cur.fetchall())


def wait_for(
    condition: Any, timeout_s: float, what: str, stack: Stack, every_s: float = 1.0
) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stack.check_alive()
        value = condition()
        if value:
            return value
        time.sleep(every_s)
    tails = "\n".join(f"--- {n}\n{stack.tail(n, 2000)}" for n in stack.procs)
    raise AssertionError(f"{what} did not happen within {timeout_s:.0f} s\n{tails}")


def stored_rows(repo: Path, project: str) -> dict[str, Any]:
    """Every offline row (less the time it was written) and every online value of the views."""
    rows: dict[str, Any] = {}
    for view in VIEWS:
        frame = offline_frame(repo, view).drop(columns=["written_at"])
        keys = [c for c in ("user_id", "item_id") if c in frame.columns]
        frame = frame.sort_values(keys).reset_index(drop=True)
        frame["embedding"] = frame["embedding"].map(lambda v: tuple(float(x) for x in v))
        rows[f"offline {view}"] = frame
    with sqlite3.connect(repo / "data" / "online.db") as online:
        for view in VIEWS:
            rows[f"online {view}"] = sorted(
                online.execute(
                    f'SELECT entity_key, feature_name, value, event_ts FROM "{project}_{view}"'
                ).fetchall()
            )
    return rows


def test_a_schedule_of_none_means_triggered_runs_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from solaris_feast.config import schedule_of

    monkeypatch.delenv("SOLARIS_CONFIG", raising=False)
    monkeypatch.setenv("SOLARIS_PRECOMPUTE_SCHEDULE", "None")
    assert schedule_of("precompute", "@hourly") is None
    monkeypatch.setenv("SOLARIS_PRECOMPUTE_SCHEDULE", "*/5 * * * *")
    assert schedule_of("precompute", "@hourly") == "*/5 * * * *"
    monkeypatch.delenv("SOLARIS_PRECOMPUTE_SCHEDULE")
    assert schedule_of("precompute", "@hourly") == "@hourly"


@pytest.mark.slow
@pytest.mark.celery
def test_celery_round_runs_shards_on_both_workers_with_the_rows_of_a_local_round(
    metadata_database: str, redis_url: str, tmp_path: Path
) -> None:
    started = time.perf_counter()
    timings: dict[str, float] = {}
    home = tmp_path / "airflow"
    home.mkdir()
    (home / "solaris_test_worker_name.py").write_text(WORKER_NAME_MODULE)
    queue = f"cl_queue_{uuid.uuid4().hex[:8]}"
    env = airflow_env(home, metadata_database, broker_url(redis_url), queue)
    stack = Stack(logs=tmp_path)
    try:
        # Migrating and training are independent: the migrations run while the models train.
        local_home = tmp_path / "airflow-local"
        local_home.mkdir()
        local_env = {
            **env,
            "AIRFLOW_HOME": str(local_home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{local_home}/airflow.db",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        }
        for name, its_env in (("migrate", env), ("migrate-local", local_env)):
            stack.start(name, airflow("db", "migrate"), its_env, service=False)
        models = tmp_path / "models"
        train_tiny_chain(models)
        timings["train"] = time.perf_counter() - started
        stack.finish("migrate", 300)
        stack.finish("migrate-local", 300)
        timings["migrate"] = time.perf_counter() - started

        project = "cl_celery"
        local_repo = make_feature_repo(tmp_path / "local", project)
        celery_repo = make_feature_repo(tmp_path / "celery", project)
        queued_for = last_hour()
        # The LocalExecutor round: its tasks run in this subprocess, one after another.
        stack.start(
            "local-round",
            [
                *(sys.executable, "-c", DAG_TEST_SCRIPT, str(DAGS_FOLDER)),
                *(queued_for.isoformat(), json.dumps(precompute_conf(local_repo, models))),
            ],
            local_env,
            service=False,
        )
        stack.start(
            "api-server",
            airflow(
                *("api-server", "--apps", "execution", "--workers", "1"),
                *("--host", "127.0.0.1", "--port", str(API_PORT)),
            ),
            env,
        )
        stack.start("scheduler", airflow("scheduler"), env)
        stack.start("dag-processor", airflow("dag-processor"), env)
        for name in WORKERS:
            stack.start(
                name,
                airflow(
                    *("celery", "worker", "--queues", queue, "--concurrency", "1"),
                    *("--celery-hostname", f"{name}@%h", "--skip-serve-logs"),
                    *("--without-mingle", "--without-gossip"),
                ),
                {
                    **env,
                    "SOLARIS_TEST_WORKER_NAME": name,
                    "AIRFLOW__CORE__HOSTNAME_CALLABLE": "solaris_test_worker_name.hostname",
                },
            )
        wait_for(
            lambda: query(metadata_database, "SELECT 1 FROM dag WHERE dag_id = %s", DAG_ID),
            180,
            "the dag-processor parsing the DAG",
            stack,
        )
        for name in WORKERS:
            wait_for(
                lambda name=name: (
                    f"{name}@" in stack.tail(name, 10**6) and " ready." in stack.tail(name, 10**6)
                ),
                180,
                f"Celery worker {name} ready",
                stack,
            )
        timings["workers ready"] = time.perf_counter() - started
        run_id = run_script(
            env,
            TRIGGER_SCRIPT,
            "cl_celery_round",
            queued_for.isoformat(),
            json.dumps(precompute_conf(celery_repo, models)),
        )["run_id"]

        def finished() -> str | None:
            [(state,)] = query(
                metadata_database, "SELECT state FROM dag_run WHERE run_id = %s", run_id
            )
            return state if state in ("success", "failed") else None

        state = wait_for(finished, ROUND_TIMEOUT_S, "the Celery round", stack, every_s=2.0)
        timings["celery round"] = time.perf_counter() - started
        instances = query(
            metadata_database,
            "SELECT task_id, map_index, state, hostname, try_number, start_date, end_date "
            "FROM task_instance WHERE run_id = %s ORDER BY start_date",
            run_id,
        )
        runs = query(metadata_database, "SELECT run_id FROM dag_run ORDER BY run_id")
        lines = [
            line
            for line in stack.finish("local-round", ROUND_TIMEOUT_S).splitlines()
            if line.startswith("RESULT ")
        ]
        assert lines, stack.tail("local-round")
        local = json.loads(lines[-1][len("RESULT ") :])
        timings["local round"] = time.perf_counter() - started
    finally:
        stack.stop()
    print(
        "\ncelery: "
        + ", ".join(f"{k} at {v:.0f} s" for k, v in timings.items())
        + "\n"
        + "\n".join(
            f"  {task}[{index}] {state} on {host} (try {tries}): {start} - {end}"
            for task, index, state, host, tries, start, end in instances
        )
    )
    assert state == "success", instances
    assert local["state"] == "success", local
    assert [r for (r,) in runs] == [run_id], runs  # no scheduled round of its own
    states = {(task, index): s for task, index, s, *_ in instances}
    assert set(states.values()) == {"success"}
    assert {t.split("[")[0] for t in local["tasks"]} == {task for task, _ in states}
    # The mapped shards ran on both workers, and every task ran on one of them.
    shards = [row for row in instances if row[0] == "precompute_shard"]
    assert {row[3] for row in shards} == set(WORKERS), instances
    assert {row[3] for row in instances} <= set(WORKERS)

    local_rows = stored_rows(local_repo, "cl_celery")
    celery_rows = stored_rows(celery_repo, "cl_celery")
    for name, expected in local_rows.items():
        got = celery_rows[name]
        if isinstance(expected, pd.DataFrame):
            assert len(expected) > 0, name
            pd.testing.assert_frame_equal(got, expected, obj=name)
        else:
            assert len(expected) > 0 and got == expected, name
