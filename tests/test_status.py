"""``solaris status`` on real stores: rows, freshness, versions, queue depth and tier coverage."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from solaris_feast.errors import WriteBatchError
from solaris_feast.review.status import AGE_BUCKETS, age_bucket, status_cli, store_status
from solaris_feast.serving.miss_queue import MissQueue
from solaris_feast.store.config import REDIS_CONNECTION_ENV, OnlineKind, open_store
from solaris_feast.store.definitions import SolarisFeastConfig, solaris_definitions
from solaris_feast.store.layout import stored_model_version
from solaris_feast.store.write import EmbeddingWriter

if TYPE_CHECKING:
    from feast import FeatureStore

DIM = 4
VERSION = "compressor-status-v1"
OLD = "compressor-status-v0"
H = 3600.0

# (view, user, item, version, age in hours). TTLs: pair and similar 6 h, user 24 h.
ROWS = [
    ("solaris_pair", 1, 10, VERSION, 10 / 60),  # EXACT
    ("solaris_pair", 1, 11, VERSION, 2.0),  # EXACT
    ("solaris_pair", 1, 12, VERSION, 7.0),  # expired -> the similar row below
    ("solaris_similar", 1, 12, VERSION, 4.0),  # SIMILAR
    ("solaris_pair", 2, 20, OLD, 0.5),  # another version -> the user aggregate
    ("solaris_user", 2, None, VERSION, 5.0),  # USER_AGG
    ("solaris_pair", 3, 30, VERSION, 30.0),  # expired, user aggregate expired -> ZERO
    ("solaris_similar", 3, 31, OLD, 1.5),  # another version -> ZERO
    ("solaris_user", 3, None, VERSION, 25.0),  # expired
]


@dataclass(frozen=True)
class Written:
    repo: Path
    kind: OnlineKind
    project: str


def write_rows(store: FeatureStore, now: pd.Timestamp) -> None:
    for view in ("solaris_pair", "solaris_similar", "solaris_user"):
        rows = [r for r in ROWS if r[0] == view]
        frame = pd.DataFrame(
            {
                "user_id": pd.array([r[1] for r in rows], dtype="int64"),
                "embedding": [[float(r[1]), 0.5, 0.25, 1.0] for r in rows],
                "model_version": [r[3] for r in rows],
                "computed_at": pd.Series(
                    [now - pd.Timedelta(hours=r[4]) for r in rows], dtype="datetime64[ns, UTC]"
                ),
            }
        )
        if view != "solaris_user":
            frame.insert(1, "item_id", pd.array([r[2] for r in rows], dtype="int64"))
        if view == "solaris_user":
            frame["pair_count"] = pd.array([3] * len(rows), dtype="int64")
        if view == "solaris_similar":
            frame["neighbour_count"] = pd.array([5] * len(rows), dtype="int64")
            frame["mean_distance"] = [0.1] * len(rows)
        writer = EmbeddingWriter(store, view, offline=False)
        try:
            assert writer.write(frame).online_applied == len(rows)
        finally:
            writer.close()


@pytest.fixture(params=["sqlite", "redis"])
def written(
    request: pytest.FixtureRequest, tmp_path: Path, feast_project: str
) -> Iterator[Written]:
    kind: OnlineKind = request.param
    store = open_store(feast_project, tmp_path, online=kind)
    store.apply(solaris_definitions(SolarisFeastConfig(embedding_dim=DIM)).all())
    write_rows(store, pd.Timestamp.now(tz="UTC"))
    queue = MissQueue.for_store(store)
    assert queue.record(1, [98, 99], VERSION) == 2
    assert queue.record(2, [97], VERSION) == 1
    yield Written(tmp_path, kind, feast_project)


def open_written(w: Written) -> FeatureStore:
    return open_store(w.project, w.repo, online=w.kind)


def write_cards(models: Path) -> None:
    """FM -> compressor -> VM cards naming VERSION as the compressor (weights never read)."""
    models.mkdir()
    for version, kind, parents in (
        ("fm-status", "fm", []),
        (VERSION, "compressor", ["fm-status"]),
        ("vm-status", "vm", [VERSION]),
    ):
        card = {
            "version": version,
            "kind": kind,
            "parents": parents,
            "created_at": "2026-01-01T00:00:00Z",
            "weights_file": f"{version}.safetensors",
            "weights_sha256": "0" * 64,
        }
        (models / f"{version}.card.json").write_text(json.dumps(card))


def test_age_buckets_have_exclusive_upper_bounds() -> None:
    assert [label for label, _ in AGE_BUCKETS] == ["<1h", "1-3h", "3-6h", "6-12h", "12-24h", ">24h"]
    assert age_bucket(-5) == "<1h"
    assert age_bucket(H - 1) == "<1h" and age_bucket(H) == "1-3h"
    assert age_bucket(24 * H - 1) == "12-24h" and age_bucket(24 * H) == ">24h"


def test_status_counts_rows_freshness_versions_queue_and_served_tiers(
    written: Written, tmp_path: Path
) -> None:
    store = open_written(written)
    models = tmp_path / "models"
    write_cards(models)
    status = store_status(store, models_dir=models)

    assert status["online_store"] == written.kind
    assert status["expected_model_version"] == VERSION
    assert status["expected_version_source"] == "model cards"
    views = {v["name"]: v for v in status["views"]}
    counts = {
        name: (v["rows"], v["fresh"], v["expired"], v["expected_version"], v["other_version"])
        for name, v in views.items()
    }
    assert counts == {
        "solaris_pair": (5, 3, 2, 4, 1),
        "solaris_similar": (2, 2, 0, 1, 1),
        "solaris_user": (2, 1, 1, 2, 0),
    }
    assert views["solaris_pair"]["fresh_expected_version"] == 2
    # The store keeps version tags; a card or the expected version names its own, and a version
    # no card names (OLD) shows as the tag it is stored under.
    assert views["solaris_pair"]["versions"] == {stored_model_version(OLD): 1, VERSION: 4}
    assert views["solaris_pair"]["ttl_seconds"] == 6 * H
    assert views["solaris_pair"]["age_histogram"] == {
        "<1h": 2, "1-3h": 1, "3-6h": 0, "6-12h": 1, "12-24h": 0, ">24h": 1,
    }  # fmt: skip
    assert status["freshness_histogram"] == {
        "<1h": 2, "1-3h": 2, "3-6h": 2, "6-12h": 1, "12-24h": 0, ">24h": 2,
    }  # fmt: skip
    assert status["miss_queue_depth"] == 3

    coverage = status["coverage"]
    assert (coverage["users"], coverage["users_sampled"], coverage["pairs"]) == (3, 3, 6)
    assert coverage["errors"] == 0
    assert coverage["counts"] == {"EXACT": 2, "SIMILAR": 1, "USER_AGG": 1, "ZERO": 2}
    assert coverage["shares"]["EXACT"] == pytest.approx(2 / 6)
    assert coverage["shares"]["ZERO"] == pytest.approx(2 / 6)
    assert status["scan"]["truncated"] is False
    # The retriever ran with record_misses=False: the status queued nothing.
    assert MissQueue.for_store(store).pending() == 3

    # Another expected version: the old rows are the current ones now.
    old = store_status(store, OLD)
    assert old["expected_version_source"] == "given"
    assert {v["name"]: v["expected_version"] for v in old["views"]} == {
        "solaris_pair": 1,
        "solaris_similar": 1,
        "solaris_user": 0,
    }
    # Pair (2, 20) is fresh in OLD; (3, 31) is OLD in the similar view; nothing else serves.
    assert old["coverage"]["counts"] == {"EXACT": 1, "SIMILAR": 1, "USER_AGG": 0, "ZERO": 4}

    # A key budget smaller than the store: partial counts, and the report says so.
    small = store_status(store, VERSION, max_keys=3, max_users=1)
    assert small["scan"]["truncated"] is True
    assert small["scan"]["keys_read"] == 3
    assert sum(v["rows"] for v in small["views"]) <= 4  # a Redis pair key holds two views
    assert small["coverage"]["users_sampled"] <= 1


def test_status_command_prints_tables_and_writes_json_and_plot(
    written: Written, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = written.repo
    online = (
        "online_store:\n  type: sqlite\n  path: data/online.db\n"
        if written.kind == "sqlite"
        else "online_store:\n  type: redis\n  connection_string: ${" + REDIS_CONNECTION_ENV + "}\n"
    )
    config = repo / "status_store.yaml"
    config.write_text(
        f"project: {written.project}\nprovider: local\nregistry: data/registry.db\n{online}"
        "offline_store:\n  type: file\nentity_key_serialization_version: 3\n"
    )
    # The Redis connection is derived from REDIS_URL when the variable is unset.
    monkeypatch.delenv(REDIS_CONNECTION_ENV, raising=False)
    app = typer.Typer()
    app.command("status")(status_cli)
    app.command("noop")(lambda: None)  # a second command, so "status" stays a sub-command
    out, png = repo / "status.json", repo / "fresh.png"
    args = ["status", "--repo", str(repo), "--config", config.name, "--models", str(repo / "none")]
    result = CliRunner().invoke(
        app, [*args, "--model-version", VERSION, "--json", str(out), "--plot", str(png)]
    )
    assert result.exit_code == 0, (result.output, result.exception)
    assert "Coverage by tier" in result.output and "miss-queue depth: 3" in result.output
    status = json.loads(out.read_text())
    assert status["coverage"]["counts"] == {"EXACT": 2, "SIMILAR": 1, "USER_AGG": 1, "ZERO": 2}
    assert status["freshness_histogram"][">24h"] == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Without cards or a version the most common stored version is expected.
    result = CliRunner().invoke(app, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["expected_version_source"] == "most common stored version"

    missing = CliRunner().invoke(app, ["status", "--repo", str(repo / "nowhere")])
    assert missing.exit_code == 2
    assert "not a Feast repo" in missing.output

    unapplied = repo / "unapplied"
    unapplied.mkdir()
    (unapplied / "feature_store.yaml").write_text(config.read_text().replace(written.project, "x"))
    result = CliRunner().invoke(app, ["status", "--repo", str(unapplied)])
    assert result.exit_code == 2
    assert "run `feast apply`" in result.output
    assert sorted(unapplied.iterdir()) == [unapplied / "feature_store.yaml"]  # nothing created


def test_status_counts_freshness_by_the_tier_rule_future_values_included(
    tmp_path: Path, feast_project: str
) -> None:
    """Fresh means what serving's rule says: a value within the clock-skew allowance in the
    future is fresh, one further ahead (a broken clock) is not, nor is one past its TTL."""
    store = open_store(feast_project, tmp_path, online="sqlite")
    store.apply(solaris_definitions(SolarisFeastConfig(embedding_dim=DIM)).all())
    now = pd.Timestamp.now(tz="UTC")
    ahead = [pd.Timedelta(seconds=60), pd.Timedelta(hours=1), pd.Timedelta(hours=-7)]
    frame = pd.DataFrame(
        {
            "user_id": pd.array([5, 5, 5], dtype="int64"),
            "item_id": pd.array([1, 2, 3], dtype="int64"),
            "embedding": [[1.0, 0.5, 0.25, 1.0]] * 3,
            "model_version": [VERSION] * 3,
            "computed_at": pd.Series([now + a for a in ahead], dtype="datetime64[ns, UTC]"),
        }
    )
    writer = EmbeddingWriter(store, "solaris_pair", offline=False)
    writer.write(frame.iloc[[0, 2]])
    # The solaris writer refuses a vector an hour ahead; another writer (Feast's own, a
    # materialization from a log written by a clock that is off) can still store one.
    with pytest.raises(WriteBatchError, match="after this machine's clock"):
        writer.write(frame.iloc[[1]])
    writer.close()
    store.write_to_online_store(
        "solaris_pair",
        frame.iloc[[1]].assign(
            event_timestamp=frame["computed_at"].iloc[1], written_at=frame["computed_at"].iloc[1]
        ),
    )
    status = store_status(store, VERSION)
    pair = next(v for v in status["views"] if v["name"] == "solaris_pair")
    # The future value is "future", not also "expired" (the one 7 h old).
    assert (pair["rows"], pair["fresh"], pair["expired"], pair["future"]) == (3, 1, 1, 1)
    assert pair["fresh_expected_version"] == 1
    # A stored value that does not parse is unknown, as serving reads it, not an error.
    import sqlite3

    from solaris_feast.store.layout import quoted_sqlite_table

    assert store.config.repo_path is not None
    db = Path(store.config.repo_path) / store.config.online_store.path
    with sqlite3.connect(db) as conn:
        conn.execute(
            f"UPDATE {quoted_sqlite_table(feast_project, 'solaris_pair')} SET value = ? "
            "WHERE feature_name IN ('computed_at', 'model_version')",
            (b"\xff\xff",),
        )
    pair = next(v for v in store_status(store, VERSION)["views"] if v["name"] == "solaris_pair")
    assert (pair["rows"], pair["without_computed_at"], pair["versions"]) == (3, 3, {"<none>": 3})


def test_the_repos_clock_skew_is_applied_by_every_reader_and_writer(
    tmp_path: Path, feast_project: str
) -> None:
    """``SolarisFeastConfig.clock_skew_seconds`` was applied by the resolved view alone: the
    retriever, the writer and the status kept 300 s, so with 0 configured a vector 2 minutes
    ahead was refused by the view and served EXACT by the retriever."""
    from solaris_feast.serving.retriever import SolarisRetriever
    from solaris_feast.tiers import Tier

    store = open_store(feast_project, tmp_path, online="sqlite")
    store.apply(
        solaris_definitions(SolarisFeastConfig(embedding_dim=DIM, clock_skew_seconds=0)).all()
    )
    ahead = pd.Timestamp.now(tz="UTC") + pd.Timedelta(minutes=2)
    frame = pd.DataFrame(
        {
            "user_id": pd.array([5], dtype="int64"),
            "item_id": pd.array([1], dtype="int64"),
            "embedding": [[1.0, 0.5, 0.25, 1.0]],
            "model_version": [VERSION],
            "computed_at": pd.Series([ahead], dtype="datetime64[ns, UTC]"),
        }
    )
    writer = EmbeddingWriter(store, "solaris_pair", offline=False)
    with pytest.raises(WriteBatchError, match="more than 0 s after"):
        writer.write(frame)
    writer.close()
    store.write_to_online_store(
        "solaris_pair", frame.assign(event_timestamp=ahead, written_at=ahead)
    )
    retriever = SolarisRetriever(store, VERSION, record_misses=False, deadline_ms=5000)
    assert retriever.clock_skew_seconds == 0.0
    assert retriever.fetch(5, [1]).tiers.tolist() == [Tier.ZERO]
    pair = next(v for v in store_status(store, VERSION)["views"] if v["name"] == "solaris_pair")
    assert (pair["fresh"], pair["future"]) == (0, 1)
    # A repo that never set it keeps the default.
    other = open_store(f"{feast_project}_b", tmp_path / "b", online="sqlite")
    other.apply(solaris_definitions(SolarisFeastConfig(embedding_dim=DIM)).all())
    assert SolarisRetriever(other, VERSION, record_misses=False).clock_skew_seconds == 300.0


def _redis_yaml(repo: Path, project: str) -> Path:
    path = repo / "feature_store.redis.yaml"
    path.write_text(
        f"project: {project}\nprovider: local\nregistry: data/registry.db\n"
        "online_store:\n  type: redis\n  connection_string: ${" + REDIS_CONNECTION_ENV + "}\n"
        "offline_store:\n  type: file\nentity_key_serialization_version: 3\n"
    )
    return path


@pytest.mark.redis
def test_status_reads_the_store_the_deployment_names_and_creates_no_sqlite_file(
    tmp_path: Path, feast_project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a Redis round, `solaris status` without options reads Redis: the store named by
    $SOLARIS_FEATURE_STORE_YAML (the DAGs' variable), else by the solaris.yaml's feast section.
    It used to read the SQLite default, report 0 rows and leave a data/online.db behind."""
    store = open_store(feast_project, tmp_path, online="redis")
    store.apply(solaris_definitions(SolarisFeastConfig(embedding_dim=DIM)).all())
    write_rows(store, pd.Timestamp.now(tz="UTC"))
    _redis_yaml(tmp_path, feast_project)
    # The SQLite default beside it, as feature_repo/ ships it: never to be read nor created.
    (tmp_path / "feature_store.yaml").write_text(
        f"project: {feast_project}\nprovider: local\nregistry: data/registry.db\n"
        "online_store:\n  type: sqlite\n  path: data/online.db\n"
        "offline_store:\n  type: file\nentity_key_serialization_version: 3\n"
    )
    monkeypatch.delenv(REDIS_CONNECTION_ENV, raising=False)
    for variable in ("SOLARIS_CONFIG", "SOLARIS_MODELS_DIR"):
        monkeypatch.delenv(variable, raising=False)
    app = typer.Typer()
    app.command("status")(status_cli)
    app.command("noop")(lambda: None)
    out = tmp_path / "status.json"

    def pair_rows() -> int:
        result = CliRunner().invoke(app, ["status", "--model-version", VERSION, "--json", str(out)])
        assert result.exit_code == 0, (result.output, result.exception)
        status = json.loads(out.read_text())
        assert status["online_store"] == "redis"
        return int(next(v["rows"] for v in status["views"] if v["name"] == "solaris_pair"))

    monkeypatch.setenv("SOLARIS_FEATURE_REPO", str(tmp_path))
    monkeypatch.setenv("SOLARIS_FEATURE_STORE_YAML", "feature_store.redis.yaml")
    assert pair_rows() == 5
    assert json.loads(out.read_text())["read_from"]["named_by"] == "environment"

    # The config file's feast section wins over the variables, as in the DAGs.
    monkeypatch.setenv("SOLARIS_FEATURE_STORE_YAML", "feature_store.yaml")
    config = tmp_path / "solaris.yaml"
    config.write_text(
        "feast:\n  repo: .\n  feature_store_yaml: feature_store.redis.yaml\n"
        "log:\n  path: log\n  columns: {user: u, item: i, timestamp: t, labels: [clicked]}\n"
        "models:\n  dir: models\n"
    )
    monkeypatch.setenv("SOLARIS_CONFIG", str(config))
    assert pair_rows() == 5
    read_from = json.loads(out.read_text())["read_from"]
    assert read_from["named_by"] == f"config file {config}"
    assert read_from["models_dir"] == str(tmp_path / "models")
    # --config names a solaris.yaml in every other command; status reads it as one too.
    monkeypatch.delenv("SOLARIS_CONFIG")
    result = CliRunner().invoke(
        app, ["status", "--config", str(config), "--model-version", VERSION, "--json", str(out)]
    )
    assert result.exit_code == 0, (result.output, result.exception)
    assert json.loads(out.read_text())["read_from"]["named_by"] == f"config file {config}"
    assert not (tmp_path / "data" / "online.db").exists()


