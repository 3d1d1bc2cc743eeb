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

from typing import Dict, Optional, Tuple

from ..parallel import build_plan
from .chunk_choice import candidate_lengths
from .schedule_simulator import CostModel, StepTime, step_time

__all__ = ["KINDS", "PHASES", "COST_SETS", "gpu_cost_model", "cost_set", "predicted_step", "best_chunk_length"]

KINDS = ("lstm", "attention_softmax", "embedding", "gather")
PHASES = ("forward", "backward")
COST_SETS = {
    "p100": {"step_overhead": 5e-3, "link_bandwidth": 12e9, "link_latency": 10e-6},
    "a100": {"step_overhead": 3e-3, "link_bandwidth": 210e9, "link_latency": 10e-6},
}


def gpu_cost_model(rate: float, fixed: Dict[str, float], step_us: float, step_overhead: float,
                   link_bandwidth: float, link_latency: float, note: str = "") -> CostModel:
    """Every cell kind at ``rate`` FLOP/s, ``fixed`` seconds per cell call
    by ``kind/phase``, ``step_us`` per LSTM time step forward (twice
    backward), ``step_overhead`` seconds per step outside the cells."""
    return CostModel(rates={f"{kind}/{phase}": rate for kind in KINDS for phase in PHASES}, fixed=dict(fixed),
                     per_step={"lstm/forward": step_us * 1e-6, "lstm/backward": 2 * step_us * 1e-6},
                     step_overhead=step_overhead, link_bandwidth=link_bandwidth, link_latency=link_latency,
                     note=note)


def cost_set(name: str, fixed: Dict[str, float], step_us: float, rate: float) -> CostModel:
    """The named set (:data:`COST_SETS`) at ``rate`` with this host time and
    time-step latency."""
    return gpu_cost_model(rate, fixed, step_us, **COST_SETS[name])


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
                      replica_copies: bool = True, lengths: Optional[Tuple[int, ...]] = None) -> Tuple[int, StepTime]:
    """The chunk length with the shortest predicted step, and that step,
    among ``--hybrid-chunk-length auto``'s candidates for the batch's widths
    (or ``lengths``); data mode has no chunks."""
    if mode == "data":
        return 0, predicted_step(model, cfg, k, mode, cost, net_input, target)
    if lengths is None:
        lengths = candidate_lengths(net_input["src_tokens"].size(1), net_input["prev_output_tokens"].size(1))
    options = [(length, predicted_step(model, cfg, k, mode, cost, net_input, target, length, "", transform,
                                       replica_copies)) for length in lengths]
    return min(options, key=lambda option: option[1].total)
