"""fairseq-style training steps, timed, on the batches a fairseq-train
command draws: what ``fairseq-hybrid-plan --measure`` runs and calibrates
with, and what every benchmark under ``benchmarks/`` times (the harness
re-exports them)."""

from __future__ import annotations

import gc
import time
from typing import Dict, List, Sequence, Tuple

import torch
from fairseq import utils

from ..parallel import keep_on_host

__all__ = ["rows_of", "share_of", "on_device", "backward_step", "synchronize", "train_steps",
           "LossOf", "spawned"]


def rows_of(sample: Dict, start: int, stop: int, pad: int) -> Dict:
    """Sentences ``start:stop`` of a fairseq batch, its counts redone: a
    DDP rank's share of a global batch that stays the user's."""
    rows = sample["target"].size(0)

    def cut(value):
        if isinstance(value, dict):
            return {key: cut(item) for key, item in value.items()}
        if torch.is_tensor(value) and value.dim() > 0 and value.size(0) == rows:
            return value[start:stop]
        return value

    out = cut(sample)
    out["nsentences"] = stop - start
    out["ntokens"] = int(out["target"].ne(pad).sum())
    return out


def share_of(sample: Dict, rank: int, ranks: int, pad: int) -> Dict:
    """Rank ``rank``'s share of ``sample``'s sentences among ``ranks``."""
    rows = sample["target"].size(0)
    return rows_of(sample, rank * rows // ranks, (rank + 1) * rows // ranks, pad)


def on_device(sample, device):
    """``sample`` with every tensor on ``device``, as fairseq's trainer puts
    a batch on ``cuda:0`` (``utils.move_to_cuda``)."""
    return utils.apply_to_sample(lambda tensor: tensor.to(device), sample)


def backward_step(model, criterion, sample) -> Tuple[torch.Tensor, int, Dict]:
    """What fairseq's ``train_step`` does before the optimizer: gradients
    cleared, the criterion's loss, its backward divided by the sample size.
    Returns the criterion's ``(loss, sample_size, logging)``."""
    model.zero_grad(set_to_none=True)
    loss, sample_size, logging = criterion(model, sample)
    (loss / sample_size).backward()
    return loss, sample_size, logging


def synchronize(*devices) -> None:
    """Wait for the kernels queued on each of ``devices``, every stream of
    it (``torch.cuda.synchronize()`` without one waits for the current
    device only); nothing to wait for on CPU."""
    for device in devices:
        device = torch.device(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def train_steps(model, criterion, optimizer, samples: Sequence, device: str = "cpu", collect: bool = True):
    """fairseq-style training steps; returns (target tokens, seconds).  On a
    CUDA ``device`` samples move there and the time includes the wait for
    the queued kernels.  A full garbage collection runs before the clock
    starts: a process's first one after fairseq has loaded its data walks
    every object it made (about 0.2 s on a 2-core CPU, in the middle of a
    step), and would otherwise land in a short run's timed steps or not,
    by chance (``collect``: False where the caller collects before its own
    clock)."""
    model.train()
    tokens = 0
    group = getattr(model, "hybrid_group", None)
    if collect:
        gc.collect()
    start = time.perf_counter()
    for sample in samples:
        if torch.device(device).type == "cuda":
            # a group's batch as fairseq's trainer hands it over (fairseq_patches/batch_on_host.py)
            sample = (on_device(sample, device) if group is None else
                      keep_on_host(sample, group.plan.devices, lambda host: on_device(host, device)))
        backward_step(model, criterion, sample)
        optimizer.step()
        tokens += sample["ntokens"]
    synchronize(*(group.plan.devices if group is not None else [device]))
    return tokens, time.perf_counter() - start


class LossOf(torch.nn.Module):
    """The criterion's loss as a module's forward, so that PyTorch's
    DistributedDataParallel, wrapped around it, sees the step (it prepares
    its gradient all-reduce in forward)."""

    def __init__(self, model, criterion):
        super().__init__()
        self.model, self.criterion = model, criterion

    def forward(self, sample):
        return self.criterion(self.model, sample)


def spawned(function, args: Tuple, count: int) -> List:
    """Run ``function(rank, *args, results)`` in ``count`` fresh processes
    and return what each put on ``results`` (small values: the processes
    are joined before the queue is read)."""
    import torch.multiprocessing as mp

    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(function, args=(*args, results), nprocs=count)
    return [results.get() for _ in range(count)]