def test_status_of_a_sqlite_store_never_written_reads_zero_and_creates_nothing(
    tmp_path: Path, feast_project: str
) -> None:
    store = open_store(feast_project, tmp_path, online="sqlite")
    store.apply(solaris_definitions(SolarisFeastConfig(embedding_dim=DIM)).all())
    online_db = tmp_path / "data" / "online.db"
    online_db.unlink(missing_ok=True)  # as a repo whose online store was never written
    status = store_status(open_store(feast_project, tmp_path, online="sqlite"), VERSION)
    assert [v["rows"] for v in status["views"]] == [0, 0, 0]
    assert status["miss_queue_depth"] == 0
    assert not online_db.exists()
    # Right after `feast apply`, before any chain is trained: nothing to expect, nothing stored.
    # It ended in a TypeError traceback (version_matches of None).
    app = typer.Typer()
    app.command("status")(status_cli)
    app.command("noop")(lambda: None)
    (tmp_path / "no_models").mkdir()
    (tmp_path / "feature_store.yaml").write_text(
        f"project: {feast_project}\nprovider: local\nregistry: data/registry.db\n"
        "online_store:\n  type: sqlite\n  path: data/online.db\n"
        "offline_store:\n  type: file\nentity_key_serialization_version: 3\n"
    )
    result = CliRunner().invoke(
        app, ["status", "--repo", str(tmp_path), "--models", str(tmp_path / "no_models")]
    )
    assert result.exit_code == 0, (result.output, result.exception)
    assert "no expected model version (no cards, nothing stored)" in result.output


