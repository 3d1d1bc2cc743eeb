"""A process per device priced as built (planning/schedule_simulator.py,
timing/worker_costs.py, forecasts/gpu_costs.py): the messages the
simulator counts are the ones the stages send, each cost it adds is there
when given and gone when free, and the GPU forecast takes the measured
file or the GPU check's readings."""

import copy
import json

import pytest
import torch

from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
from fairseq_hybrid.forecasts import gpu_costs
from fairseq_hybrid.harness.exactness import single_and_group
from fairseq_hybrid.harness.measuring import loss_and_grads
from fairseq_hybrid.harness.stand_ins import StandInTask
from fairseq_hybrid.parallel import build_plan, build_step
from fairseq_hybrid.planning.owned_bytes import plan_owned_bytes
from fairseq_hybrid.planning.schedule_simulator import CostModel, messages, step_time
from fairseq_hybrid.planning.twin_model import batch, twin_model

FIXED = {f"{kind}/{phase}": 1e-4 for kind in ("lstm", "attention_softmax", "embedding", "gather")
         for phase in ("forward", "backward")}


def counted_sends(monkeypatch, wire):
    """The sends of ``wire``'s class in this process and every stage forked
    from it, in memory they share: [not known, known]."""
    import multiprocessing

    counts = multiprocessing.get_context("fork").Array("i", 2)
    original = wire._send

    def counting(self, peer, tensor, requires_grad, known):
        with counts.get_lock():
            counts[int(known)] += 1
        return original(self, peer, tensor, requires_grad, known)

    monkeypatch.setattr(wire, "_send", counting)
    return counts


@pytest.mark.parametrize("mode,count,micro_batches", [("hybrid", 2, 1), ("hybrid", 3, 2), ("model", 2, 1)])
def test_the_messages_counted_are_the_ones_the_stages_send(mode, count, micro_batches, dictionaries, monkeypatch):
    """A step of real stages sends the messages the simulator counts for
    the same cells (forward: an output once to each worker that reads it,
    exactly; backward: a gradient for every input read from another
    worker, less those of values sent as needing none, which only a
    micro-batch's chunks past all of its sentences are)."""
    from fairseq_hybrid.parallel.processes.host_wire import HostWire

    by_phase = counted_sends(monkeypatch, HostWire)  # forward, backward (sent known)
    options = {"hybrid_devices": ",".join(["cpu"] * count), "hybrid_mode": mode, "hybrid_workers": "processes",
               "hybrid_chunk_length": 2, "hybrid_micro_batches": micro_batches}
    _, group, sample = single_and_group(dictionaries, options)
    criterion = HybridCrossEntropyCriterion(StandInTask(*dictionaries), False, 0.1, output_loss_chunk_rows=5)
    try:
        loss_and_grads(group, criterion, sample)
        sent, _, seconds = group.hybrid_group.runtime.sent
        assert group.hybrid_group.runtime.sent_so_far == [sent, _, seconds] and seconds > 0  # one step so far
    finally:
        group.hybrid_group.stages.close()
    hybrid = group.hybrid_group
    built = build_step(group, hybrid.plan, sample["net_input"], sample["target"], None, 2, micro_batches)
    counted = messages(built.step.cells)
    forward, backward = by_phase
    assert sent == forward + backward
    assert forward == sum(counted["forward"][0]) == sum(counted["forward"][1]) > 0
    assert sum(counted["backward"][0]) == sum(counted["backward"][1]) >= sum(counted["forward"][0])
    if micro_batches == 1:
        assert backward == sum(counted["backward"][0])
    else:  # the second micro-batch's sentences end before the batch's last chunks
        assert 0 < backward < sum(counted["backward"][0])


