"""``hybrid_lstm``: an LSTM encoder-decoder built for hybrid parallel training.

The model is two explicit parts (see ``forward_rnn`` and
``attention_softmax_loss``):

* the *RNN part*: encoder and decoder LSTM stacks
  (:mod:`fairseq_hybrid.models.lstm_stacks`), which the hybrid engine runs
  model-parallel, one layer per device;
* the *attention-softmax part*
  (:mod:`fairseq_hybrid.models.attention_softmax`), which is independent per
  sentence and therefore runs data-parallel over batch shards.

Without input feeding the decoder stack never waits for attention, so in
training each decoder layer is one whole-sequence ``nn.LSTM`` call; step by
step decoding (beam search) carries each layer's ``(h, c)`` in fairseq's
``incremental_state``.
"""


from dataclasses import dataclass, field
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
from fairseq.dataclass import ChoiceEnum
from fairseq.models import (
    FairseqEncoder,
    FairseqEncoderDecoderModel,
    FairseqIncrementalDecoder,
    register_model,
    register_model_architecture,
)
from torch import Tensor

from ..hybrid_group import HybridGroup, HybridGroupConfig
from ..parallel import step_scope
from .attention_softmax import ATTENTION_TYPES, AttentionSoftmax
from .lstm_stacks import LSTMDecoderStack, LSTMEncoderStack


@dataclass
class HybridLSTMConfig(HybridGroupConfig):
    """The model's options; the ``--hybrid-*`` options are the group's
    (:class:`~fairseq_hybrid.hybrid_group.HybridGroupConfig`)."""

    dropout: float = field(default=0.1, metadata={"help": "dropout probability"})
    encoder_embed_dim: int = field(default=256, metadata={"help": "encoder embedding dimension"})
    encoder_hidden_size: int = field(default=256, metadata={"help": "encoder LSTM hidden size (per direction)"})
    encoder_layers: int = field(default=2, metadata={"help": "number of encoder layers"})
    encoder_bidirectional_layers: int = field(
        default=1, metadata={"help": "number of bidirectional layers at the bottom of the encoder"}
    )
    decoder_embed_dim: int = field(default=256, metadata={"help": "decoder embedding dimension"})
    decoder_hidden_size: int = field(default=256, metadata={"help": "decoder LSTM hidden size"})
    decoder_layers: int = field(default=2, metadata={"help": "number of decoder layers"})
    decoder_out_embed_dim: int = field(
        default=256, metadata={"help": "size of the attentional layer tanh(W[c;h]) before the output projection"}
    )
    attention_type: ChoiceEnum(ATTENTION_TYPES) = field(
        default="general", metadata={"help": "Luong attention score: dot, general or mlp (Bahdanau concat)"}
    )
    residual: bool = field(
        default=False, metadata={"help": "residual connections around layers whose input and output sizes match"}
    )
    share_decoder_input_output_embed: bool = field(
        default=False, metadata={"help": "tie the decoder's input embedding and output projection"}
    )
    max_source_positions: int = field(default=1024, metadata={"help": "longest source sentence accepted"})
    max_target_positions: int = field(default=1024, metadata={"help": "longest target sentence accepted"})


class RNNOutput(NamedTuple):
    """What the RNN part hands to the attention-softmax part, batch first."""

    decoder_states: Tensor  # B x T x H, top decoder layer
    encoder_states: Tensor  # B x S x C, top encoder layer
    encoder_padding_mask: Tensor  # B x S, True at padding


class HybridLSTMEncoder(FairseqEncoder):
    def __init__(self, dictionary, cfg):
        super().__init__(dictionary)
        self.stack = LSTMEncoderStack(
            num_embeddings=len(dictionary),
            padding_idx=dictionary.pad(),
            embed_dim=cfg.encoder_embed_dim,
            hidden_size=cfg.encoder_hidden_size,
            num_layers=cfg.encoder_layers,
            num_bidirectional=cfg.encoder_bidirectional_layers,
            dropout=cfg.dropout,
            residual=cfg.residual,
        )
        self.max_source_positions = cfg.max_source_positions

    def forward(self, src_tokens: Tensor, src_lengths: Tensor) -> Dict[str, List[Tensor]]:
        return self.stack(src_tokens, src_lengths)

    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order: Tensor):
        return {
            key: [t.index_select(0, new_order.to(t.device)) for t in value] for key, value in encoder_out.items()
        }

    def max_positions(self) -> int:
        return self.max_source_positions


