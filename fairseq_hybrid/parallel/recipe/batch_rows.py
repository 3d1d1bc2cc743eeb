"""Where every row and time step of a step's batch goes, decided and cut
in one place (micro-batches in the spirit of torchgpipe's
``microbatch.py``).

Rows are cut three ways.  Micro-batches (``--hybrid-micro-batches``) are
contiguous rows with near-equal tokens (:func:`micro_batch_rows`; padding
not counted: fairseq's batches hold sentences of similar length, but not
always), each its own chain of cells whose loss sums add up to the
batch's.  Within each, the attention-softmax part's shards are the
micro-batch's part of the whole batch's shards, dealt by the plan's shard
weights (:func:`shard_rows`), so that a shard's rows in every micro-batch
add up to its share of the batch.  In ``data`` mode each device's
whole-model shard is a near-equal slice (:func:`batch_slices`).  Time is
cut into chunks (:func:`time_chunks`), and the target's chunks into the
attention-softmax cells' groups (:func:`softmax_groups`).  Each
micro-batch takes its rows of the single-device dropout masks drawn for
the whole batch, so the step is the same whatever the count; results are
added back by :mod:`.shard_sums`.
"""

from __future__ import annotations

import heapq
from functools import lru_cache
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .single_device_masks import SingleDeviceMasks

__all__ = ["MicroBatch", "PieceRows", "batch_slices", "dealt_rows", "dealt_slices", "micro_batch_rows",
           "micro_batches_of", "shard_rows", "softmax_groups", "step_rows", "time_chunks", "token_balanced_slices",
           "weighted_slices"]


class PieceRows(NamedTuple):
    """One micro-batch's rows: ``rows`` of the batch (None: the whole
    batch, one micro-batch) and its attention-softmax shards, ``(worker,
    rows of the micro-batch)`` each."""

    rows: Optional[slice]
    shards: List[Tuple[int, slice]]


def step_rows(plan, net_input: Dict[str, Tensor], target: Tensor, micro_batches: int, pad: int) -> List[PieceRows]:
    """Where every row of a step goes, decided once for the step: in
    ``hybrid`` and ``model`` mode its micro-batches
    (:func:`micro_batch_rows`) and each one's part of the batch's
    attention-softmax shards (:func:`shard_rows`); in ``data`` mode one
    piece, a near-equal slice of the batch per worker."""
    if plan.mode == "data":
        return [PieceRows(None, list(enumerate(batch_slices(target.size(0), plan.size))))]
    pieces = []
    for rows in micro_batch_rows(net_input, target, micro_batches, pad):
        first, size = (0, target.size(0)) if rows is None else (rows.start, rows.stop - rows.start)
        pieces.append(PieceRows(rows, shard_rows(plan, size, first)))
    return pieces


def weighted_slices(batch_size: int, weights: Sequence[int]) -> List[slice]:
    """Contiguous slices of ``range(batch_size)``, one per weight, their
    sizes in proportion (largest remainders round up, the first among
    equals first; a slice may be empty)."""
    total = sum(weights)
    exact = [batch_size * weight / total for weight in weights]
    sizes = [int(value) for value in exact]
    for index in sorted(range(len(weights)), key=lambda i: (sizes[i] - exact[i], i))[: batch_size - sum(sizes)]:
        sizes[index] += 1
    return _consecutive(sizes)


def _consecutive(sizes: Sequence[int]) -> List[slice]:
    """Slices of the given sizes, one after another from row 0."""
    slices, start = [], 0
    for size in sizes:
        slices.append(slice(start, start + size))
        start += size
    return slices


