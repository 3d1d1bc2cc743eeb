"""The cells of one ``hybrid`` or ``model`` step (see docs/design.md for
the schedule drawn out), each on the device of the plan that owns its
parameters:

* source embedding (with encoder layer 0);
* each bidirectional encoder layer as two whole-sequence cells, the forward
  direction on the layer's device and the reverse direction on the next
  device (a reverse direction needs the whole input, so these layers sit at
  the bottom);
* each unidirectional encoder layer as one cell per time chunk, carrying
  ``(h, c)`` from chunk to chunk; the encoder runs with rows sorted by
  source length so the sentences still running in a chunk are a prefix;
* the top encoder states put back in batch order and cut into batch shards;
* target embedding (with decoder layer 0) and each decoder layer as one cell
  per time chunk; chunk 0 of decoder layer ``l`` starts from the final state
  of encoder layer ``l``, so it runs as soon as that layer is done;
* one attention-softmax cell per batch shard (``hybrid``: every device;
  ``model``: one shard on the top decoder layer's device) and time chunk,
  or group of consecutive chunks (``--hybrid-softmax-chunks``), each with
  its device's replica of the attention-softmax parameters, ending in the
  criterion's summed loss.

Every cell computes what the single-device model computes for its piece,
so the step's loss and gradients equal the single-device ones.  The cells
read the batch as :mod:`.staging` put it on their devices.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ...kernels.fused_output_loss import GradientSink
from ..runtime.cell_graph import Work
from .device_plan import DevicePlan
from ..runtime.replicas import ModelReplicas
from .single_device_masks import with_masks
from .staging import StagedBatch, StagedStep
from .step_builder import (BuiltStep, ReplicaUse, StepBuilder, chunk_names, join, merged_uses, replica_uses,
                           shard_names)
from ..runtime.wavefront import Ref

# A layer's output: for each time chunk, the refs of the parts that are
# concatenated along the feature dimension (the two directions of a
# bidirectional layer, or one part).
LayerOutput = List[List[Ref]]


def hybrid_cells(model, plan: DevicePlan, staged: StagedStep, shard_loss,
                 replicas: Optional[ModelReplicas] = None, only: Optional[int] = None) -> BuiltStep:
    """The cells of one ``hybrid`` or ``model`` step, in the order that
    fixes their dropout seeds: for each micro-batch, encoder, its top
    states, decoder, shards.  Each micro-batch is its own chain of cells,
    so that one device's layer works on a micro-batch while the next
    device works on the one before and the attention-softmax part on an
    earlier one still.  ``replicas``: the group's replica caches (fresh
    ones when not given, as for the schedule simulator, which never runs
    the cells); ``only``: :class:`StepBuilder`'s."""
    step = StepBuilder(model, plan, replicas or ModelReplicas(model), only)
    outputs: List[int] = []
    uses: List[ReplicaUse] = []
    master_uses: List[ReplicaUse] = []
    # A micro-batch enters the wavefront a K-th of its source chunks after
    # the one before it (the simulator's best for the paper's setting lay
    # between a 4th and a 3rd of them, whatever the chunk length).
    stagger = max(1, round(len(staged.micro_batches[0].source_chunks) / plan.size))
    # each device's attention-softmax cells, of every micro-batch and time chunk, sum their output layer's
    # gradient into one matrix instead of keeping one each from forward to backward
    sinks = {worker: GradientSink() for worker in range(plan.size)}
    for batch in staged.micro_batches:
        step.prefix, step.not_before = batch.name, batch.index * stagger
        encoder_output, final_states, direction_uses = _add_encoder(step, batch)
        encoder_shards = _add_encoder_top(step, batch, encoder_output)
        decoder_chunks = _add_decoder(step, batch, final_states)
        shard_outputs, attention_uses, attention_master = _add_attention_softmax(step, batch, shard_loss,
                                                                                 encoder_shards, decoder_chunks, sinks)
        outputs += shard_outputs
        uses += attention_uses + direction_uses
        master_uses += attention_master
    step.prefix, step.not_before = "", 0
    # one use per replica and worker, over every micro-batch's cells, in the
    # order the replicas are first needed: their parameter copies queue one
    # behind the other on their master's device
    return BuiltStep(step, outputs, tuple(sorted(merged_uses(uses), key=lambda use: min(use.cells))),
                     tuple(merged_uses(master_uses)))


