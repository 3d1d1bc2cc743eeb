"""fairseq-hybrid-plan --measure: every candidate run on the devices at
hand beside its prediction; on CPU devices the prediction priced with a
cost model calibrated in the same run, through race() (one code path);
DDP's ranks on their share of each batch; devices that are not there and
commands it cannot time refused in one line with exit status 2."""

import json
import os
import signal
import statistics
import subprocess
import sys

import pytest
import torch

from conftest import BIN, assert_children_end_with
from fairseq_hybrid.commands import plan
from fairseq_hybrid.command_lines import train_command
from fairseq_hybrid.candidates import plan_prices
from fairseq_hybrid.forecasts import workload
from fairseq_hybrid.timing.command_model import padded_tokens
from fairseq_hybrid.timing.training_steps import rows_of, share_of, synchronize
from fairseq_hybrid.timing.cpu_calibration import cpu_costs, ring_bandwidth, scaled
from fairseq_hybrid.forecasts.data_parallel_cost import ring_allreduce_seconds
from fairseq_hybrid.candidates.race import race
from fairseq_hybrid.planning.schedule_simulator import CostModel

TINY = ["--arch", "hybrid_lstm_tiny", "--max-tokens", "400", "--source-lang", "ja", "--target-lang", "en"]


def test_a_rank_takes_its_rows_of_the_batch():
    pad = 1
    target = torch.tensor([[5, 6, 2], [7, 2, pad], [8, 2, pad], [9, 9, 2]])
    sample = {"id": torch.arange(4), "nsentences": 4, "ntokens": 10, "target": target,
              "net_input": {"src_tokens": torch.arange(12).view(4, 3), "src_lengths": torch.tensor([3, 3, 2, 2]),
                            "prev_output_tokens": target.roll(1, 1)}}
    half = rows_of(sample, 2, 4, pad)
    assert half["id"].tolist() == [2, 3] and half["nsentences"] == 2 and half["ntokens"] == 5
    assert torch.equal(half["net_input"]["src_tokens"], sample["net_input"]["src_tokens"][2:])
    assert half["net_input"]["src_lengths"].tolist() == [2, 2]
    assert padded_tokens([rows_of(sample, 0, 2, pad), half]) == padded_tokens([sample]) == 4 * 6
    thirds = [share_of(sample, rank, 3, pad)["id"].tolist() for rank in range(3)]
    assert thirds == [[0], [1], [2, 3]]


def test_the_calibrated_costs_price_ranks_and_links_as_measured():
    """A group has the engine's fitted cells, slowed as when all devices
    run; one device (all threads) and a rank (one thread) run the model
    without the engine, priced as the engine's step times their measured
    time over the engine's, a rank's cells also slowed; gloo's measured
    all-reduce gives the link back."""
    engine = CostModel(rates={"lstm/forward": 1e9}, fixed={"lstm/forward": 1e-3}, per_step={"lstm/forward": 1e-4},
                       step_overhead=0.05, group_step_overhead=0.04)
    costs, rank = cpu_costs({"one_thread": engine.__dict__, "engine_seconds": 10.0, "plain_seconds": 8.0,
                             "plain_all_threads_seconds": 5.0, "slowdown": 1.25, "reduce_bandwidth": 3e9})
    group, alone = costs(2)
    assert group.slowdown == 1.25 and group.rates == engine.rates and group.group_step_overhead == 0.04
    assert alone.rates["lstm/forward"] == pytest.approx(2e9) and alone.step_overhead == pytest.approx(0.025)
    assert rank.rates["lstm/forward"] == pytest.approx(1e9 / 0.8 / 1.25) and rank.step_overhead == pytest.approx(0.04)
    assert rank.fixed["lstm/forward"] == pytest.approx(1e-3) and rank.per_step["lstm/forward"] == pytest.approx(1e-4)
    assert rank.slowdown == 1.0 and rank.group_step_overhead is None and rank.link_bandwidth == 3e9
    assert scaled(engine, 2.0).rates["lstm/forward"] == 0.5e9 and engine.rates["lstm/forward"] == 1e9  # a copy
    assert scaled(engine, 2.0).step_overhead == 0.05 and scaled(engine, 2.0, outside_cells=True).step_overhead == 0.1
    link = CostModel(link_bandwidth=ring_bandwidth(40e6, 4, 0.03))
    assert ring_allreduce_seconds(40e6, 4, link) == pytest.approx(0.03)


