"""Column and feature names, written once: the interaction log's keys, and the features every
SOLARIS view stores. Feast's registry, the parquet logs, the online store's hash fields and the
in-memory frames all use these strings, so a rename here is a rename everywhere (and a
migration of stored data: never rename casually). No imports, so DAG files can read it at parse
time."""

from __future__ import annotations

USER_ID = "user_id"
"""Join key of the user entity; a column of every log and view keyed by user."""
ITEM_ID = "item_id"
"""Join key of the item entity."""
EVENT_TIMESTAMP = "event_timestamp"
"""When an impression happened (logs), or the event time of a stored row (views)."""
WRITTEN_AT = "written_at"
"""Offline column that breaks ties between rows with the same event time: the later write wins."""
EMBEDDING = "embedding"
"""The stored vector ``z`` of a tier, ``(D,)`` float32."""
FLOAT_EMBEDDING = "embedding_float32"
"""Offline column of a view with a quantized codec: the float32 vector, which training reads.
The ``embedding`` column beside it holds the codec's bytes, the feature's declared type, so
Feast's own offline reads and ``feast materialize`` see what the online store holds."""
MODEL_VERSION = "model_version"
"""Embedding version (the compressor's version) that made a stored vector."""
COMPUTED_AT = "computed_at"
"""When a stored vector was computed; freshness is judged from it."""
PAIR_COUNT = "pair_count"
"""User aggregate: how many pair embeddings it averages."""
NEIGHBOUR_COUNT = "neighbour_count"
"""Similarity fill: how many neighbours' embeddings it combines."""
MEAN_DISTANCE = "mean_distance"
"""Similarity fill: mean L2 distance to those neighbours."""
