"""PyTorch's CUDA Sanitizer on every worker thread of a hybrid group, for
the GPU check (``benchmarks/gpu_check.py``, phase ``streams``).

CSAN (``torch/cuda/_sanitizer.py``) is a ``TorchDispatchMode``, and
dispatch modes are per thread: enabled on the calling thread it never sees
the kernels the group's workers launch, which is where the engine's
stream ordering matters.  Here one ``EventHandler`` (CSAN's record of
streams, events and tensor accesses) is shared by one dispatch mode per
thread: the caller's, and one entered in every worker job through
:mod:`fairseq_hybrid.parallel.thread_state`.  Stream, event and allocation callbacks are
process-wide already (``torch.cuda._gpu_trace``).  Calls into the shared
handler are serialised by one lock.

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

from ..parallel import thread_state

_CALLBACKS = ("event_creation", "event_deletion", "event_record", "event_wait", "memory_allocation",
              "memory_deallocation", "stream_creation", "device_synchronization", "stream_synchronization",
              "event_synchronization")


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
        """:mod:`fairseq_hybrid.parallel.thread_state` hook: every job enters a mode."""
        return self._mode

    @contextmanager
    def enabled(self) -> Iterator["SharedSanitizer"]:
        """The block, and every worker job it starts, under CSAN."""
        thread_state.register(self._capture)
        try:
            with self._mode():
                yield self
        finally:
            thread_state.unregister(self._capture)
