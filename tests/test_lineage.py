"""Lineage review over a real Feast registry, real DAG files (parsed by Airflow's DagBag) and
model cards written by the project's own ``save_model``.

Each check is shown to pass on a sound setup and to fire on a setup broken in exactly that way.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from solaris_feast.review.lineage import (
    CHECK_MISSING_VERSION_TAGS,
    CHECK_MIXED_COMPRESSOR_VERSIONS,
    CHECK_NO_SOLARIS_VIEWS,
    CHECK_STALE_VIEW,
    CHECK_TTL_SHORTER_THAN_SCHEDULE,
    CHECK_VM_EXPECTS_OTHER_COMPRESSOR,
    CHECK_WEIGHTS_SHA256_MISMATCH,
    LineageReport,
    build_lineage,
    lineage_command,
    read_dags,
    render,
    schedule_interval_seconds,
    to_mermaid,
)
from solaris_feast.store.definitions import (
    SolarisDefinitions,
    SolarisFeastConfig,
    solaris_definitions,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
VIEWS = ("solaris_pair", "solaris_similar", "solaris_user")

PRECOMPUTE_DAG = """
from datetime import datetime
from airflow.sdk import Asset, dag, task

PAIR_EMBEDDINGS = Asset(name="solaris_pair", uri="file://feature_repo/data/offline/solaris_pair")


@dag(dag_id="solaris_precompute", schedule="{schedule}", start_date=datetime(2026, 1, 1))
def precompute():
    @task
    def plan() -> str:
        return "plan"

    @task
    def infer(plan: str) -> str:
        return plan

    @task(outlets=[PAIR_EMBEDDINGS])
    def write(batch: str) -> None:
        from solaris_feast.store import write  # noqa: F401

    write(infer(plan()))


precompute()
"""

AGGREGATE_DAG = """
from airflow.sdk import Asset, dag, task


@dag(schedule=[Asset("solaris_pair")])
def solaris_aggregate():
    @task(outlets=[Asset(name="solaris_user", uri="file://feature_repo/data/offline/solaris_user")])
    def aggregate() -> None: ...

    aggregate()


solaris_aggregate()
"""

SIMILARITY_DAG = """
import os
from airflow.sdk import DAG, Asset
from airflow.providers.standard.operators.python import PythonOperator

with DAG("solaris_similarity_fill", schedule=os.environ.get("SIMILARITY_CRON", "{schedule}")):
    PythonOperator(task_id="fill", python_callable=print, outlets=[Asset("solaris_similar")])
"""


def write_dags(dags_dir: Path, pair_schedule: str = "@hourly", fill: str = "15 */2 * * *") -> Path:
    dags_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "precompute.py": PRECOMPUTE_DAG.replace("{schedule}", pair_schedule),
        "aggregate.py": AGGREGATE_DAG,
        "similarity.py": SIMILARITY_DAG.replace("{schedule}", fill),
    }
    for name, text in files.items():
        (dags_dir / name).write_text(text)
    return dags_dir


@dataclass(frozen=True)
class Cards:
    """Versions of the model cards written by the project's own ``save_model``."""

    models: Path
    fm: str
    compressor: str
    vm: str

    def config(self, **overrides: Any) -> SolarisFeastConfig:
        versions = {
            "fm_version": self.fm,
            "compressor_version": self.compressor,
            "verifier_version": self.vm,
            # The DAG folder of write_dags has one DAG per view; the factories' default names
            # the one real DAG that writes all three (solaris_precompute).
            "user_producing_dag": "solaris_aggregate",
            "similar_producing_dag": "solaris_similarity_fill",
        }
        return SolarisFeastConfig(**{**versions, **overrides})

    def weights(self, version: str) -> Path:
        return self.models / f"{version}.safetensors"


def write_cards(models_dir: Path, seed: int = 0) -> Cards:
    """FM -> compressor -> VM cards with real (tiny) safetensors weights."""
    import torch
    from torch import nn

    from solaris_feast.models.registry import save_model

    torch.manual_seed(seed)
    fm = save_model(nn.Linear(4, 3), "fm", models_dir, config={})
    compressor = save_model(
        nn.Linear(3, 2), "compressor", models_dir, parents=(fm.version,), config={}
    )
    vm = save_model(nn.Linear(2, 1), "vm", models_dir, parents=(compressor.version,), config={})
    return Cards(models_dir, fm.version, compressor.version, vm.version)


