"""The GPU check's precision phase: fairseq-train with a group of 2 in fp32,
--amp and --fp16, each run under its own limit with its log kept (docs/gpu.md)."""

import os
import re

from .base import REPO, FAIRSEQ_TRAIN, TRAIN_LIMIT, devices_for, binarize, run_logged


def phase_precision(args, result):
    import torch

    data = binarize(args.work)
    count = torch.cuda.device_count() if args.device == "cuda" else 0
    group = ",".join(devices_for(args.device, count, 2))
    runs = {}
    result["runs"] = runs  # kept run by run
    for precision in args.precisions.split(","):
        if precision == "bf16":  # fairseq/options.py: "if args.bf16: args.tpu = True"
            runs[precision] = {"skipped": "fairseq 0.12's --bf16 means a TPU: on a GPU its Trainer stops for want "
                                          "of torch_xla (the second GPU check); --amp and --fp16 are its GPU options"}
            continue
        if args.device == "cpu" and precision != "fp32":
            runs[precision] = {"skipped": "needs CUDA"}
            continue
        flags = [] if precision == "fp32" else [f"--{precision}"]
        sides = [("one device", "one", []), (f"group {group}", "group", ["--hybrid-devices", group])]
        if precision != "fp32":  # a process per device under --amp and --fp16 (fp32: the exactness phase)
            sides.append((f"group {group}, processes", "processes",
                          ["--hybrid-devices", group, "--hybrid-workers", "processes"]))
        for side, name, extra in sides:
            save = os.path.join(args.work, f"precision_{precision}_{name}")
            command = [*FAIRSEQ_TRAIN, data, "--user-dir", os.path.join(REPO, "fairseq_hybrid"),
                       "--arch", "hybrid_lstm_tiny", "--criterion", "hybrid_cross_entropy", "--label-smoothing", "0.1",
                       "--optimizer", "adam", "--lr", "0.005", "--clip-norm", "1.0", "--max-tokens", "600",
                       "--max-update", str(args.updates), "--save-dir", save, "--no-epoch-checkpoints",
                       "--no-save-optimizer-state", "--seed", "3", "--no-progress-bar", "--log-format", "simple",
                       "--log-interval", "1", "--disable-validation", *(["--cpu"] if args.device == "cpu" else []),
                       *flags, *extra]
            code, log = run_logged(command, save + ".log", TRAIN_LIMIT)
            losses = [float(x) for x in re.findall(r"\| loss ([\d.]+|nan|inf)", log)]
            entry = {"ok": code == 0, "losses": losses[-3:],
                     "finite": bool(losses) and all(x == x and x != float("inf") for x in losses)}
            if code != 0:
                entry["error"] = log[-3000:]
            runs.setdefault(precision, {})[side] = entry
            result.save()
        if precision == "fp32" and all(r.get("ok") for r in runs["fp32"].values()):
            one = torch.load(os.path.join(args.work, "precision_fp32_one", "checkpoint_last.pt"), map_location="cpu")
            two = torch.load(os.path.join(args.work, "precision_fp32_group", "checkpoint_last.pt"), map_location="cpu")
            worst = max(float(((two["model"][k].float() - v.float()).abs().max() / (v.float().abs().max() + 1e-12)))
                        for k, v in one["model"].items())
            runs["fp32"]["largest relative parameter difference"] = worst
    result.update(runs=runs, ok=all(entry.get("ok", True) and entry.get("finite", True)
                                    for sides in runs.values() for entry in sides.values() if isinstance(entry, dict)))
