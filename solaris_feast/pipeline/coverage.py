"""The last task of a precompute round: which tier each of the round's pairs would be served now.

The pairs are the round's candidates and queued misses. Each tier's value for a pair is the
newest row of its offline log (the online store keeps the newest write per key), and the tier
rule of :func:`solaris_feast.serving.resolve.resolve` decides, as for the retriever: the round's
embedding version, a known ``computed_at`` not in the future, ``age <= ttl``, finite values. The
report goes to ``coverage.json`` in the run folder; then the round's queued misses are
acknowledged and the views are tagged with the round's model versions.

Cost: one read of each view's offline rows inside its TTL window, through the round's registry
snapshot (:mod:`~solaris_feast.pipeline.registry_snapshot`): Feast is opened only to acknowledge
queued misses or to retag views whose version tags changed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from solaris_feast.columns import (
    COMPUTED_AT,
    EMBEDDING,
    ITEM_ID,
    MODEL_VERSION,
    USER_ID,
    WRITTEN_AT,
)
from solaris_feast.pipeline.runs import (
    budget_path,
    fill_report_path,
    shard_report_path,
    write_atomic,
)
from solaris_feast.pipeline.settings import (
    PrecomputeRun,
)
from solaris_feast.store.layout import version_matches

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from feast import FeatureStore

    from solaris_feast.pipeline.registry_snapshot import RegistrySnapshot
    from solaris_feast.serving.resolve import TierValues

logger = logging.getLogger(__name__)

TIER_NAMES = {"EXACT": "exact", "SIMILAR": "similar", "USER_AGG": "user", "ZERO": "zero"}
"""Keys of the tiers in ``coverage.json``."""


def publish_coverage(run: Mapping[str, Any]) -> dict[str, Any]:
    """Share of this round's pairs (candidates and queued misses) each tier would serve now.

    Written to ``coverage.json`` in the run folder and logged in one line.
    """
    import numpy as np
    import pandas as pd

    from solaris_feast.pipeline.precompute import (
        lost_online,
        ranking_total,
        round_candidates,
        round_plan_stats,
        run_snapshot,
    )
    from solaris_feast.tiers import Tier

    spec = PrecomputeRun.model_validate(dict(run))
    snapshot = run_snapshot(spec)
    run_dir = Path(spec.run_dir)
    misses = pd.read_parquet(run_dir / "misses.parquet")
    written = run_dir / "coverage.json"
    if written.is_file():
        # The round's record stays as it was first measured: a cleared task re-run later would
        # count the pairs of the rounds since (computed within the clock skew of this one).
        report = json.loads(written.read_text())
        return {
            "coverage": report["coverage"],
            "pairs": report["pairs"],
            # What a first try that died after its record may have left undone.
            "misses_acknowledged": _acknowledge_and_retire(spec, misses),
            "views_retagged": _retag_views(snapshot, spec),
            "path": str(written),
            "reused": True,
        }
    pool = pd.concat(
        [
            round_candidates(spec, [USER_ID, ITEM_ID]),
            misses[[USER_ID, ITEM_ID]],
        ],
        ignore_index=True,
    ).drop_duplicates(ignore_index=True)
    tiers = served_tiers(
        snapshot, pool, pd.Timestamp(spec.now), spec.embedding_version, lost_pairs(spec)
    )
    total = len(pool)
    coverage = {
        TIER_NAMES[t.name]: (float(np.count_nonzero(tiers == int(t))) / total if total else 0.0)
        for t in Tier
    }
    # This run's shard count: a re-run with fewer shards leaves older reports beside them.
    reports = [shard_report_path(run_dir, i) for i in range(spec.settings.shards)]
    shards = [json.loads(path.read_text()) for path in reports if path.is_file()]
    fill_path = fill_report_path(run_dir)
    report = {
        "interval": spec.interval_key,
        "now": pd.Timestamp(spec.now).isoformat(),
        "vm_version": spec.vm_version,
        "embedding_version": spec.embedding_version,
        "pairs": total,
        "coverage": coverage,
        "any_tier": 1.0 - coverage["zero"] if total else 0.0,
        # Coverage is the tier rule over the offline log; pairs the log called fresh that the
        # online store had lost were planned again (within the budget) and are counted here.
        "lost_online": lost_online(spec),
        # A past round (a backfill, a cleared run): candidates later rounds hold online, whose
        # newer values its writes could not replace, so they were not computed.
        "superseded_by_later_rounds": ranking_total(spec, "superseded_by_later_rounds"),
        "fm_pairs": int(sum(int(s["pairs"]) for s in shards)),
        "plan": asdict(round_plan_stats(spec)),
        "budgets": json.loads(budget_path(run_dir).read_text())["budgets"],
        "shards": shards,
        # What the similarity fill was asked for and wrote (None: the fill task has not run).
        "fill": json.loads(fill_path.read_text()) if fill_path.is_file() else None,
        # A scheduled round's skipped ticks and late start (None: manual or asset-triggered).
        "schedule": spec.ticks,
    }
    write_atomic(written, json.dumps(report, indent=2))
    acknowledged = _acknowledge_and_retire(spec, misses)
    retagged = _retag_views(snapshot, spec)
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


def _retag_views(snapshot: RegistrySnapshot, spec: PrecomputeRun) -> list[str]:
    """Tag the views with this round's models where the registry names others."""
    from solaris_feast.pipeline.precompute import keep_snapshot, open_run_store

    if not _tags_outdated(snapshot, spec):
        return []
    store = open_run_store(spec.settings)
    retagged = tag_views_with_versions(store, spec)
    keep_snapshot(spec.settings, store)  # the next round's start reads the new registry
    return retagged


