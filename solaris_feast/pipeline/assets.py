"""The Airflow assets between the DAGs, and marking one from outside a task.

The DAGs mark and consume these assets (names and URIs here, the ``Asset`` objects in the DAG
files):

- ``solaris_serving_chain``: a serving chain was promoted (``solaris promote`` or the
  ``solaris_promote`` DAG); the precompute DAG runs on its schedule *or* on this asset, so a new
  chain is served within a round instead of at the next tick.
- ``solaris_pair``, ``solaris_user``, ``solaris_similar`` (:func:`view_asset`): a view was
  written; role names, the extra names the project and view (``feast_project``,
  ``feature_view``).
- ``solaris_published``: a precompute round is complete (writes, aggregates, similarity fill and
  ``coverage.json``), marked once per round by its last task; what a downstream consumer of the
  cache schedules on. (The per-view assets ``solaris_pair`` ... say a view was written; the pair
  view is written by every FM shard, so they fire several times per round.)
- the user's log asset (``schedules.training_log_asset`` of the config): when set, training runs
  on its schedule or when the log's producer marks it.

:func:`record_asset_event` marks an asset through Airflow's own asset manager, as the REST API's
``POST /assets/events`` does, in this process: for a command (``solaris promote``) that runs
where the Airflow metadata database is reachable. It queues the unpaused DAGs scheduled on the
asset; the scheduler starts their runs.

Cost: names only at import; Airflow (its ORM) is imported by :func:`record_asset_event` alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)

SERVING_CHAIN_ASSET = "solaris_serving_chain"
SERVING_CHAIN_URI = "solaris://models/serving_chain"
PUBLISHED_ASSET = "solaris_published"
PUBLISHED_URI = "feast://solaris/published"


VIEW_ASSET_TIERS = ("EXACT", "SIMILAR", "USER_AGG")
"""The tiers whose view the precompute DAG writes and marks as an asset (:func:`view_asset`)."""


def view_asset(tier: str) -> tuple[str, str]:
    """``(name, uri)`` of the asset the precompute DAG marks when it writes the view of ``tier``
    (``EXACT``, ``SIMILAR``, ``USER_AGG``). Role names, the default view names, the same in
    every deployment (the DAG file is parsed before any registry is read); each event's extra
    names the Feast project and the view really written (:func:`written_view`)."""
    from solaris_feast.pipeline.settings import DEFAULT_VIEW_NAMES

    name = DEFAULT_VIEW_NAMES[tier]
    return name, f"feast://solaris/{name}"


def written_view(project: str, view: str) -> dict[str, str]:
    """What an asset event's extra says of the view written: a consumer of a deployment with
    its own project or view names tells them apart by these, not by the asset's role name."""
    return {"feast_project": project, "feature_view": view}


AIRFLOW_ENVIRONMENT = ("AIRFLOW_HOME", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")
"""Variables that say this process belongs to an Airflow deployment (and which database)."""


def airflow_configured(environ: Mapping[str, str] | None = None) -> bool:
    """True when the environment names an Airflow deployment. Without one, importing Airflow
    would create ``~/airflow`` with a fresh SQLite database: a promotion must not do that."""
    env = os.environ if environ is None else environ
    return any(env.get(name, "").strip() for name in AIRFLOW_ENVIRONMENT)


def record_asset_event(name: str, extra: Mapping[str, Any]) -> bool:
    """Mark the asset ``name`` in the Airflow metadata database, with ``extra``.

    Returns False, with a warning, when no such asset is known there (the DAG that uses it was
    never parsed by this deployment's dag-processor): nothing is queued then.
    """
    from airflow.assets.manager import asset_manager
    from airflow.models.asset import AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        model = session.scalar(select(AssetModel).where(AssetModel.name == name).limit(1))
        if model is None:
            logger.warning(
                "no Airflow asset %s in the metadata database: the DAG scheduled on it was "
                "never parsed here, so no run is queued",
                name,
            )
            return False
        event = asset_manager.register_asset_change(
            asset=model,
            extra=dict(extra),
            source_is_api=True,
            session=session,
        )
    logger.info("marked Airflow asset %s (%s)", name, dict(extra))
    return event is not None


def cron_or_assets(cron: str | None, assets: list[Any]) -> Any:
    """A DAG's ``schedule``: ``cron`` alone, or, with ``assets`` (``airflow.sdk.Asset``), a run
    on the cron's ticks *or* whenever any of the assets is marked (Airflow's
    ``AssetOrTimeSchedule``; the ticks use UTC). No cron (``none``): the assets alone, or no
    schedule at all. A cron that is no cron expression (``@once``) is returned as it is."""
    from croniter import croniter

    if cron is None:
        if not assets:
            return None
        from airflow.sdk import AssetAny

        return assets[0] if len(assets) == 1 else AssetAny(*assets)
    if not assets or not croniter.is_valid(cron):
        return cron
    from airflow.sdk import AssetAny, AssetOrTimeSchedule, CronTriggerTimetable

    condition = assets[0] if len(assets) == 1 else AssetAny(*assets)
    return AssetOrTimeSchedule(
        timetable=CronTriggerTimetable(cron, timezone="UTC"), assets=condition
    )
