"""Plain data parallelism in the simulator's terms (the yardstick:
fairseq_hybrid/forecasts/data_parallel_cost.py), the host time a GPU's
host is priced with, and the fair race's tables."""

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from conftest import REPO
from fairseq_hybrid.forecasts.data_parallel_cost import (ring_allreduce_seconds, overlapped_backward,
                                                        data_parallel_step, speedup)
from fairseq_hybrid.planning.schedule_simulator import CostModel, StepTime

LINK = CostModel(link_bandwidth=10e9, link_latency=10e-6)


def test_a_ring_all_reduce_moves_2_k_minus_1_over_k_of_the_bytes():
    assert ring_allreduce_seconds(1e9, 1, LINK) == 0.0
    # 4 ranks: 6 steps of 1e9 / 4 bytes at 10 GB/s, each with 10 us of latency
    assert ring_allreduce_seconds(1e9, 4, LINK) == pytest.approx(6 * (10e-6 + 0.025))


def test_buckets_hide_behind_a_long_backward_and_not_behind_a_short_one():
    gradient = 100 * 2 ** 20  # 4 buckets of 25 MiB
    per_bucket = ring_allreduce_seconds(gradient / 4, 4, LINK)
    long = overlapped_backward(1.0, gradient, 4, LINK)
    assert long == pytest.approx(1.0 + per_bucket)  # only the last bucket is left after backward
    short = overlapped_backward(1e-3, gradient, 4, LINK)
    assert short == pytest.approx(1e-3 / 4 + 4 * per_bucket)  # the link is the bottleneck
    assert overlapped_backward(1.0, gradient, 1, LINK) == 1.0


def test_data_parallel_speedup_counts_k_batches_per_step():
    one = StepTime(forward=0.3, backward=0.6, extra=0.1)
    free = data_parallel_step(one, 4e8, 4, CostModel())
    assert speedup(one, free, 4) == pytest.approx(4.0)
    slow = data_parallel_step(one, 4e8, 4, LINK)
    assert 3.0 < speedup(one, slow, 4) < 4.0


def test_a_cpu_host_report_read_for_a_gpu_host(tmp_path):
    """A host-cost report measured on a CPU, read for a GPU's host: queued
    (one worker's row, the LSTM kernel call, half the cell here, as one
    1 us op), per device (the same), or summed (the K-worker row whole)."""
    from fairseq_hybrid.forecasts.gpu_costs import group_host

    host = tmp_path / "host.json"
    rows = [{"k": k, "chunk_length": 0, "outside_cells_us_per_cell": 10.0 * k,
             "cell_us": {f"{kind}/{phase}": 500.0 * k for kind in ("lstm", "attention_softmax", "embedding", "gather")
                         for phase in ("forward", "backward")}} for k in (1, 2, 4)]
    host.write_text(json.dumps({"rows": rows, "op_us": 1.0, "device": "cpu",
                                "lstm_kernel_share_k1_whole": {"lstm/forward": 0.5, "lstm/backward": 0.5}}))
    queued, queues = group_host(str(host), 4, "queued")
    assert queues and queued["lstm/forward"] == pytest.approx((250.0 + 1.0 + 10.0) * 1e-6)
    assert queued["attention_softmax/backward"] == pytest.approx((500.0 + 10.0) * 1e-6)
    assert group_host(str(host), 4, "per-device") == (queued, True)
    summed, queues = group_host(str(host), 4, "summed")
    assert not queues and summed["lstm/forward"] == pytest.approx((2000.0 + 40.0) * 1e-6)
    assert group_host(str(host), 3, "summed")[0]["gather/forward"] == pytest.approx((1000.0 + 20.0) * 1e-6)


