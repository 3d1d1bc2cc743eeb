"""Virtual streams: a happens-before checker for the engine's stream
ordering, run on CPU under virtual devices.

On a GPU, a tensor read on one stream before the stream that writes it has
finished, or memory that the caching allocator hands out again while
another stream still reads it, gives silent wrong numbers.  On CPU every
op is done when it returns, so a deleted ``wait_event`` passes every test.
This module gives virtual devices (``fairseq_hybrid.harness.virtual_devices``)
streams and events with ``torch.cuda``'s method names (the engine reaches
them through :mod:`fairseq_hybrid.parallel.runtime.stream_handoff`) and checks every op
against them, the way PyTorch's CUDA Sanitizer (``torch/cuda/_sanitizer.py``)
does on a GPU:

* every op runs on the calling thread's current stream of its device and
  is one step of a *lane* (a stream as used by one host thread); each lane
  counts its steps;
* per tensor storage, the last write and the reads since, each with its
  lane and step; an op's reads and writes come from the op schema's
  ``alias_info.is_write``, as in CSAN;
* a vector clock (lane -> step) per stream as each host thread knows it:
  an op's clock is what its stream has waited for; ``Event.record`` copies
  the stream's clock, ``wait_event`` merges it into the waiting stream,
  ``wait_stream(s)`` is ``wait_event(s.record_event())``, ``synchronize``
  and ops that make the host wait merge into the thread's host clock, which
  every later op of that thread includes;
* an access not ordered after a conflicting one (write after read or
  write, read after write) raises :class:`StreamRace`, naming the op, the
  cell, both streams and both call sites.

Deterministic, whatever order the threads run in: a stream's ops are
ordered after another thread's ops on the same stream only where the host
orders them (a job hand-off carries the caller's clocks into the job, and
the jobs' clocks come back to the caller when it has their results), never
because one thread happened to queue its work first.  So a missing wait is
always a missing clock entry.

Two CUDA rules are modelled because the engine relies on them:

* a cross-device copy (``copy_device_to_device`` in ATen's
  ``cuda/Copy.cu``) runs on the *source* device's current stream, after
  that stream waited for the destination's current stream, and the
  destination's current stream then waits for the copy; host-to-device
  copies run on the destination's current stream, device-to-host copies on
  the source's, and the host waits for them;
* the caching allocator gives a freed block to the next allocation on the
  stream that allocated it: every access by another stream that did not
  ``record_stream`` must be ordered before the next op on that stream.

Not modelled: host memory (plain CPU tensors are not tracked), the
autograd engine's per-node streams (a cell's backward runs on its worker's
stream, as its forward did), events' timing and ``query``, and the
allocator's own behaviour beyond the rule above.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from contextlib import contextmanager
from typing import Dict, Iterator, List, NamedTuple, Optional, Set, Tuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_leaves

from ..parallel.runtime import stream_handoff as engine_transport
from ..parallel.runtime.worker import current_worker

Clock = Dict[int, int]  # lane -> steps of that lane ordered before
_FACTORY = re.compile("(new_.*|.*_like)")  # CSAN's: their tensor arguments give only a shape


class StreamRace(RuntimeError):
    """Two accesses to one tensor's memory on different virtual streams
    with nothing ordering them."""


class Access(NamedTuple):
    lane: int
    step: int
    stream: "VirtualStream"
    op: str
    cell: str
    site: str

    def describe(self, verb: str) -> str:
        return f"{self.op} {verb} it in {self.cell} on {self.stream} at {self.site}"


class _History:
    """What happened to one storage: its device, the stream it was
    allocated on, the last write and the reads since, the streams that
    ``record_stream`` named."""

    __slots__ = ("device", "allocated_on", "write", "reads", "recorded", "reused")

    def __init__(self, device: int, allocated_on: "VirtualStream"):
        self.device = device
        self.allocated_on = allocated_on
        self.write: Optional[Access] = None
        self.reads: Dict[int, Access] = {}  # by lane: the latest read of each (a lane's ops run in order)
        self.recorded: Set[int] = set()
        # accesses of memory freed on this storage's stream that nothing
        # ordered before the next allocation there: the first access of this
        # storage, on whatever stream, must come after them
        self.reused: List[Access] = []


class VirtualStream:
    """A stream of one virtual device, with ``torch.cuda.Stream``'s methods."""

    def __init__(self, checker: "StreamChecker", device_index: int, name: str):
        self.checker, self.device_index, self.name = checker, device_index, name
        self.id = checker._new_id()

    @property
    def device(self) -> torch.device:
        return torch.device("cpu", self.device_index)

    def wait_event(self, event: "VirtualEvent") -> None:
        self.checker._wait(self, event.clock)

    def wait_stream(self, stream: "VirtualStream") -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: Optional["VirtualEvent"] = None) -> "VirtualEvent":
        event = event if event is not None else VirtualEvent(self.checker)
        event.record(self)
        return event

    def synchronize(self) -> None:
        self.checker._host_waits(dict(self.checker._known(self)))

    def __repr__(self) -> str:
        return f"{self.name} (cpu:{self.device_index})"


