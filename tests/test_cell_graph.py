"""Running cells on a group (parallel/runtime/cell_graph.py): workers really run at
once, failures surface instead of hanging, stage-local backward hands
gradients between workers, cell times and named outputs."""

import threading

import pytest
import torch

from conftest import StandInTask, build_model, make_sample
from fairseq_hybrid.harness.exactness import LAYERS, SRC_LENGTHS, TGT_LENGTHS
from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
from fairseq_hybrid.parallel.runtime.cell_graph import Cell, run_cells
from fairseq_hybrid.parallel.runtime.cell_times import record_cell_times
from fairseq_hybrid.parallel.runtime.worker import WorkerError, WorkerGroup


CPU2 = [torch.device("cpu")] * 2


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


def test_a_hook_runs_once_its_last_cell_of_the_worker_has_run_backward():
    """Worker 1 runs "early" then "late" forward, so backward "late" then
    "early": the hook of both runs after "early", before worker 0's cell
    (which waits for it) and on worker 1's thread."""
    weight = torch.nn.Parameter(torch.tensor([2.0, 3.0]))
    seen = []

    def noting(name, run):
        def cell(*args):
            out = run(*args)
            out[0].register_hook(lambda grad: seen.append(name))
            return out
        return cell

    cells = [
        Cell("bottom", 0, [], noting("bottom", lambda: (weight * torch.tensor([1.0, 1.0]),))),
        Cell("early", 1, [(0, 0)], noting("early", lambda x: (x * 2,))),
        Cell("late", 1, [(1, 0)], lambda x: ((x * x).sum(),)),
    ]
    hook = (lambda: seen.append(("hook", threading.current_thread().name)))
    (total,), = run_cells(cells, WorkerGroup(CPU2), [2], after_last_backward=[((2, 1), hook)])
    total.backward()
    assert seen[:2] == ["early", ("hook", seen[1][1])] and "worker 1" in seen[1][1]
    assert seen[2:] == ["bottom"]
    with pytest.raises(ValueError, match="cells of one worker"):
        run_cells(cells, WorkerGroup(CPU2), [2], after_last_backward=[((0, 1), hook)])


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


def test_out_of_memory_names_the_device_and_the_part():
    def too_big():
        raise torch.OutOfMemoryError("Tried to allocate 20.00 GiB")

    cells = [Cell("encoder layer 1 chunk 0", 1, [], too_big), Cell("source embedding", 0, [], lambda: (torch.ones(1),))]
    with pytest.raises(WorkerError) as failure:
        run_cells(cells, WorkerGroup(CPU2), [0, 1])
    message = str(failure.value)
    assert "out of memory on cpu in encoder layer 1 chunk 0 (forward)" in message
    assert "hybrid worker 1" in message and "Tried to allocate 20.00 GiB" in message


def test_a_cell_must_return_the_outputs_it_names():
    cells = [Cell("encoder layer 0 chunk 0", 0, [], lambda: (torch.ones(1), torch.ones(1)), None, ("out", "h", "c"))]
    with pytest.raises(WorkerError, match=r"encoder layer 0 chunk 0 returned 2 outputs but names 3: out, h, c"):
        run_cells(cells, WorkerGroup(CPU2), [0])
