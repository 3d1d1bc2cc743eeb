"""The benchmark suite runs end to end on small settings and writes what the
README shows (the timings themselves are not checked: they are measured by
the scripts, never asserted by tests)."""

import json
import os
import re
import statistics
import subprocess
import sys
import time

import pytest

from conftest import REPO, alive, assert_children_end_with, run

BENCHMARKS = os.path.join(REPO, "benchmarks")


@pytest.mark.slow
@pytest.mark.benchmark
def test_bench_suite_smoke(binarized, tmp_path):
    """Every system of the suite, each in its own process, the gloo pair
    included, with an odd batch count (each gloo rank must take the same
    number of steps, or the all-reduce waits forever)."""
    out = tmp_path / "bench"
    run(sys.executable, os.path.join(BENCHMARKS, "bench_suite.py"), binarized / "bin", "--batches", "3", "--rounds", "1",
        "--max-tokens", "200", "--no-simulation", "--out", out, timeout=600)
    result = json.load(open(out / "bench.json"))
    assert len(result["systems"]) == 14
    assert all(row["target_tokens_per_s"] > 0 for row in result["systems"].values())
    # every group reports what its devices did (the engine's own metrics); the other systems have no group
    groups = {name: row["group"] for name, row in result["systems"].items() if "group" in row}
    assert set(groups) == {name for name, row in result["systems"].items() if row["kind"] == "group"}
    assert all(0 < group["dev0_busy"] <= 1 and 0 < group["group_fill"] <= 1 for group in groups.values())
    assert groups["hybrid on 2 devices, micro-batches auto"]["micro_batches"] >= 1
    table = open(out / "bench.md").read()
    assert "2 independent copies (ceiling)" in table and "data parallel across 2 gloo processes" in table
    assert "| group | device 0 busy | device 1 busy | group fill |" in table
    assert os.path.getsize(out / "bench.png") > 1000


@pytest.mark.benchmark
def test_bench_suite_host_bound(binarized, tmp_path):
    """--host-bound: the hybrid_lstm systems at tiny widths and 4 + 4
    layers, where a cell's call is mostly host time; the table says so."""
    out = tmp_path / "bench"
    systems = "hybrid_lstm_base, 1 device;hybrid on 2 devices;hybrid on 2 devices, processes"
    run(sys.executable, os.path.join(BENCHMARKS, "bench_suite.py"), binarized / "bin", "--batches", "2", "--rounds", "1",
        "--max-tokens", "200", "--host-bound", "--systems", systems, "--out", out, timeout=600)
    result = json.load(open(out / "bench.json"))
    assert list(result["systems"]) == systems.split(";")
    assert result["model"] == "--arch hybrid_lstm_tiny --encoder-layers 4 --decoder-layers 4"
    table = open(out / "bench.md").read()
    assert "with `--arch hybrid_lstm_tiny --encoder-layers 4 --decoder-layers 4`" in table
    assert "nan" not in table  # the columns whose reference did not run are left empty
    assert not (out / "simulation.json").exists()


@pytest.mark.slow
@pytest.mark.benchmark
def test_simulate_schedule_smoke(binarized, tmp_path):
    """Calibration, validation against a suite's measurements and this
    machine's predictions, in one JSON: the cost
    model carries both times outside the cells (one device, one thread; a
    group's main thread, K threads) and every measured group gets a row."""
    suite = tmp_path / "bench"
    run(sys.executable, os.path.join(BENCHMARKS, "bench_suite.py"), binarized / "bin", "--batches", "2", "--rounds", "1",
        "--max-tokens", "200", "--no-simulation", "--out", suite, "--port", "29671",  # not the other smoke run's
        timeout=600)
    out = tmp_path / "simulation.json"
    run(sys.executable, os.path.join(BENCHMARKS, "simulate_schedule.py"), binarized / "bin", "--batches", "2",
        "--max-tokens", "200", "--devices", "1,2", "--measured", suite / "bench.json", "--json", out, timeout=600)
    result = json.load(open(out))
    cost = result["cost_model"]
    assert cost["step_overhead"] > 0 and cost["group_step_overhead"] > 0
    assert "with 2 (a group's main thread)" in cost["note"]
    measured = json.load(open(suite / "bench.json"))["systems"]
    assert set(result["validation"]) == {name for name, row in measured.items() if row["kind"] == "group"}
    for row in result["validation"].values():  # each prediction set against its measured speed-up
        assert row["error"] == pytest.approx(row["predicted"] / row["measured"] - 1)
    this = result["this_machine"]
    assert this["hybrid K=1"]["speedup"] == 1.0  # a speed-up over K = 1, priced step by step
    assert this["hybrid K=2"]["speedup"] == pytest.approx(this["hybrid K=1"]["seconds_per_step"] /
                                                          this["hybrid K=2"]["seconds_per_step"])


