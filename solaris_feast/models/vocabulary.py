"""Id vocabularies: how the reference models map real ids onto their embedding rows.

Real systems have sparse Int64 ids (up to 2**63-1) or String ids; the reference FM and VM have
embedding tables of a fixed size. A vocabulary, built from the training log, gives each known id
a row ``1..N`` and every id it has not seen the out-of-vocabulary row ``0`` (:data:`OOV_INDEX`),
so a user or item that appears after training scores with the shared OOV embedding instead of an
``IndexError``. It is saved as JSON beside the FM's card (``<fm version>.vocabulary.json``) and
loaded with the bundle (:func:`solaris_feast.models.registry.load_bundle`).

:class:`VocabularyFeaturizer` is :class:`~solaris_feast.models.features.PairFeaturizer` over a log
with any ids: it keys histories by the log's own ids (two new users never share a history, even
though both embed as OOV) and hands the models vocabulary rows.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from solaris_feast.data.schema import EVENT_TIMESTAMP, ITEM_ID, USER_ID, InteractionDataset
from solaris_feast.errors import ConfigError
from solaris_feast.keys import PairCodes, id_array
from solaris_feast.store.ids import IdType, id_type_of

if TYPE_CHECKING:
    from solaris_feast.models.features import PairBatch, PairFeaturizer

OOV_INDEX = 0
"""Embedding row of every id the vocabulary does not hold."""
VOCABULARY_SUFFIX = ".vocabulary.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class IdVocabulary:
    """Known ids of one side (users or items), sorted; id ``ids[k]`` has row ``k + 1``.

    Attributes:
        ids: ``(N,)`` sorted distinct ids, int64 or object of str.
        id_type: ``int64`` or ``string``.
    """

    ids: np.ndarray
    id_type: IdType

    @classmethod
    def from_ids(cls, values: Any) -> IdVocabulary:
        ids = np.unique(id_array(values))
        return cls(ids=ids, id_type=id_type_of(ids))

    @property
    def size(self) -> int:
        """Rows of an embedding table over this vocabulary (the known ids plus OOV)."""
        return len(self.ids) + 1

    def index(self, values: Any) -> np.ndarray:
        """``(B,)`` int64 embedding rows of ids; :data:`OOV_INDEX` for ids not in the vocabulary
        (and for ids of the other type: a str never matches an Int64 vocabulary)."""
        ids = id_array(values)
        out = np.full(len(ids), OOV_INDEX, dtype=np.int64)
        if not len(ids) or not len(self.ids) or (ids.dtype == object) != (self.ids.dtype == object):
            return out
        at = np.minimum(np.searchsorted(self.ids, ids), len(self.ids) - 1)
        known = self.ids[at] == ids
        out[known] = at[known] + 1
        return out

    def to_json(self) -> dict[str, Any]:
        # Int64 ids as JSON numbers: Python's json keeps all 64 bits exactly.
        return {"id_type": self.id_type, "ids": self.ids.tolist()}

    @classmethod
    def from_json(cls, raw: Any, where: str) -> IdVocabulary:
        if not isinstance(raw, dict) or raw.get("id_type") not in ("int64", "string"):
            raise ConfigError(f"{where}: expected {{'id_type': 'int64'|'string', 'ids': [...]}}")
        values = raw.get("ids")
        if not isinstance(values, list):
            raise ConfigError(f"{where}: 'ids' must be a list")
        kind = int if raw["id_type"] == "int64" else str
        if any(isinstance(v, bool) or not isinstance(v, kind) for v in values):
            raise ConfigError(f"{where}: every id must be {raw['id_type']}")
        ids = (
            np.asarray(values, dtype=np.int64) if kind is int else np.asarray(values, dtype=object)
        )
        if len(ids) > 1 and not (ids[1:] > ids[:-1]).all():
            raise ConfigError(f"{where}: ids must be sorted and distinct")
        return cls(ids=ids, id_type=raw["id_type"])


@dataclass(frozen=True)
class Vocabulary:
    """The user and item vocabularies of one trained FM (and the VMs trained on it)."""

    users: IdVocabulary
    items: IdVocabulary

    @classmethod
    def from_log(cls, interactions: pd.DataFrame, min_count: int = 1) -> Vocabulary:
        """Every user and item of the training log seen at least ``min_count`` times."""
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        for column in (USER_ID, ITEM_ID):
            if column not in interactions.columns:
                raise ConfigError(f"the training log has no column {column!r}")

        def frequent(column: str) -> np.ndarray:
            ids, counts = np.unique(id_array(interactions[column]), return_counts=True)
            return ids[counts >= min_count]

        return cls(
            IdVocabulary.from_ids(frequent(USER_ID)), IdVocabulary.from_ids(frequent(ITEM_ID))
        )

    def strangers(self, users: Any, seen_users: Any) -> np.ndarray:
        """``(B,)`` bool: the ``users`` this vocabulary does not hold and who have no event in
        ``seen_users`` (the log window a round reads). For such a user the reference FM sees
        nothing but the shared OOV row and an empty history, a point its training rarely or
        never visited (measured on an outside log of 4,000 rows: compressed vectors about 30x
        the norm of every known user's), so a pair of theirs is left to the fallback tiers
        rather than stored as an exact embedding. A new user *with* events is no stranger: the
        FM reads their history."""
        return _unknown_and_unseen(self.users, users, seen_users)

    def stranger_pairs(
        self, users: Any, items: Any, seen_users: Any, seen_items: Any
    ) -> np.ndarray:
        """``(B,)`` bool: pairs of a stranger user (:meth:`strangers`) or of an item this
        vocabulary does not hold and that has no event in ``seen_items``: the FM reads only its
        OOV row for such an item, and the reference verifier scored 1,000 of them (a candidate
        table's unknown SKUs) three times higher than known items (median 0.11 against 0.035),
        so they took 596 of a round's 600 FM pairs. A new item *with* events in the window is
        kept."""
        return self.strangers(users, seen_users) | _unknown_and_unseen(
            self.items, items, seen_items
        )

    def save(self, models_dir: Path, fm_version: str) -> Path:
        """Write ``<fm_version>.vocabulary.json`` beside the card, atomically."""
        path = vocabulary_path(models_dir, fm_version)
        payload = {
            "format": FORMAT_VERSION,
            "fm_version": fm_version,
            "users": self.users.to_json(),
            "items": self.items.to_json(),
        }
        staging = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        staging.write_text(json.dumps(payload, ensure_ascii=False), encoding="utf-8")
        os.replace(staging, path)
        return path

    @classmethod
    def load(cls, models_dir: Path, fm_version: str) -> Vocabulary | None:
        """The vocabulary saved beside an FM card; None when the FM was trained without one
        (dense ids ``0..N-1`` index the tables directly)."""
        path = vocabulary_path(models_dir, fm_version)
        if not path.exists():
            return None
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"vocabulary {path} is unreadable: {exc}") from exc
        if not isinstance(raw, dict) or raw.get("format") != FORMAT_VERSION:
            raise ConfigError(f"vocabulary {path}: format must be {FORMAT_VERSION}")
        if raw.get("fm_version") != fm_version:
            raise ConfigError(
                f"vocabulary {path} belongs to FM {raw.get('fm_version')!r}, not {fm_version!r}"
            )
        return cls(
            IdVocabulary.from_json(raw.get("users"), f"{path} users"),
            IdVocabulary.from_json(raw.get("items"), f"{path} items"),
        )


def vocabulary_path(models_dir: Path, fm_version: str) -> Path:
    return Path(models_dir) / f"{fm_version}{VOCABULARY_SUFFIX}"


class VocabularyFeaturizer:
    """Model inputs for pairs of any ids (sparse Int64, String), through a vocabulary.

    The log's ids get this featurizer's own dense codes (one more code, with no history, stands
    for every id the log lacks), so histories are keyed by real ids; the model sees the
    vocabulary's rows (``schema.num_users == vocabulary.users.size``).

    Args:
        vocabulary: the FM's vocabulary.
        interactions: the log histories are read from (``user_id``, ``item_id``,
            ``event_timestamp``, the labels), ids of the vocabulary's types.
        label_columns: label columns; the first is the history label.
        users, items: optional attribute tables keyed by ``user_id`` / ``item_id``.
        history_len: events of history per pair.
    """

    def __init__(
        self,
        vocabulary: Vocabulary,
        interactions: pd.DataFrame,
        label_columns: tuple[str, ...],
        *,
        users: pd.DataFrame | None = None,
        items: pd.DataFrame | None = None,
        user_categorical: tuple[str, ...] = (),
        item_categorical: tuple[str, ...] = (),
        user_dense: tuple[str, ...] = (),
        item_dense: tuple[str, ...] = (),
        history_len: int | None = None,
    ) -> None:
        from solaris_feast.models.features import DEFAULT_HISTORY_LEN, PairFeaturizer

        self.vocabulary = vocabulary
        log_users, log_items = id_array(interactions[USER_ID]), id_array(interactions[ITEM_ID])
        self.codes = PairCodes.of([log_users], [log_items])
        self._unknown_user = len(self.codes.users)
        self._unknown_item = len(self.codes.items)

        def coded(frame: pd.DataFrame | None, key: str, columns: tuple[str, ...]) -> pd.DataFrame:
            if frame is None:
                return pd.DataFrame({key: np.zeros(0, dtype=np.int64)})
            known = (self.codes.has_users if key == USER_ID else self.codes.has_items)(frame[key])
            rows = frame.loc[known, [key, *columns]]
            to_code = self.codes.user_codes if key == USER_ID else self.codes.item_codes
            return rows.assign(**{key: to_code(rows[key])}).reset_index(drop=True)

        columns = [EVENT_TIMESTAMP, *label_columns]
        dataset = InteractionDataset(
            name="vocabulary-coded",
            interactions=interactions[columns].assign(
                **{
                    USER_ID: self.codes.user_codes(log_users),
                    ITEM_ID: self.codes.item_codes(log_items),
                }
            ),
            users=coded(users, USER_ID, (*user_categorical, *user_dense)),
            items=coded(items, ITEM_ID, (*item_categorical, *item_dense)),
            label_columns=label_columns,
            num_users=self._unknown_user + 1,
            num_items=self._unknown_item + 1,
            user_categorical=user_categorical,
            item_categorical=item_categorical,
            user_dense=user_dense,
            item_dense=item_dense,
        )
        self.featurizer = PairFeaturizer(
            dataset,
            history_len or DEFAULT_HISTORY_LEN,
            user_rows=np.r_[vocabulary.users.index(self.codes.users), OOV_INDEX],
            item_rows=np.r_[vocabulary.items.index(self.codes.items), OOV_INDEX],
            num_user_rows=vocabulary.users.size,
            num_item_rows=vocabulary.items.size,
        )

    @property
    def schema(self) -> Any:
        return self.featurizer.schema

    def batch(self, user_ids: Any, item_ids: Any, at: Any) -> PairBatch:
        """:meth:`PairFeaturizer.batch` for raw ids (any of the vocabulary's type)."""
        users, items = id_array(user_ids), id_array(item_ids)
        user_code = np.full(len(users), self._unknown_user, dtype=np.int64)
        known = self.codes.has_users(users)
        user_code[known] = self.codes.user_codes(users[known])
        item_code = np.full(len(items), self._unknown_item, dtype=np.int64)
        known = self.codes.has_items(items)
        item_code[known] = self.codes.item_codes(items[known])
        return self.featurizer.batch(user_code, item_code, at)

    def for_log(self, log: pd.DataFrame) -> PairBatch:
        """Inputs for every row of ``log``, each as of its own timestamp."""
        return self.batch(log[USER_ID], log[ITEM_ID], log[EVENT_TIMESTAMP])


def featurizer_for(
    vocabulary: Vocabulary | None, dataset: InteractionDataset, history_len: int
) -> PairFeaturizer | VocabularyFeaturizer:
    """The featurizer a bundle's models need over ``dataset``: through the FM's vocabulary when
    it has one (``ModelBundle.vocabulary``), else the plain one (ids are the table rows)."""
    from solaris_feast.models.features import PairFeaturizer

    if vocabulary is None:
        return PairFeaturizer(dataset, history_len)
    return VocabularyFeaturizer(
        vocabulary,
        dataset.interactions,
        dataset.label_columns,
        users=dataset.users,
        items=dataset.items,
        user_categorical=dataset.user_categorical,
        item_categorical=dataset.item_categorical,
        user_dense=dataset.user_dense,
        item_dense=dataset.item_dense,
        history_len=history_len,
    )


def _unknown_and_unseen(vocabulary: IdVocabulary, values: Any, seen_values: Any) -> np.ndarray:
    """``(B,)`` bool: ``values`` not in ``vocabulary`` and not among ``seen_values``."""
    ids = id_array(values)
    unknown = vocabulary.index(ids) == OOV_INDEX
    if not unknown.any():
        return unknown
    seen = np.unique(id_array(seen_values))
    if (ids.dtype == object) != (seen.dtype == object):
        return unknown
    return unknown & ~np.isin(ids, seen)
