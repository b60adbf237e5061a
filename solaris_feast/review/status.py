"""``solaris status``: what the online store holds now, and what serving would get from it.

Read straight from the online store, within a budget of keys:

- rows per stored view (pair, similar, user), how many are fresh or expired by the view's TTL in
  the registry, and how many carry the expected model version (the embedding version of the
  newest VM's chain in the model cards, unless given);
- a freshness histogram of the stored embeddings (age since ``computed_at``);
- the miss-queue depth (pairs waiting for the next precompute round);
- coverage by tier: the stored (user, item) pairs of a sample of users are fetched through the
  real :class:`~solaris_feast.serving.retriever.SolarisRetriever` (misses not recorded), so the
  shares are
  what serving answers, TTL, version and fallback order included.

The store is read through its backend's bounded ``scan`` (``store/backends/``): Feast's tables on
SQLite, ``SCAN ... COUNT`` over the keys that end with the project name on Redis (never
``KEYS``), stopping after ``max_keys`` keys. Fresh and servable are counted by the tier rule
itself (:func:`solaris_feast.serving.resolve.usable_rows`), so the status and serving agree.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import typer
import yaml

from solaris_feast.columns import ITEM_ID, USER_ID
from solaris_feast.errors import ConfigError, SolarisError
from solaris_feast.serving.resolve import (
    TierValues,
    rejection_counts,
    repo_clock_skew,
    usable_rows,
)
from solaris_feast.store.backends import StoredScan, StoredValues, backend_for, online_kind
from solaris_feast.store.config import open_repo_store
from solaris_feast.store.definitions import SolarisFeastConfig, applied_view_names
from solaris_feast.store.layout import (
    decode_string,
    decode_timestamp,
    stored_model_version,
    version_matches,
)
from solaris_feast.tiers import Tier

if TYPE_CHECKING:
    from feast import FeatureStore

logger = logging.getLogger(__name__)

AGE_BUCKETS: tuple[tuple[str, float], ...] = (
    ("<1h", 3600.0),
    ("1-3h", 3 * 3600.0),
    ("3-6h", 6 * 3600.0),
    ("6-12h", 12 * 3600.0),
    ("12-24h", 24 * 3600.0),
    (">24h", math.inf),
)
"""Freshness buckets: a label and the exclusive upper bound of the age in seconds."""
DEFAULT_MAX_KEYS = 100_000
"""Stored rows (SQLite) or Redis keys read at most; past it the report says ``truncated``."""
DEFAULT_MAX_USERS = 200
"""Users whose stored pairs are fetched through the retriever for the coverage."""
DEFAULT_SCAN_COUNT = 1000
"""``COUNT`` hint of each Redis ``SCAN`` call: keys the server looks at per call."""
SCAN_TIMEOUT_SECONDS = 10.0
"""Longest single wait of the status scan (a network receive or a lock)."""
COVERAGE_DEADLINE_MS = 10_000.0
"""Deadline of the coverage fetches: a status run measures the data, not the latency."""
MAX_ITEMS_PER_FETCH = 1000
_TIER_ORDER = (Tier.EXACT, Tier.SIMILAR, Tier.USER_AGG)


@dataclass(frozen=True)
class StoredRow:
    """One stored row of one view, as much of it as the status needs.

    Attributes:
        tier: the view's tier.
        user_id: the user of the row (int for Int64 ids, str for String ids).
        item_id: the item, None for the user view.
        model_version: the stored ``model_version``; None when absent or unreadable.
        computed_at: the stored ``computed_at`` in unix seconds; None when absent.
    """

    tier: Tier
    user_id: int | str
    item_id: int | str | None
    model_version: str | None
    computed_at: float | None


def age_bucket(age_seconds: float) -> str:
    """The :data:`AGE_BUCKETS` label of an age (a negative age, from clock skew, is fresh)."""
    for label, upper in AGE_BUCKETS:
        if age_seconds < upper:
            return label
    return AGE_BUCKETS[-1][0]


def _rows(scan: StoredScan) -> list[StoredRow]:
    return [_row(stored) for stored in scan.rows]


def _row(stored: StoredValues) -> StoredRow:
    # The serving decoders: a value that does not parse is unknown (a miss), as served.
    computed_at = decode_timestamp(stored.computed_at)
    return StoredRow(
        tier=stored.tier,
        user_id=stored.keys[USER_ID],
        item_id=stored.keys.get(ITEM_ID),
        model_version=decode_string(stored.model_version),
        computed_at=None if computed_at != computed_at else computed_at,
    )


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _view_summary(
    name: str,
    tier: Tier,
    ttl_seconds: float,
    rows: list[StoredRow],
    expected: str | None,
    now: float,
    clock_skew_seconds: float,
) -> dict[str, Any]:
    histogram = dict.fromkeys((label for label, _ in AGE_BUCKETS), 0)
    versions: Counter[str] = Counter(row.model_version or "<none>" for row in rows)
    computed = np.array(
        [np.nan if r.computed_at is None else r.computed_at for r in rows], dtype=np.float64
    )
    is_current = version_matches([r.model_version for r in rows], expected)
    dated = np.isfinite(computed)
    for age in (now - computed[dated]).tolist():
        histogram[age_bucket(age)] += 1
    # The tier rule decides freshness (TTL boundary, clock skew): the status reads no vectors,
    # so each row counts as a stored, finite vector; "fresh" ignores the version, "servable"
    # is the rule as serving applies it.
    n = len(rows)
    stored = np.ones(n, dtype=bool)
    no_vectors = np.zeros((n, 1), dtype=np.float32)
    fresh_rows = usable_rows(
        no_vectors, stored, stored, computed, now, ttl_seconds, clock_skew_seconds
    )
    servable = usable_rows(
        no_vectors, stored, is_current, computed, now, ttl_seconds, clock_skew_seconds
    )
    # Why dated rows are not fresh, counted as serving counts them: a row from the future is
    # "future", not also "expired".
    refused = rejection_counts(
        TierValues(
            vectors=no_vectors, present=dated, version_matches=stored, computed_at_s=computed
        ),
        now,
        ttl_seconds,
        clock_skew_seconds,
    )
    undated = int((~dated).sum())
    fresh = int(fresh_rows.sum())
    current = int(is_current.sum())
    fresh_current = int(servable.sum())
    return {
        "name": name,
        "tier": tier.name,
        "ttl_seconds": ttl_seconds,
        "rows": len(rows),
        "fresh": fresh,
        "expired": refused["stale"],
        "future": refused["future"],
        "without_computed_at": undated,
        "expected_version": current,
        "other_version": len(rows) - current,
        "fresh_expected_version": fresh_current,
        "versions": dict(sorted(versions.items())),
        "age_histogram": histogram,
    }


def _coverage(
    store: FeatureStore,
    rows: list[StoredRow],
    expected: str,
    views: SolarisFeastConfig,
    max_users: int,
    seed: int,
) -> dict[str, Any]:
    from solaris_feast.serving.retriever import SolarisRetriever

    pairs: dict[int | str, set[int | str]] = {}
    for row in rows:
        if row.item_id is not None:
            pairs.setdefault(row.user_id, set()).add(row.item_id)
    users = sorted(pairs)
    sampled = users
    if len(users) > max_users:
        chosen = np.random.default_rng(seed).choice(len(users), size=max_users, replace=False)
        sampled = [users[i] for i in sorted(chosen.tolist())]
    counts = np.zeros(len(Tier), dtype=np.int64)
    errors = 0
    retriever = SolarisRetriever(
        store,
        expected,
        deadline_ms=COVERAGE_DEADLINE_MS,
        record_misses=False,  # a status check must not queue work for the precompute
        views=views,
    )
    try:
        for user in sampled:
            for chunk in _chunks(sorted(pairs[user]), MAX_ITEMS_PER_FETCH):
                result = retriever.fetch(user, chunk)  # Int64 or String ids, as stored
                if result.error:
                    errors += len(chunk)
                counts += np.bincount(result.tiers.astype(np.int64), minlength=len(Tier))
    finally:
        retriever.close()
    total = int(counts.sum())
    tiers = sorted(Tier, reverse=True)
    return {
        "users": len(users),
        "users_sampled": len(sampled),
        "pairs": total,
        "errors": errors,
        "counts": {t.name: int(counts[t]) for t in tiers},
        "shares": {t.name: (float(counts[t]) / total if total else 0.0) for t in tiers},
    }


def store_status(
    store: FeatureStore,
    expected_model_version: str | None = None,
    *,
    models_dir: Path | None = None,
    views: SolarisFeastConfig | None = None,
    max_keys: int = DEFAULT_MAX_KEYS,
    max_users: int = DEFAULT_MAX_USERS,
    scan_count: int = DEFAULT_SCAN_COUNT,
    seed: int = 0,
) -> dict[str, Any]:
    """Rows, freshness, versions, miss-queue depth and tier coverage of a SOLARIS online store.

    Args:
        store: a Feast store whose registry holds the SOLARIS views (SQLite or Redis online).
        expected_model_version: the embedding version serving expects. None: the newest VM's
            compressor version in ``models_dir``'s cards, else the most common stored version.
        models_dir: folder of ``<version>.card.json`` model cards (read as JSON).
        views: the view names; TTLs come from the registry.
        max_keys: stored rows (SQLite) or Redis keys read at most.
        max_users: users whose stored pairs are fetched for the coverage (a seeded sample).
        scan_count: ``COUNT`` of each Redis ``SCAN``.
        seed: seed of the user sample.

    Returns:
        A JSON-ready dict: ``views`` (one summary per view), ``freshness_histogram``,
        ``miss_queue_depth``, ``coverage`` (``counts`` and ``shares`` per tier name),
        ``expected_model_version`` and its ``expected_version_source``, and ``scan``.
    """
    from solaris_feast.models.cards import serving_embedding_version
    from solaris_feast.serving.miss_queue import MissQueue

    if max_keys <= 0 or max_users <= 0 or scan_count <= 0:
        raise ValueError(
            f"max_keys, max_users and scan_count must be positive, got "
            f"{max_keys}, {max_users}, {scan_count}"
        )
    names = views or applied_view_names(store)  # the repo's own names, found by tier tags
    view_names = names.view_name_by_tier()
    ttl_seconds: dict[Tier, float] = {}
    from feast.errors import FeatureViewNotFoundException

    for tier, name in view_names.items():
        try:
            ttl = store.get_feature_view(name).ttl
        except FeatureViewNotFoundException as exc:
            raise ConfigError(
                f"feature view {name} is not in the registry of project "
                f"{store.config.project!r}; run `feast apply` in the feature repo first"
            ) from exc
        if ttl is None or ttl.total_seconds() <= 0:
            raise ConfigError(f"feature view {name} needs a positive ttl")
        ttl_seconds[tier] = ttl.total_seconds()

    kind = online_kind(store)
    backend = backend_for(store, timeout_seconds=SCAN_TIMEOUT_SECONDS)
    try:
        scan = backend.scan(view_names, max_keys, scan_count)
        depth = MissQueue(store.config.project, backend=backend).pending()
    finally:
        backend.close()
    rows = _rows(scan)
    now = time.time()

    source = "given"
    expected = expected_model_version
    if expected is None and models_dir is not None:
        expected = serving_embedding_version(models_dir)
        source = "model cards"
    if expected is None:
        stored = Counter(r.model_version for r in rows if r.model_version)
        expected = stored.most_common(1)[0][0] if stored else None
        source = "most common stored version" if expected else "none"

    rows = _named_versions(rows, expected, models_dir)
    skew = repo_clock_skew(store, names.resolved_view_name)  # as the resolved view applies it
    summaries = [
        _view_summary(
            view_names[tier],
            tier,
            ttl_seconds[tier],
            [r for r in rows if r.tier == tier],
            expected,
            now,
            skew,
        )
        for tier in _TIER_ORDER
    ]
    histogram = dict.fromkeys((label for label, _ in AGE_BUCKETS), 0)
    for summary in summaries:
        for label, count in summary["age_histogram"].items():
            histogram[label] += count

    coverage = (
        _coverage(store, rows, expected, names, max_users, seed) if expected is not None else None
    )
    pair_view = view_names[Tier.EXACT]
    logged = _offline_fresh_pairs(store, pair_view, ttl_seconds[Tier.EXACT], now, skew)
    online_fresh = next(s["fresh"] for s in summaries if s["name"] == pair_view)
    return {
        "project": store.config.project,
        "online_store": kind,
        "checked_at": datetime.fromtimestamp(now, UTC).isoformat(),
        "expected_model_version": expected,
        "expected_version_source": source,
        "views": summaries,
        "freshness_histogram": histogram,
        "miss_queue_depth": depth,
        "coverage": coverage,
        "scan": {"max_keys": max_keys, "keys_read": scan.keys_read, "truncated": scan.truncated},
        # Pairs the offline log calls fresh and the online store does not hold (a Redis
        # restarted without persistence, an eviction, a flush): the next round plans them
        # again. None where the scan was cut short and cannot tell.
        "offline_fresh_pairs": logged,
        "lost_online": None if scan.truncated else max(0, logged - online_fresh),
    }


def _offline_fresh_pairs(
    store: FeatureStore, view_name: str, ttl_seconds: float, now: float, skew: float
) -> int:
    """Distinct pairs of the view's offline log with a ``computed_at`` the tier rule calls
    fresh at ``now``; 0 where nothing was logged yet."""
    import pandas as pd

    from solaris_feast.serving.resolve import fresh_window
    from solaris_feast.store.offline import read_offline_rows

    start, end = fresh_window(pd.Timestamp(now, unit="s", tz="UTC"), ttl_seconds, skew)
    # first_round: a store never written has no log, said at INFO, not warned.
    rows = read_offline_rows(store, view_name, start, end, [USER_ID, ITEM_ID], first_round=True)
    return len(rows.drop_duplicates()) if len(rows) else 0


def _named_versions(
    rows: list[StoredRow], expected: str | None, models_dir: Path | None
) -> list[StoredRow]:
    """The rows with each stored version tag (what the online store keeps) replaced by the full
    version it stands for, where the expected version or a model card says which."""
    from solaris_feast.models.cards import scan_cards

    known = [expected] if expected else []
    if models_dir is not None and models_dir.is_dir():
        # A card that does not parse only leaves its tag unnamed here.
        known += [card.version for card in scan_cards(models_dir).cards]
    full_by_tag = {stored_model_version(v): v for v in known}
    return [
        replace(r, model_version=full_by_tag[r.model_version])
        if r.model_version in full_by_tag
        else r
        for r in rows
    ]


# -- presentation ------------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:.0f}h"
    if seconds % 60 == 0:
        return f"{seconds / 60:.0f}m"
    return f"{seconds:.0f}s"


def render_status(status: dict[str, Any], console: Any = None) -> None:
    """Print the status as rich tables."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    out = console or Console()
    out.print(
        f"[bold]SOLARIS status[/bold] project [cyan]{status['project']}[/cyan] "
        f"({status['online_store']}), {status['checked_at']}"
    )
    read_from = status.get("read_from")
    if read_from:
        out.print(
            f"read from {read_from['repo']} ({read_from['feature_store_yaml']}), models "
            f"{read_from['models_dir']}: named by {read_from['named_by']}"
        )
    out.print(
        f"expected model version: [cyan]{status['expected_model_version'] or 'none'}[/cyan] "
        f"({status['expected_version_source']})"
    )
    views = Table(title="Stored rows per view", box=box.SIMPLE_HEAVY)
    views.add_column("view", no_wrap=True)
    # Short headers: the table fits an 80-column terminal.
    for column in ("TTL", "rows", "fresh", "expired", "expected", "other", "servable"):
        views.add_column(column, justify="right")
    for v in status["views"]:
        views.add_row(
            v["name"],
            _duration(v["ttl_seconds"]),
            str(v["rows"]),
            str(v["fresh"]),
            str(v["expired"]),
            str(v["expected_version"]),
            str(v["other_version"]),
            str(v["fresh_expected_version"]),
        )
    out.print(views)
    out.print(
        "expected / other: rows of the expected model version or another; servable: fresh "
        "and of the expected version"
    )

    freshness = Table(title="Freshness of stored embeddings (age since computed_at)")
    freshness.add_column("age")
    for v in status["views"]:
        freshness.add_column(v["name"], justify="right")
    freshness.add_column("all", justify="right")
    for label in status["freshness_histogram"]:
        freshness.add_row(
            label,
            *(str(v["age_histogram"][label]) for v in status["views"]),
            str(status["freshness_histogram"][label]),
        )
    out.print(freshness)

    coverage = status["coverage"]
    if coverage is None:
        out.print("coverage by tier: no expected model version (no cards, nothing stored)")
    else:
        table = Table(title="Coverage by tier, as served")
        table.add_column("tier")
        table.add_column("pairs", justify="right")
        table.add_column("share", justify="right")
        for name, count in coverage["counts"].items():
            table.add_row(name, str(count), f"{coverage['shares'][name]:.1%}")
        out.print(table)
        # Below the table, not as its caption: a caption wraps at the narrow table's width.
        out.print(
            f"{coverage['pairs']} stored pairs of {coverage['users_sampled']} of "
            f"{coverage['users']} users"
        )
        if coverage["errors"]:
            out.print(f"[red]{coverage['errors']} pairs failed to read (counted as ZERO)[/red]")
    out.print(f"miss-queue depth: [bold]{status['miss_queue_depth']}[/bold]")
    if status.get("lost_online"):
        out.print(
            f"[yellow]the offline log calls {status['offline_fresh_pairs']} pairs fresh; "
            f"{status['lost_online']} of them are not in the online store (a restart without "
            "persistence, an eviction or a flush): the next round plans them again[/yellow]"
        )
    scan = status["scan"]
    if scan["truncated"]:
        out.print(
            f"[yellow]read {scan['keys_read']} keys, the --max-keys budget: counts cover "
            "only part of the store[/yellow]"
        )


