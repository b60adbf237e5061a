"""One int64 key per ``(user, item)`` pair, for sorting, joining and ``np.isin`` on pairs.

``key = user << 31 | item``: keys keep the ``(user, item)`` order and unpack exactly while item ids
stay below 2**31 and user ids below 2**32; ids outside raise rather than collide. Candidates, the
plan, the aggregate, the similarity fill and the replay all key pairs through here. (How Feast keys
pairs in the online store is another layout: ``store/layout.py``.)
"""

from __future__ import annotations

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
