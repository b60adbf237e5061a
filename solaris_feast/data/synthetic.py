"""Synthetic interaction logs: the embedded default data set.

The generator plants the structure SOLARIS is about. Every user has a few long-term interest
categories (learnable from ids and attributes), but at any moment one *current* interest drives
most clicks, and it drifts: it persists between sessions with probability ``exp(-gap / tau)``.
A model that reads the user's last hours of engagement can find the current interest; a model that
sees ids and static attributes only cannot. Items have categories and power-law popularity;
impressions carry a click and a rarer conversion that needs a click.

Nothing is dense in users x items: users are generated in chunks, items are drawn by inverse-CDF
sampling over per-category popularity, so 1M users x 100k items fits in memory comfortably.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from solaris_feast.data.schema import EVENT_TIMESTAMP, ITEM_ID, USER_ID, InteractionDataset

DEFAULT_START = "2026-11-01T00:00:00Z"
USERS_PER_CHUNK = 50_000


class SyntheticConfig(BaseModel):
    """Size and structure of a synthetic log. Deterministic for a given value of every field."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_users: int = Field(2_000, gt=0)
    """Users, ids ``0..num_users-1``."""
    num_items: int = Field(1_000, gt=0)
    """Items, ids ``0..num_items-1``."""
    num_categories: int = Field(20, gt=1)
    """Item categories; each user's interests are drawn from them."""
    interests_per_user: int = Field(3, gt=0)
    """Long-term interest categories per user."""
    days: float = Field(4.0, gt=0)
    """Length of the log."""
    sessions_per_day: float = Field(1.5, gt=0)
    """Mean sessions per user per day (Poisson)."""
    impressions_per_session: int = Field(16, gt=0)
    """Items shown per session, one impression every ``seconds_between_impressions``."""
    seconds_between_impressions: int = Field(20, gt=0)
    """Spacing of impressions inside a session."""
    interest_half_life_hours: float = Field(6.0, gt=0)
    """How long the current interest persists between sessions (tau = half-life / ln 2)."""
    popularity_exponent: float = Field(1.0, ge=0)
    """Zipf exponent of item popularity within and across categories."""
    current_interest_share: float = Field(0.45, ge=0, le=1)
    """Share of impressions drawn from the current interest category."""
    long_term_share: float = Field(0.25, ge=0, le=1)
    """Share drawn from the user's other long-term interests; the rest is global popularity."""
    seed: int = 0
    """Seed of every random draw."""
    start: str = DEFAULT_START
    """UTC start of the log (ISO 8601)."""


def generate(config: SyntheticConfig | None = None) -> InteractionDataset:
    """Generate the log, user and item tables for ``config`` (defaults when ``None``)."""
    cfg = config or SyntheticConfig()
    if cfg.current_interest_share + cfg.long_term_share > 1.0:
        raise ValueError("current_interest_share + long_term_share must not exceed 1")
    items, item_state = _generate_items(cfg)
    users, interests = _generate_users(cfg)
    chunks = [
        _generate_chunk(cfg, lo, min(lo + USERS_PER_CHUNK, cfg.num_users), interests, item_state)
        for lo in range(0, cfg.num_users, USERS_PER_CHUNK)
    ]
    log = pd.concat(chunks, ignore_index=True)
    log = log.sort_values([EVENT_TIMESTAMP, USER_ID], kind="stable", ignore_index=True)
    return InteractionDataset(
        name="synthetic",
        interactions=log,
        users=users,
        items=items,
        label_columns=("click", "conversion"),
        num_users=cfg.num_users,
        num_items=cfg.num_items,
        user_categorical=("age_bucket", "region", "segment", "price_affinity"),
        item_categorical=("category", "price_tier"),
        user_dense=(),
        item_dense=("quality",),
        metadata={"generator": "synthetic", "config": cfg.model_dump()},
    )


class _ItemState:
    """Per-category inverse-CDF tables for drawing items by popularity."""

    def __init__(
        self,
        category: np.ndarray,
        popularity: np.ndarray,
        quality: np.ndarray,
        price_tier: np.ndarray,
        num_categories: int,
    ) -> None:
        self.category = category
        self.quality = quality
        self.price_tier = price_tier
        self.order = np.argsort(category, kind="stable")
        sorted_pop = popularity[self.order]
        self.cumulative = np.cumsum(sorted_pop)
        counts = np.bincount(category, minlength=num_categories)
        ends = np.cumsum(counts)
        starts = ends - counts
        before = np.concatenate([[0.0], self.cumulative])
        self.cat_low = before[starts]
        self.cat_mass = before[ends] - before[starts]
        self.total = self.cumulative[-1]

    def draw_in_category(self, rng: np.random.Generator, cats: np.ndarray) -> np.ndarray:
        # Empty categories have zero mass; fall back to a global draw for them.
        mass = self.cat_mass[cats]
        target = self.cat_low[cats] + rng.random(len(cats)) * mass
        glob = rng.random(len(cats)) * self.total
        target = np.where(mass > 0, target, glob)
        pos = np.searchsorted(self.cumulative, target, side="right")
        return self.order[np.minimum(pos, len(self.order) - 1)]

    def draw_global(self, rng: np.random.Generator, n: int) -> np.ndarray:
        pos = np.searchsorted(self.cumulative, rng.random(n) * self.total, side="right")
        return self.order[np.minimum(pos, len(self.order) - 1)]


