"""Training inputs for the serving VM: the tier mix never hands a row its own embedding back."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from solaris_feast.data.schema import EVENT_TIMESTAMP, earliest_rows
from solaris_feast.models.chain import TierMix, tier_mix_inputs
from solaris_feast.tiers import Tier

T0 = pd.Timestamp("2026-11-01T00:00:00Z")
LOG = pd.DataFrame(
    {
        "user_id": [0, 0, 0, 1, 1, 2, 0],
        "item_id": [5, 6, 5, 5, 6, 7, 5],
        # Rows 1 and 2 share a time: neither may see the other. Row 6 repeats user 0's item 5.
        EVENT_TIMESTAMP: [T0 + pd.Timedelta(minutes=m) for m in (0, 5, 5, 1, 9, 3, 12)],
    }
)
Z = torch.arange(14, dtype=torch.float32).reshape(7, 2)


def _earlier(row: int, key: str, usable: np.ndarray, round_minutes: int = 0) -> list[int]:
    cutoff = LOG[EVENT_TIMESTAMP][row]
    if round_minutes:
        cutoff = cutoff.floor(f"{round_minutes}min")
    return [
        r
        for r in range(len(LOG))
        if usable[r]
        and LOG[key][r] == LOG[key][row]
        and LOG[EVENT_TIMESTAMP][r] < cutoff
        # the similarity fill averages other users' vectors of the item
        and (key == "user_id" or LOG["user_id"][r] != LOG["user_id"][row])
    ]


@pytest.mark.parametrize("round_minutes", [0, 5, 10])
@pytest.mark.parametrize(("tier", "key"), [(Tier.USER_AGG, "user_id"), (Tier.SIMILAR, "item_id")])
def test_enrichment_tiers_average_strictly_earlier_rows_only(
    tier: Tier, key: str, round_minutes: int
) -> None:
    """Brute-force reference: a later row's z was computed from a history holding this row's
    label, so only strictly earlier rows may feed the mean."""
    mix = TierMix(
        exact=0.0,
        similar=1.0 if tier == Tier.SIMILAR else 0.0,
        user_agg=1.0 if tier == Tier.USER_AGG else 0.0,
    )
    for usable in (np.ones(7, dtype=bool), np.array([True, True, True, True, False, True, True])):
        tiers, inputs = tier_mix_inputs(LOG, Z, mix, 0, usable, round_seconds=60 * round_minutes)
        for row in range(len(LOG)):
            earlier = _earlier(row, key, usable, round_minutes)
            if usable[row] and earlier:
                assert tiers[row] == tier
                assert torch.allclose(inputs[row], Z[earlier].mean(0))
            else:
                assert tiers[row] == Tier.ZERO and not inputs[row].any()


def test_rows_of_the_same_time_do_not_see_each_other() -> None:
    tiers, _ = tier_mix_inputs(LOG, Z, TierMix(exact=0.0, similar=0.0, user_agg=1.0), 0)
    # Row 1 (user 0, 00:05) sees only row 0 (00:00), not row 2 (also 00:05).
    assert tiers[1] == Tier.USER_AGG and tiers[0] == Tier.ZERO


def test_exact_rows_carry_their_own_embedding_and_shares_are_checked() -> None:
    tiers, inputs = tier_mix_inputs(LOG, Z, TierMix(exact=1.0, similar=0.0, user_agg=0.0), 0)
    assert (tiers == Tier.EXACT).all() and torch.equal(inputs, Z)
    with pytest.raises(ValueError, match="at most 1"):
        tier_mix_inputs(LOG, Z, TierMix(exact=0.6, similar=0.3, user_agg=0.3), 0)


def test_earliest_rows_cuts_by_time_span() -> None:
    ts = pd.to_datetime(["2026-11-01T00:00Z", "2026-11-01T01:00Z", "2026-11-01T04:00Z"], utc=True)
    mask = earliest_rows(pd.DataFrame({EVENT_TIMESTAMP: ts}), 0.5)
    assert mask.tolist() == [True, True, False]


def test_enrichment_means_use_rows_before_the_last_precompute_round_only() -> None:
    """With hourly rounds, a row at 01:40 sees rows before 01:00 only: the impressions of its own
    session (01:05, 01:20) were shown after the round that built its aggregate."""
    log = pd.DataFrame(
        {
            "user_id": [3, 3, 3, 3, 4],
            "item_id": [1, 2, 3, 4, 1],
            EVENT_TIMESTAMP: [T0 + pd.Timedelta(minutes=m) for m in (10, 65, 80, 100, 30)],
        }
    )
    z = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    user_only = TierMix(exact=0.0, similar=0.0, user_agg=1.0)
    tiers, inputs = tier_mix_inputs(log, z, user_only, 0, round_seconds=3600)
    assert tiers.tolist() == [Tier.ZERO, Tier.USER_AGG, Tier.USER_AGG, Tier.USER_AGG, Tier.ZERO]
    for row in (1, 2, 3):
        assert torch.equal(inputs[row], z[0])  # only the 00:10 row precedes the 01:00 round
    tiers, inputs = tier_mix_inputs(log, z, user_only, 0)  # no rounds: every earlier row
    assert torch.allclose(inputs[3], z[[0, 1, 2]].mean(0))
    # Item 1: without rounds user 4's row (00:30) averages user 3's (00:10); with hourly rounds
    # both come after the 00:00 round, so it has no neighbour embedding yet.
    similar_only = TierMix(exact=0.0, similar=1.0, user_agg=0.0)
    tiers, inputs = tier_mix_inputs(log, z, similar_only, 0)
    assert tiers[4] == Tier.SIMILAR and torch.equal(inputs[4], z[0])
    tiers, _ = tier_mix_inputs(log, z, similar_only, 0, round_seconds=3600)
    assert tiers[4] == Tier.ZERO


def test_training_repeats_bit_for_bit_and_leaves_the_callers_torch_rng_alone() -> None:
    """Dropout and initialisation are seeded for the training's own block only: the caller's
    torch generator is where it was, and two fits with one seed give the same weights."""
    from solaris_feast.models.compressor import CompressorConfig, EmbeddingCompressor
    from solaris_feast.models.training import TrainConfig, seeded_torch, train_compressor

    h = torch.from_numpy(np.random.default_rng(3).standard_normal((256, 16)).astype(np.float32))
    cfg = TrainConfig(epochs=2, batch_size=64, seed=5)

    def fit() -> list[torch.Tensor]:
        with seeded_torch(cfg.seed):
            model = EmbeddingCompressor(CompressorConfig(input_dim=16, code_dim=4))
        train_compressor(model, h, cfg)
        return [p.detach().clone() for p in model.parameters()]

    torch.manual_seed(1234)
    before = torch.random.get_rng_state()
    first = fit()
    assert torch.equal(torch.random.get_rng_state(), before)
    second = fit()
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    expected_next = torch.rand(3, generator=torch.Generator().manual_seed(1234))
    assert torch.equal(torch.rand(3), expected_next)  # the caller's sequence was not consumed


@pytest.mark.parametrize(
    ("break_it", "match"),
    [
        (lambda log, label: log.assign(user_id=log["user_id"].iloc[0]), "single user"),
        (lambda log, label: log.assign(**{label: 0}), "no positive rows"),
        (lambda log, label: log.assign(**{label: 1}), "no negative rows"),
        (lambda log, label: log.iloc[0:0], "no interactions"),
    ],
)
def test_a_log_a_chain_cannot_learn_from_is_refused_before_any_model_trains(
    break_it: object, match: str
) -> None:
    """One user, one class of a label, an empty window: no model trains, and the error names
    the column (before, a chain of 5 rows or of no positive label registered a card whose NE
    was meaningless)."""
    import dataclasses

    from solaris_feast.data.synthetic import SyntheticConfig, generate
    from solaris_feast.errors import SchemaError
    from solaris_feast.models.chain import TrainingData

    data = generate(SyntheticConfig(num_users=20, num_items=15, num_categories=3, days=0.5))
    label = data.label_columns[0]
    broken = dataclasses.replace(data, interactions=break_it(data.interactions, label))  # type: ignore[operator]
    with pytest.raises(SchemaError, match=match):
        TrainingData.build(broken, history_len=8)
