"""Concurrency: serving while a precompute rewrites the same keys never returns a torn row.

A writer thread rewrites the same 40 pairs generation after generation. Generation ``g`` stores
the vector ``full(D, g)``, ``computed_at = base + g seconds`` and the model version ``A`` when
``g`` is even, ``B`` when odd. Readers expecting version ``A`` must only ever see constant
vectors (not parts of two writes) with an even ``g`` (never B's vector under A's version), whose
``computed_at`` belongs to the same generation as the vector.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_hardening_support import DIM, pair_frame

from solaris_feast.serving.retriever import SolarisRetriever
from solaris_feast.store.config import open_store
from solaris_feast.store.definitions import solaris_definitions
from solaris_feast.store.write import EmbeddingWriter
from solaris_feast.tiers import Tier

VERSION_A = "cmp-concurrency-a"
VERSION_B = "cmp-concurrency-b"
RUN_SECONDS = 2.0
ITEMS = np.arange(500, 540, dtype=np.int64)
USER = 11


@pytest.mark.parametrize("online", ["redis", "sqlite"])
def test_serving_during_rewrites_never_sees_torn_rows_or_another_version(
    online: str, tmp_path: Path, feast_project: str, redis_url: str
) -> None:
    store = open_store(feast_project, tmp_path, online=online, redis_url=redis_url)  # type: ignore[arg-type]
    store.apply(solaris_definitions().all())
    base = pd.Timestamp.now(tz="UTC").floor("s") - pd.Timedelta(hours=3)
    stop = threading.Event()
    written = [0]
    problems: list[str] = []
    served_exact = [0]
    fetches = [0]
    errors = [0]

    def write_generations() -> None:
        writer = EmbeddingWriter(store, "solaris_pair", offline=False, chunk_rows=16)
        generation = 0
        try:
            while not stop.is_set() and generation < 5000:
                version = VERSION_A if generation % 2 == 0 else VERSION_B
                vectors = np.full((len(ITEMS), DIM), generation, dtype=np.float32)
                writer.write(
                    pair_frame(
                        USER,
                        ITEMS,
                        vectors,
                        version=version,
                        computed_at=base + pd.Timedelta(seconds=generation),
                    )
                )
                written[0] = generation
                generation += 1
        except Exception as exc:  # reported below; a thread must not die silently
            problems.append(f"writer: {exc!r}")
        finally:
            writer.close()

    def serve() -> None:
        retriever = SolarisRetriever(store, VERSION_A, deadline_ms=2000, record_misses=False)
        try:
            while not stop.is_set():
                result = retriever.fetch(USER, ITEMS)
                now = time.time()
                fetches[0] += 1
                if result.error:
                    errors[0] += 1
                    continue
                exact = result.tiers == Tier.EXACT
                served_exact[0] += int(exact.sum())
                for row, age in zip(
                    result.embeddings[exact], result.age_seconds[exact], strict=True
                ):
                    generation = row[0]
                    if not (row == generation).all():
                        problems.append(f"torn vector: {np.unique(row)[:4]}")
                    elif generation % 2 != 0:
                        problems.append(f"version B vector {generation} served as version A")
                    else:
                        stamped = round(now - age - base.timestamp())
                        if stamped != int(generation):
                            problems.append(
                                f"computed_at of generation {stamped} beside vector {generation}"
                            )
                if (result.tiers[~exact] != Tier.ZERO).any():
                    problems.append("a non-exact tier appeared with only the pair view written")
        except Exception as exc:
            problems.append(f"reader: {exc!r}")
        finally:
            retriever.close()

    threads = [threading.Thread(target=write_generations)] + [
        threading.Thread(target=serve) for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    time.sleep(RUN_SECONDS)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)

    assert not problems, problems[:5]
    assert written[0] >= 4, "the writer hardly ran; the test proved nothing"
    assert fetches[0] >= 10 and served_exact[0] > 0
    # Redis serves through every write; SQLite may lock a reader out past its deadline, which
    # must then be flagged, never a silent wrong answer.
    if online == "redis":
        assert errors[0] == 0
    assert errors[0] < fetches[0]


def test_a_reader_snapshot_never_sees_part_of_a_batch(
    tmp_path: Path, feast_project: str, redis_url: str
) -> None:
    """A reader that reads every key of a batch in one MULTI/EXEC sees the whole batch of one
    generation, never some keys from the new batch and the rest from the old one, for a batch
    of up to the writer's ``atomic_rows`` (a bigger one is stored in such transactions)."""
    import redis

    from solaris_feast.store.layout import EntityKeyLayout, FloatListCodec, online_field

    store = open_store(feast_project, tmp_path, online="redis", redis_url=redis_url)
    store.apply(solaris_definitions().all())
    items = np.arange(600, dtype=np.int64)
    layout = EntityKeyLayout(["user_id", "item_id"], 3)
    keys = [layout.key(USER, int(item)) + feast_project.encode() for item in items]
    field = online_field("solaris_pair", "embedding")
    codec = FloatListCodec(DIM)
    base = pd.Timestamp.now(tz="UTC").floor("s") - pd.Timedelta(hours=1)
    stop = threading.Event()
    problems: list[str] = []
    snapshots = [0]

    def write_generations() -> None:
        # Small chunks: many scripts per batch, so a non-atomic batch would show its seams.
        writer = EmbeddingWriter(
            store, "solaris_pair", offline=False, chunk_rows=32, atomic_rows=len(items)
        )
        try:
            for generation in range(1, 10_000):
                if stop.is_set():
                    break
                vectors = np.full((len(items), DIM), generation, dtype=np.float32)
                at = base + pd.Timedelta(seconds=generation)
                writer.write(pair_frame(USER, items, vectors, computed_at=at))
        except Exception as exc:
            problems.append(f"writer: {exc!r}")
        finally:
            writer.close()

    def read_snapshots() -> None:
        client = redis.Redis.from_url(redis_url)
        try:
            while not stop.is_set():
                with client.pipeline(transaction=True) as pipe:
                    for key in keys:
                        pipe.hget(key, field)
                    values = pipe.execute()
                generations = {
                    -1 if value is None else int(codec.decode(value)[0]) for value in values
                }
                snapshots[0] += 1
                if len(generations) > 1:
                    problems.append(f"one snapshot holds generations {sorted(generations)[:6]}")
        except Exception as exc:
            problems.append(f"reader: {exc!r}")
        finally:
            client.close()

    threads = [threading.Thread(target=write_generations), threading.Thread(target=read_snapshots)]
    for thread in threads:
        thread.start()
    time.sleep(RUN_SECONDS)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert not problems, problems[:5]
    assert snapshots[0] >= 5


def test_a_step_file_written_once_keeps_the_first_writer_of_a_race(tmp_path: Path) -> None:
    """Two processes of one round saving the same step: the second gets False and the file
    holds the first one's rows (before, the second silently replaced them: a double-triggered
    round planned from one drain and acknowledged the other)."""
    import pandas as pd

    from solaris_feast.pipeline.runs import write_parquet_once

    path = tmp_path / "misses.parquet"
    first = pd.DataFrame({"user_id": [1, 2], "item_id": [3, 4]})
    assert write_parquet_once(first, path)
    assert not write_parquet_once(pd.DataFrame({"user_id": [9], "item_id": [9]}), path)
    pd.testing.assert_frame_equal(pd.read_parquet(path), first)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["misses.parquet"]  # no temp left
