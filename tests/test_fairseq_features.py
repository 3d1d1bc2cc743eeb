"""fairseq features a user of hybrid_lstm relies on, through the real
command lines on the shipped Tatoeba fixture."""

import os
import re

import pytest
import torch

from conftest import BIN, USER_DIR, run

pytestmark = pytest.mark.slow


def train(work, save_dir, max_update, *extra):
    result = run(
        os.path.join(BIN, "fairseq-train"), work / "bin", "--user-dir", USER_DIR, "--cpu",
        "--arch", "hybrid_lstm_tiny", "--criterion", "hybrid_cross_entropy", "--optimizer", "adam",
        "--max-tokens", "600", "--max-update", max_update, "--save-dir", save_dir, "--no-epoch-checkpoints",
        "--seed", "3", "--no-progress-bar", "--log-format", "simple", *extra,
    )
    return result.stdout + result.stderr


@pytest.mark.parametrize("group", [[], ["--hybrid-devices", "cpu,cpu"]], ids=["one device", "group"])
def test_patience_survives_a_restart(binarized, tmp_path, group):
    """fairseq issue 3531: --patience's count was lost on restart.  With a
    learning rate too small to change anything, every validation after the
    first fails to improve: a run stopped at update 4 (one failure counted)
    and resumed must stop at update 8 (three failures), as an uninterrupted
    run does, not at 12."""
    options = ["--lr", "1e-30", "--patience", "3", "--validate-interval-updates", "2", "--save-interval-updates", "2",
               *group]
    train(binarized, tmp_path / "run", "4", *options)
    state = torch.load(tmp_path / "run" / "checkpoint_last.pt")
    assert state["extra_state"]["patience"]["num_runs"] == 1
    log = train(binarized, tmp_path / "run", "40", *options)
    assert "early stop since valid performance hasn't improved for last 3 runs" in log
    assert re.findall(r"num_updates (\d+)", log)[-1] == "8", log[-3000:]
