"""One training or precompute round outside Airflow (cron, notebooks, tests): the same task
bodies as the DAGs, called in the DAGs' order in one process.

A round is keyed like a manual DAG run by the time it is for (``--at``, default now): running
the same command again for the same time reuses the run folder's files and the training
markers, as a retried DAG task does, so nothing is added twice.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from solaris_feast.config import SolarisConfig, precompute_settings, training_settings

Echo = Callable[[str], None]


def _interval(at: datetime | None, kind: str) -> dict[str, Any]:
    """A manual run's interval: no data interval, its time ``at`` (default now), keyed by it."""
    import pandas as pd

    moment = pd.Timestamp(at) if at is not None else pd.Timestamp.now(tz="UTC")
    if moment.tzinfo is None:
        moment = moment.tz_localize("UTC")
    moment = moment.tz_convert("UTC").floor("s")
    return {
        "data_interval_start": None,
        "data_interval_end": None,
        "logical_date": moment.to_pydatetime(),
        "run_after": None,
        "run_id": f"cli_{kind}_{moment.strftime('%Y%m%dT%H%M%SZ')}",
    }


def train_round(
    config: SolarisConfig, at: datetime | None, echo: Echo, config_file: str | None = None
) -> dict[str, Any]:
    """Train FM -> compressor -> VM on the config's log window and register their cards;
    ``config_file``, the config's path, goes into the ``solaris promote`` line it suggests."""
    from solaris_feast.pipeline import training

    settings = training_settings(config).model_dump(mode="json")
    run = training.start_training(settings, _interval(at, "train"))
    echo(f"training on {config.log.path or config.log.feast_source} up to {run['now']}")
    fm = training.train_foundation_stage(run)
    echo(f"fm          {fm['version']}")
    compressor = training.train_compressor_stage(run, fm["version"])
    echo(f"compressor  {compressor['version']}")
    vm = training.train_vertical_stage(run, compressor["version"])
    echo(f"vm          {vm['version']}")
    echo(
        f"cards in {config.models.dir}; serve it with: solaris promote --vm {vm['version']}"
        + (f" --config {config_file}" if config_file else "")
    )
    return {"fm": fm, "compressor": compressor, "vm": vm}


def precompute_round(config: SolarisConfig, at: datetime | None, echo: Echo) -> dict[str, Any]:
    """One precompute round: the precompute DAG's tasks, in order, in this process."""
    from solaris_feast.pipeline import precompute
    from solaris_feast.pipeline.round import precompute_round as run_round

    settings = precompute_settings(config).model_dump(mode="json")
    done = run_round(settings, _interval(at, "precompute"), echo)
    run, planned, covered = done["run"], done["plan"], done["coverage"]
    run_dir = Path(run["run_dir"])
    echo(f"run folder  {run_dir} (shards/, budget.json, coverage.json)")
    from solaris_feast.pipeline.settings import PrecomputeSettings
    from solaris_feast.store.definitions import applied_view_names
    from solaris_feast.store.offline import offline_view_root

    store = precompute.open_run_store(PrecomputeSettings.model_validate(settings))
    for view in applied_view_names(store).view_name_by_tier().values():
        echo(f"offline     {view}: {offline_view_root(store, view)}")
    return {"run": run, "plan": planned, "coverage": covered, "run_dir": str(run_dir)}
