"""Interaction logs: one schema, a synthetic generator (the embedded default) and MovieLens-100K."""

from __future__ import annotations

from solaris_feast.data.schema import InteractionDataset, time_split, validate_interactions

__all__ = ["InteractionDataset", "time_split", "validate_interactions"]
