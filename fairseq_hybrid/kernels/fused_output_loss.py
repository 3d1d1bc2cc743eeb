"""Output projection and label-smoothed cross-entropy fused, in row chunks.

The logits of a batch (N target positions x V vocabulary entries) are the
largest activation of an RNN translation model, and on a CPU the
memory-bound passes over them (log-softmax, its backward, the gradient of the
gather and of the smoothing sum, their sum) cost about as much as the output
matrix multiplications themselves.  This function never builds them: it
walks the rows in chunks small enough to stay in cache, and for each chunk
computes the logits, the loss and, right away, the gradient of the loss with
respect to those logits, which it turns into gradients of the features,
weight and bias with two matrix multiplications.  ``backward`` only scales
the stored gradients.

The loss is exactly fairseq's ``label_smoothed_nll_loss`` (summed, padding
ignored): with ``a = 1 - eps - eps_i`` and ``eps_i = eps / (V - 1)``,
``loss = a * nll + eps_i * smooth``, ``nll = lse - x_y``,
``smooth = V * lse - sum_v x_v``, whose gradient with respect to logit
``x_v`` is ``p_v (a + eps_i V) - eps_i - a [v = y]``.

Each call keeps its weight's gradient (V x D, 125 MiB at a 32k vocabulary
and 1024 features) from its forward to its backward.  A hybrid group calls
it once per (batch shard, time chunk, micro-batch), so a device would hold
one such matrix per cell it runs; a :class:`GradientSink` shared by a
device's calls holds one in all.
"""

from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor


