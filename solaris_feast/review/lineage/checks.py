"""The lineage checks: each returns findings, ``error`` ones fail the review."""

from __future__ import annotations

from datetime import datetime

from solaris_feast.review.lineage.model import (
    CHECK_MISSING_VERSION_TAGS,
    CHECK_MIXED_COMPRESSOR_VERSIONS,
    CHECK_NO_SOLARIS_VIEWS,
    CHECK_STALE_VIEW,
    CHECK_TTL_SHORTER_THAN_SCHEDULE,
    CHECK_VM_EXPECTS_OTHER_COMPRESSOR,
    CHECK_WEIGHTS_SHA256_MISMATCH,
    Finding,
    LineageReport,
    ViewLineage,
    is_versioned,
)
from solaris_feast.review.lineage.schedule import format_seconds, schedule_interval_seconds
from solaris_feast.store.tags import (
    TAG_COMPRESSOR_VERSION,
    TAG_PRODUCING_DAG,
    TAG_SCHEDULE,
    TAG_TIER,
    TAG_TTL_SECONDS,
    VERSION_TAGS,
)

# An on-demand view stores nothing: only the embedding space it resolves in must be named.
ON_DEMAND_VERSION_TAGS = (TAG_COMPRESSOR_VERSION,)


def check_lineage(report: LineageReport, now: datetime) -> list[Finding]:
    """Run every check over a report; the order is stable so output diffs cleanly."""
    findings: list[Finding] = []
    if not any(TAG_TIER in view.tags for view in report.views):
        # Nothing to review is not a passed review: a repo never applied, or another project.
        findings.append(
            Finding(
                CHECK_NO_SOLARIS_VIEWS,
                report.project,
                f"the registry of project {report.project!r} in {report.repo} holds no SOLARIS "
                "view: run `feast apply` in the feature repo (or point --repo/--config at the "
                "one that serves)",
            )
        )
    for view in report.views:
        findings += _check_version_tags(view)
        findings += _check_ttl_against_schedule(view, report)
        findings += _check_freshness(view, now)
    findings += _check_services(report)
    findings += _check_cards(report)
    return findings


def _check_version_tags(view: ViewLineage) -> list[Finding]:
    required = VERSION_TAGS if view.kind == "feature_view" else ON_DEMAND_VERSION_TAGS
    missing = [t for t in required if not is_versioned(view.tags.get(t))]
    if not missing:
        return []
    shown = ", ".join(f"{t}={view.tags.get(t)!r}" if t in view.tags else t for t in missing)
    return [
        Finding(
            CHECK_MISSING_VERSION_TAGS,
            view.name,
            f"view {view.name!r} has no usable version tags ({shown}): a vector it serves cannot "
            "be traced to the models that made it. Build it with solaris_definitions() and set "
            "fm_version, compressor_version and verifier_version from the model cards.",
        )
    ]


def _check_ttl_against_schedule(view: ViewLineage, report: LineageReport) -> list[Finding]:
    findings: list[Finding] = []
    if view.kind != "feature_view":
        return findings
    tag_ttl = view.tags.get(TAG_TTL_SECONDS)
    if tag_ttl is not None and view.ttl_seconds is not None:
        try:
            mismatch = abs(float(tag_ttl) - view.ttl_seconds) > 0.5
        except ValueError:
            mismatch = True
        if mismatch:
            findings.append(
                Finding(
                    "lineage",
                    view.name,
                    f"tag {TAG_TTL_SECONDS}={tag_ttl!r} disagrees with the view's TTL of "
                    f"{view.ttl_seconds:.0f} s; the TTL is what readers enforce",
                    "warning",
                )
            )
    dag = next((d for d in report.dags if d.dag_id == view.producing_dag), None)
    tag_schedule = view.tags.get(TAG_SCHEDULE)
    if dag is not None and tag_schedule and dag.interval_seconds is not None:
        try:
            tag_interval = schedule_interval_seconds(tag_schedule)
        except ValueError:
            tag_interval = None
        if tag_interval != dag.interval_seconds:
            findings.append(
                Finding(
                    "lineage",
                    view.name,
                    f"tag {TAG_SCHEDULE}={tag_schedule!r} disagrees with DAG {dag.dag_id!r} "
                    f"({dag.schedule}, in {dag.path}); the DAG is what runs",
                    "warning",
                )
            )
    if view.producing_dag_tag and dag is not None and view.producing_dag_tag != dag.dag_id:
        findings.append(
            Finding(
                "lineage",
                view.name,
                f"tag {TAG_PRODUCING_DAG}={view.producing_dag_tag!r} names no DAG in the DAG "
                f"folder, but {dag.dag_id!r} ({dag.path}) declares the view's asset; set the tag "
                f"to {dag.dag_id!r}",
                "warning",
            )
        )
    if view.producing_dag and dag is None:
        findings.append(
            Finding(
                "lineage",
                view.name,
                f"producing DAG {view.producing_dag!r} was not found in the DAG folder; "
                "its schedule is taken from the view's tag",
                "warning",
            )
        )
    interval = view.schedule_interval_seconds
    if view.ttl_seconds is None or interval is None:
        return findings
    if view.ttl_seconds < interval:
        findings.append(
            Finding(
                CHECK_TTL_SHORTER_THAN_SCHEDULE,
                view.name,
                f"TTL {format_seconds(view.ttl_seconds)} of {view.name!r} is shorter than the "
                f"{format_seconds(interval)} between runs of its producing DAG "
                f"{view.producing_dag!r} ({view.schedule}): every entry expires before the next "
                "run refreshes it, so misses are guaranteed. Raise the TTL or run the DAG more "
                "often.",
            )
        )
    return findings


