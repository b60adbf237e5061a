"""Errors raised by solaris-feast.

One root class, so callers can catch everything of ours in one place; messages are built in
``__init__`` and name the bad value and what to do about it (the way ``feast.errors`` does).
Errors that a retry can fix (a store that is down or slow) are kept apart from final ones (bad
input), because fallback code must treat them differently.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import FrameType


class SolarisError(Exception):
    """Root of every error raised by solaris-feast."""


class SchemaError(SolarisError, ValueError):
    """An input table does not have the columns or types the schema requires."""

    def __init__(self, table: str, column: str, problem: str) -> None:
        self.table = table
        self.column = column
        self.problem = problem
        super().__init__(f"{table}: column {column!r} {problem}")


class ConfigError(SolarisError, ValueError):
    """A configuration value or file is malformed."""


class ModelOutputError(SolarisError, ValueError):
    """A model named in the config returned the wrong shape, dtype or non-finite values; the same
    inputs give the same answer, so no retry fixes it."""


class DatasetUnavailableError(SolarisError, RuntimeError):
    """A data set can be neither fetched nor found in the local cache."""


class ArtifactIntegrityError(SolarisError, RuntimeError):
    """A model artifact does not match the sha256 recorded in its model card."""

    def __init__(self, path: str, expected: str, actual: str) -> None:
        super().__init__(
            f"refusing to load {path}: its sha256 is {actual}, the model card says {expected}. "
            "The file was changed after training; retrain or restore the original artifact."
        )


class WriteBatchError(SolarisError, ValueError):
    """A batch of embeddings was refused as a whole; nothing of it was written."""

    def __init__(self, problem: str, rows: Sequence[int]) -> None:
        self.rows = list(rows)
        shown = ", ".join(str(r) for r in self.rows[:20])
        more = f" (+{len(self.rows) - 20} more)" if len(self.rows) > 20 else ""
        super().__init__(f"batch refused, nothing written: {problem} at rows [{shown}]{more}")


class RetryableStoreError(SolarisError, ConnectionError):
    """The online store is unreachable or too slow; the same call may succeed later."""


class DeadlineExceededError(RetryableStoreError, TimeoutError):
    """A read could not finish within its deadline and was aborted (nothing half-read is used)."""

    def __init__(self, what: str, deadline_ms: float) -> None:
        self.deadline_ms = deadline_ms
        super().__init__(f"{what} did not finish within the {deadline_ms:.4g} ms deadline")


class FinalStoreError(SolarisError, RuntimeError):
    """The online store answered, but with something a retry cannot fix: a malformed config, a
    missing table or view, a script or protocol error. Fix the cause; retrying repeats it."""


class ViewsNotAppliedError(FinalStoreError, LookupError):
    """The Feast registry of a repo lacks the SOLARIS views."""

    def __init__(self, repo: str, missing: Sequence[str], *, where: str | None = None) -> None:
        self.repo = repo
        self.missing = list(missing)
        # ``where``: what lacks the views when it is not the registry (an online table).
        lacking = where or f"the Feast registry of {repo} has no feature view"
        super().__init__(
            f"{lacking} {', '.join(self.missing)}: "
            f"run `feast apply` in {repo} (with -f <yaml> for a non-default feature_store yaml) "
            "before the precompute or serving"
        )


def _retryable_types() -> tuple[type[BaseException], ...]:
    """The explicit tuple of errors a retry may fix, as redis-py's ``Retry(supported_errors)``.

    redis-py's ``ConnectionError`` and ``TimeoutError`` are not subclasses of the builtins, so
    both families are listed. ``sqlite3.OperationalError`` is only retryable for busy or locked
    databases, which :func:`is_retryable` checks by message (SQLite has no subclass for them).
    """
    types: list[type[BaseException]] = [RetryableStoreError, ConnectionError, TimeoutError]
    try:
        import redis.exceptions as redis_errors
    except ImportError:  # redis is a dependency, but a SQLite-only caller needs no import
        pass
    else:
        types += [
            redis_errors.ConnectionError,
            redis_errors.TimeoutError,
            redis_errors.BusyLoadingError,
        ]
        # A Redis Cluster moving slots (a failover, a reshard): the same call succeeds once
        # the client's slot map is refreshed. MOVED and ASK are ResponseErrors to redis-py,
        # like a script error, but nothing is wrong with the call itself.
        types += [
            redis_errors.TryAgainError,
            redis_errors.ClusterDownError,
            redis_errors.AskError,  # MovedError is a subclass
            redis_errors.SlotNotCoveredError,
        ]
    return tuple(types)


def _final_types() -> tuple[type[BaseException], ...]:
    """Errors that look retryable by family but are not: redis-py raises a wrong password or a
    missing ACL permission as a ``ConnectionError`` subclass, yet retrying repeats it."""
    try:
        import redis.exceptions as redis_errors
    except ImportError:
        return (FinalStoreError,)
    return (FinalStoreError, redis_errors.AuthenticationError, redis_errors.AuthorizationError)


_SQLITE_RETRYABLE_MESSAGES = ("database is locked", "database is busy", "database table is locked")


def is_retryable(exc: BaseException) -> bool:
    """True when the same call may succeed later (a store that is down, slow, busy or locked).

    Everything else (config errors, a missing table, a bug) is final: retrying it repeats it.
    """
    import sqlite3

    if isinstance(exc, _final_types()):
        return False
    if isinstance(exc, sqlite3.OperationalError):
        message = str(exc).lower()
        return any(m in message for m in _SQLITE_RETRYABLE_MESSAGES) or "interrupted" in message
    return isinstance(exc, _retryable_types())


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of an error, for a message that carries it on. Not ``repr``: redis-py 8
    gives its errors a repr of their category alone (``network:ConnectionError``), so a store
    error quoted with ``!r`` lost the address and the cause (``Error 111 connecting to
    127.0.0.1:6391. Connection refused.``). A Redis error whose message does not name its server
    (a wrong password, a missing ACL permission, a full or read-only Redis) gets it appended."""
    message = str(exc)
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    server = redis_server_of(exc)
    if server is not None and server.split(" ")[0] not in message:
        text += f" (Redis at {server})"
    return text


