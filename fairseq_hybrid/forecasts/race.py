"""Which way of training on N GPUs is fastest at a given global batch,
predicted: one GPU, DDP, one group of N, groups under DDP.

Many users keep their global batch when they add GPUs (convergence and the
recipe they reproduce cap it: GNMT v2 fixes 1,024 sentences on 1 to 8
GPUs), so DDP's per-GPU batch shrinks as N grows, and an LSTM at a small
batch uses a GPU badly (``lstm_batch_efficiency.json``).  A hybrid group
keeps every layer at the whole batch.  This module prices every candidate
on the same global batch with the schedule simulator, each group at its
best count of micro-batches, chunk length and placement
(``--hybrid-placement auto``'s search), so that ``benchmarks/fair_race.py``
and ``fairseq-hybrid-plan`` give one answer for one case.

Costs come as a function of K returning ``(group cost, one-device cost)``
(:func:`set_costs_of`), the shape of :func:`gpu_costs.set_costs`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..parallel import DevicePlanError, build_plan
from ..planning.chunk_choice import SOFTMAX_CHUNK_COUNTS
from ..planning.placement_search import best_placement
from ..planning.schedule_simulator import CostModel, StepTime
from ..planning.twin_model import batch
from .data_parallel_cost import data_parallel_step, gradient_bytes, owned_bytes
from .gpu_costs import STEP_US, best_chunk_length, predicted_step, set_costs, set_rate, set_tokens_per_s

__all__ = ["Costs", "set_costs_of", "searched", "best_group", "chosen", "uniform_batch", "Candidate", "race",
           "group_sizes_for", "plan_for", "fastest"]

Costs = Callable[[int], Tuple[CostModel, CostModel]]  # K -> (a group of K's cost model, one device's)


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


def searched(model, cfg, k: int, cost: CostModel, sample, micro_batches: int, lengths, replica_copies: bool = True):
    """``--hybrid-placement auto``'s choice for this count of micro-batches
    at the chunk length that suits the default placement best (auto keeps
    the default unless another is faster at that length), then that
    placement's own best chunk length: ``(placement, length, step)``."""
    default_length, _ = best_chunk_length(model, cfg, k, "hybrid", cost, *sample, lengths=lengths,
                                          micro_batches=micro_batches, replica_copies=replica_copies)
    asked = copy.copy(cfg)  # the options auto would see, the caller's left as they are
    asked.hybrid_chunk_length, asked.hybrid_micro_batches = default_length, micro_batches
    net_input, target = sample
    shape = (net_input["src_tokens"].size(0), net_input["src_tokens"].size(1), target.size(1))
    placement = best_placement(model, asked, [torch.device("cpu")] * k, cost, shape=shape)[0]
    length, step = best_chunk_length(model, cfg, k, "hybrid", cost, *sample, lengths=lengths, placement=placement,
                                     micro_batches=micro_batches, replica_copies=replica_copies)
    return placement, length, step


def best_group(model, cfg, k: int, cost: CostModel, sample, micro_batch_counts: Sequence[int], lengths,
               placement: Optional[str] = None, replica_copies: bool = True,
               softmax_chunks: Sequence[int] = SOFTMAX_CHUNK_COUNTS) -> Dict:
    """The group's shortest predicted step over the counts of micro-batches
    (each at its searched placement, unless ``placement`` is given) and
    the chunk lengths (``(0, 0)``: K chunks and one chunk a layer; None:
    ``--hybrid-chunk-length auto``'s candidates), then over
    ``softmax_chunks`` at the best of those (:func:`joined_softmax`);
    ``replica_copies=False``: the what-if of replicas whose copies cost
    nothing."""
    best = None
    if lengths is not None and tuple(lengths) == (0, 0):
        lengths = (0, max(sample[0]["src_tokens"].size(1), sample[0]["prev_output_tokens"].size(1)))
    for micro_batches in micro_batch_counts:
        if micro_batches > sample[1].size(0):
            continue  # more micro-batches than sentences: the engine refuses it
        if placement is None:
            picked, length, step = searched(model, cfg, k, cost, sample, micro_batches, lengths, replica_copies)
        else:
            picked = placement
            length, step = best_chunk_length(model, cfg, k, "hybrid", cost, *sample, lengths=lengths,
                                             placement=placement, micro_batches=micro_batches,
                                             replica_copies=replica_copies)
        if best is None or step.total < best["step"].total:
            best = {"step": step, "micro_batches": micro_batches, "chunk_length": length, "placement": picked,
                    "softmax_chunks": 1}
    return best if best is None else joined_softmax(model, cfg, k, cost, sample, best, softmax_chunks,
                                                    replica_copies)


