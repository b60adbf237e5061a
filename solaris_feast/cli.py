"""The ``solaris`` command.

``solaris --help`` must stay instant, so nothing heavy (torch, pandas, feast, faiss) is imported
until a command runs: the commands defined here import their work in their bodies, and the
commands defined in other modules (``lineage``, ``status``, ``simulate``, ``bench``) are listed
under :data:`LAZY_COMMANDS` and imported only when they are invoked or their own ``--help`` is
asked for; their options stay defined once, beside their code.
"""

from __future__ import annotations

import importlib
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from typer import _click as click  # typer vendors its own click; its commands are of this one
from typer.core import TyperCommand, TyperGroup

from solaris_feast.console import configure_console

LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "bench": (
        "solaris_feast.bench:bench_app",
        "Benchmarks of SOLARIS serving reads and writes against Redis.",
    ),
    "lineage": (
        "solaris_feast.review.lineage:lineage_cli",
        "Review where each SOLARIS feature view comes from; exits 1 when a check fails.",
    ),
    "status": (
        "solaris_feast.review.status:status_cli",
        "Coverage by tier, miss-queue depth and freshness of the stored SOLARIS embeddings.",
    ),
    "simulate": (
        "solaris_feast.evaluation.replay:simulate_command",
        "Replay the log hour by hour: coverage and NE per planner and budget.",
    ),
}
"""Command name -> (``module:attribute`` of a typer command function or Typer app, short help)."""
_COMPLETION_OPTIONS = ("install_completion", "show_completion")


def load_lazy_command(name: str) -> click.Command:
    """The click command behind a :data:`LAZY_COMMANDS` entry (imports its module)."""
    target, _ = LAZY_COMMANDS[name]
    module_name, attribute = target.split(":")
    obj = getattr(importlib.import_module(module_name), attribute)
    if isinstance(obj, typer.Typer):
        command = typer.main.get_command(obj)
        # Shell completion is the top-level command's option only.
        command.params = [p for p in command.params if p.name not in _COMPLETION_OPTIONS]
    else:
        single = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)
        single.command(name)(obj)
        command = typer.main.get_command(single)
    command.name = name
    return command


class _LazyCommand(TyperCommand):
    """Stands for a command in the help listing; loads the real one when it is invoked."""

    def __init__(self, name: str, short_help: str) -> None:
        super().__init__(name, help=short_help, short_help=short_help)

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        # The real command parses the arguments: the returned context runs the real command.
        return load_lazy_command(self.name or "").make_context(
            info_name, args, parent=parent, **extra
        )


class _SolarisGroup(TyperGroup):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *LAZY_COMMANDS]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS:
            return _LazyCommand(cmd_name, LAZY_COMMANDS[cmd_name][1])
        return super().get_command(ctx, cmd_name)