def redis_server_of(exc: BaseException) -> str | None:
    """``host:port`` (with `` db N`` when not 0) of the redis-py connection ``exc`` was raised
    on, or None. redis-py's errors carry no address, so it is read off the connection object in
    the frames the error passed through, innermost first; only the address is taken, never the
    connection's other settings (its password)."""
    import sys

    connection_module = sys.modules.get("redis.connection")
    redis_errors = sys.modules.get("redis.exceptions")
    if connection_module is None or redis_errors is None:  # redis never imported
        return None
    connection_type = connection_module.AbstractConnection
    chain_of_errors: list[BaseException] = []
    error: BaseException | None = exc
    while error is not None and all(error is not e for e in chain_of_errors):
        chain_of_errors.append(error)  # the error, then what it wraps
        error = error.__cause__ or error.__context__
    if not any(isinstance(e, redis_errors.RedisError) for e in chain_of_errors):
        return None  # a frame may hold a connection an unrelated error never touched
    frames: list[FrameType] = []  # innermost first, per error
    for error in chain_of_errors:
        tb = error.__traceback__
        chain: list[FrameType] = []
        while tb is not None:
            chain.append(tb.tb_frame)
            tb = tb.tb_next
        frames += reversed(chain)
    for frame in frames:
        for value in frame.f_locals.values():
            if isinstance(value, connection_type):
                host, port = getattr(value, "host", None), getattr(value, "port", None)
                if host is None or port is None:
                    path = getattr(value, "path", None)  # a unix socket
                    return str(path) if path else None
                db = getattr(value, "db", 0)
                return f"{host}:{port}" + (f" db {db}" if db not in (0, "0", None) else "")
    return None


class ModelVersionError(ConfigError):
    """An FM's or a VM's card version asked for where the chain's embedding version is meant
    (:func:`solaris_feast.models.cards.check_embedding_version`): no stored vector carries it."""


class ChainMismatchError(ConfigError):
    """The serving chain (FM, compressor, VM) does not fit the log a round reads: another label
    set, ids beyond the models' embedding tables, other attribute sizes. No retry can fix it;
    train on this log, or promote a chain that was."""

    def __init__(self, vm_version: str, mismatches: Sequence[str]) -> None:
        self.vm_version = vm_version
        self.mismatches = list(mismatches)
        super().__init__(
            f"the serving chain of VM {vm_version} does not fit the log it reads or the views "
            "it writes: "
            + "; ".join(self.mismatches)
            + ". Fix each as it says, or train on this log and promote the new VM: the "
            "solaris_training DAG with the params this round used, or with a config solaris "
            "train --config PATH, then solaris promote --config PATH --vm VERSION"
        )
