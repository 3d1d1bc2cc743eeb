"""A step's batch staged once, before its jobs start: everything a cell
reads from the batch (token ids, length order, reversal and restore
indices, packed layouts, padding masks, target positions that count,
dropout masks) made on the host and put on the device of the cells that
read it, so that a cell never copies from the host nor waits for it.

Everything is made from the host's batch (:mod:`.host_batch`) and copied
from pinned memory where the devices queue copies (:mod:`..runtime.stream_handoff`):
staging never waits for a device, which on GPUs would stall every worker.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ...kernels.fused_output_loss import KeptTargets, kept_targets
from ...kernels.sorted_packing import PackedLayout, chunk_values, sorted_values, values_layout
from .batch_rows import MicroBatch, micro_batches_of, step_rows, softmax_groups, time_chunks
from .device_plan import DevicePlan
from ..runtime.host_batch import host_of, on_host
from .single_device_masks import SingleDeviceMasks, draw_single_device_masks
from ..runtime.stream_handoff import arrive, to_devices


class StagedShard(NamedTuple):
    """One worker's whole-model shard of a ``data`` step, on its device
    (source lengths stay on the host, where packing reads them)."""

    worker: int
    rows: slice
    net_input: Dict[str, Tensor]
    target: Tensor
    kept: KeptTargets
    masks: Optional[List[Tensor]]


class StagedStep(NamedTuple):
    """A step's batch staged: its micro-batches (``hybrid``, ``model``) or
    its whole-model shards (``data``)."""

    micro_batches: List["StagedBatch"]
    shards: List[StagedShard]


def stage_step(model, plan: DevicePlan, net_input: Dict[str, Tensor], target: Tensor, chunk_length: int = 0,
               micro_batches: int = 1, single_device_masks: bool = False,
               masks: Optional[SingleDeviceMasks] = None, softmax_chunks: int = 1,
               only: Optional[int] = None) -> StagedStep:
    """The step's batch, from the host's copy, cut where
    :func:`.batch_rows.step_rows` decides and put on its devices.
    ``masks``: the single-device masks drawn already (by the trainer, for
    stages in processes of their own); else drawn here for the whole batch
    with ``single_device_masks``, as the single-device model draws them.
    ``only``: stage what that worker's cells read, and no other's."""
    net_input, target = on_host(net_input), host_of(target)
    if single_device_masks and masks is None:
        masks = draw_single_device_masks(model, net_input["src_tokens"].size(1),
                                         net_input["prev_output_tokens"].size(1), target.size(0))
    pad = model.decoder.dictionary.pad()
    pieces = step_rows(plan, net_input, target, micro_batches, pad)
    if plan.mode == "data":
        return StagedStep([], [_stage_shard(net_input, target, masks, worker, rows, plan.devices[worker], pad)
                               if reads(only, {worker}) else StagedShard(worker, rows, {}, None, None, None)
                               for worker, rows in pieces[0].shards])
    return StagedStep([StagedBatch(model, plan, part, chunk_length, softmax_chunks, only)
                       for part in micro_batches_of(net_input, target, masks, pieces)], [])


def reads(only: Optional[int], workers) -> bool:
    """Whether the worker staged for (``only``; None: every worker) runs a
    cell of ``workers``, and so reads what those cells read."""
    return only is None or only in workers


def _stage_shard(net_input: Dict[str, Tensor], target: Tensor, masks: Optional[SingleDeviceMasks], worker: int,
                 rows: slice, device: torch.device, pad: int) -> StagedShard:
    kept = _kept_on(target[rows], pad, device)
    shard_input = {key: value[rows] if key == "src_lengths" else arrive(value[rows], device)
                   for key, value in net_input.items()}
    shard_masks = None if masks is None else [arrive(mask, device) for mask in masks.in_order(rows)]
    return StagedShard(worker, rows, shard_input, arrive(target[rows], device), kept, shard_masks)


def _kept_on(target: Tensor, pad: int, device: torch.device) -> KeptTargets:
    """The positions of host ``target`` that count, found on the host and
    put on ``device``."""
    return KeptTargets(*(arrive(t, device) for t in kept_targets(target, pad)))


def _packed_layouts(values: Tuple[int, ...], width: int, rows: int,
                    devices) -> Dict[torch.device, Optional[PackedLayout]]:
    """The packed layout of the running rows of checked ``values`` (lengths
    sorted longest first, :func:`.sorted_values`) among ``rows`` on each of
    ``devices``; None on each where no row runs."""
    if not values:
        return {device: None for device in devices}
    positions, batch_sizes = values_layout(values, width)
    full = len(values) == rows and values[-1] == width
    return {device: PackedLayout(on_device, batch_sizes, len(values), full)
            for device, on_device in to_devices(positions, devices).items()}


class StagedBatch:
    """What the cell builders of one micro-batch of a ``hybrid`` or
    ``model`` step need to know about it (the length order of the encoder
    rows, the time chunks, the attention-softmax part's shards, the
    dropout masks to take), and its tensors on the devices of the cells
    that read them."""

    def __init__(self, model, plan: DevicePlan, part: MicroBatch, chunk_length: int, softmax_chunks: int = 1,
                 only: Optional[int] = None):
        net_input, target, masks, shards = part.net_input, part.target, part.masks, part.shards
        self.index, self.name = part.index, part.name
        encoder = model.encoder.stack
        devices = plan.devices
        src_tokens = net_input["src_tokens"]  # host tensors, all of them
        src_lengths = net_input["src_lengths"]
        self.order = torch.sort(src_lengths, descending=True, stable=True).indices
        self.restore = torch.argsort(self.order)
        self.sorted_lengths = src_lengths[self.order]
        self.source_width = src_tokens.size(1)
        self.rows = src_tokens.size(0)
        # the lengths once as checked ints, from which every time chunk's are made
        values = sorted_values(self.sorted_lengths, self.source_width)
        self.source_tokens = sum(values)
        self.source_chunks = time_chunks(self.source_width, chunk_length, plan.size)
        chunk_rows = [chunk_values(values, chunk.start, chunk.stop - chunk.start) for chunk in self.source_chunks]
        self.chunk_tokens = [sum(chunk) for chunk in chunk_rows]  # for the cost models, once for every layer
        self.target_chunks = time_chunks(net_input["prev_output_tokens"].size(1), chunk_length, plan.size)
        # the target chunks each attention-softmax cell takes, and the time steps they span
        self.softmax_groups = softmax_groups(len(self.target_chunks), softmax_chunks)
        self.softmax_spans = [slice(self.target_chunks[group[0]].start, self.target_chunks[group[-1]].stop)
                              for group in self.softmax_groups]
        self.shards = [rows for _, rows in shards]
        self.shard_workers = [worker for worker, _ in shards]
        self.shard_devices = [devices[worker] for worker in self.shard_workers]
        self.masks = masks

        # The batch on the devices of the cells that read it; the source right-padded only where
        # a worker reads it (the whole batch, or each of its shards).
        padded = encoder.right_padded(src_tokens) if reads(only, {plan.encoder[0]}) else None
        self.sorted_source = arrive(padded.index_select(0, self.order), plan.encoder_device(0)) \
            if padded is not None else None
        self.prev_output_tokens = arrive(net_input["prev_output_tokens"], plan.decoder_device(0))
        self.restore_on = to_devices(self.restore, devices)
        # The packed layout of the encoder's rows, whole (the directions of a
        # bidirectional layer) and per time chunk (the rows still running),
        # sent with the batch: one gather per cell instead of a copy per step
        # (each only for a worker whose cells read it).
        runs = encoder_workers(model, plan)
        self.reversed_positions = to_devices(encoder.reversed_positions(self.sorted_lengths, self.source_width),
                                             devices) if reads(only, runs.reverse) else {}
        self.packed_layouts = _packed_layouts(values, self.source_width, self.rows, devices) \
            if reads(only, runs.directions) else {}
        self.chunk_layouts = [_packed_layouts(chunk, source.stop - source.start, self.rows, devices)
                              if reads(only, runs.chunks) else _Absent()
                              for chunk, source in zip(chunk_rows, self.source_chunks)]
        pad = model.decoder.dictionary.pad()
        self.padding_masks, self.targets, self.kept = [], [], []
        for rows, worker, device in zip(self.shards, self.shard_workers, self.shard_devices):
            if not reads(only, {worker}):  # another worker's shard
                self.padding_masks.append(None)
                self.targets.append(None)
                self.kept.append(None)
                continue
            shard_source = padded[rows] if padded is not None else encoder.right_padded(src_tokens[rows])
            self.padding_masks.append(arrive(shard_source.eq(encoder.padding_idx), device))
            pieces = [target[rows, span] for span in self.softmax_spans]
            self.targets.append([arrive(piece, device) for piece in pieces])
            self.kept.append([_kept_on(piece, pad, device) for piece in pieces])

    def pick(self, select, device: torch.device) -> Optional[List[Tensor]]:
        """The mask a cell's one dropout call takes, on the cell's device, or
        None (draw its own)."""
        return None if self.masks is None else [arrive(select(self.masks), device)]

    def source_sizes(self) -> List[int]:
        return [chunk.stop - chunk.start for chunk in self.source_chunks]


class _Absent(dict):
    """What a worker that does not read a staged part gets instead: None
    for every device."""

    def __missing__(self, key):
        return None


class EncoderWorkers(NamedTuple):
    """Which workers run which encoder cells: a direction of a bidirectional
    layer, its reverse direction, a time chunk of a unidirectional layer."""

    directions: set
    reverse: set
    chunks: set


def encoder_workers(model, plan: DevicePlan) -> EncoderWorkers:
    layers = model.encoder.stack.layers
    bidirectional = [layer for layer, module in enumerate(layers) if module.bidirectional]
    reverse = {plan.reverse_worker(layer) for layer in bidirectional}
    return EncoderWorkers({plan.encoder[layer] for layer in bidirectional} | reverse, reverse,
                          {plan.encoder[layer] for layer, module in enumerate(layers) if not module.bidirectional})
