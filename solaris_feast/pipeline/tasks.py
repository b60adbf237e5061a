"""Task bodies of the Airflow DAGs: one plain function per task, state kept on disk and in stores.

The DAG files in ``dags/`` only wire these functions together. Each function takes explicit
settings and paths and returns a small JSON-able dict (what Airflow puts in XCom); nothing is
remembered in the process between two calls, so any worker of a CeleryExecutor or
KubernetesExecutor deployment can run any task, provided the paths below are on storage every
worker sees (the models folder, the run folder and the feature repo) and the online store is a
shared server (Redis).

Where state lives:

- the model registry (``models_dir``): cards and weights; a training stage writes a small marker
  per run so a retried stage returns the version it already registered instead of training again;
- the run folder ``<runs_dir>/<interval>/<vm version>/`` of a precompute run: ``manifest.json``
  (planning time, model versions), the drained misses, the candidates, the plan and the
  per-shard and coverage reports. Every step reuses a file that already exists, so a retried
  task, or a re-run of the same interval, sees exactly the inputs of the first attempt. A new VM
  version gets a new folder: a full re-plan, since stored vectors of another version count as
  absent to the planner and as misses to the retriever;
- the Feast stores: the offline parquet log (content-hashed files: writing the same rows again
  adds nothing) and the online store (newest-wins writes).

Heavy modules (torch, faiss, feast) are imported inside the functions: the DAG files import this
module only inside their tasks, but the rule keeps it cheap for anyone else too.
"""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    import pandas as pd
    from feast import FeatureStore

    from solaris_feast.data.schema import InteractionDataset
    from solaris_feast.models.chain import TrainingConfig, TrainingData
    from solaris_feast.models.registry import ModelBundle, ModelCard

logger = logging.getLogger(__name__)

FAIL_SHARD_ONCE_ENV = "SOLARIS_FAIL_SHARD_ONCE"
"""Fault injection for retry tests: a shard index; that shard fails on its first attempt of a run
(a marker file in the run folder remembers the failure), and succeeds when retried."""

PAIR_VIEW = "solaris_pair"
USER_VIEW = "solaris_user"
SIMILAR_VIEW = "solaris_similar"
RESOLVED_VIEW = "solaris_resolved"
RUNS_SUBDIR = Path("data") / "precompute_runs"
MISS_QUEUE_GROUP = "solaris_precompute"
"""Redis consumer group of the precompute runs on the miss queue."""
TRAINING_MARKERS_SUBDIR = ".training_runs"


class ShardFailureInjected(RuntimeError):
    """Raised once by a shard named in ``SOLARIS_FAIL_SHARD_ONCE`` (tests of retries only)."""


# -- settings ---------------------------------------------------------------------------------


class LogSource(BaseModel):
    """Where the interaction log comes from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: Literal["synthetic", "movielens"] = "synthetic"
    """Named data set (see :func:`solaris_feast.data.datasets.load_dataset`)."""
    dataset_size: Literal["tiny", "demo", "default", "large"] = "demo"
    """Synthetic preset."""
    dataset_seed: int = 0
    """Seed of the synthetic generator."""
    align_log_to_run: bool = True
    """Shift the log's timestamps so its newest event lies just before the run's time: a recorded
    log then behaves like a live one (the TTLs of serving are counted against the wall clock).
    Off for a log that is already live."""
    holdout_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    """Latest share of a recorded log's time span kept from the run: those impressions come
    *after* the run's time, to be served and scored by a replay (``solaris demo``)."""


class PrecomputeSettings(LogSource):
    """What the precompute DAG's params validate into."""

    feature_repo: str
    """Feast repo folder (holds ``feature_store.yaml``; SQLite or Redis online store)."""
    models_dir: str
    """Model registry folder; the newest VM and its compressor and FM are used."""
    feature_store_yaml: str = Field("feature_store.yaml", min_length=1)
    """Config file inside ``feature_repo``; ``feature_store.redis.yaml`` for Redis (its
    connection comes from ``SOLARIS_REDIS_CONNECTION``, else from ``REDIS_URL``)."""
    runs_dir: str = ""
    """Folder of the per-run files; empty: ``<feature_repo>/data/precompute_runs``."""
    budget_pairs: int = Field(20_000, ge=0)
    """Most pairs the FM computes per run."""
    shards: int = Field(4, ge=1, le=1024)
    """Parallel precompute tasks (dynamic task mapping)."""
    candidates_per_user: int = Field(200, gt=0)
    """Candidate items per active user."""
    exclude_seen_items: bool = False
    """Never offer a user an item they have met before (logs where a pair does not recur, such
    as ratings)."""
    pair_ttl_seconds: int | None = Field(None, gt=0)
    """TTL the planner assumes for exact vectors; None: the pair view's TTL in the registry."""
    refresh_margin_seconds: int = Field(1800, ge=0)
    """A stored vector that expires within this margin is computed again."""
    min_miss_score: float = Field(0.05, ge=0.0, le=1.0)
    """Queued misses scoring at least this go before every candidate."""
    user_balanced_plan: bool = False
    """Spread the budget over users (each user's best pair first, then second best, ...)
    instead of taking the globally highest scores."""
    retrieval_weight: float = Field(1.0, ge=0.0)
    """Candidates are planned by ``verifier x (candidate_score / user's best) ** weight``
    (:func:`solaris_feast.precompute.plan.request_score`); 0 plans by the VM's score alone, as does
    a
    candidate table without a ``candidate_score`` column."""
    max_drained_misses: int = Field(100_000, ge=0)
    """Most queued misses taken off the queue per run."""
    aggregate_window_seconds: int = Field(86_400, gt=0)
    """Window of the user-only aggregate."""
    fill_targets: int = Field(50_000, ge=0)
    """Most over-budget pairs (highest verifier score first) given to the similarity fill,
    besides the queued misses."""
    similar_neighbours: int = Field(10, gt=0)
    """k of the similarity fill."""
    batch_size: int = Field(1024, gt=0)
    """Pairs per FM forward pass and per write; up to the writer's ``atomic_rows`` (1024) a
    write is all-or-nothing on Redis."""

    @model_validator(mode="after")
    def _margin_below_ttl(self) -> PrecomputeSettings:
        if self.pair_ttl_seconds is not None and self.refresh_margin_seconds >= (
            self.pair_ttl_seconds
        ):
            raise ValueError("refresh_margin_seconds must be below pair_ttl_seconds")
        return self


