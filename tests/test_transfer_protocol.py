"""The transfer protocol: no leak into the VM's history, z as served, the full-span FM as the
denominator, and a VM that really reads z.

Checked by sabotage when written: serving zeros from ``served_z`` makes
``test_vm_reads_served_z`` fail; reading history at ``side="right"`` (the row itself) makes the
shuffle test fail; training the denominator on the previous window makes
``test_denominator_is_the_full_span_fm`` fail.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from solaris_feast.data.datasets import load_dataset
from solaris_feast.data.schema import EVENT_TIMESTAMP, ITEM_ID, USER_ID, InteractionDataset
from solaris_feast.data.synthetic import SyntheticConfig, generate
from solaris_feast.evaluation.metrics import (
    cluster_bootstrap_weights,
    clustered_normalized_entropy,
    normalized_entropy,
    ratio_of_means_interval,
    row_log_loss,
)
from solaris_feast.evaluation.transfer import TransferConfig
from solaris_feast.evaluation.transfer_protocol import (
    TIER_MIX_MODE,
    ProtocolConfig,
    _contenders,
    _fit_compressor,
    _fit_fm,
    _served_vm_probabilities,
    _split,
    _World,
    earliest_rows,
    run_protocol,
    run_protocol_pooled,
    served_z,
    torch_threads,
)
from solaris_feast.models.features import HISTORY_FEATURES, PairBatch, StreamingHistory
from solaris_feast.models.training import TrainConfig, foundation_outputs
from solaris_feast.models.vertical import FM_SPAN_TIER
from solaris_feast.tiers import Tier

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

FAST = TransferConfig(
    history_len=8,
    fm_training=TrainConfig(epochs=1, batch_size=256, learning_rate=2e-3),
    compressor_training=TrainConfig(epochs=1, batch_size=512, learning_rate=1e-3),
    vm_training=TrainConfig(epochs=1, batch_size=256, learning_rate=3e-3),
    coverages=(1.0,),
)
ONE_SPLIT = ProtocolConfig(train_ends=(0.8,), prev_fm_fractions=(0.75,), bootstrap_replicates=100)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread, as the protocol runs: repeatable, and faster on a shared machine."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def tiny() -> InteractionDataset:
    return load_dataset("synthetic", "tiny", 0)


@pytest.fixture(scope="module")
def small() -> InteractionDataset:
    return generate(SyntheticConfig(num_users=40, num_items=30, num_categories=4, days=2.0))


def _reference_history(
    ds: InteractionDataset, user: int, item: int, at: pd.Timestamp
) -> list[float]:
    """The counters by a plain loop over the log: events of ``user`` strictly before ``at``."""
    log = ds.interactions
    cat_of = dict(zip(ds.items[ITEM_ID], ds.items["category"], strict=True))
    past = log[(log[USER_ID] == user) & (log[EVENT_TIMESTAMP] < at)].sort_values(
        EVENT_TIMESTAMP, kind="stable"
    )
    labels = past["click"].tolist()
    same = past[past[ITEM_ID].map(cat_of) == cat_of[item]]["click"].tolist()

    def share(values: list[int], k: int) -> float:
        last = values[-k:] if values else []
        return (sum(last) + 0.5) / (len(last) + 1.0)

    hours = (at - past[EVENT_TIMESTAMP].iloc[-1]).total_seconds() / 3600 if len(past) else 720.0
    return [
        share(labels, 5),
        share(labels, 32),
        float(np.log1p(len(labels))),
        float(np.log1p(hours)),
        share(same, 8),
        float(np.log1p(len(same))),
    ]


def test_history_counters_match_a_loop_over_events_strictly_before_the_row(
    small: InteractionDataset,
) -> None:
    log = small.interactions
    rows = log.sample(60, random_state=3)
    got = StreamingHistory(small).for_log(rows).numpy()
    assert got.shape == (60, len(HISTORY_FEATURES))
    for k, (_, row) in enumerate(rows.iterrows()):
        want = _reference_history(small, row[USER_ID], row[ITEM_ID], row[EVENT_TIMESTAMP])
        np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=1e-5)


def test_shuffling_labels_from_the_row_on_leaves_history_unchanged_and_a_planted_leak_shows(
    tiny: InteractionDataset,
) -> None:
    log = tiny.interactions
    rng = np.random.default_rng(1)
    # One pivot row per user; every label of that user from the pivot's time on is shuffled
    # (history is per user, so users do not disturb each other's pivots).
    pivots = log.groupby(USER_ID, sort=False).sample(1, random_state=2)
    pivot_at = log[USER_ID].map(pivots.set_index(USER_ID)[EVENT_TIMESTAMP])
    future = (log[EVENT_TIMESTAMP] >= pivot_at).to_numpy()
    shuffled_log = log.copy()
    for column in tiny.label_columns:
        shuffled_log.loc[future, column] = rng.permutation(log.loc[future, column].to_numpy())
    shuffled = tiny.with_interactions(shuffled_log)
    users, items = pivots[USER_ID].to_numpy(), pivots[ITEM_ID].to_numpy()

    def features(ds: InteractionDataset, when: pd.Series) -> np.ndarray:
        return StreamingHistory(ds).features(users, items, when).numpy()

    times = pivots[EVENT_TIMESTAMP]
    np.testing.assert_array_equal(features(tiny, times), features(shuffled, times))
    # Positive control: the same counters read one second after the row (a planted leak of the
    # row's own label) do change under the same shuffle, so the check above can see a leak.
    late = times + pd.Timedelta(seconds=1)
    leaked = np.abs(features(tiny, late) - features(shuffled, late)).max(axis=1) > 0
    assert leaked.mean() > 0.15, leaked.mean()


def _one_split(
    data: InteractionDataset,
) -> tuple[_World, np.ndarray, np.ndarray, pd.DataFrame, pd.DataFrame]:
    """The protocol's world over ``data`` and one split (train to 0.8 of the span, test the next
    0.1): the masks and the two logs, reindexed."""
    world = _World(data, FAST)
    train_rows, test_rows = _split(data.interactions, 0.8, 0.1)
    log = data.interactions
    train_log = log.loc[train_rows].reset_index(drop=True)
    return world, train_rows, test_rows, train_log, log.loc[test_rows].reset_index(drop=True)


@pytest.fixture(scope="module")
def trained(tiny: InteractionDataset) -> dict[str, Any]:
    world, train_rows, test_rows, train_log, test_log = _one_split(tiny)
    fm = _fit_fm(world, train_log, 0, FAST)
    compressor = _fit_compressor(fm, world.fm_featurizer.for_log(train_log), 0, FAST)
    return {
        "world": world,
        "train_rows": train_rows,
        "test_rows": test_rows,
        "train_log": train_log,
        "test_log": test_log,
        "fm": fm,
        "compressor": compressor,
    }


@pytest.mark.parametrize("mode", [3600, TIER_MIX_MODE])
def test_served_z_is_never_newer_than_its_round(trained: dict[str, Any], mode: int | str) -> None:
    log: pd.DataFrame = trained["test_log"]
    eligible = np.ones(len(log), dtype=bool)
    z, tier, computed = served_z(
        trained["world"], log, eligible, trained["fm"], trained["compressor"], mode, ONE_SPLIT, 0
    )
    request = log[EVENT_TIMESTAMP].astype("int64").to_numpy() / 1e9
    rounds = request - np.mod(request, 3600)
    served = tier.numpy() != int(Tier.ZERO)
    assert served.mean() > (0.99 if mode == 3600 else 0.1)
    assert (computed[served] <= rounds[served]).all()
    assert np.isnan(computed[~served]).all()
    assert (z[~torch.from_numpy(served)] == 0).all()
    if mode == 3600:
        # The value is the FM's as of the round: the pair's own later events change nothing.
        world = trained["world"]
        h, _ = foundation_outputs(trained["fm"], world.fm_inputs(log, 3600))
        h_now, _ = foundation_outputs(trained["fm"], world.fm_featurizer.for_log(log))
        assert not torch.allclose(h, h_now)  # rounds lag the requests: the check is not vacuous
        assert computed[served].max() < request.max()


def test_served_z_past_its_ttl_is_not_served(trained: dict[str, Any]) -> None:
    log: pd.DataFrame = trained["test_log"]
    short = ONE_SPLIT.model_copy(update={"pair_ttl_seconds": 600.0})
    eligible = np.ones(len(log), dtype=bool)
    _, tier, _ = served_z(
        trained["world"], log, eligible, trained["fm"], trained["compressor"], 3600, short, 0
    )
    request = log[EVENT_TIMESTAMP].astype("int64").to_numpy() / 1e9
    age = request - (request - np.mod(request, 3600))
    served = tier.numpy() != int(Tier.ZERO)
    assert not served[age > 600 + short.resolve_bucket_seconds].any()
    assert served[age <= 600 - short.resolve_bucket_seconds].all()


def test_denominator_is_the_full_span_fm(trained: dict[str, Any]) -> None:
    world = trained["world"]
    weights = {"kd": 0.5, "label_smoothing": 0.5}
    probs = _contenders(
        world, trained["train_rows"], trained["test_rows"], 0.75, weights, 0, FAST, ONE_SPLIT
    )
    _, p_full = foundation_outputs(trained["fm"], world.fm_featurizer.for_log(trained["test_log"]))
    np.testing.assert_allclose(probs["fm"], p_full.numpy(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("fm_rows", ["zero", "own_tier"])
def test_served_vms_train_the_fm_rows_under_the_tier_the_config_names(
    small: InteractionDataset, fm_rows: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The z VM and the zero-z control train on the previous-window FM's rows with tier ZERO
    (``zero``) or the training-only FM-span tier (``own_tier``), and on the rows after the cut
    with what was served; nothing else changes between the two."""
    import solaris_feast.evaluation.transfer_protocol as protocol

    seen: list[torch.Tensor] = []
    fit_vm = protocol._fit_vm

    def recording(*args: Any, **kwargs: Any) -> Any:
        tier = args[6] if len(args) > 6 else kwargs.get("tier")
        if tier is not None:
            seen.append(tier.clone())
        return fit_vm(*args, **kwargs)

    monkeypatch.setattr(protocol, "_fit_vm", recording)
    world, _, _, train_log, test_log = _one_split(small)
    cfg = ONE_SPLIT.model_copy(update={"fm_rows": fm_rows})
    out = _served_vm_probabilities(
        world,
        train_log,
        test_log,
        0.75,
        0,
        FAST,
        cfg,
        [3600],
        with_control=True,
    )
    assert set(out) == {"vm_z@3600", "vm_zero_z"}
    assert len(seen) == 2  # the z VM, then the control: the same tiers
    torch.testing.assert_close(seen[0], seen[1])
    fm_span = earliest_rows(train_log, 0.75)
    tiers = seen[0].numpy()
    expected = FM_SPAN_TIER if fm_rows == "own_tier" else int(Tier.ZERO)
    assert (tiers[fm_span] == expected).all()
    assert (tiers[~fm_span] != FM_SPAN_TIER).all()
    assert (tiers[~fm_span] == int(Tier.EXACT)).mean() > 0.9


