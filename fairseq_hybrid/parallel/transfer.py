"""The one way a tensor moves to another device of a group.

Every move of the engine goes through :func:`arrive`, so that the
virtual-device harness (``fairseq_hybrid.harness.virtual_devices``) sees each one,
and so that on CUDA each move is ordered after the work that made the
tensor and before the work that reads it:

* ``event``, recorded by the producer after it made the tensor, is waited
  for on the stream that reads or copies it (no host synchronisation);
* a copy between two GPUs runs on a copy stream of the calling worker for
  the source device (``copy_`` runs a cross-device copy on the *current*
  stream of the source device, which on a worker thread is that device's
  default stream: every worker's copies from one device would queue there
  one behind the other, and behind the caller's work);
* ``record_stream`` tells the caching allocator that the copy stream uses
  the source tensor, so its memory is not reused before the copy is done.

A host tensor bound for a device that queues work (CUDA, virtual
devices) is copied from pinned memory, so that the copy is queued rather
than waited for (:func:`pinned`).  On plain CPU devices a move is
``tensor.to(device)``: nothing when the device is the same (every plain
``cpu``).  Virtual devices have virtual
streams (:mod:`.streams`), so the same lines run there as on CUDA and are
checked.
"""

from __future__ import annotations

import threading
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from . import streams

_local = threading.local()


def _thread_stream(device: torch.device, purpose: str):
    """The calling thread's ``purpose`` stream on ``device`` (one per thread,
    device and purpose, made once per stream scope: CUDA or one virtual
    checker; None without streams)."""
    streams_made: Dict[Tuple[object, int, str], object] = getattr(_local, "streams", None) or {}
    _local.streams = streams_made
    key = (streams.scope(device), device.index, purpose)
    if key not in streams_made:
        streams_made[key] = streams.new_stream(device, f"{purpose} stream of {threading.current_thread().name} "
                                                       f"on {device}")
    return streams_made[key]


def _copy_stream(source: torch.device):
    """The calling thread's copy stream on ``source``."""
    return _thread_stream(source, "copy")


def copies_done(source: torch.device):
    """An event after every copy from ``source`` that the calling thread
    queued so far (None without streams): whoever writes the copied tensors
    next waits for it."""
    stream = _copy_stream(source)
    return None if stream is None else stream.record_event()


def prefetch_stream(device: torch.device):
    """The calling thread's stream on ``device`` for copies made ahead of
    their use (:meth:`.replicas.Replicas.prefetch`): a copy that arrives on
    it holds up nothing on ``device`` until a reader waits for its event."""
    return _thread_stream(device, "prefetch")


def record_event(device: torch.device):
    """An event after the work queued so far on ``device``'s current stream
    (None on CPU, where work is done when the call returns)."""
    return streams.record_event(device)


_only: Optional[Tuple[torch.device, ...]] = None  # a stage's process: the devices it may touch


def only_devices(devices) -> None:
    """In a stage's process (:mod:`.stage`): moves to any other device are
    left undone (the step's builder puts the batch on every device, and
    the cells that would read it there run in other processes), so a stage
    never opens another GPU's context."""
    global _only
    _only = tuple(devices)


def arrive(value: Tensor, device: torch.device, event=None) -> Tensor:
    """``value`` ready for the calling thread's current stream on ``device``.
    ``event``: recorded after ``value`` was made (None: made by work already
    ordered before the caller's, such as the main thread's before a job)."""
    if _only is not None and device not in _only:
        return value
    if value.device == device:
        if event is not None:  # made on another worker's stream of this device
            stream = streams.current_stream(device)
            stream.wait_event(event)
            streams.record_stream(value, stream)
        return value
    if not (streams.has_streams(device) and streams.has_streams(value.device)):
        if event is not None:
            event.synchronize()  # a GPU tensor read on the host
        if is_host(value) and streams.has_streams(device):
            # from pinned host memory: queued on the destination's current stream (the caching host
            # allocator keeps the memory until the copy is done), where from pageable memory it waits
            return pinned(value).to(device, non_blocking=True)
        return value.to(device)
    source = value.device
    stream = _copy_stream(source)
    if event is not None:
        stream.wait_event(event)
    else:
        stream.wait_stream(streams.default_stream(source))
    with streams.use_stream(stream):
        moved = value.to(device, non_blocking=True)  # on `stream`; the destination's current stream waits for it
    streams.record_stream(value, stream)
    return moved


def to_devices(value: Optional[Tensor], devices) -> Dict[torch.device, Tensor]:
    """``value`` on each of ``devices`` (one copy per distinct device), for
    tensors the main thread prepares before a step's jobs start."""
    if value is None:
        return {}
    if is_host(value) and any(streams.has_streams(device) for device in devices):
        value = pinned(value)  # once for every device: each copy queued (see arrive)
    copies: Dict[torch.device, Tensor] = {}
    for device in devices:
        if _only is not None and device not in _only:
            copies.setdefault(device, value)
        elif device not in copies:
            copies[device] = value if value.device == device else value.to(device, non_blocking=True)
    return copies


def is_host(tensor: Tensor) -> bool:
    """Whether ``tensor`` is in host memory (a plain ``cpu`` tensor, not a
    virtual device's ``cpu:N``)."""
    return tensor.device.type == "cpu" and tensor.device.index is None


def pinned(tensor: Tensor) -> Tensor:
    """Host ``tensor`` in pinned memory, contiguous (itself where it is
    already).  Contiguous, because a copy from a strided host tensor goes
    through a contiguous temporary in pageable memory first
    (``copy_requires_temporaries`` in ``cuda/Copy.cu``), which waits."""
    if tensor.is_pinned() and tensor.is_contiguous():
        return tensor
    return tensor.contiguous().pin_memory()
