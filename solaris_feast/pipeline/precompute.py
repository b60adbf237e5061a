"""Task bodies of the precompute DAG, one plain function per task, in the DAG's order.

drain the miss queue -> per shard of users: candidates, verifier scores and ranking -> the
round's budget split over the shards -> per shard: plan and FM precompute -> user aggregates ->
similarity fill; :mod:`solaris_feast.pipeline.coverage` closes the round. Users are hashed to
``shards`` shards (:func:`~solaris_feast.precompute.plan.shard_of_users`), so no task but the
budget split (a few numbers per shard) sees every user's candidates, and a round's memory per
task falls with the shard count.

Each function takes the run spec
(:class:`~solaris_feast.pipeline.settings.PrecomputeRun` as JSON) and returns a small JSON-able
dict (what Airflow puts in XCom); nothing is remembered in the process between two calls, so any
worker can run any task, provided the models folder, the run folder and the feature repo are on
storage every worker sees and the online store is a shared server (Redis).

Where state lives: the run folder (:mod:`solaris_feast.pipeline.runs`, every step's file written
once and reused on retry), the model registry, and the Feast stores: the offline parquet log
(content-hashed files: writing the same rows again adds nothing) and the online store
(newest-wins writes).

A repo whose views were never applied is refused at the first task with
:class:`~solaris_feast.errors.ViewsNotAppliedError` ("run feast apply in <repo>"): the precompute
never applies definitions itself, since which views a repo serves is the repo owner's decision.

Heavy modules (torch, faiss, feast) are imported inside the functions, and only by the step
that needs them: ``start`` writes the registry's facts to the run folder
(:mod:`~solaris_feast.pipeline.registry_snapshot`), so a task opens Feast only to write or to read
the online store; the planner scores only the pairs that are not fresh (no VM, no torch when
every candidate is), an empty shard loads no model, and an unchanged aggregate or an empty fill
writes nothing. ``drain_miss_queue`` reads the online store's address from the repo's yaml,
and ``start`` reads the registry through Feast only when the registry file changed since an
earlier round, so a round with nothing to compute imports Feast in no task.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from solaris_feast.columns import COMPUTED_AT, ITEM_ID, MODEL_VERSION, USER_ID
from solaris_feast.pipeline.log import load_log
from solaris_feast.pipeline.registry_snapshot import (
    RegistrySnapshot,
    cache_snapshot,
    cached_snapshot,
    read_snapshot,
    take_snapshot,
    write_snapshot,
)
from solaris_feast.pipeline.runs import (
    budget_path,
    earlier_round_published,
    fill_report_path,
    later_round_started,
    precompute_run_dir,
    refuse_changed_settings,
    replace_folder_atomic,
    round_process_settings,
    run_time,
    runs_root,
    shard_candidates_path,
    shard_lost_path,
    shard_plan_dir,
    shard_ranked_dir,
    shard_ranking_path,
    shard_report_path,
    staging_folder,
    takes_live_misses,
    write_atomic,
    write_once,
    write_parquet_atomic,
    write_parquet_once,
)
from solaris_feast.pipeline.settings import (
    DEFAULT_RETURN_WEIGHT_EXPONENT,
    PAIR_VIEW,
    PrecomputeRun,
    PrecomputeSettings,
)
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from feast import FeatureStore

    from solaris_feast.data.schema import InteractionDataset
    from solaris_feast.models.interface import ChainModels
    from solaris_feast.precompute.plan import Plan, PlanStats
    from solaris_feast.store.backends import OnlineFacts
    from solaris_feast.store.write import EmbeddingWriter

logger = logging.getLogger(__name__)

MISS_QUEUE_GROUP = "solaris_precompute"
"""Redis consumer group of the precompute runs on the miss queue."""


def start_precompute(
    settings: Mapping[str, Any],
    interval: Mapping[str, Any],
    ticks: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Validate the params, check the repo's views, the log and that the serving chain fits the
    log, then open the run folder.

    The chain is the one named by ``serving_vm``, else the promoted one, else the newest
    (:func:`~solaris_feast.models.cards.serving_chain`). Everything is checked before anything
    is written: a bad log or candidate table, or a chain trained on another log
    (:class:`~solaris_feast.errors.ChainMismatchError`), fails this task once. The folder is
    keyed by the interval and the VM version: a re-run of the interval with the same models
    finds its earlier files; a new model version starts a full re-plan (a run failed on a
    chain is fixed by promoting another and clearing it). ``ticks`` (a scheduled round's
    skipped ticks and late start, :func:`~solaris_feast.pipeline.runs.round_ticks`) go into
    the run spec and from there into ``coverage.json``.
    """
    from solaris_feast.errors import ChainMismatchError, ConfigError
    from solaris_feast.models.cards import serving_chain
    from solaris_feast.pipeline.promotion import chain_mismatches, embedding_dim_mismatch
    from solaris_feast.serving.resolve import clock_skew_of
    from solaris_feast.store.tags import TAG_EMBEDDING_CODEC, TAG_EMBEDDING_DIM

    cfg = PrecomputeSettings.model_validate(dict(settings))
    # Refuses a repo without the views before any work is done.
    snapshot, fingerprint = start_snapshot(cfg)
    now, key = run_time(**interval)
    refuse_future_round(now, clock_skew_of(snapshot.resolved_tags))
    if not cfg.allow_expired_rounds:
        refuse_expired_round(
            now, cfg.pair_ttl_seconds or snapshot.tier_view(Tier.EXACT).ttl_seconds
        )
    models_dir = Path(cfg.models_dir)
    chain = serving_chain(models_dir, cfg.serving_vm or None) if models_dir.is_dir() else None
    if chain is None or chain.vm is None:
        raise ConfigError(
            f"no VM model card in {models_dir}: run the solaris_training DAG (or solaris train)"
        )
    vm = chain.vm
    dataset = load_log(cfg, now)  # a log that breaks the schema is refused here, by name
    if len(dataset.interactions) == 0:
        logger.warning(
            "the round's log window before %s holds no events: no user is active, so the round "
            "plans only queued misses (check log.path and history_seconds if traffic is live)",
            now.isoformat(),
        )
    if cfg.candidates is not None:
        _candidate_table(cfg, dataset, now)
    problems = chain_mismatches(chain, dataset, models_dir)
    pair_tags = snapshot.tier_view(Tier.EXACT).tags
    view_dim = pair_tags.get(TAG_EMBEDDING_DIM, "")
    dim_problem = embedding_dim_mismatch(
        chain, int(view_dim) if view_dim.isdigit() else None, snapshot.name_of(Tier.EXACT)
    )
    if dim_problem is not None:
        problems.append(dim_problem)
    problems += _key_type_mismatches(snapshot, dataset)
    view_codec = pair_tags.get(TAG_EMBEDDING_CODEC, "float32")
    if view_codec != cfg.embedding_codec:
        raise ConfigError(
            f"the precompute's embedding_codec is {cfg.embedding_codec} but the views in "
            f"{cfg.feature_repo} store {view_codec}: run feast apply with "
            f"SOLARIS_EMBEDDING_CODEC={cfg.embedding_codec} (or set embedding_codec: "
            f"{view_codec})"
        )
    if problems:
        raise ChainMismatchError(vm.version, problems)
    run_dir = precompute_run_dir(cfg, key, vm.version)
    refuse_changed_round_settings(run_dir, cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_snapshot(run_dir, snapshot)
    if fingerprint is not None:  # the next round's start need not open Feast
        cache_snapshot(runs_root(cfg), fingerprint, snapshot)
    spec = PrecomputeRun(
        settings=cfg,
        now=now,
        interval_key=key,
        run_dir=str(run_dir),
        vm_version=vm.version,
        fm_version=chain.fm.version,
        embedding_version=chain.embedding_version,
        ticks=dict(ticks) if ticks is not None else None,
        takes_misses=takes_live_misses(
            now, interval.get("run_type"), datetime.now(UTC), later_round_started(cfg, now)
        ),
        first_round=not earlier_round_published(cfg, run_dir),
    )
    write_once(run_dir / "manifest.json", spec.model_dump_json(indent=2))
    logger.info(
        "precompute run %s at %s with %s (%s)", key, now, vm.version, spec.embedding_version
    )
    return spec.model_dump(mode="json")


ONLINE_CHECK_PAIRS_PER_READ = 10_000
"""Pairs per round trip when a round checks the online store for the vectors its log calls
fresh (several users' reads batched: ``OnlineBackend.read_tiers_many``)."""


def confirmed_online(
    spec: PrecomputeRun, fresh: pd.DataFrame, views: dict[Tier, str]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows of ``fresh`` (pair rows the offline log calls fresh) whose pair still holds a
    value in the online store, and the pairs that do not (lost: they are planned again).

    One batched read of the pair view's stored ``computed_at`` per
    :data:`ONLINE_CHECK_PAIRS_PER_READ` pairs; only the online store's address is needed (no
    Feast import); ``views``: the stored views' names by tier, as the registry has them."""
    import itertools

    import numpy as np

    from solaris_feast.keys import id_array
    from solaris_feast.store.backends import backend_for
    from solaris_feast.tiers import Tier

    if fresh.empty:
        return fresh, fresh[[USER_ID, ITEM_ID]]
    pairs = fresh[[USER_ID, ITEM_ID]].drop_duplicates().reset_index(drop=True)
    users, items = id_array(pairs[USER_ID]), id_array(pairs[ITEM_ID])
    order = np.argsort(users, kind="stable")
    present = np.zeros(len(pairs), dtype=bool)
    backend = backend_for(run_online_facts(spec.settings), timeout_seconds=60.0)
    try:
        for lo in range(0, len(order), ONLINE_CHECK_PAIRS_PER_READ):
            part = order[lo : lo + ONLINE_CHECK_PAIRS_PER_READ]
            bounds = np.flatnonzero(np.r_[True, users[part][1:] != users[part][:-1], True])
            requests = [
                (users[part[a]], items[part[a:b]]) for a, b in itertools.pairwise(bounds.tolist())
            ]
            reads = backend.read_tiers_many(requests, views, time.perf_counter() + 60.0)
            stored = [bool(v) for read in reads for v in read.tiers[Tier.EXACT].computed_at]
            present[part] = stored
    finally:
        backend.close()
    lost = int(np.count_nonzero(~present))
    if lost:
        logger.warning(
            "%d of %d pairs the offline log calls fresh are missing from the online store "
            "(a restart without persistence, an eviction, a flush): planning them again",
            lost,
            len(pairs),
        )
    kept = pairs.loc[present, [USER_ID, ITEM_ID]]
    gone = pairs.loc[~present, [USER_ID, ITEM_ID]].reset_index(drop=True)
    return fresh.merge(kept, on=[USER_ID, ITEM_ID], how="inner"), gone


def lost_online(spec: PrecomputeRun) -> int:
    """Pairs this round's shards found missing from the online store though the log calls
    them fresh (:func:`confirmed_online`, in each shard's ``ranking.json``)."""
    return ranking_total(spec, "lost_online")


def ranking_total(spec: PrecomputeRun, key: str) -> int:
    """``key`` summed over this round's shards' ``ranking.json`` (0 where a shard lacks it)."""
    run_dir = Path(spec.run_dir)
    paths = [shard_ranking_path(run_dir, i) for i in range(spec.settings.shards)]
    return sum(int(json.loads(path.read_text()).get(key, 0)) for path in paths if path.is_file())


def refuse_changed_round_settings(run_dir: Path, cfg: PrecomputeSettings) -> None:
    """:func:`~solaris_feast.pipeline.runs.refuse_changed_settings` for a round's folder, whose
    manifest holds the settings it was made with; another budget or candidate source would plan
    from the old round's files."""
    manifest = run_dir / "manifest.json"
    if not manifest.is_file():
        return
    refuse_changed_settings(
        manifest,
        "run manifest",
        lambda text: PrecomputeRun.model_validate_json(text).settings.model_dump(mode="json"),
        cfg.model_dump(mode="json"),
        "run it at another time (--at) or remove the folder",
    )


def refuse_future_round(now: datetime, clock_skew_seconds: float) -> None:
    """Refuse a round whose time is past this machine's clock by more than the serving clock
    skew (a typo in ``--at``, a local time taken for UTC, a manual run with a future logical
    date). Its vectors would carry that ``computed_at``: serving rejects them as from the future,
    and newest-wins keeps them over every correct round's rewrite until their time has passed.
    """
    import pandas as pd

    from solaris_feast.errors import ConfigError

    ahead = (pd.Timestamp(now) - pd.Timestamp.now(tz="UTC")).total_seconds()
    if ahead > clock_skew_seconds:
        raise ConfigError(
            f"the round's time {pd.Timestamp(now).isoformat()} is {ahead / 3600:.1f} h after this "
            f"machine's clock (allowed: {clock_skew_seconds:.0f} s of clock skew); "
            "vectors computed as of a future time are not served and block later rounds' "
            "writes: check --at (or the run's logical date) and its time zone"
        )


def refuse_expired_round(now: datetime, pair_ttl_seconds: float) -> None:
    """Refuse a round dated further back than the pair TTL (a backfill of an old interval, a
    wrong ``--at``): its exact vectors would expire before they were written, so its FM work
    serves nothing, and its coverage, measured at the round's time, would count them."""
    import pandas as pd

    from solaris_feast.errors import ConfigError

    behind = (pd.Timestamp.now(tz="UTC") - pd.Timestamp(now)).total_seconds()
    if pair_ttl_seconds > 0 and behind > pair_ttl_seconds:
        raise ConfigError(
            f"the round's time {pd.Timestamp(now).isoformat()} is {behind / 3600:.1f} h before "
            f"this machine's clock, past the pair TTL ({pair_ttl_seconds / 3600:.1f} h): its "
            "vectors would be expired when written. Run the round for now (no --at, or a "
            "recent logical date); to replay a recorded log set "
            "precompute.allow_expired_rounds: true"
        )


def _candidate_table(
    cfg: PrecomputeSettings, dataset: InteractionDataset, now: datetime
) -> pd.DataFrame:
    """The user's candidate table of the round (``cfg.candidates`` is set): its ids of the
    log's types, and with ``exclude_seen_items`` without the pairs the round's log has met, as
    the built-in generators leave them out."""
    import pandas as pd

    from solaris_feast.data.log_source import read_candidate_table
    from solaris_feast.data.schema import EVENT_TIMESTAMP
    from solaris_feast.errors import SchemaError

    if cfg.candidates is None:
        raise ValueError("no candidate table configured")
    dense = dataset.dense_ids
    table = read_candidate_table(
        cfg.candidates,
        now,
        dataset.num_users if dense else None,
        dataset.num_items if dense else None,
        cfg.candidates_per_user,
    )
    log = dataset.interactions
    for key, column in (
        (USER_ID, cfg.candidates.user_column),
        (ITEM_ID, cfg.candidates.item_column),
    ):
        kinds = {"String" if frame[key].dtype == object else "Int64" for frame in (table, log)}
        if len(table) and len(log) and len(kinds) > 1:
            ours = "String" if table[key].dtype == object else "Int64"
            raise SchemaError(
                f"candidate table {cfg.candidates.path_at(now)}",
                column,
                f"holds {ours} ids, the log's are {({'String', 'Int64'} - {ours}).pop()}: "
                "store them as the log does (a vector written under the other type's key is "
                "never read)",
            )
    if cfg.exclude_seen_items and len(table) and len(log):
        met = log.loc[log[EVENT_TIMESTAMP] < pd.Timestamp(now), [USER_ID, ITEM_ID]]
        marked = table.merge(
            met.drop_duplicates(), on=[USER_ID, ITEM_ID], how="left", indicator=True
        )
        table = table.loc[(marked["_merge"] == "left_only").to_numpy()].reset_index(drop=True)
    return table


def _repo_config(settings: PrecomputeSettings) -> tuple[Path, Path]:
    """The run's Feast repo folder and its config file."""
    repo = Path(settings.feature_repo).resolve()
    return repo, repo / settings.feature_store_yaml


def open_run_store(settings: PrecomputeSettings) -> FeatureStore:
    """The run's Feast store, refused with :class:`~solaris_feast.errors.ViewsNotAppliedError`
    when its registry lacks any of the SOLARIS views (a final error: no retry adds them)."""
    from solaris_feast.errors import ViewsNotAppliedError
    from solaris_feast.store.config import open_repo_store
    from solaris_feast.store.definitions import applied_view_names

    repo, yaml_file = _repo_config(settings)
    store = open_repo_store(repo, yaml_file)
    applied = {view.name for view in store.list_feature_views()}
    # Under the repo's own names where it registered its own (found by the views' tier tags).
    names = applied_view_names(store)
    wanted = (names.pair_view_name, names.user_view_name, names.similar_view_name)
    missing = [name for name in wanted if name not in applied]
    if missing:
        raise ViewsNotAppliedError(str(repo), missing)
    return store


def open_run_writer(settings: PrecomputeSettings, view_name: str) -> EmbeddingWriter:
    """A writer of one of the run's views on the run's store, with the run's transactions
    (``precompute.write_transaction_rows``, ``precompute.write_transactions_in_flight``)."""
    from solaris_feast.store.write import EmbeddingWriter

    return EmbeddingWriter(
        open_run_store(settings),
        view_name,
        atomic_rows=settings.write_transaction_rows,
        in_flight=settings.write_transactions_in_flight,
    )


def start_snapshot(settings: PrecomputeSettings) -> tuple[RegistrySnapshot, str | None]:
    """The registry's snapshot for a new round: from the runs folder when an earlier round
    saw the same file registry (:func:`~solaris_feast.store.config.registry_fingerprint`), so
    ``start`` does not import Feast; else read through Feast (:func:`open_run_store` refuses a
    repo without the views). Also returns the fingerprint to keep the snapshot under once the
    round is accepted (None when there is nothing to keep)."""
    from solaris_feast.store.config import registry_fingerprint

    fingerprint = registry_fingerprint(*_repo_config(settings))
    if fingerprint is not None:
        cached = cached_snapshot(runs_root(settings), fingerprint)
        if cached is not None:
            logger.info("registry unchanged since an earlier round: its snapshot is reused")
            return cached, None
    return _snapshot_through_feast(settings, open_run_store(settings))


def keep_snapshot(settings: PrecomputeSettings, store: FeatureStore) -> None:
    """Keep the registry's snapshot in the runs folder under its fingerprint, for the next
    round's ``start``; called after a round changed the registry
    (:func:`~solaris_feast.pipeline.coverage.tag_views_with_versions`)."""
    snapshot, fingerprint = _snapshot_through_feast(settings, store)
    if fingerprint is not None:
        cache_snapshot(runs_root(settings), fingerprint, snapshot)


def _snapshot_through_feast(
    settings: PrecomputeSettings, store: FeatureStore
) -> tuple[RegistrySnapshot, str | None]:
    """The snapshot read through ``store`` and the registry's fingerprint, None when the file
    changed while Feast read it (or the registry is not a local file): nothing to keep then."""
    from solaris_feast.store.config import registry_fingerprint

    repo, yaml_file = _repo_config(settings)
    before = registry_fingerprint(repo, yaml_file)
    snapshot = take_snapshot(store)
    unchanged = before is not None and registry_fingerprint(repo, yaml_file) == before
    return snapshot, before if unchanged else None


def run_online_facts(settings: PrecomputeSettings) -> OnlineFacts:
    """The run's online store as the backends need it, read from its yaml without Feast."""
    from solaris_feast.store.config import repo_online_facts

    return repo_online_facts(*_repo_config(settings))


def run_snapshot(spec: PrecomputeRun) -> RegistrySnapshot:
    """The registry as the round's ``start`` saw it (opened again, with Feast, for a run folder
    written before snapshots were kept)."""
    snapshot = read_snapshot(Path(spec.run_dir))
    if snapshot is None:
        snapshot = take_snapshot(open_run_store(spec.settings))
    return snapshot


def view_extra(run: Mapping[str, Any], tier: str) -> dict[str, str]:
    """The extra of the asset event marked when the round wrote the view of ``tier`` (or
    ``RESOLVED``, for the round's publication): the Feast project and the view's name as the
    round's registry has them, and the embedding version written."""
    from solaris_feast.pipeline.assets import written_view

    spec = PrecomputeRun.model_validate(dict(run))
    snapshot = run_snapshot(spec)
    return {
        **written_view(snapshot.project, snapshot.name_of(tier)),
        "model_version": spec.embedding_version,
    }


def snapshot_rows(
    snapshot: RegistrySnapshot,
    view: str,
    start: pd.Timestamp,
    end: pd.Timestamp,
    columns: list[str] | None = None,
    *,
    first_round: bool = False,
) -> pd.DataFrame:
    """:func:`~solaris_feast.store.offline.read_offline_rows` through the snapshot (no Feast);
    ``first_round``: :attr:`PrecomputeRun.first_round`, where a missing folder is expected."""
    from solaris_feast.store.offline import read_offline_folder

    facts = snapshot.view(view)
    return read_offline_folder(
        Path(facts.offline_root), start, end, columns, facts.columns, first_round=first_round
    )


def _key_type_mismatches(snapshot: RegistrySnapshot, dataset: InteractionDataset) -> list[str]:
    """Join keys the registry types otherwise than the log's ids (views applied before
    ``solaris train`` built the vocabulary keep Int64 entities): the round's writes would be
    refused only after the FM ran."""
    from solaris_feast.models.cards import APPLY_MODELS_DIR
    from solaris_feast.store.ids import id_type_of

    log = dataset.interactions
    if not len(log):
        return []
    problems = []
    for key in (USER_ID, ITEM_ID):
        have = id_type_of(log[key])
        # A snapshot written before key types were recorded has none: not checked.
        views = {
            name: snapshot.view(name).key_types[key]
            for name in snapshot.names_by_tier().values()
            if snapshot.view(name).key_types.get(key, have) != have
        }
        if views:
            typed = ", ".join(sorted(set(views.values())))
            problems.append(
                f"the feature views {sorted(views)} key {key} as {typed}, the log has {have} "
                "ids (run feast apply after solaris train, so the entities take the "
                f"vocabulary's id types; {APPLY_MODELS_DIR})"
            )
    return problems


def drain_miss_queue(run: Mapping[str, Any]) -> dict[str, Any]:
    """Take the queued misses once per run and save them; a retry re-reads the saved ones.

    The pairs are read through the consumer group ``solaris_precompute`` (consumer: the run's
    interval; a Redis stream's group, or SQLite's taken rows) and acknowledged only by
    :func:`~solaris_feast.pipeline.coverage.publish_coverage`, after the run's writes: a run that
    dies in between leaves them to its retry, or to be claimed by a later run once idle.
    """
    import pandas as pd

    from solaris_feast.serving.miss_queue import MissQueue

    spec = PrecomputeRun.model_validate(dict(run))
    path = Path(spec.run_dir) / "misses.parquet"
    if path.is_file():
        misses = pd.read_parquet(path)
        return {"misses": len(misses), "reused": True}
    # The queue needs only the online store's address: read from the yaml, not through Feast.
    online = run_online_facts(spec.settings)
    queue = MissQueue.for_store(online)
    limit = spec.settings.max_drained_misses
    if not spec.takes_misses:
        logger.info(
            "a round for %s (a backfill, a run cleared after a later round started, or a "
            "round for a moment well before its start) leaves the miss queue to the live "
            "rounds: its vectors would be as old as its log window",
            spec.now.isoformat(),
        )
    # max_drained_misses 0 takes none: drain(0) is the queue's empty frame.
    misses = (
        queue.read_group(MISS_QUEUE_GROUP, spec.interval_key, max_pairs=limit)
        if limit > 0 and spec.takes_misses
        else queue.drain(0)
    )
    if not write_parquet_once(misses, path):
        # Another process of this round (a double-triggered run, a task still running beside
        # its retry) saved its misses first: every step of the round reads that one file. Ours
        # stay unacknowledged in the group, so a later round claims them.
        logger.warning("another process of this round saved its misses first: using %s", path)
        return {"misses": len(pd.read_parquet(path)), "reused": True}
    logger.info("took %d queued misses", len(misses))
    return {"misses": len(misses), "reused": False}


def shard_candidates(
    spec: PrecomputeRun, dataset: InteractionDataset, shard_index: int
) -> pd.DataFrame:
    """Candidate items for the active users of shard ``shard_index`` as of the run's time
    (written once to the shard's folder; a retry reads them back).

    The built-in generators read the whole log (co-occurrence and popularity are the round's,
    not the shard's) but score only the shard's users; a user's candidate table is cut to
    the shard's users.
    """
    import pandas as pd

    from solaris_feast.precompute.candidates import (
        CandidateConfig,
        active_users,
        generate_candidates,
    )
    from solaris_feast.precompute.plan import users_of_shard

    cfg, count = spec.settings, spec.settings.shards
    path = shard_candidates_path(Path(spec.run_dir), shard_index)
    if path.is_file():
        return pd.read_parquet(path)
    if cfg.candidates is not None:
        table = _candidate_table(cfg, dataset, spec.now)
        candidates = table.loc[
            users_of_shard(table[USER_ID].to_numpy(), shard_index, count)
        ].reset_index(drop=True)
    else:
        category = "category" if "category" in dataset.item_categorical else None
        if category is None and dataset.item_categorical:
            category = dataset.item_categorical[0]
        config = CandidateConfig(
            candidates_per_user=cfg.candidates_per_user,
            category_column=category,
            exclude_seen_items=cfg.exclude_seen_items,
        )
        users = None  # one shard: every active user, as the generator picks them
        if count > 1:
            active = active_users(dataset.interactions, pd.Timestamp(spec.now), config)
            users = active[users_of_shard(active, shard_index, count)]
        candidates = generate_candidates(
            dataset.interactions, pd.Timestamp(spec.now), config, items=dataset.items, users=users
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_parquet_atomic(candidates, path)
    logger.info(
        "shard %d/%d candidates: %d pairs for %d users",
        shard_index,
        count,
        len(candidates),
        candidates[USER_ID].nunique() if len(candidates) else 0,
    )
    return candidates


def round_candidates(spec: PrecomputeRun, columns: list[str] | None = None) -> pd.DataFrame:
    """Every shard's candidates of the round, in one table."""
    import pandas as pd

    run_dir = Path(spec.run_dir)
    parts = [
        pd.read_parquet(shard_candidates_path(run_dir, i), columns=columns)
        for i in range(spec.settings.shards)
    ]
    return pd.concat(parts, ignore_index=True)


def _chain(spec: PrecomputeRun) -> ChainModels:
    from solaris_feast.models.interface import load_chain_models

    cfg = spec.settings
    return load_chain_models(Path(cfg.models_dir), spec.vm_version, cfg.device, cfg.precision)


def _verifier_scores(
    chain: ChainModels | None,
    dataset: InteractionDataset,
    pairs: pd.DataFrame,
    now: datetime,
) -> pd.DataFrame:
    """``user_id``, ``item_id``, ``verifier_score``: the chain's verifier (for the reference VM,
    its main-task probability with no embedding), as of ``now``; 0 for every pair without a
    ``chain`` (nothing to score, so no model was loaded)."""
    import numpy as np
    import pandas as pd

    from solaris_feast.keys import id_array
    from solaris_feast.models.interface import PairsAsOf
    from solaris_feast.precompute.plan import VERIFIER_SCORE

    users, items = id_array(pairs[USER_ID]), id_array(pairs[ITEM_ID])
    if chain is None or len(pairs) == 0:
        scores = np.zeros(len(pairs), dtype=np.float64)
    else:
        scores = chain.verifier_scores(PairsAsOf.of(users, items, pd.Timestamp(now), dataset))
    return pd.DataFrame({USER_ID: users, ITEM_ID: items, VERIFIER_SCORE: scores})


def planning_scores(
    chain: ChainModels | None,
    dataset: InteractionDataset,
    candidates: pd.DataFrame,
    now: datetime,
    retrieval_weight: float,
    scored_rows: np.ndarray | None = None,
    return_horizon_seconds: float | None = None,
    return_weight_exponent: float = DEFAULT_RETURN_WEIGHT_EXPONENT,
) -> pd.DataFrame:
    """``user_id``, ``item_id``, ``verifier_score`` of the candidates as the planner ranks them:
    the verifier's probability times the retrieval score
    (:func:`solaris_feast.precompute.plan.request_score`), or the verifier alone for a candidate
    table without ``candidate_score``; times the user's weight by expected events within
    ``return_horizon_seconds`` (:func:`solaris_feast.precompute.returns.return_weights`, fitted
    on the round's log, to ``return_weight_exponent``) when a horizon is given.

    ``scored_rows`` (a boolean mask): only those candidates go through the VM, the others score
    0 (the planner drops them: they are fresh). The retrieval score is still normalized by each
    user's best over all candidates, so the scored rows rank as they would among all.
    """
    import numpy as np
    import pandas as pd

    from solaris_feast.keys import id_array
    from solaris_feast.precompute.candidates import CANDIDATE_SCORE
    from solaris_feast.precompute.plan import VERIFIER_SCORE, request_score
    from solaris_feast.precompute.returns import return_weights

    if scored_rows is None:
        scored = _verifier_scores(chain, dataset, candidates, now)
    else:
        subset = _verifier_scores(chain, dataset, candidates.loc[scored_rows], now)
        verifier = np.zeros(len(candidates), dtype=np.float64)
        verifier[scored_rows] = subset[VERIFIER_SCORE].to_numpy()
        scored = pd.DataFrame(
            {
                USER_ID: id_array(candidates[USER_ID]),
                ITEM_ID: id_array(candidates[ITEM_ID]),
                VERIFIER_SCORE: verifier,
            }
        )
    weight = None
    if return_horizon_seconds is not None:
        weight = return_weights(
            scored[USER_ID].to_numpy(),
            dataset.interactions,
            pd.Timestamp(now),
            return_horizon_seconds,
            return_weight_exponent,
        )
    retrieval = (
        candidates[CANDIDATE_SCORE].to_numpy(dtype="float64")
        if CANDIDATE_SCORE in candidates.columns
        else None
    )
    scored[VERIFIER_SCORE] = request_score(
        scored[USER_ID].to_numpy(),
        scored[VERIFIER_SCORE].to_numpy(),
        retrieval,
        retrieval_weight,
        user_weight=weight,
    )
    return scored


@round_process_settings()
def rank_shard(run: Mapping[str, Any], shard_index: int) -> dict[str, Any]:
    """Candidates and queued misses of one shard of users, scored by the verifier and ranked
    by the planner with no budget limit; the round's budget is split afterwards
    (:func:`split_round_budget`) by what each shard's ranking holds.

    Only pairs the planner can take are scored: a candidate whose stored vector stays fresh
    past the refresh margin is skipped by the planner whatever its score, so a first planner
    pass without scores names the rest (the planner's own freshness rule, not a copy of it).
    When every candidate is fresh and no miss is queued, the VM is not loaded at all.

    Returns the shard's :class:`~solaris_feast.precompute.plan.ShardRanking` and counts.
    """
    import numpy as np
    import pandas as pd

    from solaris_feast.precompute.plan import (
        VERIFIER_SCORE,
        ShardRanking,
        plan_precompute,
        users_of_shard,
    )
    from solaris_feast.serving.resolve import fresh_window

    spec = PrecomputeRun.model_validate(dict(run))
    cfg, count = spec.settings, spec.settings.shards
    run_dir = Path(spec.run_dir)
    ranking_path = shard_ranking_path(run_dir, shard_index)
    if ranking_path.is_file():
        return {**json.loads(ranking_path.read_text()), "reused": True}
    dataset = load_log(cfg, spec.now)
    candidates = shard_candidates(spec, dataset, shard_index)
    misses = pd.read_parquet(run_dir / "misses.parquet")
    if dataset.dense_ids:  # ids beyond dense tables cannot be scored; a vocabulary maps any id
        known = (misses[USER_ID] < dataset.num_users) & (misses[ITEM_ID] < dataset.num_items)
        misses = misses.loc[known]
    misses = misses[[USER_ID, ITEM_ID]].drop_duplicates()
    misses = misses.loc[users_of_shard(misses[USER_ID].to_numpy(), shard_index, count)]
    snapshot = run_snapshot(spec)
    pair_view = snapshot.name_of(Tier.EXACT)
    ttl = pair_ttl_seconds(spec, snapshot.view(pair_view).ttl_seconds, pair_view)
    now = pd.Timestamp(spec.now)
    fresh = snapshot_rows(
        snapshot,
        pair_view,
        *fresh_window(now, ttl),
        [USER_ID, ITEM_ID, COMPUTED_AT, MODEL_VERSION],
        first_round=spec.first_round,
    )
    if count > 1 and len(fresh):
        fresh = fresh.loc[users_of_shard(fresh[USER_ID].to_numpy(), shard_index, count)]
    # The log says what was written; the online store says what is still there. A Redis
    # restarted without persistence, evicted or flushed has lost vectors the log still calls
    # fresh: those are planned again instead of counted as served until their TTL ran out.
    fresh, gone = confirmed_online(spec, fresh, snapshot.names_by_tier())
    lost = len(gone)
    if lost:
        write_parquet_atomic(gone, shard_lost_path(run_dir, shard_index))
    superseded = 0
    if not spec.takes_misses:  # a backfill, a cleared run after later rounds
        later = later_pairs(spec, snapshot, pair_view, now, shard_index, count)
        candidates, superseded = without_pairs(candidates, later)
        misses, _ = without_pairs(misses, later)
        if superseded:
            logger.info(
                "%d candidates are stored online by rounds for later times (newest wins): "
                "not computed again for %s",
                superseded,
                now,
            )
    # No budget limit: the shard's whole ranking, cut later to its part of the round's budget.
    unlimited = len(candidates) + len(misses)

    def ranked(scored: pd.DataFrame, scored_misses: pd.DataFrame | None, log: bool) -> Any:
        return plan_precompute(
            scored,
            scored_misses,
            fresh,
            unlimited,
            now,
            ttl,
            min(cfg.refresh_margin_seconds, ttl - 1),
            cfg.min_miss_score,
            model_version=spec.embedding_version,
            user_balanced=cfg.user_balanced_plan,
            log=log,
        )

    unscored = candidates[[USER_ID, ITEM_ID]].assign(**{VERIFIER_SCORE: 0.0})
    # Which pairs could be taken at all (not fresh): a first pass, not the shard's plan.
    takeable = ranked(unscored, None, log=False).pairs[[USER_ID, ITEM_ID]]
    to_score = (
        candidates[[USER_ID, ITEM_ID]]
        .merge(takeable.drop_duplicates(), on=[USER_ID, ITEM_ID], how="left", indicator=True)[
            "_merge"
        ]
        .eq("both")
        .to_numpy(dtype=bool)
    )
    chain = _chain(spec) if to_score.any() or len(misses) else None
    cold = _strangers(chain, candidates, dataset)
    stranger_candidates = int(np.count_nonzero(cold))
    if stranger_candidates:
        candidates, to_score = candidates.loc[~cold].reset_index(drop=True), to_score[~cold]
    cold = _strangers(chain, misses, dataset)
    strangers = int(np.count_nonzero(cold))
    misses = misses.loc[~cold]
    scored_candidates = planning_scores(
        chain,
        dataset,
        candidates,
        spec.now,
        cfg.retrieval_weight,
        scored_rows=to_score,
        return_horizon_seconds=(
            (cfg.return_horizon_seconds or ttl) if cfg.return_weight_exponent > 0 else None
        ),
        return_weight_exponent=cfg.return_weight_exponent,
    )
    scored_misses = _verifier_scores(chain, dataset, misses, spec.now) if len(misses) else None
    ranking = ranked(scored_candidates, scored_misses, log=True)
    _publish_plan(ranking, shard_ranked_dir(run_dir, shard_index))
    facts = ShardRanking.of(ranking)
    report = {
        "shard": shard_index,
        "of": count,
        "priority": facts.priority,
        "mass": facts.mass,
        "eligible": facts.eligible,
        "candidates": len(candidates),
        "misses": len(misses),
        "stranger_misses": strangers,
        "stranger_candidates": stranger_candidates,
        "scored": int(np.count_nonzero(to_score)) + len(misses),
        "skipped_fresh": ranking.stats.skipped_fresh,
        "lost_online": lost,
        "superseded_by_later_rounds": superseded,
    }
    write_atomic(ranking_path, json.dumps(report, indent=2))
    logger.info(
        "shard %d/%d: verifier scored %d of %d candidates (the rest are fresh)%s; %d eligible",
        shard_index,
        count,
        int(np.count_nonzero(to_score)),
        len(candidates),
        "" if chain is not None else ": no model loaded",
        facts.eligible,
    )
    return {**report, "reused": False}


def later_pairs(
    spec: PrecomputeRun,
    snapshot: RegistrySnapshot,
    pair_view: str,
    now: pd.Timestamp,
    shard_index: int,
    shard_count: int,
) -> pd.DataFrame:
    """The shard's pairs that rounds for times after ``now`` have stored and the online store
    still holds. A round for a past time (a backfill within the TTL, a run cleared after later
    rounds) writes its vectors dated ``now``; online writes keep the newest value, so such a
    pair keeps the later round's value whatever this round computes: measured under a real
    scheduler, a backfill of three intervals after a promotion computed 900 pairs of which 12
    reached the store, and its state read (``fresh_window``, up to ``now``) never saw the rest."""
    import pandas as pd

    from solaris_feast.precompute.plan import users_of_shard

    later = snapshot_rows(
        snapshot,
        pair_view,
        now,  # after the round's own time: (now, ...]
        pd.Timestamp.now(tz=now.tz) + pd.Timedelta(days=1),
        [USER_ID, ITEM_ID, COMPUTED_AT],
        first_round=spec.first_round,
    )
    if shard_count > 1 and len(later):
        later = later.loc[users_of_shard(later[USER_ID].to_numpy(), shard_index, shard_count)]
    if later.empty:
        return later[[USER_ID, ITEM_ID]]
    held, _ = confirmed_online(spec, later, snapshot.names_by_tier())
    return held[[USER_ID, ITEM_ID]].drop_duplicates()


def without_pairs(frame: pd.DataFrame, pairs: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """``frame`` without the rows whose (user, item) is among ``pairs``, and how many went."""
    import numpy as np

    from solaris_feast.keys import PairCodes, id_array

    if frame.empty or pairs.empty:
        return frame, 0
    users, items = id_array(frame[USER_ID]), id_array(frame[ITEM_ID])
    their_users, their_items = id_array(pairs[USER_ID]), id_array(pairs[ITEM_ID])
    if (users.dtype == object) != (their_users.dtype == object) or (items.dtype == object) != (
        their_items.dtype == object
    ):
        return frame, 0  # ids of another type are other ids
    codes = PairCodes.for_round([users, their_users], [items, their_items])
    gone = np.isin(codes.keys(users, items), codes.keys(their_users, their_items))
    return frame.loc[~gone].reset_index(drop=True), int(np.count_nonzero(gone))


def _strangers(
    chain: ChainModels | None, pairs: pd.DataFrame, dataset: InteractionDataset
) -> np.ndarray:
    """``(N,)`` bool: ``pairs`` of a user or an item the FM's vocabulary does not hold and that
    has no event in the round's window
    (:meth:`~solaris_feast.models.vocabulary.Vocabulary.stranger_pairs`). The FM would read only
    its out-of-vocabulary row for them, so they are left to the fallback tiers: a candidate
    table of a user's own listing 2,000 such users gave them 82% of a round's budget, and a
    queued miss of theirs was stored as a vector ~30x a known user's."""
    import numpy as np

    if chain is None or chain.vocabulary is None or not len(pairs):
        return np.zeros(len(pairs), dtype=bool)
    log = dataset.interactions
    cold = chain.vocabulary.stranger_pairs(
        pairs[USER_ID], pairs[ITEM_ID], log[USER_ID], log[ITEM_ID]
    )
    if cold.any():
        logger.info(
            "%d pairs of users or items the FM never saw, with no event in the log window, are "
            "left to the fallback tiers (the FM would read only its OOV row)",
            int(np.count_nonzero(cold)),
        )
    return np.asarray(cold, dtype=bool)


def split_round_budget(run: Mapping[str, Any]) -> dict[str, Any]:
    """The round's budget split over its shards (:func:`~solaris_feast.precompute.plan.split_budget`
    over every shard's ranking), written once to ``budget.json``.

    Returns ``budgets`` (one per shard) and ``shard_indexes`` for the mapped FM tasks.
    """
    from solaris_feast.precompute.plan import ShardRanking, split_budget

    spec = PrecomputeRun.model_validate(dict(run))
    run_dir, count = Path(spec.run_dir), spec.settings.shards
    path = budget_path(run_dir)
    if not path.is_file():
        reports = [json.loads(shard_ranking_path(run_dir, i).read_text()) for i in range(count)]
        rankings = [
            ShardRanking(priority=r["priority"], mass=r["mass"], eligible=r["eligible"])
            for r in reports
        ]
        budgets = split_budget(spec.settings.budget_pairs, rankings)
        split = {
            "budget_pairs": spec.settings.budget_pairs,
            "budgets": budgets,
            "rankings": reports,
        }
        write_once(path, json.dumps(split, indent=2))
        logger.info(
            "budget %d over %d shards: %s (eligible %s)",
            spec.settings.budget_pairs,
            count,
            budgets,
            [r.eligible for r in rankings],
        )
    split = json.loads(path.read_text())
    return {
        "budgets": split["budgets"],
        "planned": int(sum(split["budgets"])),
        "shard_indexes": list(range(count)),
    }


def shard_plan(spec: PrecomputeRun, shard_index: int) -> Plan:
    """The shard's plan: its ranking cut to its part of the round's budget (written once)."""
    from solaris_feast.precompute.plan import read_plan, take_budget

    run_dir = Path(spec.run_dir)
    plan_dir = shard_plan_dir(run_dir, shard_index)
    if (plan_dir / "plan.json").is_file():
        return read_plan(plan_dir)
    budget = json.loads(budget_path(run_dir).read_text())["budgets"][shard_index]
    plan = take_budget(read_plan(shard_ranked_dir(run_dir, shard_index)), int(budget))
    _publish_plan(plan, plan_dir)
    return plan


def _publish_plan(plan: Plan, folder: Path) -> None:
    """Write ``plan`` to a staging folder, then move it to ``folder`` in one rename."""
    from solaris_feast.precompute.plan import write_plan

    staging = staging_folder(folder)
    write_plan(plan, staging)
    replace_folder_atomic(staging, folder)


def round_plan_stats(spec: PrecomputeRun) -> PlanStats:
    """The round's plan counts, summed over the shards' ``plan.json`` (no plan rows are read)."""
    from solaris_feast.precompute.plan import read_plan_stats, sum_plan_stats

    run_dir = Path(spec.run_dir)
    return sum_plan_stats(
        [read_plan_stats(shard_plan_dir(run_dir, i)) for i in range(spec.settings.shards)]
    )


def round_uncovered(spec: PrecomputeRun, rows: int) -> pd.DataFrame:
    """The round's best ``rows`` uncovered pairs, in the priority order of one plan over all
    shards (:func:`~solaris_feast.precompute.plan.merge_in_priority_order`). Reads at most
    ``rows`` of each shard's uncovered pairs and none of its planned pairs, so ``priority``
    counts from 0 here, not from the round's planned pairs as in a merged plan (the fill reads
    only the pairs)."""
    from solaris_feast.precompute.plan import merge_in_priority_order, read_uncovered

    run_dir = Path(spec.run_dir)
    return merge_in_priority_order(
        [read_uncovered(shard_plan_dir(run_dir, i), rows) for i in range(spec.settings.shards)]
    ).head(rows)


def pair_ttl_seconds(
    spec: PrecomputeRun, view_ttl_seconds: float, view_name: str = PAIR_VIEW
) -> int:
    """The planner's TTL: the param, or the pair view's TTL (``view_ttl_seconds``, from the
    registry), which serving enforces.

    A param longer than the view's TTL is refused: the planner would skip pairs as fresh that
    the retriever already treats as expired.
    """
    from solaris_feast.errors import ConfigError

    view_seconds = int(view_ttl_seconds)
    if view_seconds <= 0:
        raise ConfigError(f"feature view {view_name} needs a positive ttl")
    wanted = spec.settings.pair_ttl_seconds
    if wanted is None:
        return view_seconds
    if wanted > view_seconds:
        raise ConfigError(
            f"pair_ttl_seconds={wanted} exceeds the {view_name} view's ttl ({view_seconds} s): "
            "pairs the retriever treats as expired would be skipped as fresh"
        )
    return wanted


@round_process_settings()
def precompute_shard(run: Mapping[str, Any], shard_index: int) -> dict[str, Any]:
    """FM -> compressor -> pair view for the shard's plan (its ranking cut to its budget).

    Idempotent: vectors are computed as of the plan's time and stored with it as
    ``computed_at``, so a retry writes the same rows (same offline file, same online value).
    """
    spec = PrecomputeRun.model_validate(dict(run))
    shard_count = spec.settings.shards
    done = shard_report_path(Path(spec.run_dir), shard_index)
    if done.is_file():
        # Written after the shard's last write: a cleared or re-run task has nothing left to
        # do, and running the FM again would only rewrite the same rows and the report.
        return {**json.loads(done.read_text()), "reused": True}
    part = shard_plan(spec, shard_index)
    if len(part) == 0:
        # Nothing planned for this shard: no model, no store (torch and Feast stay unloaded).
        report: dict[str, Any] = {"shard": shard_index, "of": shard_count, "pairs": 0}
        report.update(batches=0, model_version=spec.embedding_version, wall_seconds=0.0)
        write_atomic(
            shard_report_path(Path(spec.run_dir), shard_index), json.dumps(report, indent=2)
        )
        return report
    chain = _chain(spec)
    from solaris_feast.precompute.compute import run_precompute

    dataset = load_log(spec.settings, spec.now)
    writer = open_run_writer(spec.settings, run_snapshot(spec).name_of(Tier.EXACT))
    try:
        stats = run_precompute(part, chain, dataset, writer, spec.settings.batch_size)
    finally:
        writer.close()
    report = {"shard": shard_index, "of": shard_count, **stats.as_dict()}
    write_atomic(shard_report_path(Path(spec.run_dir), shard_index), json.dumps(report, indent=2))
    return report


@round_process_settings()
def aggregate_users(run: Mapping[str, Any]) -> dict[str, Any]:
    """Each user's mean exact vector over the window, written to the user view for the users
    whose aggregate changed (:func:`~solaris_feast.precompute.aggregate.changed_user_rows`).

    A pair computed several times counts once (newest vector), and the rows carry the run's time,
    so a re-run writes the same rows: nothing is counted twice. An unchanged aggregate is not
    written again (a round with nothing new adds no offline row and opens no store), until it
    nears the view's TTL (``refresh_margin_seconds`` before, as the pairs).
    """
    import pandas as pd

    from solaris_feast.precompute.aggregate import changed_user_rows
    from solaris_feast.serving.resolve import fresh_window

    spec = PrecomputeRun.model_validate(dict(run))
    snapshot = run_snapshot(spec)
    rows = user_aggregate_rows(spec, snapshot)
    now = pd.Timestamp(spec.now)
    user_view = snapshot.name_of(Tier.USER_AGG)
    ttl_seconds = snapshot.view(user_view).ttl_seconds
    rewrite_after = max(ttl_seconds - spec.settings.refresh_margin_seconds, 0.0)
    # Rows before this round's time only: a retry rewrites what its first try wrote.
    since, _ = fresh_window(now, ttl_seconds)
    stored = snapshot_rows(
        snapshot, user_view, since, now - pd.Timedelta(1, "us"), first_round=spec.first_round
    )
    if lost_online(spec):
        # The online store lost pair vectors the log calls fresh (rank_shard found them): its
        # aggregates are gone with them, so none counts as unchanged.
        logger.warning("the online store lost data since the last round: rewriting every aggregate")
        stored = stored.iloc[0:0]
    changed = changed_user_rows(rows, stored, now, rewrite_after)
    applied = files = 0
    if len(changed):
        writer = open_run_writer(spec.settings, user_view)
        try:
            report = writer.write(changed)
        finally:
            writer.close()
        applied, files = report.online_applied, report.offline_files_written
    logger.info("user aggregates: %d users, %d changed", len(rows), len(changed))
    return {
        "users": len(rows),
        "written": len(changed),
        "unchanged": len(rows) - len(changed),
        "online_applied": applied,
        "offline_files_written": files,
    }


def user_aggregate_rows(spec: PrecomputeRun, snapshot: RegistrySnapshot) -> pd.DataFrame:
    """The user view's rows of the run: each user's mean exact vector over the window."""
    import pandas as pd

    from solaris_feast.precompute.aggregate import AggregateConfig, aggregate_user_embeddings
    from solaris_feast.serving.resolve import fresh_window

    window = spec.settings.aggregate_window_seconds
    now = pd.Timestamp(spec.now)
    exact = snapshot_rows(
        snapshot,
        snapshot.name_of(Tier.EXACT),
        *fresh_window(now, window),
        first_round=spec.first_round,
    )
    return aggregate_user_embeddings(
        exact, now, spec.embedding_version, AggregateConfig(window_seconds=window)
    )


@round_process_settings()
def fill_similar(run: Mapping[str, Any]) -> dict[str, Any]:
    """Fill over-budget and missed pairs from the nearest users' exact vectors (faiss KNN over
    the user aggregates) and write them to the similar view."""
    import pandas as pd

    from solaris_feast.precompute.aggregate import PairEmbeddings
    from solaris_feast.precompute.similarity import (
        FILL_WRITE_PARTS,
        SimilarityConfig,
        aggregate_user_index,
        fill_and_write,
        fill_target_count,
        similarity_fill_parts,
    )
    from solaris_feast.serving.resolve import fresh_window

    spec = PrecomputeRun.model_validate(dict(run))
    cfg = spec.settings
    snapshot = run_snapshot(spec)
    now = pd.Timestamp(spec.now)
    pair_view = snapshot.name_of(Tier.EXACT)
    ttl = pair_ttl_seconds(spec, snapshot.view(pair_view).ttl_seconds, pair_view)
    planned = round_plan_stats(spec).planned
    wanted = fill_target_count(planned, cfg.fill_targets_per_budget, cfg.fill_targets)
    misses = pd.read_parquet(Path(spec.run_dir) / "misses.parquet")
    over_budget = round_uncovered(spec, wanted)[[USER_ID, ITEM_ID]]
    targets = pd.concat(
        [over_budget, misses[[USER_ID, ITEM_ID]]], ignore_index=True
    ).drop_duplicates()
    # What the round asked of the fill, for coverage.json: how many pairs a multiple and a cap
    # gave it is what a deployment tunes them by.
    asked = {
        "planned_pairs": planned,
        "targets_per_budget": cfg.fill_targets_per_budget,
        "cap": cfg.fill_targets,
        "over_budget_targets": len(over_budget),
        "queued_misses": len(misses),
        "targets": len(targets),
    }

    logger.info(
        "similarity fill: %d targets: %d over budget (%g x %d planned pairs%s), %d queued misses",
        len(targets),
        len(over_budget),
        cfg.fill_targets_per_budget,
        planned,
        "" if cfg.fill_targets is None else f", at most {cfg.fill_targets}",
        len(misses),
    )

    def reported(outcome: dict[str, Any]) -> dict[str, Any]:
        # The first complete try's figures stand, as coverage.json publishes them once: a
        # cleared re-run writes the same rows again (its offline files exist, 0 written) and
        # overwrote fill.json with figures that disagreed with the round's coverage.json.
        report = {**asked, **outcome}
        path = fill_report_path(Path(spec.run_dir))
        if not write_once(path, json.dumps(report, indent=2)):
            logger.info("similarity fill re-run: %s; the round's report stays %s", report, path)
            first: dict[str, Any] = json.loads(path.read_text())
            return first
        return report

    if len(targets) == 0:
        logger.info("similarity fill: nothing to fill (no targets)")
        return reported({"filled": 0})
    user_rows = user_aggregate_rows(spec, snapshot)
    exact = snapshot_rows(
        snapshot, pair_view, *fresh_window(now, ttl), first_round=spec.first_round
    )
    if len(user_rows) < 2 or len(exact) == 0:
        logger.info("similarity fill: nothing to fill (%d targets)", len(targets))
        return reported({"filled": 0})
    similarity = SimilarityConfig(neighbours=cfg.similar_neighbours)
    index = aggregate_user_index(user_rows, similarity)
    writer = open_run_writer(cfg, snapshot.name_of(Tier.SIMILAR))
    try:
        # In parts of users, each written while the next is computed.
        parts = similarity_fill_parts(
            index,
            targets,
            PairEmbeddings.from_frame(exact),
            now,
            spec.embedding_version,
            ttl,
            similarity,
            parts=FILL_WRITE_PARTS,
        )
        written = fill_and_write(parts, writer)
    finally:
        writer.close()
    return reported(
        {
            "filled": written.filled,
            "online_applied": sum(r.online_applied for r in written.answers),
            "offline_files_written": sum(r.offline_files_written for r in written.answers),
        }
    )
