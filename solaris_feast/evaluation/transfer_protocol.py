"""The transfer protocol: TR as a serving system and an outside reviewer would measure it.

What differs from the first evaluation (``transfer.py``, kept for its keys):

- **``z`` as served.** The FM runs at precompute rounds (``round_seconds``, hourly by default):
  its inputs are read as of the round (``floor(t, round)``), ``computed_at`` is the round, and
  the VM gets what the product's one tier rule (:func:`solaris_feast.serving.resolve.resolve`)
  serves with the view TTLs, in training and in evaluation alike. Staleness 0 (inputs and
  ``computed_at`` at the request itself) is reported beside it as an upper bound; the tier mix
  at a 10% budget is drawn as :func:`solaris_feast.models.chain.tier_mix_inputs` draws the serving
  VM's (exact on 10% of rows, similarity fill and user aggregate of earlier rounds on others).
- **The denominator is the full-span FM**, trained on the whole training window. ``z`` comes
  from a *previous-window* FM, trained on the earliest ``f`` of the window, as production has an
  FM trained before the VM's rows were logged; the VM sees ``z`` only on rows after that cut
  (ZERO before it), where that FM is out of sample. ``f`` is chosen per split on a validation
  window (the last ``validation_span`` of the training window, models refitted on the rest),
  never on the test window. Epochs, learning rates and the KD weight are fixed in advance
  (:class:`~solaris_feast.evaluation.transfer.TransferConfig`), not tuned on any window.
- **A strong VM.** Every VM (and the KD student, and the label-smoothing control) reads the
  streaming history counters of :class:`~solaris_feast.models.features.StreamingHistory` at
  request time; TR is measured over that VM.
- **Surfaces.** With ``vm_surface`` set (a log with a ``surface`` column, as the synthetic
  surfaces world has), every FM trains on engagement from all surfaces and reads its history
  across them, while every VM (and KD student and control) trains, reads its counters and is
  evaluated on its own surface's rows only, as in the SOLARIS setting; the FM's figures (the
  denominator) are taken on the same test rows. ``fm_history="own_surface"`` is the ablation
  arm: the FMs train on the same rows of every surface, each row's history read on its own
  surface only, so the other surfaces' engagement never reaches the FM's inputs.
- **Statistics.** Forward-chaining splits (train on ``[start, end)``, test on
  ``[end, end + test_span)``) x seeds; TR per task is a ratio of means over them,
  ``sum(NE_vm - NE_x) / sum(NE_vm - NE_fm)``, with a user-cluster bootstrap 95% interval (users
  are redrawn per split, the same draw for every seed). Warm users (at least
  ``warm_min_events`` events before the split) and cold users are reported apart. torch runs
  on ``torch_threads`` threads for the whole protocol so figures repeat across machines.

Cost per split and seed: two FMs, one compressor, six VMs; plus, per split, one FM, one
compressor and one VM per candidate ``f`` on the validation window.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Literal

import numpy as np
import pandas as pd
import torch
from pydantic import BaseModel, ConfigDict, Field

from solaris_feast.data.schema import (
    EVENT_TIMESTAMP,
    ITEM_ID,
    USER_ID,
    InteractionDataset,
    earliest_rows,
)
from solaris_feast.data.synthetic import SURFACE
from solaris_feast.evaluation.metrics import (
    cluster_bootstrap_weights,
    clustered_normalized_entropy,
    normalized_entropy,
    ratio_of_means_interval,
    row_log_loss,
)
from solaris_feast.evaluation.transfer import TransferConfig
from solaris_feast.models.compressor import PCA, EmbeddingCompressor
from solaris_feast.models.features import (
    PairBatch,
    PairFeaturizer,
    StreamingHistory,
    labels_of,
    schema_with_history,
    with_history,
)
from solaris_feast.models.foundation import FoundationModel
from solaris_feast.models.training import (
    encode,
    foundation_outputs,
    seeded_torch,
    train_compressor,
    train_foundation,
    train_vertical,
    vertical_probabilities,
)
from solaris_feast.models.vertical import VerticalModel, fm_span_tiers
from solaris_feast.progress import StageProgress
from solaris_feast.serving.resolve import TierValues, resolve
from solaris_feast.store.definitions import (
    DEFAULT_PAIR_TTL_SECONDS,
    DEFAULT_SIMILAR_TTL_SECONDS,
    DEFAULT_USER_TTL_SECONDS,
)
from solaris_feast.tiers import FmRowsTier, Tier

logger = logging.getLogger(__name__)

FmHistory = Literal["all_surfaces", "own_surface"]
FmInputs = Literal["request", "round"]
ZERO_Z_CONTROL = "vm_zero_z"
"""Contender: the served VM's tiers with zero vectors, the control for what z's content adds."""
TIER_MIX_MODE = "tier_mix"
"""Serving mode name of the 10%-budget tier mix (the others are staleness seconds)."""


class ServedTierMix(BaseModel):
    """Shares of rows per tier in the tier-mix mode; the rest get ZERO."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    exact: float = Field(0.1, ge=0, le=1)
    """The FM budget: exact embeddings on this share of requested pairs."""
    similar: float = Field(0.15, ge=0, le=1)
    user_agg: float = Field(0.2, ge=0, le=1)


