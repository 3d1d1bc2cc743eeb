"""--hybrid-workers processes: a process per device (parallel/processes/stage.py,
stage_processes.py, gpu_wire.py).  The step equals one device's (and, with the
same seed, the threads' step), a dead or failing stage ends the step with
an error naming its device and cell, and no stage outlives the trainer."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from conftest import StandInTask, alive, build_model, make_sample
from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
from fairseq_hybrid.harness.exactness import LAYERS, SRC_LENGTHS, TGT_LENGTHS, check_equal, loss_and_grads, single_and_group
from fairseq_hybrid.parallel.recipe.device_plan import MODES, DevicePlanError
from fairseq_hybrid.parallel.runtime.worker import WorkerError

PROCESSES = {"hybrid_workers": "processes"}


def stage_pids(model):
    return [process.pid for process in model.hybrid_group.stages.processes]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_processes_equal_one_device(count, mode, dictionaries):
    check_equal(["cpu"] * count, mode, dictionaries, group_options=PROCESSES)


CUDA_COUNT = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(CUDA_COUNT < 1, reason="needs a CUDA device")
@pytest.mark.parametrize("mode,micro_batches", [("hybrid", 1), ("data", 1), ("hybrid", 3)])
def test_cuda_processes_equal_one_device(mode, micro_batches, dictionaries):
    """Stages on GPUs (spawned; NCCL between distinct GPUs, gloo through
    host memory where they share one), the batch on the first device."""
    devices = [f"cuda:{i % CUDA_COUNT}" for i in range(min(4, max(2, CUDA_COUNT)))]
    check_equal(devices, mode, dictionaries, batch_on_first_device=True,
                group_options={**PROCESSES, "hybrid_micro_batches": micro_batches})


@pytest.mark.parametrize("mode", ["hybrid", "model"])
@pytest.mark.parametrize("count", [2, 4])
@pytest.mark.parametrize("micro_batches", [2, 4])
def test_processes_with_micro_batches_equal_one_device(micro_batches, count, mode, dictionaries):
    check_equal(["cpu"] * count, mode, dictionaries,
                group_options={**PROCESSES, "hybrid_micro_batches": micro_batches, "hybrid_chunk_length": 2})


def test_processes_with_attention_softmax_cells_over_several_chunks(dictionaries):
    check_equal(["cpu"] * 2, "hybrid", dictionaries,
                group_options={**PROCESSES, "hybrid_softmax_chunks": "0", "hybrid_chunk_length": 2})


def test_spawned_stages_equal_one_device(dictionaries, monkeypatch):
    """Stages started as a GPU group starts them (spawn: a fresh
    interpreter, the model pickled with torch's reductions, its parameters
    shared rather than copied), here on CPU devices."""
    from fairseq_hybrid.parallel.processes.stage_processes import StageProcesses

    monkeypatch.setattr(StageProcesses, "start_method", "spawn")
    check_equal(["cpu"] * 2, "hybrid", dictionaries, group_options=PROCESSES)


@pytest.mark.parametrize("mode", MODES)
def test_processes_with_tied_embeddings_residual_and_mlp_attention(mode, dictionaries):
    check_equal(["cpu"] * 3, mode, dictionaries, group_options=PROCESSES, share_decoder_input_output_embed=True,
                residual=True, attention_type="mlp")


def test_processes_with_bidirectional_layers_and_reverse_on_its_own_device(dictionaries):
    check_equal(["cpu"] * 3, "hybrid", dictionaries, group_options={**PROCESSES, "hybrid_chunk_length": 2},
                encoder_bidirectional_layers=2)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("count,micro_batches", [(3, 1), (2, 2)])
def test_processes_equal_threads_bit_for_bit(mode, count, micro_batches, dictionaries):
    """Per-cell masks: each cell's generator is seeded from the step's seed
    and the cell's index, whoever runs it, and every sum is added in the
    same order, so with the same seed threads and processes give the same
    loss and gradients to the bit (and dropout is on: a later step
    differs)."""
    if mode == "data" and micro_batches > 1:
        pytest.skip("data mode has no micro-batches")
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    sample = make_sample(src_dict, tgt_dict, SRC_LENGTHS, TGT_LENGTHS)
    runs = []
    for workers in ("threads", "processes"):
        torch.manual_seed(0)
        model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **LAYERS, dropout=0.3,
                            hybrid_devices=",".join(["cpu"] * count), hybrid_mode=mode, hybrid_chunk_length=2,
                            hybrid_workers=workers, hybrid_micro_batches=micro_batches)
        torch.manual_seed(5)
        runs.append(loss_and_grads(model.train(), criterion, sample))
        runs.append(loss_and_grads(model, criterion, sample))
    (threads, threads_next, processes, processes_next) = runs
    assert torch.equal(processes[0], threads[0])
    assert set(processes[2]) == set(threads[2])
    different = [name for name in threads[2] if not torch.equal(processes[2][name], threads[2][name])]
    assert not different, f"gradients that differ: {different}"
    assert torch.equal(processes_next[0], threads_next[0])
    assert not torch.equal(processes_next[0], processes[0])


@pytest.mark.parametrize("count", [2, 3])
def test_the_attention_softmax_gradients_leave_every_stage_mid_pass_and_are_added_there(count, dictionaries):
    """Each stage hands over the attention-softmax part's gradients (its
    replica's, or the master's on the master's stage) as soon as its last
    cell on the part has run backward, not with its reply; the trainer adds
    them while a stage still runs its pass."""
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    torch.manual_seed(0)
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **LAYERS, hybrid_devices=",".join(["cpu"] * count),
                        hybrid_workers="processes")
    criterion(model.train(), make_sample(src_dict, tgt_dict, SRC_LENGTHS, TGT_LENGTHS))[0].backward()
    stages = model.hybrid_group.stages
    names = [name for name, _ in model.named_parameters()]
    part = sorted(name for name in names if name.startswith("decoder.attention_softmax."))
    handed = {me: {names[position] for position in positions} for me, positions in stages.handed_mid_pass.items()}
    assert sorted(handed) == list(range(count))
    assert all(handed[me] >= set(part) for me in handed), handed  # (and a reverse direction's replica, on stage 1)
    assert stages.added_early == (count - 1) * len(part)


def test_two_backward_passes_before_the_optimizer_add_up(dictionaries):
    """--update-freq 2: a gradient that is a stage's buffer is copied
    before the second backward pass writes the buffer again, so the sum is
    both batches' (one device's sum)."""
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    single, group, sample = single_and_group(dictionaries, {"hybrid_devices": "cpu,cpu", **PROCESSES})
    other = make_sample(src_dict, tgt_dict, [4, 7, 2], [6, 3, 5])
    sums = []
    for model in (single, group):
        model.zero_grad(set_to_none=True)
        for batch in (sample, other):
            criterion(model, batch)[0].backward()
        sums.append({name: p.grad.clone() for name, p in model.named_parameters()})
    for name in sums[0]:
        torch.testing.assert_close(sums[1][name], sums[0][name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("start_method", [None, "spawn"])
def test_the_optimizers_updates_reach_the_stages(start_method, dictionaries, monkeypatch):
    """The stages read the trainer's parameters themselves (forked or
    spawned): after an in-place update (what fairseq's optimizers do), the
    next step's loss is the one device's at the updated weights."""
    from fairseq_hybrid.parallel.processes.stage_processes import StageProcesses

    monkeypatch.setattr(StageProcesses, "start_method", start_method)
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.0)
    single, group, sample = single_and_group(dictionaries, {"hybrid_devices": "cpu,cpu,cpu", **PROCESSES})
    for model in (single, group):
        criterion(model, sample)[0].backward()
        with torch.no_grad():
            for param in model.parameters():
                param.add_(param.grad, alpha=-0.5)
        model.zero_grad(set_to_none=True)
    before = stage_pids(group)
    torch.testing.assert_close(criterion(group, sample)[0], criterion(single, sample)[0], rtol=1e-5, atol=0)
    assert stage_pids(group) == before  # the same stages, not started again
    # a parameter whose storage is replaced is shared again with new stages
    group.decoder.attention_softmax.output_bias.data = group.decoder.attention_softmax.output_bias.data.clone() + 1
    single.decoder.attention_softmax.output_bias.data += 1
    torch.testing.assert_close(criterion(group, sample)[0], criterion(single, sample)[0], rtol=1e-5, atol=0)
    assert not set(stage_pids(group)) & set(before)
    assert not any(alive(pid) for pid in before)


def test_validation_without_backward_then_training(dictionaries):
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    single, group, sample = single_and_group(dictionaries, {"hybrid_devices": "cpu,cpu", **PROCESSES})
    with torch.no_grad():
        torch.testing.assert_close(criterion(group.eval(), sample)[0], criterion(single.eval(), sample)[0],
                                   rtol=1e-5, atol=0)
    single.train()
    group.train()
    loss_ref, _, grads_ref = loss_and_grads(single, criterion, sample)
    loss, _, grads = loss_and_grads(group, criterion, sample)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=0)
    for name in grads_ref:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=1e-5, atol=1e-7, msg=name)


def test_processes_take_one_kind_of_device():
    from fairseq_hybrid.hybrid_group import worker_kind

    with pytest.raises(DevicePlanError, match="cpu devices or cuda:N devices"):
        worker_kind("processes", [torch.device("cpu"), torch.device("cuda", 0)])
    with pytest.raises(DevicePlanError, match="choose one of auto, threads, processes"):
        worker_kind("fibres", [torch.device("cpu")])
    assert worker_kind("processes", [torch.device("cpu", 0), torch.device("cpu", 1)]) == "processes"  # virtual
    assert worker_kind("auto", [torch.device("cpu")] * 2) == "threads"


# -- faults --------------------------------------------------------------------------------------------------


def _dies_in_encoder_layer_1(monkeypatch, how):
    """Encoder layer 1's cells end their stage's process (``how``:
    ``kill``, SIGKILL; ``raise``, an exception): the stages are forked, so
    they inherit the patch."""
    from fairseq_hybrid.models import lstm_stacks

    real = lstm_stacks.LSTMEncoderStack.run_chunk

    def run_chunk(self, layer, *args, **kwargs):
        if layer == 1 and os.environ.get("HYBRID_TEST_FAULT") == how:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("the cell broke on purpose")
        return real(self, layer, *args, **kwargs)

    monkeypatch.setattr(lstm_stacks.LSTMEncoderStack, "run_chunk", run_chunk)


@pytest.mark.parametrize("how,message", [
    ("kill", r"hybrid stage 1 \(cpu\) died \(exit code -9\) in encoder layer 1 chunk 0 \(forward\)"),
    ("raise", r"hybrid stage 1 \(cpu\) failed: RuntimeError: the cell broke on purpose")])
def test_a_stage_that_dies_or_fails_ends_the_step_naming_device_and_cell(how, message, dictionaries, monkeypatch):
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    single, group, sample = single_and_group(dictionaries, {"hybrid_devices": "cpu,cpu", "hybrid_timeout": 60,
                                                            **PROCESSES})
    _dies_in_encoder_layer_1(monkeypatch, how)
    criterion(group, sample)  # the stages start and run a step
    pids = stage_pids(group)
    monkeypatch.setenv("HYBRID_TEST_FAULT", how)  # the stages' cells read it: new stages, forked with it set
    group.hybrid_group.stages.close()
    assert not any(alive(pid) for pid in pids)
    started = time.monotonic()
    with pytest.raises(WorkerError, match=message):
        criterion(group, sample)
    assert time.monotonic() - started < 10
    assert group.hybrid_group.stages.processes == []  # every stage ended
    monkeypatch.delenv("HYBRID_TEST_FAULT")
    # the next step starts new stages and computes one device's loss
    torch.testing.assert_close(criterion(group, sample)[0], criterion(single, sample)[0], rtol=1e-5, atol=0)


def test_a_stage_that_dies_in_backward_is_named_with_its_cell(dictionaries, monkeypatch):
    """The stage says each cell's name before its backward too: one killed
    there is named with the cell it was in."""
    from fairseq_hybrid.parallel.runtime import cell_graph

    real = cell_graph.CellGraph._backward_cell

    def backward_cell(self, index):
        if self.cells[index].name == "encoder layer 1 chunk 0" and os.environ.get("HYBRID_TEST_FAULT") == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, index)

    monkeypatch.setattr(cell_graph.CellGraph, "_backward_cell", backward_cell)
    monkeypatch.setenv("HYBRID_TEST_FAULT", "kill")  # set before the stages fork
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    _, group, sample = single_and_group(dictionaries, {"hybrid_devices": "cpu,cpu", "hybrid_timeout": 60,
                                                       **PROCESSES})
    loss = criterion(group, sample)[0]
    with pytest.raises(WorkerError, match=r"hybrid stage 1 \(cpu\) died \(exit code -9\) in encoder layer 1 "
                                          r"chunk 0 \(backward\)"):
        loss.backward()
    assert group.hybrid_group.stages.processes == []


TRAINER = textwrap.dedent("""
    import os, sys, time, signal
    # Ctrl-C as a terminal gives it: a shell that ran this suite in the background leaves SIGINT ignored,
    # and Python then installs no KeyboardInterrupt of its own
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, {tests!r})
    import torch
    from conftest import StandInTask, alive, build_model, make_sample
    from fairseq_hybrid.harness.stand_ins import make_dictionary
    from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
    src, tgt = make_dictionary(), make_dictionary(37)
    model = build_model("hybrid_lstm_tiny", src, tgt, encoder_layers=3, decoder_layers=3,
                        hybrid_devices="cpu,cpu,cpu", hybrid_workers="processes")
    criterion = HybridCrossEntropyCriterion(StandInTask(src, tgt), False, 0.1)
    sample = make_sample(src, tgt, [5, 3, 7], [4, 6, 2])
    criterion(model, sample)[0].backward()
    print(" ".join(str(p.pid) for p in model.hybrid_group.stages.processes), flush=True)
    how = sys.argv[1]
    if how == "exit":
        sys.exit(0)
    if how == "raise":
        raise RuntimeError("the trainer failed")
    time.sleep(60)