@pytest.mark.parametrize("fm_inputs", ["request", "round"])
def test_the_serving_fm_trains_on_the_inputs_the_config_names(
    small: InteractionDataset, fm_inputs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The previous-window FM, the one that serves z, and its compressor train on each row's
    history as of the row (``request``) or as of the hourly round it would be served from
    (``round``); the full-span FM, the denominator, reads as of the request either way."""
    import solaris_feast.evaluation.transfer_protocol as protocol

    fm_batches: list[PairBatch] = []
    compressor_batches: list[PairBatch] = []
    fit_fm, fit_compressor = protocol._fit_fm, protocol._fit_compressor

    def recording_fm(world: Any, log: Any, seed: int, mc: Any, batch: Any = None) -> Any:
        fm_batches.append(world.fm_batch(log) if batch is None else batch)
        return fit_fm(world, log, seed, mc, batch)

    def recording_compressor(fm: Any, batch: PairBatch, seed: int, mc: Any) -> Any:
        compressor_batches.append(batch)
        return fit_compressor(fm, batch, seed, mc)

    monkeypatch.setattr(protocol, "_fit_fm", recording_fm)
    monkeypatch.setattr(protocol, "_fit_compressor", recording_compressor)
    world, train_rows, test_rows, train_log, test_log = _one_split(small)
    cfg = ONE_SPLIT.model_copy(update={"fm_inputs": fm_inputs})
    _served_vm_probabilities(world, train_log, test_log, 0.75, 0, FAST, cfg, [3600])
    prev_log = train_log.loc[earliest_rows(train_log, 0.75)]
    as_of_row = world.fm_batch(prev_log)
    as_of_round = world.fm_inputs(prev_log, 3600)
    # The two readings differ (events within the hour before a row), so the check can fail.
    assert not torch.equal(as_of_row.hist_item, as_of_round.hist_item)
    expected = as_of_round if fm_inputs == "round" else as_of_row
    [fm_batch] = fm_batches
    [compressor_batch] = compressor_batches
    for seen in (fm_batch, compressor_batch):
        for name in ("user_id", "item_id", "hist_item", "hist_age", "hist_mask"):
            torch.testing.assert_close(getattr(seen, name), getattr(expected, name))

    fm_batches.clear()
    _contenders(
        world, train_rows, test_rows, 0.75, {"kd": 0.5, "label_smoothing": 0.5}, 0, FAST, cfg
    )
    full_span = world.fm_batch(train_log)
    torch.testing.assert_close(fm_batches[0].hist_item, full_span.hist_item)
    torch.testing.assert_close(fm_batches[0].hist_age, full_span.hist_age)


@pytest.fixture(scope="module")
def protocol_record(tiny: InteractionDataset) -> dict[str, Any]:
    return run_protocol(tiny, [0], FAST, ONE_SPLIT)


def test_protocol_record_has_the_issue_keys(protocol_record: dict[str, Any]) -> None:
    protocol = protocol_record["protocol"]
    keys = {
        "tr_served",
        "tr_served_ci95",
        "tr_kd_served",
        "tr_kd_served_ci95",
        "tr_label_smoothing",
        "tr_by_staleness",
    }
    assert set(protocol) == keys | {"per_task", "per_split"}
    assert list(protocol["per_task"]) == ["click", "conversion"]  # main task first
    assert protocol["tr_served"] == protocol["per_task"]["click"]["tr_served"]
    assert set(protocol["tr_by_staleness"]) == {"0", "3600"}
    assert keys <= set(protocol["per_split"][0])
    lo, hi = protocol["tr_served_ci95"]
    assert lo <= protocol["tr_served"] <= hi
    # z's content over the zero-z control shares TR's denominator, so the gaps add up.
    details = protocol_record["details"]
    content = details["tr_served_over_zero_z_control"]
    assert abs(content - (protocol["tr_served"] - details["tr_zero_z_control"])) < 1e-3
    lo, hi = details["tr_served_over_zero_z_control_ci95"]
    assert lo <= content <= hi


def test_pooled_worlds_report_each_world_as_alone_and_the_pool_between_them() -> None:
    """Two draws of a world pooled: each world's own figure is what the protocol gives on it
    alone, and the pooled ratio of means (summed gaps over summed FM gaps) lies between them."""
    worlds = {
        f"data_seed={s}": generate(
            SyntheticConfig(num_users=40, num_items=30, num_categories=4, days=2.0, seed=s)
        )
        for s in (0, 1)
    }
    pooled: dict[str, Any] = run_protocol_pooled(worlds, [0], FAST, ONE_SPLIT)
    protocol = pooled["protocol"]
    assert pooled["details"]["worlds"] == list(worlds)
    assert [s["world"] for s in protocol["per_split"]] == list(worlds)
    assert [s["split"] for s in protocol["per_split"]] == [0, 1]
    alone: list[Any] = [
        run_protocol(ds, [0], FAST, ONE_SPLIT)["protocol"] for ds in worlds.values()
    ]
    for name, solo in zip(worlds, alone, strict=True):
        assert protocol["per_world"][name]["tr_served"] == solo["tr_served"]
        assert protocol["per_world"][name]["tr_kd_served"] == solo["tr_kd_served"]
    one, two = sorted(solo["tr_served"] for solo in alone)
    assert one < two, alone  # two worlds that differ, or the bound below says nothing
    assert one <= protocol["tr_served"] <= two
    assert "world" not in alone[0]["per_split"][0] and "per_world" not in alone[0]


def test_soft_label_weights_are_chosen_on_the_validation_window(
    protocol_record: dict[str, Any],
) -> None:
    """KD's and the control's weights are each the grid point with the lowest validation NE;
    the test window never enters the choice (the scores are from the training window's tail)."""
    [split] = protocol_record["protocol"]["per_split"]
    [scores] = protocol_record["details"]["validation_ne_soft_label_weights"]
    for name, key in (("kd", "kd_weight"), ("label_smoothing", "label_smoothing_weight")):
        assert set(scores[name]) == {"0.25", "0.5", "0.75"}
        assert str(split[key]) == min(scores[name], key=scores[name].__getitem__)


def test_vm_reads_served_z(protocol_record: dict[str, Any]) -> None:
    protocol, details = protocol_record["protocol"], protocol_record["details"]
    ne = details["ne_mean"]
    # z's content, not the tier beside it: the control gets the same tiers with zero vectors.
    # A VM fed zeros for z sits at the control, and this fails.
    gap = ne["vm"]["click"] - ne["fm"]["click"]
    assert ne["vm_z@0"]["click"] < ne["vm_zero_z"]["click"] - 0.3 * gap, ne
    assert protocol["tr_by_staleness"]["0"] > details["tr_zero_z_control"] + 0.3, protocol


def test_clustered_ne_with_unit_weights_is_the_row_ne() -> None:
    rng = np.random.default_rng(0)
    users = rng.integers(0, 30, 500)
    p = rng.uniform(0.05, 0.95, 500)
    y = (rng.random(500) < 0.3).astype(float)
    _, inv = np.unique(users, return_inverse=True)
    loss = np.bincount(inv, weights=row_log_loss(p, y))
    rows, pos = np.bincount(inv), np.bincount(inv, weights=y)
    got = clustered_normalized_entropy(loss, rows, pos, np.ones((1, len(rows))))
    assert got[0] == pytest.approx(normalized_entropy(p, y)[0], rel=1e-12)
    weights = cluster_bootstrap_weights(rng, len(rows), 200)
    assert (weights.sum(axis=1) == len(rows)).all()
    spread = clustered_normalized_entropy(loss, rows, pos, weights)
    assert spread.std() > 0
    interval = ratio_of_means_interval(np.full((200, 2), 1.0), np.full((200, 2), 2.0))
    assert interval == pytest.approx((0.5, 0.5))


def test_a_replicate_that_draws_no_row_has_no_ne_and_fails_its_interval_quietly() -> None:
    # Two clusters: one with rows, one without (a cold user with no test row in the split).
    loss, rows, pos = np.array([3.0, 0.0]), np.array([5.0, 0.0]), np.array([2.0, 0.0])
    weights = np.array([[2, 0], [0, 2], [1, 1]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's divide warning would reach the console
        ne = clustered_normalized_entropy(loss, rows, pos, weights)
    assert np.isfinite(ne[[0, 2]]).all() and np.isnan(ne[1])
    assert ne[0] == pytest.approx(ne[2])
    # The NaN replicate's gain is no gain: with it in more than 5% of replicates, no interval.
    gains = np.stack([ne, ne], axis=1) - 0.5
    assert ratio_of_means_interval(gains, gains) is None
