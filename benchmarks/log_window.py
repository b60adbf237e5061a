"""What a precompute round reads of a parquet log: its window against the whole file.

    python benchmarks/log_window.py --out /tmp/log-window [--size large] [--window-hours 24]

Writes the synthetic preset as one parquet file (row groups of 100k rows, sorted by time, as a
log appended in time order is) and as day partitions, then reads, each in a fresh process so
peak memory is its own: the whole file with pandas, and a round's window through
:func:`solaris_feast.data.log_source.read_log_window` (plain file; day partitions). Prints one
JSON line per read: rows, seconds, peak RSS (``ru_maxrss``) and arrow's peak pool bytes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

READ = r"""
import json, resource, sys, time
from datetime import timedelta
import pandas as pd, pyarrow as pa
mode, path, end, hours = sys.argv[1], sys.argv[2], pd.Timestamp(sys.argv[3]), float(sys.argv[4])
from solaris_feast.data.log_source import InteractionLogConfig, read_log_window
started = time.perf_counter()
if mode == "imports":  # the baseline: the same imports, nothing read
    rows = 0
elif mode == "whole":
    rows = len(pd.read_parquet(path))
else:
    config = InteractionLogConfig(
        path=path, columns={"labels": ["click"]}, history_seconds=int(hours * 3600),
        partition_column="day" if mode == "window_partitioned" else "",
    )
    data = read_log_window(config, (end - timedelta(hours=hours)).to_pydatetime(), end)
    rows = int(data.metadata["rows_read"])
seconds = time.perf_counter() - started
print(json.dumps({
    "read": mode, "rows": rows, "seconds": round(seconds, 2),
    "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    "arrow_peak_mib": round(pa.default_memory_pool().max_memory() / 2**20),
}))
"""


WRITE = r"""
import json, sys
from pathlib import Path
import pandas as pd, pyarrow as pa, pyarrow.parquet as pq
from solaris_feast.data.datasets import load_dataset
size, single, parts = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
log = load_dataset("synthetic", size).interactions
end = log["event_timestamp"].max() + pd.Timedelta(seconds=1)
if not single.is_file():
    pq.write_table(pa.Table.from_pandas(log, preserve_index=False), single, row_group_size=100_000)
    for day, part in log.groupby(log["event_timestamp"].dt.strftime("%Y-%m-%d")):
        folder = parts / f"day={day}"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pandas(part, preserve_index=False), folder / "part-0.parquet")
print(json.dumps({"size": size, "rows": len(log), "end": end.isoformat(),
                  "file_mib": round(single.stat().st_size / 2**20, 1)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", default="large")
    parser.add_argument("--window-hours", type=float, default=24.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    single = args.out / "log.parquet"
    parts = args.out / "log_by_day"
    # Written in a child process: Linux carries a process's peak RSS across fork and exec, so
    # the readers must be started by a parent that never held the log.
    proc = subprocess.run(
        [sys.executable, "-c", WRITE, args.size, str(single), str(parts)],
        capture_output=True,
        text=True,
        check=True,
    )
    print(proc.stdout.strip())
    end = json.loads(proc.stdout)["end"]
    for mode, path in (
        ("imports", single),
        ("whole", single),
        ("window", single),
        ("window_partitioned", parts),
    ):
        proc = subprocess.run(
            [sys.executable, "-c", READ, mode, str(path), end, str(args.window_hours)],
            capture_output=True,
            text=True,
            check=True,
        )
        print(proc.stdout.strip())


if __name__ == "__main__":
    main()
