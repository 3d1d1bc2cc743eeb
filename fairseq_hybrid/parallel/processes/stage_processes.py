"""The trainer's side of a group whose devices each have a process of
their own (``--hybrid-workers processes``; the stages are
:mod:`.stage`): it starts the stages, sends each step's batch, hands the
loss sums to fairseq through one autograd function whose backward runs the
stages' backward, adds their gradients into the parameters, and watches
them.

Nothing may leave the trainer waiting forever: it waits on the stages'
pipes and process sentinels together, so a stage that fails reports its
error and a stage that dies is named (with the cell it was running, which
each stage writes into memory shared with the trainer) within a second;
``--hybrid-timeout`` bounds each pass.  Either way every stage is ended,
and the next step starts new ones.  No stage outlives the trainer
(:func:`.stage.watch_parent`, and :meth:`StageProcesses.close` at exit or
when the group goes).
"""

from __future__ import annotations

import glob
import multiprocessing
import os
import pickle
import queue
import shutil
import tempfile
import threading
import time
import weakref
from multiprocessing.connection import wait
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.multiprocessing  # noqa: F401  (registers torch's reductions: shared buffers cross the pipes)
from torch import Tensor

from ..runtime.cell_times import DeviceUsage
from . import plain_tensors
from .host_wire import wire_ends
from ..runtime.shard_sums import sum_on
from .gradient_sums import StageOrderSums
from .stage import keep_freed_memory, stage_main
from ..runtime.stream_handoff import shared_from
from ..runtime.thread_state import capture, extras_entered, stage_hooks, step_scope
from ..runtime.worker import WorkerError, WorkerTimeout

START_SECONDS = 120.0  # for every stage to be up (spawn imports torch and fairseq)
ACTIVITY_BYTES = 256
GRACE = 2.0  # seconds the other stages have to report, after a first failure
STORE_PREFIX = "fairseq-hybrid-stages-"  # then the trainer's process id: a folder per group on GPUs


