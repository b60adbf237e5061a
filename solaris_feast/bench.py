"""Benchmarks of the serving read and the write path, side by side with Feast's own calls.

``solaris bench serve`` times, in one run against the same Redis and the same stored rows:

- ``resolved``: :meth:`SolarisRetriever.fetch` for 1 user x N candidates, all three tiers
  resolved, TTL and version enforced, misses queued (the default configuration);
- ``feast_single_view``: ``store.get_online_features`` of the pair view alone for the same rows;
- ``raw_redis``: a bare redis-py pipeline of the same HMGETs on the same hashes, no decoding;
- ``raw_redis_hand_packed``: the retriever's own hand-packed read, no decoding (its floor);
- ``feast_resolved_view``: the Feast-native on-demand resolved view (context: no solaris code in
  the client, but Feast's per-row Python transformation);
- ``feast_server_single_view`` and ``feast_server_resolved``: the same two Feast reads through
  ``feast serve`` over HTTP (JSON, one kept-alive connection), started on the same repo.

``solaris bench write`` times :class:`EmbeddingWriter` (online only, and online + parquet) against
``store.write_to_online_store`` for 32-d embeddings on fresh keys, and reports Redis memory per
stored pair embedding (``MEMORY USAGE``).

``solaris bench precompute`` times the FM with each user's history encoded once per batch against
once per pair (``user_reuse_speedup``, a 2-layer FM, 50 planned items per user) and the split of
a whole round's wall time (``non_fm_share``, the round ``benchmarks/bench_precompute.py`` runs),
each beside the per-pair path in the same run.

``solaris bench memory`` stores the same pair embeddings with each embedding codec (float32,
float16, int8; :mod:`solaris_feast.store.layout`) and reports Redis bytes per pair (``MEMORY
USAGE`` of the keys and the ``used_memory`` delta), and the NE cost of the quantized codecs
(:mod:`solaris_feast.evaluation.quantization`).

Feast projects are named ``$SOLARIS_BENCH_PROJECT_PREFIX<random>`` (default ``solaris_bench_``)
and their keys deleted afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import pandas as pd
import typer

from solaris_feast.columns import (
    COMPUTED_AT,
    EMBEDDING,
    ITEM_ID,
    MEAN_DISTANCE,
    MODEL_VERSION,
    NEIGHBOUR_COUNT,
    PAIR_COUNT,
    USER_ID,
)
from solaris_feast.pipeline.runs import round_process_settings
from solaris_feast.pipeline.settings import DEFAULT_BATCH_SIZE

if TYPE_CHECKING:
    from feast import FeatureStore

bench_app = typer.Typer(help="Benchmarks of SOLARIS serving reads and writes against Redis.")
JsonPathOption = Annotated[Path | None, typer.Option("--json", help="Write the results here.")]
RedisUrlOption = Annotated[str | None, typer.Option(help="Redis to use (default: $REDIS_URL).")]

DEFAULT_CANDIDATES = (10, 100, 1000)
BENCH_USER = 7


@contextmanager
def bench_store(
    redis_url: str | None, dim: int, embedding_codec: str = "float32"
) -> Iterator[FeatureStore]:
    """A throwaway Feast project on Redis with the SOLARIS views applied; removed afterwards."""
    import redis

    from solaris_feast.store.config import DEFAULT_REDIS_URL, open_store
    from solaris_feast.store.definitions import SolarisFeastConfig, solaris_definitions

    url = redis_url or os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
    prefix = os.environ.get("SOLARIS_BENCH_PROJECT_PREFIX", "solaris_bench_")
    project = f"{prefix}{uuid.uuid4().hex[:8]}"
    folder = Path(tempfile.mkdtemp(prefix="solaris-bench-"))
    store = open_store(project, folder, online="redis", redis_url=url)
    views = SolarisFeastConfig(embedding_dim=dim, embedding_codec=embedding_codec)
    store.apply(solaris_definitions(views).all())
    try:
        yield store
    finally:
        client = redis.Redis.from_url(url)
        for pattern in (f"*{project}", f"*{{{project}}}*"):
            keys = list(client.scan_iter(match=pattern, count=1000))
            for start in range(0, len(keys), 1000):
                client.delete(*keys[start : start + 1000])
        shutil.rmtree(folder, ignore_errors=True)


def solaris_store_beside(store: FeatureStore, redis_url: str | None) -> FeatureStore:
    """The same project, registry and rows as ``store``, opened with solaris's Feast online
    store (:mod:`solaris_feast.serving.online_store`) on Redis."""
    from feast import FeatureStore as FeastStore

    from solaris_feast.store.config import build_repo_config

    return FeastStore(
        config=build_repo_config(
            store.config.project,
            Path(str(store.config.repo_path)),
            online="redis",
            redis_url=redis_url or os.environ.get("REDIS_URL"),
            resolve_in_store=True,
        )
    )


def loopback_port_is_free(port: int) -> bool:
    """Whether nothing listens on ``127.0.0.1:port`` now (the test suite picks its ports
    with it too)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_loopback_port() -> int:
    """A loopback port no one listens on now, for a server this benchmark starts: a fixed
    default would collide with a second run (a developer's and CI's) on one machine."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def feast_server(
    store: FeatureStore, port: int, online_type: str = "redis"
) -> Iterator[Callable[[dict[str, Any]], Any]]:
    """``feast serve`` over ``store``'s repo on ``127.0.0.1:port`` with ``online_type`` as its
    online store; yields a function that posts one ``/get-online-features`` body on a
    kept-alive connection and returns the parsed answer."""
    import http.client
    import subprocess
    import sys

    import yaml

    repo = Path(str(store.config.repo_path))
    online = store.config.online_store
    (repo / "feature_store.yaml").write_text(
        yaml.safe_dump(
            {
                "project": store.config.project,
                "provider": "local",
                "registry": {
                    "registry_type": "file",
                    "path": str(store.config.registry.path),
                    "cache_ttl_seconds": 60,
                },
                "online_store": {
                    "type": online_type,
                    "connection_string": online.connection_string,
                },
                "offline_store": {"type": "file"},
                "entity_key_serialization_version": 3,
            }
        )
    )
    if not loopback_port_is_free(port):
        # Another server would answer the health check before ours has even bound (Feast
        # takes seconds to import): timing it would time someone else's repo.
        raise RuntimeError(f"port {port} is in use on 127.0.0.1; pick a free one for feast serve")
    feast = Path(sys.executable).with_name("feast")
    # The yaml is read once at start-up (health answers after), so a second server of another
    # online type may rewrite it; each keeps its own log.
    log_path = repo / f"serve-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(feast), "serve", "-h", "127.0.0.1", "-p", str(port), "--no-access-log"],
            cwd=repo,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    connection.request("GET", "/health")
                    connection.getresponse().read()
                    if proc.poll() is not None:
                        # Another server answered on the port ours failed to bind: timing it
                        # would time someone else's repo.
                        raise RuntimeError(
                            f"feast serve exited but port {port} answers: "
                            f"{log_path.read_text()[-2000:]}"
                        )
                    break
                except (ConnectionError, OSError, http.client.HTTPException) as exc:
                    connection.close()
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"feast serve did not start: {log_path.read_text()[-2000:]}"
                        ) from exc
                    time.sleep(0.3)

            def post(body: dict[str, Any]) -> Any:
                payload = json.dumps(body)
                headers = {"Content-Type": "application/json"}
                try:
                    connection.request("POST", "/get-online-features", payload, headers)
                    response = connection.getresponse()
                except (ConnectionError, http.client.RemoteDisconnected):
                    # feast serve (uvicorn) closes a kept-alive connection idle for 5 s, as
                    # between two contenders; http.client does not reconnect by itself. The
                    # timed calls follow warm-up calls, so a reconnect is never timed.
                    connection.close()
                    connection.request("POST", "/get-online-features", payload, headers)
                    response = connection.getresponse()
                answer = json.loads(response.read())
                if response.status != 200:
                    raise RuntimeError(f"feast serve answered {response.status}: {answer}")
                return answer

            yield post
        finally:
            connection.close()
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _timed_ms(call: Callable[[], object], iterations: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(iterations):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000.0)
    return samples


def _summary(samples: list[float]) -> dict[str, float]:
    array = np.asarray(samples)
    return {
        "p50_ms": round(float(np.percentile(array, 50)), 4),
        "p99_ms": round(float(np.percentile(array, 99)), 4),
        "mean_ms": round(float(array.mean()), 4),
    }


def _populate(store: FeatureStore, items: int, dim: int, version: str) -> None:
    """Exact embeddings for 8 items in 10, similarity fill for 1 in 10, a user mean for all."""
    from solaris_feast.store.write import EmbeddingWriter

    rng = np.random.default_rng(0)
    now = pd.Timestamp.now(tz="UTC")
    ids = np.arange(items, dtype=np.int64)
    # Tiers interleaved, so every N sees the mix (and the miss queue works for the rest).
    exact = ids[ids % 10 < 8]
    similar = ids[ids % 10 == 8]
    EmbeddingWriter(store, "solaris_pair", offline=False).write(
        pd.DataFrame(
            {
                USER_ID: np.full(len(exact), BENCH_USER, dtype=np.int64),
                ITEM_ID: exact,
                EMBEDDING: list(rng.standard_normal((len(exact), dim)).astype(np.float32)),
                MODEL_VERSION: version,
                COMPUTED_AT: now,
            }
        )
    )
    EmbeddingWriter(store, "solaris_similar", offline=False).write(
        pd.DataFrame(
            {
                USER_ID: np.full(len(similar), BENCH_USER, dtype=np.int64),
                ITEM_ID: similar,
                EMBEDDING: list(rng.standard_normal((len(similar), dim)).astype(np.float32)),
                NEIGHBOUR_COUNT: np.full(len(similar), 5, dtype=np.int64),
                MEAN_DISTANCE: np.full(len(similar), 0.3),
                MODEL_VERSION: version,
                COMPUTED_AT: now,
            }
        )
    )
    EmbeddingWriter(store, "solaris_user", offline=False).write(
        pd.DataFrame(
            {
                USER_ID: [BENCH_USER],
                EMBEDDING: [rng.standard_normal(dim).astype(np.float32)],
                PAIR_COUNT: [len(exact)],
                MODEL_VERSION: version,
                COMPUTED_AT: now,
            }
        )
    )


def run_serve_benchmark(
    redis_url: str | None = None,
    candidates: tuple[int, ...] = DEFAULT_CANDIDATES,
    iterations: int = 300,
    dim: int = 32,
    with_feast_server: bool = True,
    feast_server_port: int | None = None,
    embedding_codec: str = "float32",
) -> dict[str, Any]:
    """Latency of the resolved fetch, Feast's single-view read and a raw pipeline, per N; with
    ``with_feast_server`` also Feast's two reads through a ``feast serve`` started on
    ``feast_server_port`` (``None``: a free loopback port). Feast's reads run twice: on Feast's
    own Redis store and on solaris's (:mod:`solaris_feast.serving.online_store`, same registry
    and rows), each with its own ``feast serve``."""

    from solaris_feast.serving.retriever import SolarisRetriever
    from solaris_feast.store.backends.redis import RedisBackend, redis_client
    from solaris_feast.store.config import SOLARIS_ONLINE_STORE_TYPES
    from solaris_feast.store.definitions import MODEL_VERSION_REQUEST_FIELD
    from solaris_feast.store.layout import EntityKeyLayout, online_field

    version = "bench-v1"
    results: dict[str, Any] = {"candidates": {}}
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(bench_store(redis_url, dim, embedding_codec))
        _populate(store, max(candidates), dim, version)
        # The same project, registry and rows, read through solaris's Feast online store.
        solaris_store = solaris_store_beside(store, redis_url)
        server = (
            stack.enter_context(feast_server(store, feast_server_port or free_loopback_port()))
            if with_feast_server
            else None
        )
        solaris_server = (
            stack.enter_context(
                feast_server(store, free_loopback_port(), SOLARIS_ONLINE_STORE_TYPES["redis"])
            )
            if with_feast_server
            else None
        )
        retriever = SolarisRetriever(store, version, deadline_ms=1000.0)
        client = redis_client(store, timeout_seconds=5.0)
        pipeline_backend = RedisBackend(client, store.config.project, packed=False)
        project = store.config.project.encode()
        pair_key = EntityKeyLayout([USER_ID, ITEM_ID], 3).key
        user_key = EntityKeyLayout([USER_ID], 3).key(BENCH_USER) + project
        pair_fields = [
            online_field(view, feature)
            for view in ("solaris_pair", "solaris_similar")
            for feature in (EMBEDDING, MODEL_VERSION, COMPUTED_AT)
        ]
        user_fields = [
            online_field("solaris_user", f) for f in (EMBEDDING, MODEL_VERSION, COMPUTED_AT)
        ]
        pair_features = [f"solaris_pair:{f}" for f in (EMBEDDING, MODEL_VERSION, COMPUTED_AT)]
        resolved_features = [
            "solaris_resolved:resolved_embedding",
            "solaris_resolved:resolved_tier",
        ]
        user_plain_features = [f"solaris_user:{PAIR_COUNT}"]
        for n in candidates:
            items = np.arange(n, dtype=np.int64)
            keys = [pair_key(BENCH_USER, int(i)) + project for i in items]
            rows = [{USER_ID: BENCH_USER, ITEM_ID: int(i)} for i in items]

            def raw(keys: list[bytes] = keys) -> object:
                pipe = client.pipeline(transaction=False)
                for key in keys:
                    pipe.hmget(key, pair_fields)
                pipe.hmget(user_key, user_fields)
                return pipe.execute()

            def feast_single(rows: list[dict[str, int]] = rows, on: FeatureStore = store) -> object:
                return on.get_online_features(features=pair_features, entity_rows=rows)

            def feast_resolved(
                rows: list[dict[str, int]] = rows, on: FeatureStore = store
            ) -> object:
                return on.get_online_features(
                    features=resolved_features,
                    entity_rows=[row | {MODEL_VERSION_REQUEST_FIELD: version} for row in rows],
                    full_feature_names=True,
                )

            def feast_mixed(rows: list[dict[str, int]] = rows) -> object:
                # A VM's usual request: the resolved embedding beside a plain view's feature,
                # answered by the solaris store in one call (its plain views through Feast).
                return solaris_store.get_online_features(
                    features=[*resolved_features, *user_plain_features],
                    entity_rows=[row | {MODEL_VERSION_REQUEST_FIELD: version} for row in rows],
                    full_feature_names=True,
                )

            def feast_two_views(rows: list[dict[str, int]] = rows) -> object:
                # Its baseline: Feast's own store reading the pair view and the same plain view.
                return store.get_online_features(
                    features=[*pair_features, *user_plain_features],
                    entity_rows=rows,
                    full_feature_names=True,
                )

            def raw_packed(items: np.ndarray = items) -> object:
                # The retriever's own hand-packed read without decoding: its floor.
                return retriever.backend.read_tiers(
                    BENCH_USER, items, retriever.view_names, time.perf_counter() + 5.0
                )

            def raw_pipeline_backend(items: np.ndarray = items) -> object:
                # The same read and reply handling through redis-py's pipeline.
                return pipeline_backend.read_tiers(
                    BENCH_USER, items, retriever.view_names, time.perf_counter() + 5.0
                )

            def resolved(items: np.ndarray = items) -> object:
                return retriever.fetch(BENCH_USER, items)

            ids = [int(i) for i in items]
            single_body = {
                "features": pair_features,
                "entities": {USER_ID: [BENCH_USER] * n, ITEM_ID: ids},
            }
            resolved_body = {
                "features": resolved_features,
                "entities": {
                    USER_ID: [BENCH_USER] * n,
                    ITEM_ID: ids,
                    MODEL_VERSION_REQUEST_FIELD: [version] * n,
                },
                "full_feature_names": True,
            }

            reps = iterations if n <= 100 else max(iterations // 3, 30)
            # Interleaved rounds, so a noisy neighbour slows every contender alike.
            contenders: dict[str, Callable[[], object]] = {
                "resolved": resolved,
                "feast_single_view": feast_single,
                "raw_redis": raw,
                "raw_redis_hand_packed": raw_packed,
                "raw_redis_py_pipeline_backend": raw_pipeline_backend,
                "feast_resolved_view": feast_resolved,
                "feast_single_view_solaris_store": functools.partial(
                    feast_single, on=solaris_store
                ),
                "feast_resolved_view_solaris_store": functools.partial(
                    feast_resolved, on=solaris_store
                ),
                "feast_two_views": feast_two_views,
                "feast_mixed_view_solaris_store": feast_mixed,
            }
            if server is not None and solaris_server is not None:
                contenders["feast_server_single_view"] = functools.partial(server, single_body)
                contenders["feast_server_resolved"] = functools.partial(server, resolved_body)
                contenders["feast_server_resolved_solaris_store"] = functools.partial(
                    solaris_server, resolved_body
                )
            samples: dict[str, list[float]] = {name: [] for name in contenders}
            rounds = 5
            for _ in range(rounds):
                for name, call in contenders.items():
                    # The on-demand view is slow and only context: fewer samples at N=1000.
                    slow = name in ("feast_resolved_view", "feast_server_resolved")
                    count = reps // rounds if not slow or n <= 100 else 2
                    samples[name] += _timed_ms(call, count, 2)
            check = retriever.fetch(BENCH_USER, items)
            results["candidates"][str(n)] = {
                name: _summary(values) for name, values in samples.items()
            } | {
                "tier_counts": {
                    str(t): int(c)
                    for t, c in zip(*np.unique(check.tiers, return_counts=True), strict=True)
                }
            }
        retriever.close()
    at_100 = results["candidates"].get("100")
    if at_100 is not None:
        for name in (
            "resolved",
            "feast_single_view",
            "raw_redis",
            "raw_redis_hand_packed",
            "raw_redis_py_pipeline_backend",
            "feast_resolved_view",
            "feast_single_view_solaris_store",
            "feast_resolved_view_solaris_store",
            "feast_two_views",
            "feast_mixed_view_solaris_store",
            "feast_server_single_view",
            "feast_server_resolved",
            "feast_server_resolved_solaris_store",
        ):
            if name not in at_100:
                continue
            results[f"{name}_p50_ms"] = at_100[name]["p50_ms"]
            results[f"{name}_p99_ms"] = at_100[name]["p99_ms"]
        results["resolved_vs_feast_single_view_p50"] = round(
            results["resolved_p50_ms"] / results["feast_single_view_p50_ms"], 3
        )
        results["resolved_vs_raw_redis_p50"] = round(
            results["resolved_p50_ms"] / results["raw_redis_p50_ms"], 3
        )
        results["feast_resolved_vs_single_view_p50"] = round(
            results["feast_resolved_view_p50_ms"] / results["feast_single_view_p50_ms"], 3
        )
        # The solaris store's resolved read over the same baseline: Feast's own store's read
        # of the plain pair view (the solaris store's own single-view read is reported beside).
        results["feast_resolved_solaris_store_vs_single_view_p50"] = round(
            results["feast_resolved_view_solaris_store_p50_ms"]
            / results["feast_single_view_p50_ms"],
            3,
        )
        # The resolved view mixed with a plain view, over Feast's own read of the pair view
        # and that plain view.
        results["feast_mixed_solaris_store_vs_two_views_p50"] = round(
            results["feast_mixed_view_solaris_store_p50_ms"] / results["feast_two_views_p50_ms"],
            3,
        )
        if "feast_server_resolved_p50_ms" in results:
            results["feast_server_resolved_vs_single_view_p50"] = round(
                results["feast_server_resolved_p50_ms"]
                / results["feast_server_single_view_p50_ms"],
                3,
            )
            results["feast_server_resolved_solaris_store_vs_single_view_p50"] = round(
                results["feast_server_resolved_solaris_store_p50_ms"]
                / results["feast_server_single_view_p50_ms"],
                3,
            )
        results["hand_packed_vs_redis_py_pipeline_p50"] = round(
            results["raw_redis_hand_packed_p50_ms"]
            / results["raw_redis_py_pipeline_backend_p50_ms"],
            3,
        )
    results["meta"] = _meta(iterations=iterations, dim=dim, embedding_codec=embedding_codec)
    return results


LONG_TRANSACTION_ROWS = 1024
"""The writer's rows per transaction before 2026-12-05: a contender of
:func:`run_write_benchmark`."""


def run_write_benchmark(
    redis_url: str | None = None, rows: int = 20_000, dim: int = 32, repeats: int = 3
) -> dict[str, Any]:
    """Rows per second of the solaris write path vs ``write_to_online_store``, fresh keys."""
    from solaris_feast.store.backends.redis import redis_client
    from solaris_feast.store.layout import DEFAULT_ATOMIC_ROWS, EntityKeyLayout
    from solaris_feast.store.write import EmbeddingWriter

    rng = np.random.default_rng(1)
    now = pd.Timestamp.now(tz="UTC")

    def batch(offset: int) -> pd.DataFrame:
        return pd.DataFrame(
            {
                USER_ID: np.arange(offset, offset + rows, dtype=np.int64) // 50,
                ITEM_ID: np.arange(offset, offset + rows, dtype=np.int64),
                EMBEDDING: list(rng.standard_normal((rows, dim)).astype(np.float32)),
                MODEL_VERSION: "bench-v1",
                COMPUTED_AT: now,
            }
        )

    results: dict[str, Any] = {}
    with bench_store(redis_url, dim) as store:
        from solaris_feast.store.backends.redis import RedisBackend

        online_writer = EmbeddingWriter(store, "solaris_pair", offline=False)
        full_writer = EmbeddingWriter(store, "solaris_pair", offline=True)
        # The writer's transactions as they were before 2026-12-05: 4x fewer EXECs a batch, each
        # holding Redis 4x longer (what serving pays for them: benchmarks/soak.py).
        long_transactions_writer = EmbeddingWriter(
            store, "solaris_pair", offline=False, atomic_rows=LONG_TRANSACTION_ROWS
        )
        # The same transactions and scripts sent through redis-py's pipeline instead of packed
        # by hand: what the hand-packed RESP has to beat to stay.
        pipeline_writer = EmbeddingWriter(
            store,
            "solaris_pair",
            offline=False,
            backend=RedisBackend(
                redis_client(store, timeout_seconds=30.0), store.config.project, packed=False
            ),
        )
        timings: dict[str, list[float]] = {
            "solaris": [],
            "solaris_redis_py_pipeline": [],
            "solaris_with_offline": [],
            f"solaris_atomic_rows_{LONG_TRANSACTION_ROWS}": [],
            "feast": [],
        }
        offset = 0
        for _ in range(repeats):
            for name in timings:
                frame = batch(offset)
                offset += rows
                started = time.perf_counter()
                if name == "solaris":
                    online_writer.write(frame)
                elif name == "solaris_redis_py_pipeline":
                    pipeline_writer.write(frame)
                elif name == "solaris_with_offline":
                    full_writer.write(frame)
                elif name.startswith("solaris_atomic_rows_"):
                    long_transactions_writer.write(frame)
                else:
                    feast_frame = frame.assign(
                        event_timestamp=frame[COMPUTED_AT],
                        written_at=frame[COMPUTED_AT],
                        embedding=[v.tolist() for v in frame[EMBEDDING]],
                    )
                    store.write_to_online_store("solaris_pair", feast_frame)
                timings[name].append(time.perf_counter() - started)
        for name, seconds in timings.items():
            results[f"{name}_rows_per_s"] = round(rows / statistics.median(seconds), 1)
        results["solaris_vs_feast"] = round(
            results["solaris_rows_per_s"] / results["feast_rows_per_s"], 3
        )
        results["hand_packed_vs_redis_py_pipeline"] = round(
            results["solaris_rows_per_s"] / results["solaris_redis_py_pipeline_rows_per_s"], 3
        )
        results["atomic_rows"] = {"solaris": DEFAULT_ATOMIC_ROWS, "before": LONG_TRANSACTION_ROWS}
        for writer in (online_writer, full_writer, pipeline_writer, long_transactions_writer):
            writer.close()

        client = redis_client(store, timeout_seconds=5.0)
        project = store.config.project.encode()
        key = EntityKeyLayout([USER_ID, ITEM_ID], 3).key
        sample = [
            key(int(u), int(i)) + project for u, i in ((k // 50, k) for k in range(0, 2000, 7))
        ]
        usage = [client.memory_usage(k, samples=0) for k in sample]
        usage = [u for u in usage if u]
        results["redis_memory_bytes_per_pair_embedding"] = round(float(np.mean(usage)), 1)
        results["redis_memory_note"] = (
            "MEMORY USAGE of (user, item) hashes holding only the pair view: key, embedding "
            f"({dim} float32 as a Feast ValueProto), model_version, computed_at, _ts"
        )
    results["meta"] = _meta(rows=rows, dim=dim, repeats=repeats)
    return results


PACKED_EXTRA_BYTES = (0, 2, 8, 16, 18)
"""Bytes added to a stored value to see which Redis allocation class a packed layout lands in."""


def _embedding_only(
    embedding_field: bytes, extra: int, fields: dict[bytes, bytes]
) -> dict[bytes, bytes]:
    """A hash's embedding and ``_ts`` fields only, the embedding grown by ``extra`` bytes."""
    kept = {f: v for f, v in fields.items() if f == embedding_field or f.startswith(b"_ts:")}
    kept[embedding_field] = kept[embedding_field] + b"\0" * extra
    return kept


