"""Model cards: the one place that reads, verifies and selects them, without torch.

Each trained model is a safetensors file beside a JSON card, ``<version>.card.json``. The card
records the version, its parents (compressor -> FM, VM -> compressor), the training window, the
config needed to rebuild the module and the sha256 of the weights file. :mod:`.registry` writes
cards and loads weights (it needs torch); everything that only reads cards goes through this
module: ``feast apply`` (``feature_repo/solaris_repo.py``), ``solaris status`` and ``solaris
lineage`` run beside serving and must not load a deep learning framework.

The chain in service is the promoted VM (the serving alias ``serving.json`` that ``solaris
promote`` writes, :func:`serving_chain`), else the newest VM, the compressor it was trained on
and that compressor's FM (:func:`select_chain`); :func:`.registry.load_bundle` loads exactly that
chain. The compressor's version is the ``model_version`` stored beside every embedding. Cost:
reading a card is one small JSON file; hashing weights reads the whole file, so only
:func:`check_weights` and :func:`verify_weights` do it, and only for the cards they are given.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from solaris_feast.errors import ArtifactIntegrityError, ConfigError, ModelVersionError
from solaris_feast.serving.resolve import DEFAULT_CLOCK_SKEW_SECONDS
from solaris_feast.store.definitions import (
    DEFAULT_PAIR_TTL_SECONDS,
    DEFAULT_SIMILAR_TTL_SECONDS,
    DEFAULT_USER_TTL_SECONDS,
    SolarisFeastConfig,
)
from solaris_feast.store.layout import DEFAULT_EMBEDDING_CODEC

logger = logging.getLogger(__name__)

ModelKind = Literal["fm", "compressor", "vm"]
MODEL_KINDS: tuple[ModelKind, ...] = ("fm", "compressor", "vm")
CARD_SUFFIX = ".card.json"
"""A card is ``<version>.card.json``; :func:`card_by_version` relies on the name."""
MODELS_DIR_ENV = "SOLARIS_MODELS_DIR"
PAIR_TTL_ENV = "SOLARIS_PAIR_TTL_SECONDS"
USER_TTL_ENV = "SOLARIS_USER_TTL_SECONDS"
SIMILAR_TTL_ENV = "SOLARIS_SIMILAR_TTL_SECONDS"
CLOCK_SKEW_ENV = "SOLARIS_CLOCK_SKEW_SECONDS"
"""How far in the future a ``computed_at`` may lie (the resolved view's tag, which every
reader and writer of the repo applies)."""
SCHEDULE_ENV = "SOLARIS_PRECOMPUTE_SCHEDULE"
EMBEDDING_CODEC_ENV = "SOLARIS_EMBEDDING_CODEC"
"""The precompute DAG's schedule variable; the views' schedule tags follow it."""
UNVERSIONED = "unversioned"
WeightsStatus = Literal["ok", "mismatch", "missing"]


class ModelCard(BaseModel):
    """What a reviewer needs to trust an artifact."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Annotated[str, Field(min_length=1)]
    """Unique id, ``{kind}-{UTC time}-{first 8 hex of the weights sha256}``."""
    kind: ModelKind
    """``fm``, ``compressor`` or ``vm``."""
    parents: tuple[str, ...] = ()
    """Versions this model was trained from: the compressor's FM, the VM's compressor."""
    created_at: datetime
    """When the artifact was written (UTC; a time without zone is read as UTC)."""
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
    """File name of the safetensors weights, in the card's folder (no directory part)."""
    weights_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    """sha256 of the weights file in lower-case hex, checked before every load."""
    flops_per_pair: float | None = None
    """Forward-pass floating point operations per user-item pair."""

    @field_validator("created_at", "train_window_start", "train_window_end")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        # Cards are sorted by time: one naive time among aware ones would make sorting raise.
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value

    @field_validator("weights_file")
    @classmethod
    def _file_in_card_folder(cls, value: str) -> str:
        # A path would let a card point outside its folder, at weights nobody registered.
        if not value or value in {".", ".."} or Path(value).name != value or "\\" in value:
            raise ValueError(f"weights_file {value!r} must be a file name in the card's folder")
        return value

    @property
    def code_dim(self) -> int | None:
        """Length of the embedding a compressor writes (``config.model.code_dim``), if recorded."""
        model = self.config.get("model")
        dim = model.get("code_dim") if isinstance(model, Mapping) else None
        if isinstance(dim, int) and not isinstance(dim, bool) and dim > 0:
            return dim
        return None


