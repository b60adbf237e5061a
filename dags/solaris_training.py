"""SOLARIS model training: FM -> compressor -> VM (the verifier) on a recent window of the log.

Each stage registers a model card (``solaris_feast.models.registry``) and marks its asset; the
precompute DAG picks the newest VM and the compressor and FM it was trained on at its next run,
and a new version re-plans every pair (vectors of another version are misses). A retried stage
returns the card it already registered for this run instead of training again; a final error
(bad settings, an empty window) fails its stage at once.

The task bodies live in :mod:`solaris_feast.pipeline.training`; the params are generated from
:class:`solaris_feast.pipeline.settings.TrainingSettings`; torch is imported only inside the
tasks. With ``SOLARIS_CONFIG`` set, ``start`` reads that solaris.yaml at run time (the config's
settings; a manual run's changed params override them). Environment (parse time, optional):
``SOLARIS_TRAINING_SCHEDULE`` (else the config's schedules.training, else ``@daily``; with
schedules.training_log_asset also when that asset is marked), ``SOLARIS_MODELS_DIR``. Each
stage has the config's airflow.training ``execution_timeout`` and retries.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from airflow.sdk import Asset, Param, dag, get_current_context, task

from solaris_feast.config import schedule_of, schedules_section, training_task_policy
from solaris_feast.pipeline.assets import cron_or_assets
from solaris_feast.pipeline.failures import fail_fast_on_final_errors
from solaris_feast.pipeline.settings import airflow_task_args, training_dag_params

REPO_ROOT = Path(__file__).resolve().parents[1]
CRON = schedule_of("training", "@daily")
# The user's log asset (schedules.training_log_asset): when set, a marked log trains too.
LOG_ASSET = schedules_section("training_log_asset").training_log_asset
SCHEDULE = cron_or_assets(CRON, [Asset(LOG_ASSET)] if LOG_ASSET else [])
# execution_timeout and retries of every stage (the config's airflow.training section).
TASK_POLICY = training_task_policy()

FOUNDATION_MODEL = Asset(name="solaris_model_fm", uri="solaris://models/fm")
COMPRESSOR_MODEL = Asset(name="solaris_model_compressor", uri="solaris://models/compressor")
VERTICAL_MODEL = Asset(name="solaris_model_vm", uri="solaris://models/vm")

PARAM_SCHEMAS = training_dag_params(REPO_ROOT)
PARAMS = {name: Param(**schema) for name, schema in PARAM_SCHEMAS.items()}
PARAM_DEFAULTS = {name: schema["default"] for name, schema in PARAM_SCHEMAS.items()}


def _mark(asset: Asset, card: dict[str, Any]) -> None:
    get_current_context()["outlet_events"][asset].extra = {"version": card["version"]}


@dag(
    dag_id="solaris_training",
    schedule=SCHEDULE,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=PARAMS,
    default_args=airflow_task_args(TASK_POLICY),  # retry_delay x backoff ** try, capped
    tags=["solaris", "models"],
    doc_md=__doc__,
)
def solaris_training() -> None:
    @task
    @fail_fast_on_final_errors
    def start() -> dict[str, Any]:
        from solaris_feast.config import run_settings
        from solaris_feast.pipeline import training
        from solaris_feast.pipeline.runs import interval_of

        context = get_current_context()
        interval = interval_of(context)
        # $SOLARIS_CONFIG is read here, at run time: the settings come from the config file,
        # the params a manual run changed override them (solaris_feast.config.run_settings).
        settings = run_settings(
            "training", context["params"], context["dag_run"].conf, PARAM_DEFAULTS
        )
        return training.start_training(settings, interval)

    @task(outlets=[FOUNDATION_MODEL])
    @fail_fast_on_final_errors
    def train_fm(run: dict[str, Any]) -> dict[str, Any]:
        from solaris_feast.pipeline import training

        card = training.train_foundation_stage(run)
        _mark(FOUNDATION_MODEL, card)
        return card

    @task(outlets=[COMPRESSOR_MODEL])
    @fail_fast_on_final_errors
    def train_compressor(run: dict[str, Any], fm: dict[str, Any]) -> dict[str, Any]:
        from solaris_feast.pipeline import training

        card = training.train_compressor_stage(run, fm["version"])
        _mark(COMPRESSOR_MODEL, card)
        return card

    @task(outlets=[VERTICAL_MODEL])
    @fail_fast_on_final_errors
    def train_vm(run: dict[str, Any], compressor: dict[str, Any]) -> dict[str, Any]:
        from solaris_feast.pipeline import training

        card = training.train_vertical_stage(run, compressor["version"])
        _mark(VERTICAL_MODEL, card)
        return card

    # XComArgs stand in for the values at parse time; typed Any so the wiring reads as calls.
    run: Any = start()
    fm: Any = train_fm(run)
    compressor: Any = train_compressor(run, fm)
    train_vm(run, compressor)


solaris_training()
