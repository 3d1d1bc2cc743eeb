"""Watching a step's cells run: how busy each device was, when each cell
ran (for schedule traces) and profiler ranges named after the cells."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, List, NamedTuple, Optional

import torch


class DeviceUsage(NamedTuple):
    """How busy each worker was during one step: seconds spent running its
    cells (forward and backward) and the step's wall time over both passes
    (CPU clock: on CUDA it times the queueing, not the kernels)."""

    busy: List[float]
    wall: float

    def fractions(self) -> List[float]:
        return [min(1.0, busy / self.wall) if self.wall > 0 else 0.0 for busy in self.busy]


class CellTime(NamedTuple):
    """When a cell ran (``time.perf_counter`` seconds), for schedule traces."""

    name: str
    worker: int
    phase: str  # "forward" or "backward"
    start: float
    end: float
    work: Optional[object] = None  # the cell's Work


_traces: List[List[CellTime]] = []


@contextmanager
def record_cell_times() -> Iterator[List[CellTime]]:
    """Collect a :class:`CellTime` for every cell run inside the block (CPU
    wall clock: on CUDA it times the queueing, not the kernels)."""
    trace: List[CellTime] = []
    _traces.append(trace)
    try:
        yield trace
    finally:
        _traces.remove(trace)


_labelled: List[bool] = []  # while non-empty, each cell's call is a profiler range named after it


@contextmanager
def labelled_cells() -> Iterator[None]:
    """Inside the block every cell's forward and backward call is a
    ``torch.profiler`` range, ``cell NAME (forward)`` / ``(backward)``, so
    that a trace can be read cell by cell (off by default: a range costs
    the host time being measured)."""
    _labelled.append(True)
    try:
        yield
    finally:
        _labelled.pop()


def label_call(cell, phase: str):
    """The profiler range of ``cell``'s call, entered (None unless labelled)."""
    if not _labelled:
        return None
    label = torch.autograd.profiler.record_function(f"cell {cell.name} ({phase})")
    label.__enter__()
    return label


def note_call(cell, phase: str, start: float) -> None:
    if _traces:
        entry = CellTime(cell.name, cell.worker, phase, start, time.perf_counter(), cell.work)
        for trace in _traces:
            trace.append(entry)