@pytest.mark.parametrize("mode,count,micro_batches", [("hybrid", 2, 1), ("hybrid", 3, 2), ("model", 2, 1)])
def test_the_gpu_wire_describes_each_shape_once(mode, count, micro_batches, dictionaries, monkeypatch):
    """Stages on the GPU wire (gloo here, as between stages sharing a GPU):
    the first step of a shape sends every forward message with a header;
    later steps of that shape send none, even for a batch of other rows
    and lengths (each shape from the producer's cell kind), and a gradient
    for every input read from another worker (one that needs none is sent
    and dropped); a batch of another shape is described again.  Every
    step equals the threads' to the bit."""
    from fairseq_hybrid.harness.stand_ins import make_sample
    from fairseq_hybrid.parallel.processes import stage_processes
    from fairseq_hybrid.parallel.processes.gpu_wire import GpuWire

    counts = counted_sends(monkeypatch, GpuWire)  # with a header, sent known
    monkeypatch.setattr(stage_processes, "wire_ends", lambda context, size: [None] * size)  # gloo, not pipes
    criterion = HybridCrossEntropyCriterion(StandInTask(*dictionaries), False, 0.1)
    options = {"hybrid_devices": ",".join(["cpu"] * count), "hybrid_mode": mode, "hybrid_chunk_length": 2,
               "hybrid_micro_batches": micro_batches}
    _, threads, first = single_and_group(dictionaries, {**options, "hybrid_workers": "threads"})
    _, processes, _ = single_and_group(dictionaries, {**options, "hybrid_workers": "processes"})
    # the same chunk counts as the first batch in each micro-batch, other rows and lengths; then one of fewer chunks
    same_shape = make_sample(*dictionaries, *([[11, 4, 12, 2, 8], [9, 3, 5, 10, 2]] if micro_batches == 1 else
                                              [[5, 8, 10, 12, 7, 12], [7, 7, 10, 8, 3, 6]]), seed=1)
    other_shape = make_sample(*dictionaries, [5, 3, 6, 2], [4, 7, 3, 2], seed=2)
    steps, shapes = [], []
    try:
        for sample in (first, first, same_shape, other_shape):
            before = list(counts)
            runs = []
            for group in (threads, processes):
                torch.manual_seed(5)
                runs.append(loss_and_grads(group, criterion, sample))
            (on_threads, on_processes) = runs
            assert torch.equal(on_processes[0], on_threads[0])
            assert not [name for name in on_threads[2] if not torch.equal(on_processes[2][name], on_threads[2][name])]
            built = build_step(threads, threads.hybrid_group.plan, sample["net_input"], sample["target"], None, 2,
                               micro_batches)
            counted = messages(built.step.cells)
            shapes.append(built.wiring)  # one per shape (its skeleton's)
            steps.append((counts[0] - before[0], counts[1] - before[1], sum(counted["forward"][0]),
                          sum(counted["backward"][0])))
    finally:
        processes.hybrid_group.stages.close()
    assert shapes[0] is shapes[1] is shapes[2] is not shapes[3]
    (headers, known, forward, backward), *later = steps
    assert headers == forward > 0 and 0 < known <= backward  # described; a gradient for what needs one
    assert known == backward or micro_batches > 1  # only a micro-batch's chunks past its sentences need none
    for headers, known, forward, backward in later[:2]:  # the same shape: no header, every gradient
        assert (headers, known) == (0, forward + backward)
    headers, known, forward, backward = later[2]  # another shape: described again
    assert headers == forward > 0 and known <= backward