def check_embedding_version(version: str, repo_dir: Path | None = None) -> None:
    """Refuse the version of an FM or a VM card where an embedding version is asked for.

    Stored vectors carry their chain's compressor version (:func:`register_artifact` names every
    card ``<kind>-<UTC time>-<8 hex>``); a client that asks with the VM's version, the one
    ``solaris train`` and ``promote`` print first, matched no stored vector and got ZERO for
    every pair with nothing said. Versions of other shapes (a deployment's own) pass.
    ``repo_dir``: the serving side's Feast repo, where known; the refusal then names the exact
    version to send from the repo's registry (:func:`models_dir_for_repo`): the VM's own
    compressor, the newest compressor trained on the FM, else the serving chain's.

    Raises:
        ModelVersionError: naming the version, its kind and the version to send, or where it
            is printed.
    """
    shape = _CARD_VERSION.fullmatch(version)
    kind = shape.group(1) if shape is not None else "compressor"
    if kind == "compressor":
        return
    instead = _embedding_version_instead(version, repo_dir) if repo_dir is not None else None
    send = (
        f"send {instead}"
        if instead is not None
        else "send its compressor's (compressor-...: printed by solaris promote as 'clients ask "
        "with', by solaris status as 'expected model version', and returned by "
        "models.cards.serving_embedding_version)"
    )
    raise ModelVersionError(
        f"model version {version!r} is the {kind.upper()}'s; stored vectors carry the chain's "
        f"embedding version: {send}"
    )


def _embedding_version_instead(version: str, repo_dir: Path) -> str | None:
    """The compressor version a client meant with an FM's or a VM's ``version``: the VM's parent,
    the newest compressor trained on the FM, else the serving chain's; None where the registry
    cannot tell (no cards, one that does not read, a config that does not load)."""
    try:
        models_dir = models_dir_for_repo(repo_dir)
        cards = list_cards(models_dir)
        by_version = {card.version: card for card in cards}
        asked = by_version.get(version)
        if asked is not None and asked.kind == "vm":
            return parent_card(by_version, asked, "compressor").version
        if asked is not None and asked.kind == "fm":
            trained_on = [c for c in cards if c.kind == "compressor" and version in c.parents]
            if trained_on:
                return max(trained_on, key=lambda c: c.created_at).version
        return serving_embedding_version(models_dir)
    except (ConfigError, OSError, ValueError):
        return None


_CARD_VERSION = re.compile(r"(fm|compressor|vm)-\d{8}T\d{6}-[0-9a-f]{8}")
"""The shape :func:`register_artifact` gives every card's version."""


def card_path(models_dir: Path, version: str) -> Path:
    return models_dir / f"{version}{CARD_SUFFIX}"


def write_card(card: ModelCard, models_dir: Path) -> Path:
    """Write ``card`` as ``<version>.card.json`` in ``models_dir``, atomically (a reader sees the
    old card or the whole new one); return its path."""
    path = card_path(models_dir, card.version)
    staging = path.with_suffix(".tmp")
    staging.write_text(card.model_dump_json(indent=2), encoding="utf-8")
    staging.replace(path)
    return path


