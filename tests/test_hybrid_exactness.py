"""The hybrid group computes what one device computes: for K = 1..4 CPU
devices and each mode, the loss, the logging outputs and every parameter's
gradient equal the single-device model's (fp32, dropout off) on
variable-length batches.  CUDA variants run where CUDA devices exist."""

import pytest
import torch

from conftest import StandInTask, build_model, make_sample
from fairseq_hybrid.harness.exactness import LAYERS, SRC_LENGTHS, TGT_LENGTHS, check_equal, loss_and_grads, single_and_group
from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
from fairseq_hybrid.parallel.device_plan import MODES


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_cpu_group_equals_one_device(count, mode, dictionaries):
    check_equal(["cpu"] * count, mode, dictionaries)


@pytest.mark.parametrize("mode", MODES)
def test_tied_embeddings_and_residual_in_a_group(mode, dictionaries):
    check_equal(["cpu"] * 3, mode, dictionaries, share_decoder_input_output_embed=True, residual=True,
                attention_type="mlp")


CUDA_COUNT = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(CUDA_COUNT < 1, reason="needs a CUDA device")
@pytest.mark.parametrize("mode", MODES)
def test_cuda_group_equals_one_device(mode, dictionaries):
    devices = [f"cuda:{i % CUDA_COUNT}" for i in range(min(4, max(2, CUDA_COUNT)))]
    check_equal(devices, mode, dictionaries)


def test_batch_smaller_than_the_group(dictionaries):
    """A batch of 2 sentences on 4 devices: 2 shards, same result."""
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.0)
    single, group, _ = single_and_group(dictionaries, {"hybrid_devices": "4", "hybrid_mode": "data"})
    sample = make_sample(src_dict, tgt_dict, [3, 6], [5, 2])
    torch.testing.assert_close(criterion(group, sample)[0], criterion(single, sample)[0], rtol=1e-5, atol=0)


@pytest.mark.parametrize("mode", MODES)
def test_dropout_with_a_fixed_seed_gives_identical_runs(mode, dictionaries):
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    sample = make_sample(src_dict, tgt_dict, SRC_LENGTHS, TGT_LENGTHS)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **LAYERS, dropout=0.3, hybrid_devices="3",
                            hybrid_mode=mode, hybrid_chunk_length=2)
        torch.manual_seed(5)
        runs.append(loss_and_grads(model.train(), criterion, sample))
    assert torch.equal(runs[0][0], runs[1][0])
    for name in runs[0][2]:
        assert torch.equal(runs[0][2][name], runs[1][2][name]), name
    # and dropout really is on: a different seed gives a different loss
    torch.manual_seed(6)
    assert not torch.equal(loss_and_grads(model, criterion, sample)[0], runs[0][0])


