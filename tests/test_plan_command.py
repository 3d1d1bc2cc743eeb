"""fairseq-hybrid-plan: its predictions are the race's (one code path),
it reads the batch's shape from the data, prints the command that runs
the fastest, shows progress, and refuses bad input in one line with exit
status 2."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import BIN, REPO
from fairseq_hybrid.commands import plan
from fairseq_hybrid.forecasts.gpu_costs import GNMT_A100_TOKENS_PER_S
from fairseq_hybrid.candidates.race import race, set_costs_of
from fairseq_hybrid.planning.twin_model import uniform_batch
from fairseq_hybrid.planning.twin_model import twin_model


def test_the_plan_predicts_what_the_race_predicts(tmp_path, capsys):
    """On 4 GPUs at a global batch of 64 sentences (16 a batch, --update-freq
    4): the same candidates, steps and choices as race() on the model and
    cost set named, and the fastest marked with the command that runs it."""
    out = tmp_path / "plan.json"
    code = plan.main(["--gpus", "4", "--cost-set", "p100", "--micro-batches", "1,2", "--json", str(out), "--",
                      "fairseq-train", "-", "--arch", "hybrid_lstm_paper", "--batch-size", "16", "--update-freq", "4"])
    assert code == 0
    printed = capsys.readouterr()
    result = json.loads(out.read_text())
    model, cfg = twin_model("hybrid_lstm_paper", 32000)
    # every group twice: its cells queued by one process (threads) and by a process per device
    raced = {}
    for host_model, workers in (("queued", "threads"), ("per-device", "processes")):
        costs = set_costs_of("p100", model, cfg, uniform_batch(128, 50, 50), plan.HOST_COST, host_model,
                             GNMT_A100_TOKENS_PER_S)
        raced[workers] = race(model, cfg, costs, 4, 64, 50, 50, (1, 2), None)
    expected = [(row.name, row) for row in raced["processes"] if row.group_size == 1]
    for threads, processes in zip(raced["threads"], raced["processes"]):
        if threads.group_size > 1:
            expected += [(f"{threads.name}, threads", threads), (f"{processes.name}, processes", processes)]
    assert [row["name"] for row in result["rows"]] == [name for name, _ in expected]
    for mine, (_, theirs) in zip(result["rows"], expected):
        assert mine["step_ms"] == pytest.approx(theirs.step.total * 1e3, rel=1e-12)
        assert {key: mine.get(key) for key in theirs.choice} == theirs.choice
    fastest = min(expected, key=lambda pair: pair[1].step.total)[0]
    assert result["fastest"] == fastest
    assert f"{fastest}" in printed.out and "<- fastest" in printed.out
    command = printed.out.split("Run the fastest with:")[1].strip()
    assert ("--hybrid-workers processes" in command) == fastest.endswith(", processes")
    assert "--batch-size 64" in command and "--update-freq" not in command  # the global batch in one step
    assert "[plan] pricing a group of 4 at 64 sentences" in printed.err  # progress


def test_the_plan_reads_the_batch_shape_from_the_data(binarized, tmp_path, capsys):
    """With the data folder: fairseq's sampler at the command's
    --max-tokens gives the shape; DDP's command keeps the global batch
    (--max-tokens split over the GPUs), the group's takes it whole."""
    data, out = str(binarized / "bin"), tmp_path / "plan.json"
    train = [data, "--arch", "hybrid_lstm_tiny", "--max-tokens", "400", "--source-lang", "ja", "--target-lang", "en"]
    code = plan.main(["--gpus", "2", "--batches", "5", "--micro-batches", "1", "--json", str(out), "--",
                      "fairseq-train", *train])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert f"5 batches of {data} at --max-tokens 400" in printed.err
    result = json.loads(out.read_text())
    rows = {row["name"]: row for row in result["rows"]}
    args = plan.parse_training(train)
    ddp = plan.command_for(rows["DDP on 2"], train, args, result["sentences"])
    group = plan.command_for(rows["one group of 2, threads"], train, args, result["sentences"])
    assert ddp.endswith("--max-tokens 200 --distributed-world-size 2")
    assert "--max-tokens 400 --hybrid-devices cuda:0,cuda:1" in group
    fastest = plan.command_for(rows[result["fastest"]], train, args, result["sentences"])
    assert printed.out.rstrip().endswith(fastest)  # the command printed is the fastest's


