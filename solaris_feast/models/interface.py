"""The models a deployment brings, as the plugin calls them: an FM encoder and a verifier.

A platform has its own foundation model and its own vertical model. The plugin needs two things
from them, and nothing about their architecture:

- a :class:`FoundationEncoder`: pairs, each as of a time, with the log their history comes from
  -> ``(B, D)`` float32 representations. The plugin trains its compressor on them
  (:func:`solaris_feast.models.chain.fit_compressor`) and stores the compressed ``z``.
- a :class:`Verifier`: the same pairs -> a score in ``[0, 1]`` per pair, the probability that the
  pair reaches the final ranking stage (or any monotone stand-in). The planner spends the FM
  budget on the pairs it scores highest.

Either is named in ``solaris.yaml`` (``models.fm`` / ``models.verifier``) as ``reference`` (the
project's own models, trained by ``solaris train``) or as an entry point
``package.module:factory`` with keyword ``options`` (:class:`~.spec.ModelSpec`); the factory is
imported and called once per task and returns the model. The reference FM and VM are one
implementation of the same two protocols (:class:`ReferenceEncoder`, :class:`ReferenceVerifier`):
the precompute calls every chain through :class:`ChainModels`, never a model class directly.

Or either is an exported artifact (:class:`~.spec.ArtifactSpec`: TorchScript ``.pt`` or
``torch.export`` ``.pt2``), called with tensors (:data:`ARTIFACT_INPUTS`): the user and item ids
(int64 ids as they are, String ids as :func:`id_codes`), and each pair's last ``history_len``
events before its time, newest first (item id, first label, age in hours, mask).

A model of your own is registered like a trained one: a card whose artifact is the spec (entry
point and options, hashed like weights), with the compressor as its child and the verifier as
the compressor's child, so promotion, lineage and the chain-fits-the-log check see one chain.
Every output is checked (:func:`checked_representation`, :func:`checked_scores`): a wrong shape,
dtype or a NaN fails the task with :class:`~solaris_feast.errors.ModelOutputError` naming the
entry point, before anything is written.

Cost: importing this module needs numpy and pandas; torch is imported by the functions that load
or run models. The DAG files parse the config through the pydantic-only :mod:`.spec`.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np
import pandas as pd

from solaris_feast.columns import EVENT_TIMESTAMP
from solaris_feast.errors import ConfigError, ModelOutputError
from solaris_feast.keys import id_array, stable_id_hash
from solaris_feast.models.spec import ArtifactSpec, ModelChoice, ModelSpec, OwnModel

__all__ = ["ArtifactSpec", "ModelChoice", "ModelSpec", "OwnModel"]  # the config's names

if TYPE_CHECKING:
    import torch

    from solaris_feast.data.schema import InteractionDataset
    from solaris_feast.models.cards import ModelCard, ModelKind
    from solaris_feast.models.compressor import EmbeddingCompressor
    from solaris_feast.models.features import PairFeaturizer
    from solaris_feast.models.foundation import FoundationModel
    from solaris_feast.models.registry import ModelBundle
    from solaris_feast.models.training import Precision
    from solaris_feast.models.vertical import VerticalModel
    from solaris_feast.models.vocabulary import Vocabulary, VocabularyFeaturizer

logger = logging.getLogger(__name__)

INTERFACE_SUFFIX = ".interface.json"
"""The artifact of a model of the deployment's own: its spec, ``<version>.interface.json``."""
INTERFACE_CONFIG = "interface"
"""Key of a card's config that holds the spec of a model of the deployment's own."""


