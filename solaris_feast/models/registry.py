"""Model weights: save a module beside its card, load the chain in service back into torch.

Each trained model is a safetensors file beside a JSON model card; the card's schema, reading,
hashing and the choice of the chain in service are in the torch-free :mod:`.cards`, which this
module calls. Loading checks the weights' sha256 against the card before reading a byte of them,
and weights are read with safetensors: nothing is unpickled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from solaris_feast.errors import ConfigError
from solaris_feast.models.cards import (
    CARD_SUFFIX,
    ModelCard,
    ModelKind,
    card_by_version,
    list_cards,
    parent_card,
    read_card,
    register_artifact,
    serving_chain,
    sha256_of,
    verify_weights,
)
from solaris_feast.models.compressor import CompressorConfig, EmbeddingCompressor
from solaris_feast.models.features import FeatureSchema
from solaris_feast.models.foundation import FoundationConfig, FoundationModel
from solaris_feast.models.interface import INTERFACE_CONFIG
from solaris_feast.models.vertical import VerticalConfig, VerticalModel
from solaris_feast.models.vocabulary import Vocabulary

# The card schema, reading, hashing and chain selection live in the torch-free card module;
# these names are re-exported for the callers that load weights from here.
__all__ = [
    "CARD_SUFFIX",
    "ModelBundle",
    "ModelCard",
    "ModelKind",
    "card_by_version",
    "list_cards",
    "load_bundle",
    "load_model",
    "parent_card",
    "read_card",
    "register_untrained_chain",
    "save_model",
    "sha256_of",
    "verified_weights",
]


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
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    return register_artifact(
        lambda path: save_file(state, str(path)),
        ".safetensors",
        kind,
        models_dir,
        parents=parents,
        config=config,
        **card_fields,
    )


def verified_weights(card: ModelCard, models_dir: Path) -> dict[str, torch.Tensor]:
    """The card's weights, read with safetensors only after their sha256 matches the card."""
    return load_file(str(verify_weights(card, models_dir)))


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
    vocabulary: Vocabulary | None = None
    """The FM's id vocabulary (saved beside its card); None: dense ids index the tables."""

    @property
    def embedding_version(self) -> str:
        """The ``model_version`` stored beside every embedding: the compressor's version (its
        card names the FM), since FM and compressor together define the ``z`` space."""
        return self.compressor_card.version

    @property
    def cards(self) -> dict[str, ModelCard]:
        return {"fm": self.fm_card, "compressor": self.compressor_card, "vm": self.vm_card}


def load_model(card: ModelCard, models_dir: Path) -> nn.Module:
    """Rebuild the module a card describes and load its sha-checked weights, in eval mode.

    FM and VM cards carry the feature schema their embedding tables were sized for.
    """
    if INTERFACE_CONFIG in card.config:
        raise ConfigError(
            f"model card {card.version} is a model of the deployment's own (an entry point), "
            "not trained weights: load it with models.interface.load_chain_models (serving code "
            "needs only the chain's version: models.cards.serving_embedding_version)"
        )
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
    """Load the serving VM (``vm_version``, else the promoted one, else the newest: the rule of
    :func:`~solaris_feast.models.cards.serving_chain`) with the compressor and FM it was trained
    on, and the FM's id vocabulary when one was saved beside its card (checked against the FM's
    table sizes). The reference models only; a chain with a deployment's own model loads with
    :func:`~solaris_feast.models.interface.load_chain_models`."""
    # The promoted chain, not the newest: a training run registers a chain before anyone
    # promotes it, and the store holds the promoted compressor's vectors until then.
    chain = serving_chain(models_dir, vm_version)
    if chain is None or chain.vm is None:
        raise ConfigError(
            f"no VM model card in {models_dir}: train the models first (solaris train)"
        )
    fm_card, compressor_card, vm_card = chain.fm, chain.compressor, chain.vm
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
    vocabulary = Vocabulary.load(models_dir, fm_card.version)
    if vocabulary is not None and (
        vocabulary.users.size != fm.schema.num_users or vocabulary.items.size != fm.schema.num_items
    ):
        raise ConfigError(
            f"vocabulary of {fm_card.version} has {vocabulary.users.size} user and "
            f"{vocabulary.items.size} item rows, the FM's tables {fm.schema.num_users} and "
            f"{fm.schema.num_items}"
        )
    return ModelBundle(fm, compressor, vm, fm_card, compressor_card, vm_card, fm.schema, vocabulary)


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


def _dict(config: dict[str, object], key: str) -> dict[str, object]:
    value = config.get(key)
    if not isinstance(value, dict):
        raise ConfigError(f"model card config has no {key!r} section")
    return value
