"""Every ordering line of the engine guards something: removed, the virtual
stream checker raises (fairseq_hybrid.harness.virtual_streams).  One test per line
(tests/stream_mutations.py lists them; docs/gpu.md says what each guards),
plus the checker's own rules on hand-made streams."""

import pytest
import torch

from fairseq_hybrid.harness.exactness import check_equal
from fairseq_hybrid.parallel.runtime import stream_handoff
from fairseq_hybrid.harness.virtual_devices import virtual_devices
from fairseq_hybrid.harness.virtual_streams import StreamRace
from stream_mutations import MUTATIONS, apply

# The one configuration in which each removal shows (a one-step exactness
# check, batch on the first device, chunks of 3 time steps): two devices for
# everything that crosses devices, two workers on one device for what
# orders two streams of one device.
SHOWN_ON = {
    "cell forward event": ["cpu:0", "cpu:1"],
    "cell backward event": ["cpu:0", "cpu:1"],
    "same-device wait_event": ["cpu:0", "cpu:0"],
    "same-device record_stream": ["cpu:0", "cpu:0"],
    "copy stream wait_event": ["cpu:0", "cpu:1"],
    "copy stream wait_stream": ["cpu:0", "cpu:1"],
    "copy stream with": ["cpu:0", "cpu:1"],
    "copy stream record_stream": ["cpu:0", "cpu:1"],
    "job start wait": ["cpu:0", "cpu:1"],
    "job end wait": ["cpu:0", "cpu:1"],
    "prefetch event": ["cpu:0", "cpu:1"],
    "prefetch wait_event": ["cpu:0", "cpu:1"],
    "gradient send event": ["cpu:0", "cpu:1"],
}
# Lines no step of the engine reaches, each shown by a direct call instead.
DIRECT = {"host read synchronize", "prefetch record_stream", "prefetch read wait"}  # (the last two: tests/test_replicas.py)
# Lines whose removal is no race: what they buy is concurrency.
NO_RACE = {"worker stream with", "prefetch stream with"}


def test_every_mutation_has_a_test():
    assert {mutation.id for mutation in MUTATIONS} == set(SHOWN_ON) | DIRECT | NO_RACE


def race_in(error: BaseException) -> bool:
    while error is not None:
        if isinstance(error, StreamRace):
            return True
        error = error.__cause__
    return False


@pytest.mark.parametrize("mutation", [m for m in MUTATIONS if m.id in SHOWN_ON], ids=lambda m: m.id)
def test_removing_an_ordering_line_is_caught(mutation, dictionaries, monkeypatch):
    apply(mutation, monkeypatch)
    with pytest.raises(Exception) as raised, virtual_devices() as harness:
        check_equal(SHOWN_ON[mutation.id], "hybrid", dictionaries, batch_on_first_device=True, hybrid_chunk_length=3)
    assert race_in(raised.value), raised.value
    assert harness.streams.races and "stream race" in harness.streams.races[0]


def test_the_unmutated_engine_has_no_race_in_the_same_runs(dictionaries):
    for devices in {tuple(devices) for devices in SHOWN_ON.values()}:
        with virtual_devices() as harness:
            check_equal(list(devices), "hybrid", dictionaries, batch_on_first_device=True, hybrid_chunk_length=3)
        assert harness.streams.races == []
        assert any(stream.startswith("worker") for stream in harness.streams.ops_per_stream)
        assert any(stream.startswith("copy stream") for stream in harness.streams.ops_per_stream) == (
            devices == ("cpu:0", "cpu:1"))


def produced_on_a_side_stream(device):
    """A tensor written on a stream of its own, and the event after it."""
    side = stream_handoff.new_stream(device, "producer")
    with stream_handoff.use_stream(side):
        value = torch.ones(4, device=device) * 2
        event = stream_handoff.record_event(device)
    return value, event


def test_reading_a_device_tensor_on_the_host_waits_for_its_event(monkeypatch):
    """``arrive(value, host, event)``: no cell output is read on the host in a
    step, so the line is shown by calling ``arrive`` directly."""
    device = torch.device("cpu", 0)
    with virtual_devices():
        value, event = produced_on_a_side_stream(device)
        assert stream_handoff.arrive(value, torch.device("cpu"), event).tolist() == [2.0] * 4
    apply(next(m for m in MUTATIONS if m.id == "host read synchronize"), monkeypatch)
    with virtual_devices():
        value, event = produced_on_a_side_stream(device)
        with pytest.raises(StreamRace, match=r"copy device to host.*before aten\.mul wrote it.*on producer"):
            stream_handoff.arrive(value, torch.device("cpu"), event)


