"""Replay simulation: how much of the served traffic each planner covers under an FM budget.

The log is split in time: models are trained on the first part (the VM with the serving tier mix,
see :mod:`solaris_feast.models.chain`), then the rest is replayed in steps (hourly by default). At
the start of each step ``t`` and for every planner and budget, using only events before ``t``:

1. candidates per active user (:mod:`solaris_feast.precompute.candidates`) plus the queued misses
   of the last step form the pool; each planner scores the pool (``verifier``: the production
   planner's :func:`~solaris_feast.precompute.plan.request_score`, the VM's score with no
   embedding times the retrieval score; ``vm_only`` and ``retrieval``: its two factors alone;
   ``random``; ``popular``: item popularity over the last day; ``oracle``: whether the pair is
   requested during the step, then whether it is requested later while a vector computed now
   would still be fresh (the pair TTL), the bound any planner over this pool is read against);
2. :func:`~solaris_feast.precompute.plan.plan_precompute` picks the step's budget of pairs
   (``budget x |candidates|``, or a pair TTL's share of that with ``budget_basis="pair_ttl"``),
   the FM computes them as of ``t``
   (:func:`~solaris_feast.precompute.compute.compute_pair_embeddings`);
3. the user aggregate and the similarity fill (targets: the best uncovered pairs and the
   misses) are recomputed.

Then the step's real impressions are served from that state with the one tier rule,
:func:`~solaris_feast.serving.resolve.resolve` (exact > similar > user aggregate > zero, fresh
while ``age <= ttl``), and scored by the VM. Ages are taken at the step start, so everything
served in a step sees the state the precompute left at ``t``.

Layout: :mod:`.replay_config` (what a replay runs), :mod:`.replay_state` (the in-memory views,
newest row per key as the writer keeps them, and each replay's counters), this module (the step
loop), :mod:`.feast_check` (one step through the real Feast writer and
:class:`~solaris_feast.serving.retriever.SolarisRetriever`, which must give the same tier for
every served pair), :mod:`.report` (records, table, plot) and :mod:`.metrics` (NE, TR, coverage).

No step reads the future: candidates, the featurizer used for precompute and the popularity
scores see events strictly before ``t``; served impressions are featurized as of their own time,
as serving would. Only the oracle reads the requests of the step and of the pair TTL after it, by
definition.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast, get_args

import numpy as np
import pandas as pd
import typer

from solaris_feast.columns import COMPUTED_AT, EMBEDDING
from solaris_feast.data.datasets import load_configured_log
from solaris_feast.data.schema import EVENT_TIMESTAMP, ITEM_ID, USER_ID, InteractionDataset
from solaris_feast.errors import ConfigError
from solaris_feast.evaluation.feast_check import check_against_feast
from solaris_feast.evaluation.metrics import percentile_rank
from solaris_feast.evaluation.replay_config import (
    ABLATION_STEPS,
    ABLATION_TIERS,
    ALL_PLANNERS,
    ONCE_CONSUMED_DATASETS,
    PLANNERS,
    PlannerName,
    SimulationConfig,
)
from solaris_feast.evaluation.replay_state import PlannerState
from solaris_feast.evaluation.report import (
    build_records,
    combine_seeds,
    format_summary,
    write_report,
)
from solaris_feast.keys import pair_keys, split_pair_keys
from solaris_feast.pipeline.settings import (
    DEFAULT_FILL_TARGETS_PER_BUDGET,
    DEFAULT_RETURN_WEIGHT_EXPONENT,
)
from solaris_feast.precompute.aggregate import PairEmbeddings, aggregate_user_embeddings
from solaris_feast.precompute.candidates import (
    CANDIDATE_SCORE,
    CandidateConfig,
    generate_candidates,
)
from solaris_feast.precompute.plan import VERIFIER_SCORE, plan_precompute, request_score
from solaris_feast.precompute.returns import return_weights
from solaris_feast.precompute.similarity import (
    build_user_index,
    fill_target_count,
    similarity_fill,
)
from solaris_feast.serving.resolve import Resolution, TierValues, resolve
from solaris_feast.tiers import FmRowsTier, Tier

if TYPE_CHECKING:
    from solaris_feast.models.features import PairBatch, PairFeaturizer
    from solaris_feast.models.registry import ModelBundle
    from solaris_feast.progress import StageProgress

__all__ = [
    "ALL_PLANNERS",
    "PLANNERS",
    "SimulationConfig",
    "StepObserver",
    "format_summary",
    "simulate",
    "simulate_command",
    "write_report",
]

logger = logging.getLogger(__name__)

_INFERENCE_BATCH = 8192

StepObserver = Callable[[int, pd.Timestamp, dict[str, PairEmbeddings]], None]
"""``(step, step start, exact store per replay)``, called after each step's precompute."""

_TuningRows = tuple["PairBatch", np.ndarray, np.ndarray, np.ndarray]
"""``(features, z, tiers, labels)`` of one tuning step's served impressions."""


@dataclass
class ReplayStep:
    """Everything one step shares between planners."""

    index: int
    start: pd.Timestamp
    scored: bool
    candidates: pd.DataFrame
    requests: pd.DataFrame
    pool: pd.DataFrame
    candidates_seconds: float
    verifier_seconds: float
    featurizer: PairFeaturizer
    """Features as of the step start (events strictly before it), for precompute."""

    @property
    def now_s(self) -> float:
        return self.start.value / 1e9


