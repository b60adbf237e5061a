"""Stage 1 of the journey: train the FM, its compressor and the VM on a window, and register them.

The registered VM is the one serving uses, so it is trained on the tier mix serving produces:
exact embeddings on part of the rows, the user's aggregate on others, a similarity-style fill
(other users' embeddings of the same item) on others, and nothing on the rest. With the tier
indicator beside ``z`` it learns how far to trust each tier.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from pydantic import BaseModel, ConfigDict, Field

from solaris_feast.data.schema import EVENT_TIMESTAMP, ITEM_ID, USER_ID, InteractionDataset
from solaris_feast.evaluate import TransferConfig
from solaris_feast.features import PairFeaturizer, labels_of
from solaris_feast.models.compressor import PCA, EmbeddingCompressor
from solaris_feast.models.foundation import FoundationModel
from solaris_feast.models.registry import ModelBundle, load_bundle, save_model
from solaris_feast.models.training import (
    encode,
    flops_per_pair,
    foundation_outputs,
    normalized_entropy,
    seed_everything,
    train_compressor,
    train_foundation,
    train_vertical,
    vertical_probabilities,
)
from solaris_feast.models.vertical import VerticalModel
from solaris_feast.tiers import Tier

logger = logging.getLogger(__name__)


class TierMix(BaseModel):
    """Share of training rows given each tier when the serving VM is trained."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    exact: float = Field(0.5, ge=0, le=1)
    similar: float = Field(0.15, ge=0, le=1)
    user_agg: float = Field(0.2, ge=0, le=1)
    """The rest of the rows get tier ZERO."""


class TrainingConfig(BaseModel):
    """Models to train for serving: the evaluation's model settings plus the tier mix."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: TransferConfig = TransferConfig()
    tier_mix: TierMix = TierMix()
    seed: int = 0


def train_and_register(
    dataset: InteractionDataset,
    models_dir: Path,
    config: TrainingConfig | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> ModelBundle:
    """Train FM -> compressor -> VM on all of ``dataset``'s log and register their cards."""
    cfg = config or TrainingConfig()
    mc = cfg.models
    log = dataset.interactions
    if log.empty:
        raise ValueError("cannot train on an empty interaction log")

    def hook(stage: str) -> Callable[[int, int], None] | None:
        return None if progress is None else (lambda done, total: progress(stage, done, total))

    featurizer = PairFeaturizer(dataset, mc.history_len)
    schema = featurizer.schema
    batch = featurizer.for_log(log)
    labels = labels_of(log, dataset.label_columns)
    window = {
        "train_window_start": log[EVENT_TIMESTAMP].min().to_pydatetime(),
        "train_window_end": log[EVENT_TIMESTAMP].max().to_pydatetime(),
        "dataset": dataset.name,
        "tasks": dataset.label_columns,
    }

    seed_everything(cfg.seed)
    fm = FoundationModel(schema, len(dataset.label_columns), mc.foundation)
    train_foundation(
        fm, batch, labels, mc.fm_training.model_copy(update={"seed": cfg.seed}), hook("train FM")
    )
    h, p_fm = foundation_outputs(fm, batch)
    probe = batch.select(slice(0, 64))
    fm_card = save_model(
        fm,
        "fm",
        models_dir,
        config={"model": mc.foundation.model_dump(), "schema": schema.to_dict()},
        metrics={
            f"train_ne_{t}": v
            for t, v in zip(dataset.label_columns, normalized_entropy(p_fm, labels), strict=True)
        },
        flops_per_pair=flops_per_pair(fm, lambda: fm(probe), len(probe)),
        **window,
    )

    pca = PCA(h, mc.compressor.code_dim)
    seed_everything(cfg.seed)
    comp_cfg = mc.compressor.model_copy(update={"input_dim": h.shape[1]})
    compressor = EmbeddingCompressor(comp_cfg)
    compressor.init_from_pca(pca)
    train_compressor(
        compressor,
        h,
        mc.compressor_training.model_copy(update={"seed": cfg.seed}),
        hook("train compressor"),
    )
    with torch.inference_mode():
        mse = float(((compressor(h) - h) ** 2).mean())
    compressor_card = save_model(
        compressor,
        "compressor",
        models_dir,
        parents=(fm_card.version,),
        config={"model": comp_cfg.model_dump()},
        metrics={"reconstruction_mse": mse, "pca_mse": pca.reconstruction_mse(h)},
        **window,
    )

    z = encode(compressor, h)
    tier, z_mixed = tier_mix_inputs(log, z, cfg.tier_mix, cfg.seed)
    vm_cfg = mc.vertical.model_copy(update={"embedding_dim": z.shape[1]})
    seed_everything(cfg.seed)
    vm = VerticalModel(schema, len(dataset.label_columns), vm_cfg)
    train_vertical(
        vm,
        batch,
        labels,
        mc.vm_training.model_copy(update={"seed": cfg.seed}),
        z=z_mixed,
        tier=tier,
        progress=hook("train VM"),
    )
    p_vm = vertical_probabilities(vm, batch, z_mixed, tier)
    z_probe = torch.zeros(len(probe), vm_cfg.embedding_dim)
    t_probe = torch.full((len(probe),), int(Tier.EXACT))
    vm_card = save_model(
        vm,
        "vm",
        models_dir,
        parents=(compressor_card.version,),
        config={"model": vm_cfg.model_dump(), "tier_mix": cfg.tier_mix.model_dump()},
        metrics={
            f"train_ne_{t}": v
            for t, v in zip(dataset.label_columns, normalized_entropy(p_vm, labels), strict=True)
        },
        flops_per_pair=flops_per_pair(vm, lambda: vm(probe, z_probe, t_probe), len(probe)),
        **window,
    )
    logger.info(
        "registered %s <- %s <- %s", vm_card.version, compressor_card.version, fm_card.version
    )
    return load_bundle(models_dir, vm_card.version)


