"""One int64 key per ``(user, item)`` pair, for sorting, joining and ``np.isin`` on pairs.

``key = user << 31 | item``: keys keep the ``(user, item)`` order and unpack exactly while item ids
stay below 2**31 and user ids below 2**32; ids outside raise rather than collide. Candidates, the
plan, the aggregate, the similarity fill and the replay all key pairs through here. Ids as real
systems have them (sparse int64 up to 2**63-1, strings) are first mapped to dense codes for the
round (:class:`PairCodes`: sorted distinct ids, so code order is id order) and back after.
(How Feast keys pairs in the online store is another layout: ``store/layout.py``.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

ITEM_BITS = 31
"""Low bits of a pair key that hold the item id."""
_ITEM_MASK = (1 << ITEM_BITS) - 1


def pair_keys(users: np.ndarray, items: np.ndarray) -> np.ndarray:
    """``(N,)`` int64 keys of N pairs, ordered as ``(user, item)``.

    Raises:
        ValueError: an id is negative or an item id does not fit the key's low bits (the key
            would collide with another pair's).
    """
    u = np.asarray(users, dtype=np.int64)
    i = np.asarray(items, dtype=np.int64)
    if len(i) and (int(i.min()) < 0 or int(i.max()) > _ITEM_MASK):
        raise ValueError(f"item ids must lie in [0, 2**{ITEM_BITS}) to be packed in a pair key")
    if len(u) and (int(u.min()) < 0 or int(u.max()) >= 1 << (63 - ITEM_BITS)):
        raise ValueError(
            f"user ids must lie in [0, 2**{63 - ITEM_BITS}) to be packed in a pair key"
        )
    return (u << ITEM_BITS) | i


def split_pair_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(users, items)`` of keys made by :func:`pair_keys`."""
    k = np.asarray(keys, dtype=np.int64)
    return k >> ITEM_BITS, k & _ITEM_MASK


def id_array(values: Any) -> np.ndarray:
    """``(N,)`` int64 for integer ids, ``(N,)`` object of str for String ids.

    Sparse int64 ids (up to 2**63-1) and strings do not fit a pair key; map them to dense codes
    first (:class:`PairCodes`).
    """
    array = np.asarray(values.to_numpy() if hasattr(values, "to_numpy") else values)
    if array.dtype.kind in "iu" or array.size == 0:
        return array.astype(np.int64)
    if array.dtype.kind == "U":
        return array.astype(object)
    if array.dtype == object:
        items = array.tolist()
        if all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in items):
            return array.astype(np.int64)
        if all(isinstance(v, str) for v in items):
            return array
    raise TypeError(f"ids must be integers or strings, got dtype {array.dtype}")


def stable_id_hash(ids: Any) -> np.ndarray:
    """``(N,)`` int64 that every process and language agrees on: Int64 ids as they are; a String
    id as the first 8 bytes of its utf-8 blake2b digest, little-endian, top bit cleared.

    What an exported model is given for a String id, and what users are sharded by."""
    import hashlib

    array = id_array(ids)
    if array.dtype != object:
        return array.astype(np.int64)
    out = np.empty(len(array), dtype=np.int64)
    for k, value in enumerate(array.tolist()):
        digest = hashlib.blake2b(value.encode("utf-8"), digest_size=8).digest()
        out[k] = int.from_bytes(digest, "little") & (2**63 - 1)
    return out


