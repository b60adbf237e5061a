"""SOLARIS speculative precompute, hourly: the verifier picks the pairs, the FM fills the cache.

drain the miss queue -> candidates -> verifier scores + plan under the budget
-> FM precompute, one mapped task per shard -> user aggregates -> similarity fill -> coverage.

The task bodies live in :mod:`solaris_feast.pipeline.tasks`; this file only wires them. Heavy
modules
(torch, faiss, feast) are imported inside the tasks, never while the scheduler parses this file.
Tasks pass only small JSON through XCom; the plan and the other inputs live in the run folder,
so a retried task, a retried shard or a re-run of the same interval sees the same inputs.

Environment (read at parse time, all optional): ``SOLARIS_PRECOMPUTE_SCHEDULE`` (cron or preset,
default ``@hourly``), ``SOLARIS_FEATURE_REPO``, ``SOLARIS_FEATURE_STORE_YAML``,
``SOLARIS_MODELS_DIR``, ``SOLARIS_RUNS_DIR`` (the params' defaults; use shared storage when
workers run on several machines); ``REDIS_URL`` on the workers for a Redis online store.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import Asset, Param, dag, get_current_context, task

REPO_ROOT = Path(__file__).resolve().parents[1]
SCHEDULE = os.environ.get("SOLARIS_PRECOMPUTE_SCHEDULE", "@hourly")

# One asset per feature view this DAG writes; the names are the views' names.
PAIR_EMBEDDINGS = Asset(name="solaris_pair", uri="feast://solaris/solaris_pair")
USER_AGGREGATES = Asset(name="solaris_user", uri="feast://solaris/solaris_user")
SIMILAR_EMBEDDINGS = Asset(name="solaris_similar", uri="feast://solaris/solaris_similar")

PARAMS = {
    "feature_repo": Param(
        os.environ.get("SOLARIS_FEATURE_REPO", str(REPO_ROOT / "feature_repo")),
        type="string",
        minLength=1,
        description="Feast repo folder (feature_store.yaml: SQLite or Redis online store)",
    ),
    "models_dir": Param(
        os.environ.get("SOLARIS_MODELS_DIR", str(REPO_ROOT / "models")),
        type="string",
        minLength=1,
        description="Model registry; the newest VM and its compressor and FM are used",
    ),
    "feature_store_yaml": Param(
        os.environ.get("SOLARIS_FEATURE_STORE_YAML", "feature_store.yaml"),
        type="string",
        minLength=1,
        description="Config file in the repo; feature_store.redis.yaml for Redis (REDIS_URL)",
    ),
    "runs_dir": Param(
        os.environ.get("SOLARIS_RUNS_DIR", ""),
        type="string",
        description="Per-run files (plan, reports); empty: <feature_repo>/data/precompute_runs",
    ),
    "dataset": Param("synthetic", enum=["synthetic", "movielens"], description="Log source"),
    "dataset_size": Param("demo", enum=["tiny", "demo", "default", "large"]),
    "dataset_seed": Param(0, type="integer"),
    "align_log_to_run": Param(
        True, type="boolean", description="Shift a recorded log so it ends at the run's time"
    ),
    "budget_pairs": Param(20_000, type="integer", minimum=0, description="FM pairs per run"),
    "shards": Param(4, type="integer", minimum=1, maximum=1024, description="Mapped FM tasks"),
    "candidates_per_user": Param(200, type="integer", minimum=1),
    "exclude_seen_items": Param(
        False, type="boolean", description="Never offer a user an item they have met before"
    ),
    "pair_ttl_seconds": Param(
        None,
        type=["null", "integer"],
        minimum=1,
        description="TTL the planner assumes; null: the pair view's TTL in the registry",
    ),
    "refresh_margin_seconds": Param(1800, type="integer", minimum=0),
    "min_miss_score": Param(0.05, type="number", minimum=0, maximum=1),
    "user_balanced_plan": Param(
        False, type="boolean", description="Spread the budget over users, not by global score"
    ),
    "retrieval_weight": Param(
        1.0,
        type="number",
        minimum=0,
        description="Exponent of the retrieval score in the plan score; 0: the VM's score alone",
    ),
    "max_drained_misses": Param(100_000, type="integer", minimum=0),
    "aggregate_window_seconds": Param(86_400, type="integer", minimum=1),
    "fill_targets": Param(50_000, type="integer", minimum=0),
    "similar_neighbours": Param(10, type="integer", minimum=1),
    "batch_size": Param(1024, type="integer", minimum=1),
}


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
    default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
    tags=["solaris", "feast"],
    doc_md=__doc__,
)
def solaris_precompute() -> None:
    @task
    def start() -> dict[str, Any]:
        from solaris_feast.pipeline import tasks as pipeline

        context = get_current_context()
        dag_run = context["dag_run"]
        interval = {
            "data_interval_start": context.get("data_interval_start"),
            "data_interval_end": context.get("data_interval_end"),
            "logical_date": context.get("logical_date"),
            "run_after": getattr(dag_run, "run_after", None),
            "run_id": context["run_id"],
        }
        return pipeline.start_precompute(context["params"], interval)

    @task
    def drain_miss_queue(run: dict[str, Any]) -> dict[str, Any]:
        from solaris_feast.pipeline import tasks as pipeline

        return pipeline.drain_miss_queue(run)

    @task
    def generate_candidates(run: dict[str, Any], misses: dict[str, Any]) -> dict[str, Any]:
        from solaris_feast.pipeline import tasks as pipeline

        return pipeline.generate_candidate_table(run)

    @task
    def plan(run: dict[str, Any], candidates: dict[str, Any]) -> list[int]:
        """Persist the plan in the run folder; the XCom is the shard list the FM tasks map over
        (the plan's stats are in the log, ``plan/plan.json`` and ``coverage.json``)."""
        from solaris_feast.pipeline import tasks as pipeline

        return list(pipeline.plan_run(run)["shard_indexes"])

    @task(outlets=[PAIR_EMBEDDINGS])
    def precompute_shard(run: dict[str, Any], shard_index: int) -> dict[str, Any]:
        from solaris_feast.pipeline import tasks as pipeline

        report = pipeline.precompute_shard(run, shard_index, run["settings"]["shards"])
        _outlet_extra(PAIR_EMBEDDINGS, {"model_version": run["embedding_version"], **report})
        return report

    @task(outlets=[USER_AGGREGATES])
    def aggregate_users(run: dict[str, Any]) -> dict[str, Any]:
        from solaris_feast.pipeline import tasks as pipeline

        report = pipeline.aggregate_users(run)
        _outlet_extra(USER_AGGREGATES, {"model_version": run["embedding_version"], **report})
        return report

    @task(outlets=[SIMILAR_EMBEDDINGS])
    def fill_similar(run: dict[str, Any], users: dict[str, Any]) -> dict[str, Any]:
        from solaris_feast.pipeline import tasks as pipeline

        report = pipeline.fill_similar(run)
        _outlet_extra(SIMILAR_EMBEDDINGS, {"model_version": run["embedding_version"], **report})
        return report

    @task
    def publish_coverage(run: dict[str, Any], filled: dict[str, Any]) -> dict[str, Any]:
        from solaris_feast.pipeline import tasks as pipeline

        return pipeline.publish_coverage(run)

    # XComArgs stand in for the values at parse time; typed Any so the wiring reads as calls.
    # Upstream reports passed but unused (misses, candidates, users, filled) only order tasks.
    run: Any = start()
    misses: Any = drain_miss_queue(run)
    candidates: Any = generate_candidates(run, misses)
    planned: Any = plan(run, candidates)
    shards = precompute_shard.partial(run=run).expand(shard_index=planned)
    users: Any = aggregate_users(run)
    shards >> users
    filled: Any = fill_similar(run, users)
    publish_coverage(run, filled)


solaris_precompute()
