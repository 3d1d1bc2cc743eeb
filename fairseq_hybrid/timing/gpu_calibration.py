"""A GPU cost file's three measurements, made on the user's model
(``fairseq-hybrid-plan calibrate cuda:0,...``), in a process of its own:

* the host time per cell call: the engine's own cell timer over a few
  steps of a group of 1 and of K of the devices (where the forecasts take
  it from; a GPU's host cannot be priced from a CPU's);
* one LSTM layer's seconds per time step by batch, at the model's hidden
  size, as DeepBench times it: what the forecasts' batch curve needs;
* one device's tokens/s (source + target) at the shape the plan's rate
  refers to (``gpu_costs.REFERENCE_BATCH``), so that the FLOP rate the plan solves for
  is this device's on this model.

On CPU devices the same code runs as a smoke run, a device a core (one
device's step too); its figures then say nothing of a GPU.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from typing import Dict, Sequence

import torch

from ..forecasts.gpu_costs import REFERENCE_BATCH
from ..parallel import keep_on_host, record_cell_times
from .training_steps import backward_step, on_device, synchronize, train_steps

__all__ = ["LSTM_BATCHES", "host_row", "lstm_seconds_per_step", "reference_sample", "run"]

LSTM_BATCHES = (16, 32, 64, 128, 256, 512)
WARMUP = 2


def reference_sample(src_dict, tgt_dict, sentences: int, source: int, target: int, seed: int = 0) -> Dict:
    """A batch of ``sentences`` sentences of ``source`` + ``target`` tokens
    drawn from the dictionaries' words, as fairseq collates it."""
    generator = torch.Generator().manual_seed(seed)

    def words(dictionary, length):
        tokens = torch.randint(dictionary.nspecial, len(dictionary), (sentences, length), generator=generator)
        tokens[:, -1] = dictionary.eos()
        return tokens

    src, tgt = words(src_dict, source), words(tgt_dict, target)
    previous = torch.cat([torch.full((sentences, 1), tgt_dict.eos()), tgt[:, :-1]], dim=1)
    return {"id": torch.arange(sentences), "nsentences": sentences, "ntokens": sentences * target, "target": tgt,
            "net_input": {"src_tokens": src, "src_lengths": torch.full((sentences,), source),
                          "prev_output_tokens": previous}}


def host_row(model, criterion, sample, steps: int, device: str) -> Dict:
    """A group's host time per cell call, by kind and phase (the median of
    its calls), and each worker's step time outside its cells per cell it
    ran, over ``steps`` steps after :data:`WARMUP`: the row a host-cost
    report holds for one K and chunk length."""
    group = model.hybrid_group
    if torch.device(device).type == "cuda":  # where fairseq's trainer puts a group's batch
        sample = keep_on_host(sample, group.plan.devices, lambda host: on_device(host, device))

    def step():
        backward_step(model, criterion, sample)
        synchronize(*group.plan.devices)

    for _ in range(WARMUP):
        step()
    walls = []
    with record_cell_times() as trace:
        for _ in range(steps):
            start = time.perf_counter()
            step()
            walls.append(time.perf_counter() - start)
    per_kind, busy, calls = defaultdict(list), defaultdict(float), defaultdict(int)
    for entry in trace:
        kind = entry.work.kind if entry.work is not None else "other"
        per_kind[f"{kind}/{entry.phase}"].append(entry.end - entry.start)
        busy[entry.worker] += entry.end - entry.start
        calls[entry.worker] += 1
    wall = statistics.median(walls)
    return {"k": len(group.plan.devices), "chunk_length": group.chunk_length, "cells_per_step": len(trace) / steps,
            "step_ms": wall * 1e3,
            "cell_us": {key: statistics.median(values) * 1e6 for key, values in sorted(per_kind.items())},
            "outside_cells_us_per_cell": statistics.mean((wall * steps - busy[w]) / calls[w] for w in calls) * 1e6}


def lstm_seconds_per_step(device: str, hidden: int, batches: Sequence[int] = LSTM_BATCHES, steps: int = 25,
                          repeats: int = 5) -> Dict:
    """One LSTM layer's seconds per time step, forward and backward, at
    each batch (hidden = input size, ``steps`` steps), the fastest of
    ``repeats`` after one warm-up."""
    lstm = torch.nn.LSTM(hidden, hidden, batch_first=True).to(device)
    rows = {}
    for batch in batches:
        x = torch.randn(batch, steps, hidden, device=device, requires_grad=True)
        timings = {"forward": [], "backward": []}
        for repeat in range(repeats + 1):
            synchronize(device)
            start = time.perf_counter()
            out, _ = lstm(x)
            synchronize(device)
            middle = time.perf_counter()
            out.sum().backward()
            synchronize(device)
            if repeat:
                timings["forward"].append((middle - start) / steps)
                timings["backward"].append((time.perf_counter() - middle) / steps)
        rows[str(batch)] = {phase: min(values) for phase, values in timings.items()}
    return {"hidden": hidden, "steps": steps, "rows": rows}


def run(spec: Dict) -> Dict:
    """``spec``: the user's command (``train``), the ``devices``, the timed
    ``batches`` (steps) and, for a smoke run only, another ``reference``
    batch.  Returns the host-cost
    report, the LSTM curve and one device's tokens/s, as
    ``forecasts.cost_file.write`` takes them."""
    from .command_model import build

    devices, steps, reference = spec["devices"], spec["batches"], tuple(spec.get("reference", REFERENCE_BATCH))
    if torch.device(devices[0]).type == "cpu":
        # a CPU device is one core, in a group's rows (each worker's one thread) and so for one device too:
        # with the machine's threads one device's step could be shorter than a group of 1's cells alone
        torch.set_num_threads(1)
    task, cfg, one, criterion = build(spec["train"], devices[:1], with_batches=False)
    sample = reference_sample(task.source_dictionary, task.target_dictionary, *reference)
    optimizer = torch.optim.Adam(one.parameters(), lr=1e-3)
    train_steps(one, criterion, optimizer, [sample] * WARMUP, devices[0])
    _, seconds = train_steps(one, criterion, optimizer, [sample] * steps, devices[0])
    tokens_per_s = steps * reference[0] * (reference[1] + reference[2]) / seconds
    del one, optimizer
    rows = []
    for k in sorted({1, len(devices)}):
        _, _, group, criterion = build(spec["train"], devices[:k], {"chunk_length": 0}, with_batches=False)
        try:
            rows.append(host_row(group, criterion, sample, steps, devices[0]))
        finally:
            if group.hybrid_group.stages is not None:
                group.hybrid_group.stages.close()
    kind = torch.device(devices[0]).type
    return {"host_cost": {"device": kind, "gpu": torch.cuda.get_device_name(devices[0]) if kind == "cuda" else None,
                          "torch": torch.__version__, "rows": rows},
            "lstm": lstm_seconds_per_step(devices[0], int(cfg.model.decoder_hidden_size)),
            "tokens_per_s": tokens_per_s,
            "shape": f"{cfg.model._name}, {reference[0]} sentences of {reference[1]} + {reference[2]} tokens, "
                     f"{len(task.source_dictionary)} + {len(task.target_dictionary)} words"}