class ProtocolConfig(BaseModel):
    """How the protocol splits, serves and counts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    train_ends: tuple[float, ...] = (0.7, 0.8, 0.9)
    """Forward-chaining splits: each trains on the log's span up to this share of it."""
    test_span: float = Field(0.1, gt=0, lt=1)
    """Share of the log's span each split tests on, right after its training window."""
    validation_span: float = Field(0.2, gt=0, lt=1)
    """Last share of each training window that chooses the previous-window cut ``f``."""
    prev_fm_fractions: tuple[float, ...] = (0.5, 0.75)
    """Candidate cuts ``f``: the previous-window FM trains on the earliest ``f`` of the window."""
    soft_label_weights: tuple[float, ...] = (0.25, 0.5, 0.75)
    """Candidate weights of the soft target, chosen per split on the validation window for the
    KD student and, apart, for the label-smoothing control (the same grid for both)."""
    round_seconds: int = Field(3600, gt=0)
    """Precompute schedule: ``tr_served`` serves ``z`` from rounds this far apart."""
    staleness_seconds: tuple[int, ...] = (0, 3600)
    """Round intervals of ``tr_by_staleness``; 0 computes ``z`` at the request (upper bound)."""
    pair_ttl_seconds: float = Field(DEFAULT_PAIR_TTL_SECONDS, gt=0)
    similar_ttl_seconds: float = Field(DEFAULT_SIMILAR_TTL_SECONDS, gt=0)
    user_ttl_seconds: float = Field(DEFAULT_USER_TTL_SECONDS, gt=0)
    tier_mix: ServedTierMix = ServedTierMix()
    resolve_bucket_seconds: int = Field(60, gt=0)
    """Requests are resolved in buckets this long, each at its latest request time: a value fresh
    then is fresh for every earlier request of the bucket, so ages are overstated by less than
    a bucket, never understated."""
    bootstrap_replicates: int = Field(500, gt=0)
    warm_min_events: int = Field(5, ge=0)
    """Users with at least this many events before a split's end are warm; the rest cold."""
    torch_threads: int = Field(1, gt=0)
    vm_surface: int | None = None
    """The surface the VM trains, reads its counters and is tested on (the log's ``surface``
    column); the FM trains on every surface. ``None``: every row is the VM's."""
    fm_history: FmHistory = "all_surfaces"
    """Which events every FM's history reads. ``all_surfaces``: the user's events on every
    surface (the cross-surface signal). ``own_surface``: only those on the row's own surface;
    the FMs still train on every surface's rows, the same rows with the same labels and steps,
    so against ``all_surfaces`` this withholds the other surfaces' engagement from the FM's
    inputs and nothing else (the ablation arm that tells the cross-surface signal from the
    larger training set). Needs ``vm_surface``."""
    fm_inputs: FmInputs = "request"
    """The inputs the previous-window FM, the one that serves ``z``, trains on (its compressor
    too). ``request``: each training row's history as of the row itself. ``round``: as of the
    last round at or before the row (``round_seconds``), which is what it is served with: an
    FM trained on up-to-the-second history leans on the last minutes, which the hourly round
    never has. The full-span FM (the denominator) and the KD teacher read as of the request
    either way."""
    fm_rows: FmRowsTier = "zero"
    """The tier the served VMs (and the zero-z control) train with on the rows the
    previous-window FM trained on, where it serves no ``z``. ``zero``: tier ZERO, as serving
    sends for a pair with nothing stored, so ZERO also learns the FM span's base rate and the
    served tiers mark "after the cut" (a time signal the zero-z control measures). ``own_tier``:
    a training-only tier (:data:`~solaris_feast.models.vertical.FM_SPAN_TIER`), so ZERO and the
    served tiers learn only from rows after the cut (as
    :attr:`~solaris_feast.models.chain.TierMix.fm_rows` does for the chain)."""


DEFAULT_VM_SURFACE = 0
"""The VM's surface when a log has surfaces and the caller names none."""


def protocol_for(
    dataset: InteractionDataset,
    fm_history: FmHistory = "all_surfaces",
    base: ProtocolConfig | None = None,
    fm_rows: FmRowsTier = "zero",
    fm_inputs: FmInputs = "request",
) -> ProtocolConfig:
    """``base`` (the defaults when ``None``) for ``dataset``: on a log with surfaces the VM gets
    :data:`DEFAULT_VM_SURFACE` unless ``base`` names one; ``fm_history``, ``fm_rows`` and
    ``fm_inputs`` as given. What ``solaris evaluate transfer`` and
    ``benchmarks/bench_transfer_surfaces.py`` both run."""
    cfg = base or ProtocolConfig()
    update: dict[str, object] = {
        "fm_history": fm_history,
        "fm_rows": fm_rows,
        "fm_inputs": fm_inputs,
    }
    if SURFACE in dataset.interactions.columns and cfg.vm_surface is None:
        update["vm_surface"] = DEFAULT_VM_SURFACE
    # Validated again: model_copy does not, and a bad fm_history should fail here.
    out = cfg.model_validate({**cfg.model_dump(), **update})
    if out.fm_history == "own_surface" and out.vm_surface is None:
        raise ValueError(
            "fm_history='own_surface' needs a log with surfaces (a synthetic world "
            "with surfaces: surfaces or both)"
        )
    return out


