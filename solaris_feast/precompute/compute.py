"""The precompute worker: planned pairs -> FM representation -> compressor -> the write path.

One call handles one shard of a plan (see :func:`solaris_feast.precompute.plan.shard`), so many
workers can
share a run. Every pair is featurized as of the plan's ``planned_at`` (history strictly before
it) and stored with ``computed_at = planned_at``: a retried shard writes the same rows, which the
writer's newest-wins rule and content-hashed offline files make idempotent.

A shard's pairs are batched in user order, so a user's planned items share a batch and an FM
that encodes a user's history once per call (the reference FM does, see
:class:`~solaris_feast.models.interface.ReferenceEncoder`) reuses it across them.

Batches run under ``torch.inference_mode()`` with the models in ``eval()``. A batch's write runs
on one writer thread while the next batch is computed (the FM's kernels and the store's socket
waits release the GIL, so on two cores the two overlap), with at most one write in flight: the
store sees the batches in order and a failed write stops the run at the next batch. The stats
split the wall time into featurizing, FM + compressor forward and the time the loop waited for
the writer, so the share of non-FM work is visible (issue target: at most 25 % of a run).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import pandas as pd

from solaris_feast.data.schema import ITEM_ID, USER_ID
from solaris_feast.keys import id_array
from solaris_feast.pipeline.settings import DEFAULT_BATCH_SIZE
from solaris_feast.precompute.aggregate import EMBEDDING
from solaris_feast.precompute.plan import COMPUTED_AT, MODEL_VERSION, Plan

if TYPE_CHECKING:
    from solaris_feast.data.schema import InteractionDataset
    from solaris_feast.models.interface import ChainModels, PairsAsOf


logger = logging.getLogger(__name__)


class EmbeddingSink(Protocol):
    """Where computed rows go: :class:`solaris_feast.store.write.EmbeddingWriter` or an in-memory
    collector with the same ``write(frame)`` method."""

    def write(self, frame: pd.DataFrame) -> Any: ...


@runtime_checkable
class StagedSink(Protocol):
    """A sink whose ``write`` is ``write_online(write_offline(frame))``, as
    :class:`~solaris_feast.store.write.EmbeddingWriter`'s is: the first half checks, writes the
    offline log and encodes, the second sends to the online store."""

    def write(self, frame: pd.DataFrame) -> Any: ...

    def write_offline(self, frame: pd.DataFrame) -> Any: ...

    def write_online(self, staged: Any) -> Any: ...


class OrderedWrites:
    """A sink's writes on one worker thread while the caller computes the next frame: one write
    in flight, in submission order, so a sink's ``write`` is only ever called from one thread at
    a time (with ``offline_on_caller``, each of its two halves is).

    :meth:`submit` first waits for the write in flight and raises its error, so a failed write
    stops the caller before anything later is written; :meth:`finish` waits for the last one.
    Leaving the ``with`` block never returns while a write still runs. ``overlap=False`` writes
    on the calling thread (the baseline the benchmarks compare with).

    ``offline_on_caller`` (a :class:`StagedSink` only): the calling thread runs each frame's
    ``write_offline`` (checks, the offline log, encoding) while the write before it is still in
    flight online, and the worker runs only ``write_online``. For a caller that waits on its
    writes more than it computes (the similarity fill: its 13k rows' round trip to Redis is
    longer than computing them), the encoding then overlaps the store's own time instead of
    adding to it; a caller whose compute is the longer (the FM) keeps it off its own thread.
    A failed online write then leaves the next frame in the offline log but not online (it is
    not sent; the log is append-only and content-named, so a retry finds the same file).
    """

    def __init__(
        self, sink: EmbeddingSink, *, overlap: bool = True, offline_on_caller: bool = False
    ) -> None:
        self.sink = sink
        self._staged = (
            sink if overlap and offline_on_caller and isinstance(sink, StagedSink) else None
        )
        self.answers: list[Any] = []
        self._worker_seconds = 0.0  # added to by the worker thread only
        self._caller_seconds = 0.0  # by the calling thread only (write_offline)
        self.wait_seconds = 0.0
        """Seconds the caller waited for them (all of ``busy_seconds`` without overlap)."""
        # One worker thread: writes reach the sink one at a time and in order.
        self._pool = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="solaris-write")
            if overlap
            else None
        )
        self._in_flight: Future[None] | None = None

    def __enter__(self) -> OrderedWrites:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def submit(self, frame: pd.DataFrame) -> None:
        t0 = time.perf_counter()
        if self._staged is not None:
            staged = self._staged.write_offline(frame)
            self._caller_seconds += time.perf_counter() - t0
            self._wait()
            self._in_flight = self._submit(self._staged.write_online, staged)
        else:
            self._wait()
            if self._pool is None:
                self._write(self.sink.write, frame)
            else:
                self._in_flight = self._submit(self.sink.write, frame)
        self.wait_seconds += time.perf_counter() - t0

    @property
    def busy_seconds(self) -> float:
        """Seconds the sink's writes took (both halves of a staged write)."""
        return self._worker_seconds + self._caller_seconds

    def finish(self) -> list[Any]:
        """Wait for the last write; the sink's answers in submission order."""
        t0 = time.perf_counter()
        self._wait()
        self.wait_seconds += time.perf_counter() - t0
        return self.answers

    def _wait(self) -> None:
        if self._in_flight is not None:
            in_flight, self._in_flight = self._in_flight, None
            in_flight.result()  # the previous write is stored, or its error is raised here

    def _submit(self, write: Callable[[Any], Any], arg: Any) -> Future[None]:
        assert self._pool is not None
        return self._pool.submit(self._write, write, arg)

    def _write(self, write: Callable[[Any], Any], arg: Any) -> None:
        t0 = time.perf_counter()
        self.answers.append(write(arg))
        self._worker_seconds += time.perf_counter() - t0