app = typer.Typer(
    cls=_SolarisGroup,
    help="SOLARIS for Feast: precomputed FM embeddings, served with layered fallback.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
evaluate_app = typer.Typer(help="Offline evaluations.", no_args_is_help=True)
app.add_typer(evaluate_app, name="evaluate")

DatasetOption = Annotated[str, typer.Option("--dataset", help="synthetic or movielens.")]
SizeOption = Annotated[
    str,
    typer.Option(
        "--size",
        help="Synthetic preset: tiny, demo, default, large; for movielens 100k (the default) "
        "or 1m.",
    ),
]


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    configure_console(verbose)


@evaluate_app.command("transfer")
def evaluate_transfer_command(
    dataset: DatasetOption = "synthetic",
    size: SizeOption = "default",
    seeds: Annotated[
        int, typer.Option("--seeds", min=1, help="Seeds to train and average over.")
    ] = 1,
    base_seed: Annotated[
        int, typer.Option("--base-seed", min=0, help="First seed; seeds run base..base+N-1.")
    ] = 0,
    data_seed: Annotated[
        int,
        typer.Option(
            "--data-seed",
            min=0,
            help="Synthetic only: the seed the world itself is drawn with (--seeds vary the "
            "models and the bootstrap on one world).",
        ),
    ] = 0,
    data_seeds: Annotated[
        int,
        typer.Option(
            "--data-seeds",
            min=1,
            help="Synthetic only: pool this many worlds, drawn with seeds --data-seed onwards, "
            "into the protocol's one figure (its interval covers the users within the worlds, "
            "not the spread between them: each world's own figure is beside it, as "
            "per_world); the first evaluation runs on the first world.",
        ),
    ] = 1,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the JSON report here.")
    ] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="PNG of NE against coverage.")] = None,
    progress: Annotated[bool, typer.Option(help="Progress bars.")] = True,
    world: Annotated[
        str,
        typer.Option(
            "--world",
            help="Synthetic structures switched on: neither (the preset as it is), sequential "
            "(item-to-item successors), surfaces (3 surfaces; the VM on surface 0, the FM on "
            "all), both.",
        ),
    ] = "neither",
    fm_history: Annotated[
        str,
        typer.Option(
            "--fm-history",
            help="With surfaces: all_surfaces, or own_surface (every FM's history reads the "
            "row's own surface only, the same training rows; the ablation).",
        ),
    ] = "all_surfaces",
    fm_rows: Annotated[
        str,
        typer.Option(
            "--fm-rows",
            help="The served VMs' tier on the previous-window FM's rows: zero, or own_tier (a "
            "training-only tier, so the served tiers do not mark the rows after the cut).",
        ),
    ] = "zero",
    fm_inputs: Annotated[
        str,
        typer.Option(
            "--fm-inputs",
            help="What the FM that serves z trains on: request (each row's history as of the "
            "row) or round (as of the hourly round, as it is served).",
        ),
    ] = "request",
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="Evaluate on the log of this solaris config (its log section: your own log, "
            "columns, tasks and id space) instead of --dataset.",
        ),
    ] = None,
) -> None:
    """Train VM, VM + KD, VM + SOLARIS z and the FM on a time split; report NE and TR, and the
    protocol (z served from hourly rounds, full-span FM, splits x seeds, intervals)."""
    from typing import cast, get_args

    from solaris_feast.console import PLOT_SUFFIXES, check_output_path
    from solaris_feast.data.datasets import load_configured_log, load_dataset
    from solaris_feast.data.synthetic import WORLD_STRUCTURES
    from solaris_feast.evaluation.transfer import TransferConfig, evaluate_transfer
    from solaris_feast.evaluation.transfer_protocol import (
        FmHistory,
        FmInputs,
        ProtocolConfig,
        protocol_for,
    )
    from solaris_feast.evaluation.transfer_report import (
        format_transfer_table,
        plot_transfer_sweep,
    )
    from solaris_feast.progress import stage_bars
    from solaris_feast.tiers import FmRowsTier

    check_output_path(json_path, "--json")
    check_output_path(plot, "--plot", PLOT_SUFFIXES)
    if world not in WORLD_STRUCTURES:
        raise typer.BadParameter(f"choose one of {list(WORLD_STRUCTURES)}", param_hint="--world")
    if world != "neither" and dataset != "synthetic":
        raise typer.BadParameter("a world is a synthetic data set's", param_hint="--world")
    if fm_history not in get_args(FmHistory):
        raise typer.BadParameter(f"choose one of {get_args(FmHistory)}", param_hint="--fm-history")
    if fm_rows not in get_args(FmRowsTier):
        raise typer.BadParameter(f"choose one of {get_args(FmRowsTier)}", param_hint="--fm-rows")
    if fm_inputs not in get_args(FmInputs):
        raise typer.BadParameter(f"choose one of {get_args(FmInputs)}", param_hint="--fm-inputs")
    if config_file is not None and world != "neither":
        raise typer.BadParameter("a world is a synthetic data set's", param_hint="--world")
    recorded = config_file is not None or dataset != "synthetic"
    for name, value, default in (("--data-seed", data_seed, 0), ("--data-seeds", data_seeds, 1)):
        if recorded and value != default:
            raise typer.BadParameter(
                "only a synthetic world is drawn from a seed; a recorded log is what it is",
                param_hint=name,
            )
    data = (
        load_configured_log(config_file)
        if config_file is not None
        else load_dataset(dataset, size, seed=data_seed, world=world)
    )
    drawn = range(data_seed, data_seed + data_seeds)
    worlds = None
    if data_seeds > 1:
        worlds = {f"data_seed={data_seed}": data}
        for s in drawn[1:]:
            worlds[f"data_seed={s}"] = load_dataset(dataset, size, seed=s, world=world)
    try:
        protocol = protocol_for(
            data,
            cast("FmHistory", fm_history),
            ProtocolConfig(),
            fm_rows=cast("FmRowsTier", fm_rows),
            fm_inputs=cast("FmInputs", fm_inputs),
        )
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--fm-history") from err
    import warnings

    with stage_bars(progress) as bars, warnings.catch_warnings():
        # numpy's "mean of empty slice" and the like, for a task or split a seed has no rows
        # of: the figure is NaN (null in the JSON), and the table says n/a; not console noise.
        warnings.simplefilter("ignore", RuntimeWarning)
        report = evaluate_transfer(
            data,
            seeds=range(base_seed, base_seed + seeds),
            config=TransferConfig(),
            progress=bars,
            protocol=protocol,
            protocol_worlds=worlds,
        )
    record = report.to_json()
    if not recorded:
        record["data_seed"] = data_seed
        record["data_seeds"] = list(drawn)
    # What produced the file: the README's rows differ by exactly these.
    record["settings"] = {
        "dataset": dataset,
        "size": size,
        "world": world,
        "seeds": seeds,
        "base_seed": base_seed,
        "data_seed": data_seed,
        "data_seeds": data_seeds,
        "fm_history": fm_history,
        "fm_rows": fm_rows,
        "fm_inputs": fm_inputs,
        "config": str(config_file) if config_file is not None else None,
    }
    typer.echo(format_transfer_table(record))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        from solaris_feast.evaluation.metrics import strict_json

        json_path.write_text(strict_json(record, indent=2) + "\n")
        typer.echo(f"JSON report: {json_path}")
    if plot is not None:
        plot_transfer_sweep(record, plot)
        typer.echo(f"plot: {plot}")


ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", help="solaris.yaml (default: $SOLARIS_CONFIG)."),
]
AtOption = Annotated[
    datetime | None,
    typer.Option(
        "--at",
        formats=["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d"],
        help="The round's time (UTC when no zone is given); default now.",
    ),
]


