"""Join the Feast registry, the model cards and the DAGs into one :class:`LineageReport`."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

from solaris_feast.review.lineage.checks import check_lineage
from solaris_feast.review.lineage.coverage import latest_coverage_file, read_coverage
from solaris_feast.review.lineage.dags import read_dags
from solaris_feast.review.lineage.feast_repo import (
    feature_view_lineage,
    on_demand_view_lineage,
    service_lineage,
    source_lineage,
)
from solaris_feast.review.lineage.graph import lineage_graph
from solaris_feast.review.lineage.model import LineageReport
from solaris_feast.review.lineage.model_cards import review_cards


def build_lineage(
    repo: Path,
    models_dir: Path,
    dags_dir: Path,
    *,
    now: datetime | None = None,
    coverage_json: Path | None = None,
    feature_store_yaml: Path | None = None,
) -> LineageReport:
    """Read the registry, model cards and DAG files, and run every check.

    Args:
        repo: The Feast repo folder (holds ``feature_store.yaml``).
        models_dir: Folder of model cards.
        dags_dir: Folder of Airflow DAG files.
        now: The time freshness is judged at (UTC); defaults to the current time.
        coverage_json: Coverage per view or tier: the ``coverage.json`` of a precompute run
            or any ``{"exact": 0.6, ...}`` object. Without one, the newest run's file under
            ``<repo>/data/precompute_runs`` is used when there is one.
        feature_store_yaml: Another config than ``<repo>/feature_store.yaml`` (the Redis one);
            a relative path is tried as given, then under ``repo``.
    """
    repo = Path(repo)
    now = now or datetime.now(UTC)
    from solaris_feast.store.config import open_repo_store

    store = open_repo_store(repo, feature_store_yaml, applied=True)
    dags, findings = read_dags(Path(dags_dir))
    dag_by_id = {d.dag_id: d for d in dags}
    coverage_path = coverage_json or latest_coverage_file(repo)
    coverage = read_coverage(coverage_path) if coverage_path is not None else None

    sources = {s.name: source_lineage(s) for s in store.list_data_sources()}
    services = store.list_feature_services()
    services_of: dict[str, list[str]] = {}
    for service in services:
        for projection in service.feature_view_projections:
            services_of.setdefault(projection.name, []).append(service.name)

    views = [
        feature_view_lineage(fv, repo, dag_by_id, sources, services_of, coverage)
        for fv in sorted(store.list_feature_views(), key=lambda v: v.name)
    ]
    views += [
        on_demand_view_lineage(odfv, services_of, coverage)
        for odfv in sorted(store.list_on_demand_feature_views(), key=lambda v: v.name)
    ]
    tagged = {
        version
        for view in views
        for version in (view.fm_version, view.compressor_version, view.verifier_version)
        if version
    }
    cards, card_findings = review_cards(Path(models_dir), tagged)
    findings += card_findings
    report = LineageReport(
        project=store.project,
        repo=str(repo),
        generated_at=now,
        views=tuple(views),
        services=tuple(service_lineage(services, views)),
        sources=tuple(sorted(sources.values(), key=lambda s: s.name)),
        dags=tuple(dags),
        cards=tuple(cards),
        findings=(),
        coverage_source=str(coverage_path) if coverage_path is not None else None,
    )
    nodes, edges = lineage_graph(report)
    return dataclasses.replace(
        report,
        findings=tuple(findings + check_lineage(report, now)),
        nodes=tuple(nodes),
        edges=tuple(edges),
    )
