"""The transfer evaluation: how much of the FM's gain reaches the VM.

On a time split (train on the past, evaluate on the later period) it trains the FM, the
compressor and four contenders, and reports normalized entropy per task and the transfer ratio
``TR = (NE_vm - NE_x) / (NE_vm - NE_fm)``:

- ``vm``: the VM alone (ids and attributes);
- ``vm_kd``: the VM trained on the FM's probabilities mixed with the hard labels (soft-label KD);
- ``vm_solaris``: the VM with the compressed FM embedding ``z(u, i)`` on every pair;
- ``fm``: the FM itself, the upper bound.

A coverage sweep then trains and evaluates the VM with ``z`` present on a fraction of pairs only
(zero vector and tier ZERO elsewhere), the situation serving is in.

These figures compute ``z`` at the second of each scored row, give the VM no history and divide
by an FM trained on part of the training span: an upper bound, kept for its keys. The figures to
quote are the ``protocol`` record of :mod:`solaris_feast.evaluation.transfer_protocol` (``z``
served from hourly rounds, a VM with streaming history, the full-span FM as denominator,
forward-chaining splits and bootstrap intervals), added when ``evaluate_transfer`` gets a
protocol config.
"""

from __future__ import annotations

import itertools
import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from solaris_feast.data.schema import InteractionDataset, earliest_rows, time_split
from solaris_feast.evaluation.metrics import normalized_entropy, transfer_ratio
from solaris_feast.models.compressor import PCA, CompressorConfig, EmbeddingCompressor
from solaris_feast.models.features import PairFeaturizer, labels_of
from solaris_feast.models.foundation import FoundationConfig, FoundationModel
from solaris_feast.models.training import (
    TrainConfig,
    encode,
    flops_per_pair,
    foundation_outputs,
    seed_everything,
    train_compressor,
    train_foundation,
    train_vertical,
    vertical_probabilities,
)
from solaris_feast.models.vertical import VerticalConfig, VerticalModel
from solaris_feast.progress import StageProgress
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from solaris_feast.evaluation.transfer_protocol import ProtocolConfig

logger = logging.getLogger(__name__)

DEFAULT_COVERAGES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
CONTENDERS = ("vm", "vm_kd", "vm_solaris", "fm")


class TransferConfig(BaseModel):
    """What the transfer evaluation trains and how."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    train_fraction: float = Field(0.8, gt=0, lt=1)
    """Share of the log's time span used for training; the rest evaluates."""
    fm_fraction: float = Field(0.75, gt=0, le=1)
    """Share of the training span (the earliest) the FM and compressor train on. The VM sees
    ``z`` only on the later rows, where the FM is out of sample, as in production, where the FM
    was trained before the VM's data was logged. On the FM's own training rows ``z`` carries
    memorised labels, and a VM trained on it learns to over-trust ``z``."""
    history_len: int = Field(32, gt=0)
    """History events the FM reads per pair."""
    foundation: FoundationConfig = FoundationConfig()
    compressor: CompressorConfig = CompressorConfig()
    vertical: VerticalConfig = VerticalConfig()
    fm_training: TrainConfig = TrainConfig(epochs=3, batch_size=256, learning_rate=2e-3)
    compressor_training: TrainConfig = TrainConfig(epochs=2, batch_size=512, learning_rate=1e-3)
    vm_training: TrainConfig = TrainConfig(epochs=2, batch_size=256, learning_rate=3e-3)
    distillation_weight: float = Field(0.5, ge=0, le=1)
    """Weight of the FM's soft labels in the KD baseline's target."""
    coverages: tuple[float, ...] = DEFAULT_COVERAGES
    """Fractions of pairs with the exact embedding in the coverage sweep."""


@dataclass
class SeedResult:
    """Figures of one seed."""

    seed: int
    ne: dict[str, list[float]]
    coverage_ne: list[float]
    compressor_mse: float
    pca_mse: float
    fm_flops_per_pair: float
    vm_flops_per_pair: float
    seconds: float


