"""A cost model of CPU devices, measured on the machine at hand: the
engine's cells timed on one device and fitted (rate, cost per LSTM time
step and fixed cost per kind of cell and phase, and the step's time
outside the cells).

Two users: ``benchmarks/simulate_schedule.py``, which validates the
simulator against the benchmark suite, and ``fairseq-hybrid-plan
--measure`` on CPU devices, which prices the candidates it then runs with
what this machine measured a minute before (:func:`cpu_costs`), so that
its predictions can be checked against its own measurements.

What one device alone cannot show is measured beside it: how much each
device slows when all K run at once (they share the memory bandwidth and
caches: ``slowdown``), the main thread's part of a group's step with the
process's K intra-op threads, and gloo's all-reduce between K processes.
"""

from __future__ import annotations

import copy
import gc
import platform
import time
from typing import Dict, Sequence, Tuple

import torch

from ..parallel import record_cell_times
from ..planning.cost_fit import fit, samples_from_trace
from ..planning.schedule_simulator import CostModel
from .training_steps import train_steps

__all__ = ["cpu_name", "timed_steps", "fitted_cost", "scaled", "cpu_costs", "ring_bandwidth"]


def cpu_name() -> str:
    """This machine's CPU as ``lscpu`` names it (the model name in
    /proc/cpuinfo), for the reports that time it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def timed_steps(model, criterion, optimizer, samples):
    """The cells' times of training steps on ``samples`` and the seconds a
    step spent outside them."""
    gc.collect()  # before the clock (train_steps says why)
    start = time.perf_counter()
    with record_cell_times() as trace:
        train_steps(model, criterion, optimizer, samples, collect=False)
    wall = time.perf_counter() - start
    return trace, (wall - sum(entry.end - entry.start for entry in trace)) / len(samples)


def fitted_cost(model, criterion, optimizer, samples: Sequence, chunk_lengths=(0, 4), threads: int = 1,
                group_threads: int = 0, what: str = "the model") -> CostModel:
    """Fit a cost model to one CPU device (``model``, a hybrid model on one
    device) running the engine with ``threads`` intra-op threads, on the
    batches whole and cut into short time chunks (cells of many sizes, so
    rates, per-step and fixed costs can be told apart).

    With ``group_threads``, the time outside the cells (the optimizer, the
    step's assembly) is measured a second time with that many threads, as
    the main thread of a group of CPU devices runs it (the groups keep the
    process's K intra-op threads there; each worker takes one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kept = model.hybrid_group.chunk_length
        measured, overhead = [], None
        for chunk_length in chunk_lengths:
            model.hybrid_group.chunk_length = chunk_length
            trace, step_overhead = timed_steps(model, criterion, optimizer, samples)
            measured += samples_from_trace(trace)
            overhead = step_overhead if overhead is None else overhead
        cost = fit(measured, step_overhead=overhead)
        model.hybrid_group.chunk_length = kept
        note = (f"fitted to {len(measured)} cell times of {what} on one CPU device, {threads} thread(s), time "
                f"chunks {', '.join(map(str, chunk_lengths))} (0: whole sequences); outside the cells "
                f"{overhead * 1000:.1f} ms a step")
        if group_threads:
            torch.set_num_threads(group_threads)
            cost.group_step_overhead = timed_steps(model, criterion, optimizer, samples)[1]
            note += f", {cost.group_step_overhead * 1000:.1f} ms with {group_threads} (a group's main thread)"
        cost.note = note
        return cost
    finally:
        torch.set_num_threads(before)


def scaled(cost: CostModel, factor: float, outside_cells: bool = False) -> CostModel:
    """``cost`` with every cell ``factor`` times as long, and with
    ``outside_cells`` the step's time outside them too."""
    out = copy.deepcopy(cost)
    out.rates = {key: rate / factor for key, rate in cost.rates.items()}
    out.fixed = {key: seconds * factor for key, seconds in cost.fixed.items()}
    out.per_step = {key: seconds * factor for key, seconds in cost.per_step.items()}
    out.default_rate = cost.default_rate / factor
    if outside_cells:
        out.step_overhead = cost.step_overhead * factor
        out.group_step_overhead = None if cost.group_step_overhead is None else cost.group_step_overhead * factor
    return out


def ring_bandwidth(nbytes: float, ranks: int, seconds: float) -> float:
    """The link bandwidth a ring all-reduce of ``nbytes`` over ``ranks``
    that took ``seconds`` implies (``data_parallel_cost.ring_allreduce_seconds``
    solved for it, latency left out)."""
    return 2 * (ranks - 1) * nbytes / ranks / seconds


def cpu_costs(calibration: Dict, workers: str = "threads") -> Tuple[callable, CostModel]:
    """The race's costs from a calibration (what ``fairseq-hybrid-plan
    --measure`` measures on CPU devices, ``calibration_runs.run_calibrate``).

    A group of K is priced with the engine's cells as fitted, each slowed
    by what K devices at once cost.  One device and DDP's ranks run the
    model without the engine (fairseq's modules): one device with all K
    threads, priced as the engine's step times what the model took with K
    threads over what the engine took with one, on the calibration's
    batches; a rank with one thread likewise, its cells also slowed as when
    all ranks run, its link gloo's all-reduce.  Returns a function of K
    giving the group's and one device's cost models, and one rank's.
    ``workers="processes"``: the group with a process per device, as
    built (``CostModel.as_processes``; the calibration's ``processes``).  Each
    kind's group adds to its step what a group of it measured beyond its
    price on the calibration's batches (``group_residual``), and a rank
    what DDP's ranks measured beyond theirs (``rank_residual``)."""
    engine = CostModel(**calibration["one_thread"])
    group = copy.deepcopy(engine)
    group.slowdown = calibration["slowdown"]
    if workers == "processes":
        group = group.as_processes(calibration["processes"])
    residual = calibration.get("group_residual", {}).get(workers, 0.0)
    if residual:  # what a group measured beyond its price on the calibration's batches (calibration_runs)
        group.add_group_overhead(residual)
    one = scaled(engine, calibration["plain_all_threads_seconds"] / calibration["engine_seconds"], outside_cells=True)
    rank = scaled(scaled(engine, calibration["plain_seconds"] / calibration["engine_seconds"], outside_cells=True),
                  calibration["slowdown"])
    rank.group_step_overhead = None
    rank.link_bandwidth = calibration["reduce_bandwidth"]
    # what DDP's ranks measured beyond their price on the calibration's batches (calibration_runs)
    rank.step_overhead = max(0.0, rank.step_overhead + calibration.get("rank_residual", 0.0))
    return (lambda k: (group, one)), rank
