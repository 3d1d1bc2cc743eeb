"""The skeleton of a ``hybrid`` or ``model`` step: every cell's name,
worker, inputs, outputs, wavefront entry and kind (:mod:`.cell_kinds`),
the cells whose outputs are the loss sums, the replicas' uses and the
wiring (:mod:`..runtime.wiring`), without any code or tensor.

It depends only on the step's shape (the model's layers, the plan, and
per micro-batch its time chunks, shards and softmax groups), not on the
batch's values, so it is listed once per shape and kept: a worker then
makes the code of its own cells alone (:mod:`.hybrid_cells`), and no
worker lists the others' cells step after step.  The listing order fixes
the cells' dropout seeds.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..runtime.cell_graph import Cell
from ..runtime.wavefront import CellSpec, Ref
from ..runtime.wiring import Wiring
from .cell_kinds import (AttentionSoftmax, DecoderChunk, EncoderChunk, EncoderDirection, EncoderTop, SourceEmbedding,
                         TargetEmbedding)
from .device_plan import DevicePlan
from .step_builder import chunk_names, named_ref, shard_names

KEPT = 256  # skeletons kept (a run meets a handful of shapes; more than this, and the oldest go)

# A layer's output: for each time chunk, the refs of the parts that are
# concatenated along the feature dimension (the two directions of a
# bidirectional layer, or one part).
LayerOutput = List[List[Ref]]


class BatchShape(NamedTuple):
    """What a micro-batch's cells depend on: its place in the step, its
    source and target chunk counts, its shards' workers and the target
    chunks of each softmax group."""

    index: int
    source_chunks: int
    target_chunks: int
    shard_workers: Tuple[int, ...]
    softmax_groups: Tuple[Tuple[int, ...], ...]


class Entry(NamedTuple):
    """One cell of the skeleton; ``batch``: its micro-batch's index (whose
    name prefixes the cell's)."""

    name: str
    worker: int
    inputs: Tuple[Ref, ...]
    outputs: Optional[Tuple[str, ...]]
    not_before: int
    kind: object
    batch: int


class UseShape(NamedTuple):
    """A replica's use by one worker's cells (:class:`.step_builder.ReplicaUse`),
    the replica named by ``key``: ``("attention_softmax",)`` or
    ``("direction", layer, reverse)``."""

    key: tuple
    worker: int
    cells: Tuple[int, ...]
    home: int


class Skeleton(NamedTuple):
    entries: Tuple[Entry, ...]
    results: Tuple[int, ...]
    replica_uses: Tuple[UseShape, ...]
    master_uses: Tuple[UseShape, ...]
    wiring: Wiring
    by_worker: Tuple[Tuple[int, ...], ...]  # each worker's cells, in listing order
    bare: Tuple[Cell, ...]  # every cell without its code (named as in a step of one micro-batch)


class _Listing:
    """Collects the entries of one skeleton."""

    def __init__(self):
        self.entries: List[Entry] = []
        self.batch, self.not_before = 0, 0

    def add(self, name: str, worker: int, inputs: Sequence[Ref], kind, outputs: Optional[Sequence[str]] = None) -> int:
        self.entries.append(Entry(name, worker, tuple(inputs), tuple(outputs) if outputs else None, self.not_before,
                                  kind, self.batch))
        return len(self.entries) - 1

    def ref(self, cell: int, output: str) -> Ref:
        return named_ref(cell, self.entries[cell].name, self.entries[cell].outputs, output)


_kept: Dict[tuple, Skeleton] = {}


def skeleton_of(model, plan: DevicePlan, shapes: Sequence[BatchShape]) -> Skeleton:
    """The skeleton of a step of ``model`` under ``plan`` whose micro-batches
    have ``shapes``: listed the first time, kept after."""
    encoder = model.encoder.stack
    bidirectional = tuple(bool(module.bidirectional) for module in encoder.layers)
    reverse = tuple(plan.reverse_worker(layer) if flag else -1 for layer, flag in enumerate(bidirectional))
    decoder_layers = len(model.decoder.stack.layers)
    key = (plan.size, tuple(plan.encoder), tuple(plan.decoder), reverse, bidirectional, decoder_layers, tuple(shapes))
    skeleton = _kept.get(key)
    if skeleton is None:
        if len(_kept) >= KEPT:
            _kept.pop(next(iter(_kept)))
        skeleton = _kept[key] = _list(plan, bidirectional, reverse, decoder_layers, shapes)
    return skeleton


