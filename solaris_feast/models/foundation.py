"""The foundation model (FM): large, multi-task, and too slow for the request path.

It reads the user's recent history (items, their labels and how long ago), encodes it with a
transformer layer, attends from the target item into it, and crosses the result with user and
item attributes into one shared user-item representation ``h(u, i)`` that feeds every task head.
``representation`` is the interface precompute calls; ``user_representation`` gives the user-side
vector that the similarity fill searches over.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from solaris_feast.models.features import FeatureSchema, PairBatch


class FoundationConfig(BaseModel):
    """Sizes of the FM."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    embed_dim: int = Field(64, gt=0)
    """Width of item, user and history token embeddings."""
    num_heads: int = Field(4, gt=0)
    """Attention heads; must divide ``embed_dim``."""
    num_layers: int = Field(0, ge=0)
    """Transformer layers over the history before the target attention. Each costs about 3x
    the rest of the model on CPU, so the default relies on target attention alone."""
    hidden_dim: int = Field(256, gt=0)
    """Width of the crossing MLP."""
    representation_dim: int = Field(128, gt=0)
    """Dimension D of ``h(u, i)``."""
    dropout: float = Field(0.1, ge=0, lt=1)
    """Dropout inside the crossing MLP and the transformer."""


class _AttributeEncoder(nn.Module):
    """Sum of an id embedding, one embedding per categorical attribute and a dense projection."""

    def __init__(
        self, num_ids: int, cardinalities: tuple[int, ...], dense_dim: int, dim: int
    ) -> None:
        super().__init__()
        self.ids = nn.Embedding(num_ids, dim)
        self.cats = nn.ModuleList(nn.Embedding(c, dim) for c in cardinalities)
        self.dense = nn.Linear(dense_dim, dim) if dense_dim else None
        nn.init.normal_(self.ids.weight, std=0.05)

    def forward(self, ids: torch.Tensor, cats: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        out = self.ids(ids)
        for k, table in enumerate(self.cats):
            out = out + table(cats[:, k])
        if self.dense is not None:
            out = out + self.dense(dense)
        return out


class FoundationModel(nn.Module):
    """Multi-task FM over ``T`` tasks. Output logits ``(B, T)``; ``h(u, i)`` is ``(B, D)``."""

    def __init__(
        self, schema: FeatureSchema, num_tasks: int, config: FoundationConfig | None = None
    ) -> None:
        super().__init__()
        cfg = config or FoundationConfig()
        if cfg.embed_dim % cfg.num_heads:
            raise ValueError(
                f"embed_dim {cfg.embed_dim} is not divisible by num_heads {cfg.num_heads}"
            )
        if num_tasks < 2:
            raise ValueError(f"the FM is multi-task: num_tasks must be >= 2, got {num_tasks}")
        self.config = cfg
        self.schema = schema
        self.num_tasks = num_tasks
        d = cfg.embed_dim
        self.user = _AttributeEncoder(
            schema.num_users, schema.user_cardinalities, schema.user_dense_dim, d
        )
        self.item = _AttributeEncoder(
            schema.num_items, schema.item_cardinalities, schema.item_dense_dim, d
        )
        self.history_label = nn.Embedding(2, d)
        self.history_age = nn.Linear(1, d)
        self.position = nn.Embedding(schema.history_len, d)
        layer = nn.TransformerEncoderLayer(
            d, cfg.num_heads, dim_feedforward=2 * d, dropout=cfg.dropout, batch_first=True
        )
        self.encoder = (
            nn.TransformerEncoder(layer, cfg.num_layers, enable_nested_tensor=False)
            if cfg.num_layers
            else None
        )
        self.target_attention = nn.MultiheadAttention(d, cfg.num_heads, batch_first=True)
        # A learned "no history" token is always attendable, so users without history get a
        # defined vector instead of a softmax over nothing.
        self.null_token = nn.Parameter(torch.zeros(1, 1, d))
        self.cross = nn.Sequential(
            nn.Linear(5 * d, cfg.hidden_dim),
            nn.GELU(),
            nn.Dropout(cfg.dropout),
            nn.Linear(cfg.hidden_dim, cfg.representation_dim),
            nn.LayerNorm(cfg.representation_dim),
        )
        self.heads = nn.ModuleList(
            nn.Sequential(nn.Linear(cfg.representation_dim, 64), nn.GELU(), nn.Linear(64, 1))
            for _ in range(num_tasks)
        )

    def _history(self, batch: PairBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoded history ``(B, N+1, d)`` with the null token first, and its padding mask."""
        n = batch.hist_item.shape[1]
        positions = torch.arange(n, device=batch.hist_item.device)
        item_tokens = self.item.ids(batch.hist_item)
        for k, table in enumerate(self.item.cats):
            item_tokens = item_tokens + table(batch.hist_item_cat[..., k])
        tokens = (
            item_tokens
            + self.history_label(batch.hist_label.clamp(0, 1))
            + self.history_age(batch.hist_age.unsqueeze(-1))
            + self.position(positions)[None]
        )
        null = self.null_token.expand(tokens.shape[0], 1, -1)
        tokens = torch.cat([null, tokens], dim=1)
        pad = torch.cat([torch.zeros_like(batch.hist_mask[:, :1]), ~batch.hist_mask], dim=1)
        if self.encoder is not None:
            tokens = self.encoder(tokens, src_key_padding_mask=pad)
        return tokens, pad

    def _parts(self, batch: PairBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        user = self.user(batch.user_id, batch.user_cat, batch.user_dense)
        item = self.item(batch.item_id, batch.item_cat, batch.item_dense)
        tokens, pad = self._history(batch)
        interest, _ = self.target_attention(item.unsqueeze(1), tokens, tokens, key_padding_mask=pad)
        return user, item, interest.squeeze(1)

    def representation(self, batch: PairBatch) -> torch.Tensor:
        """The shared user-item representation ``h(u, i)``, ``(B, D)``."""
        user, item, interest = self._parts(batch)
        return self.cross(torch.cat([interest, user, item, interest * item, user * item], dim=-1))

    def user_representation(self, batch: PairBatch) -> torch.Tensor:
        """User-side vector ``(B, 2d)``: the masked mean of the encoded history and the user
        embedding. Independent of the item, so the similarity fill can search over it."""
        tokens, pad = self._history(batch)
        keep = (~pad).unsqueeze(-1).to(tokens.dtype)
        pooled = (tokens * keep).sum(1) / keep.sum(1).clamp(min=1.0)
        user = self.user(batch.user_id, batch.user_cat, batch.user_dense)
        return torch.cat([pooled, user], dim=-1)

    def logits_from_representation(self, h: torch.Tensor) -> torch.Tensor:
        return torch.cat([head(h) for head in self.heads], dim=-1)

    def forward(self, batch: PairBatch) -> torch.Tensor:
        """Task logits ``(B, T)``."""
        return self.logits_from_representation(self.representation(batch))
