"""Shared pieces of the hardening tests (no tests here): Redis servers we own, a TCP proxy that
cuts a connection mid-batch, a snapshot of everything a project stores, and batch builders.

Ports are this suite's own, from :mod:`ports` (one block per run of the suite): the proxy, a
Redis Cluster of three, a single throwaway Redis, a TLS-only Redis (test_hardening_security).
Every server started
here is stopped by the caller in ``finally``.
"""

from __future__ import annotations

import contextlib
import hashlib
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from conftest import start_throwaway_redis
from ports import CLUSTER_PORTS, PROXY_PORT, THROWAWAY_PORT  # noqa: F401  (the tests import them from here)

if TYPE_CHECKING:
    from feast import FeatureStore

DIM = 32
VERSION = "cmp-hardening-v1"


class OwnedRedis:
    """A redis-server on a fixed port that a test may kill, freeze and restart.

    With ``durable=True`` every write is fsynced to an append-only file before it is
    acknowledged, so a restart after ``kill -9`` shows exactly what Redis had executed.
    """

    def __init__(
        self, port: int, workdir: Path, *, durable: bool = False, extra: tuple[str, ...] = ()
    ) -> None:
        self.port = port
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.args: tuple[str, ...] = (
            ("--appendonly", "yes", "--appendfsync", "always") if durable else ()
        ) + extra
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        # The later flags override start_throwaway_redis's "--appendonly no".
        self.proc = start_throwaway_redis(self.port, str(self.workdir), *self.args)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final save, sockets reset."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def freeze(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None:
            self.thaw()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.proc = None


@contextlib.contextmanager
def owned_redis(port: int, workdir: Path, *, durable: bool = False) -> Iterator[OwnedRedis]:
    server = OwnedRedis(port, workdir, durable=durable)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class CuttingProxy:
    """Forwards client -> server bytes until ``cut_after_bytes`` have passed, then holds the rest.

    ``cut`` fires once the threshold is crossed: the server has received a prefix of a batch and
    will never see its end, which is what a server crash in the middle of a batch looks like from
    the server's side. ``sever`` then closes every connection. Server -> client bytes always flow.
    """

    def __init__(self, listen_port: int, target_port: int, cut_after_bytes: int) -> None:
        self.target_port = target_port
        self.cut_after_bytes = cut_after_bytes
        self.forwarded = 0
        self.cut = threading.Event()
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", listen_port))
        self._listener.listen(16)
        self._listener.settimeout(0.1)
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            server = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._sockets += [client, server]
            thread = threading.Thread(target=self._pump, args=(client, server), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        # sever() closes the sockets under this thread: select then sees fd -1 (ValueError).
        with contextlib.suppress(OSError, ValueError):
            while not self._stop.is_set():
                ready, _, _ = select.select([client, server], [], [], 0.05)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is server:
                        client.sendall(data)
                        continue
                    with self._lock:
                        room = max(self.cut_after_bytes - self.forwarded, 0)
                        passed = data[:room]
                        self.forwarded += len(passed)
                        if len(passed) < len(data):
                            self.cut.set()
                    if passed:
                        server.sendall(passed)

    def heal(self) -> None:
        """Forward everything from now on (the network is back)."""
        with self._lock:
            self.cut_after_bytes = 1 << 62

    def sever(self) -> None:
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def close(self) -> None:
        self._stop.set()
        self.sever()
        self._listener.close()
        for thread in self._threads:
            thread.join(timeout=2)


def project_snapshot(client: Any, project: str) -> dict[bytes, str]:
    """A digest of every Redis key this Feast project owns: its value, type and TTL state.

    Feast's entity hashes end with the project name; the miss queue's keys carry ``{project}``.
    """
    snapshot: dict[bytes, str] = {}
    for key in client.scan_iter(match=f"*{project}*", count=1000):
        kind = client.type(key).decode()
        if kind == "hash":
            value = repr(sorted(client.hgetall(key).items()))
        elif kind == "stream":
            value = repr(client.xrange(key))
        else:
            value = repr(client.dump(key))
        has_ttl = client.ttl(key) >= 0
        snapshot[key] = hashlib.sha256(f"{kind}|{value}|{has_ttl}".encode()).hexdigest()
    return snapshot


def offline_snapshot(store: FeatureStore) -> dict[str, str]:
    """Every offline parquet file of the store's repo with the sha256 of its bytes."""
    root = Path(str(store.config.repo_path), "data", "offline")
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*.parquet"))
    }


def pair_frame(
    user: int,
    items: np.ndarray | list[int],
    vectors: np.ndarray,
    *,
    version: str = VERSION,
    computed_at: pd.Timestamp | None = None,
) -> pd.DataFrame:
    """A ``solaris_pair`` batch: ``vectors`` is ``(N, D)`` float32."""
    item_ids = np.asarray(items, dtype=np.int64)
    return pd.DataFrame(
        {
            "user_id": np.full(len(item_ids), user, dtype=np.int64),
            "item_id": item_ids,
            "embedding": list(np.asarray(vectors, dtype=np.float32)),
            "model_version": version,
            "computed_at": computed_at
            if computed_at is not None
            else pd.Timestamp.now(tz="UTC").floor("ms"),
        }
    )


def wait_until(condition: Any, timeout_s: float, interval_s: float = 0.02) -> bool:
    """Poll ``condition()`` until true or ``timeout_s`` passes (a bounded loop)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval_s)
    return bool(condition())


def redis_cli() -> str:
    binary = shutil.which("redis-cli")
    if binary is None:
        raise RuntimeError("redis-cli is not installed (Debian: apt-get install redis-tools)")
    return binary
