"""A deployment's own FM and verifier, as a platform team would write them: nothing like the
reference models, and nothing from solaris_feast but the two protocols' input.

Both are two-tower MLPs over ids they hash themselves (any Int64 or String id, no vocabulary),
the FM with a history tower (the user's last items before each pair's time); the verifier is a
smaller dot product of its own towers. Named in solaris.yaml as ``byo_models:two_tower_fm`` and
``byo_models:dot_verifier``; ``tests/`` is on ``sys.path`` under pytest and is put on
``PYTHONPATH`` for the DAG's task processes.

They train briefly on the log they are given (``log_path``): real weights, fitted on real tensors,
as the deployment's own training pipeline would have produced them.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

HISTORY = 8


def hashed(ids: np.ndarray, buckets: int, salt: str) -> torch.Tensor:
    """Stable bucket of each raw id (int or str): blake2b of its text, as a feature store's
    hashing trick would do."""
    out = np.empty(len(ids), dtype=np.int64)
    for k, value in enumerate(ids.tolist()):
        digest = hashlib.blake2b(f"{salt}:{value}".encode(), digest_size=8).digest()
        out[k] = int.from_bytes(digest, "little") % buckets
    return torch.from_numpy(out)


def history_items(pairs: Any, buckets: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, HISTORY)`` hashed last items of each pair's user strictly before its time, and the
    mask of real ones."""
    log = pairs.log.interactions
    by_user = {
        user: (group["event_timestamp"].to_numpy(), group["item_id"].to_numpy())
        for user, group in log.sort_values("event_timestamp").groupby("user_id", sort=False)
    }
    items = np.zeros((len(pairs), HISTORY), dtype=object)
    mask = np.zeros((len(pairs), HISTORY), dtype=bool)
    times = pairs.at.to_numpy()
    for row, user in enumerate(pairs.users.tolist()):
        if user not in by_user:
            continue
        seen_at, seen = by_user[user]
        end = int(np.searchsorted(seen_at, times[row], side="left"))
        recent = seen[max(0, end - HISTORY) : end]
        items[row, : len(recent)] = recent
        mask[row, : len(recent)] = True
    flat = hashed(items.reshape(-1), buckets, "item").reshape(len(pairs), HISTORY)
    return flat, torch.from_numpy(mask)


class TwoTowerFM(nn.Module):
    """User tower + item tower + mean history tower -> an MLP; ``representation_dim`` wide."""

    def __init__(self, dim: int, buckets: int) -> None:
        super().__init__()
        self.buckets = buckets
        self.representation_dim = dim
        self.user = nn.Embedding(buckets, 16)
        self.item = nn.Embedding(buckets, 16)
        self.mlp = nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, dim), nn.Tanh())
        self.head = nn.Linear(dim, 1)

    def forward(self, pairs: Any) -> torch.Tensor:
        user = self.user(hashed(pairs.users, self.buckets, "user"))
        item = self.item(hashed(pairs.items, self.buckets, "item"))
        hist, mask = history_items(pairs, self.buckets)
        weights = mask.float() / mask.float().sum(1, keepdim=True).clamp(min=1.0)
        history = (self.item(hist) * weights[..., None]).sum(1)
        return torch.as_tensor(self.mlp(torch.cat([user, item, history], dim=1)))

    @torch.inference_mode()
    def encode(self, pairs: Any) -> torch.Tensor:
        self.eval()
        return self(pairs)


class DotVerifier(nn.Module):
    """sigmoid(<user, item> + bias): a cheap verifier of its own."""

    def __init__(self, buckets: int) -> None:
        super().__init__()
        self.buckets = buckets
        self.user = nn.Embedding(buckets, 8)
        self.item = nn.Embedding(buckets, 8)
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, pairs: Any) -> torch.Tensor:
        user = self.user(hashed(pairs.users, self.buckets, "user"))
        item = self.item(hashed(pairs.items, self.buckets, "item"))
        return (user * item).sum(1) + self.bias

    @torch.inference_mode()
    def score(self, pairs: Any) -> np.ndarray:
        self.eval()
        return torch.sigmoid(self(pairs)).double().numpy()


def _fit(model: nn.Module, logits: Any, log_path: str, label: str, seed: int) -> None:
    """A few full-batch Adam steps on the log's first label: the deployment's own training."""
    from solaris_feast.data.log_source import InteractionLogConfig, read_log_window
    from solaris_feast.models.interface import PairsAsOf

    frame = pd.read_parquet(log_path)
    end = frame["seen_at"].max() + pd.Timedelta(seconds=1)
    config = InteractionLogConfig.model_validate(
        {
            "path": log_path,
            "columns": {"user": "member", "item": "sku", "timestamp": "seen_at", "labels": [label]},
        }
    )
    log = read_log_window(config, None, end.to_pydatetime())
    rows = log.interactions.tail(600)
    pairs = PairsAsOf.of_rows(rows, log)
    target = torch.from_numpy(rows[label].to_numpy(np.float32))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    torch.manual_seed(seed)
    for _ in range(20):
        optimizer.zero_grad()
        loss = nn.functional.binary_cross_entropy_with_logits(logits(pairs), target)
        loss.backward()
        optimizer.step()