@dataclass
class TransferReport:
    dataset: str
    tasks: tuple[str, ...]
    config: TransferConfig
    seeds: list[SeedResult] = field(default_factory=list)
    protocol: dict[str, object] | None = None
    """The protocol's record (``protocol`` and ``details``), when it ran."""

    def to_json(self) -> dict[str, object]:
        """JSON record: ``transfer_ratio`` (mean over tasks and seeds), ``ne`` per contender and
        task (mean over seeds), ``coverage_sweep``, spreads and the per-seed figures."""
        tr_kd, tr_sol = self._transfer_ratios("vm_kd"), self._transfer_ratios("vm_solaris")
        ne = {
            who: {
                task: statistics.fmean(s.ne[who][t] for s in self.seeds)
                for t, task in enumerate(self.tasks)
            }
            for who in CONTENDERS
        }
        sweep = [
            {"coverage": c, "ne": statistics.fmean(s.coverage_ne[k] for s in self.seeds)}
            for k, c in enumerate(self.config.coverages)
        ]
        first = self.seeds[0]
        extra: dict[str, object] = {}
        if self.protocol is not None:
            extra = {
                "protocol": self.protocol["protocol"],
                "protocol_details": self.protocol["details"],
            }
        return {
            "dataset": self.dataset,
            "tasks": list(self.tasks),
            "seeds": [s.seed for s in self.seeds],
            # null where the FM did not beat the VM: no gain, no ratio.
            "transfer_ratio": {
                "kd": _finite(statistics.fmean(tr_kd)),
                "solaris": _finite(statistics.fmean(tr_sol)),
            },
            "transfer_ratio_std": {"kd": _finite(_std(tr_kd)), "solaris": _finite(_std(tr_sol))},
            "transfer_ratio_per_seed": {
                "kd": [_finite(v) for v in tr_kd],
                "solaris": [_finite(v) for v in tr_sol],
            },
            "ne": ne,
            "coverage_sweep": sweep,
            "ne_monotone_in_coverage": all(a["ne"] > b["ne"] for a, b in itertools.pairwise(sweep)),
            "compressor": {
                "reconstruction_mse": statistics.fmean(s.compressor_mse for s in self.seeds),
                "pca_mse": statistics.fmean(s.pca_mse for s in self.seeds),
                "code_dim": self.config.compressor.code_dim,
            },
            "flops_per_pair": {
                "fm": first.fm_flops_per_pair,
                "vm": first.vm_flops_per_pair,
                "vm_over_fm": first.vm_flops_per_pair / first.fm_flops_per_pair,
            },
            "seconds_per_seed": [round(s.seconds, 1) for s in self.seeds],
            **extra,
        }

    def _transfer_ratios(self, who: str) -> list[float]:
        """TR per seed, averaged over tasks."""
        return [
            statistics.fmean(
                transfer_ratio(s.ne["vm"][t], s.ne[who][t], s.ne["fm"][t])
                for t in range(len(self.tasks))
            )
            for s in self.seeds
        ]


Step = StageProgress
"""Progress hook: ``(stage name, done, total)``."""


def evaluate_transfer(
    dataset: InteractionDataset,
    seeds: Sequence[int] = (0,),
    config: TransferConfig | None = None,
    progress: Step | None = None,
    protocol: ProtocolConfig | None = None,
    protocol_worlds: Mapping[str, InteractionDataset] | None = None,
) -> TransferReport:
    """Run the whole evaluation once per seed, and the protocol over the same seeds when
    ``protocol`` is given: on ``dataset``, or pooled over ``protocol_worlds`` (name -> log,
    other draws of the same world, ``dataset`` among them) when given."""
    cfg = config or TransferConfig()
    report = TransferReport(dataset=dataset.name, tasks=dataset.label_columns, config=cfg)
    for seed in seeds:
        report.seeds.append(_evaluate_seed(dataset, seed, cfg, progress))
    if protocol is not None:
        # Imported here: the protocol imports this module's config, and models.chain imports
        # this module too.
        from solaris_feast.evaluation.transfer_protocol import run_protocol_pooled

        worlds = protocol_worlds or {dataset.name: dataset}
        report.protocol = run_protocol_pooled(worlds, list(seeds), cfg, protocol, progress)
    return report


