"""The Airflow DAGs, run for real: parse, train, precompute, serve every tier, retry, re-run.

Airflow gets a throwaway ``AIRFLOW_HOME`` with a SQLite metadata database, migrated once per
session. The parse check runs in a subprocess (it needs a clean ``sys.modules``); ``dag.test()``
runs in this process, as a worker would run the tasks, against a Feast repo made in ``tmp_path``
with the solaris factories (SQLite online store). Airflow reads its configuration when it is
first imported, so nothing may import it before the ``airflow_env`` fixture has set the
environment (no other test module does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
DAGS_FOLDER = REPO_ROOT / "dags"
HEAVY_MODULES = ("torch", "faiss", "feast", "solaris_feast.pipeline", "pandas")

pytestmark = pytest.mark.slow

PARSE_SCRIPT = """
import json, sys, time
started = time.perf_counter()
from airflow.dag_processing.dagbag import DagBag
imported = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
parsed = time.perf_counter()
heavy = [m for m in sys.argv[2].split(",") if m in sys.modules]
dags = {
    dag_id: {
        "tasks": {t.task_id: sorted(a.name for a in t.outlets) for t in dag.tasks},
        "mapped": sorted(
            t.task_id for t in dag.tasks if type(t).__name__.endswith("MappedOperator")
        ),
        "params": sorted(dag.params.keys()),
    }
    for dag_id, dag in bag.dags.items()
}
print("RESULT " + json.dumps({
    "errors": {k: str(v) for k, v in bag.import_errors.items()},
    "dags": dags, "heavy": heavy, "airflow_import_s": imported - started,
    "parse_s": parsed - imported,
}))
"""


def _result(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout + proc.stderr)[-6000:]
        raise AssertionError(f"subprocess failed (rc {proc.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


@pytest.fixture(scope="session")
def airflow_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A migrated throwaway Airflow (SQLite), set in this process's environment for the session.

    Migrating costs about 10 s on a loaded 2-core machine, so it is done once.
    """
    if "airflow" in sys.modules:
        raise RuntimeError("airflow was imported before its test environment was set")
    home = tmp_path_factory.mktemp("airflow_home")
    settings = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
    }
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    try:
        started = time.perf_counter()
        proc = subprocess.run(
            [str(Path(sys.executable).with_name("airflow")), "db", "migrate"],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
        print(f"\nairflow db migrate: {time.perf_counter() - started:.1f} s")
        yield env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_dag(dag_id: str, logical_date: datetime | None, conf: dict[str, Any]) -> dict[str, Any]:
    """``dag.test()`` of one DAG: the run's state and each task's state, tries and seconds."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    assert bag.import_errors == {}
    dag = bag.dags[dag_id]
    for task in dag.tasks:
        task.retry_delay = timedelta(0)  # a retry runs at once instead of a minute later
    started = time.perf_counter()
    run = dag.test(logical_date=logical_date, run_conf=conf)
    seconds = time.perf_counter() - started
    tasks = {}
    for ti in run.get_task_instances():
        key = ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"
        tasks[key] = {
            "state": str(ti.state),
            "try_number": ti.try_number,
            "seconds": round(ti.duration or 0.0, 2),
        }
    per_task = ", ".join(f"{k} {v['seconds']:.1f}" for k, v in tasks.items())
    print(f"dag.test {dag_id} ({logical_date}): {seconds:.1f} s [{per_task}]")
    if str(run.state) != "success":
        raise AssertionError(f"{dag_id} ended {run.state}: {tasks}")
    return {"state": str(run.state), "seconds": seconds, "tasks": tasks}


def test_dag_files_parse_without_heavy_imports(airflow_env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PARSE_SCRIPT, str(DAGS_FOLDER), ",".join(HEAVY_MODULES)],
        env=airflow_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    result = _result(proc)
    print(
        f"DagBag: airflow import {result['airflow_import_s']:.2f} s, "
        f"parse of dags/ {result['parse_s']:.3f} s"
    )
    assert result["errors"] == {}
    assert result["heavy"] == [], f"imported while parsing: {result['heavy']}"
    assert set(result["dags"]) == {"solaris_precompute", "solaris_training"}
    precompute = result["dags"]["solaris_precompute"]
    assert list(precompute["tasks"]) == [
        "start",
        "drain_miss_queue",
        "generate_candidates",
        "plan",
        "precompute_shard",
        "aggregate_users",
        "fill_similar",
        "publish_coverage",
    ]
    assert precompute["mapped"] == ["precompute_shard"]
    assert precompute["tasks"]["precompute_shard"] == ["solaris_pair"]
    assert precompute["tasks"]["aggregate_users"] == ["solaris_user"]
    assert precompute["tasks"]["fill_similar"] == ["solaris_similar"]
    assert {"budget_pairs", "shards", "feature_repo", "models_dir", "pair_ttl_seconds"} <= set(
        precompute["params"]
    )
    training = result["dags"]["solaris_training"]
    assert training["tasks"]["train_fm"] == ["solaris_model_fm"]
    assert training["tasks"]["train_compressor"] == ["solaris_model_compressor"]
    assert training["tasks"]["train_vm"] == ["solaris_model_vm"]
    # Parsing both files (Airflow itself already imported) stays well under a second even on a
    # loaded machine; the scheduler does this every few minutes.
    assert result["parse_s"] < 5.0


@dataclass(frozen=True)
class Deployment:
    repo: Path
    models: Path


def make_feature_repo(path: Path, project: str) -> Path:
    """A Feast repo with the SOLARIS views applied (SQLite online store), like `feast apply`."""
    from feast import FeatureStore

    from solaris_feast.definitions import SolarisFeastConfig, solaris_definitions

    path.mkdir(parents=True)
    (path / "data").mkdir()
    (path / "feature_store.yaml").write_text(
        f"project: {project}\n"
        "provider: local\n"
        "registry:\n"
        "  registry_type: file\n"
        "  path: data/registry.db\n"
        "  cache_ttl_seconds: 0\n"
        "online_store:\n"
        "  type: sqlite\n"
        "  path: data/online.db\n"
        "offline_store:\n"
        "  type: file\n"
        "entity_key_serialization_version: 3\n"
    )
    config = SolarisFeastConfig(
        user_producing_dag="solaris_precompute", similar_producing_dag="solaris_precompute"
    )
    FeatureStore(repo_path=str(path)).apply(solaris_definitions(config).all())
    return path


def precompute_conf(deployment: Deployment) -> dict[str, Any]:
    return {
        "feature_repo": str(deployment.repo),
        "models_dir": str(deployment.models),
        "dataset": "synthetic",
        "dataset_size": "tiny",
        "budget_pairs": 600,
        "shards": 2,
        "candidates_per_user": 20,
        "fill_targets": 3000,
        "batch_size": 1024,
    }


def offline_rows(repo: Path) -> dict[str, int]:
    from solaris_feast.pipeline import offline_row_count

    return {
        v: offline_row_count(str(repo), v)
        for v in ("solaris_pair", "solaris_user", "solaris_similar")
    }


def test_training_then_precompute_serves_all_tiers_retries_a_shard_and_reruns_idempotently(
    airflow_env: dict[str, str],
    feast_project: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from feast import FeatureStore

    from solaris_feast.models.registry import list_cards, load_bundle
    from solaris_feast.serve import SolarisRetriever
    from solaris_feast.tiers import Tier

    deployment = Deployment(
        make_feature_repo(tmp_path / "repo", feast_project), tmp_path / "models"
    )

    # Training, as a manual run with no data interval.
    training = run_dag(
        "solaris_training",
        None,
        {
            "models_dir": str(deployment.models),
            "dataset": "synthetic",
            "dataset_size": "tiny",
            "train_window_hours": 12,
            "fm_epochs": 1,
            "compressor_epochs": 1,
            "vm_epochs": 1,
        },
    )
    assert {t: v["state"] for t, v in training["tasks"].items()} == {
        "start": "success",
        "train_fm": "success",
        "train_compressor": "success",
        "train_vm": "success",
    }
    cards = list_cards(deployment.models)
    assert sorted(c.kind for c in cards) == ["compressor", "fm", "vm"]
    bundle = load_bundle(deployment.models)
    assert bundle.compressor_card.parents == (bundle.fm_card.version,)

    # Precompute for the last whole hour; shard 1 fails on its first try and is retried.
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    monkeypatch.setenv("SOLARIS_FAIL_SHARD_ONCE", "1")
    first = run_dag("solaris_precompute", hour, precompute_conf(deployment))
    monkeypatch.delenv("SOLARIS_FAIL_SHARD_ONCE")
    tries = {k: (v["state"], v["try_number"]) for k, v in first["tasks"].items()}
    assert tries["precompute_shard[1]"] == ("success", 2)
    assert tries["precompute_shard[0]"] == ("success", 1)
    assert all(t["state"] == "success" for t in first["tasks"].values())
    run_dirs = list((deployment.repo / "data" / "precompute_runs").glob("*/*"))
    assert [d.name for d in run_dirs] == [bundle.vm_card.version]
    run_dir = run_dirs[0]
    assert (run_dir / "shard-1.failed-once").is_file()
    coverage = json.loads((run_dir / "coverage.json").read_text())
    assert coverage["embedding_version"] == bundle.embedding_version
    assert (
        coverage["fm_pairs"]
        == 600
        == coverage["plan"]["from_misses"] + coverage["plan"]["refreshes"] + coverage["plan"]["new"]
    )
    assert coverage["coverage"]["exact"] > 0
    assert coverage["coverage"]["similar"] > 0
    assert coverage["coverage"]["user"] > 0
    assert abs(sum(coverage["coverage"].values()) - 1.0) < 1e-9
    counts = offline_rows(deployment.repo)
    assert counts["solaris_pair"] == 600
    assert counts["solaris_user"] > 0 and counts["solaris_similar"] > 0

    # Serving: the retriever finds each tier, with the vector the DAG stored.
    store = FeatureStore(repo_path=str(deployment.repo))
    retriever = SolarisRetriever(
        store, bundle.embedding_version, record_misses=False, deadline_ms=5000
    )
    repo_pairs = _offline_frame(deployment.repo, "solaris_pair")
    similar = _offline_frame(deployment.repo, "solaris_similar")
    users = _offline_frame(deployment.repo, "solaris_user")
    exact_keys = set(zip(repo_pairs["user_id"], repo_pairs["item_id"], strict=True))
    similar_keys = set(zip(similar["user_id"], similar["item_id"], strict=True))
    user = int(similar["user_id"].iloc[0])
    similar_row = similar.loc[similar["user_id"] == user].iloc[0]
    exact_of_user = repo_pairs.loc[repo_pairs["user_id"] == user]
    assert len(exact_of_user), "a user with a similarity fill also has exact pairs (its index)"
    exact_row = exact_of_user.iloc[0]
    bare_item = next(
        i
        for i in range(bundle.schema.num_items)
        if (user, i) not in exact_keys and (user, i) not in similar_keys
    )
    items = [int(exact_row["item_id"]), int(similar_row["item_id"]), bare_item]
    fetched = retriever.fetch(user, items)
    assert fetched.error is False
    assert fetched.tiers.tolist() == [Tier.EXACT, Tier.SIMILAR, Tier.USER_AGG]
    user_row = users.loc[users["user_id"] == user].iloc[0]
    np.testing.assert_allclose(fetched.embeddings[0], np.asarray(exact_row["embedding"]), rtol=1e-6)
    np.testing.assert_allclose(
        fetched.embeddings[1], np.asarray(similar_row["embedding"]), rtol=1e-6
    )
    np.testing.assert_allclose(fetched.embeddings[2], np.asarray(user_row["embedding"]), rtol=1e-6)
    retriever.close()

    # Re-running the same interval adds no offline row and plans the same pairs again.
    second = run_dag("solaris_precompute", hour, precompute_conf(deployment))
    assert all(t["state"] == "success" for t in second["tasks"].values())
    assert offline_rows(deployment.repo) == counts
    again = json.loads((run_dir / "coverage.json").read_text())
    assert again["coverage"] == coverage["coverage"]
    assert again["fm_pairs"] == coverage["fm_pairs"]


def _offline_frame(repo: Path, view: str) -> pd.DataFrame:
    files = sorted((repo / "data" / "offline" / view).glob("*/part-*.parquet"))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def test_manual_run_without_data_interval_uses_its_run_time_and_id() -> None:
    from solaris_feast.pipeline import run_time

    queued = datetime(2026, 11, 30, 3, 7, 12, 500_000, tzinfo=UTC)
    now, key = run_time(None, None, None, queued, "manual__2026-11-30T03:07:12+00:00")
    assert now == datetime(2026, 11, 30, 3, 7, 12, tzinfo=UTC)
    assert key == "run_manual__2026-11-30T03_07_12_00_00"
    start = datetime(2026, 11, 30, 2, tzinfo=UTC)
    end = datetime(2026, 11, 30, 3, tzinfo=UTC)
    now, key = run_time(start, end, start, queued, "scheduled__x")
    assert now == end
    assert key == "20261130T020000Z_20261130T030000Z"
