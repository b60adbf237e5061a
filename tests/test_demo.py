"""`solaris demo` runs the whole loop end to end at a tiny size, as a user would call it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from solaris_feast.cli import app


@pytest.mark.slow
def test_demo_runs_the_whole_loop_on_sqlite(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    out = tmp_path / "demo"
    result = CliRunner().invoke(
        app, ["demo", "--size", "tiny", "--out", str(out), "--no-progress"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    for name in (
        "transfer.json",
        "ne_against_coverage.png",
        "tier_mix_over_time.png",
        "lineage.md",
        "serving.json",
        "summary.txt",
    ):
        assert (out / name).is_file(), name
    serving = json.loads((out / "serving.json").read_text())
    assert serving["impressions"] > 0
    assert serving["store_errors"] == 0
    # The round wrote every tier, and serving found them: not everything fell to ZERO.
    assert serving["coverage"]["exact"] > 0
    assert serving["coverage"]["zero"] < 1.0
    assert serving["parity_pairs"] > 0 and serving["parity_mismatches"] == 0
    assert set(serving["ne"]) == {"vm", "served", "fm"}
    transfer = json.loads((out / "transfer.json").read_text())
    assert {"transfer_ratio", "ne", "coverage_sweep"} <= set(transfer)
    assert "coverage by tier" in result.output
    assert "lineage:" in result.output
    assert "plots: ne_against_coverage.png, tier_mix_over_time.png" in result.output
    assert "lineage report written to" not in result.output  # the summary names it, once
    lineage = (out / "lineage.md").read_text()
    assert "solaris_pair" in lineage and "solaris_similar" in lineage
    assert list((out / "models").glob("*.card.json"))
    # The steps are echoed and summed up at the end; their own INFO lines stay out (--verbose).
    ours = [r for r in caplog.records if r.name.startswith("solaris_feast")]
    assert [r.getMessage() for r in ours if r.levelno < logging.WARNING] == []
