"""The Feast repo, the point-in-time training frame and the benchmark commands."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from solaris_feast.bench import bench_app
from solaris_feast.store.config import (
    REDIS_CONNECTION_ENV,
    open_store,
    redis_connection_string,
)
from solaris_feast.store.definitions import SolarisFeastConfig, solaris_definitions
from solaris_feast.store.training_frame import embedding_matrix, training_frame
from solaris_feast.store.write import EmbeddingWriter
from solaris_feast.tiers import Tier

REPO = Path(__file__).resolve().parents[1] / "feature_repo"
DIM = 32
VERSION = "cmp-test-v1"


def test_feast_apply_on_the_repo_succeeds(tmp_path: Path) -> None:
    from click.testing import CliRunner as ClickRunner
    from feast import FeatureStore
    from feast.cli.cli import cli as feast_cli

    repo = tmp_path / "feature_repo"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("data", "__pycache__"))
    # The real `feast apply` command, run in this process: a subprocess spends ~30 s importing
    # Feast on this shared machine.
    done = ClickRunner().invoke(feast_cli, ["--chdir", str(repo), "apply"])
    assert done.exit_code == 0, (done.output[-2000:], done.exception)
    assert "Created sqlite table solaris_solaris_pair" in done.output

    store = FeatureStore(repo_path=str(repo))
    views = {v.name: v for v in store.list_feature_views()}
    assert set(views) == {"solaris_pair", "solaris_user", "solaris_similar"}
    assert views["solaris_pair"].ttl is not None
    assert views["solaris_pair"].ttl.total_seconds() == 6 * 3600
    assert views["solaris_user"].ttl.total_seconds() == 24 * 3600  # type: ignore[union-attr]
    for view in views.values():
        for tag in (
            "tier",
            "fm_version",
            "compressor_version",
            "verifier_version",
            "embedding_dim",
            "producing_dag",
            "schedule",
            "ttl_seconds",
        ):
            assert f"solaris.{tag}" in view.tags, (view.name, tag)
    assert [v.name for v in store.list_on_demand_feature_views()] == ["solaris_resolved"]
    assert store.get_feature_service("solaris_embeddings") is not None
    assert store.config.registry.serve_features_while_materializing is True


def test_redis_switch_takes_its_connection_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from feast.repo_config import load_repo_config

    text = (REPO / "feature_store.redis.yaml").read_text()
    assert "password" not in text.split("#")[0] and "${" + REDIS_CONNECTION_ENV + "}" in text
    monkeypatch.setenv(
        REDIS_CONNECTION_ENV, redis_connection_string("redis://:s3cret@cache:6380/2")
    )
    config = load_repo_config(REPO, REPO / "feature_store.redis.yaml")
    assert config.online_store.type == "redis"
    assert config.online_store.connection_string == "cache:6380,db=2,password=s3cret"
    assert config.registry.serve_features_while_materializing is True


def test_factories_take_user_names_dimensions_and_ttls(tmp_path: Path, feast_project: str) -> None:
    config = SolarisFeastConfig(
        embedding_dim=8, pair_view_name="z_exact", pair_ttl_seconds=60, fm_version="fm-9"
    )
    definitions = solaris_definitions(config)
    assert definitions.pair_view.name == "z_exact"
    assert definitions.pair_view.ttl.total_seconds() == 60  # type: ignore[union-attr]
    assert definitions.pair_view.tags["solaris.fm_version"] == "fm-9"
    assert definitions.pair_view.tags["solaris.embedding_dim"] == "8"
    with pytest.raises(ValueError):
        SolarisFeastConfig(pair_view_name="same", user_view_name="same")
    with pytest.raises(ValueError):
        SolarisFeastConfig(pair_ttl_seconds=0)


def test_training_frame_sees_the_tier_each_row_would_have_been_served(
    tmp_path: Path, feast_project: str
) -> None:
    store = open_store(feast_project, tmp_path, online="sqlite")
    store.apply(solaris_definitions().all())
    rng = np.random.default_rng(3)
    exact, similar, user = rng.standard_normal((3, DIM)).astype(np.float32)
    t0 = pd.Timestamp("2026-03-01 12:00", tz="UTC")
    EmbeddingWriter(store, "solaris_pair").write(
        pd.DataFrame(
            {
                "user_id": [1, 1],
                "item_id": [10, 11],
                "embedding": [exact, exact],
                "model_version": [VERSION, "cmp-old"],
                "computed_at": [t0, t0],
            }
        )
    )
    EmbeddingWriter(store, "solaris_similar").write(
        pd.DataFrame(
            {
                "user_id": [1],
                "item_id": [10],
                "embedding": [similar],
                "neighbour_count": [3],
                "mean_distance": [0.5],
                "model_version": [VERSION],
                "computed_at": [t0 - pd.Timedelta(hours=1)],
            }
        )
    )
    EmbeddingWriter(store, "solaris_user").write(
        pd.DataFrame(
            {
                "user_id": [1],
                "embedding": [user],
                "pair_count": [2],
                "model_version": [VERSION],
                "computed_at": [t0 - pd.Timedelta(hours=2)],
            }
        )
    )
    hours = pd.Timedelta(hours=1)
    entity_df = pd.DataFrame(
        {
            "user_id": [1, 1, 1, 1, 1, 1, 2],
            "item_id": [10, 10, 10, 10, 11, 12, 10],
            "event_timestamp": [
                t0 + hours,  # exact is fresh
                t0 - 0.5 * hours,  # before the exact write: similar is the best then
                t0 - 1.5 * hours,  # before similar: the user aggregate
                t0 + 6.5 * hours,  # exact and similar expired (6 h), user still fresh (24 h)
                t0 + hours,  # other model version: falls to the user aggregate
                t0 - 3 * hours,  # before anything was written
                t0 + hours,  # unknown user
            ],
        }
    )
    frame = training_frame(store, entity_df, VERSION)

    expected = [
        Tier.EXACT,
        Tier.SIMILAR,
        Tier.USER_AGG,
        Tier.USER_AGG,
        Tier.USER_AGG,
        Tier.ZERO,
        Tier.ZERO,
    ]
    assert frame["tier"].tolist() == expected
    matrix = embedding_matrix(frame)
    assert matrix.shape == (7, DIM) and matrix.dtype == np.float32
    np.testing.assert_array_equal(matrix[0], exact)
    np.testing.assert_array_equal(matrix[1], similar)
    np.testing.assert_array_equal(matrix[2], user)
    assert np.all(matrix[5:] == 0)
    assert frame["age_seconds"].iloc[0] == pytest.approx(3600)
    assert frame["age_seconds"].iloc[3] == pytest.approx(8.5 * 3600)
    assert frame["user_id"].tolist() == entity_df["user_id"].tolist()


def test_bench_commands_write_the_agreed_json_keys(tmp_path: Path, redis_url: str) -> None:
    runner = CliRunner()
    serve_json = tmp_path / "serve.json"
    write_json = tmp_path / "write.json"
    env = {**os.environ, "REDIS_URL": redis_url}

    served = runner.invoke(
        bench_app,
        ["serve", "--json", str(serve_json), "--iterations", "10", "--candidates", "10,100"],
        env=env,
    )
    assert served.exit_code == 0, served.output
    written = runner.invoke(
        bench_app,
        ["write", "--json", str(write_json), "--rows", "500", "--repeats", "1"],
        env=env,
    )
    assert written.exit_code == 0, written.output

    serve = json.loads(serve_json.read_text())
    for key in ("resolved", "feast_single_view", "raw_redis"):
        assert serve[f"{key}_p50_ms"] > 0 and serve[f"{key}_p99_ms"] >= serve[f"{key}_p50_ms"]
    assert set(serve["candidates"]) == {"10", "100"}
    assert serve["candidates"]["100"]["tier_counts"] == {"1": 10, "2": 10, "3": 80}
    write = json.loads(write_json.read_text())
    assert write["solaris_rows_per_s"] > 0 and write["feast_rows_per_s"] > 0
    assert 200 < write["redis_memory_bytes_per_pair_embedding"] < 2000
