"""fairseq options that a hybrid group cannot serve, refused before training.

fairseq accepts these with any model; with a ``hybrid_lstm`` group they
would fail deep inside the first step, or train wrongly.  fairseq's
``Trainer`` is the first place that sees the whole configuration and the
model together, so the check runs when it is built (before any step) and
names the flag to use instead.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..parallel import DevicePlanError

LEGACY_DDP = ("legacy_ddp", "no_c10d")


def check_training_setup(cfg, model) -> None:
    """Raise :class:`DevicePlanError` for an option the model's group cannot
    serve; nothing for a model without a group."""
    group = getattr(model, "hybrid_group", None)
    plan = group.plan if group is not None else None
    if plan is None:
        return
    devices = ",".join(str(device) for device in plan.devices)
    distributed = cfg.distributed_training
    if getattr(distributed, "pipeline_model_parallel", False):
        raise DevicePlanError(
            "--pipeline-model-parallel splits a model fairseq's way, but a hybrid_lstm group places its layers "
            "itself: drop it and use --hybrid-devices (and --hybrid-placement)")
    if getattr(cfg.common, "model_parallel_size", 1) > 1:
        raise DevicePlanError(
            "--model-parallel-size > 1 is fairseq's Megatron model parallelism, which hybrid_lstm does not use: "
            "drop it; --hybrid-devices puts the model on several devices")
    kinds = {device.type for device in plan.devices}
    if getattr(cfg.common, "cpu", False) and "cuda" in kinds:
        raise DevicePlanError(f"--cpu with --hybrid-devices {devices}: drop --cpu, or give CPU devices (cpu,cpu)")
    if kinds == {"cpu"} and torch.cuda.is_available() and not getattr(cfg.common, "cpu", False):
        raise DevicePlanError(f"--hybrid-devices {devices} are CPU devices, but fairseq will put the batches on "
                              "CUDA: add --cpu, or give CUDA devices")
    world = getattr(distributed, "distributed_world_size", 1) or 1
    backend = getattr(distributed, "ddp_backend", "legacy_ddp")
    if world > 1 and backend not in LEGACY_DDP:
        raise DevicePlanError(
            f"--ddp-backend {backend} with a hybrid group: PyTorch's DDP hooks cannot follow the group's backward, "
            "which runs on its worker threads; use --ddp-backend legacy_ddp (fairseq-hybrid-train sets it)")


def checking_init(original_init: Callable) -> Callable:
    """``Trainer.__init__`` that first runs :func:`check_training_setup`."""

    def __init__(self, cfg, task, model, criterion, *args, **kwargs):
        check_training_setup(cfg, model)
        original_init(self, cfg, task, model, criterion, *args, **kwargs)

    return __init__
