"""The wire between the stages of a group on GPUs (``--hybrid-workers
processes``): torch.distributed's point-to-point send and receive, as
``torch.distributed.pipelining`` and Megatron-LM's ``p2p`` move activations
between pipeline stages.  Stages on host memory use pipes instead
(:mod:`.host_wire`: a gloo message costs a CPU stage more than its cells).

The stages form a process group of their own (not torch.distributed's
default group, which a run of groups under DDP already holds): NCCL, with a
gloo group beside it (gloo alone where stages share a GPU).  A forward
message is a fixed-size header (dimensions, dtype, whether the tensor needs
a gradient, or "nothing") followed by the tensor; the header goes through
the pipes the trainer made between its stages (:mod:`.host_wire`: one write
and one read, where a gloo message costs each end a hand-off to gloo's I/O
thread, docs/processes.md), or through gloo where there are none, so that
a receiver learns a tensor's shape without waiting for its GPU.  Only the
first step of each shape (and grad mode and autocast) sends them: after
it a forward message goes without one, its shape from the layout and its
dtype from that first step (:class:`..runtime.channels.OverWire`).  A gradient
goes without a header: its receiver sent the output it belongs to, so it
knows the shape and dtype (``expect``'s ``likes``; the sender's ``known``),
and a gradient comes back only for an output sent as needing one
(:class:`..runtime.channels.OverWire`).

A receiver takes a peer's messages in the order that peer sends them and
keeps those it does not need yet (:meth:`GpuWire.take`): both sides
build the same cells and orders, so each knows the other's sequence
(:meth:`GpuWire.expect`); NCCL matches messages by order alone.  Sends
never block the sender (each is waited for at the end of the pass,
:meth:`GpuWire.flush`), so, as with threads, a stage only ever waits for
a cell of an earlier wavefront clock and the schedule cannot deadlock.
"""

from __future__ import annotations

import datetime
import time
from collections import deque
from typing import Deque, Dict, Hashable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool)
MAX_DIMS = 6
HEADER = 3 + MAX_DIMS  # present, dtype, requires_grad, dimensions (-1 past the last)
TAG = 0


class PeerLost(RuntimeError):
    """A message to or from another stage failed: that stage has ended
    (the trainer names the stage whose failure was the cause)."""


class InOrder:
    """What both wires share: a peer's messages taken in the order it sends
    them, those not needed yet kept (``_receive`` reads the next one)."""

    rank: int
    expected: Dict[int, Deque[Hashable]]
    inbox: Dict[int, Dict[Hashable, Tuple[Optional[Tensor], bool]]]

    likes: Dict[int, Dict[Hashable, Tensor]]

    def expect(self, peer: int, keys: Sequence[Hashable], likes: Optional[Dict[Hashable, Tensor]] = None) -> None:
        """The keys of the messages ``peer`` will send this stage, in its
        order; ``likes``: for those sent ``known``, a tensor of the shape,
        dtype and device each will have."""
        self.expected[peer] = deque(keys)
        self.inbox[peer] = {}
        self.likes[peer] = likes or {}

    def take(self, peer: int, key: Hashable) -> Tuple[Optional[Tensor], bool]:
        """The message ``key`` from ``peer`` (receiving the ones it sends
        before it) and whether its tensor needs a gradient."""
        inbox, expected = self.inbox[peer], self.expected[peer]
        while key not in inbox:
            if not expected:
                raise RuntimeError(f"stage {self.rank} waits for {key!r} from stage {peer}, which sends no more")
            next_key = expected.popleft()
            inbox[next_key] = self._receive(peer, self.likes[peer].get(next_key))
        return inbox.pop(key)

    def _receive(self, peer: int, like: Optional[Tensor]) -> Tuple[Optional[Tensor], bool]:
        raise NotImplementedError

    send_seconds: float  # this stage's time in its sends so far (what a message costs it in a step)

    def send(self, peer: int, tensor: Optional[Tensor], requires_grad: bool = False, known: bool = False) -> None:
        """Send ``tensor`` (or nothing) to ``peer``, timed; ``known``: the
        peer expects it with a like of its shape and dtype (a tensor, never
        nothing), so no description need go with it."""
        started = time.perf_counter()
        try:
            self._send(peer, tensor, requires_grad, known)
        finally:
            self.send_seconds += time.perf_counter() - started

    def _send(self, peer: int, tensor: Optional[Tensor], requires_grad: bool, known: bool) -> None:
        raise NotImplementedError


