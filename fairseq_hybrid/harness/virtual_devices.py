"""Virtual devices: CPU devices that behave like distinct GPUs, for tests.

On a CPU every "device" of a group is the same memory, so code that
forgets to move a tensor, or moves it to the wrong worker, runs fine there
and fails on the first step on two GPUs.  Under :func:`virtual_devices`,
the CPU devices ``cpu:0``, ``cpu:1``, ... of a group (``--hybrid-devices
cpu:0,cpu:1``) are told apart the way CUDA tells ``cuda:0`` from ``cuda:1``:

* every tensor storage carries the virtual device it lives on (untagged
  storages are host memory, as CPU tensors are beside CUDA ones);
  ``tensor.device`` answers ``cpu:N`` for it, so ``p.device.index`` is N;
* a tensor gets its device from where it was made: ``.to(cpu:N)`` and
  factories given ``device=cpu:N`` put it on N, any other op puts its
  outputs on the device of its inputs;
* an op whose inputs live on two devices raises the error CUDA raises
  ("Expected all tensors to be on the same device"), naming the op and the
  cell; so does a non-scalar host tensor mixed with a device tensor, except
  where CUDA takes host tensors (the lengths of packed sequences, index
  tensors); ``_foreach_*`` ops are checked element by element, as CUDA
  checks them;
* moves between devices are copies, whose backward moves the gradient back;
* inside a cell of the hybrid engine, ops that make the host wait for the
  device (``.item()``, ``nonzero``, host-to-device and device-to-host
  copies) are recorded in :attr:`VirtualDevices.syncs`.

The harness is one ``TorchFunctionMode`` (device queries and moves, seen
before dispatch) and one ``TorchDispatchMode`` (every aten op, forward and
backward, tagged by storage) per thread; the hybrid engine's workers enter
them through :mod:`fairseq_hybrid.parallel.runtime.thread_state`.  Setting
``FAIRSEQ_HYBRID_VIRTUAL_DEVICES=1`` turns it on for a whole process (how
``fairseq-train`` runs under it in the tests).  It is slow (every op goes
through Python) and meant for small test models only.
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
import weakref
from contextlib import ExitStack, contextmanager
from typing import Dict, Iterator, List, NamedTuple, Optional

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from . import virtual_streams
from ..parallel.runtime import host_batch, stream_handoff, thread_state
from ..parallel.runtime.worker import current_worker
from .virtual_memory import DeviceMemory
from .virtual_streams import StreamChecker, reads_and_writes

ENVIRONMENT_VARIABLE = "FAIRSEQ_HYBRID_VIRTUAL_DEVICES"
BATCH_DEVICE_VARIABLE = "FAIRSEQ_HYBRID_VIRTUAL_BATCH_DEVICE"  # e.g. cpu:0: batches go there, as fairseq's to cuda:0

HOST = None  # the tag of host memory

# aten ops (overload packet names) that CUDA runs with host tensors among
# their inputs, and whether that makes the host wait or copy.
HOST_ARGUMENTS_ALLOWED = {
    "_pack_padded_sequence": False,  # lengths live on the host by contract
    "_pad_packed_sequence": False,  # batch_sizes
    "lstm": False,  # packed batch_sizes
    "_cudnn_rnn": False,
    "index": True,  # CUDA copies host index tensors to the device
    "index_put": True,
    "index_put_": True,
}
# Ops whose outputs include host tensors: (op, positions of those outputs).
HOST_OUTPUTS = {
    "_pack_padded_sequence": (1,),  # batch_sizes
    "_pad_packed_sequence": (1,),  # lengths
}
# Ops that make the host wait for the device.
SYNCHRONISING = {"_local_scalar_dense", "nonzero", "is_nonzero", "equal", "masked_select", "_unique2",
                 "unique_consecutive", "unique_dim", "repeat_interleave"}
# Ops that move data between devices (their inputs may differ in device).
COPIES = {"copy_", "_copy_from", "_copy_from_and_resize"}


class Sync(NamedTuple):
    """An op that made the host wait for a device inside a group's step
    (in a cell, or outside its cells), and the innermost line outside torch
    that called it."""

    op: str
    cell: str
    device: Optional[int]
    caller: str = ""


def _caller() -> str:
    for frame in reversed(traceback.extract_stack()[:-3]):
        if f"{os.sep}torch{os.sep}" not in frame.filename and frame.filename != __file__:
            return f"{frame.filename}:{frame.lineno} ({frame.name})"
    return ""


class VirtualDevices:
    """The state of one harness: tags, recorded synchronisations, the
    memory each device holds (:attr:`memory`) and, unless turned off, the
    virtual streams' checker (:attr:`streams`)."""

    def __init__(self, streams: bool = True):
        self._tags: Dict[StorageWeakRef, Optional[int]] = {}
        self._sizes: Dict[StorageWeakRef, int] = {}
        self._lock = threading.RLock()  # a storage's finalizer may run on any thread, inside any call
        self._pinned: Dict[StorageWeakRef, None] = {}  # host storages "pinned" (Tensor.pin_memory)
        self.syncs: List[Sync] = []  # inside cells
        self.step_syncs: List[Sync] = []  # in a group's step outside its cells (staging, hand-offs, reduce)
        self.memory = DeviceMemory()
        self.touched: set = set()  # the devices whose memory an op of this process read or wrote
        self.stage_touched: Dict[int, set] = {}  # the same, as each stage process reported it
        self.streams: Optional[StreamChecker] = StreamChecker() if streams else None

    # -- tags ----------------------------------------------------------------

    def device_of(self, tensor: torch.Tensor) -> Optional[int]:
        """The virtual device of ``tensor`` (None: host memory)."""
        if tensor.layout != torch.strided or tensor.device.type != "cpu":
            return HOST
        return self._tags.get(StorageWeakRef(tensor.untyped_storage()), HOST)

    def place(self, tensor: torch.Tensor, device: Optional[int]) -> torch.Tensor:
        """Tag ``tensor``'s storage with ``device``; a storage new to a
        device counts as allocated there (on the calling thread's current
        stream) until it dies or moves."""
        if tensor.layout != torch.strided or tensor.device.type != "cpu":
            return tensor
        storage = tensor.untyped_storage()
        key = StorageWeakRef(storage)
        with self._lock:
            before = self._tags.get(key, HOST)
            if before == device:
                if device is not HOST and storage.nbytes() != self._sizes[key]:  # resized in place
                    self.memory.allocated(device, storage.nbytes() - self._sizes[key])
                    self._sizes[key] = storage.nbytes()
                return tensor
            if before is not HOST:
                self.memory.freed(before, self._sizes.pop(key))
                if self.streams is not None:
                    self.streams.freed(key)
            if device is HOST:
                self._tags.pop(key, None)
                return tensor
            if key not in self._tags:
                weakref.finalize(storage, self._storage_freed, key).atexit = False
            self._tags[key] = device
            self._sizes[key] = storage.nbytes()
            self.memory.allocated(device, storage.nbytes())
            if self.streams is not None:
                self.streams.allocated(key, device)
        return tensor

    def _storage_freed(self, key: StorageWeakRef) -> None:
        with self._lock:
            device = self._tags.pop(key, HOST)
            if device is HOST:
                return
            self.memory.freed(device, self._sizes.pop(key))
            if self.streams is not None:
                self.streams.freed(key)

    def pin(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor.pin_memory()``: a host copy that counts as page-locked
        (a copy from it with ``non_blocking`` is queued, not waited for)."""
        out = tensor.clone(memory_format=torch.contiguous_format)
        storage = out.untyped_storage()
        key = StorageWeakRef(storage)
        with self._lock:
            self._pinned[key] = None
        weakref.finalize(storage, self._pinned.pop, key, None).atexit = False
        return out

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return (self.device_of(tensor) is HOST and tensor.layout == torch.strided
                and StorageWeakRef(tensor.untyped_storage()) in self._pinned)

    def record_sync(self, op: str, device: Optional[int]) -> None:
        """An op that makes the host wait for ``device``, where a step must
        not: inside a cell (``syncs``), or anywhere else in a group's step
        (``step_syncs``): on the caller's thread (its staging, the backward
        pass's hand-off, the replicas' reduce; ``thread_state.in_step``) or
        on a worker's thread outside its cells (an input's arrival, a
        gradient's sum, a replica's send), where a worker only ever runs a
        step's jobs."""
        worker = current_worker()
        if worker is not None and worker.cell is not None:
            with self._lock:
                self.syncs.append(Sync(op, worker.cell, device, _caller()))
        elif worker is not None or thread_state.in_step():
            with self._lock:
                self.step_syncs.append(Sync(op, f"outside the cells ({threading.current_thread().name})", device,
                                            _caller()))

    # -- entering ------------------------------------------------------------

    @contextmanager
    def entered(self) -> Iterator["VirtualDevices"]:
        """Both modes on the calling thread (fresh instances: a mode object
        keeps per-entry state and must not be shared between threads)."""
        from torch.overrides import _get_current_function_mode_stack
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        def mine(stack, kind):
            return any(isinstance(mode, kind) and mode.harness is self for mode in stack)

        with ExitStack() as stack:
            # (re-entered where autograd runs Python backward code, which sees
            # dispatch modes but no function modes)
            if not mine(_get_current_dispatch_mode_stack(), _DeviceDispatch):
                stack.enter_context(_DeviceDispatch(self))
            if not mine(_get_current_function_mode_stack(), _DeviceFunctions):
                stack.enter_context(_DeviceFunctions(self))
            if self.streams is not None and virtual_streams.active_checker() is not self.streams:
                stack.enter_context(virtual_streams.entered(self.streams))
            yield self

    def capture(self):
        """:mod:`fairseq_hybrid.parallel.runtime.thread_state` hook: a worker enters the harness
        when its caller is inside it (and, with streams, starts its job
        knowing what the caller's streams did)."""
        inside = getattr(_local, "harness", None) is self or (
            self.streams is not None and virtual_streams.active_checker() is self.streams)
        if not inside:
            return None
        return _JobEntry(self, self.streams.hand_off() if self.streams is not None else None)