class GradientSink:
    """One weight and bias gradient for the fused-loss calls of one step on
    the same parameters, whose losses are added into one total (the hybrid
    engine's cells on one device): each call adds its gradients here in its
    forward instead of keeping its own, and the first of their backward
    calls hands out the sum scaled by its incoming gradient, the others
    none.  The sum of the calls' losses gets the same incoming gradient in
    every call, so this is their gradient's sum, in another order of
    addition.  One per device and step: a device's cells run forward, and
    then backward, on one thread."""

    def __init__(self):
        self.weight: Optional[Tensor] = None
        self.bias: Optional[Tensor] = None
        self.taken = False

    def buffers(self, weight: Tensor, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        """The sums to add a call's gradients into (zeros at the first)."""
        if self.taken:
            raise RuntimeError("a GradientSink serves one step: its gradient was already handed out")
        if self.weight is None:
            self.weight = torch.zeros_like(weight, dtype=dtype)
            self.bias = torch.zeros(weight.size(0), dtype=dtype, device=weight.device)
        return self.weight, self.bias

    def take(self) -> Tuple[Optional[Tensor], Optional[Tensor]]:
        """The sums, once; ``(None, None)`` after (and released here)."""
        if self.taken:
            return None, None
        self.taken = True
        weight, bias, self.weight, self.bias = self.weight, self.bias, None, None
        return weight, bias


class LossGrads(NamedTuple):
    """Where :func:`chunked_loss` writes the gradients of the loss with
    respect to its features (N x D), the weight and the bias (added to
    what they hold)."""

    features: Tensor
    weight: Tensor
    bias: Tensor


def loss_grads(features: Tensor, weight: Tensor, dtype: torch.dtype, sink: Optional[GradientSink] = None
               ) -> LossGrads:
    """Where one call's loss gradients go: a fresh one for ``features``;
    the output layer's summed into ``sink``'s buffers on this device where
    given, else fresh zeros."""
    if sink is not None:
        grad_weight, grad_bias = sink.buffers(weight, dtype)
    else:
        grad_weight = torch.zeros_like(weight, dtype=dtype)
        grad_bias = torch.zeros(weight.size(0), dtype=dtype, device=weight.device)
    return LossGrads(torch.empty_like(features), grad_weight, grad_bias)


def row_chunks(rows: int, chunk_rows: int) -> List[Tuple[int, int]]:
    """``(start, stop)`` of chunks of ``chunk_rows`` rows, a last one of
    fewer than half of that joined to the one before (a chunk costs the
    host two dozen ops whatever its size)."""
    starts = list(range(0, rows, chunk_rows)) or [0]
    if len(starts) > 1 and rows - starts[-1] < chunk_rows // 2:
        starts.pop()
    return [(start, stop) for start, stop in zip(starts, starts[1:] + [rows])]


def chunked_loss(features: Tensor, weight: Tensor, bias: Tensor, labels: Tensor, epsilon: float, chunk_rows: int,
                 want_correct: bool, grads: Optional[LossGrads]) -> Tuple[Tensor, Tensor, Tensor]:
    """The summed ``(loss, nll, correct)`` of ``features`` N x D against
    ``labels`` (every row counts), in row chunks (:func:`row_chunks`),
    writing the gradients into ``grads`` when given.  Each op here is host
    time on a GPU, in a hybrid group's every attention-softmax cell, so a
    chunk's per-row sums leave it as one N x 3 tensor and the three totals
    come out of one sum."""
    num_classes = weight.size(0)
    eps_i = epsilon / (num_classes - 1)
    a = 1.0 - epsilon - eps_i
    # Half-precision features get float32 logits and sums; float64 stays float64.
    dtype = torch.promote_types(features.dtype, torch.float32)
    chunks = row_chunks(features.size(0), chunk_rows)
    whole = len(chunks) == 1
    correct = torch.zeros((), dtype=torch.long, device=features.device)
    weight_t = weight.t()
    labels = labels.unsqueeze(1)
    if grads is not None:
        widest = max(stop - start for start, stop in chunks)
        minus_a = torch.full((widest, 1), -a, dtype=dtype, device=features.device)
        minus_eps = torch.full((1, 1), -eps_i, dtype=dtype, device=features.device)
        scale = a + eps_i * num_classes
    per_row = []  # for each chunk, its rows' logsumexp, target logit and sum of the logits
    for start, stop in chunks:
        rows = features if whole else features[start:stop]
        labels_here = labels if whole else labels[start:stop]
        logits = torch.addmm(bias, rows, weight_t)
        if logits.dtype != dtype:
            logits = logits.to(dtype)
        if want_correct:
            correct += logits.argmax(1, keepdim=True).eq(labels_here).sum()
        picked = logits.gather(1, labels_here)
        logit_sums = logits.sum(1, keepdim=True)
        # logsumexp by hand, keeping exp(x - max) for the gradient: one
        # exp pass over the chunk instead of two (torch.logsumexp's own
        # and the gradient's), and no out-of-place subtraction.
        maxes = logits.amax(1, keepdim=True)
        exps = logits.sub_(maxes).exp_()
        exp_sums = exps.sum(1, keepdim=True)
        per_row.append(torch.cat([maxes.add_(exp_sums.log()), picked, logit_sums], dim=1))
        if grads is not None:
            # the gradient of the loss with respect to the logits:
            # p_v (a + eps_i V) - eps_i - a [v = y], p_v = exps_v / exp_sums
            # written over exps (an elementwise op may write over an input it reads
            # element by element): no second chunk of logits' size
            grad = torch.addcdiv(minus_eps, exps, exp_sums, value=scale, out=exps)
            grad.scatter_add_(1, labels_here, minus_a if stop - start == widest else minus_a[: stop - start])
            torch.mm(grad.to(rows.dtype) if grad.dtype != rows.dtype else grad, weight,
                     out=grads.features if whole else grads.features[start:stop])
            grads.weight.addmm_(grad.t(), rows.to(dtype) if rows.dtype != dtype else rows)
            grads.bias.add_(grad.sum(0))
    lse, picked, logit_sums = (per_row[0] if whole else torch.cat(per_row)).sum(0)
    nll = lse - picked
    # loss = a * nll + eps_i * smooth, smooth = V * lse - (sum of the logits)
    loss = a * nll + eps_i * (num_classes * lse - logit_sums)
    return loss, nll, correct


class FusedLinearLabelSmoothedCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features, weight, bias, target, epsilon, chunk_rows, want_correct, sink=None):
        needs_grad = any(ctx.needs_input_grad[:3])
        dtype = torch.promote_types(features.dtype, torch.float32)
        grads = None
        if needs_grad:
            grads = loss_grads(features, weight, dtype, sink)
        loss, nll, correct = chunked_loss(features, weight, bias, target, epsilon, chunk_rows, want_correct, grads)
        ctx.sink = sink
        if needs_grad and sink is not None:
            ctx.save_for_backward(grads.features)
        elif needs_grad:
            ctx.save_for_backward(grads.features, grads.weight.to(weight.dtype), grads.bias.to(bias.dtype))
        ctx.weight_dtype, ctx.bias_dtype = weight.dtype, bias.dtype
        ctx.mark_non_differentiable(nll, correct)
        return loss, nll, correct

    @staticmethod
    def backward(ctx, grad_loss, _grad_nll, _grad_correct):
        if ctx.sink is not None:
            (grad_features,) = ctx.saved_tensors
            grad_weight, grad_bias = ctx.sink.take()
            if grad_weight is not None:
                grad_weight, grad_bias = grad_weight.to(ctx.weight_dtype), grad_bias.to(ctx.bias_dtype)
        else:
            grad_features, grad_weight, grad_bias = ctx.saved_tensors
        if ctx.sink is not None and grad_weight is not None:
            # the sink's sums, taken (no one else holds them): scaled in place, not copied at the
            # output layer's size
            grad_weight, grad_bias = grad_weight.mul_(grad_loss.to(grad_weight.dtype)), grad_bias.mul_(
                grad_loss.to(grad_bias.dtype))
        elif grad_weight is not None:
            grad_weight, grad_bias = grad_weight * grad_loss.to(grad_weight.dtype), grad_bias * grad_loss.to(
                grad_bias.dtype)
        return (
            grad_features * grad_loss.to(grad_features.dtype),
            grad_weight,
            grad_bias,
            None,
            None,
            None,
            None,
            None,
        )


