from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from solaris_feast.errors import SchemaError
from solaris_feast.precompute.candidates import (
    CANDIDATE_SCORE,
    SOURCE,
    CandidateConfig,
    generate_candidates,
    validate_candidate_table,
)

NOW = pd.Timestamp("2026-06-01T12:00:00Z")


def _log(rows: list[tuple[int, int, float]]) -> pd.DataFrame:
    """Rows of (user, item, hours before NOW)."""
    users, items, hours = zip(*rows, strict=True)
    return pd.DataFrame(
        {
            "user_id": np.array(users, dtype=np.int64),
            "item_id": np.array(items, dtype=np.int64),
            "event_timestamp": NOW - pd.to_timedelta(np.array(hours), unit="h"),
        }
    )


def _random_log(seed: int, users: int = 300, items: int = 400, events: int = 6000) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "user_id": rng.integers(0, users, events).astype(np.int64),
            "item_id": (rng.zipf(1.4, events) % items).astype(np.int64),
            "event_timestamp": NOW - pd.to_timedelta(rng.uniform(0.01, 24 * 20, events), unit="h"),
        }
    )


def _items(items: int = 400) -> pd.DataFrame:
    return pd.DataFrame(
        {"item_id": np.arange(items, dtype=np.int64), "genre": np.arange(items) % 7}
    )


