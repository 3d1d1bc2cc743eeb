"""The engine: one training step of a ``hybrid_lstm`` model run as cells on
the group's devices.

Laid out as torchgpipe's, one room a folder: ``recipe/``, how a hybrid
step is cut (the device plan, the rows of a step decided and cut, the
batch staged once, the cell builders, the data-parallel step);
``runtime/``, how any worker runs any cells (the wavefront and one cell
graph with the channel to the other workers injected, worker threads and
their state, the stream hand-off, replicas, seeded dropout); and
``processes/``, a process per device (the stage, the trainer's side, the
wires: pipes on host memory, torch.distributed between GPUs).  The
runtime never imports a recipe: :mod:`.step` ties the two together and
hands a stage its builder.  ``tests/test_import_structure.py`` places
every module in a room.

This face is what the rest of the package uses of it: the group
(:mod:`fairseq_hybrid.hybrid_group`) to run a step, the planner
(:mod:`fairseq_hybrid.planning`) to replay the very cells a step is made
of, the model its seeded dropout, fairseq's patches the batch kept on the
host and the options' errors, the timing of a process per device the two
wires.  None of them reaches into the modules behind
it (``tests/test_import_structure.py``); the test harness alone hooks
into the workers' thread state and streams.
"""

from .recipe.batch_rows import batch_slices, softmax_groups, time_chunks
from .runtime.cell_graph import Cell, Work
from .runtime.cell_times import CellTime, DeviceUsage, labelled_cells, record_cell_times
from .recipe.device_plan import (AUTO, MODES, DevicePlan, DevicePlanError, build_plan, check_options, chunk_length_option,
                          default_placement, micro_batches_option, parse_devices, parse_placement,
                          placement_text, plan_table, softmax_chunks_option)
from .runtime.host_batch import host_of, keep_on_host, on_host
from .runtime.replicas import ModelReplicas
from .runtime.seeded_dropout import SeededDropout
from .processes.gpu_wire import GpuWire
from .processes.host_wire import HostWire, wire_ends
from .processes.stage import watch_parent
from .processes.stage_processes import StageProcesses
from .recipe.single_device_masks import draw_single_device_masks
from .recipe.step_layout import lay_out_step
from .step import StepShape, WorkerThreads, build_step, run_step
from .runtime.thread_state import step_scope
from .runtime.wavefront import CellSpec, clocks
from .runtime.worker import DEFAULT_TIMEOUT

__all__ = [
    "AUTO", "Cell", "CellSpec", "CellTime", "DEFAULT_TIMEOUT", "DevicePlan", "DevicePlanError", "DeviceUsage",
    "GpuWire", "HostWire", "MODES", "ModelReplicas", "SeededDropout", "StageProcesses", "StepShape", "Work", "WorkerThreads", "batch_slices", "build_plan", "build_step",
    "check_options", "chunk_length_option", "draw_single_device_masks", "clocks", "default_placement", "host_of", "keep_on_host",
    "labelled_cells", "lay_out_step", "micro_batches_option", "on_host", "parse_devices", "parse_placement", "placement_text",
    "plan_table", "record_cell_times", "run_step", "softmax_chunks_option", "softmax_groups", "step_scope",
    "time_chunks", "watch_parent", "wire_ends",
]
