"""--hybrid-dropout-masks single-device (parallel/recipe/single_device_masks.py)."""

import pytest
import torch

from conftest import StandInTask
from fairseq_hybrid.harness.exactness import loss_and_grads, single_and_group
from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion


@pytest.mark.parametrize("workers", ["threads", "processes"])
@pytest.mark.parametrize("mode,micro_batches", [("hybrid", 1), ("model", 1), ("data", 1), ("hybrid", 3),
                                                ("model", 2)])
def test_single_device_masks_make_dropout_runs_equal_one_device(mode, micro_batches, workers, dictionaries):
    """--hybrid-dropout-masks single-device: with dropout on, the group draws
    the single-device model's masks, so loss and gradients equal its own,
    with micro-batches too (each takes its rows of the batch's masks); with
    a process per device the trainer draws them and sends them with the
    batch."""
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1, report_accuracy=True)
    single, group, sample = single_and_group(
        dictionaries, {"hybrid_devices": "cpu,cpu,cpu", "hybrid_mode": mode, "hybrid_chunk_length": 3,
                       "hybrid_dropout_masks": "single-device", "hybrid_micro_batches": micro_batches,
                       "hybrid_workers": workers},
        dropout=0.3, encoder_bidirectional_layers=2)
    single.train()
    group.train()
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
