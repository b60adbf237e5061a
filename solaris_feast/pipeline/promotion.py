"""Promotion: naming the serving chain, and checking that a chain fits the log before a round.

``solaris promote --vm VERSION`` writes the registry's serving alias
(:data:`~solaris_feast.models.cards.SERVING_ALIAS_FILE`, read by
:func:`~solaris_feast.models.cards.serving_chain`) atomically: a precompute starting at the same
moment reads the old alias or the new one. The precompute's first task runs
:func:`check_chain_fits_log` before planning, so a chain trained on another log (fewer users,
other labels, other attributes) fails its task once with a
:class:`~solaris_feast.errors.ChainMismatchError` naming every mismatch, instead of an
``IndexError`` deep inside the VM, retried.

A promotion is announced to Airflow (:func:`announce_promotion`): it marks the
``solaris_serving_chain`` asset, on which the precompute DAG is scheduled besides its cron, so
the new chain's first round starts at once instead of at the next tick. ``solaris promote`` does
this where the environment names an Airflow deployment; the ``solaris_promote`` DAG marks the
asset as its task's outlet.

Cost: cards are read without torch; the check compares the cards' recorded feature schema with
the window the round reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from solaris_feast.errors import ConfigError
from solaris_feast.models.cards import (
    APPLY_MODELS_DIR,
    SERVING_ALIAS_FILE,
    ModelChain,
    ServingAlias,
    list_cards,
    select_chain,
)
from solaris_feast.pipeline.runs import write_atomic

if TYPE_CHECKING:
    from solaris_feast.config import SolarisConfig
    from solaris_feast.data.schema import InteractionDataset


MIN_KNOWN_EVENT_SHARE = 0.05
"""A chain whose vocabulary knows the user and item of fewer of the window's events than this
was trained on another log (another id space), not on an earlier window of this one: a new user
or item is normal, a log of strangers is not."""


def chain_mismatches(
    chain: ModelChain, dataset: InteractionDataset, models_dir: Path | None = None
) -> list[str]:
    """What in ``dataset`` the chain's FM and VM were not built for: the label set, a dense log
    against a vocabulary or the reverse, ids of another type than the vocabulary's, a window
    whose events the vocabulary hardly knows, ids beyond dense embedding tables, attribute codes
    beyond their tables, other attribute counts."""
    problems: list[str] = []
    if models_dir is not None:
        problems += vocabulary_mismatches(chain, dataset, models_dir)
    for card in (chain.fm, chain.vm):
        if card is None:
            continue
        if card.tasks and tuple(card.tasks) != tuple(dataset.label_columns):
            problems.append(
                f"{card.kind} {card.version} predicts labels {list(card.tasks)}, "
                f"the log has {list(dataset.label_columns)}"
            )
        schema = card.config.get("schema")
        if not isinstance(schema, Mapping):
            continue
        for what, ids, size in (
            ()
            if not dataset.dense_ids
            else (
                ("user", dataset.num_users, schema.get("num_users")),
                ("item", dataset.num_items, schema.get("num_items")),
            )
        ):
            if isinstance(size, int) and ids > size:
                problems.append(
                    f"{card.kind} {card.version} has room for {size} {what} ids, the log has "
                    f"{what} ids up to {ids - 1}"
                )
        for table, columns, key, dense, dense_key in (
            (
                "users",
                dataset.user_categorical,
                "user_cardinalities",
                dataset.user_dense,
                "user_dense_dim",
            ),
            (
                "items",
                dataset.item_categorical,
                "item_cardinalities",
                dataset.item_dense,
                "item_dense_dim",
            ),
        ):
            sizes = schema.get(key)
            if isinstance(sizes, list | tuple):
                if len(sizes) != len(columns):
                    problems.append(
                        f"{card.kind} {card.version} takes {len(sizes)} categorical {table} "
                        f"attributes, the log has {len(columns)} ({list(columns)})"
                    )
                else:
                    for column, size in zip(columns, sizes, strict=True):
                        if dataset.cardinality(table, column) > int(size):
                            problems.append(
                                f"{card.kind} {card.version} has {size} codes for {table}."
                                f"{column}, the log has {dataset.cardinality(table, column)}"
                            )
            dim = schema.get(dense_key)
            if isinstance(dim, int) and dim != len(dense):
                problems.append(
                    f"{card.kind} {card.version} takes {dim} dense {table} attributes, the log "
                    f"has {len(dense)}"
                )
    return problems


def vocabulary_mismatches(
    chain: ModelChain, dataset: InteractionDataset, models_dir: Path
) -> list[str]:
    """How the chain's id vocabulary (saved beside its FM card) fails ``dataset``'s ids."""
    import numpy as np

    from solaris_feast.columns import ITEM_ID, USER_ID
    from solaris_feast.models.vocabulary import OOV_INDEX, Vocabulary
    from solaris_feast.store.ids import id_type_of

    vocabulary = Vocabulary.load(models_dir, chain.fm.version)
    fm = chain.fm.version
    if vocabulary is None:
        if not dataset.dense_ids and _has_tables(chain):
            return [
                f"fm {fm} indexes dense ids 0..N-1 directly (no vocabulary), the log "
                f"{dataset.name!r} has sparse or String ids (log.id_space: vocabulary)"
            ]
        return []
    if dataset.dense_ids and _has_tables(chain):
        return [f"fm {fm} maps ids through a vocabulary, the log uses dense ids (log.id_space)"]
    log = dataset.interactions
    problems = []
    for what, column, known in (
        ("user", USER_ID, vocabulary.users),
        ("item", ITEM_ID, vocabulary.items),
    ):
        if len(log) and id_type_of(log[column]) != known.id_type:
            problems.append(
                f"fm {fm} knows {known.id_type} {what} ids, the log has "
                f"{id_type_of(log[column])} ones"
            )
    if problems or not len(log):
        return problems
    both = (vocabulary.users.index(log[USER_ID]) != OOV_INDEX) & (
        vocabulary.items.index(log[ITEM_ID]) != OOV_INDEX
    )
    share = float(np.mean(both))
    if share < MIN_KNOWN_EVENT_SHARE:
        problems.append(
            f"fm {fm}'s vocabulary knows the user and item of {share:.1%} of the log's events "
            f"(fewer than {MIN_KNOWN_EVENT_SHARE:.0%}): it was trained on another log"
        )
    return problems


def _has_tables(chain: ModelChain) -> bool:
    """Whether a model of the chain indexes embedding tables by id (a reference model)."""
    return any(
        isinstance(card.config.get("schema"), Mapping)
        for card in (chain.fm, chain.vm)
        if card is not None
    )


def embedding_dim_mismatch(chain: ModelChain, view_dim: int | None, view: str) -> str | None:
    """The compressor writes vectors of another length than the view stores, if it does."""
    if view_dim is None or chain.code_dim is None or view_dim == chain.code_dim:
        return None
    return (
        f"compressor {chain.compressor.version} writes {chain.code_dim}-dim vectors, the feature "
        f"view {view} stores {view_dim} (re-apply the repo with the new chain; {APPLY_MODELS_DIR})"
    )


def promote(models_dir: Path, vm_version: str, now: datetime | None = None) -> ServingAlias:
    """Record ``vm_version``, its compressor and FM as the serving chain of ``models_dir``.

    Raises:
        ConfigError: the VM has no card, or one of its parents is missing.
    """
    chain = select_chain(list_cards(models_dir), vm_version)
    if chain is None or chain.vm is None:  # select_chain raises for an unknown VM already
        raise ConfigError(f"no VM model card {vm_version} in {models_dir}")
    alias = ServingAlias(
        vm=chain.vm.version,
        compressor=chain.compressor.version,
        fm=chain.fm.version,
        promoted_at=now or datetime.now(UTC),
    )
    write_atomic(models_dir / SERVING_ALIAS_FILE, alias.model_dump_json(indent=2))
    return alias


def promote_checked(
    config: SolarisConfig | None,
    models_dir: Path,
    vm_version: str,
    at: datetime | None = None,
    check: bool = True,
) -> ServingAlias:
    """:func:`promote` after checking, with a config, that the chain fits the log's window
    before ``at`` (default now): what ``solaris promote`` and the ``solaris_promote`` DAG do.

    Raises:
        ConfigError: no cards, an unknown VM.
        ChainMismatchError: the chain does not fit the log (``check`` and a config).
    """
    from solaris_feast.errors import ChainMismatchError

    if check and config is not None:
        from solaris_feast.config import precompute_settings
        from solaris_feast.pipeline.log import load_log

        chain = select_chain(list_cards(models_dir), vm_version)
        if chain is None:  # select_chain raises for an unknown VM; None: no cards at all
            raise ConfigError(f"no model cards in {models_dir}")
        moment = at or datetime.now(UTC)
        log = load_log(precompute_settings(config), moment)
        if len(log.interactions) == 0:
            # No event to check the chain against is not a chain that fits.
            raise ConfigError(
                f"the log's window before {moment.isoformat()} holds no events: the chain "
                "cannot be checked against it (check log.path and history_seconds, or --at); "
                "--no-check promotes without the check"
            )
        problems = chain_mismatches(chain, log, models_dir)
        if problems:
            raise ChainMismatchError(vm_version, problems)
    return promote(models_dir, vm_version)


def promotion_extra(alias: ServingAlias, models_dir: Path) -> dict[str, Any]:
    """What the ``solaris_serving_chain`` asset event carries: the chain and its registry."""
    return {
        "vm": alias.vm,
        "compressor": alias.compressor,
        "fm": alias.fm,
        "models_dir": str(models_dir),
        "promoted_at": alias.promoted_at.isoformat(),
    }


def announce_promotion(alias: ServingAlias, models_dir: Path) -> bool:
    """Mark the ``solaris_serving_chain`` Airflow asset (the precompute DAG runs on it), in the
    metadata database this process's Airflow configuration names.

    Returns False when that database knows no such asset (no dag-processor parsed the
    precompute DAG there). Call it only where Airflow is configured
    (:func:`~solaris_feast.pipeline.assets.airflow_configured`): elsewhere importing Airflow
    would create a default ``~/airflow``.
    """
    from solaris_feast.pipeline.assets import SERVING_CHAIN_ASSET, record_asset_event

    return record_asset_event(SERVING_CHAIN_ASSET, promotion_extra(alias, models_dir))


def promote_from_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The ``solaris_promote`` DAG's task: promote ``params["vm"]`` in the config's registry
    (``$SOLARIS_CONFIG``, read now) or in ``params["models_dir"]``; the asset event's extra."""
    import os

    from solaris_feast.config import CONFIG_ENV, load_config

    vm = params.get("vm")
    if not vm:
        raise ConfigError("solaris_promote needs the VM version: trigger it with conf {'vm': ...}")
    config = load_config() if os.environ.get(CONFIG_ENV, "").strip() else None
    models_dir = Path(config.models.dir) if config is not None else Path(params["models_dir"])
    alias = promote_checked(config, models_dir, str(vm), check=bool(params.get("check", True)))
    return promotion_extra(alias, models_dir)
