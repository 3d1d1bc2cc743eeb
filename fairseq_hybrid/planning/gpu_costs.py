"""GPU cost models and the predicted step, for scripts that predict what a
group would do on GPUs no one here has (``benchmarks/predict_speedups.py``,
``benchmarks/simulate_schedule.py``).

A GPU cost model prices every cell kind at one FLOP rate, plus a fixed host
time per cell call, a latency per LSTM time step (twice in backward), a
fixed time per step outside the cells and a link between devices.  The
named sets are the assumptions the documentation's tables state: ``p100``
(PCIe 3 x16, 5 ms a step outside the cells) and ``a100`` (NVLink 3,
3 ms).
"""

from __future__ import annotations

import json
import os
from typing import Dict, Optional, Sequence, Tuple

from ..parallel import build_hybrid_step, build_plan
from .chunk_choice import candidate_lengths
from .schedule_simulator import CostModel, StepTime, flops, step_time

__all__ = ["KINDS", "PHASES", "COST_SETS", "GNMT_A100_TOKENS_PER_S", "host_fixed", "a100_rate", "total_flops",
           "gpu_cost_model", "cost_set", "predicted_step", "best_chunk_length"]

KINDS = ("lstm", "attention_softmax", "embedding", "gather")
PHASES = ("forward", "backward")
COST_SETS = {
    "p100": {"step_overhead": 5e-3, "link_bandwidth": 12e9, "link_latency": 10e-6},
    "a100": {"step_overhead": 3e-3, "link_bandwidth": 210e9, "link_latency": 10e-6},
}


GNMT_A100_TOKENS_PER_S = 83.2e3  # NVIDIA GNMT v2 (PyTorch), one A100, TF32, batch 128: source + target tokens/s


def host_fixed(path: Optional[str], k: int, lstm_kernel: bool = True) -> Dict[str, float]:
    """Seconds of host time per cell by kind and phase at ``k`` workers:
    the cell's own call plus the time outside cells per cell, from the
    host-cost benchmark's whole-sequence (default chunk) row for ``k``
    (the nearest K measured).  ``lstm_kernel=False``: an LSTM cell's
    kernel op (on a CPU, oneDNN doing the layer's work at a fixed cost of
    its own; its share of the cell measured at K = 1) counted as one small
    op instead, as if the call only queued a kernel."""
    if not path:
        return {f"{kind}/{phase}": 30e-6 for kind in KINDS for phase in PHASES}
    with open(path) as file:
        report = json.load(file)
    rows = [row for row in report["rows"] if row["chunk_length"] == 0]
    row = min(rows, key=lambda r: abs(r["k"] - k))
    outside = row["outside_cells_us_per_cell"]
    fixed = {}
    for kind in KINDS:
        for phase in PHASES:
            cell = row["cell_us"].get(f"{kind}/{phase}", row["cell_us"].get(f"lstm/{phase}", 0.0))
            if kind == "lstm" and not lstm_kernel:
                cell = cell * (1.0 - report["lstm_kernel_share_k1_whole"][f"lstm/{phase}"]) + report["op_us"]
            fixed[f"{kind}/{phase}"] = (cell + outside) * 1e-6
    return fixed


def a100_rate(model, cfg, sample, fixed, step_us, tokens_per_s: float = GNMT_A100_TOKENS_PER_S) -> float:
    """The FLOP rate at which one device's step takes the time that
    ``tokens_per_s`` (source + target) gives: GNMT v2's one-A100 figure, or
    one measured on a GPU at hand (``--one-device-tokens-per-s``)."""
    target = 128 * (50 + 50) / tokens_per_s
    free = cost_set("a100", fixed, step_us, float("inf"))
    plan = build_plan("cpu", "", "hybrid", cfg.encoder_layers, cfg.decoder_layers)
    other = step_time(model, plan, *sample, free).total
    work = total_flops(model, cfg, sample)
    if target <= other:
        raise ValueError(f"the host and latency costs alone ({other * 1e3:.1f} ms) exceed the one-device step "
                         f"({target * 1e3:.1f} ms): no rate fits")
    return work / (target - other)