class PrecomputeRun(BaseModel):
    """One precompute run: settings, its time and the models it uses (passed between tasks)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    settings: PrecomputeSettings
    now: datetime
    """Planning time (UTC): the data interval's end, or the run's time for a manual run."""
    interval_key: str
    """File-name-safe key of the data interval (or of the run, when there is no interval)."""
    run_dir: str
    """Folder of this run's files."""
    vm_version: str
    """The verifier (VM) version; its card names the compressor and the FM."""
    fm_version: str
    """The FM behind the compressor."""
    embedding_version: str
    """The compressor's version, stored beside every vector as ``model_version``."""


class TrainingSettings(LogSource):
    """What the training DAG's params validate into."""

    models_dir: str
    """Model registry folder the cards are written to."""
    train_window_hours: float = Field(72.0, gt=0)
    """Train on the log's last ``train_window_hours`` before the run's time."""
    fm_epochs: int = Field(3, gt=0)
    compressor_epochs: int = Field(2, gt=0)
    vm_epochs: int = Field(2, gt=0)
    seed: int = 0
    """Seeds initialisation, shuffling and the tier mix."""


class TrainingRun(BaseModel):
    """One training run: settings and its time (passed between tasks)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    settings: TrainingSettings
    now: datetime
    interval_key: str


# -- run time -----------------------------------------------------------------------------------


def run_time(
    data_interval_start: datetime | None,
    data_interval_end: datetime | None,
    logical_date: datetime | None,
    run_after: datetime | None,
    run_id: str,
) -> tuple[datetime, str]:
    """The time a run works for and a file-name-safe key of it.

    Scheduled runs use their data interval's end, so a re-run of an interval plans for the same
    moment and reuses its files. Manual and asset-triggered runs can have no interval: they use
    the logical date, else the time the run was queued for, and are keyed by their run id.
    """
    import pandas as pd

    if data_interval_end is not None:
        now = pd.Timestamp(data_interval_end)
        start = pd.Timestamp(data_interval_start or data_interval_end)
        key = f"{_stamp(start)}_{_stamp(now)}"
    else:
        chosen = logical_date or run_after
        now = pd.Timestamp(chosen) if chosen is not None else pd.Timestamp.now(tz="UTC")
        key = "run_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id).strip("_")
    if now.tzinfo is None:
        now = now.tz_localize("UTC")
    now = now.tz_convert("UTC").floor("s")
    return now.to_pydatetime(), key


def _stamp(ts: pd.Timestamp) -> str:
    if ts.tzinfo is None:
        ts = ts.tz_localize("UTC")
    return str(ts.tz_convert("UTC").strftime("%Y%m%dT%H%M%SZ"))


def load_log(source: LogSource, now: datetime) -> InteractionDataset:
    """The interaction log strictly before ``now`` (aligned to ``now`` when asked)."""
    import pandas as pd

    from solaris_feast.data.schema import EVENT_TIMESTAMP

    dataset = aligned_log(source, now)
    log = dataset.interactions
    log = log.loc[log[EVENT_TIMESTAMP] < pd.Timestamp(now)].reset_index(drop=True)
    return dataset.with_interactions(log)


def aligned_log(source: LogSource, now: datetime) -> InteractionDataset:
    """The whole recorded log, shifted so that its held-out tail starts at ``now``.

    With ``holdout_fraction`` 0 its newest event lies one second before ``now``; otherwise the
    first held-out event lies at or after ``now``, and the held-out impressions are the future a
    replay serves.
    """
    import pandas as pd

    from solaris_feast.data.datasets import load_dataset
    from solaris_feast.data.schema import EVENT_TIMESTAMP

    dataset = load_dataset(source.dataset, source.dataset_size, source.dataset_seed)
    log = dataset.interactions
    if not source.align_log_to_run or log.empty:
        return dataset
    ts = log[EVENT_TIMESTAMP]
    at = pd.Timestamp(now)
    if source.holdout_fraction > 0:
        cut = ts.min() + (ts.max() - ts.min()) * (1.0 - source.holdout_fraction)
        past_end = ts[ts < cut].max()
    else:
        past_end = ts.max()
    # Newest past event one second before `now`; whole seconds keep the shift exact.
    shift = (at - pd.Timedelta(seconds=1) - past_end).floor("s")
    return dataset.with_interactions(log.assign(**{EVENT_TIMESTAMP: ts + shift}))


# -- training: FM, then compressor, then VM -----------------------------------------------------


def start_training(settings: Mapping[str, Any], interval: Mapping[str, Any]) -> dict[str, Any]:
    """Validate the DAG's params and fix the run's time; the spec every stage reads."""
    now, key = run_time(**interval)
    spec = TrainingRun(
        settings=TrainingSettings.model_validate(dict(settings)), now=now, interval_key=key
    )
    Path(spec.settings.models_dir).mkdir(parents=True, exist_ok=True)
    return spec.model_dump(mode="json")


def _stage_marker(spec: TrainingRun, stage: str) -> Path:
    return Path(spec.settings.models_dir) / TRAINING_MARKERS_SUBDIR / spec.interval_key / stage


def _registered_earlier(spec: TrainingRun, stage: str) -> ModelCard | None:
    """The card a previous attempt of this stage registered for the same run, if any."""
    from solaris_feast.models.registry import CARD_SUFFIX, read_card

    marker = _stage_marker(spec, stage)
    if not marker.is_file():
        return None
    card_path = Path(spec.settings.models_dir) / f"{marker.read_text().strip()}{CARD_SUFFIX}"
    return read_card(card_path) if card_path.is_file() else None


def _remember(spec: TrainingRun, stage: str, card: ModelCard) -> dict[str, Any]:
    marker = _stage_marker(spec, stage)
    marker.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(marker, card.version)
    logger.info("registered %s %s", stage, card.version)
    return _card_summary(card)


def _card_summary(card: ModelCard) -> dict[str, Any]:
    return {
        "version": card.version,
        "kind": card.kind,
        "parents": list(card.parents),
        "metrics": dict(card.metrics),
    }


def _training_inputs(spec: TrainingRun) -> tuple[TrainingData, TrainingConfig]:
    """The window's rows and model inputs, and the training config with the run's epochs.

    Each stage rebuilds them from the log (deterministic for the run's time) rather than
    receiving tensors from the previous task.
    """
    import pandas as pd

    from solaris_feast.models.chain import TrainingConfig, TrainingData

    cfg = spec.settings
    base = TrainingConfig(seed=cfg.seed)
    models = base.models.model_copy(
        update={
            "fm_training": base.models.fm_training.model_copy(update={"epochs": cfg.fm_epochs}),
            "compressor_training": base.models.compressor_training.model_copy(
                update={"epochs": cfg.compressor_epochs}
            ),
            "vm_training": base.models.vm_training.model_copy(update={"epochs": cfg.vm_epochs}),
        }
    )
    config = base.model_copy(update={"models": models})
    now = pd.Timestamp(spec.now)
    data = TrainingData.build(
        load_log(cfg, spec.now),
        config.models.history_len,
        window_start=now - pd.Timedelta(hours=cfg.train_window_hours),
        window_end=now,
    )
    return data, config


def train_foundation_stage(run: Mapping[str, Any]) -> dict[str, Any]:
    """Train the FM on the run's window and register its card (the first stage)."""
    from solaris_feast.models.chain import fit_foundation

    spec = TrainingRun.model_validate(dict(run))
    earlier = _registered_earlier(spec, "fm")
    if earlier is not None:
        return _card_summary(earlier)
    data, config = _training_inputs(spec)
    card = fit_foundation(data, Path(spec.settings.models_dir), config)
    return _remember(spec, "fm", card)


def train_compressor_stage(run: Mapping[str, Any], fm_version: str) -> dict[str, Any]:
    """Train the compressor on the registered FM's representations and register it."""
    from solaris_feast.models.chain import fit_compressor
    from solaris_feast.models.registry import card_by_version

    spec = TrainingRun.model_validate(dict(run))
    earlier = _registered_earlier(spec, "compressor")
    if earlier is not None:
        return _card_summary(earlier)
    models_dir = Path(spec.settings.models_dir)
    data, config = _training_inputs(spec)
    card = fit_compressor(data, models_dir, card_by_version(models_dir, fm_version), config)
    return _remember(spec, "compressor", card)


def train_vertical_stage(run: Mapping[str, Any], compressor_version: str) -> dict[str, Any]:
    """Train the VM (the verifier) on the serving tier mix of ``z`` and register it."""
    from solaris_feast.models.chain import fit_vertical
    from solaris_feast.models.registry import card_by_version

    spec = TrainingRun.model_validate(dict(run))
    earlier = _registered_earlier(spec, "vm")
    if earlier is not None:
        return _card_summary(earlier)
    models_dir = Path(spec.settings.models_dir)
    data, config = _training_inputs(spec)
    card = fit_vertical(data, models_dir, card_by_version(models_dir, compressor_version), config)
    return _remember(spec, "vm", card)


# -- precompute -----------------------------------------------------------------------------------


def start_precompute(settings: Mapping[str, Any], interval: Mapping[str, Any]) -> dict[str, Any]:
    """Validate the params, pick the newest registered models and open the run folder.

    The folder is keyed by the interval and the VM version: a re-run of the interval with the
    same models finds its earlier files; a new model version starts a full re-plan.
    """
    from solaris_feast.errors import ConfigError
    from solaris_feast.models.cards import newest_chain

    cfg = PrecomputeSettings.model_validate(dict(settings))
    now, key = run_time(**interval)
    models_dir = Path(cfg.models_dir)
    chain = newest_chain(models_dir) if models_dir.is_dir() else None
    if chain is None or chain.vm is None:
        raise ConfigError(
            f"no VM model card in {models_dir}: run the solaris_training DAG (or solaris train)"
        )
    vm = chain.vm
    compressor_version = chain.embedding_version
    runs_dir = Path(cfg.runs_dir) if cfg.runs_dir else Path(cfg.feature_repo) / RUNS_SUBDIR
    run_dir = runs_dir / key / vm.version
    run_dir.mkdir(parents=True, exist_ok=True)
    manifest = run_dir / "manifest.json"
    spec = PrecomputeRun(
        settings=cfg,
        now=now,
        interval_key=key,
        run_dir=str(run_dir),
        vm_version=vm.version,
        fm_version=chain.fm.version,
        embedding_version=compressor_version,
    )
    if not manifest.is_file():
        _write_atomic(manifest, spec.model_dump_json(indent=2))
    logger.info("precompute run %s at %s with %s (%s)", key, now, vm.version, compressor_version)
    return spec.model_dump(mode="json")


def _open_store(settings: PrecomputeSettings) -> FeatureStore:
    from solaris_feast.store.config import open_repo_store

    repo = Path(settings.feature_repo).resolve()
    return open_repo_store(repo, repo / settings.feature_store_yaml)


def drain_miss_queue(run: Mapping[str, Any]) -> dict[str, Any]:
    """Take the queued misses once per run and save them; a retry re-reads the saved ones.

    On Redis the pairs are read through the consumer group ``solaris_precompute`` (consumer: the
    run's interval) and acknowledged only by :func:`publish_coverage`, after the run's writes:
    a run that dies in between leaves them to be claimed by a later run. SQLite has no groups:
    its pairs leave the queue when drained, and are on disk a moment later.
    """
    import pandas as pd

    from solaris_feast.serving.miss_queue import MissQueue
    from solaris_feast.store.config import online_kind

    spec = PrecomputeRun.model_validate(dict(run))
    path = Path(spec.run_dir) / "misses.parquet"
    if path.is_file():
        misses = pd.read_parquet(path)
        return {"misses": len(misses), "reused": True}
    store = _open_store(spec.settings)
    queue = MissQueue.for_store(store)
    limit = spec.settings.max_drained_misses
    if online_kind(store) == "redis" and limit > 0:
        misses = queue.read_group(MISS_QUEUE_GROUP, spec.interval_key, max_pairs=limit)
    else:
        misses = queue.drain(limit)
    _write_parquet_atomic(misses, path)
    logger.info("took %d queued misses", len(misses))
    return {"misses": len(misses), "reused": False}


def _acknowledge_misses(spec: PrecomputeRun, store: FeatureStore) -> int:
    """Acknowledge the run's group-read misses (Redis), now that its writes are done."""
    import pandas as pd

    from solaris_feast.serving.miss_queue import MissQueue

    misses = pd.read_parquet(Path(spec.run_dir) / "misses.parquet")
    if "entry_id" not in misses.columns or misses.empty:
        return 0
    return MissQueue.for_store(store).ack(MISS_QUEUE_GROUP, misses)


def generate_candidate_table(run: Mapping[str, Any]) -> dict[str, Any]:
    """Candidate items for each active user as of the run's time."""
    import pandas as pd

    from solaris_feast.precompute.candidates import CandidateConfig, generate_candidates

    spec = PrecomputeRun.model_validate(dict(run))
    path = Path(spec.run_dir) / "candidates.parquet"
    if path.is_file():
        return {"candidates": len(pd.read_parquet(path, columns=["user_id"])), "reused": True}
    dataset = load_log(spec.settings, spec.now)
    category = "category" if "category" in dataset.item_categorical else None
    if category is None and dataset.item_categorical:
        category = dataset.item_categorical[0]
    config = CandidateConfig(
        candidates_per_user=spec.settings.candidates_per_user,
        category_column=category,
        exclude_seen_items=spec.settings.exclude_seen_items,
    )
    candidates = generate_candidates(
        dataset.interactions, pd.Timestamp(spec.now), config, items=dataset.items
    )
    _write_parquet_atomic(candidates, path)
    users = int(candidates["user_id"].nunique()) if len(candidates) else 0
    logger.info("candidates: %d pairs for %d users", len(candidates), users)
    return {"candidates": len(candidates), "users": users, "reused": False}


def _bundle(spec: PrecomputeRun) -> ModelBundle:
    from solaris_feast.models.registry import load_bundle

    return load_bundle(Path(spec.settings.models_dir), spec.vm_version)


def _verifier_scores(
    bundle: ModelBundle, dataset: InteractionDataset, pairs: pd.DataFrame, now: datetime
) -> pd.DataFrame:
    """``user_id``, ``item_id``, ``verifier_score``: the VM's main-task probability with no
    embedding (the verifier), as of ``now``."""
    import numpy as np
    import pandas as pd
    import torch

    from solaris_feast.models.features import PairFeaturizer
    from solaris_feast.precompute.plan import VERIFIER_SCORE

    users = pairs["user_id"].to_numpy(dtype=np.int64)
    items = pairs["item_id"].to_numpy(dtype=np.int64)
    scores = np.zeros(len(pairs), dtype=np.float64)
    featurizer = PairFeaturizer(dataset, bundle.schema.history_len)
    at = pd.Timestamp(now)
    bundle.vm.eval()
    with torch.inference_mode():
        for lo in range(0, len(pairs), 8192):
            hi = min(lo + 8192, len(pairs))
            batch = featurizer.batch(users[lo:hi], items[lo:hi], at)
            scores[lo:hi] = bundle.vm.verifier_score(batch).numpy()
    return pd.DataFrame({"user_id": users, "item_id": items, VERIFIER_SCORE: scores})


def planning_scores(
    bundle: ModelBundle,
    dataset: InteractionDataset,
    candidates: pd.DataFrame,
    now: datetime,
    retrieval_weight: float,
) -> pd.DataFrame:
    """``user_id``, ``item_id``, ``verifier_score`` of the candidates as the planner ranks them:
    the verifier's probability times the retrieval score
    (:func:`solaris_feast.precompute.plan.request_score`),
    or the verifier alone for a candidate table without ``candidate_score``."""
    from solaris_feast.precompute.candidates import CANDIDATE_SCORE
    from solaris_feast.precompute.plan import VERIFIER_SCORE, request_score

    scored = _verifier_scores(bundle, dataset, candidates, now)
    if CANDIDATE_SCORE in candidates.columns:
        scored[VERIFIER_SCORE] = request_score(
            scored["user_id"].to_numpy(),
            scored[VERIFIER_SCORE].to_numpy(),
            candidates[CANDIDATE_SCORE].to_numpy(dtype="float64"),
            retrieval_weight,
        )
    return scored


def plan_run(run: Mapping[str, Any]) -> dict[str, Any]:
    """Score candidates and misses with the verifier, plan under the budget, persist the plan.

    Returns the plan's stats and ``shard_indexes`` for the mapped precompute tasks.
    """
    import pandas as pd

    from solaris_feast.precompute.plan import plan_precompute, read_plan, write_plan

    spec = PrecomputeRun.model_validate(dict(run))
    cfg = spec.settings
    plan_dir = Path(spec.run_dir) / "plan"
    shard_indexes = list(range(cfg.shards))
    if (plan_dir / "plan.json").is_file():
        plan = read_plan(plan_dir)
        return {"shard_indexes": shard_indexes, "planned": len(plan), "reused": True}
    dataset = load_log(cfg, spec.now)
    bundle = _bundle(spec)
    candidates = pd.read_parquet(Path(spec.run_dir) / "candidates.parquet")
    misses = pd.read_parquet(Path(spec.run_dir) / "misses.parquet")
    # Only misses of users and items the models know can be scored.
    known = (misses["user_id"] < dataset.num_users) & (misses["item_id"] < dataset.num_items)
    misses = misses.loc[known, ["user_id", "item_id"]].drop_duplicates()
    scored_candidates = planning_scores(bundle, dataset, candidates, spec.now, cfg.retrieval_weight)
    scored_misses = _verifier_scores(bundle, dataset, misses, spec.now) if len(misses) else None
    store = _open_store(cfg)
    ttl = _pair_ttl_seconds(spec, store)
    fresh = read_offline_rows(
        store,
        PAIR_VIEW,
        pd.Timestamp(spec.now) - pd.Timedelta(seconds=ttl),
        pd.Timestamp(spec.now),
        ["user_id", "item_id", "computed_at", "model_version"],
    )
    plan = plan_precompute(
        scored_candidates,
        scored_misses,
        fresh,
        cfg.budget_pairs,
        pd.Timestamp(spec.now),
        ttl,
        min(cfg.refresh_margin_seconds, ttl - 1),
        cfg.min_miss_score,
        model_version=spec.embedding_version,
        user_balanced=cfg.user_balanced_plan,
    )
    # Written to a staging folder and renamed: shards never read half a plan.
    staging = plan_dir.with_name(f".plan.{uuid.uuid4().hex}.tmp")
    write_plan(plan, staging)
    os.replace(staging, plan_dir)
    stats = plan.stats
    return {
        "shard_indexes": shard_indexes,
        "planned": stats.planned,
        "from_misses": stats.from_misses,
        "refreshes": stats.refreshes,
        "new": stats.new,
        "skipped_fresh": stats.skipped_fresh,
        "over_budget": stats.over_budget,
        "reused": False,
    }


def _pair_ttl_seconds(spec: PrecomputeRun, store: FeatureStore) -> int:
    """The planner's TTL: the param, or the pair view's TTL, which serving enforces.

    A param longer than the view's TTL is refused: the planner would skip pairs as fresh that
    the retriever already treats as expired.
    """
    from solaris_feast.errors import ConfigError

    ttl = store.get_feature_view(PAIR_VIEW).ttl
    view_seconds = int(ttl.total_seconds()) if ttl is not None else 0
    if view_seconds <= 0:
        raise ConfigError(f"feature view {PAIR_VIEW} needs a positive ttl")
    wanted = spec.settings.pair_ttl_seconds
    if wanted is None:
        return view_seconds
    if wanted > view_seconds:
        raise ConfigError(
            f"pair_ttl_seconds={wanted} exceeds the {PAIR_VIEW} view's ttl ({view_seconds} s): "
            "pairs the retriever treats as expired would be skipped as fresh"
        )
    return wanted


def precompute_shard(run: Mapping[str, Any], shard_index: int, shard_count: int) -> dict[str, Any]:
    """FM -> compressor -> pair view for shard ``shard_index`` of ``shard_count`` of the plan.

    Idempotent: vectors are computed as of the plan's time and stored with it as
    ``computed_at``, so a retry writes the same rows (same offline file, same online value).
    """
    from solaris_feast.models.features import PairFeaturizer
    from solaris_feast.precompute.compute import run_precompute
    from solaris_feast.precompute.plan import read_plan, shard
    from solaris_feast.store.write import EmbeddingWriter

    spec = PrecomputeRun.model_validate(dict(run))
    _maybe_fail_once(Path(spec.run_dir), shard_index)
    part = shard(read_plan(Path(spec.run_dir) / "plan"), shard_index, shard_count)
    bundle = _bundle(spec)
    dataset = load_log(spec.settings, spec.now)
    featurizer = PairFeaturizer(dataset, bundle.schema.history_len)
    store = _open_store(spec.settings)
    writer = EmbeddingWriter(store, PAIR_VIEW)
    try:
        stats = run_precompute(part, bundle, featurizer, writer, spec.settings.batch_size)
    finally:
        writer.close()
    report = {"shard": shard_index, "of": shard_count, **stats.as_dict()}
    _write_atomic(Path(spec.run_dir) / f"shard-{shard_index}.json", json.dumps(report, indent=2))
    return report


def _maybe_fail_once(run_dir: Path, shard_index: int) -> None:
    wanted = os.environ.get(FAIL_SHARD_ONCE_ENV, "").strip()
    if not wanted or int(wanted) != shard_index:
        return
    marker = run_dir / f"shard-{shard_index}.failed-once"
    if marker.exists():
        return
    marker.write_text("failed once on purpose; the retry proceeds\n")
    raise ShardFailureInjected(
        f"shard {shard_index} fails once ({FAIL_SHARD_ONCE_ENV} is set): retry it"
    )


def aggregate_users(run: Mapping[str, Any]) -> dict[str, Any]:
    """Each user's mean exact vector over the window, written to the user view.

    A pair computed several times counts once (newest vector), and the rows carry the run's time,
    so a re-run writes the same rows: nothing is counted twice.
    """
    from solaris_feast.store.write import EmbeddingWriter

    spec = PrecomputeRun.model_validate(dict(run))
    store = _open_store(spec.settings)
    rows = _user_aggregate_rows(spec, store)
    writer = EmbeddingWriter(store, USER_VIEW)
    try:
        report = writer.write(rows)
    finally:
        writer.close()
    return {
        "users": len(rows),
        "online_applied": report.online_applied,
        "offline_files_written": report.offline_files_written,
    }


def _user_aggregate_rows(spec: PrecomputeRun, store: FeatureStore) -> pd.DataFrame:
    import pandas as pd

    from solaris_feast.precompute.aggregate import AggregateConfig, aggregate_user_embeddings

    window = spec.settings.aggregate_window_seconds
    now = pd.Timestamp(spec.now)
    exact = read_offline_rows(store, PAIR_VIEW, now - pd.Timedelta(seconds=window), now)
    return aggregate_user_embeddings(
        exact, now, spec.embedding_version, AggregateConfig(window_seconds=window)
    )


def fill_similar(run: Mapping[str, Any]) -> dict[str, Any]:
    """Fill over-budget and missed pairs from the nearest users' exact vectors (faiss KNN over
    the user aggregates) and write them to the similar view."""
    import numpy as np
    import pandas as pd

    from solaris_feast.precompute.aggregate import PairEmbeddings
    from solaris_feast.precompute.plan import read_plan
    from solaris_feast.precompute.similarity import (
        SimilarityConfig,
        build_user_index,
        similarity_fill,
    )
    from solaris_feast.store.write import EmbeddingWriter

    spec = PrecomputeRun.model_validate(dict(run))
    cfg = spec.settings
    store = _open_store(cfg)
    now = pd.Timestamp(spec.now)
    ttl = _pair_ttl_seconds(spec, store)
    plan = read_plan(Path(spec.run_dir) / "plan")
    misses = pd.read_parquet(Path(spec.run_dir) / "misses.parquet")
    targets = pd.concat(
        [
            plan.uncovered[["user_id", "item_id"]].head(cfg.fill_targets),
            misses[["user_id", "item_id"]],
        ],
        ignore_index=True,
    ).drop_duplicates()
    user_rows = _user_aggregate_rows(spec, store)
    exact = read_offline_rows(store, PAIR_VIEW, now - pd.Timedelta(seconds=ttl), now)
    if len(targets) == 0 or len(user_rows) < 2 or len(exact) == 0:
        logger.info("similarity fill: nothing to fill (%d targets)", len(targets))
        return {"targets": len(targets), "filled": 0}
    similarity = SimilarityConfig(neighbours=cfg.similar_neighbours)
    index = build_user_index(
        user_rows["user_id"].to_numpy(dtype=np.int64),
        np.stack(user_rows["embedding"].to_list()).astype(np.float32),
        similarity,
    )
    fill = similarity_fill(
        index,
        targets,
        PairEmbeddings.from_frame(exact),
        now,
        spec.embedding_version,
        ttl,
        similarity,
    )
    writer = EmbeddingWriter(store, SIMILAR_VIEW)
    try:
        report = writer.write(fill)
    finally:
        writer.close()
    return {
        "targets": len(targets),
        "filled": len(fill),
        "online_applied": report.online_applied,
        "offline_files_written": report.offline_files_written,
    }


def publish_coverage(run: Mapping[str, Any]) -> dict[str, Any]:
    """Share of this round's pairs (candidates and queued misses) each tier would serve now.

    Written to ``coverage.json`` in the run folder and logged in one line. Tiers are resolved
    as the retriever does: exact > similar > user aggregate > zero, only vectors of the run's
    embedding version within their TTL.
    """
    import numpy as np
    import pandas as pd

    from solaris_feast.tiers import Tier

    spec = PrecomputeRun.model_validate(dict(run))
    store = _open_store(spec.settings)
    now = pd.Timestamp(spec.now)
    run_dir = Path(spec.run_dir)
    pool = pd.concat(
        [
            pd.read_parquet(run_dir / "candidates.parquet", columns=["user_id", "item_id"]),
            pd.read_parquet(run_dir / "misses.parquet", columns=["user_id", "item_id"]),
        ],
        ignore_index=True,
    ).drop_duplicates()
    tiers = np.full(len(pool), int(Tier.ZERO), dtype=np.int64)
    for tier, view in (
        (Tier.USER_AGG, USER_VIEW),
        (Tier.SIMILAR, SIMILAR_VIEW),
        (Tier.EXACT, PAIR_VIEW),
    ):
        ttl = store.get_feature_view(view).ttl
        seconds = ttl.total_seconds() if ttl is not None else 0.0
        rows = read_offline_rows(store, view, now - pd.Timedelta(seconds=seconds), now, None)
        rows = rows.loc[rows["model_version"] == spec.embedding_version]
        keys = ["user_id"] if view == USER_VIEW else ["user_id", "item_id"]
        present = pool[keys].merge(
            rows[keys].drop_duplicates(), on=keys, how="left", indicator=True
        )
        hit = (present["_merge"] == "both").to_numpy()
        tiers[hit] = int(tier)  # later (better) tiers overwrite earlier ones
    total = len(pool)
    names = {Tier.EXACT: "exact", Tier.SIMILAR: "similar", Tier.USER_AGG: "user", Tier.ZERO: "zero"}
    coverage = {
        names[t]: (float(np.count_nonzero(tiers == int(t))) / total if total else 0.0) for t in Tier
    }
    # This run's shard count: a re-run with fewer shards leaves older reports beside them.
    shards = [
        json.loads((run_dir / f"shard-{i}.json").read_text())
        for i in range(spec.settings.shards)
        if (run_dir / f"shard-{i}.json").is_file()
    ]
    report = {
        "interval": spec.interval_key,
        "now": pd.Timestamp(spec.now).isoformat(),
        "vm_version": spec.vm_version,
        "embedding_version": spec.embedding_version,
        "pairs": total,
        "coverage": coverage,
        "any_tier": 1.0 - coverage["zero"] if total else 0.0,
        "fm_pairs": int(sum(int(s["pairs"]) for s in shards)),
        "plan": json.loads((run_dir / "plan" / "plan.json").read_text())["stats"],
        "shards": shards,
    }
    _write_atomic(run_dir / "coverage.json", json.dumps(report, indent=2))
    acknowledged = _acknowledge_misses(spec, store)
    retagged = tag_views_with_versions(store, spec)
    logger.info(
        "coverage %s: exact=%.3f similar=%.3f user=%.3f zero=%.3f over %d pairs (%s)",
        spec.interval_key,
        coverage["exact"],
        coverage["similar"],
        coverage["user"],
        coverage["zero"],
        total,
        spec.embedding_version,
    )
    return {
        "coverage": coverage,
        "pairs": total,
        "misses_acknowledged": acknowledged,
        "views_retagged": retagged,
        "path": str(run_dir / "coverage.json"),
    }


def tag_views_with_versions(store: FeatureStore, spec: PrecomputeRun) -> list[str]:
    """Set the views' ``solaris.*_version`` tags to the models of this run's vectors.

    Lineage review traces a served vector through these tags to the FM, compressor and verifier
    cards; they change (one registry update) only when a run writes with new models.
    """
    from solaris_feast.store.tags import (
        TAG_COMPRESSOR_VERSION,
        TAG_FM_VERSION,
        TAG_VERIFIER_VERSION,
    )

    wanted = {
        TAG_FM_VERSION: spec.fm_version,
        TAG_COMPRESSOR_VERSION: spec.embedding_version,
        TAG_VERIFIER_VERSION: spec.vm_version,
    }
    changed: list[Any] = []  # FeatureStore.apply takes a list of any Feast object
    for name in (PAIR_VIEW, USER_VIEW, SIMILAR_VIEW):
        view = store.get_feature_view(name)
        if any(view.tags.get(k) != v for k, v in wanted.items()):
            view.tags.update(wanted)
            changed.append(view)
    # The resolved on-demand view reads the three views: it carries the compressor's version.
    compressor_tag = TAG_COMPRESSOR_VERSION
    for resolved in store.list_on_demand_feature_views():
        if resolved.name == RESOLVED_VIEW and resolved.tags.get(compressor_tag) != (
            spec.embedding_version
        ):
            resolved.tags[compressor_tag] = spec.embedding_version
            changed.append(resolved)
    if changed:
        store.apply(changed)
        logger.info("views %s now tagged %s", [v.name for v in changed], wanted)
    return [v.name for v in changed]


# -- offline store reads ----------------------------------------------------------------------


def offline_view_root(store: FeatureStore, view_name: str) -> Path:
    """Folder of a view's parquet log (its FileSource path, relative to the repo)."""
    path = Path(store.get_feature_view(view_name).batch_source.path)  # type: ignore[union-attr]
    if not path.is_absolute() and store.config.repo_path is not None:
        path = Path(store.config.repo_path) / path
    return path


def read_offline_rows(
    store: FeatureStore,
    view_name: str,
    start: pd.Timestamp,
    end: pd.Timestamp,
    columns: list[str] | None = None,
) -> pd.DataFrame:
    """Rows of a view's offline log with ``computed_at`` in ``(start, end]``.

    Only the day folders the window touches are read (the writer files rows under the UTC day
    of their ``computed_at``).
    """
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = offline_view_root(store, view_name)
    days = pd.date_range(start.floor("D"), end.floor("D"), freq="D")
    files = [
        f for day in days for f in sorted((root / day.strftime("%Y-%m-%d")).glob("part-*.parquet"))
    ]
    wanted = None if columns is None else sorted(set(columns) | {"computed_at"})
    tables = [pq.read_table(f, columns=wanted) for f in files]
    if not tables:
        view = store.get_feature_view(view_name)
        every = [*view.join_keys, *(f.name for f in view.features)]
        return pd.DataFrame(columns=every if columns is None else columns)
    frame = pa.concat_tables(tables, promote_options="default").to_pandas()
    at = pd.to_datetime(frame["computed_at"], utc=True)
    frame = frame.loc[(at > start) & (at <= end)].reset_index(drop=True)
    return frame if columns is None else frame[columns]


def offline_row_count(store: FeatureStore, view_name: str) -> int:
    """Rows in a view's whole offline log (a re-run must not change it)."""
    import pyarrow.parquet as pq

    root = offline_view_root(store, view_name)
    return sum(pq.ParquetFile(f).metadata.num_rows for f in root.glob("*/part-*.parquet"))


# -- files ------------------------------------------------------------------------------------


def _write_atomic(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    temp.write_text(text)
    os.replace(temp, path)


def _write_parquet_atomic(frame: pd.DataFrame, path: Path) -> None:
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    frame.to_parquet(temp, index=False)
    os.replace(temp, path)