def register_artifact(
    write: Callable[[Path], object],
    suffix: str,
    kind: ModelKind,
    models_dir: Path,
    *,
    parents: tuple[str, ...] = (),
    config: dict[str, object],
    **card_fields: Any,
) -> ModelCard:
    """Write an artifact with ``write(path)`` into ``models_dir`` and register its card.

    The version is ``{kind}-{UTC time}-{first 8 hex of the artifact's sha256}`` and the artifact
    is named ``<version><suffix>``: safetensors weights (:func:`.registry.save_model`) or the
    spec of a model of the deployment's own (:mod:`.interface`).
    """
    models_dir.mkdir(parents=True, exist_ok=True)
    created = datetime.now(UTC)
    staging = models_dir / f".{kind}-{created.strftime('%Y%m%dT%H%M%S%f')}{suffix}.tmp"
    write(staging)
    digest = sha256_of(staging)
    version = f"{kind}-{created.strftime('%Y%m%dT%H%M%S')}-{digest[:8]}"
    artifact = models_dir / f"{version}{suffix}"
    staging.replace(artifact)
    card = ModelCard(
        version=version,
        kind=kind,
        parents=parents,
        created_at=created,
        config=config,
        weights_file=artifact.name,
        weights_sha256=digest,
        **card_fields,
    )
    # Card last: a card on disk always points at a complete artifact.
    write_card(card, models_dir)
    return card


def read_card(path: Path) -> ModelCard:
    """The card in ``path``.

    Raises:
        ConfigError: naming the file, when it is unreadable, not JSON, not a valid card, or its
            name is not ``<version>.card.json``.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"model card {path} is not readable: {exc}") from exc
    try:
        card = ModelCard.model_validate_json(text)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise ConfigError(f"model card {path} is not readable JSON: {exc}") from exc
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'card'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"model card {path} is malformed: {problems}") from exc
    if path.name != f"{card.version}{CARD_SUFFIX}":
        raise ConfigError(
            f"model card {path} holds version {card.version!r}; its file must be named "
            f"{card.version}{CARD_SUFFIX} so it can be found by version"
        )
    return card


@dataclass(frozen=True)
class CardScan:
    """Every card file of a folder, read.

    Attributes:
        cards: the valid cards, oldest first (by ``created_at``, then version).
        problems: one ``(file, error)`` per card file that could not be read as a card.
    """

    cards: tuple[ModelCard, ...]
    problems: tuple[tuple[Path, ConfigError], ...] = ()


def scan_cards(models_dir: Path) -> CardScan:
    """Read every ``*.card.json`` of ``models_dir``, keeping the bad ones as problems; a missing
    folder holds no cards."""
    cards: list[ModelCard] = []
    problems: list[tuple[Path, ConfigError]] = []
    for path in sorted(models_dir.glob(f"*{CARD_SUFFIX}")) if models_dir.is_dir() else []:
        try:
            cards.append(read_card(path))
        except ConfigError as exc:
            problems.append((path, exc))
    cards.sort(key=lambda c: (c.created_at, c.version))
    return CardScan(tuple(cards), tuple(problems))


def list_cards(models_dir: Path) -> list[ModelCard]:
    """Every card in ``models_dir``, oldest first.

    Raises:
        ConfigError: the first card file that is not a valid card, naming it.
    """
    scan = scan_cards(models_dir)
    if scan.problems:
        raise scan.problems[0][1]
    return list(scan.cards)


def card_by_version(models_dir: Path, version: str) -> ModelCard:
    """The card of ``version`` in ``models_dir``."""
    path = card_path(models_dir, version)
    if not path.is_file():
        raise ConfigError(f"no model card {version} in {models_dir}")
    return read_card(path)


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in chunks (weights can be large)."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


@dataclass(frozen=True)
class WeightsCheck:
    """A card's weights file against the hash the card records.

    Attributes:
        card: the card checked.
        path: its weights file.
        actual_sha256: the file's hash; None when the file is missing.
    """

    card: ModelCard
    path: Path
    actual_sha256: str | None

    @property
    def status(self) -> WeightsStatus:
        if self.actual_sha256 is None:
            return "missing"
        return "ok" if self.actual_sha256 == self.card.weights_sha256 else "mismatch"


def check_weights(card: ModelCard, models_dir: Path) -> WeightsCheck:
    """Hash ``card``'s weights file (in ``models_dir``) without judging it."""
    path = models_dir / card.weights_file
    return WeightsCheck(card, path, sha256_of(path) if path.is_file() else None)


