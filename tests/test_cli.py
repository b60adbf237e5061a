"""The light entry points stay light: the ``solaris`` command's help and the modules the DAG
files import at parse time load none of the heavy libraries; the commands defined in other
modules are loaded only when they are called."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

REPO_ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "pandas", "feast", "faiss")

IMPORT_SCRIPT = """
import json, sys
import solaris_feast.cli
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in sys.argv[1].split(",")
    or m in ("solaris_feast.demo", "solaris_feast.bench", "solaris_feast.review.lineage"))))
"""


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }


def test_importing_the_cli_loads_no_heavy_library_nor_any_command_module() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_SCRIPT, ",".join(HEAVY)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_the_modules_dag_files_import_at_parse_time_load_no_heavy_library() -> None:
    script = (
        "import sys, json\n"
        "import solaris_feast.pipeline.settings, solaris_feast.pipeline.failures\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'pandas', 'feast', 'faiss', 'numpy', 'airflow'))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_solaris_help_exits_zero_and_lists_every_command() -> None:
    solaris = Path(sys.executable).with_name("solaris")
    command = [str(solaris)] if solaris.is_file() else [sys.executable, "-m", "solaris_feast.cli"]
    proc = subprocess.run(
        [*command, "--help"], env=_env(), capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("train", "demo", "evaluate", "bench", "lineage", "status", "simulate"):
        assert name in proc.stdout


@pytest.mark.parametrize("name", ["bench", "lineage", "status", "simulate"])
def test_a_lazy_command_shows_its_own_options_and_its_listed_help_is_its_docstring(
    name: str,
) -> None:
    from solaris_feast.cli import LAZY_COMMANDS, app, load_lazy_command

    result = CliRunner().invoke(app, [name, "--help"])
    assert result.exit_code == 0, result.output
    real = load_lazy_command(name)
    assert real.params or getattr(real, "commands", None)
    for param in real.params:
        for option in getattr(param, "opts", []):
            assert option in result.output
    # The short help listed by `solaris --help` is the command's own first docstring line.
    assert (real.help or "").strip().splitlines()[0] == LAZY_COMMANDS[name][1]


def test_a_lazy_command_runs_with_its_arguments(tmp_path: Path) -> None:
    from solaris_feast.cli import app

    # The lineage review of a folder that is not a Feast repo fails with a clear message.
    result = CliRunner().invoke(app, ["lineage", "--repo", str(tmp_path / "nowhere")])
    assert result.exit_code != 0
    assert "nowhere" in (result.output + str(result.exception))


def test_library_chatter_stays_out_of_the_console_after_airflow_is_imported(
    tmp_path: Path,
) -> None:
    """``quiet_libraries`` (the CLI without --verbose) drops Feast's and Airflow's INFO lines and
    Feast's experimental-feature warning, and reading the DAGs (which imports Airflow and so runs
    its logging setup) leaves the caller's handlers and our own INFO lines as they were."""
    script = tmp_path / "probe.py"
    script.write_text(
        textwrap.dedent(
            """
            import logging, warnings
            from pathlib import Path
            logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
            from solaris_feast.console import quiet_libraries
            quiet_libraries()
            handlers = list(logging.getLogger().handlers)
            from solaris_feast.review.lineage.dags import read_dags
            read_dags(Path("dags"))
            assert logging.getLogger().handlers == handlers, "Airflow replaced our handlers"
            logging.getLogger("feast.infra.registry.registry").info("Registry cache expired")
            logging.getLogger("solaris_feast.demo").info("our own progress line")
            warnings.warn("On demand feature view is an experimental feature. x", RuntimeWarning)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert done.returncode == 0, done.stderr
    console = done.stdout + done.stderr
    assert "our own progress line" in console
    assert "Registry cache expired" not in console
    assert "Filling up the DagBag" not in console
    assert "experimental feature" not in console


def test_a_store_that_is_down_ends_a_command_with_one_error_line_and_a_bug_keeps_its_trace() -> (
    None
):
    import redis
    import typer

    from solaris_feast.cli import _final_errors_exit

    with pytest.raises(typer.Exit) as stopped, _final_errors_exit():
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:16399. Connection refused.")
    assert stopped.value.exit_code == 1
    with pytest.raises(KeyError), _final_errors_exit():
        raise KeyError("a bug")


def test_a_misread_config_says_what_it_is_instead_of_a_traceback(tmp_path: Path) -> None:
    from solaris_feast.errors import ConfigError
    from solaris_feast.store.config import open_repo_store

    solaris_yaml = tmp_path / "solaris.yaml"
    solaris_yaml.write_text("feast: {repo: repo}\nlog: {path: log}\n")
    with pytest.raises(ConfigError, match=r"is a solaris config.*--config.*SOLARIS_CONFIG"):
        open_repo_store(tmp_path, solaris_yaml)
    typo = tmp_path / "feature_store.yaml"
    typo.write_text(
        "project: p\nprovider: local\nregistry: data/registry.db\n"
        "online_store: {type: redis, connection_strin: localhost:6379}\n"
    )
    with pytest.raises(ConfigError, match=r"(?s)connection_strin.*feature_store\.yaml"):
        open_repo_store(tmp_path)
    result = CliRunner().invoke(
        __import__("solaris_feast.cli", fromlist=["app"]).app,
        ["status", "--repo", str(tmp_path), "--config", str(solaris_yaml)],
    )
    # status reads a solaris.yaml given as --config as the other commands do, and says what
    # that file lacks.
    assert result.exit_code == 2 and "log.columns: Field required" in result.output
    assert "Traceback" not in result.output


def test_simulate_says_which_given_options_its_world_does_not_read() -> None:
    """The funnel has its own world: --size and --steps given with it are named, not silently
    dropped (here the unknown planner then stops the command before any run)."""
    from solaris_feast.cli import app

    result = CliRunner().invoke(
        app,
        ["simulate", "--world", "funnel", "--size", "tiny", "--steps", "1", "--planner", "nope"],
    )
    assert result.exit_code != 0
    assert "--world funnel does not use --size, --steps" in result.output


def test_a_store_that_is_down_ends_any_command_in_one_line(tmp_path: Path) -> None:
    """`solaris bench` (like status and the Redis demo) printed a traceback of several boxes
    when Redis did not answer; the demo did so only after training. Run as users run it: the
    installed entry point, a Redis port nothing listens on."""
    from conftest import free_port

    solaris = Path(sys.executable).with_name("solaris")
    command = [str(solaris)] if solaris.is_file() else [sys.executable, "-m", "solaris_feast.cli"]
    env = _env() | {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    for args in (
        ["bench", "serve"],
        ["demo", "--size", "tiny", "--online-store", "redis", "--out", str(tmp_path / "d")],
    ):
        proc = subprocess.run(
            [*command, *args], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert (
            lines[-1].startswith("error: ConnectionError:")
            and "run the command again" in (lines[-1])
        ), proc.stderr
        assert "Traceback" not in proc.stderr and "╭" not in proc.stderr
    assert not (tmp_path / "d").exists()  # refused before any work


def test_train_refuses_models_beside_a_config_instead_of_ignoring_it(tmp_path: Path) -> None:
    from solaris_feast.cli import app

    result = CliRunner().invoke(
        app, ["train", "--config", str(tmp_path / "solaris.yaml"), "--models", str(tmp_path)]
    )
    assert result.exit_code == 2 and "models.dir" in result.output


@pytest.mark.parametrize("option", ["--base-seed", "--data-seed"])
def test_a_negative_seed_is_refused_naming_the_option(option: str) -> None:
    """numpy's SeedSequence refused it with a traceback from inside the run."""
    from solaris_feast.cli import app

    result = CliRunner().invoke(app, ["evaluate", "transfer", "--size", "tiny", option, "-1"])
    assert result.exit_code == 2 and f"'{option}'" in result.output, result.output


def test_progress_without_a_terminal_is_a_line_at_each_stages_start_and_end(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where stderr is a file (CI, nohup, a task log) rich draws no bar until the end: `solaris
    train` wrote nothing in 8 minutes of FM training. Lines at a stage's start and end, and
    every LINE_EVERY_SECONDS between."""
    from solaris_feast import progress

    with progress.stage_bars(True) as bars:
        for done in range(101):
            bars("train FM", done, 100)
        bars("train FM", 100, 100)  # said once
        monkeypatch.setattr(progress, "LINE_EVERY_SECONDS", 0.0)
        bars("train VM", 0, 3)
        bars("train VM", 1, 3)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "train FM: 0/100 (0 s)",
        "train FM: 100/100 (0 s)",
        "train VM: 0/3 (0 s)",
        "train VM: 1/3 (0 s)",
    ]
