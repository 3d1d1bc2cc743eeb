#!/usr/bin/env python3
"""Peak memory per device of a training step, for one device and for
hybrid groups, counted on virtual devices (docs/benchmarks.md, "Memory per
device").

Each (devices, mode) runs ``--arch`` on ``cpu:0..cpu:K-1``: a warm-up step,
then one step at each of two batch sizes, each device's live storages
counted as ``torch.cuda.max_memory_allocated`` counts them (no CUDA
context, no allocator cache).  From the two sizes: each device's fixed
bytes and bytes per sentence, the largest ``--max-tokens`` that fits 16
and 80 GiB, and what replicas, gradients and Adam's state cost.  Counts
bytes, not time: it may run beside other work.

    .venv/bin/python benchmarks/bench_memory.py --out docs/bench
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from typing import Dict, List, Optional

import torch

from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
from fairseq_hybrid.harness.measuring import backward_step, on_device, write_report
from fairseq_hybrid.harness.stand_ins import StandInTask, build_model, make_dictionary
from fairseq_hybrid.harness.virtual_devices import virtual_devices
from fairseq_hybrid.planning.twin_model import batch

MiB = 2 ** 20
GiB = 2 ** 30
CAPACITIES = {"16 GiB": 16 * GiB, "80 GiB": 80 * GiB}


def sample_on(device: torch.device, sentences: int, source_length: int, target_length: int) -> Dict:
    net_input, target = batch(sentences, [source_length] * sentences, target_length)
    sample = {"net_input": net_input, "target": target, "ntokens": target.numel()}
    return on_device(sample, device)


def bytes_on(tensors, harness, device: int) -> int:
    seen, total = set(), 0
    for tensor in tensors:
        if tensor is None or harness.device_of(tensor) != device:
            continue
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def measure(args, count: int, mode: Optional[str], sizes: List[int]) -> Dict[int, Dict]:
    """For each batch size: peak bytes per device of a step's forward and
    backward (which grows with the batch) and of its optimizer step (which
    does not), after a warm-up step that makes the replicas and Adam's
    state; and what the parameters, gradients, optimizer state and replicas
    hold after the last step."""
    dictionary = make_dictionary(args.vocabulary - 4)  # + 4 special symbols
    devices = [torch.device("cpu", index) for index in range(count)]
    results = {}
    with virtual_devices(streams=False) as harness:
        torch.manual_seed(0)
        # one device: the engine on a group of one (--hybrid-devices cuda:0)
        micro_batches = args.micro_batches if mode in ("hybrid", "model") else 1
        model = build_model(args.arch, dictionary, dictionary, hybrid_devices=",".join(str(d) for d in devices),
                            hybrid_mode=mode or "hybrid", hybrid_micro_batches=micro_batches).train()
        criterion = HybridCrossEntropyCriterion(StandInTask(dictionary, dictionary), False, 0.1)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=False)
        for sentences in [min(4, *sizes), *sizes]:
            print(f"[memory]   a step of {sentences} sentences", flush=True)
            sample = sample_on(devices[0], sentences, args.source_length, args.target_length)
            optimizer.zero_grad(set_to_none=True)  # as fairseq's train_step starts
            harness.memory.reset_peaks()
            loss, _, _ = backward_step(model, criterion, sample)
            del sample, loss
            peaks = [harness.memory.peak(index) for index in range(count)]
            harness.memory.reset_peaks()
            optimizer.step()
            results[sentences] = {"peaks": peaks, "step_peaks": [harness.memory.peak(i) for i in range(count)]}
        masters = list(model.parameters())
        master_storages = {p.untyped_storage().data_ptr() for p in masters}
        replicas = []
        group = getattr(model, "hybrid_group", None)
        if group is not None:
            for cached in group.replicas.cache.values():
                for copy in cached.copies.values():
                    replicas += [p for p in copy.parameters() if p.untyped_storage().data_ptr() not in master_storages]
        adam = [value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value)]
        held = []
        for index in range(count):
            held.append({
                "parameters": bytes_on(masters, harness, index),
                "gradients": bytes_on([p.grad for p in masters], harness, index),
                "adam": bytes_on(adam, harness, index),
                "replica_parameters": bytes_on(replicas, harness, index),
            })
        output = model.decoder.attention_softmax.output_weight
        output_bytes = output.numel() * output.element_size()
    for result in results.values():
        result.update(held=held, output_projection_bytes=output_bytes)
    return results


def fit_line(small: Dict, large: Dict, sentences_small: int, sentences_large: int) -> List[Dict]:
    """Per device: the forward and backward's fixed bytes and bytes per
    sentence from two batch sizes, and the optimizer step's peak."""
    lines = []
    for peak_small, peak_large, step in zip(small["peaks"], large["peaks"], large["step_peaks"]):
        per_sentence = (peak_large - peak_small) / (sentences_large - sentences_small)
        lines.append({"fixed": peak_small - per_sentence * sentences_small, "per_sentence": per_sentence,
                      "step": step})
    return lines


