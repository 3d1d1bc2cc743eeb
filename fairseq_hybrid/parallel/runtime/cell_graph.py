"""Running a step's cells on the workers of a group, forward and backward.

Every cell's autograd graph is cut at its inputs: a cell reads the outputs
of earlier cells as fresh leaves, so its backward is a call of its own
(autograd's engine on the cell's outputs, as
``torch.autograd.backward`` runs it) that its device's worker
runs.  This matters on CPU, where a single ``loss.backward()`` runs all
backward work on the calling thread: with stage-local backward, K workers
run the reverse wavefront on K cores (docs/design.md, "Stage-local
backward").  A cell's input
gradients (its leaves' ``.grad``) are handed to the cells that produced
them; a producer read by several cells adds their gradients in a fixed
order, so a step's result never depends on thread timing.

:func:`run_cells` ties this into ordinary autograd: it returns the
requested outputs through one ``autograd.Function`` whose backward runs the
reverse wavefront, so the trainer's ``loss.backward()`` drives it unchanged.
Parameters receive their gradients directly from the cells' backward calls.

On CUDA each worker has a stream; a cell records an event after it runs and
every reader waits for that event before using the output
(:mod:`.stream_handoff`).  CUDA backward normally runs on one autograd thread
per device, and the trainer's ``loss.backward()`` reaches this graph's
boundary on the autograd thread of the loss's device, where it waits for
the workers; a worker's own ``torch.autograd.backward`` would queue its
CUDA nodes to those same (blocked) device threads and never return.  Each
worker therefore runs its cells' backward with autograd's multithreading
off, which makes the calling thread execute the whole graph itself
(``Engine::ready_queue`` in ``torch/csrc/autograd/engine.cpp`` returns the
caller's CPU queue when ``get_multithreading_enabled()`` is false).
"""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.autograd import Variable

from . import thread_state
from . import seeded_dropout
from .cell_times import DeviceUsage, label_call, note_call
from .channels import InProcess
from .stream_handoff import arrive, record_event
from .wavefront import CellSpec, Ref
from .wiring import Wiring
from .worker import DEFAULT_TIMEOUT, Aborted, WorkerGroup, current_worker


_run_backward = Variable._execution_engine.run_backward


class Work(NamedTuple):
    """What a cell computes, for cost models (the schedule simulator):
    ``kind`` (embedding, lstm, gather, attention_softmax, whole_model),
    ``tokens`` it runs over and the sizes that set the cost per token."""

    kind: str
    tokens: int
    sizes: Tuple[int, ...] = ()


class Cell(NamedTuple):
    """A piece of a step on one worker: ``run(*inputs) -> outputs``, where
    ``inputs`` are the outputs ``(cell, index)`` of earlier cells and
    ``outputs``, when given, names what ``run`` returns, in order."""

    name: str
    worker: int
    inputs: Sequence[Ref]
    run: Callable[..., Sequence[Tensor]]
    work: Optional[Work] = None
    outputs: Optional[Tuple[str, ...]] = None
    not_before: int = 0  # the cell's earliest wavefront clock (micro-batches enter one after another)


