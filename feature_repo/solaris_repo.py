"""The SOLARIS definitions of this repo, made by the solaris_feast factories.

``feast apply`` registers every object bound at module level below. The lineage tags
(``solaris.fm_version``, ``solaris.compressor_version``, ``solaris.verifier_version``) and the
embedding dimension come from the serving chain (promoted, else the newest VM's) in the
``models.dir`` of the config ``SOLARIS_CONFIG`` names, else ``SOLARIS_MODELS_DIR``, else
``<repo>/../models``, read by the torch-free ``solaris_feast.models.cards``; without cards they
are ``unversioned``. The user and item entities are Int64, or what the chain's id vocabulary
holds (a log with String item ids gives String item keys). TTLs can be set with
``SOLARIS_PAIR_TTL_SECONDS``, ``SOLARIS_USER_TTL_SECONDS`` and ``SOLARIS_SIMILAR_TTL_SECONDS``,
the clock skew a ``computed_at`` may lie ahead (default 300 s) with ``SOLARIS_CLOCK_SKEW_SECONDS``;
the embedding codec (float32, float16 or int8) with ``SOLARIS_EMBEDDING_CODEC``, else the
``precompute.embedding_codec`` of the config file named by ``SOLARIS_CONFIG``.
Run ``feast apply`` again after training so the tags name the models in service. Anything else
(names, dimension, DAG names) changes through ``SolarisFeastConfig``.
"""

from __future__ import annotations

from pathlib import Path

from solaris_feast.models.cards import models_dir_for_repo, versioned_feast_config
from solaris_feast.store.definitions import solaris_definitions

solaris = solaris_definitions(versioned_feast_config(models_dir_for_repo(Path(__file__).parent)))

user = solaris.user
item = solaris.item
solaris_pair = solaris.pair_view
solaris_user = solaris.user_view
solaris_similar = solaris.similar_view
solaris_resolved = solaris.resolved_view
solaris_embeddings = solaris.service
