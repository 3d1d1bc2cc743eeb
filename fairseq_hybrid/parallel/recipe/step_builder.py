"""What every step builder shares: the cells collected in order, the
names their readers refer to them by, and the replicas they use.

Every cell names its outputs (``"h"``, ``"c"``, ``"chunk 2"``,
``"shard 1"``) and its readers refer to them by name
(:meth:`StepBuilder.ref`; a ``hybrid`` step's are listed by
:mod:`.step_skeleton`, once per shape).
"""

from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..runtime.cell_graph import Cell, Work
from .device_plan import DevicePlan
from ..runtime.replicas import ModelReplicas, Replicas
from ..runtime.wavefront import Ref
from ..runtime.wiring import Wiring


def chunk_names(count: int) -> List[str]:
    return [f"chunk {c}" for c in range(count)]


def shard_names(count: int) -> List[str]:
    return [f"shard {k}" for k in range(count)]


class StepBuilder:
    """Collects the cells of one step; ``add`` returns the new cell's index
    and ``ref`` names one of its outputs for the cells that read it.
    ``only``: the one worker whose cells can run (the others' are listed
    without their ``run`` and ``work``); None: every worker's."""

    def __init__(self, model, plan: DevicePlan, replicas: ModelReplicas, only: Optional[int] = None):
        self.model = model
        self.only = only
        self.plan = plan
        self.replicas = replicas
        self.devices = plan.devices
        self.cells: List[Cell] = []

    def add(self, name: str, worker: int, inputs: Sequence[Ref], run: Callable[..., Sequence[Tensor]],
            work: Optional[Work] = None, outputs: Optional[Sequence[str]] = None) -> int:
        mine = self.builds(worker)
        self.cells.append(Cell(name, worker, list(inputs), run if mine else None,
                               work if mine else None, tuple(outputs) if outputs else None))
        return len(self.cells) - 1

    def builds(self, worker: int) -> bool:
        return self.only is None or worker == self.only

    def ref(self, cell: int, output: str) -> Ref:
        return named_ref(cell, self.cells[cell].name, self.cells[cell].outputs, output)


def named_ref(cell: int, name: str, names: Optional[Sequence[str]], output: str) -> Ref:
    """Output ``output`` of cell number ``cell`` (``name``, whose outputs are ``names``)."""
    try:
        return cell, names.index(output)
    except (AttributeError, ValueError):  # no names, or not this one
        raise KeyError(f"cell {name!r} has no output {output!r} (it has {names})") from None


def join(parts: Sequence[Tensor], chunked: bool = False) -> Tensor:
    return torch.cat(list(parts), dim=1 if chunked else -1) if len(parts) > 1 else parts[0]


class ReplicaUse(NamedTuple):
    """The cells of one worker that run on its replica of a part; ``home``:
    the worker whose device holds the part's master (where its parameters
    come from and its gradients go)."""

    replicas: Replicas
    worker: int
    cells: Tuple[int, ...]
    home: int


class BuiltStep(NamedTuple):
    step: StepBuilder
    results: List[int]  # the cells whose outputs are the shards' loss sums
    # every replica the step uses, in the order of their first cells: of
    # the attention-softmax part on the shard workers other than its
    # master's, of reverse directions of bidirectional layers on the
    # device the placement gives them, of the whole model (data mode) on
    # workers other than the first
    replica_uses: Tuple[ReplicaUse, ...] = ()
    # the master's own worker's cells on a replicated part (the attention-softmax), whose gradients are
    # complete after the last of them: a stage in a process of its own hands them over then
    master_uses: Tuple[ReplicaUse, ...] = ()
    # the cells' orders, readers and routes, kept with their shape's skeleton (None: the graph makes them)
    wiring: Optional[Wiring] = None
    # a cell's outputs' shapes from the layout alone, by cell (None: not declared; a stage on the GPU wire
    # then describes each message it sends)
    output_shapes: Optional[Callable[[int], Optional[Tuple[Tuple[int, ...], ...]]]] = None


def replica_uses(replicas: Replicas, cells: Dict[int, List[int]], home: int) -> List[ReplicaUse]:
    return [ReplicaUse(replicas, worker, tuple(indices), home) for worker, indices in sorted(cells.items())]
