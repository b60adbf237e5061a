"""Task bodies of the training DAG: FM, then compressor, then VM, each registering a card.

Each stage rebuilds its inputs from the log (deterministic for the run's time) rather than
receiving tensors from the previous task, and writes a marker naming the version it registered
(:func:`solaris_feast.pipeline.runs.training_stage_marker`): a retried stage returns that card
instead of training again. torch is imported inside the functions.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from solaris_feast.pipeline.log import load_log
from solaris_feast.pipeline.runs import (
    TRAINING_SETTINGS_FILE,
    refuse_changed_settings,
    run_time,
    training_stage_marker,
    write_atomic,
)
from solaris_feast.pipeline.settings import TrainingRun, TrainingSettings

if TYPE_CHECKING:
    from solaris_feast.models.chain import TrainingConfig, TrainingData
    from solaris_feast.models.registry import ModelCard

logger = logging.getLogger(__name__)

TRAINING_STAGES = ("fm", "compressor", "vm")
"""The stages, in order, each marking the card it registered for a run."""


def start_training(settings: Mapping[str, Any], interval: Mapping[str, Any]) -> dict[str, Any]:
    """Validate the DAG's params and fix the run's time; the spec every stage reads."""
    now, key = run_time(**interval)
    spec = TrainingRun(
        settings=TrainingSettings.model_validate(dict(settings)), now=now, interval_key=key
    )
    Path(spec.settings.models_dir).mkdir(parents=True, exist_ok=True)
    _keep_settings(spec)
    return spec.model_dump(mode="json")


def _keep_settings(spec: TrainingRun) -> None:
    """Write the run's settings beside its stage markers, or refuse a run of the same time with
    other ones once a stage has registered a card: a stage returns the card an earlier try
    registered, so another FM, its options or code_dim at the same time were ignored and the
    old chain reported as the new one. A try that registered nothing (a typo in an option)
    leaves nothing to reuse, and the corrected settings replace its record."""
    path = _marker(spec, TRAINING_SETTINGS_FILE)
    now = spec.settings.model_dump(mode="json")
    if not any(_marker(spec, stage).is_file() for stage in TRAINING_STAGES):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(now, indent=2, sort_keys=True))
        return
    if not path.is_file():
        # A try from before the record existed: what it ran with is unknown, so nothing is
        # recorded (a record of these settings would refuse the ones it really ran with).
        logger.warning(
            "training run %s registered cards before its settings were recorded: they are "
            "reused as they are, whatever the settings now; to train with other settings, "
            "train at another time (--at) or remove %s",
            spec.interval_key,
            path.parent,
        )
        return
    refuse_changed_settings(
        path,
        "training run record",
        json.loads,
        now,
        "train at another time (--at, or the run's logical date) or remove that folder",
    )


def _marker(spec: TrainingRun, stage: str) -> Path:
    return training_stage_marker(Path(spec.settings.models_dir), spec.interval_key, stage)


def _registered_earlier(spec: TrainingRun, stage: str) -> ModelCard | None:
    """The card a previous attempt of this stage registered for the same run, if any."""
    from solaris_feast.models.registry import CARD_SUFFIX, read_card

    marker = _marker(spec, stage)
    if not marker.is_file():
        return None
    card_path = Path(spec.settings.models_dir) / f"{marker.read_text().strip()}{CARD_SUFFIX}"
    return read_card(card_path) if card_path.is_file() else None


def _remember(spec: TrainingRun, stage: str, card: ModelCard) -> dict[str, Any]:
    marker = _marker(spec, stage)
    marker.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(marker, card.version)
    logger.info("registered %s %s", stage, card.version)
    return _card_summary(card)


def _card_summary(card: ModelCard) -> dict[str, Any]:
    return {
        "version": card.version,
        "kind": card.kind,
        "parents": list(card.parents),
        "metrics": dict(card.metrics),
    }


def _training_inputs(
    spec: TrainingRun, fm_version: str | None = None
) -> tuple[TrainingData, TrainingConfig]:
    """The window's rows and model inputs, and the training config with the run's epochs and
    models; after the FM stage, through the vocabulary saved beside ``fm_version``'s card."""
    import pandas as pd

    from solaris_feast.data.log_source import own_column
    from solaris_feast.errors import SchemaError
    from solaris_feast.models.chain import TrainingConfig, TrainingData
    from solaris_feast.models.vocabulary import Vocabulary

    cfg = spec.settings
    models_dir = Path(cfg.models_dir)
    base = TrainingConfig(seed=cfg.seed, fm=cfg.fm, verifier=cfg.verifier)
    placed = {"device": cfg.device, "precision": cfg.precision}

    def fit(train: Any, epochs: int) -> Any:
        return train.model_copy(update={"epochs": epochs, **placed})

    models = base.models.model_copy(
        update={
            "fm_training": fit(base.models.fm_training, cfg.fm_epochs),
            "compressor": base.models.compressor.model_copy(update={"code_dim": cfg.code_dim}),
            "compressor_training": fit(base.models.compressor_training, cfg.compressor_epochs),
            "vm_training": fit(base.models.vm_training, cfg.vm_epochs),
        }
    )
    config = base.model_copy(update={"models": models})
    now = pd.Timestamp(spec.now)
    try:
        data = TrainingData.build(
            load_log(cfg, spec.now, window_seconds=cfg.train_window_hours * 3600),
            config.models.history_len,
            window_start=now - pd.Timedelta(hours=cfg.train_window_hours),
            window_end=now,
            vocabulary=None if fm_version is None else Vocabulary.load(models_dir, fm_version),
        )
    except SchemaError as exc:
        if cfg.log is None:
            raise
        # The window's checks speak of the schema's columns; a user's log names its own.
        raise SchemaError(exc.table, own_column(cfg.log, exc.column), exc.problem) from exc
    return data, config


