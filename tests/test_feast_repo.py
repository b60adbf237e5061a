"""The Feast repo, the point-in-time training frame and the benchmark commands."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from solaris_feast.bench import bench_app
from solaris_feast.errors import ConfigError
from solaris_feast.store.config import (
    REDIS_CONNECTION_ENV,
    redis_connection_string,
)
from solaris_feast.store.definitions import SolarisFeastConfig, solaris_definitions

REPO = Path(__file__).resolve().parents[1] / "feature_repo"
DIM = 32
VERSION = "cmp-test-v1"


def test_feast_apply_on_the_repo_succeeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner as ClickRunner
    from feast import FeatureStore
    from feast.cli.cli import cli as feast_cli

    # Feast's --chdir changes this process's working folder for good: restored after the test
    # (later tests ran in the copied repo, beside its feature_store.redis.yaml).
    monkeypatch.chdir(Path.cwd())

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
    # Feast warns that this flag does nothing on a file registry: the shipped yamls leave it out.
    assert not store.config.registry.serve_features_while_materializing


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
    assert not config.registry.serve_features_while_materializing


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
    # The writer's shorter transactions are timed beside the 1,024-row ones they replaced.
    assert write["solaris_atomic_rows_1024_rows_per_s"] > 0
    assert write["atomic_rows"]["solaris"] < write["atomic_rows"]["before"]
    assert 200 < write["redis_memory_bytes_per_pair_embedding"] < 2000


def test_bench_refuses_to_time_another_server_on_its_feast_serve_port(redis_url: str) -> None:
    """When the port the benchmark's ``feast serve`` should take already answers ``/health``
    (another server), the benchmark must say so, not time the other server: that server
    answers the health check before Feast has even been imported in ours."""
    import http.server
    import threading

    from solaris_feast.bench import bench_store, feast_server

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=other.serve_forever, daemon=True)
    thread.start()
    try:
        port = other.server_address[1]
        with (
            bench_store(redis_url, DIM) as store,
            pytest.raises(RuntimeError, match=rf"port {port} is in use"),
            feast_server(store, port),
        ):
            pass
    finally:
        other.shutdown()
        other.server_close()


def test_a_relative_yaml_name_is_the_repos_file_before_the_working_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`solaris status --repo R --config feature_store.redis.yaml` run beside another repo's
    yaml of that name read that one (another project): the repo's file comes first, and a
    path only the working folder holds is still found there."""
    from solaris_feast.store.config import repo_yaml

    text = "project: {}\nprovider: local\nregistry: data/registry.db\n"
    repo, elsewhere = tmp_path / "repo", tmp_path / "elsewhere"
    for folder, project in ((repo, "mine"), (elsewhere, "theirs")):
        (folder / "sub").mkdir(parents=True)
        (folder / "feature_store.redis.yaml").write_text(text.format(project))
    (elsewhere / "sub" / "only_here.yaml").write_text(text.format("cwd_only"))
    monkeypatch.chdir(elsewhere)
    path, raw = repo_yaml(repo, Path("feature_store.redis.yaml"))
    assert (path, raw["project"]) == (repo / "feature_store.redis.yaml", "mine")
    path, raw = repo_yaml(repo, Path("sub/only_here.yaml"))
    assert raw["project"] == "cwd_only"
    with pytest.raises(ConfigError, match=str(repo / "missing.yaml")):
        repo_yaml(repo, Path("missing.yaml"))