@dataclass(frozen=True)
class PairsAsOf:
    """User-item pairs, each as of a time, and the log their history comes from.

    Attributes:
        users: ``(B,)`` the log's own user ids (int64, or object of str).
        items: ``(B,)`` the log's own item ids.
        at: ``(B,)`` UTC times; a pair's history is the log's events strictly before its time.
        log: the window of the log the round read (``interactions`` with ``user_id``,
            ``item_id``, ``event_timestamp`` and the labels, plus the attribute tables). The
            same object for every batch of a round, so a model may index it once.
    """

    users: np.ndarray
    items: np.ndarray
    at: pd.Series
    log: InteractionDataset

    def __len__(self) -> int:
        return len(self.users)

    @classmethod
    def of(cls, users: Any, items: Any, at: Any, log: InteractionDataset) -> PairsAsOf:
        """Pairs of ``users`` x ``items`` (parallel) as of one time or one time per pair."""
        u, i = id_array(users), id_array(items)
        if len(u) != len(i):
            raise ValueError(f"{len(u)} users but {len(i)} items")
        if isinstance(at, pd.Series | pd.DatetimeIndex | np.ndarray | list):
            # One vectorized conversion; values stay datetime64 (no per-row Timestamp objects).
            times = pd.Series(pd.to_datetime(at, utc=True)).reset_index(drop=True)
        else:
            times = pd.Series(pd.Timestamp(at), index=range(len(u)))
        if len(times) != len(u):
            raise ValueError(f"{len(u)} pairs but {len(times)} times")
        # Nanoseconds whatever unit the input had (pandas 2 keeps a Timestamp's own unit).
        return cls(u, i, pd.to_datetime(times, utc=True).dt.as_unit("ns"), log)

    @classmethod
    def of_rows(cls, rows: pd.DataFrame, log: InteractionDataset) -> PairsAsOf:
        """The pairs of log rows, each as of its own event time."""
        from solaris_feast.columns import ITEM_ID, USER_ID

        return cls.of(rows[USER_ID], rows[ITEM_ID], rows[EVENT_TIMESTAMP], log)

    def part(self, lo: int, hi: int) -> PairsAsOf:
        at = self.at.iloc[lo:hi].reset_index(drop=True)
        return PairsAsOf(self.users[lo:hi], self.items[lo:hi], at, self.log)


@runtime_checkable
class FoundationEncoder(Protocol):
    """An FM as the plugin calls it."""

    representation_dim: int
    """D, the width of every representation."""

    def encode(self, pairs: PairsAsOf) -> Any:
        """``(len(pairs), D)`` float32 representations (a numpy array or a CPU tensor)."""
        ...


@runtime_checkable
class Verifier(Protocol):
    """A verifier as the plugin calls it."""

    def score(self, pairs: PairsAsOf) -> Any:
        """``(len(pairs),)`` scores in ``[0, 1]``; higher means more likely to be requested."""
        ...


def _as_numpy(out: Any, where: str, method: str) -> np.ndarray:
    if hasattr(out, "detach"):  # a torch tensor, on any device
        tensor = out.detach().cpu()
        try:
            out = tensor.numpy()
        except TypeError as exc:  # bfloat16 and other dtypes numpy has no type for
            raise ModelOutputError(
                f"{where}: {method} returned a tensor of dtype {tensor.dtype}, which numpy cannot "
                "hold (return float32: .float())"
            ) from exc
    return np.asarray(out)


def call_model(call: Callable[[Any], Any], pairs: PairsAsOf, where: str, method: str) -> Any:
    """``call(pairs)``; an exception of the deployment's own code keeps its type (retryable or
    final as it is) and gains a note naming the model and method that raised it."""
    try:
        return call(pairs)
    except Exception as exc:
        exc.add_note(f"raised by {where}: {method}(pairs) of {len(pairs)} pairs")
        raise


def checked_representation(out: Any, n: int, dim: int, where: str) -> np.ndarray:
    """``out`` as ``(n, dim)`` float32, refused unless it is exactly that and finite.

    Raises:
        ModelOutputError: naming ``where`` (the model) and what is wrong.
    """
    array = _as_numpy(out, where, "encode")
    if array.shape != (n, dim):
        raise ModelOutputError(
            f"{where}: encode returned shape {array.shape}, expected ({n}, {dim})"
        )
    if array.dtype != np.float32:
        # A list becomes float64 in numpy: say what was returned, not only the dtype it became.
        given = "" if hasattr(out, "dtype") else f" (a {type(out).__name__}, read by numpy as such)"
        raise ModelOutputError(
            f"{where}: encode returned dtype {array.dtype}{given}, expected float32: return a "
            "float32 numpy array or tensor"
        )
    if not np.isfinite(array).all():
        bad = int((~np.isfinite(array)).any(axis=1).sum())
        raise ModelOutputError(f"{where}: encode returned NaN or infinite values for {bad} pairs")
    return array