def test_a_cell_kind_that_declares_a_wrong_shape_fails_by_name(dictionaries, monkeypatch):
    """A kind whose declared output shape is not what its cell makes stops
    the step at the sender, naming the cell, before any receive of the
    wrong size (here every declared first dimension one row too many)."""
    from fairseq_hybrid.parallel.processes import stage_processes
    from fairseq_hybrid.parallel.recipe import cell_kinds

    for kind in (cell_kinds.SourceEmbedding, cell_kinds.EncoderDirection, cell_kinds.EncoderChunk,
                 cell_kinds.EncoderTop, cell_kinds.TargetEmbedding, cell_kinds.DecoderChunk):
        declared = kind.output_shapes
        monkeypatch.setattr(kind, "output_shapes", lambda self, making, batch, declared=declared: tuple(
            (shape[0] + 1, *shape[1:]) for shape in declared(self, making, batch)))
    monkeypatch.setattr(stage_processes, "wire_ends", lambda context, size: [None] * size)  # the GPU wire
    criterion = HybridCrossEntropyCriterion(StandInTask(*dictionaries), False, 0.1)
    _, group, sample = single_and_group(dictionaries, {"hybrid_devices": "cpu,cpu", "hybrid_chunk_length": 2,
                                                       "hybrid_workers": "processes"})
    try:
        with pytest.raises(Exception, match=r"its cell kind declares \(8, "):
            loss_and_grads(group, criterion, sample)
    finally:
        group.hybrid_group.stages.close()


def tiny_step(cost, k=2, chunk_length=3):
    model, cfg = twin_model("hybrid_lstm_tiny", 60, encoder_layers=4, decoder_layers=4)
    plan = build_plan(",".join(["cpu"] * k), "", "hybrid", 4, 4)
    return step_time(model, plan, *batch(6, [7, 5, 9, 4, 8, 6], 8), cost, chunk_length), model, plan


@pytest.mark.parametrize("queued", [False, True])
def test_each_cost_of_processes_adds_what_it_says(queued):
    """Free, processes cost what threads cost with a host per device; each
    measured cost then adds to the step (a build delays each worker's first
    cell, messages lengthen the cells' host time, the commands and the
    gradients' copy lengthen the step), and the report names each."""
    threads = CostModel(fixed=dict(FIXED), step_overhead=2e-3, host_queues=queued, host_per_device=True)
    free = copy.deepcopy(threads)
    free.workers = "processes"
    base, model, plan = tiny_step(threads)
    same, _, _ = tiny_step(free)
    assert same.total == pytest.approx(base.total, rel=1e-12)
    assert same.parts == {"builds (the longest)": 0.0, "messages (the busiest host)": 0.0, "commands": 0.0,
                          "gradient copy": 0.0}

    commands = copy.deepcopy(free)
    commands.command_round_trip = 1e-3
    assert tiny_step(commands)[0].total == pytest.approx(base.total + 2e-3, rel=1e-9)
    copying = copy.deepcopy(free)
    copying.copy_bandwidth = 1e8
    end_of_pass = max(plan_owned_bytes(model, plan, attention_softmax=False))
    assert tiny_step(copying)[0].total == pytest.approx(base.total + end_of_pass / 1e8, rel=1e-9)
    talking = copy.deepcopy(free)
    talking.message_send = talking.message_receive = 2e-5
    talked = tiny_step(talking)[0]
    assert talked.forward > base.forward and talked.backward > base.backward
    assert talked.parts["messages (the busiest host)"] > 0
    forward_only = copy.deepcopy(talking)
    forward_only.described = ("forward",)  # a pass whose messages go without a description costs none
    quiet = tiny_step(forward_only)[0]
    assert quiet.forward == pytest.approx(talked.forward, rel=1e-12)
    assert quiet.backward == pytest.approx(base.backward, rel=1e-12)
    assert 0 < quiet.parts["messages (the busiest host)"] < talked.parts["messages (the busiest host)"]
    headerless = copy.deepcopy(talking)
    headerless.described = ()  # the GPU wire after a shape's first step
    silent = tiny_step(headerless)[0]
    assert (silent.forward, silent.backward) == (pytest.approx(base.forward, rel=1e-12),
                                                 pytest.approx(base.backward, rel=1e-12))
    assert silent.parts["messages (the busiest host)"] == 0
    building = copy.deepcopy(free)
    building.build_fixed, building.build_per_cell, building.build_per_own_cell = 1e-4, 5e-6, 8e-6
    built = tiny_step(building)[0]
    assert built.parts["builds (the longest)"] > 0 and built.backward == pytest.approx(base.backward, rel=1e-12)
    assert built.forward > base.forward
    if not queued:  # the trainer no longer builds: its time outside the cells loses the threads' one build
        cells = len(build_step(model, plan, *batch(6, [7, 5, 9, 4, 8, 6], 8), None, 3).step.cells)
        whole = 1e-4 + 13e-6 * cells
        assert built.extra == pytest.approx(base.extra - whole, rel=1e-9)


