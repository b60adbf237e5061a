"""Synthetic interaction logs: the embedded default data set.

The generator plants the structure SOLARIS is about. Every user has a few long-term interest
categories (learnable from ids and attributes), but at any moment one *current* interest drives
most clicks, and it drifts: it persists between sessions with probability ``exp(-gap / tau)``.
A model that reads the user's last hours of engagement can find the current interest; a model that
sees ids and static attributes only cannot. Items have categories and power-law popularity;
impressions carry a click and a rarer conversion that needs a click.

Two structures a per-category counter cannot hold are off by default (so the presets' logs stay
as they were) and switched on by :data:`SURFACES_WORLD` and its ablations:

- **Sequential item-to-item patterns** (``successors_per_item > 0``): every item has a few
  successor items in *other* categories. The user's last ``successor_memory`` clicks before a
  session (on any surface) trigger their successors in it: a share of its impressions is drawn
  from them, and a click on any successor of a trigger is ``successor_boost`` more likely in
  logit. A per-category counter sees none of it; a model reading the item sequence can.
- **Surfaces** (``num_surfaces > 1``): the user's sessions are spread over surfaces (a
  ``surface`` column), each with ``sessions_per_day`` of its own, and one person's current
  interest and triggers carry across them. A model trained on all surfaces sees engagement a
  vertical model with its own surface's counters does not.

Nothing is dense in users x items: users are generated in chunks, items are drawn by inverse-CDF
sampling over per-category popularity, so 1M users x 100k items fits in memory comfortably.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from solaris_feast.data.schema import EVENT_TIMESTAMP, ITEM_ID, USER_ID, InteractionDataset

DEFAULT_START = "2026-11-01T00:00:00Z"
SURFACE = "surface"
"""Column of the surface an impression was shown on (only when ``num_surfaces > 1``)."""
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
    num_surfaces: int = Field(1, ge=1)
    """Surfaces the sessions are spread over, uniformly; each has ``sessions_per_day`` sessions
    per user per day of its own. Above 1 the log gets a ``surface`` column (``0..n-1``)."""
    successors_per_item: int = Field(0, ge=0)
    """Successor items of each item, drawn uniformly from other categories (0: no sequential
    item-to-item pattern)."""
    successor_share: float = Field(0.2, ge=0, le=1)
    """With successors: share of impressions drawn from the triggers' successors, taken from the
    global-popularity share (sessions without a trigger draw those globally)."""
    successor_boost: float = Field(2.6, ge=0)
    """With successors: click logit added when the item is a successor of a trigger."""
    successor_memory: int = Field(4, gt=0)
    """With successors: the user's last clicks before a session that trigger successors in it."""
    seed: int = 0
    """Seed of every random draw."""
    start: str = DEFAULT_START
    """UTC start of the log (ISO 8601)."""


def generate(config: SyntheticConfig | None = None) -> InteractionDataset:
    """Generate the log, user and item tables for ``config`` (defaults when ``None``)."""
    cfg = config or SyntheticConfig()
    if cfg.current_interest_share + cfg.long_term_share > 1.0:
        raise ValueError("current_interest_share + long_term_share must not exceed 1")
    if cfg.successors_per_item and (
        cfg.current_interest_share + cfg.long_term_share + cfg.successor_share > 1.0
    ):
        raise ValueError(
            "current_interest_share + long_term_share + successor_share must not exceed 1"
        )
    items, item_state = _generate_items(cfg)
    users, interests = _generate_users(cfg)
    successors = _generate_successors(cfg, item_state.category)
    chunks = [
        _generate_chunk(
            cfg, lo, min(lo + USERS_PER_CHUNK, cfg.num_users), interests, item_state, successors
        )
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
        metadata={"generator": "synthetic", "config": _config_record(cfg)},
    )


_STRUCTURE_FIELDS = (
    "num_surfaces",
    "successors_per_item",
    "successor_share",
    "successor_boost",
    "successor_memory",
)


def _config_record(cfg: SyntheticConfig) -> dict[str, object]:
    """``cfg`` as recorded in the metadata; the structure fields only when one is switched on,
    so logs of the presets carry the record they always had."""
    if cfg.num_surfaces == 1 and cfg.successors_per_item == 0:
        return cfg.model_dump(exclude=set(_STRUCTURE_FIELDS))
    return cfg.model_dump()


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