def checked_scores(out: Any, n: int, where: str) -> np.ndarray:
    """``out`` as ``(n,)`` float64 scores, refused unless finite and within ``[0, 1]``.

    Raises:
        ModelOutputError: naming ``where`` and what is wrong.
    """
    array = _as_numpy(out, where, "score")
    if array.shape != (n,):
        raise ModelOutputError(f"{where}: score returned shape {array.shape}, expected ({n},)")
    if not np.issubdtype(array.dtype, np.floating):
        raise ModelOutputError(f"{where}: score returned dtype {array.dtype}, expected floats")
    if not np.isfinite(array).all():
        raise ModelOutputError(f"{where}: score returned NaN or infinite values")
    if len(array) and (array.min() < 0.0 or array.max() > 1.0):
        raise ModelOutputError(
            f"{where}: scores must lie in [0, 1], got [{array.min():.4g}, {array.max():.4g}]"
        )
    return array.astype(np.float64)


def spec_name(spec: OwnModel, what: Literal["fm", "verifier"]) -> str:
    """How messages name a model of the deployment's own: ``models.fm entry point 'p.m:f'``."""
    if isinstance(spec, ArtifactSpec):
        return f"models.{what} artifact {spec.artifact}"
    return f"models.{what} entry point {spec.entry_point!r}"


def build_model(spec: OwnModel, what: Literal["fm", "verifier"]) -> Any:
    """The model ``spec`` names, checked against the protocol ``what`` names: the entry point's
    factory called with its options, or the exported artifact wrapped in the protocol.

    Raises:
        ConfigError: the module does not import, the factory is missing or raises, the artifact
            does not load, or the model lacks the protocol's members, naming the entry point.
    """
    if isinstance(spec, ArtifactSpec):
        return load_artifact(Path(spec.artifact), spec.history_len, what)
    module_name, _, attribute = spec.entry_point.partition(":")
    where = spec_name(spec, what)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may raise anything while importing
        raise ConfigError(f"{where}: module {module_name!r} does not import: {exc!r}") from exc
    factory: Any = module
    for part in attribute.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise ConfigError(f"{where}: {module_name} has no attribute {attribute!r}")
    if not callable(factory):
        raise ConfigError(f"{where}: {attribute} is not callable")
    try:
        model = factory(**spec.options)
    except Exception as exc:
        raise ConfigError(f"{where}: the factory raised {exc!r}") from exc
    if what == "fm":
        dim = getattr(model, "representation_dim", None)
        if not callable(getattr(model, "encode", None)):
            raise ConfigError(f"{where}: the model has no encode(pairs) method")
        if not isinstance(dim, int) or isinstance(dim, bool) or dim <= 0:
            raise ConfigError(f"{where}: representation_dim must be a positive int, got {dim!r}")
    elif not callable(getattr(model, "score", None)):
        raise ConfigError(f"{where}: the model has no score(pairs) method")
    return model


def encode_in_chunks(
    encoder: FoundationEncoder, pairs: PairsAsOf, where: str, chunk: int = 8192
) -> np.ndarray:
    """``(len(pairs), D)`` float32 representations, ``chunk`` pairs per call, each checked."""
    dim = int(encoder.representation_dim)
    out = np.empty((len(pairs), dim), dtype=np.float32)
    for lo in range(0, len(pairs), chunk):
        hi = min(lo + chunk, len(pairs))
        raw = call_model(encoder.encode, pairs.part(lo, hi), where, "encode")
        out[lo:hi] = checked_representation(raw, hi - lo, dim, where)
    return out