def make_repo(
    root: Path,
    config: SolarisFeastConfig,
    mutate: Callable[[SolarisDefinitions], list[Any]] | None = None,
    materialized_ago: timedelta | None = timedelta(minutes=20),
) -> Path:
    """A Feast repo with the SOLARIS definitions applied, materialized ``materialized_ago``."""
    from feast import FeatureStore

    repo = root / "feature_repo"
    repo.mkdir(parents=True)
    (repo / "feature_store.yaml").write_text(
        f"project: lineage_{uuid.uuid4().hex[:10]}\n"
        "provider: local\n"
        "registry: data/registry.db\n"
        "online_store:\n  type: sqlite\n  path: data/online.db\n"
        "offline_store:\n  type: file\n"
        "entity_key_serialization_version: 3\n"
    )
    definitions = solaris_definitions(config)
    extra = mutate(definitions) if mutate else []
    store = FeatureStore(repo_path=str(repo))
    store.apply([*definitions.all(), *extra])
    if materialized_ago is not None:
        for view in definitions.stored_views():
            store.registry.apply_materialization(
                view, store.project, NOW - timedelta(days=1), NOW - materialized_ago
            )
    return repo


@dataclass(frozen=True)
class Setup:
    repo: Path
    cards: Cards
    dags: Path

    def review(self) -> LineageReport:
        return build_lineage(self.repo, self.cards.models, self.dags, now=NOW)


def setup(
    tmp_path: Path,
    mutate: Callable[[SolarisDefinitions], list[Any]] | None = None,
    materialized_ago: timedelta | None = timedelta(minutes=20),
    precompute_schedule: str = "@hourly",
    **config: Any,
) -> Setup:
    cards = write_cards(tmp_path / "models")
    repo = make_repo(tmp_path, cards.config(**config), mutate, materialized_ago)
    return Setup(repo, cards, write_dags(tmp_path / "dags", pair_schedule=precompute_schedule))


def findings_of(report: LineageReport, check: str) -> dict[str, str]:
    return {f.subject: f.message for f in report.errors if f.check == check}


def test_sound_setup_lists_every_view_with_tags_and_ttl_and_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = setup(tmp_path)
    report = s.review()
    cards = s.cards

    assert report.errors == ()
    assert set(report.view_names()) == {*VIEWS, "solaris_resolved"}
    ttl = {v.name: v.ttl_seconds for v in report.views}
    assert ttl == {
        "solaris_pair": 6 * 3600,
        "solaris_similar": 6 * 3600,
        "solaris_user": 24 * 3600,
        "solaris_resolved": None,
    }
    for name in VIEWS:
        view = report.view(name)
        versions = (view.fm_version, view.compressor_version, view.verifier_version)
        assert versions == (cards.fm, cards.compressor, cards.vm)
        assert view.tags["solaris.ttl_seconds"] == str(int(ttl[name] or 0))
        assert view.tags["solaris.embedding_dim"] == "32"
        assert view.services == ("solaris_embeddings",)
        assert view.last_materialization == NOW - timedelta(minutes=20)
    # Schedules come from the DAG files: the asset-triggered aggregate runs as often as the
    # precompute that produces its asset, the fill every two hours (its env default).
    pair, similar, user = (report.view(n) for n in VIEWS)
    assert (pair.producing_dag, pair.schedule, pair.schedule_interval_seconds) == (
        "solaris_precompute",
        "@hourly",
        3600,
    )
    assert (similar.schedule, similar.schedule_interval_seconds) == ("15 */2 * * *", 7200)
    assert (user.schedule, user.schedule_interval_seconds) == ("solaris_pair", 3600)
    assert report.services[0].compressor_versions == (cards.compressor,)
    statuses = {c.version: (c.role, c.weights_status) for c in report.cards}
    assert statuses == {v: ("serving", "ok") for v in (cards.fm, cards.compressor, cards.vm)}

    edges = {(e.source, e.target) for e in report.edges}
    assert ("task_solaris_precompute_write", "asset_solaris_pair") in edges
    assert ("asset_solaris_pair", "dag_solaris_aggregate") in edges
    assert ("asset_solaris_pair", "table_solaris_pair_source") in edges
    assert ("table_solaris_pair_source", "view_solaris_pair") in edges
    assert ("view_solaris_pair", "service_solaris_embeddings") in edges
    assert ("service_solaris_embeddings", f"card_{cards.vm.replace('-', '_')}") in edges

    for fmt in ("md", "html", "json"):
        out = tmp_path / f"lineage.{fmt}"
        assert lineage_command(s.repo, cards.models, s.dags, fmt, out, now=NOW) == 0
        text = out.read_text()
        for name in (*VIEWS, "solaris_embeddings", "solaris_precompute", cards.vm):
            assert name in text, (fmt, name)
    as_json = json.loads((tmp_path / "lineage.json").read_text())
    assert as_json["ok"] is True
    by_name = {v["name"]: v for v in as_json["views"]}
    assert by_name["solaris_user"]["ttl_seconds"] == 86400
    assert by_name["solaris_pair"]["tags"]["solaris.compressor_version"] == cards.compressor
    assert as_json["mermaid"].startswith("flowchart LR")
    markdown = (tmp_path / "lineage.md").read_text()
    assert "| TTL | 6h (21600 s) |" in markdown
    assert "```mermaid" in markdown
    assert "lineage check" not in capsys.readouterr().err


