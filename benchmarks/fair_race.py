#!/usr/bin/env python3
"""The group against DDP at the same global batch, predicted: what a user
with K GPUs would compare.

A user who moves from one GPU to K under DDP keeps ``--max-tokens`` per
GPU: each step trains K batches (weak scaling, how NVIDIA's GNMT v2 figures
were measured).  A group given the same global batch trains K batches'
sentences per step on its K devices.  Both are set against one device at
one batch (``hybrid_lstm_paper``, 32k vocabulary, 128 sentences of 50 + 50
tokens) and measured in tokens per second.

From the schedule simulator replaying the engine's own cells
(``fairseq_hybrid/planning/``):

1. the dependency bound (every FLOP costs the same, nothing else costs) of
   a group of 4 at 4 x 128 sentences for each count of micro-batches
   (``--hybrid-micro-batches``), at the default placement and at the one
   ``--hybrid-placement auto`` finds (layers, the reverse direction of the
   bidirectional layer, the shard sizes), with the busiest device's share
   of the step's FLOPs beside it; with and without the bidirectional
   bottom layer;
2. the group at K x 128 sentences at its best chunk length and count of
   micro-batches (searched placement) against DDP at 128 per GPU, under
   the P100 and A100 cost sets of ``benchmarks/predict_speedups.py``, with
   the host time per cell of ``--host-cost`` (at K = 4 also for the model
   without its bidirectional layer), and groups under DDP: two groups of
   two on 4 GPUs, two of four on 8;
3. with ``--data`` (a binarized corpus, e.g. the main job's
   ``work/tatoeba_ja_en/bin``): both on real batches, drawn as fairseq's
   batch sampler draws them at ``--max-tokens`` per GPU (default 6400, the
   paper's 128 x 50): DDP's K ranks each get a batch of their own and every
   step waits for the slowest (its stragglers); the group's step takes a
   batch drawn at K x ``--max-tokens``, and, for comparison, the same K
   batches merged;
4. the simulator in GNMT v2's published setting (4 x V100, fp32) beside
   its published DDP speed-up: the calibration of DDP's prediction.

An LSTM cell of fewer sentences than 128 runs at the lower throughput a
GPU reaches there (``fairseq_hybrid/forecasts/lstm_batch_efficiency.json``,
from DeepBench): micro-batches are not free.  The host time per cell is
read two ways (``--host-models``, ``fairseq_hybrid/forecasts/gpu_costs.py``):
queued ahead of the devices by one host that the group's worker threads
share (the GIL), and summed with each cell's device time (pessimistic).

    .venv/bin/python benchmarks/fair_race.py --host-cost docs/bench/host_cost.json \
        --data work/tatoeba_ja_en/bin --out docs/bench

5. the race at a fixed global batch (the global batch a user keeps as GPUs
   are added): one GPU, DDP, one group, groups under DDP, through
   ``fairseq_hybrid.forecasts.race`` (what ``fairseq-hybrid-plan``
   predicts with), and at scale; drawn as a map of the regimes.

Writes fair_race.json, fair_race.md and fair_race_map.png into --out
(``--only-global``: the fifth alone, fair_race_global.json and .md).
Minutes: no training.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Sequence, Tuple


from fairseq_hybrid.harness import measuring
from fairseq_hybrid.harness.measuring import write_report
from fairseq_hybrid.parallel import build_plan, build_step
from fairseq_hybrid.parallel.batch_rows import batch_slices
from fairseq_hybrid.forecasts import cost_file
from fairseq_hybrid.forecasts.data_parallel_cost import (data_parallel_step, data_parallel_step_of, gradient_bytes,
                                                       owned_bytes, speedup)
from fairseq_hybrid.forecasts.gpu_costs import (GNMT_V100_DDP_4, GNMT_V100_TOKENS_PER_S, HOST_MODELS,
                                               MLPERF_GNMT_V100, PUBLISHED_SETS, STEP_US, best_chunk_length,
                                               flat_past_reference, predicted_step, set_costs, set_rate,
                                               set_tokens_per_s)
from fairseq_hybrid.forecasts.race import best_group, chosen, race, searched, set_costs_of, uniform_batch
from fairseq_hybrid.planning.schedule_simulator import CostModel, device_flops
from fairseq_hybrid.planning.twin_model import batch, twin_model

PER_GPU = (128, 50, 50)  # sentences, source and target tokens of one GPU's batch


def set_of(args, name: str, model, cfg, per_gpu, host_model: str):
    """The cost set ``name`` under ``host_model``: a function of K giving
    the group's and one device's cost models (the A100 set's rate solved
    for ``--one-device-tokens-per-s`` on one device)."""
    return set_costs_of(name, model, cfg, per_gpu, args.host_cost, host_model,
                        set_tokens_per_s(name, args.one_device_tokens_per_s))


def busiest_share(model, cfg, k: int, placement: str, sample, chunk_length: int, micro_batches: int) -> float:
    """The busiest device's share of the step's floating-point operations."""
    plan = build_plan(",".join(["cpu"] * k), placement, "hybrid", cfg.encoder_layers, cfg.decoder_layers)
    built = build_step(model, plan, *sample, lambda *args: args, chunk_length, micro_batches)
    work = device_flops(built.step.cells, k)
    return max(work) / sum(work)


def bound_table(args, sample) -> Dict:
    rows = {}
    free = CostModel()
    for label, options in (("with the bidirectional layer", {}),
                           ("--encoder-bidirectional-layers 0", {"encoder_bidirectional_layers": 0})):
        model, cfg = twin_model("hybrid_lstm_paper", args.vocabulary, **options)
        one = predicted_step(model, cfg, 1, "hybrid", free, *sample).total
        for micro_batches in args.micro_batches:
            row = {}
            default = ("",) + best_chunk_length(model, cfg, 4, "hybrid", free, *sample, lengths=args.lengths,
                                                micro_batches=micro_batches)
            for name, (placement, length, step) in (("default", default),
                                                    ("auto", searched(model, cfg, 4, free, sample, micro_batches,
                                                                      args.lengths))):
                row[name] = {"bound": one / step.total, "chunk_length": length, "placement": placement,
                             "busiest_share": busiest_share(model, cfg, 4, placement, sample, length, micro_batches)}
            rows[f"{label}, M={micro_batches}"] = row
            print(f"bound {label}, M={micro_batches}: default {row['default']['bound']:.2f}x, "
                  f"auto {row['auto']['bound']:.2f}x", flush=True)
    return rows


def groups_under_ddp(model, cfg, one, one_cost: CostModel, cost: CostModel, group: Dict, k: int,
                     groups: int) -> Dict:
    """``groups`` groups of ``k`` under DDP, each at ``group``'s step (its
    K x 128 sentences): the all-reduce runs between twins, so the device
    that owns the most parameters decides; beside DDP on all their GPUs."""
    owned = max(owned_bytes(model, cfg, k, group["placement"]))
    gpus = groups * k
    return {"ddp": speedup(one, data_parallel_step(one, gradient_bytes(model), gpus, one_cost), gpus),
            "group": speedup(one, data_parallel_step(group["step"], owned, groups, cost), gpus),
            **chosen(group)}


def race_table(args, host_model: str) -> Dict:
    model, cfg = twin_model("hybrid_lstm_paper", args.vocabulary)
    per_gpu = batch(PER_GPU[0], [PER_GPU[1]] * PER_GPU[0], PER_GPU[2])
    model_bytes = gradient_bytes(model)
    report: Dict = {}
    for name in ("p100", "a100"):
        costs = set_of(args, name, model, cfg, per_gpu, host_model)
        one_cost = costs(1)[1]
        one = predicted_step(model, cfg, 1, "hybrid", one_cost, *per_gpu)
        rows = {}
        for k in args.groups:
            sentences = k * PER_GPU[0]
            merged = batch(sentences, [PER_GPU[1]] * sentences, PER_GPU[2])
            cost = costs(k)[0]
            group = best_group(model, cfg, k, cost, merged, args.micro_batches, args.lengths)
            ddp = data_parallel_step(one, model_bytes, k, one_cost)
            rows[f"K={k}"] = {"ddp": speedup(one, ddp, k), "group": speedup(one, group["step"], k), **chosen(group)}
            if k == 2:  # on 4 GPUs: two groups of two, the other way to use them
                rows["2 groups x 2 (4 GPUs)"] = groups_under_ddp(model, cfg, one, one_cost, cost, group, 2, 2)
            if k == 4 and args.eight:
                rows["2 groups x 4 (8 GPUs)"] = groups_under_ddp(model, cfg, one, one_cost, cost, group, 4, 2)
            row = rows[f"K={k}"]
            print(f"{name} ({host_model} host) K={k}: DDP {row['ddp']:.2f}x, group {row['group']:.2f}x "
                  f"(M={group['micro_batches']}, chunk {group['chunk_length']})", flush=True)
            if k == 4 and args.plain:
                # the same race for the model without its bidirectional layer (an existing option), each side
                # against one device running that model
                plain, plain_cfg = twin_model("hybrid_lstm_paper", args.vocabulary, encoder_bidirectional_layers=0)
                plain_one = predicted_step(plain, plain_cfg, 1, "hybrid", one_cost, *per_gpu)
                plain_group = best_group(plain, plain_cfg, 4, cost, merged, args.micro_batches, args.lengths)
                rows["K=4, --encoder-bidirectional-layers 0"] = {
                    "ddp": speedup(plain_one, data_parallel_step(plain_one, gradient_bytes(plain), 4, one_cost), 4),
                    "group": speedup(plain_one, plain_group["step"], 4),
                    **chosen(plain_group)}
        report[name] = rows
    return report


GLOBAL_SETS = PUBLISHED_SETS  # each at its published one-GPU tokens/s (gpu_costs.SET_TOKENS_PER_S)


def global_batch_table(args) -> Dict:
    """The race at a fixed global batch (:func:`fairseq_hybrid.forecasts.race.race`,
    the one code path ``fairseq-hybrid-plan`` predicts with): on K GPUs
    (``--global-gpus``) each global batch B of ``--global-batches`` that
    leaves DDP at most 128 sentences per GPU and at least 16 (B/K each,
    where an LSTM wastes a GPU), one group of K at B and groups of 2 and 4
    under DDP, every figure in tokens/s over one GPU at B; and at scale
    (``--scale-gpus``), groups of 2 and 4 under DDP against DDP at
    ``--scale-per-gpu`` sentences per GPU, step against step.  Sentences of
    50 + 50 tokens; the host ``--host-models``' first reading."""
    model, cfg = twin_model("hybrid_lstm_paper", args.vocabulary)
    reference = batch(PER_GPU[0], [PER_GPU[1]] * PER_GPU[0], PER_GPU[2])
    host_model = args.host_models[0]
    copies = getattr(args, "replica_copies", True)  # --free-replica-copies: False
    report: Dict = {"host_model": host_model, "sentence": list(PER_GPU[1:]), "sets": {},
                    "replica_copies": "priced" if copies else "free (a what-if)"}
    measured = {} if not getattr(args, "cost_file", None) else {"measured": cost_file.register(args.cost_file)}
    flat = {flat_past_reference(name): name for name in getattr(args, "flat_sets", [])}
    for name in [*args.global_sets, *flat, *measured]:
        if name in measured:  # a cost file: its own tokens/s and host time per cell
            costs = set_costs_of(measured[name].name, model, cfg, reference, measured[name].path, host_model,
                                 measured[name].tokens_per_s)
            report.setdefault("measured_on", measured[name].measured_on)
        elif name in flat:  # the sensitivity case: the set's LSTM cells above 128 rows at 128's throughput
            costs = set_costs_of(name, model, cfg, reference, args.host_cost, host_model,
                                 set_tokens_per_s(flat[name], args.one_device_tokens_per_s))
        else:
            costs = set_costs_of(name, model, cfg, reference, args.host_cost, host_model,
                                 set_tokens_per_s(name, args.one_device_tokens_per_s))
        memo: Dict = {}
        fixed, scale = [], []
        for gpus in args.global_gpus:
            for sentences in args.global_batches:
                if sentences % gpus or not 16 <= sentences // gpus <= 128:
                    continue
                rows = race(model, cfg, costs, gpus, sentences, *PER_GPU[1:], args.micro_batches, args.lengths,
                            memo=memo, replica_copies=copies)
                fixed.append(race_rows(rows))
                print(f"{name} global batch {sentences} on {gpus}: " + ", ".join(
                    f"{row['name']} {row['speedup']:.2f}x" for row in fixed[-1]), flush=True)
        for gpus in args.scale_gpus:
            for per_gpu in args.scale_per_gpu:
                rows = race(model, cfg, costs, gpus, gpus * per_gpu, *PER_GPU[1:], args.micro_batches,
                            args.lengths, group_sizes=(2, 4), memo=memo, replica_copies=copies)
                scale.append(race_rows(rows))
                print(f"{name} at scale, {per_gpu} per GPU on {gpus}: " + ", ".join(
                    f"{row['name']} {row.get('vs_ddp', 0):.2f} of DDP's step" for row in scale[-1][2:]), flush=True)
        report["sets"][name] = {"fixed": fixed, "scale": scale}
    return report


