"""The early-stage ranker: a cheap two-tower dot product trained on the world's own traffic.

It keeps K of the N retrieved items for the final stage. It is deliberately not the VM: a user
tower (id embedding) and an item tower (id and category embeddings) meet in one dot product
plus an item bias, fitted by logistic loss on the shown items and their clicks. The verifier
(the VM's score) never reads it, so the verifier's hit rate is not true by construction.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch import nn

from solaris_feast.data.schema import ITEM_ID, USER_ID
from solaris_feast.models.training import seeded_torch


class TwoTower(nn.Module):
    """``score(u, i) = <user(u), item(i) + category(i)> + bias(i)``; shapes ``(B,)`` in and out."""

    def __init__(self, num_users: int, num_items: int, item_category: np.ndarray, dim: int) -> None:
        super().__init__()
        self.user = nn.Embedding(num_users, dim)
        self.item = nn.Embedding(num_items, dim)
        self.category = nn.Embedding(int(item_category.max()) + 1, dim)
        self.bias = nn.Embedding(num_items, 1)
        for table in (self.user, self.item, self.category):
            nn.init.normal_(table.weight, std=0.05)
        nn.init.zeros_(self.bias.weight)
        self.item_category: torch.Tensor
        self.register_buffer("item_category", torch.from_numpy(item_category.astype(np.int64)))

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        item = self.item(items) + self.category(self.item_category[items])
        return (self.user(users) * item).sum(-1) + self.bias(items).squeeze(-1)

    def score(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """``(N,)`` float64 logits of N pairs, under ``inference_mode``."""
        self.eval()
        with torch.inference_mode():
            out = self(
                torch.from_numpy(users.astype(np.int64)), torch.from_numpy(items.astype(np.int64))
            )
        return out.numpy().astype(np.float64)


def train_two_tower(
    log: pd.DataFrame,
    num_users: int,
    num_items: int,
    item_category: np.ndarray,
    *,
    dim: int,
    epochs: int,
    seed: int,
) -> TwoTower:
    """Fit on every shown row of ``log`` (``user_id``, ``item_id``, ``click``)."""
    users = torch.from_numpy(log[USER_ID].to_numpy(np.int64))
    items = torch.from_numpy(log[ITEM_ID].to_numpy(np.int64))
    clicks = torch.from_numpy(log["click"].to_numpy(np.float32))
    loss_fn = nn.BCEWithLogitsLoss()
    with seeded_torch(seed), torch.enable_grad():
        model = TwoTower(num_users, num_items, item_category, dim)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.02, weight_decay=1e-5)
        model.train()
        for _ in range(epochs):
            order = torch.randperm(len(users))
            for lo in range(0, len(order), 1024):
                idx = order[lo : lo + 1024]
                optimizer.zero_grad()
                loss = loss_fn(model(users[idx], items[idx]), clicks[idx])
                loss.backward()
                optimizer.step()
    model.eval()
    return model
