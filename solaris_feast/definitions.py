"""Kept so that feature repos written against 0.1 (``from solaris_feast.definitions import
...``) still apply; the definitions live in :mod:`solaris_feast.store.definitions`."""

from solaris_feast.store.definitions import (
    SolarisDefinitions,
    SolarisFeastConfig,
    solaris_definitions,
)

__all__ = ["SolarisDefinitions", "SolarisFeastConfig", "solaris_definitions"]