def _add_encoder(step: StepBuilder, batch: StagedBatch):
    """Source embedding and encoder layers (rows in length order); returns
    the top layer's output, every layer's final ``(h, c)`` refs and the
    uses of replicas of reverse directions that run away from their layer."""
    encoder, plan = step.model.encoder.stack, step.plan
    order, sorted_lengths, source_chunks = batch.order, batch.sorted_lengths, batch.source_chunks
    pick = batch.pick
    count = len(source_chunks)
    chunks = chunk_names(count)

    def embed_source():
        x = encoder.embed(batch.sorted_source)
        return x.split(batch.source_sizes(), dim=1)

    source_tokens = batch.source_tokens
    embedding = step.add("source embedding", plan.encoder[0], [],
                         with_masks(pick(lambda m: m.source[order], plan.encoder_device(0)), embed_source),
                         Work("embedding", source_tokens, (encoder.embed_tokens.embedding_dim,)), chunks)
    below: LayerOutput = [[step.ref(embedding, chunk)] for chunk in chunks]
    final_states: List[Tuple[List[Ref], List[Ref]]] = []
    direction_uses: List[ReplicaUse] = []
    for layer, module in enumerate(encoder.layers):
        worker = plan.encoder[layer]
        if module.bidirectional:
            halves = []
            for reverse in (False, True):
                direction_worker = plan.reverse_worker(layer) if reverse else worker
                device = plan.devices[direction_worker]
                master = encoder.direction(layer, reverse)
                replicas = None
                if direction_worker != worker:
                    # the direction's weights live with the layer: a replica where the direction runs
                    replicas = step.replicas.direction(layer, reverse)

                def run_direction(*parts, layer=layer, reverse=reverse, width=len(below[0]), master=master,
                                  replicas=replicas, worker=direction_worker, device=device):
                    x = join([join(parts[c * width:(c + 1) * width]) for c in range(count)], chunked=True)
                    lstm = master if replicas is None else replicas.on(worker, device, step)
                    positions = batch.reversed_positions[device] if reverse else None
                    out, h, c = encoder.run_direction(lstm, reverse, x, sorted_lengths, positions,
                                                      batch.packed_layouts[device])
                    out = encoder.finish_layer(layer, out, x, reverse)
                    return (*out.split(batch.source_sizes(), dim=1), h, c)

                name = f"encoder layer {layer} {'reverse' if reverse else 'forward'}"
                work = Work("lstm", source_tokens, (module.input_size, module.hidden_size, batch.source_width))
                half = slice(module.hidden_size, None) if reverse else slice(0, module.hidden_size)
                mask = pick(lambda m, layer=layer, half=half: m.encoder[layer][order][..., half], device)
                halves.append(step.add(name, direction_worker, [ref for chunk in below for ref in chunk],
                                       with_masks(mask, run_direction), work, chunks + ["h", "c"]))
                if replicas is not None:
                    direction_uses.append(ReplicaUse(replicas, direction_worker, (halves[-1],), worker))
            below = [[step.ref(half, chunk) for half in halves] for chunk in chunks]
            final_states.append(([step.ref(half, "h") for half in halves], [step.ref(half, "c") for half in halves]))
        else:
            previous = None
            chunk_cells = []
            for c, chunk in enumerate(source_chunks):
                def run_chunk(*args, layer=layer, start=chunk.start, width=len(below[c]), first=(c == 0),
                              layout=batch.chunk_layouts[c][plan.encoder_device(layer)]):
                    x = join(args[:width])
                    state = None if first else (args[width], args[width + 1])
                    if layout is None:  # every row has ended: nothing to pack
                        return encoder.run_chunk(layer, x, sorted_lengths, start, state)
                    return encoder.run_chunk(layer, x, sorted_lengths, start, state, layout)

                state_refs = [] if previous is None else [step.ref(previous, "h"), step.ref(previous, "c")]
                run = work = None
                if step.builds(worker):  # another worker's cells are listed, not made
                    work = Work("lstm", batch.chunk_tokens[c], (module.input_size, module.hidden_size,
                                                                chunk.stop - chunk.start))
                    mask = pick(lambda m, layer=layer, chunk=chunk: m.encoder[layer][order][:, chunk],
                                plan.encoder_device(layer))
                    run = with_masks(mask, run_chunk)
                previous = step.add(f"encoder layer {layer} chunk {c}", worker, below[c] + state_refs, run, work,
                                    ("out", "h", "c"))
                chunk_cells.append(previous)
            below = [[step.ref(cell, "out")] for cell in chunk_cells]
            final_states.append(([step.ref(previous, "h")], [step.ref(previous, "c")]))
    return below, final_states, direction_uses


