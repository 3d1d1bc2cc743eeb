"""The recurrent part of the model: the LSTM stacks that run model-parallel.

Each layer is its own ``nn.LSTM`` so that a layer can be placed on a device
of its own.  The decoder has no input feeding: its layers see only the
target embeddings and the layer below, never the attention output of the
previous step.  That is what lets a whole decoder layer run over all target
positions in one ``nn.LSTM`` call during training (and as a wavefront across
devices), with attention and softmax applied afterwards for all positions at
once by :class:`~fairseq_hybrid.models.attention_softmax.AttentionSoftmax`.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from fairseq import utils
from torch import Tensor
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..parallel import SeededDropout
from ..kernels.sorted_packing import PackedLayout, chunk_lengths, sorted_layout, unpack_sorted

LSTM_PARAMETERS = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")


def make_embedding(num_embeddings: int, embed_dim: int, padding_idx: int) -> nn.Embedding:
    embedding = nn.Embedding(num_embeddings, embed_dim, padding_idx=padding_idx)
    nn.init.uniform_(embedding.weight, -0.1, 0.1)
    nn.init.constant_(embedding.weight[padding_idx], 0)
    return embedding


def make_lstm(input_size: int, hidden_size: int, bidirectional: bool = False) -> nn.LSTM:
    lstm = nn.LSTM(input_size, hidden_size, batch_first=True, bidirectional=bidirectional)
    for name, param in lstm.named_parameters():
        if "weight" in name or "bias" in name:
            nn.init.uniform_(param, -0.1, 0.1)
    return lstm


def module_device(module: nn.Module) -> torch.device:
    """The device a layer lives on (the hybrid engine may place each layer
    on a device of its own; inputs follow the layer)."""
    return next(module.parameters()).device


def lstm_packed(module: nn.LSTM, data: Tensor, batch_sizes: Tensor, state: Tuple[Tensor, Tensor]
                ) -> Tuple[Tensor, Tensor, Tensor]:
    """A one-layer unidirectional ``module`` over packed ``data`` from
    ``state`` (``h``, ``c``, each 1 x running x H): what ``module(
    PackedSequence(data, batch_sizes), state)`` returns (``data``, ``h``,
    ``c``), the same kernel call without ``nn.LSTM.forward``'s Python
    (argument checks, the weights' change check: host time in every LSTM
    cell of a hybrid group; docs/benchmarks.md "Host time per cell, cut
    again").  ``module._flat_weights`` are its
    Parameter objects, whose data replicas replace in place."""
    return torch._VF.lstm(data, batch_sizes, state, module._flat_weights, module.bias, 1, 0.0, module.training,
                          False)


def lstm_padded(module: nn.LSTM, inputs: Tensor, state: Tuple[Tensor, Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """The same for a batch-first ``inputs`` B x T x C without padding:
    ``module(inputs, state)`` as (outputs, ``h``, ``c``)."""
    return torch._VF.lstm(inputs, state, module._flat_weights, module.bias, 1, 0.0, module.training, False, True)


def reversed_positions(lengths: Tensor, width: int) -> Tensor:
    """B x ``width`` indices that reverse each row's first ``lengths[b]``
    positions and leave its padding in place (an involution)."""
    positions = torch.arange(width).expand(len(lengths), width)
    lengths = lengths.to(positions.device).unsqueeze(1)
    return torch.where(positions < lengths, lengths - 1 - positions, positions)


def layer_sizes(input_size: int, hidden_size: int, num_layers: int, num_bidirectional: int) -> List[Tuple[int, int, bool]]:
    """``(input size, output size, bidirectional)`` of each layer of a stack
    whose bottom ``num_bidirectional`` layers are bidirectional."""
    sizes = []
    for layer in range(num_layers):
        bidirectional = layer < num_bidirectional
        output_size = 2 * hidden_size if bidirectional else hidden_size
        sizes.append((input_size, output_size, bidirectional))
        input_size = output_size
    return sizes


class LayerFinishing:
    """What happens to a layer's outputs before the next layer reads them,
    owned by the model so that every way of running a layer (the whole
    sequence, a time chunk, one direction in the hybrid engine) does the
    same: the residual where the layer's input and output sizes match
    (from the second layer on), then dropout.  Needs ``residual``,
    ``sizes`` and ``dropout`` on the stack."""

    def has_residual(self, index: int) -> bool:
        return self.residual and index > 0 and self.sizes[index][0] == self.sizes[index][1]

    def finish_layer(self, index: int, outputs: Tensor, inputs: Tensor, reverse: Optional[bool] = None) -> Tensor:
        """Layer ``index``'s ``outputs`` given its ``inputs``.  ``reverse``:
        ``outputs`` are one direction of a bidirectional layer (False
        forward, True reverse), whose residual is its half of ``inputs``."""
        if self.has_residual(index):
            if reverse is None:
                outputs = outputs + inputs
            else:
                size = outputs.size(-1)
                outputs = outputs + (inputs[..., size:] if reverse else inputs[..., :size])
        return self.dropout(outputs)


class LSTMEncoderStack(LayerFinishing, nn.Module):
    """Embedding plus a stack of LSTM layers over right-padded source tokens.

    Padding is handled with packed sequences, so a sentence's states (and the
    backward direction of a bidirectional layer) never see its padding.
    Returns the top states, the padding mask and every layer's final
    ``(h, c)``, which initialise the decoder layer of the same index.
    """

    def __init__(
        self,
        num_embeddings: int,
        padding_idx: int,
        embed_dim: int,
        hidden_size: int,
        num_layers: int,
        num_bidirectional: int,
        dropout: float,
        residual: bool,
    ):
        super().__init__()
        if not 0 <= num_bidirectional <= num_layers:
            raise ValueError(
                f"--encoder-bidirectional-layers ({num_bidirectional}) must be between 0 and "
                f"--encoder-layers ({num_layers})"
            )
        self.padding_idx = padding_idx
        self.embed_tokens = make_embedding(num_embeddings, embed_dim, padding_idx)
        self.sizes = layer_sizes(embed_dim, hidden_size, num_layers, num_bidirectional)
        self.layers = nn.ModuleList(
            make_lstm(in_size, hidden_size, bidirectional) for in_size, _, bidirectional in self.sizes
        )
        self.residual = residual
        self.dropout = SeededDropout(dropout)
        self.output_size = self.sizes[-1][1]
        # One unidirectional LSTM per direction of each bidirectional layer,
        # sharing the layer's Parameter objects (see ``direction``); a plain
        # attribute, so nothing new appears in checkpoints.
        self._directions: Dict[Tuple[int, bool], nn.LSTM] = {}

    def embed(self, src_tokens: Tensor) -> Tensor:
        """Right-padded source tokens B x S to dropped-out embeddings."""
        return self.dropout(self.embed_tokens(src_tokens.to(self.embed_tokens.weight.device)))

    def right_padded(self, src_tokens: Tensor) -> Tensor:
        return utils.convert_padding_direction(src_tokens, self.padding_idx, left_to_right=True)

    def run_layer(self, index: int, inputs: Tensor, lengths: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """One layer over ``inputs`` B x S x C: returns outputs B x S x C',
        final ``h`` and ``c`` B x C' (both directions concatenated)."""
        inputs = inputs.to(module_device(self.layers[index]))
        packed = pack_padded_sequence(inputs, lengths.cpu(), batch_first=True, enforce_sorted=False)
        packed_out, (h, c) = self.layers[index](packed)
        outputs, _ = pad_packed_sequence(packed_out, batch_first=True, total_length=inputs.size(1))
        # h, c: (directions, B, H) -> B x (directions * H)
        h = h.transpose(0, 1).reshape(inputs.size(0), -1)
        c = c.transpose(0, 1).reshape(inputs.size(0), -1)
        return self.finish_layer(index, outputs, inputs), h, c

    def run_chunk(
        self, index: int, inputs: Tensor, sorted_lengths: Tensor, start: int, state: Optional[Tuple[Tensor, Tensor]],
        layout: Optional[PackedLayout] = None,
    ) -> Tuple[Tensor, Tensor, Tensor]:
        """A unidirectional layer over the time chunk ``inputs`` B x W x C
        that starts at position ``start``, from ``state`` (``h``, ``c``,
        B x H; zeros when None).  Rows are sorted by length, longest first,
        so the sentences still running are a prefix of the batch; the others
        keep their state and get zero outputs.  Chaining the chunks of a
        layer gives exactly ``run_layer``.  ``layout``: the packed layout
        of the running rows (:func:`.chunk_lengths`,
        :class:`.PackedLayout`) on ``inputs``' device, where the caller has
        it (then ``sorted_lengths`` is not read)."""
        layer = self.layers[index]
        batch, width, _ = inputs.shape
        hidden = layer.hidden_size
        if state is None:
            zeros = inputs.new_zeros(batch, hidden)
            state = (zeros, zeros)
        if layout is None:
            lengths = chunk_lengths(sorted_lengths, start, width)
            if len(lengths):
                positions, batch_sizes = sorted_layout(lengths, width)
                layout = PackedLayout(positions.to(inputs.device), batch_sizes, len(lengths))
        if layout is None:  # every row has ended before this chunk
            outputs = inputs.new_zeros(batch, width, hidden)
            h, c = state
        elif layout.full:  # every row runs through the chunk: the rows as they are
            outputs, h, c = lstm_padded(layer, inputs, (state[0].unsqueeze(0), state[1].unsqueeze(0)))
            h, c = h.squeeze(0), c.squeeze(0)
        else:
            running = layout.running
            data = inputs.reshape(batch * width, inputs.size(2)).index_select(0, layout.positions)
            if running < batch:
                state_in = (state[0][:running].unsqueeze(0), state[1][:running].unsqueeze(0))
            else:
                state_in = (state[0].unsqueeze(0), state[1].unsqueeze(0))
            data, h, c = lstm_packed(layer, data, layout.batch_sizes, state_in)
            # the rows that have ended before this chunk come out as zeros
            outputs = unpack_sorted(data, layout.positions, batch, width)
            h, c = h.squeeze(0), c.squeeze(0)
            if running < batch:
                h = torch.cat([h, state[0][running:]])
                c = torch.cat([c, state[1][running:]])
        return self.finish_layer(index, outputs, inputs), h, c

    reversed_positions = staticmethod(reversed_positions)

    def direction(self, index: int, reverse: bool) -> nn.LSTM:
        """One direction of the bidirectional layer ``index`` as a
        unidirectional batch-first ``nn.LSTM`` whose parameters *are* the
        layer's (the same Parameter objects: gradients land on the layer,
        and nothing is copied or re-flattened per call).  The hybrid engine
        runs the two directions as two cells, the reverse one on another
        device through a replica of this module."""
        layer = self.layers[index]
        suffix = "_reverse" if reverse else ""
        module = self._directions.get((index, reverse))
        if module is None or module.weight_ih_l0 is not getattr(layer, "weight_ih_l0" + suffix):
            with torch.device("meta"):
                module = nn.LSTM(layer.input_size, layer.hidden_size, batch_first=True)
            for name in LSTM_PARAMETERS:
                setattr(module, name, getattr(layer, name + suffix))
            self._directions[(index, reverse)] = module
        return module

    def run_direction(self, module: nn.LSTM, reverse: bool, inputs: Tensor, sorted_lengths: Tensor,
                      positions: Optional[Tensor] = None,
                      layout: Optional[PackedLayout] = None) -> Tuple[Tensor, Tensor, Tensor]:
        """One direction (``module``, from :meth:`direction` or a replica of
        it) of a bidirectional layer over the whole ``inputs`` B x S x C
        (rows sorted by length, longest first): outputs B x S x H and final
        ``h``, ``c`` B x H, as the layer's own halves.  The reverse
        direction is the forward recurrence over each sentence reversed in
        place (padding stays at the end); ``positions`` are
        ``reversed_positions(sorted_lengths, S)`` on ``inputs``' device,
        and ``layout`` the packed layout (:class:`.PackedLayout`) there,
        each made here when not given."""
        batch, width = inputs.shape[:2]
        if reverse:
            if positions is None:
                positions = reversed_positions(sorted_lengths, width).to(inputs.device)
            inputs = inputs.gather(1, positions.unsqueeze(-1).expand_as(inputs))
        if layout is None:
            packed_positions, batch_sizes = sorted_layout(sorted_lengths, width)
            layout = PackedLayout(packed_positions.to(inputs.device), batch_sizes, batch)
        zeros = inputs.new_zeros(1, batch, module.hidden_size)
        if layout.full:  # every row runs through the whole width: the rows as they are
            outputs, h, c = lstm_padded(module, inputs, (zeros, zeros))
        else:
            data = inputs.reshape(batch * width, inputs.size(2)).index_select(0, layout.positions)
            data, h, c = lstm_packed(module, data, layout.batch_sizes, (zeros, zeros))
            outputs = unpack_sorted(data, layout.positions, batch, width)
        if reverse:
            outputs = outputs.gather(1, positions.unsqueeze(-1).expand_as(outputs))
        return outputs, h.squeeze(0), c.squeeze(0)

    def forward(self, src_tokens: Tensor, src_lengths: Tensor) -> Dict[str, List[Tensor]]:
        src_tokens = self.right_padded(src_tokens.to(self.embed_tokens.weight.device))
        padding_mask = src_tokens.eq(self.padding_idx)
        x = self.embed(src_tokens)
        final_h, final_c = [], []
        for index in range(len(self.layers)):
            x, h, c = self.run_layer(index, x, src_lengths)
            final_h.append(h)
            final_c.append(c)
        return {
            "encoder_out": [x],  # B x S x C
            "encoder_padding_mask": [padding_mask],  # B x S
            "final_h": final_h,  # per layer, B x C_l
            "final_c": final_c,
        }


