"""The schedule simulator: a step's cells replayed with a cost model, to
predict the step's time on other machines (and for other placements).

The hybrid engine runs a step as cells in a fixed order per device
(:mod:`fairseq_hybrid.parallel.runtime.wavefront`).  Given what each cell costs, replaying that order
with the same dependencies gives the step's time without running it:

* forward: every device runs its cells in clock order; a cell starts once
  its device is free and every input has arrived (its producer finished,
  plus the link's latency and transfer time when the producer is another
  device);
* backward: the reverse order, a cell waiting for the gradients of all
  cells that read it;
* replicated parts (:mod:`fairseq_hybrid.parallel.runtime.replicas`): each replica's parameter copy
  leaves its master's device when the step starts, one copy after another
  on that device's link, and the replica's first cell waits for it; its
  gradient copy leaves once the replica's last cell has run backward, one
  after another on the link into the master's device, and the step ends
  when the last one has arrived;
* plus the step's fixed cost outside the cells (optimizer, criterion glue).

On a GPU the host only queues a cell's kernels and goes on
(``CostModel.host_queues``): a cell's fixed cost is then host time, spent
on one host shared by the group's worker threads (they take turns holding
the GIL), or with ``host_per_device`` on each worker's own host (a process
per device, ``--hybrid-workers processes``), and its arithmetic is device time that starts once the cell is
queued, its device is free and its inputs are there.  The host runs ahead
of the devices as far as the dependencies let it (a worker queues its next
cell once the inputs' producers have queued theirs).  Without it (CPU
devices, where the host does the work, or the pessimistic reading of a
GPU) a cell costs the sum, each worker on its own.

Costs come from a :class:`CostModel`: floating-point operations per cell
(from the cell's :class:`~fairseq_hybrid.parallel.runtime.cell_graph.Work`) divided by a rate per kind of
cell and phase, plus a fixed cost per cell call; rates and fixed costs are
fitted to cell times measured on this machine (:func:`.cost_fit.fit`) or given for
a device we do not have.

:func:`step_time` lays out the cells with the engine's own step builder
(:mod:`fairseq_hybrid.parallel.recipe.hybrid_cells`, on any model, even one whose parameters live on
torch's ``meta`` device) and replays them, so the simulated schedule is
the engine's schedule, cell for cell.
"""

from __future__ import annotations

import copy
import heapq
import json
import math
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..parallel import Cell, CellSpec, DevicePlan, DevicePlanError, Work, build_step, clocks

PHASES = ("forward", "backward")
BYTES_PER_VALUE = 4  # fp32 activations
# CostModel's fields that price a process per device as built (what timing/worker_costs.py measures)
PROCESS_FIELDS = ("build_fixed", "build_per_cell", "build_per_own_cell", "message_send", "message_receive",
                  "command_round_trip", "copy_bandwidth")


def flops(work: Work, phase: str) -> float:
    """Floating-point operations of a cell (multiply-add = 2)."""
    if work.kind == "lstm":
        input_size, hidden = work.sizes[:2]
        forward = 8.0 * hidden * (input_size + hidden) * work.tokens  # 4 gates
        return forward if phase == "forward" else 2.0 * forward
    if work.kind == "attention_softmax":
        hidden, context, out_dim, vocab, source_length = work.sizes
        attention = 2.0 * hidden * context + 4.0 * source_length * context + 2.0 * (context + hidden) * out_dim
        if phase == "forward":
            # the fused output loss computes logits and both of their
            # gradients in the forward pass: three V x D products
            return work.tokens * (attention + 6.0 * out_dim * vocab + 10.0 * vocab)
        return work.tokens * 2.0 * attention
    if work.kind in ("embedding", "gather"):
        return float(work.tokens * work.sizes[0])
    raise ValueError(f"no cost formula for cells of kind {work.kind!r}")