def test_bench_suite_refuses_fewer_batches_than_processes(binarized):
    result = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "bench_suite.py"), str(binarized / "bin"),
                             "--batches", "1", "--devices", "2", "--no-simulation"], capture_output=True, text=True)
    assert result.returncode == 2 and "every one of the K gloo processes needs at least one timed batch" in result.stderr


def test_bench_suite_ranks_can_split_each_batch(binarized):
    """With --global-batch the gloo processes train their shares of the
    same batches one device trains: together the same target tokens."""
    def tokens(name, *extra):
        done = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "bench_suite.py"), str(binarized / "bin"),
                               "--one", name, "--batches", "2", "--max-tokens", "200", "--port", "29675", *extra],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.split("RESULT ", 1)[1])["tokens"]

    one = tokens("hybrid_lstm_base, 1 device")
    assert tokens("data parallel across 2 gloo processes", "--global-batch") == one


def test_the_gpu_check_fits_the_machine_that_may_be_lent():
    """One H200 for 15 minutes of device time, start-up included: the
    check's phase limits add up to its 8-minute budget or less."""
    sys.path.insert(0, BENCHMARKS)
    try:
        import gpu_check
    finally:
        sys.path.remove(BENCHMARKS)
    assert gpu_check.BUDGET == 480 and sum(gpu_check.LIMITS.values()) <= gpu_check.BUDGET


def test_gpu_check_ends_a_hung_phase_and_all_it_started(tmp_path):
    """A phase that hangs (its test phase: a grandchild that would sleep
    ten minutes, then a wait for it) is ended at its 4-second limit with
    its whole process tree, what it had written is kept and marked timed
    out, and the check goes on; the budget counts the torch import."""
    out, work = tmp_path / "out", tmp_path / "work"
    started = time.time()
    finished = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "gpu_check.py"), "--device", "cpu",
                               "--phases", "hang,streams", "--steps", "1", "--batch", "2", "--groups", "2", "--out",
                               str(out), "--work", str(work)], capture_output=True, text=True, timeout=300)
    elapsed = time.time() - started
    assert finished.returncode == 1, finished.stderr[-3000:]  # a phase failed: the hung one
    report = json.load(open(out / "gpu_check.json"))
    hang = report["phases"]["hang"]
    assert hang["before_the_hang"] and hang["timed_out"] and not hang["ok"]
    assert hang["seconds"] < 4 + 10, hang  # ended by its own watchdog, well before the driver's kill at 14 s
    assert not alive(hang["grandchild"])
    assert report["phases"]["streams"]["ok"] and report["phases"]["streams"]["skipped"]  # the next phase ran
    # the budget's clock started with the process, before the torch import (a second or more here)
    assert elapsed - 1.0 < report["seconds"] <= elapsed
    assert "Thread" in open(hang["log"]).read()  # every thread's stack, dumped at the limit


