"""Where the Feast store lives: SQLite (embedded default) or Redis, chosen at run time.

``feature_repo/feature_store.yaml`` is the SQLite default; ``feature_repo/feature_store.redis.yaml``
reads its connection from ``SOLARIS_REDIS_CONNECTION`` (Feast expands environment variables in
the yaml), which :func:`export_redis_connection` derives from ``REDIS_URL``, so a password never
sits in a file. Tests and benchmarks build the same configuration in code with
:func:`build_repo_config`. :func:`open_repo_store` derives the connection for the yaml without
setting the variable (only :func:`export_redis_connection`, called on purpose, writes it).

The online layout lives in :mod:`solaris_feast.store.layout` and the store access in
:mod:`solaris_feast.store.backends`; their names are re-exported here for existing callers.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from solaris_feast.errors import ConfigError
from solaris_feast.store.backends import OnlineFacts, OnlineKind

if TYPE_CHECKING:
    from feast import FeatureStore, RepoConfig

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
REDIS_CONNECTION_ENV = "SOLARIS_REDIS_CONNECTION"
SOLARIS_ONLINE_STORE_TYPES: dict[str, str] = {
    "redis": "solaris_feast.serving.online_store.SolarisRedisOnlineStore",
    "sqlite": "solaris_feast.serving.online_store.SolarisSqliteOnlineStore",
}
"""``online_store.type`` of solaris's Feast online store of each kind: Feast's own store, plus
the resolved view answered in one round trip (:mod:`solaris_feast.serving.online_store`)."""


def redis_connection_string(redis_url: str) -> str:
    """Turn ``redis://[user:password@]host:port/db`` into Feast's ``host:port,db=N,...`` form."""
    parsed = urlparse(redis_url)
    if parsed.scheme not in ("redis", "rediss"):
        raise ConfigError(f"REDIS_URL must start with redis:// or rediss://, got {redis_url!r}")
    host = parsed.hostname or "127.0.0.1"
    port = parsed.port or 6379
    parts = [f"{host}:{port}"]
    db = parsed.path.lstrip("/")
    if db:
        if not db.isdigit():
            raise ConfigError(f"REDIS_URL database must be a number, got {db!r}")
        parts.append(f"db={db}")
    if parsed.username:
        parts.append(f"username={_connection_value(unquote(parsed.username))}")
    if parsed.password:
        parts.append(f"password={_connection_value(unquote(parsed.password))}")
    if parsed.scheme == "rediss":
        parts.append("ssl=true")
    return ",".join(parts)


# Characters that Feast's connection string or the yaml it is expanded into would take apart:
# "," separates the string's parts; a space or tab makes " #" a yaml comment and ": " a yaml
# mapping; "$" names an environment variable wherever the value is expanded again.
_CONNECTION_UNSAFE = ", $\t"


def _connection_value(text: str) -> str:
    """``text`` as a value of Feast's connection string that Feast's parser gives back as it is.

    The parser splits the string on every "," and JSON-decodes each value, so a password with a
    comma lost its tail, and one that reads as JSON (``1e3``, ``true``) arrived as a number or a
    bool. Such a value is written as a JSON string with those characters escaped (``\\u002c``):
    it holds no comma, and the JSON decoding gives the text back. Other values stay as written."""
    try:
        json.loads(text)
    except ValueError:
        if not any(c in _CONNECTION_UNSAFE for c in text):
            return text
    quoted = json.dumps(text)  # escapes quotes, backslashes and non-ASCII
    for c in _CONNECTION_UNSAFE:
        quoted = quoted.replace(c, f"\\u{ord(c):04x}")
    return quoted


def export_redis_connection(redis_url: str | None = None) -> str:
    """Set ``SOLARIS_REDIS_CONNECTION`` from ``REDIS_URL`` for ``feature_store.redis.yaml``.

    This writes ``os.environ`` (process-wide), on purpose: for a shell or a ``feast`` CLI run in
    the same process. Opening a store needs none of it (:func:`open_repo_store` derives it)."""
    connection = redis_connection_string(
        redis_url or os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
    )
    os.environ[REDIS_CONNECTION_ENV] = connection
    return connection


