"""What every measurement and check under ``benchmarks/`` does, written once:
a model from fairseq options (or from a preset on made-up dictionaries), a
batch on a device, one training step's loss and gradients, timed training
steps, and a report written as JSON beside its Markdown table.

The scripts import it from the installed package (``scripts/setup.sh``
installs it in editable mode); the GPU cost model and the predicted step
they share are the planner's (:mod:`fairseq_hybrid.forecasts.gpu_costs`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch

# the timed steps live with the plan's measuring, a product module; the benchmarks find them here too
from ..timing.training_steps import backward_step, on_device, synchronize, train_steps
from ..command_lines.train_command import command_batches

__all__ = [
    "USER_DIR", "COMMON", "SIZE", "NO_DATA", "read_args", "fairseq_lstm_args", "preset_args", "build",
    "task_of",
    "batches", "command_batches", "on_device", "backward_step", "loss_and_grads", "train_steps", "synchronize", "System", "suite_systems", "write_report",
]

USER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the fairseq_hybrid folder
COMMON = ["--task", "translation", "--source-lang", "ja", "--target-lang", "en", "--cpu", "--dropout", "0.1"]
SIZE = {"embed": 256, "hidden": 256, "layers": 2}  # hybrid_lstm_base's
NO_DATA = "no such folder (run recipes/tatoeba_ja_en/run.sh --steps download,prepare,spm,binarize)"


# -- model options -------------------------------------------------------------------


def fairseq_lstm_args(size=SIZE) -> List[str]:
    """fairseq's own ``lstm`` at ``size`` (input feeding, every encoder layer bidirectional)."""
    return [
        "--arch", "lstm", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--encoder-embed-dim", str(size["embed"]), "--encoder-hidden-size", str(size["hidden"]),
        "--encoder-layers", str(size["layers"]), "--encoder-bidirectional",
        "--decoder-embed-dim", str(size["embed"]), "--decoder-hidden-size", str(size["hidden"]),
        "--decoder-layers", str(size["layers"]), "--decoder-out-embed-dim", str(size["embed"]),
    ]


def preset_args(arch: str = "hybrid_lstm_base", devices: str = "", mode: str = "hybrid", chunk_length: int = 0,
                placement: str = "", dropout: Optional[float] = None, dropout_masks: str = "",
                micro_batches: str = "", workers: str = "") -> List[str]:
    """A ``hybrid_lstm`` preset, on one device or (``devices``) on a group
    (``workers``: its ``--hybrid-workers``)."""
    args = ["--user-dir", USER_DIR, "--arch", arch, "--criterion", "hybrid_cross_entropy", "--label-smoothing", "0.1"]
    if dropout is not None:
        args += ["--dropout", str(dropout)]
    if devices:
        args += ["--hybrid-devices", devices, "--hybrid-mode", mode, "--hybrid-chunk-length", str(chunk_length)]
        if placement:
            args += ["--hybrid-placement", placement]
        if dropout_masks:
            args += ["--hybrid-dropout-masks", dropout_masks]
        if micro_batches:
            args += ["--hybrid-micro-batches", micro_batches]
        if workers:
            args += ["--hybrid-workers", workers]
    return args


def read_args(path: str) -> List[str]:
    """The options of an argument file, one a line (``--name value`` or
    ``--flag``; the value is the rest of the line): how the main job keeps
    its training settings (``recipes/tatoeba_ja_en/training.args``), read
    by its ``run.sh`` alike."""
    args: List[str] = []
    with open(path) as file:
        for line in file:
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            name, _, value = line.partition(" ")
            args += [name, value] if value else [name]
    return args


# -- models and batches --------------------------------------------------------------


def _task_and_config(data: str, model_args: List[str]):
    """fairseq's parser on ``data`` and ``model_args``: the config and the
    task, train split loaded."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(parser, [data] + COMMON + model_args))
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    return task, cfg


def build(data: str, model_args: List[str]):
    """Task (train split loaded), model (seed 1) and criterion, from
    fairseq's own parser."""
    task, cfg = _task_and_config(data, model_args)
    torch.manual_seed(1)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return task, model, criterion


def task_of(data: str):
    """The translation task of a binarized ja-en corpus, train split loaded."""
    return _task_and_config(data, preset_args("hybrid_lstm_tiny"))[0]


def batches(task, max_tokens: int, count: int, max_positions=(64, 64)):
    """The first ``count`` training batches of ``max_tokens`` (seed 1), as
    fairseq's batch sampler draws them (:func:`command_batches`, sentences
    longer than ``max_positions`` left out); fewer is an error."""
    drawn = command_batches(task, max_tokens, None, count, max_positions=max_positions)
    if len(drawn) < count:
        raise ValueError(f"{count} training batches asked at --max-tokens {max_tokens}, the data gives {len(drawn)}")
    return drawn


def real_batch_lengths(data: str, max_tokens: int, count: int):
    """``count`` training batches of ``data`` as fairseq's batch sampler
    draws them for one GPU at ``max_tokens`` (shuffled, seed 1): each its
    source and target lengths (:mod:`fairseq_hybrid.forecasts.real_batches`)."""
    from ..forecasts.real_batches import lengths_of

    task = task_of(data)
    return lengths_of(batches(task, max_tokens, count, max_positions=(1024, 1024)), task.target_dictionary.pad())


def integers(text: str) -> List[int]:
    """A script's option of comma-separated whole numbers."""
    return [int(value) for value in text.split(",") if value.strip()]


