"""Memory per virtual device: the bytes of the live storages of each
device and the peak since the last reset, as ``torch.cuda.memory_allocated``
and ``torch.cuda.max_memory_allocated`` report them per GPU.

The virtual-device harness calls :meth:`DeviceMemory.allocated` when it
first places a storage on a device and :meth:`DeviceMemory.freed` when
that storage dies (a finalizer on the storage), so the counts are the
tensors a device holds, whichever thread made or dropped them.  Like
``memory_allocated`` they count storages, not the allocator's rounding to
blocks nor its cache, and nothing of host memory.
"""

from __future__ import annotations

import threading
from typing import Dict, Optional


class DeviceMemory:
    def __init__(self):
        self._lock = threading.Lock()
        self._live: Dict[int, int] = {}
        self._peak: Dict[int, int] = {}

    def allocated(self, device: int, nbytes: int) -> None:
        with self._lock:
            live = self._live[device] = self._live.get(device, 0) + nbytes
            if live > self._peak.get(device, 0):
                self._peak[device] = live

    def freed(self, device: int, nbytes: int) -> None:
        with self._lock:
            self._live[device] = self._live.get(device, 0) - nbytes

    def live(self, device: int) -> int:
        """Bytes of the storages ``device`` holds now (``memory_allocated``)."""
        return self._live.get(device, 0)

    def peak(self, device: int) -> int:
        """Most bytes ``device`` held at once since the last reset
        (``max_memory_allocated``)."""
        return self._peak.get(device, 0)

    def reset_peaks(self, device: Optional[int] = None) -> None:
        """Peaks start again from what is live now (``reset_peak_memory_stats``)."""
        with self._lock:
            for index in ([device] if device is not None else list(self._live)):
                self._peak[index] = self._live.get(index, 0)