def device_flops(cells: Sequence[Cell], size: int, kinds: Optional[Sequence[str]] = None,
                 exclude: Sequence[str] = ()) -> List[float]:
    """Each device's floating-point operations in a step's cells, forward
    and backward, of the given ``kinds`` (all by default) less those in
    ``exclude``: how the work is spread."""
    work = [0.0] * size
    for cell in cells:
        if cell.work is None or cell.work.kind in exclude or (kinds is not None and cell.work.kind not in kinds):
            continue
        work[cell.worker] += flops(cell.work, "forward") + flops(cell.work, "backward")
    return work


def input_bytes(work: Work) -> float:
    """Bytes a cell reads from other cells (what crosses a link)."""
    if work.kind == "lstm":
        return BYTES_PER_VALUE * work.tokens * work.sizes[0]
    if work.kind == "attention_softmax":  # decoder states and (about) the shard's encoder states
        hidden, context = work.sizes[:2]
        return BYTES_PER_VALUE * work.tokens * (hidden + context)
    return BYTES_PER_VALUE * work.tokens * (work.sizes[0] if work.sizes else 1)


@dataclass
class CostModel:
    """Seconds of a cell: ``flops / rate[kind/phase] + fixed[kind/phase]``."""

    rates: Dict[str, float] = field(default_factory=dict)  # flop/s
    fixed: Dict[str, float] = field(default_factory=dict)  # seconds per cell call
    per_step: Dict[str, float] = field(default_factory=dict)  # seconds per time step of an LSTM cell (latency-bound GPUs)
    step_overhead: float = 0.0  # seconds per step outside the cells
    # the same for a group of several devices, where it differs (None: step_overhead): on K CPU devices the
    # main thread's part of the step (the optimizer, the step's assembly) runs with the process's K
    # intra-op threads while one device alone is calibrated with one
    group_step_overhead: Optional[float] = None
    link_bandwidth: float = float("inf")  # bytes/s between two devices
    link_latency: float = 0.0  # seconds per transfer between two devices
    slowdown: float = 1.0  # per-cell time factor when all devices run at once (shared memory bandwidth)
    # an LSTM layer's seconds per time step by batch, per phase ([[batch, seconds], ...], measured at one
    # size): its throughput at a cell's batch over that at lstm_reference_batch scales the cell's rate
    lstm_batch_seconds: Dict[str, List[List[float]]] = field(default_factory=dict)
    lstm_reference_batch: int = 0
    # a matrix product's FLOP/s by its rows ([[rows, flop/s], ...]): an attention-softmax cell of fewer target
    # positions than matmul_reference_rows runs at the throughput there over that at the reference
    matmul_rows_flops: List[List[float]] = field(default_factory=list)
    matmul_reference_rows: int = 0
    default_rate: float = 1e10
    # the fixed seconds are host time that queues the device's work: one host for all workers, the device
    # running behind it (a GPU); False: a cell costs fixed + arithmetic on its own worker (CPU devices)
    host_queues: bool = False
    # with host_queues: every worker has a host of its own (--hybrid-workers processes) instead of one for all
    host_per_device: bool = False
    # the runtime priced: "threads" (one build of the step, tensors handed over in memory) or "processes"
    # as built (each stage's build, its messages' host time, the trainer's commands, the gradients' copy
    # to the trainer: PROCESS_FIELDS, what fairseq_hybrid.timing.worker_costs measures)
    workers: str = "threads"
    build_fixed: float = 0.0  # a build's seconds: fixed, per cell of the step, per cell of the builder's own
    build_per_cell: float = 0.0
    build_per_own_cell: float = 0.0
    message_send: float = 0.0  # host seconds of a message between stages at its sender and its receiver
    message_receive: float = 0.0
    command_round_trip: float = 0.0  # the trainer's command to its stages and their replies, twice a step
    copy_bandwidth: float = 0.0  # bytes/s of a stage's copy of its gradients for the trainer (0: free)
    # the passes whose messages between stages carry a description (a message's host time above): every one
    # on the host wire; none on the GPU wire once a shape's first step has described its activations (a
    # receiver knows each shape from the layout and a gradient's from the output it sent), leaving NCCL's
    # own call, which no message here is priced with
    described: Tuple[str, ...] = ("forward", "backward")
    note: str = ""

    def overhead(self, devices: int) -> float:
        """Seconds per step outside the cells on ``devices`` devices."""
        if devices > 1 and self.group_step_overhead is not None:
            return self.group_step_overhead
        return self.step_overhead

    def add_group_overhead(self, seconds: float) -> None:
        """A group's time outside the cells ``seconds`` longer (or shorter,
        never below nothing): what a group measured beyond its price."""
        self.group_step_overhead = max(0.0, self.overhead(2) + seconds)

    def as_processes(self, measured: Dict[str, float]) -> "CostModel":
        """A copy for a group with a process per device, as that runtime is
        built, with ``measured``'s :data:`PROCESS_FIELDS`."""
        out = copy.deepcopy(self)
        out.workers, out.host_per_device = "processes", True
        for name in PROCESS_FIELDS:
            setattr(out, name, float(measured[name]))
        return out

    def build_seconds(self, cells: int, own: int) -> float:
        """A build of a step of ``cells`` cells, ``own`` of them the
        builder's (all of them: the one build threads make)."""
        return self.build_fixed + self.build_per_cell * cells + self.build_per_own_cell * own

    def host_seconds(self, work: Work, phase: str) -> float:
        """The host's part of a cell (its call: op dispatch, the engine)."""
        return self.fixed.get(f"{work.kind}/{phase}", 0.0)

    def device_seconds(self, work: Work, phase: str) -> float:
        """The cell's arithmetic and time-step latency on its device."""
        return self.seconds(work, phase) - self.host_seconds(work, phase)

    def seconds(self, work: Work, phase: str) -> float:
        key = f"{work.kind}/{phase}"
        rate = self.rates.get(key, self.default_rate)
        if work.kind == "lstm" and phase in self.lstm_batch_seconds and work.tokens > 0 and work.sizes[2] > 0:
            rate *= self.batch_efficiency(work.tokens / work.sizes[2], phase)
        if work.kind == "attention_softmax" and self.matmul_rows_flops and work.tokens > 0:
            rate *= self.matmul_efficiency(work.tokens)
        seconds = flops(work, phase) / rate + self.fixed.get(key, 0.0)
        if work.kind == "lstm" and key in self.per_step:
            seconds += self.per_step[key] * work.sizes[2]
        return seconds

    def batch_efficiency(self, rows: float, phase: str) -> float:
        """An LSTM cell's throughput at ``rows`` sentences over that at the
        reference batch: time per step interpolated linearly between the
        measured batches, constant below the smallest (latency), and the
        largest batch's throughput above it.  Below the reference at most
        1; above it as measured (a curve that ends at the reference, the
        published one, prices every larger cell at the reference's
        throughput)."""
        points = sorted(self.lstm_batch_seconds[phase])
        reference = self.lstm_reference_batch
        if rows <= points[0][0]:
            throughput = rows / points[0][1]
        elif rows >= points[-1][0]:
            throughput = points[-1][0] / points[-1][1]
        else:
            throughput = rows / next(s0 + (s1 - s0) * (rows - b0) / (b1 - b0)
                                     for (b0, s0), (b1, s1) in zip(points, points[1:]) if b0 <= rows <= b1)
        at_reference = next(s for b, s in points if b == reference)
        efficiency = throughput / (reference / at_reference)
        return min(1.0, efficiency) if rows < reference else efficiency

    def matmul_efficiency(self, rows: float) -> float:
        """A matrix product's throughput at ``rows`` rows over that at the
        reference rows (1.0 from there up): interpolated in log rows
        between the measured points, constant below the smallest."""

        def flops_at(n: float) -> float:
            points = sorted(self.matmul_rows_flops)
            if n <= points[0][0]:
                return points[0][1]
            if n >= points[-1][0]:
                return points[-1][1]
            (n0, f0), (n1, f1) = next((a, b) for a, b in zip(points, points[1:]) if a[0] <= n <= b[0])
            return f0 + (f1 - f0) * (math.log(n) - math.log(n0)) / (math.log(n1) - math.log(n0))

        reference = self.matmul_reference_rows
        return 1.0 if rows >= reference else min(1.0, flops_at(rows) / flops_at(reference))

    def transfer(self, work: Work) -> float:
        if self.link_bandwidth == float("inf"):
            return self.link_latency
        return self.link_latency + input_bytes(work) / self.link_bandwidth

    @classmethod
    def load(cls, path: str, key: str = "cost_model") -> Optional["CostModel"]:
        """The cost model in ``path``: a cost file's ``cost_model``
        (``fairseq-hybrid-plan calibrate``; ``benchmarks/simulate_schedule.py
        --json`` writes one too) or a cost model alone; with ``key=
        "processes_cost_model"`` the file's cost model of a process per
        device, as built (None where it has none).  A missing or malformed
        file is a DevicePlanError naming it (the file is given as
        ``--hybrid-cost-model``)."""
        try:
            with open(path) as f:
                data = json.load(f)
            if key != "cost_model":
                return cls(**data[key]) if key in data else None
            return cls(**data.get("cost_model", data))
        except (OSError, ValueError, TypeError, AttributeError) as error:
            raise DevicePlanError(f"--hybrid-cost-model {path}: not a cost model ({error}); write one with "
                                  "fairseq-hybrid-plan calibrate DEVICES --out FILE -- fairseq-train ...") from error


