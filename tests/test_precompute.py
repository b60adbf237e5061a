"""The precompute worker against real models, the real write path and the real retriever."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pytest
import torch

from solaris_feast.data.schema import InteractionDataset
from solaris_feast.data.synthetic import SyntheticConfig, generate
from solaris_feast.models.compressor import CompressorConfig
from solaris_feast.models.features import PairFeaturizer
from solaris_feast.models.foundation import FoundationConfig
from solaris_feast.models.interface import ChainModels, PairsAsOf
from solaris_feast.models.registry import ModelBundle, register_untrained_chain
from solaris_feast.pipeline.runs import round_process_settings
from solaris_feast.precompute.compute import CollectingSink, compute_pair_embeddings, run_precompute
from solaris_feast.precompute.plan import Plan, plan_precompute, shard
from solaris_feast.serving.retriever import SolarisRetriever
from solaris_feast.store.config import open_store
from solaris_feast.store.definitions import solaris_definitions
from solaris_feast.store.write import EmbeddingWriter
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from feast import FeatureStore

TASKS = ("click", "conversion")


@pytest.fixture(scope="module")
def dataset() -> InteractionDataset:
    return generate(SyntheticConfig(num_users=60, num_items=50, num_categories=5, days=1.0))


@pytest.fixture(scope="module")
def bundle(dataset: InteractionDataset, tmp_path_factory: pytest.TempPathFactory) -> ModelBundle:
    """Seeded, untrained models registered and loaded the way serving loads them: precompute
    only needs deterministic forward passes, not good ones."""
    schema = PairFeaturizer(dataset, history_len=8).schema
    torch.manual_seed(0)
    return register_untrained_chain(
        tmp_path_factory.mktemp("models"),
        schema,
        TASKS,
        FoundationConfig(embed_dim=16, num_heads=2, hidden_dim=32, representation_dim=24),
        CompressorConfig(input_dim=24, code_dim=8, hidden_dim=16),
    )


def _plan(dataset: InteractionDataset, budget: int, seed: int = 0) -> Plan:
    rng = np.random.default_rng(seed)
    candidates = pd.DataFrame(
        {
            "user_id": rng.integers(0, dataset.num_users, 300).astype(np.int64),
            "item_id": rng.integers(0, dataset.num_items, 300).astype(np.int64),
            "verifier_score": rng.random(300),
        }
    ).drop_duplicates(["user_id", "item_id"])
    # Planned "now" on the wall clock, so the retriever finds the rows fresh.
    now = pd.Timestamp.now(tz="UTC").floor("s")
    return plan_precompute(candidates, None, None, budget, now, 6 * 3600, 3600, 0.5)


def _reference(bundle: ModelBundle, featurizer: PairFeaturizer, plan: Plan) -> np.ndarray:
    """z straight from the modules, one forward pass over the whole plan."""
    batch = featurizer.batch(
        plan.pairs["user_id"].to_numpy(), plan.pairs["item_id"].to_numpy(), plan.planned_at
    )
    with torch.inference_mode():
        return bundle.compressor.encode(bundle.fm.representation(batch)).numpy()


@pytest.fixture(params=["sqlite", "redis"])
def store(
    request: pytest.FixtureRequest, feast_project: str, tmp_path: Path, redis_url: str
) -> FeatureStore:
    from solaris_feast.store.definitions import SolarisFeastConfig

    feast_store = open_store(feast_project, tmp_path, online=request.param, redis_url=redis_url)
    feast_store.apply(solaris_definitions(SolarisFeastConfig(embedding_dim=8)).all())
    return feast_store


def test_precomputed_pairs_are_served_exact_with_the_models_vectors(
    store: FeatureStore, dataset: InteractionDataset, bundle: ModelBundle
) -> None:
    featurizer = PairFeaturizer(dataset, history_len=8)
    plan = _plan(dataset, budget=40)
    writer = EmbeddingWriter(store, "solaris_pair")
    try:
        stats = run_precompute(
            plan, ChainModels.reference(bundle, featurizer), dataset, writer, batch_size=16
        )
    finally:
        writer.close()
    assert (stats.pairs, stats.batches) == (40, 3)
    assert stats.model_version == bundle.embedding_version
    expected = _reference(bundle, featurizer, plan)

    retriever = SolarisRetriever(
        store, bundle.embedding_version, record_misses=False, deadline_ms=5000
    )
    try:
        for user, rows in plan.pairs.groupby("user_id").groups.items():
            items = plan.pairs.loc[rows, "item_id"].to_numpy()
            unplanned = next(i for i in range(dataset.num_items) if i not in set(items))
            result = retriever.fetch(int(user), np.r_[items, unplanned])
            assert result.tiers[:-1].tolist() == [Tier.EXACT] * len(items)
            assert result.tiers[-1] == Tier.ZERO
            positions = [plan.pairs.index.get_loc(r) for r in rows]
            np.testing.assert_allclose(result.embeddings[:-1], expected[positions], atol=1e-6)
    finally:
        retriever.close()


def test_rerun_of_the_same_plan_writes_no_new_offline_rows(
    store: FeatureStore, dataset: InteractionDataset, bundle: ModelBundle
) -> None:
    featurizer = PairFeaturizer(dataset, history_len=8)
    plan = _plan(dataset, budget=20, seed=1)
    root = Path(str(store.config.repo_path), "data", "offline")
    for _ in range(2):  # a retried task
        writer = EmbeddingWriter(store, "solaris_pair", online=False)
        try:
            run_precompute(
                plan, ChainModels.reference(bundle, featurizer), dataset, writer, batch_size=8
            )
        finally:
            writer.close()
        files = sorted(root.rglob("*.parquet"))
        rows = sum(len(pd.read_parquet(f)) for f in files)
        assert rows == 20


def test_shards_run_by_separate_workers_write_what_one_worker_writes(
    dataset: InteractionDataset, bundle: ModelBundle
) -> None:
    featurizer = PairFeaturizer(dataset, history_len=8)
    plan = _plan(dataset, budget=90, seed=2)
    whole = CollectingSink()
    run_precompute(plan, ChainModels.reference(bundle, featurizer), dataset, whole, batch_size=32)
    parts = CollectingSink()
    for index in range(3):
        run_precompute(
            shard(plan, index, 3),
            ChainModels.reference(bundle, featurizer),
            dataset,
            parts,
            batch_size=7,
        )
    a = whole.rows().sort_values(["user_id", "item_id"]).reset_index(drop=True)
    b = parts.rows().sort_values(["user_id", "item_id"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(a.drop(columns="embedding"), b.drop(columns="embedding"))
    np.testing.assert_allclose(np.stack(a["embedding"]), np.stack(b["embedding"]), atol=1e-5)
    assert (a["computed_at"] == plan.planned_at).all()


def test_batched_embeddings_match_one_forward_pass_and_time_is_split(
    dataset: InteractionDataset, bundle: ModelBundle
) -> None:
    featurizer = PairFeaturizer(dataset, history_len=8)
    plan = _plan(dataset, budget=50, seed=3)
    pairs = PairsAsOf.of(plan.pairs["user_id"], plan.pairs["item_id"], plan.planned_at, dataset)
    z, featurize_s, fm_s = compute_pair_embeddings(
        ChainModels.reference(bundle, featurizer), pairs, batch_size=9
    )
    np.testing.assert_allclose(z, _reference(bundle, featurizer, plan), atol=1e-5)
    assert z.shape == (50, 8) and fm_s > 0 and featurize_s > 0

    stats = run_precompute(
        plan, ChainModels.reference(bundle, featurizer), dataset, CollectingSink(), batch_size=9
    )
    parts = stats.featurize_seconds + stats.fm_seconds + stats.write_seconds
    assert 0 < parts <= stats.wall_seconds
    assert 0.0 <= stats.non_fm_share < 1.0
    assert stats.pairs_per_second > 0
    assert stats.as_dict()["pairs"] == 50


class _OneAtATimeSink(CollectingSink):
    """Records each write, checks that no two calls overlap, fails on the ``fail_on``-th."""

    def __init__(self, fail_on: int | None = None) -> None:
        super().__init__()
        self.fail_on = fail_on
        self.calls = 0
        self.busy = threading.Lock()
        self.overlapped = False

    def write(self, frame: pd.DataFrame) -> int:
        if not self.busy.acquire(blocking=False):
            self.overlapped = True
            self.busy.acquire()
        try:
            self.calls += 1
            time.sleep(0.01)  # long enough that an overlapping call would be caught
            if self.calls == self.fail_on:
                raise ConnectionError(f"store down at write {self.calls}")
            return super().write(frame)
        finally:
            self.busy.release()


def test_overlapped_writes_reach_the_sink_one_at_a_time_in_batch_order(
    dataset: InteractionDataset, bundle: ModelBundle
) -> None:
    featurizer = PairFeaturizer(dataset, history_len=8)
    plan = _plan(dataset, budget=60, seed=4)
    chain = ChainModels.reference(bundle, featurizer)
    overlapped, sequential = _OneAtATimeSink(), _OneAtATimeSink()
    stats = run_precompute(plan, chain, dataset, overlapped, batch_size=7)
    run_precompute(plan, chain, dataset, sequential, batch_size=7, overlap_writes=False)
    assert not overlapped.overlapped and overlapped.calls == stats.batches == 9
    # The same frames in the same order as writing each batch before computing the next.
    assert [len(f) for f in overlapped.frames] == [len(f) for f in sequential.frames]
    a, b = overlapped.rows(), sequential.rows()
    pd.testing.assert_frame_equal(a.drop(columns="embedding"), b.drop(columns="embedding"))
    np.testing.assert_array_equal(np.stack(a["embedding"]), np.stack(b["embedding"]))
    assert stats.write_wait_seconds >= 0.0 and stats.write_seconds >= 9 * 0.01


@pytest.mark.parametrize("overlap_writes", [True, False])
def test_a_failed_write_stops_the_run_and_no_later_batch_is_written(
    dataset: InteractionDataset, bundle: ModelBundle, overlap_writes: bool
) -> None:
    featurizer = PairFeaturizer(dataset, history_len=8)
    plan = _plan(dataset, budget=60, seed=4)
    sink = _OneAtATimeSink(fail_on=2)
    with pytest.raises(ConnectionError, match="store down at write 2"):
        run_precompute(
            plan,
            ChainModels.reference(bundle, featurizer),
            dataset,
            sink,
            batch_size=7,
            overlap_writes=overlap_writes,
        )
    # The first batch is stored, the failed one is not, and nothing after it was attempted.
    assert sink.calls == 2 and [len(f) for f in sink.frames] == [7]


def test_bad_batch_size_is_refused(dataset: InteractionDataset, bundle: ModelBundle) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        run_precompute(
            _plan(dataset, 5), ChainModels.reference(bundle), dataset, CollectingSink(), 0
        )


def test_round_coverage_follows_the_serving_tier_rule(feast_project: str, tmp_path: Path) -> None:
    """The coverage a round reports is the retriever's rule applied to the stored rows: a vector
    exactly TTL old is fresh, one second older is not; another version, or a newer row of
    another version over the right one, is a miss; the best usable tier wins."""
    from solaris_feast.pipeline.coverage import served_tiers
    from solaris_feast.store.definitions import SolarisFeastConfig

    store = open_store(feast_project, tmp_path)
    config = SolarisFeastConfig(embedding_dim=8)
    store.apply(solaris_definitions(config).all())
    now = pd.Timestamp("2026-11-30T12:00:00Z")
    pair_ttl = config.pair_ttl_seconds
    version, other = "compressor-a", "compressor-b"

    def rows(keys: list[tuple[int, ...]], ages: list[float], versions: list[str]) -> pd.DataFrame:
        columns = ["user_id", "item_id"][: len(keys[0])]
        frame = pd.DataFrame(keys, columns=columns).astype("int64")
        frame["embedding"] = [np.full(8, 0.5, dtype=np.float32) for _ in keys]
        frame["model_version"] = versions
        frame["computed_at"] = [now - pd.Timedelta(seconds=a) for a in ages]
        return frame

    def write(view: str, frame: pd.DataFrame) -> None:
        writer = EmbeddingWriter(store, view, online=False)
        try:
            writer.write(frame)
        finally:
            writer.close()

    write(
        "solaris_pair",
        rows(
            [(0, 1), (0, 2), (0, 3), (1, 4)],
            [pair_ttl, pair_ttl + 1, 10, 100],
            [version, version, other, version],
        ),
    )
    write("solaris_pair", rows([(1, 4)], [50], [other]))  # newer, of another version
    write(
        "solaris_similar",
        rows([(0, 2), (1, 5)], [60, pair_ttl + 1], [version, version]).assign(
            neighbour_count=3, mean_distance=np.float32(0.2)
        ),
    )
    write("solaris_user", rows([(0,)], [60], [version]).assign(pair_count=4))
    pairs = pd.DataFrame(
        {"user_id": [0, 0, 0, 1, 1, 2], "item_id": [1, 2, 3, 4, 5, 6]}, dtype="int64"
    )
    tiers = served_tiers(store, pairs, now, version)
    assert tiers.tolist() == [
        Tier.EXACT,  # exactly TTL old: still served
        Tier.SIMILAR,  # exact one second past its TTL
        Tier.USER_AGG,  # exact of another version
        Tier.ZERO,  # the newest exact row is of another version; no user row
        Tier.ZERO,  # similar past its TTL
        Tier.ZERO,  # nothing stored
    ]


def test_round_tasks_run_with_fewer_collections_and_put_the_thresholds_back() -> None:
    import gc

    from solaris_feast.pipeline import precompute
    from solaris_feast.pipeline.runs import ROUND_GC_THRESHOLDS

    before = gc.get_threshold()
    seen: list[tuple[int, ...]] = []

    @round_process_settings()
    def task() -> None:
        seen.append(gc.get_threshold())
        raise RuntimeError("the task failed")

    with pytest.raises(RuntimeError):
        task()
    assert seen == [ROUND_GC_THRESHOLDS]
    assert gc.get_threshold() == before
    # The round's heavy tasks carry it (the wrapper keeps the task's name for Airflow's logs).
    for name in ("rank_shard", "precompute_shard", "aggregate_users", "fill_similar"):
        function = getattr(precompute, name)
        assert function.__name__ == name
        assert hasattr(function, "__wrapped__"), f"{name} runs with the default thresholds"


@pytest.mark.skipif(
    not Path("/proc/self/statm").exists() or platform.libc_ver()[0] != "glibc",
    reason="glibc's allocator settings, read through /proc",
)
def test_a_round_process_keeps_freed_tensor_memory_for_the_next_batch() -> None:
    """With glibc's defaults a freed 16 MiB block goes back to the kernel (the next batch pays
    its page faults again); after keep_freed_memory it stays with the process. Fresh processes:
    the pytest process's own thresholds have moved with what ran before."""
    probe = textwrap.dedent(
        """
        import sys
        import numpy as np
        from solaris_feast.pipeline.runs import keep_freed_memory
        if sys.argv[1] == "keep":
            assert keep_freed_memory()
        def rss():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * 4096
        block = np.ones(16 << 20, dtype=np.uint8)  # every page touched
        held = rss()
        del block
        print(held - rss())
        """
    )
    returned = {
        mode: int(
            subprocess.run(
                [sys.executable, "-c", probe, mode],
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            ).stdout
        )
        for mode in ("default", "keep")
    }
    assert returned["default"] >= 12 << 20
    assert returned["keep"] < 1 << 20


