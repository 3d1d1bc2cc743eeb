"""The user's fairseq-train command made into what a timed run trains: its
task, model (seed 1) and criterion on the devices asked for, and the
batches fairseq's sampler draws for it, so that every candidate and every
calibration trains the same model on the same batches."""

from __future__ import annotations

from typing import Dict, List, Sequence

import torch

from ..command_lines.train_command import command_batches
from .training_steps import train_steps

__all__ = ["build", "drawn", "padded_tokens", "timed"]


def build(train: List[str], devices: Sequence[str], group: Dict = None, with_batches: bool = True):
    """Task (its train split loaded ``with_batches``), model (seed 1) and
    criterion of the user's command on ``devices``: one device, or a hybrid
    group with ``group``'s choices (chunk length, micro-batches,
    attention-softmax chunks, placement, workers)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from .. import models  # noqa: F401  (registers hybrid_lstm)

    args = list(train)
    if all(device == "cpu" for device in devices):
        args.append("--cpu")
    if len(devices) > 1 or group:
        group = group or {}
        args += ["--hybrid-devices", ",".join(devices),
                 "--hybrid-chunk-length", str(group.get("chunk_length", 0)),
                 "--hybrid-micro-batches", str(group.get("micro_batches", 1)),
                 "--hybrid-softmax-chunks", str(group.get("softmax_chunks", 1))]
        if group.get("placement"):
            args += ["--hybrid-placement", group["placement"]]
        if group.get("workers"):
            args += ["--hybrid-workers", group["workers"]]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), args))
    task = tasks.setup_task(cfg.task)
    if with_batches:
        task.load_dataset(cfg.dataset.train_subset)
    torch.manual_seed(1)
    model = task.build_model(cfg.model)
    if len(devices) == 1 and not group and devices[0] != "cpu":
        model = model.to(devices[0])
    return task, cfg, model, task.build_criterion(cfg.criterion)


def drawn(task, cfg, count: int, seed: int = 1):
    """The first ``count`` batches fairseq's sampler draws for the command."""
    return command_batches(task, cfg.dataset.max_tokens, cfg.dataset.batch_size, count, seed,
                           cfg.dataset.train_subset)


def padded_tokens(samples: Sequence[Dict]) -> int:
    """Sentences times source plus target width, summed: the plan's count."""
    return sum(s["target"].size(0) * (s["net_input"]["src_tokens"].size(1) + s["target"].size(1)) for s in samples)


def timed(model, criterion, optimizer, samples, warmup: int, device: str) -> float:
    """Seconds of ``samples``' steps after ``warmup`` untimed ones."""
    train_steps(model, criterion, optimizer, samples[:warmup], device)
    return train_steps(model, criterion, optimizer, samples, device)[1]
