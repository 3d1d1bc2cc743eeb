"""Moving a tensor between a group's devices in stream order: the engine's
streams and events, and its one transfer function.

Streams and events exist on three kinds of device, and the engine makes
and uses them only here, so that the same lines run on all three:
``cuda:N`` (``torch.cuda``'s own); plain ``cpu`` (none: every op is done
when it returns, the functions answer ``None``); and virtual devices
(``cpu:N`` under ``fairseq_hybrid.harness.virtual_devices``), whose streams
check every op's reads and writes against what these lines ordered, so a
missing wait fails a CPU test instead of giving wrong numbers on a GPU.

Every move goes through :func:`arrive`, ordered after the work that made
the tensor and before the work that reads it:

* ``event``, recorded by the producer, is waited for on the stream that
  reads or copies the tensor (no host synchronisation);
* a copy between two GPUs runs on a copy stream of the calling worker for
  the source device (``copy_`` runs a cross-device copy on the *current*
  stream of the source device, which on a worker thread is its default
  stream: every worker's copies from one device would queue there, behind
  the caller's work);
* ``record_stream`` keeps the caching allocator from reusing the source's
  memory before the copy is done;
* a host tensor bound for a device that queues work is copied from pinned,
  contiguous memory, so that the copy is queued, not waited for
  (:func:`pinned`).
"""

from __future__ import annotations

import threading
from contextlib import nullcontext
from typing import Callable, ContextManager, Dict, Optional, Tuple

import torch
from torch import Tensor

# Set by fairseq_hybrid.harness.virtual_streams: the calling thread's virtual stream
# checker, or None (the parallel package does not import the test harness).
virtual_checker: Callable[[], Optional[object]] = lambda: None


# Set by fairseq_hybrid.harness.virtual_devices: tags a tensor that another process made on a virtual
# device and shared with this one (its storage mapped here, which tells nothing of the device).
virtual_shared: Callable[[Tensor, torch.device], Tensor] = lambda tensor, device: tensor


def shared_from(tensor: Tensor, device: torch.device) -> Tensor:
    """``tensor``, which another process made on ``device`` and shared
    with this one: a GPU's tensor says its device itself (torch's CUDA
    reductions), a plain CPU's is host memory either way; on virtual
    devices the harness tags it with ``device``."""
    return virtual_shared(tensor, device) if _virtual_name(device) else tensor


def _virtual_name(device: torch.device) -> bool:
    """``cpu:N``: a virtual device where the harness is on, plain CPU otherwise."""
    return device.type == "cpu" and device.index is not None


def _virtual(device: torch.device):
    return virtual_checker() if _virtual_name(device) else None


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


_local = threading.local()


def _thread_stream(device: torch.device, purpose: str):
    """The calling thread's ``purpose`` stream on ``device`` (one per thread,
    device and purpose, made once per stream scope: CUDA or one virtual
    checker; None without streams)."""
    streams_made: Dict[Tuple[object, int, str], object] = getattr(_local, "streams", None) or {}
    _local.streams = streams_made
    key = (scope(device), device.index, purpose)
    if key not in streams_made:
        streams_made[key] = new_stream(device, f"{purpose} stream of {threading.current_thread().name} on {device}")
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
            stream = current_stream(device)
            stream.wait_event(event)
            record_stream(value, stream)
        return value
    if not (has_streams(device) and has_streams(value.device)):
        if event is not None:
            event.synchronize()  # a GPU tensor read on the host
        if is_host(value) and has_streams(device):
            # from pinned host memory: queued on the destination's current stream (the caching host
            # allocator keeps the memory until the copy is done), where from pageable memory it waits
            return pinned(value).to(device, non_blocking=True)
        return value.to(device)
    source = value.device
    stream = _copy_stream(source)
    if event is not None:
        stream.wait_event(event)
    else:
        stream.wait_stream(default_stream(source))
    with use_stream(stream):
        moved = value.to(device, non_blocking=True)  # on `stream`; the destination's current stream waits for it
    record_stream(value, stream)
    return moved


def to_devices(value: Optional[Tensor], devices) -> Dict[torch.device, Tensor]:
    """``value`` on each of ``devices`` (one copy per distinct device), for
    tensors the main thread prepares before a step's jobs start."""
    if value is None:
        return {}
    if is_host(value) and any(has_streams(device) for device in devices):
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