def _list(plan: DevicePlan, bidirectional: Tuple[bool, ...], reverse: Tuple[int, ...], decoder_layers: int,
          shapes: Sequence[BatchShape]) -> Skeleton:
    """The cells in the order that fixes their dropout seeds: for each
    micro-batch, encoder, its top states, decoder, shards.  Each
    micro-batch is its own chain of cells, so that one device's layer works
    on a micro-batch while the next device works on the one before and the
    attention-softmax part on an earlier one still."""
    listing = _Listing()
    results: List[int] = []
    uses: Dict[Tuple[tuple, int], List[int]] = {}  # by (replica, worker), in the order first used
    homes: Dict[tuple, int] = {}
    master_cells: List[int] = []
    # A micro-batch enters the wavefront a K-th of its source chunks after
    # the one before it (the simulator's best for the paper's setting lay
    # between a 4th and a 3rd of them, whatever the chunk length).
    stagger = max(1, round(shapes[0].source_chunks / plan.size))
    master = plan.decoder[0]
    for shape in shapes:
        listing.batch, listing.not_before = shape.index, shape.index * stagger
        below, final_states, direction_uses = _list_encoder(listing, plan, bidirectional, reverse, shape)
        top = listing.add("encoder top states", plan.encoder[-1], [ref for chunk in below for ref in chunk],
                          EncoderTop(len(below[0]), len(below)), shard_names(len(shape.shard_workers)))
        decoder_chunks = _list_decoder(listing, plan, decoder_layers, final_states, shape)
        softmax = _list_attention_softmax(listing, top, decoder_chunks, shape)
        results += [cell for _, cell in softmax]
        for worker, cell in softmax:
            if worker == master:
                master_cells.append(cell)
            else:
                uses.setdefault((("attention_softmax",), worker), []).append(cell)
                homes[("attention_softmax",)] = master
        for key, worker, cell, home in direction_uses:
            uses.setdefault((key, worker), []).append(cell)
            homes[key] = home
    replica_uses = sorted((UseShape(key, worker, tuple(cells), homes[key]) for (key, worker), cells in uses.items()),
                          key=lambda use: min(use.cells))
    master_uses = (UseShape(("attention_softmax",), master, tuple(master_cells), master),) if master_cells else ()
    entries = tuple(listing.entries)
    wiring = Wiring([CellSpec(entry.worker, entry.inputs, entry.not_before) for entry in entries], plan.size)
    by_worker = tuple(tuple(index for index, entry in enumerate(entries) if entry.worker == worker)
                      for worker in range(plan.size))
    bare = tuple(Cell(entry.name, entry.worker, entry.inputs, None, None, entry.outputs, entry.not_before)
                 for entry in entries)
    return Skeleton(entries, tuple(results), tuple(replica_uses), master_uses, wiring, by_worker, bare)


