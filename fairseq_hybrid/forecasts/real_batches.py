"""Races on real batches: the lengths of a corpus's batches as fairseq's
sampler draws them, priced by the simulator (``benchmarks/fair_race.py``
and ``benchmarks/fair_race_global.py``): a batch made of several, a
batch cut in K, and DDP waiting for its slowest rank."""

from __future__ import annotations

from typing import List, Sequence, Tuple

from ..parallel import batch_slices
from ..planning.schedule_simulator import CostModel
from ..planning.twin_model import batch
from .data_parallel_cost import data_parallel_step_of

Lengths = Tuple[List[int], List[int]]  # a batch's source and target lengths


def lengths_of(samples, pad: int) -> List[Lengths]:
    """Each drawn batch's source and target lengths."""
    return [(sample["net_input"]["src_lengths"].tolist(), sample["target"].ne(pad).sum(1).tolist())
            for sample in samples]


def as_batch(parts: Sequence[Lengths]):
    """One batch of the sentences of ``parts`` (merged: padded to the
    longest)."""
    sources = [length for part in parts for length in part[0]]
    targets = [length for part in parts for length in part[1]]
    return batch(len(sources), sources, max(targets), targets)


def tokens_of(parts: Sequence[Lengths]) -> int:
    return sum(sum(sources) + sum(targets) for sources, targets in parts)


def ddp_on_real_batches(ones, parts, k: int, steps: int, model_bytes: float, one_cost: CostModel) -> float:
    """DDP's tokens/s over one device's on real batches: ``steps`` steps of
    K ``parts`` each, every step waiting for its slowest rank (``ones``:
    one device's step on each part)."""
    one_rate = tokens_of(parts) / sum(one.total for one in ones)
    ddp_seconds = sum(data_parallel_step_of(ones[i * k:(i + 1) * k], model_bytes, one_cost).total
                      for i in range(steps))
    return tokens_of(parts[:steps * k]) / ddp_seconds / one_rate


def split_rows(part: Lengths, count: int) -> List[Lengths]:
    """A batch's sentences cut into ``count`` consecutive near-equal pieces
    (a DDP rank's, or a group's, share of a global batch)."""
    return [(part[0][rows], part[1][rows]) for rows in batch_slices(len(part[0]), count)]