class _JobEntry:
    """What a worker enters for one job of a caller inside the harness."""

    def __init__(self, harness: VirtualDevices, hand_off):
        self.harness, self.hand_off = harness, hand_off

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self.harness.entered():
            if self.hand_off is None:
                yield
            else:
                with self.harness.streams.job(self.hand_off):
                    yield

    def joined(self) -> None:
        if self.hand_off is not None:
            self.harness.streams.joined(self.hand_off)


_local = threading.local()
_DEVICE_DESCRIPTOR = torch.Tensor.device


@contextmanager
def _copying(harness: VirtualDevices, source: Optional[int], destination: Optional[int]) -> Iterator[None]:
    """A copy between devices (or host memory), queued on the streams CUDA
    queues it on; the dispatch mode leaves the copy's own ops alone."""
    previous = getattr(_local, "moving", False)
    _local.moving = True
    try:
        if harness.streams is None:
            yield
        else:
            with harness.streams.copying(source, destination):
                yield
    finally:
        _local.moving = previous


def _copied(harness: VirtualDevices, op: str, source: torch.Tensor, source_device, destination: torch.Tensor,
            destination_device) -> None:
    """The stream checker's record of one copy's read and write (inside
    :func:`_copying`)."""
    if harness.streams is not None:
        device = source_device if source_device is not HOST else destination_device
        harness.streams.access(op, device, [source], [destination], harness.device_of)


