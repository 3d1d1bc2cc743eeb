"""A group's best choices under a cost model: the count of micro-batches,
the chunk length, the placement (``--hybrid-placement auto``'s search) and
the attention-softmax cells' chunks whose simulated step is shortest, as
:class:`.ways.Group` prices itself."""

from __future__ import annotations

import copy
from typing import Dict, Optional, Sequence

import torch

from ..forecasts.gpu_costs import best_chunk_length, predicted_step
from ..planning.chunk_choice import SOFTMAX_CHUNK_COUNTS
from ..planning.placement_search import best_placement
from ..planning.schedule_simulator import CostModel

__all__ = ["searched", "best_group", "joined_softmax", "chosen"]


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