class StageProcesses:
    """The stage processes of one group (started at its first step)."""

    start_method: Optional[str] = None  # multiprocessing's; None: fork for CPU groups, spawn with CUDA

    def __init__(self, model, plan, timeout: float, build: Callable, lay_out: Callable):
        """``build``: how a stage builds its cells of a step from its
        layout (:func:`.step.build_step`); ``lay_out``: how the trainer
        lays a step's batch out once for every stage, its single-device
        dropout masks drawn from its own generator
        (:func:`.step_layout.lay_out_step`); both handed over, so that the
        runtime does not import a step's recipe."""
        self.model, self.plan, self.timeout, self.build, self.lay_out = model, plan, timeout, build, lay_out
        self.params = list(model.parameters())
        self.processes: List = []
        self.peak_mib: List[float] = []
        self.sent = [0, 0, 0.0]
        self.sent_so_far = [0, 0, 0.0]  # the same over every step so far
        self.conns: List = []
        self.activity: List = []
        self.pointers: Tuple[int, ...] = ()
        self.buffers: List[Dict[Tuple[int, bool], Tensor]] = []  # each stage's, as its own
        # parameters whose .grad is a stage's buffer itself, or a sum kept from step to step (``sums``)
        self.lent: Dict[int, Tensor] = {}
        self.sums: Dict[int, Tensor] = {}
        # the last backward pass's parameters (by position) each stage handed over in the middle of it,
        # and how many gradient parts were added while a stage still ran it
        self.handed_mid_pass: Dict[int, List[int]] = {}
        self.added_early = 0
        self.store_dir: Optional[str] = None
        self._finalizer = None
        self.usage: Optional[DeviceUsage] = None  # the last forward pass's, completed by its backward
        self.report_usage: Optional[Callable[[DeviceUsage], None]] = None

    # -- life ------------------------------------------------------------------

    def _shared_pointers(self) -> Tuple[int, ...]:
        return tuple(param.data_ptr() for param in self.params)

    def start(self) -> None:
        devices = self.plan.devices
        cuda = any(device.type == "cuda" for device in devices)
        # CUDA cannot run in a forked child; CPU groups fork (nothing imported or pickled again)
        context = multiprocessing.get_context(self.start_method or ("spawn" if cuda else "fork"))
        if not cuda:
            keep_freed_memory()  # the optimizer's temporaries, step after step (and the forked stages')
        with torch.no_grad():
            for param in self.params:
                if param.device.type == "cpu":
                    param.share_memory_()
        # stages on host memory talk through pipes (host_wire.py), others through torch.distributed (gpu_wire.py),
        # whose store is a folder of the trainer's (one a dead trainer left is cleared here), with the pipes
        # for their headers
        wires = wire_ends(context, len(devices)) if len(devices) > 1 else [None] * len(devices)
        store = None
        if len(devices) > 1 and (wires[0] is None or not host_memory(devices)):
            clear_dead_stores()
            self.store_dir = tempfile.mkdtemp(prefix=f"{STORE_PREFIX}{os.getpid()}-")
            store = os.path.join(self.store_dir, "store")
        # ends whatever started, however this start or this group ends (the lists fill as stages start)
        self._finalizer = weakref.finalize(self, _end, self.processes, self.conns, self.store_dir, os.getpid())
        group, self.model.hybrid_group = getattr(self.model, "hybrid_group", None), None  # not pickled (spawn)
        try:
            for me, device in enumerate(devices):
                mine, theirs = context.Pipe()
                activity = context.RawArray("c", ACTIVITY_BYTES)
                process = context.Process(target=stage_main, name=f"hybrid stage {me} ({device})", daemon=True,
                                          args=(me, self.model, self.plan, self.build, theirs, activity, store,
                                                self.timeout, os.getpid(), wires[me]))
                _launch(process)
                theirs.close()
                self.processes.append(process)
                self.conns.append(mine)
                self.activity.append(activity)
        finally:
            self.model.hybrid_group = group
            for wire in wires:  # the stages hold their own ends now
                for end in [*wire[0].values(), *wire[1].values()] if wire is not None else ():
                    end.close()
        self.buffers = [{} for _ in devices]
        self.peak_mib = [0.0 for _ in devices]  # each stage's, as its last backward reported it
        self.lent = {}
        self._replies(range(len(devices)), START_SECONDS, "starting")
        self.pointers = self._shared_pointers()

    def close(self) -> None:
        """End every stage (asked first, then made to)."""
        if self._finalizer is not None:
            self._finalizer()
        self.processes, self.conns, self.activity, self.buffers, self.lent, self.sums = [], [], [], [], {}, {}
        self._finalizer = None

    def _ready(self) -> None:
        if self.processes and self._shared_pointers() != self.pointers:
            self.close()  # a parameter's storage was replaced (.half(), a load): share the new ones
        if not self.processes:
            self.start()

    # -- one step ----------------------------------------------------------------

    def loss_sums(self, net_input: Dict[str, Tensor], target: Tensor, shard_loss, shape,
                  report_usage: Optional[Callable[[DeviceUsage], None]] = None) -> Tuple[Tensor, ...]:
        """The batch's summed shard losses, run on the stages; their
        backward runs the stages' backward, after which ``report_usage``
        gets how busy each device was (each stage's time in its cells)."""
        self._ready()
        self.report_usage = report_usage
        # laid out once for every stage, the single-device masks drawn from the trainer's generator
        layout = self.lay_out(self.model, self.plan, net_input, target, shape.chunk_length, shape.micro_batches,
                              shape.single_device_masks, None, shape.softmax_chunks)
        grad_enabled = torch.is_grad_enabled()
        seed = int(torch.randint(0, 1 << 62, ()).item()) if grad_enabled else 0
        state = capture()  # the stages' autocast; what other modules carry into the backward (the test harness)
        step = {"layout": layout, "shard_loss": shard_loss,
                "seed": seed, "grad_enabled": grad_enabled, "autocast": state.autocast, "training": self.model.training}
        try:
            message = plain_tensors.dumps(("forward", step))
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            raise WorkerError(f"--hybrid-workers processes: the loss {shard_loss!r} cannot be sent to the stages "
                              f"({error}); use --criterion hybrid_cross_entropy with --output-loss-chunk-rows > 0, "
                              f"or --hybrid-workers threads") from error
        self._synchronize()
        started = time.perf_counter()
        for conn in self.conns:
            conn.send_bytes(message)
        replies = self._replies(range(len(self.conns)), self.timeout, "forward")
        self.usage = DeviceUsage([reply["busy"] for reply in replies], time.perf_counter() - started)
        results: Dict[int, Tuple[int, List[Tuple[Tensor, bool]]]] = {}
        for me, reply in enumerate(replies):
            for cell, values in reply["results"].items():
                results[cell] = (me, values)
        cells = sorted(results)
        tuples: List[List[Tensor]] = []
        refs, differentiable = [], []
        for cell in cells:
            me, values = results[cell]
            device = self.plan.devices[me]
            row = []
            for position, (value, requires_grad) in enumerate(values):
                value = value.to(device)
                row.append(value)
                if grad_enabled and requires_grad:
                    refs.append((cell, position, me))
                    differentiable.append(value)
            tuples.append(row)
        if differentiable:
            anchor = torch.empty(0, requires_grad=True)
            through = _StageBoundary.apply(self, state, tuple(refs), anchor, *differentiable)
            flowing = dict(zip([(cell, position) for cell, position, _ in refs], through))
            tuples = [[flowing.get((cell, position), value) for position, value in enumerate(row)]
                      for cell, row in zip(cells, tuples)]
        out = [tuple(row) for row in tuples]
        return sum_on(out, out[0][0].device)

    def backward(self, refs: Sequence[Tuple[int, int, int]], grads: Sequence[Optional[Tensor]]) -> None:
        """The stages' backward pass from the loss sums' gradients; their
        gradients added into the parameters in stage order, each part as
        soon as that order allows (:mod:`.gradient_sums`): a replica's
        while the stages' backward passes go on."""
        for position, buffer in self.lent.items():
            if self.params[position].grad is buffer:  # a second backward before the optimizer used it
                self.params[position].grad = buffer.clone()
        self.lent = {}
        per_stage: List[Dict] = [{} for _ in self.conns]
        for (cell, position, me), grad in zip(refs, grads):
            if grad is not None:
                per_stage[me][(cell, position)] = grad.detach().cpu()
        self._synchronize()
        started = time.perf_counter()
        for conn, mine in zip(self.conns, per_stage):
            conn.send_bytes(plain_tensors.dumps(("backward", mine)))
        sums = StageOrderSums(self.params, len(self.conns), self.sums)
        self.handed_mid_pass = {}

        def hand_over(me: int, reply: Dict) -> None:  # a stage's gradients: some mid-pass, the rest at its end
            device = self.plan.devices[me]
            self.buffers[me].update({key: shared_from(buffer, device) for key, buffer in reply["new_buffers"].items()})
            mid_pass = "busy" not in reply
            with torch.no_grad():
                sums.offer(me, reply["filled"], [self.buffers[me][position, mid_pass] for position in reply["filled"]],
                           mid_pass)
            if not mid_pass:
                sums.end(me)
            else:
                self.handed_mid_pass.setdefault(me, []).extend(reply["filled"])

        replies = self._replies(range(len(self.conns)), self.timeout, "backward", hand_over)
        if self.report_usage is not None and self.usage is not None:
            self.report_usage(DeviceUsage([busy + reply["busy"] for busy, reply in zip(self.usage.busy, replies)],
                                          self.usage.wall + time.perf_counter() - started))
        self.sent = [0, 0, 0.0]  # the step's messages and bytes between the stages and the seconds sending took
        for me, reply in enumerate(replies):
            self.sent = [total + part for total, part in zip(self.sent, reply["sent"])]
            self.peak_mib[me] = reply["peak_mib"]
        self.sent_so_far = [total + part for total, part in zip(self.sent_so_far, self.sent)]
        with torch.no_grad():
            self.lent = sums.into_params()
        self.added_early = sums.added_early

    # -- waiting ---------------------------------------------------------------------

    def _synchronize(self) -> None:
        """The stages read the parameters only after the trainer's GPU
        work on them (the optimizer's step) is done."""
        for device in {param.device for param in self.params if param.device.type == "cuda"}:
            torch.cuda.current_stream(device).synchronize()

    def _replies(self, stages: Sequence[int], timeout: float, doing: str,
                 hand_over: Optional[Callable[[int, Dict], None]] = None) -> List:
        """Every stage's reply to the command just sent, in stage order.  A
        failure, a death or the timeout ends every stage and raises, naming
        the stage, its device and its cell; after a first failure the others
        have ``GRACE`` seconds to report theirs, so that the cause is named
        (a stage that died, or one whose own cell failed) rather than a
        stage that lost its peer because of it.  ``hand_over`` gets each
        stage's gradients as they come: a replica's in the middle of its
        backward pass ("part" messages), then its reply."""
        replies: Dict[int, object] = {}
        # stage -> (0 died, 1 its own error, 2 lost a peer; what happened; the stage's traceback)
        failures: Dict[int, Tuple[int, str, str]] = {}
        waiting = set(stages)
        deadline = time.monotonic() + timeout
        sentinels = {self.processes[me].sentinel: me for me in waiting}
        conns = {self.conns[me]: me for me in waiting}
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                if failures:
                    break
                text = "; ".join(f"hybrid stage {me} ({self.plan.devices[me]}) is still in {self._activity(me)}"
                                 for me in sorted(waiting))
                self.close()
                raise WorkerTimeout(f"{text} after {timeout:g} s (--hybrid-timeout), {doing}")
            ready = wait([conn for conn, me in conns.items() if me in waiting]
                         + [sentinel for sentinel, me in sentinels.items() if me in waiting], timeout=min(left, 1.0))
            for item in ready:
                me = conns.get(item, sentinels.get(item))
                if me not in waiting:
                    continue
                conn = self.conns[me]
                message = None
                if item in conns or conn.poll():
                    try:
                        message = conn.recv()
                    except (EOFError, OSError):
                        pass
                if message is not None and message[0] == "part":
                    if not failures:  # after a failure the step is lost: only the causes are wanted
                        self._hand_over(hand_over, me, message[1])
                    continue
                waiting.discard(me)
                if message is None:
                    failures[me] = (0, self._death(me), "")
                elif message[0] == "error":
                    text, peer_lost = message[1]
                    first = text.strip().splitlines()[0] if text.strip() else "?"
                    failures[me] = (2 if peer_lost else 1, f"failed: {first}", "\n" + text)
                else:  # "ok", or "ready" at the start
                    replies[me] = message[1]
                    for hook, report in zip(stage_hooks(), (message[1] or {}).get("reports", ())):
                        hook.received(me, report)  # the stage's side of what other modules added to it
                    if hand_over is not None and not failures:
                        self._hand_over(hand_over, me, message[1])
                if failures:
                    deadline = min(deadline, time.monotonic() + GRACE)
        if failures:
            me = min(failures, key=lambda stage: (failures[stage][0], stage))
            self.close()
            _, what, stack = failures[me]
            raise WorkerError(f"hybrid stage {me} ({self.plan.devices[me]}) {what}, {doing}{stack}")
        return [replies[me] for me in stages]

    def _hand_over(self, hand_over, me: int, reply: Dict) -> None:
        try:
            hand_over(me, reply)
        except BaseException:
            self.close()  # the step is lost: no stage is left waiting for a command that will not come
            raise

    def _death(self, me: int) -> str:
        process, where = self.processes[me], self._activity(me)
        process.join(1.0)
        return f"died (exit code {process.exitcode}) in {where}"

    def _activity(self, me: int) -> str:
        text = self.activity[me].value.decode("utf-8", "replace") if me < len(self.activity) else ""
        return text or "its start"