def _generate_successors(cfg: SyntheticConfig, category: np.ndarray) -> np.ndarray | None:
    """``(num_items, successors_per_item)`` successor ids, each in another category than its
    item where the catalogue has one; ``None`` without successors."""
    if cfg.successors_per_item == 0:
        return None
    rng = np.random.default_rng([cfg.seed, 5])
    shape = (cfg.num_items, cfg.successors_per_item)
    succ = rng.integers(0, cfg.num_items, shape)
    if len(np.unique(category)) > 1:
        same = category[succ] == category[:, None]
        while same.any():
            succ[same] = rng.integers(0, cfg.num_items, int(same.sum()))
            same = category[succ] == category[:, None]
    return succ


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
    successors: np.ndarray | None = None,
) -> pd.DataFrame:
    rng = np.random.default_rng([cfg.seed, 3, lo])
    # The structures added to the base world draw from a stream of their own: with successors
    # on, sessions, interests, each impression's first item draw and click uniforms are as in the
    # base world (surfaces add sessions, so they do change those).
    extra_rng = np.random.default_rng([cfg.seed, 4, lo])
    category, quality, price_tier = sampler.category, sampler.quality, sampler.price_tier
    n_users = hi - lo
    span_s = cfg.days * 86_400.0
    k = cfg.interests_per_user

    # Sessions: Poisson count per user, uniform start times, sorted within each user.
    n_sessions = rng.poisson(cfg.sessions_per_day * cfg.num_surfaces * cfg.days, n_users) + 1
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

    click_draw = rng.random(len(item))

    def click_logit_of(rows: np.ndarray | slice, items: np.ndarray) -> np.ndarray:
        item_cat = category[items]
        in_current = (item_cat == imp_current[rows]).astype(np.float64)
        in_long = (interests[imp_user[rows]] == item_cat[:, None]).any(axis=1).astype(np.float64)
        return -3.0 + 2.6 * in_current + 0.8 * in_long + quality[items]

    if successors is None:
        click_logit = click_logit_of(slice(None), item)
        click = click_draw < _sigmoid(click_logit)
    else:
        from_succ = (
            (~from_current)
            & (~from_long)
            & (source < cfg.current_interest_share + cfg.long_term_share + cfg.successor_share)
        )
        item, click = _successor_sessions(
            cfg,
            extra_rng,
            sess_user - lo,
            n_users,
            item,
            from_succ,
            click_draw,
            click_logit_of,
            successors,
        )
    item_cat = category[item]
    in_current = (item_cat == imp_current).astype(np.float64)
    affinity = (rng.integers(0, 3, n_users)[imp_user - lo] == price_tier[item]).astype(np.float64)
    conv_logit = -2.6 + 1.2 * in_current + 0.9 * affinity + 0.5 * quality[item]
    conversion = click & (rng.random(len(item)) < _sigmoid(conv_logit))

    start = pd.Timestamp(cfg.start)
    if start.tzinfo is None:
        start = start.tz_localize("UTC")
    stamps = start + pd.to_timedelta(np.round(imp_time).astype(np.int64), unit="s")
    frame = pd.DataFrame(
        {
            USER_ID: imp_user.astype(np.int64),
            ITEM_ID: item.astype(np.int64),
            EVENT_TIMESTAMP: stamps.tz_convert("UTC"),
            "click": click.astype(np.int8),
            "conversion": conversion.astype(np.int8),
        }
    )
    if cfg.num_surfaces > 1:
        surface = extra_rng.integers(0, cfg.num_surfaces, len(sess_user))
        frame[SURFACE] = surface[imp_sess].astype(np.int64)
    return frame