def test_gpu_check_runs_without_a_gpu(tmp_path):
    """The GPU check's precision phase on CPU devices (fp32 only there):
    fairseq-train on one device and on a group, then the comparison; the
    calibrate phase's smoke run (the product's GPU measurements on CPU
    devices, the cost file they make, the chunk sweep with auto); the JSON
    and the table are written."""
    out = tmp_path / "out"
    run(sys.executable, os.path.join(BENCHMARKS, "gpu_check.py"), "--device", "cpu", "--phases",
        "precision,calibrate,cells,workers,streams", "--updates", "2", "--steps", "2", "--out", out, "--work",
        tmp_path / "work", timeout=600)
    report = json.load(open(out / "gpu_check.json"))
    runs = report["phases"]["precision"]["runs"]
    assert runs["fp32"]["one device"]["ok"] and runs["fp32"]["group cpu,cpu"]["finite"]
    assert runs["fp32"]["largest relative parameter difference"] < 1e-4
    assert "skipped" in runs["fp16"]
    assert "| precision | yes |" in open(out / "gpu_check.md").read()
    assert report["phases"]["streams"]["skipped"].startswith("needs CUDA")
    calibrate = report["phases"]["calibrate"]
    assert calibrate["ok"], calibrate
    assert set(calibrate["host_us_per_cell"]) == {"K=1", "K=2"}
    assert set(calibrate["chunk_sweep"]["rows"]) == {"0", "10", "2", "auto", "0, M=2", "0, M=4"}
    curve = calibrate["lstm_seconds_per_step"]
    assert [[batch for batch, _ in curve[phase]] for phase in ("forward", "backward")] == [[16, 32, 64, 128, 256, 512]] * 2
    assert report["seconds"] <= report["budget"] == 480
    assert all(row["tokens_per_s"] > 0 for row in calibrate["chunk_sweep"]["rows"].values())
    assert "| calibrate | yes |" in open(out / "gpu_check.md").read()
    from fairseq_hybrid.forecasts import cost_file  # what it measured, as a cost set the planner reads

    written = cost_file.load(str(out / "cost_file.json"))
    assert written["one_device_tokens_per_s"] == calibrate["one_device_tokens_per_s"]
    assert written["lstm"]["seconds_per_step"] == curve and written["lstm"]["hidden"] == 32
    assert written["host_cost"]["rows"][0]["cell_us"] == calibrate["host_us_per_cell"]["K=1"]
    # the cells phase: one LSTM and one attention-softmax cell traced, forward and backward, as the profiler
    # saw them on the workers' threads
    cells = report["phases"]["cells"]
    assert cells["ok"], cells
    assert set(cells["trace"]) == {f"{cell} chunk 0 ({phase})" for cell in ("decoder layer 1",
                                                                           "attention-softmax shard 1")
                                   for phase in ("forward", "backward")}
    lstm = cells["trace"]["decoder layer 1 chunk 0 (forward)"]
    assert "aten::mkldnn_rnn_layer" in lstm["top_ops_us"] and lstm["host_waits"] == [] and lstm["ops"] >= 10
    # the workers phase: threads and processes at K = 1 and 2, each device's host time per call, into the file
    workers = report["phases"]["workers"]
    assert workers["ok"], workers
    assert [(row["devices"], row["workers"]) for row in workers["rows"]] == [
        ("cpu", "threads"), ("cpu", "processes"), ("cpu,cpu", "threads"), ("cpu,cpu", "processes")]
    assert all(len(row["host_us_per_call"]) == len(row["devices"].split(",")) for row in workers["rows"])
    assert written.get("workers", {}).get("rows") == workers["rows"]
    assert "| cpu,cpu | processes |" in open(out / "gpu_check.md").read()


@pytest.mark.slow
@pytest.mark.benchmark
def test_bench_translate_smoke(trained, tmp_path):
    """Translating a file, timed side by side: translate.sh (batched) and
    fairseq-interactive on three lines, one of them blank."""
    work, _, _ = trained
    text = tmp_path / "input.ja"
    text.write_text("彼は医者です。\n\nこれ以上考えても無駄だ。\n", encoding="utf-8")
    out = tmp_path / "bench"
    run(sys.executable, os.path.join(BENCHMARKS, "bench_translate.py"), "--run", work / "tiny", "--input", text,
        "--lines", "3", "--rounds", "1", "--beam", "2", "--skip", "buffer 1", "--out", out, timeout=600)
    report = json.load(open(out / "translate.json"))
    assert [row["system"] for row in report["rows"]] == ["fairseq-interactive, buffer 64", "translate.sh, buffer 64"]
    assert report["lines"] == 3 and all(row["lines_per_second"] > 0 for row in report["rows"])
    assert "| translate.sh, buffer 64 |" in open(out / "translate.md").read()


