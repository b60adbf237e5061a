"""Model inputs for user-item pairs, as of a point in time.

One featurizer serves training (each logged impression, as of its own timestamp), evaluation and
precompute (candidate pairs that have not been shown yet, as of the planning time). The user's
history is always cut strictly before ``at``: a pair never sees its own label or anything later.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
import pandas as pd
import torch

from solaris_feast.data.schema import (
    EVENT_TIMESTAMP,
    ITEM_ID,
    USER_ID,
    InteractionDataset,
    as_utc,
)
from solaris_feast.errors import ConfigError

DEFAULT_HISTORY_LEN = 32
_TS_BITS = 32


@dataclass(frozen=True)
class PairBatch:
    """Inputs for B user-item pairs.

    Attributes:
        user_id: ``(B,)`` int64.
        item_id: ``(B,)`` int64.
        user_cat: ``(B, Cu)`` int64 categorical user attributes.
        user_dense: ``(B, Du)`` float32.
        item_cat: ``(B, Ci)`` int64.
        item_dense: ``(B, Di)`` float32.
        hist_item: ``(B, N)`` int64, most recent first; 0 where ``hist_mask`` is False.
        hist_item_cat: ``(B, N, Ci)`` int64 categorical attributes of the history items.
        hist_label: ``(B, N)`` int64 main-task label of each history event.
        hist_age: ``(B, N)`` float32, ``log1p(hours before at)``.
        hist_mask: ``(B, N)`` bool, True where a history event exists.
    """

    user_id: torch.Tensor
    item_id: torch.Tensor
    user_cat: torch.Tensor
    user_dense: torch.Tensor
    item_cat: torch.Tensor
    item_dense: torch.Tensor
    hist_item: torch.Tensor
    hist_item_cat: torch.Tensor
    hist_label: torch.Tensor
    hist_age: torch.Tensor
    hist_mask: torch.Tensor

    def __len__(self) -> int:
        return int(self.user_id.shape[0])

    def select(self, index: torch.Tensor | slice) -> PairBatch:
        """Rows ``index`` of every field."""
        return PairBatch(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def to(self, device: torch.device | str) -> PairBatch:
        return PairBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


@dataclass(frozen=True)
class FeatureSchema:
    """Sizes the models need to build their embedding tables; stored in the FM's model card."""

    num_users: int
    num_items: int
    user_cardinalities: tuple[int, ...]
    item_cardinalities: tuple[int, ...]
    user_dense_dim: int
    item_dense_dim: int
    history_len: int

    def to_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, raw: dict[str, object]) -> FeatureSchema:
        def ints(value: object) -> tuple[int, ...]:
            if not isinstance(value, list | tuple):
                raise TypeError(f"expected a list of ints, got {value!r}")
            return tuple(int(v) for v in value)

        def num(value: object) -> int:
            if not isinstance(value, int | float | str):
                raise TypeError(f"expected an int, got {value!r}")
            return int(value)

        return cls(
            num_users=num(raw["num_users"]),
            num_items=num(raw["num_items"]),
            user_cardinalities=ints(raw["user_cardinalities"]),
            item_cardinalities=ints(raw["item_cardinalities"]),
            user_dense_dim=num(raw["user_dense_dim"]),
            item_dense_dim=num(raw["item_dense_dim"]),
            history_len=num(raw["history_len"]),
        )