def _list_encoder(listing: _Listing, plan: DevicePlan, bidirectional: Tuple[bool, ...], reverse: Tuple[int, ...],
                  shape: BatchShape):
    """Source embedding (with encoder layer 0) and encoder layers: the top
    layer's output, every layer's final ``(h, c)`` refs, and the uses of
    replicas of reverse directions that run away from their layer, as
    ``(replica key, worker, cell, home)``."""
    chunks = chunk_names(shape.source_chunks)
    embedding = listing.add("source embedding", plan.encoder[0], [], SourceEmbedding(), chunks)
    below: LayerOutput = [[listing.ref(embedding, chunk)] for chunk in chunks]
    final_states: List[Tuple[List[Ref], List[Ref]]] = []
    direction_uses = []
    for layer, both in enumerate(bidirectional):
        worker = plan.encoder[layer]
        if both:
            halves = []
            for backwards in (False, True):
                direction_worker = reverse[layer] if backwards else worker
                name = f"encoder layer {layer} {'reverse' if backwards else 'forward'}"
                kind = EncoderDirection(layer, backwards, direction_worker, len(below[0]), len(below))
                halves.append(listing.add(name, direction_worker, [ref for chunk in below for ref in chunk], kind,
                                          chunks + ["h", "c"]))
                if direction_worker != worker:  # the direction's weights live with the layer: a replica runs it
                    direction_uses.append((("direction", layer, backwards), direction_worker, halves[-1], worker))
            below = [[listing.ref(half, chunk) for half in halves] for chunk in chunks]
            final_states.append(([listing.ref(half, "h") for half in halves],
                                 [listing.ref(half, "c") for half in halves]))
        else:
            previous = None
            chunk_cells = []
            for c in range(shape.source_chunks):
                state_refs = [] if previous is None else [listing.ref(previous, "h"), listing.ref(previous, "c")]
                previous = listing.add(f"encoder layer {layer} chunk {c}", worker, below[c] + state_refs,
                                       EncoderChunk(layer, c, len(below[c])), ("out", "h", "c"))
                chunk_cells.append(previous)
            below = [[listing.ref(cell, "out")] for cell in chunk_cells]
            final_states.append(([listing.ref(previous, "h")], [listing.ref(previous, "c")]))
    return below, final_states, direction_uses


def _list_decoder(listing: _Listing, plan: DevicePlan, layers: int, final_states, shape: BatchShape) -> List[int]:
    """Target embedding (with decoder layer 0) and decoder layers; chunk 0
    of layer ``l`` starts from encoder layer ``l``'s final state.  Returns
    the top layer's chunk cells, whose outputs ``shard k`` are the chunk's
    rows of each batch shard."""
    chunks = chunk_names(shape.target_chunks)
    embedding = listing.add("target embedding", plan.decoder[0], [], TargetEmbedding(), chunks)
    below = [listing.ref(embedding, chunk) for chunk in chunks]
    top_layer = layers - 1
    chunk_cells: List[int] = []
    for layer in range(layers):
        outputs = ["h", "c", *shard_names(len(shape.shard_workers))] if layer == top_layer else ["h", "c", "out"]
        previous = None
        chunk_cells = []
        for c in range(shape.target_chunks):
            if previous is not None:
                state_refs = [listing.ref(previous, "h"), listing.ref(previous, "c")]
            elif layer < len(final_states):
                state_refs = final_states[layer][0] + final_states[layer][1]
            else:
                state_refs = []
            previous = listing.add(f"decoder layer {layer} chunk {c}", plan.decoder[layer], [below[c]] + state_refs,
                                   DecoderChunk(layer, c, layer == top_layer), outputs)
            chunk_cells.append(previous)
        if layer != top_layer:
            below = [listing.ref(cell, "out") for cell in chunk_cells]
    return chunk_cells


def _list_attention_softmax(listing: _Listing, encoder_top: int, decoder_chunks: List[int],
                            shape: BatchShape) -> List[Tuple[int, int]]:
    """One cell per (batch shard, group of time chunks): the shard's device
    starts on a group as soon as the top decoder layer has produced its
    last chunk (one chunk a group: as soon as it is made).  Returns
    ``(worker, cell)`` of each."""
    cells = []
    for k, (worker, shard) in enumerate(zip(shape.shard_workers, shard_names(len(shape.shard_workers)))):
        for g, group in enumerate(shape.softmax_groups):
            inputs = [listing.ref(decoder_chunks[c], shard) for c in group] + [listing.ref(encoder_top, shard)]
            chunks = f"chunk {group[0]}" if len(group) == 1 else f"chunks {group[0]}-{group[-1]}"
            cells.append((worker, listing.add(f"attention-softmax {shard} {chunks}", worker, inputs,
                                              AttentionSoftmax(k, g, worker))))
    return cells
