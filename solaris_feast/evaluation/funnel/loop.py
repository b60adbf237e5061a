"""The closed loop of one seed: the world's traffic through the funnel, hourly precompute
rounds, and every planner's store served to the final stage by the one tier rule.

Per slice of world time (all requests of a slice see the log before the slice starts):

1. **retrieval**: the product's candidate generator
   (:func:`~solaris_feast.precompute.candidates.generate_candidates`) over the log so far, N
   items per requesting user (users with no history get the recently popular items);
2. **early stage**: the two-tower ranker (:mod:`.early_stage`, retrained on the shown traffic
   every ``early_stage_retrain_hours``) keeps K;
3. **final stage**: the VM ranks the K and the top k are shown; the world answers them from its
   ground truth (:mod:`.world`), and the log grows with them.

The logged arm, the one whose shown items drive the world, is the VM *without* ``z``: it does
not depend on any planner, so every planner plans for, and is judged on, the same final-stage
sets. Every (planner, budget) arm then ranks the same K with the ``z`` its own store serves
(:func:`~solaris_feast.serving.resolve.resolve` over the in-memory
:class:`~solaris_feast.evaluation.replay_state.PlannerState`, at the slice's time) and is scored
on the ground truth of what it would show: expected clicks and conversions (the sum of the true
probabilities of its top k), and labels drawn with common random numbers per (request,
position) for NE. The FM ranking the same K is the ceiling.

Per hour, before the hour's traffic: the precompute round of the replay
(:func:`~solaris_feast.evaluation.replay.precompute_step`: the product's
:func:`~solaris_feast.precompute.plan.plan_precompute` per arm, the FM once per planned pair,
the user aggregate and the similarity fill) over the pool the replay builds
(``score_pool``: candidates for every user active in the last week plus the arm's miss queue),
with the early-stage score and the request model (:mod:`.request_model`, fitted on the logged
funnel traffic of earlier hours) added as planners. Only the oracle reads the hour's final-stage
sets.
The chain (FM, compressor, VM) is trained on the log at the end of the warm-up and retrained
every ``chain_retrain_hours``; a retrain changes the embedding space, so every store restarts
empty, as a model change re-plans everything in the product.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from solaris_feast.data.schema import EVENT_TIMESTAMP, ITEM_ID, USER_ID, InteractionDataset
from solaris_feast.evaluation.funnel.early_stage import TwoTower, train_two_tower
from solaris_feast.evaluation.funnel.request_model import (
    FunnelTrafficLog,
    RequestModel,
    RequestModelConfig,
    RequestModelVerifier,
    train_request_model,
)
from solaris_feast.evaluation.funnel.world import FunnelWorldConfig, World
from solaris_feast.evaluation.replay import ReplayRun, ReplayStep, precompute_step, score_pool
from solaris_feast.evaluation.replay_config import (
    ABLATION_STEPS,
    ABLATION_TIERS,
    PlannerName,
    SimulationConfig,
)
from solaris_feast.evaluation.replay_state import PlannerState
from solaris_feast.keys import rank_within_runs
from solaris_feast.precompute.candidates import (
    CANDIDATE_SCORE,
    CandidateConfig,
    generate_candidates,
)
from solaris_feast.serving.resolve import resolve
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from solaris_feast.models.registry import ModelBundle

logger = logging.getLogger(__name__)

FUNNEL_PLANNERS: tuple[str, ...] = (
    "verifier",
    "random",
    "popular",
    "retrieval",
    "early_stage",
    "request_model",
    "oracle",
)
"""Planners of the funnel world: the replay's, plus the early-stage ranker's score and the
request model (:mod:`.request_model`, a verifier learned from the funnel's logs)."""
LABELS = ("click", "conversion")

RoundObserver = Callable[[int, Any, list[PlannerState]], None]
"""``(hour, the round's step with its scored pool, every arm's state)``, called after each
precompute round (tests read the plans and stores from it)."""


class FunnelConfig(BaseModel):
    """One funnel simulation (defaults and their reasons in :mod:`.world` and here)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    world: FunnelWorldConfig = FunnelWorldConfig()
    """The users, items and their dynamics."""
    retrieval_candidates: int = Field(100, gt=0)
    """N retrieved per request (the issue's 500 scaled to 400 items)."""
    final_stage: int = Field(20, gt=0)
    """K the early stage passes to the VM (a fifth of N, as 50 of 500 would be a tenth)."""
    shown: int = Field(4, gt=0)
    """k shown per request (a screen)."""
    warmup_hours: int = Field(24, gt=0)
    """Traffic before the chain is first trained: a day, so the VM has a day of history."""
    early_stage_first_hour: int = Field(4, ge=0)
    """Before this hour the early stage is the retrieval score (no traffic to learn from)."""
    early_stage_retrain_hours: int = Field(6, gt=0)
    """How often the two-tower refits on the log so far."""
    early_stage_dim: int = Field(16, gt=0)
    """Two-tower width; smaller agrees less with the VM."""
    early_stage_epochs: int = Field(4, gt=0)
    """Passes over the log per refit."""
    request_model: RequestModelConfig = RequestModelConfig()
    """The ``request_model`` planner's fit; it refits when the chain trains and on the early
    stage's schedule after that (it needs the VM's score, so not before the first chain)."""
    chain_retrain_hours: int = Field(24, ge=0)
    """How often the FM, compressor and VM retrain on their own traffic (0: never)."""
    unscored_hours: int = Field(2, ge=0)
    """Precompute rounds after a training before scoring starts (stores fill up)."""
    scored_hours: int = Field(12, gt=0)
    """Hours scored: half a day of rounds, what five seeds cost on a shared 2-core machine in
    about fifteen minutes. With the warm-up this ends before the first chain retrain."""
    fm_epochs: int | None = Field(None, gt=0)
    """Override the FM's epochs (tests)."""
    precompute: SimulationConfig = SimulationConfig(
        budgets=(0.05, 0.1, 0.2),
        candidates=CandidateConfig(candidates_per_user=100, category_column="category"),
        compare_similarity_spaces=False,
        feast_check=False,
        ne_vm="registered",
        warmup_steps=0,
    )
    """Planning, TTLs, aggregate and fill, as the replay runs them; ``budgets`` are shares of
    the pool's candidate pairs per hourly round (``budget_basis="step"``)."""
    planners: tuple[str, ...] = FUNNEL_PLANNERS
    """Planners to compare."""

    @property
    def hours(self) -> int:
        return self.warmup_hours + self.unscored_hours + self.scored_hours

    def first_scored_hour(self) -> int:
        return self.warmup_hours + self.unscored_hours


@dataclass
class ArmTotals:
    """What one (planner, budget) arm served and would have shown over the scored hours."""

    tier_counts: np.ndarray = field(default_factory=lambda: np.zeros(len(Tier), np.int64))
    clicks: dict[str, float] = field(default_factory=dict)
    hourly_clicks: list[float] = field(default_factory=list)
    """Expected clicks with served ``z`` (all tiers) per scored hour, for the uplift's
    within-seed spread."""
    conversions: dict[str, float] = field(default_factory=dict)
    probs: dict[str, list[np.ndarray]] = field(default_factory=dict)
    labels: dict[str, list[np.ndarray]] = field(default_factory=dict)
    """Per ablation step, the VM's click probabilities and the labels of what it showed."""
    final_stage_probs: dict[str, list[np.ndarray]] = field(default_factory=dict)
    """Per ablation step, the VM's click probabilities on every final-stage pair: the same pairs
    and labels for every step and arm, so NE compares paired (what is shown differs)."""
    final_stage_labels: list[np.ndarray] = field(default_factory=list)
    fm_pairs_at_start: int = 0


@dataclass
class SeedOutcome:
    """Per-arm totals of one seed and the arm-independent baselines."""

    seed: int
    arms: dict[str, ArmTotals]
    states: dict[str, PlannerState]
    requests: int = 0
    final_stage_pairs: int = 0
    clicks_without_z: float = 0.0
    conversions_without_z: float = 0.0
    clicks_fm: float = 0.0
    conversions_fm: float = 0.0
    hourly_requests: list[int] = field(default_factory=list)
    hourly_clicks_without_z: list[float] = field(default_factory=list)
    """Per scored hour, beside :attr:`ArmTotals.hourly_clicks`."""
    early_vm_agreement: list[float] = field(default_factory=list)
    """Per scored slice: share of the VM's top k (over the N retrieved) the early stage kept."""
    chain_trainings: list[tuple[int, str]] = field(default_factory=list)
    """``(hour, embedding version)`` of every chain training on the world's own traffic."""


@dataclass
class _SliceRecord:
    """The final-stage lists of one slice, kept to score every arm after the round."""

    now: pd.Timestamp
    users: np.ndarray
    """``(R*K,)`` user of each final-stage pair, request-major, K per request."""
    items: np.ndarray
    batch: Any
    click_p: np.ndarray
    conversion_p: np.ndarray
    labels: np.ndarray
    """``(R*K, 2)`` labels each pair would get if shown (common random numbers)."""
    requests: int


def _arm_name(planner: str, budget: float) -> str:
    return f"{planner}@{budget}"


def run_seed(
    config: FunnelConfig,
    seed: int,
    *,
    world: World | None = None,
    observer: RoundObserver | None = None,
    hour_done: Callable[[int], None] | None = None,
) -> SeedOutcome:
    """Run one seed of the world end to end (``world``: a prepared one, for the leakage test;
    ``hour_done(hour)``: called after each simulated hour, for a progress bar)."""
    import torch

    cfg = config
    world = world if world is not None else World(cfg.world, seed, cfg.hours)
    pcfg = cfg.precompute.model_copy(update={"seed": seed})
    candidate_cfg = pcfg.candidates.model_copy(
        update={"candidates_per_user": cfg.retrieval_candidates}
    )
    outcome = SeedOutcome(seed=seed, arms={}, states={})
    log_parts: list[pd.DataFrame] = []
    last_click = np.full(cfg.world.num_users, -1, dtype=np.int64)
    two_tower: TwoTower | None = None
    run: ReplayRun | None = None
    traffic = FunnelTrafficLog()
    request_model: RequestModel | None = None
    wants_request_model = "request_model" in cfg.planners
    grad, threads = torch.is_grad_enabled(), torch.get_num_threads()
    torch.set_grad_enabled(False)
    # The loop's tensors are small (tens to thousands of rows): with intra-op threads on a
    # shared machine, torch spins waiting for them (measured: index_add of 200 rows 27 ms with
    # 2 threads against 0.006 ms with 1), so the loop runs single-threaded.
    torch.set_num_threads(1)
    try:
        for hour in range(cfg.hours):
            start = world.slice_time(hour * world.slices_per_hour)
            log = _log(log_parts)
            if (
                hour >= cfg.early_stage_first_hour
                and len(log)
                and (
                    two_tower is None
                    or (hour - cfg.early_stage_first_hour) % cfg.early_stage_retrain_hours == 0
                )
            ):
                two_tower = train_two_tower(
                    log,
                    cfg.world.num_users,
                    cfg.world.num_items,
                    world.item_category,
                    dim=cfg.early_stage_dim,
                    epochs=cfg.early_stage_epochs,
                    seed=seed * 1000 + hour,
                )
            if hour == cfg.warmup_hours or (
                run is not None
                and cfg.chain_retrain_hours
                and (hour - cfg.warmup_hours) % cfg.chain_retrain_hours == 0
            ):
                bundle = _train_chain(_dataset(world, log), cfg, seed)
                outcome.chain_trainings.append((hour, bundle.embedding_version))
                run = _new_run(cfg, pcfg, world, log, bundle, candidate_cfg, outcome, hour)
                request_model = None  # its VM feature came from the old chain
            if (
                wants_request_model
                and run is not None
                and (
                    request_model is None
                    or (hour - cfg.early_stage_first_hour) % cfg.early_stage_retrain_hours == 0
                )
            ):
                request_model = _train_request_model(
                    cfg, world, run, traffic, log, start, seed, hour
                )
            scored = hour >= cfg.first_scored_hour()
            if scored and not outcome.arms:
                outcome.arms = {
                    name: ArmTotals(fm_pairs_at_start=s.fm_pairs)
                    for name, s in outcome.states.items()
                }
            # The round's inputs are cut at the hour start, before the hour is simulated.
            past = log
            pool_candidates = (
                generate_candidates(past, start, candidate_cfg, items=world.item_table())
                if (run is not None or wants_request_model) and len(past)
                else None
            )
            if wants_request_model and pool_candidates is not None:
                # Retrieval's output at the hour start is logged, as production logs it: the
                # request model learns which of these pairs went on to reach the final stage.
                traffic.log_candidates(_seconds(start), pool_candidates)
            clicks_before, requests_before = outcome.clicks_without_z, outcome.requests
            records = _simulate_hour(
                cfg,
                world,
                hour,
                log_parts,
                last_click,
                two_tower,
                run,
                candidate_cfg,
                outcome,
                scored,
                traffic,
            )
            if run is None or pool_candidates is None:
                if hour_done is not None:
                    hour_done(hour)
                continue
            step = _round(
                run, hour, start, past, pool_candidates, records, two_tower, request_model, traffic
            )
            precompute_step(run, step)
            if observer is not None:
                observer(hour, step, run.states)
            _serve_arms(run, records, outcome, scored, cfg.shown)
            if scored:
                outcome.hourly_requests.append(outcome.requests - requests_before)
                outcome.hourly_clicks_without_z.append(outcome.clicks_without_z - clicks_before)
            if hour_done is not None:
                hour_done(hour)
    finally:
        torch.set_grad_enabled(grad)
        torch.set_num_threads(threads)
    return outcome


def _seconds(at: pd.Timestamp) -> int:
    return int(at.value // 10**9)


def _train_request_model(
    cfg: FunnelConfig,
    world: World,
    run: ReplayRun,
    traffic: FunnelTrafficLog,
    log: pd.DataFrame,
    start: pd.Timestamp,
    seed: int,
    hour: int,
) -> RequestModel | None:
    """The request model fitted on the traffic logged before ``start``; its VM feature is the
    serving VM's score as of each logged hour (history before that hour)."""
    from solaris_feast.models.features import PairFeaturizer
    from solaris_feast.models.interface import ReferenceVerifier

    ds = _dataset(world, log)
    base = ReferenceVerifier(
        run.bundle.vm, featurizer=PairFeaturizer(ds, run.bundle.schema.history_len)
    )
    return train_request_model(
        traffic,
        start,
        base,
        ds,
        cfg.world.num_users,
        cfg.world.num_items,
        config=cfg.request_model,
        seed=seed * 1000 + hour,
    )


def _log(parts: list[pd.DataFrame]) -> pd.DataFrame:
    if not parts:
        return pd.DataFrame(
            {
                USER_ID: np.zeros(0, np.int64),
                ITEM_ID: np.zeros(0, np.int64),
                EVENT_TIMESTAMP: pd.Series([], dtype="datetime64[ns, UTC]"),
                "click": np.zeros(0, np.int64),
                "conversion": np.zeros(0, np.int64),
            }
        )
    if len(parts) > 1:
        parts[:] = [pd.concat(parts, ignore_index=True)]
    return parts[0]


def _dataset(world: World, log: pd.DataFrame) -> InteractionDataset:
    return InteractionDataset(
        name="funnel",
        interactions=log,
        users=world.user_table(),
        items=world.item_table(),
        label_columns=LABELS,
        num_users=world.config.num_users,
        num_items=world.config.num_items,
        user_categorical=("segment",),
        item_categorical=("category",),
    )


def _train_chain(ds: InteractionDataset, cfg: FunnelConfig, seed: int) -> ModelBundle:
    from solaris_feast.models.chain import simulation_training, train_and_register

    training = simulation_training(seed, cfg.fm_epochs, cfg.precompute.fm_rows_tier)
    import torch

    # The loop runs with gradients off; training turns them back on for itself.
    with tempfile.TemporaryDirectory(prefix="solaris-funnel-") as tmp, torch.enable_grad():
        return train_and_register(ds, Path(tmp), training)


def _new_run(
    cfg: FunnelConfig,
    pcfg: SimulationConfig,
    world: World,
    log: pd.DataFrame,
    bundle: ModelBundle,
    candidate_cfg: CandidateConfig,
    outcome: SeedOutcome,
    hour: int,
) -> ReplayRun:
    """Fresh stores for every arm under a new chain (its embedding space is new); the counters
    of an arm carry over."""
    from solaris_feast.models.features import PairFeaturizer

    ds = _dataset(world, log)
    dim = int(bundle.vm.config.embedding_dim)
    states = []
    for planner in cfg.planners:
        for budget in pcfg.budgets:
            state = PlannerState(cast(PlannerName, planner), budget, pcfg.similarity_space, dim)
            name = _arm_name(planner, budget)
            if name in outcome.states:
                state.fm_pairs = outcome.states[name].fm_pairs
            outcome.states[name] = state
            states.append(state)
    return ReplayRun(
        cfg=pcfg,
        ds=ds,
        bundle=bundle,
        candidate_cfg=candidate_cfg,
        serve_featurizer=PairFeaturizer(ds, bundle.schema.history_len),
        states=states,
        total_steps=cfg.hours,
        first_scored=hour,
        ne_vm=bundle.vm,
    )


def _retrieve(
    world: World,
    log: pd.DataFrame,
    now: pd.Timestamp,
    users: np.ndarray,
    candidate_cfg: CandidateConfig,
    slice_index: int,
) -> pd.DataFrame:
    """N candidates per requesting user: the candidate generator's, padded with random items
    (score 0) up to N. The generator only knows items the log holds; without the exploration
    slice a closed loop shows the first few items it ever showed, for ever."""
    wanted = np.unique(users)
    n = min(candidate_cfg.candidates_per_user, world.config.num_items)
    if len(log):
        got = generate_candidates(log, now, candidate_cfg, items=world.item_table(), users=wanted)[
            [USER_ID, ITEM_ID, CANDIDATE_SCORE]
        ]
    else:
        got = pd.DataFrame(
            {
                USER_ID: np.zeros(0, np.int64),
                ITEM_ID: np.zeros(0, np.int64),
                CANDIDATE_SCORE: np.zeros(0, np.float32),
            }
        )
    rng = np.random.default_rng([world.seed, slice_index, 5])
    have = got.groupby(USER_ID)[ITEM_ID].apply(set).to_dict()
    extra_users, extra_items = [], []
    for user in wanted:
        own = have.get(int(user), set())
        short = n - len(own)
        if short <= 0:
            continue
        fresh = rng.permutation(world.config.num_items)
        fresh = fresh[~np.isin(fresh, list(own))][:short]
        extra_users.append(np.full(len(fresh), user, dtype=np.int64))
        extra_items.append(fresh.astype(np.int64))
    if extra_users:
        extra = pd.DataFrame(
            {
                USER_ID: np.concatenate(extra_users),
                ITEM_ID: np.concatenate(extra_items),
                CANDIDATE_SCORE: np.zeros(sum(len(u) for u in extra_users), np.float32),
            }
        )
        got = pd.concat([got, extra], ignore_index=True)
    return got


def _top_per_user(users: np.ndarray, score: np.ndarray, k: int) -> np.ndarray:
    """Row indices of the ``k`` best scores of each user (rows grouped by user), best first."""
    order = np.lexsort((-score, users))
    return order[rank_within_runs(users[order]) < k]


def _simulate_hour(
    cfg: FunnelConfig,
    world: World,
    hour: int,
    log_parts: list[pd.DataFrame],
    last_click: np.ndarray,
    two_tower: TwoTower | None,
    run: ReplayRun | None,
    candidate_cfg: CandidateConfig,
    outcome: SeedOutcome,
    scored: bool,
    traffic: FunnelTrafficLog,
) -> list[_SliceRecord]:
    """The hour's traffic through the funnel, shown by the VM without ``z`` (the logged arm)."""
    from solaris_feast.models.features import PairFeaturizer

    records: list[_SliceRecord] = []
    k_final, k_shown = cfg.final_stage, cfg.shown
    for s in range(hour * world.slices_per_hour, (hour + 1) * world.slices_per_hour):
        req = world.requests_in(s)
        if len(req.user_ids) == 0:
            continue
        now = world.slice_time(s)
        log = _log(log_parts)
        cands = _retrieve(world, log, now, req.user_ids, candidate_cfg, s)
        cu, ci = cands[USER_ID].to_numpy(np.int64), cands[ITEM_ID].to_numpy(np.int64)
        retrieval = cands[CANDIDATE_SCORE].to_numpy(np.float64)
        early = two_tower.score(cu, ci) if two_tower is not None else retrieval
        keep = _top_per_user(cu, early, k_final)
        # Request-major lists: the requests of this slice in order, K pairs each.
        by_user = {int(u): keep[cu[keep] == u] for u in np.unique(req.user_ids)}
        rows = np.concatenate([by_user[int(u)] for u in req.user_ids])
        counts = np.array([len(by_user[int(u)]) for u in req.user_ids])
        users, items = cu[rows], ci[rows]
        traffic.log_slice(_seconds(now), req.user_ids, users, items)
        request_of = np.repeat(req.request_ids, counts)
        position = np.concatenate([np.arange(c) for c in counts])
        click_p, conv_p = world.probabilities(
            users, items, world.hour_of_slice(s), last_click[users]
        )
        u = world.label_uniforms(request_of, position)
        click = (u[:, 0] < click_p).astype(np.int64)
        conversion = (click == 1) & (u[:, 1] < conv_p / np.maximum(click_p, 1e-12))
        labels = np.stack([click, conversion.astype(np.int64)], axis=1)
        batch = None
        if run is not None:
            featurizer = PairFeaturizer(_dataset(world, log), run.bundle.schema.history_len)
            batch = featurizer.batch(users, items, now)
            final_score = run.bundle.vm.verifier_score(batch).numpy().astype(np.float64)
        else:
            final_score = early[rows]
        shown = _top_per_user(request_of, final_score, k_shown)
        if scored and run is not None:
            outcome.requests += len(req.user_ids)
            outcome.final_stage_pairs += len(rows)
            outcome.clicks_without_z += float(click_p[shown].sum())
            outcome.conversions_without_z += float(conv_p[shown].sum())
            fm = _fm_scores(run.bundle, batch)
            best = _top_per_user(request_of, fm, k_shown)
            outcome.clicks_fm += float(click_p[best].sum())
            outcome.conversions_fm += float(conv_p[best].sum())
            outcome.early_vm_agreement.append(
                _agreement(cu, ci, early, run, featurizer, now, k_final, k_shown)
            )
            records.append(
                _SliceRecord(now, users, items, batch, click_p, conv_p, labels, len(req.user_ids))
            )
        elif run is not None:
            records.append(
                _SliceRecord(now, users, items, batch, click_p, conv_p, labels, len(req.user_ids))
            )
        shown_frame = pd.DataFrame(
            {
                USER_ID: users[shown],
                ITEM_ID: items[shown],
                EVENT_TIMESTAMP: pd.Series([now] * len(shown), dtype="datetime64[ns, UTC]"),
                "click": labels[shown, 0],
                "conversion": labels[shown, 1],
            }
        )
        log_parts.append(shown_frame)
        clicked = shown[labels[shown, 0] == 1]
        # The best-placed click of a screen is what the user moves on from.
        last_click[users[clicked[::-1]]] = items[clicked[::-1]]
    return records


def _agreement(
    cu: np.ndarray,
    ci: np.ndarray,
    early: np.ndarray,
    run: ReplayRun,
    featurizer: Any,
    now: pd.Timestamp,
    k_final: int,
    k_shown: int,
) -> float:
    """Share of the VM's own top k over all N retrieved items that the early stage keeps in
    its K: how often the two stages agree."""
    vm = run.bundle.vm.verifier_score(featurizer.batch(cu, ci, now)).numpy().astype(np.float64)
    vm_top = _top_per_user(cu, vm, k_shown)
    kept = np.zeros(len(cu), dtype=bool)
    kept[_top_per_user(cu, early, k_final)] = True
    return float(kept[vm_top].mean()) if len(vm_top) else float("nan")


def _fm_scores(bundle: ModelBundle, batch: Any) -> np.ndarray:
    import torch

    return torch.sigmoid(bundle.fm(batch))[:, 0].numpy().astype(np.float64)


def _round(
    run: ReplayRun,
    hour: int,
    start: pd.Timestamp,
    past: pd.DataFrame,
    candidates: pd.DataFrame,
    records: list[_SliceRecord],
    two_tower: TwoTower | None,
    request_model: RequestModel | None = None,
    traffic: FunnelTrafficLog | None = None,
) -> ReplayStep:
    """The hour's precompute round over the replay's pool, cut at ``start``; the oracle alone
    reads the hour's final-stage pairs. The request model is called as any deployment's own
    verifier is, through the Verifier protocol (``score(pairs)``), each answer checked."""
    from solaris_feast.models.features import PairFeaturizer
    from solaris_feast.models.interface import PairsAsOf, ReferenceVerifier, score_in_chunks

    featurizer = PairFeaturizer(run.ds.with_interactions(past), run.bundle.schema.history_len)
    requests = pd.DataFrame(
        {
            USER_ID: np.concatenate([r.users for r in records])
            if records
            else np.zeros(0, np.int64),
            ITEM_ID: np.concatenate([r.items for r in records])
            if records
            else np.zeros(0, np.int64),
        }
    ).drop_duplicates()

    def early_stage(users: np.ndarray, items: np.ndarray) -> dict[str, np.ndarray]:
        out = {
            "early_stage": np.zeros(len(users))
            if two_tower is None
            else two_tower.score(users, items)
        }
        if request_model is not None and traffic is not None:
            verifier = RequestModelVerifier(
                request_model,
                traffic,
                ReferenceVerifier(run.bundle.vm, featurizer=featurizer),
                candidates,
            )
            pairs = PairsAsOf.of(users, items, start, run.ds.with_interactions(past))
            out["request_model"] = score_in_chunks(verifier, pairs, "funnel request model")
        else:
            out["request_model"] = np.zeros(len(users))
        return out

    pool = score_pool(candidates, run, requests, past, start, featurizer, hour, early_stage)
    return ReplayStep(
        index=hour,
        start=start,
        scored=True,
        candidates=candidates,
        requests=requests,
        pool=pool,
        candidates_seconds=0.0,
        verifier_seconds=0.0,
        featurizer=featurizer,
    )


def _serve_arms(
    run: ReplayRun,
    records: list[_SliceRecord],
    outcome: SeedOutcome,
    scored: bool,
    shown_per_request: int,
) -> None:
    """Every arm's store served to the hour's final-stage pairs by the tier rule, at each
    slice's time; the VM ranks each request's K with that ``z`` and is scored on its top k."""
    import torch

    ttl = run.cfg.ttl_seconds_by_tier()
    for state in run.states:
        name = _arm_name(state.planner, state.budget)
        totals = outcome.arms.get(name)
        missed: list[pd.DataFrame] = []
        hour_clicks = 0.0
        for rec in records:
            stored = state.stored_values(rec.users, rec.items)
            now_s = rec.now.value / 1e9
            request_of = np.repeat(np.arange(rec.requests), len(rec.users) // rec.requests)
            for step in ABLATION_STEPS:
                got = resolve(
                    {t: stored[t] for t in ABLATION_TIERS[step]}, now_s=now_s, ttl_seconds=ttl
                )
                if step == ABLATION_STEPS[-1]:
                    miss = got.tiers != int(Tier.EXACT)
                    missed.append(
                        pd.DataFrame({USER_ID: rec.users[miss], ITEM_ID: rec.items[miss]})
                    )
                if not scored or totals is None:
                    continue
                tiers = torch.from_numpy(got.tiers.astype(np.int64))
                probs = (
                    run.bundle.vm.predict_proba(rec.batch, torch.from_numpy(got.embeddings), tiers)[
                        :, 0
                    ]
                    .numpy()
                    .astype(np.float64)
                )
                shown = _top_per_user(request_of, probs, shown_per_request)
                totals.clicks[step] = totals.clicks.get(step, 0.0) + float(rec.click_p[shown].sum())
                totals.conversions[step] = totals.conversions.get(step, 0.0) + float(
                    rec.conversion_p[shown].sum()
                )
                totals.probs.setdefault(step, []).append(probs[shown])
                totals.labels.setdefault(step, []).append(rec.labels[shown, 0])
                totals.final_stage_probs.setdefault(step, []).append(probs)
                if step == ABLATION_STEPS[0]:
                    totals.final_stage_labels.append(rec.labels[:, 0])
                if step == ABLATION_STEPS[-1]:
                    totals.tier_counts += np.bincount(
                        got.tiers.astype(np.int64), minlength=len(Tier)
                    )
                    hour_clicks += float(rec.click_p[shown].sum())
        if scored and totals is not None:
            totals.hourly_clicks.append(hour_clicks)
        state.misses = (
            pd.concat(missed, ignore_index=True).drop_duplicates().reset_index(drop=True)
            if missed
            else state.misses.iloc[0:0]
        )