def _acknowledge_and_retire(spec: PrecomputeRun, misses: pd.DataFrame) -> int:
    """Acknowledge the round's misses, after its writes (a round that died earlier leaves its
    group-read misses to its retry, or to be claimed by a later round), and retire its consumer (its
    interval), instead of one consumer per round piling up in the group. Acknowledging again
    is harmless: a retry of this task does it once more."""
    from solaris_feast.pipeline.precompute import MISS_QUEUE_GROUP, run_online_facts

    if "entry_id" not in misses.columns:
        return 0
    from solaris_feast.serving.miss_queue import MissQueue

    queue = MissQueue.for_store(run_online_facts(spec.settings))
    acknowledged = queue.ack(MISS_QUEUE_GROUP, misses) if not misses.empty else 0
    queue.retire(MISS_QUEUE_GROUP, spec.interval_key)
    return acknowledged


def lost_pairs(spec: PrecomputeRun) -> pd.DataFrame | None:
    """The pairs this round's shards found missing online though the log calls them fresh
    (``lost_online.parquet``), None when none were."""
    import pandas as pd

    from solaris_feast.pipeline.runs import shard_lost_path

    paths = [shard_lost_path(Path(spec.run_dir), i) for i in range(spec.settings.shards)]
    found = [pd.read_parquet(path) for path in paths if path.is_file()]
    return pd.concat(found, ignore_index=True) if found else None


def served_tiers(
    registry: FeatureStore | RegistrySnapshot,
    pairs: pd.DataFrame,
    now: pd.Timestamp,
    embedding_version: str,
    lost: pd.DataFrame | None = None,
) -> np.ndarray:
    """``(N,)`` int8 tiers that :func:`~solaris_feast.serving.resolve.resolve` gives the N
    ``pairs`` (``user_id``, ``item_id``) at ``now``, from the views' offline rows and TTLs
    (of a Feast store's registry, or of a round's snapshot of it). ``lost``: pairs the online
    store no longer holds (:func:`lost_pairs`): their exact rows written before ``now`` count
    as gone, so only a rewrite by this round serves them."""
    from solaris_feast.pipeline.registry_snapshot import RegistrySnapshot, take_snapshot
    from solaris_feast.serving.resolve import clock_skew_of, resolve
    from solaris_feast.tiers import Tier

    snapshot = registry if isinstance(registry, RegistrySnapshot) else take_snapshot(registry)
    views = snapshot.names_by_tier()
    ttls = {tier: snapshot.view(view).ttl_seconds for tier, view in views.items()}
    skew = clock_skew_of(snapshot.resolved_tags)
    values = {
        tier: _tier_values(
            snapshot,
            view,
            [USER_ID] if tier == Tier.USER_AGG else [USER_ID, ITEM_ID],
            pairs,
            now,
            ttls[tier],
            skew,
            embedding_version,
            lost if tier == Tier.EXACT else None,
        )
        for tier, view in views.items()
    }
    dims = {v.vectors.shape[1] for v in values.values() if v.present.any()}
    if len(dims) > 1:
        raise ValueError(f"views {', '.join(views.values())} hold vectors of lengths {dims}")
    return resolve(values, now_s=now.timestamp(), ttl_seconds=ttls, clock_skew_seconds=skew).tiers


