"""The surfaces world (issue 14, item 5): successor patterns and surfaces are really planted,
the presets' logs do not move, and the protocol keeps the VM on its own surface."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from solaris_feast.data.datasets import SYNTHETIC_PRESETS, load_dataset
from solaris_feast.data.schema import EVENT_TIMESTAMP, ITEM_ID, USER_ID, InteractionDataset
from solaris_feast.data.synthetic import (
    STRUCTURE_ABLATIONS,
    SURFACE,
    SURFACES_WORLD,
    SyntheticConfig,
    _generate_successors,
    generate,
)
from solaris_feast.evaluation.transfer import TransferConfig
from solaris_feast.evaluation.transfer_protocol import (
    ProtocolConfig,
    _World,
    protocol_for,
    run_protocol,
    torch_threads,
)
from solaris_feast.models.features import PairFeaturizer
from solaris_feast.models.training import TrainConfig

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

SMALL = SyntheticConfig(num_users=120, num_items=80, num_categories=6, days=2.0)
SEQUENTIAL = SMALL.model_copy(update={"successors_per_item": 3})
SURFACES = SMALL.model_copy(update={"num_surfaces": 3})
TRIGGER_GAP_SECONDS = 1200
"""Clicks at least this long before an impression count as triggers in the reference below: the
generator's triggers are the last clicks before the session, and sessions last 320 s here."""


def _successor_flags(ds: InteractionDataset, successors: np.ndarray, memory: int) -> np.ndarray:
    """Per row of the user-then-time ordered log: is its item a successor of one of the user's
    last ``memory`` clicks at least :data:`TRIGGER_GAP_SECONDS` before it (a plain loop)."""
    log = ds.interactions.sort_values([USER_ID, EVENT_TIMESTAMP], kind="stable")
    users = log[USER_ID].to_numpy()
    items = log[ITEM_ID].to_numpy()
    clicks = log["click"].to_numpy()
    seconds = log[EVENT_TIMESTAMP].astype("int64").to_numpy() // 10**9
    flags = np.zeros(len(log), dtype=bool)
    for user in np.unique(users):
        rows = np.flatnonzero(users == user)
        for j in rows:
            before = rows[(seconds[rows] <= seconds[j] - TRIGGER_GAP_SECONDS) & (clicks[rows] == 1)]
            triggers = items[before[-memory:]]
            flags[j] = bool(len(triggers)) and bool(np.isin(items[j], successors[triggers]).any())
    return flags


def _ordered_clicks(ds: InteractionDataset) -> np.ndarray:
    log = ds.interactions.sort_values([USER_ID, EVENT_TIMESTAMP], kind="stable")
    return log["click"].to_numpy()


def test_the_options_off_leave_the_presets_log_as_it_was() -> None:
    tiny = load_dataset("synthetic", "tiny", 0)
    log = tiny.interactions
    # Pinned from the generator before the structures were added.
    seconds = (log[EVENT_TIMESTAMP] - log[EVENT_TIMESTAMP].min()).dt.total_seconds()
    assert len(log) == 16670
    assert int(log[ITEM_ID].sum()) == 1344197 and int(log[USER_ID].sum()) == 2528820
    assert int(log["click"].sum()) == 6340 and int(log["conversion"].sum()) == 1727
    assert int(seconds.to_numpy(np.int64).sum()) == 2142492820
    assert SURFACE not in log.columns
    assert "num_surfaces" not in tiny.metadata["config"]  # type: ignore[operator]
    neither = generate(STRUCTURE_ABLATIONS["neither"])
    assert neither.interactions.equals(log)