class VirtualEvent:
    """An event with ``torch.cuda.Event``'s methods; never recorded, it
    orders nothing (as on CUDA)."""

    def __init__(self, checker: "StreamChecker"):
        self.checker = checker
        self.clock: Clock = {}

    def record(self, stream: VirtualStream) -> None:
        self.clock = dict(self.checker._known(stream))

    def wait(self, stream: VirtualStream) -> None:
        stream.wait_event(self)

    def synchronize(self) -> None:
        self.checker._host_waits(self.clock)


class _Thread:
    """One host thread's view: the clock of each stream as far as this
    thread knows, its host clock, its current streams."""

    def __init__(self):
        self.known: Dict[int, Clock] = {}
        self.host: Clock = {}
        self.host_version = 0
        self.merged_host: Dict[int, int] = {}  # stream id -> host_version merged into known[stream]
        self.current: Dict[int, VirtualStream] = {}
        self.copy_stream: Optional[VirtualStream] = None  # set while a cross-device copy runs
        self.op = ""  # the op being checked, for messages


class _HandOff:
    """The caller's clocks carried into a round of jobs, and the jobs'
    clocks carried back (see :class:`.parallel.thread_state.ThreadState`)."""

    def __init__(self, checker: "StreamChecker", known: Dict[int, Clock], host: Clock):
        self.checker, self.known, self.host = checker, known, host
        self.returned: List[Tuple[Dict[int, Clock], Clock]] = []
        self.lock = threading.Lock()


def _merge(into: Clock, clock: Clock) -> None:
    for lane, step in clock.items():
        if into.get(lane, 0) < step:
            into[lane] = step


_HARNESS_FILES = ("virtual_streams.py", "virtual_devices.py")
_TRANSPORT = os.path.join("parallel", "runtime", "stream_handoff.py")
# the engine's stream wrappers: a report names the line that called them
_STREAM_WRAPPERS = {"_virtual", "has_streams", "scope", "new_stream", "current_stream", "default_stream",
                    "use_stream", "record_event", "record_stream"}


