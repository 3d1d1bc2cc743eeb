"""What a process per device (``--hybrid-workers processes``) costs beyond
its cells, measured on the machine at hand, so that the schedule
simulator prices that runtime as it is built (docs/processes.md, "Priced
as built"):

* a stage's build of the step: every stage builds every cell's
  description (the orders and messages are the same everywhere) and its
  own cells' code, fitted as seconds per build, per cell of the step and
  per cell of its own (threads build the step once, all cells their own);
* a message between two stages: the sender's and the receiver's host
  seconds, on the host wire (pipes: CPU devices; a GPU stage's forward
  message is its header through the same pipes and an NCCL transfer, whose
  own call is not in it: it needs a GPU) and as a gloo header (how GPU
  stages sent their headers before);
* a command's round trip between the trainer and an idle stage: the batch
  pickled out, a small reply back (two a step: forward and backward);
* the bytes per second of a stage's copy of its gradients into the
  buffers it shares with the trainer.

``benchmarks/bench_worker_costs.py`` writes them for the GPU forecasts
(``forecasts/worker_costs.json``); ``fairseq-hybrid-plan calibrate`` and
``--measure`` measure them beside the CPU devices' cost model.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import pickle
import statistics
import time
import timeit
from typing import Dict, List, Sequence

import torch

__all__ = ["build_costs", "wire_costs", "copy_bandwidth", "worker_costs"]

MESSAGES = 40  # a measurement's messages: all of them fit in a pipe at once (64 KiB), so none waits
MESSAGE_VALUES = 256
ROUND_TRIPS = 50


def build_costs(model, layers: Sequence[int], samples: Sequence, groups: Sequence[int] = (2, 4),
                chunk_lengths: Sequence[int] = (0, 4), repeats: int = 10) -> Dict[str, float]:
    """A build's seconds (``model`` of ``layers``, encoder and decoder) fitted as ``fixed + per_cell * cells + per_own_cell
    * own cells`` by least squares over the whole step's build and each
    worker's own, for groups of ``groups`` CPU devices at ``chunk_lengths``
    (medians of ``repeats`` builds of each of ``samples``)."""
    from ..parallel import build_plan, build_step

    rows: List[List[float]] = []
    seconds: List[float] = []
    encoder_layers, decoder_layers = layers
    for k in [k for k in groups if k <= min(layers)]:
        plan = build_plan(",".join(["cpu"] * k), "", "hybrid", encoder_layers, decoder_layers)
        for chunk_length in chunk_lengths:
            for worker in [None] + list(range(k)):
                for sample in samples:
                    args = (model, plan, sample["net_input"], sample["target"], None, chunk_length)
                    built = build_step(*args, worker=worker)
                    cells = len(built.step.cells)
                    own = cells if worker is None else sum(1 for cell in built.step.cells if cell.worker == worker)
                    times = [timeit.timeit(lambda: build_step(*args, worker=worker), number=1)
                             for _ in range(repeats)]
                    rows.append([1.0, cells, own])
                    seconds.append(statistics.median(times))
    solution = torch.linalg.lstsq(torch.tensor(rows, dtype=torch.float64),
                                  torch.tensor(seconds, dtype=torch.float64).unsqueeze(1)).solution.squeeze(1)
    fixed, per_cell, per_own_cell = (max(0.0, float(value)) for value in solution)
    return {"build_fixed": fixed, "build_per_cell": per_cell, "build_per_own_cell": per_own_cell,
            "build_samples": len(seconds)}


def _peer(kind: str, ends, commands, parent: int) -> None:
    """The other stage of :func:`wire_costs`: on the host wire, receives
    the messages once they are all written, timing its receives; on gloo,
    sends each header back as it comes (gloo's send completes only once
    it is received); then answers commands.  It ends with the process
    that measures, however that one ends."""
    from ..parallel import watch_parent

    watch_parent(parent)
    wire = _wire(kind, 1, ends)
    keys = list(range(MESSAGES))
    wire.expect(0, keys)
    if kind == "host":
        commands.recv_bytes()  # every message is written
        receives = []
        for key in keys:
            start = time.perf_counter()
            wire.take(0, key)
            receives.append(time.perf_counter() - start)
        commands.send_bytes(pickle.dumps(statistics.median(receives)))
    else:
        for key in keys:
            wire.take(0, key)
            wire.send(0, None)
        wire.flush()
    while True:
        message = commands.recv_bytes()
        if message == b"end":
            break
        commands.send_bytes(pickle.dumps({"ok": len(message)}))
    wire.close()


def _wire(kind: str, rank: int, ends):
    if kind == "host":
        from ..parallel import HostWire

        return HostWire(rank, *ends[rank])
    import torch.distributed as dist

    from ..parallel import GpuWire

    store = dist.TCPStore("127.0.0.1", ends, 2, rank == 0, timeout=datetime.timedelta(seconds=60))
    return GpuWire(rank, 2, store, torch.device("cpu"), 60.0)


def wire_costs(kind: str = "host", command_bytes: int = 0) -> Dict[str, float]:
    """Between this process and a forked one on this machine: the host
    seconds a message costs its sender and its receiver (``host``: the host
    wire's pipes, a tensor of 256 values, each end timed alone, the
    median message; ``gloo header``: a header alone over gloo, as GPU stages sent one before each
    NCCL transfer until their headers went through the pipes, a quarter of a header's median round
    trip at each end), and
    a command's round trip of ``command_bytes`` out and a small reply back
    (median of 50)."""
    context = multiprocessing.get_context("fork")
    if kind == "host":
        from ..parallel import wire_ends

        ends = wire_ends(context, 2)
    else:
        from .ddp_rank import free_port

        ends = free_port()  # for the stages' store
    mine, theirs = context.Pipe()
    peer = context.Process(target=_peer, args=(kind, ends, theirs, os.getpid()), daemon=True)
    peer.start()
    try:
        wire = _wire(kind, 0, ends)
        if kind == "host":
            tensor = torch.ones(MESSAGE_VALUES)
            sends = []
            for _ in range(MESSAGES):
                start = time.perf_counter()
                wire.send(1, tensor)
                sends.append(time.perf_counter() - start)
            send = statistics.median(sends)
            wire.flush()
            mine.send_bytes(b"go")
            receive = pickle.loads(mine.recv_bytes())
        else:  # a header there and back: half of it at each end
            wire.expect(1, list(range(MESSAGES)))
            trips = []
            for key in range(MESSAGES):
                start = time.perf_counter()
                wire.send(1, None)
                wire.take(1, key)
                trips.append(time.perf_counter() - start)
            send = receive = statistics.median(trips) / 4
            wire.flush()
        command = b"x" * max(1, command_bytes)
        trips = []
        for _ in range(ROUND_TRIPS):
            start = time.perf_counter()
            mine.send_bytes(command)
            pickle.loads(mine.recv_bytes())
            trips.append(time.perf_counter() - start)
        mine.send_bytes(b"end")
        peer.join(10)
        wire.close()
        return {"message_send": send, "message_receive": receive, "command_round_trip": statistics.median(trips)}
    finally:
        if peer.is_alive():
            peer.kill()
            peer.join()


def copy_bandwidth(nbytes: int = 64 << 20, repeats: int = 5) -> float:
    """Bytes per second of a copy between two host tensors of ``nbytes``
    (the best of ``repeats``: another tenant only ever slows one)."""
    source = torch.ones(nbytes // 4)
    target = torch.empty_like(source)
    best = min(timeit.timeit(lambda: target.copy_(source), number=1) for _ in range(repeats))
    return nbytes / best


def worker_costs(model, layers: Sequence[int], samples: Sequence, command_bytes: int = 0) -> Dict[str, float]:
    """Everything above for ``model``'s builds on ``samples`` and the host
    wire: what :class:`~..planning.schedule_simulator.CostModel`'s
    processes fields take."""
    wire = wire_costs("host", command_bytes)
    return {**build_costs(model, layers, samples), **wire, "copy_bandwidth": copy_bandwidth()}
