"""The wire between stages on GPUs (parallel/processes/gpu_wire.py), here
over gloo on the host as between stages that share a GPU: a forward
message goes with a header (through the stages' pipes where the trainer
made them, through gloo otherwise), a gradient without one (its receiver
names the shape it expects), and both arrive as sent."""

import multiprocessing
import threading

import pytest
import torch
import torch.distributed as dist

from fairseq_hybrid.parallel.processes.gpu_wire import GpuWire
from fairseq_hybrid.parallel.processes.host_wire import HostWire, wire_ends


def pair(pipes):
    store, wires = dist.HashStore(), [None, None]
    ends = wire_ends(multiprocessing.get_context("fork"), 2) if pipes else [None, None]

    def make(rank):
        header_wire = HostWire(rank, *ends[rank]) if pipes else None
        wires[rank] = GpuWire(rank, 2, store, torch.device("cpu"), 30.0, header_wire=header_wire)

    makers = [threading.Thread(target=make, args=(rank,)) for rank in (0, 1)]
    for maker in makers:
        maker.start()
    for maker in makers:
        maker.join(60)
    return wires


@pytest.mark.parametrize("pipes", [True, False])
def test_a_gradient_goes_without_a_header_and_arrives_as_sent(pipes):
    first, second = pair(pipes)
    output, nothing, grad = torch.randn(3, 4), None, torch.randn(3, 4)
    taken = {}

    def receive_forward():
        second.expect(0, ["output", "nothing"])
        taken["nothing"] = second.take(0, "nothing")  # the later first: the earlier waits in the inbox
        taken["output"] = second.take(0, "output")

    receiver = threading.Thread(target=receive_forward)
    receiver.start()
    first.send(1, output, requires_grad=True)
    first.send(1, nothing)
    receiver.join(60)
    first.flush()
    got, requires_grad = taken["output"]
    assert torch.equal(got, output) and requires_grad is True
    assert taken["nothing"] == (None, False)

    first.expect(1, ["grad"], {"grad": output})  # the gradient of what it sent: that output's shape and dtype
    sender = threading.Thread(target=lambda: (second.send(0, grad, known=True), second.flush()))
    sender.start()
    back, requires_grad = first.take(1, "grad")
    sender.join(60)
    assert torch.equal(back, grad) and back.dtype == grad.dtype and requires_grad is False
    assert (first.headers_sent, second.headers_sent) == (2, 0)  # forward: one each; the gradient: none
    assert (first.sent[0], second.sent[0]) == (2, 1)
    if pipes:  # the headers went through the pipes, one message each
        assert (first.header_wire.sent[0], second.header_wire.sent[0]) == (2, 0)
    with pytest.raises(ValueError, match="known"):
        second.send(0, None, known=True)
    for wire in (first, second):
        wire.close()
