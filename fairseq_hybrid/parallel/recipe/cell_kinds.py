"""The kinds of cell a ``hybrid`` or ``model`` step is made of, each a small
type that holds what picks its piece of the step (a layer, a time chunk, a
shard) and makes its code and its cost-model work from a staged
micro-batch (:class:`.staging.StagedBatch`).

A kind also says the shape of each of its outputs from the micro-batch's
layout alone (``output_shapes``), without running anything: a stage on
the GPU wire receives another stage's output without a header
(:class:`..runtime.channels.OverWire`).

A kind says nothing about the batch itself, so the list of a step's cells,
each with its kind, is the same for every batch of one shape
(:mod:`.step_skeleton` keeps it), and a worker makes the code of its own
cells alone (:mod:`.hybrid_cells`).  Every cell computes what the
single-device model computes for its piece, so the step's loss and
gradients equal the single-device ones.
"""

from __future__ import annotations

from typing import Callable, Dict, NamedTuple, Optional, Sequence, Tuple

from torch import Tensor

from ...kernels.fused_output_loss import GradientSink
from ..runtime.cell_graph import Work
from .single_device_masks import with_masks
from .staging import StagedBatch
from .step_builder import StepBuilder, join

Made = Tuple[Callable[..., Sequence[Tensor]], Work]
Shapes = Optional[Tuple[Tuple[int, ...], ...]]  # each output's shape; None: not declared


class Making(NamedTuple):
    """What every cell of a step is made with besides its micro-batch: the
    step (model, plan, replicas), the criterion's shard loss, each worker's
    gradient sink for its attention-softmax cells, and the model's parts
    the cells run (looked up once a step, not once a cell)."""

    step: StepBuilder
    shard_loss: Optional[Callable]
    sinks: Dict[int, GradientSink]
    plan: object
    encoder: object  # the model's encoder stack
    decoder: object  # the model's decoder stack
    part: object  # the attention-softmax part

    @classmethod
    def of(cls, step: StepBuilder, shard_loss, sinks: Dict[int, GradientSink]) -> "Making":
        model = step.model
        return cls(step, shard_loss, sinks, step.plan, model.encoder.stack, model.decoder.stack,
                   model.decoder.attention_softmax)


class SourceEmbedding(NamedTuple):
    """The source embedding (rows in length order), its output cut into
    the time chunks."""

    def make(self, making: Making, batch: StagedBatch) -> Made:
        encoder, plan = making.encoder, making.plan
        order = batch.order

        def embed_source():
            x = encoder.embed(batch.sorted_source)
            return x.split(batch.source_sizes(), dim=1)

        mask = batch.pick(lambda m: m.source[order], plan.encoder_device(0))
        return with_masks(mask, embed_source), Work("embedding", batch.source_tokens,
                                                    (encoder.embed_tokens.embedding_dim,))

    def output_shapes(self, making: Making, batch: StagedBatch) -> Shapes:
        width = making.encoder.embed_tokens.embedding_dim
        return tuple((batch.rows, size, width) for size in batch.source_sizes())


class EncoderDirection(NamedTuple):
    """One direction of bidirectional encoder layer ``layer`` over the
    whole sequence, on ``worker`` (a replica of the direction where that is
    not the layer's own worker); its inputs are ``width`` parts of each of
    ``count`` chunks."""

    layer: int
    reverse: bool
    worker: int
    width: int
    count: int

    def make(self, making: Making, batch: StagedBatch) -> Made:
        step = making.step
        encoder, plan = making.encoder, making.plan
        layer, reverse, worker, width, count = self
        module = encoder.layers[layer]
        device = plan.devices[worker]
        master = encoder.direction(layer, reverse)
        replicas = step.replicas.direction(layer, reverse) if worker != plan.encoder[layer] else None

        def run_direction(*parts):
            x = join([join(parts[c * width:(c + 1) * width]) for c in range(count)], chunked=True)
            lstm = master if replicas is None else replicas.on(worker, device, step)
            positions = batch.reversed_positions[device] if reverse else None
            out, h, c = encoder.run_direction(lstm, reverse, x, batch.sorted_lengths, positions,
                                              batch.packed_layouts[device])
            out = encoder.finish_layer(layer, out, x, reverse)
            return (*out.split(batch.source_sizes(), dim=1), h, c)

        half = slice(module.hidden_size, None) if reverse else slice(0, module.hidden_size)
        order = batch.order
        mask = batch.pick(lambda m: m.encoder[layer][order][..., half], device)
        return with_masks(mask, run_direction), Work("lstm", batch.source_tokens,
                                                     (module.input_size, module.hidden_size, batch.source_width))

    def output_shapes(self, making: Making, batch: StagedBatch) -> Shapes:
        hidden = making.encoder.layers[self.layer].hidden_size
        return (*((batch.rows, size, hidden) for size in batch.source_sizes()), (batch.rows, hidden),
                (batch.rows, hidden))


