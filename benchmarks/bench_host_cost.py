#!/usr/bin/env python3
"""Host time per cell of the hybrid engine, where arithmetic is negligible:
on a GPU an op's launch is asynchronous, so what the host spends per cell
(the engine's Python, torch's dispatch of each op) is a floor under each
cell's time there.

The engine runs on plain CPU devices with a model so small (hidden size 8,
vocabulary 40, 4 + 4 layers) that the cells' arithmetic costs next to
nothing, for K workers and several chunk lengths.  A row per K and chunk
length (``fairseq_hybrid.timing.gpu_calibration.host_row``, as the product
measures a GPU), a profiled step beside it, and at K = 1 the aten ops per
cell, one small op's cost and the share of an LSTM cell inside its kernel
op (docs/benchmarks.md, "Host time per cell, measured").  The JSON is what
``fairseq-hybrid-plan --host-cost`` and the race scripts read.  A time: run
it alone on the machine.

    .venv/bin/python benchmarks/bench_host_cost.py --json docs/bench/host_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections import Counter, defaultdict
from typing import Dict, List, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
from fairseq_hybrid.harness.measuring import backward_step, write_report
from fairseq_hybrid.parallel import record_cell_times
from fairseq_hybrid.timing.gpu_calibration import host_row
from fairseq_hybrid.harness.stand_ins import StandInTask, build_model, make_dictionary, make_sample

TINY = dict(encoder_embed_dim=8, encoder_hidden_size=8, decoder_embed_dim=8, decoder_hidden_size=8,
            decoder_out_embed_dim=8, encoder_layers=4, decoder_layers=4, encoder_bidirectional_layers=1, dropout=0.0)


def op_cost_us(repeats: int = 20000) -> float:
    """Host microseconds of one small aten op called from Python (an add of
    two 8-element tensors), the median of 5 timings."""
    a, b = torch.ones(8), torch.ones(8)
    timings = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            torch.add(a, b)
        timings.append((time.perf_counter() - start) / repeats * 1e6)
    return statistics.median(timings)


GROUP_OPTIONS: Dict[str, str] = {}  # the group's other options (--softmax-chunks), the model's defaults unless set


def setup(k: int, chunk_length: int, sentences: int, length: int):
    dictionary = make_dictionary()
    torch.manual_seed(0)
    model = build_model("hybrid_lstm", dictionary, dictionary, **TINY, hybrid_devices=",".join(["cpu"] * k),
                        hybrid_chunk_length=chunk_length, **GROUP_OPTIONS).train()
    criterion = HybridCrossEntropyCriterion(StandInTask(dictionary, dictionary), False, 0.1)
    sample = make_sample(dictionary, dictionary, [length] * sentences, [length] * sentences)
    return model, criterion, sample


def one_step(model, criterion, sample):
    backward_step(model, criterion, sample)


def measure(k: int, chunk_length: int, steps: int, sentences: int, length: int) -> Dict:
    """The row of a group of ``k`` at ``chunk_length``: the product's
    measurement (``timing.gpu_calibration.host_row``) and a profiled step."""
    model, criterion, sample = setup(k, chunk_length, sentences, length)
    row = host_row(model, criterion, sample, steps, "cpu")
    return dict(row, chunk_length=chunk_length, profiled=profiled_step(model, criterion, sample))


def profiled_step(model, criterion, sample) -> Dict[str, float]:
    """The second method: one step under ``torch.profiler`` on every
    thread, its own account of the host's time in aten ops (each op's self
    time, so nested ops count once) and how many ops ran, beside the
    step's wall time under the profiler (which the profiler slows)."""
    config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    start = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], experimental_config=config) as prof:
        one_step(model, criterion, sample)
    wall = time.perf_counter() - start
    ops = [event for event in prof.events() if event.name.startswith("aten::")]
    return {"ops": len(ops), "op_self_ms": sum(event.self_cpu_time_total for event in ops) / 1e3,
            "step_ms": wall * 1e3}


# the LSTM kernel ops as the dispatcher sees them on a CPU (oneDNN) and a GPU (cuDNN)
LSTM_KERNELS = ("aten::mkldnn_rnn_layer", "aten::mkldnn_rnn_layer_backward", "aten::_cudnn_rnn",
                "aten::_cudnn_rnn_backward")