def test_the_gpu_forecast_prices_processes_as_measured(tmp_path):
    """Under a GPU set, a process per device takes the measured file's
    costs (its build and commands; no message's host time: after a
    shape's first step nothing between GPU stages goes with a header),
    or, where a cost file
    holds the GPU check's readings for processes, their host time per call
    and nothing beside it."""
    report = gpu_costs.worker_costs_report()
    cost = gpu_costs.as_built_processes(CostModel(fixed=dict(FIXED)), "a100", None, 4)
    assert cost.workers == "processes"
    assert (cost.message_send, cost.message_receive, cost.described) == (0.0, 0.0, ())
    assert cost.build_per_cell == report["build_per_cell"] and cost.command_round_trip == report["command_round_trip"]
    assert cost.copy_bandwidth == gpu_costs.MEMORY_BANDWIDTH["a100"] / 2
    readings = {"workers": {"rows": [
        {"devices": "cuda:0", "workers": "processes", "host_us_per_call": [40.0]},
        {"devices": "cuda:0,cuda:1,cuda:2,cuda:3", "workers": "processes", "host_us_per_call": [50.0, 70.0, 60.0, 60.0]},
        {"devices": "cuda:0,cuda:1,cuda:2,cuda:3", "workers": "threads", "host_us_per_call": [10.0] * 4}]}}
    path = tmp_path / "cost_file.json"
    path.write_text(json.dumps(readings))
    read = gpu_costs.as_built_processes(CostModel(fixed=dict(FIXED)), "a100", str(path), 4)
    assert list(read.fixed.values()) == pytest.approx([60e-6] * len(FIXED))
    assert read.message_send == 0.0 and read.build_fixed == 0.0


def test_worker_costs_measure_this_machine():
    """The wires' costs are measured between two processes of this machine
    (no process left behind) and the build's fit predicts the builds it was
    fitted to."""
    import multiprocessing

    from fairseq_hybrid.timing.worker_costs import build_costs, wire_costs

    before = set(multiprocessing.active_children())  # an earlier test's group, ended when collected
    for kind in ("host", "gloo header"):
        measured = wire_costs(kind, 1000)
        assert 0 < measured["message_send"] < 0.05 and 0 < measured["message_receive"] < 0.05
        assert 0 < measured["command_round_trip"] < 0.05
    assert set(multiprocessing.active_children()) <= before
    model, cfg = twin_model("hybrid_lstm_tiny", 60, encoder_layers=4, decoder_layers=4)
    net_input, target = batch(6, [7, 5, 9, 4, 8, 6], 8)
    fitted = build_costs(model, (4, 4), [{"net_input": net_input, "target": target}], repeats=3)
    assert fitted["build_samples"] == 2 * (3 + 5)  # K = 2 and 4, whole and each worker, two chunk lengths
    assert fitted["build_per_cell"] + fitted["build_per_own_cell"] > 0
    assert torch.isfinite(torch.tensor([fitted["build_fixed"], fitted["build_per_cell"]])).all()