def _tier_values(
    snapshot: RegistrySnapshot,
    view: str,
    keys: list[str],
    pairs: pd.DataFrame,
    now: pd.Timestamp,
    ttl_seconds: float,
    clock_skew_seconds: float,
    embedding_version: str,
    gone: pd.DataFrame | None = None,
) -> TierValues:
    """One tier's value for each pair: the newest offline row of its key within the window
    that can be fresh, ``[now - ttl, now + skew]``; absent where there is none."""
    import numpy as np
    import pandas as pd

    from solaris_feast.pipeline.precompute import snapshot_rows
    from solaris_feast.serving.resolve import TierValues, fresh_window
    from solaris_feast.store.offline import newest_per_key

    rows = snapshot_rows(
        snapshot,
        view,
        *fresh_window(now, ttl_seconds, clock_skew_seconds),
        [*keys, EMBEDDING, MODEL_VERSION, COMPUTED_AT, WRITTEN_AT],
    )
    n = len(pairs)
    if gone is not None and len(gone) and not rows.empty:
        # Rows the online store lost: gone, unless this round wrote them again (at ``now``).
        marked = rows[keys].merge(gone[keys].drop_duplicates().assign(_gone=True), how="left")
        written_before = pd.to_datetime(rows[COMPUTED_AT], utc=True) < now
        rows = rows.loc[~(marked["_gone"].notna().to_numpy() & written_before.to_numpy())]
    if rows.empty:
        return TierValues.absent(n, 0)
    rows = newest_per_key(rows, keys)
    rows = rows.assign(_at=pd.to_datetime(rows[COMPUTED_AT], utc=True))
    numbered = rows[keys].assign(_row=np.arange(len(rows)))
    matched = pairs[keys].merge(numbered, on=keys, how="left")["_row"]
    found = matched.notna().to_numpy()
    index = matched.fillna(-1).to_numpy(dtype=np.int64)
    lengths = rows[EMBEDDING].map(lambda v: -1 if v is None else len(v)).to_numpy()
    dim = int(np.bincount(lengths[lengths >= 0]).argmax()) if (lengths >= 0).any() else 0
    present = found.copy()
    present[found] = lengths[index[found]] == dim
    vectors = np.zeros((n, dim), dtype=np.float32)
    if present.any():
        vectors[present] = np.stack(
            [np.asarray(rows[EMBEDDING].iat[i], dtype=np.float32) for i in index[present]]
        )
    made_by_version = np.zeros(n, dtype=bool)
    made_by_version[found] = version_matches(
        rows[MODEL_VERSION].to_numpy()[index[found]], embedding_version
    )
    computed_at_s = np.full(n, np.nan)
    stamps = rows["_at"]
    seconds = (stamps - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy(dtype=np.float64)
    computed_at_s[found] = seconds[index[found]]
    return TierValues(
        vectors=vectors,
        present=present,
        version_matches=made_by_version,
        computed_at_s=computed_at_s,
    )


def _version_tags(spec: PrecomputeRun) -> dict[str, str]:
    from solaris_feast.store.tags import (
        TAG_COMPRESSOR_VERSION,
        TAG_FM_VERSION,
        TAG_VERIFIER_VERSION,
    )

    return {
        TAG_FM_VERSION: spec.fm_version,
        TAG_COMPRESSOR_VERSION: spec.embedding_version,
        TAG_VERIFIER_VERSION: spec.vm_version,
    }


def _tags_outdated(snapshot: RegistrySnapshot, spec: PrecomputeRun) -> bool:
    """Whether the round's start saw a view (or the resolved view) without this round's version
    tags: only then does :func:`tag_views_with_versions` open the store to change them."""
    from solaris_feast.store.tags import TAG_COMPRESSOR_VERSION

    wanted = _version_tags(spec)
    if any(view.tags.get(k) != v for view in snapshot.views.values() for k, v in wanted.items()):
        return True
    resolved = snapshot.resolved_tags
    return resolved is not None and resolved.get(TAG_COMPRESSOR_VERSION) != spec.embedding_version


def tag_views_with_versions(store: FeatureStore, spec: PrecomputeRun) -> list[str]:
    """Set the views' ``solaris.*_version`` tags to the models of this run's vectors.

    Lineage review traces a served vector through these tags to the FM, compressor and verifier
    cards; they change (one registry update) only when a run writes with new models.
    """
    from solaris_feast.store.definitions import applied_view_names
    from solaris_feast.store.tags import TAG_COMPRESSOR_VERSION

    wanted = _version_tags(spec)
    names = applied_view_names(store)
    changed: list[Any] = []  # FeatureStore.apply takes a list of any Feast object
    for name in names.view_name_by_tier().values():
        view = store.get_feature_view(name)
        if any(view.tags.get(k) != v for k, v in wanted.items()):
            view.tags.update(wanted)
            changed.append(view)
    # The resolved on-demand view reads the three views: it carries the compressor's version.
    compressor_tag = TAG_COMPRESSOR_VERSION
    for resolved in store.list_on_demand_feature_views():
        if resolved.name == names.resolved_view_name and resolved.tags.get(compressor_tag) != (
            spec.embedding_version
        ):
            resolved.tags[compressor_tag] = spec.embedding_version
            changed.append(resolved)
    if changed:
        store.apply(changed)
        logger.info("views %s now tagged %s", [v.name for v in changed], wanted)
    return [v.name for v in changed]
