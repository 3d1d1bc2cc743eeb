"""Packing rows sorted by length, longest first, with one gather each way.

``pack_padded_sequence`` and ``pad_packed_sequence`` copy a batch one time
step at a time: on a CPU each step is a slice and a copy dispatched as ops of
their own, on a GPU a kernel launch each, and their backward does the same
again.  A cell of T time steps thus costs O(T) ops of host time in each
direction, which for the hybrid engine's short chunks is most of the ops of
an encoder cell (counts in docs/benchmarks.md) and a floor under the cell's
time on a GPU.  Here the packed order of a (lengths, width) pair
is an index made once on the host (and cached), and packing is one
``index_select`` of the batch-first rows, unpacking one ``index_copy`` into
zeros, each with a one-op backward.  Both are copies: the values are those
of torch's functions, bit for bit.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from functools import lru_cache
from typing import NamedTuple, Optional, Tuple

import numpy as np
import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence


@lru_cache(maxsize=1024)
def _layout(lengths: Tuple[int, ...], width: int) -> Tuple[Tensor, Tensor]:
    # numpy, not torch: no op of a device-placing dispatch mode sees it, so
    # both are host tensors whichever thread asks
    running = np.asarray(lengths)[None, :] > np.arange(max(lengths))[:, None]  # steps x B
    # packed order: time step by time step, the rows still running at it
    times, rows = np.nonzero(running)
    return torch.from_numpy(rows * width + times), torch.from_numpy(running.sum(1).astype(np.int64))


def sorted_layout(lengths: Tensor, width: int) -> Tuple[Tensor, Tensor]:
    """For rows of ``lengths`` (host, non-increasing, each in 1..``width``):
    the positions, in packed order, of their tokens among the rows of a
    ``B x width`` batch-first tensor flattened to ``B * width`` rows, and the
    ``batch_sizes`` of the PackedSequence; both host int64 tensors, shared
    by every caller with the same lengths (never written to)."""
    return _layout(sorted_values(lengths, width), width)


def sorted_values(lengths: Tensor, width: int) -> Tuple[int, ...]:
    """Host ``lengths`` as a tuple, checked non-increasing and in
    1..``width``: what :func:`values_layout` and :func:`chunk_values` take."""
    values = tuple(map(int, lengths.tolist()))
    if not values or values[-1] < 1 or values[0] > width or any(a < b for a, b in zip(values, values[1:])):
        raise ValueError(f"lengths must be non-increasing, in 1..{width}: {values}")
    return values


def values_layout(values: Tuple[int, ...], width: int) -> Tuple[Tensor, Tensor]:
    """:func:`sorted_layout` of lengths checked already
    (:func:`sorted_values`, or a chunk of them): a step's staging makes one
    per time chunk, so it checks the lengths once."""
    return _layout(values, width)


def chunk_values(values: Tuple[int, ...], start: int, width: int) -> Tuple[int, ...]:
    """:func:`chunk_lengths` of checked lengths, in plain ints: the time
    steps each still-running row has in the chunk of ``width`` steps from
    ``start`` (checked lengths in turn, when not empty)."""
    rising = values[::-1]  # the values being non-increasing, the rows that run through the whole chunk, and
    full = len(values) - bisect_left(rising, start + width)  # those that run in it, are prefixes
    running = len(values) - bisect_right(rising, start)
    return (width,) * full + tuple(n - start for n in values[full:running])


class PackedLayout(NamedTuple):
    """A packed layout made ahead of the call that uses it (the hybrid
    engine makes one per time chunk, and per device, when a step starts):
    ``positions`` of :func:`sorted_layout` on the reading cell's device,
    the host ``batch_sizes`` and how many rows are ``running`` (the first
    batch size), so that a cell neither recomputes nor validates them;
    ``full`` when every row of the batch runs through the whole width (a
    batch of equal lengths, or an early time chunk), where the layer runs
    on the batch-first rows as they are, without packing."""

    positions: Tensor
    batch_sizes: Tensor
    running: int
    full: bool = False  # every row runs through the whole width: nothing to pack


def pack_sorted(inputs: Tensor, lengths: Tensor, positions: Optional[Tensor] = None) -> Tuple[PackedSequence, Tensor]:
    """``inputs`` B x W x C (batch first, rows sorted longest first) as a
    PackedSequence, as ``pack_padded_sequence(inputs[:len(lengths)],
    lengths, batch_first=True, enforce_sorted=True)`` gives it (rows past
    ``lengths`` are left out: they have ended), and the positions
    that :func:`unpack_sorted` takes back.  ``positions``: those of
    :func:`sorted_layout` already on ``inputs``' device (the hybrid engine
    sends them with the batch); made here when not given."""
    batch, width = inputs.shape[:2]
    host_positions, batch_sizes = sorted_layout(lengths, width)
    if positions is None:
        positions = host_positions.to(inputs.device)
    data = inputs.reshape(batch * width, inputs.size(2)).index_select(0, positions)
    return PackedSequence(data, batch_sizes), positions


def unpack_sorted(data: Tensor, positions: Tensor, batch: int, width: int) -> Tensor:
    """A packed ``data`` (of :func:`pack_sorted`'s layout) as B x ``width``
    x H, zeros past each row's length, as ``pad_packed_sequence(...,
    batch_first=True, total_length=width)`` gives it."""
    out = data.new_zeros(batch * width, data.size(1))
    return out.index_copy(0, positions, data).view(batch, width, data.size(1))


def chunk_lengths(sorted_lengths: Tensor, start: int, width: int) -> Tensor:
    """Of rows sorted longest first (host lengths), the time steps each
    still-running row has in the chunk of ``width`` steps from ``start``."""
    running = int((sorted_lengths > start).sum())
    return (sorted_lengths[:running] - start).clamp(max=width)