class CellGraph:
    """The cells of one step and what they produced.

    ``forward`` runs every worker's cells in wavefront order; ``backward``,
    given gradients of some outputs, runs them in the reverse order;
    ``forward_of`` and ``backward_of`` run one worker's cells on the calling
    thread (a stage in a process of its own).  ``channel`` brings the
    outputs and gradients of cells on other workers (:mod:`.channels`:
    in this process by default).
    """

    MAIN = 1 << 30  # the consumer id of gradients that come from outside the graph

    def __init__(self, cells: Sequence[Cell], group: WorkerGroup, seed: int,
                 after_backward: Callable[[], None] = lambda: None, timeout: float = DEFAULT_TIMEOUT,
                 report_usage: Optional[Callable[[DeviceUsage], None]] = None,
                 after_last_backward: Sequence[Tuple[Sequence[int], Callable[[], None]]] = (),
                 channel: Optional[InProcess] = None, wiring: Optional[Wiring] = None):
        self.cells = list(cells)
        self.channel = channel or InProcess()
        self.report_usage = report_usage
        self.busy = [0.0] * len(group.devices)  # each worker adds to its own entry
        self.wall = 0.0
        self.timeout = timeout
        self.after_backward = after_backward
        self.group = group
        self.seed = seed
        if wiring is None:
            wiring = Wiring([CellSpec(cell.worker, cell.inputs, cell.not_before) for cell in self.cells],
                            len(group.devices))
        elif len(wiring) != len(self.cells):
            raise ValueError(f"a wiring of {len(wiring)} cells for {len(self.cells)} cells")
        self.wiring = wiring
        self.orders = wiring.orders
        self.consumers = wiring.consumers  # shared by every step of the shape: read only
        count = len(self.cells)
        self.outputs: List[Optional[Tuple[Tensor, ...]]] = [None] * count
        self.leaves: List[Optional[List[Tensor]]] = [None] * count
        self.events: List[Optional[object]] = [None] * count
        self.forward_done = [threading.Event() for _ in range(count)]
        self.backward_done = [threading.Event() for _ in range(count)]
        self.grads: Dict[Ref, Dict[int, Tuple[Tensor, Optional[object]]]] = {}
        self.aborted = False
        # hooks run on a worker right after the backward of the last of their
        # cells (cells of one worker) to run there, the first in forward order
        position = {index: place for order in self.orders for place, index in enumerate(order)}
        self.hooks: Dict[int, List[Callable[[], None]]] = {}
        for hooked, hook in after_last_backward:
            if len({self.cells[index].worker for index in hooked}) != 1:
                raise ValueError("a hook after the last backward of several cells needs cells of one worker")
            self.hooks.setdefault(min(hooked, key=position.__getitem__), []).append(hook)
        self.channel.bind(self)

    # -- running -----------------------------------------------------------

    def forward(self) -> None:
        start = time.perf_counter()
        self.group.run([partial(self._run_forward, order) for order in self.orders], on_error=self._abort,
                       timeout=self.timeout)
        self.wall += time.perf_counter() - start

    def backward(self, refs: Sequence[Ref], grads: Sequence[Optional[Tensor]]) -> None:
        for ref, grad in zip(refs, grads):
            if grad is not None:
                self.grads.setdefault(ref, {})[self.MAIN] = (grad, None)
        start = time.perf_counter()
        self.group.run([partial(self._run_backward, order[::-1]) for order in self.orders], on_error=self._abort,
                       timeout=self.timeout)
        self.wall += time.perf_counter() - start
        self.after_backward()
        if self.report_usage is not None:
            self.report_usage(DeviceUsage(list(self.busy), self.wall))

    def forward_of(self, worker: int) -> None:
        """Run ``worker``'s cells forward on the calling thread."""
        self.channel.start(self, "forward")
        for index in self.orders[worker]:
            self.channel.say(f"{self.cells[index].name} (forward)")
            self._forward_cell(index)
        self.channel.finish(self, "forward")

    def backward_of(self, worker: int, grads: Dict[Ref, Tensor]) -> None:
        """Run ``worker``'s cells backward on the calling thread, from the
        gradients ``grads`` of some of its outputs."""
        for ref, grad in grads.items():
            self.grads.setdefault(ref, {})[self.MAIN] = (grad, None)
        self.channel.start(self, "backward")
        self._run_backward(self.orders[worker][::-1], announce=True)
        self.channel.finish(self, "backward")

    def output(self, ref: Ref) -> Tensor:
        return self.outputs[ref[0]][ref[1]]

    def _abort(self) -> None:
        self.aborted = True
        for event in self.forward_done + self.backward_done:
            event.set()

    def wait(self, event: threading.Event, cell: Cell, phase: str, other: int) -> None:
        """Until another worker's cell ``other`` of this process is done."""
        if not event.is_set():
            worker = current_worker()
            if worker is not None:  # the message made only when it waits
                worker.activity = f"{cell.name} ({phase}), waiting for {self.cells[other].name}"
            event.wait()
        if self.aborted:
            raise Aborted("stopped because another worker of the group failed")

    # -- one cell --------------------------------------------------------------

    def _run_forward(self, order: List[int]) -> None:
        for index in order:
            self._forward_cell(index)

    def _forward_cell(self, index: int) -> None:
        cell = self.cells[index]
        device = self.group.devices[cell.worker]
        grad_enabled = torch.is_grad_enabled()
        leaves = []
        worker = current_worker()
        for producer, position in cell.inputs:
            value, event = self.channel.input(self, cell, producer, position)
            leaf = arrive(value.detach(), device, event)
            if grad_enabled and value.requires_grad:
                leaf.requires_grad_()
            leaves.append(leaf)
        start = time.perf_counter()
        # the worker names its cell (timeout messages, the virtual-device harness) and out of
        # memory names the device; written out, not as context managers, which cost the host
        # more than many a cell's ops
        if worker is not None:
            worker.cell, worker.activity = cell.name, f"{cell.name} (forward)"
        previous = seeded_dropout.enter_cell(self.seed + index, device)
        label = label_call(cell, "forward")
        try:
            outputs = tuple(cell.run(*leaves))
        except torch.OutOfMemoryError as error:
            raise _out_of_memory(cell, "forward", device, error) from error
        finally:
            if label is not None:
                label.__exit__(None, None, None)
            seeded_dropout.leave_cell(previous)
            if worker is not None:
                worker.cell = None
        self.busy[cell.worker] += time.perf_counter() - start
        if cell.outputs is not None and len(outputs) != len(cell.outputs):
            raise RuntimeError(f"{cell.name} returned {len(outputs)} outputs but names {len(cell.outputs)}: "
                               f"{', '.join(cell.outputs)}")
        note_call(cell, "forward", start)
        self.leaves[index] = leaves if grad_enabled else None
        self.outputs[index] = outputs
        self.events[index] = record_event(device)
        self.channel.produced(self, index)
        self.forward_done[index].set()

    def _run_backward(self, order: List[int], announce: bool = False) -> None:
        # this thread runs each cell's whole backward itself (see the module
        # docstring); the setting is the thread's own.  ``announce``: tell the
        # channel each cell's name first (a stage's trainer names it if it dies)
        previous = torch._C._is_multithreading_enabled()
        torch._C._set_multithreading_enabled(False)
        try:
            for index in order:
                if announce:
                    self.channel.say(f"{self.cells[index].name} (backward)")
                self._backward_cell(index)
        finally:
            torch._C._set_multithreading_enabled(previous)

    def _backward_cell(self, index: int) -> None:
        cell = self.cells[index]
        device = self.group.devices[cell.worker]
        worker = current_worker()
        self.channel.gradients_in(self, index)
        roots, root_grads = [], []
        for position, value in enumerate(self.outputs[index]):
            received = self.grads.pop((index, position), None)
            if not received or not value.requires_grad:
                continue
            total = None
            for consumer in sorted(received):  # a fixed order: the same sum in every run
                grad, event = received[consumer]
                grad = arrive(grad, device, event)
                total = grad if total is None else total + grad
            roots.append(value)
            root_grads.append(total)
        start = time.perf_counter()
        if roots:
            if worker is not None:
                worker.cell, worker.activity = cell.name, f"{cell.name} (backward)"
            label = label_call(cell, "backward")
            try:
                # autograd's engine itself, as torch.autograd.backward calls it, less that
                # function's checks of gradients made here of the outputs' own shapes
                _run_backward(tuple(roots), tuple(root_grads), False, False, (), True, True)
            except torch.OutOfMemoryError as error:
                raise _out_of_memory(cell, "backward", device, error) from error
            finally:
                if label is not None:
                    label.__exit__(None, None, None)
                if worker is not None:
                    worker.cell = None
        self.busy[cell.worker] += time.perf_counter() - start
        note_call(cell, "backward", start)
        leaves = self.leaves[index]
        event = record_event(device) if leaves else None
        for position, ref in enumerate(cell.inputs):
            leaf = leaves[position] if leaves else None
            self.channel.hand_back(self, index, ref, leaf.grad if leaf is not None and leaf.requires_grad else None,
                                   event)
        self.leaves[index] = None
        self.outputs[index] = None
        for hook in self.hooks.get(index, ()):
            hook()
        self.backward_done[index].set()