def _generate_items(cfg: SyntheticConfig) -> tuple[pd.DataFrame, _ItemState]:
    rng = np.random.default_rng([cfg.seed, 1])
    # Categories themselves have skewed sizes, like real catalogues.
    cat_weights = 1.0 / np.arange(1, cfg.num_categories + 1) ** 0.5
    category = rng.choice(cfg.num_categories, size=cfg.num_items, p=cat_weights / cat_weights.sum())
    rank = rng.permutation(cfg.num_items) + 1
    popularity = 1.0 / rank.astype(np.float64) ** cfg.popularity_exponent
    quality = rng.normal(0.0, 0.6, cfg.num_items).astype(np.float32)
    price_tier = rng.integers(0, 3, cfg.num_items)
    items = pd.DataFrame(
        {
            ITEM_ID: np.arange(cfg.num_items, dtype=np.int64),
            "category": category.astype(np.int64),
            "price_tier": price_tier.astype(np.int64),
            "quality": quality,
        }
    )
    return items, _ItemState(category, popularity, quality, price_tier, cfg.num_categories)


def _generate_users(cfg: SyntheticConfig) -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng([cfg.seed, 2])
    k = cfg.interests_per_user
    interests = rng.integers(0, cfg.num_categories, size=(cfg.num_users, k))
    # Static attributes are weakly tied to interests, so an id-and-attribute model learns
    # something of them, but not the drifting current interest.
    segment = interests[:, 0] * 4 // cfg.num_categories
    users = pd.DataFrame(
        {
            USER_ID: np.arange(cfg.num_users, dtype=np.int64),
            "age_bucket": rng.integers(0, 6, cfg.num_users).astype(np.int64),
            "region": rng.integers(0, 10, cfg.num_users).astype(np.int64),
            "segment": segment.astype(np.int64),
            "price_affinity": rng.integers(0, 3, cfg.num_users).astype(np.int64),
        }
    )
    return users, interests


def _generate_chunk(
    cfg: SyntheticConfig,
    lo: int,
    hi: int,
    interests: np.ndarray,
    sampler: _ItemState,
) -> pd.DataFrame:
    rng = np.random.default_rng([cfg.seed, 3, lo])
    category, quality, price_tier = sampler.category, sampler.quality, sampler.price_tier
    n_users = hi - lo
    span_s = cfg.days * 86_400.0
    k = cfg.interests_per_user

    # Sessions: Poisson count per user, uniform start times, sorted within each user.
    n_sessions = rng.poisson(cfg.sessions_per_day * cfg.days, n_users) + 1
    sess_user = np.repeat(np.arange(lo, hi), n_sessions)
    sess_time = rng.random(len(sess_user)) * span_s
    order = np.lexsort((sess_time, sess_user))
    sess_user, sess_time = sess_user[order], sess_time[order]
    first = np.r_[True, sess_user[1:] != sess_user[:-1]]

    # Current interest: a Markov chain over the user's sessions. It persists with probability
    # exp(-gap / tau) and otherwise jumps to one of the long-term interests, rarely to any category.
    tau_s = cfg.interest_half_life_hours * 3600.0 / np.log(2.0)
    gap = np.r_[0.0, np.diff(sess_time)]
    keep = (~first) & (rng.random(len(sess_user)) < np.exp(-gap / tau_s))
    fresh = interests[sess_user, rng.integers(0, k, len(sess_user))]
    explore = rng.random(len(sess_user)) < 0.1
    fresh = np.where(explore, rng.integers(0, cfg.num_categories, len(sess_user)), fresh)
    current = _carry_forward(fresh, keep)

    # Impressions.
    m = cfg.impressions_per_session
    imp_sess = np.repeat(np.arange(len(sess_user)), m)
    imp_user = sess_user[imp_sess]
    imp_time = sess_time[imp_sess] + np.tile(np.arange(m), len(sess_user)) * float(
        cfg.seconds_between_impressions
    )
    imp_current = current[imp_sess]
    source = rng.random(len(imp_sess))
    from_current = source < cfg.current_interest_share
    from_long = (~from_current) & (source < cfg.current_interest_share + cfg.long_term_share)
    long_cat = interests[imp_user, rng.integers(0, k, len(imp_sess))]
    want_cat = np.where(from_current, imp_current, long_cat)
    item = np.where(
        from_current | from_long,
        sampler.draw_in_category(rng, want_cat),
        sampler.draw_global(rng, len(imp_sess)),
    )

    item_cat = category[item]
    in_current = (item_cat == imp_current).astype(np.float64)
    in_long = (interests[imp_user] == item_cat[:, None]).any(axis=1).astype(np.float64)
    click_logit = -3.0 + 2.6 * in_current + 0.8 * in_long + quality[item]
    click = rng.random(len(item)) < _sigmoid(click_logit)
    affinity = (rng.integers(0, 3, n_users)[imp_user - lo] == price_tier[item]).astype(np.float64)
    conv_logit = -2.6 + 1.2 * in_current + 0.9 * affinity + 0.5 * quality[item]
    conversion = click & (rng.random(len(item)) < _sigmoid(conv_logit))

    start = pd.Timestamp(cfg.start)
    if start.tzinfo is None:
        start = start.tz_localize("UTC")
    stamps = start + pd.to_timedelta(np.round(imp_time).astype(np.int64), unit="s")
    return pd.DataFrame(
        {
            USER_ID: imp_user.astype(np.int64),
            ITEM_ID: item.astype(np.int64),
            EVENT_TIMESTAMP: stamps.tz_convert("UTC"),
            "click": click.astype(np.int8),
            "conversion": conversion.astype(np.int8),
        }
    )


def _carry_forward(values: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``out[i] = out[i-1]`` where ``keep[i]`` else ``values[i]``, vectorized."""
    idx = np.where(keep, 0, np.arange(len(values)))
    np.maximum.accumulate(idx, out=idx)
    return values[idx]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))
