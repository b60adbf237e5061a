"""The transfer protocol on the world of structure a counter cannot hold, with its ablation.

Issue 14, item 5: :data:`~solaris_feast.data.synthetic.SURFACES_WORLD` plants sequential
item-to-item patterns and spreads sessions over three surfaces; the FM trains on every surface,
the VM trains, reads its counters and is tested on surface 0 only. Each world of
:data:`~solaris_feast.data.synthetic.STRUCTURE_ABLATIONS` runs the same protocol (splits x
seeds, the model sizes of ``bench_transfer_protocol.py``'s synthetic run), so the table says which
structure carries the FM's advantage. Arms ending in ``_fm_own_surface`` run a world with every
FM's history reading the row's own surface only (``ProtocolConfig.fm_history``): the same
training rows, without the other surfaces' engagement in the FM's inputs. The arm
``both_fm_rows_own_tier`` trains the served VMs with a tier of their own on the previous-window
FM's rows (``ProtocolConfig.fm_rows``), so the served tiers no longer mark "after the cut". The
arm ``both_fm_inputs_round`` trains the FM that serves ``z`` on inputs as of the hourly round
(``ProtocolConfig.fm_inputs``), as it is served. The JSON is rewritten after every arm.

Data and protocol come from the same calls as ``solaris evaluate transfer --dataset synthetic
--size tiny --world W [--fm-history own_surface]`` (``load_dataset`` and ``protocol_for``); this
script shrinks the model sizes as ``bench_transfer_protocol.py`` does.

    python benchmarks/bench_transfer_surfaces.py --seeds 5 \\
        --json benchmarks/results/transfer_protocol_surfaces.json

``--size`` runs the same structures on a larger preset (``demo``: 5.7x the rows, for narrower
intervals) and ``--staleness`` adds round intervals to ``tr_by_staleness``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from bench_transfer_protocol import bench_models

from solaris_feast.console import parse_script_args
from solaris_feast.data.datasets import SYNTHETIC_PRESETS, load_dataset
from solaris_feast.data.synthetic import SURFACE, WORLD_STRUCTURES
from solaris_feast.evaluation.transfer import evaluate_transfer
from solaris_feast.evaluation.transfer_protocol import (
    FmHistory,
    FmInputs,
    ProtocolConfig,
    protocol_for,
    run_protocol_pooled,
)
from solaris_feast.evaluation.transfer_report import format_protocol_table
from solaris_feast.tiers import FmRowsTier

MAIN_WORLD = "both"
SIZE = "tiny"
"""The preset the published table runs (the size :data:`SURFACES_WORLD` is set at); ``--size``
runs the same structures on a larger preset, for intervals a larger log can narrow."""
ARMS: dict[str, tuple[str, FmHistory, FmRowsTier, FmInputs]] = {
    **{world: (world, "all_surfaces", "zero", "request") for world in WORLD_STRUCTURES},
    "surfaces_fm_own_surface": ("surfaces", "own_surface", "zero", "request"),
    "both_fm_own_surface": ("both", "own_surface", "zero", "request"),
    "both_fm_rows_own_tier": ("both", "all_surfaces", "own_tier", "request"),
    "both_fm_inputs_round": ("both", "all_surfaces", "zero", "round"),
}
"""Arm name -> (world, FM history, the served VMs' tier on the previous-window FM's rows, the
inputs the serving FM trains on)."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worlds", default="both,sequential,surfaces", help=f"of {list(ARMS)}")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--base-seed", type=int, default=0)
    parser.add_argument("--fm-epochs", type=int, default=3)
    parser.add_argument("--vm-epochs", type=int, default=2)
    parser.add_argument("--history-len", type=int, default=8)
    parser.add_argument(
        "--size", default=SIZE, choices=sorted(SYNTHETIC_PRESETS), help="synthetic preset"
    )
    parser.add_argument(
        "--data-seed",
        type=int,
        default=0,
        help="seed of the synthetic world itself (--seeds vary the models and the bootstrap)",
    )
    parser.add_argument(
        "--data-seeds",
        type=int,
        default=1,
        help="pool this many worlds, drawn with seeds --data-seed onwards, into each arm's one "
        "figure (its interval covers users within the worlds, not the spread between them; "
        "per_world beside it)",
    )
    parser.add_argument(
        "--staleness",
        default=",".join(str(s) for s in ProtocolConfig().staleness_seconds),
        help="round intervals in seconds of tr_by_staleness, comma-separated (0: z at the "
        "request, the upper bound); the served TR stays at the hourly round",
    )
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the worlds --json already holds (run with the same settings), run the rest",
    )
    args = parse_script_args(parser)
    models = bench_models(args.history_len, args.fm_epochs, args.vm_epochs)
    seeds = list(range(args.base_seed, args.base_seed + args.seeds))
    worlds = args.worlds.split(",")
    unknown = set(worlds) - set(ARMS)
    if unknown:
        raise SystemExit(f"unknown arms {sorted(unknown)}; choose from {list(ARMS)}")
    if MAIN_WORLD not in worlds:
        raise SystemExit(f"--worlds must include {MAIN_WORLD!r}, the world the keys describe")
    record: dict[str, object] = {}
    ablation: dict[str, object] = {}
    staleness = tuple(int(s) for s in args.staleness.split(","))
    data_seeds = list(range(args.data_seed, args.data_seed + args.data_seeds))
    settings = {
        "fm_epochs": args.fm_epochs,
        "vm_epochs": args.vm_epochs,
        "history_len": args.history_len,
        "size": args.size,
        "data_seed": args.data_seed,
        "data_seeds": data_seeds,
        "staleness_seconds": list(staleness),
    }
    spent = 0.0
    if args.resume and args.json.exists():
        done: dict[str, Any] = json.loads(args.json.read_text())
        bench = done["bench"]
        ran_seeds = done["protocol_details"]["seeds"]
        # Runs from before --data-seeds drew the one world --data-seed names.
        ran = {**bench, "data_seeds": bench.get("data_seeds", [bench.get("data_seed")])}
        if {k: ran.get(k) for k in settings} != settings or ran_seeds != seeds:
            raise SystemExit(f"{args.json} was run with other settings: {bench}, {ran_seeds}")
        record, ablation = done, done["ablation"]
        spent = float(bench["seconds"])
    started = time.perf_counter()
    for name in [MAIN_WORLD, *(w for w in worlds if w != MAIN_WORLD)]:
        if name in ablation:
            continue
        world, fm_history, fm_rows, fm_inputs = ARMS[name]
        drawn = {
            f"data_seed={s}": load_dataset("synthetic", args.size, seed=s, world=world)
            for s in data_seeds
        }
        data = next(iter(drawn.values()))
        protocol = protocol_for(
            data,
            fm_history,
            base=ProtocolConfig(staleness_seconds=staleness),
            fm_rows=fm_rows,
            fm_inputs=fm_inputs,
        )
        t0 = time.perf_counter()
        if name == MAIN_WORLD:
            # The first evaluation (its keys; one seed, every surface as one) as the protocol
            # runner keeps it; the protocol is what is measured.
            report = evaluate_transfer(data, seeds=seeds[:1], config=models)
            report.protocol = run_protocol_pooled(drawn, seeds, models, protocol)
            record = report.to_json()
            result = {
                "protocol": record["protocol"],
                "protocol_details": record["protocol_details"],
            }
        else:
            run = run_protocol_pooled(drawn, seeds, models, protocol)
            result = {"protocol": run["protocol"], "protocol_details": run["details"]}
        surface = protocol.vm_surface
        logs = [d.interactions for d in drawn.values()]
        rows = sum(len(log) for log in logs)
        vm_rows = sum(
            len(log) if surface is None else int((log[SURFACE] == surface).sum()) for log in logs
        )
        ablation[name] = {
            "config": SYNTHETIC_PRESETS[args.size]
            .model_copy(update={**WORLD_STRUCTURES[world], "seed": args.data_seed})
            .model_dump(),
            "world": world,
            "fm_history": fm_history,
            "fm_rows": fm_rows,
            "fm_inputs": fm_inputs,
            "rows": rows,
            "vm_rows": vm_rows,
            "seconds": round(time.perf_counter() - t0, 1),
            **result,
        }
        print(f"{name}: {rows} rows ({vm_rows} on the VM's surface) in {len(drawn)} world(s)")
        print(format_protocol_table(result["protocol"], result["protocol_details"]))  # type: ignore[arg-type]
        record["ablation"] = ablation
        record["bench"] = {
            "world": MAIN_WORLD,
            "vm_surface": ablation[MAIN_WORLD]["protocol_details"]["vm_surface"],  # type: ignore[index]
            "rows": ablation[MAIN_WORLD]["rows"],  # type: ignore[index]
            **settings,
            "seconds": round(spent + time.perf_counter() - started, 1),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
