"""Seeded, deterministic training loops and the metrics the evaluation reports.

Each loop takes whole-period tensors and walks them in shuffled mini-batches; the models stay
unaware of how they are trained. Inference runs under ``torch.inference_mode()`` after ``.eval()``.

Devices: a loop trains on ``TrainConfig.device`` (``cpu``, ``cuda``, ``cuda:N`` or ``auto``, see
:func:`resolve_device`), optionally under bf16 autocast (``precision``: weights and optimizer
state stay float32), moving each mini-batch there, and hands the model back on the CPU, so
callers never see the device. On CUDA, kernels are not bit-for-bit repeatable.

Randomness: shuffling draws from a local ``torch.Generator``; module initialisation and dropout
draw from torch's global generator (torch gives them no generator argument), so they run inside
:func:`seeded_torch`, which seeds that generator for its block and restores the caller's state
after it. Training thus repeats bit for bit and leaves the process's random state as it found it.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from solaris_feast.errors import ConfigError

# NE and TR are defined once, in evaluation.metrics; re-exported for the callers of this module.
from solaris_feast.evaluation.metrics import normalized_entropy as normalized_entropy
from solaris_feast.evaluation.metrics import transfer_ratio as transfer_ratio
from solaris_feast.models.compressor import EmbeddingCompressor
from solaris_feast.models.features import PairBatch
from solaris_feast.models.foundation import FoundationModel
from solaris_feast.models.vertical import VerticalModel

logger = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int], None]
"""Called with ``(steps done, steps total)`` after every optimizer step."""

INFERENCE_CHUNK = 8192

Precision = Literal["fp32", "bf16"]
"""fp32, or bf16 autocast of the forward passes (float32 weights and optimizer state)."""


def resolve_device(name: str) -> torch.device:
    """``auto``: the first CUDA device when torch sees one, else the CPU; ``cpu``, ``cuda`` or
    ``cuda:N`` as given.

    Raises:
        ConfigError: a CUDA device that this process cannot see, or a name torch does not know.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(
            f"device {name!r} is not a torch device (cpu, cuda, cuda:N, auto)"
        ) from exc
    if device.type == "cuda" and (
        not torch.cuda.is_available()
        or (device.index is not None and device.index >= torch.cuda.device_count())
    ):
        raise ConfigError(f"device {name!r}: this process sees no such CUDA device (use auto)")
    if device.type not in {"cpu", "cuda"}:
        raise ConfigError(f"device {name!r}: only cpu and cuda are supported")
    return device


def autocast(device: torch.device, precision: Precision) -> AbstractContextManager[object]:
    """bf16 autocast on ``device`` when asked, else nothing."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext()


class TrainConfig(BaseModel):
    """How one model is fitted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    epochs: int = Field(2, gt=0)
    """Passes over the training rows."""
    batch_size: int = Field(512, gt=0)
    """Rows per optimizer step."""
    learning_rate: float = Field(2e-3, gt=0)
    """Adam step size."""
    weight_decay: float = Field(0.0, ge=0)
    """Decoupled weight decay (AdamW)."""
    seed: int = 0
    """Seeds shuffling, initialisation and dropout."""
    device: str = "cpu"
    """Where the model trains: cpu, cuda, cuda:N or auto (CUDA when present)."""
    precision: Precision = "fp32"
    """fp32, or bf16 autocast of the forward passes."""