@dataclass
class ReplayRun:
    """What every step of one :func:`simulate` call reads and adds to."""

    cfg: SimulationConfig
    ds: InteractionDataset
    bundle: ModelBundle
    candidate_cfg: CandidateConfig
    serve_featurizer: PairFeaturizer
    states: list[PlannerState]
    total_steps: int
    first_scored: int
    ne_vm: Any
    """The VM that scores NE: the registered one until the tuning steps replace it."""
    tuning: list[_TuningRows] = field(default_factory=list)
    feast_check: dict[str, Any] | None = None
    baselines: dict[str, list[np.ndarray]] = field(
        default_factory=lambda: {"vm_zero": [], "fm": [], "labels": []}
    )
    candidate_recall: list[float] = field(default_factory=list)
    fm_rate: list[tuple[int, float]] = field(default_factory=list)

    @property
    def version(self) -> str:
        return self.bundle.embedding_version

    @property
    def tuning_range(self) -> range:
        return range(self.cfg.warmup_steps, self.first_scored)


def simulate(
    config: SimulationConfig | None = None,
    *,
    dataset: InteractionDataset | None = None,
    bundle: ModelBundle | None = None,
    progress: StageProgress | None = None,
    observer: StepObserver | None = None,
) -> list[dict[str, Any]]:
    """Replay the log for every planner and budget; one record per (planner, budget).

    Args:
        config: What to replay.
        dataset: Replay this data set instead of loading ``config.dataset`` (tests).
        bundle: Use these models instead of training on the first part of the log; they must
            not have seen the replayed period.
        progress: ``(stage, done, total)`` callback.
        observer: Called after each step's precompute with the step number, its start and the
            exact store of every replay (keyed ``planner@budget/space``); the leakage test
            compares these between a log and the same log with its future altered.

    Returns:
        Records with ``planner``, ``budget``, ``exact_hit_rate``, ``coverage`` (``exact``,
        ``similar``, ``user``, ``zero``, ``any``), ``ne``, ``tr``, ``fm_pairs``, ``ablation``
        (``exact`` / ``exact+user`` / ``exact+user+similar``, each with coverage and NE),
        timing and plan stats.
    """
    import torch

    from solaris_feast.data.datasets import load_dataset
    from solaris_feast.data.schema import time_split

    cfg = config or SimulationConfig()
    ds = dataset if dataset is not None else load_dataset(cfg.dataset, cfg.size, cfg.seed)
    train_ds, replay_ds = time_split(ds, cfg.train_fraction)
    if bundle is None:
        bundle = _train_models(train_ds, cfg, progress)
    step = pd.Timedelta(seconds=cfg.step_seconds)
    first = replay_ds.interactions[EVENT_TIMESTAMP].min().ceil(step)
    run = _start_replay(cfg, ds, bundle, first)

    # Inference only, except where _tune_vm turns gradients back on; restored on the way out
    # so a caller's (or a test session's) grad mode is left as it was.
    grad_was_enabled = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    try:
        for k in range(run.total_steps):
            the_step = _prepare_step(run, k, first + k * step)
            precompute_step(run, the_step)
            if observer is not None:
                exact = {s.name: s.exact.as_pair_embeddings(run.version) for s in run.states}
                observer(k, the_step.start, exact)
            _serve_step(run, the_step)
            if progress is not None:
                progress("replay", k + 1, run.total_steps)
            # With a progress bar the step's line repeats it: kept for --verbose.
            logger.log(
                logging.INFO if progress is None else logging.DEBUG,
                "replay step %d/%d at %s: %d requests",
                k + 1,
                run.total_steps,
                the_step.start,
                len(the_step.requests),
            )
    finally:
        torch.set_grad_enabled(grad_was_enabled)
    records = build_records(
        run.states,
        run.baselines,
        run.candidate_recall,
        run.fm_rate,
        run.feast_check,
        cfg,
        run.total_steps,
        run.first_scored,
    )
    if dataset is not None:  # a log of the caller's (a deployment's own): named as it is
        for record in records:
            record["dataset"] = dataset.name
    return records


def _start_replay(
    cfg: SimulationConfig, ds: InteractionDataset, bundle: ModelBundle, first: pd.Timestamp
) -> ReplayRun:
    """The replay's settings resolved against the data set, its step range and empty states."""
    from solaris_feast.models.features import PairFeaturizer

    step = pd.Timedelta(seconds=cfg.step_seconds)
    total_steps = int((ds.interactions[EVENT_TIMESTAMP].max() - first) / step)
    tuning_steps = cfg.ne_tuning_steps if cfg.ne_vm == "replay_tuned" else 0
    first_scored = cfg.warmup_steps + tuning_steps
    if cfg.max_steps is not None:
        total_steps = min(total_steps, first_scored + cfg.max_steps)
    if total_steps <= first_scored:
        raise ValueError(
            f"the replayed period holds {total_steps} steps, not more than warmup_steps "
            f"{cfg.warmup_steps} + tuning steps {tuning_steps}: lower train_fraction, "
            "warmup_steps or ne_tuning_steps"
        )
    dim = int(bundle.vm.config.embedding_dim)
    states = [
        PlannerState(p, b, cfg.similarity_space, dim) for p in cfg.planners for b in cfg.budgets
    ]
    if cfg.compare_similarity_spaces and "verifier" in cfg.planners and cfg.budgets:
        near_ten = min(cfg.budgets, key=lambda b: abs(b - 0.1))
        other = "aggregate" if cfg.similarity_space == "fm_user" else "fm_user"
        states.append(PlannerState("verifier", near_ten, other, dim))
    return ReplayRun(
        cfg=cfg,
        ds=ds,
        bundle=bundle,
        candidate_cfg=_candidate_config(cfg, ds),
        # Reads strictly before each event, so serving-time features never see the event itself.
        serve_featurizer=PairFeaturizer(ds, bundle.schema.history_len),
        states=states,
        total_steps=total_steps,
        first_scored=first_scored,
        ne_vm=bundle.vm,
    )