def _check_freshness(view: ViewLineage, now: datetime) -> list[Finding]:
    if view.kind != "feature_view" or view.ttl_seconds is None:
        return []
    refreshed = [t for t in (view.last_materialization, view.last_write) if t is not None]
    if not refreshed:
        return [
            Finding(
                CHECK_STALE_VIEW,
                view.name,
                f"{view.name!r} has never been materialized and its offline table holds no "
                "writes: every read is a miss until its producing DAG runs",
                "warning",
            )
        ]
    last = max(refreshed)
    age = (now - last).total_seconds()
    if age <= view.ttl_seconds:
        return []
    return [
        Finding(
            CHECK_STALE_VIEW,
            view.name,
            f"{view.name!r} was last refreshed at {last.isoformat()} "
            f"({format_seconds(age)} ago), longer ago than its TTL of "
            f"{format_seconds(view.ttl_seconds)}: every stored entry has expired. Check the "
            f"producing DAG {view.producing_dag!r}.",
        )
    ]


def _check_services(report: LineageReport) -> list[Finding]:
    findings = []
    views = {v.name: v for v in report.views}
    # The VM that reads the service is the chain in service (models.cards.serving_chain).
    vm_cards = [c for c in report.cards if c.kind == "vm" and c.role == "serving"]
    compressor_versions = {c.version for c in report.cards if c.kind == "compressor"}
    for service in report.services:
        if len(service.compressor_versions) > 1:
            by_version = {
                version: [
                    n
                    for n in service.views
                    if n in views and views[n].compressor_version == version
                ]
                for version in service.compressor_versions
            }
            shown = "; ".join(f"{v}: {', '.join(names)}" for v, names in by_version.items())
            findings.append(
                Finding(
                    CHECK_MIXED_COMPRESSOR_VERSIONS,
                    service.name,
                    f"feature service {service.name!r} serves views made by different "
                    f"compressors ({shown}): their vectors live in different embedding spaces "
                    "and must not be mixed. Rewrite the stale views with the current compressor.",
                )
            )
        for vm in vm_cards:
            expected = set(vm.parents) & compressor_versions
            if not expected:
                continue  # the card does not say which compressor it was trained on
            other = sorted(set(service.compressor_versions) - expected)
            if other:
                findings.append(
                    Finding(
                        CHECK_VM_EXPECTS_OTHER_COMPRESSOR,
                        service.name,
                        f"VM {vm.version!r} was trained on embeddings of compressor "
                        f"{sorted(expected)}, but {service.name!r} serves compressor {other}",
                    )
                )
    return findings


def _check_cards(report: LineageReport) -> list[Finding]:
    findings = []
    for card in report.cards:
        if card.weights_status == "mismatch":
            findings.append(
                Finding(
                    CHECK_WEIGHTS_SHA256_MISMATCH,
                    card.version,
                    f"{card.kind} card {card.version!r} ({card.path}) records sha256 "
                    f"{card.weights_sha256 or '<none>'} but {card.weights_file} hashes to "
                    f"{card.weights_actual_sha256}: the weights changed after the card "
                    "was written. Retrain, or restore the original file.",
                )
            )
        elif card.weights_status == "missing":
            findings.append(
                Finding(
                    CHECK_WEIGHTS_SHA256_MISMATCH,
                    card.version,
                    f"{card.kind} card {card.version!r}: weights file {card.weights_file} is "
                    "missing, so it cannot be verified",
                    "warning",
                )
            )
    return findings