def test_view_without_version_tags_fails(tmp_path: Path) -> None:
    def drop_fm_tag(definitions: SolarisDefinitions) -> list[Any]:
        del definitions.pair_view.tags["solaris.fm_version"]
        return []

    report = setup(tmp_path, mutate=drop_fm_tag).review()
    flagged = findings_of(report, CHECK_MISSING_VERSION_TAGS)
    assert set(flagged) == {"solaris_pair"}
    assert "solaris.fm_version" in flagged["solaris_pair"]

    # The factories' default, "unversioned", traces nothing either.
    root = tmp_path / "unversioned"
    unversioned = make_repo(root, SolarisFeastConfig())
    report = build_lineage(unversioned, tmp_path / "models", tmp_path / "dags", now=NOW)
    assert set(findings_of(report, CHECK_MISSING_VERSION_TAGS)) == {*VIEWS, "solaris_resolved"}
    code = lineage_command(
        unversioned, tmp_path / "models", tmp_path / "dags", "md", root / "r.md", now=NOW
    )
    assert code == 1


def test_mixed_compressor_versions_in_one_service_fail(tmp_path: Path) -> None:
    def older_similar(definitions: SolarisDefinitions) -> list[Any]:
        definitions.similar_view.tags["solaris.compressor_version"] = "compressor-old"
        return []

    s = setup(tmp_path, mutate=older_similar)
    report = s.review()
    message = findings_of(report, CHECK_MIXED_COMPRESSOR_VERSIONS)["solaris_embeddings"]
    assert "compressor-old: solaris_similar" in message
    assert f"{s.cards.compressor}: solaris_pair, solaris_user" in message
    # The serving VM was trained on the current compressor; the service also serves the old one.
    vm_message = findings_of(report, CHECK_VM_EXPECTS_OTHER_COMPRESSOR)["solaris_embeddings"]
    assert s.cards.vm in vm_message and "compressor-old" in vm_message
    assert "class service_solaris_embeddings problem" in to_mermaid(report)


def test_ttl_shorter_than_producing_schedule_fails(tmp_path: Path) -> None:
    s = setup(
        tmp_path,
        materialized_ago=timedelta(minutes=5),
        precompute_schedule="0 */6 * * *",
        pair_ttl_seconds=1800,
        # The aggregate DAG is asset-triggered: its gap is the precompute's 6 h.
        user_ttl_seconds=3 * 3600,
    )
    flagged = findings_of(s.review(), CHECK_TTL_SHORTER_THAN_SCHEDULE)
    assert set(flagged) == {"solaris_pair", "solaris_user"}
    assert "TTL 30m" in flagged["solaris_pair"] and "6h" in flagged["solaris_pair"]
    assert "misses are guaranteed" in flagged["solaris_pair"]
    assert "TTL 3h" in flagged["solaris_user"]


def test_ttl_check_falls_back_to_the_schedule_tag_without_a_dag_file(tmp_path: Path) -> None:
    s = setup(tmp_path, pair_producing_dag="nightly_precompute", pair_schedule="@daily")
    no_dags = tmp_path / "no-dags"
    no_dags.mkdir()
    report = build_lineage(s.repo, s.cards.models, no_dags, now=NOW)
    assert report.view("solaris_pair").schedule_interval_seconds == 86400
    assert set(findings_of(report, CHECK_TTL_SHORTER_THAN_SCHEDULE)) == {"solaris_pair"}
    notes = [f.message for f in report.findings if f.severity == "warning"]
    assert any("nightly_precompute" in n and "not found" in n for n in notes)


