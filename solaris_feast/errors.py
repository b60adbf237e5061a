"""Errors raised by solaris-feast.

One root class, so callers can catch everything of ours in one place; messages are built in
``__init__`` and name the bad value and what to do about it (the way ``feast.errors`` does).
Errors that a retry can fix (a store that is down or slow) are kept apart from final ones (bad
input), because fallback code must treat them differently.
"""

from __future__ import annotations

from collections.abc import Sequence


class SolarisError(Exception):
    """Root of every error raised by solaris-feast."""


class SchemaError(SolarisError, ValueError):
    """An input table does not have the columns or types the schema requires."""

    def __init__(self, table: str, column: str, problem: str) -> None:
        self.table = table
        self.column = column
        super().__init__(f"{table}: column {column!r} {problem}")


class ConfigError(SolarisError, ValueError):
    """A configuration value or file is malformed."""


class DatasetUnavailableError(SolarisError, RuntimeError):
    """A data set can be neither fetched nor found in the local cache."""


class ArtifactIntegrityError(SolarisError, RuntimeError):
    """A model artifact does not match the sha256 recorded in its model card."""

    def __init__(self, path: str, expected: str, actual: str) -> None:
        super().__init__(
            f"refusing to load {path}: its sha256 is {actual}, the model card says {expected}. "
            "The file was changed after training; retrain or restore the original artifact."
        )


class WriteBatchError(SolarisError, ValueError):
    """A batch of embeddings was refused as a whole; nothing of it was written."""

    def __init__(self, problem: str, rows: Sequence[int]) -> None:
        self.rows = list(rows)
        shown = ", ".join(str(r) for r in self.rows[:20])
        more = f" (+{len(self.rows) - 20} more)" if len(self.rows) > 20 else ""
        super().__init__(f"batch refused, nothing written: {problem} at rows [{shown}]{more}")


class RetryableStoreError(SolarisError, ConnectionError):
    """The online store is unreachable or too slow; the same call may succeed later."""