class DeviceOutOfMemory(RuntimeError):
    """Out of memory on one device of a group, naming the device, the part
    of the model and what the device held.  The text keeps "out of memory",
    which fairseq's trainer looks for to skip the batch."""


def _out_of_memory(cell: Cell, phase: str, device: torch.device, error: BaseException) -> DeviceOutOfMemory:
    if device.type == "cuda":
        held = (f"{torch.cuda.memory_allocated(device) / 2**20:,.0f} MiB allocated, "
                f"{torch.cuda.memory_reserved(device) / 2**20:,.0f} MiB reserved on {device}")
    else:
        held = f"memory held on {device} not tracked"
    return DeviceOutOfMemory(f"out of memory on {device} in {cell.name} ({phase}); {held}: {error}")


class _Boundary(torch.autograd.Function):
    """Outputs of a cell graph as ordinary autograd tensors; their backward
    runs the graph's reverse wavefront."""

    @staticmethod
    def forward(ctx, graph: CellGraph, refs: Sequence[Ref], anchor: Tensor):
        ctx.graph, ctx.refs = graph, refs
        ctx.state = thread_state.capture()
        ctx.set_materialize_grads(False)
        return tuple(graph.output(ref).detach().view_as(graph.output(ref)) for ref in refs)

    @staticmethod
    def backward(ctx, *grads):
        with thread_state.extras_entered(ctx.state), thread_state.step_scope():
            ctx.graph.backward(ctx.refs, grads)
        return None, None, None