@contextmanager
def seeded_torch(seed: int) -> Iterator[None]:
    """torch's global generator (CPU) seeded with ``seed`` inside the block, and restored to the
    caller's state when the block ends: what module initialisation and dropout draw inside the
    block repeats run after run, and nothing outside it is reseeded."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's *process-wide* generators, for entry points (a script,
    a notebook) that want every later draw repeatable. Library code uses :func:`seeded_torch`
    and local generators instead, so it never reseeds its caller's state."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


LossOf = Callable[[torch.Tensor, torch.device], torch.Tensor]
"""``loss_of(index, device)``: the loss of the rows ``index``, their inputs moved to ``device``."""


def _fit(
    model: nn.Module,
    num_rows: int,
    loss_of: LossOf,
    cfg: TrainConfig,
    progress: ProgressCallback | None,
) -> list[float]:
    """Mini-batch AdamW over ``num_rows`` on ``cfg.device``; ``loss_of(index, device)`` returns
    the batch loss. The model comes back on the CPU.

    Dropout draws from torch's global generator, seeded with ``cfg.seed`` for the loop only
    (:func:`seeded_torch`); the shuffling has its own generator.
    """
    if num_rows == 0:
        raise ValueError("cannot train on zero rows")
    with seeded_torch(cfg.seed):
        return _fit_loop(model, num_rows, loss_of, cfg, progress)


def _fit_loop(
    model: nn.Module,
    num_rows: int,
    loss_of: LossOf,
    cfg: TrainConfig,
    progress: ProgressCallback | None,
) -> list[float]:
    device = resolve_device(cfg.device)
    model.to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay
    )
    generator = torch.Generator().manual_seed(cfg.seed)
    steps_per_epoch = (num_rows + cfg.batch_size - 1) // cfg.batch_size
    total = steps_per_epoch * cfg.epochs
    losses: list[float] = []
    model.train()
    step = 0
    for epoch in range(cfg.epochs):
        order = torch.randperm(num_rows, generator=generator)
        running = 0.0
        for start in range(0, num_rows, cfg.batch_size):
            index = order[start : start + cfg.batch_size]
            with autocast(device, cfg.precision):
                loss = loss_of(index, device)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            running += float(loss.detach())
            step += 1
            if progress is not None:
                progress(step, total)
        losses.append(running / steps_per_epoch)
        logger.debug("epoch %s loss %.5f", epoch, losses[-1])
    model.eval()
    model.to("cpu")
    return losses


def train_foundation(
    fm: FoundationModel,
    batch: PairBatch,
    labels: torch.Tensor,
    cfg: TrainConfig,
    progress: ProgressCallback | None = None,
) -> list[float]:
    """Fit every task head at once (sum of per-task BCE). Returns the mean loss per epoch."""
    _check_labels(batch, labels, fm.num_tasks)
    return _fit(
        fm,
        len(batch),
        lambda idx, device: (
            F.binary_cross_entropy_with_logits(
                fm(batch.select(idx).to(device)).float(),
                labels[idx].to(device),
                reduction="none",
            )
            .sum(-1)
            .mean()
        ),
        cfg,
        progress,
    )


def train_compressor(
    compressor: EmbeddingCompressor,
    representations: torch.Tensor,
    cfg: TrainConfig,
    progress: ProgressCallback | None = None,
) -> list[float]:
    """Fit the autoencoder on FM representations ``(N, D)`` by reconstruction MSE."""
    h = representations.detach()

    def loss_of(idx: torch.Tensor, device: torch.device) -> torch.Tensor:
        rows = h[idx].to(device)
        return F.mse_loss(compressor(rows).float(), rows)

    return _fit(compressor, len(h), loss_of, cfg, progress)


def train_vertical(
    vm: VerticalModel,
    batch: PairBatch,
    labels: torch.Tensor,
    cfg: TrainConfig,
    z: torch.Tensor | None = None,
    tier: torch.Tensor | None = None,
    soft_labels: torch.Tensor | None = None,
    distillation_weight: float = 0.5,
    progress: ProgressCallback | None = None,
) -> list[float]:
    """Fit the VM on hard labels, optionally with a SOLARIS embedding ``z`` ``(N, d)`` and its tier
    ``(N,)``, or with soft labels ``(N, T)`` from the FM (knowledge distillation): the target is
    then ``(1 - w) * hard + w * soft``."""
    _check_labels(batch, labels, vm.num_tasks)
    if not 0.0 <= distillation_weight <= 1.0:
        raise ValueError(f"distillation_weight must lie in [0, 1], got {distillation_weight}")
    target = labels
    if soft_labels is not None:
        if soft_labels.shape != labels.shape:
            raise ValueError(
                f"soft labels {tuple(soft_labels.shape)} != labels {tuple(labels.shape)}"
            )
        target = (1.0 - distillation_weight) * labels + distillation_weight * soft_labels

    def loss_of(idx: torch.Tensor, device: torch.device) -> torch.Tensor:
        logits = vm(
            batch.select(idx).to(device),
            None if z is None else z[idx].to(device),
            None if tier is None else tier[idx].to(device),
        ).float()
        rows = target[idx].to(device)
        return F.binary_cross_entropy_with_logits(logits, rows, reduction="none").sum(-1).mean()

    return _fit(vm, len(batch), loss_of, cfg, progress)


@torch.inference_mode()
def foundation_outputs(fm: FoundationModel, batch: PairBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """``h(u, i)`` ``(N, D)`` and task probabilities ``(N, T)``, in chunks."""
    fm.eval()
    reps, probs = [], []
    for start in range(0, len(batch), INFERENCE_CHUNK):
        part = batch.select(slice(start, start + INFERENCE_CHUNK))
        h = fm.representation(part)
        reps.append(h)
        probs.append(torch.sigmoid(fm.logits_from_representation(h)))
    return torch.cat(reps), torch.cat(probs)


@torch.inference_mode()
def vertical_probabilities(
    vm: VerticalModel,
    batch: PairBatch,
    z: torch.Tensor | None = None,
    tier: torch.Tensor | None = None,
) -> torch.Tensor:
    """Task probabilities ``(N, T)``, in chunks."""
    vm.eval()
    out = []
    for start in range(0, len(batch), INFERENCE_CHUNK):
        sl = slice(start, start + INFERENCE_CHUNK)
        out.append(
            vm.predict_proba(
                batch.select(sl), None if z is None else z[sl], None if tier is None else tier[sl]
            )
        )
    return torch.cat(out)


@torch.inference_mode()
def encode(compressor: EmbeddingCompressor, h: torch.Tensor) -> torch.Tensor:
    compressor.eval()
    return torch.cat(
        [compressor.encode(h[s : s + INFERENCE_CHUNK]) for s in range(0, len(h), INFERENCE_CHUNK)]
    )


def flops_per_pair(model: nn.Module, forward: Callable[[], torch.Tensor], batch_size: int) -> float:
    """Floating point operations of one forward pass per pair, counted by torch's FLOP counter."""
    model.eval()
    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        forward()
    return counter.get_total_flops() / batch_size


def _check_labels(batch: PairBatch, labels: torch.Tensor, num_tasks: int) -> None:
    if labels.shape != (len(batch), num_tasks):
        raise ValueError(f"labels must be ({len(batch)}, {num_tasks}), got {tuple(labels.shape)}")
    if not torch.isfinite(labels).all():
        raise ValueError("labels contain NaN or infinite values")
