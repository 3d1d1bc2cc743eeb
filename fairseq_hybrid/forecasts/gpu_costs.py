"""GPU cost models and the predicted step: what ``fairseq-hybrid-plan``
(through :mod:`.race`) and the scripts that predict what a group would do
on GPUs price with.

A GPU cost model prices every cell kind at one FLOP rate, plus a fixed host
time per cell call, a latency per LSTM time step (twice in backward), a
fixed time per step outside the cells and a link between devices.  The
named sets are the assumptions the documentation's tables state: ``p100``
(PCIe 3 x16, 5 ms a step outside the cells), ``a100`` (NVLink 3, 3 ms) and
``v100`` (a DGX-1's NVLink 2, 5 ms: GNMT v2's published setting, for the
calibration of DDP's prediction) and ``v100-pcie`` (that GPU on the p100
set's PCIe link, no NVLink).

The host time comes in three readings (:data:`HOST_MODELS`): ``queued``, a
GPU's host queueing each cell's kernels ahead of the device, one host for
the group's worker threads (the simulator's ``host_queues``); ``per-device``,
the same with a host per device (``--hybrid-workers processes``), with the
host time one worker measured alone and the CPU's LSTM kernel call counted
as one op (a GPU's cuDNN call queues kernels; the CPU's oneDNN call does
the layer's work); and ``summed``, the host time measured with K workers
added to each cell's device time, the pessimistic end.
"""

from __future__ import annotations

import json
import os
from typing import Dict, Optional, Sequence, Tuple

from ..parallel import build_plan, build_step
from ..planning.chunk_choice import candidate_lengths
from ..planning.schedule_simulator import CostModel, StepTime, flops, step_time

__all__ = ["KINDS", "PHASES", "COST_SETS", "NAMED_SETS", "LSTM_CURVES", "host_report", "STEP_US", "HOST_MODELS",
           "GNMT_A100_TOKENS_PER_S", "GNMT_V100_TOKENS_PER_S", "SET_TOKENS_PER_S", "PUBLISHED_SETS",
           "set_tokens_per_s", "WORKERS_OF_HOST_MODEL", "HOST_MODEL_OF_WORKERS", "MEMORY_BANDWIDTH",
           "as_built_processes", "worker_costs_report", "GNMT_V100_DDP_4", "MLPERF_GNMT_V100", "P100_RATE",
           "host_fixed", "group_host", "solved_rate", "rate_of", "set_rate", "set_costs", "total_flops",
           "lstm_batch_curve", "flat_past_reference", "matmul_curve", "gpu_cost_model", "cost_set", "predicted_step", "best_chunk_length"]

KINDS = ("lstm", "attention_softmax", "embedding", "gather")
PHASES = ("forward", "backward")
COST_SETS = {
    "p100": {"step_overhead": 5e-3, "link_bandwidth": 12e9, "link_latency": 10e-6},
    "a100": {"step_overhead": 3e-3, "link_bandwidth": 210e9, "link_latency": 10e-6},
    # a DGX-1 (V100 SXM2, NVLink 2 hybrid cube mesh): about 100 GB/s for NCCL's ring over four GPUs; Adam
    # over about 160M fp32 parameters at 900 GB/s in about 5 ms
    "v100": {"step_overhead": 5e-3, "link_bandwidth": 100e9, "link_latency": 10e-6},
    # a fast GPU on PCIe without NVLink (a V100 PCIe server, a 4-GPU workstation): the v100 set's GPU with
    # the p100 set's PCIe 3 x16 link, 12 GB/s of its 15.75 GB/s a direction
    "v100-pcie": {"step_overhead": 5e-3, "link_bandwidth": 12e9, "link_latency": 10e-6},
}
# each set's GPU memory bandwidth, bytes/s as published (P100 SXM2 732 GB/s, A100 40GB 1,555 GB/s, V100
# 900 GB/s): a stage's copy of its gradients for the trainer reads and writes each byte
MEMORY_BANDWIDTH = {"p100": 732e9, "a100": 1555e9, "v100": 900e9, "v100-pcie": 900e9}
WORKER_COSTS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_costs.json")
NAMED_SETS = tuple(COST_SETS)  # the published ones; a cost file adds "file:<name>" (cost_file.py)