def test_materialization_older_than_ttl_fails_unless_a_newer_write_exists(tmp_path: Path) -> None:
    s = setup(tmp_path, materialized_ago=timedelta(hours=7))
    flagged = findings_of(s.review(), CHECK_STALE_VIEW)
    # 7 h is past the 6 h TTL of pair and similar, inside the user view's 24 h.
    assert set(flagged) == {"solaris_pair", "solaris_similar"}
    assert "7h ago" in flagged["solaris_pair"]

    # A write to the offline log newer than the TTL (what EmbeddingWriter leaves) clears it.
    day = s.repo / "data" / "offline" / "solaris_pair" / "2026-03-01"
    day.mkdir(parents=True)
    written_at = pd.Timestamp(NOW - timedelta(minutes=30))
    table = pa.table(
        {
            "user_id": pa.array([1, 2], pa.int64()),
            "item_id": pa.array([3, 4], pa.int64()),
            "event_timestamp": pa.array([written_at.value] * 2, pa.timestamp("ns", tz="UTC")),
            "written_at": pa.array([written_at.value] * 2, pa.timestamp("ns", tz="UTC")),
        }
    )
    pq.write_table(table, day / "part-0.parquet")
    report = s.review()
    assert report.view("solaris_pair").last_write == written_at.to_pydatetime()
    assert set(findings_of(report, CHECK_STALE_VIEW)) == {"solaris_similar"}


def test_weights_sha256_mismatch_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = setup(tmp_path)
    compressor = s.cards.compressor
    s.cards.weights(compressor).write_bytes(b"retrained without a new card")
    flagged = findings_of(s.review(), CHECK_WEIGHTS_SHA256_MISMATCH)
    assert set(flagged) == {compressor}
    assert hashlib.sha256(b"retrained without a new card").hexdigest() in flagged[compressor]

    out = tmp_path / "out.json"
    assert lineage_command(s.repo, s.cards.models, s.dags, "json", out, now=NOW) == 1
    assert f"FAIL [{CHECK_WEIGHTS_SHA256_MISMATCH}] {compressor}" in capsys.readouterr().err
    assert json.loads(out.read_text())["ok"] is False


def test_only_cards_in_use_are_verified(tmp_path: Path) -> None:
    models = tmp_path / "models"
    older = write_cards(models, seed=0)
    # A newer training run: its VM is what load_bundle serves; the first run is history.
    newer = write_cards(models, seed=1)
    dags = write_dags(tmp_path / "dags")
    older.weights(older.vm).write_bytes(b"an old VM nobody loads")

    report = build_lineage(make_repo(tmp_path / "current", newer.config()), models, dags, now=NOW)
    roles = {c.version: (c.role, c.weights_status) for c in report.cards}
    assert roles[newer.vm] == ("serving", "ok")
    assert roles[older.vm] == ("", "unchecked")
    assert report.errors == ()

    # Once a view names the tampered VM as its verifier, its weights matter again.
    repo = make_repo(tmp_path / "verifier", newer.config(verifier_version=older.vm))
    report = build_lineage(repo, models, dags, now=NOW)
    assert {c.version: c.role for c in report.cards}[older.vm] == "tagged"
    assert set(findings_of(report, CHECK_WEIGHTS_SHA256_MISMATCH)) == {older.vm}

    # Views still holding the older run's embeddings are not what the serving VM was trained on.
    repo = make_repo(tmp_path / "stale-space", older.config(verifier_version=newer.vm))
    report = build_lineage(repo, models, dags, now=NOW)
    message = findings_of(report, CHECK_VM_EXPECTS_OTHER_COMPRESSOR)["solaris_embeddings"]
    assert newer.compressor in message and older.compressor in message


