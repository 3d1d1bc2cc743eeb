#!/usr/bin/env python3
"""Where a group's step goes, per worker, in threads and in processes, by
two methods in one run (``fairseq_hybrid.harness.worker_profile``), with the
stages' wire as it is (pipes between host-memory stages) and as it was
(gloo's point-to-point); docs/bench/profile_workers_*.md.

The host-bound regime a GPU's host is in is the default: ``hybrid_lstm_tiny``
with 4 + 4 layers, where a cell's call is mostly Python and dispatch.

  python benchmarks/profile_workers.py --out docs/bench/profile_workers_host_bound.md
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import shutil
import sys
import tempfile

import torch

from fairseq_hybrid.harness.worker_profile import PROFILE_NAMES, build_shares, instrument, profile_top, render, run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None,
                        help="a binarized corpus (its dictionaries and batches); default made-up pairs and "
                        "dictionaries of 40 words")
    parser.add_argument("--arch", default="hybrid_lstm_tiny")
    parser.add_argument("--loss-chunk-rows", type=int, default=None,
                        help="--output-loss-chunk-rows (default: the criterion's)")
    parser.add_argument("--dropout", type=float, default=None, help="default: the architecture's")
    parser.add_argument("--layers", type=int, default=4, help="encoder and decoder layers each")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=1000)
    parser.add_argument("--placement", default="", help="--hybrid-placement (default: the layers split evenly)")
    parser.add_argument("--micro-batches", default="1", help="--hybrid-micro-batches")
    parser.add_argument("--chunk-length", default="0", help="--hybrid-chunk-length (0: K chunks a sequence)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", default=None, help="a Markdown report")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    folder = tempfile.mkdtemp(prefix="profile-workers-")
    instrument(folder)
    results = {}
    from fairseq_hybrid.parallel.processes import stage_processes

    pipes = stage_processes.wire_ends
    for name in ("one device", "threads", "processes", "processes, gloo wire"):
        devices = 1 if name == "one device" else args.devices
        workers = name.split(",")[0]
        # the stages' wire: pipes between host-memory stages (host_wire.py), or gloo's point-to-point
        # (parallel/processes/gpu_wire.py), which CPU stages used before
        stage_processes.wire_ends = pipes if name == "processes" else lambda context, size: [None] * size
        results[name] = run(workers, devices, args, folder)
        results[name]["profiled"] = {}
        for path in sorted(glob.glob(os.path.join(folder, "*.prof"))):
            results[name]["profiled"][os.path.basename(path)[:-5]] = profile_top(path, PROFILE_NAMES)
            os.remove(path)
        for path in glob.glob(os.path.join(folder, "stage*.json")):
            os.remove(path)
        print(f"{name}: {results[name]['tokens_per_s']:,.0f} target tokens/s", flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    builds = build_shares(args)
    report = render(results, args, builds)
    print(report)
    if args.out:
        with open(args.out, "w") as out:
            out.write(report)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as out:
            json.dump({"args": vars(args), "results": results, "builds": builds}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