def _successor_sessions(
    cfg: SyntheticConfig,
    rng: np.random.Generator,
    sess_user: np.ndarray,
    n_users: int,
    item: np.ndarray,
    from_succ: np.ndarray,
    click_draw: np.ndarray,
    click_logit_of: Callable[[np.ndarray, np.ndarray], np.ndarray],
    successors: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Items and clicks of every impression with successor triggers, session by session.

    Sessions are ordered by user, then time (``sess_user`` is chunk-local and sorted); a loop
    over a session's rank within its user, vectorized over users, keeps each user's last
    ``successor_memory`` clicks (``-1`` for none) as the triggers of the next session."""
    m, k = cfg.impressions_per_session, cfg.successor_memory
    per_succ = successors.shape[1]
    item = item.copy()
    click = np.zeros(len(item), dtype=bool)
    first = np.r_[0, np.flatnonzero(sess_user[1:] != sess_user[:-1]) + 1]
    rank = np.arange(len(sess_user)) - np.repeat(first, np.diff(np.r_[first, len(sess_user)]))
    triggers = np.full((n_users, k), -1, dtype=np.int64)
    for r in range(int(rank.max()) + 1 if len(rank) else 0):
        sessions = np.flatnonzero(rank == r)
        users = sess_user[sessions]
        rows = (sessions[:, None] * m + np.arange(m)[None, :]).ravel()
        trig = np.repeat(triggers[users], m, axis=0)
        has = trig >= 0
        n_trig = has.sum(axis=1)
        # A successor of a uniformly chosen trigger; filled slots are the last ones.
        pick = k - 1 - np.floor(rng.random(len(rows)) * np.maximum(n_trig, 1)).astype(np.int64)
        chosen = trig[np.arange(len(rows)), pick]
        draw = successors[np.maximum(chosen, 0), rng.integers(0, per_succ, len(rows))]
        swap = from_succ[rows] & (n_trig > 0)
        item[rows] = np.where(swap, draw, item[rows])
        succ_of_trig = np.where(has[:, :, None], successors[np.maximum(trig, 0)], -1).reshape(
            len(rows), k * per_succ
        )
        is_succ = (succ_of_trig == item[rows][:, None]).any(axis=1)
        logit = click_logit_of(rows, item[rows]) + cfg.successor_boost * is_succ
        click[rows] = click_draw[rows] < _sigmoid(logit)
        clicked = np.where(click[rows], item[rows], -1).reshape(len(sessions), m)
        triggers[users] = _last_valid(np.concatenate([triggers[users], clicked], axis=1), k)
    return item, click


def _last_valid(values: np.ndarray, k: int) -> np.ndarray:
    """Per row, the last ``k`` entries ``>= 0`` in order, right-aligned, ``-1`` before them."""
    valid = values >= 0
    from_end = np.cumsum(valid[:, ::-1], axis=1)[:, ::-1]
    keep = valid & (from_end <= k)
    out = np.full((len(values), k), -1, dtype=values.dtype)
    r, c = np.nonzero(keep)
    out[r, k - from_end[r, c]] = values[r, c]
    return out


def _carry_forward(values: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``out[i] = out[i-1]`` where ``keep[i]`` else ``values[i]``, vectorized."""
    idx = np.where(keep, 0, np.arange(len(values)))
    np.maximum.accumulate(idx, out=idx)
    return values[idx]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


SURFACES_WORLD = SyntheticConfig(
    num_users=300,
    num_items=150,
    num_categories=8,
    days=3.0,
    impressions_per_session=10,
    num_surfaces=3,
    successors_per_item=3,
)
"""The world of structure a counter cannot hold (issue 14, item 5), at the ``tiny`` preset's size
so its figures stand beside the ``tiny`` protocol run. Each value is set by a reason, before any
measurement, not searched:

- 3 surfaces: the fewest for which the VM's own surface is a minority of the user's engagement;
  each has the base world's session rate, so the VM's surface on its own is much like the
  ``tiny`` world (a little smaller: the one session every user is given comes once over all
  surfaces, not once per surface).
- 3 successors per item, in other categories: a few related items (an accessory, a sequel), none
  of which a per-category counter can attribute.
- successor share 0.2 of impressions, out of the 0.3 drawn by global popularity, so the
  interest structure of the base world keeps its shares.
- successor boost 2.6: as strong as the current interest's, so the new structure competes with
  the old on equal terms.
- memory of 4 clicks: about one session's clicks at this world's click rate (about 0.4 of 10
  impressions), the span a history of 8 events covers.
"""

WORLD_STRUCTURES: dict[str, dict[str, int]] = {
    "neither": {},
    "sequential": {"successors_per_item": SURFACES_WORLD.successors_per_item},
    "surfaces": {"num_surfaces": SURFACES_WORLD.num_surfaces},
    "both": {
        "num_surfaces": SURFACES_WORLD.num_surfaces,
        "successors_per_item": SURFACES_WORLD.successors_per_item,
    },
}
"""The structures of :data:`SURFACES_WORLD` switched on per world, as updates to any preset;
``neither`` is the preset as it is."""

STRUCTURE_ABLATIONS: dict[str, SyntheticConfig] = {
    "both": SURFACES_WORLD,
    "sequential": SURFACES_WORLD.model_copy(update={"num_surfaces": 1}),
    "surfaces": SURFACES_WORLD.model_copy(update={"successors_per_item": 0}),
    "neither": SURFACES_WORLD.model_copy(update={"num_surfaces": 1, "successors_per_item": 0}),
}
""":data:`SURFACES_WORLD` with each structure on or off; ``neither`` is the ``tiny`` preset, and
each is the ``tiny`` preset with :data:`WORLD_STRUCTURES`' switches."""
