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
            sd = spread[key]
            return f"{tr[key]:.3f} (sd {'n/a, one seed' if sd is None else f'{sd:.3f}'})"

        lines.append(f"transfer ratio: KD {show('kd')}, SOLARIS {show('solaris')}")
    sweep = record["coverage_sweep"]
    if isinstance(sweep, list):
        lines.append("coverage  " + "  ".join(f"{p['coverage']:.1f}:{p['ne']:.4f}" for p in sweep))
    lines[0:0] = ["(upper bound: z at the row's second, no VM history, partial-span FM)"]
    protocol = record.get("protocol")
    if isinstance(protocol, dict):
        details = record.get("protocol_details")
        lines += [
            "",
            format_protocol_table(protocol, details if isinstance(details, dict) else None),
        ]
    return "\n".join(lines)


def _tr(value: object, interval: object = None) -> str:
    if not isinstance(value, float | int):
        return "n/a"
    if isinstance(interval, list):
        return f"{value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]"
    return f"{value:.3f}"


def format_protocol_table(
    protocol: dict[str, object], details: dict[str, object] | None = None
) -> str:
    """TR per task under the protocol (main task first): served from hourly rounds, KD, label
    smoothing, and by staleness, with the 95% intervals; with ``details``, the main task's
    zero-z control and z's content over it."""
    per_task = protocol["per_task"]
    if not isinstance(per_task, dict):
        raise TypeError("not a protocol record")
    head = (
        f"{'task':<12}{'TR served [95%]':>26}{'TR KD [95%]':>26}{'TR label sm.':>14}  by staleness"
    )
    lines = ["protocol: z served from hourly rounds, VM with history, full-span FM", head]
    for task, row in per_task.items():
        stale = row["tr_by_staleness"]
        lines.append(
            f"{task:<12}{_tr(row['tr_served'], row['tr_served_ci95']):>26}"
            f"{_tr(row['tr_kd_served'], row['tr_kd_served_ci95']):>26}"
            f"{_tr(row['tr_label_smoothing']):>14}  "
            + "  ".join(f"{s}s:{_tr(v)}" for s, v in stale.items())
        )
    per_world = protocol.get("per_world")
    if isinstance(per_world, dict):
        # Pooled worlds: the rows above are over all of them; each world's main task apart.
        lines.append(
            "per world (the pooled interval covers users within the worlds, not the spread "
            "between them):"
        )
        for world, row in per_world.items():
            lines.append(
                f"{'  ' + world:<12}{_tr(row['tr_served'], row['tr_served_ci95']):>26}"
                f"{_tr(row['tr_kd_served'], row['tr_kd_served_ci95']):>26}"
                f"{_tr(row['tr_label_smoothing']):>14}"
            )
    if details is not None and "tr_served_over_zero_z_control" in details:
        control = _tr(details["tr_zero_z_control"], details["tr_zero_z_control_ci95"])
        content = _tr(
            details["tr_served_over_zero_z_control"],
            details["tr_served_over_zero_z_control_ci95"],
        )
        lines.append(
            f"{details['main_task']}: zero-z control (the served tiers, zero vectors) {control}; "
            f"TR served over it (z's content) {content}"
        )
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
    # The sweep is the first evaluation's (z at the row's second): said on the plot itself, as
    # the table says it, so a figure passed on alone is not read as the served protocol's.
    plot_ne_against_coverage(
        sweep,
        path,
        references={"VM alone": ne["vm"][main_task], "FM": ne["fm"][main_task]},
        title="Upper bound: VM NE against coverage, z at the row's second\n"
        "(no VM history, partial-span FM; not the served protocol)",
    )
