"""One training step of a ``hybrid_lstm`` model: its batch staged once
(:mod:`.staging`), cut into cells in the plan's mode
(:mod:`.hybrid_cells`, :mod:`.data_parallel_cells`), and run on the
group's workers with its replicas.  A group calls one function whatever
its workers: ``loss_sums`` of :class:`WorkerThreads` here, or of
:class:`.stage_processes.StageProcesses`, which lays each batch out once
(:func:`.step_layout.lay_out_step`) and hands its stages the layout and
:func:`build_step`."""

from __future__ import annotations

from functools import partial
from typing import Callable, Dict, NamedTuple, Optional, Tuple

from torch import Tensor

from .runtime.cell_graph import run_cells
from .runtime.cell_times import DeviceUsage
from .recipe.data_parallel_cells import data_parallel_cells
from .recipe.device_plan import DevicePlan
from .recipe.hybrid_cells import hybrid_cells
from .runtime.replicas import ModelReplicas
from .runtime.shard_sums import sum_on
from .recipe.single_device_masks import SingleDeviceMasks
from .recipe.staging import stage_step
from .recipe.step_layout import StepLayout
from .recipe.step_builder import BuiltStep
from .runtime.worker import DEFAULT_TIMEOUT, worker_group


class StepShape(NamedTuple):
    """How a step is cut (the group's options, or what ``auto`` chose for
    this batch): time chunk length, micro-batches, target chunks per
    attention-softmax cell, single-device dropout masks."""

    chunk_length: int = 0
    micro_batches: int = 1
    softmax_chunks: int = 1
    single_device_masks: bool = False


class WorkerThreads:
    """A group's workers as threads of the trainer's process."""

    def __init__(self, model, plan: DevicePlan, timeout: float = DEFAULT_TIMEOUT,
                 replicas: Optional[ModelReplicas] = None):
        self.model, self.plan, self.timeout = model, plan, timeout
        self.replicas = replicas or ModelReplicas(model)

    def loss_sums(self, net_input: Dict[str, Tensor], target: Tensor, shard_loss, shape: StepShape,
                  report_usage: Optional[Callable[[DeviceUsage], None]] = None) -> Tuple[Tensor, ...]:
        built = build_step(self.model, self.plan, net_input, target, shard_loss, shape.chunk_length,
                           shape.micro_batches, self.replicas, shape.single_device_masks,
                           softmax_chunks=shape.softmax_chunks)
        return run_step(built, self.timeout, report_usage)


def build_step(model, plan: DevicePlan, net_input: Dict[str, Tensor], target: Tensor, shard_loss,
               chunk_length: int = 0, micro_batches: int = 1, replicas: Optional[ModelReplicas] = None,
               single_device_masks: bool = False, masks: Optional[SingleDeviceMasks] = None,
               softmax_chunks: int = 1, worker: Optional[int] = None,
               layout: Optional[StepLayout] = None) -> BuiltStep:
    """The step's cells in the plan's mode.  ``micro_batches``: how many
    (:mod:`.batch_rows`); ``softmax_chunks``: the target chunks one
    attention-softmax cell takes (1: a cell per chunk, which starts as
    soon as the top decoder layer made it; 0: all of them; fewer cells,
    less host time, less overlap); ``replicas``: the group's replica
    caches (fresh ones when not given, as for the planner, which never
    runs the cells); ``masks``: as :func:`.staging.stage_step`'s;
    ``worker``: build only that worker's cells (a stage in a process of its
    own): every cell is still there, with its worker, inputs and outputs,
    so that the orders and messages are the same everywhere, but only that
    worker's can run, and only its part of the batch is staged;
    ``layout``: the batch laid out already (:func:`.step_layout.lay_out_step`:
    by the trainer, for stages in processes of their own), which then
    stands for the batch and the options that cut it."""
    staged = stage_step(model, plan, net_input, target, chunk_length, micro_batches, single_device_masks, masks,
                        softmax_chunks, worker, layout)
    cells = data_parallel_cells if plan.mode == "data" else hybrid_cells
    return cells(model, plan, staged, shard_loss, replicas, worker)


def run_step(built: BuiltStep, timeout: float = DEFAULT_TIMEOUT,
             report_usage: Optional[Callable[[DeviceUsage], None]] = None) -> Tuple[Tensor, ...]:
    """Run the cells; return the shards' results added on the first shard's
    device.  The replicas' parameter copies are queued before the jobs
    start and each worker sends its replica's gradients as soon as its
    last cell on that replica has run backward (:mod:`.replicas`); after
    the backward pass they are added into the master parameters, and
    ``report_usage`` gets how busy each device was."""
    step = built.step
    for use in built.replica_uses:
        use.replicas.prefetch(use.worker, step.devices[use.worker], step)
    sends = [(use.cells, partial(use.replicas.send, use.worker, step.devices[use.worker]))
             for use in built.replica_uses]

    def reduce():
        masters = {id(use.replicas): use.replicas for use in built.replica_uses}
        for key, replicas in masters.items():  # each master's replicas in worker order
            replicas.reduce([use.worker for use in built.replica_uses if id(use.replicas) == key])

    results = run_cells(step.cells, worker_group(step.devices), built.results, after_backward=reduce,
                        timeout=timeout, report_usage=report_usage, after_last_backward=sends,
                        wiring=built.wiring)
    return sum_on(results, results[0][0].device)
