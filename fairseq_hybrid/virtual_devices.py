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
them through :mod:`fairseq_hybrid.parallel.thread_state`.  Setting
``FAIRSEQ_HYBRID_VIRTUAL_DEVICES=1`` turns it on for a whole process (how
``fairseq-train`` runs under it in the tests).  It is slow (every op goes
through Python) and meant for small test models only.
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
from contextlib import ExitStack, contextmanager
from typing import Dict, Iterator, List, NamedTuple, Optional

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .parallel import thread_state
from .parallel.worker import current_worker

ENVIRONMENT_VARIABLE = "FAIRSEQ_HYBRID_VIRTUAL_DEVICES"

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
    """An op that made the host wait for a device inside a cell, and the
    innermost line outside torch that called it."""

    op: str
    cell: str
    device: Optional[int]
    caller: str = ""


def _caller() -> str:
    for frame in reversed(traceback.extract_stack()[:-3]):
        if f"{os.sep}torch{os.sep}" not in frame.filename and not frame.filename.endswith("virtual_devices.py"):
            return f"{frame.filename}:{frame.lineno} ({frame.name})"
    return ""


class VirtualDevices:
    """The state of one harness: tags and recorded synchronisations."""

    def __init__(self):
        self._tags: Dict[StorageWeakRef, Optional[int]] = {}
        self._lock = threading.Lock()
        self._writes = 0
        self.syncs: List[Sync] = []

    # -- tags ----------------------------------------------------------------

    def device_of(self, tensor: torch.Tensor) -> Optional[int]:
        """The virtual device of ``tensor`` (None: host memory)."""
        if tensor.layout != torch.strided or tensor.device.type != "cpu":
            return HOST
        return self._tags.get(StorageWeakRef(tensor.untyped_storage()), HOST)

    def place(self, tensor: torch.Tensor, device: Optional[int]) -> torch.Tensor:
        if tensor.layout != torch.strided or tensor.device.type != "cpu":
            return tensor
        key = StorageWeakRef(tensor.untyped_storage())
        with self._lock:
            if device is HOST:
                self._tags.pop(key, None)
            else:
                self._tags[key] = device
            self._writes += 1
            if self._writes % 20000 == 0:
                self._tags = {k: v for k, v in self._tags.items() if not k.expired()}
        return tensor

    def record_sync(self, op: str, device: Optional[int]) -> None:
        worker = current_worker()
        if worker is not None and worker.cell is not None:
            with self._lock:
                self.syncs.append(Sync(op, worker.cell, device, _caller()))

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
            yield self

    def capture(self):
        """:mod:`.parallel.thread_state` hook: a worker enters the harness
        when its caller is inside it."""
        return self.entered if getattr(_local, "harness", None) is self else None


_local = threading.local()
_DEVICE_DESCRIPTOR = torch.Tensor.device


def _where(harness: VirtualDevices) -> str:
    worker = current_worker()
    if worker is not None and worker.cell is not None:
        return f" in {worker.cell}"
    return " on the calling thread"


def _worker_device() -> Optional[int]:
    """Where a factory without a device index puts its tensor: on a worker
    thread that worker's device, elsewhere the host."""
    worker = current_worker()
    return HOST if worker is None else _virtual_index(worker.device)


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
        ctx.harness, ctx.source, ctx.dtype = harness, source, tensor.dtype
        out = tensor.detach().to(dtype=dtype or tensor.dtype, copy=True)
        return harness.place(out, destination)

    @staticmethod
    def backward(ctx, grad):
        out = grad.detach().to(dtype=ctx.dtype, copy=True)
        return ctx.harness.place(out, ctx.source), None, None, None, None


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
            else:
                device, dtype, _, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            if device is not None and device.type == "cpu":
                return self._move(tensor, _virtual_index(device), dtype, copy=bool(kwargs.get("copy", False)))
        return func(*args, **kwargs)

    def _move(self, tensor: torch.Tensor, destination: Optional[int], dtype, copy: bool = False) -> torch.Tensor:
        source = self.harness.device_of(tensor)
        if source == destination and not copy:
            return tensor if dtype in (None, tensor.dtype) else tensor.to(dtype=dtype)
        if (source is HOST) != (destination is HOST) and tensor.dim() > 0:
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
        harness = self.harness
        op = func.overloadpacket.__name__
        if op in COPIES:
            out = func(*args, **kwargs)
            destination, source = harness.device_of(args[0]), harness.device_of(args[1])
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
        if device is not HOST and op in SYNCHRONISING:
            harness.record_sync(op, device)
        out = func(*args, **kwargs)
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                harness.place(tensor, device)
        for position in HOST_OUTPUTS.get(op, ()):
            harness.place(out[position], HOST)
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
def virtual_devices() -> Iterator[VirtualDevices]:
    """Run the block (and the hybrid workers it starts jobs on) with virtual
    devices; yields the harness, whose ``syncs`` the block may inspect."""
    harness = VirtualDevices()
    thread_state.register(harness.capture)
    previous = getattr(_local, "harness", None)
    _local.harness = harness
    try:
        with harness.entered():
            yield harness
    finally:
        _local.harness = previous
        thread_state.unregister(harness.capture)


def enable_from_environment() -> Optional[VirtualDevices]:
    """``FAIRSEQ_HYBRID_VIRTUAL_DEVICES=1``: the harness for the rest of the
    process (entered on the importing thread and never left)."""
    global _active, _active_context
    if os.environ.get(ENVIRONMENT_VARIABLE, "") not in ("1", "true", "yes") or _active is not None:
        return _active
    _active_context = virtual_devices()  # kept: a collected context manager would leave the modes
    _active = _active_context.__enter__()
    logging.getLogger(__name__).warning(
        "%s=1: virtual-device test harness on (cpu:N devices behave as distinct GPUs; every op is checked, "
        "so everything runs slowly)", ENVIRONMENT_VARIABLE)
    return _active