def verify_weights(card: ModelCard, models_dir: Path) -> Path:
    """The card's weights file, only once its sha256 matches the card.

    Raises:
        ConfigError: the file is missing.
        ArtifactIntegrityError: the file is not the one the card was written for.
    """
    check = check_weights(card, models_dir)
    if check.actual_sha256 is None:
        raise ConfigError(f"model card {card.version} points at {check.path}, which does not exist")
    if check.status == "mismatch":
        raise ArtifactIntegrityError(str(check.path), card.weights_sha256, check.actual_sha256)
    return check.path


@dataclass(frozen=True)
class ModelChain:
    """FM -> compressor (-> VM) as registered; ``vm`` is None before a VM is trained."""

    fm: ModelCard
    compressor: ModelCard
    vm: ModelCard | None

    @property
    def embedding_version(self) -> str:
        """The ``model_version`` stored with every embedding of this chain."""
        return self.compressor.version

    @property
    def code_dim(self) -> int | None:
        """Length of the stored embedding ``z``, from the compressor card."""
        return self.compressor.code_dim

    @property
    def vm_version_chain(self) -> str:
        """``vm <- compressor <- fm`` for messages."""
        vm = self.vm.version if self.vm is not None else "(no VM)"
        return f"{vm} <- {self.compressor.version} <- {self.fm.version}"

    @property
    def cards(self) -> tuple[ModelCard, ...]:
        return (self.fm, self.compressor) + ((self.vm,) if self.vm is not None else ())


def parent_card(cards: Mapping[str, ModelCard], child: ModelCard, kind: ModelKind) -> ModelCard:
    """The ``kind`` card among ``child``'s parents, from ``cards`` keyed by version.

    Raises:
        ConfigError: no parent of that kind is among ``cards``.
    """
    for version in child.parents:
        card = cards.get(version)
        if card is not None and card.kind == kind:
            return card
    raise ConfigError(
        f"model card {child.version} names no {kind} card present in its folder "
        f"(parents {list(child.parents)}); copy the missing card or retrain"
    )


def select_chain(cards: Iterable[ModelCard], vm_version: str | None = None) -> ModelChain | None:
    """The chain of ``vm_version``, else of the newest VM, else of the newest compressor (no VM
    trained yet); None when there is no compressor card.

    Raises:
        ConfigError: ``vm_version`` has no card, or a parent card is missing.
    """
    ordered = sorted(cards, key=lambda c: (c.created_at, c.version))
    by_version = {c.version: c for c in ordered}
    vms = [c for c in ordered if c.kind == "vm"]
    if vm_version is not None:
        vms = [c for c in vms if c.version == vm_version]
        if not vms:
            present = [c.version for c in ordered if c.kind == "vm"]
            raise ConfigError(f"no VM model card {vm_version} (VM cards present: {present})")
    if vms:
        compressor = parent_card(by_version, vms[-1], "compressor")
        return ModelChain(parent_card(by_version, compressor, "fm"), compressor, vms[-1])
    compressors = [c for c in ordered if c.kind == "compressor"]
    if not compressors:
        return None
    return ModelChain(parent_card(by_version, compressors[-1], "fm"), compressors[-1], None)


def newest_chain(models_dir: Path) -> ModelChain | None:
    """:func:`select_chain` over the cards of ``models_dir``.

    Raises:
        ConfigError: a card is malformed or a parent card is missing.
    """
    return select_chain(list_cards(models_dir))


SERVING_ALIAS_FILE = "serving.json"
"""The serving alias in a models folder: the chain ``solaris promote`` named."""


class ServingAlias(BaseModel):
    """The promoted serving chain (written atomically by
    :func:`solaris_feast.pipeline.promotion.promote`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vm: str = Field(min_length=1)
    """The promoted VM (the verifier)."""
    compressor: str = Field(min_length=1)
    """Its compressor: the model_version stored beside the chain's vectors."""
    fm: str = Field(min_length=1)
    """The compressor's FM."""
    promoted_at: datetime
    """When it was promoted (UTC)."""


