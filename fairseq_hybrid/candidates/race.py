"""Which way of training on N GPUs is fastest at a given global batch,
predicted: one GPU, DDP, one group of N, groups under DDP.

Many users keep their global batch when they add GPUs (convergence and the
recipe they reproduce cap it: GNMT v2 fixes 1,024 sentences on 1 to 8
GPUs), so DDP's per-GPU batch shrinks as N grows, and an LSTM at a small
batch uses a GPU badly (``lstm_batch_efficiency.json``).  A hybrid group
keeps every layer at the whole batch.  This module builds every way
(:mod:`.ways`) on the same global batch and has each price itself with the
schedule simulator, each group at its best count of micro-batches, chunk
length and placement (``--hybrid-placement auto``'s search,
:mod:`.group_search`), so that ``benchmarks/fair_race.py`` and
``fairseq-hybrid-plan`` give one answer for one case.

Costs come as a function of K returning ``(group cost, one-device cost)``
(:func:`set_costs_of`), the shape of :func:`gpu_costs.set_costs`.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Sequence

from ..forecasts.workload import Batch
from ..parallel import DevicePlanError, build_plan
from ..planning.chunk_choice import SOFTMAX_CHUNK_COUNTS
from ..planning.schedule_simulator import CostModel, StepTime
from ..forecasts.gpu_costs import STEP_US, set_costs, set_rate, set_tokens_per_s
from .ways import Candidate, Costs, DataParallel, Group, GroupsUnderDDP, OneDevice, Pricing

__all__ = ["Costs", "set_costs_of", "Candidate", "candidates", "race", "group_sizes_for", "plan_for", "fastest"]


def set_costs_of(name: str, model, cfg, reference_sample, host_cost: Optional[str], host_model: str,
                 tokens_per_s: Optional[float] = None) -> Costs:
    """The named cost set (``p100``, ``a100``, ``v100``) under
    ``host_model``, its FLOP rate solved on one device's step of
    ``reference_sample`` for ``tokens_per_s`` (None: the set's published
    one-GPU figure; the P100 set has a rate of its own)."""
    tokens_per_s = set_tokens_per_s(name, tokens_per_s)
    step_us = STEP_US[name]
    rate = set_rate(name, model, cfg, reference_sample, host_cost, step_us, host_model, tokens_per_s)
    return lambda k: set_costs(name, host_cost, k, step_us, rate, host_model)


def group_sizes_for(gpus: int, sizes: Sequence[int] = (2, 4, 8)) -> List[int]:
    """Group sizes that divide ``gpus``: one group of all of them when
    ``gpus`` is among ``sizes``, and groups under DDP of each smaller size."""
    return [size for size in sizes if size <= gpus and gpus % size == 0]


def plan_for(cfg, k: int):
    """The default plan of a group of ``k`` CPU devices for the model, or
    None where the engine refuses it (more devices than the model has
    layers for)."""
    try:
        return build_plan(",".join(["cpu"] * k), "", "hybrid", cfg.encoder_layers, cfg.decoder_layers)
    except DevicePlanError:
        return None


def candidates(cfg, gpus: int, global_sentences: int, group_sizes: Optional[Sequence[int]] = None,
               workers: Optional[str] = None) -> List[Candidate]:
    """Every way to train ``global_sentences`` a step on ``gpus`` devices,
    unpriced: one device at the whole batch (the reference), DDP at
    ``global_sentences / gpus`` a device, and for each group size K
    (default :func:`group_sizes_for`) ``gpus / K`` groups of K (with
    ``workers``), each at ``global_sentences * K / gpus``.  A size whose
    share is not a whole number of sentences, or that the model has too
    few layers for, is left out."""
    ways: List[Candidate] = [OneDevice(1, 1, 1, global_sentences)]
    if gpus == 1:
        return ways
    if global_sentences % gpus == 0:
        ways.append(DataParallel(gpus, 1, gpus, global_sentences // gpus))
    for k in group_sizes if group_sizes is not None else group_sizes_for(gpus):
        if gpus % k or (global_sentences * k) % gpus or plan_for(cfg, k) is None:
            continue
        way = Group if gpus == k else GroupsUnderDDP
        ways.append(way(gpus, k, gpus // k, global_sentences * k // gpus, workers))
    return ways


def race(model, cfg, costs: Costs, gpus: int, global_sentences: int, source: int, target: int,
         micro_batch_counts: Sequence[int] = (1, 2, 4), lengths=None,
         group_sizes: Optional[Sequence[int]] = None, progress: Callable[[str], None] = lambda text: None,
         memo: Optional[Dict] = None, rank_cost: Optional[CostModel] = None,
         replica_copies: bool = True, choices: Optional[Dict[int, Dict]] = None,
         softmax_chunks: Sequence[int] = SOFTMAX_CHUNK_COUNTS, workers: Optional[str] = None,
         batches: Optional[Sequence[Batch]] = None) -> List[Candidate]:
    """Every candidate (:func:`candidates`) at a global batch of
    ``global_sentences`` sentences of ``source`` + ``target`` tokens,
    each priced by itself (:class:`.ways.Pricing` holds what with).
    ``memo`` keeps groups priced by (K, sentences) across calls (the same
    group appears in several rows).  ``rank_cost``: one DDP rank's cost
    model where it is not one device's (CPU devices, where a rank runs
    beside the others and one device alone has every core), its link also
    pricing the groups' all-reduce.  ``replica_copies=False``: the what-if
    of a group whose replicas' copies cost nothing (the ceiling of any
    faster way to move them).  ``choices``: for a group size, the
    micro-batches, chunk length and placement to price as given
    (:func:`.group_search.chosen`'s dict) instead of searching them (what
    ``fairseq-hybrid-plan --measure`` runs, priced again under a later
    calibration).  ``softmax_chunks``: the ``--hybrid-softmax-chunks`` a
    group may take.  ``workers``: the groups' (named in their rows).
    ``batches``: the command's own; each way chooses on the batch of the
    mean shape, then is priced on every one of them (:func:`on_batches`)."""
    pricing = Pricing(model, cfg, costs, source, target, rank_cost, micro_batch_counts, lengths, replica_copies,
                      choices, softmax_chunks, {} if memo is None or choices else memo, progress)
    ways = [way.price(pricing) for way in candidates(cfg, gpus, global_sentences, group_sizes, workers)]
    if batches:
        for way in ways:
            way.step = on_batches(way, pricing, batches, global_sentences)
    return ways


def on_batches(way: Candidate, pricing: Pricing, batches: Sequence[Batch], global_sentences: int) -> StepTime:
    """``way``'s mean step over ``batches`` (the command's own), each at
    its share of the batch's sentences, its choice kept: a batch's widths
    and sentence count set a group's chunks and a cell's fixed costs, so
    the batch of the mean shape prices real batches short
    (docs/benchmarks.md, "Asking for one's own case")."""
    steps = []
    for real in batches:
        share = max(1, len(real.sources) * way.sentences // global_sentences)
        given = {way.group_size: way.choice} if way.choice else pricing.choices
        priced = replace(pricing, source=max(real.sources), target=real.width, real=real, choices=given, memo={})
        steps.append(replace(way, sentences=share, step=None).price(priced).step)
    return StepTime(*(statistics.mean(getattr(step, name) for step in steps)
                      for name in ("forward", "backward", "extra")),
                    {name: statistics.mean(step.parts.get(name, 0.0) for step in steps) for name in steps[0].parts})


def fastest(rows: Sequence[Candidate]) -> Candidate:
    """The candidate with the shortest step (the first on a tie)."""
    return min(rows, key=lambda row: row.step.total)