def race_options(parser) -> None:
    """The options the race scripts share (``benchmarks/fair_race.py``,
    ``fair_race_global.py``): the host time, the sets' tokens/s, the
    vocabulary and the groups' choices to try."""
    parser.add_argument("--host-cost", help="benchmarks/bench_host_cost.py --json output (default: 30 us per cell)")
    parser.add_argument("--one-device-tokens-per-s", type=float, default=None,
                        help="one GPU's tokens/s every set's FLOP rate is solved for (default: each set's published "
                        "figure, gpu_costs.SET_TOKENS_PER_S; the p100 set has a rate of its own)")
    parser.add_argument("--vocabulary", type=int, default=32000)
    parser.add_argument("--micro-batches", type=integers, default=[1, 2, 4, 8],
                        help="counts to try (default 1,2,4,8)")
    parser.add_argument("--lengths", type=integers, default=None,
                        help="chunk lengths to try (default: --hybrid-chunk-length auto's candidates)")


def host_models(text: str) -> List[str]:
    """A script's option of ways to price the host time
    (:data:`fairseq_hybrid.forecasts.gpu_costs.HOST_MODELS`)."""
    import argparse

    from ..forecasts.gpu_costs import HOST_MODELS

    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names:
        if name not in HOST_MODELS:
            raise argparse.ArgumentTypeError(f"{name!r}: each one of {', '.join(HOST_MODELS)}")
    return names


# -- one step ------------------------------------------------------------------------


def loss_and_grads(model, criterion, sample) -> Tuple[torch.Tensor, Dict, Dict[str, torch.Tensor]]:
    """One step's loss, logging outputs and every parameter's gradient, in
    host memory (what the exactness checks compare)."""
    loss, _, logging = backward_step(model, criterion, sample)
    grads = {name: p.grad.detach().to("cpu").clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach().to("cpu"), logging, grads


# -- the systems of the benchmark suite ------------------------------------------------


@dataclass(frozen=True)
class System:
    """One way of training the benchmark's model.  ``kind``: fairseq_lstm,
    one_device, group (``mode`` hybrid, model or data; ``placement``),
    gloo (K processes of DDP), copies (K independent single-device steps
    at once: the ceiling); ``micro_batches``: a group's
    ``--hybrid-micro-batches``.  ``threads``: intra-op threads of the process
    (a group's workers run one each); ``options``: a group's further
    fairseq options (a plan's chosen chunk length, micro-batches,
    softmax chunks and placement), after the others."""

    name: str
    kind: str
    threads: int = 1
    mode: str = ""
    placement: str = ""
    micro_batches: str = ""
    workers: str = ""  # a group's --hybrid-workers (default: the option's own)
    options: Tuple[str, ...] = ()

    def model_args(self, devices: str) -> List[str]:
        if self.kind == "fairseq_lstm":
            return fairseq_lstm_args()
        if self.kind == "group":
            return preset_args("hybrid_lstm_base", devices, self.mode, 0, self.placement,
                               micro_batches=self.micro_batches, workers=self.workers) + list(self.options)
        return preset_args("hybrid_lstm_base")


def suite_systems(k: int) -> List[System]:
    return [
        System("fairseq lstm, 1 thread", "fairseq_lstm"),
        System("fairseq lstm, 2 threads", "fairseq_lstm", threads=2),
        System("hybrid_lstm_base, 1 device", "one_device"),
        System(f"hybrid_lstm_base, 1 device, {k} threads", "one_device", threads=k),
        System(f"hybrid on {k} devices", "group", threads=k, mode="hybrid"),
        System(f"hybrid on {k} devices, placement auto", "group", threads=k, mode="hybrid", placement="auto"),
        System(f"hybrid on {k} devices, micro-batches auto", "group", threads=k, mode="hybrid",
               micro_batches="auto"),
        System(f"hybrid on {k} devices, placement and micro-batches auto", "group", threads=k, mode="hybrid",
               placement="auto", micro_batches="auto"),
        System(f"hybrid on {k} devices, processes", "group", threads=k, mode="hybrid", workers="processes"),
        System(f"hybrid on {k} devices, placement and micro-batches auto, processes", "group", threads=k,
               mode="hybrid", placement="auto", micro_batches="auto", workers="processes"),
        System(f"pure model parallel on {k} devices", "group", threads=k, mode="model"),
        System(f"pure data parallel on {k} devices (one process)", "group", threads=k, mode="data"),
        System(f"data parallel across {k} gloo processes", "gloo"),
        System(f"{k} independent copies (ceiling)", "copies"),
    ]


# -- reports -------------------------------------------------------------------------


def ending_with_this_process() -> Callable[[], None]:
    """``subprocess``'s ``preexec_fn`` for a measuring script's child that
    ends with the script, however the script ends: Linux's parent-death
    signal (SIGTERM, kept across the child's exec), and an end at once
    where the script is gone before it is set."""
    import ctypes
    import signal

    parent = os.getpid()

    def set_up() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)

    return set_up


def write_report(report: Dict, json_path: Optional[str], markdown: Optional[str] = None) -> None:
    """``report`` as JSON at ``json_path`` and, where given, its Markdown
    table beside it (same name, ``.md``); folders made as needed."""
    if not json_path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "w") as file:
        json.dump(report, file, indent=2)
        file.write("\n")
    if markdown is not None:
        with open(os.path.splitext(json_path)[0] + ".md", "w") as file:
            file.write(markdown)