@dataclass
class _SplitRows:
    """Test rows of one split and the predictions of every contender per seed."""

    index: int
    train_end: str
    test_end: str
    prev_fm_fraction: float
    validation_ne: dict[str, float]
    kd_weight: float
    label_smoothing_weight: float
    validation_ne_soft: dict[str, dict[str, float]]
    users: np.ndarray
    labels: np.ndarray
    warm: np.ndarray
    world: str | None = None
    """The world (data draw) of the split when the protocol pools several; else ``None``."""
    probabilities: list[dict[str, np.ndarray]] = field(default_factory=list)


Step = StageProgress


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch on ``n`` threads inside the block, the caller's count restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_protocol(
    dataset: InteractionDataset,
    seeds: Sequence[int],
    models: TransferConfig | None = None,
    config: ProtocolConfig | None = None,
    progress: Step | None = None,
) -> dict[str, object]:
    """Run every split x seed and return the ``protocol`` record and its details."""
    return run_protocol_pooled({dataset.name: dataset}, seeds, models, config, progress)


def run_protocol_pooled(
    worlds: Mapping[str, InteractionDataset],
    seeds: Sequence[int],
    models: TransferConfig | None = None,
    config: ProtocolConfig | None = None,
    progress: Step | None = None,
) -> dict[str, object]:
    """Run every split x seed of every world (name -> log) and return one ``protocol`` record
    over all of them, and its details.

    A world is another draw of the data (a synthetic log's seed): its splits join the others
    as strata of one ratio of means, each split's users redrawn apart in the bootstrap, so the
    interval covers the user sampling within the worlds run, not the spread between worlds
    (``per_world`` reports each world's own figure beside it). With one world this is
    :func:`run_protocol`."""
    mc = models or TransferConfig()
    cfg = config or ProtocolConfig()
    if not seeds:
        raise ValueError("the protocol needs at least one seed")
    if not worlds:
        raise ValueError("the protocol needs at least one world")
    started = time.perf_counter()
    splits: list[_SplitRows] = []
    total = len(worlds) * len(cfg.train_ends) * len(seeds)
    tasks = next(iter(worlds.values())).label_columns
    with torch_threads(cfg.torch_threads):
        for name, dataset in worlds.items():
            if dataset.label_columns != tasks:
                raise ValueError(
                    f"world {name!r} has tasks {dataset.label_columns}, the first world "
                    f"{tasks}: pooled worlds share tasks"
                )
            world_label = name if len(worlds) > 1 else None
            splits.extend(
                _world_splits(dataset, seeds, mc, cfg, progress, len(splits), total, world_label)
            )
    record = _summarise(splits, tasks, cfg, seeds)
    record["details"]["seconds"] = round(time.perf_counter() - started, 1)  # type: ignore[index]
    return record


def _world_splits(
    dataset: InteractionDataset,
    seeds: Sequence[int],
    mc: TransferConfig,
    cfg: ProtocolConfig,
    progress: Step | None,
    offset: int,
    total: int,
    world_label: str | None,
) -> list[_SplitRows]:
    """One world's splits, each with every seed's predictions; indices from ``offset`` on."""
    world = _World(dataset, mc, cfg.vm_surface, cfg.fm_history)
    splits: list[_SplitRows] = []
    for k, end in enumerate(cfg.train_ends):
        train_rows, test_rows = _split(dataset.interactions, end, cfg.test_span)
        # The VM's surface only: the test rows, and the events that make a user warm.
        test_rows = test_rows & world.vm_mask
        if not test_rows.any():
            raise ValueError(f"split at {end:.2f} has no test rows on the VM's surface")
        fraction, val_ne = _choose_prev_fraction(world, train_rows, seeds[0], mc, cfg)
        weights, val_soft = _choose_soft_label_weights(world, train_rows, seeds[0], mc, cfg)
        log = dataset.interactions
        test_log = log.loc[test_rows]
        users = test_log[USER_ID].to_numpy(np.int64)
        before = np.bincount(
            log.loc[train_rows & world.vm_mask, USER_ID].to_numpy(np.int64),
            minlength=dataset.num_users,
        )
        split = _SplitRows(
            index=offset + k,
            train_end=str(log.loc[test_rows, EVENT_TIMESTAMP].min()),
            test_end=str(log.loc[test_rows, EVENT_TIMESTAMP].max()),
            prev_fm_fraction=fraction,
            validation_ne=val_ne,
            kd_weight=weights["kd"],
            label_smoothing_weight=weights["label_smoothing"],
            validation_ne_soft=val_soft,
            users=users,
            labels=labels_of(test_log, dataset.label_columns).numpy(),
            warm=before[users] >= cfg.warm_min_events,
            world=world_label,
        )
        for seed in seeds:
            if progress is not None:
                done = (offset + k) * len(seeds) + len(split.probabilities)
                progress("protocol: splits x seeds", done, total)
            split.probabilities.append(
                _contenders(world, train_rows, test_rows, fraction, weights, seed, mc, cfg)
            )
            logger.info("world %s split %s seed %s done", world_label or dataset.name, k, seed)
        splits.append(split)
    return splits