@dataclass
class StepTime:
    forward: float
    backward: float
    extra: float  # outside the cells: the step overhead
    # with a process per device, what its costs come to a step (seconds, for the reports: the builds and
    # the messages are inside forward and backward, the rest inside extra)
    parts: Dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.extra


class ReplicaCopy(NamedTuple):
    """A replica's copies for the simulator: ``worker`` runs ``cells`` on a
    replica of ``values`` parameters whose master is on worker ``home``'s
    device; its gradients are sent after its last cell's backward
    (``early``) or after the whole backward pass (``Replicas.send_early``)."""

    worker: int
    home: int
    cells: Tuple[int, ...]
    values: int
    early: bool = True


def replay(cells: Sequence[Cell], num_workers: int, cost: CostModel, same_device: Optional[Sequence[int]] = None,
           cell_seconds=None, copies: Sequence[ReplicaCopy] = ()) -> Tuple[float, float]:
    """Forward and backward makespans of ``cells`` on ``num_workers``
    devices.  ``same_device[w]``: an id per worker; workers with the same
    id share a device (no link).  ``cell_seconds(cell, phase)`` overrides
    the cost model (used for whole-model cells).  ``copies``: the replicas'
    parameter copies (before their first cell) and gradient copies (after
    their last cell's backward), each on the link of its master's device.
    With ``cost.workers == "processes"`` each worker starts its forward
    pass after its own build (:func:`build_delays`) and every message
    between workers costs its sender's and its receiver's host
    (:func:`messages`)."""
    same_device = list(same_device) if same_device is not None else list(range(num_workers))
    seconds = cell_seconds or (lambda cell, phase: cost.seconds(cell.work, phase))
    factor = cost.slowdown if num_workers > 1 else 1.0
    cell_clocks = clocks([CellSpec(cell.worker, cell.inputs, cell.not_before) for cell in cells])
    order = sorted(range(len(cells)), key=lambda i: (cell_clocks[i], i))

    def crosses(a: Cell, b: Cell) -> bool:
        return same_device[a.worker] != same_device[b.worker]

    copies = [copy for copy in copies if same_device[copy.worker] != same_device[copy.home]]

    def copy_seconds(copy: ReplicaCopy) -> float:
        return cost.link_latency + BYTES_PER_VALUE * copy.values / cost.link_bandwidth

    # parameters: queued at the start, one after another out of each master's device
    not_before = [0.0] * len(cells)
    link_free: Dict[int, float] = {}
    for copy in copies:
        source = same_device[copy.home]
        link_free[source] = link_free.get(source, 0.0) + copy_seconds(copy)
        for i in copy.cells:
            not_before[i] = max(not_before[i], link_free[source])

    consumers: List[List[int]] = [[] for _ in cells]
    for i, cell in enumerate(cells):
        for producer, _ in cell.inputs:
            if i not in consumers[producer]:
                consumers[producer].append(i)
    producers = [sorted({producer for producer, _ in cell.inputs}) for cell in cells]
    queued = cost.host_queues and cell_seconds is None
    processes = cost.workers == "processes"
    wire = message_seconds(cells, cost) if processes else {phase: [0.0] * len(cells) for phase in PHASES}
    built = build_delays(cells, num_workers, cost, queued) if processes else [0.0] * num_workers

    def run(sequence: Sequence[int], after: Sequence[Sequence[int]], phase: str, start: Sequence[float],
            worker_start: Sequence[float]) -> List[float]:
        """Each cell's finish when the cells run in ``sequence`` (each
        worker's in that order), each after the cells in ``after[i]``,
        each worker's host (or, unqueued, the worker) from
        ``worker_start``."""
        host_done = (_host_schedule(sequence, after, [cell.worker for cell in cells],
                                    [cost.host_seconds(cell.work, phase) + wire[phase][i]
                                     for i, cell in enumerate(cells)],
                                    cost.host_per_device or processes, worker_start)
                     if queued else None)
        free = [0.0] * num_workers if queued else list(worker_start)
        finish = [0.0] * len(cells)
        for i in sequence:
            cell = cells[i]
            ready = start[i] if host_done is None else max(start[i], host_done[i])
            for j in after[i]:
                ready = max(ready, finish[j] + (cost.transfer(cell.work) if crosses(cells[j], cell) else 0.0))
            work = factor * (cost.device_seconds(cell.work, phase) if queued else seconds(cell, phase))
            finish[i] = max(ready, free[cell.worker]) + work + (0.0 if queued else wire[phase][i])
            free[cell.worker] = finish[i]
        return finish

    forward = max(run(order, producers, "forward", not_before, built), default=0.0)
    done = run(list(reversed(order)), consumers, "backward", [0.0] * len(cells), [0.0] * num_workers)
    backward = max(done, default=0.0)
    # gradients: each sent once its replica's last cell is done (or the
    # whole pass, for replicas that send late), one after another into each
    # master's device
    link_free = {}
    passed = backward
    for sent, copy in sorted((max(done[i] for i in copy.cells) if copy.early else passed, copy) for copy in copies):
        destination = same_device[copy.home]
        link_free[destination] = max(link_free.get(destination, 0.0), sent) + copy_seconds(copy)
        backward = max(backward, link_free[destination])
    return forward, backward


