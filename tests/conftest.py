"""Shared builders: a small vocabulary, a stand-in task, real fairseq batches."""

import argparse
import os
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import fairseq_hybrid  # noqa: E402,F401  (registers everything)
from fairseq.data import Dictionary, LanguagePairDataset  # noqa: E402
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY  # noqa: E402

FIXTURE = os.path.join(REPO, "tests", "data", "tatoeba_ja_en_2k")
BIN = os.path.dirname(sys.executable)
USER_DIR = os.path.join(REPO, "fairseq_hybrid")


def run(*args, **kwargs):
    """Run a command line; fail the test with its output's tail if it fails."""
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{args[0]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="session")
def binarized(tmp_path_factory):
    """The shipped Tatoeba fixture through sentencepiece and fairseq-preprocess."""
    work = tmp_path_factory.mktemp("e2e")
    run(sys.executable, os.path.join(REPO, "scripts", "spm_encode_parallel.py"), "--raw-dir", FIXTURE,
        "--out-dir", work / "spm", "--src", "ja", "--tgt", "en", "--train-model", "--vocab-size", "2000")
    run(os.path.join(BIN, "fairseq-preprocess"), "--source-lang", "ja", "--target-lang", "en", "--joined-dictionary",
        "--trainpref", work / "spm" / "train", "--validpref", work / "spm" / "valid",
        "--testpref", work / "spm" / "test", "--destdir", work / "bin", "--workers", "1")
    return work


def make_dictionary(size=40):
    dictionary = Dictionary()
    for index in range(size):
        dictionary.add_symbol(f"w{index}")
    dictionary.finalize(padding_factor=1)
    return dictionary


class StandInTask:
    """What ``build_model`` and the criteria read from a translation task."""

    def __init__(self, src_dict, tgt_dict):
        self.source_dictionary = src_dict
        self.target_dictionary = tgt_dict


def build_model(arch="hybrid_lstm_tiny", src_dict=None, tgt_dict=None, **overrides):
    src_dict = src_dict or make_dictionary()
    tgt_dict = tgt_dict or make_dictionary(37)
    cfg = argparse.Namespace(arch=arch, **overrides)
    ARCH_CONFIG_REGISTRY[arch](cfg)
    model = ARCH_MODEL_REGISTRY[arch].build_model(cfg, StandInTask(src_dict, tgt_dict))
    return model


def make_sample(src_dict, tgt_dict, src_lengths, tgt_lengths, seed=0):
    """A collated fairseq batch (left-padded source, right-padded target)."""
    generator = torch.Generator().manual_seed(seed)

    def sentence(dictionary, length):
        ids = torch.randint(dictionary.nspecial, len(dictionary), (length,), generator=generator)
        return torch.cat([ids, torch.tensor([dictionary.eos()])])

    src = [sentence(src_dict, n) for n in src_lengths]
    tgt = [sentence(tgt_dict, n) for n in tgt_lengths]
    dataset = LanguagePairDataset(src, torch.tensor([len(s) for s in src]), src_dict, tgt, torch.tensor([len(t) for t in tgt]), tgt_dict)
    return dataset.collater([dataset[i] for i in range(len(src))])


@pytest.fixture
def dictionaries():
    return make_dictionary(), make_dictionary(37)
