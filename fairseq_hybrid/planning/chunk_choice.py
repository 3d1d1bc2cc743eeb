"""``--hybrid-chunk-length auto`` and ``--hybrid-micro-batches auto``: for
each batch shape, the chunk length and the count of micro-batches whose
simulated step is shortest.

More time chunks per sequence shorten the wavefront's fill and drain (with
C chunks on K stages the recurrent part cannot beat ``KC / (C + K - 1)``),
but every chunk is a cell of each layer, and every cell costs host time
(op dispatch, the engine's hand-offs), which on a GPU is a floor under the
cell however little arithmetic it holds.  Which length wins depends on the
batch's shape and on the machine, so the group asks the schedule simulator
(:func:`.schedule_simulator.step_time`, the engine's own cells replayed)
for each new shape, under the cost model of ``--hybrid-cost-model`` (cell
times measured on the user's devices by ``benchmarks/simulate_schedule.py
--json``) or :func:`default_cost_model` (one for CPU devices, one for the
rest), and keeps the answer.  Every chunk
length computes the same loss and gradients (a layer's chunks chained
give the whole layer), so the choice changes speed only.  Micro-batches
are weighed the same way (:data:`MICRO_BATCH_COUNTS`): more of them fill
the pipeline better but make more, smaller cells, each paying its host
time and, on a GPU, a lower throughput; every count computes the same step.
So is ``--hybrid-softmax-chunks auto`` (:data:`SOFTMAX_CHUNK_COUNTS`): an
attention-softmax cell per time chunk starts as soon as the decoder has
made its chunk, one over several chunks costs fewer host calls but starts
later.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import replace
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ..parallel import AUTO, DevicePlan, host_of, on_host, softmax_groups, time_chunks
from .schedule_simulator import CostModel, step_time

logger = logging.getLogger(__name__)

CANDIDATE_LENGTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
MICRO_BATCH_COUNTS = (1, 2, 4, 8)
SOFTMAX_CHUNK_COUNTS = (1, 2, 4, 0)  # 0: all of a micro-batch's chunks in one cell a shard
# Shapes whose sentence counts and widths round up to the same multiples share a choice, made on the first
# batch of them: fairseq's batches by tokens come in hundreds of exact shapes an epoch (about three times
# fewer buckets on the Tatoeba training split), and each new one costs a simulation of the candidates
# on the main thread while the devices wait (tenths of a second for hybrid_lstm_base on 2 devices, more for
# larger models and groups); a neighbouring shape's best is within a fraction of a percent of its own
SENTENCE_BUCKET = 8
WIDTH_BUCKET = 4

HOST_SECONDS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_seconds_per_cell.json")


def measured_host_seconds() -> Dict[str, float]:
    """Host seconds per cell call, by cell kind and phase, as measured on
    CPU (the file says where and how)."""
    with open(HOST_SECONDS_FILE) as file:
        return {kind: float(seconds) for kind, seconds in json.load(file)["seconds"].items()}


CPU_COST_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_cost_model.json")


def default_cost_model(devices: Sequence[torch.device] = ()) -> CostModel:
    """Without ``--hybrid-cost-model``.  On CPU devices: a cost model fitted
    to cell times measured on a CPU (the file says where): there a cell
    pays a time per LSTM time step and a fixed cost far above its op
    dispatch, so more, smaller cells rarely pay.  Elsewhere: every
    floating-point operation costs the same (the simulator's default rate)
    plus the measured host time of each cell call; without the host time
    the finest chunks would always win.  A cost model measured on the
    user's own devices is better still."""
    if devices and all(torch.device(device).type == "cpu" for device in devices):
        return CostModel.load(CPU_COST_FILE)
    return CostModel(fixed=measured_host_seconds(),
                     note="floating-point operations plus the engine's host time per cell measured on CPU")


def candidate_lengths(source_width: int, target_width: int) -> List[int]:
    """0 (one chunk per device), every candidate shorter than the longer
    side, and the longer side itself (one chunk a layer: no wavefront)."""
    longest = max(source_width, target_width, 1)
    return [0] + [length for length in CANDIDATE_LENGTHS if length < longest] + [longest]


def _rounded_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class ChunkLengthChooser:
    """The chunk length and count of micro-batches of each batch shape,
    chosen once per shape among the candidates of what is ``auto`` (the
    other is fixed)."""

    def __init__(self, model, plan: DevicePlan, cost: Optional[CostModel] = None,
                 micro_batches: Union[int, str] = 1, chunk_length: Union[int, str] = AUTO,
                 softmax_chunks: Union[int, str] = 1):
        self.model = model
        self.plan = plan
        self.micro_batches = micro_batches
        self.chunk_length = chunk_length
        self.softmax_chunks = softmax_chunks
        self.cost = cost or default_cost_model(plan.devices)
        self.choices: Dict[Tuple[int, int, int], Tuple[int, int, int]] = {}

    @staticmethod
    def shape(net_input: Dict[str, Tensor]) -> Tuple[int, int, int]:
        sentences, source_width = net_input["src_tokens"].shape
        target_width = net_input["prev_output_tokens"].size(1)
        return (_rounded_up(sentences, SENTENCE_BUCKET), _rounded_up(source_width, WIDTH_BUCKET),
                _rounded_up(target_width, WIDTH_BUCKET))

    def __call__(self, net_input: Dict[str, Tensor], target: Tensor) -> Tuple[int, int, int]:
        """``(chunk length, micro-batches, softmax chunks)`` for this batch's shape."""
        key = self.shape(net_input)
        if key not in self.choices:
            self.choices[key] = self.choose(net_input, target)
        return self.choices[key]

    def lengths(self, net_input: Dict[str, Tensor]) -> List[int]:
        """The chunk lengths to try for this batch (the fixed one unless auto)."""
        return (candidate_lengths(net_input["src_tokens"].size(1), net_input["prev_output_tokens"].size(1))
                if self.chunk_length == AUTO else [self.chunk_length])

    def counts(self, net_input: Dict[str, Tensor]) -> List[int]:
        """The counts of micro-batches to try, fewest first (never more than
        the batch's sentences; the fixed one unless auto)."""
        sentences = net_input["src_tokens"].size(0)
        return ([count for count in MICRO_BATCH_COUNTS if count <= sentences]
                if self.micro_batches == AUTO else [self.micro_batches])

    def spans(self) -> List[int]:
        """The ``--hybrid-softmax-chunks`` to try (the fixed one unless auto)."""
        return list(SOFTMAX_CHUNK_COUNTS) if self.softmax_chunks == AUTO else [self.softmax_chunks]

    def predicted_seconds(self, net_input: Dict[str, Tensor], target: Tensor,
                          stop_early: bool = False) -> Dict[Tuple[int, int, int], float]:
        """The simulated step of every candidate ``(length, micro-batches,
        softmax chunks)``,
        built on a host copy of the batch for the group's placement on host
        devices: the simulator reads only the cells' shapes, and a step
        built on the group's devices would copy the batch's pieces to each
        of them and, on GPUs, wait for the devices (the lengths and the
        counted target positions are read on the host) once per candidate
        and micro-batch; this way a new shape costs one copy of its batch.

        ``stop_early``: counts of micro-batches are tried from the fewest up
        and the search stops once two counts in a row are no faster than the
        best before them.  More micro-batches shrink the pipeline's fill and
        drain (``(K - 1) / (M + K - 1)``) while every one adds its cells'
        fixed costs and, on a GPU, smaller cells run at a lower throughput,
        so past the best count the step mostly grows; one count that is no
        faster is not enough to stop (with one chunk a layer, four
        micro-batches can beat one where two do not).  The largest count
        costs the most to simulate (its cells grow with it): where
        micro-batches do not pay (CPU devices), a new shape then costs
        about half the simulation."""
        host_input = on_host(net_input)
        host_target = host_of(target)
        host_plan = replace(self.plan, devices=[torch.device("cpu")] * self.plan.size)
        times: Dict[Tuple[int, int, int], float] = {}
        lengths, spans = self.lengths(net_input), self.spans()
        best, worse = None, 0
        for count in self.counts(net_input):
            for length in lengths:
                for span in spans:
                    times[length, count, span] = step_time(self.model, host_plan, host_input, host_target,
                                                           self.cost, length, micro_batches=count,
                                                           softmax_chunks=span).total
            fastest = min(times[length, count, span] for length in lengths for span in spans)
            if best is None or fastest < best:
                best, worse = fastest, 0
            else:
                worse += 1
                if stop_early and worse == 2:
                    break
        return times

    def choose(self, net_input: Dict[str, Tensor], target: Tensor) -> Tuple[int, int, int]:
        """The fastest candidate; between near-equal ones (within 0.1%),
        the one with the fewest cells (the least host work), chunk length 0,
        one micro-batch and one chunk an attention-softmax cell first."""
        times = self.predicted_seconds(net_input, target, stop_early=True)
        widths = (net_input["src_tokens"].size(1), net_input["prev_output_tokens"].size(1))

        def cells(choice: Tuple[int, int, int]) -> int:
            length, count, span = choice
            chunks = [len(time_chunks(width, length, self.plan.size)) for width in widths]
            return count * (sum(chunks) + len(softmax_groups(chunks[1], span)))

        best_time = min(times.values())
        near = [choice for choice, seconds in times.items() if seconds <= best_time * 1.001]
        chosen = min(near, key=lambda choice: (cells(choice), choice[0] != 0, choice[0], choice[1], choice[2] != 1))
        logger.debug("auto: %s -> chunk length %d, %d micro-batch(es), %d softmax chunk(s) (predicted %.2f ms; %s)",
                     self.shape(net_input), *chosen, times[chosen] * 1000,
                     ", ".join(f"{k}: {v * 1000:.2f}" for k, v in times.items()))
        return chosen