@lru_cache(maxsize=4096)
def dealt_rows(rows: int, weights: Tuple[int, ...]) -> Tuple[int, ...]:
    """How many of a batch's first ``rows`` rows each weight gets when the
    rows are dealt one at a time to the weight furthest below its share
    (the one with the least ``(dealt + 1/2) / weight``, the first among
    equals: Webster's divisor method, round-robin for equal weights).
    Dealing never takes a row back, so the counts for more rows are never
    below those for fewer: the pieces of a batch cut into micro-batches
    each get their difference, and over the whole batch every weight gets
    its share to within a row, where rounding each piece on its own gives
    the same weights the same extra row in every piece."""
    if len(set(weights)) == 1 and weights[0] > 0:
        return tuple((rows - index + len(weights) - 1) // len(weights) for index in range(len(weights)))
    dealt = [0] * len(weights)
    queue = [(0.5 / weight, index) for index, weight in enumerate(weights) if weight > 0]
    heapq.heapify(queue)
    for _ in range(rows):
        _, index = heapq.heappop(queue)
        dealt[index] += 1
        heapq.heappush(queue, ((dealt[index] + 0.5) / weights[index], index))
    return tuple(dealt)


def dealt_slices(first_row: int, rows: int, weights: Sequence[int]) -> List[slice]:
    """Contiguous slices of ``range(rows)``, one per weight, for the rows
    ``first_row`` to ``first_row + rows - 1`` of a batch: each weight's
    share of them as :func:`dealt_rows` deals the batch (a slice may be
    empty)."""
    before, after = dealt_rows(first_row, tuple(weights)), dealt_rows(first_row + rows, tuple(weights))
    return _consecutive([high - low for low, high in zip(before, after)])


def batch_slices(batch_size: int, count: int) -> List[slice]:
    """``count`` contiguous, near-equal slices of ``range(batch_size)``; a
    batch smaller than ``count`` gives fewer, never an empty one."""
    slices = [rows for rows in weighted_slices(batch_size, [1] * max(1, count)) if rows.stop > rows.start]
    return slices or [slice(0, batch_size)]


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


def shard_rows(plan, batch_size: int, first_row: int = 0) -> List[Tuple[int, slice]]:
    """``(worker, rows)`` of each attention-softmax shard of a batch, or
    of the micro-batch of ``batch_size`` rows from ``first_row`` on, under
    ``plan`` (a :class:`.device_plan.DevicePlan`): contiguous rows, as many
    per shard as its weight gives (equal without weights), dealt over the
    whole batch (:func:`dealt_rows`), so that a shard's rows in every
    micro-batch add up to its share of the batch; a piece smaller than the
    shards leaves some out, never an empty shard."""
    workers = plan.shard_workers
    weights = [plan.shard_weights[w] for w in workers] if plan.shard_weights else [1] * len(workers)
    return [(worker, rows) for worker, rows in zip(workers, dealt_slices(first_row, batch_size, weights))
            if rows.stop > rows.start]


def time_chunks(length: int, chunk_length: int, count: int) -> List[slice]:
    """The time chunks of a sequence: ``chunk_length`` steps each, or
    ``count`` near-equal chunks when ``chunk_length`` is 0."""
    if chunk_length > 0:
        return [slice(start, min(start + chunk_length, length)) for start in range(0, max(length, 1), chunk_length)]
    return batch_slices(max(length, 1), count)


def softmax_groups(chunks: int, per_cell: int) -> List[range]:
    """The target chunks of each attention-softmax cell: ``per_cell``
    consecutive ones (``--hybrid-softmax-chunks``; 0: all in one)."""
    per_cell = chunks if per_cell <= 0 else min(per_cell, chunks)
    return [range(first, min(first + per_cell, chunks)) for first in range(0, chunks, max(per_cell, 1))]


class MicroBatch(NamedTuple):
    index: int
    net_input: Dict[str, Tensor]
    target: Tensor
    masks: Optional[SingleDeviceMasks]
    name: str  # "" for the whole batch, else "micro-batch FIRST-LAST: " (rows)
    shards: List[Tuple[int, slice]]  # its attention-softmax shards: (worker, rows of the micro-batch)


def micro_batches_of(net_input: Dict[str, Tensor], target: Tensor, masks: Optional[SingleDeviceMasks],
                     pieces: Sequence[PieceRows]) -> Iterator[MicroBatch]:
    """The batch's micro-batches in order (``pieces``: :func:`step_rows`),
    each with its rows of the batch, of its target and of the masks."""
    for index, (rows, shards) in enumerate(pieces):
        if rows is None:
            yield MicroBatch(index, net_input, target, masks, "", shards)
            continue
        yield MicroBatch(index, {key: value[rows] if torch.is_tensor(value) else value
                                 for key, value in net_input.items()},
                         target[rows], None if masks is None else masks.rows(rows),
                         f"micro-batch {rows.start}-{rows.stop - 1}: ", shards)
