"""The pipes between stages on host memory (parallel/processes/host_wire.py): every
message arrives whole and in its sender's order, whatever its dtype or
size; two stages that send each other more than a pipe holds at once do
not wait for each other; a peer that ended is named."""

import multiprocessing

import pytest
import torch

from fairseq_hybrid.parallel.processes.host_wire import HostWire, wire_ends
from fairseq_hybrid.parallel.processes.gpu_wire import PeerLost

CONTEXT = multiprocessing.get_context("fork")


def wires(size):
    return [HostWire(rank, *ends) for rank, ends in enumerate(wire_ends(CONTEXT, size))]


def test_messages_arrive_whole_in_any_order_of_taking():
    first, second = wires(2)
    values = [torch.randn(3, 4), None, torch.arange(10, dtype=torch.int64), torch.randn(2, 3).to(torch.bfloat16),
              torch.empty(0, 5), torch.tensor([True, False]), torch.randn(4, 6)[:, ::2]]
    for value in values:
        first.send(1, value, requires_grad=value is not None and value.is_floating_point())
    second.expect(0, list(range(len(values))))
    for key in reversed(range(len(values))):  # the later ones first: the earlier wait in the inbox
        got, requires_grad = second.take(0, key)
        value = values[key]
        if value is None:
            assert got is None and requires_grad is False
            continue
        assert got.dtype == value.dtype and got.shape == value.shape
        assert torch.equal(got, value.contiguous())
        assert requires_grad == value.is_floating_point()
    first.flush()
    assert first.sent == [len(values), sum(v.numel() * v.element_size() for v in values if v is not None)]
    for wire in (first, second):
        wire.close()


def test_two_stages_sending_each_other_more_than_a_pipe_holds_do_not_wait_for_each_other():
    first, second = wires(2)
    big = [torch.full((1 << 18,), float(k)) for k in range(4)]  # 1 MiB each, a pipe holds 64 KiB
    for k, value in enumerate(big):
        first.send(1, value)
        second.send(0, value + 10)
    first.expect(1, range(4))
    second.expect(0, range(4))
    for k in range(4):
        assert torch.equal(first.take(1, k)[0], big[k] + 10)
        assert torch.equal(second.take(0, k)[0], big[k])
    first.flush()
    second.flush()
    for wire in (first, second):
        wire.close()


def test_a_peer_that_ended_is_named():
    first, second = wires(2)
    first.close()
    second.expect(0, [0])
    with pytest.raises(PeerLost, match="from stage 0"):
        second.take(0, 0)
    second.send(0, torch.ones(1 << 18))
    with pytest.raises(PeerLost, match="to stage 0"):
        second.flush()
    second.close()


def test_a_key_the_peer_never_sends_is_refused():
    first, second = wires(2)
    first.send(1, torch.ones(2))
    second.expect(0, ["a"])
    with pytest.raises(RuntimeError, match="sends no more"):
        second.take(0, "b")
    for wire in (first, second):
        wire.close()


def test_a_message_the_pipe_has_room_for_is_written_by_the_stage_itself():
    """No thread to wake on the step's critical path where the pipe takes
    the message now; a message larger than the room goes to the sender
    thread, and so does any message sent after it (the order holds)."""
    first, second = wires(2)
    sender = first.senders[1]
    queued = []
    put = sender.queue.put
    sender.queue.put = lambda item: (queued.append(item), put(item))
    small, big = torch.ones(1000), torch.ones(1 << 19)  # 4 KB and 2 MiB
    first.send(1, small)
    assert queued == []
    first.send(1, big)
    first.send(1, small)
    assert len(queued) == 2
    second.expect(0, range(3))
    assert [second.take(0, key)[0].numel() for key in range(3)] == [1000, 1 << 19, 1000]
    first.flush()
    for wire in (first, second):
        wire.close()


def test_the_trainers_messages_keep_every_host_tensor_whole():
    """The trainer's and stages' messages (parallel/processes/plain_tensors.py): host
    tensors of any dtype, shape, stride or size come back equal; a tensor
    that needs a gradient keeps torch's own pickling, and its flag."""
    import pickle

    from fairseq_hybrid.parallel.processes.plain_tensors import dumps

    values = [torch.randn(3, 4), torch.arange(5), torch.randn(4, 6)[:, ::2], torch.empty(0, 3),
              torch.ones(2).to(torch.bfloat16), torch.tensor(3.5), torch.tensor([True, False]),
              torch.ones(2, requires_grad=True)]
    back = pickle.loads(dumps({"step": values, "other": ("x", 1)}))
    assert back["other"] == ("x", 1)
    for value, got in zip(values, back["step"]):
        assert got.dtype == value.dtype and got.shape == value.shape and got.requires_grad == value.requires_grad
        assert torch.equal(got.detach(), value.detach())
