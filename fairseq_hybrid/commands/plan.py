"""``fairseq-hybrid-plan``: what to run on N GPUs for the fairseq-train
command line you train with, predicted.

Give it your command (after ``--``) and the GPUs you have; it keeps your
global batch (``--max-tokens`` or ``--batch-size`` times ``--update-freq``:
what one step trains) and prices every way of training it on N GPUs with
the schedule simulator: one GPU, DDP (fairseq's ``--distributed-world-size
N``, the batch split over the GPUs), one hybrid group of N, and groups
under DDP (``fairseq-hybrid-train``), each group at its best count of
micro-batches, chunk length and placement.  It prints predicted tokens/s,
marks the fastest and prints the command line that runs it::

  fairseq-hybrid-plan --gpus 4 --cost-set a100 -- \\
      fairseq-train data-bin --arch hybrid_lstm_paper --max-tokens 6400 --update-freq 2
  fairseq-hybrid-plan --gpus 8 -- fairseq-train - --arch hybrid_lstm_paper --batch-size 128

The prices are the race's (:func:`fairseq_hybrid.candidates.race.race`, what
``benchmarks/fair_race.py`` tabulates): one code path.  No two GPUs have
run this code; every figure is a prediction under the cost set named
(``--cost-set``; the FLOP rate solved for a published one-GPU tokens/s, or
``--one-device-tokens-per-s`` measured on yours), or under a cost file
that your GPUs measured (``--cost-file``, written by ``fairseq-hybrid-plan
calibrate cuda:0,...``: their LSTM curve, host time per cell and one
GPU's tokens/s; ``fairseq_hybrid.forecasts.cost_file``).

With the data folder in the command, the batch's shape comes from it
(``-`` in its place: no data, ``--sentence-length`` and ``--vocabulary``):
fairseq's batch sampler draws ``--batches`` training batches at your
``--max-tokens`` and the plan takes their mean sentences per batch and
mean source and target lengths (a uniform batch of that shape: the
simulator's, not each batch's own); without it, ``--sentence-length``.

With ``--measure DEVICES`` it also runs every candidate for a few steps on
those devices, in alternating rounds, and prints the measured tokens/s
beside the prediction (:mod:`fairseq_hybrid.candidates.measure`); on CPU
devices it first calibrates the cost model it prices them with on this
machine (and again before every later round, each round compared with
its own price)::

  fairseq-hybrid-plan --measure cpu,cpu -- fairseq-train data-bin --arch hybrid_lstm_base --max-tokens 2000

``fairseq-hybrid-plan calibrate DEVICES --out FILE -- fairseq-train ...``
measures this machine's GPUs or CPU devices once into a cost file that ``--cost-file`` and
``--hybrid-cost-model`` read (:mod:`.calibrate`; ``calibrate --help``).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
from functools import partial
from typing import Callable, Dict, List, Optional, Sequence

from ..candidates.measure import MeasureError, calibrate, devices_of, measure, measured_lines
from ..candidates.plan_prices import by_workers, plan, priced_rows
from ..forecasts.gpu_costs import PUBLISHED_SETS
from ..forecasts.workload import Workload, quietly, workload
from ..command_lines.owned_options import SET_BY_PLAN
from ..command_lines.train_command import (GROUP_CRITERION, NO_DATA, SAME_LOSS, USER_DIR, OneLineParser, PlanError,
                             measured_command, parse_training, split_command, with_group_criterion, without)

__all__ = ["PlanError", "Workload", "main", "plan"]

# bench_host_cost.py on CPU (a copy of docs/bench/host_cost.json, shipped with the package)
HOST_COST = os.path.join(USER_DIR, "forecasts", "host_cost.json")


def group_sizes(args, gpus: int) -> List[int]:
    """The group sizes the plan can price on ``gpus`` GPUs (those that
    divide them and that the model has layers for), after refusing, as
    fairseq-train would, the options a hybrid group cannot serve
    (:func:`fairseq_hybrid.fairseq_patches.trainer_checks.check_training_setup`)."""
    from types import SimpleNamespace

    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from ..fairseq_patches.trainer_checks import check_training_setup
    from ..parallel import DevicePlanError
    from ..candidates.race import group_sizes_for, plan_for

    if not args.arch.startswith("hybrid_lstm"):
        raise PlanError(f"--arch {args.arch}: a hybrid group trains hybrid_lstm models (hybrid_lstm_base, "
                        "hybrid_lstm_paper, ...); fairseq's own architectures run on one GPU or under DDP only")
    if args.criterion not in SAME_LOSS:
        raise PlanError(f"--criterion {args.criterion}: a hybrid group runs its cells through --criterion "
                        f"{GROUP_CRITERION} (cross-entropy, label-smoothed with --label-smoothing)")
    sizes = []
    for size in group_sizes_for(gpus):
        plan = plan_for(args, size)
        if plan is None:
            continue  # more devices than the model has layers for
        try:
            check_training_setup(quietly(convert_namespace_to_omegaconf, args), SimpleNamespace(
                hybrid_group=SimpleNamespace(plan=plan)))
        except DevicePlanError as error:
            raise PlanError(str(error)) from error
        sizes.append(size)
    return sizes


def round_predictions(result: Dict, load: Workload, own, measured: List[str], progress) -> Callable:
    """On CPU devices, what each later round of ``--measure`` is compared
    with (the first, with the plan's prices, whose calibration ran just
    before it): a calibration of its own, run just before the round,
    pricing the same choices again, so that a machine whose speed drifts
    over minutes is compared with itself.  A function of the round's index
    giving each candidate's predicted tokens/s."""
    from ..candidates.ways import from_row
    from ..timing.cpu_calibration import cpu_costs

    choices: Dict[str, Dict[int, Dict]] = {}
    for way in map(from_row, result["rows"]):
        if way.choice:  # a group's
            choices.setdefault(way.workers or "threads", {})[way.group_size] = way.choice
    result["calibrations"] = [result["calibration"]]

    def predicted(round_index: int) -> Dict[str, float]:
        calibration = calibrate(measured, own.devices, own.batches, progress)
        result["calibrations"].append(calibration)
        if "processes" in choices:
            table, _ = by_workers(load, own, lambda text: None, partial(cpu_costs, calibration), choices)
        else:
            table, _ = priced_rows(load, own, *cpu_costs(calibration), choices=choices.get("threads"))
        return {row["name"]: row["tokens_per_s"] for row in table}

    return predicted