def _where(harness: VirtualDevices) -> str:
    worker = current_worker()
    if worker is not None and worker.cell is not None:
        return f" in {worker.cell}"
    return " on the calling thread"


def _worker_device() -> Optional[int]:
    """Where a factory without a device index puts its tensor: on a worker
    thread that worker's device (a stage's thread: while it runs a cell),
    elsewhere the host."""
    worker = current_worker()
    if worker is None or (not worker.cells_only and worker.cell is None):
        return HOST
    return _virtual_index(worker.device)


def _name(device: Optional[int]) -> str:
    return "cpu (host memory)" if device is HOST else f"cpu:{device}"


def _mixed(op: str, first: Optional[int], second: Optional[int], harness: VirtualDevices) -> RuntimeError:
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, {_name(first)} and "
        f"{_name(second)}! (virtual devices: {op}{_where(harness)})"
    )


def _virtual_index(device) -> Optional[int]:
    """cpu:N -> N; plain cpu (and no device) -> host."""
    if device is None:
        return HOST
    device = torch.device(device)
    return device.index if device.type == "cpu" else HOST


class _Move(torch.autograd.Function):
    """A copy to another (virtual) device; its backward copies back."""

    @staticmethod
    def forward(ctx, tensor, harness, source, destination, dtype):
        ctx.harness, ctx.source, ctx.destination, ctx.dtype = harness, source, destination, tensor.dtype
        return _move(harness, tensor.detach(), source, destination, dtype or tensor.dtype)

    @staticmethod
    def backward(ctx, grad):
        harness = ctx.harness
        out = _move(harness, grad.detach(), harness.device_of(grad), ctx.source, ctx.dtype)
        return out, None, None, None, None


