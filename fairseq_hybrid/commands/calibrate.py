"""``fairseq-hybrid-plan calibrate DEVICES``: this machine's devices
measured once on the user's command, written as a cost file that
``fairseq-hybrid-plan --cost-file`` and ``--hybrid-cost-model`` read::

  fairseq-hybrid-plan calibrate cpu,cpu --out costs.json -- \\
      fairseq-train data-bin --arch hybrid_lstm_base --max-tokens 2000
  fairseq-hybrid-plan --gpus 2 --cost-file costs.json -- fairseq-train data-bin ...
  fairseq-train data-bin ... --hybrid-devices cpu,cpu --hybrid-placement auto --hybrid-cost-model costs.json

On CPU devices it is what ``--measure`` calibrates before it prices the
candidates (:func:`fairseq_hybrid.candidates.measure.calibrate`: the
engine's cells fitted, the model with 1 and K threads, K copies at once,
gloo's all-reduce, a group of each kind and DDP's ranks against their
prices), on batches of the command's data.  On GPUs
(``cuda:0,cuda:1,...``) it measures what the GPU forecasts price with, on
the command's model (:mod:`fairseq_hybrid.timing.gpu_calibration`): the
host time per cell call, an LSTM layer's time per step by batch, one
GPU's tokens/s; what one machine's GPUs cannot say (the link between
GPUs of another machine, the step's time outside the cells, an LSTM
time step's latency) comes from the published set named by ``--base``.
The file also holds the cost model a group of these K GPUs makes its
``auto`` choices with (``--hybrid-cost-model``).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from typing import Optional, Sequence

from ..candidates.measure import MeasureError, calibrate, devices_of, run
from ..forecasts.cost_file import add_engine_cost_model, write, write_cpu
from ..forecasts.gpu_costs import NAMED_SETS
from ..timing.cpu_calibration import cpu_name
from ..command_lines.train_command import OneLineParser, PlanError, measured_command, parse_training, split_command

__all__ = ["main", "gpu_cost_file"]


USAGE = "fairseq-hybrid-plan calibrate DEVICES --out FILE [options] -- fairseq-train DATA [your fairseq-train options]"

HELP = """Measure this machine's devices once, on your model and data, into a cost
file that "fairseq-hybrid-plan --cost-file" and fairseq-train's
--hybrid-cost-model read:

  fairseq-hybrid-plan calibrate cpu,cpu --out costs.json -- fairseq-train data-bin --arch hybrid_lstm_base --max-tokens 2000
  fairseq-hybrid-plan --gpus 2 --cost-file costs.json -- fairseq-train data-bin ...
  fairseq-train data-bin ... --hybrid-devices cpu,cpu --hybrid-placement auto --hybrid-cost-model costs.json