def _candidate_config(cfg: SimulationConfig, ds: InteractionDataset) -> CandidateConfig:
    candidate_cfg = cfg.candidates
    if candidate_cfg.category_column is None:
        candidate_cfg = candidate_cfg.model_copy(update={"category_column": _category_column(ds)})
    exclude_seen = cfg.exclude_seen_items
    if exclude_seen is None:
        exclude_seen = ds.name in ONCE_CONSUMED_DATASETS
    if exclude_seen:
        candidate_cfg = candidate_cfg.model_copy(update={"exclude_seen_items": True})
    return candidate_cfg


def _prepare_step(run: ReplayRun, k: int, start: pd.Timestamp) -> ReplayStep:
    """Requests, candidates and the scored pool of step ``k``, from events before ``start``."""
    from solaris_feast.models.features import PairFeaturizer

    log = run.ds.interactions
    t0 = time.perf_counter()
    past = log.loc[log[EVENT_TIMESTAMP] < start]
    end = start + pd.Timedelta(seconds=run.cfg.step_seconds)
    requests = log.loc[(log[EVENT_TIMESTAMP] >= start) & (log[EVENT_TIMESTAMP] < end)]
    requests = requests.drop_duplicates([USER_ID, ITEM_ID, EVENT_TIMESTAMP])
    # A vector computed now serves every request while it is fresh, not only this step's.
    fresh_until = start + pd.Timedelta(seconds=run.cfg.pair_ttl_seconds)
    later = log.loc[(log[EVENT_TIMESTAMP] >= end) & (log[EVENT_TIMESTAMP] < fresh_until)]
    featurizer = PairFeaturizer(run.ds.with_interactions(past), run.bundle.schema.history_len)
    candidates = generate_candidates(past, start, run.candidate_cfg, items=run.ds.items)
    t1 = time.perf_counter()
    pool = score_pool(candidates, run, requests, past, start, featurizer, k, later_requests=later)
    return ReplayStep(
        index=k,
        start=start,
        scored=k >= run.first_scored,
        candidates=candidates,
        requests=requests,
        pool=pool,
        candidates_seconds=t1 - t0,
        verifier_seconds=time.perf_counter() - t1,
        featurizer=featurizer,
    )


def _train_models(
    train_ds: InteractionDataset,
    cfg: SimulationConfig,
    progress: StageProgress | None,
) -> ModelBundle:
    from solaris_feast.models.chain import simulation_training, train_and_register

    training = simulation_training(cfg.seed, cfg.fm_epochs, cfg.fm_rows_tier)
    if cfg.models_dir is not None:
        from solaris_feast.models.registry import list_cards, load_bundle

        models_dir = Path(cfg.models_dir)
        if models_dir.is_dir() and any(c.kind == "vm" for c in list_cards(models_dir)):
            bundle = load_bundle(models_dir)
            end = bundle.vm_card.train_window_end
            replay_start = train_ds.interactions[EVENT_TIMESTAMP].max()
            if (
                bundle.vm_card.dataset == train_ds.name
                and end is not None
                and pd.Timestamp(end) <= replay_start
                and bundle.fm_card.train_window_end is not None
                and pd.Timestamp(bundle.fm_card.train_window_end) <= replay_start
            ):
                logger.info("reusing models %s from %s", bundle.vm_card.version, models_dir)
                return bundle
            raise ConfigError(
                f"models in {models_dir} were trained on {bundle.vm_card.dataset!r} up to {end}, "
                f"not on the replay's training period (up to {replay_start}): use an empty "
                "folder so the replay trains its own"
            )
        return train_and_register(train_ds, models_dir, training, progress)
    with tempfile.TemporaryDirectory(prefix="solaris-simulate-") as tmp:
        return train_and_register(train_ds, Path(tmp), training, progress)


def _category_column(ds: InteractionDataset) -> str | None:
    if "category" in ds.item_categorical:
        return "category"
    return ds.item_categorical[0] if ds.item_categorical else None


