"""A cost file: what a machine measured, in the one format that
``fairseq-hybrid-plan --cost-file`` and ``--hybrid-cost-model`` read.

Two kinds.  A GPU's (``fairseq-hybrid-plan calibrate cuda:0,...``) is a
cost set the simulator and the planner price with in place of published
figures, as below.  A CPU calibration (``"kind": "cpu"``, written by
``fairseq-hybrid-plan calibrate cpu,...``: what ``--measure`` calibrates)
holds the command's model's cost model on this machine's CPU devices
(``cost_model``, which ``--hybrid-cost-model`` reads, as it reads any file
with one) and the calibration it came from (``calibration``), with which
the plan prices CPU devices without measuring again.

The named sets (``p100``, ``a100``, ``v100``) take an LSTM layer's time per
step by batch from DeepBench's V100, the host time per cell from a CPU, and
one GPU's tokens/s from GNMT v2's published tables.  ``fairseq-hybrid-plan
calibrate cuda:0,...`` measures all three on the user's GPUs and model,
so its file replaces them; what one GPU cannot measure (the link
between GPUs, the step's time outside the cells, an LSTM time step's
latency) comes from the named set the file gives as its ``base``.

The file, JSON::

    {"what": "...", "measured_on": "NVIDIA H200, torch ...", "base": "a100",
     "one_device_tokens_per_s": 250000.0,      # the model at 128 sentences of 50 + 50 tokens: source + target
     "lstm": {"hidden": 1024, "reference_batch": 128,
              "seconds_per_step": {"forward": [[16, 7.1e-05], ...], "backward": [[16, 9.0e-05], ...]}},
     "host_cost": {"rows": [...]},              # host time per cell call by K (bench_host_cost.py's rows)
     "cost_model": {...},                       # a group of K of them (--hybrid-workers threads): what
                                                # --hybrid-cost-model reads (fairseq-hybrid-plan calibrate)
     "processes_cost_model": {...}}             # the same with a process per device as built: what
                                                # --hybrid-workers auto prices it with

Loading a file registers it as a set of its own (:func:`register`), so that
every function that takes a set's name prices with it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Dict, List, Optional

from ..planning.schedule_simulator import CostModel
from . import gpu_costs

__all__ = ["CostFileError", "CostFile", "CPU", "add_engine_cost_model", "load", "register", "write", "write_cpu"]

PHASES = ("forward", "backward")
CPU = "cpu"  # the kind of a CPU calibration
# what pricing CPU devices reads of a calibration (timing.cpu_calibration.cpu_costs)
CALIBRATION_KEYS = ("one_thread", "engine_seconds", "plain_seconds", "plain_all_threads_seconds", "slowdown",
                    "reduce_bandwidth", "threads")


class CostFileError(ValueError):
    """A cost file that is missing or does not say what a cost set needs."""


@dataclass
class CostFile:
    name: str  # the set's name once registered: "file:<the file's name>"
    path: str
    base: str
    tokens_per_s: float
    measured_on: str


def _curve(lstm, path: str) -> Dict[str, List[List[float]]]:
    try:
        curve = {phase: sorted([int(batch), float(seconds)] for batch, seconds in lstm["seconds_per_step"][phase])
                 for phase in PHASES}
        reference = int(lstm["reference_batch"])
    except (KeyError, TypeError, ValueError) as error:
        raise CostFileError(f"{path}: 'lstm' needs 'reference_batch' and 'seconds_per_step' with "
                            f"[[batch, seconds], ...] for forward and backward ({error!r})") from error
    for phase, points in curve.items():
        if reference not in [batch for batch, _ in points]:
            raise CostFileError(f"{path}: the LSTM {phase} curve has no point at the reference batch {reference}")
        if any(seconds <= 0 for _, seconds in points):
            raise CostFileError(f"{path}: the LSTM {phase} curve has a time of 0 or less")
    return curve


def load(path: str) -> Dict:
    """The file's JSON, checked: a clear :class:`CostFileError` for a
    missing file, bad JSON, an unknown base set, or a missing figure."""
    if not os.path.isfile(path):
        raise CostFileError(f"{path}: no such cost file")
    try:
        with open(path) as file:
            data = json.load(file)
    except (OSError, json.JSONDecodeError) as error:
        raise CostFileError(f"{path}: not a JSON cost file ({error})") from error
    if not isinstance(data, dict):
        raise CostFileError(f"{path}: not a JSON cost file (an object expected)")
    if data.get("kind") == CPU:
        calibration = data.get("calibration")
        missing = [key for key in CALIBRATION_KEYS if not isinstance(calibration, dict) or key not in calibration]
        if missing or not isinstance(data.get("cost_model"), dict) or not data.get("devices"):
            raise CostFileError(f"{path}: a CPU calibration needs 'devices', 'cost_model' and a 'calibration' with "
                                f"{', '.join(CALIBRATION_KEYS)}; write it with fairseq-hybrid-plan calibrate")
        return data
    if data.get("base") not in gpu_costs.NAMED_SETS:
        raise CostFileError(f"{path}: 'base' must name one of {', '.join(sorted(gpu_costs.NAMED_SETS))}")
    tokens = data.get("one_device_tokens_per_s")
    if not isinstance(tokens, (int, float)) or tokens <= 0:
        raise CostFileError(f"{path}: 'one_device_tokens_per_s' must be a number above 0")
    _curve(data.get("lstm", {}), path)
    host = data.get("host_cost")
    if not isinstance(host, dict) or not any(row.get("chunk_length") == 0 for row in host.get("rows", [])):
        raise CostFileError(f"{path}: 'host_cost' must hold a host-cost report with a row at chunk length 0")
    if "cost_model" in data and not isinstance(data["cost_model"], dict):
        raise CostFileError(f"{path}: 'cost_model' must be a cost model (an object)")
    return data


def register(path: str) -> CostFile:
    """Load ``path`` and add it to the cost sets under ``file:<name>``: its
    base set's link, step overhead and time-step latency, its own LSTM
    curve; its host time is read from the same file (``host_cost``), which
    :func:`gpu_costs.host_fixed` takes in place of a host-cost report."""
    data = load(path)
    if data.get("kind") == CPU:
        raise CostFileError(f"{path}: a calibration of CPU devices, which prices CPU devices only "
                            "(fairseq-hybrid-plan --cost-file); a GPU forecast needs a GPU's cost file")
    name = f"file:{os.path.basename(path)}"
    base = data["base"]
    gpu_costs.COST_SETS[name] = dict(gpu_costs.COST_SETS[base])
    gpu_costs.STEP_US[name] = gpu_costs.STEP_US[base]
    gpu_costs.LSTM_CURVES[name] = (_curve(data["lstm"], path), int(data["lstm"]["reference_batch"]))
    return CostFile(name, path, base, float(data["one_device_tokens_per_s"]), provenance(data))


def provenance(data: Dict) -> str:
    """Where a cost file's figures come from, as the plan prints it: the
    GPU and the run that measured it, or, for a file scaled from another
    (``scaled``), that it is a prediction, from what, by which script at
    which commit."""
    measured = str(data.get("measured_on", ""))
    scaled = data.get("scaled")
    if not isinstance(scaled, dict):
        return measured
    ratios = ", ".join(f"{kind} x {ratio:.3f}" for kind, ratio in sorted(scaled.get("ratios", {}).items()))
    return (f"scaled, not measured: {scaled.get('from', '?')} ({measured}) with its host time per call {ratios}, "
            f"by benchmarks/scale_cost_file.py as of {scaled.get('scripts_at', '?')}")


def write(path: str, *, base: str, tokens_per_s: float, lstm_seconds: Dict, host_cost: Dict, measured_on: str,
          reference_batch: int = 128, shape: str = "") -> Dict:
    """Write a cost file from measurements (``timing.gpu_calibration``'s):
    ``lstm_seconds`` as ``{"hidden", "rows": {batch: {"forward": s,
    "backward": s}}}``, ``host_cost`` a host-cost report (its ``rows``).
    Checked by loading it back."""
    rows = lstm_seconds["rows"]
    data = {
        "what": "a cost set measured on one GPU machine (fairseq_hybrid.forecasts.cost_file): an LSTM layer's time "
                "per step by batch, the host time per cell, one device's tokens/s; the link, the step's time "
                f"outside the cells and an LSTM time step's latency are the {base} set's",
        "measured_on": measured_on,
        "base": base,
        "one_device_tokens_per_s": tokens_per_s,
        "one_device_shape": shape or "hybrid_lstm_paper, 128 sentences of 50 + 50 tokens, 32k vocabulary",
        "lstm": {"hidden": lstm_seconds.get("hidden"), "steps": lstm_seconds.get("steps"),
                 "reference_batch": reference_batch,
                 "seconds_per_step": {phase: [[int(batch), row[phase]] for batch, row in rows.items()]
                                      for phase in PHASES}},
        "host_cost": host_cost,
    }
    return _saved(path, data)


def write_cpu(path: str, calibration: Dict, devices: List[str], measured_on: str, command: str) -> Dict:
    """Write a CPU calibration (``timing.calibration_runs.run_calibrate``'s) as a
    cost file; checked by loading it back."""
    data = {
        "what": "a calibration of CPU devices on the command's model and batches (fairseq_hybrid.forecasts.cost_file, "
                "written by fairseq-hybrid-plan calibrate): its cells' cost model with one thread, which "
                "--hybrid-cost-model reads, and what pricing K such devices needs besides",
        "kind": CPU,
        "measured_on": measured_on,
        "devices": list(devices),
        "command": command,
        "cost_model": calibration["one_thread"],
        "calibration": calibration,
    }
    if "processes" in calibration:  # what --hybrid-workers auto prices a process per device with
        processes = CostModel(**calibration["one_thread"]).as_processes(calibration["processes"])
        residual = calibration.get("group_residual", {})
        # beside cost_model: what a group of processes measured beyond its price, over what threads did
        processes.add_group_overhead(residual.get("processes", 0.0) - residual.get("threads", 0.0))
        data["processes_cost_model"] = dict(processes.__dict__)
    return _saved(path, data)


def add_engine_cost_model(path: str, args, k: int, rate: Optional[float] = None) -> Dict:
    """Add to a GPU cost file the cost model a group of ``k`` of its GPUs
    makes its ``auto`` choices with (``--hybrid-cost-model`` reads it): the
    file's set at the FLOP rate solved for its tokens/s on the command's
    model (``args``: its parsed fairseq-train options), one host queueing
    the workers' cells (``--hybrid-workers threads``, the default).  A
    ``ValueError`` where the measured host time leaves no rate that fits
    (``rate``: this FLOP rate instead of the solved one)."""
    from .gpu_costs import REFERENCE_BATCH, STEP_US, set_costs, set_rate
    from ..planning.twin_model import uniform_batch
    from .workload import twin_of, vocabulary_sizes

    measured = register(path)
    model, cfg = twin_of(args, *vocabulary_sizes(args, args.data, 32000))
    step_us = STEP_US[measured.base]
    if rate is None:
        rate = set_rate(measured.name, model, cfg, uniform_batch(*REFERENCE_BATCH), path, step_us, "queued",
                        measured.tokens_per_s)
    group, _ = set_costs(measured.name, path, k, step_us, rate, "queued")
    group.note = f"a group of {k} on {measured.measured_on}, one host for its workers (--hybrid-workers threads)"
    processes, _ = set_costs(measured.name, path, k, step_us, rate, "per-device")
    processes.note = f"a group of {k} on {measured.measured_on}, a process per device as built"
    return _saved(path, dict(load(path), cost_model=dict(group.__dict__), processes_cost_model=dict(processes.__dict__)))


def _saved(path: str, data: Dict) -> Dict:
    """``data`` written to ``path`` as JSON (its folder made), checked by
    loading it back."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as file:
        json.dump(data, file, indent=2)
        file.write("\n")
    load(path)
    return data