class HybridLSTMDecoder(FairseqIncrementalDecoder):
    def __init__(self, dictionary, cfg, encoder_stack: LSTMEncoderStack):
        super().__init__(dictionary)
        self.stack = LSTMDecoderStack(
            num_embeddings=len(dictionary),
            padding_idx=dictionary.pad(),
            embed_dim=cfg.decoder_embed_dim,
            hidden_size=cfg.decoder_hidden_size,
            num_layers=cfg.decoder_layers,
            encoder_state_sizes=[size for _, size, _ in encoder_stack.sizes],
            dropout=cfg.dropout,
            residual=cfg.residual,
        )
        self.attention_softmax = AttentionSoftmax(
            attention_type=cfg.attention_type,
            decoder_hidden_size=cfg.decoder_hidden_size,
            encoder_output_size=encoder_stack.output_size,
            out_embed_dim=cfg.decoder_out_embed_dim,
            num_embeddings=len(dictionary),
            dropout=cfg.dropout,
            tied_weight=self.stack.embed_tokens.weight if cfg.share_decoder_input_output_embed else None,
        )
        self.max_target_positions = cfg.max_target_positions

    def forward_rnn(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Dict[str, List[Tensor]],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
    ) -> Tensor:
        """Top decoder states B x T x H (B x 1 x H when decoding incrementally)."""
        states = None
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            cached = self.get_incremental_state(incremental_state, "cached_state")
            if cached is not None:
                states = [(cached[f"h{layer}"], cached[f"c{layer}"]) for layer in range(len(self.stack.layers))]
        top, new_states = self.stack(prev_output_tokens, encoder_out, states)
        if incremental_state is not None:
            # One entry per layer and state (B x H), each on its layer's device.
            cached = {}
            for layer, (h, c) in enumerate(new_states):
                cached[f"h{layer}"], cached[f"c{layer}"] = h, c
            self.set_incremental_state(incremental_state, "cached_state", cached)
        return top

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, **unused):
        states = self.forward_rnn(prev_output_tokens, encoder_out, incremental_state)
        logits, attn = self.attention_softmax(
            states, encoder_out["encoder_out"][0], encoder_out["encoder_padding_mask"][0]
        )
        return logits, {"attn": [attn]}

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        cached = self.get_incremental_state(incremental_state, "cached_state")
        if cached is None:
            return
        self.set_incremental_state(
            incremental_state,
            "cached_state",
            {key: value.index_select(0, new_order.to(value.device)) for key, value in cached.items()},
        )

    def max_positions(self) -> int:
        return self.max_target_positions


# The loss over a shard of the attention-softmax part: (attentional features
# B' x T x D, output weight V x D, output bias V, target B' x T) -> tuple of
# summed scalars.  Sums add up across shards.  A hybrid group's cells also
# pass the positions that count and their device's gradient sink
# (kernels/fused_output_loss.py).
ShardLoss = Callable[..., Tuple[Tensor, ...]]


