"""The attention-softmax part of the model: the part that runs data-parallel.

Given the top decoder states of a whole batch (teacher forcing, no input
feeding) and the top encoder states, everything from here to the
vocabulary distribution is independent per sentence: Luong global
attention, the attentional layer ``tanh(W_c [c; h])`` and the output
projection.  That independence is what lets the hybrid scheme split this part
along the batch across devices, each with a replica of these parameters,
while the recurrent stacks stay model-parallel.  This module therefore takes
plain tensors and holds no state between calls.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..kernels.attention_softmax_loss import LabelSmoothedLoss, attention_softmax_loss, fused_cell_applies
from ..parallel import SeededDropout

ATTENTION_TYPES = ("dot", "general", "mlp")


class LuongAttention(nn.Module):
    """Global attention of queries ``B x T x H`` over keys ``B x S x C``.

    ``dot``: ``h . e``; ``general``: ``h W e``; ``mlp`` (Bahdanau's concat
    score): ``v . tanh(W_h h + W_e e)``.
    """

    def __init__(self, attention_type: str, query_dim: int, key_dim: int):
        super().__init__()
        if attention_type not in ATTENTION_TYPES:
            raise ValueError(
                f"unknown attention type {attention_type!r}; choose one of {', '.join(ATTENTION_TYPES)}"
            )
        if attention_type == "dot" and query_dim != key_dim:
            raise ValueError(
                f"dot attention needs decoder hidden size ({query_dim}) == encoder output size "
                f"({key_dim}); use --attention-type general"
            )
        self.attention_type = attention_type
        if attention_type == "general":
            self.query_proj = nn.Linear(query_dim, key_dim, bias=False)
        elif attention_type == "mlp":
            self.query_proj = nn.Linear(query_dim, query_dim, bias=True)
            self.key_proj = nn.Linear(key_dim, query_dim, bias=False)
            self.score_proj = nn.Linear(query_dim, 1, bias=False)

    def scores(self, queries: Tensor, keys: Tensor) -> Tensor:
        if self.attention_type == "dot":
            return torch.bmm(queries, keys.transpose(1, 2))
        if self.attention_type == "general":
            return torch.bmm(self.query_proj(queries), keys.transpose(1, 2))
        hidden = torch.tanh(self.query_proj(queries).unsqueeze(2) + self.key_proj(keys).unsqueeze(1))
        return self.score_proj(hidden).squeeze(3)

    def forward(
        self, queries: Tensor, keys: Tensor, key_padding_mask: Optional[Tensor]
    ) -> Tuple[Tensor, Tensor]:
        """Return the context vectors ``B x T x C`` and the weights ``B x T x S``."""
        scores = self.scores(queries, keys)
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask.unsqueeze(1), float("-inf"))
        weights = torch.softmax(scores.float(), dim=-1).type_as(scores)
        return torch.bmm(weights, keys), weights


class AttentionSoftmax(nn.Module):
    """Attention, attentional layer and output projection of the decoder.

    ``forward`` maps decoder states to vocabulary logits (generation);
    training stops at ``features`` and hands them with the output projection
    to the criterion, which may fuse the projection with the loss.
    """

    def __init__(
        self,
        attention_type: str,
        decoder_hidden_size: int,
        encoder_output_size: int,
        out_embed_dim: int,
        num_embeddings: int,
        dropout: float,
        tied_weight: Optional[nn.Parameter] = None,
    ):
        super().__init__()
        self.attention = LuongAttention(attention_type, decoder_hidden_size, encoder_output_size)
        self.attentional = nn.Linear(encoder_output_size + decoder_hidden_size, out_embed_dim, bias=False)
        self.dropout = SeededDropout(dropout)
        if tied_weight is not None:
            if tied_weight.shape != (num_embeddings, out_embed_dim):
                raise ValueError(
                    f"--share-decoder-input-output-embed needs --decoder-out-embed-dim "
                    f"({out_embed_dim}) == --decoder-embed-dim ({tied_weight.shape[1]})"
                )
            self.output_weight = tied_weight
        else:
            self.output_weight = nn.Parameter(torch.empty(num_embeddings, out_embed_dim))
            nn.init.normal_(self.output_weight, mean=0.0, std=out_embed_dim ** -0.5)
        self.output_bias = nn.Parameter(torch.zeros(num_embeddings))

    def features(
        self, decoder_states: Tensor, encoder_states: Tensor, encoder_padding_mask: Optional[Tensor]
    ) -> Tuple[Tensor, Tensor]:
        """``decoder_states`` B x T x H, ``encoder_states`` B x S x C,
        ``encoder_padding_mask`` B x S (True at padding).  Returns the
        attentional states B x T x D (the input of the output projection)
        and the attention weights B x T x S.  Inputs move to this part's
        device (the RNN layers may live elsewhere)."""
        device = self.output_bias.device
        decoder_states, encoder_states = decoder_states.to(device), encoder_states.to(device)
        if encoder_padding_mask is not None:
            encoder_padding_mask = encoder_padding_mask.to(device)
        context, weights = self.attention(decoder_states, encoder_states, encoder_padding_mask)
        attentional = torch.tanh(self.attentional(torch.cat([context, decoder_states], dim=-1)))
        return self.dropout(attentional), weights

    def loss_sums(self, decoder_states: Tensor, encoder_states: Tensor, encoder_padding_mask: Optional[Tensor],
                  target: Tensor, kept, shard_loss, sink) -> Tuple[Tensor, ...]:
        """The summed loss terms of one piece of a batch (a group's
        attention-softmax cell): the fused cell, one autograd node
        (:mod:`fairseq_hybrid.kernels.attention_softmax_loss`), where it
        computes ``shard_loss`` for this call; else the features and
        ``shard_loss`` on them.  ``kept``: the target positions that count;
        ``sink``: where the output layer's gradient is summed."""
        if isinstance(shard_loss, LabelSmoothedLoss) and fused_cell_applies(self, decoder_states):
            return attention_softmax_loss(self, decoder_states, encoder_states, encoder_padding_mask, kept,
                                          shard_loss, sink)
        features, _ = self.features(decoder_states, encoder_states, encoder_padding_mask)
        return shard_loss(features, self.output_weight, self.output_bias, target, kept, sink)

    def forward(
        self, decoder_states: Tensor, encoder_states: Tensor, encoder_padding_mask: Optional[Tensor]
    ) -> Tuple[Tensor, Tensor]:
        """Logits B x T x V and attention weights B x T x S."""
        attentional, weights = self.features(decoder_states, encoder_states, encoder_padding_mask)
        return F.linear(attentional, self.output_weight, self.output_bias), weights
