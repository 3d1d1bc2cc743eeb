"""How the cells of one worker reach the outputs and gradients of cells on
other workers: the channel a :class:`~.cell_graph.CellGraph` is given.
One graph runs the cells whatever the workers are; only the channel
differs:

* :class:`InProcess` (``--hybrid-workers threads``): every worker's cells
  are in this process; an input is the producer's output once the
  producer's worker has set its event (and its stream event, for the
  reader's stream to wait for), and a gradient is handed over in memory;
* :class:`OverWire` (``--hybrid-workers processes``): one worker's cells
  are in this process; another worker's output, and the gradient another
  worker hands back, come over the stages' wire (:mod:`.host_wire` on host
  memory, :mod:`..processes.gpu_wire` between GPUs).  Every stage builds the same cells
  and orders, so each knows what its peers send it and in which order.

On the GPU wire a message goes without a header once its dtype is known:
its shape comes from the layout (the producer's cell kind,
``output_shapes``), its dtype from the first step of the step's shape
under the same grad mode and autocast, which describes every message
(:attr:`.wiring.Wiring.described`), and it needs a gradient wherever
gradients are on (an output that needs none gets its gradient all the
same, and its producer drops it).  The sender checks every output
against its declared shape before it goes, so a kind that declares a
wrong shape fails there, by name, not in a receive of the wrong size.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

from .thread_state import capture
from .wavefront import Ref


class InProcess:
    """Every worker's cells in this process (worker threads); ``say``: where
    the worker that runs a pass on its own thread reports what it does
    (:meth:`.cell_graph.CellGraph.forward_of`)."""

    def __init__(self, say: Callable[[str], None] = lambda text: None):
        self.say = say

    def bind(self, graph) -> None:
        """Learn the graph's cells (once, when the graph is made)."""

    def input(self, graph, cell, producer: int, position: int) -> Tuple[Tensor, Optional[object]]:
        """An output of an earlier cell and the stream event after it, once made."""
        graph.wait(graph.forward_done[producer], cell, "forward", producer)
        return graph.outputs[producer][position], graph.events[producer]

    def produced(self, graph, index: int) -> None:
        """Cell ``index``'s outputs are there."""

    def gradients_in(self, graph, index: int) -> None:
        """Every reader of cell ``index`` has handed back its gradients
        into ``graph.grads``."""
        cell = graph.cells[index]
        for consumer in graph.consumers[index]:
            graph.wait(graph.backward_done[consumer], cell, "backward", consumer)

    def hand_back(self, graph, index: int, ref: Ref, grad: Optional[Tensor], event) -> None:
        """Cell ``index``'s gradient of its input ``ref`` (None: none), for
        the producer."""
        if grad is not None:
            graph.grads.setdefault(ref, {})[index] = (grad, event)

    def start(self, graph, phase: str) -> None:
        """A pass of this worker's cells begins (``forward``, ``backward``)."""

    def finish(self, graph, phase: str) -> None:
        """A pass of this worker's cells is done."""
        self.say("idle")