def ops_per_cell(chunk_length: int, sentences: int, length: int) -> Tuple[
        Dict[str, float], Dict[str, float], Dict[str, Dict[str, float]]]:
    """aten ops per cell (forward and backward calls together), by kind, the
    share of an LSTM cell's time inside its LSTM kernel op, by phase, and
    the ops a cell of each kind calls most, by name (which kernels a
    device's LSTM really runs: one cuDNN call, or a loop over time steps),
    on one device (a dispatch mode entered by every job)."""
    from fairseq_hybrid.parallel.runtime import thread_state
    from fairseq_hybrid.parallel.runtime.worker import current_worker

    counts: Dict[str, List[int]] = defaultdict(list)
    current = {}
    names: Dict[str, Counter] = defaultdict(Counter)
    kernel = defaultdict(float)  # (cell, phase) -> seconds inside LSTM kernel ops

    class PerCell(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            worker = current_worker()
            if worker is None or worker.cell is None:
                return func(*args, **(kwargs or {}))
            current[worker.cell] = current.get(worker.cell, 0) + 1
            names[worker.cell][func.name()] += 1
            if func.name() not in LSTM_KERNELS:
                return func(*args, **(kwargs or {}))
            start = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            phase = "backward" if worker.activity.endswith("(backward)") else "forward"
            kernel[worker.cell, phase] += time.perf_counter() - start
            return out

    hook = lambda: PerCell  # noqa: E731  (entered in every job)
    thread_state.register(hook)
    try:
        model, criterion, sample = setup(1, chunk_length, sentences, length)
        one_step(model, criterion, sample)
        current.clear()
        names.clear()
        kernel.clear()
        with record_cell_times() as trace:
            one_step(model, criterion, sample)
    finally:
        thread_state.unregister(hook)
    kinds = {entry.name: entry.work.kind if entry.work is not None else "other" for entry in trace}
    for name, count in current.items():  # forward and backward calls of the cell together
        counts[kinds.get(name, "other")].append(count)
    share = {}
    for phase in ("forward", "backward"):
        cells = [entry for entry in trace if entry.phase == phase and entry.work is not None
                 and entry.work.kind == "lstm"]
        share[f"lstm/{phase}"] = (sum(kernel[entry.name, phase] for entry in cells)
                                  / sum(entry.end - entry.start for entry in cells))
    top: Dict[str, Counter] = defaultdict(Counter)
    for name, counter in names.items():
        top[kinds.get(name, "other")].update(counter)
    cells_of = {kind: len(values) for kind, values in counts.items()}
    top_names = {kind: {op: count / cells_of[kind] for op, count in counter.most_common(8)}
                 for kind, counter in top.items()}
    return {kind: statistics.mean(values) for kind, values in counts.items()}, share, top_names


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", default="1,2,4")
    parser.add_argument("--chunk-lengths", default="0,8,4,2", help="0: K chunks (the default)")
    parser.add_argument("--sentences", type=int, default=8)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--softmax-chunks", help="the group's --hybrid-softmax-chunks (default: the model's)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.softmax_chunks is not None:
        GROUP_OPTIONS["hybrid_softmax_chunks"] = args.softmax_chunks
    torch.set_num_threads(1)
    rows = []
    for k in (int(x) for x in args.groups.split(",")):
        for chunk_length in (int(x) for x in args.chunk_lengths.split(",")):
            row = measure(k, chunk_length, args.steps, args.sentences, args.length)
            rows.append(row)
            print(json.dumps(row), flush=True)
    ops, kernel_share, top_ops = ops_per_cell(0, args.sentences, args.length)
    report = {"machine": platform.processor() or platform.machine(), "device": "cpu",
              "group_options": dict(GROUP_OPTIONS), "torch": torch.__version__, "cores": os.cpu_count(), "op_us": op_cost_us(), "ops_per_cell_k1_whole": ops,
              "lstm_kernel_share_k1_whole": kernel_share, "top_ops_per_cell_k1_whole": top_ops, "rows": rows}
    print(json.dumps(report, indent=2))
    write_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
