"""Splitting a batch into shards and adding the shards' results back.

The data-parallel halves of the scheme (the attention-softmax part in
``hybrid`` mode, the whole model in ``data`` mode) run one contiguous batch
shard per device.  Shard results are sums (losses, token counts), so adding
them on one device gives the single-device value.
"""

from __future__ import annotations

import heapq
from functools import lru_cache
from typing import List, Sequence, Tuple

import torch
from torch import Tensor

from .transfer import arrive


def weighted_slices(batch_size: int, weights: Sequence[int]) -> List[slice]:
    """Contiguous slices of ``range(batch_size)``, one per weight, their
    sizes in proportion (largest remainders round up, the first among
    equals first; a slice may be empty)."""
    total = sum(weights)
    exact = [batch_size * weight / total for weight in weights]
    sizes = [int(value) for value in exact]
    for index in sorted(range(len(weights)), key=lambda i: (sizes[i] - exact[i], i))[: batch_size - sum(sizes)]:
        sizes[index] += 1
    return _consecutive(sizes)


def _consecutive(sizes: Sequence[int]) -> List[slice]:
    """Slices of the given sizes, one after another from row 0."""
    slices, start = [], 0
    for size in sizes:
        slices.append(slice(start, start + size))
        start += size
    return slices


@lru_cache(maxsize=4096)
def dealt_rows(rows: int, weights: Tuple[int, ...]) -> Tuple[int, ...]:
    """How many of a batch's first ``rows`` rows each weight gets when the
    rows are dealt one at a time to the weight furthest below its share
    (the one with the least ``(dealt + 1/2) / weight``, the first among
    equals: Webster's divisor method, round-robin for equal weights).
    Dealing never takes a row back, so the counts for more rows are never
    below those for fewer: the pieces of a batch cut into micro-batches
    each get their difference, and over the whole batch every weight gets
    its share to within a row, where rounding each piece on its own gives
    the same weights the same extra row in every piece."""
    if len(set(weights)) == 1 and weights[0] > 0:
        return tuple((rows - index + len(weights) - 1) // len(weights) for index in range(len(weights)))
    dealt = [0] * len(weights)
    queue = [(0.5 / weight, index) for index, weight in enumerate(weights) if weight > 0]
    heapq.heapify(queue)
    for _ in range(rows):
        _, index = heapq.heappop(queue)
        dealt[index] += 1
        heapq.heappush(queue, ((dealt[index] + 0.5) / weights[index], index))
    return tuple(dealt)


def dealt_slices(first_row: int, rows: int, weights: Sequence[int]) -> List[slice]:
    """Contiguous slices of ``range(rows)``, one per weight, for the rows
    ``first_row`` to ``first_row + rows - 1`` of a batch: each weight's
    share of them as :func:`dealt_rows` deals the batch (a slice may be
    empty)."""
    before, after = dealt_rows(first_row, tuple(weights)), dealt_rows(first_row + rows, tuple(weights))
    return _consecutive([high - low for low, high in zip(before, after)])


def batch_slices(batch_size: int, count: int) -> List[slice]:
    """``count`` contiguous, near-equal slices of ``range(batch_size)``; a
    batch smaller than ``count`` gives fewer, never an empty one."""
    slices = [rows for rows in weighted_slices(batch_size, [1] * max(1, count)) if rows.stop > rows.start]
    return slices or [slice(0, batch_size)]


def sum_on(results: Sequence[Tuple[Tensor, ...]], device: torch.device) -> Tuple[Tensor, ...]:
    """Element-wise sum of the shards' result tuples, on ``device``."""
    total = [arrive(value, device) for value in results[0]]
    for result in results[1:]:
        total = [acc + arrive(value, device) for acc, value in zip(total, result)]
    return tuple(total)
