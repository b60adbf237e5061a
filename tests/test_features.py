"""The featurizer cuts history strictly before each pair's time."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from solaris_feast.data.schema import EVENT_TIMESTAMP, ITEM_ID, USER_ID, InteractionDataset
from solaris_feast.models.features import PairFeaturizer


def _dataset() -> InteractionDataset:
    t0 = pd.Timestamp("2026-11-01T00:00:00Z")
    log = pd.DataFrame(
        {
            USER_ID: np.array([0, 0, 0, 1, 0], dtype=np.int64),
            ITEM_ID: np.array([5, 6, 7, 8, 9], dtype=np.int64),
            EVENT_TIMESTAMP: [
                t0,
                t0 + pd.Timedelta(hours=1),
                t0 + pd.Timedelta(hours=2),
                t0,
                t0 + pd.Timedelta(hours=3),
            ],
            "click": np.array([1, 0, 1, 1, 0], dtype=np.int8),
        }
    ).sort_values(EVENT_TIMESTAMP, kind="stable")
    users = pd.DataFrame(
        {USER_ID: np.arange(2, dtype=np.int64), "segment": np.array([0, 1], dtype=np.int64)}
    )
    items = pd.DataFrame(
        {ITEM_ID: np.arange(10, dtype=np.int64), "category": np.arange(10, dtype=np.int64) % 3}
    )
    return InteractionDataset(
        name="hand",
        interactions=log,
        users=users,
        items=items,
        label_columns=("click",),
        num_users=2,
        num_items=10,
        user_categorical=("segment",),
        item_categorical=("category",),
    )


def test_history_is_strictly_before_and_most_recent_first() -> None:
    f = PairFeaturizer(_dataset(), history_len=4)
    at = pd.Timestamp("2026-11-01T02:00:00Z")  # the event at 02:00 itself must not be seen
    b = f.batch(np.array([0]), np.array([1]), at)
    assert b.hist_item[0].tolist() == [6, 5, 0, 0]
    assert b.hist_label[0].tolist() == [0, 1, 0, 0]
    assert b.hist_mask[0].tolist() == [True, True, False, False]
    assert b.hist_item_cat[0, :2, 0].tolist() == [0, 2]
    assert torch.allclose(b.hist_age[0, :2], torch.log1p(torch.tensor([1.0, 2.0])))


def test_logged_rows_never_see_their_own_event() -> None:
    ds = _dataset()
    b = PairFeaturizer(ds, history_len=8).for_log(ds.interactions)
    for row in range(len(b)):
        seen = b.hist_item[row][b.hist_mask[row]].tolist()
        assert int(b.item_id[row]) not in seen


def test_other_users_history_is_not_mixed_in() -> None:
    b = PairFeaturizer(_dataset(), history_len=8).batch(
        np.array([1]), np.array([0]), pd.Timestamp("2026-11-02T00:00:00Z")
    )
    assert b.hist_item[0][b.hist_mask[0]].tolist() == [8]


def test_unknown_ids_are_refused_with_their_name() -> None:
    f = PairFeaturizer(_dataset())
    with pytest.raises(ValueError, match="item_ids"):
        f.batch(np.array([0]), np.array([10]), pd.Timestamp("2026-11-02T00:00:00Z"))
    with pytest.raises(ValueError, match="user_ids"):
        f.batch(np.array([-1]), np.array([0]), pd.Timestamp("2026-11-02T00:00:00Z"))