def test_auto_takes_the_workers_the_h200_file_prices_faster(tmp_path):
    """Under the H200's cost file (its cost models for a group of 4 added
    as calibrate adds them), a process per device prices the paper's model
    at 128 sentences faster, so auto takes it; made dearer than threads
    (a command's round trip of 20 ms), auto takes threads."""
    import shutil

    from fairseq_hybrid.command_lines.train_command import parse_training
    from fairseq_hybrid.forecasts.cost_file import add_engine_cost_model
    from fairseq_hybrid.planning import priced_workers

    path = str(tmp_path / "h200.json")
    shutil.copy("docs/bench/cost_file_h200.json", path)
    add_engine_cost_model(path, parse_training(["-", "--arch", "hybrid_lstm_paper", "--batch-size", "128"]), 4)
    threads, processes = CostModel.load(path), CostModel.load(path, "processes_cost_model")
    assert threads.workers == "threads" and processes.workers == "processes" and processes.command_round_trip > 0
    assert list(processes.described) == []  # no message goes with a header once a shape is described
    model, cfg = twin_model("hybrid_lstm_paper", 32000)
    plan = build_plan(",".join(["cpu"] * 4), "", "hybrid", cfg.encoder_layers, cfg.decoder_layers)
    sample = batch(128, [50] * 128, 50)
    chosen, prices = priced_workers(model, plan, *sample, threads, processes, 25)
    assert chosen == "processes" and prices["processes"] < prices["threads"]
    processes.command_round_trip = 0.02
    chosen, prices = priced_workers(model, plan, *sample, threads, processes, 25)
    assert chosen == "threads" and prices["processes"] > prices["threads"]


@pytest.mark.parametrize("round_trip,expected", [(0.0, "processes"), (1.0, "threads")])
def test_a_group_with_auto_workers_runs_what_its_cost_file_prices_faster(round_trip, expected, dictionaries, tmp_path):
    """A group given a cost file with both cost models and --hybrid-workers
    auto starts, at its first batch, the kind priced faster: a host per
    device queueing its cells when processes cost nothing more, threads
    when each command takes a second."""
    from fairseq_hybrid.parallel import StageProcesses, WorkerThreads

    threads = CostModel(fixed=dict(FIXED), host_queues=True)
    processes = CostModel(fixed=dict(FIXED), host_queues=True, host_per_device=True, workers="processes",
                          command_round_trip=round_trip)
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"cost_model": threads.__dict__, "processes_cost_model": processes.__dict__}))
    options = {"hybrid_devices": "cpu,cpu", "hybrid_workers": "auto", "hybrid_cost_model": str(path)}
    _, group, sample = single_and_group(dictionaries, options)
    criterion = HybridCrossEntropyCriterion(StandInTask(*dictionaries), False, 0.1, output_loss_chunk_rows=5)
    hybrid = group.hybrid_group
    assert hybrid.workers == "threads" and hybrid.prices is not None  # not chosen before a batch
    try:
        loss_and_grads(group, criterion, sample)
        assert hybrid.workers == expected
        assert isinstance(hybrid.runtime, StageProcesses if expected == "processes" else WorkerThreads)
    finally:
        if hybrid.stages is not None:
            hybrid.stages.close()


def test_auto_without_prices_for_processes_keeps_threads(dictionaries, tmp_path):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"cost_model": CostModel(fixed=dict(FIXED)).__dict__}))
    options = {"hybrid_devices": "cpu,cpu", "hybrid_workers": "auto", "hybrid_cost_model": str(path)}
    _, group, _ = single_and_group(dictionaries, options)
    assert group.hybrid_group.prices is None and group.hybrid_group.workers == "threads"


def test_the_wire_measurement_leaves_no_process_when_its_own_ends_abruptly():
    """The peer a wire measurement forks ends with the process that
    measures, even one killed mid-measurement (os._exit: no handler runs)."""
    import subprocess
    import sys
    import time

    from conftest import alive

    code = ("import multiprocessing, os, threading, time\n"
            "from fairseq_hybrid.timing import worker_costs\n"
            "threading.Thread(target=worker_costs.wire_costs, args=('host',), daemon=True).start()\n"
            "while not multiprocessing.active_children(): time.sleep(0.01)\n"
            "print(multiprocessing.active_children()[0].pid, flush=True)\n"
            "os._exit(1)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    peer = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while alive(peer) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(peer), f"the measurement's peer {peer} outlived it"