def test_push_sources_appear_in_the_graph(tmp_path: Path) -> None:
    from feast import FeatureView, PushSource

    def add_pushed_view(definitions: SolarisDefinitions) -> list[Any]:
        pair = definitions.pair_view
        push = PushSource(name="solaris_pair_push", batch_source=pair.batch_source)
        pushed = FeatureView(
            name="solaris_pair_pushed",
            entities=[definitions.user, definitions.item],
            ttl=pair.ttl,
            schema=pair.schema,
            source=push,
            tags=dict(pair.tags),
        )
        return [push, pushed]

    report = setup(tmp_path, mutate=add_pushed_view).review()
    sources = {s.name: s for s in report.sources}
    assert sources["solaris_pair_push"].kind == "push"
    assert sources["solaris_pair_push"].batch_source == "solaris_pair_source"
    assert "solaris_pair_push" in report.view("solaris_pair_pushed").sources
    edges = {(e.source, e.target, e.label) for e in report.edges}
    assert ("push_solaris_pair_push", "view_solaris_pair_pushed", "push") in edges
    assert ("push_solaris_pair_push", "table_solaris_pair_source", "offline") in edges
    # The precompute task's asset feeds the push source.
    assert ("asset_solaris_pair", "push_solaris_pair_push", "push") in edges
    assert 'push_solaris_pair_push>"push source solaris_pair_push"]' in to_mermaid(report)


def test_missing_repo_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = lineage_command(tmp_path / "nowhere", tmp_path, tmp_path, "md", None)
    assert code == 2
    assert "feature_store.yaml" in capsys.readouterr().err
    assert lineage_command(tmp_path, tmp_path, tmp_path, "pdf", None) == 2


def test_dag_schedules_are_read_from_airflows_dag_objects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dags = write_dags(tmp_path / "dags")
    (dags / "settings.py").write_text('NIGHTLY = "30 2 * * *"\n')
    (dags / "more.py").write_text(
        """
from datetime import timedelta
from airflow.sdk import Asset, CronTriggerTimetable, MultipleCronTriggerTimetable, dag, task
from settings import NIGHTLY

print("parsed more.py")


def compute_schedule() -> str:
    return "*/20 * * * *"


@dag(schedule=NIGHTLY)
def nightly():
    pass

@dag(dag_id="every_90_minutes", schedule=timedelta(hours=1, minutes=30))
def every():
    @task(task_id="shared_step", outlets=[Asset("c")])
    def step():
        pass

    step()

@dag(schedule=Asset("a") | Asset("b"))
def either():
    pass

@dag(schedule=CronTriggerTimetable("0 9-17 * * 1-5", timezone="UTC"))
def office_hours():
    pass

@dag(schedule=MultipleCronTriggerTimetable("0 1 * * *", "0 13 * * *", timezone="UTC"))
def twice_daily():
    pass

@dag(schedule=compute_schedule())
def dynamic():
    pass

@dag(schedule=None)
def manual():
    pass

for d in (nightly, every, either, office_hours, twice_daily, dynamic, manual):
    d()
"""
    )
    (dags / "broken.py").write_text(
        "from airflow.sdk import dag\nraise RuntimeError('half-written')\n"
    )
    # What runs is what the DAG file computes at parse time, environment included.
    monkeypatch.setenv("SIMILARITY_CRON", "*/10 * * * *")
    dags_read, findings = read_dags(dags)
    found = {d.dag_id: d for d in dags_read}
    assert (found["nightly"].schedule, found["nightly"].interval_seconds) == ("30 2 * * *", 86400)
    assert found["every_90_minutes"].schedule_kind == "interval"
    assert found["every_90_minutes"].interval_seconds == 5400
    assert found["every_90_minutes"].tasks[0].outlets == ("c",)
    assert found["either"].triggering_assets == ("a", "b")
    assert found["either"].schedule == "a | b"
    # Friday 17:00 to Monday 09:00 is the longest gap.
    assert found["office_hours"].interval_seconds == 64 * 3600
    assert found["twice_daily"].interval_seconds == 12 * 3600
    assert (found["dynamic"].schedule, found["dynamic"].interval_seconds) == ("*/20 * * * *", 1200)
    assert found["manual"].schedule_kind == "manual"
    assert found["manual"].interval_seconds is None
    assert [t.task_id for t in found["solaris_precompute"].tasks] == ["plan", "infer", "write"]
    assert found["solaris_precompute"].outlets == ("solaris_pair",)
    assert found["solaris_similarity_fill"].tasks[0].outlets == ("solaris_similar",)
    assert found["solaris_similarity_fill"].interval_seconds == 600
    assert found["solaris_aggregate"].interval_seconds == 3600
    # A file that fails to import is named in a warning; the other files are still read.
    broken = [f for f in findings if f.subject.endswith("broken.py")]
    assert [(f.severity, "half-written" in f.message) for f in broken] == [("warning", True)]
    # stdout is kept for the report: what parsing prints goes to stderr.
    printed = capsys.readouterr()
    assert "parsed more.py" not in printed.out and "parsed more.py" in printed.err