def build_repo_config(
    project: str,
    repo_path: Path,
    online: OnlineKind = "sqlite",
    redis_url: str | None = None,
    key_ttl_seconds: int | None = None,
    resolve_in_store: bool = False,
) -> RepoConfig:
    """A local-provider configuration equal to the one in ``feature_repo/``.

    Args:
        project: Feast project name; it namespaces every online key and table.
        repo_path: folder holding the registry, the SQLite file and the offline parquet.
        online: ``"sqlite"`` (embedded) or ``"redis"`` (connection from ``redis_url`` or
            ``REDIS_URL``).
        key_ttl_seconds: Redis only; expires a whole entity hash (every view of the key).
        resolve_in_store: use solaris's online store of that kind
            (:data:`SOLARIS_ONLINE_STORE_TYPES`), which answers the resolved view in one round
            trip; everything else it reads as Feast's own store does.
    """
    from feast import RepoConfig

    repo_path = Path(repo_path).resolve()
    online_store: dict[str, object]
    if online == "sqlite":
        online_store = {"type": "sqlite", "path": str(repo_path / "data" / "online.db")}
    elif online == "redis":
        url = redis_url or os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
        online_store = {"type": "redis", "connection_string": redis_connection_string(url)}
        if key_ttl_seconds is not None:
            online_store["key_ttl_seconds"] = key_ttl_seconds
    else:
        raise ConfigError(f"online must be 'sqlite' or 'redis', got {online!r}")
    if resolve_in_store:
        online_store["type"] = SOLARIS_ONLINE_STORE_TYPES[online]
    return RepoConfig(
        project=project,
        provider="local",
        registry={
            "registry_type": "file",
            "path": str(repo_path / "data" / "registry.db"),
            "cache_ttl_seconds": 60,
        },
        online_store=online_store,
        offline_store={"type": "file"},
        entity_key_serialization_version=3,
        repo_path=repo_path,
    )


def open_store(
    project: str,
    repo_path: Path,
    online: OnlineKind = "sqlite",
    redis_url: str | None = None,
    resolve_in_store: bool = False,
) -> FeatureStore:
    """A ``FeatureStore`` over :func:`build_repo_config`; nothing is applied yet."""
    from feast import FeatureStore

    Path(repo_path, "data").mkdir(parents=True, exist_ok=True)
    return FeatureStore(
        config=build_repo_config(
            project,
            Path(repo_path),
            online=online,
            redis_url=redis_url,
            resolve_in_store=resolve_in_store,
        )
    )


__all__ = [
    "DEFAULT_REDIS_URL",
    "REDIS_CONNECTION_ENV",
    "SOLARIS_ONLINE_STORE_TYPES",
    "OnlineKind",
    "build_repo_config",
    "export_redis_connection",
    "open_repo_store",
    "open_store",
    "redis_connection_string",
    "registry_fingerprint",
    "repo_online_facts",
    "repo_yaml",
]


_ENV_REFERENCE = re.compile(r"\$(\w+|\{[^}]*\})")


