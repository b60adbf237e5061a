"""Stage 1 of the journey: train the FM, its compressor and the VM on a window, and register them.

The FM and the verifier are the project's reference models or a deployment's own
(:mod:`solaris_feast.models.interface`, named in ``TrainingConfig.fm`` / ``.verifier``): a model
of one's own is registered, not trained, and the compressor is always trained here, on the
representations of whichever FM the chain has. A log with sparse or String ids gets a vocabulary
(:mod:`solaris_feast.models.vocabulary`), saved beside the FM's card, that the reference models
map ids through.

The registered VM is the one serving uses, so it is trained on the tier mix serving produces:
exact embeddings on part of the rows, the user's aggregate on others, a similarity-style fill
(other users' embeddings of the same item) on others, and nothing on the rest. With the tier
indicator beside ``z`` it learns how far to trust each tier.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from solaris_feast.data.schema import (
    EVENT_TIMESTAMP,
    ITEM_ID,
    USER_ID,
    InteractionDataset,
    earliest_rows,
)
from solaris_feast.errors import ConfigError, SchemaError
from solaris_feast.evaluation.transfer import TransferConfig
from solaris_feast.keys import id_array
from solaris_feast.models.compressor import PCA, EmbeddingCompressor
from solaris_feast.models.features import PairBatch, PairFeaturizer, labels_of
from solaris_feast.models.foundation import FoundationModel
from solaris_feast.models.interface import (
    FoundationEncoder,
    ModelChoice,
    OwnModel,
    PairsAsOf,
    build_model,
    call_model,
    checked_representation,
    checked_scores,
    describe,
    encode_in_chunks,
    load_encoder,
    register_interface_model,
    spec_name,
)
from solaris_feast.models.registry import (
    ModelBundle,
    ModelCard,
    list_cards,
    load_bundle,
    load_model,
    parent_card,
    save_model,
)
from solaris_feast.models.training import (
    encode,
    flops_per_pair,
    foundation_outputs,
    normalized_entropy,
    seeded_torch,
    train_compressor,
    train_foundation,
    train_vertical,
    vertical_probabilities,
)
from solaris_feast.models.vertical import VerticalModel, fm_span_tiers
from solaris_feast.models.vocabulary import Vocabulary, VocabularyFeaturizer, featurizer_for
from solaris_feast.progress import StageProgress
from solaris_feast.tiers import FmRowsTier, Tier

logger = logging.getLogger(__name__)


class TierMix(BaseModel):
    """Share of training rows given each tier when the serving VM is trained."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    exact: float = Field(0.5, ge=0, le=1)
    similar: float = Field(0.15, ge=0, le=1)
    user_agg: float = Field(0.2, ge=0, le=1)
    """The rest of the rows get tier ZERO."""
    fm_rows: FmRowsTier = "zero"
    """The tier of the rows the FM trained on (they have no ``z`` the VM may see): ``zero``, as a
    pair the store holds nothing for, or ``own_tier``, a training-only tier
    (:data:`~solaris_feast.models.vertical.FM_SPAN_TIER`) that keeps those rows, the earliest of
    the log, from teaching ZERO their click rate. ``own_tier`` fixed the enrichment tiers'
    calibration in the funnel world, where the FM's span is an earlier ranking policy (10 seeds:
    the user aggregate +6.3 clicks per 1k instead of -6.2), but cost MovieLens 0.008 NE without
    ``z`` and 0.011 with it (ZERO then learns from the few rows after the FM's span), so
    ``zero`` stays the default (``benchmarks/README.md``, funnel section)."""


class TrainingConfig(BaseModel):
    """Models to train for serving: the evaluation's model settings plus the tier mix."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: TransferConfig = TransferConfig()
    tier_mix: TierMix = TierMix()
    fm: ModelChoice = "reference"
    """The FM: ``reference`` (trained here) or a deployment's own (registered, not trained)."""
    verifier: ModelChoice = "reference"
    """The verifier: ``reference`` (the VM, trained here on the tier mix) or one's own."""
    precompute_interval_seconds: int = Field(3600, ge=0)
    """How often the precompute runs (the DAG's schedule). The serving VM is trained on ``z``
    computed as of the last round before each impression, as stale as serving will see it;
    0 computes ``z`` as of the impression itself."""
    seed: int = 0


