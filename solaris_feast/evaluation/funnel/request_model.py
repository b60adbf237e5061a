"""The request model: a learned request-propensity verifier, fitted on the funnel's own logs.

What a production team builds when its verifier should guess the final-stage sets: a cheap model
of ``P(pair reaches the final stage within the coming hour | what is known at the hour's start)``,
fitted on the logged funnel traffic of earlier hours and retrained on the same schedule as the
other models. It is a :class:`~solaris_feast.models.interface.Verifier` (``score(pairs) -> (B,)``
in ``[0, 1]``), so it plugs into the planner exactly as a deployment's own verifier would.

It never reads the early-stage ranker: its only inputs are what the funnel logs (who asked when,
which of the retrieved candidates reached the final stage K, the retrieval's candidates of each
hour start) and the serving VM's score without ``z`` (through the Verifier protocol). Whatever it
knows of the early stage it learned from those logs, as a propensity model in production does.

Training rows (:func:`train_request_model`), for every hour ``h`` of the window that ended before
the training time: the pairs retrieval proposed at ``h``'s start (the round's candidates), label 1
when the pair reached the final stage during ``h``; every positive and a seeded share
``negative_keep`` of the negatives (the logit is shifted back by ``log(negative_keep)``).
Features of a pair as of time ``t``, each from logs strictly before ``t`` (:func:`pair_features`):

- retrieval: score over the user's best at ``t`` (1 for a queued miss, as the verifier's
  :func:`~solaris_feast.precompute.plan.request_score` counts it);
- the VM's probability without ``z`` (as a logit);
- the user's requests in the last hour and day, and hours since the last one;
- the pair's final-stage appearances in the last hour and day, and hours since the last one;
- the item's final-stage appearances in the last day per request of that day;

plus a user bias, an item bias and a user-item dot product of width ``factor_dim`` (ids, as a
production model has them). Cost: one vectorized pass over the window's logs per scoring
time; a fit scores its training rows with the VM once (the window's positives and a fifth of its
negatives) and runs ``epochs`` passes of Adam over them (not timed on its own).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from solaris_feast.data.schema import ITEM_ID, USER_ID
from solaris_feast.models.interface import PairsAsOf, Verifier, checked_scores
from solaris_feast.models.training import seeded_torch
from solaris_feast.precompute.candidates import CANDIDATE_SCORE

if TYPE_CHECKING:
    from solaris_feast.data.schema import InteractionDataset

HOUR_S = 3600
NUM_FEATURES = 9
_NEVER_HOURS = 168.0
"""Hours-since features are capped at a week (a pair or user never seen reads as a week ago)."""


class RequestModelConfig(BaseModel):
    """Size and fit of the request model (defaults: cheap enough to refit every few hours)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window_hours: int = Field(12, gt=0)
    """Hours of logged traffic each fit reads (the hours before the training time)."""
    negative_keep: float = Field(0.2, gt=0, le=1)
    """Share of the non-reaching pairs kept as training rows (all reaching pairs are kept)."""
    factor_dim: int = Field(8, ge=0)
    """Width of the user-item dot product (0: features and biases only)."""
    hidden: int = Field(32, gt=0)
    """Width of the hidden layer over the features."""
    epochs: int = Field(6, gt=0)
    """Passes over the training rows per fit."""


