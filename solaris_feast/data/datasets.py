"""Named data sets the commands accept: ``synthetic`` (sized by preset, with the structures of
a world) and ``movielens``."""

from __future__ import annotations

from typing import Literal

from solaris_feast.data.schema import InteractionDataset
from solaris_feast.data.synthetic import WORLD_STRUCTURES, SyntheticConfig, generate
from solaris_feast.errors import ConfigError

DatasetName = Literal["synthetic", "movielens"]
SyntheticSize = Literal["tiny", "demo", "default", "large"]

SYNTHETIC_PRESETS: dict[str, SyntheticConfig] = {
    # Enough for tests to see every code path in seconds.
    "tiny": SyntheticConfig(
        num_users=300, num_items=150, num_categories=8, days=3.0, impressions_per_session=10
    ),
    # What `make demo` runs: a few minutes on 2 cores.
    "demo": SyntheticConfig(num_users=800, num_items=400, num_categories=12, days=4.0),
    "default": SyntheticConfig(),
    "large": SyntheticConfig(num_users=20_000, num_items=5_000, num_categories=40, days=7.0),
}


def load_dataset(
    name: str, size: str = "default", seed: int = 0, world: str = "neither"
) -> InteractionDataset:
    """The data set called ``name``; ``size`` picks a synthetic preset (or, for ``movielens``,
    the release: ``100k``, the default, or ``1m``) and ``world`` the structures switched on in
    it (:data:`~solaris_feast.data.synthetic.WORLD_STRUCTURES`: ``tiny`` with ``both`` is
    :data:`~solaris_feast.data.synthetic.SURFACES_WORLD`)."""
    if name == "synthetic":
        if size not in SYNTHETIC_PRESETS:
            raise ConfigError(
                f"unknown synthetic size {size!r}; choose one of {sorted(SYNTHETIC_PRESETS)}"
            )
        if world not in WORLD_STRUCTURES:
            raise ConfigError(f"unknown world {world!r}; choose one of {sorted(WORLD_STRUCTURES)}")
        update = {"seed": seed, **WORLD_STRUCTURES[world]}
        return generate(SYNTHETIC_PRESETS[size].model_copy(update=update))
    if world != "neither":
        raise ConfigError(f"world {world!r} is a synthetic world; {name!r} has none")
    if name == "movielens":
        from solaris_feast.data.movielens import MOVIELENS_RELEASES, load_movielens

        # A synthetic preset's name (what the commands pass when no --size is given: default,
        # or demo for simulate) means MovieLens-100K, as it always did.
        release = MOVIELENS_RELEASES.get("100k" if size in SYNTHETIC_PRESETS else size)
        if release is None:
            raise ConfigError(
                f"unknown MovieLens size {size!r}; choose one of {sorted(MOVIELENS_RELEASES)}"
            )
        return load_movielens(release=release)
    raise ConfigError(f"unknown dataset {name!r}; choose synthetic or movielens")
