"""A stage: the process that runs one device's cells of a hybrid group's
steps (``--hybrid-workers processes``), in the spirit of
``torch.distributed.pipelining``'s ``stage.py``.

Every stage builds its own cells of the step from the batch's layout the
trainer sends (the builder the trainer hands it, so the same cells, orders
and dropout seeds as threads; the other workers' cells without their code) and
runs them, forward in wavefront order and backward in the reverse order,
through :class:`~.cell_graph.CellGraph` itself with the channel
:class:`~.channels.OverWire`: where an input comes from another device (or
a gradient goes back to one) it takes the message from its wire
(:mod:`.host_wire` on host memory, :mod:`.gpu_wire` between GPUs) instead of
another thread.  It reports its loss sums; in the backward pass it hands
the trainer a replicated part's gradients as soon as its last cell on the
part is done, and the rest with its reply, through buffers it shares with
the trainer (docs/design.md, "A host per device").  The trainer's side is
:mod:`.stage_processes`.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from contextlib import ExitStack
from functools import partial
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from . import plain_tensors
from ..runtime.cell_graph import CellGraph, Ref
from ..runtime.channels import InProcess, OverWire
from ..runtime.replicas import ModelReplicas
from .gpu_wire import PeerLost
from ..runtime.thread_state import ThreadState, stage_hooks, step_scope
from ..runtime.worker import StageThread, run_as
from ..runtime.stream_handoff import arrive

PR_SET_PDEATHSIG = 1
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt


def keep_freed_memory() -> None:
    """glibc gives large freed blocks back to the kernel (and takes them
    again, page fault by page fault, at the next step) until a process's
    own pattern of frees has raised its thresholds; a process that runs a
    group's cells reaches that state by itself, a trainer whose stages run
    them does not.  Fixed thresholds keep freed memory for the next step
    (a no-op where the C library is not glibc)."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
    except (OSError, AttributeError):
        pass


class StageError(RuntimeError):
    """A cell of a stage failed (its text names the stage's cell)."""


class _Devices:
    """What :class:`CellGraph` reads of a worker group: its devices."""

    def __init__(self, devices):
        self.devices = list(devices)


