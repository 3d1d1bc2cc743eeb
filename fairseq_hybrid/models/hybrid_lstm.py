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


import copy
import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import (
    FairseqEncoder,
    FairseqEncoderDecoderModel,
    FairseqIncrementalDecoder,
    register_model,
    register_model_architecture,
)
from torch import Tensor

from ..parallel.device_plan import MODES, DevicePlan, DevicePlanError, build_plan, parse_devices, plan_table
from ..parallel.replicas import Replicas
from ..parallel.worker import DEFAULT_TIMEOUT
from .attention_softmax import ATTENTION_TYPES, AttentionSoftmax
from .hybrid_cells import data_parallel_step, hybrid_step
from .lstm_stacks import LSTMDecoderStack, LSTMEncoderStack

logger = logging.getLogger(__name__)


@dataclass
class HybridLSTMConfig(FairseqDataclass):
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
    hybrid_devices: str = field(
        default="",
        metadata={
            "help": "devices of one hybrid group: cuda:0,cuda:1,... or cpu,cpu,... or a count K; "
            "empty: the single device fairseq puts the model on"
        },
    )
    hybrid_placement: str = field(
        default="",
        metadata={
            "help": "device index of every layer, 'encoder=0,1,0,1;decoder=0,1,0,1'; "
            "empty: encoder and decoder layer l on device l mod K; auto: the placement with the "
            "shortest simulated step (under --hybrid-cost-model, or counting floating-point operations)"
        },
    )
    hybrid_cost_model: str = field(
        default="",
        metadata={
            "help": "for --hybrid-placement auto: cell costs measured on your devices, the JSON file that "
            "scripts/simulate_schedule.py --json writes (or a cost model saved alone); empty: every "
            "floating-point operation costs the same"
        },
    )
    hybrid_chunk_length: int = field(
        default=0,
        metadata={
            "help": "time steps per wavefront cell of the LSTM stacks; 0: split each sequence into as many "
            "chunks as there are devices"
        },
    )
    hybrid_dropout_masks: ChoiceEnum(["per-cell", "single-device"]) = field(
        default="per-cell",
        metadata={
            "help": "per-cell: each cell draws its dropout masks from its own seeded generator, in parallel; "
            "single-device: the group draws exactly the masks the single-device model would draw (from torch's "
            "global generator, one after another) so it trains exactly like one device, dropout included"
        },
    )
    hybrid_timeout: float = field(
        default=DEFAULT_TIMEOUT,
        metadata={
            "help": "seconds a hybrid group may take for the forward or the backward pass of one batch before "
            "training stops with an error naming the device and the cell it is stuck in"
        },
    )
    hybrid_mode: ChoiceEnum(MODES) = field(
        default="hybrid",
        metadata={
            "help": "hybrid: layers model-parallel, attention-softmax data-parallel over batch shards; "
            "model: layers model-parallel only; data: whole-model replicas over batch shards"
        },
    )


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
# summed scalars.  Sums add up across shards.
ShardLoss = Callable[[Tensor, Tensor, Tensor, Tensor], Tuple[Tensor, ...]]