def _utc(at: datetime | None) -> datetime | None:
    return at if at is None or at.tzinfo is not None else at.replace(tzinfo=UTC)


def _config_or_exit(path: Path | None) -> Any:
    """The config, or exit 2 with what to set (nothing falls back to the code checkout)."""
    from solaris_feast.config import load_config
    from solaris_feast.errors import ConfigError

    try:
        return load_config(path)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def _one_line_error(exc: BaseException) -> str | None:
    """The one line an error ends a command with, None for a bug (its traceback is what a
    report needs): our own errors, a store that is down, slow or locked (retryable), and a Redis
    that answered with a refusal a retry repeats (a wrong password, a missing ACL permission, a
    full or read-only server), or a damaged SQLite file."""
    import sqlite3
    import sys

    from solaris_feast.errors import SolarisError, describe_error, is_retryable

    if isinstance(exc, SolarisError):
        return f"error: {describe_error(exc)}"
    if isinstance(exc, Exception) and is_retryable(exc):
        return (
            f"error: {describe_error(exc)} (the store is unreachable or busy: "
            "run the command again once it answers)"
        )
    if isinstance(exc, sqlite3.DatabaseError):  # not a busy one (retryable, above)
        return (
            f"error: {describe_error(exc)} (a SQLite file of the store is damaged or not "
            "SQLite: the online store's path in the feature_store yaml, or its registry)"
        )
    redis_errors = sys.modules.get("redis.exceptions")
    if redis_errors is not None and isinstance(exc, redis_errors.RedisError):
        return (
            f"error: {describe_error(exc)} (the Redis answered with a refusal that a retry "
            "repeats: check the user, password and ACL of the connection (REDIS_URL or the "
            "feature_store yaml's connection_string) and the server's maxmemory)"
        )
    return None


