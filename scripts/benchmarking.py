"""What the benchmark scripts share: model options, models built through
fairseq's own option parsing from a binarized corpus, batches, one
training-step loop, and the systems of the benchmark suite as data.

The entry scripts beside this file (``bench_*.py``, ``check_exactness.py``,
``simulate_schedule.py``) import it by name: Python puts a script's own
folder first on ``sys.path``.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import List, Optional

import torch

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
if REPO not in sys.path:  # a checkout used without installing the package
    sys.path.insert(1, REPO)
USER_DIR = os.path.join(REPO, "fairseq_hybrid")
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


def hybrid_lstm_args(size=SIZE) -> List[str]:
    """``hybrid_lstm`` with every encoder layer bidirectional, as in fairseq's
    lstm, so that the two differ only in input feeding and in how the
    decoder and loss are run."""
    return [
        "--user-dir", USER_DIR,
        "--arch", "hybrid_lstm", "--criterion", "hybrid_cross_entropy", "--label-smoothing", "0.1",
        "--encoder-embed-dim", str(size["embed"]), "--encoder-hidden-size", str(size["hidden"]),
        "--encoder-layers", str(size["layers"]), "--encoder-bidirectional-layers", str(size["layers"]),
        "--decoder-embed-dim", str(size["embed"]), "--decoder-hidden-size", str(size["hidden"]),
        "--decoder-layers", str(size["layers"]), "--decoder-out-embed-dim", str(size["embed"]),
    ]


def preset_args(arch: str = "hybrid_lstm_base", devices: str = "", mode: str = "hybrid", chunk_length: int = 0,
                placement: str = "", dropout: Optional[float] = None, dropout_masks: str = "") -> List[str]:
    """A ``hybrid_lstm`` preset, on one device or (``devices``) on a group."""
    args = ["--user-dir", USER_DIR, "--arch", arch, "--criterion", "hybrid_cross_entropy", "--label-smoothing", "0.1"]
    if dropout is not None:
        args += ["--dropout", str(dropout)]
    if devices:
        args += ["--hybrid-devices", devices, "--hybrid-mode", mode, "--hybrid-chunk-length", str(chunk_length)]
        if placement:
            args += ["--hybrid-placement", placement]
        if dropout_masks:
            args += ["--hybrid-dropout-masks", dropout_masks]
    return args


# -- building and training -----------------------------------------------------------


def build(data: str, model_args: List[str]):
    """Task (train split loaded), model (seed 1) and criterion, from
    fairseq's own parser."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [data] + COMMON + model_args)
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    torch.manual_seed(1)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return task, model, criterion


def batches(task, max_tokens: int, count: int):
    """The first ``count`` training batches of ``max_tokens`` (seed 1)."""
    iterator = task.get_batch_iterator(
        task.dataset("train"), max_tokens=max_tokens, max_positions=(64, 64),
        ignore_invalid_inputs=True, seed=1,
    ).next_epoch_itr(shuffle=True)
    return [next(iterator) for _ in range(count)]


def train_steps(model, criterion, optimizer, samples, device: str = "cpu"):
    """fairseq-style training steps; returns (target tokens, seconds).  On
    ``device="cuda"`` samples move to the GPU and the time includes the
    wait for the queued kernels."""
    model.train()
    tokens = 0
    start = time.perf_counter()
    for sample in samples:
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            from fairseq import utils

            sample = utils.move_to_cuda(sample)
        loss, sample_size, _ = criterion(model, sample)
        (loss / sample_size).backward()
        optimizer.step()
        tokens += sample["ntokens"]
    if device == "cuda":
        torch.cuda.synchronize()
    return tokens, time.perf_counter() - start


# -- the systems of the benchmark suite ------------------------------------------------


@dataclass(frozen=True)
class System:
    """One way of training the benchmark's model.  ``kind``: fairseq_lstm,
    one_device, group (``mode`` hybrid, model or data; ``placement``),
    gloo (K processes of DDP), copies (K independent single-device steps
    at once: the ceiling).  ``threads``: intra-op threads of the process
    (a group's workers run one each)."""

    name: str
    kind: str
    threads: int = 1
    mode: str = ""
    placement: str = ""

    def model_args(self, devices: str) -> List[str]:
        if self.kind == "fairseq_lstm":
            return fairseq_lstm_args()
        if self.kind == "group":
            return preset_args("hybrid_lstm_base", devices, self.mode, 0, self.placement)
        return preset_args("hybrid_lstm_base")


def suite_systems(k: int) -> List[System]:
    return [
        System("fairseq lstm, 1 thread", "fairseq_lstm"),
        System("fairseq lstm, 2 threads", "fairseq_lstm", threads=2),
        System("hybrid_lstm_base, 1 device", "one_device"),
        System(f"hybrid_lstm_base, 1 device, {k} threads", "one_device", threads=k),
        System(f"hybrid on {k} devices", "group", threads=k, mode="hybrid"),
        System(f"hybrid on {k} devices, placement auto", "group", threads=k, mode="hybrid", placement="auto"),
        System(f"pure model parallel on {k} devices", "group", threads=k, mode="model"),
        System(f"pure data parallel on {k} devices (one process)", "group", threads=k, mode="data"),
        System(f"data parallel across {k} gloo processes", "gloo"),
        System(f"{k} independent copies (ceiling)", "copies"),
    ]