def test_the_round_bench_runs_a_whole_round_and_gives_the_fill_the_targets_asked_for() -> None:
    """The bench behind the non-FM share runs every stage of a round through the real writer
    (SQLite here) and plans the budget; the fill gets the DAG's default number of targets (its
    multiple of the planned pairs) unless told otherwise, and the share is the stages' seconds
    it names, not a figure of its own."""
    from solaris_feast.bench import run_round_benchmark
    from solaris_feast.pipeline.settings import PrecomputeSettings
    from solaris_feast.precompute.similarity import fill_target_count

    default = run_round_benchmark(size="tiny", online="sqlite", threads=1)
    few = run_round_benchmark(size="tiny", online="sqlite", threads=1, fill_targets=100)

    assert default["planned_pairs"] == round(0.1 * default["candidate_pairs"]) > 0
    dag_multiple = PrecomputeSettings.model_fields["fill_targets_per_budget"].default
    assert default["fill_targets"] == fill_target_count(default["planned_pairs"], dag_multiple)
    assert 0 < default["similar_rows"] <= default["fill_targets"]
    assert few["fill_targets"] == 100 and 0 < few["similar_rows"] <= 100
    assert few["user_rows"] == default["user_rows"] > 0
    for record in (default, few):
        seconds = record["seconds"]
        assert all(value >= 0 for value in seconds.values())
        fm = seconds["featurize"] + seconds["fm"]
        outside = sum(
            seconds[k]
            for k in ("plan", "pair_writes", "aggregate", "user_writes", "fill", "similar_writes")
        )
        # The record's seconds are rounded to the millisecond.
        assert record["non_fm_share"] == pytest.approx(outside / (outside + fm), abs=5e-3)
        assert record["round_seconds"] == pytest.approx(outside + fm, abs=5e-3)