def run_cells(
    cells: Sequence[Cell], group: WorkerGroup, results: Sequence[int], after_backward: Callable[[], None] = lambda: None,
    timeout: float = DEFAULT_TIMEOUT, report_usage: Optional[Callable[[DeviceUsage], None]] = None,
    after_last_backward: Sequence[Tuple[Sequence[int], Callable[[], None]]] = (), wiring: Optional[Wiring] = None,
) -> List[Tuple[Tensor, ...]]:
    """Run ``cells`` on ``group`` and return the outputs of the cells
    ``results``.  Under grad mode their floating-point outputs carry the
    graph's backward, after which ``after_backward`` runs and then
    ``report_usage`` gets the step's :class:`DeviceUsage` (both on the
    caller's thread, once every worker is done).  ``after_last_backward``:
    ``(cells, hook)`` pairs, each hook run on its cells' worker as soon as
    the last of them has run backward there; ``wiring``: the cells' own,
    when their shape's is kept (:mod:`.wiring`).  A phase that takes longer
    than ``timeout`` seconds raises :class:`.worker.WorkerTimeout`."""
    seed = int(torch.randint(0, 1 << 62, ()).item()) if torch.is_grad_enabled() else 0
    graph = CellGraph(cells, group, seed, after_backward, timeout, report_usage, after_last_backward, wiring=wiring)
    graph.forward()
    refs = [(cell, position) for cell in results for position in range(len(graph.outputs[cell]))]
    if not torch.is_grad_enabled():
        values = [graph.output(ref) for ref in refs]
    else:
        differentiable = [ref for ref in refs if graph.output(ref).requires_grad]
        anchor = torch.empty(0, requires_grad=True)
        through = dict(zip(differentiable, _Boundary.apply(graph, differentiable, anchor))) if differentiable else {}
        values = [through[ref] if ref in through else graph.output(ref).detach() for ref in refs]
    tuples, start = [], 0
    for cell in results:
        width = len(graph.outputs[cell])
        tuples.append(tuple(values[start:start + width]))
        start += width
    return tuples
