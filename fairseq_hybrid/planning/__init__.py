"""The planner: how a group should run, decided before and between steps
by replaying the engine's own cells in a schedule simulator.  The group
(:mod:`fairseq_hybrid.hybrid_group`) asks it for a placement
(``--hybrid-placement auto``) and, per batch shape, a chunk length,
micro-batches and attention-softmax chunks (``auto``), and at the first
batch its workers (``--hybrid-workers auto``); the GPU forecasts
(:mod:`fairseq_hybrid.forecasts`) price with its simulator.  It uses only
the engine's face (:mod:`fairseq_hybrid.parallel`)."""

from .chunk_choice import ChunkLengthChooser
from .placement_search import auto_placement
from .schedule_simulator import CostModel
from .worker_choice import priced_workers

__all__ = ["ChunkLengthChooser", "CostModel", "auto_placement", "priced_workers"]