class _World:
    """Featurizers over the whole log: every row's inputs are cut strictly before its time.
    The FM's history reads every surface (``fm_history="own_surface"``: the row's own); the VM's
    counters read its own surface (``vm_surface``) only."""

    def __init__(
        self,
        dataset: InteractionDataset,
        mc: TransferConfig,
        vm_surface: int | None = None,
        fm_history: FmHistory = "all_surfaces",
    ) -> None:
        self.dataset = dataset
        self.tasks = dataset.label_columns
        self.vm_surface = vm_surface
        log = dataset.interactions
        if vm_surface is not None and SURFACE not in log.columns:
            raise ValueError(f"vm_surface={vm_surface} needs a {SURFACE!r} column in the log")
        if fm_history == "own_surface" and vm_surface is None:
            raise ValueError("fm_history='own_surface' needs a vm_surface (a log with surfaces)")
        self.vm_mask = self.vm_rows(log)
        if not self.vm_mask.any():
            raise ValueError(f"no rows on the VM's surface {vm_surface}")
        self.fm_featurizer = PairFeaturizer(dataset, mc.history_len)
        # Per surface, a featurizer over that surface's events only: the FM's inputs when its
        # history reads the row's own surface.
        self.fm_by_surface: dict[int, PairFeaturizer] | None = None
        if fm_history == "own_surface":
            self.fm_by_surface = {
                int(s): PairFeaturizer(
                    dataset.with_interactions(log.loc[(log[SURFACE] == s).to_numpy()]),
                    mc.history_len,
                )
                for s in np.unique(log[SURFACE].to_numpy())
            }
        own = dataset if vm_surface is None else dataset.with_interactions(log.loc[self.vm_mask])
        self.history = StreamingHistory(own)
        self.fm_schema = self.fm_featurizer.schema
        self.vm_schema = schema_with_history(self.fm_schema)

    def fm_batch(self, log: pd.DataFrame, at: pd.Series | None = None) -> PairBatch:
        """FM inputs of ``log``'s rows as of ``at`` (a series beside ``log``; by default each
        row's own time), with the history ``fm_history`` says."""
        when = log[EVENT_TIMESTAMP] if at is None else at
        users, items = log[USER_ID].to_numpy(np.int64), log[ITEM_ID].to_numpy(np.int64)
        if self.fm_by_surface is None:
            return self.fm_featurizer.batch(users, items, when)
        when = when.reset_index(drop=True)
        surface = log[SURFACE].to_numpy()
        parts = []
        for s, featurizer in self.fm_by_surface.items():
            rows = np.flatnonzero(surface == s)
            if len(rows):
                parts.append((rows, featurizer.batch(users[rows], items[rows], when.iloc[rows])))
        if len(surface) and sum(len(rows) for rows, _ in parts) != len(surface):
            raise ValueError("log has rows on a surface the world's log does not have")
        if not parts:
            return self.fm_featurizer.batch(users, items, when)
        return _merge_rows(len(log), parts)

    def fm_inputs(self, log: pd.DataFrame, round_seconds: int) -> PairBatch:
        """FM inputs as of the last round at or before each row (the row's time for 0)."""
        at = log[EVENT_TIMESTAMP]
        if round_seconds > 0:
            at = at.dt.floor(f"{round_seconds}s")
        return self.fm_batch(log, at)

    def vm_rows(self, log: pd.DataFrame) -> np.ndarray:
        """Mask of ``log``'s rows on the VM's surface (all rows without one)."""
        if self.vm_surface is None:
            return np.ones(len(log), dtype=bool)
        return (log[SURFACE] == self.vm_surface).to_numpy()

    def vm_log(self, log: pd.DataFrame) -> pd.DataFrame:
        """``log``'s rows on the VM's surface, in order, reindexed."""
        return log.loc[self.vm_rows(log)].reset_index(drop=True)

    def vm_inputs(self, log: pd.DataFrame) -> PairBatch:
        """VM inputs at request time: ids, attributes and the streaming counters."""
        return with_history(self.fm_featurizer.for_log(log), self.history.for_log(log))


def _merge_rows(n: int, parts: list[tuple[np.ndarray, PairBatch]]) -> PairBatch:
    """One batch of ``n`` rows from batches of the rows ``parts`` name (together all of them)."""
    merged: dict[str, torch.Tensor] = {}
    for f in fields(PairBatch):
        first = getattr(parts[0][1], f.name)
        out = first.new_zeros((n, *first.shape[1:]))
        for rows, batch in parts:
            out[torch.from_numpy(rows)] = getattr(batch, f.name)
        merged[f.name] = out
    return PairBatch(**merged)


def _split(log: pd.DataFrame, end: float, span: float) -> tuple[np.ndarray, np.ndarray]:
    ts = log[EVENT_TIMESTAMP]
    lo, width = ts.min(), ts.max() - ts.min()
    cut, stop = lo + width * end, lo + width * min(end + span, 1.0)
    train = (ts < cut).to_numpy()
    test = ((ts >= cut) & (ts <= stop)).to_numpy()
    if not train.any() or not test.any():
        raise ValueError(f"split at {end:.2f} of the span leaves an empty side")
    return train, test


