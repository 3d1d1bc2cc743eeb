"""Memory per virtual device (fairseq_hybrid.harness.virtual_memory): what each
device holds and its peak, as torch.cuda.memory_allocated and
max_memory_allocated count them per GPU; and benchmarks/bench_memory.py."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from fairseq_hybrid.harness.virtual_devices import virtual_devices


def test_live_bytes_and_peaks_per_device():
    with virtual_devices() as harness:
        memory = harness.memory
        a = torch.ones(1000).to("cpu:0")
        assert (memory.live(0), memory.live(1)) == (4000, 0)
        b = a.to("cpu:1")
        view = b[10:]  # a view holds no memory of its own
        assert (memory.live(0), memory.live(1)) == (4000, 4000)
        c = a * 2
        assert memory.live(0) == memory.peak(0) == 8000
        del a, c
        assert memory.live(0) == 0 and memory.peak(0) == 8000
        memory.reset_peaks()
        assert memory.peak(0) == 0 and memory.peak(1) == 4000
        del b
        assert memory.live(1) == 4000  # the view keeps the storage alive
        del view
        assert memory.live(1) == 0
        host = torch.ones(1000)  # host memory is not a device's
        assert memory.live(0) == memory.live(1) == 0 and host.numel() == 1000


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_a_hybrid_group_spreads_a_steps_memory(tmp_path, micro_batches):
    """Through the benchmark script on the tiny model: every device of a
    group of 2 peaks below the one device, with micro-batches too, and the
    report says so."""
    out = tmp_path / "memory"
    subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bench_memory.py"), "--arch", "hybrid_lstm_tiny",
                    "--vocabulary", "400", "--sentences", "32", "--source-length", "9", "--target-length", "8",
                    "--measure-sentences", "4,8", "--groups", "1,2", "--modes", "hybrid,model",
                    "--micro-batches", str(micro_batches), "--out", str(out)],
                   check=True, capture_output=True, text=True, cwd=REPO)
    report = json.loads((out / "memory.json").read_text())
    rows = {row["name"].replace(", 2 micro-batches", ""): row for row in report["rows"]}
    assert (", 2 micro-batches" in report["rows"][1]["name"]) == (micro_batches == 2)
    one = max(rows["one device"]["peak_at"])
    for name in ("hybrid, 2 devices", "model, 2 devices"):
        assert len(rows[name]["peak_at"]) == 2
        assert max(rows[name]["peak_at"]) < one, (name, rows[name]["peak_at"], one)
        assert all(line["per_sentence"] > 0 for line in rows[name]["lines"])
    held = rows["hybrid, 2 devices"]["held"]
    assert sum(h["parameters"] for h in held) == rows["one device"]["held"][0]["parameters"]
    assert held[1]["replica_parameters"] > 0  # the attention-softmax replica on the second device
    assert "| hybrid, 2 devices" in (out / "memory.md").read_text()


def test_a_devices_loss_cells_keep_one_output_layer_gradient():
    """Each attention-softmax cell (one per batch shard, time chunk and
    micro-batch) computes its output layer's gradient in forward; a
    device's cells sum it into one matrix (GradientSink) instead of each
    holding its own until backward.  With a vocabulary large enough for
    that matrix to dominate, 4 micro-batches of 7 time chunks each (28
    cells on each device) peak at a few matrices, not 28."""
    from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
    from fairseq_hybrid.harness.measuring import backward_step, on_device
    from fairseq_hybrid.harness.stand_ins import StandInTask, build_model, make_dictionary, make_sample

    source, target = make_dictionary(40), make_dictionary(8000)
    matrix = len(target) * 32 * 4  # the output layer's weight (hybrid_lstm_tiny: 32 features), fp32 bytes
    with virtual_devices() as harness:
        torch.manual_seed(0)
        model = build_model("hybrid_lstm_tiny", source, target, hybrid_devices="cpu:0,cpu:1", hybrid_chunk_length=1,
                            hybrid_micro_batches=4)
        criterion = HybridCrossEntropyCriterion(StandInTask(source, target), False, 0.1)
        sample = on_device(make_sample(source, target, [5] * 8, [6] * 8), "cpu:0")
        backward_step(model, criterion, sample)  # replicas made, gradients allocated
        harness.memory.reset_peaks()
        backward_step(model, criterion, sample)
        peaks = [harness.memory.peak(device) for device in (0, 1)]
    # parameters, their gradients and a replica are about 3 matrices; the cells' sums one more
    assert max(peaks) < 8 * matrix, [peak / matrix for peak in peaks]


def test_data_mode_keeps_the_replicas_gradients_off_the_masters_device_until_the_reduce():
    """In data mode every worker's one cell is a whole step on its shard, so
    sending its whole-model gradient early overlaps nothing; sent early, the
    K - 1 copies wait together on the master's device for the reduce.  The
    reduce copies them one parameter at a time: the master's device peaks
    at about its parameters, their gradients and one worker's activations,
    not three more copies of the model."""
    from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
    from fairseq_hybrid.harness.measuring import backward_step, on_device
    from fairseq_hybrid.harness.stand_ins import StandInTask, build_model, make_dictionary, make_sample

    source, target = make_dictionary(40), make_dictionary(8000)
    with virtual_devices() as harness:
        torch.manual_seed(0)
        model = build_model("hybrid_lstm_tiny", source, target, hybrid_devices="cpu:0,cpu:1,cpu:2,cpu:3",
                            hybrid_mode="data")
        whole = sum(p.numel() * p.element_size() for p in model.parameters())
        criterion = HybridCrossEntropyCriterion(StandInTask(source, target), False, 0.1)
        sample = on_device(make_sample(source, target, [5] * 8, [6] * 8), "cpu:0")
        backward_step(model, criterion, sample)  # replicas made, gradients allocated
        harness.memory.reset_peaks()
        backward_step(model, criterion, sample)
        peak = harness.memory.peak(0)
    # parameters + gradients + a shard's activations and output-layer gradient: under 4 models (6 when sent early)
    assert peak < 4 * whole, peak / whole


def test_joined_attention_softmax_cells_hold_more_logits_at_once():
    """--hybrid-softmax-chunks 0 runs a shard's whole target in one cell, so
    the fused loss's logits cover up to --output-loss-chunk-rows rows at
    once, where a cell per time chunk holds one chunk's: with a vocabulary
    whose logits dominate, each device peaks higher (why 1 stays the
    default; the planner weighs only time)."""
    from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
    from fairseq_hybrid.harness.measuring import backward_step, on_device
    from fairseq_hybrid.harness.stand_ins import StandInTask, build_model, make_dictionary, make_sample

    source, target = make_dictionary(40), make_dictionary(2000)
    peaks = {}
    for softmax_chunks in ("1", "0"):
        with virtual_devices() as harness:
            torch.manual_seed(0)
            model = build_model("hybrid_lstm_tiny", source, target, hybrid_devices="cpu:0,cpu:1",
                                hybrid_chunk_length=2, hybrid_softmax_chunks=softmax_chunks)
            criterion = HybridCrossEntropyCriterion(StandInTask(source, target), False, 0.1)
            sample = on_device(make_sample(source, target, [9] * 16, [10] * 16), "cpu:0")
            backward_step(model, criterion, sample)
            harness.memory.reset_peaks()
            backward_step(model, criterion, sample)
            peaks[softmax_chunks] = [harness.memory.peak(device) for device in (0, 1)]
    # a shard's 8 sentences of 10 tokens and the end of sentence in one cell, against 2 time steps of them
    extra_logits = (8 * 11 - 8 * 2) * len(target) * 4
    assert all(joined - chunked > extra_logits / 2 for joined, chunked in zip(peaks["0"], peaks["1"])), peaks