def score_pool(
    candidates: pd.DataFrame,
    run: ReplayRun,
    requests: pd.DataFrame,
    past: pd.DataFrame,
    start: pd.Timestamp,
    featurizer: PairFeaturizer,
    step_index: int,
    extra_scores: Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]] | None = None,
    *,
    later_requests: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Distinct pairs of the candidates and every state's queued misses, with each planner's
    score as a percentile rank in ``[0, 1]`` (column per planner). ``extra_scores(users,
    items)`` adds planners of a caller's own (the funnel world's early-stage ranker).
    ``requests`` are the step's; ``later_requests``, those after it while a vector computed now
    is fresh, which the oracle also knows (:func:`oracle_score`)."""
    frames = [candidates[[USER_ID, ITEM_ID]]] + [s.misses for s in run.states]
    pool = pd.concat(frames, ignore_index=True).drop_duplicates([USER_ID, ITEM_ID])
    pool = pool.sort_values([USER_ID, ITEM_ID], kind="stable").reset_index(drop=True)
    # NaN for a queued miss that is not a candidate (request_score counts it as retrieved).
    retrieval = pool.merge(
        candidates[[USER_ID, ITEM_ID, CANDIDATE_SCORE]], on=[USER_ID, ITEM_ID], how="left"
    )[CANDIDATE_SCORE].to_numpy(dtype=np.float64)
    users = pool[USER_ID].to_numpy(dtype=np.int64)
    items = pool[ITEM_ID].to_numpy(dtype=np.int64)
    verifier = np.zeros(len(pool))
    for lo in range(0, len(pool), _INFERENCE_BATCH):
        hi = min(lo + _INFERENCE_BATCH, len(pool))
        batch = featurizer.batch(users[lo:hi], items[lo:hi], start)
        verifier[lo:hi] = run.bundle.vm.verifier_score(batch).numpy()
    # Random: a fixed hash of (seed, step, pair), so reruns pick the same pairs.
    rng = np.random.default_rng([run.cfg.seed, step_index, 7])
    random_score = rng.random(len(pool))
    day = past.loc[past[EVENT_TIMESTAMP] >= start - pd.Timedelta(days=1), ITEM_ID]
    popular = day.value_counts().reindex(items).fillna(0.0).to_numpy(dtype=np.float64)
    keys = pair_keys(users, items)

    def requested_in(frame: pd.DataFrame | None) -> np.ndarray:
        if frame is None:
            return np.zeros(len(keys), dtype=bool)
        return np.isin(keys, pair_keys(frame[USER_ID].to_numpy(), frame[ITEM_ID].to_numpy()))

    requested, requested_later = requested_in(requests), requested_in(later_requests)
    # As the precompute weighs users: expected returns within the pair TTL.
    weight = (
        return_weights(users, past, start, run.cfg.pair_ttl_seconds, run.cfg.return_weight_exponent)
        if run.cfg.return_weight_exponent > 0
        else None
    )
    scores = {
        "verifier": request_score(
            users, verifier, retrieval, run.cfg.retrieval_weight, user_weight=weight
        ),
        "vm_only": verifier,
        "retrieval": request_score(users, np.ones(len(pool)), retrieval) + 1e-3 * verifier,
        "random": random_score,
        # Ties in popularity are broken by the verifier's score.
        "popular": popular + 1e-3 * verifier,
        "oracle": oracle_score(requested, requested_later, verifier),
    }
    if extra_scores is not None:
        scores.update(extra_scores(users, items))
    for name in dict.fromkeys(s.planner for s in run.states):
        pool[name] = percentile_rank(scores[name])
    return pool


def oracle_score(
    requested: np.ndarray, requested_later: np.ndarray, verifier: np.ndarray
) -> np.ndarray:
    """The oracle's order: pairs requested in the step first (no later round can compute them in
    time), then pairs requested later while a vector computed now is still fresh (a later round
    could, if its budget allows), then the rest; the verifier's score (in ``[0, 1]``) breaks
    ties. Knowing only the step made it a weak bound wherever requests repeat within the TTL: on
    MovieLens-100K the verifier outscored it (0.091 against 0.089)."""
    return (
        2.0 * np.asarray(requested, dtype=np.float64)
        + np.asarray(requested_later, dtype=np.float64)
        + 1e-3 * np.asarray(verifier, dtype=np.float64)
    )


def precompute_step(run: ReplayRun, the_step: ReplayStep) -> None:
    """Every replay plans its budget, the FM computes the planned pairs once, then each replay
    stores them and refreshes its user aggregate and similarity fill."""
    plans = [_plan(run.cfg, the_step, state) for state in run.states]
    keys, z, pairs_per_second = _compute_planned(run, the_step, plans)
    fm_user_vectors: tuple[np.ndarray, np.ndarray] | None = None
    for state, plan in zip(run.states, plans, strict=True):
        _store_exact(run.cfg, the_step, state, plan, keys, z, pairs_per_second)
        exact = state.exact.as_pair_embeddings(run.version)
        _refresh_user_aggregate(run, the_step, state, exact)
        if state.space == "fm_user" and fm_user_vectors is None:
            fm_user_vectors = _fm_user_vectors(run.bundle, the_step.featurizer, the_step.start)
        index_space = (
            fm_user_vectors
            if state.space == "fm_user" and fm_user_vectors is not None
            else (state.user.keys, state.user.vectors)
        )
        _refresh_similar(run, the_step, state, plan, exact, index_space)


def _plan(cfg: SimulationConfig, the_step: ReplayStep, state: PlannerState) -> Any:
    """This replay's :func:`plan_precompute` over the step's pool, by its planner's score."""
    t0 = time.perf_counter()
    score = the_step.pool[[USER_ID, ITEM_ID, state.planner]].rename(
        columns={state.planner: VERIFIER_SCORE}
    )
    candidates = score.merge(the_step.candidates[[USER_ID, ITEM_ID]], on=[USER_ID, ITEM_ID])
    misses = score.merge(state.misses, on=[USER_ID, ITEM_ID])
    stored_users, stored_items = split_pair_keys(state.exact.keys)
    fresh_state = pd.DataFrame(
        {USER_ID: stored_users, ITEM_ID: stored_items, COMPUTED_AT: state.exact.computed_at_s}
    )
    budget = round(state.budget * len(the_step.candidates) * _steps_per_budget(cfg))
    plan = plan_precompute(
        candidates,
        misses,
        fresh_state,
        budget,
        the_step.start,
        cfg.pair_ttl_seconds,
        cfg.refresh_margin_seconds,
        cfg.min_miss_rank,
        user_balanced=cfg.user_balanced and not _knows_who_comes(cfg, state.planner),
    )
    state.add_seconds("plan", time.perf_counter() - t0)
    # Every real run generates and scores its own candidates: charge each replay in full.
    state.add_seconds("candidates", the_step.candidates_seconds)
    state.add_seconds("verifier", the_step.verifier_seconds)
    state.budget_pairs.append(budget)
    for name, value in (
        ("from_misses", plan.stats.from_misses),
        ("refreshes", plan.stats.refreshes),
        ("new", plan.stats.new),
        ("skipped_fresh", plan.stats.skipped_fresh),
    ):
        state.plan_totals[name] = state.plan_totals.get(name, 0) + value
    return plan


