"""benchmarks/time_to_bleu.py: sentences to the main job's loss read off two
runs' validations, and minutes to it from the plan's predicted speeds."""

import json
import os
import sys

import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import time_to_bleu  # noqa: E402


def write_run(folder, per_update, validations, bleu):
    folder.mkdir()
    lines = [f"2026-12-04 10:00:00 | INFO | train_inner | epoch 001:     50 / 100 loss=9.0, bsz={per_update}, "
             f"num_updates=50, wall=10"]
    lines += [f"2026-12-04 10:01:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss {loss} | "
              f"nll_loss 1.0 | num_updates {update} | best_loss {loss}" for update, loss in validations]
    (folder / "train.log").write_text("\n".join(lines) + "\n")
    (folder / "score.json").write_text(json.dumps([{"name": "BLEU", "score": bleu}, {"name": "chrF2", "score": 40}]))
    return str(folder)


def test_sentences_to_reach_a_loss():
    losses = {200: 6.0, 400: 5.0, 600: 4.0}
    assert time_to_bleu.sentences_to_reach(losses, 10, 4.5) == pytest.approx(500 * 10)  # half-way 400 -> 600
    assert time_to_bleu.sentences_to_reach(losses, 10, 6.5) == 200 * 10
    assert time_to_bleu.sentences_to_reach(losses, 10, 3.0) is None


def test_time_to_the_main_job_s_loss(tmp_path):
    """The x4 run reaches the x1 run's lowest loss after more sentences;
    each row's minutes are those sentences over its predicted speed."""
    x1 = write_run(tmp_path / "x1", 100, [(200, 6.0), (400, 5.0), (600, 4.0)], 20.5)
    x4 = write_run(tmp_path / "x4", 400, [(50, 6.2), (100, 5.2), (150, 4.4), (200, 3.9)], 19.0)
    assert time_to_bleu.main([x1, x4, "--data", "-", "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "time_to_bleu.json").read_text())
    assert report["target_validation_loss"] == 4.0 and report["bleu"] == {"x1": 20.5, "x4": 19.0}
    assert report["sentences_to_target"]["x1"] == pytest.approx(600 * 100)
    assert report["sentences_to_target"]["x4"] == pytest.approx((150 + 0.8 * 50) * 400)
    systems = [row["system"] for row in report["rows"]]
    assert systems[0].startswith("DDP on 4, 4 x") and "2 groups of 2 under DDP, processes, the main job's batch" in systems
    for row in report["rows"]:
        sentences = report["sentences_to_target"]["x4" if row["system"].startswith("DDP on 4, 4 x") else "x1"]
        assert row["minutes"] == pytest.approx(sentences / row["sentences_per_s"] / 60)
    assert "| way of training |" in (tmp_path / "out" / "time_to_bleu.md").read_text()