def command_for(row: Dict, train: List[str], args, sentences: int, devices: Optional[Sequence[str]] = None) -> str:
    """The command line that runs ``row`` at the same global batch (on
    ``devices``; default the first GPUs): its way's command."""
    from ..candidates.ways import from_row

    rest = with_group_criterion(["DATA" if token == NO_DATA else token for token in without(train, SET_BY_PLAN)])
    rest += ["--user-dir", USER_DIR] if "--user-dir" not in train else []
    per = row["sentences_per_group"]
    batch = (["--batch-size", str(per)] if args.batch_size or not args.max_tokens else
             ["--max-tokens", str(math.ceil(args.max_tokens * (args.update_freq[0] if args.update_freq else 1)
                                            * per / sentences))])
    return shlex.join(from_row(row).command(rest, batch, devices))


def report(result: Dict, train: List[str], args, devices: Optional[Sequence[str]] = None) -> str:
    if result.get("calibration"):
        source = (f"the calibration in {result['cost_file']} ({result['measured_on']})" if result.get("cost_file")
                  else "the cost model calibrated on this machine")
        where = (f"{result['gpus']} CPU devices (a GPU below is one CPU device; one device runs with all "
                 f"{result['gpus']} threads), priced with {source}")
    elif result.get("cost_file"):
        where = f"{result['gpus']} GPU(s), the cost file {result['cost_file']} ({result['measured_on']})"
    else:
        where = f"{result['gpus']} GPU(s), {result['cost_set']} cost set (no two GPUs have run this code)"
    lines = [f"Predicted on {where}, a global batch of {result['sentences']} sentences a step:", "",
             f"{'candidate':<36} {'per GPU/group':>13} {'tokens/s':>10} {'vs one GPU':>10} {'vs DDP':>7}"]
    for row in result["rows"]:
        mark = "  <- fastest" if row["name"] == result["fastest"] else ""
        vs_ddp = f"{row['vs_ddp']:.2f}" if "vs_ddp" in row else ""
        lines.append(f"{row['name']:<36} {row['sentences_per_group']:>13} {row['tokens_per_s']:>10,.0f} "
                     f"{row['speedup']:>9.2f}x {vs_ddp:>7}{mark}")
    chosen = result["fastest"]
    if result.get("measured"):
        lines += [""] + measured_lines(result)
        chosen = result["fastest_measured"]
    best = next(row for row in result["rows"] if row["name"] == chosen)
    lines += ["", f"Run the fastest{' measured' if result.get('measured') else ''} with:", "",
              "  " + command_for(best, train, args, result["sentences"], devices)]
    return "\n".join(lines)