def messages(cells: Sequence[Cell]) -> Dict[str, Tuple[List[int], List[int]]]:
    """Each cell's messages to and from other workers, by phase (sent,
    received), as a stage in a process of its own sends them
    (``runtime/channels.py``, ``OverWire``): forward, an output read on
    another worker goes once to that worker, from the cell that made it,
    and is received by its first reader there; backward, every input a
    cell reads from another worker sends its gradient back (one message
    per input), which the producer receives.  The stages send no gradient
    for a value sent as needing none (a micro-batch's chunk past all of its
    sentences), which the cells do not tell: backward, this is the most
    they send."""
    forward = ([0] * len(cells), [0] * len(cells))
    backward = ([0] * len(cells), [0] * len(cells))
    seen = set()
    for i, cell in enumerate(cells):
        for ref in cell.inputs:
            producer = ref[0]
            if cells[producer].worker == cell.worker:
                continue
            backward[0][i] += 1
            backward[1][producer] += 1
            if (tuple(ref), cell.worker) not in seen:
                seen.add((tuple(ref), cell.worker))
                forward[0][producer] += 1
                forward[1][i] += 1
    return {"forward": forward, "backward": backward}


def message_seconds(cells: Sequence[Cell], cost: CostModel) -> Dict[str, List[float]]:
    """Each cell's host seconds in its messages to and from other workers,
    by phase (:func:`messages`; free in a pass whose messages go without a
    description, ``CostModel.described``)."""
    counted = messages(cells)
    return {phase: [(cost.message_send * sent + cost.message_receive * received) if phase in cost.described else 0.0
                    for sent, received in zip(*counted[phase])] for phase in PHASES}


