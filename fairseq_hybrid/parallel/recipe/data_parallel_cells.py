"""``data`` mode inside one process: one whole-model cell per device, each
on its batch shard, the replicas' gradients added into the first
device's master parameters."""

from __future__ import annotations

from typing import Optional

from ..runtime.cell_graph import Work
from .device_plan import DevicePlan
from ..runtime.replicas import ModelReplicas
from .single_device_masks import with_masks
from .staging import StagedStep
from .step_builder import BuiltStep, StepBuilder, replica_uses


def data_parallel_cells(model, plan: DevicePlan, staged: StagedStep, shard_loss,
                        replicas: Optional[ModelReplicas] = None, only: Optional[int] = None) -> BuiltStep:
    """Pure data parallelism inside one process: a whole-model replica per
    device, each on its batch shard as :mod:`.staging` put it there
    (``only``: :class:`.step_builder.StepBuilder`'s)."""
    step = StepBuilder(model, plan, replicas or ModelReplicas(model), only)
    whole_models = step.replicas.whole_model()
    outputs = []
    for shard in staged.shards:
        worker, device = shard.worker, plan.devices[shard.worker]

        def run_shard(worker=worker, device=device, shard=shard):
            replica = model if worker == 0 else whole_models.on(worker, device, step)
            rnn_out = replica.forward_rnn(**shard.net_input)
            part = replica.decoder.attention_softmax
            features, _ = part.features(*rnn_out)
            return shard_loss(features, part.output_weight, part.output_bias, shard.target, shard.kept)

        work = Work("whole_model", shard.rows.stop - shard.rows.start, (shard.rows.start, shard.rows.stop))
        outputs.append(step.add(f"whole-model shard {worker}", worker, [], with_masks(shard.masks, run_shard), work))
    return BuiltStep(step, outputs, tuple(replica_uses(whole_models, {worker: [outputs[worker]]
                                                                     for worker in range(1, len(outputs))}, 0)),
                     tuple(replica_uses(whole_models, {0: [outputs[0]]}, 0)))
