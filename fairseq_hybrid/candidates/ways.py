"""The ways to train one global batch on N devices, each an object that
prices itself (the schedule simulator, :meth:`Candidate.price`), runs
itself (a few timed steps in a process of its own, :meth:`Candidate.spec`
and :meth:`Candidate.run`) and says the command line that trains with it
(:meth:`Candidate.command`): one device, DDP, one hybrid group (worker
threads or a process per device), groups under DDP.  The plan's rows are
their :meth:`Candidate.as_dict`; :func:`from_row` gives a row's way back,
so that ``race``, ``--measure``, the printed command and the run in its
own process never tell the ways apart by a row's shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar, Dict, List, Optional, Sequence, Tuple, Type

import torch

from ..forecasts.data_parallel_cost import data_parallel_step, gradient_bytes, owned_bytes
from ..forecasts.gpu_costs import predicted_step
from ..planning.chunk_choice import SOFTMAX_CHUNK_COUNTS
from ..planning.schedule_simulator import CostModel, StepTime
from ..forecasts.workload import Batch
from ..planning.twin_model import batch, uniform_batch
from ..timing.ddp_rank import in_ranks
from ..timing.command_model import build, drawn, padded_tokens, timed
from .group_search import best_group, chosen

__all__ = ["Costs", "Pricing", "Candidate", "OneDevice", "DataParallel", "Group", "GroupsUnderDDP", "WAYS",
           "from_row"]

Costs = Callable[[int], Tuple[CostModel, CostModel]]  # K -> (a group of K's cost model, one device's)


@dataclass
class Pricing:
    """What every candidate of one race is priced with: the model, the
    cost models (``costs``; ``rank_cost``: one DDP rank's where it is not
    one device's, its link also pricing the groups' all-reduce), the
    sentences' shape, what a group may choose among (or ``choices``: by
    group size, what to price as given) and the groups already priced
    (``memo``, by size, sentences and shape); ``real``: a batch of the
    command's to price instead of ``source`` + ``target`` tokens each."""

    model: object
    cfg: object
    costs: Costs
    source: int
    target: int
    rank_cost: Optional[CostModel] = None
    micro_batch_counts: Sequence[int] = (1, 2, 4)
    lengths: Optional[Sequence[int]] = None
    replica_copies: bool = True
    choices: Optional[Dict[int, Dict]] = None
    softmax_chunks: Sequence[int] = SOFTMAX_CHUNK_COUNTS
    memo: Dict = field(default_factory=dict)
    progress: Callable[[str], None] = lambda text: None
    real: Optional[Batch] = None  # one of the command's batches: priced on its first sentences instead

    def batch(self, sentences: int):
        if self.real is None:
            return uniform_batch(sentences, self.source, self.target)
        sources, width, targets = self.real
        return batch(sentences, sources[:sentences], width, targets[:sentences])

    def group(self, k: int, sentences: int) -> Dict:
        """A group of ``k`` at ``sentences``: :func:`.group_search.best_group`'s
        choice (or the given one), priced once a race."""
        key = (k, sentences, self.source, self.target)
        if key not in self.memo:
            self.progress(f"pricing a group of {k} at {sentences} sentences")
            cost, sample = self.costs(k)[0], self.batch(sentences)
            given = (self.choices or {}).get(k)
            if given:
                self.memo[key] = best_group(self.model, self.cfg, k, cost, sample, [given["micro_batches"]],
                                            [given["chunk_length"]], given["placement"], self.replica_copies,
                                            [given.get("softmax_chunks", 1)])
            else:
                self.memo[key] = best_group(self.model, self.cfg, k, cost, sample, self.micro_batch_counts,
                                            self.lengths, replica_copies=self.replica_copies,
                                            softmax_chunks=self.softmax_chunks)
        return self.memo[key]


