"""``solaris.yaml``: the one config file the CLI and the DAGs read.

It names the Feast repo, the user's interaction log (:mod:`solaris_feast.data.log_source`), the
candidate source, the models and the serving chain, the precompute and training settings and the
schedules. Its path comes from ``--config`` or the ``SOLARIS_CONFIG`` variable; a command that
needs one and gets neither fails saying so (:func:`config_path`): nothing falls back to folders
inside the code checkout. Relative paths in the file are read against the file's folder.

The precompute and training sections reuse the fields of
:class:`~solaris_feast.pipeline.settings.PrecomputeSettings` and
:class:`~solaris_feast.pipeline.settings.TrainingSettings` (names, types, bounds, docstrings)
instead of restating them: the settings stay the one statement of every run setting, and a
config becomes run settings through :func:`precompute_settings` / :func:`training_settings`.

Why a top-level module and not ``pipeline/config.py``: the file is read by the CLI, the DAGs,
the promotion and the demo alike, and it names more than the pipeline (the repo, the log, the
models). ``solaris demo`` needs no config: it runs on embedded defaults (synthetic data, SQLite,
folders under its ``--out``).

Cost: pydantic and PyYAML only (the DAG files read the schedules while Airflow parses them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from solaris_feast.data.log_source import CandidateTableConfig, InteractionLogConfig
from solaris_feast.errors import ConfigError
from solaris_feast.models.spec import ArtifactSpec, ModelChoice
from solaris_feast.pipeline.settings import (
    LogSource,
    PrecomputeSettings,
    PrecomputeTaskPolicy,
    TrainingSettings,
    TrainingTaskPolicy,
)

CONFIG_ENV = "SOLARIS_CONFIG"
"""Variable holding the config file's path, for commands without ``--config`` and for DAGs."""

_CONFIG = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

# Settings that other sections of the file state (where the log, repo and models are).
_PLACED_ELSEWHERE = frozenset({*LogSource.model_fields, "feature_repo", "models_dir"})
_PLACED_ELSEWHERE |= {"feature_store_yaml", "candidates", "serving_vm", "fm", "verifier"}


def _section(name: str, model: type[BaseModel], doc: str) -> type[BaseModel]:
    """A config section holding ``model``'s fields but those placed in other sections."""
    fields: dict[str, Any] = {
        field: (info.annotation, info)
        for field, info in model.model_fields.items()
        if field not in _PLACED_ELSEWHERE
    }
    section: type[BaseModel] = create_model(name, __config__=_CONFIG, __doc__=doc, **fields)
    return section


if TYPE_CHECKING:  # built at run time from the settings' fields; plain models to mypy
    PrecomputeSection = BaseModel
    TrainingSection = BaseModel
else:
    PrecomputeSection = _section(
        "PrecomputeSection",
        PrecomputeSettings,
        "The precompute's settings (the fields of pipeline.settings.PrecomputeSettings).",
    )
    TrainingSection = _section(
        "TrainingSection",
        TrainingSettings,
        "The training's settings (the fields of pipeline.settings.TrainingSettings).",
    )


class FeastRepoSection(BaseModel):
    """The Feast repo the views live in."""

    model_config = _CONFIG

    repo: str = Field(min_length=1)
    """Feast repo folder (holds the feature_store yaml and the applied SOLARIS views)."""
    feature_store_yaml: str = Field("feature_store.yaml", min_length=1)
    """The repo's config file: feature_store.yaml (SQLite) or feature_store.redis.yaml (Redis)."""


class ModelsSection(BaseModel):
    """The model registry and which models make the chain."""

    model_config = _CONFIG

    dir: str = Field(min_length=1)
    """Model registry folder: cards, weights and the serving alias (solaris promote)."""
    fm: ModelChoice = "reference"
    """The foundation model: reference (the project's FM, trained by solaris train) or your own,
    {entry_point: package.module:factory, options: {...}} returning a FoundationEncoder
    (models/interface.py) or {artifact: fm.pt} exported with TorchScript or torch.export; the
    compressor is trained on its representations."""
    verifier: ModelChoice = "reference"
    """The verifier: reference (the project's VM, trained on the tier mix of z) or your own
    entry point returning a Verifier (pairs as of a time -> scores in [0, 1]), or an exported
    artifact."""
    serving_vm: str = ""
    """VM version of the serving chain; empty: the one `solaris promote` recorded in the
    registry's serving alias (without an alias, the newest VM, with a warning)."""