class _StageBoundary(torch.autograd.Function):
    """The loss sums as ordinary autograd tensors; their backward runs the
    stages' backward."""

    @staticmethod
    def forward(ctx, stages: StageProcesses, state, refs, anchor: Tensor, *values: Tensor):
        ctx.stages, ctx.refs = stages, refs
        ctx.state = state  # what other modules carry into autograd's backward (the test harness's modes)
        ctx.set_materialize_grads(False)
        return tuple(value.detach().clone() for value in values)

    @staticmethod
    def backward(ctx, *grads):
        with extras_entered(ctx.state), step_scope():  # the step's backward half, on the trainer's side
            ctx.stages.backward(ctx.refs, grads)
        return (None, None, None, None) + (None,) * len(grads)


def host_memory(devices) -> bool:
    """Whether every device is plain host memory (``cpu``), whose stages
    talk through pipes alone (:mod:`.host_wire`)."""
    return all(device.type == "cpu" and device.index is None for device in devices)


def clear_dead_stores(folder: Optional[str] = None) -> List[str]:
    """Remove the store folders of GPU stages whose trainer is gone (one
    ended by SIGKILL cannot remove its own); the folders removed."""
    removed = []
    folder = folder or tempfile.gettempdir()
    for path in glob.glob(os.path.join(folder, STORE_PREFIX + "*-*")):
        owner = os.path.basename(path)[len(STORE_PREFIX):].split("-")[0]
        if owner.isdigit() and not _alive(int(owner)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _end(processes, conns, store_dir: Optional[str], owner: int) -> None:
    """Ask every stage to stop, then end those that do not within a second
    (in the trainer's process only: a forked stage inherits this too)."""
    if os.getpid() != owner:
        return
    for conn in conns:
        try:
            conn.send_bytes(pickle.dumps(("stop", None)))
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + 1.0
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(5.0)
    for conn in conns:
        conn.close()
    if store_dir:
        shutil.rmtree(store_dir, ignore_errors=True)


# Stage processes are started from one thread that lives as long as the
# trainer's process: Linux's parent-death signal follows the thread that
# forked, not the process, and a caller's thread may end before the group.
_launches: "queue.Queue" = queue.Queue()
_launcher: Optional[threading.Thread] = None
_launcher_lock = threading.Lock()


def _launch(process) -> None:
    global _launcher
    with _launcher_lock:
        if _launcher is None or not _launcher.is_alive():
            _launcher = threading.Thread(target=_launch_loop, name="hybrid stage launcher", daemon=True)
            _launcher.start()
    done: "queue.Queue" = queue.Queue()
    _launches.put((process, done))
    error = done.get()
    if error is not None:
        raise error


def _launch_loop() -> None:
    while True:
        process, done = _launches.get()
        try:
            process.start()
            done.put(None)
        except BaseException as error:  # handed to the caller
            done.put(error)
