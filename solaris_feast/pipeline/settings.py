"""Settings of the precompute and training runs, and the Airflow params generated from them.

The pydantic models here are the one statement of every setting: its name, type, default,
bounds and description. The DAG files build their ``Param`` objects from
:func:`dag_param_schemas` instead of restating them, so a default or a bound changed here is
changed in the DAG's trigger form too. Deployment defaults taken from the environment
(``SOLARIS_FEATURE_REPO``, ``SOLARIS_MODELS_DIR``, ``SOLARIS_FEATURE_STORE_YAML``,
``SOLARIS_RUNS_DIR``) are applied in one place, :func:`deployment_defaults`.

Cost: this module imports pydantic only (no pandas, torch, feast or airflow), because the DAG
files import it while the scheduler parses them; ``tests/test_dags.py`` checks that.
"""

from __future__ import annotations

import os
import types
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.fields import FieldInfo

from solaris_feast.data.log_source import CandidateTableConfig, InteractionLogConfig
from solaris_feast.models.spec import ModelChoice
from solaris_feast.store.layout import (
    DEFAULT_ATOMIC_ROWS,
    DEFAULT_EMBEDDING_CODEC,
    DEFAULT_TRANSACTIONS_IN_FLIGHT,
    EmbeddingCodecName,
)

DEFAULT_BATCH_SIZE = 1024
"""Pairs per FM forward pass and per write of a precompute round. The reference FM runs 16% slower
a pair at 4,096 (measured 2026-12-04)."""

PAIR_VIEW = "solaris_pair"
USER_VIEW = "solaris_user"
SIMILAR_VIEW = "solaris_similar"
RESOLVED_VIEW = "solaris_resolved"
SOLARIS_VIEWS = (PAIR_VIEW, USER_VIEW, SIMILAR_VIEW)
"""The default names of the feature views a precompute run reads and writes (those of
``SolarisFeastConfig``); a repo that registered its own names is read under those, found by the
views' tier tags (``RegistrySnapshot.name_of``)."""
DEFAULT_VIEW_NAMES = {
    "EXACT": PAIR_VIEW,
    "SIMILAR": SIMILAR_VIEW,
    "USER_AGG": USER_VIEW,
    "RESOLVED": RESOLVED_VIEW,
}

ENVIRONMENT_DEFAULTS: Mapping[str, str] = {
    "feature_repo": "SOLARIS_FEATURE_REPO",
    "models_dir": "SOLARIS_MODELS_DIR",
    "feature_store_yaml": "SOLARIS_FEATURE_STORE_YAML",
    "runs_dir": "SOLARIS_RUNS_DIR",
}
"""Settings whose DAG default comes from an environment variable of the scheduler, when set."""

NOT_DAG_PARAMS: frozenset[str] = frozenset(
    {"holdout_fraction", "log", "candidates", "fm", "verifier"}
)
"""Settings that are not DAG params: the held-out tail of a log is the demo's replay, never a
scheduled run's; the user's log, candidate tables and models come from the config file
(:mod:`solaris_feast.config`), not from a trigger form."""

# Field docstrings become descriptions, so the DAG's trigger form shows the same text.
_CONFIG = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class LogSource(BaseModel):
    """Where the interaction log comes from: the user's log (``log``), else a named data set."""

    model_config = _CONFIG

    log: InteractionLogConfig | None = None
    """The user's log (the config file's log section); null: the named data set below. A user's
    log is live: it is never aligned nor held out."""
    dataset: Literal["synthetic", "movielens"] = "synthetic"
    """Named data set (see solaris_feast.data.datasets.load_dataset)."""
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
    after the run's time, to be served and scored by a replay (solaris demo)."""


DEFAULT_RETURN_WEIGHT_EXPONENT = 3.0
"""The planner's user weight (:mod:`solaris_feast.precompute.returns`) is (expected events within
the pair TTL / the most) ** 3. Chosen on held-out seeds of the funnel world (100-104, never the
published 0-9) and the synthetic log replay, both budget readings, among horizons of an hour and
of the pair TTL and exponents 1 to 6: the largest funnel hit rate that costs the log replay none
(an hour's horizon with exponent 3 cost the replay's kept-fresh reading 0.218 -> 0.147;
``benchmarks/README.md``)."""


