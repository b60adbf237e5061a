"""``solaris demo``: the SOLARIS loop end to end on embedded defaults.

Synthetic data, the transfer evaluation, models trained on the past and registered with their
cards. Every output lands in one folder, printed at the end.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from solaris_feast.data.schema import time_split
from solaris_feast.datasets import load_dataset
from solaris_feast.evaluate import evaluate_transfer
from solaris_feast.progress import stage_bars
from solaris_feast.train import train_and_register


def run_demo(
    out: Path, size: str = "demo", online_store: str = "sqlite", progress: bool = True
) -> str:
    """Run the demo into ``out``; return a short summary to print."""
    if online_store not in ("sqlite", "redis"):
        raise ValueError(f"--online-store must be sqlite or redis, got {online_store!r}")
    started = time.perf_counter()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    out.mkdir(parents=True, exist_ok=True)
    dataset = load_dataset("synthetic", size)
    with stage_bars(progress) as bars:
        report = evaluate_transfer(dataset, seeds=[0], progress=bars)
        record = report.to_json()
        (out / "transfer.json").write_text(json.dumps(record, indent=2))
        from solaris_feast.cli import _plot_sweep, format_transfer_table

        _plot_sweep(record, out / "ne_against_coverage.png")
        past, _ = time_split(dataset, report.config.train_fraction)
        bundle = train_and_register(past, out / "models", progress=bars)
    lines = [
        format_transfer_table(record),
        "",
        f"data: synthetic/{size}, {len(dataset.interactions):,} impressions, "
        f"{dataset.num_users:,} users, {dataset.num_items:,} items",
        f"models: {', '.join(c.version for c in bundle.cards.values())}",
        f"outputs in {out}: transfer.json, ne_against_coverage.png, models/",
        f"done in {time.perf_counter() - started:.0f} s",
    ]
    return "\n".join(lines)
