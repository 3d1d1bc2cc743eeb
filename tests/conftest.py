"""Shared builders: a small vocabulary, a stand-in task, real fairseq batches."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import fairseq_hybrid  # noqa: E402,F401  (registers everything)
from fairseq_hybrid.testing import StandInTask, build_model, make_dictionary, make_sample  # noqa: E402,F401

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


@pytest.fixture
def dictionaries():
    return make_dictionary(), make_dictionary(37)