def joined_softmax(model, cfg, k: int, cost: CostModel, sample, group: Dict, softmax_chunks: Sequence[int],
                   replica_copies: bool = True) -> Dict:
    """``group`` with the ``--hybrid-softmax-chunks`` among ``softmax_chunks``
    whose step is shortest at its other choices (fewer, larger
    attention-softmax cells: less host time, a later start); the one
    given when it is alone."""
    best, given = group, len(softmax_chunks) == 1
    for span in softmax_chunks:
        if span == group["softmax_chunks"]:
            continue
        step = predicted_step(model, cfg, k, "hybrid", cost, *sample, group["chunk_length"], group["placement"],
                              replica_copies=replica_copies, micro_batches=group["micro_batches"],
                              softmax_chunks=span)
        if given or step.total < best["step"].total:
            best = dict(group, step=step, softmax_chunks=span)
    return best


def chosen(group: Dict) -> Dict:
    """What :func:`best_group` chose for a group: micro-batches, chunk
    length, attention-softmax cells' chunks, placement (as the tables
    report them)."""
    return {"micro_batches": group["micro_batches"], "chunk_length": group["chunk_length"],
            "softmax_chunks": group.get("softmax_chunks", 1), "placement": group["placement"]}


def uniform_batch(sentences: int, source: int, target: int):
    """A batch of ``sentences`` sentences of ``source`` + ``target`` tokens."""
    return batch(sentences, [source] * sentences, target)


@dataclass
class Candidate:
    """One way of training on the GPUs: ``gpus`` of them, ``groups`` groups
    of ``group_size`` (a group size of 1 is plain DDP, one group and one GPU
    is one device), each GPU or group at ``sentences`` per step; its
    predicted ``step`` and what a group chose."""

    name: str
    gpus: int
    group_size: int
    groups: int
    sentences: int
    step: StepTime
    choice: Dict = field(default_factory=dict)

    def speedup_over(self, one: "Candidate") -> float:
        """Tokens/s over ``one``'s (both train the same global batch a step)."""
        return one.step.total / self.step.total

    def as_dict(self, one: "Candidate", ddp: Optional["Candidate"] = None) -> Dict:
        row = {"name": self.name, "gpus": self.gpus, "group_size": self.group_size, "groups": self.groups,
               "sentences_per_group": self.sentences, "step_ms": self.step.total * 1e3,
               "speedup": self.speedup_over(one), **self.choice}
        if ddp is not None:
            row["vs_ddp"] = ddp.step.total / self.step.total
        if self.step.parts:  # a process per device: what its own costs come to, milliseconds a step
            row["process_costs_ms"] = {name: seconds * 1e3 for name, seconds in self.step.parts.items()}
        return row


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


