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


def test_every_recipe_script_helps_with_its_comment_not_its_code():
    """``--help`` prints the script's opening comment, never its first line
    of code (``set -euo pipefail``)."""
    for script in ("tatoeba_ja_en/run.sh", "tatoeba_ja_en/translate.sh", "tatoeba_ja_en/evaluate.sh",
                   "aspec_ja_en/run.sh", "patent_ja_en/run.sh"):
        result = subprocess.run(["bash", os.path.join(REPO, "recipes", script), "--help"], capture_output=True,
                                text=True)
        assert result.returncode == 0, (script, result.stderr)
        assert "set -euo" not in result.stdout and "#!/" not in result.stdout, script
        assert len(result.stdout.splitlines()) >= 3, script


def test_the_training_settings_have_one_source():
    """run.sh and benchmarks/profile_training.py read the main job's
    settings from the same files; run.sh names no setting of its own."""
    from fairseq_hybrid.harness.measuring import read_args

    settings = read_args(os.path.join(REPO, "recipes", "tatoeba_ja_en", "training.args"))
    assert settings[settings.index("--adam-betas") + 1] == "(0.9, 0.98)" and "--skip-invalid-size-inputs-valid-test" in settings
    text = open(RECIPE).read()
    for option in ("--lr ", "--clip-norm", "--adam-betas", "--max-tokens", "--warmup-updates"):
        assert option not in text, option
    assert "training.args" in open(os.path.join(REPO, "benchmarks", "profile_training.py")).read()