def test_bench_host_cost_smoke(tmp_path):
    """Host time per cell where arithmetic is negligible: a row per K with
    each kind's cell time, the cost of one op, and ops per cell."""
    out = tmp_path / "host.json"
    run(sys.executable, os.path.join(BENCHMARKS, "bench_host_cost.py"), "--groups", "1,2", "--chunk-lengths", "0",
        "--steps", "1", "--json", out, timeout=300)
    report = json.load(open(out))
    assert [row["k"] for row in report["rows"]] == [1, 2]
    for row in report["rows"]:
        assert row["cell_us"]["lstm/forward"] > 0 and row["cell_us"]["attention_softmax/backward"] > 0
        assert row["outside_cells_us_per_cell"] >= 0
    assert report["op_us"] > 0
    assert report["ops_per_cell_k1_whole"]["lstm"] > report["ops_per_cell_k1_whole"]["embedding"] > 0
    assert all(0 < share < 1 for share in report["lstm_kernel_share_k1_whole"].values())


@pytest.mark.benchmark
def test_profile_training_smoke(binarized, tmp_path):
    """Where an update's time goes: phases that add up to the update, the
    ops with the most self time, the FLOP rates of the heavy work beside the
    machine's sgemm rate."""
    out = tmp_path / "profile.json"
    run(sys.executable, os.path.join(BENCHMARKS, "profile_training.py"), binarized / "bin", "--warmup", "1", "--steps",
        "2", "--top", "5", "--json", out, timeout=300)
    report = json.load(open(out))
    phases = report["phases_ms_per_update"]
    assert sum(phases.values()) == pytest.approx(report["ms_per_update"], rel=1e-6)
    assert phases["forward+loss"] > 0 and phases["backward"] > 0 and phases["optimizer"] > 0
    assert len(report["ops"]) == 5 and report["ops"][0]["self_ms_per_update"] > 0
    assert report["matrix_products"]["gflop_per_update"] > 0 and report["lstm_kernels"]["gflop_per_update"] > 0
    assert report["sgemm_gflop_per_s"] > 0
    assert {"encoder layer 0", "decoder layer 1"} <= report["forward_parts_ms_per_update"].keys()


@pytest.mark.slow
@pytest.mark.benchmark
def test_plan_measure_check_smoke(binarized, tmp_path):
    """fairseq-hybrid-plan --measure, then the suite's matching systems
    (each group in the options the plan chose for it), and the report that
    sets them side by side: each candidate's prediction, measurement and
    suite counterpart, and the plan's pick against the suite's fastest."""
    out = tmp_path / "check"
    run(sys.executable, os.path.join(BENCHMARKS, "plan_measure_check.py"), binarized / "bin", "--rounds", "1",
        "--max-tokens", "200", "--suite-batches", "2", "--plan-batches", "2", "--port", "29673", "--out", out,
        timeout=900)
    report = json.load(open(f"{out}.json"))
    assert [row["name"] for row in report["plan"]["rows"]] == ["one GPU", "DDP on 2", "one group of 2, threads",
                                                               "one group of 2, processes"]
    assert set(report["suite"]) == {"hybrid_lstm_base, 1 device, 2 threads", "data parallel across 2 gloo processes",
                                    "one group of 2, threads, as planned", "one group of 2, processes, as planned"}
    # the suite ran each group in the plan's own choice for it
    ran = json.load(open(f"{out}_suite/bench.json"))["systems"]
    for row in report["plan"]["rows"][2:]:
        options = ran[row["name"] + ", as planned"]["options"].split()
        given = dict(zip(options[::2], options[1::2]))
        assert given["--hybrid-chunk-length"] == str(row["chunk_length"])
        assert given["--hybrid-micro-batches"] == str(row["micro_batches"])
        assert given["--hybrid-workers"] == row["workers"]
        assert given.get("--hybrid-placement", "") == (row.get("placement") or "")
    suite, picked, fastest = report["suite"], report["plan_picks"], report["suite_fastest"]
    assert picked in suite and fastest == max(suite, key=lambda name: suite[name]["median"])
    assert all(row["median"] == statistics.median(row["rounds"]) for row in suite.values())
    # within the suite's noise: the pick is the fastest, or its best round reaches the fastest's worst
    assert report["pick_within_suite_noise"] == (picked == fastest
                                                 or suite[picked]["highest"] >= suite[fastest]["lowest"])
    assert "Predictions within 10% of the plan's own measurement" in open(f"{out}.md").read()




