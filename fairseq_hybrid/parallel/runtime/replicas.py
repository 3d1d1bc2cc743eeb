"""Replicas of a module for the parts of a hybrid step that run on a
device other than the module's own.

Batch shards of the attention-softmax part (and of the whole model in
``data`` mode) run on every worker, and the reverse direction of a
bidirectional layer runs on a device of its own (the next one unless the
placement says otherwise); each such worker gets a replica: a copy of
the module whose parameters share the master's storage where the device
is the same (every plain CPU device, or virtual
devices on one GPU) and hold a fresh copy of the master's values
otherwise, made through :func:`.stream_handoff.arrive`.

The copies stay off the step's critical path, the way DDP keeps its
all-reduce off it (docs/design.md, "Replica copies"):

* parameters: :meth:`Replicas.prefetch`, called by the main thread before
  a step's jobs start, queues every replica's copy at once on a prefetch
  stream of the replica's device; the worker's first use of the replica
  (:meth:`Replicas.on`) waits for that copy's event, so the copy runs
  while the device does its other cells (the encoder, for the
  attention-softmax part);
* gradients: :meth:`Replicas.send` is called by a worker right after the
  backward of its last cell that used its replica, so the replica's
  gradients travel to the master's device while the worker and the others
  still run backward; :meth:`Replicas.reduce` then adds them into the
  master's gradients in worker order, once every worker is done, so the sum
  is the same in every run.  The whole model's replicas (``data`` mode) are
  the exception (``send_early=False``): there each worker's one cell is its
  shard of the whole step, so every worker ends backward at about the same
  time and an early send would overlap nothing, while the K - 1 whole-model
  gradients it sends would wait together on the master's device for the
  reduce (three extra copies of the model at K = 4); :meth:`Replicas.reduce`
  copies them one parameter at a time instead.

A replica brought up to date for a new step starts without gradients and
without anything sent, so a step that failed half-way (fairseq skips a
batch that ran out of memory and goes on) leaves nothing behind for the
next one.
"""

from __future__ import annotations

import copy
import threading
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from . import stream_handoff
from .stream_handoff import arrive, copies_done, prefetch_stream


