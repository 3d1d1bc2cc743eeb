"""The wire between stages whose devices are host memory (plain ``cpu``
devices, ``--hybrid-workers processes``): one pipe for each ordered pair of
stages, made by the trainer before the stages start.

A message is its tensor's description (dtype, shape, whether it needs a
gradient) followed by its bytes, written back to back into the same pipe:
one write for the sender, one wake-up for the receiver, where gloo's
point-to-point (:mod:`.gpu_wire`) costs a header message and a data message,
each through gloo's own I/O thread (docs/bench/profile_workers.md: the
messages' cost per step, measured both ways).  Each peer's sends are
written by a thread of their own, so a send never blocks its stage (a pipe
holds 64 KiB to 1 MiB; two stages writing to each other at once would
otherwise wait for each other forever), except where the pipe has room for
it now (the stage writes it itself); the receiver reads straight into the
tensor's memory.

It has :class:`.gpu_wire.GpuWire`'s face (``expect``, ``send``, ``take``,
``flush``, ``sent``, ``close``; the in-order taking is their shared
:class:`.gpu_wire.InOrder`), so a stage uses either.
"""

from __future__ import annotations

import array
import fcntl
import pickle
import queue
import termios
import threading
from typing import Deque, Dict, Hashable, List, Optional, Tuple

import torch
from torch import Tensor

from .gpu_wire import DTYPES, InOrder, PeerLost


def wire_ends(context, size: int) -> List[Tuple[Dict[int, object], Dict[int, object]]]:
    """For each stage, its pipes' ends: (to each peer, from each peer)."""
    ends: List[Tuple[Dict[int, object], Dict[int, object]]] = [({}, {}) for _ in range(size)]
    for sender in range(size):
        for receiver in range(size):
            if sender != receiver:
                reading, writing = context.Pipe(duplex=False)
                ends[sender][0][receiver] = writing
                ends[receiver][1][sender] = reading
    return ends


PIPE_BYTES = 1 << 20  # asked of the kernel for each pipe (Linux's default limit for a user)
FRAME = 8  # the bytes multiprocessing's Connection adds to a message, at most
F_SETPIPE_SZ, F_GETPIPE_SZ = 1031, 1032


def _unread(conn) -> Optional[int]:
    """How many bytes wait in the pipe ``conn`` writes into (None where
    that cannot be told)."""
    try:
        unread = array.array("i", [0])
        fcntl.ioctl(conn.fileno(), termios.FIONREAD, unread, True)
        return unread[0]
    except OSError:
        return None


class _Sender(threading.Thread):
    """Writes one peer's messages in the order they were sent: the stage's
    own thread writes a message itself where the pipe has room for it and
    nothing is queued before it (no thread to wake, on the step's critical
    path), and hands it to this thread otherwise."""

    def __init__(self, conn, peer: int):
        super().__init__(name=f"hybrid host wire to stage {peer}", daemon=True)
        self.conn, self.peer = conn, peer
        self.queue: "queue.Queue" = queue.Queue()
        self.error: Optional[BaseException] = None
        try:
            fcntl.fcntl(conn.fileno(), F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass  # the kernel's default size
        try:
            self.capacity = fcntl.fcntl(conn.fileno(), F_GETPIPE_SZ)
        except OSError:
            self.capacity = 0  # unknown: every message goes through the thread

    def put(self, description: bytes, data) -> None:
        size = len(description) + (0 if data is None else data.nbytes) + 2 * FRAME
        unread = _unread(self.conn) if self.queue.unfinished_tasks == 0 and size <= self.capacity else None
        if unread is not None and size <= self.capacity - unread:
            self._write(description, data)
        else:
            self.queue.put((description, data))

    def _write(self, description: bytes, data) -> None:
        try:
            self.conn.send_bytes(description)
            if data is not None:
                self.conn.send_bytes(data)
        except (OSError, ValueError) as error:  # the peer has ended
            self.error = error

    def run(self) -> None:
        while True:
            item = self.queue.get()
            try:
                if item is None:
                    return
                if self.error is None:
                    self._write(*item)
            finally:
                self.queue.task_done()


class HostWire(InOrder):
    """This stage's messages to and from the other stages, through pipes."""

    def __init__(self, rank: int, outgoing: Dict[int, object], incoming: Dict[int, object]):
        self.rank = rank
        self.incoming = incoming
        self.senders = {peer: _Sender(conn, peer) for peer, conn in outgoing.items()}
        for sender in self.senders.values():
            sender.start()
        self.sent = [0, 0]  # messages and tensor bytes sent so far
        self.send_seconds = 0.0
        self.expected: Dict[int, Deque[Hashable]] = {}
        self.inbox: Dict[int, Dict[Hashable, Tuple[Optional[Tensor], bool]]] = {}
        self.likes: Dict[int, Dict[Hashable, Tensor]] = {}

    def _send(self, peer: int, tensor: Optional[Tensor], requires_grad: bool, known: bool) -> None:
        # every message carries its description, known or not: it costs this wire no message of its own
        sender = self.senders[peer]
        if sender.error is not None:
            raise PeerLost(f"a message to stage {peer} failed: {sender.error}")
        self.sent[0] += 1
        if tensor is None:
            sender.put(pickle.dumps(None), None)
            return
        tensor = tensor.detach().contiguous()
        self.sent[1] += tensor.numel() * tensor.element_size()
        description = pickle.dumps((DTYPES.index(tensor.dtype), tuple(tensor.shape), bool(requires_grad)))
        data = tensor.reshape(-1).view(torch.uint8).numpy() if tensor.numel() else None
        sender.put(description, data)  # a queued array keeps the tensor's memory until it is written

    def _receive(self, peer: int, like: Optional[Tensor]) -> Tuple[Optional[Tensor], bool]:
        conn = self.incoming[peer]
        try:
            description = pickle.loads(conn.recv_bytes())
            if description is None:
                return None, False
            dtype, shape, requires_grad = description
            tensor = torch.empty(shape, dtype=DTYPES[dtype])
            if tensor.numel():
                conn.recv_bytes_into(tensor.view(-1).view(torch.uint8).numpy())
        except (EOFError, OSError) as error:
            raise PeerLost(f"a message from stage {peer} failed: {error!r}") from error
        return tensor, requires_grad

    def flush(self) -> None:
        """Wait until every send of this pass is written."""
        for peer, sender in self.senders.items():
            sender.queue.join()
            if sender.error is not None:
                raise PeerLost(f"a message to stage {peer} failed: {sender.error}")

    def close(self) -> None:
        for sender in self.senders.values():
            sender.queue.put(None)
        for conn in [sender.conn for sender in self.senders.values()] + list(self.incoming.values()):
            try:
                conn.close()
            except OSError:
                pass