def read_serving_alias(models_dir: Path) -> ServingAlias | None:
    """The serving alias of ``models_dir``; None when nothing was promoted there.

    Raises:
        ConfigError: the alias file is not a valid alias, naming it.
    """
    path = models_dir / SERVING_ALIAS_FILE
    if not path.is_file():
        return None
    try:
        return ServingAlias.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValidationError) as exc:
        raise ConfigError(f"serving alias {path} is malformed: {exc}") from exc


def serving_chain(
    models_dir: Path, vm_version: str | None = None, cards: Sequence[ModelCard] | None = None
) -> ModelChain | None:
    """The chain in service: ``vm_version``'s when given, else the promoted one (the serving
    alias), else the newest VM's with a warning (a demo or a fresh registry never promoted).
    ``cards``: the folder's cards when the caller has read them already (the lineage review
    reads them tolerating malformed files).

    Raises:
        ConfigError: a named or promoted VM has no card, or its parents differ from the alias.
    """
    if cards is None:
        cards = list_cards(models_dir)
    if vm_version:
        return select_chain(cards, vm_version)
    alias = read_serving_alias(models_dir)
    if alias is None:
        chain = select_chain(cards)
        if chain is not None and chain.vm is not None:
            logger.warning(
                "no serving alias in %s: serving the newest VM %s; name the chain with "
                "solaris promote --config PATH --vm VERSION",
                models_dir,
                chain.vm.version,
            )
        return chain
    chain = select_chain(cards, alias.vm)
    if chain is not None and (chain.compressor.version, chain.fm.version) != (
        alias.compressor,
        alias.fm,
    ):
        raise ConfigError(
            f"serving alias {models_dir / SERVING_ALIAS_FILE} names {alias.vm} <- "
            f"{alias.compressor} <- {alias.fm}, but the cards say {chain.vm_version_chain}"
        )
    return chain


def serving_embedding_version(models_dir: Path) -> str | None:
    """The ``model_version`` the serving VM expects (:func:`serving_chain`: the promoted chain,
    else the newest): its compressor's version (or the newest compressor's when no VM is
    registered yet); None without cards."""
    chain = serving_chain(models_dir)
    return chain.embedding_version if chain is not None else None


