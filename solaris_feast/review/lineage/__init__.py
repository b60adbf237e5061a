"""Feature lineage review: where a served vector came from, is it fresh, which model made it.

Three sources are joined (:mod:`.build`):

- the Feast registry (:mod:`.feast_repo`): feature views (TTL, tags, sources, materialization
  intervals), on-demand views, feature services and every data source, push sources included
  (Feast's own lineage leaves those out);
- the model cards in ``models/``, read and hashed by the torch-free
  :mod:`solaris_feast.models.cards` (:mod:`.model_cards` picks the cards in use);
- the Airflow DAGs in ``dags/``, as Airflow's own DAG objects (:mod:`.dags`, which says why and
  what it costs): DAG ids, schedules, tasks, asset outlets.

The result is a :class:`LineageReport` (:mod:`.model`): a graph (:mod:`.graph`), a table per
view, and findings (:mod:`.checks`), rendered as Markdown, HTML or JSON (:mod:`.render`).
Findings of severity ``error`` make :func:`lineage_command` (:mod:`.cli`) exit 1:

- ``missing_version_tags``: a view lacks ``solaris.fm_version`` / ``compressor_version`` /
  ``verifier_version`` (an on-demand view needs ``compressor_version``);
- ``mixed_compressor_versions``: one feature service serves views made by different
  compressors, i.e. vectors from different embedding spaces;
- ``ttl_shorter_than_schedule``: a view's TTL is shorter than the longest gap between runs of its
  producing DAG, so every entry expires before the next run refreshes it;
- ``stale_view``: the last materialization (or offline write) is older than the TTL;
- ``weights_sha256_mismatch``: a model card's weights file is not the file it was trained into;
- ``vm_expects_other_compressor``: the VM was trained on another compressor's embeddings than
  the views of the service it consumes.
"""

from __future__ import annotations

from solaris_feast.review.lineage.build import build_lineage
from solaris_feast.review.lineage.checks import check_lineage
from solaris_feast.review.lineage.cli import lineage_cli, lineage_command
from solaris_feast.review.lineage.coverage import latest_coverage_file, read_coverage
from solaris_feast.review.lineage.dags import read_dags
from solaris_feast.review.lineage.model import (
    CHECK_MISSING_VERSION_TAGS,
    CHECK_MIXED_COMPRESSOR_VERSIONS,
    CHECK_NO_SOLARIS_VIEWS,
    CHECK_STALE_VIEW,
    CHECK_TTL_SHORTER_THAN_SCHEDULE,
    CHECK_VM_EXPECTS_OTHER_COMPRESSOR,
    CHECK_WEIGHTS_SHA256_MISMATCH,
    DagLineage,
    DagTask,
    Finding,
    GraphEdge,
    GraphNode,
    LineageReport,
    ModelCardLineage,
    ServiceLineage,
    SourceLineage,
    ViewLineage,
)
from solaris_feast.review.lineage.render import FORMATS, render, to_mermaid
from solaris_feast.review.lineage.schedule import format_seconds, schedule_interval_seconds

__all__ = [
    "CHECK_MISSING_VERSION_TAGS",
    "CHECK_MIXED_COMPRESSOR_VERSIONS",
    "CHECK_NO_SOLARIS_VIEWS",
    "CHECK_STALE_VIEW",
    "CHECK_TTL_SHORTER_THAN_SCHEDULE",
    "CHECK_VM_EXPECTS_OTHER_COMPRESSOR",
    "CHECK_WEIGHTS_SHA256_MISMATCH",
    "FORMATS",
    "DagLineage",
    "DagTask",
    "Finding",
    "GraphEdge",
    "GraphNode",
    "LineageReport",
    "ModelCardLineage",
    "ServiceLineage",
    "SourceLineage",
    "ViewLineage",
    "build_lineage",
    "check_lineage",
    "format_seconds",
    "latest_coverage_file",
    "lineage_cli",
    "lineage_command",
    "read_coverage",
    "read_dags",
    "render",
    "schedule_interval_seconds",
    "to_mermaid",
]