def integers(text: str) -> List[int]:
    try:
        values = [int(value) for value in text.split(",") if value.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated whole numbers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: whole numbers of at least 1")
    return values


USAGE = """fairseq-hybrid-plan --gpus N [options] -- fairseq-train DATA [your fairseq-train options]
       fairseq-hybrid-plan --measure cpu,cpu [options] -- fairseq-train DATA [...]
       fairseq-hybrid-plan calibrate DEVICES --out FILE -- fairseq-train DATA [...]"""

HELP = """What to run on N GPUs for the fairseq-train command you train with, predicted.

Give it your fairseq-train command after -- and the number of GPUs you have.
It keeps what one step of your command trains (--max-tokens or --batch-size,
times --update-freq) and prices every way of training that on N GPUs: one
GPU, fairseq's DDP (the batch split over the GPUs), one hybrid group of N,
and groups under DDP. It prints the predicted tokens/s of each, marks the
fastest and prints the command line that runs it:

  fairseq-hybrid-plan --gpus 4 -- fairseq-train data-bin --arch hybrid_lstm_paper --max-tokens 6400
  fairseq-hybrid-plan --gpus 8 -- fairseq-train - --arch hybrid_lstm_paper --batch-size 128

Every figure is a prediction: no two GPUs have run this code. The GPUs'
costs come from a published set (--cost-set) or, better, from a cost file
that your own GPUs measured:

  fairseq-hybrid-plan calibrate cuda:0,cuda:1 --out gpus.json -- fairseq-train data-bin ...
  fairseq-hybrid-plan --gpus 2 --cost-file gpus.json -- fairseq-train data-bin ...

calibrate measures GPUs (cuda:0,...) or this machine's CPU devices
(cpu,cpu,...); "fairseq-hybrid-plan calibrate --help" says more.

With the data folder in the command, the batch's shape is read from its
training batches (--batches of them); with - in its place, from
--sentence-length and --vocabulary. --measure DEVICES also runs every way
for a few steps on those devices and prints what it measured beside the
prediction (on CPU devices after measuring this machine's costs)."""


def build_parser() -> argparse.ArgumentParser:
    """The command's options; its help is :data:`HELP`, plain words for a
    terminal (this module's docstring is the developer's)."""
    parser = OneLineParser(prog="fairseq-hybrid-plan", usage=USAGE, description=HELP,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=None, help="the GPUs you have (N; with --measure, its devices)")
    parser.add_argument("--cost-set", default="a100", help=f"the GPUs' assumed costs: {', '.join(PUBLISHED_SETS)} "
                        "(default a100)")
    parser.add_argument("--cost-file", default=None,
                        help="a cost file: GPUs' (fairseq-hybrid-plan calibrate cuda:0,... writes it), whose "
                        "LSTM curve, host time per cell and tokens/s replace --cost-set's, --host-cost and the "
                        "published tokens/s; or this machine's CPU devices' (fairseq-hybrid-plan calibrate cpu,...), "
                        "with which they are priced as --measure would")
    parser.add_argument("--one-device-tokens-per-s", type=float, default=None,
                        help="one GPU's source + target tokens/s at 128 sentences of 50 + 50 tokens, measured on "
                        "yours (default: the set's published figure; the p100 set has a FLOP rate of its own)")
    parser.add_argument("--host-cost", default=HOST_COST,
                        help="host time per cell, benchmarks/bench_host_cost.py --json (default: one measured on a "
                        "2-core CPU, shipped with the package)")
    parser.add_argument("--sentence-length", type=integers, default=[50, 50],
                        help="SOURCE,TARGET tokens a sentence, without data in the command (default 50,50)")
    parser.add_argument("--vocabulary", type=int, default=32000,
                        help="vocabulary size, without data in the command (default 32000)")
    parser.add_argument("--batches", type=int, default=None,
                        help="training batches drawn to read the shape (default 50; with --measure 8, the batches "
                        "each candidate is timed on)")
    parser.add_argument("--measure", metavar="DEVICES", default=None,
                        help="also run every candidate for --batches steps on these devices (cpu,cpu or "
                        "cuda:0,cuda:1,...; as many as --gpus), --rounds times alternating, and print the measured "
                        "tokens/s beside the prediction; on CPU devices the prediction is priced with a cost model "
                        "measured first on this machine")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of --measure (default 3)")
    parser.add_argument("--micro-batches", type=integers, default=[1, 2, 4],
                        help="counts of micro-batches a group tries (default 1,2,4)")
    parser.add_argument("--json", help="also write the plan as JSON here")
    return parser


def check_own(own) -> None:
    """Refuse bad options with one line; a GPU's cost file is registered as
    a set of its own and takes the place of ``--cost-set`` and
    ``--host-cost``, a CPU calibration prices CPU devices."""
    own.devices = devices_of(own.measure, own.gpus, PlanError) if own.measure is not None else None
    own.cpu_costs, own.calibration = None, None  # CPU devices': a CPU cost file's, or --measure's
    if own.gpus is None:
        if own.devices is None:
            raise PlanError("--gpus N: the GPUs you have (or --measure DEVICES)")
        own.gpus = len(own.devices)
    if own.gpus < 1:
        raise PlanError(f"--gpus {own.gpus}: at least 1")
    if own.batches is None:
        own.batches = 8 if own.devices else 50
    if own.batches < 1 or own.rounds < 1:
        raise PlanError(f"--batches {own.batches} --rounds {own.rounds}: at least 1 each")
    own.file_tokens_per_s, own.measured_on = None, ""
    if own.cost_file:
        from ..forecasts.cost_file import CPU, CostFileError, load, register

        try:
            data = load(own.cost_file)
            measured = None if data.get("kind") == CPU else register(own.cost_file)
        except CostFileError as error:
            raise PlanError(f"--cost-file {error}") from error
        if measured is None:
            cpu_file(own, data)
        else:
            own.cost_set, own.host_cost = measured.name, own.cost_file
            own.file_tokens_per_s, own.measured_on = measured.tokens_per_s, measured.measured_on
    else:
        if own.cost_set not in PUBLISHED_SETS:
            raise PlanError(f"--cost-set {own.cost_set}: unknown, one of {', '.join(PUBLISHED_SETS)}")
        if own.host_cost and not os.path.isfile(own.host_cost):
            raise PlanError(f"--host-cost {own.host_cost}: no such file")
    if len(own.sentence_length) != 2:
        raise PlanError("--sentence-length takes SOURCE,TARGET")
    if own.one_device_tokens_per_s is not None and own.one_device_tokens_per_s <= 0:
        raise PlanError("--one-device-tokens-per-s must be above 0")


def cpu_file(own, data) -> None:
    """A calibration of CPU devices (``fairseq-hybrid-plan calibrate``)
    prices the candidates as ``--measure`` on those devices would, without
    measuring again."""
    from ..timing.cpu_calibration import cpu_costs

    devices = len(data["devices"])
    if own.gpus != devices:
        raise PlanError(f"--cost-file {own.cost_file}: a calibration of {devices} CPU devices: give --gpus {devices}")
    if own.devices and own.devices[0] != "cpu":
        raise PlanError(f"--cost-file {own.cost_file} calibrated CPU devices, --measure names {own.measure}")
    own.calibration, own.measured_on = data["calibration"], data["measured_on"]
    own.cpu_costs, own.cpu_costs_of = cpu_costs(own.calibration), partial(cpu_costs, own.calibration)


def measuring_setup(own, args, train: List[str], progress) -> List[str]:
    """Refuse what ``--measure`` cannot time, and on CPU devices calibrate
    the cost model the candidates are priced with; the user's command as
    the candidates run it."""
    measured = measured_command(train, args, "--measure")
    if own.devices[0] == "cpu" and own.cpu_costs is None:  # (a calibration's cost file: priced already)
        from ..timing.cpu_calibration import cpu_costs

        own.calibration = calibrate(measured, own.devices, own.batches,
                                    lambda text: progress(f"[measure] {text}"))
        own.cpu_costs, own.cpu_costs_of = cpu_costs(own.calibration), partial(cpu_costs, own.calibration)
    return measured


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "calibrate":
        from .calibrate import main as calibrate

        return calibrate(argv[1:])
    try:
        if argv and argv[0] in ("-h", "--help"):
            build_parser().print_help()
            return 0
        own_argv, train = split_command(argv)
        own = build_parser().parse_args(own_argv)
        check_own(own)
        args = parse_training(train)
        own.group_sizes = group_sizes(args, own.gpus)
        progress = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
        load = workload(args, own)  # refuses batches --measure cannot split before it calibrates
        if own.devices:
            measured = measuring_setup(own, args, train, progress)
        result = plan(own, args, progress=progress, load=load)
        if own.devices:
            said = lambda text: progress(f"[measure] {text}")  # noqa: E731
            predicted = round_predictions(result, load, own, measured, said) if own.calibration else None
            measure(result, measured, own.devices, own.rounds, own.batches, said, predicted)
    except PlanError as error:
        print(f"fairseq-hybrid-plan: {error}", file=sys.stderr)
        return 2
    except MeasureError as error:
        print(f"fairseq-hybrid-plan: {error}", file=sys.stderr)
        return 1
    print(report(result, train, args, own.devices))
    if own.json:
        import json

        with open(own.json, "w") as file:
            json.dump(result, file, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
