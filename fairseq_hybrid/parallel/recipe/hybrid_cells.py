"""The cells of one ``hybrid`` or ``model`` step (see docs/design.md for
the schedule drawn out), each on the device of the plan that owns its
parameters:

* source embedding (with encoder layer 0);
* each bidirectional encoder layer as two whole-sequence cells, the forward
  direction on the layer's device and the reverse direction on the next
  device (a reverse direction needs the whole input, so these layers sit at
  the bottom);
* each unidirectional encoder layer as one cell per time chunk, carrying
  ``(h, c)`` from chunk to chunk; the encoder runs with rows sorted by
  source length so the sentences still running in a chunk are a prefix;
* the top encoder states put back in batch order and cut into batch shards;
* target embedding (with decoder layer 0) and each decoder layer as one cell
  per time chunk; chunk 0 of decoder layer ``l`` starts from the final state
  of encoder layer ``l``, so it runs as soon as that layer is done;
* one attention-softmax cell per batch shard (``hybrid``: every device;
  ``model``: one shard on the top decoder layer's device) and time chunk,
  or group of consecutive chunks (``--hybrid-softmax-chunks``), each with
  its device's replica of the attention-softmax parameters, ending in the
  criterion's summed loss.

Every cell computes what the single-device model computes for its piece,
so the step's loss and gradients equal the single-device ones.  The cells
read the batch as :mod:`.staging` put it on their devices.

The list of cells is the shape's skeleton (:mod:`.step_skeleton`, listed
once per shape); each cell's code is made by its kind
(:mod:`.cell_kinds`), for the worker that runs it only.
"""

from __future__ import annotations

from typing import Optional

from ...kernels.fused_output_loss import GradientSink
from ..runtime.cell_graph import Cell
from .cell_kinds import Making
from .device_plan import DevicePlan
from ..runtime.replicas import ModelReplicas
from .staging import StagedBatch, StagedStep
from .step_builder import BuiltStep, ReplicaUse, StepBuilder
from .step_skeleton import BatchShape, UseShape, skeleton_of


def batch_shape(batch: StagedBatch) -> BatchShape:
    """What a staged micro-batch's cells depend on (:class:`.step_skeleton.BatchShape`)."""
    return BatchShape(batch.index, len(batch.source_chunks), len(batch.target_chunks), tuple(batch.shard_workers),
                      tuple(tuple(group) for group in batch.softmax_groups))


def hybrid_cells(model, plan: DevicePlan, staged: StagedStep, shard_loss,
                 replicas: Optional[ModelReplicas] = None, only: Optional[int] = None) -> BuiltStep:
    """The cells of one ``hybrid`` or ``model`` step: its shape's skeleton,
    with the code of every cell (``only``: of that worker's cells; the
    others' are listed without it, :class:`.step_builder.StepBuilder`).
    ``replicas``: the group's replica caches (fresh ones when not given,
    as for the schedule simulator, which never runs the cells)."""
    step = StepBuilder(model, plan, replicas or ModelReplicas(model), only)
    skeleton = skeleton_of(model, plan, [batch_shape(batch) for batch in staged.micro_batches])
    # each device's attention-softmax cells, of every micro-batch and time chunk, sum their output layer's
    # gradient into one matrix instead of keeping one each from forward to backward
    making = Making.of(step, shard_loss, {worker: GradientSink() for worker in range(plan.size)
                                          if step.builds(worker)})
    names = [batch.name for batch in staged.micro_batches]
    if any(names):  # micro-batches: each cell's name starts with its micro-batch's rows
        step.cells = [cell._replace(name=names[entry.batch] + cell.name)
                      for cell, entry in zip(skeleton.bare, skeleton.entries)]
    else:
        step.cells = list(skeleton.bare)
    for worker in range(plan.size) if only is None else (only,):
        for index in skeleton.by_worker[worker]:
            entry = skeleton.entries[index]
            run, work = entry.kind.make(making, staged.micro_batches[entry.batch])
            step.cells[index] = Cell(step.cells[index].name, entry.worker, entry.inputs, run, work, entry.outputs,
                                     entry.not_before)

    found = {}

    def use(shape: UseShape) -> ReplicaUse:
        replicas = found.get(shape.key)
        if replicas is None:
            replicas = found[shape.key] = step.replicas.attention_softmax() if shape.key[0] == "attention_softmax" \
                else step.replicas.direction(*shape.key[1:])
        return ReplicaUse(replicas, shape.worker, shape.cells, shape.home)

    def output_shapes(index: int):
        entry = skeleton.entries[index]
        return entry.kind.output_shapes(making, staged.micro_batches[entry.batch])

    return BuiltStep(step, list(skeleton.results), tuple(use(shape) for shape in skeleton.replica_uses),
                     tuple(use(shape) for shape in skeleton.master_uses), skeleton.wiring, output_shapes)
