"""What a step's list of cells fixes whatever its batch: the order each
worker runs its cells in, who reads each cell, and what crosses from one
worker to another in which order.

Steps of one shape (the same cells, workers and inputs) share one
:class:`Wiring`, made once (:mod:`..recipe.step_skeleton` keeps it with
the shape's cells), so that a step's graph and a stage's channel only look
it up.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from .wavefront import CellSpec, Ref, worker_orders


class Routes(NamedTuple):
    """What crosses to and from one worker ``me``: the other workers that
    read each output it sends (by ref), its cells' outputs another worker
    reads (by cell, in output order), and what each other worker sends it
    forward (outputs, in that worker's order) and backward (the gradients
    of its outputs, by reading cell and input position, in that worker's
    reverse order)."""

    readers: Dict[Ref, List[int]]
    sent_refs: Dict[int, List[Ref]]
    forward_from: Dict[int, List[Ref]]
    backward_from: Dict[int, List[Tuple[int, int]]]


class Wiring:
    """The orders, readers and routes of one list of cells on ``workers``
    workers."""

    def __init__(self, cells: Sequence[CellSpec], workers: int):
        self.workers = [cell.worker for cell in cells]
        self.inputs = [[tuple(ref) for ref in cell.inputs] for cell in cells]
        self.orders = worker_orders(cells, workers)
        self.consumers: List[List[int]] = [[] for _ in cells]
        for index, inputs in enumerate(self.inputs):
            for producer, _ in inputs:
                if index not in self.consumers[producer]:
                    self.consumers[producer].append(index)
        self._sent: Optional[Tuple[Dict[Ref, List[int]], Dict[int, List[Ref]]]] = None  # the same for every worker
        self._routes: Dict[int, Routes] = {}
        # by thread state (grad mode, autocast): the dtype of each output a stage has sent or received with a
        # header in a step of this shape; a stage on the GPU wire sends it without one from then on
        # (:class:`.channels.OverWire`; every stage meets the same shapes in the same order, so each side
        # knows what the other has seen)
        self.described: Dict[object, Dict[Ref, object]] = {}

    def __len__(self) -> int:
        return len(self.workers)

    def routes(self, me: int) -> Routes:
        routes = self._routes.get(me)
        if routes is None:
            routes = self._routes[me] = self._routes_of(me)
        return routes

    def _readers(self) -> Tuple[Dict[Ref, List[int]], Dict[int, List[Ref]]]:
        """The other workers that read each output, and each cell's outputs
        that another worker reads, in output order (made once)."""
        if self._sent is None:
            worker_of = self.workers
            readers: Dict[Ref, List[int]] = {}
            for reader, inputs in zip(worker_of, self.inputs):
                for ref in inputs:
                    if worker_of[ref[0]] != reader and reader not in readers.setdefault(ref, []):
                        readers[ref].append(reader)
            sent_refs: Dict[int, List[Ref]] = {}
            for ref in sorted(readers):
                readers[ref].sort()
                sent_refs.setdefault(ref[0], []).append(ref)
            self._sent = readers, sent_refs
        return self._sent

    def _routes_of(self, me: int) -> Routes:
        worker_of = self.workers
        readers, sent_refs = self._readers()
        forward_from: Dict[int, List[Ref]] = {}
        backward_from: Dict[int, List[Tuple[int, int]]] = {}
        for worker, order in enumerate(self.orders):
            if worker != me:
                forward_from[worker] = [ref for index in order for ref in sent_refs.get(index, ())
                                        if me in readers[ref]]
                backward_from[worker] = [(index, position) for index in reversed(order)
                                         for position, (producer, _) in enumerate(self.inputs[index])
                                         if worker_of[producer] == me]
        return Routes(readers, sent_refs, forward_from, backward_from)
