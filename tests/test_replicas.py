"""Replicas of the parts that run away from their device (parallel/runtime/replicas.py)."""

import pytest
import torch

from fairseq_hybrid.parallel.runtime import stream_handoff
from fairseq_hybrid.parallel.runtime.replicas import Replicas
from fairseq_hybrid.harness.virtual_devices import virtual_devices
from fairseq_hybrid.harness.virtual_streams import StreamRace
from stream_mutations import MUTATIONS, apply

HOME, AWAY = torch.device("cpu", 0), torch.device("cpu", 1)


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


def test_sent_gradients_add_up_as_gradients_left_on_the_replicas():
    """``send`` during backward, or nothing sent: the same sum in the same
    worker order."""
    results = []
    for send in (False, True):
        torch.manual_seed(0)
        master = torch.nn.Linear(3, 2)
        replicas = Replicas(master)
        master(torch.ones(1, 3)).sum().backward()
        for worker in (2, 1):
            replicas.on(worker, torch.device("cpu"), "step")(torch.full((1, 3), float(worker))).sum().backward()
            if send:
                replicas.send(worker, torch.device("cpu"))
                assert all(p.grad is None for p in replicas.copies[worker].parameters())
        replicas.reduce([1, 2])
        results.append(master.weight.grad.clone())
        assert not replicas.sent
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)
    torch.testing.assert_close(results[0], 4 * torch.ones(2, 3))


def prefetched_steps(count):
    """``count`` steps of a replica on another virtual device: parameters
    prefetched by this thread, read on a worker's stream."""
    master = torch.nn.Linear(3, 2).to(HOME)
    replicas = Replicas(master)
    worker = stream_handoff.new_stream(AWAY, "worker")
    outputs, expected = [], []
    for step in range(count):
        replicas.prefetch(1, AWAY, step)
        with stream_handoff.use_stream(worker), torch.no_grad():
            worker.wait_stream(stream_handoff.default_stream(AWAY))
            replica = replicas.on(1, AWAY, step)
            assert replica.weight.device == AWAY
            outputs.append(replica(torch.ones(1, 3, device=AWAY)))
            expected.append(master(torch.ones(1, 3, device=HOME)))
        replicas.reduce([1])  # the step's end: what follows may write the master
        with torch.no_grad():
            master.weight.add_(1.0)  # the optimizer's update between steps
    # read on the host only now: a host read waits for the stream, which
    # would order everything after it
    with stream_handoff.use_stream(worker):
        for output, value in zip(outputs, expected):
            torch.testing.assert_close(output.cpu(), value.cpu())


def test_prefetched_parameters_are_waited_for_and_their_memory_kept():
    with virtual_devices() as harness:
        prefetched_steps(3)
    assert harness.streams.races == []


@pytest.mark.parametrize("mutation", ["prefetch wait_event", "prefetch record_stream", "prefetch read wait"])
def test_a_prefetch_without_its_ordering_is_caught(mutation, monkeypatch):
    """Without the wait the worker reads a copy still in flight; without
    ``record_stream`` the next step's copy reuses memory the worker may
    still read (the caching allocator's rule), which shows one step later;
    without the step's end waiting for the copies, the optimizer may write
    the master while a copy still reads it."""
    apply(next(m for m in MUTATIONS if m.id == mutation), monkeypatch)
    with pytest.raises(StreamRace), virtual_devices():
        prefetched_steps(3)


def test_steps_without_backward_keep_one_read_event_per_source():
    """Validation steps prefetch and never reduce: what the next reduce
    waits for does not grow with them."""
    master = torch.nn.Linear(3, 2).to(HOME)
    replicas = Replicas(master)
    with virtual_devices() as harness:
        for step in range(5):
            replicas.prefetch(1, AWAY, step)
            replicas.on(1, AWAY, step)
        assert len(replicas.read[1]) == 1
        replicas.reduce([1])
        assert not replicas.read
    assert harness.streams.races == []


def test_every_lstm_of_a_replica_is_flattened_at_each_refresh(monkeypatch):
    """A replica's parameters are fresh copies on another GPU, and a cuDNN
    call whose weights are not one buffer copies them into one on every
    call (``try_get_weight_buf`` in ``cudnn/RNN.cpp``): each refresh flattens
    every LSTM in the replica once, the replica itself (a bidirectional
    layer's direction) or the layers of a whole model (data mode)."""
    flattened = []
    monkeypatch.setattr(torch.nn.LSTM, "flatten_parameters", lambda self: flattened.append(self))

    class TwoLayers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lower, self.upper = torch.nn.LSTM(3, 4), torch.nn.LSTM(4, 4)

    replicas = Replicas(TwoLayers())
    for step in ("first", "second"):
        flattened.clear()  # (making the copy may flatten it too)
        replica = replicas.on(1, torch.device("cpu"), step)
        assert flattened == [replica.lower, replica.upper]
    assert Replicas(torch.nn.LSTM(3, 4)).on(1, torch.device("cpu"), "step") is flattened[-1]
