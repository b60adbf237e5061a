"""The round's writes to a store at a distance: a TCP proxy in front of Redis delays every chunk
by ``--one-way-ms`` each way (a Redis that far away), and the pair writer writes a round's rows
through it in the precompute's 1,024-row batches, at each ``--transaction-rows`` x
``--in-flight`` setting (``precompute.write_transaction_rows`` and
``precompute.write_transactions_in_flight``), settings interleaved, ``--repeats`` times.

    python benchmarks/write_distance.py --one-way-ms 0,0.5,2 --transaction-rows 256 \\
        --in-flight 1,2,4 --json benchmarks/results/write_distance.json

The proxy (this file run with ``--proxy``) is its own process, asyncio, one task a direction: it
adds its own cost per chunk, so compare settings within a delay, not with the direct figures of
``solaris bench write``. Redis at ``$REDIS_URL`` (host 127.0.0.1); the run uses its own Feast
project and deletes its keys.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROWS = 16_000


async def _pipe(reader: Any, writer: Any, delay_s: float) -> None:
    queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            at, data = await queue.get()
            if data is None:
                writer.close()
                return
            if (wait := at - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    task = asyncio.create_task(deliver())
    try:
        while data := await reader.read(1 << 16):
            queue.put_nowait((time.monotonic() + delay_s, data))
    finally:
        queue.put_nowait((0.0, None))
        await task


async def _proxy(listen_port: int, target_port: int, delay_s: float) -> None:
    async def handle(client_reader: Any, client_writer: Any) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(
            _pipe(client_reader, server_writer, delay_s),
            _pipe(server_reader, client_writer, delay_s),
            return_exceptions=True,
        )

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


def _label(setting: tuple[int, int]) -> str:
    return f"{setting[0]} rows x {setting[1]} in flight"


def measure(
    one_way_ms: float, settings: list[tuple[int, int]], repeats: int, redis_port: int
) -> dict:
    """Seconds of the round's writes through a proxy ``one_way_ms`` away, per setting
    ``(rows a transaction, transactions in flight)``."""
    from solaris_feast.bench import bench_store, free_loopback_port
    from solaris_feast.pipeline.settings import DEFAULT_BATCH_SIZE
    from solaris_feast.store.write import EmbeddingWriter

    port = free_loopback_port()
    proxy = subprocess.Popen(
        [sys.executable, __file__, "--proxy", str(port), str(redis_port), str(one_way_ms)]
    )
    rng = np.random.default_rng(0)
    seconds: dict[tuple[int, int], list[float]] = {setting: [] for setting in settings}
    try:
        time.sleep(1.0)
        with bench_store(f"redis://127.0.0.1:{port}/0", 32) as store:
            offset = 0
            for _ in range(repeats):
                for setting in settings:
                    ids = np.arange(offset, offset + ROWS, dtype=np.int64)
                    offset += ROWS
                    frame = pd.DataFrame(
                        {
                            "user_id": ids // 16,
                            "item_id": ids,
                            "embedding": list(rng.standard_normal((ROWS, 32)).astype(np.float32)),
                            "model_version": "bench-v1",
                            "computed_at": pd.Timestamp.now(tz="UTC").floor("s"),
                        }
                    )
                    transaction_rows, in_flight = setting
                    writer = EmbeddingWriter(
                        store,
                        "solaris_pair",
                        offline=False,
                        atomic_rows=transaction_rows,
                        in_flight=in_flight,
                    )
                    started = time.perf_counter()
                    # One write per FM batch, as the precompute writes.
                    for lo in range(0, ROWS, DEFAULT_BATCH_SIZE):
                        batch = frame.iloc[lo : lo + DEFAULT_BATCH_SIZE].reset_index(drop=True)
                        writer.write(batch)
                    seconds[setting].append(time.perf_counter() - started)
                    writer.close()
    finally:
        proxy.terminate()
    return {
        "one_way_ms": one_way_ms,
        "by_setting": {
            _label(setting): {
                "transaction_rows": setting[0],
                "in_flight": setting[1],
                "rows_per_s": round(ROWS / statistics.median(s), 1),
                "seconds": [round(x, 4) for x in s],
            }
            for setting, s in seconds.items()
        },
    }


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--proxy":
        asyncio.run(_proxy(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]) / 1000.0))
        return
    from solaris_feast.console import parse_script_args
    from solaris_feast.store.layout import DEFAULT_TRANSACTIONS_IN_FLIGHT

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--one-way-ms", default="0,0.5", help="comma list of delays")
    parser.add_argument("--transaction-rows", default="256,1024", help="comma list")
    parser.add_argument(
        "--in-flight", default=str(DEFAULT_TRANSACTIONS_IN_FLIGHT), help="comma list"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/write_distance.json"))
    args = parse_script_args(parser)
    import redis

    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    redis_port = int(redis.Redis.from_url(redis_url).connection_pool.connection_kwargs["port"])
    settings = [
        (int(rows), int(in_flight))
        for rows in args.transaction_rows.split(",")
        for in_flight in args.in_flight.split(",")
    ]
    runs = []
    for delay in [float(v) for v in args.one_way_ms.split(",")]:
        print(f"one-way delay {delay} ms: {args.repeats} x {settings}", flush=True)
        runs.append(measure(delay, settings, args.repeats, redis_port))
    result = {
        "meta": {
            "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
            "load_average_end": os.getloadavg()[0],
            "rows": ROWS,
            "repeats": args.repeats,
        },
        "runs": runs,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print("| one-way delay | " + " | ".join(_label(s) for s in settings) + " |")
    print("| --- |" + " --- |" * len(settings))
    for run in runs:
        cells = [f"{run['by_setting'][_label(s)]['rows_per_s']:,.0f} rows/s" for s in settings]
        print(f"| {run['one_way_ms']} ms | " + " | ".join(cells) + " |")
    print(f"JSON: {args.json}")


if __name__ == "__main__":
    main()
