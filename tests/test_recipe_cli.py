"""The Tatoeba recipe refuses bad options before doing any work."""

import os
import subprocess

from conftest import REPO

RECIPE = os.path.join(REPO, "recipes", "tatoeba_ja_en", "run.sh")


def recipe(*args, tmp_path):
    return subprocess.run(["bash", RECIPE, "--work-dir", str(tmp_path / "work"), *args],
                          capture_output=True, text=True)


def test_unknown_option(tmp_path):
    result = recipe("--bogus", tmp_path=tmp_path)
    assert result.returncode == 2 and "unknown option --bogus" in result.stderr


def test_no_training_budget(tmp_path):
    result = recipe("--max-update", "0", "--steps", "train", tmp_path=tmp_path)
    assert result.returncode == 2 and "no training budget" in result.stderr
    assert not (tmp_path / "work" / "hybrid_lstm_base" / "checkpoints").exists()


def test_help_lists_the_options(tmp_path):
    result = recipe("--help", tmp_path=tmp_path)
    assert result.returncode == 0
    for option in ("--arch", "--budget", "--max-update", "--train-minutes", "--select", "--steps", "--run-name"):
        assert option in result.stdout


def test_bad_budget_and_selection(tmp_path):
    result = recipe("--budget", "huge", tmp_path=tmp_path)
    assert result.returncode == 2 and "--budget huge: choose default or long" in result.stderr
    result = recipe("--select", "first", tmp_path=tmp_path)
    assert result.returncode == 2 and "--select first: choose average, best or last" in result.stderr
    assert not (tmp_path / "work").exists()
