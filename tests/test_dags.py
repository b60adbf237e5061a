"""The Airflow DAGs, run for real: parse, train, precompute, serve every tier, retry, re-run.

Airflow gets a throwaway ``AIRFLOW_HOME`` with a SQLite metadata database, migrated once per
session. The parse check runs in a subprocess (it needs a clean ``sys.modules``); ``dag.test()``
runs in this process, as a worker would run the tasks, against a Feast repo made in ``tmp_path``
with the solaris factories (SQLite online store). Airflow reads its configuration when it is
first imported, so nothing may import it before the ``airflow_env`` fixture has set the
environment (no other test module does).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd
import pytest

if TYPE_CHECKING:
    from feast import FeatureStore

REPO_ROOT = Path(__file__).resolve().parents[1]
DAGS_FOLDER = REPO_ROOT / "dags"
HEAVY_MODULES = (
    "torch",
    "faiss",
    "feast",
    "pandas",
    "solaris_feast.pipeline.precompute",
    "solaris_feast.pipeline.coverage",
    "solaris_feast.pipeline.training",
)

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
        "defaults": {k: dag.params.get_param(k).value for k in dag.params.keys()},
        "retries": {t.task_id: t.retries for t in dag.tasks},
        "backoff": {t.task_id: t.retry_exponential_backoff for t in dag.tasks},
        "timeouts": {t.task_id: t.execution_timeout.total_seconds() for t in dag.tasks},
        "timetable": type(dag.timetable).__name__,
        "schedule_assets": sorted(
            getattr(a, "name", "") for a in (getattr(c, "objects", None) or [c])
        ) if (c := getattr(dag.timetable, "asset_condition", None)) is not None else [],
    }
    for dag_id, dag in bag.dags.items()
}
print("RESULT " + json.dumps({
    "errors": {k: str(v) for k, v in bag.import_errors.items()},
    "dags": dags, "heavy": heavy, "airflow_import_s": imported - started,
    "parse_s": parsed - imported,
}))
"""