def call_site() -> str:
    """The innermost line outside torch and this harness that led here."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        wrapper = filename.endswith(_TRANSPORT) and frame.f_code.co_name in _STREAM_WRAPPERS
        if "/torch/" not in filename and not filename.endswith(_HARNESS_FILES) and not wrapper:
            short = "/".join(filename.split("/")[-3:])
            return f"{short}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "(unknown)"


def _cell() -> str:
    worker = current_worker()
    if worker is None:
        return "the calling thread"
    return worker.cell or f"worker {worker.index} ({worker.activity})"


class StreamChecker:
    """The virtual streams of one harness and the histories they are
    checked against."""

    def __init__(self):
        self._lock = threading.RLock()
        self._ids = 0
        self._local = threading.local()
        self._defaults: Dict[int, VirtualStream] = {}
        self._lanes: Dict[Tuple[int, int], int] = {}
        self._lane_steps: List[int] = []
        self._histories: Dict[StorageWeakRef, _History] = {}
        self._pending: Dict[int, List[Access]] = {}  # stream id -> accesses to freed memory it allocated
        self.races: List[str] = []
        self.ops = 0
        self.ops_per_stream: Dict[str, int] = {}  # by the stream's name and device

    def _new_id(self) -> int:
        with self._lock:
            self._ids += 1
            return self._ids

    # -- streams, as the engine sees them ---------------------------------------

    def _thread(self) -> _Thread:
        state = getattr(self._local, "state", None)
        if state is None:
            state = self._local.state = _Thread()
        return state

    def new_stream(self, device_index: int, name: str) -> VirtualStream:
        return VirtualStream(self, device_index, name)

    def default_stream(self, device_index: int) -> VirtualStream:
        with self._lock:
            if device_index not in self._defaults:
                self._defaults[device_index] = VirtualStream(self, device_index, "default stream")
            return self._defaults[device_index]

    def current_stream(self, device_index: int) -> VirtualStream:
        stream = self._thread().current.get(device_index)
        return stream if stream is not None else self.default_stream(device_index)

    @contextmanager
    def using(self, stream: VirtualStream) -> Iterator[None]:
        current = self._thread().current
        previous = current.get(stream.device_index)
        current[stream.device_index] = stream
        try:
            yield
        finally:
            if previous is None:
                current.pop(stream.device_index, None)
            else:
                current[stream.device_index] = previous

    def record_stream(self, tensor: torch.Tensor, stream: VirtualStream) -> None:
        history = self._histories.get(StorageWeakRef(tensor.untyped_storage()))
        if history is not None:
            history.recorded.add(stream.id)

    # -- clocks ------------------------------------------------------------------

    def _known(self, stream: VirtualStream) -> Clock:
        """``stream``'s clock as the calling thread knows it (including what
        this thread's host has waited for)."""
        thread = self._thread()
        clock = thread.known.get(stream.id)
        if clock is None:
            clock = thread.known[stream.id] = {}
        if thread.merged_host.get(stream.id) != thread.host_version:
            _merge(clock, thread.host)
            thread.merged_host[stream.id] = thread.host_version
        return clock

    def _wait(self, stream: VirtualStream, clock: Clock) -> None:
        _merge(self._known(stream), clock)

    def _host_waits(self, clock: Clock) -> None:
        thread = self._thread()
        _merge(thread.host, clock)
        thread.host_version += 1

    def _step(self, stream: VirtualStream) -> Tuple[Clock, int, int]:
        """One more op of the calling thread on ``stream``: its clock, lane
        and step."""
        key = (stream.id, threading.get_ident())
        with self._lock:
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = len(self._lane_steps)
                self._lane_steps.append(0)
            self._lane_steps[lane] += 1
            step = self._lane_steps[lane]
            pending = self._pending.pop(stream.id, ())
        clock = self._known(stream)
        clock[lane] = step
        self._check_reuse(pending, clock, stream, f"the next op on {stream}, {self._thread().op} in {_cell()} "
                                                 f"at {call_site()}")
        return clock, lane, step

    def _check_reuse(self, freed: List[Access], clock: Clock, home: VirtualStream, what: str) -> None:
        """The allocator's rule: accesses of memory freed on ``home`` that
        ``record_stream`` did not name must be ordered before ``what``
        (whose ``clock`` is given) uses the memory again."""
        for access in freed:
            if clock.get(access.lane, 0) < access.step:
                self._race(f"memory freed and handed out again on {home}: {access.describe('used')}, without "
                           f"record_stream and not ordered before {what}")

    # -- job hand-offs (thread_state) ----------------------------------------------

    def hand_off(self) -> _HandOff:
        thread = self._thread()
        known = {stream: dict(clock) for stream, clock in thread.known.items()}
        for clock in known.values():
            _merge(clock, thread.host)
        return _HandOff(self, known, dict(thread.host))

    @contextmanager
    def job(self, hand_off: _HandOff) -> Iterator[None]:
        """A worker's side of a job: it starts knowing what the caller knew,
        and what it knows at the end goes back to the caller."""
        thread = self._thread()
        for stream, clock in hand_off.known.items():
            _merge(thread.known.setdefault(stream, {}), clock)
        self._host_waits(hand_off.host)  # host-side order only; merged into streams as host knowledge
        current, thread.current = thread.current, {}
        try:
            yield
        finally:
            thread.current = current
            with hand_off.lock:
                hand_off.returned.append(({s: dict(c) for s, c in thread.known.items()}, dict(thread.host)))

    def joined(self, hand_off: _HandOff) -> None:
        thread = self._thread()
        with hand_off.lock:
            returned, hand_off.returned = hand_off.returned, []
        for known, host in returned:
            for stream, clock in known.items():
                _merge(thread.known.setdefault(stream, {}), clock)
            self._host_waits(host)

    # -- storages ------------------------------------------------------------------

    def allocated(self, key: StorageWeakRef, device: int) -> None:
        """A storage first placed on ``device`` by the calling thread: it
        was allocated on that device's current stream."""
        history = self._histories[key] = _History(device, self.current_stream(device))
        # no lock here: the harness calls this under its own lock, and the
        # checker's lock, held in access(), may run a storage's finaliser
        # that takes the harness's (a copy of a list is atomic under the GIL)
        history.reused = list(self._pending.get(history.allocated_on.id, ()))

    def freed(self, key: StorageWeakRef) -> None:
        """The caching allocator's rule: the memory goes to the next
        allocation on the stream that allocated it."""
        history = self._histories.pop(key, None)
        if history is None:
            return
        home = history.allocated_on
        accesses = ([history.write] if history.write is not None else []) + list(history.reads.values())
        foreign = [a for a in accesses if a.stream is not home and a.stream.id not in history.recorded]
        if foreign:
            with self._lock:
                self._pending.setdefault(home.id, []).extend(foreign)

    # -- ops -------------------------------------------------------------------------

    def access(self, op: str, device: int, reads: List[torch.Tensor], writes: List[torch.Tensor],
               device_of) -> None:
        """``op`` ran on ``device``: check its reads and writes of virtual-device
        storages against their histories, then record them."""
        thread = self._thread()
        stream = thread.copy_stream or self.current_stream(device)
        thread.op = op
        clock, lane, step = self._step(stream)
        with self._lock:
            self.ops += 1
            self.ops_per_stream[repr(stream)] = self.ops_per_stream.get(repr(stream), 0) + 1
        written = {StorageWeakRef(t.untyped_storage()): t for t in writes if device_of(t) is not None}
        read = {StorageWeakRef(t.untyped_storage()): t for t in reads if device_of(t) is not None}
        if not written and not read:
            return
        site, cell = call_site(), _cell()
        me = Access(lane, step, stream, op, cell, site)
        with self._lock:  # two workers may read one storage (a parameter, the batch) at once
            for key, tensor in list(read.items()) + list(written.items()):
                history = self._histories.get(key)
                if history is not None and history.reused:
                    earlier, history.reused = history.reused, []
                    self._check_reuse(earlier, clock, history.allocated_on,
                                      f"{op} in {cell} on {stream} at {site}, the new tensor's first use")
            for key, tensor in read.items():
                if key in written:
                    continue
                history = self._history(key, device_of(tensor), stream)
                if history.write is not None and clock.get(history.write.lane, 0) < history.write.step:
                    self._conflict("read", me, history.write, "wrote")
                history.reads[lane] = me
            for key, tensor in written.items():
                history = self._history(key, device_of(tensor), stream)
                if history.write is not None and clock.get(history.write.lane, 0) < history.write.step:
                    self._conflict("write", me, history.write, "wrote")
                for earlier in history.reads.values():
                    if clock.get(earlier.lane, 0) < earlier.step:
                        self._conflict("write", me, earlier, "read")
                history.write, history.reads = me, {}

    def _history(self, key: StorageWeakRef, device: int, stream: VirtualStream) -> _History:
        history = self._histories.get(key)
        if history is None:
            history = self._histories[key] = _History(device, stream)
        return history

    def _conflict(self, what: str, now: Access, earlier: Access, verb: str) -> None:
        self._race(f"{now.op} in {now.cell} on {now.stream} at {now.site} may {what} a tensor before "
                   f"{earlier.describe(verb)} is done: no event, wait or synchronisation orders the two streams")

    def _race(self, message: str) -> None:
        message = f"stream race (virtual streams): {message}"
        with self._lock:
            self.races.append(message)
        raise StreamRace(message)

    # -- copies between devices ------------------------------------------------------------

    @contextmanager
    def copying(self, source: Optional[int], destination: Optional[int]) -> Iterator[None]:
        """A copy from ``source`` to ``destination`` (None: host memory),
        queued as CUDA queues it; the copy's own accesses inside the block
        run on the stream CUDA runs it on."""
        thread = self._thread()
        previous = thread.copy_stream
        if source is not None and destination is not None and source != destination:
            on_source, on_destination = self.current_stream(source), self.current_stream(destination)
            on_source.wait_stream(on_destination)  # Copy.cu: the source's stream waits for the destination's
            thread.copy_stream = on_source
            try:
                yield
            finally:
                thread.copy_stream = previous
            on_destination.wait_stream(on_source)  # ... and the destination's waits for the copy
        elif source is not None and destination is None:
            on_source = self.current_stream(source)
            thread.copy_stream = on_source
            try:
                yield
            finally:
                thread.copy_stream = previous
            on_source.synchronize()  # device to host: the host waits for the copy
        elif source is None and destination is not None:
            thread.copy_stream = self.current_stream(destination)
            try:
                yield
            finally:
                thread.copy_stream = previous
        else:
            yield