def expand_config_text(text: str, environment: Mapping[str, str]) -> str:
    """``os.path.expandvars`` over a mapping instead of the process environment: ``$NAME`` and
    ``${NAME}`` are replaced when ``environment`` has them, and left as they are otherwise."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1).strip("{}")
        return environment.get(name, match.group(0))

    return _ENV_REFERENCE.sub(replace, text)


def repo_yaml(repo: Path, config: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """A repo's Feast config file and its mapping, expanded as Feast expands it (a relative
    ``config`` resolves against the repo); ``SOLARIS_REDIS_CONNECTION`` is derived from
    ``REDIS_URL`` when unset. ``os.environ`` is read, never written."""
    import yaml

    repo = Path(repo)
    yaml_file = Path(config) if config is not None else repo / "feature_store.yaml"
    # The repo's own file first: a file of that name in the working folder (another repo's
    # feature_store.redis.yaml) was read instead, with another project. A path that only the
    # working folder holds (feature_repo/feature_store.redis.yaml) is still found there.
    if config is not None and not yaml_file.is_absolute():
        in_repo = repo / yaml_file
        if in_repo.is_file() or not yaml_file.is_file():
            yaml_file = in_repo
    if not yaml_file.is_file():
        raise ConfigError(
            f"{repo} is not a Feast repo ({yaml_file} not found): name the folder you run "
            "`feast apply` in and its yaml (a command's --repo and --config; in a solaris "
            "config, feast.repo and feast.feature_store_yaml)"
        )
    # Feast's load_repo_config expands the yaml with os.environ; here the same expansion runs
    # over a copy of it, so opening a store changes nothing process-wide (a SQLite config
    # ignores the variable).
    environment = dict(os.environ)
    if REDIS_CONNECTION_ENV not in environment:
        environment[REDIS_CONNECTION_ENV] = redis_connection_string(
            environment.get("REDIS_URL", DEFAULT_REDIS_URL)
        )
    raw = yaml.safe_load(expand_config_text(yaml_file.read_text(), environment))
    if not isinstance(raw, dict):
        raise ConfigError(f"{yaml_file} is not a Feast config (expected a mapping at the top)")
    if is_solaris_config(raw):
        raise ConfigError(
            f"{yaml_file} is a solaris config (it has a feast: section), not a Feast "
            "feature_store.yaml: name it where a solaris config is read (a solaris command's "
            "--config, $SOLARIS_CONFIG), and the Feast yaml in its feast.feature_store_yaml"
        )
    return yaml_file, raw


def is_solaris_config(raw: object) -> bool:
    """Whether a parsed yaml is a solaris config (a ``feast:`` section, no Feast ``project``)
    rather than a Feast ``feature_store.yaml``."""
    return isinstance(raw, dict) and "project" not in raw and isinstance(raw.get("feast"), dict)


def open_repo_store(
    repo: Path, config: Path | None = None, *, applied: bool = False
) -> FeatureStore:
    """The Feast store of a repo folder, from ``feature_store.yaml`` or another config file
    (:func:`repo_yaml`).

    Args:
        applied: the caller only reads (status, lineage): refuse a repo whose local registry
            file does not exist, instead of letting Feast's first read create an empty one in
            the user's repo. Registries elsewhere (object storage, SQL) are left to Feast.
    """
    from feast import FeatureStore
    from feast.repo_config import FeastConfigError, RepoConfig
    from pydantic import ValidationError

    yaml_file, raw = repo_yaml(repo, config)
    try:
        repo_config = RepoConfig(**raw)
    except ValidationError as exc:
        # Feast's own wording (the fields and the file), as one of our errors: a command says it
        # in one line instead of a traceback.
        raise ConfigError(str(FeastConfigError(exc, str(yaml_file)))) from exc
    repo_config.repo_path = Path(repo)
    if applied:
        registry = local_registry_file(repo_config, Path(repo))
        if registry is not None and not registry.is_file():
            raise ConfigError(
                f"{yaml_file}: no Feast registry at {registry}, so this repo was never applied: "
                "run `feast apply` in it (or point --repo/--config at the one that serves)"
            )
    return FeatureStore(repo_path=str(repo), config=repo_config)


def local_registry_file(repo_config: Any, repo: Path) -> Path | None:
    """Where a file registry on local disk lives, resolved against the repo as Feast's
    ``FileRegistryStore`` does; None for a registry elsewhere (``s3://``, ``gs://``, SQL)."""
    registry = repo_config.registry
    path = str(getattr(registry, "path", "") or "")
    if getattr(registry, "registry_type", "file") != "file" or not path or "://" in path:
        return None
    file = Path(path)
    return file if file.is_absolute() else repo / file


# Feast's defaults for the fields read below (feast.repo_config, local provider).
_DEFAULT_ONLINE_TYPE = "sqlite"
_DEFAULT_SQLITE_PATH = "data/online.db"
_DEFAULT_SERIALIZATION_VERSION = 3


def repo_online_facts(repo: Path, config: Path | None = None) -> OnlineFacts:
    """The online store of a repo's config as the backends need it, without importing Feast.

    Reads the same yaml as :func:`open_repo_store` with Feast's defaults for what it leaves out;
    ``tests/test_backends.py`` pins it to :meth:`OnlineFacts.of_store` of the opened store.
    """
    yaml_file, raw = repo_yaml(repo, config)
    project = raw.get("project")
    if not isinstance(project, str) or not project:
        raise ConfigError(f"{yaml_file}: no project name (the 'project' key)")
    online = raw.get("online_store") or _DEFAULT_ONLINE_TYPE
    if isinstance(online, str):
        online = {"type": online}
    if not isinstance(online, dict):
        raise ConfigError(f"{yaml_file}: online_store must be a mapping or a type name")
    online_type = str(online.get("type", _DEFAULT_ONLINE_TYPE))
    path = ""
    if online_type == "sqlite" or online_type.endswith("SqliteOnlineStore"):
        path = str(online.get("path") or _DEFAULT_SQLITE_PATH)
        if not Path(path).is_absolute():
            path = str(Path(repo) / path)
    return OnlineFacts(
        project=project,
        serialization_version=int(
            raw.get("entity_key_serialization_version", _DEFAULT_SERIALIZATION_VERSION)
        ),
        type=online_type,
        redis_type=str(online.get("redis_type", "redis")),
        connection_string=str(online.get("connection_string", "") or ""),
        sqlite_path=path,
        repo=str(repo),
    )


def registry_fingerprint(repo: Path, config: Path | None = None) -> str | None:
    """A digest of what a round reads of its registry, for a file registry on a local path:
    the registry file's bytes, the expanded config and the repo folder (the offline folders
    resolve against it). None for a SQL or remote registry, or a registry not yet written:
    those are read through Feast every time."""
    import hashlib

    _, raw = repo_yaml(repo, config)
    registry = raw.get("registry")
    if isinstance(registry, str):
        registry = {"path": registry}
    if not isinstance(registry, dict) or registry.get("registry_type", "file") != "file":
        return None
    location = str(registry.get("path") or "")
    if not location or "://" in location:
        return None
    path = Path(location) if Path(location).is_absolute() else Path(repo) / location
    if not path.is_file():
        return None
    digest = hashlib.blake2b(digest_size=16)
    digest.update(str(Path(repo).resolve()).encode())
    digest.update(repr(sorted(raw.items(), key=lambda kv: str(kv[0]))).encode())
    digest.update(path.read_bytes())
    return digest.hexdigest()
