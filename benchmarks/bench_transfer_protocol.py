"""The transfer protocol on one data set, sized to fit a shared 2-core machine.

``solaris evaluate transfer --dataset D --seeds N --base-seed S --json PATH`` runs the same
protocol with the default model sizes; this script shrinks the epochs and history, and runs
the first evaluation (kept for its keys) on one seed with one coverage, so the protocol's
splits x seeds finish in minutes.

    python benchmarks/bench_transfer_protocol.py synthetic --size demo --seeds 5 \\
        --json benchmarks/results/transfer_protocol_synthetic.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from solaris_feast.console import parse_script_args
from solaris_feast.data.datasets import load_dataset
from solaris_feast.evaluation.transfer import TransferConfig, evaluate_transfer
from solaris_feast.evaluation.transfer_protocol import ProtocolConfig, run_protocol
from solaris_feast.evaluation.transfer_report import format_protocol_table, format_transfer_table
from solaris_feast.models.training import TrainConfig


def bench_models(history_len: int, fm_epochs: int, vm_epochs: int) -> TransferConfig:
    """The protocol benchmarks' model sizes (smaller than the CLI's, for a shared 2-core box)."""
    return TransferConfig(
        history_len=history_len,
        fm_training=TrainConfig(epochs=fm_epochs, batch_size=256, learning_rate=2e-3),
        compressor_training=TrainConfig(epochs=1, batch_size=512, learning_rate=1e-3),
        vm_training=TrainConfig(epochs=vm_epochs, batch_size=256, learning_rate=3e-3),
        coverages=(1.0,),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset", choices=("synthetic", "movielens"))
    parser.add_argument("--size", default="demo")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--base-seed", type=int, default=0)
    parser.add_argument("--fm-epochs", type=int, default=2)
    parser.add_argument("--vm-epochs", type=int, default=2)
    parser.add_argument("--history-len", type=int, default=16)
    parser.add_argument(
        "--splits",
        default=",".join(str(e) for e in ProtocolConfig().train_ends),
        help="train ends of the forward-chaining splits, comma-separated shares of the span",
    )
    parser.add_argument(
        "--protocol-only",
        action="store_true",
        help="skip the first evaluation (its keys, an upper bound); write the protocol alone",
    )
    parser.add_argument("--json", type=Path, required=True)
    args = parse_script_args(parser)
    models = bench_models(args.history_len, args.fm_epochs, args.vm_epochs)
    data = load_dataset(args.dataset, args.size)
    started = time.perf_counter()
    seeds = list(range(args.base_seed, args.base_seed + args.seeds))
    # The first evaluation (kept for its keys, an upper bound) on the first seed only: the
    # protocol is what is measured, over every seed.
    protocol = ProtocolConfig(train_ends=tuple(float(e) for e in args.splits.split(",")))
    if args.protocol_only:
        run = run_protocol(data, seeds, models, protocol)
        record: dict[str, object] = {
            "dataset": data.name,
            "protocol": run["protocol"],
            "protocol_details": run["details"],
        }
    else:
        report = evaluate_transfer(data, seeds=seeds[:1], config=models)
        report.protocol = run_protocol(data, seeds, models, protocol)
        record = report.to_json()
    record["bench"] = {
        "size": args.size if args.dataset == "synthetic" else data.name,
        "rows": len(data.interactions),
        "fm_epochs": args.fm_epochs,
        "vm_epochs": args.vm_epochs,
        "history_len": args.history_len,
        "seconds": round(time.perf_counter() - started, 1),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2))
    if args.protocol_only:
        print(format_protocol_table(run["protocol"], run["details"]))  # type: ignore[arg-type]
    else:
        print(format_transfer_table(record))


if __name__ == "__main__":
    main()