def train_foundation_stage(run: Mapping[str, Any]) -> dict[str, Any]:
    """Train the FM on the run's window and register its card (the first stage)."""
    from solaris_feast.models.chain import fit_foundation

    spec = TrainingRun.model_validate(dict(run))
    earlier = _registered_earlier(spec, "fm")
    if earlier is not None:
        return _card_summary(earlier)
    data, config = _training_inputs(spec)
    card = fit_foundation(data, Path(spec.settings.models_dir), config)
    return _remember(spec, "fm", card)


def train_compressor_stage(run: Mapping[str, Any], fm_version: str) -> dict[str, Any]:
    """Train the compressor on the registered FM's representations and register it."""
    from solaris_feast.models.chain import fit_compressor
    from solaris_feast.models.registry import card_by_version

    spec = TrainingRun.model_validate(dict(run))
    earlier = _registered_earlier(spec, "compressor")
    if earlier is not None:
        return _card_summary(earlier)
    models_dir = Path(spec.settings.models_dir)
    data, config = _training_inputs(spec, fm_version)
    card = fit_compressor(data, models_dir, card_by_version(models_dir, fm_version), config)
    return _remember(spec, "compressor", card)


def train_vertical_stage(run: Mapping[str, Any], compressor_version: str) -> dict[str, Any]:
    """Train the VM (the verifier) on the serving tier mix of ``z`` and register it."""
    from solaris_feast.models.chain import fit_vertical
    from solaris_feast.models.registry import card_by_version

    spec = TrainingRun.model_validate(dict(run))
    earlier = _registered_earlier(spec, "vm")
    if earlier is not None:
        return _card_summary(earlier)
    models_dir = Path(spec.settings.models_dir)
    compressor = card_by_version(models_dir, compressor_version)
    data, config = _training_inputs(spec, compressor.parents[0] if compressor.parents else None)
    card = fit_vertical(data, models_dir, compressor, config)
    return _remember(spec, "vm", card)