# the latency of one LSTM time step forward (twice backward) each set assumes, in microseconds
STEP_US = {"p100": 20.0, "a100": 10.0, "v100": 10.0, "v100-pcie": 10.0}

# a set's own LSTM batch curve (seconds per step by batch, per phase; the reference batch), where it has one:
# a cost file's measurement; the named sets take lstm_batch_efficiency.json's
LSTM_CURVES: Dict[str, Tuple[Dict[str, list], int]] = {}

HOST_MODELS = ("queued", "per-device", "summed")
# the --hybrid-workers kind each queueing host model stands for
WORKERS_OF_HOST_MODEL = {"queued": "threads", "per-device": "processes"}
HOST_MODEL_OF_WORKERS = {workers: host_model for host_model, workers in WORKERS_OF_HOST_MODEL.items()}


REFERENCE_BATCH = (128, 50, 50)  # sentences, source and target tokens: the batch a one-GPU tokens/s stands for
GNMT_A100_TOKENS_PER_S = 83.2e3  # NVIDIA GNMT v2 (PyTorch), one A100, TF32, batch 128: source + target tokens/s
GNMT_V100_TOKENS_PER_S = 21.65e3  # the same, one V100, fp32: 21.4-21.9k (DeepLearningExamples, GNMT README)
# the one-GPU source + target tokens/s each named set's FLOP rate is solved for (at 128 sentences of 50 + 50);
# the p100 set has a FLOP rate of its own and takes none
SET_TOKENS_PER_S = {"a100": GNMT_A100_TOKENS_PER_S, "v100": GNMT_V100_TOKENS_PER_S,
                    "v100-pcie": GNMT_V100_TOKENS_PER_S}
PUBLISHED_SETS = ("p100", "a100", "v100", "v100-pcie")
GNMT_V100_DDP_4 = (3.53, 3.67)  # its DDP speed-up on 4 V100, fp32, batch 128 per GPU
# MLPerf Training v0.6, GNMT, NVIDIA's submissions on V100 (mixed precision), source + target tokens/s per
# GPU: 256 sentences per GPU on one DGX-1 (8 GPUs), 32 per GPU on 48 DGX-1 (384 GPUs)
MLPERF_GNMT_V100 = {256: (8, 90.3e3), 32: (384, 38.9e3)}


def set_tokens_per_s(name: str, given: Optional[float] = None) -> float:
    """One GPU's tokens/s the set ``name``'s FLOP rate is solved for:
    ``given`` (measured on the user's GPU) where there is one, else the
    set's published figure (:data:`SET_TOKENS_PER_S`; the A100's for a set
    without one)."""
    return given or SET_TOKENS_PER_S.get(name, GNMT_A100_TOKENS_PER_S)


def host_report(path: str) -> Dict:
    """The host-cost report in ``path``: ``bench_host_cost.py --json``'s
    output, or a cost file holding one (its ``host_cost``)."""
    with open(path) as file:
        report = json.load(file)
    return report.get("host_cost", report)


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
    report = host_report(path)
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


def group_host(path: Optional[str], k: int, host_model: str) -> Tuple[Dict[str, float], bool]:
    """The host seconds per cell of a group of ``k`` and whether the host
    queues ahead of the devices, in one of :data:`HOST_MODELS`: ``queued``
    takes one worker's host time (the simulator makes the K workers take
    turns on the host), with the LSTM kernel call as one op where a CPU
    measured its share (on a GPU that call's host time is what it is);
    ``per-device`` the same, each worker on a host of its own;
    ``summed`` the K-worker row, added to the device time."""
    if host_model not in HOST_MODELS:
        raise ValueError(f"host model {host_model!r}: one of {', '.join(HOST_MODELS)}")
    if host_model == "summed":
        return host_fixed(path, k), False
    cpu_kernel = False  # the LSTM kernel call measured inside a CPU's cell: a GPU's host does not pay it
    if path:
        report = host_report(path)
        cpu_kernel = "lstm_kernel_share_k1_whole" in report and report.get("device", "cpu") == "cpu"
    return host_fixed(path, 1, lstm_kernel=not cpu_kernel), True