def simulation_training(
    seed: int, fm_epochs: int | None = None, fm_rows: FmRowsTier = "zero"
) -> TrainingConfig:
    """The chain a simulation (replay or funnel) trains: the defaults with its seed, the FM's
    epochs where given (tests shorten them) and the tier of the FM's rows."""
    training = TrainingConfig(seed=seed, tier_mix=TierMix(fm_rows=fm_rows))
    if fm_epochs is None:
        return training
    fm_training = training.models.fm_training.model_copy(update={"epochs": fm_epochs})
    models = training.models.model_copy(update={"fm_training": fm_training})
    return training.model_copy(update={"models": models})


@dataclass(frozen=True)
class TrainingData:
    """The rows a training run fits on, their model inputs and labels.

    Attributes:
        dataset: The whole log; history of every row is read from it, cut before the row's time.
        log: The rows to fit on (the training window).
        featurizer: Built over ``dataset`` (through ``vocabulary`` when there is one).
        labels: ``(N, T)`` labels of ``log``'s rows.
        fm_rows: ``(N,)`` bool, the earliest rows, which the FM and compressor train on; the VM
            sees ``z`` only on the rest, where the FM is out of sample.
        vocabulary: The id vocabulary of a log with sparse or String ids; None for dense ids.
    """

    dataset: InteractionDataset
    log: pd.DataFrame
    featurizer: PairFeaturizer | VocabularyFeaturizer
    labels: torch.Tensor
    fm_rows: np.ndarray
    vocabulary: Vocabulary | None = None

    @cached_property
    def batch(self) -> PairBatch:
        """Reference-model inputs of ``log``'s rows (built on first use: a chain of the
        deployment's own models never needs them)."""
        return self.featurizer.for_log(self.log)

    @property
    def fm_index(self) -> torch.Tensor:
        return torch.from_numpy(np.flatnonzero(self.fm_rows))

    def pairs(self, rows: np.ndarray | None = None, round_seconds: int = 0) -> PairsAsOf:
        """The pairs of ``log``'s rows (all, or the ``rows`` mask), each as of its own time or,
        with ``round_seconds``, as of the last precompute round before it."""
        log = self.log if rows is None else self.log.loc[rows]
        times = log[EVENT_TIMESTAMP]
        if round_seconds > 0:
            times = times.dt.floor(f"{round_seconds}s")
        return PairsAsOf.of(log[USER_ID], log[ITEM_ID], times, self.dataset)

    @classmethod
    def build(
        cls,
        dataset: InteractionDataset,
        history_len: int,
        window_start: pd.Timestamp | None = None,
        window_end: pd.Timestamp | None = None,
        fm_fraction: float = 0.75,
        vocabulary: Vocabulary | None = None,
    ) -> TrainingData:
        """Inputs for the rows of ``dataset`` in ``[window_start, window_end)``.

        A log with sparse or String ids is featurized through ``vocabulary`` (the chain's FM's,
        for the stages after the FM), else a new one over the window's rows: ids seen at least
        twice get a row, the rest share the out-of-vocabulary row, which so learns what an id
        seen once looks like (serving's new users and items).
        """
        log = dataset.interactions
        keep = np.ones(len(log), dtype=bool)
        if window_start is not None:
            keep &= (log[EVENT_TIMESTAMP] >= window_start).to_numpy()
        if window_end is not None:
            keep &= (log[EVENT_TIMESTAMP] < window_end).to_numpy()
        rows = log.loc[keep].reset_index(drop=True)
        window = f"the training window [{window_start}, {window_end})"
        if rows.empty:
            raise SchemaError(
                dataset.name,
                EVENT_TIMESTAMP,
                f"has no interactions in {window}: widen the "
                "window (training.train_window_hours, --at) or check the log source",
            )
        # A chain trained on one user or on one class learns nothing a card could vouch for
        # (its NE is undefined); refused before any model trains.
        if rows[USER_ID].nunique() < 2:
            raise SchemaError(dataset.name, USER_ID, f"has a single user in {window}")
        for label in dataset.label_columns:
            positives = int(np.count_nonzero(rows[label].to_numpy() > 0))
            if positives == 0 or positives == len(rows):
                kind = "no positive" if positives == 0 else "no negative"
                raise SchemaError(
                    dataset.name, label, f"has {kind} rows among the {len(rows)} in {window}"
                )
        if vocabulary is None and not dataset.dense_ids:
            vocabulary = Vocabulary.from_log(rows, min_count=2)
        return cls(
            dataset=dataset,
            log=rows,
            featurizer=featurizer_for(vocabulary, dataset, history_len),
            labels=labels_of(rows, dataset.label_columns),
            fm_rows=earliest_rows(rows, fm_fraction),
            vocabulary=vocabulary,
        )

    def card_fields(self) -> dict[str, Any]:
        """Training window, data set and tasks, as recorded on every model card."""
        ts = self.log[EVENT_TIMESTAMP]
        return {
            # Whole microseconds, as datetime holds them (pandas warns on dropping nanoseconds).
            "train_window_start": ts.min().floor("us").to_pydatetime(),
            "train_window_end": ts.max().floor("us").to_pydatetime(),
            "dataset": self.dataset.name,
            "tasks": self.dataset.label_columns,
        }

    def train_ne(self, probabilities: torch.Tensor) -> dict[str, float]:
        ne = normalized_entropy(probabilities, self.labels)
        return {f"train_ne_{t}": v for t, v in zip(self.dataset.label_columns, ne, strict=True)}


