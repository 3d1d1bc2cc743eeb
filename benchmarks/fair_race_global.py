#!/usr/bin/env python3
"""The race at a fixed global batch, predicted: the global batch a user
keeps as GPUs are added, trained on K GPUs every way (one GPU, DDP, one
group, groups under DDP), through ``fairseq_hybrid.candidates.race`` (what
``fairseq-hybrid-plan`` predicts with), and at scale; drawn as a map of
the regimes (``fair_race_map.png``).

With ``--data`` (a binarized corpus) the same race on real global batches,
every way on the same sentences; and the simulator's DDP at small per-GPU
batch against MLPerf v0.6's GNMT (``--no-mlperf`` leaves it out).  The
weak-scaling race is ``benchmarks/fair_race.py``.

    .venv/bin/python benchmarks/fair_race_global.py --host-cost docs/bench/host_cost.json \
        --cost-file docs/bench/cost_file_h200.json --out docs/bench

Writes fair_race_global.json and .md and fair_race_map.png into --out.
Minutes: no training.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Tuple

from fairseq_hybrid.forecasts import cost_file
from fairseq_hybrid.forecasts.data_parallel_cost import (data_parallel_step, data_parallel_step_of, gradient_bytes,
                                                       owned_bytes)
from fairseq_hybrid.forecasts.gpu_costs import (GNMT_V100_TOKENS_PER_S, MLPERF_GNMT_V100, PUBLISHED_SETS, STEP_US,
                                               flat_past_reference, predicted_step, set_costs, set_rate,
                                               set_tokens_per_s)
from fairseq_hybrid.candidates.group_search import best_group
from fairseq_hybrid.candidates.race import race, set_costs_of
from fairseq_hybrid.planning.twin_model import uniform_batch
from fairseq_hybrid.forecasts.real_batches import as_batch, split_rows
from fairseq_hybrid.harness import measuring
from fairseq_hybrid.harness.measuring import host_models, integers, race_options, real_batch_lengths, write_report
from fairseq_hybrid.planning.twin_model import batch, twin_model

PER_GPU = (128, 50, 50)  # sentences, source and target tokens of one GPU's batch (the reference)


GLOBAL_SETS = PUBLISHED_SETS  # each at its published one-GPU tokens/s (gpu_costs.SET_TOKENS_PER_S)


def global_batch_table(args) -> Dict:
    """The race at a fixed global batch (:func:`fairseq_hybrid.candidates.race.race`,
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
            costs = set_costs_of(name, model, cfg, reference, args.host_cost, host_model, args.one_device_tokens_per_s)
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
             "the row's (above 1: faster than DDP); each group at its best micro-batches, chunk length, "
             "attention-softmax chunks and placement:", ""]
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
        parts = real_batch_lengths(args.data, tokens, steps)
        sentences = sum(len(part[0]) for part in parts) / len(parts)
        mean = [round(sum(sum(part[i]) / len(part[i]) for part in parts) / len(parts)) for i in (0, 1)]
        for name in ("p100", "a100"):
            costs = set_costs_of(name, model, cfg, per_gpu, args.host_cost, host_model, args.one_device_tokens_per_s)
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
    race_options(parser)
    parser.add_argument("--data", help="a binarized ja-en corpus: also race on its global batches")
    parser.add_argument("--real-steps", type=int, default=8, help="batches at each --global-real-tokens (default 8)")
    parser.add_argument("--global-real-tokens", type=integers, default=[3300, 6500, 13000],
                        help="with --data: the global batches of the race on real batches, as --max-tokens (default "
                        "3300,6500,13000: about 256, 512 and 1,024 Tatoeba sentences)")
    parser.add_argument("--host-models", type=host_models, default=["queued"],
                        help="how the host time is priced, the first used (default queued: ahead of the devices on "
                        "one host shared by the workers; per-device: one host per device, as --hybrid-workers "
                        "processes runs; summed: with the device time, the pessimistic end)")
    parser.add_argument("--global-sets", type=names_of(GLOBAL_SETS), default=list(GLOBAL_SETS),
                        help="cost sets of the race (default p100,a100,v100; none: leave out)")
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
                        help="a what-if: the groups' replicas' parameter and gradient copies cost nothing (the "
                        "ceiling of any faster way to move them: a ring, a vocabulary split)")
    parser.add_argument("--no-mlperf", dest="mlperf", action="store_false",
                        help="leave out the calibration against MLPerf v0.6's GNMT")
    parser.add_argument("--out")
    parser.add_argument("--redraw", metavar="JSON", help="only draw the map (fair_race_map.png, into --out) from a "
                        "fair_race_global.json written before")
    args = parser.parse_args(argv)
    if args.redraw:
        draw_map(json.load(open(args.redraw))["global_batch"], os.path.join(args.out or ".", "fair_race_map.png"))
        return 0
    if args.data and not os.path.isdir(args.data):
        parser.error(f"--data {args.data}: {measuring.NO_DATA}")
    started = time.time()
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


if __name__ == "__main__":
    sys.exit(main())
