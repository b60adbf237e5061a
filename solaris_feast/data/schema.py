"""The one schema every interaction log follows, and the time split.

An interaction log has ``user_id``, ``item_id``, ``event_timestamp`` (UTC) and one or more binary
label columns. Ids are dense int64 ``0..N-1`` (the built-in data sets, whose ids index the reference
models' tables directly) or, with ``dense_ids=False``, the ids of the user's own systems: sparse
int64 up to 2**63-1 or strings, which the reference models map through a vocabulary
(:mod:`solaris_feast.models.vocabulary`). User and item attribute tables are keyed by ``user_id`` /
``item_id`` and carry categorical columns (small non-negative ints) and dense columns (floats).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from solaris_feast.columns import EVENT_TIMESTAMP, ITEM_ID, USER_ID
from solaris_feast.errors import SchemaError
from solaris_feast.store.ids import check_ids, id_type_of


@dataclass(frozen=True)
class InteractionDataset:
    """An interaction log with its user and item attribute tables.

    Attributes:
        name: Short name used in reports (``synthetic``, ``movielens``).
        interactions: One row per impression, sorted by ``event_timestamp``.
        users: ``user_id`` plus the columns named in ``user_categorical`` / ``user_dense``.
        items: ``item_id`` plus the columns named in ``item_categorical`` / ``item_dense``.
        label_columns: Binary label columns of ``interactions``; the first is the main task.
        user_categorical: Categorical user attributes, each coded ``0..cardinality-1``.
        item_categorical: Categorical item attributes, each coded ``0..cardinality-1``.
        user_dense: Float user attributes.
        item_dense: Float item attributes (for instance multi-hot genres).
        num_users: ``user_id`` values lie in ``0..num_users-1`` (with ``dense_ids=False``: the
            number of distinct users, for reports only).
        num_items: ``item_id`` values lie in ``0..num_items-1`` (likewise).
        dense_ids: ids are dense ``0..N-1``; False: any Int64 or String ids (a vocabulary maps
            them for the reference models).
    """

    name: str
    interactions: pd.DataFrame
    users: pd.DataFrame
    items: pd.DataFrame
    label_columns: tuple[str, ...]
    num_users: int
    num_items: int
    user_categorical: tuple[str, ...] = ()
    item_categorical: tuple[str, ...] = ()
    user_dense: tuple[str, ...] = ()
    item_dense: tuple[str, ...] = ()
    metadata: dict[str, object] = field(default_factory=dict)
    dense_ids: bool = True

    def __post_init__(self) -> None:
        validate_interactions(self.interactions, self.label_columns, self.dense_ids)
        _validate_attributes("users", self.users, USER_ID, self.user_categorical, self.user_dense)
        _validate_attributes("items", self.items, ITEM_ID, self.item_categorical, self.item_dense)
        if not self.dense_ids:
            return
        for table, column, bound in (
            ("interactions", USER_ID, self.num_users),
            ("interactions", ITEM_ID, self.num_items),
        ):
            values = self.interactions[column].to_numpy()
            if len(values) and (values.min() < 0 or values.max() >= bound):
                raise SchemaError(table, column, f"has ids outside 0..{bound - 1}")

    def cardinality(self, table: str, column: str) -> int:
        """Number of codes of a categorical attribute (max code + 1)."""
        frame = self.users if table == "users" else self.items
        return int(frame[column].max()) + 1 if len(frame) else 1

    def with_interactions(self, interactions: pd.DataFrame) -> InteractionDataset:
        """The same data set over another slice of its log (attribute tables are shared)."""
        return InteractionDataset(
            name=self.name,
            interactions=interactions,
            users=self.users,
            items=self.items,
            label_columns=self.label_columns,
            num_users=self.num_users,
            num_items=self.num_items,
            user_categorical=self.user_categorical,
            item_categorical=self.item_categorical,
            user_dense=self.user_dense,
            item_dense=self.item_dense,
            metadata=self.metadata,
            dense_ids=self.dense_ids,
        )


def with_dense_codes(dataset: InteractionDataset) -> InteractionDataset:
    """The same log with its users and items numbered ``0..N-1`` in order of first appearance
    (attribute rows of ids the log never names are dropped): for code that indexes the models'
    tables by id directly, such as the replay's own models. A dense data set comes back as is."""
    if dataset.dense_ids:
        return dataset
    interactions = dataset.interactions.copy()
    tables, sizes = {}, {}
    for column, table in ((USER_ID, dataset.users), (ITEM_ID, dataset.items)):
        codes, ids = pd.factorize(interactions[column])
        interactions[column] = codes.astype("int64")
        index = pd.Index(ids)
        kept = table.loc[table[column].isin(index)].copy()
        kept[column] = index.get_indexer(kept[column]).astype("int64")
        tables[column] = kept.reset_index(drop=True)
        sizes[column] = max(len(ids), 1)
    return dataclasses.replace(
        dataset,
        interactions=interactions,
        users=tables[USER_ID],
        items=tables[ITEM_ID],
        num_users=sizes[USER_ID],
        num_items=sizes[ITEM_ID],
        dense_ids=True,
    )