def test_same_log_in_any_row_order_gives_the_same_table() -> None:
    log = _random_log(0)
    cfg = CandidateConfig(candidates_per_user=30, category_column="genre")
    first = generate_candidates(log, NOW, cfg, items=_items())
    shuffled = log.sample(frac=1.0, random_state=3).reset_index(drop=True)
    second = generate_candidates(shuffled, NOW, cfg, items=_items())
    pd.testing.assert_frame_equal(first, second)
    assert len(first) > 0


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_users_scored_in_chunks_get_what_one_pass_gives(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Candidates are generated a chunk of users at a time from the round's tables (memory is
    the chunk's); every step per user is independent, so the table is the one-pass table."""
    import solaris_feast.precompute.candidates as candidates

    log = _random_log(3)
    items = pd.DataFrame({"item_id": np.arange(400), "category": np.arange(400) % 9})
    config = CandidateConfig(candidates_per_user=12, category_column="category")
    whole = generate_candidates(log, NOW, config, items=items)
    monkeypatch.setattr(candidates, "USERS_PER_CHUNK", chunk)
    pd.testing.assert_frame_equal(generate_candidates(log, NOW, config, items=items), whole)
    seen = config.model_copy(update={"exclude_seen_items": True})
    chunked = generate_candidates(log, NOW, seen, items=items)
    monkeypatch.setattr(candidates, "USERS_PER_CHUNK", 10**9)
    pd.testing.assert_frame_equal(chunked, generate_candidates(log, NOW, seen, items=items))


def test_each_active_user_gets_at_most_n_distinct_items_sorted_by_score() -> None:
    log = _random_log(1)
    cfg = CandidateConfig(candidates_per_user=25, category_column="genre")
    out = generate_candidates(log, NOW, cfg, items=_items())
    active = np.unique(
        log.loc[log["event_timestamp"] >= NOW - pd.Timedelta(days=7), "user_id"].to_numpy()
    )
    np.testing.assert_array_equal(np.unique(out["user_id"]), active)
    per_user = out.groupby("user_id").size()
    assert per_user.max() == 25
    assert not out.duplicated(["user_id", "item_id"]).any()
    # Within a user: score descending, item ascending on ties.
    for _, group in out.groupby("user_id"):
        scores = group[CANDIDATE_SCORE].to_numpy()
        assert (np.diff(scores) <= 0).all()
    assert set(out[SOURCE]) <= {"cooccurrence", "category", "popular"}


def test_item_that_always_follows_a_users_recent_item_ranks_first() -> None:
    # Users 1..20 watch 7 then 8; user 0 just watched 7: 8 is the co-occurrence pick.
    rows = [(u, 7, 10.0) for u in range(1, 21)] + [(u, 8, 9.0) for u in range(1, 21)]
    rows += [(u, 50 + u, 8.0) for u in range(1, 21)]  # noise items, one user each
    rows += [(0, 7, 1.0)]
    cfg = CandidateConfig(candidates_per_user=5, popular_weight=0.0)
    out = generate_candidates(_log(rows), NOW, cfg, users=[0])
    assert out["item_id"].iloc[0] == 8
    assert out[SOURCE].iloc[0] == "cooccurrence"


def test_popular_items_of_the_users_category_are_candidates() -> None:
    items = pd.DataFrame({"item_id": np.arange(10, dtype=np.int64), "genre": [0] * 5 + [1] * 5})
    # Item 6 (genre 1) is popular; user 0 only watched item 9 (genre 1), alone.
    rows = [(u, 6, 5.0) for u in range(1, 30)] + [(u, 2, 5.0) for u in range(30, 80)]
    rows += [(0, 9, 1.0)]
    cfg = CandidateConfig(
        candidates_per_user=3,
        category_column="genre",
        cooccurrence_weight=0.0,
        popular_weight=0.0,
    )
    out = generate_candidates(_log(rows), NOW, cfg, items=items, users=[0])
    # Genre 1's popularity: 6 (29 events), then 9 (1 event); genre 0's item 2 is not offered.
    assert out["item_id"].tolist() == [6, 9]
    assert (out[SOURCE] == "category").all()


def test_user_without_history_gets_recently_popular_items() -> None:
    rows = [(1, 3, 2.0), (2, 3, 2.0), (3, 3, 2.0), (1, 4, 3.0), (2, 4, 3.0), (1, 5, 100.0)]
    cfg = CandidateConfig(candidates_per_user=3)
    out = generate_candidates(_log(rows), NOW, cfg, users=[99])
    # Last 24 h: item 3 (3 events) beats 4 (2); item 5 is older than the popularity window.
    assert out["item_id"].tolist() == [3, 4]
    assert (out["user_id"] == 99).all()


def test_events_at_or_after_now_do_not_change_candidates() -> None:
    log = _random_log(2)
    cfg = CandidateConfig(candidates_per_user=20, category_column="genre")
    before = generate_candidates(log, NOW, cfg, items=_items())
    future = _random_log(9)
    future["event_timestamp"] = NOW + pd.to_timedelta(
        np.arange(len(future)) % 1000, unit="s"
    )  # includes events exactly at NOW
    after = generate_candidates(pd.concat([log, future]), NOW, cfg, items=_items())
    pd.testing.assert_frame_equal(before, after)


def test_excluding_recent_items_drops_the_users_own_items() -> None:
    log = _random_log(4)
    cfg = CandidateConfig(candidates_per_user=50, exclude_recent_items=True)
    out = generate_candidates(log, NOW, cfg)
    recent = log.loc[log["event_timestamp"] < NOW].sort_values("event_timestamp")
    recent = recent.drop_duplicates(["user_id", "item_id"], keep="last")
    recent = recent.groupby("user_id").tail(cfg.recent_items_per_user)
    overlap = out.merge(recent, on=["user_id", "item_id"])
    assert overlap.empty


def test_excluding_seen_items_drops_every_past_pair_even_before_the_lookback() -> None:
    log = _random_log(5)
    # A pair seen 40 days ago, outside the 30-day look-back: still never a candidate.
    old = pd.DataFrame(
        {"user_id": [3], "item_id": [7], "event_timestamp": [NOW - pd.Timedelta(days=40)]}
    )
    log = pd.concat([log, old], ignore_index=True)
    cfg = CandidateConfig(candidates_per_user=50, exclude_seen_items=True)
    out = generate_candidates(log, NOW, cfg)
    past = log.loc[log["event_timestamp"] < NOW, ["user_id", "item_id"]].drop_duplicates()
    assert out.merge(past, on=["user_id", "item_id"]).empty
    assert len(out) > 0 and out.groupby("user_id").size().max() <= 50
    # Without the option the same users are offered items they have met before.
    kept = generate_candidates(log, NOW, CandidateConfig(candidates_per_user=50))
    assert not kept.merge(past, on=["user_id", "item_id"]).empty


def test_supplied_table_is_validated_and_capped_per_user() -> None:
    table = pd.DataFrame(
        {
            "user_id": np.array([1, 1, 1, 2], dtype=np.int64),
            "item_id": np.array([10, 11, 12, 10], dtype=np.int64),
            "candidate_score": [0.1, 0.9, 0.5, 0.3],
        }
    )
    out = validate_candidate_table(table, candidates_per_user=2)
    assert list(zip(out["user_id"], out["item_id"], strict=True)) == [(1, 11), (1, 12), (2, 10)]
    assert (out[SOURCE] == "supplied").all()


def test_supplied_table_without_scores_keeps_row_order_as_rank() -> None:
    table = pd.DataFrame({"user_id": [5, 5, 5], "item_id": [30, 10, 20]})
    out = validate_candidate_table(table)
    assert out["item_id"].tolist() == [30, 10, 20]


@pytest.mark.parametrize(
    ("table", "column"),
    [
        (pd.DataFrame({"user_id": [1]}), "item_id"),
        (pd.DataFrame({"user_id": [1.0], "item_id": [2]}), "user_id"),
        (pd.DataFrame({"user_id": [1, 1], "item_id": [2, 2]}), "item_id"),
        (pd.DataFrame({"user_id": [-1], "item_id": [2]}), "user_id"),
        (
            pd.DataFrame({"user_id": [1], "item_id": [2], "candidate_score": [np.nan]}),
            "candidate_score",
        ),
    ],
)
def test_bad_supplied_table_is_refused_naming_the_column(table: pd.DataFrame, column: str) -> None:
    with pytest.raises(SchemaError) as err:
        validate_candidate_table(table)
    assert err.value.column == column


def test_supplied_item_outside_the_catalogue_is_refused() -> None:
    with pytest.raises(SchemaError, match="outside"):
        validate_candidate_table(pd.DataFrame({"user_id": [1], "item_id": [50]}), num_items=50)


def test_naive_now_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone"):
        generate_candidates(_random_log(0), pd.Timestamp("2026-06-01"))
