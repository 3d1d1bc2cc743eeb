"""Dropout that draws its masks from the running cell's own generator.

The cells of a hybrid step run on several threads at once, so masks drawn
from torch's global generator would depend on which thread got there first,
and two runs with the same seed would differ.  The hybrid engine therefore
gives every cell a generator seeded from (step seed, cell index) and runs
the cell inside :func:`cell_generator`; :class:`SeededDropout` uses that
generator when there is one (``nn.functional.dropout`` takes no generator)
and is plain ``nn.Dropout`` everywhere else (single device, generation).
With :func:`given_masks` it applies masks drawn elsewhere instead.
"""

from __future__ import annotations

import threading
from collections import deque
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch import Tensor

_local = threading.local()


class _CellSeed:
    """A cell's seed, made into a generator at its first draw: most cells
    draw nothing (no dropout, or a backward call), and a generator costs
    the host a few microseconds to make and seed."""

    __slots__ = ("seed", "device", "generator")

    def __init__(self, seed: int, device: torch.device):
        self.seed, self.device, self.generator = seed, device, None

    def get(self) -> torch.Generator:
        if self.generator is None:
            self.generator = torch.Generator(device=self.device)
            self.generator.manual_seed(self.seed)
        return self.generator


def enter_cell(seed: int, device: torch.device) -> Optional[_CellSeed]:
    """Dropout in this thread draws from a generator seeded with ``seed``
    until :func:`leave_cell` is given what this returned (the hybrid
    engine's cells: a plain call pair, cheaper than a context manager)."""
    previous = getattr(_local, "generator", None)
    _local.generator = _CellSeed(seed, device)
    return previous


def leave_cell(previous: Optional[_CellSeed]) -> None:
    _local.generator = previous


@contextmanager
def cell_generator(seed: int, device: torch.device) -> Iterator[None]:
    """Dropout in this thread draws from a generator seeded with ``seed``."""
    previous = enter_cell(seed, device)
    try:
        yield
    finally:
        leave_cell(previous)


def current_generator() -> Optional[torch.Generator]:
    seed = getattr(_local, "generator", None)
    return None if seed is None else seed.get()


@contextmanager
def given_masks(masks: Sequence[Tensor]) -> Iterator[None]:
    """Dropout calls in this thread take these (already scaled) masks, one
    per call in order, instead of drawing: how a group reproduces the masks
    of the single-device model (``--hybrid-dropout-masks single-device``)."""
    previous = getattr(_local, "masks", None)
    _local.masks = deque(masks)
    try:
        yield
    finally:
        _local.masks = previous


class SeededDropout(nn.Dropout):
    def mask_for(self, shape, like: Tensor) -> Optional[Tuple[Tensor, float]]:
        """The mask this module's next call would apply to an input of
        ``shape`` (with ``like``'s dtype and device) and the keep
        probability it divides by, ``x * mask / keep``, or None where it
        would return its input: for code that applies it itself (the
        hybrid engine's fused attention-softmax cell).  A given mask is
        taken (divisor 1), else one is drawn from the cell's generator, or
        torch's."""
        if not self.training or self.p == 0.0:
            return None
        masks = getattr(_local, "masks", None)
        if masks:
            return masks.popleft().to(like.device), 1.0
        if self.p == 1.0:
            return torch.zeros(shape, dtype=like.dtype, device=like.device), 1.0
        keep = 1.0 - self.p
        mask = torch.empty(shape, dtype=like.dtype, device=like.device).bernoulli_(keep,
                                                                                  generator=current_generator())
        return mask, keep

    def forward(self, x: Tensor) -> Tensor:
        masks = getattr(_local, "masks", None)
        if masks and self.training and self.p > 0.0:
            return x * masks.popleft().to(x.device)  # as F.dropout: input * (noise / keep)
        if self.p == 0.0 or not self.training:
            return x  # what F.dropout gives then, without an op
        generator = current_generator()
        if generator is None:
            return super().forward(x)
        if self.p == 1.0:
            return x * 0.0
        keep = 1.0 - self.p
        mask = torch.empty_like(x).bernoulli_(keep, generator=generator)
        return x * mask / keep
