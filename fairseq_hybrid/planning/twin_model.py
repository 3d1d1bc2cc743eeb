"""Models the planner simulates without training them: built through
fairseq's registry as ``fairseq-train`` builds them, on a task that only
carries dictionaries, with parameters on the meta device (no memory) where
only their shapes matter.

:func:`build_registered` is the one way this package builds a model from an
architecture name and options outside ``fairseq-train``; the harness's
stand-ins and the measurement scripts use it too.
"""

from __future__ import annotations

import argparse
from typing import Dict, Optional, Sequence, Tuple

import torch
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

__all__ = ["VocabularyOfSize", "StandInTask", "build_registered", "twin_model", "batch", "uniform_batch"]


class VocabularyOfSize:
    """A vocabulary that has only a size (what a parameter-free twin model
    reads from its dictionaries)."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self):
        return self.size

    def pad(self):
        return 1


class StandInTask:
    """What ``build_model`` and the criteria read from a translation task."""

    def __init__(self, src_dict, tgt_dict):
        self.source_dictionary = src_dict
        self.target_dictionary = tgt_dict


def build_registered(arch: str, src_dict, tgt_dict, **options):
    """A model of any registered architecture (``hybrid_lstm_*``, fairseq's
    ``lstm``), its options filled by the architecture as fairseq does;
    returns the model and its options."""
    cfg = argparse.Namespace(arch=arch, **options)
    ARCH_CONFIG_REGISTRY[arch](cfg)
    return ARCH_MODEL_REGISTRY[arch].build_model(cfg, StandInTask(src_dict, tgt_dict)), cfg


def twin_model(arch: str, vocabulary: int, **options):
    """A model of preset ``arch`` whose parameters take no memory, and its
    options (without a group: the planner places it itself)."""
    words = VocabularyOfSize(vocabulary)
    with torch.device("meta"):
        model, cfg = build_registered(arch, words, words, **options, hybrid_devices="", hybrid_placement="")
    return model, cfg


def batch(sentences: int, source_lengths: Sequence[int], target_length: int,
          target_lengths: Optional[Sequence[int]] = None) -> Tuple[Dict, torch.Tensor]:
    """A net_input and target of the given shape (token ids do not matter;
    padding is id 1): sources left-padded, targets right-padded to
    ``target_length`` where ``target_lengths`` are given, else full."""
    width = max(source_lengths)
    src = torch.full((sentences, width), 1, dtype=torch.long)
    for row, length in enumerate(source_lengths):
        src[row, width - length:] = 5  # left-padded, as fairseq batches sources
    tgt = torch.full((sentences, target_length), 5, dtype=torch.long)
    for row, length in enumerate(target_lengths or ()):
        tgt[row, length:] = 1
    return {"src_tokens": src, "src_lengths": torch.tensor(list(source_lengths)), "prev_output_tokens": tgt}, tgt


def uniform_batch(sentences: int, source: int, target: int) -> Tuple[Dict, torch.Tensor]:
    """A batch of ``sentences`` sentences of ``source`` + ``target`` tokens."""
    return batch(sentences, [source] * sentences, target)