def _fit_fm(
    world: _World,
    log: pd.DataFrame,
    seed: int,
    mc: TransferConfig,
    batch: PairBatch | None = None,
) -> FoundationModel:
    """An FM fitted on ``log``'s rows, read as ``batch`` (by default as of each row)."""
    with seeded_torch(seed):
        fm = FoundationModel(world.fm_schema, len(world.tasks), mc.foundation)
    train_foundation(
        fm,
        world.fm_batch(log) if batch is None else batch,
        labels_of(log, world.tasks),
        mc.fm_training.model_copy(update={"seed": seed}),
    )
    return fm


def _fit_compressor(
    fm: FoundationModel, batch: PairBatch, seed: int, mc: TransferConfig
) -> EmbeddingCompressor:
    h, _ = foundation_outputs(fm, batch)
    pca = PCA(h, mc.compressor.code_dim)
    with seeded_torch(seed):
        compressor = EmbeddingCompressor(mc.compressor.model_copy(update={"input_dim": h.shape[1]}))
    compressor.init_from_pca(pca)
    train_compressor(compressor, h, mc.compressor_training.model_copy(update={"seed": seed}))
    return compressor


def _fit_vm(
    world: _World,
    batch: PairBatch,
    labels: torch.Tensor,
    seed: int,
    mc: TransferConfig,
    z: torch.Tensor | None = None,
    tier: torch.Tensor | None = None,
    soft_labels: torch.Tensor | None = None,
    weight: float = 0.0,
) -> VerticalModel:
    dim = 0 if z is None else int(z.shape[1])
    with seeded_torch(seed):
        vm = VerticalModel(
            world.vm_schema, len(world.tasks), mc.vertical.model_copy(update={"embedding_dim": dim})
        )
    train_vertical(
        vm,
        batch,
        labels,
        mc.vm_training.model_copy(update={"seed": seed}),
        z=z,
        tier=tier,
        soft_labels=soft_labels,
        distillation_weight=weight,
    )
    return vm


def served_z(
    world: _World,
    log: pd.DataFrame,
    eligible: np.ndarray,
    fm: FoundationModel,
    compressor: EmbeddingCompressor,
    mode: int | str,
    cfg: ProtocolConfig,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """``z`` ``(N, d)``, tier ``(N,)`` and ``computed_at`` seconds ``(N,)`` (NaN for ZERO) the
    VM is served for ``log``'s rows (time-ordered) under ``mode``: a staleness in seconds (0:
    computed at the request; otherwise at the last round), or :data:`TIER_MIX_MODE`. Only
    ``eligible`` rows hold a value; everything goes through :func:`resolve`."""
    from solaris_feast.models.chain import TierMix, tier_mix_inputs

    round_s = cfg.round_seconds if mode == TIER_MIX_MODE else int(mode)
    h, _ = foundation_outputs(fm, world.fm_inputs(log, round_s))
    z = encode(compressor, h).numpy()
    request_s = log[EVENT_TIMESTAMP].astype("int64").to_numpy() / 1e9
    computed_s = request_s - np.mod(request_s, round_s) if round_s > 0 else request_s.copy()
    n, dim = z.shape
    stored: dict[Tier, tuple[np.ndarray, np.ndarray]] = {}
    if mode == TIER_MIX_MODE:
        mix = cfg.tier_mix
        tiers, vectors = tier_mix_inputs(
            log,
            torch.from_numpy(z),
            TierMix(exact=mix.exact, similar=mix.similar, user_agg=mix.user_agg),
            seed,
            eligible,
            round_seconds=round_s,
        )
        for tier in (Tier.EXACT, Tier.SIMILAR, Tier.USER_AGG):
            stored[tier] = (vectors.numpy(), tiers.numpy() == int(tier))
    else:
        stored[Tier.EXACT] = (z, np.asarray(eligible, dtype=bool))
    ttl = {
        Tier.EXACT: cfg.pair_ttl_seconds,
        Tier.SIMILAR: cfg.similar_ttl_seconds,
        Tier.USER_AGG: cfg.user_ttl_seconds,
    }
    out_z = np.zeros((n, dim), dtype=np.float32)
    out_tier = np.full(n, int(Tier.ZERO), dtype=np.int64)
    out_at = np.full(n, np.nan)
    bucket = np.floor(request_s / cfg.resolve_bucket_seconds)
    bounds = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1], True])
    for lo, hi in itertools.pairwise(bounds.tolist()):
        rows = slice(lo, hi)
        values = {
            tier: TierValues(
                vectors=vec[rows].astype(np.float32),
                present=present[rows],
                version_matches=np.ones(hi - lo, dtype=bool),
                computed_at_s=computed_s[rows],
            )
            for tier, (vec, present) in stored.items()
        }
        res = resolve(values, now_s=float(request_s[rows].max()), ttl_seconds=ttl)
        out_z[rows] = res.embeddings
        out_tier[rows] = res.tiers
        served = res.tiers != int(Tier.ZERO)
        out_at[rows] = np.where(served, computed_s[rows], np.nan)
    return torch.from_numpy(out_z), torch.from_numpy(out_tier), out_at


