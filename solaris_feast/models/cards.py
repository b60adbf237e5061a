"""Which model versions stand behind the stored embeddings, read from the model cards as JSON.

``feast apply`` imports ``feature_repo/solaris_repo.py`` and ``solaris status`` runs beside
serving: neither should load torch, which :mod:`solaris_feast.models.registry` imports to rebuild
modules. A card is ``<version>.card.json`` (as ``save_model`` writes it); only the fields that
name versions, parents, times and the module config are read here.

The chain in service is the one :func:`solaris_feast.models.registry.load_bundle` loads: the
newest VM, the compressor it was trained on and that compressor's FM. The compressor's version
is the ``model_version`` stored beside every embedding.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from solaris_feast.errors import ConfigError
from solaris_feast.store.definitions import (
    DEFAULT_PAIR_TTL_SECONDS,
    DEFAULT_SIMILAR_TTL_SECONDS,
    DEFAULT_USER_TTL_SECONDS,
    SolarisFeastConfig,
)

CARD_SUFFIX = ".card.json"
"""The registry's card file suffix (``solaris_feast.models.registry.CARD_SUFFIX``)."""
MODELS_DIR_ENV = "SOLARIS_MODELS_DIR"
PAIR_TTL_ENV = "SOLARIS_PAIR_TTL_SECONDS"
USER_TTL_ENV = "SOLARIS_USER_TTL_SECONDS"
SIMILAR_TTL_ENV = "SOLARIS_SIMILAR_TTL_SECONDS"
SCHEDULE_ENV = "SOLARIS_PRECOMPUTE_SCHEDULE"
"""The precompute DAG's schedule variable; the views' schedule tags follow it."""
UNVERSIONED = "unversioned"
_MODEL_KINDS = ("fm", "compressor", "vm")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class CardSummary:
    """The lineage fields of one model card.

    Attributes:
        version: the card's version (``{kind}-{UTC time}-{sha prefix}``).
        kind: ``fm``, ``compressor`` or ``vm``.
        parents: versions it was trained from.
        created_at: when it was written (UTC); the epoch when the card has no time.
        config: the module config the card records (``config.model.code_dim`` for a compressor).
        path: the card file.
    """

    version: str
    kind: str
    parents: tuple[str, ...]
    created_at: datetime
    config: Mapping[str, Any] = field(default_factory=dict)
    path: Path | None = None


@dataclass(frozen=True)
class ModelChain:
    """FM -> compressor (-> VM) as registered; ``vm`` is None before a VM is trained."""

    fm: CardSummary
    compressor: CardSummary
    vm: CardSummary | None

    @property
    def embedding_version(self) -> str:
        """The ``model_version`` stored with every embedding of this chain."""
        return self.compressor.version

    @property
    def code_dim(self) -> int | None:
        """Length of the stored embedding ``z``, from the compressor card's ``config.model``."""
        model = self.compressor.config.get("model")
        dim = model.get("code_dim") if isinstance(model, Mapping) else None
        if isinstance(dim, int) and not isinstance(dim, bool) and dim > 0:
            return dim
        return None


def read_card_summaries(models_dir: Path) -> list[CardSummary]:
    """Every card in ``models_dir``, oldest first; an empty list when the folder is missing.

    Raises:
        ConfigError: a card file is not JSON or lacks ``version`` / ``kind``.
    """
    if not models_dir.is_dir():
        return []
    cards = []
    for path in sorted(models_dir.glob(f"*{CARD_SUFFIX}")):
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"model card {path} is not readable JSON: {exc}") from exc
        if not isinstance(raw, dict) or raw.get("kind") not in _MODEL_KINDS:
            raise ConfigError(f"model card {path} has no kind in {_MODEL_KINDS}")
        version = raw.get("version")
        if not isinstance(version, str) or not version:
            raise ConfigError(f"model card {path} has no version")
        parents = raw.get("parents") or []
        config = raw.get("config")
        cards.append(
            CardSummary(
                version=version,
                kind=str(raw["kind"]),
                parents=tuple(str(p) for p in ([parents] if isinstance(parents, str) else parents)),
                created_at=_card_time(raw.get("created_at"), path),
                config=config if isinstance(config, dict) else {},
                path=path,
            )
        )
    return sorted(cards, key=lambda c: (c.created_at, c.version))