def test_malformed_card_fails_the_review_naming_the_file(tmp_path: Path) -> None:
    s = setup(tmp_path)
    bad = s.cards.models / "vm-bad.card.json"
    bad.write_text(json.dumps({"version": "vm-bad", "kind": "vm", "weights_sha256": "xyz"}))
    report = s.review()
    problems = [f for f in report.errors if f.subject == str(bad)]
    assert len(problems) == 1
    assert "weights_sha256" in problems[0].message and "weights_file" in problems[0].message
    # The sound cards are still reviewed.
    assert {c.version for c in report.cards} == {s.cards.fm, s.cards.compressor, s.cards.vm}


@pytest.mark.parametrize(
    ("schedule", "seconds"),
    [
        ("@hourly", 3600),
        ("@daily", 86400),
        ("@weekly", 7 * 86400),
        ("@monthly", 31 * 86400),
        ("*/15 * * * *", 900),
        ("0 0,6 * * *", 18 * 3600),
        ("@once", None),
        (None, None),
    ],
)
def test_schedule_interval_is_the_longest_gap(schedule: str | None, seconds: float | None) -> None:
    assert schedule_interval_seconds(schedule) == seconds


def test_unparseable_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="cron"):
        schedule_interval_seconds("every other tuesday")


def test_cli_command_reports_coverage_and_exit_code(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from solaris_feast.review.lineage import lineage_cli

    app = typer.Typer()
    app.command("lineage")(lineage_cli)
    app.command("noop")(lambda: None)  # a second command, so "lineage" stays a sub-command
    s = setup(tmp_path, materialized_ago=None)
    repo, models, dags = s.repo, s.cards.models, s.dags
    coverage = tmp_path / "status.json"
    coverage.write_text(json.dumps({"coverage": {"EXACT": 0.625, "solaris_user": 0.9}}))
    out = tmp_path / "lineage.json"
    args = ["lineage", "--repo", str(repo), "--models", str(models), "--dags", str(dags)]
    result = CliRunner().invoke(
        app, [*args, "--format", "json", "--output", str(out), "--coverage", str(coverage)]
    )
    # Never materialized and nothing written is a warning, not a failure.
    assert result.exit_code == 0, result.output
    views = {v["name"]: v for v in json.loads(out.read_text())["views"]}
    assert views["solaris_pair"]["coverage"] == 0.625
    assert views["solaris_user"]["coverage"] == 0.9
    assert views["solaris_similar"]["coverage"] is None

    s.cards.weights(s.cards.vm).write_bytes(b"tampered")
    result = CliRunner().invoke(app, [*args, "--format", "md"])
    assert result.exit_code == 1
    assert "| Coverage | n/a |" in result.output


ONE_DAG_WRITES_ALL = """
import os
from airflow.sdk import Asset, dag, task

SCHEDULE = os.environ.get("SOLARIS_PRECOMPUTE_SCHEDULE", "@hourly")
PAIR = Asset(name="solaris_pair", uri="feast://solaris/solaris_pair")
USERS = Asset(name="solaris_user", uri="feast://solaris/solaris_user")
SIMILAR = Asset(name="solaris_similar", uri="feast://solaris/solaris_similar")


@dag(dag_id="solaris_precompute", schedule=SCHEDULE)
def solaris_precompute():
    @task(outlets=[PAIR])
    def precompute_shard(shard_index: int) -> None: ...

    @task(outlets=[USERS])
    def aggregate_users() -> None: ...

    @task(outlets=[SIMILAR])
    def fill_similar() -> None: ...

    precompute_shard.partial().expand(shard_index=[0, 1]) >> aggregate_users() >> fill_similar()


solaris_precompute()
"""


def test_producing_dag_is_found_by_the_asset_when_the_tag_names_no_dag(tmp_path: Path) -> None:
    cards = write_cards(tmp_path / "models")
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "solaris_precompute.py").write_text(ONE_DAG_WRITES_ALL)
    # The tags name the user and similar DAGs of write_dags, which are not in this folder.
    repo = make_repo(tmp_path, cards.config(user_ttl_seconds=1800))
    report = build_lineage(repo, cards.models, dags, now=NOW)
    for name in VIEWS:
        assert report.view(name).producing_dag == "solaris_precompute"
    assert report.view("solaris_user").producing_dag_tag == "solaris_aggregate"
    notes = {f.subject: f.message for f in report.findings if f.severity == "warning"}
    assert "set the tag to 'solaris_precompute'" in notes["solaris_user"]
    # The schedule used is the DAG's: a 30 min user TTL cannot outlive the hourly run.
    assert set(findings_of(report, CHECK_TTL_SHORTER_THAN_SCHEDULE)) == {"solaris_user"}
    edges = {(e.source, e.target) for e in report.edges}
    assert ("task_solaris_precompute_aggregate_users", "asset_solaris_user") in edges
    assert ("asset_solaris_user", "table_solaris_user_source") in edges


