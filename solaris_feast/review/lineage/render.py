"""The report as Mermaid, Markdown, HTML or JSON."""

from __future__ import annotations

import dataclasses
import html
import json
import re
from collections.abc import Iterable, Sequence
from datetime import datetime

from solaris_feast.review.lineage.graph import node_id
from solaris_feast.review.lineage.model import GraphNode, LineageReport, ViewLineage
from solaris_feast.review.lineage.schedule import format_seconds

FORMATS = ("md", "html", "json")
MERMAID_CDN = "https://cdn.jsdelivr.net/npm/mermaid@11/dist/mermaid.min.js"


def to_mermaid(report: LineageReport) -> str:
    """The graph as a Mermaid ``flowchart LR``, DAG tasks grouped in one subgraph per DAG."""
    shapes = {
        "table": ('[("', '")]'),
        "push": ('>"', '"]'),
        "request": ('(["', '"])'),
        "asset": ('{{"', '"}}'),
        "view": ('["', '"]'),
        "odfv": ('[/"', '"/]'),
        "service": ('(["', '"])'),
        "card": ('[["', '"]]'),
        "task": ('("', '")'),
        "dag": ('("', '")'),
    }
    lines = ["flowchart LR"]
    grouped: dict[str, list[GraphNode]] = {}
    for n in report.nodes:
        if n.group:
            grouped.setdefault(n.group, []).append(n)
    dag_by_node = {node_id("dag", d.dag_id): d for d in report.dags}
    for group_id, dag in dag_by_node.items():
        title = _mermaid_text(f"DAG {dag.dag_id} ({dag.schedule or 'manual'})")
        lines.append(f'  subgraph {group_id}["{title}"]')
        for n in grouped.get(group_id, []):
            left, right = shapes[n.kind]
            lines.append(f"    {n.id}{left}{_mermaid_text(n.label)}{right}")
        if not grouped.get(group_id):
            lines.append(f'    {group_id}_empty["no tasks found"]')
        lines.append("  end")
    for n in report.nodes:
        if n.group or n.id in dag_by_node:
            continue
        left, right = shapes.get(n.kind, ('["', '"]'))
        lines.append(f"  {n.id}{left}{_mermaid_text(n.label)}{right}")
    for e in report.edges:
        arrow = "-.->" if e.dashed else "-->"
        label = f"|{_mermaid_text(e.label)}|" if e.label else ""
        lines.append(f"  {e.source} {arrow}{label} {e.target}")
    lines += [
        "  classDef table fill:#eef,stroke:#557",
        "  classDef push fill:#ffe9cc,stroke:#c80",
        "  classDef view fill:#e6ffe6,stroke:#393",
        "  classDef card fill:#f3e6ff,stroke:#739",
        "  classDef problem fill:#ffd6d6,stroke:#c00,stroke-width:2px",
    ]
    by_kind: dict[str, list[str]] = {}
    for n in report.nodes:
        if n.kind in {"table", "push", "view", "card"}:
            by_kind.setdefault(n.kind, []).append(n.id)
    for kind, ids in by_kind.items():
        lines.append(f"  class {','.join(ids)} {kind}")
    flagged = {f.subject for f in report.errors}
    problem_ids = [
        n.id
        for n in report.nodes
        if n.kind in {"view", "odfv", "service", "card"} and n.id.split("_", 1)[1] in {
            re.sub(r"[^0-9A-Za-z_]", "_", s) for s in flagged
        }
    ]  # fmt: skip
    if problem_ids:
        lines.append(f"  class {','.join(problem_ids)} problem")
    return "\n".join(lines) + "\n"


def _mermaid_text(text: str) -> str:
    return text.replace('"', "#quot;").replace("\n", "<br/>")


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "never"


def _schedule_text(view: ViewLineage) -> str:
    if not view.producing_dag:
        return "-"
    every = view.schedule_interval_seconds
    gap = f", longest gap {format_seconds(every)}" if every is not None else ""
    return f"{view.producing_dag} ({view.schedule or 'schedule unknown'}{gap})"


