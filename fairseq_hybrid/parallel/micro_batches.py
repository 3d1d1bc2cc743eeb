"""Micro-batches: a batch's sentences cut into slices that follow one
another through the devices, in the spirit of torchgpipe's
``microbatch.py`` (``--hybrid-micro-batches``).

A slice is contiguous rows with near-equal tokens (source and target,
padding not counted: fairseq's batches hold sentences of similar length,
so near-equal rows would be near-equal work too, but not always), as
:func:`.batch_rows.micro_batch_rows` cuts them; this module cuts the
batch's tensors and the dropout masks by those rows.  Each
micro-batch is its own chain of cells in one step (:mod:`.step_cells`);
their loss sums add up to the batch's.  With the single-device model's
dropout masks, each micro-batch takes its rows of the masks drawn for the
whole batch, so the step is the same whatever the count.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .batch_rows import PieceRows
from .single_device_masks import SingleDeviceMasks

__all__ = ["MicroBatch", "micro_batches_of"]


class MicroBatch(NamedTuple):
    index: int
    net_input: Dict[str, Tensor]
    target: Tensor
    masks: Optional[SingleDeviceMasks]
    name: str  # "" for the whole batch, else "micro-batch FIRST-LAST: " (rows)
    shards: List[Tuple[int, slice]]  # its attention-softmax shards: (worker, rows of the micro-batch)


def micro_batches_of(net_input: Dict[str, Tensor], target: Tensor, masks: Optional[SingleDeviceMasks],
                     pieces: Sequence[PieceRows]) -> Iterator[MicroBatch]:
    """The batch's micro-batches in order (``pieces``: where the step's rows
    go, :func:`.batch_rows.step_rows`), each with its rows of the batch,
    of its target and of the masks."""
    for index, (rows, shards) in enumerate(pieces):
        if rows is None:
            yield MicroBatch(index, net_input, target, masks, "", shards)
            continue
        yield MicroBatch(index, {key: value[rows] if torch.is_tensor(value) else value
                                 for key, value in net_input.items()},
                         target[rows], None if masks is None else masks.rows(rows),
                         f"micro-batch {rows.start}-{rows.stop - 1}: ", shards)