def test_without_its_own_stream_a_worker_runs_on_the_default_stream(dictionaries, monkeypatch):
    """Not a race: every op then runs on its device's default stream, still
    ordered by the same events; what is lost is that two workers on one GPU
    run side by side (the checker does not measure concurrency)."""
    apply(next(m for m in MUTATIONS if m.id == "worker stream with"), monkeypatch)
    with virtual_devices() as harness:
        check_equal(["cpu:0", "cpu:0"], "hybrid", dictionaries, batch_on_first_device=True, hybrid_chunk_length=3)
    used = harness.streams.ops_per_stream
    assert harness.streams.races == [] and used
    assert not any("worker" in stream for stream in used), used


# -- the checker's rules -------------------------------------------------------------


def test_an_event_orders_only_what_was_queued_before_it():
    device = torch.device("cpu", 0)
    with virtual_devices():
        reader = stream_handoff.new_stream(device, "reader")
        value, event = produced_on_a_side_stream(device)
        reader.wait_event(event)
        with stream_handoff.use_stream(reader):
            value + 1  # ordered
        writer = stream_handoff.new_stream(device, "writer")
        writer.wait_stream(reader)  # after the producer and the read
        early = writer.record_event()  # before the write below: orders nothing of it
        with stream_handoff.use_stream(writer):
            value.mul_(3)
        reader.wait_event(early)
        with pytest.raises(StreamRace, match=r"aten\.add in the calling thread on reader .* may read a tensor before "
                                             r"aten\.mul_ wrote it .* on writer"):
            with stream_handoff.use_stream(reader):
                value + 1


def test_a_write_after_reads_on_other_streams_needs_them_done():
    device = torch.device("cpu", 0)
    with virtual_devices():
        value = torch.ones(4, device=device)
        reader = stream_handoff.new_stream(device, "reader")
        reader.wait_stream(stream_handoff.default_stream(device))
        with stream_handoff.use_stream(reader):
            value.sum()
        with pytest.raises(StreamRace, match=r"may write a tensor before aten\.sum read it"):
            value.add_(1)  # the default stream: nothing orders it after the reader


def test_memory_freed_while_another_stream_uses_it_needs_record_stream():
    """The caching allocator hands a freed block to the next allocation on
    the stream that allocated it; a stream that read it must be done by then
    or named with ``record_stream``."""
    device = torch.device("cpu", 0)
    for recorded in (False, True):
        with virtual_devices():
            value = torch.ones(4, device=device)
            reader = stream_handoff.new_stream(device, "reader")
            reader.wait_stream(stream_handoff.default_stream(device))
            with stream_handoff.use_stream(reader):
                value.sum()
            if recorded:
                stream_handoff.record_stream(value, reader)
            del value
            if recorded:
                torch.zeros(4, device=device)
            else:
                with pytest.raises(StreamRace, match=r"memory freed and handed out again on default stream"):
                    torch.zeros(4, device=device)


def test_cross_device_copies_are_ordered_as_cuda_orders_them():
    """ATen's device-to-device copy waits for the destination's current
    stream and makes it wait for the copy (``cuda/Copy.cu``): the copy's
    result is ready on the destination's current stream without an event."""
    with virtual_devices():
        value = torch.ones(4, device=torch.device("cpu", 0)) * 2
        moved = value.to(torch.device("cpu", 1))
        assert (moved + 1).tolist() == [3.0] * 4


def test_a_job_starts_after_the_callers_work_and_the_caller_sees_the_jobs(dictionaries):
    """The clocks travel with the thread state: one step on two workers of
    one device and then the caller's reads give no race (the exactness runs
    above), and a checker's counts are deterministic: the same step twice
    gives the same number of checked ops."""
    counts = []
    for _ in range(2):
        with virtual_devices() as harness:
            check_equal(["cpu:0", "cpu:0"], "hybrid", dictionaries, batch_on_first_device=True)
        counts.append(harness.streams.ops)
    assert counts[0] == counts[1] > 0
