"""The funnel world's users and items, with a ground truth any shown ranking can be scored by.

Everything here is drawn once from the seed when the world is built, so a world is a pure
function of ``(config, seed)``: the schedule of sessions, every user's drifting interest hour by
hour, and the uniforms that turn click and conversion probabilities into labels. What the
product's models see is only the log of what was shown; the arrays here are the truth behind it.

Ground truth of user ``u`` for item ``i`` at hour ``h`` (taste space of ``taste_dim`` dims):

- long-term taste ``L_u``: a mix of two category centroids plus noise;
- short-term interest ``S_u(h)``: an AR(1) walk per hour, ``S(h+1) = r S(h) + sqrt(1 - r^2) e``
  with ``r = exp(-1 / drift_hours)``: the interest decorrelates over about ``drift_hours``;
- sequential pattern: every item has ``successors_per_item`` successors (mostly of its own
  category); an item that follows the user's last clicked item gets ``sequence_boost``;
- click logit ``= click_bias + taste_scale * (L_u + S_u(h)) . V_i + q_i + sequence``, conversion
  given a click ``= sigmoid(conversion_bias + taste_scale * L_u . V_i)`` (long-term taste buys,
  the passing interest clicks).

Return process: each user has a rate of sessions per day (Gamma with mean
``sessions_per_day``); sessions start at slice boundaries (Poisson over the horizon), and a
session is ``1 + Poisson(requests_per_session - 1)`` requests, one per slice, as a scrolling feed
asks for the next screen.

Defaults, and why (none is tuned toward a planner; each is a property of the kind of feed
SOLARIS was built for, sized to run on two CPU cores):

- 300 users, 400 items, 12 categories: large enough that a 10 % budget cannot cover every
  pool pair and a random planner cannot hit by chance, small enough for minutes per seed;
- ``drift_hours=12``: short-term interests stable for hours, not days (the method's premise
  for a TTL of hours);
- ``sessions_per_day=3``, ``requests_per_session=4``: a few visits a day, a few screens each;
- ``slice_seconds=300``: one screen every five minutes within a session;
- click base rate around 5-10 % (``click_bias=-3``), conversion about a quarter of clicks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from solaris_feast.data.schema import ITEM_ID, USER_ID

WORLD_EPOCH = pd.Timestamp("2026-01-05", tz="UTC")
"""Time zero of every world (a Monday), so timestamps read like a real log."""


class FunnelWorldConfig(BaseModel):
    """Size and dynamics of the users and items (see the module docstring for each default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_users: int = Field(300, gt=1)
    """Users, ids ``0..num_users-1``."""
    num_items: int = Field(400, gt=1)
    """Items, ids ``0..num_items-1``."""
    num_categories: int = Field(12, gt=0)
    """Item categories (an item attribute the models see)."""
    taste_dim: int = Field(8, gt=0)
    """Dimension of the ground-truth taste space (never shown to a model)."""
    drift_hours: float = Field(12.0, gt=0)
    """Hours over which a user's short-term interest decorrelates."""
    sessions_per_day: float = Field(3.0, gt=0)
    """Mean sessions per user per day."""
    requests_per_session: float = Field(4.0, ge=1)
    """Mean requests (screens) per session."""
    slice_seconds: int = Field(300, gt=0)
    """Time between two requests of a session; the world advances one slice at a time."""
    successors_per_item: int = Field(3, gt=0)
    """Items that tend to follow each item (the sequential pattern)."""
    sequence_boost: float = Field(1.5, ge=0)
    """Added to the click logit of a successor of the user's last clicked item."""
    taste_scale: float = Field(2.0, ge=0)
    """Weight of taste agreement in the click logit."""
    click_bias: float = -3.0
    """Click logit of a neutral item."""
    conversion_bias: float = -1.0
    """Conversion logit (given a click) of a neutral item."""


@dataclass(frozen=True)
class Request:
    """The requests of one slice (R of them): who asks, and when (all at the slice start)."""

    slice_index: int
    user_ids: np.ndarray
    """``(R,)`` int64."""
    request_ids: np.ndarray
    """``(R,)`` int64, global request numbers; they index the world's label uniforms."""


class World:
    """Ground truth and schedule of one seed, for ``hours`` hours of world time.

    Attributes:
        config: What was drawn.
        hours: Length of the world.
        item_category: ``(I,)`` int64.
        item_vectors: ``(I, d)`` float64 taste-space vectors.
        item_quality: ``(I,)`` float64 part of the click logit no user changes.
        long_term: ``(U, d)`` float64.
        short_term: ``(H, U, d)`` float64, the interest during each hour.
        successors: ``(I, S)`` int64.
        slices: ``(R,)`` slice index of every request of the world, sorted.
        users: ``(R,)`` who makes each request. Label uniforms are not stored: a seeded hash
            of (request, position) draws them (:meth:`label_uniforms`).
    """

    def __init__(self, config: FunnelWorldConfig, seed: int, hours: int) -> None:
        if hours <= 0:
            raise ValueError(f"a world needs hours > 0, got {hours}")
        self.config = config
        self.seed = seed
        self.hours = hours
        cfg = config
        rng = np.random.default_rng([seed, 13, 0])
        d = cfg.taste_dim
        centroids = rng.normal(0.0, 1.0, (cfg.num_categories, d)) / np.sqrt(d)
        self.item_category = rng.integers(0, cfg.num_categories, cfg.num_items).astype(np.int64)
        self.item_vectors = centroids[self.item_category] + rng.normal(
            0.0, 0.5, (cfg.num_items, d)
        ) / np.sqrt(d)
        self.item_quality = rng.normal(0.0, 0.5, cfg.num_items)
        favourite = rng.integers(0, cfg.num_categories, (cfg.num_users, 2))
        self.user_segment = favourite[:, 0].astype(np.int64)
        self.long_term = (
            0.6 * centroids[favourite[:, 0]]
            + 0.4 * centroids[favourite[:, 1]]
            + rng.normal(0.0, 0.3, (cfg.num_users, d)) / np.sqrt(d)
        ) * np.sqrt(d)
        r = float(np.exp(-1.0 / cfg.drift_hours))
        steps = rng.normal(0.0, 1.0, (hours, cfg.num_users, d))
        short = np.empty_like(steps)
        short[0] = steps[0]
        for h in range(1, hours):
            short[h] = r * short[h - 1] + np.sqrt(1.0 - r * r) * steps[h]
        self.short_term = short
        # Successors: mostly items of the same category, so a sequence stays on a theme.
        self.successors = np.empty((cfg.num_items, cfg.successors_per_item), dtype=np.int64)
        by_category = [np.flatnonzero(self.item_category == c) for c in range(cfg.num_categories)]
        for i in range(cfg.num_items):
            same = by_category[int(self.item_category[i])]
            pool = same if len(same) > cfg.successors_per_item else np.arange(cfg.num_items)
            self.successors[i] = rng.choice(pool, cfg.successors_per_item, replace=False)
        self.slices, self.users = self._schedule(rng)

    @property
    def slices_per_hour(self) -> int:
        return max(1, 3600 // self.config.slice_seconds)

    def _schedule(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        cfg = self.config
        total_slices = self.hours * self.slices_per_hour
        rate = rng.gamma(2.0, cfg.sessions_per_day / 2.0, cfg.num_users)
        per_slice = rate / (86400.0 / cfg.slice_seconds)
        starts = rng.random((total_slices, cfg.num_users)) < per_slice[None, :]
        start_slice, user = np.nonzero(starts)
        length = 1 + rng.poisson(cfg.requests_per_session - 1.0, len(user))
        slices = np.concatenate([start_slice + j for j in range(int(length.max(initial=1)))])
        users = np.concatenate([user for _ in range(int(length.max(initial=1)))])
        keep = np.concatenate([length > j for j in range(int(length.max(initial=1)))]) & (
            slices < total_slices
        )
        slices, users = slices[keep], users[keep].astype(np.int64)
        order = np.lexsort((users, slices))
        slices, users = slices[order], users[order]
        # One request per user and slice: overlapping sessions of a user merge into one feed.
        first = np.r_[True, (slices[1:] != slices[:-1]) | (users[1:] != users[:-1])]
        return slices[first].astype(np.int64), users[first]

    def requests_in(self, slice_index: int) -> Request:
        lo, hi = np.searchsorted(self.slices, [slice_index, slice_index + 1])
        return Request(slice_index, self.users[lo:hi], np.arange(lo, hi, dtype=np.int64))

    def slice_time(self, slice_index: int) -> pd.Timestamp:
        return WORLD_EPOCH + pd.Timedelta(seconds=slice_index * self.config.slice_seconds)

    def hour_of_slice(self, slice_index: int) -> int:
        return min(slice_index // self.slices_per_hour, self.hours - 1)

    def probabilities(
        self, users: np.ndarray, items: np.ndarray, hour: int, last_click: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(click, conversion)`` probabilities, each ``(N,)``, of showing ``items[n]`` to
        ``users[n]`` during ``hour``; ``last_click[n]`` is the user's last clicked item (-1:
        none). Conversion is the joint probability (a click and then a conversion)."""
        cfg = self.config
        taste = self.long_term[users] + self.short_term[hour, users]
        agree = np.einsum("nd,nd->n", taste, self.item_vectors[items])
        follows = (last_click >= 0) & (
            self.successors[np.maximum(last_click, 0)] == items[:, None]
        ).any(axis=1)
        logit = (
            cfg.click_bias
            + cfg.taste_scale * agree / np.sqrt(cfg.taste_dim)
            + self.item_quality[items]
            + cfg.sequence_boost * follows
        )
        click = 1.0 / (1.0 + np.exp(-logit))
        buy_agree = np.einsum("nd,nd->n", self.long_term[users], self.item_vectors[items])
        buy = 1.0 / (
            1.0
            + np.exp(-(cfg.conversion_bias + cfg.taste_scale * buy_agree / np.sqrt(cfg.taste_dim)))
        )
        return click, click * buy

    def label_uniforms(self, request_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """``(N, 2)`` uniforms for the labels of the item at ``positions[n]`` of the final-stage
        list of request ``request_ids[n]``: the same request and position always draws the same
        numbers, whatever is shown there, so rankings are compared on common random numbers."""
        mixed = (
            request_ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            + positions.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
            + np.uint64((self.seed * 0x94D049BB133111EB) % (1 << 64))
        )
        out = np.empty((len(mixed), 2))
        for j in range(2):
            x = mixed + np.uint64(((j + 1) * 0xD6E8FEB86659FD93) % (1 << 64))
            x ^= x >> np.uint64(31)
            x *= np.uint64(0x7FB5D329728EA185)
            x ^= x >> np.uint64(27)
            x *= np.uint64(0x81DADEF4BC2DD44D)
            x ^= x >> np.uint64(33)
            out[:, j] = (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)
        return out

    def user_table(self) -> pd.DataFrame:
        """What the models may know of a user: a coarse segment (the favourite category)."""
        return pd.DataFrame(
            {
                USER_ID: np.arange(self.config.num_users, dtype=np.int64),
                "segment": self.user_segment,
            }
        )

    def item_table(self) -> pd.DataFrame:
        """What the models may know of an item: its category."""
        return pd.DataFrame(
            {
                ITEM_ID: np.arange(self.config.num_items, dtype=np.int64),
                "category": self.item_category,
            }
        )