def total_flops(model, cfg, sample) -> float:
    """Floating-point operations of one device's step, forward and backward."""
    plan = build_plan("cpu", "", "hybrid", cfg.encoder_layers, cfg.decoder_layers)
    built = build_hybrid_step(model, plan, *sample, None, 0)
    return sum(flops(cell.work, phase) for cell in built.step.cells for phase in PHASES if cell.work is not None)


LSTM_BATCH_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lstm_batch_efficiency.json")


def lstm_batch_curve() -> Tuple[Dict[str, list], int]:
    """An LSTM layer's GPU seconds per time step by batch, per phase, and
    the batch the rate stands for (the file says where they were measured)."""
    with open(LSTM_BATCH_FILE) as file:
        data = json.load(file)
    return data["seconds_per_step"], int(data["reference_batch"])


def gpu_cost_model(rate: float, fixed: Dict[str, float], step_us: float, step_overhead: float,
                   link_bandwidth: float, link_latency: float, note: str = "",
                   batch_efficiency: bool = True) -> CostModel:
    """Every cell kind at ``rate`` FLOP/s, ``fixed`` seconds per cell call
    by ``kind/phase``, ``step_us`` per LSTM time step forward (twice
    backward), ``step_overhead`` seconds per step outside the cells.
    ``batch_efficiency``: an LSTM cell of fewer sentences than the batch
    the rate stands for (128) runs at the lower throughput a GPU reaches
    there (:func:`lstm_batch_curve`); without it, FLOPs cost the same at
    any batch (the bound)."""
    curve, reference = lstm_batch_curve() if batch_efficiency else ({}, 0)
    return CostModel(rates={f"{kind}/{phase}": rate for kind in KINDS for phase in PHASES}, fixed=dict(fixed),
                     per_step={"lstm/forward": step_us * 1e-6, "lstm/backward": 2 * step_us * 1e-6},
                     step_overhead=step_overhead, link_bandwidth=link_bandwidth, link_latency=link_latency,
                     note=note, lstm_batch_seconds=curve, lstm_reference_batch=reference)


def cost_set(name: str, fixed: Dict[str, float], step_us: float, rate: float,
             batch_efficiency: bool = True) -> CostModel:
    """The named set (:data:`COST_SETS`) at ``rate`` with this host time and
    time-step latency."""
    return gpu_cost_model(rate, fixed, step_us, batch_efficiency=batch_efficiency, **COST_SETS[name])


def predicted_step(model, cfg, k: int, mode: str, cost: CostModel, net_input, target, chunk_length: int = 0,
                   placement: str = "", transform=None, replica_copies: bool = True,
                   micro_batches: int = 1) -> StepTime:
    """The simulated step of ``model`` on a group of ``k`` devices in
    ``mode`` (default placement unless given; ``micro_batches`` as
    ``--hybrid-micro-batches``)."""
    plan = build_plan(",".join(["cpu"] * k), placement if mode != "data" else "", mode, cfg.encoder_layers,
                      cfg.decoder_layers)
    return step_time(model, plan, net_input, target, cost, chunk_length, transform=transform,
                     replica_copies=replica_copies, micro_batches=micro_batches if mode != "data" else 1)


def best_chunk_length(model, cfg, k: int, mode: str, cost: CostModel, net_input, target, transform=None,
                      replica_copies: bool = True, lengths: Optional[Sequence[int]] = None, placement: str = "",
                      micro_batches: int = 1) -> Tuple[int, StepTime]:
    """The chunk length with the shortest predicted step, and that step,
    among ``--hybrid-chunk-length auto``'s candidates for the batch's widths
    (or ``lengths``); data mode has no chunks."""
    if mode == "data":
        return 0, predicted_step(model, cfg, k, mode, cost, net_input, target)
    if lengths is None:
        lengths = candidate_lengths(net_input["src_tokens"].size(1), net_input["prev_output_tokens"].size(1))
    options = [(length, predicted_step(model, cfg, k, mode, cost, net_input, target, length, placement, transform,
                                       replica_copies, micro_batches)) for length in lengths]
    return min(options, key=lambda option: option[1].total)
