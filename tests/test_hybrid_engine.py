"""The machinery of the hybrid engine: wavefront order, workers that really
run at the same time, failures that surface instead of hanging, seeded
dropout, replicas; and exactness of the engine's less common paths (time
chunks, several bidirectional layers, explicit placements, prefixes,
validation without gradients)."""

import threading

import pytest
import torch

from conftest import StandInTask, build_model, make_sample
from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
from fairseq_hybrid.parallel.step_cells import time_chunks
from fairseq_hybrid.parallel.cell_graph import Cell, record_cell_times, run_cells
from fairseq_hybrid.parallel.replicas import Replicas
from fairseq_hybrid.parallel.seeded_dropout import SeededDropout, cell_generator
from fairseq_hybrid.parallel.wavefront import CellSpec, clock_cycles, clocks, worker_orders
from fairseq_hybrid.parallel.worker import WorkerError, WorkerGroup
from test_hybrid_exactness import LAYERS, SRC_LENGTHS, TGT_LENGTHS, check_equal, loss_and_grads

CPU2 = [torch.device("cpu")] * 2


def grid(layers, chunks):
    """Cells (l, c) reading (l - 1, c) and (l, c - 1), layer l on worker l % 2."""
    cells, index = [], {}
    for layer in range(layers):
        for chunk in range(chunks):
            inputs = [(index[p], 0) for p in ((layer - 1, chunk), (layer, chunk - 1)) if p in index]
            index[(layer, chunk)] = len(cells)
            cells.append(CellSpec(layer % 2, inputs))
    return cells, index


def test_wavefront_clock_is_layer_plus_chunk():
    cells, index = grid(3, 4)
    cell_clocks = clocks(cells)
    for (layer, chunk), i in index.items():
        assert cell_clocks[i] == layer + chunk
    cycles = list(clock_cycles(cells))
    assert len(cycles) == 3 + 4 - 1
    assert sorted(i for cycle in cycles for i in cycle) == list(range(12))
    orders = worker_orders(cells, 2)
    for order in orders:
        assert [cell_clocks[i] for i in order] == sorted(cell_clocks[i] for i in order)


def test_a_cell_may_only_read_earlier_cells():
    with pytest.raises(ValueError, match="not listed before"):
        clocks([CellSpec(0, [(1, 0)]), CellSpec(0, [])])


def test_workers_run_at_the_same_time():
    """Two cells on two workers that can only finish together."""
    barrier = threading.Barrier(2, timeout=20)
    threads = {}

    def meet(name):
        def run():
            threads[name] = threading.current_thread().name
            barrier.wait()
            return (torch.ones(1),)
        return run

    cells = [Cell("a", 0, [], meet("a")), Cell("b", 1, [], meet("b"))]
    with torch.no_grad():
        results = run_cells(cells, WorkerGroup(CPU2), [0, 1])
    assert [r[0].item() for r in results] == [1.0, 1.0]
    assert threads["a"] != threads["b"] and "worker 0" in threads["a"] and "worker 1" in threads["b"]


def test_a_failing_cell_stops_the_group_with_its_error():
    """Worker 1 waits on a cell of worker 0 that raises: the caller gets the
    error, naming the device, instead of a hang."""

    def boom():
        raise RuntimeError("out of cheese")

    cells = [Cell("bad", 0, [], boom), Cell("reader", 1, [(0, 0)], lambda x: (x,))]
    with pytest.raises(WorkerError, match=r"worker 0 \(cpu\) failed: out of cheese"):
        run_cells(cells, WorkerGroup(CPU2), [1])


def test_stage_local_backward_hands_gradients_between_workers():
    weight = torch.nn.Parameter(torch.tensor([2.0, 3.0]))
    cells = [
        Cell("scale", 0, [], lambda: (weight * torch.tensor([1.0, 1.0]),)),
        Cell("square", 1, [(0, 0)], lambda x: ((x * x).sum(),)),
    ]
    (total,), = run_cells(cells, WorkerGroup(CPU2), [1])
    total.backward()
    torch.testing.assert_close(weight.grad, 2 * weight.detach())


