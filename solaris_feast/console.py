"""What a person at a terminal sees: our progress lines, not the libraries' chatter.

One setup for every entry point, the ``solaris`` commands and the scripts under ``benchmarks/``
alike (:func:`configure_console`), so a benchmark run from the shell is as quiet as a command.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

LIBRARY_LOGGERS = ("feast", "airflow", "alembic", "sqlalchemy", "httpx", "urllib3", "faiss")
"""Loggers of the libraries we drive: their INFO lines ("Registry cache expired, so refreshing",
"Filling up the DagBag") are chatter for a person at a terminal; ``--verbose`` shows them."""


def quiet_libraries() -> None:
    """Keep library chatter out of the console: only the libraries' warnings and errors show.

    Levels are set on the libraries' own loggers. Airflow logs through structlog at the level of
    its own config, so ``AIRFLOW__LOGGING__LOGGING_LEVEL`` is set to WARNING for this process when
    the user has not set it (the one environment write, made here at the entry point). Feast turns
    ``RuntimeWarning`` into "once" at import, ahead of any filter of ours, so its experimental-
    feature warning for on-demand views is dropped where warnings are shown instead.
    """
    import os
    import warnings

    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    # Our own progress lines stay at INFO even when Airflow's logging setup (run when a command
    # imports Airflow) raises the root logger's level.
    logging.getLogger("solaris_feast").setLevel(logging.INFO)
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")
    show = warnings.showwarning

    def show_unless_chatter(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: str | None = None,
    ) -> None:
        if category is RuntimeWarning and str(message).startswith(FEAST_EXPERIMENTAL_WARNING):
            return
        show(message, category, filename, lineno, file, line)

    warnings.showwarning = show_unless_chatter


FEAST_EXPERIMENTAL_WARNING = "On demand feature view is an experimental feature"


def configure_console(verbose: bool = False) -> None:
    """Log lines with their time, at INFO (DEBUG with ``verbose``); without ``verbose`` the
    libraries' chatter is dropped (:func:`quiet_libraries`). Call once, at the entry point."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not verbose:
        quiet_libraries()


def parse_script_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """A benchmark script's arguments, with ``--verbose`` as the ``solaris`` commands take it,
    and the console set up from it (:func:`configure_console`)."""
    parser.add_argument("--verbose", action="store_true", help="Show the libraries' log lines too.")
    args = parser.parse_args()
    configure_console(args.verbose)
    return args


PLOT_SUFFIXES = frozenset({".png", ".pdf", ".svg", ".jpg", ".jpeg"})
"""File types a ``--plot`` may be written as (matplotlib writes each by the suffix)."""


def check_output_path(
    path: Path | None, option: str, suffixes: frozenset[str] | None = None
) -> None:
    """Refuse, before any work, an output path the command could not write at its end: an
    existing folder, a parent that is a file or not writable, a suffix not in ``suffixes``.
    An evaluation found these only after minutes of computing, as a traceback.

    Raises:
        typer.BadParameter: naming ``option`` and what is wrong.
    """
    import typer

    if path is None:
        return
    if path.is_dir():
        raise typer.BadParameter(f"{path} is a folder; name a file in it", param_hint=option)
    for parent in path.parents:
        if not parent.exists():
            continue  # created at the end
        if not parent.is_dir():
            raise typer.BadParameter(f"{parent} is a file, not a folder", param_hint=option)
        if not os.access(parent, os.W_OK | os.X_OK):
            raise typer.BadParameter(f"cannot write in {parent}", param_hint=option)
        break
    if suffixes is not None and path.suffix.lower() not in suffixes:
        raise typer.BadParameter(
            f"{path.name}: write it as one of {', '.join(sorted(suffixes))}", param_hint=option
        )
