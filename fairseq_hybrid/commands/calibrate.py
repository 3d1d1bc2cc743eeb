"""``fairseq-hybrid-plan calibrate DEVICES``: this machine's devices
measured once on the user's command, written as a cost file that
``fairseq-hybrid-plan --cost-file`` and ``--hybrid-cost-model`` read::

  fairseq-hybrid-plan calibrate cpu,cpu --out costs.json -- \\
      fairseq-train data-bin --arch hybrid_lstm_base --max-tokens 2000
  fairseq-hybrid-plan --gpus 2 --cost-file costs.json -- fairseq-train data-bin ...
  fairseq-train data-bin ... --hybrid-devices cpu,cpu --hybrid-placement auto --hybrid-cost-model costs.json

On CPU devices it is what ``--measure`` calibrates before it prices the
candidates (:func:`fairseq_hybrid.timing.plan_measure.calibrate`: the
engine's cells fitted, the model with 1 and K threads, K copies at once,
gloo's all-reduce), on batches of the command's data.  GPUs are measured
by ``benchmarks/gpu_check.py --phases calibrate`` (its host time per cell
needs the test harness's stand-in model), into a GPU cost file.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from typing import Optional, Sequence

from ..forecasts.cost_file import write_cpu
from ..timing.cpu_calibration import cpu_name
from ..timing.plan_measure import MeasureError, calibrate, devices_of
from ..train_command import OneLineParser, PlanError, measured_command, parse_training, split_command

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="fairseq-hybrid-plan calibrate", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("devices", metavar="DEVICES", help="the devices to calibrate: cpu,cpu,... (K of them)")
    parser.add_argument("--out", required=True, help="the cost file to write (JSON)")
    parser.add_argument("--batches", type=int, default=8, help="batches of the command's data timed (default 8)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[2:] if argv is None else list(argv)
    if any(arg in ("-h", "--help") for arg in argv[:argv.index("--") if "--" in argv else len(argv)]):
        build_parser().print_help()
        return 0
    try:
        own_argv, train = split_command(argv)
        own = build_parser().parse_args(own_argv)
        if "cuda" in own.devices:
            raise PlanError(f"{own.devices}: calibrate measures CPU devices; a GPU's cost file is written by "
                            "benchmarks/gpu_check.py --phases calibrate")
        devices = devices_of(own.devices, None, PlanError, "calibrate")
        if own.batches < 1:
            raise PlanError(f"--batches {own.batches}: at least 1")
        command = measured_command(train, parse_training(train), "calibrate")
        said = lambda text: print(f"[calibrate] {text}", file=sys.stderr, flush=True)  # noqa: E731
        calibration = calibrate(command, devices, own.batches, said)
        import torch

        measured_on = f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}"
        write_cpu(own.out, calibration, devices, measured_on, shlex.join(["fairseq-train", *train]))
    except PlanError as error:
        print(f"fairseq-hybrid-plan calibrate: {error}", file=sys.stderr)
        return 2
    except MeasureError as error:
        print(f"fairseq-hybrid-plan calibrate: {error}", file=sys.stderr)
        return 1
    print(f"wrote {own.out}: {len(devices)} CPU devices, {measured_on}")
    return 0