def test_time_chunks():
    assert time_chunks(7, 3, 2) == [slice(0, 3), slice(3, 6), slice(6, 7)]
    assert time_chunks(7, 0, 2) == [slice(0, 4), slice(4, 7)]
    assert time_chunks(1, 0, 4) == [slice(0, 1)]


def test_seeded_dropout():
    dropout = SeededDropout(0.5).train()
    x = torch.ones(1000)
    with cell_generator(7, torch.device("cpu")):
        first = dropout(x)
    with cell_generator(7, torch.device("cpu")):
        second = dropout(x)
    assert torch.equal(first, second)
    assert 300 < int(first.eq(0).sum()) < 700 and set(first.unique().tolist()) == {0.0, 2.0}
    assert torch.equal(dropout.eval()(x), x)
    # cells seeded with neighbouring seeds draw independent masks: two
    # independent Bernoulli(0.9) masks agree on 0.9^2 + 0.1^2 = 82% of entries
    masks = []
    for seed in (11, 12):
        with cell_generator(seed, torch.device("cpu")):
            masks.append(SeededDropout(0.1).train()(torch.ones(200_000)).eq(0))
    assert abs(masks[0].eq(masks[1]).float().mean().item() - 0.82) < 0.005


def test_replicas_share_cpu_storage_and_reduce_in_order():
    master = torch.nn.Linear(3, 2)
    replicas = Replicas(master)
    replica = replicas.on(1, torch.device("cpu"))
    assert replica is not master and replica.weight.data_ptr() == master.weight.data_ptr()
    replica(torch.ones(1, 3)).sum().backward()
    master(torch.ones(1, 3)).sum().backward()
    replicas.reduce([1])
    torch.testing.assert_close(master.weight.grad, 2 * torch.ones(2, 3))
    assert replica.weight.grad is None


@pytest.mark.parametrize("chunk_length", [1, 3])
def test_time_chunks_give_the_single_device_result(chunk_length, dictionaries):
    check_equal(["cpu"] * 2, "hybrid", dictionaries, hybrid_chunk_length=chunk_length)


@pytest.mark.parametrize("mode", ["hybrid", "model"])
def test_several_bidirectional_layers_with_residuals(mode, dictionaries):
    check_equal(["cpu"] * 3, mode, dictionaries, encoder_bidirectional_layers=3, residual=True,
                hybrid_chunk_length=4)


@pytest.mark.parametrize("placement", ["encoder=0,0,0,1;decoder=1,1,0,0", "encoder=1,1,1,1;decoder=0,0,0,0"])
def test_explicit_placements(placement, dictionaries):
    check_equal(["cpu"] * 2, "hybrid", dictionaries, group_options={"hybrid_placement": placement})


def test_ignore_prefix_size(dictionaries):
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1, ignore_prefix_size=2,
                                            report_accuracy=True)
    torch.manual_seed(0)
    single = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **LAYERS)
    group = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **LAYERS, hybrid_devices="cpu,cpu",
                        hybrid_chunk_length=3)
    group.load_state_dict(single.state_dict())
    sample = make_sample(src_dict, tgt_dict, SRC_LENGTHS, TGT_LENGTHS)
    loss_ref, logging_ref, grads_ref = loss_and_grads(single, criterion, sample)
    loss, logging, grads = loss_and_grads(group, criterion, sample)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=0)
    # targets are the sentences plus </s>; the first two positions of each are left out
    assert logging["total"] == logging_ref["total"] == sum(max(0, n + 1 - 2) for n in TGT_LENGTHS)
    # the unsliced full-logits path agrees too
    full = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1, ignore_prefix_size=2,
                                       output_loss_chunk_rows=0)
    torch.testing.assert_close(full(single, sample)[0], loss_ref, rtol=1e-5, atol=0)


@pytest.mark.parametrize("mode", ["hybrid", "model", "data"])
def test_validation_without_gradients(mode, dictionaries):
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    torch.manual_seed(0)
    single = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **LAYERS).eval()
    group = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **LAYERS, hybrid_devices="3",
                        hybrid_mode=mode).eval()
    group.load_state_dict(single.state_dict())
    sample = make_sample(src_dict, tgt_dict, SRC_LENGTHS, TGT_LENGTHS)
    with torch.no_grad():
        loss, _, _ = criterion(group, sample)
        assert not loss.requires_grad
        torch.testing.assert_close(loss, criterion(single, sample)[0], rtol=1e-5, atol=0)


