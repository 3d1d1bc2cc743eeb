"""The layout of a step's batch: where every row and time step goes and
what the cells read of it that every worker would otherwise work out for
itself, made once on the host by whoever holds the batch (the group's
thread, or the trainer for stages in processes of their own, which send
it with the batch).

Per micro-batch: its rows, attention-softmax shards and dropout masks
(:mod:`.batch_rows`), the encoder rows' length order and its inverse, the
lengths as checked ints (:func:`.sorted_values`), the time chunks, the
tokens each chunk runs over, the softmax groups, and the packed layouts
of the running rows, whole and per chunk, and the reverse direction's
positions, all host tensors.  :mod:`.staging` then puts on each device
what that device's cells read, and a worker in a process of its own only
its own part.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ...kernels.sorted_packing import PackedLayout, chunk_values, sorted_values, values_layout
from .batch_rows import micro_batches_of, softmax_groups, step_rows, time_chunks
from .device_plan import DevicePlan
from ..runtime.host_batch import host_of, on_host
from .single_device_masks import SingleDeviceMasks, draw_single_device_masks


class BatchLayout(NamedTuple):
    """One micro-batch of a ``hybrid`` or ``model`` step, laid out (host
    tensors only)."""

    index: int
    name: str  # "" for the whole batch, else "micro-batch FIRST-LAST: " (rows)
    net_input: Dict[str, Tensor]
    target: Tensor
    masks: Optional[SingleDeviceMasks]
    shards: List[Tuple[int, slice]]  # (worker, rows of the micro-batch)
    order: Tensor  # the encoder's rows, longest source first
    restore: Tensor  # back to batch order
    sorted_lengths: Tensor
    source_width: int
    source_tokens: int
    source_chunks: List[slice]
    chunk_tokens: List[int]
    target_chunks: List[slice]
    softmax_groups: List[range]  # the target chunks each attention-softmax cell takes
    softmax_spans: List[slice]  # and the time steps they span
    packed: Optional[PackedLayout]  # of the running rows over the whole width (None: no row runs)
    chunk_packed: List[Optional[PackedLayout]]  # and in each time chunk
    reversed_positions: Optional[Tensor]  # for the reverse directions (None: no bidirectional layer)


class StepLayout(NamedTuple):
    """A step's batch laid out: its micro-batches (``hybrid``, ``model``),
    or in ``data`` mode the host batch, its masks and each worker's rows."""

    micro_batches: List[BatchLayout]
    net_input: Dict[str, Tensor]
    target: Tensor
    masks: Optional[SingleDeviceMasks]
    shards: List[Tuple[int, slice]]  # data mode: (worker, rows of the batch)


def lay_out_step(model, plan: DevicePlan, net_input: Dict[str, Tensor], target: Tensor, chunk_length: int = 0,
                 micro_batches: int = 1, single_device_masks: bool = False,
                 masks: Optional[SingleDeviceMasks] = None, softmax_chunks: int = 1) -> StepLayout:
    """The step's layout, from the host's copy of its batch, cut where
    :func:`.batch_rows.step_rows` decides.  ``masks``: the single-device
    masks drawn already (by the trainer, for stages in processes of their
    own); else drawn here for the whole batch with
    ``single_device_masks``, as the single-device model draws them."""
    net_input, target = on_host(net_input), host_of(target)
    if single_device_masks and masks is None:
        masks = draw_single_device_masks(model, net_input["src_tokens"].size(1),
                                         net_input["prev_output_tokens"].size(1), target.size(0))
    pieces = step_rows(plan, net_input, target, micro_batches, model.decoder.dictionary.pad())
    if plan.mode == "data":
        return StepLayout([], net_input, target, masks, pieces[0].shards)
    encoder = model.encoder.stack
    bidirectional = any(module.bidirectional for module in encoder.layers)
    batches = []
    for part in micro_batches_of(net_input, target, masks, pieces):
        src_lengths, width = part.net_input["src_lengths"], part.net_input["src_tokens"].size(1)
        order = torch.sort(src_lengths, descending=True, stable=True).indices
        sorted_lengths = src_lengths[order]
        values = sorted_values(sorted_lengths, width)  # the lengths once as checked ints
        rows = len(src_lengths)
        source_chunks = time_chunks(width, chunk_length, plan.size)
        chunk_rows = [chunk_values(values, chunk.start, chunk.stop - chunk.start) for chunk in source_chunks]
        target_chunks = time_chunks(part.net_input["prev_output_tokens"].size(1), chunk_length, plan.size)
        groups = softmax_groups(len(target_chunks), softmax_chunks)
        batches.append(BatchLayout(
            part.index, part.name, part.net_input, part.target, part.masks, part.shards, order, torch.argsort(order),
            sorted_lengths, width, sum(values), source_chunks, [sum(chunk) for chunk in chunk_rows], target_chunks,
            groups, [slice(target_chunks[group[0]].start, target_chunks[group[-1]].stop) for group in groups],
            packed_layout(values, width, rows),
            [packed_layout(chunk, source.stop - source.start, rows) for chunk, source in zip(chunk_rows, source_chunks)],
            encoder.reversed_positions(sorted_lengths, width) if bidirectional else None))
    return StepLayout(batches, net_input, target, masks, [])


def packed_layout(values: Tuple[int, ...], width: int, rows: int) -> Optional[PackedLayout]:
    """The packed layout (host positions) of the running rows of checked
    ``values`` (lengths sorted longest first, :func:`.sorted_values`) among
    ``rows``; None where no row runs."""
    if not values:
        return None
    positions, batch_sizes = values_layout(values, width)
    return PackedLayout(positions, batch_sizes, len(values), len(values) == rows and values[-1] == width)