def _knows_who_comes(cfg: SimulationConfig, planner: str) -> bool:
    """The oracle knows who comes and the verifier's return weight says who is likely to:
    spreading their budget over every user would only undo that."""
    return planner == "oracle" or (planner == "verifier" and cfg.return_weight_exponent > 0)


def _compute_planned(
    run: ReplayRun, the_step: ReplayStep, plans: list[Any]
) -> tuple[np.ndarray, np.ndarray, float]:
    """``(sorted pair keys, z, FM pairs per second)`` of every distinct planned pair: the FM runs
    once per pair, so every replay gets the same z for a pair at ``t``."""
    from solaris_feast.models.interface import ChainModels, PairsAsOf
    from solaris_feast.precompute.compute import compute_pair_embeddings

    planned = pd.concat([p.pairs[[USER_ID, ITEM_ID]] for p in plans], ignore_index=True)
    planned = planned.drop_duplicates().sort_values([USER_ID, ITEM_ID], kind="stable")
    users, items = planned[USER_ID].to_numpy(), planned[ITEM_ID].to_numpy()
    keys = pair_keys(users, items)
    t0 = time.perf_counter()
    chain = ChainModels.reference(run.bundle, the_step.featurizer)
    pairs = PairsAsOf.of(users, items, the_step.start, the_step.featurizer.dataset)
    z, _, _ = compute_pair_embeddings(chain, pairs)
    fm_seconds = time.perf_counter() - t0
    if len(keys):
        run.fm_rate.append((len(keys), fm_seconds))
    return keys, z, len(keys) / fm_seconds if fm_seconds > 0 else float("inf")


def _store_exact(
    cfg: SimulationConfig,
    the_step: ReplayStep,
    state: PlannerState,
    plan: Any,
    keys: np.ndarray,
    z: np.ndarray,
    pairs_per_second: float,
) -> None:
    t0 = time.perf_counter()
    plan_keys = pair_keys(plan.pairs[USER_ID].to_numpy(), plan.pairs[ITEM_ID].to_numpy())
    rows = np.searchsorted(keys, plan_keys)
    state.exact.upsert(plan_keys, z[rows], np.full(len(plan_keys), the_step.now_s))
    # The aggregate reads a day of exact rows even after they stop being served.
    state.exact.prune(the_step.now_s - max(cfg.pair_ttl_seconds, cfg.aggregate.window_seconds))
    state.fm_pairs += len(plan_keys)
    state.add_seconds("fm", len(plan_keys) / pairs_per_second if len(plan_keys) else 0.0)
    state.add_seconds("store", time.perf_counter() - t0)


def _refresh_user_aggregate(
    run: ReplayRun, the_step: ReplayStep, state: PlannerState, exact: PairEmbeddings
) -> None:
    t0 = time.perf_counter()
    user_rows = aggregate_user_embeddings(exact, the_step.start, run.version, run.cfg.aggregate)
    if len(user_rows):
        state.user.upsert(
            user_rows[USER_ID].to_numpy(dtype=np.int64),
            np.stack(user_rows[EMBEDDING].to_numpy()),
            np.full(len(user_rows), the_step.now_s),
        )
    state.user.prune(the_step.now_s - run.cfg.user_ttl_seconds)
    state.add_seconds("aggregate", time.perf_counter() - t0)


def _refresh_similar(
    run: ReplayRun,
    the_step: ReplayStep,
    state: PlannerState,
    plan: Any,
    exact: PairEmbeddings,
    index_space: tuple[np.ndarray, np.ndarray],
) -> None:
    """Fill the best uncovered pairs and the queued misses from the nearest users in
    ``index_space`` ``(user ids (U,), vectors (U, d))``."""
    t0 = time.perf_counter()
    cfg = run.cfg
    n_targets = fill_target_count(len(plan), cfg.fill_targets_per_budget)
    targets = pd.concat(
        [plan.uncovered[[USER_ID, ITEM_ID]].head(n_targets), state.misses], ignore_index=True
    )
    index_users, index_vectors = index_space
    if len(targets) and len(index_users) > 1 and len(exact):
        index = build_user_index(index_users, index_vectors, cfg.similarity)
        fill = similarity_fill(
            index,
            targets,
            exact,
            the_step.start,
            run.version,
            cfg.pair_ttl_seconds,
            cfg.similarity,
        )
        if len(fill):
            state.similar.upsert(
                pair_keys(fill[USER_ID].to_numpy(), fill[ITEM_ID].to_numpy()),
                np.stack(fill[EMBEDDING].to_numpy()),
                np.full(len(fill), the_step.now_s),
            )
    state.similar.prune(the_step.now_s - cfg.similar_ttl_seconds)
    state.add_seconds("fill", time.perf_counter() - t0)


def _steps_per_budget(cfg: SimulationConfig) -> float:
    """Share of ``budget x candidates`` one step may compute (see ``budget_basis``)."""
    if cfg.budget_basis == "step":
        return 1.0
    return min(1.0, cfg.step_seconds / cfg.pair_ttl_seconds)


def _fm_user_vectors(
    bundle: ModelBundle, featurizer: PairFeaturizer, now: pd.Timestamp
) -> tuple[np.ndarray, np.ndarray]:
    """The FM's user-side vector ``(U, 2d)`` of every user as of ``now`` (item-independent)."""
    users = np.arange(bundle.schema.num_users, dtype=np.int64)
    out = []
    for lo in range(0, len(users), _INFERENCE_BATCH):
        part = users[lo : lo + _INFERENCE_BATCH]
        batch = featurizer.batch(part, np.zeros(len(part), dtype=np.int64), now)
        out.append(bundle.fm.user_representation(batch).numpy())
    return users, np.concatenate(out).astype(np.float32)


