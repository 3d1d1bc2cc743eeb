"""The GPU check's calibrate phase: fairseq-hybrid-plan calibrate on the
paper's model into a cost file, then a group of 4 by chunk length and
micro-batches (docs/gpu.md)."""

import os
import sys

from .base import (CHUNK_SWEEP, COST_BASE, COST_FILE, MICRO_BATCH_SWEEP, binarize, devices_for, run_logged,
                            timed)


def phase_calibrate(args, result):
    """``fairseq-hybrid-plan calibrate`` on the paper's model into
    ``COST_FILE``, then a group of 4 by chunk length and micro-batches.  On
    CPU a smoke run of the same measurements at tiny sizes."""
    import torch

    from fairseq_hybrid.forecasts import cost_file

    cuda = args.device == "cuda"
    count = torch.cuda.device_count() if cuda else 0
    arch = "hybrid_lstm_paper" if cuda else "hybrid_lstm_tiny"
    train = [binarize(args.work), "--arch", arch, "--max-tokens", "6400", "--source-lang", "ja", "--target-lang",
             "en", "--criterion", "hybrid_cross_entropy", "--label-smoothing", "0.1", *([] if cuda else ["--cpu"])]
    path = os.path.join(args.work, COST_FILE)
    if cuda:
        gpus = ",".join(f"cuda:{index}" for index in range(min(count, 4)))
        code, log = run_logged([sys.executable, "-c", "import sys; from fairseq_hybrid.commands.plan import main; "
                                "sys.exit(main())", "calibrate", gpus, "--base", COST_BASE, "--batches",
                                str(args.steps), "--out", path, "--", "fairseq-train", *train],
                               os.path.join(args.work, "calibrate.log"), args.limit - 25)
        if code != 0:
            result.update(ok=False, error=log[-3000:])
            return
    else:  # the command's own calibration of GPUs, on two CPU devices at a tiny batch
        from fairseq_hybrid.command_lines.train_command import measured_command, parse_training
        from fairseq_hybrid.commands.calibrate import gpu_cost_file

        args_of = parse_training(train)
        gpu_cost_file(path, measured_command(train, args_of, "calibrate"), args_of, ["cpu", "cpu"], args.steps,
                      COST_BASE, print, reference=(8, 6, 6), measured_on="CPU smoke run of benchmarks/gpu_check.py")
    written = cost_file.load(path)
    result.update(cost_file=path, measured_on=written["measured_on"],
                  one_device_tokens_per_s=written["one_device_tokens_per_s"],
                  host_us_per_cell={f"K={row['k']}": row["cell_us"] for row in written["host_cost"]["rows"]},
                  lstm_seconds_per_step=written["lstm"]["seconds_per_step"])

    # the paper's setting on a GPU; a tiny one for the CPU smoke run
    shape = dict(batch=128, length=50, vocab=32000) if cuda else dict(batch=8, length=6, vocab=50)
    result["shape"] = f"{arch}, {shape['batch']} sentences of {shape['length']} + {shape['length']} tokens"
    common = dict(device=args.device, steps=args.steps, **shape)
    one = timed(arch, [], **common)[2]
    devices = devices_for(args.device, count, 4 if cuda else 2)
    sweep = {}
    result["chunk_sweep"] = {"devices": ",".join(devices), "rows": sweep}  # kept row by row
    for length in CHUNK_SWEEP:
        rate = timed(arch, devices, hybrid_chunk_length=length, **common)[2]
        sweep[length] = {"tokens_per_s": 2 * rate, "vs_one_device": rate / one}
        result.save()
        print(length, sweep[length], flush=True)
    for micro_batches in MICRO_BATCH_SWEEP:
        rate = timed(arch, devices, hybrid_micro_batches=micro_batches, **common)[2]
        sweep[f"0, M={micro_batches}"] = {"tokens_per_s": 2 * rate, "vs_one_device": rate / one}
        result.save()
        print(micro_batches, sweep[f"0, M={micro_batches}"], flush=True)
    result["ok"] = True
