"""scripts/training_pace.py: fairseq-train's output passes through
unchanged, with a pace line at update 100 and every 500 updates after."""

import datetime
import os
import subprocess
import sys

from conftest import REPO

SCRIPT = os.path.join(REPO, "scripts", "training_pace.py")


def test_the_pace_line_says_when_training_ends():
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    from training_pace import pace_line

    assert (pace_line(0.5, 600, datetime.datetime(2026, 1, 1, 12, 0))
            == "[pace] 0.50 s per update here; training ends in about 5 minutes (at 12:05)")


def test_output_passes_through_with_a_pace_line_at_update_100_then_every_500():
    lines = [f"2026-12-02 15:00:00 | INFO | train_inner | epoch 001:  {n} / 1167 loss=9.1, num_updates={n}, "
             f"lr=0.001, wall={n}\n" for n in range(50, 1301, 50)]
    feed = "INFO | fairseq_cli.train | start\n" + "".join(lines)
    result = subprocess.run([sys.executable, SCRIPT, "--max-update", "1300"], input=feed, capture_output=True,
                            text=True, check=True)
    out = result.stdout.splitlines(keepends=True)
    assert "".join(line for line in out if not line.startswith("[pace]")) == feed
    after = [out[i - 1] for i, line in enumerate(out) if line.startswith("[pace]")]
    assert [line.split("num_updates=")[1].split(",")[0] for line in after] == ["100", "600", "1100"]
    assert all("s per update here; training ends in about" in line for line in out if line.startswith("[pace]"))
