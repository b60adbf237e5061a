"""The closed-loop funnel world (issue 13): users with a ground truth (:mod:`.world`), an
early-stage two-tower ranker (:mod:`.early_stage`), a request-propensity verifier learned from
the funnel's logs (:mod:`.request_model`), the loop of one seed (:mod:`.loop`) and the records
over seeds (:mod:`.report`). :func:`simulate_funnel` runs it all."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from solaris_feast.evaluation.funnel.loop import FUNNEL_PLANNERS, FunnelConfig, run_seed
from solaris_feast.evaluation.funnel.report import (
    build_funnel_records,
    format_funnel_summary,
    plot_funnel,
)
from solaris_feast.evaluation.funnel.world import FunnelWorldConfig, World
from solaris_feast.evaluation.metrics import strict_json
from solaris_feast.pipeline.settings import (
    DEFAULT_FILL_TARGETS_PER_BUDGET,
    DEFAULT_RETURN_WEIGHT_EXPONENT,
)
from solaris_feast.progress import StageProgress
from solaris_feast.tiers import FmRowsTier

__all__ = [
    "FUNNEL_PLANNERS",
    "FunnelConfig",
    "FunnelWorldConfig",
    "World",
    "format_funnel_summary",
    "run_seed",
    "simulate_funnel",
    "write_funnel_report",
]

logger = logging.getLogger(__name__)


def simulate_funnel(
    config: FunnelConfig,
    seeds: list[int],
    workers: int = 1,
    progress: StageProgress | None = None,
) -> list[dict[str, Any]]:
    """Run every seed and return one record per (planner, budget).

    ``workers > 1`` runs seeds in that many processes (spawned, each single-threaded as
    :func:`run_seed` is); a seed is a pure function of ``(config, seed)``, so the records are
    the serial run's. ``progress`` gets ``(stage, done, total)``: simulated hours when serial,
    finished seeds with workers (a worker process cannot draw the parent's bar).
    """
    unknown = [p for p in config.planners if p not in FUNNEL_PLANNERS]
    if unknown:
        raise ValueError(
            f"unknown funnel planners {unknown}; choose from {', '.join(FUNNEL_PLANNERS)}"
        )
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    report = progress if progress is not None else (lambda stage, done, total: None)
    outcomes = []
    if workers == 1 or len(seeds) == 1:
        total = len(seeds) * config.hours
        for k, seed in enumerate(seeds):

            def hour_done(hour: int, k: int = k) -> None:
                report("funnel hours (all seeds)", k * config.hours + hour + 1, total)

            outcomes.append(run_seed(config, seed, hour_done=hour_done))
            logger.info("funnel seed %d done: %d requests", seed, outcomes[-1].requests)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        context = multiprocessing.get_context("spawn")
        by_seed = {}
        report("funnel seeds", 0, len(seeds))
        with ProcessPoolExecutor(min(workers, len(seeds)), mp_context=context) as pool:
            futures = [pool.submit(run_seed, config, seed) for seed in seeds]
            for future in as_completed(futures):
                outcome = future.result()
                by_seed[outcome.seed] = outcome
                report("funnel seeds", len(by_seed), len(seeds))
                logger.info("funnel seed %d done: %d requests", outcome.seed, outcome.requests)
        outcomes = [by_seed[seed] for seed in seeds]  # records in the seeds' order, as serial
    records = build_funnel_records(outcomes)
    # What shaped every round, so a record says what it measured.
    settings = config.precompute.model_dump(
        include={"fill_targets_per_budget", "return_weight_exponent", "fm_rows_tier"}
    )
    for record in records:
        record["precompute_settings"] = settings
    return records


def write_funnel_report(
    records: list[dict[str, Any]], json_path: Path | None, plot: Path | None
) -> None:
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(strict_json(records, indent=2) + "\n")
    if plot is not None:
        plot_funnel(records, plot)


def run_funnel_command(
    budget: str,
    planner: str,
    seeds: list[int],
    json_path: Path | None,
    plot: Path | None,
    workers: int = 1,
    fm_rows: FmRowsTier = "zero",
    progress: bool = True,
    return_weight_exponent: float = DEFAULT_RETURN_WEIGHT_EXPONENT,
    fill_targets_per_budget: float = DEFAULT_FILL_TARGETS_PER_BUDGET,
) -> None:
    """``solaris simulate --world funnel``: parse the shared options, run, report."""
    import typer

    from solaris_feast.evaluation.replay import parse_floats

    budgets = parse_floats(budget)
    planners = tuple(p.strip() for p in planner.split(",") if p.strip())
    unknown = [p for p in planners if p not in FUNNEL_PLANNERS]
    if unknown or not planners:
        raise typer.BadParameter(
            f"unknown funnel planners {unknown}; choose from {', '.join(FUNNEL_PLANNERS)}"
        )
    default = FunnelConfig()
    config = default.model_copy(
        update={
            "planners": planners,
            "precompute": default.precompute.model_copy(
                update={
                    "budgets": budgets,
                    "fm_rows_tier": fm_rows,
                    "return_weight_exponent": return_weight_exponent,
                    "fill_targets_per_budget": fill_targets_per_budget,
                }
            ),
        }
    )
    from solaris_feast.progress import stage_bars

    with stage_bars(progress) as bars:
        records = simulate_funnel(config, seeds, workers, bars)
    write_funnel_report(records, json_path, plot)
    typer.echo(format_funnel_summary(records))
    if json_path is not None:
        typer.echo(f"JSON: {json_path}")
    if plot is not None:
        typer.echo(f"plot: {plot}")
