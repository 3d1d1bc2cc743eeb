"""One DDP rank's timed training steps, in a process of its own: what the
benchmark suite's gloo processes and ``fairseq-hybrid-plan --measure``'s
DDP candidates (plain, or groups under DDP) both time.

Every rank joins the process group with a bounded wait (a rank that dies
or falls out of step ends the run with an error instead of leaving the
others blocked in a collective), warms up, and times its steps between two
barriers, so that the slowest rank's time is the step's."""

from __future__ import annotations

import datetime
import time
from typing import Callable, Optional, Sequence, Tuple

import torch

from .training_steps import LossOf, train_steps

TIMEOUT = datetime.timedelta(minutes=5)


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
    dist.barrier()
    start = time.perf_counter()
    tokens, _ = train_steps(model, loss, optimizer, timed, device)
    dist.barrier()
    seconds = time.perf_counter() - start
    dist.destroy_process_group()
    return tokens, seconds