def peak_at(line: Dict, sentences: int) -> float:
    return max(line["fixed"] + line["per_sentence"] * sentences, line["step"])


def largest_max_tokens(lines: List[Dict], capacity: int, tokens_per_sentence: int) -> int:
    """The largest --max-tokens whose batch fits every device of the group
    (the device that fills first decides; 0 when the step alone does not fit)."""
    if any(line["step"] > capacity or line["fixed"] > capacity for line in lines):
        return 0
    sentences = min((capacity - line["fixed"]) / line["per_sentence"] for line in lines if line["per_sentence"] > 0)
    return int(sentences) * tokens_per_sentence


def vocabulary_parallel_saving(row: Dict, count: int) -> float:
    """Bytes a vocabulary-parallel output layer would save on the busiest
    device: each device would hold 1/K of the output projection's rows
    (and their gradient, and on the master their Adam state) instead of a
    whole replica.  An estimate from the parameter sizes, not measured."""
    if count == 1 or row["mode"] == "data":
        return 0.0
    output = row["output_projection_bytes"]
    busiest = max(range(count), key=lambda index: row["peak_at"][index])
    held = row["held"][busiest]
    master_here = held["adam"] > 0 and held["parameters"] >= output
    copies = 4 if master_here else 2  # parameters + gradient (+ 2 Adam moments on the master)
    return (1 - 1 / count) * output * copies


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="hybrid_lstm_paper")
    parser.add_argument("--vocabulary", type=int, default=32000)
    parser.add_argument("--sentences", type=int, default=128,
                        help="batch the table reports (measured when it is the larger --measure-sentences)")
    parser.add_argument("--source-length", type=int, default=50)
    parser.add_argument("--target-length", type=int, default=50)
    parser.add_argument("--measure-sentences", default="64,128", help="two batch sizes actually run")
    parser.add_argument("--groups", default="1,2,4", help="device counts (1: the model alone on one device)")
    parser.add_argument("--modes", default="hybrid,model,data")
    parser.add_argument("--micro-batches", type=int, default=1,
                        help="--hybrid-micro-batches of the hybrid and model groups (default 1)")
    parser.add_argument("--out", default="docs/bench")
    args = parser.parse_args(argv)
    small, large = (int(value) for value in args.measure_sentences.split(","))
    tokens_per_sentence = max(args.source_length, args.target_length)  # what --max-tokens counts per sentence
    configs = []
    for count in (int(value) for value in args.groups.split(",")):
        configs += [(1, None)] if count == 1 else [(count, mode) for mode in args.modes.split(",")]
    rows = []
    for count, mode in configs:
        name = "one device" if mode is None else f"{mode}, {count} devices"
        if mode in ("hybrid", "model") and args.micro_batches > 1:
            name += f", {args.micro_batches} micro-batches"
        print(f"[memory] {name}", flush=True)
        measured = measure(args, count, mode, [small, large])
        at_small, at_large = measured[small], measured[large]
        lines = fit_line(at_small, at_large, small, large)
        row = {"name": name, "devices": count, "mode": mode or "one device", "lines": lines,
               "measured": {str(small): at_small["peaks"], str(large): at_large["peaks"]},
               "peak_at": ([max(peak, step) for peak, step in zip(at_large["peaks"], at_large["step_peaks"])]
                           if large == args.sentences else [peak_at(line, args.sentences) for line in lines]),
               "held": at_large["held"], "output_projection_bytes": at_large["output_projection_bytes"],
               "max_tokens": {cap: largest_max_tokens(lines, size, tokens_per_sentence)
                              for cap, size in CAPACITIES.items()}}
        row["vocabulary_parallel_saving"] = vocabulary_parallel_saving(row, count)
        rows.append(row)
    one = next(row for row in rows if row["devices"] == 1)
    busiest_one = max(one["peak_at"])
    for row in rows:
        row["busiest_vs_one_device"] = max(row["peak_at"]) / busiest_one
        row["goal"] = 1 / row["devices"] + 0.10
    report = {
        "arch": args.arch, "vocabulary": args.vocabulary, "sentences": args.sentences,
        "source_length": args.source_length, "target_length": args.target_length,
        "measured_sentences": [small, large], "tokens_per_sentence": tokens_per_sentence,
        "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
        "date": datetime.date.today().isoformat(), "rows": rows,
    }
    write_report(report, os.path.join(args.out, "memory.json"), markdown(report))
    print(markdown(report))
    return 0


