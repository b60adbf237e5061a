"""What a round needs to know of its Feast registry, read once by its first task.

Importing Feast costs about 10 s of a task's process on a loaded 2-core machine (it imports
torch too, through ``feast.torch_wrapper``), and under a real executor every task is a fresh
process. Most tasks of a round need only the views' TTLs, tags, columns and offline folders, so
``start`` (which opens the store anyway, to check the views) writes them to ``registry.json`` in
the run folder, and the other tasks read that file; they open Feast only to write or to read the
online store (the miss queue reaches it from the yaml alone,
:func:`~solaris_feast.store.config.repo_online_facts`).

The snapshot is the registry as the round started: a view re-applied during the round takes
effect at the next round, as a retried task sees the same inputs as its first try.

For a file registry ``start`` need not open Feast either: the newest snapshot is also kept in
the runs folder with the registry's fingerprint
(:func:`~solaris_feast.store.config.registry_fingerprint`: the registry file's bytes, the
expanded config and the repo folder), and a round whose registry has not changed since an
earlier round reads it from there. ``feast apply`` rewrites the file, so the next round reads
the registry through Feast again.

Cost: pydantic only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, ValidationError

from solaris_feast.pipeline.runs import write_atomic, write_once

if TYPE_CHECKING:
    from feast import FeatureStore

    from solaris_feast.tiers import Tier

SNAPSHOT_FILE = "registry.json"
_CONFIG = ConfigDict(extra="forbid", frozen=True)


class ViewSnapshot(BaseModel):
    """One feature view as the round started."""

    model_config = _CONFIG

    name: str
    ttl_seconds: float
    """The view's TTL (0: none)."""
    tags: dict[str, str]
    columns: list[str]
    """Join keys, then features: the columns of its offline rows."""
    offline_root: str
    """Folder of its parquet log (:func:`solaris_feast.store.offline.offline_view_root`)."""
    key_types: dict[str, str] = {}
    """Id type (``int64`` or ``string``) of each join key, as the registry types its entity;
    empty in a snapshot written before key types were recorded (not checked then)."""


class RegistrySnapshot(BaseModel):
    """The SOLARIS views of a round's registry, and the resolved view's tags."""

    model_config = _CONFIG

    project: str
    views: dict[str, ViewSnapshot]
    resolved_tags: dict[str, str] | None = None
    """Tags of the on-demand resolved view; None when the repo has none."""
    names: dict[str, str] = {}
    """View name by tier tag (``EXACT``, ``SIMILAR``, ``USER_AGG``, ``RESOLVED``), as the
    registry has them (:func:`~solaris_feast.store.definitions.applied_view_names`); empty in a
    snapshot written before the names were read from the registry: the default names."""

    def view(self, name: str) -> ViewSnapshot:
        return self.views[name]

    def name_of(self, tier: Tier | str) -> str:
        """The name of the view of ``tier`` (a :class:`~solaris_feast.tiers.Tier` or
        ``"RESOLVED"``) in this registry."""
        from solaris_feast.pipeline.settings import DEFAULT_VIEW_NAMES

        key = tier if isinstance(tier, str) else tier.name
        return self.names.get(key, DEFAULT_VIEW_NAMES[key])

    def tier_view(self, tier: Tier) -> ViewSnapshot:
        """The snapshot of the view that serves ``tier``."""
        return self.views[self.name_of(tier)]

    def names_by_tier(self) -> dict[Tier, str]:
        """The three stored views' names, by the tier each serves."""
        from solaris_feast.tiers import Tier

        return {tier: self.name_of(tier) for tier in (Tier.EXACT, Tier.SIMILAR, Tier.USER_AGG)}


def take_snapshot(store: FeatureStore) -> RegistrySnapshot:
    """The snapshot of the SOLARIS views in ``store``, under the names its registry has them
    (found by their tier tags, :func:`~solaris_feast.store.definitions.applied_view_names`)."""
    from solaris_feast.store.definitions import applied_view_names
    from solaris_feast.store.ids import join_key_types
    from solaris_feast.store.offline import offline_view_root

    applied = applied_view_names(store)
    names = {tier.name: name for tier, name in applied.view_name_by_tier().items()}
    names["RESOLVED"] = resolved = applied.resolved_view_name
    views = {}
    for name in (names["EXACT"], names["USER_AGG"], names["SIMILAR"]):
        view = store.get_feature_view(name)
        ttl = view.ttl.total_seconds() if view.ttl is not None else 0.0
        views[name] = ViewSnapshot(
            name=name,
            ttl_seconds=ttl,
            tags=dict(view.tags),
            columns=[*view.join_keys, *(f.name for f in view.features)],
            offline_root=str(offline_view_root(store, view)),
            key_types=dict(join_key_types(view)),
        )
    resolved_tags = next(
        (dict(v.tags) for v in store.list_on_demand_feature_views() if v.name == resolved), None
    )
    return RegistrySnapshot(
        project=store.config.project, views=views, resolved_tags=resolved_tags, names=names
    )


SNAPSHOT_CACHE = ".registry_snapshot.json"
"""File in the runs folder with the newest snapshot and its registry's fingerprint (a file, so
that the runs folder's ``<interval>/<vm version>/`` layout holds rounds only)."""


def cached_snapshot(runs_dir: Path, fingerprint: str) -> RegistrySnapshot | None:
    """The snapshot an earlier round took of the registry with this fingerprint, if it is the
    one kept (one that no longer parses, written by another version, counts as none)."""
    path = runs_dir / SNAPSHOT_CACHE
    if not path.is_file():
        return None
    try:
        kept = json.loads(path.read_text())
        if kept.get("fingerprint") != fingerprint:
            return None
        return RegistrySnapshot.model_validate(kept["snapshot"])
    except (ValueError, KeyError, AttributeError, ValidationError):
        return None


def cache_snapshot(runs_dir: Path, fingerprint: str, snapshot: RegistrySnapshot) -> None:
    runs_dir.mkdir(parents=True, exist_ok=True)
    kept = {"fingerprint": fingerprint, "snapshot": snapshot.model_dump(mode="json")}
    write_atomic(runs_dir / SNAPSHOT_CACHE, json.dumps(kept))


def write_snapshot(run_dir: Path, snapshot: RegistrySnapshot) -> None:
    """Keep the first attempt's snapshot (a retried ``start`` sees the same registry)."""
    write_once(run_dir / SNAPSHOT_FILE, snapshot.model_dump_json(indent=2))


def read_snapshot(run_dir: Path) -> RegistrySnapshot | None:
    """The run's snapshot; None for a run folder written before snapshots existed."""
    path = run_dir / SNAPSHOT_FILE
    if not path.is_file():
        return None
    return RegistrySnapshot.model_validate(json.loads(path.read_text()))
