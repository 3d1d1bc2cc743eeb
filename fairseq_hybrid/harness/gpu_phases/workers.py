"""The GPU check's workers phase: threads against processes at K = 1, 2 and 4,
each device's host time per cell call and how far the hosts overlap
(docs/gpu.md)."""

import json
import os

from .base import COST_FILE, devices_for, timed


def group_step(arch, devices, workers, device, steps, batch, length, vocab):
    """A group of ``devices`` with ``workers``: :func:`timed`'s figures and
    each device's cells a step (forward and backward)."""
    from fairseq_hybrid.parallel import build_step

    model, sample, rate, wall, busy = timed(arch, devices, device, steps, batch, length, vocab,
                                            hybrid_workers=workers)
    group = model.hybrid_group
    built = build_step(model, group.plan, sample["net_input"], sample["target"], None, group.chunk_length, 1,
                       group.replicas)
    cells = [2 * sum(1 for cell in built.step.cells if cell.worker == index) for index in range(len(devices))]
    return rate, wall, busy, cells


def phase_workers(args, result):
    """Threads against processes at K = 1, 2, 4 (docs/gpu.md): the host
    time per cell call of each device, and how far the hosts overlap."""
    import torch

    cuda = args.device == "cuda"
    count = torch.cuda.device_count() if cuda else 0
    arch, shape = (("hybrid_lstm_paper", dict(batch=128, length=50, vocab=32000)) if cuda else
                   ("hybrid_lstm_tiny", dict(batch=8, length=6, vocab=50)))
    rows = []
    result.update(rows=rows, shape=f"{arch}, {shape['batch']} sentences of {shape['length']} + {shape['length']} "
                                   f"tokens, {args.steps} timed steps after one warm-up")  # kept row by row
    for k in (1, 2, 4) if cuda else (1, 2):
        devices = devices_for(args.device, count, k)
        for workers in ("threads", "processes"):
            rate, wall, busy, cells = group_step(arch, devices, workers, args.device, args.steps, **shape)
            rows.append({"devices": ",".join(devices), "workers": workers, "target_tokens_per_s": rate,
                         "step_ms": wall * 1e3, "busy": busy,
                         "host_us_per_call": [share * wall / calls * 1e6 for share, calls in zip(busy, cells)],
                         "hosts_at_once": sum(busy)})
            result.save()
            print(rows[-1], flush=True)
    path = os.path.join(args.work, COST_FILE)
    if os.path.exists(path):  # calibrate's cost file: what each kind of worker measured, beside its host time
        data = json.load(open(path))
        data["workers"] = {"shape": result["shape"], "rows": rows}
        with open(path, "w") as file:
            json.dump(data, file, indent=2)
        result["cost_file"] = path
    result["ok"] = True