@dataclass
class Candidate:
    """One way of training on ``gpus`` devices: ``groups`` groups of
    ``group_size`` devices each (a group size of 1: a device alone), each at
    ``sentences`` a step; a group's ``workers`` (None: not said) and the
    ``choice`` it priced; the predicted ``step`` once priced."""

    gpus: int
    group_size: int
    groups: int
    sentences: int
    workers: Optional[str] = None
    choice: Dict = field(default_factory=dict)
    step: Optional[StepTime] = None

    kind: ClassVar[str] = ""  # the row's "way" and the run's "kind"

    @property
    def name(self) -> str:
        raise NotImplementedError

    def price(self, pricing: Pricing) -> "Candidate":
        """Its predicted step under ``pricing`` (kept in ``step``); itself."""
        raise NotImplementedError

    def spec(self, train: List[str], devices: Sequence[str], batches: int, warmup: int) -> Dict:
        """How a process of its own runs it on ``devices`` with the user's
        command ``train``: ``batches`` timed steps after ``warmup``."""
        group = dict(self.choice, workers=self.workers or "auto") if self.group_size > 1 else None
        return {"kind": self.kind, "train": train, "batches": batches, "warmup": warmup, "group": group,
                "devices": list(devices[:self.gpus]), "threads": self.group_size}  # a process's intra-op threads

    @staticmethod
    def run(spec: Dict) -> Dict:
        """Its timed steps, in this process: seconds, padded tokens, steps."""
        raise NotImplementedError

    def command(self, rest: List[str], batch: List[str], devices: Optional[Sequence[str]]) -> List[str]:
        """The command line that trains this way: ``rest``, the user's
        command without what the plan sets; ``batch``, its batch options."""
        raise NotImplementedError

    def group_options(self) -> List[str]:
        options = ["--hybrid-chunk-length", str(self.choice["chunk_length"]), "--hybrid-micro-batches",
                   str(self.choice["micro_batches"]), "--hybrid-softmax-chunks",
                   str(self.choice.get("softmax_chunks", 1))]
        if self.workers:
            options += ["--hybrid-workers", self.workers]
        if self.choice.get("placement"):
            options += ["--hybrid-placement", self.choice["placement"]]
        return options

    def speedup_over(self, one: "Candidate") -> float:
        """Tokens/s over ``one``'s (both train the same global batch a step)."""
        return one.step.total / self.step.total

    def as_dict(self, one: "Candidate", ddp: Optional["Candidate"] = None) -> Dict:
        row = {"name": self.name, "way": self.kind, "gpus": self.gpus, "group_size": self.group_size,
               "groups": self.groups, "sentences_per_group": self.sentences, "step_ms": self.step.total * 1e3,
               "speedup": self.speedup_over(one), **self.choice}
        if self.workers:
            row["workers"] = self.workers
        if ddp is not None:
            row["vs_ddp"] = ddp.step.total / self.step.total
        if self.step.parts:  # a process per device: what its own costs come to, milliseconds a step
            row["process_costs_ms"] = {name: seconds * 1e3 for name, seconds in self.step.parts.items()}
        return row


def in_process(spec: Dict) -> Dict:
    """One device, or one group of the devices, timed in this process."""
    torch.set_num_threads(spec["threads"])
    task, cfg, model, criterion = build(spec["train"], spec["devices"], spec["group"])
    samples = drawn(task, cfg, spec["batches"])
    device = spec["devices"][0]  # fairseq's trainer puts a batch on the first GPU; a group takes it from there
    seconds = timed(model, criterion, torch.optim.Adam(model.parameters(), lr=1e-3), samples, spec["warmup"], device)
    return {"seconds": seconds, "tokens": padded_tokens(samples), "steps": len(samples)}


