"""Small stand-ins for tests, scripts, checks and the schedule simulator's
twin model: vocabularies, a task that only carries dictionaries, models
built through fairseq's registry, and real fairseq batches of chosen
lengths."""

from __future__ import annotations

import argparse
from typing import Sequence

import torch
from fairseq.data import Dictionary, LanguagePairDataset
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY


def make_dictionary(size: int = 40) -> Dictionary:
    dictionary = Dictionary()
    for index in range(size):
        dictionary.add_symbol(f"w{index}")
    dictionary.finalize(padding_factor=1)
    return dictionary


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


def build_model(arch: str = "hybrid_lstm_tiny", src_dict=None, tgt_dict=None, **overrides):
    """A model of any registered architecture (``hybrid_lstm_*``, fairseq's
    ``lstm``), its options filled by the architecture as fairseq does."""
    src_dict = src_dict or make_dictionary()
    tgt_dict = tgt_dict or make_dictionary(37)
    cfg = argparse.Namespace(arch=arch, **overrides)
    ARCH_CONFIG_REGISTRY[arch](cfg)
    return ARCH_MODEL_REGISTRY[arch].build_model(cfg, StandInTask(src_dict, tgt_dict))


def make_sample(src_dict, tgt_dict, src_lengths: Sequence[int], tgt_lengths: Sequence[int], seed: int = 0):
    """A collated fairseq batch (left-padded source, right-padded target)."""
    generator = torch.Generator().manual_seed(seed)

    def sentence(dictionary, length):
        ids = torch.randint(dictionary.nspecial, len(dictionary), (length,), generator=generator)
        return torch.cat([ids, torch.tensor([dictionary.eos()])])

    src = [sentence(src_dict, n) for n in src_lengths]
    tgt = [sentence(tgt_dict, n) for n in tgt_lengths]
    dataset = LanguagePairDataset(src, torch.tensor([len(s) for s in src]), src_dict, tgt,
                                  torch.tensor([len(t) for t in tgt]), tgt_dict)
    return dataset.collater([dataset[i] for i in range(len(src))])
