"""SOLARIS speculative precompute, hourly: the verifier picks the pairs, the FM fills the cache.

drain the miss queue -> per shard of users (mapped): candidates, verifier scores, ranking
-> the round's budget split over the shards -> per shard (mapped): plan and FM precompute
-> user aggregates -> similarity fill -> coverage.

Users are hashed to ``shards`` shards; no task but the budget split (a few numbers per shard)
sees every user's candidates, so memory per task falls with the shard count.

The task bodies live in :mod:`solaris_feast.pipeline.precompute` and
:mod:`solaris_feast.pipeline.coverage`; this file only wires them. The params are generated from
:class:`solaris_feast.pipeline.settings.PrecomputeSettings` (defaults, types, bounds and
descriptions). Heavy modules (torch, faiss, feast) are imported inside the tasks, never while the
scheduler parses this file. Tasks pass only small JSON through XCom; the plan and the other
inputs live in the run folder, so a retried task, a retried shard or a re-run of the same
interval sees the same inputs. A final error (a repo whose views were never applied, a bad
setting) fails its task at once; a retryable one (the store is down) or a task past its
``execution_timeout`` is retried with exponential backoff (the config's airflow.precompute).
Assets (:mod:`solaris_feast.pipeline.assets`): runs on its cron or on ``solaris_serving_chain``;
marks one asset per view written and ``solaris_published`` once per round, after coverage.json.

Config: with ``SOLARIS_CONFIG`` set on the workers, the ``start`` task reads that solaris.yaml at
run time (:mod:`solaris_feast.config`): a scheduled run takes every setting from it, a manual run's
changed params override it. Environment (read at parse time, all optional):
``SOLARIS_PRECOMPUTE_SCHEDULE`` (cron or preset; else the config's schedules.precompute, else
``@hourly``; a promotion also starts a round unless schedules.precompute_on_promotion is false),
``SOLARIS_FEATURE_REPO``, ``SOLARIS_FEATURE_STORE_YAML``,
``SOLARIS_MODELS_DIR``, ``SOLARIS_RUNS_DIR`` (the params' defaults; use shared storage when
workers run on several machines); ``REDIS_URL`` on the workers for a Redis online store.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import Asset, Param, dag, get_current_context, task

from solaris_feast.config import precompute_task_policy, schedule_of, schedules_section
from solaris_feast.pipeline import assets
from solaris_feast.pipeline.failures import fail_fast_on_final_errors
from solaris_feast.pipeline.settings import airflow_task_args, precompute_dag_params

REPO_ROOT = Path(__file__).resolve().parents[1]
CRON = schedule_of("precompute", "@hourly")
# A promoted serving chain (solaris promote, the solaris_promote DAG) starts a round at once.
SERVING_CHAIN = Asset(name=assets.SERVING_CHAIN_ASSET, uri=assets.SERVING_CHAIN_URI)
ON_PROMOTION = schedules_section("precompute_on_promotion").precompute_on_promotion
SCHEDULE = assets.cron_or_assets(CRON, [SERVING_CHAIN] if ON_PROMOTION else [])
# execution_timeout and retries of every task (the config's airflow.precompute section).
TASK_POLICY = precompute_task_policy()

# One asset per feature view this DAG writes, under the view's role name (the default view
# name, whatever the repo calls it); each event's extra names the project and view written.
PAIR_EMBEDDINGS = Asset(*assets.view_asset("EXACT"))
USER_AGGREGATES = Asset(*assets.view_asset("USER_AGG"))
SIMILAR_EMBEDDINGS = Asset(*assets.view_asset("SIMILAR"))
# Once per round, after coverage.json: what consumers of the cache schedule on.
PUBLISHED = Asset(name=assets.PUBLISHED_ASSET, uri=assets.PUBLISHED_URI)

PARAM_SCHEMAS = precompute_dag_params(REPO_ROOT)
PARAMS = {name: Param(**schema) for name, schema in PARAM_SCHEMAS.items()}
PARAM_DEFAULTS = {name: schema["default"] for name, schema in PARAM_SCHEMAS.items()}


def _outlet_extra(asset: Asset, extra: dict[str, Any]) -> None:
    """Attach what a task wrote to its asset event, for downstream DAGs and lineage."""
    get_current_context()["outlet_events"][asset].extra = extra


@dag(
    dag_id="solaris_precompute",
    schedule=SCHEDULE,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=PARAMS,
    default_args=airflow_task_args(TASK_POLICY),  # retry_delay x backoff ** try, capped
    tags=["solaris", "feast"],
    doc_md=__doc__,
)
def solaris_precompute() -> None:
    @task
    @fail_fast_on_final_errors
    def start() -> dict[str, Any]:
        from solaris_feast.config import run_settings
        from solaris_feast.pipeline import precompute
        from solaris_feast.pipeline.runs import interval_of, round_ticks

        context = get_current_context()
        interval = interval_of(context)
        # $SOLARIS_CONFIG is read here, at run time: the settings come from the config file,
        # the params a manual run changed override them (solaris_feast.config.run_settings).
        settings = run_settings(
            "precompute", context["params"], context["dag_run"].conf, PARAM_DEFAULTS
        )
        # Ticks skipped since the previous run, or a late start: logged, kept in coverage.json.
        previous = context["ti"].get_previous_dagrun()
        ticks = round_ticks(CRON, context["dag_run"], previous)
        return precompute.start_precompute(settings, interval, ticks)

    @task
    @fail_fast_on_final_errors
    def drain_miss_queue(run: dict[str, Any]) -> list[int]:
        """Save the queued misses in the run folder; the XCom is the shard list the ranking
        tasks map over (the count of misses is in the log and ``coverage.json``)."""
        from solaris_feast.pipeline import precompute

        precompute.drain_miss_queue(run)
        return list(range(run["settings"]["shards"]))

    @task(execution_timeout=timedelta(seconds=TASK_POLICY.shard_timeout_seconds))
    @fail_fast_on_final_errors
    def rank_shard(run: dict[str, Any], shard_index: int) -> dict[str, Any]:
        """Candidates of the shard's users, scored by the verifier, ranked by the planner."""
        from solaris_feast.pipeline import precompute

        return precompute.rank_shard(run, shard_index)

    @task
    @fail_fast_on_final_errors
    def split_budget(run: dict[str, Any]) -> list[int]:
        """Persist the budget split in the run folder; the XCom is the shard list the FM tasks
        map over (the split is in the log, ``budget.json`` and ``coverage.json``)."""
        from solaris_feast.pipeline import precompute

        return list(precompute.split_round_budget(run)["shard_indexes"])

    @task(
        outlets=[PAIR_EMBEDDINGS],
        execution_timeout=timedelta(seconds=TASK_POLICY.shard_timeout_seconds),
    )
    @fail_fast_on_final_errors
    def precompute_shard(run: dict[str, Any], shard_index: int) -> dict[str, Any]:
        from solaris_feast.pipeline import precompute

        report = precompute.precompute_shard(run, shard_index)
        _outlet_extra(PAIR_EMBEDDINGS, {**precompute.view_extra(run, "EXACT"), **report})
        return report

    @task(outlets=[USER_AGGREGATES])
    @fail_fast_on_final_errors
    def aggregate_users(run: dict[str, Any]) -> dict[str, Any]:
        from solaris_feast.pipeline import precompute

        report = precompute.aggregate_users(run)
        _outlet_extra(USER_AGGREGATES, {**precompute.view_extra(run, "USER_AGG"), **report})
        return report

    @task(outlets=[SIMILAR_EMBEDDINGS])
    @fail_fast_on_final_errors
    def fill_similar(run: dict[str, Any], users: dict[str, Any]) -> dict[str, Any]:
        from solaris_feast.pipeline import precompute

        report = precompute.fill_similar(run)
        _outlet_extra(SIMILAR_EMBEDDINGS, {**precompute.view_extra(run, "SIMILAR"), **report})
        return report

    @task(outlets=[PUBLISHED])
    @fail_fast_on_final_errors
    def publish_coverage(run: dict[str, Any], filled: dict[str, Any]) -> dict[str, Any]:
        from solaris_feast.pipeline import coverage, precompute

        report = coverage.publish_coverage(run)
        _outlet_extra(
            PUBLISHED,
            {
                **precompute.view_extra(run, "RESOLVED"),
                "interval": run["interval_key"],
                "vm_version": run["vm_version"],
                "coverage": report["coverage"],
            },
        )
        return report

    # XComArgs stand in for the values at parse time; typed Any so the wiring reads as calls.
    # Upstream reports passed but unused (users, filled) only order tasks.
    run: Any = start()
    drained: Any = drain_miss_queue(run)
    rankings = rank_shard.partial(run=run).expand(shard_index=drained)
    planned: Any = split_budget(run)
    rankings >> planned
    shards = precompute_shard.partial(run=run).expand(shard_index=planned)
    users: Any = aggregate_users(run)
    shards >> users
    filled: Any = fill_similar(run, users)
    publish_coverage(run, filled)


solaris_precompute()
