"""A hybrid group's batch kept on the host beside fairseq's device copy.

fairseq's ``Trainer._prepare_sample`` moves each batch to ``cuda:0``; a
group makes its step's layout from the batch on the host, and reading it
back from ``cuda:0`` would wait for the GPU (:mod:`fairseq_hybrid.parallel.runtime.host_batch`).
So, for a model with a group, the batch is pinned first (where the
group's devices queue copies), fairseq's move is queued from pinned
memory, and the group is told which host tensor each moved one came
from.  Models without a group are left as fairseq prepares them.
"""

from __future__ import annotations

from typing import Callable

from ..parallel import keep_on_host


def keeping_host_batch(original_prepare: Callable) -> Callable:
    """``Trainer._prepare_sample`` that keeps a group's batch on the host."""

    def _prepare_sample(self, sample, is_dummy=False):
        group = getattr(getattr(self, "_model", None), "hybrid_group", None)
        if group is None or not isinstance(sample, dict) or not sample:
            return original_prepare(self, sample, is_dummy)
        return keep_on_host(sample, group.plan.devices, lambda host: original_prepare(self, host, is_dummy))

    return _prepare_sample
