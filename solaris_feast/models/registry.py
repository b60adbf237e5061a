"""Model artifacts and their cards: how a served vector is traced back to the models that made it.

Each trained model is a safetensors file beside a JSON model card. The card records the version,
its parents (compressor -> FM, VM -> compressor), the training data window, metrics, the config
needed to rebuild the module, and the sha256 of the weights file. Loading checks that sha256
before reading a byte of weights, and weights are read with safetensors: nothing is unpickled.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import load_file, save_file
from torch import nn

from solaris_feast.errors import ArtifactIntegrityError, ConfigError
from solaris_feast.models.compressor import CompressorConfig, EmbeddingCompressor
from solaris_feast.models.features import FeatureSchema
from solaris_feast.models.foundation import FoundationConfig, FoundationModel
from solaris_feast.models.vertical import VerticalConfig, VerticalModel

ModelKind = Literal["fm", "compressor", "vm"]
CARD_SUFFIX = ".card.json"


class ModelCard(BaseModel):
    """What a reviewer needs to trust an artifact."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str
    """Unique id, ``{kind}-{UTC time}-{first 8 hex of the weights sha256}``."""
    kind: ModelKind
    """``fm``, ``compressor`` or ``vm``."""
    parents: tuple[str, ...] = ()
    """Versions this model was trained from: the compressor's FM, the VM's compressor."""
    created_at: datetime
    """When the artifact was written (UTC)."""
    train_window_start: datetime | None = None
    """First event time of the training data (UTC)."""
    train_window_end: datetime | None = None
    """Last event time of the training data (UTC)."""
    dataset: str = ""
    """Name of the data set trained on."""
    tasks: tuple[str, ...] = ()
    """Label columns, in head order."""
    metrics: dict[str, float] = Field(default_factory=dict)
    """Evaluation figures at training time."""
    config: dict[str, object] = Field(default_factory=dict)
    """Module config and feature schema, enough to rebuild the module before loading weights."""
    weights_file: str
    """File name of the safetensors weights, relative to the card's folder."""
    weights_sha256: str
    """sha256 of the weights file, checked before every load."""
    flops_per_pair: float | None = None
    """Forward-pass floating point operations per user-item pair."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def save_model(
    module: nn.Module,
    kind: ModelKind,
    models_dir: Path,
    *,
    parents: tuple[str, ...] = (),
    config: dict[str, object],
    **card_fields: Any,
) -> ModelCard:
    """Write ``module``'s weights and its card into ``models_dir``; return the card."""
    models_dir.mkdir(parents=True, exist_ok=True)
    created = datetime.now(UTC)
    staging = models_dir / f".{kind}-{created.strftime('%Y%m%dT%H%M%S%f')}.safetensors.tmp"
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    save_file(state, str(staging))
    digest = sha256_of(staging)
    version = f"{kind}-{created.strftime('%Y%m%dT%H%M%S')}-{digest[:8]}"
    weights = models_dir / f"{version}.safetensors"
    staging.replace(weights)
    card = ModelCard(
        version=version,
        kind=kind,
        parents=parents,
        created_at=created,
        config=config,
        weights_file=weights.name,
        weights_sha256=digest,
        **card_fields,
    )
    # Card last, written atomically: a card on disk always points at complete weights.
    card_path = models_dir / f"{version}{CARD_SUFFIX}"
    tmp = card_path.with_suffix(".tmp")
    tmp.write_text(card.model_dump_json(indent=2))
    tmp.replace(card_path)
    return card


def read_card(path: Path) -> ModelCard:
    try:
        return ModelCard.model_validate_json(path.read_text())
    except ValueError as exc:
        raise ConfigError(f"model card {path} is malformed: {exc}") from exc


def list_cards(models_dir: Path) -> list[ModelCard]:
    """Every card in ``models_dir``, oldest first."""
    cards = [read_card(p) for p in sorted(models_dir.glob(f"*{CARD_SUFFIX}"))]
    return sorted(cards, key=lambda c: (c.created_at, c.version))


def verified_weights(card: ModelCard, models_dir: Path) -> dict[str, torch.Tensor]:
    """The card's weights, only after their sha256 matches the card."""
    path = models_dir / card.weights_file
    if not path.is_file():
        raise ConfigError(f"model card {card.version} points at {path}, which does not exist")
    actual = sha256_of(path)
    if actual != card.weights_sha256:
        raise ArtifactIntegrityError(str(path), card.weights_sha256, actual)
    return load_file(str(path))


@dataclass(frozen=True)
class ModelBundle:
    """The three models that define one embedding space and the VM that reads it."""

    fm: FoundationModel
    compressor: EmbeddingCompressor
    vm: VerticalModel
    fm_card: ModelCard
    compressor_card: ModelCard
    vm_card: ModelCard
    schema: FeatureSchema

    @property
    def embedding_version(self) -> str:
        """The ``model_version`` stored beside every embedding: the compressor's version (its
        card names the FM), since FM and compressor together define the ``z`` space."""
        return self.compressor_card.version

    @property
    def cards(self) -> dict[str, ModelCard]:
        return {"fm": self.fm_card, "compressor": self.compressor_card, "vm": self.vm_card}