def test_measure_runs_every_candidate_beside_the_race_prediction(binarized, tmp_path, capsys):
    """Two CPU devices: one device with both threads, DDP over gloo, a
    group; each measured in two rounds and set beside its prediction, which
    is race()'s under the calibration the run measured: the plan's for the
    first round, a second calibration's (the group's choices kept) for the
    second, the ratio the median of the rounds' ratios."""
    out = tmp_path / "measured.json"
    data = str(binarized / "bin")
    code = plan.main(["--measure", "cpu,cpu", "--batches", "2", "--rounds", "2", "--micro-batches", "1,2",
                      "--json", str(out), "--", "fairseq-train", data, *TINY])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    result = json.loads(out.read_text())
    names = [row["name"] for row in result["rows"]]
    assert names == ["one GPU", "DDP on 2", "one group of 2, threads", "one group of 2, processes"]
    assert [row.get("workers") for row in result["rows"]] == [None, None, "threads", "processes"]
    assert len(result["calibrations"]) == 2 and result["calibrations"][0] == result["calibration"]
    assert result["calibrations"][1]["engine_seconds"] != result["calibration"]["engine_seconds"]  # measured again
    for row in result["rows"]:
        assert row["measured_tokens_per_s"] == statistics.median(row["measured_rounds"])
        assert len(row["measured_rounds"]) == 2 and min(row["measured_rounds"]) > 0
        assert row["predicted_rounds"][0] == row["tokens_per_s"]
        ratios = [value / price for value, price in zip(row["measured_rounds"], row["predicted_rounds"])]
        assert row["measured_vs_predicted"] == pytest.approx(sum(ratios) / 2)
    calibration = result["calibration"]
    assert calibration["slowdown"] > 0 and calibration["reduce_seconds"] > 0
    assert "fitted to" in calibration["one_thread"]["note"] and "cell times" in calibration["one_thread"]["note"]
    assert calibration["engine_seconds"] > 0 and calibration["plain_all_threads_seconds"] > 0
    # one code path: the same rows from race() under each round's calibration
    args = train_command.parse_training([data, *TINY])
    load = workload.workload(args, plan.build_parser().parse_args(["--gpus", "2", "--batches", "2"]))
    # each priced on the command's own batches, the ones --measure trains on
    assert [len(real.sources) for real in load.batches] == [len(real.targets) for real in load.batches]
    assert len(load.batches) == 2 and load.sentences == pytest.approx(
        statistics.mean(len(real.sources) for real in load.batches), abs=1)
    tokens = statistics.mean(len(real.sources) * (max(real.sources) + real.width) for real in load.batches)
    for workers, group in (("threads", result["rows"][2]), ("processes", result["rows"][3])):
        kept = {2: {key: group[key] for key in ("micro_batches", "chunk_length", "placement", "softmax_chunks")}}
        for index, choices in ((0, None), (1, kept)):
            costs, rank = cpu_costs(result["calibrations"][index], workers)
            rows = race(load.model, load.cfg, costs, 2, result["sentences"], result["source"], result["target"],
                        (1, 2), None, rank_cost=rank, choices=choices, batches=load.batches)
            for mine, theirs in zip(result["rows"][:2] + [group], rows):
                assert mine["predicted_rounds"][index] == pytest.approx(tokens / theirs.step.total, rel=1e-12)
    # processes priced as built: each stage's build, its messages, the commands, the gradients' copy
    parts = result["rows"][3]["process_costs_ms"]
    assert set(parts) == {"builds (the longest)", "messages (the busiest host)", "commands", "gradient copy"}
    measured = result["calibration"]["processes"]
    assert parts["commands"] == pytest.approx(2e3 * measured["command_round_trip"], rel=1e-12)
    # a send priced as the calibration's group of processes timed it, the idle pair's kept beside it
    assert measured["idle_message_send"] > 0 and measured["message_send"] > 0
    assert set(result["calibration"]["group_residual"]) == {"threads", "processes"}
    # DDP's ranks priced with what they measured beyond their price on the calibration's batches
    calibration = result["calibration"]
    without = {key: value for key, value in calibration.items() if key != "rank_residual"}
    assert calibration["rank_residual"] != 0.0 and cpu_costs(calibration)[1].step_overhead == pytest.approx(
        max(0.0, cpu_costs(without)[1].step_overhead + calibration["rank_residual"]), rel=1e-12)
    assert parts["builds (the longest)"] > 1e3 * measured["build_fixed"]
    assert result["fastest_measured"] in names
    assert "[measure] calibrated in" in printed.err and "[measure] round 2/2: DDP on 2" in printed.err
    assert printed.err.count("[measure] calibrated in") == 2
    assert "measured/predicted" in printed.out and "<- fastest measured" in printed.out
    assert "each round priced with a calibration run just before it" in printed.out
    assert "Run the fastest measured with:" in printed.out


