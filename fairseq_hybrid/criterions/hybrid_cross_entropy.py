"""``hybrid_cross_entropy``: label-smoothed cross-entropy over the
attention-softmax part of a ``hybrid_lstm`` model.

fairseq's ``label_smoothed_cross_entropy`` asks the model for the full
B x T x V logits and then computes the loss.  Here the criterion supplies
only the loss of one batch shard (from the attentional features and the
output projection, summed) and the model decides where the attention-softmax
part runs: on one device as one shard, or split along the batch across
devices by the hybrid engine.  By default the output projection and the loss
are fused (:mod:`fairseq_hybrid.kernels.fused_output_loss`), so the logits are never stored;
``--output-loss-chunk-rows 0`` computes them in full and applies fairseq's
own ``label_smoothed_nll_loss``.  Logging outputs and metrics are exactly
those of ``label_smoothed_cross_entropy``.
"""

from dataclasses import dataclass, field
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
    label_smoothed_nll_loss,
)
from torch import Tensor

from ..kernels.attention_softmax_loss import LabelSmoothedLoss
from ..kernels.fused_output_loss import GradientSink, KeptTargets


@dataclass
class HybridCrossEntropyConfig(LabelSmoothedCrossEntropyCriterionConfig):
    output_loss_chunk_rows: int = field(
        default=256,
        metadata={
            "help": "fuse the output projection with the loss over chunks of this many target "
            "positions, never storing the logits; 0 computes full logits and fairseq's loss"
        },
    )


@register_criterion("hybrid_cross_entropy", dataclass=HybridCrossEntropyConfig)
class HybridCrossEntropyCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 output_loss_chunk_rows=256):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        if output_loss_chunk_rows < 0:
            raise ValueError(f"--output-loss-chunk-rows must be >= 0, got {output_loss_chunk_rows}")
        self.chunk_rows = output_loss_chunk_rows
        # what a hybrid group's attention-softmax cells call (they compute it
        # themselves where they can, :mod:`fairseq_hybrid.kernels.attention_softmax_loss`)
        self.fused_loss = LabelSmoothedLoss(self.eps, self.padding_idx, output_loss_chunk_rows,
                                            self.report_accuracy) if output_loss_chunk_rows > 0 else None

    def shard_loss(self, features: Tensor, weight: Tensor, bias: Tensor, target: Tensor,
                   kept: Optional[KeptTargets] = None, sink: Optional[GradientSink] = None) -> Tuple[Tensor, ...]:
        """Summed ``(loss, nll_loss, n_correct, total)`` of one piece of the
        batch (some sentences, some target positions).  ``kept``: the
        positions that count, found ahead (see :class:`KeptTargets`).
        Nothing here makes the host wait for the device when ``kept`` is
        given.  ``sink``: where the output layer's gradient is summed with
        the other pieces' on this device (see :class:`GradientSink`; the
        fused loss only)."""
        if self.fused_loss is not None:
            return self.fused_loss(features, weight, bias, target, kept, sink)
        lprobs = utils.log_softmax(F.linear(features, weight, bias), dim=-1)
        lprobs = lprobs.reshape(-1, lprobs.size(-1))
        target = target.reshape(-1)
        loss, nll_loss = label_smoothed_nll_loss(lprobs, target, self.eps, ignore_index=self.padding_idx, reduce=True)
        mask = target.ne(self.padding_idx)
        n_correct = torch.sum(lprobs.argmax(1).eq(target) & mask)
        return loss, nll_loss, n_correct, torch.sum(mask)

    def forward(self, model, sample, reduce=True):
        if not hasattr(model, "loss_sums"):
            raise TypeError(
                f"--criterion hybrid_cross_entropy needs a hybrid_lstm model (--arch hybrid_lstm_*), "
                f"got {type(model).__name__}; use label_smoothed_cross_entropy for other models"
            )
        if not reduce:
            # Per-token losses are only needed for scoring, never for the
            # data-parallel path: the plain full-logits computation does it.
            return super().forward(model, sample, reduce=False)
        target = model.get_targets(sample, None)
        if self.ignore_prefix_size > 0:
            # Padding, not slicing: the engine cuts the targets into pieces
            # along time, and padding is ignored wherever it falls.
            target = target.clone()
            target[:, : self.ignore_prefix_size] = self.padding_idx
        shard_loss = self.shard_loss if self.fused_loss is None else self.fused_loss
        # through the model's forward, so that a DDP wrapper sees the step (HybridLSTMModel.forward)
        loss, nll_loss, n_correct, total = model(**sample["net_input"], loss_of=(target, shard_loss))
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        if self.report_accuracy:
            logging_output["n_correct"] = utils.item(n_correct.data)
            logging_output["total"] = utils.item(total.data)
        return loss, sample_size, logging_output
