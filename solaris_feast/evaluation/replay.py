"""Replay simulation: how much of the served traffic each planner covers under an FM budget.

The log is split in time: models are trained on the first part (the VM with the serving tier mix,
see :mod:`solaris_feast.models.chain`), then the rest is replayed in steps (hourly by default). At
the
start of each step ``t`` and for every planner and budget, using only events before ``t``:

1. candidates per active user (:mod:`solaris_feast.precompute.candidates`) plus the queued misses
of the last
   step form the pool; each planner scores the pool (``verifier``: the production planner's
   :func:`~solaris_feast.precompute.plan.request_score`, the VM's score with no embedding times the
   retrieval score; ``vm_only`` and ``retrieval``: its two factors alone; ``random``;
   ``popular``: item popularity over the last day; ``oracle``: whether the pair is requested
   during the step, the upper bound of any planner over this pool);
2. :func:`~solaris_feast.precompute.plan.plan_precompute` picks the step's budget of pairs
(``budget x
   |candidates|``, or a pair TTL's share of that with ``budget_basis="pair_ttl"``), the FM
   computes them as of ``t`` (:func:`~solaris_feast.precompute.compute.compute_pair_embeddings`);
3. the user aggregate and the similarity fill (targets: the best uncovered pairs and the
   misses) are recomputed.

Then the step's real impressions are served from that state with the retriever's rules (exact >
similar > user aggregate > zero; a value is fresh while its age is below its view's TTL, made by
the current embedding version) and scored by the VM. Ages are taken at the step start, so
everything served in a step sees the state the precompute left at ``t``.

The stores are in-memory equivalents of the three Feast views (newest row per key wins, as the
writer does); one step is replayed through the real Feast write path and
:class:`~solaris_feast.serving.retriever.SolarisRetriever` (SQLite online store) to check that both
give the
same tier for every served pair.

No step reads the future: candidates, the featurizer used for precompute and the popularity
scores see events strictly before ``t``; served impressions are featurized as of their own time,
as serving would. Only the oracle reads the step's requests, by definition.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
import pandas as pd
import typer
from pydantic import BaseModel, ConfigDict, Field

from solaris_feast.data.schema import EVENT_TIMESTAMP, ITEM_ID, USER_ID, InteractionDataset
from solaris_feast.errors import ConfigError
from solaris_feast.precompute.aggregate import (
    AggregateConfig,
    PairEmbeddings,
    aggregate_user_embeddings,
)
from solaris_feast.precompute.candidates import (
    CANDIDATE_SCORE,
    CandidateConfig,
    generate_candidates,
)
from solaris_feast.precompute.plan import VERIFIER_SCORE, plan_precompute, request_score
from solaris_feast.precompute.similarity import SimilarityConfig, build_user_index, similarity_fill
from solaris_feast.store.definitions import (
    DEFAULT_PAIR_TTL_SECONDS,
    DEFAULT_SIMILAR_TTL_SECONDS,
    DEFAULT_USER_TTL_SECONDS,
)
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from solaris_feast.models.features import PairFeaturizer
    from solaris_feast.models.registry import ModelBundle

logger = logging.getLogger(__name__)

PlannerName = Literal["verifier", "random", "popular", "oracle", "vm_only", "retrieval"]
PLANNERS: tuple[PlannerName, ...] = ("verifier", "random", "popular", "oracle")
"""Planners replayed by default; ``vm_only`` and ``retrieval`` (the two factors of the
verifier's :func:`~solaris_feast.precompute.plan.request_score`) can be asked for to see what each
adds."""
ALL_PLANNERS: tuple[PlannerName, ...] = (*PLANNERS, "vm_only", "retrieval")
ONCE_CONSUMED_DATASETS = frozenset({"movielens"})
"""Data sets where a user meets an item once: their past items are never requested again."""
ABLATION_STEPS: tuple[str, ...] = ("exact", "exact+user", "exact+user+similar")
_INFERENCE_BATCH = 8192

StepObserver = Callable[[int, pd.Timestamp, dict[str, PairEmbeddings]], None]
"""``(step, step start, exact store per replay)``, called after each step's precompute."""


class SimulationConfig(BaseModel):
    """What a replay runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: Literal["synthetic", "movielens"] = "synthetic"
    """Data set to replay."""
    size: str = "demo"
    """Synthetic preset (tiny, demo, default, large); ignored for movielens."""
    seed: int = 0
    """Seeds the data, the models and the random planner."""
    budgets: tuple[float, ...] = (0.05, 0.1, 0.2, 0.4)
    """FM budget as a fraction of the candidate pairs; ``budget_basis`` says over what time."""
    budget_basis: Literal["step", "pair_ttl"] = "step"
    """``step``: each step (a precompute run) computes ``budget x candidates`` pairs, the
    planner's budget of pairs per run. With hourly runs and a 6 h pair TTL a 10 % budget then
    keeps up to 60 % of the candidates fresh, so even a random planner covers many requests.
    ``pair_ttl``: the budget is the share of the candidates the FM can keep fresh; each step
    computes ``budget x candidates x step_seconds / pair_ttl_seconds`` pairs."""
    planners: tuple[PlannerName, ...] = PLANNERS
    """Planners to compare."""
    retrieval_weight: float = Field(default=1.0, ge=0)
    """Exponent of the retrieval score in the verifier's plan score
    (:func:`~solaris_feast.precompute.plan.request_score`; 0: the VM's score alone)."""
    train_fraction: float = Field(default=0.5, gt=0, lt=1)
    """Share of the log's time span that trains the models; the rest is replayed."""
    step_seconds: int = Field(default=3600, gt=0)
    """Replay step (the precompute schedule)."""
    warmup_steps: int = Field(default=6, ge=0)
    """Steps replayed before scoring starts, so the stores reach their steady state."""
    max_steps: int | None = Field(default=24, gt=0)
    """Scored steps at most (``None``: to the end of the log)."""
    candidates: CandidateConfig = CandidateConfig(candidates_per_user=50)
    """Candidate generation; ``category_column`` defaults to the data set's item category."""
    exclude_seen_items: bool | None = None
    """Drop each user's past items from their candidates; ``None``: per data set, on where no
    (user, item) pair recurs (MovieLens: a film is rated once), off for the synthetic log."""
    pair_ttl_seconds: int = Field(default=DEFAULT_PAIR_TTL_SECONDS, gt=0)
    """TTL of an exact embedding (the ``solaris_pair`` view's)."""
    user_ttl_seconds: int = Field(default=DEFAULT_USER_TTL_SECONDS, gt=0)
    """TTL of a user aggregate (the ``solaris_user`` view's)."""
    similar_ttl_seconds: int = Field(default=DEFAULT_SIMILAR_TTL_SECONDS, gt=0)
    """TTL of a similarity-filled embedding (the ``solaris_similar`` view's)."""
    refresh_margin_seconds: int = Field(default=3600, ge=0)
    """Exact embeddings expiring within this margin are planned again."""
    user_balanced: bool = True
    """Plan with :func:`plan_precompute`'s ``user_balanced`` order (every user's best pairs
    first): who requests next is unknown, so the budget is spread over the users."""
    min_miss_rank: float = Field(default=0.9, ge=0, le=1)
    """A queued miss goes first when its planner score ranks at least this high in the pool
    (scores are turned into percentile ranks so one threshold fits every planner). In the
    synthetic log a session lasts minutes and the next one comes hours later, so a served pair
    is rarely requested again within its TTL: measured at a 10 % pair_ttl budget, the verifier's
    exact hit rate is 0.187 with 0.5, 0.212 with 0.9 and 0.242 with 1.0 (misses never first).
    Feeds that re-rank the same pairs within minutes gain from a lower threshold."""
    aggregate: AggregateConfig = AggregateConfig()
    """User-only tier."""
    similarity: SimilarityConfig = SimilarityConfig(search_neighbours=100)
    """Similarity fill."""
    similarity_space: Literal["fm_user", "aggregate"] = "fm_user"
    """User vectors the fill searches: the FM's user-side representation or the aggregate."""
    compare_similarity_spaces: bool = True
    """Also replay the verifier at the budget closest to 10 % with the other user space."""
    fill_targets_per_budget: float = Field(default=1.0, ge=0)
    """Fill targets per step: this many times the budget, best uncovered pairs first, plus the
    queued misses."""
    feast_check: bool = True
    """Replay one step through the Feast writer and retriever and compare tiers."""
    models_dir: str | None = None
    """Where the replay's models are trained and registered; a temporary folder when unset.
    When it already holds models trained on this data set and ending before the replayed
    period, they are reused."""
    ne_vm: Literal["registered", "replay_tuned"] = "replay_tuned"
    """VM that scores NE: the registered one (trained on the training period's tier mix), or it
    fine-tuned on what serving actually produced during the ``ne_tuning_steps`` steps after the
    warm-up (their tiers and vectors, every replay's), which are then not scored."""
    ne_tuning_steps: int = Field(default=6, ge=1)
    """Steps whose served pairs tune the NE VM (``replay_tuned`` only)."""
    ne_tuning_epochs: int = Field(default=2, gt=0)
    """Passes over the tuning rows."""
    ne_tuning_learning_rate: float = Field(default=1e-3, gt=0)
    """Step size of the tuning."""
    fm_epochs: int | None = Field(default=None, gt=0)
    """Override the FM's training epochs (smaller is faster, for tests)."""


@dataclass
class _TierStore:
    """Newest row per key of one in-memory view: keys ``(K,)`` int64 sorted, vectors, times."""

    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    computed_at_s: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def upsert(self, keys: np.ndarray, vectors: np.ndarray, computed_at_s: np.ndarray) -> None:
        """Newest wins; on equal times the later write wins (the writer's rule)."""
        if len(keys) == 0:
            return
        all_keys = np.concatenate([self.keys, keys])
        all_vecs = vectors if len(self.keys) == 0 else np.concatenate([self.vectors, vectors])
        all_t = np.concatenate([self.computed_at_s, computed_at_s])
        # Sort by key, then time, then write order; keep the last row of each key.
        order = np.lexsort((np.arange(len(all_keys)), all_t, all_keys))
        all_keys, all_vecs, all_t = all_keys[order], all_vecs[order], all_t[order]
        last = np.r_[all_keys[1:] != all_keys[:-1], True]
        self.keys, self.vectors, self.computed_at_s = all_keys[last], all_vecs[last], all_t[last]

    def prune(self, older_than_s: float) -> None:
        keep = self.computed_at_s > older_than_s
        self.keys, self.vectors, self.computed_at_s = (
            self.keys[keep],
            self.vectors[keep],
            self.computed_at_s[keep],
        )

    def lookup(self, keys: np.ndarray, now_s: float, ttl_seconds: float) -> np.ndarray:
        """Row of each key whose value is fresh (age below the TTL) at ``now_s``, else ``-1``."""
        if len(self.keys) == 0:
            return np.full(len(keys), -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        fresh = (self.keys[pos] == keys) & (now_s - self.computed_at_s[pos] < ttl_seconds)
        return np.where(fresh, pos, -1)


@dataclass
class _PlannerState:
    """Stores and counters of one (planner, budget, user space) replay."""

    planner: PlannerName
    budget: float
    space: str
    exact: _TierStore = field(default_factory=_TierStore)
    similar: _TierStore = field(default_factory=_TierStore)
    user: _TierStore = field(default_factory=_TierStore)
    misses: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(
            {USER_ID: np.zeros(0, dtype=np.int64), ITEM_ID: np.zeros(0, dtype=np.int64)}
        )
    )
    fm_pairs: int = 0
    plan_totals: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    tier_counts: dict[str, np.ndarray] = field(default_factory=dict)
    probs: dict[str, list[np.ndarray]] = field(default_factory=dict)
    served: int = 0
    budget_pairs: list[int] = field(default_factory=list)

    def add_seconds(self, part: str, seconds: float) -> None:
        self.seconds[part] = self.seconds.get(part, 0.0) + seconds


@dataclass
class _Step:
    """Everything one step shares between planners."""

    index: int
    start: pd.Timestamp
    scored: bool
    candidates: pd.DataFrame
    requests: pd.DataFrame
    pool: pd.DataFrame
    candidates_seconds: float
    verifier_seconds: float


def simulate(
    config: SimulationConfig | None = None,
    *,
    dataset: InteractionDataset | None = None,
    bundle: ModelBundle | None = None,
    progress: Callable[[str, int, int], None] | None = None,
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
    from solaris_feast.models.features import PairFeaturizer

    cfg = config or SimulationConfig()
    ds = dataset if dataset is not None else load_dataset(cfg.dataset, cfg.size, cfg.seed)
    train_ds, replay_ds = time_split(ds, cfg.train_fraction)
    if bundle is None:
        bundle = _train_models(train_ds, cfg, progress)
    version = bundle.embedding_version
    candidate_cfg = cfg.candidates
    if candidate_cfg.category_column is None:
        candidate_cfg = candidate_cfg.model_copy(update={"category_column": _category_column(ds)})
    exclude_seen = cfg.exclude_seen_items
    if exclude_seen is None:
        exclude_seen = ds.name in ONCE_CONSUMED_DATASETS
    if exclude_seen:
        candidate_cfg = candidate_cfg.model_copy(update={"exclude_seen_items": True})
    history_len = bundle.schema.history_len
    serve_featurizer = PairFeaturizer(ds, history_len)  # reads strictly before each event

    states = [_PlannerState(p, b, cfg.similarity_space) for p in cfg.planners for b in cfg.budgets]
    if cfg.compare_similarity_spaces and "verifier" in cfg.planners and cfg.budgets:
        near_ten = min(cfg.budgets, key=lambda b: abs(b - 0.1))
        other = "aggregate" if cfg.similarity_space == "fm_user" else "fm_user"
        states.append(_PlannerState("verifier", near_ten, other))

    log = ds.interactions
    step = pd.Timedelta(seconds=cfg.step_seconds)
    first = replay_ds.interactions[EVENT_TIMESTAMP].min().ceil(step)
    last = log[EVENT_TIMESTAMP].max()
    total_steps = int((last - first) / step)
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
    check_step = first_scored + (total_steps - first_scored) // 2
    ne_vm = bundle.vm
    tuning: list[tuple[Any, np.ndarray, np.ndarray, np.ndarray]] = []
    feast_check: dict[str, Any] | None = None
    baselines: dict[str, list[np.ndarray]] = {"vm_zero": [], "fm": [], "labels": []}
    candidate_recall: list[float] = []
    fm_rate: list[tuple[int, float]] = []

    # Inference only, except where _tune_vm turns gradients back on; restored on the way out
    # so a caller's (or a test session's) grad mode is left as it was.
    grad_was_enabled = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    try:
        for k in range(total_steps):
            start = first + k * step
            t0 = time.perf_counter()
            past = log.loc[log[EVENT_TIMESTAMP] < start]
            requests = log.loc[
                (log[EVENT_TIMESTAMP] >= start) & (log[EVENT_TIMESTAMP] < start + step)
            ]
            requests = requests.drop_duplicates([USER_ID, ITEM_ID, EVENT_TIMESTAMP])
            precompute_featurizer = PairFeaturizer(ds.with_interactions(past), history_len)
            candidates = generate_candidates(past, start, candidate_cfg, items=ds.items)
            t1 = time.perf_counter()
            pool = _score_pool(
                candidates,
                states,
                requests,
                past,
                start,
                bundle,
                precompute_featurizer,
                cfg.seed,
                k,
                cfg.retrieval_weight,
            )
            the_step = _Step(
                index=k,
                start=start,
                scored=k >= first_scored,
                candidates=candidates,
                requests=requests,
                pool=pool,
                candidates_seconds=t1 - t0,
                verifier_seconds=time.perf_counter() - t1,
            )
            _precompute_step(the_step, states, cfg, bundle, precompute_featurizer, version, fm_rate)
            if observer is not None:
                observer(
                    k,
                    start,
                    {
                        f"{s.planner}@{s.budget}/{s.space}": _as_pair_embeddings(s.exact, version)
                        for s in states
                    },
                )
            if cfg.warmup_steps <= k < first_scored and len(requests):
                batch = serve_featurizer.for_log(requests)
                all_labels = requests[list(ds.label_columns)].to_numpy(dtype=np.float32)
                # Each served impression enters the tuning set once, with the (z, tier) of one
                # replay and ablation step taken in turn: repeating it for every replay would
                # fit the VM to these few hours of impressions many times over.
                served = [
                    _served_inputs(the_step, state, cfg, name)
                    for state in states
                    for name in (ABLATION_STEPS[0], ABLATION_STEPS[-1])
                ]
                pick = np.arange(len(requests)) % len(served)
                z = np.stack([served[p][0][r] for r, p in enumerate(pick)])
                tiers = np.array([served[p][1][r] for r, p in enumerate(pick)], dtype=np.int64)
                tuning.append((batch, z, tiers, all_labels))
                for state in states:
                    state.misses = _misses_after_serving(the_step, state, cfg)
                if k == first_scored - 1:
                    ne_vm = _tune_vm(bundle, tuning, cfg)
                    tuning = []
            elif the_step.scored and len(requests):
                batch = serve_featurizer.for_log(requests)
                labels = requests[ds.label_columns[0]].to_numpy(dtype=np.float64)
                baselines["labels"].append(labels)
                baselines["vm_zero"].append(_vm_main(ne_vm, batch, None, None))
                baselines["fm"].append(_fm_main(bundle, batch))
                in_pool = np.isin(
                    _pair_keys(requests[USER_ID].to_numpy(), requests[ITEM_ID].to_numpy()),
                    _pair_keys(pool[USER_ID].to_numpy(), pool[ITEM_ID].to_numpy()),
                )
                candidate_recall.append(float(in_pool.mean()))
                for state in states:
                    _serve_step(the_step, state, cfg, ne_vm, batch)
                    if (
                        cfg.feast_check
                        and feast_check is None
                        and k >= check_step
                        and state.planner == cfg.planners[0]
                    ):
                        feast_check = _check_against_feast(the_step, state, cfg, version)
            else:
                for state in states:
                    state.misses = _misses_after_serving(the_step, state, cfg)
            if progress is not None:
                progress("replay", k + 1, total_steps)
            logger.info(
                "replay step %d/%d at %s: %d requests", k + 1, total_steps, start, len(requests)
            )

    finally:
        torch.set_grad_enabled(grad_was_enabled)
    return _records(
        states, baselines, candidate_recall, fm_rate, feast_check, cfg, total_steps, first_scored
    )


def _train_models(
    train_ds: InteractionDataset,
    cfg: SimulationConfig,
    progress: Callable[[str, int, int], None] | None,
) -> ModelBundle:
    from solaris_feast.models.chain import TrainingConfig, train_and_register

    training = TrainingConfig(seed=cfg.seed)
    if cfg.fm_epochs is not None:
        models = training.models.model_copy(
            update={
                "fm_training": training.models.fm_training.model_copy(
                    update={"epochs": cfg.fm_epochs}
                )
            }
        )
        training = training.model_copy(update={"models": models})
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


def _pair_keys(users: np.ndarray, items: np.ndarray) -> np.ndarray:
    # Item ids stay far below 2**31 in every data set here; the key keeps (user, item) order.
    return np.asarray(users, dtype=np.int64) * (1 << 31) + np.asarray(items, dtype=np.int64)


def _score_pool(
    candidates: pd.DataFrame,
    states: list[_PlannerState],
    requests: pd.DataFrame,
    past: pd.DataFrame,
    start: pd.Timestamp,
    bundle: ModelBundle,
    featurizer: PairFeaturizer,
    seed: int,
    step_index: int,
    retrieval_weight: float,
) -> pd.DataFrame:
    """Distinct pairs of the candidates and every state's queued misses, with each planner's
    score as a percentile rank in ``[0, 1]`` (column per planner)."""
    frames = [candidates[[USER_ID, ITEM_ID]]] + [s.misses for s in states]
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
        verifier[lo:hi] = bundle.vm.verifier_score(batch).numpy()
    # Random: a fixed hash of (seed, step, pair), so reruns pick the same pairs.
    rng = np.random.default_rng([seed, step_index, 7])
    random_score = rng.random(len(pool))
    day = past.loc[past[EVENT_TIMESTAMP] >= start - pd.Timedelta(days=1), ITEM_ID]
    popularity = day.value_counts()
    popular = popularity.reindex(items).fillna(0.0).to_numpy(dtype=np.float64)
    requested = np.isin(
        _pair_keys(users, items),
        _pair_keys(requests[USER_ID].to_numpy(), requests[ITEM_ID].to_numpy()),
    )
    scores = {
        "verifier": request_score(users, verifier, retrieval, retrieval_weight),
        "vm_only": verifier,
        "retrieval": request_score(users, np.ones(len(pool)), retrieval) + 1e-3 * verifier,
        "random": random_score,
        # Ties in popularity (and in the oracle's 0/1) are broken by the verifier's score.
        "popular": popular + 1e-3 * verifier,
        "oracle": requested.astype(np.float64) + 1e-3 * verifier,
    }
    for name in dict.fromkeys(s.planner for s in states):
        pool[name] = _percentile_rank(scores[name])
    return pool


def _percentile_rank(values: np.ndarray) -> np.ndarray:
    """Rank in ``[0, 1]`` (1 = best), ties share the lowest rank of their group."""
    if len(values) <= 1:
        return np.ones(len(values))
    ranks = pd.Series(values).rank(method="min").to_numpy()
    return (ranks - 1) / (len(values) - 1)


def _precompute_step(
    the_step: _Step,
    states: list[_PlannerState],
    cfg: SimulationConfig,
    bundle: ModelBundle,
    featurizer: PairFeaturizer,
    version: str,
    fm_rate: list[tuple[int, float]],
) -> None:
    from solaris_feast.precompute.compute import compute_pair_embeddings

    now = the_step.start
    now_s = now.value / 1e9
    pool = the_step.pool
    plans = []
    for state in states:
        t0 = time.perf_counter()
        score = pool[[USER_ID, ITEM_ID, state.planner]].rename(
            columns={state.planner: VERIFIER_SCORE}
        )
        candidates = score.merge(the_step.candidates[[USER_ID, ITEM_ID]], on=[USER_ID, ITEM_ID])
        misses = score.merge(state.misses, on=[USER_ID, ITEM_ID])
        fresh_state = pd.DataFrame(
            {
                USER_ID: state.exact.keys >> 31,
                ITEM_ID: state.exact.keys & ((1 << 31) - 1),
                "computed_at": state.exact.computed_at_s,
            }
        )
        budget = round(state.budget * len(the_step.candidates) * _steps_per_budget(cfg))
        plan = plan_precompute(
            candidates,
            misses,
            fresh_state,
            budget,
            now,
            cfg.pair_ttl_seconds,
            cfg.refresh_margin_seconds,
            cfg.min_miss_rank,
            # The oracle knows who comes: spreading its budget over users would only waste it.
            user_balanced=cfg.user_balanced and state.planner != "oracle",
        )
        plans.append(plan)
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

    # The FM runs once per distinct planned pair: every state gets the same z for a pair at t.
    planned = pd.concat([p.pairs[[USER_ID, ITEM_ID]] for p in plans], ignore_index=True)
    planned = planned.drop_duplicates().sort_values([USER_ID, ITEM_ID], kind="stable")
    keys = _pair_keys(planned[USER_ID].to_numpy(), planned[ITEM_ID].to_numpy())
    t0 = time.perf_counter()
    z, _, _ = compute_pair_embeddings(
        bundle, featurizer, planned[USER_ID].to_numpy(), planned[ITEM_ID].to_numpy(), now
    )
    fm_seconds = time.perf_counter() - t0
    if len(keys):
        fm_rate.append((len(keys), fm_seconds))
    pairs_per_second = len(keys) / fm_seconds if fm_seconds > 0 else float("inf")

    user_vectors_fm: tuple[np.ndarray, np.ndarray] | None = None
    for state, plan in zip(states, plans, strict=True):
        t0 = time.perf_counter()
        plan_keys = _pair_keys(plan.pairs[USER_ID].to_numpy(), plan.pairs[ITEM_ID].to_numpy())
        rows = np.searchsorted(keys, plan_keys)
        state.exact.upsert(plan_keys, z[rows], np.full(len(plan_keys), now_s))
        horizon = max(cfg.pair_ttl_seconds, cfg.aggregate.window_seconds)
        state.exact.prune(now_s - horizon)
        state.fm_pairs += len(plan_keys)
        state.add_seconds("fm", len(plan_keys) / pairs_per_second if len(plan_keys) else 0.0)
        state.add_seconds("store", time.perf_counter() - t0)

        t0 = time.perf_counter()
        exact = _as_pair_embeddings(state.exact, version)
        user_rows = aggregate_user_embeddings(exact, now, version, cfg.aggregate)
        if len(user_rows):
            state.user.upsert(
                user_rows[USER_ID].to_numpy(dtype=np.int64),
                np.stack(user_rows["embedding"].to_numpy()),
                np.full(len(user_rows), now_s),
            )
        state.user.prune(now_s - cfg.user_ttl_seconds)
        state.add_seconds("aggregate", time.perf_counter() - t0)

        t0 = time.perf_counter()
        n_targets = round(cfg.fill_targets_per_budget * len(plan))
        targets = pd.concat(
            [plan.uncovered[[USER_ID, ITEM_ID]].head(n_targets), state.misses], ignore_index=True
        )
        if state.space == "fm_user":
            if user_vectors_fm is None:
                user_vectors_fm = _fm_user_vectors(bundle, featurizer, now)
            index_users, index_vectors = user_vectors_fm
        else:
            index_users = state.user.keys
            index_vectors = state.user.vectors
        if len(targets) and len(index_users) > 1 and len(exact):
            index = build_user_index(index_users, index_vectors, cfg.similarity)
            fill = similarity_fill(
                index, targets, exact, now, version, cfg.pair_ttl_seconds, cfg.similarity
            )
            if len(fill):
                state.similar.upsert(
                    _pair_keys(fill[USER_ID].to_numpy(), fill[ITEM_ID].to_numpy()),
                    np.stack(fill["embedding"].to_numpy()),
                    np.full(len(fill), now_s),
                )
        state.similar.prune(now_s - cfg.similar_ttl_seconds)
        state.add_seconds("fill", time.perf_counter() - t0)


def _steps_per_budget(cfg: SimulationConfig) -> float:
    """Share of ``budget x candidates`` one step may compute (see ``budget_basis``)."""
    if cfg.budget_basis == "step":
        return 1.0
    return min(1.0, cfg.step_seconds / cfg.pair_ttl_seconds)


def _as_pair_embeddings(store: _TierStore, version: str) -> PairEmbeddings:
    dim = store.vectors.shape[1] if store.vectors.ndim == 2 else 0
    return PairEmbeddings(
        user_ids=store.keys >> 31,
        item_ids=store.keys & ((1 << 31) - 1),
        vectors=store.vectors if len(store.keys) else np.zeros((0, dim), dtype=np.float32),
        computed_at_s=store.computed_at_s,
        model_versions=np.full(len(store.keys), version, dtype=object),
    )


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


def _resolve(
    the_step: _Step, state: _PlannerState, cfg: SimulationConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows (or -1) of each request in the exact, similar and user stores, and the pair keys."""
    now_s = the_step.start.value / 1e9
    users = the_step.requests[USER_ID].to_numpy(dtype=np.int64)
    items = the_step.requests[ITEM_ID].to_numpy(dtype=np.int64)
    keys = _pair_keys(users, items)
    exact = state.exact.lookup(keys, now_s, cfg.pair_ttl_seconds)
    similar = state.similar.lookup(keys, now_s, cfg.similar_ttl_seconds)
    user = state.user.lookup(users, now_s, cfg.user_ttl_seconds)
    return exact, similar, user, keys


def _tiers_for(
    step_name: str, exact: np.ndarray, similar: np.ndarray, user: np.ndarray
) -> np.ndarray:
    tiers = np.full(len(exact), int(Tier.ZERO), dtype=np.int64)
    if "user" in step_name:
        tiers[user >= 0] = int(Tier.USER_AGG)
    if "similar" in step_name:
        tiers[similar >= 0] = int(Tier.SIMILAR)
    tiers[exact >= 0] = int(Tier.EXACT)
    return tiers


def _served_inputs(
    the_step: _Step, state: _PlannerState, cfg: SimulationConfig, name: str
) -> tuple[np.ndarray, np.ndarray]:
    """``z`` ``(N, d)`` and tiers ``(N,)`` the VM gets for the step's requests when the tiers
    named by ``name`` (an ablation step) are on."""
    exact, similar, user, _ = _resolve(the_step, state, cfg)
    tiers = _tiers_for(name, exact, similar, user)
    z = np.zeros((len(tiers), state.exact.vectors.shape[1]), dtype=np.float32)
    for tier, store, rows in (
        (Tier.EXACT, state.exact, exact),
        (Tier.SIMILAR, state.similar, similar),
        (Tier.USER_AGG, state.user, user),
    ):
        mask = tiers == int(tier)
        if mask.any():
            z[mask] = store.vectors[rows[mask]]
    return z, tiers


def _serve_step(
    the_step: _Step,
    state: _PlannerState,
    cfg: SimulationConfig,
    vm: Any,
    batch: Any,
) -> None:
    import torch

    for name in ABLATION_STEPS:
        z, tiers = _served_inputs(the_step, state, cfg, name)
        probs = _vm_main(vm, batch, torch.from_numpy(z), torch.from_numpy(tiers))
        state.probs.setdefault(name, []).append(probs)
        counts = np.bincount(tiers, minlength=len(Tier))
        state.tier_counts[name] = (
            state.tier_counts.get(name, np.zeros(len(Tier), np.int64)) + counts
        )
    state.served += len(the_step.requests)
    state.misses = _misses_after_serving(the_step, state, cfg)


def _tune_vm(
    bundle: ModelBundle,
    rows: list[tuple[Any, np.ndarray, np.ndarray, np.ndarray]],
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


def _misses_after_serving(
    the_step: _Step, state: _PlannerState, cfg: SimulationConfig
) -> pd.DataFrame:
    """Served pairs without a fresh exact embedding: the miss queue of the next step."""
    exact, _, _, _ = _resolve(the_step, state, cfg)
    missed = the_step.requests.loc[exact < 0, [USER_ID, ITEM_ID]]
    return missed.drop_duplicates().reset_index(drop=True)


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


def normalized_entropy(probabilities: np.ndarray, labels: np.ndarray) -> float:
    """Log loss over the entropy of the labels' base rate (1.0 = no better than the base rate)."""
    p = np.clip(probabilities, 1e-7, 1 - 1e-7)
    y = labels.astype(np.float64)
    logloss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    rate = float(np.clip(y.mean(), 1e-7, 1 - 1e-7))
    entropy = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    return float(logloss / entropy)


def _coverage(counts: np.ndarray) -> dict[str, float]:
    total = max(int(counts.sum()), 1)
    return {
        "exact": counts[int(Tier.EXACT)] / total,
        "similar": counts[int(Tier.SIMILAR)] / total,
        "user": counts[int(Tier.USER_AGG)] / total,
        "zero": counts[int(Tier.ZERO)] / total,
        "any": 1.0 - counts[int(Tier.ZERO)] / total,
    }


def _records(
    states: list[_PlannerState],
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
    ne_vm = normalized_entropy(np.concatenate(baselines["vm_zero"]), labels)
    ne_fm = normalized_entropy(np.concatenate(baselines["fm"]), labels)
    gap = ne_vm - ne_fm
    pairs = sum(n for n, _ in fm_rate)
    seconds = sum(s for _, s in fm_rate)
    records = []
    for state in states:
        ablation: list[dict[str, Any]] = []
        for name in ABLATION_STEPS:
            ne = normalized_entropy(np.concatenate(state.probs[name]), labels)
            ablation.append(
                {
                    "tiers": name,
                    "coverage": _round(_coverage(state.tier_counts[name])),
                    "ne": round(ne, 5),
                    "tr": round((ne_vm - ne) / gap, 4) if gap > 0 else None,
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


def _check_against_feast(
    the_step: _Step, state: _PlannerState, cfg: SimulationConfig, version: str
) -> dict[str, Any]:
    """Write the rows this step's requests touch through the Feast writer (SQLite online store)
    and read them back with :class:`SolarisRetriever`; count pairs whose tier differs."""
    from solaris_feast.serving.retriever import SolarisRetriever
    from solaris_feast.store.config import open_store
    from solaris_feast.store.definitions import SolarisFeastConfig, solaris_definitions
    from solaris_feast.store.write import EmbeddingWriter

    started = time.perf_counter()
    exact, similar, user, keys = _resolve(the_step, state, cfg)
    expected = _tiers_for(ABLATION_STEPS[-1], exact, similar, user)
    requests = the_step.requests
    dim = state.exact.vectors.shape[1]
    views = SolarisFeastConfig(
        embedding_dim=dim,
        pair_ttl_seconds=cfg.pair_ttl_seconds,
        user_ttl_seconds=cfg.user_ttl_seconds,
        similar_ttl_seconds=cfg.similar_ttl_seconds,
    )
    # Simulated time t maps to wall time (now - 30 s) + (t - step start): the retriever's clock
    # then reads every age 30 s + the check's own duration older, which moves no age across a
    # TTL because every simulated time is a whole step from every other.
    offset_s = time.time() - 30.0 - the_step.start.value / 1e9
    with tempfile.TemporaryDirectory(prefix="solaris-simulate-feast-") as tmp:
        store = open_store(f"solaris_sim_{the_step.index}", Path(tmp), online="sqlite")
        store.apply(solaris_definitions(views).all())
        wanted = np.unique(keys)
        for tier_store, view_name, key_cols in (
            (state.exact, views.pair_view_name, (USER_ID, ITEM_ID)),
            (state.similar, views.similar_view_name, (USER_ID, ITEM_ID)),
            (state.user, views.user_view_name, (USER_ID,)),
        ):
            if key_cols == (USER_ID,):
                mask = np.isin(tier_store.keys, requests[USER_ID].to_numpy())
            else:
                mask = np.isin(tier_store.keys, wanted)
            if not mask.any():
                continue
            frame = pd.DataFrame(
                {
                    "embedding": list(tier_store.vectors[mask]),
                    "model_version": version,
                    "computed_at": pd.to_datetime(
                        np.round((tier_store.computed_at_s[mask] + offset_s) * 1e6).astype(
                            np.int64
                        ),
                        unit="us",
                        utc=True,
                    ),
                }
            )
            if key_cols == (USER_ID,):
                frame.insert(0, USER_ID, tier_store.keys[mask])
                frame["pair_count"] = np.ones(int(mask.sum()), dtype=np.int64)
            else:
                frame.insert(0, USER_ID, tier_store.keys[mask] >> 31)
                frame.insert(1, ITEM_ID, tier_store.keys[mask] & ((1 << 31) - 1))
                if view_name == views.similar_view_name:
                    frame["neighbour_count"] = np.ones(int(mask.sum()), dtype=np.int64)
                    frame["mean_distance"] = np.zeros(int(mask.sum()), dtype=np.float32)
            writer = EmbeddingWriter(store, view_name, offline=False, online=True)
            try:
                writer.write(frame)
            finally:
                writer.close()
        retriever = SolarisRetriever(store, version, record_misses=False, deadline_ms=10_000)
        got = np.zeros(len(requests), dtype=np.int64)
        try:
            users = requests[USER_ID].to_numpy()
            items = requests[ITEM_ID].to_numpy()
            for user_id in np.unique(users):
                rows = np.flatnonzero(users == user_id)
                distinct, inverse = np.unique(items[rows], return_inverse=True)
                result = retriever.fetch(int(user_id), distinct)
                got[rows] = result.tiers.astype(np.int64)[inverse]
        finally:
            retriever.close()
    mismatches = int((got != expected).sum())
    return {
        "planner": state.planner,
        "budget": state.budget,
        "space": state.space,
        "step": the_step.index,
        "pairs": len(requests),
        "tiers_seen": {Tier(t).name.lower(): int((expected == t).sum()) for t in Tier},
        "mismatches": mismatches,
        "identical": mismatches == 0,
        "seconds": round(time.perf_counter() - started, 2),
    }


def write_report(
    records: list[dict[str, Any]], json_path: Path | None, plot_path: Path | None
) -> None:
    """Write the records as JSON and, optionally, a PNG of coverage and NE against budget."""
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(records, indent=2) + "\n")
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
    """A plain-text table: one line per record, then the ablation of the verifier's records."""
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
    return "\n".join(lines)


def _parse_floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise typer.BadParameter(f"expected comma-separated numbers, got {text!r}") from exc
    if not values or any(not 0 < v <= 1 for v in values):
        raise typer.BadParameter(f"budgets must lie in (0, 1], got {text!r}")
    return values


def _parse_planners(text: str) -> tuple[PlannerName, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = [n for n in names if n not in ALL_PLANNERS]
    if unknown or not names:
        raise typer.BadParameter(
            f"unknown planners {unknown}; choose from {', '.join(ALL_PLANNERS)}"
        )
    return names  # type: ignore[return-value]


def simulate_command(
    dataset: Annotated[
        str, typer.Option("--dataset", help="synthetic or movielens.")
    ] = "synthetic",
    size: Annotated[str, typer.Option("--size", help="Synthetic preset.")] = "demo",
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
            "--planner", help="Planners: verifier,random,popular,oracle (also vm_only, retrieval)."
        ),
    ] = "verifier,random,popular,oracle",
    steps: Annotated[int, typer.Option("--steps", min=1, help="Scored replay steps.")] = 24,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Unscored warm-up steps.")] = 6,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    feast_check: Annotated[
        bool, typer.Option(help="Replay one step through the Feast writer and retriever.")
    ] = True,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the records here.")
    ] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="PNG of coverage and NE.")] = None,
) -> None:
    """Replay the log hour by hour: coverage and NE per planner and budget."""
    if dataset not in ("synthetic", "movielens"):
        raise typer.BadParameter(f"--dataset must be synthetic or movielens, got {dataset!r}")
    if budget_basis not in ("pair_ttl", "step"):
        raise typer.BadParameter(f"--budget-basis must be pair_ttl or step, got {budget_basis!r}")
    config = SimulationConfig(
        dataset=dataset,
        size=size,
        budgets=_parse_floats(budget),
        budget_basis=budget_basis,
        planners=_parse_planners(planner),
        max_steps=steps,
        warmup_steps=warmup,
        seed=seed,
        feast_check=feast_check,
    )
    records = simulate(config)
    write_report(records, json_path, plot)
    typer.echo(format_summary(records))
    for record in records:
        if "feast_check" in record:
            typer.echo(f"feast check: {json.dumps(record['feast_check'])}")
    if json_path is not None:
        typer.echo(f"JSON: {json_path}")
    if plot is not None:
        typer.echo(f"plot: {plot}")