BASE = ["-", "--arch", "hybrid_lstm_base", "--batch-size", "8"]
BAD = {
    "--gpus 0": (["--gpus", "0"], ["-", "--arch", "hybrid_lstm_base", "--batch-size", "8"], "--gpus 0: at least 1"),
    "unknown cost set": (["--gpus", "2", "--cost-set", "h100"], ["-", "--arch", "hybrid_lstm_base", "--batch-size", "8"],
                         "--cost-set h100: unknown"),
    "missing data folder": (["--gpus", "2"], ["nowhere", "--arch", "hybrid_lstm_base", "--batch-size", "8"],
                            "nowhere: no such data folder"),
    "not a hybrid model": (["--gpus", "2"], ["-", "--arch", "lstm", "--batch-size", "8"],
                           "a hybrid group trains hybrid_lstm models"),
    "an option a group refuses": (["--gpus", "2"], ["-", "--arch", "hybrid_lstm_base", "--batch-size", "8",
                                                    "--pipeline-model-parallel"], "--pipeline-model-parallel"),
    "an option fairseq refuses": (["--gpus", "2"], ["-", "--arch", "hybrid_lstm_base", "--bogus", "3"],
                                  "fairseq-train refuses the command: unrecognized arguments: --bogus 3"),
    "a batch smaller than the GPUs": (["--gpus", "4"], ["-", "--arch", "hybrid_lstm_base", "--batch-size", "2"],
                                      "a global batch of 2 sentences cannot be split over 4 GPUs"),
    "an empty command": (["--gpus", "2"], [], "the fairseq-train command after -- is empty"),
    "no batch size": (["--gpus", "2"], ["-", "--arch", "hybrid_lstm_base"], "give --max-tokens or --batch-size"),
    "micro-batches of 0": (["--gpus", "2", "--micro-batches", "1,0"], BASE, "'1,0': whole numbers of at least 1"),
    "micro-batches not numbers": (["--gpus", "2", "--micro-batches", "some"], BASE,
                                  "'some': comma-separated whole numbers"),
    "one sentence length": (["--gpus", "2", "--sentence-length", "50"], BASE, "--sentence-length takes SOURCE,TARGET"),
    "no batches": (["--gpus", "2", "--batches", "0"], BASE, "--batches 0 --rounds 3: at least 1 each"),
    "no rounds": (["--gpus", "2", "--rounds", "0"], BASE, "--batches 50 --rounds 0: at least 1 each"),
    "a speed below 0": (["--gpus", "2", "--one-device-tokens-per-s", "-5"], BASE,
                        "--one-device-tokens-per-s must be above 0"),
    "a missing host cost": (["--gpus", "2", "--host-cost", "nowhere.json"], BASE,
                            "--host-cost nowhere.json: no such file"),
    "a missing cost file": (["--gpus", "2", "--cost-file", "nowhere.json"], BASE, "--cost-file nowhere.json"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_gets_one_line_and_exit_status_2(case):
    own, train, message = BAD[case]
    check_refused(own, train, message)


def check_refused(own, train, message):
    result = subprocess.run([os.path.join(BIN, "fairseq-hybrid-plan"), *own, "--", "fairseq-train", *train],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fairseq-hybrid-plan: ") and message in lines[0], result.stderr


def test_data_folders_it_cannot_draw_batches_from_are_refused(binarized, tmp_path):
    """A folder with nothing in it, one with the dictionaries but no train
    split, and a --max-tokens below a sentence's length: one line each,
    never fairseq's traceback."""
    empty, dictionaries = tmp_path / "empty", tmp_path / "dictionaries"
    empty.mkdir()
    dictionaries.mkdir()
    for lang in ("ja", "en"):
        shutil.copy(binarized / "bin" / f"dict.{lang}.txt", dictionaries)
    pair = ["--source-lang", "ja", "--target-lang", "en"]
    check_refused(["--gpus", "2"], [str(empty), "--arch", "hybrid_lstm_tiny", "--batch-size", "8"],
                  f"{empty}: no language pair found")
    check_refused(["--gpus", "2"], [str(empty), "--arch", "hybrid_lstm_tiny", "--batch-size", "8", *pair],
                  f"{empty}: no dict.ja.txt")
    check_refused(["--gpus", "2"], [str(dictionaries), "--arch", "hybrid_lstm_tiny", "--max-tokens", "400", *pair],
                  f"{dictionaries}: no train split to draw batches from")
    check_refused(["--gpus", "2"], [str(binarized / "bin"), "--arch", "hybrid_lstm_tiny", "--max-tokens", "1"],
                  "fairseq's batch sampler refuses the command: Sentences lengths should not exceed max_tokens=1")


@pytest.mark.parametrize("cost_file, sentences, printed", [
    ("cost_file_h200.json", 128, "plan_h200_b128.txt"),
    ("cost_file_h200_joined_softmax.json", 128, "plan_h200_joined_softmax_b128.txt"),
    ("cost_file_h200_joined_softmax.json", 512, "plan_h200_joined_softmax_b512.txt"),
])
def test_the_committed_plans_are_what_the_plan_prints(cost_file, sentences, printed):
    """The plans docs/ quotes, printed again by today's code to the last
    digit (the checkout's own path in the command aside)."""
    result = subprocess.run([os.path.join(BIN, "fairseq-hybrid-plan"), "--gpus", "4", "--cost-file",
                             os.path.join("docs", "bench", cost_file), "--", "fairseq-train", "-", "--arch",
                             "hybrid_lstm_paper", "--batch-size", str(sentences)],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]

    def without_path(text):
        return re.sub(r"--user-dir \S+", "--user-dir USER_DIR", text)

    with open(os.path.join(REPO, "docs", "bench", printed)) as file:
        assert without_path(result.stdout) == without_path(file.read())


def test_a_command_is_needed_after_the_double_dash():
    result = subprocess.run([sys.executable, "-m", "fairseq_hybrid.commands.plan", "--gpus", "2"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "give your fairseq-train command after --" in result.stderr


def test_group_sizes_the_model_cannot_hold_are_left_out(capsys):
    """hybrid_lstm_base has 2 + 2 layers: on 4 GPUs the plan prices DDP and
    two groups of two, and no group of four (the engine would refuse it)."""
    code = plan.main(["--gpus", "4", "--micro-batches", "1", "--", "fairseq-train", "-", "--arch", "hybrid_lstm_base",
                      "--batch-size", "32"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "2 groups of 2 under DDP" in printed.out and "DDP on 4" in printed.out
    assert "group of 4" not in printed.out


@pytest.mark.parametrize("argv", [["--help"], ["calibrate", "--help"]])
def test_the_help_is_plain_words_and_its_usage_shows_the_command_and_calibrate(argv):
    """A newcomer reads --help in a terminal: no reST markup, and a usage
    line that shows where the fairseq-train command goes (and, for the plan,
    that calibrate exists)."""
    result = subprocess.run([os.path.join(BIN, "fairseq-hybrid-plan"), *argv], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    usage = result.stdout.split("\n\n")[0]
    assert "-- fairseq-train DATA" in usage
    assert ("calibrate DEVICES --out FILE" in usage) and (argv[0] == "calibrate" or "--gpus N" in usage)
    markup = [mark for mark in ("``", ":func:", ":mod:", ":class:", ":meth:") if mark in result.stdout]
    assert not markup, markup
    # calibrate is for GPUs as well as CPU devices
    assert "cuda:0,cuda:1" in result.stdout


def test_a_scaled_cost_file_is_printed_as_scaled_not_as_a_gpus_own():
    """docs/bench/cost_file_h200_joined_softmax.json is the H200's file with
    its host time per call scaled on a CPU: the plan's header says so, with
    the ratios and the commit that holds the scripts that made it."""
    from fairseq_hybrid.forecasts.cost_file import load, provenance

    scaled = provenance(load(os.path.join(REPO, "docs", "bench", "cost_file_h200_joined_softmax.json")))
    assert scaled.startswith("scaled, not measured: docs/bench/cost_file_h200.json (NVIDIA H200")
    assert "attention_softmax x 1.923, lstm x 0.939" in scaled and scaled.endswith("as of 70ef43e")
    measured = provenance(load(os.path.join(REPO, "docs", "bench", "cost_file_h200.json")))
    assert measured == "NVIDIA H200, torch 2.11.0+cu130, benchmarks/gpu_check.py calibrate, 2026-12-04"