@register_model("hybrid_lstm", dataclass=HybridLSTMConfig)
class HybridLSTMModel(FairseqEncoderDecoderModel):
    """LSTM encoder-decoder without input feeding, split into an RNN part and
    an attention-softmax part for hybrid data/model parallel training.

    With ``--hybrid-devices`` the model carries a :class:`DevicePlan`: its
    layers live on the plan's devices, and ``to(device)`` / ``cuda()`` /
    ``cpu()`` (which fairseq's trainer and generator call) change only the
    dtype, never that placement.  Parameter names and shapes do not depend
    on the plan, so a checkpoint from K devices loads on any other K'.
    """

    def __init__(self, encoder, decoder):
        super().__init__(encoder, decoder)
        self.plan: Optional[DevicePlan] = None
        self.chunk_length = 0
        self.dropout_masks = "per-cell"
        self.timeout = DEFAULT_TIMEOUT
        # Replicas for batch shards on other devices (see parallel/replicas.py);
        # plain attributes, so they are neither parameters nor saved.
        self._replicas: Dict[str, Replicas] = {}

    @classmethod
    def build_model(cls, cfg, task):
        hybrid_lstm_base_architecture(cfg)
        encoder = HybridLSTMEncoder(task.source_dictionary, cfg)
        decoder = HybridLSTMDecoder(task.target_dictionary, cfg, encoder.stack)
        model = cls(encoder, decoder)
        if cfg.hybrid_devices:
            placement = cfg.hybrid_placement
            if getattr(cfg, "hybrid_cost_model", "") and placement != "auto":
                raise DevicePlanError("--hybrid-cost-model is used by --hybrid-placement auto only")
            if placement == "auto" and cfg.hybrid_mode != "data":
                placement = model.auto_placement(cfg)
            plan = build_plan(
                cfg.hybrid_devices, placement, cfg.hybrid_mode, cfg.encoder_layers, cfg.decoder_layers
            )
            if cfg.hybrid_chunk_length < 0:
                raise DevicePlanError(f"--hybrid-chunk-length must be >= 0, got {cfg.hybrid_chunk_length}")
            if not cfg.hybrid_timeout > 0:
                raise DevicePlanError(f"--hybrid-timeout must be > 0 seconds, got {cfg.hybrid_timeout}")
            model.place(plan)
            model.chunk_length = cfg.hybrid_chunk_length
            model.dropout_masks = cfg.hybrid_dropout_masks
            model.timeout = float(cfg.hybrid_timeout)
            logger.info("hybrid group (%s mode, %d devices):\n%s", plan.mode, plan.size, model.placement_table())
        elif cfg.hybrid_placement or getattr(cfg, "hybrid_cost_model", ""):
            raise ValueError("--hybrid-placement and --hybrid-cost-model need --hybrid-devices")
        return model

    # -- placement ---------------------------------------------------------

    def auto_placement(self, cfg) -> str:
        """``--hybrid-placement auto``: the placement whose replayed schedule
        is shortest (:mod:`.step_simulation`) for a nominal batch, under
        the measured cost model of ``--hybrid-cost-model`` or, without one,
        one where every floating-point operation costs the same."""
        from .step_simulation import NOMINAL_BATCH, best_placement

        devices = parse_devices(cfg.hybrid_devices)
        cost_file = getattr(cfg, "hybrid_cost_model", "")
        cost = load_cost_model(cost_file)
        default = build_plan(cfg.hybrid_devices, "", "hybrid", cfg.encoder_layers, cfg.decoder_layers)
        placement, predicted = best_placement(self, cfg, devices, cost)
        logger.info(
            "--hybrid-placement auto: %s (predicted step: %.1f%% of the default placement's, for a nominal "
            "batch of %d sentences of %d source and %d target tokens; %s)", placement,
            100 * predicted.total / _default_time(self, cfg, default, cost), *NOMINAL_BATCH,
            f"cost model {cost_file}" if cost_file else "floating-point operations only",
        )
        return placement


    def place(self, plan: DevicePlan) -> None:
        """Move every layer to its device: embeddings with the bottom layer,
        bridges with their decoder layer, the attention-softmax master (and
        a tied output embedding) with the bottom decoder layer."""
        encoder, decoder = self.encoder.stack, self.decoder.stack
        encoder.embed_tokens.to(plan.encoder_device(0))
        for layer, module in enumerate(encoder.layers):
            module.to(plan.encoder_device(layer))
        decoder.embed_tokens.to(plan.decoder_device(0))
        for layer, module in enumerate(decoder.layers):
            for part in (module, decoder.bridges_h[layer], decoder.bridges_c[layer]):
                part.to(plan.decoder_device(layer))
        self.decoder.attention_softmax.to(plan.decoder_device(0))
        self.plan = plan

    def placement_rows(self):
        """``(part, device, parameters)`` of every placed part."""
        encoder, decoder = self.encoder.stack, self.decoder.stack

        def count(*modules):
            return sum(p.numel() for m in modules for p in m.parameters())

        def where(module):
            return str(next(module.parameters()).device)

        rows = [("encoder embeddings", where(encoder.embed_tokens), count(encoder.embed_tokens))]
        for layer, module in enumerate(encoder.layers):
            kind = "bidirectional" if module.bidirectional else "LSTM"
            rows.append((f"encoder layer {layer} ({kind})", where(module), count(module)))
        rows.append(("decoder embeddings", where(decoder.embed_tokens), count(decoder.embed_tokens)))
        for layer, module in enumerate(decoder.layers):
            rows.append((f"decoder layer {layer} (+bridge)", where(module),
                         count(module, decoder.bridges_h[layer], decoder.bridges_c[layer])))
        part = self.decoder.attention_softmax
        shards = ", ".join(str(d) for d in self.plan.shard_devices) if self.plan else where(part)
        shared = part.output_weight is decoder.embed_tokens.weight
        rows.append(("attention-softmax" + (" (tied)" if shared else ""), f"master {where(part)}; shards {shards}",
                     count(part) - (part.output_weight.numel() if shared else 0)))
        return rows

    def placement_table(self) -> str:
        rows = [(name, device, f"{params:,}") for name, device, params in self.placement_rows()]
        return plan_table([("part", "device", "parameters")] + rows)

    def to(self, *args, **kwargs):
        if self.plan is None:
            return super().to(*args, **kwargs)
        _, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is not None:
            super().to(dtype=dtype, non_blocking=non_blocking)
        return self

    def cuda(self, device=None):
        return self if self.plan is not None else super().cuda(device)

    def cpu(self):
        return self if self.plan is not None else super().cpu()

    # -- training ------------------------------------------------------------

    def forward_rnn(self, src_tokens: Tensor, src_lengths: Tensor, prev_output_tokens: Tensor, **unused) -> RNNOutput:
        """The RNN part: encoder and decoder stacks under teacher forcing.
        Each layer runs on its own device; activations follow."""
        encoder_out = self.encoder(src_tokens, src_lengths)
        decoder_states = self.decoder.forward_rnn(prev_output_tokens, encoder_out)
        return RNNOutput(
            decoder_states, encoder_out["encoder_out"][0], encoder_out["encoder_padding_mask"][0]
        )

    def attention_softmax_loss(self, rnn_out: RNNOutput, target: Tensor, shard_loss: ShardLoss) -> Tuple[Tensor, ...]:
        """The attention-softmax part followed by ``shard_loss`` on one
        device, in one piece: what the single-device model computes.

        ``shard_loss`` returns sums, so that the hybrid engine can add the
        results of batch shards and get this value back.
        """
        part = self.decoder.attention_softmax
        features, _ = part.features(*rnn_out)
        return shard_loss(features, part.output_weight, part.output_bias, target.to(part.output_bias.device))

    def compute_loss(self, net_input: Dict[str, Tensor], target: Tensor, shard_loss: ShardLoss) -> Tuple[Tensor, ...]:
        """What ``hybrid_cross_entropy`` calls: the summed loss of a batch.
        With a device plan, the hybrid engine runs the step as cells on the
        plan's devices, all at once (:mod:`.hybrid_cells`)."""
        if self.plan is None:
            return self.attention_softmax_loss(self.forward_rnn(**net_input), target, shard_loss)
        if self.plan.mode == "data":
            return data_parallel_step(self, self.plan, net_input, target, shard_loss, self.timeout)
        return hybrid_step(self, self.plan, net_input, target, shard_loss, self.chunk_length, self.timeout)

    def attention_softmax_replicas(self) -> Replicas:
        if "attention_softmax" not in self._replicas:
            self._replicas["attention_softmax"] = Replicas(self.decoder.attention_softmax)
        return self._replicas["attention_softmax"]

    def direction_replicas(self, layer: int, reverse: bool) -> Replicas:
        """Replicas of one direction of a bidirectional encoder layer (the
        engine runs the reverse direction on the layer's partner device)."""
        master = self.encoder.stack.direction(layer, reverse)
        key = f"encoder layer {layer} {'reverse' if reverse else 'forward'}"
        if key not in self._replicas or self._replicas[key].master is not master:
            self._replicas[key] = Replicas(master)
        return self._replicas[key]

    def whole_model_replicas(self) -> Replicas:
        """Replicas of the whole model, without a plan (data mode)."""
        if "model" not in self._replicas:
            self._replicas["model"] = Replicas(
                self, make_copy=lambda model: type(model)(copy.deepcopy(model.encoder), copy.deepcopy(model.decoder))
            )
        return self._replicas["model"]


def _default_time(model, cfg, plan, cost) -> float:
    from .step_simulation import NOMINAL_BATCH, batch, step_time

    sentences, source_length, target_length = NOMINAL_BATCH
    net_input, target = batch(sentences, [source_length] * sentences, target_length)
    return step_time(model, plan, net_input, target, cost, cfg.hybrid_chunk_length).total


def load_cost_model(path: str):
    """The cost model in ``path`` (``scripts/simulate_schedule.py --json``
    output, or ``CostModel.save``); the FLOP-only model when ``path`` is
    empty.  A missing or malformed file is a DevicePlanError naming it."""
    import json

    from ..parallel.schedule_sim import CostModel

    if not path:
        return CostModel()
    try:
        with open(path) as f:
            data = json.load(f)
        return CostModel(**data.get("cost_model", data))
    except (OSError, ValueError, TypeError, AttributeError) as error:
        raise DevicePlanError(f"--hybrid-cost-model {path}: not a cost model ({error}); write one with "
                              "scripts/simulate_schedule.py DATA --json FILE") from error


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
