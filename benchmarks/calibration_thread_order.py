#!/usr/bin/env python3
"""Does a process that trained with one intra-op thread first time the
model at K threads slower than one that began at K?  The question behind
the CPU calibration's order (``timing/calibration_runs.py`` times the
model at K threads before anything at one; docs/benchmarks.md,
"Measured on your own devices").  Each run is a fresh process; it prints
the seconds of 8 host-bound Tatoeba steps at each setting in turn.

  python benchmarks/calibration_thread_order.py work/tatoeba_ja_en/bin --runs 2
"""

import argparse
import os
import subprocess
import sys

from fairseq_hybrid.harness.measuring import NO_DATA, ending_with_this_process

ORDERS = {"began at K": ["K", "K", "1", "K", "1", "K"], "began at 1": ["1", "K", "1", "K", "1", "K"]}


def one_process(data: str, order: str, k: int) -> str:
    import logging

    import torch

    from fairseq_hybrid.timing.command_model import build, drawn
    from fairseq_hybrid.timing.training_steps import train_steps

    logging.disable(logging.WARNING)
    train = [data, "--arch", "hybrid_lstm_tiny", "--encoder-layers", "4", "--decoder-layers", "4", "--criterion",
             "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--dropout", "0.1", "--max-tokens", "1000",
             "--source-lang", "ja", "--target-lang", "en"]
    task, cfg, model, criterion = build(train, ["cpu"])
    samples = drawn(task, cfg, 9, seed=2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    settings = [k if step == "K" else 1 for step in ORDERS[order]]
    torch.set_num_threads(settings[0])
    train_steps(model, criterion, optimizer, samples[:1])
    times = []
    for threads in settings:
        torch.set_num_threads(threads)
        times.append(f"{threads}t {train_steps(model, criterion, optimizer, samples[1:])[1] * 1000:.0f} ms")
    return ", ".join(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="fairseq-preprocess output (ja-en)")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="K")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not os.path.isdir(args.data):
        parser.error(f"{args.data}: {NO_DATA}")
    if args.one:
        print(one_process(args.data, args.one, args.threads), flush=True)
        return 0
    for run in range(args.runs):
        for order in ORDERS:
            done = subprocess.run([sys.executable, os.path.abspath(__file__), args.data, "--one", order, "--threads",
                                   str(args.threads)], capture_output=True, text=True, check=True,
                                  preexec_fn=ending_with_this_process())
            print(f"run {run + 1}, {order}: {done.stdout.strip()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
