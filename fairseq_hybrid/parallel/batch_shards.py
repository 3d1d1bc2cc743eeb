"""Splitting a batch into shards and adding the shards' results back.

The data-parallel halves of the scheme (the attention-softmax part in
``hybrid`` mode, the whole model in ``data`` mode) run one contiguous batch
shard per device; micro-batches (``--hybrid-micro-batches``) are
contiguous slices with near-equal token counts.  Shard results are sums (losses, token counts), so adding
them on one device gives the single-device value.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
from torch import Tensor

from .transfer import arrive


def batch_slices(batch_size: int, count: int) -> List[slice]:
    """``count`` contiguous, near-equal slices of ``range(batch_size)``; a
    batch smaller than ``count`` gives fewer, never an empty one."""
    count = max(1, min(count, batch_size))
    base, extra = divmod(batch_size, count)
    slices, start = [], 0
    for index in range(count):
        stop = start + base + (1 if index < extra else 0)
        slices.append(slice(start, stop))
        start = stop
    return slices


def token_balanced_slices(tokens: Sequence[int], count: int) -> List[slice]:
    """``count`` contiguous slices of the rows whose token counts
    (``tokens``, one per row) are as near equal as contiguous cuts make
    them: each cut at the row where the running total first reaches its
    share.  Never an empty slice; fewer rows than ``count`` give fewer."""
    rows = len(tokens)
    count = max(1, min(count, rows))
    total = float(sum(tokens)) or float(rows)
    weights = list(tokens) if sum(tokens) else [1] * rows
    slices, start, running = [], 0, 0.0
    for index in range(count - 1):
        share = total * (index + 1) / count
        stop = start + 1  # at least one row each
        running += weights[start]
        while stop < rows - (count - 1 - index) and running + weights[stop] / 2 < share:
            running += weights[stop]
            stop += 1
        slices.append(slice(start, stop))
        start = stop
    slices.append(slice(start, rows))
    return slices


def sum_on(results: Sequence[Tuple[Tensor, ...]], device: torch.device) -> Tuple[Tensor, ...]:
    """Element-wise sum of the shards' result tuples, on ``device``."""
    total = [arrive(value, device) for value in results[0]]
    for result in results[1:]:
        total = [acc + arrive(value, device) for acc, value in zip(total, result)]
    return tuple(total)
