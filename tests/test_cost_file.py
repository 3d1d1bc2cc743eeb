"""A cost file (what one GPU measured) is a cost set the simulator and the
planner price with: holding the published figures it predicts what the
published set predicts, its own LSTM curve prices cells above the
reference batch, and a bad file is refused in one line."""

import json

import pytest

from fairseq_hybrid.commands import plan
from fairseq_hybrid.forecasts import cost_file, gpu_costs
from fairseq_hybrid.forecasts.gpu_costs import GNMT_A100_TOKENS_PER_S, lstm_batch_curve

COMMAND = ["--", "fairseq-train", "-", "--arch", "hybrid_lstm_paper", "--batch-size", "16", "--update-freq", "4"]


def published_rows():
    """The published LSTM curve in the shape gpu_check measures it."""
    curve, _ = lstm_batch_curve()
    batches = sorted({batch for points in curve.values() for batch, _ in points})
    return {"hidden": 1024, "rows": {str(batch): {phase: dict(curve[phase])[batch] for phase in curve}
                                     for batch in batches}}


def write_file(path, rows=None, tokens_per_s=GNMT_A100_TOKENS_PER_S):
    with open(plan.HOST_COST) as file:
        host = json.load(file)
    return cost_file.write(str(path), base="a100", tokens_per_s=tokens_per_s, lstm_seconds=rows or published_rows(),
                           host_cost=host, measured_on="a test: the a100 set's own figures")


def planned(argv, tmp_path, name):
    out = tmp_path / f"{name}.json"
    assert plan.main([*argv, "--micro-batches", "1,2", "--json", str(out), *COMMAND]) == 0
    return json.loads(out.read_text())


def test_a_file_of_the_published_figures_predicts_what_the_published_set_does(tmp_path, capsys):
    """The a100 set's curve, tokens/s and host-cost report written as a cost
    file: the plan's rows equal the a100 set's step for step."""
    path = tmp_path / "a100_again.json"
    write_file(path)
    by_file = planned(["--gpus", "4", "--cost-file", str(path)], tmp_path, "file")
    by_set = planned(["--gpus", "4", "--cost-set", "a100"], tmp_path, "set")
    assert [row["name"] for row in by_file["rows"]] == [row["name"] for row in by_set["rows"]]
    for mine, theirs in zip(by_file["rows"], by_set["rows"]):
        assert mine["step_ms"] == pytest.approx(theirs["step_ms"], rel=1e-9)
    assert f"the cost file {path} (a test: the a100 set's own figures)" in capsys.readouterr().out


def test_a_measured_curve_prices_cells_above_the_reference_batch(tmp_path):
    """A curve measured past 128 sentences (twice the throughput at 512) makes
    a 512-row LSTM cell twice as efficient; below 128 the file's curve and
    the published one agree (the file holds the published points)."""
    rows = published_rows()
    rows["rows"]["512"] = {phase: 2 * rows["rows"]["128"][phase] for phase in ("forward", "backward")}
    path = tmp_path / "past_128.json"
    write_file(path, rows)
    measured = cost_file.register(str(path))
    assert measured.name == "file:past_128.json" and measured.base == "a100"
    file_cost = gpu_costs.cost_set(measured.name, {}, 0.0, 1e12)
    published = gpu_costs.cost_set("a100", {}, 0.0, 1e12)
    assert file_cost.batch_efficiency(512, "forward") == pytest.approx(2.0)
    assert file_cost.batch_efficiency(1024, "backward") == pytest.approx(2.0)  # the largest measured, beyond it
    assert file_cost.batch_efficiency(256, "forward") == pytest.approx((256 / (1 + 1 / 3)) / 128)  # time linear
    assert file_cost.batch_efficiency(32, "forward") == published.batch_efficiency(32, "forward") < 1
    assert file_cost.link_bandwidth == published.link_bandwidth  # what one GPU cannot measure: the base set's


BAD_FILES = {
    "missing": (None, "no such cost file"),
    "not JSON": ("{", "not a JSON cost file"),
    "unknown base": ({"base": "h100"}, "'base' must name one of a100, p100, v100"),
    "no tokens/s": ({"one_device_tokens_per_s": 0}, "'one_device_tokens_per_s' must be a number above 0"),
    "no reference point": ({"lstm": {"reference_batch": 100}}, "no point at the reference batch 100"),
    "no host cost": ({"host_cost": {}}, "'host_cost' must hold a host-cost report"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_cost_file_gets_one_line_and_exit_status_2(case, tmp_path, capsys):
    change, message = BAD_FILES[case]
    path = tmp_path / "costs.json"
    if isinstance(change, str):
        path.write_text(change)
    elif change is not None:
        data = write_file(path)
        for key, value in change.items():
            data[key] = {**data[key], **value} if isinstance(value, dict) and value else value
        path.write_text(json.dumps(data))
    assert plan.main(["--gpus", "2", "--cost-file", str(path), *COMMAND]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fairseq-hybrid-plan: --cost-file ") and message in err[0], err


def test_the_race_of_fair_race_prices_with_a_cost_file(tmp_path):
    """fair_race_global.py --cost-file races under the file's set ('measured') as
    it does under the named sets: a file of the a100 set's figures gives
    the a100 set's rows."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    path = tmp_path / "a100_again.json"
    write_file(path)
    subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "fair_race_global.py"), "--no-mlperf",
                    "--host-cost", plan.HOST_COST, "--global-sets", "a100", "--flat-sets", "none",
                    "--cost-file", str(path),
                    "--global-gpus", "4", "--global-batches", "128", "--scale-gpus", "8", "--scale-per-gpu", "32",
                    "--micro-batches", "1", "--out", str(tmp_path)], check=True, capture_output=True, timeout=600)
    table = json.loads((tmp_path / "fair_race_global.json").read_text())["global_batch"]
    assert set(table["sets"]) == {"a100", "measured"}
    for kind in ("fixed", "scale"):
        for mine, theirs in zip(table["sets"]["measured"][kind], table["sets"]["a100"][kind]):
            assert [row["step_ms"] for row in mine] == pytest.approx([row["step_ms"] for row in theirs], rel=1e-9)
    assert "The measured set is a cost file" in (tmp_path / "fair_race_global.md").read_text()
    assert (tmp_path / "fair_race_map.png").stat().st_size > 0
