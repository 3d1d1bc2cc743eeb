"""Splitting a batch into shards and adding the shards' results back.

The data-parallel halves of the scheme (the attention-softmax part in
``hybrid`` mode, the whole model in ``data`` mode) run one contiguous batch
shard per device.  Shard results are sums (losses, token counts), so adding
them on one device gives the single-device value.
"""

from __future__ import annotations

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
    slices, start = [], 0
    for size in sizes:
        slices.append(slice(start, start + size))
        start += size
    return slices


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