# -- serving ----------------------------------------------------------------------------------


def _served(
    the_step: ReplayStep,
    state: PlannerState,
    cfg: SimulationConfig,
    names: tuple[str, ...] = ABLATION_STEPS,
) -> dict[str, Resolution]:
    """What the VM is served for the step's requests with the tiers of each ablation step in
    ``names`` switched on, by the one tier rule (ages taken at the step start)."""
    users = the_step.requests[USER_ID].to_numpy(dtype=np.int64)
    items = the_step.requests[ITEM_ID].to_numpy(dtype=np.int64)
    stored: dict[Tier, TierValues] = state.stored_values(users, items)
    ttl = cfg.ttl_seconds_by_tier()
    return {
        name: resolve(
            {tier: stored[tier] for tier in ABLATION_TIERS[name]},
            now_s=the_step.now_s,
            ttl_seconds=ttl,
        )
        for name in names
    }


def _misses(the_step: ReplayStep, served: Resolution) -> pd.DataFrame:
    """Served pairs without a fresh exact embedding: the miss queue of the next step."""
    missed = the_step.requests.loc[served.tiers != int(Tier.EXACT), [USER_ID, ITEM_ID]]
    return missed.drop_duplicates().reset_index(drop=True)


def _serve_step(run: ReplayRun, the_step: ReplayStep) -> None:
    """Serve the step's requests in every replay: tuning rows during the tuning steps, NE and
    coverage once scoring starts, only the miss queue before."""
    k = the_step.index
    has_requests = len(the_step.requests) > 0
    if k in run.tuning_range and has_requests:
        _collect_tuning_rows(run, the_step)
    elif the_step.scored and has_requests:
        _score_served(run, the_step)
    else:
        for state in run.states:
            full = _served(the_step, state, run.cfg, (ABLATION_STEPS[-1],))
            state.misses = _misses(the_step, full[ABLATION_STEPS[-1]])
    if run.tuning_range and k == run.tuning_range[-1]:
        run.ne_vm = _tune_vm(run.bundle, run.tuning, run.cfg)
        run.tuning = []


def _collect_tuning_rows(run: ReplayRun, the_step: ReplayStep) -> None:
    requests = the_step.requests
    served: list[Resolution] = []
    for state in run.states:
        by_name = _served(the_step, state, run.cfg, (ABLATION_STEPS[0], ABLATION_STEPS[-1]))
        served.extend(by_name.values())
        state.misses = _misses(the_step, by_name[ABLATION_STEPS[-1]])
    # Each served impression enters the tuning set once, with the (z, tier) of one replay and
    # ablation step taken in turn: repeating it for every replay would fit the VM to these few
    # hours of impressions many times over.
    rows = np.arange(len(requests))
    pick = rows % len(served)
    z = np.stack([s.embeddings for s in served])[pick, rows]
    tiers = np.stack([s.tiers for s in served])[pick, rows].astype(np.int64)
    labels = requests[list(run.ds.label_columns)].to_numpy(dtype=np.float32)
    run.tuning.append((run.serve_featurizer.for_log(requests), z, tiers, labels))


def _score_served(run: ReplayRun, the_step: ReplayStep) -> None:
    """NE of the VM on what each replay serves, per ablation step, beside the VM without
    embedding and the FM; and one step through Feast, half way through the scored steps."""
    import torch

    cfg, requests = run.cfg, the_step.requests
    batch = run.serve_featurizer.for_log(requests)
    run.baselines["labels"].append(requests[run.ds.label_columns[0]].to_numpy(dtype=np.float64))
    run.baselines["vm_zero"].append(_vm_main(run.ne_vm, batch, None, None))
    run.baselines["fm"].append(_fm_main(run.bundle, batch))
    in_pool = np.isin(
        pair_keys(requests[USER_ID].to_numpy(), requests[ITEM_ID].to_numpy()),
        pair_keys(the_step.pool[USER_ID].to_numpy(), the_step.pool[ITEM_ID].to_numpy()),
    )
    run.candidate_recall.append(float(in_pool.mean()))
    check_step = run.first_scored + (run.total_steps - run.first_scored) // 2
    for state in run.states:
        served = _served(the_step, state, cfg)
        for name, got in served.items():
            tiers = got.tiers.astype(np.int64)
            probs = _vm_main(
                run.ne_vm, batch, torch.from_numpy(got.embeddings), torch.from_numpy(tiers)
            )
            state.probs.setdefault(name, []).append(probs)
            counts = np.bincount(tiers, minlength=len(Tier))
            state.tier_counts[name] = (
                state.tier_counts.get(name, np.zeros(len(Tier), np.int64)) + counts
            )
        state.served += len(requests)
        state.misses = _misses(the_step, served[ABLATION_STEPS[-1]])
        if (
            cfg.feast_check
            and run.feast_check is None
            and the_step.index >= check_step
            and state.planner == cfg.planners[0]
        ):
            run.feast_check = check_against_feast(
                the_step.index,
                the_step.start,
                requests,
                served[ABLATION_STEPS[-1]].tiers,
                state,
                cfg,
                run.version,
            )