class CandidatesSection(BaseModel):
    """Where a round's candidate pairs come from."""

    model_config = _CONFIG

    source: Literal["generated", "table"] = "generated"
    """generated: the built-in generators (co-occurrence, category, popularity) over the log
    window; table: the user's retrieval output (the table below)."""
    table: CandidateTableConfig | None = None
    """The candidate table, when source is table."""

    def chosen_table(self) -> CandidateTableConfig | None:
        """The table a round reads; None for the generators."""
        if self.source == "table" and self.table is None:
            raise ConfigError("candidates.source is table: set candidates.table.path")
        return self.table if self.source == "table" else None


class SchedulesSection(BaseModel):
    """When the DAGs run (cron or preset); the SOLARIS_*_SCHEDULE variables override them."""

    model_config = _CONFIG

    precompute: str = Field("@hourly", min_length=1)
    """Schedule of the solaris_precompute DAG."""
    training: str = Field("@daily", min_length=1)
    """Schedule of the solaris_training DAG."""
    precompute_on_promotion: bool = True
    """Also start a precompute round when a serving chain is promoted (the
    solaris_serving_chain asset, marked by solaris promote and the solaris_promote DAG)."""
    training_log_asset: str = ""
    """URI (and name) of the Airflow asset your log's producer marks; set: training also runs
    when it is marked. Empty: training on its schedule only."""

    @field_validator("precompute", "training")
    @classmethod
    def _a_schedule_airflow_accepts(cls, value: str) -> str:
        return checked_schedule(value)


class AirflowSection(BaseModel):
    """How Airflow runs the DAGs' tasks: time limits and retries (the fields of
    pipeline.settings.PrecomputeTaskPolicy and TrainingTaskPolicy), read when the DAG files are
    parsed."""

    model_config = _CONFIG

    precompute: PrecomputeTaskPolicy = PrecomputeTaskPolicy()
    """The precompute DAG's tasks."""
    training: TrainingTaskPolicy = TrainingTaskPolicy()
    """The training DAG's stages."""


class SolarisConfig(BaseModel):
    """solaris.yaml: everything a deployment names."""

    model_config = _CONFIG

    feast: FeastRepoSection
    """The Feast repo."""
    log: InteractionLogConfig
    """The interaction log and its column mapping."""
    candidates: CandidatesSection = CandidatesSection()
    """The candidate source."""
    models: ModelsSection
    """The model registry and the serving chain."""
    precompute: PrecomputeSection = PrecomputeSection()
    """Precompute settings (budget, shards, TTL margin, ...)."""
    training: TrainingSection = TrainingSection()
    """Training settings (window, epochs, seed)."""
    schedules: SchedulesSection = SchedulesSection()
    """DAG schedules."""
    airflow: AirflowSection = AirflowSection()
    """Time limits and retries of the DAGs' tasks."""


def config_path(given: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """``given``, else ``$SOLARIS_CONFIG``.

    Raises:
        ConfigError: neither is set, saying what to set.
    """
    env = os.environ if environ is None else environ
    chosen = str(given) if given else env.get(CONFIG_ENV, "").strip()
    if not chosen:
        raise ConfigError(
            f"no config file: pass --config PATH or set {CONFIG_ENV}=PATH to a solaris.yaml "
            "(README: Bring your own data and models)"
        )
    return Path(chosen)


def _is_url(location: str) -> bool:
    return "://" in location


def _anchored(location: str, base: Path) -> str:
    """A relative local path read against the config file's folder; URLs unchanged."""
    if not location or _is_url(location) or Path(location).is_absolute():
        return location
    return str((base / location).resolve())


def load_config(path: str | Path | None = None) -> SolarisConfig:
    """The config at ``path`` (or ``$SOLARIS_CONFIG``), relative paths anchored at its folder.

    Raises:
        ConfigError: no path, a missing or unreadable file, or invalid contents (naming the file
            and each bad key, with unknown keys refused).
    """
    file, raw = _read_yaml(path)
    try:
        config = SolarisConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"config file {file}: {_problems(exc)}") from exc
    return _anchor_paths(config, file.resolve().parent)


def _problems(exc: ValidationError, prefix: str = "") -> str:
    return "; ".join(
        f"{prefix}{'.'.join(str(p) for p in e['loc']) or '<top>'}: {e['msg']}" for e in exc.errors()
    )


