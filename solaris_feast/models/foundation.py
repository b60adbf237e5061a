"""The foundation model (FM): large, multi-task, and too slow for the request path.

It reads the user's recent history (items, their labels and how long ago), encodes it with a
transformer layer, attends from the target item into it, and crosses the result with user and
item attributes into one shared user-item representation ``h(u, i)`` that feeds every task head.
``representation`` is the interface precompute calls; ``user_representation`` gives the user-side
vector that the similarity fill searches over.

The history encoding depends on the user and the time only, never on the target item, so a
precompute round that scores many items of one user encodes it once: ``encode_history`` over one
row per user, then ``encode_pairs_with_history`` for every pair (target attention, crossing),
which equals ``representation`` to float rounding. With transformer layers over the history that
is most of the FM's cost per pair.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class HistoryEncoding:
    """Encoded histories of U users, to be reused across their target items.

    Attributes:
        tokens: ``(U, N+1, d)`` encoded history with the null token first.
        pad: ``(U, N+1)`` bool, True at padding positions.
    """

    tokens: torch.Tensor
    pad: torch.Tensor

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


class FoundationModel(nn.Module):
    """FM over ``T >= 1`` tasks. Output logits ``(B, T)``; ``h(u, i)`` is ``(B, D)``."""

    def __init__(
        self, schema: FeatureSchema, num_tasks: int, config: FoundationConfig | None = None
    ) -> None:
        super().__init__()
        cfg = config or FoundationConfig()
        if cfg.embed_dim % cfg.num_heads:
            raise ValueError(
                f"embed_dim {cfg.embed_dim} is not divisible by num_heads {cfg.num_heads}"
            )
        # One label is the common impressions log (a click); the FM is multi-task when the log
        # has more (main task first), never because it must be.
        if num_tasks < 1:
            raise ValueError(f"the FM needs at least one task, got {num_tasks}")
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

    def _pair_representation(
        self, batch: PairBatch, tokens: torch.Tensor, pad: torch.Tensor
    ) -> torch.Tensor:
        """``h(u, i)`` ``(B, D)`` from each pair's encoded history ``(B, N+1, d)``."""
        user = self.user(batch.user_id, batch.user_cat, batch.user_dense)
        item = self.item(batch.item_id, batch.item_cat, batch.item_dense)
        interest, _ = self.target_attention(item.unsqueeze(1), tokens, tokens, key_padding_mask=pad)
        interest = interest.squeeze(1)
        return self.cross(torch.cat([interest, user, item, interest * item, user * item], dim=-1))

    def representation(self, batch: PairBatch) -> torch.Tensor:
        """The shared user-item representation ``h(u, i)``, ``(B, D)``."""
        tokens, pad = self._history(batch)
        return self._pair_representation(batch, tokens, pad)

    def encode_history(self, batch: PairBatch) -> HistoryEncoding:
        """The history encoding of each row of ``batch`` (one row per user; the item fields are
        not read): ``(U, N+1, d)`` tokens and their padding mask."""
        tokens, pad = self._history(batch)
        return HistoryEncoding(tokens=tokens, pad=pad)

    def encode_pairs_with_history(
        self, batch: PairBatch, history: HistoryEncoding, user_index: torch.Tensor
    ) -> torch.Tensor:
        """``h(u, i)`` ``(B, D)`` of B pairs whose user's encoded history is row
        ``user_index[b]`` of ``history`` (``(B,)`` int64 into U rows); the history fields of
        ``batch`` are not read. Equal to :meth:`representation` of the same pairs as of the
        same time, to float rounding; the target attention stays per pair."""
        if user_index.shape != (len(batch),):
            raise ValueError(f"user_index must be ({len(batch)},), got {tuple(user_index.shape)}")
        if len(batch) and (int(user_index.min()) < 0 or int(user_index.max()) >= len(history)):
            raise ValueError(f"user_index must lie in 0..{len(history) - 1}")
        return self._pair_representation(batch, history.tokens[user_index], history.pad[user_index])

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
