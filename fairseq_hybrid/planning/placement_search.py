"""``--hybrid-placement auto``: the placement of the layers on K devices
whose simulated step is shortest.

Candidates are scored by the schedule simulator
(:func:`.schedule_simulator.step_time`) on a nominal batch, under a cost
model measured on the user's devices (``--hybrid-cost-model``) or, without
one, one where every floating-point operation costs the same.  Every
placement is tried when there are few enough, otherwise a local search
moves one layer at a time from the default.  For the best layers, the
device of each bidirectional layer's reverse direction is chosen too, and
(hybrid mode) the attention-softmax shard sizes: equal, sized to even out
the devices' work (:func:`balanced_shard_weights`), or a quarter, half or
three quarters of the way (work after the pipeline makes up for work
inside it only as far as micro-batches overlap the two): the
default's reverse direction lands beside the widest encoder layer, the
busiest device of a default group.  Scripts and tests simulate
models they never train on a parameter-free twin (:mod:`.twin_model`).
"""

from __future__ import annotations

import itertools
import logging
from typing import Dict, NamedTuple, Optional, Sequence, Tuple

import torch

from ..parallel import (AUTO, build_step, build_plan, chunk_length_option, default_placement,
                        micro_batches_option, parse_devices, parse_placement, placement_text)
from .schedule_simulator import CostModel, StepTime, device_flops, step_time
from .twin_model import batch

logger = logging.getLogger(__name__)

NOMINAL_BATCH = (64, 24, 24)  # sentences, source length, target length
SHARD_RESOLUTION = 100  # shard weights sum to about this


def placements(encoder_layers: int, decoder_layers: int, devices: int):
    """Every placement of the layers on ``devices`` devices as option text."""
    for assignment in itertools.product(range(devices), repeat=encoder_layers + decoder_layers):
        yield placement_text(assignment[:encoder_layers], assignment[encoder_layers:])


class Choice(NamedTuple):
    placement: str  # as --hybrid-placement text
    time: StepTime  # its predicted step
    default_time: StepTime  # the default placement's predicted step