def _served_vm_probabilities(
    world: _World,
    train_log: pd.DataFrame,
    test_log: pd.DataFrame,
    prev_fraction: float,
    seed: int,
    mc: TransferConfig,
    cfg: ProtocolConfig,
    modes: Sequence[int | str],
    with_control: bool = False,
) -> dict[str, np.ndarray]:
    """The previous-window FM's ``z`` served to a VM per mode; test probabilities per mode.
    The full-span FM (the denominator) never feeds the VM. ``train_log`` holds every surface
    (the FM's); the VM trains on its own surface's rows of it, ``test_log`` is the VM's."""
    prev_rows = earliest_rows(train_log, prev_fraction)
    prev_log = train_log.loc[prev_rows]
    prev_batch = (
        world.fm_inputs(prev_log, cfg.round_seconds)
        if cfg.fm_inputs == "round"
        else world.fm_batch(prev_log)
    )
    fm_prev = _fit_fm(world, prev_log, seed, mc, prev_batch)
    compressor = _fit_compressor(fm_prev, prev_batch, seed, mc)
    own = world.vm_rows(train_log)
    vm_train_log = train_log.loc[own].reset_index(drop=True)
    both = pd.concat([vm_train_log, test_log], ignore_index=True)
    eligible = np.r_[~prev_rows[own], np.ones(len(test_log), dtype=bool)]
    n_train = len(vm_train_log)
    train_batch, test_batch = world.vm_inputs(vm_train_log), world.vm_inputs(test_log)
    y_train = labels_of(vm_train_log, world.tasks)
    out: dict[str, np.ndarray] = {}
    for mode in modes:
        z, tier, _ = served_z(world, both, eligible, fm_prev, compressor, mode, cfg, seed)
        train_tier = tier[:n_train]
        if cfg.fm_rows == "own_tier":
            train_tier = fm_span_tiers(train_tier, ~eligible[:n_train])
        vm = _fit_vm(world, train_batch, y_train, seed, mc, z[:n_train], train_tier)
        out[f"vm_z@{mode}"] = vertical_probabilities(
            vm, test_batch, z[n_train:], tier[n_train:]
        ).numpy()
        if with_control and mode == cfg.round_seconds:
            # The control: the same tiers with zero vectors. The tier alone tells the VM which
            # rows come after the cut (a time signal); what z adds over this is z's content.
            zero = torch.zeros_like(z)
            ctrl = _fit_vm(world, train_batch, y_train, seed, mc, zero[:n_train], train_tier)
            out[ZERO_Z_CONTROL] = vertical_probabilities(
                ctrl, test_batch, zero[n_train:], tier[n_train:]
            ).numpy()
    return out


def _contenders(
    world: _World,
    train_rows: np.ndarray,
    test_rows: np.ndarray,
    prev_fraction: float,
    soft_weights: dict[str, float],
    seed: int,
    mc: TransferConfig,
    cfg: ProtocolConfig,
) -> dict[str, np.ndarray]:
    """Test probabilities of every contender for one split and seed (the soft-target weights
    as chosen on the split's validation window)."""
    log = world.dataset.interactions
    train_log = log.loc[train_rows].reset_index(drop=True)
    test_log = log.loc[test_rows].reset_index(drop=True)
    fm_full = _fit_fm(world, train_log, seed, mc)
    vm_train_log = world.vm_log(train_log)
    _, p_train = foundation_outputs(fm_full, world.fm_batch(vm_train_log))
    _, p_test = foundation_outputs(fm_full, world.fm_batch(test_log))
    train_batch, test_batch = world.vm_inputs(vm_train_log), world.vm_inputs(test_log)
    y_train = labels_of(vm_train_log, world.tasks)
    out = {"fm": p_test.numpy()}
    vm = _fit_vm(world, train_batch, y_train, seed, mc)
    out["vm"] = vertical_probabilities(vm, test_batch).numpy()
    w_kd, w_ls = soft_weights["kd"], soft_weights["label_smoothing"]
    kd = _fit_vm(world, train_batch, y_train, seed, mc, soft_labels=p_train, weight=w_kd)
    out["vm_kd"] = vertical_probabilities(kd, test_batch).numpy()
    # The control: the same target mixing with the base rate in place of the FM. What KD gains
    # over it is the FM's; what both gain over the VM is regularisation.
    base = y_train.mean(dim=0, keepdim=True).expand_as(y_train)
    ls = _fit_vm(world, train_batch, y_train, seed, mc, soft_labels=base, weight=w_ls)
    out["vm_label_smoothing"] = vertical_probabilities(ls, test_batch).numpy()
    modes: list[int | str] = sorted({cfg.round_seconds, *cfg.staleness_seconds})
    modes.append(TIER_MIX_MODE)
    out.update(
        _served_vm_probabilities(
            world, train_log, test_log, prev_fraction, seed, mc, cfg, modes, with_control=True
        )
    )
    return out


