"""The ``solaris`` command. Heavy imports (torch, feast, faiss) stay inside the commands so that
``solaris --help`` is instant."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer

from solaris_feast.bench import bench_app
from solaris_feast.evaluation.replay import simulate_command
from solaris_feast.review.lineage import lineage_cli
from solaris_feast.review.status import status_cli

app = typer.Typer(
    help="SOLARIS for Feast: precomputed FM embeddings, served with layered fallback.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
evaluate_app = typer.Typer(help="Offline evaluations.", no_args_is_help=True)
app.add_typer(evaluate_app, name="evaluate")
app.add_typer(bench_app, name="bench")
app.command("lineage")(lineage_cli)
app.command("status")(status_cli)
app.command("simulate")(simulate_command)

DatasetOption = Annotated[str, typer.Option("--dataset", help="synthetic or movielens.")]
SizeOption = Annotated[
    str, typer.Option("--size", help="Synthetic preset: tiny, demo, default, large.")
]


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@evaluate_app.command("transfer")
def evaluate_transfer_command(
    dataset: DatasetOption = "synthetic",
    size: SizeOption = "default",
    seeds: Annotated[
        int, typer.Option("--seeds", min=1, help="Seeds to train and average over.")
    ] = 1,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the JSON report here.")
    ] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="PNG of NE against coverage.")] = None,
    progress: Annotated[bool, typer.Option(help="Progress bars.")] = True,
) -> None:
    """Train VM, VM + KD, VM + SOLARIS z and the FM on a time split; report NE and TR."""
    from solaris_feast.data.datasets import load_dataset
    from solaris_feast.evaluation.transfer import evaluate_transfer
    from solaris_feast.progress import stage_bars

    data = load_dataset(dataset, size)
    with stage_bars(progress) as bars:
        report = evaluate_transfer(data, seeds=range(seeds), progress=bars)
    record = report.to_json()
    typer.echo(format_transfer_table(record))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(record, indent=2))
        typer.echo(f"JSON report: {json_path}")
    if plot is not None:
        plot_transfer_sweep(record, plot)
        typer.echo(f"plot: {plot}")


@app.command("train")
def train_command(
    dataset: DatasetOption = "synthetic",
    size: SizeOption = "default",
    models_dir: Annotated[
        Path, typer.Option("--models", help="Where artifacts and cards go.")
    ] = Path("models"),
    progress: Annotated[bool, typer.Option(help="Progress bars.")] = True,
) -> None:
    """Train FM -> compressor -> VM on the whole log and register their model cards."""
    from solaris_feast.data.datasets import load_dataset
    from solaris_feast.models.chain import train_and_register
    from solaris_feast.progress import stage_bars

    data = load_dataset(dataset, size)
    with stage_bars(progress) as bars:
        bundle = train_and_register(data, models_dir, progress=bars)
    for kind, card in bundle.cards.items():
        typer.echo(f"{kind:<10} {card.version}  {models_dir / card.weights_file}")


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
    from solaris_feast.demo import DemoSettings, run_demo

    settings = DemoSettings(size=size, budget_fraction=budget, transfer=transfer)
    summary = run_demo(out, online_store=online_store, progress=progress, settings=settings)
    typer.echo(summary)


def format_transfer_table(record: dict[str, object]) -> str:
    """Readable table of NE per contender and task, and the transfer ratios."""
    ne = record["ne"]
    tasks = record["tasks"]
    if not isinstance(ne, dict) or not isinstance(tasks, list):
        raise TypeError("not a transfer report")
    lines = [f"{'model':<12}" + "".join(f"{'NE ' + str(t):>16}" for t in tasks)]
    for who in ("vm", "vm_kd", "vm_solaris", "fm"):
        lines.append(f"{who:<12}" + "".join(f"{ne[who][t]:>16.4f}" for t in tasks))
    tr = record["transfer_ratio"]
    spread = record["transfer_ratio_std"]
    if isinstance(tr, dict) and isinstance(spread, dict):

        def show(key: str) -> str:
            if tr[key] is None:
                return "n/a (the FM did not beat the VM)"
            return f"{tr[key]:.3f} (sd {spread[key]:.3f})"

        lines.append(f"transfer ratio: KD {show('kd')}, SOLARIS {show('solaris')}")
    sweep = record["coverage_sweep"]
    if isinstance(sweep, list):
        lines.append("coverage  " + "  ".join(f"{p['coverage']:.1f}:{p['ne']:.4f}" for p in sweep))
    return "\n".join(lines)


def plot_transfer_sweep(record: dict[str, object], path: Path) -> None:
    """PNG of the report's NE against coverage, with the VM alone and the FM as references."""
    from solaris_feast.plots import plot_ne_against_coverage

    ne = record["ne"]
    tasks = record["tasks"]
    sweep = record["coverage_sweep"]
    if not (isinstance(ne, dict) and isinstance(tasks, list) and isinstance(sweep, list)):
        raise TypeError("not a transfer report")
    main_task = tasks[0]
    plot_ne_against_coverage(
        sweep, path, references={"VM alone": ne["vm"][main_task], "FM": ne["fm"][main_task]}
    )


if __name__ == "__main__":
    app()