Progress = Callable[[int, int], None] | None


def fit_foundation(
    data: TrainingData, models_dir: Path, config: TrainingConfig, progress: Progress = None
) -> ModelCard:
    """Train the reference FM on ``data`` and register it, or register the deployment's own
    (``config.fm``); the vocabulary of ``data``, if any, is saved beside the card. The first
    stage of every chain: the deployment's own models are tried first (:func:`check_own_models`).
    """
    check_own_models(data, config)
    if not isinstance(config.fm, str):
        card = register_foundation(config.fm, data, models_dir)
    else:
        card = _train_foundation(data, models_dir, config, progress)
    if data.vocabulary is not None:
        data.vocabulary.save(models_dir, card.version)
    return card


PROBE_PAIRS = 64
"""Rows a model of the deployment's own is tried on before it is registered."""


def check_own_models(data: TrainingData, config: TrainingConfig) -> None:
    """Try the deployment's own verifier on the window's first rows, and the width of its own
    FM against the compressor's code, before anything is trained or written: each was checked
    only at its own stage, after the FM and compressor cards were registered (and the reference
    FM trained), leaving cards of a chain that could never complete.

    Raises:
        ConfigError: naming the model and what is wrong with it.
    """
    if not isinstance(config.fm, str):
        width = _probe_foundation(config.fm, data)
        _check_code_width(width, config, spec_name(config.fm, "fm"))
    if not isinstance(config.verifier, str):
        _probe_verifier(config.verifier, data)


def _check_code_width(width: int, config: TrainingConfig, fm: str) -> None:
    code_dim = config.models.compressor.code_dim
    if width < code_dim:
        raise ConfigError(
            f"{fm} gives {width}-dim representations, narrower than the compressor's code_dim "
            f"{code_dim}: set training.code_dim (and the views' embedding_dim) to at most the "
            "FM's width"
        )


def _probe_foundation(spec: OwnModel, data: TrainingData) -> int:
    """Build the deployment's FM, check its representations of the window's first rows, and
    return their width."""
    encoder = build_model(spec, "fm")
    probe = data.pairs(np.arange(len(data.log)) < PROBE_PAIRS)
    where = spec_name(spec, "fm")
    dim = int(encoder.representation_dim)
    checked_representation(
        call_model(encoder.encode, probe, where, "encode"), len(probe), dim, where
    )
    return dim


def _probe_verifier(spec: OwnModel, data: TrainingData) -> None:
    """Build the deployment's verifier and check its scores on the window's first rows."""
    verifier = build_model(spec, "verifier")
    probe = data.pairs(np.arange(len(data.log)) < PROBE_PAIRS)
    where = spec_name(spec, "verifier")
    checked_scores(call_model(verifier.score, probe, where, "score"), len(probe), where)


def register_foundation(spec: OwnModel, data: TrainingData, models_dir: Path) -> ModelCard:
    """Register the deployment's FM after trying it on the window's first rows: its width is
    recorded, and a wrong shape, dtype or a NaN is refused before anything is written."""
    dim = _probe_foundation(spec, data)
    return register_interface_model(
        spec, "fm", models_dir, extra_config={"representation_dim": dim}, **data.card_fields()
    )