def _move(harness: VirtualDevices, tensor: torch.Tensor, source, destination, dtype) -> torch.Tensor:
    with _copying(harness, source, destination):
        out = harness.place(tensor.to(dtype=dtype, copy=True), destination)
        what = "host to device" if source is HOST else "device to host" if destination is HOST else "between devices"
        _copied(harness, f"copy {what}", tensor, source, out, destination)
    return out


class _DeviceFunctions(TorchFunctionMode):
    """Device queries and moves, before dispatch: ``tensor.device`` answers
    the virtual device, and ``.to(device)`` / ``.cpu()`` move between them."""

    def __init__(self, harness: VirtualDevices):
        super().__init__()
        self.harness = harness

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__self__", None) is _DEVICE_DESCRIPTOR:
            device = self.harness.device_of(args[0])
            return func(*args, **kwargs) if device is HOST else torch.device("cpu", device)
        if func is torch.Tensor.cpu:
            return self._move(args[0], HOST, None)
        if func is torch.Tensor.pin_memory:  # CUDA's page-locked host memory, which a CPU build lacks
            return self.harness.pin(args[0])
        if func is torch.Tensor.is_pinned:
            return self.harness.is_pinned(args[0])
        if func is torch.Tensor.share_memory_:  # new storage in shared memory: still on its device
            device = self.harness.device_of(args[0])
            return self.harness.place(func(*args, **kwargs), device)
        if func is torch.Tensor.type_as and isinstance(args[1], torch.Tensor):
            # CUDA: ``type_as`` takes the other tensor's device too (a tensor type names one)
            other = self.harness.device_of(args[1])
            return self._move(args[0], other, args[1].dtype) if other != self.harness.device_of(args[0]) \
                else func(*args, **kwargs)
        if func is torch.Tensor.to and isinstance(args[0], torch.Tensor):
            tensor = args[0]
            if len(args) > 1 and isinstance(args[1], torch.Tensor):
                other = args[1]
                device, dtype = torch.device("cpu", self.harness.device_of(other)) if self.harness.device_of(
                    other) is not HOST else torch.device("cpu"), other.dtype
                non_blocking = bool(kwargs.get("non_blocking", len(args) > 2 and args[2]))
            else:
                device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            if device is not None and device.type == "cpu":
                return self._move(tensor, _virtual_index(device), dtype, copy=bool(kwargs.get("copy", False)),
                                  non_blocking=bool(non_blocking))
        return func(*args, **kwargs)

    def _move(self, tensor: torch.Tensor, destination: Optional[int], dtype, copy: bool = False,
              non_blocking: bool = False) -> torch.Tensor:
        source = self.harness.device_of(tensor)
        if source == destination and not copy:
            return tensor if dtype in (None, tensor.dtype) else tensor.to(dtype=dtype)
        self.harness.touched.update({source, destination} - {HOST})
        # CUDA queues a host-to-device copy only from pinned, contiguous memory with non_blocking
        # (cuda/Copy.cu: a strided source is first made contiguous in pageable memory); from pageable
        # memory, or the other way, the host waits
        queued = source is HOST and non_blocking and self.harness.is_pinned(tensor) and tensor.is_contiguous()
        # (a scalar from the host is copied with its value, as CUDA's fill of a 0-dim tensor takes it; a
        # scalar back to the host waits for the device like any other copy)
        if (source is HOST) != (destination is HOST) and (tensor.dim() > 0 or destination is HOST) and not queued:
            self.harness.record_sync("host-to-device copy" if source is HOST else "device-to-host copy",
                                     destination if source is HOST else source)
        return _Move.apply(tensor, self.harness, source, destination, dtype)