def test_the_fair_race_table(tmp_path):
    """benchmarks/fair_race.py on small settings: the bound by micro-batches
    (auto's placement never below the default's, the busiest device's share
    a fraction above 1/K), and the group at K x 128 sentences beside DDP at
    128 per GPU in both cost sets."""
    subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "fair_race.py"), "--micro-batches", "1,2",
                    "--lengths", "0", "--groups", "2", "--no-eight", "--out", str(tmp_path)],
                   check=True, capture_output=True, cwd=REPO)
    report = json.loads((tmp_path / "fair_race.json").read_text())
    assert len(report["bounds"]) == 4
    for row in report["bounds"].values():
        assert row["auto"]["bound"] >= row["default"]["bound"] * (1 - 1e-6) > 1.0
        assert 0.25 < row["default"]["busiest_share"] < 1.0
    assert set(report["race"]) == {"queued", "summed"}  # both readings of the host time
    for host_model in ("queued", "summed"):
        for name in ("p100", "a100"):
            race = report["race"][host_model][name]["K=2"]
            assert race["ddp"] == pytest.approx(2.0, rel=0.05) and race["group"] > 1.0
            assert race["micro_batches"] in (1, 2) and race["chunk_length"] == 0
            # two groups of two under DDP on 4 GPUs: twice one group's tokens a step, less the all-reduce
            twice = report["race"][host_model][name]["2 groups x 2 (4 GPUs)"]
            assert twice["ddp"] == pytest.approx(4.0, rel=0.05)
            assert 1.5 * race["group"] < twice["group"] <= 2 * race["group"] * (1 + 1e-9)
    text = (tmp_path / "fair_race.md").read_text()
    assert text.count("| K=2 |") == 2 and text.count("| 2 groups x 2 (4 GPUs) |") == 2
    assert "the pessimistic end" in text
    # GNMT v2's published setting: an ideal DDP near 4x, beside the published 3.53-3.67x
    gnmt = report["gnmt_v100"]
    assert gnmt["published_ddp"] == [3.53, 3.67] and 3.8 < gnmt["ddp"] <= 4.0 + 1e-9 and gnmt["group"] > 1.0
    assert "GNMT v2's published setting" in text


def test_the_race_at_a_fixed_global_batch(tmp_path):
    """fair_race_global.py's race at a fixed global batch on small settings: DDP
    at B/K per GPU, one group of K at B, groups under DDP at their share,
    each against one GPU at B; at scale, groups of 2 and 4 under DDP
    against DDP step for step; the table says which is which."""
    subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "fair_race_global.py"), "--micro-batches", "1,2",
                    "--lengths", "0", "--no-mlperf", "--flat-sets", "none", "--host-models", "queued",
                    "--global-sets", "p100", "--global-gpus", "2,4", "--global-batches", "64,1024",
                    "--scale-gpus", "8", "--scale-per-gpu", "16", "--out", str(tmp_path)],
                   check=True, capture_output=True, cwd=REPO)
    table = json.loads((tmp_path / "fair_race_global.json").read_text())["global_batch"]
    fixed, scale = table["sets"]["p100"]["fixed"], table["sets"]["p100"]["scale"]
    # 1024 leaves DDP above 128 per GPU on 2 and 4 GPUs: left out; 64 on 2 and on 4 GPUs
    assert [(rows[1]["gpus"], rows[0]["sentences_per_group"]) for rows in fixed] == [(2, 64), (4, 64)]
    two, four = fixed
    assert [row["name"] for row in four] == ["one GPU", "DDP on 4", "2 groups of 2 under DDP", "one group of 4"]
    assert two[0]["speedup"] == 1.0 and 1.0 < two[1]["speedup"] < 2.0 and two[1]["sentences_per_group"] == 32
    assert four[2]["sentences_per_group"] == 32 and four[3]["sentences_per_group"] == 64
    for row in four[1:]:
        assert row["vs_ddp"] == pytest.approx(row["speedup"] / four[1]["speedup"])
    assert [(row["name"], row["sentences_per_group"]) for row in scale[0][1:]] == [
        ("DDP on 8", 16), ("4 groups of 2 under DDP", 32), ("2 groups of 4 under DDP", 64)]
    text = (tmp_path / "fair_race_global.md").read_text()
    assert "At a fixed global batch of B sentences" in text and "| 4 | 64 | 16 |" in text
    assert "| p100 | 16 | 8 |" in text
    assert os.path.getsize(tmp_path / "fair_race_map.png") > 1000  # the map of the regimes


def test_the_committed_race_at_a_fixed_global_batch_is_what_the_script_prints(tmp_path):
    """docs/bench/fair_race_global.json, which the README's rule of when to
    use what quotes, reproduced to the digit by fair_race_global.py for a
    corner of it (the P100 set: 64 sentences on 2 GPUs, and 16 per GPU on
    8): a change that moves the race's prices shows here."""
    subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "fair_race_global.py"), "--host-cost",
                    os.path.join(REPO, "docs", "bench", "host_cost.json"), "--global-sets", "p100", "--flat-sets",
                    "none", "--no-mlperf", "--global-gpus", "2", "--global-batches", "64", "--scale-gpus", "8",
                    "--scale-per-gpu", "16", "--out", str(tmp_path)], check=True, capture_output=True, cwd=REPO)
    fresh = json.loads((tmp_path / "fair_race_global.json").read_text())["global_batch"]["sets"]["p100"]
    committed = json.load(open(os.path.join(REPO, "docs", "bench", "fair_race_global.json")))["global_batch"]
    committed = committed["sets"]["p100"]

    def rows(table, kind, gpus, per_gpu):
        (found,) = [rows for rows in table[kind]
                    if rows[1]["gpus"] == gpus and rows[1]["sentences_per_group"] == per_gpu]
        return found

    for kind, gpus, per_gpu in (("fixed", 2, 32), ("scale", 8, 16)):
        for mine, theirs in zip(rows(fresh, kind, gpus, per_gpu), rows(committed, kind, gpus, per_gpu), strict=True):
            assert mine.keys() == theirs.keys()
            assert mine == {key: pytest.approx(value, rel=1e-9) if isinstance(value, float) else value
                            for key, value in theirs.items()}