def build_delays(cells: Sequence[Cell], num_workers: int, cost: CostModel, queued: bool) -> List[float]:
    """Seconds before each worker's first cell for its own build of the
    step, with a process per device: every cell's description and its own
    cells' code (``CostModel.build_*``).  The costs measured with threads
    hold their one build: unqueued (CPU devices) in the time outside the
    cells, which :func:`step_time` takes it out of; queued (a GPU's host),
    spread over every cell's host time, so that a worker's own cells
    already carry their share of it, which is taken off here."""
    count = len(cells)
    whole = cost.build_seconds(count, count)
    delays = []
    for worker in range(num_workers):
        own = sum(1 for cell in cells if cell.worker == worker)
        delays.append(max(0.0, cost.build_seconds(count, own) - (whole * own / count if queued and count else 0.0)))
    return delays


def _host_schedule(sequence: Sequence[int], after: Sequence[Sequence[int]], workers: Sequence[int],
                   host_seconds: Sequence[float], per_device: bool = False,
                   host_start: Optional[Sequence[float]] = None) -> List[float]:
    """When each cell's host part is done, with one host for all workers:
    a worker queues its cells in ``sequence``'s order, each once the cells
    in ``after[i]`` are queued; the host takes, whenever it is free, the
    cell that has been ready longest (the earliest in ``sequence`` among
    equals).  Worker threads on one GIL take turns like this.
    ``per_device``: every worker has a host of its own (a process per
    device), so only a worker's own cells wait for its host, which starts
    at ``host_start[worker]`` (its build)."""
    rank = {cell: position for position, cell in enumerate(sequence)}
    waits_for: List[List[int]] = [list(after[i]) for i in range(len(host_seconds))]
    previous: Dict[int, int] = {}
    for i in sequence:
        if workers[i] in previous:
            waits_for[i].append(previous[workers[i]])
        previous[workers[i]] = i
    unmet = [len(set(waiting)) for waiting in waits_for]
    followers: List[List[int]] = [[] for _ in host_seconds]
    for i, waiting in enumerate(waits_for):
        for j in set(waiting):
            followers[j].append(i)
    ready_at = [0.0] * len(host_seconds)
    done = [0.0] * len(host_seconds)
    heap = [(0.0, rank[i], i) for i in sequence if unmet[i] == 0]
    heapq.heapify(heap)
    host_free: Dict[int, float] = dict(enumerate(host_start)) if per_device and host_start else {}
    while heap:
        ready, _, i = heapq.heappop(heap)
        host = workers[i] if per_device else 0
        done[i] = max(ready, host_free.get(host, 0.0)) + host_seconds[i]
        host_free[host] = done[i]
        for j in followers[i]:
            ready_at[j] = max(ready_at[j], done[i])
            unmet[j] -= 1
            if unmet[j] == 0:
                heapq.heappush(heap, (ready_at[j], rank[j], j))
    return done


