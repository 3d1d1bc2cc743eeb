"""Splitting a batch across devices and bringing the shard results back.

The data-parallel halves of the scheme (the attention-softmax part in
``hybrid`` mode, the whole model in ``data`` mode) run one contiguous batch
shard per device, each with a replica of the parameters.  A replica on the
master's own device is the master module itself; replicas on other CUDA
devices come from :func:`torch.nn.parallel.replicate`, whose broadcast sums
the replicas' gradients back into the master parameters during backward.
Shard results are sums (losses, token counts), so adding them on one device
gives the single-device value.
"""

from __future__ import annotations

from typing import Callable, List, Sequence, Tuple

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn.parallel import replicate


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


def replicas_on(module: nn.Module, devices: Sequence[torch.device]) -> List[nn.Module]:
    """One module per entry of ``devices``, sharing the master's parameters
    (directly, or through a differentiable broadcast for other devices)."""
    home = next(module.parameters()).device
    others = []
    for device in devices:
        if device != home and device not in others:
            others.append(device)
    if not others:
        return [module] * len(devices)
    copies = replicate(module, [home] + others, detach=not torch.is_grad_enabled())
    by_device = {home: module}
    by_device.update(zip(others, copies[1:]))
    return [by_device[device] for device in devices]


def sum_on(results: Sequence[Tuple[Tensor, ...]], device: torch.device) -> Tuple[Tensor, ...]:
    """Element-wise sum of the shards' result tuples, on ``device``."""
    total = [value.to(device) for value in results[0]]
    for result in results[1:]:
        total = [acc + value.to(device) for acc, value in zip(total, result)]
    return tuple(total)


def sharded_sum(
    module: nn.Module,
    devices: Sequence[torch.device],
    batch_size: int,
    shard_fn: Callable[[nn.Module, slice, torch.device], Tuple[Tensor, ...]],
) -> Tuple[Tensor, ...]:
    """Run ``shard_fn(replica, rows, device)`` for one contiguous batch shard
    per device (fewer when the batch is smaller than the group) and add the
    results on the first device."""
    slices = batch_slices(batch_size, len(devices))
    devices = list(devices)[: len(slices)]
    results = [shard_fn(replica, rows, device)
               for rows, replica, device in zip(slices, replicas_on(module, devices), devices)]
    return sum_on(results, devices[0])
