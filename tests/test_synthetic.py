"""The synthetic generator: deterministic, schema-true, and carrying the planted structure."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from solaris_feast.data.schema import EVENT_TIMESTAMP, ITEM_ID, USER_ID, time_split
from solaris_feast.data.synthetic import SyntheticConfig, generate

SMALL = SyntheticConfig(num_users=200, num_items=100, num_categories=6, days=2.0)


def test_same_seed_gives_identical_data() -> None:
    a, b = generate(SMALL), generate(SMALL)
    pd.testing.assert_frame_equal(a.interactions, b.interactions)
    pd.testing.assert_frame_equal(a.users, b.users)
    pd.testing.assert_frame_equal(a.items, b.items)


def test_other_seed_gives_other_data() -> None:
    a = generate(SMALL)
    b = generate(SMALL.model_copy(update={"seed": 1}))
    assert not a.interactions[ITEM_ID].equals(b.interactions[ITEM_ID])


def test_log_follows_the_schema() -> None:
    ds = generate(SMALL)
    log = ds.interactions
    assert ds.label_columns == ("click", "conversion")
    assert log[USER_ID].dtype == np.int64 and log[ITEM_ID].dtype == np.int64
    assert str(log[EVENT_TIMESTAMP].dt.tz) == "UTC"
    assert log[EVENT_TIMESTAMP].is_monotonic_increasing
    assert log[USER_ID].between(0, SMALL.num_users - 1).all()
    assert log[ITEM_ID].between(0, SMALL.num_items - 1).all()


def test_conversion_is_rarer_than_click_and_needs_one() -> None:
    log = generate(SMALL).interactions
    assert (log["conversion"] <= log["click"]).all()
    assert 0 < log["conversion"].mean() < log["click"].mean() < 0.6


def test_popularity_is_skewed() -> None:
    counts = generate(SMALL).interactions[ITEM_ID].value_counts().to_numpy()
    top_decile = counts[: max(1, len(counts) // 10)].sum() / counts.sum()
    assert top_decile > 0.25


def test_recent_clicks_predict_the_next_hours() -> None:
    """The planted drift: a click in the same category as the user's previous click is much
    more likely than a click in a random category of the user's long-term interests."""
    ds = generate(SMALL)
    log = ds.interactions.merge(ds.items[[ITEM_ID, "category"]], on=ITEM_ID)
    log = log.sort_values([USER_ID, EVENT_TIMESTAMP], kind="stable")
    prev_click_cat = (
        log.assign(cc=log["category"].where(log["click"] == 1))
        .groupby(USER_ID)["cc"]
        .transform(lambda s: s.shift(1).ffill())
    )
    match = log["category"] == prev_click_cat
    ctr_match = log.loc[match, "click"].mean()
    ctr_other = log.loc[~match & prev_click_cat.notna(), "click"].mean()
    assert ctr_match > 2 * ctr_other


def test_scales_to_a_million_users_without_dense_matrices() -> None:
    cfg = SyntheticConfig(
        num_users=1_000_000,
        num_items=100_000,
        days=0.25,
        sessions_per_day=1.0,
        impressions_per_session=2,
    )
    ds = generate(cfg)
    assert ds.num_users == 1_000_000 and ds.num_items == 100_000
    assert ds.interactions[USER_ID].nunique() > 900_000


def test_rejects_shares_that_add_past_one() -> None:
    with pytest.raises(ValueError, match="must not exceed 1"):
        generate(SMALL.model_copy(update={"current_interest_share": 0.8, "long_term_share": 0.5}))


def test_time_split_trains_on_the_past_only() -> None:
    train, test = time_split(generate(SMALL), 0.7)
    assert train.interactions[EVENT_TIMESTAMP].max() < test.interactions[EVENT_TIMESTAMP].min()
    assert len(train.interactions) + len(test.interactions) == len(generate(SMALL).interactions)