def solved_rate(model, cfg, sample, fixed, step_us, tokens_per_s: float = GNMT_A100_TOKENS_PER_S,
                host_queues: bool = False, name: str = "a100") -> float:
    """The FLOP rate at which one device's step of ``sample`` takes the
    time that ``tokens_per_s`` (source + target) gives, under the named
    set: GNMT v2's one-A100 figure, or one measured on a GPU at hand
    (``--one-device-tokens-per-s``).  With the host time summed, the step
    is the rest plus the work over the rate; with a queueing host the rate
    is found by bisection (the step falls as the rate grows)."""
    net_input, target = sample
    target_seconds = (int(net_input["src_lengths"].sum()) + target.numel()) / tokens_per_s
    plan = build_plan("cpu", "", "hybrid", cfg.encoder_layers, cfg.decoder_layers)

    def step(rate: float) -> float:
        return step_time(model, plan, *sample, cost_set(name, fixed, step_us, rate, host_queues=host_queues)).total

    other = step(float("inf"))
    work = total_flops(model, cfg, sample)
    if target_seconds <= other:
        raise ValueError(f"the host and latency costs alone ({other * 1e3:.1f} ms) exceed the one-device step "
                         f"({target_seconds * 1e3:.1f} ms): no rate fits")
    low = work / target_seconds  # the device's work alone takes the whole step: too slow
    if not host_queues:
        return work / (target_seconds - other)
    while step(low) <= target_seconds:  # cells above the reference batch run faster than the rate: lower still
        low /= 2
    high = 2 * low
    while step(high) > target_seconds:
        low, high = high, 2 * high
    for _ in range(40):
        middle = (low * high) ** 0.5
        low, high = (middle, high) if step(middle) > target_seconds else (low, middle)
    return high


P100_RATE = 9.3e12 * 0.5  # the P100 set: 9.3 TFLOP/s fp32 at 50%


def rate_of(name: str, model, cfg, sample, fixed_one: Dict[str, float], step_us: float, host_queues: bool,
            tokens_per_s: float = GNMT_A100_TOKENS_PER_S) -> float:
    """The FLOP rate of the named set: the P100 set's given rate, the
    others' solved for ``tokens_per_s`` on one device with this host time."""
    if name == "p100":
        return P100_RATE
    return solved_rate(model, cfg, sample, fixed_one, step_us, tokens_per_s, host_queues=host_queues, name=name)


def set_rate(name: str, model, cfg, sample, path: Optional[str], step_us: float, host_model: str,
             tokens_per_s: float = GNMT_A100_TOKENS_PER_S) -> float:
    """:func:`rate_of` with one device's host time from ``path`` under
    ``host_model``."""
    fixed, queues = group_host(path, 1, host_model)
    return rate_of(name, model, cfg, sample, fixed, step_us, queues, tokens_per_s)


def set_costs(name: str, path: Optional[str], k: int, step_us: float, rate: float,
              host_model: str) -> Tuple[CostModel, CostModel]:
    """The named set's cost models for a group of ``k`` and for one device
    (one data-parallel rank) under ``host_model``; ``per-device`` is a
    process per device as built (:func:`as_built_processes`)."""
    fixed, queues = group_host(path, k, host_model)
    fixed_one, _ = group_host(path, 1, host_model)
    group = cost_set(name, fixed, step_us, rate, host_queues=queues, host_per_device=host_model == "per-device")
    if host_model == "per-device":
        group = as_built_processes(group, name, path, k)
    return group, cost_set(name, fixed_one, step_us, rate, host_queues=queues)


def worker_costs_report(path: str = WORKER_COSTS_FILE) -> Dict:
    """What ``benchmarks/bench_worker_costs.py`` measured (the file says
    where): a stage's build, a message on the host wire and as a gloo
    header, a command's round trip."""
    with open(path) as file:
        return json.load(file)


