"""The replay's report: one JSON record per (planner, budget, user space), a summary table
and a plot of coverage and NE against budget."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from solaris_feast.evaluation.metrics import (
    coverage_shares,
    mean_ci95,
    normalized_entropy,
    paired_ratios,
    strict_json,
    transfer_ratio,
)
from solaris_feast.evaluation.replay_config import ABLATION_STEPS, SimulationConfig
from solaris_feast.evaluation.replay_state import PlannerState


def build_records(
    states: list[PlannerState],
    baselines: dict[str, list[np.ndarray]],
    candidate_recall: list[float],
    fm_rate: list[tuple[int, float]],
    feast_check: dict[str, Any] | None,
    cfg: SimulationConfig,
    total_steps: int,
    first_scored: int,
) -> list[dict[str, Any]]:
    if not baselines["labels"]:
        raise ValueError("no impressions were served in the scored steps: nothing to report")
    labels = np.concatenate(baselines["labels"])
    ne_vm = normalized_entropy(np.concatenate(baselines["vm_zero"]), labels)[0]
    ne_fm = normalized_entropy(np.concatenate(baselines["fm"]), labels)[0]
    pairs = sum(n for n, _ in fm_rate)
    seconds = sum(s for _, s in fm_rate)
    records = []
    for state in states:
        ablation: list[dict[str, Any]] = []
        for name in ABLATION_STEPS:
            ne = normalized_entropy(np.concatenate(state.probs[name]), labels)[0]
            tr = transfer_ratio(ne_vm, ne, ne_fm)
            ablation.append(
                {
                    "tiers": name,
                    "coverage": _round(coverage_shares(state.tier_counts[name])),
                    "ne": round(ne, 5),
                    "tr": round(tr, 4) if math.isfinite(tr) else None,
                }
            )
        full = ablation[-1]
        fm_s = state.seconds.get("fm", 0.0)
        # The overhead: planning, writes, aggregation, fill. Candidate generation and
        # verifier scoring are reported beside it, since they scale with candidates, not budget.
        overhead = sum(state.seconds.get(k, 0.0) for k in ("plan", "store", "aggregate", "fill"))
        scoring = state.seconds.get("candidates", 0.0) + state.seconds.get("verifier", 0.0)
        record: dict[str, Any] = {
            "planner": state.planner,
            "budget": state.budget,
            "budget_basis": cfg.budget_basis,
            "similarity_space": state.space,
            "exact_hit_rate": full["coverage"]["exact"],
            "coverage": full["coverage"],
            "ne": full["ne"],
            "tr": full["tr"],
            "ne_vm_without_embedding": round(ne_vm, 5),
            "ne_fm": round(ne_fm, 5),
            "fm_pairs": state.fm_pairs,
            "mean_budget_pairs_per_step": round(float(np.mean(state.budget_pairs)), 1),
            "served_pairs": state.served,
            "ablation": ablation,
            "plan": dict(state.plan_totals),
            "seconds": {k: round(v, 3) for k, v in sorted(state.seconds.items())},
            "non_fm_share": round(overhead / (overhead + fm_s), 4) if overhead + fm_s else None,
            "non_fm_share_with_scoring": round(
                (overhead + scoring) / (overhead + scoring + fm_s), 4
            )
            if overhead + scoring + fm_s
            else None,
            "steps": total_steps - first_scored,
            "warmup_steps": cfg.warmup_steps,
            "ne_vm": cfg.ne_vm,
            "ne_tuning_steps": first_scored - cfg.warmup_steps,
            "candidate_recall": round(float(np.mean(candidate_recall)), 4)
            if candidate_recall
            else None,
            "fm_pairs_per_second": round(pairs / seconds, 1) if seconds > 0 else None,
            "dataset": cfg.dataset,
        }
        if (
            feast_check is not None
            and feast_check.get("planner") == state.planner
            and (
                feast_check.get("budget") == state.budget
                and feast_check.get("space") == state.space
            )
        ):
            record["feast_check"] = feast_check
        records.append(record)
    return records


def _round(values: dict[str, float]) -> dict[str, float]:
    return {k: round(float(v), 5) for k, v in values.items()}


SEED_MEASURES = ("exact_hit_rate", "ne", "tr")
"""Measures whose per-seed values and 95 % interval a several-seed replay keeps."""


def combine_seeds(runs: list[list[dict[str, Any]]], seeds: list[int]) -> list[dict[str, Any]]:
    """One record per (planner, budget, user space) from the records of several seeds' replays.

    Every number is the mean over seeds (coverage, NE, the ablation, counts...). Beside
    :data:`SEED_MEASURES` stand ``<measure>_per_seed`` and ``<measure>_ci95`` (Student-t over
    seeds), and for every planner its hit rate as a share of the oracle's and as a multiple of
    random's at the same budget, paired within each seed (``exact_hit_rate_over_oracle``
    and ``exact_hit_rate_over_random``, with ``_per_seed`` and ``_ci95``), where those planners
    ran. The Feast check is the first seed's."""
    if len(runs) != len(seeds) or not runs:
        raise ValueError(f"{len(runs)} runs for {len(seeds)} seeds")
    keys = [[_record_key(r) for r in run] for run in runs]
    if any(k != keys[0] for k in keys):
        raise ValueError("the seeds' replays did not report the same planners, budgets and spaces")
    combined = []
    for at, key in enumerate(keys[0]):
        rows = [run[at] for run in runs]
        record = _mean_tree(rows)
        record["seeds"] = list(seeds)
        for measure in SEED_MEASURES:
            _with_interval(record, measure, [r[measure] for r in rows])
        for other in ("oracle", "random"):
            at_other = _position(keys[0], (other, *key[1:]))
            if at_other is None:
                continue
            base = [run[at_other]["exact_hit_rate"] for run in runs]
            ratios = paired_ratios([r["exact_hit_rate"] for r in rows], base)
            _with_interval(record, f"exact_hit_rate_over_{other}", ratios.tolist())
        if "feast_check" in rows[0]:  # a record of one step, not a figure to average
            record["feast_check"] = rows[0]["feast_check"]
        combined.append(record)
    return combined