def _unique_key_loader() -> Any:
    """PyYAML's safe loader, refusing a key a mapping already holds. YAML leaves a repeated key
    to the reader and PyYAML keeps the last: a second ``precompute:`` section at the end of a
    file replaced the whole first one, its budget back to the default, unsaid."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                try:
                    earlier = first_line.get(key)
                except TypeError:  # an unhashable key: the base class says so
                    break
                if earlier is not None:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"key {key!r} is repeated (first at line {earlier + 1}); "
                        "YAML would keep only the last one",
                        key_node.start_mark,
                    )
                first_line[key] = key_node.start_mark.line
            return super().construct_mapping(node, deep)

    return UniqueKeyLoader


def _read_yaml(path: str | Path | None) -> tuple[Path, dict[str, Any]]:
    """The config file's path and its mapping, not yet validated."""
    import yaml

    file = config_path(path)
    try:
        # yaml.safe_load's steps with a SafeLoader that refuses repeated keys.
        loader = _unique_key_loader()(file.read_text(encoding="utf-8"))
        try:
            raw = loader.get_single_data()
        finally:
            loader.dispose()
    except OSError as exc:
        raise ConfigError(f"config file {file} is not readable: {exc}") from exc
    except yaml.YAMLError as exc:
        # One line, with the file's own line and column (PyYAML's text names "<unicode
        # string>" and spans several lines with a caret drawing).
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"config file {file} is not valid YAML{where}: {problem}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {file} must hold a mapping, got {type(raw).__name__}")
    return file, raw


SectionT = TypeVar("SectionT", bound=BaseModel)


def _parse_time_section(
    name: str,
    model: type[SectionT],
    environ: Mapping[str, str] | None = None,
    only: tuple[str, ...] = (),
) -> SectionT:
    """The config's section ``name`` when ``$SOLARIS_CONFIG`` is set, else its defaults: what the
    DAG files read while they are parsed. Only the keys ``only`` of that section (all of it
    when empty) are checked there, the others keep their defaults: a bad value in any other key
    fails the ``start`` task that reads the whole file at run time, naming it, or the import of
    the one DAG that reads it. Checked whole at parse time, a bad key failed the import of every
    DAG file (a precompute retry count unloaded the training DAG), Airflow marked the DAGs
    stale, and a queued run's ``start`` waited for a DAG that was gone, failing nothing.

    Raises:
        ConfigError: the file is missing or not YAML, or a checked key is invalid.
    """
    env = os.environ if environ is None else environ
    path = env.get(CONFIG_ENV, "").strip()
    if not path:
        return model()
    file, raw = _read_yaml(path)
    section = raw.get(name) or {}
    if only and isinstance(section, dict):
        section = {key: section[key] for key in only if key in section}
    try:
        return model.model_validate(section)
    except ValidationError as exc:
        raise ConfigError(f"config file {file}: {_problems(exc, f'{name}.')}") from exc


def _anchor_paths(config: SolarisConfig, base: Path) -> SolarisConfig:
    # Derive a new config instead of mutating the validated one (they are frozen anyway).
    def table(t: Any) -> Any:
        return None if t is None else t.model_copy(update={"path": _anchored(t.path, base)})

    log = config.log.model_copy(
        update={
            "path": _anchored(config.log.path, base),
            "users": table(config.log.users),
            "items": table(config.log.items),
        }
    )
    candidates = config.candidates.model_copy(update={"table": table(config.candidates.table)})

    def model(choice: Any) -> Any:
        if isinstance(choice, ArtifactSpec):
            return choice.model_copy(update={"artifact": _anchored(choice.artifact, base)})
        return choice

    models = config.models.model_copy(
        update={
            "dir": _anchored(config.models.dir, base),
            "fm": model(config.models.fm),
            "verifier": model(config.models.verifier),
        }
    )
    precompute = config.precompute.model_copy(
        update={"runs_dir": _anchored(getattr(config.precompute, "runs_dir", ""), base)}
    )
    return config.model_copy(
        update={
            "feast": config.feast.model_copy(update={"repo": _anchored(config.feast.repo, base)}),
            "log": log,
            "candidates": candidates,
            "models": models,
            "precompute": precompute,
        }
    )