def test_small_lstm_batches_run_at_a_gpus_lower_throughput():
    """The GPU cost sets price an LSTM cell by its batch (DeepBench's V100
    LSTM, forecasts/lstm_batch_efficiency.json): less below 128 sentences,
    more above (up to GNMT v2's A100 gain from 128 to 512, 2.24x), or
    exactly 128's rate above it in the flat variant; four cells of 32
    sentences cost about 2.4 times one of 128 going forward, where FLOPs
    alone would make them equal."""
    from fairseq_hybrid.parallel import Work
    from fairseq_hybrid.forecasts.gpu_costs import cost_set, flat_past_reference

    priced, flat = cost_set("p100", {}, 0.0, 1e12), cost_set("p100", {}, 0.0, 1e12, batch_efficiency=False)
    assert priced.batch_efficiency(128, "forward") == 1.0
    assert priced.batch_efficiency(512, "backward") == pytest.approx(119675.3 / 53394.5, rel=1e-3)
    assert priced.batch_efficiency(1024, "forward") == priced.batch_efficiency(512, "forward")
    assert 1 < priced.batch_efficiency(256, "forward") < priced.batch_efficiency(512, "forward")
    flat_past = cost_set(flat_past_reference("p100"), {}, 0.0, 1e12)
    assert flat_past.batch_efficiency(512, "backward") == 1.0
    assert flat_past.batch_efficiency(64, "forward") == priced.batch_efficiency(64, "forward")
    assert priced.batch_efficiency(64, "forward") == pytest.approx((64 / 88.2) / (128 / 130.0))
    assert priced.batch_efficiency(8, "forward") == pytest.approx((8 / 76.9) / (128 / 130.0))  # latency-bound
    assert 0 < priced.batch_efficiency(16, "backward") < priced.batch_efficiency(48, "backward") < 1
    whole, quarter = Work("lstm", 128 * 25, (1024, 1024, 25)), Work("lstm", 32 * 25, (1024, 1024, 25))
    assert 4 * flat.seconds(quarter, "forward") == pytest.approx(flat.seconds(whole, "forward"))
    assert priced.seconds(Work("lstm", 0, (1024, 1024, 25)), "forward") == 0.0  # a chunk where no row runs
    ratio = 4 * priced.seconds(quarter, "forward") / priced.seconds(whole, "forward")
    assert ratio == pytest.approx((128 / 130.0) / (32 / 79.1)) and 2.4 < ratio < 2.5


def test_small_matrix_products_run_at_a_gpus_lower_throughput():
    """An attention-softmax cell's products have as many rows as its target
    positions, at most the fused loss's chunk of 256: below that, a GPU's
    throughput falls as DeepBench's V100 GEMMs (3072 x N x 1024) measured,
    interpolated in log rows (forecasts/matmul_efficiency.json)."""
    import math

    from fairseq_hybrid.parallel import Work
    from fairseq_hybrid.forecasts.gpu_costs import cost_set

    priced, flat = cost_set("p100", {}, 0.0, 1e12), cost_set("p100", {}, 0.0, 1e12, batch_efficiency=False)
    at_256 = 9.94e12 + (13.14e12 - 9.94e12) * (math.log(256) - math.log(128)) / (math.log(24000) - math.log(128))
    assert priced.matmul_efficiency(32) == pytest.approx(5.75e12 / at_256)
    assert priced.matmul_efficiency(8) == pytest.approx(3.15e12 / at_256)  # below the smallest: its rate
    assert priced.matmul_efficiency(256) == 1.0 == priced.matmul_efficiency(5000)
    sizes = (1024, 1024, 1024, 32000, 50)
    small, large = Work("attention_softmax", 32, sizes), Work("attention_softmax", 6400, sizes)
    assert priced.seconds(small, "forward") == pytest.approx(flat.seconds(small, "forward") * at_256 / 5.75e12)
    assert priced.seconds(large, "backward") == pytest.approx(flat.seconds(large, "backward"))


