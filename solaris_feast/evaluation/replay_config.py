"""What a replay runs: :class:`SimulationConfig`, the planners it compares and the tier
ablation it reports."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from solaris_feast.pipeline.settings import (
    DEFAULT_FILL_TARGETS_PER_BUDGET,
    DEFAULT_RETURN_WEIGHT_EXPONENT,
)
from solaris_feast.precompute.aggregate import AggregateConfig
from solaris_feast.precompute.candidates import CandidateConfig
from solaris_feast.precompute.similarity import SimilarityConfig
from solaris_feast.store.definitions import (
    DEFAULT_PAIR_TTL_SECONDS,
    DEFAULT_SIMILAR_TTL_SECONDS,
    DEFAULT_USER_TTL_SECONDS,
)
from solaris_feast.tiers import FmRowsTier, Tier

PlannerName = Literal["verifier", "random", "popular", "oracle", "vm_only", "retrieval"]
PLANNERS: tuple[PlannerName, ...] = ("verifier", "random", "popular", "oracle")
"""Planners replayed by default; ``vm_only`` and ``retrieval`` (the two factors of the
verifier's :func:`~solaris_feast.precompute.plan.request_score`) can be asked for to see what each
adds."""
ALL_PLANNERS: tuple[PlannerName, ...] = (*PLANNERS, "vm_only", "retrieval")
ONCE_CONSUMED_DATASETS = frozenset({"movielens"})
"""Data sets where a user meets an item once: their past items are never requested again."""
ABLATION_TIERS: dict[str, tuple[Tier, ...]] = {
    "exact": (Tier.EXACT,),
    "exact+user": (Tier.EXACT, Tier.USER_AGG),
    "exact+user+similar": (Tier.EXACT, Tier.SIMILAR, Tier.USER_AGG),
}
"""Tiers switched on at each step of the ablation; the last is what serving does."""
ABLATION_STEPS: tuple[str, ...] = tuple(ABLATION_TIERS)


class SimulationConfig(BaseModel):
    """What a replay runs.

    Not the production defaults (``PrecomputeSettings``), and the figures it publishes are for
    these: 50 candidates per user (200), a user-balanced plan for the baselines (off), a refresh
    margin of one step, 3600 s (1800), and 100 faiss neighbours searched (200). The replay
    trains and scores
    every planner at every budget on every step, so it keeps the pool small; and with hourly
    steps a vector refreshed one step before it expires is the margin a round of the DAG has.
    A deployment that wants the replay's planner sets ``precompute.candidates_per_user`` and
    ``refresh_margin_seconds`` to these.
    """

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
    return_weight_exponent: float = Field(default=DEFAULT_RETURN_WEIGHT_EXPONENT, ge=0)
    """The verifier's plan score is weighed by each user's expected events within the pair TTL,
    learned from the log before the step, to this power, as the precompute's is
    (``PrecomputeSettings.return_weight_exponent``, the same default;
    :mod:`~solaris_feast.precompute.returns`); 0: every user alike."""
    user_balanced: bool = True
    """Plan with :func:`plan_precompute`'s ``user_balanced`` order (every user's best pairs
    first): who requests next is unknown to the baselines, so their budget is spread over the
    users. Not for the oracle, which knows who comes, nor for the verifier while its score
    carries the return weight, which says who is likely to: spreading would undo it."""
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
    fill_targets_per_budget: float = Field(default=DEFAULT_FILL_TARGETS_PER_BUDGET, ge=0)
    """Fill targets per step: this many times the step's planned pairs, best uncovered pairs
    first, plus the queued misses (the DAG's ``precompute.fill_targets_per_budget``)."""
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
    fm_rows_tier: FmRowsTier = "zero"
    """The VM's training tier for the rows its FM trained on
    (:attr:`~solaris_feast.models.chain.TierMix.fm_rows`)."""

    def ttl_seconds_by_tier(self) -> dict[Tier, float]:
        """TTL of each vector tier, as :func:`~solaris_feast.serving.resolve.resolve` takes it."""
        return {
            Tier.EXACT: float(self.pair_ttl_seconds),
            Tier.SIMILAR: float(self.similar_ttl_seconds),
            Tier.USER_AGG: float(self.user_ttl_seconds),
        }
