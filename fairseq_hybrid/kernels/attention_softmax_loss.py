"""A hybrid group's attention-softmax cell as one autograd node: Luong
attention (``dot`` or ``general``), the attentional layer, dropout, the
output projection and the label-smoothed loss, with every gradient computed
in the forward call.

On a GPU each op of a cell is host time before its kernel can start, and
one host thread queues the cells of all K devices of a group.  Run as
modules under autograd, this cell costs about 110 ops forward and 50
backward, each recorded by autograd on the way in and replayed by its engine
on the way out.  Here the forward runs the same arithmetic and then, right
away, its backward by hand (the fused loss already computes the gradient of
the loss with respect to its features as it goes, :mod:`.fused_output_loss`),
with no autograd recording; the cell's backward only scales the stored
gradients by the incoming one (1 in training).  The sums are those of
autograd's own backward formulas (softmax's, tanh's, the matrix products'),
in their order where it matters; results agree with the modules' to
rounding (the exactness suite's tolerance).

What it does not cover falls back to the modules: ``mlp`` attention, half
precision and autocast (their casts), and calls without gradients.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from .fused_output_loss import GradientSink, KeptTargets, chunked_loss, loss_grads


class LabelSmoothedLoss(NamedTuple):
    """The criterion's loss, as the hybrid engine calls it on a piece of a
    batch (``(features, weight, bias, target, kept, sink)``, see
    :meth:`.HybridCrossEntropyCriterion.shard_loss`), and the options the
    fused cell needs to compute it itself."""

    epsilon: float
    ignore_index: Optional[int]
    chunk_rows: int
    want_correct: bool

    def __call__(self, features, weight, bias, target, kept=None, sink=None):
        from .fused_output_loss import fused_linear_label_smoothed_ce

        return fused_linear_label_smoothed_ce(features, weight, bias, target, self.epsilon, self.ignore_index,
                                              self.chunk_rows, self.want_correct, kept=kept, sink=sink)


def fused_cell_applies(part, decoder_states: Tensor) -> bool:
    """Whether :func:`attention_softmax_loss` computes this call of
    ``part`` (an ``AttentionSoftmax``): dot or general attention, fp32 or
    fp64, no autocast, gradients on."""
    return (part.attention.attention_type in ("dot", "general") and torch.is_grad_enabled()
            and decoder_states.dtype in (torch.float32, torch.float64) and not torch.is_autocast_enabled(decoder_states.device.type))


class _AttentionSoftmaxLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, decoder_states, encoder_states, query_weight, attentional_weight, output_weight, output_bias,
                padding_mask, kept, dropout, loss: LabelSmoothedLoss, sink):
        q, e = decoder_states, encoder_states
        batch, steps, hidden = q.shape
        keys = e.size(2)
        dtype = q.dtype
        q2 = None if query_weight is None else q.reshape(batch * steps, hidden)
        # attention: scores, softmax (in fp32, as LuongAttention), context
        qp = q if query_weight is None else torch.mm(q2, query_weight.t()).view(batch, steps, keys)
        e_t = e.transpose(1, 2)
        scores = torch.bmm(qp, e_t)
        if padding_mask is not None:
            scores.masked_fill_(padding_mask.unsqueeze(1), float("-inf"))
        weights = torch.softmax(scores if dtype == torch.float32 else scores.float(), dim=-1)
        if weights.dtype != dtype:
            weights = weights.to(dtype)
        context = torch.bmm(weights, e)
        joined = torch.cat([context, q], dim=-1).view(batch * steps, keys + hidden)
        activated = torch.tanh(torch.mm(joined, attentional_weight.t()))
        features = activated
        if dropout is not None:  # as SeededDropout: x * mask / keep
            mask, keep = dropout
            mask = mask.reshape(batch * steps, -1)
            features = activated * mask
            if keep != 1.0:
                features = features / keep
        subset = kept.positions.numel() < features.size(0)
        if subset:
            features = features.index_select(0, kept.positions)
        # the loss, with its gradient with respect to the features
        loss_dtype = torch.promote_types(dtype, torch.float32)
        grads = loss_grads(features, output_weight, loss_dtype, sink)
        total, nll, correct = chunked_loss(features, output_weight, output_bias, kept.labels, loss.epsilon,
                                           loss.chunk_rows, loss.want_correct, grads)
        # and back through the cell, as autograd's formulas would
        grad = grads.features
        if subset:
            grad = grad.new_zeros(batch * steps, grad.size(1)).index_copy_(0, kept.positions, grad)
        if dropout is not None:
            if keep != 1.0:
                grad = grad / keep
            grad = grad * mask
        grad = torch.ops.aten.tanh_backward(grad, activated)
        grad_joined = torch.mm(grad, attentional_weight).view(batch, steps, keys + hidden)
        grad_context = grad_joined[..., :keys]
        grad_weights = torch.bmm(grad_context, e_t)
        grad_e = torch.bmm(weights.transpose(1, 2), grad_context)
        if dtype == torch.float32:
            grad_scores = torch._softmax_backward_data(grad_weights, weights, -1, dtype)
        else:  # the softmax ran in fp32
            grad_scores = torch._softmax_backward_data(grad_weights.float(), weights.float(), -1,
                                                       torch.float32).to(dtype)
        grad_e.baddbmm_(grad_scores.transpose(1, 2), qp)
        grad_qp = torch.bmm(grad_scores, e)
        grad_qp2 = None
        if query_weight is None:
            grad_q = grad_qp.add_(grad_joined[..., keys:])
        else:
            grad_qp2 = grad_qp.view(batch * steps, keys)
            grad_q = torch.mm(grad_qp2, query_weight).view(batch, steps, hidden).add_(grad_joined[..., keys:])
        ctx.sink = sink
        # The attentional layer's and the query projection's gradients are
        # products left to backward: made here, each would be a matrix of
        # the layer's size per cell, held from forward to backward (the
        # output layer's goes into the device's sink instead).
        saved = (grad_q, grad_e, grad, joined, grad_qp2, q2)
        if sink is None:
            saved += (grads.weight.to(output_weight.dtype), grads.bias.to(output_bias.dtype))
        ctx.save_for_backward(*saved)
        ctx.output_dtypes = output_weight.dtype, output_bias.dtype
        ctx.mark_non_differentiable(nll, correct)
        ctx.set_materialize_grads(False)  # no zeros made for nll's and correct's gradients
        return total, nll, correct

    @staticmethod
    def backward(ctx, grad_loss, _grad_nll, _grad_correct):
        if grad_loss is None:
            return (None,) * 11
        saved = ctx.saved_tensors
        grad_q, grad_e, grad_activated, joined, grad_qp, queries = saved[:6]
        if ctx.sink is None:
            grad_weight, grad_bias = saved[6:]
        else:
            grad_weight, grad_bias = ctx.sink.take()
            if grad_weight is not None:
                grad_weight, grad_bias = grad_weight.to(ctx.output_dtypes[0]), grad_bias.to(ctx.output_dtypes[1])
        grad_attentional = torch.mm(grad_activated.t(), joined)
        grad_query = None if grad_qp is None else torch.mm(grad_qp.t(), queries)

        def scaled(grad, owned):
            # a gradient made here, or the sink's sums (taken: no one else holds them), is scaled in
            # place: a copy of the output layer's gradient is that layer's size again at the peak
            if grad is None:
                return None
            return grad.mul_(grad_loss.to(grad.dtype)) if owned else grad * grad_loss.to(grad.dtype)

        sunk = ctx.sink is not None
        return (scaled(grad_q, False), scaled(grad_e, False), scaled(grad_query, True),
                scaled(grad_attentional, True), scaled(grad_weight, sunk), scaled(grad_bias, sunk),
                None, None, None, None, None)


def attention_softmax_loss(part, decoder_states: Tensor, encoder_states: Tensor, padding_mask: Optional[Tensor],
                           kept: KeptTargets, loss: LabelSmoothedLoss, sink: Optional[GradientSink] = None
                           ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``loss`` of ``part`` (an ``AttentionSoftmax`` whose call
    :func:`fused_cell_applies` accepts) on a piece of a batch: summed
    ``(loss, nll_loss, n_correct, n_counted)``, as ``loss(*part.features(
    ...), part.output_weight, part.output_bias, target, kept, sink)``
    gives them.  All inputs on ``part``'s device; the targets that count
    in ``kept``.  ``part.dropout`` draws or takes its one mask here."""
    attention = part.attention
    query_weight = attention.query_proj.weight if attention.attention_type == "general" else None
    batch, steps, _ = decoder_states.shape
    dropout = part.dropout.mask_for((batch, steps, part.attentional.weight.size(0)), decoder_states)
    total, nll, correct = _AttentionSoftmaxLoss.apply(
        decoder_states, encoder_states, query_weight, part.attentional.weight, part.output_weight, part.output_bias,
        padding_mask, kept, dropout, loss, sink)
    return total, nll, correct, kept.count