def _tune_vm(
    bundle: ModelBundle,
    rows: list[_TuningRows],
    cfg: SimulationConfig,
) -> Any:
    """A copy of the registered VM whose tier embedding and MLP are fine-tuned on served
    ``(features, z, tier, labels)`` rows, so its trust in each tier matches what this replay's
    stores serve."""
    import copy
    from dataclasses import fields

    import torch

    from solaris_feast.models.features import PairBatch
    from solaris_feast.models.training import TrainConfig, train_vertical

    vm = copy.deepcopy(bundle.vm)
    if not rows:
        return vm
    # Only the tier embedding and the MLP move: the id and attribute embeddings keep what the
    # training period taught them instead of memorizing a few hours of impressions.
    for name, parameter in vm.named_parameters():
        parameter.requires_grad_(name.startswith(("tier.", "tier_readings.", "mlp.")))
    batch = PairBatch(
        **{f.name: torch.cat([getattr(r[0], f.name) for r in rows]) for f in fields(PairBatch)}
    )
    z = torch.from_numpy(np.concatenate([r[1] for r in rows]))
    tier = torch.from_numpy(np.concatenate([r[2] for r in rows]))
    labels = torch.from_numpy(np.concatenate([r[3] for r in rows]))
    with torch.enable_grad():
        train_vertical(
            vm,
            batch,
            labels,
            TrainConfig(
                epochs=cfg.ne_tuning_epochs,
                batch_size=256,
                learning_rate=cfg.ne_tuning_learning_rate,
                seed=cfg.seed,
            ),
            z=z,
            tier=tier,
        )
    vm.eval()
    logger.info("NE VM tuned on %d served rows", len(labels))
    return vm


def _vm_main(vm: Any, batch: Any, z: Any, tier: Any) -> np.ndarray:
    out = []
    for lo in range(0, len(batch), _INFERENCE_BATCH):
        sl = slice(lo, lo + _INFERENCE_BATCH)
        part = batch.select(sl)
        probs = vm.predict_proba(
            part, None if z is None else z[sl], None if tier is None else tier[sl]
        )
        out.append(probs[:, 0].numpy().astype(np.float64))
    return np.concatenate(out) if out else np.zeros(0)


def _fm_main(bundle: ModelBundle, batch: Any) -> np.ndarray:
    import torch

    out = []
    for lo in range(0, len(batch), _INFERENCE_BATCH):
        part = batch.select(slice(lo, lo + _INFERENCE_BATCH))
        out.append(torch.sigmoid(bundle.fm(part))[:, 0].numpy().astype(np.float64))
    return np.concatenate(out) if out else np.zeros(0)


LOG_WORLD_OPTIONS = (
    "dataset",
    "size",
    "budget_basis",
    "steps",
    "warmup",
    "feast_check",
    "config_file",
)
FUNNEL_WORLD_OPTIONS = ("workers",)


def _note_options_of_the_other_world(world: str) -> None:
    """Say which options given on the command line the chosen world does not read (the funnel
    has its own world and schedule; the log replay runs once on its log)."""
    # typer's own vendored click: the context of the running command is one of its objects.
    from typer._click.core import ParameterSource
    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    if ctx is None or world not in ("log", "funnel"):
        return
    ignored = LOG_WORLD_OPTIONS if world == "funnel" else FUNNEL_WORLD_OPTIONS
    given = [
        name for name in ignored if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE
    ]
    if given:
        options = ", ".join("--" + name.replace("_", "-") for name in given)
        typer.echo(f"note: --world {world} does not use {options}", err=True)


FUNNEL_DEFAULT_SEEDS = 5
"""Seeds of a funnel run without ``--seeds`` (the issue's minimum for intervals)."""

ROUND_LOGGERS = ("solaris_feast.precompute", "solaris_feast.store", "solaris_feast.serving")
"""The stages a replay runs once per simulated round: their INFO lines (one per plan,
aggregation, fill) are a DAG task's log, and over hundreds of rounds a flood on a console."""


def quiet_per_round_logs() -> None:
    """Warnings only from :data:`ROUND_LOGGERS`, unless ``solaris --verbose`` asked for debug."""
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        for name in ROUND_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


def parse_floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise typer.BadParameter(
            f"expected comma-separated numbers, got {text!r}", param_hint="--budget"
        ) from exc
    if not values or any(not 0 < v <= 1 for v in values):
        raise typer.BadParameter(f"budgets must lie in (0, 1], got {text!r}", param_hint="--budget")
    if len(set(values)) != len(values):
        raise typer.BadParameter(f"budgets must not repeat, got {text!r}", param_hint="--budget")
    return values


