"""``fairseq-hybrid-plan calibrate`` (fairseq_hybrid/commands/calibrate.py):
devices calibrated once on the user's command, written as the cost file
that ``--hybrid-cost-model`` and ``fairseq-hybrid-plan --cost-file`` both
read (CPU devices; a GPU's measurements run here on CPU devices, and a GPU
file's cost model on made-up figures); bad input refused in one line."""

import json
import os
import statistics
import subprocess

import pytest

from conftest import BIN
from fairseq_hybrid.commands import plan
from fairseq_hybrid.forecasts.cost_file import CostFileError, add_engine_cost_model, register
from fairseq_hybrid.candidates.race import race
from fairseq_hybrid.planning.twin_model import uniform_batch
from fairseq_hybrid.forecasts.workload import twin_of, workload
from fairseq_hybrid.planning.schedule_simulator import CostModel
from fairseq_hybrid.timing.cpu_calibration import cpu_costs
from fairseq_hybrid.command_lines.train_command import measured_command, parse_training

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
    # --hybrid-cost-model reads the cells' cost model from it, and --hybrid-workers auto a process per device's
    assert CostModel.load(str(costs)).__dict__ == CostModel(**written["cost_model"]).__dict__
    processes = CostModel.load(str(costs), "processes_cost_model")
    assert processes.workers == "processes" and processes.fixed == written["cost_model"]["fixed"]
    assert processes.message_send == written["calibration"]["processes"]["message_send"] > 0
    # the plan prices CPU devices with it, as --measure would have, without measuring again
    assert plan.main(["--gpus", "2", "--cost-file", str(costs), "--micro-batches", "1", "--json", str(planned), "--",
                      "fairseq-train", data, *TINY]) == 0
    printed = capsys.readouterr()
    assert "[measure]" not in printed.err and "[calibrate]" not in printed.err
    assert f"priced with the calibration in {costs} ({written['measured_on']})" in printed.out
    result = json.loads(planned.read_text())
    load = workload(parse_training([data, *TINY]), plan.build_parser().parse_args(["--gpus", "2", "--batches", "50"]))
    # each way priced on the command's own batches
    tokens = statistics.mean(len(real.sources) * (max(real.sources) + real.width) for real in load.batches)
    assert [row["name"] for row in result["rows"]] == ["one GPU", "DDP on 2", "one group of 2, threads",
                                                       "one group of 2, processes"]
    for workers, mine in (("threads", result["rows"][:3]), ("processes", result["rows"][:2] + result["rows"][3:])):
        group, rank = cpu_costs(written["calibration"], workers)
        rows = race(load.model, load.cfg, group, 2, load.sentences, load.source, load.target, (1,), None,
                    rank_cost=rank, batches=load.batches)
        assert [row["tokens_per_s"] for row in mine] == pytest.approx([tokens / row.step.total for row in rows],
                                                                      rel=1e-12)
    # a GPU forecast refuses it
    with pytest.raises(CostFileError, match="prices CPU devices only"):
        register(str(costs))
    # priced for as many devices as it calibrated
    wrong = subprocess.run([os.path.join(BIN, "fairseq-hybrid-plan"), "--gpus", "4", "--cost-file", str(costs), "--",
                            "fairseq-train", data, *TINY], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "a calibration of 2 CPU devices: give --gpus 2" in wrong.stderr


BAD = {  # OUT: the cost file's path, DATA: the fixture's data folder
    "a GPU not there": (["cuda:63", "--out", "OUT", "--", "fairseq-train", "DATA"],
                        "calibrate: DEVICES: cuda:63 is not there"),
    "two kinds": (["cpu,cuda:0", "--out", "OUT", "--", "fairseq-train", "DATA"], "all devices of one kind"),
    "a base for CPUs": (["cpu,cpu", "--base", "a100", "--out", "OUT", "--", "fairseq-train", "DATA"],
                        "--base a100: the set a GPU's cost file builds on; cpu,cpu are CPU devices"),
    "no data": (["cpu,cpu", "--out", "OUT", "--", "fairseq-train", "-"], "give the data folder, not -"),
    "no command": (["cpu,cpu", "--out", "OUT"], "give your fairseq-train command after --"),
    "no --out": (["cpu,cpu", "--", "fairseq-train", "DATA"], "the following arguments are required: --out"),
    "not a device": (["cpu,gpu", "--out", "OUT", "--", "fairseq-train", "DATA"],
                     "calibrate: DEVICES: 'gpu' is not a device"),
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


def test_a_gpu_calibration_measured_on_cpu_devices_is_a_cost_file(binarized, tmp_path):
    """What ``calibrate cuda:0,...`` measures and writes
    (:func:`fairseq_hybrid.commands.calibrate.gpu_cost_file`, which the GPU
    check's CPU smoke run calls too), run on CPU devices (the same code;
    the figures then say nothing of a GPU): the host rows of a group of 1
    and of 2, the LSTM curve at the model's hidden size, one device's
    tokens/s; a GPU cost file, registered as the race's set, with the cost
    model of a group of its devices."""
    from fairseq_hybrid.commands.calibrate import gpu_cost_file
    from fairseq_hybrid.forecasts import gpu_costs
    from fairseq_hybrid.forecasts.cost_file import load
    from fairseq_hybrid.timing.gpu_calibration import LSTM_BATCHES

    train = [str(binarized / "bin"), *TINY]
    args = parse_training(train)
    path = tmp_path / "gpu.json"
    said = []
    assert gpu_cost_file(str(path), measured_command(train, args, "calibrate"), args, ["cpu", "cpu"], 1, "a100",
                         said.append, measured_on="CPU smoke run") == "CPU smoke run"
    written = load(str(path))
    rows = written["host_cost"]["rows"]
    assert [(row["k"], row["chunk_length"]) for row in rows] == [(1, 0), (2, 0)]
    assert {"lstm/forward", "lstm/backward", "attention_softmax/forward"} <= set(rows[1]["cell_us"])
    assert written["lstm"]["hidden"] == 32
    assert [batch for batch, _ in written["lstm"]["seconds_per_step"]["backward"]] == list(LSTM_BATCHES)
    assert written["one_device_shape"].startswith("hybrid_lstm_tiny, 128 sentences of 50 + 50 tokens")
    assert written["processes_cost_model"]["workers"] == "processes" and "cost_model" in written
    # one device's tokens/s said (where no rate fits on CPU devices, a line saying so follows it)
    assert [line for line in said if line.endswith("tokens/s on one GPU")]
    registered = register(str(path))
    assert registered.tokens_per_s == written["one_device_tokens_per_s"] and registered.base == "a100"
    curve, reference = gpu_costs.LSTM_CURVES[registered.name]
    assert reference == 128 and curve["backward"][0] == written["lstm"]["seconds_per_step"]["backward"][0]
    row = rows[1]
    assert gpu_costs.host_fixed(str(path), 2)["lstm/forward"] == pytest.approx(
        (row["cell_us"]["lstm/forward"] + row["outside_cells_us_per_cell"]) * 1e-6, rel=1e-12)


def test_a_gpu_calibration_on_cpu_devices_without_a_rate_prices_the_host_time_alone(binarized, tmp_path,
                                                                                     monkeypatch):
    """On CPU devices a cell's host time holds its arithmetic, so a group of
    1's cells and the engine's time outside them can come to more than one
    device's step, and no FLOP rate fits: the smoke run's cost file then
    prices each cell's host time alone (the device's arithmetic in it) and
    says so; on GPUs that is an error."""
    from fairseq_hybrid.commands.calibrate import gpu_cost_file
    from fairseq_hybrid.forecasts import gpu_costs
    from fairseq_hybrid.forecasts.cost_file import load

    def no_rate(*args, **kwargs):
        raise ValueError("the host and latency costs alone exceed the one-device step: no rate fits")

    monkeypatch.setattr(gpu_costs, "set_rate", no_rate)
    train = [str(binarized / "bin"), *TINY]
    args = parse_training(train)
    path = tmp_path / "gpu.json"
    said = []
    gpu_cost_file(str(path), measured_command(train, args, "calibrate"), args, ["cpu", "cpu"], 1, "a100",
                  said.append, measured_on="CPU smoke run")
    written = load(str(path))
    assert set(written["cost_model"]["rates"].values()) == {float("inf")}
    assert written["processes_cost_model"]["workers"] == "processes"
    assert any("host time alone" in line for line in said)


def test_a_gpu_cost_file_holds_the_cost_model_of_a_group_of_its_gpus(tmp_path):
    """What --hybrid-cost-model reads of a GPU cost file: the set at the rate
    solved for the file's tokens/s on the command's model, for a group of K
    with one host queueing its workers' cells; and a file whose host time
    alone exceeds one device's step is refused (no rate fits)."""
    from fairseq_hybrid.forecasts import gpu_costs
    from fairseq_hybrid.forecasts.cost_file import write

    cell = {f"{kind}/{phase}": 50.0 for kind in gpu_costs.KINDS for phase in gpu_costs.PHASES}
    host = {"device": "cuda", "rows": [{"k": k, "chunk_length": 0, "cell_us": cell, "outside_cells_us_per_cell": 5.0}
                                       for k in (1, 2)]}
    lstm = {"hidden": 32, "steps": 25, "rows": {str(b): {"forward": 1e-5 * b / 16, "backward": 2e-5 * b / 16}
                                                for b in (16, 128, 512)}}
    train = ["-", "--arch", "hybrid_lstm_tiny", "--max-tokens", "400"]
    args = parse_training(train)
    path = tmp_path / "gpu.json"
    write(str(path), base="a100", tokens_per_s=50e3, lstm_seconds=lstm, host_cost=host, measured_on="made up")
    add_engine_cost_model(str(path), args, 2)
    engine = CostModel.load(str(path))
    registered = register(str(path))
    twin, cfg = twin_of(args, 32000, 32000)
    rate = gpu_costs.set_rate(registered.name, twin, cfg, uniform_batch(128, 50, 50), str(path), 10.0, "queued", 50e3)
    expected, _ = gpu_costs.set_costs(registered.name, str(path), 2, 10.0, rate, "queued")
    assert engine.rates == expected.rates and engine.per_step == expected.per_step and engine.host_queues
    assert engine.fixed == {key: (50.0 + 5.0) * 1e-6 for key in cell}  # one worker's host time, queued on one host
    assert engine.lstm_batch_seconds == {phase: [[b, lstm["rows"][str(b)][phase]] for b in (16, 128, 512)]
                                         for phase in ("forward", "backward")}
    assert engine.link_bandwidth == gpu_costs.COST_SETS["a100"]["link_bandwidth"]
    assert "a group of 2" in engine.note
    # a GPU whose host alone takes longer than the step it measured: no FLOP rate fits
    write(str(path), base="a100", tokens_per_s=1e12, lstm_seconds=lstm, host_cost=host, measured_on="made up")
    with pytest.raises(ValueError, match="no rate fits"):
        add_engine_cost_model(str(path), args, 2)
    assert "cost_model" not in json.loads(path.read_text())


def test_the_reference_batch_is_collated_as_fairseq_does():
    from fairseq.data import Dictionary

    from fairseq_hybrid.timing.gpu_calibration import reference_sample

    dictionary = Dictionary()
    for word in "abcdefgh":
        dictionary.add_symbol(word)
    sample = reference_sample(dictionary, dictionary, 3, 5, 4)
    source, target = sample["net_input"]["src_tokens"], sample["target"]
    assert source.shape == (3, 5) and target.shape == (3, 4) and sample["ntokens"] == 12
    assert (source[:, -1] == dictionary.eos()).all() and (target[:, -1] == dictionary.eos()).all()
    words = source[:, :-1]
    assert int(words.min()) >= dictionary.nspecial and int(words.max()) < len(dictionary)
    assert sample["net_input"]["prev_output_tokens"][:, 1:].equal(target[:, :-1])
    assert (sample["net_input"]["prev_output_tokens"][:, 0] == dictionary.eos()).all()
    assert sample["net_input"]["src_lengths"].tolist() == [5, 5, 5]
