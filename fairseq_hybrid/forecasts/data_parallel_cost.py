"""What plain data parallelism costs, in the schedule simulator's terms:
the yardstick a hybrid group has to beat.

A fairseq user with K GPUs today runs K processes (fairseq's DDP, NCCL),
each the one-device model on its own batch of the same size, with the
gradients summed by a ring all-reduce in buckets while backward still runs
(PyTorch DDP's ``bucket_cap_mb``, 25 MiB).  Its step is one device's step
with the backward stretched by whatever of the all-reduce does not overlap;
its speed-up over one GPU is K times the tokens per step over that time.

Real DDP waits for stragglers: every rank has a batch of its own, and the
step lasts as long as the slowest rank's (:func:`data_parallel_step_of`).

Two hybrid groups of four under DDP (8 GPUs) are one group's step with the
same all-reduce between the two groups: each device reduces the gradients
of the parameters it owns with its twin in the other group, all devices at
once, so the device that owns the most parameters decides.
"""

from __future__ import annotations

import math
from typing import List, Sequence

from ..parallel import build_plan
from ..planning.schedule_simulator import CostModel, StepTime
from ..planning.owned_bytes import gradient_bytes, plan_owned_bytes  # noqa: F401 (gradient_bytes re-exported)

BUCKET_BYTES = 25 * 2 ** 20  # torch.nn.parallel.DistributedDataParallel's bucket_cap_mb default


def ring_allreduce_seconds(nbytes: float, ranks: int, cost: CostModel) -> float:
    """A ring all-reduce of ``nbytes`` over ``ranks``: 2 (K - 1) steps, each
    moving nbytes / K over one link, each paying the link's latency."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    bandwidth = cost.link_bandwidth
    per_step = nbytes / ranks / bandwidth if bandwidth != float("inf") else 0.0
    return 2 * (ranks - 1) * (cost.link_latency + per_step)


def overlapped_backward(backward: float, gradient_bytes: float, ranks: int, cost: CostModel,
                        bucket_bytes: float = BUCKET_BYTES) -> float:
    """Backward time with the gradients all-reduced in buckets as they are
    ready: buckets become ready evenly through the backward pass and are
    reduced one after another; the step waits for the last one."""
    if ranks <= 1:
        return backward
    buckets = max(1, math.ceil(gradient_bytes / bucket_bytes))
    per_bucket = ring_allreduce_seconds(gradient_bytes / buckets, ranks, cost)
    done = 0.0
    for index in range(buckets):
        done = max(done, backward * (index + 1) / buckets) + per_bucket
    return max(backward, done)


def data_parallel_step(one_device: StepTime, gradient_bytes: float, ranks: int, cost: CostModel) -> StepTime:
    """One step of ``ranks`` data-parallel processes, each running
    ``one_device``'s step on a batch of its own."""
    backward = overlapped_backward(one_device.backward, gradient_bytes, ranks, cost)
    return StepTime(one_device.forward, backward, one_device.extra, one_device.parts)


def data_parallel_step_of(rank_steps: Sequence[StepTime], gradient_bytes: float, cost: CostModel) -> StepTime:
    """One step of data-parallel processes each running its own batch
    (``rank_steps``: one device's step on each): fairseq gives every GPU
    its own batch of ``--max-tokens``, with other sentence counts and
    lengths, and the all-reduce waits for the slowest rank, so the step is
    the slowest rank's with the reduction overlapped with its backward."""
    slowest = max(rank_steps, key=lambda step: step.total)
    return data_parallel_step(slowest, gradient_bytes, len(rank_steps), cost)


def owned_bytes(model, cfg, k: int, placement: str = "") -> List[float]:
    """Gradient bytes (fp32) of the parameters each device of a hybrid
    group of ``k`` owns (:func:`.owned_bytes.plan_owned_bytes`)."""
    plan = build_plan(",".join(["cpu"] * k), placement, "hybrid", cfg.encoder_layers, cfg.decoder_layers)
    return plan_owned_bytes(model, plan)


def speedup(one_device: StepTime, step: StepTime, ranks: int) -> float:
    """Tokens per second over one device's, for ``ranks`` batches a step."""
    return ranks * one_device.total / step.total
