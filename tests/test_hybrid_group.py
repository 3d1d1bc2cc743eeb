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