On GPUs (cuda:0,cuda:1,...) it measures the host time of each cell call,
an LSTM layer's time per step by batch size and one GPU's tokens/s; what
the GPUs of one machine cannot show (the link to another machine, the
time of a step outside its cells) comes from the published set --base
names. On CPU devices (cpu,cpu,...) it measures what --measure measures
before it prices: the engine's cells, the model with 1 and K threads, K
copies at once, gloo's all-reduce, and a group of each kind and DDP's
ranks against their prices. Either way the file also holds the
cost model a group of these devices makes its auto choices with."""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="fairseq-hybrid-plan calibrate", usage=USAGE, description=HELP,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("devices", metavar="DEVICES",
                        help="the devices to calibrate: cpu,cpu,... or cuda:0,cuda:1,... (K of them)")
    parser.add_argument("--out", required=True, help="the cost file to write (JSON)")
    parser.add_argument("--batches", type=int, default=8, help="batches (steps) timed (default 8)")
    parser.add_argument("--base", choices=NAMED_SETS, default=None,
                        help="GPUs: the published set whose link, step overhead and time-step latency the file "
                        "takes (default a100)")
    return parser


def gpu_cost_file(out: str, train, args, devices, batches: int, base: str, said, reference=None,
                  measured_on: Optional[str] = None) -> str:
    """The GPU measurements of ``devices`` on the user's command as the
    candidates run it (``train``; ``args``, the command as fairseq parses
    it), in a process of its own, written as the
    cost file ``out`` on the published set ``base``, with the cost model a
    group of those devices makes its auto choices with; what it was
    measured on.  ``reference`` and ``measured_on``: the GPU check's CPU
    smoke run's other batch (its tiny model at the paper's 128 x 50 + 50
    would take minutes) and name."""
    import torch

    said(f"measuring {len(devices)} GPU(s) on the command's model: one GPU's tokens/s, the host time per cell "
         f"call of a group of 1 and of {len(devices)}, an LSTM layer's time per step by batch")
    started = time.time()
    spec = {"kind": "gpu_calibrate", "train": train, "devices": list(devices), "batches": batches}
    measured = run(dict(spec, reference=list(reference)) if reference else spec, "the GPU calibration")
    said(f"measured in {time.time() - started:.0f} s: {measured['tokens_per_s']:,.0f} tokens/s on one GPU")
    measured_on = measured_on or (f"{torch.cuda.get_device_name(devices[0])}, torch {torch.__version__}, "
                                  f"fairseq-hybrid-plan calibrate, {time.strftime('%Y-%m-%d')}")
    write(out, base=base, tokens_per_s=measured["tokens_per_s"], lstm_seconds=measured["lstm"],
          host_cost=measured["host_cost"], measured_on=measured_on, shape=measured["shape"])
    try:
        add_engine_cost_model(out, args, len(devices))
    except ValueError as error:
        if any(torch.device(device).type != "cpu" for device in devices):
            raise MeasureError(f"{out}: the measured costs fit no FLOP rate ({error})") from error
        # CPU devices (a smoke run): a cell's host time holds its arithmetic, and a group of 1's cells with the
        # engine's time outside them come to one device's step give or take the machine's noise, so no rate may
        # be left to solve; the device's arithmetic is then priced inside the host time alone
        said(f"CPU devices: {error}; the cost model prices each cell's host time alone")
        add_engine_cost_model(out, args, len(devices), rate=math.inf)
    return measured_on


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[2:] if argv is None else list(argv)
    if any(arg in ("-h", "--help") for arg in argv[:argv.index("--") if "--" in argv else len(argv)]):
        build_parser().print_help()
        return 0
    try:
        own_argv, train = split_command(argv)
        own = build_parser().parse_args(own_argv)
        devices = devices_of(own.devices, None, PlanError, "DEVICES")
        if own.batches < 1:
            raise PlanError(f"--batches {own.batches}: at least 1")
        gpus = devices[0].startswith("cuda")
        if own.base and not gpus:
            raise PlanError(f"--base {own.base}: the set a GPU's cost file builds on; {own.devices} are CPU devices")
        args = parse_training(train)
        command = measured_command(train, args, "calibrate")
        said = lambda text: print(f"[calibrate] {text}", file=sys.stderr, flush=True)  # noqa: E731
        import torch

        if gpus:
            measured_on = gpu_cost_file(own.out, command, args, devices, own.batches, own.base or "a100", said)
        else:
            calibration = calibrate(command, devices, own.batches, said)
            measured_on = (f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, "
                           f"{time.strftime('%Y-%m-%d')}")
            write_cpu(own.out, calibration, devices, measured_on, shlex.join(["fairseq-train", *train]))
    except PlanError as error:
        print(f"fairseq-hybrid-plan calibrate: {error}", file=sys.stderr)
        return 2
    except MeasureError as error:
        print(f"fairseq-hybrid-plan calibrate: {error}", file=sys.stderr)
        return 1
    print(f"wrote {own.out}: {len(devices)} {'GPUs' if gpus else 'CPU devices'}, {measured_on}")
    return 0