def card_by_version(models_dir: Path, version: str) -> ModelCard:
    """The card of ``version`` in ``models_dir``."""
    path = models_dir / f"{version}{CARD_SUFFIX}"
    if not path.is_file():
        raise ConfigError(f"no model card {version} in {models_dir}")
    return read_card(path)


def load_model(card: ModelCard, models_dir: Path) -> nn.Module:
    """Rebuild the module a card describes and load its sha-checked weights, in eval mode.

    FM and VM cards carry the feature schema their embedding tables were sized for.
    """
    model = _dict(card.config, "model")
    module: nn.Module
    if card.kind == "fm":
        schema = FeatureSchema.from_dict(_dict(card.config, "schema"))
        module = FoundationModel(schema, len(card.tasks), FoundationConfig.model_validate(model))
    elif card.kind == "compressor":
        module = EmbeddingCompressor(CompressorConfig.model_validate(model))
    else:
        schema = FeatureSchema.from_dict(_dict(card.config, "schema"))
        module = VerticalModel(schema, len(card.tasks), VerticalConfig.model_validate(model))
    module.load_state_dict(verified_weights(card, models_dir))
    module.eval()
    return module


def load_bundle(models_dir: Path, vm_version: str | None = None) -> ModelBundle:
    """Load the newest VM (or ``vm_version``) with the compressor and FM it was trained on."""
    cards = {c.version: c for c in list_cards(models_dir)}
    vms = [c for c in cards.values() if c.kind == "vm"]
    if vm_version is not None:
        vms = [c for c in vms if c.version == vm_version]
    if not vms:
        raise ConfigError(
            f"no VM model card in {models_dir}: train the models first (solaris train)"
        )
    vm_card = max(vms, key=lambda c: (c.created_at, c.version))
    compressor_card = parent_card(cards, vm_card, "compressor")
    fm_card = parent_card(cards, compressor_card, "fm")
    fm = load_model(fm_card, models_dir)
    compressor = load_model(compressor_card, models_dir)
    vm = load_model(vm_card, models_dir)
    if not (
        isinstance(fm, FoundationModel)
        and isinstance(compressor, EmbeddingCompressor)
        and isinstance(vm, VerticalModel)
    ):
        raise ConfigError(
            f"model cards of {vm_card.version} do not form an FM -> compressor -> VM chain"
        )
    return ModelBundle(fm, compressor, vm, fm_card, compressor_card, vm_card, fm.schema)


def register_untrained_chain(
    models_dir: Path,
    schema: FeatureSchema,
    tasks: tuple[str, ...],
    fm_config: FoundationConfig | None = None,
    compressor_config: CompressorConfig | None = None,
    vm_config: VerticalConfig | None = None,
    **card_fields: Any,
) -> ModelBundle:
    """Register freshly initialised FM -> compressor -> VM as one chain and load it.

    For code that needs the chain's deterministic forward passes, not good ones (tests,
    benchmarks, a smoke run of serving); seed torch before calling for repeatable weights. The
    compressor's input defaults to the FM's representation width, and the VM's embedding width is
    always the compressor's code width.
    """
    fm_cfg = fm_config or FoundationConfig()
    comp_cfg = compressor_config or CompressorConfig(input_dim=fm_cfg.representation_dim)
    if comp_cfg.input_dim != fm_cfg.representation_dim:
        raise ConfigError(
            f"compressor input_dim {comp_cfg.input_dim} != FM representation_dim "
            f"{fm_cfg.representation_dim}"
        )
    vm_cfg = (vm_config or VerticalConfig()).model_copy(update={"embedding_dim": comp_cfg.code_dim})
    fm_card = save_model(
        FoundationModel(schema, len(tasks), fm_cfg),
        "fm",
        models_dir,
        config={"model": fm_cfg.model_dump(), "schema": schema.to_dict()},
        tasks=tasks,
        **card_fields,
    )
    compressor_card = save_model(
        EmbeddingCompressor(comp_cfg),
        "compressor",
        models_dir,
        parents=(fm_card.version,),
        config={"model": comp_cfg.model_dump()},
        tasks=tasks,
        **card_fields,
    )
    vm_card = save_model(
        VerticalModel(schema, len(tasks), vm_cfg),
        "vm",
        models_dir,
        parents=(compressor_card.version,),
        config={"model": vm_cfg.model_dump(), "schema": schema.to_dict()},
        tasks=tasks,
        **card_fields,
    )
    return load_bundle(models_dir, vm_card.version)


def parent_card(cards: dict[str, ModelCard], child: ModelCard, kind: ModelKind) -> ModelCard:
    """The ``kind`` card among ``child``'s parents."""
    for version in child.parents:
        card = cards.get(version)
        if card is not None and card.kind == kind:
            return card
    raise ConfigError(
        f"model card {child.version} names no {kind} parent present here (parents: {child.parents})"
    )


def _dict(config: dict[str, object], key: str) -> dict[str, object]:
    value = config.get(key)
    if not isinstance(value, dict):
        raise ConfigError(f"model card config has no {key!r} section")
    return value
