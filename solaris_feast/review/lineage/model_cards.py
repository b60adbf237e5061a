"""The model cards behind the views: which are in use, and whether their weights still match.

Cards are read, hashed and chained by :mod:`solaris_feast.models.cards` (torch-free); this module
only decides which cards the review hashes. In use: the chain in service (what
:func:`solaris_feast.models.registry.load_bundle` loads) and every version a view's tags name,
with their ancestors. Weights of other cards (older runs) are not hashed, so a folder of old
large artifacts costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Literal

from solaris_feast.errors import ConfigError
from solaris_feast.models.cards import (
    ModelChain,
    card_path,
    check_weights,
    lineage_of,
    scan_cards,
    serving_chain,
)
from solaris_feast.review.lineage.model import Finding, ModelCardLineage


def review_cards(
    models_dir: Path, tagged_versions: Iterable[str]
) -> tuple[list[ModelCardLineage], list[Finding]]:
    """Every card of ``models_dir`` with its role and, for the cards in use, its weights status;
    a card file that is not a valid card, or a chain with a missing parent, is an error."""
    findings: list[Finding] = []
    if not models_dir.is_dir():
        findings.append(Finding("lineage", str(models_dir), "model folder not found", "warning"))
        return [], findings
    scan = scan_cards(models_dir)
    findings += [
        Finding("lineage", str(path), f"not a valid model card: {error}")
        for path, error in scan.problems
    ]
    chain: ModelChain | None = None
    try:
        chain = serving_chain(models_dir, cards=scan.cards)
    except ConfigError as exc:
        findings.append(Finding("lineage", str(models_dir), f"no chain in service: {exc}"))
    serving = {c.version for c in chain.cards} if chain is not None else set()
    tagged = lineage_of(scan.cards, tagged_versions) - serving
    reviewed = []
    for card in scan.cards:
        role: Literal["serving", "tagged", ""] = (
            "serving" if card.version in serving else "tagged" if card.version in tagged else ""
        )
        check = check_weights(card, models_dir) if role else None
        reviewed.append(
            ModelCardLineage(
                version=card.version,
                kind=card.kind,
                parents=card.parents,
                path=str(card_path(models_dir, card.version)),
                weights_file=str(models_dir / card.weights_file),
                weights_sha256=card.weights_sha256,
                weights_status=check.status if check is not None else "unchecked",
                weights_actual_sha256=check.actual_sha256 if check is not None else None,
                created_at=card.created_at.isoformat(),
                role=role,
                train_window=(_iso(card.train_window_start), _iso(card.train_window_end)),
            )
        )
    return reviewed, findings


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