def test_status_says_when_the_online_store_lost_pairs_the_offline_log_calls_fresh(
    tmp_path: Path, feast_project: str
) -> None:
    """After a Redis restarted without persistence the status read `0 stored pairs` and nothing
    else: the offline log still calls them fresh, and the next round plans them again."""
    import sqlite3

    from rich.console import Console

    from solaris_feast.review.status import render_status

    store = open_store(feast_project, tmp_path, online="sqlite")
    store.apply(solaris_definitions(SolarisFeastConfig(embedding_dim=DIM)).all())
    now = pd.Timestamp.now(tz="UTC")
    frame = pd.DataFrame(
        {
            "user_id": pd.array([1, 1, 2], dtype="int64"),
            "item_id": pd.array([10, 11, 20], dtype="int64"),
            "embedding": [[1.0, 0.5, 0.25, 1.0]] * 3,
            "model_version": [VERSION] * 3,
            # Two fresh, one logged 7 h ago: past the pair TTL (6 h), not counted.
            "computed_at": pd.Series(
                [now - pd.Timedelta(minutes=5)] * 2 + [now - pd.Timedelta(hours=7)],
                dtype="datetime64[ns, UTC]",
            ),
        }
    )
    writer = EmbeddingWriter(store, "solaris_pair", offline=True)
    try:
        writer.write(frame)
    finally:
        writer.close()
    status = store_status(store, VERSION)
    assert (status["offline_fresh_pairs"], status["lost_online"]) == (2, 0)

    with sqlite3.connect(tmp_path / "data" / "online.db") as conn:  # the store loses its rows
        for (table,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE ?",
            (f"{feast_project}_%",),
        ).fetchall():
            conn.execute(f'DELETE FROM "{table}"')
    status = store_status(open_store(feast_project, tmp_path, online="sqlite"), VERSION)
    assert (status["offline_fresh_pairs"], status["lost_online"]) == (2, 2)
    console = Console(record=True, width=200)
    render_status(status, console)
    assert "2 of them are not in the online store" in console.export_text()