@dataclass(frozen=True)
class PrecomputeStats:
    """What one :func:`run_precompute` call did and where its time went.

    Attributes:
        pairs: Pairs computed and written.
        batches: Batches run.
        model_version: The embedding version written (the compressor card's version).
        wall_seconds: Wall time of the whole call.
        featurize_seconds: Building model inputs (history lookups).
        fm_seconds: FM representation plus compressor forward passes.
        write_seconds: Building the row frames and the sink's ``write`` calls (the writer
            thread's busy time; it overlaps the FM work of the next batch).
        write_wait_seconds: The part of ``write_seconds`` the loop waited for: what the writes
            add to the wall time (all of ``write_seconds`` when writes do not overlap).
    """

    pairs: int
    batches: int
    model_version: str
    wall_seconds: float
    featurize_seconds: float
    fm_seconds: float
    write_seconds: float
    write_wait_seconds: float

    @property
    def pairs_per_second(self) -> float:
        return self.pairs / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def non_fm_share(self) -> float:
        """Share of wall time not spent in the FM and compressor forward passes."""
        if self.wall_seconds <= 0:
            return 0.0
        return max(0.0, 1.0 - self.fm_seconds / self.wall_seconds)

    def as_dict(self) -> dict[str, object]:
        return {
            "pairs": self.pairs,
            "batches": self.batches,
            MODEL_VERSION: self.model_version,
            "wall_seconds": round(self.wall_seconds, 4),
            "featurize_seconds": round(self.featurize_seconds, 4),
            "fm_seconds": round(self.fm_seconds, 4),
            "write_seconds": round(self.write_seconds, 4),
            "write_wait_seconds": round(self.write_wait_seconds, 4),
            "pairs_per_second": round(self.pairs_per_second, 1),
            "non_fm_share": round(self.non_fm_share, 4),
        }


