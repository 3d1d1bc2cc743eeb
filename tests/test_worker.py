"""Worker threads (fairseq_hybrid.parallel.runtime.worker, .thread_state): the
caller's thread-local state reaches every job, nothing leaves the caller
waiting forever, and each worker runs its cells' backward itself."""

import threading
import time

import pytest
import torch

from conftest import StandInTask
from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
from fairseq_hybrid.parallel.runtime.cell_graph import Cell, run_cells
from fairseq_hybrid.parallel.runtime.worker import WorkerError, WorkerGroup, WorkerTimeout
from fairseq_hybrid.harness.exactness import single_and_group

CPU2 = [torch.device("cpu")] * 2


def test_autocast_reaches_the_cells():
    """Defect 5: autocast is per thread; under the caller's
    torch.autocast a cell's linear output is bfloat16, as it is on the
    caller's own thread."""
    weight = torch.randn(3, 4)
    cells = [Cell("linear", 1, [], lambda: (torch.nn.functional.linear(torch.randn(2, 4), weight),))]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        (out,), = run_cells(cells, WorkerGroup(CPU2), [0])
        assert torch.nn.functional.linear(torch.randn(2, 4), weight).dtype == torch.bfloat16
    assert out.dtype == torch.bfloat16
    with torch.no_grad():
        (plain,), = run_cells(cells, WorkerGroup(CPU2), [0])
    assert plain.dtype == torch.float32


def test_each_worker_runs_its_own_backward():
    """Defect 2: a worker's backward runs with autograd's multithreading off,
    on the worker's own thread (on CUDA the device threads of autograd are
    blocked by the trainer's loss.backward(), which waits for the workers)."""
    seen = {}

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, grad):
            seen["thread"] = threading.current_thread().name
            seen["multithreading"] = torch._C._is_multithreading_enabled()
            return grad

    weight = torch.nn.Parameter(torch.ones(2))
    cells = [Cell("probe", 1, [], lambda: (Probe.apply(weight * 2).sum(),))]
    (total,), = run_cells(cells, WorkerGroup(CPU2), [0])
    total.backward()
    assert "hybrid worker 1" in seen["thread"] and seen["multithreading"] is False
    assert torch._C._is_multithreading_enabled()  # the caller's own setting is untouched


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_worker_that_cannot_start_answers_with_its_error():
    """Defect 7: torch.cuda.set_device fails in the worker's start-up; the
    caller gets that failure instead of waiting forever."""
    group = WorkerGroup([torch.device("cuda", 0)])
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"hybrid worker 0 \(cuda:0\) failed: could not start a worker on cuda:0"):
        group.run([lambda: None], timeout=60)
    assert time.monotonic() - start < 30


def test_a_stuck_cell_times_out_naming_device_and_cell():
    """Defect 7: a cell that never returns stops the step after the timeout
    with an error naming the device, the cell and where its thread stands;
    the worker waiting on it is woken up."""
    release = threading.Event()

    def stuck():
        release.wait(120)
        return (torch.ones(1),)

    cells = [Cell("decoder layer 1 chunk 0", 0, [], stuck), Cell("reader", 1, [(0, 0)], lambda x: (x,))]
    start = time.monotonic()
    try:
        with torch.no_grad(), pytest.raises(WorkerTimeout) as failure:
            run_cells(cells, WorkerGroup(CPU2), [1], timeout=1.0)
    finally:
        release.set()
    message = str(failure.value)
    assert time.monotonic() - start < 30
    assert "hybrid worker 0 (cpu) is still in decoder layer 1 chunk 0 (forward)" in message
    assert "after 1 s (--hybrid-timeout)" in message and "in stuck" in message  # the stuck thread's stack
    # the reader is reported as waiting for it, and was woken up (the call returned)
    assert "hybrid worker 1 (cpu) is still in reader (forward), waiting for decoder layer 1 chunk 0" in message


def test_a_timed_out_group_is_replaced():
    from fairseq_hybrid.parallel.runtime import worker as worker_module

    devices = [torch.device("cpu"), torch.device("cpu"), torch.device("cpu")]
    group = worker_module.worker_group(devices)
    release = threading.Event()
    with pytest.raises(WorkerTimeout):
        group.run([lambda: release.wait(60), None, None], timeout=0.5)
    release.set()
    with pytest.raises(WorkerError, match="timed out before"):
        group.run([lambda: 1, None, None])
    assert worker_module.worker_group(devices) is not group


def test_a_step_that_failed_in_backward_leaves_no_gradients_behind(dictionaries):
    """Defect 6: fairseq skips a batch that ran out of memory (zeroing the
    model's gradients) and goes on; the replicas' gradients of the failed
    step must not reach the next one."""
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    single, group, sample = single_and_group(dictionaries, {"hybrid_devices": "cpu,cpu"})

    failures = [torch.OutOfMemoryError("simulated")]

    def fail_once(grad):
        if failures:
            raise failures.pop()
        return grad

    # the source embedding's backward comes last: the shards' replicas already hold gradients
    handle = group.encoder.stack.embed_tokens.weight.register_hook(fail_once)
    loss, sample_size, _ = criterion(group, sample)
    with pytest.raises(WorkerError, match="out of memory"):
        (loss / sample_size).backward()
    handle.remove()
    group.zero_grad()  # what fairseq's trainer does after an out-of-memory error

    for model in (single, group):
        model.zero_grad()
        loss, sample_size, _ = criterion(model, sample)
        (loss / sample_size).backward()
    for (name, param), reference in zip(group.named_parameters(), single.parameters()):
        torch.testing.assert_close(param.grad, reference.grad, rtol=1e-5, atol=1e-7, msg=name)
