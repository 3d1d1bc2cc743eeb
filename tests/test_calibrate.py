"""``fairseq-hybrid-plan calibrate`` (fairseq_hybrid/commands/calibrate.py):
CPU devices calibrated once on the user's command, written as the one
cost-file format that ``--hybrid-cost-model`` and ``fairseq-hybrid-plan
--cost-file`` both read; bad input refused in one line."""

import json
import os
import subprocess

import pytest

from conftest import BIN
from fairseq_hybrid.commands import plan
from fairseq_hybrid.forecasts.cost_file import CostFileError, register
from fairseq_hybrid.forecasts.race import race
from fairseq_hybrid.forecasts.workload import workload
from fairseq_hybrid.planning.schedule_simulator import CostModel
from fairseq_hybrid.timing.cpu_calibration import cpu_costs
from fairseq_hybrid.train_command import parse_training

TINY = ["--arch", "hybrid_lstm_tiny", "--max-tokens", "400", "--source-lang", "ja", "--target-lang", "en"]


@pytest.mark.slow
def test_one_calibration_is_read_by_the_plan_and_by_the_group(binarized, tmp_path, capsys):
    data, costs, planned = str(binarized / "bin"), tmp_path / "costs.json", tmp_path / "plan.json"
    assert plan.main(["calibrate", "cpu,cpu", "--batches", "2", "--out", str(costs), "--", "fairseq-train", data,
                      *TINY]) == 0
    printed = capsys.readouterr()
    assert "[calibrate] calibrating 2 CPU devices" in printed.err and f"wrote {costs}" in printed.out
    written = json.loads(costs.read_text())
    assert written["kind"] == "cpu" and written["devices"] == ["cpu", "cpu"] and data in written["command"]
    assert written["cost_model"] == written["calibration"]["one_thread"]
    # --hybrid-cost-model reads the cells' cost model from it
    assert CostModel.load(str(costs)).__dict__ == CostModel(**written["cost_model"]).__dict__
    # the plan prices CPU devices with it, as --measure would have, without measuring again
    assert plan.main(["--gpus", "2", "--cost-file", str(costs), "--micro-batches", "1", "--json", str(planned), "--",
                      "fairseq-train", data, *TINY]) == 0
    printed = capsys.readouterr()
    assert "[measure]" not in printed.err and "[calibrate]" not in printed.err
    assert f"priced with the calibration in {costs} ({written['measured_on']})" in printed.out
    result = json.loads(planned.read_text())
    load = workload(parse_training([data, *TINY]), plan.build_parser().parse_args(["--gpus", "2", "--batches", "50"]))
    group, rank = cpu_costs(written["calibration"])
    rows = race(load.model, load.cfg, group, 2, load.sentences, load.source, load.target, (1,), None, rank_cost=rank)
    tokens = result["sentences"] * (result["source"] + result["target"])
    assert [row["tokens_per_s"] for row in result["rows"]] == pytest.approx(
        [tokens / row.step.total for row in rows], rel=1e-12)
    # a GPU forecast refuses it
    with pytest.raises(CostFileError, match="prices CPU devices only"):
        register(str(costs))
    # priced for as many devices as it calibrated
    wrong = subprocess.run([os.path.join(BIN, "fairseq-hybrid-plan"), "--gpus", "4", "--cost-file", str(costs), "--",
                            "fairseq-train", data, *TINY], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "a calibration of 2 CPU devices: give --gpus 2" in wrong.stderr


BAD = {  # OUT: the cost file's path, DATA: the fixture's data folder
    "gpus": (["cuda:0,cuda:1", "--out", "OUT", "--", "fairseq-train", "DATA"], "calibrate measures CPU devices"),
    "no data": (["cpu,cpu", "--out", "OUT", "--", "fairseq-train", "-"], "give the data folder, not -"),
    "no command": (["cpu,cpu", "--out", "OUT"], "give your fairseq-train command after --"),
    "no --out": (["cpu,cpu", "--", "fairseq-train", "DATA"], "the following arguments are required: --out"),
    "not a device": (["cpu,gpu", "--out", "OUT", "--", "fairseq-train", "DATA"], "calibrate: 'gpu' is not a device"),
    "accumulated steps": (["cpu,cpu", "--out", "OUT", "--", "fairseq-train", "DATA", "--update-freq", "2"],
                          "give --update-freq 1"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_gets_one_line_and_exit_status_2(case, binarized, tmp_path):
    argv, message = BAD[case]
    names = {"OUT": str(tmp_path / "costs.json"), "DATA": str(binarized / "bin")}
    argv = [names.get(token, token) for token in argv] + (TINY if "--" in argv else [])
    result = subprocess.run([os.path.join(BIN, "fairseq-hybrid-plan"), "calibrate", *argv],
                            capture_output=True, text=True, timeout=120)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and result.stdout == "" and len(lines) == 1, result.stderr
    assert lines[0].startswith("fairseq-hybrid-plan calibrate: ") and message in lines[0], lines[0]
    assert not (tmp_path / "costs.json").exists()


def test_calibrate_says_how_to_use_it():
    result = subprocess.run([os.path.join(BIN, "fairseq-hybrid-plan"), "calibrate", "--help"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("usage: fairseq-hybrid-plan calibrate")
    assert "--hybrid-cost-model" in result.stdout
