"""Records of the funnel world: one per (planner, budget), means over seeds with 95 % intervals,
a text table and the plots (hit rate, coverage, NE and clicks against budget)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from solaris_feast.evaluation.funnel.loop import SeedOutcome
from solaris_feast.evaluation.metrics import (
    bootstrap_ratio_of_means,
    coverage_shares,
    mean_ci95,
    normalized_entropy,
    paired_ratios,
)
from solaris_feast.evaluation.replay_config import ABLATION_STEPS


def _per_1k(value: float, requests: int) -> float:
    return 1000.0 * value / requests if requests else math.nan


def _ne(probs: list[np.ndarray], labels: list[np.ndarray]) -> float:
    if not probs or not sum(len(p) for p in probs):
        return math.nan
    return normalized_entropy(np.concatenate(probs), np.concatenate(labels).astype(np.float64))[0]


def _seed_row(outcome: SeedOutcome, name: str) -> dict[str, Any]:
    totals, state = outcome.arms[name], outcome.states[name]
    cov = coverage_shares(totals.tier_counts)
    n = outcome.requests
    final = ABLATION_STEPS[-1]
    with_z = _per_1k(totals.clicks.get(final, 0.0), n)
    without = _per_1k(outcome.clicks_without_z, n)
    fm = _per_1k(outcome.clicks_fm, n)
    hourly = np.array(
        [
            1000.0 * (z - base) / r
            for z, base, r in zip(
                totals.hourly_clicks,
                outcome.hourly_clicks_without_z,
                outcome.hourly_requests,
                strict=True,
            )
            if r
        ]
    )
    return {
        "exact_hit_rate": cov["exact"],
        # Standard error of the seed's uplift from its own hours (hours as blocks; they are
        # not independent, the stores carry over, so this is a rough lower bound).
        "uplift_within_se": float(hourly.std(ddof=1) / math.sqrt(len(hourly)))
        if len(hourly) > 1
        else math.nan,
        "coverage": cov,
        "ne": _ne(totals.probs.get(final, []), totals.labels.get(final, [])),
        "clicks": with_z,
        "conversions": _per_1k(totals.conversions.get(final, 0.0), n),
        "clicks_without_z": without,
        "conversions_without_z": _per_1k(outcome.conversions_without_z, n),
        "clicks_fm": fm,
        "conversions_fm": _per_1k(outcome.conversions_fm, n),
        "uplift": with_z - without,
        "transfer": (with_z - without) / (fm - without) if fm > without else math.nan,
        "fm_calls": (state.fm_pairs - totals.fm_pairs_at_start) / n if n else math.nan,
        "ablation": {
            step: {
                "ne": _ne(totals.probs.get(step, []), totals.labels.get(step, [])),
                "ne_final_stage": _ne(
                    totals.final_stage_probs.get(step, []), totals.final_stage_labels
                ),
                "clicks": _per_1k(totals.clicks.get(step, 0.0), n),
            }
            for step in ABLATION_STEPS
        },
        "agreement": float(np.nanmean(outcome.early_vm_agreement))
        if outcome.early_vm_agreement
        else math.nan,
    }


def _ci(values: list[float]) -> tuple[float, list[float]]:
    mean, lo, hi = mean_ci95(values)
    return mean, [lo, hi]


def _share_ci(values: list[float]) -> tuple[float, list[float]]:
    """:func:`_ci` of a share, its interval kept inside [0, 1] (a t-interval over few seeds
    can reach past either end)."""
    mean, (lo, hi) = _ci(values)
    return mean, [min(max(lo, 0.0), 1.0), min(max(hi, 0.0), 1.0)]


def _paired_final_stage_ne(rows: list[dict[str, Any]], step: str) -> dict[str, Any]:
    """NE on every final-stage pair at ``step`` and, past the first step, its change from the
    step before as a paired difference over seeds (same pairs, same labels)."""
    ne = [r["ablation"][step]["ne_final_stage"] for r in rows]
    out: dict[str, Any] = {"ne_final_stage": mean_ci95(ne)[0]}
    at = ABLATION_STEPS.index(step)
    if at:
        before = [r["ablation"][ABLATION_STEPS[at - 1]]["ne_final_stage"] for r in rows]
        change, change_ci = _ci([a - b for a, b in zip(ne, before, strict=True)])
        out["ne_final_stage_change"] = change
        out["ne_final_stage_change_ci95"] = change_ci
    return out


def build_funnel_records(outcomes: list[SeedOutcome]) -> list[dict[str, Any]]:
    """One record per (planner, budget) with the keys the issue lists, over every seed."""
    if not outcomes:
        raise ValueError("no seeds were run")
    records = []
    for name in outcomes[0].arms:
        planner, budget = name.rsplit("@", 1)
        rows = [_seed_row(o, name) for o in outcomes]
        hit, hit_ci = _share_ci([r["exact_hit_rate"] for r in rows])
        clicks, clicks_ci = _ci([r["clicks"] for r in rows])
        uplift, uplift_ci = _ci([r["uplift"] for r in rows])
        # Ratio of means over seeds, as the offline protocol's TR: a mean of per-seed ratios
        # lets one seed with a small FM gain decide it. Interval: seeds resampled.
        transfer, transfer_interval = bootstrap_ratio_of_means(
            [r["uplift"] for r in rows], [r["clicks_fm"] - r["clicks_without_z"] for r in rows]
        )
        transfer_ci = list(transfer_interval) if transfer_interval else [math.nan, math.nan]
        records.append(
            {
                "planner": planner,
                "budget": float(budget),
                "seeds": [o.seed for o in outcomes],
                "exact_hit_rate": hit,
                "exact_hit_rate_ci95": hit_ci,
                "exact_hit_rate_per_seed": [r["exact_hit_rate"] for r in rows],
                "coverage": {
                    tier: float(np.mean([r["coverage"][tier] for r in rows]))
                    for tier in ("exact", "similar", "user", "zero", "any")
                },
                "ne": mean_ci95([r["ne"] for r in rows])[0],
                "ne_ci95": _ci([r["ne"] for r in rows])[1],
                "clicks_per_1k_requests": clicks,
                "clicks_per_1k_requests_ci95": clicks_ci,
                "clicks_per_1k_requests_without_z": mean_ci95(
                    [r["clicks_without_z"] for r in rows]
                )[0],
                "clicks_per_1k_requests_fm_ranking": mean_ci95([r["clicks_fm"] for r in rows])[0],
                "click_uplift_per_1k_requests": uplift,
                "click_uplift_per_1k_requests_ci95": uplift_ci,
                "conversions_per_1k_requests": mean_ci95([r["conversions"] for r in rows])[0],
                "conversions_per_1k_requests_without_z": mean_ci95(
                    [r["conversions_without_z"] for r in rows]
                )[0],
                "conversions_per_1k_requests_fm_ranking": mean_ci95(
                    [r["conversions_fm"] for r in rows]
                )[0],
                "click_uplift_per_seed": [r["uplift"] for r in rows],
                "click_uplift_between_seed_sd": float(np.std([r["uplift"] for r in rows], ddof=1))
                if len(rows) > 1
                else math.nan,
                "click_uplift_within_seed_se": float(
                    np.sqrt(np.nanmean([r["uplift_within_se"] ** 2 for r in rows]))
                ),
                "online_transfer_ratio": transfer,
                "online_transfer_ratio_ci95": transfer_ci,
                "online_transfer_ratio_mean_of_seeds": mean_ci95([r["transfer"] for r in rows])[0],
                "fm_calls_per_request": mean_ci95([r["fm_calls"] for r in rows])[0],
                "early_stage_vm_agreement": mean_ci95([r["agreement"] for r in rows])[0],
                "requests_per_seed": float(np.mean([o.requests for o in outcomes])),
                "ablation": [
                    {
                        "tiers": step,
                        "ne": mean_ci95([r["ablation"][step]["ne"] for r in rows])[0],
                        "clicks_per_1k_requests": mean_ci95(
                            [r["ablation"][step]["clicks"] for r in rows]
                        )[0],
                        **_paired_final_stage_ne(rows, step),
                    }
                    for step in ABLATION_STEPS
                ],
            }
        )
    _add_paired_shares(records)
    environment = run_environment()
    for record in records:
        record["environment"] = environment
    return records


def _add_paired_shares(records: list[dict[str, Any]]) -> None:
    """Each record's hit rate as a share of the oracle's and a multiple of random's at the same
    budget, per seed and as a mean with its 95 % interval over seeds
    (``exact_hit_rate_over_oracle``, ``..._ci95``, ``..._per_seed``; the same ``_over_random``):
    the targets are ratios, and the seeds move planners together, so the paired ratio's interval
    is the one to read, not the hit rate's divided by the oracle's mean."""
    by_arm = {(r["planner"], r["budget"]): r["exact_hit_rate_per_seed"] for r in records}
    for record in records:
        for other in ("oracle", "random"):
            base = by_arm.get((other, record["budget"]))
            if base is None:
                continue
            ratios = paired_ratios(record["exact_hit_rate_per_seed"], base).tolist()
            mean, ci = _ci(ratios)
            record[f"exact_hit_rate_over_{other}"] = mean
            record[f"exact_hit_rate_over_{other}_ci95"] = ci
            record[f"exact_hit_rate_over_{other}_per_seed"] = ratios


def run_environment() -> dict[str, Any]:
    """What the figures depend on beyond the seeds: float kernels differ by machine and library
    version (an outside rerun's per-seed uplifts moved by 2 to 21 per 1k on another machine)."""
    import platform

    import torch

    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def format_funnel_summary(records: list[dict[str, Any]]) -> str:
    """A text table: one line per (planner, budget); then, where the oracle ran, each hit rate
    as a share of the oracle's, paired within seeds."""
    width = max([len("planner"), *(len(r["planner"]) for r in records)])
    lines = [
        f"{'planner':<{width}} {'budget':>6} {'hit':>6} {'hit ci95':>15} {'any':>5} {'NE':>6} "
        f"{'clk/1k':>7} {'no z':>7} {'FM':>7} {'uplift ci95':>15} {'TR':>6} {'FM/req':>7}"
    ]
    for r in records:
        lines.append(
            f"{r['planner']:<{width}} {r['budget']:>6.2f} {_cell(r['exact_hit_rate'], '6.3f')} "
            f"{_interval(r['exact_hit_rate_ci95'], '6.3f'):>15} "
            f"{_cell(r['coverage']['any'], '5.2f')} "
            f"{_cell(r['ne'], '6.3f')} {_cell(r['clicks_per_1k_requests'], '7.1f')} "
            f"{_cell(r['clicks_per_1k_requests_without_z'], '7.1f')} "
            f"{_cell(r['clicks_per_1k_requests_fm_ranking'], '7.1f')} "
            f"{_interval(r['click_uplift_per_1k_requests_ci95'], '6.1f'):>15} "
            f"{_cell(r['online_transfer_ratio'], '6.2f')} "
            f"{_cell(r['fm_calls_per_request'], '7.1f')}"
        )
    shares = [r for r in records if "exact_hit_rate_over_oracle" in r and r["planner"] != "oracle"]
    if shares:
        lines.append("hit rate as a share of the oracle's, paired within seeds [95% CI]:")
        for r in shares:
            lines.append(
                f"  {r['planner']:<{width}} {r['budget']:>6.2f} "
                f"{_cell(r['exact_hit_rate_over_oracle'], '6.1%')} "
                f"{_interval(r['exact_hit_rate_over_oracle_ci95'], '.1%', sep=', ')}"
            )
    return "\n".join(lines)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _cell(value: Any, spec: str) -> str:
    """``value`` formatted by ``spec``, or ``n/a`` in the same width where there is no figure (one
    seed has no interval, a run without FM gain no transfer ratio), as the transfer table says."""
    if _missing(value):
        width = spec.split(".")[0]
        return f"{'n/a':>{width}}" if width else "n/a"
    return f"{value:{spec}}"


def _interval(bounds: Any, spec: str, sep: str = ",") -> str:
    """``[lo, hi]``, or ``n/a`` where no interval could be formed; a bound alone missing (an
    interval unbounded below) keeps its place as ``n/a``."""
    if bounds is None or all(_missing(b) for b in bounds):
        return "n/a"
    lo, hi = bounds
    return f"[{_cell(lo, spec)}{sep}{_cell(hi, spec)}]"


def plot_funnel(records: list[dict[str, Any]], path: Path) -> None:
    """Hit rate, coverage (any tier), NE and clicks per 1,000 requests against budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    planners = list(dict.fromkeys(r["planner"] for r in records))
    for planner in planners:
        rows = sorted((r for r in records if r["planner"] == planner), key=lambda r: r["budget"])
        b = [r["budget"] for r in rows]
        hit = np.array([r["exact_hit_rate"] for r in rows])
        ci = np.array([r["exact_hit_rate_ci95"] for r in rows], dtype=float)
        axes[0].errorbar(b, hit, yerr=np.abs(ci.T - hit), marker="o", label=planner, capsize=3)
        axes[1].plot(b, [r["coverage"]["any"] for r in rows], marker="o", label=planner)
        axes[2].plot(b, [r["ne"] for r in rows], marker="o", label=planner)
        clicks = np.array([r["clicks_per_1k_requests"] for r in rows])
        cci = np.array([r["clicks_per_1k_requests_ci95"] for r in rows], dtype=float)
        axes[3].errorbar(
            b, clicks, yerr=np.abs(cci.T - clicks), marker="o", label=planner, capsize=3
        )
    if records:
        axes[3].axhline(
            records[0]["clicks_per_1k_requests_without_z"],
            color="grey",
            ls="--",
            label="VM without z",
        )
        axes[3].axhline(
            records[0]["clicks_per_1k_requests_fm_ranking"],
            color="black",
            ls=":",
            label="FM ranking",
        )
    for ax, title in zip(
        axes,
        ("exact hit rate", "coverage (any tier)", "NE of the VM on shown", "clicks / 1k requests"),
        strict=True,
    ):
        ax.set_title(title)
        ax.set_xlabel("budget (share of pool per hourly round)")
        ax.grid(alpha=0.3)
    axes[3].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