DEFAULT_AGGREGATE_WINDOW_SECONDS = 86_400
"""Window of the user-only aggregate: the pairs computed in the last day."""

DEFAULT_FILL_TARGETS_PER_BUDGET = 1.0
"""Fill targets per round, as a multiple of the pairs the round planned for the FM (the best
uncovered pairs first; queued misses come on top). Every published replay and funnel figure was
measured at 1. On the funnel's validation seeds (100-104, 10 % budget) more targets move served
rows from the user aggregate to the similarity tier and lower the final-stage NE further
(``benchmarks/README.md``, "How many pairs to fill"), at a fill cost that grows with them."""


class PrecomputeSettings(LogSource):
    """What the precompute DAG's params validate into."""

    feature_repo: str = Field(min_length=1)
    """Feast repo folder (holds feature_store.yaml; SQLite or Redis online store)."""
    models_dir: str = Field(min_length=1)
    """Model registry folder; the serving chain is the promoted one (solaris promote), else
    the newest VM's, with its compressor and FM."""
    serving_vm: str = ""
    """VM version of the serving chain; empty: the registry's serving alias (solaris promote),
    else the newest VM."""
    device: str = Field("auto", min_length=1)
    """Where the reference FM and VM run: auto (CUDA when the worker has it), cpu, cuda, cuda:N.
    A model of your own places itself."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """fp32, or bf16 autocast of the reference models' forward passes (z is stored float32)."""
    feature_store_yaml: str = Field("feature_store.yaml", min_length=1)
    """Config file inside feature_repo; feature_store.redis.yaml for Redis (its connection comes
    from SOLARIS_REDIS_CONNECTION, else from REDIS_URL)."""
    runs_dir: str = ""
    """Folder of the per-run files; empty: <feature_repo>/data/precompute_runs."""
    budget_pairs: int = Field(20_000, ge=0)
    """Most pairs the FM computes per run."""
    shards: int = Field(4, ge=1, le=1024)
    """Parallel precompute tasks (dynamic task mapping)."""
    candidates_per_user: int = Field(200, gt=0)
    """Candidate items per active user."""
    candidates: CandidateTableConfig | None = None
    """The user's candidate table per round; null: the built-in generators."""
    exclude_seen_items: bool = False
    """Never offer a user an item they have met before (logs where a pair does not recur, such
    as ratings)."""
    pair_ttl_seconds: int | None = Field(None, gt=0)
    """TTL the planner assumes for exact vectors; null: the pair view's TTL in the registry."""
    refresh_margin_seconds: int = Field(1800, ge=0)
    """A stored vector that expires within this margin is computed again."""
    allow_expired_rounds: bool = False
    """Run a round dated further back than the pair TTL (a backfill, a replay of a recorded
    log); off: such a round is refused, since its exact vectors expire before they are written."""
    min_miss_score: float = Field(0.05, ge=0.0, le=1.0)
    """Queued misses scoring at least this go before every candidate."""
    user_balanced_plan: bool = False
    """Spread the budget over users (each user's best pair first, then second best, ...)
    instead of taking the globally highest scores."""
    retrieval_weight: float = Field(1.0, ge=0.0)
    """Candidates are planned by verifier x (candidate_score / user's best) ** weight; 0 plans by
    the VM's score alone, as does a candidate table without a candidate_score column."""
    return_weight_exponent: float = Field(DEFAULT_RETURN_WEIGHT_EXPONENT, ge=0.0)
    """Weigh each candidate by (its user's expected events within the horizon / the most any
    user has) ** exponent, learned from the round's log window by the time since the user's
    last event and their events in the last day (solaris_feast/precompute/returns.py); 0: every
    user weighs alike."""
    return_horizon_seconds: int | None = Field(None, gt=0)
    """The horizon of that weight; null: the pair TTL, the time a vector computed now serves."""
    max_drained_misses: int = Field(100_000, ge=0)
    """Most queued misses taken off the queue per run."""
    aggregate_window_seconds: int = Field(DEFAULT_AGGREGATE_WINDOW_SECONDS, gt=0)
    """Window of the user-only aggregate."""
    fill_targets_per_budget: float = Field(DEFAULT_FILL_TARGETS_PER_BUDGET, ge=0.0)
    """Over-budget pairs (highest verifier score first) given to the similarity fill, besides
    the queued misses, as a multiple of the pairs the round planned for the FM, so the fill
    grows with the budget; 0: the queued misses only."""
    fill_targets: int | None = Field(None, ge=0)
    """At most this many of those pairs; null: no cap."""
    similar_neighbours: int = Field(10, gt=0)
    """k of the similarity fill."""
    embedding_codec: EmbeddingCodecName = DEFAULT_EMBEDDING_CODEC
    """How the views store embeddings online: float32 (exact), float16 or int8 (quantized Feast
    bytes, less Redis memory; bytes per pair and NE cost in benchmarks/README.md). The views
    must be applied with the same codec (SOLARIS_EMBEDDING_CODEC, or this config when feast
    apply runs); a run refuses a mismatch."""
    batch_size: int = Field(DEFAULT_BATCH_SIZE, gt=0)
    """Pairs per FM forward pass and per write (a write is sent in transactions of
    ``write_transaction_rows``)."""
    write_transaction_rows: int = Field(DEFAULT_ATOMIC_ROWS, gt=0)
    """Rows per Redis MULTI/EXEC of the round's writes: each is all-or-nothing, and Redis answers
    no serving read while one runs. At the default, about 2 ms a transaction and serving p99
    during writes 1.2x its figure without them, against 9 ms and 3x at 1,024 rows, for the same
    writer rows/s (Redis on loopback, benchmarks/README.md, soak). A store far enough away that
    a transaction's round trip counts may want more."""
    write_transactions_in_flight: int = Field(DEFAULT_TRANSACTIONS_IN_FLIGHT, gt=0)
    """Transactions of a write sent before the first one's answers are read. At the default, a
    Redis 0.5-2 ms away takes a round's rows 1.5-1.6x as fast as with 1 (4: 1.9-2.1x), for
    serving p99 during writes 1.7-1.9x its figure without them instead of 1.4-1.5x on loopback
    (benchmarks/README.md, write_distance and soak); 1 where the store is next to the workers
    and serving's tail matters most, more where it is far."""

    @model_validator(mode="after")
    def _margin_below_ttl(self) -> PrecomputeSettings:
        if self.pair_ttl_seconds is not None and self.refresh_margin_seconds >= (
            self.pair_ttl_seconds
        ):
            raise ValueError("refresh_margin_seconds must be below pair_ttl_seconds")
        return self