class PairFeaturizer:
    """Builds :class:`PairBatch` inputs for any ``(user, item, at)`` from an interaction log.

    The log is indexed once by ``(user, time)``; a lookup is a vectorized ``searchsorted``, so
    featurizing a million candidate pairs costs no Python loop.
    """

    def __init__(
        self,
        dataset: InteractionDataset,
        history_len: int = DEFAULT_HISTORY_LEN,
        *,
        user_rows: np.ndarray | None = None,
        item_rows: np.ndarray | None = None,
        num_user_rows: int | None = None,
        num_item_rows: int | None = None,
    ) -> None:
        if history_len <= 0:
            raise ValueError(f"history_len must be positive, got {history_len}")
        if not dataset.dense_ids:
            raise ConfigError(
                f"log {dataset.name!r} has sparse or String ids: featurize it through the "
                "FM's vocabulary (models.vocabulary.featurizer_for)"
            )
        # Embedding row of each dataset id (an id vocabulary's rows, see models/vocabulary.py);
        # by default the id itself. Histories and attributes stay keyed by the dataset's ids.
        self._user_rows = None if user_rows is None else np.asarray(user_rows, dtype=np.int64)
        self._item_rows = None if item_rows is None else np.asarray(item_rows, dtype=np.int64)
        self._num_user_rows = num_user_rows or dataset.num_users
        self._num_item_rows = num_item_rows or dataset.num_items
        self.dataset = dataset
        self.history_len = history_len
        log = dataset.interactions
        seconds = _to_seconds(log[EVENT_TIMESTAMP])
        self._base_s = int(seconds.min()) - 1 if len(seconds) else 0
        users = log[USER_ID].to_numpy(np.int64)
        keys = (users << _TS_BITS) | _clip_ts(seconds - self._base_s)
        order = np.argsort(keys, kind="stable")
        self._keys = keys[order]
        self._items = log[ITEM_ID].to_numpy(np.int64)[order]
        self._labels = log[dataset.label_columns[0]].to_numpy(np.int64)[order]
        self._seconds = seconds[order]
        self._user_cat = _table(
            dataset.users, USER_ID, dataset.num_users, dataset.user_categorical, np.int64
        )
        self._user_dense = _table(
            dataset.users, USER_ID, dataset.num_users, dataset.user_dense, np.float32
        )
        self._item_cat = _table(
            dataset.items, ITEM_ID, dataset.num_items, dataset.item_categorical, np.int64
        )
        self._item_dense = _table(
            dataset.items, ITEM_ID, dataset.num_items, dataset.item_dense, np.float32
        )

    @property
    def schema(self) -> FeatureSchema:
        ds = self.dataset
        return FeatureSchema(
            num_users=self._num_user_rows,
            num_items=self._num_item_rows,
            user_cardinalities=tuple(ds.cardinality("users", c) for c in ds.user_categorical),
            item_cardinalities=tuple(ds.cardinality("items", c) for c in ds.item_categorical),
            user_dense_dim=len(ds.user_dense),
            item_dense_dim=len(ds.item_dense),
            history_len=self.history_len,
        )

    def batch(
        self,
        user_ids: np.ndarray,
        item_ids: np.ndarray,
        at: np.ndarray | pd.Series | pd.Timestamp,
    ) -> PairBatch:
        """Inputs for pairs ``(user_ids[b], item_ids[b])`` as of ``at`` (one time, or one each)."""
        users = np.asarray(user_ids, dtype=np.int64)
        items = np.asarray(item_ids, dtype=np.int64)
        if users.shape != items.shape or users.ndim != 1:
            raise ValueError(f"user_ids {users.shape} and item_ids {items.shape} must be equal 1-D")
        for name, ids, bound in (
            ("user_ids", users, self.dataset.num_users),
            ("item_ids", items, self.dataset.num_items),
        ):
            if len(ids) and (ids.min() < 0 or ids.max() >= bound):
                raise ValueError(f"{name} must lie in 0..{bound - 1}")
        if isinstance(at, pd.Timestamp):
            at_s = np.full(len(users), _timestamp_seconds(at), dtype=np.int64)
        else:
            at_s = _to_seconds(pd.Series(at))
            if len(at_s) != len(users):
                raise ValueError(f"at has {len(at_s)} times for {len(users)} pairs")
        rel = _clip_ts(at_s - self._base_s)
        end = np.searchsorted(self._keys, (users << _TS_BITS) | rel, side="left")
        start = np.searchsorted(self._keys, users << _TS_BITS, side="left")
        n = self.history_len
        steps = np.arange(n)
        idx = end[:, None] - 1 - steps[None, :]
        mask = steps[None, :] < (end - start)[:, None]
        idx = np.where(mask, idx, 0)
        hist_item = np.where(mask, self._items[idx], 0) if len(self._items) else np.zeros_like(idx)
        hist_label = (
            np.where(mask, self._labels[idx], 0) if len(self._labels) else np.zeros_like(idx)
        )
        hours = (
            (at_s[:, None] - self._seconds[idx]) / 3600.0
            if len(self._seconds)
            else np.zeros(idx.shape)
        )
        hist_age = np.where(mask, np.log1p(np.maximum(hours, 0.0)), 0.0).astype(np.float32)
        hist_item_cat = self._item_cat[hist_item]
        if self._item_rows is not None:
            hist_item = np.where(mask, self._item_rows[hist_item], 0)
        return PairBatch(
            user_id=torch.from_numpy(users if self._user_rows is None else self._user_rows[users]),
            item_id=torch.from_numpy(items if self._item_rows is None else self._item_rows[items]),
            user_cat=torch.from_numpy(self._user_cat[users]),
            user_dense=torch.from_numpy(self._user_dense[users]),
            item_cat=torch.from_numpy(self._item_cat[items]),
            item_dense=torch.from_numpy(self._item_dense[items]),
            hist_item=torch.from_numpy(np.ascontiguousarray(hist_item)),
            hist_item_cat=torch.from_numpy(hist_item_cat),
            hist_label=torch.from_numpy(np.ascontiguousarray(hist_label)),
            hist_age=torch.from_numpy(hist_age),
            hist_mask=torch.from_numpy(mask),
        )

    def for_log(self, log: pd.DataFrame) -> PairBatch:
        """Inputs for every row of ``log``, each as of its own timestamp."""
        return self.batch(
            log[USER_ID].to_numpy(np.int64), log[ITEM_ID].to_numpy(np.int64), log[EVENT_TIMESTAMP]
        )