def _steps_echoed() -> Any:
    """While a command echoes one line per step, its steps' own INFO log lines would say each
    thing twice: they are held back (warnings and errors still show; --verbose shows all)."""
    from contextlib import contextmanager

    @contextmanager
    def held() -> Any:
        ours = logging.getLogger("solaris_feast")
        level = ours.level
        if logging.getLogger().getEffectiveLevel() > logging.DEBUG:  # not --verbose
            ours.setLevel(logging.WARNING)
        try:
            yield
        finally:
            ours.setLevel(level)

    return held()


def _final_errors_exit() -> Any:
    """Our errors and a store's retryable ones end the command with one line and exit 1."""
    from contextlib import contextmanager

    @contextmanager
    def guard() -> Any:
        try:
            yield
        except Exception as exc:
            line = _one_line_error(exc)
            if line is None:
                raise
            typer.echo(line, err=True)
            raise typer.Exit(1) from exc

    return guard()


@app.command("train")
def train_command(
    config: ConfigOption = None,
    at: AtOption = None,
    dataset: DatasetOption = "synthetic",
    size: SizeOption = "default",
    models_dir: Annotated[
        Path | None,
        typer.Option("--models", help="Where artifacts and cards go (named data set only)."),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Progress bars.")] = True,
) -> None:
    """Train FM -> compressor -> VM and register their model cards.

    With --config (or $SOLARIS_CONFIG): on the config's log window before --at, into its models
    dir. Without: on a named data set (--dataset, --size), into --models.
    """
    import os

    from solaris_feast.config import CONFIG_ENV

    if config is not None or os.environ.get(CONFIG_ENV, "").strip():
        from solaris_feast.pipeline.commands import train_round

        if models_dir is not None:
            # Silently training into the config's models.dir instead would surprise.
            raise typer.BadParameter(
                "a config trains into its models.dir; set that there (or drop --config for a "
                "named data set)",
                param_hint="--models",
            )
        loaded = _config_or_exit(config)
        with _final_errors_exit(), _steps_echoed():
            train_round(loaded, _utc(at), typer.echo, str(config) if config is not None else None)
        return
    if models_dir is None:
        typer.echo(
            f"error: pass --config PATH (or set {CONFIG_ENV}), or --dataset NAME --models DIR",
            err=True,
        )
        raise typer.Exit(2)
    from solaris_feast.data.datasets import load_dataset
    from solaris_feast.models.chain import train_and_register
    from solaris_feast.progress import stage_bars

    data = load_dataset(dataset, size)
    with _steps_echoed(), stage_bars(progress) as bars:
        bundle = train_and_register(data, models_dir, progress=bars)
    for kind, card in bundle.cards.items():
        typer.echo(f"{kind:<10} {card.version}  {models_dir / card.weights_file}")


@app.command("precompute")
def precompute_command(config: ConfigOption = None, at: AtOption = None) -> None:
    """Run one precompute round (the precompute DAG's tasks, in this process) for --at."""
    from solaris_feast.pipeline.commands import precompute_round

    loaded = _config_or_exit(config)
    with _final_errors_exit(), _steps_echoed():
        result = precompute_round(loaded, _utc(at), typer.echo)
    shares = result["coverage"].get("coverage", {})
    typer.echo(
        f"coverage    {json.dumps({tier: round(share, 4) for tier, share in shares.items()})}"
    )


@app.command("promote")
def promote_command(
    vm: Annotated[str, typer.Option("--vm", help="VM version to serve (from solaris train).")],
    config: ConfigOption = None,
    at: AtOption = None,
    check: Annotated[
        bool, typer.Option(help="Refuse a chain that does not fit the log's window before --at.")
    ] = True,
    airflow: Annotated[
        bool | None,
        typer.Option(
            "--airflow/--no-airflow",
            help="Mark the solaris_serving_chain asset, so the precompute DAG runs now "
            "(default: when AIRFLOW_HOME or AIRFLOW__DATABASE__SQL_ALCHEMY_CONN is set).",
        ),
    ] = None,
) -> None:
    """Name the serving chain: the VM, its compressor and its FM (the registry's serving alias)."""
    loaded = _config_or_exit(config)
    with _final_errors_exit():
        from solaris_feast.pipeline.assets import airflow_configured
        from solaris_feast.pipeline.promotion import announce_promotion, promote_checked

        models_dir = Path(loaded.models.dir)
        alias = promote_checked(loaded, models_dir, vm, _utc(at), check)
    typer.echo(f"serving {alias.vm} <- {alias.compressor} <- {alias.fm} ({models_dir})")
    # Clients of the resolved view send the embedding version; the VM's (printed by train and
    # the line above) matches no stored vector and resolves every pair to ZERO.
    typer.echo(f"clients ask with solaris_model_version={alias.compressor}")
    if airflow is False or (airflow is None and not airflow_configured()):
        return
    if announce_promotion(alias, models_dir):
        typer.echo(
            "marked Airflow asset solaris_serving_chain: an unpaused solaris_precompute starts "
            "a round with the new chain"
        )
    else:
        typer.echo(
            "Airflow has no asset solaris_serving_chain (is solaris_precompute parsed and "
            "AIRFLOW_HOME set?): the new chain is served from the next scheduled round",
            err=True,
        )


@app.command("demo")
def demo_command(
    out: Annotated[Path, typer.Option("--out", help="Output folder.")] = Path("out/demo"),
    size: SizeOption = "demo",
    online_store: Annotated[
        str, typer.Option("--online-store", help="sqlite or redis.")
    ] = "sqlite",
    budget: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="FM budget, share of candidate pairs.")
    ] = 0.1,
    transfer: Annotated[bool, typer.Option(help="Run the transfer evaluation first.")] = True,
    progress: Annotated[bool, typer.Option(help="Progress bars.")] = True,
) -> None:
    """The SOLARIS loop on embedded defaults (synthetic data, SQLite, local files)."""
    from typing import get_args

    from solaris_feast.demo import DemoSettings, run_demo
    from solaris_feast.pipeline.settings import LogSource

    # Refused before any work, in one line, as the other commands refuse a typo.
    if online_store not in ("sqlite", "redis"):
        raise typer.BadParameter("choose sqlite or redis", param_hint="--online-store")
    sizes = get_args(LogSource.model_fields["dataset_size"].annotation)
    if size not in sizes:
        raise typer.BadParameter(f"choose one of {', '.join(sizes)}", param_hint="--size")
    settings = DemoSettings(size=size, budget_fraction=budget, transfer=transfer)
    # The demo echoes its steps and ends with their figures: its steps' INFO lines (a raw dict
    # of NEs per seed, 20 lines of the round's tasks) only repeated them; --verbose shows them.
    with _steps_echoed():
        summary = run_demo(out, online_store=online_store, progress=progress, settings=settings)
    typer.echo(summary)


if __name__ == "__main__":
    app()


def run() -> None:
    """The ``solaris`` command. Our own errors (bad input, a config or data set that does not
    fit) and a store that is down or busy end any command with one line and exit 1, as
    :func:`_final_errors_exit` does for the commands that run a round; anything else keeps its
    traceback (a bug needs it)."""
    try:
        app()
    except Exception as exc:
        line = _one_line_error(exc)
        if line is None:
            raise
        typer.echo(line, err=True)
        raise SystemExit(1) from None
