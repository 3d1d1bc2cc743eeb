"""Using a trained run: checkpoint averaging, translating from the shell
(recipes/tatoeba_ja_en/translate.sh) and from Python
(fairseq_hybrid.translation.hub.load_translator), on a small run over the shipped
Tatoeba fixture laid out as the recipe lays out its work folder."""

import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO, run

pytestmark = pytest.mark.slow
AVERAGE = [sys.executable, "-m", "fairseq_hybrid.commands.average"]


def test_averaging(trained, tmp_path):
    work, hybrid, lstm = trained
    first, second = hybrid / "checkpoint_1_6.pt", hybrid / "checkpoint_1_12.pt"
    run(*AVERAGE, first, "--output", tmp_path / "one.pt", cwd=REPO)
    one, original = torch.load(tmp_path / "one.pt"), torch.load(first)
    assert one["model"].keys() == original["model"].keys()
    for name, value in original["model"].items():
        assert torch.equal(one["model"][name], value), name
    assert "last_optimizer_state" not in one

    run(*AVERAGE, "--last", "2", hybrid, "--output", tmp_path / "two.pt", cwd=REPO)
    two, later = torch.load(tmp_path / "two.pt"), torch.load(second)
    for name, value in original["model"].items():
        torch.testing.assert_close(two["model"][name], (value.double() + later["model"][name].double()).div(2).float())
    assert two["optimizer_history"] == later["optimizer_history"]  # the rest comes from the last input

    refused = subprocess.run([*AVERAGE, first, lstm / "checkpoint_1_12.pt", "--output", tmp_path / "x.pt"],
                             capture_output=True, text=True, cwd=REPO)
    assert refused.returncode == 2 and not (tmp_path / "x.pt").exists()
    assert "is a lstm model" in refused.stderr and "a hybrid_lstm_tiny model" in refused.stderr
    missing = subprocess.run([*AVERAGE, "--last", "5", hybrid, "--output", tmp_path / "y.pt"],
                             capture_output=True, text=True, cwd=REPO)
    assert missing.returncode == 2 and "fewer than --last 5" in missing.stderr


def test_translate_from_the_shell(trained):
    work, _, _ = trained
    script = os.path.join(REPO, "recipes", "tatoeba_ja_en", "translate.sh")
    translate = ("bash", script, "--run", work / "tiny")
    result = run(*translate, input="ひとつ質問してもいいですか。\n\n彼は医者です。\n  \nこれ以上考えても無駄だ。\n")
    lines = result.stdout.split("\n")
    assert len(lines) == 6 and lines[5] == "", result.stdout
    assert [bool(line) for line in lines[:5]] == [True, False, True, False, True], result.stdout  # blank stays blank
    assert "▁" not in result.stdout  # sentencepiece removed
    assert run(*translate, input="\n \n").stdout == "\n\n"
    bad = subprocess.run(["bash", script, "--run", str(work / "nothing")], capture_output=True, text=True, input="")
    assert bad.returncode == 2 and "no run at" in bad.stderr


def test_translate_from_python(trained, tmp_path):
    from fairseq_hybrid.translation.hub import find_checkpoint, load_translator

    work, _, _ = trained
    assert find_checkpoint(str(work / "tiny")).endswith("checkpoint_best.pt")
    translator = load_translator(str(work / "tiny"), beam=2)
    single = translator.translate("ひとつ質問してもいいですか。")
    several = translator.translate(["彼は医者です。", "これ以上考えても無駄だ。"])
    assert isinstance(single, str) and single and "▁" not in single
    assert len(several) == 2 and all(several)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        find_checkpoint(str(tmp_path))
