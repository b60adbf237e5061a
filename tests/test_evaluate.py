"""The transfer evaluation's report: its keys, and its figures follow their formulas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from solaris_feast.cli import app
from solaris_feast.data.schema import InteractionDataset
from solaris_feast.data.synthetic import SyntheticConfig, generate
from solaris_feast.evaluation.transfer import TransferConfig, evaluate_transfer
from solaris_feast.models.training import TrainConfig, transfer_ratio

FAST = TransferConfig(
    history_len=8,
    fm_training=TrainConfig(epochs=1, batch_size=256),
    compressor_training=TrainConfig(epochs=1, batch_size=256),
    vm_training=TrainConfig(epochs=1, batch_size=256),
    coverages=(0.0, 0.5, 1.0),
)


def test_report_has_its_keys_and_tr_follows_the_formula() -> None:
    ds = generate(SyntheticConfig(num_users=150, num_items=80, num_categories=6, days=2.0))
    record: dict[str, Any] = evaluate_transfer(ds, seeds=[0, 1], config=FAST).to_json()
    assert set(record["ne"]) == {"vm", "vm_kd", "vm_solaris", "fm"}
    for per_task in record["ne"].values():
        assert set(per_task) == {"click", "conversion"}
        assert all(0 < v < 2 for v in per_task.values())
    assert [p["coverage"] for p in record["coverage_sweep"]] == [0.0, 0.5, 1.0]
    assert set(record["transfer_ratio"]) == {"kd", "solaris"}
    assert record["seeds"] == [0, 1]
    # The mean over seeds of the per-seed, per-task formula (the NE table is a seed mean too, so
    # recompute from the per-seed ratios rather than from the averaged NE).
    per_seed = record["transfer_ratio_per_seed"]["solaris"]
    if all(v is not None for v in per_seed):
        assert record["transfer_ratio"]["solaris"] == pytest.approx(sum(per_seed) / len(per_seed))
    assert record["flops_per_pair"]["vm_over_fm"] <= 0.1
    assert record["compressor"]["reconstruction_mse"] <= record["compressor"]["pca_mse"] * 1.05
    json.dumps(record)  # serialisable, no NaN objects


def test_tr_is_the_share_of_the_fm_gain() -> None:
    assert transfer_ratio(1.0, 0.9, 0.8) == pytest.approx(0.5)


def test_cli_writes_json_and_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import solaris_feast.evaluation.transfer as evaluate
    import solaris_feast.evaluation.transfer_protocol as protocol

    monkeypatch.setattr(evaluate, "TransferConfig", lambda: FAST)
    small = protocol.ProtocolConfig(
        train_ends=(0.8,), prev_fm_fractions=(0.75,), bootstrap_replicates=50
    )
    monkeypatch.setattr(protocol, "ProtocolConfig", lambda: small)
    out, png = tmp_path / "t.json", tmp_path / "t.png"
    result = CliRunner().invoke(
        app,
        [
            "evaluate",
            "transfer",
            "--dataset",
            "synthetic",
            "--size",
            "tiny",
            "--seeds",
            "1",
            "--base-seed",
            "3",
            "--json",
            str(out),
            "--plot",
            str(png),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    assert {"transfer_ratio", "ne", "coverage_sweep", "protocol"} <= set(record)
    assert record["seeds"] == [3]
    settings = record["settings"]
    assert (settings["size"], settings["base_seed"], settings["world"]) == ("tiny", 3, "neither")
    assert record["protocol_details"]["seeds"] == [3]
    assert {"tr_served", "tr_served_ci95", "tr_kd_served", "tr_by_staleness"} <= set(
        record["protocol"]
    )
    assert "TR served" in result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "transfer ratio" in result.output
    # One seed has no spread: null and "n/a", not a spread of 0.000.
    assert record["transfer_ratio_std"] == {"kd": None, "solaris": None}
    assert "sd 0.000" not in result.output


def test_cli_world_fm_history_and_fm_rows_reach_the_protocol(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import solaris_feast.data.datasets as datasets
    import solaris_feast.evaluation.transfer as evaluate
    import solaris_feast.evaluation.transfer_protocol as protocol

    monkeypatch.setattr(evaluate, "TransferConfig", lambda: FAST)
    small = protocol.ProtocolConfig(
        train_ends=(0.8,),
        prev_fm_fractions=(0.75,),
        soft_label_weights=(0.5,),
        bootstrap_replicates=20,
    )
    monkeypatch.setattr(protocol, "ProtocolConfig", lambda: small)
    # A smaller preset keeps the test in seconds; the world's structures go on top of it.
    monkeypatch.setitem(
        datasets.SYNTHETIC_PRESETS,
        "tiny",
        SyntheticConfig(num_users=40, num_items=30, num_categories=4, days=1.5),
    )
    out = tmp_path / "t.json"
    args = ["evaluate", "transfer", "--dataset", "synthetic", "--size", "tiny", "--no-progress"]
    own = ["--fm-history", "own_surface", "--fm-rows", "own_tier"]
    drawn: list[int] = []
    real_load = datasets.load_dataset

    def load_and_note(
        name: str, size: str = "default", seed: int = 0, world: str = "neither"
    ) -> InteractionDataset:
        drawn.append(seed)
        return real_load(name, size, seed=seed, world=world)

    monkeypatch.setattr(datasets, "load_dataset", load_and_note)
    # Two worlds pooled: drawn with seeds 4 and 5, each reported beside the pooled figure.
    world = ["--world", "surfaces", "--data-seed", "4", "--data-seeds", "2"]
    result = CliRunner().invoke(app, [*args, *world, *own, "--json", str(out)])
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    assert record["data_seed"] == 4 and record["data_seeds"] == [4, 5] and drawn == [4, 5]
    pooled = record["protocol"]
    assert list(pooled["per_world"]) == ["data_seed=4", "data_seed=5"]
    assert [s["world"] for s in pooled["per_split"]] == list(pooled["per_world"])
    assert "data_seed=5" in result.output
    details = record["protocol_details"]
    assert details["worlds"] == ["data_seed=4", "data_seed=5"]
    assert details["vm_surface"] == 0
    assert details["config"]["fm_history"] == "own_surface"
    assert details["fm_rows"] == details["config"]["fm_rows"] == "own_tier"
    refused = CliRunner().invoke(app, [*args, "--fm-rows", "mine"])
    assert refused.exit_code == 2 and "--fm-rows" in refused.output
    refused = CliRunner().invoke(app, [*args, "--fm-history", "own_surface"])
    assert refused.exit_code == 2 and "surfaces" in refused.output
    refused = CliRunner().invoke(app, [*args, "--world", "sideways"])
    assert refused.exit_code == 2 and "--world" in refused.output
    movielens = ["evaluate", "transfer", "--dataset", "movielens", "--data-seed", "1"]
    refused = CliRunner().invoke(app, movielens)
    assert refused.exit_code == 2 and "--data-seed" in refused.output
    refused = CliRunner().invoke(app, [*movielens[:-2], "--data-seeds", "3"])
    assert refused.exit_code == 2 and "--data-seeds" in refused.output


def test_ne_matches_a_per_row_reference_for_numpy_and_torch_inputs() -> None:
    import math

    import numpy as np
    import torch

    from solaris_feast.evaluation.metrics import normalized_entropy

    rng = np.random.default_rng(5)
    p = rng.uniform(0.01, 0.99, (200, 2))
    y = (rng.random((200, 2)) < 0.3).astype(np.float64)
    for t in range(2):
        rate = y[:, t].mean()
        logloss = -sum(
            math.log(pi) if yi else math.log(1 - pi)
            for pi, yi in zip(p[:, t], y[:, t], strict=True)
        ) / len(p)
        entropy = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
        assert normalized_entropy(p, y)[t] == pytest.approx(logloss / entropy, rel=1e-12)
    assert normalized_entropy(torch.from_numpy(p), torch.from_numpy(y)) == pytest.approx(
        normalized_entropy(p, y), rel=1e-12
    )
    assert normalized_entropy(p[:, 0], y[:, 0]) == [normalized_entropy(p, y)[0]]
    with pytest.raises(ValueError, match="shape"):
        normalized_entropy(p[:, 0], y)


def test_a_ratio_over_too_few_seeds_has_no_bootstrap_interval() -> None:
    """One seed's percentile "interval" was the point itself, two seeds' came from 3 distinct
    resamples (the funnel's online transfer ratio)."""
    from solaris_feast.evaluation.metrics import MIN_BOOTSTRAP_UNITS, bootstrap_ratio_of_means

    gains = [40.0, 75.0, 20.0, 90.0, 55.0, 60.0]
    ceilings = [100.0, 110.0, 95.0, 120.0, 105.0, 100.0]
    for k in range(1, MIN_BOOTSTRAP_UNITS):
        ratio, interval = bootstrap_ratio_of_means(gains[:k], ceilings[:k])
        assert ratio == pytest.approx(sum(gains[:k]) / sum(ceilings[:k])) and interval is None
    ratio, interval = bootstrap_ratio_of_means(gains, ceilings)
    assert interval is not None and interval[0] < ratio < interval[1]


def test_a_seed_whose_fm_does_not_beat_the_vm_leaves_the_ratio_and_its_spread_null() -> None:
    """On a small log of a user's own, one seed's FM may not beat the VM: that seed has no
    transfer ratio, and the report still writes, with no spread, instead of a traceback."""
    from solaris_feast.evaluation.transfer import SeedResult, TransferReport
    from solaris_feast.evaluation.transfer_report import format_transfer_table

    def seed(seed: int, fm_ne: float) -> SeedResult:
        ne = {"vm": [0.99], "vm_kd": [0.985], "vm_solaris": [0.97], "fm": [fm_ne]}
        sweep = [0.99] * len(TransferConfig().coverages)
        return SeedResult(seed, ne, sweep, 0.1, 0.2, 1e6, 1e4, 1.0)

    report = TransferReport("shop", ("clicked",), TransferConfig(), [seed(0, 0.95), seed(1, 1.002)])
    record = report.to_json()

    json.dumps(record, allow_nan=False)
    per_seed: Any = record["transfer_ratio_per_seed"]
    assert per_seed["solaris"][0] == pytest.approx(0.5)
    assert per_seed["solaris"][1] is None
    assert record["transfer_ratio"] == {"kd": None, "solaris": None}
    assert record["transfer_ratio_std"] == {"kd": None, "solaris": None}
    assert "n/a" in format_transfer_table(record)