def as_built_processes(cost: CostModel, name: str, path: Optional[str], k: int) -> CostModel:
    """``cost`` (each worker's host its own) with what a process per device
    costs beyond it: each stage's build of the step, no message's host
    time (after a shape's first step no message between GPU stages goes
    with a header, processes/gpu_wire.py; NCCL's own call not counted), the
    trainer's two commands (:data:`WORKER_COSTS_FILE`, measured on a CPU
    host), and each stage's copy of its gradients at the set's memory
    bandwidth.  Where the cost file holds the GPU check's ``workers``
    readings for processes, each cell's host time is what they measured
    at the nearest K (builds and messages inside it)."""
    readings = _process_readings(path, k)
    if readings is not None:
        cost.workers = "processes"
        cost.fixed = {key: readings for key in cost.fixed}
        return cost
    report = worker_costs_report()
    built = cost.as_processes({**report, "message_send": 0.0, "message_receive": 0.0,
                               "copy_bandwidth": MEMORY_BANDWIDTH.get(name, MEMORY_BANDWIDTH["a100"]) / 2})
    built.described = ()  # no header on the GPU wire once a shape has been described (processes/gpu_wire.py)
    return built


def _process_readings(path: Optional[str], k: int) -> Optional[float]:
    """The host seconds per cell call a cost file's ``workers`` readings
    measured for processes at the K nearest ``k`` (None: none there)."""
    if not path:
        return None
    with open(path) as file:
        rows = [row for row in json.load(file).get("workers", {}).get("rows", []) if row["workers"] == "processes"]
    if not rows:
        return None
    row = min(rows, key=lambda r: abs(len(r["devices"].split(",")) - k))
    calls = row["host_us_per_call"]
    return sum(calls) / len(calls) * 1e-6


def total_flops(model, cfg, sample) -> float:
    """Floating-point operations of one device's step, forward and backward."""
    plan = build_plan("cpu", "", "hybrid", cfg.encoder_layers, cfg.decoder_layers)
    built = build_step(model, plan, *sample, None, 0)
    return sum(flops(cell.work, phase) for cell in built.step.cells for phase in PHASES if cell.work is not None)


LSTM_BATCH_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lstm_batch_efficiency.json")


def lstm_batch_curve() -> Tuple[Dict[str, list], int]:
    """An LSTM layer's GPU seconds per time step by batch, per phase, and
    the batch the rate stands for (the file says where they were measured)."""
    with open(LSTM_BATCH_FILE) as file:
        data = json.load(file)
    return data["seconds_per_step"], int(data["reference_batch"])


def flat_past_reference(name: str) -> str:
    """Register the named set with its LSTM curve cut at the reference batch
    (every larger cell at the reference's throughput: the curve before it
    was continued past 128, kept as a sensitivity case); its name."""
    curve, reference = LSTM_CURVES.get(name) or lstm_batch_curve()
    variant = f"{name}, flat past {reference}"
    COST_SETS[variant], STEP_US[variant] = dict(COST_SETS[name]), STEP_US[name]
    LSTM_CURVES[variant] = ({phase: [point for point in points if point[0] <= reference]
                             for phase, points in curve.items()}, reference)
    return variant


MATMUL_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "matmul_efficiency.json")


def matmul_curve() -> Tuple[list, int]:
    """A GPU's matrix-product FLOP/s by rows and the rows the rate stands
    for (the file says where they were measured)."""
    with open(MATMUL_FILE) as file:
        data = json.load(file)
    return data["flops_by_rows"], int(data["reference_rows"])