def register_verifier(
    spec: OwnModel, data: TrainingData, models_dir: Path, compressor_card: ModelCard
) -> ModelCard:
    """Register the deployment's verifier as the compressor's child, after trying it."""
    _probe_verifier(spec, data)
    return register_interface_model(
        spec, "vm", models_dir, parents=(compressor_card.version,), **data.card_fields()
    )


def _encoder(
    data: TrainingData, fm_card: ModelCard, models_dir: Path, config: TrainingConfig
) -> FoundationEncoder:
    """The chain's FM as an encoder, on the FM's training device; the reference FM reads
    ``data``'s featurizer."""
    placed = config.models.fm_training
    return load_encoder(
        fm_card, models_dir, data.vocabulary, placed.device, placed.precision, data.featurizer
    )


def _train_foundation(
    data: TrainingData, models_dir: Path, config: TrainingConfig, progress: Progress
) -> ModelCard:
    mc = config.models
    with seeded_torch(config.seed):  # initialisation draws from torch's global generator
        fm = FoundationModel(data.featurizer.schema, len(data.dataset.label_columns), mc.foundation)
    train_foundation(
        fm,
        data.batch,
        data.labels,
        mc.fm_training.model_copy(update={"seed": config.seed}),
        progress,
    )
    _, probabilities = foundation_outputs(fm, data.batch)
    probe = data.batch.select(slice(0, 64))
    return save_model(
        fm,
        "fm",
        models_dir,
        config={"model": mc.foundation.model_dump(), "schema": data.featurizer.schema.to_dict()},
        metrics=data.train_ne(probabilities),
        flops_per_pair=flops_per_pair(fm, lambda: fm(probe), len(probe)),
        **data.card_fields(),
    )


def fit_compressor(
    data: TrainingData,
    models_dir: Path,
    fm_card: ModelCard,
    config: TrainingConfig,
    progress: Progress = None,
) -> ModelCard:
    """Train the compressor, PCA-initialised, on the registered FM's representations of
    ``data``'s FM rows (the reference FM's or the deployment's own, through the same protocol)."""
    mc = config.models
    encoder = _encoder(data, fm_card, models_dir, config)
    h = torch.from_numpy(encode_in_chunks(encoder, data.pairs(data.fm_rows), describe(fm_card)))
    _check_code_width(h.shape[1], config, describe(fm_card))
    pca = PCA(h, mc.compressor.code_dim)
    comp_cfg = mc.compressor.model_copy(update={"input_dim": h.shape[1]})
    with seeded_torch(config.seed):
        compressor = EmbeddingCompressor(comp_cfg)
    compressor.init_from_pca(pca)
    train_compressor(
        compressor, h, mc.compressor_training.model_copy(update={"seed": config.seed}), progress
    )
    with torch.inference_mode():
        mse = float(((compressor(h) - h) ** 2).mean())
    return save_model(
        compressor,
        "compressor",
        models_dir,
        parents=(fm_card.version,),
        config={"model": comp_cfg.model_dump()},
        metrics={"reconstruction_mse": mse, "pca_mse": pca.reconstruction_mse(h)},
        **data.card_fields(),
    )


