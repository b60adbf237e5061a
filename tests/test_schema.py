"""Bad logs are refused with an error naming the column; the time split leaks nothing."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solaris_feast.data.schema import InteractionDataset, time_split, validate_interactions
from solaris_feast.errors import SchemaError

LABELS = ("click", "conversion")


def good_log(n: int = 6) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "user_id": np.arange(n, dtype=np.int64) % 3,
            "item_id": np.arange(n, dtype=np.int64) % 2,
            "event_timestamp": pd.date_range("2026-01-01", periods=n, freq="h", tz="UTC"),
            "click": np.array([1, 0, 1, 1, 0, 1][:n], dtype=np.int64),
            "conversion": np.array([1, 0, 0, 1, 0, 0][:n], dtype=np.int64),
        }
    )


def dataset(log: pd.DataFrame, **overrides: object) -> InteractionDataset:
    fields: dict[str, object] = {
        "name": "tiny",
        "interactions": log,
        "users": pd.DataFrame({"user_id": np.arange(3), "segment": [0, 1, 1]}),
        "items": pd.DataFrame({"item_id": np.arange(2), "price": [1.5, 2.0]}),
        "label_columns": LABELS,
        "num_users": 3,
        "num_items": 2,
        "user_categorical": ("segment",),
        "item_dense": ("price",),
    }
    fields.update(overrides)
    return InteractionDataset(**fields)  # type: ignore[arg-type]


def refused_column(log: pd.DataFrame, labels: tuple[str, ...] = LABELS) -> str:
    with pytest.raises(SchemaError) as caught:
        validate_interactions(log, labels)
    # The message names the column too, so a user reading only the text knows what to fix.
    assert repr(caught.value.column) in str(caught.value)
    return caught.value.column


def test_good_log_passes() -> None:
    validate_interactions(good_log(), LABELS)
    assert dataset(good_log()).num_users == 3


@pytest.mark.parametrize("column", ["user_id", "item_id", "event_timestamp", "click", "conversion"])
def test_missing_column_is_named(column: str) -> None:
    assert refused_column(good_log().drop(columns=[column])) == column


def test_empty_label_list_is_refused() -> None:
    assert refused_column(good_log(), labels=()) == "<labels>"


@pytest.mark.parametrize("label", ["click", "conversion"])
def test_nan_label_is_named(label: str) -> None:
    log = good_log()
    log[label] = log[label].astype(np.float64)
    log.loc[2, label] = np.nan
    with pytest.raises(SchemaError, match="1 NaN labels") as caught:
        validate_interactions(log, LABELS)
    assert caught.value.column == label


def test_non_binary_label_is_named() -> None:
    log = good_log()
    log.loc[0, "conversion"] = 3
    assert refused_column(log) == "conversion"


@pytest.mark.parametrize(
    "timestamps",
    [
        pytest.param(lambda ts: ts.dt.strftime("%Y-%m-%d %H:%M:%S"), id="strings"),
        pytest.param(lambda ts: ts.astype("int64") // 10**9, id="unix-seconds"),
        pytest.param(lambda ts: ts.dt.tz_localize(None), id="naive"),
        pytest.param(lambda ts: ts.dt.tz_convert("Europe/Berlin"), id="not-utc"),
    ],
)
def test_timestamps_of_wrong_type_are_named(timestamps: object) -> None:
    log = good_log()
    log["event_timestamp"] = timestamps(log["event_timestamp"])  # type: ignore[operator]
    with pytest.raises(SchemaError, match="UTC") as caught:
        validate_interactions(log, LABELS)
    assert caught.value.column == "event_timestamp"


def test_missing_timestamp_is_named() -> None:
    log = good_log()
    log.loc[1, "event_timestamp"] = pd.NaT
    assert refused_column(log) == "event_timestamp"


@pytest.mark.parametrize("column", ["user_id", "item_id"])
@pytest.mark.parametrize(
    "convert",
    [
        pytest.param(lambda s: s.astype(np.float64), id="float"),
        pytest.param(lambda s: s.astype(str), id="string"),
    ],
)
def test_non_integer_ids_are_named(column: str, convert: object) -> None:
    log = good_log()
    log[column] = convert(log[column])  # type: ignore[operator]
    with pytest.raises(SchemaError, match="integer") as caught:
        validate_interactions(log, LABELS)
    assert caught.value.column == column


def test_ids_beyond_the_declared_count_are_named() -> None:
    log = good_log()
    log.loc[0, "item_id"] = 2  # num_items is 2, so ids must lie in 0..1
    with pytest.raises(SchemaError, match=r"outside 0\.\.1") as caught:
        dataset(log)
    assert caught.value.column == "item_id"


def test_bad_attribute_tables_are_named() -> None:
    with pytest.raises(SchemaError) as caught:
        dataset(good_log(), users=pd.DataFrame({"user_id": np.arange(3)}))
    assert (caught.value.table, caught.value.column) == ("users", "segment")
    negative = pd.DataFrame({"user_id": np.arange(3), "segment": [0, -1, 1]})
    with pytest.raises(SchemaError) as caught:
        dataset(good_log(), users=negative)
    assert caught.value.column == "segment"
    nan_price = pd.DataFrame({"item_id": np.arange(2), "price": [1.5, np.nan]})
    with pytest.raises(SchemaError) as caught:
        dataset(good_log(), items=nan_price)
    assert (caught.value.table, caught.value.column) == ("items", "price")


def log_at(seconds: list[int]) -> pd.DataFrame:
    n = len(seconds)
    return pd.DataFrame(
        {
            "user_id": np.arange(n, dtype=np.int64) % 3,
            "item_id": np.arange(n, dtype=np.int64) % 2,
            "event_timestamp": pd.to_datetime(
                np.array(seconds, dtype=np.int64), unit="s", utc=True
            ),
            "click": np.arange(n, dtype=np.int64) % 2,
            "conversion": np.zeros(n, dtype=np.int64),
        }
    )


@settings(max_examples=60, deadline=None)
@given(
    seconds=st.lists(st.integers(0, 50), min_size=2, max_size=40),
    fraction=st.floats(0.05, 0.95),
)
def test_time_split_puts_every_training_event_before_every_test_event(
    seconds: list[int], fraction: float
) -> None:
    # Few distinct seconds, so many events share a timestamp, also at the cut.
    log = log_at(seconds)
    try:
        train, test = time_split(dataset(log), fraction)
    except ValueError as exc:
        # Only a split with nothing on one side may be refused, and it must say so.
        assert "empty side" in str(exc)
        return
    train_ts = train.interactions["event_timestamp"]
    test_ts = test.interactions["event_timestamp"]
    assert train_ts.max() < test_ts.min()
    assert len(train.interactions) + len(test.interactions) == len(log)
    # Events with one timestamp never straddle the cut.
    assert not set(train_ts).intersection(set(test_ts))


def test_time_split_cuts_at_the_fraction_of_the_time_span() -> None:
    log = log_at([0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100])
    train, test = time_split(dataset(log), 0.75)
    # Cut at 75 s: events 0..70 train, 80..100 evaluate.
    assert train.interactions["event_timestamp"].max() == pd.Timestamp(70, unit="s", tz="UTC")
    assert test.interactions["event_timestamp"].min() == pd.Timestamp(80, unit="s", tz="UTC")
    assert (len(train.interactions), len(test.interactions)) == (8, 3)
    # Attribute tables are shared, not sliced.
    assert train.users is test.users


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.5, 1.5])
def test_time_split_refuses_fractions_outside_the_open_interval(fraction: float) -> None:
    with pytest.raises(ValueError, match="train_fraction"):
        time_split(dataset(good_log()), fraction)


def test_as_utc_converts_aware_times_and_refuses_naive_ones() -> None:
    from solaris_feast.data.schema import as_utc

    berlin = pd.Timestamp("2026-03-01 13:00", tz="Europe/Berlin")
    assert as_utc(berlin) == pd.Timestamp("2026-03-01 12:00", tz="UTC")
    assert str(as_utc(berlin).tz) == "UTC"
    with pytest.raises(ValueError, match="now must be timezone-aware"):
        as_utc(pd.Timestamp("2026-03-01 12:00"), "now")