def _evaluate_seed(
    dataset: InteractionDataset, seed: int, cfg: TransferConfig, progress: Step | None
) -> SeedResult:
    started = time.perf_counter()

    def hook(stage: str) -> Callable[[int, int], None] | None:
        return (
            None
            if progress is None
            else (lambda done, total: progress(f"seed {seed}: {stage}", done, total))
        )

    train, test = time_split(dataset, cfg.train_fraction)
    # History for both periods comes from the whole log, cut strictly before each row's time:
    # exactly what serving at that moment would have seen.
    featurizer = PairFeaturizer(dataset, cfg.history_len)
    tasks = dataset.label_columns
    train_batch, test_batch = (
        featurizer.for_log(train.interactions),
        featurizer.for_log(test.interactions),
    )
    y_train, y_test = labels_of(train.interactions, tasks), labels_of(test.interactions, tasks)
    schema = featurizer.schema
    fm_rows = earliest_rows(train.interactions, cfg.fm_fraction)
    fm_index = torch.from_numpy(np.flatnonzero(fm_rows))

    seed_everything(seed)
    fm = FoundationModel(schema, len(tasks), cfg.foundation)
    train_foundation(
        fm,
        train_batch.select(fm_index),
        y_train[fm_index],
        cfg.fm_training.model_copy(update={"seed": seed}),
        hook("FM"),
    )
    h_train, p_train = foundation_outputs(fm, train_batch)
    h_test, p_test = foundation_outputs(fm, test_batch)

    pca = PCA(h_train[fm_index], cfg.compressor.code_dim)
    seed_everything(seed)
    compressor = EmbeddingCompressor(
        cfg.compressor.model_copy(update={"input_dim": h_train.shape[1]})
    )
    compressor.init_from_pca(pca)
    train_compressor(
        compressor,
        h_train[fm_index],
        cfg.compressor_training.model_copy(update={"seed": seed}),
        hook("compressor"),
    )
    with torch.inference_mode():
        compressor_mse = float(((compressor(h_test) - h_test) ** 2).mean())
    pca_mse = pca.reconstruction_mse(h_test)
    z_train, z_test = encode(compressor, h_train), encode(compressor, h_test)

    vm_cfg = cfg.vertical.model_copy(update={"embedding_dim": z_train.shape[1]})
    plain_cfg = cfg.vertical.model_copy(update={"embedding_dim": 0})
    vm_train = cfg.vm_training.model_copy(update={"seed": seed})
    ne: dict[str, list[float]] = {"fm": normalized_entropy(p_test, y_test)}

    seed_everything(seed)
    vm = VerticalModel(schema, len(tasks), plain_cfg)
    train_vertical(vm, train_batch, y_train, vm_train, progress=hook("VM"))
    ne["vm"] = normalized_entropy(vertical_probabilities(vm, test_batch), y_test)

    seed_everything(seed)
    vm_kd = VerticalModel(schema, len(tasks), plain_cfg)
    train_vertical(
        vm_kd,
        train_batch,
        y_train,
        vm_train,
        soft_labels=p_train,
        distillation_weight=cfg.distillation_weight,
        progress=hook("VM + KD"),
    )
    ne["vm_kd"] = normalized_entropy(vertical_probabilities(vm_kd, test_batch), y_test)

    coverage_ne: list[float] = []
    rng = np.random.default_rng([seed, 7])
    for c in cfg.coverages:
        tier_train = _tiers_at_coverage(rng, len(train_batch), c, ~fm_rows)
        tier_test = _tiers_at_coverage(rng, len(test_batch), c)
        seed_everything(seed)
        vm_c = VerticalModel(schema, len(tasks), vm_cfg)
        train_vertical(
            vm_c,
            train_batch,
            y_train,
            vm_train,
            z=z_train,
            tier=tier_train,
            progress=hook(f"VM + z @ {c:.0%}"),
        )
        ne_c = normalized_entropy(
            vertical_probabilities(vm_c, test_batch, z_test, tier_test), y_test
        )
        coverage_ne.append(ne_c[0])
        if c == 1.0:
            ne["vm_solaris"] = ne_c
    if "vm_solaris" not in ne:
        seed_everything(seed)
        vm_s = VerticalModel(schema, len(tasks), vm_cfg)
        full_train = _tiers_at_coverage(rng, len(train_batch), 1.0, ~fm_rows)
        full_test = torch.full((len(test_batch),), int(Tier.EXACT))
        train_vertical(
            vm_s,
            train_batch,
            y_train,
            vm_train,
            z=z_train,
            tier=full_train,
            progress=hook("VM + z"),
        )
        ne["vm_solaris"] = normalized_entropy(
            vertical_probabilities(vm_s, test_batch, z_test, full_test), y_test
        )

    probe = test_batch.select(slice(0, 64))
    fm_flops = flops_per_pair(fm, lambda: fm(probe), len(probe))
    vm_full = VerticalModel(schema, len(tasks), vm_cfg)
    z_probe = torch.zeros(len(probe), vm_cfg.embedding_dim)
    t_probe = torch.full((len(probe),), int(Tier.EXACT))
    vm_flops = flops_per_pair(vm_full, lambda: vm_full(probe, z_probe, t_probe), len(probe))
    result = SeedResult(
        seed=seed,
        ne=ne,
        coverage_ne=coverage_ne,
        compressor_mse=compressor_mse,
        pca_mse=pca_mse,
        fm_flops_per_pair=fm_flops,
        vm_flops_per_pair=vm_flops,
        seconds=time.perf_counter() - started,
    )
    logger.info(
        "seed %s: NE (main task) %s",
        seed,
        ", ".join(f"{who} {values[0]:.4f}" for who, values in ne.items()),
    )
    return result


def _tiers_at_coverage(
    rng: np.random.Generator, n: int, coverage: float, eligible: np.ndarray | None = None
) -> torch.Tensor:
    """EXACT on a random ``coverage`` share of the ``eligible`` rows, ZERO elsewhere."""
    exact = rng.random(n) < coverage
    if eligible is not None:
        exact &= eligible
    return torch.from_numpy(np.where(exact, int(Tier.EXACT), int(Tier.ZERO)).astype(np.int64))


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _std(values: list[float]) -> float:
    # One value has no spread: NaN (null in the JSON, "n/a" in the table), not a spread of 0.
    # Nor has a seed without a ratio (its FM did not beat the VM: NaN), which
    # statistics.stdev cannot take: a two-seed run on a user's log ended in its traceback.
    if len(values) < 2 or not all(math.isfinite(v) for v in values):
        return math.nan
    return statistics.stdev(values)