def fit_vertical(
    data: TrainingData,
    models_dir: Path,
    compressor_card: ModelCard,
    config: TrainingConfig,
    progress: Progress = None,
) -> ModelCard:
    """Train the serving VM (the verifier) on the tier mix of the registered compressor's ``z``,
    or register the deployment's own verifier (``config.verifier``)."""
    if not isinstance(config.verifier, str):
        return register_verifier(config.verifier, data, models_dir, compressor_card)
    mc = config.models
    cards = {c.version: c for c in list_cards(models_dir)}
    fm_card = parent_card(cards, compressor_card, "fm")
    encoder = _encoder(data, fm_card, models_dir, config)
    # z as the serving VM will see it: computed at the last precompute round before each row.
    pairs = data.pairs(round_seconds=config.precompute_interval_seconds)
    h = torch.from_numpy(encode_in_chunks(encoder, pairs, describe(fm_card)))
    z = encode(_load(compressor_card, models_dir, EmbeddingCompressor), h)
    tier, z_mixed = tier_mix_inputs(
        data.log,
        z,
        config.tier_mix,
        config.seed,
        ~data.fm_rows,
        round_seconds=config.precompute_interval_seconds,
    )
    if config.tier_mix.fm_rows == "own_tier":
        # The FM's own rows (the earliest) train beside a tier of their own, not ZERO, so ZERO
        # learns what serving means by it, not the early log's click rate.
        tier = fm_span_tiers(tier, data.fm_rows)
    vm_cfg = mc.vertical.model_copy(update={"embedding_dim": z.shape[1]})
    schema = data.featurizer.schema
    with seeded_torch(config.seed):
        vm = VerticalModel(schema, len(data.dataset.label_columns), vm_cfg)
    train_vertical(
        vm,
        data.batch,
        data.labels,
        mc.vm_training.model_copy(update={"seed": config.seed}),
        z=z_mixed,
        tier=tier,
        progress=progress,
    )
    probe = data.batch.select(slice(0, 64))
    z_probe = torch.zeros(len(probe), vm_cfg.embedding_dim)
    t_probe = torch.full((len(probe),), int(Tier.EXACT))
    return save_model(
        vm,
        "vm",
        models_dir,
        parents=(compressor_card.version,),
        config={
            "model": vm_cfg.model_dump(),
            "schema": schema.to_dict(),
            "tier_mix": config.tier_mix.model_dump(),
        },
        metrics=data.train_ne(vertical_probabilities(vm, data.batch, z_mixed, tier)),
        flops_per_pair=flops_per_pair(vm, lambda: vm(probe, z_probe, t_probe), len(probe)),
        **data.card_fields(),
    )


def train_and_register(
    dataset: InteractionDataset,
    models_dir: Path,
    config: TrainingConfig | None = None,
    progress: StageProgress | None = None,
) -> ModelBundle:
    """Train FM -> compressor -> VM on all of ``dataset``'s log and register their cards."""
    cfg = config or TrainingConfig()

    def hook(stage: str) -> Progress:
        return None if progress is None else (lambda done, total: progress(stage, done, total))

    data = TrainingData.build(dataset, cfg.models.history_len, fm_fraction=cfg.models.fm_fraction)
    if not isinstance(cfg.verifier, str):
        raise ConfigError(
            "train_and_register trains the reference VM; register your own verifier "
            "with solaris train --config"
        )
    fm_card = fit_foundation(data, models_dir, cfg, hook("train FM"))
    compressor_card = fit_compressor(data, models_dir, fm_card, cfg, hook("train compressor"))
    vm_card = fit_vertical(data, models_dir, compressor_card, cfg, hook("train VM"))
    logger.info(
        "registered %s <- %s <- %s", vm_card.version, compressor_card.version, fm_card.version
    )
    return load_bundle(models_dir, vm_card.version)


ModuleT = TypeVar("ModuleT", bound=nn.Module)


def _load(card: ModelCard, models_dir: Path, kind: type[ModuleT]) -> ModuleT:
    module = load_model(card, models_dir)
    if not isinstance(module, kind):
        raise ConfigError(f"model card {card.version} is a {card.kind}, not a {kind.__name__}")
    return module