def _choose_prev_fraction(
    world: _World,
    train_rows: np.ndarray,
    seed: int,
    mc: TransferConfig,
    cfg: ProtocolConfig,
) -> tuple[float, dict[str, float]]:
    """The cut ``f`` whose served VM has the lowest main-task NE on the validation window (the
    last ``validation_span`` of the training window, models fitted on the part before it)."""
    log = world.dataset.interactions
    window = log.loc[train_rows].reset_index(drop=True)
    fit_rows = earliest_rows(window, 1.0 - cfg.validation_span)
    fit_log, val_log = window.loc[fit_rows], window.loc[~fit_rows]
    fit_log, val_log = fit_log.reset_index(drop=True), world.vm_log(val_log)
    y_val = labels_of(val_log, world.tasks)
    scores: dict[str, float] = {}
    for fraction in cfg.prev_fm_fractions:
        probs = _served_vm_probabilities(
            world, fit_log, val_log, fraction, seed, mc, cfg, [cfg.round_seconds]
        )
        scores[str(fraction)] = normalized_entropy(probs[f"vm_z@{cfg.round_seconds}"], y_val)[0]
    best = min(cfg.prev_fm_fractions, key=lambda f: scores[str(f)])
    return best, scores


def _choose_soft_label_weights(
    world: _World,
    train_rows: np.ndarray,
    seed: int,
    mc: TransferConfig,
    cfg: ProtocolConfig,
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """The soft-target weight of the KD student and, apart, of the label-smoothing control with
    the lowest main-task NE on the validation window (models fitted on the part before it, the
    FM teacher too): neither is tuned on a test window, and the control gets the same search."""
    log = world.dataset.interactions
    window = log.loc[train_rows].reset_index(drop=True)
    fit_rows = earliest_rows(window, 1.0 - cfg.validation_span)
    fm_fit_log = window.loc[fit_rows].reset_index(drop=True)
    fit_log = world.vm_log(fm_fit_log)
    val_log = world.vm_log(window.loc[~fit_rows])
    y_fit, y_val = labels_of(fit_log, world.tasks), labels_of(val_log, world.tasks)
    fit_batch, val_batch = world.vm_inputs(fit_log), world.vm_inputs(val_log)
    _, teacher = foundation_outputs(_fit_fm(world, fm_fit_log, seed, mc), world.fm_batch(fit_log))
    targets = {
        "kd": teacher,
        "label_smoothing": y_fit.mean(dim=0, keepdim=True).expand_as(y_fit),
    }
    scores: dict[str, dict[str, float]] = {}
    chosen: dict[str, float] = {}
    for name, soft in targets.items():
        scores[name] = {}
        for weight in cfg.soft_label_weights:
            vm = _fit_vm(world, fit_batch, y_fit, seed, mc, soft_labels=soft, weight=weight)
            probs = vertical_probabilities(vm, val_batch).numpy()
            scores[name][str(weight)] = normalized_entropy(probs, y_val)[0]
        ne_of = scores[name]
        chosen[name] = min(cfg.soft_label_weights, key=lambda w: ne_of[str(w)])
    return chosen, scores


def _summarise(
    splits: list[_SplitRows], tasks: tuple[str, ...], cfg: ProtocolConfig, seeds: Sequence[int]
) -> dict[str, object]:
    """Ratio-of-means TR per task with user-cluster bootstrap intervals, overall, per split,
    for warm and cold users, per serving mode."""
    rng = np.random.default_rng([int(seeds[0]), 17])
    served = f"vm_z@{cfg.round_seconds}"
    contenders = {
        "tr_served": served,
        "tr_kd_served": "vm_kd",
        "tr_label_smoothing": "vm_label_smoothing",
    }
    staleness = {str(s): f"vm_z@{s}" for s in cfg.staleness_seconds}
    weights = [
        cluster_bootstrap_weights(rng, len(np.unique(s.users)), cfg.bootstrap_replicates)
        for s in splits
    ]

    def gaps(
        who: str,
        task: int,
        chosen: list[int],
        users_mask: Callable[[_SplitRows], np.ndarray],
        base: str = "vm",
    ) -> tuple[float, tuple[float, float] | None]:
        """Point TR and interval over the chosen splits for ``who``: ``NE_base - NE_who`` over
        ``NE_vm - NE_fm``, summed (``base`` another contender to measure ``who`` over it)."""
        nums, dens, point_num, point_den = [], [], 0.0, 0.0
        for k in chosen:
            split = splits[k]
            keep = users_mask(split)
            if not keep.any():
                continue
            uniq, inv = np.unique(split.users, return_inverse=True)
            w = weights[k]
            rows = np.bincount(inv[keep], minlength=len(uniq))
            pos = np.bincount(inv[keep], weights=split.labels[keep, task], minlength=len(uniq))
            ones = np.ones((1, len(uniq)))
            for probs in split.probabilities:
                loss = {
                    name: np.bincount(
                        inv[keep],
                        weights=row_log_loss(probs[name][keep, task], split.labels[keep, task]),
                        minlength=len(uniq),
                    )
                    for name in {"vm", base, who, "fm"}
                }
                vm, b, x, fm = (
                    clustered_normalized_entropy(loss[n], rows, pos, w)
                    for n in ("vm", base, who, "fm")
                )
                nums.append(b - x)
                dens.append(vm - fm)
                vm1, b1, x1, fm1 = (
                    float(clustered_normalized_entropy(loss[n], rows, pos, ones)[0])
                    for n in ("vm", base, who, "fm")
                )
                point_num += b1 - x1
                point_den += vm1 - fm1
        if not nums or point_den <= 0:
            return math.nan, None
        return point_num / point_den, ratio_of_means_interval(
            np.stack(nums, axis=1), np.stack(dens, axis=1)
        )

    def block(
        chosen: list[int], task: int, mask: Callable[[_SplitRows], np.ndarray]
    ) -> dict[str, object]:
        out: dict[str, object] = {}
        for key, who in contenders.items():
            tr, ci = gaps(who, task, chosen, mask)
            out[key] = _finite(tr)
            if key != "tr_label_smoothing":
                out[f"{key}_ci95"] = None if ci is None else [round(ci[0], 4), round(ci[1], 4)]
        out["tr_by_staleness"] = {
            s: _finite(gaps(who, task, chosen, mask)[0]) for s, who in staleness.items()
        }
        return out

    everyone: Callable[[_SplitRows], np.ndarray] = lambda s: np.ones(len(s.users), dtype=bool)  # noqa: E731
    all_splits = list(range(len(splits)))
    per_task = {task: block(all_splits, t, everyone) for t, task in enumerate(tasks)}
    main = per_task[tasks[0]]
    protocol: dict[str, object] = dict(main)
    protocol["per_task"] = per_task
    protocol["per_split"] = [
        {
            "split": s.index,
            **({} if s.world is None else {"world": s.world}),
            "test_window": [s.train_end, s.test_end],
            "prev_fm_fraction": s.prev_fm_fraction,
            "kd_weight": s.kd_weight,
            "label_smoothing_weight": s.label_smoothing_weight,
            **block([s.index], 0, everyone),
            "per_task": {task: block([s.index], t, everyone) for t, task in enumerate(tasks)},
        }
        for s in splits
    ]
    worlds = list(dict.fromkeys(s.world for s in splits if s.world is not None))
    if worlds:
        # Each world's own figure beside the pooled one: the pooled interval is over users
        # within the worlds run, so how far the worlds lie apart is read here.
        protocol["per_world"] = {
            w: block([s.index for s in splits if s.world == w], 0, everyone) for w in worlds
        }
    tier_mix_tr, tier_mix_ci = gaps(f"vm_z@{TIER_MIX_MODE}", 0, all_splits, everyone)
    control_tr, control_ci = gaps(ZERO_Z_CONTROL, 0, all_splits, everyone)
    # z's content: what the served VM gains over the same tiers with zero vectors, the share
    # of the FM's gain left once the tiers' own signal (which rows come after the cut) is out.
    content_tr, content_ci = gaps(served, 0, all_splits, everyone, base=ZERO_Z_CONTROL)
    by_user: dict[str, object] = {}
    for name, mask in (
        ("warm", lambda s: s.warm),
        ("cold", lambda s: ~s.warm),
    ):
        tr, ci = gaps(served, 0, all_splits, mask)
        by_user[name] = {
            "tr_served": _finite(tr),
            "tr_served_ci95": None if ci is None else [round(ci[0], 4), round(ci[1], 4)],
            "test_rows": int(sum(int(mask(s).sum()) for s in splits)),
        }
    ne_means = {
        who: {
            task: float(
                np.mean(
                    [
                        normalized_entropy(p[who][:, t], s.labels[:, t])[0]
                        for s in splits
                        for p in s.probabilities
                    ]
                )
            )
            for t, task in enumerate(tasks)
        }
        for who in splits[0].probabilities[0]
    }
    details: dict[str, object] = {
        "main_task": tasks[0],
        "tr_tier_mix": _finite(tier_mix_tr),
        "tr_tier_mix_ci95": None
        if tier_mix_ci is None
        else [round(tier_mix_ci[0], 4), round(tier_mix_ci[1], 4)],
        "tier_mix": cfg.tier_mix.model_dump(),
        "tr_zero_z_control": _finite(control_tr),
        "tr_zero_z_control_ci95": None
        if control_ci is None
        else [round(control_ci[0], 4), round(control_ci[1], 4)],
        "tr_served_over_zero_z_control": _finite(content_tr),
        "tr_served_over_zero_z_control_ci95": None
        if content_ci is None
        else [round(content_ci[0], 4), round(content_ci[1], 4)],
        "warm_cold": by_user,
        "ne_mean": ne_means,
        "scheme": "previous-window FM (cut f chosen per split on a validation window)",
        "validation_ne": [s.validation_ne for s in splits],
        "validation_ne_soft_label_weights": [s.validation_ne_soft for s in splits],
        "seeds": [int(s) for s in seeds],
        "splits": list(cfg.train_ends),
        **({"worlds": worlds} if worlds else {}),
        "torch_threads": cfg.torch_threads,
        "vm_surface": cfg.vm_surface,
        "fm_rows": cfg.fm_rows,
        "config": cfg.model_dump(),
    }
    return {"protocol": protocol, "details": details}


def _finite(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None
