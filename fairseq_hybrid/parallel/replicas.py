"""Replicas of a module for the parts of a hybrid step that run on a
device other than the module's own.

Batch shards of the attention-softmax part (and of the whole model in
``data`` mode) run on every worker, and the reverse direction of a
bidirectional layer runs on the layer's partner device; each such worker
gets a replica: a copy of the module whose parameters share the master's
storage where the device is the same (every plain CPU device, or virtual
devices on one GPU) and hold a fresh copy of the master's values
otherwise, made through :func:`.transfer.arrive` (on CUDA on the worker's
own copy stream, so the workers' copies do not queue behind each other).

Each replica collects its own ``.grad`` during its worker's backward, and
:meth:`Replicas.reduce` adds them into the master's gradients in worker
order, once every worker is done, so the sum is the same in every run.  A
replica brought up to date for a new step starts without gradients, so a
step that failed half-way (fairseq skips a batch that ran out of memory and
goes on) leaves nothing behind for the next one.
"""

from __future__ import annotations

import copy
from typing import Callable, Dict, List

import torch
import torch.nn as nn

from .transfer import arrive


class Replicas:
    def __init__(self, master: nn.Module, make_copy: Callable[[nn.Module], nn.Module] = copy.deepcopy):
        self.master = master
        self.make_copy = make_copy
        self.copies: Dict[int, nn.Module] = {}
        self.refreshed: Dict[int, object] = {}

    def on(self, worker: int, device: torch.device, step: object = None) -> nn.Module:
        """The replica for ``worker`` on ``device``, up to date with the
        master's parameters and its train/eval mode (brought up to date, and
        its gradients cleared, once per ``step`` when one is given)."""
        replica = self.copies.get(worker)
        if replica is None:
            replica = self.copies[worker] = self.make_copy(self.master)
        elif step is not None and self.refreshed.get(worker) is step:
            return replica
        self.refreshed[worker] = step
        with torch.no_grad():
            for master, param in zip(self.master.parameters(), replica.parameters()):
                param.grad = None
                if master.device == device:
                    if param.data_ptr() != master.data_ptr() or param.dtype != master.dtype or param.shape != master.shape:
                        param.data = master.data
                else:
                    param.data = arrive(master.data, device)
        if isinstance(replica, nn.RNNBase):
            replica.flatten_parameters()  # one cuDNN weight buffer again (a no-op on CPU)
        replica.train(self.master.training)
        return replica

    def in_use(self, workers: List[int]) -> List[nn.Module]:
        return [self.copies[worker] for worker in sorted(workers) if worker in self.copies]

    def reduce(self, workers: List[int]) -> None:
        """Add the gradients of the replicas of ``workers`` into the master
        (in worker order) and clear them."""
        for replica in self.in_use(workers):
            for master, param in zip(self.master.parameters(), replica.parameters()):
                if param.grad is None:
                    continue
                grad = arrive(param.grad, master.device)
                master.grad = grad.clone() if master.grad is None else master.grad.add_(grad)
                param.grad = None


class ModelReplicas:
    """The replicas a group keeps of one ``hybrid_lstm`` model: of its
    attention-softmax part, of each direction of a bidirectional encoder
    layer that runs on its partner device, and (``data`` mode) of the whole
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
        return self._get("model", self.model, lambda m: type(m)(copy.deepcopy(m.encoder), copy.deepcopy(m.decoder)))

    def _get(self, key: str, master: nn.Module, make_copy=copy.deepcopy) -> Replicas:
        if key not in self.cache or self.cache[key].master is not master:
            self.cache[key] = Replicas(master, make_copy)
        return self.cache[key]
