"""The batch as the host holds it, so that staging a step never waits for
a device.

A step's host-side layout (the length order, packed layouts, reversal
and restore indices, the target positions that count, the micro-batches'
rows) is made on the host.  Made from a batch already on a GPU it would
wait for that GPU twice: reading lengths back (``.cpu()``, ``nonzero``,
``.item()``) waits for every kernel queued before it, and sending the
layout back from pageable memory waits again (a ``cudaMemcpyAsync`` from
pageable memory synchronises; PyTorch's ``copy_`` records an event for
the caching host allocator only from pinned memory, ``cuda/Copy.cu``).

So the trainer keeps the batch it had on the host (fairseq moves a copy
to ``cuda:0``): :func:`keep_on_host` pins it where the group's devices
queue work on streams, lets fairseq move it, and remembers which host
tensor each moved one came from; :func:`host_of` answers the step with
it.  What the step makes on the host is copied from pinned memory by the
engine's one transfer function (:mod:`.stream_handoff`), so that each copy is
queued, not waited for.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Dict, Iterable, Tuple

import torch
from torch import Tensor

from .stream_handoff import has_streams, is_host, pinned

__all__ = ["keep_on_host", "host_of", "on_host", "queues_copies", "remember"]

_REMEMBERED = 64  # moved tensors remembered (a sample has 4 or 5; fairseq prepares one at a time)
_host: "OrderedDict[int, Tuple[Tensor, Tensor]]" = OrderedDict()  # id(moved): (moved, its host original)


def queues_copies(devices: Iterable[torch.device]) -> bool:
    """Whether a copy from pinned host memory to one of ``devices`` is
    queued on a stream (CUDA, virtual devices) rather than done at once."""
    return any(has_streams(torch.device(device)) for device in devices)


def _tensors(sample) -> Dict[str, Tensor]:
    """The sample's tensors by path (``net_input.src_tokens``, ``target``)."""
    found: Dict[str, Tensor] = {}

    def walk(value, path):
        if torch.is_tensor(value):
            found[path] = value
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{path}.{key}" if path else str(key))

    walk(sample, "")
    return found


def remember(host_sample, moved_sample) -> None:
    """Each tensor of ``moved_sample`` came from the tensor at the same
    place in ``host_sample`` (itself a moved copy of a host tensor, or one)."""
    moved = _tensors(moved_sample)
    for path, original in _tensors(host_sample).items():
        copy = moved.get(path)
        if copy is None or copy is original or copy.dtype != original.dtype or copy.shape != original.shape:
            continue
        host = host_of(original, wait=False)
        _host[id(copy)] = (copy, original if host is None else host)
        _host.move_to_end(id(copy))
        while len(_host) > _REMEMBERED:
            _host.popitem(last=False)


def keep_on_host(sample, devices, move: Callable):
    """``move(sample)`` (fairseq's move of a batch to ``cuda:0``) with the
    batch pinned first where ``devices`` queue copies, so that the move is
    queued too, and its host tensors remembered for :func:`host_of`."""
    pin = queues_copies(devices)
    if pin and isinstance(sample, dict):
        sample = _pin_sample(sample)
    moved = move(sample)
    remember(sample, moved[0] if isinstance(moved, tuple) else moved)
    return moved


def _pin_sample(sample):
    if torch.is_tensor(sample):
        return pinned(sample) if is_host(sample) else sample
    if isinstance(sample, dict):
        return {key: _pin_sample(value) for key, value in sample.items()}
    return sample


def host_of(tensor: Tensor, wait: bool = True):
    """The host tensor ``tensor`` was moved from (``tensor`` itself when it
    is one); else, with ``wait``, a copy to the host (which waits for the
    device: a batch handed over by a caller other than fairseq's trainer),
    or None without it."""
    if is_host(tensor):
        return tensor
    entry = _host.get(id(tensor))
    if entry is not None and entry[0] is tensor:
        return entry[1]
    return tensor.cpu() if wait else None


def on_host(net_input: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """The tensors of ``net_input``, each its host one (:func:`host_of`)."""
    return {key: host_of(value) for key, value in net_input.items() if torch.is_tensor(value)}
