"""One training step of a ``hybrid_lstm`` model cut into cells for a
hybrid group (see docs/design.md for the schedule drawn out).

The cells, each on the device of the plan that owns its parameters:

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

``data`` mode is one whole-model cell per device, each on its batch shard.
Every cell computes what the single-device model computes for its piece,
so the step's loss and gradients equal the single-device ones.

Every cell names its outputs (``"h"``, ``"c"``, ``"chunk 2"``,
``"shard 1"``) and its readers refer to them by name (``StepBuilder.ref``).

Everything a cell reads from the batch (token ids, length order, reversal
indices, padding masks, target positions that count, dropout masks) is put
on that cell's device by the calling thread before the step's jobs start
(:class:`_Batch`), through the engine's one transfer function: a cell never
copies from the host nor waits for the host, which on GPUs would stall
every worker.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..kernels.fused_output_loss import GradientSink, KeptTargets, kept_targets
from ..kernels.sorted_packing import PackedLayout, chunk_lengths, sorted_layout
from .batch_rows import batch_slices, step_rows
from .cell_graph import Cell, DeviceUsage, Work, run_cells
from .device_plan import DevicePlan
from .host_batch import host_of, on_host
from .replicas import ModelReplicas, Replicas
from .micro_batches import micro_batches_of
from .shard_sums import sum_on
from .single_device_masks import SingleDeviceMasks, draw_single_device_masks, with_masks
from .transfer import arrive, to_devices
from .wavefront import Ref
from .worker import DEFAULT_TIMEOUT, worker_group

# A layer's output: for each time chunk, the refs of the parts that are
# concatenated along the feature dimension (the two directions of a
# bidirectional layer, or one part).
LayerOutput = List[List[Ref]]


def time_chunks(length: int, chunk_length: int, count: int) -> List[slice]:
    """The time chunks of a sequence: ``chunk_length`` steps each, or
    ``count`` near-equal chunks when ``chunk_length`` is 0."""
    if chunk_length > 0:
        return [slice(start, min(start + chunk_length, length)) for start in range(0, max(length, 1), chunk_length)]
    return batch_slices(max(length, 1), count)


def softmax_groups(chunks: int, per_cell: int) -> List[range]:
    """The target chunks of each attention-softmax cell: ``per_cell``
    consecutive ones (``--hybrid-softmax-chunks``; 0: all in one)."""
    per_cell = chunks if per_cell <= 0 else min(per_cell, chunks)
    return [range(first, min(first + per_cell, chunks)) for first in range(0, chunks, max(per_cell, 1))]


def chunk_names(count: int) -> List[str]:
    return [f"chunk {c}" for c in range(count)]


def shard_names(count: int) -> List[str]:
    return [f"shard {k}" for k in range(count)]


class StepBuilder:
    """Collects the cells of one step; ``add`` returns the new cell's index
    and ``ref`` names one of its outputs for the cells that read it."""

    def __init__(self, model, plan: DevicePlan, replicas: ModelReplicas):
        self.model = model
        self.plan = plan
        self.replicas = replicas
        self.devices = plan.devices
        self.cells: List[Cell] = []
        self.prefix = ""  # names the micro-batch of the cells being added
        self.not_before = 0  # and the clock it enters the wavefront

    def add(self, name: str, worker: int, inputs: Sequence[Ref], run: Callable[..., Sequence[Tensor]],
            work: Optional[Work] = None, outputs: Optional[Sequence[str]] = None) -> int:
        self.cells.append(Cell(self.prefix + name, worker, list(inputs), run, work, tuple(outputs) if outputs else None,
                               self.not_before))
        return len(self.cells) - 1

    def ref(self, cell: int, output: str) -> Ref:
        names = self.cells[cell].outputs
        if not names or output not in names:
            raise KeyError(f"cell {self.cells[cell].name!r} has no output {output!r} (it has {names})")
        return cell, names.index(output)


def _kept_on(target: Tensor, pad: int, device: torch.device) -> KeptTargets:
    """The positions of host ``target`` that count, found on the host and
    put on ``device``."""
    return KeptTargets(*(arrive(t, device) for t in kept_targets(target, pad)))


def _join(parts: Sequence[Tensor], chunked: bool = False) -> Tensor:
    return torch.cat(list(parts), dim=1 if chunked else -1) if len(parts) > 1 else parts[0]


class ReplicaUse(NamedTuple):
    """The cells of one worker that run on its replica of a part; ``home``:
    the worker whose device holds the part's master (where its parameters
    come from and its gradients go)."""

    replicas: Replicas
    worker: int
    cells: Tuple[int, ...]
    home: int


class BuiltStep(NamedTuple):
    step: StepBuilder
    results: List[int]  # the cells whose outputs are the shards' loss sums
    # every replica the step uses, in the order of their first cells: of
    # the attention-softmax part on the shard workers other than its
    # master's, of reverse directions of bidirectional layers on the
    # device the placement gives them, of the whole model (data mode) on
    # workers other than the first
    replica_uses: Tuple[ReplicaUse, ...] = ()


def _uses(replicas: Replicas, cells: Dict[int, List[int]], home: int) -> List[ReplicaUse]:
    return [ReplicaUse(replicas, worker, tuple(indices), home) for worker, indices in sorted(cells.items())]


def _packed_layouts(lengths: Tensor, width: int, rows: int, devices) -> Dict[torch.device, Optional[PackedLayout]]:
    """The packed layout of the running rows of host ``lengths`` (sorted
    longest first) among ``rows`` on each of ``devices``; None on each
    where no row runs."""
    if not len(lengths):
        return {device: None for device in devices}
    positions, batch_sizes = sorted_layout(lengths, width)
    full = len(lengths) == rows and int(lengths[-1]) == width
    return {device: PackedLayout(on_device, batch_sizes, len(lengths), full)
            for device, on_device in to_devices(positions, devices).items()}


class _Batch:
    """What every cell builder of one hybrid step needs to know about the
    batch (the length order of the encoder rows, the time chunks, the
    attention-softmax part's shards as :func:`.batch_rows.step_rows` dealt
    them, the dropout masks to take), and the batch's tensors on the
    devices of the cells that read them.  Everything is made from the
    host's batch (:mod:`.host_batch`) and copied from pinned memory where
    the devices queue copies (:mod:`.transfer`): staging never waits for a
    device."""

    def __init__(self, model, plan: DevicePlan, net_input: Dict[str, Tensor], target: Tensor, chunk_length: int,
                 masks: Optional[SingleDeviceMasks], shards: Sequence[Tuple[int, slice]], softmax_chunks: int = 1):
        encoder = model.encoder.stack
        devices = plan.devices
        src_tokens = encoder.right_padded(net_input["src_tokens"])  # host tensors, all of them
        src_lengths = net_input["src_lengths"]
        self.order = torch.sort(src_lengths, descending=True, stable=True).indices
        self.restore = torch.argsort(self.order)
        self.sorted_lengths = src_lengths[self.order]
        self.source_width = src_tokens.size(1)
        self.source_tokens = int(self.sorted_lengths.sum())
        self.rows = src_tokens.size(0)
        self.source_chunks = time_chunks(self.source_width, chunk_length, plan.size)
        self.target_chunks = time_chunks(net_input["prev_output_tokens"].size(1), chunk_length, plan.size)
        # the target chunks each attention-softmax cell takes, and the time steps they span
        self.softmax_groups = softmax_groups(len(self.target_chunks), softmax_chunks)
        self.softmax_spans = [slice(self.target_chunks[group[0]].start, self.target_chunks[group[-1]].stop)
                              for group in self.softmax_groups]
        self.shards = [rows for _, rows in shards]
        self.shard_workers = [worker for worker, _ in shards]
        self.shard_devices = [devices[worker] for worker in self.shard_workers]
        self.masks = masks

        # The batch on the devices of the cells that read it.
        self.sorted_source = arrive(src_tokens.index_select(0, self.order), plan.encoder_device(0))
        self.prev_output_tokens = arrive(net_input["prev_output_tokens"], plan.decoder_device(0))
        self.restore_on = to_devices(self.restore, devices)
        self.reversed_positions = to_devices(encoder.reversed_positions(self.sorted_lengths, self.source_width),
                                             devices)
        # The packed layout of the encoder's rows, whole (the directions of a
        # bidirectional layer) and per time chunk (the rows still running),
        # sent with the batch: one gather per cell instead of a copy per step.
        self.packed_layouts = _packed_layouts(self.sorted_lengths, self.source_width, self.rows, devices)
        self.chunk_layouts = [_packed_layouts(chunk_lengths(self.sorted_lengths, chunk.start, chunk.stop - chunk.start),
                                             chunk.stop - chunk.start, self.rows, devices)
                              for chunk in self.source_chunks]
        padding_mask = src_tokens.eq(encoder.padding_idx)
        pad = model.decoder.dictionary.pad()
        self.padding_masks, self.targets, self.kept = [], [], []
        for rows, device in zip(self.shards, self.shard_devices):
            self.padding_masks.append(arrive(padding_mask[rows], device))
            pieces = [target[rows, span] for span in self.softmax_spans]
            self.targets.append([arrive(piece, device) for piece in pieces])
            self.kept.append([_kept_on(piece, pad, device) for piece in pieces])

    def pick(self, select, device: torch.device) -> Optional[List[Tensor]]:
        """The mask a cell's one dropout call takes, on the cell's device, or
        None (draw its own)."""
        return None if self.masks is None else [arrive(select(self.masks), device)]

    def source_sizes(self) -> List[int]:
        return [chunk.stop - chunk.start for chunk in self.source_chunks]


def build_hybrid_step(model, plan: DevicePlan, net_input: Dict[str, Tensor], target: Tensor, shard_loss,
                      chunk_length: int = 0, replicas: Optional[ModelReplicas] = None,
                      single_device_masks: bool = False, micro_batches: int = 1,
                      masks: Optional[SingleDeviceMasks] = None, softmax_chunks: int = 1) -> BuiltStep:
    """The cells of one ``hybrid`` or ``model`` step, in the order that
    fixes their dropout seeds: for each micro-batch, encoder, its top
    states, decoder, shards.  ``replicas``: the group's replica caches
    (fresh ones when not given, as for the schedule simulator, which never
    runs the cells).  ``micro_batches``: how many (:mod:`.micro_batches`),
    each its own chain of cells, so that one device's layer works on a
    micro-batch while the next device works on the one before and the
    attention-softmax part on an earlier one still.  ``masks``: the
    single-device masks drawn already (by the trainer, for stages in
    processes of their own).  ``softmax_chunks``: the target chunks one
    attention-softmax cell takes (1: a cell per chunk, which starts as
    soon as the top decoder layer made it; 0: all of them, a cell per
    shard and micro-batch; fewer cells, less host time, less overlap)."""
    step = StepBuilder(model, plan, replicas or ModelReplicas(model))
    net_input, target = on_host(net_input), host_of(target)
    if single_device_masks and masks is None:  # the whole batch's, as the single-device model draws them
        masks = draw_single_device_masks(model, net_input["src_tokens"].size(1),
                                         net_input["prev_output_tokens"].size(1), target.size(0))
    outputs: List[int] = []
    uses: List[ReplicaUse] = []
    # A micro-batch enters the wavefront a K-th of its source chunks after
    # the one before it (the simulator's best for the paper's setting lay
    # between a 4th and a 3rd of them, whatever the chunk length).
    stagger = max(1, round(len(time_chunks(net_input["src_tokens"].size(1), chunk_length, plan.size)) / plan.size))
    # each device's attention-softmax cells, of every micro-batch and time chunk, sum their output layer's
    # gradient into one matrix instead of keeping one each from forward to backward
    sinks = {worker: GradientSink() for worker in range(plan.size)}
    pieces = step_rows(plan, net_input, target, micro_batches, model.decoder.dictionary.pad())
    for part in micro_batches_of(net_input, target, masks, pieces):
        step.prefix, step.not_before = part.name, part.index * stagger
        batch = _Batch(model, plan, part.net_input, part.target, chunk_length, part.masks, part.shards,
                       softmax_chunks)
        encoder_output, final_states, direction_uses = _add_encoder(step, batch)
        encoder_shards = _add_encoder_top(step, batch, encoder_output)
        decoder_chunks = _add_decoder(step, batch, final_states)
        shard_outputs, attention_uses = _add_attention_softmax(step, batch, shard_loss, encoder_shards,
                                                               decoder_chunks, sinks)
        outputs += shard_outputs
        uses += attention_uses + direction_uses
    step.prefix, step.not_before = "", 0
    # one use per replica and worker, over every micro-batch's cells, in the
    # order the replicas are first needed: their parameter copies queue one
    # behind the other on their master's device
    return BuiltStep(step, outputs, tuple(sorted(_merged(uses), key=lambda use: min(use.cells))))


def _merged(uses: Sequence[ReplicaUse]) -> List[ReplicaUse]:
    """The uses of one replica by one worker joined into one (its cells of
    every micro-batch): one parameter copy, one gradient send after the
    last of them."""
    merged: Dict[Tuple[int, int], ReplicaUse] = {}
    for use in uses:
        key = (id(use.replicas), use.worker)
        if key in merged:
            merged[key] = merged[key]._replace(cells=merged[key].cells + use.cells)
        else:
            merged[key] = use
    return list(merged.values())


def _add_encoder(step: StepBuilder, batch: _Batch):
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
                    x = _join([_join(parts[c * width:(c + 1) * width]) for c in range(count)], chunked=True)
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
                    x = _join(args[:width])
                    state = None if first else (args[width], args[width + 1])
                    if layout is None:  # every row has ended: nothing to pack
                        return encoder.run_chunk(layer, x, sorted_lengths, start, state)
                    return encoder.run_chunk(layer, x, sorted_lengths, start, state, layout)

                state_refs = [] if previous is None else [step.ref(previous, "h"), step.ref(previous, "c")]
                tokens = int((sorted_lengths - chunk.start).clamp(min=0, max=chunk.stop - chunk.start).sum())
                work = Work("lstm", tokens, (module.input_size, module.hidden_size, chunk.stop - chunk.start))
                mask = pick(lambda m, layer=layer, chunk=chunk: m.encoder[layer][order][:, chunk],
                            plan.encoder_device(layer))
                previous = step.add(f"encoder layer {layer} chunk {c}", worker, below[c] + state_refs,
                                    with_masks(mask, run_chunk), work, ("out", "h", "c"))
                chunk_cells.append(previous)
            below = [[step.ref(cell, "out")] for cell in chunk_cells]
            final_states.append(([step.ref(previous, "h")], [step.ref(previous, "c")]))
    return below, final_states, direction_uses


def _add_encoder_top(step: StepBuilder, batch: _Batch, below: LayerOutput) -> int:
    """One cell that joins the top encoder layer's chunks, puts the rows
    back in batch order and cuts them into the batch shards (its outputs
    ``shard k``)."""
    encoder = step.model.encoder.stack
    count = len(below)

    restore = batch.restore_on[step.plan.encoder_device(len(encoder.layers) - 1)]

    def encoder_top(*parts, width=len(below[0])):
        x = _join([_join(parts[c * width:(c + 1) * width]) for c in range(count)], chunked=True)
        x = x[restore]
        return tuple(x[rows] for rows in batch.shards)

    return step.add("encoder top states", step.plan.encoder[-1], [ref for chunk in below for ref in chunk],
                    encoder_top, Work("gather", batch.rows * batch.source_width, (encoder.output_size,)),
                    shard_names(len(batch.shards)))


def _add_decoder(step: StepBuilder, batch: _Batch, final_states) -> List[int]:
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
                    h, c = _join(state[:half])[restore], _join(state[half:])[restore]
                    state = decoder.bridge(layer, h, c)
                elif not state:
                    zeros = x.new_zeros(x.size(0), decoder.hidden_size)
                    state = (zeros, zeros)
                out, h, c = decoder.run_layer(layer, x, state)
                if layer == top_layer:
                    return (h, c, *(out[rows] for rows in shards))
                return h, c, out

            module = decoder.layers[layer]
            steps = target_chunks[c].stop - target_chunks[c].start
            work = Work("lstm", rows_in_batch * steps, (module.input_size, module.hidden_size, steps))
            mask = batch.pick(lambda m, layer=layer, chunk=target_chunks[c]: m.decoder[layer][:, chunk],
                              plan.decoder_device(layer))
            previous = step.add(f"decoder layer {layer} chunk {c}", worker, [below[c]] + state_refs,
                                with_masks(mask, run_chunk), work, outputs)
            chunk_cells.append(previous)
        if layer != top_layer:
            below = [step.ref(cell, "out") for cell in chunk_cells]
    return chunk_cells


def _add_attention_softmax(step: StepBuilder, batch: _Batch, shard_loss, encoder_shards: int,
                           decoder_chunks: List[int], sinks: Dict[int, GradientSink]
                           ) -> Tuple[List[int], List[ReplicaUse]]:
    """One cell per (batch shard, group of time chunks): the shard's device
    starts on a group as soon as the top decoder layer has produced its
    last chunk (one chunk a group: as soon as it is made), with its own
    replica of the attention-softmax parameters (the master's own worker
    with the master), summing its output layer's gradient into its
    device's sink (``sinks``, by worker; the loss's cells are added into
    one total, :class:`GradientSink`)."""
    model, plan = step.model, step.plan
    encoder, decoder = model.encoder.stack, model.decoder.stack
    part = model.decoder.attention_softmax
    replicas = step.replicas.attention_softmax()
    master_worker = plan.decoder[0]
    outputs = []
    replica_cells: Dict[int, List[int]] = {}
    for k, (rows, worker, shard) in enumerate(zip(batch.shards, batch.shard_workers, shard_names(len(batch.shards)))):
        device = plan.devices[worker]
        for g, (group, span) in enumerate(zip(batch.softmax_groups, batch.softmax_spans)):
            def run_shard(*args, worker=worker, k=k, g=g, device=device):
                states, encoder_states = _join(args[:-1], chunked=True), args[-1]  # the group's chunks joined
                # The replica is brought up to date on its own worker (on its stream); the model's part
                # computes its piece of the loss (fused where it can)
                replica = part if worker == master_worker else replicas.on(worker, device, step)
                return replica.loss_sums(states, encoder_states, batch.padding_masks[k], batch.targets[k][g],
                                         batch.kept[k][g], shard_loss, sinks[worker])

            inputs = [step.ref(decoder_chunks[c], shard) for c in group] + [step.ref(encoder_shards, shard)]
            work = Work("attention_softmax", (rows.stop - rows.start) * (span.stop - span.start),
                        (decoder.hidden_size, encoder.output_size, part.output_weight.size(1),
                         part.output_weight.size(0), batch.source_width))
            mask = batch.pick(lambda m, rows=rows, span=span: m.features[rows, span], device)
            chunks = f"chunk {group[0]}" if len(group) == 1 else f"chunks {group[0]}-{group[-1]}"
            outputs.append(step.add(f"attention-softmax {shard} {chunks}", worker, inputs,
                                    with_masks(mask, run_shard), work))
            if worker != master_worker:
                replica_cells.setdefault(worker, []).append(outputs[-1])
    return outputs, _uses(replicas, replica_cells, master_worker)


def build_data_parallel_step(model, plan: DevicePlan, net_input: Dict[str, Tensor], target: Tensor,
                             shard_loss, replicas: Optional[ModelReplicas] = None,
                             single_device_masks: bool = False,
                             masks: Optional[SingleDeviceMasks] = None) -> BuiltStep:
    """Pure data parallelism inside one process: a whole-model replica per
    device, each on a contiguous batch shard (``masks``: as
    :func:`build_hybrid_step`'s)."""
    step = StepBuilder(model, plan, replicas or ModelReplicas(model))
    net_input, target = on_host(net_input), host_of(target)
    shards = batch_slices(target.size(0), plan.size)
    whole_models = step.replicas.whole_model()
    if single_device_masks and masks is None:
        masks = draw_single_device_masks(model, net_input["src_tokens"].size(1),
                                         net_input["prev_output_tokens"].size(1), target.size(0))
    pad = model.decoder.dictionary.pad()
    outputs = []
    for worker, rows in enumerate(shards):
        device = plan.devices[worker]
        # The shard on its device, before the jobs start.
        # (source lengths stay on the host, where packing reads them)
        shard_input = {key: value[rows] if key == "src_lengths" else arrive(value[rows], device)
                       for key, value in net_input.items()}
        shard_target = arrive(target[rows], device)
        kept = _kept_on(target[rows], pad, device)

        def run_shard(worker=worker, device=device, shard_input=shard_input, shard_target=shard_target, kept=kept):
            replica = model if worker == 0 else whole_models.on(worker, device, step)
            rnn_out = replica.forward_rnn(**shard_input)
            part = replica.decoder.attention_softmax
            features, _ = part.features(*rnn_out)
            return shard_loss(features, part.output_weight, part.output_bias, shard_target, kept)

        work = Work("whole_model", rows.stop - rows.start, (rows.start, rows.stop))
        shard_masks = None if masks is None else [arrive(mask, device) for mask in masks.in_order(rows)]
        outputs.append(step.add(f"whole-model shard {worker}", worker, [], with_masks(shard_masks, run_shard), work))
    return BuiltStep(step, outputs, tuple(_uses(whole_models, {worker: [outputs[worker]]
                                                               for worker in range(1, len(shards))}, 0)))


def build_step(model, plan: DevicePlan, net_input: Dict[str, Tensor], target: Tensor, shard_loss,
               chunk_length: int, micro_batches: int, replicas: ModelReplicas,
               single_device_masks: bool = False, masks: Optional[SingleDeviceMasks] = None,
               softmax_chunks: int = 1) -> BuiltStep:
    """The step's cells in the plan's mode (threads and stages build them
    alike)."""
    if plan.mode == "data":
        return build_data_parallel_step(model, plan, net_input, target, shard_loss, replicas, single_device_masks,
                                        masks)
    return build_hybrid_step(model, plan, net_input, target, shard_loss, chunk_length, replicas,
                             single_device_masks, micro_batches, masks, softmax_chunks)


def run_step(built: BuiltStep, timeout: float = DEFAULT_TIMEOUT,
             report_usage: Optional[Callable[[DeviceUsage], None]] = None) -> Tuple[Tensor, ...]:
    """Run the cells; return the shards' results added on the first shard's
    device.  The replicas' parameter copies are queued before the jobs
    start and each worker sends its replica's gradients as soon as its
    last cell on that replica has run backward (:mod:`.replicas`); after
    the backward pass they are added into the master parameters, and
    ``report_usage`` gets how busy each device was."""
    step = built.step
    for use in built.replica_uses:
        use.replicas.prefetch(use.worker, step.devices[use.worker], step)
    sends = [(use.cells, partial(use.replicas.send, use.worker, step.devices[use.worker]))
             for use in built.replica_uses]

    def reduce():
        masters = {id(use.replicas): use.replicas for use in built.replica_uses}
        for key, replicas in masters.items():  # each master's replicas in worker order
            replicas.reduce([use.worker for use in built.replica_uses if id(use.replicas) == key])

    results = run_cells(step.cells, worker_group(step.devices), built.results, after_backward=reduce,
                        timeout=timeout, report_usage=report_usage, after_last_backward=sends)
    return sum_on(results, results[0][0].device)
