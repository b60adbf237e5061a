"""solaris-feast: foundation-model embeddings served through Feast, the FM off the request path.

The path of one embedding, module by module: ``data`` (interaction logs) -> ``features`` (model
inputs as of a time) -> ``models`` and ``train`` (FM, compressor, VM and their cards) ->
``definitions`` (Feast views) -> ``candidates`` -> ``plan`` -> ``precompute`` -> ``write`` ->
``aggregate`` and ``similarity`` (enrichment) -> ``serve`` (layered online read) -> ``lineage``
and ``status`` (review). ``evaluate`` and ``simulate`` measure how much of the FM's gain reaches
the VM; ``pipeline`` holds the bodies of the Airflow tasks in ``dags/``.
"""

from __future__ import annotations

from solaris_feast.tiers import Tier

__all__ = ["Tier"]
__version__ = "0.1.0"