def resolved_log(config: SolarisConfig) -> InteractionLogConfig:
    """The log section with a ``feast_source`` replaced by that FileSource's path (resolved as
    Feast's file offline store resolves it: against the repo folder).

    Raises:
        ConfigError: the repo has no data source of that name, or it is not a FileSource.
    """
    log = config.log
    if not log.feast_source:
        return log
    from feast import FileSource

    from solaris_feast.store.config import open_repo_store
    from solaris_feast.store.offline import source_path

    repo = Path(config.feast.repo)
    store = open_repo_store(repo, repo / config.feast.feature_store_yaml)
    try:
        source = store.get_data_source(log.feast_source)
    except Exception as exc:  # feast raises DataSourceObjectNotFoundException
        raise ConfigError(
            f"log.feast_source {log.feast_source!r}: no data source of that name in the "
            f"registry of {repo} ({type(exc).__name__})"
        ) from exc
    if not isinstance(source, FileSource):
        raise ConfigError(
            f"log.feast_source {log.feast_source!r} is a {type(source).__name__}; only "
            "FileSource logs are read (point log.path at the parquet instead)"
        )
    location = source.path
    if not _is_url(location):
        location = str(source_path(location, store.config.repo_path))
    return log.model_copy(update={"path": location, "feast_source": ""})


def precompute_settings(
    config: SolarisConfig, overrides: Mapping[str, Any] | None = None
) -> PrecomputeSettings:
    """The precompute run settings the config names, ``overrides`` (DAG params of a manual run,
    ``--`` options) applied on top."""
    values: dict[str, Any] = {
        **config.precompute.model_dump(),
        "feature_repo": config.feast.repo,
        "feature_store_yaml": config.feast.feature_store_yaml,
        "models_dir": config.models.dir,
        "serving_vm": config.models.serving_vm,
        "log": resolved_log(config),
        "align_log_to_run": False,
        "candidates": config.candidates.chosen_table(),
    }
    return PrecomputeSettings.model_validate({**values, **dict(overrides or {})})


def training_settings(
    config: SolarisConfig, overrides: Mapping[str, Any] | None = None
) -> TrainingSettings:
    """The training run settings the config names, ``overrides`` applied on top."""
    values: dict[str, Any] = {
        **config.training.model_dump(),
        "models_dir": config.models.dir,
        "fm": config.models.fm,
        "verifier": config.models.verifier,
        "log": resolved_log(config),
        "align_log_to_run": False,
    }
    return TrainingSettings.model_validate({**values, **dict(overrides or {})})