def _parse_dag_folder(env: dict[str, str]) -> dict[str, Any]:
    """The DAG folder parsed by Airflow's DagBag in a fresh process with ``env``: import
    errors, the DAGs' shape and which heavy modules the parse imported (:data:`PARSE_SCRIPT`)."""
    proc = subprocess.run(
        [sys.executable, "-c", PARSE_SCRIPT, str(DAGS_FOLDER), ",".join(HEAVY_MODULES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return _result(proc)


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


def run_dag(
    dag_id: str,
    logical_date: datetime | None,
    conf: dict[str, Any],
    expect: str = "success",
    timeouts: dict[str, timedelta] | None = None,
) -> dict[str, Any]:
    """``dag.test()`` of one DAG: the run's state and each task's state, tries and seconds;
    raises unless the run ends in ``expect``. ``timeouts``: execution_timeout by task id."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    assert bag.import_errors == {}
    dag = bag.dags[dag_id]
    for task in dag.tasks:
        task.retry_delay = timedelta(0)  # a retry runs at once instead of a minute later
        if timeouts and task.task_id in timeouts:
            task.execution_timeout = timeouts[task.task_id]
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
    if str(run.state) != expect:
        raise AssertionError(f"{dag_id} ended {run.state}, expected {expect}: {tasks}")
    return {"state": str(run.state), "seconds": seconds, "tasks": tasks}


def test_dag_files_parse_without_heavy_imports(airflow_env: dict[str, str]) -> None:
    result = _parse_dag_folder(airflow_env)
    print(
        f"DagBag: airflow import {result['airflow_import_s']:.2f} s, "
        f"parse of dags/ {result['parse_s']:.3f} s"
    )
    assert result["errors"] == {}
    assert result["heavy"] == [], f"imported while parsing: {result['heavy']}"
    assert set(result["dags"]) == {"solaris_precompute", "solaris_training", "solaris_promote"}
    precompute = result["dags"]["solaris_precompute"]
    # Runs on its cron or when a serving chain is promoted; publishes once per round, last.
    assert precompute["timetable"] == "AssetOrTimeSchedule"
    assert precompute["schedule_assets"] == ["solaris_serving_chain"]
    assert result["dags"]["solaris_promote"]["tasks"] == {"promote": ["solaris_serving_chain"]}
    assert result["dags"]["solaris_training"]["timetable"] == "CronTriggerTimetable"
    assert list(precompute["tasks"]) == [
        "start",
        "drain_miss_queue",
        "rank_shard",
        "split_budget",
        "precompute_shard",
        "aggregate_users",
        "fill_similar",
        "publish_coverage",
    ]
    assert precompute["tasks"]["publish_coverage"] == ["solaris_published"]
    assert precompute["mapped"] == ["precompute_shard", "rank_shard"]
    assert precompute["tasks"]["precompute_shard"] == ["solaris_pair"]
    assert precompute["tasks"]["aggregate_users"] == ["solaris_user"]
    assert precompute["tasks"]["fill_similar"] == ["solaris_similar"]
    from solaris_feast.pipeline.settings import PrecomputeSettings, TrainingSettings

    # Every setting of a precompute run is a param of the DAG, but the held-out tail (the
    # demo's) and the user's log, candidate tables and own models (the config file's).
    not_params = {"holdout_fraction", "log", "candidates", "fm", "verifier"}
    assert set(precompute["params"]) == set(PrecomputeSettings.model_fields) - not_params
    training = result["dags"]["solaris_training"]
    assert set(training["params"]) == set(TrainingSettings.model_fields) - not_params
    assert training["tasks"]["train_fm"] == ["solaris_model_fm"]
    assert training["tasks"]["train_compressor"] == ["solaris_model_compressor"]
    assert training["tasks"]["train_vm"] == ["solaris_model_vm"]
    # Parsing both files (Airflow itself already imported) stays well under a second even on a
    # loaded machine; the scheduler does this every few minutes.
    assert result["parse_s"] < 5.0


def test_dag_param_defaults_equal_the_settings_defaults(airflow_env: dict[str, str]) -> None:
    """Parsed with no SOLARIS_* path variables set: the path params default to the
    repository's own folders, every other param to the settings model's default."""
    from solaris_feast.pipeline.settings import (
        ENVIRONMENT_DEFAULTS,
        PrecomputeSettings,
        TrainingSettings,
    )

    env = {k: v for k, v in airflow_env.items() if k not in ENVIRONMENT_DEFAULTS.values()}
    dags = _parse_dag_folder(env)["dags"]
    paths = {
        "feature_repo": str(REPO_ROOT / "feature_repo"),
        "models_dir": str(REPO_ROOT / "models"),
    }
    for dag_id, model in (
        ("solaris_precompute", PrecomputeSettings),
        ("solaris_training", TrainingSettings),
    ):
        defaults = dags[dag_id]["defaults"]
        for name, value in defaults.items():
            info = model.model_fields[name]
            expected = paths[name] if info.is_required() else info.default
            assert value == expected, f"{dag_id}.{name}: param {value!r}, setting {expected!r}"
        # The param defaults validate into the settings as they stand.
        model.model_validate(defaults)
        # Retryable errors retry, with exponential backoff (final ones fail at once).
        assert set(dags[dag_id]["retries"].values()) == {2 if "precompute" in dag_id else 1}
        assert set(dags[dag_id]["backoff"].values()) == {2.0}
    # Every task has a time limit: the FM shards the long one, the training stages hours.
    timeouts = dags["solaris_precompute"]["timeouts"]
    assert timeouts.pop("precompute_shard") == timeouts.pop("rank_shard") == 3600
    assert set(timeouts.values()) == {900}
    assert set(dags["solaris_training"]["timeouts"].values()) == {4 * 3600}


def test_task_time_limits_and_retries_come_from_the_config_file(
    airflow_env: dict[str, str], tmp_path: Path
) -> None:
    """The config's airflow section sets each DAG's execution_timeout and retries when the
    scheduler parses it (a typo in it is refused, as everywhere in the config)."""
    from test_byo import config_dict, write_config

    raw = config_dict(
        tmp_path,
        airflow={
            "precompute": {"task_timeout_seconds": 120, "shard_timeout_seconds": 600, "retries": 4},
            "training": {"task_timeout_seconds": 7200, "retry_delay_seconds": 30},
        },
        schedules={
            "precompute": "*/5 * * * *",
            "precompute_on_promotion": False,
            "training_log_asset": "s3://shop-logs/impressions",
        },
    )
    env = {**airflow_env, "SOLARIS_CONFIG": str(write_config(tmp_path, raw))}
    result = _parse_dag_folder(env)
    assert result["errors"] == {}
    precompute = result["dags"]["solaris_precompute"]
    assert precompute["timeouts"].pop("precompute_shard") == 600
    assert precompute["timeouts"].pop("rank_shard") == 600
    assert set(precompute["timeouts"].values()) == {120}
    assert set(precompute["retries"].values()) == {4}
    training = result["dags"]["solaris_training"]
    assert set(training["timeouts"].values()) == {7200}
    assert set(training["retries"].values()) == {1}
    # The schedules section: precompute on its cron alone; training on its cron or the log.
    assert precompute["timetable"] == "CronTriggerTimetable"
    assert training["timetable"] == "AssetOrTimeSchedule"
    assert training["schedule_assets"] == ["s3://shop-logs/impressions"]

    from solaris_feast.config import load_config
    from solaris_feast.errors import ConfigError

    raw["airflow"]["precompute"]["task_timeout"] = 60
    with pytest.raises(ConfigError, match=r"airflow\.precompute\.task_timeout"):
        load_config(write_config(tmp_path, raw))

    # A bad value outside the two sections the DAG files read leaves every DAG parsed; the
    # start task, which reads the whole file at run time, refuses it naming the key. (Checked
    # whole at parse time it failed every DAG file's import; Airflow marked the DAGs stale and
    # a queued run's start never ran.)
    del raw["airflow"]["precompute"]["task_timeout"]
    raw["precompute"]["budget_pairs"] = -5
    env["SOLARIS_CONFIG"] = str(write_config(tmp_path, raw))
    bad_elsewhere = _parse_dag_folder(env)
    assert bad_elsewhere["errors"] == {}
    assert set(bad_elsewhere["dags"]) == set(result["dags"])
    assert bad_elsewhere["dags"]["solaris_precompute"]["timeouts"]["rank_shard"] == 600
    from solaris_feast.config import run_settings

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SOLARIS_CONFIG", env["SOLARIS_CONFIG"])
        with pytest.raises(ConfigError, match=r"precompute\.budget_pairs"):
            run_settings("precompute", {}, None, {})

    # Within the two sections, a bad key fails only the DAG files that read it: a precompute
    # retry count fails precompute and promote (which takes the precompute policy), a
    # precompute schedule the precompute DAG alone; training stays parsed (it was unloaded
    # with them, its queued runs hanging with every task unstarted).
    raw["precompute"]["budget_pairs"] = 300
    for key, value, broken in [
        (("airflow", "precompute", "retries"), -1, {"solaris_precompute.py", "solaris_promote.py"}),
        (("schedules", "precompute"), "every twenty minutes", {"solaris_precompute.py"}),
    ]:
        bad = copy.deepcopy(raw)
        section = bad.setdefault(key[0], {})
        for part in key[1:-1]:
            section = section.setdefault(part, {})
        section[key[-1]] = value
        env["SOLARIS_CONFIG"] = str(write_config(tmp_path, bad))
        one_bad = _parse_dag_folder(env)
        assert {Path(name).name for name in one_bad["errors"]} == broken, one_bad["errors"]
        assert all(".".join(key) in error for error in one_bad["errors"].values())
        assert "solaris_training" in one_bad["dags"]


def test_a_task_past_its_execution_timeout_is_killed_and_retried(
    airflow_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hung task body (a store that never answers) ends at its execution_timeout, and the
    timeout counts as retryable: the task is tried again, retries times, then fails."""
    from solaris_feast.pipeline import precompute

    hang_seconds = 240  # longer than three tries take on a loaded machine (about 100 s)

    def hangs(*args: Any, **kwargs: Any) -> Any:
        time.sleep(hang_seconds)

    monkeypatch.setattr(precompute, "start_precompute", hangs)
    conf = precompute_conf(tmp_path / "repo", tmp_path / "models")
    started = time.perf_counter()
    result = run_dag(
        "solaris_precompute", None, conf, expect="failed", timeouts={"start": timedelta(seconds=2)}
    )
    start = result["tasks"]["start"]
    assert (start["state"], start["try_number"]) == ("failed", 3)  # 1 + retries (2)
    # No try waited for the hung body to return (one that did would take hang_seconds alone).
    assert time.perf_counter() - started < hang_seconds


def test_dag_params_refuse_what_the_settings_refuse(airflow_env: dict[str, str]) -> None:
    """The params' JSON schemas carry the settings' types, bounds and choices, so the trigger
    form refuses a bad value before a run starts."""
    from airflow.sdk import Param
    from airflow.sdk.definitions.param import ParamValidationError
    from pydantic import ValidationError

    from solaris_feast.pipeline.settings import PrecomputeSettings, precompute_dag_params

    schemas = precompute_dag_params(REPO_ROOT)
    base = {"feature_repo": "repo", "models_dir": "models"}
    bad: dict[str, list[object]] = {
        "shards": [0, 1025, 2.5],
        "budget_pairs": [-1],
        "candidates_per_user": [0],
        "min_miss_score": [1.5, -0.1],
        "dataset": ["imdb"],
        "pair_ttl_seconds": [0, "600"],
        "feature_repo": [""],
        "align_log_to_run": ["yes"],
    }
    for name, values in bad.items():
        for value in values:
            with pytest.raises(ParamValidationError):
                Param(**schemas[name]).resolve(value)
            with pytest.raises(ValidationError):
                PrecomputeSettings.model_validate({**base, name: value}, strict=True)
    assert Param(**schemas["pair_ttl_seconds"]).resolve(None) is None
    assert Param(**schemas["pair_ttl_seconds"]).resolve(3600) == 3600
    assert schemas["shards"]["description"] == "Parallel precompute tasks (dynamic task mapping)."


TRAINING_CONF = {
    "dataset": "synthetic",
    "dataset_size": "tiny",
    "train_window_hours": 6,
    "fm_epochs": 1,
    "compressor_epochs": 1,
    "vm_epochs": 1,
}
BUDGET_PAIRS = 600


@dataclass(frozen=True)
class Trained:
    models: Path
    result: dict[str, Any]


@pytest.fixture(scope="module")
def trained(airflow_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """Models registered by one manual run (no data interval) of the training DAG."""
    models = tmp_path_factory.mktemp("models")
    return Trained(
        models, run_dag("solaris_training", None, {**TRAINING_CONF, "models_dir": str(models)})
    )


def own_models(trained: Trained, tmp_path: Path) -> Path:
    """A copy of the trained registry, so a test that registers more versions affects no other."""
    return Path(shutil.copytree(trained.models, tmp_path / "models"))


def make_feature_repo(
    path: Path,
    project: str,
    redis: bool = False,
    apply: bool = True,
    embedding_codec: str = "float32",
    **id_types: str,
) -> Path:
    """A Feast repo with the SOLARIS views applied, like `feast apply` (unless ``apply`` is
    False): SQLite in ``feature_store.yaml``, or Redis in ``feature_store.redis.yaml`` with its
    connection taken from ``SOLARIS_REDIS_CONNECTION`` as in ``feature_repo/``. ``id_types``:
    ``user_id_type`` / ``item_id_type`` of the entities (``int64`` or ``string``)."""
    from solaris_feast.store.definitions import SolarisFeastConfig, solaris_definitions

    path.mkdir(parents=True)
    (path / "data").mkdir()
    online = (
        "  type: redis\n  connection_string: ${SOLARIS_REDIS_CONNECTION}\n"
        if redis
        else "  type: sqlite\n  path: data/online.db\n"
    )
    (path / yaml_name(redis)).write_text(
        f"project: {project}\n"
        "provider: local\n"
        "registry:\n"
        "  registry_type: file\n"
        "  path: data/registry.db\n"
        "  cache_ttl_seconds: 0\n"
        f"online_store:\n{online}"
        "offline_store:\n"
        "  type: file\n"
        "entity_key_serialization_version: 3\n"
    )
    config = SolarisFeastConfig(
        user_producing_dag="solaris_precompute",
        similar_producing_dag="solaris_precompute",
        embedding_codec=embedding_codec,
        **id_types,
    )
    if apply:
        open_store(path, redis).apply(solaris_definitions(config).all())
    return path


def yaml_name(redis: bool) -> str:
    return "feature_store.redis.yaml" if redis else "feature_store.yaml"


def open_store(repo: Path, redis: bool = False) -> FeatureStore:
    from feast import FeatureStore

    return FeatureStore(repo_path=str(repo), fs_yaml_file=repo / yaml_name(redis))


def precompute_conf(repo: Path, models: Path, **overrides: Any) -> dict[str, Any]:
    return {
        "feature_repo": str(repo),
        "models_dir": str(models),
        "dataset": "synthetic",
        "dataset_size": "tiny",
        "budget_pairs": BUDGET_PAIRS,
        "shards": 2,
        "candidates_per_user": 20,
        # 5 times the budget, capped: the tiny world's rounds then serve every tier.
        "fill_targets_per_budget": 5.0,
        "fill_targets": 3000,
        "batch_size": 1024,
        **overrides,
    }


def last_hour() -> datetime:
    """A logical date whose data interval ends before now, so stored vectors are fresh."""
    return datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)


def offline_rows(repo: Path) -> dict[str, int]:
    from solaris_feast.store.offline import offline_row_count

    store = open_store(repo)
    views = ("solaris_pair", "solaris_user", "solaris_similar")
    return {v: offline_row_count(store, v) for v in views}


def offline_frame(repo: Path, view: str) -> pd.DataFrame:
    files = sorted((repo / "data" / "offline" / view).glob("*/part-*.parquet"))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def run_dirs(repo: Path) -> list[Path]:
    return sorted((repo / "data" / "precompute_runs").glob("*/*"))


def coverage_of(run_dir: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((run_dir / "coverage.json").read_text())
    return report


def test_training_dag_registers_an_fm_compressor_vm_chain(trained: Trained) -> None:
    from solaris_feast.models.registry import list_cards, load_bundle

    assert {t: v["state"] for t, v in trained.result["tasks"].items()} == {
        "start": "success",
        "train_fm": "success",
        "train_compressor": "success",
        "train_vm": "success",
    }
    cards = list_cards(trained.models)
    assert sorted(c.kind for c in cards) == ["compressor", "fm", "vm"]
    bundle = load_bundle(trained.models)
    assert bundle.compressor_card.parents == (bundle.fm_card.version,)
    assert bundle.vm_card.parents == (bundle.compressor_card.version,)
    start, end = bundle.fm_card.train_window_start, bundle.fm_card.train_window_end
    assert start is not None and end is not None
    window = end - start
    assert timedelta(hours=5) < window <= timedelta(hours=6)


def test_a_training_run_of_the_same_time_with_other_settings_is_refused_once_it_registered(
    tmp_path: Path,
) -> None:
    """A stage returns the card an earlier try of its run registered: another FM option or
    code_dim at the same time was ignored, and the old chain reported as the new one."""
    from solaris_feast.errors import ConfigError
    from solaris_feast.pipeline import training

    models = tmp_path / "models"
    interval = {
        "data_interval_start": None,
        "data_interval_end": None,
        "logical_date": datetime(2026, 3, 10, 12, tzinfo=UTC),
        "run_after": None,
        "run_id": "manual__retrain",
    }
    first = {**TRAINING_CONF, "models_dir": str(models), "code_dim": 16}
    other = {**first, "code_dim": 8}
    training.start_training(first, interval)
    # Nothing registered yet (a try that failed on a typo): corrected settings go ahead.
    run = training.start_training(other, interval)
    training.train_foundation_stage(run)

    with pytest.raises(ConfigError, match=r"code_dim: 8 then, 16 now.*another time"):
        training.start_training(first, interval)
    assert training.start_training(other, interval) == run  # a retry with its own settings
    # A run folder from before the record: its cards are reused with a warning, and no record
    # of today's settings is written (it would refuse the settings the cards were made with).
    record = models / ".training_runs" / run["interval_key"] / "settings.json"
    record.unlink()
    training.start_training(first, interval)
    assert not record.exists()
    training.start_training(other, interval)


def test_precompute_serves_every_tier_survives_a_failed_shard_and_reruns_idempotently(
    trained: Trained, feast_project: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from solaris_feast.models.registry import load_bundle
    from solaris_feast.review.lineage import build_lineage
    from solaris_feast.serving.retriever import SolarisRetriever
    from solaris_feast.tiers import Tier

    models = own_models(trained, tmp_path)
    repo = make_feature_repo(tmp_path / "repo", feast_project)
    bundle = load_bundle(models)
    hour = last_hour()

    # Shard 1 loses its store on its first try (a retryable error); its retry, alone, completes
    # the run. The fault is injected from outside the task body, in this (the worker's) process.
    from solaris_feast.errors import RetryableStoreError
    from solaris_feast.pipeline import precompute

    real_shard = precompute.precompute_shard
    calls: list[int] = []

    def shard_failing_once(run: dict[str, Any], shard_index: int) -> Any:
        calls.append(shard_index)
        if shard_index == 1 and calls.count(1) == 1:
            raise RetryableStoreError("injected: the online store went away")
        return real_shard(run, shard_index)

    monkeypatch.setattr(precompute, "precompute_shard", shard_failing_once)
    first = run_dag("solaris_precompute", hour, precompute_conf(repo, models))
    monkeypatch.setattr(precompute, "precompute_shard", real_shard)
    tries = {k: (v["state"], v["try_number"]) for k, v in first["tasks"].items()}
    assert tries["precompute_shard[1]"] == ("success", 2)
    assert tries["precompute_shard[0]"] == ("success", 1)
    assert sorted(calls) == [0, 1, 1]
    assert all(state == "success" for state, _ in tries.values())
    [run_dir] = run_dirs(repo)
    assert run_dir.name == bundle.vm_card.version
    coverage = coverage_of(run_dir)
    plan = coverage["plan"]
    assert coverage["embedding_version"] == bundle.embedding_version
    assert (
        coverage["fm_pairs"]
        == BUDGET_PAIRS
        == plan["from_misses"] + plan["refreshes"] + plan["new"]
    )
    assert min(coverage["coverage"][t] for t in ("exact", "similar", "user")) > 0
    assert sum(coverage["coverage"].values()) == pytest.approx(1.0)
    # The fill got 5 times the planned pairs, capped at 3,000, and says so in the round's record.
    fill = coverage["fill"]
    assert fill["planned_pairs"] == BUDGET_PAIRS and fill["targets_per_budget"] == 5.0
    assert fill["over_budget_targets"] == min(5 * BUDGET_PAIRS, 3000, plan["over_budget"]) > 0
    assert fill["targets"] <= fill["over_budget_targets"] + fill["queued_misses"]
    assert 0 < fill["filled"] <= fill["targets"]
    # Sharded by user end to end: each shard's candidates and plan hold its own users only,
    # the shards' budgets add up to the round's, and each shard's FM task wrote its plan.
    from solaris_feast.precompute.plan import shard_of_users

    assert sum(coverage["budgets"]) == BUDGET_PAIRS and len(coverage["budgets"]) == 2
    for index in range(2):
        folder = run_dir / "shards" / str(index)
        for table in ("candidates.parquet", "plan/pairs.parquet"):
            owners = shard_of_users(pd.read_parquet(folder / table)["user_id"].to_numpy(), 2)
            assert len(owners) and (owners == index).all(), (index, table)
        planned = len(pd.read_parquet(folder / "plan" / "pairs.parquet"))
        assert planned == coverage["budgets"][index] == coverage["shards"][index]["pairs"]
    for view in open_store(repo).list_feature_views():
        assert view.tags["solaris.fm_version"] == bundle.fm_card.version
        assert view.tags["solaris.compressor_version"] == bundle.embedding_version
        assert view.tags["solaris.verifier_version"] == bundle.vm_card.version
    # The lineage review traces every view to this DAG and these models, and finds no problem.
    review = build_lineage(repo, models, DAGS_FOLDER)
    assert [f for f in review.findings if f.severity == "error"] == []
    counts = offline_rows(repo)
    assert counts["solaris_pair"] == BUDGET_PAIRS
    assert counts["solaris_user"] > 0 and counts["solaris_similar"] > 0

    # Serving: the retriever finds each tier, holding the vector the DAG stored.
    exact = offline_frame(repo, "solaris_pair")
    similar = offline_frame(repo, "solaris_similar")
    users = offline_frame(repo, "solaris_user")
    user = int(similar["user_id"].iloc[0])
    similar_row = similar.loc[similar["user_id"] == user].iloc[0]
    exact_row = exact.loc[exact["user_id"] == user].iloc[0]  # it is in the index: it has pairs
    user_row = users.loc[users["user_id"] == user].iloc[0]
    taken = set(exact.loc[exact["user_id"] == user, "item_id"]) | set(
        similar.loc[similar["user_id"] == user, "item_id"]
    )
    bare_item = min(set(range(bundle.schema.num_items)) - taken)
    retriever = SolarisRetriever(
        open_store(repo), bundle.embedding_version, record_misses=False, deadline_ms=5000
    )
    items = [int(exact_row["item_id"]), int(similar_row["item_id"]), bare_item]
    fetched = retriever.fetch(user, items)
    retriever.close()
    assert fetched.error is False
    assert fetched.tiers.tolist() == [Tier.EXACT, Tier.SIMILAR, Tier.USER_AGG]
    for got, row in zip(fetched.embeddings, (exact_row, similar_row, user_row), strict=True):
        np.testing.assert_allclose(got, np.asarray(row["embedding"]), rtol=1e-6)
    # Plain Feast agrees through the resolved view, re-applied with its new version tag.
    native = (
        open_store(repo)
        .get_online_features(
            features=["solaris_resolved:resolved_tier"],
            entity_rows=[
                {"user_id": user, "item_id": i, "solaris_model_version": bundle.embedding_version}
                for i in items
            ],
            full_feature_names=True,
        )
        .to_dict()
    )
    assert native["solaris_resolved__resolved_tier"] == [Tier.EXACT, Tier.SIMILAR, Tier.USER_AGG]

    # A re-run of the same interval plans the same pairs and adds no offline row.
    fill_report = (run_dir / "fill.json").read_text()
    second = run_dag("solaris_precompute", hour, precompute_conf(repo, models))
    assert all(t["state"] == "success" for t in second["tasks"].values())
    assert offline_rows(repo) == counts
    assert run_dirs(repo) == [run_dir]
    again = coverage_of(run_dir)
    assert (again["coverage"], again["fm_pairs"]) == (coverage["coverage"], coverage["fm_pairs"])
    # The fill's report stays the round's, as coverage.json does (a re-run found its offline
    # files written and reported 0, disagreeing with coverage.json).
    assert (run_dir / "fill.json").read_text() == fill_report

    # A manual run has no data interval: it plans for its own time, in its own folder, and
    # skips the pairs whose vectors are still fresh.
    run_dag("solaris_precompute", None, precompute_conf(repo, models))
    manual = [d for d in run_dirs(repo) if d != run_dir]
    assert len(manual) == 1 and manual[0].parent.name.startswith("run_manual")
    assert coverage_of(manual[0])["plan"]["skipped_fresh"] > 0
    assert offline_rows(repo)["solaris_pair"] == counts["solaris_pair"] + BUDGET_PAIRS


IDLE_TASKS_SCRIPT = """
import json, sys
from solaris_feast.pipeline import coverage, precompute
conf, interval = json.loads(open(sys.argv[1]).read())
run = precompute.start_precompute(conf, interval)
out = {"run": run, "misses": precompute.drain_miss_queue(run)}
out["rankings"] = [precompute.rank_shard(run, i) for i in range(run["settings"]["shards"])]
out["plan"] = precompute.split_round_budget(run)
out["shards"] = [precompute.precompute_shard(run, i) for i in out["plan"]["shard_indexes"]]
out["users"] = precompute.aggregate_users(run)
out["filled"] = precompute.fill_similar(run)
out["coverage"] = coverage.publish_coverage(run)
heavy = [m for m in ("torch", "feast", "faiss") if m in sys.modules]
print("RESULT " + json.dumps({"out": out, "heavy": heavy}, default=str))
"""


def test_a_round_with_nothing_to_compute_loads_no_model_and_no_feast(
    trained: Trained, feast_project: str, tmp_path: Path, airflow_env: dict[str, str]
) -> None:
    """Five minutes after a round that computed every candidate, nothing is stale: the plan
    scores no pair (the VM is not loaded), the shards are empty, no aggregate changed, nothing
    is filled, and no task imports torch, feast or faiss (each would cost its task process
    seconds under a real executor): ``start`` reuses the registry snapshot of the first round,
    whose registry file has not changed, and ``drain_miss_queue`` reads the online store's
    address from the yaml."""
    models = own_models(trained, tmp_path)
    repo = make_feature_repo(tmp_path / "repo", feast_project)
    conf = precompute_conf(repo, models, budget_pairs=100_000)
    hour = last_hour()
    run_dag("solaris_precompute", hour, conf)
    counts = offline_rows(repo)
    [first] = run_dirs(repo)
    assert coverage_of(first)["plan"]["over_budget"] == 0  # every candidate was computed

    later = {
        "data_interval_start": None,
        "data_interval_end": None,
        "logical_date": (hour + timedelta(minutes=5)).isoformat(),
        "run_after": None,
        "run_id": "idle",
    }
    spec_path = tmp_path / "run.json"
    spec_path.write_text(json.dumps([conf, later], default=str))
    proc = subprocess.run(
        [sys.executable, "-c", IDLE_TASKS_SCRIPT, str(spec_path)],
        env=airflow_env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    result = _result(proc)
    out = result["out"]
    run = out["run"]
    assert result["heavy"] == [], f"imported on a round with nothing to compute: {result['heavy']}"
    assert out["misses"] == {"misses": 0, "reused": False}
    assert out["plan"]["planned"] == 0
    assert [r["scored"] for r in out["rankings"]] == [0, 0]
    assert all(r["skipped_fresh"] > 0 for r in out["rankings"])
    assert [s["pairs"] for s in out["shards"]] == [0, 0]
    assert out["users"]["written"] == 0 and out["users"]["unchanged"] > 0
    assert out["filled"]["filled"] == 0
    assert out["filled"]["planned_pairs"] == out["filled"]["over_budget_targets"] == 0
    assert out["coverage"]["views_retagged"] == []
    assert offline_rows(repo) == counts  # nothing appended anywhere
    # Served as before: the round's coverage is the previous round's.
    idle = coverage_of(Path(run["run_dir"]))
    assert idle["coverage"] == coverage_of(first)["coverage"]

    # feast apply rewrites the registry: the next round's start reads it through Feast again.
    from solaris_feast.pipeline import precompute
    from solaris_feast.pipeline.registry_snapshot import read_snapshot
    from solaris_feast.store.config import open_repo_store

    store = open_repo_store(repo)
    view = store.get_feature_view("solaris_pair")
    view.tags["owner"] = "re-applied"
    store.apply([view])
    after_apply = {**later, "logical_date": hour + timedelta(minutes=10), "run_id": "re_applied"}
    spec = precompute.start_precompute(conf, after_apply)
    snapshot = read_snapshot(Path(spec["run_dir"]))
    assert snapshot is not None and snapshot.view("solaris_pair").tags["owner"] == "re-applied"


def test_task_wrapper_fails_final_errors_at_once_and_lets_retryable_ones_retry(
    airflow_env: dict[str, str],
) -> None:
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

    from solaris_feast.errors import RetryableStoreError, ViewsNotAppliedError
    from solaris_feast.pipeline.failures import fail_fast_on_final_errors

    def raising(exc: Exception) -> Any:
        @fail_fast_on_final_errors
        def body(value: int) -> int:
            raise exc

        return body

    @fail_fast_on_final_errors
    def works(value: int) -> int:
        return value + 1

    assert works(1) == 2
    down = RetryableStoreError("redis at 127.0.0.1:1 refused the connection")
    with pytest.raises(RetryableStoreError) as kept:
        raising(down)(1)
    assert kept.value is down  # unchanged: Airflow retries it
    final = ViewsNotAppliedError("/srv/repo", ["solaris_pair"])
    with pytest.raises(AirflowFailException, match="run `feast apply` in /srv/repo") as failed:
        raising(final)(1)
    assert failed.value.__cause__ is final
    with pytest.raises(AirflowFailException, match="ValueError: bad plan"):
        raising(ValueError("bad plan"))(1)
    with pytest.raises(AirflowSkipException):  # Airflow's own signals keep their meaning
        raising(AirflowSkipException("nothing to do"))(1)


def test_precompute_on_a_repo_never_applied_fails_once_naming_feast_apply(
    airflow_env: dict[str, str],
    feast_project: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """No retry can apply the views: the first task fails on its first try, and says so (the
    views are checked before the models are looked for)."""
    repo = make_feature_repo(tmp_path / "repo", feast_project, apply=False)
    conf = precompute_conf(repo, tmp_path / "models")
    result = run_dag("solaris_precompute", last_hour(), conf, expect="failed")
    start = result["tasks"]["start"]
    assert (start["state"], start["try_number"]) == ("failed", 1)
    assert all(t["state"] != "success" for t in result["tasks"].values())
    assert run_dirs(repo) == []
    # The task's log (printed by dag.test) ends in Airflow's no-retry exception with our message.
    logged = "".join(capfd.readouterr())
    assert (
        "AirflowFailException: ViewsNotAppliedError: the Feast registry of "
        f"{repo.resolve()} has no feature view solaris_pair, solaris_user, solaris_similar: "
        f"run `feast apply` in {repo.resolve()}"
    ) in logged


def test_new_model_version_is_picked_up_and_replans_every_pair(
    trained: Trained, feast_project: str, tmp_path: Path
) -> None:
    from solaris_feast.models.registry import load_bundle

    models = own_models(trained, tmp_path)
    repo = make_feature_repo(tmp_path / "repo", feast_project)
    hour = last_hour()
    run_dag("solaris_precompute", hour, precompute_conf(repo, models))
    old = load_bundle(models)

    run_dag("solaris_training", None, {**TRAINING_CONF, "models_dir": str(models), "seed": 1})
    new = load_bundle(models)
    assert new.embedding_version != old.embedding_version

    # The same interval again: the new VM gets its own run folder and a full re-plan, since
    # vectors of the old compressor count as absent.
    run_dag("solaris_precompute", hour, precompute_conf(repo, models))
    assert [d.name for d in run_dirs(repo)] == sorted([old.vm_card.version, new.vm_card.version])
    report = coverage_of(
        run_dirs(repo)[[d.name for d in run_dirs(repo)].index(new.vm_card.version)]
    )
    assert report["embedding_version"] == new.embedding_version
    assert report["plan"]["new"] == BUDGET_PAIRS
    assert report["plan"]["skipped_fresh"] == 0 and report["plan"]["refreshes"] == 0
    versions = offline_frame(repo, "solaris_pair")["model_version"].value_counts().to_dict()
    assert versions == {old.embedding_version: BUDGET_PAIRS, new.embedding_version: BUDGET_PAIRS}
    # The first round of the repo expected no offline logs; the second, after one published, does.
    first_round = {
        d.name: json.loads((d / "manifest.json").read_text())["first_round"] for d in run_dirs(repo)
    }
    assert first_round == {old.vm_card.version: True, new.vm_card.version: False}


def _serving_chain_events() -> list[dict[str, Any]]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(AssetEvent.extra, AssetEvent.source_dag_id)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetModel.name == "solaris_serving_chain")
            .order_by(AssetEvent.id)
        ).all()
    return [{"extra": dict(extra), "source_dag_id": dag_id} for extra, dag_id in rows]


def _queued_for(dag_id: str) -> list[str]:
    from airflow.models.asset import AssetDagRunQueue, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return list(
            session.scalars(
                select(AssetModel.name)
                .join(AssetDagRunQueue, AssetDagRunQueue.asset_id == AssetModel.id)
                .where(AssetDagRunQueue.target_dag_id == dag_id)
            )
        )


def _set_paused(dag_id: str, paused: bool) -> None:
    from airflow.models.asset import AssetDagRunQueue
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import delete, update

    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id == dag_id).values(is_paused=paused))
        if paused:
            session.execute(
                delete(AssetDagRunQueue).where(AssetDagRunQueue.target_dag_id == dag_id)
            )


def test_a_promotion_marks_the_serving_chain_asset_and_queues_a_precompute_round(
    trained: Trained, tmp_path: Path, feast_project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Promoting through the solaris_promote DAG or `solaris promote` (where AIRFLOW_HOME names
    the deployment) marks solaris_serving_chain with the chain; the scheduler then starts the
    unpaused precompute DAG on it, without waiting for the next tick."""
    from test_byo import config_dict, run_cli, write_config

    from solaris_feast.models.cards import read_serving_alias
    from solaris_feast.models.registry import load_bundle

    monkeypatch.delenv("SOLARIS_CONFIG", raising=False)
    models = own_models(trained, tmp_path)
    vm = load_bundle(models).vm_card.version
    before = len(_serving_chain_events())
    refused = run_dag("solaris_promote", None, {"models_dir": str(models)}, expect="failed")
    assert refused["tasks"]["promote"]["try_number"] == 1  # no VM named: final, no retry
    run_dag("solaris_promote", None, {"vm": vm, "models_dir": str(models)})
    alias = read_serving_alias(models)
    assert alias is not None and alias.vm == vm
    events = _serving_chain_events()[before:]
    assert [e["source_dag_id"] for e in events] == ["solaris_promote"]
    assert events[0]["extra"]["vm"] == vm
    assert events[0]["extra"]["models_dir"] == str(models)

    # The command marks the asset itself; the unpaused precompute DAG is queued on it.
    raw = config_dict(tmp_path, models={"dir": str(models)})
    config = write_config(tmp_path, raw)
    _set_paused("solaris_precompute", False)
    try:
        out = run_cli("promote", "--config", str(config), "--vm", vm, "--no-check")
        assert "marked Airflow asset solaris_serving_chain" in out
        assert _queued_for("solaris_precompute") == ["solaris_serving_chain"]
    finally:
        _set_paused("solaris_precompute", True)
    events = _serving_chain_events()[before:]
    assert len(events) == 2 and events[1]["source_dag_id"] is None  # from the command
    assert events[1]["extra"]["vm"] == vm
    # --no-airflow: the alias only.
    out = run_cli("promote", "--config", str(config), "--vm", vm, "--no-check", "--no-airflow")
    assert "marked Airflow asset" not in out
    assert len(_serving_chain_events()[before:]) == 2


@pytest.mark.parametrize("online", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_queued_misses_go_first_and_leave_the_queue_after_the_run(
    trained: Trained,
    feast_project: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    online: str,
) -> None:
    """Read through the queue's consumer group, acknowledged after the writes: on SQLite as on
    Redis (SQLite used to delete them when drained, so a round that failed lost them)."""
    from solaris_feast.models.registry import load_bundle
    from solaris_feast.serving.miss_queue import MissQueue
    from solaris_feast.serving.retriever import SolarisRetriever
    from solaris_feast.store.config import redis_connection_string
    from solaris_feast.tiers import Tier

    models = own_models(trained, tmp_path)
    redis = online == "redis"
    if redis:
        redis_url = request.getfixturevalue("redis_url")
        monkeypatch.setenv("SOLARIS_REDIS_CONNECTION", redis_connection_string(redis_url))
    repo = make_feature_repo(tmp_path / "repo", feast_project, redis=redis)
    bundle = load_bundle(models)
    store = open_store(repo, redis=redis)
    retriever = SolarisRetriever(store, bundle.embedding_version, deadline_ms=5000)
    user, items = 7, [3, 11, 19, 42]
    assert retriever.fetch(user, items).tiers.tolist() == [Tier.ZERO] * len(items)
    retriever.close()
    queue = MissQueue.for_store(store)
    assert queue.pending() == len(items)

    conf = precompute_conf(
        repo,
        models,
        feature_store_yaml=yaml_name(redis=redis),
        min_miss_score=0.0,
        budget_pairs=100,
        user_balanced_plan=True,
    )
    # A manual run for a moment within the live lag: a round for the last hour would leave
    # the queue to the live rounds (takes_live_misses).
    run_dag("solaris_precompute", datetime.now(UTC).replace(microsecond=0), conf)
    [run_dir] = run_dirs(repo)
    assert coverage_of(run_dir)["plan"]["from_misses"] == len(items)
    # Read through the group (entry ids to acknowledge), not drained off the queue.
    assert "entry_id" in pd.read_parquet(run_dir / "misses.parquet").columns
    assert queue.pending() == 0  # acknowledged once the run's writes were done
    reader = SolarisRetriever(
        store, bundle.embedding_version, record_misses=False, deadline_ms=5000
    )
    assert reader.fetch(user, items).tiers.tolist() == [Tier.EXACT] * len(items)
    reader.close()


def test_manual_run_without_data_interval_uses_its_run_time_and_id() -> None:
    from solaris_feast.pipeline.runs import run_time

    queued = datetime(2026, 11, 30, 3, 7, 12, 500_000, tzinfo=UTC)
    now, key = run_time(None, None, None, queued, "manual__2026-11-30T03:07:12+00:00")
    assert now == datetime(2026, 11, 30, 3, 7, 12, tzinfo=UTC)
    assert key == "run_manual__2026-11-30T03_07_12_00_00"
    start = datetime(2026, 11, 30, 2, tzinfo=UTC)
    end = datetime(2026, 11, 30, 3, tzinfo=UTC)
    now, key = run_time(start, end, start, queued, "scheduled__x", "scheduled")
    assert now == end
    assert key == "20261130T020000Z_20261130T030000Z"
    # Airflow 3 gives a manual run triggered for a logical date the interval of the trigger's
    # time: the run works for its logical date (it planned for the trigger's time before).
    triggered = datetime(2026, 11, 30, 16, 30, tzinfo=UTC)
    now, key = run_time(
        triggered, triggered, start, triggered, "manual__2026-11-30T02:00:00+00:00", "manual"
    )
    assert now == start
    assert key == "20261130T020000Z_20261130T020000Z"
    # The task context's run type (Airflow's enum) reaches run_time as its plain value.
    from types import SimpleNamespace

    from airflow.utils.types import DagRunType

    from solaris_feast.pipeline.runs import interval_of

    context = {
        "data_interval_start": triggered,
        "data_interval_end": triggered,
        "logical_date": start,
        "dag_run": SimpleNamespace(run_after=triggered, run_type=DagRunType.MANUAL),
        "run_id": "manual__2026-11-30T02:00:00+00:00",
    }
    assert interval_of(context)["run_type"] == "manual"
    assert run_time(**interval_of(context))[0] == start


def test_a_round_counts_the_ticks_skipped_since_the_previous_round_and_a_late_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A round that overran its hour makes Airflow drop the ticks that came due meanwhile
    (max_active_runs=1, no catch-up): the next round says how many, and whether it started
    after its own next tick. Manual and asset-triggered rounds are on no tick."""
    from types import SimpleNamespace

    from solaris_feast.pipeline.runs import round_ticks, schedule_ticks

    tick = datetime(2026, 11, 30, 5, tzinfo=UTC)
    hour, seconds = timedelta(hours=1), timedelta(seconds=3)
    on_time = schedule_ticks("@hourly", tick, tick - hour, tick + seconds)
    assert on_time is not None
    assert (on_time["skipped_ticks"], on_time["late"]) == (0, False)
    assert on_time["started_late_seconds"] == 3.0
    gap = schedule_ticks("@hourly", tick, tick - timedelta(hours=3), tick + timedelta(minutes=61))
    assert gap is not None
    assert (gap["skipped_ticks"], gap["late"]) == (2, True)
    minutely = schedule_ticks("* * * * *", tick, tick - timedelta(minutes=1), None)
    assert minutely is not None and minutely["skipped_ticks"] == 0 and not minutely["late"]
    assert schedule_ticks("@once", tick, None, None) is None

    def dag_run(run_type: str, at: datetime, started: datetime | None = None) -> Any:
        return SimpleNamespace(
            run_type=run_type,
            data_interval_end=at,
            logical_date=at,
            run_after=at,
            start_date=started,
        )

    previous = dag_run("scheduled", tick - timedelta(hours=2))
    with caplog.at_level("WARNING", logger="solaris_feast.pipeline.runs"):
        late = round_ticks("@hourly", dag_run("scheduled", tick, tick), previous)
    assert late is not None and late["skipped_ticks"] == 1
    assert "1 tick(s) of @hourly skipped" in caplog.text
    assert round_ticks("@hourly", dag_run("manual", tick, tick), previous) is None
    assert round_ticks("@hourly", dag_run("asset_triggered", tick, tick), previous) is None
    first = round_ticks("@hourly", dag_run("scheduled", tick, tick), None)
    assert first is not None and first["previous_run_at"] is None and first["skipped_ticks"] == 0


def test_precompute_settings_refuse_typos_and_a_refresh_margin_beyond_the_ttl() -> None:
    from pydantic import ValidationError

    from solaris_feast.pipeline.settings import PrecomputeSettings

    base = {"feature_repo": "repo", "models_dir": "models"}
    assert PrecomputeSettings.model_validate(base).shards == 4
    with pytest.raises(ValidationError, match="budget_pair"):
        PrecomputeSettings.model_validate({**base, "budget_pair": 10})
    with pytest.raises(ValidationError, match="refresh_margin_seconds"):
        PrecomputeSettings.model_validate(
            {**base, "pair_ttl_seconds": 600, "refresh_margin_seconds": 600}
        )
    with pytest.raises(ValidationError, match="shards"):
        PrecomputeSettings.model_validate({**base, "shards": 0})


def test_plan_scores_weigh_the_verifier_by_the_retrieval_score(trained: Trained) -> None:
    from solaris_feast.data.datasets import load_dataset
    from solaris_feast.models.interface import ChainModels
    from solaris_feast.models.registry import load_bundle
    from solaris_feast.pipeline.precompute import planning_scores
    from solaris_feast.precompute.candidates import CandidateConfig, generate_candidates
    from solaris_feast.precompute.plan import request_score
    from solaris_feast.precompute.returns import return_weights

    dataset = load_dataset("synthetic", "tiny")
    bundle = ChainModels.reference(load_bundle(trained.models))
    now = dataset.interactions["event_timestamp"].max().ceil("h")
    candidates = generate_candidates(
        dataset.interactions, now, CandidateConfig(candidates_per_user=20), items=dataset.items
    )
    vm_only = planning_scores(bundle, dataset, candidates, now, 0.0)["verifier_score"].to_numpy()
    assert ((vm_only > 0) & (vm_only < 1)).all()
    weighted = planning_scores(bundle, dataset, candidates, now, 1.0)
    assert weighted[["user_id", "item_id"]].equals(candidates[["user_id", "item_id"]])
    expected = request_score(
        candidates["user_id"].to_numpy(), vm_only, candidates["candidate_score"].to_numpy()
    )
    np.testing.assert_allclose(weighted["verifier_score"].to_numpy(), expected)
    assert not np.allclose(expected, vm_only)  # retrieval reorders what the VM alone would plan
    # A user's own candidate table without retrieval scores is planned by the verifier alone.
    own = candidates.drop(columns=["candidate_score"])
    np.testing.assert_allclose(
        planning_scores(bundle, dataset, own, now, 1.0)["verifier_score"].to_numpy(), vm_only
    )
    # With a horizon, each user's expected returns, learned from the log the round read, too.
    returning = planning_scores(
        bundle,
        dataset,
        candidates,
        now,
        1.0,
        return_horizon_seconds=6 * 3600,
        return_weight_exponent=2.0,
    )["verifier_score"].to_numpy()
    weight = return_weights(
        candidates["user_id"].to_numpy(), dataset.interactions, now, 6 * 3600, 2.0
    )
    np.testing.assert_allclose(returning, expected * weight)
    assert not np.allclose(weight, weight[0])  # users differ in when they were last seen


def test_precompute_dag_takes_its_settings_from_solaris_config_and_a_manual_param_overrides(
    airflow_env: dict[str, str],
    feast_project: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """With SOLARIS_CONFIG set, the DAG reads the user's log, repo and models from the config at
    run time (the params' defaults name the code checkout's folders, which are not used); a
    param the run sets overrides the config. A VM trained on another log fails the run's first
    task once, naming the mismatch."""
    from test_byo import config_dict, own_deployment, run_cli, write_config

    from solaris_feast.models.cards import list_cards
    from solaris_feast.serving.retriever import SolarisRetriever
    from solaris_feast.tiers import Tier

    # Dense ids: a chain sized for 60 users cannot score the other deployment's 180.
    dense = {"id_space": "dense"}
    config = own_deployment(tmp_path / "own", feast_project, log=dense)
    monkeypatch.delenv("SOLARIS_CONFIG", raising=False)
    run_cli("train", "--config", str(config))
    [vm] = [c for c in list_cards(tmp_path / "own" / "models") if c.kind == "vm"]
    run_cli("promote", "--config", str(config), "--vm", vm.version)
    monkeypatch.setenv("SOLARIS_CONFIG", str(config))
    result = run_dag("solaris_precompute", last_hour(), {"budget_pairs": 120})
    assert all(t["state"] == "success" for t in result["tasks"].values())
    [run_dir] = sorted((tmp_path / "own" / "runs").glob("*/*"))
    report = coverage_of(run_dir)
    assert report["fm_pairs"] == 120  # the override; the config says 300
    exact = offline_frame(tmp_path / "own" / "repo", "solaris_pair")
    user = int(exact["user_id"].iloc[0])
    items = exact.loc[exact["user_id"] == user, "item_id"].astype(int).tolist()
    retriever = SolarisRetriever(
        open_store(tmp_path / "own" / "repo"),
        vm.parents[0],
        record_misses=False,
        deadline_ms=5000,
    )
    try:
        assert retriever.fetch(user, items).tiers.tolist() == [Tier.EXACT] * len(items)
    finally:
        retriever.close()

    # Another deployment whose log has three times the users, pointed at these models.
    other = own_deployment(tmp_path / "big", f"{feast_project}b", users=180)
    raw = config_dict(tmp_path / "big", models={"dir": str(tmp_path / "own" / "models")}, log=dense)
    monkeypatch.setenv("SOLARIS_CONFIG", str(write_config(other.parent, raw)))
    failed = run_dag("solaris_precompute", last_hour(), {}, expect="failed")
    start = failed["tasks"]["start"]
    assert (start["state"], start["try_number"]) == ("failed", 1)
    assert not (tmp_path / "big" / "runs").exists()
    logged = "".join(capfd.readouterr())
    assert (
        f"AirflowFailException: ChainMismatchError: the serving chain of VM {vm.version}" in logged
    )
    assert "has room for 60 user ids, the log has user ids up to 17" in logged


@pytest.mark.slow
def test_own_models_on_sparse_and_string_ids_train_and_precompute_through_the_dags(
    airflow_env: dict[str, str],
    feast_project: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The deployment's own FM and verifier (``tests/byo_models.py``) on a log with sparse Int64
    users and String items: the training DAG registers them and trains the compressor between
    them, the precompute DAG serves their vectors EXACT through the retriever and Feast."""
    from test_byo import check_round_served_own_vectors, own_models_deployment

    from solaris_feast.models.cards import list_cards

    config = own_models_deployment(tmp_path / "own", feast_project)
    monkeypatch.setenv("SOLARIS_CONFIG", str(config))
    trained = run_dag("solaris_training", last_hour(), {})
    assert all(t["state"] == "success" for t in trained["tasks"].values())
    cards = {c.kind: c for c in list_cards(tmp_path / "own" / "models")}
    assert set(cards) == {"fm", "compressor", "vm"}
    interface = cast(dict[str, object], cards["vm"].config["interface"])
    assert interface["entry_point"] == "byo_models:dot_verifier"
    result = run_dag("solaris_precompute", last_hour(), {})
    assert all(t["state"] == "success" for t in result["tasks"].values())
    [run_dir] = sorted((tmp_path / "own" / "runs").glob("*/*"))
    assert run_dir.name == cards["vm"].version
    check_round_served_own_vectors(tmp_path / "own", False, run_dir)
