"""A step's batch staged once, before its jobs start: everything a cell
reads from the batch (token ids, length order, reversal and restore
indices, packed layouts, padding masks, target positions that count,
dropout masks) made on the host and put on the device of the cells that
read it, so that a cell never copies from the host nor waits for it.

Everything is made from the batch's layout on the host (:mod:`.step_layout`,
made once for every worker) and copied from pinned memory where the devices
queue copies (:mod:`..runtime.stream_handoff`): staging never waits for a
device, which on GPUs would stall every worker.  A worker in a process of
its own stages what its own cells read, on its own device only.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional

import torch
from torch import Tensor

from ...kernels.fused_output_loss import KeptTargets, kept_targets
from ...kernels.sorted_packing import PackedLayout
from .device_plan import DevicePlan
from .single_device_masks import SingleDeviceMasks
from .step_layout import BatchLayout, StepLayout, lay_out_step
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
               only: Optional[int] = None, layout: Optional[StepLayout] = None) -> StagedStep:
    """The step's batch put on its devices, from its layout
    (:func:`.step_layout.lay_out_step`, made here from the other
    arguments when not given).  ``only``: stage what that worker's cells
    read, and no other's."""
    if layout is None:
        layout = lay_out_step(model, plan, net_input, target, chunk_length, micro_batches, single_device_masks, masks,
                              softmax_chunks)
    if plan.mode == "data":
        pad = model.decoder.dictionary.pad()
        return StagedStep([], [_stage_shard(layout.net_input, layout.target, layout.masks, worker, rows,
                                            plan.devices[worker], pad)
                               if reads(only, {worker}) else StagedShard(worker, rows, {}, None, None, None)
                               for worker, rows in layout.shards])
    return StagedStep([StagedBatch(model, plan, part, only) for part in layout.micro_batches], [])


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


def _on_devices(layout: Optional[PackedLayout], devices) -> Dict[torch.device, Optional[PackedLayout]]:
    """A host packed layout on each of ``devices`` (None on each where no row runs)."""
    if layout is None:
        return {device: None for device in devices}
    return {device: layout._replace(positions=on_device)
            for device, on_device in to_devices(layout.positions, devices).items()}


class StagedBatch:
    """What the cell builders of one micro-batch of a ``hybrid`` or
    ``model`` step need to know about it (its layout: the length order of
    the encoder rows, the time chunks, the attention-softmax part's shards,
    the dropout masks to take), and its tensors on the devices of the cells
    that read them (``only``: of that worker's cells alone)."""

    def __init__(self, model, plan: DevicePlan, layout: BatchLayout, only: Optional[int] = None):
        encoder = model.encoder.stack
        devices = plan.devices
        self.index, self.name = layout.index, layout.name
        self.order, self.restore, self.sorted_lengths = layout.order, layout.restore, layout.sorted_lengths
        self.source_width, self.rows = layout.source_width, len(layout.order)
        self.source_tokens, self.chunk_tokens = layout.source_tokens, layout.chunk_tokens
        self.source_chunks, self.target_chunks = layout.source_chunks, layout.target_chunks
        self.softmax_groups, self.softmax_spans = layout.softmax_groups, layout.softmax_spans
        self.shards = [rows for _, rows in layout.shards]
        self.shard_workers = [worker for worker, _ in layout.shards]
        self.shard_devices = [devices[worker] for worker in self.shard_workers]
        self.masks = layout.masks
        src_tokens, target = layout.net_input["src_tokens"], layout.target  # host tensors

        # The batch on the devices of the cells that read it; the source right-padded only where
        # a worker reads it (the whole batch, or each of its shards).
        padded = encoder.right_padded(src_tokens) if reads(only, {plan.encoder[0]}) else None
        self.sorted_source = arrive(padded.index_select(0, self.order), plan.encoder_device(0)) \
            if padded is not None else None
        self.prev_output_tokens = arrive(layout.net_input["prev_output_tokens"], plan.decoder_device(0)) \
            if reads(only, {plan.decoder[0]}) else None
        mine = devices if only is None else [devices[only]]  # the devices this build's cells run on
        self.restore_on = to_devices(self.restore, mine)
        # The packed layout of the encoder's rows, whole (the directions of a
        # bidirectional layer) and per time chunk (the rows still running),
        # sent with the batch: one gather per cell instead of a copy per step
        # (each only for a worker whose cells read it).
        runs = encoder_workers(model, plan)
        self.reversed_positions = to_devices(layout.reversed_positions, mine) if reads(only, runs.reverse) else {}
        self.packed_layouts = _on_devices(layout.packed, mine) if reads(only, runs.directions) else {}
        self.chunk_layouts = [_on_devices(chunk, mine) if reads(only, runs.chunks) else _Absent()
                              for chunk in layout.chunk_packed]
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