def race(model, cfg, costs: Costs, gpus: int, global_sentences: int, source: int, target: int,
         micro_batch_counts: Sequence[int] = (1, 2, 4), lengths=None,
         group_sizes: Optional[Sequence[int]] = None, progress: Callable[[str], None] = lambda text: None,
         memo: Optional[Dict] = None, rank_cost: Optional[CostModel] = None,
         replica_copies: bool = True, choices: Optional[Dict[int, Dict]] = None,
         softmax_chunks: Sequence[int] = SOFTMAX_CHUNK_COUNTS) -> List[Candidate]:
    """Every candidate on ``gpus`` GPUs at a global batch of
    ``global_sentences`` sentences of ``source`` + ``target`` tokens: one
    GPU at the whole batch (the reference), DDP at ``global_sentences /
    gpus`` per GPU, and for each group size K (default
    :func:`group_sizes_for`) ``gpus / K`` groups of K under DDP, each at
    ``global_sentences * K / gpus`` (one group of all GPUs when K =
    ``gpus``).  A size whose share is not a whole number of sentences, or
    that the model has too few layers for, is left out.  ``memo`` keeps groups priced by (K, sentences) across calls
    (the same group appears in several rows).  ``rank_cost``: one DDP
    rank's cost model where it is not one device's (CPU devices, where a
    rank runs beside the others and one device alone has every core), its
    link also pricing the groups' all-reduce.  ``replica_copies=False``:
    the what-if of a group whose replicas' copies cost nothing (the
    ceiling of any faster way to move them).  ``choices``: for a group
    size, the micro-batches, chunk length and placement to price as given
    (:func:`chosen`'s dict) instead of searching them (what
    ``fairseq-hybrid-plan --measure`` runs, priced again under a later
    calibration).  ``softmax_chunks``: the ``--hybrid-softmax-chunks`` a
    group may take."""
    memo = {} if memo is None or choices else memo
    model_bytes = gradient_bytes(model)
    one_cost = costs(1)[1]
    one = Candidate("one GPU", 1, 1, 1, global_sentences,
                    predicted_step(model, cfg, 1, "hybrid", one_cost, *uniform_batch(global_sentences, source, target)))
    rows = [one]
    if gpus == 1:
        return rows
    if global_sentences % gpus == 0:
        per_gpu = global_sentences // gpus
        rank = rank_cost or one_cost
        alone = predicted_step(model, cfg, 1, "hybrid", rank, *uniform_batch(per_gpu, source, target))
        rows.append(Candidate(f"DDP on {gpus}", gpus, 1, gpus, per_gpu,
                              data_parallel_step(alone, model_bytes, gpus, rank)))
    for k in group_sizes if group_sizes is not None else group_sizes_for(gpus):
        if gpus % k or (global_sentences * k) % gpus or plan_for(cfg, k) is None:
            continue
        sentences = global_sentences * k // gpus
        key = (k, sentences, source, target)
        group_cost = costs(k)[0]  # one cost model a size (it reads the host-cost file)
        if key not in memo:
            progress(f"pricing a group of {k} at {sentences} sentences")
            sample = uniform_batch(sentences, source, target)
            if choices and k in choices:
                given = choices[k]
                memo[key] = best_group(model, cfg, k, group_cost, sample, [given["micro_batches"]],
                                       [given["chunk_length"]], given["placement"], replica_copies,
                                       [given.get("softmax_chunks", 1)])
            else:
                memo[key] = best_group(model, cfg, k, group_cost, sample, micro_batch_counts, lengths,
                                       replica_copies=replica_copies, softmax_chunks=softmax_chunks)
        group = memo[key]
        groups = gpus // k
        if groups == 1:
            rows.append(Candidate(f"one group of {k}", gpus, k, 1, sentences, group["step"], chosen(group)))
        else:
            owned = max(owned_bytes(model, cfg, k, group["placement"]))
            step = data_parallel_step(group["step"], owned, groups, rank_cost or group_cost)
            rows.append(Candidate(f"{groups} groups of {k} under DDP", gpus, k, groups, sentences, step,
                                  chosen(group)))
    return rows


def fastest(rows: Sequence[Candidate]) -> Candidate:
    """The candidate with the shortest step (the first on a tie)."""
    return min(rows, key=lambda row: row.step.total)