@register_model("hybrid_lstm", dataclass=HybridLSTMConfig)
class HybridLSTMModel(FairseqEncoderDecoderModel):
    """LSTM encoder-decoder without input feeding, split into an RNN part and
    an attention-softmax part for hybrid data/model parallel training.

    The model computes; where is not its business.  With
    ``--hybrid-devices`` it is run by a :class:`~fairseq_hybrid.hybrid_group.HybridGroup`
    (``hybrid_group``), which puts its layers on the group's devices and
    runs its training steps there; ``to(device)`` / ``cuda()`` / ``cpu()``
    (which fairseq's trainer and generator call) then change only the
    dtype, never that placement.  Parameter names and shapes do not depend
    on the group, so a checkpoint from K devices loads on any other K'.
    """

    def __init__(self, encoder, decoder):
        super().__init__(encoder, decoder)
        self.hybrid_group: Optional[HybridGroup] = None

    @classmethod
    def build_model(cls, cfg, task):
        hybrid_lstm_base_architecture(cfg)
        encoder = HybridLSTMEncoder(task.source_dictionary, cfg)
        decoder = HybridLSTMDecoder(task.target_dictionary, cfg, encoder.stack)
        model = cls(encoder, decoder)
        model.hybrid_group = HybridGroup.from_options(model, cfg)
        return model

    def to(self, *args, **kwargs):
        if self.hybrid_group is None:
            return super().to(*args, **kwargs)
        _, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is not None:
            super().to(dtype=dtype, non_blocking=non_blocking)
        return self

    def cuda(self, device=None):
        return self if self.hybrid_group is not None else super().cuda(device)

    def cpu(self):
        return self if self.hybrid_group is not None else super().cpu()

    # -- training ------------------------------------------------------------

    def forward_rnn(self, src_tokens: Tensor, src_lengths: Tensor, prev_output_tokens: Tensor, **unused) -> RNNOutput:
        """The RNN part: encoder and decoder stacks under teacher forcing.
        Each layer runs where its parameters are; activations follow."""
        encoder_out = self.encoder(src_tokens, src_lengths)
        decoder_states = self.decoder.forward_rnn(prev_output_tokens, encoder_out)
        return RNNOutput(
            decoder_states, encoder_out["encoder_out"][0], encoder_out["encoder_padding_mask"][0]
        )

    def attention_softmax_loss(self, rnn_out: RNNOutput, target: Tensor, shard_loss: ShardLoss) -> Tuple[Tensor, ...]:
        """The attention-softmax part followed by ``shard_loss`` on one
        device, in one piece: what the single-device model computes.

        ``shard_loss`` returns sums, so that a hybrid group can add the
        results of batch shards and get this value back.
        """
        part = self.decoder.attention_softmax
        features, _ = part.features(*rnn_out)
        return shard_loss(features, part.output_weight, part.output_bias, target.to(part.output_bias.device))

    def forward(self, src_tokens: Tensor, src_lengths: Tensor, prev_output_tokens: Tensor,
                loss_of: Optional[Tuple[Tensor, ShardLoss]] = None, **kwargs):
        """fairseq's forward (logits and attention), or with ``loss_of=(target,
        shard_loss)`` the summed loss terms of :meth:`loss_sums`.
        ``hybrid_cross_entropy`` calls the model this way rather than calling
        ``loss_sums`` past it: PyTorch's DistributedDataParallel (fairseq's
        ``pytorch_ddp``) prepares its gradient all-reduce in its forward, and a
        step that never passes through it leaves every rank with its own
        gradients, silently (``tests/test_ddp_sees_the_loss.py``)."""
        if loss_of is None:
            return super().forward(src_tokens, src_lengths, prev_output_tokens, **kwargs)
        net_input = dict(kwargs, src_tokens=src_tokens, src_lengths=src_lengths, prev_output_tokens=prev_output_tokens)
        return self.loss_sums(net_input, *loss_of)

    def loss_sums(self, net_input: Dict[str, Tensor], target: Tensor, shard_loss: ShardLoss) -> Tuple[Tensor, ...]:
        """What ``hybrid_cross_entropy`` calls: the summed loss terms of a
        batch, computed in one piece or, with a hybrid group, as cells on
        the group's devices, all at once."""
        if self.hybrid_group is None:
            return self.attention_softmax_loss(self.forward_rnn(**net_input), target, shard_loss)
        with step_scope():  # the host must not wait for a device from the group's first line on
            return self.hybrid_group.loss_sums(net_input, target, shard_loss)


def _set_defaults(cfg, **defaults):
    for name, value in defaults.items():
        if getattr(cfg, name, None) is None:
            setattr(cfg, name, value)


def hybrid_lstm_base_architecture(cfg):
    """Fill every option the user and the preset left unset (``--arch
    hybrid_lstm`` itself is registered by ``register_model`` with the
    dataclass defaults)."""
    _set_defaults(
        cfg,
        **{name: f.default for name, f in HybridLSTMConfig.__dataclass_fields__.items()},
    )


@register_model_architecture("hybrid_lstm", "hybrid_lstm_tiny")
def hybrid_lstm_tiny(cfg):
    """A few thousand parameters per layer: for tests and smoke runs."""
    _set_defaults(
        cfg,
        encoder_embed_dim=32,
        encoder_hidden_size=32,
        decoder_embed_dim=32,
        decoder_hidden_size=32,
        decoder_out_embed_dim=32,
        dropout=0.0,
    )
    hybrid_lstm_base_architecture(cfg)


@register_model_architecture("hybrid_lstm", "hybrid_lstm_base")
def hybrid_lstm_base(cfg):
    """The Tatoeba ja-en default: 2+2 layers of 256, bottom layer bidirectional."""
    hybrid_lstm_base_architecture(cfg)


@register_model_architecture("hybrid_lstm", "hybrid_lstm_paper")
def hybrid_lstm_paper(cfg):
    """The size of a patent-scale run: 4 encoder + 4 decoder layers of 1024."""
    _set_defaults(
        cfg,
        encoder_embed_dim=512,
        encoder_hidden_size=1024,
        encoder_layers=4,
        decoder_embed_dim=512,
        decoder_hidden_size=1024,
        decoder_layers=4,
        decoder_out_embed_dim=1024,
        dropout=0.2,
    )
    hybrid_lstm_base_architecture(cfg)