def test_the_rounds_writers_take_their_transactions_from_the_settings(
    tmp_path: Path, feast_project: str
) -> None:
    from test_dags import make_feature_repo

    from solaris_feast.pipeline.precompute import open_run_writer
    from solaris_feast.pipeline.settings import PrecomputeSettings
    from solaris_feast.store.layout import DEFAULT_ATOMIC_ROWS, DEFAULT_TRANSACTIONS_IN_FLIGHT

    repo = make_feature_repo(tmp_path / "repo", feast_project)

    def settings(**extra: int) -> PrecomputeSettings:
        return PrecomputeSettings(feature_repo=str(repo), models_dir=str(repo / "m"), **extra)

    default = open_run_writer(settings(), "solaris_similar")
    chosen = open_run_writer(
        settings(write_transaction_rows=7, write_transactions_in_flight=3), "solaris_pair"
    )
    try:
        assert default.atomic_rows == DEFAULT_ATOMIC_ROWS and chosen.atomic_rows == 7
        assert default.in_flight == DEFAULT_TRANSACTIONS_IN_FLIGHT and chosen.in_flight == 3
        assert chosen.view_name == "solaris_pair"
    finally:
        default.close()
        chosen.close()
    with pytest.raises(ValueError, match="write_transaction_rows"):
        settings(write_transaction_rows=0)
    with pytest.raises(ValueError, match="write_transactions_in_flight"):
        settings(write_transactions_in_flight=0)