def tier_mix_inputs(
    log: pd.DataFrame, z: torch.Tensor, mix: TierMix, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiers ``(N,)`` and inputs ``(N, d)`` for training on the serving tier mix.

    USER_AGG rows get the mean of that user's exact embeddings; SIMILAR rows the mean of other
    rows' embeddings of the same item (what a neighbour fill averages); ZERO rows a zero vector.
    """
    if mix.exact + mix.similar + mix.user_agg > 1.0 + 1e-9:
        raise ValueError("tier mix shares must add up to at most 1")
    n = len(log)
    rng = np.random.default_rng([seed, 11])
    draw = rng.random(n)
    tiers = np.full(n, int(Tier.ZERO), dtype=np.int64)
    edges = np.cumsum([mix.exact, mix.similar, mix.user_agg])
    tiers[draw < edges[2]] = int(Tier.USER_AGG)
    tiers[draw < edges[1]] = int(Tier.SIMILAR)
    tiers[draw < edges[0]] = int(Tier.EXACT)
    zn = z.numpy()
    out = np.zeros_like(zn)
    out[tiers == int(Tier.EXACT)] = zn[tiers == int(Tier.EXACT)]
    for tier, key in ((Tier.USER_AGG, USER_ID), (Tier.SIMILAR, ITEM_ID)):
        ids = log[key].to_numpy()
        _, inverse = np.unique(ids, return_inverse=True)
        sums = np.zeros((inverse.max() + 1, zn.shape[1]), dtype=np.float64)
        np.add.at(sums, inverse, zn)
        counts = np.bincount(inverse).astype(np.float64)[:, None]
        means = (sums / counts).astype(np.float32)
        rows = tiers == int(tier)
        out[rows] = means[inverse[rows]]
    return torch.from_numpy(tiers), torch.from_numpy(out)
