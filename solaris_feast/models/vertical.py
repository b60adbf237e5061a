"""The vertical model (VM): the small, fast ranker on the request path.

Ids, attributes and an MLP; no access to the user's sequence. It has one input slot for the
SOLARIS embedding ``z(u, i)`` and one for the tier that embedding came from, so a VM trained on a
mix of tiers learns how far to trust each (and that a zero vector means "nothing known").
Its main-task probability with ``z = 0`` and tier ZERO is the *verifier* score that decides
which pairs get the FM.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from solaris_feast.models.features import FeatureSchema, PairBatch
from solaris_feast.tiers import NUM_TIERS, Tier

_ENRICHMENT_TIERS = (Tier.SIMILAR, Tier.USER_AGG)

FM_SPAN_TIER = NUM_TIERS
"""A tier for training only: the row is one the FM trained on, so it has no ``z`` the VM may
see. Without it those rows, the earliest of the log, are tier ZERO, and ZERO learns the early
log's click rate rather than "nothing known" (measured in the funnel world: a USER_AGG pair
served a zero vector scored 0.15 against 0.08 as ZERO, true rate 0.09). Serving never sends it.
"""


class VerticalConfig(BaseModel):
    """Sizes of the VM."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id_dim: int = Field(16, gt=0)
    """Width of the user and item id embeddings."""
    attribute_dim: int = Field(4, gt=0)
    """Width of each categorical attribute embedding."""
    hidden_dims: tuple[int, ...] = (64, 32)
    """MLP widths."""
    embedding_dim: int = Field(32, ge=0)
    """Dimension d of the SOLARIS embedding input; 0 builds a VM without the slot."""
    tier_dim: int = Field(4, gt=0)
    """Width of the tier indicator embedding."""