def plot_freshness(status: dict[str, Any], path: Path) -> Path:
    """PNG bar chart of the freshness histogram, one stacked bar segment per view."""
    from solaris_feast.plots import pyplot, save_figure

    plt = pyplot()

    labels = list(status["freshness_histogram"])
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = np.zeros(len(labels))
    for view in status["views"]:
        heights = np.array([view["age_histogram"][label] for label in labels], dtype=float)
        ax.bar(labels, heights, bottom=bottom, label=view["name"])
        bottom += heights
    ax.set_xlabel("age since computed_at")
    ax.set_ylabel("stored embeddings")
    ax.set_title(f"Freshness of stored SOLARIS embeddings ({status['project']})")
    ax.legend()
    return save_figure(fig, path, dpi=100)


@dataclass(frozen=True)
class StatusTarget:
    """The store and model registry a status reads, and where each was named.

    Attributes:
        repo: the Feast repo folder.
        feature_store_yaml: its config file (relative: inside ``repo``); None: feature_store.yaml.
        models_dir: the model registry (cards).
        source: what named them: ``options``, ``config file <path>``, ``environment`` or
            ``defaults``.
    """

    repo: Path
    feature_store_yaml: Path | None
    models_dir: Path
    source: str


def status_target(
    repo: Path | None = None,
    feature_store_yaml: Path | None = None,
    models_dir: Path | None = None,
    solaris_config: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> StatusTarget:
    """The store a status reads: the one the precompute writes.

    Each of repo, yaml and models comes from its option when given; else from the solaris.yaml
    (``solaris_config``, else ``$SOLARIS_CONFIG``: its ``feast`` and ``models`` sections), which
    the DAGs read first too; else from the DAGs' deployment variables ``SOLARIS_FEATURE_REPO``,
    ``SOLARIS_FEATURE_STORE_YAML`` and ``SOLARIS_MODELS_DIR``; else ``feature_repo``,
    ``feature_store.yaml`` and ``models`` in the working folder. Without this a status after a
    Redis round read the SQLite default and reported an empty store.
    """
    from solaris_feast.config import CONFIG_ENV, load_config
    from solaris_feast.pipeline.settings import ENVIRONMENT_DEFAULTS

    env = os.environ if environ is None else environ
    chosen_config = solaris_config or (
        Path(env[CONFIG_ENV].strip()) if env.get(CONFIG_ENV, "").strip() else None
    )
    named: dict[str, str | None] = {"repo": None, "yaml": None, "models": None}
    source = "defaults"
    if chosen_config is not None:
        config = load_config(chosen_config)
        named = {
            "repo": config.feast.repo,
            "yaml": config.feast.feature_store_yaml,
            "models": config.models.dir,
        }
        source = f"config file {chosen_config}"
    else:
        from_env = {
            "repo": env.get(ENVIRONMENT_DEFAULTS["feature_repo"]) or None,
            "yaml": env.get(ENVIRONMENT_DEFAULTS["feature_store_yaml"]) or None,
            "models": env.get(ENVIRONMENT_DEFAULTS["models_dir"]) or None,
        }
        if any(from_env.values()):
            named, source = from_env, "environment"
    given = (repo, feature_store_yaml, models_dir)
    if all(g is not None for g in given):
        source = "options"
    elif any(g is not None for g in given):
        source = f"options and {source}"
    chosen_repo = repo or Path(named["repo"] or "feature_repo")
    yaml_name = feature_store_yaml
    if yaml_name is None and named["yaml"]:
        # As the precompute reads it: a relative name is a file inside the repo.
        yaml_name = Path(named["yaml"])
        yaml_name = yaml_name if yaml_name.is_absolute() else chosen_repo / yaml_name
    return StatusTarget(
        repo=chosen_repo,
        feature_store_yaml=yaml_name,
        models_dir=models_dir or Path(named["models"] or "models"),
        source=source,
    )


def _names_a_solaris_config(path: Path) -> bool:
    """Whether ``path`` holds a solaris config; a file that does not read is left to the Feast
    yaml's own checks, which say what is wrong with it."""
    from solaris_feast.store.config import is_solaris_config

    try:
        return is_solaris_config(yaml.safe_load(path.read_text()))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False


def status_cli(
    repo: Annotated[
        Path | None,
        typer.Option(
            "--repo",
            help="Feast repo folder (default: the config file's feast.repo, else "
            "$SOLARIS_FEATURE_REPO, else feature_repo).",
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="Feast config other than <repo>/feature_store.yaml (default: the config file's "
            "feast.feature_store_yaml, else $SOLARIS_FEATURE_STORE_YAML); a solaris.yaml named "
            "here is read as --solaris-config, as the other commands read --config.",
        ),
    ] = None,
    models: Annotated[
        Path | None,
        typer.Option(
            "--models",
            help="Folder of model cards (default: the config file's models.dir, else "
            "$SOLARIS_MODELS_DIR, else models).",
        ),
    ] = None,
    solaris_config: Annotated[
        Path | None,
        typer.Option(
            "--solaris-config",
            help="solaris.yaml naming the repo, its yaml and the models "
            "(default: $SOLARIS_CONFIG).",
        ),
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the status as JSON here.")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Write the freshness histogram as a PNG here.")
    ] = None,
    model_version: Annotated[
        str | None,
        typer.Option("--model-version", help="Expected embedding version (default: from cards)."),
    ] = None,
    max_users: Annotated[
        int, typer.Option("--max-users", min=1, help="Users sampled for the coverage.")
    ] = DEFAULT_MAX_USERS,
    max_keys: Annotated[
        int, typer.Option("--max-keys", min=1, help="Stored keys read at most.")
    ] = DEFAULT_MAX_KEYS,
) -> None:
    """Coverage by tier, miss-queue depth and freshness of the stored SOLARIS embeddings."""
    if config is not None and solaris_config is None and _names_a_solaris_config(config):
        # What --config means in every other solaris command; a Feast yaml has a project.
        solaris_config, config = config, None
    try:
        target = status_target(repo, config, models, solaris_config)
        store = open_repo_store(target.repo, target.feature_store_yaml, applied=True)
        status = store_status(
            store,
            model_version,
            models_dir=target.models_dir,
            max_keys=max_keys,
            max_users=max_users,
        )
    except SolarisError as exc:
        typer.echo(f"solaris status: {exc}", err=True)
        raise typer.Exit(2) from exc
    status["read_from"] = {
        "repo": str(target.repo),
        "feature_store_yaml": str(target.feature_store_yaml or "feature_store.yaml"),
        "models_dir": str(target.models_dir),
        "named_by": target.source,
    }
    render_status(status)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(status, indent=2) + "\n")
        typer.echo(f"JSON: {json_path}")
    if plot is not None:
        plot_freshness(status, plot)
        typer.echo(f"plot: {plot}")
