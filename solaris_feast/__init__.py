"""solaris-feast: foundation-model embeddings served through Feast, the FM off the request path.

The path of one embedding, module by module:

``data`` (interaction logs) -> ``models`` (FM, compressor, VM) -> ``evaluate`` (how much of the
FM's gain reaches the VM). Later stages (feature views, planning, precompute, enrichment, serving, review)
each live in a module named for what they do.
"""

from __future__ import annotations

from solaris_feast.tiers import Tier

__all__ = ["Tier"]
__version__ = "0.1.0"