class LSTMDecoderStack(LayerFinishing, nn.Module):
    """Embedding plus a stack of LSTM layers over the target prefix, without
    input feeding.  Layer ``l`` starts from the encoder's layer-``l`` final
    state (through a linear bridge where the sizes differ); decoder layers
    above the encoder's depth start from zeros."""

    def __init__(
        self,
        num_embeddings: int,
        padding_idx: int,
        embed_dim: int,
        hidden_size: int,
        num_layers: int,
        encoder_state_sizes: List[int],
        dropout: float,
        residual: bool,
    ):
        super().__init__()
        self.embed_tokens = make_embedding(num_embeddings, embed_dim, padding_idx)
        self.sizes = layer_sizes(embed_dim, hidden_size, num_layers, 0)
        self.layers = nn.ModuleList(make_lstm(in_size, hidden_size) for in_size, _, _ in self.sizes)
        self.bridges_h = nn.ModuleList()
        self.bridges_c = nn.ModuleList()
        for layer in range(num_layers):
            source = encoder_state_sizes[layer] if layer < len(encoder_state_sizes) else None
            needs_bridge = source is not None and source != hidden_size
            self.bridges_h.append(nn.Linear(source, hidden_size) if needs_bridge else nn.Identity())
            self.bridges_c.append(nn.Linear(source, hidden_size) if needs_bridge else nn.Identity())
        # plain bools, not modules: a bridge-less layer costs no module call
        self.needs_bridge = [not isinstance(bridge, nn.Identity) for bridge in self.bridges_h]
        self.num_encoder_layers = len(encoder_state_sizes)
        self.hidden_size = hidden_size
        self.residual = residual
        self.dropout = SeededDropout(dropout)

    def embed(self, prev_output_tokens: Tensor) -> Tensor:
        return self.dropout(self.embed_tokens(prev_output_tokens.to(self.embed_tokens.weight.device)))

    def bridge(self, index: int, h: Tensor, c: Tensor) -> Tuple[Tensor, Tensor]:
        """The decoder layer's initial state from the encoder layer's final one."""
        device = self.layers[index].weight_ih_l0.device
        if not self.needs_bridge[index]:
            return h.to(device), c.to(device)  # nn.Identity's
        return self.bridges_h[index](h.to(device)), self.bridges_c[index](c.to(device))

    def initial_state(self, index: int, encoder_out: Dict[str, List[Tensor]]) -> Tuple[Tensor, Tensor]:
        device = module_device(self.layers[index])
        if index < self.num_encoder_layers:
            return self.bridge(index, encoder_out["final_h"][index], encoder_out["final_c"][index])
        batch = encoder_out["encoder_out"][0].size(0)
        zeros = encoder_out["encoder_out"][0].new_zeros(batch, self.hidden_size, device=device)
        return zeros, zeros

    def run_layer(
        self, index: int, inputs: Tensor, state: Tuple[Tensor, Tensor]
    ) -> Tuple[Tensor, Tensor, Tensor]:
        """One layer over ``inputs`` B x T x C from ``state`` (h, c), each
        B x H.  Returns outputs B x T x H and the last ``h``, ``c``."""
        layer = self.layers[index]
        device = layer.weight_ih_l0.device
        inputs = inputs.to(device)
        state = (state[0].to(device).unsqueeze(0), state[1].to(device).unsqueeze(0))
        outputs, h, c = lstm_padded(layer, inputs, state)
        return self.finish_layer(index, outputs, inputs), h.squeeze(0), c.squeeze(0)

    def forward(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Dict[str, List[Tensor]],
        states: Optional[List[Tuple[Tensor, Tensor]]] = None,
    ) -> Tuple[Tensor, List[Tuple[Tensor, Tensor]]]:
        """Run all layers over ``prev_output_tokens`` B x T.  ``states`` are
        the per-layer ``(h, c)`` to continue from (incremental decoding);
        without them, each layer starts from the encoder.  Returns the top
        states B x T x H and the new per-layer states."""
        x = self.embed(prev_output_tokens)
        new_states = []
        for index in range(len(self.layers)):
            state = states[index] if states is not None else self.initial_state(index, encoder_out)
            x, h, c = self.run_layer(index, x, state)
            new_states.append((h, c))
        return x, new_states
