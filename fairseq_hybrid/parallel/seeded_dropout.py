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
from typing import Iterator, Optional, Sequence

import torch
import torch.nn as nn
from torch import Tensor

_local = threading.local()


@contextmanager
def cell_generator(seed: int, device: torch.device) -> Iterator[None]:
    """Dropout in this thread draws from a generator seeded with ``seed``."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    previous = getattr(_local, "generator", None)
    _local.generator = generator
    try:
        yield
    finally:
        _local.generator = previous


def current_generator() -> Optional[torch.Generator]:
    return getattr(_local, "generator", None)


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
    def forward(self, x: Tensor) -> Tensor:
        masks = getattr(_local, "masks", None)
        if masks and self.training and self.p > 0.0:
            return x * masks.popleft().to(x.device)  # as F.dropout: input * (noise / keep)
        generator = current_generator()
        if generator is None or not self.training or self.p == 0.0:
            return super().forward(x)
        if self.p == 1.0:
            return x * 0.0
        keep = 1.0 - self.p
        mask = torch.empty_like(x).bernoulli_(keep, generator=generator)
        return x * mask / keep
