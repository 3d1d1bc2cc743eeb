"""Replicas of the parts that run away from their device (parallel/replicas.py)."""

import torch

from fairseq_hybrid.parallel.replicas import Replicas


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
