"""``solaris lineage``: build, render and check; the exit code says whether a check failed."""

from __future__ import annotations

import contextlib
import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

from solaris_feast.errors import SolarisError
from solaris_feast.review.lineage.build import build_lineage
from solaris_feast.review.lineage.render import FORMATS, render


def lineage_command(
    repo: Path,
    models_dir: Path,
    dags_dir: Path,
    fmt: str = "md",
    output: Path | None = None,
    *,
    coverage_json: Path | None = None,
    feature_store_yaml: Path | None = None,
    now: datetime | None = None,
    say_written: bool = True,
) -> int:
    """Build, render and check the lineage; the return value is the process exit code.

    0 when no check failed, 1 when one did (the findings are printed to stderr), 2 when the
    inputs could not be read at all. The report goes to ``output`` or, without one, to stdout;
    ``say_written=False`` leaves out the line that names ``output`` (for a caller whose own
    summary names it).
    """
    if fmt not in FORMATS:
        print(f"solaris lineage: --format must be one of {', '.join(FORMATS)}", file=sys.stderr)
        return 2
    try:
        # stdout carries the report alone: Airflow's and Feast's log lines, and anything a DAG
        # file prints while it is parsed, go to stderr with the findings.
        with contextlib.redirect_stdout(sys.stderr):
            report = build_lineage(
                repo,
                models_dir,
                dags_dir,
                now=now,
                coverage_json=coverage_json,
                feature_store_yaml=feature_store_yaml,
            )
    except (SolarisError, OSError, ValueError) as exc:
        print(f"solaris lineage: {exc}", file=sys.stderr)
        return 2
    text = render(report, fmt)
    if output is None:
        sys.stdout.write(text)
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
        if say_written:
            print(f"lineage report written to {output}", file=sys.stderr)
    for finding in report.findings:
        mark = "FAIL" if finding.severity == "error" else "warn"
        print(f"{mark} [{finding.check}] {finding.subject}: {finding.message}", file=sys.stderr)
    if report.errors:
        print(f"{len(report.errors)} lineage check(s) failed", file=sys.stderr)
        return 1
    return 0


def lineage_cli(
    repo: Annotated[
        Path, typer.Option("--repo", help="Feast repo folder (holds feature_store.yaml).")
    ] = Path("feature_repo"),
    models_dir: Annotated[
        Path, typer.Option("--models", help="Folder of model cards (JSON).")
    ] = Path("models"),
    dags_dir: Annotated[Path, typer.Option("--dags", help="Folder of Airflow DAG files.")] = Path(
        "dags"
    ),
    fmt: Annotated[str, typer.Option("--format", "-f", help="md, html or json.")] = "md",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")
    ] = None,
    coverage_json: Annotated[
        Path | None,
        typer.Option("--coverage", help="A precompute run's coverage.json (default: the newest)."),
    ] = None,
    feature_store_yaml: Annotated[
        Path | None,
        typer.Option("--config", help="Feast config other than <repo>/feature_store.yaml."),
    ] = None,
) -> None:
    """Review where each SOLARIS feature view comes from; exits 1 when a check fails."""
    code = lineage_command(
        repo,
        models_dir,
        dags_dir,
        fmt,
        output,
        coverage_json=coverage_json,
        feature_store_yaml=feature_store_yaml,
    )
    if code:
        raise typer.Exit(code)