def test_a_group_priced_with_given_choices_is_priced_as_searched():
    """race(choices=...) prices the group at the choices given, without a
    search: at the search's own choices the same step, at others another."""
    args = train_command.parse_training(["-", *TINY])
    own = plan.build_parser().parse_args(["--gpus", "2"])
    plan.check_own(own)
    load = workload.workload(args, own)
    costs = plan_prices.costs_for(own, load)
    searched = race(load.model, load.cfg, costs, 2, 16, 20, 20, (1, 2, 4))
    group = searched[2]
    same = race(load.model, load.cfg, costs, 2, 16, 20, 20, (1, 2, 4), choices={2: group.choice})
    assert same[2].choice == group.choice and same[2].step.total == pytest.approx(group.step.total, rel=1e-12)
    other_count = 1 if group.choice["micro_batches"] != 1 else 2
    other = race(load.model, load.cfg, costs, 2, 16, 20, 20, (1, 2, 4),
                 choices={2: dict(group.choice, micro_batches=other_count)})
    assert other[2].choice["micro_batches"] == other_count and other[2].step.total >= group.step.total
    assert [row.step.total for row in other[:2]] == [row.step.total for row in searched[:2]]


@pytest.mark.slow
def test_measure_runs_groups_under_ddp(binarized, tmp_path):
    """Four CPU devices: two groups of two under DDP (gloo, the gradients
    summed after the backward pass) measured beside the others."""
    out = tmp_path / "measured.json"
    code = plan.main(["--measure", "cpu,cpu,cpu,cpu", "--batches", "2", "--rounds", "1", "--micro-batches", "1",
                      "--json", str(out), "--", "fairseq-train", str(binarized / "bin"), *TINY])
    assert code == 0
    rows = {row["name"]: row for row in json.loads(out.read_text())["rows"]}
    assert [name for name in rows if "groups of 2" in name] == ["2 groups of 2 under DDP, threads",
                                                                "2 groups of 2 under DDP, processes"]
    ddp_groups = rows["2 groups of 2 under DDP, threads"]
    assert ddp_groups["measured_tokens_per_s"] == ddp_groups["measured_rounds"][0] > 0  # its one round
    assert ddp_groups["measured_vs_predicted"] == pytest.approx(ddp_groups["measured_rounds"][0]
                                                                / ddp_groups["predicted_rounds"][0])
    assert "one group of 4" not in rows  # hybrid_lstm_tiny: too few layers


BAD = {
    "a device that is not there": (["--measure", "cuda:0"], ["-"], "cuda:0 is not there"),
    "not a device": (["--measure", "cpu,tpu"], ["-"], "'tpu' is not a device"),
    "a kind of device it cannot measure": (["--measure", "cpu,meta"], ["-"],
                                           "meta: the plan measures on cpu or cuda devices"),
    "devices of two kinds": (["--measure", "cpu,cuda:0"], ["-"], "cpu,cuda:0: all devices of one kind"),
    "no devices named": (["--measure", " , "], ["-"], "name the devices, e.g. cpu,cpu"),
    "--gpus and --measure disagree": (["--gpus", "4", "--measure", "cpu,cpu"], ["-"],
                                      "--gpus 4 but --measure names 2 device(s)"),
    "no data to train on": (["--measure", "cpu,cpu"], ["-"], "--measure trains on the command's data"),
    "neither --gpus nor --measure": ([], ["-"], "--gpus N"),
    "a loss a group cannot run": (["--gpus", "2"], ["-", "--criterion", "nat_loss"], "--criterion nat_loss"),
}