def mib(value: float) -> str:
    return f"{value / MiB:,.0f}"


def markdown(report: Dict) -> str:
    rows = report["rows"]
    small, large = report["measured_sentences"]
    lines = [
        f"Peak memory per device of one training step (forward, backward, Adam) of `{report['arch']}` "
        f"({report['vocabulary']:,}-word vocabulary), batch of {report['sentences']} sentences of "
        f"{report['source_length']} + {report['target_length']} tokens, fp32; counted on virtual devices "
        f"(bytes of live tensor storages per device, as `torch.cuda.max_memory_allocated`), measured at "
        f"{small} and {large} sentences{'' if large == report['sentences'] else ' and extrapolated'}; a "
        f"device's peak is the larger of its forward and backward's and its optimizer step's; fixed bytes "
        f"and bytes per sentence are the line through the two sizes ({report['date']}, "
        f"`benchmarks/bench_memory.py`).",
        "",
        "| group | busiest device, MiB | vs one device | goal 1/K + 10% | each device, MiB | "
        "busiest: fixed + per sentence; optimizer step, MiB | largest --max-tokens, 16 GiB | 80 GiB |",
        "| --- | ---: | ---: | ---: | --- | --- | ---: | ---: |",
    ]
    for row in rows:
        busiest = max(range(row["devices"]), key=lambda index: row["peak_at"][index])
        line = row["lines"][busiest]
        lines.append(
            f"| {row['name']} | {mib(row['peak_at'][busiest])} | {row['busiest_vs_one_device']:.2f} | "
            f"{row['goal']:.2f} | {' / '.join(mib(v) for v in row['peak_at'])} | "
            f"{mib(line['fixed'])} + {line['per_sentence'] / MiB:,.1f}; {mib(line['step'])} | "
            f"{row['max_tokens']['16 GiB']:,} | {row['max_tokens']['80 GiB']:,} |")
    lines += [
        "",
        "What each device holds between steps (MiB): parameters it owns, their gradients, Adam's two moments, "
        "and replicas of parameters owned elsewhere; and what a vocabulary-parallel output layer would save "
        "on the busiest device (estimated from the output projection's size, not built):",
        "",
        "| group | parameters | gradients | Adam | replicas | vocabulary-parallel saving |",
        "| --- | --- | --- | --- | --- | ---: |",
    ]
    for row in rows:
        held = row["held"]
        lines.append(
            f"| {row['name']} | {' / '.join(mib(h['parameters']) for h in held)} | "
            f"{' / '.join(mib(h['gradients']) for h in held)} | {' / '.join(mib(h['adam']) for h in held)} | "
            f"{' / '.join(mib(h['replica_parameters']) for h in held)} | "
            f"{mib(row['vocabulary_parallel_saving'])} |")
    lines += ["", f"--max-tokens counts {report['tokens_per_sentence']} tokens per sentence (the longer side); "
              "the capacities are of tensor memory, before the CUDA context and the allocator's rounding."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
