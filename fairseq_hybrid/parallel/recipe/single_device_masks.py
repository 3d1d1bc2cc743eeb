"""The dropout masks of the single-device model, drawn for a whole group
(``--hybrid-dropout-masks single-device``).

Cells draw their dropout masks from generators of their own, so a group's
masks differ from the single-device model's, and training with dropout
follows another (equally valid) path.  To train *exactly* like one device,
the calling thread draws every mask the single-device model would draw,
from torch's global generator and in that model's order, and each cell
takes its piece (:func:`with_masks`, through
:func:`.seeded_dropout.given_masks`).
"""

from __future__ import annotations

from typing import Callable, List, NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from ..runtime.seeded_dropout import given_masks


class SingleDeviceMasks(NamedTuple):
    """The dropout masks the single-device model draws for a batch, in its
    order: source embedding, each encoder layer, target embedding, each
    decoder layer, attentional features (batch order, full length)."""

    source: Tensor
    encoder: List[Tensor]
    target: Tensor
    decoder: List[Tensor]
    features: Tensor

    def rows(self, rows: slice) -> "SingleDeviceMasks":
        """The masks of the batch's ``rows`` (a micro-batch's)."""
        return SingleDeviceMasks(self.source[rows], [m[rows] for m in self.encoder], self.target[rows],
                                 [m[rows] for m in self.decoder], self.features[rows])

    def in_order(self, rows=slice(None)) -> List[Tensor]:
        """The masks of ``rows`` in the order the model's dropout calls take them."""
        masks = self.rows(rows)
        return [masks.source, *masks.encoder, masks.target, *masks.decoder, masks.features]


def draw_single_device_masks(model, source_width: int, target_width: int, batch: int) -> Optional[SingleDeviceMasks]:
    """Draw, from torch's global generator and in the single-device model's
    order and memory layouts, exactly the masks its dropout calls would draw
    (``F.dropout`` on CPU: ``empty_like(x).bernoulli_(1 - p).div_(1 - p)``);
    None when dropout is off.  Without residual connections: with them the
    layouts of the decoder's sums are torch's choice, and the masks are
    still correct dropout masks but not the single-device ones."""
    encoder, decoder = model.encoder.stack, model.decoder.stack
    p = encoder.dropout.p
    if not model.training or p == 0.0 or not torch.is_grad_enabled():
        return None
    keep = 1.0 - p
    weight = encoder.embed_tokens.weight

    def draw(width, size, time_major=False):
        # bernoulli_ fills in memory order, and a batch-first nn.LSTM without
        # packing returns a time-major tensor seen batch first: draw as it does
        shape = (width, batch, size) if time_major else (batch, width, size)
        mask = torch.empty(shape, dtype=weight.dtype, device=weight.device).bernoulli_(keep).div_(keep)
        return mask.transpose(0, 1) if time_major else mask

    source = draw(source_width, encoder.embed_tokens.embedding_dim)
    encoder_masks = [draw(source_width, size) for _, size, _ in encoder.sizes]
    target = draw(target_width, decoder.embed_tokens.embedding_dim)
    decoder_masks = [draw(target_width, decoder.hidden_size, time_major=True) for _ in decoder.layers]
    features = draw(target_width, model.decoder.attention_softmax.output_weight.size(1))
    return SingleDeviceMasks(source, encoder_masks, target, decoder_masks, features)


def with_masks(masks: Optional[Sequence[Tensor]], run: Callable[..., Sequence[Tensor]]) -> Callable[..., Sequence[Tensor]]:
    """``run`` with its dropout calls taking ``masks`` in order (None: they
    draw as usual)."""
    if masks is None:
        return run

    def masked(*args):
        with given_masks(list(masks)):
            return run(*args)

    return masked