def test_each_gpu_is_measured_once(monkeypatch):
    """A GPU named twice is refused, on a machine with two (as devices_of
    sees it), and an index is taken from the position where none is given."""
    from fairseq_hybrid.candidates.measure import devices_of

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match="cuda:1,cuda:1: each GPU once"):
        devices_of("cuda:1,cuda:1", None, ValueError)
    assert devices_of("cuda,cuda", 2, ValueError) == ["cuda:0", "cuda:1"]
    with pytest.raises(ValueError, match="cuda:2 is not there \\(this machine has 2"):
        devices_of("cuda:0,cuda:2", None, ValueError)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_gets_one_line_and_exit_status_2(case):
    own, train, message = BAD[case]
    if case == "a device that is not there" and torch.cuda.is_available():
        own = ["--measure", f"cuda:{torch.cuda.device_count()}"]
        message = "is not there"
    result = subprocess.run([os.path.join(BIN, "fairseq-hybrid-plan"), *own, "--", "fairseq-train", *train,
                             "--arch", "hybrid_lstm_base", "--batch-size", "8"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fairseq-hybrid-plan: ") and message in lines[0], result.stderr


def test_measure_refuses_batches_too_small_to_split_before_calibrating(binarized):
    """A batch with fewer sentences than DDP's ranks would leave a rank
    nothing to train (the fixture at --max-tokens 100: 2.25 sentences a
    batch on average, the fewest 1): refused in one line, before the
    calibration's minute.  A --max-tokens below the longest sentence, which
    fairseq's sampler asserts on, is refused in one line too."""
    def planned(max_tokens):
        tiny = [token if token != "400" else max_tokens for token in TINY]
        return subprocess.run([os.path.join(BIN, "fairseq-hybrid-plan"), "--measure", "cpu,cpu", "--",
                               "fairseq-train", str(binarized / "bin"), *tiny], capture_output=True, text=True,
                              timeout=120)

    small = planned("100")
    assert small.returncode == 2 and "has 1: give a larger --max-tokens" in small.stderr, small.stderr
    assert "calibrat" not in small.stderr
    short = planned("24")
    lines = [line for line in short.stderr.splitlines() if line.strip()]
    assert short.returncode == 2 and len(lines) == 1, short.stderr
    assert "fairseq's batch sampler refuses the command: Sentences lengths should not exceed max_tokens=24" in lines[0]


def test_measure_refuses_accumulated_steps(binarized):
    result = subprocess.run([os.path.join(BIN, "fairseq-hybrid-plan"), "--measure", "cpu,cpu", "--", "fairseq-train",
                             str(binarized / "bin"), *TINY, "--update-freq", "2"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and "--measure times one batch a step" in result.stderr


def test_a_timed_step_waits_for_every_gpu_it_names(monkeypatch):
    """``torch.cuda.synchronize()`` waits for the current device only: a
    group's timed steps wait for each of its GPUs, CPU devices for none."""
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    synchronize("cuda:1", "cpu", torch.device("cuda", 0), torch.device("cpu", 3))
    assert waited == [torch.device("cuda", 1), torch.device("cuda", 0)]


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "kill -9"])
def test_a_measuring_run_ends_with_the_plan(how, binarized):
    """The plan stopped by SIGTERM or kill -9 while a run of its own is in
    flight leaves no run behind: the run watches the plan that started it
    (a quiet run, one device timed on many batches, which writes nothing
    that a closed pipe would end it on)."""
    quiet = [str(binarized / "bin"), "--arch", "hybrid_lstm_base", "--max-tokens", "400", "--source-lang", "ja",
             "--target-lang", "en", "--criterion", "hybrid_cross_entropy"]  # a minute of steps, at the least
    spec = {"kind": "one", "train": quiet,
            "devices": ["cpu"], "batches": 500, "warmup": 0, "group": None, "threads": 1}
    plan_process = subprocess.Popen([sys.executable, "-c", "import json, sys; from fairseq_hybrid.candidates.measure "
                                     "import run; run(json.loads(sys.argv[1]), 'a quiet run')", json.dumps(spec)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert_children_end_with(plan_process, how, lambda command: "fairseq_hybrid.candidates.run_one" in command,
                             running=3.0, what="a run of the plan's")
