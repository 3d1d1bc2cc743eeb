"""Removing one ordering line of the engine, for the mutation tests of the
virtual stream checker (tests/test_stream_mutations.py, docs/gpu.md)."""

import __future__
import inspect
import sys
import textwrap
from typing import NamedTuple

from fairseq_hybrid.parallel.runtime import cell_graph, replicas, stream_handoff, worker


class Mutation(NamedTuple):
    """Line ``line`` (its ``occurrence``-th copy, stripped) of ``owner.name``
    replaced by ``replacement``."""

    id: str
    owner: object
    name: str
    line: str
    replacement: str = "pass"
    occurrence: int = 0

    @property
    def where(self) -> str:
        function = getattr(self.owner, self.name)
        module = sys.modules[function.__module__].__name__.replace("fairseq_hybrid.", "")
        return f"{module}.{function.__qualname__}"


MUTATIONS = [
    Mutation("cell forward event", cell_graph.CellGraph, "_forward_cell",
             "self.events[index] = record_event(device)", "self.events[index] = None"),
    Mutation("cell backward event", cell_graph.CellGraph, "_backward_cell",
             "event = record_event(device) if leaves else None", "event = None"),
    Mutation("same-device wait_event", stream_handoff, "arrive", "stream.wait_event(event)", occurrence=0),
    Mutation("same-device record_stream", stream_handoff, "arrive", "record_stream(value, stream)", occurrence=0),
    Mutation("host read synchronize", stream_handoff, "arrive", "event.synchronize()  # a GPU tensor read on the host"),
    Mutation("copy stream wait_event", stream_handoff, "arrive", "stream.wait_event(event)", occurrence=1),
    Mutation("copy stream wait_stream", stream_handoff, "arrive", "stream.wait_stream(default_stream(source))"),
    Mutation("copy stream with", stream_handoff, "arrive", "with use_stream(stream):", "if True:"),
    Mutation("copy stream record_stream", stream_handoff, "arrive", "record_stream(value, stream)", occurrence=1),
    Mutation("job start wait", worker.Worker, "_run_job",
             "stream.wait_stream(stream_handoff.default_stream(self.device))  # the caller's work comes first"),
    Mutation("job end wait", worker.Worker, "_run_job", "stream_handoff.default_stream(self.device).wait_stream(stream)"),
    Mutation("worker stream with", worker.Worker, "_run_job", "with stream_handoff.use_stream(stream):", "if True:"),
    Mutation("prefetch event", replicas.Replicas, "prefetch", "self.ready[worker] = stream_handoff.record_event(device)",
             "self.ready[worker] = None"),
    Mutation("prefetch wait_event", replicas.Replicas, "on", "stream.wait_event(event)"),
    Mutation("prefetch record_stream", replicas.Replicas, "on", "stream_handoff.record_stream(param.data, stream)"),
    Mutation("prefetch read wait", replicas.Replicas, "reduce", "stream_handoff.current_stream(source).wait_event(event)"),
    Mutation("prefetch stream with", replicas.Replicas, "prefetch", "with stream_handoff.use_stream(stream):", "if True:"),
    Mutation("gradient send event", replicas.Replicas, "send", "made = stream_handoff.record_event(device)  # after the backward that made them",
             "made = None"),
]


def apply(mutation: Mutation, monkeypatch) -> None:
    """Install ``owner.name`` without the mutation's line, everywhere the
    original is referenced (modules that imported it by name too)."""
    original = getattr(mutation.owner, mutation.name)
    source, first_line = inspect.getsourcelines(original)
    lines = textwrap.dedent("".join(source)).splitlines()
    hits = [i for i, line in enumerate(lines) if line.strip() == mutation.line]
    assert len(hits) > mutation.occurrence, f"{mutation.id}: line not found in {mutation.where}: {mutation.line}"
    hit = hits[mutation.occurrence]
    indent = lines[hit][: len(lines[hit]) - len(lines[hit].lstrip())]
    lines[hit] = indent + mutation.replacement
    module = sys.modules[original.__module__]
    namespace = dict(vars(module))
    code = compile("\n" * (first_line - 1) + "\n".join(lines) + "\n", module.__file__, "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)
    mutated = namespace[mutation.name]
    monkeypatch.setattr(mutation.owner, mutation.name, mutated)
    if inspect.ismodule(mutation.owner):
        for other in list(sys.modules.values()):
            if getattr(other, "__name__", "").startswith("fairseq_hybrid") and \
                    getattr(other, mutation.name, None) is original:
                monkeypatch.setattr(other, mutation.name, mutated)
