"""One DDP rank's timed training steps, in a process of its own: what the
benchmark suite's gloo processes, ``fairseq-hybrid-plan --measure``'s
DDP candidates (plain, or groups under DDP, :func:`in_ranks`) and the
plan's CPU calibration (DDP's residual) time.

Every rank joins the process group with a bounded wait (a rank that dies
or falls out of step ends the run with an error instead of leaving the
others blocked in a collective), warms up, and times its steps between two
barriers, so that the slowest rank's time is the step's."""

from __future__ import annotations

import datetime
import gc
import os
import socket
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..parallel import watch_parent
from .command_model import build, drawn, padded_tokens
from .training_steps import LossOf, share_of, spawned, train_steps

TIMEOUT = datetime.timedelta(minutes=5)


def free_port() -> int:
    """A TCP port free on this machine now, for the ranks' store."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def join(rank: int, ranks: int, port: int, backend: str = "gloo") -> None:
    """This process as rank ``rank`` of ``ranks`` (TCP on this machine)."""
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks,
                            timeout=TIMEOUT)


def ddp_loss(model, criterion, device_ids: Optional[Sequence] = None) -> Callable:
    """``criterion`` on ``model`` through PyTorch's DistributedDataParallel,
    which stands in for the criterion (it runs model and loss, and prepares
    its gradient all-reduce in forward)."""
    wrapped = torch.nn.parallel.DistributedDataParallel(LossOf(model, criterion), device_ids=device_ids)
    return lambda _, sample: wrapped(sample)


def timed_steps(model, loss, optimizer, warm: Sequence, timed: Sequence, device: str = "cpu") -> Tuple[int, float]:
    """Warm-up steps on ``warm``, then the steps on ``timed`` between two
    barriers: their target tokens and seconds.  The process group is left
    afterwards."""
    import torch.distributed as dist

    train_steps(model, loss, optimizer, warm, device)  # (train_steps puts the model in training mode)
    gc.collect()  # before the barrier: the ranks' clock starts together after it (train_steps says why)
    dist.barrier()
    start = time.perf_counter()
    tokens, _ = train_steps(model, loss, optimizer, timed, device, collect=False)
    dist.barrier()
    seconds = time.perf_counter() - start
    dist.destroy_process_group()
    return tokens, seconds


class ReducedBeforeStep:
    """An optimizer that sums the gradients over the ranks before its step,
    a flat buffer per device (fairseq's ``legacy_ddp``: after the whole
    backward pass, in one go)."""

    def __init__(self, optimizer, parameters):
        self.optimizer, self.parameters = optimizer, list(parameters)

    def step(self):
        import torch.distributed as dist

        by_device: Dict[torch.device, List[torch.Tensor]] = {}
        for parameter in self.parameters:
            if parameter.grad is not None:
                by_device.setdefault(parameter.grad.device, []).append(parameter.grad)
        for grads in by_device.values():
            flat = torch._utils._flatten_dense_tensors(grads)
            dist.all_reduce(flat)
            for grad, reduced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
                grad.copy_(reduced)
        self.optimizer.step()


def rank_process(rank: int, spec: Dict, results) -> None:
    """One rank of DDP or of groups under DDP, each training its share of
    every batch's sentences (gloo on CPU, NCCL on CUDA); it ends with the
    process that started the ranks, however that one ends."""
    watch_parent(spec["parent"])
    ranks = spec["ranks"]
    per = len(spec["devices"]) // ranks
    mine = spec["devices"][rank * per:(rank + 1) * per]
    cuda = mine[0].startswith("cuda")
    torch.set_num_threads(spec["threads"])
    if cuda:
        torch.cuda.set_device(torch.device(mine[0]))
    join(rank, ranks, spec["port"], "nccl" if cuda else "gloo")
    task, cfg, model, criterion = build(spec["train"], mine, spec["group"] if per > 1 else None)
    pad = task.target_dictionary.pad()
    batches = drawn(task, cfg, spec["batches"], spec.get("seed", 1))
    samples = [share_of(sample, rank, ranks, pad) for sample in batches]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if per == 1:
        loss = ddp_loss(model, criterion, [mine[0]] if cuda else None)
    else:
        loss, optimizer = criterion, ReducedBeforeStep(optimizer, model.parameters())
    _, seconds = timed_steps(model, loss, optimizer, samples[:spec["warmup"]], samples, mine[0])
    results.put((rank, seconds, padded_tokens(samples)))


def in_ranks(spec: Dict) -> Dict:
    """``spec['ranks']`` processes, the slowest rank's seconds."""
    rows = spawned(rank_process, (dict(spec, parent=os.getpid()),), spec["ranks"])
    return {"seconds": max(row[1] for row in rows), "tokens": sum(row[2] for row in rows), "steps": spec["batches"]}
