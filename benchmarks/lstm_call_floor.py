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
beside the engine's LSTM cell measured in the same run: the cell's floor
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
import sys
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_host_cost import LSTM_KERNELS, TINY, measure, ops_per_cell  # noqa: E402

SENTENCES, LENGTH = 8, 32
HIDDEN = TINY["decoder_hidden_size"]


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
    row = measure(1, 0, args.steps, SENTENCES, LENGTH)
    counts, shares, top = ops_per_cell(0, SENTENCES, LENGTH)
    cell_us = sum(row["cell_us"][f"lstm/{phase}"] for phase in ("forward", "backward"))
    cell_without = sum(row["cell_us"][f"lstm/{phase}"] * (1 - shares[f"lstm/{phase}"])
                       for phase in ("forward", "backward"))
    floor = min(entry["without_kernel_us"] for entry in bare.values())
    report = {"machine": platform.machine(), "processor": platform.processor(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "bare_call": bare,
              "cell": {"ops": counts["lstm"], "op_names": top["lstm"], "us": cell_us,
                       "without_kernel_us": cell_without, "kernel_share": shares},
              "floor_share_of_cell_without_kernel": floor / cell_without}
    print(f"{'':34} {'aten ops':>9} {'us (fwd+bwd)':>13} {'without kernel op':>18}")
    for name, entry in bare.items():
        print(f"{'torch._VF.lstm alone, ' + name:34} {entry['ops']:>9} {entry['us']:>13,.0f} "
              f"{entry['without_kernel_us']:>18,.0f}")
    print(f"{'the engine LSTM cell (median)':34} {counts['lstm']:>9.1f} {cell_us:>13,.0f} {cell_without:>18,.0f}")
    print(f"\nPyTorch's own call without its kernel: {report['floor_share_of_cell_without_kernel']:.0%} of the "
          "cell's host time without its kernel (the engine's share: the rest)")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