class EncoderChunk(NamedTuple):
    """Time chunk ``chunk`` of unidirectional encoder layer ``layer``,
    carrying ``(h, c)`` from the chunk before; its input is ``width``
    parts, then the state (none for the first chunk)."""

    layer: int
    chunk: int
    width: int

    def make(self, making: Making, batch: StagedBatch) -> Made:
        encoder, plan = making.encoder, making.plan
        layer, c, width = self
        module = encoder.layers[layer]
        chunk = batch.source_chunks[c]
        layout = batch.chunk_layouts[c][plan.encoder_device(layer)]
        sorted_lengths = batch.sorted_lengths

        def run_chunk(*args):
            x = join(args[:width])
            state = None if c == 0 else (args[width], args[width + 1])
            if layout is None:  # every row has ended: nothing to pack
                return encoder.run_chunk(layer, x, sorted_lengths, chunk.start, state)
            return encoder.run_chunk(layer, x, sorted_lengths, chunk.start, state, layout)

        order = batch.order
        mask = batch.pick(lambda m: m.encoder[layer][order][:, chunk], plan.encoder_device(layer))
        return with_masks(mask, run_chunk), Work("lstm", batch.chunk_tokens[c], (module.input_size, module.hidden_size,
                                                                                  chunk.stop - chunk.start))

    def output_shapes(self, making: Making, batch: StagedBatch) -> Shapes:
        hidden = making.encoder.layers[self.layer].hidden_size
        chunk = batch.source_chunks[self.chunk]
        return (batch.rows, chunk.stop - chunk.start, hidden), (batch.rows, hidden), (batch.rows, hidden)


class EncoderTop(NamedTuple):
    """The top encoder layer's ``count`` chunks of ``width`` parts joined,
    the rows put back in batch order and cut into the batch shards (its
    outputs ``shard k``)."""

    width: int
    count: int

    def make(self, making: Making, batch: StagedBatch) -> Made:
        encoder, plan = making.encoder, making.plan
        width, count = self
        restore = batch.restore_on[plan.encoder_device(len(encoder.layers) - 1)]

        def encoder_top(*parts):
            x = join([join(parts[c * width:(c + 1) * width]) for c in range(count)], chunked=True)
            x = x[restore]
            return tuple(x[rows] for rows in batch.shards)

        return encoder_top, Work("gather", batch.rows * batch.source_width, (encoder.output_size,))

    def output_shapes(self, making: Making, batch: StagedBatch) -> Shapes:
        return tuple((rows.stop - rows.start, batch.source_width, making.encoder.output_size) for rows in batch.shards)


class TargetEmbedding(NamedTuple):
    """The target embedding, its output cut into the time chunks."""

    def make(self, making: Making, batch: StagedBatch) -> Made:
        decoder, plan = making.decoder, making.plan
        prev_output_tokens, target_chunks = batch.prev_output_tokens, batch.target_chunks

        def embed_target():
            y = decoder.embed(prev_output_tokens)
            return y.split([chunk.stop - chunk.start for chunk in target_chunks], dim=1)

        return (with_masks(batch.pick(lambda m: m.target, plan.decoder_device(0)), embed_target),
                Work("embedding", prev_output_tokens.numel(), (decoder.embed_tokens.embedding_dim,)))

    def output_shapes(self, making: Making, batch: StagedBatch) -> Shapes:
        width = making.decoder.embed_tokens.embedding_dim
        return tuple((batch.rows, chunk.stop - chunk.start, width) for chunk in batch.target_chunks)


