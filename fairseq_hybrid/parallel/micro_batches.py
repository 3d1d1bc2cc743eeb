"""Micro-batches: a batch's sentences cut into slices that follow one
another through the devices, in the spirit of torchgpipe's
``microbatch.py`` (``--hybrid-micro-batches``).

A slice is contiguous rows with near-equal tokens (source and target,
padding not counted: fairseq's batches hold sentences of similar length,
so near-equal rows would be near-equal work too, but not always).  Each
micro-batch is its own chain of cells in one step (:mod:`.step_cells`);
their loss sums add up to the batch's.  With the single-device model's
dropout masks, each micro-batch takes its rows of the masks drawn for the
whole batch, so the step is the same whatever the count.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from .single_device_masks import SingleDeviceMasks

__all__ = ["MicroBatch", "token_balanced_slices", "micro_batch_rows", "micro_batches_of"]


class MicroBatch(NamedTuple):
    index: int
    net_input: Dict[str, Tensor]
    target: Tensor
    masks: Optional[SingleDeviceMasks]
    name: str  # "" for the whole batch, else "micro-batch FIRST-LAST: " (rows)
    first_row: int = 0  # of the batch (its attention-softmax shards are dealt over the whole batch)


def token_balanced_slices(tokens: Sequence[int], count: int) -> List[slice]:
    """``count`` contiguous slices of the rows whose token counts
    (``tokens``, one per row) are as near equal as contiguous cuts make
    them: each cut at the row where the running total first reaches its
    share.  Never an empty slice; fewer rows than ``count`` give fewer."""
    rows = len(tokens)
    count = max(1, min(count, rows))
    total = float(sum(tokens)) or float(rows)
    weights = list(tokens) if sum(tokens) else [1] * rows
    slices, start, running = [], 0, 0.0
    for index in range(count - 1):
        share = total * (index + 1) / count
        stop = start + 1  # at least one row each
        running += weights[start]
        while stop < rows - (count - 1 - index) and running + weights[stop] / 2 < share:
            running += weights[stop]
            stop += 1
        slices.append(slice(start, stop))
        start = stop
    slices.append(slice(start, rows))
    return slices


def micro_batch_rows(net_input: Dict[str, Tensor], target: Tensor, count: int, pad: int) -> List[Optional[slice]]:
    """The rows of each micro-batch: ``[None]`` (the whole batch) for one,
    else contiguous slices with near-equal tokens (source and target,
    padding not counted)."""
    if count <= 1 or target.size(0) <= 1:
        return [None]
    tokens = (net_input["src_lengths"].cpu() + target.ne(pad).sum(1).cpu()).tolist()
    return token_balanced_slices(tokens, count)


def micro_batches_of(net_input: Dict[str, Tensor], target: Tensor, masks: Optional[SingleDeviceMasks], count: int,
                  pad: int) -> Iterator[MicroBatch]:
    """The batch's micro-batches in order, each with its rows of the batch,
    of its target and of the masks."""
    for index, rows in enumerate(micro_batch_rows(net_input, target, count, pad)):
        if rows is None:
            yield MicroBatch(index, net_input, target, masks, "")
            continue
        yield MicroBatch(index, {key: value[rows] if torch.is_tensor(value) else value
                                 for key, value in net_input.items()},
                         target[rows], None if masks is None else masks.rows(rows),
                         f"micro-batch {rows.start}-{rows.stop - 1}: ", rows.start)