def race_rows(rows) -> List[Dict]:
    """A race's candidates as table rows (``rows[1]`` is DDP)."""
    return [row.as_dict(rows[0], rows[1]) for row in rows]


def global_batch_markdown(table: Dict) -> List[str]:
    readings = {"queued": "host queued", "per-device": "host queued, one per device", "summed": "host summed"}
    lines = ["", f"At a fixed global batch of B sentences ({table['sentence'][0]} + {table['sentence'][1]} tokens; "
             f"{readings[table['host_model']]}): DDP at B/K sentences per GPU, one group of K at B, groups of 2 or "
             "4 under DDP each at their share; tokens/s over one GPU at B, and in brackets the step of DDP over "
             "the row's (above 1: faster than DDP); each group at its best micro-batches, chunk length and "
             "placement:", ""]
    if table.get("measured_on"):
        lines += [f"The measured set is a cost file (`--cost-file`): {table['measured_on']}.", ""]
    if table.get("replica_copies", "priced") != "priced":
        lines += ["A what-if (`--free-replica-copies`): the groups' replicas' parameter and gradient copies cost "
                  "nothing.", ""]
    for name, sets in table["sets"].items():
        lines += [f"{name} set:", "",
                  "| GPUs K | B | per GPU under DDP | DDP | groups of 2 under DDP | groups of 4 under DDP | one group of K |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for rows in sets["fixed"]:
            gpus, ddp = rows[1]["gpus"], rows[1]
            cells = {}
            for row in rows[2:]:
                key = "one" if row["groups"] == 1 else row["group_size"]
                cells[key] = f"{row['speedup']:.2f}x ({row['vs_ddp']:.2f})"
            lines.append(f"| {gpus} | {rows[0]['sentences_per_group']} | {ddp['sentences_per_group']} | "
                         f"{ddp['speedup']:.2f}x | {cells.get(2, '')} | {cells.get(4, '')} | {cells.get('one', '')} |")
        lines.append("")
    lines += ["At scale, the same global batch per GPU: groups under DDP against DDP on all the GPUs, DDP's step "
              "over the groups' (above 1: the groups are faster):", "",
              "| set | per GPU under DDP | GPUs | DDP's step | groups of 2 | groups of 4 |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, sets in table["sets"].items():
        for rows in sets["scale"]:
            ddp = rows[1]
            by_size = {row["group_size"]: f"{row['vs_ddp']:.2f}" for row in rows[2:]}
            lines.append(f"| {name} | {ddp['sentences_per_group']} | {ddp['gpus']} | {ddp['step_ms']:.0f} ms | "
                         f"{by_size.get(2, '')} | {by_size.get(4, '')} |")
    return lines


def draw_map(table: Dict, path: str) -> None:
    """The map of the regimes: for each cost set, DDP's step over each
    candidate's by sentences per GPU under DDP, one line per candidate and
    GPU count (above 1: faster than DDP at the same global batch)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    sets = [name for name in table["sets"] if "flat past" not in name]  # sensitivity cases: tables only
    figure, axes = pyplot.subplots(1, len(sets), figsize=(4.2 * len(sets), 3.8), sharey=True, squeeze=False)
    for ax, name in zip(axes[0], sets):
        lines: Dict[Tuple[int, int], List[Tuple[int, float]]] = {}
        for rows in table["sets"][name]["fixed"]:
            per_gpu = rows[1]["sentences_per_group"]
            for row in rows[2:]:
                lines.setdefault((row["group_size"], row["gpus"]), []).append((per_gpu, row["vs_ddp"]))
        for (size, gpus), points in sorted(lines.items()):
            points.sort()
            label = f"group{'s' if gpus > size else ''} of {size} on {gpus} GPUs"
            ax.plot([x for x, _ in points], [y for _, y in points], label=label, markersize=5,
                    color={2: "tab:blue", 4: "tab:orange"}.get(size, "tab:green"),
                    marker={2: "o", 4: "s", 8: "^"}.get(gpus, "x"), linestyle={2: "-", 4: "--", 8: ":"}.get(gpus, "-"))
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks([16, 32, 64, 128], ["16", "32", "64", "128"])
        measured_on = table.get("measured_on", "").split(",")[0]
        ax.set_title(f"{measured_on}'s measured costs (predicted)" if name == "measured" and measured_on
                     else f"{name} set (predicted)")
        ax.set_xlabel("sentences per GPU under DDP")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("DDP's step / the candidate's (same global batch)")
    axes[0][-1].legend(fontsize=7, loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)


def real_batches(data: str, max_tokens: int, count: int) -> List[Tuple[List[int], List[int]]]:
    """``count`` training batches of ``data`` as fairseq's batch sampler
    draws them for one GPU at ``max_tokens`` (shuffled, seed 1): each its
    source and target lengths."""
    task = measuring.task_of(data)
    pad = task.target_dictionary.pad()
    drawn = measuring.batches(task, max_tokens, count, max_positions=(1024, 1024))
    return [(sample["net_input"]["src_lengths"].tolist(), sample["target"].ne(pad).sum(1).tolist())
            for sample in drawn]


def as_batch(parts: Sequence[Tuple[List[int], List[int]]]):
    """One batch of the sentences of ``parts`` (merged: padded to the
    longest)."""
    sources = [length for part in parts for length in part[0]]
    targets = [length for part in parts for length in part[1]]
    return batch(len(sources), sources, max(targets), targets)


def tokens_of(parts: Sequence[Tuple[List[int], List[int]]]) -> int:
    return sum(sum(sources) + sum(targets) for sources, targets in parts)


def ddp_on_real_batches(ones, parts, k: int, steps: int, model_bytes: float, one_cost: CostModel) -> float:
    """DDP's tokens/s over one device's on real batches: ``steps`` steps of
    K ``parts`` each, every step waiting for its slowest rank (``ones``:
    one device's step on each part)."""
    one_rate = tokens_of(parts) / sum(one.total for one in ones)
    ddp_seconds = sum(data_parallel_step_of(ones[i * k:(i + 1) * k], model_bytes, one_cost).total
                      for i in range(steps))
    return tokens_of(parts[:steps * k]) / ddp_seconds / one_rate


def split_rows(part: Tuple[List[int], List[int]], count: int) -> List[Tuple[List[int], List[int]]]:
    """A batch's sentences cut into ``count`` consecutive near-equal pieces
    (a DDP rank's, or a group's, share of a global batch)."""
    return [(part[0][rows], part[1][rows]) for rows in batch_slices(len(part[0]), count)]


def global_real_table(args) -> Dict:
    """The race at a fixed global batch on real batches: fairseq's sampler
    draws ``--real-steps`` batches at each of ``--global-real-tokens`` from
    ``--data`` (sentences of similar length, a global batch each), and on 4
    GPUs every way trains the same sentences: one GPU the whole batch; DDP's
    ranks a quarter of its sentences each, the step waiting for the slowest;
    one group of 4 the whole batch; two groups of 2 under DDP half each, the
    step waiting for the slower.  Tokens/s over one GPU's on the same
    sentences.  A group runs at its best micro-batches with K chunks a
    sequence or one chunk a layer, at the placement its search chose for a
    uniform batch of the batches' mean shape."""
    gpus, steps, host_model = 4, args.real_steps, args.host_models[0]
    model, cfg = twin_model("hybrid_lstm_paper", args.vocabulary)
    per_gpu = batch(PER_GPU[0], [PER_GPU[1]] * PER_GPU[0], PER_GPU[2])
    model_bytes = gradient_bytes(model)
    report: Dict = {"gpus": gpus, "steps": steps, "host_model": host_model, "rows": []}
    for tokens in args.global_real_tokens:
        parts = real_batches(args.data, tokens, steps)
        sentences = sum(len(part[0]) for part in parts) / len(parts)
        mean = [round(sum(sum(part[i]) / len(part[i]) for part in parts) / len(parts)) for i in (0, 1)]
        for name in ("p100", "a100"):
            costs = set_of(args, name, model, cfg, per_gpu, host_model)
            one_cost = costs(1)[1]
            ones = [predicted_step(model, cfg, 1, "hybrid", one_cost, *as_batch([part])).total for part in parts]
            ddp = [data_parallel_step_of([predicted_step(model, cfg, 1, "hybrid", one_cost, *as_batch([piece]))
                                          for piece in split_rows(part, gpus)], model_bytes, one_cost).total
                   for part in parts]
            row = {"max_tokens": tokens, "sentences": sentences, "set": name, "ddp": sum(ones) / sum(ddp)}
            for k, label in ((4, "group of 4"), (2, "2 groups of 2 under DDP")):
                cost = costs(k)[0]
                share = uniform_batch(int(sentences) * k // gpus, *mean)
                placement = best_group(model, cfg, k, cost, share, args.micro_batches, (0, 0))["placement"]

                def group_step(piece):
                    return best_group(model, cfg, k, cost, as_batch([piece]), args.micro_batches, (0, 0),
                                      placement=placement)["step"]

                if k == gpus:
                    seconds = [group_step(part).total for part in parts]
                else:
                    owned = max(owned_bytes(model, cfg, k, placement))
                    seconds = [data_parallel_step_of([group_step(piece) for piece in split_rows(part, gpus // k)],
                                                     owned, cost).total for part in parts]
                row[label] = sum(ones) / sum(seconds)
            report["rows"].append(row)
            print(f"{name} real global batches of {tokens} tokens ({sentences:.0f} sentences): DDP {row['ddp']:.2f}x, "
                  f"group of 4 {row['group of 4']:.2f}x, 2 groups of 2 {row['2 groups of 2 under DDP']:.2f}x",
                  flush=True)
    return report


def global_real_markdown(table: Dict) -> List[str]:
    lines = ["", f"At a fixed global batch on real batches ({table['steps']} batches of the data at each "
             f"--max-tokens, every way on the same sentences, {table['gpus']} GPUs, host {table['host_model']}): "
             "tokens/s over one GPU's on the same sentences, and in brackets DDP's step over the row's:", "",
             "| set | --max-tokens (global) | sentences a batch | per GPU under DDP | DDP | one group of 4 | "
             "2 groups of 2 under DDP |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in table["rows"]:
        ddp = row["ddp"]
        lines.append(f"| {row['set']} | {row['max_tokens']:,} | {row['sentences']:.0f} | "
                     f"{row['sentences'] / table['gpus']:.0f} | {ddp:.2f}x | "
                     f"{row['group of 4']:.2f}x ({row['group of 4'] / ddp:.2f}) | "
                     f"{row['2 groups of 2 under DDP']:.2f}x ({row['2 groups of 2 under DDP'] / ddp:.2f}) |")
    return lines


def gnmt_calibration(args, per_gpu_batches=None) -> Dict:
    """The simulator in GNMT v2's published setting, against its DDP
    figure on 4 V100 (fp32, batch 128 per GPU, NVLink): a model of its
    shape (4 x 1024 LSTM, the bottom encoder layer bidirectional, 1024-wide
    embeddings, 32k vocabulary), the ``v100`` cost set with its FLOP rate
    solved for GNMT v2's one-V100 tokens/s, 128 sentences of 50 + 50 tokens
    per GPU; DDP ideal, DDP waiting for its slowest rank on real batches
    (with ``--data``), and a group of 4 at 4 x 128 beside them."""
    model, cfg = twin_model("hybrid_lstm_paper", args.vocabulary, encoder_embed_dim=1024, decoder_embed_dim=1024)
    per_gpu = batch(PER_GPU[0], [PER_GPU[1]] * PER_GPU[0], PER_GPU[2])
    host_model = args.host_models[0]
    step_us = STEP_US["v100"]
    rate = set_rate("v100", model, cfg, per_gpu, args.host_cost, step_us, host_model, GNMT_V100_TOKENS_PER_S)
    group_cost, one_cost = set_costs("v100", args.host_cost, 4, step_us, rate, host_model)
    one = predicted_step(model, cfg, 1, "hybrid", one_cost, *per_gpu)
    model_bytes = gradient_bytes(model)
    report: Dict = {"published_ddp": list(GNMT_V100_DDP_4), "flop_rate": rate, "host_model": host_model,
                    "one_device_tokens_per_s": GNMT_V100_TOKENS_PER_S,
                    "parameters": sum(p.numel() for p in model.parameters()),
                    "ddp": speedup(one, data_parallel_step(one, model_bytes, 4, one_cost), 4)}
    if per_gpu_batches:
        steps = min(args.real_steps, len(per_gpu_batches) // 4)
        ones = [predicted_step(model, cfg, 1, "hybrid", one_cost, *as_batch([part])) for part in per_gpu_batches]
        report["ddp_real_batches"] = ddp_on_real_batches(ones, per_gpu_batches, 4, steps, model_bytes, one_cost)
    merged = batch(4 * PER_GPU[0], [PER_GPU[1]] * 4 * PER_GPU[0], PER_GPU[2])
    group = best_group(model, cfg, 4, group_cost, merged, args.micro_batches, args.lengths)
    report["group"] = speedup(one, group["step"], 4)
    report.update(chosen(group))
    print(f"GNMT v2's setting, 4 x V100: DDP {report['ddp']:.2f}x (published {GNMT_V100_DDP_4[0]}-"
          f"{GNMT_V100_DDP_4[1]}x), on real batches {report.get('ddp_real_batches', float('nan')):.2f}x; "
          f"group {report['group']:.2f}x", flush=True)
    return report


def mlperf_calibration(args) -> Dict:
    """The simulator's DDP at small per-GPU batch against MLPerf v0.6's GNMT
    (NVIDIA, V100, mixed precision): per-GPU tokens/s at 256 sentences per
    GPU on 8 GPUs and at 32 on 384.  A model of GNMT's shape (as
    :func:`gnmt_calibration`), sentences of 50 + 50 tokens, the v100 set's
    costs with its FLOP rate solved two ways: for GNMT v2's one-V100 fp32
    figure (the set as the tables use it), and for MLPerf's own 256-per-GPU
    figure on one device (fp16's faster arithmetic, the host time per cell
    unchanged); the figure to check is the ratio of 32 to 256 per GPU."""
    model, cfg = twin_model("hybrid_lstm_paper", args.vocabulary, encoder_embed_dim=1024, decoder_embed_dim=1024)
    host_model = args.host_models[0]
    step_us = STEP_US["v100"]
    model_bytes = gradient_bytes(model)
    rows = {}
    for solved_for, sentences, tokens_per_s in (("GNMT v2, one V100, fp32", PER_GPU[0], GNMT_V100_TOKENS_PER_S),
                                               ("MLPerf at 256 per GPU", 256, MLPERF_GNMT_V100[256][1])):
        reference = batch(sentences, [PER_GPU[1]] * sentences, PER_GPU[2])
        rate = set_rate("v100", model, cfg, reference, args.host_cost, step_us, host_model, tokens_per_s)
        _, one_cost = set_costs("v100", args.host_cost, 1, step_us, rate, host_model)
        per_gpu = {}
        for per, (gpus, _) in MLPERF_GNMT_V100.items():
            one = predicted_step(model, cfg, 1, "hybrid", one_cost, *batch(per, [PER_GPU[1]] * per, PER_GPU[2]))
            step = data_parallel_step(one, model_bytes, gpus, one_cost)
            per_gpu[per] = per * (PER_GPU[1] + PER_GPU[2]) / step.total
        rows[solved_for] = {"flop_rate": rate, "tokens_per_s_per_gpu": per_gpu,
                            "ratio_32_to_256": per_gpu[32] / per_gpu[256]}
        print(f"MLPerf calibration, rate solved for {solved_for}: {per_gpu[256]:,.0f} tokens/s per GPU at 256, "
              f"{per_gpu[32]:,.0f} at 32 ({per_gpu[32] / per_gpu[256]:.2f}; MLPerf "
              f"{MLPERF_GNMT_V100[32][1] / MLPERF_GNMT_V100[256][1]:.2f})", flush=True)
    return {"mlperf": {str(per): {"gpus": gpus, "tokens_per_s_per_gpu": rate}
                       for per, (gpus, rate) in MLPERF_GNMT_V100.items()},
            "mlperf_ratio": MLPERF_GNMT_V100[32][1] / MLPERF_GNMT_V100[256][1], "host_model": host_model,
            "rows": rows}


def mlperf_markdown(calibration: Dict) -> List[str]:
    measured = calibration["mlperf"]
    lines = ["", "DDP at small per-GPU batch, the simulator against MLPerf v0.6's GNMT (NVIDIA, V100, mixed "
             "precision; source + target tokens/s per GPU, all-reduce included):", "",
             "| v100 set's FLOP rate solved for | 256 per GPU, 8 GPUs | 32 per GPU, 384 GPUs | 32 over 256 |",
             "| --- | ---: | ---: | ---: |",
             f"| MLPerf v0.6, measured | {measured['256']['tokens_per_s_per_gpu']:,.0f} | "
             f"{measured['32']['tokens_per_s_per_gpu']:,.0f} | {calibration['mlperf_ratio']:.2f} |"]
    for name, row in calibration["rows"].items():
        rates = row["tokens_per_s_per_gpu"]
        lines.append(f"| predicted, {name} | {rates[256]:,.0f} | {rates[32]:,.0f} | {row['ratio_32_to_256']:.2f} |")
    return lines


def straggler_table(args, placements: Dict[str, Dict[int, str]], per_gpu_batches) -> Dict:
    """DDP and the group on real batches, in tokens/s over one device's on
    the per-GPU batches: DDP's step takes K of them and waits for its
    slowest rank; the group's step takes a batch drawn at K x
    ``--max-tokens`` (what a user would give it: sentences of similar
    length), and, for comparison, the same K per-GPU batches merged (padded
    to the longest), each at its best count of micro-batches and chunk
    length (the placement found at equal batches).  With K = 2, also two
    groups of two under DDP on 4 GPUs, each step waiting for the slower
    group."""
    steps = args.real_steps
    model, cfg = twin_model("hybrid_lstm_paper", args.vocabulary)
    per_gpu = batch(PER_GPU[0], [PER_GPU[1]] * PER_GPU[0], PER_GPU[2])
    model_bytes = gradient_bytes(model)
    report: Dict = {"max_tokens": args.max_tokens, "steps": steps, "host_model": args.host_models[0],
                    "sentences_per_batch": sum(len(part[0]) for part in per_gpu_batches) / len(per_gpu_batches)}
    # a group's steps: for two groups of two under DDP, twice as many of K = 2's
    group_steps = {k: steps * (2 if k == 2 else 1) for k in args.groups}
    group_batches = {k: real_batches(args.data, k * args.max_tokens, group_steps[k]) for k in args.groups}
    for name in ("p100", "a100"):
        costs = set_of(args, name, model, cfg, per_gpu, args.host_models[0])
        one_cost = costs(1)[1]
        ones = [predicted_step(model, cfg, 1, "hybrid", one_cost, *as_batch([part])) for part in per_gpu_batches]
        one_rate = tokens_of(per_gpu_batches) / sum(one.total for one in ones)  # tokens/s of one device
        rows = {}
        for k in args.groups:
            cost = costs(k)[0]

            def group_step(parts):
                return best_group(model, cfg, k, cost, as_batch(parts), args.micro_batches, (0, 0),
                                  placement=placements[name][k])["step"]

            own = [group_step([part]) for part in group_batches[k]]
            own_rate = tokens_of(group_batches[k][:steps]) / sum(step.total for step in own[:steps])
            merged = [group_step(per_gpu_batches[i * k:(i + 1) * k]) for i in range(group_steps[k])]
            merged_rate = tokens_of(per_gpu_batches[:steps * k]) / sum(step.total for step in merged[:steps])
            rows[f"K={k}"] = {"ddp": ddp_on_real_batches(ones, per_gpu_batches, k, steps, model_bytes, one_cost),
                              "group": own_rate / one_rate,
                              "group_merged": merged_rate / one_rate}
            print(f"{name} K={k} on real batches: DDP {rows[f'K={k}']['ddp']:.2f}x, group "
                  f"{rows[f'K={k}']['group']:.2f}x (the K batches merged: {rows[f'K={k}']['group_merged']:.2f}x)",
                  flush=True)
            if k == 2:
                # two groups of two under DDP on 4 GPUs: each step waits for the slower group
                owned = max(owned_bytes(model, cfg, 2, placements[name][2]))

                def under_ddp(steps_of, parts):
                    seconds = sum(data_parallel_step_of(steps_of[2 * i:2 * i + 2], owned, cost).total
                                  for i in range(steps))
                    return tokens_of(parts) / seconds / one_rate

                rows["2 groups x 2 (4 GPUs)"] = {
                    "ddp": ddp_on_real_batches(ones, per_gpu_batches, 4, steps, model_bytes, one_cost),
                    "group": under_ddp(own, group_batches[2]),
                    "group_merged": under_ddp(merged, per_gpu_batches[:4 * steps])}
                print(f"{name} 2 groups x 2 on real batches: {rows['2 groups x 2 (4 GPUs)']['group']:.2f}x",
                      flush=True)
        report[name] = rows
    return report


def markdown(report: Dict) -> str:
    lines = ["Dependency bound (every FLOP costs the same, nothing else costs) of a group of 4 at 4 x 128 "
             "sentences of 50 + 50 tokens against one device at 128, `hybrid_lstm_paper`, by micro-batches "
             "(`--hybrid-micro-batches`); the busiest device's share of the step's FLOPs beside each "
             "(`benchmarks/fair_race.py`):", "",
             "| model, micro-batches | default placement | busiest | `--hybrid-placement auto` | busiest |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, row in report["bounds"].items():
        default, auto = row["default"], row["auto"]
        lines.append(f"| {name} | {default['bound']:.2f}x | {default['busiest_share']:.1%} | {auto['bound']:.2f}x | "
                     f"{auto['busiest_share']:.1%} |")
    readings = {"queued": "the host queueing each cell ahead of the devices, one host for the group's workers "
                          "(one worker's host time per cell, measured on CPU, the LSTM kernel call as one op)",
                "per-device": "the host queueing each cell ahead of its device, one host (process) per device "
                              "(one worker's host time per cell, measured on CPU, the LSTM kernel call as one op)",
                "summed": "the host time per cell measured with K workers on CPU added to each cell's device time "
                          "(the pessimistic end)"}
    for host_model, by_set in report["race"].items():
        lines += ["", "Weak scaling (DDP keeps 128 sentences per GPU as GPUs are added; the group takes the same "
                  "global batch): DDP at 128 sentences per GPU, the group at K x 128 per step at its "
                  "best count of micro-batches and chunk length (placement by `--hybrid-placement auto`); speed-up "
                  f"in tokens/s over one GPU at 128; {readings[host_model]}:", "",
                  "| GPUs | P100 set: DDP | group | A100 set: DDP | group | group's M, chunk length (P100; A100) |",
                  "| --- | ---: | ---: | ---: | ---: | --- |"]
        for name in by_set["p100"]:
            p, a = by_set["p100"][name], by_set["a100"][name]
            lines.append(f"| {name} | {p['ddp']:.2f}x | {p['group']:.2f}x | {a['ddp']:.2f}x | {a['group']:.2f}x | "
                         f"{p['micro_batches']}, {p['chunk_length']}; {a['micro_batches']}, {a['chunk_length']} |")
        lines += ["", "Placements: " + "; ".join(f"{name} {row['placement'] or 'default'}"
                                                 for name, row in by_set["p100"].items())]
    lines += ["", "LSTM cells of fewer than 128 sentences run at a GPU's lower throughput there (DeepBench). Not in "
              "these figures: DDP's stragglers (below, on real batches)."]
    if report.get("global_batch"):
        lines += global_batch_markdown(report["global_batch"])
    real = report.get("real_batches")
    if real:
        lines += ["", f"On real batches, drawn by fairseq's batch sampler ({real['steps']} steps; per GPU "
                  f"`--max-tokens {real['max_tokens']}`, {real['sentences_per_batch']:.0f} sentences a batch on "
                  f"average; host {real['host_model']}): DDP's ranks each take a batch and wait for the slowest; "
                  "the group takes a batch of K x `--max-tokens` (in brackets: the same K batches merged, padded "
                  "to the longest), two groups of two each a batch of 2 x `--max-tokens` and the step waits for "
                  "the slower; tokens/s over one GPU's on the per-GPU batches:", "",
                  "| GPUs | P100 set: DDP | group | A100 set: DDP | group |", "| --- | ---: | ---: | ---: | ---: |"]
        for name in real["p100"]:
            p, a = real["p100"][name], real["a100"][name]
            lines.append(f"| {name} | {p['ddp']:.2f}x | {p['group']:.2f}x ({p['group_merged']:.2f}x) | "
                         f"{a['ddp']:.2f}x | {a['group']:.2f}x ({a['group_merged']:.2f}x) |")
    gnmt = report.get("gnmt_v100")
    if gnmt:
        real = f"{gnmt['ddp_real_batches']:.2f}x" if "ddp_real_batches" in gnmt else "not run (no `--data`)"
        lines += ["", "Calibration in GNMT v2's published setting (4 x V100, fp32, NVLink, 128 sentences per GPU; a "
                  f"model of its shape, {gnmt['parameters'] / 1e6:.0f}M parameters; FLOP rate "
                  f"{gnmt['flop_rate'] / 1e12:.1f} TFLOP/s solved for its {gnmt['one_device_tokens_per_s'] / 1e3:.2f}k "
                  f"tokens/s on one V100; host {gnmt['host_model']}):", "",
                  "| | speed-up on 4 GPUs |", "| --- | ---: |",
                  f"| published, DDP | {gnmt['published_ddp'][0]:.2f}-{gnmt['published_ddp'][1]:.2f}x |",
                  f"| predicted, DDP at 128 x 50 + 50 per GPU | {gnmt['ddp']:.2f}x |",
                  f"| predicted, DDP waiting for its slowest rank on the real batches above | {real} |",
                  f"| predicted, group of 4 at 4 x 128 (M = {gnmt['micro_batches']}, chunk length "
                  f"{gnmt['chunk_length']}) | {gnmt['group']:.2f}x |"]
    return "\n".join(lines) + "\n"


def integers(text: str) -> List[int]:
    return [int(value) for value in text.split(",") if value.strip()]


def host_models(text: str) -> List[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names:
        if name not in HOST_MODELS:
            raise argparse.ArgumentTypeError(f"{name!r}: each one of {', '.join(HOST_MODELS)}")
    return names


def names_of(known):
    def parse(text: str) -> List[str]:
        names = [name.strip() for name in text.split(",") if name.strip() and name.strip() != "none"]
        for name in names:
            if name not in known:
                raise argparse.ArgumentTypeError(f"{name!r}: each one of {', '.join(known)}")
        return names
    return parse


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host-cost", help="benchmarks/bench_host_cost.py --json output (default: 30 us per cell)")
    parser.add_argument("--one-device-tokens-per-s", type=float, default=None,
                        help="one GPU's tokens/s every set's FLOP rate is solved for (default: each set's published "
                        "figure, gpu_costs.SET_TOKENS_PER_S; the p100 set has a rate of its own)")
    parser.add_argument("--vocabulary", type=int, default=32000)
    parser.add_argument("--micro-batches", type=integers, default=[1, 2, 4, 8],
                        help="counts to try (default 1,2,4,8)")
    parser.add_argument("--lengths", type=integers, default=None,
                        help="chunk lengths to try (default: --hybrid-chunk-length auto's candidates)")
    parser.add_argument("--groups", type=integers, default=[2, 4], help="group sizes K (default 2,4)")
    parser.add_argument("--no-eight", dest="eight", action="store_false", help="leave out 2 groups x 4 on 8 GPUs")
    parser.add_argument("--no-plain", dest="plain", action="store_false",
                        help="leave out K = 4 without the bidirectional layer (--encoder-bidirectional-layers 0)")
    parser.add_argument("--data", help="a binarized ja-en corpus: also race on its batches, DDP's stragglers included")
    parser.add_argument("--max-tokens", type=int, default=6400, help="per GPU, for --data (default 6400: 128 x 50)")
    parser.add_argument("--real-steps", type=int, default=8, help="steps of K real batches each (default 8)")
    parser.add_argument("--global-real-tokens", type=integers, default=[3300, 6500, 13000],
                        help="with --data and --only-global: the global batches of the race on real batches, as "
                        "--max-tokens (default 3300,6500,13000: about 256, 512 and 1,024 Tatoeba sentences)")
    parser.add_argument("--host-models", type=host_models, default=["queued", "summed"],
                        help="how the host time is priced, the first also on real batches (default queued,summed: "
                        "queued ahead of the devices on one host shared by the workers; summed with the device "
                        "time, the pessimistic end; per-device: queued, one host per device, as "
                        "--hybrid-workers processes runs; benchmarks/host_per_device.py sets the two side by side)")
    parser.add_argument("--no-gnmt", dest="gnmt", action="store_false",
                        help="leave out the calibration in GNMT v2's published setting (4 x V100)")
    parser.add_argument("--global-sets", type=names_of(GLOBAL_SETS), default=list(GLOBAL_SETS),
                        help="cost sets of the race at a fixed global batch (default p100,a100,v100; none: leave out)")
    parser.add_argument("--cost-file", help="also race under a cost set one GPU measured (benchmarks/gpu_check.py "
                        "--phases calibrate writes it), named 'measured' in the tables and the map")
    parser.add_argument("--flat-sets", type=names_of(GLOBAL_SETS), default=["a100"],
                        help="also race these sets with their LSTM curve flat past 128 sentences, as before it was "
                        "continued (default a100; none: leave out)")
    parser.add_argument("--global-gpus", type=integers, default=[2, 4, 8], help="its GPU counts (default 2,4,8)")
    parser.add_argument("--global-batches", type=integers, default=[64, 128, 256, 512, 1024],
                        help="its global batches in sentences (default 64,128,256,512,1024)")
    parser.add_argument("--scale-gpus", type=integers, default=[8, 16, 64],
                        help="GPU counts of groups under DDP at scale (default 8,16,64)")
    parser.add_argument("--scale-per-gpu", type=integers, default=[16, 32, 64, 128],
                        help="sentences per GPU under DDP at scale (default 16,32,64,128)")
    parser.add_argument("--free-replica-copies", dest="replica_copies", action="store_false",
                        help="with --only-global: a what-if, the groups' replicas' parameter and gradient copies "
                        "cost nothing (the ceiling of any faster way to move them: a ring, a vocabulary split)")
    parser.add_argument("--out")
    parser.add_argument("--no-mlperf", dest="mlperf", action="store_false",
                        help="with --only-global: leave out the calibration against MLPerf v0.6's GNMT")
    parser.add_argument("--only-global", action="store_true",
                        help="only the race at a fixed global batch and its map (fair_race_global.json and .md, "
                        "fair_race_map.png)")
    parser.add_argument("--redraw", metavar="JSON", help="only draw the map (fair_race_map.png, into --out) from a "
                        "fair_race.json written before")
    args = parser.parse_args(argv)
    if args.redraw:
        draw_map(json.load(open(args.redraw))["global_batch"], os.path.join(args.out or ".", "fair_race_map.png"))
        return 0
    if args.data and not os.path.isdir(args.data):
        parser.error(f"--data {args.data}: {measuring.NO_DATA}")
    started = time.time()
    if args.only_global:
        report = {"global_batch": global_batch_table(args)}
        lines = global_batch_markdown(report["global_batch"])
        if args.data:
            report["global_real"] = global_real_table(args)
            lines += global_real_markdown(report["global_real"])
        if args.mlperf:
            report["mlperf_calibration"] = mlperf_calibration(args)
            lines += mlperf_markdown(report["mlperf_calibration"])
        report["minutes"] = (time.time() - started) / 60
        text = "\n".join(lines).strip() + "\n"
        print(text)
        if args.out:
            write_report(report, os.path.join(args.out, "fair_race_global.json"), text)
            draw_map(report["global_batch"], os.path.join(args.out, "fair_race_map.png"))
        return 0
    sample = batch(4 * PER_GPU[0], [PER_GPU[1]] * 4 * PER_GPU[0], PER_GPU[2])
    report = {"bounds": bound_table(args, sample),
              "race": {host_model: race_table(args, host_model) for host_model in args.host_models}}
    if args.global_sets:
        report["global_batch"] = global_batch_table(args)
    per_gpu_batches = None
    if args.data:
        per_gpu_batches = real_batches(args.data, args.max_tokens, args.real_steps * max(args.groups + [4]))
        placements = {name: {k: rows[f"K={k}"]["placement"] for k in args.groups}
                      for name, rows in report["race"][args.host_models[0]].items()}
        report["real_batches"] = straggler_table(args, placements, per_gpu_batches)
    if args.gnmt:
        report["gnmt_v100"] = gnmt_calibration(args, per_gpu_batches)
    report["minutes"] = (time.time() - started) / 60
    text = markdown(report)
    print(text)
    if args.out:
        write_report(report, os.path.join(args.out, "fair_race.json"), text)
        if report.get("global_batch"):
            draw_map(report["global_batch"], os.path.join(args.out, "fair_race_map.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