def test_ddp_waits_for_its_slowest_rank():
    """Real DDP: each rank has a batch of its own and the step lasts as long
    as the slowest rank's (with the all-reduce overlapped as before)."""
    from fairseq_hybrid.forecasts.data_parallel_cost import data_parallel_step_of

    fast, slow = StepTime(0.1, 0.2, 0.0), StepTime(0.2, 0.4, 0.0)
    assert data_parallel_step_of([fast, slow, fast], 1e6, LINK) == data_parallel_step(slow, 1e6, 3, LINK)
    assert data_parallel_step_of([fast] * 3, 1e6, LINK).total < data_parallel_step_of([fast, slow, fast], 1e6,
                                                                                       LINK).total


@pytest.mark.benchmark
def test_the_fair_race_on_real_batches(binarized, tmp_path):
    """With --data: per step K batches drawn by fairseq's batch sampler;
    DDP waits for its slowest rank, the group takes them merged; both
    against one device running the same batches one after another."""
    subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "fair_race.py"), "--micro-batches", "1,2",
                    "--lengths", "0", "--groups", "2", "--no-eight", "--data", str(binarized / "bin"),
                    "--max-tokens", "300", "--real-steps", "2", "--out", str(tmp_path)],
                   check=True, capture_output=True, cwd=REPO)
    report = json.loads((tmp_path / "fair_race.json").read_text())
    real = report["real_batches"]
    assert real["steps"] == 2 and real["sentences_per_batch"] == 9.875
    # the simulator's prices of the fixture's batches when this test was written: (DDP, group, group on the
    # K batches merged) on 2 GPUs, then 2 groups x 2 on 4 (each step waits for the slower group)
    expected = {"p100": [(1.7877611675424518, 2.009961825022526, 2.836874492073646),
                         (2.577760936977128, 4.028856238950882, 4.0633287524426605)],
                "a100": [(1.8129088468564791, 2.0625191656159583, 2.878051931588061),
                         (2.6487277752809173, 4.184516495378214, 4.228021672477134)]}
    for name, rows in expected.items():
        got = [tuple(real[name][key][way] for way in ("ddp", "group", "group_merged"))
               for key in ("K=2", "2 groups x 2 (4 GPUs)")]
        assert got == [pytest.approx(row, rel=1e-6) for row in rows]
    assert "On real batches" in (tmp_path / "fair_race.md").read_text()
    assert report["gnmt_v100"]["ddp_real_batches"] == pytest.approx(2.6141861351576576, rel=1e-6)


def test_the_race_at_a_fixed_global_batch_on_real_batches(binarized, tmp_path):
    """fair_race_global.py with --data: global batches drawn by fairseq's
    sampler, every way on the same sentences on 4 GPUs (DDP's ranks a
    quarter each, two groups of two half each), against one GPU on them."""
    from fairseq_hybrid.forecasts.real_batches import split_rows

    part = ([5, 4, 4, 3, 3, 2, 2], [6, 5, 5, 4, 4, 3, 2])
    pieces = split_rows(part, 4)
    assert [len(piece[0]) for piece in pieces] == [2, 2, 2, 1]
    assert sum((piece[0] for piece in pieces), []) == part[0] and sum((piece[1] for piece in pieces), []) == part[1]
    subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "fair_race_global.py"), "--no-mlperf",
                    "--micro-batches", "1,2", "--global-sets", "p100", "--global-gpus", "4", "--global-batches", "64",
                    "--scale-gpus", "8", "--scale-per-gpu", "16", "--flat-sets", "none", "--data",
                    str(binarized / "bin"), "--global-real-tokens", "400,800", "--real-steps", "2", "--out",
                    str(tmp_path)], check=True, capture_output=True, cwd=REPO)
    real = json.loads((tmp_path / "fair_race_global.json").read_text())["global_real"]
    assert real["gpus"] == 4 and [(row["max_tokens"], row["set"]) for row in real["rows"]] == [
        (400, "p100"), (400, "a100"), (800, "p100"), (800, "a100")]
    # the simulator's prices of the fixture's batches, as the race printed them when this test was written:
    # (sentences, DDP, a group of 4, 2 groups of 2 under DDP), each against one GPU
    expected = [(12, 1.0516020888051576, 2.1658996683878087, 1.7426602379524112),
                (12, 1.047792677907841, 2.118748495650127, 1.7376555559980233),
                (22, 1.1343650188061336, 2.242478432864452, 1.8599786885485654),
                (22, 1.1137780927555612, 2.2232201842142505, 1.8331222118259431)]
    got = [(row["sentences"], row["ddp"], row["group of 4"], row["2 groups of 2 under DDP"]) for row in real["rows"]]
    assert got == [pytest.approx(row, rel=1e-6) for row in expected]
    assert "At a fixed global batch on real batches" in (tmp_path / "fair_race_global.md").read_text()