def reads_and_writes(func, args, kwargs, out) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """The tensors ``func`` reads and writes, from its schema as CSAN's
    ``ArgumentHandler`` takes them (views and factories read no data)."""
    schema = func._schema
    is_factory = _FACTORY.fullmatch(schema.name.split("::")[-1]) is not None
    reads: List[torch.Tensor] = []
    writes: List[torch.Tensor] = []
    arguments = schema.arguments
    pairs = list(zip(arguments[: len(args)], args))
    by_name = {argument.name: argument for argument in arguments[len(args):]}
    pairs += [(by_name[name], value) for name, value in kwargs.items() if name in by_name]
    for argument, value in pairs:
        info = argument.alias_info
        is_write = info is not None and info.is_write
        metadata_only = is_factory or (info is not None and not info.is_write)
        for tensor in tree_leaves(value):
            if isinstance(tensor, torch.Tensor):
                if is_write:
                    writes.append(tensor)
                elif not metadata_only:
                    reads.append(tensor)
    returns = schema.returns
    values = (out,) if len(returns) == 1 else out if isinstance(out, (tuple, list)) else ()
    for result, value in zip(returns, values):
        info = result.alias_info
        if info is None or info.is_write:  # a fresh output is written by its kernel; a view is not
            for tensor in tree_leaves(value):
                if isinstance(tensor, torch.Tensor):
                    writes.append(tensor)
    return reads, writes


_active = threading.local()


def active_checker() -> Optional[StreamChecker]:
    """The checker entered on the calling thread (None outside one)."""
    stack = getattr(_active, "stack", None)
    return stack[-1] if stack else None


@contextmanager
def entered(checker: StreamChecker) -> Iterator[None]:
    stack = getattr(_active, "stack", None)
    if stack is None:
        stack = _active.stack = []
    stack.append(checker)
    try:
        yield
    finally:
        stack.pop()


engine_transport.virtual_checker = active_checker