class DecoderChunk(NamedTuple):
    """Time chunk ``chunk`` of decoder layer ``layer``: the first chunk
    starts from the encoder layer's final state (its parts joined, put back
    in batch order and bridged) or from zeros; the top layer's outputs are
    the chunk's rows of each batch shard."""

    layer: int
    chunk: int
    top: bool

    def make(self, making: Making, batch: StagedBatch) -> Made:
        decoder, plan = making.decoder, making.plan
        layer, c, top = self
        module = decoder.layers[layer]
        restore = batch.restore_on[plan.decoder_device(layer)]
        shards = batch.shards

        def run_chunk(*args):
            x, state = args[0], args[1:]
            if c == 0 and state:
                half = len(state) // 2
                h, cell = join(state[:half])[restore], join(state[half:])[restore]
                state = decoder.bridge(layer, h, cell)
            elif not state:
                zeros = x.new_zeros(x.size(0), decoder.hidden_size)
                state = (zeros, zeros)
            out, h, cell = decoder.run_layer(layer, x, state)
            if top:
                return (h, cell, *(out[rows] for rows in shards))
            return h, cell, out

        span = batch.target_chunks[c]
        steps = span.stop - span.start
        mask = batch.pick(lambda m: m.decoder[layer][:, span], plan.decoder_device(layer))
        return with_masks(mask, run_chunk), Work("lstm", batch.rows * steps,
                                                 (module.input_size, module.hidden_size, steps))

    def output_shapes(self, making: Making, batch: StagedBatch) -> Shapes:
        hidden = making.decoder.layers[self.layer].hidden_size
        span = batch.target_chunks[self.chunk]
        steps = span.stop - span.start
        state = ((batch.rows, hidden), (batch.rows, hidden))
        if self.top:
            return (*state, *((rows.stop - rows.start, steps, hidden) for rows in batch.shards))
        return (*state, (batch.rows, steps, hidden))


class AttentionSoftmax(NamedTuple):
    """Batch shard ``shard`` of the attention-softmax part over the target
    chunks of softmax group ``group``, on ``worker`` (with its replica of
    the part, or the master on the master's own worker, the first decoder
    layer's), ending in the criterion's summed loss; its output layer's
    gradient goes into the worker's sink."""

    shard: int
    group: int
    worker: int

    def make(self, making: Making, batch: StagedBatch) -> Made:
        step = making.step
        plan, part = making.plan, making.part
        k, g, worker = self
        master = plan.decoder[0]
        replicas = step.replicas.attention_softmax()
        device = plan.devices[worker]
        sink, shard_loss = making.sinks[worker], making.shard_loss

        def run_shard(*args):
            states, encoder_states = join(args[:-1], chunked=True), args[-1]  # the group's chunks joined
            # The replica is brought up to date on its own worker (on its stream); the model's part
            # computes its piece of the loss (fused where it can)
            replica = part if worker == master else replicas.on(worker, device, step)
            return replica.loss_sums(states, encoder_states, batch.padding_masks[k], batch.targets[k][g],
                                     batch.kept[k][g], shard_loss, sink)

        rows, span = batch.shards[k], batch.softmax_spans[g]
        sizes = (making.decoder.hidden_size, making.encoder.output_size, *reversed(part.output_weight.shape),
                 batch.source_width)
        mask = batch.pick(lambda m: m.features[rows, span], device)
        return with_masks(mask, run_shard), Work("attention_softmax", (rows.stop - rows.start) * (span.stop - span.start),
                                                 sizes)

    def output_shapes(self, making: Making, batch: StagedBatch) -> Shapes:
        return None  # loss sums, read by the trainer alone
