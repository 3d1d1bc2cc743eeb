"""The one way a tensor moves to another device of a group.

Every move of the engine goes through :func:`arrive`, so that the
virtual-device harness (``fairseq_hybrid.virtual_devices``) sees each one,
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

On plain CPU devices a move is ``tensor.to(device)``: nothing when the
device is the same (every plain ``cpu``).  Virtual devices have virtual
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


def _copy_stream(source: torch.device):
    """The calling thread's copy stream on ``source`` (one per thread and
    source device, made once per stream scope: CUDA or one virtual checker)."""
    streams_made: Dict[Tuple[object, int], object] = getattr(_local, "copy_streams", None) or {}
    _local.copy_streams = streams_made
    key = (streams.scope(source), source.index)
    if key not in streams_made:
        streams_made[key] = streams.new_stream(source, f"copy stream of {threading.current_thread().name} "
                                                       f"on {source}")
    return streams_made[key]


def record_event(device: torch.device):
    """An event after the work queued so far on ``device``'s current stream
    (None on CPU, where work is done when the call returns)."""
    return streams.record_event(device)


def arrive(value: Tensor, device: torch.device, event=None) -> Tensor:
    """``value`` ready for the calling thread's current stream on ``device``.
    ``event``: recorded after ``value`` was made (None: made by work already
    ordered before the caller's, such as the main thread's before a job)."""
    if value.device == device:
        if event is not None:  # made on another worker's stream of this device
            stream = streams.current_stream(device)
            stream.wait_event(event)
            streams.record_stream(value, stream)
        return value
    if not (streams.has_streams(device) and streams.has_streams(value.device)):
        if event is not None:
            event.synchronize()  # a GPU tensor read on the host
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
    copies: Dict[torch.device, Tensor] = {}
    for device in devices:
        if device not in copies:
            copies[device] = value if value.device == device else value.to(device, non_blocking=True)
    return copies
