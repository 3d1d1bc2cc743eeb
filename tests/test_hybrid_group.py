"""The group around a model (parallel/hybrid_group.py): placement that
fairseq's device moves leave alone, the group's options."""

import pytest
import torch

from conftest import build_model
from fairseq_hybrid.harness.exactness import LAYERS
from fairseq_hybrid.parallel.recipe.device_plan import DevicePlanError


def test_placement_survives_fairseqs_device_moves(dictionaries):
    src_dict, tgt_dict = dictionaries
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **LAYERS, hybrid_devices="cpu,cpu")
    assert model.to(device="cpu") is model and model.cpu() is model
    model.to(dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    table = model.hybrid_group.placement_table()
    assert "encoder layer 3 (LSTM)" in table and "decoder layer 0 (+bridge)" in table
    assert "shards cpu, cpu" in table


def test_hybrid_timeout_option(dictionaries):
    src_dict, tgt_dict = dictionaries
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, hybrid_devices="cpu,cpu", hybrid_timeout=7.5)
    assert model.hybrid_group.timeout == 7.5
    with pytest.raises(DevicePlanError, match="--hybrid-timeout must be > 0"):
        build_model("hybrid_lstm_tiny", src_dict, tgt_dict, hybrid_devices="cpu,cpu", hybrid_timeout=0)


@pytest.mark.parametrize("threads,expected", [(4, 2), (2, 1), (1, 1)])
def test_a_group_on_cpu_devices_leaves_the_cores_to_its_devices(threads, expected, caplog):
    """Each CPU device's worker has a core (one intra-op thread): at its
    first step the trainer's thread keeps the cores left, at least one,
    never more than it had; a group of GPUs leaves the trainer's alone."""
    import logging
    from types import SimpleNamespace

    from fairseq_hybrid.hybrid_group import leave_cores_to_devices

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        with caplog.at_level(logging.INFO, logger="fairseq_hybrid.hybrid_group"):
            leave_cores_to_devices(SimpleNamespace(devices=[torch.device("cpu")] * 2, size=2))
        assert torch.get_num_threads() == expected
        assert (f"intra-op threads {threads} -> {expected}" in caplog.text) == (expected < threads)
        torch.set_num_threads(threads)
        leave_cores_to_devices(SimpleNamespace(devices=[torch.device("cuda", 0), torch.device("cuda", 1)], size=2))
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


def test_the_trainer_leaves_the_cores_at_the_first_step(dictionaries):
    from fairseq_hybrid.harness.exactness import single_and_group
    from fairseq_hybrid.harness.measuring import loss_and_grads
    from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
    from fairseq_hybrid.harness.stand_ins import StandInTask

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        _, group, sample = single_and_group(dictionaries, {"hybrid_devices": "cpu,cpu", "hybrid_workers": "threads"})
        assert torch.get_num_threads() == 3  # building the group leaves them
        loss_and_grads(group, HybridCrossEntropyCriterion(StandInTask(*dictionaries), False, 0.1), sample)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