def test_a_missing_offline_log_is_a_warning_only_once_an_earlier_round_published(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from solaris_feast.pipeline.runs import earlier_round_published, precompute_run_dir
    from solaris_feast.pipeline.settings import PrecomputeSettings
    from solaris_feast.store.offline import read_offline_folder

    settings = PrecomputeSettings(feature_repo=str(tmp_path), models_dir=str(tmp_path / "m"))
    first = precompute_run_dir(settings, "20261205T100000Z", "vm-a")
    assert not earlier_round_published(settings, first)  # no runs folder at all
    first.mkdir(parents=True)
    (first / "manifest.json").write_text("{}")
    # A round that started but never published does not count, nor does the round itself.
    later = precompute_run_dir(settings, "20261205T110000Z", "vm-a")
    assert not earlier_round_published(settings, later)
    (first / "coverage.json").write_text("{}")
    assert not earlier_round_published(settings, first)
    assert earlier_round_published(settings, later)

    window = (pd.Timestamp("2026-12-05", tz="UTC"), pd.Timestamp("2026-12-05 10:00", tz="UTC"))
    columns = ["user_id", "item_id", "embedding"]
    with caplog.at_level(logging.INFO, logger="solaris_feast.store.offline"):
        rows = read_offline_folder(tmp_path / "a", *window, None, columns, first_round=True)
        read_offline_folder(tmp_path / "b", *window, None, columns)
    assert rows.empty and list(rows.columns)[:3] == columns
    said = {r.getMessage().split()[3]: r.levelname for r in caplog.records}
    assert said == {str(tmp_path / "a"): "INFO", str(tmp_path / "b"): "WARNING"}