def test_a_world_on_the_tiny_preset_is_its_ablation_config() -> None:
    for world, config in STRUCTURE_ABLATIONS.items():
        ds = load_dataset("synthetic", "tiny", 0, world=world)
        assert ds.interactions.equals(generate(config).interactions), world
    assert STRUCTURE_ABLATIONS["both"] == SURFACES_WORLD
    bigger = load_dataset("synthetic", "tiny", 0, world="surfaces")
    assert SYNTHETIC_PRESETS["tiny"].num_surfaces == 1 and SURFACE in bigger.interactions.columns
    with pytest.raises(ValueError, match="world"):
        load_dataset("synthetic", "tiny", 0, world="sideways")


def test_successors_lie_in_other_categories() -> None:
    ds = generate(SEQUENTIAL)
    category = ds.items["category"].to_numpy()
    successors = _generate_successors(SEQUENTIAL, category)
    assert successors is not None and successors.shape == (SMALL.num_items, 3)
    assert (category[successors] != category[:, None]).all()


def test_a_click_raises_the_engagement_of_its_successors_later() -> None:
    """Against the same world with a zero boost (exposure alike), impressions of a trigger's
    successors are clicked far more often; the rest of the log barely moves."""
    boosted = generate(SEQUENTIAL)
    flat = generate(SEQUENTIAL.model_copy(update={"successor_boost": 0.0}))
    successors = _generate_successors(SEQUENTIAL, boosted.items["category"].to_numpy())
    assert successors is not None
    ctr = {}
    for name, ds in (("boosted", boosted), ("flat", flat)):
        flags = _successor_flags(ds, successors, SEQUENTIAL.successor_memory)
        clicks = _ordered_clicks(ds)
        assert flags.mean() > 0.1, (name, flags.mean())  # successors are shown
        ctr[name] = (clicks[flags].mean(), clicks[~flags].mean())
    assert ctr["boosted"][0] > ctr["flat"][0] + 0.15, ctr
    assert ctr["boosted"][0] > ctr["boosted"][1] + 0.05, ctr
    assert abs(ctr["boosted"][1] - ctr["flat"][1]) < 0.05, ctr


def test_surfaces_are_present_and_each_keeps_the_base_session_rate() -> None:
    base = generate(SMALL).interactions
    log = generate(SURFACES).interactions
    assert set(log[SURFACE].unique()) == {0, 1, 2}
    # Each surface has the base session rate; every user has one session more than the Poisson
    # draw, once in the base world and once over all surfaces.
    mean = SMALL.sessions_per_day * SMALL.days
    expected = len(base) * (3 * mean + 1) / 3 / (mean + 1)
    per_surface = log[SURFACE].value_counts().to_numpy()
    assert (np.abs(per_surface / expected - 1.0) < 0.15).all(), (per_surface, expected)
    # One session, one surface: a user's impressions 20 s apart share it.
    ordered = log.sort_values([USER_ID, EVENT_TIMESTAMP], kind="stable")
    gap = ordered.groupby(USER_ID)[EVENT_TIMESTAMP].diff().dt.total_seconds()
    same_session = (gap == SMALL.seconds_between_impressions).to_numpy()
    changed = (ordered.groupby(USER_ID)[SURFACE].diff() != 0).to_numpy()
    assert same_session.sum() > 0.8 * len(log)
    assert (changed[same_session]).mean() < 0.01


FAST = TransferConfig(
    history_len=4,
    fm_training=TrainConfig(epochs=1, batch_size=256, learning_rate=2e-3),
    compressor_training=TrainConfig(epochs=1, batch_size=512, learning_rate=1e-3),
    vm_training=TrainConfig(epochs=1, batch_size=256, learning_rate=3e-3),
    coverages=(1.0,),
)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


def test_vm_counters_read_their_own_surface_and_the_fm_history_every_surface() -> None:
    ds = generate(SURFACES)
    log = ds.interactions
    other = (log[SURFACE] != 0).to_numpy()
    flipped_log = log.copy()
    flipped_log.loc[other, "click"] = 1 - flipped_log.loc[other, "click"]
    world = _World(ds, FAST, vm_surface=0)
    flipped = _World(ds.with_interactions(flipped_log), FAST, vm_surface=0)
    own = world.vm_log(log)
    assert (own[SURFACE] == 0).all() and len(own) == int((~other).sum())
    vm, vm_flipped = world.vm_inputs(own), flipped.vm_inputs(world.vm_log(flipped_log))
    assert vm.user_dense.equal(vm_flipped.user_dense)
    fm, fm_flipped = world.fm_inputs(own, 3600), flipped.fm_inputs(own, 3600)
    assert not fm.hist_label.equal(fm_flipped.hist_label)