def _parse_planners(text: str) -> tuple[PlannerName, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = [n for n in names if n not in ALL_PLANNERS]
    if unknown or not names:
        raise typer.BadParameter(
            f"unknown planners {unknown}; choose from {', '.join(ALL_PLANNERS)}",
            param_hint="--planner",
        )
    return names  # type: ignore[return-value]


def simulate_command(
    world: Annotated[
        str,
        typer.Option(
            "--world",
            help="log: replay a recorded log; funnel: the closed-loop funnel world (issue 13).",
        ),
    ] = "log",
    seeds: Annotated[
        int | None,
        typer.Option(
            "--seeds",
            min=1,
            help="Seeds --seed .. --seed + seeds - 1. Funnel: its worlds (default 5). Log: "
            "the synthetic data and the models (MovieLens or --config: the models); default 1; "
            "more report means with 95% intervals.",
        ),
    ] = None,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Processes running funnel seeds.")
    ] = 1,
    progress: Annotated[bool, typer.Option(help="Progress bars.")] = True,
    dataset: Annotated[
        str, typer.Option("--dataset", help="synthetic or movielens.")
    ] = "synthetic",
    size: Annotated[
        str, typer.Option("--size", help="Synthetic preset; for movielens 100k or 1m.")
    ] = "demo",
    budget: Annotated[
        str, typer.Option("--budget", help="FM budgets, share of candidate pairs.")
    ] = "0.05,0.1,0.2,0.4",
    budget_basis: Annotated[
        str,
        typer.Option(
            "--budget-basis",
            help="step: share of candidates computed per step; pair_ttl: share kept fresh.",
        ),
    ] = "step",
    planner: Annotated[
        str,
        typer.Option(
            "--planner",
            help="Comma-separated planners. log: verifier, random, popular, oracle, vm_only, "
            "retrieval; funnel: verifier, random, popular, retrieval, early_stage, "
            "request_model, oracle.",
        ),
    ] = "verifier,random,popular,oracle",
    steps: Annotated[int, typer.Option("--steps", min=1, help="Scored replay steps.")] = 24,
    warmup: Annotated[
        int,
        typer.Option(
            "--warmup",
            min=0,
            help="Unscored warm-up steps. log: 6 more unscored steps follow them, whose served "
            "pairs tune the VM that scores NE (replay_config.ne_tuning_steps).",
        ),
    ] = 6,
    seed: Annotated[
        int,
        typer.Option(
            "--seed",
            min=0,
            help="log: the seed of the data and the models; funnel: the first of --seeds seeds.",
        ),
    ] = 0,
    feast_check: Annotated[
        bool, typer.Option(help="Replay one step through the Feast writer and retriever.")
    ] = True,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the records here.")
    ] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="PNG of coverage and NE.")] = None,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="Replay the log of this solaris config (its log section: your own log, columns "
            "and id space) instead of --dataset; --world log only.",
        ),
    ] = None,
    fm_rows: Annotated[
        str,
        typer.Option(
            "--fm-rows",
            help="The VM's training tier for the rows its FM trained on: zero (default) or "
            "own_tier (a training-only tier; see TierMix.fm_rows).",
        ),
    ] = "zero",
    return_weight_exponent: Annotated[
        float,
        typer.Option(
            "--return-weight",
            min=0.0,
            help="Exponent of the verifier's user weight, (expected returns / the most) ** this "
            "(the precompute's default); 0: every user alike (the planner before the weight).",
        ),
    ] = DEFAULT_RETURN_WEIGHT_EXPONENT,
    fill_targets: Annotated[
        float,
        typer.Option(
            "--fill-targets",
            min=0.0,
            help="Similarity-fill targets per round, as a multiple of the pairs the round "
            "planned (best uncovered pairs first, besides the queued misses); 0: the misses only.",
        ),
    ] = DEFAULT_FILL_TARGETS_PER_BUDGET,
) -> None:
    """Replay the log hour by hour: coverage and NE per planner and budget.

    ``--world funnel`` runs the closed-loop funnel world instead
    (:mod:`solaris_feast.evaluation.funnel`), with its own planners and ``--seeds``.
    """
    if fm_rows not in get_args(FmRowsTier):
        raise typer.BadParameter(
            f"--fm-rows must be one of {get_args(FmRowsTier)}, got {fm_rows!r}"
        )
    from solaris_feast.console import PLOT_SUFFIXES, check_output_path

    check_output_path(json_path, "--json")
    check_output_path(plot, "--plot", PLOT_SUFFIXES)
    quiet_per_round_logs()
    _note_options_of_the_other_world(world)
    if world == "funnel":
        from solaris_feast.evaluation.funnel import run_funnel_command

        run_funnel_command(
            budget,
            planner,
            list(range(seed, seed + (seeds or FUNNEL_DEFAULT_SEEDS))),
            json_path,
            plot,
            workers,
            cast(FmRowsTier, fm_rows),
            progress,
            return_weight_exponent,
            fill_targets,
        )
        return
    if world != "log":
        raise typer.BadParameter(f"--world must be log or funnel, got {world!r}")

    if dataset not in ("synthetic", "movielens"):
        raise typer.BadParameter(f"--dataset must be synthetic or movielens, got {dataset!r}")
    if budget_basis not in ("pair_ttl", "step"):
        raise typer.BadParameter(f"--budget-basis must be pair_ttl or step, got {budget_basis!r}")
    config = SimulationConfig(
        dataset=dataset,
        size=size,
        budgets=parse_floats(budget),
        budget_basis=budget_basis,
        planners=_parse_planners(planner),
        max_steps=steps,
        warmup_steps=warmup,
        seed=seed,
        feast_check=feast_check,
        fm_rows_tier=cast(FmRowsTier, fm_rows),
        return_weight_exponent=return_weight_exponent,
        fill_targets_per_budget=fill_targets,
    )
    from solaris_feast.progress import stage_bars

    own = load_configured_log(config_file) if config_file else None
    seed_list = list(range(seed, seed + (seeds or 1)))
    runs = []
    for at, this_seed in enumerate(seed_list):
        if len(seed_list) > 1:
            typer.echo(f"seed {this_seed} ({at + 1} of {len(seed_list)})", err=True)
        with stage_bars(progress) as bars:
            runs.append(
                simulate(config.model_copy(update={"seed": this_seed}), progress=bars, dataset=own)
            )
    records = runs[0] if len(runs) == 1 else combine_seeds(runs, seed_list)
    typer.echo(format_summary(records))  # before the files: a failed write keeps the table
    for record in records:
        # What produced the file: a one-seed run's records name their seed too.
        record["settings"] = {
            "dataset": dataset,
            "size": size,
            "seeds": seed_list,
            "steps": steps,
            "warmup": warmup,
            "budget_basis": budget_basis,
            "config": str(config_file) if config_file else None,
        }
    write_report(records, json_path, plot)
    for record in records:
        if "feast_check" in record:
            typer.echo(f"feast check: {json.dumps(record['feast_check'])}")
    if json_path is not None:
        typer.echo(f"JSON: {json_path}")
    if plot is not None:
        typer.echo(f"plot: {plot}")