class OverWire(InProcess):
    """Worker ``me``'s cells in this process (a stage); the others' outputs
    and gradients through ``wire``; ``say`` reports what it waits for;
    ``shapes``: a cell's outputs' shapes from the layout
    (:attr:`..recipe.step_builder.BuiltStep.output_shapes`; None: every
    message described)."""

    def __init__(self, me: int, wire, say: Callable[[str], None] = lambda text: None,
                 shapes: Optional[Callable[[int], Optional[Tuple[Tuple[int, ...], ...]]]] = None):
        super().__init__(say)
        self.me, self.wire, self.shapes = me, wire, shapes
        self.remote: Dict[Ref, Tensor] = {}
        self.needs: Dict[Ref, bool] = {}  # this step: whether each output sent comes back as a gradient
        self.arriving: Dict[Ref, Tensor] = {}  # this step: the outputs received without a header, as likes
        self.learned: Dict[Ref, torch.dtype] = {}  # this step: the dtypes of outputs described
        self.described: Optional[Dict[Ref, torch.dtype]] = None
        self.declared: Dict[int, Optional[Tuple[Tuple[int, ...], ...]]] = {}

    def bind(self, graph) -> None:
        # who reads each output on another stage, and what each stage sends this one, in its own order
        self.readers, self.sent_refs, self.forward_from, self.backward_from = graph.wiring.routes(self.me)
        if self.shapes is not None and getattr(self.wire, "describes_once", False):
            state = capture()
            self.described = graph.wiring.described.setdefault((state.grad_enabled, state.autocast), {})

    def _like(self, ref: Ref) -> Optional[Tensor]:
        """A tensor of ``ref``'s shape and dtype (on no device) where both
        are known without a header; None where it goes with one."""
        dtype = self.described.get(ref) if self.described is not None else None
        if dtype is None:
            return None
        shape = self._declared(ref)
        return None if shape is None else torch.empty(shape, dtype=dtype, device="meta")

    def _declared(self, ref: Ref) -> Optional[Tuple[int, ...]]:
        if ref[0] not in self.declared:
            self.declared[ref[0]] = self.shapes(ref[0])
        shapes = self.declared[ref[0]]
        return None if shapes is None else shapes[ref[1]]

    def start(self, graph, phase: str) -> None:
        if phase == "forward":
            self.remote.clear()
            self.needs.clear()
            self.learned.clear()
            self.arriving = {}
            for worker, keys in self.forward_from.items():
                for ref in keys:
                    like = self._like(ref)
                    if like is not None:
                        self.arriving[ref] = like
                self.wire.expect(worker, keys, self.arriving)
            return
        # a gradient comes back for an output sent as needing one, of that output's shape and dtype (the
        # GPU wire sends it without a header)
        for worker, keys in self.backward_from.items():
            likes = {}
            for consumer, position in keys:
                producer, output = graph.cells[consumer].inputs[position]
                if self.needs.get((producer, output)):
                    likes[consumer, position] = graph.outputs[producer][output]
            self.wire.expect(worker, [key for key in keys if key in likes], likes)

    def finish(self, graph, phase: str) -> None:
        self.wire.flush()
        if phase == "forward" and self.described is not None:
            self.described.update(self.learned)  # on both ends of every message, after the same step
        super().finish(graph, phase)

    def input(self, graph, cell, producer: int, position: int) -> Tuple[Tensor, Optional[object]]:
        if graph.cells[producer].worker == self.me:
            return super().input(graph, cell, producer, position)
        ref = (producer, position)
        if ref not in self.remote:
            self.say(f"{cell.name} (forward), waiting for {graph.cells[producer].name}")
            value, requires_grad = self.wire.take(graph.cells[producer].worker, ref)
            self.say(f"{cell.name} (forward)")
            if ref in self.arriving:  # no header: it needs a gradient wherever gradients are on
                requires_grad = value.is_floating_point()
            elif self.described is not None:
                self.learned[ref] = value.dtype
            if requires_grad and torch.is_grad_enabled():
                value.requires_grad_()
            self.remote[ref] = value
        return self.remote[ref], None

    def produced(self, graph, index: int) -> None:
        for ref in self.sent_refs.get(index, ()):
            value = graph.outputs[index][ref[1]]
            like = self._like(ref)
            if self.described is not None:
                declared = self._declared(ref)
                if declared is not None and tuple(value.shape) != tuple(declared):
                    raise RuntimeError(f"{graph.cells[index].name}: output {ref[1]} is {tuple(value.shape)}, "
                                       f"its cell kind declares {tuple(declared)} (the shape its readers receive "
                                       "without a header)")
                if like is None:
                    self.learned[ref] = value.dtype
                elif value.dtype != like.dtype:
                    raise RuntimeError(f"{graph.cells[index].name}: output {ref[1]} is {value.dtype}, "
                                       f"{like.dtype} in the first step of this shape")
            if like is None:
                needs = value.requires_grad
            else:
                needs = torch.is_grad_enabled() and value.is_floating_point()
            self.needs[ref] = needs
            for reader in self.readers[ref]:
                self.wire.send(reader, value.detach(), needs, known=like is not None)

    def gradients_in(self, graph, index: int) -> None:
        cell = graph.cells[index]
        for consumer in graph.consumers[index]:
            worker = graph.cells[consumer].worker
            if worker == self.me:
                continue  # run before this one, in this stage's reverse order
            self.say(f"{cell.name} (backward), waiting for {graph.cells[consumer].name}")
            for position, (producer, output) in enumerate(graph.cells[consumer].inputs):
                if producer == index and self.needs.get((producer, output)):
                    grad, _ = self.wire.take(worker, (consumer, position))
                    # an output that needs none came without a header and got one all the same: dropped
                    if grad is not None and graph.outputs[index][output].requires_grad:
                        graph.grads.setdefault((producer, output), {})[consumer] = (grad, None)
            self.say(f"{cell.name} (backward)")

    def hand_back(self, graph, index: int, ref: Ref, grad: Optional[Tensor], event) -> None:
        worker = graph.cells[ref[0]].worker
        if worker == self.me:
            return super().hand_back(graph, index, ref, grad, event)
        value = self.remote[tuple(ref)]
        if not value.requires_grad:
            return  # sent as needing no gradient: its producer expects none back
        if grad is None:
            grad = torch.zeros_like(value)  # no header says "nothing": the producer adds zeros
        self.wire.send(worker, grad, known=True)  # in input order: what the producer expects (backward_from)