def test_protocol_tests_the_vm_on_its_surface_only() -> None:
    ds = generate(SMALL.model_copy(update={"num_users": 30, "days": 1.5, "num_surfaces": 3}))
    one = ProtocolConfig(
        train_ends=(0.8,),
        prev_fm_fractions=(0.75,),
        soft_label_weights=(0.5,),
        bootstrap_replicates=20,
        vm_surface=0,
    )
    record = run_protocol(ds, [0], FAST, one)
    details = record["details"]
    assert details["vm_surface"] == 0  # type: ignore[index]
    log = ds.interactions
    ts = log[EVENT_TIMESTAMP]
    cut = ts.min() + (ts.max() - ts.min()) * 0.8
    stop = ts.min() + (ts.max() - ts.min()) * 0.9
    window = (ts >= cut) & (ts <= stop)
    warm_cold = details["warm_cold"]  # type: ignore[index]
    tested = warm_cold["warm"]["test_rows"] + warm_cold["cold"]["test_rows"]
    assert tested == int((window & (log[SURFACE] == 0)).sum()) < int(window.sum())
    with pytest.raises(ValueError, match="surface"):
        run_protocol(generate(SMALL), [0], FAST, one)


def test_own_surface_fm_history_reads_the_rows_surface_only() -> None:
    ds = generate(SURFACES)
    log = ds.interactions
    world = _World(ds, FAST, vm_surface=0, fm_history="own_surface")
    rows = log.iloc[len(log) // 2 :].reset_index(drop=True)
    batch = world.fm_inputs(rows, 3600)
    at = rows[EVENT_TIMESTAMP].dt.floor("3600s")
    for surface in range(3):
        # Reference: a featurizer over that surface's events alone, row by row of the surface.
        on = np.flatnonzero((rows[SURFACE] == surface).to_numpy())
        ref = PairFeaturizer(
            ds.with_interactions(log.loc[(log[SURFACE] == surface).to_numpy()]), FAST.history_len
        ).batch(rows[USER_ID].to_numpy()[on], rows[ITEM_ID].to_numpy()[on], at.iloc[on])
        for name in ("user_id", "item_id", "hist_item", "hist_label", "hist_age", "item_cat"):
            assert getattr(batch, name)[on].equal(getattr(ref, name)), (surface, name)
    # The other surfaces' engagement does not reach the FM's inputs on surface 0 (with every
    # surface's history it does: test_vm_counters_read_their_own_surface_...).
    other = (log[SURFACE] != 0).to_numpy()
    flipped_log = log.copy()
    flipped_log.loc[other, "click"] = 1 - flipped_log.loc[other, "click"]
    flipped = _World(ds.with_interactions(flipped_log), FAST, 0, "own_surface")
    own = world.vm_log(log)
    assert world.fm_inputs(own, 3600).hist_label.equal(flipped.fm_inputs(own, 3600).hist_label)


def test_protocol_for_gives_a_log_with_surfaces_the_vm_surface() -> None:
    with_surfaces, plain = generate(SURFACES), generate(SMALL)
    assert protocol_for(with_surfaces).vm_surface == 0
    assert protocol_for(plain).vm_surface is None
    own = protocol_for(with_surfaces, "own_surface", ProtocolConfig(vm_surface=2))
    assert (own.vm_surface, own.fm_history) == (2, "own_surface")
    with pytest.raises(ValueError, match="surfaces"):
        protocol_for(plain, "own_surface")