def _add_encoder_top(step: StepBuilder, batch: StagedBatch, below: LayerOutput) -> int:
    """One cell that joins the top encoder layer's chunks, puts the rows
    back in batch order and cuts them into the batch shards (its outputs
    ``shard k``)."""
    encoder = step.model.encoder.stack
    count = len(below)

    restore = batch.restore_on[step.plan.encoder_device(len(encoder.layers) - 1)]

    def encoder_top(*parts, width=len(below[0])):
        x = join([join(parts[c * width:(c + 1) * width]) for c in range(count)], chunked=True)
        x = x[restore]
        return tuple(x[rows] for rows in batch.shards)

    return step.add("encoder top states", step.plan.encoder[-1], [ref for chunk in below for ref in chunk],
                    encoder_top, Work("gather", batch.rows * batch.source_width, (encoder.output_size,)),
                    shard_names(len(batch.shards)))


def _add_decoder(step: StepBuilder, batch: StagedBatch, final_states) -> List[int]:
    """Target embedding and decoder layers; chunk 0 of layer ``l`` starts
    from encoder layer ``l``'s final state.  Returns the top layer's chunk
    cells, whose outputs ``shard k`` are the chunk's rows of each batch
    shard."""
    decoder, plan = step.model.decoder.stack, step.plan
    prev_output_tokens, target_chunks, shards = batch.prev_output_tokens, batch.target_chunks, batch.shards
    chunks = chunk_names(len(target_chunks))

    def embed_target():
        y = decoder.embed(prev_output_tokens)
        return y.split([chunk.stop - chunk.start for chunk in target_chunks], dim=1)

    rows_in_batch = prev_output_tokens.size(0)
    embedding = step.add("target embedding", plan.decoder[0], [],
                         with_masks(batch.pick(lambda m: m.target, plan.decoder_device(0)), embed_target),
                         Work("embedding", prev_output_tokens.numel(), (decoder.embed_tokens.embedding_dim,)), chunks)
    below = [step.ref(embedding, chunk) for chunk in chunks]
    top_layer = len(decoder.layers) - 1
    for layer in range(len(decoder.layers)):
        worker = plan.decoder[layer]
        mine, module = step.builds(worker), decoder.layers[layer]
        outputs = ["h", "c", *shard_names(len(shards))] if layer == top_layer else ["h", "c", "out"]
        previous = None
        chunk_cells = []
        for c in range(len(target_chunks)):
            if previous is not None:
                state_refs = [step.ref(previous, "h"), step.ref(previous, "c")]
            elif layer < len(final_states):
                state_refs = final_states[layer][0] + final_states[layer][1]
            else:
                state_refs = []

            def run_chunk(*args, layer=layer, first=(c == 0), restore=batch.restore_on[plan.decoder_device(layer)]):
                x, state = args[0], args[1:]
                if first and state:
                    half = len(state) // 2
                    h, c = join(state[:half])[restore], join(state[half:])[restore]
                    state = decoder.bridge(layer, h, c)
                elif not state:
                    zeros = x.new_zeros(x.size(0), decoder.hidden_size)
                    state = (zeros, zeros)
                out, h, c = decoder.run_layer(layer, x, state)
                if layer == top_layer:
                    return (h, c, *(out[rows] for rows in shards))
                return h, c, out

            run = work = None
            if mine:  # another worker's cells are listed, not made
                steps = target_chunks[c].stop - target_chunks[c].start
                work = Work("lstm", rows_in_batch * steps, (module.input_size, module.hidden_size, steps))
                mask = batch.pick(lambda m, layer=layer, chunk=target_chunks[c]: m.decoder[layer][:, chunk],
                                  plan.decoder_device(layer))
                run = with_masks(mask, run_chunk)
            previous = step.add(f"decoder layer {layer} chunk {c}", worker, [below[c]] + state_refs, run, work,
                                outputs)
            chunk_cells.append(previous)
        if layer != top_layer:
            below = [step.ref(cell, "out") for cell in chunk_cells]
    return chunk_cells


