"""Shared builders: a small vocabulary, a stand-in task, real fairseq batches."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import fairseq_hybrid  # noqa: E402,F401  (registers everything)
from fairseq_hybrid.harness.stand_ins import StandInTask, build_model, make_dictionary, make_sample  # noqa: E402,F401

FIXTURE = os.path.join(REPO, "tests", "data", "tatoeba_ja_en_2k")
BIN = os.path.dirname(sys.executable)
USER_DIR = os.path.join(REPO, "fairseq_hybrid")


def pytest_addoption(parser):
    parser.addoption("--benchmarks", action="store_true",
                     help="also run the tests marked benchmark (the benchmark scripts' smoke runs; minutes)")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``benchmark`` keep the default run near a quarter of an
    hour on a 2-core machine: they are skipped, saying how to run them."""
    if config.getoption("--benchmarks"):
        return
    skip = pytest.mark.skip(reason="a benchmark script's smoke run (or a slow run another test covers): "
                                   "pytest --benchmarks")
    for item in items:
        if "benchmark" in item.keywords:
            item.add_marker(skip)


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, ended and not yet
    reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def children(pid: int) -> dict:
    """The processes whose parent is ``pid``, with their command lines."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as file:
                parent = int(file.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline") as file:
                command = file.read().replace("\0", " ")
        except (FileNotFoundError, ProcessLookupError):
            continue
        if parent == pid and alive(int(entry)):
            found[int(entry)] = command
    return found


def descendants(pid: int) -> dict:
    """The processes below ``pid`` (children, theirs, ...), with their command lines."""
    found = {}
    for child, command in children(pid).items():
        found[child] = command
        found.update(descendants(child))
    return found


def assert_children_end_with(process, how, matching=lambda command: True, running=2.0, what="a child",
                             among=children, ready=bool) -> dict:
    """Wait for ``process``'s children (``among``: or its descendants)
    whose command line ``matching`` takes, until ``ready`` takes them, let
    them run ``running`` seconds, send ``how`` to ``process``, and assert
    that each of them ends within 10 s (any left is killed).  Returns them."""
    import signal
    import time

    seen = {}
    try:
        deadline = time.time() + 60
        while not ready(seen) and time.time() < deadline and process.poll() is None:
            seen = {pid: command for pid, command in among(process.pid).items() if matching(command)}
            time.sleep(0.2)
        assert ready(seen), f"no {what} seen: {seen}"
        time.sleep(running)
        assert all(alive(pid) for pid in seen)
        process.send_signal(how)
        process.wait(timeout=30)
        deadline = time.time() + 10
        while any(alive(pid) for pid in seen) and time.time() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in seen if alive(pid)], f"{what} outlived its parent: {seen}"
    finally:
        if process.poll() is None:
            process.kill()
        for pid in seen:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    return seen


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


def train_tiny_run(work, name, *options):
    save_dir = work / name / "checkpoints"
    run(os.path.join(BIN, "fairseq-train"), work / "bin", "--user-dir", USER_DIR, "--cpu",
        "--label-smoothing", "0.1", "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "1000", "--max-update", "12",
        "--save-dir", save_dir, "--no-epoch-checkpoints", "--seed", "3", "--no-progress-bar",
        "--save-interval-updates", "6", "--keep-interval-updates", "2", *options)
    return save_dir


@pytest.fixture(scope="session")
def trained(binarized):
    """A hybrid_lstm_tiny run (checkpoints at 6 and 12 updates) and a
    fairseq lstm run, in the recipe's layout (WORK/bin, WORK/spm, WORK/RUN):
    the models that translating is tested with."""
    hybrid = train_tiny_run(binarized, "tiny", "--arch", "hybrid_lstm_tiny", "--criterion", "hybrid_cross_entropy")
    lstm = train_tiny_run(binarized, "lstm", "--arch", "lstm", "--encoder-embed-dim", "16", "--encoder-hidden-size", "16",
                 "--decoder-embed-dim", "16", "--decoder-hidden-size", "16", "--decoder-out-embed-dim", "16",
                 "--criterion", "label_smoothed_cross_entropy")
    return binarized, hybrid, lstm