def run_memory_benchmark(
    redis_url: str | None = None,
    pairs: int = 5000,
    dim: int = 32,
    ne_seeds: tuple[int, ...] = (0, 1, 2),
    ne_dataset_size: str = "demo",
) -> dict[str, Any]:
    """Redis bytes per stored pair embedding per codec, and the NE cost of quantizing ``z``."""
    import redis
    from feast.protos.feast.types.Value_pb2 import Value as ValueProto

    from solaris_feast.store.backends.redis import redis_client
    from solaris_feast.store.layout import (
        EMBEDDING_CODECS,
        EntityKeyLayout,
        online_field,
        stored_model_version,
    )
    from solaris_feast.store.write import EmbeddingWriter

    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((pairs, dim)).astype(np.float32)
    users = np.arange(pairs, dtype=np.int64) // 50
    # A scheduled round stores computed_at = the round's time, a whole second.
    computed_at = pd.Timestamp.now(tz="UTC").floor("h")
    # A model card's version has this shape and length (models/cards.py).
    version = f"compressor-{computed_at:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
    version_field = online_field("solaris_pair", MODEL_VERSION)
    full_version = ValueProto(string_val=version).SerializeToString()
    tagged_version = ValueProto(string_val=stored_model_version(version)).SerializeToString()
    # The default feature repo's project name is "solaris": the same hashes are also rebuilt
    # under a throwaway name of its length (7), never under a name a deployment may use.
    short_project = f"s{uuid.uuid4().hex[:6]}".encode()

    def rebuilt_usage(
        client: Any, keys: list[bytes], edit: Any, stored_under: bytes, project: bytes
    ) -> list[int]:
        """MEMORY USAGE of the hashes rebuilt from scratch (a hash never converts back to a
        listpack after HDEL) with ``edit`` applied to their fields, under the key with the
        project name ``stored_under`` replaced by ``project``; other keys are removed after."""
        usage = []
        for k in keys:
            fields = edit(dict(client.hgetall(k)))
            target = k[: -len(stored_under)] + project
            client.delete(target)
            client.hset(target, mapping=fields)
            usage.append(int(client.memory_usage(target, samples=0) or 0))
            if target != k:
                client.delete(target)
        return usage

    embedding_field = online_field("solaris_pair", EMBEDDING)

    def same(fields: dict[bytes, bytes]) -> dict[bytes, bytes]:
        return fields

    def with_full_version(fields: dict[bytes, bytes]) -> dict[bytes, bytes]:
        return fields | {version_field: full_version}

    def without_embedding(fields: dict[bytes, bytes]) -> dict[bytes, bytes]:
        tagged = fields | {version_field: tagged_version}  # as written, after `full` below
        return {f: v for f, v in tagged.items() if f != embedding_field}

    per_codec: dict[str, dict[str, Any]] = {}
    for codec in EMBEDDING_CODECS:
        with bench_store(redis_url, dim, codec) as store:
            client = redis_client(store, timeout_seconds=30.0)
            before = int(client.info("memory")["used_memory"])
            writer = EmbeddingWriter(store, "solaris_pair", offline=False)
            writer.write(
                pd.DataFrame(
                    {
                        USER_ID: users,
                        ITEM_ID: np.arange(pairs, dtype=np.int64),
                        EMBEDDING: list(vectors),
                        MODEL_VERSION: version,
                        COMPUTED_AT: computed_at,
                    }
                )
            )
            writer.close()
            after = int(client.info("memory")["used_memory"])
            store_project = store.config.project.encode()
            key = EntityKeyLayout([USER_ID, ITEM_ID], 3).key
            sample = [key(int(users[i]), int(i)) + store_project for i in range(0, pairs, 7)]
            usage = [int(client.memory_usage(k, samples=0) or 0) for k in sample]
            encodings = sorted({client.object("encoding", k).decode() for k in sample})
            short_tag = rebuilt_usage(client, sample, same, store_project, short_project)
            short_full = rebuilt_usage(
                client, sample, with_full_version, store_project, short_project
            )
            short_floor = rebuilt_usage(
                client, sample, without_embedding, store_project, short_project
            )
            # Room for the version and the time inside the value (a "packed" codec): the
            # embedding and _ts alone, the value grown by `extra` bytes (throwaway keys).
            packed = {
                extra: round(
                    float(
                        np.mean(
                            rebuilt_usage(
                                client,
                                sample,
                                functools.partial(_embedding_only, embedding_field, extra),
                                store_project,
                                short_project,
                            )
                        )
                    ),
                    1,
                )
                for extra in PACKED_EXTRA_BYTES
            }
            full = rebuilt_usage(client, sample, with_full_version, store_project, store_project)
            # The floor of Feast's layout: the same hashes without the embedding (last: it
            # rewrites the bench's own keys).
            floor = rebuilt_usage(client, sample, without_embedding, store_project, store_project)
            per_codec[codec] = {
                "memory_usage_bytes_per_pair": round(float(np.mean(usage)), 1),
                "full_version_bytes_per_pair": round(float(np.mean(full)), 1),
                "default_project_bytes_per_pair": round(float(np.mean(short_tag)), 1),
                "default_project_full_version_bytes_per_pair": round(float(np.mean(short_full)), 1),
                "used_memory_delta_bytes_per_pair": round((after - before) / pairs, 1),
                "hash_encoding": encodings,
                "without_embedding_bytes_per_pair": round(float(np.mean(floor)), 1),
                "default_project_without_embedding_bytes_per_pair": round(
                    float(np.mean(short_floor)), 1
                ),
                "default_project_embedding_and_ts_only_bytes_per_pair_by_extra_value_bytes": {
                    str(k): v for k, v in packed.items()
                },
                "key_bytes": len(sample[0]),
                "default_project_key_bytes": len(sample[0])
                - len(store_project)
                + len(short_project),
            }
            client.close()
    probe = redis.Redis.from_url(redis_url or os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
    listpack_value = probe.config_get("hash-max-listpack-value").get("hash-max-listpack-value")
    probe.close()
    results: dict[str, Any] = {
        "bytes_per_pair": {c: v["memory_usage_bytes_per_pair"] for c, v in per_codec.items()},
        "bytes_per_pair_vs_float32": {
            c: round(
                v["memory_usage_bytes_per_pair"]
                / per_codec["float32"]["memory_usage_bytes_per_pair"],
                3,
            )
            for c, v in per_codec.items()
        },
        "per_codec": per_codec,
        "redis_hash_max_listpack_value": listpack_value,
        "bytes_per_pair_full_version": {
            c: v["full_version_bytes_per_pair"] for c, v in per_codec.items()
        },
        "bytes_per_pair_default_project": {
            c: v["default_project_bytes_per_pair"] for c, v in per_codec.items()
        },
        "bytes_per_pair_default_project_full_version": {
            c: v["default_project_full_version_bytes_per_pair"] for c, v in per_codec.items()
        },
        "model_version": version,
        "memory_note": (
            "MEMORY USAGE (samples=0) of (user, item) hashes holding only the pair view: key, "
            f"embedding ({dim}-d, by codec), model_version (the stored 8-character tag of a "
            f"{len(version)}-character card version), computed_at, _ts; computed_at a whole "
            "hour. full_version: the same hashes rebuilt with the full version stored, as "
            "before the tag. default_project: rebuilt under a 7-character project name, the "
            "length of the default repo's 'solaris'. without_embedding: rebuilt without the "
            "embedding field, the floor of Feast's layout. embedding_and_ts_only: rebuilt "
            "with the embedding (grown by as many bytes as the key says) and _ts only, the "
            "room a layout packing the version and the time into the value would have."
        ),
    }
    if ne_seeds:
        import torch

        from solaris_feast.data.datasets import load_dataset
        from solaris_feast.evaluation.quantization import quantization_ne_cost

        torch.set_num_threads(1)
        dataset = load_dataset("synthetic", ne_dataset_size, 0)
        ne = quantization_ne_cost(dataset, ne_seeds, code_dim=dim)
        main = ne["tasks"][0]
        results["ne_cost"] = {c: round(v[main], 7) for c, v in ne["ne_cost"].items()}
        results["ne_cost_task"] = main
        results["ne_cost_max_any_task_seed"] = {
            c: round(v, 7) for c, v in ne["ne_cost_max"].items()
        }
        results["ne"] = ne
    results["meta"] = _meta(
        pairs=pairs, dim=dim, ne_seeds=list(ne_seeds), ne_dataset=ne_dataset_size
    )
    return results


class _TeeSink:
    """Writes through the real writer and keeps the rows for the aggregate and the fill."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.frames: list[pd.DataFrame] = []

    def write(self, frame: pd.DataFrame) -> object:
        self.frames.append(frame)
        return self.writer.write(frame)


@round_process_settings()  # as the shard, aggregate and fill tasks run
def run_round_benchmark(
    size: str = "demo",
    candidates_per_user: int = 200,
    budget: float = 0.1,
    batch_size: int | None = None,
    threads: int = 2,
    models: Path | None = None,
    fm_layers: int = 0,
    fm_dim: int = 64,
    online: str = "sqlite",
    reuse_history: bool = True,
    overlap_writes: bool = True,
    fill_targets: int | None = None,
) -> dict[str, Any]:
    """Where the wall time of one precompute round goes: FM work against planning, writes,
    aggregation and fill (the round the hourly DAG runs, through the real write path).

    Models have the default sizes (``fm_layers`` / ``fm_dim`` of a seeded FM); their weights are
    seeded, not trained (``models`` loads trained ones), which changes no timing. ``batch_size``
    defaults to the DAG's (``precompute.batch_size``): until 2026-12-04 the bench ran 4,096 pairs
    a batch, which the DAG never does (its FM ran 16% slower per pair at that size).
    ``fill_targets``: over-budget pairs given to the similarity fill; by default the DAG's
    (``precompute.fill_targets_per_budget`` times the planned pairs, through the same
    :func:`~solaris_feast.precompute.similarity.fill_target_count`). Until 2026-12-04 the DAG's
    default was a count, 50,000, 3.1 times this round's 16k planned pairs.
    """
    import torch

    from solaris_feast.data.datasets import load_dataset
    from solaris_feast.models.features import PairFeaturizer
    from solaris_feast.models.foundation import FoundationConfig
    from solaris_feast.models.interface import ChainModels, ReferenceEncoder
    from solaris_feast.models.registry import load_bundle, register_untrained_chain
    from solaris_feast.models.training import flops_per_pair
    from solaris_feast.pipeline.settings import DEFAULT_RETURN_WEIGHT_EXPONENT, PrecomputeSettings
    from solaris_feast.precompute.aggregate import PairEmbeddings, aggregate_user_embeddings
    from solaris_feast.precompute.candidates import CandidateConfig, generate_candidates
    from solaris_feast.precompute.compute import run_precompute
    from solaris_feast.precompute.plan import plan_precompute, request_score
    from solaris_feast.precompute.returns import return_weights
    from solaris_feast.precompute.similarity import (
        FILL_WRITE_PARTS,
        SimilarityConfig,
        aggregate_user_index,
        fill_and_write,
        fill_target_count,
        similarity_fill_parts,
    )
    from solaris_feast.store.config import open_store
    from solaris_feast.store.definitions import solaris_definitions
    from solaris_feast.store.write import EmbeddingWriter

    if batch_size is None:  # the DAG's
        batch_size = int(PrecomputeSettings.model_fields["batch_size"].default)
    torch.set_num_threads(threads)
    ds = load_dataset("synthetic", size)
    log = ds.interactions
    now = log["event_timestamp"].max().ceil("h")
    featurizer = PairFeaturizer(ds, 32)
    seconds: dict[str, float] = {}
    prefix = os.environ.get("SOLARIS_BENCH_PROJECT_PREFIX", "solaris_bench_")
    project = f"{prefix}{uuid.uuid4().hex[:8]}"
    root = Path(tempfile.mkdtemp(prefix="solaris-bench-precompute-"))
    try:
        if models is not None:
            bundle = load_bundle(models)
        else:
            torch.manual_seed(0)
            bundle = register_untrained_chain(
                root / "m",
                featurizer.schema,
                ("click", "conversion"),
                FoundationConfig(num_layers=fm_layers, embed_dim=fm_dim, hidden_dim=4 * fm_dim),
            )
        store = open_store(project, root / "repo", online=online)  # type: ignore[arg-type]
        store.apply(solaris_definitions().all())
        version = bundle.embedding_version

        t = time.perf_counter()
        candidates = generate_candidates(
            log,
            now,
            CandidateConfig(candidates_per_user=candidates_per_user, category_column="category"),
            items=ds.items,
        )
        seconds["candidates"] = time.perf_counter() - t

        t = time.perf_counter()
        users = candidates["user_id"].to_numpy()
        items = candidates["item_id"].to_numpy()
        scores = np.zeros(len(candidates))
        with torch.inference_mode():
            for lo in range(0, len(candidates), 8192):
                batch = featurizer.batch(users[lo : lo + 8192], items[lo : lo + 8192], now)
                scores[lo : lo + 8192] = bundle.vm.verifier_score(batch).numpy()
        # As the DAG's plan task does: the verifier's score times the retrieval score and the
        # user's weight by expected returns within the pair TTL the plan below assumes.
        pair_ttl_seconds = 6 * 3600
        candidates["verifier_score"] = request_score(
            users,
            scores,
            candidates["candidate_score"].to_numpy(dtype=np.float64),
            user_weight=return_weights(
                users,
                log,
                pd.Timestamp(now),
                pair_ttl_seconds,
                DEFAULT_RETURN_WEIGHT_EXPONENT,
            ),
        )
        seconds["verifier"] = time.perf_counter() - t

        t = time.perf_counter()
        plan = plan_precompute(
            candidates,
            None,
            None,
            round(budget * len(candidates)),
            now,
            pair_ttl_seconds,
            3600,
            0.5,
        )
        seconds["plan"] = time.perf_counter() - t

        writer = EmbeddingWriter(store, "solaris_pair")
        sink = _TeeSink(writer)
        chain = ChainModels.reference(bundle, featurizer)
        if isinstance(chain.encoder, ReferenceEncoder):
            chain.encoder.reuse_history = reuse_history
        stats = run_precompute(
            plan, chain, ds, sink, batch_size=batch_size, overlap_writes=overlap_writes
        )
        writer.close()
        seconds["featurize"] = stats.featurize_seconds
        seconds["fm"] = stats.fm_seconds
        # What the pair writes add to the round's wall time; with overlap_writes the writer
        # thread's busy time (pair_writes_busy) is partly hidden behind the next batch's FM.
        seconds["pair_writes"] = stats.write_wait_seconds
        seconds["pair_writes_busy"] = stats.write_seconds
        pairs = pd.concat(sink.frames, ignore_index=True)

        t = time.perf_counter()
        exact = PairEmbeddings.from_frame(pairs)
        user_rows = aggregate_user_embeddings(exact, now, version)
        seconds["aggregate"] = time.perf_counter() - t
        t = time.perf_counter()
        user_writer = EmbeddingWriter(store, "solaris_user")
        user_writer.write(user_rows)
        user_writer.close()
        seconds["user_writes"] = time.perf_counter() - t

        t = time.perf_counter()
        # As the DAG's fill_similar does: the neighbours are searched over the user aggregates
        # (D = the compressed z's), not over FM user vectors; until 2026-12-04 the bench ran an
        # FM pass for 128-d user vectors the DAG never computes, and counted it as FM work.
        index = aggregate_user_index(user_rows, SimilarityConfig())
        similar_writer = EmbeddingWriter(store, "solaris_similar")
        # As the fill task does: in parts, each written while the next is computed (the
        # sequential arm: one fill, then its write).
        if fill_targets is None:  # the DAG's default multiple of the planned pairs
            fill_targets = fill_target_count(len(plan))
        targets = plan.uncovered.head(fill_targets)
        parts = similarity_fill_parts(
            index,
            targets,
            exact,
            now,
            version,
            6 * 3600,
            SimilarityConfig(),
            parts=FILL_WRITE_PARTS if overlap_writes else 1,
        )
        written = fill_and_write(parts, similar_writer, overlap_writes=overlap_writes)
        similar_writer.close()
        elapsed = time.perf_counter() - t
        # What the similar writes add to the wall time; their busy time is partly hidden.
        seconds["similar_writes"] = written.write_wait_seconds
        seconds["similar_writes_busy"] = written.write_seconds
        seconds["fill"] = elapsed - written.write_wait_seconds
    finally:
        if online == "redis":
            import redis

            client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
            keys = list(client.scan_iter(match=f"*{project}*", count=1000))
            for start in range(0, len(keys), 1000):
                client.delete(*keys[start : start + 1000])
        shutil.rmtree(root, ignore_errors=True)

    fm_flops = bundle.fm_card.flops_per_pair
    if fm_flops is None:  # a seeded FM's card has no count: count it on a probe batch
        probe = featurizer.batch(users[:256], items[:256], now)
        fm_flops = flops_per_pair(bundle.fm, lambda: bundle.fm(probe), len(probe))
    fm_work = seconds["featurize"] + seconds["fm"]
    writes = seconds["pair_writes"] + seconds["user_writes"] + seconds["similar_writes"]
    overhead = seconds["plan"] + writes + seconds["aggregate"] + seconds["fill"]
    scoring = seconds["candidates"] + seconds["verifier"]
    return {
        "benchmark": "precompute_run",
        "dataset": f"synthetic/{size}",
        "candidate_pairs": len(candidates),
        "planned_pairs": len(plan),
        "batch_size": batch_size,
        "user_rows": len(user_rows),
        "fill_targets": len(targets),
        "similar_rows": written.filled,
        "reuse_history": reuse_history,
        "overlap_writes": overlap_writes,
        "fm_layers": fm_layers if models is None else bundle.fm.config.num_layers,
        "fm_pairs_per_second": round(stats.pairs / stats.fm_seconds, 1),
        "precompute_pairs_per_second": round(stats.pairs_per_second, 1),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        # The overhead: planning, writes, aggregation, fill, over the run's wall time
        # without candidate generation and verifier scoring.
        "non_fm_share": round(overhead / (overhead + fm_work), 4),
        # The round's wall time without candidate generation and verifier scoring.
        "round_seconds": round(overhead + fm_work, 3),
        "non_fm_share_without_writes": round(
            (overhead - writes) / (overhead - writes + fm_work), 4
        ),
        "non_fm_share_with_candidates_and_verifier": round(
            (overhead + scoring) / (overhead + scoring + fm_work), 4
        ),
        "fm_flops_per_pair": fm_flops,
        "threads": threads,
        "trained_models": models is not None,
        "non_fm_microseconds_per_planned_pair": round(1e6 * overhead / max(len(plan), 1), 1),
        "fm_microseconds_per_pair": round(1e6 * fm_work / max(len(plan), 1), 1),
        "online_store": online,
    }


def run_reuse_benchmark(
    size: str = "demo",
    users: int = 40,
    items_per_user: int = 50,
    fm_layers: int = 2,
    batch_size: int = DEFAULT_BATCH_SIZE,
    rounds: int = 5,
    threads: int = 1,
) -> dict[str, Any]:
    """Pairs/s of the FM + compressor with each user's history encoded once per batch against
    once per pair, ``items_per_user`` planned items per user, interleaved rounds in one run."""
    import torch

    from solaris_feast.data.datasets import load_dataset
    from solaris_feast.models.features import PairFeaturizer
    from solaris_feast.models.foundation import FoundationConfig
    from solaris_feast.models.interface import ChainModels, PairsAsOf, ReferenceEncoder
    from solaris_feast.models.registry import register_untrained_chain
    from solaris_feast.precompute.compute import compute_pair_embeddings

    torch.set_num_threads(threads)
    ds = load_dataset("synthetic", size)
    featurizer = PairFeaturizer(ds, 32)
    now = ds.interactions["event_timestamp"].max().ceil("h")
    rng = np.random.default_rng(0)
    chosen = rng.choice(ds.num_users, users, replace=False)
    user_ids = np.repeat(chosen, items_per_user).astype(np.int64)
    item_ids = np.concatenate(
        [rng.choice(ds.num_items, items_per_user, replace=False) for _ in chosen]
    ).astype(np.int64)
    root = Path(tempfile.mkdtemp(prefix="solaris-bench-reuse-"))
    try:
        torch.manual_seed(0)
        bundle = register_untrained_chain(
            root, featurizer.schema, ("click", "conversion"), FoundationConfig(num_layers=fm_layers)
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    chain = ChainModels.reference(bundle, featurizer)
    encoder = chain.encoder
    if not isinstance(encoder, ReferenceEncoder):
        raise TypeError("the reuse benchmark needs the reference FM")
    pairs = PairsAsOf.of(user_ids, item_ids, now, ds)
    timings: dict[str, list[float]] = {"per_pair": [], "reuse": []}
    fm_timings: dict[str, list[float]] = {"per_pair": [], "reuse": []}
    outputs: dict[str, np.ndarray] = {}
    for reuse_history in (False, True):  # warm-up: first calls pay for allocation and dispatch
        encoder.reuse_history = reuse_history
        compute_pair_embeddings(chain, pairs.part(0, batch_size), batch_size=batch_size)
    for _ in range(rounds):
        for name in timings:
            encoder.reuse_history = name == "reuse"
            started = time.perf_counter()
            z, _, fm_s = compute_pair_embeddings(chain, pairs, batch_size=batch_size)
            timings[name].append(time.perf_counter() - started)
            fm_timings[name].append(fm_s)
            outputs[name] = z
    count = len(user_ids)
    per_pair_rate = count / statistics.median(timings["per_pair"])
    reuse_rate = count / statistics.median(timings["reuse"])
    fm_speedup = statistics.median(fm_timings["per_pair"]) / statistics.median(fm_timings["reuse"])
    return {
        "pairs": count,
        "users": users,
        "items_per_user": items_per_user,
        "fm_layers": fm_layers,
        "batch_size": batch_size,
        "per_pair_pairs_per_s": round(per_pair_rate, 1),
        "reuse_pairs_per_s": round(reuse_rate, 1),
        # Wall time of compute_pair_embeddings (featurizing included, the same on both paths).
        "user_reuse_speedup": round(reuse_rate / per_pair_rate, 3),
        "user_reuse_speedup_fm_only": round(fm_speedup, 3),
        "max_abs_difference": float(np.abs(outputs["reuse"] - outputs["per_pair"]).max()),
        "threads": threads,
    }


def run_precompute_benchmark(
    size: str = "demo",
    threads: int = 1,
    online: str = "sqlite",
    models: Path | None = None,
    overlap_repeats: int = 3,
) -> dict[str, Any]:
    """``user_reuse_speedup`` (2-layer FM, 50 planned items per user) and ``non_fm_share`` of a
    round with the reference FM (median of ``overlap_repeats`` rounds, writes overlapped with
    the FM), with the per-pair path and sequential writes beside them in the same run.

    One torch thread by default: on a shared 2-core machine two threads spin against the
    neighbours' load and the timings swing by several times (measured 3.5x slower)."""
    reuse = run_reuse_benchmark(size=size, threads=threads)
    rounds: dict[str, dict[str, Any]] = {}
    for fm_layers, label in ((0, "reference_fm"), (2, "fm_2_layers")):
        for reuse_history in (False, True):
            name = f"{label}_{'reuse' if reuse_history else 'per_pair'}"
            rounds[name] = run_round_benchmark(
                size=size,
                threads=threads,
                online=online,
                fm_layers=fm_layers,
                fm_dim=64 if fm_layers == 0 else 128,
                reuse_history=reuse_history,
                models=models if fm_layers == 0 else None,
            )
    # The write overlap against its baseline, the same round with each batch written before the
    # next is computed: interleaved repetitions, medians (one pair of rounds swings by 1.5x on
    # this shared machine). The writer thread competes for the GIL, so the FM's own seconds are
    # part of what is compared, through the round's wall time.
    overlap: dict[str, list[dict[str, Any]]] = {"overlap": [], "sequential": []}
    for _ in range(overlap_repeats):
        for arm in overlap:
            overlap[arm].append(
                run_round_benchmark(
                    size=size,
                    threads=threads,
                    online=online,
                    models=models,
                    overlap_writes=arm == "overlap",
                )
            )
    medians = {
        arm: {
            key: statistics.median(r[key] for r in runs)
            for key in ("non_fm_share", "round_seconds")
        }
        for arm, runs in overlap.items()
    }
    write_overlap = {
        "repeats": overlap_repeats,
        "non_fm_share": [r["non_fm_share"] for r in overlap["overlap"]],
        "non_fm_share_sequential_writes": [r["non_fm_share"] for r in overlap["sequential"]],
        "round_seconds": [r["round_seconds"] for r in overlap["overlap"]],
        "round_seconds_sequential_writes": [r["round_seconds"] for r in overlap["sequential"]],
        "round_seconds_ratio_median": round(
            medians["overlap"]["round_seconds"] / medians["sequential"]["round_seconds"], 3
        ),
    }
    return {
        "user_reuse_speedup": reuse["user_reuse_speedup"],
        "non_fm_share": round(medians["overlap"]["non_fm_share"], 4),
        "non_fm_share_sequential_writes": round(medians["sequential"]["non_fm_share"], 4),
        "write_overlap": write_overlap,
        "non_fm_share_per_pair_path": rounds["reference_fm_per_pair"]["non_fm_share"],
        "non_fm_share_fm_2_layers": rounds["fm_2_layers_reuse"]["non_fm_share"],
        "non_fm_share_fm_2_layers_per_pair_path": rounds["fm_2_layers_per_pair"]["non_fm_share"],
        "reuse": reuse,
        "rounds": rounds,
        "meta": _meta(size=size, threads=threads, online=online, trained_models=models is not None),
    }


def _meta(**extra: Any) -> dict[str, Any]:
    import feast
    import redis

    return {
        "measured_at": pd.Timestamp.now(tz="UTC").isoformat(),
        "python": platform.python_version(),
        "feast": feast.__version__,
        "redis_py": redis.__version__,
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        # Shared machine: the load says how much of the spread is neighbours, not code.
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        **extra,
    }


SUMMARY_LINES = 24
"""Figures a bench command prints when it writes its JSON to a file; the file has them all."""


def _emit(results: dict[str, Any], json_path: Path | None) -> None:
    """The results as JSON on stdout, for a pipe; with ``--json PATH``, written there instead,
    and the console gets the figures (numbers up to two levels down, ``meta`` left out) and the
    path: a person at a terminal reads a summary, not 250 lines of JSON."""
    text = json.dumps(results, indent=2, sort_keys=True)
    if json_path is None:
        typer.echo(text)
        return
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(text + "\n")
    figures = list(_figures(results))
    for name, value in figures[:SUMMARY_LINES]:
        typer.echo(f"{name}: {value:g}" if isinstance(value, float) else f"{name}: {value}")
    if len(figures) > SUMMARY_LINES:
        typer.echo(f"({len(figures) - SUMMARY_LINES} more figures in the file)")
    typer.echo(f"wrote {json_path}")


def _figures(
    results: dict[str, Any], prefix: str = "", depth: int = 2
) -> Iterator[tuple[str, Any]]:
    """Numeric leaves of ``results`` (top level first), dotted names, ``meta`` left out."""
    nested = []
    for key in sorted(results):
        value = results[key]
        if key == "meta":
            continue
        if isinstance(value, bool | int | float):
            yield f"{prefix}{key}", value
        elif isinstance(value, dict) and depth > 1:
            nested.append((key, value))
    for key, value in nested:
        yield from _figures(value, f"{prefix}{key}.", depth - 1)


@bench_app.command("serve")
def serve_command(
    json_path: JsonPathOption = None,
    redis_url: RedisUrlOption = None,
    iterations: Annotated[
        int, typer.Option(min=10, help="Timed reads per contender at N <= 100.")
    ] = 300,
    candidates: Annotated[
        str, typer.Option(help="Comma-separated candidate counts per request.")
    ] = ",".join(str(n) for n in DEFAULT_CANDIDATES),
    embedding_codec: Annotated[
        str, typer.Option(help="Codec of the stored views: float32, float16 or int8.")
    ] = "float32",
    feast_server: Annotated[
        bool, typer.Option(help="Also time the two reads through a feast serve over HTTP.")
    ] = True,
    feast_server_port: Annotated[
        int | None,
        typer.Option(help="Port of that feast serve (loopback; default: a free one)."),
    ] = None,
) -> None:
    """Resolved three-tier fetch vs Feast single-view read vs raw pipeline, p50/p99."""
    counts = tuple(int(part) for part in candidates.split(",") if part.strip())
    if not counts or min(counts) <= 0:
        raise typer.BadParameter("candidates must be positive integers, e.g. 10,100,1000")
    _emit(
        run_serve_benchmark(
            redis_url=redis_url,
            candidates=counts,
            iterations=iterations,
            with_feast_server=feast_server,
            feast_server_port=feast_server_port,
            embedding_codec=embedding_codec,
        ),
        json_path,
    )


@bench_app.command("write")
def write_command(
    json_path: JsonPathOption = None,
    redis_url: RedisUrlOption = None,
    rows: Annotated[int, typer.Option(min=100, help="Rows per timed batch.")] = 20_000,
    repeats: Annotated[int, typer.Option(min=1, help="Timed batches per contender.")] = 3,
) -> None:
    """Write path rows/s vs Feast write_to_online_store, and Redis bytes per pair embedding."""
    _emit(run_write_benchmark(redis_url=redis_url, rows=rows, repeats=repeats), json_path)


@bench_app.command("memory")
def memory_command(
    json_path: JsonPathOption = None,
    redis_url: RedisUrlOption = None,
    pairs: Annotated[int, typer.Option(min=100, help="Pair embeddings stored per codec.")] = 5000,
    ne_seeds: Annotated[
        str, typer.Option(help="Comma-separated seeds of the NE cost; empty skips it.")
    ] = "0,1,2",
    ne_dataset_size: Annotated[
        str, typer.Option(help="Synthetic preset the NE cost trains on.")
    ] = "demo",
) -> None:
    """Redis bytes per pair embedding for float32/float16/int8, and the NE cost of quantizing."""
    seeds = tuple(int(part) for part in ne_seeds.split(",") if part.strip())
    _emit(
        run_memory_benchmark(
            redis_url=redis_url, pairs=pairs, ne_seeds=seeds, ne_dataset_size=ne_dataset_size
        ),
        json_path,
    )


@bench_app.command("precompute")
def precompute_command(
    json_path: JsonPathOption = None,
    size: Annotated[str, typer.Option(help="Synthetic preset.")] = "demo",
    threads: Annotated[int, typer.Option(min=1, help="torch threads.")] = 1,
    online: Annotated[str, typer.Option(help="sqlite or redis ($REDIS_URL).")] = "sqlite",
    models: Annotated[
        Path | None, typer.Option(help="Trained models for the reference-FM rounds.")
    ] = None,
) -> None:
    """FM pairs/s with a user's history reused vs per pair, and a round's non-FM share."""
    _emit(
        run_precompute_benchmark(size=size, threads=threads, online=online, models=models),
        json_path,
    )
