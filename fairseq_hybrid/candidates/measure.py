"""``fairseq-hybrid-plan --measure DEVICES``: every candidate the plan
priced, run for a few steps on the devices at hand and timed beside its
prediction: the truth on the user's own machine, GPUs included, where no
one else can measure.

Each (round, candidate) runs in a fresh process (:mod:`.run_one`; each
way's run is its own, :mod:`.ways`), the candidates one after another and
the rounds alternating, so that a machine whose speed drifts slows all of
them alike; a candidate's figure is the median of its
rounds.  All of them train the user's model on the same batches (the
ones the plan read its shape from), at the user's global batch: DDP's
ranks and the groups under DDP each take their share of every batch's
sentences.

On CPU devices the prediction is priced with a cost model measured first
on this machine (one device's cells with one thread and with all of
them, the slowdown of K devices at once, gloo's all-reduce;
:mod:`fairseq_hybrid.timing.cpu_calibration`), on other batches than
the timed ones, and calibrated again before every later round, each
round's measurement compared with its own calibration's price of the
same choices: a shared machine drifts within minutes by more than a
calibration made once can hold (docs/benchmarks.md).  On CUDA devices the prediction is the
cost set's or cost file's.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

__all__ = ["MeasureError", "devices_of", "runner_command", "calibrate", "measure", "measured_lines"]

WARMUP = 2  # untimed steps before the timed ones
RUN_TIMEOUT_S = 1800


class MeasureError(RuntimeError):
    """A measuring run failed (not the user's input): its tail and exit status 1."""


def devices_of(text: str, gpus: Optional[int], error: Callable[[str], Exception], option: str = "--measure"
               ) -> List[str]:
    """The devices ``--measure`` names (``cpu,cpu`` or ``cuda:0,cuda:1``),
    each there, all of one kind, as many as ``--gpus``."""
    import torch

    devices = [device.strip() for device in text.split(",") if device.strip()]
    if not devices:
        raise error(f"{option} {text!r}: name the devices, e.g. cpu,cpu or cuda:0,cuda:1")
    parsed = []
    for device in devices:
        try:
            parsed.append(torch.device(device))
        except RuntimeError:
            raise error(f"{option}: {device!r} is not a device (cpu or cuda:N)") from None
        if parsed[-1].type not in ("cpu", "cuda"):
            raise error(f"{option}: {device}: the plan measures on cpu or cuda devices")
    if len({device.type for device in parsed}) > 1:
        raise error(f"{option} {text}: all devices of one kind (cpu or cuda)")
    for index, (device, name) in enumerate(zip(parsed, devices)):
        if device.type == "cuda":
            there = torch.cuda.device_count() if torch.cuda.is_available() else 0
            number = device.index if device.index is not None else index
            if number >= there:
                raise error(f"{option}: {name} is not there (this machine has {there} CUDA device(s))")
            devices[index] = f"cuda:{number}"
    if devices[0].startswith("cuda") and len(set(devices)) < len(devices):
        raise error(f"{option} {text}: each GPU once")
    if gpus is not None and gpus != len(devices):
        raise error(f"--gpus {gpus} but {option} names {len(devices)} device(s)")
    return devices


def runner_command(spec: Dict) -> List[str]:
    return [sys.executable, "-m", "fairseq_hybrid.candidates.run_one", json.dumps(spec)]


def run(spec: Dict, what: str) -> Dict:
    """One run in a fresh process, which ends with this one; its RESULT."""
    from ..timing.ddp_rank import free_port

    spec = dict(spec, port=free_port(), parent=os.getpid())
    try:
        done = subprocess.run(runner_command(spec), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as timeout:
        raise MeasureError(f"{what}: no result within {RUN_TIMEOUT_S} s") from timeout
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise MeasureError(f"{what} failed (exit status {done.returncode}):\n{tail}")
    return json.loads(lines[-1][len("RESULT "):])


def calibrate(train: List[str], devices: Sequence[str], batches: int, progress: Callable[[str], None]) -> Dict:
    """This machine's CPU cost model, measured in a process of its own on
    the command every candidate runs (``train``)."""
    progress(f"calibrating {len(devices)} CPU devices on {batches} other batches (the engine's cells, the model "
             f"with 1 and {len(devices)} threads, {len(devices)} copies at once, gloo's all-reduce, a group of each "
             "kind and DDP's ranks against their prices)")
    started = time.time()
    calibration = run({"kind": "calibrate", "train": train, "devices": list(devices), "batches": batches},
                      "the calibration")
    progress(f"calibrated in {time.time() - started:.0f} s: slowdown {calibration['slowdown']:.3f} with all "
             f"devices busy, all-reduce of {calibration['reduce_bytes'] / 2 ** 20:.0f} MiB in "
             f"{calibration['reduce_seconds'] * 1e3:.0f} ms")
    return calibration


def spec_for(row: Dict, train: List[str], devices: Sequence[str], batches: int) -> Dict:
    """How to run a row of the plan on ``devices`` with the command
    ``train`` (the row's way says it)."""
    from .ways import from_row

    return from_row(row).spec(train, devices, batches, WARMUP)


def measure(result: Dict, train: List[str], devices: Sequence[str], rounds: int, batches: int,
            progress: Callable[[str], None],
            predicted: Optional[Callable[[int], Dict[str, float]]] = None) -> None:
    """Run every row of ``result`` ``rounds`` times, alternating, and put
    its measured tokens/s (median, lowest, highest) and its ratio to the
    prediction in the row; ``result['fastest_measured']`` names the
    fastest by median.

    The first round is compared with the plan's ``tokens_per_s``;
    ``predicted``, a function of a later round's index, gives that round's
    prediction per candidate (on CPU devices each later round has a
    calibration of its own), and without it every round is compared with
    the plan's.  The ratio is the median of the rounds' ratios, the row's
    ``predicted_median`` the median of its predictions."""
    started = time.time()
    readings: Dict[str, List[float]] = {row["name"]: [] for row in result["rows"]}
    prices: Dict[str, List[float]] = {row["name"]: [] for row in result["rows"]}
    planned = {row["name"]: row["tokens_per_s"] for row in result["rows"]}
    for round_index in range(rounds):
        now = predicted(round_index) if predicted and round_index else planned
        for row in result["rows"]:
            one = run(spec_for(row, train, devices, batches), f"{row['name']} (round {round_index + 1})")
            readings[row["name"]].append(one["tokens"] / one["seconds"])
            prices[row["name"]].append(now[row["name"]])
            progress(f"round {round_index + 1}/{rounds}: {row['name']}: {readings[row['name']][-1]:,.0f} tokens/s "
                     f"measured, {now[row['name']]:,.0f} predicted ({time.time() - started:.0f} s so far)")
    for row in result["rows"]:
        values, prices_of = readings[row["name"]], prices[row["name"]]
        row["measured_tokens_per_s"] = statistics.median(values)
        row["measured_rounds"] = values
        row["predicted_rounds"] = prices_of
        row["predicted_median"] = statistics.median(prices_of)
        row["measured_vs_predicted"] = statistics.median(value / price for value, price in zip(values, prices_of))
    result["fastest_measured"] = max(result["rows"], key=lambda row: row["measured_tokens_per_s"])["name"]
    result["measured"] = {"devices": list(devices), "rounds": rounds, "batches": batches, "warmup": WARMUP,
                          "priced_each_round": predicted is not None}


def measured_lines(result: Dict) -> List[str]:
    """The table of prediction and measurement, side by side."""
    where = result["measured"]["devices"]
    lines = [f"Measured on {','.join(where)}: {result['measured']['rounds']} rounds of {result['measured']['batches']} "
             f"timed steps each (after {result['measured']['warmup']}), every candidate in a fresh process per round, "
             "the median" + ("; each round priced with a calibration run just before it (predicted: the rounds' "
                             "median; measured/predicted: the median of the rounds' ratios):"
                             if result["measured"].get("priced_each_round") else ":"), "",
             f"{'candidate':<36} {'predicted':>10} {'measured':>10} {'lowest-highest':>17} {'measured/predicted':>19}"]
    for row in result["rows"]:
        mark = "  <- fastest measured" if row["name"] == result["fastest_measured"] else ""
        span = f"{min(row['measured_rounds']):,.0f}-{max(row['measured_rounds']):,.0f}"
        lines.append(f"{row['name']:<36} {row['predicted_median']:>10,.0f} {row['measured_tokens_per_s']:>10,.0f} "
                     f"{span:>17} {row['measured_vs_predicted']:>19.2f}{mark}")
    return lines
