"""The torch-free card module: reading, verifying and selecting model cards, and the feature
repo's lineage tags that come from them."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from solaris_feast.errors import ArtifactIntegrityError, ConfigError
from solaris_feast.models.cards import (
    MODELS_DIR_ENV,
    PAIR_TTL_ENV,
    SCHEDULE_ENV,
    check_weights,
    list_cards,
    models_dir_for_repo,
    newest_chain,
    read_card,
    scan_cards,
    select_chain,
    serving_embedding_version,
    sha256_of,
    verify_weights,
    versioned_feast_config,
)
from solaris_feast.review.lineage import read_dags
from solaris_feast.store.definitions import SolarisFeastConfig

ROOT = Path(__file__).resolve().parents[1]
REPO = ROOT / "feature_repo"


def write_card(
    models: Path,
    version: str,
    kind: str,
    created_at: str,
    parents: tuple[str, ...] = (),
    config: dict[str, object] | None = None,
    **fields: object,
) -> Path:
    """A card shaped as ``save_model`` writes it (the weights are never read here)."""
    models.mkdir(parents=True, exist_ok=True)
    card = {
        "version": version,
        "kind": kind,
        "parents": list(parents),
        "created_at": created_at,
        "config": config or {},
        "weights_file": f"{version}.safetensors",
        "weights_sha256": "0" * 64,
        **fields,
    }
    path = models / f"{version}.card.json"
    path.write_text(json.dumps(card))
    return path


def two_chains(models: Path) -> None:
    """An old chain, a newer one with code_dim 8, and a still newer compressor with no VM yet."""
    write_card(models, "fm-a", "fm", "2026-01-01T00:00:00Z")
    write_card(models, "compressor-a", "compressor", "2026-01-01T01:00:00Z", ("fm-a",))
    write_card(models, "vm-a", "vm", "2026-01-01T02:00:00Z", ("compressor-a",))
    write_card(models, "fm-b", "fm", "2026-02-01T00:00:00Z")
    write_card(
        models,
        "compressor-b",
        "compressor",
        "2026-02-01T01:00:00Z",
        ("fm-b",),
        {"model": {"input_dim": 128, "code_dim": 8, "hidden_dim": 16}},
    )
    write_card(models, "vm-b", "vm", "2026-02-01T02:00:00Z", ("compressor-b",))
    write_card(models, "compressor-c", "compressor", "2026-03-01T00:00:00Z", ("fm-b",))
    (models / "metrics.json").write_text("{}")  # not a card: ignored


def test_tags_follow_the_newest_vm_chain_not_the_newest_compressor(tmp_path: Path) -> None:
    models = tmp_path / "models"
    two_chains(models)
    chain = newest_chain(models)
    assert chain is not None and chain.vm is not None
    assert (chain.fm.version, chain.compressor.version, chain.vm.version) == (
        "fm-b",
        "compressor-b",
        "vm-b",
    )
    # Serving loads the newest VM's compressor: that is the version stored with embeddings.
    assert serving_embedding_version(models) == "compressor-b"
    config = versioned_feast_config(models, environ={})
    assert (config.fm_version, config.compressor_version, config.verifier_version) == (
        "fm-b",
        "compressor-b",
        "vm-b",
    )
    assert config.embedding_dim == 8


def test_the_promoted_chain_not_the_newest_is_the_serving_embedding_version(
    tmp_path: Path,
) -> None:
    """After a newer chain is trained but not promoted, what serving expects (and what the
    status and the lineage review check the store against) is the promoted chain."""
    from solaris_feast.models.cards import SERVING_ALIAS_FILE, ServingAlias, serving_chain

    models = tmp_path / "models"
    two_chains(models)
    assert serving_embedding_version(models) == "compressor-b"  # nothing promoted: the newest
    alias = ServingAlias(
        vm="vm-a", compressor="compressor-a", fm="fm-a", promoted_at="2026-01-02T00:00:00Z"
    )
    (models / SERVING_ALIAS_FILE).write_text(alias.model_dump_json())
    assert serving_embedding_version(models) == "compressor-a"
    chain = serving_chain(models)
    assert chain is not None and chain.vm is not None and chain.vm.version == "vm-a"


def test_without_cards_everything_is_unversioned(tmp_path: Path) -> None:
    assert newest_chain(tmp_path / "missing") is None
    assert serving_embedding_version(tmp_path) is None
    config = versioned_feast_config(tmp_path / "missing", environ={})
    assert config == SolarisFeastConfig()
    assert config.compressor_version == "unversioned" and config.embedding_dim == 32


def test_compressor_without_vm_is_served_unverified(tmp_path: Path) -> None:
    write_card(tmp_path, "fm-a", "fm", "2026-01-01T00:00:00Z")
    write_card(tmp_path, "compressor-a", "compressor", "2026-01-01T01:00:00Z", ("fm-a",))
    config = versioned_feast_config(tmp_path, environ={})
    assert (config.fm_version, config.compressor_version, config.verifier_version) == (
        "fm-a",
        "compressor-a",
        "unversioned",
    )


def test_missing_parent_card_and_bad_ttl_are_config_errors(tmp_path: Path) -> None:
    write_card(tmp_path, "vm-x", "vm", "2026-01-01T00:00:00Z", ("compressor-gone",))
    with pytest.raises(ConfigError, match="compressor-gone"):
        versioned_feast_config(tmp_path, environ={})
    with pytest.raises(ConfigError, match=PAIR_TTL_ENV):
        versioned_feast_config(tmp_path / "none", environ={PAIR_TTL_ENV: "6h"})
    # A number out of bounds, an unknown codec: the variable is named, not the view config's
    # field (a pydantic traceback out of feast apply before).
    with pytest.raises(ConfigError, match=rf"{PAIR_TTL_ENV}=-5: .*greater than 0"):
        versioned_feast_config(tmp_path / "none", environ={PAIR_TTL_ENV: "-5"})
    with pytest.raises(ConfigError, match=r"SOLARIS_EMBEDDING_CODEC .*='bogus': .*'int8'"):
        versioned_feast_config(tmp_path / "none", environ={"SOLARIS_EMBEDDING_CODEC": "bogus"})
    (tmp_path / "vm-x.card.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not readable JSON"):
        newest_chain(tmp_path)


def test_environment_sets_ttls_schedule_and_models_folder(tmp_path: Path) -> None:
    env = {PAIR_TTL_ENV: "7200", SCHEDULE_ENV: "*/30 * * * *"}
    config = versioned_feast_config(tmp_path, environ=env)
    assert (config.pair_ttl_seconds, config.user_ttl_seconds) == (7200, 24 * 3600)
    assert config.pair_schedule == config.similar_schedule == "*/30 * * * *"
    assert models_dir_for_repo(tmp_path / "repo", environ={}) == tmp_path / "models"
    assert models_dir_for_repo(tmp_path, environ={MODELS_DIR_ENV: "/x/m"}) == Path("/x/m")


def test_feast_apply_reads_the_models_folder_of_the_solaris_config(tmp_path: Path) -> None:
    """solaris train, promote and the DAGs keep the chain in the config's models.dir; an apply
    that looked beside the repo instead tagged the views with another chain, and every round
    then refused them with an error whose remedy (re-apply) changed nothing."""
    config = tmp_path / "deploy" / "solaris.yaml"
    config.parent.mkdir()
    config.write_text(
        "feast: {repo: repo}\n"
        "models: {dir: shared/models}\n"
        "log: {path: log, columns: {user: u, item: i, timestamp: ts, labels: [click]}}\n"
    )
    env = {"SOLARIS_CONFIG": str(config), MODELS_DIR_ENV: "/x/m"}
    assert models_dir_for_repo(tmp_path / "repo", environ=env) == (
        tmp_path / "deploy" / "shared" / "models"
    )


def test_feast_apply_tags_views_with_the_model_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner
    from feast import FeatureStore
    from feast.cli.cli import cli as feast_cli

    repo = tmp_path / "feature_repo"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("data", "__pycache__"))
    two_chains(tmp_path / "cards")
    monkeypatch.setenv(MODELS_DIR_ENV, str(tmp_path / "cards"))
    monkeypatch.setenv(PAIR_TTL_ENV, "5400")
    # feast apply imports solaris_repo by module name: drop a copy an earlier apply imported.
    monkeypatch.delitem(sys.modules, "solaris_repo", raising=False)
    monkeypatch.syspath_prepend(str(repo))
    done = CliRunner().invoke(feast_cli, ["--chdir", str(repo), "apply"])
    monkeypatch.delitem(sys.modules, "solaris_repo", raising=False)
    assert done.exit_code == 0, (done.output[-2000:], done.exception)

    views = {v.name: v for v in FeatureStore(repo_path=str(repo)).list_feature_views()}
    assert set(views) == {"solaris_pair", "solaris_user", "solaris_similar"}
    for view in views.values():
        assert view.tags["solaris.fm_version"] == "fm-b"
        assert view.tags["solaris.compressor_version"] == "compressor-b"
        assert view.tags["solaris.verifier_version"] == "vm-b"
        assert view.tags["solaris.embedding_dim"] == "8"
        assert view.tags["solaris.producing_dag"] == "solaris_precompute"
    assert views["solaris_pair"].ttl is not None
    assert views["solaris_pair"].ttl.total_seconds() == 5400
    assert views["solaris_pair"].tags["solaris.ttl_seconds"] == "5400"


def test_default_producing_dags_declare_the_views_they_are_tagged_with() -> None:
    dags = {d.dag_id: d for d in read_dags(ROOT / "dags")[0]}
    config = SolarisFeastConfig()
    for view, dag_id in (
        (config.pair_view_name, config.pair_producing_dag),
        (config.user_view_name, config.user_producing_dag),
        (config.similar_view_name, config.similar_producing_dag),
    ):
        assert dag_id in dags, (view, dag_id)
        assert view in dags[dag_id].outlets, (view, dags[dag_id].outlets)


def test_reading_the_chain_imports_no_torch(tmp_path: Path) -> None:
    # Feast itself imports torch when it is installed, so the check is on our part of the path:
    # reading cards and building the config must not need the model registry (or torch).
    two_chains(tmp_path)
    code = (
        "import sys; from pathlib import Path; "
        "from solaris_feast.models.cards import versioned_feast_config as v; "
        "print(v(Path(sys.argv[1]), environ={}).compressor_version, "
        "'torch' in sys.modules, 'solaris_feast.models.registry' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.split() == ["compressor-b", "False", "False"]


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"kind": "teacher"}, "kind"),
        ({"weights_sha256": "abc"}, "weights_sha256"),
        ({"weights_file": "../elsewhere/w.safetensors"}, "weights_file"),
        ({"weights_file": "/abs/w.safetensors"}, "weights_file"),
        ({"created_at": "yesterday"}, "created_at"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_a_malformed_card_is_refused_naming_its_file_and_field(
    tmp_path: Path, fields: dict[str, object], problem: str
) -> None:
    card: dict[str, object] = {"kind": "vm", "created_at": "2026-01-01T00:00:00Z", **fields}
    kind, created_at = str(card.pop("kind")), str(card.pop("created_at"))
    path = write_card(tmp_path, "vm-x", kind, created_at, parents=(), config=None, **card)
    with pytest.raises(ConfigError, match=problem) as refused:
        read_card(path)
    assert str(path) in str(refused.value)
    # Reading the folder refuses the same card; scanning keeps it as a problem beside the others.
    with pytest.raises(ConfigError, match=problem):
        list_cards(tmp_path)
    write_card(tmp_path, "fm-a", "fm", "2026-01-01T00:00:00Z")
    scan = scan_cards(tmp_path)
    assert [c.version for c in scan.cards] == ["fm-a"]
    assert [p for p, _ in scan.problems] == [path]


def test_a_card_must_be_named_after_its_version(tmp_path: Path) -> None:
    path = write_card(tmp_path, "vm-x", "vm", "2026-01-01T00:00:00Z")
    renamed = path.rename(tmp_path / "vm-y.card.json")
    with pytest.raises(ConfigError, match=r"vm-x\.card\.json"):
        read_card(renamed)


def test_a_card_time_without_zone_is_read_as_utc_so_cards_still_sort(tmp_path: Path) -> None:
    write_card(tmp_path, "fm-a", "fm", "2026-01-01T00:00:00Z")
    write_card(tmp_path, "fm-b", "fm", "2026-01-01T01:00:00")
    assert [c.version for c in list_cards(tmp_path)] == ["fm-a", "fm-b"]
    assert list_cards(tmp_path)[1].created_at.utcoffset() is not None


def test_weights_are_verified_against_the_card(tmp_path: Path) -> None:
    weights = tmp_path / "fm-a.safetensors"
    weights.write_bytes(b"the weights")
    digest = hashlib.sha256(b"the weights").hexdigest()
    assert sha256_of(weights) == digest
    card = read_card(
        write_card(tmp_path, "fm-a", "fm", "2026-01-01T00:00:00Z", weights_sha256=digest)
    )
    assert check_weights(card, tmp_path).status == "ok"
    assert verify_weights(card, tmp_path) == weights

    weights.write_bytes(b"other weights")
    check = check_weights(card, tmp_path)
    assert (check.status, check.actual_sha256) == ("mismatch", sha256_of(weights))
    with pytest.raises(ArtifactIntegrityError, match="sha256"):
        verify_weights(card, tmp_path)

    weights.unlink()
    assert check_weights(card, tmp_path).status == "missing"
    with pytest.raises(ConfigError, match="does not exist"):
        verify_weights(card, tmp_path)


def test_select_chain_of_a_named_vm_and_of_an_unknown_one(tmp_path: Path) -> None:
    two_chains(tmp_path)
    cards = list_cards(tmp_path)
    chain = select_chain(cards, "vm-a")
    assert chain is not None and chain.vm is not None
    assert [c.version for c in chain.cards] == ["fm-a", "compressor-a", "vm-a"]
    with pytest.raises(ConfigError, match="vm-gone"):
        select_chain(cards, "vm-gone")
    assert select_chain([]) is None


def test_an_fm_or_vm_version_asked_for_is_refused_naming_the_exact_version_to_send(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that sends the VM's version is told the compressor version of that VM's own
    chain, read from the serving repo's registry, not a placeholder to look up."""
    from solaris_feast.models.cards import check_embedding_version

    monkeypatch.delenv("SOLARIS_CONFIG", raising=False)
    monkeypatch.delenv(MODELS_DIR_ENV, raising=False)
    models, repo = tmp_path / "models", tmp_path / "feature_repo"
    old = ("fm-20260101T000000-0000000a", "compressor-20260101T010000-0000000b")
    new = ("fm-20260201T000000-0000000c", "compressor-20260201T010000-0000000d")
    vm_old, vm_new = "vm-20260101T020000-0000000e", "vm-20260201T020000-0000000f"
    for (fm, compressor), vm, month in ((old, vm_old, "01"), (new, vm_new, "02")):
        write_card(models, fm, "fm", f"2026-{month}-01T00:00:00Z")
        write_card(models, compressor, "compressor", f"2026-{month}-01T01:00:00Z", (fm,))
        write_card(models, vm, "vm", f"2026-{month}-01T02:00:00Z", (compressor,))

    def refusal(version: str, repo_dir: Path | None = repo) -> str:
        with pytest.raises(ConfigError) as refused:
            check_embedding_version(version, repo_dir)
        return str(refused.value)

    assert f"send {old[1]}" in refusal(vm_old)  # the VM's own chain, not the newest
    assert f"send {new[1]}" in refusal(new[0])  # the FM's newest compressor
    # A VM this registry does not hold: the serving chain's (here the newest) version.
    assert f"send {new[1]}" in refusal("vm-20260301T000000-000000aa")
    # Without a repo, or with a registry that holds nothing, where the version is printed.
    assert "solaris promote" in refusal(vm_old, None)
    assert "solaris promote" in refusal(vm_old, tmp_path / "elsewhere" / "repo")
    check_embedding_version(old[1], repo)  # an embedding version passes
    check_embedding_version("my-own-fm-v3", repo)  # so does a deployment's own shape