@pytest.mark.benchmark
def test_calibration_thread_order_smoke(binarized):
    """Each order of thread counts in a fresh process, each of its six
    settings timed."""
    done = run(sys.executable, os.path.join(BENCHMARKS, "calibration_thread_order.py"), binarized / "bin", "--runs", "1",
               timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("run 1")]
    assert [line.split(":")[0] for line in lines] == ["run 1, began at K", "run 1, began at 1"]
    assert [len(re.findall(r"\dt \d+ ms", line)) for line in lines] == [6, 6]


@pytest.mark.benchmark
def test_profile_workers_smoke(tmp_path):
    """Where a group's step goes, per worker: every system timed, each
    stage's own timers (one build and one backward a step, its messages
    counted), and cProfile's reading of the same functions beside them."""
    out = tmp_path / "profile.md"
    run(sys.executable, os.path.join(BENCHMARKS, "profile_workers.py"), "--warmup", "1", "--steps", "2",
        "--layers", "2", "--out", out, timeout=300)
    report = json.load(open(tmp_path / "profile.json"))["results"]
    assert list(report) == ["one device", "threads", "processes", "processes, gloo wire"]
    for name in ("processes", "processes, gloo wire"):
        calls = report[name]["calls"]
        for stage in ("stage 0", "stage 1"):
            assert calls[stage]["build"] == 2 and calls[stage]["stage: backward command"] == 2
            assert calls[stage]["messages: send"] > 0
            profiled = report[name]["profiled"][stage.replace(" ", "")]
            assert profiled["build"] == pytest.approx(report[name]["stages"][stage[-1]]["build"], rel=0.5)
    assert "| processes |" in out.read_text()
    builds = json.load(open(tmp_path / "profile.json"))["builds"]
    assert [row["k"] for row in builds] == [2]  # 2 layers: a group of 4 has no place
    assert len(builds[0]["workers_ms"]) == 2 and builds[0]["goal_share"] == pytest.approx(0.6)


@pytest.mark.slow
@pytest.mark.benchmark
def test_bench_trainer_threads_smoke(binarized, tmp_path):
    """Both kinds of workers, the trainer kept at every core and as the
    group leaves it, in alternating rounds, written as JSON and a table."""
    out = tmp_path / "threads"
    run(sys.executable, os.path.join(BENCHMARKS, "bench_trainer_threads.py"), binarized / "bin", "--host-bound",
        "--max-tokens", "200", "--batches", "2", "--rounds", "2", "--out", out, timeout=600)
    report = json.load(open(f"{out}.json"))
    assert [row["workers"] for row in report["rows"]] == ["threads", "processes"]
    for row in report["rows"]:
        assert len(row["kept_tokens_per_s"]) == len(row["left_tokens_per_s"]) == 2
        assert row["ratio"] == max(row["left_tokens_per_s"]) / max(row["kept_tokens_per_s"])
    assert "| processes |" in open(f"{out}.md").read()


def test_the_suite_leaves_no_system_running_when_it_is_stopped(binarized, tmp_path):
    """bench_suite.py stopped by SIGTERM while a system runs in its own
    process (a quiet one: it writes only at its end) leaves no system
    running: the system ends with the suite (the parent-death signal its
    start set, harness.measuring.ending_with_this_process)."""
    import signal

    suite = subprocess.Popen([sys.executable, os.path.join(BENCHMARKS, "bench_suite.py"), binarized / "bin",
                              "--batches", "250", "--rounds", "1", "--max-tokens", "200", "--systems",
                              "hybrid_lstm_base, 1 device", "--out", tmp_path / "bench"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert_children_end_with(suite, signal.SIGTERM, what="a system of the suite")