def compute_pair_embeddings(
    chain: ChainModels,
    pairs: PairsAsOf,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> tuple[np.ndarray, float, float]:
    """``z(u, i)`` ``(N, d)`` float32 for ``pairs``, through the chain's FM encoder (checked
    :func:`~solaris_feast.models.interface.checked_representation`) and its compressor, in
    batches.

    Returns the vectors, the featurizing seconds (the reference FM's input building; 0 for an FM
    of the deployment's own, whose whole call counts as FM time) and the FM + compressor seconds.
    """
    import torch

    from solaris_feast.models.interface import describe, encode_in_chunks

    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    out = np.zeros((len(pairs), chain.code_dim), dtype=np.float32)
    featurized_before = getattr(chain.encoder, "featurize_seconds", 0.0)
    started = time.perf_counter()
    chain.compressor.eval()
    where = describe(chain.fm_card)
    with torch.inference_mode():
        for lo in range(0, len(pairs), batch_size):
            hi = min(lo + batch_size, len(pairs))
            h = encode_in_chunks(chain.encoder, pairs.part(lo, hi), where, chunk=hi - lo)
            out[lo:hi] = chain.compressor.encode(torch.from_numpy(h)).numpy()
    featurize_s = getattr(chain.encoder, "featurize_seconds", 0.0) - featurized_before
    return out, featurize_s, time.perf_counter() - started - featurize_s


def run_precompute(
    plan_shard: Plan,
    chain: ChainModels,
    log: InteractionDataset,
    writer: EmbeddingSink,
    batch_size: int = DEFAULT_BATCH_SIZE,
    *,
    overlap_writes: bool = True,
) -> PrecomputeStats:
    """Compute and write ``z(u, i)`` for every pair of ``plan_shard``.

    Args:
        plan_shard: A plan or one shard of it; pairs are computed as of its ``planned_at``.
        chain: FM encoder and compressor (:class:`~solaris_feast.models.interface.ChainModels`);
            ``chain.embedding_version`` is the stored version.
        log: The log window whose events before ``planned_at`` are the pairs' history.
        writer: The pair view's writer (or any :class:`EmbeddingSink`); one ``write`` per batch,
            in batch order, so a failure loses at most the batch being written and the one being
            computed, and a retry rewrites the same rows.
        batch_size: Pairs per forward pass and per write.
        overlap_writes: Write each batch on a writer thread while the next one is computed
            (``False``: compute, write, compute, ... on the calling thread). The sink is only
            ever called from one thread at a time.

    Returns:
        :class:`PrecomputeStats` with pairs/s and the split of wall time.

    Raises:
        Whatever the sink's ``write`` raises, after the write before it finished; no later
        batch is written.
    """
    from solaris_feast.models.interface import PairsAsOf

    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    started = time.perf_counter()
    at = pd.Timestamp(plan_shard.planned_at)
    if at.tzinfo is None:
        raise ValueError(f"plan's planned_at must be timezone-aware, got {at}")
    users, items = id_array(plan_shard.pairs[USER_ID]), id_array(plan_shard.pairs[ITEM_ID])
    # User order (stable: each user's items keep the plan's order), so a user's planned items
    # share a batch and its history is encoded once.
    order = np.argsort(users, kind="stable")
    users, items = users[order], items[order]
    pairs = PairsAsOf.of(users, items, at, log)
    version = chain.embedding_version
    computed_at = at.tz_convert("UTC")
    featurize_s = fm_s = 0.0
    batches = 0
    with OrderedWrites(writer, overlap=overlap_writes) as writes:
        for lo in range(0, len(users), batch_size):
            hi = min(lo + batch_size, len(users))
            z, batch_featurize_s, batch_fm_s = compute_pair_embeddings(
                chain, pairs.part(lo, hi), batch_size=hi - lo
            )
            featurize_s += batch_featurize_s
            fm_s += batch_fm_s
            writes.submit(
                pd.DataFrame(
                    {
                        USER_ID: users[lo:hi],
                        ITEM_ID: items[lo:hi],
                        EMBEDDING: list(z),
                        MODEL_VERSION: version,
                        COMPUTED_AT: computed_at,
                    }
                )
            )
            batches += 1
        writes.finish()
    write_busy_s, write_wait_s = writes.busy_seconds, writes.wait_seconds
    stats = PrecomputeStats(
        pairs=len(users),
        batches=batches,
        model_version=version,
        wall_seconds=time.perf_counter() - started,
        featurize_seconds=featurize_s,
        fm_seconds=fm_s,
        write_seconds=write_busy_s,
        write_wait_seconds=write_wait_s,
    )
    logger.info(
        "precompute: %d pairs in %.2f s (%.0f pairs/s; FM %.2f s, featurize %.2f s, write %.2f s"
        " of which %.2f s not overlapped)",
        stats.pairs,
        stats.wall_seconds,
        stats.pairs_per_second,
        fm_s,
        featurize_s,
        stats.write_seconds,
        write_wait_s,
    )
    return stats


class CollectingSink:
    """An in-memory :class:`EmbeddingSink`: keeps every written frame (tests, replays)."""

    def __init__(self) -> None:
        self.frames: list[pd.DataFrame] = []

    def write(self, frame: pd.DataFrame) -> int:
        self.frames.append(frame)
        return len(frame)

    def rows(self) -> pd.DataFrame:
        """All written rows in write order."""
        if not self.frames:
            return pd.DataFrame(columns=[USER_ID, ITEM_ID, EMBEDDING, MODEL_VERSION, COMPUTED_AT])
        return pd.concat(self.frames, ignore_index=True)