def best_placement(model, cfg, devices: Sequence[torch.device], cost: Optional[CostModel] = None,
                   shape: Tuple[int, int, int] = NOMINAL_BATCH, limit: int = 4096) -> Choice:
    """The placement with the shortest predicted hybrid step: all placements
    when there are at most ``limit``, otherwise a local search from the
    default (move one layer at a time while that helps).  The default stays
    unless another is predicted to be faster."""
    cost = cost or CostModel()
    # With --hybrid-chunk-length auto, placements are compared at K chunks a
    # sequence (the chunk length is then chosen per batch for the placement).
    chunk_length = chunk_length_option(getattr(cfg, "hybrid_chunk_length", 0))
    chunk_length = 0 if chunk_length == AUTO else chunk_length
    sentences, source_length, target_length = shape
    net_input, target = batch(sentences, [source_length] * sentences, target_length)
    names = ",".join(str(d) for d in devices)
    layers = (cfg.encoder_layers, cfg.decoder_layers)
    # with --hybrid-micro-batches auto, compared at one micro-batch (the count is then chosen per batch)
    micro_batches = micro_batches_option(getattr(cfg, "hybrid_micro_batches", 1))
    micro_batches = 1 if micro_batches == AUTO else micro_batches
    mode = getattr(cfg, "hybrid_mode", "hybrid")
    times: Dict[str, StepTime] = {}

    def evaluate(placement: str) -> float:
        if placement not in times:
            plan = build_plan(names, placement, mode, *layers)
            times[placement] = step_time(model, plan, net_input, target, cost, chunk_length,
                                         micro_batches=micro_batches)
        return times[placement].total

    def balanced(encoder, decoder) -> Choice:
        """The layers' placement with the reverse directions and the shard
        sizes that give the shortest step (each reverse direction on any
        device; shards equal, evening out the devices' work, or part of the
        way between)."""
        bidirectional = sum(1 for layer in model.encoder.stack.layers if layer.bidirectional)
        best_text, best_total = placement_text(encoder, decoder), None
        for reverse in itertools.product(range(len(devices)), repeat=bidirectional if len(devices) > 1 else 0):
            plain = placement_text(encoder, decoder, reverse)
            candidates = [plain]
            if mode == "hybrid" and len(devices) > 1:
                plan = build_plan(names, plain, mode, *layers)
                even = balanced_shard_weights(model, plan, net_input, target, chunk_length, micro_batches)
                # and a quarter, half and three quarters of the way from equal shards to even work
                equal = SHARD_RESOLUTION // len(devices)
                candidates += [placement_text(encoder, decoder, reverse, even)]
                candidates += [placement_text(encoder, decoder, reverse,
                                              tuple((4 - j) * equal + j * weight for weight in even))
                               for j in (1, 2, 3)]
            for candidate in candidates:
                total = evaluate(candidate)
                if best_total is None or total < best_total * (1 - 1e-6):
                    best_text, best_total = candidate, total
        return best_text

    k = len(devices)
    encoder, decoder = default_placement(*layers, k)
    default = best = placement_text(encoder, decoder)
    best_total = evaluate(best)
    if k ** sum(layers) <= limit:
        for candidate in placements(*layers, k):
            total = evaluate(candidate)
            if total < best_total * (1 - 1e-6):
                best, best_total = candidate, total
        best = balanced(*parse_placement(best, *layers, k)[:2])
        return Choice(best, times[best], times[default])
    improved = True
    while improved:
        improved = False
        for part, index, device in itertools.product((0, 1), range(max(layers)), range(k)):
            current = [list(encoder), list(decoder)]
            if index >= len(current[part]) or current[part][index] == device:
                continue
            current[part][index] = device
            candidate = placement_text(*current)
            total = evaluate(candidate)
            if total < best_total:
                best, best_total, (encoder, decoder), improved = candidate, total, current, True
    best = balanced(encoder, decoder)
    return Choice(best, times[best], times[default])


def balanced_shard_weights(model, plan, net_input, target, chunk_length: int = 0, micro_batches: int = 1,
                           resolution: int = SHARD_RESOLUTION) -> Tuple[int, ...]:
    """Attention-softmax shard weights (summing to about ``resolution``)
    that even out the devices' floating-point work: each device's work
    outside the attention-softmax part is counted from the step's cells,
    and the part's work, which grows with the sentences of a shard, fills
    the least loaded devices up to a common level (none for a device
    already above it)."""
    built = build_step(model, plan, net_input, target, lambda *args: args, chunk_length, micro_batches)
    other = device_flops(built.step.cells, plan.size, exclude=("attention_softmax",))
    shards = sum(device_flops(built.step.cells, plan.size, kinds=("attention_softmax",)))
    level_low, level_high = min(other), max(other) + shards
    for _ in range(60):  # the level where the shards' work fills the gaps exactly
        level = (level_low + level_high) / 2
        if sum(max(0.0, level - load) for load in other) > shards:
            level_high = level
        else:
            level_low = level
    weights = [round(resolution * max(0.0, level_low - load) / shards) if shards else 1 for load in other]
    return tuple(weights) if sum(weights) else tuple([1] * plan.size)


def auto_placement(model, cfg) -> str:
    """The placement ``--hybrid-placement auto`` chooses for ``model`` on
    ``--hybrid-devices``, logged with its predicted gain."""
    cost_file = getattr(cfg, "hybrid_cost_model", "")
    cost = CostModel.load(cost_file) if cost_file else CostModel()
    choice = best_placement(model, cfg, parse_devices(cfg.hybrid_devices), cost)
    logger.info(
        "--hybrid-placement auto: %s (predicted step: %.1f%% of the default placement's, for a nominal "
        "batch of %d sentences of %d source and %d target tokens; %s)", choice.placement,
        100 * choice.time.total / choice.default_time.total, *NOMINAL_BATCH,
        f"cost model {cost_file}" if cost_file else "floating-point operations only",
    )
    return choice.placement