def _add_attention_softmax(step: StepBuilder, batch: StagedBatch, shard_loss, encoder_shards: int,
                           decoder_chunks: List[int], sinks: Dict[int, GradientSink]
                           ) -> Tuple[List[int], List[ReplicaUse], List[ReplicaUse]]:
    """One cell per (batch shard, group of time chunks): the shard's device
    starts on a group as soon as the top decoder layer has produced its
    last chunk (one chunk a group: as soon as it is made), with its own
    replica of the attention-softmax parameters (the master's own worker
    with the master), summing its output layer's gradient into its
    device's sink (``sinks``, by worker; the loss's cells are added into
    one total, :class:`GradientSink`).  Returns the cells, the replicas'
    uses and the master's own (its worker's cells on it)."""
    model, plan = step.model, step.plan
    encoder, decoder = model.encoder.stack, model.decoder.stack
    part = model.decoder.attention_softmax
    replicas = step.replicas.attention_softmax()
    master_worker = plan.decoder[0]
    outputs = []
    replica_cells: Dict[int, List[int]] = {}
    sizes = (decoder.hidden_size, encoder.output_size, *reversed(part.output_weight.shape), batch.source_width)
    for k, (rows, worker, shard) in enumerate(zip(batch.shards, batch.shard_workers, shard_names(len(batch.shards)))):
        device = plan.devices[worker]
        mine = step.builds(worker)  # another worker's cells are listed, not made
        for g, (group, span) in enumerate(zip(batch.softmax_groups, batch.softmax_spans)):
            def run_shard(*args, worker=worker, k=k, g=g, device=device):
                states, encoder_states = join(args[:-1], chunked=True), args[-1]  # the group's chunks joined
                # The replica is brought up to date on its own worker (on its stream); the model's part
                # computes its piece of the loss (fused where it can)
                replica = part if worker == master_worker else replicas.on(worker, device, step)
                return replica.loss_sums(states, encoder_states, batch.padding_masks[k], batch.targets[k][g],
                                         batch.kept[k][g], shard_loss, sinks[worker])

            inputs = [step.ref(decoder_chunks[c], shard) for c in group] + [step.ref(encoder_shards, shard)]
            chunks = f"chunk {group[0]}" if len(group) == 1 else f"chunks {group[0]}-{group[-1]}"
            run = work = None
            if mine:
                work = Work("attention_softmax", (rows.stop - rows.start) * (span.stop - span.start), sizes)
                run = with_masks(batch.pick(lambda m, rows=rows, span=span: m.features[rows, span], device),
                                 run_shard)
            outputs.append(step.add(f"attention-softmax {shard} {chunks}", worker, inputs, run, work))
            replica_cells.setdefault(worker, []).append(outputs[-1])
    master_cells = {master_worker: replica_cells.pop(master_worker)} if master_worker in replica_cells else {}
    return outputs, replica_uses(replicas, replica_cells, master_worker), replica_uses(replicas, master_cells,
                                                                                       master_worker)
