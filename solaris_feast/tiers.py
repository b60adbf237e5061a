"""Where a served embedding came from.

The order of the values is the order of preference when several tiers hold a vector for the same
pair: the exact FM embedding beats a neighbour's, which beats the user's 24 h aggregate, which beats
nothing. The integer values are stable: the vertical model embeds them as an input feature and Feast
stores them, so never renumber.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Literal


class Tier(IntEnum):
    ZERO = 0
    """No embedding available: the VM gets a zero vector."""
    USER_AGG = 1
    """The mean of the user's exact pair embeddings over the aggregation window."""
    SIMILAR = 2
    """Filled from the user's nearest neighbours' exact embeddings for the same item."""
    EXACT = 3
    """The FM's own compressed representation of this user-item pair."""


NUM_TIERS = len(Tier)


SEARCH_ORDER: tuple[Tier, ...] = (Tier.EXACT, Tier.SIMILAR, Tier.USER_AGG)
"""Tiers that hold vectors, best first: the order the tier rule searches them."""


FmRowsTier = Literal["zero", "own_tier"]
"""How a VM's training gives a tier to the rows its FM trained on
(:attr:`solaris_feast.models.chain.TierMix.fm_rows`); serving never sends ``own_tier``."""