class OneDevice(Candidate):
    """The model on one device at the whole global batch: the reference.
    On CPU devices it runs with every device's thread (the other way to
    use the cores)."""

    kind = "one"

    @property
    def name(self) -> str:
        return "one GPU"

    def price(self, pricing: Pricing) -> "OneDevice":
        self.step = predicted_step(pricing.model, pricing.cfg, 1, "hybrid", pricing.costs(1)[1],
                                   *pricing.batch(self.sentences))
        return self

    def spec(self, train, devices, batches, warmup) -> Dict:
        return dict(super().spec(train, devices[:1], batches, warmup), threads=len(devices) if devices[0] == "cpu"
                    else 1)

    run = staticmethod(in_process)

    def command(self, rest, batch, devices) -> List[str]:
        return ["fairseq-train", *rest, *batch]


class DataParallel(Candidate):
    """fairseq's DDP: a rank a device, each at its share of the batch."""

    kind = "ddp"

    @property
    def name(self) -> str:
        return f"DDP on {self.gpus}"

    def price(self, pricing: Pricing) -> "DataParallel":
        rank = pricing.rank_cost or pricing.costs(1)[1]
        alone = predicted_step(pricing.model, pricing.cfg, 1, "hybrid", rank, *pricing.batch(self.sentences))
        self.step = data_parallel_step(alone, gradient_bytes(pricing.model), self.gpus, rank)
        return self

    def spec(self, train, devices, batches, warmup) -> Dict:
        return dict(super().spec(train, devices, batches, warmup), ranks=self.groups)

    run = staticmethod(in_ranks)

    def command(self, rest, batch, devices) -> List[str]:
        return ["fairseq-train", *rest, *batch, "--distributed-world-size", str(self.gpus)]


class Group(Candidate):
    """One hybrid group of every device."""

    kind = "group"

    @property
    def name(self) -> str:
        return f"one group of {self.group_size}" + (f", {self.workers}" if self.workers else "")

    def price(self, pricing: Pricing) -> "Group":
        group = pricing.group(self.group_size, self.sentences)
        self.step, self.choice = group["step"], chosen(group)
        return self

    run = staticmethod(in_process)

    def command(self, rest, batch, devices) -> List[str]:
        names = ",".join(devices[:self.group_size] if devices else [f"cuda:{i}" for i in range(self.group_size)])
        return ["fairseq-train", *rest, *batch, "--hybrid-devices", names, *self.group_options()]


class GroupsUnderDDP(Candidate):
    """``groups`` hybrid groups, their gradients all-reduced after the
    backward pass (``fairseq-hybrid-train``)."""

    kind = "groups"

    @property
    def name(self) -> str:
        return (f"{self.groups} groups of {self.group_size} under DDP"
                + (f", {self.workers}" if self.workers else ""))

    def price(self, pricing: Pricing) -> "GroupsUnderDDP":
        group = pricing.group(self.group_size, self.sentences)
        owned = max(owned_bytes(pricing.model, pricing.cfg, self.group_size, group["placement"]))
        self.step = data_parallel_step(group["step"], owned, self.groups,
                                       pricing.rank_cost or pricing.costs(self.group_size)[0])
        self.choice = chosen(group)
        return self

    def spec(self, train, devices, batches, warmup) -> Dict:
        return dict(super().spec(train, devices, batches, warmup), ranks=self.groups)

    run = staticmethod(in_ranks)

    def command(self, rest, batch, devices) -> List[str]:
        kind = ["--device", "cpu"] if devices and devices[0] == "cpu" else []
        return ["fairseq-hybrid-train", "--nproc-per-node", str(self.groups), "--devices-per-process",
                str(self.group_size), *kind, "--", *rest, *batch, *self.group_options()]


WAYS: Dict[str, Type[Candidate]] = {way.kind: way for way in (OneDevice, DataParallel, Group, GroupsUnderDDP)}


def from_row(row: Dict) -> Candidate:
    """The way a plan's row (:meth:`Candidate.as_dict`) describes, not yet
    priced."""
    way = WAYS[row["way"]]
    choice = {key: row[key] for key in ("micro_batches", "chunk_length", "softmax_chunks", "placement") if key in row}
    return way(row["gpus"], row["group_size"], row["groups"], row["sentences_per_group"], row.get("workers"), choice)
