"""Adding the shards' results back: the data-parallel halves of the scheme
(the attention-softmax part in ``hybrid`` mode, the whole model in
``data`` mode) run one batch shard per device (:mod:`.batch_rows` says
which rows), and their results are sums (losses, token counts), so adding
them on one device gives the single-device value.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import torch
from torch import Tensor

from .stream_handoff import arrive


def sum_on(results: Sequence[Tuple[Tensor, ...]], device: torch.device) -> Tuple[Tensor, ...]:
    """Element-wise sum of the shards' result tuples, on ``device``."""
    total = [arrive(value, device) for value in results[0]]
    for result in results[1:]:
        total = [acc + arrive(value, device) for acc, value in zip(total, result)]
    return tuple(total)