""")


@pytest.mark.parametrize("how", ["exit", "raise", "SIGINT", "SIGTERM", "SIGKILL"])
def test_no_stage_outlives_the_trainer(how, tmp_path):
    """However the trainer's process ends (normally, by an exception, by
    Ctrl-C, SIGTERM or SIGKILL), its stages end within seconds."""
    import pathlib
    import shutil
    import tempfile

    script = tmp_path / "trainer.py"
    script.write_text(TRAINER.format(tests=os.path.dirname(os.path.abspath(__file__))))
    # short: the stages share tensors through Unix sockets under TMPDIR, whose paths have at most 107
    # bytes, and pytest's own folders grow past that under xdist
    temporary = pathlib.Path(tempfile.mkdtemp(prefix="fh-"))
    trainer = subprocess.Popen([sys.executable, str(script), how], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "TMPDIR": str(temporary)})
    try:
        pids = [int(pid) for pid in trainer.stdout.readline().split()]
        assert len(pids) == 3, trainer.stderr.read()
        assert all(alive(pid) for pid in pids) or how in ("exit", "raise")
        if how.startswith("SIG"):
            trainer.send_signal(getattr(signal, how))
        trainer.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in pids if alive(pid)]
        assert not [path.name for path in temporary.iterdir() if path.name.startswith("fairseq-hybrid-stages-")]
    finally:
        trainer.kill()
        trainer.wait()
        shutil.rmtree(temporary, ignore_errors=True)


def test_a_store_folder_a_dead_trainer_left_is_cleared(tmp_path):
    """GPU stages meet through a store folder of their trainer's; one that a
    trainer ended by SIGKILL left behind is removed by the next start,
    and a living trainer's is kept."""
    from fairseq_hybrid.parallel.processes.stage_processes import STORE_PREFIX, clear_dead_stores

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = tmp_path / f"{STORE_PREFIX}{int(dead.stdout)}-abc"
    living = tmp_path / f"{STORE_PREFIX}{os.getpid()}-def"
    for folder in (left, living):
        folder.mkdir()
        (folder / "store").write_text("x")
    assert clear_dead_stores(str(tmp_path)) == [str(left)]
    assert not left.exists() and living.exists()