def _no_loss(*args):
    raise RuntimeError("simulated cells are never run")


def step_time(model, plan: DevicePlan, net_input, target, cost: CostModel, chunk_length: int = 0,
              physical_devices: Optional[Sequence[int]] = None, transform=None,
              replica_copies: bool = True, micro_batches: int = 1, softmax_chunks: int = 1) -> StepTime:
    """Predicted time of one step of ``model`` under ``plan``.  ``transform``:
    a function of the step's cells returning the cells to replay instead
    (``hybrid`` and ``model`` mode; for what-if analyses of dependencies).
    ``replica_copies=False``: the replicas' parameter and gradient copies
    cost nothing (a what-if: links that never hold up a cell).
    ``micro_batches``, ``softmax_chunks``: as ``--hybrid-micro-batches``
    and ``--hybrid-softmax-chunks`` (hybrid and model mode)."""
    if plan.mode == "data":
        built = build_step(model, plan, net_input, target, _no_loss)
        single = DevicePlan([plan.devices[0]], [0] * len(plan.encoder), [0] * len(plan.decoder), "hybrid")
        shard_cost: Dict[int, Tuple[float, float]] = {}  # by the shard's first row

        def whole_model(cell, phase):
            rows = slice(*cell.work.sizes)
            if rows.start not in shard_cost:
                sub_input = {key: value[rows] for key, value in net_input.items()}
                sub = build_step(model, single, sub_input, target[rows], _no_loss, chunk_length)
                shard_cost[rows.start] = replay(sub.step.cells, 1, cost)
            return shard_cost[rows.start][0 if phase == "forward" else 1]

        copies = replica_copies and _copies(built)
        forward, backward = replay(built.step.cells, plan.size, cost, physical_devices, whole_model, copies or ())
    else:
        built = build_step(model, plan, net_input, target, _no_loss, chunk_length, micro_batches,
                           softmax_chunks=softmax_chunks)
        cells = transform(built.step.cells) if transform is not None else built.step.cells
        copies = replica_copies and _copies(built)
        forward, backward = replay(cells, plan.size, cost, physical_devices, copies=copies or ())
    extra = cost.overhead(plan.size)
    if cost.workers == "processes":
        extra, parts = _process_extra(model, plan, built.step.cells, cost, extra,
                                      queued=cost.host_queues and plan.mode != "data")
        return StepTime(forward, backward, extra, parts)
    return StepTime(forward, backward, extra)