def as_utc(ts: object, what: str = "timestamp") -> pd.Timestamp:
    """``ts`` as a UTC :class:`pandas.Timestamp`.

    Raises:
        ValueError: ``ts`` is naive (its zone is unknown, so any instant read from it could be
            hours off) or not a time at all; ``what`` names it in the message.
    """
    try:
        stamp = pd.Timestamp(ts)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be a timezone-aware (UTC) time, got {ts!r}") from exc
    if stamp is pd.NaT:
        raise ValueError(f"{what} must be a timezone-aware (UTC) time, got NaT")
    if stamp.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware (UTC), got naive {stamp}")
    return stamp.tz_convert("UTC")


def validate_interactions(
    frame: pd.DataFrame, label_columns: tuple[str, ...], dense_ids: bool = True
) -> None:
    """Raise :class:`SchemaError` naming the first column that breaks the schema.

    With ``dense_ids`` the id columns must be integers; otherwise Int64 or String ids
    (:func:`solaris_feast.store.ids.check_ids`, the one check of a column of ids).
    """
    table = "interactions"
    if not label_columns:
        raise SchemaError(table, "<labels>", "is empty: at least one binary label is required")
    for column in (USER_ID, ITEM_ID, EVENT_TIMESTAMP, *label_columns):
        if column not in frame.columns:
            raise SchemaError(table, column, f"is missing (columns present: {list(frame.columns)})")
    for column in (USER_ID, ITEM_ID):
        missing = np.flatnonzero(frame[column].isna().to_numpy())
        if len(missing):
            raise SchemaError(
                table,
                column,
                f"has {len(missing)} missing ids (rows {missing[:5].tolist()}"
                f"{', ...' if len(missing) > 5 else ''}): every row needs a user and an item",
            )
        if dense_ids and not pd.api.types.is_integer_dtype(frame[column]):
            raise SchemaError(table, column, f"must be an integer type, got {frame[column].dtype}")
        if not dense_ids:
            _check_raw_ids(frame[column], table, column)
    ts = frame[EVENT_TIMESTAMP]
    if not isinstance(ts.dtype, pd.DatetimeTZDtype) or str(ts.dt.tz) != "UTC":
        raise SchemaError(
            table, EVENT_TIMESTAMP, f"must be a UTC datetime (datetime64[ns, UTC]), got {ts.dtype}"
        )
    if ts.isna().any():
        raise SchemaError(table, EVENT_TIMESTAMP, f"has {int(ts.isna().sum())} missing timestamps")
    for column in label_columns:
        values = frame[column]
        if values.isna().any():
            raise SchemaError(table, column, f"has {int(values.isna().sum())} NaN labels")
        other = np.flatnonzero(~np.isin(values.to_numpy(), (0, 1)))
        if len(other):
            seen = sorted(pd.unique(values.iloc[other]).tolist())
            raise SchemaError(
                table,
                column,
                f"must hold binary labels (0 or 1): {len(other)} of {len(values)} rows hold "
                f"{seen[:5]}{' ...' if len(seen) > 5 else ''}; map them to 0/1 first",
            )


def _check_raw_ids(values: pd.Series, table: str, column: str) -> None:
    try:
        check_ids(values, id_type_of(values), column)
    except (TypeError, ValueError) as exc:
        raise SchemaError(table, column, f"must hold Int64 or String ids: {exc}") from exc


def _validate_attributes(
    table: str,
    frame: pd.DataFrame,
    key: str,
    categorical: tuple[str, ...],
    dense: tuple[str, ...],
) -> None:
    for column in (key, *categorical, *dense):
        if column not in frame.columns:
            raise SchemaError(table, column, "is missing")
    if frame[key].duplicated().any():
        raise SchemaError(table, key, "has duplicate ids")
    for column in categorical:
        values = frame[column]
        if not pd.api.types.is_integer_dtype(values) or (len(values) and values.min() < 0):
            raise SchemaError(table, column, "must hold non-negative integer codes")
    for column in dense:
        if not np.isfinite(frame[column].to_numpy(dtype=np.float64)).all():
            raise SchemaError(table, column, "has NaN or infinite values")


def time_split(
    dataset: InteractionDataset, train_fraction: float = 0.8
) -> tuple[InteractionDataset, InteractionDataset]:
    """Split by time: the earlier ``train_fraction`` of the time span trains, the rest evaluates.

    Every training event is strictly earlier than every evaluation event, so nothing from the
    evaluation period can leak into training. Features of evaluation rows may still read the
    user's history from the whole log, cut strictly before each row's own timestamp: that is what
    serving would see.
    """
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must lie in (0, 1), got {train_fraction}")
    log = dataset.interactions
    ts = log[EVENT_TIMESTAMP]
    cut = ts.min() + (ts.max() - ts.min()) * train_fraction
    train = log[ts < cut]
    test = log[ts >= cut]
    if train.empty or test.empty:
        raise ValueError(
            f"time split at {cut} leaves an empty side ({len(train)}/{len(test)} rows)"
        )
    return dataset.with_interactions(train), dataset.with_interactions(test)


def earliest_rows(log: pd.DataFrame, fraction: float) -> np.ndarray:
    """Mask of the rows in the earliest ``fraction`` of ``log``'s time span (all when >= 1)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
    if fraction >= 1.0 or log.empty:
        return np.ones(len(log), dtype=bool)
    ts = log[EVENT_TIMESTAMP]
    cut = ts.min() + (ts.max() - ts.min()) * fraction
    return (ts < cut).to_numpy()