def labels_of(log: pd.DataFrame, label_columns: tuple[str, ...]) -> torch.Tensor:
    """``(B, T)`` float32 label matrix of ``log``."""
    return torch.from_numpy(log[list(label_columns)].to_numpy(np.float32))


def _to_seconds(ts: pd.Series) -> np.ndarray:
    # In nanoseconds whatever unit the column has (pandas 2 keeps a Timestamp's own unit: s, us).
    values = pd.to_datetime(ts, utc=True).dt.as_unit("ns")
    return (values.astype("int64").to_numpy() // 1_000_000_000).astype(np.int64)


def _timestamp_seconds(ts: pd.Timestamp) -> int:
    return int(as_utc(ts).value // 1_000_000_000)


def _clip_ts(rel: np.ndarray) -> np.ndarray:
    return np.clip(rel, 0, (1 << _TS_BITS) - 1).astype(np.int64)


def _table(
    frame: pd.DataFrame, key: str, size: int, columns: tuple[str, ...], dtype: type[np.generic]
) -> np.ndarray:
    """Dense ``(size, len(columns))`` lookup table by id; ids absent from ``frame`` get zeros."""
    out = np.zeros((size, len(columns)), dtype=dtype)
    if columns:
        ids = frame[key].to_numpy(np.int64)
        out[ids] = frame[list(columns)].to_numpy(dtype)
    return out


HISTORY_FEATURES = (
    "user_like_share_last_5",
    "user_like_share_last_32",
    "user_log_count",
    "user_log_hours_since_last",
    "user_category_like_share_last_8",
    "user_category_log_count",
)
"""Streaming history features a production VM has, in :meth:`StreamingHistory.features` order.

Shares are of main-task positives among the last k events (0.5 shrinkage toward the user's prior
of one half-like, so one event does not read as certainty); counts and recency are ``log1p``."""


class StreamingHistory:
    """Point-in-time engagement counters over a log: what a streaming feature store serves.

    For a pair ``(u, i)`` at time ``t`` it reads only events of ``u`` strictly before ``t``: the
    share of main-task positives among the user's last 5 and 32 events, the user's event count,
    hours since the user's last event, and the same share and count over the user's events in
    ``i``'s first categorical attribute (the category). Prefix sums over ``(key, time)`` order
    and one ``searchsorted`` per pair, so a million pairs cost no Python loop.
    """

    def __init__(self, dataset: InteractionDataset) -> None:
        log = dataset.interactions
        self._category = (
            dataset.items.set_index(ITEM_ID)[dataset.item_categorical[0]]
            .reindex(np.arange(dataset.num_items), fill_value=0)
            .to_numpy(np.int64)
            if dataset.item_categorical
            else np.zeros(dataset.num_items, dtype=np.int64)
        )
        self._num_categories = int(self._category.max()) + 1 if len(self._category) else 1
        seconds = _to_seconds(log[EVENT_TIMESTAMP])
        self._base_s = int(seconds.min()) - 1 if len(seconds) else 0
        rel = _clip_ts(seconds - self._base_s)
        users = log[USER_ID].to_numpy(np.int64)
        labels = log[dataset.label_columns[0]].to_numpy(np.float64)
        cats = self._category[log[ITEM_ID].to_numpy(np.int64)]
        self._user = _PrefixIndex(users, rel, labels)
        self._user_cat = _PrefixIndex(users * self._num_categories + cats, rel, labels)

    def features(
        self, user_ids: np.ndarray, item_ids: np.ndarray, at: np.ndarray | pd.Series
    ) -> torch.Tensor:
        """``(B, len(HISTORY_FEATURES))`` float32 for pairs as of ``at`` (one time each)."""
        users = np.asarray(user_ids, dtype=np.int64)
        items = np.asarray(item_ids, dtype=np.int64)
        at_rel = _clip_ts(_to_seconds(pd.Series(at)) - self._base_s)
        if len(at_rel) != len(users):
            raise ValueError(f"at has {len(at_rel)} times for {len(users)} pairs")
        cat_keys = users * self._num_categories + self._category[items]
        u_end, u_start = self._user.span(users, at_rel)
        c_end, c_start = self._user_cat.span(cat_keys, at_rel)
        last_s = self._user.last_time(u_end, u_start)
        hours = np.where(u_end > u_start, (at_rel - last_s) / 3600.0, 24.0 * 30)
        out = np.stack(
            [
                self._user.recent_share(u_end, u_start, 5),
                self._user.recent_share(u_end, u_start, 32),
                np.log1p(u_end - u_start),
                np.log1p(np.maximum(hours, 0.0)),
                self._user_cat.recent_share(c_end, c_start, 8),
                np.log1p(c_end - c_start),
            ],
            axis=1,
        )
        return torch.from_numpy(out.astype(np.float32))

    def for_log(self, log: pd.DataFrame) -> torch.Tensor:
        """Features of every row of ``log``, each as of its own timestamp."""
        return self.features(
            log[USER_ID].to_numpy(np.int64), log[ITEM_ID].to_numpy(np.int64), log[EVENT_TIMESTAMP]
        )


class _PrefixIndex:
    """Events sorted by ``(key, time)`` with a prefix sum of their labels."""

    def __init__(self, keys: np.ndarray, rel_seconds: np.ndarray, labels: np.ndarray) -> None:
        if len(keys) and int(keys.max()) >= 1 << (63 - _TS_BITS):
            raise ValueError("history keys too large to pack beside a 32-bit time")
        packed = (keys << _TS_BITS) | rel_seconds
        order = np.argsort(packed, kind="stable")
        self._packed = packed[order]
        self._seconds = rel_seconds[order]
        self._cum = np.r_[0.0, np.cumsum(labels[order])]

    def span(self, keys: np.ndarray, at_rel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per query, ``[start, end)`` of the key's events strictly before ``at``."""
        end = np.searchsorted(self._packed, (keys << _TS_BITS) | at_rel, side="left")
        start = np.searchsorted(self._packed, keys << _TS_BITS, side="left")
        return end, start

    def recent_share(self, end: np.ndarray, start: np.ndarray, k: int) -> np.ndarray:
        n = np.minimum(end - start, k)
        likes = self._cum[end] - self._cum[end - n]
        return (likes + 0.5) / (n + 1.0)

    def last_time(self, end: np.ndarray, start: np.ndarray) -> np.ndarray:
        if not len(self._seconds):
            return np.zeros(len(end))
        return np.where(end > start, self._seconds[np.maximum(end - 1, 0)], 0).astype(np.float64)


def with_history(batch: PairBatch, history: torch.Tensor) -> PairBatch:
    """``batch`` with ``history`` ``(B, F)`` appended to its dense user inputs: how a VM built
    on :func:`schema_with_history` reads streaming features without a slot of its own."""
    if history.shape[0] != len(batch):
        raise ValueError(f"history has {history.shape[0]} rows for a batch of {len(batch)}")
    return replace(batch, user_dense=torch.cat([batch.user_dense, history], dim=1))


def schema_with_history(
    schema: FeatureSchema, num_features: int = len(HISTORY_FEATURES)
) -> FeatureSchema:
    """``schema`` with room for ``num_features`` more dense user inputs."""
    return replace(schema, user_dense_dim=schema.user_dense_dim + num_features)