def score_in_chunks(
    verifier: Verifier, pairs: PairsAsOf, where: str, chunk: int = 8192
) -> np.ndarray:
    """``(len(pairs),)`` verifier scores, ``chunk`` pairs per call, each checked."""
    out = np.empty(len(pairs), dtype=np.float64)
    for lo in range(0, len(pairs), chunk):
        hi = min(lo + chunk, len(pairs))
        raw = call_model(verifier.score, pairs.part(lo, hi), where, "score")
        out[lo:hi] = checked_scores(raw, hi - lo, where)
    return out


# -- the reference models, as one implementation of the protocols ---------------------------------


@dataclass
class _FeaturizerCache:
    """The reference models' featurizer over the log of the pairs they are given: built once per
    log (a round hands every batch the same log object), or fixed when given."""

    vocabulary: Vocabulary | None
    history_len: int
    fixed: PairFeaturizer | VocabularyFeaturizer | None = None
    _log: InteractionDataset | None = field(default=None, repr=False)
    _built: PairFeaturizer | VocabularyFeaturizer | None = field(default=None, repr=False)

    def for_log(self, log: InteractionDataset) -> PairFeaturizer | VocabularyFeaturizer:
        if self.fixed is not None:
            return self.fixed
        if self._built is None or self._log is not log:
            from solaris_feast.models.vocabulary import featurizer_for

            self._built = featurizer_for(self.vocabulary, log, self.history_len)
            self._log = log
        return self._built


