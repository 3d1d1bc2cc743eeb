"""PyTorch's CUDA Sanitizer on every worker thread of a hybrid group, for
the GPU check (``benchmarks/gpu_check.py``, phase ``streams``).

CSAN (``torch/cuda/_sanitizer.py``) is a ``TorchDispatchMode``, and
dispatch modes are per thread: enabled on the calling thread it never sees
the kernels the group's workers launch, which is where the engine's
stream ordering matters.  Here one ``EventHandler`` (CSAN's record of
streams, events and tensor accesses) is shared by one dispatch mode per
thread: the caller's, and one entered in every worker job through
:mod:`fairseq_hybrid.parallel.runtime.thread_state`.  Stream, event and allocation callbacks are
process-wide already (``torch.cuda._gpu_trace``).  Calls into the shared
handler are serialised by one lock.

CSAN counts every output of an op as written, by data pointer.  A cuDNN
LSTM call makes two such reports that touch no memory
(``aten/src/ATen/native/cudnn/RNN.cpp``): ``try_get_weight_buf`` makes a
tensor over the weights' storage with ``set_`` (metadata only: no kernel),
and ``_cudnn_rnn`` returns that weight buffer, which it only reads, as its
fifth output.  Two workers running one LSTM module on one GPU (``data``
mode on ``cuda:0,cuda:0``, where the replicas are the master) were reported
as racing on the weights by these two; :func:`without_metadata_writes`
takes them out before the shared handler sees them (the first GPU check
showed it; a test feeds the handler such launches).  And CSAN keys a tensor
without elements, which has no memory (``data_ptr()`` 0), by its Python
``id()``: once Python reuses an id, two such tensors of two workers were
reported as racing (the second GPU check, hybrid mode with 3 micro-batches,
where a shard can be empty).  A tensor without memory cannot race:
:func:`has_memory` leaves it out of CSAN's record.

CSAN forgets a tensor's accesses when the caching allocator frees it, so a
missing ``record_stream`` is not seen here; the virtual streams
(``fairseq_hybrid.harness.virtual_streams``) check that rule on CPU.  Needs a CUDA
build of PyTorch.
"""

from __future__ import annotations

import functools
import threading
from contextlib import contextmanager
from typing import Iterator, List

import torch

from ..parallel.runtime import thread_state

_CALLBACKS = ("event_creation", "event_deletion", "event_record", "event_wait", "memory_allocation",
              "memory_deallocation", "stream_creation", "device_synchronization", "stream_synchronization",
              "event_synchronization")


def without_metadata_writes(stream, read_only, read_write, outputs, operator, tensor_aliases):
    """A kernel launch as CSAN's handler takes it, without the writes it
    reports that touch no memory (module docstring); None: the op launches
    no kernel at all."""
    name = str(operator).split("(")[0]
    if name == "aten::set_.source_Storage":
        return None
    if name == "aten::_cudnn_rnn":
        weights = {ptr for ptr in read_write if {"weight", "weight_buf"} & set(tensor_aliases.get(ptr, ()))}
        read_only, read_write = set(read_only) | weights, set(read_write) - weights
    return stream, read_only, read_write, outputs, operator, tensor_aliases


def has_memory(value) -> bool:
    """Whether CSAN should record an access to ``value``: anything but a
    tensor whose data pointer is null (no elements, no memory)."""
    return not (isinstance(value, torch.Tensor) and value.data_ptr() == 0)


@contextmanager
def accesses_with_memory_only() -> Iterator[None]:
    """CSAN's argument handler, for the block, records no tensor without
    memory (:func:`has_memory`)."""
    from torch.cuda._sanitizer import ArgumentHandler

    original = ArgumentHandler._handle_argument

    def handle(self, value, *args, **kwargs):
        if has_memory(value):
            original(self, value, *args, **kwargs)

    ArgumentHandler._handle_argument = handle
    try:
        yield
    finally:
        ArgumentHandler._handle_argument = original


class SharedSanitizer:
    """One CSAN event handler, seen from every thread that enters it."""

    def __init__(self):
        import torch.cuda._gpu_trace as gpu_trace
        from torch.cuda._sanitizer import EventHandler

        self.lock = threading.RLock()
        self.handler = EventHandler()
        self.errors: List[str] = []
        for name in ["kernel_launch", *_CALLBACKS]:
            method = getattr(self.handler, f"_handle_{name}")
            setattr(self.handler, f"_handle_{name}", self._locked(method))
        locked_launch = self.handler._handle_kernel_launch

        def launch(*args):
            launched = without_metadata_writes(*args)
            return [] if launched is None else locked_launch(*launched)

        self.handler._handle_kernel_launch = launch
        torch._C._activate_gpu_trace()
        for name in _CALLBACKS:
            getattr(gpu_trace, f"register_callback_for_{name}")(getattr(self.handler, f"_handle_{name}"))

    def _locked(self, method):
        @functools.wraps(method)
        def call(*args, **kwargs):
            with self.lock:
                result = method(*args, **kwargs)
            if isinstance(result, list) and result:
                self.errors += [str(error) for error in result]
            return result
        return call

    def _mode(self):
        """A CSAN dispatch mode for the calling thread, on the shared handler."""
        from torch.cuda._sanitizer import CUDASanitizerDispatchMode
        from torch.utils._python_dispatch import TorchDispatchMode

        mode = CUDASanitizerDispatchMode.__new__(CUDASanitizerDispatchMode)
        TorchDispatchMode.__init__(mode)
        mode.event_handler = self.handler
        return mode

    def _capture(self):
        """:mod:`fairseq_hybrid.parallel.runtime.thread_state` hook: every job enters a mode."""
        return self._mode

    @contextmanager
    def enabled(self) -> Iterator["SharedSanitizer"]:
        """The block, and every worker job it starts, under CSAN."""
        thread_state.register(self._capture)
        try:
            with accesses_with_memory_only(), self._mode():
                yield self
        finally:
            thread_state.unregister(self._capture)