def _embedding_codec(environ: Mapping[str, str]) -> str:
    text = environ.get(EMBEDDING_CODEC_ENV, "").strip()
    if text:
        return text  # SolarisFeastConfig refuses an unknown name, naming the choices
    if environ.get("SOLARIS_CONFIG", "").strip():
        from solaris_feast.config import load_config

        precompute = load_config(environ["SOLARIS_CONFIG"]).precompute
        return str(getattr(precompute, "embedding_codec", DEFAULT_EMBEDDING_CODEC))
    return DEFAULT_EMBEDDING_CODEC


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
    the serving chain in ``models_dir`` (:func:`serving_chain`), TTLs from the environment and
    the entities' id types from the chain's vocabulary (Int64 or String, when it has one), and
    the schedule tag from the precompute DAG's schedule (:func:`solaris_feast.config.schedule_of`:
    ``SOLARIS_PRECOMPUTE_SCHEDULE``, else the ``solaris.yaml`` that ``SOLARIS_CONFIG`` names).

    Without cards the versions are ``"unversioned"`` and the dimension is the default. The
    variables: ``SOLARIS_PAIR_TTL_SECONDS``, ``SOLARIS_USER_TTL_SECONDS``,
    ``SOLARIS_SIMILAR_TTL_SECONDS``, ``SOLARIS_CLOCK_SKEW_SECONDS`` (the resolved view's clock
    skew) and ``SOLARIS_PRECOMPUTE_SCHEDULE`` (the one the precompute DAG reads, so the tag says
    what runs). The embedding codec is ``SOLARIS_EMBEDDING_CODEC``, else the config file's
    ``precompute.embedding_codec`` when ``SOLARIS_CONFIG`` is set, else float32.

    Raises:
        ConfigError: a malformed card, a missing parent card, or a variable that is not a
            number or out of bounds (naming the variable).
    """
    env = os.environ if environ is None else environ
    chain = serving_chain(models_dir)
    from solaris_feast.config import NO_SCHEDULE, schedule_of

    schedule = schedule_of("precompute", "@hourly", env) or NO_SCHEDULE
    settings: dict[str, Any] = {
        "pair_ttl_seconds": _env_seconds(env, PAIR_TTL_ENV, DEFAULT_PAIR_TTL_SECONDS),
        "user_ttl_seconds": _env_seconds(env, USER_TTL_ENV, DEFAULT_USER_TTL_SECONDS),
        "similar_ttl_seconds": _env_seconds(env, SIMILAR_TTL_ENV, DEFAULT_SIMILAR_TTL_SECONDS),
        "clock_skew_seconds": _env_seconds(env, CLOCK_SKEW_ENV, int(DEFAULT_CLOCK_SKEW_SECONDS)),
        "pair_schedule": schedule,
        "user_schedule": schedule,
        "similar_schedule": schedule,
        "embedding_codec": _embedding_codec(env),
    }
    if chain is not None:
        # The entities take the ids the chain was trained on: a log with String items makes
        # String item keys, without editing the repo.
        from solaris_feast.models.vocabulary import Vocabulary

        vocabulary = Vocabulary.load(models_dir, chain.fm.version)
        if vocabulary is not None:
            settings["user_id_type"] = vocabulary.users.id_type
            settings["item_id_type"] = vocabulary.items.id_type
        settings["fm_version"] = chain.fm.version
        settings["compressor_version"] = chain.compressor.version
        settings["verifier_version"] = chain.vm.version if chain.vm is not None else UNVERSIONED
        if chain.code_dim is not None:
            settings["embedding_dim"] = chain.code_dim
    from pydantic import ValidationError

    try:
        return SolarisFeastConfig(**settings)
    except ValidationError as exc:
        # Name the variable that was set, not the view config's field it fills.
        source = {
            "pair_ttl_seconds": PAIR_TTL_ENV,
            "user_ttl_seconds": USER_TTL_ENV,
            "similar_ttl_seconds": SIMILAR_TTL_ENV,
            "clock_skew_seconds": CLOCK_SKEW_ENV,
            "embedding_codec": f"{EMBEDDING_CODEC_ENV} (or precompute.embedding_codec)",
        }
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0])
            problems.append(f"{source.get(field, field)}={settings.get(field)!r}: {error['msg']}")
        raise ConfigError(f"the views cannot be defined: {'; '.join(problems)}") from exc


APPLY_MODELS_DIR = (
    "feast apply reads the cards in models.dir of the solaris.yaml $SOLARIS_CONFIG names, "
    "else in $SOLARIS_MODELS_DIR, else in the models folder beside the repo"
)
"""Where :func:`models_dir_for_repo` looks, said in the errors a mismatched apply causes."""


def models_dir_for_repo(repo_dir: Path, environ: Mapping[str, str] | None = None) -> Path:
    """The registry a repo's views take their chain from (:data:`APPLY_MODELS_DIR`): the
    ``models.dir`` of the config ``SOLARIS_CONFIG`` names, as ``solaris train``, ``promote``,
    ``status`` and the DAGs read it, else ``SOLARIS_MODELS_DIR``, else ``<repo>/../models``
    (the project's layout). Without the config's folder an apply beside a config that keeps its
    models elsewhere tagged the views with another chain (or none), and every round refused them.
    """
    env = os.environ if environ is None else environ
    if env.get("SOLARIS_CONFIG", "").strip():
        from solaris_feast.config import load_config

        return Path(load_config(env["SOLARIS_CONFIG"]).models.dir)
    configured = env.get(MODELS_DIR_ENV, "").strip()
    return Path(configured) if configured else repo_dir.resolve().parent / "models"


def lineage_of(cards: Sequence[ModelCard], versions: Iterable[str]) -> set[str]:
    """``versions`` present among ``cards`` with all their ancestors (parents, recursively)."""
    by_version = {c.version: c for c in cards}
    seen: set[str] = set()
    pending = [v for v in versions if v in by_version]
    while pending:
        version = pending.pop()
        if version not in seen:
            seen.add(version)
            pending += [p for p in by_version[version].parents if p in by_version]
    return seen