class _ReferenceModel:
    """What the reference FM and VM share as protocol implementations: inputs from the one
    featurizer over the pairs' log, a device and a precision, float32 answers on the CPU.

    ``featurize_seconds`` adds up the time spent building inputs, so a round's stats can tell
    featurizing from the forward pass.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        history_len: int,
        vocabulary: Vocabulary | None,
        featurizer: PairFeaturizer | VocabularyFeaturizer | None,
        device: str,
        precision: Precision,
    ) -> None:
        from solaris_feast.models.training import resolve_device

        self.device = resolve_device(device)
        self.precision = precision
        self.module = module.to(self.device)
        self._inputs = _FeaturizerCache(vocabulary, history_len, featurizer)
        self.featurize_seconds = 0.0

    def _forward(self, pairs: PairsAsOf, forward: Callable[[Any], torch.Tensor]) -> torch.Tensor:
        import time

        import torch

        from solaris_feast.models.training import autocast

        started = time.perf_counter()
        batch = self._inputs.for_log(pairs.log).batch(pairs.users, pairs.items, pairs.at)
        self.featurize_seconds += time.perf_counter() - started
        self.module.eval()
        with torch.inference_mode(), autocast(self.device, self.precision):
            return forward(batch.to(self.device)).float().cpu()


class ReferenceEncoder(_ReferenceModel):
    """The reference FM (:class:`~solaris_feast.models.foundation.FoundationModel`) as a
    :class:`FoundationEncoder`: featurizes the pairs over their log (through the FM's vocabulary
    when it has one) and returns its representations."""

    def __init__(
        self,
        fm: FoundationModel,
        vocabulary: Vocabulary | None = None,
        featurizer: PairFeaturizer | VocabularyFeaturizer | None = None,
        device: str = "cpu",
        precision: Precision = "fp32",
    ) -> None:
        super().__init__(fm, fm.schema.history_len, vocabulary, featurizer, device, precision)
        self.fm = fm
        self.representation_dim = int(fm.config.representation_dim)

    reuse_history: bool = True
    """Encode each (user, time)'s history once per call and reuse it across that user's pairs
    (``FoundationModel.encode_history`` + ``encode_pairs_with_history``; equal to the per-pair
    ``representation`` to float rounding). False runs the FM per pair (the benchmark baseline)."""

    def encode(self, pairs: PairsAsOf) -> torch.Tensor:
        if not self.reuse_history:
            return self._forward(pairs, self.fm.representation)
        import torch

        # Pairs of one user as of one time share a history; group ids follow first appearance.
        keys = pd.DataFrame({"user": pairs.users, "at": pairs.at.to_numpy()})
        group = keys.groupby(["user", "at"], sort=False).ngroup().to_numpy(dtype=np.int64)
        first = np.unique(group, return_index=True)[1]
        first_rows = torch.from_numpy(first).to(self.device)
        user_index = torch.from_numpy(group).to(self.device)

        def reused(batch: Any) -> torch.Tensor:
            history = self.fm.encode_history(batch.select(first_rows))
            return self.fm.encode_pairs_with_history(batch, history, user_index)

        return self._forward(pairs, reused)


class ReferenceVerifier(_ReferenceModel):
    """The reference VM (:class:`~solaris_feast.models.vertical.VerticalModel`) as a
    :class:`Verifier`: its main-task probability with no embedding."""

    def __init__(
        self,
        vm: VerticalModel,
        vocabulary: Vocabulary | None = None,
        featurizer: PairFeaturizer | VocabularyFeaturizer | None = None,
        device: str = "cpu",
        precision: Precision = "fp32",
    ) -> None:
        super().__init__(vm, vm.schema.history_len, vocabulary, featurizer, device, precision)
        self.vm = vm

    def score(self, pairs: PairsAsOf) -> torch.Tensor:
        return self._forward(pairs, self.vm.verifier_score).double()


# -- exported artifacts ---------------------------------------------------------------------------

ARTIFACT_INPUTS = (
    "user",  # (B,) int64
    "item",  # (B,) int64
    "history_item",  # (B, L) int64, newest first; 0 where history_mask is False
    "history_label",  # (B, L) float32, the log's first label
    "history_age_hours",  # (B, L) float32, the pair's time minus the event's
    "history_mask",  # (B, L) bool
)
"""The positional inputs of an exported FM or verifier. Its output: ``(B, D)`` float32 for an
FM, ``(B,)`` scores in [0, 1] for a verifier."""


def id_codes(ids: np.ndarray) -> np.ndarray:
    """``(B,)`` int64 of raw ids for a tensor (:func:`~solaris_feast.keys.stable_id_hash`):
    Int64 ids as they are; a String id as the first 8 bytes of its utf-8 blake2b digest,
    little-endian, top bit cleared (so an exported model hashes the same way as its training
    pipeline did, in any language)."""
    return stable_id_hash(ids)


class _ArtifactInputs:
    """Builds :data:`ARTIFACT_INPUTS` for pairs over their log, through the one history rule
    (the reference featurizer, keyed by the log's own ids)."""

    def __init__(self, history_len: int) -> None:
        self.history_len = history_len
        self._log: InteractionDataset | None = None
        self._known_items = np.zeros(0, dtype=np.int64)
        self._featurizer: VocabularyFeaturizer | PairFeaturizer | None = None

    def tensors(self, pairs: PairsAsOf) -> tuple[torch.Tensor, ...]:
        import torch

        from solaris_feast.models.vocabulary import Vocabulary, featurizer_for

        if self._featurizer is None or self._log is not pairs.log:
            # Every id of the log gets a row, so each history event maps back to its raw id.
            vocabulary = Vocabulary.from_log(pairs.log.interactions)
            self._featurizer = featurizer_for(vocabulary, pairs.log, self.history_len)
            self._known_items = vocabulary.items.ids
            self._log = pairs.log
        batch = self._featurizer.batch(pairs.users, pairs.items, pairs.at)
        mask = batch.hist_mask.numpy()
        rows = batch.hist_item.numpy()
        history = np.zeros(rows.shape, dtype=np.int64)
        if len(self._known_items) and mask.any():
            history[mask] = id_codes(self._known_items[rows[mask] - 1])
        return (
            torch.from_numpy(id_codes(pairs.users)),
            torch.from_numpy(id_codes(pairs.items)),
            torch.from_numpy(history),
            batch.hist_label.float(),
            torch.expm1(batch.hist_age).float(),  # the featurizer keeps log1p(hours)
            batch.hist_mask,
        )


def load_artifact(path: Path, history_len: int, what: Literal["fm", "verifier"]) -> Any:
    """An exported FM or verifier as the protocol ``what`` names.

    Raises:
        ConfigError: the file is missing, not a TorchScript (.pt) or torch.export (.pt2) file,
            or its output on one empty-history pair is not the protocol's shape.
    """
    import torch

    where = f"models.{what} artifact {path}"
    if not path.is_file():
        raise ConfigError(f"{where} does not exist")
    try:
        if path.suffix == ".pt2":
            module: Any = torch.export.load(str(path)).module()
        elif path.suffix == ".pt":
            module = torch.jit.load(str(path), map_location="cpu")
        else:
            raise ConfigError(f"{where}: expected a .pt (TorchScript) or .pt2 (torch.export) file")
        probe = (
            torch.zeros(2, dtype=torch.int64),
            torch.zeros(2, dtype=torch.int64),
            torch.zeros(2, history_len, dtype=torch.int64),
            torch.zeros(2, history_len),
            torch.zeros(2, history_len),
            torch.zeros(2, history_len, dtype=torch.bool),
        )
        with torch.inference_mode():
            out = module(*probe)
    except ConfigError:
        raise
    except Exception as exc:  # torch raises many kinds for a bad file or a bad signature
        raise ConfigError(f"{where} does not load or run on {ARTIFACT_INPUTS}: {exc!r}") from exc
    if not isinstance(out, torch.Tensor):
        raise ConfigError(
            f"{where}: must return one tensor ({'(B, D) float32' if what == 'fm' else '(B,)'}), "
            f"got {type(out).__name__} for two pairs"
        )
    shape = tuple(out.shape)
    if what == "fm" and (len(shape) != 2 or shape[0] != 2):
        raise ConfigError(f"{where}: an FM must return (B, D), got {shape} for two pairs")
    if what == "verifier" and shape != (2,):
        raise ConfigError(f"{where}: a verifier must return (B,), got {shape} for two pairs")
    return _ArtifactModel(module, history_len, int(shape[1]) if what == "fm" else 0)


class _ArtifactModel:
    """An exported module behind both protocols (``encode`` for an FM, ``score`` for a
    verifier)."""

    def __init__(self, module: Any, history_len: int, representation_dim: int) -> None:
        self.module = module
        self.representation_dim = representation_dim
        self._inputs = _ArtifactInputs(history_len)

    def _call(self, pairs: PairsAsOf) -> torch.Tensor:
        import torch

        inputs = self._inputs.tensors(pairs)
        if len(pairs) == 1:
            # torch.export specializes batch sizes 0 and 1 away: one pair goes as two.
            inputs = tuple(torch.cat([t, t]) for t in inputs)
        with torch.inference_mode():
            return torch.as_tensor(self.module(*inputs))[: len(pairs)]

    def encode(self, pairs: PairsAsOf) -> torch.Tensor:
        return self._call(pairs)

    def score(self, pairs: PairsAsOf) -> torch.Tensor:
        return self._call(pairs).double()


# -- cards of models of the deployment's own ------------------------------------------------------


def interface_spec(card: ModelCard) -> OwnModel | None:
    """The spec on a card of a model of the deployment's own; None for a trained model."""
    raw = card.config.get(INTERFACE_CONFIG)
    if raw is None:
        return None
    if isinstance(raw, dict) and "artifact" in raw:
        return ArtifactSpec.model_validate(raw)
    return ModelSpec.model_validate(raw)


def register_interface_model(
    spec: OwnModel,
    kind: ModelKind,
    models_dir: Path,
    *,
    parents: tuple[str, ...] = (),
    extra_config: dict[str, object] | None = None,
    **card_fields: Any,
) -> ModelCard:
    """Register a model of the deployment's own: an entry point's spec, or a copy of an exported
    file, is the card's artifact, hashed as weights are; the card's config holds the spec (with
    ``extra_config``, e.g. the representation width)."""
    import shutil

    from solaris_feast.models.cards import register_artifact

    payload = spec.model_dump(mode="json")
    write: Callable[[Path], object]
    if isinstance(spec, ArtifactSpec):
        source, suffix = Path(spec.artifact), Path(spec.artifact).suffix
        write = lambda path: shutil.copyfile(source, path)  # noqa: E731
    else:
        text = json.dumps(payload, indent=2, sort_keys=True)
        suffix = INTERFACE_SUFFIX
        write = lambda path: path.write_text(text, encoding="utf-8")  # noqa: E731
    return register_artifact(
        write,
        suffix,
        kind,
        models_dir,
        parents=parents,
        config={INTERFACE_CONFIG: payload, **(extra_config or {})},
        **card_fields,
    )


def _built_from_card(card: ModelCard, models_dir: Path, what: Literal["fm", "verifier"]) -> Any:
    from solaris_feast.models.cards import verify_weights

    spec = interface_spec(card)
    if spec is None:
        raise ValueError(f"{card.version} is a trained model, not one of the deployment's own")
    artifact = verify_weights(card, models_dir)  # the registry's copy, checked by its sha256
    if isinstance(spec, ArtifactSpec):
        return load_artifact(artifact, spec.history_len, what)
    stored = json.loads(artifact.read_text(encoding="utf-8"))
    if stored != spec.model_dump(mode="json"):
        raise ConfigError(f"model card {card.version}: its spec file does not match the card")
    return build_model(spec, what)


def load_encoder(
    card: ModelCard,
    models_dir: Path,
    vocabulary: Vocabulary | None = None,
    device: str = "cpu",
    precision: Precision = "fp32",
    featurizer: PairFeaturizer | VocabularyFeaturizer | None = None,
) -> FoundationEncoder:
    """The FM an ``fm`` card describes, as a :class:`FoundationEncoder` (the reference FM reading
    ``featurizer`` when given, else one built over each log it is handed).

    Raises:
        ConfigError: a model of the deployment's own whose width differs from the card's.
    """
    if interface_spec(card) is None:
        from solaris_feast.models.foundation import FoundationModel
        from solaris_feast.models.registry import load_model

        fm = load_model(card, models_dir)
        if not isinstance(fm, FoundationModel):
            raise ConfigError(f"model card {card.version} is a {card.kind}, not an FM")
        return ReferenceEncoder(fm, vocabulary, featurizer, device, precision)
    encoder = _built_from_card(card, models_dir, "fm")
    recorded = card.config.get("representation_dim")
    if recorded is not None and recorded != encoder.representation_dim:
        raise ConfigError(
            f"FM {card.version} was registered with representation_dim {recorded}, its entry "
            f"point now gives {encoder.representation_dim}: train a compressor for it"
        )
    return encoder


def load_verifier(
    card: ModelCard,
    models_dir: Path,
    vocabulary: Vocabulary | None = None,
    device: str = "cpu",
    precision: Precision = "fp32",
) -> Verifier:
    """The verifier a ``vm`` card describes."""
    if interface_spec(card) is None:
        from solaris_feast.models.registry import load_model
        from solaris_feast.models.vertical import VerticalModel

        vm = load_model(card, models_dir)
        if not isinstance(vm, VerticalModel):
            raise ConfigError(f"model card {card.version} is a {card.kind}, not a VM")
        return ReferenceVerifier(vm, vocabulary, device=device, precision=precision)
    return _built_from_card(card, models_dir, "verifier")


def describe(card: ModelCard) -> str:
    """How a card's model is named in messages: its entry point, or the reference class."""
    spec = interface_spec(card)
    kind = "FM" if card.kind == "fm" else "verifier"
    if isinstance(spec, ArtifactSpec):
        return f"{kind} {card.version} ({card.weights_file})"
    return f"{kind} {card.version}" + (f" ({spec.entry_point})" if spec else "")


# -- the chain as the precompute runs it ----------------------------------------------------------


@dataclass(frozen=True)
class ChainModels:
    """FM encoder -> compressor, and the verifier: the serving chain as the precompute calls it.

    Attributes:
        encoder: the FM.
        compressor: the plugin's compressor, trained on the encoder's representations.
        verifier: scores pairs for the planner.
        fm_card, compressor_card, vm_card: the chain's cards.
        vocabulary: the chain's id vocabulary, when the reference models map ids through one.
    """

    encoder: FoundationEncoder
    compressor: EmbeddingCompressor
    verifier: Verifier
    fm_card: ModelCard
    compressor_card: ModelCard
    vm_card: ModelCard
    vocabulary: Vocabulary | None = None

    @property
    def embedding_version(self) -> str:
        """The ``model_version`` stored beside every embedding: the compressor's version."""
        return self.compressor_card.version

    @property
    def code_dim(self) -> int:
        return int(self.compressor.config.code_dim)

    @classmethod
    def reference(
        cls,
        bundle: ModelBundle,
        featurizer: PairFeaturizer | VocabularyFeaturizer | None = None,
    ) -> ChainModels:
        """A loaded reference bundle as a chain (``featurizer``: a fixed one for every log)."""
        return cls(
            encoder=ReferenceEncoder(bundle.fm, bundle.vocabulary, featurizer),
            compressor=bundle.compressor,
            verifier=ReferenceVerifier(bundle.vm, bundle.vocabulary, featurizer),
            fm_card=bundle.fm_card,
            compressor_card=bundle.compressor_card,
            vm_card=bundle.vm_card,
            vocabulary=bundle.vocabulary,
        )

    def representations(self, pairs: PairsAsOf) -> np.ndarray:
        """The FM's checked ``(B, D)`` representations."""
        return encode_in_chunks(self.encoder, pairs, describe(self.fm_card))

    def verifier_scores(self, pairs: PairsAsOf) -> np.ndarray:
        """The verifier's checked ``(B,)`` scores."""
        return score_in_chunks(self.verifier, pairs, describe(self.vm_card))


def load_chain_models(
    models_dir: Path,
    vm_version: str | None = None,
    device: str = "cpu",
    precision: Precision = "fp32",
) -> ChainModels:
    """The chain ending at ``vm_version`` (else the serving alias's, else the newest), loaded;
    the reference models on ``device`` (the compressor stays on the CPU: one small matmul).

    Raises:
        ConfigError: no chain, a compressor whose input width is not the FM's, or a model that
            does not load.
    """
    from solaris_feast.models.cards import serving_chain
    from solaris_feast.models.compressor import EmbeddingCompressor
    from solaris_feast.models.registry import load_model
    from solaris_feast.models.vocabulary import Vocabulary

    chain = serving_chain(models_dir, vm_version)
    if chain is None or chain.vm is None:
        raise ConfigError(
            f"no VM model card in {models_dir}: train the models first (solaris train)"
        )
    vocabulary = Vocabulary.load(models_dir, chain.fm.version)
    encoder = load_encoder(chain.fm, models_dir, vocabulary, device, precision)
    compressor = load_model(chain.compressor, models_dir)
    if not isinstance(compressor, EmbeddingCompressor):
        raise ConfigError(f"model card {chain.compressor.version} is not a compressor")
    if compressor.config.input_dim != encoder.representation_dim:
        raise ConfigError(
            f"compressor {chain.compressor.version} takes {compressor.config.input_dim}-dim "
            f"inputs, {describe(chain.fm)} gives {encoder.representation_dim}"
        )
    verifier = load_verifier(chain.vm, models_dir, vocabulary, device, precision)
    return ChainModels(
        encoder, compressor, verifier, chain.fm, chain.compressor, chain.vm, vocabulary
    )


Factory = Callable[..., Any]
"""What an entry point names: a callable taking the spec's options, returning the model."""
