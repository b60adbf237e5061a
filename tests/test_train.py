"""Training inputs for the serving VM: the tier mix never hands a row its own embedding back."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from solaris_feast.data.schema import EVENT_TIMESTAMP, earliest_rows
from solaris_feast.tiers import Tier
from solaris_feast.train import TierMix, tier_mix_inputs

LOG = pd.DataFrame({"user_id": [0, 0, 0, 1, 1, 2], "item_id": [5, 6, 5, 5, 6, 7]})
Z = torch.arange(12, dtype=torch.float32).reshape(6, 2)


def test_user_aggregate_is_the_mean_of_the_users_other_rows() -> None:
    tiers, inputs = tier_mix_inputs(LOG, Z, TierMix(exact=0.0, similar=0.0, user_agg=1.0), 0)
    # Brute-force leave-one-out means per user.
    for row in range(len(LOG)):
        same = [r for r in range(len(LOG)) if LOG.user_id[r] == LOG.user_id[row] and r != row]
        if same:
            assert tiers[row] == Tier.USER_AGG
            assert torch.allclose(inputs[row], Z[same].mean(0))
        else:  # a user with one row has nothing to aggregate
            assert tiers[row] == Tier.ZERO and not inputs[row].any()


def test_similar_fill_uses_other_rows_of_the_item_and_only_eligible_ones() -> None:
    eligible = np.array([True, True, True, True, False, True])
    tiers, inputs = tier_mix_inputs(
        LOG, Z, TierMix(exact=0.0, similar=1.0, user_agg=0.0), 0, eligible
    )
    assert torch.allclose(inputs[0], Z[[2, 3]].mean(0))
    assert tiers[4] == Tier.ZERO  # not eligible itself
    assert tiers[1] == Tier.ZERO  # its only other row of item 6 is not eligible


def test_exact_rows_carry_their_own_embedding_and_shares_are_checked() -> None:
    tiers, inputs = tier_mix_inputs(LOG, Z, TierMix(exact=1.0, similar=0.0, user_agg=0.0), 0)
    assert (tiers == Tier.EXACT).all() and torch.equal(inputs, Z)
    with pytest.raises(ValueError, match="at most 1"):
        tier_mix_inputs(LOG, Z, TierMix(exact=0.6, similar=0.3, user_agg=0.3), 0)


def test_earliest_rows_cuts_by_time_span() -> None:
    ts = pd.to_datetime(["2026-11-01T00:00Z", "2026-11-01T01:00Z", "2026-11-01T04:00Z"], utc=True)
    mask = earliest_rows(pd.DataFrame({EVENT_TIMESTAMP: ts}), 0.5)
    assert mask.tolist() == [True, True, False]