class _DeviceDispatch(TorchDispatchMode):
    """Every aten op: check that its inputs share a device, tag its outputs."""

    def __init__(self, harness: VirtualDevices):
        super().__init__()
        self.harness = harness

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(_local, "moving", False):
            return func(*args, **kwargs)  # the copy of a move: its accesses are the move's (_copied)
        harness = self.harness
        op = func.overloadpacket.__name__
        if op in COPIES:
            destination, source = harness.device_of(args[0]), harness.device_of(args[1])
            harness.touched.update({source, destination} - {HOST})
            if destination != source:
                with _copying(harness, source, destination):
                    out = func(*args, **kwargs)
                    _copied(harness, f"aten.{op}", args[1], source, args[0], destination)
                if (source is HOST) != (destination is HOST) and args[1].dim() > 0:
                    harness.record_sync(f"{op} between host and device", destination if source is HOST else source)
                return out
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if not tensors and "device" not in kwargs:
            device = _worker_device()
        elif op.startswith("_foreach_"):
            device = self._check_foreach(op, args)
        else:
            device = self._check(op, tensors)
        if "device" in kwargs and kwargs["device"] is not None:
            requested = _virtual_index(kwargs["device"])
            if requested is not HOST:
                device = requested  # factories given cpu:N, and dispatch-level moves
            elif not tensors:
                device = _worker_device()  # factories: on a worker, its device (C++ makes them with options())
        if device is not HOST:
            harness.touched.add(device)
        if device is not HOST and op in SYNCHRONISING:
            harness.record_sync(op, device)
        out = func(*args, **kwargs)
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                harness.place(tensor, device)
        for position in HOST_OUTPUTS.get(op, ()):
            harness.place(out[position], HOST)
        if device is not HOST and harness.streams is not None:
            reads, writes = reads_and_writes(func, args, kwargs, out)
            harness.streams.access(f"aten.{op}", device, reads, writes, harness.device_of)
            if op in SYNCHRONISING:
                harness.streams.current_stream(device).synchronize()  # the host waits for the op
        return out

    def _check(self, op: str, tensors: List[torch.Tensor]) -> Optional[int]:
        harness = self.harness
        devices = {harness.device_of(t) for t in tensors} - {HOST}
        if len(devices) > 1:
            first, second = sorted(devices)[:2]
            raise _mixed(f"aten.{op}", first, second, harness)
        device = next(iter(devices), HOST)
        if device is not HOST:
            hosted = [t for t in tensors if harness.device_of(t) is HOST and t.dim() > 0]
            if hosted:
                if op not in HOST_ARGUMENTS_ALLOWED:
                    raise _mixed(f"aten.{op}", device, HOST, harness)
                if HOST_ARGUMENTS_ALLOWED[op]:
                    harness.record_sync(f"{op} with a host index", device)
        return device

    def _check_foreach(self, op: str, args) -> Optional[int]:
        """``_foreach_*``: element i of every list, and any single tensor
        argument (a scalar tensor), must share element i's device."""
        harness = self.harness
        lists = [a for a in args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
        singles = [a for a in args if isinstance(a, torch.Tensor)]
        devices = set()
        for i in range(len(lists[0]) if lists else 0):
            self._check(f"{op} (element {i})", [lst[i] for lst in lists] + singles)
            devices.add(harness.device_of(lists[0][i]))
        return devices.pop() if len(devices) == 1 else HOST


_active: Optional[VirtualDevices] = None
_active_context = None


@contextmanager
def virtual_devices(streams: bool = True) -> Iterator[VirtualDevices]:
    """Run the block (and the hybrid workers it starts jobs on) with virtual
    devices; yields the harness, whose ``syncs``, ``memory`` and ``streams``
    the block may inspect.  ``streams=False``: no virtual streams (the
    engine then runs as on plain CPU, without stream checks)."""
    harness = VirtualDevices(streams)
    thread_state.register(harness.capture)
    stages = _StageSide(harness)
    thread_state.register_stage_hook(stages)
    previous = getattr(_local, "harness", None), stream_handoff.virtual_shared
    _local.harness = harness
    stream_handoff.virtual_shared = lambda tensor, device: harness.place(tensor, device.index)
    try:
        with harness.entered():
            yield harness
    finally:
        _local.harness, stream_handoff.virtual_shared = previous
        thread_state.unregister_stage_hook(stages)
        thread_state.unregister(harness.capture)


class _StageSide(thread_state.StageHook):
    """The harness in a stage process (``--hybrid-workers processes``,
    forked with the trainer's harness): the stage checks its own ops, and
    the waits it records and the devices it touched reach the trainer's
    harness with each reply, named by the stage."""

    def __init__(self, harness: VirtualDevices):
        self.harness = harness

    def entered(self, device: torch.device):
        harness = self.harness
        harness.syncs, harness.step_syncs = [], []  # what the trainer recorded before the fork is the trainer's
        harness.touched = set()
        _local.harness = harness
        return harness.entered()

    def report(self):
        harness = self.harness
        with harness._lock:
            report = ([tuple(sync) for sync in harness.syncs], [tuple(sync) for sync in harness.step_syncs],
                      sorted(harness.touched))
            harness.syncs, harness.step_syncs = [], []
        return report

    def received(self, stage: int, report) -> None:
        # named by the stage: a wait in one of its cells, or on its thread outside its cells
        def named(op, cell, device, caller):
            return Sync(op, f"stage {stage}" if cell.startswith("outside the cells") else f"{cell} in stage {stage}",
                        device, caller)

        syncs, step_syncs, touched = report
        with self.harness._lock:
            self.harness.stage_touched.setdefault(stage, set()).update(touched)
            self.harness.syncs += [named(*sync) for sync in syncs]
            self.harness.step_syncs += [named(*sync) for sync in step_syncs]


def enable_from_environment() -> Optional[VirtualDevices]:
    """``FAIRSEQ_HYBRID_VIRTUAL_DEVICES=1``: the harness for the rest of the
    process (entered on the importing thread and never left)."""
    global _active, _active_context
    if os.environ.get(ENVIRONMENT_VARIABLE, "") not in ("1", "true", "yes") or _active is not None:
        return _active
    _active_context = virtual_devices()  # kept: a collected context manager would leave the modes
    _active = _active_context.__enter__()
    logger = logging.getLogger(__name__)
    logger.warning(
        "%s=1: virtual-device test harness on (cpu:N devices behave as distinct GPUs, with virtual streams; "
        "every op is checked, so everything runs slowly)", ENVIRONMENT_VARIABLE)
    batch_device = os.environ.get(BATCH_DEVICE_VARIABLE, "")
    if batch_device:
        _put_batches_on(torch.device(batch_device))
        logger.warning("%s=%s: every batch is put on %s before its step, as fairseq puts it on cuda:0",
                       BATCH_DEVICE_VARIABLE, batch_device, batch_device)
    return _active


def _put_batches_on(device: torch.device) -> None:
    """fairseq's trainer moves each batch to ``cuda:0`` (``_prepare_sample``);
    with ``--cpu`` it leaves it in host memory, which would hide the
    engine's copies from the batch's device."""
    from fairseq import utils
    from fairseq.trainer import Trainer

    prepare = Trainer._prepare_sample

    def prepare_on_device(self, sample, is_dummy=False):
        sample, dummy = prepare(self, sample, is_dummy)
        moved = utils.apply_to_sample(lambda tensor: tensor.to(device, non_blocking=True), sample)
        host_batch.remember(sample, moved)  # as fairseq's move from the pinned batch (fairseq_patches)
        return moved, dummy

    Trainer._prepare_sample = prepare_on_device