class KeptTargets(NamedTuple):
    """The target positions of a piece of a batch that count (not
    ``ignore_index``), found ahead of time: ``positions`` in the flattened
    piece, their ``labels`` and how many there are (a 0-dim tensor), all on
    the device that computes the loss.  The hybrid engine prepares them on
    the main thread before a step, so the loss needs no ``nonzero`` (a host
    synchronisation) inside a cell."""

    positions: Tensor
    labels: Tensor
    count: Tensor


def kept_targets(target: Tensor, ignore_index: Optional[int]) -> KeptTargets:
    """The positions of ``target`` that count, on ``target``'s device."""
    target = target.reshape(-1)
    if ignore_index is None:
        positions = torch.arange(target.numel(), device=target.device)
    else:
        positions = target.ne(ignore_index).nonzero().squeeze(1)
    return KeptTargets(positions, target.index_select(0, positions),
                       target.new_full((), positions.numel(), dtype=torch.long))


def fused_linear_label_smoothed_ce(
    features: Tensor,
    weight: Tensor,
    bias: Tensor,
    target: Tensor,
    epsilon: float,
    ignore_index: Optional[int],
    chunk_rows: int = 256,
    want_correct: bool = False,
    kept: Optional[KeptTargets] = None,
    sink: Optional[GradientSink] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Summed ``(loss, nll_loss, n_correct, n_counted)`` of
    ``label_smoothed_nll_loss(log_softmax(features @ weight.T + bias), target)``.

    ``features`` ... x D and ``target`` ... of the same leading shape.
    Positions whose target is ``ignore_index`` are dropped before any work;
    ``kept`` gives them ready-made (``target`` is then not read).  ``sink``:
    where the weight's and bias's gradients are summed with those of other
    calls whose losses are added to this one (see :class:`GradientSink`).
    """
    features = features.reshape(-1, features.size(-1))
    if kept is None:
        kept = kept_targets(target, ignore_index)
    if kept.positions.numel() < features.size(0):
        features = features.index_select(0, kept.positions)
    loss, nll, correct = FusedLinearLabelSmoothedCE.apply(
        features, weight, bias, kept.labels, float(epsilon), int(chunk_rows), bool(want_correct), sink
    )
    return loss, nll, correct, kept.count
