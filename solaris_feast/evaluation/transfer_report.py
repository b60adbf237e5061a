"""The transfer evaluation's report as people read it: a table of NE and TR, and a plot.

Shared by ``solaris evaluate transfer`` and ``solaris demo``; it sits here, not in the CLI, so the
demo needs no import of the CLI (which imports the demo lazily).
"""

from __future__ import annotations

from pathlib import Path


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