def _record_key(record: dict[str, Any]) -> tuple[Any, ...]:
    return (record["planner"], record["budget"], record["similarity_space"])


def _position(keys: list[tuple[Any, ...]], key: tuple[Any, ...]) -> int | None:
    """Where ``(planner, budget, space)`` is, or the planner at that budget in another space:
    the space is where the fill searches, and the exact tier does not depend on it."""
    if key in keys:
        return keys.index(key)
    return next((at for at, k in enumerate(keys) if k[:2] == key[:2]), None)


def _with_interval(record: dict[str, Any], measure: str, values: list[float | None]) -> None:
    """``measure`` as the mean over seeds, beside its per-seed values and interval (an undefined
    seed, None or NaN, is left out of both and shown as None)."""
    finite = [math.nan if v is None else float(v) for v in values]
    mean, lo, hi = mean_ci95(finite)
    record[measure] = round(mean, 5) if math.isfinite(mean) else None
    record[f"{measure}_per_seed"] = [None if math.isnan(v) else round(v, 5) for v in finite]
    record[f"{measure}_ci95"] = (
        [round(lo, 5), round(hi, 5)] if math.isfinite(lo) and math.isfinite(hi) else None
    )


def _mean_tree(values: list[Any]) -> Any:
    """The mean over seeds of every number in records of one shape; text (names, settings) is
    the first seed's, and a number missing (None) in some seeds is the mean of the others."""
    first = values[0]
    if isinstance(first, dict):
        return {
            k: _mean_tree([v[k] for v in values])
            for k in first
            if all(isinstance(v, dict) and k in v for v in values)
        }
    if isinstance(first, list) and all(
        isinstance(v, list) and len(v) == len(first) for v in values
    ):
        return [_mean_tree([v[i] for v in values]) for i in range(len(first))]
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if numbers and len(numbers) + sum(v is None for v in values) == len(values):
        mean = float(np.mean(numbers))
        if any(isinstance(v, float) for v in numbers):
            return round(mean, 5)
        return int(mean) if mean.is_integer() else round(mean, 1)  # counts stay counts
    return first


