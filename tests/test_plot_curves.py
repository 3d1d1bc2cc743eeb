"""The recipe's picture of a run: what it reads from train.log and that it
draws one run beside its peer."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "recipes", "tatoeba_ja_en", "plot_curves.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import plot_curves  # noqa: E402


def train_line(update: int, wall: int) -> str:
    return (f"2026-12-03 06:19:03 | INFO | train_inner | epoch 001:     50 / 1356 loss=11.124, nll_loss=10.796, "
            f"ppl=1778, wps=1836, ups=1.09, wpb=1688, bsz=141.4, num_updates={update}, lr=0.00059, "
            f"gnorm=1.021, clip=40, train_wall=46, wall={wall}\n")


def valid_line(update: int, loss: float, bleu: float = None) -> str:
    extra = f" | bleu {bleu}" if bleu is not None else ""
    return (f"2026-12-03 06:22:03 | INFO | valid | epoch 001 | valid on 'valid' subset | loss {loss} | "
            f"nll_loss 4.1 | ppl 17.5{extra} | wps 9000 | wpb 1700 | bsz 140 | num_updates {update} | "
            f"best_loss {loss}\n")


def write_run(folder, lines):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "train.log"), "w") as f:
        f.writelines(lines)
    return str(folder)


def test_reads_loss_bleu_and_minutes_and_a_resumed_run_replaces_repeats(tmp_path):
    run = write_run(tmp_path / "hybrid_lstm_base", [
        train_line(200, 120), valid_line(200, 7.5, 3.25),
        train_line(400, 240), valid_line(400, 6.0, 8.5),
        # interrupted after 400, resumed from checkpoint_last at 400: fairseq
        # repeats the validation and its wall meter goes on from the checkpoint
        train_line(400, 250), valid_line(400, 5.9, 8.75),
        train_line(600, 371), valid_line(600, 5.5),
    ])
    curve = plot_curves.read_curve(run)
    assert curve.name == "hybrid_lstm_base"
    assert curve.updates == [200, 400, 600]
    assert curve.loss == {200: 7.5, 400: 5.9, 600: 5.5}
    assert curve.bleu == {200: 3.25, 400: 8.75}
    assert curve.minutes == pytest.approx({200: 2.0, 400: 250 / 60, 600: 371 / 60})


def test_a_log_without_validation_is_an_error_naming_it(tmp_path):
    run = write_run(tmp_path / "empty", [train_line(50, 30)])
    result = subprocess.run([sys.executable, SCRIPT, run], capture_output=True, text=True)
    assert result.returncode == 2
    assert "no validation lines" in result.stderr and "train.log" in result.stderr


def test_draws_the_run_beside_its_peer_and_skips_a_missing_one(tmp_path):
    ours = write_run(tmp_path / "hybrid_lstm_base", [train_line(200, 100), valid_line(200, 7.0, 4.0),
                                                     train_line(400, 200), valid_line(400, 6.0, 9.0)])
    peer = write_run(tmp_path / "lstm", [train_line(200, 180), valid_line(200, 7.4),
                                         train_line(400, 360), valid_line(400, 6.4)])
    out = tmp_path / "curves.png"
    result = subprocess.run([sys.executable, SCRIPT, ours, "--compare", peer, str(tmp_path / "absent"),
                             "--out", str(out)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "hybrid_lstm_base: 2 validations, lowest loss 6.000 at update 400" in result.stdout
    assert "lstm: 2 validations, lowest loss 6.400 at update 400" in result.stdout
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_recipes_plot_step_draws_the_run_beside_the_peer(tmp_path):
    """run.sh --steps plot: the default run's curves.png with fairseq's lstm
    run of the same work folder beside it."""
    work = tmp_path / "work"
    write_run(work / "hybrid_lstm_base", [train_line(200, 100), valid_line(200, 7.0)])
    write_run(work / "lstm", [train_line(200, 190), valid_line(200, 7.3)])
    result = subprocess.run(["bash", os.path.join(REPO, "recipes", "tatoeba_ja_en", "run.sh"), "--work-dir",
                             str(work), "--steps", "plot"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "hybrid_lstm_base: 1 validations" in result.stdout and "lstm: 1 validations" in result.stdout
    assert os.path.getsize(work / "hybrid_lstm_base" / "curves.png") > 1000