class PrecomputeRun(BaseModel):
    """One precompute run: settings, its time and the models it uses (passed between tasks)."""

    model_config = _CONFIG

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
    """The compressor's version, stored beside every vector as model_version."""
    ticks: dict[str, Any] | None = None
    """A scheduled round's place on its cron (skipped ticks, late start), from
    :func:`solaris_feast.pipeline.runs.round_ticks`; None for a manual or asset-triggered one."""
    takes_misses: bool = True
    """The round answers the miss queue (:func:`solaris_feast.pipeline.runs.takes_live_misses`:
    False for a backfill, a scheduled run cleared after a later round started, or a round for
    a moment well before its start)."""
    first_round: bool = False
    """No earlier round of these settings' runs folder had published its coverage when this one
    started (:func:`solaris_feast.pipeline.runs.earlier_round_published`): the offline logs
    may not exist yet, and their absence is said at INFO, not as a warning. False in a
    manifest written before the field existed, so those warn as they did."""


class TrainingSettings(LogSource):
    """What the training DAG's params validate into."""

    models_dir: str = Field(min_length=1)
    """Model registry folder the cards and weights are written to."""
    train_window_hours: float = Field(72.0, gt=0)
    """Train on the log's last train_window_hours before the run's time."""
    fm_epochs: int = Field(3, gt=0)
    """Passes of the FM over the window."""
    compressor_epochs: int = Field(2, gt=0)
    """Passes of the compressor over the window."""
    vm_epochs: int = Field(2, gt=0)
    """Passes of the VM over the window."""
    device: str = Field("auto", min_length=1)
    """Where the FM, compressor and VM train: auto (CUDA when the worker has it, else the CPU),
    cpu, cuda or cuda:N."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """fp32, or bf16 autocast of the forward passes (a GPU's fast path)."""
    code_dim: int = Field(32, gt=0)
    """Width of the compressed z the compressor writes: the pair views' embedding_dim, at most
    the FM's representation width."""
    seed: int = 0
    """Seeds initialisation, shuffling and the tier mix."""
    fm: ModelChoice = "reference"
    """The FM: reference (trained) or the deployment's own entry point (registered)."""
    verifier: ModelChoice = "reference"
    """The verifier: reference (the VM, trained) or the deployment's own entry point."""


class TrainingRun(BaseModel):
    """One training run: settings and its time (passed between tasks)."""

    model_config = _CONFIG

    settings: TrainingSettings
    now: datetime
    interval_key: str


class TaskPolicy(BaseModel):
    """How Airflow runs a DAG's tasks: their time limit and their retries.

    Read when the DAG file is parsed (an Airflow task's ``execution_timeout`` and ``retries``
    are part of the DAG, not of a run): from the config file's ``airflow`` section when
    ``SOLARIS_CONFIG`` is set, else these defaults. A task past its timeout is killed and
    retried like a retryable error; a final error (:mod:`solaris_feast.pipeline.failures`)
    fails at once whatever ``retries`` says.
    """

    model_config = _CONFIG

    task_timeout_seconds: int = Field(900, gt=0)
    """execution_timeout of each task (but the precompute's FM shards): a hung store read or a
    stuck worker ends the try after this long instead of holding the run."""
    retries: int = Field(2, ge=0)
    """Tries after the first for a retryable error (a store that is down, a timeout)."""
    retry_delay_seconds: int = Field(60, ge=0)
    """Base wait before a retry: with a backoff above 1 Airflow waits between it and twice it
    (a per-task jitter), each next retry retry_exponential_backoff times longer."""
    retry_exponential_backoff: float = Field(2.0, ge=1.0)
    """Factor between two retry delays (1: a constant delay)."""
    max_retry_delay_seconds: int = Field(600, ge=0)
    """Longest wait between two tries."""


class PrecomputeTaskPolicy(TaskPolicy):
    """The precompute DAG's tasks (an hourly round: minutes per task)."""

    shard_timeout_seconds: int = Field(3600, gt=0)
    """execution_timeout of one shard's long tasks (rank_shard: candidates and verifier;
    precompute_shard: the FM), the round's heavy work."""


class TrainingTaskPolicy(TaskPolicy):
    """The training DAG's stages (hours per stage on a large log)."""

    task_timeout_seconds: int = Field(4 * 3600, gt=0)
    """execution_timeout of each training stage (FM, compressor, VM) and of start."""
    retries: int = Field(1, ge=0)
    """Tries after the first for a retryable error."""
    retry_delay_seconds: int = Field(300, ge=0)
    """Wait before the first retry."""
    max_retry_delay_seconds: int = Field(3600, ge=0)
    """Longest wait between two tries."""


def airflow_task_args(policy: TaskPolicy) -> dict[str, Any]:
    """The DAG's ``default_args`` from a policy (``timedelta`` values, as Airflow wants)."""
    from datetime import timedelta

    return {
        "execution_timeout": timedelta(seconds=policy.task_timeout_seconds),
        "retries": policy.retries,
        "retry_delay": timedelta(seconds=policy.retry_delay_seconds),
        "retry_exponential_backoff": policy.retry_exponential_backoff,
        "max_retry_delay": timedelta(seconds=policy.max_retry_delay_seconds),
    }


# -- DAG params ---------------------------------------------------------------------------------


def deployment_defaults(repo_root: Path) -> dict[str, str]:
    """Defaults of the path settings for DAGs shipped in ``repo_root``: the environment's
    values (:data:`ENVIRONMENT_DEFAULTS`) where set, else the repository's own folders."""
    fallbacks = {
        "feature_repo": str(repo_root / "feature_repo"),
        "models_dir": str(repo_root / "models"),
        "feature_store_yaml": "feature_store.yaml",
        "runs_dir": "",
    }
    return {
        name: os.environ.get(variable) or fallbacks[name]
        for name, variable in ENVIRONMENT_DEFAULTS.items()
    }


def dag_param_schemas(
    model: type[BaseModel],
    defaults: Mapping[str, Any] | None = None,
    exclude: Iterable[str] = NOT_DAG_PARAMS,
) -> dict[str, dict[str, Any]]:
    """Keyword arguments of one Airflow ``Param`` per field of ``model``, in field order.

    Each holds ``default`` (from ``defaults`` where given, else the field's), ``description``
    (the field's docstring) and the JSON schema of the field: ``type`` (a list with ``"null"``
    for an optional field), ``enum`` for a ``Literal``, ``minimum`` / ``exclusiveMinimum`` /
    ``maximum`` / ``exclusiveMaximum`` from ``Field(ge=, gt=, le=, lt=)`` and ``minLength``.
    A field without a default needs one in ``defaults``: a DAG param must have a value.
    """
    given = dict(defaults or {})
    skipped = set(exclude)
    unknown = set(given) - set(model.model_fields)
    if unknown:
        raise ValueError(f"defaults for unknown {model.__name__} fields: {sorted(unknown)}")
    schemas: dict[str, dict[str, Any]] = {}
    for name, info in model.model_fields.items():
        if name in skipped:
            continue
        if name in given:
            default = given[name]
        elif info.is_required():
            raise ValueError(f"{model.__name__}.{name} has no default: pass one in defaults")
        else:
            default = info.get_default(call_default_factory=True)
        schemas[name] = {
            "default": default,
            "description": " ".join((info.description or "").split()) or None,
            **_json_schema_of(f"{model.__name__}.{name}", info),
        }
    return schemas


_JSON_TYPES: Mapping[type, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}
_BOUNDS: Mapping[type, tuple[str, str]] = {
    annotated_types.Ge: ("ge", "minimum"),
    annotated_types.Gt: ("gt", "exclusiveMinimum"),
    annotated_types.Le: ("le", "maximum"),
    annotated_types.Lt: ("lt", "exclusiveMaximum"),
    annotated_types.MinLen: ("min_length", "minLength"),
}


def _json_schema_of(where: str, info: FieldInfo) -> dict[str, Any]:
    """The JSON schema Airflow validates a param with, from a field's annotation and bounds."""
    annotation = info.annotation
    nullable = False
    if get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        nullable = len(members) < len(get_args(annotation))
        if len(members) != 1:
            raise TypeError(f"{where}: only X | None unions become params, not {annotation}")
        annotation = members[0]
    schema: dict[str, Any] = {}
    if get_origin(annotation) is Literal:
        choices = list(get_args(annotation))
        schema["enum"] = [*choices, None] if nullable else choices
        return schema
    if not isinstance(annotation, type) or annotation not in _JSON_TYPES:
        raise TypeError(f"{where}: no JSON type for {annotation}")
    json_type = _JSON_TYPES[annotation]
    schema["type"] = ["null", json_type] if nullable else json_type
    for constraint in info.metadata:
        bound = _BOUNDS.get(type(constraint))
        if bound is not None:
            attribute, keyword = bound
            schema[keyword] = getattr(constraint, attribute)
    return schema


def precompute_dag_params(repo_root: Path) -> dict[str, dict[str, Any]]:
    """``Param`` arguments of the precompute DAG (every setting but the demo's held-out tail)."""
    return dag_param_schemas(PrecomputeSettings, deployment_defaults(repo_root))


def training_dag_params(repo_root: Path) -> dict[str, dict[str, Any]]:
    """``Param`` arguments of the training DAG."""
    defaults = deployment_defaults(repo_root)
    return dag_param_schemas(TrainingSettings, {"models_dir": defaults["models_dir"]})
