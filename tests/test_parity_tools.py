"""The two tools behind the README's BLEU-parity section:
``benchmarks/check_exactness.py`` (one step of a group against one device on
real batches) and ``benchmarks/bleu_parity.py`` (BLEU of several seeds per
side, summarised)."""

import json
import os
import re
import sys

from conftest import REPO, run

BENCHMARKS = os.path.join(REPO, "benchmarks")


def test_check_exactness_on_real_batches_with_dropout(binarized):
    """With the single-device masks, a 2-device group's gradients on real
    batches differ from one device's only by rounding; the script says so."""
    result = run(sys.executable, os.path.join(BENCHMARKS, "check_exactness.py"), binarized / "bin",
                 "--arch", "hybrid_lstm_tiny", "--devices", "cpu,cpu", "--dropout", "0.3",
                 "--dropout-masks", "single-device", "--batches", "2", "--max-tokens", "400")
    rows = re.findall(r"^\s+\d+\s+\d+ \|(.*)\|(.*)$", result.stdout, re.MULTILINE)
    assert len(rows) == 2, result.stdout
    worst = re.search(r"largest gradient difference: 1 thread (\S+), group (\S+)", result.stdout)
    assert worst and float(worst.group(2)) < 1e-5, result.stdout


def write_run(folder, bleu, chrf, ppl):
    os.makedirs(folder)
    with open(os.path.join(folder, "score.json"), "w") as f:
        json.dump([{"name": "BLEU", "score": bleu}, {"name": "chrF2", "score": chrf}], f)
    with open(os.path.join(folder, "train.log"), "w") as f:
        f.write(f"x | INFO | valid | epoch 002 | valid on 'valid' subset | loss 5 | nll_loss 4 | ppl {ppl + 9} | "
                f"wps 1 | num_updates 1000 | best_loss 5\n"
                f"x | INFO | valid | epoch 002 | valid on 'valid' subset | loss 5 | nll_loss 4 | ppl {ppl} | "
                f"wps 1 | num_updates 1500 | best_loss 5\n")


def test_bleu_parity_report(tmp_path):
    """Means, standard deviations and paired differences of finished runs;
    a seed whose run is missing is left out, not a crash."""
    work = tmp_path / "work"
    write_run(work / "parity" / "one_seed1", 5.0, 20.0, 25.0)
    write_run(work / "parity" / "one_seed2", 6.0, 22.0, 23.0)
    write_run(work / "parity" / "group_seed1", 4.0, 19.0, 27.0)
    write_run(work / "parity" / "group_seed2", 6.5, 23.0, 22.0)
    write_run(work / "parity" / "group-hybrid-dropout-masks-single-device_seed1", 1.0, 1.0, 1.0)
    out = tmp_path / "out"
    result = run(sys.executable, os.path.join(BENCHMARKS, "bleu_parity.py"), "--report-only", "--seeds", "1,2,3",
                 "--work-dir", work, "--out", out)
    report = json.load(open(out / "group.json"))
    one, group = report["summary"]["one"], report["summary"]["group"]
    assert one["seeds"] == [1, 2] and group["seeds"] == [1, 2]
    assert abs(one["BLEU"][0] - 5.5) < 1e-9 and abs(one["BLEU"][1] - 0.5 ** 0.5) < 1e-9
    assert abs(group["valid_ppl"][0] - 24.5) < 1e-9
    assert report["paired"]["group"]["BLEU differences"] == [-1.0, 0.5]
    assert abs(report["paired"]["group"]["mean"] + 0.25) < 1e-9
    assert "| group on cpu,cpu | 2 | 6.5 | 23.0 | 22.0 |" in result.stdout
    assert abs(report["paired"]["group"]["standard_error"] - 0.75) < 1e-9  # sd 1.5 / sqrt(2) / sqrt(2)
    assert "(mean -0.25, standard error 0.75)" in open(out / "group.md").read()

    # The group side with other options reads its own runs.
    run(sys.executable, os.path.join(BENCHMARKS, "bleu_parity.py"), "--report-only", "--seeds", "1",
        "--group-args", "--hybrid-dropout-masks single-device", "--work-dir", work, "--out", out)
    assert json.load(open(out / "group-hybrid-dropout-masks-single-device.json"))["paired"]["group"]["BLEU differences"] == [-4.0]
