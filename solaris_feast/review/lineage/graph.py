"""The lineage graph: data sources and DAG tasks through views and services to model cards."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from solaris_feast.pipeline.assets import VIEW_ASSET_TIERS, view_asset
from solaris_feast.review.lineage.model import (
    DagLineage,
    GraphEdge,
    GraphNode,
    LineageReport,
    ViewLineage,
)
from solaris_feast.review.lineage.schedule import format_seconds
from solaris_feast.store.tags import TAG_TIER


def node_id(kind: str, name: str) -> str:
    return f"{kind}_{re.sub(r'[^0-9A-Za-z_]', '_', name)}"


def lineage_graph(report: LineageReport) -> tuple[list[GraphNode], list[GraphEdge]]:
    """Nodes and edges from data sources and DAGs through views and services to model cards."""
    nodes: dict[str, GraphNode] = {}
    edges: list[GraphEdge] = []

    def node(kind: str, name: str, label: str, group: str | None = None) -> str:
        key = node_id(kind, name)
        nodes.setdefault(key, GraphNode(key, label, kind, group))
        return key

    def edge(source: str, target: str, label: str = "", dashed: bool = False) -> None:
        candidate = GraphEdge(source, target, label, dashed)
        if candidate not in edges:
            edges.append(candidate)

    dag_by_id = {d.dag_id: d for d in report.dags}
    asset_producer: dict[str, str] = {}
    for dag in report.dags:
        group = node_id("dag", dag.dag_id)
        for task in dag.tasks:
            task_node = node("task", f"{dag.dag_id}.{task.task_id}", task.task_id, group)
            for asset in task.outlets:
                edge(task_node, node("asset", asset, f"asset {asset}"), "outlet")
                asset_producer.setdefault(asset, task_node)
    for dag in report.dags:
        for asset in dag.triggering_assets:
            edge(node("asset", asset, f"asset {asset}"), node_id("dag", dag.dag_id), "triggers")

    for registered in report.sources:
        if registered.kind == "file":
            node("table", registered.name, f"offline table {registered.path or registered.name}")
        elif registered.kind == "push":
            node("push", registered.name, f"push source {registered.name}")
        elif registered.kind == "request":
            node("request", registered.name, f"request {registered.name}")
        else:
            node("table", registered.name, f"{registered.kind} {registered.name}")
        if registered.kind == "push" and registered.batch_source:
            node("table", registered.batch_source, f"offline table {registered.path or ''}")
            edge(
                node_id("push", registered.name),
                node_id("table", registered.batch_source),
                "offline",
            )

    kinds = {s.name: s.kind for s in report.sources}
    for view in report.views:
        label = f"{view.name}<br/>TTL {format_seconds(view.ttl_seconds)}"
        if view.kind == "on_demand":
            view_node = node("odfv", view.name, f"on-demand {view.name}")
            view_kinds = {v.name: v.kind for v in report.views}
            for source in view.sources:
                if source in view_kinds:
                    kind = "odfv" if view_kinds[source] == "on_demand" else "view"
                    edge(node_id(kind, source), view_node)
                else:
                    # Not a view, so a request source (Feast does not always list those).
                    edge(node("request", source, f"request {source}"), view_node)
            continue
        view_node = node("view", view.name, label)
        for source in view.sources:
            kind = kinds.get(source, "file")
            source_node = node_id("push" if kind == "push" else "table", source)
            if source_node not in nodes:
                node("table", source, f"source {source}")
                source_node = node_id("table", source)
            edge(source_node, view_node, "push" if kind == "push" else "materialize")
        if view.producing_dag:
            writer = _producer_node(view, report, dag_by_id, asset_producer, node)
            push_sources = [s for s in view.sources if kinds.get(s) == "push"]
            table_sources = [s for s in view.sources if kinds.get(s) != "push"]
            for push in push_sources:
                edge(writer, node_id("push", push), "push")
            if not push_sources:
                for table in table_sources:
                    edge(writer, node_id("table", table), "writes")
                # Embeddings also go straight to the online store, not only through the table.
                edge(writer, view_node, "online write", dashed=True)

    for service in report.services:
        service_node = node("service", service.name, f"feature service {service.name}")
        for name in service.views:
            kind = next((v.kind for v in report.views if v.name == name), "feature_view")
            edge(node_id("odfv" if kind == "on_demand" else "view", name), service_node)

    cards_by_version = {c.version: c for c in report.cards if c.in_use}
    for card in cards_by_version.values():
        card_node = node("card", card.version, f"{card.kind.upper()} {card.version}")
        for parent in card.parents:
            if parent in cards_by_version:
                edge(node_id("card", parent), card_node, "parent", dashed=True)
        # A training DAG marks an asset per model kind (``solaris_model_vm``): link it.
        for dag in report.dags:
            for asset in dag.outlets:
                if card.role == "serving" and asset.endswith(f"_{card.kind}"):
                    edge(node_id("asset", asset), card_node, "registers", dashed=True)
        if card.kind == "vm" and card.role == "serving":
            for service in report.services:
                edge(node_id("service", service.name), card_node, "consumes")
    for view in report.views:
        version = view.compressor_version
        if version in cards_by_version and view.kind == "feature_view":
            edge(node_id("card", version), node_id("view", view.name), "z space", dashed=True)
        verifier = view.verifier_version
        # The verifier plans which pairs get precomputed; the other tiers only derive from them.
        plans = view.tags.get(TAG_TIER, "EXACT") == "EXACT"
        if verifier in cards_by_version and view.producing_dag and plans:
            dag_node = node_id("dag", view.producing_dag)
            if view.producing_dag in dag_by_id:
                edge(node_id("card", verifier), dag_node, "verifier", dashed=True)
    return list(nodes.values()), edges


def _producer_node(
    view: ViewLineage,
    report: LineageReport,
    dag_by_id: Mapping[str, DagLineage],
    asset_producer: Mapping[str, str],
    node: Any,
) -> str:
    """The task (via its asset) or the DAG that writes a view; a placeholder when not found."""
    dag_id = view.producing_dag or ""
    dag = dag_by_id.get(dag_id)
    if dag is None:
        return str(node("dag", dag_id, f"DAG {dag_id}<br/>{view.schedule or '?'} (file not found)"))
    needles = {view.name, *view.sources}
    tier = view.tags.get(TAG_TIER, "").upper()
    if tier in VIEW_ASSET_TIERS:
        # The precompute DAG marks a view's role asset, whatever the repo names the view: a
        # repo of its own names (shop_pair) lost the asset -> view link.
        needles.add(view_asset(tier)[0])
    needles |= {Path(s.path).name for s in report.sources if s.name in view.sources and s.path}
    outlets = [a for t in dag.tasks for a in t.outlets]
    exact = [a for a in outlets if a in needles]
    loose = [a for a in outlets if any(n and n in a for n in needles)]
    for asset in exact or loose:
        return node_id("asset", asset)
    return node_id("dag", dag_id)
