"""Named data sets the commands accept: ``synthetic`` (sized by preset, with the structures of
a world) and ``movielens``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

from solaris_feast.data.schema import InteractionDataset
from solaris_feast.data.synthetic import WORLD_STRUCTURES, SyntheticConfig, generate
from solaris_feast.errors import ConfigError

logger = logging.getLogger(__name__)

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


def load_configured_log(config_file: Path) -> InteractionDataset:
    """The whole log a solaris config names, up to now, as a named data set is read by the
    replay and the transfer evaluation (each trains its own models on the log's first part and
    evaluates on the rest)."""
    import pandas as pd

    from solaris_feast.config import load_config, resolved_log
    from solaris_feast.data.log_source import read_log_window
    from solaris_feast.data.schema import with_dense_codes

    config = load_config(config_file)
    own = [name for name in ("fm", "verifier") if getattr(config.models, name) != "reference"]
    if own:
        # Said, since the config names them: these evaluations measure the method on the log
        # with models they train, not the deployment's own models.
        logger.warning(
            "%s: models.%s not evaluated: the evaluation trains its own reference FM and VM "
            "on the log and reads only the config's log section",
            config_file,
            " and models.".join(own),
        )
    log = resolved_log(config)  # a Feast FileSource resolves to its path
    # The evaluations train their own models, which index tables by id: Int64 or String ids of
    # the user's systems are numbered first (the reports give shares and NE, never ids).
    return with_dense_codes(read_log_window(log, None, pd.Timestamp.now(tz="UTC").to_pydatetime()))
