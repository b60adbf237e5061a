"""Shared test fixtures.

Redis is a real server reached over a connection. ``REDIS_URL`` (default
``redis://127.0.0.1:6379/0``) is used when it answers; otherwise a throwaway ``redis-server`` is
started on a free port for the session and stopped afterwards. With neither, the run fails: a
missing Redis is never a skip.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def _redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1.0).ping())
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_throwaway_redis(port: int, workdir: str, *extra: str) -> subprocess.Popen[bytes]:
    """Start a redis-server that keeps nothing on disk; the caller stops it."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError(
            "no Redis answers and redis-server is not installed: start one and set REDIS_URL, "
            "or install it (Debian: apt-get install redis-server)"
        )
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if _redis_answers(f"redis://127.0.0.1:{port}/0"):
            return proc
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"redis-server on port {port} did not answer within 10 s")


def pytest_configure(config: pytest.Config) -> None:
    # Done at configure time so REDIS_URL is settled before any test module is imported.
    url = os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
    if _redis_answers(url):
        os.environ["REDIS_URL"] = url
        return
    workdir = tempfile.mkdtemp(prefix="solaris-redis-")
    port = free_port()
    try:
        proc = start_throwaway_redis(port, workdir)
    except RuntimeError as exc:
        raise pytest.UsageError(f"{exc} (tried REDIS_URL={url})") from exc
    config._solaris_redis = proc  # type: ignore[attr-defined]
    os.environ["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"


def pytest_unconfigure(config: pytest.Config) -> None:
    proc = getattr(config, "_solaris_redis", None)
    if proc is not None:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_url() -> str:
    return os.environ["REDIS_URL"]


@pytest.fixture
def feast_project() -> Iterator[str]:
    """A Feast project name of this test's own; its Redis keys are deleted afterwards."""
    import redis

    # A session sharing the Redis with others can pick its own prefix to tell its keys apart.
    prefix = os.environ.get("SOLARIS_TEST_PROJECT_PREFIX", "solaris_test_")
    name = f"{prefix}{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    # Feast's Redis keys end with the project name; the miss queue and locks carry it too.
    for pattern in (f"*{name}", f"*{name}*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)


@pytest.fixture
def tmp_dir(tmp_path: Path) -> Path:
    return tmp_path