def gpu_cost_model(rate: float, fixed: Dict[str, float], step_us: float, step_overhead: float,
                   link_bandwidth: float, link_latency: float, note: str = "",
                   batch_efficiency: bool = True, host_queues: bool = False,
                   lstm_curve: Optional[Tuple[Dict[str, list], int]] = None,
                   host_per_device: bool = False) -> CostModel:
    """Every cell kind at ``rate`` FLOP/s, ``fixed`` seconds per cell call
    by ``kind/phase``, ``step_us`` per LSTM time step forward (twice
    backward), ``step_overhead`` seconds per step outside the cells.
    ``batch_efficiency``: an LSTM cell of fewer sentences than the batch
    the rate stands for (128) runs at the lower throughput a GPU reaches
    there (:func:`lstm_batch_curve`), and an attention-softmax cell of
    fewer target positions than the fused loss's 256-row chunks likewise
    (:func:`matmul_curve`); without it, FLOPs cost the same at any batch
    (the bound).  ``host_queues``: the host queues each cell
    ahead of the device, one host for all workers (:data:`HOST_MODELS`),
    or one each with ``host_per_device``.
    ``lstm_curve``: the LSTM curve measured on the GPU priced (a cost
    file's) in place of the published one."""
    curve, reference = (lstm_curve or lstm_batch_curve()) if batch_efficiency else ({}, 0)
    matmul, matmul_reference = matmul_curve() if batch_efficiency else ([], 0)
    return CostModel(rates={f"{kind}/{phase}": rate for kind in KINDS for phase in PHASES}, fixed=dict(fixed),
                     per_step={"lstm/forward": step_us * 1e-6, "lstm/backward": 2 * step_us * 1e-6},
                     step_overhead=step_overhead, link_bandwidth=link_bandwidth, link_latency=link_latency,
                     note=note, lstm_batch_seconds=curve, lstm_reference_batch=reference, host_queues=host_queues,
                     host_per_device=host_per_device, matmul_rows_flops=matmul, matmul_reference_rows=matmul_reference)


def cost_set(name: str, fixed: Dict[str, float], step_us: float, rate: float,
             batch_efficiency: bool = True, host_queues: bool = False, host_per_device: bool = False) -> CostModel:
    """The named set (:data:`COST_SETS`) at ``rate`` with this host time and
    time-step latency."""
    return gpu_cost_model(rate, fixed, step_us, batch_efficiency=batch_efficiency, host_queues=host_queues,
                          lstm_curve=LSTM_CURVES.get(name), host_per_device=host_per_device, **COST_SETS[name])


def predicted_step(model, cfg, k: int, mode: str, cost: CostModel, net_input, target, chunk_length: int = 0,
                   placement: str = "", transform=None, replica_copies: bool = True,
                   micro_batches: int = 1, softmax_chunks: int = 1) -> StepTime:
    """The simulated step of ``model`` on a group of ``k`` devices in
    ``mode`` (default placement unless given; ``micro_batches`` and
    ``softmax_chunks`` as ``--hybrid-micro-batches`` and
    ``--hybrid-softmax-chunks``)."""
    plan = build_plan(",".join(["cpu"] * k), placement if mode != "data" else "", mode, cfg.encoder_layers,
                      cfg.decoder_layers)
    return step_time(model, plan, net_input, target, cost, chunk_length, transform=transform,
                     replica_copies=replica_copies, micro_batches=micro_batches if mode != "data" else 1,
                     softmax_chunks=softmax_chunks)


def best_chunk_length(model, cfg, k: int, mode: str, cost: CostModel, net_input, target, transform=None,
                      replica_copies: bool = True, lengths: Optional[Sequence[int]] = None, placement: str = "",
                      micro_batches: int = 1, softmax_chunks: int = 1) -> Tuple[int, StepTime]:
    """The chunk length with the shortest predicted step, and that step,
    among ``--hybrid-chunk-length auto``'s candidates for the batch's widths
    (or ``lengths``); data mode has no chunks."""
    if mode == "data":
        return 0, predicted_step(model, cfg, k, mode, cost, net_input, target)
    if lengths is None:
        lengths = candidate_lengths(net_input["src_tokens"].size(1), net_input["prev_output_tokens"].size(1))
    options = [(length, predicted_step(model, cfg, k, mode, cost, net_input, target, length, placement, transform,
                                       replica_copies, micro_batches, softmax_chunks)) for length in lengths]
    return min(options, key=lambda option: option[1].total)