class VerticalModel(nn.Module):
    """Logits ``(B, T)`` from ids, attributes, ``z`` ``(B, d)`` and ``tier`` ``(B,)``."""

    def __init__(
        self, schema: FeatureSchema, num_tasks: int, config: VerticalConfig | None = None
    ) -> None:
        super().__init__()
        cfg = config or VerticalConfig()
        self.config = cfg
        self.schema = schema
        self.num_tasks = num_tasks
        self.user = nn.Embedding(schema.num_users, cfg.id_dim)
        self.item = nn.Embedding(schema.num_items, cfg.id_dim)
        self.user_cats = nn.ModuleList(
            nn.Embedding(c, cfg.attribute_dim) for c in schema.user_cardinalities
        )
        self.item_cats = nn.ModuleList(
            nn.Embedding(c, cfg.attribute_dim) for c in schema.item_cardinalities
        )
        self.tier = nn.Embedding(NUM_TIERS, cfg.tier_dim) if cfg.embedding_dim else None
        # Zeros, not a random draw: every other initial weight stays as it was.
        self.fm_span_tier = nn.Parameter(torch.zeros(cfg.tier_dim if cfg.embedding_dim else 0))
        # Cards saved before this tier existed load with it at its initial zeros.
        self.register_load_state_dict_pre_hook(_default_fm_span_tier)
        width = (
            2 * cfg.id_dim
            + cfg.attribute_dim * (len(schema.user_cardinalities) + len(schema.item_cardinalities))
            + schema.user_dense_dim
            + schema.item_dense_dim
            + (cfg.embedding_dim + cfg.tier_dim if cfg.embedding_dim else 0)
        )
        layers: list[nn.Module] = []
        for hidden in cfg.hidden_dims:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, num_tasks))
        self.mlp = nn.Sequential(*layers)
        nn.init.normal_(self.user.weight, std=0.05)
        nn.init.normal_(self.item.weight, std=0.05)
        # Each enrichment tier also reads z through weights of its own, added to the first
        # layer: a tier embedding beside z can only shift that layer, not change how much of z
        # it trusts, and a user's 24 h mean or a neighbour's vector must be read differently
        # from the pair's own. Plain zero tensors: they draw no random numbers, so every other
        # initial weight, and a VM trained without enrichment tiers, is exactly as before.
        first_width = cfg.hidden_dims[0] if cfg.hidden_dims else num_tasks
        self.tier_readings = nn.ParameterDict(
            {
                tier.name.lower(): nn.Parameter(torch.zeros(cfg.embedding_dim, first_width))
                for tier in (_ENRICHMENT_TIERS if cfg.embedding_dim else ())
            }
        )

    def forward(
        self, batch: PairBatch, z: torch.Tensor | None = None, tier: torch.Tensor | None = None
    ) -> torch.Tensor:
        parts = [self.user(batch.user_id), self.item(batch.item_id)]
        parts += [table(batch.user_cat[:, k]) for k, table in enumerate(self.user_cats)]
        parts += [table(batch.item_cat[:, k]) for k, table in enumerate(self.item_cats)]
        parts += [batch.user_dense, batch.item_dense]
        own_readings: list[tuple[torch.Tensor, torch.Tensor]] = []
        if self.tier is not None:
            b = len(batch)
            d = self.config.embedding_dim
            if z is None:
                z = torch.zeros(b, d, device=batch.user_id.device)
                tier = torch.full((b,), int(Tier.ZERO), device=batch.user_id.device)
            if tier is None:
                raise ValueError("a z vector needs its tier (B,) beside it")
            if z.shape != (b, d):
                raise ValueError(f"z must be ({b}, {d}), got {tuple(z.shape)}")
            # Zero tier means the store had nothing: force the vector to zero so garbage in a
            # missing slot can never leak into the score.
            tier = tier.long()
            present = tier != int(Tier.ZERO)
            in_span = tier == FM_SPAN_TIER
            if bool(in_span.any()):  # training only; serving never sends the FM-span tier
                present &= ~in_span
                tier_vectors = torch.where(
                    in_span.unsqueeze(-1),
                    self.fm_span_tier,
                    self.tier(tier.masked_fill(in_span, int(Tier.ZERO))),
                )
            else:
                tier_vectors = self.tier(tier)
            parts += [z * present.unsqueeze(-1).to(z.dtype), tier_vectors]
            for enrichment in _ENRICHMENT_TIERS:
                # Only the rows of this tier pay for its reading.
                rows = torch.nonzero(tier == int(enrichment)).squeeze(-1)
                if len(rows):
                    weight = self.tier_readings[enrichment.name.lower()]
                    own_readings.append((rows, z.index_select(0, rows) @ weight))
        hidden = self.mlp[0](torch.cat(parts, dim=-1))
        for rows, reading in own_readings:
            hidden = hidden.index_add(0, rows, reading)
        return self.mlp[1:](hidden)

    def predict_proba(
        self, batch: PairBatch, z: torch.Tensor | None = None, tier: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Task probabilities ``(B, T)``."""
        return torch.sigmoid(self.forward(batch, z, tier))

    def verifier_score(self, batch: PairBatch) -> torch.Tensor:
        """Main-task probability ``(B,)`` with no embedding: what the VM knows before the FM."""
        return self.predict_proba(batch)[:, 0]


def _default_fm_span_tier(
    module: nn.Module, state_dict: dict[str, torch.Tensor], prefix: str, *_: object
) -> None:
    key = prefix + "fm_span_tier"
    if key not in state_dict:
        state_dict[key] = torch.zeros_like(module.fm_span_tier)  # type: ignore[arg-type]


def fm_span_tiers(tier: torch.Tensor, fm_rows: np.ndarray) -> torch.Tensor:
    """``tier`` with the rows the FM trained on (``fm_rows``, ``(N,)`` bool) set to
    :data:`FM_SPAN_TIER`: the tiers a VM trains on beside an FM that saw part of its rows."""
    out = tier.clone()
    out[torch.from_numpy(np.asarray(fm_rows, dtype=bool))] = FM_SPAN_TIER
    return out