class Replicas:
    def __init__(self, master: nn.Module, make_copy: Callable[[nn.Module, Dict], nn.Module] = copy.deepcopy,
                 send_early: bool = True):
        self.master = master
        self.make_copy = make_copy
        self.send_early = send_early
        self.copies: Dict[int, nn.Module] = {}
        self.refreshed: Dict[int, object] = {}
        self.ready: Dict[int, object] = {}  # worker -> event after its prefetched copies
        self.sent: Dict[int, List[Optional[Tensor]]] = {}  # worker -> its gradients on the master's devices
        # worker -> {(master's device, thread): event after the thread's prefetch copies read the master}
        self.read: Dict[int, Dict[Tuple[torch.device, int], object]] = {}

    def prefetch(self, worker: int, device: torch.device, step: object) -> None:
        """Queue the copies that bring ``worker``'s replica up to date for
        ``step`` on the calling thread's prefetch stream of ``device``;
        the worker's first :meth:`on` of the step waits for them."""
        stream = prefetch_stream(device)
        # after what the caller queued on the device (the optimizer's update of a master there, which a
        # first copy reads on this stream); a host that waited for the device used to hide the order
        if stream is not None:
            stream.wait_stream(stream_handoff.default_stream(device))
        with stream_handoff.use_stream(stream):
            self._refresh(worker, device, step)
            self.ready[worker] = stream_handoff.record_event(device)
        # a copy stream runs its copies in order: the latest event of a thread's stream covers its
        # earlier copies (a step without backward, such as validation, never reduces)
        reads = self.read.setdefault(worker, {})
        for source in {master.device for master in self.master.parameters()} - {device}:
            reads[source, threading.get_ident()] = copies_done(source)

    def on(self, worker: int, device: torch.device, step: object = None) -> nn.Module:
        """The replica for ``worker`` on ``device``, up to date with the
        master's parameters and its train/eval mode, ready for the calling
        thread's current stream (brought up to date, and its gradients
        cleared, once per ``step`` when one is given)."""
        replica = self.copies.get(worker)
        if replica is None or step is None or self.refreshed.get(worker) is not step:
            return self._refresh(worker, device, step)
        event = self.ready.pop(worker, None)
        if event is not None:  # prefetched: wait for the copies, and keep their memory until this stream is done
            stream = stream_handoff.current_stream(device)
            stream.wait_event(event)
            for param in replica.parameters():
                stream_handoff.record_stream(param.data, stream)
        return replica

    def refresh_from(self, worker: int, values: List[Tensor], step: object) -> nn.Module:
        """Bring ``worker``'s replica up to date for ``step`` from
        ``values``, the master's parameters as another worker sent them
        (already on the replica's device): a worker in a process of its own
        never reads another device's memory."""
        if worker not in self.copies:  # made around the values, without reading the master's (another device's)
            memo = {id(master): nn.Parameter(value, requires_grad=master.requires_grad)
                    for master, value in zip(self.master.parameters(), values)}
            self.copies[worker] = self.make_copy(self.master, memo)
        return self._refresh(worker, None, step, values)

    def _refresh(self, worker: int, device: Optional[torch.device], step: object,
                 values: Optional[List[Tensor]] = None) -> nn.Module:
        replica = self.copies.get(worker)
        if replica is None:
            replica = self.copies[worker] = self.make_copy(self.master, {})
        self.refreshed[worker] = step
        self.ready.pop(worker, None)
        self.sent.pop(worker, None)
        with torch.no_grad():
            for index, (master, param) in enumerate(zip(self.master.parameters(), replica.parameters())):
                param.grad = None
                if values is not None:
                    param.data = values[index]
                elif master.device == device:
                    if param.data_ptr() != master.data_ptr() or param.dtype != master.dtype or param.shape != master.shape:
                        param.data = master.data
                else:
                    param.data = arrive(master.data, device)
        for module in replica.modules():  # the replica itself, or a whole model's LSTM layers
            if isinstance(module, nn.RNNBase):
                # one cuDNN weight buffer again (a no-op on CPU): weights that are not one make
                # cuDNN's call copy them into one every call (_cudnn_rnn's weight_buf)
                module.flatten_parameters()
        replica.train(self.master.training)
        return replica

    def send(self, worker: int, device: torch.device) -> None:
        """Start the copies of ``worker``'s replica gradients to the
        master's devices (called on the worker once it is done with the
        replica for the step); :meth:`reduce` adds them.  Without
        ``send_early`` the gradients stay on the replica until the reduce."""
        replica = self.copies.get(worker)
        if replica is None or not self.send_early:
            return
        made = stream_handoff.record_event(device)  # after the backward that made them
        sent = []
        for master, param in zip(self.master.parameters(), replica.parameters()):
            sent.append(None if param.grad is None else arrive(param.grad, master.device, made))
            param.grad = None
        self.sent[worker] = sent

    def reduce(self, workers: List[int]) -> None:
        """Add the gradients of the replicas of ``workers`` (sent, or still
        on the replicas) into the master (in worker order) and clear them.
        The calling thread's streams then come after the prefetches' reads
        of the master, so the optimizer may write it."""
        for worker in sorted(workers):
            for (source, _), event in self.read.pop(worker, {}).items():
                if event is not None:
                    stream_handoff.current_stream(source).wait_event(event)
            replica = self.copies.get(worker)
            if replica is None:
                continue
            sent = self.sent.pop(worker, None)
            for index, (master, param) in enumerate(zip(self.master.parameters(), replica.parameters())):
                grad = sent[index] if sent is not None else param.grad
                param.grad = None
                if grad is None:
                    continue
                grad = arrive(grad, master.device)
                master.grad = grad.clone() if master.grad is None else master.grad.add_(grad)


class ModelReplicas:
    """The replicas a group keeps of one ``hybrid_lstm`` model: of its
    attention-softmax part, of each direction of a bidirectional encoder
    layer that runs on a device of its own, and (``data`` mode) of the whole
    model.  Made on first use and kept from step to step."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.cache: Dict[str, Replicas] = {}

    def attention_softmax(self) -> Replicas:
        return self._get("attention_softmax", self.model.decoder.attention_softmax)

    def direction(self, layer: int, reverse: bool) -> Replicas:
        """Replicas of one direction of a bidirectional encoder layer (the
        module the encoder stack hands out for it, which shares the layer's
        Parameters)."""
        master = self.model.encoder.stack.direction(layer, reverse)
        return self._get(f"encoder layer {layer} {'reverse' if reverse else 'forward'}", master)

    def whole_model(self) -> Replicas:
        """Replicas of the whole model (``data`` mode), whose gradients are
        copied at the reduce, one parameter at a time (module docstring)."""
        return self._get("model", self.model, lambda m, memo: type(m)(copy.deepcopy(m.encoder, memo), copy.deepcopy(m.decoder, memo)),
                         send_early=False)

    def _get(self, key: str, master: nn.Module, make_copy=copy.deepcopy, send_early: bool = True) -> Replicas:
        if key not in self.cache or self.cache[key].master is not master:
            self.cache[key] = Replicas(master, make_copy, send_early)
        return self.cache[key]
