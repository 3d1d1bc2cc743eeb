#!/usr/bin/env python3
"""One LSTM cell and one attention-softmax cell as they run, read from a
``torch.profiler`` trace: ``hybrid_lstm_paper`` at 128 sentences of 50 + 50
tokens on a GPU (``hybrid_lstm_tiny`` on a CPU: a smoke run), the GPU
check's ``cells`` phase (docs/gpu.md).  One step of a group of two workers
under the profiler, the cells labelled; for each picked cell, forward and
backward, its host time, ops, kernels launched, host waits, copies and the
ops with the most host time (the host time per call by kind is the
calibrate phase's).

  python benchmarks/cell_trace.py --device cuda --json work/cell_trace.json
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Dict, List

import torch

from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
from fairseq_hybrid.harness.measuring import backward_step, synchronize, write_report
from fairseq_hybrid.harness.stand_ins import StandInTask, build_model, make_dictionary, make_sample
from fairseq_hybrid.parallel import keep_on_host, labelled_cells

# CUDA runtime calls that make the host wait for the device
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy ", "cudaMemcpy(")
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cudaGraphLaunch")
# a middle LSTM cell and an attention-softmax cell on a replica: of chunk 1, or 0 where there is one chunk
PICKED = ("decoder layer 1 chunk {c}", "attention-softmax shard 1 chunk {c}")


def shape_of(device: str) -> Dict:
    if device == "cuda":
        return dict(arch="hybrid_lstm_paper", sentences=128, length=50, vocabulary=32000)
    return dict(arch="hybrid_lstm_tiny", sentences=8, length=6, vocabulary=50)


def group(devices: List[str], chunk_length: int, shape: Dict):
    dictionary = make_dictionary(shape["vocabulary"])
    torch.manual_seed(0)
    model = build_model(shape["arch"], dictionary, dictionary, hybrid_devices=",".join(devices),
                        hybrid_chunk_length=chunk_length).train()
    criterion = HybridCrossEntropyCriterion(StandInTask(dictionary, dictionary), False, 0.1)
    lengths = [shape["length"]] * shape["sentences"]
    sample = make_sample(dictionary, dictionary, lengths, lengths)
    return model, criterion, sample, devices


def step(model, criterion, sample, devices) -> None:
    """One forward and backward, the batch handed over as fairseq's trainer
    hands it (pinned, moved to the first device), the kernels waited for."""
    moved = keep_on_host(sample, model.hybrid_group.plan.devices, lambda host: _moved(host, devices[0]))
    loss, _, _ = backward_step(model, criterion, moved)
    model.zero_grad(set_to_none=True)
    synchronize(loss.device)


def _moved(sample, device: str):
    from fairseq_hybrid.harness.measuring import on_device
    return on_device(sample, device)


def inside(events, label) -> List:
    """The events on ``label``'s thread within its time range (itself left out)."""
    start, end = label.time_range.start, label.time_range.end
    return [e for e in events if e is not label and e.thread == label.thread
            and start <= e.time_range.start and e.time_range.end <= end]


def cell_report(events, label) -> Dict:
    within = inside(events, label)
    ops = [e for e in within if e.name.startswith("aten::")]
    runtime = [e for e in within if e.name.startswith(("cuda", "cu"))]
    top = Counter()
    for op in ops:
        top[op.name] += op.self_cpu_time_total
    copies = [{"op": e.name, "shapes": [list(s) for s in e.input_shapes if s][:2]}
              for e in ops if e.name in ("aten::copy_", "aten::_cudnn_rnn_flatten_weight", "aten::clone")]
    return {"host_us": label.cpu_time_total, "ops": len(ops),
            "kernels_launched": sum(1 for e in runtime if e.name.startswith(LAUNCHES)),
            "host_waits": [e.name for e in runtime if e.name.startswith(WAITS)],
            "copies": copies[:12], "copies_total": len(copies),
            "top_ops_us": {name: round(us, 1) for name, us in top.most_common(10)}}


def trace_cells(device: str, shape: Dict) -> Dict:
    devices = [device, device] if device == "cuda" else ["cpu", "cpu"]
    built = group([f"{d}:0" if d == "cuda" else d for d in devices], 8, shape)
    for _ in range(2):
        step(*built)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    # the cells run on the workers' threads: the profiler's callbacks on every thread, not the caller's alone
    config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    with torch.profiler.profile(activities=activities, record_shapes=True, experimental_config=config) as profile, \
            labelled_cells():
        step(*built)
    events = profile.events()
    labels = {e.name: e for e in events if e.name.startswith("cell ")}
    chunk = 1 if f"cell {PICKED[0].format(c=1)} (forward)" in labels else 0
    cells = {}
    for name in (picked.format(c=chunk) for picked in PICKED):
        for phase in ("forward", "backward"):
            label = labels.get(f"cell {name} ({phase})")
            cells[f"{name} ({phase})"] = cell_report(events, label) if label is not None else None
    return {"devices": ",".join(built[3]), "chunk_length": 8, "cells": cells,
            "labelled": len(labels)}


def measure(device: str) -> Dict:
    shape = shape_of(device)
    report = {"shape": f"{shape['arch']}, {shape['sentences']} sentences of {shape['length']} + {shape['length']} "
                       f"tokens, {shape['vocabulary']} words", "device": device,
              "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None, "torch": torch.__version__}
    report["trace"] = trace_cells(device, shape)
    return report


def markdown(report: Dict) -> str:
    trace = report["trace"]
    lines = [f"# One cell as it runs ({report['shape']}, {report['device']})", "",
             f"Traced on {trace['devices']}, chunk length 8 (`benchmarks/cell_trace.py`):", "",
              "| cell | host us | ops | kernels | host waits | copies | most host time |",
              "| --- | ---: | ---: | ---: | --- | ---: | --- |"]
    for name, cell in trace["cells"].items():
        if cell is None:
            lines.append(f"| {name} | not run | | | | | |")
            continue
        top = ", ".join(f"{op.replace('aten::', '')} {us:.0f}" for op, us in list(cell["top_ops_us"].items())[:4])
        lines.append(f"| {name} | {cell['host_us']:.0f} | {cell['ops']} | {cell['kernels_launched']} | "
                     f"{', '.join(cell['host_waits']) or 'none'} | {cell['copies_total']} | {top} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", help="write the report here (and a .md beside it)")
    args = parser.parse_args(argv)
    report = measure(args.device)
    text = markdown(report)
    print(text)
    write_report(report, args.json, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
