"""What the exactness tests and the GPU check share: the layers and batch
they use, one step's loss and gradients, and the comparison of a group with
one device (the group computes the single-device model's loss and
gradients, up to rounding)."""

import contextlib

import torch

from ..criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
from ..parallel.runtime.host_batch import keep_on_host
from .measuring import loss_and_grads, on_device
from .stand_ins import StandInTask, build_model, make_sample


LAYERS = {"encoder_layers": 4, "decoder_layers": 4, "encoder_bidirectional_layers": 1}
SRC_LENGTHS = [9, 3, 7, 1, 12, 5, 6]
TGT_LENGTHS = [4, 10, 2, 8, 6, 1, 7]


def single_and_group(dictionaries, group_options, **options):
    """The single-device model and a group holding the same weights (both
    ``hybrid_lstm_tiny`` with LAYERS and ``options``, seed 0), and the
    test batch."""
    src_dict, tgt_dict = dictionaries
    torch.manual_seed(0)
    single = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **{**LAYERS, **options})
    group = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **{**LAYERS, **options}, **group_options)
    group.load_state_dict(single.state_dict())
    return single, group, make_sample(src_dict, tgt_dict, SRC_LENGTHS, TGT_LENGTHS)


@contextlib.contextmanager
def full_fp32():
    """fp32 arithmetic in cuDNN and cuBLAS: PyTorch lets cuDNN (its LSTMs
    included) use TF32 by default (``torch.backends.cudnn.allow_tf32``),
    whose 10-bit mantissa rounds a group's chunked products otherwise than
    one device's whole ones; the comparison is of fp32 against fp32."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def check_equal(devices, mode, dictionaries, group_options=None, batch_on_first_device=False, **overrides):
    """``overrides``: model options of both models; ``group_options``: of the
    group only; ``batch_on_first_device``: the group's batch on ``devices[0]``
    (where fairseq puts it) instead of host memory.  A group on GPUs is
    compared with the single-device model on its first GPU (the same
    kernels: cuDNN's LSTM, not a CPU's), both in full fp32."""
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1, report_accuracy=True,
                                            output_loss_chunk_rows=5)
    single, group, sample = single_and_group(
        dictionaries, {"hybrid_devices": ",".join(devices), "hybrid_mode": mode, **(group_options or {})}, **overrides)
    assert group.hybrid_group is not None and group.hybrid_group.plan.size == len(devices)
    on_gpu = torch.device(devices[0]).type == "cuda"
    with full_fp32():
        if on_gpu:
            single.to(devices[0])
        loss_ref, logging_ref, grads_ref = loss_and_grads(single, criterion,
                                                          on_device(sample, devices[0]) if on_gpu else sample)
        # as fairseq's trainer hands a group its batch: pinned, moved to the first device, the host's kept
        loss, logging, grads = loss_and_grads(group, criterion, keep_on_host(
            sample, devices, lambda s: on_device(s, devices[0])) if batch_on_first_device else sample)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=0)
    assert logging.keys() == logging_ref.keys()
    for key in logging:
        torch.testing.assert_close(torch.as_tensor(logging[key]).float().cpu(),
                                   torch.as_tensor(logging_ref[key]).float().cpu(), rtol=1e-5, atol=0,
                                   msg=lambda text, key=key: f"{key}: {text}")
    assert grads.keys() == grads_ref.keys() and len(grads) == len(list(single.parameters()))
    for name in grads:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=1e-5, atol=1e-7,
                                   msg=lambda text, name=name: f"{name}: {text}")