@dataclass(frozen=True)
class PairCodes:
    """Dense int64 codes for the users and items of one round, so any ids pack in a pair key.

    The codes are positions in the sorted distinct ids (``np.unique``), so sorting by code sorts
    by id (ints numerically, strings lexicographically) and ties broken by code are broken by id.
    With ``identity`` (ids that already fit a pair key, see :meth:`for_round`) the codes are the
    ids themselves and nothing is looked up: the dense ids of the built-in data sets cost nothing.

    Attributes:
        users: ``(U,)`` sorted distinct user ids (int64 or object of str); empty for identity.
        items: ``(I,)`` sorted distinct item ids; empty for identity.
        identity: codes are the ids.
    """

    users: np.ndarray
    items: np.ndarray
    identity: bool = False

    @classmethod
    def of(cls, users: Sequence[Any], items: Sequence[Any]) -> PairCodes:
        """Dense codes covering every id in ``users`` and ``items`` (lists of id arrays)."""
        return cls(_distinct(users), _distinct(items))

    @classmethod
    def for_round(cls, users: Sequence[Any], items: Sequence[Any]) -> PairCodes:
        """:meth:`of`, or identity codes when every id already fits a pair key."""
        user_parts, item_parts = [id_array(u) for u in users], [id_array(i) for i in items]
        if all(fits_pair_keys(u, _EMPTY) for u in user_parts) and all(
            fits_pair_keys(_EMPTY, i) for i in item_parts
        ):
            return cls(_EMPTY, _EMPTY, identity=True)
        return cls(_distinct(user_parts), _distinct(item_parts))

    def user_codes(self, users: Any) -> np.ndarray:
        if self.identity:
            return id_array(users)
        return _codes(self.users, id_array(users), "user")

    def item_codes(self, items: Any) -> np.ndarray:
        if self.identity:
            return id_array(items)
        return _codes(self.items, id_array(items), "item")

    def contains(self, users: Any, items: Any) -> np.ndarray:
        """``(N,)`` bool: both ids of the pair have a code (ids of another type have none)."""
        return self.has_users(users) & self.has_items(items)

    def has_users(self, users: Any) -> np.ndarray:
        """``(N,)`` bool: the user id has a code."""
        ids = id_array(users)
        if self.identity:
            return _fits(ids, 1 << (63 - ITEM_BITS))
        return _found(self.users, ids)

    def has_items(self, items: Any) -> np.ndarray:
        """``(N,)`` bool: the item id has a code."""
        ids = id_array(items)
        if self.identity:
            return _fits(ids, _ITEM_MASK + 1)
        return _found(self.items, ids)

    def keys(self, users: Any, items: Any) -> np.ndarray:
        """``(N,)`` int64 pair keys of ids (every id must be among the codes)."""
        return pair_keys(self.user_codes(users), self.item_codes(items))

    def user_ids(self, codes: np.ndarray) -> np.ndarray:
        """The user ids of codes."""
        return np.asarray(codes) if self.identity else self.users[codes]

    def item_ids(self, codes: np.ndarray) -> np.ndarray:
        """The item ids of codes."""
        return np.asarray(codes) if self.identity else self.items[codes]

    def split(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(users, items)`` ids of keys made by :meth:`keys`."""
        u, i = split_pair_keys(keys)
        return self.user_ids(u), self.item_ids(i)


_EMPTY = np.zeros(0, dtype=np.int64)


def _fits(ids: np.ndarray, bound: int) -> np.ndarray:
    if ids.dtype == object:
        return np.zeros(len(ids), dtype=bool)
    return (ids >= 0) & (ids < bound)


def fits_pair_keys(users: np.ndarray, items: np.ndarray) -> bool:
    """Whether ids pack in :func:`pair_keys` as they are (dense enough int64 ids)."""
    if users.dtype == object or items.dtype == object:
        return False
    return (not len(items) or (int(items.min()) >= 0 and int(items.max()) <= _ITEM_MASK)) and (
        not len(users) or (int(users.min()) >= 0 and int(users.max()) < 1 << (63 - ITEM_BITS))
    )


def checked_id_column(table: str, frame: Any, column: str) -> np.ndarray:
    """``(N,)`` int64 (non-negative) or object of non-empty str ids of one frame column.

    Raises:
        SchemaError: naming the table and column, for negative ids or another type.
    """
    from solaris_feast.errors import SchemaError

    values = frame[column]
    missing = np.flatnonzero(values.isna().to_numpy())
    if len(missing):
        raise SchemaError(
            table, column, f"has {len(missing)} missing ids (rows {missing[:5].tolist()})"
        )
    if values.dtype.kind in "iu":
        if len(values) and values.min() < 0:
            raise SchemaError(table, column, "has negative ids")
        return np.asarray(values.to_numpy(dtype=np.int64))
    if values.dtype == object and all(isinstance(v, str) and v for v in values.tolist()):
        return np.asarray(values.to_numpy(dtype=object))
    raise SchemaError(
        table, column, f"must hold integer or non-empty string ids, got {values.dtype}"
    )


def dense_pair_keys(users: Any, items: Any) -> np.ndarray:
    """Pair keys of ids of any type, valid within this call only (for sorting and grouping)."""
    u, i = id_array(users), id_array(items)
    if fits_pair_keys(u, i):
        return pair_keys(u, i)
    # The inverse of the sort gives the codes directly, without a search per id.
    return pair_keys(np.unique(u, return_inverse=True)[1], np.unique(i, return_inverse=True)[1])


def _distinct(arrays: Sequence[np.ndarray]) -> np.ndarray:
    parts = [id_array(a) for a in arrays]
    parts = [p for p in parts if len(p)] or [np.zeros(0, dtype=np.int64)]
    kinds = {p.dtype == object for p in parts}
    if len(kinds) > 1:
        raise TypeError("ids of one side mix integers and strings")
    return np.unique(np.concatenate(parts))


def _found(distinct: np.ndarray, ids: np.ndarray) -> np.ndarray:
    if not len(ids) or not len(distinct) or (ids.dtype == object) != (distinct.dtype == object):
        return np.zeros(len(ids), dtype=bool)
    at = np.searchsorted(distinct, ids)
    inside = at < len(distinct)
    found = np.zeros(len(ids), dtype=bool)
    found[inside] = distinct[at[inside]] == ids[inside]
    return found


def _codes(distinct: np.ndarray, ids: np.ndarray, side: str) -> np.ndarray:
    if not len(ids):
        return np.zeros(0, dtype=np.int64)
    if (ids.dtype == object) != (distinct.dtype == object) and len(distinct):
        raise TypeError(f"{side} ids are {ids.dtype}, the codes were built from {distinct.dtype}")
    found = _found(distinct, ids)
    if not found.all():
        raise ValueError(f"{side} id {ids[~found][0]!r} has no code in this round")
    return np.searchsorted(distinct, ids).astype(np.int64)


def rank_within_runs(sorted_values: np.ndarray) -> np.ndarray:
    """``(N,)`` int64: the position of each element within its run of equal values.

    ``sorted_values`` must be grouped (equal values adjacent, e.g. sorted); used to keep the top
    k of each user, item or target after a sort by (group, -score).
    """
    values = np.asarray(sorted_values)
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    starts = run_starts(values)
    return np.arange(n, dtype=np.int64) - np.repeat(starts, np.diff(np.r_[starts, n]))


def run_starts(sorted_values: np.ndarray) -> np.ndarray:
    """``(R,)`` int64: where each run of equal values starts in grouped ``sorted_values``; the
    ``starts`` of ``np.ufunc.reduceat`` over the runs (empty for an empty input)."""
    values = np.asarray(sorted_values)
    if len(values) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.r_[True, values[1:] != values[:-1]])


def duplicated_rows(columns: Sequence[np.ndarray]) -> np.ndarray:
    """``(N,)`` bool: the rows whose values in every one of ``columns`` equal another row's
    (pandas' ``duplicated(keep=False)``: every row of a repeated key, not only the later ones).

    Numeric columns are compared after one lexsort (a 1,024-row batch of two int64 keys: about
    0.03 ms, against 0.21 ms for a DataFrame's ``duplicated``); object columns (String ids) go
    through pandas, which hashes them.
    """
    if not columns:
        raise ValueError("duplicated_rows needs at least one column")
    arrays = [np.asarray(c) for c in columns]
    n = len(arrays[0])
    if n < 2:
        return np.zeros(n, dtype=bool)
    if any(a.dtype == object for a in arrays):
        import pandas as pd

        frame = pd.DataFrame({i: a for i, a in enumerate(arrays)})
        return np.asarray(frame.duplicated(keep=False).to_numpy(), dtype=bool)
    order = np.lexsort(arrays[::-1])
    same = np.ones(n - 1, dtype=bool)
    for a in arrays:
        ordered = a[order]
        same &= ordered[1:] == ordered[:-1]
    repeated = np.zeros(n, dtype=bool)
    repeated[1:] |= same
    repeated[:-1] |= same
    out = np.empty(n, dtype=bool)
    out[order] = repeated
    return out
