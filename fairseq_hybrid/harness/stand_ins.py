"""Small stand-ins for tests, scripts and checks: made-up dictionaries,
models built through fairseq's registry on them (the task that only carries
dictionaries is the planner's, :mod:`fairseq_hybrid.planning.twin_model`),
and real fairseq batches of chosen lengths."""

from __future__ import annotations

from typing import Sequence

import torch
from fairseq.data import Dictionary, LanguagePairDataset

from ..planning.twin_model import StandInTask, VocabularyOfSize, build_registered

__all__ = ["make_dictionary", "build_model", "make_sample", "StandInTask", "VocabularyOfSize"]


def make_dictionary(size: int = 40) -> Dictionary:
    dictionary = Dictionary()
    for index in range(size):
        dictionary.add_symbol(f"w{index}")
    dictionary.finalize(padding_factor=1)
    return dictionary


def build_model(arch: str = "hybrid_lstm_tiny", src_dict=None, tgt_dict=None, **overrides):
    """A model of any registered architecture (``hybrid_lstm_*``, fairseq's
    ``lstm``) on small made-up dictionaries unless given."""
    model, _ = build_registered(arch, src_dict or make_dictionary(), tgt_dict or make_dictionary(37), **overrides)
    return model


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
