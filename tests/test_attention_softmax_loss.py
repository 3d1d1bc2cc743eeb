"""The fused attention-softmax cell (one autograd node, gradients computed
in its forward) against the modules it replaces: AttentionSoftmax.features
followed by the fused loss, under autograd."""

import pytest
import torch

from fairseq_hybrid.kernels.attention_softmax_loss import (
    LabelSmoothedLoss,
    attention_softmax_loss,
    fused_cell_applies,
)
from fairseq_hybrid.kernels.fused_output_loss import GradientSink, kept_targets, row_chunks
from fairseq_hybrid.models.attention_softmax import AttentionSoftmax
from fairseq_hybrid.parallel.runtime.seeded_dropout import cell_generator, given_masks

PAD = 1


def inputs(attention_type, dtype=torch.float32, hidden=6, keys=6, batch=3, steps=5, source=4, vocab=11):
    torch.manual_seed(0)
    part = AttentionSoftmax(attention_type, hidden, keys, 7, vocab, dropout=0.3).to(dtype)
    states = torch.randn(batch, steps, hidden, dtype=dtype, requires_grad=True)
    encoder = torch.randn(batch, source, keys, dtype=dtype, requires_grad=True)
    mask = torch.zeros(batch, source, dtype=torch.bool)
    mask[1, 3:] = mask[2, 1:] = True  # shorter sources
    target = torch.randint(2, vocab, (batch, steps))
    target[0, 4:] = target[2, 2:] = PAD  # shorter targets: some positions do not count
    return part, states, encoder, mask, target


def run(fused, part, states, encoder, mask, target, loss, masks=None, sink=None):
    for tensor in [states, encoder, *part.parameters()]:
        tensor.grad = None
    kept = kept_targets(target, PAD)
    with given_masks(masks or []):
        if fused:
            out = attention_softmax_loss(part, states, encoder, mask, kept, loss, sink)
        else:
            features, _ = part.features(states, encoder, mask)
            out = loss(features, part.output_weight, part.output_bias, target, kept, sink)
    out[0].backward()
    grads = [states.grad, encoder.grad] + [p.grad for p in part.parameters()]
    return [t.detach().clone() for t in out], [None if g is None else g.clone() for g in grads]


@pytest.mark.parametrize("attention_type", ["dot", "general"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("with_sink", [False, True])
def test_fused_cell_equals_the_modules(attention_type, dtype, with_sink):
    part, states, encoder, mask, target = inputs(attention_type, dtype)
    loss = LabelSmoothedLoss(0.1, PAD, 4, True)  # chunks of 4 rows: several, the last joined
    assert fused_cell_applies(part, states)
    steps, batch = target.size(1), target.size(0)
    dropout = [(torch.rand(batch, steps, 7, dtype=dtype) > 0.3).to(dtype) / 0.7]  # a given (scaled) mask
    ref_out, ref_grads = run(False, part, states, encoder, mask, target, loss, dropout,
                             GradientSink() if with_sink else None)
    out, grads = run(True, part, states, encoder, mask, target, loss, dropout, GradientSink() if with_sink else None)
    for got, want in zip(out, ref_out):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    assert sum(g is not None for g in grads) == len(grads)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_fused_cell_draws_its_dropout_from_the_cells_generator():
    """Under a cell's generator the fused cell draws a mask like
    SeededDropout's own (same seed, same loss; another seed, another)."""
    part, states, encoder, mask, target = inputs("general")
    loss = LabelSmoothedLoss(0.1, PAD, 256, False)
    kept = kept_targets(target, PAD)

    def fused(seed):
        with cell_generator(seed, torch.device("cpu")):
            return attention_softmax_loss(part, states, encoder, mask, kept, loss)[0]

    def modules(seed):
        with cell_generator(seed, torch.device("cpu")):
            features, _ = part.features(states, encoder, mask)
            return loss(features, part.output_weight, part.output_bias, target, kept)[0]

    torch.testing.assert_close(fused(3), modules(3), rtol=1e-5, atol=0)
    assert fused(3).item() == fused(3).item() != fused(4).item()


def test_what_the_fused_cell_leaves_to_the_modules():
    part, states, *_ = inputs("mlp")
    assert not fused_cell_applies(part, states)
    part, states, *_ = inputs("general", torch.float16)
    assert not fused_cell_applies(part, states)
    part, states, *_ = inputs("general")
    with torch.no_grad():
        assert not fused_cell_applies(part, states)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fused_cell_applies(part, states)


def test_row_chunks_join_a_short_last_chunk():
    assert row_chunks(264, 256) == [(0, 264)]
    assert row_chunks(400, 256) == [(0, 256), (256, 400)]
    assert row_chunks(9, 4) == [(0, 4), (4, 9)]
    assert row_chunks(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert row_chunks(3, 256) == [(0, 3)]
    assert row_chunks(0, 256) == [(0, 0)]


def test_a_group_runs_its_attention_softmax_cells_fused(dictionaries, monkeypatch):
    """The engine takes the fused cell for the criterion's loss (the
    exactness suite then checks the step it computes)."""
    from conftest import StandInTask, build_model, make_sample
    from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
    from fairseq_hybrid.models import attention_softmax

    calls = []
    real = attention_softmax.attention_softmax_loss
    monkeypatch.setattr(attention_softmax, "attention_softmax_loss", lambda *args: calls.append(1) or real(*args))
    src_dict, tgt_dict = dictionaries
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, hybrid_devices="cpu,cpu")
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    loss, _, _ = criterion(model, make_sample(src_dict, tgt_dict, [4, 6, 3], [5, 2, 6]))
    loss.backward()
    assert len(calls) >= 2  # a cell per batch shard and time chunk
