#!/usr/bin/env python3
"""How much of an LSTM cell's host time on CPU is PyTorch's own LSTM call,
which no change to the engine can cut.

``bench_host_cost.py`` reports an LSTM cell's host time without its
kernel op (oneDNN's ``mkldnn_rnn_layer`` and its backward).  On a CPU the
call the cell makes, ``torch._VF.lstm``, is itself a dozen or more aten
ops around that kernel (PyTorch's CPU LSTM: the weights transposed, the
states selected and stacked, tensors detached for autograd), none of
which the engine controls and none of which a GPU runs (there the same
call is one cuDNN op).  This script times that call alone, forward and
backward, at the shape of ``bench_host_cost.py``'s cells (hidden size 8,
8 sentences of 32 tokens, K = 1, whole sequences: padded, as the encoder's
cells run when every row spans the chunk, and packed, as the decoder's
do), with its kernel op's share taken out the same way, and sets it
beside the engine's LSTM cell measured in the same run (``bench_host_cost.py``, run
as a script of its own): the cell's floor
on CPU, and what is left for the engine.

  .venv/bin/python benchmarks/lstm_call_floor.py --json docs/bench/lstm_call_floor.json

A time: run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HERE = os.path.dirname(os.path.abspath(__file__))
SENTENCES, LENGTH, HIDDEN = 8, 32, 8  # bench_host_cost.py's defaults and its model's hidden size
LSTM_KERNELS = ("aten::mkldnn_rnn_layer", "aten::mkldnn_rnn_layer_backward")  # oneDNN's, as on this CPU


def engine_cell(steps: int):
    """The engine's LSTM cell at K = 1, whole sequences, as
    ``bench_host_cost.py`` measures it (run as a script of its own): time
    per phase, its kernel's share, aten ops and their names."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "host_cost.json")
        subprocess.run([sys.executable, os.path.join(HERE, "bench_host_cost.py"), "--groups", "1", "--chunk-lengths",
                        "0", "--steps", str(steps), "--sentences", str(SENTENCES), "--length", str(LENGTH), "--json",
                        out], check=True, stdout=subprocess.DEVNULL)
        with open(out) as file:
            report = json.load(file)
    row = next(row for row in report["rows"] if row["k"] == 1 and row["chunk_length"] == 0)
    return (row["cell_us"], report["lstm_kernel_share_k1_whole"], report["ops_per_cell_k1_whole"]["lstm"],
            report["top_ops_per_cell_k1_whole"]["lstm"])


def call(lstm: torch.nn.LSTM, packed: bool):
    """One forward and backward of the bare call, as a cell makes it (the
    gradients made once, outside: the engine's backward receives them)."""
    inputs = torch.randn(SENTENCES, LENGTH, HIDDEN, requires_grad=True)
    state = (torch.zeros(1, SENTENCES, HIDDEN), torch.zeros(1, SENTENCES, HIDDEN))
    data = inputs.detach().transpose(0, 1).reshape(-1, HIDDEN).requires_grad_()
    sizes = torch.full((LENGTH,), SENTENCES, dtype=torch.long)

    def forward():
        if packed:
            return torch._VF.lstm(data, sizes, state, lstm._flat_weights, True, 1, 0.0, True, False)
        return torch._VF.lstm(inputs, state, lstm._flat_weights, True, 1, 0.0, True, False, True)

    grads = [torch.ones_like(out) for out in forward()]

    def run():
        torch.autograd.backward(forward(), grads)

    return run


def counted(run):
    """aten ops of one call and the kernel ops' share of its time, in a
    dispatch mode (which slows every op alike)."""
    names: Counter = Counter()
    kernel = [0.0]

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names[func.name()] += 1
            if func.name() not in LSTM_KERNELS:
                return func(*args, **(kwargs or {}))
            start = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            kernel[0] += time.perf_counter() - start
            return out

    run()  # warm-up: oneDNN's primitive
    shares = []
    for _ in range(1 + 5):  # the first call in the mode pays for the mode's own set-up: left out
        names.clear()
        kernel[0] = 0.0
        start = time.perf_counter()
        with Count():
            run()
        shares.append(kernel[0] / (time.perf_counter() - start))
    return dict(names.most_common()), statistics.median(shares[1:])


def timed_us(run, repeats: int) -> float:
    """The call's median wall time, microseconds, outside any mode."""
    for _ in range(5):
        run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=200, help="timed calls of the bare call")
    parser.add_argument("--steps", type=int, default=20, help="timed steps of the engine (bench_host_cost.py)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(HIDDEN, HIDDEN, batch_first=True)
    bare = {}
    for name, packed in (("padded", False), ("packed", True)):
        run = call(lstm, packed)
        ops, share = counted(run)
        wall = timed_us(run, args.repeats)
        bare[name] = {"ops": sum(ops.values()), "op_names": ops, "us": wall, "kernel_share": share,
                      "without_kernel_us": wall * (1 - share)}
    times, shares, cell_ops, top = engine_cell(args.steps)
    cell_us = sum(times[f"lstm/{phase}"] for phase in ("forward", "backward"))
    cell_without = sum(times[f"lstm/{phase}"] * (1 - shares[f"lstm/{phase}"]) for phase in ("forward", "backward"))
    floor = min(entry["without_kernel_us"] for entry in bare.values())
    report = {"machine": platform.machine(), "processor": platform.processor(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "bare_call": bare,
              "cell": {"ops": cell_ops, "op_names": top, "us": cell_us,
                       "without_kernel_us": cell_without, "kernel_share": shares},
              "floor_share_of_cell_without_kernel": floor / cell_without}
    print(f"{'':34} {'aten ops':>9} {'us (fwd+bwd)':>13} {'without kernel op':>18}")
    for name, entry in bare.items():
        print(f"{'torch._VF.lstm alone, ' + name:34} {entry['ops']:>9} {entry['us']:>13,.0f} "
              f"{entry['without_kernel_us']:>18,.0f}")
    print(f"{'the engine LSTM cell (median)':34} {cell_ops:>9.1f} {cell_us:>13,.0f} {cell_without:>18,.0f}")
    print(f"\nPyTorch's own call without its kernel: {report['floor_share_of_cell_without_kernel']:.0%} of the "
          "cell's host time without its kernel (the engine's share: the rest)")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
