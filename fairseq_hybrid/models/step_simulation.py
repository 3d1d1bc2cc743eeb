"""Predicted step times of ``hybrid_lstm`` on K devices, and the placement
that the prediction likes best (``--hybrid-placement auto``).

The engine's own step builder (:mod:`.hybrid_cells`) lays out the cells of
a step for a plan; here it runs on a parameter-free twin of the model (on
torch's ``meta`` device) and the cells are replayed with a cost model
(:mod:`fairseq_hybrid.parallel.schedule_sim`) instead of being run.  So the
simulated schedule is the engine's schedule, cell for cell.
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..parallel.device_plan import DevicePlan, build_plan
from ..parallel.schedule_sim import CostModel, StepTime, replay
from .hybrid_cells import build_data_parallel_step, build_hybrid_step

NOMINAL_BATCH = (64, 24, 24)  # sentences, source length, target length


class _Vocabulary:
    def __init__(self, size: int):
        self.size = size

    def __len__(self):
        return self.size

    def pad(self):
        return 1


class _Task:
    def __init__(self, vocabulary: int):
        self.source_dictionary = self.target_dictionary = _Vocabulary(vocabulary)


def twin_model(arch: str, vocabulary: int, **options):
    """A ``hybrid_lstm`` of preset ``arch`` whose parameters take no memory."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from .hybrid_lstm import HybridLSTMModel

    cfg = argparse.Namespace(**options)
    ARCH_CONFIG_REGISTRY[arch](cfg)
    cfg.hybrid_devices, cfg.hybrid_placement = "", ""
    with torch.device("meta"):
        return HybridLSTMModel.build_model(cfg, _Task(vocabulary)), cfg


def batch(sentences: int, source_lengths: Sequence[int], target_length: int) -> Tuple[Dict, torch.Tensor]:
    """A net_input and target of the given shape (token ids do not matter)."""
    width = max(source_lengths)
    src = torch.full((sentences, width), 1, dtype=torch.long)
    for row, length in enumerate(source_lengths):
        src[row, width - length:] = 5  # left-padded, as fairseq batches sources
    tgt = torch.full((sentences, target_length), 5, dtype=torch.long)
    return {"src_tokens": src, "src_lengths": torch.tensor(list(source_lengths)), "prev_output_tokens": tgt}, tgt


def _no_loss(*args):
    raise RuntimeError("simulated cells are never run")


@dataclass
class Prediction:
    mode: str
    devices: int
    placement: str
    time: StepTime


def step_time(model, plan: DevicePlan, net_input, target, cost: CostModel, chunk_length: int = 0,
              physical_devices: Optional[Sequence[int]] = None) -> StepTime:
    """Predicted time of one step of ``model`` under ``plan``."""
    params = {name: p.numel() for name, p in model.named_parameters()}
    if plan.mode == "data":
        built = build_data_parallel_step(model, plan, net_input, target, _no_loss)
        single = DevicePlan([plan.devices[0]], [0] * len(plan.encoder), [0] * len(plan.decoder), "hybrid")
        shard_cost: Dict[int, Tuple[float, float]] = {}  # by the shard's first row

        def whole_model(cell, phase):
            rows = slice(*cell.work.sizes)
            if rows.start not in shard_cost:
                sub_input = {key: value[rows] for key, value in net_input.items()}
                sub = build_hybrid_step(model, single, sub_input, target[rows], _no_loss, chunk_length)
                shard_cost[rows.start] = replay(sub.step.cells, 1, cost)
            return shard_cost[rows.start][0 if phase == "forward" else 1]

        forward, backward = replay(built.step.cells, plan.size, cost, physical_devices, whole_model)
        copied = sum(params.values())
    else:
        built = build_hybrid_step(model, plan, net_input, target, _no_loss, chunk_length)
        forward, backward = replay(built.step.cells, plan.size, cost, physical_devices)
        copied = sum(v for k, v in params.items() if k.startswith("decoder.attention_softmax."))
    physical = set(physical_devices) if physical_devices is not None else set(range(plan.size))
    workers = set(built.replica_workers)
    replica_devices = len({(physical_devices or list(range(plan.size)))[w] for w in workers}) - 1 if workers else 0
    extra = cost.step_overhead
    if replica_devices > 0 and len(physical) > 1 and cost.link_bandwidth != float("inf"):
        # parameters out to each other device and gradients back, one after another
        extra += 2 * replica_devices * (cost.link_latency + 4.0 * copied / cost.link_bandwidth)
    return StepTime(forward, backward, extra)


def placements(encoder_layers: int, decoder_layers: int, devices: int):
    """Every placement of the layers on ``devices`` devices as option text."""
    for assignment in itertools.product(range(devices), repeat=encoder_layers + decoder_layers):
        encoder, decoder = assignment[:encoder_layers], assignment[encoder_layers:]
        yield "encoder=" + ",".join(map(str, encoder)) + ";decoder=" + ",".join(map(str, decoder))


def best_placement(model, cfg, devices: Sequence[torch.device], cost: Optional[CostModel] = None,
                   shape: Tuple[int, int, int] = NOMINAL_BATCH, limit: int = 4096) -> Tuple[str, StepTime]:
    """The placement with the shortest predicted hybrid step: all placements
    when there are at most ``limit``, otherwise a local search from the
    default (move one layer at a time while that helps)."""
    cost = cost or CostModel()
    sentences, source_length, target_length = shape
    net_input, target = batch(sentences, [source_length] * sentences, target_length)
    names = [str(d) for d in devices]
    layers = (cfg.encoder_layers, cfg.decoder_layers)

    def evaluate(placement: str) -> StepTime:
        plan = build_plan(",".join(names), placement, "hybrid", *layers)
        return step_time(model, plan, net_input, target, cost, cfg.hybrid_chunk_length)

    k = len(devices)
    encoder = [layer % k for layer in range(layers[0])]
    decoder = [layer % k for layer in range(layers[1])]

    def text(enc, dec):
        return "encoder=" + ",".join(map(str, enc)) + ";decoder=" + ",".join(map(str, dec))

    # The default placement stays unless another is predicted to be faster.
    best, best_total = text(encoder, decoder), evaluate(text(encoder, decoder)).total
    if k ** sum(layers) <= limit:
        for candidate in placements(*layers, k):
            total = evaluate(candidate).total
            if total < best_total * (1 - 1e-6):
                best, best_total = candidate, total
        return best, evaluate(best)
    improved = True
    while improved:
        improved = False
        for part, index, device in itertools.product((0, 1), range(max(layers)), range(k)):
            current = [list(encoder), list(decoder)]
            if index >= len(current[part]) or current[part][index] == device:
                continue
            current[part][index] = device
            candidate = text(*current)
            total = evaluate(candidate).total
            if total < best_total:
                best, best_total, (encoder, decoder), improved = candidate, total, current, True
    return best, evaluate(best)