def _process_extra(model, plan: DevicePlan, cells: Sequence[Cell], cost: CostModel, overhead: float,
                   queued: bool) -> Tuple[float, Dict[str, float]]:
    """The time outside a step's passes with a process per device: the
    trainer's two commands, each stage's copy of its gradients for the
    trainer at the end of its backward pass (the attention-softmax's leave
    in the middle of it), and, unqueued, the trainer's time outside the
    cells without the build it no longer makes; with what each costs and
    what the passes hold of it (the largest build, the busiest worker's
    messages) for the reports."""
    from .owned_bytes import gradient_bytes, plan_owned_bytes

    whole = cost.build_seconds(len(cells), len(cells))
    commands = 2 * cost.command_round_trip
    if plan.mode == "data":  # every stage fills the whole model's gradients
        owned = [gradient_bytes(model)] * plan.size
    else:
        owned = plan_owned_bytes(model, plan, attention_softmax=plan.mode != "hybrid")
    copied = max(owned) / cost.copy_bandwidth if cost.copy_bandwidth else 0.0
    wire = [0.0] * plan.size
    for seconds in message_seconds(cells, cost).values():
        for cell, cell_seconds in zip(cells, seconds):
            wire[cell.worker] += cell_seconds
    parts = {"builds (the longest)": max(build_delays(cells, plan.size, cost, queued), default=0.0),
             "messages (the busiest host)": max(wire, default=0.0), "commands": commands, "gradient copy": copied}
    return max(0.0, overhead - (0.0 if queued else whole)) + commands + copied, parts


def _copies(built) -> List[ReplicaCopy]:
    return [ReplicaCopy(use.worker, use.home, use.cells, sum(p.numel() for p in use.replicas.master.parameters()),
                        use.replicas.send_early)
            for use in built.replica_uses]
