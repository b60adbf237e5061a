"""Interaction logs: one schema, a synthetic generator (the embedded default), MovieLens-100K and
the user's own parquet tables (:mod:`.log_source`).

The names below are loaded on first use: :mod:`.log_source`'s config models are imported while
Airflow parses the DAG files, which must not pull in pandas through :mod:`.schema`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["InteractionDataset", "time_split", "validate_interactions"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from solaris_feast.data import schema

        return getattr(schema, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
