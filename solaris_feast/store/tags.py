"""The ``solaris.*`` tag keys of the SOLARIS feature views, defined once.

:func:`solaris_feast.store.definitions.lineage_tags` writes them; lineage review, status and the
writers read them through these names, never by spelling the string again.
"""

from __future__ import annotations

TAG_PREFIX = "solaris."
TAG_TIER = f"{TAG_PREFIX}tier"
"""Tier the view serves: ``EXACT``, ``SIMILAR``, ``USER_AGG`` or ``RESOLVED``."""
TAG_FM_VERSION = f"{TAG_PREFIX}fm_version"
"""Version of the foundation model behind the stored embeddings."""
TAG_COMPRESSOR_VERSION = f"{TAG_PREFIX}compressor_version"
"""Version of the compressor: it defines the embedding space."""
TAG_VERIFIER_VERSION = f"{TAG_PREFIX}verifier_version"
"""Version of the VM that planned the precompute."""
TAG_EMBEDDING_DIM = f"{TAG_PREFIX}embedding_dim"
"""Length of every stored embedding, as decimal text."""
TAG_EMBEDDING_CODEC = f"{TAG_PREFIX}embedding_codec"
"""How the view's ``embedding`` is stored online: ``float32`` (Feast's float list), ``float16``
or ``int8`` (Feast bytes, see :mod:`solaris_feast.store.layout`). A view without it is float32."""
TAG_PRODUCING_DAG = f"{TAG_PREFIX}producing_dag"
"""The Airflow DAG that writes the view."""
TAG_SCHEDULE = f"{TAG_PREFIX}schedule"
"""That DAG's schedule (cron or preset) as configured when the view was defined."""
TAG_TTL_SECONDS = f"{TAG_PREFIX}ttl_seconds"
"""The view's TTL in seconds, as decimal text."""
TAG_CLOCK_SKEW_SECONDS = f"{TAG_PREFIX}clock_skew_seconds"
"""The resolved view's clock skew (how far in the future a ``computed_at`` may lie), as text."""

VERSION_TAGS = (TAG_FM_VERSION, TAG_COMPRESSOR_VERSION, TAG_VERIFIER_VERSION)
"""The tags that trace a stored vector to the models that made it."""