def test_the_two_readings_of_the_host_time(tmp_path):
    """queued: one worker's host time per cell (the simulator queues the K
    workers on one host), the CPU's LSTM kernel call counted as one op, a
    GPU's kept as measured; summed: the K-worker row, added to each cell."""
    from fairseq_hybrid.forecasts.gpu_costs import group_host

    def host_file(device):
        rows = [{"k": k, "chunk_length": 0, "cell_us": {"lstm/forward": 100.0 * k, "lstm/backward": 100.0 * k},
                 "outside_cells_us_per_cell": 0.0} for k in (1, 4)]
        path = tmp_path / f"{device}.json"
        path.write_text(json.dumps({"device": device, "rows": rows, "op_us": 2.0, "lstm_kernel_share_k1_whole":
                                    {"lstm/forward": 0.75, "lstm/backward": 0.75}}))
        return str(path)

    fixed, queues = group_host(host_file("cpu"), 4, "queued")
    assert queues and fixed["lstm/forward"] == pytest.approx((25.0 + 2.0) * 1e-6)
    fixed, queues = group_host(host_file("cuda"), 4, "queued")
    assert queues and fixed["lstm/forward"] == pytest.approx(100e-6)
    fixed, queues = group_host(host_file("cpu"), 4, "summed")
    assert not queues and fixed["lstm/forward"] == pytest.approx(400e-6)
    fixed, queues = group_host(host_file("cpu"), 4, "per-device")
    assert queues and fixed["lstm/forward"] == pytest.approx((25.0 + 2.0) * 1e-6)
    with pytest.raises(ValueError, match="queued, per-device, summed"):
        group_host(None, 4, "overlapped")


def test_the_calibration_against_mlperf_and_the_pcie_set():
    """fair_race_global.py's MLPerf calibration: solved for MLPerf's 256-per-GPU
    figure, DDP on 8 GPUs gives it back (the all-reduce hidden), and 32 per
    GPU gets fewer tokens/s per GPU; the v100-pcie set is the v100 set on a
    slower link."""
    import argparse

    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import fair_race_global
    from fairseq_hybrid.forecasts.gpu_costs import COST_SETS, MLPERF_GNMT_V100

    args = argparse.Namespace(vocabulary=32000, host_models=["queued"],
                              host_cost=os.path.join(REPO, "docs", "bench", "host_cost.json"))
    calibration = fair_race_global.mlperf_calibration(args)
    mlperf = calibration["rows"]["MLPerf at 256 per GPU"]["tokens_per_s_per_gpu"]
    assert mlperf[256] == pytest.approx(MLPERF_GNMT_V100[256][1], rel=0.02)
    for row in calibration["rows"].values():
        assert 0 < row["ratio_32_to_256"] < 1
    assert "| MLPerf v0.6, measured | 90,300 | 38,900 | 0.43 |" in "\n".join(fair_race_global.mlperf_markdown(calibration))
    assert COST_SETS["v100-pcie"]["link_bandwidth"] < COST_SETS["v100"]["link_bandwidth"]


def test_replica_copies_free_is_a_ceiling_of_the_links():
    """race(replica_copies=False), fair_race_global.py --free-replica-copies: the
    what-if of replicas whose copies cost nothing prices no group slower
    than with its copies, on a link slow enough for the copies to show,
    and leaves one GPU and DDP as they were."""
    from fairseq_hybrid.candidates.race import race, set_costs_of
    from fairseq_hybrid.planning.twin_model import uniform_batch
    from fairseq_hybrid.forecasts.gpu_costs import set_tokens_per_s
    from fairseq_hybrid.planning.twin_model import twin_model

    model, cfg = twin_model("hybrid_lstm_paper", 32000)
    costs = set_costs_of("p100", model, cfg, uniform_batch(128, 50, 50), None, "queued", set_tokens_per_s("p100"))
    slow = lambda k: tuple(replace(cost, link_bandwidth=1e8) for cost in costs(k))  # noqa: E731  (0.1 GB/s)
    priced, free = (race(model, cfg, slow, 4, 64, 50, 50, (1,), (0,), group_sizes=[4], replica_copies=copies)
                    for copies in (True, False))
    assert [row.step.total for row in priced[:2]] == [row.step.total for row in free[:2]]
    assert free[2].step.total < priced[2].step.total
