"""The wavefront schedule: in which order each device runs its cells.

The work of a step is a graph of *cells* (a layer over a time chunk, one
direction of a bidirectional layer, a batch shard of the attention-softmax
part), each on one device and each reading outputs of earlier cells.  Cell
``(layer l, chunk c)`` reads ``(l - 1, c)`` and ``(l, c - 1)``, so giving
every cell the clock ``1 + max(clock of the cells it reads)`` puts all cells
with ``l + c = k`` at clock ``k``: the wavefront of docs/design.md, in
the spirit of ``clock_cycles`` in kakaobrain/torchgpipe ``pipeline.py``.

Micro-batches enter the wavefront one after another: the cells of
micro-batch ``m`` start no earlier than clock ``m`` times a stagger, as
micro-batch ``m`` enters GPipe's first partition at clock ``m``, so each
device works through the micro-batches in order while the devices after it
work on earlier ones.

Each device runs its cells in clock order (the backward pass in the reverse
order).  Every cell's inputs have a smaller clock, so a device never waits
on a cell that another device has queued behind the waiting one: the
schedule cannot deadlock, and it never depends on thread timing.
"""

from __future__ import annotations

from typing import Iterator, List, NamedTuple, Sequence, Tuple

Ref = Tuple[int, int]  # (cell index, output index)


class CellSpec(NamedTuple):
    worker: int
    inputs: Sequence[Ref]
    not_before: int = 0  # the earliest clock (a later micro-batch starts later)


def clocks(cells: Sequence[CellSpec]) -> List[int]:
    """The clock of every cell; a cell may only read cells listed before it."""
    result: List[int] = []
    for index, cell in enumerate(cells):
        producers = [producer for producer, _ in cell.inputs]
        if any(producer >= index for producer in producers):
            raise ValueError(f"cell {index} reads a cell that is not listed before it")
        result.append(max(cell.not_before, 1 + max((result[p] for p in producers), default=-1)))
    return result


def clock_cycles(cells: Sequence[CellSpec]) -> Iterator[List[int]]:
    """The cells that may run at clock 0, 1, 2, ...: one list per clock."""
    cell_clocks = clocks(cells)
    for clock in range(max(cell_clocks, default=-1) + 1):
        yield [index for index, value in enumerate(cell_clocks) if value == clock]


def worker_orders(cells: Sequence[CellSpec], num_workers: int) -> List[List[int]]:
    """For every worker, the indices of its cells in the order it runs them
    forward (by clock, then by position in ``cells``)."""
    orders: List[List[int]] = [[] for _ in range(num_workers)]
    for cycle in clock_cycles(cells):
        for index in cycle:
            orders[cells[index].worker].append(index)
    return orders
