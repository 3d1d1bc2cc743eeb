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


def sum_on(results: Sequence[Tuple[Tensor, ...]], device: torch.device) -> Tuple[Tensor, ...]:
    """Element-wise sum of the shards' result tuples, on ``device``."""
    total = [arrive(value, device) for value in results[0]]
    for result in results[1:]:
        total = [acc + arrive(value, device) for acc, value in zip(total, result)]
    return tuple(total)