class Stage:
    """One device's side of a group's steps, in its own process."""

    def __init__(self, me: int, model, plan, build, wire, activity, tell: Callable[[str, Dict], None]):
        self.me, self.model, self.plan, self.wire, self.activity = me, model, plan, wire, activity
        self.tell = tell  # a message to the trainer in the middle of a command (a replica's gradients)
        self.build = build  # the step's cells, this stage's alone runnable (step.build_step)
        self.device = plan.devices[me]
        self.replicas = ModelReplicas(model)
        self.params = list(model.parameters())
        self.index = {id(param): position for position, param in enumerate(self.params)}
        # gradient buffers shared with the trainer, by parameter position and whether handed over mid-pass
        self.buffers: Dict[Tuple[int, bool], Tensor] = {}
        self.graph: Optional[CellGraph] = None
        self.built = None

    def forward(self, step: Dict) -> Dict:
        """Build the step, run this stage's cells forward; its loss sums
        by cell, each output as ``(value on the host, needs a gradient)``."""
        self.graph = self.built = None  # a forward without a backward before (validation) is dropped
        self.model.train(step["training"])
        with ThreadState(step["grad_enabled"], tuple(step["autocast"]), ()).entered():  # the trainer's
            built = self.build(self.model, self.plan, None, None, step["shard_loss"], replicas=self.replicas,
                               worker=self.me, layout=step["layout"])
            self._refresh_replicas(built)
            channel = OverWire(self.me, self.wire, self._say, built.output_shapes) if self.wire is not None \
                else InProcess(self._say)
            hand_offs = [(use.cells, partial(self._hand_off, use)) for use in built.replica_uses + built.master_uses
                         if use.worker == self.me]
            graph = CellGraph(built.step.cells, _Devices(self.plan.devices), step["seed"], channel=channel,
                              after_last_backward=hand_offs, wiring=built.wiring)
            graph.forward_of(self.me)
        results = {}
        for cell in built.results:
            if built.step.cells[cell].worker == self.me:
                results[cell] = [(value.detach().cpu(), value.requires_grad) for value in graph.outputs[cell]]
        _synchronize(self.device)
        if step["grad_enabled"]:
            self.graph, self.built = graph, built
        return {"results": results, "busy": graph.busy[self.me]}

    def _refresh_replicas(self, built) -> None:
        """This stage's replicas up to date for the step.  Where a master
        lives on another device its stage sends the parameters over the
        wire, so that no stage reads another device's memory (on GPUs: no
        process opens a context on another GPU); where it lives on this
        stage's device (every plain CPU device) the replica shares it."""
        for number, use in enumerate(built.replica_uses):
            masters = list(use.replicas.master.parameters())
            away = self.wire is not None and use.worker != use.home and any(
                master.device != self.plan.devices[use.worker] for master in masters)
            if use.worker == self.me and away:
                keys = [("replica", number, index) for index in range(len(masters))]
                self.wire.expect(use.home, keys, dict(zip(keys, masters)))  # shapes known: no headers
                self._say(f"a replica's parameters, waiting for stage {use.home}")
                use.replicas.refresh_from(self.me, [self.wire.take(use.home, key)[0] for key in keys], built.step)
            elif use.worker == self.me:
                use.replicas.prefetch(self.me, self.device, built.step)
            elif use.home == self.me and away:
                for master in masters:
                    self.wire.send(use.worker, master.detach(), known=True)

    def backward(self, grads: Dict[Ref, Tensor]) -> Dict:
        """Run this stage's cells backward from the loss sums' gradients;
        which parameters it filled (and the buffers it shares for the
        first time)."""
        if self.graph is None:
            raise StageError("a backward pass without its forward pass")
        for param in self.params:
            param.grad = None
        graph, built = self.graph, self.built
        self.graph = self.built = None
        busy = graph.busy[self.me]
        graph.backward_of(self.me, {ref: arrive(grad, self.device) for ref, grad in grads.items()})
        filled: Dict[int, Tensor] = {}
        for position, param in enumerate(self.params):
            if param.grad is not None:
                filled[position] = param.grad
                param.grad = None
        for use in built.replica_uses:  # handed over already, unless a hook failed to run
            replica = use.replicas.copies.get(self.me) if use.worker == self.me else None
            if replica is not None and any(param.grad is not None for param in replica.parameters()):
                raise StageError("a replica's gradients were not handed over after its last cell")
        reply = self._shared(filled, mid_pass=False)
        _synchronize(self.device)
        return {**reply, "busy": graph.busy[self.me] - busy, "peak_mib": peak_mib(self.device),
                "sent": self._sent()}

    def _hand_off(self, use) -> None:
        """A replicated part's gradients (a replica's, or the master's on
        its own worker), to the trainer as soon as this stage's last cell
        on the part has run backward: the trainer adds them while the
        stages' backward passes go on (:mod:`.gradient_sums`).  A
        parameter that a later cell fills again (a tied embedding) is
        handed over again with the reply."""
        module = use.replicas.master if use.worker == use.home else use.replicas.copies.get(self.me)
        filled: Dict[int, Tensor] = {}
        for master, param in zip(use.replicas.master.parameters(), module.parameters() if module else ()):
            if param.grad is not None:
                filled[self.index[id(master)]] = arrive(param.grad, self.device)
                param.grad = None
        if filled:
            reply = self._shared(filled, mid_pass=True)
            _synchronize(self.device)
            self.tell("part", reply)

    def _shared(self, filled: Dict[int, Tensor], mid_pass: bool) -> Dict:
        """``filled`` copied into the buffers this stage shares with the
        trainer (one set for the hand-overs in the middle of a pass, one
        for the reply, so that a parameter handed over twice in a pass
        keeps both parts); which positions, and the buffers shared for the
        first time, by ``(position, mid_pass)``."""
        new = {}
        for position, grad in filled.items():
            key = (position, mid_pass)
            buffer = self.buffers.get(key)
            if buffer is None or buffer.shape != grad.shape or buffer.dtype != grad.dtype:
                buffer = grad.detach().clone(memory_format=torch.contiguous_format)
                if buffer.device.type == "cpu":
                    buffer.share_memory_()
                self.buffers[key] = new[key] = buffer
            else:
                buffer.copy_(grad)
        return {"filled": sorted(filled), "new_buffers": new}

    def _say(self, text: str) -> None:
        """What this stage does now, for the trainer to name if it hangs or dies."""
        self.activity.value = text.encode("utf-8", "replace")[:len(self.activity) - 1]

    def _sent(self) -> List[float]:
        """Messages and bytes this stage sent since it last said, and the
        seconds its sends took."""
        if self.wire is None:
            return [0, 0, 0.0]
        sent, seconds = self.wire.sent, self.wire.send_seconds
        self.wire.sent, self.wire.send_seconds = [0, 0], 0.0
        return [*sent, seconds]


