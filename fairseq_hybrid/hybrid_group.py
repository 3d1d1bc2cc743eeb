"""The hybrid scheme around one ``hybrid_lstm`` model, in the spirit of
torchgpipe's ``GPipe(module, balance)``: the model computes, the group
decides where and how.

A :class:`HybridGroup` is made by the model's ``build_model`` when
``--hybrid-devices`` is given.  It owns the plan (which device runs which
layer, checked once from the options), puts the layers on their devices,
keeps the replicas of the parts that run away from their home device, and
runs each training step as cells on its workers
(:mod:`.parallel`), asking the planner (:mod:`.planning`) where
the options say ``auto``, logging how busy each device was as fairseq
metrics.  It is not a module: the model's parameter names,
and so its checkpoints, are the same with and without a group.
"""


import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, Union

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.logging import metrics
from torch import Tensor

from .parallel import (AUTO, DEFAULT_TIMEOUT, MODES, DevicePlan, DevicePlanError, DeviceUsage, ModelReplicas,
                       StageProcesses, StepShape, WorkerThreads, build_plan, build_step, check_options,
                       chunk_length_option, lay_out_step, micro_batches_option, plan_table,
                       softmax_chunks_option, step_scope)
from .planning import ChunkLengthChooser, CostModel, auto_placement, priced_workers

logger = logging.getLogger(__name__)

WORKER_KINDS = ("auto", "threads", "processes")
AUTO_WORKERS_RULE = ("at the first batch, the kind whose step --hybrid-cost-model's file prices shorter, each as "
                     "built (a file that fairseq-hybrid-plan calibrate writes prices both); threads without one "
                     "(docs/processes.md)")


def worker_kind(option: str, devices) -> str:
    """The kind ``--hybrid-workers`` asks for on these devices."""
    if option not in WORKER_KINDS:
        raise DevicePlanError(f"--hybrid-workers {option!r}: choose one of {', '.join(WORKER_KINDS)}")
    if option == "processes":
        if len({device.type for device in devices}) != 1:
            raise DevicePlanError("--hybrid-workers processes runs on cpu devices or cuda:N devices, "
                                  f"not on {', '.join(str(device) for device in devices)}")
    return "threads" if option == "auto" else option