@dataclass
class FunnelTrafficLog:
    """What the funnel logs as it serves, append-only and in time order.

    Attributes:
        request_s / request_user: ``(R,)`` time (epoch seconds) and user of every request.
        final_s / final_user / final_item: ``(F,)`` every pair that reached the final stage.
        candidates: retrieval's candidates at each hour start (epoch seconds -> ``user_id``,
            ``item_id``, ``candidate_score``), the pool the round planned over.
    """

    _requests: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    _final: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    candidates: dict[int, pd.DataFrame] = field(default_factory=dict)
    _cache: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def log_slice(self, at_s: int, users: np.ndarray, final_users: np.ndarray, items: Any) -> None:
        """One slice: its requesting ``users`` and its final-stage pairs, all at ``at_s``."""
        if len(self._requests) and at_s < int(self._requests[-1][0][-1]):
            raise ValueError("the traffic log is appended in time order")
        self._requests.append((np.full(len(users), at_s, np.int64), np.asarray(users, np.int64)))
        self._final.append(
            (
                np.full(len(final_users), at_s, np.int64),
                np.asarray(final_users, np.int64),
                np.asarray(items, np.int64),
            )
        )
        self._cache.clear()

    def log_candidates(self, at_s: int, candidates: pd.DataFrame) -> None:
        self.candidates[at_s] = candidates[[USER_ID, ITEM_ID, CANDIDATE_SCORE]].reset_index(
            drop=True
        )

    def _arrays(self) -> dict[str, np.ndarray]:
        if not self._cache:
            empty = np.zeros(0, np.int64)
            req = self._requests or [(empty, empty)]
            fin = self._final or [(empty, empty, empty)]
            self._cache.update(
                request_s=np.concatenate([r[0] for r in req]),
                request_user=np.concatenate([r[1] for r in req]),
                final_s=np.concatenate([f[0] for f in fin]),
                final_user=np.concatenate([f[1] for f in fin]),
                final_item=np.concatenate([f[2] for f in fin]),
            )
        return self._cache

    def requests_before(self, t_s: int, window_s: int) -> tuple[np.ndarray, np.ndarray]:
        """``(time, user)`` of the requests in ``[t - window, t)``."""
        a = self._arrays()
        lo, hi = np.searchsorted(a["request_s"], [t_s - window_s, t_s])
        return a["request_s"][lo:hi], a["request_user"][lo:hi]

    def final_between(self, lo_s: int, hi_s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(time, user, item)`` of the final-stage pairs in ``[lo, hi)``."""
        a = self._arrays()
        lo, hi = np.searchsorted(a["final_s"], [lo_s, hi_s])
        return a["final_s"][lo:hi], a["final_user"][lo:hi], a["final_item"][lo:hi]


def _hours_since(last_s: np.ndarray, t_s: int) -> np.ndarray:
    hours = np.where(last_s >= 0, (t_s - last_s) / HOUR_S, _NEVER_HOURS)
    return np.log1p(np.minimum(hours, _NEVER_HOURS))


def pair_features(
    traffic: FunnelTrafficLog,
    users: np.ndarray,
    items: np.ndarray,
    t_s: int,
    retrieval_rel: np.ndarray,
    vm_prob: np.ndarray,
    num_items: int,
) -> np.ndarray:
    """``(B, NUM_FEATURES)`` float32 features of pairs as of ``t_s``, from logs before ``t_s``."""
    users = np.asarray(users, np.int64)
    items = np.asarray(items, np.int64)
    day = 24 * HOUR_S
    req_s, req_u = traffic.requests_before(t_s, 8 * day)
    size = int(max(users.max(initial=0), req_u.max(initial=0))) + 1
    recent = req_s >= t_s - HOUR_S
    daily = req_s >= t_s - day
    u_hour = np.bincount(req_u[recent], minlength=size)[users]
    u_day = np.bincount(req_u[daily], minlength=size)[users]
    u_last = np.full(size, -1, np.int64)
    u_last[req_u] = req_s  # time order: the last write per user is the latest
    fin_s, fin_u, fin_i = traffic.final_between(t_s - 8 * day, t_s)
    keys = users * num_items + items
    fin_keys = fin_u * num_items + fin_i
    order = np.argsort(fin_keys, kind="stable")
    sorted_keys, sorted_s = fin_keys[order], fin_s[order]
    lo = np.searchsorted(sorted_keys, keys, side="left")
    hi = np.searchsorted(sorted_keys, keys, side="right")
    # Within one key the times stay in log order (stable sort), so the last is the latest.
    padded = np.r_[sorted_s, -1]  # index -1 reads the pad when the window holds nothing
    p_last = np.where(hi > lo, padded[hi - 1], -1)
    in_day = np.r_[0, np.cumsum(sorted_s >= t_s - day)]
    in_hour = np.r_[0, np.cumsum(sorted_s >= t_s - HOUR_S)]
    p_day = in_day[hi] - in_day[lo]
    p_hour = in_hour[hi] - in_hour[lo]
    item_day = np.bincount(fin_i[fin_s >= t_s - day], minlength=num_items)[items]
    requests_day = max(int(daily.sum()), 1)
    vm = np.clip(np.asarray(vm_prob, np.float64), 1e-6, 1 - 1e-6)
    out = np.stack(
        [
            np.nan_to_num(np.asarray(retrieval_rel, np.float64), nan=1.0),
            np.log(vm / (1 - vm)),
            np.log1p(u_hour),
            np.log1p(u_day),
            _hours_since(u_last[users], t_s),
            np.log1p(p_hour),
            np.log1p(p_day),
            _hours_since(p_last, t_s),
            item_day / requests_day,
        ],
        axis=1,
    )
    return out.astype(np.float32)


class RequestModel(nn.Module):
    """``logit = mlp(standardized features) + b_user + b_item + <P_user, Q_item> + offset``;
    ``(B, F)`` features and ``(B,)`` ids in, ``(B,)`` logits out."""

    def __init__(self, num_users: int, num_items: int, config: RequestModelConfig) -> None:
        super().__init__()
        self.config = config
        self.num_items = num_items
        self.mlp = nn.Sequential(
            nn.Linear(NUM_FEATURES, config.hidden), nn.ReLU(), nn.Linear(config.hidden, 1)
        )
        self.user_bias = nn.Embedding(num_users, 1)
        self.item_bias = nn.Embedding(num_items, 1)
        self.user_factor = nn.Embedding(num_users, max(config.factor_dim, 1))
        self.item_factor = nn.Embedding(num_items, max(config.factor_dim, 1))
        for table in (self.user_bias, self.item_bias):
            nn.init.zeros_(table.weight)
        for table in (self.user_factor, self.item_factor):
            nn.init.normal_(table.weight, std=0.05 if config.factor_dim else 0.0)
        self.mean: torch.Tensor
        self.std: torch.Tensor
        self.register_buffer("mean", torch.zeros(NUM_FEATURES))
        self.register_buffer("std", torch.ones(NUM_FEATURES))
        self.offset = 0.0
        """Added at scoring: ``log(negative_keep)`` undoes the negatives' subsampling."""

    def forward(
        self, features: torch.Tensor, users: torch.Tensor, items: torch.Tensor
    ) -> torch.Tensor:
        x = (features - self.mean) / self.std
        out = self.mlp(x).squeeze(-1) + self.user_bias(users).squeeze(-1)
        out = out + self.item_bias(items).squeeze(-1)
        if self.config.factor_dim:
            out = out + (self.user_factor(users) * self.item_factor(items)).sum(-1)
        return out

    def probability(self, features: np.ndarray, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """``(B,)`` float64 probabilities under ``inference_mode``."""
        self.eval()
        with torch.inference_mode():
            logits = self(
                torch.from_numpy(features),
                torch.from_numpy(np.asarray(users, np.int64)),
                torch.from_numpy(np.asarray(items, np.int64)),
            )
        return 1.0 / (1.0 + np.exp(-(logits.numpy().astype(np.float64) + self.offset)))


def _retrieval_of(
    candidates: pd.DataFrame, users: np.ndarray, items: np.ndarray, num_items: int
) -> np.ndarray:
    """Each pair's retrieval score over its user's best among ``candidates`` (NaN: not
    retrieved)."""
    cu = candidates[USER_ID].to_numpy(np.int64)
    ci = candidates[ITEM_ID].to_numpy(np.int64)
    score = candidates[CANDIDATE_SCORE].to_numpy(np.float64)
    best = pd.Series(score).groupby(cu).transform("max").to_numpy()
    rel = np.where(best > 0, score / np.where(best > 0, best, 1.0), 0.0)
    keys = cu * num_items + ci
    order = np.argsort(keys)
    want = np.asarray(users, np.int64) * num_items + np.asarray(items, np.int64)
    at = np.searchsorted(keys[order], want)
    found = (at < len(keys)) & (keys[order][np.minimum(at, len(keys) - 1)] == want)
    out = np.full(len(want), np.nan)
    out[found] = rel[order][at[found]]
    return out


def _vm_probability(
    base: Verifier, users: np.ndarray, items: np.ndarray, t_s: int, log: Any
) -> Any:
    pairs = PairsAsOf.of(users, items, pd.Timestamp(t_s, unit="s", tz="UTC"), log)
    return checked_scores(base.score(pairs), len(pairs), "request model: base verifier")


def train_request_model(
    traffic: FunnelTrafficLog,
    until: pd.Timestamp,
    base: Verifier,
    log: InteractionDataset,
    num_users: int,
    num_items: int,
    *,
    config: RequestModelConfig,
    seed: int,
) -> RequestModel | None:
    """Fit on the logged hours that ended by ``until`` (``None``: no such hour yet).

    ``base`` is the serving VM without ``z`` as a Verifier, scoring each training hour's pairs
    as of that hour's start over ``log`` (its history is read strictly before each pair's
    time). Nothing logged at or after ``until`` is read.
    """
    until_s = int(until.value // 10**9)
    hours = sorted(
        t
        for t in traffic.candidates
        if t + HOUR_S <= until_s and t >= until_s - config.window_hours * HOUR_S
    )
    feats, us, its, labels = [], [], [], []
    for t_s in hours:
        cands = traffic.candidates[t_s]
        cu = cands[USER_ID].to_numpy(np.int64)
        ci = cands[ITEM_ID].to_numpy(np.int64)
        _, fu, fi = traffic.final_between(t_s, t_s + HOUR_S)
        reached = np.isin(cu * num_items + ci, fu * num_items + fi)
        rng = np.random.default_rng([seed, t_s % 1_000_003, 11])
        keep = reached | (rng.random(len(cu)) < config.negative_keep)
        cu, ci, reached = cu[keep], ci[keep], reached[keep]
        rel = _retrieval_of(cands, cu, ci, num_items)
        vm = _vm_probability(base, cu, ci, t_s, log)
        feats.append(pair_features(traffic, cu, ci, t_s, rel, vm, num_items))
        us.append(cu)
        its.append(ci)
        labels.append(reached.astype(np.float32))
    if not feats or not np.concatenate(labels).any():
        return None
    x = torch.from_numpy(np.concatenate(feats))
    u = torch.from_numpy(np.concatenate(us))
    i = torch.from_numpy(np.concatenate(its))
    y = torch.from_numpy(np.concatenate(labels))
    with seeded_torch(seed), torch.enable_grad():
        model = RequestModel(num_users, num_items, config)
        model.mean.copy_(x.mean(0))
        model.std.copy_(x.std(0).clamp_min(1e-3))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=1e-6)
        loss_fn = nn.BCEWithLogitsLoss()
        model.train()
        for _ in range(config.epochs):
            order = torch.randperm(len(y))
            for lo in range(0, len(order), 2048):
                idx = order[lo : lo + 2048]
                optimizer.zero_grad()
                loss_fn(model(x[idx], u[idx], i[idx]), y[idx]).backward()
                optimizer.step()
    model.eval()
    model.offset = math.log(config.negative_keep)
    return model


class RequestModelVerifier:
    """The fitted request model as a :class:`~solaris_feast.models.interface.Verifier` for one
    round: ``candidates`` are the round's retrieval output, ``base`` the VM without ``z``."""

    def __init__(
        self,
        model: RequestModel,
        traffic: FunnelTrafficLog,
        base: Verifier,
        candidates: pd.DataFrame,
    ) -> None:
        self.model = model
        self.traffic = traffic
        self.base = base
        self.candidates = candidates

    def score(self, pairs: PairsAsOf) -> np.ndarray:
        """``(len(pairs),)`` probabilities that each pair reaches the final stage soon."""
        num_items = self.model.num_items
        rel = _retrieval_of(self.candidates, pairs.users, pairs.items, num_items)
        vm = checked_scores(self.base.score(pairs), len(pairs), "request model: base verifier")
        at_s = ((pairs.at - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(seconds=1)).to_numpy()
        out = np.empty(len(pairs))
        for t_s in np.unique(at_s):
            rows = np.flatnonzero(at_s == t_s)
            users = np.asarray(pairs.users[rows], np.int64)
            items = np.asarray(pairs.items[rows], np.int64)
            x = pair_features(self.traffic, users, items, int(t_s), rel[rows], vm[rows], num_items)
            out[rows] = self.model.probability(x, users, items)
        return out
