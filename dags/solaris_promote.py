"""Promote a serving chain from Airflow; the precompute DAG starts a round on it at once.

The task does what ``solaris promote`` does
(:func:`solaris_feast.pipeline.promotion.promote_checked`): it checks, with a config, that the
VM's chain fits the log, then writes the registry's serving alias. Its outlet, the
``solaris_serving_chain`` asset (with the chain in the event's extra), is what
``solaris_precompute`` is scheduled on besides its cron. No schedule: trigger it with the VM
version (``airflow dags trigger solaris_promote --conf '{"vm": "vm-..."}'`` or the UI form).

With ``SOLARIS_CONFIG`` set the models folder and the log come from the config file (read at run
time); else ``models_dir`` names the registry and the fit check is skipped (no log to check).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from airflow.sdk import Asset, Param, dag, get_current_context, task

from solaris_feast.config import precompute_task_policy
from solaris_feast.pipeline import assets
from solaris_feast.pipeline.failures import fail_fast_on_final_errors
from solaris_feast.pipeline.settings import airflow_task_args, deployment_defaults

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVING_CHAIN = Asset(name=assets.SERVING_CHAIN_ASSET, uri=assets.SERVING_CHAIN_URI)


@dag(
    dag_id="solaris_promote",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params={
        "vm": Param(None, type=["null", "string"], description="VM version to serve."),
        "models_dir": Param(
            deployment_defaults(REPO_ROOT)["models_dir"],
            type="string",
            minLength=1,
            description="Model registry (without SOLARIS_CONFIG; else the config's models.dir).",
        ),
        "check": Param(True, type="boolean", description="Refuse a chain that misfits the log."),
    },
    default_args={**airflow_task_args(precompute_task_policy()), "retries": 0},
    tags=["solaris", "models"],
    doc_md=__doc__,
)
def solaris_promote() -> None:
    @task(outlets=[SERVING_CHAIN])
    @fail_fast_on_final_errors
    def promote() -> dict[str, Any]:
        from solaris_feast.pipeline.promotion import promote_from_params

        context = get_current_context()
        extra = promote_from_params(context["params"])
        context["outlet_events"][SERVING_CHAIN].extra = extra
        return extra

    promote()


solaris_promote()