def peak_mib(device: torch.device) -> float:
    """What this stage has held at most: its device's peak allocation on a
    GPU, its process's peak resident set on CPU (the parameters it shares
    with the trainer included)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _synchronize(device: torch.device) -> None:
    """The trainer reads what this stage made only after its GPU made it."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def watch_parent(parent: int) -> None:
    """End this process with its parent's (the trainer's), however that one ends: Linux's
    parent-death signal, and a thread that checks the parent's id (for the
    moment between the fork and the signal's setting, and elsewhere)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=watch, name="hybrid stage parent watch", daemon=True).start()


def stage_main(me: int, model, plan, build, conn, activity, store_path: Optional[str], timeout: float, parent: int,
               pipes=None) -> None:
    """A stage process's whole life: set up, then answer the trainer's
    commands until it says stop; any failure is reported, then the process
    ends (the trainer starts new stages)."""
    watch_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it ends the stages
    device = plan.devices[me]
    if device.type == "cpu":
        torch.set_num_threads(1)  # one core a CPU device, as a worker thread has
    else:
        torch.cuda.set_device(device)
    from ..runtime import stream_handoff
    stream_handoff.only_devices([device])
    wire = None
    code = 0
    life = ExitStack()
    try:
        from .host_wire import HostWire

        if pipes is not None and store_path is None:  # host memory: the stages' pipes alone (host_wire.py)
            wire = HostWire(me, *pipes)
        elif plan.size > 1:
            from torch.distributed import FileStore

            from .gpu_wire import GpuWire
            wire = GpuWire(me, plan.size, FileStore(store_path, plan.size), device, timeout,
                           distinct_devices=len(set(plan.devices)) == plan.size,
                           header_wire=HostWire(me, *pipes) if pipes is not None else None)
        def tell(kind: str, reply: Dict) -> None:
            if kind == "ok" and hooks:
                reply["reports"] = [hook.report() for hook in hooks]
            if reply.get("new_buffers"):
                conn.send((kind, reply))  # torch's reductions share the buffers' memory (multiprocessing's pickler)
            else:
                conn.send_bytes(plain_tensors.dumps((kind, reply)))

        run_as(StageThread(me, device))  # this thread is the worker of its device, as a worker thread is
        hooks = stage_hooks()  # what other modules add to a stage for its life (the test harness)
        for hook in hooks:
            life.enter_context(hook.entered(device))
        stage = Stage(me, model, plan, build, wire, activity, tell)
        conn.send(("ready", None))
        while True:
            kind, payload = pickle.loads(conn.recv_bytes())
            if kind == "stop":
                break
            with step_scope():  # where the host must never wait for the device (the harness checks it)
                tell("ok", stage.forward(payload) if kind == "forward" else stage.backward(payload))
    except EOFError:  # the trainer is gone
        code = 1
    except BaseException as error:  # reported, never lost
        code = 1
        try:
            conn.send(("error", (f"{type(error).__name__}: {error}\n{traceback.format_exc()}",
                                 isinstance(error, PeerLost))))
        except (OSError, ValueError):
            pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