def two_tower_fm(
    dim: int = 24, buckets: int = 4096, seed: int = 0, log_path: str = "", label: str = ""
) -> TwoTowerFM:
    """The entry point ``byo_models:two_tower_fm``."""
    torch.manual_seed(seed)
    model = TwoTowerFM(dim, buckets)
    if log_path:
        _fit(model, lambda p: model.head(model(p)).squeeze(1), log_path, label, seed)
    return model


def dot_verifier(buckets: int = 4096, seed: int = 1, log_path: str = "", label: str = "") -> Any:
    """The entry point ``byo_models:dot_verifier``."""
    torch.manual_seed(seed)
    model = DotVerifier(buckets)
    if log_path:
        _fit(model, model, log_path, label, seed)
    return model


def nan_fm(dim: int = 8) -> Any:
    """An FM that answers NaN: the plugin must refuse it before writing anything."""

    class NaNFM:
        representation_dim = dim

        def encode(self, pairs: Any) -> np.ndarray:
            return np.full((len(pairs), dim), np.nan, dtype=np.float32)

    return NaNFM()


def wrong_width_fm(dim: int = 8) -> Any:
    """An FM whose output is not as wide as it says."""

    class WrongFM:
        representation_dim = dim

        def encode(self, pairs: Any) -> np.ndarray:
            return np.zeros((len(pairs), dim + 1), dtype=np.float32)

    return WrongFM()


class ExportedFM(nn.Module):
    """An FM as a training pipeline would export it: the artifact contract's six tensors
    (``solaris_feast.models.interface.ARTIFACT_INPUTS``) -> ``(B, dim)``."""

    def __init__(self, dim: int = 40, buckets: int = 2048) -> None:
        super().__init__()
        self.buckets = buckets
        self.user = nn.Embedding(buckets, 16)
        self.item = nn.Embedding(buckets, 16)
        self.mlp = nn.Sequential(nn.Linear(49, 64), nn.ReLU(), nn.Linear(64, dim))

    def forward(
        self,
        user: torch.Tensor,
        item: torch.Tensor,
        history_item: torch.Tensor,
        history_label: torch.Tensor,
        history_age_hours: torch.Tensor,
        history_mask: torch.Tensor,
    ) -> torch.Tensor:
        weight = history_mask.float() * (1.0 + history_label)
        count = history_mask.float().sum(1, keepdim=True).clamp(min=1.0)
        history = (self.item(torch.remainder(history_item, self.buckets)) * weight[..., None]).sum(
            1
        )
        recency = (history_age_hours * history_mask.float()).sum(1, keepdim=True) / count
        features = [
            self.user(torch.remainder(user, self.buckets)),
            self.item(torch.remainder(item, self.buckets)),
            history / count,
            torch.log1p(recency),
        ]
        return torch.as_tensor(self.mlp(torch.cat(features, dim=1)))


class ExportedVerifier(nn.Module):
    """A verifier exported with torch.export: sigmoid of a user-item dot product."""

    def __init__(self, buckets: int = 2048) -> None:
        super().__init__()
        self.buckets = buckets
        self.user = nn.Embedding(buckets, 8)
        self.item = nn.Embedding(buckets, 8)

    def forward(
        self,
        user: torch.Tensor,
        item: torch.Tensor,
        history_item: torch.Tensor,
        history_label: torch.Tensor,
        history_age_hours: torch.Tensor,
        history_mask: torch.Tensor,
    ) -> torch.Tensor:
        u = self.user(torch.remainder(user, self.buckets))
        i = self.item(torch.remainder(item, self.buckets))
        return torch.sigmoid((u * i).sum(1))


def export_models(folder: Any, history_len: int = 8) -> tuple[Any, Any]:
    """A TorchScript FM (``fm.pt``) and a torch.export verifier (``verifier.pt2``) in
    ``folder``; their paths."""
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(3)
    fm_path, verifier_path = folder / "fm.pt", folder / "verifier.pt2"
    torch.jit.save(torch.jit.script(ExportedFM()), str(fm_path))
    example = (
        torch.arange(4, dtype=torch.int64),
        torch.arange(4, dtype=torch.int64),
        torch.zeros(4, history_len, dtype=torch.int64),
        torch.zeros(4, history_len),
        torch.zeros(4, history_len),
        torch.ones(4, history_len, dtype=torch.bool),
    )
    batch = torch.export.Dim("batch", min=2)
    program = torch.export.export(
        ExportedVerifier(), example, dynamic_shapes=tuple({0: batch} for _ in example)
    )
    torch.export.save(program, str(verifier_path))
    return fm_path, verifier_path