def write_report(
    records: list[dict[str, Any]], json_path: Path | None, plot_path: Path | None
) -> None:
    """Write the records as JSON and, optionally, a PNG of coverage and NE against budget."""
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(strict_json(records, indent=2) + "\n")
    if plot_path is not None:
        _plot(records, plot_path)


def _plot(records: list[dict[str, Any]], path: Path) -> None:
    from solaris_feast.plots import pyplot, save_figure

    plt = pyplot()

    main = [r for r in records if r["similarity_space"] == records[0]["similarity_space"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for n, planner in enumerate(dict.fromkeys(r["planner"] for r in main)):
        rows = sorted((r for r in main if r["planner"] == planner), key=lambda r: r["budget"])
        budgets = [r["budget"] for r in rows]
        color = f"C{n}"  # one colour per planner in both panels
        left.plot(budgets, [r["coverage"]["exact"] for r in rows], "o-", color=color, label=planner)
        if planner == "verifier":  # every planner's any-tier coverage is about the same
            any_tier = [r["coverage"]["any"] for r in rows]
            left.plot(budgets, any_tier, "o--", color="grey", label="verifier, any tier")
        right.plot(budgets, [r["ne"] for r in rows], "o-", color=color, label=planner)
    basis = records[0].get("budget_basis", "step") if records else "step"
    xlabel = (
        "FM budget (share of candidate pairs per run)"
        if basis == "step"
        else "FM budget (share of candidate pairs kept fresh)"
    )
    if main:
        right.axhline(main[0]["ne_vm_without_embedding"], color="grey", ls=":", label="VM, no z")
        right.axhline(main[0]["ne_fm"], color="black", ls=":", label="FM")
    left.set_xlabel(xlabel)
    left.set_ylabel("share of served pairs")
    left.set_title("Coverage: exact (solid), any tier (dashed)")
    right.set_xlabel(xlabel)
    right.set_ylabel("normalized entropy (lower is better)")
    right.set_title("NE of the VM on served pairs")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    save_figure(fig, path, dpi=120)


def format_summary(records: list[dict[str, Any]]) -> str:
    """A plain-text table: one line per record; over several seeds, the means, then each
    record's hit rate with its interval and as a share of the oracle's."""
    lines = [
        f"{'planner':<9} {'budget':>6} {'space':<9} {'exact':>6} {'similar':>7} {'user':>6} "
        f"{'zero':>6} {'NE':>7} {'TR':>6} {'FM pairs':>9}"
    ]
    for r in records:
        c = r["coverage"]
        tr = "n/a" if r["tr"] is None else f"{r['tr']:.3f}"
        lines.append(
            f"{r['planner']:<9} {r['budget']:>6.2f} {r['similarity_space']:<9} {c['exact']:>6.3f} "
            f"{c['similar']:>7.3f} {c['user']:>6.3f} {c['zero']:>6.3f} {r['ne']:>7.4f} {tr:>6} "
            f"{r['fm_pairs']:>9}"
        )
    if records and "seeds" in records[0]:
        seeds = records[0]["seeds"]
        lines.append(f"over {len(seeds)} seeds ({', '.join(map(str, seeds))}), 95% intervals:")
        for r in records:
            lines.append(
                f"  {r['planner']:<9} {r['budget']:>6.2f} {r['similarity_space']:<9} exact hit "
                f"{_with_ci(r, 'exact_hit_rate')}; of the oracle's "
                f"{_with_ci(r, 'exact_hit_rate_over_oracle')}; x random "
                f"{_with_ci(r, 'exact_hit_rate_over_random')}"
            )
    return "\n".join(lines)


def _with_ci(record: dict[str, Any], measure: str) -> str:
    value, ci = record.get(measure), record.get(f"{measure}_ci95")
    if value is None:
        return "n/a"
    return f"{value:.3f}" + ("" if ci is None else f" [{ci[0]:.3f}, {ci[1]:.3f}]")