def manual_overrides(
    params: Mapping[str, Any], conf: Mapping[str, Any] | None, param_defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """The DAG params a manual run set: those its conf names with a value other than the
    param's default. A scheduled run has no conf, so it takes every setting from the config;
    the trigger form sends every field, so a field left at its default is not an override."""
    given = dict(conf or {})
    return {
        name: params[name]
        for name in params
        if name in given and given[name] != param_defaults.get(name)
    }


def run_settings(
    kind: Literal["precompute", "training"],
    params: Mapping[str, Any],
    conf: Mapping[str, Any] | None,
    param_defaults: Mapping[str, Any],
) -> dict[str, Any]:
    """What a DAG's ``start`` task validates: with ``$SOLARIS_CONFIG`` set (read now, at run
    time), the config's settings with the manual run's overrides; else the params as given."""
    if not os.environ.get(CONFIG_ENV, "").strip():
        return dict(params)
    config = load_config()
    overrides = manual_overrides(params, conf, param_defaults)
    build = precompute_settings if kind == "precompute" else training_settings
    return build(config, overrides).model_dump(mode="json")


NO_SCHEDULE = "none"
"""The schedule of a DAG that runs only when triggered (by hand, the API or an asset)."""
_AIRFLOW_ONLY_PRESETS = frozenset({"@once", "@continuous", "@quarterly"})
"""Airflow's presets that croniter does not know."""


def checked_schedule(value: str, where: str = "") -> str:
    """``value``, stripped, when Airflow accepts it as a schedule (a cron expression, a preset or
    ``none``); else a ValueError naming ``where`` (the config's validation names its key),
    instead of the DAG file's import error
    (``AirflowTimetableInvalid``) that names neither the config key nor the variable."""
    from croniter import croniter

    chosen = value.strip()
    if (
        chosen.lower() == NO_SCHEDULE
        or chosen in _AIRFLOW_ONLY_PRESETS
        or croniter.is_valid(chosen)
    ):
        return chosen  # what was checked is what Airflow gets (it refuses ' @hourly ')
    named = f"{where}: " if where else ""
    raise ValueError(
        f"{named}{value!r} is not a schedule Airflow accepts (a cron expression such as "
        "'0 * * * *', a preset such as @hourly, or none)"
    )


def schedule_of(
    kind: Literal["precompute", "training"],
    default: str,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """A DAG's schedule: ``SOLARIS_<KIND>_SCHEDULE``, else the config's (when
    ``$SOLARIS_CONFIG`` is set), else ``default``. Read while the DAG file is parsed, and by
    ``feast apply`` for the views' schedule tags, so the tag says what runs.

    ``none`` is no schedule (None to Airflow): unpausing such a DAG starts no round with the
    param defaults, which every cron or preset does for its latest tick."""
    env = os.environ if environ is None else environ
    variable = env.get(f"SOLARIS_{kind.upper()}_SCHEDULE", "").strip()
    if variable:
        try:
            chosen = checked_schedule(variable, f"SOLARIS_{kind.upper()}_SCHEDULE")
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    elif env.get(CONFIG_ENV, "").strip():
        schedules = _parse_time_section("schedules", SchedulesSection, env, only=(kind,))
        chosen = schedules.precompute if kind == "precompute" else schedules.training
    else:
        chosen = default
    return None if chosen.strip().lower() == NO_SCHEDULE else chosen


def schedules_section(*only: str) -> SchedulesSection:
    """The config's ``schedules`` section when ``$SOLARIS_CONFIG`` is set, else the defaults
    (read while the DAG files are parsed; the cron strings through :func:`schedule_of`). With
    key names, only those keys are read and checked: what one DAG file uses."""
    return _parse_time_section("schedules", SchedulesSection, only=only)


def precompute_task_policy() -> PrecomputeTaskPolicy:
    """Time limits and retries of the precompute DAG's tasks (read while it is parsed; only
    ``airflow.precompute`` is checked)."""
    return _parse_time_section("airflow", AirflowSection, only=("precompute",)).precompute


def training_task_policy() -> TrainingTaskPolicy:
    """Time limits and retries of the training DAG's stages (read while it is parsed; only
    ``airflow.training`` is checked)."""
    return _parse_time_section("airflow", AirflowSection, only=("training",)).training


def config_reference_rows(
    model: type[BaseModel] = SolarisConfig, prefix: str = ""
) -> list[tuple[str, str, str, str]]:
    """``(key, type, default, description)`` of every key of ``model``, nested sections
    flattened to dotted keys: the README's key table is generated from this."""
    import json
    import types
    import typing

    rows: list[tuple[str, str, str, str]] = []
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        annotation = info.annotation
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        nested = annotation if isinstance(annotation, type) else None
        if nested is None and typing.get_origin(annotation) in (typing.Union, types.UnionType):
            nested = members[0] if len(members) == 1 and isinstance(members[0], type) else None
        description = " ".join((info.description or "").split())
        choice = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        literals = [
            a for m in members if typing.get_origin(m) is Literal for a in typing.get_args(m)
        ]
        if choice and literals and len(members) == len(choice) + 1:
            # A value or one of some sections (models.fm: "reference", an entry point or an
            # exported artifact): each section's keys are listed under the key.
            default = json.dumps(info.get_default(call_default_factory=True))
            kinds = " or ".join(json.dumps(v) for v in literals)
            rows.append((key, f"{kinds} or section", default, description))
            for section in choice:
                rows += config_reference_rows(section, f"{key}.")
            continue
        if nested is not None and issubclass(nested, BaseModel):
            optional = "" if info.is_required() else " (optional)"
            rows.append((key, "section" + optional, "", description))
            rows += config_reference_rows(nested, f"{key}.")
            continue
        if info.is_required():
            default = "required"
        else:
            default = json.dumps(info.get_default(call_default_factory=True))
        if typing.get_origin(annotation) is Literal:
            type_name = " or ".join(json.dumps(a) for a in typing.get_args(annotation))
        elif isinstance(annotation, type):
            type_name = annotation.__name__
        else:
            type_name = str(annotation).replace("typing.", "").replace("NoneType", "null")
        rows.append((key, type_name, default, description))
    return rows


def config_reference_markdown() -> str:
    """The key table of solaris.yaml as markdown (``python -m solaris_feast.config``)."""
    lines = ["| key | type | default | what it is |", "| --- | --- | --- | --- |"]
    for key, type_name, default, description in config_reference_rows():
        cells = [f"`{key}`", type_name.replace("|", "or"), default.replace("|", "or"), description]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(config_reference_markdown())