class GpuWire(InOrder):
    """This stage's messages to and from the other stages of its group."""

    describes_once = True  # a forward message goes without a header once its shape's step has described it

    def __init__(self, rank: int, size: int, store, device: torch.device, timeout: float,
                 distinct_devices: bool = True, header_wire: Optional[InOrder] = None):
        """``header_wire``: the stages' pipes (a :class:`.host_wire.HostWire`)
        for the headers; None: gloo."""
        self.rank, self.size, self.device = rank, size, device
        self.header_wire = header_wire
        delta = datetime.timedelta(seconds=timeout)
        self.gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, delta)
        # through host memory: CPU devices, and GPU stages that share a GPU (NCCL refuses two ranks on one
        # device, "Duplicate GPU detected" in its init.cc; gloo's send and recv take a host pointer)
        self.staged = device.type == "cuda" and not distinct_devices
        if device.type == "cuda" and distinct_devices:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = delta
            self.data = dist.ProcessGroupNCCL(dist.PrefixStore("data/", store), rank, size, options)
        else:
            self.data = self.gloo
        self.pending: List[object] = []  # sends not waited for, and the tensors they read
        self.sent = [0, 0]  # messages and tensor bytes sent so far (what a step costs the transport)
        self.headers_sent = 0
        self.send_seconds = 0.0
        self.expected: Dict[int, Deque[Hashable]] = {}
        self.inbox: Dict[int, Dict[Hashable, Tuple[Optional[Tensor], bool]]] = {}
        self.likes: Dict[int, Dict[Hashable, Tensor]] = {}

    def _send(self, peer: int, tensor: Optional[Tensor], requires_grad: bool, known: bool) -> None:
        if known and tensor is None:
            raise ValueError("a message sent as known must be a tensor (its peer receives one of a known shape)")
        if not known:
            header = torch.full((HEADER,), -1, dtype=torch.int64)
            if tensor is not None:
                if tensor.dim() > MAX_DIMS:
                    raise ValueError(f"a tensor of {tensor.dim()} dimensions between stages (at most {MAX_DIMS})")
                header[0], header[1], header[2] = 1, DTYPES.index(tensor.dtype), int(requires_grad)
                header[3:3 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
            else:
                header[0] = 0
            if self.header_wire is not None:
                self.header_wire.send(peer, header)
            else:
                self.pending.append((self.gloo.send([header], peer, TAG), header))
            self.headers_sent += 1
        self.sent[0] += 1
        if tensor is not None:
            self.sent[1] += tensor.numel() * tensor.element_size()
            tensor = tensor.to("cpu") if self.staged else tensor.contiguous()
            self.pending.append((self.data.send([tensor], peer, TAG), tensor))

    def _receive(self, peer: int, like: Optional[Tensor]) -> Tuple[Optional[Tensor], bool]:
        if like is not None:  # sent known: no header
            shape, dtype, requires_grad = like.shape, like.dtype, False
        else:
            if self.header_wire is not None:
                header, _ = self.header_wire._receive(peer, None)
            else:
                header = torch.empty(HEADER, dtype=torch.int64)
                _wait(self.gloo.recv([header], peer, TAG), peer)
            present, code, requires_grad, *dims = header.tolist()
            if not present:
                return None, False
            shape, dtype = [size for size in dims if size >= 0], DTYPES[code]
        tensor = torch.empty(shape, dtype=dtype, device="cpu" if self.staged else self.device)
        _wait(self.data.recv([tensor], peer, TAG), peer)
        return (tensor.to(self.device) if self.staged else tensor), bool(requires_grad)

    def flush(self) -> None:
        """Wait until every send of this pass is done."""
        for work, _ in self.pending:
            _wait(work, None)
        self.pending.clear()
        if self.header_wire is not None:
            self.header_wire.flush()

    def close(self) -> None:
        self.pending.clear()
        if self.header_wire is not None:
            self.header_wire.close()
        for group in {id(self.data): self.data, id(self.gloo): self.gloo}.values():
            shutdown = getattr(group, "shutdown", None) or getattr(group, "abort", None)
            if shutdown is not None:
                try:
                    shutdown()
                except RuntimeError:
                    pass


def _wait(work, peer: Optional[int]) -> None:
    try:
        work.wait()
    except RuntimeError as error:
        raise PeerLost(f"a message {'from stage ' + str(peer) if peer is not None else 'to another stage'} "
                       f"failed: {error}") from error
