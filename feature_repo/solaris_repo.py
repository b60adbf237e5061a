"""The SOLARIS definitions of this repo, made by the solaris_feast factories.

Change names, dimension, TTLs or lineage tags through ``SolarisFeastConfig``; ``feast apply``
registers every object bound at module level below.
"""

from __future__ import annotations

from solaris_feast.definitions import SolarisFeastConfig, solaris_definitions

solaris = solaris_definitions(SolarisFeastConfig())

user = solaris.user
item = solaris.item
solaris_pair = solaris.pair_view
solaris_user = solaris.user_view
solaris_similar = solaris.similar_view
solaris_resolved = solaris.resolved_view
solaris_embeddings = solaris.service
