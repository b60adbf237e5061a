"""PNG plots of the figures the commands report. matplotlib is imported lazily, headless."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the headless Agg backend (servers and CI have no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Write ``fig`` as a PNG at ``path`` (folders created) and release it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def plot_ne_against_coverage(
    sweep: Sequence[Mapping[str, float]],
    path: Path,
    references: Mapping[str, float] | None = None,
    title: str = "VM normalized entropy against embedding coverage",
) -> Path:
    """Line of NE (main task) against the share of pairs with an exact embedding; optional
    horizontal reference lines (for instance the VM alone and the FM)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(
        [p["coverage"] for p in sweep], [p["ne"] for p in sweep], marker="o", label="VM + SOLARIS z"
    )
    colours = ("tab:red", "tab:green", "tab:purple", "tab:orange")
    for (name, value), colour in zip((references or {}).items(), colours, strict=False):
        ax.axhline(value, linestyle="--", linewidth=1, color=colour, label=f"{name} ({value:.4f})")
    ax.set_xlabel("coverage (share of pairs with the exact embedding)")
    ax.set_ylabel("normalized entropy (lower is better)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, path)


def plot_tier_mix(mix: Any, path: Path, title: str = "Tier mix of served pairs over time") -> Path:
    """Stacked bars of the share of each tier per hour. ``mix`` is a DataFrame indexed by hour
    with one column per tier value (shares summing to 1 per row)."""
    from solaris_feast.tiers import Tier

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    bottom = None
    for tier in (Tier.EXACT, Tier.SIMILAR, Tier.USER_AGG, Tier.ZERO):
        if int(tier) not in mix.columns:
            continue
        values = mix[int(tier)].to_numpy()
        ax.bar(mix.index.to_numpy(), values, bottom=bottom, label=tier.name.lower())
        bottom = values if bottom is None else bottom + values
    ax.set_xlabel("hours after the precompute round")
    ax.set_ylabel("share of served pairs")
    ax.set_title(title)
    ax.legend()
    return save_figure(fig, path)