def tier_mix_inputs(
    log: pd.DataFrame,
    z: torch.Tensor,
    mix: TierMix,
    seed: int,
    eligible: np.ndarray | None = None,
    round_seconds: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiers ``(N,)`` and inputs ``(N, d)`` for training on the serving tier mix.

    USER_AGG rows get the mean of the user's exact embeddings from earlier rows, SIMILAR rows the
    mean of other users' earlier embeddings of the same item (what a neighbour fill averages),
    ZERO rows a zero vector. Only ``eligible`` rows (where the FM is out of sample) get a tier or
    feed a mean. "Earlier" matters: a later row's ``z`` was computed from a history holding this
    row's label, so a mean over later rows hands the VM the label, serving never does, and the
    VM would learn to over-trust the enrichment tiers.

    With ``round_seconds`` (the precompute schedule), "earlier" means before the last round
    before the row (``floor(time, round_seconds)``), as at serving, where the aggregate and the
    fill were written by that round. Otherwise the impressions shown earlier in the row's own
    session feed its mean, and which items a session shows gives away the session's interest.
    """
    if mix.exact + mix.similar + mix.user_agg > 1.0 + 1e-9:
        raise ValueError("tier mix shares must add up to at most 1")
    n = len(log)
    usable = np.ones(n, dtype=bool) if eligible is None else np.asarray(eligible, dtype=bool)
    rng = np.random.default_rng([seed, 11])
    draw = rng.random(n)
    tiers = np.full(n, int(Tier.ZERO), dtype=np.int64)
    edges = np.cumsum([mix.exact, mix.similar, mix.user_agg])
    tiers[draw < edges[2]] = int(Tier.USER_AGG)
    tiers[draw < edges[1]] = int(Tier.SIMILAR)
    tiers[draw < edges[0]] = int(Tier.EXACT)
    tiers[~usable] = int(Tier.ZERO)
    zn = z.numpy().astype(np.float64)
    out = np.zeros(zn.shape, dtype=np.float32)
    exact = tiers == int(Tier.EXACT)
    out[exact] = zn[exact]
    seconds = log[EVENT_TIMESTAMP].astype("int64").to_numpy() if n else np.zeros(0, np.int64)
    cutoff = seconds
    if round_seconds > 0:
        step = round_seconds * 1_000_000_000  # event times are in nanoseconds
        cutoff = seconds - np.mod(seconds, step)
    # Dense codes of any ids (sparse int64, String), so a pair packs into one int64 key.
    users = pd.factorize(id_array(log[USER_ID]), sort=True)[0].astype(np.int64)
    items = pd.factorize(id_array(log[ITEM_ID]), sort=True)[0].astype(np.int64)
    user_sums, user_counts = _sums_of_earlier_rows(users, seconds, zn, usable, cutoff)
    item_sums, item_counts = _sums_of_earlier_rows(items, seconds, zn, usable, cutoff)
    # A neighbour fill averages *other* users' vectors of the item: drop the user's own rows.
    pair_keys = users * (int(items.max()) + 1 if n else 1) + items
    pair_sums, pair_counts = _sums_of_earlier_rows(pair_keys, seconds, zn, usable, cutoff)
    for tier, sums, counts in (
        (Tier.USER_AGG, user_sums, user_counts),
        (Tier.SIMILAR, item_sums - pair_sums, item_counts - pair_counts),
    ):
        rows = tiers == int(tier)
        covered = rows & (counts > 0)
        out[covered] = (sums[covered] / counts[covered, None]).astype(np.float32)
        tiers[rows & (counts <= 0)] = int(Tier.ZERO)
    return torch.from_numpy(tiers), torch.from_numpy(out)


def _sums_of_earlier_rows(
    keys: np.ndarray,
    times: np.ndarray,
    vectors: np.ndarray,
    usable: np.ndarray,
    cutoff: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the sum of ``vectors`` over usable rows with the same key and a time strictly
    before the row's ``cutoff`` (at most its own time), and how many there are; vectorized with
    prefix sums over ``(key, time)`` order and one binary search per row."""
    n = len(keys)
    if n == 0:
        return np.zeros_like(vectors), np.zeros(0)
    order = np.lexsort((times, keys))
    k, t = keys[order], times[order]
    weight = usable[order].astype(np.float64)
    sums = np.r_[np.zeros((1, vectors.shape[1])), np.cumsum(vectors[order] * weight[:, None], 0)]
    counts = np.r_[0.0, np.cumsum(weight)]
    # One int64 per (key rank, time rank): the times of a key run inside its own span, so one
    # binary search finds where a cutoff falls within the row's key. Ranks, not nanoseconds,
    # keep the product far from overflowing.
    group = np.cumsum(np.r_[True, k[1:] != k[:-1]]) - 1
    distinct_times = np.unique(t)
    span = len(distinct_times) + 1
    composite = group * span + np.searchsorted(distinct_times, t)
    limit = group * span + np.searchsorted(distinct_times, cutoff[order], side="left")
    before_cutoff = np.searchsorted(composite, limit, side="left")
    key_start = np.searchsorted(group, group, side="left")
    out_sums = np.empty_like(vectors, dtype=np.float64)
    out_counts = np.empty(n)
    out_sums[order] = sums[before_cutoff] - sums[key_start]
    out_counts[order] = counts[before_cutoff] - counts[key_start]
    return out_sums, out_counts