def test_cell_times_are_recorded_per_worker(dictionaries):
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **LAYERS, hybrid_devices="cpu,cpu")
    sample = make_sample(src_dict, tgt_dict, SRC_LENGTHS, TGT_LENGTHS)
    with record_cell_times() as trace:
        loss, sample_size, _ = criterion(model, sample)
        loss.backward()
    names = {(entry.name, entry.phase) for entry in trace}
    assert ("encoder layer 0 reverse", "forward") in names and ("encoder layer 0 reverse", "backward") in names
    assert {entry.worker for entry in trace} == {0, 1}
    assert all(entry.end >= entry.start for entry in trace)


def test_bfloat16_group_after_a_float32_step(dictionaries):
    """The dtype path of --bf16/--fp16: parameters converted after the group
    has run (its replicas must follow), then the group still equals one
    device in the new dtype."""
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    torch.manual_seed(0)
    single = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **LAYERS)
    group = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **LAYERS, hybrid_devices="cpu,cpu")
    group.load_state_dict(single.state_dict())
    sample = make_sample(src_dict, tgt_dict, SRC_LENGTHS, TGT_LENGTHS)
    loss_and_grads(group, criterion, sample)
    single.to(torch.bfloat16)
    group.to(torch.bfloat16)
    loss_ref, _, grads_ref = loss_and_grads(single, criterion, sample)
    loss, _, grads = loss_and_grads(group, criterion, sample)
    assert all(p.dtype == torch.bfloat16 for p in group.parameters())
    torch.testing.assert_close(loss, loss_ref, rtol=1e-2, atol=0)
    for name in grads_ref:
        assert grads[name].dtype == torch.bfloat16, name
        torch.testing.assert_close(grads[name].float(), grads_ref[name].float(), rtol=2e-2, atol=1e-3, msg=name)


def test_out_of_memory_names_the_device_and_the_part():
    def too_big():
        raise torch.OutOfMemoryError("Tried to allocate 20.00 GiB")

    cells = [Cell("encoder layer 1 chunk 0", 1, [], too_big), Cell("source embedding", 0, [], lambda: (torch.ones(1),))]
    with pytest.raises(WorkerError) as failure:
        run_cells(cells, WorkerGroup(CPU2), [0, 1])
    message = str(failure.value)
    assert "out of memory on cpu in encoder layer 1 chunk 0 (forward)" in message
    assert "hybrid worker 1" in message and "Tried to allocate 20.00 GiB" in message


@pytest.mark.parametrize("mode", ["hybrid", "model", "data"])
def test_single_device_masks_make_dropout_runs_equal_one_device(mode, dictionaries):
    """--hybrid-dropout-masks single-device: with dropout on, the group draws
    the single-device model's masks, so loss and gradients equal its own."""
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1, report_accuracy=True)
    torch.manual_seed(0)
    options = dict(LAYERS, dropout=0.3, encoder_bidirectional_layers=2)
    single = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **options).train()
    group = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **options, hybrid_devices="3", hybrid_mode=mode,
                        hybrid_chunk_length=3, hybrid_dropout_masks="single-device").train()
    group.load_state_dict(single.state_dict())
    sample = make_sample(src_dict, tgt_dict, SRC_LENGTHS, TGT_LENGTHS)
    torch.manual_seed(9)
    loss_ref, logging_ref, grads_ref = loss_and_grads(single, criterion, sample)
    torch.manual_seed(9)
    loss, logging, grads = loss_and_grads(group, criterion, sample)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=0)
    assert logging["n_correct"] == logging_ref["n_correct"]
    for name in grads_ref:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=1e-5, atol=1e-7, msg=name)
    # and dropout was really on: the per-cell masks give another loss
    group.hybrid_group.dropout_masks = "per-cell"
    torch.manual_seed(9)
    assert not torch.equal(loss_and_grads(group, criterion, sample)[0], loss_ref)
