"""Streams and events for the engine, on every kind of device it runs on.

The engine orders work between a worker's stream, its copy streams and the
caller's default stream with events, ``wait_event``, ``wait_stream`` and
``record_stream`` (:mod:`.transfer`, :mod:`.worker`).  It makes and uses
them only through this module, so that the same lines run on three kinds
of device:

* ``cuda:N``: ``torch.cuda``'s own streams and events, exactly as before;
* plain CPU (``cpu``): no streams at all (every op is done when it
  returns); the functions answer ``None`` and do nothing;
* virtual devices (``cpu:N`` under ``fairseq_hybrid.harness.virtual_devices``):
  the harness's virtual streams and events (:mod:`fairseq_hybrid.harness.virtual_streams`),
  which have the same method names and check every op's reads and writes
  against what those lines ordered, so that a missing wait fails a CPU test
  instead of giving silent wrong numbers on a GPU.

A stream object is ``None`` on plain CPU; callers test for it as before.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, ContextManager, Optional

import torch
from torch import Tensor

# Set by fairseq_hybrid.harness.virtual_streams: the calling thread's virtual stream
# checker, or None (the parallel package does not import the test harness).
virtual_checker: Callable[[], Optional[object]] = lambda: None


def _virtual(device: torch.device):
    if device.type != "cpu" or device.index is None:
        return None
    return virtual_checker()


def has_streams(device: torch.device) -> bool:
    """Whether work on ``device`` is queued on streams (CUDA, virtual
    devices) rather than done when the call returns (plain CPU, host memory)."""
    return device.type == "cuda" or _virtual(device) is not None


def scope(device: torch.device) -> Optional[object]:
    """What streams made for ``device`` belong to: ``"cuda"``, the virtual
    checker running now, or None (no streams).  Callers that keep streams
    from call to call key them by it."""
    if device.type == "cuda":
        return "cuda"
    return _virtual(device)


def new_stream(device: torch.device, name: str = "stream"):
    """A new stream on ``device`` (None without streams); ``name`` appears
    in the virtual checker's reports."""
    if device.type == "cuda":
        return torch.cuda.Stream(device)
    checker = _virtual(device)
    return None if checker is None else checker.new_stream(device.index, name)


def current_stream(device: torch.device):
    if device.type == "cuda":
        return torch.cuda.current_stream(device)
    checker = _virtual(device)
    return None if checker is None else checker.current_stream(device.index)


def default_stream(device: torch.device):
    if device.type == "cuda":
        return torch.cuda.default_stream(device)
    checker = _virtual(device)
    return None if checker is None else checker.default_stream(device.index)


def use_stream(stream) -> ContextManager:
    """Make ``stream`` the calling thread's current stream on its device
    for the block (nothing when ``stream`` is None)."""
    if stream is None:
        return nullcontext()
    if isinstance(stream, torch.cuda.Stream):
        return torch.cuda.stream(stream)
    return stream.checker.using(stream)


def record_event(device: torch.device):
    """An event after the work queued so far on ``device``'s current stream
    (None without streams, where work is done when the call returns)."""
    if device.type == "cuda":
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        return event
    checker = _virtual(device)
    return None if checker is None else checker.current_stream(device.index).record_event()


def record_stream(tensor: Tensor, stream) -> None:
    """Tell the allocator that ``stream`` uses ``tensor``'s memory, so that
    it is not reused before the work queued on ``stream`` is done."""
    if stream is None:
        return
    if isinstance(stream, torch.cuda.Stream):
        tensor.record_stream(stream)
    else:
        stream.checker.record_stream(tensor, stream)
