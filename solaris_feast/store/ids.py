"""Entity ids as real systems have them: sparse Int64 up to 2**63-1, or String.

The type of each join key is named once, in :class:`~solaris_feast.store.definitions.
SolarisFeastConfig` (``user_id_type`` / ``item_id_type``), which makes the Feast entities; the
writer and the retriever read it back from the registry (:func:`join_key_types`), so they follow
whatever the repo registered. Ids travel as Python ``int`` or ``str``; arrays of them as
``(N,)`` int64 or ``(N,)`` object (str) numpy arrays. :func:`check_ids` is the one check of a
column of ids, used wherever ids enter (writes, reads, the miss queue).

Int64 ids must be non-negative (the precompute and the models never made negative ids, and a
negative id in a log is nearly always a sentinel such as -1 for "unknown"). String ids must be
non-empty text; any unicode and any ``:`` are allowed (keys are length-prefixed everywhere).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from solaris_feast.errors import ConfigError

if TYPE_CHECKING:
    from feast import FeatureView

IdType = Literal["int64", "string"]
"""How a join key's values are typed: Feast ``ValueType.INT64`` or ``ValueType.STRING``."""
ID_TYPES: tuple[str, ...] = get_args(IdType)
EntityId = int | str
"""One id: an ``int`` for Int64 join keys, a ``str`` for String ones."""
INT64_MAX = 2**63 - 1


def id_type_of(values: Any) -> IdType:
    """``int64`` or ``string``: how a column or array of ids is typed (an integer dtype, or
    anything else, which for ids that passed :func:`check_ids` is an object array of str)."""
    dtype = getattr(values, "dtype", None)
    return "int64" if dtype is not None and np.issubdtype(dtype, np.integer) else "string"


def feast_value_type(id_type: IdType) -> Any:
    """Feast's ``ValueType`` of an id type (for ``Entity(value_type=...)``)."""
    from feast import ValueType

    return ValueType.INT64 if id_type == "int64" else ValueType.STRING


def id_type_of_feast_dtype(dtype: Any, where: str) -> IdType:
    """``int64`` or ``string`` from a Feast field type (``Int64``/``String``); else refused."""
    from feast.types import Int64, String

    if dtype == Int64:
        return "int64"
    if dtype == String:
        return "string"
    raise ConfigError(f"{where}: join keys must be Int64 or String, got {dtype}")


def join_key_types(view: FeatureView) -> dict[str, IdType]:
    """The id type of each join key of a registered view, from its entity columns."""
    columns = {f.name: f.dtype for f in view.entity_columns}
    return {
        key: id_type_of_feast_dtype(columns[key], f"view {view.name} join key {key!r}")
        if key in columns
        else "int64"  # a view registered without entity columns: Feast's default type
        for key in view.join_keys
    }


def check_ids(values: Any, id_type: IdType, name: str) -> np.ndarray:
    """``(N,)`` int64 or ``(N,)`` object (str) ids from a column, a list or an array.

    Raises:
        TypeError: values of another type (bools, floats, bytes, ints for String keys, text for
            Int64 keys), naming ``name`` and the first bad position.
        ValueError: negative or > 2**63-1 Int64 ids, empty strings, or not one-dimensional.
    """
    if id_type not in ID_TYPES:
        raise ConfigError(f"{name}: id type must be one of {ID_TYPES}, got {id_type!r}")
    if hasattr(values, "to_numpy"):
        array = np.asarray(values.to_numpy())
    elif isinstance(values, list | tuple):
        array = np.asarray(values)
        if array.dtype.kind not in "iu":
            # Object, not numpy's guess: ["a", 1] would silently become two strings.
            array = np.asarray(values, dtype=object)
    else:
        array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    if id_type == "int64":
        if array.dtype == object and array.size:
            bad = [
                i
                for i, v in enumerate(array.tolist())
                if isinstance(v, bool) or not isinstance(v, int | np.integer)
            ]
            if bad:
                raise TypeError(
                    f"{name} must be Int64 ids, got {type(array[bad[0]]).__name__} at "
                    f"position {bad[0]}"
                )
            if any(not 0 <= int(v) <= INT64_MAX for v in array.tolist()):
                raise ValueError(f"{name} must lie in [0, 2**63 - 1] (Int64 join keys)")
            return array.astype(np.int64)
        if array.size and (array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer)):
            raise TypeError(f"{name} must be Int64 ids, got dtype {array.dtype}")
        if array.size and array.dtype.kind == "u" and int(array.max()) > INT64_MAX:
            raise ValueError(f"{name} must fit in int64 (Int64 join keys); got values > 2**63 - 1")
        ids = array.astype(np.int64)
        negative = np.flatnonzero(ids < 0)
        if negative.size:
            raise ValueError(
                f"{name} must be non-negative Int64 ids; negative at positions "
                f"{negative[:10].tolist()}"
            )
        return ids
    ids = array.astype(object) if array.dtype.kind in "OU" or not array.size else array
    if ids.dtype != object:
        raise TypeError(f"{name} must be String ids, got dtype {array.dtype}")
    for i, v in enumerate(ids.tolist()):
        if not isinstance(v, str):
            raise TypeError(f"{name} must be String ids, got {type(v).__name__} at position {i}")
        if not v:
            raise ValueError(f"{name} has an empty string id at position {i}")
    return ids


def check_id(value: Any, id_type: IdType, name: str) -> EntityId:
    """One id (a user id of a request, say) checked as :func:`check_ids` checks a column."""
    if id_type == "int64" and (isinstance(value, bool) or not isinstance(value, int | np.integer)):
        raise TypeError(f"{name} must be an integer (Int64 join key), got {type(value).__name__}")
    if id_type == "string" and not isinstance(value, str):
        raise TypeError(f"{name} must be a str (String join key), got {type(value).__name__}")
    if id_type == "int64" and 0 <= int(value) <= INT64_MAX:
        return int(value)  # the common case without building an array (one per request)
    if id_type == "string" and value:
        return str(value)
    checked = check_ids([value], id_type, name)[0]  # raises, naming the problem
    return int(checked) if id_type == "int64" else str(checked)


def encode_id(value: EntityId) -> str:
    """Text form of one id for stores that keep text (the Redis stream, a marker key).

    JSON keeps the type: ``5`` and ``"5"`` differ, ints read as before (``"5"``), and a string
    with ``:`` or quotes cannot run into its neighbour in ``<user>:<item>``.
    """
    return json.dumps(value, ensure_ascii=False)


def decode_id(text: str | bytes | int) -> EntityId:
    """Inverse of :func:`encode_id` (ints stored before it read as ints)."""
    if isinstance(text, int):
        return text
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    value = json.loads(text)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"not a stored id: {text!r}")
    return value


def id_column(values: list[EntityId]) -> np.ndarray:
    """``(N,)`` int64 when every id is an int, else ``(N,)`` object: a column read back."""
    if all(isinstance(v, int) for v in values):
        return np.asarray(values, dtype=np.int64)
    return np.asarray(values, dtype=object)
