"""hybrid_cross_entropy against fairseq's label_smoothed_cross_entropy."""


import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    label_smoothed_nll_loss,
)

from conftest import StandInTask, build_model, make_sample
from fairseq_hybrid.kernels.fused_output_loss import GradientSink, fused_linear_label_smoothed_ce
from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion


def criteria(task, eps, chunk_rows):
    ours = HybridCrossEntropyCriterion(task, False, eps, report_accuracy=True, output_loss_chunk_rows=chunk_rows)
    theirs = LabelSmoothedCrossEntropyCriterion(task, False, eps, report_accuracy=True)
    return ours, theirs


def grads(model):
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("chunk_rows", [0, 5, 256])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_same_loss_logging_and_gradients_as_fairseq(dictionaries, eps, chunk_rows):
    src_dict, tgt_dict = dictionaries
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, dropout=0.0)
    task = StandInTask(src_dict, tgt_dict)
    ours, theirs = criteria(task, eps, chunk_rows)
    sample = make_sample(src_dict, tgt_dict, [5, 3, 7, 2], [4, 6, 2, 8], seed=2)

    model.zero_grad()
    loss_ref, size_ref, log_ref = theirs(model, sample)
    loss_ref.backward()
    grads_ref = grads(model)

    model.zero_grad()
    loss, size, log = ours(model, sample)
    loss.backward()
    got = grads(model)

    assert size == size_ref
    assert log.keys() == log_ref.keys()
    for key in log:
        torch.testing.assert_close(torch.as_tensor(log[key]).double(), torch.as_tensor(log_ref[key]).double(),
                                   rtol=1e-5, atol=0)
    assert got.keys() == grads_ref.keys() and len(got) > 10
    for name in got:
        torch.testing.assert_close(got[name], grads_ref[name], rtol=1e-5, atol=1e-7, msg=lambda text, name=name: f"{name}: {text}")


def test_fused_loss_equals_fairseq_on_the_same_logits():
    """The fused function gives fairseq's loss and gradients for logits
    features @ weight.T + bias, also in float32 and with padding."""
    torch.manual_seed(0)
    features = torch.randn(3, 50, 16, requires_grad=True)
    weight = torch.randn(40, 16, requires_grad=True)
    bias = torch.randn(40, requires_grad=True)
    target = torch.randint(0, 40, (3, 50))
    target[0, 30:] = 1
    loss, nll, correct, total = fused_linear_label_smoothed_ce(features, weight, bias, target, 0.1, 1, 32, True)
    loss.backward(torch.tensor(2.0))
    fused_grads = [t.grad.clone() for t in (features, weight, bias)]
    for t in (features, weight, bias):
        t.grad = None

    lprobs = torch.log_softmax(features @ weight.t() + bias, -1).view(-1, 40)
    loss_ref, nll_ref = label_smoothed_nll_loss(lprobs, target.view(-1), 0.1, ignore_index=1)
    loss_ref.backward(torch.tensor(2.0))
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=0)
    torch.testing.assert_close(nll, nll_ref, rtol=1e-5, atol=0)
    mask = target.view(-1).ne(1)
    assert total == mask.sum()
    assert correct == lprobs.argmax(1)[mask].eq(target.view(-1)[mask]).sum()
    for got, t in zip(fused_grads, (features, weight, bias)):
        torch.testing.assert_close(got, t.grad, rtol=1e-4, atol=1e-5)


def test_calls_sharing_a_gradient_sink_keep_one_weight_gradient():
    """Pieces of a batch whose losses are added (a group's cells on one
    device) give the gradients of separate calls, while each call keeps
    only its features' gradient: the output layer's (V x D) is summed into
    one matrix, handed out once and released."""
    torch.manual_seed(0)
    features = [torch.randn(6, 16, requires_grad=True) for _ in range(4)]
    weight = torch.randn(40, 16, requires_grad=True)
    bias = torch.randn(40, requires_grad=True)
    targets = [torch.randint(0, 40, (6,)) for _ in range(4)]

    def total(sink):
        return sum(fused_linear_label_smoothed_ce(x, weight, bias, y, 0.1, None, 4, sink=sink)[0]
                   for x, y in zip(features, targets))

    total(None).backward(torch.tensor(3.0))
    separate = [t.grad.clone() for t in features + [weight, bias]]
    for t in features + [weight, bias]:
        t.grad = None
    sink = GradientSink()
    shared = total(sink)
    saved = [len(node.saved_tensors) for node in _fused_nodes(shared)]
    assert saved == [1] * 4  # features' gradient only, where each call kept three
    assert sink.weight.shape == weight.shape and sink.weight.abs().sum() > 0
    shared.backward(torch.tensor(3.0))
    assert sink.weight is None and sink.bias is None  # handed out and released
    for got, want in zip([t.grad for t in features + [weight, bias]], separate):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="one step"):
        sink.buffers(weight, torch.float32)


def _fused_nodes(output):
    """The fused loss's autograd nodes under ``output``."""
    found, stack, seen = [], [output.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "FusedLinearLabelSmoothedCEBackward":
            found.append(node)
        stack += [next_node for next_node, _ in node.next_functions]
    return found


def test_fused_loss_without_grad_stores_nothing():
    features = torch.randn(10, 8)
    weight = torch.randn(20, 8)
    bias = torch.zeros(20)
    with torch.no_grad():
        loss, nll, _, _ = fused_linear_label_smoothed_ce(features, weight, bias, torch.zeros(10, dtype=torch.long), 0.1, None)
    assert not loss.requires_grad and loss > 0 and nll > 0


def test_a_non_hybrid_model_is_refused(dictionaries):
    src_dict, tgt_dict = dictionaries
    task = StandInTask(src_dict, tgt_dict)
    ours, _ = criteria(task, 0.1, 256)
    sample = make_sample(src_dict, tgt_dict, [3], [3])
    with pytest.raises(TypeError, match="needs a hybrid_lstm model"):
        ours(torch.nn.Linear(2, 2), sample)


def test_negative_chunk_rows_is_refused(dictionaries):
    with pytest.raises(ValueError, match="output-loss-chunk-rows"):
        HybridCrossEntropyCriterion(StandInTask(*dictionaries), False, 0.1, output_loss_chunk_rows=-1)