def test_a_repos_own_view_names_are_linked_to_the_role_assets_the_dag_marks(
    tmp_path: Path,
) -> None:
    """The precompute DAG marks solaris_pair ... whatever the repo calls its views; a repo of its
    own names (shop_pair) left the asset nodes unconnected to any view."""
    cards = write_cards(tmp_path / "models")
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "solaris_precompute.py").write_text(ONE_DAG_WRITES_ALL)
    own = {
        "pair_view_name": "shop_pair",
        "user_view_name": "shop_user",
        "similar_view_name": "shop_similar",
        "resolved_view_name": "shop_resolved",
        "user_producing_dag": "solaris_precompute",
        "similar_producing_dag": "solaris_precompute",
    }
    report = build_lineage(make_repo(tmp_path, cards.config(**own)), cards.models, dags, now=NOW)
    edges = {(e.source, e.target, e.label) for e in report.edges}
    for role, view in [("pair", "shop_pair"), ("user", "shop_user"), ("similar", "shop_similar")]:
        assert (f"asset_solaris_{role}", f"view_{view}", "online write") in edges


def test_coverage_comes_from_the_newest_precompute_run(tmp_path: Path) -> None:
    s = setup(tmp_path)
    assert s.review().coverage_source is None
    runs = s.repo / "data" / "precompute_runs"
    older = runs / "20260301T100000" / s.cards.vm / "coverage.json"
    newer = runs / "20260301T110000" / s.cards.vm / "coverage.json"
    for path, exact in ((older, 0.1), (newer, 0.5)):
        path.parent.mkdir(parents=True)
        shares = {"exact": exact, "similar": 0.2, "user": 0.1, "zero": 0.7 - exact}
        path.write_text(json.dumps({"coverage": shares, "any_tier": 0.3 + exact}))
    os.utime(older, (1, 1))  # the older run's file is the older one on disk too

    report = s.review()
    assert report.coverage_source == str(newer)
    coverage = {v.name: v.coverage for v in report.views}
    assert coverage == {
        "solaris_pair": 0.5,
        "solaris_similar": 0.2,
        "solaris_user": 0.1,
        "solaris_resolved": 0.8,
    }
    assert "| Coverage | 50.0% |" in render(report, "md")


def test_a_registry_without_solaris_views_fails_the_review(
    tmp_path: Path, feast_project: str
) -> None:
    """A repo never applied has nothing to review: that said "All checks passed", and Feast's
    first read left an empty registry file in the user's repo. A registry applied without
    SOLARIS views (another project's) fails the review."""
    from test_dags import make_feature_repo

    from solaris_feast.errors import ConfigError
    from solaris_feast.store.config import open_repo_store

    repo = make_feature_repo(tmp_path / "repo", feast_project, apply=False)
    (tmp_path / "dags").mkdir()
    before = sorted(p.relative_to(repo) for p in repo.rglob("*"))
    with pytest.raises(ConfigError, match="never applied: run `feast apply`"):
        build_lineage(repo, tmp_path / "models", tmp_path / "dags")
    assert sorted(p.relative_to(repo) for p in repo.rglob("*")) == before

    open_repo_store(repo).apply([])  # a registry, with none of our views in it
    report = build_lineage(repo, tmp_path / "models", tmp_path / "dags")
    assert [f.check for f in report.errors] == [CHECK_NO_SOLARIS_VIEWS]
    assert "run `feast apply`" in report.errors[0].message
