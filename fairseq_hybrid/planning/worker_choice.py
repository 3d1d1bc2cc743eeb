"""``--hybrid-workers auto``: the workers whose step the simulator prices
shorter for the batch at hand, each priced as built (a cost file's
``cost_model`` for worker threads, its ``processes_cost_model`` for a
process per device); threads where there is no price for processes."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from .schedule_simulator import CostModel, step_time


def priced_workers(model, plan, net_input, target, threads: Optional[CostModel], processes: Optional[CostModel],
                   chunk_length: int = 0, micro_batches: int = 1, softmax_chunks: int = 1
                   ) -> Tuple[str, Dict[str, float]]:
    """The workers ``auto`` takes for this step's shape and the seconds it
    priced each at (none without both cost models: threads)."""
    if threads is None or processes is None:
        return "threads", {}
    prices = {workers: step_time(model, plan, net_input, target, cost, chunk_length, micro_batches=micro_batches,
                                 softmax_chunks=softmax_chunks).total
              for workers, cost in (("threads", threads), ("processes", processes))}
    return ("processes" if prices["processes"] < prices["threads"] else "threads"), prices