def view_rows(view: ViewLineage) -> list[tuple[str, str]]:
    """The per-view table as (field, value) rows, shared by Markdown and HTML."""
    coverage = f"{view.coverage:.1%}" if view.coverage is not None else "n/a"

    def stored(text: str) -> str:
        # On-demand views compute at read time: nothing is written or materialized.
        return text if view.kind == "feature_view" else "-"

    other_tags = {k: v for k, v in sorted(view.tags.items())}
    return [
        ("Kind", "on-demand view" if view.kind == "on_demand" else "feature view"),
        ("Entities", ", ".join(view.entities) or "-"),
        ("TTL", f"{format_seconds(view.ttl_seconds)}" + (
            f" ({view.ttl_seconds:.0f} s)" if view.ttl_seconds is not None else "")),
        ("Sources", ", ".join(view.sources) or "-"),
        ("Producing DAG", _schedule_text(view)),
        ("FM version", view.fm_version or "-"),
        ("Compressor version", view.compressor_version or "-"),
        ("Verifier version", view.verifier_version or "-"),
        ("Last write (offline)", stored(_when(view.last_write))),
        ("Last materialization", stored(_when(view.last_materialization))),
        ("Coverage", coverage),
        ("Feature services", ", ".join(view.services) or "-"),
        ("Tags", ", ".join(f"{k}={v}" for k, v in other_tags.items()) or "-"),
    ]  # fmt: skip


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table and the blank line after it."""
    lines = [f"| {' | '.join(header)} |", f"|{' --- |' * len(header)}"]
    lines += [f"| {' | '.join(_md_cell(cell) for cell in row)} |" for row in rows]
    return [*lines, ""]


def to_markdown(report: LineageReport) -> str:
    """The review as Markdown with a Mermaid graph (renders on GitHub and in most viewers)."""
    out = [
        f"# Feature lineage: project `{report.project}`",
        "",
        f"Repo `{report.repo}`, generated {_when(report.generated_at)}. Coverage from "
        f"{'`' + report.coverage_source + '`' if report.coverage_source else 'nowhere (n/a)'}.",
        "",
        "## Checks",
        "",
    ]
    if not report.findings:
        out.append("All checks passed.")
    for f in report.findings:
        mark = "FAIL" if f.severity == "error" else "warn"
        out.append(f"- **{mark}** `{f.check}` {f.subject}: {f.message}")
    out += ["", "## Graph", "", "```mermaid", to_mermaid(report).rstrip(), "```", ""]
    out += ["## Feature views", ""]
    for view in report.views:
        out += [f"### {view.name}", ""]
        out += _md_table(("Field", "Value"), view_rows(view))
    out += ["## Feature services", ""]
    out += _md_table(
        ("Service", "Views", "Compressor versions"),
        [(s.name, ", ".join(s.views), ", ".join(s.compressor_versions) or "-")
         for s in report.services],
    )  # fmt: skip
    out += ["## Data sources", ""]
    out += _md_table(
        ("Source", "Kind", "Path", "Backed by"),
        [(s.name, s.kind, s.path or "-", s.batch_source or "-") for s in report.sources],
    )
    out += ["## DAGs", ""]
    out += _md_table(
        ("DAG", "Schedule", "Longest gap", "Tasks", "Outlets", "File"),
        [(d.dag_id, d.schedule or "manual", format_seconds(d.interval_seconds),
          ", ".join(t.task_id for t in d.tasks), ", ".join(d.outlets) or "-", d.path)
         for d in report.dags],
    )  # fmt: skip
    out += ["## Model cards", ""]
    out += _md_table(
        ("Version", "Kind", "Role", "Parents", "Created", "Weights"),
        [(c.version, c.kind, c.role or "not in use", ", ".join(c.parents) or "-",
          c.created_at or "-", f"{c.weights_status} (`{c.weights_sha256[:12]}`)")
         for c in report.cards],
    )  # fmt: skip
    return "\n".join(out).rstrip("\n") + "\n"


def to_html(report: LineageReport) -> str:
    """A self-contained page; the graph renders with Mermaid from a CDN when online and shows
    its source text otherwise."""
    esc = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>Feature lineage: {esc(report.project)}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1200px}"
        "table{border-collapse:collapse;margin-bottom:1.5em}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}"
        ".error{color:#b00}.warning{color:#a60}</style></head><body>",
        f"<h1>Feature lineage: project <code>{esc(report.project)}</code></h1>",
        f"<p>Repo <code>{esc(report.repo)}</code>, "
        f"generated {esc(_when(report.generated_at))}.</p>",
        "<h2>Checks</h2>",
    ]
    if not report.findings:
        parts.append("<p>All checks passed.</p>")
    else:
        parts.append("<ul>")
        for f in report.findings:
            parts.append(
                f"<li class='{f.severity}'><b>{'FAIL' if f.severity == 'error' else 'warn'}</b> "
                f"<code>{esc(f.check)}</code> {esc(f.subject)}: {esc(f.message)}</li>"
            )
        parts.append("</ul>")
    parts += [
        "<h2>Graph</h2>",
        f"<pre class='mermaid'>{esc(to_mermaid(report))}</pre>",
        "<h2>Feature views</h2>",
    ]
    for view in report.views:
        parts.append(f"<h3>{esc(view.name)}</h3><table>")
        parts += [f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in view_rows(view)]
        parts.append("</table>")
    parts.append("<h2>Feature services</h2><table><tr><th>Service</th><th>Views</th>"
                 "<th>Compressor versions</th></tr>")  # fmt: skip
    for s in report.services:
        parts.append(
            f"<tr><td>{esc(s.name)}</td><td>{esc(', '.join(s.views))}</td>"
            f"<td>{esc(', '.join(s.compressor_versions) or '-')}</td></tr>"
        )
    parts.append("</table><h2>Model cards</h2><table><tr><th>Version</th><th>Kind</th>"
                 "<th>Role</th><th>Parents</th><th>Weights</th></tr>")  # fmt: skip
    for c in report.cards:
        parts.append(
            f"<tr><td>{esc(c.version)}</td><td>{esc(c.kind)}</td>"
            f"<td>{esc(c.role or 'not in use')}</td><td>{esc(', '.join(c.parents) or '-')}</td>"
            f"<td>{esc(c.weights_status)}</td></tr>"
        )
    parts += [
        "</table>",
        f"<script src='{MERMAID_CDN}'></script>",
        "<script>if(window.mermaid){mermaid.initialize({startOnLoad:true});}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def to_json(report: LineageReport) -> str:
    """Everything in the report, plus the Mermaid text, as JSON."""

    def encode(value: object) -> object:
        if isinstance(value, datetime):
            return value.isoformat()
        raise TypeError(f"not JSON serializable: {type(value).__name__}")

    payload = dataclasses.asdict(report)
    payload["ok"] = not report.errors
    payload["mermaid"] = to_mermaid(report)
    return json.dumps(payload, indent=2, default=encode, sort_keys=False) + "\n"


def render(report: LineageReport, fmt: str) -> str:
    """Render in ``md``, ``html`` or ``json``."""
    if fmt == "md":
        return to_markdown(report)
    if fmt == "html":
        return to_html(report)
    if fmt == "json":
        return to_json(report)
    raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