@dataclass
class HybridGroupConfig(FairseqDataclass):
    """The ``--hybrid-*`` options, which every ``hybrid_lstm`` model takes
    (its config inherits them); :meth:`HybridGroup.from_options` reads
    them."""

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
            "help": "for --hybrid-placement auto and --hybrid-chunk-length auto: cell costs measured on your "
            "devices, a cost file that fairseq-hybrid-plan calibrate writes (or a cost model saved alone); "
            "empty: every floating-point operation costs the same (plus, for the chunk length, the host time "
            "per cell measured on CPU)"
        },
    )
    hybrid_chunk_length: str = field(
        default="0",
        metadata={
            "help": "time steps per wavefront cell of the LSTM stacks; 0: split each sequence into as many "
            "chunks as there are devices; auto: for each batch shape, the length whose simulated step is "
            "shortest (under --hybrid-cost-model, or counting floating-point operations and the host time "
            "per cell measured on CPU)"
        },
    )
    hybrid_micro_batches: str = field(
        default="1",
        metadata={
            "help": "micro-batches per batch (hybrid and model mode): the batch's sentences cut into this many "
            "slices of near-equal tokens that follow one another through the devices, so that a device's "
            "layer works on one while the next device works on the one before and the attention-softmax "
            "part on an earlier one; the loss and gradients are the batch's whatever the count; auto: for "
            "each batch shape, the count (1, 2, 4 or 8) whose simulated step is shortest, chosen with the "
            "chunk length where that is auto too"
        },
    )
    hybrid_softmax_chunks: str = field(
        default="1",
        metadata={
            "help": "time chunks of the decoder's output one attention-softmax cell takes (hybrid and model "
            "mode): 1, a cell per chunk, which starts as soon as the top decoder layer has made it; N, N chunks "
            "a cell; 0, all of them, one cell per shard and micro-batch (fewer cells, less host time, less "
            "overlap with the decoder); auto: for each batch shape, the one (1, 2, 4 or 0) whose simulated step "
            "is shortest; the loss and gradients are the same whatever it is"
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
    hybrid_workers: ChoiceEnum(WORKER_KINDS) = field(
        default="auto",
        metadata={
            "help": "who queues each device's cells: threads, one worker thread per device in the trainer's "
            "process; processes, a process per device (a host each), exchanging activations over "
            "torch.distributed point to point; auto: " + AUTO_WORKERS_RULE
        },
    )
    hybrid_mode: ChoiceEnum(MODES) = field(
        default="hybrid",
        metadata={
            "help": "hybrid: layers model-parallel, attention-softmax data-parallel over batch shards; "
            "model: layers model-parallel only; data: whole-model replicas over batch shards"
        },
    )


class HybridGroup:
    def __init__(self, model, plan: DevicePlan, chunk_length: Union[int, str] = 0, dropout_masks: str = "per-cell",
                 timeout: float = DEFAULT_TIMEOUT, cost_model: Optional[CostModel] = None,
                 micro_batches: Union[int, str] = 1, workers: str = "auto", softmax_chunks: Union[int, str] = 1,
                 processes_cost_model: Optional[CostModel] = None):
        self.model = model
        self.plan = plan
        self.workers = worker_kind(workers, plan.devices)
        # auto with prices for both kinds, on devices of one type: chosen at the first batch (priced_workers)
        self.prices = ((cost_model, processes_cost_model) if workers == "auto" and cost_model is not None
                       and processes_cost_model is not None and len({d.type for d in plan.devices}) == 1 else None)
        self.runtime = None  # the workers, made at the first step: WorkerThreads or StageProcesses
        self.micro_batches = micro_batches_option(micro_batches)
        self.chunk_length = chunk_length_option(chunk_length)
        self.softmax_chunks = softmax_chunks_option(softmax_chunks)
        # --hybrid-chunk-length, --hybrid-micro-batches, --hybrid-softmax-chunks auto: chosen per batch shape
        # (hybrid and model mode; data mode has neither chunks nor micro-batches)
        self.chunk_chooser = (ChunkLengthChooser(model, plan, cost_model, self.micro_batches, self.chunk_length,
                                                 self.softmax_chunks)
                              if AUTO in (self.chunk_length, self.micro_batches, self.softmax_chunks)
                              and plan.mode != "data" else None)
        self.dropout_masks = dropout_masks
        self.timeout = timeout
        self.replicas = ModelReplicas(model)
        self.place()

    @classmethod
    def from_options(cls, model, cfg) -> Optional["HybridGroup"]:
        """The group the ``--hybrid-*`` options ask for (None without
        ``--hybrid-devices``), its layers already on their devices."""
        check_options(cfg)
        if not cfg.hybrid_devices:
            return None
        placement = cfg.hybrid_placement
        if placement == "auto" and cfg.hybrid_mode != "data":
            placement = auto_placement(model, cfg)
        plan = build_plan(cfg.hybrid_devices, placement, cfg.hybrid_mode, cfg.encoder_layers, cfg.decoder_layers)
        bidirectional = sum(1 for layer in model.encoder.stack.layers if layer.bidirectional)
        if len(plan.reverse) > bidirectional:
            raise DevicePlanError(f"--hybrid-placement: reverse= gives {len(plan.reverse)} device(s) but the model "
                                  f"has {bidirectional} bidirectional encoder layer(s)")
        cost_file = getattr(cfg, "hybrid_cost_model", "")
        group = cls(model, plan, cfg.hybrid_chunk_length, cfg.hybrid_dropout_masks, float(cfg.hybrid_timeout),
                    CostModel.load(cost_file) if cost_file else None, getattr(cfg, "hybrid_micro_batches", 1),
                    getattr(cfg, "hybrid_workers", "auto"), getattr(cfg, "hybrid_softmax_chunks", 1),
                    CostModel.load(cost_file, "processes_cost_model") if cost_file else None)
        workers = "auto (priced at the first batch)" if group.prices else group.workers
        logger.info("hybrid group (%s mode, %d devices), worker %s:\n%s", plan.mode, plan.size, workers,
                    group.placement_table())
        return group

    def place(self) -> None:
        """Move every layer to its device: embeddings with the bottom layer,
        bridges with their decoder layer, the attention-softmax master (and
        a tied output embedding) with the bottom decoder layer."""
        plan, model = self.plan, self.model
        encoder, decoder = model.encoder.stack, model.decoder.stack
        encoder.embed_tokens.to(plan.encoder_device(0))
        for layer, module in enumerate(encoder.layers):
            module.to(plan.encoder_device(layer))
        decoder.embed_tokens.to(plan.decoder_device(0))
        for layer, module in enumerate(decoder.layers):
            for part in (module, decoder.bridges_h[layer], decoder.bridges_c[layer]):
                part.to(plan.decoder_device(layer))
        model.decoder.attention_softmax.to(plan.decoder_device(0))

    def placement_rows(self) -> List[Tuple[str, str, int]]:
        """``(part, device, parameters)`` of every placed part."""
        encoder, decoder = self.model.encoder.stack, self.model.decoder.stack

        def count(*modules):
            return sum(p.numel() for m in modules for p in m.parameters())

        def where(module):
            return str(next(module.parameters()).device)

        rows = [("encoder embeddings", where(encoder.embed_tokens), count(encoder.embed_tokens))]
        for layer, module in enumerate(encoder.layers):
            kind = (f"bidirectional, reverse on {self.plan.devices[self.plan.reverse_worker(layer)]}"
                    if module.bidirectional else "LSTM")
            rows.append((f"encoder layer {layer} ({kind})", where(module), count(module)))
        rows.append(("decoder embeddings", where(decoder.embed_tokens), count(decoder.embed_tokens)))
        for layer, module in enumerate(decoder.layers):
            rows.append((f"decoder layer {layer} (+bridge)", where(module),
                         count(module, decoder.bridges_h[layer], decoder.bridges_c[layer])))
        part = self.model.decoder.attention_softmax
        shards = ", ".join(str(self.plan.devices[worker]) + (f" x{self.plan.shard_weights[worker]}"
                                                             if self.plan.shard_weights else "")
                           for worker in self.plan.shard_workers)
        shared = part.output_weight is decoder.embed_tokens.weight
        rows.append(("attention-softmax" + (" (tied)" if shared else ""), f"master {where(part)}; shards {shards}",
                     count(part) - (part.output_weight.numel() if shared else 0)))
        return rows

    def placement_table(self) -> str:
        rows = [(name, device, f"{params:,}") for name, device, params in self.placement_rows()]
        return plan_table([("part", "device", "parameters")] + rows)

    def loss_sums(self, net_input: Dict[str, Tensor], target: Tensor, shard_loss) -> Tuple[Tensor, ...]:
        """The summed shard losses of one batch, its cells run on the
        group's workers; their backward runs the reverse wavefront."""
        with step_scope():
            return self._loss_sums(net_input, target, shard_loss)

    def _loss_sums(self, net_input: Dict[str, Tensor], target: Tensor, shard_loss) -> Tuple[Tensor, ...]:
        masks = self.dropout_masks == "single-device"
        chunk_length, micro_batches, softmax_chunks = self.chunk_length, self.micro_batches, self.softmax_chunks
        if self.chunk_chooser is not None:
            chunk_length, micro_batches, softmax_chunks = self.chunk_chooser(net_input, target)
            metrics.log_scalar("chunk_len", chunk_length, weight=1, round=1)
            metrics.log_scalar("micro_batches", micro_batches, weight=1, round=1)
            if self.softmax_chunks == AUTO:
                metrics.log_scalar("softmax_chunks", softmax_chunks, weight=1, round=1)
        if self.runtime is None and self.prices is not None:
            self.workers, prices = priced_workers(self.model, self.plan, net_input, target, *self.prices,
                                                  chunk_length, micro_batches, softmax_chunks)
            logger.info("hybrid workers auto: %s (a step priced %s)", self.workers,
                        ", ".join(f"{seconds * 1e3:.2f} ms with {kind}" for kind, seconds in prices.items()))
            self.prices = None
        if self.runtime is None:
            leave_cores_to_devices(self.plan)
            self.runtime = (StageProcesses(self.model, self.plan, self.timeout, build_step, lay_out_step)
                            if self.workers == "processes" else
                            WorkerThreads(self.model, self.plan, self.timeout, self.replicas))
        return self.runtime.loss_sums(net_input, target, shard_loss,
                                      StepShape(chunk_length, micro_batches, softmax_chunks, masks), log_device_usage)

    @property
    def stages(self) -> Optional[StageProcesses]:
        """The stage processes (``--hybrid-workers processes``, once started)."""
        return self.runtime if isinstance(self.runtime, StageProcesses) else None


def leave_cores_to_devices(plan: DevicePlan) -> None:
    """On CPU devices each device's worker computes on one core (one
    intra-op thread), so the trainer's thread, which runs the loss, the
    optimizer and fairseq's step between the passes, takes the cores left,
    at least one: at the machine's count its intra-op threads would run
    (and, idle, spin) on the devices' cores (docs/processes.md, "The
    trainer's threads").  Never raised; GPU groups keep theirs."""
    import torch

    if any(device.type != "cpu" for device in plan.devices):
        return
    threads = torch.get_num_threads()
    left = max(1, threads - plan.size)
    if left < threads:
        torch.set_num_threads(left)
        logger.info("hybrid group on %d CPU devices: the trainer's intra-op threads %d -> %d (a core a device)",
                    plan.size, threads, left)


def log_device_usage(usage: DeviceUsage) -> None:
    """fairseq metrics of one training step, averaged over each
    ``--log-interval`` like fairseq's own: ``devK_busy``, the fraction of
    the step's forward and backward wall time device K spent running cells,
    and ``group_fill``, their mean (1.0: no device ever waited).  On CUDA
    these are host times, what the workers spent queueing their cells."""
    fractions = usage.fractions()
    for index, fraction in enumerate(fractions):
        metrics.log_scalar(f"dev{index}_busy", fraction, weight=1, round=2)
    metrics.log_scalar("group_fill", sum(fractions) / len(fractions), weight=1, round=2)