def _card_time(value: Any, path: Path) -> datetime:
    if value is None:
        return _EPOCH
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError as exc:
        raise ConfigError(f"model card {path}: created_at {value!r} is not ISO 8601") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _parent(cards: Mapping[str, CardSummary], child: CardSummary, kind: str) -> CardSummary:
    for version in child.parents:
        card = cards.get(version)
        if card is not None and card.kind == kind:
            return card
    raise ConfigError(
        f"model card {child.version} names no {kind} card present in its folder "
        f"(parents {list(child.parents)}); copy the missing card or retrain"
    )


def newest_chain(models_dir: Path) -> ModelChain | None:
    """The chain of the newest VM, or of the newest compressor when no VM exists; None when
    the folder holds no compressor card.

    Raises:
        ConfigError: a card is malformed or a parent card is missing.
    """
    cards = read_card_summaries(models_dir)
    by_version = {c.version: c for c in cards}
    vms = [c for c in cards if c.kind == "vm"]
    if vms:
        vm = vms[-1]
        compressor = _parent(by_version, vm, "compressor")
        return ModelChain(_parent(by_version, compressor, "fm"), compressor, vm)
    compressors = [c for c in cards if c.kind == "compressor"]
    if not compressors:
        return None
    return ModelChain(_parent(by_version, compressors[-1], "fm"), compressors[-1], None)


def newest_embedding_version(models_dir: Path) -> str | None:
    """The ``model_version`` the serving VM expects: its compressor's version (or the newest
    compressor's when no VM is registered yet); None without cards."""
    chain = newest_chain(models_dir)
    return chain.embedding_version if chain is not None else None


def _env_seconds(environ: Mapping[str, str], name: str, default: int) -> int:
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError as exc:
        raise ConfigError(f"{name}={text!r} is not a whole number of seconds") from exc


def versioned_feast_config(
    models_dir: Path, environ: Mapping[str, str] | None = None
) -> SolarisFeastConfig:
    """The SOLARIS view config of a feature repo: lineage tags and the embedding dimension from
    the newest model chain in ``models_dir``, TTLs and the schedule tag from the environment.

    Without cards the versions are ``"unversioned"`` and the dimension is the default. The
    variables: ``SOLARIS_PAIR_TTL_SECONDS``, ``SOLARIS_USER_TTL_SECONDS``,
    ``SOLARIS_SIMILAR_TTL_SECONDS`` and ``SOLARIS_PRECOMPUTE_SCHEDULE`` (the one the precompute
    DAG reads, so the tag says what runs).

    Raises:
        ConfigError: a malformed card, a missing parent card or a non-numeric TTL variable.
        pydantic.ValidationError: a TTL out of bounds.
    """
    env = os.environ if environ is None else environ
    chain = newest_chain(models_dir)
    schedule = env.get(SCHEDULE_ENV, "").strip() or "@hourly"
    settings: dict[str, Any] = {
        "pair_ttl_seconds": _env_seconds(env, PAIR_TTL_ENV, DEFAULT_PAIR_TTL_SECONDS),
        "user_ttl_seconds": _env_seconds(env, USER_TTL_ENV, DEFAULT_USER_TTL_SECONDS),
        "similar_ttl_seconds": _env_seconds(env, SIMILAR_TTL_ENV, DEFAULT_SIMILAR_TTL_SECONDS),
        "pair_schedule": schedule,
        "user_schedule": schedule,
        "similar_schedule": schedule,
    }
    if chain is not None:
        settings["fm_version"] = chain.fm.version
        settings["compressor_version"] = chain.compressor.version
        settings["verifier_version"] = chain.vm.version if chain.vm is not None else UNVERSIONED
        if chain.code_dim is not None:
            settings["embedding_dim"] = chain.code_dim
    return SolarisFeastConfig(**settings)


def models_dir_for_repo(repo_dir: Path, environ: Mapping[str, str] | None = None) -> Path:
    """``SOLARIS_MODELS_DIR`` when set, else ``<repo>/../models`` (the project's layout)."""
    env = os.environ if environ is None else environ
    configured = env.get(MODELS_DIR_ENV, "").strip()
    return Path(configured) if configured else repo_dir.resolve().parent / "models"
