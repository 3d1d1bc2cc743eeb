#!/usr/bin/env python3
"""``torch.compile`` against eager for an attention-softmax cell's host time.

The standard tool for dispatch overhead: does compiling a cell's function
cut what the host spends on it?  This script times, on one thread, the
attention-softmax cell of ``bench_host_cost.py``'s tiny model (hidden size
8, 40 words, 8 sentences of 32 tokens: the arithmetic is negligible) in
its two forms: the modules under autograd (``AttentionSoftmax.features``
then the fused loss) and the fused cell (one autograd node,
:mod:`fairseq_hybrid.kernels.attention_softmax_loss`), each eager and
compiled (``torch.compile``, inductor, CPU), forward and backward, and
reports per call the median of ``--repeats`` timings, the seconds the first
call took to compile, and the seconds a second batch shape took (a
recompile, or none), with the compiled results' largest relative
difference from eager.

    .venv/bin/python benchmarks/compile_cell.py --json docs/bench/compile_cell.json

A time: run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Callable, Dict

import torch

from fairseq_hybrid.kernels.attention_softmax_loss import LabelSmoothedLoss, attention_softmax_loss
from fairseq_hybrid.kernels.fused_output_loss import kept_targets
from fairseq_hybrid.models.attention_softmax import AttentionSoftmax

PAD = 1


def batch(sentences: int, steps: int, source: int, size: int = 8, vocab: int = 40):
    generator = torch.Generator().manual_seed(sentences * 1000 + steps)
    states = torch.randn(sentences, steps, size, generator=generator).requires_grad_()
    encoder = torch.randn(sentences, source, size, generator=generator).requires_grad_()
    mask = torch.zeros(sentences, source, dtype=torch.bool)
    target = torch.randint(2, vocab, (sentences, steps), generator=generator)
    return states, encoder, mask, target


def cells(part, loss) -> Dict[str, Callable]:
    def modules(states, encoder, mask, target):
        features, _ = part.features(states, encoder, mask)
        return loss(features, part.output_weight, part.output_bias, target, kept_targets(target, PAD))[0]

    def fused(states, encoder, mask, target):
        return attention_softmax_loss(part, states, encoder, mask, kept_targets(target, PAD), loss)[0]

    return {"modules": modules, "fused cell": fused}


def per_call_us(run: Callable, args, repeats: int, calls: int = 100) -> float:
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            run(*args).backward()
        timings.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(timings)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    part = AttentionSoftmax("general", 8, 8, 8, 40, dropout=0.0)
    loss = LabelSmoothedLoss(0.1, PAD, 256, False)
    first, second = batch(8, 33, 33), batch(5, 21, 17)
    report: Dict = {"torch": torch.__version__, "rows": []}
    for name, run in cells(part, loss).items():
        eager_us = per_call_us(run, first, args.repeats)
        torch._dynamo.reset()
        compiled = torch.compile(run)
        start = time.perf_counter()
        compiled(*first).backward()
        compile_s = time.perf_counter() - start
        start = time.perf_counter()
        compiled(*second).backward()
        second_shape_s = time.perf_counter() - start
        compiled_us = per_call_us(compiled, first, args.repeats)
        difference = (compiled(*first) - run(*first)).abs().item() / run(*first).abs().item()
        row = {"cell": name, "eager_us": eager_us, "compiled_us": compiled_us, "compile_s": compile_s,
               "second_shape_s": second_shape_s, "relative_difference": difference}
        report["rows"].append(row)
        print(f"{name}: eager {eager_us:.0f} us, compiled {compiled_us:.0f} us a call (forward and backward); "
              f"first call {compile_s:.1f} s, a second shape {second_shape_s:.1f} s; loss differs by "
              f"{difference:.1e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
